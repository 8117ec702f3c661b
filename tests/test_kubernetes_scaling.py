"""The autoscaling components of deploy/kubernetes (docs/kubernetes.md, "Autoscaling on the
recommendation"): KEDA's ScaledObject, and a plain HPA on an External metric that
prometheus-adapter serves, each making the SGLang Deployment's replica count the recommendation
(sglang_obs/core/scaling.py RECOMMENDED), with no smoothing of their own.

- names: the trigger's query and the adapter's rule read scaling.RECOMMENDED (no typed copy), and
  both ask Prometheus the same query; min/max and the scale-down guard are thresholds.yml's;
- the replica count: the HPA controller's computation for an External AverageValue target,
  applied to every recommendation and current count, returns the recommendation; its default
  10 % tolerance skips exactly the one-server steps from 10 servers up, and the commented
  tolerance patch of each component removes that;
- the components: opt-in, the example Deployment as target, its `replicas` dropped; one object
  per PD pool in the examples. (Kustomization listings, freshness, CRD and kubernetes-validate
  checks of these objects are tests/test_kubernetes.py's, which builds both components.)
"""

import math
import re
import shutil
from pathlib import Path

import pytest
import yaml

from sglang_obs.core import scaling
from sglang_obs.core.settings import duration_seconds
from sglang_obs.render import kubernetes_scaling

from conftest import ROOT
from k8s_model import build, crd_errors, json_patch, kustomization, listed_files, load_all

K8S = ROOT / "deploy" / "kubernetes"
EXAMPLE = K8S / "overlays" / "example"
KPS = K8S / "overlays" / "kube-prometheus-stack"
KEDA = K8S / "components" / "autoscaling-keda"
HPA = K8S / "components" / "autoscaling-hpa"
# Read here, not through the generator's settings: the objects must hold thresholds.yml's values.
SCALING = yaml.safe_load((ROOT / "prometheus" / "thresholds.yml").read_text())["scaling"]
LOW, HIGH = int(SCALING["min_replicas"]), int(SCALING["max_replicas"])
DEFAULT_TOLERANCE = 0.1  # kube-controller-manager --horizontal-pod-autoscaler-tolerance


def scaled_object(objects=None) -> dict:
    [obj] = [o for o in objects or build(EXAMPLE, (KEDA,)) if o["kind"] == "ScaledObject"]
    return obj


def hpa(objects=None) -> dict:
    [obj] = [o for o in objects or build(EXAMPLE, (HPA,))
             if o["kind"] == "HorizontalPodAutoscaler"]
    return obj


def adapter_rules() -> list[dict]:
    return yaml.safe_load((HPA / "helm-values.yaml").read_text())["rules"]["external"]


def behavior(obj: dict) -> dict:
    if obj["kind"] == "ScaledObject":
        return obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    return obj["spec"]["behavior"]


def bounds(obj: dict) -> tuple[int, int]:
    spec = obj["spec"]
    if obj["kind"] == "ScaledObject":
        return spec["minReplicaCount"], spec["maxReplicaCount"]
    return spec["minReplicas"], spec["maxReplicas"]


def pd_examples(folder: Path) -> list[dict]:
    return [obj for path in sorted(folder.glob("*.example.yaml")) for obj in load_all(path)]


def all_autoscalers() -> list[dict]:
    return [scaled_object(), hpa(), *pd_examples(KEDA), *pd_examples(HPA)]


# --- the record's name, one query ---------------------------------------------------------------


