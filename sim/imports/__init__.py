"""Importers of published GPU profiles: a table others measured and published, read from its file
and written as a published profile (sim/formats/published.py) with its source. No hardware is
touched, so they live in sim; `python -m sim import-profile` runs them."""

# Each importer: the table it makes, and the dims of its grid.
KINDS = {"vidur-collectives": ("collectives", ("ranks", "bytes")),
         "collectives-csv": ("collectives", ("ranks", "bytes")),
         "vidur-mlp": ("kernels", ("ranks", "tokens")),
         "vidur-cpu-overheads": ("host", ("ranks", "batch"))}
