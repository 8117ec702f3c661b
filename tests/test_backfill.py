"""A real Prometheus backfilled with a scenario holds its raw and its recorded series."""

import pytest

from sglang_obs.core.settings import default as _settings
from sglang_obs.generate.backfill import rule_levels

from helpers import query


def test_rule_levels_put_every_rule_after_the_rules_it_reads():
    levels = rule_levels(_settings())
    seen = set()
    for level in levels:
        for rule in level:
            used = {n for n in (r["record"] for lvl in levels for r in lvl) if n in rule["expr"]
                    and n != rule["record"]}
            assert used <= seen, (rule["record"], used - seen)
        seen |= {r["record"] for r in level}
    # The deepest chain: a server's state, its pool's signals, the PD deployment's verdict,
    # and last the verdict handed back to each PD server for its symptom alerts.
    assert {r["record"] for r in levels[-1]} == {"instance:sglang_pd_explained:bool"}


@pytest.mark.slow
def test_backfilled_incident_shows_its_classes_and_peaks(backfilled):
    b, url = backfilled("long-context-incident")
    window = f"{int(b.end - b.start)}s"
    backlog = query(url, f'count_over_time(instance:sglang_state:class{{state="prefill_backlog"}}[{window}])', b.end)  # noqa: E501
    contention = query(url, f'count_over_time(instance:sglang_state:class{{state="decode_contention"}}[{window}])', b.end)  # noqa: E501
    pending = query(url, f"max_over_time(sglang_obs_prefill_backlog_tokens[{window}])", b.end)
    native = query(url, f'max_over_time(sglang:num_queue_reqs{{job="sglang"}}[{window}])',
                   b.end)
    assert int(backlog[0]["value"][1]) * 15 >= 60  # at least a minute of prefill backlog
    assert int(contention[0]["value"][1]) * 15 >= 60
    assert 300_000 <= float(pending[0]["value"][1]) <= 650_000
    assert 3 <= float(native[0]["value"][1]) <= 9
