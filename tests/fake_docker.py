"""A fake docker SDK client: containers whose attrs tests change to play restarts, OOM kills
and exits (the same attrs shape the Docker API returns)."""

from __future__ import annotations


class NotFound(Exception):  # the docker SDK's name
    pass


class FakeContainer:
    def __init__(self, name, labels=None, log_chunks=None):
        self.name = name
        self.labels = labels or {}
        self.log_chunks = list(log_chunks or [])
        self.attrs = {
            "Name": "/" + name, "RestartCount": 0, "Config": {"Image": "lmsysorg/sglang:v0.5.23"},
            "State": {"Status": "running", "Running": True, "OOMKilled": False, "ExitCode": 0,
                      "StartedAt": "2026-11-29T10:00:00.123456789Z",
                      "FinishedAt": "0001-01-01T00:00:00Z"},
        }

    def restart_after(self, exit_code, oom=False, finished="2026-11-29T10:05:00Z",
                      started="2026-11-29T10:05:03Z"):
        state = self.attrs["State"]
        state.update(ExitCode=exit_code, OOMKilled=oom, FinishedAt=finished, StartedAt=started)
        self.attrs["RestartCount"] += 1

    def exit(self, exit_code, oom=False, finished="2026-11-29T10:09:00Z"):
        self.attrs["State"].update(Status="exited", Running=False, ExitCode=exit_code,
                                   OOMKilled=oom, FinishedAt=finished)

    def logs(self, stream=False, follow=False, since=None):
        yield from self.log_chunks


class FakeContainers:
    def __init__(self, client):
        self._client = client

    def get(self, name):
        if self._client.broken:
            raise ConnectionError("docker.sock: connection refused")
        if name not in self._client.by_name:
            raise NotFound(name)
        return self._client.by_name[name]

    def list(self, all=False, filters=None):  # the SDK's argument name
        wanted = (filters or {}).get("label", [])
        out = []
        for c in self._client.by_name.values():
            for want in wanted:
                key, _, value = want.partition("=")
                if key in c.labels and (not value or c.labels[key] == value):
                    out.append(c)
                    break
        return out


class FakeDocker:
    def __init__(self, *containers):
        self.by_name = {c.name: c for c in containers}
        self.broken = False
        self.containers = FakeContainers(self)
