"""GPU metrics through NVML, on fake machines (simulator/fake_nvml.py): an 8-GPU H200 node, a
consumer card, a MIG node, an old driver, no driver at all, GPUs lost and back, Xid events.

The golden exposition of the H200 machine is tests/fixtures/gpu_h200_golden.prom (rewrite it
with `pytest --update-golden` and review the diff).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_obs.exporter.catalogue import GPUS, METRICS, PREFIX
from sglang_obs.exporter.collector import GpuCollector
from sglang_obs.exporter.gpu import GpuSampler
from sglang_obs.exporter.nvml import NvmlBackend
from sglang_obs.exporter.xid import XidWatcher
from sglang_obs.simulator.fake_nvml import (
    GPM_ANY_TENSOR_UTIL,
    FakeGpu,
    FakeNvml,
    MiB,
    consumer_machine,
    h200_machine,
    mig_machine,
    not_supported,
    nvml_error,
    old_driver_machine,
    uuid_for,
)

from conftest import ROOT
from helpers import assert_matches_golden, wait_for

GOLDEN = ROOT / "tests" / "fixtures" / "gpu_h200_golden.prom"
NONDETERMINISTIC = re.compile(
    r"^sglang_obs_gpu_(collection_duration_seconds|last_collection_success_timestamp_seconds)[ {]")
SGLANG = "10.0.0.5:30000"
G = PREFIX + "gpu_"


class Rig:
    """The exporter's GPU path as cli.py wires it, over a fake NVML, sampled by hand."""

    def __init__(self, nvml: FakeNvml, processes: bool = False, process_servers=None):
        self.nvml = nvml
        self.backend = NvmlBackend(nvml, processes=processes)
        self.xid = XidWatcher(nvml, wait_ms=20)
        self.sampler = GpuSampler(self.backend, self.xid, interval=0.02,
                                  process_servers=process_servers)
        self.registry = CollectorRegistry()
        self.registry.register(GpuCollector(self.sampler))

    def cycle(self, times: int = 1) -> None:
        for _ in range(times):
            self.sampler.sample()

    def labels(self, slot: int, index: int | None = None, **extra: str) -> dict[str, str]:
        return {"gpu": str(slot if index is None else index),
                "uuid": self.nvml.gpus[slot].uuid, **extra}

    def value(self, name: str, slot: int | None = None, index: int | None = None,
              **extra: str) -> float | None:
        """One sample: of GPU `slot` (labelled with NVML index `index`, default the slot)
        when given, else with exactly the labels in `extra`."""
        labels = extra if slot is None else self.labels(slot, index, **extra)
        return self.registry.get_sample_value(G + name, labels)

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(s.labels, s.value) for family in self.registry.collect()
                for s in family.samples if s.name == G + name]

    def info(self, slot: int) -> dict[str, str]:
        rows = [labels for labels, _ in self.series("info")
                if labels["uuid"] == self.nvml.gpus[slot].uuid]
        assert len(rows) == 1, rows
        return rows[0]


# The shared wait, polling fast: the watcher threads here run on millisecond timings.
wait_until = functools.partial(wait_for, timeout=2.0, interval=0.005)


def one_gpu(**values) -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=uuid_for("9e", 0), **values)])


# -- NotSupported: no series, and the call is not repeated -----------------------------------
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
def test_a_field_one_gpu_lacks_has_no_series_there_and_is_not_asked_again(code):
    # Prepare
    nvml = h200_machine()
    nvml.gpus[1].power_mw = nvml_error(code)
    nvml.gpus[1].energy_mj = nvml_error(code)
    rig = Rig(nvml)
    # Act
    rig.cycle(3)
    # Check
    assert rig.value("power_watts", 1) is None  # no series, not 0
    assert rig.value("energy_joules_total", 1) is None
    assert rig.value("power_watts", 0) == pytest.approx(512.345)
    assert rig.value("device_up", 1) == 1.0
    assert nvml.count("nvmlDeviceGetPowerUsage", gpu=1) == 1
    assert nvml.count("nvmlDeviceGetTotalEnergyConsumption", gpu=1) == 1
    assert nvml.count("nvmlDeviceGetPowerUsage", gpu=0) == 3
    assert rig.series("collection_errors_total") == []  # a reason appears with its first failure


