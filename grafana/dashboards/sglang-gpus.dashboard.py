"""SGLang / GPUs (uid sglang-gpus): NVML per GPU, as the exporter reads it; GPU alerts link here.

GPU series carry `gpu` and `uuid` but no `server`, so their instance is the exporter's address:
the `exporter` and `gpu` variables select them.
"""

import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import dashlib as d
from grafanalib.core import Text

from sglang_obs.render import energy_rules as er

G = d.GPU
THROTTLE_ALERTING = d.ALERTS["gpu_throttle_reasons"]
XID_CRITICAL = d.ALERTS["gpu_xid_critical"]


def per_gpu(metric: str, extra: str = "") -> str:
    return f"max by (gpu) ({metric}{{{G}{extra}}})"


health = [
    d.stat("GPU collector",
           "1 if NVML answered and at least one GPU was read in the last cycle.",
           [(f"min(sglang_obs_gpu_collector_up{{{d.EXPORTER_SELF}}})", "NVML")], d.NONE,
           mappings=d.UP_DOWN, background=True, graph=False),
    d.stat("GPUs reported",
           "GPUs NVML reports (nvmlDeviceGetCount), all selected exporters.",
           [(f"sum(sglang_obs_gpu_device_count{{{d.EXPORTER_SELF}}})", "reported")],
           d.COUNT, w=3, graph=False),
    d.stat("GPUs lost",
           "GPUs whose read failed in the last cycle (GpuIsLost, Unknown, ...).",
           [(f"count(sglang_obs_gpu_device_up{{{G}}} == 0) or vector(0)", "lost")],
           d.COUNT, w=3, graph=False, thresholds=d.steps("green", (1, "red"))),
    d.stat("Row remap pending",
           "1 if a GPU has a row remap waiting for a GPU reset (nvmlDeviceGetRemappedRows).",
           [(per_gpu("sglang_obs_gpu_remapped_rows_pending"), "GPU {{gpu}}")], d.NONE,
           w=5, mappings=d.YES_NO, graph=False, background=True),
    d.stat("Row remap failed",
           "1 if row remapping failed on a GPU: NVIDIA's RMA criterion.",
           [(per_gpu("sglang_obs_gpu_remapped_rows_failure"), "GPU {{gpu}}")], d.NONE,
           w=5, mappings=d.YES_NO, graph=False, background=True),
    d.stat("Uncorrectable ECC in range",
           "Uncorrectable volatile ECC errors over the selected range, all selected GPUs.",
           [(f'sum(increase(sglang_obs_gpu_ecc_errors_volatile_total{{{G}, type="uncorrected"}}'
             "[$__range])) or vector(0)", "uncorrected")],
           d.COUNT, instant=True, thresholds=d.steps("green", (1, "red"))),
    d.state_timeline("GPU readable",
                     "Per GPU: read in the last NVML cycle (ok) or lost.",
                     [(per_gpu("sglang_obs_gpu_device_up"), "GPU {{gpu}}")],
                     d.value_mappings(((0, "lost", "red"), (1, "ok", "green"))), h=4),
]

compute = [
    d.timeseries("GPU utilization",
                 "Share of time a kernel ran (NVML utilization.gpu): busy, not saturation.",
                 [(per_gpu("sglang_obs_gpu_utilization_ratio"), "GPU {{gpu}}")],
                 d.RATIO, w=12, min_=0, max_=1),
    d.timeseries("SM activity",
                 "GPM SM activity, SM occupancy and tensor-core activity per GPU (Hopper+): how "
                 "much of the GPU the kernels actually use.",
                 [(per_gpu("sglang_obs_gpu_sm_active_ratio"), "GPU {{gpu}} SM active"),
                  (per_gpu("sglang_obs_gpu_sm_occupancy_ratio"), "GPU {{gpu}} SM occupancy"),
                  (per_gpu("sglang_obs_gpu_tensor_active_ratio"), "GPU {{gpu}} tensor active")],
                 d.RATIO, w=12, min_=0, max_=1),
    d.timeseries("Memory bandwidth",
                 "Memory-controller busy time (NVML) and DRAM bandwidth use (GPM, Hopper+); "
                 "decode is bandwidth bound.",
                 [(per_gpu("sglang_obs_gpu_memory_utilization_ratio"), "GPU {{gpu}} controller"),
                  (per_gpu("sglang_obs_gpu_dram_bandwidth_ratio"), "GPU {{gpu}} DRAM bandwidth")],
                 d.RATIO, w=12, min_=0, max_=1),
    d.timeseries("Clocks",
                 "SM and memory clocks per GPU; their maxima are constants, in the Inventory "
                 "table (gpu_info). Why a clock is low: the clock-event reasons panel.",
                 [(per_gpu("sglang_obs_gpu_sm_clock_hertz"), "GPU {{gpu}} SM"),
                  (per_gpu("sglang_obs_gpu_memory_clock_hertz"), "GPU {{gpu}} memory")],
                 d.HERTZ, w=12, min_=0),
]

