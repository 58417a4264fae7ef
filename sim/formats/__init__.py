"""What the measured side and the predicting side share, defined once: the calibration bundle and
the live run folder (profiler writes them, sim reads them), a live campaign's folder, the names of
methods and phases, the one way a result file is written (atomically) and the provenance every
result carries. Nothing here imports torch, nor anything of sim but its one error type."""
