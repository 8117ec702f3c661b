"""A scheduler model of one SGLang server: continuous batching with chunked prefill.

Not a random number generator: requests arrive, wait, are prefilled in chunks under the token
budgets, decode in a batch whose step time grows with batch size and KV tokens, and are retracted
when the KV pool runs out. Stats are *reported* on SGLang's cadence (every prefill batch, every
`decode_log_interval` decode iterations, an idle refresh every 30 s), so gauges lag the way real
ones do. docs/simulator.md describes the model and every parameter.

The model is deterministic for a given arrival list. Time is simulated seconds since start.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_obs.simulator.events import (
    DecodeBatch,
    PrefillBatch,
    Ready,
    Retraction,
    StartupCapacity,
)
from sglang_obs.simulator.grammar import GrammarQueue
from sglang_obs.simulator.hicache import HostTier

IDLE_REFRESH_SECONDS = 30.0
CLIP_MAX_NEW_TOKENS = 4096  # SGLang caps the per-request decode reservation at this
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
REQUEST_PROCESS_SECONDS = 0.0015  # scheduler intake of one request (per_stage request_process)


@dataclass(frozen=True)
class ServerConfig:
    """The effective configuration of the simulated server (what /server_info reports)."""

    model_name: str = "qwen3-27b"
    model_path: str = "Qwen/Qwen3-27B"
    tp_size: int = 4
    dp_size: int = 1
    enable_dp_attention: bool = False
    max_total_num_tokens: int = 400_000  # KV pool of one DP rank
    context_length: int = 262_144
    chunked_prefill_size: int = 4096
    max_prefill_tokens: int = 16_384
    max_running_requests: int = 44  # per DP rank
    schedule_policy: str = "fcfs"  # fcfs | lpm
    kv_cache_dtype: str = "fp8_e4m3"
    speculative_algorithm: str | None = None
    spec_accept_length: float = 1.0  # tokens per decode step per request (1: no speculation)
    # --speculative-num-steps / --speculative-num-draft-tokens (EAGLE chain: steps + 1 drafts
    # verified per step, so at most steps + 1 tokens a step)
    speculative_num_steps: int = 3
    speculative_num_draft_tokens: int = 4
    # The --speculative-num-steps that spec_accept_length (and the requests' accept lengths)
    # were measured at, when it differs from speculative_num_steps (what-if: other steps).
    spec_accept_steps: int | None = None
    # HiCache (simulator/hicache.py): a host-memory tier behind the device radix cache
    # (--enable-hierarchical-cache, --hicache-ratio: host pool over the device pool,
    # --hicache-write-policy: write_through, SGLang's default, or write_back).
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_write_policy: str = "write_through"
    # LoRA (--enable-lora, --max-loras-per-batch): a request names its adapter, and the
    # running batch holds at most this many distinct adapters.
    enable_lora: bool = False
    max_loras_per_batch: int = 8
    # Priority scheduling (--enable-priority-scheduling): the waiting queue is ordered by each
    # request's priority, larger values first unless --schedule-low-priority-values-first, then
    # by arrival. (Preemption of running requests by higher priorities is not modelled.)
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    # Structured output (simulator/grammar.py): --grammar-backend, and SGLANG_GRAMMAR_TIMEOUT.
    grammar_backend: str = "xgrammar"
    grammar_timeout_s: float = 300.0
    enable_mixed_chunk: bool = False
    num_continuous_decode_steps: int = 1
    decode_log_interval: int = 40
    page_size: int = 1
    gpu_name: str = "NVIDIA L20"
    gpu_memory_total_gb: float = 46.0
    mem_fraction_static: float = 0.8
    weight_memory_gb: float = 14.0  # per GPU
    kv_cache_memory_gb: float = 18.5  # per GPU

    @property
    def effective_mixed_chunk(self) -> bool:
        # Speculative decoding silently turns mixed chunked prefill off (seed 000).
        return self.enable_mixed_chunk and not self.speculative_algorithm


@dataclass(frozen=True)
class PerfModel:
    """Forward-pass timings. Decode is memory-bandwidth bound: weights once per step plus the KV
    of every running token; prefill is compute bound: per new token plus attention over the
    context it sits in."""

    prefill_overhead_s: float = 0.030
    prefill_s_per_token: float = 1.4e-4
    prefill_s_per_token_context: float = 1.5e-9  # x new tokens x context position
    prefill_small_batch_tokens: float = 1024.0  # small batches use the GPU less efficiently
    # Decode rounds are interleaved after this many consecutive prefill batches while requests
    # are running (large values: decode starves behind a long chunked prefill).
    prefill_batches_before_decode: int = 1
    decode_overhead_s: float = 0.025
    decode_s_per_request: float = 8.0e-4
    decode_s_per_kv_token: float = 3.0e-8
    # Speculative decoding: one draft step (the draft model's forward pass, and its token in
    # the wider verify) as a share of a plain decode step's time. A step of k drafts costs
    # 1 + k x this, so speculation pays while the accept length exceeds that.
    spec_draft_step_ratio: float = 0.0
    # HiCache: loading a host-tier prefix back to the device (host-to-device copy, in the
    # prefill), and the device-to-host copy engine's throughput for backups.
    hicache_load_s_per_token: float = 1.5e-6
    hicache_backup_tokens_per_s: float = 200_000.0
    # Structured output: the grammar backend's compilation threads (a default Python thread
    # pool: min(32, CPUs + 4)); each request's compile time is drawn by the scenario.
    grammar_compile_workers: int = 8


@dataclass
class Request:
    rid: int
    arrival: float
    input_len: int
    cached_fraction: float
    output_len: int
    max_new_tokens: int = 8192
    streaming: bool = True
    # Speculative decoding: the tokens one decode step yields for this request (how well the
    # draft model predicts its text); None: the server's spec_accept_length.
    accept_length: float | None = None
    # The reusable prefix tokens its prefix is drawn from (None: any cached prefix will do).
    working_set: float | None = None
    lora_id: int | None = None  # its LoRA adapter (None: the base model)
    # Structured output: its grammar's cache key (None: no json_schema/regex/ebnf) and what
    # compiling it takes on a cache miss.
    priority: int | None = None  # with priority scheduling
    grammar_key: object = None
    grammar_compile_s: float = 0.0
    # progress
    cached_len: int = 0  # prefix hit, fixed when first scheduled
    host_cached_len: int = 0  # the part of it loaded back from HiCache's host tier
    prefilled: int = 0  # prompt tokens in KV (cached + computed)
    generated: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    retracted: int = 0
    recomputed: int = 0  # output tokens to prefill again after a retraction
    # Prefill/decode disaggregation (simulator/pd.py); all off for a unified server.
    # kv_ready: a decode server's request, its prompt KV preallocated (Scheduler.held_tokens)
    # and transferred in: admission moves it into the batch, nothing is prefilled.
    kv_ready: bool = False
    # When the server's tokenizer received it, if before `arrival` (the waiting-queue entry):
    # TTFT and end-to-end latency count from here.
    received: float | None = None
    # A prefill server's request: called instead of the tokenizer's finish when its prefill is
    # done; its KV stays held (Scheduler.held_tokens) until the deployment has sent it.
    on_done: Callable[[Request, float], None] | None = None

    @property
    def start(self) -> float:
        return self.arrival if self.received is None else self.received

    @property
    def prompt_len(self) -> int:
        return self.input_len + self.recomputed

    @property
    def kv_tokens(self) -> int:
        # After a retraction the first `recomputed` output tokens are part of the prompt.
        return self.prefilled + int(self.generated) - self.recomputed

    def reserve(self, ratio: float) -> float:
        remaining = max(min(self.max_new_tokens, CLIP_MAX_NEW_TOKENS) - self.generated, 0)
        return remaining * ratio


def accept_length(req: Request, cfg: ServerConfig) -> float:
    """Tokens one decode step yields for `req` (1 without speculative decoding), at the
    server's --speculative-num-steps (rescaled when the lengths were given at other steps)."""
    length = (req.accept_length if cfg.speculative_algorithm and req.accept_length is not None
              else cfg.spec_accept_length)
    measured = cfg.spec_accept_steps or cfg.speculative_num_steps
    if cfg.speculative_algorithm and measured != cfg.speculative_num_steps:
        return accept_length_at(length, measured, cfg.speculative_num_steps)
    return length


