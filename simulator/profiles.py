"""Release profiles: what an SGLang release exposes (names, labels, buckets, endpoints).

Facts from the SGLang reference (metric catalogue, label history, bucket history). A profile
answers "since which release" questions with `at_least`, so the exposition code reads like the
reference's "since" column.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@functools.cache  # asked on every scrape of every family
def _version(text: str) -> tuple[int, ...]:
    parts = text.replace(".post", ".").split(".")
    return tuple(int(p) for p in parts) + (0,) * (4 - len(parts))


TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)
E2E_BUCKETS_0_4_5 = (*E2E_BUCKETS[:18], 800)  # 0.4.5-0.5.1: current up to 400, then 800
QUEUE_BUCKETS = (0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20,
                 *range(30, 101, 10), *range(200, 1001, 100), *range(1200, 2001, 200), 2500, 3000)
# Before 0.5.12: no sub-100 ms bounds (0.5.5's own collector, conformance/goldens/0.5.5).
QUEUE_BUCKETS_0_5_3 = (0, *QUEUE_BUCKETS[5:])
PER_STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, *range(2000, 10001, 1000),
                 *range(12500, 30001, 2500), 35000, 40000, 60000, 80000, 1e5, 2e5, 3e5, 4e5, 6e5,
                 8e5, 1e6, 1.1e6)


@dataclass(frozen=True)
class Profile:
    release: str

    @property
    def version(self) -> tuple[int, ...]:
        return _version(self.release)

    def at_least(self, release: str) -> bool:
        return self.version >= _version(release)

    # -- labels (reference §3) -------------------------------------------------------------
    def scheduler_label_names(self, dp: bool) -> tuple[str, ...]:
        names = ["model_name"]
        if self.at_least("0.4.3.post4"):
            names.append("engine_type")
        if self.at_least("0.4.10.post2"):
            names += ["tp_rank", "pp_rank"]
        if self.at_least("0.5.7"):
            names.append("moe_ep_rank")
        if dp and self.at_least("0.4.10.post2"):
            names.append("dp_rank")
        return tuple(names)

    def tokenizer_label_names(self) -> tuple[str, ...]:
        return ("model_name", "engine_type") if self.at_least("0.5.12") else ("model_name",)

    @property
    def streaming_label(self) -> bool:
        return self.at_least("0.5.17")

    @property
    def cache_source_label(self) -> bool:
        return self.at_least("0.5.9")

    # -- buckets (reference §6) ------------------------------------------------------------
    @property
    def ttft_buckets(self) -> tuple[float, ...]:
        return TTFT_BUCKETS

    @property
    def e2e_buckets(self) -> tuple[float, ...]:
        return E2E_BUCKETS if self.at_least("0.5.2") else E2E_BUCKETS_0_4_5

    @property
    def queue_buckets(self) -> tuple[float, ...]:
        return QUEUE_BUCKETS if self.at_least("0.5.12") else QUEUE_BUCKETS_0_5_3

    # -- behaviour -------------------------------------------------------------------------
    @property
    def decode_report_zeroes_cache_hit_rate(self) -> bool:
        return not self.at_least("0.5.20")  # up to 0.5.19 every decode report set it to 0

    @property
    def load_endpoint(self) -> str:
        """'v1_loads' (0.5.8+), 'get_load_list' (0.5.3+), 'get_load_int' (0.4.7+), 'none'."""
        if self.at_least("0.5.8"):
            return "v1_loads"
        if self.at_least("0.5.3"):
            return "get_load_list"
        if self.at_least("0.4.7"):
            return "get_load_int"
        return "none"

    @property
    def has_get_load(self) -> bool:
        return self.at_least("0.4.7") and not self.at_least("0.5.23")

    @property
    def has_server_info_route(self) -> bool:
        return self.at_least("0.5.6")

    @property
    def has_ready_route(self) -> bool:
        return self.at_least("0.5.20")

    # -- per-request records and per-stage latency (docs/request-records.md) -----------------
    @property
    def request_records(self) -> str | None:
        """Which tokenizer manager writes --export-metrics-to-file records: None before 0.5.6
        (no such flag), "0.5.6" for 0.5.6-0.5.9 (managers/, timing fields *_ts), "later" from
        0.5.10 (observability/req_time_stats.py: forward_entry_time, prefill_finished_time)."""
        if not self.at_least("0.5.6"):
            return None
        return "0.5.6" if not self.at_least("0.5.10") else "later"

    @property
    def per_stage_stages(self) -> tuple[str, ...]:
        """Stage label values of per_stage_req_latency_seconds a unified (non-PD) server
        reports: none before 0.5.3; request_process joins prefill_forward and chunked_prefill
        by 0.5.12 (the enum of managers/schedule_batch.py, later req_time_stats.py)."""
        if not self.at_least("0.5.3"):
            return ()
        if self.at_least("0.5.12"):
            return ("request_process", "prefill_forward", "chunked_prefill")
        return ("prefill_forward", "chunked_prefill")


ALIASES = {
    "0.4": "0.4.6.post5",
    "0.4.6": "0.4.6.post5",
    "0.4.6.post5": "0.4.6.post5",
    "0.5.5": "0.5.5",
    "0.5.12": "0.5.12",
    "0.5.23": "0.5.23",
}
RELEASES = ("0.4.6.post5", "0.5.5", "0.5.12", "0.5.23")


def profile(release: str) -> Profile:
    try:
        return Profile(ALIASES[release])
    except KeyError:
        raise ValueError(
            f"unknown release {release!r}; choose one of {', '.join(sorted(ALIASES))}"
        ) from None
