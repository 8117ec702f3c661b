"""The states every server is classified into, in code order (the recording rule's value is
the index), with the colour each is drawn in by dashboards, renders and snapshot charts."""

from __future__ import annotations

STATES = ("unavailable", "idle", "healthy", "prefill_backlog", "decode_contention",
          "kv_capacity", "scheduling_bottleneck")
STATE_COLOURS = {"unavailable": "#7f7f7f", "idle": "#c7c7c7", "healthy": "#2ca02c",
                 "prefill_backlog": "#ff7f0e", "decode_contention": "#d62728",
                 "kv_capacity": "#9467bd", "scheduling_bottleneck": "#e6b800"}

# A prefill/decode deployment (docs/pd.md) is read as a request flows: the gateway, the prefill
# pool, the KV transfer between them, the decode pool. Each has its own state; the deployment's
# verdict is the first state by PD_PRIORITY (the cause before the symptoms it produces), and its
# alert is the deployment's one notification.
PD_POOLS = ("gateway", "prefill", "transfer", "decode")
PD_STATES = ("unavailable", "idle", "healthy", "kv_transfer_failing", "worker_circuit_open",
             "routing_skew", "kv_transfer_bottleneck", "decode_pool_contention",
             "prefill_pool_backlog")
# The pool each state belongs to.
PD_STATE_POOL = {"kv_transfer_failing": "transfer", "worker_circuit_open": "gateway",
                 "routing_skew": "gateway", "kv_transfer_bottleneck": "transfer",
                 "decode_pool_contention": "decode", "prefill_pool_backlog": "prefill"}
# Causes first: a failing transfer or an open breaker makes the others' symptoms; skew overloads
# one decode worker; a slow transfer or a full decode pool holds prefilled KV and backs up the
# prefill pool.
PD_PRIORITY = ("unavailable", "kv_transfer_failing", "worker_circuit_open", "routing_skew",
               "kv_transfer_bottleneck", "decode_pool_contention", "prefill_pool_backlog",
               "idle", "healthy")
PD_STATE_COLOURS = {**{k: v for k, v in STATE_COLOURS.items() if k in PD_STATES},
                    "kv_transfer_failing": "#8c564b", "worker_circuit_open": "#e377c2",
                    "routing_skew": "#17becf", "kv_transfer_bottleneck": "#bcbd22",
                    "decode_pool_contention": "#d62728", "prefill_pool_backlog": "#ff7f0e"}
