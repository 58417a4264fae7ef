"""Real engines' servers (vLLM) driven as users run them: start and stop, clients, counters."""
