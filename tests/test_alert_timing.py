"""Alert timing end to end, on the real binaries at the shipped default intervals: how soon each
fault's notification reaches the receiver, how soon "resolved" follows the clear, and how many
notifications one incident makes.

Every scenario runs at once, each on a host of its own (a simulator, its GPU feed and an
exporter; for a PD deployment, `sglang-sim pd`'s engines and gateway, one exporter watching the
engines, and the deployment's own `cluster` label), into one Prometheus with
prometheus/prometheus.yml and the generated rules (15 s scrape and evaluation, 5 s for the
exporters), one Alertmanager with alertmanager/alertmanager.yml, and the alert sink. Each
simulator starts early enough that Prometheus records a healthy history first (decode
contention is judged against the last hour's decode speed, so it needs minutes of it before the
long generations begin). The run takes about 20 minutes.

The measurements go to docs/detection-e2e.json (with SGLANG_OBS_RECORD_E2E=1), which
docs/detection.md quotes; otherwise the run is compared with the recorded one.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.generate import detection
from sglang_obs.tools.stack import _which

from conftest import ROOT, require_binary
from helpers import free_port, stop_process, wait_for

S = _settings()  # the checkout's configuration, read once

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BIN = Path(sys.executable).parent
AFTER_CLEAR = 135  # seconds watched after the last clear: the resolve target and a margin
# (scenario, simulated second to start at): healthy history before the load changes (the
# decode-contention, KV-exhaustion and scheduling scenarios change their load at 300 s).
HOSTS = (("long-context-incident", 0), ("kv-exhaustion", 150), ("decode-contention", 150),
         ("scheduling-bottleneck", 150), ("crash-restart", 420), ("gpu-lost", 120),
         ("healthy", 60), ("idle-preallocated", 0), ("planned-restart", 300),
         ("spec-decoding-collapse", 0), ("hicache-host-drops", 0),
         ("grammar-compile-backlog", 0), ("lora-churn", 0), ("priority-starvation", 0))
# The cause the first notification of a host's incident must name (feature_rules.queue_causes).
CAUSES = {"lora-churn": "cause: every LoRA adapter slot",
          "priority-starvation": "cause: priority 0 requests wait far longer"}
# Recorded, not required: the starved priority's wait (Little's law over 2 minutes) crosses its
# 30 s bound about when the state's alert first notifies, so one run in three of this stop's
# names it only after the first notification (to fix: the cause's evidence sooner).
CAUSE_RECORDED_ONLY = {"priority-starvation"}
# PD deployments (sglang-sim pd): one incident, and the healthy deployment for its whole run.
# (pd-kv-transfer-bottleneck is not one: its "usual speed" is the median of the last hour, and a
# run this short has too little healthy history before the link collapses.)
PD_HOSTS = (("pd-circuit-open", 420), ("pd-healthy", 60))
SINGLE_CLUSTER = "e2e"  # every single server's cluster label: every host of a fleet carries one
# Seconds between this run and the recorded one: two runs start at different phases of the
# evaluation and of Alertmanager's group flushes, so they differ by up to one of each.
TOLERANCE = (detection.seconds(yaml.safe_load((ROOT / "alertmanager/alertmanager.yml")
                                              .read_text())["route"]["group_interval"])
             + detection.seconds(yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())
                                 ["global"]["evaluation_interval"]))


@dataclass
class Host:
    scenario: str
    start_at: float
    sim_port: int
    feed_port: int
    exporter_port: int
    procs: tuple = ()
    started_wall: float = 0.0  # wall time when the simulator was at `sim_started`
    sim_started: float = 0.0
    gateway_port: int = 0  # a PD deployment's: its gateway, and its engines' ports
    engine_ports: tuple = ()

    @property
    def pd(self) -> bool:
        return self.scenario in detection.pd_scenario.available()

    @property
    def cluster(self) -> str:
        """A PD deployment has a cluster label of its own: its pools are judged apart from the
        other deployment's."""
        return self.scenario if self.pd else SINGLE_CLUSTER

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.sim_port}"

    @property
    def instances(self) -> set[str]:
        return {f"127.0.0.1:{p}" for p in self.engine_ports} if self.pd else {self.instance}

    @property
    def exporter(self) -> str:
        return f"127.0.0.1:{self.exporter_port}"

    def wall(self, scenario_seconds: float) -> float:
        return self.started_wall + scenario_seconds - self.sim_started


