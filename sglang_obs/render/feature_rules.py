"""The rules of the SGLang features a server may turn on (docs/features.md), from
thresholds.yml's `features:` section: each feature's signal from SGLang's counters, windowed,
and the alert an on-call can act on. rules.py places the groups in its files.

Every signal is a ratio of counter rates over a window, never a per-interval gauge: the gauge
is whatever the last report saw. A server without the feature has none of its series, so its
records and alerts are absent there (no zero to misread).
"""

from __future__ import annotations

from sglang_obs.core.times import duration_words

# Truth class of a simulator scenario (simulator/scenario.py) -> the alert that names it.
ALERTS = {
    "spec_collapsed": "SGLangSpeculativeDecodingCollapsed",
    "hicache_dropping": "SGLangHiCacheDroppingTokens",
    "grammar_backlog": "SGLangGrammarCompileBacklog",
}
BY = "sum by (cluster, host, instance, model_name)"
SPEC_ACCEPT = "instance_model:sglang_spec_accept_length:ratio_rate5m"
SPEC_ACCEPT_1M = "instance_model:sglang_spec_accept_length:ratio_rate1m"
SPEC_STEPS = "instance:sglang_spec_num_steps:max"
SPEC_PER_STEP = "instance_model:sglang_spec_accept_length_per_step:ratio"
SPEC_VERIFY_RATE = "instance_model:sglang_spec_verify_calls:rate5m"
INSTANCE = "sum by (cluster, host, instance)"
HICACHE_DROPPED = "instance:sglang_hicache_dropped:ratio_rate5m"
HICACHE_DROPPED_1M = "instance:sglang_hicache_dropped:ratio_rate1m"
HICACHE_EVICTED_1M = "instance:sglang_evicted_tokens:rate1m"
HICACHE_HOST_USED = "instance:sglang_hicache_host_used:ratio"
GRAMMAR_QUEUE_1M = "instance:sglang_grammar_queue_reqs:avg1m"
GRAMMAR_WAIT = "instance:sglang_grammar_wait_seconds:avg5m"
GRAMMAR_WAIT_1M = "instance:sglang_grammar_wait_seconds:avg1m"
# 1 while a feature delays first tokens on its own (a grammar backlog): the TTFT burn alerts
# are silent while it holds and a window after, as for a saturation state (rules.explained).
FIRST_TOKEN = "instance:sglang_first_token_delayed_by_feature:bool"


def records(t: dict) -> list[tuple[str, str, str]]:
    """(record, expr, why) of every feature signal."""
    s = f'job="{t["selectors"]["sglang_job"]}"'
    return [
        (SPEC_VERIFY_RATE, f"{BY} (rate(sglang:spec_verify_calls_total{{{s}}}[5m]))",
         "Speculative decoding: verify steps per second (one per request per decode step; "
         "0.5.13+, counted when a request finishes)."),
        (SPEC_ACCEPT, f"""
{BY} (rate(sglang:generation_tokens_total{{{s}}}[5m]))
  / ({SPEC_VERIFY_RATE} > 0)""",
         "Speculative decoding: tokens per verify step (accepted drafts plus the bonus token) "
         "from counters, both counted as requests finish; 1 means no draft is accepted. The "
         "spec_accept_length gauge covers only the last decode report's interval."),
        (SPEC_ACCEPT_1M, f"""
{BY} (rate(sglang:generation_tokens_total{{{s}}}[1m]))
  / ({BY} (rate(sglang:spec_verify_calls_total{{{s}}}[1m])) > 0)""",
         "The same over 1 minute, for the collapse alert: its sustain is the 10 minutes, so a "
         "5-minute window would only add some 3 minutes of lag."),
        (SPEC_STEPS, f"max by (cluster, host, instance) (sglang:spec_num_steps{{{s}}}) > 0",
         "The active --speculative-num-steps (0.5.13+; adaptive speculation may change it)."),
        (SPEC_PER_STEP, f"""
{SPEC_ACCEPT}
  / on (cluster, instance) group_left () ({SPEC_STEPS} + 1)""",
         "Tokens per verify step over the most a step can yield (the steps plus the bonus "
         "token): 1 when every draft is accepted."),
        *hicache_records(s),
        *grammar_records(s, t["features"]),
        *queue_cause_records(s, t),
    ]