def test_unsupported_calls_on_a_consumer_gpu_are_made_once_and_leave_no_series():
    # Prepare
    nvml = consumer_machine()
    rig = Rig(nvml)
    # Act
    rig.cycle(3)
    # Check
    for family in ("ecc_errors_volatile_total", "ecc_errors_aggregate_total",
                   "remapped_rows_total", "remapped_rows_pending", "remapped_rows_failure",
                   "sm_active_ratio", "tensor_active_ratio"):
        assert rig.series(family) == [], family
    assert nvml.count("nvmlDeviceGetTotalEccErrors") == 4  # each (type, counter) once
    assert nvml.count("nvmlDeviceGetRemappedRows") == 1
    assert nvml.count("nvmlDeviceGetMigMode") == 1
    assert nvml.count("nvmlGpmQueryDeviceSupport") == 1
    assert nvml.count("nvmlGpmSampleAlloc") == 0
    assert nvml.count("nvmlDeviceGetPowerUsage") == 3


def test_an_unsupported_memory_temperature_field_is_not_asked_again():
    # Prepare
    nvml = consumer_machine()
    rig = Rig(nvml)
    # Act
    rig.cycle(3)
    # Check
    assert rig.series("memory_temperature_celsius") == []
    assert nvml.count("nvmlDeviceGetFieldValues") == 1


# -- the 8-GPU H200 machine, whole ---------------------------------------------------------
def render_h200() -> str:
    rig = Rig(h200_machine(), processes=True,
              process_servers=lambda pid: SGLANG if 4242 <= pid < 4250 else "")
    rig.cycle(2)  # the second cycle has the GPM ratios
    text = generate_latest(rig.registry).decode()
    return "".join(line + "\n" for line in text.splitlines()
                   if not NONDETERMINISTIC.match(line))


def test_h200_machine_exposition_matches_golden_file(request):
    # Act
    actual = render_h200()
    # Check
    assert_matches_golden(request, GOLDEN, actual, "GPU exposition")


def test_gpu_golden_file_names_every_gpu_metric_of_the_catalogue_and_nothing_else():
    # Prepare
    text = GOLDEN.read_text()
    # Act
    typed = set(re.findall(r"^# TYPE (\S+)", text, re.M))
    sampled = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    # Check
    gpu_metrics = {spec.name.removesuffix("_total") for spec in METRICS if spec.group == GPUS}
    assert {n.removesuffix("_total") for n in typed} == gpu_metrics
    # every family has series on the H200 machine but the Xid ones (no event happened), the
    # NVML errors (none happened) and the two dropped because they change every run
    without = {G + "xid_errors", G + "xid_last_timestamp_seconds", G + "collection_errors",
               G + "collection_duration_seconds", G + "last_collection_success_timestamp_seconds"}
    assert {n.removesuffix("_total") for n in sampled} == gpu_metrics - without


def test_h200_machine_renders_every_gpu_with_the_same_series():
    # Prepare
    rig = Rig(h200_machine())
    # Act
    rig.cycle(2)
    # Check
    assert rig.value("collector_up") == 1.0
    assert rig.value("device_count") == 8.0
    per_gpu: dict[str, set[str]] = {}
    for family in rig.registry.collect():
        for s in family.samples:
            # clock events have a series per active reason only: GPU 3 (power cap), 7 (idle)
            if "uuid" in s.labels and s.name != G + "clock_event_active":
                per_gpu.setdefault(s.labels["gpu"], set()).add(s.name)
    assert sorted(per_gpu) == [str(i) for i in range(8)]
    assert all(names == per_gpu["0"] for names in per_gpu.values())
    assert sorted((labels["gpu"], labels["reason"], value)
                  for labels, value in rig.series("clock_event_active")) == [
        ("3", "sw_power_cap", 1.0), ("7", "gpu_idle", 1.0)]


