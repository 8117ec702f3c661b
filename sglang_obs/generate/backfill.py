"""Fill a real Prometheus TSDB with a simulator scenario: raw series and recorded ones.

`promtool tsdb create-blocks-from openmetrics` loads the rendered series. Recording rules are
then backfilled with `promtool tsdb create-blocks-from rules`, level by level: a rule that reads
another rule's output can only be evaluated once that output is in the TSDB, so each level is
evaluated against a Prometheus that holds all the levels before it. Dashboards, snapshots and
tests then query a Prometheus that looks as if it had watched the scenario happen.

With `alerts=True` it also holds the ALERTS series of the firing alerts, as a Prometheus that
evaluated the shipped alert rules live would: promtool runs the rule files over the rendered
series as a unit test and reports, step by step, which alerts fire (`promtool tsdb
create-blocks-from rules` skips alerting rules).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from sglang_obs.core.settings import Settings, default
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import Rendered, render, write_openmetrics, write_promtool_series

RECORDING_RULES = "sglang.rules.yml"  # in prometheus/rules/


class BackfillError(RuntimeError):
    pass


def _binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise BackfillError(f"{name} not found: apt-get install prometheus")
    return path


def rule_levels(s: Settings) -> list[list[dict]]:
    """Recording rules grouped so that each level only reads raw series and earlier levels."""
    path = s.rules_dir / RECORDING_RULES
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]
             if "record" in r]
    names = {r["record"] for r in rules}
    level: dict[str, int] = {}
    while len(level) < len(rules):
        progressed = False
        for r in rules:
            if r["record"] in level:
                continue
            used = {n for n in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", r["expr"])
                    if n in names and n != r["record"]}
            if all(u in level for u in used):
                level[r["record"]] = 1 + max((level[u] for u in used), default=-1)
                progressed = True
        if not progressed:
            raise BackfillError("recording rules depend on each other in a cycle")
    depth = max(level.values()) + 1
    return [[r for r in rules if level[r["record"]] == d] for d in range(depth)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def prometheus(data: Path, config: str = "global: {scrape_interval: 1m}\n",
               retention: str = "30d") -> Iterator[str]:
    """A Prometheus on loopback over `data`; yields its URL."""
    binary = _binary("prometheus")
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="prom-"))
    # A config that scrapes Prometheus itself names it localhost:9090: point that at us.
    (workdir / "prometheus.yml").write_text(config.replace("localhost:9090",
                                                           f"127.0.0.1:{port}"))
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
         f"--storage.tsdb.retention.time={retention}", f"--web.listen-address=127.0.0.1:{port}",
         "--query.lookback-delta=2m"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise BackfillError((workdir / "prometheus.log").read_text()[-2000:])
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(url + "/-/ready", timeout=1).status == 200:
                    break
            if time.monotonic() > deadline:
                raise BackfillError("prometheus did not become ready")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class Backfilled:
    data: Path
    start: float  # unix time of the first sample
    end: float
    scenario: str
    step: int  # seconds between samples


def backfill(name: str, data: Path, step: int | None = None, end: float | None = None,
             release: str | None = None, alerts: bool = False,
             s: Settings | None = None) -> Backfilled:
    """Render scenario `name` (as `release`, default the scenario's) so that it ends at `end`
    (default: now) and backfill `data` at `step` (default: the evaluation interval of `s`, whose
    rules it records and evaluates); with `alerts`, the ALERTS series too."""
    s = s or default()
    step = step or int(s.evaluation_interval_s)
    sc = scenarios.load(name)
    end = (time.time() // step) * step if end is None else end
    start = end - (sc.duration // step) * step
    promtool = _binary("promtool")
    data.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        om = Path(tmp) / "series.om.txt"
        rendered = render(sc, release, start=start, step=step)
        if alerts:
            for labels, steps in firing_alerts(rendered, Path(tmp), s).items():
                for i in steps:
                    rendered.add("ALERTS", dict(labels), i, 1.0)
        write_openmetrics(rendered, om)
        _run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)])
        for i, rules in enumerate(rule_levels(s)):
            rule_file = Path(tmp) / f"level{i}.yml"
            rule_file.write_text(yaml.safe_dump(
                {"groups": [{"name": f"backfill-level-{i}", "rules": rules}]}, width=1000))
            out = Path(tmp) / f"blocks{i}"
            with prometheus(data) as url:
                _run([promtool, "tsdb", "create-blocks-from", "rules", f"--start={int(start)}",
                      f"--end={int(end) + step}", f"--url={url}", f"--eval-interval={step}s",
                      f"--output-dir={out}", str(rule_file)])
            for block in out.iterdir() if out.exists() else ():
                shutil.move(str(block), data / block.name)
    return Backfilled(data, start, end, name, step)


_FAILED_AT = re.compile(r'expr: "ALERTS\{alertstate=\\"firing\\"\}", time: (\S+),\n\s+exp: .*\n'
                        r"\s+got: (.*)")
_SAMPLE = re.compile(r"\{([^}]*)\} [-+0-9.eE]+")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _promtool_seconds(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(v) * units[u] for v, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text))


def firing_alerts(rendered: Rendered, workdir: Path, s: Settings) -> dict[tuple, set[int]]:
    """{ALERTS labels (alertstate="firing", no __name__): the steps it fired at}: the shipped
    rule files evaluated by promtool over `rendered` from its first step, every step."""
    from sglang_obs.generate import promtool_eval  # it reads the rule tables

    series_file = workdir / "alerts.series.yml"
    write_promtool_series(rendered, series_file)
    series = yaml.safe_load(series_file.read_text())["input_series"]
    step = int(rendered.step)
    try:
        output = promtool_eval.evaluate(series, [('ALERTS{alertstate="firing"}', i * step)
                                                 for i in range(rendered.steps)], step,
                                        workdir, s, "alerts")
    except promtool_eval.PromtoolError as err:
        raise BackfillError(str(err)) from None
    fired: dict[tuple, set[int]] = {}
    for at, got in _FAILED_AT.findall(output):
        index = round(_promtool_seconds(at) / step)
        for sample in _SAMPLE.findall(got):
            labels = tuple(sorted((k, v) for k, v in _LABEL.findall(sample)
                                  if k != "__name__"))
            fired.setdefault(labels, set()).add(index)
    return fired


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise BackfillError(f"{' '.join(cmd[:4])}: {result.stderr[-2000:] or result.stdout}")
