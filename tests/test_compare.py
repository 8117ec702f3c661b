"""`sglang-obs compare`: the pure statistics (unmarked), and the command against a real Prometheus
backfilled with the seed 000 incident, its tuned configuration and a healthy server (slow)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.tools import compare as c

from conftest import ROOT, require_binary

S = _settings()  # the checkout's configuration, read once

EXE = str(Path(sys.executable).parent / "sglang-obs")
LIMITS = yaml.safe_load((ROOT / "prometheus/thresholds.yml").read_text())["compare"]
BOUNDS = [1.0, 2.0, 4.0, 8.0, float("inf")]


def window(minutes=20, ttft=(10, 5, 3, 1, 1), requests=6.0, speed=50.0, queued=6.0,
           mix=None, server="s:1", start=0.0):
    """A window whose every minute looks the same: `ttft` is the per-bucket (not cumulative)
    request count of each minute."""
    cumulative = [sum(ttft[:i + 1]) for i in range(len(ttft))]
    units = {"request_rate": [(requests, 60.0)] * minutes,
             "prompt_tokens_per_second": [(requests * 1000, 60.0)] * minutes,
             "generation_tokens_per_second": [(requests * 300, 60.0)] * minutes,
             "cache_hit_ratio": [(500.0, 1000.0)] * minutes,
             "queued_share": [(queued, 60.0)] * minutes,
             "decode_speed_p10": [[speed, speed * 1.2, speed * 0.9, speed]] * minutes}
    units["decode_speed_p50"] = units["decode_speed_p10"]
    for key in c.HISTOGRAM_OF:
        units[key] = [list(cumulative)] * minutes
    return c.WindowData(server=server, start=start, end=start + 60 * minutes, units=units,
                        bounds={"ttft": BOUNDS, "queue_time": BOUNDS, "itl": BOUNDS},
                        prompt_mix=mix or {"lt_8k": 80.0, "8k_32k": 20.0},
                        prompt_mix_source="request records")


def noisy(w, seed):
    """`w` with each minute's request count and TTFT histogram scaled by a factor in
    0.5-1.5: minutes that differ, as live ones do."""
    import random

    rng = random.Random(seed)
    for i in range(w.minutes):
        f = rng.uniform(0.5, 1.5)
        w.units["request_rate"][i] = (w.units["request_rate"][i][0] * f, 60.0)
        w.units["prompt_tokens_per_second"][i] = (w.units["prompt_tokens_per_second"][i][0] * f,
                                                  60.0)
        for key in c.HISTOGRAM_OF:
            w.units[key][i] = [x * f for x in w.units[key][i]]
    return w


# -- pure functions -------------------------------------------------------------------------
def test_histogram_quantile_interpolates_as_prometheus_and_caps_at_the_top_finite_bound():
    # 10 observations <= 1, 10 more <= 2: the median is the bound 1, p75 halfway into (1, 2].
    assert c.histogram_quantile(0.5, [1, 2, float("inf")], [10, 20, 20]) == 1.0
    assert c.histogram_quantile(0.75, [1, 2, float("inf")], [10, 20, 20]) == 1.5
    assert c.histogram_quantile(0.99, [1, 2, float("inf")], [10, 20, 40]) == 2.0
    assert c.histogram_quantile(0.5, [1, 2, float("inf")], [0, 0, 0]) is None


def test_sample_quantile_is_linear_between_order_statistics():
    assert c.sample_quantile(0.5, [4, 1, 3, 2]) == 2.5
    assert c.sample_quantile(0.1, [10.0]) == 10.0
    assert c.sample_quantile(0.5, []) is None


def test_the_same_windows_are_no_clear_change_with_zero_inside_every_interval():
    changes = c.compare_metrics(noisy(window(), 1), noisy(window(), 1), 500, 0)
    for key, ch in changes.items():
        assert ch.relative == pytest.approx(0.0), key
        assert ch.low <= 0 <= ch.high, key
        assert ch.reading == ("" if c.METRICS[key].better is None else "no clear change"), key


def test_a_clear_shift_is_an_improvement_and_its_reverse_a_regression():
    slow = noisy(window(ttft=(2, 3, 5, 5, 5), speed=30.0, queued=30.0), 1)
    fast = noisy(window(ttft=(12, 5, 2, 1, 0), speed=60.0, queued=3.0), 2)
    better = c.compare_metrics(slow, fast, 500, 0)
    assert better["ttft_p95_seconds"].reading == "improvement"
    assert better["ttft_p95_seconds"].high < 0
    assert better["decode_speed_p10"].reading == "improvement"  # higher is better
    assert better["decode_speed_p10"].low > 0
    assert better["queued_share"].relative == pytest.approx(-0.9)
    worse = c.compare_metrics(fast, slow, 500, 0)
    assert worse["ttft_p95_seconds"].reading == "regression"
    assert worse["decode_speed_p10"].reading == "regression"


def test_the_bootstrap_is_reproducible_with_its_seed_and_differs_without():
    b, a = noisy(window(), 1), noisy(window(ttft=(8, 6, 4, 1, 1)), 2)
    first = c.compare_metrics(b, a, 300, 7)["ttft_p95_seconds"]
    assert c.compare_metrics(b, a, 300, 7)["ttft_p95_seconds"] == first
    other = c.compare_metrics(b, a, 300, 8)["ttft_p95_seconds"]
    assert (other.low, other.high) != (first.low, first.high)
    assert other.relative == first.relative  # the point estimate does not depend on the seed


def test_pairing_cancels_load_that_moves_the_same_way_in_both_windows():
    b = noisy(window(), 3)
    a = noisy(window(requests=6.6), 3)  # the same minute-to-minute ups and downs, 10 % more
    independent = c.compare_metrics(b, a, 500, 0)["request_rate"]
    paired = c.compare_metrics(b, a, 500, 0, paired=True)["request_rate"]
    assert paired.relative == pytest.approx(0.1)
    assert paired.high - paired.low < 0.01 < independent.high - independent.low


def test_loads_within_the_tolerances_are_comparable():
    doc = c.compare(window(), window(requests=6.6), LIMITS, 200, 0)
    assert doc["verdict"]["comparable"] is True
    assert doc["metrics"]["request_rate"]["relative_change"] == pytest.approx(0.1)
    assert {"improvement", "regression", "no_clear_change"} <= set(doc["verdict"])


def test_a_load_beyond_a_tolerance_is_not_comparable_and_says_by_how_much():
    doc = c.compare(window(), window(requests=7.8), LIMITS, 200, 0)
    assert doc["verdict"]["comparable"] is False
    [failed] = [x for x in doc["verdict"]["checks"] if not x["ok"] and x["figure"] ==
                "request_rate"]
    assert failed["value"] == pytest.approx(0.3)
    assert "request rate +30%" in failed["text"]
    assert "improvement" not in doc["verdict"]
    assert all(m["reading"] == "" for m in doc["metrics"].values())
    assert "**Not comparable**: request rate +30% (tolerance ±20%)" in c.report(doc)


def test_the_prompt_length_mix_is_judged_by_total_variation_distance():
    assert c.total_variation({"a": 1, "b": 1}, {"a": 2}) == pytest.approx(0.5)
    assert c.total_variation({"a": 3}, {"a": 1}) == 0.0
    assert c.total_variation({}, {"a": 1}) is None
    near = c.compare(window(), window(mix={"lt_8k": 70.0, "8k_32k": 30.0}), LIMITS, 100, 0)
    far = c.compare(window(), window(mix={"lt_8k": 60.0, "8k_32k": 40.0}), LIMITS, 100, 0)
    assert near["verdict"]["comparable"] is True  # TVD 0.10
    assert far["verdict"]["comparable"] is False  # TVD 0.20
    assert "total-variation distance 0.20 (at most 0.15)" in c.report(far)


def test_a_mix_from_different_sources_is_not_measured_and_not_comparable():
    other = window()
    other.prompt_mix_source = "SGLang prompt-token histogram"
    doc = c.compare(window(), other, LIMITS, 100, 0)
    assert doc["verdict"]["comparable"] is False
    assert "prompt-length mix: not measured in both windows" in c.report(doc)


def test_config_diff_says_where_each_argument_changed():
    before = {"max_running_requests": c.timeline({60: "44", 120: "44"}),
              "schedule_policy": c.timeline({60: "fcfs", 120: "fcfs"}),
              "tp_size": c.timeline({60: "4"})}
    after = {"max_running_requests": c.timeline({600: "10", 660: "10"}),
             "schedule_policy": c.timeline({600: "fcfs", 660: "lpm"}),
             "tp_size": c.timeline({600: "4"})}
    rows = {r["arg"]: r for r in c.config_diff(before, after)}
    assert rows["max_running_requests"] == {"arg": "max_running_requests", "before": "44",
                                            "after": "10", "changed": True,
                                            "when": "between the windows"}
    assert rows["schedule_policy"]["after"] == "fcfs → lpm"
    assert rows["schedule_policy"]["when"] == "within the after window at 1970-01-01T00:11:00Z"
    assert rows["tp_size"]["changed"] is False


def test_paired_needs_windows_of_the_same_length():
    with pytest.raises(c.CompareUsageError, match="--paired"):
        c.compare(window(20), window(25), LIMITS, 100, 0, paired=True)


def test_window_data_survives_its_json_form_in_a_pack():
    w = noisy(window(), 4)
    w.units["queued_share"][3] = None  # a minute without data
    w.config = {"tp_size": c.timeline({60.0: "4"})}
    w.alerts = [{"alertname": "A", "severity": "warning", "episodes": 1, "seconds": 30.0,
                 "first_firing": "1970-01-01T00:01:00Z"}]
    text = json.dumps(w.to_dict(), allow_nan=False)  # +Inf bounds are written as "+Inf"
    assert '"+Inf"' in text
    back = c.WindowData.from_dict(json.loads(text))
    assert back == w
    assert back.bounds["ttft"][-1] == float("inf")
    assert isinstance(back.units["request_rate"][0], tuple)


def test_windows_must_have_an_end_after_the_start_and_two_minutes():
    with pytest.raises(c.CompareUsageError, match="--before: empty window"):
        c.parse_window("--before", ["2000", "1000"])
    with pytest.raises(c.CompareUsageError, match="--after: the window is 90 s"):
        c.parse_window("--after", ["1000", "1090"])
    assert c.parse_window("--after", ["1000", "1120"]).end == 1120


def test_docs_quote_the_tolerances_of_thresholds_yml():
    doc = (ROOT / "docs/compare.md").read_text()
    assert f"**request rate** within ±{LIMITS['request_rate_tolerance']:.0%}".replace(
        "%", " %") in doc
    assert f"**prompt tokens/s** within ±{LIMITS['prompt_tokens_per_second_tolerance']:.0%}" \
        .replace("%", " %") in doc
    assert f"total-variation distance of {LIMITS['prompt_length_max_tvd']:g}" in doc
    assert f"{LIMITS['bootstrap_resamples']:,} times" in doc
    tvd = LIMITS["prompt_length_max_tvd"]
    assert f"{tvd:g} lets {tvd:.0%} of the requests move".replace("%", " %") in doc


# -- against a real Prometheus --------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_binary("promtool")
    require_binary("prometheus")
    from sglang_obs.generate import compare_example

    with compare_example.served(tmp_path_factory.mktemp("compare") / "data", S) as got:
        yield got


def _compare(url, before, after, *extra, out=None):
    cmd = [EXE, "compare", "--prometheus", url, "--before", *before, "--after", *after, *extra]
    if out:
        cmd += ["--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_tuning_seed_000_is_comparable_with_its_four_arguments_and_less_waiting(served,
                                                                               tmp_path):
    url, w = served
    result = _compare(url, w["long-context-incident"], w["long-context-incident-tuned"],
                      out=tmp_path / "pack")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["comparable"] + [
        f"wrote {tmp_path / 'pack' / name}" for name in ("report.md", "compare.json",
                                                         "compare.png")]
    doc = json.loads((tmp_path / "pack/compare.json").read_text())
    changed = {r["arg"]: (r["before"], r["after"], r["when"]) for r in doc["config"]
               if r["changed"]}
    assert changed == {"max_running_requests": ("44", "10", "between the windows"),
                       "chunked_prefill_size": ("4096", "8192", "between the windows"),
                       "schedule_policy": ("fcfs", "lpm", "between the windows"),
                       "num_continuous_decode_steps": ("2", "1", "between the windows")}
    assert doc["verdict"]["comparable"] is True
    m = doc["metrics"]
    assert abs(m["request_rate"]["relative_change"]) <= 0.05  # the same requests, replayed
    # The model's truth (docs/simulator.md): lower TTFT p95, shorter queueing.
    for key in ("ttft_p95_seconds", "queue_time_p95_seconds", "queued_share"):
        assert m[key]["after"] < m[key]["before"], key
        low, high = m[key]["interval"]
        assert low < m[key]["relative_change"] < high, key
    assert 40 <= m["ttft_p95_seconds"]["before"] <= 80  # simulator.md: <= 60 s (bucket)
    assert m["ttft_p95_seconds"]["after"] <= 0.8 * m["ttft_p95_seconds"]["before"]
    lq = doc["longest_queueing_seconds"]
    assert lq["after"] < lq["before"]
    assert doc["states"]["after"]["prefill_backlog"] < doc["states"]["before"]["prefill_backlog"]
    assert doc["pages"] == {"before": {"critical": 0, "warning": 2},
                            "after": {"critical": 0, "warning": 2}}
    report = (tmp_path / "pack/report.md").read_text()
    assert "**Comparable load**" in report
    assert "| num_continuous_decode_steps | 2 | 1 | between the windows |" in report
    assert (tmp_path / "pack/compare.png").stat().st_size > 10_000


@pytest.mark.slow
def test_replaying_the_same_traffic_paired_calls_the_shorter_queueing_an_improvement(served):
    url, w = served
    result = _compare(url, w["long-context-incident"], w["long-context-incident-tuned"],
                      "--paired")
    assert result.returncode == 0, result.stderr
    verdict = result.stdout.split("## Verdict", 1)[1].split("## Configuration", 1)[0]
    improved = re.search(r"\*\*Improved:\*\* (.*)", verdict).group(1)
    queued = re.search(r"time with requests queued (−\d+)% \[(−[\d.]+)%, (−[\d.]+)%\]",
                       improved)
    assert queued, improved
    assert "**Regressed:**" not in verdict


@pytest.mark.slow
def test_healthy_against_the_incident_is_not_comparable_and_says_which_load_differs(served):
    url, w = served
    result = _compare(url, w["healthy"], w["long-context-incident"])
    assert result.returncode == 0, result.stderr
    verdict = result.stdout.split("## Verdict", 1)[1].split("## Configuration", 1)[0]
    assert "**Not comparable**" in verdict
    rate = re.search(r"request rate (−\d+)% \(tolerance ±20%\)", verdict)
    assert rate, verdict
    assert int(rate.group(1).replace("−", "-")) < -80, verdict
    assert "prompt-length mix: total-variation distance 1.00" in verdict
    assert "Improved" not in result.stdout
    assert "Regressed" not in result.stdout
    assert "| TTFT p95 over the window |" in result.stdout  # the numbers are still shown


@pytest.mark.slow
def test_clear_errors_for_unknown_servers_empty_windows_and_unequal_pairs(served):
    url, w = served
    incident = w["long-context-incident"]
    start = float(incident[0])
    cases = [
        ([incident, w["long-context-incident-tuned"], "--instance", "nope:1"], 1,
         "--instance: unknown instance nope:1; servers in the --before window: sglang:30000"),
        ([incident, w["long-context-incident-tuned"], "--after-instance", "nope:2"], 1,
         "--after-instance: unknown instance nope:2"),
        ([(str(start - 86400 * 3), str(start - 86400 * 2)), incident], 1,
         "--before: no data between"),
        ([w["healthy"], incident, "--paired"], 2, "--paired: the windows must have as many"),
    ]
    for (before, after, *extra), code, message in cases:
        result = _compare(url, before, after, *extra)
        assert result.returncode == code, (extra, result.stderr)
        assert message in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_windows_with_sub_millisecond_times_read_the_same_minutes(served, tmp_path):
    """A window at 1796222970.1234 (what `snapshot --from "30m ago"` writes into a pack, and
    what "3m ago" resolves to) reads the same minutes as the whole-second one: Prometheus
    answers its timestamps at the millisecond, and compare looked them up unrounded."""
    url, w = served
    incident, tuned = w["long-context-incident"], w["long-context-incident-tuned"]
    shift = [str(float(t) + 0.0004) for t in incident], [str(float(t) + 0.0004) for t in tuned]
    whole = _compare(url, incident, tuned, out=tmp_path / "whole")
    fine = _compare(url, *shift, out=tmp_path / "fine")
    assert fine.returncode == whole.returncode == 0, fine.stderr
    got = json.loads((tmp_path / "fine/compare.json").read_text())
    want = json.loads((tmp_path / "whole/compare.json").read_text())
    assert got["verdict"]["comparable"] is True
    for key in ("request_rate", "ttft_p95_seconds", "queued_share"):
        assert got["metrics"][key]["before"] == want["metrics"][key]["before"], key
        assert got["metrics"][key]["after"] is not None, key


def _snapshot(url, pair, out):
    result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", pair[0], "--to",
                             pair[1], "--out", str(out)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return out


def _without_sources(doc):
    sources = {side: w.pop("source") for side, w in doc["windows"].items()}
    return doc, sources


@pytest.mark.slow
def test_two_snapshot_packs_compare_as_their_windows_in_prometheus(served, tmp_path):
    url, w = served
    incident, tuned = w["long-context-incident"], w["long-context-incident-tuned"]
    before = _snapshot(url, incident, tmp_path / "incident")
    after = _snapshot(url, tuned, tmp_path / "tuned")
    runs = {"prometheus": ["--before", *incident, "--after", *tuned],
            "packs": ["--before-pack", str(before), "--after-pack", str(after)],
            "mixed": ["--before-pack", str(before), "--after", *tuned]}
    docs, reports = {}, {}
    for name, args in runs.items():
        out = tmp_path / f"out-{name}"
        result = subprocess.run([EXE, "compare", "--prometheus", url, *args, "--out", str(out)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (name, result.stderr)
        docs[name] = _without_sources(json.loads((out / "compare.json").read_text()))
        reports[name] = (out / "report.md").read_text()
    assert docs["prometheus"][1] == {"before": "Prometheus", "after": "Prometheus"}
    assert docs["packs"][1] == {"before": f"snapshot pack {before}",
                                "after": f"snapshot pack {after}"}
    assert docs["mixed"][1] == {"before": f"snapshot pack {before}", "after": "Prometheus"}
    assert docs["prometheus"][0]["verdict"]["comparable"] is True
    assert docs["packs"][0] == docs["prometheus"][0]
    assert docs["mixed"][0] == docs["prometheus"][0]
    assert reports["packs"] == reports["mixed"] == reports["prometheus"]
    # --instance picks the server within a pack as within Prometheus
    result = subprocess.run([EXE, "compare", *runs["packs"], "--after-instance", "nope:1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert result.stderr == (f"sglang-obs compare: --after-instance: unknown instance nope:1; "
                             f"servers in the pack --after-pack {after}: sglang:30000\n")


@pytest.mark.slow
def test_docs_compare_md_examples_are_current(served):
    """Exact, time in each state included: every backfill records its rules at the same
    offsets within the step (backfill.py), so two backfills of one scenario agree sample for
    sample on any machine, loaded or not."""
    from sglang_obs.generate import compare_example

    url, w = served
    committed = (S.docs_dir / compare_example.DOC).read_text()
    assert compare_example.render(committed, url, w, S) == committed, \
        "docs/compare.md is stale: run python -m sglang_obs.generate compare-example"
