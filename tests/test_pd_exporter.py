"""The exporter and prefill/decode (PD) servers: the role from /server_info, the PD queues from
/v1/loads' `disaggregation` block (sglang_obs_pd_queue_requests), and the glance page's pools,
on SGLang's own answers (conformance/goldens) and on hostile ones."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_obs.exporter.poller import PollSettings, TargetPoller
from sglang_obs.exporter.sglang_api import PD_QUEUES, parse_loads, parse_server_info
from sglang_obs.exporter.status import (
    PoolSignals,
    StatusBoard,
    ThresholdsError,
    classify_pool,
    load_classification,
)
from sglang_obs.exporter.status_page import GlancePages, status_with_display
from sglang_obs.exporter.targets import server_label

from conftest import ROOT
from fake_sglang import Route
from test_conformance import GOLDENS

C = load_classification()
QUEUE_FAMILY = "sglang_obs_pd_queue_requests"


def golden(release: str, variant: str, name: str):
    return json.loads((GOLDENS / release / variant / name).read_text())


def json_answer(payload) -> Route:
    return Route(json.dumps(payload).encode(), content_type="application/json")


def routes(release: str, variant: str, loads=None, info=None) -> dict[str, Route]:
    """A server answering as the golden, with its /v1/loads or /server_info replaced."""
    folder = GOLDENS / release / variant
    return {"/metrics": Route((folder / "metrics.prom").read_bytes()),
            "/v1/loads": json_answer(loads or golden(release, variant, "v1_loads.json")),
            "/server_info": json_answer(info or golden(release, variant, "server_info.json"))}


def series(registry, family: str) -> dict[tuple, float]:
    text = generate_latest(registry).decode()
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == family}


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("release", "variant", "mode", "queues"), [
    ("0.5.23", "pd-prefill", "prefill", {"bootstrap": 0, "inflight": 0}),
    ("0.5.23", "pd-decode", "decode", {"prealloc": 0, "transfer": 0, "retracted": 0}),
    ("0.5.12", "pd-prefill", "prefill", {"bootstrap": 2, "inflight": 3}),
    ("0.5.12", "pd-decode", "decode", {"prealloc": 2, "transfer": 1, "retracted": 0}),
])
def test_golden_pd_loads_give_the_roles_queues_only(release, variant, mode, queues):
    load = parse_loads(golden(release, variant, "v1_loads.json"))
    assert load.bad_fields == ()
    assert load.pd is not None
    assert load.pd.mode == mode
    assert dict(load.pd.queues) == queues


@pytest.mark.parametrize("release", ["0.5.12", "0.5.23"])
def test_a_unified_server_has_no_pd_queues(release):
    load = parse_loads(golden(release, "default", "v1_loads.json"))  # mode "null"
    assert load.pd is None
    assert load.bad_fields == ()
    without = golden(release, "default", "v1_loads.json")
    del without["loads"][0]["disaggregation"]  # a release without the block
    assert parse_loads(without).pd is None
    assert parse_loads(without).bad_fields == ()


@pytest.mark.parametrize("release", ["0.4.6.post5", "0.5.5", "0.5.12", "0.5.23"])
@pytest.mark.parametrize(("variant", "mode"), [
    ("default", "null"), ("pd-prefill", "prefill"), ("pd-decode", "decode")])
def test_golden_server_info_gives_the_role(release, variant, mode):
    if not (GOLDENS / release / variant).is_dir():
        pytest.skip(f"no {variant} golden of {release}")
    info = parse_server_info(golden(release, variant, "server_info.json"))
    assert info.bad_fields == ()
    assert info.disaggregation_mode == mode


def test_pd_queues_are_summed_over_dp_ranks():
    payload = golden("0.5.12", "pd-decode", "v1_loads.json")
    second = copy.deepcopy(payload["loads"][0])
    second["dp_rank"] = 1
    second["disaggregation"].update(decode_prealloc_queue_reqs=5, decode_transfer_queue_reqs=0,
                                    decode_retracted_queue_reqs=1)
    payload["loads"].append(second)
    load = parse_loads(payload)
    assert load.bad_fields == ()
    assert dict(load.pd.queues) == {"prealloc": 7, "transfer": 1, "retracted": 1}


def _hostile(**block):
    payload = golden("0.5.12", "pd-prefill", "v1_loads.json")
    payload["loads"][0]["disaggregation"].update(block)
    return payload


HOSTILE = {
    "block not an object": ({"disaggregation": 5}, None),
    "block a list": ({"disaggregation": [1, 2]}, None),
    "mode not a string": ({"mode": 7}, None),
    "count a string": ({"prefill_bootstrap_queue_reqs": "2"}, {"inflight": 3}),
    "count a boolean": ({"prefill_bootstrap_queue_reqs": True}, {"inflight": 3}),
    "negative count": ({"prefill_bootstrap_queue_reqs": -1}, {"inflight": 3}),
    "fractional count": ({"prefill_bootstrap_queue_reqs": 2.5}, {"inflight": 3}),
    "huge float": ({"prefill_bootstrap_queue_reqs": 1e300}, {"inflight": 3}),
    "count past the bound": ({"prefill_bootstrap_queue_reqs": 2**40}, {"inflight": 3}),
    "integer of 400 digits": ({"prefill_bootstrap_queue_reqs": 10**400}, {"inflight": 3}),
    "two counts wrong": ({"prefill_bootstrap_queue_reqs": -1, "prefill_inflight_queue_reqs": {}},
                         {}),
}


@pytest.mark.parametrize(("block", "queues"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_pd_blocks_never_raise_and_read_as_unknown(block, queues):
    if "disaggregation" in block:
        payload = golden("0.5.12", "pd-prefill", "v1_loads.json")
        payload["loads"][0].update(block)
    else:
        payload = _hostile(**block)
    load = parse_loads(json.loads(json.dumps(payload)))  # as the poller decodes it
    assert load.bad_fields
    assert all(f.startswith("loads[].disaggregation") for f in load.bad_fields)
    assert (None if load.pd is None else dict(load.pd.queues)) == queues
    clean = parse_loads(golden("0.5.12", "pd-prefill", "v1_loads.json"))
    assert (load.running, load.waiting) == (clean.running, clean.waiting)  # the rest is used


def test_ranks_that_disagree_on_the_mode_give_no_queue():
    payload = golden("0.5.12", "pd-decode", "v1_loads.json")
    other = copy.deepcopy(payload["loads"][0])
    other["disaggregation"]["mode"] = "prefill"
    payload["loads"].append(other)
    load = parse_loads(payload)
    assert load.pd is None
    assert load.bad_fields == ("loads[].disaggregation.mode",)


def test_an_answer_with_several_bad_pd_fields_counts_one_parse_error(fake_sglang):
    payload = _hostile(prefill_bootstrap_queue_reqs=-4, prefill_inflight_queue_reqs="x",
                       mode="prefill")
    payload["loads"][0]["num_running_reqs"] = 16
    server = fake_sglang(routes("0.5.12", "pd-prefill", loads=payload))
    poller = TargetPoller(server.url, PollSettings(timeout=2.0))
    snap = poller.poll_once()
    assert snap.up
    assert snap.errors == {("loads", "parse"): 1}
    assert snap.derived.running_requests == 16  # the rest of the answer is used
    assert snap.pd is not None
    assert dict(snap.pd.queues) == {}
    assert poller.poll_once().errors == {("loads", "parse"): 2}  # once per answer


# -- the collector ---------------------------------------------------------------------------------
def test_the_collector_exposes_pd_queues_for_pd_servers_only(fake_sglang, make_registry):
    prefill = fake_sglang(routes("0.5.12", "pd-prefill"))
    decode = fake_sglang(routes("0.5.12", "pd-decode"))
    unified = fake_sglang(routes("0.5.12", "default"))
    registry, pollers = make_registry(prefill.url, decode.url, unified.url)
    for poller in pollers:
        poller.poll_once()
    p, d = pollers[0].server, pollers[1].server
    model = "Qwen/Qwen3-8B"
    assert series(registry, QUEUE_FAMILY) == {
        (("model_name", model), ("queue", q), ("server", server)): value
        for server, values in ((p, {"bootstrap": 2, "inflight": 3}),
                               (d, {"prealloc": 2, "transfer": 1, "retracted": 0}))
        for q, value in values.items()}
    assert {q for queues in PD_QUEUES.values() for q, _ in queues} == {
        "bootstrap", "inflight", "prealloc", "transfer", "retracted"}


def test_server_config_info_carries_the_role_of_the_pd_goldens(fake_sglang, make_registry):
    servers = [fake_sglang(routes("0.5.23", v)) for v in ("pd-prefill", "pd-decode", "default")]
    registry, pollers = make_registry(*(s.url for s in servers))
    for poller in pollers:
        poller.poll_once()
    info = {dict(k)["server"]: dict(k)["disaggregation_mode"]
            for k in series(registry, "sglang_obs_server_config_info")}
    assert info == {pollers[0].server: "prefill", pollers[1].server: "decode",
                    pollers[2].server: "null"}
    queues = series(registry, QUEUE_FAMILY)
    assert {dict(k)["server"] for k in queues} == {pollers[0].server, pollers[1].server}
    assert all(v == 0 for v in queues.values())


def test_no_pd_series_while_the_server_is_down(fake_sglang, make_registry):
    server = fake_sglang(routes("0.5.12", "pd-decode"))
    registry, (poller,) = make_registry(server.url)
    poller.poll_once()
    assert series(registry, QUEUE_FAMILY)
    server.stop()
    poller.poll_once()
    assert not series(registry, QUEUE_FAMILY)


# -- the glance page's pools -----------------------------------------------------------------------
def _pd_server(variant: str, *, running: int, waiting: int, backlog: int, prealloc: int = 0):
    release = "0.5.23"
    loads = golden(release, variant, "v1_loads.json")
    rank = loads["loads"][0]
    rank.update(num_running_reqs=running, num_waiting_reqs=waiting,
                num_waiting_uncached_tokens=backlog, max_running_requests=256)
    rank["disaggregation"]["decode_prealloc_queue_reqs"] = prealloc
    return routes(release, variant, loads=loads)


def _board(fake_sglang, servers, classification=C):
    board = StatusBoard(classification, poll_interval=1.0)
    for server_routes in servers:
        server = fake_sglang(server_routes)
        tracker = board.add(server_label(server.url))
        TargetPoller(server.url, PollSettings(timeout=2.0), on_poll=tracker.observe).poll_once()
    return board


def test_two_prefill_and_two_decode_servers_form_two_pools_with_their_verdicts(fake_sglang):
    # Prepare: each prefill server's backlog below the threshold, their sum above it; each
    # decode server at 240 of 256 slots with requests waiting for its KV.
    half = int(C.prefill_backlog_tokens * 0.6)
    board = _board(fake_sglang, [
        _pd_server("pd-prefill", running=16, waiting=3, backlog=half),
        _pd_server("pd-decode", running=240, waiting=0, backlog=0, prealloc=2),
        _pd_server("pd-prefill", running=16, waiting=2, backlog=half),
        _pd_server("pd-decode", running=240, waiting=0, backlog=0, prealloc=1),
    ])
    names = [t.server for t in board.trackers]
    # Act
    status = status_with_display(board)
    # Check
    by_pool = {p["pool"]: p for p in status["pools"]}
    assert [p["pool"] for p in status["pools"]] == ["prefill", "decode"]
    prefill, decode = by_pool["prefill"], by_pool["decode"]
    assert prefill["servers"] == [names[0], names[2]]
    assert decode["servers"] == [names[1], names[3]]
    assert prefill["state"] == "prefill_pool_backlog"
    assert prefill["prefill_backlog"] == 2 * half
    assert prefill["waiting"] == 5
    assert decode["state"] == "decode_pool_contention"
    assert decode["queues"]["prealloc"] == 3
    assert decode["running_ratio"] == pytest.approx(480 / 512)
    for pool in (prefill, decode):
        assert pool["state_code"] == status["pd_states"].index(pool["state"])
    # the per-server rows stay, each with its role and its own verdict
    assert [s["role"] for s in status["servers"]] == ["prefill", "decode"] * 2
    assert all(s["state"] == "healthy" for s in status["servers"])
    assert prefill["reason"].startswith(f"{2 * half:,} prompt tokens are waiting")
    assert prefill["display"]["lists"]["servers"] == [f"{names[0]}: Healthy",
                                                      f"{names[2]}: Healthy"]
    page = GlancePages(board, "/metrics", []).answer("/")[2].decode()
    assert 'data-pool="prefill" data-state="prefill_pool_backlog"' in page
    assert 'data-pool="decode" data-state="decode_pool_contention"' in page
    assert f"<li>{names[1]}: Healthy</li>" in page


def test_the_pool_thresholds_are_the_classification_ones(fake_sglang):
    half = int(C.prefill_backlog_tokens * 0.6)
    servers = [_pd_server("pd-prefill", running=16, waiting=3, backlog=half)] * 2 + [
        _pd_server("pd-decode", running=200, waiting=0, backlog=0, prealloc=2)] * 2
    edited = replace(C, prefill_backlog_tokens=3 * half, running_ratio_at_limit=0.75)
    states = {p["pool"]: p["state"] for p in
              _board(fake_sglang, servers, edited).status()["pools"]}
    # 400 of 512 slots is 0.78: at the edited limit, not the shipped one
    assert states == {"prefill": "healthy", "decode": "decode_pool_contention"}
    states = {p["pool"]: p["state"] for p in _board(fake_sglang, servers).status()["pools"]}
    assert states == {"prefill": "prefill_pool_backlog", "decode": "healthy"}


def test_unified_servers_make_no_pool(fake_sglang):
    board = _board(fake_sglang, [routes("0.5.23", "default")] * 2)
    status = status_with_display(board)
    assert status["pools"] == []
    assert [s["role"] for s in status["servers"]] == ["", ""]
    assert 'class="pools"' not in GlancePages(board, "/metrics", []).answer("/")[2].decode()


def _pool(**kw) -> PoolSignals:
    values = dict(servers=2, up=2, running=10.0, waiting=1.0, max_running=100.0,
                  running_ratio=0.1, prefill_backlog=0.0, kv_occupancy_max=0.3, queues={})
    return PoolSignals(**{**values, **kw})


@pytest.mark.parametrize(("pool", "signals", "expected"), [
    ("prefill", dict(up=0), "unavailable"),
    ("prefill", dict(up=1, prefill_backlog=C.prefill_backlog_tokens), "prefill_pool_backlog"),
    # a backlog with nothing queued is prompts being prefilled, not a backlog
    ("prefill", dict(prefill_backlog=C.prefill_backlog_tokens, waiting=0.0), "healthy"),
    ("prefill", dict(prefill_backlog=None, waiting=5.0), "healthy"),
    ("prefill", dict(running=0.0, waiting=0.0), "idle"),
    # a prefill server's requests pass through between polls: it is working, not idle
    ("prefill", dict(running=0.0, waiting=0.0, finished_last_minute=3.0), "healthy"),
    ("prefill", dict(running=0.0, waiting=0.0, queues={"inflight": 1.0}), "healthy"),
    ("prefill", dict(running=None, waiting=0.0), "healthy"),
    ("decode", dict(queues={"prealloc": 1.0}, running_ratio=C.running_ratio_at_limit),
     "decode_pool_contention"),
    ("decode", dict(queues={"prealloc": 1.0}, kv_occupancy_max=C.kv_occupancy_ratio),
     "decode_pool_contention"),
    ("decode", dict(queues={"prealloc": 0.0}, running_ratio=1.0), "healthy"),
    ("decode", dict(queues={}, running_ratio=1.0), "healthy"),
    ("decode", dict(queues={"prealloc": 3.0}, running_ratio=0.5), "healthy"),
    ("decode", dict(up=0, queues={"prealloc": 3.0}, running_ratio=1.0), "unavailable"),
    ("decode", dict(running=0.0, waiting=0.0), "idle"),
])
def test_pool_verdict_edges(pool, signals, expected):
    assert classify_pool(pool, _pool(**signals), C) == expected


def test_the_decode_verdict_reads_the_prealloc_queue_threshold_from_the_pd_section(tmp_path):
    """pd.min_prealloc_queue_requests, as the rules read it: a raised threshold lets a short
    prealloc queue through, and a thresholds file without it is refused by name."""
    doc = yaml.safe_load((ROOT / "prometheus/thresholds.yml").read_text())
    at_limit = _pool(queues={"prealloc": 2.0}, running_ratio=1.0)
    assert C.min_prealloc_queue_requests == doc["pd"]["min_prealloc_queue_requests"]
    assert classify_pool("decode", at_limit, C) == "decode_pool_contention"
    doc["pd"]["min_prealloc_queue_requests"] = 3
    raised = tmp_path / "thresholds.yml"
    raised.write_text(yaml.safe_dump(doc))
    assert classify_pool("decode", at_limit, load_classification(raised)) == "healthy"
    del doc["pd"]["min_prealloc_queue_requests"]
    raised.write_text(yaml.safe_dump(doc))
    with pytest.raises(ThresholdsError, match="lacks pd.min_prealloc_queue_requests"):
        load_classification(raised)
