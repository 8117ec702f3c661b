"""docs/compatibility.md: which SGLang release gives every rule and every dashboard panel its data.

Pure functions of what the generator read: each golden's exposed families
(conformance/goldens/<release>/<variant>/manifest.json, written from the release's own
collectors), the variants' server flags, and the rule and dashboard texts. An expression's
SGLang families are the `sglang:` names it reads, through the recording rules it reads (a
panel on `instance:sglang_state:code` needs what that record needs). A cell says "data" when a
default-flags server of the release exposes all of them, "needs --flag" when only a variant
does, and "absent" with the missing families otherwise.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import yaml

_NAME = re.compile(r"sglang:[A-Za-z0-9_]+")
_SUFFIXES = ("_bucket", "_sum", "_count")
_TOKEN = re.compile(r"[\w:]+")  # a recording rule's name is read where it is a whole token
_SET_OPERATORS = {word: re.compile(rf"\s{word}\b") for word in ("or", "unless")}


def _records_in(expr: str, records: Mapping[str, str]) -> list[str]:
    tokens = set(_TOKEN.findall(expr))
    return [record for record in records if record in tokens]


@dataclass(frozen=True)
class Golden:
    release: str
    variant: str
    flags: Mapping[str, object]
    exposed: frozenset[str]
    defined: frozenset[str]
    prometheus_client: str
    openmetrics_content_type: str = ""


def recording_rules(rule_texts: Iterable[str]) -> dict[str, str]:
    return dict(_recording_rules(tuple(rule_texts)))


@functools.lru_cache(maxsize=4)  # every dashboard is annotated from the same rule files
def _recording_rules(rule_texts: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for text in rule_texts:
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    out[rule["record"]] = rule["expr"]
    return out


def families_read(expr: str, records: Mapping[str, str], known: set[str],
                  seen: tuple[str, ...] = ()) -> set[str]:
    """The SGLang families `expr` reads, directly or through recording rules."""
    out = set()
    for name in _NAME.findall(expr):
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in known:
                name = name[: -len(suffix)]
        out.add(name)
    for record in _records_in(expr, records):
        if record not in seen:
            out |= families_read(records[record], records, known, (*seen, record))
    return out


@functools.lru_cache(maxsize=8192)  # the same rule bodies are cut for every panel and release
def _split(expr: str, words: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`expr` cut at the binary set operators in `words` outside any bracket:
    [(operator before the part, part), ...]; the first part's operator is ""."""
    parts, depth, start, op = [], 0, 0, ""
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            for word in words:
                m = _SET_OPERATORS[word].match(expr, i)
                if m:
                    parts.append((op, expr[start:i]))
                    op, start = word, m.end()
                    i = start - 1
                    break
        i += 1
    parts.append((op, expr[start:]))
    return tuple(parts)


def missing(expr: str, exposed: frozenset[str], records: Mapping[str, str],
            known: set[str]) -> set[str] | None:
    """None when `expr` returns data from `exposed`, else the families it lacks. `a or b` needs
    one side, `a unless b` only a, `absent(x)` nothing; a recording rule needs what it reads."""
    expr = expr.strip()
    parts = _split(expr, ("or", "unless"))
    if len(parts) > 1:
        lacking: set[str] = set()
        satisfied = False
        for op, part in parts:
            if op == "unless":
                continue
            got = missing(part, exposed, records, known)
            if got is None:
                satisfied = True
            else:
                lacking |= got
        return None if satisfied else lacking
    # Brackets whose inside has alternatives are judged on their own.
    lacking = set()
    rest, depth, start = [], 0, None
    for i, ch in enumerate(expr):
        if ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and start is not None:
                inner = expr[start + 1:i]
                head = expr[:start].rstrip()
                if re.search(r"absent(_over_time)?$", head):
                    rest.append("()")  # absent(x) answers when x has no data
                elif len(_split(inner, ("or", "unless"))) > 1 or "(" in inner:
                    got = missing(inner, exposed, records, known)
                    lacking |= got or set()
                    rest.append("()")
                else:
                    rest.append(expr[start:i + 1])
                start = None
        elif depth == 0:
            rest.append(ch)
    flat = "".join(rest)
    for name in families_read(flat, {}, known):
        if name not in exposed:
            lacking.add(name)
    for record in _records_in(flat, records):
        got = missing(records[record], exposed,
                      {k: v for k, v in records.items() if k != record}, known)
        lacking |= got or set()
    return lacking or None


