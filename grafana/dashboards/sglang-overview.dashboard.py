"""SGLang — Is it slow, and why? The landing dashboard (uid sglang-overview).

Top to bottom: the classified state per server (recording rule instance:sglang_state:code), where
requests are in seed 000's words, the SLO, latency, the pressure signals that tell the causes
apart, throughput and cache, the GPUs, and the firing alerts. Reading guide (seed 000):
- GPU busy and pending tokens growing: prefill backlog;
- queue growing while KV is not high: scheduling, not capacity;
- running near the limit and decode speed falling: decode contention;
- GPU memory high but GPU idle: static preallocation, not load.
"""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

from sglang_obs.core import scaling

NOW, USUAL = d.quantities.q("decode_speed"), d.quantities.q("decode_speed_usual")

TTFT_LE, ITL_LE = d.slo_le("ttft"), d.slo_le("itl")
QUEUE_S = float(d.CLASSIFY["scheduling_queue_seconds"])
LONG_QUEUE = float(d.ALERTS["long_queueing_seconds"])
BACKLOG = float(d.CLASSIFY["prefill_backlog_tokens"])
KV_HIGH = float(d.CLASSIFY["kv_occupancy_ratio"])
KV_NOT_HIGH = float(d.CLASSIFY["scheduling_kv_ratio_below"])
AT_LIMIT = float(d.CLASSIFY["running_ratio_at_limit"])
COLLAPSE = float(d.CLASSIFY["decode_speed_collapse_ratio"])


def attainment(name: str, histogram: str, label: str):
    le = d.slo_le(name)
    expr = d.ratio(
        f'sum(rate(sglang:{histogram}_bucket{{{d.SG}, le="{le}"}}[$__range]))',
        f"sum(rate(sglang:{histogram}_count{{{d.SG}}}[$__range]))")
    return d.stat(
        f"{label} SLO attainment (≤ {le} s)",
        f"Share of {'requests' if name == 'ttft' else 'output tokens'} with {label} within the "
        f"{le} s bucket over the selected range; objective {d.SLO[name]['objective']} "
        "(prometheus/thresholds.yml).",
        [(expr, f"{label} ≤ {le} s")], d.RATIO, w=5, h=6, instant=True, decimals=2,
        thresholds=d.attainment_steps(name), mappings=[d.no_traffic()],
        no_value="No traffic", background=True)


state = [
    d.stat("State now",
           "The classified state of each server now (instance:sglang_state:code; codes and "
           "names from sglang_obs.core.states.STATES).",
           [(f"max by (instance) (instance:sglang_state:code{{{d.INST}}})", "{{instance}}")],
           d.NONE, w=6, h=6, mappings=d.state_mappings(), graph=False, background=True,
           text_mode="value_and_name"),
    d.state_timeline("Server state over time",
                     "One state per server over time: unavailable, idle, healthy, "
                     "prefill_backlog, decode_contention, kv_capacity, scheduling_bottleneck.",
                     [(f"max by (instance) (instance:sglang_state:code{{{d.INST}}})",
                       "{{instance}}")],
                     d.state_mappings(), w=12, h=6),
    d.bar_gauge("Time in each state",
                "Share of the selected range each state held, over the selected servers "
                "(instance:sglang_state:class).",
                [("sum by (state) (count_over_time(instance:sglang_state:class"
                  f"{{{d.INST}}}[$__range]))\n  / on () group_left ()\n"
                  "  (sum(count_over_time(instance:sglang_state:code"
                  f"{{{d.INST}}}[$__range])) > 0)", "{{state}}")],
                d.RATIO, w=6, h=6, min_=0, max_=1,
                overrides=[{"matcher": {"id": "byName", "options": name},
                            "properties": [{"id": "color", "value": {
                                "mode": "fixed", "fixedColor": d.STATE_COLORS[name]}}]}
                           for name in d.STATES]),
]

