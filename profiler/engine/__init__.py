"""The live engine: a Llama-family decoder in torch with a per-position KV cache, its loaders and
tokenizer, the drafters, chains and static trees, SpecPV partial verification, sampling, and the
speculative loop that runs them (`speculative_generate`)."""
