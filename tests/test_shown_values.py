"""What a person reads is sane whatever a server sends: every number on the glance page and in
the tools' reports goes through one formatter (sglang_obs/core/shown.py) that shows "—" for a
value that is not finite or out of its range, and counts why; every URL shown goes through one
function that drops userinfo, query and fragment, and a base URL holding any of them is refused.

Before: a counter of 1e308 rendered as a 411-character number across the page's columns, +Inf
as "inf", a 1e-320 denominator as "inf tok/s"; `--sglang.url 'http://host:port/?api_key=…'`
was accepted and printed the key in the glance page's footer."""

from __future__ import annotations

import html
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.derived import Derived
from sglang_obs.exporter.poller import Snapshot
from sglang_obs.exporter.queue_run import QueueRunState
from sglang_obs.exporter.status import StatusBoard, load_classification
from sglang_obs.exporter.status_page import page_bytes, status_with_display

C = load_classification()
BIN = Path(sys.executable).parent
MARKER = "MARKER-9X4K"
HOSTILE = {"1e308": 1e308, "-1e308": -1e308, "+Inf": math.inf, "-Inf": -math.inf,
           "NaN": math.nan, "1e-320": 1e-320}
# The counters and gauges the glance page reads from one poll.
NATIVE = ("num_requests_total", "prompt_tokens_total", "generation_tokens_total",
          "cached_tokens_total", "time_to_first_token_seconds_sum",
          "time_to_first_token_seconds_count", "e2e_request_latency_seconds_sum",
          "e2e_request_latency_seconds_count", "queue_time_seconds_sum",
          "num_retracted_requests_total", "num_grammar_queue_reqs", "num_paused_reqs")
GAUGES = ("kv_used_tokens", "kv_capacity_tokens", "kv_occupancy_ratio", "running_requests",
          "waiting_requests", "max_running_requests", "running_requests_ratio",
          "decode_speed_per_request", "prefill_backlog_tokens")
LONG_NUMBER = re.compile(r"[-−+]?\d[\d,.]{20,}")  # a number over 20 characters
NOT_A_NUMBER = re.compile(r"(?i)\b(inf|infinity|nan)\b")


def hostile_snapshot(polls: int, native: dict, gauges: dict) -> Snapshot:
    """A poll as a hostile server makes it: the values given straight, past the poller's own
    checks (a future source, or one the checks miss, must not reach the page raw either)."""
    return Snapshot(server="s:1", up=True, polls=polls, last_success_timestamp=1.0,
                    derived=Derived(model_name="m", **gauges),
                    queue_run=QueueRunState(0.0, (0,) * 14, 0.0, 0, 0.0),
                    native_values=native)


def shown_texts(board: StatusBoard) -> list[str]:
    """Every string the glance page shows for the board: the display model, and the page's
    HTML with its tags removed."""
    status = status_with_display(board)
    texts = [status["display"]["text"]["updated"], *status["display"]["lists"]["host_gpus"]]
    for srv in status["servers"]:
        disp = srv["display"]
        texts += [*disp["text"].values(), *disp["paths"].values()]
        texts += [item for items in disp["lists"].values() for item in items]
    page = page_bytes(status, "/metrics", ["http://127.0.0.1:1"]).decode()
    texts.append(html.unescape(re.sub(r"<[^>]*>", " ", page)))
    return texts


def feed(board: StatusBoard, value: float, polls: int = 40) -> None:
    """A server whose counters and gauges all read `value` (growing counters before it, so
    the trends and the last minute have rates to compute), every 5 s."""
    tracker = board.add("s:1")
    for i in range(polls):
        last = i == polls - 1
        native = {name: (value if last else float(i * 10)) for name in NATIVE}
        gauges = {name: (value if last or i % 2 else 1.0) for name in GAUGES}
        tracker.observe(i * 5.0, hostile_snapshot(i + 1, native, gauges))


def assert_sane(texts: list[str]) -> None:
    for text in texts:
        assert not LONG_NUMBER.search(text), LONG_NUMBER.search(text).group(0)[:60]
        assert not NOT_A_NUMBER.search(text), text[:200]


# -- 1. numbers ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_counters_and_gauges_show_a_dash_never_a_long_number_or_inf(name):
    board = StatusBoard(C, poll_interval=5.0)
    feed(board, HOSTILE[name])
    texts = shown_texts(board)
    assert_sane(texts)
    if name != "1e-320":  # a tiny value is a real (if odd) 0: it shows as "0"
        assert any("—" in t for t in texts)


