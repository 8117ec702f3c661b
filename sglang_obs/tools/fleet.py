"""`sglang-obs fleet up N` (`sglang-obs stack up --native --fleet N`): a fleet without Docker.

N simulated inference hosts, each what docker-compose.fleet.yml runs on a real one — a simulated
SGLang with its GPU feed, the exporter, and vmagent with the shipper configuration generated from
prometheus.yml (prometheus/fleet/vmagent.yml) — spread over clusters, and the central side of
docker-compose.central.yml: VictoriaMetrics (the store), vmalert with prometheus/rules-vmalert/
(the project's rules), Alertmanager with alertmanager/alertmanager.yml, and the alert sink.
Only addresses are rewritten (compose service names become 127.0.0.1 ports), as in stack.py.

Needs `apt-get install victoria-metrics prometheus-alertmanager` (vmagent and vmalert come with
victoria-metrics). `--demo` makes the first host replay the long-context incident; the others
serve the healthy scenario.

Also `sglang-obs fleet shipper-config` prints a host's shipper configuration (vmagent or
Prometheus agent mode) and `sglang-obs fleet shipper-flags` vmagent's flags.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_obs.core.cli_support import UsageError, folder
from sglang_obs.core.settings import Settings, default
from sglang_obs.core.sglang import EXPORTER_ADDRESS
from sglang_obs.render import shipper
from sglang_obs.tools.stack import BIN, Component, NativeStack, StackError, _which, pids

INCIDENT = "long-context-incident"
QUIET = "healthy"
# Central-store settings for the demo and the tests: queries see samples 5 s after they arrive
# (VictoriaMetrics' default is 30 s, which delays every alert by as much).
STORE_LATENCY_OFFSET = "5s"


@dataclass
class FleetHost:
    name: str
    cluster: str
    scenario: str
    start_at: float
    sim_port: int = 0
    feed_port: int = 0
    exporter_port: int = 0
    agent_port: int = 0

    @property
    def instance(self) -> str:
        """The SGLang server's address: its `instance` in the store."""
        return f"127.0.0.1:{self.sim_port}"


