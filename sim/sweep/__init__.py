"""Studies (a base scenario x a grid x methods), their executors (process pool, Ray), the results store,
the HTML report, and the `sweep` and `report` commands."""
