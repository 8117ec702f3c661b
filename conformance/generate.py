"""Regenerate conformance/goldens/ from SGLang's own code, release by release (`make goldens`).

For each release a throwaway virtualenv (under $SGLANG_OBS_CONFORMANCE_VENVS, default
~/.cache/sglang-obs-conformance) gets `sglang==X --no-deps` and the packages its observability
modules import (RELEASES below); conformance/drive.py then runs there once per variant and
writes what that server answers. This command normalises what changes from one run to the
next and nothing else, and writes the result to conformance/goldens/<release>/<variant>/:

- prometheus_client's multiprocess collector reads its files in directory order, so the
  families of an answer come in any order: they are sorted by name, and each family's samples
  by their text;
- `pid` labels (the retract and pause gauges carry the scheduler's process id) become 4242,
  4243, ... in the order of the ranks that own them;
- the CPU monitor's `process_cpu_seconds_total` samples (CPU time measured while driving) are
  set to 1.5;
- the scheduler log's timestamps (the local time the lines were written) become
  2026-12-03 10:00:00, 10:00:01, ... in line order (the driver fixes the clocks the lines'
  figures come from, and the request records' timestamps).

CI never installs SGLang: the tests read the goldens.

    python conformance/generate.py [--release 0.5.23 ...] [--variant default ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
GENERATOR_VERSION = 2  # bump when drive.py or the normalisation changes what it writes
# Release -> the packages its observability modules import, beyond `sglang --no-deps` (found
# by importing them until nothing is missing; torch is among them: the collectors import the
# scheduler's enums, whose modules import torch). "overlay": packages pinned to the release's
# own requirement, installed beside it because the shared ones are too new for it.
BASE = ["numpy", "orjson", "psutil", "pybase64", "requests", "torch", "packaging", "pillow",
        "starlette", "fastapi", "msgspec", "pydantic", "pyzmq", "tqdm", "IPython", "aiohttp",
        "transformers", "torchvision", "dill", "apache-tvm-ffi", "sentencepiece",
        "compressed-tensors", "gguf", "prometheus_client", "zstandard"]
RELEASES = {
    "0.4.6.post5": {"overlay": ["triton==3.2.0", "transformers==4.51.1", "tokenizers==0.21.1",
                                "huggingface-hub==0.30.2"]},
    "0.5.5": {"overlay": ["python-multipart==0.0.34"]},
    "0.5.12": {"overlay": ["transformers==5.6.0"]},
    "0.5.23": {"overlay": []},
}
_FAMILY = re.compile(r"^# (?:HELP|TYPE) (\S+)")


def venv_root() -> Path:
    return Path(os.environ.get("SGLANG_OBS_CONFORMANCE_VENVS",
                               Path.home() / ".cache" / "sglang-obs-conformance"))


def run(cmd: list[str], **kw) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if result.returncode:
        sys.exit(f"{' '.join(cmd[:6])}: {(result.stderr or result.stdout)[-3000:]}")


def prepare(release: str) -> tuple[Path, dict[str, str]]:
    """(interpreter, environment) that imports sglang==release."""
    root = venv_root()
    base = root / "base"
    python = base / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(base)])
        run([str(python), "-m", "pip", "install", "-q", *BASE])
    target = root / f"sglang-{release}"
    if not (target / "sglang").is_dir():
        run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
             f"sglang=={release}"])
    paths = [target]
    overlay = RELEASES[release]["overlay"]
    if overlay:
        extra = root / f"overlay-{release}"
        if not extra.is_dir():
            run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target",
                 str(extra), *overlay])
        paths.insert(0, extra)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0"}
    return python, env


# -- normalisation ---------------------------------------------------------------------------
def _blocks(text: str) -> tuple[list[tuple[str, list[str], list[str]]], list[str]]:
    """(family, header lines, sample lines) per family, and the trailing lines (# EOF)."""
    blocks: list[tuple[str, list[str], list[str]]] = []
    tail: list[str] = []
    for line in text.splitlines():
        if line.startswith("# EOF"):
            tail.append(line)
            continue
        m = _FAMILY.match(line)
        if m:
            if not blocks or blocks[-1][0] != m.group(1) or blocks[-1][2]:
                blocks.append((m.group(1), [], []))
            blocks[-1][1].append(line)
        elif line:
            blocks[-1][2].append(line)
    return blocks, tail


def normalise_exposition(text: str) -> str:
    blocks, tail = _blocks(text)
    # pid labels, in the order of the ranks that own them
    owners: dict[str, str] = {}
    for _, _, samples in blocks:
        for sample in samples:
            pid = re.search(r'pid="(\d+)"', sample)
            if pid:
                rank = re.search(r'tp_rank="(\d+)"', sample)
                owners.setdefault(pid.group(1), rank.group(1).zfill(6) if rank else "~")
    renamed = {pid: str(4242 + i) for i, pid in enumerate(
        sorted(owners, key=lambda p: (owners[p], p)))}
    out = []
    for _family, header, samples in sorted(blocks, key=lambda b: b[0]):
        fixed = []
        for sample in samples:
            sample = re.sub(r'pid="(\d+)"', lambda m: f'pid="{renamed[m.group(1)]}"', sample)
            if re.match(r"sglang[:_]process_cpu_seconds_total\{", sample):
                sample = sample.rsplit(" ", 1)[0] + " 1.5"
            fixed.append(sample)
        out += header + sorted(fixed)
    return "\n".join(out + tail) + "\n"


_LOG_TIME = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")


def normalise_log(text: str) -> str:
    return "".join(_LOG_TIME.sub(f"[2026-12-03 10:00:{i:02d}", line, count=1)
                   for i, line in enumerate(text.splitlines(keepends=True)))


def normalise(folder: Path) -> None:
    for name in ("metrics.prom", "metrics.openmetrics.txt"):
        path = folder / name
        if path.exists():
            path.write_text(normalise_exposition(path.read_text()))
    log = folder / "scheduler.log"
    if log.exists():
        log.write_text(normalise_log(log.read_text()))


def generate(release: str, variants: list[str] | None) -> None:
    python, env = prepare(release)
    sys.path.insert(0, str(HERE))
    from drive import VARIANTS

    out_root = GOLDENS / release
    chosen = variants or list(VARIANTS)
    for variant in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            result = subprocess.run(
                [str(python), str(HERE / "drive.py"), "--variant", variant, "--out", tmp],
                capture_output=True, text=True, env=env, cwd=tmp, check=False, timeout=1800)
            target = out_root / variant
            if result.returncode == 3:  # the release has no such feature
                print(f"{release} {variant}: {result.stderr.strip().splitlines()[-1]}")
                shutil.rmtree(target, ignore_errors=True)
                continue
            if result.returncode:
                sys.exit(f"{release} {variant}: {result.stderr[-4000:]}")
            normalise(Path(tmp))
            if variant != "default":  # the negotiation is the same for every variant
                for name in ("metrics.openmetrics.txt", "metrics.openmetrics.content-type"):
                    (Path(tmp) / name).unlink(missing_ok=True)
            manifest = json.loads((Path(tmp) / "manifest.json").read_text())
            manifest["generator_version"] = GENERATOR_VERSION
            (Path(tmp) / "manifest.json").write_text(json.dumps(manifest, indent=1,
                                                                sort_keys=True) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(tmp, target)
            print(f"{release} {variant}: {len(manifest['families_exposed'])} families exposed, "
                  f"{len(manifest['families_defined'])} defined")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", action="append", choices=sorted(RELEASES))
    parser.add_argument("--variant", action="append")
    args = parser.parse_args()
    for release in args.release or list(RELEASES):
        generate(release, args.variant)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
