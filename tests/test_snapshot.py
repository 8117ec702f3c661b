"""`sglang-obs snapshot` against a real Prometheus backfilled with simulator scenarios."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_obs.core import pack
from sglang_obs.core.prometheus_api import MAX_POINTS, Prometheus
from sglang_obs.core.times import parse_time
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.tools import compare, snapshot
from sglang_obs.tools.snapshot import CSV_HEADER

from conftest import ROOT
from helpers import assert_matches_golden

EXE = str(Path(sys.executable).parent / "sglang-obs")
pytestmark = pytest.mark.slow  # every test reads a backfilled Prometheus or runs the CLI on one

GOLDEN_HEADER = ROOT / "tests/fixtures/snapshot_header.csv"
GOLDEN_KEYS = ROOT / "tests/fixtures/snapshot_summary_keys.json"


def keys(doc, prefix=""):
    """The key paths of a JSON document, with per-server and per-state keys generalised."""
    out = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            name = ("<instance>" if prefix == "servers" else "<state>" if prefix.endswith(
                "states") else "<series>" if prefix.endswith("peaks") else k)
            path = f"{prefix}.{name}" if prefix else name
            out.add(path)
            out |= keys(v, path)
    elif isinstance(doc, list) and doc and isinstance(doc[0], dict):
        out |= keys(doc[0], prefix + "[]")
    return out


@pytest.fixture(scope="module")
def incident(incident_pack):
    return incident_pack


def test_seed_000_names_prefill_backlog_then_decode_contention(incident):
    b, _, out, stdout = incident
    summary = json.loads((out / "summary.json").read_text())
    [server] = summary["servers"].values()
    assert server["dominant"][:2] == ["prefill_backlog", "decode_contention"]
    assert "prefill_backlog -> decode_contention" in stdout
    report = (out / "report.md").read_text()
    assert report.index("**prefill_backlog**") < report.index("**decode_contention**")


def test_peaks_are_at_the_incidents_times(incident):
    b, _, out, _ = incident
    summary = json.loads((out / "summary.json").read_text())
    [server] = summary["servers"].values()
    backlog = next(t for t in scenarios.load("long-context-incident").truth
                   if t.cls == "prefill_backlog")
    for peak in ("pending_prefill_tokens", "queue"):
        at = parse_time(server["peaks"][peak]["at"]) - b.start
        assert backlog.start - 15 <= at <= backlog.end + 15, (peak, at)
    assert 300_000 <= server["peaks"]["pending_prefill_tokens"]["value"] <= 650_000
    assert 60 <= server["peaks"]["queue_nonempty_seconds"]["value"] <= 120


def test_csv_header_and_json_schema_match_the_golden_files(incident, request):
    _, _, out, _ = incident
    header = (out / "series.csv").read_text().splitlines()[0]
    found = sorted(keys(json.loads((out / "summary.json").read_text())))
    assert_matches_golden(request, GOLDEN_HEADER, header + "\n", "series.csv header")
    assert_matches_golden(request, GOLDEN_KEYS, json.dumps(found, indent=1) + "\n",
                          "summary.json schema")
    assert header == GOLDEN_HEADER.read_text().strip() == ",".join(CSV_HEADER)
    assert found == json.loads(GOLDEN_KEYS.read_text())
    rows = (out / "series.csv").read_text().splitlines()[1:]
    assert len(rows) >= 70
    states = {r.split(",")[3] for r in rows}
    assert {"prefill_backlog", "decode_contention", "healthy"} <= states


def test_the_pack_keeps_what_compare_and_what_if_read(incident):
    b, url, out, _ = incident
    assert sorted(p.name for p in out.iterdir()) == [
        "capacity.json", "load.json", "report.md", "series.csv", "sglang_30000.png",
        "summary.json", "windows.json"]
    summary = json.loads((out / "summary.json").read_text())
    windows = json.loads((out / pack.WINDOWS).read_text())
    load = json.loads((out / pack.LOAD).read_text())
    assert windows["schema_version"] == load["schema_version"] == pack.SCHEMA_VERSION
    assert list(windows["servers"]) == list(load["servers"]) == list(summary["servers"]) \
        == ["sglang:30000"]
    assert load["window"] == {"start": b.start, "end": b.end, "step_seconds": 15.0}
    fetched = compare.fetch_window(Prometheus(url), compare.Window("--before", b.start, b.end),
                                   "sglang:30000")
    assert compare.WindowData.from_dict(windows["servers"]["sglang:30000"]) == fetched
    held = load["servers"]["sglang:30000"]
    assert [(s["name"], s["agg"], s["by"]) for s in held["series"]] == list(pack.LOAD_SERIES)
    buckets = next(s for s in held["series"]
                   if s["name"] == "sglang:prompt_tokens_histogram_bucket")
    assert "+Inf" in buckets["values"]
    assert held["info"]["sglang_obs_server_config_info"]["schedule_policy"] == "fcfs"


def test_a_pack_too_short_for_compare_says_so(incident, tmp_path):
    b, url, _, _ = incident
    short = tmp_path / "short"
    result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", str(b.start),
                             "--to", str(b.start + 90), "--out", str(short)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads((short / pack.WINDOWS).read_text())["servers"] == {}
    result = subprocess.run([EXE, "compare", "--before-pack", str(short), "--after-pack",
                             str(short)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"sglang-obs compare: error: --before-pack {short}: the pack's "
                             "window is 90 s; compare needs at least 2 whole minutes\n")


def test_charts_are_drawn_and_the_report_links_them(incident):
    _, _, out, _ = incident
    pngs = list(out.glob("*.png"))
    assert pngs
    assert all(p.stat().st_size > 10_000 for p in pngs)
    assert all(f"]({p.name})" in (out / "report.md").read_text() for p in pngs)


def test_without_charts_the_pack_is_the_same_but_for_the_pictures(incident, tmp_path):
    b, url, charted, _ = incident
    out = tmp_path / "pack"
    result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", str(b.start),
                             "--to", str(b.end), "--out", str(out), "--no-charts"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert not list(out.glob("*.png"))
    assert {p.name for p in out.iterdir()} == {p.name for p in charted.iterdir()
                                                if p.suffix != ".png"}
    for name in ("summary.json", "series.csv", pack.WINDOWS, pack.LOAD):
        assert (out / name).read_bytes() == (charted / name).read_bytes(), name
    report = (out / "report.md").read_text()
    assert "## Charts\n\nNot drawn (`--no-charts`)." in report
    assert report.split("## Charts")[0] == (charted / "report.md").read_text().split(
        "## Charts")[0]


def test_the_report_says_which_alerts_reached_a_receiver(incident):
    _, _, out, _ = incident
    summary = json.loads((out / "summary.json").read_text())
    alerts = {a["alertname"]: a for a in summary["alerts"]}
    assert "Watchdog" not in alerts
    backlog = alerts["SGLangPrefillBacklog"]
    assert backlog["severity"] == "warning"
    assert backlog["delivery"]["receiver"] == "ticket"  # a warning is a ticket, not a page
    assert backlog["delivery"]["verdict"] == "notified"
    assert backlog["delivery"]["source"] == "timing"
    assert all(e["seconds"] >= backlog["delivery"]["group_wait_seconds"]
               for e in backlog["episodes"])
    report = (out / "report.md").read_text()
    reached = report.index("**Reached a receiver:**")
    assert reached < report.index("- SGLangPrefillBacklog (warning)")
    assert "reached the ticket receiver" in report


def _snapshot_with_log(b, url, log, out):
    """The snapshot command over the incident's window with an alert sink's log; its
    summary.json."""
    result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", str(b.start),
                             "--to", str(b.end), "--alerts-log", str(log), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "summary.json").read_text())


def test_the_alert_sink_log_says_which_alerts_a_receiver_got(incident, tmp_path):
    b, url, out, _ = incident
    summary = json.loads((out / "summary.json").read_text())
    backlog = next(a for a in summary["alerts"] if a["alertname"] == "SGLangPrefillBacklog")
    first = parse_time(backlog["first_firing"])
    log = tmp_path / "alerts.jsonl"
    lines = [{"time": t, "receiver": "deadman", "status": "firing",
              "labels": {"alertname": "Watchdog", "severity": "none"}}
             for t in range(int(b.start), int(b.end) + 180, 60)]  # past the last episode
    lines.append({"time": first + 31, "receiver": "ticket", "status": "firing",
                  "labels": {"alertname": "SGLangPrefillBacklog", "severity": "warning",
                             "instance": backlog["labels"]["instance"]}})
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = _snapshot_with_log(b, url, log, tmp_path / "pack")
    verdicts = {a["alertname"]: (a["delivery"]["verdict"], a["delivery"]["source"])
                for a in summary["alerts"]}
    assert verdicts["SGLangPrefillBacklog"] == ("notified", "alert-sink log")
    assert verdicts["SGLangDecodeContention"] == ("not_notified", "alert-sink log")
    report = (tmp_path / "pack/report.md").read_text()
    stopped = report.index("**Fired in Prometheus, reached no receiver:**")
    assert stopped < report.index("- SGLangDecodeContention (warning)")
    assert "no notification for it is in the alert sink's log" in report


def test_the_report_lists_each_firing_episode_as_summary_json_has_it(incident):
    """Seed 000's alerts fire twice each, minutes apart: one line per alert, each episode
    apart, never first firing – last firing as if it were one."""
    _, _, out, _ = incident
    summary = json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text()
    assert any(len(a["episodes"]) > 1 for a in summary["alerts"])
    for a in summary["alerts"]:
        [line] = [ln for ln in report.splitlines() if ln.startswith(f"- {a['alertname']} (")]
        print(line)
        listed = ", ".join(f"{e['from']} – {e['to']}" for e in a["episodes"])
        assert f"({a['severity']}) firing {listed} on " in line


def test_an_alert_sink_log_with_the_alert_s_notifications_is_the_source(incident, tmp_path):
    """A log holding only the incident's notifications (no heartbeat around them: the deadman
    goes elsewhere, or it was cut to the incident) still says which alerts reached whom; only
    "no notification" needs a log that covers the alert's time."""
    b, url, out, _ = incident
    summary = json.loads((out / "summary.json").read_text())
    backlog = next(a for a in summary["alerts"] if a["alertname"] == "SGLangPrefillBacklog")
    labels = {"alertname": "SGLangPrefillBacklog", "severity": "warning",
              "instance": backlog["labels"]["instance"]}
    first = parse_time(backlog["first_firing"])
    log = tmp_path / "alerts.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in (
        {"time": first + 31, "receiver": "ticket", "status": "firing", "labels": labels},
        {"time": first + 200, "receiver": "ticket", "status": "resolved", "labels": labels})))
    summary = _snapshot_with_log(b, url, log, tmp_path / "pack")
    delivery = {a["alertname"]: a["delivery"] for a in summary["alerts"]}
    print(json.dumps(delivery["SGLangPrefillBacklog"]))
    assert (delivery["SGLangPrefillBacklog"]["verdict"],
            delivery["SGLangPrefillBacklog"]["source"]) == ("notified", "alert-sink log")
    # the log covers none of decode contention's time: timing decides it, and says so
    assert delivery["SGLangDecodeContention"]["source"] == "timing"
    line = next(ln for ln in (tmp_path / "pack/report.md").read_text().splitlines()
                if ln.startswith("- SGLangPrefillBacklog ("))
    print(line)
    assert "reached the ticket receiver at " in line
    assert "(by the alert sink's log)" in line
    assert "by timing" not in line


