"""The detection table (docs/detection.md): which alerts fire on each simulated scenario, and
how soon after the onset of its fault. `python -m sglang_obs.generate.detection` regenerates it.

Each scenario is rendered faster than real time (simulator.render), then promtool evaluates the
shipped rule files over it as a unit test with no expectations: its failure report lists, for
the whole run, when each alert first fired and how long each server spent in each state. Only
the real rules and promtool are involved, so the table shows what Prometheus would do.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sglang_obs import config_dir
from sglang_obs.generate import rules
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.render import Rendered, render

ROOT = config_dir.resolve()  # prometheus/, alertmanager/, grafana/
# Recording rules before the alerts that read them; promtool otherwise evaluates the groups in
# a random order at each step, and an alert may see the previous step's recorded values.
RULE_FILES = [rules.RULES_DIR / name for name, _ in rules.RULE_FILES]


def group_eval_order() -> list[str]:
    return [g["name"] for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
DOC = (config_dir.checkout() or ROOT) / "docs" / "detection.md"  # a developer command
STEP = 15  # seconds: the scrape and evaluation interval of the simulated Prometheus
PAGE_WITHIN_SECONDS = 180

# The alert that names each bottleneck class.
CLASS_ALERT = {
    "unavailable": "SGLangServerDown",
    "prefill_backlog": "SGLangPrefillBacklog",
    "decode_contention": "SGLangDecodeContention",
    "kv_capacity": "SGLangKVCachePressure",
    "scheduling_bottleneck": "SGLangSchedulingBottleneck",
}
QUIET_CLASSES = ("healthy", "idle")
ALWAYS_FIRING = {"Watchdog"}

_SAMPLE = re.compile(r"\{([^}]*)\} ([-+0-9.eE]+|NaN)")


@dataclass
class Detection:
    scenario: str
    first_fired: dict[str, float] = field(default_factory=dict)  # alertname -> seconds
    state_seconds: dict[str, float] = field(default_factory=dict)  # state -> seconds
    truth: list[scenarios.Truth] = field(default_factory=list)
    # Per truth window: first firing of its class's alert near the onset (seconds), or the
    # alerts that fired inside a quiet window.
    per_window: list = field(default_factory=list)

    def latency(self, index: int) -> float | None:
        fired = self.per_window[index]
        return None if fired is None else max(fired - self.truth[index].start, 0.0)


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', text))


def _parse_got(output: str, expr: str) -> list[tuple[dict[str, str], float]]:
    block = output.split(f'expr: "{expr}"', 1)
    if len(block) < 2:
        return []  # promtool passed: nothing matched
    got = block[1].split("got:", 1)[1].split("\n", 1)[0]
    return [(_labels(lab), float(v)) for lab, v in _SAMPLE.findall(got)]


# After a scenario's own crash, the restart alerts are right, not false: they report the crash.
CRASH_ALERTS = "SGLangContainerRestarting|SGLangOOMKilled"


def _window_exprs(truth: list[scenarios.Truth], crashes: bool) -> list[tuple[str, int]]:
    """(expr, eval time) per truth window: the class's alert around its onset, or any alert
    inside a quiet window."""
    ignore = "Watchdog|" + CRASH_ALERTS if crashes else "Watchdog"
    out = []
    for t in truth:
        alert = CLASS_ALERT.get(t.cls)
        if alert:
            out.append((f'min_over_time(timestamp(ALERTS{{alertstate="firing", '
                        f'alertname="{alert}"}})[{2 * PAGE_WITHIN_SECONDS}s:{STEP}s])',
                        int(t.start) + PAGE_WITHIN_SECONDS))
        else:
            out.append((f'max_over_time(ALERTS{{alertstate="firing", alertname!~"{ignore}"}}'
                        f'[{int(t.end - t.start)}s:{STEP}s])', int(t.end)))
    return out


def evaluate(rendered: Rendered, truth: list[scenarios.Truth], workdir: Path,
             crashes: bool = False):
    promtool = shutil.which("promtool")
    if not promtool:
        raise SystemExit("promtool not found: apt-get install prometheus")
    series = _input_series(rendered)
    end = int(rendered.steps - 1) * STEP
    window = f"{end}s:{STEP}s"
    fired_expr = f'min_over_time(timestamp(ALERTS{{alertstate="firing"}})[{window}])'
    state_expr = f"count_over_time(instance:sglang_state:class[{window}])"
    exprs = [(fired_expr, end), (state_expr, end)] + _window_exprs(truth, crashes)
    test = {
        "rule_files": [str(p) for p in RULE_FILES],
        "evaluation_interval": f"{STEP}s",
        "group_eval_order": group_eval_order(),
        "tests": [{
            "interval": f"{STEP}s",
            "input_series": series,
            "promql_expr_test": [{"expr": e, "eval_time": f"{min(at, end)}s", "exp_samples": []}
                                 for e, at in exprs],
        }],
    }
    path = workdir / "detection_test.yml"
    path.write_text(yaml.safe_dump(test, width=1_000_000, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=1800)
    output = result.stdout + result.stderr
    if "FAILED" not in output and result.returncode != 0:
        raise RuntimeError(f"promtool failed:\n{output[-3000:]}")

    def got(expr):
        return _parse_got(output, expr.replace('"', '\\"'))

    first: dict[str, float] = {}
    for labels, value in got(fired_expr):
        name = labels["alertname"]
        first[name] = min(first.get(name, value), value)
    states: dict[str, float] = {}
    for labels, value in got(state_expr):
        states[labels["state"]] = states.get(labels["state"], 0) + value * STEP
    per_window = []
    for (expr, _), t in zip(exprs[2:], truth, strict=True):
        samples = got(expr)
        if CLASS_ALERT.get(t.cls):
            per_window.append(min((v for _, v in samples), default=None))
        else:
            per_window.append(sorted({lab["alertname"] for lab, _ in samples}))
    return first, states, per_window


def _input_series(rendered: Rendered) -> list[dict]:
    out = []
    for (name, labels), points in sorted(rendered.series.items()):
        values = " ".join(repr(float(points[i])) if i in points else "_"
                          for i in range(rendered.steps))
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        out.append({"series": f"{name}{{{label_text}}}", "values": values})
    return out


def detect(name: str, rendered: Rendered | None = None) -> Detection:
    """Scenario `name` rendered (or as `rendered`, the same render done by the caller:
    step STEP, poll interval 5 s, start 0) and evaluated with the shipped rule files."""
    sc = scenarios.load(name)
    if rendered is None:
        rendered = render(sc, step=STEP, poll_interval=5.0, start=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        crashes = any(f.kind == "crash" for f in sc.faults)
        first, states, per_window = evaluate(rendered, list(sc.truth), Path(tmp), crashes)
    return Detection(name, first, states, list(sc.truth), per_window)


def _fmt(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.0f} s"


def markdown(results: list[Detection]) -> str:
    lines = [
        "# Detection table",
        "",
        "Generated by `python -m sglang_obs.generate.detection` (part of `make generate`; "
        "a test checks it",
        "is current): every simulator scenario rendered at a 15 s step and evaluated with the",
        "shipped rule files by promtool. *Onset* is the start of the scenario's declared ground",
        "truth window; the target is the class's alert within "
        f"{PAGE_WITHIN_SECONDS // 60} minutes of it, and no alert",
        "at all on healthy and idle windows (after a scenario's own crash, the restart alerts",
        "that report it are not counted as false). Watchdog always fires and is left out.",
        "",
        "| scenario | ground truth (onset) | expected alert | fired after onset | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        for i, t in enumerate(r.truth):
            alert = CLASS_ALERT.get(t.cls)
            latency = r.latency(i) if alert else None
            if alert:
                ok = latency is not None and latency <= PAGE_WITHIN_SECONDS
                verdict = "detected" if ok else "MISSED"
            else:
                verdict = ("quiet" if not r.per_window[i]
                           else "FALSE ALERT: " + ", ".join(r.per_window[i]))
            lines.append(f"| `{r.scenario}` | {t.cls} ({t.start:.0f} s) | {alert or 'none'} "
                         f"| {_fmt(latency) if alert else '—'} | {verdict} |")
    lines += ["", "## Every alert that fired", "",
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names = [a for a in argv if not a.startswith("-")] or scenarios.available()
    results = [detect(n) for n in names]
    text = markdown(results)
    if "--print" in argv or [a for a in argv if not a.startswith("-")]:
        sys.stdout.write(text)
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
