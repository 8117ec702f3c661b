"""sglang-exporter: polls SGLang servers, GPUs, scheduler logs and containers, and serves the
signals SGLang does not give (KV occupancy, continuous queueing, prefill backlog, effective
configuration, GPU health). Imports nothing from the simulator or the tools."""
