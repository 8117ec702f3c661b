"""Energy and cost per token (docs/metrics.md, "Energy and cost"): what a token costs the
host's GPUs in joules, and in money at thresholds.yml's `cost:` price per GPU-hour.

Names first: the dashboards, the glance page, snapshot, compare and `sglang-obs capacity` read
these constants, never a typed copy. Every record is per host (cluster, host): NVML's energy
counters are per GPU and the exporter runs one per host, so a host's GPUs and the SGLang
servers it runs share `host` (prometheus/prometheus.yml). A host that runs servers of several
models reads one mixed figure.

Semantics (the formulas, with their error bounds, are in docs/metrics.md):
- POWER: the power of the host's GPUs together, mean over 5 min, W (the rate of their energy
  counters; a GPU without one, before Volta, is left out).
- GPUS: GPUs the host's exporter reads energy from (the GPU-hours the cost counts).
- TOKENS: tokens per second the host's SGLang servers processed, by mode: prefill_compute
  (prompt tokens computed), prefill_cache (prompt tokens served from the prefix cache),
  decode (output tokens); from sglang:realtime_tokens_total (0.5.7+), summed over DP ranks,
  the max over a rank's TP/PP copies. A host without that counter (older releases) reads the
  tokenizer's prompt, cached and generation counters, which count a request when it finishes.
- ENERGY_PER_TOKEN{mode="prefill"|"decode"}: the energy split between prefill and decode in
  proportion to the tokens each computed (prefill_compute against decode); prefill's share over
  all prompt tokens (cached ones included), decode's over output tokens. J per prompt token and
  J per output token; all-in (idle time within the window included): the two, times their
  token rates, add up to POWER.
- IDLE_SHARE: share of the last hour's GPU energy spent in minutes when the host processed no
  token (its servers idle or down), 0-1; only where the servers report realtime tokens.
- CACHE_SAVED_POWER: W the prefix cache saves, at most: cached prompt tokens per second at the
  host's joules per computed token.
- COST_PER_TOKEN{mode}: money per token (currency of thresholds.yml's cost.currency) at
  cost.gpu_hour_price: the host's GPU-hours per second split between the modes as its energy
  is; only rendered when a price is set. Dashboards show it per million tokens.
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

ENERGY = "sglang_obs_gpu_energy_joules_total"
REALTIME = "sglang:realtime_tokens_total"
MODES = ("prefill_compute", "prefill_cache", "decode")
# The token modes each per-token figure divides by: ENERGY_PER_TOKEN's and COST_PER_TOKEN's
# mode label -> the TOKENS modes (prompt tokens: computed and cached).
PER = {"prefill": ("prefill_compute", "prefill_cache"), "decode": ("decode",)}
# Seconds in the hour that cost.gpu_hour_price is for.
HOUR_S = 3600


def _number(x: float) -> str:
    return repr(float(x)).removesuffix(".0")


def price(t: dict) -> float | None:
    """cost.gpu_hour_price, money per GPU-hour; None when unset (no cost records)."""
    value = (t.get("cost") or {}).get("gpu_hour_price")
    return None if value is None else float(value)


def currency(t: dict) -> str:
    return str((t.get("cost") or {}).get("currency") or "")


def _tokens(modes: tuple[str, ...] | str) -> str:
    """The host's tokens per second over `modes`, mode summed away."""
    modes = (modes,) if isinstance(modes, str) else modes
    match = f'mode="{modes[0]}"' if len(modes) == 1 else f'mode=~"{"|".join(modes)}"'
    return f"sum by ({BY}) ({TOKENS}{{{match}}})"


COMPUTED = _tokens(("prefill_compute", "decode"))


def cost_expr(gpu_hour_price: float) -> str:
    """COST_PER_TOKEN's expression at `gpu_hour_price`: the host's GPU-hours' cost per second
    split between the modes as its energy is (ENERGY_PER_TOKEN over POWER: the seconds of the
    host each token is charged with). The generator's numbers evaluate this same text."""
    return f"""
{ENERGY_PER_TOKEN}
  * on ({BY}) group_left ()
    ({GPUS} * {_number(gpu_hour_price)} / {HOUR_S} / ({POWER} > 0))"""


