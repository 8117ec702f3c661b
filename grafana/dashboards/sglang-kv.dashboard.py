"""SGLang / KV cache (uid sglang-kv): the KV pool, retractions, request context and prefix cache.

Pool gauges are per DP rank and repeated by every TP rank that reports: summed over dp_rank after
a max over the copies (sglang.md §3).
"""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

KV_HIGH = float(d.CLASSIFY["kv_occupancy_ratio"])
KV_NOT_HIGH = float(d.CLASSIFY["scheduling_kv_ratio_below"])
RANK = "instance, model_name, dp_rank"
CONTEXT = "sglang_obs_log_prefill_context_tokens"


def pool(metric: str) -> str:
    """Tokens of one pool part over the selected servers."""
    return f"sum(max by ({RANK}) ({metric}{{{d.SG}}}))"


def per_rank(metric: str) -> str:
    return f"max by ({RANK}) ({metric}{{{d.SG}}})"


pool_panels = [
    d.timeseries("KV pool: used / evictable / free",
                 "KV pool tokens over the selected servers: in use, evictable (radix cache, "
                 "reusable) and free, stacked; dashed: capacity (max_total_num_tokens).",
                 [(pool("sglang:kv_used_tokens"), "used"),
                  (pool("sglang:kv_evictable_tokens"), "evictable"),
                  (pool("sglang:kv_available_tokens"), "free"),
                  (pool("sglang:max_total_num_tokens"), "capacity")],
                 d.TOKENS, w=12, min_=0, stack=True, overrides=d.dashed("D", unstack=True)),
    d.timeseries("KV occupancy per server",
                 "Used / capacity (exporter, full resolution), SGLang's token_usage (worst rank, "
                 "rounded to 0.01) and physical use counting evictable tokens.",
                 [(f"instance:sglang_kv_occupancy:ratio{{{d.INST}}}", "{{instance}} occupancy"),
                  (f"max by (instance) (sglang:token_usage{{{d.SG}}})",
                   "{{instance}} token_usage (worst rank)"),
                  (d.ratio(f"sum by (instance) ({per_rank('sglang:kv_used_tokens')}\n"
                           f"  + {per_rank('sglang:kv_evictable_tokens')})",
                           f"sum by (instance) ({per_rank('sglang:kv_used_tokens')}\n"
                           f"  + {per_rank('sglang:kv_evictable_tokens')}\n"
                           f"  + {per_rank('sglang:kv_available_tokens')})"),
                   "{{instance}} physical incl. evictable")],
                 d.RATIO, w=12, min_=0, max_=1,
                 thresholds=d.steps("green", (KV_NOT_HIGH, "orange"), (KV_HIGH, "red"))),
    d.timeseries("Running batch KV working set",
                 "KV tokens of the running batch from the last decode log line, against the pool "
                 "capacity (dashed).",
                 [(f"sglang_obs_log_running_batch_tokens{{{d.EX}}}", "{{instance}} running batch"),
                  (f"sum by (instance) (sglang_obs_kv_capacity_tokens{{{d.EXM}}})",
                   "{{instance}} capacity")],
                 d.TOKENS, w=12, min_=0, overrides=d.dashed("B")),
    d.timeseries("Decode reserve ratio",
                 "new_token_ratio: share of future decode tokens the scheduler reserves; it "
                 "jumps after a retraction and decays back.",
                 [(f"max by (instance) (sglang:new_token_ratio{{{d.SG}}})", "{{instance}}")],
                 d.RATIO, w=12, min_=0, max_=1),
]

retractions = [
    d.timeseries("Retractions",
                 "Requests retracted per second because the KV pool was full in decode "
                 "(SGLang's counter, 0.5.7+, and the scheduler log's warnings).",
                 [(d.dp_rate("sglang:num_retracted_requests_total"), "{{instance}}"),
                  (d.rate("sglang_obs_log_retracted_requests_total", d.EX),
                   "{{instance}} (log)")],
                 d.REQ_PER_S, w=12, min_=0, bars=True),
    d.timeseries("Retracted tokens",
                 "Input and output tokens of retracted requests per second: work thrown away "
                 "and redone.",
                 [(d.dp_rate("sglang:num_retracted_input_tokens_total"), "{{instance}} input"),
                  (d.dp_rate("sglang:num_retracted_output_tokens_total"),
                   "{{instance}} output")],
                 d.TOKENS_PER_S, w=12, min_=0, bars=True),
]

context = [
    d.heatmap("Per-request context",
              "Prompts per second by context size (cached + new tokens, a chunked prompt's "
              "chunks added up, from the scheduler log).",
              d.bucket_rate(CONTEXT, d.EX), unit=d.TOKENS, w=12),
    d.timeseries("Per-request context quantiles",
                 "p50/p95/p99 context of whole prompts (log; chunks added up), against the "
                 "effective context length (dashed).",
                 [*((f"histogram_quantile({q}, sum by (instance, le) "
                     f"(rate({CONTEXT}_bucket{{{d.EX}}}[$__rate_interval])))",
                     f"{{{{instance}}}} p{round(q * 100)}") for q in (0.5, 0.95, 0.99)),
                  (f"max by (instance) (sglang_obs_config_context_length_tokens{{{d.EXM}}})",
                   "{{instance}} context length")],
                 d.TOKENS, w=12, min_=0, overrides=d.dashed("D")),
]

