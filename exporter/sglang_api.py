"""Read SGLang's JSON endpoints: /v1/loads (/get_load before 0.5.8), /server_info, /v1/models.

Each reader takes decoded JSON of any shape and returns a small value object; a field a release
does not have is None. They never raise on odd input. A payload that is not what any release
sends raises PayloadError; within a payload of the right shape, every field is optional and
typed: a field of the wrong type (a string for a number, 5 for a list, a number too large for a
float, Infinity) reads as unknown and is named in `bad_fields`, which the poller counts as one
parse error for the answer. String fields become label values only through labels.py (model
name reduced, enumerated fields checked against their known values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_obs.exporter import labels


class PayloadError(ValueError):
    """The JSON does not have the shape of any SGLang release."""


# A PD server's queues in /v1/loads' `disaggregation` block (0.5.8+), by role: (queue label,
# key). A prefill server reports the decode keys too, at 0 (and the other way round): only the
# role's own are its queues.
PD_QUEUES = {
    "prefill": (("bootstrap", "prefill_bootstrap_queue_reqs"),
                ("inflight", "prefill_inflight_queue_reqs")),
    "decode": (("prealloc", "decode_prealloc_queue_reqs"),
               ("transfer", "decode_transfer_queue_reqs"),
               ("retracted", "decode_retracted_queue_reqs")),
}
# No server holds this many requests in one queue: a larger count is not a count.
MAX_QUEUE_REQUESTS = float(1 << 32)


@dataclass(frozen=True)
class PdLoad:
    """A prefill or decode server's PD queues, summed over DP ranks (from /v1/loads)."""

    mode: str  # "prefill" | "decode"
    queues: Mapping[str, float] = field(default_factory=dict)  # queue label -> requests


@dataclass(frozen=True)
class Load:
    """Live load summed over DP ranks (from /v1/loads or /get_load)."""

    running: float | None = None
    waiting: float | None = None
    prefill_backlog_tokens: float | None = None  # waiting, uncached prompt tokens
    used_tokens: float | None = None
    capacity_tokens: float | None = None
    max_running_requests: float | None = None  # the effective limit
    gen_throughput: float | None = None
    # None: a unified server (mode "null"), or a release without the disaggregation block.
    pd: PdLoad | None = None
    bad_fields: tuple[str, ...] = ()  # fields of the wrong type, read as unknown


@dataclass(frozen=True)
class ServerConfig:
    """The configuration the server actually runs with (resolved, not the command line)."""

    version: str = ""
    model_name: str = ""
    tp_size: int | None = None
    dp_size: int | None = None
    pp_size: int | None = None
    max_running_requests: float | None = None  # effective, summed over DP ranks
    max_total_num_tokens: float | None = None  # KV capacity, summed over DP ranks
    chunked_prefill_size: float | None = None
    max_prefill_tokens: float | None = None
    context_length: float | None = None
    num_continuous_decode_steps: float | None = None
    schedule_policy: str = ""
    kv_cache_dtype: str = ""
    speculative_algorithm: str = ""
    mixed_chunk: bool | None = None
    disaggregation_mode: str = ""
    bad_fields: tuple[str, ...] = ()  # fields of the wrong type, read as unknown


@dataclass(frozen=True)
class Models:
    """What /v1/models says: the base model's context length."""

    context_length: float | None = None
    bad_fields: tuple[str, ...] = ()


# Sizes (tp, dp, pp) outside this range are no configuration any release runs.
MAX_PARALLEL_SIZE = 1 << 20


