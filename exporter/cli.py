"""Command line in the style of Prometheus exporters; every flag also reads an env variable.

The env variable of a flag is SGLANG_OBS_ + the flag name upper-cased with '.' and '-' as '_'
(--sglang.url -> SGLANG_OBS_SGLANG_URL). Flags win over env variables.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading

from prometheus_client import CollectorRegistry

from sglang_obs import __version__
from sglang_obs.core import safe_files, shown
from sglang_obs.core import settings as stack_settings
from sglang_obs.core.cli_support import OneLineParser
from sglang_obs.core.sglang import EXPORTER_PORT
from sglang_obs.exporter.collector import (
    ContainerCollector,
    GpuCollector,
    GuardedCollector,
    LogCollector,
    RequestCollector,
    SGLangCollector,
    model_of,
)
from sglang_obs.exporter.containers import ContainerSource, docker_client
from sglang_obs.exporter.gpu import GpuSampler
from sglang_obs.exporter.gpu_feed import FeedNvml, RealGpuPresent
from sglang_obs.exporter.log_follow import DockerLogFollower, FileFollower
from sglang_obs.exporter.log_stats import LogStats
from sglang_obs.exporter.nvml import NvmlBackend
from sglang_obs.exporter.periodic import Periodic
from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.process_match import ProcessServers
from sglang_obs.exporter.request_follow import RequestRecordDir
from sglang_obs.exporter.request_records import RequestStats
from sglang_obs.exporter.status import StatusBoard, ThresholdsError, load_classification
from sglang_obs.exporter.status_page import GlancePages
from sglang_obs.exporter.targets import base_url, server_label
from sglang_obs.exporter.web import (
    RENDER_INTERVAL_S,
    Exposition,
    make_app,
    parse_listen_address,
    serve,
)
from sglang_obs.exporter.xid import XidWatcher

log = logging.getLogger("sglang_obs.exporter")

DEFAULT_LISTEN = f":{EXPORTER_PORT}"
ENV_PREFIX = "SGLANG_OBS_"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB)?\s*$")


def dest_name(flag: str) -> str:
    return re.sub(r"[.-]", "_", flag.lstrip("-"))


def env_name(flag: str) -> str:
    return ENV_PREFIX + dest_name(flag).upper()


def duration(text: str) -> float:
    """'500ms', '1s', '2m', '1h' or plain seconds -> seconds (> 0)."""
    match = _DURATION.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration: {text!r} (e.g. 500ms, 1s, 2m)")
    factor = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return float(match.group(1)) * factor


def size(text: str) -> int:
    """'1048576', '512KiB', '16MiB' -> bytes (> 0)."""
    match = _SIZE.match(str(text))
    if not match or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive size: {text!r} (e.g. 16MiB)")
    return int(match.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
                                  None: 1}[match.group(2)]


def url(text: str) -> str:
    try:
        return base_url(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def listen_address(text: str) -> str:
    try:
        parse_listen_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def mapping(text: str) -> tuple[str | None, str]:
    """'[http://host:port=]VALUE' -> (base URL or None, VALUE)."""
    if text.startswith(("http://", "https://")) and "=" in text:
        left, _, value = text.partition("=")
        url(left)
        if not value:
            raise argparse.ArgumentTypeError(f"nothing after '=' in {text!r}")
        return left.rstrip("/"), value
    if not text:
        raise argparse.ArgumentTypeError("empty value")
    return None, text


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


class _Parser(OneLineParser):
    """Adds flags whose default comes from the env variable, named in the help text. Usage
    errors are one line on stderr, exit status 2 (argparse's usage block hides the message)."""

    hint = " (see --help)"

    def flag(self, name, *, type=str, default=None, help, repeatable=False):
        """`default` is text, converted by `type` like a value from the command line."""
        env = env_name(name)
        raw = os.environ.get(env) or default
        try:
            if repeatable:
                value = [type(part) for part in (raw or "").split(",") if part.strip()]
            else:
                value = None if raw is None else type(raw)
        except argparse.ArgumentTypeError as err:
            self.error(f"{'env ' + env if os.environ.get(env) else name}: {err}")
        self.add_argument(
            name,
            dest=dest_name(name),
            type=type,
            default=None if repeatable else value,
            action="append" if repeatable else "store",
            metavar=name.split(".")[-1].upper().replace("-", "_"),
            help=f"{help} [env {env}{'' if default is None else f'; default {default}'}]",
        )
        if repeatable:
            self._env_lists[name] = value

    def toggle(self, name, *, default, help):
        env = env_name(name)
        raw = os.environ.get(env)
        if raw:
            try:
                default = _boolean(raw)
            except argparse.ArgumentTypeError as err:
                self.error(f"env {env}: {err}")
        self.add_argument(
            name,
            dest=dest_name(name),
            action=argparse.BooleanOptionalAction,
            default=default,
            help=f"{help} [env {env}=true|false; default {'on' if default else 'off'}]",
        )


def build_parser() -> _Parser:
    parser = _Parser(
        prog="sglang-exporter",
        description="Prometheus exporter that runs beside SGLang servers and adds what their own "
        "/metrics lacks: live KV occupancy, how long the queue has been non-empty, the prefill "
        "backlog, the effective configuration, and its own health.",
    )
    parser._env_lists = {}
    parser.flag("--web.listen-address", type=listen_address, default=DEFAULT_LISTEN,
                help="Address to serve metrics on: [host]:port. The default, with no host, "
                "listens on every IPv4 interface (0.0.0.0), as a container needs; outside a "
                "container use 127.0.0.1:PORT to stay local (see docs/security.md).")
    parser.flag("--web.telemetry-path", default="/metrics",
                help="Path under which the metrics are served.")
    parser.flag("--sglang.url", type=url, repeatable=True,
                help="Base URL of an SGLang server (http://host:port, the --port SGLang serves "
                "its API and /metrics on). Repeat for several servers; the env variable takes a "
                "comma-separated list.")
    parser.flag("--sglang.api-key-file",
                help="File holding SGLang's API key (its --api-key), sent to every "
                "--sglang.url server as 'Authorization: Bearer KEY'. The key is never shown on "
                "the landing page, in /metrics or in the log. Credentials, a query string or a "
                "fragment in --sglang.url itself are refused.")
    parser.flag("--sglang.poll-interval", type=duration, default="1s",
                help="How often each server's /metrics and load endpoint are polled. Keep it "
                "well below the scrape interval so short queueing episodes are seen.")
    parser.flag("--sglang.server-info-interval", type=duration, default="30s",
                help="How often /server_info and /v1/models are re-read (also after every "
                "reconnect); they change only when the server restarts.")
    parser.flag("--sglang.timeout", type=duration, default="800ms",
                help="Deadline for one poll cycle's requests to a server, all of them together "
                "(connect to last byte; each request gets what is left). Keep it below "
                "--sglang.poll-interval: a server that stops answering then reads down within "
                "two poll intervals.")
    parser.flag("--sglang.max-response-bytes", type=size, default="16MiB",
                help="Largest response body accepted from SGLang (bytes, or with KiB/MiB/GiB); "
                "a larger one is dropped and counted as an error. JSON answers (load, server "
                "info, models) are held to 8 MiB whatever this allows.")
    parser.flag("--sglang.log-file", type=mapping, repeatable=True,
                help="Follow this SGLang scheduler log file (tail -F: survives rotation and "
                "truncation). Form [SGLANG_URL=]PATH; the URL may be left out with one server.")
    parser.flag("--sglang.log-container", type=mapping, repeatable=True,
                help="Follow this container's log stream through the Docker API instead. Form "
                "[SGLANG_URL=]CONTAINER.")
    parser.flag("--sglang.log-poll-interval", type=duration, default="500ms",
                help="How often a followed log file is checked for new lines.")
    parser.flag("--sglang.request-metrics-dir", type=mapping, repeatable=True,
                help="Follow the hourly request-record files SGLang writes with "
                "--export-metrics-to-file --export-metrics-to-file-dir DIR (0.5.6+): "
                "latency by prompt-length class, numbers only (docs/request-records.md). Form "
                "[SGLANG_URL=]DIR; the URL may be left out with one server.")
    parser.flag("--sglang.request-metrics-poll-interval", type=duration, default="1s",
                help="How often the followed request-record file is checked for new records.")
    parser.flag("--docker.container", type=mapping, repeatable=True,
                help="Report the state of this SGLang container (restarts, OOM kills, health). "
                "Form [SGLANG_URL=]NAME.")
    parser.flag("--docker.label", repeatable=True,
                help="Also report every container with this label (KEY or KEY=VALUE); label "
                "sglang-obs.server=HOST:PORT on a container names its server.")
    parser.flag("--docker.poll-interval", type=duration, default="5s",
                help="How often the Docker API is asked for container state.")
    parser.flag("--collector.nvml.interval", type=duration, default="5s",
                help="How often GPUs are sampled through NVML, whatever the scrape rate "
                "(sampling every 100 ms measurably slows decoding).")
    parser.flag("--collector.nvml.simulator-feed", type=url,
                help="Demo only: read simulated GPUs from `sglang-sim --gpu-feed` at this URL "
                "(e.g. http://sglang-sim:30000/sim/gpu). Refused when a real GPU answers NVML.")
    parser.flag("--web.glance.thresholds-file",
                help="The thresholds.yml whose classification: section the glance page's verdict "
                "uses, the one the recording rules were generated from. Default: "
                "$SGLANG_OBS_CONFIG_DIR/prometheus/thresholds.yml, else the checkout's, else "
                "the copy installed with the package.")
    parser.flag("--log.level", type=str.lower, default="info",
                help="Log level: debug, info, warn or error.")
    parser.toggle("--web.glance", default=True,
                  help="Serve the glance page at / (every server's state in plain words, live, "
                  "from the exporter's own polls) and its JSON at /api/v1/status; off: a plain "
                  "landing page.")
    parser.toggle("--collector.sglang", default=True,
                  help="Poll the SGLang servers given by --sglang.url.")
    parser.toggle("--collector.nvml", default=True,
                  help="GPU metrics through NVML. On a host without GPUs it reports itself "
                  "down (sglang_obs_gpu_collector_up 0) with one log line.")
    parser.toggle("--collector.nvml.processes", default=False,
                  help="Also GPU memory per SGLang server, matched by process tree (needs the "
                  "host's pid namespace).")
    parser.toggle("--collector.docker", default=True,
                  help="Report container state through the Docker API (read-only). Turns itself "
                  "off, with one log line, when no Docker API is reachable.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("--sglang.url", "--sglang.log-file", "--sglang.log-container",
                 "--sglang.request-metrics-dir", "--docker.container", "--docker.label"):
        dest = dest_name(flag)
        if getattr(args, dest) is None:
            setattr(args, dest, parser._env_lists[flag])
    args.sglang_api_key = (read_api_key(parser, args.sglang_api_key_file)
                           if args.sglang_api_key_file else None)
    if args.log_level not in ("debug", "info", "warn", "warning", "error"):
        parser.error(f"--log.level: unknown level {args.log_level!r}")
    if not args.web_telemetry_path.startswith("/") or args.web_telemetry_path == "/":
        parser.error("--web.telemetry-path must start with / and not be / (the landing page)")
    args.classification = args.baseline_step = None
    if args.web_glance:
        try:
            args.classification = load_classification(args.web_glance_thresholds_file)
        except (ThresholdsError, RuntimeError) as err:  # config_dir.ConfigDirError
            parser.error(f"--web.glance.thresholds-file: {err}")
        try:  # the rules' baselines have one sample per evaluation interval
            args.baseline_step = stack_settings.load().evaluation_interval_s
        except stack_settings.SettingsError as err:
            parser.error(f"--web.glance: {err}")
    if args.collector_sglang and not args.sglang_url:
        parser.error("give at least one --sglang.url (or SGLANG_OBS_SGLANG_URL), "
                     "or turn the SGLang collector off with --no-collector.sglang")
    servers = [server_label(u) for u in args.sglang_url]
    duplicates = sorted({s for s in servers if servers.count(s) > 1})
    if duplicates:
        parser.error(f"--sglang.url: the same server given twice: {', '.join(duplicates)}")
    for flag in ("--sglang.log-file", "--sglang.log-container", "--sglang.request-metrics-dir",
                 "--docker.container"):
        dest = dest_name(flag)
        resolved = []
        for target, value in getattr(args, dest):
            if target is None and flag == "--docker.container" and len(args.sglang_url) != 1:
                resolved.append(("", value))  # a container of no particular server
                continue
            if target is None:
                if len(args.sglang_url) != 1:
                    parser.error(f"{flag} {value}: say which server it belongs to "
                                 f"(SGLANG_URL={value}), there are {len(args.sglang_url)}")
                target = args.sglang_url[0]
            if server_label(target) not in servers:
                parser.error(f"{flag}: {target} is not one of the --sglang.url servers")
            resolved.append((target, value))
        setattr(args, dest, resolved)
    dirs = [server_label(t) for t, _ in args.sglang_request_metrics_dir]
    twice = sorted({s for s in dirs if dirs.count(s) > 1})
    if twice:
        parser.error(f"--sglang.request-metrics-dir: one directory per server, "
                     f"{', '.join(twice)} has more")
    return args


MAX_API_KEY_BYTES = 4096


def read_api_key(parser: _Parser, path: str) -> str:
    """The key in `path`, surrounding whitespace removed; a parser error (naming the file, never
    its content) unless it is one line of printable ASCII, as an HTTP header value must be."""
    try:  # a regular file only: a FIFO nothing writes to would block the start for ever
        fd, _ = safe_files.open_checked(path)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_API_KEY_BYTES + 1)
    except safe_files.Refused as err:
        parser.exit(1, f"{parser.prog}: --sglang.api-key-file {path}: {err}\n")
    except OSError as err:  # the file, not the command line, is wrong: a failure
        parser.exit(1, f"{parser.prog}: --sglang.api-key-file {path}: cannot read it "
                       f"({err.strerror})\n")
    key = raw.strip()
    if not key or len(raw) > MAX_API_KEY_BYTES:
        parser.error(f"--sglang.api-key-file {path}: empty or over {MAX_API_KEY_BYTES} bytes")
    if not all(0x21 <= b <= 0x7E for b in key):
        parser.error(f"--sglang.api-key-file {path}: the key must be one word of printable "
                     "ASCII (no spaces, line breaks or control characters)")
    return key.decode("ascii")