@functools.lru_cache(maxsize=4096)
def accept_length_at(length: float, steps: int, other: int) -> float:
    """The accept length at `other` draft steps of a chain (EAGLE with topk 1) that yields
    `length` tokens per verify at `steps`. Each draft token is accepted with the same chance a
    once the ones before it were: a step of k drafts yields (1 - a^(k+1)) / (1 - a) tokens,
    accepted drafts plus the bonus token; a is found from `length` by bisection."""
    def tokens(a: float, k: int) -> float:
        return k + 1.0 if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
    length = min(max(length, 1.0), steps + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens(mid, steps) < length else (lo, mid)
    return tokens((lo + hi) / 2, other)


def spec_accept_rate(length: float, cfg: ServerConfig) -> float:
    """Correct drafts / proposed drafts: each verify proposes num_draft_tokens - 1 drafts and
    accepts length - 1 of them (the last token is the bonus)."""
    if not length:
        return 0.0
    return (length - 1) / max(cfg.speculative_num_draft_tokens - 1, 1)


def verify_count(req: Request, cfg: ServerConfig) -> int:
    """Verify steps of a finished request under speculative decoding (0 without): one per
    decode step, each yielding the accepted drafts plus the bonus token. The request record's
    spec_verify_ct and sglang:spec_verify_calls_total both count these."""
    if not cfg.speculative_algorithm:
        return 0
    return max(int(int(req.generated) / max(accept_length(req, cfg), 1.0)), 1)


class Histogram:
    """Cumulative-on-render histogram with SGLang's buckets; `observe(value, weight)`."""

    def __init__(self, bounds):
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0.0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0.0

    def observe(self, value: float, weight: float = 1.0, total: float | None = None) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.sum += value * weight if total is None else total
        self.count += weight

    @staticmethod
    def merged(histograms: list[Histogram]) -> Histogram | None:
        """The sum of same-bucket histograms (e.g. the is_streaming split); None if all empty."""
        histograms = [h for h in histograms if h.count]
        if not histograms:
            return None
        out = Histogram(histograms[0].bounds)
        for h in histograms:
            out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
            out.sum += h.sum
            out.count += h.count
        return out

    def cumulative(self) -> list[tuple[float, float]]:
        out, running = [], 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


@dataclass
class TokenizerStats:
    """Per-request metrics of the tokenizer process (no rank labels), split by is_streaming."""

    make_histogram: Callable[[str], Histogram]
    # keyed by split(): (is_streaming, priority)
    prompt_tokens: dict[tuple[bool, str], float] = field(default_factory=dict)
    generation_tokens: dict[tuple[bool, str], float] = field(default_factory=dict)
    requests: dict[tuple[bool, str], float] = field(default_factory=dict)
    cached_tokens: float = 0.0
    cached_host_tokens: float = 0.0  # of which loaded back from HiCache's host tier
    aborted: float = 0.0
    so_requests: float = 0.0  # finished requests with a grammar (num_so_requests_total)
    spec_verify_calls: float = 0.0  # lazy family: from the first request with a verify
    cfg: ServerConfig | None = None
    histograms: dict[tuple[str, tuple[bool, str]], Histogram] = field(default_factory=dict)
    touched: bool = False  # lazy families: nothing exposed before the first request
    # Called with (request, finish time) for every finished request: the request records.
    on_finished: Callable[[Request, float], None] | None = None

    def histogram(self, name: str, split: tuple[bool, str] = (False, "")) -> Histogram:
        key = (name, split)
        if key not in self.histograms:
            self.histograms[key] = self.make_histogram(name)
        return self.histograms[key]

    def split(self, req: Request) -> tuple[bool, str]:
        """The request's own label values: is_streaming, and with priority scheduling its
        priority ("" when it has none)."""
        prio = (str(req.priority) if self.cfg is not None and self.cfg.enable_priority_scheduling
                and req.priority is not None else "")
        return req.streaming, prio

    def first_token(self, req: Request, now: float) -> None:
        self.touched = True
        self.histogram("ttft", self.split(req)).observe(now - req.start)

    def finished(self, req: Request, now: float) -> None:
        self.touched = True
        s = self.split(req)
        out = int(req.generated)
        self.prompt_tokens[s] = self.prompt_tokens.get(s, 0) + req.input_len
        self.generation_tokens[s] = self.generation_tokens.get(s, 0) + out
        self.requests[s] = self.requests.get(s, 0) + 1
        self.cached_tokens += req.cached_len
        self.cached_host_tokens += req.host_cached_len
        if req.grammar_key is not None:
            self.so_requests += 1
        if self.cfg is not None:
            self.spec_verify_calls += verify_count(req, self.cfg)
        self.histogram("e2e", s).observe(now - req.start)
        self.histogram("prompt_tokens", s).observe(req.input_len)
        self.histogram("generation_tokens", s).observe(out)
        self.histogram("uncached_prompt_tokens", s).observe(req.input_len - req.cached_len)
        if out > 1 and req.first_token_at is not None:
            self.histogram("request_tpot", s).observe((now - req.first_token_at) / (out - 1))
        if self.on_finished is not None:
            self.on_finished(req, now)


@dataclass
class Reported:
    """Gauge values as last reported by the scheduler (what /metrics shows between reports)."""

    running: int = 0
    queue: int = 0
    used_tokens: int = 0
    evictable_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0
    spec_accept_length: float = 0.0
    new_token_ratio: float = INIT_NEW_TOKEN_RATIO
    retracted_since_last: int = 0
    decode_sum_seq_lens: int = 0
    host_used_tokens: float = 0.0  # HiCache host pool
    lora_slots_used: int = 0  # distinct LoRA adapters in the running batch
    grammar_queue: int = 0  # requests waiting for their grammar to compile
    # With priority scheduling: gauge name -> priority -> requests, every priority seen so far.
    by_priority: dict[str, dict[int, int]] = field(default_factory=dict)


class Scheduler:
    """One DP rank's scheduler: waiting queue, at most one chunked request, running batch."""

    def __init__(self, cfg: ServerConfig, perf: PerfModel, dp_rank: int | None,
                 tokenizer: TokenizerStats, make_histogram: Callable[[str], Histogram],
                 zero_cache_hit_on_decode: bool, emit: Callable[[object], None],
                 warm_cache_tokens: int = 0):
        self.cfg, self.perf, self.dp_rank = cfg, perf, dp_rank
        self.tokenizer = tokenizer
        self.emit = emit
        self.zero_cache_hit_on_decode = zero_cache_hit_on_decode
        self.now = 0.0
        self.speed = 1.0  # < 1 while the GPU is throttled
        self.waiting: list[Request] = []
        self.chunked: Request | None = None
        self.running: list[Request] = []
        # Radix-cache tokens of finished requests: free on demand, reused on a prefix hit.
        self.evictable = min(warm_cache_tokens, cfg.max_total_num_tokens)
        self.host: HostTier | None = None
        if cfg.enable_hierarchical_cache:
            self.host = HostTier(total=cfg.hicache_ratio * cfg.max_total_num_tokens,
                                 backup_tokens_per_s=perf.hicache_backup_tokens_per_s,
                                 write_back=cfg.hicache_write_policy == "write_back")
            self.host.warm(self.evictable)
        # KV held outside the batch (simulator/pd.py): a prefill server's prompts being sent, a
        # decode server's preallocations. 0 on a unified server.
        self.held_tokens = 0
        self.grammar = GrammarQueue(workers=perf.grammar_compile_workers,
                                    timeout_s=cfg.grammar_timeout_s)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.reported = Reported()
        self.has_reported = False  # scheduler gauges are lazy: absent before the first report
        self.last_report_at = 0.0
        self.decode_iters_since_report = 0
        self.decode_tokens_since_report = 0.0
        self.verifies_since_report = 0  # request-verifies (speculative decoding)
        self.last_decode_report_at = 0.0
        self.retracted_since_report = 0
        self.busy_seconds = 0.0  # forward-pass time, for GPU utilisation
        self.prefills_in_a_row = 0
        self.queue_time = make_histogram("queue_time")
        self.per_stage = {s: make_histogram("per_stage") for s in (
            "request_process", "prefill_forward", "chunked_prefill")}
        self.counters = {
            "realtime_prefill_compute": 0.0, "realtime_prefill_cache": 0.0,
            "realtime_decode": 0.0, "retracted_requests": 0.0, "retracted_input_tokens": 0.0,
            "retracted_output_tokens": 0.0, "idle_seconds": 0.0, "prefill_input": 0.0,
            "prefill_device_hit": 0.0, "prefill_host_hit": 0.0, "evicted": 0.0,
        }
        self.retracted_ever = False

    # -- pool -----------------------------------------------------------------------------
    @property
    def used_tokens(self) -> int:
        held = sum(r.kv_tokens for r in self.running) + self.held_tokens
        return held + (self.chunked.kv_tokens if self.chunked else 0)

    @property
    def free_tokens(self) -> int:
        return self.cfg.max_total_num_tokens - self.used_tokens  # evictable counts as free

    @property
    def pending_tokens(self) -> int:
        """Prompt tokens not yet prefilled: waiting requests plus the chunked remainder."""
        pending = sum(r.prompt_len - r.prefilled for r in self.waiting)
        return pending + (self.chunked.prompt_len - self.chunked.prefilled if self.chunked else 0)

    @property
    def waiting_uncached_tokens(self) -> int:
        return self.pending_tokens

    def _allocate(self, tokens: int, used: int | None = None) -> None:
        """Take tokens from the free pool, evicting radix-cache tokens when needed (`used`:
        used_tokens, when the caller has it)."""
        used = self.used_tokens if used is None else used
        free_unevictable = self.cfg.max_total_num_tokens - used - self.evictable
        if tokens > free_unevictable:
            self._evict(tokens - free_unevictable, used)

    def _evict(self, tokens: int, used: int | None = None) -> None:
        """Free up to `tokens` radix-cache tokens (`used`: used_tokens, when the caller has
        it); HiCache's host tier keeps what was copied to it."""
        tokens = min(max(tokens, 0), self.evictable)
        if not tokens:
            return
        used = self.used_tokens if used is None else used
        if self.host is not None:
            self.host.evict(tokens, resident=used + self.evictable)
        self.evictable -= tokens
        self.counters["evicted"] += tokens

    def trim_cache(self) -> None:
        """Evict what no longer fits beside the tokens in use."""
        used = self.used_tokens
        self._evict(self.evictable - (self.cfg.max_total_num_tokens - used), used)

    # -- main loop ------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        # Scheduler intake (receive to waiting queue): a constant, not modelled further.
        self.per_stage["request_process"].observe(REQUEST_PROCESS_SECONDS)
        if req.grammar_key is not None:
            outcome = self.grammar.submit(req, req.grammar_key, req.grammar_compile_s, self.now)
            if outcome == "invalid":
                self.tokenizer.aborted += 1  # a cached failure: aborted at once
                return
            if outcome == "queued":
                return  # joins the waiting queue when its grammar is ready (_grammar_ready)
        self.waiting.append(req)

    def _grammar_ready(self) -> None:
        """Move the requests whose grammar is ready to the waiting queue, in order; their queue
        time starts there, while TTFT counts from receipt."""
        ready, timed_out = self.grammar.poll(self.now)
        for req in ready:
            if req.received is None:
                req.received = req.arrival
            req.arrival = self.now
            self.waiting.append(req)
        self.tokenizer.aborted += len(timed_out)

    def busy(self) -> bool:
        return bool(self.waiting or self.chunked or self.running)

    def step(self, until: float) -> None:
        """Run one scheduler iteration, or idle until `until` when there is nothing to do."""
        if self.now - self.last_report_at >= IDLE_REFRESH_SECONDS and not self.running:
            self._report(idle=True)
        if self.grammar.queue:
            self._grammar_ready()
        starving = (self.running and self.prefills_in_a_row >=
                    self.perf.prefill_batches_before_decode)
        batch = None if starving else self._form_prefill_batch()
        if batch is not None:
            self.prefills_in_a_row += 1
            self._run_prefill(batch)
        elif self.running:
            self.prefills_in_a_row = 0
            for _ in range(self.cfg.num_continuous_decode_steps):
                if self.running:
                    self._run_decode()
        else:
            idle_until = min(until, self.last_report_at + IDLE_REFRESH_SECONDS)
            wake = self.grammar.next_event()  # a grammar becomes ready (or times out)
            if wake is not None:
                idle_until = min(idle_until, wake)
            idle_until = max(idle_until, self.now)
            self.counters["idle_seconds"] += idle_until - self.now
            if self.host is not None:
                self.host.drain(max(idle_until, self.now) - self.now)
            self.now = idle_until if idle_until > self.now else until

    def _pick(self) -> Request:
        if self.cfg.enable_priority_scheduling:  # by priority, then first come first served
            sign = 1 if self.cfg.schedule_low_priority_values_first else -1
            return min(self.waiting, key=lambda r: (sign * (r.priority or 0), r.arrival))
        if self.cfg.schedule_policy == "lpm":  # longest cached prefix first
            return max(self.waiting, key=lambda r: r.input_len * r.cached_fraction)
        return self.waiting[0]

    def adapters(self) -> set[int]:
        """The LoRA adapters of the running batch (and the chunked request)."""
        held = self.running + ([self.chunked] if self.chunked else [])
        return {r.lora_id for r in held if r.lora_id is not None}

    @staticmethod
    def _lookup(prefix: int, working_set: float | None, device: float,
                host: float) -> tuple[int, int]:
        """(device hit, host hit) of a `prefix` drawn from a `working_set` of reusable tokens
        while the device cache holds `device` tokens and the host tier `host` more; without a
        working set any cached tokens will do."""
        if working_set is None:
            on_device = min(prefix, device)
            return int(on_device), int(min(prefix - on_device, host))
        on_device = min(prefix * min(device / working_set, 1.0), device)
        rest = max(working_set - device, 1.0)
        in_host = min((prefix - on_device) * min(host / rest, 1.0), host)
        return int(on_device), int(in_host)

    def _form_prefill_batch(self):
        if not self.waiting and self.chunked is None:
            return None  # nothing to prefill (spares the pool sums below)
        cfg = self.cfg
        chunk_budget = cfg.chunked_prefill_size if cfg.chunked_prefill_size > 0 else math.inf
        input_budget = cfg.max_prefill_tokens
        # (request, new tokens, newly cached tokens, of which loaded back from the host tier)
        parts: list[tuple[Request, int, int, int]] = []
        if self.chunked is not None:
            req = self.chunked
            take = int(min(req.prompt_len - req.prefilled, chunk_budget))
            parts.append((req, take, 0, 0))
            chunk_budget -= take
            input_budget -= take
        # KV check as SGLang's prefill adder does it: free (incl. evictable) tokens minus the
        # decode reservation of every admitted request, minus the chunked request's remainder.
        holders = self.running + ([self.chunked] if self.chunked else [])
        reserved = sum(r.reserve(self.new_token_ratio) for r in holders)
        chunk_rest = self.chunked.prompt_len - self.chunked.prefilled if self.chunked else 0
        room = self.free_tokens - reserved - chunk_rest
        admitted = len(self.running) + (1 if self.chunked else 0)
        adapters = self.adapters() if cfg.enable_lora else set()
        cache_left = self.evictable  # prefixes found in the radix cache are reused from it
        host_left = self.host.only if self.host is not None else 0.0  # then in the host tier
        while self.waiting and admitted < cfg.max_running_requests and chunk_budget > 0:
            req = self._pick()
            if req.kv_ready and req.scheduled_at is None:
                # PD decode: its KV was allocated (and checked) at preallocation and has
                # arrived; admission moves it from the held tokens into the batch.
                self.waiting.remove(req)
                req.scheduled_at = self.now
                self.queue_time.observe(self.now - req.arrival)
                self.held_tokens -= req.prompt_len
                parts.append((req, 0, 0, 0))
                admitted += 1
                continue
            if req.lora_id is not None and req.lora_id not in adapters:
                if len(adapters) >= cfg.max_loras_per_batch:
                    break  # as SGLang: the batch is full for its adapter, and the queue waits
                adapters.add(req.lora_id)
            host_hit = 0
            if req.scheduled_at is not None:
                cached = req.cached_len
            else:  # a prefix hit needs the prefix to still be in the cache
                prefix = int(req.input_len * req.cached_fraction)
                cached, host_hit = self._lookup(prefix, req.working_set, cache_left, host_left)
                cached += host_hit
            uncached = req.prompt_len - max(req.prefilled, cached)
            # The reused prefix is locked out of the evictable pool, so it needs room too.
            need = req.prompt_len - req.prefilled + req.reserve(self.new_token_ratio)
            if need > room:  # not enough KV for its prompt plus its decode reservation
                break
            if uncached > input_budget and parts:
                break
            take = int(min(uncached, chunk_budget))
            if take <= 0 and uncached > 0:
                break
            self.waiting.remove(req)
            if req.scheduled_at is None:
                req.scheduled_at = self.now
                req.cached_len = cached
                req.host_cached_len = host_hit
                self.queue_time.observe(self.now - req.arrival)
            newly_cached = max(cached - req.prefilled, 0)
            cache_left -= newly_cached - host_hit
            host_left -= host_hit
            req.prefilled = max(req.prefilled, cached)
            parts.append((req, take, newly_cached, host_hit))
            admitted += 1
            room -= need
            chunk_budget -= take
            input_budget -= take
            if req.prefilled + take < req.prompt_len:
                break  # this request is now the chunked one; the batch is full
        if not parts:
            return None
        return parts

    def _run_prefill(self, parts) -> None:
        perf = self.perf
        new_tokens = sum(take for _, take, _, _ in parts)
        cached_tokens = sum(newly for _, _, newly, _ in parts)
        host_tokens = sum(host for _, _, _, host in parts)
        # Per-token cost falls with batch size (better utilisation); attention grows with
        # the context each new token sits in.
        per_token = perf.prefill_s_per_token * (1 + perf.prefill_small_batch_tokens /
                                                max(new_tokens, 1))
        seconds = perf.prefill_overhead_s + sum(
            take * (per_token + perf.prefill_s_per_token_context * (req.prefilled + take / 2))
            for req, take, _, _ in parts)
        if self.host is not None and host_tokens:  # host-to-device loads before the forward
            seconds += self.host.load_back(host_tokens, perf.hicache_load_s_per_token)[1]
        seconds /= self.speed
        # Reused prefixes move from the evictable cache into the running requests; prefixes
        # loaded back from the host tier take device room like computed tokens.
        self.evictable = max(self.evictable - (cached_tokens - host_tokens), 0)
        for _req, take, _, _ in parts:
            self._allocate(take)
        if host_tokens:
            self._allocate(host_tokens)
        if self.host is not None:
            self.host.insert(new_tokens)
            self.host.drain(seconds)
        self.now += seconds
        self.busy_seconds += seconds
        self.chunked = None
        for req, take, _, _ in parts:
            req.prefilled += take
            if req.prefilled < req.prompt_len:
                self.chunked = req
                self.per_stage["chunked_prefill"].observe(seconds)
                continue
            self.per_stage["prefill_forward"].observe(self.now - (req.scheduled_at or self.now))
            if req.first_token_at is None:  # the prefill produces the first output token
                req.first_token_at = self.now
                self.tokenizer.first_token(req, self.now)
                req.generated = max(req.generated, 1.0)
            req.last_token_at = self.now
            self.running.append(req)
        self.counters["realtime_prefill_compute"] += new_tokens
        self.counters["realtime_prefill_cache"] += cached_tokens
        self.counters["prefill_input"] += new_tokens
        self.counters["prefill_device_hit"] += cached_tokens - host_tokens
        self.counters["prefill_host_hit"] += host_tokens
        hit = cached_tokens / (cached_tokens + new_tokens) if cached_tokens + new_tokens else 0.0
        self.reported.cache_hit_rate = hit
        self._report()
        self.emit(PrefillBatch(
            ts=self.now, dp_rank=self.dp_rank, new_seq=len(parts), new_token=new_tokens,
            cached_token=cached_tokens, token_usage=self.reported.token_usage,
            running_req=len(self.running), queue_req=len(self.waiting),
            pending_token=self.pending_tokens,
            input_throughput=new_tokens / seconds if seconds > 0 else 0.0))
        self._finish_done()

    def _run_decode(self) -> None:
        perf, cfg = self.perf, self.cfg
        batch = len(self.running)
        needed = math.ceil(sum(accept_length(r, cfg) for r in self.running))
        kv = self.used_tokens  # summed once per step: nothing changes it until _allocate
        if needed > cfg.max_total_num_tokens - kv:
            self._retract(needed)
            if not self.running:
                return
            batch = len(self.running)
            kv = self.used_tokens
            needed = math.ceil(sum(accept_length(r, cfg) for r in self.running))
        seconds = (perf.decode_overhead_s + perf.decode_s_per_request * batch +
                   perf.decode_s_per_kv_token * kv) / self.speed
        if cfg.speculative_algorithm:
            seconds *= 1 + perf.spec_draft_step_ratio * cfg.speculative_num_steps
        self._allocate(needed, used=kv)
        if self.host is not None:
            self.host.drain(seconds)
        self.now += seconds
        self.busy_seconds += seconds
        itl = self.tokenizer.histogram("itl")
        produced_total = 0.0
        for req in self.running:
            tokens_per_req = accept_length(req, cfg)
            produced_total += tokens_per_req
            before = int(req.generated)
            req.generated = min(req.generated + tokens_per_req, req.output_len)
            produced = int(req.generated) - before
            if produced > 0:
                interval = self.now - (req.last_token_at or self.now)
                # Token-weighted, like SGLang: count += n tokens, sum += the chunk's interval.
                itl.observe(interval / produced, weight=produced, total=interval)
                req.last_token_at = self.now
        self.counters["realtime_decode"] += produced_total
        self.decode_tokens_since_report += produced_total
        self.verifies_since_report += batch
        self.decode_iters_since_report += 1
        self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY,
                                   MIN_NEW_TOKEN_RATIO)
        if self.decode_iters_since_report >= cfg.decode_log_interval:
            elapsed = self.now - self.last_decode_report_at
            self.reported.gen_throughput = (self.decode_tokens_since_report / elapsed
                                            if elapsed > 0 else 0.0)
            if self.zero_cache_hit_on_decode:
                self.reported.cache_hit_rate = 0.0
            self._report()
            self.emit(DecodeBatch(
                ts=self.now, dp_rank=self.dp_rank, running_req=len(self.running),
                num_token=self.used_tokens, token_usage=self.reported.token_usage,
                gen_throughput=self.reported.gen_throughput, queue_req=len(self.waiting),
                accept_len=self.reported.spec_accept_length if cfg.speculative_algorithm
                else None,
                accept_rate=spec_accept_rate(self.reported.spec_accept_length, cfg)
                if cfg.speculative_algorithm else None))
        self._finish_done()

    def _retract(self, needed: int) -> None:
        """KV pool full in decode: push requests back to the queue until the step fits."""
        before = self.new_token_ratio
        retracted = gained = 0
        # SGLang retracts the requests with the least output and the longest input first.
        order = sorted(self.running, key=lambda r: (r.generated, -r.input_len))
        while order and needed > self.free_tokens:
            req = order.pop(0)
            self.running.remove(req)
            gained += req.kv_tokens
            self.counters["retracted_input_tokens"] += req.input_len
            self.counters["retracted_output_tokens"] += int(req.generated)
            req.retracted += 1
            req.recomputed = int(req.generated)
            req.prefilled = 0
            self.waiting.insert(0, req)
            retracted += 1
        self.trim_cache()
        self.counters["retracted_requests"] += retracted
        self.retracted_since_report += retracted
        self.retracted_ever = True
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.3)
        self.emit(Retraction(ts=self.now, dp_rank=self.dp_rank, retracted_reqs=retracted,
                             new_tokens_gained=gained, new_token_ratio_before=before,
                             new_token_ratio_after=self.new_token_ratio))

    def _finish_done(self) -> None:
        still = []
        for req in self.running:
            if req.generated >= req.output_len and req.on_done is not None:
                self.held_tokens += req.kv_tokens  # PD prefill: held until its KV is sent
                req.on_done(req, self.now)
            elif req.generated >= req.output_len:
                self.tokenizer.finished(req, self.now)
                # Its tokens stay in the radix cache for the next turn of the session.
                self.evictable += req.kv_tokens
                if self.host is not None:  # its output joins the cache: a copy is queued
                    self.host.insert(int(req.generated))
            else:
                still.append(req)
        self.running = still
        self.trim_cache()

    def _report(self, idle: bool = False) -> None:
        r = self.reported
        r.running = len(self.running)
        r.queue = len(self.waiting)
        r.grammar_queue = len(self.grammar)
        if self.cfg.enable_priority_scheduling:
            for name, reqs in (("num_queue_reqs", self.waiting), ("num_running_reqs",
                                                                  self.running)):
                seen = r.by_priority.setdefault(name, {})
                for p in seen:
                    seen[p] = 0
                for req in reqs:
                    seen[req.priority or 0] = seen.get(req.priority or 0, 0) + 1
        r.used_tokens = self.used_tokens
        r.evictable_tokens = self.evictable
        r.token_usage = round(self.used_tokens / self.cfg.max_total_num_tokens, 2)
        r.new_token_ratio = self.new_token_ratio
        r.retracted_since_last = self.retracted_since_report
        r.decode_sum_seq_lens = sum(req.kv_tokens for req in self.running)
        if self.host is not None:
            self.host.release(r.used_tokens + self.evictable)
            r.host_used_tokens = self.host.used
        if self.cfg.enable_lora and not idle:  # the idle report leaves the LoRA gauges
            r.lora_slots_used = len(self.adapters())
        if not self.cfg.speculative_algorithm:
            r.spec_accept_length = 0.0
        elif self.verifies_since_report:  # accepted tokens per verify over the interval
            r.spec_accept_length = self.decode_tokens_since_report / self.verifies_since_report
        elif not r.spec_accept_length:
            r.spec_accept_length = self.cfg.spec_accept_length
        if idle:
            r.gen_throughput = 0.0
        self.retracted_since_report = 0
        if idle or self.decode_iters_since_report >= self.cfg.decode_log_interval:
            self.decode_iters_since_report = 0
            self.decode_tokens_since_report = 0.0
            self.verifies_since_report = 0
            self.last_decode_report_at = self.now
        self.last_report_at = self.now
        self.has_reported = True