def records(t: dict) -> list[tuple[str, str, str]]:
    """(record, expr, why) of the energy and cost figures, each reading only raw series and the
    records before it."""
    s = f'job="{t["selectors"]["sglang_job"]}"'
    e = f'job="{t["selectors"]["exporter_job"]}"'

    def tokenizer(metric: str) -> str:
        return f"sum by ({BY}) (rate(sglang:{metric}_total{{{s}}}[5m]))"

    def fallback(mode: str, expr: str) -> str:
        return f'label_replace({expr},\n        "mode", "{mode}", "", "")'

    # A minute's GPU energy (J) and tokens (all modes), per host: IDLE_SHARE's 1-min slots.
    energy_1m = f"sum by ({BY}) (increase({ENERGY}{{{e}}}[1m]))"
    tokens_1m = f"sum by ({BY}) (increase({REALTIME}{{{s}}}[1m]))"
    out = [
        (POWER, f"sum by ({BY}) (rate({ENERGY}{{{e}}}[5m]))",
         "Mean power of the host's GPUs together over 5 min, W: the rate of NVML's energy "
         "counters (absent for a GPU without one: before Volta). Under MIG each GPU's counter "
         "is the whole GPU's, counted once."),
        (GPUS, f"count by ({BY}) (rate({ENERGY}{{{e}}}[5m]))",
         "GPUs of the host whose energy counter POWER sums: the GPU-hours the cost counts."),
        (TOKENS, f"""
sum by ({BY}, mode) (
  max by ({BY}, instance, model_name, dp_rank, mode) (
    rate({REALTIME}{{{s}}}[5m])))
or
  (
      {fallback("prefill_compute", f'''
          {tokenizer("prompt_tokens")}
        - ({tokenizer("cached_tokens")}
           or 0 * {tokenizer("prompt_tokens")})''')}
    or
      {fallback("prefill_cache", tokenizer("cached_tokens"))}
    or
      {fallback("decode", tokenizer("generation_tokens"))}
  )
  unless on ({BY})
    sum by ({BY}) (rate({REALTIME}{{{s}}}[5m]))""",
         "Tokens per second the host's servers processed, by mode (prefill_compute, "
         "prefill_cache, decode), from the schedulers' realtime counters (0.5.7+): summed over "
         "DP ranks, the max over each rank's TP/PP copies (--enable-metrics-for-all-schedulers). "
         "A host without them (older releases) reads the tokenizer's counters instead, which "
         "count a request's tokens when it finishes."),
        (ENERGY_PER_TOKEN, f"""
label_replace(
  {POWER}
    * {_tokens("prefill_compute")} / ({COMPUTED} > 0)
    / ({_tokens(PER["prefill"])} > 0),
  "mode", "prefill", "", "")
or
label_replace(
  {POWER} / ({COMPUTED} > 0)
    and ({_tokens("decode")} > 0),
  "mode", "decode", "", "")""",
         "J per token, all-in: the GPUs' energy split between prefill and decode in proportion "
         "to the tokens each computed; prefill's share over every prompt token (cached ones "
         "too), decode's over output tokens. The two times their token rates add up to POWER."),
        (IDLE_SHARE, f"""
(
    sum_over_time(({energy_1m} unless ({tokens_1m} > 0))[1h:1m])
  /
    (sum_over_time({energy_1m}[1h:1m]) > 0)
or
  0 * sum_over_time({energy_1m}[1h:1m])
)
and on ({BY}) sum by ({BY}) (increase({REALTIME}{{{s}}}[1h]))""",
         "Share of the last hour's GPU energy spent in minutes in which the host processed no "
         "token (its servers idle or down), 0-1; minute by minute. Only on hosts whose servers "
         "report realtime tokens (0.5.7+)."),
        (CACHE_SAVED_POWER, f"""
{_tokens("prefill_cache")}
  * {POWER} / ({COMPUTED} > 0)""",
         "W the prefix cache saves, at most: the cached prompt tokens per second at the "
         "host's all-in joules per computed token. An upper bound, often far above the real "
         "saving: the all-in figure includes idle and static power, which computing them would "
         "not add, and it prices a prompt token like an output token, while prefill computes "
         "many tokens per step and decode one per request."),
    ]
    p = price(t)
    if p is not None:
        out.append((COST_PER_TOKEN, cost_expr(p),
                    f"Money ({currency(t)}) per token at cost.gpu_hour_price {_number(p)} "
                    "per GPU-hour: the host's GPU-hours per second, split between prefill and "
                    "decode as its energy is (ENERGY_PER_TOKEN over POWER)."))
    return out
