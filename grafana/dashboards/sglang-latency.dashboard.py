"""SGLang / Latency (uid sglang-latency): distributions, quantiles, queueing and per-stage time.

The SLO alerts link here. Heatmaps are bucket rates (`sum by (le)`), quantiles come from the
5 min recording rules, means from the same window's recording rules, each legend naming its
statistic and window (sglang_obs/core/quantities.py).
"""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

TTFT_LE, ITL_LE = d.slo_le("ttft"), d.slo_le("itl")
STAGE = d.STAGE
REC = "sglang_obs_request_"

distributions = [
    d.heatmap("TTFT distribution",
              "Requests per second by time-to-first-token bucket (sglang:time_to_first_token_"
              "seconds_bucket).",
              d.bucket_rate("sglang:time_to_first_token_seconds")),
    d.heatmap("ITL distribution",
              "Output tokens per second by inter-token latency bucket (token-weighted).",
              d.bucket_rate("sglang:inter_token_latency_seconds"), cell_unit=d.TOKENS_PER_S),
    d.heatmap("E2E latency distribution",
              "Finished requests per second by end-to-end latency bucket.",
              d.bucket_rate("sglang:e2e_request_latency_seconds")),
]

quantiles = [
    d.timeseries("Time to first token",
                 f"TTFT p50/p95/p99 and mean over 5 min; SLO line at {TTFT_LE} s.",
                 d.quantile_queries("time_to_first_token_seconds"), d.SECONDS, w=12, min_=0,
                 thresholds=d.steps("green", (d.slo_seconds("ttft"), "red"))),
    d.timeseries("Inter-token latency",
                 f"ITL p50/p95/p99 and mean over 5 min (token-weighted); SLO line at {ITL_LE} s.",
                 d.quantile_queries("inter_token_latency_seconds"), d.SECONDS, w=12, min_=0,
                 thresholds=d.steps("green", (d.slo_seconds("itl"), "red"))),
    d.timeseries("End-to-end request latency",
                 "E2E latency p50/p95/p99 and mean over 5 min, per server and model.",
                 d.quantile_queries("e2e_request_latency_seconds"), d.SECONDS, w=12, min_=0),
    d.timeseries("Queue time",
                 "Time requests spent in the waiting queue before admission: p50/p95/p99 "
                 "and mean over 5 min.",
                 d.quantile_queries("queue_time_seconds"), d.SECONDS, w=12, min_=0),
]

slo = [
    d.timeseries(f"TTFT SLO error ratio (> {TTFT_LE} s)",
                 "Share of requests over the TTFT threshold over 5 min, 1 h and 6 h (the burn-rate "
                 "alert windows); dashed line: the error budget.",
                 [(f"instance_model:sglang_ttft_slo_errors:ratio_rate{w}{{{d.IM}}}",
                   f"{{{{instance}}}} {w}") for w in ("5m", "1h", "6h")],
                 d.RATIO, w=12, min_=0, thresholds=d.error_ratio_steps("ttft")),
    d.timeseries(f"ITL SLO error ratio (> {ITL_LE} s)",
                 "Share of output tokens over the ITL threshold over 5 min, 1 h and 6 h; dashed "
                 "line: the error budget.",
                 [(f"instance_model:sglang_itl_slo_errors:ratio_rate{w}{{{d.IM}}}",
                   f"{{{{instance}}}} {w}") for w in ("5m", "1h", "6h")],
                 d.RATIO, w=12, min_=0, thresholds=d.error_ratio_steps("itl")),
]

queueing = [
    d.heatmap("Queue time distribution",
              "Requests per second by waiting-queue time bucket (sglang:queue_time_seconds).",
              d.bucket_rate("sglang:queue_time_seconds"), w=12),
    d.timeseries("Continuous queueing runs",
                 "p95 length of completed runs of a continuously non-empty queue (exporter), "
                 "and the live run length.",
                 [("histogram_quantile(0.95, sum by (instance, le) (rate("
                   f"sglang_obs_queue_nonempty_run_duration_seconds_bucket{{{d.EXM}}}"
                   "[$__rate_interval])))", "{{instance}} completed runs p95"),
                  (f"instance:sglang_queue_nonempty_duration_seconds:max{{{d.INST}}}",
                   "{{instance}} current run")],
                 d.SECONDS, w=12, min_=0, overrides=d.dashed("B")),
]

