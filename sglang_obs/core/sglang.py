"""Facts about SGLang and this stack's own listeners that several layers quote, stated once.

The configuration files (Dockerfile, docker-compose*.yml, prometheus/prometheus.yml) cannot
import them; tests/test_one_source.py checks that they say the same and that no Python module
types them again.
"""

# The OpenAI-compatible and native generation endpoints: the requests a user waits for (the
# error-ratio rules and the dashboards count these, not /health or /metrics).
SERVING_ENDPOINTS = "/v1/chat/completions|/v1/completions|/generate"

SGLANG_PORT = 30000  # SGLang's default --port (and the simulator's)
EXPORTER_PORT = 9840  # the exporter's listen port
# The exporter as prometheus.yml addresses it (the compose service name): the native runners
# rewrite exactly this address to where they start the exporter.
EXPORTER_ADDRESS = f"exporter:{EXPORTER_PORT}"
