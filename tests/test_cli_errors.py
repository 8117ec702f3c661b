"""Every command's bad arguments, the way a user meets them: the installed entry points run as
processes. Each gives exactly one non-empty line on stderr that names the argument or the path
or URL, no traceback, exit 2 for a usage error (missing, wrong type, bad value) and exit 1 for a
failure (missing or unreadable input, an output that exists or cannot be written, a directory
for a file or a file for a directory, a port in use, a URL that does not answer).

The table covers every subcommand the parsers define: one added without a row fails
test_the_table_covers_every_subcommand.
"""

import argparse
import concurrent.futures
import gzip
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_obs.cli import build_parser as obs_parser
from sglang_obs.core import cli_support, pack
from sglang_obs.exporter.cli import build_parser as exporter_parser
from sglang_obs.simulator.cli import build_parser as sim_parser
from sglang_obs.tools.compare import WindowData

from conftest import ROOT
from helpers import free_port

BIN = Path(sys.executable).parent
LOG = ROOT / "tests/fixtures/sglang/scheduler_0.5.12_tp4.log"
USAGE, FAILURE = 2, 1
# sglang-sim what-if: a window on a Prometheus nothing answers on, and one proposed argument.
WINDOW = ["--prometheus", "{dead}", "--start", "1h ago", "--end", "now"]
SET = ["--set", "max_running_requests=10"]

