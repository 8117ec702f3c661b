"""Energy and cost per token (sglang_obs/render/energy_rules.py, docs/metrics.md "Energy and
cost"). tests/rules/energy_test.yml holds the energy records to a hand computation on a golden;
here the cost records, which the shipped rules leave out (no price in thresholds.yml), on the
same golden with a price set."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from sglang_obs.render import energy_rules, rules

from conftest import ROOT, require_binary

GOLDEN = ROOT / "tests" / "rules" / "energy_test.yml"
# 6.30 a GPU-hour, so the numbers come out round. Both golden hosts compute 3500 (h: 3000 prompt
# + 500 output) and 1750 (old: 1500 + 250) tokens per second on 2 and 1 GPUs:
#   h:   2 GPUs * 6.30 / 3600 s = 0.0035 a second
#        output: 0.0035 / 3500 = 1e-6 a token = 1.00 per million
#        prompt: 0.0035 * 3000/3500 / 4000 = 0.003 / 4000 = 7.5e-7 a token = 0.75 per million
#   old: 1 GPU * 6.30 / 3600 s = 0.00175 a second
#        output: 0.00175 / 1750 = 1e-6 a token; prompt: 0.00175 * 1500/1750 / 2000 = 7.5e-7
PRICE = 6.3


def _priced_rules(tmp_path, price: float | None) -> list[str]:
    t = rules.inputs()
    t["cost"] = {**t.get("cost", {}), "gpu_hour_price": price}
    paths = []
    for rel, text in rules.rule_files(t).items():
        path = tmp_path / rel.name
        path.write_text(text)
        paths.append(str(path))
    return paths


def test_cost_records_only_with_a_price():
    t = rules.inputs()
    t["cost"] = {"gpu_hour_price": None, "currency": "USD"}
    assert energy_rules.COST_PER_TOKEN not in {r for r, _, _ in energy_rules.records(t)}
    t["cost"]["gpu_hour_price"] = 2.5
    expr = dict((r, e) for r, e, _ in energy_rules.records(t))[energy_rules.COST_PER_TOKEN]
    assert expr == energy_rules.cost_expr(2.5)
    assert "2.5 / 3600" in expr


def test_cost_per_token_on_the_golden(tmp_path):
    promtool = require_binary("promtool")
    golden = yaml.safe_load(GOLDEN.read_text())
    per_million = f"round({energy_rules.COST_PER_TOKEN} * 1e6, 0.0001)"
    test = {
        "rule_files": _priced_rules(tmp_path, PRICE),
        "evaluation_interval": golden["evaluation_interval"],
        "group_eval_order": golden["group_eval_order"],
        "tests": [{
            "name": "cost per token at 6.30 a GPU-hour",
            "interval": golden["tests"][0]["interval"],
            "input_series": golden["tests"][0]["input_series"],
            "promql_expr_test": [{
                "expr": per_million, "eval_time": "60m",
                "exp_samples": [
                    {"labels": f'{{cluster="c",host="{host}",mode="{mode}"}}', "value": value}
                    for host in ("h", "old")
                    for mode, value in (("prefill", 0.75), ("decode", 1))]},
                # Idle (host h at 25m): no token, no cost per token.
                {"expr": f'{energy_rules.COST_PER_TOKEN}{{host="h"}}', "eval_time": "25m",
                 "exp_samples": []}],
        }],
    }
    path = tmp_path / "cost_test.yml"
    path.write_text(json.dumps(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_docs_section_names_every_record():
    """docs/metrics.md's "Energy and cost" states each record's formula, with its name as
    energy_rules.py spells it."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text[text.index("## Energy and cost"):]
    for name in (energy_rules.POWER, energy_rules.GPUS, energy_rules.TOKENS,
                 energy_rules.ENERGY_PER_TOKEN, energy_rules.IDLE_SHARE,
                 energy_rules.CACHE_SAVED_POWER, energy_rules.COST_PER_TOKEN):
        assert f"`{name}" in section, name


@pytest.mark.slow  # promtool over two rendered scenarios: about 15 s
def test_the_numbers_block_is_what_the_energy_product_makes():
    from sglang_obs.generate.__main__ import main as generate_main

    assert generate_main(["--check", "metrics", "energy"]) == 0, "run make generate"
