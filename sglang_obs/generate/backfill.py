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
import math
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from sglang_obs.core.settings import Settings, default
from sglang_obs.simulator import pd_scenario
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.pd_render import render_pd
from sglang_obs.simulator.pd_scenario import PdScenario
from sglang_obs.simulator.render import Rendered, promtool_series, render, write_openmetrics

RECORDING_RULES = "sglang.rules.yml"  # in prometheus/rules/


class BackfillError(RuntimeError):
    pass


def _binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise BackfillError(f"{name} not found: apt-get install prometheus")
    return path


def rule_levels(s: Settings, only: set[str] | None = None) -> list[list[dict]]:
    """Recording rules grouped so that each level only reads raw series and earlier levels;
    with `only`, just the rules it names."""
    path = s.rules_dir / RECORDING_RULES
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]
             if "record" in r and (only is None or r["record"] in only)]
    names = {r["record"] for r in rules}
    level: dict[str, int] = {}
    while len(level) < len(rules):
        progressed = False
        for r in rules:
            if r["record"] in level:
                continue
            # A rule that reads its own past (the replica recommendation's hysteresis) is
            # backfilled without it: it shows what its fallback gives, the desired count.
            used = {n for n in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", r["expr"])
                    if n in names and n != r["record"]}
            if all(u in level for u in used):
                level[r["record"]] = 1 + max((level[u] for u in used), default=-1)
                progressed = True
        if not progressed:
            raise BackfillError("recording rules depend on each other in a cycle")
    depth = max(level.values()) + 1
    return [[r for r in rules if level[r["record"]] == d] for d in range(depth)]


def _names(expr: str) -> set[str]:
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))


