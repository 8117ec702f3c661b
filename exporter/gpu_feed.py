"""The demo's GPUs: an NVML backend answered from a feed URL of GPU readings instead of a driver.

`--collector.nvml.simulator-feed URL` points the exporter at a JSON list of readings, one per GPU
(`sglang-sim --gpu-feed` serves them at /sim/gpu). `FeedNvml` answers the pynvml calls the NVML
backend and the Xid watcher make, event API included, so everything above this module runs
unchanged on it. A reading's fields:

    utilization_ratio, memory_total_bytes, memory_used_bytes, power_watts, power_limit_watts,
    energy_joules, temperature_celsius, sm_clock_hertz, sm_clock_max_hertz, thermal_throttle,
    xid_events: [[unix time, xid], ...]
    lost: true when the GPU has fallen off the bus (every call on it raises GpuIsLost)

It must never stand in for a real GPU by accident: `FeedNvml.from_feed` refuses to start when the
real NVML library initialises and sees a device. A host with a GPU reports its real GPUs.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from sglang_obs.exporter.nvml import GPU_IS_LOST
from sglang_obs.exporter.xid import TIMEOUT, XID_CRITICAL_ERROR


class RealGpuPresent(RuntimeError):
    """A real GPU answered NVML: the fake feed is refused."""


def real_gpu_count(pynvml_module: Any = None) -> int:
    """Number of real GPUs NVML sees; 0 when the library or driver is absent."""
    try:
        nvml = pynvml_module
        if nvml is None:
            import pynvml as nvml  # optional at import time
        nvml.nvmlInit()
    except Exception:  # no library, no driver, no device: that is the demo host
        return 0
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


class FeedNvml:
    """The pynvml subset, per GPU index, from a `readings()` callable of reading dicts."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN = 0x40

    def __init__(self, readings: Callable[[], list[dict[str, Any]]]):
        self._readings = readings
        self._cache: list[dict[str, Any]] = []

    @classmethod
    def from_feed(cls, url: str, pynvml_module: Any = None, timeout: float = 2.0) -> FeedNvml:
        if real_gpu_count(pynvml_module) > 0:
            raise RealGpuPresent("a real GPU is present: refusing the simulator's fake GPU feed")

        def fetch() -> list[dict[str, Any]]:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return json.loads(resp.read(1 << 20))

        return cls(fetch)

    # -- the calls ---------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # pynvml's names
        self._cache = self._readings()

    def nvmlShutdown(self) -> None:
        self._cache = []

    def nvmlDeviceGetCount(self) -> int:
        return len(self._cache)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._cache = self._readings() if index == 0 else self._cache
        return index

    def _gpu(self, handle: int) -> dict[str, Any]:
        reading = self._cache[handle]
        if reading.get("lost"):
            raise FeedGpuLost()
        return reading

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        util = round(self._gpu(handle)["utilization_ratio"] * 100)
        return _Struct(gpu=util, memory=util // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None):
        g = self._gpu(handle)
        return _Struct(total=g["memory_total_bytes"], used=g["memory_used_bytes"],
                       free=g["memory_total_bytes"] - g["memory_used_bytes"], reserved=0)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # milliwatts
        return int(self._gpu(handle)["power_watts"] * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return int(self._gpu(handle)["power_limit_watts"] * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:  # mJ
        return int(self._gpu(handle)["energy_joules"] * 1000)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return int(self._gpu(handle)["temperature_celsius"])

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:  # MHz
        return int(self._gpu(handle)["sm_clock_hertz"] / 1e6)

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock: int) -> int:
        return int(self._gpu(handle)["sm_clock_max_hertz"] / 1e6)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        g = self._gpu(handle)
        return self.NVML_CLOCKS_EVENT_REASON_HW_THERMAL_SLOWDOWN if g["thermal_throttle"] else 0

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-5151a000-0000-4000-8000-{handle:012d}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "Simulated GPU"

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[int]):
        """Only NVML_FI_DEV_MEMORY_TEMP (82): the HBM runs a little warmer than the GPU."""
        hbm = int(self._gpu(handle)["temperature_celsius"]) + 6
        return [_Struct(fieldId=f, nvmlReturn=0 if f == 82 else 3, valueType=1,
                        value=_Struct(uiVal=hbm)) for f in field_ids]

    # ECC, row remapping and PCIe of a healthy datacenter GPU: present, and clean.
    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        return 0

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return (0, 0, 0, 0)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return 5

    nvmlDeviceGetMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return 16

    nvmlDeviceGetMaxPcieLinkWidth = nvmlDeviceGetCurrPcieLinkWidth

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        return 0

    # GPM (Hopper): activity ratios that follow the simulated utilisation.
    NVML_GPM_METRICS_GET_VERSION = 1

    class c_nvmlGpmMetricsGet_t:  # pynvml's struct name
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [_Struct(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]

    def nvmlGpmQueryDeviceSupport(self, handle: int):
        return _Struct(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self):
        return _Struct(util=0.0)

    def nvmlGpmSampleGet(self, handle: int, sample) -> None:
        sample.util = self._gpu(handle)["utilization_ratio"]

    def nvmlGpmMetricsGet(self, request):
        share = {2: 1.0, 3: 0.6, 5: 0.7, 10: 0.5}  # SM active, occupancy, tensor, DRAM
        for m in request.metrics[:request.numMetrics]:
            m.value = 100 * request.sample2.util * share.get(m.metricId, 0.0)
        return request

    def nvmlGpmSampleFree(self, sample) -> None:
        pass

    # The event API, as the Xid watcher uses it: each of a reading's Xid events is delivered
    # once, in the order of their times; with none pending the wait times out like NVML's.
    def nvmlEventSetCreate(self) -> set:  # the delivered (uuid, time, xid)
        return set()

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return XID_CRITICAL_ERROR

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: set) -> None:
        pass

    def nvmlEventSetWait(self, event_set: set, timeout_ms: int):
        readings = self._cache  # the sampler replaces it; read one version
        pending = sorted((float(at), index, int(xid)) for index, g in enumerate(readings)
                         for at, xid in g.get("xid_events", ()))
        for at, index, xid in pending:
            key = (self.nvmlDeviceGetUUID(index), at, xid)
            if key not in event_set:
                event_set.add(key)
                return _Struct(device=index, eventData=xid, timestamp=int(at * 1e6))
        time.sleep(timeout_ms / 1000)
        raise FeedTimeout()

    def nvmlEventSetFree(self, event_set: set) -> None:
        event_set.clear()

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle


class FeedGpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST, as pynvml raises it for a GPU that fell off the bus."""

    value = GPU_IS_LOST


class FeedTimeout(Exception):
    """NVML_ERROR_TIMEOUT, as pynvml raises it: no event within the wait."""

    value = TIMEOUT


class _Struct:
    def __init__(self, **fields: Any):
        self.__dict__.update(fields)