stages = [
    d.stat("Waiting to start",
           "Requests in the waiting queue, not yet admitted to the running batch (exporter, "
           "polled every second).",
           [(f"sum(instance:sglang_waiting_requests:max{{{d.INST}}})", "waiting")], d.COUNT,
           thresholds=d.steps("green", (1, "orange"))),
    d.stat("Waiting for resources",
           "How long the waiting queue has been continuously non-empty (worst server); "
           f"classification at {QUEUE_S:g} s, alert at {LONG_QUEUE:g} s.",
           [(f"max(instance:sglang_queue_nonempty_duration_seconds:max{{{d.INST}}})",
             "queue non-empty for")], d.SECONDS,
           thresholds=d.steps("green", (QUEUE_S, "orange"), (LONG_QUEUE, "red"))),
    d.stat("Processing input",
           "Prompt tokens waiting to be prefilled, uncached (exporter, from /v1/loads); "
           f"prefill backlog from {BACKLOG:g} tokens.",
           [(f"sum(instance:sglang_prefill_backlog_tokens:max{{{d.INST}}})", "pending tokens")],
           d.TOKENS, thresholds=d.steps("green", (BACKLOG, "red"))),
    d.stat("Generating",
           "Requests in the running batch, decoding their output (exporter, polled every second).",
           [(f"sum(instance:sglang_running_requests:max{{{d.INST}}})", "running")], d.COUNT),
    d.stat("Requests finished",
           "Requests finished per second over the selected servers and models (5 min rate).",
           [(f"sum(instance_model:sglang_num_requests:rate5m{{{d.IM}}})", "req/s")],
           d.REQ_PER_S),
    d.stat("Servers unavailable",
           "Servers neither the exporter nor Prometheus could reach "
           "(instance:sglang_available:min).",
           [(f"count(instance:sglang_available:min{{{d.INST}}} == 0) or vector(0)", "down")],
           d.COUNT, thresholds=d.steps("green", (1, "red")), graph=False),
]

slo = [
    attainment("ttft", "time_to_first_token_seconds", "TTFT"),
    attainment("itl", "inter_token_latency_seconds", "ITL"),
    d.timeseries("SLO error ratio (5 min)",
                 "Share of requests over the TTFT threshold and of tokens over the ITL threshold; "
                 "the dashed line is the error budget (1 - objective).",
                 [(f"instance_model:sglang_ttft_slo_errors:ratio_rate5m{{{d.IM}}}",
                   f"{{{{instance}}}} TTFT > {TTFT_LE} s"),
                  (f"instance_model:sglang_itl_slo_errors:ratio_rate5m{{{d.IM}}}",
                   f"{{{{instance}}}} ITL > {ITL_LE} s")],
                 d.RATIO, w=14, h=6, min_=0, thresholds=d.error_ratio_steps("ttft")),
]

latency = [
    d.timeseries("Time to first token",
                 f"TTFT p50/p95/p99 and mean over 5 min; SLO line at {TTFT_LE} s.",
                 d.quantile_queries("time_to_first_token_seconds"), d.SECONDS,
                 thresholds=d.steps("green", (d.slo_seconds("ttft"), "red")), min_=0),
    d.timeseries("Inter-token latency",
                 f"ITL p50/p95/p99 and mean over 5 min (token-weighted); SLO line at {ITL_LE} s.",
                 d.quantile_queries("inter_token_latency_seconds"), d.SECONDS,
                 thresholds=d.steps("green", (d.slo_seconds("itl"), "red")), min_=0),
    d.timeseries("End-to-end request latency",
                 "E2E latency p50/p95/p99 and mean over 5 min, per server and model.",
                 d.quantile_queries("e2e_request_latency_seconds"), d.SECONDS, min_=0),
    d.ttft_decomposition(),
    d.ttft_by_class(),
]

