"""PD deployment scenarios: prefill and decode pools, the KV link, the gateway, a load
timeline, faults and the deployment's ground truth, from YAML (simulator/scenarios/pd-*.yaml).

    name: pd-healthy
    description: one line
    duration: 1800
    seed: 11
    release: "0.5.23"
    prefill: {count: 2, server: {...ServerConfig}, perf: {...PerfModel}}
    decode:  {count: 2, server: {...}, perf: {...}}
    transfer: {kv_bytes_per_token: 131072, bandwidth_gb_s: 25, ...}   # Transfer fields
    gateway: {decode_policy: power_of_two, max_retries: 3, ...}        # GatewayConfig fields
    load: [...]                        # as a single-server scenario (simulator/scenario.py)
    faults:
      - {at: 600, duration: 600, kind: bandwidth_collapse, factor: 0.05}      # worker: decode-N
      - {at: 600, duration: 600, kind: bootstrap_timeout, share: 0.2, timeout: 20}
      - {at: 600, duration: 600, kind: transfer_failure, share: 0.1}
      - {at: 600, duration: 600, kind: worker_errors, worker: decode-1}
      - {at: 600, duration: 600, kind: routing_skew, worker: decode-0, share: 0.8}
    truth:                             # the deployment's verdict (PD_STATES) when
      - {from: 660, to: 1200, class: kv_transfer_bottleneck}

Every error is a ScenarioError naming the file and the field.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_obs.core.states import PD_STATES
from sglang_obs.simulator import scenario as single
from sglang_obs.simulator.gateway import POLICIES, GatewayConfig
from sglang_obs.simulator.model import PerfModel, ServerConfig
from sglang_obs.simulator.profiles import ALIASES
from sglang_obs.simulator.scenario import SCENARIO_DIR, ScenarioError, Truth

PREFIX = "pd-"  # shipped PD scenarios are simulator/scenarios/pd-*.yaml
ROLES = ("prefill", "decode")
PD_RELEASES = ("0.5.23",)  # conformance/goldens/<release>/pd-* that the engines match
FAULT_KINDS = ("bandwidth_collapse", "bootstrap_timeout", "transfer_failure", "worker_errors",
               "routing_skew")


@dataclass(frozen=True)
class Transfer:
    """The KV path from prefill to decode (scenario key `transfer:`)."""

    # KV bytes per prompt token, all layers: fp8 K and V of 64 layers x 8 KV heads x 128 dims.
    kv_bytes_per_token: int = 131_072
    # Each decode server's receive link (GB/s), shared equally by its concurrent transfers.
    bandwidth_gb_s: float = 25.0
    handshake_s: float = 0.003  # decode side's bootstrap with the prefill server
    alloc_s: float = 0.0005  # prefill side's metadata buffer once the decode side is ready
    # A decode server preallocates a request's prompt only with this many tokens to spare per
    # request it holds (its decode growth).
    decode_reserved_tokens: int = 512


@dataclass(frozen=True)
class Pool:
    count: int
    server: ServerConfig
    perf: PerfModel


@dataclass(frozen=True)
class PdFault:
    at: float
    kind: str
    duration: float
    factor: float = 1.0  # bandwidth_collapse: the link's bandwidth x this
    share: float = 1.0  # bootstrap_timeout, transfer_failure, routing_skew: the share hit
    timeout: float = 30.0  # bootstrap_timeout: seconds until the bootstrap gives up
    worker: str | None = None  # "prefill-N" / "decode-N"; bandwidth_collapse: all if None

    def active(self, t: float) -> bool:
        return self.at <= t < self.at + self.duration


@dataclass
class PdScenario:
    name: str
    description: str
    duration: float
    seed: int
    release: str
    prefill: Pool
    decode: Pool
    transfer: Transfer
    gateway: GatewayConfig
    phases: list[dict[str, Any]]
    faults: list[PdFault] = field(default_factory=list)
    truth: list[Truth] = field(default_factory=list)

    def arrivals(self) -> list[dict[str, Any]]:
        """Every client request of the timeline, by arrival (deterministic for the seed)."""
        rng = random.Random(self.seed)
        out: list[tuple[float, dict]] = []
        for phase in self.phases:
            out += single._phase_arrivals(phase, rng, self.duration)
        out.sort(key=lambda item: item[0])
        sessions = random.Random(self.seed + 1)
        return [{"rid": i, "arrival": t, **spec,
                 "session": sessions.randrange(self.gateway.sessions)}
                for i, (t, spec) in enumerate(out)]


def available() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob(f"{PREFIX}*.yaml"))


def load(name_or_path: str) -> PdScenario:
    """A shipped PD scenario by name, or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
        if not name_or_path.startswith(PREFIX) or not path.is_file():
            raise ScenarioError(f"no PD scenario {name_or_path!r}; shipped: "
                                f"{', '.join(available())}")
    if not path.is_file():
        raise ScenarioError(f"{path}: no such file")
    return from_dict(single.read_yaml(path), str(path))


