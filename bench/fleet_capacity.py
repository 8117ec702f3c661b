"""What one inference host costs the fleet's central store, from the store's own accounting.

Two host shapes, each shipping into a VictoriaMetrics of its own (so the store's counters are that
host's alone), for --minutes (60 by default):

  tp8  8 GPUs, one TP8 SGLang server
  dp1  8 GPUs, eight DP1 SGLang servers (one per GPU)

Each host is what a fleet host runs: simulated SGLang (`sglang-sim serve`, the healthy scenario
with the shape's TP size, release 0.5.23), the real `sglang-exporter` on the 8-GPU H200 machine
of simulator/fake_nvml.py (every NVML field supported, as bench/series_count.py counts; the readings
drift a little every sampling cycle so that they compress like live ones), and vmagent with the
generated shipper configuration (prometheus/fleet/vmagent.yml: the jobs of prometheus.yml at
their default intervals, 15 s SGLang and 5 s exporter, plus the shipper's own metrics).

Read from each store: active series (/api/v1/status/tsdb totalSeries and a count query),
samples/s (vm_rows_inserted_total over the window), bytes on disk (vm_data_size_bytes, data and
indexdb) per stored row (vm_rows) at the end; vmagent's and the exporter's RSS from /proc over
the window. Results: JSON to --out (default bench/results/fleet_capacity.json), rewritten every
--report-every seconds so a run cut short still leaves figures.

Run: .venv/bin/python bench/fleet_capacity.py [--minutes 60] [--out FILE] [--shapes tp8,dp1]
     .venv/bin/python bench/fleet_capacity.py --report bench/results/fleet_capacity.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

from sglang_obs.core.settings import default as _settings  # noqa: E402
from sglang_obs.core.sglang import EXPORTER_ADDRESS  # noqa: E402
from sglang_obs.render import shipper  # noqa: E402

SHAPES = {"tp8": [8], "dp1": [1] * 8}

# The exporter on the fake 8 x H200 machine: simulator/fake_nvml.py stands in for pynvml.
EXPORTER_WRAPPER = r"""
import random, sys, threading, time
sys.path.insert(0, sys.argv[1])
from sglang_obs.simulator import fake_nvml
from sglang_obs.exporter import cli
machine = fake_nvml.h200_machine()
def drift():
    while True:
        time.sleep(5)
        for gpu in machine.gpus:
            if gpu.utilization[0]:
                gpu.utilization = (random.randint(60, 99), random.randint(30, 60))
                gpu.power_mw = random.randint(400_000, 690_000)
            gpu.energy_mj += gpu.power_mw * 5
            gpu.temperature_c = 40 + random.randint(0, 12)
