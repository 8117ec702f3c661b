"""The shipped rule files evaluated by promtool over input series: one unit test with no
expectations, whose failure report lists what each expression returned. The detection table,
the backfill of ALERTS and the glance page's replay all read the rules' verdicts this way, so
only the real rules and promtool are involved."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from sglang_obs.core.settings import Settings
from sglang_obs.render import rules


def rule_files(s: Settings) -> list[Path]:
    """The configuration folder's rule files, recording rules before the alerts that read them;
    promtool otherwise evaluates the groups in a random order at each step, and an alert may see
    the previous step's recorded values."""
    return [s.rules_dir / name for name, _ in rules.RULE_FILES]


class PromtoolError(RuntimeError):
    pass


def group_eval_order(s: Settings) -> list[str]:
    return [g["name"] for path in rule_files(s)
            for g in yaml.safe_load(path.read_text())["groups"]]


def evaluate(series: list[dict], exprs: list[tuple[str, float]], step: float, workdir: Path,
             s: Settings, name: str = "eval", timeout: float = 1800) -> str:
    """promtool's report for `exprs` ((PromQL, eval time in seconds)) over `series` (promtool
    input_series) evaluated every `step` seconds; an expression that returned nothing is
    absent from it."""
    promtool = shutil.which("promtool")
    if not promtool:
        raise PromtoolError("promtool not found: apt-get install prometheus")
    interval = f"{step:.0f}s"
    test = {
        "rule_files": [str(p) for p in rule_files(s)],
        "evaluation_interval": interval,
        "group_eval_order": group_eval_order(s),
        "tests": [{"interval": interval, "input_series": series,
                   "promql_expr_test": [{"expr": e, "eval_time": f"{at:.0f}s", "exp_samples": []}
                                        for e, at in exprs]}],
    }
    path = workdir / f"{name}_test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML, and a hundred times faster to write
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=timeout)
    output = result.stdout + result.stderr
    if result.returncode != 0 and "FAILED" not in output:
        raise PromtoolError(f"promtool test rules: {output[-3000:]}")
    return output