# -- units -----------------------------------------------------------------------------------
def test_values_are_converted_from_nvml_units_to_base_units():
    # Prepare
    rig = Rig(one_gpu(power_mw=512_345, power_limit_mw=700_000, energy_mj=98_765_432_100,
                      sm_clock_mhz=1755, sm_clock_max_mhz=1980, mem_clock_mhz=3201,
                      mem_clock_max_mhz=3201, utilization=(87, 41), temperature_c=44,
                      memory_total=143771 * MiB, memory_reserved=566 * MiB,
                      memory_used=126_300 * MiB, clock_reasons=0x1 | 0x40,
                      remapped_rows=(2, 1, 1, 0)))
    # Act
    rig.cycle()
    # Check
    expected = {
        "power_watts": 512.345, "power_limit_watts": 700.0, "energy_joules_total": 98_765_432.1,
        "sm_clock_hertz": 1.755e9, "memory_clock_hertz": 3.201e9, "utilization_ratio": 0.87,
        "memory_utilization_ratio": 0.41, "temperature_celsius": 44.0,
        "memory_total_bytes": 150_754_820_096.0, "memory_reserved_bytes": 593_494_016.0,
        "memory_used_bytes": 126_300 * MiB,
        "pcie_link_generation": 5.0, "pcie_link_width": 16.0, "pcie_link_downgraded": 0.0,
        "pcie_replay_errors_total": 0.0,
        "remapped_rows_pending": 1.0, "remapped_rows_failure": 0.0,
    }
    for name, value in expected.items():
        assert rig.value(name, 0) == pytest.approx(value, rel=1e-12), name
    # constant maxima: gpu_info labels in base units, no series of their own
    info = rig.info(0)
    assert {k: info[k] for k in ("sm_clock_max_hertz", "memory_clock_max_hertz",
                                 "pcie_link_generation_max", "pcie_link_width_max")} == {
        "sm_clock_max_hertz": "1980000000", "memory_clock_max_hertz": "3201000000",
        "pcie_link_generation_max": "5", "pcie_link_width_max": "16"}
    for name in ("sm_clock_max_hertz", "memory_clock_max_hertz", "pcie_link_generation_max",
                 "pcie_link_width_max"):
        assert rig.series(name) == [], name
    assert rig.value("clock_event_active", 0, reason="gpu_idle") == 1.0
    assert rig.value("clock_event_active", 0, reason="hw_thermal") == 1.0
    assert rig.value("clock_event_active", 0, reason="sw_power_cap") is None  # not active
    assert rig.value("clock_event_active", 0, reason="display_clocks") is None  # not supported
    assert [labels["reason"] for labels, _ in rig.series("clock_event_active")] == [
        "gpu_idle", "hw_thermal"]
    assert rig.info(0)["clock_event_reasons"] == (
        "gpu_idle,applications_clocks_setting,sw_power_cap,hw_slowdown,sync_boost,sw_thermal,"
        "hw_thermal,hw_power_brake")
    assert rig.value("remapped_rows_total", 0, type="correctable") == 2.0
    assert rig.value("remapped_rows_total", 0, type="uncorrectable") == 1.0
    for kind in ("corrected", "uncorrected"):
        assert rig.value("ecc_errors_volatile_total", 0, type=kind) == 0.0
        assert rig.value("ecc_errors_aggregate_total", 0, type=kind) == 0.0


@pytest.mark.parametrize(("width", "gen", "downgraded"), [
    ((16, 16), (5, 5), 0.0), ((8, 16), (5, 5), 1.0), ((16, 16), (3, 5), 1.0),
    ((8, 16), (3, 5), 1.0)], ids=["full", "narrow", "slow", "both"])
def test_pcie_link_downgraded_compares_width_and_generation_with_their_maxima(width, gen,
                                                                            downgraded):
    # Prepare
    rig = Rig(one_gpu(pcie_width=width[0], pcie_width_max=width[1], pcie_gen=gen[0],
                      pcie_gen_max=gen[1]))
    # Act
    rig.cycle()
    # Check
    assert rig.value("pcie_link_downgraded", 0) == downgraded
    assert rig.value("pcie_link_width", 0) == width[0]
    assert rig.info(0)["pcie_link_width_max"] == str(width[1])


def test_pcie_link_downgraded_uses_the_pair_nvml_answers_and_is_absent_without_one():
    # Prepare: GPU 0 has no maximum width, but its generation is below the maximum; GPU 1 has
    # no maxima at all.
    nvml = FakeNvml([FakeGpu(uuid=uuid_for("9e", 0), pcie_width_max=not_supported(), pcie_gen=3),
                     FakeGpu(uuid=uuid_for("9e", 1), pcie_width_max=not_supported(),
                             pcie_gen_max=not_supported())])
    rig = Rig(nvml)
    # Act
    rig.cycle()
    # Check
    assert rig.value("pcie_link_downgraded", 0) == 1.0
    assert rig.info(0)["pcie_link_width_max"] == ""
    assert rig.value("pcie_link_downgraded", 1) is None
    assert rig.value("pcie_link_width", 1) == 16.0


