"""The replaying SGLang server (sglang_obs.simulator.replay) on the recorded fixtures of
tests/fixtures/sglang/, by file name."""

from __future__ import annotations

from pathlib import Path

from sglang_obs.simulator import replay
from sglang_obs.simulator.replay import FakeSGLang, Route

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
__all__ = ["FIXTURES", "FakeSGLang", "Route", "json_route", "text_route"]


def text_route(name: str, **kw) -> Route:
    return replay.text_route(FIXTURES / name, **kw)


def json_route(name: str, **kw) -> Route:
    return replay.json_route(FIXTURES / name, **kw)
