"""The simulator against live runs: reading run folders, predicting them (replayed and fitted
acceptance), fitting acceptance, the machine's speed at a run, and the `validate` and
`fit-acceptance` commands."""