def _prometheus_config(hosts: list[Host], am_port: int, prom_port: int) -> dict:
    config = yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())
    config["rule_files"] = [str(ROOT / "prometheus" / f) for f in config["rule_files"]]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{am_port}"]}]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    t = detection.rules.inputs()["selectors"]
    jobs[t["exporter_job"]]["static_configs"] = [
        {"targets": [h.exporter], "labels": {"cluster": h.cluster}} for h in hosts]
    sd = jobs[t["sglang_job"]]["http_sd_configs"]
    jobs[t["sglang_job"]]["http_sd_configs"] = [
        {**sd[0], "url": f"http://{h.exporter}/sd/sglang"} for h in hosts]
    jobs[t["sglang_job"]]["relabel_configs"] += [
        {"source_labels": ["__meta_url"], "regex": f"http://{h.exporter}/sd/sglang",
         "target_label": "cluster", "replacement": h.cluster} for h in hosts]
    gateway = jobs[t["gateway_job"]]
    del gateway["dns_sd_configs"]
    gateway["static_configs"] = [{"targets": [f"127.0.0.1:{h.gateway_port}"],
                                  "labels": {"cluster": h.cluster}} for h in hosts if h.pd]
    # Every target has a cluster label, or SGLangHostClusterLabelMissing reports the one without.
    jobs["prometheus"]["static_configs"] = [{"targets": [f"127.0.0.1:{prom_port}"],
                                             "labels": {"cluster": SINGLE_CLUSTER}}]
    jobs["alertmanager"]["static_configs"] = [{"targets": [f"127.0.0.1:{am_port}"],
                                               "labels": {"cluster": SINGLE_CLUSTER}}]
    return config


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


# What `sglang-sim pd` logs last at start, after its engines' lines (the gateway answers first).
GATEWAY_SERVING = "serving gateway of PD scenario"


class PortTaken(AssertionError):
    """The port picked for it was bound by another process before it could listen."""


