"""A hand-written fake of the pynvml calls exporter/nvml.py and exporter/xid.py make.

gpustat-style: every GPU is a FakeGpu whose values are in NVML's raw units (mW, mJ, MHz,
percent, bytes) or an Exception instance the call raises. NVML errors are real
pynvml.NVMLError(code) objects, so `err.value` and the subclass are what the real binding gives;
structs are pynvml's own ctypes structs where the backend reads fields from them.

What it models besides values:
- `missing`: names an older pynvml does not have (accessing them raises AttributeError);
- `driver_missing`: NVML symbols an older driver lacks (the call raises FunctionNotFound),
  e.g. "nvmlDeviceGetTemperatureV" or "nvmlDeviceGetMemoryInfo_v2";
- `memory_version_kwarg=False`: an nvmlDeviceGetMemoryInfo without `version=` (TypeError);
- `library_missing`: nvmlInit raises LibraryNotFound, as on a host without the driver;
- init reference counting: every call before nvmlInit (or after the matching nvmlShutdown)
  raises Uninitialized;
- GPUs lost (GpuIsLost on every call, handle lookup included) and back, or gone from the count
  (later GPUs renumber, as NVML enumerates densely);
- handles: real pynvml.c_nvmlDevice_t pointers, a new object per lookup (as in the real
  binding) with the same pointer value for the same GPU;
- GPM samples (alloc/get/free, tracked while live) and the metrics-get struct;
- Xid events: a queue nvmlEventSetWait delivers to the devices registered on the event set,
  with a bounded wait that raises NVML_ERROR_TIMEOUT when nothing arrives.
`calls` counts every call by (function, GPU slot); `count()` sums it.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import pynvml

MiB = 1 << 20
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a non-MIG event
# nvmlEventType{SingleBitEccError, DoubleBitEccError, PState, XidCriticalError, Clock}
DATACENTER_EVENTS = 0x1 | 0x2 | 0x4 | XID_CRITICAL_ERROR | 0x10
# Clock event reason bits: gpu_idle .. hw_power_brake (display_clocks only on boards with outputs)
DATACENTER_CLOCK_REASONS = 0xFF
ALL_CLOCK_REASONS = 0x1FF
GPU_IDLE, SW_POWER_CAP = 0x1, 0x4
MEMORY_TEMP_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR_UTIL, GPM_DRAM_BW_UTIL = 2, 3, 5, 10


def nvml_error(code: int) -> pynvml.NVMLError:
    """The pynvml exception for a return code (NVMLError(3) is an NVMLError_NotSupported)."""
    return pynvml.NVMLError(code)


def not_supported() -> pynvml.NVMLError:
    return nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)


def uuid_for(model: str, slot: int) -> str:
    return f"GPU-{model}{slot:02x}a7c3-5d3c-4e1f-9b2a-{0x0c0ffee00000 + slot:012x}"


@dataclass
class FakeGpu:
    """One GPU; each value is NVML's raw answer, or an Exception instance the call raises."""

    uuid: str
    name: str = "NVIDIA H200"
    pci_bus_id: str = "00000000:18:00.0"
    mig_mode: list[int] | Exception = field(default_factory=lambda: [0, 0])
    utilization: tuple[int, int] | Exception = (87, 41)  # (gpu %, memory %)
    memory_total: int | Exception = 143771 * MiB
    memory_reserved: int = 566 * MiB
    memory_used: int = 126_300 * MiB  # v2 meaning: without the reserved memory
    temperature_c: int | Exception = 44
    memory_temperature_c: int | Exception = 52  # field 82; an exception is a per-field return
    power_mw: int | Exception = 512_345
    power_limit_mw: int | Exception = 700_000
    energy_mj: int | Exception = 98_765_432_100
    pcie_gen: int | Exception = 5
    pcie_gen_max: int | Exception = 5
    pcie_width: int | Exception = 16
    pcie_width_max: int | Exception = 16
    pcie_replays: int | Exception = 0
    sm_clock_mhz: int | Exception = 1755
    sm_clock_max_mhz: int | Exception = 1980
    mem_clock_mhz: int | Exception = 3201
    mem_clock_max_mhz: int | Exception = 3201
    clock_reasons: int | Exception = 0
    clock_reasons_supported: int | Exception = DATACENTER_CLOCK_REASONS
    # (NVML_MEMORY_ERROR_TYPE_CORRECTED/UNCORRECTED, NVML_VOLATILE_ECC/AGGREGATE_ECC) -> errors
    ecc: dict[tuple[int, int], int] | Exception = field(
        default_factory=lambda: {(e, c): 0 for e in (0, 1) for c in (0, 1)})
    remapped_rows: tuple[int, int, int, int] | Exception = (0, 0, 0, 0)
    gpm_supported: bool | Exception = True
    gpm_sample_error: Exception | None = None  # raised by nvmlGpmSampleGet
    # GPM metric id -> percent between two samples, or an exception (its per-metric return)
    gpm: dict[int, float | Exception] = field(default_factory=lambda: {
        GPM_SM_UTIL: 72.5, GPM_SM_OCCUPANCY: 41.25, GPM_ANY_TENSOR_UTIL: 55.0,
        GPM_DRAM_BW_UTIL: 63.75})
    processes: list[tuple[int, int]] | Exception = field(default_factory=list)  # (pid, bytes)
    supported_events: int | Exception = DATACENTER_EVENTS
    register_events_error: Exception | None = None
    lost: bool = False  # GpuIsLost on every call for this GPU
    present: bool = True  # False: gone from nvmlDeviceGetCount
    lose_on: str | None = None  # becomes lost when this function is called for it