def test_clock_events_have_a_series_per_active_reason_and_info_says_which_can_be_reported():
    # Prepare: GPU 0 power-capped, GPU 1 without clock-event reasons at all
    nvml = FakeNvml([FakeGpu(uuid=uuid_for("9e", 0), clock_reasons=0x4),
                     FakeGpu(uuid=uuid_for("9e", 1), clock_reasons=not_supported())])
    rig = Rig(nvml)
    # Act
    rig.cycle()
    active_0 = rig.series("clock_event_active")
    nvml.gpus[0].clock_reasons = 0  # the cap lifts
    rig.cycle()
    # Check
    assert active_0 == [(rig.labels(0, reason="sw_power_cap"), 1.0)]
    assert rig.series("clock_event_active") == []  # nothing active: no series, not zeros
    assert "sw_power_cap" in rig.info(0)["clock_event_reasons"].split(",")
    assert rig.info(1)["clock_event_reasons"] == ""  # absence on GPU 1 means unknown


def test_memory_temperature_is_decoded_through_the_field_value_type():
    # Prepare
    rig = Rig(one_gpu(memory_temperature_c=52))
    # Act
    rig.cycle()
    # Check
    assert rig.value("memory_temperature_celsius", 0) == 52.0


def test_memory_is_read_with_the_v2_struct_so_used_excludes_reserved():
    # Prepare
    nvml = one_gpu(memory_total=143771 * MiB, memory_reserved=566 * MiB,
                   memory_used=1_024 * MiB)
    rig = Rig(nvml)
    # Act
    rig.cycle(2)
    # Check
    assert nvml.memory_versions == [pynvml.nvmlMemory_v2] * 2
    assert rig.value("memory_used_bytes", 0) == 1_024 * MiB  # v1 would say 1590 MiB
    assert rig.value("memory_reserved_bytes", 0) == 566 * MiB


# -- heterogeneous machines --------------------------------------------------------------------
def test_consumer_gpu_reports_the_series_it_has_and_no_others():
    # Prepare
    rig = Rig(consumer_machine())
    # Act
    rig.cycle(2)
    # Check
    assert rig.value("collector_up") == 1.0
    assert rig.value("power_watts", 0) == pytest.approx(312.6)
    assert rig.value("utilization_ratio", 0) == pytest.approx(0.63)
    assert rig.value("temperature_celsius", 0) == 58.0
    assert rig.value("memory_total_bytes", 0) == 24564 * MiB
    assert rig.value("memory_clock_hertz", 0) == pytest.approx(10.501e9)
    assert rig.value("clock_event_active", 0, reason="display_clocks") is None  # not active
    assert rig.info(0)["clock_event_reasons"].endswith(",hw_power_brake,display_clocks")
    assert rig.value("pcie_link_generation", 0) == 4.0
    for family in ("memory_temperature_celsius", "ecc_errors_volatile_total",
                   "ecc_errors_aggregate_total", "remapped_rows_total",
                   "remapped_rows_pending", "remapped_rows_failure", "sm_active_ratio",
                   "sm_occupancy_ratio", "tensor_active_ratio", "dram_bandwidth_ratio"):
        assert rig.series(family) == [], family
    assert rig.info(0)["mig_mode"] == ""  # not a MIG GPU
    assert rig.info(0)["name"] == "NVIDIA GeForce RTX 4090"


def test_mig_gpu_has_no_utilization_or_remapped_rows_and_says_mig_enabled():
    # Prepare
    rig = Rig(mig_machine())
    # Act
    rig.cycle(2)
    # Check
    assert rig.info(0)["mig_mode"] == "enabled"
    assert rig.value("utilization_ratio", 0) is None
    assert rig.value("memory_utilization_ratio", 0) is None
    assert rig.value("remapped_rows_pending", 0) is None
    assert rig.value("remapped_rows_total", 0, type="correctable") is None
    assert rig.value("device_up", 0) == 1.0
    assert rig.value("memory_used_bytes", 0) == 61_000 * MiB
    assert rig.info(1)["mig_mode"] == "disabled"
    assert rig.value("utilization_ratio", 1) == pytest.approx(0.87)
    assert rig.value("remapped_rows_total", 1, type="correctable") == 0.0
    assert sum(v for _, v in rig.series("collection_errors_total")) == 0.0


