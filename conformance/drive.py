"""Drive one SGLang release's own observability code and write what its server would answer.

Run by conformance/generate.py with the interpreter of a throwaway virtualenv holding
`sglang==X` (installed without its dependencies, plus the packages its observability modules
import): nothing here imports sglang_obs, and nothing starts a GPU. The release's real metric
collectors are created as its scheduler and tokenizer processes create them (one OS process per
TP rank, prometheus_client in multiprocess mode), fed through their own `log_stats`,
`observe_*` and `increment_*` methods with the numbers of a loaded server, and the registry is
answered by the release's own `/metrics` app (`add_prometheus_middleware`), once for a
Prometheus text scraper and once for an OpenMetrics one. The JSON bodies come from the
release's own structures (`LoadSnapshot.to_dict`, `build_server_info`, the scheduler's internal
state readback), the log lines from its scheduler's logging functions and the request records
from its `FileRequestMetricsExporter`.

    python drive.py --variant default --out DIR

writes DIR/metrics.prom, metrics.openmetrics.txt (+ .content-type), server_info.json,
v1_loads.json, get_load.json (or get_load.status: the route's HTTP status when it has none),
scheduler.log, request_records.log and manifest.json (the release, prometheus_client's
version, the variant's flags, the families the collectors define and the ones exposed).
"""


from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from drivers.common import VARIANTS

# Release -> its driver (drivers/<module>.py): where the release keeps its collectors and how
# its processes create them.
DRIVERS = {"0.4.6.post5": "v0_4_6", "0.5.5": "v0_5_5", "0.5.12": "v0_5_12", "0.5.23": "v0_5_23"}


def release() -> str:
    import sglang

    return sglang.__version__


def main() -> int:
    version = release()
    driver = importlib.import_module(f"drivers.{DRIVERS[version]}")
    if sys.argv[1:] == ["--define"]:
        driver.define_all()
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    multiproc = tempfile.mkdtemp(prefix="sglang-prom-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc
    os.environ.setdefault("SGLANG_ROLE_NAMESPACES", "off")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        driver.server_args(VARIANTS[args.variant])
    except TypeError as err:  # a flag this release does not have
        print(f"not in {version}: {err}", file=sys.stderr)
        return 3
    try:
        manifest = driver.drive(args.variant, VARIANTS[args.variant], args.out)
    finally:
        shutil.rmtree(multiproc, ignore_errors=True)
    from importlib.metadata import version as installed

    manifest.update({"release": version, "variant": args.variant,
                     "flags": VARIANTS[args.variant],
                     "prometheus_client": installed("prometheus_client"),
                     "python": sys.version.split()[0]})
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True)
                                            + "\n")
    return 0


if __name__ == "__main__":
    multiprocessing.set_start_method("fork")
    raise SystemExit(main())
