"""/metrics latency while slow and idle clients hold the exporter's connections (issue 28's
target: p99 <= 100 ms with 2,000 of them held), reported in docs/performance.md.

The exporter's app and server (exporter/web.py, exporter/http_server.py) run in a process of
their own serving the realistic 0.5.23 exposition (bench_exporter.realistic_exposition). This
process plays both the attacker and a well-behaved scraper, from one thread over non-blocking
sockets, so the client side adds no GIL contention of its own:

- `quiet`: nothing else connected;
- `held`: 2,000 connections from four loopback addresses (127.0.0.2-5, 500 each: under the
  per-client cap, so all are held): half idle, half slowloris (`G`, then one byte a second),
  reopened as soon as the server closes one (at its head deadline);
- `flood`: the same 2,000 from 127.0.0.1 alone, past the per-client cap (512): the server closes
  the oldest waiting ones to make room and the attacker reopens each at once, a connect flood.
  The target is for held connections; this side shows what a flood beyond the caps costs.

Each scrape is a raw-socket GET on a fresh connection, timed from connect to the server's close,
answer checked (status 200 and the same body length as the quiet side). The sides alternate
phase by phase in every round. Min, median and p99 per side, and each round's p99.

Run: .venv/bin/python bench/bench_slow_clients.py [--rounds 5] [--scrapes 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contextlib

from bench_exporter import require, summary
from results_file import emit, machine

from sglang_obs.core.connections import raise_fd_limit

ROOT = Path(__file__).resolve().parents[1]
HELD = 2000
TARGET_P99_S = 0.100
HELD_SIDES = ("quiet", "held")  # the sides the target is for
SERVE = """
import sys, time
sys.path.insert(0, {bench!r})
from bench_exporter import realistic_exposition
from prometheus_client.core import CollectorRegistry
from sglang_obs.exporter.web import make_app, serve

class Raw:  # the realistic answer as the registry's one family source
    def __init__(self, text):
        from prometheus_client.parser import text_string_to_metric_families
        self.families = list(text_string_to_metric_families(text))
    def collect(self):
        return self.families

from sglang_obs.exporter.web import Exposition
registry = CollectorRegistry()
registry.register(Raw(realistic_exposition()))
server = serve(make_app(Exposition(registry), "/metrics", ["http://127.0.0.1:30000"]),
               "127.0.0.1:0", "/metrics")