HANDLE_BASE, HANDLE_STEP = 0x7F3A_2C00_0000, 0x1000  # where the "driver" keeps its devices


def device_handle(slot: int):
    """An nvmlDevice_t as pynvml returns it: a new ctypes pointer object on every lookup,
    whose pointer value is the same for the same device (never dereferenced here)."""
    return ctypes.cast(ctypes.c_void_p(HANDLE_BASE + HANDLE_STEP * slot), pynvml.c_nvmlDevice_t)


def handle_slot(handle: Any) -> int | None:
    """The GPU slot a handle points at; None for anything that is not one of ours."""
    if not isinstance(handle, pynvml.c_nvmlDevice_t):
        return None
    offset = (ctypes.cast(handle, ctypes.c_void_p).value or 0) - HANDLE_BASE
    slot, rest = divmod(offset, HANDLE_STEP)
    return slot if offset >= 0 and rest == 0 else None


@dataclass
class FakeEventSet:
    number: int
    registered: dict[int, int] = field(default_factory=dict)  # GPU slot -> event type mask
    live: bool = True


@dataclass
class FakeEventData:
    """nvmlEventData_t: device handle, event type, Xid in eventData, MIG instance ids."""

    device: Any  # an nvmlDevice_t
    eventType: int  # pynvml's field names
    eventData: int
    gpuInstanceId: int = NO_INSTANCE
    computeInstanceId: int = NO_INSTANCE


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