def test_the_command_lists_every_file_it_wrote(incident, tmp_path):
    """Its last lines name each file of the pack, as a path (no `pack//report.md` from an
    --out with a trailing slash)."""
    b, url, _, _ = incident
    result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", str(b.start),
                             "--to", str(b.end), "--out", f"{tmp_path / 'pack'}/"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    files = snapshot.written(tmp_path / "pack")
    assert sorted(files) == sorted((tmp_path / "pack").iterdir())
    assert [f.name for f in files][:3] == ["report.md", "summary.json", "series.csv"]
    assert {"windows.json", "sglang_30000.png"} <= {f.name for f in files}
    assert result.stdout.splitlines()[-len(files):] == [f"wrote {f}" for f in files]


def test_a_crash_is_reported_first_as_a_fault(backfilled, tmp_path):
    b, url = backfilled("crash-restart")
    result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", str(b.start),
                             "--to", str(b.end), "--out", str(tmp_path / "pack")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "pack/report.md").read_text()
    assert "**1. Faults:** unavailable for" in report


def test_clear_errors_for_bad_windows_and_servers(incident, tmp_path):
    b, url, _, _ = incident
    cases = [  # (arguments, exit status: 2 the command line is wrong, 1 the data is not there)
        (["--prometheus", "http://127.0.0.1:9", "--from", "10m ago"], 1, "unreachable"),
        (["--from", "now", "--to", "1h ago"], 2, "empty window"),
        (["--from", "yesterday-ish"], 2, "cannot read time"),
        (["--prometheus", url, "--from", str(b.start), "--to", str(b.end),
          "--instance", "nope:1"], 1, "unknown instance nope:1"),
        (["--prometheus", url, "--from", "400d ago", "--to", "399d ago"], 1, "retention"),
        (["--prometheus", url, "--from", "10m ago", "--to", str(time.time() + 3600)], 2,
         "--to: in the future"),
        (["--prometheus", url, "--from", str(b.start - 86400 * 3),
          "--to", str(b.start - 86400 * 2)], 1, "no data between"),
    ]
    for args, code, message in cases:
        result = subprocess.run([EXE, "snapshot", *args, "--out", str(tmp_path / "x")],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == code, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert not (tmp_path / "x").exists(), "a failed snapshot left its folder"


def test_long_ranges_are_split_under_the_points_limit(incident):
    b, url, _, _ = incident
    calls = []
    prom = Prometheus(url)
    step = (b.end - b.start) / (MAX_POINTS * 1.5)  # one query would be refused
    series = prom.query_range("instance:sglang_state:code", b.start, b.end, step,
                              progress=calls.append)
    [points] = series.values()
    assert len(calls) == 2
    assert len(points) > MAX_POINTS
