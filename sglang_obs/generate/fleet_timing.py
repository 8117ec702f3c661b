"""docs/fleet.md's "Onset to page" block: the fleet path's worst case from a state's onset to the
page, read from the shipped files, and what tests/test_fleet.py measured (docs/fleet-e2e.json).

On one host Prometheus evaluates a group's rules in order and each rule reads the results of the
rules before it in the same evaluation. vmalert writes its results back into the store and reads
them from there: in its one group (rules.VMALERT_FILE) each rule reads what the previous
evaluation wrote. So every recorded series on a signal's path from the raw sample to the alert
costs one evaluation interval on the fleet, where on one host the whole recording group costs one.

`python -m sglang_obs.generate fleet-timing` rewrites the block; `--check` compares.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from sglang_obs.core import doc_blocks
from sglang_obs.core.settings import Settings
from sglang_obs.generate import detection
from sglang_obs.render import rules
from sglang_obs.render.shipper import vmagent_command

FLEET_DOC = "fleet.md"  # in docs/
FLEET_E2E = "fleet-e2e.json"  # in docs/, written by tests/test_fleet.py
BLOCK = "fleet-onset-to-page"
# vmagent ships what it scraped within its flush interval (vmagent's default, which
# shipper.vmagent_command leaves alone), and VictoriaMetrics makes a new sample of an existing
# series searchable within a second (measured on 1.79.5: 0.5-1.0 s).
VMAGENT_FLUSH_SECONDS = 1.0
STORE_INGEST_SECONDS = 1.0


@dataclass(frozen=True)
class FleetBudget:
    """One state alert's steps on the fleet path, in seconds."""

    alert: str
    state: str
    scrape: float
    transport: float  # vmagent's flush and the store's ingestion
    links: int  # recorded series from the raw sample to the alert's input
    evaluation: float
    sustain: float
    group_wait: float

    @property
    def notify_worst(self) -> float:
        # The sample lands up to one scrape late and reaches the store within the transport;
        # the first evaluation after that records it, each further recorded link and then the
        # alert itself read it one evaluation later; then the sustain and group_wait.
        return (self.scrape + self.transport + (self.links + 1) * self.evaluation
                + self.sustain + self.group_wait)


def _records(t: dict) -> dict[str, str]:
    return {r.name: r.expr for g in rules.recording_groups(t) for r in g.rules}


def depth(expr: str, records: dict[str, str]) -> int:
    """How many recorded series deep `expr` reads: 0 for raw series only, else one more than
    the deepest record it names."""
    names = [n for n in records
             if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", expr)]
    return max((1 + depth(records[n], records) for n in names), default=0)


def budgets(s: Settings, single: dict[str, detection.Budget] | None = None
            ) -> dict[str, FleetBudget]:
    """The saturation states' alerts: the state record reads the class's condition, the alert
    the state record (links = the condition's depth + 1)."""
    t = rules.inputs(s)
    if "-remoteWrite.flushInterval" in " ".join(vmagent_command("c", "u", "b", "l",
                                                                dict(s.prometheus))):
        raise ValueError("vmagent's flush interval is set: read it here instead of the default")
    records = _records(t)
    single = single or detection.budgets(s)
    out = {}
    for cls in rules.state_classes(t):
        alert = detection.CLASS_ALERT.get(cls.state)
        if cls.state not in rules.SATURATION_STATES or alert not in single:
            continue
        b = single[alert]
        out[alert] = FleetBudget(alert, cls.state, b.scrape,
                                 VMAGENT_FLUSH_SECONDS + STORE_INGEST_SECONDS,
                                 depth(cls.condition, records) + 1, b.evaluation, b.sustain,
                                 b.group_wait)
    return out


def load_e2e(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _s(value: float) -> str:
    return f"{value:.0f} s"


def block(b: dict[str, FleetBudget], one_host: dict[str, detection.Budget],
          e2e: dict | None) -> str:
    lines = [
        "| alert | signal scraped every | shipping (vmagent flush + store ingestion) "
        "| recorded links | evaluations × interval | sustain (`for:`) | group_wait "
        "| **onset → page, worst case** | one host, worst case |",
        "|---|---|---|---|---|---|---|---|---|"]
    for x in b.values():
        lines.append(
            f"| {x.alert} ({x.state}) | {_s(x.scrape)} | {_s(x.transport)} | {x.links} "
            f"| {x.links + 1} × {_s(x.evaluation)} | {_s(x.sustain)} | {_s(x.group_wait)} "
            f"| **{_s(x.notify_worst)}** | {_s(one_host[x.alert].notify_worst)} |")
    lines.append("")
    if e2e:
        m = e2e["prefill_backlog_page"]
        lines += [
            f"Measured by `{e2e['command']}` ({e2e['date']}; {e2e['setup']}): host-1's backlog "
            f"held {_s(m['backlog_seconds'])}; the page reached the sink "
            f"**{_s(m['onset_to_page_s'])}** after the first scraped sample over the threshold, "
            f"{_s(m['margin_s'])} inside the {_s(m['budget_s'])} budget. On the way: the "
            f"recorded backlog after {_s(m['chain']['recorded_signal'])}, the state after "
            f"{_s(m['chain']['recorded_state'])}, the alert pending after "
            f"{_s(m['chain']['pending'])} and firing after {_s(m['chain']['firing'])}; "
            f"vmalert's longest evaluation of its group took {m['longest_evaluation_s']:.2f} s "
            f"of its {_s(b['SGLangPrefillBacklog'].evaluation)}.", ""]
    return "\n".join(lines)


def render(text: str, s: Settings) -> str:
    """docs/fleet.md with its budget block rendered."""
    one_host = detection.budgets(s)
    e2e = load_e2e(s.docs_dir / FLEET_E2E)
    return doc_blocks.replace_blocks(
        text, {BLOCK: block(budgets(s, single=one_host), one_host, e2e)},
        s.docs_dir / FLEET_DOC)