def test_the_keda_trigger_queries_the_recommendation_by_its_constant():
    [trigger] = scaled_object()["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["query"] == f'max({scaling.RECOMMENDED}{{pool="unified"}})'
    assert meta["threshold"] == "1"
    assert meta["ignoreNullValues"] == "false"  # a missing record is an error, not 0 replicas
    # kube-prometheus-stack's Prometheus Service, in the overlay's namespace and release.
    overlay = kustomization(KPS)
    release = overlay["labels"][0]["pairs"]["release"]
    assert meta["serverAddress"] == (f"http://{release}-prometheus.{overlay['namespace']}.svc"
                                     ":9090")


def test_no_typed_copy_of_the_record_name():
    source = (ROOT / "sglang_obs" / "render" / "kubernetes_scaling.py").read_text()
    assert scaling.RECOMMENDED not in source
    assert "replicas:recommended" not in source
    assert "recommended{" not in source


def render_metrics_query(rule: dict, series: str, selector: dict[str, str]) -> str:
    """prometheus-adapter's metricsQuery template for an external metric: <<.Series>> the
    series name, <<.LabelMatchers>> the HPA's metric selector (no namespace: namespaced false)."""
    matchers = ",".join(f'{k}="{v}"' for k, v in selector.items())
    return rule["metricsQuery"].replace("<<.Series>>", series).replace(
        "<<.LabelMatchers>>", matchers)


def test_the_adapter_serves_the_recommendation_under_the_hpas_metric_name():
    [rule] = adapter_rules()
    series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)
    assert series == scaling.RECOMMENDED
    assert re.fullmatch(rule["name"]["matches"], scaling.RECOMMENDED)
    assert rule["resources"] == {"namespaced": False}  # the record has no namespace label
    [metric] = hpa()["spec"]["metrics"]
    assert metric["type"] == "External"
    external = metric["external"]
    assert external["metric"]["name"] == rule["name"]["as"]
    assert external["target"] == {"type": "AverageValue", "averageValue": "1"}
    # Both autoscalers ask Prometheus the same question.
    selector = external["metric"]["selector"]["matchLabels"]
    assert render_metrics_query(rule, series, selector) == (
        scaled_object()["spec"]["triggers"][0]["metadata"]["query"])
    values = yaml.safe_load((HPA / "helm-values.yaml").read_text())["prometheus"]
    assert f"{values['url']}:{values['port']}" == (
        scaled_object()["spec"]["triggers"][0]["metadata"]["serverAddress"])


# --- limits and behavior from thresholds.yml ------------------------------------------------------


@pytest.mark.parametrize("index", range(6))
def test_limits_and_behavior_come_from_thresholds_and_add_no_smoothing(index):
    objects = all_autoscalers()
    assert len(objects) == 6
    obj = objects[index]
    assert bounds(obj) == (LOW, HIGH)
    rules = behavior(obj)
    assert rules["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert rules["scaleDown"]["stabilizationWindowSeconds"] == 0
    # Up: the rule's jump in one step (max_replicas pods per period covers any jump).
    assert [p for p in rules["scaleUp"]["policies"] if p["type"] == "Pods"
            and p["value"] >= HIGH - LOW]
    # Down: at most one pod per scale_down_window, the rule's own pace (a second guard).
    assert rules["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1,
         "periodSeconds": int(duration_seconds(SCALING["scale_down_window"]))}]
    assert "tolerance" not in rules["scaleUp"]
    assert "tolerance" not in rules["scaleDown"]


def test_one_object_per_pd_pool_in_the_examples_none_applied():
    for folder, kind in ((KEDA, "ScaledObject"), (HPA, "HorizontalPodAutoscaler")):
        examples = pd_examples(folder)
        assert {o["kind"] for o in examples} == {kind}
        pools = []
        for obj in examples:
            if kind == "ScaledObject":
                query = obj["spec"]["triggers"][0]["metadata"]["query"]
                pools += re.findall(r'pool="([a-z]+)"', query)
            else:
                pools.append(obj["spec"]["metrics"][0]["external"]["metric"]["selector"][
                    "matchLabels"]["pool"])
            assert obj["spec"]["scaleTargetRef"]["name"] == (
                kubernetes_scaling.PD_DEPLOYMENTS[pools[-1]])
        assert sorted(pools) == sorted(scaling.POOLS[1:])
        assert not [p for p in listed_files(folder) if p.name.endswith(".example.yaml")]


# --- the components -------------------------------------------------------------------------------


