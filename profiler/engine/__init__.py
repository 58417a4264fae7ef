"""The live engine: a Llama-family decoder in torch with a per-position KV cache, its loaders and
tokenizer, the drafters, chains and static trees, SpecPV partial verification, sampling, and the
speculative step that runs them (`run_step`), and the serving loop around it (`serve`, and
`speculative_generate` for one static batch)."""
