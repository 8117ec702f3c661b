"""`sglang-obs stack up --native`: the compose stack without Docker.

Runs the same prometheus/, alertmanager/ and exporter configuration with locally installed
binaries (Debian's prometheus and prometheus-alertmanager) and this package's commands,
rewriting only the addresses (compose service names become 127.0.0.1 ports). Optionally the
demo simulator, and an override file for the Prometheus global section (shorter intervals).

A part is up when its own process listens on its port and its health endpoint answers
(Prometheus and Alertmanager /-/ready, the exporter /metrics, the simulator /health, the alert
sink /): another program answering on a taken port does not count. The banner (every URL a user
opens, and the PIDs) is printed once every part is up; a --sglang-url that gives no HTTP answer
within PROBE_SECONDS then gets one line saying so, and the stack runs on. If one part fails, the
others are stopped, the command exits 1 with that part's own error line (from its log; a taken
port also names --free-ports), and the run's folder is removed (with --dir: what this run added
to it; what was there before stays).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_obs.core.cli_support import Failure, UsageError, folder, input_file, one_line
from sglang_obs.core.safe_files import Refused, read_input
from sglang_obs.core.settings import Settings, default
from sglang_obs.core.sglang import EXPORTER_ADDRESS, EXPORTER_PORT, SGLANG_PORT

BIN = Path(sys.executable).parent
DEFAULT_PORTS = {"alert-sink": 9095, "alertmanager": 9093, "prometheus": 9090,
                 "exporter": EXPORTER_PORT}
SIM_PORT = SGLANG_PORT  # the first simulator's; the next ones count up
PROBE_SECONDS = 5.0  # how long a --sglang-url has to answer before the banner says it does not
PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)


class StackError(RuntimeError):
    def __init__(self, message: str, port_taken: bool = False):
        super().__init__(message)
        self.port_taken = port_taken  # another program holds the part's port


class Stopped(Exception):  # a signal, not a failure
    """SIGTERM arrived: stop everything."""


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


# -- who listens on a port ---------------------------------------------------------------------
def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP `port` (None where /proc/net cannot tell)."""
    found, readable = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1],
                                                              16) == port:
                found.add(fields[9])
    return found if readable else None


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on `port` (True where /proc cannot
    tell: the health check alone decides there)."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True
    for fd in fds:
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


_LOGFMT_ERROR = re.compile(r"level=(?:error|ERROR|fatal|FATAL|crit|CRITICAL)\b")


def error_line(log: str) -> str:
    """The line of a part's log that says why it stopped, shortened to its message: the last
    error-level line (Prometheus, Alertmanager, the exporter), else the last line."""
    lines = [ln for ln in log.splitlines() if ln.strip()]
    if not lines:
        return "exited without a word"
    line = next((ln for ln in reversed(lines) if _LOGFMT_ERROR.search(ln)), lines[-1])
    msg = re.search(r'\bmsg=(?:"((?:[^"\\]|\\.)*)"|(.*?)(?=\s\w+=|$))', line)
    err = re.search(r'\berr="((?:[^"\\]|\\.)*)"', line)
    if msg or err:
        parts = [m for m in ((msg.group(1) or msg.group(2)) if msg else None,
                             err.group(1) if err else None) if m]
        line = ": ".join(parts)
    return one_line(line, 240)