pressure = [
    d.timeseries("Running requests vs effective max",
                 "Running batch size against the effective max_running_requests (dashed): at the "
                 "limit while decode speed falls is decode contention.",
                 [(f"instance:sglang_running_requests:max{{{d.INST}}}", "{{instance}} running"),
                  (f"sum by (instance) (sglang_obs_max_running_requests{{{d.EXM}}})",
                   "{{instance}} effective max")],
                 d.COUNT, min_=0, overrides=d.dashed("B")),
    d.timeseries("Decode speed per request",
                 "Generation tokens per second one request sees, against its usual good speed "
                 f"(p90 over 1 h, dashed); contention below {COLLAPSE:g}x of it at the limit.",
                 [(f"{NOW.record}{{{d.INST}}}", f"{{{{instance}}}} {NOW.qualifier}"),
                  (f"{USUAL.record}{{{d.INST}}}", f"{{{{instance}}}} {USUAL.qualifier}")],
                 d.TOKENS_PER_S, min_=0, overrides=d.dashed("B")),
    d.timeseries("Running / effective max",
                 f"Running batch as a share of its limit; at the limit from {AT_LIMIT:g}.",
                 [(f"instance:sglang_running_requests_per_max:ratio{{{d.INST}}}",
                   "{{instance}}")],
                 d.RATIO, min_=0, max_=1, thresholds=d.steps("green", (AT_LIMIT, "orange"))),
    d.timeseries("Waiting queue",
                 "Requests waiting to be admitted; a growing queue with KV not high is a "
                 "scheduling limit, not capacity.",
                 [(f"instance:sglang_waiting_requests:max{{{d.INST}}}", "{{instance}} waiting")],
                 d.COUNT, min_=0),
    d.timeseries("KV cache occupancy",
                 "KV pool used / capacity at full resolution (exporter); capacity pressure from "
                 f"{KV_HIGH:g}, 'not high' below {KV_NOT_HIGH:g}.",
                 [(f"instance:sglang_kv_occupancy:ratio{{{d.INST}}}", "{{instance}}")],
                 d.RATIO, min_=0, max_=1,
                 thresholds=d.steps("green", (KV_NOT_HIGH, "orange"), (KV_HIGH, "red"))),
    d.timeseries("Continuous queueing time",
                 "How long each server's waiting queue has been non-empty without a break; "
                 f"scheduling bottleneck from {QUEUE_S:g} s, alert at {LONG_QUEUE:g} s.",
                 [(f"instance:sglang_queue_nonempty_duration_seconds:max{{{d.INST}}}",
                   "{{instance}}")],
                 d.SECONDS, min_=0,
                 thresholds=d.steps("green", (QUEUE_S, "orange"), (LONG_QUEUE, "red"))),
    d.timeseries("Pending prefill tokens",
                 "Prompt tokens waiting for prefill; growing while the GPU is busy is a prefill "
                 f"backlog (classified from {BACKLOG:g}).",
                 [(f"instance:sglang_prefill_backlog_tokens:max{{{d.INST}}}", "{{instance}}")],
                 d.TOKENS, min_=0, thresholds=d.steps("green", (BACKLOG, "red"))),
    d.timeseries("GPU busy vs memory used",
                 "Per GPU: kernel-time utilization and memory used / total; memory high with "
                 "the GPU idle is SGLang's static preallocation, not load.",
                 [(f"sglang_obs_gpu_utilization_ratio{{{d.GPU_ALL}}}", "GPU {{gpu}} busy"),
                  (d.ratio(f"sglang_obs_gpu_memory_used_bytes{{{d.GPU_ALL}}}",
                           f"sglang_obs_gpu_memory_total_bytes{{{d.GPU_ALL}}}"),
                   "GPU {{gpu}} memory used")],
                 d.RATIO, min_=0, max_=1, overrides=d.dashed("B")),
    d.stat("GPUs now",
           "Mean GPU utilization and mean memory used share over all GPUs the exporters read.",
           [(f"avg(sglang_obs_gpu_utilization_ratio{{{d.GPU_ALL}}})", "busy"),
            (d.ratio(f"sum(sglang_obs_gpu_memory_used_bytes{{{d.GPU_ALL}}})",
                     f"sum(sglang_obs_gpu_memory_total_bytes{{{d.GPU_ALL}}})"), "memory used")],
           d.RATIO, w=8, h=8, min_=0, max_=1, text_mode="value_and_name"),
]