memory = [
    d.timeseries("Memory used vs reserved vs total",
                 "Per GPU: used (as nvidia-smi), reserved by the driver, and total (dashed). "
                 "SGLang preallocates: used stays high while idle.",
                 [(per_gpu("sglang_obs_gpu_memory_used_bytes"), "GPU {{gpu}} used"),
                  (per_gpu("sglang_obs_gpu_memory_reserved_bytes"), "GPU {{gpu}} reserved"),
                  (per_gpu("sglang_obs_gpu_memory_total_bytes"), "GPU {{gpu}} total")],
                 d.BYTES, w=12, min_=0, overrides=d.dashed("C")),
    d.timeseries("Memory by SGLang server",
                 "GPU memory of compute processes per SGLang server, matched by process tree "
                 "(opt-in --collector.nvml.processes); empty server: unmatched.",
                 [(f'sum by (gpu, server) (sglang_obs_gpu_process_memory_bytes{{job="'
                   f'{d.EXPORTER_JOB}", gpu=~"$gpu"}})', "GPU {{gpu}} {{server}}")],
                 d.BYTES, w=12, min_=0, stack=True),
]

thermal = [
    d.timeseries("Temperature",
                 "GPU and HBM temperature per GPU (HBM absent on consumer GPUs).",
                 [(per_gpu("sglang_obs_gpu_temperature_celsius"), "GPU {{gpu}}"),
                  (per_gpu("sglang_obs_gpu_memory_temperature_celsius"), "GPU {{gpu}} HBM")],
                 d.CELSIUS, w=12),
    d.timeseries("Power",
                 "Power draw per GPU against the enforced power limit (dashed).",
                 [(per_gpu("sglang_obs_gpu_power_watts"), "GPU {{gpu}}"),
                  (per_gpu("sglang_obs_gpu_power_limit_watts"), "GPU {{gpu}} limit")],
                 d.WATTS, w=12, min_=0, overrides=d.dashed("B")),
    d.state_timeline("Clock event (throttle) reasons",
                     "Active NVML clock-event reasons per GPU (a reason has a series only while "
                     f"active); red: the alerting set ({THROTTLE_ALERTING}), blue: gpu_idle "
                     "(benign).",
                     [(f"max by (gpu, reason) (sglang_obs_gpu_clock_event_active{{{G}}}) > 0",
                       "GPU {{gpu}} {{reason}}")],
                     d.value_mappings(((1, "active", "orange"),)), h=8,
                     overrides=[
                         {"matcher": {"id": "byRegexp",
                                      "options": f".*({THROTTLE_ALERTING})$"},
                          "properties": [{"id": "mappings", "value": [d.value_mappings(
                              ((1, "active", "red"),))[0].to_json_data()]}]},
                         {"matcher": {"id": "byRegexp", "options": ".*gpu_idle$"},
                          "properties": [{"id": "mappings", "value": [d.value_mappings(
                              ((1, "idle", "blue"),))[0].to_json_data()]}]}]),
]

