"""A fleet on the real binaries (docs/fleet.md): three simulated hosts in two clusters, each a
simulator, the exporter and vmagent with the shipper configuration generated from
prometheus.yml, shipping into one VictoriaMetrics; vmalert evaluates the project's rules (the
vmalert variant) and sends to Alertmanager and the alert sink. sglang_obs.tools.fleet runs it, as
`sglang-obs fleet up 3 --demo` does.

One run, in this order (about 8 minutes):
1. every Fleet-dashboard query returns data for every host (VictoriaMetrics' Prometheus API);
2. host-3's shipper stops;
3. host-1 replays the long-context incident: its prefill-backlog page reaches the sink with its
   cluster and host;
4. the central VictoriaMetrics stops for 3 minutes and starts again: the shippers' on-disk
   buffers fill the gap — every minute across the outage has its samples — and the hosts kept
   scraping meanwhile; no page resolves during the outage;
5. host-3 shows as not reporting (SGLangHostNotReporting, the dashboard's "Hosts not
   reporting"), not as healthy: its servers have no state;
then: nothing else pages (host-2 nothing at all, host-3 only its silence), nothing was dropped.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.core.states import STATES
from sglang_obs.generate import fleet_timing
from sglang_obs.generate.render_dashboard import panels
from sglang_obs.render import rules
from sglang_obs.tools.fleet import Fleet

from conftest import ROOT, require_binary
from helpers import wait_for

S = _settings()  # the checkout's configuration, read once

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

OUTAGE_SECONDS = 180
INCIDENT_START_AT = 130  # the backlog builds from 165 s into the scenario: half a minute in
FLEET_DASHBOARD = ROOT / "grafana/dashboards/sglang-fleet.json"
ONLY_SILENT_HOSTS = "Hosts not reporting"  # the one panel that lists only hosts gone silent
RESULTS: dict = {}  # what the run measured, printed at the end (pytest -s)
BACKLOG_SIGNAL = "sglang_obs_prefill_backlog_tokens"  # the exporter's, as scraped


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def query(store: str, expr: str, at: float | None = None) -> list[dict]:
    """An instant query looking back 15 s as vmalert does (-datasource.queryStep), not
    VictoriaMetrics' default 5 minutes."""
    params = {"query": expr, "step": "15s", **({"time": f"{at:.3f}"} if at else {})}
    body = json.loads(_get(f"{store}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


def metric(url: str, name: str) -> float:
    """The sum of a metric's samples on a /metrics page (0 when absent)."""
    total = 0.0
    for line in _get(url).decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def export(store: str, selector: str, start: float) -> list[tuple[float, float]]:
    """Every stored sample of the series matching `selector` since `start`, as (time, value)
    sorted by time: what the store holds, not what a query's lookback makes of it."""
    params = urllib.parse.urlencode({"match[]": selector, "start": f"{start:.3f}"})
    samples = []
    for line in _get(f"{store}/api/v1/export?{params}").decode().splitlines():
        series = json.loads(line)
        samples += [(ts / 1000, float(v)) for ts, v in zip(series["timestamps"],
                                                             series["values"], strict=True)
                    if v is not None]  # a staleness marker exports as null
    return sorted(samples)


def first_sample(store: str, name: str, host: str, at_least: float = 0.0,
                 start: float = 0.0, **labels: str) -> float | None:
    """When a series of `host` first held at least `at_least` (the sample's own timestamp)."""
    selector = ", ".join(f'{k}="{v}"' for k, v in {"host": host, **labels}.items())
    return next((ts for ts, v in export(store, f"{name}{{{selector}}}", start)
                 if v >= at_least), None)


def backlog_chain(store: str, host: str, onset: float, threshold: float
                  ) -> dict[str, float | None]:
    """Seconds from the backlog's first scraped sample to each step on its way to the page: the
    recorded signal, the recorded state, the alert pending and firing (None: never)."""
    steps = {
        "recorded_signal": first_sample(store, "instance:sglang_prefill_backlog_tokens:max",
                                        host, threshold, onset - 60),
        "recorded_state": next((ts for ts, v in export(
            store, f'instance:sglang_state:code{{host="{host}"}}', onset - 60)
            if v == STATES.index("prefill_backlog")), None),
        **{state: first_sample(store, "ALERTS", host, 1, onset - 60,
                               alertname="SGLangPrefillBacklog", alertstate=state)
           for state in ("pending", "firing")}}
    return {k: None if ts is None else round(ts - onset) for k, ts in steps.items()}


def longest_evaluation(fleet: Fleet) -> float:
    """vmalert's longest evaluation of its one group so far (its summary's quantile 1)."""
    for line in _get(fleet.url("vmalert") + "/metrics").decode().splitlines():
        if (line.startswith("vmalert_iteration_duration_seconds{")
                and f'group="{rules.VMALERT_GROUP}"' in line and 'quantile="1"' in line):
            return round(float(line.rsplit(" ", 1)[1]), 3)
    raise AssertionError(f"vmalert reports no evaluation of group {rules.VMALERT_GROUP}")


def vm_release() -> str:
    """The VictoriaMetrics release the central compose file pins (Debian 12 ships the same)."""
    image = yaml.safe_load((ROOT / "docker-compose.central.yml").read_text())[
        "services"]["vmalert"]["image"]
    return image.rsplit(":v", 1)[1]


def sink_entries(fleet: Fleet) -> list[dict]:
    path = fleet.workdir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def dashboard_targets() -> list[tuple[str, str]]:
    dashboard = json.loads(FLEET_DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])
            if t.get("expr")]


