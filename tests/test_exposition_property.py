"""The targeted /metrics scan against prometheus_client's parser as the reference.

`reference` is the exporter's former reader: prometheus_client's text parser over the whole body,
then the same aggregation (max within a DP rank, sum over DP ranks, priority="" only for the
scheduler's series, ...). The targeted scan must read every recorded answer exactly like it,
and agree with it on generated variants of those answers: shuffled lines, permuted and extra
labels with escapes, both spellings, NaN/Inf values, timestamps, exemplars, duplicates, CRLF,
and one garbled line in some of them.
"""

import math
import random
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_obs.exporter.sglang_exposition import (
    ADDITIVE,
    COLON_PREFIX,
    MAXIMUM,
    RENAMES,
    SCHEDULER_PRESENCE,
    SUMMED,
    UNDERSCORE_PREFIX,
    WANTED,
    ExpositionError,
    NativeMetrics,
    parse_exposition,
)

from fake_sglang import FIXTURES

TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FIXTURE_FILES = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".prom", ".txt"))


def content_type_of(path):
    ct = path.with_suffix(".content-type")
    return ct.read_text().strip() if ct.exists() else TEXT_TYPE


# --- the reference: the former algorithm -------------------------------------------------------


def reference(text, content_type=""):
    if "openmetrics" in content_type.lower():
        body = text.rstrip()  # (the former reader stripped only "\n", refusing CRLF bodies)
        if not body.endswith("# EOF"):
            raise ExpositionError("OpenMetrics body without '# EOF' (truncated)")
        text = body[: -len("# EOF")]
    try:
        return _reference_aggregate(_reference_samples(text_string_to_metric_families(text)))
    except ExpositionError:
        raise
    except Exception as err:  # the parser raises ValueError, KeyError, IndexError, ... on junk
        raise ExpositionError(f"{type(err).__name__}: {err}"[:200]) from None


def _reference_samples(families):
    for family in families:
        for sample in family.samples:
            name = sample.name
            if name.startswith(COLON_PREFIX):
                spelling, bare = "colon", name[len(COLON_PREFIX):]
            elif name.startswith(UNDERSCORE_PREFIX):
                spelling, bare = "underscore", name[len(UNDERSCORE_PREFIX):]
            else:
                yield "", "", sample.labels, sample.value
                continue
            yield spelling, RENAMES.get(bare, bare), sample.labels, sample.value


def _reference_aggregate(samples):
    out = NativeMetrics()
    spellings = set()
    per_dp = {}
    for spelling, bare, labels, value in samples:
        out.sample_count += 1
        if not spelling:
            continue
        spellings.add(spelling)
        if bare not in WANTED or (bare not in SUMMED and labels.get("priority", "") != ""):
            continue  # scheduler totals are priority=""; tokenizer counters sum over it
        if not isinstance(value, float | int) or math.isnan(value):
            continue
        model = labels.get("model_name", "")
        if model and not out.model_name and bare in SCHEDULER_PRESENCE:
            out.model_name = model
        if bare in SUMMED:  # tokenizer counters: summed over label sets
            key = tuple(sorted(labels.items()))
        else:
            key = (model, labels.get("dp_rank", "") if bare in ADDITIVE else "")
        groups = per_dp.setdefault(bare, {})
        groups[key] = max(value, groups.get(key, -math.inf))
    if out.sample_count == 0:
        raise ExpositionError("no samples in the body")
    for bare, groups in per_dp.items():
        out.values[bare] = max(groups.values()) if bare in MAXIMUM else sum(groups.values())
    out.spelling = (
        "mixed" if len(spellings) > 1 else next(iter(spellings)) if spellings else "none"
    )
    return out


def reference_or_none(text, content_type):
    try:
        return reference(text, content_type)
    except ExpositionError:
        return None


def targeted_or_none(text, content_type):
    try:
        return parse_exposition(text, content_type)
    except ExpositionError:
        return None


def kept(native):
    """What the exporter uses: the aggregated values (NaN compares equal) and the model name."""
    values = {k: "NaN" if math.isnan(v) else float(v) for k, v in native.values.items()}
    return values, native.model_name


