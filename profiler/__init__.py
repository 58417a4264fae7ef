"""Everything that touches real hardware: the Llama-family engine and its drafters, live
speculative decoding with per-step traces, and calibration bundles (issues 3 and 5 build them)."""
