"""Scenarios: a server config, a load timeline, faults and the ground truth, from YAML.

A scenario file (simulator/scenarios/*.yaml, or any path) looks like:

    name: healthy
    description: one line
    duration: 1800            # seconds
    seed: 7                   # arrivals are random but reproducible
    release: "0.5.23"         # default release profile
    server: {tp_size: 4, max_running_requests: 44, ...}   # simulator.model.ServerConfig fields
    perf: {decode_s_per_kv_token: 1.2e-8, ...}             # simulator.model.PerfModel fields
    warm_cache: 0.5           # share of the KV pool holding reusable prefixes at start
    load:                     # phases; `rate` (Poisson, requests/s; {ramp: [a, b]} changes
                              # linearly over the phase) or `burst` (n at once)
      - {at: 0, duration: 1800, rate: 0.3, input_tokens: {uniform: [2000, 8000]},
         cached_fraction: 0.5, output_tokens: {normal: [400, 150]}, streaming: 0.8}
      - {at: 600, burst: 6, spread: 10, input_tokens: 100000, cached_fraction: 0.2}
      # with server.speculative_algorithm: tokens per decode step of this phase's requests
      # (how well the draft model predicts them; default server.spec_accept_length)
      - {at: 900, rate: 0.3, spec_accept_length: {uniform: [1.0, 1.2]}}
      # the distinct reusable prefix tokens this phase's requests draw their prefixes from (a
      # ramp: a growing working set); a prefix is then on the device with the chance that the
      # radix cache holds it, else in HiCache's host tier with the chance that tier holds it
      - {at: 1000, rate: 0.5, working_set_tokens: {ramp: [100000, 600000]}}
      # with server.enable_lora: each request names one of this many adapters, at random
      - {at: 1200, rate: 0.5, lora_adapters: 24}
      # structured output: this share of the requests carry a grammar, one of this many
      # schemas (without grammar_schemas every schema is new), compiled on a cache miss
      - {at: 1300, rate: 0.5, structured_output: 0.6, grammar_schemas: 40,
         grammar_compile_seconds: {uniform: [0.5, 2.0]}}
      # with server.enable_priority_scheduling: each request's priority, by share
      - {at: 1400, rate: 0.5, priorities: {10: 0.7, 0: 0.3}}
    faults:
      - {at: 900, kind: crash, downtime: 40}
      - {at: 1200, kind: gpu_slowdown, factor: 0.5, duration: 300}
      - {at: 1300, kind: xid, gpu: 1, xid: 79}
      - {at: 1400, kind: gpu_lost, gpu: 1}   # off the bus: Xid 79, NVML GpuIsLost, server dies
    truth:                    # which bottleneck class holds when
      - {from: 600, to: 700, class: prefill_backlog}

Token values are a number, {uniform: [lo, hi]}, {normal: [mean, stddev]} (clipped at 1), or
{ramp: [start, end]} (linear over the phase, with +-10 % jitter).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sglang_obs.simulator.model import PerfModel, Request, ServerConfig

SCENARIO_DIR = Path(__file__).parent / "scenarios"
# The server states of the classification, and gpu_lost: a host fault that takes the server with
# it (its alert is GPULost, not the server's state).
CLASSES = ("unavailable", "idle", "healthy", "prefill_backlog", "decode_contention",
           "kv_capacity", "scheduling_bottleneck", "gpu_lost", "spec_collapsed",
           "hicache_dropping", "grammar_backlog")
FAULT_KINDS = ("crash", "gpu_slowdown", "xid", "gpu_lost")


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file and the field."""


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    downtime: float = 30.0
    factor: float = 1.0
    duration: float | None = None
    gpu: int = 0
    xid: int = 79


@dataclass(frozen=True)
class Truth:
    start: float
    end: float
    cls: str


@dataclass
class Scenario:
    name: str
    description: str
    duration: float
    seed: int
    release: str
    server: ServerConfig
    perf: PerfModel
    warm_cache: float
    phases: list[dict[str, Any]]
    faults: list[Fault] = field(default_factory=list)
    truth: list[Truth] = field(default_factory=list)

    def arrivals(self) -> list[Request]:
        """Every request of the timeline, sorted by arrival (deterministic for the seed)."""
        rng = random.Random(self.seed)
        out: list[tuple[float, dict]] = []
        for phase in self.phases:
            out += _phase_arrivals(phase, rng, self.duration)
        out.sort(key=lambda item: item[0])
        return [Request(rid=i, arrival=t, **spec) for i, (t, spec) in enumerate(out)]


def available() -> list[str]:
    # pd-*.yaml are PD deployments (simulator/pd_scenario.py, `sglang-sim pd`), not one server;
    # scale-*.yaml are a pool's traffic over hours (simulator/autoscale.py), validated in
    # docs/scaling.md rather than in the per-scenario detection table.
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")
                  if not p.stem.startswith(("pd-", "scale-")))