def flag_text(flags: Mapping[str, object]) -> str:
    parts = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        parts.append(flag if value is True else f"{flag} {value}")
    return " ".join(parts)


def cell(expr: str, release: str, goldens: Mapping[tuple[str, str], Golden],
         records: Mapping[str, str], known: set[str]) -> str:
    default = goldens[(release, "default")]
    lacking = missing(expr, default.exposed, records, known)
    if lacking is None:
        return "data"
    for (r, variant), g in sorted(goldens.items()):
        if (r == release and variant != "default"
                and missing(expr, g.exposed, records, known) is None):
            return f"needs `{flag_text(g.flags)}`" if g.flags else f"needs {variant} traffic"
    shown = ", ".join(f"`{m.removeprefix('sglang:')}`" for m in sorted(lacking)[:3])
    return f"absent: {shown}" + (f" +{len(lacking) - 3}" if len(lacking) > 3 else "")


def panels(doc: dict) -> list[dict]:
    """Every panel of a dashboard document, those inside rows included, in order (the dicts
    themselves: a caller may change them)."""
    out, stack = [], list(doc.get("panels", []))
    while stack:
        panel = stack.pop(0)
        stack[:0] = panel.get("panels", [])
        out.append(panel)
    return out


def dashboard_targets(dashboard_texts: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) of every panel target."""
    out = []
    for name, text in sorted(dashboard_texts.items()):
        for panel in panels(json.loads(text)):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((name, panel.get("title", ""), target["expr"]))
    return out


def _releases_text(releases: list[str]) -> str:
    return ", ".join(releases[:-1]) + " and " + releases[-1] if len(releases) > 1 else releases[0]


def panel_note(exprs: Iterable[str], goldens: Mapping[tuple[str, str], Golden],
               records: Mapping[str, str], known: set[str]) -> str:
    """What a panel says about the supported releases where a default-flags server leaves
    (some of) its queries without data: "" when every release gives all of them data."""
    releases = sorted({r for r, _ in goldens}, key=_version)
    exprs = list(exprs)
    absent: dict[str, set[str]] = {}  # release -> missing families
    empty: dict[str, int] = {}  # release -> queries without data
    gated: dict[str, set[str]] = {}  # flag text -> releases
    for release in releases:
        for expr in exprs:
            lacking = missing(expr, goldens[(release, "default")].exposed, records, known)
            if lacking is None:
                continue
            empty[release] = empty.get(release, 0) + 1
            flag = next((flag_text(g.flags) or f"{v} traffic" for (r, v), g in
                         sorted(goldens.items()) if r == release and v != "default"
                         and missing(expr, g.exposed, records, known) is None), None)
            if flag is None:
                absent.setdefault(release, set()).update(lacking)
            else:
                gated.setdefault(flag, set()).add(release)
    notes = []
    groups: dict[tuple[bool, tuple[str, ...]], list[str]] = {}
    for release, names in absent.items():
        whole = empty[release] == len(exprs)
        groups.setdefault((whole, tuple(sorted(names))), []).append(release)
    for (whole, names), rels in sorted(groups.items(), key=lambda kv: _version(kv[1][0])):
        shown = ", ".join(f"`{n.removeprefix('sglang:')}`" for n in names)
        what = "No data" if whole else "Some series have no data"
        notes.append(f"{what} from SGLang {_releases_text(rels)}: "
                     f"{'it does' if len(rels) == 1 else 'they do'} not expose {shown}.")
    for flag, rels in sorted(gated.items()):
        ordered = sorted(rels, key=_version)
        notes.append(f"Needs `{flag}` (SGLang {_releases_text(ordered)})."
                     if not flag.endswith("traffic") else
                     f"Shows data only with {flag} (SGLang {_releases_text(ordered)}).")
    return " ".join(notes)


def annotate_dashboard(text: str, goldens: Mapping[tuple[str, str], Golden],
                       rule_texts: Iterable[str]) -> str:
    """The dashboard JSON `text` with each panel's release note (panel_note) after its
    description, so that a panel that stays empty on a supported release says why. Serialised
    as grafanalib writes dashboards (sorted keys, indent 2, trailing newline)."""
    rule_texts = list(rule_texts)
    records = recording_rules(rule_texts)
    known = set().union(*(g.defined for g in goldens.values()))
    doc = json.loads(text)
    for panel in panels(doc):
        exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
        if not exprs:
            continue
        note = panel_note(exprs, goldens, records, known)
        if note:
            description = panel.get("description", "").rstrip()
            panel["description"] = f"{description} {note}" if description else note
    return json.dumps(doc, sort_keys=True, indent=2) + "\n"


def markdown(goldens: Mapping[tuple[str, str], Golden], rule_texts: Iterable[str],
             dashboard_texts: Mapping[str, str]) -> str:
    rule_texts = list(rule_texts)
    releases = sorted({r for r, _ in goldens}, key=_version)
    known = set().union(*(g.defined for g in goldens.values()))
    records = recording_rules(rule_texts)
    rules = [(r.get("record") or r["alert"], r["expr"]) for text in rule_texts
             for group in yaml.safe_load(text)["groups"] for r in group["rules"]]
    panels = dashboard_targets(dashboard_texts)
    used = set()
    for _, expr in rules:
        used |= families_read(expr, records, known)
    for *_, expr in panels:
        used |= families_read(expr, records, known)
    head = "| " + " | ".join(releases) + " |"
    lines = [
        "# Compatibility with SGLang releases",
        "",
        "Generated by `python -m sglang_obs.generate compatibility` from",
        "`conformance/goldens/` (written by each release's own collectors, `/metrics` app and",
        "JSON builders: `make goldens`, [conformance.md](conformance.md)) and the shipped rules",
        "and dashboards; a test fails when it is stale. Supported releases: "
        + ", ".join(releases) + ".",
        "",
        "## Families per release",
        "",
        "*Defined*: every family the release's collectors declare (all features on). *Exposed*:",
        "what a TP2 server with default flags answers under load. *Used*: the families the",
        "rules and dashboards read that the release defines.",
        "",
        "| release | defined | exposed, default flags | used by sglang-obs | prometheus_client "
        "| OpenMetrics answer |",
        "|---|---|---|---|---|---|",
    ]
    for release in releases:
        g = goldens[(release, "default")]
        lines.append(f"| {release} | {len(g.defined)} | {len(g.exposed)} | "
                     f"{len(used & g.defined)} | {g.prometheus_client} | "
                     f"`{g.openmetrics_content_type or 'n/a'}` |")
    lines += ["", "## What each variant adds", "",
              "Families a server exposes beyond the default-flags one, per feature.", "",
              "| release | variant | flags | families beyond default |", "|---|---|---|---|"]
    for (release, variant), g in sorted(goldens.items(), key=lambda kv: (_version(kv[0][0]),
                                                                          kv[0][1])):
        if variant == "default":
            continue
        extra = sorted(g.exposed - goldens[(release, "default")].exposed)
        names = ", ".join(f"`{n.removeprefix('sglang:')}`" for n in extra) or "none"
        lines.append(f"| {release} | {variant} | `{flag_text(g.flags) or '(default)'}` | "
                     f"{names} |")
    lines += ["", "## Rules", "",
              "Rules that read only the exporter's own series are left out; an alert with",
              "several expressions (one per window) is one row when they agree.", "",
              "| rule " + head, "|---|" + "---|" * len(releases)]
    shown = set()
    for name, expr in rules:
        if not families_read(expr, records, known):
            continue  # reads only the exporter's own series
        row = f"| `{name}` | " + " | ".join(cell(expr, r, goldens, records, known)
                                            for r in releases) + " |"
        if row not in shown:
            shown.add(row)
            lines.append(row)
    lines += ["", "## Dashboard panels", "", "| dashboard | panel " + head,
              "|---|---|" + "---|" * len(releases)]
    seen = set()
    for dashboard, title, expr in panels:
        needs = families_read(expr, records, known)
        row = (dashboard, title, tuple(cell(expr, r, goldens, records, known)
                                       for r in releases))
        if not needs or row in seen:
            continue
        seen.add(row)
        lines.append(f"| {dashboard} | {title} | " + " | ".join(row[2]) + " |")
    return "\n".join(lines) + "\n"


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.replace(".post", ".").split("."))
