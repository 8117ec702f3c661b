"""A prefill/decode (PD) deployment behind a gateway, on one scenario clock.

N prefill and M decode servers, each the single-server model of simulator/model.py (no second
scheduler): a prefill server's requests generate one token and keep their KV held until it
has been sent; a decode server's arrive with their prompt's KV preallocated and transferred
in, so only decode work is left. docs/pd.md ("How the simulator models a PD request") has the
stages and which side measures each.

A request: the gateway (simulator/gateway.py) picks a prefill and a decode worker and sends
both legs at once. Prefill: bootstrap queue until the decode side has allocated the prompt's
KV; decode: prealloc queue (the handshake, then room in the KV pool). Then the prefill waits
and runs (the Server), its KV crosses the decode server's link (shared equally by that link's
concurrent transfers) while the prefill holds it (inflight) and the decode waits for it
(transfer queue); then the decode server admits it, outputs the prefill's token (SGLang's
prebuilt batch) and decodes the rest. Faults: a collapsed link, bootstraps that time out,
transfers that fail, a worker that answers 5xx, a gateway that skews traffic.

Deterministic for a scenario: every draw comes from the scenario's seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from sglang_obs.core.sglang import SGLANG_PORT
from sglang_obs.simulator import shapes
from sglang_obs.simulator.gateway import Gateway, Worker
from sglang_obs.simulator.model import REQUEST_PROCESS_SECONDS, Histogram, Request, Server
from sglang_obs.simulator.pd_scenario import PdFault, PdScenario, Pool
from sglang_obs.simulator.profiles import (
    ITL_BUCKETS,
    PER_STAGE_BUCKETS,
    TOKEN_BUCKETS,
    Profile,
    profile,
)
from sglang_obs.simulator.simulation import Looping

# per_stage_req_latency_seconds stages each role observes (docs/pd.md): a PD prefill server
# times its bootstrap instead of request_process; `fake_output` is the decode server's prebuilt
# batch (the scheduler's own prefill_forward timing of a request that prefills nothing).
STAGES = {"prefill": ("prefill_bootstrap", "prefill_transfer_kv_cache"),
          "decode": ("decode_prepare", "decode_bootstrap", "decode_transferred",
                     "decode_waiting")}
KV_HISTOGRAMS = {"latency": "sglang:kv_transfer_latency_ms",
                 "speed": "sglang:kv_transfer_speed_gb_s",
                 "total_mb": "sglang:kv_transfer_total_mb",
                 "bootstrap": "sglang:kv_transfer_bootstrap_ms",
                 "alloc": "sglang:kv_transfer_alloc_ms"}
# The per-request TTFT split, in order: consecutive intervals from gateway arrival to the first
# token (their sum is the client's TTFT).
SPLIT = ("gateway", "prefill_bootstrap", "prefill_waiting", "prefill_forward", "kv_transfer",
         "decode_waiting", "decode_first_token")
MAX_STEP = 0.05  # seconds the engines may run ahead of each other while there is work


@dataclass
class PdRequest:
    """One client request through the gateway, with the timestamps of its current attempt."""

    rid: int
    arrival: float
    input_len: int
    cached_fraction: float
    output_len: int
    max_new_tokens: int
    streaming: bool
    session: int
    attempts: int = 0
    prefill: Engine | None = None
    decode: Engine | None = None
    exclude: set[str] = field(default_factory=set)  # worker URLs that failed it last
    doomed_transfer: bool = False
    ready_at: float = math.inf  # decode side's handshake done
    t_dispatch: float | None = None  # both legs sent (the successful attempt's, in the end)
    t_alloc: float | None = None  # decode side allocated: prefill bootstrap done
    t_wait: float | None = None  # prefill waiting-queue entry
    t_prefilled: float | None = None  # prefill forward done: the transfer starts
    t_transferred: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    error: str | None = None
    p_req: Request | None = None
    d_req: Request | None = None

    def split(self) -> dict[str, float] | None:
        """The exact TTFT decomposition (SPLIT), once the first token is out."""
        if self.first_token_at is None:
            return None
        p, d = self.p_req, self.d_req
        marks = (self.arrival, self.t_dispatch, self.t_wait, p.scheduled_at, self.t_prefilled,
                 self.t_transferred, d.scheduled_at, self.first_token_at)
        return {stage: b - a for stage, a, b in zip(SPLIT, marks[:-1], marks[1:], strict=True)}

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival


class Link:
    """A decode server's receive link: its bandwidth shared equally by the transfers on it."""

    def __init__(self, bytes_per_s: float):
        self.capacity = bytes_per_s
        self.factor = 1.0
        self.flows: list[list] = []  # [bytes left, PdRequest]
        self.t = 0.0
        self.version = 0

    def progress(self, t: float) -> None:
        if self.flows and t > self.t:
            sent = self.capacity * self.factor * (t - self.t) / len(self.flows)
            for flow in self.flows:
                flow[0] -= sent
        self.t = max(self.t, t)

    def next_done(self) -> float | None:
        if not self.flows:
            return None
        rate = self.capacity * self.factor / len(self.flows)
        return self.t + max(min(f[0] for f in self.flows), 0.0) / rate


