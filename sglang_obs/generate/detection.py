"""The detection table (docs/detection.md): how soon each fault notifies, how soon it is over, and
what the pipeline's timings make possible. `python -m sglang_obs.generate detection` writes it.

Three sources, each named in the document:
- the **time budget** of each alert, read from the shipped files (scrape and evaluation intervals
  from prometheus.yml, `for:`/`keep_firing_for:` from the rule files, group_wait and
  group_interval from alertmanager.yml): the worst case from onset to notification and from
  "cleared" to "resolved";
- **promtool** over every simulator scenario rendered faster than real time: when each alert
  fires and resolves, how long each state lasted, and the longest run of each state in the quiet
  scenarios (the shortest sustain that still rejects them);
- the **end-to-end run** on the real binaries at the default intervals (tests/test_alert_timing.py)
  which records what the receiver got in docs/detection-e2e.json.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_obs.core.settings import Settings
from sglang_obs.core.states import PD_STATES, STATES
from sglang_obs.generate import promtool_eval
from sglang_obs.render import feature_rules, pd_rules, rules
from sglang_obs.simulator import pd_scenario
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.pd_render import render_pd
from sglang_obs.simulator.render import Rendered, promtool_series, render

DOC = "detection.md"  # in docs/
E2E_RESULTS = "detection-e2e.json"  # in docs/, written by tests/test_alert_timing.py
NOTIFY_WITHIN_SECONDS = 90  # onset -> first notification at the receiver
RESOLVE_WITHIN_SECONDS = 120  # condition cleared -> resolved at the receiver
RESOLVE_LOOKAHEAD = 240  # how long after the clear promtool looks for the resolution
LOOK_AROUND_ONSET = 180  # the class's alert counts when it first fires this close to the onset

# The alert that names each fault class.
CLASS_ALERT = {
    "unavailable": "SGLangServerDown",
    "prefill_backlog": "SGLangPrefillBacklog",
    "decode_contention": "SGLangDecodeContention",
    "kv_capacity": "SGLangKVCachePressure",
    "scheduling_bottleneck": "SGLangSchedulingBottleneck",
    "gpu_lost": "GPULost",
    **pd_rules.ALERTS,  # a PD deployment's states (docs/pd.md)
    **feature_rules.ALERTS,  # a feature that stopped paying (docs/features.md)
}
# A feature alert's condition is a duration ("collapsed for 10 minutes"): its scenario's truth
# window opens once that has held, so its budget from onset is the pipeline, without the for:.
FEATURE_ALERTS = frozenset(feature_rules.ALERTS.values())
QUIET_CLASSES = ("healthy", "idle")
ALWAYS_FIRING = {"Watchdog"}
# The states whose alert a quiet scenario must never reach: their longest quiet run bounds the
# sustain from below.
GUARDED_STATES = ("unavailable", *rules.SATURATION_STATES)
PD_GUARDED_STATES = pd_rules.SATURATION
# The TTFT decomposition must explain the gateway's TTFT to within this share on every PD
# scenario (cluster:sglang_pd_ttft_unexplained:ratio1m), once requests have flowed this long.
TTFT_UNEXPLAINED_RATIO = 0.10
TTFT_WARM_UP_SECONDS = 120
# The prefix-cache hit ratio from counters against the cache_hit_rate gauge: every window of
# this length ending on a multiple of it, compared with the requests that finished inside it.
CACHE_WINDOW_SECONDS = 300
CACHE_RATIO_WITHIN = 0.01  # |counters - truth|, as a ratio (one percentage point)
CACHE_MIN_REQUESTS = 20  # a window with fewer finished requests has no meaningful ratio
CACHE_COUNTERS = "instance_model:sglang_cache_hit:ratio_rate5m"
CACHE_GAUGE = 'avg(avg_over_time(sglang:cache_hit_rate{job="sglang"}[5m]))'
CACHE_TIER = "instance_model_source:sglang_cache_hit:ratio_rate5m"  # {cache_source=...}
CACHE_TIERS = ("device", "host")  # HiCache's first two tiers (storage: an L3 backend)
MAX_RUN = 12  # evaluations: runs are counted up to this length

_SAMPLE = re.compile(r"\{([^}]*)\} ([-+0-9.eE]+|NaN)")


def available() -> list[str]:
    """Every shipped scenario: single servers, then PD deployments."""
    return scenarios.available() + pd_scenario.available()


def load_scenario(name: str):
    """A shipped scenario by name: a PD deployment's or a single server's."""
    return pd_scenario.load(name) if name in pd_scenario.available() else scenarios.load(name)


def quiet_scenarios(pd: bool = False) -> list[str]:
    """Scenarios (PD deployments with `pd`) whose whole ground truth is healthy or idle:
    nothing may notify on them."""
    names = pd_scenario.available() if pd else scenarios.available()
    return [n for n in names
            if (t := load_scenario(n).truth) and all(w.cls in QUIET_CLASSES for w in t)]


# -- the time budget ----------------------------------------------------------------------------
def seconds(duration: str | int | float) -> float:
    if isinstance(duration, int | float):
        return float(duration)
    total, unit = 0.0, {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    for number, suffix in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration):
        total += float(number) * unit[suffix]
    return total


@dataclass(frozen=True)
class Budget:
    """The pipeline's steps for one alert, in seconds, from the shipped configuration."""

    alert: str
    severity: str
    scrape: float  # the signal's scrape interval (the exporter's job for exporter signals)
    evaluation: float
    sustain: float  # for:
    group_wait: float
    keep_firing: float
    group_interval: float

    @property
    def notify_worst(self) -> float:
        # The signal lands up to one scrape late; the recording rule and then the alert (another
        # group, with its own offset) each evaluate up to one interval later; then the sustain
        # and Alertmanager's wait for the rest of the group. A feature alert's sustain is part
        # of its condition, already held at its onset.
        sustain = 0.0 if self.alert in FEATURE_ALERTS else self.sustain
        return self.scrape + 2 * self.evaluation + sustain + self.group_wait

    @property
    def resolve_worst(self) -> float:
        # The cleared signal takes the same path, then keep_firing_for, then the group's next
        # flush (group_interval) carries "resolved".
        return self.scrape + 2 * self.evaluation + self.keep_firing + self.group_interval