def grammar_records(s: str, f: dict) -> list[tuple[str, str, str]]:
    """Structured output. SGLang declares grammar counters (compilations, cache hits, timeouts,
    compile time) but no release emits them (docs/features.md): the evidence is the grammar
    queue's length and the structured requests finished. By Little's law their ratio is the
    mean time a structured request spends waiting for its grammar (its own compilation and the
    queue ahead of it; 0 for a cached grammar). The queue is one per DP rank, repeated on every
    TP rank with --enable-metrics-for-all-schedulers: max within a DP rank, summed over them."""
    def queue(window: str) -> str:
        return (f"{INSTANCE} (max by (cluster, host, instance, dp_rank) ("
                f"avg_over_time(sglang:num_grammar_queue_reqs{{{s}}}[{window}])))")

    def wait(window: str) -> str:
        # At least one finish a minute in the denominator: a queue where nothing finishes
        # still reads as a long wait, not as no value.
        return f"""
{queue(window)}
  / on (cluster, instance) group_left ()
    clamp_min({INSTANCE} (rate(sglang:num_so_requests_total{{{s}}}[{window}])), 1 / 60)"""
    why = ("Mean seconds a structured-output request waits for its grammar to compile (and for "
           "the grammar queue ahead of it), by Little's law: the grammar queue's mean length "
           "over the structured requests finished per second. Cached grammars count as 0.")
    return [
        (GRAMMAR_QUEUE_1M, queue("1m"),
         "Requests waiting for their grammar to compile, mean over 1 minute, all DP ranks."),
        (GRAMMAR_WAIT, wait("5m"), why),
        (GRAMMAR_WAIT_1M, wait("1m"), "The same over 1 minute, for the alert."),
        (FIRST_TOKEN, f"""
max by (cluster, host, instance) (
  ({GRAMMAR_WAIT_1M} > bool {f["grammar_wait_seconds"]})
  * on (cluster, instance) ({GRAMMAR_QUEUE_1M} >= bool {f["grammar_min_queue"]}))""",
         "1 while the grammar backlog alert's condition holds (before its for:), else 0: "
         "structured requests then miss the TTFT SLO because of it, and the TTFT burn alerts "
         "leave the notification to it."),
    ]


LORA_FULL = "instance:sglang_lora_pool_utilization:min30s"
PRIORITY_QUEUE = "instance_priority:sglang_queue_reqs:avg2m"
PRIORITY_DONE = "instance_priority:sglang_requests:rate2m"
PRIORITY_RUNNING = "instance_priority:sglang_running_reqs:avg2m"
PRIORITY_WAIT = "instance_priority:sglang_queue_wait_seconds:avg2m"
PRIORITY_STARVED = "instance_priority:sglang_starved_queue_wait_seconds:avg2m"


def queue_cause_records(s: str, t: dict) -> list[tuple[str, str, str]]:
    """Why requests queue while the KV pool is free (state scheduling_bottleneck): two features
    that hold the queue back by design, each measured over a span no longer than the state
    needs to form, so the cause holds when the state's alert fires and its description can
    name it. The per-priority queue gauges are one series per priority beside the priority=""
    total, the request counters one series per request priority (docs/features.md)."""
    w = f"{t['classification']['scheduling_queue_seconds']}s"
    by = "cluster, host, instance, priority"
    ratio, floor = t["features"]["priority_starvation_ratio"], t["classification"][
        "scheduling_queue_seconds"]

    def per_priority(metric: str) -> str:
        return (f"sum by ({by}) (max by ({by}, dp_rank) (avg_over_time("
                f'sglang:{metric}{{{s}, priority!~"|None"}}[2m])))')

    def share(record: str) -> str:
        return f"{record} / on (cluster, instance) group_left () {INSTANCE} ({record})"
    return [
        (LORA_FULL, f"max by (cluster, host, instance) (min_over_time("
                    f"sglang:lora_pool_utilization{{{s}}}[{w}]))",
         "The LoRA adapter pool's least use over the state's span (0.5.7+, with --enable-lora): "
         "1 when every slot held an adapter throughout, so a request needing another adapter "
         "holds the queue behind it (SGLang stops admission at it)."),
        (PRIORITY_QUEUE, per_priority("num_queue_reqs"),
         "With --enable-priority-scheduling: each priority's mean waiting requests over 2 "
         "minutes, all DP ranks (requests without a priority, \"None\" here but \"\" in the "
         "request counters, are left out)."),
        (PRIORITY_RUNNING, per_priority("num_running_reqs"),
         "Each priority's mean running requests over 2 minutes, all DP ranks."),
        (PRIORITY_DONE, f'sum by ({by}) (rate(sglang:num_requests_total{{{s}, priority!=""}}'
                        f"[2m]))",
         "Each priority's finished requests per second over 2 minutes."),
        (PRIORITY_WAIT, f"""
  {PRIORITY_QUEUE} / on (cluster, instance, priority) clamp_min({PRIORITY_DONE}, 1 / 120)
or
  {PRIORITY_QUEUE} * 120""",
         "Each priority's mean wait in the queue by Little's law (its queue over its finished "
         "requests per second, at least one per 2 minutes; a priority none of whose requests "
         "has finished yet counts one): how long its requests wait."),
        (PRIORITY_STARVED, f"""
{PRIORITY_WAIT} > {floor}
and on (cluster, instance, priority)
(
    {share(PRIORITY_QUEUE)}
  > on (cluster, instance, priority)
    {ratio} * {share(PRIORITY_RUNNING)}
  or
    {PRIORITY_QUEUE} > 0 unless on (cluster, instance, priority) {PRIORITY_RUNNING}
)""",
         f"The priorities whose requests wait over {floor} s and whose share of the waiting "
         f"requests is over {ratio}× their share of the running batch (by Little's law, their "
         "wait over the average one): priority scheduling serves them last."),
    ]