errors = [
    d.timeseries("ECC errors",
                 "Volatile ECC errors per GPU and type (corrected, uncorrected) per interval.",
                 [(f"sum by (gpu, type) (increase(sglang_obs_gpu_ecc_errors_volatile_total{{{G}}}"
                   "[$__rate_interval]))", "GPU {{gpu}} {{type}}")],
                 d.COUNT, w=8, min_=0, bars=True),
    d.timeseries("Xid events",
                 f"Xid events per GPU and code per interval; critical codes: {XID_CRITICAL}.",
                 [(f"sum by (gpu, xid) (increase(sglang_obs_gpu_xid_errors_total{{{G}}}"
                   "[$__rate_interval]))", "GPU {{gpu}} Xid {{xid}}")],
                 d.COUNT, w=8, min_=0, bars=True),
    d.timeseries("Rows remapped",
                 "Memory rows remapped per GPU and type (correctable, uncorrectable) per "
                 "interval (Ampere+).",
                 [(f"sum by (gpu, type) (increase(sglang_obs_gpu_remapped_rows_total{{{G}}}"
                   "[$__rate_interval]))", "GPU {{gpu}} {{type}}")],
                 d.COUNT, w=8, min_=0, bars=True),
    d.table("Last Xid per GPU",
            "When each Xid code was last seen on each GPU.",
            [(f"max by (gpu, xid) (sglang_obs_gpu_xid_last_timestamp_seconds{{{G}}}) * 1000",
              "GPU {{gpu}} Xid {{xid}}")],
            unit=d.DATE, w=8, h=7, rename={"Value": "last seen"}),
    d.timeseries("PCIe link generation",
                 "Current PCIe link generation per GPU (its maximum: Inventory table); links "
                 "downshift when idle.",
                 [(per_gpu("sglang_obs_gpu_pcie_link_generation"), "GPU {{gpu}}")],
                 d.NONE, w=8, h=7, min_=0),
    d.timeseries("PCIe link width and replays",
                 "Current PCIe lanes (the maximum: Inventory table), and PCIe replays per "
                 "second (signal integrity).",
                 [(per_gpu("sglang_obs_gpu_pcie_link_width"), "GPU {{gpu}} lanes"),
                  (f"sum by (gpu) (rate(sglang_obs_gpu_pcie_replay_errors_total{{{G}}}"
                   "[$__rate_interval]))", "GPU {{gpu}} replays/s")],
                 d.NONE, w=8, h=7, min_=0),
    d.state_timeline("PCIe link below its maximum",
                     "Per GPU: the link runs below its maximum width or generation (NVML current "
                     "vs maximum, compared by the exporter); alerting only while the GPU is busy "
                     "(GPUPCIeLinkDegraded), since links downshift at idle.",
                     [(per_gpu("sglang_obs_gpu_pcie_link_downgraded"), "GPU {{gpu}}")],
                     d.value_mappings(((0, "at max", "green"), (1, "below max", "orange"))),
                     h=4),
]

# Energy and cost per token, per host (sglang-energy.rules; docs/metrics.md "Energy and cost").
H = d.WHERE
PRICE = er.price(d.THRESHOLDS)
CURRENCY = er.currency(d.THRESHOLDS)
# Grafana's currency units by ISO code; any other currency is written after the number.
CURRENCY_UNITS = {"USD", "EUR", "GBP", "JPY", "CHF", "CNY", "INR", "KRW", "SEK", "NOK", "DKK",
                  "PLN", "CZK", "BRL", "ZAR"}


def cost_panel():
    """Cost per million tokens at cost.gpu_hour_price; without a price, how to set one."""
    title = "Cost per million tokens"
    if PRICE is None:
        return Text(
            title=title, dataSource=d.DS, gridPos=d.GridPos(x=0, y=0, w=8, h=7), mode="markdown",
            description="No GPU-hour price is set, so the cost records are not rendered.",
            content="**No price set.** Set `cost.gpu_hour_price` (money per GPU-hour, in "
                    "`cost.currency`) in `prometheus/thresholds.yml`, then run `make generate` "
                    "and reload Prometheus's rules: this panel then plots the cost per million "
                    "prompt and output tokens (`" + er.COST_PER_TOKEN + "`).")
    unit = f"currency{CURRENCY}" if CURRENCY in CURRENCY_UNITS else f"suffix: {CURRENCY}"
    return d.timeseries(
        title, f"Money per million tokens at {PRICE:g} {CURRENCY} per GPU-hour "
        "(thresholds.yml cost.gpu_hour_price): the host's GPU-hours split between prompt and "
        "output tokens as its energy is.",
        [(f'{er.COST_PER_TOKEN}{{{H}, mode="prefill"}} * 1e6', "{{host}} per M prompt tokens"),
         (f'{er.COST_PER_TOKEN}{{{H}, mode="decode"}} * 1e6', "{{host}} per M output tokens")],
        unit, h=7, min_=0)


