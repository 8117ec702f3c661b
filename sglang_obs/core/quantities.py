"""One definition per quantity a person reads: what is measured, by which statistic, over which
window, and (where Prometheus computes it) the recording rule that does.

A number never stands alone on a surface: the glance page, the alerts' descriptions, the
dashboards' legends, the snapshot report and compare print it under its quantity's `label`.
"TTFT p95 over 5 min" (the recording rule: the alerts, dashboards, snapshot and compare),
"TTFT mean per 10 s" (the glance page's sparkline, from the exporter's own polls) and "TTFT mean
since the server started" (the page's baseline) are three quantities that may differ fifty-fold
at one moment; each surface says which one it shows. tests/test_one_truth.py renders the
surfaces from one scenario moment and checks that a quantity shown on two of them has the same
label and the same value there.
"""

from __future__ import annotations

from dataclasses import dataclass

QUANTILE_WINDOW = "5m"  # the recording rules' latency quantiles and means
QUANTILE_WINDOW_WORDS = "over 5 min"
SPARK_SLOT_SECONDS = 10.0  # one point of the glance page's sparklines
USUAL_WINDOW = "1h"  # the decode-speed baseline the state classification compares against


@dataclass(frozen=True)
class Quantity:
    key: str
    subject: str  # what is measured: "TTFT"
    statistic: str = ""  # "p95", "mean", "max"; empty for an instant value
    window: str = ""  # "over 5 min", "since the server started"
    record: str = ""  # the recording rule that computes it, where Prometheus does

    @property
    def qualifier(self) -> str:
        """Statistic and window: a legend beside a panel titled with the subject."""
        return " ".join(p for p in (self.statistic, self.window) if p)

    @property
    def label(self) -> str:
        return " ".join(p for p in (self.subject, self.qualifier) if p)


# SGLang's latency histograms: subject -> the histogram's name after `sglang:`.
LATENCIES = {
    "TTFT": "time_to_first_token_seconds",
    "ITL": "inter_token_latency_seconds",
    "E2E latency": "e2e_request_latency_seconds",
    "Queue time": "queue_time_seconds",
}
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def _latency_quantities() -> dict[str, Quantity]:
    out = {}
    for subject, hist in LATENCIES.items():
        short = hist.removesuffix("_seconds")
        for name, _ in QUANTILES:
            key = f"{short}_{name}_{QUANTILE_WINDOW}"
            out[key] = Quantity(key, subject, name, QUANTILE_WINDOW_WORDS,
                                f"instance_model:sglang_{hist}:{name}_{QUANTILE_WINDOW}")
        key = f"{short}_mean_{QUANTILE_WINDOW}"
        out[key] = Quantity(key, subject, "mean", QUANTILE_WINDOW_WORDS,
                            f"instance_model:sglang_{hist}:mean_{QUANTILE_WINDOW}")
    return out


def _window_quantities() -> dict[str, Quantity]:
    """`sglang-obs compare`'s and what-if's: each over a whole window they compare (its
    minutes' histograms added up, its samples pooled), no recording rule."""
    out = {}
    stats = [(subject, hist.removesuffix("_seconds"), stat) for subject, hist in LATENCIES.items()
             for stat in ("p50", "p95", "mean")]
    stats += [("Decode speed per request", "decode_speed", stat) for stat in ("p10", "p50")]
    for subject, short, stat in stats:
        key = f"{short}_{stat}_window"
        out[key] = Quantity(key, subject, stat, "over the window")
    # cached over prompt tokens of the requests finished in the window
    out["cache_hit_ratio_window"] = Quantity("cache_hit_ratio_window", "Prefix cache hit ratio",
                                             "", "over the window")
    return out


# The energy, cost and capacity figures over a window (snapshot, compare, `sglang-obs
# capacity`): each computed from the energy records (sglang_obs/render/energy_rules.py) and the
# rate records sampled over the window (docs/capacity.md says how), no recording rule of its own.
TOKEN_MODES = {"prefill_compute": "Prefill tokens computed",
               "prefill_cache": "Prefill tokens from the prefix cache",
               "decode": "Output tokens"}


