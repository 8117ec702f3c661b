"""Energy and cost per token (docs/metrics.md, "Energy and cost"): what a token costs the
host's GPUs in joules, and in money at thresholds.yml's `cost:` price per GPU-hour.

Names first: the dashboards, the glance page, snapshot, compare and `sglang-obs capacity` read
these constants, never a typed copy. Every record is per host (cluster, host): NVML's energy
counters are per GPU and the exporter runs one per host, so a host's GPUs and the SGLang
servers it runs share `host` (prometheus/prometheus.yml). A host that runs servers of several
models reads one mixed figure.

Semantics (the formulas, with their error bounds, are in docs/metrics.md):
- POWER: the mean power of the host's GPUs over 5 min, W (rate of the energy counter).
- TOKENS: tokens per second the host's SGLang servers processed, by mode: prefill_compute
  (prompt tokens computed), prefill_cache (prompt tokens served from the prefix cache),
  decode (output tokens); from sglang:realtime_tokens_total (0.5.7+).
- ENERGY_PER_TOKEN{mode="prefill"|"decode"}: the energy split between prefill and decode in
  proportion to the tokens each computed (prefill_compute against decode); prefill's share over
  all prompt tokens (cached ones included), decode's over output tokens. J per prompt token and
  J per output token; all-in (idle time within the window included).
- IDLE_SHARE: share of the last hour's GPU energy spent in minutes when the host processed no
  token, 0-1.
- GPUS: GPUs the host's exporter reads energy from.
- CACHE_SAVED_POWER: W the prefix cache saves: cached prompt tokens per second at the host's
  joules per computed token.
- COST_PER_TOKEN{mode}: money per token (currency of thresholds.yml's cost.currency) at
  cost.gpu_hour_price; only rendered when a price is set.
"""

from __future__ import annotations

BY = "cluster, host"
POWER = "host:sglang_obs_gpu_power_watts:avg5m"
GPUS = "host:sglang_obs_gpus:count"
TOKENS = "host_mode:sglang_tokens:rate5m"
ENERGY_PER_TOKEN = "host_mode:sglang_obs_energy_per_token_joules:ratio5m"
IDLE_SHARE = "host:sglang_obs_gpu_energy_idle:ratio1h"
CACHE_SAVED_POWER = "host:sglang_obs_cache_saved_power_watts:avg5m"
COST_PER_TOKEN = "host_mode:sglang_obs_cost_per_token:ratio5m"