class _Fields:
    """Typed reads of JSON fields: a value of the wrong type reads as None (unknown) and its
    field is recorded in `bad`; JSON null is just absent."""

    def __init__(self):
        self.bad: dict[str, None] = {}  # ordered set

    def _wrong(self, where: str):
        self.bad[where] = None
        return None

    def num(self, mapping: dict, key: str, where: str | None = None) -> float | None:
        """A finite number; booleans, strings, huge integers and non-finite floats are wrong."""
        value = mapping.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self._wrong(where or key)
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            return self._wrong(where or key)
        return number if math.isfinite(number) else self._wrong(where or key)

    def size(self, mapping: dict, key: str) -> int | None:
        """A parallel size: a whole number in 1..MAX_PARALLEL_SIZE."""
        number = self.num(mapping, key)
        if number is None:
            return None
        if number != int(number) or not 1 <= number <= MAX_PARALLEL_SIZE:
            return self._wrong(key)
        return int(number)

    def count(self, mapping: dict, key: str, where: str) -> float | None:
        """A number of requests: a whole number in 0..MAX_QUEUE_REQUESTS."""
        number = self.num(mapping, key, where)
        if number is None:
            return None
        if number != int(number) or not 0 <= number <= MAX_QUEUE_REQUESTS:
            return self._wrong(where)
        return number

    def text(self, mapping: dict, key: str, where: str | None = None) -> str:
        value = mapping.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            return self._wrong(where or key) or ""
        return value

    def flag(self, mapping: dict, key: str) -> bool | None:
        value = mapping.get(key)
        if value is None or isinstance(value, bool):
            return value
        return self._wrong(key)

    def objects(self, value: Any, where: str) -> list[dict]:
        """The dict entries of a JSON list; a non-list, or non-dict entries, are wrong."""
        if value is None:
            return []
        if not isinstance(value, list):
            return self._wrong(where) or []
        entries = [e for e in value if isinstance(e, dict)]
        if len(entries) != len(value):
            self._wrong(where + "[]")
        return entries

    def object(self, mapping: dict, key: str, where: str) -> dict:
        value = mapping.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            return self._wrong(where) or {}
        return value

    def total(self, entries: list[dict], *keys: str, where: str = "") -> float | None:
        """Sum the first present key of each entry; None when no entry has any of them."""
        total, seen = 0.0, False
        for entry in entries:
            for key in keys:
                value = self.num(entry, key, f"{where}[].{key}")
                if value is not None:
                    total += value
                    seen = True
                    break
        return total if seen and math.isfinite(total) else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.bad)


def parse_loads(payload: Any) -> Load:
    """/v1/loads (0.5.8+) or /get_load (0.4.7+, three shapes)."""
    f = _Fields()
    if isinstance(payload, dict) and isinstance(payload.get("loads"), list):
        entries = f.objects(payload["loads"], "loads")
    elif isinstance(payload, list):
        entries = f.objects(payload, "")
    elif isinstance(payload, dict) and "load" in payload:
        # 0.4.7-0.5.2: {"load": running + waiting}; nothing that separates the two.
        if f.num(payload, "load") is None:
            raise PayloadError("get_load: 'load' is not a number")
        return Load()
    else:
        raise PayloadError("not a loads payload")
    if not entries:
        raise PayloadError("loads payload has no per-rank entries")
    where = "loads" if isinstance(payload, dict) else ""
    running = f.total(entries, "num_running_reqs", where=where)
    waiting = f.total(entries, "num_waiting_reqs", where=where)
    if running is None and waiting is not None:
        # 0.5.3-0.5.10 /get_load: num_reqs = running + waiting
        reqs = f.total(entries, "num_reqs", where=where)
        running = None if reqs is None else max(reqs - waiting, 0.0)
    return Load(
        running=running,
        waiting=waiting,
        prefill_backlog_tokens=f.total(entries, "num_waiting_uncached_tokens",
                                       "num_pending_tokens", where=where),
        used_tokens=f.total(entries, "num_used_tokens", where=where),
        capacity_tokens=f.total(entries, "max_total_num_tokens", where=where),
        max_running_requests=f.total(entries, "max_running_requests", where=where),
        gen_throughput=f.total(entries, "gen_throughput", where=where),
        pd=_pd_load(f, entries, where),
        bad_fields=f.names,
    )