def everything(native):
    return kept(native), native.spelling, native.sample_count


# --- recorded answers ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.name)
def test_targeted_scan_reads_every_recorded_answer_like_the_full_parser(path):
    text, content_type = path.read_text(), content_type_of(path)
    got = parse_exposition(text, content_type)
    assert everything(got) == everything(reference(text, content_type))
    assert got.malformed_lines == 0
    assert got.values
    assert got.model_name


def test_openmetrics_fixture_without_eof_fails_in_both():
    path = FIXTURES / "metrics_0.5.23_tp4_underscores.txt"
    text = path.read_text().replace("# EOF", "")
    for reader in (reference, parse_exposition):
        with pytest.raises(ExpositionError, match="EOF"):
            reader(text, content_type_of(path))


# --- targeted cases ------------------------------------------------------------------------------

LINE = 'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\n'


@pytest.mark.parametrize(
    ("body", "value"),
    [
        ('sglang:num_running_reqs{tp_rank="0",model_name="m"} 3\n', 3.0),
        ('sglang:num_running_reqs{ model_name = "m" , tp_rank="0" , } 3.0\n', 3.0),
        ('sglang:num_running_reqs {model_name="m"}   3.0   1712345678901\n', 3.0),
        ('sglang:num_running_reqs{model_name="m"}\t3e0\t1712345678901\r\n', 3.0),
        ('sglang:num_running_reqs{model_name="m"} 3.0 # {trace_id="a b}#"} 0.5 171234.5\n', 3.0),
        ('{"sglang:num_running_reqs",model_name="m"} 3.0\n', 3.0),
        ('{__name__="sglang:num_running_reqs","model_name"="m"} 3.0\n', 3.0),
        ("sglang:num_running_reqs 3.0\n", 3.0),
        ('  sglang:num_running_reqs{model_name="m"} +Inf\n', math.inf),
    ],
)
def test_targeted_scan_reads_every_shape_of_a_sample_line(body, value):
    got = parse_exposition(body)
    assert got.get("num_running_reqs") == value
    assert got.malformed_lines == 0
    assert kept(got) == kept(reference(body))


@pytest.mark.parametrize(
    "junk",
    [
        'sglang:num_running_reqs{model_name="m",tp_rank="0" 9.0',  # unclosed label set
        'sglang:num_running_reqs{model_name="m} 9.0',  # unclosed quote
        'sglang:num_running_reqs{model_name="m",model_name="n"} 9.0',  # duplicate label
        'sglang:num_running_reqs{model_name="m"} 9.0 # {trace_id="a"}',  # exemplar w/o value
        'sglang:num_running_reqs{model_name="m"} 9.0 # {trace_id="a"}0.5',
        'sglang:num_running_reqs{model_name="m"} 9.0 # {trace_id="a"}\t0.5',
        'sglang:num_running_reqs{model_name="m"} 9.0# {trace_id="a"} 0.5',
        'sglang:num_running_reqs{model_name="m"} 9.0\t1 # {trace_id="a"} 0.5',
        'sglang:num_running_reqs{model_name="m"} 9_0',
        'sglang:num_running_reqs{model_name="m"}',
        'sglang:num_running_reqs{__x="m"} 9.0',
        "<html><body>oops</body></html>",
        'x{a="1" 1.0',
    ],
)
def test_a_malformed_line_is_skipped_and_counted(junk):
    body = f"{LINE}{junk}\n{LINE}"
    with pytest.raises(ExpositionError):
        reference(body)  # which refuses the whole body
    got = parse_exposition(body)
    assert got.malformed_lines == 1
    assert got.get("num_running_reqs") == 3.0
    assert got.sample_count == 2


def test_escaped_label_values_are_unescaped():
    body = 'sglang:num_running_reqs{model_name="a\\"b\\\\c\\nd,}=\\q"} 3.0\n'
    assert parse_exposition(body).model_name == 'a"b\\c\nd,}=\\q' == reference(body).model_name


