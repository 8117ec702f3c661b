"""Scheduler events the model emits; simulator.logs turns them into SGLang log lines.

Times are Unix seconds (float). `dp_rank` is None when the server runs without DP.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillBatch:
    ts: float
    dp_rank: int | None
    new_seq: int
    new_token: int
    cached_token: int
    token_usage: float
    running_req: int
    queue_req: int
    pending_token: int
    input_throughput: float  # tokens/s
    cuda_graph: bool = False


@dataclass(frozen=True)
class DecodeBatch:
    ts: float
    dp_rank: int | None
    running_req: int
    num_token: int  # tokens held by the running batch ("#token", the seed's "full-token")
    token_usage: float
    gen_throughput: float  # tokens/s of the whole batch
    queue_req: int
    accept_len: float | None = None  # speculative decoding only
    accept_rate: float | None = None
    cuda_graph: bool = True


@dataclass(frozen=True)
class Retraction:
    ts: float
    dp_rank: int | None
    retracted_reqs: int
    new_tokens_gained: int
    new_token_ratio_before: float
    new_token_ratio_after: float


@dataclass(frozen=True)
class StartupCapacity:
    ts: float
    max_total_num_tokens: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    context_len: int
    available_gpu_mem_gb: float


@dataclass(frozen=True)
class Ready:
    ts: float


@dataclass(frozen=True)
class HealthCheckFailed:
    ts: float
    seconds: float
    tic: float
    last_heartbeat: float


Event = PrefillBatch | DecodeBatch | Retraction | StartupCapacity | Ready | HealthCheckFailed