@pytest.mark.parametrize("old_bindings", [True, False], ids=["old-pynvml", "old-driver"])
def test_old_driver_falls_back_to_the_older_calls_without_errors(old_bindings, caplog):
    # Prepare
    caplog.set_level(logging.INFO)
    nvml = old_driver_machine(old_bindings=old_bindings)
    rig = Rig(nvml)
    # Act
    rig.cycle(3)
    # Check
    assert rig.value("collector_up") == 1.0
    assert rig.value("temperature_celsius", 0) == 61.0
    assert nvml.count("nvmlDeviceGetTemperature") == 3
    assert nvml.count("nvmlDeviceGetTemperatureV") == (0 if old_bindings else 1)
    assert rig.value("clock_event_active", 0, reason="sw_power_cap") == 1.0
    assert rig.value("clock_event_active", 0, reason="gpu_idle") is None
    assert "gpu_idle" in rig.info(0)["clock_event_reasons"].split(",")
    assert nvml.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 3
    # the v1 struct: used includes the reserved memory, and there is no reserved figure
    assert rig.value("memory_used_bytes", 0) == (30_100 + 310) * MiB
    assert rig.value("memory_reserved_bytes", 0) is None
    assert rig.info(0)["driver_version"] == "470.256.02"
    assert rig.info(0)["cuda_driver_version"] == "11.4"
    assert rig.info(0)["name"] == "Tesla V100-SXM2-32GB"
    assert sum(v for _, v in rig.series("collection_errors_total")) == 0.0
    assert rig.value("nvml_inits_total") == 1.0
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_old_pynvml_without_the_v2_memory_constant_reads_v1_memory():
    # Prepare
    nvml = old_driver_machine(old_bindings=True)
    nvml.missing.add("nvmlMemory_v2")
    rig = Rig(nvml)
    # Act
    rig.cycle(2)
    # Check
    assert nvml.memory_versions == [None, None]
    assert rig.value("memory_used_bytes", 0) == (30_100 + 310) * MiB


# -- a GPU lost, and back ----------------------------------------------------------------------
def test_a_gpu_lost_mid_run_is_reported_down_and_nvml_restarts_next_cycle():
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle()
    # Act
    nvml.lose(2)
    rig.cycle()
    # Check
    assert rig.value("device_up", 2) == 0.0
    assert rig.value("power_watts", 2) is None  # no stale value for a lost GPU
    assert [rig.value("device_up", i) for i in (0, 1, 3, 4, 5, 6, 7)] == [1.0] * 7
    assert rig.value("power_watts", 3) == pytest.approx(516.095)
    assert rig.value("collector_up") == 1.0
    assert rig.value("collection_errors_total", reason="gpu_lost") == 1.0
    assert rig.value("xid_errors_total", 2, xid="79") == 1.0
    assert rig.value("xid_last_timestamp_seconds", 2, xid="79") == pytest.approx(time.time(),
                                                                                  abs=60)
    assert not nvml.initialized  # shut down, to re-init next cycle
    assert nvml.shutdowns == 1

    # Act: it comes back (driver reset)
    nvml.restore(2)
    rig.cycle()
    # Check
    assert rig.value("nvml_inits_total") == 2.0
    assert rig.value("device_up", 2) == 1.0
    assert rig.value("power_watts", 2) == pytest.approx(514.845)
    assert rig.value("collection_errors_total", reason="gpu_lost") == 1.0
    assert rig.value("xid_errors_total", 2, xid="79") == 1.0
    assert nvml.initialized


def test_a_gpu_lost_for_several_cycles_counts_one_xid_79():
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle()
    nvml.lose(5)
    # Act
    rig.cycle(3)
    # Check
    assert rig.value("xid_errors_total", 5, xid="79") == 1.0
    assert rig.value("device_up", 5) == 0.0
    assert rig.value("collection_errors_total", reason="gpu_lost") == 3.0
    assert rig.value("nvml_inits_total") == 3.0  # re-initialised each cycle, to recover

    # Act: lost again after coming back is a second Xid 79
    nvml.restore(5)
    rig.cycle()
    nvml.lose(5)
    rig.cycle()
    # Check
    assert rig.value("xid_errors_total", 5, xid="79") == 2.0


@pytest.mark.parametrize("call", ["nvmlDeviceGetUUID", "nvmlDeviceGetPowerUsage",
                                  "nvmlDeviceGetRemappedRows", "nvmlGpmSampleGet"])
def test_a_gpu_lost_in_the_middle_of_its_reading_is_down_and_the_others_are_read(call):
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle()
    # Act
    nvml.gpus[4].lose_on = call
    rig.cycle()
    # Check
    assert rig.value("device_up", 4) == 0.0
    assert rig.value("power_watts", 4) is None
    assert rig.value("device_up", 5) == 1.0
    assert rig.value("power_watts", 5) == pytest.approx(518.595)
    assert rig.value("collection_errors_total", reason="gpu_lost") == 1.0
    assert rig.value("xid_errors_total", 4, xid="79") == 1.0
    assert not nvml.initialized