def alert_inputs(s: Settings) -> tuple[set[str], set[str]]:
    """(recording rules, metric names): what the shipped alert rules read, directly or through
    recording rules. The names are a superset (every identifier in those expressions)."""
    from sglang_obs.generate import promtool_eval  # it reads the rule tables

    rules = [r for path in promtool_eval.rule_files(s)
             for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    recorded = {r["record"]: r["expr"] for r in rules if "record" in r}
    exprs = [r["expr"] for r in rules if "alert" in r]
    needed: set[str] = set()
    while exprs:
        for name in _names(exprs.pop()) & recorded.keys() - needed:
            needed.add(name)
            exprs.append(recorded[name])
    read = set().union(*(_names(r["expr"]) for r in rules
                         if "alert" in r or r.get("record") in needed))
    return needed, read


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def prometheus(data: Path, config: str | None = None,
               retention: str = "30d", s: Settings | None = None) -> Iterator[str]:
    """A Prometheus on loopback over `data`; yields its URL. Its default config has the shipped
    evaluation interval: a subquery without a resolution (`[30s:]`, the alerts' sustain) steps
    at it, and at Prometheus's own default (1m) a 30 s window holds a point or none depending
    on the wall clock's phase, so an alert expression queried here would differ from the
    live one."""
    if config is None:
        config = (f"global: {{scrape_interval: 1m, evaluation_interval: "
                  f"{(s or default()).evaluation_interval_s:g}s}}\n")
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


def scenario_of(name: str):
    """A shipped scenario by name: a PD deployment's (pd-*, simulator/pd_scenario.py) or a
    single server's."""
    return pd_scenario.load(name) if name.startswith("pd-") else scenarios.load(name)


def backfill(name: str, data: Path, step: int | None = None, end: float | None = None,
             release: str | None = None, alerts: bool = False,
             s: Settings | None = None, duration: float | None = None,
             for_alerts: bool = False) -> Backfilled:
    """Render scenario `name` (as `release`, default the scenario's) so that it ends at `end`
    (default: now) and backfill `data` at `step` (default: the evaluation interval of `s`, whose
    rules it records and evaluates); with `alerts`, the ALERTS series too. A `duration` longer
    than the scenario's loops it (`looped`). `for_alerts` keeps only what the alert rules read
    (`alert_inputs`): the series and recording rules, not the dashboards' quantiles."""
    s = s or default()
    step = step or int(s.evaluation_interval_s)
    sc = scenario_of(name)
    end = (time.time() // step) * step if end is None else end
    start = end - ((duration or sc.duration) // step) * step
    promtool = _binary("promtool")
    data.mkdir(parents=True, exist_ok=True)
    needed, read = alert_inputs(s) if for_alerts else (None, None)
    with tempfile.TemporaryDirectory() as tmp:
        rendered = (render_pd(sc, step=step, start=start) if isinstance(sc, PdScenario)
                    else render(sc, release, start=start, step=step))
        if read is not None:
            rendered.series = {k: v for k, v in rendered.series.items() if k[0] in read}
        if duration is not None and duration > sc.duration:
            rendered = looped(rendered, int(duration // step) + 1, int(WARM_UP_SECONDS // step))
        if alerts:
            for labels, steps in firing_alerts(rendered, Path(tmp), s).items():
                for i in steps:
                    rendered.add("ALERTS", dict(labels), i, 1.0)
        for om in _write_blocks(rendered, Path(tmp)):
            _run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)])
        for i, rules in enumerate(rule_levels(s, needed)):
            rule_file = Path(tmp) / f"level{i}.yml"
            rule_file.write_text(yaml.safe_dump(
                {"groups": [{"name": f"backfill-level-{i}", "rules": rules}]}, width=1000))
            out = Path(tmp) / f"blocks{i}"
            with prometheus(data, s=s) as url:
                # The rule file by its bare name, from its folder: Prometheus offsets a group's
                # evaluations within the interval by a hash of its name and file path, and a
                # temporary folder's random path would move every recorded sample by a random
                # part of a step from one backfill to the next (a state at an edge flipped).
                _run([promtool, "tsdb", "create-blocks-from", "rules", f"--start={int(start)}",
                      f"--end={int(end) + step}", f"--url={url}", f"--eval-interval={step}s",
                      f"--output-dir={out}", rule_file.name], cwd=Path(tmp))
            for block in out.iterdir() if out.exists() else ():
                shutil.move(str(block), data / block.name)
    return Backfilled(data, start, end, name, step)


BLOCK_SECONDS = 7200  # promtool's block: it reads its whole input once per block


def _write_blocks(rendered: Rendered, folder: Path) -> list[Path]:
    """OpenMetrics files, one per block of time, so that promtool reads each sample once."""
    first = int(rendered.time(0) // BLOCK_SECONDS)
    count = int(rendered.time(rendered.steps - 1) // BLOCK_SECONDS) - first + 1
    per_block = max(1, round(BLOCK_SECONDS / rendered.step))
    paths = []
    for b in range(count):
        lo = max(0, math.ceil(((first + b) * BLOCK_SECONDS - rendered.start) / rendered.step))
        part = Rendered(start=rendered.time(lo), step=rendered.step,
                        steps=min(per_block, rendered.steps - lo))
        part.series = {key: _Window(points, lo, part.steps)
                       for key, points in rendered.series.items()}
        paths.append(folder / f"series{b}.om.txt")
        write_openmetrics(part, paths[-1])
    return paths


class _Window(Mapping):
    """Samples [lo, lo + steps) of a series, indexed from 0."""

    def __init__(self, points: Mapping[int, float], lo: int, steps: int):
        self.points, self.lo, self.steps = points, lo, steps

    def __getitem__(self, i: int) -> float:
        if not 0 <= i < self.steps:
            raise KeyError(i)
        return self.points[self.lo + i]

    def __iter__(self):
        return (i for i in range(self.steps) if self.lo + i in self.points)

    def __len__(self) -> int:
        return sum(1 for _ in self)


# A looped round starts where the server is warm: its first minutes (an empty batch and cache,
# decode speeds with no history) happen once, when the server starts.
WARM_UP_SECONDS = 300
_CUMULATIVE = re.compile(r"_(total|count|sum|bucket)$")


class _Looped(Mapping):
    """One series of a rendered round, then round after round of it from `warm` on, as
    `sglang-sim serve` repeats a scenario (the same arrivals each round, the server not
    restarted): a counter goes on from where the previous round ended, a last-seen timestamp
    moves on by the round's length, any other gauge repeats. Computed per sample: days of
    samples never sit in memory."""

    def __init__(self, name: str, points: dict[int, float], last: int, warm: int, steps: int,
                 seconds: float):
        self.points, self.last, self.warm, self.steps = points, last, warm, steps
        values = [points[i] for i in sorted(points)]
        self.growth = 0.0
        if _CUMULATIVE.search(name):
            if any(b < a for a, b in zip(values, values[1:], strict=False)):
                raise BackfillError(f"{name} goes down within the round (a restart): such a "
                                    "scenario cannot be looped")
            self.growth = points.get(last, values[-1]) - points.get(warm, 0.0)
        elif name.endswith("_timestamp_seconds") and values[-1] != values[0]:
            self.growth = seconds
        # A step where the round had no sample yet (a lazy family before its first request):
        # in later rounds the series is there, with the value the previous round ended on.
        self.carried = points[last] - self.growth if last in points else None

    def _value(self, i: int) -> float | None:
        if i <= self.last:
            return self.points.get(i)
        if i >= self.steps:
            return None
        q, j = divmod(i - self.last - 1, self.last - self.warm)
        at = self.warm + j + 1
        if at in self.points:
            return self.points[at] + (q + 1) * self.growth
        return None if self.carried is None else self.carried + (q + 1) * self.growth

    def __getitem__(self, i: int) -> float:
        value = self._value(i)
        if value is None:
            raise KeyError(i)
        return value

    def __iter__(self):
        return (i for i in range(self.steps) if self._value(i) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def looped(rendered: Rendered, steps: int, warm: int = 0) -> Rendered:
    """`rendered` (one round of a scenario) extended to `steps` samples by repeating its steps
    after `warm` (`_Looped`). Simulating days step by step costs hours; a looped server
    replays the same arrivals anyway."""
    last = rendered.steps - 1
    if not 0 <= warm < last or steps <= rendered.steps:
        return rendered
    out = Rendered(start=rendered.start, step=rendered.step, steps=steps)
    seconds = (last - warm) * rendered.step
    for (name, labels), points in rendered.series.items():
        if points:
            out.series[(name, labels)] = _Looped(name, points, last, warm, steps, seconds)
    return out


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

    series = promtool_series(rendered)
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


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=cwd)
    if result.returncode != 0:
        raise BackfillError(f"{' '.join(cmd[:4])}: {result.stderr[-2000:] or result.stdout}")
