"""`python -m profiler live`: one run of real speculative decoding, configured by a LiveConfig, recorded
as a run folder."""
