"""SGLang / Server (uid sglang-server): effective configuration and its changes, availability and
errors, the container, and per-rank scheduler series."""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

CONFIG_LABELS = ("version", "tp_size", "dp_size", "pp_size", "schedule_policy", "kv_cache_dtype",
                 "speculative_algorithm", "mixed_chunk", "disaggregation_mode")
# (gauge, column / legend name)
CONFIG_GAUGES = (
    ("sglang_obs_config_tp_size", "tp_size"),
    ("sglang_obs_config_dp_size", "dp_size"),
    ("sglang_obs_config_chunked_prefill_size_tokens", "chunked_prefill_size"),
    ("sglang_obs_config_max_prefill_tokens", "max_prefill_tokens"),
    ("sglang_obs_config_context_length_tokens", "context_length"),
    ("sglang_obs_config_mixed_chunk_enabled", "mixed_chunk_enabled"),
    ("sglang_obs_config_num_continuous_decode_steps", "num_continuous_decode_steps"),
)
LIMITS = (
    ("sglang_obs_max_running_requests", "max_running_requests"),
    ("sglang_obs_kv_capacity_tokens", "kv_capacity_tokens"),
)
ERROR_RATIO = float(d.ALERTS["request_error_ratio"])
RANK = "instance, dp_rank, tp_rank"
RANK_LEGEND = "{{instance}} dp={{dp_rank}} tp={{tp_rank}}"


def config_gauge(metric: str) -> str:
    return f"max by (instance, model_name) ({metric}{{{d.EXM}}})"


info_query = (f"max by (instance, model_name, {', '.join(CONFIG_LABELS)}) "
              f"(sglang_obs_server_config_info{{{d.EXM}}})")
table_queries = [(info_query, "{{instance}}")] + [
    (config_gauge(metric), name) for metric, name in (*CONFIG_GAUGES[2:], *LIMITS)]
refs = "ABCDEFGH"

configuration = [
    d.table("Effective configuration",
            "What the server runs with, from /server_info and the load endpoint (changes only "
            "on restart): labels of sglang_obs_server_config_info and the sglang_obs_config_* "
            "gauges.",
            table_queries, unit=d.NONE, h=6, merge=True, hide=("Time", "Value #A"),
            rename={f"Value #{refs[i]}": name
                    for i, (_, name) in enumerate(table_queries) if i}),
    d.state_timeline("Configuration over time",
                     "Each configuration value per server over time: a new segment is a change "
                     "(restart with other flags, or an upgrade: the version row).",
                     [(config_gauge(metric), f"{{{{instance}}}} {name}")
                      for metric, name in CONFIG_GAUGES]
                     + [(f"max by (instance, version) (sglang_obs_server_config_info{{{d.EXM}}})",
                         "{{instance}} version {{version}}")],
                     [], unit=d.NONE, w=16, h=8),
    d.timeseries("Configuration changes",
                 "Changes of each configuration gauge per interval (changes()), and label-set "
                 "changes of the info metric (distinct sets in the interval - 1).",
                 [(f"sum by (instance) (changes({metric}{{{d.EXM}}}[$__rate_interval]))",
                   f"{{{{instance}}}} {name}") for metric, name in CONFIG_GAUGES]
                 + [("count by (instance) (count_over_time(sglang_obs_server_config_info"
                     f"{{{d.EXM}}}[$__rate_interval])) - 1", "{{instance}} info labels")],
                 d.COUNT, w=8, h=8, min_=0, bars=True),
]

availability = [
    d.state_timeline("Server available",
                     "Whether the server answers: the exporter's poll, else Prometheus's scrape "
                     "(instance:sglang_available:min).",
                     [(f"instance:sglang_available:min{{{d.INST}}}", "{{instance}}")],
                     d.UP_DOWN, w=12, h=6),
    d.timeseries("Request errors",
                 "Aborted share of finished requests and 5xx share of serving-endpoint responses "
                 f"(5 min rules); alert at {ERROR_RATIO:g}.",
                 [(f"instance_model:sglang_aborted_requests:ratio_rate5m{{{d.IM}}}",
                   "{{instance}} aborted"),
                  (f"instance:sglang_http_5xx:ratio_rate5m{{{d.INST}}}", "{{instance}} 5xx")],
                 d.RATIO, w=12, h=6, min_=0, thresholds=d.steps("green", (ERROR_RATIO, "red"))),
    d.timeseries("HTTP responses by status",
                 "Serving-endpoint responses per second by status code (SGLang 0.5.7+).",
                 [(d.rate("sglang:http_responses_total",
                          f'{d.SG_HTTP}, endpoint=~"{d.SERVING}"', "instance, status_code"),
                   "{{instance}} {{status_code}}")],
                 d.REQ_PER_S, w=12, h=6, min_=0, stack=True),
    d.timeseries("Restarts seen in the log",
                 "SGLang starts ('ready to roll' lines) per interval, from the scheduler log.",
                 [(f"sum by (instance) (changes(sglang_obs_log_ready_timestamp_seconds{{{d.EX}}}"
                   "[$__rate_interval]))", "{{instance}}")],
                 d.COUNT, w=12, h=6, min_=0, bars=True),
]

