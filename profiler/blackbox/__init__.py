"""Engines nobody here wrote, driven as black boxes: calibrated by whole forwards, run with their own
speculative decoding, recorded as run folders the simulator validates against."""
