"""The README a newcomer follows literally: its generated blocks are fresh, its Quickstart has
exactly two set-up commands, every timing it states comes from a test or a checked setting, its
pictures exist, warnings are never called pages, and the native stack's data and stop are
explained."""

import re

import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.exporter.cli import build_parser
from sglang_obs.generate import readme
from sglang_obs.simulator import scenario as scenarios

from conftest import ROOT
from status_replay import replay

S = _settings()  # the checkout's configuration, read once

TEXT = (ROOT / "README.md").read_text()
_BLOCK = re.compile(r"<!-- generated:(\S+) -->\n.*?<!-- end:\1 -->", re.S)
# A duration: "5 s", "30m", "2½ minutes", "within a minute", "ten minutes".
DURATIONS = (
    re.compile(r"\b\d+(?:\.\d+)?[½¾¼]?\s?(?:ms|s|m|min|h|d)\b"),
    re.compile(r"\b\d+(?:\.\d+)?[½¾¼]?\s+(?:seconds?|minutes?|hours?|days?)\b", re.I),
    re.compile(r"[½¾¼]\s*(?:min|minutes?|h|hours?)\b"),
    re.compile(r"\b(?:a|an|one|two|three|five|ten|few|several|half an?)\s+"
               r"(?:seconds?|minutes?|hours?|days?)\b", re.I),
)


def _fast_override():
    return yaml.safe_load((ROOT / "prometheus/override.fast.yml").read_text())["global"]


# Every duration the README states outside its generated blocks, with the check that keeps it
# true: (phrase around it, the duration, what must hold).
CHECKED = [
    ("(every `--sglang.poll-interval`, 1 s by default)", "1 s",
     lambda: build_parser().parse_args(["--sglang.url", "http://a:1"]).sglang_poll_interval
     == 1.0),
    ("override.fast.yml   # 5 s scrape/evaluation", "5 s",
     lambda: _fast_override() == {"scrape_interval": "5s", "evaluation_interval": "5s"}),
    # what the user asks for, not a claim: the command's own argument, and a complaint
    ('--from "30m ago"', "30m", lambda: True),
    ("evidence pack of the last 30 minutes", "30 minutes",
     lambda: '`.venv/bin/sglang-obs snapshot --from "30m ago" --out pack/` writes an\n'
     "   evidence pack of the last 30 minutes" in TEXT),
    ('"It felt slow ten minutes ago"', "ten minutes", lambda: True),
]
NOT_DURATIONS = ["a second stack"]


def outside_blocks(text: str) -> str:
    return _BLOCK.sub("", text)


def test_the_generated_blocks_are_fresh():
    assert readme.render(TEXT, S) == TEXT, "README.md is stale: run make generate"


def test_the_demo_timing_is_the_scenarios_declared_ground_truth():
    # tests/test_simulator_scenarios.py checks the truth against the rendered series
    sc = scenarios.load(readme.DEMO)
    block = readme.blocks(S)["demo-incident"]
    backlog = next(t for t in sc.truth if t.cls == "prefill_backlog")
    assert f"prefill backlog from {backlog.start:.0f} s" in block
    assert f"a {readme.minutes(sc.duration)} scenario" in block
    for burst in readme.bursts(sc):  # the loop's second wave is explained too
        assert f" at {burst['at']:.0f} s " in block, burst


def test_every_timing_outside_the_generated_blocks_is_checked():
    text = outside_blocks(TEXT)
    for phrase in NOT_DURATIONS:
        text = text.replace(phrase, "")
    for phrase, duration, _ in CHECKED:
        assert phrase in text, f"README no longer says {phrase!r}: update CHECKED"
        assert duration in phrase
        text = text.replace(phrase, "")
    left = [m.group(0) for pattern in DURATIONS for m in pattern.finditer(text)]
    assert not left, f"timings with nothing to check them: {left}"
    for phrase, _, holds in CHECKED:
        assert holds(), phrase


def test_the_detection_timings_quote_the_recorded_end_to_end_run():
    from sglang_obs.generate import detection

    e2e = detection.load_e2e(S.docs_dir / detection.E2E_RESULTS)
    assert e2e, "docs/detection-e2e.json missing"
    block = TEXT.split("<!-- generated:detection-timings -->", 1)[1].split(
        "<!-- end:detection-timings -->", 1)[0]
    first = next(r for r in e2e["scenarios"] if r["scenario"] == "long-context-incident")
    assert f"reached the sink {first['onset_to_notification']} s after" in " ".join(block.split())


def test_the_quickstart_has_exactly_two_set_up_commands():
    quickstart = TEXT.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quickstart, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert "docker compose --profile demo up" in commands[0]
    assert commands[1] == "make test"
    assert "Docker Compose v2" in quickstart


def test_the_commands_are_called_one_way():
    """Every command line to type says .venv/bin/ (prose may name a command by its name)."""
    code = re.findall(r"```sh\n(.*?)```", TEXT, re.S) + [
        c for c in re.findall(r"`([^`\n]+)`", TEXT) if " --" in c]
    for snippet in code:
        for line in snippet.splitlines():
            for command in ("sglang-obs", "sglang-sim", "sglang-exporter"):
                if re.match(rf"^\s*{command}\s", line):
                    raise AssertionError(f"{line!r}: write .venv/bin/{command}")


def test_warnings_are_never_called_pages():
    pages_of_a_site = re.sub(r"(landing|glance) page", "", TEXT, flags=re.I)
    assert not re.search(r"\bpag(?:e|es|ed|ing)\b", pages_of_a_site, re.I), \
        "a warning goes to the ticket receiver; only critical alerts go to the pager"
    assert "critical → pager, warning → ticket" in TEXT


def test_every_port_is_listed_with_the_simulators():
    block = readme.ports(S)
    for port in ("3000", "9090", "9093", "9095", "9840", "30000"):
        assert f"| {port} |" in block, port


def test_the_pictures_exist_and_are_shown():
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", TEXT)
    assert {"docs/images/overview-long-context-incident.png", "docs/images/overview-healthy.png",
            "docs/examples/snapshot-long-context-incident/sglang_30000.png"} <= set(shown)
    for path in shown:
        assert (ROOT / path).is_file(), path


def test_the_native_stack_says_where_its_data_is_and_how_to_stop_it():
    native = TEXT.split("## Without Docker", 1)[1].split("\n## ", 1)[0]
    assert "sglang-obs-XXXXXXXX" in native
    assert "A stop keeps it" in native
    assert "Ctrl-C" in native
    assert "kill PID" in native


@pytest.mark.slow
def test_every_burst_of_the_demo_alerts_the_way_the_walk_through_says():
    """The walk-through says each burst of the demo makes a prefill backlog, then decode
    contention: the glance page's classification (the rules' own, test_status_agreement.py)
    over the replayed scenario shows both after every burst, in that order."""
    sc = scenarios.load(readme.DEMO)
    states = replay(readme.DEMO).page  # one verdict per 15 s step
    step = S.evaluation_interval_s
    for burst in readme.bursts(sc):
        after = [(i * step, st) for i, st in enumerate(states)
                 if burst["at"] <= i * step <= burst["at"] + 300]
        backlog = next((t for t, st in after if st == "prefill_backlog"), None)
        contention = next((t for t, st in after if st == "decode_contention"
                           and backlog is not None and t > backlog), None)
        print(f"burst at {burst['at']} s: prefill backlog from {backlog} s, decode contention "
              f"from {contention} s")
        assert backlog is not None, (burst["at"], after)
        assert contention is not None, (burst["at"], after)
    assert len(readme.bursts(sc)) >= 2, "the walk-through's second wave is gone from the demo"
