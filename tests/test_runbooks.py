"""docs/runbooks.md quotes the thresholds through generated blocks, and has a section per alert."""

import copy
import dataclasses
import re

import pytest
import yaml

from sglang_obs.core.doc_blocks import DocBlockError
from sglang_obs.core.settings import default as _settings
from sglang_obs.generate import products
from sglang_obs.generate.__main__ import main as generate_main
from sglang_obs.render import rules, runbooks

from conftest import ROOT

S = _settings()  # the checkout's configuration, read once

DOC = ROOT / "docs" / "runbooks.md"


def _alerts_in_rule_files() -> list[dict]:
    return [rule for path in sorted(S.rules_dir.glob("*.alerts.yml"))
            for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule]


def _github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_checkout_regenerates_its_runbook():
    files, _ = products.rules(S)
    assert DOC in files


def test_committed_runbook_is_the_rendering_of_the_committed_thresholds():
    committed = DOC.read_text()
    assert runbooks.render(committed, rules.inputs()) == committed, (
        "docs/runbooks.md is stale: run make generate")


def test_a_changed_threshold_reaches_the_runbook_where_the_old_one_was():
    t = copy.deepcopy(rules.inputs())
    assert t["classification"]["scheduling_kv_ratio_below"] == 0.8
    t["classification"]["scheduling_kv_ratio_below"] = 0.7
    committed = DOC.read_text()
    rendered = runbooks.render(committed, t)
    assert rendered != committed
    old, new = committed.splitlines(), rendered.splitlines()
    assert len(old) == len(new)
    changed = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
    # The state table and the SGLangSchedulingBottleneck block, nothing else.
    assert len(changed) == 2, changed
    assert any(a.startswith("| 5 | 6 | `scheduling_bottleneck` |") for a, _ in changed)
    assert any("in state `scheduling_bottleneck`" in a for a, _ in changed)
    for a, b in changed:
        assert "KV occupancy < 0.8" in a
        assert b == a.replace("KV occupancy < 0.8", "KV occupancy < 0.7")


def test_rules_check_reports_a_stale_runbook(tmp_path, capsys):
    stale = tmp_path / "runbooks.md"
    stale.write_text(DOC.read_text().replace("KV occupancy < 0.8", "KV occupancy < 0.5"))
    rules_product = [products.BY_NAME["rules"]]
    assert products.run(rules_product, True, dataclasses.replace(S, docs=tmp_path)) == 1
    assert f"rules: {stale} (stale)" in capsys.readouterr().err
    # Without a checkout's docs/ (an installed wheel) only the rule files are checked.
    assert products.run(rules_product, True,
                        dataclasses.replace(S, docs=tmp_path / "no-docs")) == 0
    assert generate_main(["--check", "rules"]) == 0


def test_a_block_without_a_generator_or_a_generator_without_a_block_fails():
    t = rules.inputs()
    committed = DOC.read_text()
    with pytest.raises(DocBlockError, match="no generator"):
        runbooks.render(committed + "\n<!-- generated:retired -->\n<!-- end:retired -->\n", t)
    with pytest.raises(DocBlockError, match="block states missing"):
        runbooks.render(committed.replace("<!-- generated:states -->", ""), t)


def test_every_alert_has_a_section_at_its_runbook_url():
    text = DOC.read_text()
    anchors = {_github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
    base = rules.inputs()["runbook_base"]
    assert base.endswith("/docs/runbooks.md")
    alerts = _alerts_in_rule_files()
    assert len(alerts) >= 20
    for alert in alerts:
        url, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert url == base, alert["alert"]
        assert anchor in anchors, f"{alert['alert']}: no section #{anchor} in docs/runbooks.md"


def test_every_alert_section_is_an_alert():
    sections = set(re.findall(r"^## (.+)$", DOC.read_text(), re.M))
    assert sections == {alert["alert"] for alert in _alerts_in_rule_files()}


def test_the_alerting_guide_quotes_the_rules_join_as_they_write_it():
    """docs/alerting.md quotes the symptoms' `unless on (...)` clause: the rules' labels, with
    the window W standing for each alert's own."""
    guide = (ROOT / "docs" / "alerting.md").read_text()
    rules_text = "".join(p.read_text() for p in (ROOT / "prometheus" / "rules").glob("*.yml"))
    quoted = re.findall(r"`(unless on \([^)]*\) \(max_over_time\([^`]*\[W\]\) == 1\))`", guide)
    assert quoted
    for clause in quoted:
        # The guide wraps the clause where the rules break the line.
        pattern = re.escape(clause).replace(re.escape("[W]"), r"\[\w+\]").replace(
            r"\
", r"\s+").replace(r"\ ", r"\s+")
        assert re.search(pattern, rules_text), clause