def pool_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("scale-*.yaml"))


def read_yaml(path: Path) -> Any:
    """A scenario file's document; a ScenarioError naming the file if it cannot be read."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ScenarioError(f"{path}: cannot read it: {err}") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None


def load(name_or_path: str, overrides: dict[str, Any] | None = None) -> Scenario:
    """A shipped scenario by name, or a YAML file by path; `overrides` patch `server`."""
    path = Path(name_or_path)
    if not path.suffix and name_or_path.startswith("pd-"):
        raise ScenarioError(f"{name_or_path!r} is a PD deployment: serve it with `sglang-sim pd "
                            f"--scenario {name_or_path}`")
    if not path.suffix:
        path = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ScenarioError(f"no scenario {name_or_path!r}; shipped: {', '.join(available())}")
    data = read_yaml(path)
    if isinstance(data, dict) and data.get("extends"):
        data = _extend(data, path)
    return from_dict(data, str(path), overrides)


def _extend(data: dict, path: Path) -> dict:
    """`extends: other-scenario`: start from it; `server` and `perf` merge field by field,
    every other key given here replaces the base's."""
    base_name = str(data["extends"])
    if base_name == path.stem:
        raise ScenarioError(f"{path}: a scenario cannot extend itself")
    base_path = path.parent / f"{base_name}.yaml"
    if not base_path.is_file():
        base_path = SCENARIO_DIR / f"{base_name}.yaml"
    try:
        base = yaml.safe_load(base_path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ScenarioError(f"{path}: cannot read base scenario {base_name!r}: {err}") from None
    merged = {**base, **{k: v for k, v in data.items() if k != "extends"}}
    for key in ("server", "perf"):
        merged[key] = {**(base.get(key) or {}), **(data.get(key) or {})}
    return merged


def from_dict(data: Any, where: str = "scenario",
              overrides: dict[str, Any] | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected a mapping at the top level")
    try:
        server = {**(data.get("server") or {}), **(overrides or {})}
        scenario = Scenario(
            name=str(data.get("name") or Path(where).stem),
            description=str(data.get("description", "")),
            duration=_positive(data.get("duration"), "duration"),
            seed=int(data.get("seed", 1)),
            release=str(data.get("release", "0.5.23")),
            server=_dataclass(ServerConfig, server, "server"),
            perf=_dataclass(PerfModel, data.get("perf") or {}, "perf"),
            warm_cache=float(data.get("warm_cache", 0.0)),
            phases=[_phase(p, i) for i, p in enumerate(data.get("load") or [])],
            faults=[_fault(f, i) for i, f in enumerate(data.get("faults") or [])],
            truth=[_truth(t, i) for i, t in enumerate(data.get("truth") or [])],
        )
    except ScenarioError as err:
        raise ScenarioError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ScenarioError(f"{where}: {err}") from None
    return scenario


def _positive(value: Any, name: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ScenarioError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _dataclass(cls, values: dict, name: str):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ScenarioError(f"{name}: unknown field(s) {', '.join(sorted(unknown))}")
    return cls(**values)


def _phase(p: Any, i: int) -> dict[str, Any]:
    if not isinstance(p, dict) or ("rate" in p) == ("burst" in p):
        raise ScenarioError(f"load[{i}]: give exactly one of rate or burst")
    if "rate" in p:
        _rate_bounds(p["rate"], f"load[{i}].rate")  # validates
    for key in ("input_tokens", "output_tokens", "spec_accept_length", "working_set_tokens",
                "grammar_compile_seconds"):
        _draw(p.get(key, 1000), random.Random(0), 0.5, f"load[{i}].{key}")  # validates
    shares = p.get("priorities", {0: 1})
    if (not isinstance(shares, dict) or not shares
            or not all(isinstance(k, int) and not isinstance(k, bool) for k in shares)
            or not all(isinstance(v, int | float) and v >= 0 for v in shares.values())
            or sum(shares.values()) <= 0):
        raise ScenarioError(f"load[{i}].priorities: expected {{priority (an integer): share}}, "
                            f"got {shares!r}")
    return p


def _fault(f: Any, i: int) -> Fault:
    if not isinstance(f, dict) or f.get("kind") not in FAULT_KINDS:
        raise ScenarioError(f"faults[{i}]: kind must be one of {', '.join(FAULT_KINDS)}")
    return _dataclass(Fault, f, f"faults[{i}]")


def _truth(t: Any, i: int) -> Truth:
    if not isinstance(t, dict) or t.get("class") not in CLASSES:
        raise ScenarioError(f"truth[{i}]: class must be one of {', '.join(CLASSES)}")
    return Truth(float(t["from"]), float(t["to"]), t["class"])


def _draw(spec: Any, rng: random.Random, progress: float, where: str = "") -> float:
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return float(spec)
    if isinstance(spec, dict) and len(spec) == 1:
        kind, args = next(iter(spec.items()))
        if isinstance(args, list) and len(args) == 2:
            lo, hi = (float(a) for a in args)
            if kind == "uniform":
                return rng.uniform(lo, hi)
            if kind == "normal":
                return max(rng.gauss(lo, hi), 1.0)
            if kind == "ramp":
                return (lo + (hi - lo) * progress) * rng.uniform(0.9, 1.1)
    raise ScenarioError(f"{where}: expected a number, {{uniform|normal|ramp: [a, b]}}, "
                        f"got {spec!r}")


def _rate_bounds(spec: Any, where: str = "rate") -> tuple[float, float]:
    """A phase's rate (requests/s): a number, or {ramp: [start, end]} changing linearly over
    the phase (no jitter: the arrivals themselves are random)."""
    if isinstance(spec, int | float) and not isinstance(spec, bool) and spec >= 0:
        return float(spec), float(spec)
    if isinstance(spec, dict) and list(spec) == ["ramp"] and isinstance(spec["ramp"], list) \
            and len(spec["ramp"]) == 2 and all(isinstance(v, int | float) and v >= 0
                                               for v in spec["ramp"]) and max(spec["ramp"]) > 0:
        return float(spec["ramp"][0]), float(spec["ramp"][1])
    raise ScenarioError(f"{where}: expected a number of requests per second or "
                        f"{{ramp: [start, end]}}, got {spec!r}")


def _choose(shares: dict, rng: random.Random) -> int:
    """A key of `shares` ({value: weight}) drawn by weight."""
    x, keys = rng.random() * sum(shares.values()), sorted(shares)
    for key in keys:
        x -= shares[key]
        if x < 0:
            return int(key)
    return int(keys[-1])


def _grammar(p: dict, rng: random.Random, progress: float, t: float) -> dict:
    """A request's grammar: a `structured_output` share of the phase's requests carry one,
    drawn from `grammar_schemas` distinct schemas (absent: each request's own, never cached),
    compiling in `grammar_compile_seconds` on a cache miss."""
    if rng.random() >= float(p["structured_output"]):
        return {}
    schemas = p.get("grammar_schemas")
    key = ("schema", rng.randrange(int(schemas))) if schemas else ("unique", t)
    return {"grammar_key": key,
            "grammar_compile_s": _draw(p.get("grammar_compile_seconds", 0.05), rng, progress)}


def _phase_arrivals(p: dict, rng: random.Random, total: float) -> list[tuple[float, dict]]:
    start = float(p.get("at", 0))
    duration = float(p.get("duration", total - start))
    times: list[float] = []
    if "burst" in p:
        spread = float(p.get("spread", 0))
        times = sorted(start + rng.uniform(0, spread) for _ in range(int(p["burst"])))
    else:
        t = start
        lo, hi = _rate_bounds(p["rate"])
        if lo == hi:
            while lo > 0:
                t += rng.expovariate(lo)
                if t >= start + duration:
                    break
                times.append(t)
        else:
            # A rate that changes linearly over the phase: a Poisson process at the higher
            # rate, each arrival kept with the share the rate at its time has of it (thinning).
            top = max(lo, hi)
            while True:
                t += rng.expovariate(top)
                if t >= start + duration:
                    break
                if rng.random() * top < lo + (hi - lo) * (t - start) / duration:
                    times.append(t)
    out = []
    for t in times:
        progress = (t - start) / duration if duration else 0.0
        out.append((t, {
            "input_len": int(_draw(p.get("input_tokens", 1000), rng, progress)),
            "cached_fraction": min(max(_draw(p.get("cached_fraction", 0.0), rng, progress),
                                       0.0), 1.0),
            "output_len": max(int(_draw(p.get("output_tokens", 300), rng, progress)), 1),
            "max_new_tokens": int(p.get("max_new_tokens", 8192)),
            "streaming": rng.random() < float(p.get("streaming", 0.8)),
        }))
        if "spec_accept_length" in p:  # drawn only where given: other scenarios keep their draws
            out[-1][1]["accept_length"] = max(_draw(p["spec_accept_length"], rng, progress), 1.0)
        if "working_set_tokens" in p:  # not drawn: other scenarios keep their draws
            out[-1][1]["working_set"] = _draw(p["working_set_tokens"], rng, progress)
        if "lora_adapters" in p:  # drawn only where given
            out[-1][1]["lora_id"] = rng.randrange(int(p["lora_adapters"]))
        if "priorities" in p:  # {priority: share of the phase's requests}, drawn where given
            out[-1][1]["priority"] = _choose(p["priorities"], rng)
        if "structured_output" in p:  # drawn only where given
            out[-1][1].update(_grammar(p, rng, progress, t))
    return out