def _on_state_change(source: RequestRecordDir, changed):
    """A poll cycle that re-renders the exposition only when the source's state changed (new
    records tell the stats' listeners themselves): an idle directory costs no render."""

    def cycle() -> None:
        before = (source.up, source.rotations)
        source.poll()
        if (source.up, source.rotations) != before:
            changed()

    return cycle


def gpu_sampler(args, on_change) -> GpuSampler | None:
    nvml = None
    if args.collector_nvml_simulator_feed:
        try:
            nvml = FeedNvml.from_feed(args.collector_nvml_simulator_feed)
        except RealGpuPresent as err:
            log.error("%s; reporting the real GPUs", err)
    try:
        backend = NvmlBackend(nvml, processes=args.collector_nvml_processes)
    except ImportError:
        log.warning("GPU collector off: the nvidia-ml-py package is not installed")
        return None
    xid = XidWatcher(backend.nvml, on_change=on_change)
    ports = {int(server_label(u).rsplit(":", 1)[1]): server_label(u) for u in args.sglang_url}
    return GpuSampler(backend, xid, interval=args.collector_nvml_interval,
                      process_servers=ProcessServers(ports), on_change=on_change)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    level = "warning" if args.log_level == "warn" else args.log_level
    logging.basicConfig(
        level=level.upper(),
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s",
        stream=sys.stderr,
    )
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        log.warning("PROMETHEUS_MULTIPROC_DIR is set; the exporter ignores it and serves "
                    "its own registry (run it in its own process, not inside SGLang's)")

    settings = PollSettings(
        interval=args.sglang_poll_interval,
        server_info_interval=args.sglang_server_info_interval,
        timeout=args.sglang_timeout,
        max_response_bytes=args.sglang_max_response_bytes,
        api_key=args.sglang_api_key,
    )
    stop = threading.Event()
    registry = CollectorRegistry()
    exposition = Exposition(registry, RENDER_INTERVAL_S)
    changed = exposition.changed  # every source calls it after a cycle that may change state

    def then_changed(cycle):
        return lambda: (cycle(), changed())

    log_stats = {server_label(target): LogStats()
                 for target, _ in args.sglang_log_file + args.sglang_log_container}
    for stats in log_stats.values():
        stats.subscribe(changed)
    board = (StatusBoard(args.classification, settings.interval,
                         baseline_step=args.baseline_step)
             if args.classification is not None else None)
    pollers = []
    for u in args.sglang_url if args.collector_sglang else []:
        tracker = board.add(server_label(u)) if board is not None else None
        poller = TargetPoller(u, settings, log_stats=log_stats.get(server_label(u)),
                              on_change=changed,
                              on_poll=tracker.observe if tracker is not None else None)
        if tracker is not None:
            tracker.follow(lambda p=poller: p.snapshot)
        pollers.append(poller)
    # Listen before the other sources are set up: a taken port is then the only line printed.
    # Shown on the landing and glance pages (and listed by /sd/sglang as host:port) through
    # shown.url: base_url() already refused userinfo, query and fragment.
    targets = [shown.url(p.base_url) for p in pollers]
    glance = (GlancePages(board, args.web_telemetry_path, targets) if board is not None
              else None)
    app = make_app(exposition, args.web_telemetry_path, targets, glance)
    try:
        server = serve(app, args.web_listen_address, args.web_telemetry_path)
    except OSError as err:
        log.error("cannot listen on %s (--web.listen-address): %s", args.web_listen_address,
                  err.strerror or err)
        return 1
    collectors: list = [SGLangCollector(pollers, board)] if args.collector_sglang else []
    threads: list = []
    log_sources: list = []
    for target, path in args.sglang_log_file:
        follower = FileFollower(path, log_stats[server_label(target)],
                                server=server_label(target))
        log_sources.append(follower)
        threads.append(Periodic(f"log {path}", then_changed(follower.poll),
                                args.sglang_log_poll_interval))
    docker = None
    if args.collector_docker and (args.docker_container or args.docker_label
                                  or args.sglang_log_container):
        docker = docker_client()
    if docker is not None:
        source = ContainerSource(
            docker, {name: server_label(t) if t else "" for t, name in args.docker_container},
            dict(label.partition("=")[::2] for label in args.docker_label))
        if args.docker_container or args.docker_label:
            collectors.append(ContainerCollector(source))
            threads.append(Periodic("docker", then_changed(source.poll),
                                    args.docker_poll_interval))
        for target, container in args.sglang_log_container:
            follower = DockerLogFollower(docker, container, log_stats[server_label(target)],
                                         server=server_label(target))
            log_sources.append(follower)
            threads.append(follower)
    elif args.sglang_log_container:
        log.error("--sglang.log-container needs the Docker API; those logs are not followed")
    if log_sources:
        collectors.append(LogCollector(log_sources))
    record_sources = []
    for target, directory in args.sglang_request_metrics_dir:
        stats = RequestStats(where=directory)
        stats.subscribe(changed)
        source = RequestRecordDir(directory, stats, server=server_label(target))
        record_sources.append(source)
        threads.append(Periodic(f"requests {directory}", _on_state_change(source, changed),
                                args.sglang_request_metrics_poll_interval))
    if record_sources:
        collectors.append(RequestCollector(record_sources, model_of(pollers)))
    if args.collector_nvml:
        sampler = gpu_sampler(args, changed)
        if sampler is not None:
            collectors.append(GpuCollector(sampler))
            threads.append(sampler)
            if board is not None:
                board.set_gpus(lambda: sampler.reading)

    registry.register(GuardedCollector(collectors))
    changed()  # a scrape before this saw an empty registry

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    for poller in pollers:
        poller.start(stop)
    for thread in threads:
        thread.start(stop)
    host, port = server.server_address[:2]
    log.info("serving %s on %s:%s for %d SGLang server(s)", args.web_telemetry_path, host, port,
             len(pollers))
    stop.wait()
    log.info("shutting down")
    server.shutdown()
    for poller in pollers:
        poller.join(timeout=settings.timeout + 1)
    return 0
