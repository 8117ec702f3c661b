"""Read SGLang's JSON endpoints: /v1/loads (/get_load before 0.5.8), /server_info, /v1/models.

Each reader takes decoded JSON of any shape and returns a small value object; a field a release
does not have is None. They never raise on odd input: a payload that is not what any release
sends raises PayloadError, which the poller counts as a parse error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PayloadError(ValueError):
    """The JSON does not have the shape of any SGLang release."""


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
    schedule_policy: str = ""
    kv_cache_dtype: str = ""
    speculative_algorithm: str = ""
    mixed_chunk: bool | None = None
    disaggregation_mode: str = ""



def _num(value: Any) -> float | None:
    """A finite number or None; JSON booleans are not numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)


def _text(value: Any) -> str:
    if value is None or isinstance(value, dict | list):
        return ""
    return str(value)[:128]


def _sum(entries: list[dict], *keys: str) -> float | None:
    """Sum the first present key of each entry; None when no entry has any of them."""
    total, seen = 0.0, False
    for entry in entries:
        for key in keys:
            value = _num(entry.get(key))
            if value is not None:
                total += value
                seen = True
                break
    return total if seen else None


def parse_loads(payload: Any) -> Load:
    """/v1/loads (0.5.8+) or /get_load (0.4.7+, three shapes)."""
    if isinstance(payload, dict) and isinstance(payload.get("loads"), list):
        entries = payload["loads"]
    elif isinstance(payload, list):
        entries = payload
    elif isinstance(payload, dict) and "load" in payload:
        # 0.4.7-0.5.2: {"load": running + waiting}; nothing that separates the two.
        if _num(payload["load"]) is None:
            raise PayloadError("get_load: 'load' is not a number")
        return Load()
    else:
        raise PayloadError("not a loads payload")
    entries = [e for e in entries if isinstance(e, dict)]
    if not entries:
        raise PayloadError("loads payload has no per-rank entries")
    running = _sum(entries, "num_running_reqs")
    waiting = _sum(entries, "num_waiting_reqs")
    if running is None and waiting is not None:
        # 0.5.3-0.5.10 /get_load: num_reqs = running + waiting
        reqs = _sum(entries, "num_reqs")
        running = None if reqs is None else max(reqs - waiting, 0.0)
    return Load(
        running=running,
        waiting=waiting,
        prefill_backlog_tokens=_sum(entries, "num_waiting_uncached_tokens", "num_pending_tokens"),
        used_tokens=_sum(entries, "num_used_tokens"),
        capacity_tokens=_sum(entries, "max_total_num_tokens"),
        max_running_requests=_sum(entries, "max_running_requests"),
        gen_throughput=_sum(entries, "gen_throughput"),
    )


def parse_server_info(payload: Any) -> ServerConfig:
    """/server_info (0.5.6+) or /get_server_info (every release)."""
    if not isinstance(payload, dict) or not (
        "version" in payload or "internal_states" in payload or "tp_size" in payload
    ):
        raise PayloadError("not a server_info payload")
    states = [s for s in payload.get("internal_states") or [] if isinstance(s, dict)]
    dp_size = _int(payload.get("dp_size"))
    ranks = max(dp_size or 1, 1)

    max_running = _sum(states, "effective_max_running_requests_per_dp")
    if max_running is None and _num(payload.get("max_running_requests")) is not None:
        # Before 0.5.8 only the CLI value exists (often null); it is per DP rank.
        max_running = _num(payload["max_running_requests"]) * ranks

    capacity = _sum([s.get("memory_usage") or {} for s in states], "token_capacity")
    if capacity is None and _num(payload.get("max_total_num_tokens")) is not None:
        # The handshake value is one scheduler's pool; every DP rank has its own.
        capacity = _num(payload["max_total_num_tokens"]) * ranks

    spec = _text(payload.get("speculative_algorithm"))
    mixed = payload.get("enable_mixed_chunk")
    return ServerConfig(
        version=_text(payload.get("version")),
        model_name=_text(payload.get("served_model_name") or payload.get("model_path")),
        tp_size=_int(payload.get("tp_size")),
        dp_size=dp_size,
        pp_size=_int(payload.get("pp_size")),
        max_running_requests=max_running,
        max_total_num_tokens=capacity,
        chunked_prefill_size=_num(payload.get("chunked_prefill_size")),
        max_prefill_tokens=_num(payload.get("max_prefill_tokens")),
        context_length=_num(payload.get("context_length")),
        schedule_policy=_text(payload.get("schedule_policy")),
        kv_cache_dtype=_text(payload.get("kv_cache_dtype")),
        speculative_algorithm="" if spec.lower() in ("", "none", "null") else spec,
        mixed_chunk=mixed if isinstance(mixed, bool) else None,
        disaggregation_mode=_text(payload.get("disaggregation_mode")),
    )


def parse_models_context_length(payload: Any) -> float | None:
    """Effective context length: the base model's max_model_len in /v1/models."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise PayloadError("not an OpenAI model list")
    for card in payload["data"]:
        # LoRA adapters have a parent and max_model_len null; the base model has neither.
        if isinstance(card, dict) and not card.get("parent"):
            value = _num(card.get("max_model_len"))
            if value is not None:
                return value
    return None


def _int(value: Any) -> int | None:
    number = _num(value)
    return None if number is None else int(number)