throughput = [
    d.timeseries("Token throughput",
                 "Input and output tokens per second (counted at request finish, 5 min rules) "
                 "and the live decode rate from realtime_tokens_total.",
                 [(f"sum by (instance) (instance_model:sglang_prompt_tokens:rate5m{{{d.IM}}})",
                   "{{instance}} input"),
                  (f"sum by (instance) (instance_model:sglang_generation_tokens:rate5m{{{d.IM}}})",
                   "{{instance}} output"),
                  (d.rate("sglang:realtime_tokens_total", f'{d.SG}, mode="decode"'),
                   "{{instance}} decode (live)")],
                 d.TOKENS_PER_S, w=12, min_=0, overrides=d.dashed("C")),
    d.timeseries("Requests finished",
                 "Requests finished per second, per server and model (5 min rule).",
                 [(f"instance_model:sglang_num_requests:rate5m{{{d.IM}}}",
                   "{{instance}} {{model_name}}")],
                 d.REQ_PER_S, w=6, min_=0),
    d.timeseries("Prefix cache hit ratio",
                 "Cached prompt tokens / prompt tokens over 5 min, against its 6 h baseline "
                 "(dashed); SGLang's cache_hit_rate gauge is per batch.",
                 [(f"instance_model:sglang_cache_hit:ratio_rate5m{{{d.IM}}}",
                   "{{instance}} 5m"),
                  (f"instance_model:sglang_cache_hit:ratio_rate6h{{{d.IM}}}",
                   "{{instance}} 6h baseline")],
                 d.RATIO, w=6, min_=0, max_=1, overrides=d.dashed("B")),
]

# The replica recommendation per pool (docs/scaling.md): what KEDA or an HPA scales on.
replicas = [
    d.timeseries("Servers: recommended and answering",
                 "Per pool (unified, or a PD deployment's prefill and decode): the servers to "
                 "run (the recommendation KEDA and the HPA scale on: up at once, down one at a "
                 "time), the servers the load needs now (dashed), and the servers that answer.",
                 [(f"{scaling.RECOMMENDED}{{{d.DEPLOYMENT}}}", "{{pool}} recommended"),
                  (f"{scaling.DESIRED}{{{d.DEPLOYMENT}}}", "{{pool}} desired now"),
                  (f"{scaling.SERVERS}{{{d.DEPLOYMENT}}}", "{{pool}} answering")],
                 d.COUNT, w=12, min_=0, overrides=d.dashed("B")),
    d.timeseries("Load in servers at target",
                 "Per pool, the sum of each server's busiest leading signal over its target "
                 "(requests in the server over max_running_requests, KV occupancy, prefill "
                 "backlog; thresholds.yml scaling:), each the mean over 2 min; and per server. "
                 "Above the servers answering, the pool needs more.",
                 [(f"{scaling.LOAD}{{{d.DEPLOYMENT}}}", "{{pool}}"),
                  (f"{scaling.INSTANCE_LOAD}{{{d.INST}}}", "{{instance}}")],
                 d.NONE, w=12, min_=0, overrides=d.dashed("B")),
]

alerts = [
    d.alert_list("Firing alerts",
                 "Firing and pending alerts from the Prometheus rules (SGLang*, GPU*), read "
                 "through the data source."),
]