def from_dict(data: Any, where: str = "scenario") -> PdScenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected a mapping at the top level")
    try:
        known = {"name", "description", "duration", "seed", "release", "prefill", "decode",
                 "transfer", "gateway", "load", "faults", "truth"}
        unknown = set(data) - known
        if unknown:
            raise ScenarioError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        duration = single._positive(data.get("duration"), "duration")
        pools = {role: _pool(data.get(role), role) for role in ROLES}
        gateway = single._dataclass(GatewayConfig, _mapping(data.get("gateway"), "gateway"),
                                    "gateway")
        for role in ROLES:
            policy = getattr(gateway, f"{role}_policy")
            if policy not in POLICIES:
                raise ScenarioError(f"gateway.{role}_policy: {policy!r} is not one of "
                                    f"{', '.join(POLICIES)}")
        _at_least(gateway.max_retries, 0, "gateway.max_retries")
        _at_least(gateway.cb_failure_threshold, 1, "gateway.cb_failure_threshold")
        _at_least(gateway.cb_success_threshold, 1, "gateway.cb_success_threshold")
        _at_least(gateway.sessions, 1, "gateway.sessions")
        for name in ("cb_timeout_s", "load_poll_s"):
            single._positive(getattr(gateway, name), f"gateway.{name}")
        transfer = single._dataclass(Transfer, _mapping(data.get("transfer"), "transfer"),
                                     "transfer")
        single._positive(transfer.bandwidth_gb_s, "transfer.bandwidth_gb_s")
        _at_least(transfer.kv_bytes_per_token, 1, "transfer.kv_bytes_per_token")
        workers = {f"{role}-{i}" for role in ROLES for i in range(pools[role].count)}
        sc = PdScenario(
            name=str(data.get("name") or Path(where).stem),
            description=str(data.get("description", "")),
            duration=duration,
            seed=int(data.get("seed", 1)),
            release=str(data.get("release", "0.5.23")),
            prefill=pools["prefill"], decode=pools["decode"], transfer=transfer,
            gateway=gateway,
            phases=[single._phase(p, i) for i, p in enumerate(_list(data.get("load"), "load"))],
            faults=[_fault(f, i, workers) for i, f in enumerate(_list(data.get("faults"),
                                                                      "faults"))],
            truth=[_truth(t, i) for i, t in enumerate(_list(data.get("truth"), "truth"))],
        )
    except ScenarioError as err:
        raise ScenarioError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ScenarioError(f"{where}: {err}") from None
    if ALIASES.get(sc.release) not in PD_RELEASES:
        raise ScenarioError(f"{where}: release: {sc.release!r}: a PD deployment is simulated as "
                            f"SGLang {', '.join(PD_RELEASES)} (its PD goldens)")
    return sc


def _mapping(value: Any, name: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ScenarioError(f"{name}: expected a mapping, got {value!r}")
    return value


def _list(value: Any, name: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ScenarioError(f"{name}: expected a list, got {value!r}")
    return value


def _at_least(value: Any, low: int, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ScenarioError(f"{name}: expected a whole number >= {low}, got {value!r}")


def _pool(value: Any, role: str) -> Pool:
    spec = _mapping(value, role)
    unknown = set(spec) - {"count", "server", "perf"}
    if unknown:
        raise ScenarioError(f"{role}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    count = spec.get("count", 2)
    _at_least(count, 1, f"{role}.count")
    server = single._dataclass(ServerConfig, _mapping(spec.get("server"), f"{role}.server"),
                               f"{role}.server")
    if server.dp_size != 1:
        raise ScenarioError(f"{role}.server.dp_size: a PD engine is modelled with one DP rank, "
                            f"got {server.dp_size}")
    perf = single._dataclass(PerfModel, _mapping(spec.get("perf"), f"{role}.perf"),
                             f"{role}.perf")
    return Pool(count, server, perf)


def _fault(f: Any, i: int, workers: set[str]) -> PdFault:
    where = f"faults[{i}]"
    if not isinstance(f, dict) or f.get("kind") not in FAULT_KINDS:
        raise ScenarioError(f"{where}.kind: must be one of {', '.join(FAULT_KINDS)}")
    fault = single._dataclass(PdFault, f, where)
    single._positive(fault.duration, f"{where}.duration")
    if fault.at < 0:
        raise ScenarioError(f"{where}.at: must not be negative, got {fault.at!r}")
    if not 0 <= fault.share <= 1:
        raise ScenarioError(f"{where}.share: must be within 0..1, got {fault.share!r}")
    single._positive(fault.factor, f"{where}.factor")
    single._positive(fault.timeout, f"{where}.timeout")
    allowed = {"worker_errors": ("prefill-", "decode-"), "routing_skew": ("decode-",),
               "bandwidth_collapse": ("decode-",)}.get(fault.kind, ())
    if fault.kind in ("worker_errors", "routing_skew") and fault.worker is None:
        raise ScenarioError(f"{where}.worker: {fault.kind} needs one")
    if fault.worker is not None and not (fault.worker in workers
                                         and fault.worker.startswith(allowed)):
        choices = sorted(w for w in workers if w.startswith(allowed))
        raise ScenarioError(f"{where}.worker: {fault.worker!r} is not one of "
                            f"{', '.join(choices) or '(none: this fault takes no worker)'}")
    return fault


def _truth(t: Any, i: int) -> Truth:
    if not isinstance(t, dict) or t.get("class") not in PD_STATES:
        raise ScenarioError(f"truth[{i}].class: must be one of {', '.join(PD_STATES)}")
    try:
        start, end = float(t["from"]), float(t["to"])
    except (KeyError, TypeError, ValueError):
        raise ScenarioError(f"truth[{i}]: needs numbers from and to") from None
    if end <= start:
        raise ScenarioError(f"truth[{i}]: to ({end:g}) must be after from ({start:g})")
    return Truth(start, end, t["class"])
