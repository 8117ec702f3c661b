"""The simulator's /metrics in the text format 0.0.4: byte for byte what prometheus_client's
`generate_latest` writes (SGLang serves its metrics with it), at a fraction of its cost.

prometheus_client validates and escapes every label of every sample on every scrape; a
simulated server repeats the same few hundred label sets scrape after scrape, so each set is
written once. The simulator's names are all in the legacy character set, which `generate_latest`
leaves as they are; tests/test_simulator_pd.py and tests/test_simulator_render.py hold the two
writers equal."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.utils import floatToGoString


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


_LABELS: dict[tuple, str] = {}  # label sets repeat scrape after scrape: written once each


def _label_text(labels: dict[str, str]) -> str:
    key = tuple(labels.items())
    text = _LABELS.get(key)
    if text is None:
        if len(_LABELS) > 100_000:
            _LABELS.clear()
        text = _LABELS[key] = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return text


def _value_text(value: float) -> str:
    value = float(value)
    # floatToGoString is repr() below 1e6 (it switches to Go's exponent form above).
    return repr(value) if -1e6 < value < 1e6 else floatToGoString(value)


def family_text(metric) -> str:
    """One family as prometheus_client's generate_latest writes it."""
    mname, mtype = metric.name, metric.type
    if mtype == "counter":
        mname += "_total"
    elif mtype == "gaugehistogram":
        mtype = "histogram"
    elif mtype == "unknown":
        mtype = "untyped"
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {mname} {doc}\n# TYPE {mname} {mtype}\n"]
    for s in metric.samples:
        labels = _label_text(s.labels) if s.labels else ""
        out.append(f"{s.name}{{{labels}}} {_value_text(s.value)}\n" if labels
                   else f"{s.name} {_value_text(s.value)}\n")
    return "".join(out)


def families_text(families: Callable[[], Iterable]) -> Callable[[], bytes]:
    """The plain text of what `families()` yields, written afresh at each call."""
    return lambda: "".join(family_text(f) for f in families()).encode()


def metrics_route(text: Callable[[], bytes], metrics_app: Callable) -> Callable:
    """A WSGI /metrics: `text()` when the request would get generate_latest's output (no gzip,
    no `name[]` filter), prometheus_client's own app otherwise."""

    def app(environ, start_response):
        encoder, _ = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        if (encoder is not generate_latest or environ.get("QUERY_STRING")
                or "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")):
            return metrics_app(environ, start_response)
        body = text()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4),
                                  ("Content-Length", str(len(body)))])
        return [body]

    return app
