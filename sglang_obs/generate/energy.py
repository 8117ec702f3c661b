"""docs/metrics.md's "Energy and cost" section: the energy records' formulas and error bounds
(written with the catalogue by the `metrics` product), and the figures the shipped rules give on
two simulated scenarios (the block `energy-numbers`, written by the `energy` product: promtool
over the simulator's rendered series, as the detection table is made).

The records are sglang_obs/render/energy_rules.py's; the cost figures evaluate its cost_expr at
ILLUSTRATIVE_GPU_HOUR_PRICE, since the shipped thresholds.yml sets no price.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from sglang_obs.core.settings import Settings
from sglang_obs.generate import promtool_eval
from sglang_obs.generate.detection import _parse_got, load_scenario, step_seconds
from sglang_obs.render import energy_rules as er
from sglang_obs.simulator.render import promtool_series, render
from sglang_obs.simulator.simulation import GPU_IDLE_POWER_W, GPU_POWER_LIMIT_W

DOC = "metrics.md"  # in docs/
BLOCK = "energy-numbers"
SCENARIOS = ("long-context-incident", "healthy")
# An illustrative price per GPU-hour for the numbers block only: no default of the stack (the
# shipped thresholds.yml sets none) and no quote for any GPU.
ILLUSTRATIVE_GPU_HOUR_PRICE = 3.0
ILLUSTRATIVE_CURRENCY = "USD"
WARM_UP_S = 300  # the 5-min windows fill: figures are means from here to the scenario's end
# What the records read from a rendered scenario: nothing else is given to promtool.
SERIES = (er.ENERGY, er.REALTIME, "sglang:prompt_tokens_total", "sglang:cached_tokens_total",
          "sglang:generation_tokens_total")
PLACEHOLDER = "Not yet computed: run `python -m sglang_obs.generate energy`.\n"
_BLOCK = re.compile(r"^<!-- generated:energy-numbers -->\n(.*?)^<!-- end:energy-numbers -->$",
                    re.S | re.M)


def section(t: dict, numbers: str) -> list[str]:
    """The section's lines: formulas, series read, error bounds, then the numbers block with
    `numbers` (the block's committed content) inside its markers."""
    price = er.price(t)
    priced = (f"set (`{price:g}` {er.currency(t)} per GPU-hour)" if price is not None
              else "unset in the shipped `prometheus/thresholds.yml`")
    return [
        "## Energy and cost",
        "",
        "What a token costs the host's GPUs, in joules and in money: recording rules "
        "`sglang-energy.rules` (`sglang_obs/render/energy_rules.py`), per host (`cluster`, "
        "`host`), in base units (W, J, ratios 0-1). The GPUs dashboard's row \"Energy and cost\" "
        "plots them. They read the exporter's `sglang_obs_gpu_energy_joules_total` (NVML, per "
        "GPU) and SGLang's `sglang:realtime_tokens_total` (0.5.7+; by mode: `prefill_compute`, "
        "`prefill_cache`, `decode`), or, on a host whose servers lack it, the tokenizer's "
        "`sglang:prompt_tokens_total`, `sglang:cached_tokens_total` and "
        "`sglang:generation_tokens_total`. Below, P is the host's GPU power, C, K and D its "
        "computed prompt, cached prompt and output tokens per second.",
        "",
        "| record | formula | meaning |",
        "|---|---|---|",
        f"| `{er.POWER}` | P = Σ over the host's GPUs of `rate(energy[5m])` | W, the GPUs "
        "together, mean over 5 min |",
        f"| `{er.GPUS}` | GPUs with an energy counter | the GPU-hours the cost counts |",
        f"| `{er.TOKENS}` | C, K, D: Σ over DP ranks of the max over a rank's TP/PP copies of "
        "`rate(realtime_tokens[5m])`; else C = prompt − cached, K = cached, D = generated | "
        "tokens/s by `mode` |",
        f"| `{er.ENERGY_PER_TOKEN}{{mode=\"prefill\"}}` | P · C/(C+D) / (C+K) | J per prompt "
        "token (cached ones included) |",
        f"| `{er.ENERGY_PER_TOKEN}{{mode=\"decode\"}}` | P · D/(C+D) / D = P/(C+D) | J per "
        "output token |",
        f"| `{er.IDLE_SHARE}` | Σ energy of the hour's minutes with no token / Σ energy of its "
        "minutes | share of GPU energy spent idle, 0-1 |",
        f"| `{er.CACHE_SAVED_POWER}` | K · P/(C+D) | W the prefix cache saves, at most |",
        f"| `{er.COST_PER_TOKEN}{{mode}}` | energy per token · (GPUs · price / 3600) / P | "
        "money per token; dashboards show it per million |",
        "",
        "The energy is split between prefill and decode in proportion to the tokens each "
        "computed, so the two figures, times their token rates, add up to P: every joule is "
        "charged to some token, idle time within the window included (all-in figures, not the "
        "marginal cost of one more token). The cost splits the host's GPU-hours the same way. "
        f"`cost.gpu_hour_price` is {priced}: without a price the cost records are absent and "
        "the dashboard says how to set it (then `make generate`).",
        "",
        "Error bounds and where a figure is wrong or absent:",
        "",
        "- **GPUs without the counter.** `nvmlDeviceGetTotalEnergyConsumption` exists on Volta "
        "and later; on an older GPU NVML answers NOT_SUPPORTED and the exporter emits no "
        "`sglang_obs_gpu_energy_joules_total` for it (exporter/nvml.py leaves out a field NVML "
        "does not support, never a 0). That GPU is then missing from P and from the GPU count: "
        "a host of only such GPUs has no energy or cost records at all, a mixed host reads low. "
        "The power gauge (`sglang_obs_gpu_power_watts`) still shows its draw.",
        "- **MIG.** The counter is the physical GPU's; the exporter reads physical GPUs only, so "
        "P counts each GPU once. Its instances share it, and nothing splits it between "
        "the servers running on them: the figures are per host, never per MIG instance.",
        "- **Counter resets.** The counter counts since the driver loaded. A driver reload (or "
        "a GPU reset) starts it again near 0; `rate()` reads the drop as a counter reset and "
        "counts from the new value, so the 5-min window holding the reload loses at most the "
        "energy between its last sample before and the reload (one scrape interval of power, "
        "about 15 s of P). A GPU lost from the bus drops out of P until it returns.",
        "- **The 5-min window.** P, the token rates and everything built on them are means "
        "over the last 5 minutes: a burst shorter than that is averaged with what surrounds "
        "it, and a change of load shows fully only 5 minutes later. The tokenizer's counters "
        "(the fallback before 0.5.7) count a request when it finishes: a long request's prompt "
        "tokens land in the window it ends in, which can move a window's J per prompt token "
        "by the share of requests straddling its edges. The realtime counters count as the "
        "scheduler runs each batch.",
        "- **Idle share's resolution.** Minutes are whole: a minute with a single token is "
        "busy, so short gaps between requests count as busy and the share is a lower bound of "
        "the time the GPUs sat idle. A minute with no token at all (a server down or not yet "
        "serving included) is idle. `increase()` over 1 minute needs two samples in it: at a "
        "scrape interval over 30 s some minutes have fewer and are left out of both sums. "
        "Only hosts whose servers report realtime tokens have it.",
        "- **Cache-saved power** prices a cached token at the all-in J per computed token, "
        "idle and static power included, and a prompt token like an output token: an upper "
        "bound of what computing it would add, often far above it. Prefill computes thousands "
        "of tokens per forward pass where decode computes one per request, so a prompt token "
        "costs a fraction of an output token's energy; SGLang's counters do not say how much "
        "GPU time each mode took, so the split by tokens cannot tell them apart. On the seed "
        "incident, where most long prompts come from the cache, the bound is far above "
        "the host's whole draw (the table above).",
        "- **Mixed-model host.** Servers of several models on one host share its GPUs' energy "
        "in one figure per host: a token of a small model and one of a large model are charged "
        "alike. Per-server figures would need each server's GPUs (not known to the rules); "
        "run one model per host where the figure matters. Likewise a host whose servers run "
        "releases both before and after 0.5.7 counts only the realtime counters' tokens.",
        "",
        f"<!-- generated:{BLOCK} -->",
        *numbers.rstrip("\n").split("\n"),
        f"<!-- end:{BLOCK} -->",
        "",
    ]


def committed_numbers(text: str | None) -> str:
    """The numbers block's content in a committed docs/metrics.md (the placeholder without
    one): the metrics product keeps it, the energy product rewrites it."""
    m = _BLOCK.search(text or "")
    return m.group(1) if m else PLACEHOLDER


# -- the numbers --------------------------------------------------------------------------------
def _figures(name: str, s: Settings) -> dict[str, float | None]:
    sc = load_scenario(name)
    step = step_seconds(s)
    rendered = render(sc, step=step, poll_interval=5.0, start=0.0)
    end = int((rendered.steps - 1) * step)
    span = f"{end - WARM_UP_S}s"

    def mean(expr: str) -> str:
        return f"avg_over_time(({expr})[{span}:{step}s])"
    cost = er.cost_expr(ILLUSTRATIVE_GPU_HOUR_PRICE).strip().replace("\n", " ")
    exprs = {  # each evaluated at the scenario's end; by_mode: one sample per mode
        "gpus": f"max_over_time({er.GPUS}[{span}])",
        "power": f"avg_over_time({er.POWER}[{span}])",
        "joules": mean(er.ENERGY_PER_TOKEN),
        "idle": er.IDLE_SHARE,
        "saved": f"avg_over_time({er.CACHE_SAVED_POWER}[{span}])",
        "cost": mean(f"1e6 * {cost}"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        output = promtool_eval.evaluate(promtool_series(rendered, SERIES),
                                        [(e, end) for e in exprs.values()], step, Path(tmp), s,
                                        name=f"energy-{name}")
    out: dict[str, float | None] = {}
    for key, expr in exprs.items():
        got = _parse_got(output, expr.replace('"', '\\"').replace("\n", "\\n"), end)
        if key in ("joules", "cost"):
            for labels, value in got:
                out[f"{key}_{labels.get('mode')}"] = value
        else:
            out[key] = got[0][1] if got else None
    return out


def _fmt(value: float | None, digits: str = ".3g") -> str:
    return "—" if value is None else format(value, digits)


def numbers(s: Settings) -> str:
    """The block: each scenario's figures from the shipped rules."""
    lines = [
        f"The shipped rules on two simulated scenarios (`sglang-sim`, promtool over the rendered "
        f"series at the evaluation interval, `python -m sglang_obs.generate energy`): means of "
        f"each record from minute {WARM_UP_S // 60} (when the 5-min windows are full) to the "
        "scenario's end; the idle share at the end (its hour covers the whole scenario). Cost at "
        f"an illustrative {ILLUSTRATIVE_GPU_HOUR_PRICE:.2f} {ILLUSTRATIVE_CURRENCY} per GPU-hour "
        "(`ILLUSTRATIVE_GPU_HOUR_PRICE` in `sglang_obs/generate/energy.py`: not a default of the "
        f"stack, not a quote). The simulated GPUs draw {GPU_IDLE_POWER_W:.0f} W idle to "
        f"{GPU_POWER_LIMIT_W:.0f} W fully busy, each: the figures show the formulas at work, "
        "not a measured model.",
        "",
        "| scenario | GPUs | mean GPU power | J per prompt token | J per output token "
        f"| idle share (1 h) | cache-saved power | {ILLUSTRATIVE_CURRENCY}/Mtok prompt "
        f"| {ILLUSTRATIVE_CURRENCY}/Mtok output |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in SCENARIOS:
        f = _figures(name, s)
        sc = load_scenario(name)
        lines.append(
            f"| `{name}` (SGLang {sc.release}) | {_fmt(f['gpus'], '.0f')} "
            f"| {_fmt(f['power'], '.0f')} W | {_fmt(f.get('joules_prefill'))} J "
            f"| {_fmt(f.get('joules_decode'))} J | {_fmt(f['idle'], '.2f')} "
            f"| {_fmt(f['saved'], '.0f')} W | {_fmt(f.get('cost_prefill'), '.2f')} "
            f"| {_fmt(f.get('cost_decode'), '.2f')} |")
    return "\n".join(lines) + "\n"
