"""The only module that talks to NVML: reads every GPU into plain dataclasses in base units.

The pynvml module comes in through the constructor (tests pass a fake that models real GPUs).
Three kinds of failure, from the NVML reference:
- a field this GPU or driver does not have (NotSupported, NoPermission, FunctionNotFound, a
  call missing from an old pynvml): the field is None, so it has no series; remembered per
  (GPU, field) so the call is not repeated;
- a GPU that fails (GpuIsLost, Unknown, ...): that GPU is reported lost (device_up 0, Xid 79
  for GpuIsLost), the others keep being read, and NVML is shut down and re-initialised on the
  next cycle;
- no library or no driver at all: NvmlUnavailable, once; the collector reports itself down.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Clock event reason bits (nvmlClocksEventReason*): a series per active reason, and the
# supported ones in gpu_info's clock_event_reasons label.
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"), (0x100, "display_clocks"))
# NVML error codes (nvml.h), matched on err.value so a fake module needs only NVMLError.
NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND = 3, 4, 13
UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, GPU_IS_LOST = 1, 9, 12, 15
LIB_RM_VERSION_MISMATCH, GPU_NOT_FOUND, UNKNOWN = 18, 28, 999
ABSENT = {NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND}
CONTEXT_FATAL = {UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH, GPU_IS_LOST,
                 GPU_NOT_FOUND, UNKNOWN}
REASONS = {GPU_IS_LOST: "gpu_lost", UNKNOWN: "unknown", GPU_NOT_FOUND: "gpu_not_found",
           DRIVER_NOT_LOADED: "driver_not_loaded", LIB_RM_VERSION_MISMATCH: "version_mismatch",
           UNINITIALIZED: "uninitialized", LIBRARY_NOT_FOUND: "library_not_found"}

# GPM metric ids (Hopper+) -> our names; values are 0-100 percentages.
GPM_METRICS = ((2, "sm_active_ratio"), (3, "sm_occupancy_ratio"), (5, "tensor_active_ratio"),
               (10, "dram_bandwidth_ratio"))


class NvmlUnavailable(Exception):
    """No NVML library or driver: a host without GPUs (or the demo)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass
class GpuReading:
    index: int
    uuid: str
    up: bool = True
    name: str = ""
    pci_bus_id: str = ""
    mig_mode: str = ""  # "enabled" | "disabled" | "" (not a MIG GPU)
    values: dict[str, float] = field(default_factory=dict)  # metric short name -> value
    # Per-GPU constants (maxima), exposed as gpu_info labels: short name -> value
    limits: dict[str, float] = field(default_factory=dict)
    clock_events: dict[str, float] = field(default_factory=dict)  # supported reason -> 0/1
    ecc: dict[tuple[str, str], float] = field(default_factory=dict)  # (counter, type) -> n
    remapped_rows: dict[str, float] = field(default_factory=dict)  # type -> rows
    processes: list[tuple[int, float]] = field(default_factory=list)  # (pid, bytes)
    process_memory: dict[str, float] = field(default_factory=dict)  # server -> bytes


@dataclass
class NvmlReading:
    ok: bool
    gpus: list[GpuReading]
    driver_version: str = ""
    cuda_driver_version: str = ""
    duration_seconds: float = 0.0


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


