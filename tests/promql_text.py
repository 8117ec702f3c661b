"""PromQL text helpers shared by the rule and dashboard lints (no PromQL parser on PyPI or in
Debian does what these checks need; promtool validates the syntax itself)."""

from __future__ import annotations

import re


def strip_strings(expr: str) -> str:
    """Blank out string literals and comments, keeping offsets."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`',
                  lambda m: '"' + " " * (len(m.group()) - 2) + '"', expr)
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), expr)


def matching_paren(text: str, open_index: int) -> int:
    depth = 0
    for i in range(open_index, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses in {text!r}")


def paren_owners(expr: str) -> list[tuple[int, int, str]]:
    """(open, close, word before the parenthesis) for every parenthesis pair."""
    pairs, stack = [], []
    for i, char in enumerate(expr):
        if char == "(":
            word = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", expr[:i])
            stack.append((i, word.group(1) if word else ""))
        elif char == ")":
            start, word = stack.pop()
            pairs.append((start, i, word))
    assert not stack, f"unbalanced parentheses in {expr!r}"
    return pairs


def innermost_call(pairs, position: int) -> str:
    enclosing = [(start, end, word) for start, end, word in pairs if start < position < end]
    calls = [p for p in enclosing if p[2] and p[2] not in ("by", "without", "on", "ignoring",
                                                           "group_left", "group_right")]
    return max(calls)[2] if calls else ""


def grouping_after(text: str, index: int) -> tuple[str, list[str]] | None:
    match = re.match(r"\s*(by|without)\s*\(([^)]*)\)", text[index:])
    if not match:
        return None
    return match.group(1), [label.strip() for label in match.group(2).split(",") if label.strip()]


AGGREGATORS = ("sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk",
               "bottomk", "quantile", "count_values")


def quantile_violations(expr: str) -> list[str]:
    """Aggregations inside histogram_quantile that drop `le` (the quantile becomes wrong)."""
    clean = strip_strings(expr)
    aggregator = re.compile(r"\b(" + "|".join(AGGREGATORS) + r")\b\s*(?=\(|by\b|without\b)")
    bad = []
    for hq in re.finditer(r"\bhistogram_quantile\s*\(", clean):
        body_start = hq.end() - 1
        body = clean[body_start:matching_paren(clean, body_start) + 1]
        for agg in aggregator.finditer(body):
            grouping = grouping_after(body, agg.end())
            rest = agg.end() + (re.match(r"\s*(by|without)\s*\([^)]*\)", body[agg.end():]).end()
                                if grouping else 0)
            open_index = body.index("(", rest)
            if grouping is None:  # trailing form: sum(...) by (le)
                grouping = grouping_after(body, matching_paren(body, open_index) + 1)
            if grouping is None:
                bad.append(f"{agg.group(1)}() drops le")
                continue
            mode, labels = grouping
            if ("le" in labels) != (mode == "by"):
                bad.append(f"{agg.group(1)} {mode} ({', '.join(labels)}) drops le")
    return bad