def queue_causes(t: dict) -> str:
    """Description fragments of the queueing alerts (`; cause: ...`) for this alert's instance,
    each printed only when its record holds (the `%q`s: cluster, then instance)."""
    lora = f"max({LORA_FULL}{{cluster=%q, instance=%q}}) >= 1"
    starved = f"topk(1, {PRIORITY_STARVED}{{cluster=%q, instance=%q}})"
    ratio = t["features"]["priority_starvation_ratio"]
    return (f"{{{{ with printf `{lora}` $labels.cluster $labels.instance | query }}}}"
            "; cause: every LoRA adapter slot of the batch is in use, so the request at the head "
            "of the queue waits for its adapter and the queue waits behind it "
            "(--max-loras-per-batch){{ end }}"
            f"{{{{ with printf `{starved}` $labels.cluster $labels.instance | query }}}}"
            "{{ with . | first }}; cause: priority {{ .Labels.priority }} requests wait far "
            f"longer than the others (over {ratio} times their share of the running batch in "
            "the queue): priority scheduling serves them last{{ end }}{{ end }}")


def hicache_records(s: str) -> list[tuple[str, str, str]]:
    """HiCache's host tier. The radix-cache families carry no model_name, and every TP rank
    reports the same logical token count (one series per rank from 0.5.21, one summed series
    before): ratios of two such counters hold under both; bytes are per rank's shard, so their
    sum is the physical total."""
    def dropped(window: str) -> str:
        return f"""
{INSTANCE} (rate(sglang:hicache_dropped_tokens_total{{{s}}}[{window}]))
  / ({INSTANCE} (rate(sglang:evicted_tokens_total{{{s}}}[{window}])) > 0)"""
    why = ("Share of the device cache's evicted tokens that no tier kept: evicted before "
           "their host copy was made (write-through) or refused by a full host pool "
           "(write-back). HiCache only (0.5.18+).")
    return [
        (HICACHE_DROPPED, dropped("5m"), why),
        (HICACHE_DROPPED_1M, dropped("1m"),
         "The same over 1 minute, for the alert: its sustain is the minutes it holds."),
        (HICACHE_EVICTED_1M, f"{INSTANCE} (rate(sglang:evicted_tokens_total{{{s}}}[1m]))",
         "Device cache tokens evicted per second, summed over the rank series (every TP rank "
         "evicts the same tokens): the alert's floor, in the ratio's own units."),
        (HICACHE_HOST_USED, f"""
max by (cluster, host, instance) (
  sglang:hicache_host_used_tokens{{{s}}} / (sglang:hicache_host_total_tokens{{{s}}} > 0))""",
         "HiCache host pool occupancy (0.5.10+). Full is a cache's normal state; it matters "
         "beside falling host hits or dropped tokens."),
        ("instance:sglang_hicache_load_back_bytes:rate5m",
         f"{INSTANCE} (rate(sglang:load_back_bytes_total{{{s}}}[5m]))",
         "Host-to-device load-back, bytes per second, all ranks' shards (0.5.18+)."),
        ("instance:sglang_hicache_backup_bytes:rate5m",
         f"{INSTANCE} (rate(sglang:hicache_backup_bytes_total{{{s}}}[5m]))",
         "Device-to-host backup, bytes per second, all ranks' shards (0.5.18+)."),
    ]


RATIO_WINDOW_SECONDS = 60  # the rate window of the alerts' ratios (SPEC_ACCEPT_1M, ...)


def _minus(duration: str, seconds: int) -> str:
    """`duration` (s, m or h) less `seconds`, in whole minutes where it is some."""
    left = int(float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]) - seconds
    return f"{left // 60}m" if left % 60 == 0 else f"{left}s"