@pytest.mark.parametrize("component", [KEDA, HPA], ids=["keda", "hpa"])
def test_a_component_scales_the_example_deployment_and_owns_its_replicas(component):
    plain = build(EXAMPLE)
    objects = build(EXAMPLE, (component,))
    [before] = [o for o in plain if o["kind"] == "Deployment"]
    [after] = [o for o in objects if o["kind"] == "Deployment"]
    assert "replicas" in before["spec"]
    assert "replicas" not in after["spec"]  # an apply must not reset the autoscaler's count
    scaler = scaled_object(objects) if component == KEDA else hpa(objects)
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": after["apiVersion"], "kind": "Deployment",
        "name": after["metadata"]["name"]}
    assert scaler["metadata"]["namespace"] == after["metadata"]["namespace"]
    # opt-in: the example overlay names it commented out only
    text = (EXAMPLE / "kustomization.yaml").read_text()
    assert f"# - ../../components/{component.name}" in text
    assert component not in listed_files(EXAMPLE)


def test_strict_crd_validation_rejects_a_misspelt_scaledobject_field():
    obj = scaled_object()
    assert crd_errors(obj) == []
    obj["spec"]["maxReplicaCont"] = 3
    assert any("maxReplicaCont" in e for e in crd_errors(obj))
    assert bounds(scaled_object())[0] <= bounds(scaled_object())[1]  # the CRD's CEL rule


# --- the HPA's replica computation ---------------------------------------------------------------


def milli(quantity: str) -> int:
    """A Kubernetes quantity as the HPA reads a target (MilliValue): plain decimals and m."""
    text = str(quantity)
    if text.endswith("m"):
        return int(text[:-1])
    return round(float(text) * 1000)


def external_average_value(current: int, values: list[float], average_value: str,
                           tolerance: float) -> int:
    """kubernetes pkg/controller/podautoscaler/replica_calculator.go,
    GetExternalPerPodMetricReplicas: usage is the sum of the values (milli), usageRatio =
    usage / (target * current); within the tolerance (Tolerances.isWithin: 1 - down <= ratio
    <= 1 + up) the count stays, else it is ceil(usage / target). KEDA's metrics server and
    prometheus-adapter both hand the HPA milli-values."""
    usage = sum(round(v * 1000) for v in values)
    target = milli(average_value)
    ratio = usage / (target * current)
    if (1.0 - tolerance) <= ratio <= (1.0 + tolerance):
        return current
    return math.ceil(usage / target)


def external_value(ready: int, value: float, target_value: str, tolerance: float) -> int:
    """The same file's GetExternalMetricReplicas / getUsageRatioReplicaCount, a Value target:
    ceil(usage / target * ready pods) outside the tolerance."""
    ratio = round(value * 1000) / milli(target_value)
    if (1.0 - tolerance) <= ratio <= (1.0 + tolerance):
        return ready
    return math.ceil(ratio * ready)


