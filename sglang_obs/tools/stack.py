"""`sglang-obs stack up --native`: the compose stack without Docker.

Runs the same prometheus/, alertmanager/ and exporter configuration with locally installed
binaries (Debian's prometheus and prometheus-alertmanager) and this package's commands,
rewriting only the addresses (compose service names become 127.0.0.1 ports). Optionally the
demo simulator, and an override file for the Prometheus global section (shorter intervals).
"""

from __future__ import annotations

import contextlib
import shutil
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

from sglang_obs import config_dir

ROOT = config_dir.resolve()  # prometheus/, alertmanager/, grafana/
BIN = Path(sys.executable).parent


class StackError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise StackError(f"{names[0]} not found: apt-get install prometheus prometheus-alertmanager")


@dataclass
class Component:
    name: str
    cmd: list[str]
    ready_url: str
    proc: subprocess.Popen | None = None
    log: Path | None = None


@dataclass
class NativeStack:
    workdir: Path
    sglang_urls: list[str] = field(default_factory=list)
    demo: list[str] = field(default_factory=list)  # simulator scenarios to serve
    override: Path | None = None
    demo_start_at: float = 0.0
    default_ports: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)

    def _port(self, name: str, default: int) -> int:
        self.ports[name] = default if self.default_ports else free_port()
        return self.ports[name]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        sink = self._port("alert-sink", 9095)
        am = self._port("alertmanager", 9093)
        prom = self._port("prometheus", 9090)
        exporter = self._port("exporter", 9840)
        urls = list(self.sglang_urls)
        for i, scenario in enumerate(self.demo):
            port = self._port(f"sglang-sim-{i}", 30000 + i)
            urls.append(f"http://127.0.0.1:{port}")
            self.components.append(Component(
                f"sglang-sim-{i}", [str(BIN / "sglang-sim"), "serve", "--scenario", scenario,
                                    "--host", "127.0.0.1", "--port", str(port), "--gpu-feed",
                                    "--no-stdout-log", "--start-at", str(self.demo_start_at)],
                f"http://127.0.0.1:{port}/health"))
        if not urls:
            raise StackError("nothing to watch: give --sglang-url or --demo")
        self.components.insert(0, Component(
            "alert-sink", [str(BIN / "sglang-obs"), "alert-sink", "--listen",
                           f"127.0.0.1:{sink}", "--log-file", str(self.workdir / "alerts.jsonl")],
            f"http://127.0.0.1:{sink}/"))
        exporter_cmd = [str(BIN / "sglang-exporter"), "--web.listen-address",
                        f"127.0.0.1:{exporter}", "--no-collector.docker"]
        for url in urls:
            exporter_cmd += ["--sglang.url", url]
        if self.demo:
            exporter_cmd += ["--collector.nvml.simulator-feed", f"{urls[-1]}/sim/gpu"]
        self.components.append(Component("exporter", exporter_cmd,
                                          f"http://127.0.0.1:{exporter}/metrics"))
        am_config = (ROOT / "alertmanager" / "alertmanager.yml").read_text().replace(
            "http://alert-sink:9095", f"http://127.0.0.1:{sink}")
        (self.workdir / "alertmanager.yml").write_text(am_config)
        self.components.append(Component("alertmanager", [
            _which("prometheus-alertmanager", "alertmanager"),
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{am}", "--cluster.listen-address="],
            f"http://127.0.0.1:{am}/-/ready"))
        text = (ROOT / "prometheus" / "prometheus.yml").read_text()
        for old, new in (("exporter:9840", f"127.0.0.1:{exporter}"),
                         ("alertmanager:9093", f"127.0.0.1:{am}"),
                         ("localhost:9090", f"127.0.0.1:{prom}")):
            text = text.replace(old, new)
        config = yaml.safe_load(text)
        config["rule_files"] = [str(ROOT / "prometheus" / f) for f in config["rule_files"]]
        if self.override:
            config["global"].update(yaml.safe_load(self.override.read_text())["global"])
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.components.append(Component("prometheus", [
            _which("prometheus"), f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{prom}", "--storage.tsdb.retention.time=7d"],
            f"http://127.0.0.1:{prom}/-/ready"))

    def start(self, timeout: float = 30.0) -> None:
        for c in self.components:
            c.log = self.workdir / f"{c.name}.log"
            c.proc = subprocess.Popen(c.cmd, stdout=c.log.open("w"), stderr=subprocess.STDOUT,
                                      start_new_session=True)
            deadline = time.monotonic() + timeout
            while True:
                if c.proc.poll() is not None:
                    raise StackError(f"{c.name} exited: {c.log.read_text()[-1500:]}")
                with contextlib.suppress(OSError):
                    if urllib.request.urlopen(c.ready_url, timeout=1).status == 200:
                        break
                if time.monotonic() > deadline:
                    raise StackError(f"{c.name} not ready after {timeout:.0f}s")
                time.sleep(0.1)

    def stop_component(self, name: str) -> None:
        for c in self.components:
            if c.name == name and c.proc and c.proc.poll() is None:
                c.proc.terminate()
                c.proc.wait(timeout=10)

    def stop(self) -> None:
        for c in reversed(self.components):
            if c.proc and c.proc.poll() is None:
                c.proc.terminate()
        for c in self.components:
            if c.proc:
                try:
                    c.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    c.proc.kill()


def up(args) -> int:
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="sglang-obs-"))
    stack = NativeStack(workdir, args.sglang_url or [], args.demo or [],
                        Path(args.override) if args.override else None,
                        default_ports=not args.free_ports)
    try:
        stack.prepare()
        stack.start()
    except (StackError, OSError) as err:
        stack.stop()
        print(f"sglang-obs stack: {err}", file=sys.stderr)
        return 1
    print(f"Prometheus   {stack.url('prometheus')}\nAlertmanager {stack.url('alertmanager')}\n"
          f"Exporter     {stack.url('exporter')}/metrics\nAlerts log   {workdir / 'alerts.jsonl'}"
          f"\nLogs         {workdir}\nCtrl-C stops everything.", flush=True)
    stop = False

    def handler(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, handler)
    try:
        while not stop and all(c.proc.poll() is None for c in stack.components):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
    return 0