def alerts(t: dict) -> list[dict]:
    """Keyword arguments of rules.Alert, one per feature alert."""
    f = t["features"]
    return [_spec_alert(f), _hicache_alert(f), _grammar_alert(f)]


def _sustained(cls: str, ratio: str, side: str, threshold: float, held: str, floor: str,
               what: str, **annotations) -> dict:
    """A warning on a 1-minute `ratio` on one `side` of `threshold` for `held`, where `floor`
    (a PromQL condition) says there is enough traffic to measure. "For 10 minutes": each
    evaluation's ratio covers the minute before it, so the for: is the rest, and the ratio has
    been past the threshold over the whole `held` when it fires. `what` opens fires_when."""
    op = {"above": ">", "below": "<"}[side]
    rest = _minus(held, RATIO_WINDOW_SECONDS)
    return dict(
        name=ALERTS[cls], expr=f"\n{ratio} {op} {threshold}\nand {floor}", severity="warning",
        for_=rest, fires_when=f"{what} has stayed {side} {threshold} for {held}: the ratio over "
                              f"the last minute (`{ratio}`) {side} {threshold} at every "
                              f"evaluation for {rest}, {annotations.pop('while_')}",
        **annotations)


def _hicache_alert(f: dict) -> dict:
    high, held, floor = f["hicache_drop_ratio"], f["hicache_drop_for"], f["hicache_min_evicted_tps"]
    return _sustained(
        "hicache_dropping", HICACHE_DROPPED_1M, "above", high, held,
        f"on (cluster, instance) {HICACHE_EVICTED_1M} > {floor}",
        "the share of evicted device tokens that HiCache dropped (`hicache_dropped_tokens_total` "
        "over `evicted_tokens_total`, SGLang 0.5.18+)",
        while_=f"while the device evicts > {floor} tokens/s (summed over the rank series)",
        comment="Prefixes the cache should have kept are computed again: the host copies "
                "fall behind what the device evicts.",
        summary="SGLang HiCache is dropping evicted KV tokens.",
        description="{{ $labels.instance }}: {{ $value | humanizePercentage }} of the tokens "
                    "the device cache evicts have no host copy and are lost to every tier "
                    f"(over {high:.0%} for {duration_words(held)}): host hits fall and the "
                    "prefill computes them again.",
        dashboard="sglang-kv")


def _grammar_alert(f: dict) -> dict:
    high, held, floor = f["grammar_wait_seconds"], f["grammar_wait_for"], f["grammar_min_queue"]
    return _sustained(
        "grammar_backlog", GRAMMAR_WAIT_1M, "above", high, held,
        f"on (cluster, instance) {GRAMMAR_QUEUE_1M} >= {floor}",
        "the mean wait of a structured-output request for its grammar (the grammar queue's "
        "length over `num_so_requests_total`'s rate, in seconds)",
        while_=f"while at least {floor} request waits in the grammar queue on average",
        comment="Structured requests wait for the grammar backend before they reach the waiting "
                "queue: the state stays healthy while their time to first token grows.",
        summary="SGLang structured-output requests wait for grammar compilation.",
        description="{{ $labels.instance }}: structured-output requests wait "
                    "{{ $value | humanizeDuration }} on average for their grammar to compile "
                    f"(over {high} s for {duration_words(held)}): schemas that miss the "
                    "grammar cache compile faster than they arrive, and each waits the queue "
                    "ahead of it before it is scheduled.",
        dashboard="sglang-overview")


def _spec_alert(f: dict) -> dict:
    floor, low = f["spec_min_verify_rps"], f["spec_collapse_accept_length"]
    held = f["spec_collapse_for"]
    return _sustained(
        "spec_collapsed", SPEC_ACCEPT_1M, "below", low, held,
        f"on (cluster, instance, model_name) {SPEC_VERIFY_RATE} > {floor}",
        "the acceptance length (tokens per verify step: generated tokens over "
        "`spec_verify_calls_total`, SGLang 0.5.13+)",
        while_=f"while the server verifies > {floor} steps/s over 5 minutes",
        comment="Speculation that no longer pays: each step still runs the draft model and "
                "the wider verify.",
        summary="SGLang speculative decoding has collapsed.",
        description="{{ $labels.instance }} ({{ $labels.model_name }}): "
                    "{{ $value | printf \"%.2f\" }} tokens per verify step, under "
                    f"{low} for {duration_words(held)}: the draft "
                    "model's guesses are rejected, and each decode step pays for drafting and "
                    "verifying them.",
        dashboard="sglang-overview")