threading.Thread(target=drift, daemon=True).start()
original = cli.NvmlBackend
cli.NvmlBackend = lambda nvml=None, processes=False: original(machine, processes=processes)
sys.exit(cli.main(sys.argv[2:]))
"""



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name} exited: {log.read_text()[-1500:]}")
        try:
            get(url, 1)
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} not ready: {log.read_text()[-800:]}")


def metrics(url: str) -> dict[str, float]:
    """Flat name{labels} -> value of a /metrics page."""
    out = {}
    for line in get(url).decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


def total(m: dict[str, float], prefix: str, contains: str = "") -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix) and contains in k)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Host:
    def __init__(self, shape: str, work: Path):
        self.shape, self.work, self.procs = shape, work / shape, []
        self.work.mkdir(parents=True)
        self.vm_port, self.agent_port, self.exporter_port = free_port(), free_port(), free_port()
        self.rss: dict[str, list[int]] = {"vmagent": [], "exporter": [], "victoria-metrics": []}

    def start(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = self.work / f"{name}.log"
        proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
        self.procs.append((name, proc, log))
        return proc

    def up(self) -> None:
        vm = self.start("victoria-metrics", [
            "victoria-metrics", f"-storageDataPath={self.work / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{self.vm_port}", "-retentionPeriod=1d"])
        wait_ready(f"http://127.0.0.1:{self.vm_port}/health", vm,
                   self.work / "victoria-metrics.log")
        healthy = yaml.safe_load((ROOT / "simulator/scenarios/healthy.yaml").read_text())
        urls = []
        for i, tp in enumerate(SHAPES[self.shape]):
            scenario = dict(healthy, name=f"healthy-tp{tp}")
            scenario["server"] = dict(healthy["server"], tp_size=tp,
                                      max_total_num_tokens=300000 * tp)
            path = self.work / f"scenario-{i}.yaml"
            path.write_text(yaml.safe_dump(scenario))
            port = free_port()
            proc = self.start(f"sim-{i}", [str(BIN / "sglang-sim"), "serve", "--scenario",
                                           str(path), "--port", str(port), "--no-stdout-log",
                                           "--start-at", str(60 + 97 * i)])
            urls.append((f"http://127.0.0.1:{port}", proc, self.work / f"sim-{i}.log"))
        for url, proc, log in urls:
            wait_ready(url + "/health", proc, log)
        cmd = [sys.executable, "-c", EXPORTER_WRAPPER, str(ROOT / "tests"),
               "--web.listen-address", f"127.0.0.1:{self.exporter_port}", "--no-collector.docker"]
        for url, _, _ in urls:
            cmd += ["--sglang.url", url]
        self.exporter = self.start("exporter", cmd)
        wait_ready(f"http://127.0.0.1:{self.exporter_port}/metrics", self.exporter,
                   self.work / "exporter.log")
        text = (_settings().root / shipper.VMAGENT_YML).read_text()
        for old, new in ((EXPORTER_ADDRESS, f"127.0.0.1:{self.exporter_port}"),
                         (shipper.VMAGENT_ADDRESS, f"127.0.0.1:{self.agent_port}")):
            text = text.replace(old, new)
        (self.work / "vmagent.yml").write_text(text)
        self.vmagent = self.start("vmagent", ["vmagent", *shipper.vmagent_command(
            str(self.work / "vmagent.yml"), f"http://127.0.0.1:{self.vm_port}/api/v1/write",
            str(self.work / "vmagent-buffer"), f"127.0.0.1:{self.agent_port}")],
            env={shipper.CLUSTER_ENV: "bench", shipper.HOST_ENV: self.shape})
        wait_ready(f"http://127.0.0.1:{self.agent_port}/metrics", self.vmagent,
                   self.work / "vmagent.log")
        self.vm = vm

    def check(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.shape} {name} exited: {log.read_text()[-1000:]}")

    def sample_rss(self) -> None:
        for name, proc in (("vmagent", self.vmagent), ("exporter", self.exporter),
                           ("victoria-metrics", self.vm)):
            self.rss[name].append(rss_bytes(proc.pid))

    def store(self) -> dict[str, float]:
        m = metrics(f"http://127.0.0.1:{self.vm_port}/metrics")
        return {"rows_inserted": total(m, "vm_rows_inserted_total"),
                "data_bytes": total(m, "vm_data_size_bytes"),
                "data_bytes_storage": total(m, "vm_data_size_bytes", 'type="storage/'),
                "data_bytes_indexdb": total(m, "vm_data_size_bytes", 'type="indexdb'),
                "rows_stored": total(m, "vm_rows{", 'type="storage/')}

    def query(self, expr: str) -> list[dict]:
        url = (f"http://127.0.0.1:{self.vm_port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        return json.loads(get(url))["data"]["result"]

    def tsdb_status(self) -> dict:
        return json.loads(get(f"http://127.0.0.1:{self.vm_port}/api/v1/status/tsdb?topN=20"))

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def summary(host: Host, first: dict, first_t: float, last: dict, last_t: float) -> dict:
    status = host.tsdb_status().get("data", {})
    per_job = {r["metric"].get("job", ""): int(float(r["value"][1]))
               for r in host.query('count by (job) ({__name__=~".+"})')}
    window = last_t - first_t
    rows = last["rows_inserted"] - first["rows_inserted"]
    mib = 1024 * 1024
    agent = host.rss["vmagent"]
    return {
        "shape": host.shape, "window_seconds": round(window),
        "active_series": sum(per_job.values()), "series_by_job": per_job,
        "tsdb_total_series": status.get("totalSeries"),
        "top_metrics": status.get("seriesCountByMetricName", [])[:10],
        "samples_per_second": round(rows / window, 2) if window else None,
        "rows_inserted": last["rows_inserted"], "rows_stored": last["rows_stored"],
        "data_bytes": last["data_bytes"], "data_bytes_storage": last["data_bytes_storage"],
        "data_bytes_indexdb": last["data_bytes_indexdb"],
        "bytes_per_sample": (round(last["data_bytes"] / last["rows_inserted"], 3)
                             if last["rows_inserted"] else None),
        "bytes_per_sample_data_only": (round(last["data_bytes_storage"] / last["rows_inserted"], 3)
                                       if last["rows_inserted"] else None),
        "vmagent_rss_mib": {"max": round(max(agent) / mib, 1), "last": round(agent[-1] / mib, 1),
                            "median": round(sorted(agent)[len(agent) // 2] / mib, 1)},
        "exporter_rss_mib_max": round(max(host.rss["exporter"]) / mib, 1),
        "victoria_metrics_rss_mib_max": round(max(host.rss["victoria-metrics"]) / mib, 1),
    }


# dcgm-exporter's default counter set, for comparison: etc/default-counters.csv of
# github.com/NVIDIA/dcgm-exporter at d5e5f510a1b6 (2026-05-12) lists 25 fields of type gauge or
# counter (and DCGM_FI_DRIVER_VERSION as a label), one series per GPU each; it collects every
# 30 s (-c 30000) and its Helm chart's ServiceMonitor scrapes every 15 s.
DCGM_DEFAULT_FIELDS = 25
DCGM_SCRAPE_SECONDS = 15
GPUS_PER_HOST = 8
FLEETS = (1, 100, 1000)


def extrapolate(host: dict, hosts: int) -> dict:
    """A fleet of `hosts` hosts of this shape: series, samples/s, bytes a day on disk (at the
    measured bytes per sample), and the fleet's vmagent memory (one per host)."""
    per_day = host["samples_per_second"] * 86400
    return {"hosts": hosts, "series": host["active_series"] * hosts,
            "samples_per_second": round(host["samples_per_second"] * hosts, 1),
            "gib_per_day": round(per_day * host["bytes_per_sample"] * hosts / 2 ** 30, 3),
            "vmagent_rss_gib": round(host["vmagent_rss_mib"]["max"] * hosts / 1024, 2)}


