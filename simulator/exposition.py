"""SGLang's /metrics for a simulated server, as the chosen release exposes it.

Families are built with prometheus_client, as SGLang builds them, so the exposition (counter
`_total`, histogram bucket rendering, and the OpenMetrics underscore escaping of
prometheus_client >= 0.23) is the library's own. Names, label sets, "since" releases and lazy
appearance follow the SGLang reference (§1, §3, §5, §7).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from sglang_obs.simulator import shapes
from sglang_obs.simulator.model import Histogram, Scheduler, Server, spec_accept_rate
from sglang_obs.simulator.profiles import Profile

P = "sglang:"


@dataclass(frozen=True)
class GaugeSpec:
    name: str
    help: str
    since: str
    value: Callable[[Scheduler], float]
    until: str | None = None  # first release without it
    pid: bool = False  # no multiprocess mode: one series per process, label pid


def _r(attr):
    return lambda s: float(getattr(s.reported, attr))


ZERO = lambda s: 0.0  # noqa: E731 - features the model does not simulate (PD, LoRA, SWA, ...)

GAUGES = (
    GaugeSpec("num_running_reqs", "The number of running requests.", "0.3.6", _r("running")),
    GaugeSpec("num_used_tokens", "The number of used tokens.", "0.3.6", _r("used_tokens")),
    GaugeSpec("token_usage", "The token usage.", "0.3.6", _r("token_usage")),
    GaugeSpec("full_token_usage", "The token usage of the full-attention pool.", "0.5.10",
              _r("token_usage")),
    GaugeSpec("swa_token_usage", "The token usage for SWA layers.", "0.5.2", ZERO),
    GaugeSpec("mamba_usage", "The token usage for Mamba layers.", "0.5.5", ZERO),
    GaugeSpec("kv_available_tokens", "KV tokens free and not evictable.", "0.5.12",
              lambda s: float(s.cfg.max_total_num_tokens - s.reported.used_tokens -
                              s.reported.evictable_tokens)),
    GaugeSpec("kv_evictable_tokens", "KV tokens held by the radix cache, evictable.", "0.5.12",
              _r("evictable_tokens")),
    GaugeSpec("kv_used_tokens", "KV tokens in use.", "0.5.12", _r("used_tokens")),
    GaugeSpec("gen_throughput", "The generation throughput (token/s).", "0.3.6",
              _r("gen_throughput")),
    GaugeSpec("num_queue_reqs", "The number of requests in the waiting queue.", "0.3.6",
              _r("queue")),
    GaugeSpec("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.",
              "0.4.6.post5", _r("grammar_queue")),
    GaugeSpec("num_running_reqs_offline_batch", "Running low-priority offline requests.",
              "0.5.2", ZERO, until="0.5.12"),
    GaugeSpec("cache_hit_rate", "The prefix cache hit rate.", "0.3.6", _r("cache_hit_rate")),
    GaugeSpec("decode_sum_seq_lens", "The sum of all sequence lengths in decode.", "0.5.7",
              _r("decode_sum_seq_lens")),
    GaugeSpec("new_token_ratio", "The reserve ratio for future decode tokens.", "0.5.6",
              _r("new_token_ratio")),
    GaugeSpec("spec_accept_length", "The average acceptance length of speculative decoding.",
              "0.4.3.post4", _r("spec_accept_length")),
    GaugeSpec("spec_accept_rate", "The acceptance rate of speculative decoding.", "0.5.4",
              lambda s: spec_accept_rate(s.reported.spec_accept_length, s.cfg)),
    # The active draft configuration, 0 without a draft worker (metrics_reporter.py @ v0.5.23).
    GaugeSpec("spec_num_steps", "The number of speculative decoding steps.", "0.5.13",
              lambda s: float(s.cfg.speculative_num_steps if s.cfg.speculative_algorithm
                              else 0)),
    GaugeSpec("spec_num_draft_tokens", "The number of speculative decoding draft tokens.",
              "0.5.13", lambda s: float(s.cfg.speculative_num_draft_tokens
                                        if s.cfg.speculative_algorithm else 0)),
    GaugeSpec("num_prefill_prealloc_queue_reqs", "Prefill requests in the prealloc queue.",
              "0.4.6.post5", ZERO, until="0.5.12"),
    GaugeSpec("num_prefill_bootstrap_queue_reqs", "Prefill requests in the bootstrap queue.",
              "0.5.12", ZERO),
    GaugeSpec("num_prefill_infight_queue_reqs", "Prefill requests in flight.", "0.4.6.post5",
              ZERO, until="0.5.2"),
    GaugeSpec("num_prefill_inflight_queue_reqs", "Prefill requests in flight.", "0.5.2", ZERO),
    GaugeSpec("num_decode_prealloc_queue_reqs", "Decode requests in the prealloc queue.",
              "0.4.6.post5", ZERO),
    GaugeSpec("num_decode_transfer_queue_reqs", "Decode requests in the transfer queue.",
              "0.4.6.post5", ZERO),
    GaugeSpec("pending_prealloc_token_usage", "Decode KV held for pending transfers.", "0.5.4",
              ZERO),
    GaugeSpec("utilization", "Always 0 in this release; do not use.", "0.5.2", ZERO),
    GaugeSpec("is_cuda_graph", "Whether the last batch ran a CUDA graph.", "0.5.4",
              lambda s: 1.0 if s.running else 0.0),
    GaugeSpec("num_retracted_reqs", "Requests retracted since the previous report.", "0.5.2",
              _r("retracted_since_last"), pid=True),
    GaugeSpec("num_paused_reqs", "Requests paused by async weight sync.", "0.5.2", ZERO,
              pid=True),
)


@dataclass(frozen=True)
class ConstantSpec:
    name: str
    help: str
    since: str
    value: Callable[[Server], float]


CONSTANTS = (
    ConstantSpec("max_total_num_tokens", "Maximum total number of tokens in the KV pool.",
                 "0.5.6", lambda srv: float(srv.cfg.max_total_num_tokens)),
    ConstantSpec("page_size", "KV cache page size in tokens.", "0.5.12",
                 lambda srv: float(srv.cfg.page_size)),
    ConstantSpec("num_pages", "Number of KV cache pages.", "0.5.12",
                 lambda srv: float(srv.cfg.max_total_num_tokens // srv.cfg.page_size)),
    ConstantSpec("context_len", "The context length of the model.", "0.5.12",
                 lambda srv: float(srv.cfg.context_length)),
    ConstantSpec("startup_available_gpu_memory_gb", "Available GPU memory at startup (GB).",
                 "0.5.12", lambda srv: round(srv.cfg.gpu_memory_total_gb *
                                             (1 - srv.cfg.mem_fraction_static) + 0.8, 2)),
    ConstantSpec("weight_memory_usage_gb", "Model weight memory (GB).", "0.5.17",
                 lambda srv: srv.cfg.weight_memory_gb),
    ConstantSpec("kv_cache_memory_usage_gb", "KV cache memory (GB).", "0.5.17",
                 lambda srv: srv.cfg.kv_cache_memory_gb),
)


# Every family the model drives (some only after an event: a retraction, a finished request):
# the catalogue of unmodelled families leaves these alone.
MODELLED = frozenset(
    {P + spec.name for spec in GAUGES} | {P + spec.name for spec in CONSTANTS}
    | {P + n for n in (
        "realtime_tokens_total", "num_retracted_requests_total",
        "num_retracted_input_tokens_total", "num_retracted_output_tokens_total",
        "prefill_effective_tokens_total", "scheduler_idle_seconds_total", "queue_time_seconds",
        "per_stage_req_latency_seconds", "prompt_tokens_total", "generation_tokens_total",
        "num_requests_total", "cached_tokens_total", "num_aborted_requests_total",
        "http_requests_total", "http_responses_total", "time_to_first_token_seconds",
        "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_time_per_output_token_seconds", "prompt_tokens_histogram",
        "generation_tokens_histogram", "uncached_prompt_tokens_histogram",
        "spec_verify_calls_total", "evicted_tokens_total")})


class SimCollector:
    """Yields the simulated server's families; nothing while the server is down."""

    def __init__(self, server_fn: Callable[[], Server], profile: Profile, pid: int | None = None,
                 engine_type: str = "unified"):
        self._server_fn = server_fn
        self.profile = profile
        self._pid = str(pid or os.getpid())
        self.engine_type = engine_type  # "prefill" | "decode" for a PD engine (pd_exposition)

    def describe(self):
        return []

    def collect(self) -> Iterator:
        server = self._server_fn()
        if not server.up:
            return
        yield from self._scheduler_families(server)
        yield from self._tokenizer_families(server)
        if any(s.has_reported for s in server.schedulers):
            yield from self._unmodelled_families(server)

    # -- what the model does not drive (simulator/shapes.py) --------------------------------
    def _unmodelled_families(self, server: Server):
        """The release's other families, from its goldens' catalogue, at zero."""
        reporting = [self._rank_labels(server, s.dp_rank, 0) for s in server.schedulers]
        every_rank = [self._rank_labels(server, s.dp_rank, r) for s in server.schedulers
                      for r in range(self._ranks_per_dp(server))]
        for name, shape in shapes.load(self.profile.release).items():
            if name in MODELLED:
                continue
            kind = shape["type"]
            bare = name.removesuffix("_total") if kind == "counter" else name
            ranked = [n for n in shape["labels"] if n in shapes.RANK_LABELS]
            family_cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
                          "histogram": HistogramMetricFamily}.get(kind)
            if family_cls is None:
                continue
            family = family_cls(bare, shape["help"], labels=shape["labels"])
            ranks = (every_rank if shape["every_rank"] else reporting) if ranked else [{}]
            for rank in ranks:
                for series in shape["series"] or [{}]:
                    values = {**rank, "pid": self._pid, "priority": "", **series}
                    labels = [values.get(n, "") for n in shape["labels"]]
                    if kind == "histogram":
                        family.add_metric(labels, [(floatToGoString(b), 0.0)
                                                   for b in shape["buckets"]]
                                          + [("+Inf", 0.0)], 0.0)
                    else:
                        family.add_metric(labels, shape["value"] or 0.0)
            yield family

    # -- labels ----------------------------------------------------------------------------
    def _rank_labels(self, server: Server, dp_rank: int | None, tp_local: int) -> dict:
        cfg, p = server.cfg, self.profile
        dp = cfg.dp_size > 1
        per_dp = max(cfg.tp_size // cfg.dp_size, 1) if cfg.enable_dp_attention else cfg.tp_size
        tp_rank = (dp_rank or 0) * per_dp + tp_local if cfg.enable_dp_attention else tp_local
        values = {"model_name": cfg.model_name, "engine_type": self.engine_type,
                  "tp_rank": str(tp_rank), "pp_rank": "0", "moe_ep_rank": "0",
                  "dp_rank": str(dp_rank or 0)}
        out = {k: values[k] for k in p.scheduler_label_names(dp)}
        if self._priorities(server):  # the collector's own value; queue gauges add their own
            out["priority"] = ""
        return out

    def _priorities(self, server: Server) -> bool:
        """--enable-priority-scheduling: S and T families carry `priority` from 0.5.10."""
        return server.cfg.enable_priority_scheduling and self.profile.at_least("0.5.10")

    def _ranks_per_dp(self, server: Server) -> int:
        cfg = server.cfg
        return max(cfg.tp_size // cfg.dp_size, 1) if cfg.enable_dp_attention else cfg.tp_size

    # -- scheduler side --------------------------------------------------------------------
    def _scheduler_families(self, server: Server):
        p = self.profile
        reporting = [(s, self._rank_labels(server, s.dp_rank, 0)) for s in server.schedulers]
        for spec in GAUGES:
            if not p.at_least(spec.since) or (spec.until and p.at_least(spec.until)):
                continue
            labels = list(reporting[0][1]) + (["pid"] if spec.pid else [])
            family = GaugeMetricFamily(P + spec.name, spec.help, labels=labels)
            for sched, lab in reporting:
                if sched.has_reported:  # lazy: no samples before the first stats report
                    family.add_metric([*lab.values(), *([self._pid] if spec.pid else [])],
                                      spec.value(sched))
                    # A queue's total stays under priority=""; each priority seen so far gets
                    # its own series (0 once it has none), as SGLang's QueueCount writes them.
                    for priority, n in sched.reported.by_priority.get(spec.name, {}).items():
                        if "priority" in lab:
                            family.add_metric([*{**lab, "priority": str(priority)}.values()],
                                              float(n))
            if family.samples:
                yield family
        # Startup constants: emitted by every scheduler rank, from the start.
        every_rank = [self._rank_labels(server, s.dp_rank, r) for s in server.schedulers
                      for r in range(self._ranks_per_dp(server))]
        for spec in CONSTANTS:
            if p.at_least(spec.since):
                family = GaugeMetricFamily(P + spec.name, spec.help, labels=list(every_rank[0]))
                for lab in every_rank:
                    family.add_metric(list(lab.values()), spec.value(server))
                yield family
        if p.at_least("0.5.7"):
            family = CounterMetricFamily(P + "realtime_tokens", "Tokens processed, by mode.",
                                         labels=[*reporting[0][1], "mode"])
            for sched, lab in reporting:
                c = sched.counters
                for mode, key in (("prefill_compute", "realtime_prefill_compute"),
                                  ("prefill_cache", "realtime_prefill_cache"),
                                  ("decode", "realtime_decode")):
                    family.add_metric([*lab.values(), mode], c[key])
            yield family
            if any(s.retracted_ever for s in server.schedulers):  # lazy, from the first one
                for name, key, help_ in (
                    ("num_retracted_requests", "retracted_requests", "Retracted requests."),
                    ("num_retracted_input_tokens", "retracted_input_tokens",
                     "Input tokens of retracted requests."),
                    ("num_retracted_output_tokens", "retracted_output_tokens",
                     "Output tokens of retracted requests."),
                ):
                    family = CounterMetricFamily(P + name, help_, labels=list(reporting[0][1]))
                    for sched, lab in reporting:
                        family.add_metric(list(lab.values()), sched.counters[key])
                    yield family
        # prefill_effective_tokens_total since 0.5.18, scheduler_idle_seconds_total since
        # 0.5.20 (metrics_collector.py @ v0.5.18, v0.5.20); both pre-seeded on every rank.
        every_lab = [(sched, list(self._rank_labels(server, sched.dp_rank, r).values()))
                     for sched in server.schedulers for r in range(self._ranks_per_dp(server))]
        if p.at_least("0.5.18"):
            eff = CounterMetricFamily(P + "prefill_effective_tokens", "Prefill tokens by source.",
                                      labels=[*every_rank[0], "mode"])
            for sched, lab in every_lab:
                c = sched.counters
                for mode, value in (("input", c["prefill_input"]),
                                    ("device_hit", c["prefill_device_hit"]),
                                    ("host_hit", c["prefill_host_hit"]),
                                    ("storage_hit", 0.0)):
                    eff.add_metric([*lab, mode], value)
            yield eff
        yield from self._radix_cache_families(server)
        if p.at_least("0.5.20"):
            idle = CounterMetricFamily(P + "scheduler_idle_seconds", "Scheduler idle time.",
                                       labels=list(every_rank[0]))
            for sched, lab in every_lab:
                idle.add_metric(lab, sched.counters["idle_seconds"])
            yield idle
        if p.at_least("0.5.3"):
            family = HistogramMetricFamily(P + "queue_time_seconds",
                                           "Time spent in the waiting queue.",
                                           labels=list(reporting[0][1]))
            stage = HistogramMetricFamily(P + "per_stage_req_latency_seconds",
                                          "Per-stage request latency.",
                                          labels=[*reporting[0][1], "stage"])
            for sched, lab in reporting:
                if sched.queue_time.count:
                    _add_histogram(family, list(lab.values()), sched.queue_time)
                for stage_name, hist in sched.per_stage.items():
                    if hist.count and stage_name in p.per_stage_stages:
                        _add_histogram(stage, [*lab.values(), stage_name], hist)
            if family.samples:
                yield family
            if stage.samples:
                yield stage

    def _radix_cache_families(self, server: Server):
        """The radix cache's collector (one per scheduler rank), HiCache's host pool and
        the LoRA pool gauges."""
        p, cfg = self.profile, server.cfg
        hicache = cfg.enable_hierarchical_cache
        reporting = [(s, self._rank_labels(server, s.dp_rank, 0)) for s in server.schedulers]
        gauges = []
        if cfg.enable_lora and p.at_least("0.5.7"):
            # Set at prefill and decode reports (metrics_reporter.py _update_lora_metrics).
            gauges += [
                ("lora_pool_slots_used", "Number of LoRA adapters in the running batch.",
                 lambda s: s.reported.lora_slots_used),
                ("lora_pool_slots_total", "Number of LoRA adapter slots (max_loras_per_batch).",
                 lambda s: s.cfg.max_loras_per_batch),
                ("lora_pool_utilization", "LoRA adapter slots in use over the total.",
                 lambda s: s.reported.lora_slots_used / s.cfg.max_loras_per_batch)]
        if hicache and p.at_least("0.5.10"):
            gauges += [
                ("hicache_host_used_tokens",
                 "Number of tokens currently used in the host KV cache.",
                 lambda s: s.reported.host_used_tokens),
                ("hicache_host_total_tokens", "Total capacity of the host KV cache in tokens.",
                 lambda s: s.host.total)]
        for name, help_, value in gauges:  # lazy, like the other scheduler gauges
            family = GaugeMetricFamily(P + name, help_, labels=list(reporting[0][1]))
            for sched, lab in reporting:
                if sched.has_reported:
                    family.add_metric(list(lab.values()), float(value(sched)))
            if family.samples:
                yield family
        if not p.at_least("0.5.6"):
            return
        # Labels: the cache class and the rank (0.5.21+); before, the class only, so the
        # ranks' identical counts add up in one series.
        cache_type = ("UnifiedRadixCache" if p.at_least("0.5.21") else "HiRadixCache") \
            if hicache else "RadixCache"
        per_rank = p.at_least("0.5.21")
        ranks = [(s, {"cache_type": cache_type,
                      **({"dp_rank": str(s.dp_rank or 0), "pp_rank": "0", "tp_rank": str(r)}
                         if per_rank else {})})
                 for s in server.schedulers
                 for r in (range(self._ranks_per_dp(server)) if per_rank else [0])]
        fold = 1 if per_rank else self._ranks_per_dp(server)
        names = list(ranks[0][1])
        # Bytes of one rank's KV shard per token: its KV memory over the device pool.
        shard_bytes = cfg.kv_cache_memory_gb * 1e9 / cfg.max_total_num_tokens

        def counter(name, help_, value, extra=None):
            extra = extra or {}
            family = CounterMetricFamily(P + name, help_, labels=[*names, *extra])
            for sched, lab in ranks:
                family.add_metric([*lab.values(), *extra.values()], value(sched) * fold)
            return family

        yield counter("evicted_tokens", "The number of device KV token slots freed by eviction.",
                      lambda s: s.counters["evicted"])
        if not hicache:
            return
        pool = {"pool": "kv"} if p.at_least("0.5.18") else {}
        yield counter("load_back_tokens", "Tokens loaded back from host to device.",
                      lambda s: s.host.counters["load_back"], pool)
        if not p.at_least("0.5.18"):
            return
        yield counter("load_back_bytes", "Bytes loaded back from host to device.",
                      lambda s: s.host.counters["load_back"] * shard_bytes)
        yield counter("hicache_backup_tokens", "Tokens backed up from device to host.",
                      lambda s: s.host.counters["backup"], pool)
        yield counter("hicache_backup_bytes", "Bytes backed up from device to host.",
                      lambda s: s.host.counters["backup"] * shard_bytes)
        reasons = ["host_pressure"] + ([] if cfg.hicache_write_policy == "write_back"
                                       else ["write_through_unbacked_eviction"])
        dropped = CounterMetricFamily(
            P + "hicache_dropped_tokens",
            "Device KV tokens destroyed without a host backup.",
            labels=[*names, "reason", "pool"])
        for sched, lab in ranks:
            for reason in reasons:
                dropped.add_metric([*lab.values(), reason, "kv"],
                                   sched.host.counters[f"dropped_{reason}"] * fold)
        yield dropped

    # -- tokenizer side ----------------------------------------------------------------------
    def _tokenizer_families(self, server: Server):
        p, tk, cfg = self.profile, server.tokenizer, server.cfg
        if not tk.touched:
            return
        # With priority scheduling the T families carry `priority`: each request's own for the
        # families counted per request (as split by TokenizerStats.split), "" for the others
        # (the collector's own value; the goldens' traffic sent no priority).
        priorities = self._priorities(server)
        base_names = list(p.tokenizer_label_names()) + (["priority"] if priorities else [])
        base = {"model_name": cfg.model_name, "engine_type": self.engine_type, "priority": ""}
        base_values = [base[n] for n in base_names]
        split = p.streaming_label

        def variants(values: dict, by_stream: bool = True) -> list[tuple[list[str], object]]:
            """(label values, the values of that series) of each (streaming, priority) series."""
            grouped: dict[tuple[str, str], list] = {}
            for (streaming, prio), value in values.items():
                key = ("true" if streaming else "false") if split and by_stream else "", prio
                grouped.setdefault(key if priorities else (key[0], ""), []).append(value)
            out = []
            for (stream, prio), parts in sorted(grouped.items()):
                labels = [prio if n == "priority" else base[n] for n in base_names]
                out.append((labels + ([stream] if split and by_stream else []), parts))
            return out

        s_labels = ["is_streaming"] if split else []
        for name, values, help_ in (
            ("prompt_tokens", tk.prompt_tokens, "Number of prefill tokens processed."),
            ("generation_tokens", tk.generation_tokens, "Number of generation tokens processed."),
            ("num_requests", tk.requests, "Number of requests processed."),
        ):
            if name == "num_requests" and not p.at_least("0.4.3.post4"):
                continue
            family = CounterMetricFamily(P + name, help_, labels=base_names + s_labels)
            # Before the first finished request: a 0 under the base labels where there is no
            # is_streaming split (releases before 0.5.17), nothing where there is.
            for labels, parts in variants(values) or ([] if split else [(base_values, [0.0])]):
                family.add_metric(labels, sum(parts))
            yield family
        cached = CounterMetricFamily(
            P + "cached_tokens", "Number of cached prompt tokens.",
            labels=base_names + (["cache_source"] if p.cache_source_label else []))
        if not p.cache_source_label:
            cached.add_metric(base_values, tk.cached_tokens)
        else:  # the scheduler's breakdown: host hits with HiCache on
            cached.add_metric(base_values + ["device"], tk.cached_tokens - tk.cached_host_tokens)
            if cfg.enable_hierarchical_cache:
                cached.add_metric(base_values + ["host"], tk.cached_host_tokens)
        yield cached
        if p.at_least("0.5.13") and tk.spec_verify_calls:  # from the first verified request
            verify = CounterMetricFamily(P + "spec_verify_calls",
                                         "Number of speculative decoding verification calls.",
                                         labels=base_names)
            verify.add_metric(base_values, tk.spec_verify_calls)
            yield verify
        if tk.so_requests:  # from the first finished request with a grammar
            so = CounterMetricFamily(P + "num_so_requests",
                                     "Number of structured output requests processed.",
                                     labels=base_names)
            so.add_metric(base_values, tk.so_requests)
            yield so
        if p.at_least("0.4.7"):
            aborted = CounterMetricFamily(P + "num_aborted_requests", "Aborted requests.",
                                          labels=base_names)
            aborted.add_metric(base_values, tk.aborted)
            yield aborted
        if p.at_least("0.5.7"):  # HTTP middleware: every finished request was a 200
            finished = float(sum(tk.requests.values()))
            requests = CounterMetricFamily(P + "http_requests", "HTTP requests.",
                                           labels=["endpoint", "method"])
            requests.add_metric(["/v1/chat/completions", "POST"], finished)
            responses = CounterMetricFamily(P + "http_responses", "HTTP responses.",
                                            labels=["endpoint", "method", "status_code"])
            responses.add_metric(["/v1/chat/completions", "POST", "200"], finished)
            yield requests
            yield responses
        histograms = [
            ("time_to_first_token_seconds", "ttft", "Time to first token.", split, "0.3.6"),
            ("inter_token_latency_seconds", "itl", "Inter-token latency.", False, "0.4.3.post4"),
            ("e2e_request_latency_seconds", "e2e", "End-to-end request latency.", split,
             "0.3.6"),
            ("request_time_per_output_token_seconds", "request_tpot",
             "Per-request time per output token.", split, "0.5.23"),
            ("prompt_tokens_histogram", "prompt_tokens", "Prompt tokens per request.", False,
             "0.5.12"),
            ("generation_tokens_histogram", "generation_tokens", "Generated tokens per request.",
             False, "0.5.12"),
            ("uncached_prompt_tokens_histogram", "uncached_prompt_tokens",
             "Uncached prompt tokens per request.", False, "0.5.12"),
        ]
        for name, key, help_, by_stream, since in histograms:
            if not p.at_least(since):
                continue
            family = HistogramMetricFamily(P + name, help_,
                                           labels=base_names + (s_labels if by_stream else []))
            ours = {sp: h for (k, sp), h in tk.histograms.items() if k == key}
            for labels, parts in variants(ours, by_stream):
                merged = Histogram.merged(parts)
                if merged is not None:
                    _add_histogram(family, labels, merged)
            if family.samples:
                yield family


def _add_histogram(family: HistogramMetricFamily, labels: list[str], hist: Histogram) -> None:
    bounds = _bound_labels(hist.bounds)
    buckets = [(b, c) for b, (_, c) in zip(bounds, hist.cumulative(), strict=True)]
    family.add_metric(labels, buckets, hist.sum)


@functools.cache
def _bound_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """The `le` values of a histogram's buckets, +Inf last (written once per bucket set)."""
    return (*(floatToGoString(b) for b in bounds), "+Inf")