def hpa_step(obj: dict, current: int, recommended: int, tolerance: float) -> int:
    """One HPA evaluation on the recommendation, then the behavior (horizontal.go
    normalizeDesiredReplicasWithBehaviors: the stabilization windows, here 0, then the policies'
    rate from the count at the period's start, then minReplicas/maxReplicas)."""
    if obj["kind"] == "ScaledObject":
        target = obj["spec"]["triggers"][0]["metadata"]["threshold"]
        assert obj["spec"]["triggers"][0]["metricType"] == "AverageValue"
    else:
        target = obj["spec"]["metrics"][0]["external"]["target"]["averageValue"]
    proposal = external_average_value(current, [recommended], target, tolerance)
    rules = behavior(obj)
    assert rules["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert rules["scaleDown"]["stabilizationWindowSeconds"] == 0

    def pods(direction):
        return max(p["value"] for p in rules[direction]["policies"] if p["type"] == "Pods")

    proposal = min(proposal, current + pods("scaleUp"))
    proposal = max(proposal, current - pods("scaleDown"))
    low, high = bounds(obj)
    return min(max(proposal, low), high)


@pytest.mark.parametrize("which", ["keda", "hpa"])
def test_the_hpa_algorithm_turns_the_recommendation_into_that_many_replicas(which):
    obj = scaled_object() if which == "keda" else hpa()
    for recommended in range(LOW, HIGH + 1):
        # the documented formula alone, from any current count: ceil(R / 1) = R
        for current in range(LOW, HIGH + 1):
            assert external_average_value(current, [recommended], "1", 0.0) == recommended
        # the whole step, with the tolerance the tolerance patch sets: up any distance, down
        # one server (the rule's only step down)
        for current in [*range(LOW, recommended + 1), recommended + 1]:
            if current <= HIGH:
                assert hpa_step(obj, current, recommended, 0.0) == recommended
    # a step down of more than one server, which the rule never makes, is held to one
    if HIGH - LOW >= 2:
        assert hpa_step(obj, HIGH, LOW, 0.0) == HIGH - 1
    # a Value target would scale by the ready pods instead: not the recommendation
    assert external_value(4, 6, "1", 0.0) == 24 != 6


def tolerance_misses(obj: dict, tolerance: float) -> set[tuple[int, int]]:
    """(current, recommended) pairs the rule can produce (up any distance, down one) where the
    HPA does not end at the recommendation."""
    pairs = [(c, r) for c in range(LOW, HIGH + 1) for r in range(LOW, HIGH + 1) if r >= c - 1]
    return {(c, r) for c, r in pairs if hpa_step(obj, c, r, tolerance) != r}


@pytest.mark.parametrize("which", ["keda", "hpa"])
def test_the_default_tolerance_skips_one_server_steps_from_ten_servers(which):
    obj = scaled_object() if which == "keda" else hpa()
    one_step_from_ten = {(c, r) for c in range(10, HIGH + 1) for r in (c - 1, c + 1)
                         if LOW <= r <= HIGH}
    assert tolerance_misses(obj, DEFAULT_TOLERANCE) == one_step_from_ten
    assert tolerance_misses(obj, 0.0) == set()
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "from 10 servers up" in docs


def uncommented(component: Path, tmp_path: Path) -> Path:
    """A copy of the example overlay and the components, with the component's commented
    tolerance patch uncommented: the overlay to build."""
    for part in ("overlays/example", "components"):
        shutil.copytree(K8S / part, tmp_path / part)
    path = tmp_path / "components" / component.name / "kustomization.yaml"
    lines = path.read_text().splitlines()
    mark = next(i for i, line in enumerate(lines)
                if line.startswith(kubernetes_scaling.TOLERANCE_MARK))
    start = next(i for i in range(mark, len(lines)) if lines[i] == "  # - target:")
    lines[start:] = [line.replace("  # ", "  ", 1) for line in lines[start:]]
    path.write_text("\n".join(lines) + "\n")
    return tmp_path / "components" / component.name


@pytest.mark.parametrize("component", [KEDA, HPA], ids=["keda", "hpa"])
def test_the_commented_tolerance_patch_sets_a_zero_tolerance(component, tmp_path):
    folder = uncommented(component, tmp_path)
    objects = build(tmp_path / "overlays" / "example", (folder,))
    obj = scaled_object(objects) if component == KEDA else hpa(objects)
    rules = behavior(obj)
    assert rules["scaleUp"]["tolerance"] == rules["scaleDown"]["tolerance"] == "0"
    if component == KEDA:
        assert crd_errors(obj) == []  # KEDA's CRD knows the field
    tolerance = milli(rules["scaleUp"]["tolerance"]) / 1000
    assert tolerance_misses(obj, tolerance) == set()
    # the same patch applies to the PD examples' objects
    for example in pd_examples(component):
        json_patch(example, kubernetes_scaling.tolerance_patch(example["kind"]))


# --- docs ----------------------------------------------------------------------------------------


def test_docs_say_which_component_to_pick_and_what_to_edit():
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    section = docs.split("## Autoscaling on the recommendation", 1)[1].split("\n## ", 1)[0]
    for needle in ("components/autoscaling-keda", "components/autoscaling-hpa", "scaleTargetRef",
                   "serverAddress", "prometheus-adapter", "helm-values.yaml", "scale_down_window",
                   "min_replicas", "max_replicas", "tolerance", 'pool="prefill"',
                   'pool="decode"', "AverageValue", "ignoreNullValues", "cluster"):
        assert needle in section, needle