def doc_block(doc: dict) -> str:
    """docs/performance.md's fleet-capacity tables, from a results file."""
    hosts = {h["shape"]: h for h in doc["hosts"]}
    shapes = list(hosts)
    head = " | ".join(shapes)

    def row(what: str, cell) -> str:
        return f"| {what} | " + " | ".join(cell(hosts[s]) for s in shapes) + " |"

    lines = [f"Measured by `bench/fleet_capacity.py --minutes {doc['minutes_planned']:g}` from "
             f"{doc['started']} to {doc['updated']} (VictoriaMetrics "
             f"{doc['versions']['victoria-metrics']}; 1-minute load average "
             f"{doc['load_average'][0]:.1f} at the end), over "
             + " and ".join(f"{h['window_seconds']:,} s ({s})" for s, h in hosts.items()) + ":",
             "", f"| per host | {head} |", "|---|" + "---|" * len(shapes),
             row("active series (count by job)", lambda h: f"**{h['active_series']:,}**")]
    for job in sorted({j for h in doc["hosts"] for j in h["series_by_job"]}):
        lines.append(row(f"… job `{job}`", lambda h, j=job: f"{h['series_by_job'].get(j, 0):,}"))
    lines += [
        row("samples/s (`vm_rows_inserted_total` over the window)",
            lambda h: f"**{h['samples_per_second']:,.1f}**"),
        row("bytes on disk per sample (data + indexdb, data only)",
            lambda h: f"**{h['bytes_per_sample']:.2f}** ({h['bytes_per_sample_data_only']:.2f})"),
        row("storage per day at that rate",
            lambda h: f"{h['samples_per_second'] * 86400 * h['bytes_per_sample'] / 1e6:.1f} MB"),
        row("vmagent RSS, max / median",
            lambda h: f"**{h['vmagent_rss_mib']['max']:.1f} / "
                      f"{h['vmagent_rss_mib']['median']:.1f} MiB**"),
        row("exporter RSS, max", lambda h: f"{h['exporter_rss_mib_max']:.1f} MiB"),
        row("the store's RSS, max (one host)",
            lambda h: f"{h['victoria_metrics_rss_mib_max']:.1f} MiB"),
        "", "Extrapolated linearly (one vmagent per host):", "",
        "| shape | hosts | active series | samples/s | storage/day | vmagent RSS, all hosts |",
        "|---|---|---|---|---|---|"]
    for host in doc["hosts"]:
        for n in FLEETS:
            e = extrapolate(host, n)
            lines.append(f"| {host['shape']} | {n:,} | {e['series']:,} | "
                         f"{e['samples_per_second']:,} | {e['gib_per_day']:,} GiB | "
                         f"{e['vmagent_rss_gib']:,} GiB |")
    dcgm = DCGM_DEFAULT_FIELDS * GPUS_PER_HOST
    bps = min(h["bytes_per_sample"] for h in doc["hosts"])
    lines += ["", f"dcgm-exporter's default set beside it ({DCGM_DEFAULT_FIELDS} fields per GPU, "
              f"scraped every {DCGM_SCRAPE_SECONDS} s, at the lowest measured {bps:.2f} "
              "bytes/sample):", "",
              "| dcgm-exporter default set | hosts | series | samples/s | storage/day |",
              "|---|---|---|---|---|"]
    for n in FLEETS:
        rate = dcgm / DCGM_SCRAPE_SECONDS * n
        lines.append(f"| {DCGM_DEFAULT_FIELDS} fields × {GPUS_PER_HOST} GPUs | {n:,} | "
                     f"{dcgm * n:,} | {rate:,.1f} | "
                     f"{rate * 86400 * bps / 2 ** 30:,.3f} GiB |")
    sglang = {s: h["series_by_job"].get("sglang", 0) / h["active_series"] for s, h in hosts.items()}
    lines += ["", "Most of a host's cost is SGLang's own /metrics: "
              + ", ".join(f"{share:.0%} of the {s} host's series" for s, share in sglang.items())
              + " (histograms per server)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", metavar="FILE",
                        help="print the tables of a results file and exit")
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=120, help="seconds before the window")
    parser.add_argument("--shapes", default="tp8,dp1")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fleet_capacity.json"))
    parser.add_argument("--report-every", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    args = parser.parse_args()
    if args.report:
        print(doc_block(json.loads(Path(args.report).read_text())))
        return
    for binary in ("victoria-metrics", "vmagent"):
        if not shutil.which(binary):
            sys.exit(f"{binary} not installed (apt-get install victoria-metrics)")
    random.seed(0)
    work = Path(tempfile.mkdtemp(prefix="fleet-capacity-"))
    hosts = [Host(shape, work) for shape in args.shapes.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        for h in hosts:
            h.up()
        print(f"up: {work}", flush=True)
        time.sleep(args.warmup)
        first = {h.shape: (h.store(), time.time()) for h in hosts}
        end = time.time() + args.minutes * 60
        next_report = time.time() + args.report_every
        while True:
            for h in hosts:
                h.check()
                h.sample_rss()
            now = time.time()
            if now >= next_report or now >= end:
                results = [summary(h, *first[h.shape], h.store(), time.time()) for h in hosts]
                doc = {"started": started, "minutes_planned": args.minutes,
                       "finished": now >= end,
                       "updated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                       "load_average": os.getloadavg(),
                       "versions": {"victoria-metrics": _version("victoria-metrics")},
                       "hosts": results}
                Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
                print(json.dumps({r["shape"]: (r["active_series"], r["samples_per_second"],
                                               r["bytes_per_sample"]) for r in results}),
                      flush=True)
                next_report = now + args.report_every
                if now >= end:
                    break
            time.sleep(10)
    finally:
        for h in hosts:
            h.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _version(package: str) -> str:
    """The Debian package's version (vmagent and victoria-metrics 1.79 print none)."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                         text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    threading.current_thread().name = "fleet-capacity"
    main()
