"""The rules of the SGLang features a server may turn on (docs/features.md), from
thresholds.yml's `features:` section: each feature's signal from SGLang's counters, windowed,
and the alert an on-call can act on. rules.py places the groups in its files.

Every signal is a ratio of counter rates over a window, never a per-interval gauge: the gauge
is whatever the last report saw. A server without the feature has none of its series, so its
records and alerts are absent there (no zero to misread).
"""

from __future__ import annotations

from sglang_obs.core.times import duration_words

# Truth class of a simulator scenario (simulator/scenario.py) -> the alert that names it.
ALERTS = {
    "spec_collapsed": "SGLangSpeculativeDecodingCollapsed",
}
BY = "sum by (cluster, host, instance, model_name)"
SPEC_ACCEPT = "instance_model:sglang_spec_accept_length:ratio_rate5m"
SPEC_ACCEPT_1M = "instance_model:sglang_spec_accept_length:ratio_rate1m"
SPEC_STEPS = "instance:sglang_spec_num_steps:max"
SPEC_PER_STEP = "instance_model:sglang_spec_accept_length_per_step:ratio"
SPEC_VERIFY_RATE = "instance_model:sglang_spec_verify_calls:rate5m"


def records(t: dict) -> list[tuple[str, str, str]]:
    """(record, expr, why) of every feature signal."""
    s = f'job="{t["selectors"]["sglang_job"]}"'
    return [
        (SPEC_VERIFY_RATE, f"{BY} (rate(sglang:spec_verify_calls_total{{{s}}}[5m]))",
         "Speculative decoding: verify steps per second (one per request per decode step; "
         "0.5.13+, counted when a request finishes)."),
        (SPEC_ACCEPT, f"""
{BY} (rate(sglang:generation_tokens_total{{{s}}}[5m]))
  / ({SPEC_VERIFY_RATE} > 0)""",
         "Speculative decoding: tokens per verify step (accepted drafts plus the bonus token) "
         "from counters, both counted as requests finish; 1 means no draft is accepted. The "
         "spec_accept_length gauge covers only the last decode report's interval."),
        (SPEC_ACCEPT_1M, f"""
{BY} (rate(sglang:generation_tokens_total{{{s}}}[1m]))
  / ({BY} (rate(sglang:spec_verify_calls_total{{{s}}}[1m])) > 0)""",
         "The same over 1 minute, for the collapse alert: its sustain is the 10 minutes, so a "
         "5-minute window would only add some 3 minutes of lag."),
        (SPEC_STEPS, f"max by (cluster, host, instance) (sglang:spec_num_steps{{{s}}}) > 0",
         "The active --speculative-num-steps (0.5.13+; adaptive speculation may change it)."),
        (SPEC_PER_STEP, f"""
{SPEC_ACCEPT}
  / on (cluster, instance) group_left () ({SPEC_STEPS} + 1)""",
         "Tokens per verify step over the most a step can yield (the steps plus the bonus "
         "token): 1 when every draft is accepted."),
    ]


SPEC_WINDOW_SECONDS = 60  # SPEC_ACCEPT_1M's rate window


def _minus(duration: str, seconds: int) -> str:
    """`duration` (s, m or h) less `seconds`, in whole minutes where it is some."""
    left = int(float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]) - seconds
    return f"{left // 60}m" if left % 60 == 0 else f"{left}s"


def alerts(t: dict) -> list[dict]:
    """Keyword arguments of rules.Alert, one per feature alert."""
    f = t["features"]
    floor, low = f["spec_min_verify_rps"], f["spec_collapse_accept_length"]
    held = f["spec_collapse_for"]
    return [dict(
        name=ALERTS["spec_collapsed"],
        expr=f"""
{SPEC_ACCEPT_1M} < {low}
and on (cluster, instance, model_name) {SPEC_VERIFY_RATE} > {floor}""",
        comment="Speculation that no longer pays: each step still runs the draft model and "
                "the wider verify.",
        # "Collapsed for 10 minutes": each evaluation's ratio covers the minute before it, so
        # the for: is the rest: the ratio has been low over the whole 10 minutes when it fires.
        severity="warning", for_=_minus(held, SPEC_WINDOW_SECONDS),
        summary="SGLang speculative decoding has collapsed.",
        description="{{ $labels.instance }} ({{ $labels.model_name }}): "
                    "{{ $value | printf \"%.2f\" }} tokens per verify step, under "
                    f"{low} for {duration_words(held)}: the draft "
                    "model's guesses are rejected, and each decode step pays for drafting and "
                    "verifying them.",
        fires_when=f"tokens per verify step (generated tokens over `spec_verify_calls_total`, "
                   f"SGLang 0.5.13+) have stayed below {low} for {held}: the ratio over the "
                   f"last minute (`{SPEC_ACCEPT_1M}`) below {low} at every evaluation for "
                   f"{_minus(held, SPEC_WINDOW_SECONDS)}, while the server verifies > {floor} "
                   "steps/s over 5 minutes",
        dashboard="sglang-overview")]
