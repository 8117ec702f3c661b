"""GPU sampling in the background, independent of the scrape rate.

NVML sampling every 100 ms measurably slows decoding, so the default is every 5 s. Each cycle
reads all GPUs into an immutable NvmlReading the collector renders; a lost GPU shuts NVML down
and the next cycle re-initialises it. No NVML at all is logged once and reported as
sglang_obs_gpu_collector_up 0; the sampler keeps trying, quietly, in case a driver appears.
"""

from __future__ import annotations

import logging
import threading
import time

from sglang_obs.exporter.nvml import NvmlBackend, NvmlReading, NvmlUnavailable
from sglang_obs.exporter.periodic import Periodic
from sglang_obs.exporter.xid import XidWatcher

log = logging.getLogger(__name__)
GPU_LOST_XID = 79  # NVML's GpuIsLost is Xid 79, "fallen off the bus"


class GpuSampler:
    def __init__(self, backend: NvmlBackend, xid: XidWatcher | None = None,
                 interval: float = 5.0, process_servers=None, on_change=lambda: None):
        self.backend = backend
        self._on_change = on_change  # told after each sample (the exposition re-renders)
        # pid -> SGLang server; it reads /proc, so it runs here, never on the scrape path.
        self.process_servers = process_servers or (lambda pid: "")
        self.xid = xid
        self.interval = interval
        self.reading = NvmlReading(False, [])
        self.last_success: float | None = None
        self.unavailable_reason: str | None = None
        self._warned = False
        self._lost: set[str] = set()
        self._xid_started = False

    def sample(self) -> NvmlReading:
        try:
            reading = self.backend.read()
        except NvmlUnavailable as err:
            if not self._warned:  # once: a host without GPUs is not an incident
                log.warning("GPU collector down: NVML unavailable (%s: %s); GPU metrics are "
                            "off, the rest of the exporter is not", err.reason, err)
                self._warned = True
            self.unavailable_reason = err.reason
            self.reading = NvmlReading(False, [])
            return self.reading
        self.unavailable_reason = None
        for gpu in reading.gpus:  # a lost GPU is Xid 79 even when no event arrives
            if not gpu.up and gpu.uuid not in self._lost and self.xid is not None:
                self.xid.record(str(gpu.index), gpu.uuid, GPU_LOST_XID)
            (self._lost.add if not gpu.up else self._lost.discard)(gpu.uuid)
        for gpu in reading.gpus:
            for pid, used in gpu.processes:
                server = self.process_servers(pid)
                gpu.process_memory[server] = gpu.process_memory.get(server, 0.0) + used
        if reading.ok:
            self.last_success = time.time()
        self.reading = reading
        return reading

    def start(self, stop: threading.Event) -> None:
        Periodic("nvml", lambda: self._cycle(stop), self.interval).start(stop)

    def _cycle(self, stop: threading.Event) -> None:
        reading = self.sample()
        self._on_change()
        # The watcher registers for events on the GPUs NVML lists: start it once NVML answers.
        if reading.ok and self.xid is not None and not self._xid_started:
            self.xid.start(stop)
            self._xid_started = True
