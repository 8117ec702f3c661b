"""sglang-sim: a simulated SGLang server (metrics, endpoints, scheduler logs) driven by a
scheduler model and incident scenarios, for demos, rehearsals and tests without a GPU."""