print(server.server_address[1], flush=True)
time.sleep(86400)
"""


class Attack:
    """`n` connections from `sources` (round robin): odd ones drip a byte a second after `G`,
    even ones stay idle; any the server closes is reopened."""

    def __init__(self, port: int, n: int, sources: list[str]):
        self.port, self.sources = port, sources
        self.sel = selectors.DefaultSelector()
        self.socks: dict[int, tuple[socket.socket, bool, str]] = {}
        self.reopened = 0
        for i in range(n):
            self._open(i % 2 == 1, sources[i % len(sources)])
        self.last_drip = time.monotonic()

    def _open(self, drips: bool, source: str) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", self.port))
        self.socks[s.fileno()] = (s, drips, source)
        self.sel.register(s, selectors.EVENT_READ)
        if drips:
            with contextlib.suppress(OSError):
                s.send(b"G")

    def step(self) -> None:
        """Reopen what the server closed; drip once a second."""
        for key, _ in self.sel.select(0):
            s, drips, source = self.socks.pop(key.fd)
            self.sel.unregister(s)
            s.close()
            self.reopened += 1
            self._open(drips, source)
        if time.monotonic() - self.last_drip >= 1.0:
            self.last_drip = time.monotonic()
            for s, drips, _ in list(self.socks.values()):
                if drips:
                    with contextlib.suppress(OSError):
                        s.send(b"E")

    def close(self) -> None:
        for s, _, _ in self.socks.values():
            s.close()
        self.sel.close()


def scrape(port: int, attack: Attack | None, timeout: float = 5.0) -> tuple[float, int]:
    """One GET /metrics on a fresh connection, the attack stepped while it waits:
    (seconds from connect to close, body length; -1 when it failed)."""
    started = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setblocking(False)
    s.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain;version=0.0.4\r\n"
           b"Connection: close\r\n\r\n")
    chunks = []
    while time.perf_counter() - started < timeout:
        try:
            chunk = s.recv(1 << 16)
        except BlockingIOError:
            if attack is not None:
                attack.step()
            selectors_wait(s)
            continue
        except OSError:
            break
        if not chunk:
            took = time.perf_counter() - started
            s.close()
            answer = b"".join(chunks)
            ok = answer.startswith(b"HTTP/1.1 200")
            return took, len(answer.split(b"\r\n\r\n", 1)[-1]) if ok else -1
        chunks.append(chunk)
    s.close()
    return time.perf_counter() - started, -1


def selectors_wait(s: socket.socket) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(s, selectors.EVENT_READ)
        sel.select(0.002)


def run(rounds: int, scrapes: int) -> dict:
    raise_fd_limit(HELD + 200)
    proc = subprocess.Popen([sys.executable, "-c", SERVE.format(bench=str(ROOT / "bench"))],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        sides = {"quiet": None, "held": [f"127.0.0.{i}" for i in range(2, 6)],
                 "flood": ["127.0.0.1"]}
        samples = {name: [] for name in sides}
        per_round = {name: [] for name in sides}
        lengths, failed, reopened = set(), {name: 0 for name in sides}, {}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                attack = Attack(port, HELD, sides[name]) if sides[name] else None
                if attack is not None:
                    settle = time.monotonic() + 2.0
                    while time.monotonic() < settle:
                        attack.step()
                        time.sleep(0.001)
                took_round = []
                for _ in range(scrapes):
                    took, length = scrape(port, attack)
                    if length < 0:
                        failed[name] += 1
                    else:
                        lengths.add(length)
                    took_round.append(took)
                    if attack is not None:
                        attack.step()
                if attack is not None:
                    reopened[name] = reopened.get(name, 0) + attack.reopened
                    attack.close()
                samples[name] += took_round
                per_round[name].append(summary(took_round, 1000)["p99"])
        require(len(lengths) == 1, f"answers of different lengths: {sorted(lengths)}")
    finally:
        proc.kill()
        proc.wait()
    return {"held": HELD, "rounds": rounds, "scrapes_per_side_per_round": scrapes,
            "body_bytes": lengths.pop(),
            "sides": {name: {**summary(samples[name], 1000), "failed": failed[name],
                             "round_p99": [round(v, 2) for v in per_round[name]],
                             "reopened": reopened.get(name, 0)} for name in sides}}


def doc_block(r: dict) -> str:
    rows = ["| /metrics scrape, ms | min | median | p99 | failed | connections the server "
            "closed (reopened) |", "|---|---|---|---|---|---|"]
    for name, s in r["sides"].items():
        rows.append(f"| {name} | {s['min']:.2f} | {s['median']:.2f} | **{s['p99']:.2f}** | "
                    f"{s['failed']} of {s['n']} | {s['reopened']:,} |")
    worst = max(s["p99"] for n, s in r["sides"].items() if n in HELD_SIDES)
    flood = r["sides"]["flood"]
    m = r["machine"]
    return (f"Measured by `bench/bench_slow_clients.py {' '.join(m['argv'])}` on "
            f"{m['date']}: {m['cpus']} CPUs, Python {m['python']}, 1-minute load average "
            f"{m['loadavg_at_start'][0]:.1f} at the start and {m['loadavg'][0]:.1f} at the end; "
            f"{r['rounds']} rounds × {r['scrapes_per_side_per_round']} scrapes per side, a "
            f"{r['body_bytes']:,}-byte answer, {r['held']:,} connections held on the attacked "
            "sides.\n\n" + "\n".join(rows) + "\n\n"
            f"Target: p99 ≤ {TARGET_P99_S * 1000:.0f} ms with {r['held']:,} slow or idle "
            f"connections held: {worst:.2f} ms at worst "
            f"({'met' if worst <= TARGET_P99_S * 1000 else '**missed**'}). Per-round p99: "
            + "; ".join(f"{n} {', '.join(f'{v:.1f}' for v in s['round_p99'])}"
                        for n, s in r["sides"].items()) + ". Under the flood the server "
            f"closed and the attacker reopened {flood['reopened']:,} connections: the scrape "
            "waits behind them in the listen queue, and is still answered.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    result = run(args.rounds, args.scrapes)
    result["machine"] = machine(load_at_start)
    emit(result, args.json, doc_block)
    worst = max(s["p99"] for n, s in result["sides"].items() if n in HELD_SIDES)
    sys.exit(0 if worst <= TARGET_P99_S * 1000 and not any(
        s["failed"] for s in result["sides"].values()) else 1)


if __name__ == "__main__":
    main()