def _pd_load(f: _Fields, entries: list[dict], where: str) -> PdLoad | None:
    """The role's queues from each rank's `disaggregation` block, summed over the ranks. A queue
    with a bad value on any rank is unknown (a partial sum would understate it); ranks that
    disagree on the mode are no server's answer, so no queue is read."""
    path = f"{where}[].disaggregation"
    blocks = [b for e in entries if (b := f.object(e, "disaggregation", path))]
    modes = {f.text(b, "mode", f"{path}.mode").lower() for b in blocks} - {""}
    if len(modes) > 1:
        f._wrong(f"{path}.mode")
        return None
    mode = modes.pop() if modes else ""
    if mode not in PD_QUEUES:  # "null": a unified server; an unknown mode has no known queues
        return None
    queues = {}
    for queue, key in PD_QUEUES[mode]:
        values = [f.count(b, key, f"{path}.{key}") for b in blocks if b.get(key) is not None]
        if values and None not in values:
            queues[queue] = float(sum(values))
    return PdLoad(mode, queues)


def parse_server_info(payload: Any) -> ServerConfig:
    """/server_info (0.5.6+) or /get_server_info (every release)."""
    if not isinstance(payload, dict) or not (
        "version" in payload or "internal_states" in payload or "tp_size" in payload
    ):
        raise PayloadError("not a server_info payload")
    f = _Fields()
    states = f.objects(payload.get("internal_states"), "internal_states")
    dp_size = f.size(payload, "dp_size")
    ranks = dp_size or 1

    max_running = f.total(states, "effective_max_running_requests_per_dp",
                          where="internal_states")
    cli_max_running = f.num(payload, "max_running_requests")
    if max_running is None and cli_max_running is not None:
        # Before 0.5.8 only the CLI value exists (often null); it is per DP rank.
        max_running = cli_max_running * ranks

    memory = [f.object(s, "memory_usage", "internal_states[].memory_usage") for s in states]
    capacity = f.total(memory, "token_capacity", where="internal_states[].memory_usage")
    handshake = f.num(payload, "max_total_num_tokens")
    if capacity is None and handshake is not None:
        # The handshake value is one scheduler's pool; every DP rank has its own.
        capacity = handshake * ranks

    spec = f.text(payload, "speculative_algorithm")
    spec = "" if spec.lower() in ("", "none", "null") else spec
    model = f.text(payload, "served_model_name") or f.text(payload, "model_path")
    return ServerConfig(
        version=labels.version(f.text(payload, "version")),
        model_name=labels.model_name(model),
        tp_size=f.size(payload, "tp_size"),
        dp_size=dp_size,
        pp_size=f.size(payload, "pp_size"),
        max_running_requests=max_running,
        max_total_num_tokens=capacity,
        chunked_prefill_size=f.num(payload, "chunked_prefill_size"),
        max_prefill_tokens=f.num(payload, "max_prefill_tokens"),
        context_length=f.num(payload, "context_length"),
        num_continuous_decode_steps=f.num(payload, "num_continuous_decode_steps"),
        schedule_policy=labels.enum_value(f.text(payload, "schedule_policy"),
                                          labels.SCHEDULE_POLICIES),
        kv_cache_dtype=labels.enum_value(f.text(payload, "kv_cache_dtype"),
                                         labels.KV_CACHE_DTYPES),
        speculative_algorithm=labels.enum_value(spec, labels.SPECULATIVE_ALGORITHMS),
        mixed_chunk=f.flag(payload, "enable_mixed_chunk"),
        disaggregation_mode=labels.enum_value(f.text(payload, "disaggregation_mode"),
                                              labels.DISAGGREGATION_MODES),
        bad_fields=f.names,
    )


def parse_models(payload: Any) -> Models:
    """/v1/models: the effective context length is the base model's max_model_len."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise PayloadError("not an OpenAI model list")
    f = _Fields()
    context = None
    for card in f.objects(payload["data"], "data"):
        # LoRA adapters have a parent and max_model_len null; the base model has neither.
        if not card.get("parent"):
            value = f.num(card, "max_model_len", "data[].max_model_len")
            if value is not None and context is None:
                context = value
    return Models(context, f.names)


def parse_models_context_length(payload: Any) -> float | None:
    """Effective context length: the base model's max_model_len in /v1/models."""
    return parse_models(payload).context_length
