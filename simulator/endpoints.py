"""JSON answers of SGLang's status endpoints for a simulated server, per release (reference §9).

/server_info and /get_server_info, /v1/loads and /get_load, /v1/models. Shapes change across
releases exactly where the exporter must cope with them: the effective max_running_requests
appears in 0.5.8, /v1/loads in 0.5.8, /get_load disappears in 0.5.23.
"""

from __future__ import annotations

import time
from typing import Any

from sglang_obs.simulator.model import Server
from sglang_obs.simulator.profiles import Profile


def server_info(server: Server, profile: Profile) -> dict[str, Any]:
    cfg = server.cfg
    states = []
    for s in server.schedulers:
        state: dict[str, Any] = {"last_gen_throughput": s.reported.gen_throughput}
        if cfg.speculative_algorithm:
            state["avg_spec_accept_length"] = (s.reported.spec_accept_length
                                               or cfg.spec_accept_length)
        if profile.at_least("0.4.7") and not profile.at_least("0.5.3"):
            state["load"] = len(s.running) + len(s.waiting)
        if profile.at_least("0.5.5"):
            state["memory_usage"] = {"weight": cfg.weight_memory_gb,
                                     "kvcache": cfg.kv_cache_memory_gb,
                                     "token_capacity": cfg.max_total_num_tokens,
                                     "graph": 1.2}
        if profile.at_least("0.5.8"):
            state["effective_max_running_requests_per_dp"] = cfg.max_running_requests
        states.append(state)
    info: dict[str, Any] = {
        "model_path": cfg.model_path,
        "served_model_name": cfg.model_name,
        "tp_size": cfg.tp_size,
        "dp_size": cfg.dp_size,
        "pp_size": 1,
        "ep_size": 1,
        "enable_dp_attention": cfg.enable_dp_attention,
        # The CLI value: null unless given. The effective one is in internal_states.
        "max_running_requests": None,
        "max_total_num_tokens": cfg.max_total_num_tokens,
        "max_req_input_len": cfg.context_length - 1,
        "context_length": cfg.context_length,
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "max_prefill_tokens": cfg.max_prefill_tokens,
        "schedule_policy": cfg.schedule_policy,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "mem_fraction_static": cfg.mem_fraction_static,
        "num_continuous_decode_steps": cfg.num_continuous_decode_steps,
        "speculative_algorithm": cfg.speculative_algorithm,
        "grammar_backend": cfg.grammar_backend,
        "enable_mixed_chunk": cfg.effective_mixed_chunk,
        "disaggregation_mode": "null",
        "decode_log_interval": cfg.decode_log_interval,
        "enable_metrics": True,
        "internal_states": states,
        "version": profile.release,
    }
    if profile.at_least("0.5.23"):
        info["launch_command"] = (f"python -m sglang.launch_server --model-path {cfg.model_path}"
                                  f" --tp {cfg.tp_size} --enable-metrics")
        info["startup_time"] = server.started_at
        info["frontend"] = "http"
    return info


def loads(server: Server, profile: Profile) -> dict[str, Any] | list[Any]:
    """The load endpoint's payload in the release's shape (see Profile.load_endpoint)."""
    kind = profile.load_endpoint
    if kind == "get_load_int":
        return {"load": sum(len(s.running) + len(s.waiting) for s in server.schedulers)}
    entries = []
    for i, s in enumerate(server.schedulers):
        used = s.used_tokens
        entry: dict[str, Any] = {"dp_rank": s.dp_rank if s.dp_rank is not None else i}
        if kind == "get_load_list":
            entry.update(num_reqs=len(s.running) + len(s.waiting), num_waiting_reqs=len(s.waiting),
                         num_tokens=used)
        else:
            entry.update(
                timestamp=time.time(), num_running_reqs=len(s.running),
                num_waiting_reqs=len(s.waiting), num_waiting_uncached_tokens=s.pending_tokens,
                num_used_tokens=used, num_total_tokens=used + s.pending_tokens,
                max_total_num_tokens=s.cfg.max_total_num_tokens,
                max_running_requests=s.cfg.max_running_requests,
                token_usage=round(used / s.cfg.max_total_num_tokens, 4),
                gen_throughput=s.reported.gen_throughput,
                cache_hit_rate=s.reported.cache_hit_rate, utilization=0.0,
                queues={"waiting": len(s.waiting), "grammar": len(s.grammar), "paused": 0,
                        "retracted": s.reported.retracted_since_last, "prealloc_ready": 0})
        entries.append(entry)
    if kind == "get_load_list":
        return entries
    return {"timestamp": time.time(), "version": profile.release,
            "accelerator": server.cfg.gpu_name, "num_accelerators": server.cfg.tp_size,
            "loads": entries}


def get_load_shim(server: Server, profile: Profile) -> list[Any]:
    """/get_load on 0.5.12-0.5.20: a shim over /v1/loads that adds num_pending_tokens."""
    payload = loads(server, profile)
    assert isinstance(payload, dict)
    out = []
    for entry in payload["loads"]:
        out.append({**entry, "num_reqs": entry["num_running_reqs"] + entry["num_waiting_reqs"],
                    "num_pending_tokens": entry["num_waiting_uncached_tokens"]})
    return out


def models(server: Server) -> dict[str, Any]:
    cfg = server.cfg
    return {"object": "list", "data": [{
        "id": cfg.model_name, "object": "model", "created": int(server.start_ts),
        "owned_by": "sglang", "root": cfg.model_name, "parent": None,
        "max_model_len": cfg.context_length}]}