class FakeNvml:
    """The pynvml module as the exporter sees it, over a list of FakeGpu."""

    # Constants and structs the backend reads from the module.
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    nvmlEventTypeXidCriticalError = XID_CRITICAL_ERROR

    def __init__(self, gpus: list[FakeGpu], *, driver_version: str = "570.124.06",
                 cuda_driver_version: int | Exception = 12080,
                 missing: set[str] | frozenset[str] = frozenset(),
                 driver_missing: set[str] | frozenset[str] = frozenset(),
                 memory_version_kwarg: bool = True, strings_as_bytes: bool = False,
                 library_missing: bool = False):
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.missing = set(missing)
        self.driver_missing = set(driver_missing)
        self.memory_version_kwarg = memory_version_kwarg
        self.strings_as_bytes = strings_as_bytes
        self.library_missing = library_missing
        self.init_error: Exception | None = None  # raised by nvmlInit (after library_missing)
        self.fail_all: Exception | None = None  # raised by every call but init/shutdown
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.memory_versions: list[int | None] = []  # the version= of each GetMemoryInfo call
        self.inits = 0
        self.shutdowns = 0
        self._refcount = 0
        self._lock = threading.Lock()
        self._gpm_samples: dict[int, dict[str, Any]] = {}  # address -> {buffer, slot, seq}
        self._gpm_seq = 0
        self._event_sets: list[FakeEventSet] = []
        self._events: deque[tuple[int, int] | Exception] = deque()  # (slot, xid) or an error
        self._event_ready = threading.Condition(self._lock)

    def __getattribute__(self, name: str) -> Any:
        if name in object.__getattribute__(self, "missing"):
            raise AttributeError(f"module 'pynvml' has no attribute '{name}'")
        return object.__getattribute__(self, name)

    # -- scenario controls (not pynvml calls) -------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    def count(self, fn: str, gpu: int | None = None) -> int:
        """Calls of `fn`, on GPU slot `gpu` or on all."""
        return sum(n for (name, slot), n in self.calls.items()
                   if name == fn and (gpu is None or slot == gpu))

    def lose(self, slot: int) -> None:
        self.gpus[slot].lost = True

    def restore(self, slot: int) -> None:
        self.gpus[slot].lost = False
        self.gpus[slot].present = True

    def unplug(self, slot: int) -> None:
        self.gpus[slot].present = False

    def push_xid(self, slot: int, xid: int) -> None:
        """An Xid on GPU `slot`, delivered by the next nvmlEventSetWait of a set it is on."""
        with self._event_ready:
            self._events.append((slot, xid))
            self._event_ready.notify_all()

    def push_wait_error(self, error: Exception) -> None:
        """The next nvmlEventSetWait raises `error` (e.g. GpuIsLost, Unknown)."""
        with self._event_ready:
            self._events.append(error)
            self._event_ready.notify_all()

    @property
    def live_gpm_samples(self) -> int:
        return len(self._gpm_samples)

    @property
    def live_event_sets(self) -> int:
        return sum(1 for s in self._event_sets if s.live)

    # -- helpers ------------------------------------------------------------------------------
    def _enter(self, fn: str, slot: int | None = None, symbol: str | None = None) -> None:
        self.calls[(fn, slot)] += 1
        if self.fail_all is not None:
            _raise(self.fail_all)
        if self._refcount == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if (symbol or fn) in self.driver_missing:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _visible(self) -> list[int]:
        return [slot for slot, g in enumerate(self.gpus) if g.present]

    def _gpu(self, fn: str, handle: Any, symbol: str | None = None) -> FakeGpu:
        slot = handle_slot(handle)
        self._enter(fn, slot, symbol)
        if slot is None or slot >= len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[slot]
        if gpu.lose_on == fn:
            gpu.lost = True
        if gpu.lost or not gpu.present:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _value(self, fn: str, handle: Any, attr: str) -> Any:
        return _answer(getattr(self._gpu(fn, handle), attr))

    def _string(self, text: str) -> str | bytes:
        return text.encode() if self.strings_as_bytes else text

    # -- lifecycle ------------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # pynvml's names
        self.calls[("nvmlInit", None)] += 1
        if self.library_missing:
            raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            _raise(self.init_error)
        self._refcount += 1
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.calls[("nvmlShutdown", None)] += 1
        if self._refcount == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refcount -= 1
        self.shutdowns += 1
        if self._refcount == 0:
            with self._event_ready:  # event sets die with the library
                for event_set in self._event_sets:
                    event_set.live = False
                self._event_ready.notify_all()

    # -- system and identity -----------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._string(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return _answer(self.cuda_driver_version)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        visible = self._visible()
        slot = visible[index] if 0 <= index < len(visible) else None
        self._enter("nvmlDeviceGetHandleByIndex", slot)
        if slot is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[slot].lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return device_handle(slot)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return self._visible().index(handle_slot(handle))

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return self._string(self._gpu("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._string(self._gpu("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id
        info.bus = int(gpu.pci_bus_id.split(":")[1], 16)
        return info

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        return list(self._value("nvmlDeviceGetMigMode", device, "mig_mode"))

    # -- readings -----------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Any):
        gpu_pct, memory_pct = self._value("nvmlDeviceGetUtilizationRates", handle, "utilization")
        return pynvml.c_nvmlUtilization_t(gpu=gpu_pct, memory=memory_pct)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None):
        if version is not None and not self.memory_version_kwarg:
            raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword argument "
                            "'version'")
        symbol = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle, symbol)
        self.memory_versions.append(version)
        total = _answer(gpu.memory_total)
        free = total - gpu.memory_used - gpu.memory_reserved
        if version:
            if version != pynvml.nvmlMemory_v2:
                raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            return pynvml.c_nvmlMemory_v2_t(version=version, total=total,
                                            reserved=gpu.memory_reserved, free=free,
                                            used=gpu.memory_used)
        # v1 counts the driver-reserved memory as used
        return pynvml.c_nvmlMemory_t(total=total, free=free,
                                     used=gpu.memory_used + gpu.memory_reserved)

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int,
                                  version: int = pynvml.nvmlTemperature_v1) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperatureV", handle)
        if version != pynvml.nvmlTemperature_v1:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._temperature(gpu, sensor)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._temperature(self._gpu("nvmlDeviceGetTemperature", handle), sensor)

    @staticmethod
    def _temperature(gpu: FakeGpu, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _answer(gpu.temperature_c)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list):
        """Succeeds as a call; each field carries its own nvmlReturn (check every one)."""
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, field_id in enumerate(fieldIds):
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            values[i].fieldId, values[i].scopeId = fid, scope
            answer = gpu.memory_temperature_c if fid == MEMORY_TEMP_FIELD else not_supported()
            if isinstance(answer, Exception):
                values[i].nvmlReturn = getattr(answer, "value", pynvml.NVML_ERROR_UNKNOWN)
                continue
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            values[i].value.uiVal = answer
        return values

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # mW
        return self._value("nvmlDeviceGetPowerUsage", handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:  # mW
        return self._value("nvmlDeviceGetEnforcedPowerLimit", handle, "power_limit_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:  # mJ
        return self._value("nvmlDeviceGetTotalEnergyConsumption", handle, "energy_mj")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetCurrPcieLinkGeneration", handle, "pcie_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetMaxPcieLinkGeneration", handle, "pcie_gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetCurrPcieLinkWidth", handle, "pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetMaxPcieLinkWidth", handle, "pcie_width_max")

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetPcieReplayCounter", handle, "pcie_replays")

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return self._clock("nvmlDeviceGetClockInfo", handle, type, "")

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return self._clock("nvmlDeviceGetMaxClockInfo", handle, type, "_max")

    def _clock(self, fn: str, handle: Any, clock: int, suffix: str) -> int:
        gpu = self._gpu(fn, handle)
        # NVML_CLOCK_GRAPHICS (0) and NVML_CLOCK_SM (1) run together; NVML_CLOCK_MEM is 2
        names = {0: "sm_clock", 1: "sm_clock", 2: "mem_clock"}
        if clock not in names:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _answer(getattr(gpu, f"{names[clock]}{suffix}_mhz"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetCurrentClocksEventReasons", handle, "clock_reasons")

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetSupportedClocksEventReasons", handle,
                           "clock_reasons_supported")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetCurrentClocksThrottleReasons", handle, "clock_reasons")

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetSupportedClocksThrottleReasons", handle,
                           "clock_reasons_supported")

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int,
                                    counterType: int) -> int:
        ecc = self._value("nvmlDeviceGetTotalEccErrors", handle, "ecc")
        if (errorType, counterType) not in ecc:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ecc[(errorType, counterType)]

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return tuple(self._value("nvmlDeviceGetRemappedRows", device, "remapped_rows"))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[FakeProcess]:
        procs = self._value("nvmlDeviceGetComputeRunningProcesses", handle, "processes")
        return [FakeProcess(pid, used) for pid, used in procs]

    # -- GPM (Hopper+) ------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: Any):
        supported = self._value("nvmlGpmQueryDeviceSupport", device, "gpm_supported")
        return pynvml.c_nvmlGpmSupport_t(version=pynvml.NVML_GPM_SUPPORT_VERSION,
                                         isSupportedDevice=1 if supported else 0)

    def nvmlGpmSampleAlloc(self):
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(64)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)
        self._gpm_samples[ctypes.addressof(buffer)] = {"buffer": buffer, "slot": None,
                                                       "seq": None}
        return sample

    def _sample(self, sample: Any) -> dict[str, Any]:
        address = ctypes.cast(sample, ctypes.c_void_p).value if sample is not None else None
        if address not in self._gpm_samples:  # NULL, freed or never allocated
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpm_samples[address]

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any):
        gpu = self._gpu("nvmlGpmSampleGet", device)
        if not _answer(gpu.gpm_supported):
            raise not_supported()
        if gpu.gpm_sample_error is not None:
            _raise(gpu.gpm_sample_error)
        record = self._sample(gpmSample)
        self._gpm_seq += 1
        record["slot"], record["seq"] = handle_slot(device), self._gpm_seq
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any):
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._sample(metricsGet.sample1), self._sample(metricsGet.sample2)
        if (first["slot"] is None or first["slot"] != second["slot"]
                or first["seq"] >= second["seq"]):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[first["slot"]]
        self.calls[("nvmlGpmMetricsGet", first["slot"])] += 1
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            answer = gpu.gpm.get(metric.metricId, not_supported())
            if isinstance(answer, Exception):
                metric.nvmlReturn = getattr(answer, "value", pynvml.NVML_ERROR_UNKNOWN)
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, answer
        return metricsGet

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._sample(gpmSample)
        del self._gpm_samples[ctypes.cast(gpmSample, ctypes.c_void_p).value]

    # -- events (Xid) -------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        with self._lock:
            event_set = FakeEventSet(len(self._event_sets))
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._value("nvmlDeviceGetSupportedEventTypes", handle, "supported_events")

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int,
                                 eventSet: FakeEventSet) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if gpu.register_events_error is not None:
            _raise(gpu.register_events_error)
        supported = _answer(gpu.supported_events)
        if eventTypes & ~supported or not eventSet.live:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            slot = handle_slot(handle)
            eventSet.registered[slot] = eventSet.registered.get(slot, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> FakeEventData:
        """The next queued event for a device on this set; Timeout when none comes in time
        (the wait is capped at 1 s so a test can never hang on it)."""
        self._enter("nvmlEventSetWait")
        with self._event_ready:
            self._event_ready.wait_for(
                lambda: self._events or not eventSet.live, min(timeoutms, 1000) / 1000)
            if not eventSet.live:
                raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
            while self._events:
                item = self._events.popleft()
                if isinstance(item, Exception):
                    _raise(item)
                slot, xid = item
                if eventSet.registered.get(slot, 0) & XID_CRITICAL_ERROR:
                    return FakeEventData(device_handle(slot), XID_CRITICAL_ERROR, xid)
                # not registered on this set: NVML would never deliver it here
        raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        with self._event_ready:
            eventSet.live = False
            self._event_ready.notify_all()


def _answer(value: Any) -> Any:
    if isinstance(value, Exception):
        _raise(value)
    return value


def _raise(error: Exception) -> None:
    """Raise a fresh copy, so a value raised every cycle does not grow its traceback."""
    if isinstance(error, pynvml.NVMLError):
        raise pynvml.NVMLError(error.value)
    raise type(error)(*error.args)


# -- machines ---------------------------------------------------------------------------------
H200_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")  # an HGX H200 baseboard


def h200_machine() -> FakeNvml:
    """8 HGX H200 (141 GB HBM3e, 700 W, Hopper) serving one SGLang TP-8 model; GPU 7 idle."""
    gpus = []
    for slot, bus in enumerate(H200_BUS_IDS):
        gpus.append(FakeGpu(
            uuid=uuid_for("9e", slot),
            pci_bus_id=f"00000000:{bus}:00.0",
            utilization=(87 + slot % 3, 41 + slot),
            memory_used=(126_300 + 8 * slot) * MiB,
            temperature_c=44 + slot % 4,
            memory_temperature_c=52 + slot % 3,
            power_mw=512_345 + 1_250 * slot,
            energy_mj=98_765_432_100 + 1_000_003 * slot,
            sm_clock_mhz=1755 if slot != 3 else 1410,
            clock_reasons=SW_POWER_CAP if slot == 3 else 0,
            processes=[(4242 + slot, (125_700 + 8 * slot) * MiB)],
        ))
    idle = gpus[7]  # no request routed to it yet
    idle.utilization, idle.power_mw, idle.sm_clock_mhz = (0, 0), 118_020, 345
    idle.clock_reasons = GPU_IDLE
    idle.gpm = {GPM_SM_UTIL: 0.0, GPM_SM_OCCUPANCY: 0.0, GPM_ANY_TENSOR_UTIL: 0.0,
                GPM_DRAM_BW_UTIL: 0.0}
    gpus[0].processes = [*gpus[0].processes, (31337, 512 * MiB)]  # a stray notebook
    return FakeNvml(gpus)


def consumer_machine() -> FakeNvml:
    """One RTX 4090 (Ada): no ECC, no row remapping, no HBM temperature, no GPM, no MIG."""
    gpu = FakeGpu(
        uuid=uuid_for("40", 0), name="NVIDIA GeForce RTX 4090", pci_bus_id="00000000:01:00.0",
        mig_mode=not_supported(), utilization=(63, 28), memory_total=24564 * MiB,
        memory_reserved=340 * MiB, memory_used=21_800 * MiB, temperature_c=58,
        memory_temperature_c=not_supported(), power_mw=312_600, power_limit_mw=450_000,
        energy_mj=4_321_000_000, pcie_gen=4, pcie_gen_max=4, sm_clock_mhz=2520,
        sm_clock_max_mhz=3105, mem_clock_mhz=10501, mem_clock_max_mhz=10501,
        clock_reasons_supported=ALL_CLOCK_REASONS, ecc=not_supported(),
        remapped_rows=not_supported(), gpm_supported=False, gpm={},
        supported_events=0x4 | XID_CRITICAL_ERROR | 0x10)
    return FakeNvml([gpu], driver_version="570.133.07", cuda_driver_version=12080)


def mig_machine() -> FakeNvml:
    """Two A100-SXM4-80GB: GPU 0 with MIG on (no utilization, no remapped rows), GPU 1 off."""
    gpus = []
    for slot in range(2):
        gpus.append(FakeGpu(
            uuid=uuid_for("a1", slot), name="NVIDIA A100-SXM4-80GB",
            pci_bus_id=f"00000000:{('07', '0F')[slot]}:00.0", memory_total=81920 * MiB,
            memory_reserved=486 * MiB, memory_used=61_000 * MiB, power_limit_mw=400_000,
            sm_clock_max_mhz=1410, mem_clock_mhz=1593, mem_clock_max_mhz=1593, pcie_gen=4,
            pcie_gen_max=4, gpm_supported=False, gpm={}))
    mig = gpus[0]
    mig.mig_mode = [1, 1]
    mig.utilization = not_supported()
    mig.remapped_rows = not_supported()
    return FakeNvml(gpus, driver_version="550.163.01", cuda_driver_version=12040)


OLD_BINDING_MISSING = frozenset({
    "nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons", "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet", "nvmlGpmSampleFree",
    "c_nvmlGpmMetricsGet_t", "NVML_GPM_METRICS_GET_VERSION"})
OLD_DRIVER_MISSING = frozenset({
    "nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlGpmQueryDeviceSupport"})


def old_driver_machine(old_bindings: bool = True) -> FakeNvml:
    """One V100 on a 470 driver. old_bindings: an old pynvml too (the newer calls are missing,
    GetMemoryInfo has no version=, strings come back as bytes); else a current pynvml whose
    newer calls raise FunctionNotFound from the old driver."""
    gpu = FakeGpu(
        uuid=uuid_for("70", 0), name="Tesla V100-SXM2-32GB", pci_bus_id="00000000:06:00.0",
        mig_mode=not_supported(), utilization=(75, 33), memory_total=32510 * MiB,
        memory_reserved=310 * MiB, memory_used=30_100 * MiB, temperature_c=61,
        memory_temperature_c=57, power_mw=243_870, power_limit_mw=300_000,
        energy_mj=7_654_321_000, pcie_gen=3, pcie_gen_max=3, sm_clock_mhz=1530,
        sm_clock_max_mhz=1530, mem_clock_mhz=877, mem_clock_max_mhz=877,
        clock_reasons=SW_POWER_CAP, remapped_rows=not_supported(), gpm_supported=False, gpm={})
    if old_bindings:
        return FakeNvml([gpu], driver_version="470.256.02", cuda_driver_version=11040,
                        missing=OLD_BINDING_MISSING, memory_version_kwarg=False,
                        strings_as_bytes=True)
    return FakeNvml([gpu], driver_version="470.256.02", cuda_driver_version=11040,
                    driver_missing=OLD_DRIVER_MISSING)
