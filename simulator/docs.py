"""Regenerates the generated blocks of docs/simulator.md (`make generate`; a test checks them).

Blocks sit between `<!-- generated:NAME -->` and `<!-- end:NAME -->`: the scenario list, the
model parameters with their defaults, the seed 000 original-versus-tuned comparison, and
what-if's calibration against it (simulator/what_if.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sglang_obs.core.doc_blocks import replace_blocks
from sglang_obs.simulator import compare, what_if
from sglang_obs.simulator import scenario as scenarios
from sglang_obs.simulator.model import PerfModel, ServerConfig

PARAMETERS = {
    "model_name": "served model name (`model_name` label)",
    "model_path": "model path reported by /server_info",
    "tp_size": "tensor-parallel size: label copies of rank-0 series, GPUs in the feed",
    "dp_size": "data-parallel ranks, each its own scheduler, KV pool and queue",
    "enable_dp_attention": "DP attention: tp_rank labels are global across DP ranks",
    "max_total_num_tokens": "KV pool of one DP rank, in tokens",
    "context_length": "effective context length",
    "chunked_prefill_size": "token budget of one request chunk per prefill batch (-1: off)",
    "max_prefill_tokens": "token budget of one prefill batch",
    "max_running_requests": "running-batch limit per DP rank",
    "schedule_policy": "`fcfs` or `lpm` (longest cached prefix first)",
    "kv_cache_dtype": "reported only",
    "speculative_algorithm": "e.g. NEXTN; turns mixed chunk off",
    "spec_accept_length": "tokens per decode step per request (1 without speculation); a load "
                          "phase's `spec_accept_length` sets it for that phase's requests",
    "speculative_num_steps": "draft steps per verify (reported as `spec_num_steps`)",
    "speculative_num_draft_tokens": "tokens verified per request per step (the accept rate's "
                                    "denominator is this minus 1)",
    "enable_hierarchical_cache": "HiCache: a host-memory tier behind the device radix cache "
                                 "(its series appear only with it)",
    "hicache_ratio": "HiCache host pool over the device pool, in tokens",
    "hicache_write_policy": "`write_through` (copies queued as the cache takes tokens in) or "
                            "`write_back` (copied at eviction)",
    "enable_lora": "LoRA: a request's adapter must fit the running batch's adapters "
                   "(its series appear only with it)",
    "max_loras_per_batch": "LoRA: distinct adapters the running batch may hold; a request "
                           "whose adapter does not fit waits, and the queue behind it",
    "enable_mixed_chunk": "as given on the command line; the effective value is reported",
    "num_continuous_decode_steps": "decode steps per decode round",
    "decode_log_interval": "decode iterations between stats reports and Decode batch lines",
    "page_size": "KV page size (reported)",
    "gpu_name": "accelerator name in /v1/loads",
    "gpu_memory_total_gb": "per-GPU memory, for the GPU feed",
    "mem_fraction_static": "preallocated share of GPU memory (GPU feed: memory looks full)",
    "weight_memory_gb": "reported per GPU",
    "kv_cache_memory_gb": "reported per GPU",
    "prefill_overhead_s": "fixed cost of one prefill batch",
    "spec_draft_step_ratio": "speculative decoding: one draft step (its forward pass and its "
                             "token in the verify) as a share of a plain decode step: a step "
                             "of k drafts costs 1 + k x this",
    "spec_accept_steps": "the --speculative-num-steps the accept lengths were measured at, "
                         "when other than speculative_num_steps: each draft token accepted "
                         "with one chance, the lengths are rescaled to the steps",
    "prefill_s_per_token": "compute per new prompt token",
    "enable_priority_scheduling": "--enable-priority-scheduling: the waiting queue is ordered "
                                  "by request priority, then by arrival",
    "schedule_low_priority_values_first": "--schedule-low-priority-values-first: smaller "
                                          "priority values go first",
    "grammar_backend": "--grammar-backend (reported in /server_info; the compile times are "
                       "the scenario's)",
    "grammar_timeout_s": "SGLANG_GRAMMAR_TIMEOUT: seconds the head of the grammar queue waits "
                         "for its own grammar before it is aborted",
    "grammar_compile_workers": "structured output: the grammar backend's compilation threads",
    "hicache_load_s_per_token": "HiCache: seconds to load one host-tier token back to the "
                                "device, added to its prefill",
    "hicache_backup_tokens_per_s": "HiCache: device-to-host copy throughput; a token evicted "
                                   "before its copy is made is dropped",
    "prefill_s_per_token_context": "attention: extra seconds per new token per context token",
    "prefill_small_batch_tokens": "per-token cost x (1 + this / batch tokens): small chunks "
                                  "use the GPU less well",
    "prefill_batches_before_decode": "decode rounds interleave after this many prefill batches",
    "decode_overhead_s": "fixed cost of one decode step (weights read once)",
    "decode_s_per_request": "per running request",
    "decode_s_per_kv_token": "per KV token of the running batch (memory-bandwidth bound)",
}


def parameter_table() -> str:
    lines = ["| parameter | default | meaning |", "|---|---|---|"]
    for cls, section in ((ServerConfig, "server"), (PerfModel, "perf")):
        for f in dataclasses.fields(cls):
            lines.append(f"| `{section}.{f.name}` | `{f.default}` | {PARAMETERS[f.name]} |")
    return "\n".join(lines) + "\n"


def scenario_table() -> str:
    lines = ["| scenario | release | duration | ground truth | what it shows |",
             "|---|---|---|---|---|"]
    for name in scenarios.available():
        sc = scenarios.load(name)
        truth = ", ".join(f"{t.cls} {t.start:.0f}–{t.end:.0f} s" for t in sc.truth) or "—"
        text = " ".join(sc.description.split())
        lines.append(f"| `{name}` | {sc.release} | {sc.duration:.0f} s | {truth} | {text} |")
    return "\n".join(lines) + "\n"


BLOCKS = {
    "scenarios": scenario_table,
    "parameters": parameter_table,
    "comparison": lambda: compare.markdown(["long-context-incident",
                                            "long-context-incident-tuned"]),
    "what-if-calibration": what_if.calibration_table,
    "what-if-spec-calibration": what_if.spec_calibration_table,
    "what-if-hicache-calibration": what_if.hicache_calibration_table,
}


def render(text: str, doc: Path) -> str:
    return replace_blocks(text, {name: make() for name, make in BLOCKS.items()}, doc)