def fill(expr: str, range_seconds: int) -> str:
    """Grafana's variables as "All" over the last `range_seconds`."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", f"{range_seconds}s")
    return re.sub(r"\$\{?(cluster|host|job|instance|model_name|exporter|gpu)\}?", ".*", expr)


def hosts_in(result: list[dict]) -> set[str]:
    return {r["metric"].get("host", "") for r in result
            if not math.isnan(float(r["value"][1]))}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    for binary in ("victoria-metrics", "vmagent", "vmalert"):
        require_binary(binary, "victoria-metrics")
    require_binary("prometheus-alertmanager")
    f = Fleet.simulated(tmp_path_factory.mktemp("fleet"), 3, clusters=2, demo=True,
                        incident_start_at=INCIDENT_START_AT)
    try:
        f.prepare()
        f.start(timeout=120)
        f.started = time.time()
        yield f
    finally:
        f.stop()


def test_fleet_end_to_end(fleet):
    store = fleet.url("victoria-metrics")
    names = {h.name for h in fleet.hosts}
    host1, host2, host3 = fleet.hosts
    assert (host1.cluster, host2.cluster, host3.cluster) == ("cluster-a", "cluster-b",
                                                             "cluster-a")

    # -- 1. every Fleet-dashboard query answers for every host ----------------------------------
    def every_panel_has_every_host():
        missing = {}
        for title, expr in dashboard_targets():
            if title == ONLY_SILENT_HOSTS:
                continue
            got = hosts_in(query(store, fill(expr, 300)))
            if got != names:
                missing[title] = sorted(got)
        return missing or None

    complete = wait_for(lambda: every_panel_has_every_host() is None, 150, interval=5)
    assert complete, f"Fleet panels without every host: {every_panel_has_every_host()}"
    silent_expr = next(e for t, e in dashboard_targets() if t == ONLY_SILENT_HOSTS)
    assert query(store, fill(silent_expr, 300)) == []
    RESULTS["recorded_series_per_host"] = {  # docs/performance.md: what the ruler adds
        r["metric"].get("host", ""): int(float(r["value"][1]))
        for r in query(store, 'count by (host) ({__name__=~"instance(_model)?:.+"})')}

    # -- 2. host-3's shipper stops: the fleet shows it as not reporting -------------------------
    fleet.stop_component(f"vmagent-{host3.name}")
    stopped_at = time.time()

    # -- 3. host-1's incident pages with its identity -------------------------------------------
    def page(alertname, host):
        return [e for e in sink_entries(fleet) if e["status"] == "firing"
                and e["labels"].get("alertname") == alertname
                and e["labels"].get("host") == host]

    threshold = rules.inputs()["classification"]["prefill_backlog_tokens"]
    budget = fleet_timing.budgets(S)["SGLangPrefillBacklog"]
    onset = wait_for(lambda: first_sample(store, BACKLOG_SIGNAL, host1.name, threshold),
                     240, interval=1)
    assert onset, f"host-1's backlog never reached {threshold} tokens in the store"
    # The page may come up to the budget after the onset; a minute past it, the chain is broken.
    wait_for(lambda: page("SGLangPrefillBacklog", host1.name),
             onset + budget.notify_worst + 60 - time.time(), interval=1)
    pages = page("SGLangPrefillBacklog", host1.name)
    chain = backlog_chain(store, host1.name, onset, threshold)
    assert pages, (f"host-1's prefill backlog never paged (budget {budget.notify_worst:.0f} s "
                   f"from its onset); seconds after the onset: {chain}")
    backlog = pages[0]
    delay = backlog["time"] - onset
    RESULTS["prefill_backlog_page"] = {
        "onset_to_page_s": round(delay), "budget_s": budget.notify_worst,
        "margin_s": budget.notify_worst - round(delay), "chain": chain,
        "longest_evaluation_s": longest_evaluation(fleet)}
    print(f"prefill backlog paged {delay:.0f} s after its onset: {budget.notify_worst - delay:.0f}"
          f" s inside the {budget.notify_worst:.0f} s budget; {chain}")
    assert delay <= budget.notify_worst, (
        f"host-1's prefill backlog paged {delay:.0f} s after its onset, past the fleet budget of "
        f"{budget.notify_worst:.0f} s (docs/fleet.md); seconds after the onset: {chain}")
    assert backlog["labels"]["cluster"] == host1.cluster
    assert backlog["labels"]["instance"] == host1.instance, backlog["labels"]
    assert backlog["annotations"]["dashboard"].endswith(
        f"?var-cluster={host1.cluster}&var-host={host1.name}")

    # -- 4. the central store stops for 3 minutes; the buffers fill the gap ---------------------
    agents = {h.name: f"http://127.0.0.1:{h.agent_port}/metrics" for h in (host1, host2)}
    scrapes_before = {n: metric(u, "vm_promscrape_scrapes_total") for n, u in agents.items()}
    down_at = time.time()
    fleet.stop_component("victoria-metrics")
    time.sleep(OUTAGE_SECONDS / 2)
    pending = {n: metric(u, "vm_persistentqueue_bytes_pending") for n, u in agents.items()}
    time.sleep(OUTAGE_SECONDS / 2)
    scrapes_during = {n: metric(u, "vm_promscrape_scrapes_total") - scrapes_before[n]
                      for n, u in agents.items()}
    fleet.restart_component("victoria-metrics")
    up_at = time.time()
    RESULTS["outage"] = {"down": round(down_at), "up": round(up_at),
                         "seconds": round(up_at - down_at),
                         "buffered_bytes_midway": pending, "scrapes_during": scrapes_during}
    for name in agents:  # scraping never stalled: 3 min at 5 s (exporter) and 15 s (SGLang)
        assert scrapes_during[name] >= 0.8 * (OUTAGE_SECONDS / 5 + OUTAGE_SECONDS / 15), (
            name, scrapes_during)
        assert pending[name] > 0, f"{name}: nothing buffered while the store was down"

    def drained():
        return all(metric(u, "vm_persistentqueue_bytes_pending") == 0 for u in agents.values())

    assert wait_for(drained, 120, interval=2), "the buffers did not drain after the outage"
    RESULTS["drained_after_s"] = round(time.time() - up_at)
    # Samples per minute, in windows of 60 s from the minute before the outage to the minute
    # after it: (down - 60, down], (down, down + 60], ..., up to past `up`.
    windows = [down_at + 60 * k for k in range(math.ceil((up_at - down_at) / 60) + 2)]
    wait_for(lambda: time.time() > windows[-1] + 15, windows[-1] + 20 - time.time(), 1)
    counts = {}
    for h in (host1, host2):
        for job, interval in (("sglang-obs", 5), ("sglang", 15)):
            expr = f'count_over_time(up{{host="{h.name}", job="{job}"}}[60s])'
            per_minute = []
            for at in windows:
                result = query(store, expr, at)
                per_minute.append(int(float(result[0]["value"][1])) if result else 0)
            counts[f"{h.name} {job}"] = per_minute
            assert min(per_minute) >= 60 // interval - 1, (
                f"{h.name} {job}: a minute lost samples across the outage: {per_minute}")
    RESULTS["samples_per_minute"] = counts
    for name, url in agents.items():
        assert metric(url, "vm_persistentqueue_bytes_dropped_total") == 0, name
        assert metric(url, "vmagent_remotewrite_packets_dropped_total") == 0, name

    # -- 5. host-3, silent since before the outage, pages once the store is back ----------------
    assert wait_for(lambda: page("SGLangHostNotReporting", host3.name), 240, interval=5), (
        "host-3's silence never paged")
    silence = page("SGLangHostNotReporting", host3.name)[0]
    RESULTS["not_reporting_after_s"] = {"shipper_stop": round(silence["time"] - stopped_at),
                                         "store_back": round(silence["time"] - up_at)}
    assert silence["labels"]["cluster"] == host3.cluster
    assert hosts_in(query(store, fill(silent_expr, 600))) == {host3.name}
    # ...and not as healthy: its servers have no current state in the store
    assert not [r for r in query(store, "instance:sglang_state:code")
                if r["metric"].get("host") == host3.name]


    # -- then: only host-1's incident and host-3's silence paged ---------------------------------
    entries = [e for e in sink_entries(fleet) if e["labels"].get("alertname") != "Watchdog"]
    RESULTS["alerts"] = sorted({(e["labels"].get("alertname"), e["labels"].get("cluster"),
                                 e["labels"].get("host"), e["status"]) for e in entries})
    for e in entries:
        labels = e["labels"]
        assert labels.get("cluster"), f"alert without a cluster: {labels}"
        assert labels.get("host"), f"alert without a host: {labels}"
        if labels["host"] == host1.name:
            assert labels["cluster"] == host1.cluster, labels
            assert labels.get("instance") in (None, host1.instance), labels
        elif labels["host"] == host3.name:
            assert labels["alertname"] == "SGLangHostNotReporting", labels
            # a store outage under 4 minutes resolves no page (vmalert -rule.resendDelay=1m)
            assert e["status"] == "firing", e
        else:
            pytest.fail(f"a host without an incident paged: {labels}")
    assert not [e for e in entries if e["labels"]["alertname"] == "SGLangShipperDroppingData"]
    # How long host-1's backlog held over the threshold from its onset (its samples, as scraped,
    # to the first one below).
    samples = export(store, f'{BACKLOG_SIGNAL}{{host="{host1.name}"}}', onset)
    held = next((ts for ts, v in samples if v < threshold), samples[-1][0]) - onset
    RESULTS["prefill_backlog_page"]["backlog_seconds"] = round(held)
    print(json.dumps(RESULTS, indent=1))
    (fleet.workdir / "results.json").write_text(json.dumps(RESULTS, indent=1))
    record = {"command": "SGLANG_OBS_RECORD_FLEET=1 pytest tests/test_fleet.py",
              "date": datetime.date.today().isoformat(),
              "setup": f"3 simulated hosts; VictoriaMetrics, vmagent and vmalert {vm_release()}",
              "prefill_backlog_page": RESULTS["prefill_backlog_page"]}
    if os.environ.get("SGLANG_OBS_RECORD_FLEET") == "1":
        (S.docs_dir / fleet_timing.FLEET_E2E).write_text(json.dumps(record, indent=1) + "\n")
    recorded = fleet_timing.load_e2e(S.docs_dir / fleet_timing.FLEET_E2E)
    assert recorded, "docs/fleet-e2e.json missing: run with SGLANG_OBS_RECORD_FLEET=1"
    # Two runs start at other phases of the evaluation and of Alertmanager's groups.
    tolerance = budget.evaluation + budget.group_wait
    then, now = (r["prefill_backlog_page"]["onset_to_page_s"] for r in (recorded, record))
    assert abs(then - now) <= tolerance, (
        f"docs/fleet.md quotes a page {then} s after the onset, this run {now} s (rerun with "
        "SGLANG_OBS_RECORD_FLEET=1 and make generate)")