class Engine:
    """One SGLang server of the deployment: the Server model plus its PD queues and series."""

    def __init__(self, role: str, index: int, pool: Pool, prof: Profile,
                 make_histogram: Callable[[str], Histogram], start_ts: float,
                 on_finished: Callable[[Request, float], None] | None, link_gb_s: float):
        self.role, self.index = role, index
        self.name = f"{role}-{index}"
        self.instance = f"pd-{self.name}:{SGLANG_PORT}"
        self.server = Server(pool.server, pool.perf, make_histogram,
                             prof.decode_report_zeroes_cache_hit_rate, start_ts,
                             on_request=on_finished)
        self.bootstrap: list[PdRequest] = []  # prefill: until the decode side is ready
        self.inflight: list[PdRequest] = []  # prefill: KV being sent
        self.prealloc: list[PdRequest] = []  # decode: handshake, then a KV allocation
        self.transfer: list[PdRequest] = []  # decode: KV arriving
        self.awaiting: list[PdRequest] = []  # decode: in the waiting queue, no token out yet
        self.stages = {s: make_histogram("per_stage") for s in STAGES[role]}
        catalogue = shapes.load(prof.release)
        self.kv = {k: Histogram(catalogue[name]["buckets"]) for k, name in KV_HISTOGRAMS.items()}
        self.bootstrap_failed = 0.0
        self.transfer_failed = 0.0
        self.timeouts = {"bootstrap": 0.0, "transfer": 0.0}
        self.last_transfer = (0.0, 0.0)  # latency ms, speed GB/s: /v1/loads' last values
        self.link = Link(link_gb_s * 1e9)

    @property
    def sched(self):
        return self.server.schedulers[0]

    @property
    def pending_prealloc_tokens(self) -> int:
        return sum(r.input_len for r in self.prealloc)


def _histogram_factory(prof: Profile) -> Callable[[str], Histogram]:
    bounds = {"ttft": prof.ttft_buckets, "e2e": prof.e2e_buckets, "itl": ITL_BUCKETS,
              "request_tpot": ITL_BUCKETS, "queue_time": prof.queue_buckets,
              "per_stage": PER_STAGE_BUCKETS, "prompt_tokens": TOKEN_BUCKETS,
              "generation_tokens": TOKEN_BUCKETS, "uncached_prompt_tokens": TOKEN_BUCKETS}
    return lambda name: Histogram(bounds[name])