def _ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    def answers():
        if proc.poll() is not None:
            text = log.read_text()
            raise (PortTaken if "address already in use" in text.lower() else AssertionError)(
                f"{log.name} exited: {text[-1500:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return False
    assert wait_for(answers, timeout, interval=0.2), f"{url} not ready: {log.read_text()[-800:]}"


def _listening(start, url, log: Path, timeout: float = 60, tries: int = 3) -> subprocess.Popen:
    """Starts `start()` (which picks fresh ports each call) until it listens: a port free when
    picked may be bound by another component (an engine's port 0) before this one binds it."""
    for attempt in range(tries):
        proc = start()
        try:
            _ready(url(), proc, log, timeout)
            return proc
        except PortTaken:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Starts everything, waits until the last scenario is AFTER_CLEAR past its last clear, and
    yields (hosts, the sink's entries)."""
    for binary in ("prometheus", "promtool", "amtool"):
        require_binary(binary)
    work = tmp_path_factory.mktemp("alert-timing")
    procs: list[subprocess.Popen] = []
    hosts: list[Host] = []
    try:
        sink_log = work / "alert-sink.log"
        sink_port = 0

        def start_sink():
            nonlocal sink_port
            sink_port = free_port()
            return _start([str(BIN / "sglang-obs"), "alert-sink", "--listen",
                           f"127.0.0.1:{sink_port}", "--log-file",
                           str(work / "alerts.jsonl")], sink_log)
        procs.append(_listening(start_sink, lambda: f"http://127.0.0.1:{sink_port}/", sink_log))
        hosts += [Host(name, at, 0, 0, 0) for name, at in HOSTS + PD_HOSTS]

        def start_sim(h: Host) -> subprocess.Popen:  # fresh ports at each start
            h.sim_port, h.feed_port = free_port(), free_port()
            log = work / f"sim-{h.scenario}.log"
            if h.pd:
                h.gateway_port = h.feed_port
                h.procs = (_start([str(BIN / "sglang-sim"), "pd", "--scenario", h.scenario,
                                   "--host", "127.0.0.1", "--port", "0", "--gateway-port",
                                   str(h.gateway_port), "--start-at", str(h.start_at)], log),)
            else:
                h.procs = (_start([str(BIN / "sglang-sim"), "serve", "--scenario", h.scenario,
                                   "--host", "127.0.0.1", "--port", str(h.sim_port),
                                   "--gpu-feed-port", str(h.feed_port), "--no-stdout-log",
                                   "--start-at", str(h.start_at)], log),)
            return h.procs[0]

        def sim_url(h: Host) -> str:
            return (f"http://127.0.0.1:{h.gateway_port}/metrics" if h.pd
                    else f"http://{h.instance}/health")
        for h in hosts:  # the simulators first, at once: each runs its model up to start_at
            start_sim(h)
        for h in hosts:
            log = work / f"sim-{h.scenario}.log"
            try:
                _ready(sim_url(h), h.procs[0], log, timeout=180 if h.pd else 120)
            except PortTaken:
                _listening(lambda h=h: start_sim(h), lambda h=h: sim_url(h), log, timeout=180)
            procs.append(h.procs[0])
            if h.pd:  # its engines' ports from its log, written just after the gateway answers
                assert wait_for(lambda log=log: GATEWAY_SERVING in log.read_text(), 30,
                                interval=0.1), \
                    log.read_text()[-800:]
                h.engine_ports = tuple(int(p) for p in re.findall(
                    r"serving (?:prefill|decode)-\d+ of PD scenario \S+ \(SGLang [^)]*\) on "
                    r"http://127\.0\.0\.1:(\d+)", log.read_text()))
                assert h.engine_ports, log.read_text()[-800:]
                h.sim_started, h.started_wall = h.start_at, time.time()
                continue
            with urllib.request.urlopen(f"http://{h.instance}/sim/state", timeout=5) as resp:
                h.sim_started, h.started_wall = json.load(resp)["sim_seconds"], time.time()
        for h in hosts:
            log = work / f"exporter-{h.scenario}.log"
            sources = ([arg for i in sorted(h.instances) for arg in ("--sglang.url", f"http://{i}")]
                       + ["--no-collector.nvml"] if h.pd else
                       ["--sglang.url", f"http://{h.instance}", "--collector.nvml.simulator-feed",
                        f"http://127.0.0.1:{h.feed_port}/sim/gpu"])

            def start_exporter(h=h, log=log, sources=sources):
                h.exporter_port = free_port()
                return _start([str(BIN / "sglang-exporter"), "--web.listen-address",
                               h.exporter, "--no-collector.docker", *sources], log)
            procs.append(_listening(start_exporter, lambda h=h: f"http://{h.exporter}/metrics",
                                    log))
        am_log, am_port = work / "alertmanager.log", 0
        (work / "alertmanager.yml").write_text(
            (ROOT / "alertmanager/alertmanager.yml").read_text().replace(
                "http://alert-sink:9095", f"http://127.0.0.1:{sink_port}"))

        def start_am():
            nonlocal am_port
            am_port = free_port()
            return _start([_which("prometheus-alertmanager", "alertmanager"),
                           f"--config.file={work / 'alertmanager.yml'}",
                           f"--storage.path={work / 'am-data'}",
                           f"--web.listen-address=127.0.0.1:{am_port}",
                           "--cluster.listen-address="], am_log)
        procs.append(_listening(start_am, lambda: f"http://127.0.0.1:{am_port}/-/ready", am_log))
        prom_log, prom_port = work / "prometheus.log", 0

        def start_prometheus():
            nonlocal prom_port
            prom_port = free_port()
            (work / "prometheus.yml").write_text(yaml.safe_dump(
                _prometheus_config(hosts, am_port, prom_port), sort_keys=False))
            return _start([_which("prometheus"), f"--config.file={work / 'prometheus.yml'}",
                           f"--storage.tsdb.path={work / 'prom-data'}",
                           f"--web.listen-address=127.0.0.1:{prom_port}"], prom_log)
        procs.append(_listening(start_prometheus,
                                lambda: f"http://127.0.0.1:{prom_port}/-/ready", prom_log))

        def last_clear(h: Host) -> float:
            sc = detection.load_scenario(h.scenario)
            ends = [t.end for t in sc.truth
                    if t.cls in detection.CLASS_ALERT and t.end < sc.duration]
            return h.wall(max(ends)) if ends else 0.0
        until = max(max(last_clear(h) for h in hosts),
                    max(h.wall(max(t.start for t in detection.load_scenario(h.scenario).truth))
                        for h in hosts) + 2 * detection.NOTIFY_WITHIN_SECONDS) + AFTER_CLEAR
        while time.time() < until:
            for p in procs:
                assert p.poll() is None, f"a component exited: {p.args[:2]}"
            time.sleep(5)
        entries = [json.loads(line) for line in (work / "alerts.jsonl").read_text().splitlines()]
        yield hosts, entries, until
    finally:
        for p in reversed(procs + [p for h in hosts for p in h.procs if p not in procs]):
            stop_process(p)


INCIDENT_GAP = 120  # fault windows closer than this are one incident (a class change)
COUNT_AFTER = 180  # notifications up to this long after an incident's last clear are its own


def incidents(truth: list) -> list[list]:
    """The scenario's fault windows grouped into incidents."""
    out: list[list] = []
    for t in sorted(truth, key=lambda w: w.start):
        if out and t.start - out[-1][-1].end <= INCIDENT_GAP:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def measure(h: Host, entries: list[dict], watched_until: float) -> list[dict]:
    """One row per fault window of the host's scenario (one row for a quiet scenario). The
    notification counts are per incident, over its span."""
    mine = [e for e in entries if e["labels"].get("alertname") != "Watchdog"
            and (e["labels"].get("instance") in h.instances | {h.exporter}
                 or e["labels"].get("host") == h.exporter
                 or h.pd and e["labels"].get("cluster") == h.cluster)]
    sc = detection.load_scenario(h.scenario)

    def counts(since: float, until: float) -> dict:
        """Deliveries that bring news (an alert firing that the group's previous delivery did
        not have firing) and deliveries that only resolve something: "resolved" of the group,
        or an update where one of its alerts resolved while the others still fire."""
        span = [e for e in mine if since <= e["time"] <= until]
        news, resolves = set(), set()
        for group in {e["group"] for e in span}:
            before: set[str] = set()
            for number in sorted({e["notification"] for e in mine if e["group"] == group}):
                delivery = [e for e in mine if e["notification"] == number]
                now = {e["labels"]["alertname"] for e in delivery if e["status"] == "firing"}
                if any(since <= e["time"] <= until for e in delivery):
                    if now - before:
                        news.add(number)
                    elif any(e["status"] == "resolved" for e in delivery):
                        resolves.add(number)
                before = now
        return {"notifications": len(news), "resolved": len(resolves),
                "groups": len({e["group"] for e in span}),
                "alerts": sorted({e["labels"]["alertname"] for e in span})}

    windows = [t for t in sc.truth if t.cls in detection.CLASS_ALERT]
    if not windows:
        return [{"scenario": h.scenario, "class": "quiet", "expected": None,
                 **counts(0, float("inf"))}]
    rows = []
    for incident in incidents(windows):
        span = counts(h.wall(incident[0].start) - 60,
                      min(h.wall(incident[-1].end) + COUNT_AFTER, watched_until))
        for i, t in enumerate(incident):
            alert = detection.CLASS_ALERT[t.cls]
            onset, clear = h.wall(t.start), h.wall(t.end)
            following = h.wall(incident[i + 1].start) if i + 1 < len(incident) else float("inf")
            first = min((e["time"] for e in mine if e["labels"]["alertname"] == alert
                         and e["status"] == "firing" and onset - 60 <= e["time"] < following),
                        default=None)
            done = None
            if t.end < sc.duration:
                done = min((e["time"] for e in mine if e["labels"]["alertname"] == alert
                            and e["status"] == "resolved" and e["time"] >= clear), default=None)
            said = next((e["annotations"].get("description", "") for e in sorted(
                mine, key=lambda e: e["time"]) if e["labels"]["alertname"] == alert
                and e["status"] == "firing" and e["time"] == first), None)
            rows.append({"scenario": h.scenario, "class": t.cls, "expected": alert,
                         "incident": f"{incident[0].start:.0f}-{incident[-1].end:.0f}",
                         "phase": i + 1, "onset": t.start,
                         "clear": t.end if t.end < sc.duration else None,
                         "onset_to_notification": None if first is None else round(first - onset),
                         "clear_to_resolved": None if done is None else round(done - clear),
                         **({"cause_named": CAUSES[h.scenario] in (said or "")}
                            if h.scenario in CAUSES else {}),
                         **span})
    return rows


def test_alert_timing_end_to_end(run):
    hosts, entries, watched_until = run
    rows = [row for h in hosts for row in measure(h, entries, watched_until)]
    problems = []
    for row in rows:
        if row["expected"] is None:
            if row["notifications"]:
                problems.append(f"{row['scenario']}: {row['notifications']} notifications on a "
                                f"quiet scenario ({row['alerts']})")
            continue
        onset = row["onset_to_notification"]
        if onset is None or onset > detection.NOTIFY_WITHIN_SECONDS:
            problems.append(f"{row['scenario']} {row['class']}: first notification {onset} s")
        if row["clear"] is not None and (row["clear_to_resolved"] is None or
                                         row["clear_to_resolved"]
                                         > detection.RESOLVE_WITHIN_SECONDS):
            problems.append(f"{row['scenario']} {row['class']}: resolved "
                            f"{row['clear_to_resolved']} s after the clear")
        if row.get("cause_named") is False and row["scenario"] not in CAUSE_RECORDED_ONLY:
            problems.append(f"{row['scenario']} {row['class']}: the first notification does "
                            f"not name its cause ({CAUSES[row['scenario']]!r})")
        # One group per incident. Its notifications: the first, one update per declared class
        # change, and at most one more when the classification sees another saturation state
        # on the way in (KV exhaustion's growing batch is decode contention for a while before
        # the pool is full): reported in docs/detection.md, never more.
        phases = sum(1 for r in rows if r["scenario"] == row["scenario"]
                     and r.get("incident") == row["incident"])
        if row["notifications"] > phases + 1 or row["groups"] != 1:
            problems.append(f"{row['scenario']} incident {row['incident']}: "
                            f"{row['notifications']} notifications in {row['groups']} groups "
                            f"for {phases} phases ({row['alerts']})")
    record = {
        "command": "SGLANG_OBS_RECORD_E2E=1 pytest tests/test_alert_timing.py",
        "date": datetime.date.today().isoformat(),
        "setup": (f"{len(hosts)} simulated hosts, Prometheus "
                  f"{_version('prometheus')}, Alertmanager "
                  f"{_version(_which('prometheus-alertmanager', 'alertmanager'))}, "
                  "prometheus.yml and alertmanager.yml as shipped."),
        "scenarios": rows,
    }
    out = Path(os.environ.get("SGLANG_OBS_E2E_OUT", "")) if os.environ.get(
        "SGLANG_OBS_E2E_OUT") else None
    if out:
        out.write_text(json.dumps(record, indent=1) + "\n")
    if os.environ.get("SGLANG_OBS_RECORD_E2E") == "1":
        (S.docs_dir / detection.E2E_RESULTS).write_text(json.dumps(record, indent=1) + "\n")
    assert not problems, "\n".join(problems) + "\n" + json.dumps(rows, indent=1)
    recorded = detection.load_e2e(S.docs_dir / detection.E2E_RESULTS)
    assert recorded, "docs/detection-e2e.json missing: run with SGLANG_OBS_RECORD_E2E=1"
    drift = []
    for old, new in zip(recorded["scenarios"], rows, strict=True):
        for key in ("scenario", "class"):
            if old[key] != new[key]:
                drift.append(f"{new['scenario']} {new['class']}: {key} {old[key]} -> {new[key]}")
        for key in ("notifications", "resolved"):  # an extra update may come or not
            if abs(old[key] - new[key]) > 1:
                drift.append(f"{new['scenario']} {new['class']}: {key} {old[key]} -> {new[key]}")
        for key in ("onset_to_notification", "clear_to_resolved"):
            if (old.get(key) is None) != (new.get(key) is None) or (
                    old.get(key) is not None and abs(old[key] - new[key]) > TOLERANCE):
                drift.append(f"{new['scenario']} {new['class']}: {key} {old.get(key)} -> "
                             f"{new.get(key)}")
    assert not drift, "docs/detection.md quotes another run (rerun with SGLANG_OBS_RECORD_E2E=1 "\
        "and make generate):\n" + "\n".join(drift)


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    out = out or subprocess.run([binary, "--version"], capture_output=True, text=True).stderr
    return out.split("version ", 1)[-1].split()[0] if "version " in out else "?"
