"""SGLang / Fleet (uid sglang-fleet): every host of every cluster on one page (docs/fleet.md).
Which servers spent the most time in a bad state, which burn their latency budget, which run out
of KV room, which hosts have GPU faults, which hosts stopped reporting or ship without a proper
identity — each row links to that server's or host's overview. Every query keeps `cluster` and
`host`, so two clusters with the same server address stay two rows."""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

W = d.WHERE
PER_SERVER = "cluster, host, instance"
PER_HOST = "cluster, host"
SERVER_LEGEND = "{{cluster}} / {{host}} / {{instance}}"
HOST_LEGEND = "{{cluster}} / {{host}}"
SLO = d.SLO
XIDS = d.ALERTS["gpu_xid_critical"]
THROTTLE = d.ALERTS["gpu_throttle_reasons"]


def overview_link(per_server: bool = True) -> list[dict]:
    """A data link to the overview of the row's server (or host), on the same time range."""
    url = ("/d/sglang-overview?var-cluster=${__field.labels.cluster}"
           "&var-host=${__field.labels.host}")
    if per_server:
        url += "&var-instance=${__field.labels.instance}"
    return [{"title": "Overview of this " + ("server" if per_server else "host"),
             "url": url + "&${__url_time_range}"}]


def linked(panel, per_server: bool = True):
    panel.extraJson["fieldConfig"]["defaults"]["links"] = overview_link(per_server)
    return panel


def linked_bar(panel, per_server: bool = True):
    panel.overrides.append({"matcher": {"id": "byFrameRefID", "options": "A"},
                            "properties": [{"id": "links", "value": overview_link(per_server)}]})
    return panel


def per_host(expr: str, presence: str = f'sglang_obs_gpu_device_up{{{d.GPU_ALL}}}') -> str:
    """`expr` per host, 0 for a host that reports GPUs but has nothing to count."""
    return (f"{expr}\nor on ({PER_HOST}) 0 * group by ({PER_HOST}) ({presence})")


BAD = (f"avg_over_time(instance:sglang_saturated:bool{{{W}}}[$__range])\n"
       f"+ on ({PER_SERVER}) (1 - avg_over_time(instance:sglang_available:min{{{W}}}[$__range]))")

ranking = [
    linked_bar(d.bar_gauge(
        "Servers by time in a bad state",
        "Share of the dashboard's time range each server spent saturated (prefill backlog, "
        "decode contention, KV capacity, scheduling bottleneck) or unavailable, worst first; "
        "click a bar for the server's overview.",
        [(f"sort_desc({BAD})", SERVER_LEGEND)],
        d.RATIO, w=12, h=10, min_=0, max_=1,
        thresholds=d.steps("green", (0.05, "orange"), (0.25, "red")))),
    d.state_timeline(
        "State of every server",
        "The state classification (instance:sglang_state:code) of every server of the selected "
        "clusters and hosts.",
        [(f"max by ({PER_SERVER}) (instance:sglang_state:code{{{W}}})", SERVER_LEGEND)],
        d.state_mappings(), w=12, h=10),
]


def burn(key: str, title: str) -> object:
    budget = round(1 - float(SLO[key]["objective"]), 6)
    return linked_bar(d.bar_gauge(
        f"{title} budget burn, 1 h",
        f"How fast each server spends its {title} error budget: the 1 h error ratio over the "
        f"budget ({budget}); 1 spends it exactly in the SLO period, 14.4 pages "
        f"(SGLang{key.upper()}BudgetBurn). Servers without traffic have no bar.",
        [(f"sort_desc(max by ({PER_SERVER}) "
          f"(instance_model:sglang_{key}_slo_errors:ratio_rate1h{{{W}}}) / {budget})",
          SERVER_LEGEND)],
        d.NONE, w=12, h=8, min_=0,
        thresholds=d.steps("green", (1, "orange"), (14.4, "red"))))


budgets = [burn("ttft", "TTFT"), burn("itl", "ITL")]

kv = [
    linked_bar(d.bar_gauge(
        "KV occupancy now",
        "KV pool used over capacity per server (instance:sglang_kv_occupancy:ratio), fullest "
        "first; kv_capacity starts at "
        f"{d.CLASSIFY['kv_occupancy_ratio']}.",
        [(f"sort_desc(instance:sglang_kv_occupancy:ratio{{{W}}})", SERVER_LEGEND)],
        d.RATIO, w=12, h=8, min_=0, max_=1,
        thresholds=d.steps("green", (0.8, "orange"),
                           (float(d.CLASSIFY["kv_occupancy_ratio"]), "red")))),
    linked_bar(d.bar_gauge(
        "KV occupancy peak",
        "The highest KV occupancy of each server over the dashboard's time range.",
        [(f"sort_desc(max_over_time(instance:sglang_kv_occupancy:ratio{{{W}}}[$__range]))",
          SERVER_LEGEND)],
        d.RATIO, w=12, h=8, min_=0, max_=1,
        thresholds=d.steps("green", (0.8, "orange"),
                           (float(d.CLASSIFY["kv_occupancy_ratio"]), "red")))),
]