class Deployment(Looping):
    """The engines, the links and the gateway; `advance(t)` moves the clock to t seconds."""

    def __init__(self, scenario: PdScenario, start_ts: float = 0.0, loop: bool = False,
                 instances: dict[str, str] | None = None):
        self.scenario = scenario
        self.profile = profile(scenario.release)
        self.start_ts, self.loop = start_ts, loop
        self.t = 0.0
        self.changes = 0  # counts the advance steps: anything served may differ after one
        make = _histogram_factory(self.profile)
        bw = scenario.transfer.bandwidth_gb_s
        self.prefills = [Engine("prefill", i, scenario.prefill, self.profile, make, start_ts,
                                None, bw) for i in range(scenario.prefill.count)]
        self.decodes = [Engine("decode", i, scenario.decode, self.profile, make, start_ts,
                               self._decode_finished, bw) for i in range(scenario.decode.count)]
        self.engines = self.prefills + self.decodes
        for e in self.engines:
            e.instance = (instances or {}).get(e.name, e.instance)
        self.rng = random.Random(scenario.seed * 1_000_003 + 17)
        workers = {e.name: Worker(f"http://{e.instance}", e.role) for e in self.engines}
        self.gateway = Gateway(scenario.gateway, scenario.decode.server.model_name,
                               [workers[e.name] for e in self.prefills],
                               [workers[e.name] for e in self.decodes],
                               random.Random(scenario.seed * 7_919 + 3))
        self.worker = {e.name: workers[e.name] for e in self.engines}
        self.engine_of = {workers[e.name].url: e for e in self.engines}
        self.requests: list[PdRequest] = []  # every request that arrived, in order
        self._heap: list[tuple] = []
        self._seq = itertools.count()
        self._arrivals = self._timeline(0.0, 0)
        self._next = 0
        self._round = 0
        self._next_load_poll = 0.0
        self._decode_of: dict[int, PdRequest] = {}
        self._fault_edges(0.0)

    # -- the clock ------------------------------------------------------------------------------
    def unix(self, t: float | None = None) -> float:
        return self.start_ts + (self.t if t is None else t)

    def _timeline(self, offset: float, round_: int) -> list[PdRequest]:
        out = []
        for spec in self.scenario.arrivals():
            spec = {**spec, "arrival": spec["arrival"] + offset,
                    "rid": spec["rid"] + round_ * 1_000_000}
            out.append(PdRequest(**spec))
        return out

    def _push(self, at: float, action: Callable, *args) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), action, args))

    def _busy(self) -> bool:
        return any(e.sched.busy() or e.bootstrap or e.inflight or e.prealloc or e.transfer
                   for e in self.engines)

    def advance(self, until: float) -> None:
        while True:
            self._maybe_loop(until)
            arrival = (self._arrivals[self._next].arrival if self._next < len(self._arrivals)
                       else math.inf)
            event = self._heap[0][0] if self._heap else math.inf
            step_to = min(arrival, event, until)
            if self._busy():  # engines exchange work: keep them within MAX_STEP of each other
                step_to = min(step_to, self.t + MAX_STEP)
            step_to = max(step_to, self.t)
            if step_to == self.t and event > step_to and arrival > step_to:
                return  # nothing left at or before `until`
            self.changes += 1
            for e in self.engines:
                e.server.advance(step_to)
            self.t = step_to
            self._after_engines(step_to)
            while self._heap and self._heap[0][0] <= step_to:
                at, _, action, args = heapq.heappop(self._heap)
                action(*args, at=at)
            while self._next < len(self._arrivals) and \
                    self._arrivals[self._next].arrival <= step_to:
                req = self._arrivals[self._next]
                self._next += 1
                self._arrive(req, at=req.arrival)
            if step_to >= until and arrival > until and not (self._heap and
                                                              self._heap[0][0] <= until):
                return

    def _next_round(self, offset: float) -> None:
        self._arrivals = self._arrivals[self._next:] + self._timeline(offset, self._round)
        self._next = 0
        self._fault_edges(offset)

    def _fault(self, kind: str, t: float, worker: str | None = None) -> PdFault | None:
        local = t % self.scenario.duration if self.loop else t
        for f in self.scenario.faults:
            if f.kind == kind and f.active(local) and (worker is None or f.worker == worker):
                return f
        return None

    def _fault_edges(self, offset: float) -> None:
        for f in self.scenario.faults:
            if f.kind == "bandwidth_collapse":
                self._push(offset + f.at, self._rerate)
                self._push(offset + f.at + f.duration, self._rerate)

    def _rerate(self, at: float) -> None:
        local = at % self.scenario.duration if self.loop else at
        for d in self.decodes:
            factor = 1.0
            for f in self.scenario.faults:
                if f.kind == "bandwidth_collapse" and f.active(local) and \
                        f.worker in (None, d.name):
                    factor *= f.factor
            if factor != d.link.factor:
                d.link.progress(at)
                d.link.factor = factor
                self._relink(d, at)

    # -- after each engine step: first tokens, preallocations, the gateway's load poll ----------
    def _after_engines(self, t: float) -> None:
        for d in self.decodes:
            if d.awaiting:
                out = [r for r in d.awaiting if r.d_req.first_token_at is not None]
                if out:
                    d.awaiting = [r for r in d.awaiting if r.d_req.first_token_at is None]
                    for r in out:
                        self._first_token(d, r)
            if d.prealloc:
                self._preallocate(d, at=t)
        if t >= self._next_load_poll:
            for e in self.engines:
                s = e.sched
                self.worker[e.name].engine_load = (
                    float(len(s.running)), float(len(s.waiting)),
                    round(s.used_tokens / e.server.cfg.max_total_num_tokens, 4))
            self._next_load_poll = t + self.scenario.gateway.load_poll_s

    # -- a request's path -----------------------------------------------------------------------
    def _arrive(self, req: PdRequest, at: float) -> None:
        self.requests.append(req)
        self.gateway.request_arrived(req.streaming)
        self._attempt(req, at=at)

    def _attempt(self, req: PdRequest, at: float) -> None:
        gw = self.gateway
        req.attempts += 1
        skew = self._fault("routing_skew", at)
        forced = (self.worker[skew.worker] if skew is not None
                  and self.rng.random() < skew.share else None)
        pw = gw.pick("prefill", at, req.exclude, req.session)
        dw = gw.pick("decode", at, req.exclude, req.session, forced)
        if pw is None or dw is None:
            self._give_up(req, at, "no_workers", 503)
            return
        req.prefill, req.decode = self.engine_of[pw.url], self.engine_of[dw.url]
        pw.active += 1
        dw.active += 1
        sent = at + gw.cfg.overhead_s
        failing = [e for e in (req.prefill, req.decode)
                   if self._fault("worker_errors", at, e.name)]
        if failing:  # it answers 5xx at once; the gateway drops the other leg unstarted
            self._push(sent + gw.cfg.error_latency_s, self._attempt_failed, req, req.attempts,
                       failing, "backend_error")
            return
        req.t_dispatch = sent
        self._push(sent, self._receive, req, req.attempts)

    def _receive(self, req: PdRequest, attempt: int, at: float) -> None:
        p, d = req.prefill, req.decode
        p.bootstrap.append(req)
        d.stages["decode_prepare"].observe(REQUEST_PROCESS_SECONDS)
        timeout = self._fault("bootstrap_timeout", at)
        if timeout is not None and self.rng.random() < timeout.share:
            req.ready_at = math.inf  # the handshake never completes
            self._push(at + timeout.timeout, self._bootstrap_timeout, req, attempt)
        else:
            req.ready_at = at + self.scenario.transfer.handshake_s
            self._push(req.ready_at, self._preallocate, d)
        d.prealloc.append(req)

    def _preallocate(self, d: Engine, at: float) -> None:
        """Decode side: allocate KV for handshaken requests, in order, while the pool and the
        request slots allow (what is left waits: pending_prealloc_token_usage)."""
        tr = self.scenario.transfer
        s, cfg = d.sched, d.server.cfg
        held = len(s.running) + len(s.waiting) + len(d.transfer)
        spare = cfg.max_total_num_tokens - s.used_tokens
        # Request slots: SGLang sizes a decode server's request pool to max_running_requests,
        # with twice as many again for preallocations when that is 32 or fewer.
        slots = cfg.max_running_requests * (3 if cfg.max_running_requests <= 32 else 1)
        i = 0
        while i < len(d.prealloc):
            req = d.prealloc[i]
            if req.ready_at > at:
                i += 1
                continue
            if held >= slots or \
                    req.input_len + tr.decode_reserved_tokens * (held + 1) > spare:
                break
            del d.prealloc[i]
            s.held_tokens += req.input_len
            s.trim_cache()
            held += 1
            spare -= req.input_len
            req.t_alloc = at
            d.stages["decode_bootstrap"].observe(at - req.t_dispatch)
            d.transfer.append(req)
            self._push(at + tr.alloc_s, self._prefill_ready, req, req.attempts)

    def _prefill_ready(self, req: PdRequest, attempt: int, at: float) -> None:
        """Prefill side: bootstrap done (the decode side sent its KV destination)."""
        p = req.prefill
        p.bootstrap.remove(req)
        req.t_wait = at
        p.stages["prefill_bootstrap"].observe(at - req.t_dispatch)
        req.p_req = Request(rid=req.rid, arrival=at, input_len=req.input_len,
                            cached_fraction=req.cached_fraction, output_len=1, max_new_tokens=1,
                            streaming=req.streaming, received=req.t_dispatch,
                            on_done=partial(self._prefilled, req, attempt))
        p.server.submit(req.p_req)

    def _prefilled(self, req: PdRequest, attempt: int, _p_req: Request, now: float) -> None:
        # Called from inside the prefill server's step: the transfer starts at its time.
        req.t_prefilled = now
        self._push(now, self._transfer_start, req, attempt)

    def _transfer_start(self, req: PdRequest, attempt: int, at: float) -> None:
        req.prefill.inflight.append(req)
        failing = self._fault("transfer_failure", at)
        req.doomed_transfer = failing is not None and self.rng.random() < failing.share
        link = req.decode.link
        link.progress(at)
        link.flows.append([float(req.input_len * self.scenario.transfer.kv_bytes_per_token),
                           req])
        self._relink(req.decode, at)

    def _relink(self, d: Engine, at: float) -> None:
        d.link.version += 1
        done = d.link.next_done()
        if done is not None:
            self._push(max(done, at), self._link_due, d, d.link.version)

    def _link_due(self, d: Engine, version: int, at: float) -> None:
        link = d.link
        if version != link.version:
            return
        link.progress(at)
        done = [f for f in link.flows if f[0] <= 1.0]  # within a byte: float rounding
        link.flows = [f for f in link.flows if f[0] > 1.0]
        for _, req in done:
            self._transferred(req, at)
        self._relink(d, at)

    def _transferred(self, req: PdRequest, at: float) -> None:
        p, d = req.prefill, req.decode
        p.inflight.remove(req)
        d.transfer.remove(req)
        p_req = req.p_req
        if req.doomed_transfer:
            for e in (p, d):
                e.transfer_failed += 1
                e.server.tokenizer.aborted += 1
                e.server.tokenizer.touched = True
            self._release(p, p_req.kv_tokens, to_cache=True)
            self._release(d, req.input_len, to_cache=False)
            self.gateway.transfer_failed()
            self._attempt_failed(req, req.attempts, [p, d], "kv_transfer_failed", at=at)
            return
        seconds = at - req.t_prefilled
        mb = req.input_len * self.scenario.transfer.kv_bytes_per_token / 2**20
        speed = mb / 1024 / seconds if seconds > 0 else 0.0
        p.stages["prefill_transfer_kv_cache"].observe(seconds)
        p.kv["latency"].observe(seconds * 1000)
        p.kv["total_mb"].observe(mb)
        p.kv["speed"].observe(speed)
        p.kv["bootstrap"].observe((req.t_alloc - req.t_dispatch) * 1000)
        p.kv["alloc"].observe((req.t_wait - req.t_alloc) * 1000)
        p.last_transfer = (seconds * 1000, speed)
        p.server.tokenizer.finished(p_req, at)  # the prefill leg ends when its KV is sent
        self._release(p, p_req.kv_tokens, to_cache=True)
        pw = self.worker[p.name]
        pw.active -= 1
        self.gateway.record_success(pw)
        self.gateway.prefill_leg_done(at - req.t_dispatch, seconds)
        req.t_transferred = at
        d.stages["decode_transferred"].observe(at - req.t_alloc)
        req.d_req = Request(rid=req.rid, arrival=at, input_len=req.input_len,
                            cached_fraction=0.0, output_len=req.output_len,
                            max_new_tokens=req.max_new_tokens, streaming=req.streaming,
                            kv_ready=True, received=req.t_dispatch, prefilled=req.input_len)
        self._decode_of[id(req.d_req)] = req
        d.server.submit(req.d_req)
        d.awaiting.append(req)

    @staticmethod
    def _release(e: Engine, tokens: int, to_cache: bool) -> None:
        s = e.sched
        s.held_tokens -= tokens
        if to_cache:  # a sent prompt stays in the prefill server's radix cache
            s.evictable += tokens
        s.trim_cache()

    def _first_token(self, d: Engine, req: PdRequest) -> None:
        d_req = req.d_req
        req.first_token_at = d_req.first_token_at
        d.stages["decode_waiting"].observe(d_req.scheduled_at - d_req.arrival)
        self.gateway.first_token(req.first_token_at - req.t_dispatch)
        self.gateway.record_success(self.worker[d.name])

    def _decode_finished(self, d_req: Request, now: float) -> None:
        req = self._decode_of.pop(id(d_req), None)
        if req is not None:  # called from inside the decode server's step
            self._push(now, self._done, req)

    def _done(self, req: PdRequest, at: float) -> None:
        req.finished_at = at
        self.worker[req.decode.name].active -= 1
        self.gateway.request_done(at - req.arrival, 200)

    # -- failures -------------------------------------------------------------------------------
    def _bootstrap_timeout(self, req: PdRequest, attempt: int, at: float) -> None:
        p, d = req.prefill, req.decode
        if attempt != req.attempts or req not in p.bootstrap:
            return
        p.bootstrap.remove(req)
        d.prealloc.remove(req)
        for e in (p, d):  # each side's own timeout gives up on it
            e.bootstrap_failed += 1
            e.timeouts["bootstrap"] += 1
            e.server.tokenizer.aborted += 1
            e.server.tokenizer.touched = True
        self.gateway.bootstrap_failed()
        self._attempt_failed(req, attempt, [p, d], "bootstrap_failed", at=at)

    def _attempt_failed(self, req: PdRequest, attempt: int, failing: list[Engine],
                        error_type: str, at: float) -> None:
        gw = self.gateway
        for e in (req.prefill, req.decode):
            self.worker[e.name].active -= 1
        for e in failing:
            gw.record_failure(self.worker[e.name], at)
            gw.worker_error(self.worker[e.name], error_type)
        req.exclude = {self.worker[e.name].url for e in failing}
        role = failing[-1].role
        if req.attempts <= gw.cfg.max_retries:
            gw.retried(role)
            self._push(at + gw.backoff(req.attempts), self._attempt, req)
        else:
            gw.retries_exhausted(role)
            self._give_up(req, at, "backend_error", 500)

    def _give_up(self, req: PdRequest, at: float, error_type: str, status: int) -> None:
        req.error = error_type
        req.finished_at = at
        self.gateway.request_done(at - req.arrival, status, error_type)
