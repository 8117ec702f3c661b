"""`sglang-obs`: the stack's own commands.

    sglang-obs alert-sink [--listen 127.0.0.1:9095] [--log-file alerts.jsonl] [--timeout S]
    sglang-obs rules [--check]          regenerate prometheus/rules (and docs/runbooks.md's blocks)
    sglang-obs detection [SCENARIO...]  regenerate docs/detection.md
    sglang-obs kubernetes [--check] [--out DIR]   regenerate deploy/kubernetes (docs/kubernetes.md)
    sglang-obs analyze-log FILE... [--json] [--csv-per-minute OUT]
    sglang-obs analyze-requests FILE|DIR... [--json] [--csv OUT] [--top N]
    sglang-obs render-dashboard --scenario NAME [--dashboard NAME|JSON...] --out PNG|DIR
    sglang-obs stack up --native [--demo SCENARIO...] [--sglang-url URL...] [--override FILE]
    sglang-obs stack up --native --fleet N [--demo]   (= sglang-obs fleet up N [--demo])
    sglang-obs fleet shipper-config --cluster C --host H --write-url URL [--flavour F]
    sglang-obs snapshot --prometheus URL --from T --to T [--instance I...] --out DIR
                        [--request-metrics-dir DIR]
    sglang-obs compare --prometheus URL --before T T --after T T [--instance I]
                       [--after-instance J] [--paired] [--out DIR]
                       (--before-pack DIR / --after-pack DIR: a side from a snapshot pack)
    sglang-obs capacity --from T --to T [--prometheus URL | --pack DIR] [--server I...] [--json]

Errors are one line on stderr: exit 2 when the command line is wrong, 1 when the command
failed (sglang_obs.core.cli_support).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

from sglang_obs.core import config_dir, settings
from sglang_obs.core.cli_support import (
    Failure,
    OneLineParser,
    UsageError,
    http_url,
    input_file,
    output_file,
    positive,
    quiet_broken_pipe,
    reason,
    report,
)
from sglang_obs.core.sglang import EXPORTER_ADDRESS
from sglang_obs.tools.charts import MissingExtra

PROG = "sglang-obs"


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host or "0.0.0.0", int(port)  # the compose service listens on all


def _port_pin(text: str) -> tuple[str, int]:
    name, sep, port = text.partition("=")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected PART=PORT (e.g. alertmanager=19093), got "
                                         f"{text!r}")
    return name, int(port)


def _count(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 10000, got {text!r}")
    return int(text)


def _positive(text: str) -> int:
    """A fleet has at least one host and one cluster."""
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"expected a number from 1 to 10000, got {text!r}")
    return int(text)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config-dir", metavar="DIR",
        help="folder with prometheus/, alertmanager/ and grafana/ (default: the checkout's, else "
        f"the installed copy) [env {config_dir.ENV}]")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sink = sub.add_parser("alert-sink", help="log the alerts Alertmanager sends (demo, tests)")
    sink.add_argument("--listen", type=_listen, default=("127.0.0.1", 9095),
                      help="host:port to listen on (default 127.0.0.1:9095)")
    sink.add_argument("--log-file", help="also append one JSON line per alert to this file")
    sink.add_argument("--log-file-max-bytes", type=positive(int, 4096, inclusive=True),
                      default=10 * 1024 * 1024, metavar="BYTES",
                      help="rotate the log file past this size (10 MiB; at least 4096)")
    sink.add_argument("--log-file-backups", type=positive(int, 0, inclusive=True), default=2,
                      metavar="N", help="rotated log files kept, FILE.1 to FILE.N (2)")
    sink.add_argument("--timeout", type=positive(float), default=10.0, metavar="SECONDS",
                      help="a connection's time to send its request (10)")
    rules = sub.add_parser(
        "rules", help="regenerate prometheus/rules/*.yml from thresholds.yml, and in a checkout "
        "the blocks of docs/runbooks.md that quote them")
    rules.add_argument("--check", action="store_true", help="fail if any of them is stale")
    kube = sub.add_parser(
        "kubernetes", help="regenerate deploy/kubernetes/ (PrometheusRules, PodMonitors, "
        "AlertmanagerConfig, dashboard ConfigMaps) from the configuration folder")
    kube.add_argument("--check", action="store_true", help="fail if any file is stale")
    kube.add_argument("--out", metavar="DIR",
                      help="write here instead of the checkout's deploy/kubernetes")
    detection = sub.add_parser("detection", help="regenerate docs/detection.md")
    detection.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                           help="only these (printed, not written)")
    analyze = sub.add_parser(
        "analyze-log", help="the evidence in saved SGLang scheduler logs (plain or gzipped)")
    analyze.add_argument("files", nargs="+", metavar="FILE", help="log files, oldest first")
    analyze.add_argument("--json", action="store_true",
                         help="print a machine-readable document (docs/log-analysis.md)")
    analyze.add_argument("--csv-per-minute", metavar="OUT",
                         help="write a per-minute CSV table to this file")
    requests = sub.add_parser(
        "analyze-requests", help="latency by prompt length and the slowest requests, from "
        "SGLang's --export-metrics-to-file records (plain or gzipped, or their directory)")
    requests.add_argument("files", nargs="+", metavar="FILE",
                          help="record files, oldest first, or a directory of hourly files")
    requests.add_argument("--json", action="store_true",
                          help="print a machine-readable document (docs/request-records.md)")
    requests.add_argument("--csv", metavar="OUT", help="write a per-minute CSV table by class")
    requests.add_argument("--top", type=_count, default=10, metavar="N",
                          help="how many of the slowest requests to list (10)")
    render = sub.add_parser(
        "render-dashboard", help="draw a dashboard's panels for a simulator scenario (PNG)")
    render.add_argument("--scenario", required=True, help="simulator scenario name or YAML")
    render.add_argument("--dashboard", action="append", metavar="NAME|JSON",
                        help="a dashboard's uid or name (sglang-latency, latency) or a generated "
                        "dashboard JSON; repeat for several (default: the overview; with a "
                        "folder as --out, every dashboard)")
    render.add_argument("--out", required=True, metavar="PNG|DIR",
                        help="the PNG file to write, or a folder (an existing one, or a path "
                        "ending in /) that gets one PNG per dashboard, named by its uid")
    stack = sub.add_parser("stack", help="run the stack without Docker (Debian binaries)")
    stack.add_argument("action", choices=["up"])
    stack.add_argument("--native", action="store_true", required=True,
                       help="use local binaries: prometheus, prometheus-alertmanager")
    stack.add_argument("--demo", nargs="*", metavar="SCENARIO",
                       help="serve these simulator scenarios (default long-context-incident)")
    stack.add_argument("--sglang-url", action="append", type=http_url, metavar="URL",
                       help="a real SGLang server to watch")
    stack.add_argument("--override", metavar="FILE",
                       help="YAML whose `global:` replaces prometheus.yml's, e.g. "
                       "prometheus/override.fast.yml")
    stack.add_argument("--dir", help="working folder for configs, data and logs (default: a new "
                       "sglang-obs-* folder in the temporary folder, kept after a stop)")
    stack.add_argument("--free-ports", action="store_true",
                       help="pick free ports instead of 9090/9093/9095/9840/30000")
    stack.add_argument("--port", action="append", type=_port_pin, metavar="PART=PORT",
                       help="this port for one part (prometheus, alertmanager, alert-sink, "
                       "exporter, sglang-sim-0, ...); repeatable")
    stack.add_argument("--fleet", type=_positive, metavar="N",
                       help="instead: N simulated hosts shipping into a central VictoriaMetrics "
                       "with vmalert (sglang-obs fleet up N; --demo: the first host replays "
                       "the long-context incident)")
    stack.add_argument("--clusters", type=_positive,
                       help="with --fleet: clusters, at most N (default 2, or 1 for one host)")
    fleet = sub.add_parser("fleet", help="many hosts into one store (docs/fleet.md)")
    fleet_sub = fleet.add_subparsers(dest="fleet_command", required=True)
    fleet_up = fleet_sub.add_parser(
        "up", help="N simulated hosts (simulator, exporter, vmagent) and the central side "
        "(VictoriaMetrics, vmalert, Alertmanager, alert sink), native binaries")
    fleet_up.add_argument("fleet", type=_positive, metavar="N", help="hosts")
    fleet_up.add_argument("--clusters", type=_positive,
                          help="clusters, at most N (default 2, or 1 for one host)")
    fleet_up.add_argument("--demo", action="store_true",
                          help="the first host replays the long-context incident")
    fleet_up.add_argument("--dir", help="working folder for configs, data and logs")
    ship = fleet_sub.add_parser(
        "shipper-config", help="print one host's shipper configuration, generated from "
        "prometheus.yml")
    ship.add_argument("--flavour", choices=["vmagent", "prometheus-agent"], default="vmagent")
    ship.add_argument("--cluster", required=True)
    ship.add_argument("--host", required=True, help="the host's name (its `host` label)")
    ship.add_argument("--write-url", default="http://victoriametrics:8428/api/v1/write",
                      help="the central store's remote-write URL (Prometheus agent only)")
    ship.add_argument("--exporter", default=EXPORTER_ADDRESS, help="the exporter's address")
    ship.add_argument("--self-address", help="where the shipper's own /metrics is")
    flags = fleet_sub.add_parser("shipper-flags", help="print vmagent's flags for one host")
    flags.add_argument("--config", default="/etc/vmagent/vmagent.yml")
    flags.add_argument("--write-url", default="http://victoriametrics:8428/api/v1/write")
    flags.add_argument("--buffer-dir", default="/vmagent-buffer")
    flags.add_argument("--listen", default=":8429")
    snap = sub.add_parser("snapshot", help="an evidence pack for a time window (CSV, JSON, "
                          "report, charts)")
    snap.add_argument("--prometheus", type=http_url, default="http://127.0.0.1:9090",
                      metavar="URL", help="Prometheus URL (default http://127.0.0.1:9090)")
    snap.add_argument("--alertmanager", type=http_url, metavar="URL",
                      help="Alertmanager URL: which alerts it holds (optional)")
    snap.add_argument("--alerts-log", metavar="FILE",
                      help="the alert sink's log (alerts.jsonl): which alerts reached a "
                      "receiver (optional)")
    snap.add_argument("--from", dest="start", required=True,
                      help="window start: '30m ago', a Unix time or an ISO time (UTC default)")
    snap.add_argument("--to", dest="end", default="now", help="window end (default now)")
    snap.add_argument("--instance", action="append", help="only this server (host:port)")
    snap.add_argument("--step", type=positive(float),
                      help="seconds between rows (default: prometheus.yml's "
                      "evaluation_interval, one recorded sample each)")
    snap.add_argument("--out", required=True,
                      help="folder to write the pack into (new, or empty)")
    snap.add_argument("--no-charts", dest="charts", action="store_false",
                      help="no PNG chart per server (the rest of the pack in under a second; "
                      "drawing takes most of a snapshot's time)")
    snap.add_argument("--request-metrics-dir", metavar="DIR",
                      help="SGLang's --export-metrics-to-file directory (or a copy): add the "
                      "slowest requests of the window to the pack")
    comp = sub.add_parser(
        "compare", help="two windows (before and after a change) side by side: configuration, "
        "load, outcome with 95 %% intervals, a verdict when the loads are comparable")
    comp.add_argument("--prometheus", type=http_url, default="http://127.0.0.1:9090",
                      metavar="URL", help="Prometheus URL (default http://127.0.0.1:9090)")
    for side, text in (("before", "the window before the change: two times ('2h ago', a "
                                  "Unix time or an ISO time, UTC default)"),
                       ("after", "the window after the change")):
        either = comp.add_mutually_exclusive_group(required=True)
        either.add_argument(f"--{side}", nargs=2, metavar=("START", "END"), help=text)
        either.add_argument(f"--{side}-pack", metavar="DIR",
                            help=f"instead: the {side} window of a `sglang-obs snapshot` pack "
                            "(its windows.json)")
    comp.add_argument("--instance", help="the server (host:port); needed when a window or pack "
                      "has several")
    comp.add_argument("--after-instance", metavar="INSTANCE",
                      help="another server for the after window (default: --instance)")
    comp.add_argument("--paired", action="store_true",
                      help="the two windows replay the same traffic (a load test, a replay): "
                      "resample minute k of both together")
    comp.add_argument("--resamples", type=positive(int, 100, inclusive=True), metavar="N",
                      help="bootstrap resamples (thresholds.yml compare:, 2000)")
    comp.add_argument("--seed", type=positive(int, 0, inclusive=True), metavar="N",
                      help="bootstrap seed (thresholds.yml compare:, 0)")
    comp.add_argument("--out", metavar="DIR", help="also write report.md, compare.json and "
                      "compare.png into this folder (new, or empty)")
    cap = sub.add_parser(
        "capacity", help="tokens/s per GPU at the SLO observed, J and cost per token, and the "
        "load a server carried before it first saturated (docs/capacity.md)")
    source = cap.add_mutually_exclusive_group()
    source.add_argument("--prometheus", type=http_url, metavar="URL",
                        help="Prometheus URL (default http://127.0.0.1:9090)")
    source.add_argument("--pack", metavar="DIR", help="instead: a `sglang-obs snapshot` pack "
                        "(its capacity.json); no Prometheus needed")
    cap.add_argument("--from", dest="start",
                     help="window start: '30m ago', a Unix time or an ISO time (UTC default); "
                     "with --pack, default the pack's")
    cap.add_argument("--to", dest="end", help="window end (default now, or the pack's end)")
    cap.add_argument("--server", action="append", metavar="INSTANCE",
                     help="only this server (host:port); repeat for several")
    cap.add_argument("--json", action="store_true", help="the figures as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"{PROG} {args.command}"
    try:
        try:  # read once, handed to the command
            s = settings.load(args.config_dir)
        except config_dir.ConfigDirError as err:
            raise Failure(str(err)) from None
        return _run(args, s)
    except Failure as err:
        return report(prog, err)
    except MissingExtra as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `sglang-obs analyze-log FILE | head`
        return quiet_broken_pipe()


def _run(args: argparse.Namespace, s: settings.Settings) -> int:
    if args.command == "snapshot":
        from sglang_obs.tools.snapshot import take, written

        if args.alerts_log:
            input_file("--alerts-log", args.alerts_log)
        summary = take(args.prometheus, args.start, args.end, Path(args.out), args.instance,
                       args.step, alertmanager=args.alertmanager,
                       alerts_log=Path(args.alerts_log) if args.alerts_log else None,
                       request_metrics_dir=args.request_metrics_dir, charts=args.charts, s=s)
        for server, found in summary["servers"].items():
            print(f"{server}: {' -> '.join(found['dominant']) or 'no bottleneck'}")
        for path in written(Path(args.out)):
            print(f"wrote {path}")
        return 0
    if args.command == "fleet" or (args.command == "stack" and args.fleet is not None):
        from sglang_obs.tools import fleet as fleet_module

        if args.command == "stack" or args.fleet_command == "up":
            return fleet_module.up(args, s)
        if args.fleet_command == "shipper-config":
            return fleet_module.main_shipper_config(args, s)
        return fleet_module.main_shipper_flags(args, s)
    if args.command == "compare":
        from sglang_obs.tools import compare as compare_module

        doc, text = compare_module.run(
            args.prometheus, args.before, args.after, args.instance, args.after_instance,
            Path(args.out) if args.out else None, args.resamples, args.seed, args.paired,
            *(Path(p) if p else None for p in (args.before_pack, args.after_pack)), s=s)
        if args.out:
            print("comparable" if doc["verdict"]["comparable"] else "not comparable")
            for name in ("report.md", "compare.json", "compare.png"):
                print(f"wrote {Path(args.out) / name}")
        else:
            sys.stdout.write(text)
        return 0
    if args.command == "capacity":
        from sglang_obs.tools import capacity

        result, text = capacity.run(
            args.start, args.end, args.prometheus or "http://127.0.0.1:9090",
            Path(args.pack) if args.pack else None, args.server, s=s)
        sys.stdout.write(capacity.to_json(result) if args.json else text)
        return 0
    if args.command == "stack":
        from sglang_obs.tools import stack as stack_module

        if args.demo == []:
            args.demo = ["long-context-incident"]
        return stack_module.up(args, s)
    if args.command == "render-dashboard":
        from sglang_obs.generate import render_dashboard

        for path in render_dashboard.render_command(args.scenario, args.dashboard, args.out, s):
            print(path)
        return 0
    if args.command == "analyze-log":
        from sglang_obs.tools import analyze_log

        return analyze_log.main(args.files, args.json, args.csv_per_minute)
    if args.command == "analyze-requests":
        from sglang_obs.tools import analyze_requests

        return analyze_requests.main(args.files, args.json, args.csv, args.top)
    if args.command in ("detection", "rules", "kubernetes"):
        return _generate(args, s)
    return _alert_sink(args)


def _generate(args: argparse.Namespace, s: settings.Settings) -> int:
    """The generators an operator runs on an edited configuration folder."""
    from sglang_obs.generate import products
    from sglang_obs.render.kubernetes import TranslationError

    if args.command == "detection":
        from sglang_obs.generate import detection
        from sglang_obs.simulator import scenario as scenarios

        for name in args.scenarios:
            try:
                scenarios.load(name)
            except scenarios.ScenarioError as err:
                raise UsageError(f"argument SCENARIO: {err}") from None
        if args.scenarios:  # printed, not written
            sys.stdout.write(detection.markdown(
                [detection.detect(n, s) for n in args.scenarios], s,
                detection.load_e2e(s.docs_dir / detection.E2E_RESULTS)))
            return 0
        return products.run([products.BY_NAME["detection"]], False, s)
    if args.command == "rules":
        return products.run([products.BY_NAME["rules"]], args.check, s)
    out = Path(args.out) if args.out else None
    kube = products.Product("kubernetes", "", lambda given: products.kubernetes(given, out))
    try:
        return products.run([kube], args.check, s)
    except TranslationError as err:
        raise Failure(str(err)) from None
    except OSError as err:  # one line naming the folder, as every command's errors
        raise Failure(f"--out {args.out}: cannot write {err.filename or ''} "
                      f"({reason(err)})") from None


def _alert_sink(args: argparse.Namespace) -> int:
    from sglang_obs.tools.alert_sink import AlertSink, RotatingFile

    logging.basicConfig(level="INFO", format="ts=%(asctime)s level=%(levelname)s msg=%(message)s")
    log_file = None
    if args.log_file:
        try:
            log_file = RotatingFile(output_file("--log-file", args.log_file),
                                    args.log_file_max_bytes, args.log_file_backups)
        except OSError as err:
            raise Failure(f"--log-file {args.log_file}: cannot open it ({reason(err)})") from None
    host, port = args.listen
    try:
        server = AlertSink(host, port, [sys.stdout], log_file=log_file, timeout=args.timeout)
    except OSError as err:
        raise Failure(f"--listen {host}:{port}: cannot listen ({reason(err)})") from None
    logging.info("alert sink listening on %s:%s", host, server.port)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
