"""Container health of the SGLang servers, from the Docker API (read-only calls only).

For each container the exporter is told about (`--docker.container NAME[=SGLANG_URL]`, or all
containers with `--docker.label KEY=VALUE`): state, restart count, OOM kills, last exit code,
health status, start time. The client comes in through the constructor, so tests use a fake.

Mounting the Docker socket gives read access to every container's config (environment
variables included) on the host: mount it read-only, into this exporter only, and only where
this source is wanted (docs/containers.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContainerReading:
    name: str
    server: str  # SGLang server label ("" when not mapped)
    image: str
    state: str  # created | running | restarting | paused | exited | dead
    running: bool
    restart_count: int
    oom_killed: bool  # the last exit was an OOM kill
    oom_kills: int  # OOM kills seen by this exporter since it started
    exit_code: int
    health: str  # healthy | unhealthy | starting | "" (no healthcheck)
    started_at: float | None


def _timestamp(text: Any) -> float | None:
    if not isinstance(text, str) or text.startswith("0001-"):
        return None
    text = text.rstrip("Z")
    main, _, frac = text.partition(".")
    try:
        ts = datetime.fromisoformat(main + "+00:00").timestamp()
    except ValueError:
        return None
    return ts + float("0." + frac[:6]) if frac[:6].isdigit() else ts


class ContainerSource:
    """Polls the Docker API; `readings` holds the last result, `up` whether the API answered."""

    def __init__(self, client, names: dict[str, str], labels: dict[str, str] | None = None):
        self._client = client
        self._names = names  # container name -> server label
        self._labels = labels or {}
        self._oom_seen: dict[str, set[str]] = {}
        self._oom_kills: dict[str, int] = {}
        self.readings: list[ContainerReading] = []
        self.up = False
        self.errors = 0

    def _containers(self):
        found = []
        for name, server in self._names.items():
            try:
                found.append((self._client.containers.get(name), server))
            except Exception as err:  # NotFound: report it as missing, keep the others
                if type(err).__name__ != "NotFound":
                    raise
                log.debug("container %s not found", name)
        if self._labels:
            filters = {"label": [f"{k}={v}" if v else k for k, v in self._labels.items()]}
            for c in self._client.containers.list(all=True, filters=filters):
                if c.name not in self._names:
                    found.append((c, c.labels.get("sglang-obs.server", "")))
        return found

    def poll(self) -> None:
        try:
            containers = self._containers()
        except Exception as err:
            self.up = False
            self.errors += 1
            log.warning("Docker API: %s", type(err).__name__)
            return
        readings = []
        for container, server in containers:
            attrs = container.attrs or {}
            state = attrs.get("State") or {}
            name = (attrs.get("Name") or container.name or "").lstrip("/")
            oom = bool(state.get("OOMKilled"))
            if oom:  # count each OOM exit once, keyed by when it happened
                seen = self._oom_seen.setdefault(name, set())
                finished = str(state.get("FinishedAt", ""))
                if finished not in seen:
                    seen.add(finished)
                    self._oom_kills[name] = self._oom_kills.get(name, 0) + 1
            readings.append(ContainerReading(
                name=name, server=server,
                image=str((attrs.get("Config") or {}).get("Image", ""))[:200],
                state=str(state.get("Status", "unknown")), running=bool(state.get("Running")),
                restart_count=int(attrs.get("RestartCount") or 0), oom_killed=oom,
                oom_kills=self._oom_kills.get(name, 0), exit_code=int(state.get("ExitCode") or 0),
                health=str((state.get("Health") or {}).get("Status", "")),
                started_at=_timestamp(state.get("StartedAt"))))
        self.readings = readings
        self.up = True


def docker_client():
    """The Docker client from the environment, or None with one clear log line."""
    try:
        import docker  # optional at run time

        client = docker.from_env(timeout=5)
        client.ping()
        return client
    except Exception as err:
        log.warning("container source off: no Docker API reachable (%s); mount "
                    "/var/run/docker.sock read-only to enable it", type(err).__name__)
        return None
