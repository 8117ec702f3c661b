"""SGLang / Exporter (uid sglang-exporter): is the monitoring itself working? Polls, collectors,
the log source, the container source and NVML."""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

SELF = d.EXPORTER_SELF

polls = [
    d.state_timeline("SGLang server polled",
                     "sglang_obs_up per server: 1 if the last poll got a valid answer "
                     "(/metrics or the load endpoint).",
                     [(f"max by (instance) (sglang_obs_up{{{d.EX}}})", "{{instance}}")],
                     d.UP_DOWN, w=12, h=6),
    d.state_timeline("Prometheus scrapes",
                     "Prometheus's own `up` for SGLang's /metrics and for the exporter.",
                     [(f"up{{{d.SG_HTTP}}}", "{{instance}} SGLang /metrics"),
                      (f'up{{job="{d.EXPORTER_JOB}", instance=~"$exporter"}}',
                       "{{instance}} exporter")],
                     d.UP_DOWN, w=12, h=6),
    d.timeseries("Poll errors by reason",
                 "Failed endpoint requests per second by endpoint and reason "
                 "(connection_refused, timeout, http_status, too_large, network, parse). A "
                 "pair's series starts at its first failure: empty means none yet.",
                 [(d.rate("sglang_obs_poll_errors_total", d.EX, "instance, endpoint, reason"),
                   "{{instance}} {{endpoint}} {{reason}}")],
                 d.REQ_PER_S, w=8, min_=0, bars=True),
    d.timeseries("Poll duration",
                 "Wall time of the last poll cycle (all endpoints) per server.",
                 [(f"max by (instance) (sglang_obs_poll_duration_seconds{{{d.EX}}})",
                   "{{instance}}")], d.SECONDS, w=8, min_=0),
    d.timeseries("Time since last good poll",
                 "Seconds since the last poll that got a valid answer, per server.",
                 [(f"time() - max by (instance) "
                   f"(sglang_obs_last_poll_success_timestamp_seconds{{{d.EX}}})",
                   "{{instance}}")], d.SECONDS, w=8, min_=0),
    d.table("Native metrics",
            "How each server's /metrics names its series (colon, underscore, mixed, none) and "
            "whether it has scheduler series.",
            [(f"max by (instance, spelling) (sglang_obs_native_metrics_info{{{d.EX}}})",
              "{{instance}}"),
             (f"max by (instance) (sglang_obs_scheduler_metrics_present{{{d.EX}}})",
              "{{instance}}")],
            merge=True, hide=("Time", "Value #A"),
            rename={"Value #B": "scheduler series present"}, w=12, h=6),
    d.timeseries("Polls",
                 "Poll cycles per second per server.",
                 [(d.rate("sglang_obs_polls_total", d.EX), "{{instance}}")],
                 d.OPS, w=12, h=6, min_=0),
]

collectors = [
    d.state_timeline("Collector success",
                     "sglang_obs_collector_success: 1 if the collector rendered its series in "
                     "the scrape (else they are missing; the exporter log has the error).",
                     [(f"min by (collector) (sglang_obs_collector_success{{{SELF}}})",
                       "{{collector}}")],
                     d.value_mappings(((0, "failed", "red"), (1, "ok", "green"))), w=12, h=6),
    d.timeseries("Collector duration",
                 "Time each collector took to render its series in the scrape.",
                 [(f"max by (collector) (sglang_obs_collector_duration_seconds{{{SELF}}})",
                   "{{collector}}")], d.SECONDS, w=12, h=6, min_=0),
    d.table("Exporter build",
            "Exporter version per exporter instance.",
            [(f"max by (instance, version) (sglang_obs_exporter_build_info{{{SELF}}})",
              "{{instance}}")], hide=("Time", "Value"), w=24, h=4),
]

logs = [
    d.state_timeline("Log source",
                     "sglang_obs_log_source_up per server and source (file or container "
                     "stream): 1 while it is being read.",
                     [(f"max by (instance, source) (sglang_obs_log_source_up{{{d.EX}}})",
                       "{{instance}} {{source}}")],
                     d.UP_DOWN, w=12, h=6),
    d.timeseries("Log lines by kind",
                 "Scheduler log lines read per second by kind; a rise of 'unparsed' means a "
                 "format the parser does not know.",
                 [(d.rate("sglang_obs_log_lines_total", d.EX, "instance, kind"),
                   "{{instance}} {{kind}}")], d.OPS, w=12, h=6, min_=0, stack=True),
    d.timeseries("Log lag",
                 "Now minus the time printed on the last parsed line (SGLang's local time read "
                 "as this host's), per server.",
                 [(f"time() - max by (instance) "
                   f"(sglang_obs_log_last_line_timestamp_seconds{{{d.EX}}})", "{{instance}}")],
                 d.SECONDS, w=12, h=6),
    d.timeseries("Log rotations",
                 "Times the followed log file was rotated or truncated, per interval.",
                 [(d.rate("sglang_obs_log_rotations_total", d.EX, fn="increase"),
                   "{{instance}}")], d.COUNT, w=12, h=6, min_=0, bars=True),
]

sources = [
    d.state_timeline("GPU collector up",
                     "1 if NVML answered and at least one GPU was read in the last cycle.",
                     [(f"max by (instance) (sglang_obs_gpu_collector_up{{{SELF}}})",
                       "{{instance}} NVML")],
                     d.UP_DOWN, w=12, h=5),
    d.state_timeline("Container source up",
                     "1 if the last Docker API poll succeeded.",
                     [(f"max by (instance) (sglang_obs_container_source_up{{{SELF}}})",
                       "{{instance}} Docker")],
                     d.UP_DOWN, w=12, h=5),
    d.timeseries("NVML errors by reason",
                 "NVML failures per second by reason (gpu_lost, driver_not_loaded, ...); a "
                 "reason's series starts at its first failure: empty means none yet.",
                 [(d.rate("sglang_obs_gpu_collection_errors_total", SELF, "instance, reason"),
                   "{{instance}} {{reason}}")], d.OPS, w=8, min_=0, bars=True),
    d.timeseries("NVML initialisations",
                 "nvmlInit calls per interval, re-inits after a lost GPU included.",
                 [(d.rate("sglang_obs_gpu_nvml_inits_total", SELF, fn="increase"),
                   "{{instance}}")], d.COUNT, w=8, min_=0, bars=True),
    d.timeseries("GPU sampling",
                 "Duration of the last NVML sampling cycle, and seconds since the last cycle "
                 "that read a GPU.",
                 [(f"max by (instance) (sglang_obs_gpu_collection_duration_seconds{{{SELF}}})",
                   "{{instance}} cycle"),
                  (f"time() - max by (instance) "
                   f"(sglang_obs_gpu_last_collection_success_timestamp_seconds{{{SELF}}})",
                   "{{instance}} since last good cycle")], d.SECONDS, w=8, min_=0),
]

dashboard = d.dashboard(
    "SGLang / Exporter", "sglang-exporter",
    "Health of the monitoring: SGLang polls, collectors, the log source, the container source "
    "and NVML.",
    [
        ("SGLang polls", "Is the exporter reaching each SGLang server?", polls),
        ("Collectors", "Per-collector success and duration.", collectors),
        ("Scheduler log", "The log source and its parser.", logs),
        ("GPU and container sources", "NVML and the Docker API.", sources),
    ],
    extra_variables=[d.EXPORTER],
)