def test_a_tiny_denominator_shows_a_dash_not_inf_tok_per_s():
    # Sums of 1e3 over counts of 1e-320: a time per request of 1e323 s, a speed of +Inf.
    board = StatusBoard(C, poll_interval=5.0)
    tracker = board.add("s:1")
    native = {name: 1e3 for name in NATIVE} | {
        "cached_tokens_total": 0.0, "queue_time_seconds_sum": 0.0,
        "time_to_first_token_seconds_count": 1e-320, "time_to_first_token_seconds_sum": 1e-320,
        "e2e_request_latency_seconds_count": 1e-320}
    for i in range(3):
        gauges = {"running_requests": 1.0, "waiting_requests": 0.0}
        tracker.observe(i * 5.0, hostile_snapshot(i + 1, native, gauges))
    texts = shown_texts(board)
    assert_sane(texts)
    text = status_with_display(board)["servers"][0]["display"]["text"]
    assert text["b.ttft"] == "1.0 s"  # 1e-320 / 1e-320: a sane quotient shows
    assert text["b.request"] == "—"  # 1e3 / 1e-320
    assert text["b.prefill_speed"].startswith("—")  # 1e3 / 1e-320 tok/s


def test_hidden_values_are_counted_by_reason_in_the_exporters_metrics():
    from sglang_obs.exporter.collector import SGLangCollector

    board = StatusBoard(C, poll_interval=5.0)
    feed(board, math.inf)
    status_with_display(board)
    registry = CollectorRegistry()
    registry.register(SGLangCollector([], board=board))
    text = generate_latest(registry).decode()
    found = dict(re.findall(
        r'^sglang_obs_glance_values_hidden_total\{reason="(\w+)"\} (\S+)$', text, re.M))
    assert float(found.get("not_finite", 0)) > 0, text
    before = float(found["not_finite"])
    status_with_display(board)  # each computation of the page counts what it hid
    again = dict(re.findall(
        r'^sglang_obs_glance_values_hidden_total\{reason="(\w+)"\} (\S+)$',
        generate_latest(registry).decode(), re.M))
    assert float(again["not_finite"]) > before


@pytest.mark.parametrize(("value", "reason"), [
    (1e308, "too_large"), (-1e308, "negative"), (math.inf, "not_finite"),
    (math.nan, "not_finite"), (-5.0, "negative")])
def test_each_hidden_count_names_its_reason(value, reason):
    from sglang_obs.core import shown

    tally = shown.Tally()
    with shown.counting(tally):
        assert shown.count(value) == "—"
    assert tally.counts() == {reason: 1}
    with shown.counting(tally):
        assert shown.count(None) == "—"  # absent: nothing hidden
        assert shown.count(12345.0) == "12,345"
    assert tally.counts() == {reason: 1}


def test_ratios_allow_rounding_only():
    from sglang_obs.core import shown

    tally = shown.Tally()
    with shown.counting(tally):
        assert shown.percent(1.0004) == "100 %"
        assert shown.percent(-0.0004) == "0 %"
        assert shown.percent(1.5) == "—"
        assert shown.percent(-0.2) == "—"
    assert tally.counts() == {"not_a_ratio": 2}


def test_the_tools_reports_hide_what_prometheus_can_answer():
    # Prometheus answers NaN and ±Inf as values (a quantile of nothing, a ratio over 0).
    from sglang_obs.tools import compare, snapshot

    for unit in ("ratio", "s", "req/s", "tok/s", "tokens"):
        for value in HOSTILE.values():
            text = compare.fmt(value, unit)
            assert not LONG_NUMBER.search(text), (unit, text)
            assert not NOT_A_NUMBER.search(text), (unit, text)
    summary = {"window": {"from": "a", "to": "b"}, "alerts": [], "servers": {"s:1": {
        "states": {}, "dominant": [], "config": {"effective": None, "changed": False},
        "peaks": {key: {"value": value, "at": "t"} for key, value in zip(
            ("pending_prefill_tokens", "queue", "queue_nonempty_seconds", "running",
             "kv_occupancy", "ttft_p95_seconds"), HOSTILE.values(), strict=True)}}}}
    assert_sane([snapshot.report(summary, [])])