def _route_for(severity: str, am: dict) -> dict:
    root = am["route"]
    for route in root.get("routes", []):
        for matcher in route.get("matchers", []):
            name, _, value = re.match(r'(\w+)(=~|=)"(.*)"', matcher).groups()
            if name == "severity" and re.fullmatch(value, severity):
                return {**root, **route}
    return root


def step_seconds(s: Settings) -> int:
    """The simulated Prometheus scrapes and evaluates at prometheus.yml's evaluation interval."""
    return int(s.evaluation_interval_s)


def budgets(s: Settings) -> dict[str, Budget]:
    prom = s.prometheus
    am = yaml.safe_load(s.alertmanager_file.read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    t = rules.inputs(s)
    exporter = jobs[t["selectors"]["exporter_job"]].get("scrape_interval",
                                                        prom["global"]["scrape_interval"])
    evaluation = seconds(prom["global"]["evaluation_interval"])
    # A state alert's sustain is its for: plus a window over the state (rules.state_expr).
    state_sustain = {CLASS_ALERT[k]: seconds(t["sustain"][k])
                     for k in (*rules.SATURATION_STATES, *pd_rules.SATURATION)}
    # A PD state reads SGLang's and the gateway's own series, scraped at their jobs' intervals.
    pd_scrape = max(seconds(jobs[t["selectors"][k]].get("scrape_interval",
                                                        prom["global"]["scrape_interval"]))
                    for k in ("sglang_job", "gateway_job"))
    pd_alerts = set(pd_rules.ALERTS.values())
    # A feature alert reads SGLang's own counters.
    sglang_scrape = seconds(jobs[t["selectors"]["sglang_job"]].get(
        "scrape_interval", prom["global"]["scrape_interval"]))
    out = {}
    for path in promtool_eval.rule_files(s):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                if r.get("alert") not in CLASS_ALERT.values():
                    continue
                route = _route_for(r["labels"]["severity"], am)
                scrape = (pd_scrape if r["alert"] in pd_alerts else sglang_scrape
                          if r["alert"] in FEATURE_ALERTS else seconds(exporter))
                out[r["alert"]] = Budget(
                    r["alert"], r["labels"]["severity"], scrape, evaluation,
                    state_sustain.get(r["alert"], seconds(r.get("for", "0s"))),
                    seconds(route["group_wait"]),
                    seconds(r.get("keep_firing_for", "0s")), seconds(route["group_interval"]))
    return out


# -- promtool over the scenarios ------------------------------------------------------------
@dataclass
class Detection:
    scenario: str
    first_fired: dict[str, float] = field(default_factory=dict)  # alertname -> seconds
    state_seconds: dict[str, float] = field(default_factory=dict)  # state -> seconds
    truth: list[scenarios.Truth] = field(default_factory=list)
    # Per truth window: first firing of its class's alert near the onset (seconds), or the
    # alerts that fired inside a quiet window.
    per_window: list = field(default_factory=list)
    # Per truth window with an alert: when it last fired before RESOLVE_LOOKAHEAD after the
    # clear (seconds), None if never.
    last_fired: list = field(default_factory=list)
    # Quiet scenarios: the longest run of each guarded state, in consecutive evaluations.
    longest_runs: dict[str, int] = field(default_factory=dict)
    end: float = 0.0
    step: int = 0  # seconds between evaluations
    pd: bool = False  # a PD deployment's scenario
    # PD: the share of the gateway's mean TTFT the stages leave unexplained, over the whole run
    # and over each truth window (pd_rules.ttft_unexplained), and the largest magnitude of the
    # recorded 1-min ratio after TTFT_WARM_UP_SECONDS.
    ttft_unexplained_run: float | None = None
    ttft_unexplained_windows: list = field(default_factory=list)
    ttft_unexplained_minute_max: float | None = None
    # Single server: per CACHE_WINDOW_SECONDS window (end seconds, requests finished in it,
    # truth, ratio from counters, mean of the gauge, whether the counters were scraped
    # throughout it); None where the series had no value.
    cache_windows: list = field(default_factory=list)
    # HiCache scenarios: per window, (end seconds, requests, {tier: (truth, counters)},
    # counted throughout) for each of CACHE_TIERS.
    tier_windows: list = field(default_factory=list)

    def latency(self, index: int) -> float | None:
        fired = self.per_window[index]
        return None if fired is None else max(fired - self.truth[index].start, 0.0)

    def resolved_after_clear(self, index: int) -> float | None:
        """Seconds from the window's end to the first evaluation without the alert, None if it
        still fires RESOLVE_LOOKAHEAD after, or the scenario ends first."""
        last, t = self.last_fired[index], self.truth[index]
        if last is None:
            return None
        resolved = last + self.step
        if resolved >= min(t.end + RESOLVE_LOOKAHEAD, self.end):
            return None
        return max(resolved - t.end, 0.0)


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', text))


def _promtool_time(seconds: int) -> str:
    """An evaluation time as promtool prints it (Prometheus's duration: 0s, 15s, 10m, 1h15s)."""
    if not seconds:
        return "0s"
    parts, rest = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


def _parse_got(output: str, expr: str, at: int | None = None
               ) -> list[tuple[dict[str, str], float]]:
    """promtool's samples for `expr` (escaped as promtool prints it), at eval time `at` when the
    same expression is evaluated at several."""
    when = "" if at is None else f", time: {_promtool_time(at)},"
    block = output.split(f'expr: "{expr}"{when}', 1)
    if len(block) < 2:
        return []  # promtool passed: nothing matched
    got = block[1].split("got:", 1)[1].split("\n", 1)[0]
    return [(_labels(lab), float(v)) for lab, v in _SAMPLE.findall(got)]


# After a scenario's own crash, the restart alerts are right, not false: they report the crash.
CRASH_ALERTS = "SGLangContainerRestarting|SGLangOOMKilled"


def _window_exprs(truth: list[scenarios.Truth], crashes: bool, end: int, step: int
                  ) -> list[tuple[str, int]]:
    """(expr, eval time) per truth window: the class's alert around its onset, or any alert
    inside a quiet window; then, per alerting window, the alert's last firing after onset."""
    ignore = "Watchdog|" + CRASH_ALERTS if crashes else "Watchdog"
    out, last = [], []
    for t in truth:
        alert = CLASS_ALERT.get(t.cls)
        if alert:
            firing = f'timestamp(ALERTS{{alertstate="firing", alertname="{alert}"}})'
            out.append((f"min_over_time({firing}[{2 * LOOK_AROUND_ONSET}s:{step}s])",
                        int(t.start) + LOOK_AROUND_ONSET))
            until = min(int(t.end) + RESOLVE_LOOKAHEAD, end)
            last.append((f"max_over_time({firing}[{until - int(t.start)}s:{step}s])", until))
        else:
            out.append((f'max_over_time(ALERTS{{alertstate="firing", alertname!~"{ignore}"}}'
                        f'[{int(t.end - t.start)}s:{step}s])', int(t.end)))
    return out + last


def _run_exprs(end: int, step: int, pd: bool = False) -> list[tuple[str, int]]:
    """For each guarded state and n evaluations: the most evaluations of that state within any
    n consecutive ones. The longest run is the largest n that is all of them."""
    code, states, guarded = ((pd_rules.CLUSTER_CODE, PD_STATES, PD_GUARDED_STATES) if pd
                             else ("instance:sglang_state:code", STATES, GUARDED_STATES))
    return [(f"max_over_time(count_over_time(({code} == "
             f"{states.index(state)})[{n * step - 1}s:{step}s])[{end}s:{step}s])", end)
            for state in guarded for n in range(1, MAX_RUN + 1)]


def evaluate(rendered: Rendered, truth: list[scenarios.Truth], workdir: Path, s: Settings,
             crashes: bool = False, runs: bool = False, pd: bool = False) -> Detection:
    series = promtool_series(rendered)
    step = int(rendered.step)
    end = int(rendered.steps - 1) * step
    window = f"{end}s:{step}s"
    fired_expr = f'min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{window}])'
    state_series = "cluster:sglang_pd_state:class" if pd else "instance:sglang_state:class"
    state_expr = f"count_over_time({state_series}[{window}])"
    windows = _window_exprs(truth, crashes, end, step)
    run_exprs = _run_exprs(end, step, pd) if runs else []
    guarded = PD_GUARDED_STATES if pd else GUARDED_STATES
    ttft_exprs = []
    if pd:
        t = rules.inputs(s)
        ratio = "cluster:sglang_pd_ttft_unexplained:ratio1m"
        settled = f"{end - TTFT_WARM_UP_SECONDS}s:{step}s"
        ttft_exprs = [(f"max_over_time(abs({ratio})[{settled}])", end),
                      (pd_rules.ttft_unexplained(t, f"{end}s"), end)]
        ttft_exprs += [(pd_rules.ttft_unexplained(t, f"{int(w.end - w.start)}s"),
                        min(int(w.end), end)) for w in truth]
    cache_ends = ([] if pd else
                  list(range(CACHE_WINDOW_SECONDS, end + 1, CACHE_WINDOW_SECONDS)))
    cache_exprs = [(e, at) for at in cache_ends for e in (CACHE_COUNTERS, CACHE_GAUGE)]
    tiered = any(host for *_, host in rendered.finished)  # a request loaded from the host tier
    tier_exprs = [(f'{CACHE_TIER}{{cache_source="{tier}"}}', at)
                  for at in (cache_ends if tiered else []) for tier in CACHE_TIERS]
    cache_exprs += tier_exprs
    exprs = ([(fired_expr, end), (state_expr, end)] + windows + run_exprs + ttft_exprs
             + cache_exprs)
    output = promtool_eval.evaluate(series, [(e, min(at, end)) for e, at in exprs], step,
                                    workdir, s, "detection")

    def got(expr, at=None):
        return _parse_got(output, expr.replace('"', '\\"').replace("\n", "\\n"), at)

    d = Detection("", truth=truth, end=float(end), step=step, pd=pd)
    for labels, value in got(fired_expr):
        name = labels["alertname"]
        d.first_fired[name] = min(d.first_fired.get(name, value), value)
    for labels, value in got(state_expr):
        d.state_seconds[labels["state"]] = d.state_seconds.get(labels["state"], 0) + value * step
    alerting = [t for t in truth if CLASS_ALERT.get(t.cls)]
    first, last = windows[:len(truth)], windows[len(truth):]
    for (expr, _), t in zip(first, truth, strict=True):
        samples = got(expr)
        if CLASS_ALERT.get(t.cls):
            d.per_window.append(min((v for _, v in samples), default=None))
        else:
            d.per_window.append(sorted({lab["alertname"] for lab, _ in samples}))
    by_window = iter(max((v for _, v in got(expr)), default=None) for expr, _ in last)
    d.last_fired = [next(by_window) if CLASS_ALERT.get(t.cls) else None for t in truth]
    assert len(alerting) == len(last)
    if pd:
        values = [next((v for _, v in got(expr, at)), None) for expr, at in ttft_exprs]
        d.ttft_unexplained_minute_max, d.ttft_unexplained_run = values[:2]
        d.ttft_unexplained_windows = values[2:]
    for at in cache_ends:
        rows = [(n, c, h) for t, n, c, h in rendered.finished
                if at - CACHE_WINDOW_SECONDS < t <= at]
        prompt = sum(n for n, _, _ in rows)
        whole = _counted_throughout(rendered, at - CACHE_WINDOW_SECONDS, at)
        counters, gauge = (next((v for _, v in got(e, at)), None)
                           for e in (CACHE_COUNTERS, CACHE_GAUGE))
        d.cache_windows.append((at, len(rows), sum(c for _, c, _ in rows) / prompt
                                if prompt else None, counters, gauge, whole))
        if tiered:
            # Per request: its device hits and its host hits, CACHE_TIERS' order.
            split = [(c - h, h) for _, c, h in rows]
            tiers = {}
            for i, tier in enumerate(CACHE_TIERS):
                truth_share = sum(r[i] for r in split) / prompt if prompt else None
                expr = f'{CACHE_TIER}{{cache_source="{tier}"}}'
                tiers[tier] = (truth_share, next((v for _, v in got(expr, at)), None))
            d.tier_windows.append((at, len(rows), tiers, whole))
    for i, state in enumerate(guarded):
        longest = 0
        for n in range(1, MAX_RUN + 1):
            expr = run_exprs[i * MAX_RUN + n - 1][0] if runs else None
            if expr and max((v for _, v in got(expr)), default=0) >= n:
                longest = n
        if runs:
            d.longest_runs[state] = longest
    return d


def _counted_throughout(rendered: Rendered, start: int, end: int) -> bool:
    """Whether the token counters the ratio reads were scraped from `start` to `end` without a
    gap or a reset: a request that finished before a series' first sample (the tokenizer's
    families appear with the first request) or before a restart is in no rate()."""
    steps = range(start // int(rendered.step), end // int(rendered.step) + 1)
    seen = False
    for (name, _), points in rendered.series.items():
        if name not in ("sglang:prompt_tokens_total", "sglang:cached_tokens_total"):
            continue
        values = [points.get(i) for i in steps]
        if all(v is None for v in values):
            continue
        if None in values or any(b < a for a, b in zip(values, values[1:], strict=False)):
            return False
        seen = True
    return seen


def detect(name: str, s: Settings, rendered: Rendered | None = None) -> Detection:
    """Scenario `name` rendered (or as `rendered`, the same render done by the caller:
    step_seconds(s), poll interval 5 s, start 0) and evaluated with the configuration's rule
    files."""
    sc = load_scenario(name)
    pd = isinstance(sc, pd_scenario.PdScenario)
    if rendered is None and pd:
        rendered = render_pd(sc, step=step_seconds(s), poll_interval=5.0, start=0.0)
    elif rendered is None:
        rendered = render(sc, step=step_seconds(s), poll_interval=5.0, start=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        crashes = any(f.kind == "crash" for f in sc.faults)
        d = evaluate(rendered, list(sc.truth), Path(tmp), s, crashes,
                     runs=name in quiet_scenarios(pd), pd=pd)
    d.scenario = name
    return d


# -- the document -------------------------------------------------------------------------------
def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} s"


def load_e2e(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _budget_table(b: dict[str, Budget]) -> list[str]:
    lines = [
        "| alert | severity | signal scraped every | evaluation | sustain (`for:`) | group_wait "
        "| **onset → notification, worst case** | `keep_firing_for:` | group_interval "
        "| **clear → resolved, worst case** |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for cls, name in CLASS_ALERT.items():
        x = b[name]
        lines.append(
            f"| {name} ({cls}) | {x.severity} | {_fmt(x.scrape)} | {_fmt(x.evaluation)} "
            f"| {_fmt(x.sustain)} | {_fmt(x.group_wait)} | **{_fmt(x.notify_worst)}** "
            f"| {_fmt(x.keep_firing)} | {_fmt(x.group_interval)} | **{_fmt(x.resolve_worst)}** |")
    return lines


def _runs_table(results: list[Detection], b: dict[str, Budget], pd: bool = False) -> list[str]:
    quiet = [r for r in results if r.longest_runs and r.pd == pd]
    alert_of = {"unavailable": "SGLangServerDown", **CLASS_ALERT}
    lines = ["| state | alert | sustain | " + " | ".join(f"held in `{r.scenario}`" for r in quiet)
             + " | rejected |", "|---|---|---|" + "---|" * len(quiet) + "---|"]
    for state in PD_GUARDED_STATES if pd else GUARDED_STATES:
        sustain = b[alert_of[state]].sustain
        held = [(r.longest_runs[state] - 1) * r.step if r.longest_runs[state] else None
                for r in quiet]
        longest = max((h for h in held if h is not None), default=None)
        ok = longest is None or longest < sustain
        lines.append(f"| `{state}` | {alert_of[state]} | {_fmt(sustain)} | "
                     + " | ".join("never" if h is None else _fmt(h) for h in held)
                     + f" | {'yes' if ok else 'NO'} |")
    return lines


def _promtool_table(results: list[Detection], b: dict[str, Budget]) -> list[str]:
    lines = ["| scenario | ground truth (onset–clear) | expected alert | fired after onset "
             "| + group_wait = notification | resolved after clear | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        for i, t in enumerate(r.truth):
            alert = CLASS_ALERT.get(t.cls)
            span = f"{t.cls} ({t.start:.0f}–{t.end:.0f} s)"
            if not alert:
                verdict = ("quiet" if not r.per_window[i]
                           else "FALSE ALERT: " + ", ".join(r.per_window[i]))
                lines.append(f"| `{r.scenario}` | {span} | none | — | — | — | {verdict} |")
                continue
            latency = r.latency(i)
            notify = None if latency is None else latency + b[alert].group_wait
            resolved = r.resolved_after_clear(i)
            ok = notify is not None and notify <= NOTIFY_WITHIN_SECONDS
            verdict = "on time" if ok else "LATE" if notify is not None else "MISSED"
            if t.end >= r.end:
                resolved_text = "(lasts to the end)"
            else:
                resolved_text = _fmt(resolved) if resolved is not None else "NOT RESOLVED"
            lines.append(f"| `{r.scenario}` | {span} | {alert} | {_fmt(latency)} "
                         f"| {_fmt(notify)} | {resolved_text} | {verdict} |")
    return lines


def _ratio(value: float | None) -> str:
    # A share under 0.05 % is 0, unsigned: its sign is rounding noise that flips between runs.
    if value is None:
        return "—"
    return "0.0%" if abs(value) < 0.0005 else f"{value:+.1%}"


def _ttft_table(results: list[Detection]) -> list[str]:
    lines = ["| scenario | whole run | each ground-truth window | worst 1-min ratio after "
             f"{TTFT_WARM_UP_SECONDS} s | closes within {TTFT_UNEXPLAINED_RATIO:.0%} |",
             "|---|---|---|---|---|"]
    for r in results:
        if not r.pd:
            continue
        windows = ", ".join(f"{t.cls} {_ratio(v)}"
                            for t, v in zip(r.truth, r.ttft_unexplained_windows, strict=True))
        closes = all(v is not None and abs(v) <= TTFT_UNEXPLAINED_RATIO
                     for v in (r.ttft_unexplained_run, *r.ttft_unexplained_windows))
        minute = r.ttft_unexplained_minute_max
        lines.append(f"| `{r.scenario}` | {_ratio(r.ttft_unexplained_run)} | {windows} "
                     f"| {'—' if minute is None else f'{minute:.1%}'} "
                     f"| {'yes' if closes else 'NO'} |")
    return lines


def cache_errors(d: Detection) -> tuple[int, float | None, float | None]:
    """(windows compared, worst |counters - truth|, worst |gauge - truth|) over the windows
    with at least CACHE_MIN_REQUESTS finished requests whose counters were scraped throughout."""
    rows = [w for w in d.cache_windows
            if w[1] >= CACHE_MIN_REQUESTS and w[2] is not None and w[5]]
    counters = [abs(c - t) for _, _, t, c, _, _ in rows if c is not None]
    gauge = [abs(g - t) for _, _, t, _, g, _ in rows if g is not None]
    return len(rows), max(counters, default=None), max(gauge, default=None)


def _points(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} pp"


def _cache_table(results: list[Detection]) -> list[str]:
    lines = ["| scenario | windows | worst error, counters | worst error, gauge |",
             "|---|---|---|---|"]
    for d in results:
        if d.pd:
            continue
        n, counters, gauge = cache_errors(d)
        lines.append(f"| `{d.scenario}` | {n} | {_points(counters)} | {_points(gauge)} |")
    return lines


def tier_errors(d: Detection) -> dict[str, tuple[float | None, float | None, float | None]]:
    """Per tier: (truth's lowest, truth's highest, worst |counters - truth|) over the windows
    cache_errors compares."""
    rows = [w for w in d.tier_windows if w[1] >= CACHE_MIN_REQUESTS and w[3]]
    out = {}
    for tier in CACHE_TIERS:
        pairs = [w[2][tier] for w in rows if w[2][tier][0] is not None]
        truths = [t for t, _ in pairs]
        errors = [abs(c - t) for t, c in pairs if c is not None]
        out[tier] = (min(truths, default=None), max(truths, default=None),
                     max(errors, default=None) if len(errors) == len(pairs) else None)
    return out


def _tier_section(results: list[Detection]) -> list[str]:
    tiered = [d for d in results if d.tier_windows]
    if not tiered:
        return []
    lines = [
        "With HiCache the hits come from two tiers: the device's radix cache and the host",
        "memory behind it. The tokenizer splits `cached_tokens_total` by `cache_source`, and",
        f"`{CACHE_TIER}` divides each tier's rate by the prompt tokens'. Over the same",
        "windows, each tier against the simulated requests' own split (the gauge has no",
        "tiers: one number for both):",
        "",
        "| scenario | tier | truth, lowest–highest window | worst error, counters |",
        "|---|---|---|---|"]
    for d in tiered:
        for tier, (low, high, error) in tier_errors(d).items():
            span = "—" if low is None else f"{low:.1%}–{high:.1%}"
            lines.append(f"| `{d.scenario}` | {tier} | {span} | {_points(error)} |")
    return [*lines, ""]


def _e2e_table(e2e: dict) -> list[str]:
    lines = [
        "| scenario | fault (onset–clear, s) | expected | notifications (firing) | resolved "
        "| groups | onset → first notification | clear → resolved | verdict |",
        "|---|---|---|---|---|---|---|---|---|"]
    for row in e2e["scenarios"]:
        expected = row.get("expected") or "none"
        onset = row.get("onset_to_notification")
        cleared = row.get("clear_to_resolved")
        ok = (row["notifications"] == 0 if expected == "none" else
              onset is not None and onset <= NOTIFY_WITHIN_SECONDS
              and (cleared is None and row.get("clear") is None
                   or cleared is not None and cleared <= RESOLVE_WITHIN_SECONDS))
        fault = (f"{row['class']} ({row['onset']:.0f}–{row['clear']:.0f})" if row.get("clear")
                 else f"{row['class']} ({row['onset']:.0f}–)" if row.get("onset") is not None
                 else row["class"])
        no_clear = row.get("clear") is None and expected != "none"
        lines.append(
            f"| `{row['scenario']}` | {fault} | {expected} | {row['notifications']} "
            f"| {row['resolved']} | {row['groups']} | {_fmt(onset)} "
            f"| {'(does not clear)' if no_clear else _fmt(cleared)} "
            f"| {'yes' if ok else 'NO'} |")
    return lines


def markdown(results: list[Detection], s: Settings, e2e: dict | None = None) -> str:
    b = budgets(s)
    step = step_seconds(s)
    lines = [
        "# Detection table",
        "",
        "Generated by `python -m sglang_obs.generate detection` (part of `make generate`; a test",
        "checks it is current). Targets: the first notification for the fault's class at the",
        f"receiver within {NOTIFY_WITHIN_SECONDS} s of its onset, \"resolved\" within "
        f"{RESOLVE_WITHIN_SECONDS} s of the condition",
        "clearing, one notification per incident per server, and nothing at all on the quiet",
        "scenarios (" + ", ".join(f"`{n}`" for n in quiet_scenarios() + quiet_scenarios(True))
        + ").",
        "How the alerts are grouped and why symptoms stay silent: [alerting.md](alerting.md).",
        "",
        "## The time budget",
        "",
        "From the shipped files at their default intervals (prometheus.yml, the rule files,",
        "alertmanager.yml). Worst case onset → notification: one scrape of the signal, two",
        "evaluations (the recording rule, then the alert in its own group), the sustain, and",
        "group_wait. Worst case clear → resolved: the same path, `keep_firing_for:`, and the",
        "group's next flush (group_interval). A feature alert's sustain is part of its",
        "condition (\"collapsed for 10 minutes\"): its onset is the moment that has held, so its",
        "worst case leaves the sustain out; the 1-minute rate it reads adds up to a minute,",
        "measured below.",
        "",
        *_budget_table(b),
        "",
        "## Sustain: the shortest that rejects the quiet scenarios",
        "",
        "promtool over each quiet scenario: the longest time each state held without a break",
        f"(consecutive evaluations at {step} s). An alert whose sustain is longer never fires "
        "there;",
        "anything longer than needed only delays the notification.",
        "",
        *_runs_table(results, b),
        "",
        "The same for a PD deployment's states (docs/pd.md) on its quiet scenario:",
        "",
        *_runs_table(results, b, pd=True),
        "",
        "## Every scenario, evaluated by promtool",
        "",
        f"Rendered at a {step} s step and evaluated with the shipped rule files. *Fired after",
        "onset* is promtool's; the notification adds the route's group_wait (Alertmanager is not",
        "simulated here: the end-to-end run below measures it). After a scenario's own crash,",
        "the restart alerts that report it are not counted as false.",
        "",
        *_promtool_table(results, b),
        "",
        "## The PD TTFT decomposition closes",
        "",
        "The gateway's mean TTFT against the sum of the mean time in each stage on a PD",
        "request's critical path (" + ", ".join(f"`{x}`" for x in pd_rules.TTFT_STAGES) + "),",
        "as a share of the TTFT left unexplained (`pd_rules.ttft_unexplained`, the definition",
        "of `cluster:sglang_pd_ttft_unexplained:ratio1m` over any window); negative when the",
        "stages add up to more. Over the whole run and over each ground-truth window it closes",
        f"within {TTFT_UNEXPLAINED_RATIO:.0%}. The recorded ratio is a 1-min view: each stage is",
        "observed when it ends, so while requests take longer than a minute from their",
        "bootstrap to their first token (a backlog that builds or drains) one minute's stages",
        "and its first tokens belong to different requests, and that minute reads far from 0.",
        "",
        *_ttft_table(results),
        "",
        "## The prefix-cache hit ratio: counters against the gauge",
        "",
        f"Every {CACHE_WINDOW_SECONDS // 60}-minute window of each single-server scenario "
        f"with at least {CACHE_MIN_REQUESTS} finished",
        "requests, whose token counters were scraped from its start to its end (not the first",
        "window, where the tokenizer's families appear with the first request, nor one with a",
        "restart: requests finished before a series' first sample or before a reset are in no",
        "`rate()`). The truth is the simulated requests' own prefix-cached tokens over their",
        f"prompt tokens; `{CACHE_COUNTERS}` is the shipped ratio of",
        "`cached_tokens_total` to `prompt_tokens_total` over the same window, and the gauge is",
        f"`{CACHE_GAUGE}`: `cache_hit_rate` holds the last prefill",
        "batch's ratio (and up to 0.5.19 is zeroed by every decode report, see",
        "[features.md](features.md#cache_hit_rate-is-a-per-batch-gauge)). The counters stay",
        f"within {CACHE_RATIO_WITHIN * 100:.0f} percentage point of the truth; the gauge does "
        "not.",
        "",
        *_cache_table(results),
        "",
        *_tier_section(results),
        "## Measured end to end",
        "",
    ]
    if e2e:
        lines += [
            f"`{e2e['command']}` ({e2e['date']}): {e2e['setup']} Times are wall-clock seconds",
            "at the receiver (the alert sink), from the scenario's onset and clear.",
            "*Notifications* counts the server's webhook deliveries that bring news: an alert",
            "firing that the group's previous delivery did not have firing (the first, and a",
            "class change). *Resolved* counts the others that resolve something: \"resolved\"",
            "of the whole group, or an update where one alert of the group resolved while the",
            "rest still fire. *Groups* counts distinct Alertmanager group keys.",
            "",
            *_e2e_table(e2e),
            "",
        ]
    else:
        lines += ["Not recorded yet: run "
                  "`SGLANG_OBS_RECORD_E2E=1 pytest tests/test_alert_timing.py`.", ""]
    lines += ["## Every alert that fired (promtool)", "",
              "| scenario | alerts (first firing, seconds from the scenario's start) "
              "| time per state |", "|---|---|---|"]
    for r in results:
        fired = ", ".join(f"{a} {t:.0f}" for a, t in sorted(r.first_fired.items(),
                                                             key=lambda x: x[1])
                          if a not in ALWAYS_FIRING) or "none"
        states = ", ".join(f"{s} {v:.0f} s" for s, v in sorted(r.state_seconds.items(),
                                                               key=lambda x: -x[1]))
        lines.append(f"| `{r.scenario}` | {fired} | {states} |")
    return "\n".join(lines) + "\n"
