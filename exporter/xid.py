"""Xid events from NVML's event API, in a background thread with a bounded wait.

Counts per (gpu, uuid, xid) and keeps the last time each was seen: alerts fire on the
timestamp (increase() misses the first event of a new series). The state lives here, outside
the sampling cycle, so it stays visible when collections fail — which is when Xids happen.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)
XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event in the wait


class XidWatcher:
    def __init__(self, nvml: Any, wait_ms: int = 1000, on_change=lambda: None):
        self.nvml = nvml
        self._on_change = on_change  # told after each event (the exposition re-renders)
        self.wait_ms = wait_ms
        self.counts: dict[tuple[str, str, str], int] = {}  # (gpu, uuid, xid) -> events
        self.last_seen: dict[tuple[str, str, str], float] = {}
        self.restarts = 0
        self.running = False
        self._lock = threading.Lock()

    def record(self, gpu: str, uuid: str, xid: int, at: float | None = None) -> None:
        key = (gpu, uuid, str(xid))
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            self.last_seen[key] = time.time() if at is None else at
        self._on_change()

    def snapshot(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self.counts), dict(self.last_seen)

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._run, args=(stop,), name="xid", daemon=True).start()

    def _run(self, stop: threading.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            try:
                self._watch(stop)
                return
            except Exception as err:  # NVML went away: wait, then register again
                self.running = False
                self.restarts += 1
                log.warning("Xid watcher stopped (%s); restarting in %.0fs",
                            type(err).__name__, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch(self, stop: threading.Event) -> None:
        nvml = self.nvml
        events = nvml.nvmlEventSetCreate()
        devices = {}
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                try:  # a lost GPU must not stop the others from being watched
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    if nvml.nvmlDeviceGetSupportedEventTypes(handle) & XID_CRITICAL_ERROR:
                        nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL_ERROR, events)
                        devices[_handle_key(handle)] = (str(index),
                                                        _text(nvml.nvmlDeviceGetUUID(handle)))
                except Exception as err:  # vGPU and some drivers: no events for this device
                    log.info("GPU %s: no Xid events (%s)", index, type(err).__name__)
            self.running = True
            while not stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(events, self.wait_ms)
                except Exception as err:
                    if getattr(err, "value", None) == TIMEOUT:
                        continue
                    raise
                gpu, uuid = devices.get(_handle_key(data.device), ("", ""))
                if not uuid:  # a device registered under another handle value: ask it
                    try:
                        uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
                        gpu = str(nvml.nvmlDeviceGetIndex(data.device))
                    except Exception as err:  # e.g. GpuIsLost for Xid 79: keep the event
                        log.debug("Xid on an unknown device: %s", err)
                self.record(gpu, uuid, int(data.eventData))
        finally:
            self.running = False
            try:
                nvml.nvmlEventSetFree(events)
            except Exception as err:
                log.debug("nvmlEventSetFree: %s", err)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Any:
    """The device a handle points at: pynvml returns a new ctypes object for each lookup and
    each event, so id() of a (freed) handle object names nothing; its pointer value does."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle
