"""What `python -m sglang_obs.generate` makes, in the order it makes it: each product returns the
files it owns (path -> text or bytes) and the folders whose other files are left-overs; writing
and checking are sglang_obs.generate.files' alone."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_obs.core.doc_blocks import read_block, replace_blocks
from sglang_obs.core.settings import Settings
from sglang_obs.generate.files import ORPHAN, sync

Files = dict[Path, str | bytes]
Owned = list[tuple[Path, str]]


def metrics(s: Settings) -> tuple[Files, Owned]:
    """The exporter's catalogue, then the energy records' section (its numbers block as
    committed: the energy product computes it)."""
    from sglang_obs.exporter import catalogue
    from sglang_obs.generate import energy
    from sglang_obs.render import rules as r

    doc = s.docs_dir / energy.DOC
    kept = energy.committed_numbers(doc.read_text() if doc.is_file() else None)
    return {doc: catalogue.render_markdown() + "\n".join(
        energy.section(r.inputs(s), kept))}, []


def energy_numbers(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import energy

    doc = s.docs_dir / energy.DOC
    return {doc: replace_blocks(doc.read_text(), {energy.BLOCK: energy.numbers(s)}, doc)}, []


def simulator_shapes(s: Settings) -> tuple[Files, Owned]:
    """simulator/shapes/<release>.json from the conformance goldens (a checkout's)."""
    import json

    from sglang_obs.simulator import profiles, shapes

    if s.checkout is None:
        return {}, []
    goldens = s.checkout / "conformance" / "goldens"
    files: Files = {}
    for release in profiles.RELEASES:
        answer = goldens / release / "default" / "metrics.prom"
        if answer.is_file():
            files[shapes.HERE / f"{release}.json"] = json.dumps(
                shapes.catalogue(answer.read_text()), indent=1, sort_keys=True) + "\n"
    return files, [(shapes.HERE, "*.json")]


def simulator_docs(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.simulator import docs

    doc = s.docs_dir / "simulator.md"
    return {doc: docs.render(doc.read_text(), doc)}, []


def rules(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.render import rules as r
    from sglang_obs.render import runbooks, scaling_rules

    t = r.inputs(s)
    files = {s.root / rel: text for rel, text in {**r.rule_files(t),
                                                  **r.vmalert_rule_files(t)}.items()}
    doc = s.docs_dir / "runbooks.md"
    if s.shipped and doc.is_file():  # the runbook quotes the shipped rules
        files[doc] = runbooks.render(doc.read_text(), t)
    alerting = s.docs_dir / "alerting.md"
    if s.shipped and alerting.is_file():  # and the alerting guide the shipped SLO
        files[alerting] = replace_blocks(alerting.read_text(),
                                         {"slo-defaults": r.slo_doc_block(t)}, alerting)
    scaling_doc = s.docs_dir / "scaling.md"
    if s.shipped and scaling_doc.is_file():  # and the scaling guide the shipped policy
        text = scaling_doc.read_text()  # its replay block is the `scaling` product's
        files[scaling_doc] = replace_blocks(
            text, {"scaling-policy": scaling_rules.doc_block(t),
                   "scaling-replay": read_block(text, "scaling-replay")}, scaling_doc)
    return files, []


def shipper(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.render import shipper as sh

    return {s.root / rel: text for rel, text in sh.files(dict(s.prometheus)).items()}, []


def dashlib(s: Settings, folder: Path | None = None):
    """grafana/dashboards/dashlib.py, which the definitions import by that name, given `s`
    (its thresholds) before it runs: dashlib reads no file itself."""
    folder = folder or s.dashboards_dir
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("dashlib", folder / "dashlib.py")
    module = sys.modules.get("dashlib")
    if (module is None or Path(module.__file__).resolve() != (folder / "dashlib.py").resolve()
            or module.settings is not s):
        module = importlib.util.module_from_spec(spec)
        module.settings = s
        sys.modules["dashlib"] = module
        spec.loader.exec_module(module)
    return module


def dashboards(s: Settings, folder: Path | None = None) -> tuple[Files, Owned]:
    """The dashboards' JSON, each panel saying on which supported SGLang releases it has no
    data (compatibility.annotate_dashboard, from the conformance goldens of a checkout)."""
    from sglang_obs.render import compatibility as c

    lib = dashlib(s, folder)
    folder = Path(lib.__file__).parent
    files = {lib.json_path(source): lib.render(source) for source in lib.sources(folder)}
    goldens = conformance_goldens(s)
    if goldens:
        rules = [p.read_text() for p in sorted(s.rules_dir.glob("*.yml"))]
        files = {path: c.annotate_dashboard(text, goldens, rules) for path, text in files.items()}
    return files, [(folder, "*.json")]


def kubernetes(s: Settings, out: Path | None = None) -> tuple[Files, Owned]:
    from sglang_obs.render import kubernetes as k

    if out is None and s.checkout is None:
        raise k.TranslationError("not in a checkout: give --out DIR")
    out = out or s.checkout / k.OUT
    return {out / rel: text for rel, text in k.files(s, kubernetes_sources(s)).items()}, [
        (out, "**/*")]


def kubernetes_sources(s: Settings):
    """What the Kubernetes objects translate, read from the configuration folder."""
    from sglang_obs.render import kubernetes as k

    prom_dir = s.prometheus_file.parent
    return k.Sources(
        rule_texts={name: (prom_dir / name).read_text() for name in s.prometheus["rule_files"]},
        dashboards={p.name: p.read_text() for p in sorted(s.dashboards_dir.glob("*.json"))},
        alertmanager=s.alertmanager_file.read_text())


def detection(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import detection as d

    results = [d.detect(n, s) for n in d.available()]
    e2e = d.load_e2e(s.docs_dir / d.E2E_RESULTS)
    return {s.docs_dir / d.DOC: d.markdown(results, s, e2e)}, []


def fleet_timing(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import fleet_timing as f

    doc = s.docs_dir / f.FLEET_DOC
    return {doc: f.render(doc.read_text(), s)}, []


def conformance_goldens(s: Settings) -> dict:
    """(release, variant) -> compatibility.Golden, from conformance/goldens/*/*/manifest.json
    of the checkout ({} outside one)."""
    import json

    from sglang_obs.render import compatibility as c

    if s.checkout is None:
        return {}
    goldens = {}
    for manifest in sorted((s.checkout / "conformance" / "goldens").glob("*/*/manifest.json")):
        m = json.loads(manifest.read_text())
        om = manifest.parent / "metrics.openmetrics.content-type"
        goldens[(m["release"], m["variant"])] = c.Golden(
            m["release"], m["variant"], m["flags"], frozenset(m["families_exposed"]),
            frozenset(m["families_defined"]), m["prometheus_client"],
            om.read_text().strip() if om.exists() else "")
    return goldens


def compatibility(s: Settings) -> tuple[Files, Owned]:
    """docs/compatibility.md from the conformance goldens, the rules and the dashboards."""

    from sglang_obs.render import compatibility as c

    goldens = conformance_goldens(s)
    if not goldens:
        return {}, []
    rules = [p.read_text() for p in sorted(s.rules_dir.glob("*.yml"))]
    dashboards = {p.stem: p.read_text() for p in sorted(s.dashboards_dir.glob("*.json"))}
    return {s.docs_dir / "compatibility.md": c.markdown(goldens, rules, dashboards)}, []


def _read_tree(folder: Path, into: Path) -> Files:
    return {into / p.relative_to(folder): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def examples(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import examples as e

    with tempfile.TemporaryDirectory() as tmp:
        images, pack = Path(tmp) / "images", Path(tmp) / "pack"
        images.mkdir()
        e.overviews(images, s)
        e.pd_dashboards(images, s)
        e.snapshot_pack(pack, s)
        snapshot = s.docs_dir / "examples" / f"snapshot-{e.INCIDENT}"
        return ({**_read_tree(images, s.docs_dir / "images"), **_read_tree(pack, snapshot)},
                [(snapshot, "*")])


def compare_example(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import compare_example as c

    doc = s.docs_dir / c.DOC
    with (tempfile.TemporaryDirectory() as tmp,
          c.served(Path(tmp) / "data", s) as (url, windows)):
        return {doc: c.render(doc.read_text(), url, windows, s)}, []


def capacity_example(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import capacity_example as c

    doc = s.docs_dir / c.DOC
    with c.packs(s) as folders:
        return {doc: c.render(doc.read_text(), folders, s)}, []


def scaling(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import scaling_replay as r

    doc = s.docs_dir / r.DOC
    unscaled, scaled = r.replay(s)
    text = doc.read_text()  # its policy block is the `rules` product's
    return {doc: replace_blocks(text, {r.BLOCK: r.doc_block(unscaled, scaled) + "\n",
                                       "scaling-policy": read_block(text, "scaling-policy")},
                                doc)}, []


def glance_images(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import glance_images as g

    os.environ["TZ"] = "UTC"  # the page prints local times
    time.tzset()
    with tempfile.TemporaryDirectory() as tmp:
        g.photograph_all(Path(tmp), s)
        return _read_tree(Path(tmp), s.docs_dir / "images"), []


def performance(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import performance as p

    if s.checkout is None:
        return {}, []
    doc = s.docs_dir / p.DOC
    return {doc: p.render(doc.read_text(), doc, s.checkout)}, []


def readme(s: Settings) -> tuple[Files, Owned]:
    from sglang_obs.generate import readme as r

    doc = r.home(s) / r.DOC
    return {doc: r.render(doc.read_text(), s)}, []


@dataclass(frozen=True)
class Product:
    name: str
    what: str
    make: Callable[[Settings], tuple[Files, Owned]]
    # Why --check leaves it out (regenerated, not compared): pictures differ by a pixel from
    # one matplotlib, Chromium or font to the next; a backfill's state edges by a step.
    why_unchecked: str = ""

    @property
    def checked(self) -> bool:
        return not self.why_unchecked


PRODUCTS = (
    Product("metrics", "docs/metrics.md, the exporter's metric catalogue", metrics),
    Product("simulator-shapes", "simulator/shapes/*.json: each release's families from its "
            "conformance goldens", simulator_shapes),
    Product("simulator-docs", "docs/simulator.md's parameter and scenario tables", simulator_docs),
    Product("rules", "prometheus/rules/, rules-vmalert/ and docs/runbooks.md's blocks", rules),
    Product("shipper", "prometheus/fleet/: vmagent, Prometheus agent and central configurations",
            shipper),
    Product("dashboards", "grafana/dashboards/*.json from the *.dashboard.py definitions",
            dashboards),
    Product("kubernetes", "deploy/kubernetes/ from the rules, dashboards and routing", kubernetes),
    Product("compatibility", "docs/compatibility.md: every rule and panel per SGLang release",
            compatibility),
    Product("detection", "docs/detection.md: every scenario's alerts through promtool", detection),
    Product("energy", "docs/metrics.md's energy and cost figures on two scenarios, through "
            "promtool", energy_numbers),
    Product("fleet-timing", "docs/fleet.md's onset-to-page budget", fleet_timing),
    Product("examples", "docs/images/overview-*.png, the PD pictures and the example snapshot pack",
            examples,
            why_unchecked="rendered pictures and a snapshot of a backfilled Prometheus"),
    Product("compare-example", "docs/compare.md's worked example", compare_example,
            why_unchecked="three backfills, a minute; tests/test_compare.py compares it "
            "exactly"),
    Product("capacity-example", "docs/capacity.md's worked examples", capacity_example,
            why_unchecked="two backfills and snapshots, half a minute; tests/test_capacity.py "
            "compares them exactly"),
    Product("scaling", "docs/scaling.md's ramp replayed with and without the recommendation",
            scaling, why_unchecked="two 140-minute replays through promtool, two minutes; "
            "tests/test_scaling.py compares them exactly"),
    Product("glance-images", "docs/images/glance-*.png (Chromium screenshots)", glance_images,
            why_unchecked="Chromium screenshots"),
    Product("performance", "docs/performance.md's measured blocks, from bench/results/*.json",
            performance),
    Product("readme", "README.md's generated blocks", readme),
)
NAMES = tuple(p.name for p in PRODUCTS)
BY_NAME = {p.name: p for p in PRODUCTS}


def run(chosen: list[Product], check: bool, s: Settings) -> int:
    """Make `chosen` from `s` (write, or with `check` compare); 1 if anything is stale or left
    over."""
    failed = False
    for product in chosen:
        if check and not product.checked:
            print(f"{product.name}: not checked ({product.why_unchecked})", file=sys.stderr)
            continue
        files, owned = product.make(s)
        for line in sync(files, check, owned):
            orphan = line.endswith(ORPHAN)
            failed = failed or check or orphan
            print(f"{product.name}: {line}" if check or orphan else f"wrote {line}",
                  file=sys.stderr if check or orphan else sys.stdout)
    if failed:
        print("run make generate" if check else "delete the files no product makes",
              file=sys.stderr)
    return 1 if failed else 0
