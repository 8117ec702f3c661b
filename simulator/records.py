"""The per-request records a release writes with `--export-metrics-to-file`, for simulated
requests: `{"request_parameters": "<JSON string>", **meta_info}`, one line per finished request,
in hourly files `sglang-request-metrics-YYYYMMDD_HH.log` (local time).

The fields and their order follow the tokenizer manager of each release family
(docs/request-records.md; simulator/profiles.py `request_records`), as with --enable-metrics
(the timing fields need it). `request_parameters` holds a fake prompt with PROMPT_MARKER in it,
so every reader of these files is tested for never letting prompt text through.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import IO

from sglang_obs.simulator.model import Request, ServerConfig, verify_count
from sglang_obs.simulator.profiles import Profile

PROMPT_MARKER = "SIM-PROMPT-MARKER-4b1d"
FILE_PATTERN = "sglang-request-metrics-{hour}.log"
EOS_TOKEN = 151645  # Qwen's <|im_end|>: what finish_reason.matched holds for a stop
SAMPLING = {"temperature": 0.7, "top_p": 0.95}
# Small fixed parts of a request's path the model does not simulate (seconds).
DISPATCH_SECONDS = 0.002  # tokenizer to scheduler
LAUNCH_SECONDS = 0.004  # prefill batch launch
RESPONSE_SECONDS = 0.001  # last chunk out to the client


def request_id(seed: int, rid: int) -> str:
    """A uuid4-like hex id (SGLang's default rid), the same for the same scenario request."""
    return hashlib.sha256(f"{seed}:{rid}".encode()).hexdigest()[:32]


def request_parameters(req: Request, rid: str) -> str:
    """GenerateReqInput's fields that are not None, JSON-encoded, as SGLang writes them (no
    --log-requests: nothing is skipped, the prompt text included)."""
    text = (f"{PROMPT_MARKER} Here is the conversation so far, {req.input_len} tokens of it; "
            "summarise it and answer the last question.")
    return json.dumps({
        "text": text,
        "sampling_params": {"max_new_tokens": req.max_new_tokens, **SAMPLING},
        "rid": rid,
        "return_logprob": False,
        "logprob_start_len": -1,
        "top_logprobs_num": 0,
        "return_text_in_logprobs": False,
        "stream": req.streaming,
        "log_metrics": True,
        "return_hidden_states": False,
        "modalities": [],
    })


def record(req: Request, finished: float, start_ts: float, profile: Profile,
           cfg: ServerConfig, seed: int = 0) -> dict | None:
    """The record of `req` finished at simulated time `finished`; None if the release has no
    request records. Dict order is the order SGLang writes the fields in."""
    family = profile.request_records
    if family is None:
        return None
    unix = start_ts  # simulated seconds are since the scenario's start
    rid = request_id(seed, req.rid)
    out = int(req.generated)
    received = unix + req.arrival
    scheduled = unix + (req.scheduled_at if req.scheduled_at is not None else req.arrival)
    first = unix + (req.first_token_at if req.first_token_at is not None else finished)
    done = unix + finished
    e2e = done - received
    queue = max(scheduled - received - DISPATCH_SECONDS, 0.0)
    if out >= req.max_new_tokens:
        reason = {"type": "length", "length": req.max_new_tokens}
    else:
        reason = {"type": "stop", "matched": EOS_TOKEN}
    rec: dict = {"request_parameters": request_parameters(req, rid), "id": rid,
                 "finish_reason": reason,
                 "prompt_tokens": req.input_len, "weight_version": "default"}
    # 0.5.12 (conformance golden) and later name it num_retractions; 0.5.6-0.5.9 wrote
    # total_retractions.
    retractions = "num_retractions" if profile.at_least("0.5.12") else "total_retractions"
    rec[retractions] = req.retracted
    decode = max(done - first, 1e-9)
    # Speculative decoding: each verify step yields one token beyond the drafts it accepted,
    # and proposes num_draft_tokens - 1 drafts.
    steps = max(verify_count(req, cfg), 1)
    proposed, correct = steps * max(cfg.speculative_num_draft_tokens - 1, 1), max(out - steps, 0)
    if family == "0.5.6":
        spec = {}
        if cfg.speculative_algorithm:
            spec = {"spec_accept_rate": correct / proposed, "spec_accept_length": out / steps,
                    "spec_verify_ct": steps, "spec_accept_token_num": correct,
                    "spec_draft_token_num": proposed}
        rec |= {"queue_time": queue, "prefill_launch_delay": LAUNCH_SECONDS / 2,
                "prefill_launch_latency": LAUNCH_SECONDS,
                "completion_tokens": out, "cached_tokens": req.cached_len,
                **spec, "e2e_latency": e2e,
                "request_received_ts": received,
                "request_sent_to_scheduler_ts": received + DISPATCH_SECONDS,
                "prefill_finished_ts": first,
                "response_sent_to_client_ts": done + RESPONSE_SECONDS,
                "decode_finished_ts": done,
                "inference_time": done - scheduled,
                "decode_throughput": out / decode}
        return rec
    # The keys and their order of conformance/goldens/<release>/*/request_records.log: the
    # tokenizer's own fields, the scheduler's time stats, the counts, the speculative
    # decoding figures, then the API server's time stats.
    rec |= {"forward_entry_time": scheduled, "prefill_finished_time": first,
            "queue_time": queue, "reasoning_tokens": 0, "completion_tokens": out,
            "cached_tokens": req.cached_len, "e2e_latency": e2e}
    if cfg.speculative_algorithm:
        rec |= {"spec_accept_rate": correct / proposed, "spec_accept_length": out / steps,
                "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed,
                "spec_verify_ct": steps}
        if not profile.at_least("0.5.23"):
            rec |= {"spec_accepted_drafts": correct, "spec_proposed_drafts": proposed}
    rec["request_received_ts"] = received
    # 0.5.23 takes a non-streaming request's first token from the scheduler's prefill time;
    # 0.5.12 knows it only for a streaming request (its first output batch).
    knows_first = profile.at_least("0.5.23") or req.streaming
    if profile.at_least("0.5.23"):
        rec["first_token_latency"] = first - received
    rec |= {"api_server_dispatch_finish_ts": received + DISPATCH_SECONDS,
            "request_finished_ts": done}
    if knows_first and out > 1:
        rec["decode_throughput"] = (out - 1) / decode
    rec["response_sent_to_client_ts"] = done + RESPONSE_SECONDS
    return rec


def line(rec: dict) -> str:
    """One record as SGLang writes it: json.dump's default separators, then a newline."""
    return json.dumps(rec) + "\n"


def hour_suffix(ts: float) -> str:
    """The file's hour as SGLang names it: the server's local time."""
    return time.strftime("%Y%m%d_%H", time.localtime(ts))


class RecordFiles:
    """Appends records to the hourly files under `directory`, one open file at a time, flushed
    after every record (as SGLang's FileRequestMetricsExporter does)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        os.makedirs(self.directory, exist_ok=True)
        self._hour: str | None = None
        self._file: IO[str] | None = None
        self.written = 0

    def path_for(self, ts: float) -> Path:
        return self.directory / FILE_PATTERN.format(hour=hour_suffix(ts))

    def write(self, rec: dict) -> None:
        ts = rec.get("request_finished_ts") or rec.get("decode_finished_ts") or time.time()
        hour = hour_suffix(ts)
        if hour != self._hour:
            self.close()
            self._file = open(self.directory / FILE_PATTERN.format(hour=hour), "a",  # noqa: SIM115
                              encoding="utf-8")
            self._hour = hour
        self._file.write(line(rec))
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._hour = None


class RecordSink:
    """The Simulation's `on_request` callback: each finished request's record to `targets`
    (callables taking the record dict), for the release's record family, if it has one."""

    def __init__(self, profile: Profile, cfg: ServerConfig, start_ts: float, seed: int,
                 targets: list):
        self.profile, self.cfg, self.start_ts, self.seed = profile, cfg, start_ts, seed
        self.targets = targets

    def __call__(self, req: Request, finished: float) -> None:
        rec = record(req, finished, self.start_ts, self.profile, self.cfg, self.seed)
        if rec is None:
            return
        for target in self.targets:
            target(rec)