def _capacity_quantities() -> dict[str, Quantity]:
    out = {}
    for key, subject, stat in (
            ("gpu_power", "GPU power", "mean"),
            ("energy_per_prompt_token", "Energy per prompt token", ""),
            ("energy_per_output_token", "Energy per output token", ""),
            ("idle_energy_share", "Share of GPU energy spent idle (1 h)", "mean"),
            ("cache_saved_power", "Upper bound of the power the prefix cache saves", "mean"),
            ("cost_per_million_prompt_tokens", "Cost per million prompt tokens", ""),
            ("cost_per_million_output_tokens", "Cost per million output tokens", ""),
            ("ttft_slo_attainment", "TTFT SLO attainment", ""),
            ("itl_slo_attainment", "ITL SLO attainment", ""),
            ("request_rate", "Request rate", "mean"),
            ("token_rate", "Prompt and output tokens per second", "mean")):
        out[f"{key}_window"] = Quantity(f"{key}_window", subject, stat, "over the window")
    for mode, subject in TOKEN_MODES.items():
        key = f"tokens_per_gpu_{mode}"
        out[f"{key}_window"] = Quantity(f"{key}_window", f"{subject} per second per GPU", "mean",
                                        "over the window")
        out[f"{key}_peak"] = Quantity(f"{key}_peak", f"{subject} per second per GPU",
                                      "peak 5 min rate", "in the window")
    # The load a server carried at one moment: the 5 min rates the headroom compares.
    out["request_rate_5m"] = Quantity("request_rate_5m", "Request rate", "", QUANTILE_WINDOW_WORDS)
    out["token_rate_5m"] = Quantity("token_rate_5m", "Prompt and output tokens per second", "",
                                    QUANTILE_WINDOW_WORDS)
    return out


def _spark_window() -> str:
    return f"per {SPARK_SLOT_SECONDS:g} s"


QUANTITIES: dict[str, Quantity] = {
    **_latency_quantities(),
    **_window_quantities(),
    **_capacity_quantities(),
    # The glance page's own, from the exporter's polls of SGLang's counters.
    "ttft_mean_slot": Quantity("ttft_mean_slot", "TTFT", "mean", _spark_window()),
    "ttft_mean_since_start": Quantity("ttft_mean_since_start", "TTFT", "mean",
                                      "since the server started"),
    "e2e_request_latency_mean_since_start": Quantity(
        "e2e_request_latency_mean_since_start", "E2E latency", "mean",
        "since the server started"),
    "arrivals_last_minute": Quantity("arrivals_last_minute", "Arrivals", "",
                                     "in the last minute"),
    # Its GPUs' energy, as the energy records define it (sglang_obs/render/energy_rules.py),
    # over the exporter's own last minute of polls instead of 5 min of scrapes.
    "gpu_power_now": Quantity("gpu_power_now", "GPU power", "", "now"),
    "energy_per_output_token_last_minute": Quantity(
        "energy_per_output_token_last_minute", "Energy per output token", "",
        "in the last minute"),
    # The state classification's inputs: the exporter's derived signals, recorded by the rules.
    "decode_speed": Quantity("decode_speed", "Decode speed per request", "", "now",
                             "instance:sglang_decode_speed_per_request:max"),
    "decode_speed_usual": Quantity("decode_speed_usual", "Decode speed per request", "p90",
                                   "over 1 h",
                                   f"instance:sglang_decode_speed_per_request:p90_{USUAL_WINDOW}"),
    "prefill_backlog": Quantity("prefill_backlog", "Prompt tokens waiting for prefill", "", "now",
                                "instance:sglang_prefill_backlog_tokens:max"),
    "kv_occupancy": Quantity("kv_occupancy", "KV occupancy", "", "now",
                             "instance:sglang_kv_occupancy:ratio"),
    "queue_continuous": Quantity("queue_continuous", "Continuous queueing", "", "now",
                                 "instance:sglang_queue_nonempty_duration_seconds:max"),
    "running": Quantity("running", "Running requests", "", "now",
                        "instance:sglang_running_requests:max"),
    "waiting": Quantity("waiting", "Waiting requests", "", "now",
                        "instance:sglang_waiting_requests:max"),
}


def q(key: str) -> Quantity:
    return QUANTITIES[key]