container = [
    d.table("Containers",
            "The SGLang containers the exporter sees: image, state and health.",
            [(f"max by (container, server, image, state, health) "
              f"(sglang_obs_container_info{{{d.EX}}})", "{{container}}")],
            hide=("Time", "Value"), w=12, h=6),
    d.state_timeline("Container running",
                     "Per container: running or not (Docker state).",
                     [(f"max by (container) (sglang_obs_container_running{{{d.EX}}})",
                       "{{container}}")],
                     d.value_mappings(((0, "stopped", "red"), (1, "running", "green"))),
                     w=12, h=6),
    d.timeseries("Restarts and OOM kills",
                 "Restarts by the restart policy and exits by the kernel's OOM killer per "
                 "interval, per container.",
                 [(d.rate("sglang_obs_container_restarts_total", d.EX, "container",
                          fn="increase"), "{{container}} restarts"),
                  (d.rate("sglang_obs_container_oom_kills_total", d.EX, "container",
                          fn="increase"), "{{container}} OOM kills")],
                 d.COUNT, w=12, h=6, min_=0, bars=True),
    d.stat("Last exit OOM killed",
           "1 if the container's last exit was an OOM kill.",
           [(f"max by (container) (sglang_obs_container_oom_killed{{{d.EX}}})",
             "{{container}}")], d.NONE, w=4, h=6, mappings=d.YES_NO, graph=False,
           background=True),
    d.stat("Last exit code",
           "Exit code of each container's last exit.",
           [(f"max by (container) (sglang_obs_container_last_exit_code{{{d.EX}}})",
             "{{container}}")], d.NONE, w=4, h=6, graph=False,
           thresholds=d.steps("green", (1, "orange"))),
    d.stat("Container uptime",
           "Time since each container last started.",
           [(f"time() - max by (container) (sglang_obs_container_start_time_seconds{{{d.EX}}})",
             "{{container}}")], d.SECONDS, w=4, h=6, graph=False),
]

ranks = [
    d.timeseries("Running requests per rank",
                 "sglang:num_running_reqs per DP and TP rank (priority=\"\" is the total with "
                 "priority scheduling).",
                 [(f'max by ({RANK}) (sglang:num_running_reqs{{{d.SG}, priority=""}})',
                   RANK_LEGEND)], d.COUNT, w=12, min_=0),
    d.timeseries("Waiting requests per rank",
                 "sglang:num_queue_reqs per DP and TP rank.",
                 [(f'max by ({RANK}) (sglang:num_queue_reqs{{{d.SG}, priority=""}})',
                   RANK_LEGEND)], d.COUNT, w=12, min_=0),
    d.timeseries("KV token usage per rank",
                 "sglang:token_usage per DP and TP rank (evictable tokens count as free; rounded "
                 "to 0.01).",
                 [(f"max by ({RANK}) (sglang:token_usage{{{d.SG}}})", RANK_LEGEND)],
                 d.RATIO, w=8, min_=0, max_=1),
    d.timeseries("Generation throughput per rank",
                 "sglang:gen_throughput per rank: decode tokens/s between two decode reports "
                 "(0 after an idle refresh).",
                 [(f"max by ({RANK}) (sglang:gen_throughput{{{d.SG}}})", RANK_LEGEND)],
                 d.TOKENS_PER_S, w=8, min_=0),
    d.timeseries("Scheduler busy share per rank",
                 "1 - idle share of each scheduler process (SGLang 0.5.20+).",
                 [(f"1 - max by ({RANK}) (rate(sglang:scheduler_idle_seconds_total{{{d.SG}}}"
                   "[$__rate_interval]))", RANK_LEGEND)],
                 d.RATIO, w=8, min_=0, max_=1),
]

dashboard = d.dashboard(
    "SGLang / Server", "sglang-server",
    "The effective configuration and its changes, availability and request errors, the "
    "container, and per-rank scheduler series.",
    [
        ("Configuration", "Effective settings, from the exporter's /server_info poll.",
         configuration),
        ("Availability and errors", "Up, aborted and 5xx shares, restarts.", availability),
        ("Container", "Docker state of the SGLang containers.", container),
        ("Per rank", "Scheduler series by dp_rank and tp_rank.", ranks),
    ],
)
