"""`sglang-obs stack up --native` when a part cannot start: a port already taken (by a program
that even answers the part's health check). The stack must not print its banner, must stop the
parts it started, exit 1 with that part's own error line naming the port and --free-ports, and
leave no run folder (or, with --dir, nothing it added). When it starts: a banner with every URL
a user opens and the PIDs (`fleet up` too), and a line for a --sglang-url that does not answer."""

import contextlib
import http.server
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import require_binary
from helpers import free_port

pytestmark = pytest.mark.slow  # starts real processes
EXE = str(Path(sys.executable).parent / "sglang-obs")
PARTS = ("alert-sink", "prometheus", "exporter", "sglang-sim-0")


class _AnswersEverything(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_):
        pass


@pytest.fixture
def impostor():
    """An HTTP server on a free port answering 200 to every path (/-/ready included)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AnswersEverything)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def processes_using(ports):
    """pids of processes with one of `ports` on their command line."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a == str(p) or a.endswith(f":{p}") for a in args for p in ports):
            found.append((pid, args))
    return found


def port_is_free(port):
    """Nothing listens on it (connections of the health checks may linger in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def stack_up(tmp_path, busy, *extra):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    ports = {part: free_port() for part in PARTS}
    pins = [arg for part, port in [*ports.items(), ("alertmanager", busy)]
            for arg in ("--port", f"{part}={port}")]
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    result = subprocess.run([EXE, "stack", "up", "--native", "--demo", *pins, *extra],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TMPDIR": str(tmpdir)})
    return result, ports, tmpdir


def test_a_taken_port_fails_the_start_with_the_parts_own_error(tmp_path, impostor):
    result, ports, tmpdir = stack_up(tmp_path, impostor)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{impostor}" in lines[0]
    assert "alertmanager" in lines[0]
    assert "address already in use" in lines[0]
    assert "--free-ports" in lines[0]
    assert "Prometheus " not in result.stdout  # no banner
    assert "Traceback" not in result.stdout + result.stderr
    # the parts started before Alertmanager are stopped, their ports free again
    assert not processes_using([*ports.values(), impostor])
    assert all(port_is_free(p) for p in ports.values())
    assert list(tmpdir.iterdir()) == []  # no run folder left


def test_with_dir_only_what_the_run_added_is_removed(tmp_path, impostor):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine\n")
    result, ports, _ = stack_up(tmp_path, impostor, "--dir", str(run_dir))
    assert result.returncode == 1, result.stderr
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]
    assert not processes_using(ports.values())


class Running:
    """A command whose output lines are read as they come, with the time each arrived."""

    def __init__(self, args, tmp_path):
        self.proc = subprocess.Popen([EXE, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))

    def until(self, pattern, timeout):
        """(arrival, line) of the first line matching `pattern` within `timeout` s, else None."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                at, line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if re.search(pattern, line):
                return at, line
        return None

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=30)


BANNER = re.compile(r"(Glance page|Alert sink|Prometheus|Alertmanager|Exporter|PIDs)\s+(\S.*)$")


def banner_fields(lines):
    return {m.group(1): m.group(2) for line in lines if (m := BANNER.match(line))}


def answers(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode(errors="replace")


def alive_pids(text):
    """{part: pid} from a banner's PIDs line, checking each is a running process."""
    found = dict((name, int(pid)) for name, pid in re.findall(r"([\w-]+) (\d+)", text))
    for name, pid in found.items():
        assert Path(f"/proc/{pid}").exists(), (name, pid)
    return found


def test_the_banner_lists_every_url_a_user_opens_and_the_pids(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    run = Running(["stack", "up", "--native", "--demo", "--free-ports", "--dir",
                   str(tmp_path / "run")], tmp_path)
    pids = {}
    try:
        assert run.until("Ctrl-C stops everything", 120), run.seen
        fields = banner_fields(run.seen)
        print(fields)
        for name in ("Glance page", "Alert sink", "Prometheus", "Alertmanager", "Exporter"):
            assert name in fields, (name, run.seen)
        status, page = answers(fields["Glance page"])
        assert status == 200
        assert "<html" in page.lower()
        assert answers(fields["Alert sink"])[0] == 200
        assert answers(fields["Prometheus"] + "/-/ready")[0] == 200
        assert answers(fields["Alertmanager"] + "/-/ready")[0] == 200
        assert "sglang" in answers(fields["Exporter"])[1]
        pids = alive_pids(fields["PIDs"])
        assert set(pids) == {"alert-sink", "sglang-sim-0", "exporter", "alertmanager",
                             "prometheus"}
    finally:
        run.stop()
    left = {name: Path(f"/proc/{pid}/status").read_text().splitlines()[2]
            for name, pid in pids.items() if Path(f"/proc/{pid}").exists()}
    assert not left, (left, run.proc.returncode)


def test_an_sglang_url_that_does_not_answer_is_said_within_seconds(tmp_path, impostor):
    """Two --sglang-url: one nothing listens on gets its line, one that answers does not;
    the stack keeps running."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    dead = f"http://127.0.0.1:{free_port()}"
    run = Running(["stack", "up", "--native", "--sglang-url", dead, "--sglang-url",
                   f"http://127.0.0.1:{impostor}", "--free-ports", "--dir",
                   str(tmp_path / "run")], tmp_path)
    try:
        up = run.until("Ctrl-C stops everything", 120)
        assert up, run.seen
        said = run.until("unreachable", 11)
        assert said, run.seen
        print(f"'unreachable' {said[0] - up[0]:.1f} s after the banner (bound 11 s)")
        assert dead in said[1]
        assert run.until("unreachable", 3) is None, run.seen  # the answering one: no line
        assert run.proc.poll() is None  # the stack runs on
    finally:
        run.stop()
    lines = [line for line in run.seen if "unreachable" in line]
    assert len(lines) == 1
    assert str(impostor) not in lines[0]


def test_fleet_up_prints_the_pids_it_started(tmp_path):
    require_binary("victoria-metrics", "victoria-metrics")
    require_binary("prometheus-alertmanager")
    run = Running(["fleet", "up", "1", "--clusters", "1", "--dir", str(tmp_path / "run")],
                  tmp_path)
    pids = {}
    try:
        assert run.until("Ctrl-C stops everything", 180), run.seen
        pids_line = next((line for line in run.seen if line.startswith("PIDs")), None)
        assert pids_line, run.seen
        pids = alive_pids(pids_line)
        print(pids)
        assert set(pids) == {"alert-sink", "alertmanager", "victoria-metrics", "vmalert",
                             "sim-host-1", "exporter-host-1", "vmagent-host-1"}
        kill = re.search(r"kill (\d+)", run.seen[-1])
        assert kill
        assert int(kill.group(1)) == run.proc.pid
    finally:
        run.stop()
    left = {name: Path(f"/proc/{pid}/status").read_text().splitlines()[2]
            for name, pid in pids.items() if Path(f"/proc/{pid}").exists()}
    assert not left, (left, run.proc.returncode)
