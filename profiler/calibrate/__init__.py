"""`python -m profiler calibrate` and `inspect`: the live engine's operators timed on a grid, whole forwards
and steps fitted against them, the machine probe, written as a calibration bundle."""
