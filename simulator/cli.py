"""`sglang-sim`: serve a simulated SGLang server, or render a scenario's series.

    sglang-sim --scenario long-context-incident --port 30000
    sglang-sim render --scenario long-context-incident --out /tmp/series
    sglang-sim list
    sglang-sim pd --scenario pd-healthy --port 30000 --gateway-port 29000   (a PD deployment)
    sglang-sim what-if --prometheus URL --start T --end T --set max_running_requests=10
    sglang-sim what-if --pack DIR --set max_running_requests=10   (a sglang-obs snapshot pack)

Errors are one line on stderr: exit 2 when the command line is wrong, 1 when the command
failed (sglang_obs.core.cli_support).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import sys
import textwrap
import time
from pathlib import Path

from sglang_obs.core import settings
from sglang_obs.core.cli_support import (
    Failure,
    OneLineParser,
    UsageError,
    folder,
    http_url,
    output_file,
    positive,
    quiet_broken_pipe,
    report,
)
from sglang_obs.core.sglang import SGLANG_PORT
from sglang_obs.simulator import pd_scenario as pd_scenarios
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.model import PerfModel
from sglang_obs.simulator.pd_render import GATEWAY_PORT
from sglang_obs.simulator.profiles import ALIASES, profile
from sglang_obs.simulator.records import RecordFiles, RecordSink
from sglang_obs.simulator.render import render, write_openmetrics, write_promtool_series
from sglang_obs.simulator.server import LogSink, SimServer
from sglang_obs.simulator.simulation import Simulation

log = logging.getLogger("sglang_obs.simulator")


def _duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            value = float(text[: -len(unit)]) * units[unit]
            break
    else:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a duration: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="healthy",
                        help="shipped scenario name (see `sglang-sim list`) or a YAML file path")
    parser.add_argument("--release", choices=sorted(ALIASES),
                        help="SGLang release profile (default: the scenario's)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0-65535): {text!r}")
    return int(text)


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="sglang-sim",
        description="A simulated SGLang server: /metrics, status endpoints and scheduler logs "
        "driven by a scheduler model replaying a scenario. No GPU, no model.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve in real time (the default command)")
    _common(serve)
    serve.add_argument("--host", default="127.0.0.1", help="listen host (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=SGLANG_PORT,
                       help=f"listen port (default {SGLANG_PORT}; 0: any free one)")
    serve.add_argument("--speed", type=positive(float, 0, inclusive=True), default=1.0,
                       help="simulated seconds per wall second (default 1)")
    serve.add_argument("--metrics-escaping", choices=["negotiate", "colon"], default="negotiate",
                       help="negotiate: as prometheus_client >= 0.23 (sglang_ names for an "
                       "OpenMetrics scraper without allow-utf-8); colon: always sglang: names")
    serve.add_argument("--log-file", type=Path,
                       help="also append scheduler log lines to this file")
    serve.add_argument("--no-stdout-log", action="store_true",
                       help="do not print scheduler log lines on stdout")
    serve.add_argument("--request-metrics-dir", type=Path, metavar="DIR",
                       help="also write per-request records into DIR as SGLang's "
                       "--export-metrics-to-file does (hourly sglang-request-metrics-"
                       "YYYYMMDD_HH.log files; releases 0.5.6+)")
    serve.add_argument("--gpu-feed", action="store_true",
                       help="serve the scenario's simulated GPU readings at /sim/gpu (for the "
                       "exporter's simulator-only NVML source)")
    serve.add_argument("--gpu-feed-port", type=int, metavar="PORT",
                       help="also serve /sim/gpu on this port, open through the scenario's "
                       "crashes (NVML outlives SGLang)")
    serve.add_argument("--start-at", type=positive(float, 0, inclusive=True), default=0.0,
                       metavar="SECONDS",
                       help="start this far into the scenario (the model runs up to it first)")
    serve.add_argument("--once", action="store_true",
                       help="stop after one pass through the scenario instead of looping")

    rend = sub.add_parser("render", help="write the scenario's series, faster than real time")
    _common(rend)
    rend.add_argument("--out", type=Path, required=True, help="output folder")
    rend.add_argument("--step", type=_duration,
                      help="scrape interval of the rendered series (default: prometheus.yml's "
                      "scrape_interval)")
    rend.add_argument("--poll-interval", type=_duration, default=5.0,
                      help="exporter poll interval in simulated time (default 5s)")
    rend.add_argument("--start", type=float,
                      help="unix time of the first sample (default: so the last one is now)")
    rend.add_argument("--instance", default="sglang:30000",
                      help="instance label of the simulated server (default sglang:30000)")
    rend.add_argument("--request-metrics-dir", type=Path, metavar="DIR",
                      help="also write the scenario's per-request records into DIR as SGLang's "
                      "hourly files (releases 0.5.6+)")
    rend.add_argument("--format", default="openmetrics,promtool",
                      help="comma list of openmetrics, promtool, log (default "
                      "openmetrics,promtool)")

    sub.add_parser("list", help="list the shipped scenarios")

    pd = sub.add_parser("pd", help="serve a prefill/decode deployment and its gateway in real "
                        "time (docs/simulator.md, PD)")
    pd.add_argument("--scenario", default="pd-healthy",
                    help="shipped PD scenario (pd-*, see `sglang-sim list`) or a YAML file path")
    pd.add_argument("--host", default="127.0.0.1", help="listen host (default 127.0.0.1)")
    pd.add_argument("--port", type=_port, default=SGLANG_PORT,
                    help=f"the first engine's port (default {SGLANG_PORT}): the prefill servers "
                    "on PORT, PORT+1, ..., then the decode servers; 0: any free ones")
    pd.add_argument("--gateway-port", type=_port, default=GATEWAY_PORT,
                    help=f"the gateway's metrics port (default {GATEWAY_PORT}; 0: any free one)")
    pd.add_argument("--speed", type=positive(float, 0), default=1.0,
                    help="simulated seconds per wall second (default 1)")
    pd.add_argument("--loop", action="store_true",
                    help="repeat the timeline instead of stopping after one pass")
    pd.add_argument("--start-at", type=positive(float, 0, inclusive=True), default=0.0,
                    metavar="SECONDS",
                    help="start this far into the scenario (the model runs up to it first)")
    pd.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])

    what = sub.add_parser(
        "what-if", help="replay a window's estimated load under the current and proposed "
        "server arguments (a model prediction)")
    what.add_argument("--prometheus", type=http_url, metavar="URL",
                      help="the Prometheus that holds the window (recording rules not needed)")
    what.add_argument("--start", metavar="TIME",
                      help="window start: now, '30m ago', a Unix timestamp or an ISO time")
    what.add_argument("--end", metavar="TIME", help="window end (same forms)")
    what.add_argument("--pack", metavar="DIR",
                      help="instead of --prometheus/--start/--end: the window of a "
                      "`sglang-obs snapshot` pack (its load.json)")
    what.add_argument("--instance", metavar="HOST:PORT",
                      help="the SGLang server (needed when the window or pack holds several)")
    what.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                      dest="proposed", help="a proposed server argument (repeat), e.g. "
                      "max_running_requests=10 schedule_policy=lpm")
    what.add_argument("--current", action="append", default=[], metavar="NAME=VALUE",
                      help="a current argument no series shows (e.g. "
                      "num_continuous_decode_steps=2); overrides the series' too")
    what.add_argument("--perf", action="append", default=[], metavar="NAME=VALUE",
                      help="the hardware's timings in the model (docs/simulator.md perf.*), "
                      "e.g. decode_s_per_kv_token=6e-8")
    what.add_argument("--seeds", type=positive(int, 1, inclusive=True), default=5,
                      help="draws of the estimated load (default 5): each figure's spread")
    what.add_argument("--step", type=_duration,
                      help="query step (default: prometheus.yml's scrape_interval; a pack has "
                      "its own)")
    what.add_argument("--json", type=Path, metavar="FILE",
                      help="also write the prediction as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")  # `sglang-sim --scenario X` serves
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _command(args)
    except Failure as err:
        return report(f"sglang-sim {args.command}", err)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `sglang-sim list | head`
        return quiet_broken_pipe()


def _command(args: argparse.Namespace) -> int:
    if args.command == "list":
        _list()
        return 0
    if args.command == "what-if":
        return _what_if(args)
    if args.command == "pd":
        return _pd(args)
    logging.basicConfig(level=args.log_level.upper(),
                        format="ts=%(asctime)s level=%(levelname)s msg=%(message)s",
                        stream=sys.stderr)
    try:
        sc = scenarios.load(args.scenario)
    except scenarios.ScenarioError as err:
        raise UsageError(f"--scenario: {err}") from None
    if args.command == "render":
        return _render(args, sc)
    return _serve(args, sc)


def describe(name: str, text: str, column: int, width: int) -> str:
    """`name`, then its scenario description from `column` on, wrapped on word boundaries to
    `width` columns (continuation lines indented to `column`): nothing is cut."""
    body = textwrap.fill(" ".join(text.split()), width=width, initial_indent=" " * column,
                         subsequent_indent=" " * column, break_long_words=False,
                         break_on_hyphens=False)
    return f"{name:{column}}{body[column:]}"


def _list() -> None:
    names = scenarios.available() + pd_scenarios.available() + scenarios.pool_scenarios()
    column = max(map(len, names)) + 2
    width = max(shutil.get_terminal_size((100, 20)).columns, column + 40) - 1
    for name in names:
        sc = pd_scenarios.load(name) if name in pd_scenarios.available() else scenarios.load(name)
        print(describe(name, sc.description, column, width))


def _pd(args) -> int:
    """`sglang-sim pd`: every engine and the gateway of a PD scenario, on one clock."""
    from sglang_obs.simulator.pd import Deployment
    from sglang_obs.simulator.pd_exposition import PdServer

    logging.basicConfig(level=args.log_level.upper(),
                        format="ts=%(asctime)s level=%(levelname)s msg=%(message)s",
                        stream=sys.stderr)
    try:
        sc = pd_scenarios.load(args.scenario)
    except scenarios.ScenarioError as err:
        raise UsageError(f"--scenario: {err}") from None
    if args.start_at >= sc.duration and not args.loop:
        raise UsageError(f"--start-at: {args.start_at:g} s is past the scenario's end "
                         f"({sc.duration:g} s)")
    engines = [f"prefill-{i}" for i in range(sc.prefill.count)] + \
              [f"decode-{i}" for i in range(sc.decode.count)]
    if args.port and args.port + len(engines) - 1 > 65535:
        raise UsageError(f"--port: {len(engines)} engines from {args.port} run past 65535")
    server = PdServer(args.host, [args.port + i if args.port else 0 for i in range(len(engines))],
                      args.gateway_port, speed=args.speed)
    try:
        bound = server.bind()
    except OSError as err:
        flag = "--gateway-port" if err.port == args.gateway_port else "--port"
        raise Failure(f"{flag} {err.port}: cannot listen on {args.host}:{err.port} "
                      f"({err.strerror or err})") from None
    dep = Deployment(sc, start_ts=time.time() - args.start_at, loop=args.loop,
                     instances={name: f"{args.host}:{port}"
                                for name, port in zip(engines, bound[:-1], strict=True)})
    if args.start_at > 0:
        dep.advance(args.start_at)
    server.start(dep)
    for name, port in zip([*engines, "gateway"], bound, strict=True):
        log.info("serving %s of PD scenario %s (SGLang %s) on http://%s:%s", name, sc.name,
                 dep.profile.release, args.host, port)
    try:
        while args.loop or dep.t < sc.duration:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def _serve(args, sc) -> int:
    streams = [] if args.no_stdout_log else [sys.stdout]
    log_file = None
    if args.log_file:
        output_file("--log-file", args.log_file)
        try:
            log_file = args.log_file.open("a")
        except OSError as err:
            raise Failure(f"--log-file {args.log_file}: cannot open it "
                          f"({err.strerror or err})") from None
        streams.append(log_file)
    release = args.release or sc.release
    # The simulated server's own log lines (its "ready" line among them) wait until the port is
    # bound: a server that cannot listen must not have announced itself.
    sink = LogSink(ALIASES[release], sc.server.tp_size, sc.server.dp_size, [])
    held = _ListStream([])
    sink.streams = [held]
    start_ts = time.time() - args.start_at
    records = _record_files(args, sc)
    on_request = (RecordSink(profile(release), sc.server, start_ts, sc.seed, [records.write])
                  if records else None)
    sim = Simulation(sc, release, start_ts=start_ts, on_event=sink, loop=not args.once,
                     on_request=on_request)
    if args.start_at > 0:
        sim.advance(args.start_at)
    server = SimServer(sim, args.host, args.port, speed=args.speed,
                       metrics_escaping=args.metrics_escaping, gpu_feed=args.gpu_feed,
                       gpu_feed_port=args.gpu_feed_port)
    try:
        server.start()
    except OSError as err:
        if log_file:
            log_file.close()
        raise Failure(f"--port {args.port}: cannot listen on {args.host}:{args.port} "
                      f"({err.strerror or err})") from None
    with server.lock:  # the ticker may be writing already
        for stream in streams:
            stream.write("".join(held.lines))
            stream.flush()
        sink.streams = streams
    log.info("serving scenario %s as SGLang %s on http://%s:%s", sc.name, sim.profile.release,
             args.host, server.port)
    try:
        while not args.once or sim.t < sc.duration:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if log_file:
            log_file.close()
        if records:
            records.close()
    return 0


def _record_files(args, sc) -> RecordFiles | None:
    """--request-metrics-dir as the release allows: a usage error where it has no records."""
    if not args.request_metrics_dir:
        return None
    release = profile(args.release or sc.release)
    if release.request_records is None:
        raise UsageError(f"--request-metrics-dir: SGLang {release.release} writes no request "
                         "records (--export-metrics-to-file is 0.5.6+); give --release 0.5.12 "
                         "or 0.5.23")
    try:
        return RecordFiles(args.request_metrics_dir)
    except OSError as err:
        raise Failure(f"--request-metrics-dir {args.request_metrics_dir}: "
                      f"{err.strerror or err}") from None


def _render(args, sc) -> int:
    formats = {f.strip() for f in args.format.split(",") if f.strip()}
    unknown = formats - {"openmetrics", "promtool", "log"}
    if unknown or not formats:
        raise UsageError(f"--format: unknown {', '.join(sorted(unknown)) or '(empty)'}; "
                         "a comma list of openmetrics, promtool, log")
    out = folder("--out", args.out)
    args.step = args.step or settings.default().scrape_interval_s
    start = args.start
    if start is None:  # end at the last full step before now, so a backfill is in retention
        start = (time.time() // args.step) * args.step - sc.duration
    lines: list[str] = []
    sink = None
    if "log" in formats:
        release = args.release or sc.release
        sink = LogSink(ALIASES[release], sc.server.tp_size, sc.server.dp_size, [])
        sink.streams = [_ListStream(lines)]
    records = _record_files(args, sc)  # refused early on a release without records
    if records:
        records.close()
    rendered = render(sc, args.release, start=start, step=args.step,
                      poll_interval=args.poll_interval, instance=args.instance, on_event=sink,
                      request_metrics_dir=args.request_metrics_dir)
    written = []
    try:
        if "openmetrics" in formats:
            path = out / f"{sc.name}.om.txt"
            write_openmetrics(rendered, path)
            written.append(path)
        if "promtool" in formats:
            path = out / f"{sc.name}.promtool.yml"
            write_promtool_series(rendered, path)
            written.append(path)
        if "log" in formats:
            path = out / f"{sc.name}.log"
            path.write_text("".join(lines))
            written.append(path)
    except OSError as err:
        raise Failure(f"--out {out}: cannot write {err.filename or 'a file'} "
                      f"({err.strerror or err})") from None
    print(f"{sc.name}: {len(rendered.series)} series x {rendered.steps} steps of "
          f"{args.step:g}s from {start:.0f}")
    for path in written:
        print(f"  {path}")
    if args.request_metrics_dir:
        print(f"  {args.request_metrics_dir}/sglang-request-metrics-*.log")
    return 0


def _what_if(args) -> int:
    from sglang_obs.core.prometheus_api import Prometheus, PrometheusError
    from sglang_obs.core.times import iso, parse_time
    from sglang_obs.simulator import what_if

    window = {"--prometheus": args.prometheus, "--start": args.start, "--end": args.end,
              "--step": args.step}
    if args.pack is not None:
        given = [flag for flag, value in window.items() if value is not None]
        if given:
            raise UsageError(f"--pack: not allowed with {', '.join(given)} (the pack holds "
                             "its window)")
    elif None in (args.prometheus, args.start, args.end):
        missing = [flag for flag, value in window.items() if value is None and flag != "--step"]
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or "
                         "--pack DIR)")
    proposed = what_if.parse_assignments("--set", args.proposed)
    if not proposed:
        raise UsageError("--set: give at least one proposed argument, e.g. --set "
                         "max_running_requests=10")
    current = what_if.parse_assignments("--current", args.current)
    perf_names = tuple(f.name for f in dataclasses.fields(PerfModel))
    perf = what_if.parse_assignments("--perf", args.perf, PerfModel, perf_names)
    what_if.check_args("--set", proposed)
    what_if.check_args("--current", current)
    if any(v <= 0 for k, v in perf.items() if k != "prefill_batches_before_decode") or \
            perf.get("prefill_batches_before_decode", 1) < 1:
        raise UsageError("--perf: timings must be positive")
    if args.pack is None:
        now = time.time()
        start, end = parse_time(args.start, now, "--start"), parse_time(args.end, now, "--end")
        if end <= start:
            raise UsageError(f"empty window: --start {iso(start)} is not before --end "
                             f"{iso(end)}")
    json_path = output_file("--json", args.json) if args.json else None
    if args.pack is not None:
        est = what_if.estimate(what_if.PackSource(args.pack, args.instance))
    else:
        try:
            source = what_if.PrometheusSource(Prometheus(args.prometheus), start, end,
                                              args.instance, args.step)
            est = what_if.estimate(source)
        except PrometheusError as err:
            raise Failure(f"--prometheus: {err}") from None
    rep = what_if.replay(est, current, proposed, perf, args.seeds)
    sys.stdout.write(what_if.markdown(est, rep, current, proposed))
    if json_path:
        try:
            json_path.write_text(what_if.to_json(what_if.document(est, rep, current,
                                                                  proposed)))
        except OSError as err:
            raise Failure(f"--json {json_path}: cannot write it ({err.strerror or err})") \
                from None
    return 0


class _ListStream:
    def __init__(self, lines: list[str]):
        self.lines = lines

    def write(self, text: str) -> None:
        self.lines.append(text)

    def flush(self) -> None:
        pass