@pytest.mark.parametrize(
    "body",
    ["<html><body><h1>Welcome</h1></body></html>\n", '{"loads": []}\n', "\x00\xff garbage\n",
     "", "# HELP only comments\n", LINE.rstrip("\n")],
    ids=["html", "json", "garbage", "empty", "comments", "no-final-line-feed"],
)
def test_a_body_without_any_sample_is_an_error(body):
    with pytest.raises(ExpositionError):
        parse_exposition(body)


# --- generated variants --------------------------------------------------------------------------

SAMPLE_LINE = re.compile(r"([^{ ]+)(?:\{(.*)\})? (\S+)$")
PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
WANTED_NAMES = {
    prefix + name
    for prefix in (COLON_PREFIX, UNDERSCORE_PREFIX)
    for name in list(WANTED) + list(RENAMES)
}
ODD_VALUES = ["NaN", "nan", "+Inf", "-Inf", "Inf", "1e3", "1.5E-2", "-0.0", "0", "42", ".5",
              "7.", "+3", "1e+06", "-12.25", "123456789"]
ODD_CHARS = ['"', "\\", ",", "}", "{", "=", " ", "#", "\n", "\t", "é", "a", "b", "1", "_"]
MODELS = ["qwen3-27b", 'm"odel', "a\\b", "x,y}z=", "n\nl", "é{} #", "tab\there"]


