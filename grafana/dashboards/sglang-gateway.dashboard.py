"""SGLang gateway (uid sglang-gateway): the model gateway (smg) in front of a prefill/decode
deployment (docs/pd.md): what it routes and fails, where its traffic goes, the health and circuit
breaker of each worker, and the time to first token as the gateway sees it.

The gateway's own series (smg_*) come from its scrape job (thresholds.yml selectors.gateway_job);
its `worker` label is the engine's URL, `http://` + the engine's `instance`. Its selection
counter has no worker label, so the traffic each engine serves is the engine's own count
(instance:sglang_pd_requests:rate2m). Reading guide:
- a breaker open (red) on one worker and its pool's traffic moving to the others: the gateway
  took the worker out (worker_circuit_open);
- retries rising with the error ratio flat: the gateway hides failures, at the cost of TTFT;
- the gateway's TTFT far above the engines' (the gap): time spent before the decode side sees
  the request (routing, retries, the prefill leg).
"""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d

D, GW = d.DEPLOYMENT, d.GATEWAY
ERROR_RATIO = float(d.ALERTS["request_error_ratio"])
TTFT_LE = d.slo_le("ttft")
TTFT_LINE = d.steps("green", (d.slo_seconds("ttft"), "red"))
PD_LINK = d.data_links("sglang-pd", "PD deployment dashboard of this cluster")
SERVER_LINK = d.data_links("sglang-overview", "Overview of this server", ("cluster", "instance"))
WORKER = "cluster, worker"

traffic = [
    d.linked(d.state_timeline(
        "Gateway state",
        "The gateway's state in its deployment (pool:sglang_pd_state:code, pool gateway): "
        "worker_circuit_open or routing_skew, else healthy; click for the PD dashboard.",
        [(f'max by (cluster, pool) (pool:sglang_pd_state:code{{{D}, pool="gateway"}})',
          "gateway {{cluster}}")],
        d.pd_state_mappings(), w=24, h=4), PD_LINK),
    d.timeseries("Requests routed",
                 "Requests the gateway routed per second (1 min rate).",
                 [(f"cluster:smg_router_requests:rate1m{{{D}}}", "routed {{cluster}}")],
                 d.REQ_PER_S, w=8, min_=0),
    d.timeseries("Error ratio",
                 "Share of routed requests the gateway answered with an error (1 min); line at "
                 f"the servers' request-error alert threshold, {ERROR_RATIO:g}.",
                 [(f"cluster:smg_router_errors:ratio1m{{{D}}}", "errors {{cluster}}")],
                 d.RATIO, w=8, min_=0, thresholds=d.steps("green", (ERROR_RATIO, "red"))),
    d.timeseries("Retries",
                 "Retries the gateway made per second, and requests that failed after every "
                 "retry (exhausted, dashed).",
                 [(f"cluster:smg_worker_retries:rate1m{{{D}}}", "retries {{cluster}}"),
                  (f"cluster:smg_worker_retries_exhausted:rate1m{{{D}}}",
                   "exhausted {{cluster}}")],
                 d.REQ_PER_S, w=8, min_=0, overrides=d.dashed("B")),
]

breakers = [
    d.state_timeline("Worker health",
                     "Each worker's health as the gateway's checks see it (smg_worker_health).",
                     [(f"max by ({WORKER}) (smg_worker_health{{{GW}}})", "{{worker}}")],
                     d.HEALTHY_UNHEALTHY, w=12, h=6),
    d.state_timeline("Circuit breaker state",
                     "Each worker's circuit breaker (smg_worker_cb_state): closed, open (no "
                     "traffic sent), half_open (probing); removed while a gone worker lingers.",
                     [(f"max by ({WORKER}) (smg_worker_cb_state{{{GW}}})", "{{worker}}")],
                     d.BREAKER_STATES, w=12, h=6),
    d.timeseries("Open breakers by pool",
                 "Workers whose breaker is open, per pool (worker:smg_worker_cb_open:bool joins "
                 "the worker URL to its engine); any is worker_circuit_open.",
                 [(f"sum by (cluster, pool) (worker:smg_worker_cb_open:bool{{{D}}})",
                   "{{pool}} {{cluster}}")],
                 d.COUNT, w=12, min_=0),
    d.timeseries("Breaker transitions",
                 "Circuit breaker state changes per second, by worker and the state entered.",
                 [(f"sum by ({WORKER}, to) (rate(smg_worker_cb_transitions_total{{{GW}}}"
                   "[$__rate_interval]))", "{{worker}} to {{to}}")],
                 d.OPS, w=12, min_=0, bars=True),
]

workers = [
    d.timeseries("Active requests per worker",
                 "Requests the gateway has in flight on each worker (smg_worker_requests_active).",
                 [(f"sum by ({WORKER}) (smg_worker_requests_active{{{GW}}})", "{{worker}}")],
                 d.COUNT, w=12, min_=0),
    d.linked(d.timeseries(
        "Requests per engine server",
        "Requests each prefill and decode server finished per second (the engine's own count, "
        "2 min rate): the traffic split; click a line for the server's overview.",
        [(f"instance:sglang_pd_requests:rate2m{{{D}}}", "{{role}} {{instance}}")],
        d.REQ_PER_S, w=12, min_=0), SERVER_LINK),
]

ttft = [
    d.linked(d.timeseries(
        "Gateway TTFT vs engine gap",
        "The gateway's end-to-end TTFT (prefill start to first decode token) and the part of "
        f"it the decode engines do not see (dashed), means over 1 min; SLO line at {TTFT_LE} s.",
        [(f"cluster:smg_pd_ttft_seconds:avg1m{{{D}}}", "gateway TTFT {{cluster}}"),
         (f"cluster:smg_router_ttft_gap_seconds:avg1m{{{D}}}",
          "gateway vs engine gap {{cluster}}")],
        d.SECONDS, w=12, thresholds=TTFT_LINE, overrides=d.dashed("B")), PD_LINK),
    d.timeseries("Gateway TTFT p90",
                 "p90 of the gateway's end-to-end TTFT from its histogram (smg_pd_ttft_seconds); "
                 f"SLO line at {TTFT_LE} s.",
                 [("histogram_quantile(0.9, sum by (cluster, le) (rate(smg_pd_ttft_seconds_bucket"
                   f"{{{GW}}}[$__rate_interval])))", "p90 {{cluster}}")],
                 d.SECONDS, w=12, min_=0, thresholds=TTFT_LINE),
]

dashboard = d.dashboard(
    "SGLang gateway", "sglang-gateway",
    "The model gateway of a prefill/decode deployment: requests, errors and retries, each "
    "worker's health and circuit breaker, the traffic split, and TTFT as the gateway sees it.",
    [
        ("Gateway state and traffic", "The gateway's state, what it routes, fails and retries.",
         traffic),
        ("Health and circuit breakers", "Health checks and breakers per worker.", breakers),
        ("Traffic per worker", "In-flight requests per worker and the requests each engine "
         "served.", workers),
        ("Time to first token", "TTFT as the gateway measures it, against the engines'.", ttft),
    ],
    variables=(d.DEPLOYMENT_CLUSTER,),
)
