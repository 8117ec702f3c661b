"""A snapshot pack as an input: what `sglang-obs snapshot` writes for the commands that read a
pack instead of Prometheus, and how they read it back (docs/snapshot.md).

- windows.json: `sglang-obs compare`'s window data per server (sglang_obs.tools.compare
  WindowData, as fetch_window computes it over the pack's window); `compare --before-pack`.
- load.json: the raw series `sglang-sim what-if` estimates the load from, per server: for each
  request of LOAD_SERIES the samples at the pack's window and step, and the labels of the info
  metrics of LOAD_INFO; `what-if --pack`.
- capacity.json: what `sglang-obs capacity --pack` reads (sglang_obs.tools.capacity collect:
  the energy, token-by-mode and replica records of the servers' hosts and clusters, each
  server's state, load and SLO counts over the pack's window).

A neutral module: sglang_obs.tools (snapshot, compare) and sglang_obs.simulator (what-if) both
import it, never each other. Only numbers and label values already in Prometheus go in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang_obs.core.cli_support import Failure

SCHEMA_VERSION = 1
SUMMARY = "summary.json"  # every pack has it
WINDOWS = "windows.json"
LOAD = "load.json"
CAPACITY = "capacity.json"

P = "sglang:"
# (series, aggregation over its label sets, label kept or None): every request what-if's
# estimate (sglang_obs.simulator.what_if.estimate) makes of its Source. tests/test_what_if.py
# records the estimate's requests and fails on one missing here.
LOAD_SERIES: tuple[tuple[str, str, str | None], ...] = (
    # arrivals: first scheduled (or, before 0.5.3, finished) minus the mean wait
    *((f"{P}{base}_{part}", "sum", None) for base in ("queue_time_seconds",
                                                      "e2e_request_latency_seconds")
      for part in ("count", "sum")),
    # lengths: SGLang's per-request histograms, else the token counters' means
    *((f"{P}{hist}_{part}", "sum", "le" if part == "bucket" else None)
      for hist in ("prompt_tokens_histogram", "generation_tokens_histogram",
                   "uncached_prompt_tokens_histogram")
      for part in ("bucket", "count", "sum")),
    *((f"{P}{counter}", "sum", None) for counter in (
        "num_requests_total", "prompt_tokens_total", "generation_tokens_total",
        "cached_tokens_total", "spec_verify_calls_total")),
    # server arguments (what_if.ARG_SERIES, every candidate) and the radix cache at the start
    *((name, "max", None) for name in (
        "sglang_obs_max_running_requests", "sglang_obs_log_max_running_requests",
        f"{P}max_total_num_tokens", "sglang_obs_kv_capacity_tokens",
        "sglang_obs_log_capacity_tokens", "sglang_obs_config_chunked_prefill_size_tokens",
        "sglang_obs_config_max_prefill_tokens", "sglang_obs_config_context_length_tokens",
        f"{P}context_len", "sglang_obs_config_tp_size", "sglang_obs_config_dp_size",
        "sglang_obs_config_num_continuous_decode_steps", f"{P}spec_accept_length",
        "sglang_obs_log_spec_accept_length", f"{P}kv_evictable_tokens",
        f"{P}spec_num_steps", f"{P}hicache_host_total_tokens")),
    # HiCache: the hits' split between the device cache and the host tier (the working set)
    (f"{P}cached_tokens_total", "sum", "cache_source"),
)
LOAD_INFO = ("sglang_obs_server_config_info",)


class PackError(Failure):
    """A pack that cannot be read (exit 1); the message names the argument and the file."""


# -- Prometheus: the one place the load series are asked for ------------------------------
def query_series(prom, name: str, agg: str, by: str | None, instance: str, start: float,
                 end: float, step: float) -> dict[str, list[tuple[float, float]]]:
    """`name` of `instance` aggregated by `agg`, one series per value of label `by` ('' when
    None), each in time order (what_if.Source.series)."""
    expr = f'{agg} by ({by or ""}) ({name}{{instance="{instance}"}})'
    return {dict(key).get(by, "") if by else "": sorted(points.items())
            for key, points in prom.query_range(expr, start, end, step).items()}


def query_info(prom, name: str, instance: str, start: float, end: float, step: float
               ) -> dict[str, str] | None:
    """The labels of info metric `name`'s latest series of `instance` in the window."""
    series = prom.query_range(f'{name}{{instance="{instance}"}}', start, end, max(step, 60))
    if not series:
        return None
    key = max(series, key=lambda k: max(series[k]))
    return {k: v for k, v in key if k != "__name__"}


def load_document(prom, servers: list[str], start: float, end: float, step: float) -> dict:
    """load.json: every LOAD_SERIES request and LOAD_INFO metric of each server."""
    return {"schema_version": SCHEMA_VERSION,
            "window": {"start": start, "end": end, "step_seconds": step},
            "servers": {server: {
                "series": [{"name": name, "agg": agg, "by": by,
                            "values": query_series(prom, name, agg, by, server, start, end,
                                                   step)}
                           for name, agg, by in LOAD_SERIES],
                "info": {name: query_info(prom, name, server, start, end, step)
                         for name in LOAD_INFO}} for server in servers}}


# -- files ---------------------------------------------------------------------------------
def write(folder: Path, name: str, doc: dict) -> None:
    """One of the pack's JSON files, compact (load.json holds every sample), keys in the order
    they were made."""
    (folder / name).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def read(flag: str, path: str | os.PathLike, name: str) -> dict:
    """File `name` of the pack at `path`, or a PackError naming `flag`, the folder and the file:
    no such folder, not a pack, a pack taken by an older release, an unreadable file."""
    path = Path(path)
    where = f"{flag} {path}"
    if not path.exists():
        raise PackError(f"{where}: no such directory")
    if not path.is_dir():
        raise PackError(f"{where}: is a file; give the folder `sglang-obs snapshot --out` wrote")
    if not (path / SUMMARY).is_file():
        raise PackError(f"{where}: not a snapshot pack (no {SUMMARY}); give the folder "
                        "`sglang-obs snapshot --out` wrote")
    if not (path / name).is_file():
        raise PackError(f"{where}: the pack has no {name}: it was taken by an older release; "
                        "take it again with this release (sglang-obs snapshot)")
    try:
        doc = json.loads((path / name).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise PackError(f"{where}: cannot read {name} ({getattr(err, 'strerror', None) or err})"
                        ) from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != SCHEMA_VERSION or not isinstance(doc.get("servers"), dict):
        raise PackError(f"{where}: {name} has schema_version {version!r}; this release reads "
                        f"{SCHEMA_VERSION}: take the pack again with this release")
    return doc


def pick_server(servers: list[str], instance: str | None, instance_flag: str, scope: str,
                error: type[Failure] = Failure) -> str:
    """The server `instance` names among `servers` (those found in `scope`: "this window",
    "the pack --before-pack DIR"), or the only one when it names none; else an `error` naming
    `instance_flag`."""
    if not servers:
        raise error(f"{instance_flag}: no servers in {scope}")
    if instance is None:
        if len(servers) > 1:
            raise error(f"{instance_flag}: {len(servers)} servers in {scope} "
                        f"({', '.join(servers)}): name one")
        return servers[0]
    if instance not in servers:
        raise error(f"{instance_flag}: unknown instance {instance}; servers in {scope}: "
                    f"{', '.join(servers)}")
    return instance