class Server:
    """All DP ranks of one server, the tokenizer's stats, and the up/down state."""

    def __init__(self, cfg: ServerConfig, perf: PerfModel,
                 make_histogram: Callable[[str], Histogram], zero_cache_hit_on_decode: bool,
                 start_ts: float, emit: Callable[[object], None] = lambda e: None,
                 warm_cache_ratio: float = 0.0,
                 on_request: Callable[[Request, float], None] | None = None):
        self.cfg, self.perf = cfg, perf
        self.start_ts = start_ts
        self._make_histogram = make_histogram
        self._zero = zero_cache_hit_on_decode
        self._emit_ts = emit
        self._on_request = on_request
        self._warm_cache = int(cfg.max_total_num_tokens * warm_cache_ratio)
        self.now = 0.0
        self.up = True
        self.restarts = 0
        self.started_at = 0.0
        self._dispatch = 0
        self._boot()

    def _emit(self, event) -> None:
        # Events carry simulated seconds; the outside world sees Unix time.
        self._emit_ts(type(event)(**{**event.__dict__, "ts": self.start_ts + event.ts}))

    def _boot(self) -> None:
        self.tokenizer = TokenizerStats(self._make_histogram, on_finished=self._on_request,
                                        cfg=self.cfg)
        ranks = range(self.cfg.dp_size) if self.cfg.dp_size > 1 else [None]
        self.schedulers = [
            Scheduler(self.cfg, self.perf, rank, self.tokenizer, self._make_histogram,
                      self._zero, self._emit, self._warm_cache) for rank in ranks]
        self._warm_cache = 0  # a restarted server starts with an empty cache
        for s in self.schedulers:
            s.now = s.last_report_at = s.last_decode_report_at = self.now
        self.started_at = self.now
        cfg = self.cfg
        self._emit(StartupCapacity(
            ts=self.now, max_total_num_tokens=cfg.max_total_num_tokens,
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_prefill_tokens=cfg.max_prefill_tokens,
            max_running_requests=cfg.max_running_requests, context_len=cfg.context_length,
            available_gpu_mem_gb=round(cfg.gpu_memory_total_gb * (1 - cfg.mem_fraction_static)
                                       + 0.8, 2)))
        self._emit(Ready(ts=self.now))

    def submit(self, req: Request) -> None:
        if not self.up:
            return  # connection refused: the client sees an error, nothing is queued
        # The DP controller sends to the rank with the fewest requests (ties: round robin).
        target = min(self.schedulers, key=lambda s: (len(s.waiting) + len(s.running) +
                                                     (1 if s.chunked else 0)))
        target.add(req)

    def crash(self) -> None:
        self.up = False
        self.schedulers = []

    def restart(self) -> None:
        self.up = True
        self.restarts += 1
        self._boot()

    def set_speed(self, factor: float) -> None:
        for s in self.schedulers:
            s.speed = factor

    def advance(self, until: float) -> None:
        """Run every DP rank up to `until` simulated seconds."""
        for s in self.schedulers:
            while s.now < until:
                s.step(until)
        self.now = until

    # -- views for exposition and endpoints --------------------------------------------
    def busy_seconds(self) -> float:
        return sum(s.busy_seconds for s in self.schedulers)