# Speculative decoding (--speculative-algorithm): its series exist only on such servers, and
# the row stays collapsed (dashlib.Feature).
NO_SPEC = "No speculative decoding here: the server runs without --speculative-algorithm"
speculative = [
    d.timeseries("Speculative decoding: tokens per verify step",
                 "Generated tokens over spec_verify_calls_total, 5 min and 1 min (recording "
                 "rules): 1 means every draft is rejected; the dashed line is "
                 "SGLangSpeculativeDecodingCollapsed's threshold "
                 "(features.spec_collapse_accept_length). SGLang 0.5.13+ with "
                 "--speculative-algorithm: a default-flags server of 0.4.6.post5, 0.5.5, 0.5.12 "
                 "or 0.5.23 has no `spec_verify_calls_total`.",
                 [(f"instance_model:sglang_spec_accept_length:ratio_rate{w}{{{d.IM}}}",
                   f"{{{{instance}}}} {w}") for w in ("5m", "1m")],
                 "none", w=12, min_=0, no_value=NO_SPEC,
                 thresholds=d.steps("red", (d.FEATURES["spec_collapse_accept_length"],
                                            "green"))),
    d.timeseries("Speculative decoding: share of the most a step can yield",
                 "Tokens per verify step over the active --speculative-num-steps + 1 (recording "
                 "rule): 1 when every draft is accepted. SGLang 0.5.13+ with "
                 "--speculative-algorithm: a default-flags server of 0.4.6.post5, 0.5.5, 0.5.12 "
                 "or 0.5.23 has no `spec_verify_calls_total`, and 0.4.6.post5, 0.5.5 and 0.5.12 "
                 "no `spec_num_steps`.",
                 [(f"instance_model:sglang_spec_accept_length_per_step:ratio{{{d.IM}}}",
                   "{{instance}}")],
                 d.RATIO, w=12, min_=0, max_=1, no_value=NO_SPEC),
]

# Structured output: the grammar queue is on every server; the wait exists from the first
# structured request a server finishes.
NO_GRAMMAR = "No structured-output requests here: none asked for json_schema, regex or ebnf"
structured = [
    d.timeseries("Structured output: mean wait for the grammar",
                 "Seconds a structured-output request waits for its grammar to compile and for "
                 "the grammar queue ahead of it, 5 min and 1 min (recording rules: the grammar "
                 "queue's mean length over num_so_requests_total's rate, by Little's law; a "
                 "cached grammar waits 0). The dashed line is SGLangGrammarCompileBacklog's "
                 "threshold (features.grammar_wait_seconds). `num_so_requests_total` appears "
                 "with the first structured request a server finishes.",
                 [(f"instance:sglang_grammar_wait_seconds:avg{w}{{{d.INST}}}",
                   f"{{{{instance}}}} {w}") for w in ("5m", "1m")],
                 d.SECONDS, w=12, min_=0, no_value=NO_GRAMMAR,
                 thresholds=d.steps("green", (d.FEATURES["grammar_wait_seconds"], "red"))),
    d.timeseries("Structured output: grammar queue",
                 "Requests waiting for their grammar to compile, mean over 1 min, all DP ranks "
                 "(recording rule over num_grammar_queue_reqs). They are not in the waiting "
                 "queue: the state classification does not see them.",
                 [(f"instance:sglang_grammar_queue_reqs:avg1m{{{d.INST}}}", "{{instance}}")],
                 "none", w=12, min_=0, no_value=NO_GRAMMAR),
]