# -- 2. URLs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("url", [
    f"http://127.0.0.1:1/?api_key={MARKER}",
    f"http://127.0.0.1:1/#{MARKER}",
    f"http://127.0.0.1:1/v1?token={MARKER}#x",
    f"http://127.0.0.1:1?{MARKER}",
])
def test_a_query_or_fragment_in_the_sglang_url_is_refused_in_one_line_without_it(url):
    try:
        result = subprocess.run([str(BIN / "sglang-exporter"), "--sglang.url", url,
                                 "--web.listen-address", "127.0.0.1:0"],
                                capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode() + (err.stderr or b"").decode()
        pytest.fail(f"the exporter started with {url!r}; it printed: {out[-300:]!r}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "query" in result.stderr or "fragment" in result.stderr, result.stderr
    assert "127.0.0.1:1" in result.stderr  # the value is shown, less the secret
    assert MARKER not in result.stderr + result.stdout


@pytest.mark.parametrize(("command", "flag"), [
    (["sglang-obs", "snapshot", "--from", "10m ago", "--to", "now", "--out", "x"], "--prometheus"),
    (["sglang-obs", "compare", "--before", "2h ago", "1h ago", "--after", "1h ago", "now"],
     "--prometheus"),
    (["sglang-sim", "what-if", "--start", "1h ago", "--end", "now", "--set",
      "max_running_requests=10"], "--prometheus"),
])
@pytest.mark.parametrize("secret", [f"?token={MARKER}", f"#{MARKER}", f"@@{MARKER}"])
def test_the_tools_refuse_a_secret_in_a_url_in_one_line_without_it(command, flag, secret,
                                                                     tmp_path):
    url = (f"http://user:{MARKER}@127.0.0.1:1" if secret.startswith("@@")
           else f"http://127.0.0.1:1/{secret}")
    result = subprocess.run([str(BIN / command[0]), *command[1:], flag, url],
                            capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert flag in result.stderr
    assert MARKER not in result.stderr + result.stdout


@pytest.mark.parametrize("flag", ["--sglang-url", "--prometheus", "--alertmanager"])
def test_every_url_argument_of_the_tools_refuses_a_secret_without_showing_it(flag, capsys):
    # Parsed only: `stack up` must not start anything here.
    from sglang_obs.cli import build_parser

    args = {"--sglang-url": ["stack", "up", "--native"],
            "--prometheus": ["snapshot", "--from", "1h ago", "--to", "now", "--out", "x"],
            "--alertmanager": ["snapshot", "--from", "1h ago", "--to", "now", "--out", "x"]}[flag]
    for url in (f"http://h:1/?k={MARKER}", f"http://h:1/#{MARKER}", f"http://u:{MARKER}@h:1"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([*args, flag, url])
        err = capsys.readouterr().err
        assert exit_.value.code == 2
        assert err.count("\n") == 1, err
        assert flag in err, err
        assert MARKER not in err


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("https://sglang.internal:8443/prefix", "https://sglang.internal:8443/prefix"),
    (f"http://admin:{MARKER}@h:1/", "http://***@h:1/"),
    (f"http://{MARKER}@h:1", "http://***@h:1"),
    (f"http://h:1/?api_key={MARKER}", "http://h:1/?***"),
    (f"http://h:1/#{MARKER}", "http://h:1/#***"),
    (f"http://u:p@h:1/p?k={MARKER}#{MARKER}", "http://***@h:1/p?***#***"),
    (f"http://h:1/p#frag?{MARKER}", "http://h:1/p#***"),
    (f"http://h:1?{MARKER}@evil", "http://h:1?***"),  # the @ is the query's, not userinfo
    (f"http://[::1/{MARKER}?x", "http://[::1/" + MARKER + "?***"),  # not even a URL: no raise
    ("http://h:1/\n" + MARKER, "http://h:1/\\n" + MARKER),  # one line, always
])
def test_every_url_shown_drops_userinfo_query_and_fragment(url, expected):
    from sglang_obs.core import shown

    assert shown.url(url) == expected


def test_the_glance_footer_and_the_prometheus_errors_show_urls_through_it():
    from sglang_obs.core.prometheus_api import Prometheus, PrometheusError

    board = StatusBoard(C)
    page = page_bytes(status_with_display(board), "/metrics",
                      [f"http://127.0.0.1:1/?api_key={MARKER}"]).decode()
    assert "http://127.0.0.1:1/?***" in page
    assert MARKER not in page
    with pytest.raises(PrometheusError) as err:
        Prometheus(f"http://127.0.0.1:1/?token={MARKER}").query("up")
    assert MARKER not in str(err.value)