stages = [
    d.timeseries("Per-stage latency p95",
                 "p95 time per scheduler stage (request_process, prefill_forward, chunked_prefill, "
                 "decode_*, ...), all servers selected.",
                 [("histogram_quantile(0.95, sum by (stage, le) (rate("
                   f"{STAGE}_bucket{{{d.SG}}}[$__rate_interval])))", "{{stage}} p95")],
                 d.SECONDS, w=12, min_=0),
    d.timeseries("Per-stage latency mean",
                 "Mean time per scheduler stage: stage _sum / _count over $__rate_interval.",
                 [(d.ratio(d.rate(f"{STAGE}_sum", d.SG, "stage"),
                           d.rate(f"{STAGE}_count", d.SG, "stage")), "{{stage}} mean")],
                 d.SECONDS, w=12, min_=0),
    d.timeseries("Requests per stage",
                 "Requests passing each scheduler stage per second.",
                 [(d.dp_rate(f"{STAGE}_count", by="stage"), "{{stage}}")],
                 d.REQ_PER_S, w=12, min_=0),
    d.timeseries("Time spent per stage",
                 "Seconds of request time spent in each stage per second (stage _sum rate): "
                 "where the time goes.",
                 [(d.dp_rate(f"{STAGE}_sum", by="stage"), "{{stage}}")],
                 d.SECONDS, w=12, min_=0, stack=True),
]

decomposition = [
    d.ttft_decomposition(w=24),
]

by_class = [
    d.ttft_by_class(),
    d.timeseries("Queue time p95 by prompt length",
                 "Waiting-queue time p95 per prompt-length class (5 min rule): alike across "
                 "classes when every request queues behind a backlog.",
                 [(d.by_class("instance_model_prompt_class:"
                              "sglang_obs_request_queue_time_seconds:p95_5m"),
                   "{{instance}} {{prompt_class}}")],
                 d.SECONDS, w=12, min_=0),
    d.timeseries("E2E latency p95 by prompt length",
                 "End-to-end latency p95 per prompt-length class (request records).",
                 [(d.by_class(f"{REC}e2e_latency_seconds", 0.95),
                   "{{instance}} {{prompt_class}}")],
                 d.SECONDS, w=8, min_=0),
    d.timeseries("Time per output token p50 by prompt length",
                 "Per-request (e2e - TTFT) / (output tokens - 1), p50 per prompt-length class: "
                 "decode speed by context length.",
                 [(d.by_class(f"{REC}time_per_output_token_seconds", 0.5),
                   "{{instance}} {{prompt_class}}")],
                 d.SECONDS, w=8, min_=0),
    d.timeseries("Cached share by prompt length",
                 "Share of prompt tokens served from the prefix cache, per prompt-length class.",
                 [(d.ratio(d.rate(f"{REC}cached_tokens_total", d.EXM, "instance, prompt_class"),
                           d.rate(f"{REC}prompt_tokens_total", d.EXM, "instance, prompt_class")),
                   "{{instance}} {{prompt_class}}")],
                 d.RATIO, w=8, min_=0, max_=1),
    d.timeseries("Requests by prompt length",
                 "Finished requests per second per prompt-length class (request records).",
                 [(d.rate(f"{REC}finished_total", d.EXM, "instance, prompt_class"),
                   "{{instance}} {{prompt_class}}")],
                 d.REQ_PER_S, w=12, min_=0, stack=True),
    d.timeseries("Requests by finish reason",
                 "Finished requests per second by finish reason (stop, length, abort, other), "
                 "all classes.",
                 [(d.rate(f"{REC}finished_total", d.EXM, "instance, finish_reason"),
                   "{{instance}} {{finish_reason}}")],
                 d.REQ_PER_S, w=12, min_=0, stack=True),
]

dashboard = d.dashboard(
    "SGLang / Latency", "sglang-latency",
    "Latency distributions, quantiles, SLO error ratios, queueing, per-stage time, the TTFT "
    "decomposition and latency by prompt length.",
    [
        ("Distributions", "Bucket rates of SGLang's latency histograms.", distributions),
        ("Quantiles", "p50/p95/p99 from the recording rules and the mean.", quantiles),
        ("SLO", "Error ratios over the burn-rate alert windows.", slo),
        ("Queueing", "Waiting-queue time and continuous queueing runs.", queueing),
        ("Per-stage latency", "sglang:per_stage_req_latency_seconds by stage.", stages),
        ("TTFT decomposition",
         "Mean time per request in each part of TTFT, from queue_time and the per-stage "
         "histogram.", decomposition),
        ("Latency by prompt length",
         f"SGLang's per-request records by prompt-length class (bounds {d.CLASS_BOUNDS_TEXT} "
         "tokens): exporter --sglang.request-metrics-dir.", by_class),
    ],
)