cache = [
    d.timeseries("Prompt tokens: cached vs computed",
                 "Prompt tokens per second served from the prefix cache and computed by "
                 "prefill (realtime_tokens_total, live), stacked.",
                 [(d.dp_rate("sglang:realtime_tokens_total", f'{d.SG}, mode="prefill_cache"'),
                   "{{instance}} cached"),
                  (d.dp_rate("sglang:realtime_tokens_total",
                             f'{d.SG}, mode="prefill_compute"'),
                   "{{instance}} computed")],
                 d.TOKENS_PER_S, w=8, min_=0, stack=True),
    d.timeseries("Prefill tokens from the log: cached vs new",
                 "#cached-token and #new-token of the scheduler's prefill lines per second, "
                 "stacked.",
                 [(d.rate("sglang_obs_log_prefill_cached_tokens_total", d.EX),
                   "{{instance}} cached"),
                  (d.rate("sglang_obs_log_prefill_new_tokens_total", d.EX), "{{instance}} new")],
                 d.TOKENS_PER_S, w=8, min_=0, stack=True),
    d.timeseries("Prefix cache hit ratio",
                 "Cached / prompt tokens over 5 min, 15 min and 6 h (recording rules).",
                 [(f"instance_model:sglang_cache_hit:ratio_rate{w}{{{d.IM}}}",
                   f"{{{{instance}}}} {w}") for w in ("5m", "15m", "6h")],
                 d.RATIO, w=8, min_=0, max_=1),
    d.timeseries("Cached tokens by source",
                 "Prompt tokens served from the device, host (HiCache) or storage cache per "
                 "second.",
                 [(d.rate("sglang:cached_tokens_total", d.SG, "instance, cache_source"),
                   "{{instance}} {{cache_source}}")],
                 d.TOKENS_PER_S, w=24, h=7, min_=0, stack=True),
]

# HiCache (--enable-hierarchical-cache): the host-memory tier behind the device cache. A server
# without it has none of these series; the row stays collapsed.
NO_HICACHE = "No HiCache series: the server runs without --enable-hierarchical-cache"
DEFAULT_RELEASES = ("a default-flags server (no HiCache) of 0.4.6.post5, 0.5.5, 0.5.12 or 0.5.23 "
                    "has no")
hicache = [
    d.timeseries("HiCache: prefix-cache hit ratio by tier",
                 "Prompt tokens served by each cache tier (device: the GPU's radix cache; host: "
                 "loaded back from HiCache's host memory; storage: an L3 backend) over prompt "
                 "tokens, 5 min, from the tokenizer's counters (recording rule). Without HiCache "
                 "the device tier is the whole ratio; `cache_source` exists from 0.5.9, so on "
                 "0.4.6.post5 and 0.5.5 one unlabelled line.",
                 [(f"instance_model_source:sglang_cache_hit:ratio_rate5m{{{d.IM}}}",
                   "{{instance}} {{cache_source}}")],
                 d.RATIO, w=6, min_=0, max_=1, stack=True),
    d.timeseries("HiCache: host pool occupancy",
                 "Host-tier tokens in use over its capacity (recording rule). Full is a cache's "
                 "normal state; it matters beside falling host hits or dropped tokens. SGLang "
                 f"0.5.10+ with HiCache: {DEFAULT_RELEASES} `hicache_host_used_tokens` or "
                 "`hicache_host_total_tokens`.",
                 [(f"instance:sglang_hicache_host_used:ratio{{{d.INST}}}", "{{instance}}")],
                 d.RATIO, w=6, min_=0, max_=1, no_value=NO_HICACHE),
    d.timeseries("HiCache: evicted tokens dropped",
                 "Share of the device cache's evicted tokens that no tier kept (evicted before "
                 "their host copy was made, or refused by a full host pool), 5 min (recording "
                 "rule); the dashed line is SGLangHiCacheDroppingTokens' threshold "
                 "(features.hicache_drop_ratio). SGLang 0.5.18+ with HiCache: "
                 f"{DEFAULT_RELEASES} `hicache_dropped_tokens_total`; 0.4.6.post5 and 0.5.5 have "
                 "no `evicted_tokens_total` either.",
                 [(f"instance:sglang_hicache_dropped:ratio_rate5m{{{d.INST}}}", "{{instance}}")],
                 d.RATIO, w=6, min_=0, max_=1, no_value=NO_HICACHE,
                 thresholds=d.steps("green", (d.FEATURES["hicache_drop_ratio"], "red"))),
    d.timeseries("HiCache: host ↔ device traffic",
                 "Bytes per second loaded back from host to device and backed up from device to "
                 "host, every rank's shard (recording rules). SGLang 0.5.18+ with HiCache: "
                 f"{DEFAULT_RELEASES} `load_back_bytes_total` or `hicache_backup_bytes_total`.",
                 [(f"instance:sglang_hicache_load_back_bytes:rate5m{{{d.INST}}}",
                   "{{instance}} load-back"),
                  (f"instance:sglang_hicache_backup_bytes:rate5m{{{d.INST}}}",
                   "{{instance}} backup")],
                 d.BYTES_PER_S, w=6, min_=0, no_value=NO_HICACHE),
]

dashboard = d.dashboard(
    "SGLang / KV cache", "sglang-kv",
    "The KV pool (used, evictable, free), occupancy, retractions, per-request context and the "
    "prefix cache.",
    [
        ("KV pool", "Pool parts summed over DP ranks, occupancy per server.", pool_panels),
        ("Retractions", "Requests and tokens thrown out of the running batch.", retractions),
        ("Request context", "Context sizes of whole prompts (scheduler log).", context),
        ("Prefix cache", "Cached vs computed prompt tokens.", cache),
        d.Feature("HiCache tiers (--enable-hierarchical-cache)",
                  "The host-memory tier behind the device cache: hits per tier, the host "
                  "pool, dropped tokens, traffic. Collapsed: a server without HiCache has none "
                  "of these series.", hicache),
    ],
)