def test_a_gpu_missing_from_the_device_count_is_reported_lost_not_dropped():
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle()
    # Act
    nvml.unplug(7)
    rig.cycle()
    # Check
    assert rig.value("device_up", 7) == 0.0
    assert rig.value("xid_errors_total", 7, xid="79") == 1.0
    assert [rig.value("device_up", i) for i in range(7)] == [1.0] * 7
    assert rig.value("collector_up") == 1.0


def test_a_gpu_vanishing_from_the_middle_of_the_count_is_reported_lost_by_its_uuid():
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle()
    # Act
    nvml.unplug(3)
    rig.cycle()
    # Check
    up = {labels["uuid"]: value for labels, value in rig.series("device_up")}
    assert up[nvml.gpus[3].uuid] == 0.0
    assert [up[nvml.gpus[i].uuid] for i in (0, 1, 2, 4, 5, 6, 7)] == [1.0] * 7
    assert rig.value("device_up", 7, index=6) == 1.0  # renumbered, still up


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_GPU_NOT_FOUND])
def test_an_unknown_error_restarts_nvml_like_a_lost_gpu(code):
    # Prepare
    nvml = h200_machine()
    nvml.gpus[1].power_mw = nvml_error(code)
    rig = Rig(nvml)
    # Act
    rig.cycle(2)
    # Check
    assert rig.value("device_up", 1) == 0.0
    assert rig.value("nvml_inits_total") == 2.0


# -- no NVML at all ----------------------------------------------------------------------------
def test_without_the_nvml_library_the_collector_is_down_and_warns_once(caplog):
    # Prepare
    caplog.set_level(logging.INFO)
    nvml = FakeNvml([], library_missing=True)
    rig = Rig(nvml)
    stop = threading.Event()
    # Act: by hand, then through the sampler's own loop
    rig.cycle(3)
    try:
        rig.sampler.start(stop)
        assert wait_until(lambda: nvml.count("nvmlInit") >= 6)
    finally:
        stop.set()
    text = generate_latest(rig.registry).decode()
    # Check
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "library_not_found" in warnings[0].getMessage()
    assert rig.value("collector_up") == 0.0
    assert rig.value("device_count") is None
    assert rig.value("collection_errors_total", reason="library_not_found") >= 3.0
    assert rig.value("nvml_inits_total") == 0.0
    assert rig.series("device_up") == []
    assert "sglang_obs_gpu_collector_up 0.0" in text


@pytest.mark.parametrize("error", [
    nvml_error(pynvml.NVML_ERROR_UNKNOWN), nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST),
    nvml_error(pynvml.NVML_ERROR_UNINITIALIZED), nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
    nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED), nvml_error(pynvml.NVML_ERROR_TIMEOUT),
    RuntimeError("driver wedged"), OSError("libnvidia-ml.so.1: cannot open shared object")],
    ids=lambda e: type(e).__name__)
def test_gpu_collector_never_raises_while_every_nvml_call_fails(error):
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle()
    # Act
    nvml.fail_all = error
    rig.cycle(2)
    text = generate_latest(rig.registry).decode()
    # Check
    assert rig.value("collector_up") == 0.0
    assert [rig.value("device_up", i) for i in range(8)] == [0.0] * 8
    assert rig.series("power_watts") == []
    assert "sglang_obs_gpu_device_up" in text


@pytest.mark.parametrize("error", [nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
                                   nvml_error(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH),
                                   nvml_error(pynvml.NVML_ERROR_UNKNOWN), RuntimeError("boom")],
                         ids=lambda e: type(e).__name__)
def test_gpu_collector_never_raises_when_nvml_init_fails(error):
    # Prepare
    nvml = h200_machine()
    nvml.init_error = error
    rig = Rig(nvml)
    # Act
    rig.cycle(2)
    text = generate_latest(rig.registry).decode()
    # Check
    assert rig.value("collector_up") == 0.0
    assert "sglang_obs_gpu_collector_up 0.0" in text


