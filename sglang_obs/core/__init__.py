"""The bottom layer: facts every other layer reads (the settings, SGLang's names and ports, the
state codes, times, snapshot packs, the Prometheus API client, the CLIs' error conventions).
It imports no other layer."""
