"""`sglang-obs`: the stack's own commands.

    sglang-obs alert-sink [--listen 127.0.0.1:9095] [--log-file alerts.jsonl] [--timeout S]
    sglang-obs rules [--check]          regenerate prometheus/rules (and docs/runbooks.md's blocks)
    sglang-obs detection [SCENARIO...]  regenerate docs/detection.md
    sglang-obs analyze-log FILE... [--json] [--csv-per-minute OUT]
    sglang-obs render-dashboard --scenario NAME [--dashboard JSON] --out PNG
    sglang-obs stack up --native [--demo SCENARIO...] [--sglang-url URL...] [--override FILE]
    sglang-obs stack up --native --fleet N [--demo]   (= sglang-obs fleet up N [--demo])
    sglang-obs fleet shipper-config --cluster C --host H --write-url URL [--flavour F]
    sglang-obs snapshot --prometheus URL --from T --to T [--instance I...] --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

from sglang_obs import config_dir
from sglang_obs.charts import MissingExtra


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 - the compose service listens on all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-obs", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config-dir", metavar="DIR",
        help="folder with prometheus/, alertmanager/ and grafana/ (default: the checkout's, else "
        f"the installed copy) [env {config_dir.ENV}]")
    sub = parser.add_subparsers(dest="command", required=True)
    sink = sub.add_parser("alert-sink", help="log the alerts Alertmanager sends (demo, tests)")
    sink.add_argument("--listen", type=_listen, default=("127.0.0.1", 9095),
                      help="host:port to listen on (default 127.0.0.1:9095)")
    sink.add_argument("--log-file", help="also append one JSON line per alert to this file")
    sink.add_argument("--log-file-max-bytes", type=int, default=10 * 1024 * 1024,
                      metavar="BYTES", help="rotate the log file past this size (10 MiB)")
    sink.add_argument("--log-file-backups", type=int, default=2, metavar="N",
                      help="rotated log files kept, FILE.1 to FILE.N (2)")
    sink.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                      help="a connection's time to send its request (10)")
    rules = sub.add_parser(
        "rules", help="regenerate prometheus/rules/*.yml from thresholds.yml, and in a checkout "
        "the blocks of docs/runbooks.md that quote them")
    rules.add_argument("--check", action="store_true", help="fail if any of them is stale")
    detection = sub.add_parser("detection", help="regenerate docs/detection.md")
    detection.add_argument("scenarios", nargs="*", help="only these (printed, not written)")
    analyze = sub.add_parser(
        "analyze-log", help="the evidence in saved SGLang scheduler logs (plain or gzipped)")
    analyze.add_argument("files", nargs="+", help="log files, oldest first")
    analyze.add_argument("--json", action="store_true",
                         help="print a machine-readable document (docs/log-analysis.md)")
    analyze.add_argument("--csv-per-minute", metavar="OUT", help="write a per-minute CSV table")
    render = sub.add_parser(
        "render-dashboard", help="draw a dashboard's panels for a simulator scenario (PNG)")
    render.add_argument("--scenario", required=True, help="simulator scenario name or YAML")
    render.add_argument("--dashboard",
                        help="generated dashboard JSON (default: the overview in --config-dir)")
    render.add_argument("--out", required=True, help="PNG file to write")
    stack = sub.add_parser("stack", help="run the stack without Docker (Debian binaries)")
    stack.add_argument("action", choices=["up"])
    stack.add_argument("--native", action="store_true", required=True,
                       help="use local binaries: prometheus, prometheus-alertmanager")
    stack.add_argument("--demo", nargs="*", metavar="SCENARIO",
                       help="serve these simulator scenarios (default long-context-incident)")
    stack.add_argument("--sglang-url", action="append", help="a real SGLang server to watch")
    stack.add_argument("--override", help="YAML whose `global:` replaces prometheus.yml's, "
                       "e.g. prometheus/override.fast.yml")
    stack.add_argument("--dir", help="working folder for configs, data and logs")
    stack.add_argument("--free-ports", action="store_true",
                       help="pick free ports instead of 9090/9093/9095/9840/30000")
    stack.add_argument("--fleet", type=int, metavar="N",
                       help="instead: N simulated hosts shipping into a central VictoriaMetrics "
                       "with vmalert (sglang-obs fleet up N; --demo: the first host replays "
                       "the long-context incident)")
    stack.add_argument("--clusters", type=int, default=2, help="with --fleet: clusters (2)")
    fleet = sub.add_parser("fleet", help="many hosts into one store (docs/fleet.md)")
    fleet_sub = fleet.add_subparsers(dest="fleet_command", required=True)
    fleet_up = fleet_sub.add_parser(
        "up", help="N simulated hosts (simulator, exporter, vmagent) and the central side "
        "(VictoriaMetrics, vmalert, Alertmanager, alert sink), native binaries")
    fleet_up.add_argument("fleet", type=int, metavar="N", help="hosts")
    fleet_up.add_argument("--clusters", type=int, default=2, help="clusters (2)")
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
    ship.add_argument("--exporter", default="exporter:9840", help="the exporter's address")
    ship.add_argument("--self-address", help="where the shipper's own /metrics is")
    flags = fleet_sub.add_parser("shipper-flags", help="print vmagent's flags for one host")
    flags.add_argument("--config", default="/etc/vmagent/vmagent.yml")
    flags.add_argument("--write-url", default="http://victoriametrics:8428/api/v1/write")
    flags.add_argument("--buffer-dir", default="/vmagent-buffer")
    flags.add_argument("--listen", default=":8429")
    snap = sub.add_parser("snapshot", help="an evidence pack for a time window (CSV, JSON, "
                          "report, charts)")
    snap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL")
    snap.add_argument("--from", dest="start", required=True,
                      help="window start: '30m ago', a Unix time or an ISO time (UTC default)")
    snap.add_argument("--to", dest="end", default="now", help="window end (default now)")
    snap.add_argument("--instance", action="append", help="only this server (host:port)")
    snap.add_argument("--step", type=float, default=15.0, help="seconds between rows (15)")
    snap.add_argument("--out", required=True, help="folder to write the pack into")
    args = parser.parse_args(argv)
    try:  # resolved before any command module is imported: they read the folder at import
        os.environ[config_dir.ENV] = str(config_dir.resolve(args.config_dir))
    except config_dir.ConfigDirError as err:
        parser.error(str(err))
    try:
        return _run(parser, args)
    except MissingExtra as err:
        print(f"sglang-obs {args.command}: {err}", file=sys.stderr)
        return 1


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "snapshot":
        from pathlib import Path  # noqa: PLC0415

        from sglang_obs.tools.snapshot import SnapshotError, take  # noqa: PLC0415

        try:
            summary = take(args.prometheus, args.start, args.end, Path(args.out),
                           args.instance, args.step)
        except SnapshotError as err:
            print(f"sglang-obs snapshot: {err}", file=sys.stderr)
            return 2
        for server, s in summary["servers"].items():
            print(f"{server}: {' -> '.join(s['dominant']) or 'no bottleneck'}")
        print(f"wrote {args.out}/report.md, summary.json, series.csv")
        return 0
    if args.command == "fleet" or (args.command == "stack" and args.fleet is not None):
        from sglang_obs.tools import fleet as fleet_module  # noqa: PLC0415

        if args.command == "stack" or args.fleet_command == "up":
            if args.fleet < 1 or args.clusters < 1:
                parser.error("a fleet has at least one host and one cluster")
            return fleet_module.up(args)
        if args.fleet_command == "shipper-config":
            return fleet_module.main_shipper_config(args)
        return fleet_module.main_shipper_flags(args)
    if args.command == "stack":
        from sglang_obs.tools import stack as stack_module  # noqa: PLC0415

        if args.demo == []:
            args.demo = ["long-context-incident"]
        return stack_module.up(args)
    if args.command == "render-dashboard":
        from pathlib import Path  # noqa: PLC0415

        from sglang_obs.generate.backfill import BackfillError  # noqa: PLC0415
        from sglang_obs.generate.render_dashboard import render_png  # noqa: PLC0415
        from sglang_obs.simulator.scenario import ScenarioError  # noqa: PLC0415

        if args.dashboard is None:
            args.dashboard = str(config_dir.resolve() / "grafana/dashboards/sglang-overview.json")
        if not Path(args.dashboard).is_file():
            parser.error(f"--dashboard: no such file {args.dashboard}")
        try:
            print(render_png(args.scenario, Path(args.dashboard), Path(args.out)))
        except (ScenarioError, BackfillError) as err:
            print(f"sglang-obs render-dashboard: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "analyze-log":
        from sglang_obs.tools import analyze_log

        return analyze_log.main(args.files, args.json, args.csv_per_minute)
    logging.basicConfig(level="INFO", format="ts=%(asctime)s level=%(levelname)s msg=%(message)s")

    if args.command == "alert-sink":
        from sglang_obs.tools.alert_sink import AlertSink, RotatingFile

        if args.log_file_max_bytes < 4096 or args.log_file_backups < 0 or args.timeout <= 0:
            parser.error("--log-file-max-bytes is at least 4096, --log-file-backups at least "
                         "0, --timeout more than 0")
        log_file = None
        if args.log_file:
            try:
                log_file = RotatingFile(args.log_file, args.log_file_max_bytes,
                                        args.log_file_backups)
            except OSError as err:
                parser.error(f"--log-file: {err}")
        try:
            server = AlertSink(*args.listen, [sys.stdout], log_file=log_file,
                               timeout=args.timeout)
        except OSError as err:
            logging.error("cannot listen on %s:%s: %s", *args.listen, err)
            return 1
        logging.info("alert sink listening on %s:%s", args.listen[0], server.port)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        return 0
    if args.command == "rules":
        from sglang_obs.generate import rules as rules_module

        return rules_module.main(["--check"] if args.check else [])
    from sglang_obs.generate import detection as detection_module

    return detection_module.main(args.scenarios)


if __name__ == "__main__":
    raise SystemExit(main())
