"""`sglang-obs stack up --native` when a part cannot start: a port already taken (by a program
that even answers the part's health check). The stack must not print its banner, must stop the
parts it started, exit 1 with that part's own error line naming the port, and leave no run
folder (or, with --dir, nothing it added)."""

import http.server
import os
import socket
import subprocess
import sys
import threading
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
