"""How many servers each pool needs: the replica recommendation (docs/scaling.md).

Names first: the recording rules (sglang_obs/render/scaling_rules.py), the KEDA ScaledObject
and HPA objects (deploy/kubernetes), the dashboards, `sglang-obs capacity` and the simulator's
autoscaled replay read these constants, never a typed copy.

Every record is per pool, labels (cluster, pool): pool is "unified" for servers that are not
disaggregated, else the PD role ("prefill", "decode") as the PD records name it.
"""

from __future__ import annotations

BY = "cluster, pool"
POOLS = ("unified", "prefill", "decode")
SERVERS = "pool:sglang_replicas:count"  # servers of the pool that answer
LOAD = "pool:sglang_load_server_equivalents:avg2m"  # the pool's load, in servers at target
DESIRED = "pool:sglang_replicas:desired"  # ceil(LOAD), at least scaling.min_replicas
RECOMMENDED = "pool:sglang_replicas:recommended"  # DESIRED with hysteresis: what to run