def test_gpu_collector_never_raises_when_every_value_of_every_gpu_is_an_error():
    # Prepare
    errors = [not_supported(), nvml_error(pynvml.NVML_ERROR_NO_PERMISSION),
              nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)]
    gpus = []
    for slot, error in enumerate(errors):
        gpu = FakeGpu(uuid=uuid_for("ee", slot))
        for name in ("mig_mode", "utilization", "memory_total", "temperature_c",
                     "memory_temperature_c", "power_mw", "power_limit_mw", "energy_mj",
                     "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "pcie_replays",
                     "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz",
                     "clock_reasons", "clock_reasons_supported", "ecc", "remapped_rows",
                     "gpm_supported", "processes"):
            setattr(gpu, name, error)
        gpus.append(gpu)
    rig = Rig(FakeNvml(gpus), processes=True)
    # Act
    rig.cycle(2)
    text = generate_latest(rig.registry).decode()
    # Check: identity only, every GPU up, nothing faked
    assert rig.value("collector_up") == 1.0
    assert [rig.value("device_up", i) for i in range(3)] == [1.0] * 3
    assert len(rig.series("info")) == 3
    values = [labels for family in rig.registry.collect() for s in family.samples
              for labels in [s.labels] if "uuid" in labels
              and s.name not in (G + "info", G + "device_up")]
    assert values == []
    assert "sglang_obs_gpu_power_watts{" not in text


# -- GPM (Hopper+) ---------------------------------------------------------------------------
def test_gpm_ratios_appear_from_the_second_cycle_on():
    # Prepare
    nvml = h200_machine()
    nvml.gpus[2].gpm[GPM_ANY_TENSOR_UTIL] = not_supported()  # a per-metric return
    rig = Rig(nvml)
    # Act
    rig.cycle()
    # Check: the first sample only seeds
    assert rig.series("sm_active_ratio") == []
    assert nvml.live_gpm_samples == 8
    # Act
    rig.cycle()
    # Check
    assert rig.value("sm_active_ratio", 0) == pytest.approx(0.725)
    assert rig.value("sm_occupancy_ratio", 0) == pytest.approx(0.4125)
    assert rig.value("tensor_active_ratio", 0) == pytest.approx(0.55)
    assert rig.value("dram_bandwidth_ratio", 0) == pytest.approx(0.6375)
    assert rig.value("sm_active_ratio", 7) == 0.0  # idle, and said so
    assert rig.value("tensor_active_ratio", 2) is None
    assert rig.value("sm_active_ratio", 2) == pytest.approx(0.725)
    assert nvml.live_gpm_samples == 8  # the previous sample of each GPU was freed
    rig.cycle()
    assert nvml.live_gpm_samples == 8


def test_a_gpm_failure_turns_gpm_off_for_that_gpu_only():
    # Prepare
    nvml = h200_machine()
    nvml.gpus[6].gpm_sample_error = nvml_error(pynvml.NVML_ERROR_UNKNOWN)
    rig = Rig(nvml)
    # Act
    rig.cycle(3)
    # Check
    assert rig.value("device_up", 6) == 1.0
    assert rig.value("power_watts", 6) == pytest.approx(519.845)
    assert rig.value("sm_active_ratio", 6) is None
    assert rig.value("sm_active_ratio", 5) == pytest.approx(0.725)
    assert nvml.count("nvmlGpmSampleGet", gpu=6) == 1  # not retried
    assert rig.value("nvml_inits_total") == 1.0


def test_gpm_samples_are_freed_before_nvml_shuts_down():
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    rig.cycle(2)
    # Act: a lost GPU shuts NVML down
    nvml.lose(0)
    rig.cycle()
    # Check
    assert not nvml.initialized
    assert nvml.live_gpm_samples == 0


# -- Xid events ------------------------------------------------------------------------------
@pytest.fixture
def xid_watcher():
    """An XidWatcher on an initialised H200 machine; its thread is stopped at teardown."""
    stop = threading.Event()
    nvml = h200_machine()
    nvml.nvmlInit()
    watcher = XidWatcher(nvml, wait_ms=20)
    yield nvml, watcher, stop
    stop.set()
    wait_until(lambda: not watcher.running, timeout=1.0)


