"""`sglang-obs capacity`: its figures against a hand computation, from a pack with no
Prometheus, and the energy and cost rows it shares with snapshot and compare."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sglang_obs.core import pack
from sglang_obs.core.quantities import q
from sglang_obs.core.settings import default
from sglang_obs.core.times import iso, parse_time
from sglang_obs.render import energy_rules as E
from sglang_obs.simulator.render import Rendered, write_openmetrics
from sglang_obs.tools import capacity, compare, snapshot

from conftest import require_binary
from helpers import free_port

EXE = str(Path(sys.executable).parent / "sglang-obs")
S = default()
STEP = 15.0
T0 = 1_000_000.0
N = 40  # samples of the hand-made window


# -- hand-made records: what each figure must be -----------------------------------------------
def energy_values(i: int) -> dict:
    """The records of a host at sample i: (record, mode) -> value."""
    return {(E.POWER, ""): 800.0 + 10 * (i % 10), (E.GPUS, ""): 4.0,
            (E.TOKENS, "prefill_compute"): 400.0 + i, (E.TOKENS, "prefill_cache"): 1600.0,
            (E.TOKENS, "decode"): 200.0 + 2 * (i % 7),
            (E.ENERGY_PER_TOKEN, "prefill"): 0.2 + 0.01 * (i % 5),
            (E.ENERGY_PER_TOKEN, "decode"): 2.0 + 0.1 * (i % 3),
            (E.IDLE_SHARE, ""): 0.1 + 0.001 * i, (E.CACHE_SAVED_POWER, ""): 300.0}


def hand(n: int = N) -> dict:
    """Every figure, computed here the long way from energy_values()."""
    v = [energy_values(i) for i in range(n)]
    prompt = [x[E.TOKENS, "prefill_compute"] + x[E.TOKENS, "prefill_cache"] for x in v]
    output = [x[E.TOKENS, "decode"] for x in v]
    j_prompt = sum(x[E.ENERGY_PER_TOKEN, "prefill"] * p
                   for x, p in zip(v, prompt, strict=True)) / sum(prompt)
    j_output = sum(x[E.ENERGY_PER_TOKEN, "decode"] * o
                   for x, o in zip(v, output, strict=True)) / sum(output)
    power = sum(x[E.POWER, ""] for x in v) / n
    return {"power_watts": power, "joules_per_prompt_token": j_prompt,
            "joules_per_output_token": j_output, "gpus": 4.0,
            "idle_share": sum(x[E.IDLE_SHARE, ""] for x in v) / n, "cache_saved_watts": 300.0,
            "decode_per_gpu_mean": sum(output) / n / 4, "decode_per_gpu_peak": max(output) / 4,
            "compute_per_gpu_mean": sum(x[E.TOKENS, "prefill_compute"] for x in v) / n / 4}


def host_records(start: float = T0, n: int = N) -> dict:
    out: dict = {}
    for i in range(n):
        for (record, mode), value in energy_values(i).items():
            out.setdefault(record, {}).setdefault(mode, []).append([start + i * STEP, value])
    return out


# state per sample: healthy, then a backlog from sample 20 to 24, healthy again
STATE = ["healthy"] * 20 + ["prefill_backlog"] * 5 + ["healthy"] * 15
CODES = {"idle": 1, "healthy": 2, "prefill_backlog": 3}


def doc(records: dict | None = None, cost: dict | None = None) -> dict:
    """A capacity.json as collect() writes it, of one server on an unnamed host."""
    times = [T0 + i * STEP for i in range(N)]
    rps = [0.5 + 0.01 * i for i in range(N)]  # rising: the backlog starts at 0.70 req/s
    tps = [1000.0 + 10 * i for i in range(N)]
    minutes = [T0 + 60 * (k + 1) for k in range(int((N - 1) * STEP // 60))]
    return {"schema_version": 1, "window": {"start": T0, "end": T0 + (N - 1) * STEP,
                                            "step_seconds": STEP},
            "slo": {"ttft": {"threshold_seconds": "2.0", "objective": 0.99},
                    "itl": {"threshold_seconds": "1.0", "objective": 0.99}},
            "cost": cost or {"gpu_hour_price": None, "currency": "USD"},
            "servers": {"sglang:30000": {
                "host": "",
                "series": {"state": [[t, CODES[s]] for t, s in zip(times, STATE, strict=True)],
                           "request_rate": [list(x) for x in zip(times, rps, strict=True)],
                           "token_rate": [list(x) for x in zip(times, tps, strict=True)]},
                "slo_minutes": {"ttft_within": [[t, 9.0] for t in minutes],
                                "ttft_total": [[t, 10.0] for t in minutes],
                                "itl_within": [[t, 999.0] for t in minutes],
                                "itl_total": [[t, 1000.0] for t in minutes]}}},
            "hosts": {"": {"cluster": "", "host": "",
                           "records": host_records() if records is None else records}},
            "pools": {}}


# -- the figures, by hand ------------------------------------------------------------------
def test_energy_throughput_and_slo_figures_equal_a_hand_computation():
    got = capacity.figures(doc())["servers"]["sglang:30000"]
    want = hand()
    e, t = got["energy"], got["throughput"]
    for key in ("power_watts", "joules_per_prompt_token", "joules_per_output_token", "gpus",
                "idle_share", "cache_saved_watts"):
        assert e[key] == pytest.approx(want[key]), key
    assert e["missing"] == []
    assert e["cost_source"] is None
    assert e["cost_per_million_prompt_tokens"] is None
    assert t["gpus"] == 4
    assert t["per_gpu"]["decode"]["mean"] == pytest.approx(want["decode_per_gpu_mean"])
    assert t["per_gpu"]["decode"]["peak"] == pytest.approx(want["decode_per_gpu_peak"])
    assert t["per_gpu"]["prefill_compute"]["mean"] == pytest.approx(want["compute_per_gpu_mean"])
    assert t["per_gpu"]["prefill_cache"]["mean"] == pytest.approx(400.0)
    minutes = int((N - 1) * STEP // 60)
    assert got["slo"]["ttft"] == {"threshold_seconds": 2.0, "objective": 0.99,
                                  "counted": "requests", "total": 10.0 * minutes,
                                  "attainment": pytest.approx(0.9)}
    assert got["slo"]["itl"]["attainment"] == pytest.approx(0.999)


def test_cost_at_the_price_splits_the_gpu_hours_as_the_energy():
    want = hand()
    e = capacity.figures(doc(), price=2.5, currency="EUR")["servers"]["sglang:30000"]["energy"]
    # a GPU-hour at 2.5: the host's 4 GPUs cost 4 * 2.5 / 3600 per second, of which prefill's
    # share is its energy share (J per prompt token x prompt tokens / (W x s))
    per_second = 4 * 2.5 / 3600
    assert e["cost_source"] == "price"
    assert e["currency"] == "EUR"
    assert e["cost_per_million_prompt_tokens"] == pytest.approx(
        per_second * want["joules_per_prompt_token"] / want["power_watts"] * 1e6)
    assert e["cost_per_million_output_tokens"] == pytest.approx(
        per_second * want["joules_per_output_token"] / want["power_watts"] * 1e6)
    text = "\n".join(capacity.cost_lines(e))
    assert "at 2.5 EUR per GPU-hour" in text


def test_a_recorded_cost_is_read_weighted_by_the_tokens_it_covered():
    records = host_records()
    records[E.COST_PER_TOKEN] = {"prefill": [[T0 + i * STEP, 1e-7] for i in range(N)],
                                 "decode": [[T0 + i * STEP, 4e-6] for i in range(N)]}
    e = capacity.figures(doc(records), price=99.0)["servers"]["sglang:30000"]["energy"]
    assert e["cost_source"] == "recorded"
    assert e["cost_per_million_prompt_tokens"] == pytest.approx(0.1)
    assert e["cost_per_million_output_tokens"] == pytest.approx(4.0)


def test_headroom_is_the_highest_healthy_load_against_the_load_at_first_saturation():
    room = capacity.figures(doc())["servers"]["sglang:30000"]["headroom"]
    first = room["first_saturation"]
    assert first == {"state": "prefill_backlog", "at": iso(T0 + 20 * STEP),
                     "request_rate": pytest.approx(0.70), "token_rate": pytest.approx(1200.0)}
    # healthy before and after the backlog: the highest healthy load is the last sample's
    assert room["peak_healthy"]["request_rate"] == {"value": pytest.approx(0.89),
                                                    "at": iso(T0 + 39 * STEP)}
    assert room["mean"]["request_rate"] == pytest.approx(sum(0.5 + 0.01 * i
                                                             for i in range(N)) / N)
    text = capacity.report(capacity.figures(doc()))
    assert "first saturation: **prefill_backlog** at" in text
    assert "It saturated under less load than it carried healthy" in text


def test_a_server_that_never_saturated_gives_its_peak_as_a_lower_bound():
    d = doc()
    d["servers"]["sglang:30000"]["series"]["state"] = [[t, 2] for t, _ in
                                                       d["servers"]["sglang:30000"]["series"][
                                                           "state"]]
    result = capacity.figures(d)
    assert result["servers"]["sglang:30000"]["headroom"]["first_saturation"] is None
    text = capacity.report(result)
    assert "never saturated in this window: the server carries at least its peak, 0.89 req/s" \
        in text
    assert "(a lower bound)" in text


def test_a_sub_window_of_the_pack_reads_only_its_samples():
    start, end = T0 + 10 * STEP, T0 + 19 * STEP  # before the backlog
    got = capacity.figures(doc(), start, end)["servers"]["sglang:30000"]
    v = [energy_values(i) for i in range(10, 20)]
    assert got["energy"]["power_watts"] == pytest.approx(sum(x[E.POWER, ""] for x in v) / 10)
    assert got["headroom"]["first_saturation"] is None


def test_missing_energy_series_are_named_instead_of_a_crash():
    records = host_records()
    for record in (E.POWER, E.ENERGY_PER_TOKEN, E.GPUS):
        del records[record]
    result = capacity.figures(doc(records), price=2.0)
    e = result["servers"]["sglang:30000"]["energy"]
    assert e["power_watts"] is None
    assert e["joules_per_prompt_token"] is None
    assert e["cost_source"] is None  # no power, no GPU count: no cost from the price either
    assert e["missing"] == [E.POWER, E.ENERGY_PER_TOKEN, E.GPUS]
    text = capacity.report(result)
    assert f"Not recorded in this window: {E.POWER}, {E.ENERGY_PER_TOKEN}, {E.GPUS}" in text
    assert f"{q('gpu_power_window').label}: —" in text
    assert "GPU count not recorded" in text
    assert "tokens per second on the host (no GPU count)" in text  # tokens by mode are still there
    nothing = capacity.figures(doc({}))
    text = capacity.report(nothing)
    assert "Tokens by mode not recorded" in text
    assert capacity.PRICE_HINT in text


def test_snapshot_and_compare_show_the_energy_under_the_same_labels():
    e = capacity.figures(doc(), price=2.5)["servers"]["sglang:30000"]["energy"]
    paragraph = snapshot.energy_paragraph({"host": "gpu-host-1", **e})
    assert paragraph.startswith("**Energy and cost** (host gpu-host-1's GPUs): ")
    rows = compare.energy_report({"before": e, "after": e})
    for line in capacity.energy_lines(e):
        label = line.split(": ")[0]
        assert label in paragraph
        assert any(r.startswith(f"| {label} |") for r in rows), label
    assert any(r.startswith(f"| {q('energy_per_prompt_token_window').label} |")
               and r.endswith("| +0.0% |") for r in rows)


def test_the_energy_rows_of_compare_survive_a_pack_without_them():
    """windows.json of an older release has no energy: the rows say so, no KeyError."""
    data = compare.WindowData("a:1", 0.0, 600.0, units={})
    d = data.to_dict()
    del d["energy"]
    assert compare.WindowData.from_dict(d).energy == {}
    lines = compare.energy_report({"before": {}, "after": {}})
    assert any("older release" in line for line in lines)


# -- the command -----------------------------------------------------------------------------
def _cli(*args, timeout=60):
    return subprocess.run([EXE, "capacity", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_a_bad_from_is_one_line_and_exit_2():
    result = _cli("--from", "yesterday", "--prometheus", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 2
    assert result.stderr == ("sglang-obs capacity: error: --from: cannot read time "
                             "'yesterday': use now, '30m ago', a Unix timestamp or "
                             "2026-11-29T10:00:00Z\n")
    assert _cli("--prometheus", "http://127.0.0.1:1").returncode == 2  # no --from


def test_an_unreachable_prometheus_is_one_line_and_exit_1():
    url = f"http://127.0.0.1:{free_port()}"
    result = _cli("--from", "1h ago", "--prometheus", url)
    assert result.returncode == 1
    assert result.stderr.startswith(f"sglang-obs capacity: --prometheus: Prometheus at {url} is "
                                    "unreachable")
    assert len(result.stderr.splitlines()) == 1


def test_a_pack_answers_with_no_prometheus_and_its_window_narrows(tmp_path):
    """A capacity.json written as collect() writes it: the command reads only the pack (the
    default Prometheus URL is not asked: nothing listens there in the tests)."""
    (tmp_path / pack.SUMMARY).write_text("{}\n")
    pack.write(tmp_path, pack.CAPACITY, doc())
    result = _cli("--pack", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["source"] == f"snapshot pack {tmp_path}"
    want = capacity.figures(doc())
    assert got["servers"]["sglang:30000"]["energy"]["joules_per_output_token"] == \
        pytest.approx(want["servers"]["sglang:30000"]["energy"]["joules_per_output_token"])
    result = _cli("--pack", str(tmp_path), "--from", str(T0), "--to", str(T0 + 19 * STEP))
    assert result.returncode == 0, result.stderr
    assert "never saturated in this window" in result.stdout
    result = _cli("--pack", str(tmp_path), "--from", str(T0 + 3600))
    assert result.returncode == 1
    assert "outside the pack" in result.stderr
    result = _cli("--pack", str(tmp_path), "--server", "nope:1")
    assert result.returncode == 1
    assert "--server: unknown instance nope:1" in result.stderr


# -- against a real Prometheus: the snapshot's pack, then no Prometheus ---------------------
def add_records(data: Path, start: float, n: int) -> None:
    """energy_values() as the host's records (no host label, as the backfill's series), from
    `start` every STEP: what the energy rules will record."""
    rendered = Rendered(start=start, step=STEP, steps=n)
    for i in range(n):
        for (record, mode), value in energy_values(i).items():
            rendered.add(record, {"mode": mode} if mode else {}, i, value)
    with tempfile.TemporaryDirectory() as tmp:
        om = Path(tmp) / "records.om.txt"
        write_openmetrics(rendered, om)
        subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from",
                        "openmetrics", str(om), str(data)], check=True, capture_output=True)


def by_hand(raw: dict) -> dict:
    """The energy figures computed here from the records as Prometheus served them
    ({record: {labels: {t: v}}}): the mean power, and J per token weighted by tokens."""
    def mode(record, name):
        return next((v for k, v in raw[record].items() if dict(k).get("mode", "") == name), {})

    power = mode(E.POWER, "")
    tokens = {m: mode(E.TOKENS, m) for m in ("prefill_compute", "prefill_cache", "decode")}
    out = {"power_watts": sum(power.values()) / len(power)}
    for key, per, modes in (("joules_per_prompt_token", "prefill",
                             ("prefill_compute", "prefill_cache")),
                            ("joules_per_output_token", "decode", ("decode",))):
        ratio = mode(E.ENERGY_PER_TOKEN, per)
        weights = {t: sum(tokens[m][t] for m in modes) for t in ratio
                   if all(t in tokens[m] for m in modes)}
        out[key] = sum(ratio[t] * w for t, w in weights.items()) / sum(weights.values())
    return out


@pytest.fixture(scope="module")
def healthy_pack(tmp_path_factory):
    """(pack, figures from Prometheus, Backfilled, the energy figures by hand): `healthy`
    backfilled (with hand-made energy records where the shipped rules do not record them), a
    snapshot of it, then Prometheus stopped."""
    require_binary("prometheus")
    from sglang_obs.core.prometheus_api import Prometheus
    from sglang_obs.generate.backfill import RECORDING_RULES, backfill, prometheus

    base = tmp_path_factory.mktemp("capacity")
    b = backfill("healthy", base / "data", end=parse_time("2026-11-29T08:00:00Z"), s=S)
    n = int((b.end - b.start) // STEP) + 1
    if f"record: {E.POWER}\n" not in (S.rules_dir / RECORDING_RULES).read_text():
        add_records(b.data, b.start, n)
    with prometheus(b.data, retention="10y") as url:
        raw = {r: Prometheus(url).query_range(r, b.start, b.end, STEP)
               for r in (E.POWER, E.TOKENS, E.ENERGY_PER_TOKEN)}
        result = subprocess.run([EXE, "snapshot", "--prometheus", url, "--from", str(b.start),
                                 "--to", str(b.end), "--out", str(base / "pack"),
                                 "--no-charts"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        live = _cli("--prometheus", url, "--from", str(b.start), "--to", str(b.end), "--json")
        assert live.returncode == 0, live.stderr
    return base / "pack", json.loads(live.stdout), b, by_hand(raw)


@pytest.mark.slow
def test_the_pack_gives_what_prometheus_gives_with_prometheus_gone(healthy_pack):
    out, live, b, want = healthy_pack
    assert (out / pack.CAPACITY).is_file()
    result = _cli("--pack", str(out), "--json")  # Prometheus has stopped
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got.pop("source") == f"snapshot pack {out}"
    assert live.pop("source") == "Prometheus"
    assert got == live
    server = got["servers"]["sglang:30000"]
    for key in ("power_watts", "joules_per_prompt_token", "joules_per_output_token"):
        assert server["energy"][key] == pytest.approx(want[key]), key
    assert server["slo"]["ttft"]["attainment"] > 0.99  # healthy: within the SLO
    assert server["headroom"]["first_saturation"] is None
    text = _cli("--pack", str(out)).stdout
    assert "never saturated in this window" in text
    assert f"{q('energy_per_output_token_window').label}: " \
           f"{capacity.joules(want['joules_per_output_token'])}" in text


@pytest.mark.slow
def test_the_snapshot_report_and_summary_carry_the_energy(healthy_pack):
    out, _, _, want = healthy_pack
    summary = json.loads((out / "summary.json").read_text())
    e = summary["servers"]["sglang:30000"]["energy"]
    assert e["joules_per_prompt_token"] == pytest.approx(want["joules_per_prompt_token"])
    report = (out / "report.md").read_text()
    assert "**Energy and cost** (its host's GPUs): " in report
    assert capacity.PRICE_HINT in report


@pytest.mark.slow
def test_docs_capacity_md_examples_are_current():
    """Exact: every backfill records its rules at the same offsets within the step
    (backfill.py), so two backfills of one scenario agree sample for sample."""
    require_binary("prometheus")
    from sglang_obs.generate import capacity_example

    committed = (S.docs_dir / capacity_example.DOC).read_text()
    with capacity_example.packs(S) as folders:
        assert capacity_example.render(committed, folders, S) == committed, \
            "docs/capacity.md is stale: run python -m sglang_obs.generate capacity-example"