def escape(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def odd_value(rng, n=6):
    return "".join(rng.choice(ODD_CHARS) for _ in range(rng.randint(0, n)))


def load_base(path):
    """(families, is_openmetrics): each family a list of comment strings and sample dicts."""
    families, openmetrics = [], False
    for line in path.read_text().split("\n"):
        if not line:
            continue
        if line == "# EOF":
            openmetrics = True
            continue
        if line.startswith("#"):
            if not families or any(isinstance(item, dict) for item in families[-1]):
                families.append([])
            families[-1].append(line)
            continue
        name, labels, value = SAMPLE_LINE.match(line).groups()
        families[-1].append({"name": name, "labels": PAIR.findall(labels or ""), "value": value})
    return families, openmetrics


BASES = [(path, *load_base(path)) for path in FIXTURE_FILES]


def is_wanted(family):
    return any(isinstance(item, dict) and item["name"] in WANTED_NAMES for item in family)


def render_sample(sample, opt, rng):
    name = sample["name"]
    if rng.random() < opt["respell"]:
        name = (UNDERSCORE_PREFIX if name.startswith(COLON_PREFIX) else COLON_PREFIX) + name[7:]
    labels = [(k, escape(rng.choice(opt["models"])) if k == "model_name" and opt["models"] else v)
              for k, v in sample["labels"]]
    if rng.random() < opt["extra"]:
        for _ in range(rng.randint(1, 3)):
            labels.insert(rng.randint(0, len(labels)),
                          (f"x{rng.randint(0, 99)}_{len(labels)}", escape(odd_value(rng))))
    if rng.random() < opt["priority"]:
        labels = [(k, v) for k, v in labels if k != "priority"]
        labels.append(("priority", rng.choice(["", "0", "1"])))
    if rng.random() < opt["dp"]:
        labels = [(k, v) for k, v in labels if k != "dp_rank"]
        labels.append(("dp_rank", rng.choice(["0", "1", "0", escape('1"')])))
    if opt["shuffle_labels"]:
        rng.shuffle(labels)
    value = rng.choice(ODD_VALUES) if rng.random() < opt["values"] else sample["value"]
    comma = rng.choice([",", " , ", ",\t"]) if opt["spacing"] else ","
    items = [(f'"{k}"' if rng.random() < opt["quoted_names"] else k) + f'="{v}"'
             for k, v in labels]
    form = rng.random()
    if form < opt["name_inside"]:
        inside = f'"{name}"' if rng.random() < 0.5 else f'__name__="{name}"'
        head = "{" + comma.join([inside] + items) + "}"
    elif form < opt["name_inside"] + opt["no_labels"]:
        head = name
    else:
        head = (name + (" " if opt["spacing"] and rng.random() < 0.3 else "") + "{"
                + comma.join(items) + (comma if opt["spacing"] and rng.random() < 0.3 else "")
                + "}")
    tail = [value]
    if rng.random() < opt["timestamps"]:
        tail.append(rng.choice(["1712345678901", "1712345678.901", "-5", "0"]))
    if rng.random() < opt["exemplars"]:
        tail += ["#", f'{{trace_id="{escape(odd_value(rng, 10))}"}}', rng.choice(["0.5", "1e-3"])]
        if rng.random() < 0.5:
            tail.append("1712345678.5")
        return head + " " + " ".join(tail)
    if opt["tabs"] and rng.random() < 0.5:
        return head + "\t" + "\t".join(tail)
    return head + rng.choice([" ", "  "]) + " ".join(tail)


NOT_LINE_FEED = [b for b in range(256) if b != 0x0A]
STRUCTURAL = list(b'"\\,{}= \t#_.e+-:\r\x0c\x1f')  # what the grammar turns on


def garble(line, rng):
    """The line with a few random byte flips, insertions or deletions, or cut short."""
    data = bytearray(line.encode())
    if rng.random() < 0.25 or len(data) < 2:
        return data[: rng.randrange(len(data) or 1)].decode("utf-8", "replace")
    for _ in range(rng.randint(1, 3)):
        byte = rng.choice(STRUCTURAL if rng.random() < 0.5 else NOT_LINE_FEED)
        at = rng.randrange(len(data))
        op = rng.random()
        if op < 0.6:
            data[at] = byte
        elif op < 0.8:
            data.insert(at, byte)
        elif len(data) > 1:
            del data[at]
    return data.decode("utf-8", "replace")


def make_variant(rng):
    """(lines, index of the garbled line or None, content type)."""
    path, families, openmetrics = rng.choice(BASES)
    chosen = [f for f in families if rng.random() < (0.5 if is_wanted(f) else 0.06)]
    missing = [f for f in families if is_wanted(f) and f not in chosen]
    chosen += missing[: max(0, 2 - sum(map(is_wanted, chosen)))]  # >= 2 kept samples
    opt = {
        "respell": rng.choice([0, 0, 0.3, 1]),
        "models": rng.sample(MODELS, rng.randint(1, 2)) if rng.random() < 0.3 else None,
        "extra": rng.choice([0, 0, 0.3]),
        "priority": rng.choice([0, 0, 0.2]),
        "dp": rng.choice([0, 0, 0.3]),
        "shuffle_labels": rng.random() < 0.4,
        "values": rng.choice([0, 0, 0.3]),
        "spacing": rng.random() < 0.2,
        "quoted_names": rng.choice([0, 0, 0, 0.2]),
        "name_inside": rng.choice([0, 0, 0, 0.1]),
        "no_labels": rng.choice([0, 0, 0, 0.1]),
        "timestamps": rng.choice([0, 0, 0.5]),
        "exemplars": rng.choice([0, 0, 0.3]),
        "tabs": rng.random() < 0.1,
    }
    rendered = []  # per family: (line, its sample or None)
    for family in chosen:
        items = [i for i in family if not isinstance(i, dict) or rng.random() < 0.3
                 or i["name"] in WANTED_NAMES]
        pairs = [(i, None) if isinstance(i, str) else (render_sample(i, opt, rng), i)
                 for i in items]
        if rng.random() < 0.2:
            rng.shuffle(pairs)  # within the family
        rendered.append(pairs)
    if rng.random() < 0.3:
        rng.shuffle(rendered)  # families
    pairs = [pair for family in rendered for pair in family]
    if rng.random() < 0.2:
        rng.shuffle(pairs)  # everything
    lines = [line for line, _ in pairs]
    samples = [sample for _, sample in pairs if sample is not None]
    if rng.random() < 0.2:  # duplicates, some with another value
        for sample in rng.sample(samples, min(3, len(samples))):
            if rng.random() < 0.5:
                sample = dict(sample, value=rng.choice(ODD_VALUES))
            lines.insert(rng.randint(0, len(lines)), render_sample(sample, opt, rng))
    for _ in range(rng.choice([0, 0, 2])):
        lines.insert(rng.randint(0, len(lines)),
                     rng.choice(["", "# UNIT sglang:token_usage ratio", "# a comment", "   "]))
    garbled = None
    if rng.random() < 0.4:
        wanted = [i for i, line in enumerate(lines) if line_kind(line) == "wanted"]
        garbled = rng.choice(wanted if wanted and rng.random() < 0.6 else range(len(lines)))
        lines[garbled] = garble(lines[garbled], rng)
    if openmetrics:
        lines.append("# EOF")
    return lines, garbled, content_type_of(path) if openmetrics else TEXT_TYPE, opt


def line_kind(line):
    """comment | wanted | unwanted, by the name the line gives (before any parsing)."""
    s = line.strip()
    if not s or s.startswith("#"):
        return "comment"
    m = re.match(r'\{[ \t]*(?:__name__[ \t]*=[ \t]*)?"([^"]*)"', s) or re.match(r"[^{ \t]*", s)
    return "wanted" if m.group(m.lastindex or 0) in WANTED_NAMES else "unwanted"


def join(lines, rng, crlf):
    ends = ["\r\n" if crlf == "all" or (crlf == "mixed" and rng.random() < 0.5) else "\n"
            for _ in lines]
    return "".join(line + end for line, end in zip(lines, ends, strict=True))


def check_variant(lines, garbled, content_type, rng):
    """What went wrong (None when the targeted scan behaves as required) and what happened."""
    crlf = rng.choice(["none", "none", "all", "mixed"])
    text = join(lines, rng, crlf)
    ref = reference_or_none(text, content_type)
    got = targeted_or_none(text, content_type)
    seen = {"reference_failed": ref is None, "raised": got is None,
            "malformed": bool(got and got.malformed_lines)}
    if garbled is None:
        if ref is None:
            return "generator: the reference refuses an ungarbled variant", seen
        if got is None or got.malformed_lines or everything(got) != everything(ref):
            return "ungarbled variant read differently", seen
        return None, seen
    without = reference_or_none(join(lines[:garbled] + lines[garbled + 1:], rng, crlf),
                                content_type)
    if without is None:  # the `# EOF` line was garbled, or no other sample: nothing to read
        return (None if got is None else "expected an error"), seen
    if got is None:
        return ("targeted scan refused a body the reference reads" if ref else None), seen
    if got.malformed_lines:  # skipped exactly the garbled line
        if got.malformed_lines != 1 or everything(got) != everything(without):
            return "malformed count or values differ from the reference without the line", seen
        return None, seen
    if ref is not None:
        same = everything(got) == everything(ref)
        return (None if same else "garbled variant read differently"), seen
    # The reference refused the body, the targeted scan skipped nothing: the garbled line must be
    # one it does not read (a comment, or another family's sample).
    if line_kind(lines[garbled]) == "wanted":
        return "a wanted line the reference refuses was read", seen
    return (None if kept(got) == kept(without) else "kept families differ"), seen


def run_variants(seed, count):
    rng = random.Random(seed)
    failures, stats = [], dict.fromkeys(["garbled", "malformed", "reference_failed", "raised"], 0)
    for n in range(count):
        lines, garbled, content_type, opt = make_variant(rng)
        problem, seen = check_variant(lines, garbled, content_type, random.Random(n))
        if problem:
            failures.append((n, problem, opt, lines, garbled))
        if garbled is not None:
            stats["garbled"] += 1
            for key, happened in seen.items():
                stats[key] += happened
    return failures, stats


def describe(failures):
    return "\n".join(
        f"variant {n}: {problem}\n  garbled line {garbled}: "
        f"{lines[garbled] if garbled is not None else ''!r}\n  {opt}\n  "
        + "\n  ".join(map(repr, lines))
        for n, problem, opt, lines, garbled in failures[:3]
    ) + f"\n({len(failures)} failures)"


def test_generated_variants_agree_with_the_reference():
    failures, stats = run_variants(20250601, 1200)
    assert not failures, describe(failures)
    # The generator reaches the cases the rules are about.
    assert stats["garbled"] > 300, stats
    assert stats["malformed"] > 100, stats
    assert stats["reference_failed"] > 50, stats