def test_xid_watcher_records_each_event_with_a_count_and_a_last_seen_time(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    watcher.start(stop)
    assert wait_until(lambda: watcher.running)
    before = time.time()
    # Act
    nvml.push_xid(7, 48)
    nvml.push_xid(7, 48)
    nvml.push_xid(7, 94)
    assert wait_until(lambda: sum(watcher.snapshot()[0].values()) == 3)
    # Check (which GPU gets them: see the next test)
    counts, seen = watcher.snapshot()
    by_xid: dict[str, int] = {}
    for (_, _, xid), n in counts.items():
        by_xid[xid] = by_xid.get(xid, 0) + n
    assert by_xid == {"48": 2, "94": 1}
    assert all(before <= at <= time.time() for at in seen.values())
    assert set(seen) == set(counts)
    assert watcher.restarts == 0
    assert nvml.count("nvmlDeviceRegisterEvents") == 8


# Not strict: whether the id() map hits, and on which GPU, depends on the allocator.
def test_xid_events_are_booked_on_their_gpu_even_when_it_fell_off_the_bus(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    watcher.start(stop)
    assert wait_until(lambda: watcher.running)
    # Act
    nvml.push_xid(0, 48)
    nvml.push_xid(3, 79)
    nvml.lose(3)  # every call on GPU 3 now answers GpuIsLost
    wait_until(lambda: sum(watcher.snapshot()[0].values()) == 2, timeout=1.5)
    # Check
    counts, _ = watcher.snapshot()
    assert counts == {("0", nvml.gpus[0].uuid, "48"): 1, ("3", nvml.gpus[3].uuid, "79"): 1}
    assert watcher.restarts == 0


def test_xid_watcher_treats_a_timeout_as_no_event(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    # Act
    watcher.start(stop)
    assert wait_until(lambda: nvml.count("nvmlEventSetWait") >= 5)
    # Check
    assert watcher.running
    assert watcher.restarts == 0
    assert watcher.snapshot() == ({}, {})
    assert nvml.count("nvmlEventSetCreate") == 1


def test_xid_watcher_restarts_after_an_nvml_error_and_frees_its_event_set(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    watcher.start(stop)
    assert wait_until(lambda: watcher.running)
    # Act
    nvml.push_wait_error(nvml_error(pynvml.NVML_ERROR_UNKNOWN))
    assert wait_until(lambda: watcher.restarts == 1)
    assert wait_until(lambda: watcher.running, timeout=2.5)  # after a 1 s backoff
    nvml.push_xid(1, 13)
    assert wait_until(lambda: sum(watcher.snapshot()[0].values()) == 1)
    # Check
    counts, _ = watcher.snapshot()
    assert list(counts.values()) == [1]
    assert list(counts)[0][2] == "13"
    assert nvml.count("nvmlEventSetCreate") == 2
    assert nvml.live_event_sets == 1  # the first was freed


def test_xid_watcher_watches_the_gpus_that_can_register_and_skips_the_rest(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    nvml.gpus[2].register_events_error = not_supported()  # e.g. a vGPU
    nvml.gpus[4].supported_events = 0x4  # no Xid events on this one
    # Act
    watcher.start(stop)
    assert wait_until(lambda: watcher.running)
    # Check
    assert watcher.restarts == 0
    assert nvml.count("nvmlDeviceRegisterEvents") == 7
    assert nvml.count("nvmlDeviceRegisterEvents", gpu=4) == 0


def test_xid_watcher_keeps_watching_the_other_gpus_while_one_is_lost(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    nvml.lose(2)
    # Act
    watcher.start(stop)
    running = wait_until(lambda: watcher.running, timeout=1.5)
    # Check
    assert running
    assert watcher.restarts == 0
    nvml.push_xid(5, 94)
    assert wait_until(lambda: sum(watcher.snapshot()[0].values()) == 1)


def test_xid_watcher_stops_and_frees_its_event_set_when_asked(xid_watcher):
    # Prepare
    nvml, watcher, stop = xid_watcher
    watcher.start(stop)
    assert wait_until(lambda: watcher.running)
    # Act
    stop.set()
    # Check
    assert wait_until(lambda: not watcher.running)
    assert wait_until(lambda: nvml.live_event_sets == 0)


def test_sampler_starts_the_xid_watcher_and_the_collector_exposes_its_events():
    # Prepare
    nvml = h200_machine()
    rig = Rig(nvml)
    stop = threading.Event()
    try:
        # Act
        rig.sampler.start(stop)
        assert wait_until(lambda: rig.xid.running)
        nvml.push_xid(7, 48)
        assert wait_until(lambda: rig.xid.snapshot()[0])
        # Check
        counts, _ = rig.xid.snapshot()
        ((gpu, uuid, xid),) = counts
        assert xid == "48"
        assert rig.value("xid_errors_total", gpu=gpu, uuid=uuid, xid="48") == 1.0
        assert rig.value("xid_last_timestamp_seconds", gpu=gpu, uuid=uuid,
                         xid="48") == pytest.approx(time.time(), abs=60)
        assert rig.value("collector_up") == 1.0
    finally:
        stop.set()
        wait_until(lambda: not rig.xid.running, timeout=1.0)