gpu = [
    linked(d.table(
        "GPU faults by host",
        "Per host: GPUs NVML no longer reaches, GPUs that reported a critical Xid in the time "
        "range, GPUs throttled by heat or a power brake now; 0 everywhere is healthy. Click a "
        "row for the host's overview.",
        [(per_host(f"count by ({PER_HOST}) (sglang_obs_gpu_device_up{{{d.GPU_ALL}}} == 0)"),
          HOST_LEGEND),
         (per_host(f"count by ({PER_HOST}) (changes(sglang_obs_gpu_xid_last_timestamp_seconds"
                   f'{{{d.GPU_ALL}, xid=~"{XIDS}"}}[$__range]) > 0)'), HOST_LEGEND),
         (per_host(f"count by ({PER_HOST}) (sglang_obs_gpu_clock_event_active"
                   f'{{{d.GPU_ALL}, reason=~"{THROTTLE}"}} == 1)'), HOST_LEGEND),
         (f"count by ({PER_HOST}) (sglang_obs_gpu_device_up{{{d.GPU_ALL}}})", HOST_LEGEND)],
        d.COUNT, w=24, h=7, merge=True,
        rename={"Value #A": "GPUs lost", "Value #B": "GPUs with a critical Xid",
                "Value #C": "GPUs throttling", "Value #D": "GPUs"}), per_server=False),
]

hosts = [
    linked(d.table(
        "Host identity",
        "Every (cluster, host) the store hears from: its SGLang servers, whether its exporter "
        "is scraped; an empty cluster, a server counted under two hosts or a host under two "
        "clusters is a wrong identity (SGLangHostClusterLabelMissing, "
        "SGLangHostIdentityConflict).",
        [(f'count by ({PER_HOST}) (up{{{W}, job="{d.SGLANG_JOB}"}})', HOST_LEGEND),
         (f'max by ({PER_HOST}) (up{{{W}, job="{d.EXPORTER_JOB}"}})', HOST_LEGEND)],
        d.COUNT, w=12, h=8, merge=True,
        rename={"Value #A": "SGLang servers", "Value #B": "exporter up"}), per_server=False),
    d.table(
        "Hosts not reporting",
        "Hosts the store heard from in the time range but not in the last few minutes: their "
        "last values are not their state (SGLangHostNotReporting). Empty is good.",
        [(f"count by ({PER_HOST}) (max_over_time(up{{{W}}}[$__range]))\n"
          f"unless on ({PER_HOST}) max by ({PER_HOST}) "
          f"(max_over_time(up{{{W}}}[$__rate_interval]))", HOST_LEGEND)],
        d.COUNT, w=12, h=8, rename={"Value": "targets before the silence"}),
]

SH = f'{W}, job="{d.SHIPPER_JOB}"'
shipping = [
    d.timeseries(
        "Shipper buffer",
        "Bytes each host's shipper holds on disk, not yet accepted by the store (vmagent "
        "vm_persistentqueue_bytes_pending): grows while the store is down or slow, bounded by "
        "-remoteWrite.maxDiskUsagePerURL.",
        [(f"max by ({PER_HOST}) (vm_persistentqueue_bytes_pending{{{SH}}})", HOST_LEGEND)],
        d.BYTES, w=8, min_=0),
    d.timeseries(
        "Shipper drops",
        "Bytes the shipper threw away per second: the oldest buffered data past the bound, or "
        "blocks the store refused (SGLangShipperDroppingData). Zero is good.",
        [(f"sum by ({PER_HOST}) "
          f"(rate(vm_persistentqueue_bytes_dropped_total{{{SH}}}[$__rate_interval]))",
          HOST_LEGEND)],
        "Bps", w=8, min_=0),
    d.timeseries(
        "Shipper samples sent",
        "Samples per second each shipper sends to the store (after relabelling).",
        [(f"sum by ({PER_HOST}) "
          f"(rate(vmagent_remotewrite_rows_pushed_after_relabel_total{{{SH}}}[$__rate_interval]))",
          HOST_LEGEND)],
        d.OPS, w=8, min_=0),
    d.bar_gauge(
        "Shipper memory",
        "Resident memory of each host's shipper (process_resident_memory_bytes).",
        [(f"max by ({PER_HOST}) (process_resident_memory_bytes{{{SH}}})", HOST_LEGEND)],
        d.BYTES, w=24, h=6, min_=0),
]

dashboard = d.dashboard(
    "SGLang / Fleet", "sglang-fleet",
    "Every host of every cluster: servers ranked by time in a bad state, latency budget burn, KV "
    "pressure, GPU faults, and hosts that stopped reporting or ship without a proper identity. "
    "Click a row for the server's overview.",
    [("Servers in a bad state", "Worst first over the dashboard's time range.", ranking),
     ("Latency budget burn", "TTFT and ITL SLO burn rates (thresholds.yml).", budgets),
     ("KV pressure", "The servers closest to running out of KV room.", kv),
     ("GPU faults", "Lost GPUs, critical Xids and throttling per host.", gpu),
     ("Hosts", "Identity and silence: what the store hears from each host.", hosts),
     ("Shipping", "Each host's shipper (vmagent): buffer, drops, throughput, memory.", shipping)],
    variables=(d.CLUSTER, d.HOST, d.JOB, d.INSTANCE, d.MODEL), time_from="now-6h")