energy = [
    d.timeseries("Host GPU power",
                 "The host's GPUs together, mean over 5 min, from NVML's energy counters "
                 "(Volta and later; a GPU without one is left out).",
                 [(f"{er.POWER}{{{H}}}", "{{host}}")], d.WATTS, h=7, min_=0),
    d.timeseries("Energy per token",
                 "J per prompt token (cached ones included) and per output token, all-in over "
                 "5 min: the GPUs' energy split between prefill and decode by the tokens each "
                 "computed.",
                 [(f'{er.ENERGY_PER_TOKEN}{{{H}, mode="prefill"}}', "{{host}} per prompt token"),
                  (f'{er.ENERGY_PER_TOKEN}{{{H}, mode="decode"}}', "{{host}} per output token")],
                 "joule", h=7, min_=0),
    d.timeseries("Idle share of GPU energy",
                 "Share of the last hour's GPU energy spent in minutes when the host processed "
                 "no token (servers idle or down); whole minutes, so a lower bound.",
                 [(f"{er.IDLE_SHARE}{{{H}}}", "{{host}}")], d.RATIO, h=7, min_=0, max_=1),
    d.timeseries("Upper bound of the power the prefix cache saves",
                 "Cached prompt tokens per second at the host's all-in J per computed token: "
                 "an upper bound of what computing them would draw, often far above it (it "
                 "prices a prompt token like an output token; docs/metrics.md).",
                 [(f"{er.CACHE_SAVED_POWER}{{{H}}}", "{{host}}")], d.WATTS, h=7, min_=0),
    cost_panel(),
]

inventory = [
    d.table("GPUs",
            "GPU identity: name, UUID, PCI bus, driver and CUDA versions, MIG mode; and its "
            "constant maxima: SM and memory clock (Hz), PCIe generation and lanes; and the "
            "clock-event reasons NVML reports for it.",
            [(f"max by (gpu, uuid, name, pci_bus_id, driver_version, cuda_driver_version, "
              f"mig_mode, sm_clock_max_hertz, memory_clock_max_hertz, pcie_link_generation_max, "
              f"pcie_link_width_max, clock_event_reasons) (sglang_obs_gpu_info{{{G}}})",
              "GPU {{gpu}}")],
            hide=("Time", "Value"),
            rename={"sm_clock_max_hertz": "SM clock max (Hz)",
                    "memory_clock_max_hertz": "memory clock max (Hz)",
                    "pcie_link_generation_max": "PCIe gen max",
                    "pcie_link_width_max": "PCIe lanes max",
                    "clock_event_reasons": "clock-event reasons reported"}),
]

dashboard = d.dashboard(
    "SGLang / GPUs", "sglang-gpus",
    "NVML per GPU: utilization and SM activity, memory, temperature, power, clocks, throttle "
    "reasons, ECC, Xid, row remapping and PCIe.",
    [
        ("Health", "Collector, lost GPUs and hardware faults at a glance.", health),
        ("Compute", "Busy time, SM activity, bandwidth and clocks.", compute),
        ("Memory", "Fullness per GPU and per SGLang server.", memory),
        ("Thermal and power", "Temperature, power and clock events.", thermal),
        ("Errors and links", "ECC, Xid, row remapping and PCIe.", errors),
        ("Energy and cost", "Per host: power, J per prompt and output token, idle share, what "
         "the prefix cache saves, cost per million tokens (docs/metrics.md).", energy),
        ("Inventory", "Which GPUs these are.", inventory),
    ],
    extra_variables=[d.EXPORTER, d.GPU_VAR],
)