class NvmlBackend:
    def __init__(self, nvml: Any = None, processes: bool = False):
        if nvml is None:
            import pynvml as nvml  # the one place pynvml is imported
        self.nvml = nvml
        self.processes = processes
        self.initialized = False
        self.inits = 0
        self.errors: dict[str, int] = {}  # reason -> failures, from the first one
        self._warned: set[str] = set()  # reasons logged since NVML last fully answered
        self._unsupported: set[tuple[str, str]] = set()  # (uuid, field)
        self._known: dict[str, int] = {}  # uuid -> last index of every GPU seen, to report it lost
        self._gpm: dict[str, Any] = {}  # uuid -> previous GPM sample

    # -- lifecycle -----------------------------------------------------------------------
    def init(self) -> None:
        if self.initialized:
            return
        try:
            self.nvml.nvmlInit()
        except Exception as err:
            code = _code(err)
            reason = REASONS.get(code, "other")
            self.errors[reason] = self.errors.get(reason, 0) + 1
            raise NvmlUnavailable(reason, f"{type(err).__name__}: {err}") from None
        self.initialized = True
        self.inits += 1

    def shutdown(self) -> None:
        if self.initialized:
            for sample in self._gpm.values():  # before nvmlShutdown, or they leak
                self._gpm_free(sample)
            self._gpm.clear()
            try:
                self.nvml.nvmlShutdown()
            except Exception as err:
                log.debug("nvmlShutdown: %s", err)
        self.initialized = False

    def _call(self, uuid: str, name: str, fn: str, *args: Any) -> Any:
        """One NVML call; None when this field is absent on this GPU/driver."""
        if (uuid, name) in self._unsupported:
            return None
        func = getattr(self.nvml, fn, None)
        if func is None:  # an older pynvml without the call
            self._unsupported.add((uuid, name))
            return None
        try:
            return func(*args)
        except Exception as err:
            if _code(err) in ABSENT:
                self._unsupported.add((uuid, name))
                log.debug("GPU %s: %s not supported", uuid, name)
                return None
            raise

    # -- reading ---------------------------------------------------------------------------
    def read(self) -> NvmlReading:
        """Read every GPU. Raises NvmlUnavailable only when NVML cannot start at all."""
        started = time.perf_counter()
        self.init()
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
            driver = _text(self._call("", "driver", "nvmlSystemGetDriverVersion"))
            cuda = self._call("", "cuda", "nvmlSystemGetCudaDriverVersion")
        except Exception as err:  # the whole context is broken: start again next cycle
            self._failed(err)
            self.shutdown()
            return NvmlReading(False, self._lost_all(), duration_seconds=time.perf_counter()
                               - started)
        gpus, context_broken = [], False
        for index in range(count):
            try:
                gpus.append(self._read_gpu(index))
            except Exception as err:
                self._failed(err)
                uuid = next((u for u, i in self._known.items() if i == index),
                            f"index-{index}")
                gpus.append(GpuReading(index, uuid, up=False))
                if _code(err) in CONTEXT_FATAL:
                    context_broken = True
        seen = {g.uuid for g in gpus}
        gpus += [GpuReading(i, u, up=False) for u, i in self._known_by_index()
                 if u not in seen]  # a GPU that vanished from the count is lost, not gone
        if context_broken:
            self.shutdown()  # re-initialise next cycle; the other GPUs were read this one
        if gpus and all(g.up for g in gpus) and self._warned:
            log.warning("NVML: every GPU answers again")
            self._warned.clear()
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else ""
        return NvmlReading(count > 0 and any(g.up for g in gpus), gpus, driver, cuda_text,
                           time.perf_counter() - started)

    def _failed(self, err: BaseException) -> None:
        reason = REASONS.get(_code(err), "other")
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if reason not in self._warned:  # once per state change: a lost GPU fails every cycle
            self._warned.add(reason)
            log.warning("NVML: %s (%s)", reason, type(err).__name__)

    def _known_by_index(self) -> list[tuple[str, int]]:
        return sorted(self._known.items(), key=lambda item: (item[1], item[0]))

    def _lost_all(self) -> list[GpuReading]:
        return [GpuReading(i, u, up=False) for u, i in self._known_by_index()]

    def _read_gpu(self, index: int) -> GpuReading:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        self._known[uuid] = index
        g = GpuReading(index, uuid, name=_text(self._call(uuid, "name", "nvmlDeviceGetName",
                                                          handle)))
        call = self._call
        pci = call(uuid, "pci", "nvmlDeviceGetPciInfo", handle)
        g.pci_bus_id = _text(getattr(pci, "busId", "")) if pci is not None else ""
        mig = call(uuid, "mig", "nvmlDeviceGetMigMode", handle)
        if mig is not None:
            g.mig_mode = "enabled" if mig[0] else "disabled"
        v = g.values
        util = call(uuid, "utilization", "nvmlDeviceGetUtilizationRates", handle)
        if util is not None:
            v["utilization_ratio"] = util.gpu / 100
            v["memory_utilization_ratio"] = util.memory / 100
        mem = self._memory(uuid, handle)
        if mem is not None:
            v["memory_used_bytes"], v["memory_total_bytes"] = float(mem.used), float(mem.total)
            if getattr(mem, "reserved", None) is not None:
                v["memory_reserved_bytes"] = float(mem.reserved)
        temp = self._temperature(uuid, handle)
        if temp is not None:
            v["temperature_celsius"] = float(temp)
        fields = call(uuid, "memory_temp", "nvmlDeviceGetFieldValues", handle, [82])
        if fields:
            fv = fields[0]
            if getattr(fv, "nvmlReturn", 1) == 0:
                v["memory_temperature_celsius"] = float(_field_value(fv))
            elif fv.nvmlReturn in ABSENT:
                self._unsupported.add((uuid, "memory_temp"))
        for key, fn, scale in (
            ("power_watts", "nvmlDeviceGetPowerUsage", 1000),  # mW
            ("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", 1000),  # mW
            ("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption", 1000),  # mJ
            ("pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", 1),
            ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", 1),
            ("pcie_replay_errors_total", "nvmlDeviceGetPcieReplayCounter", 1),
        ):
            value = call(uuid, key, fn, handle)
            if value is not None:
                v[key] = float(value) / scale  # divided, so 98765432100 mJ is exactly J
        for key, fn in (("pcie_link_generation_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                        ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            value = call(uuid, key, fn, handle)
            if value is not None:
                g.limits[key] = float(value)
        for target, key, fn, clock in (
                (v, "sm_clock_hertz", "nvmlDeviceGetClockInfo", 1),
                (g.limits, "sm_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", 1),
                (v, "memory_clock_hertz", "nvmlDeviceGetClockInfo", 2),
                (g.limits, "memory_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", 2)):
            value = call(uuid, key, fn, handle, clock)  # NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2
            if value is not None:
                target[key] = float(value) * 1e6  # MHz
        _pcie_downgraded(g)
        self._clock_events(g, handle)
        self._ecc(g, handle)
        rows = call(uuid, "remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        if rows is not None and g.mig_mode != "enabled":
            corr, unc, pending, failure = rows
            g.remapped_rows = {"correctable": float(corr), "uncorrectable": float(unc)}
            v["remapped_rows_pending"] = 1.0 if pending else 0.0
            v["remapped_rows_failure"] = 1.0 if failure else 0.0
        self._gpm_ratios(g, handle)
        if self.processes:
            procs = call(uuid, "processes", "nvmlDeviceGetComputeRunningProcesses", handle)
            g.processes = [(int(p.pid), float(p.usedGpuMemory or 0)) for p in procs or []]
        return g

    def _memory(self, uuid: str, handle: Any) -> Any:
        # v2 so "used" matches nvidia-smi (v1 counts reserved memory as used).
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        if version is not None and (uuid, "memory_v2") not in self._unsupported:
            try:
                return self.nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except TypeError:  # an older pynvml without the version argument
                self._unsupported.add((uuid, "memory_v2"))
            except Exception as err:
                if _code(err) not in ABSENT:
                    raise
                self._unsupported.add((uuid, "memory_v2"))
        return self._call(uuid, "memory", "nvmlDeviceGetMemoryInfo", handle)

    def _temperature(self, uuid: str, handle: Any) -> Any:
        value = self._call(uuid, "temperature_v", "nvmlDeviceGetTemperatureV", handle, 0)
        if value is not None:
            return value
        return self._call(uuid, "temperature", "nvmlDeviceGetTemperature", handle, 0)

    def _clock_events(self, g: GpuReading, handle: Any) -> None:
        current = self._call(g.uuid, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons",
                             handle)
        if current is None:  # drivers before the rename
            current = self._call(g.uuid, "clock_throttle",
                                 "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if current is None:
            return
        supported = self._call(g.uuid, "clock_events_supported",
                               "nvmlDeviceGetSupportedClocksEventReasons", handle)
        if supported is None:
            supported = self._call(g.uuid, "clock_throttle_supported",
                                   "nvmlDeviceGetSupportedClocksThrottleReasons", handle)
        mask = 0x1FF if supported is None else int(supported)
        g.clock_events = {name: 1.0 if int(current) & bit else 0.0
                          for bit, name in CLOCK_EVENT_REASONS if mask & bit}

    def _ecc(self, g: GpuReading, handle: Any) -> None:
        for counter, counter_type in (("volatile", 0), ("aggregate", 1)):  # NVML_*_ECC
            for error, error_type in (("corrected", 0), ("uncorrected", 1)):
                value = self._call(g.uuid, f"ecc_{counter}_{error}", "nvmlDeviceGetTotalEccErrors",
                                   handle, error_type, counter_type)
                if value is not None:
                    g.ecc[(counter, error)] = float(value)

    def _gpm_ratios(self, g: GpuReading, handle: Any) -> None:
        """SM/tensor/DRAM activity between two GPM samples (Hopper+); the first only seeds.

        GPM is optional: any failure but a lost GPU turns it off for this GPU, never the GPU.
        """
        if (g.uuid, "gpm") in self._unsupported:
            return
        nvml = self.nvml
        sample = None
        try:
            support = self._call(g.uuid, "gpm", "nvmlGpmQueryDeviceSupport", handle)
            if support is None or not getattr(support, "isSupportedDevice", 0):
                self._unsupported.add((g.uuid, "gpm"))
                return
            sample = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, sample)
            previous = self._gpm.get(g.uuid)
            current, sample = sample, None
            self._gpm[g.uuid] = current  # kept for the next cycle
            if previous is None:
                return
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = previous, current
            for i, (metric_id, _) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = metric_id
            try:
                nvml.nvmlGpmMetricsGet(request)
            finally:
                self._gpm_free(previous)
            for i, (_, name) in enumerate(GPM_METRICS):
                if request.metrics[i].nvmlReturn == 0:
                    g.values[name] = float(request.metrics[i].value) / 100
        except Exception as err:
            self._gpm_free(sample)
            self._gpm_free(self._gpm.pop(g.uuid, None))
            if _code(err) == GPU_IS_LOST:
                raise
            log.info("GPU %s: GPM metrics off (%s)", g.uuid, type(err).__name__)
            self._unsupported.add((g.uuid, "gpm"))

    def _gpm_free(self, sample: Any) -> None:
        if sample is not None:
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except Exception as err:
                log.debug("nvmlGpmSampleFree: %s", err)


def _pcie_downgraded(g: GpuReading) -> None:
    """pcie_link_downgraded: 1 if the link runs below its maximum width or generation, from
    the pairs this GPU answers; absent when it answers neither pair."""
    pairs = [(g.values[cur], g.limits[cur + "_max"])
             for cur in ("pcie_link_width", "pcie_link_generation")
             if cur in g.values and cur + "_max" in g.limits]
    if pairs:
        g.values["pcie_link_downgraded"] = 1.0 if any(c < m for c, m in pairs) else 0.0


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return "" if value is None else str(value)[:128]


# nvmlValueType_t -> the c_nvmlValue_t union member holding the value
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _field_value(fv: Any) -> float:
    """A field value read through its valueType: the union has every member, so the first
    one that exists (dVal) would reinterpret an unsigned int's bits as a double."""
    value_type = int(getattr(fv, "valueType", 0))
    member = _VALUE_MEMBERS[value_type] if 0 <= value_type < len(_VALUE_MEMBERS) else "dVal"
    return float(getattr(fv.value, member))