# LoRA (--enable-lora) and priority scheduling: features that hold the queue back by design
# (the scheduling_bottleneck state's causes, named in its alert and on the glance page).
NO_LORA = "No LoRA series: the server runs without --enable-lora"
lora = [
    d.timeseries("LoRA: adapter slots in use",
                 "The least lora_pool_utilization (adapters in the running batch over "
                 "--max-loras-per-batch) over the scheduling_bottleneck state's span (recording "
                 "rule): at 1, every slot held an adapter throughout, and a request needing "
                 "another adapter holds the queue behind it. SGLang 0.5.7+ with --enable-lora: a "
                 "default-flags server of 0.4.6.post5, 0.5.5, 0.5.12 or 0.5.23 has no "
                 "`lora_pool_utilization`.",
                 [(f"instance:sglang_lora_pool_utilization:min30s{{{d.INST}}}",
                   "{{instance}}")],
                 d.RATIO, w=24, min_=0, max_=1, no_value=NO_LORA),
]
NO_PRIORITY = ("No per-priority series: the server runs without --enable-priority-scheduling")
priorities = [
    d.timeseries("Priorities: mean wait in the queue",
                 "Each priority's mean wait by Little's law: its num_queue_reqs series (mean over "
                 "2 min) over its finished requests per second (recording rule). A priority served "
                 "last waits far longer than the others while the batch is full. SGLang 0.5.10+ "
                 "with --enable-priority-scheduling: a default-flags server of 0.4.6.post5, 0.5.5, "
                 "0.5.12 or 0.5.23 has no per-priority `num_queue_reqs` or `num_requests_total`.",
                 [(f"instance_priority:sglang_queue_wait_seconds:avg2m{{{d.INST}}}",
                   "{{instance}} priority {{priority}}")],
                 d.SECONDS, w=12, min_=0, no_value=NO_PRIORITY),
    d.timeseries("Priorities: waiting requests",
                 "Each priority's waiting requests, mean over 2 min, all DP ranks (recording rule "
                 "over num_queue_reqs' per-priority series; the priority=\"\" series is their "
                 "total). SGLang 0.5.10+ with --enable-priority-scheduling: a default-flags "
                 "server of 0.4.6.post5, 0.5.5, 0.5.12 or 0.5.23 has no per-priority "
                 "`num_queue_reqs`.",
                 [(f"instance_priority:sglang_queue_reqs:avg2m{{{d.INST}}}",
                   "{{instance}} priority {{priority}}")],
                 "none", w=12, min_=0, no_value=NO_PRIORITY),
]

dashboard = d.dashboard(
    "SGLang — Is it slow, and why?", "sglang-overview",
    "Is SGLang slow, and why: the state per server, where requests wait, SLO, latency, the "
    "pressure signals that separate prefill backlog, decode contention, KV capacity, scheduling "
    "and preallocation, and the firing alerts.",
    [
        ("Is it slow? State per server",
         "The state classification of the recording rules, per server.", state),
        ("Where requests are",
         "Seed 000's stages: waiting to start, waiting for resources, processing input, "
         "generating.", stages),
        ("SLO", "Attainment over the range and the 5 min error ratios.", slo),
        ("Latency", "Quantiles and means over 5 min (recording rules, counters); where "
         "TTFT goes; TTFT by prompt length.", latency),
        ("Why: pressure",
         "Running vs limit with decode speed (contention), queue with KV (scheduling vs "
         "capacity), pending prefill tokens with GPU busy (backlog), GPU memory vs busy "
         "(preallocation).", pressure),
        ("Throughput and cache", "Tokens and requests per second, prefix cache.", throughput),
        ("How many servers", "The replica recommendation per pool and the load it reads "
         "(docs/scaling.md).", replicas),
        d.Feature("Speculative decoding (--speculative-algorithm)",
                  "Tokens per verify step from counters, and against the most a step can "
                  "yield. Collapsed: a server without speculation has none of these series.",
                  speculative),
        d.Feature("Structured output (json_schema, regex, ebnf)",
                  "The time structured requests wait for their grammar, and the grammar queue. "
                  "Collapsed: a server without structured requests shows 0 or no value.",
                  structured),
        d.Feature("LoRA (--enable-lora)",
                  "Adapter slots of the running batch in use. Collapsed: a server without LoRA "
                  "has none of these series.", lora),
        d.Feature("Priorities (--enable-priority-scheduling)",
                  "Wait and queue per priority. Collapsed: a server without priority scheduling "
                  "has none of these series.", priorities),
        ("Alerts", "What Prometheus is alerting on now.", alerts),
    ],
)