@dataclass
class Fleet:
    """The processes of a fleet, started and stopped through stack.NativeStack."""

    workdir: Path
    hosts: list[FleetHost] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    stack: NativeStack | None = None
    settings: Settings = field(default_factory=default)  # whose configuration files it runs

    @classmethod
    def simulated(cls, workdir: Path, count: int, clusters: int = 2, demo: bool = False,
                  incident_start_at: float = 0.0, s: Settings | None = None) -> Fleet:
        names = [chr(ord("a") + i) for i in range(clusters)]
        hosts = [FleetHost(f"host-{i + 1}", f"cluster-{names[i % clusters]}",
                           INCIDENT if demo and i == 0 else QUIET,
                           incident_start_at if demo and i == 0 else 60.0)
                 for i in range(count)]
        return cls(workdir, hosts, settings=s or default())

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def write_url(self) -> str:
        return self.url("victoria-metrics") + "/api/v1/write"

    def prepare(self) -> None:
        w = self.workdir
        w.mkdir(parents=True, exist_ok=True)
        ports = iter(free_ports(4 + 4 * len(self.hosts)))
        for name in ("alert-sink", "alertmanager", "victoria-metrics", "vmalert"):
            self.ports[name] = next(ports)
        vmagent = _which("vmagent")
        comps = [Component("alert-sink", [
            str(BIN / "sglang-obs"), "alert-sink", "--listen",
            f"127.0.0.1:{self.ports['alert-sink']}", "--log-file", str(w / "alerts.jsonl")],
            self.url("alert-sink") + "/", self.ports["alert-sink"])]
        am_config = self.settings.alertmanager_file.read_text().replace(
            "http://alert-sink:9095", self.url("alert-sink"))
        (w / "alertmanager.yml").write_text(am_config)
        comps.append(Component("alertmanager", [
            _which("prometheus-alertmanager", "alertmanager"),
            f"--config.file={w / 'alertmanager.yml'}", f"--storage.path={w / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.ports['alertmanager']}",
            "--cluster.listen-address="], self.url("alertmanager") + "/-/ready",
            self.ports["alertmanager"]))
        comps.append(self.store_component())
        comps.append(Component("vmalert", [
            _which("vmalert"), *vmalert_args(
                self.url("victoria-metrics"), self.url("alertmanager"),
                f"127.0.0.1:{self.ports['vmalert']}", self.settings)],
            self.url("vmalert") + "/health", self.ports["vmalert"]))
        prom = dict(self.settings.prometheus)
        for h in self.hosts:
            h.sim_port, h.feed_port, h.exporter_port, h.agent_port = (
                next(ports) for _ in range(4))
            comps.append(Component(f"sim-{h.name}", [
                str(BIN / "sglang-sim"), "serve", "--scenario", h.scenario, "--host",
                "127.0.0.1", "--port", str(h.sim_port), "--gpu-feed-port", str(h.feed_port),
                "--no-stdout-log", "--start-at", str(h.start_at)],
                f"http://{h.instance}/health", h.sim_port))
            comps.append(Component(f"exporter-{h.name}", [
                str(BIN / "sglang-exporter"), "--web.listen-address",
                f"127.0.0.1:{h.exporter_port}", "--no-collector.docker", "--sglang.url",
                f"http://{h.instance}", "--collector.nvml.simulator-feed",
                f"http://127.0.0.1:{h.feed_port}/sim/gpu"],
                f"http://127.0.0.1:{h.exporter_port}/metrics", h.exporter_port))
            config = w / f"vmagent-{h.name}.yml"
            config.write_text(yaml.safe_dump(shipper.shipper_config(
                _rewrite(prom, h), h.cluster, h.name, f"127.0.0.1:{h.agent_port}"),
                sort_keys=False))
            comps.append(Component(f"vmagent-{h.name}", [vmagent, *shipper.vmagent_command(
                str(config), self.write_url(), str(w / f"vmagent-{h.name}-buffer"),
                f"127.0.0.1:{h.agent_port}", prom)],
                f"http://127.0.0.1:{h.agent_port}/health", h.agent_port))
        self.stack = NativeStack(w, settings=self.settings)
        self.stack.components = comps

    def store_component(self) -> Component:
        w = self.workdir
        scrape = w / "central-scrape.yml"
        prom = dict(self.settings.prometheus)
        scrape.write_text(yaml.safe_dump(shipper.central_scrape_config(
            prom, {name: f"127.0.0.1:{self.ports[name]}"
                   for name in ("victoria-metrics", "vmalert", "alertmanager")}),
            sort_keys=False))
        return Component("victoria-metrics", [
            _which("victoria-metrics"), f"-storageDataPath={w / 'victoria-metrics-data'}",
            f"-httpListenAddr=127.0.0.1:{self.ports['victoria-metrics']}",
            "-retentionPeriod=7d", f"-search.latencyOffset={STORE_LATENCY_OFFSET}",
            f"-promscrape.config={scrape}", *shipper.store_flags(prom)],
            self.url("victoria-metrics") + "/health", self.ports["victoria-metrics"])

    def start(self, timeout: float = 120.0, tries: int = 3) -> None:
        """Start every part; a part whose port another program bound between picking and
        binding (free_ports releases them before the parts start) starts the fleet again on
        fresh ports."""
        assert self.stack is not None, "prepare() first"
        for attempt in range(tries):
            try:
                self.stack.start(timeout)
                return
            except StackError as err:
                if not err.port_taken or attempt == tries - 1:
                    raise
                self.stack.stop()
                self.prepare()

    def component(self, name: str) -> Component:
        assert self.stack is not None
        return next(c for c in self.stack.components if c.name == name)

    def stop_component(self, name: str) -> None:
        assert self.stack is not None
        self.stack.stop_component(name)

    def restart_component(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped component again with the same command, data and port."""
        c = self.component(name)
        assert c.proc is None or c.proc.poll() is not None, f"{name} still runs"
        with (c.log or self.workdir / f"{name}.log").open("a") as log:
            c.proc = subprocess.Popen(c.cmd, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if c.proc.poll() is not None:
                raise StackError(f"{name} exited on restart")
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(c.ready_url, timeout=1).status == 200:
                    return
            time.sleep(0.2)
        raise StackError(f"{name} not ready after {timeout:.0f}s")

    def stop(self) -> None:
        if self.stack:
            self.stack.stop()


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on: all bound at once, then released, so
    that no two components of the fleet are handed the same one."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _rewrite(prom: dict, h: FleetHost) -> dict:
    """prometheus.yml with the compose addresses of this host's exporter rewritten."""
    text = yaml.safe_dump(prom, sort_keys=False).replace(
        EXPORTER_ADDRESS, f"127.0.0.1:{h.exporter_port}")
    return yaml.safe_load(text)


def vmalert_args(store: str, alertmanager: str, listen: str, s: Settings) -> list[str]:
    """vmalert over the central store: the rules' vmalert variant (one group, so that each rule
    reads the records of the evaluation before, whatever phase vmalert gives the group: docs/
    fleet.md), results written back (recording rules and ALERTS), alert state restored from the
    store after a restart. Its queries ask for the evaluation's own time, not the interval's
    start (-datasource.queryTimeAlignment=false): aligned, a group whose phase is late in the
    interval answers as of up to one interval before it runs. Its queries look back
    one evaluation interval (-datasource.queryStep; vmalert's default is 5m): a host that stopped
    shipping leaves no staleness marker, so with 5 minutes its last values would keep its state
    "healthy" for 5 minutes; with one interval its series end within about two scrapes. Alerts
    sent to Alertmanager end 4 x the resend delay later unless sent again (-rule.resendDelay 1m,
    Prometheus's default): a store outage under 4 minutes does not resolve a page. The interval
    is prometheus.yml's evaluation_interval, the rules' of one host."""
    interval = s.evaluation_interval
    return [f"-rule={s.vmalert_rules_dir}/*.yml", f"-datasource.url={store}",
            f"-datasource.queryStep={interval}", "-datasource.queryTimeAlignment=false",
            "-rule.resendDelay=1m",
            f"-remoteWrite.url={store}", f"-remoteRead.url={store}",
            f"-notifier.url={alertmanager}", f"-evaluationInterval={interval}",
            f"-httpListenAddr={listen}"]


def up(args, s: Settings) -> int:
    clusters = args.clusters or min(2, args.fleet)
    if clusters > args.fleet:  # a cluster without a host would ship nothing
        hosts = f"{args.fleet} host{'s' if args.fleet > 1 else ''}"
        raise UsageError(f"--clusters {clusters}: more clusters than the fleet's {hosts}; "
                         f"give at most {args.fleet}")
    if args.dir:
        workdir = folder("--dir", Path(args.dir))
    else:
        workdir = Path(tempfile.mkdtemp(prefix="sglang-fleet-"))
    # `fleet up --demo` is a flag; `stack up --native --fleet N --demo` a list (maybe empty).
    demo = args.demo if isinstance(args.demo, bool) else args.demo is not None
    fleet = Fleet.simulated(workdir, args.fleet, clusters=clusters, demo=demo, s=s)
    stop = False

    def handler(*_):
        nonlocal stop
        stop = True

    # From the first start on: a SIGTERM that came before the loop stops the parts too.
    signal.signal(signal.SIGTERM, handler)
    try:
        fleet.prepare()
        fleet.start()
    except (StackError, OSError) as err:
        fleet.stop()
        print(f"sglang-obs fleet: {err}", file=sys.stderr)
        return 1
    print(f"VictoriaMetrics {fleet.url('victoria-metrics')} (Prometheus API: Grafana's "
          f"datasource)\nvmalert         {fleet.url('vmalert')}\n"
          f"Alertmanager    {fleet.url('alertmanager')}\nAlerts log      "
          f"{workdir / 'alerts.jsonl'}\nLogs            {workdir}", flush=True)
    for h in fleet.hosts:
        print(f"  {h.cluster}/{h.name}: {h.scenario}, SGLang {h.instance}, exporter "
              f"127.0.0.1:{h.exporter_port}, vmagent 127.0.0.1:{h.agent_port}", flush=True)
    print(f"PIDs            {pids(fleet.stack)}\n"
          f"Ctrl-C stops everything (or kill {os.getpid()}).", flush=True)
    try:
        while not stop and all(c.proc.poll() is None for c in fleet.stack.components):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()
    return 0


def shipper_config_text(flavour: str, cluster: str, host: str, write_url: str,
                        exporter: str = EXPORTER_ADDRESS, self_address: str | None = None,
                        s: Settings | None = None) -> str:
    """One host's shipper configuration, as `sglang-obs fleet shipper-config` prints it."""
    prom = dict((s or default()).prometheus)
    prom = yaml.safe_load(yaml.safe_dump(prom, sort_keys=False).replace(EXPORTER_ADDRESS,
                                                                         exporter))
    if flavour == "prometheus-agent":
        config = shipper.agent_config(prom, cluster, host, write_url)
        if self_address:
            config["scrape_configs"][-1]["static_configs"] = [{"targets": [self_address]}]
    else:
        config = shipper.shipper_config(prom, cluster, host,
                                        self_address or shipper.VMAGENT_ADDRESS)
    return yaml.safe_dump(config, sort_keys=False, width=100)


def main_shipper_config(args, s: Settings) -> int:
    sys.stdout.write(shipper_config_text(args.flavour, args.cluster, args.host, args.write_url,
                                         args.exporter, args.self_address, s))
    return 0


def main_shipper_flags(args, s: Settings) -> int:
    prom = dict(s.prometheus)
    print(" ".join(shipper.vmagent_command(args.config, args.write_url, args.buffer_dir,
                                           args.listen, prom)))
    return 0