# (program, subcommand, arguments, exit status, what the line must name). Placeholders:
# {file} an existing file, {dir} an existing empty directory, {full} a non-empty one, {missing}
# a path that does not exist, {busy} a port something listens on, {dead} a URL nothing answers
# on, {gz} a truncated gzip file, {log} a real scheduler log, {tmp} a fresh directory's path,
# {pack} a snapshot pack of server sglang:30000 (its windows.json and load.json hold no data),
# {oldpack} a pack an older release took (summary.json only).
# /proc/nope/...: a path that cannot be created, even by root.
TABLE = [
    # sglang-obs, before any subcommand
    ("sglang-obs", None, ["no-such-command"], USAGE, ["no-such-command"]),
    ("sglang-obs", None, [], USAGE, ["COMMAND"]),
    ("sglang-obs", "rules", ["--config-dir", "{file}", "rules", "--check"], FAILURE,
     ["--config-dir", "{file}"]),
    ("sglang-obs", "rules", ["--config-dir", "{missing}", "rules", "--check"], FAILURE,
     ["--config-dir", "{missing}"]),
    ("sglang-obs", "rules", ["--config-dir", "{dir}", "rules", "--check"], FAILURE,
     ["--config-dir", "{dir}"]),
    ("sglang-obs", "rules", ["rules", "--chek"], USAGE, ["--chek"]),
    # alert-sink
    ("sglang-obs", "alert-sink", ["alert-sink", "--listen", "nowhere"], USAGE, ["--listen"]),
    ("sglang-obs", "alert-sink", ["alert-sink", "--timeout", "soon"], USAGE, ["--timeout"]),
    ("sglang-obs", "alert-sink", ["alert-sink", "--log-file-max-bytes", "10"], USAGE,
     ["--log-file-max-bytes"]),
    ("sglang-obs", "alert-sink", ["alert-sink", "--log-file", "{dir}"], FAILURE,
     ["--log-file", "{dir}"]),
    ("sglang-obs", "alert-sink", ["alert-sink", "--log-file", "/proc/nope/alerts.jsonl"],
     FAILURE, ["--log-file", "/proc/nope"]),
    ("sglang-obs", "alert-sink", ["alert-sink", "--log-file", "{file}/alerts.jsonl"], FAILURE,
     ["--log-file", "{file}"]),
    ("sglang-obs", "alert-sink", ["alert-sink", "--listen", "127.0.0.1:{busy}"], FAILURE,
     ["--listen", "{busy}"]),
    # detection
    ("sglang-obs", "detection", ["detection", "no-such-scenario"], USAGE,
     ["no-such-scenario"]),
    # analyze-log
    ("sglang-obs", "analyze-log", ["analyze-log"], USAGE, ["FILE"]),
    ("sglang-obs", "analyze-log", ["analyze-log", "{dir}"], FAILURE,
     ["{dir}", "is a directory"]),
    ("sglang-obs", "analyze-log", ["analyze-log", "{missing}"], FAILURE,
     ["{missing}", "no such file"]),
    ("sglang-obs", "analyze-log", ["analyze-log", "{gz}"], FAILURE, ["{gz}", "truncated"]),
    ("sglang-obs", "analyze-log", ["analyze-log", "{log}", "--csv-per-minute", "{dir}"],
     FAILURE, ["--csv-per-minute", "{dir}"]),
    ("sglang-obs", "analyze-log", ["analyze-log", "{log}", "--csv-per-minute",
                                   "/proc/nope/x.csv"], FAILURE, ["--csv-per-minute"]),
    # analyze-requests
    ("sglang-obs", "analyze-requests", ["analyze-requests"], USAGE, ["FILE"]),
    ("sglang-obs", "analyze-requests", ["analyze-requests", "{missing}"], FAILURE,
     ["{missing}", "no such file"]),
    ("sglang-obs", "analyze-requests", ["analyze-requests", "--top", "x", "{dir}"], USAGE,
     ["--top"]),
    # kubernetes
    ("sglang-obs", "kubernetes", ["kubernetes", "--chek"], USAGE, ["--chek"]),
    ("sglang-obs", "kubernetes", ["kubernetes", "--out", "{file}"], FAILURE, ["--out", "{file}"]),
    # render-dashboard (every case fails before the scenario is backfilled)
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--out", "{tmp}/x.png"], USAGE,
     ["--scenario"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "no-such-scenario",
                                        "--out", "{tmp}/x.png"], USAGE,
     ["--scenario", "no-such-scenario"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "healthy",
                                        "--dashboard", "no-such-dashboard", "--out",
                                        "{tmp}/x.png"], USAGE,
     ["--dashboard", "no-such-dashboard"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "healthy",
                                        "--dashboard", "{missing}.json", "--out",
                                        "{tmp}/x.png"], FAILURE, ["--dashboard", "{missing}"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "healthy",
                                        "--dashboard", "{dir}", "--out", "{tmp}/x.png"],
     FAILURE, ["--dashboard", "{dir}", "is a directory"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "healthy", "--out",
                                        "{tmp}/x.svg"], USAGE, ["--out", "x.svg"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "healthy", "--out",
                                        "{file}/x.png"], FAILURE, ["--out", "{file}"]),
    ("sglang-obs", "render-dashboard", ["render-dashboard", "--scenario", "healthy", "--out",
                                        "/proc/nope/"], FAILURE, ["--out", "/proc/nope"]),
    # stack (a taken port: test_stack.py, which needs the Prometheus binaries)
    ("sglang-obs", "stack", ["stack"], USAGE, ["action"]),
    ("sglang-obs", "stack", ["stack", "up"], USAGE, ["--native"]),
    ("sglang-obs", "stack", ["stack", "down", "--native"], USAGE, ["down"]),
    ("sglang-obs", "stack", ["stack", "up", "--native"], USAGE, ["--sglang-url", "--demo"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--sglang-url", "localhost:30000"],
     USAGE, ["--sglang-url", "localhost:30000"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "no-such-scenario"], USAGE,
     ["--demo", "no-such-scenario"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--port", "alertmanager"],
     USAGE, ["--port"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--port", "nope=1234"],
     USAGE, ["--port", "nope"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--override", "{missing}"],
     FAILURE, ["--override", "{missing}"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--override", "{dir}"],
     FAILURE, ["--override", "{dir}"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--override", "{file}"],
     FAILURE, ["--override", "{file}"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--dir", "{file}"], FAILURE,
     ["--dir", "{file}"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--demo", "--dir", "/proc/nope"],
     FAILURE, ["--dir", "/proc/nope"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--fleet", "0"], USAGE, ["--fleet", "0"]),
    # fleet
    ("sglang-obs", "fleet", ["fleet"], USAGE, ["fleet_command"]),
    ("sglang-obs", "fleet", ["fleet", "up", "0"], USAGE, ["N", "0"]),
    ("sglang-obs", "fleet", ["fleet", "up", "many"], USAGE, ["N", "many"]),
    ("sglang-obs", "fleet", ["fleet", "up", "2", "--clusters", "0"], USAGE, ["--clusters"]),
    ("sglang-obs", "fleet", ["fleet", "up", "2", "--clusters", "3", "--dir", "{tmp}/f"], USAGE,
     ["--clusters 3", "2 hosts"]),
    ("sglang-obs", "stack", ["stack", "up", "--native", "--fleet", "1", "--clusters", "2",
                             "--dir", "{tmp}/f"], USAGE, ["--clusters 2", "1 host"]),
    ("sglang-obs", "fleet", ["fleet", "shipper-config", "--host", "h1"], USAGE, ["--cluster"]),
    ("sglang-obs", "fleet", ["fleet", "up", "1", "--dir", "{file}"], FAILURE, ["--dir", "{file}"]),
    ("sglang-obs", "fleet", ["fleet", "up", "1", "--dir", "/proc/nope"], FAILURE,
     ["--dir", "/proc/nope"]),
    ("sglang-obs", "fleet", ["fleet", "shipper-config", "--cluster", "c", "--host", "h",
                             "--flavour", "telegraf"], USAGE, ["--flavour", "telegraf"]),
    # snapshot (Prometheus at {dead}: a check that should come first must come first)
    ("sglang-obs", "snapshot", ["snapshot", "--out", "{tmp}/p"], USAGE, ["--from"]),
    ("sglang-obs", "snapshot", ["snapshot", "--from", "10m ago"], USAGE, ["--out"]),
    ("sglang-obs", "snapshot", ["snapshot", "--from", "10m ago", "--step", "soon", "--out",
                                "{tmp}/p"], USAGE, ["--step"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from",
                                "yesterday-ish", "--out", "{tmp}/p"], USAGE,
     ["--from", "yesterday-ish"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from", "now", "--to",
                                "1h ago", "--out", "{tmp}/p"], USAGE, ["--from", "--to"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "notaurl", "--from", "10m ago",
                                "--out", "{tmp}/p"], USAGE, ["--prometheus", "notaurl"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from", "10m ago",
                                "--out", "{tmp}/p"], FAILURE, ["--prometheus", "{dead}"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from", "10m ago",
                                "--out", "{file}"], FAILURE, ["--out", "{file}"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from", "10m ago",
                                "--out", "{full}"], FAILURE, ["--out", "{full}"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from", "10m ago",
                                "--out", "/proc/nope"], FAILURE, ["--out", "/proc/nope"]),
    ("sglang-obs", "snapshot", ["snapshot", "--prometheus", "{dead}", "--from", "10m ago",
                                "--alerts-log", "{missing}", "--out", "{tmp}/p"], FAILURE,
     ["--alerts-log", "{missing}"]),
    # compare (Prometheus at {dead}: the command line and --out are checked before it is asked)
    ("sglang-obs", "compare", ["compare", "--after", "1h ago", "now"], USAGE, ["--before"]),
    ("sglang-obs", "compare", ["compare", "--before", "1h ago", "--after", "1h ago", "now"],
     USAGE, ["--before", "2"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before", "now", "1h ago",
                               "--after", "1h ago", "now"], USAGE, ["--before", "empty window"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before", "2h ago",
                               "1h ago", "--after", "yesterday-ish", "now"], USAGE,
     ["--after", "yesterday-ish"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before", "2h ago",
                               "1h ago", "--after", "1h ago", "59m ago"], USAGE,
     ["--after", "at least 2 whole minutes"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "notaurl", "--before", "2h ago",
                               "1h ago", "--after", "1h ago", "now"], USAGE,
     ["--prometheus", "notaurl"]),
    ("sglang-obs", "compare", ["compare", "--before", "2h ago", "1h ago", "--after", "1h ago",
                               "now", "--resamples", "5"], USAGE, ["--resamples"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before", "2h ago",
                               "1h ago", "--after", "1h ago", "now"], FAILURE,
     ["--prometheus", "{dead}", "unreachable"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before", "2h ago",
                               "1h ago", "--after", "1h ago", "now", "--out", "{file}"], FAILURE,
     ["--out", "{file}"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before", "2h ago",
                               "1h ago", "--after", "1h ago", "now", "--out", "{full}"], FAILURE,
     ["--out", "{full}"]),
    # compare from snapshot packs
    ("sglang-obs", "compare", ["compare", "--before", "2h ago", "1h ago", "--before-pack",
                               "{pack}", "--after-pack", "{pack}"], USAGE,
     ["--before-pack", "--before"]),
    ("sglang-obs", "compare", ["compare", "--before-pack", "{pack}"], USAGE,
     ["--after", "--after-pack"]),
    ("sglang-obs", "compare", ["compare", "--before-pack", "{missing}", "--after-pack",
                               "{pack}"], FAILURE, ["--before-pack", "{missing}",
                                                    "no such directory"]),
    ("sglang-obs", "compare", ["compare", "--before-pack", "{pack}", "--after-pack", "{file}"],
     FAILURE, ["--after-pack", "{file}", "is a file"]),
    ("sglang-obs", "compare", ["compare", "--before-pack", "{full}", "--after-pack", "{pack}"],
     FAILURE, ["--before-pack", "{full}", "not a snapshot pack"]),
    ("sglang-obs", "compare", ["compare", "--before-pack", "{oldpack}", "--after-pack",
                               "{pack}"], FAILURE,
     ["--before-pack", "{oldpack}", "windows.json", "take it again with this release"]),
    ("sglang-obs", "compare", ["compare", "--before-pack", "{pack}", "--after-pack", "{pack}",
                               "--instance", "nope:1"], FAILURE,
     ["--instance", "unknown instance nope:1", "sglang:30000"]),
    ("sglang-obs", "compare", ["compare", "--prometheus", "{dead}", "--before-pack", "{pack}",
                               "--after", "2h ago", "1h ago"], FAILURE,
     ["--prometheus", "{dead}"]),
    # capacity
    ("sglang-obs", "capacity", ["capacity", "--from", "yesterday"], USAGE,
     ["--from", "yesterday"]),
    ("sglang-obs", "capacity", ["capacity", "--prometheus", "{dead}"], USAGE, ["--from"]),
    ("sglang-obs", "capacity", ["capacity", "--prometheus", "{dead}", "--pack", "{pack}"],
     USAGE, ["--pack", "--prometheus"]),
    ("sglang-obs", "capacity", ["capacity", "--prometheus", "{dead}", "--from", "1h ago"],
     FAILURE, ["--prometheus", "{dead}"]),
    ("sglang-obs", "capacity", ["capacity", "--pack", "{missing}"], FAILURE,
     ["--pack", "{missing}", "no such directory"]),
    ("sglang-obs", "capacity", ["capacity", "--pack", "{oldpack}"], FAILURE,
     ["--pack", "{oldpack}", "capacity.json", "take it again with this release"]),
    # sglang-sim
    ("sglang-sim", None, ["no-such-command"], USAGE, ["no-such-command"]),
    ("sglang-sim", "serve", ["serve", "--port", "http"], USAGE, ["--port", "http"]),
    ("sglang-sim", "serve", ["serve", "--speed", "fast"], USAGE, ["--speed"]),
    ("sglang-sim", "serve", ["--scenario", "no-such-scenario"], USAGE,
     ["--scenario", "no-such-scenario"]),
    ("sglang-sim", "serve", ["serve", "--release", "9.9"], USAGE, ["--release"]),
    ("sglang-sim", "serve", ["serve", "--log-file", "{dir}"], FAILURE, ["--log-file", "{dir}"]),
    ("sglang-sim", "serve", ["serve", "--log-file", "/proc/nope/sim.log"], FAILURE,
     ["--log-file", "/proc/nope"]),
    ("sglang-sim", "serve", ["serve", "--port", "{busy}"], FAILURE, ["--port", "{busy}"]),
    ("sglang-sim", "render", ["render", "--scenario", "healthy"], USAGE, ["--out"]),
    ("sglang-sim", "render", ["render", "--out", "{tmp}/r", "--step", "0s"], USAGE, ["--step"]),
    ("sglang-sim", "render", ["render", "--out", "{tmp}/r", "--format", "pdf"], USAGE,
     ["--format", "pdf"]),
    ("sglang-sim", "render", ["render", "--out", "{file}"], FAILURE, ["--out", "{file}"]),
    ("sglang-sim", "render", ["render", "--out", "/proc/nope"], FAILURE, ["--out", "/proc/nope"]),
    ("sglang-sim", "list", ["list", "extra"], USAGE, ["extra"]),
    ("sglang-sim", "pd", ["pd", "--port", "http"], USAGE, ["--port", "http"]),
    ("sglang-sim", "pd", ["pd", "--scenario", "pd-nope"], USAGE, ["--scenario", "pd-nope"]),
    ("sglang-sim", "pd", ["pd", "--start-at", "99999"], USAGE, ["--start-at", "99999"]),
    ("sglang-sim", "pd", ["pd", "--start-at", "-1"], USAGE, ["--start-at", "-1"]),
    ("sglang-sim", "pd", ["pd", "--scenario", "{file}"], USAGE, ["--scenario", "{file}"]),
    ("sglang-sim", "pd", ["pd", "--port", "0", "--gateway-port", "{busy}"], FAILURE,
     ["--gateway-port", "{busy}"]),
    ("sglang-sim", "what-if", ["what-if", "--start", "1h ago", "--end", "now", "--set",
                                "max_running_requests=10"], USAGE, ["--prometheus"]),
    ("sglang-sim", "what-if", ["what-if", "--set", "max_runing_requests=10", *WINDOW], USAGE,
     ["--set", "max_runing_requests", "max_running_requests"]),
    ("sglang-sim", "what-if", ["what-if", "--set", "schedule_policy=random", *WINDOW], USAGE,
     ["--set", "schedule_policy"]),
    ("sglang-sim", "what-if", ["what-if", *WINDOW], USAGE, ["--set"]),
    ("sglang-sim", "what-if", ["what-if", "--current", "gpu_name=H100", *SET, *WINDOW], USAGE,
     ["--current", "gpu_name"]),
    ("sglang-sim", "what-if", ["what-if", "--perf", "decode_s_per_kv_token=fast", *SET, *WINDOW],
     USAGE, ["--perf", "decode_s_per_kv_token"]),
    ("sglang-sim", "what-if", ["what-if", "--start", "yesterday", "--end", "now", *SET,
                                "--prometheus", "{dead}"], USAGE, ["--start", "yesterday"]),
    ("sglang-sim", "what-if", ["what-if", "--start", "now", "--end", "1h ago", *SET,
                                "--prometheus", "{dead}"], USAGE, ["--start", "--end"]),
    ("sglang-sim", "what-if", ["what-if", "--seeds", "0", *SET, *WINDOW], USAGE, ["--seeds"]),
    ("sglang-sim", "what-if", ["what-if", *SET, *WINDOW], FAILURE, ["--prometheus", "{dead}"]),
    ("sglang-sim", "what-if", ["what-if", "--json", "{dir}", *SET, *WINDOW], FAILURE,
     ["--json", "{dir}"]),
    ("sglang-sim", "what-if", ["what-if", "--pack", "{pack}", *SET, *WINDOW], USAGE,
     ["--pack", "--prometheus", "--start", "--end"]),
    ("sglang-sim", "what-if", ["what-if", *SET], USAGE, ["--prometheus", "--pack"]),
    ("sglang-sim", "what-if", ["what-if", "--pack", "{missing}", *SET], FAILURE,
     ["--pack", "{missing}", "no such directory"]),
    ("sglang-sim", "what-if", ["what-if", "--pack", "{full}", *SET], FAILURE,
     ["--pack", "{full}", "not a snapshot pack"]),
    ("sglang-sim", "what-if", ["what-if", "--pack", "{oldpack}", *SET], FAILURE,
     ["--pack", "{oldpack}", "load.json", "take it again with this release"]),
    ("sglang-sim", "what-if", ["what-if", "--pack", "{pack}", "--instance", "nope:1", *SET],
     FAILURE, ["--instance", "unknown instance nope:1", "sglang:30000"]),
    ("sglang-sim", "what-if", ["what-if", "--pack", "{pack}", *SET], FAILURE,
     ["snapshot pack {pack}", "no requests in the window"]),
    # sglang-exporter (an SGLang that does not answer is not an error: it is reported as down)
    ("sglang-exporter", None, [], USAGE, ["--sglang.url"]),
    ("sglang-exporter", None, ["--no-such-flag"], USAGE, ["--no-such-flag"]),
    ("sglang-exporter", None, ["--sglang.url", "localhost:30000"], USAGE, ["--sglang.url"]),
    ("sglang-exporter", None, ["--sglang.url", "http://127.0.0.1:1", "--sglang.poll-interval",
                               "soon"], USAGE, ["--sglang.poll-interval"]),
    ("sglang-exporter", None, ["--sglang.url", "http://127.0.0.1:1", "--web.listen-address",
                               "nonsense"], USAGE, ["--web.listen-address"]),
    ("sglang-exporter", None, ["--sglang.url", "http://127.0.0.1:1", "--sglang.api-key-file",
                               "{dir}"], FAILURE, ["--sglang.api-key-file", "{dir}"]),
    ("sglang-exporter", None, ["--sglang.url", "http://127.0.0.1:1", "--sglang.api-key-file",
                               "{missing}"], FAILURE, ["--sglang.api-key-file", "{missing}"]),
    ("sglang-exporter", None, ["--sglang.url", "http://127.0.0.1:1", "--web.listen-address",
                               "127.0.0.1:{busy}"], FAILURE, ["--web.listen-address", "{busy}"]),
]


def _id(row):
    prog, sub, args, code, _ = row
    return f"{prog}:{sub or '-'}:{' '.join(args)[:60]}:{code}"


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli-errors")
    (base / "file").write_text("not a directory\n")
    (base / "dir").mkdir()
    (base / "full").mkdir()
    (base / "full" / "report.md").write_text("an earlier pack\n")
    data = gzip.compress(LOG.read_bytes())
    (base / "cut.log.gz").write_bytes(data[: len(data) // 2])
    for name in ("pack", "oldpack"):  # summary.json's content is not read
        (base / name).mkdir()
        (base / name / pack.SUMMARY).write_text("{}\n")
    server = "sglang:30000"
    window = {"start": 0.0, "end": 600.0}
    pack.write(base / "pack", pack.WINDOWS, {
        "schema_version": pack.SCHEMA_VERSION, "window": window,
        "servers": {server: WindowData(server, 0.0, 600.0, units={}).to_dict()}})
    pack.write(base / "pack", pack.LOAD, {
        "schema_version": pack.SCHEMA_VERSION, "window": {**window, "step_seconds": 15.0},
        "servers": {server: {"series": [{"name": n, "agg": a, "by": b, "values": {}}
                                        for n, a, b in pack.LOAD_SERIES],
                             "info": dict.fromkeys(pack.LOAD_INFO)}}})
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    yield {"file": str(base / "file"), "dir": str(base / "dir"), "full": str(base / "full"),
           "missing": str(base / "missing"), "busy": str(busy.getsockname()[1]),
           "dead": f"http://127.0.0.1:{free_port()}", "gz": str(base / "cut.log.gz"),
           "log": str(LOG), "base": base, "pack": str(base / "pack"),
           "oldpack": str(base / "oldpack")}
    busy.close()


def _run(row, places, n):
    prog, _, args, _, names = row
    tmp = places["base"] / f"run{n}"
    tmp.mkdir()
    fill = {**places, "tmp": str(tmp)}
    argv = [a.format(**fill) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_OBS_")}
    result = subprocess.run([str(BIN / prog), *argv], capture_output=True, text=True,
                            timeout=60, env=env, stdin=subprocess.DEVNULL)
    return result, [n.format(**fill) for n in names], tmp


@pytest.fixture(scope="module")
def results(places):
    """Every row's run, four at a time (each is a process that mostly waits on imports)."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {_id(row): pool.submit(_run, row, places, n) for n, row in enumerate(TABLE)}
        return {key: f.result() for key, f in futures.items()}


@pytest.mark.parametrize("row", TABLE, ids=[_id(r) for r in TABLE])
def test_a_bad_argument_gives_one_line_naming_it(row, results):
    _, _, _, code, _ = row
    result, names, _ = results[_id(row)]
    output = result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in output, output
    assert len(lines) == 1, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert len(lines[0]) <= 400, lines[0]


def test_a_simulator_that_cannot_listen_never_announced_itself(results):
    row = next(r for r in TABLE if r[1] == "serve" and "{busy}" in r[2])
    result, _, _ = results[_id(row)]
    assert "ready to roll" not in result.stdout  # the simulated SGLang's "ready" line
    assert result.stdout == ""


def test_a_failed_compare_leaves_no_folder_behind(places):
    tmp = places["base"] / "compare-out"
    result = subprocess.run([str(BIN / "sglang-obs"), "compare", "--prometheus", places["dead"],
                             "--before", "2h ago", "1h ago", "--after", "1h ago", "now",
                             "--out", str(tmp)], capture_output=True, text=True, timeout=60)
    assert result.returncode == FAILURE, result.stderr
    assert not tmp.exists()


def test_a_failed_snapshot_leaves_no_folder_behind(results):
    row = next(r for r in TABLE if r[1] == "snapshot" and r[3] == FAILURE
               and "{tmp}/p" in r[2] and "--alerts-log" not in r[2])
    _, _, tmp = results[_id(row)]
    assert not (tmp / "p").exists()


def _subcommands(parser: argparse.ArgumentParser) -> set:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name for a in actions for name in a.choices} or {None}


def test_the_table_covers_every_subcommand():
    defined = ({("sglang-obs", s) for s in _subcommands(obs_parser())}
               | {("sglang-sim", s) for s in _subcommands(sim_parser())}
               | {("sglang-exporter", s) for s in _subcommands(exporter_parser())})
    assert ("sglang-obs", "snapshot") in defined
    assert ("sglang-sim", "render") in defined
    rows = {(prog, sub) for prog, sub, *_ in TABLE}
    assert not defined - rows, f"no row for {sorted(defined - rows, key=str)}"
    usage = {(prog, sub) for prog, sub, _, code, _ in TABLE if code == USAGE}
    failure = {(prog, sub) for prog, sub, _, code, _ in TABLE if code == FAILURE}
    # every subcommand has a usage error; every one that reads or writes something a failure
    assert not defined - usage, sorted(defined - usage, key=str)
    assert not (defined - {("sglang-sim", "list"), ("sglang-obs", "detection")}) - failure


# -- choosing the server: compare (windows and packs) and what-if share one rule ----------------
@pytest.mark.parametrize(("servers", "instance", "message"), [
    ([], None, "--instance: no servers in this window"),
    (["a:1", "b:2"], None, "--instance: 2 servers in this window (a:1, b:2): name one"),
    (["a:1"], "c:3", "--instance: unknown instance c:3; servers in this window: a:1"),
])
def test_a_server_that_cannot_be_chosen_is_one_line_naming_the_flag(servers, instance, message):
    with pytest.raises(cli_support.Failure) as err:
        pack.pick_server(servers, instance, "--instance", "this window")
    assert str(err.value) == message


def test_the_only_server_or_the_named_one_is_chosen():
    assert pack.pick_server(["a:1"], None, "--instance", "this window") == "a:1"
    assert pack.pick_server(["a:1", "b:2"], "b:2", "--instance", "this window") == "b:2"