@dataclass
class Component:
    name: str
    cmd: list[str]
    ready_url: str
    port: int = 0
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
    pinned: dict[str, int] = field(default_factory=dict)  # part -> port, beats the others
    ports: dict[str, int] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)
    settings: Settings = field(default_factory=default)  # whose configuration files it runs

    def _port(self, name: str, default: int) -> int:
        if name in self.pinned:
            self.ports[name] = self.pinned[name]
        else:
            self.ports[name] = default if self.default_ports else free_port()
        return self.ports[name]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def prepare(self) -> None:
        urls = list(self.sglang_urls)
        if not urls and not self.demo:
            raise UsageError("nothing to watch: give --sglang-url URL or --demo")
        from sglang_obs.simulator import scenario as scenarios

        for name in self.demo:
            try:
                scenarios.load(name)
            except scenarios.ScenarioError as err:
                raise UsageError(f"--demo {name}: {err}") from None
        parts = [*DEFAULT_PORTS, *(f"sglang-sim-{i}" for i in range(len(self.demo)))]
        unknown = sorted(set(self.pinned) - set(parts))
        if unknown:
            raise UsageError(f"--port {unknown[0]}=...: no such part; the parts are "
                             f"{', '.join(parts)}")
        prometheus_bin = _which("prometheus")
        alertmanager_bin = _which("prometheus-alertmanager", "alertmanager")
        override = None
        if self.override:
            override = _override_global(self.override)
        self.workdir.mkdir(parents=True, exist_ok=True)
        sink = self._port("alert-sink", DEFAULT_PORTS["alert-sink"])
        am = self._port("alertmanager", DEFAULT_PORTS["alertmanager"])
        prom = self._port("prometheus", DEFAULT_PORTS["prometheus"])
        exporter = self._port("exporter", DEFAULT_PORTS["exporter"])
        for i, scenario in enumerate(self.demo):
            port = self._port(f"sglang-sim-{i}", SIM_PORT + i)
            urls.append(f"http://127.0.0.1:{port}")
            self.components.append(Component(
                f"sglang-sim-{i}", [str(BIN / "sglang-sim"), "serve", "--scenario", scenario,
                                    "--host", "127.0.0.1", "--port", str(port), "--gpu-feed",
                                    "--no-stdout-log", "--start-at", str(self.demo_start_at)],
                f"http://127.0.0.1:{port}/health", port))
        taken = [p for p in self.ports.values() if list(self.ports.values()).count(p) > 1]
        if taken:
            raise UsageError(f"--port: port {taken[0]} is given to two parts")
        self.components.insert(0, Component(
            "alert-sink", [str(BIN / "sglang-obs"), "alert-sink", "--listen",
                           f"127.0.0.1:{sink}", "--log-file", str(self.workdir / "alerts.jsonl")],
            f"http://127.0.0.1:{sink}/", sink))
        exporter_cmd = [str(BIN / "sglang-exporter"), "--web.listen-address",
                        f"127.0.0.1:{exporter}", "--no-collector.docker"]
        for url in urls:
            exporter_cmd += ["--sglang.url", url]
        if self.demo:
            exporter_cmd += ["--collector.nvml.simulator-feed", f"{urls[-1]}/sim/gpu"]
        self.components.append(Component("exporter", exporter_cmd,
                                          f"http://127.0.0.1:{exporter}/metrics", exporter))
        am_config = self.settings.alertmanager_file.read_text().replace(
            "http://alert-sink:9095", f"http://127.0.0.1:{sink}")
        (self.workdir / "alertmanager.yml").write_text(am_config)
        self.components.append(Component("alertmanager", [
            alertmanager_bin,
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{am}", "--cluster.listen-address="],
            f"http://127.0.0.1:{am}/-/ready", am))
        text = self.settings.prometheus_file.read_text()
        for old, new in ((EXPORTER_ADDRESS, f"127.0.0.1:{exporter}"),
                         ("alertmanager:9093", f"127.0.0.1:{am}"),
                         ("localhost:9090", f"127.0.0.1:{prom}")):
            text = text.replace(old, new)
        config = yaml.safe_load(text)
        config["rule_files"] = [str(self.settings.prometheus_file.parent / f)
                                for f in config["rule_files"]]
        if override:
            config["global"].update(override)
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.components.append(Component("prometheus", [
            prometheus_bin, f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{prom}", "--storage.tsdb.retention.time=7d"],
            f"http://127.0.0.1:{prom}/-/ready", prom))

    def start(self, timeout: float = 30.0) -> None:
        """Start each part and wait until it is up (see the module's docstring); a StackError
        with the part's own error line when one is not."""
        for c in self.components:
            c.log = self.workdir / f"{c.name}.log"
            with c.log.open("w") as log:
                c.proc = subprocess.Popen(c.cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            self._wait_up(c, timeout)

    def _wait_up(self, c: Component, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if c.proc.poll() is not None:
                why = error_line(c.log.read_text(errors="replace"))
                raise StackError(f"{c.name} (port {c.port}) did not start: {why}",
                                 port_taken=PORT_TAKEN.search(why) is not None)
            answered = False
            with contextlib.suppress(OSError):
                answered = urllib.request.urlopen(c.ready_url, timeout=1).status == 200
            if answered and listens(c.proc.pid, c.port):
                return
            if time.monotonic() > deadline:
                why = ("another program answers on its port" if answered
                       else f"{c.ready_url} does not answer")
                raise StackError(f"{c.name} (port {c.port}) not up after {timeout:.0f} s: {why}",
                                 port_taken=answered)
            time.sleep(0.1)

    def dead(self) -> Component | None:
        """A part that has exited, if any."""
        return next((c for c in self.components if c.proc and c.proc.poll() is not None), None)

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
                    c.proc.wait()


def pids(stack: NativeStack) -> str:
    """Each running part's name and PID, as the banners print them."""
    return ", ".join(f"{c.name} {c.proc.pid}" for c in stack.components if c.proc)


def unreachable(url: str, within: float) -> str | None:
    """Why `url` gave no HTTP answer within `within` seconds (None once it answers: any status,
    a 503 of a server still loading too)."""
    deadline = time.monotonic() + within
    while True:
        try:
            urllib.request.urlopen(url.rstrip("/") + "/health",
                                   timeout=max(deadline - time.monotonic(), 0.1))
            return None
        except urllib.error.HTTPError:
            return None
        except (OSError, ValueError) as err:
            why = one_line(getattr(err, "reason", None) or err, 120)
        if time.monotonic() >= deadline:
            return why
        time.sleep(0.5)


def _report_unreachable(urls: list[str]) -> None:
    """One line per --sglang-url that does not answer: the stack runs on, and the exporter
    keeps polling it."""
    from sglang_obs.core import shown  # every URL shown goes through shown.url

    def probe(url: str) -> None:
        why = unreachable(url, PROBE_SECONDS)
        if why is not None:
            print(f"SGLang {shown.url(url)} unreachable: no answer within {PROBE_SECONDS:.0f} s "
                  f"({why}); "
                  "the stack keeps running and the exporter keeps trying", flush=True)

    for url in urls:
        threading.Thread(target=probe, args=(url,), daemon=True).start()


def _override_global(path: Path) -> dict:
    input_file("--override", path)
    try:  # a regular file or a pipe (`<(...)`); a FIFO nothing writes to fails, never blocks
        doc = yaml.safe_load(read_input(path).decode("utf-8", errors="replace"))
    except Refused as err:
        raise Failure(f"--override {path}: cannot read it ({err})") from None
    except (OSError, yaml.YAMLError) as err:
        raise Failure(f"--override {path}: not readable YAML ({one_line(err, 120)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("global"), dict):
        raise Failure(f"--override {path}: no `global:` section (see "
                      "prometheus/override.fast.yml)")
    return doc["global"]


def _stop_on_sigterm(*_) -> None:
    raise Stopped


def up(args, s: Settings) -> int:
    """The command: 0 after a stop (Ctrl-C, SIGTERM), 1 when a part fails to start or dies."""
    given = Path(args.dir) if args.dir else None
    before: set[str] | None = None
    if given is not None:
        existed = given.exists()
        folder("--dir", given)
        before = {p.name for p in given.iterdir()} if existed else None
        workdir = given
    else:
        workdir = Path(tempfile.mkdtemp(prefix="sglang-obs-"))
    stack = NativeStack(workdir, args.sglang_url or [], args.demo or [],
                        Path(args.override) if args.override else None,
                        default_ports=not args.free_ports, pinned=dict(args.port or []),
                        settings=s)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        try:
            stack.prepare()
            stack.start()
        except (StackError, Failure, OSError, Stopped, KeyboardInterrupt) as err:
            stack.stop()
            _clean(workdir, given, before)
            if isinstance(err, (Stopped, KeyboardInterrupt)):
                return 130
            if isinstance(err, Failure):
                raise
            if isinstance(err, OSError):
                raise Failure(f"{err.filename or workdir}: {err.strerror or err}") from None
            hint = ("; --free-ports picks free ones, --port PART=PORT pins one"
                    if err.port_taken else "")
            raise Failure(f"{err}{hint}") from None
        print(f"Glance page  {stack.url('exporter')}/\n"
              f"Prometheus   {stack.url('prometheus')}\n"
              f"Alertmanager {stack.url('alertmanager')}\n"
              f"Alert sink   {stack.url('alert-sink')}/\n"
              f"Exporter     {stack.url('exporter')}/metrics\n"
              + "".join(f"Simulator    {stack.url(c.name)} ({c.name})\n"
                        for c in stack.components if c.name.startswith("sglang-sim-"))
              + f"Alerts log   {workdir / 'alerts.jsonl'}\n"
              f"Data, logs   {workdir} (kept after a stop)\n"
              f"PIDs         {pids(stack)}\n"
              f"Ctrl-C stops everything (or kill {os.getpid()}).", flush=True)
        _report_unreachable(stack.sglang_urls)
        try:
            while (dead := stack.dead()) is None:
                time.sleep(0.5)
        except (Stopped, KeyboardInterrupt):
            return 0
        raise Failure(f"{dead.name} stopped: {error_line(dead.log.read_text(errors='replace'))}"
                      f" (its log: {dead.log}); the other parts are stopped")
    finally:
        stack.stop()
        signal.signal(signal.SIGTERM, previous)


def _clean(workdir: Path, given: Path | None, before: set[str] | None) -> None:
    """After a failed start: the run's folder as it was (gone, unless --dir named one that
    existed; then only what this run added is removed)."""
    if given is None or before is None:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for p in workdir.iterdir():
        if p.name not in before:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
