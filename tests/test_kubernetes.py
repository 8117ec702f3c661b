"""deploy/kubernetes without a cluster (docs/kubernetes.md).

- generated: the committed files are what `make generate` writes, nothing more or less;
- the same sources: one PrometheusRule per rule group with the group's rules unchanged (promtool
  checks them and runs the rule unit tests on them), PodMonitors that scrape, rename and limit
  as prometheus.yml's jobs, an AlertmanagerConfig that routes as alertmanager.yml (amtool), the
  dashboards byte for byte in ConfigMaps that find kube-prometheus-stack's data source;
- Kubernetes labels: what the PodMonitors give a series (a model of prometheus-operator's
  relabelling, tests/k8s_model.py) is what tests/rules/kubernetes_test.yml feeds the rules; the
  exporter emits no namespace, pod or cluster label;
- valid objects: custom resources against the vendored CRDs (strict), core objects with
  kubernetes-validate at a pinned Kubernetes version, kustomizations complete, the release label
  from the overlay (a small kustomize model);
- the exporter hardened (non-root, read-only root, no capabilities, requests and limits, no
  hostPID unless per-process GPU memory is on), the example workload wired to the monitors;
- network policies: every pod shipped is selected for ingress and egress, the exporter's port
  admits the scraping Prometheus only, the Prometheus selector is one overlay patch away; the
  example SGLang container hardened as the exporter is (non-root, read-only root, emptyDirs).
"""

import copy
import dataclasses
import importlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sglang_obs import __version__, cli
from sglang_obs.core.settings import default as _settings
from sglang_obs.exporter import catalogue
from sglang_obs.exporter import cli as exporter_cli
from sglang_obs.generate import products
from sglang_obs.generate.files import sync
from sglang_obs.render import kubernetes

from conftest import ROOT, require_binary
from k8s_model import (
    Pod,
    build,
    crd_errors,
    crd_schemas,
    kustomization,
    listed_files,
    load_all,
    relabel,
    scrape,
    subschema,
    targets,
)

S = _settings()  # the checkout's configuration, read once

K8S = ROOT / "deploy" / "kubernetes"
BASE = K8S / "base"
KPS = K8S / "overlays" / "kube-prometheus-stack"
EXAMPLE = K8S / "overlays" / "example"
GPU_PROCESSES = K8S / "components" / "gpu-processes"
GATEWAY_POLICY = K8S / "components" / "gateway-networkpolicy"
# The opt-in autoscalers (tests/test_kubernetes_scaling.py): one or the other on a Deployment.
AUTOSCALERS = {"keda": K8S / "components" / "autoscaling-keda",
               "hpa": K8S / "components" / "autoscaling-hpa"}
KUBERNETES_VERSION = "1.31.0"  # kubernetes-validate's schemas (constraints.txt pins 1.31.0)
PROMETHEUS_YML = ROOT / "prometheus" / "prometheus.yml"
ALERTMANAGER_YML = ROOT / "alertmanager" / "alertmanager.yml"
KUBERNETES_RULE_TEST = ROOT / "tests" / "rules" / "kubernetes_test.yml"
# API groups of the custom resources, each validated against its vendored CRD (schemas/).
CUSTOM_GROUPS = ("monitoring.coreos.com/", "keda.sh/")
# kube-prometheus-stack's Grafana data sources (values.yaml grafana.sidecar.datasources: name
# Prometheus, uid prometheus, the default; Alertmanager uid alertmanager).
KPS_DATASOURCES = [
    {"name": "Prometheus", "uid": "prometheus", "type": "prometheus", "isDefault": True},
    {"name": "Alertmanager", "uid": "alertmanager", "type": "alertmanager"},
]


def load(path: Path):
    return yaml.safe_load(path.read_text())


def require_module(name: str):
    """A Python package of the test extra: skip locally when absent, fail under CI=true."""
    try:
        return importlib.import_module(name)
    except ImportError:
        message = f"{name} not installed (pip install -c constraints.txt -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ": CI must install it")
        pytest.skip(message)


def base_objects() -> list[dict]:
    return build(BASE)


def kps_objects() -> list[dict]:
    return build(KPS)


def example_objects(with_gpu_processes: bool = False, with_gateway_policy: bool = False,
                    autoscaler: str | None = None) -> list[dict]:
    extra = ((Path("../../components/gpu-processes"),) if with_gpu_processes else ()) + (
        (Path("../../components/gateway-networkpolicy"),) if with_gateway_policy else ()) + (
        (AUTOSCALERS[autoscaler],) if autoscaler else ())
    return build(EXAMPLE, extra)


def every_object() -> list[dict]:
    """Everything `kubectl apply -k` would send, from both overlays and the opt-in components,
    plus the example Secret and the autoscalers' per-pool examples."""
    secret = load_all(KPS / "receivers-secret.example.yaml")
    per_pool = [obj for folder in AUTOSCALERS.values()
                for path in sorted(folder.glob("*.example.yaml")) for obj in load_all(path)]
    return (kps_objects() + example_objects() + example_objects(True)
            + example_objects(with_gateway_policy=True)
            + [obj for name in AUTOSCALERS for obj in example_objects(autoscaler=name)]
            + secret + per_pool)


def by_kind(objects, kind) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects, kind, name=None) -> dict:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def pod_monitors() -> dict[str, dict]:
    return {pm["metadata"]["name"]: pm for pm in by_kind(base_objects(), "PodMonitor")}


def jobs() -> dict[str, dict]:
    return {job["job_name"]: job for job in load(PROMETHEUS_YML)["scrape_configs"]}


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def exporter_containers(objects) -> list[tuple[dict, dict]]:
    """(workload, container) of every container running the exporter image."""
    return [(obj, c) for obj in objects if obj["kind"] in ("Deployment", "DaemonSet")
            for c in pod_spec(obj)["containers"]
            if c["image"].split("/")[-1].split(":")[0] == kubernetes.IMAGE]


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# --- generated --------------------------------------------------------------------------------


def test_committed_files_are_what_make_generate_writes():
    made, owned = products.kubernetes(S)
    assert sync(made, check=True, owned=owned) == [], "run make generate"


def test_the_translation_reads_no_file(tmp_path):
    """The render layer is given the texts: moved away from the configuration folder, the same
    sources give the same objects."""
    sources = products.kubernetes_sources(S)
    moved = dataclasses.replace(S, root=tmp_path)
    assert kubernetes.files(moved, sources) == kubernetes.files(S, sources)


def test_check_reports_missing_stale_and_extra_files(tmp_path, capsys):
    out = tmp_path / "k8s"
    assert cli.main(["kubernetes", "--check", "--out", str(out)]) == 1
    assert cli.main(["kubernetes", "--out", str(out)]) == 0
    assert cli.main(["kubernetes", "--check", "--out", str(out)]) == 0
    (out / "base" / "podmonitor-sglang.yaml").write_text("edited\n")
    (out / "base" / "left-over.yaml").write_text("{}\n")
    capsys.readouterr()
    assert cli.main(["kubernetes", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "podmonitor-sglang.yaml (stale)" in err
    assert "left-over.yaml (not generated" in err


def test_sglang_obs_kubernetes_check_passes():
    assert cli.main(["kubernetes", "--check"]) == 0


def test_untranslatable_configuration_fails_loudly():
    job = copy.deepcopy(jobs()["sglang"])
    job["relabel_configs"] = [{"action": "drop"}]
    with pytest.raises(kubernetes.TranslationError, match="relabel_configs"):
        kubernetes.pod_monitor(load(PROMETHEUS_YML), job, S.selectors)
    with pytest.raises(kubernetes.TranslationError, match="mute"):
        kubernetes.route({"receiver": "x", "match": {"a": "b"}, "mute": 1})
    with pytest.raises(kubernetes.TranslationError, match="only webhooks"):
        kubernetes.receiver({"name": "x", "slack_configs": [{}]})
    assert kubernetes.matcher('a=~"x\\"y"') == {"name": "a", "matchType": "=~", "value": 'x"y'}


# --- PrometheusRule: the rule files' groups -----------------------------------------------------


def source_groups() -> list[dict]:
    """The groups of the rule files Kubernetes gets (all but the fleet's: see the generator)."""
    prom = load(PROMETHEUS_YML)
    shipped = [name for name in prom["rule_files"] if name not in kubernetes.NOT_IN_KUBERNETES]
    assert len(shipped) == len(prom["rule_files"]) - 1
    return [group for name in shipped for group in load(PROMETHEUS_YML.parent / name)["groups"]]


def prometheus_rules() -> list[dict]:
    return by_kind(base_objects(), "PrometheusRule")


def test_one_prometheusrule_per_rule_group_with_its_rules_unchanged():
    interval = load(PROMETHEUS_YML)["global"]["evaluation_interval"]
    objects = {obj["spec"]["groups"][0]["name"]: obj for obj in prometheus_rules()}
    assert sorted(objects) == sorted(g["name"] for g in source_groups())
    assert len(objects) == len(prometheus_rules()) == len(source_groups())
    for group in source_groups():
        obj = objects[group["name"]]
        assert len(obj["spec"]["groups"]) == 1
        # The same rules: names, expressions, for:, labels, annotations. The interval is
        # prometheus.yml's evaluation_interval: prometheus-operator's default is 30 s.
        assert obj["spec"]["groups"][0] == {**group, "interval": interval}


def extract_rules(tmp_path: Path) -> list[Path]:
    """Each PrometheusRule's groups as a rule file, the way prometheus-operator writes them."""
    paths = []
    for obj in prometheus_rules():
        path = tmp_path / f"{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, sort_keys=False))
        paths.append(path)
    return paths


def test_promtool_checks_the_rules_extracted_from_the_prometheusrules(tmp_path):
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "rules", "--lint=all", "--lint-fatal",
                             *map(str, extract_rules(tmp_path))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# The PrometheusRule groups are the rule files' groups to the letter (tested above), so the
# other unit-test files would run the same rules again: the Kubernetes-shaped one runs here.
def test_rule_unit_tests_pass_on_the_extracted_rules(tmp_path):
    promtool = require_binary("promtool")
    test_file = KUBERNETES_RULE_TEST
    spec = load(test_file)
    spec["rule_files"] = [str(p) for p in extract_rules(tmp_path)]
    moved = tmp_path / test_file.name
    moved.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(moved)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


# --- PodMonitors: prometheus.yml's jobs ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(kubernetes.job_ports(S.selectors)))
def test_podmonitor_keeps_the_jobs_limits_interval_and_path(name):
    prom, job, pm = load(PROMETHEUS_YML), jobs()[name], pod_monitors()[name]
    spec, [endpoint] = pm["spec"], pm["spec"]["podMetricsEndpoints"]
    assert spec["sampleLimit"] == job["sample_limit"]
    assert spec["labelLimit"] == job["label_limit"]
    assert spec["labelValueLengthLimit"] == job["label_value_length_limit"]
    assert spec["bodySizeLimit"] == job["body_size_limit"]
    assert endpoint["interval"] == job.get("scrape_interval", prom["global"]["scrape_interval"])
    assert endpoint["path"] == job.get("metrics_path", "/metrics")
    assert "honorLabels" not in endpoint  # target labels win, as in compose


SAMPLES = [  # label sets a scrape can return, to compare the two relabellings on
    {"__name__": "sglang_num_running_reqs", "model_name": "m"},
    {"__name__": "sglang:num_running_reqs", "model_name": "m"},
    {"__name__": "sglang_obs_up", "server": "10.42.3.17:30000", "instance": "10.42.3.17:9840"},
    {"__name__": "sglang_obs_gpu_device_up", "gpu": "0", "instance": "10.42.3.5:9840"},
    {"__name__": "sglang_obs_up", "server": "s:1", "host": "node-a", "instance": "e:9840"},
    {"__name__": "sglang_obs_gpu_info", "server": "", "instance": "e:9840"},
]


@pytest.mark.parametrize("name", sorted(kubernetes.job_ports(S.selectors)))
def test_podmonitor_metric_relabelings_do_what_prometheus_yml_does(name):
    job, [endpoint] = jobs()[name], pod_monitors()[name]["spec"]["podMetricsEndpoints"]
    if not job.get("metric_relabel_configs"):  # the gateway's: its series are stored as scraped
        assert "metricRelabelings" not in endpoint
        return
    assert endpoint.get("metricRelabelings"), "prometheus.yml's job relabels its series"
    for sample in SAMPLES:
        sample = {k: v for k, v in sample.items() if v}
        assert relabel(sample, endpoint["metricRelabelings"]) == relabel(
            sample, job["metric_relabel_configs"]), sample
    if name == "sglang":  # the one normalisation every rule and dashboard relies on
        assert relabel({"__name__": "sglang_num_queue_reqs"}, endpoint["metricRelabelings"]) == {
            "__name__": "sglang:num_queue_reqs"}


def test_the_podmonitors_set_the_job_the_rules_select_on():
    selectors = load(ROOT / "prometheus" / "thresholds.yml")["selectors"]
    assert set(kubernetes.job_ports(S.selectors)) == {selectors["sglang_job"],
                                                      selectors["exporter_job"],
                                                      selectors["gateway_job"]}
    assert set(pod_monitors()) == set(kubernetes.job_ports(S.selectors))
    for name, pm in pod_monitors().items():
        assert {"targetLabel": "job", "replacement": name} in (
            pm["spec"]["podMetricsEndpoints"][0]["relabelings"])
        assert "jobLabel" not in pm["spec"]  # a pod label would have to hold the job name


EXAMPLE_POD = ("sglang", "sglang-example-7c9d8b6f5d-k2x8p", "10.42.3.17", "gpu-node-1")


def example_pod(namespace, name, ip, node, kind="Deployment") -> Pod:
    workload = one(example_objects(), kind)
    template = workload["spec"]["template"]
    return Pod(namespace, name, ip, node, template["metadata"]["labels"],
               template["spec"]["containers"])


def the_target(pm: dict, pod: Pod) -> dict:
    [target] = targets(pm, pod)
    return target


def test_sidecar_series_join_sglangs_on_instance_and_share_the_node_as_host():
    pms, pod = pod_monitors(), example_pod(*EXAMPLE_POD)
    sglang, exporter = the_target(pms["sglang"], pod), the_target(pms["sglang-obs"], pod)
    assert sglang == {"namespace": "sglang", "container": "sglang", "pod": EXAMPLE_POD[1],
                      "job": "sglang", "host": "gpu-node-1", "instance": "10.42.3.17:30000"}
    assert exporter == {"namespace": "sglang", "pod": EXAMPLE_POD[1], "job": "sglang-obs",
                        "host": "gpu-node-1", "instance": "10.42.3.17:9840"}
    # The sidecar polls http://$(POD_IP):30000, so its `server` is SGLang's target address.
    sidecar = env(pod.containers[1])["SGLANG_OBS_SGLANG_URL"].replace("$(POD_IP)", pod.ip)
    server = sidecar.removeprefix("http://")
    derived = scrape(exporter, {"__name__": "sglang_obs_up", "server": server},
                     pms["sglang-obs"]["spec"]["podMetricsEndpoints"][0])
    assert derived["instance"] == sglang["instance"]
    assert derived["host"] == "gpu-node-1"
    gpu_pod = example_pod("sglang", "sglang-obs-gpu-x7k2m", "10.42.3.5", "gpu-node-1",
                          "DaemonSet")
    assert targets(pms["sglang"], gpu_pod) == []  # no SGLang port on the GPU DaemonSet
    assert the_target(pms["sglang-obs"], gpu_pod)["host"] == exporter["host"]  # GPULost inhibits


def test_sglangs_endpoint_label_survives_and_would_not_without_the_labeldrop():
    pm, pod = pod_monitors()["sglang"], example_pod(*EXAMPLE_POD)
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    sample = {"__name__": "sglang_http_requests_total", "endpoint": "/v1/chat/completions"}
    assert scrape(the_target(pm, pod), sample, endpoint)["endpoint"] == "/v1/chat/completions"
    bare = copy.deepcopy(pm)
    bare["spec"]["podMetricsEndpoints"][0]["relabelings"] = [
        r for r in endpoint["relabelings"] if r.get("action") != "labeldrop"]
    stored = scrape(the_target(bare, pod), sample, endpoint)
    assert stored["endpoint"] == "sglang"  # the port name: the rules' route filter misses
    assert stored["exported_endpoint"] == "/v1/chat/completions"


# A router pod of smg's Helm chart (lightseekorg/smg deploy/helm/smg 1.9.0,
# templates/deployment-router.yaml and _helpers.tpl): its selector labels, component "router",
# ports "http" (router.port) and "metrics" (router.metrics.port); the chart's worker pods share
# the name label with component "worker".
def gateway_pod(component: str = "router", name_label: str = "smg") -> Pod:
    labels = {"app.kubernetes.io/name": name_label, "app.kubernetes.io/instance": "pd",
              "app.kubernetes.io/component": component}
    ports = ([{"name": "http", "containerPort": 30000}, {"name": "metrics",
                                                        "containerPort": 29000}]
             if component == "router" else [{"name": "http", "containerPort": 30000}])
    return Pod("inference", f"pd-smg-{component}-6d8f9c7b5-x2k4q", "10.42.7.3", "cpu-node-1",
               labels, [{"name": component, "ports": ports}])


def test_the_gateway_podmonitor_scrapes_the_charts_router_pods_only():
    pm = pod_monitors()[S.selectors["gateway_job"]]
    assert pm["spec"]["selector"]["matchLabels"] == kubernetes.GATEWAY_POD_LABELS
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert the_target(pm, gateway_pod()) == {
        "namespace": "inference", "container": "router", "pod": "pd-smg-router-6d8f9c7b5-x2k4q",
        "job": S.selectors["gateway_job"], "instance": "10.42.7.3:29000"}
    assert targets(pm, gateway_pod("worker")) == []  # the chart's engines: the sglang job's
    assert targets(pm, gateway_pod(name_label="gw")) == []  # nameOverride: docs say so
    for name in (S.selectors["sglang_job"], S.selectors["exporter_job"]):
        assert targets(pod_monitors()[name], gateway_pod()) == []
    assert targets(pm, example_pod(*EXAMPLE_POD)) == []
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    for key, value in kubernetes.GATEWAY_POD_LABELS.items():
        assert f"{key}: {value}" in docs, (key, value)


def test_the_gateways_endpoint_label_survives():
    pm = pod_monitors()[S.selectors["gateway_job"]]
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    sample = {"__name__": "smg_router_requests_total", "endpoint": "chat", "model": "m"}
    stored = scrape(the_target(pm, gateway_pod()), sample, endpoint)
    assert stored["endpoint"] == "chat"
    assert "exported_endpoint" not in stored


def golden_label_names(path: Path) -> set[str]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#"))
    return set(re.findall(r'[{,]\s*([A-Za-z_][A-Za-z0-9_]*)="', text))


def exporter_label_names() -> set[str]:
    names = {label for spec in catalogue.METRICS for label in spec.labels}
    for golden in ("exporter_golden.prom", "gpu_h200_golden.prom"):
        names |= golden_label_names(ROOT / "tests" / "fixtures" / golden)
    return names


def sglang_label_names() -> set[str]:
    return set().union(*(golden_label_names(p)
                         for p in (ROOT / "tests" / "fixtures" / "sglang").glob("metrics_*")))


def test_the_exporter_never_emits_namespace_pod_or_cluster():
    """They come from service discovery (namespace, pod) and external labels (cluster)."""
    labels = exporter_label_names()
    assert "server" in labels
    assert "gpu" in labels
    assert not labels & {"namespace", "pod", "cluster", "job", "instance", "host", "node"}


def gateway_label_names() -> set[str]:
    """The labels of the gateway's series, from docs/pd.md's table (verified there against
    smg's model_gateway/src/observability/metrics.rs): `…` continues the row above."""
    names: set[str] = set()
    for line in (ROOT / "docs" / "pd.md").read_text().splitlines():
        if line.startswith("| `smg_"):  # | family | type | labels, (values) and **remarks** |
            labels = re.sub(r"\([^)]*\)|\*\*[^*]*\*\*", "", line.split("|")[3])
            names |= {part.strip() for part in re.split(r"[,:]", labels)
                      if re.fullmatch(r"[a-z_]+", part.strip())}
    return names


def test_the_gateways_labels_are_read_from_docs_pd_md():
    labels = gateway_label_names()
    assert {"worker", "endpoint", "model", "worker_type", "dp_rank", "error_type"} <= labels
    assert not labels & {"pd", "prefill", "decode", "no_workers"}  # values, not labels


def test_every_target_label_the_scraped_side_also_emits_is_dropped_from_the_target():
    for name, emitted in ((S.selectors["sglang_job"], sglang_label_names()),
                          (S.selectors["exporter_job"], exporter_label_names()),
                          (S.selectors["gateway_job"], gateway_label_names())):
        drops = [r["regex"] for r in pod_monitors()[name]["spec"]["podMetricsEndpoints"][0][
            "relabelings"] if r.get("action") == "labeldrop"]
        clash = emitted & set(kubernetes.OPERATOR_TARGET_LABELS)
        assert clash, f"{name}: expected a clash to handle (endpoint)"
        for label in clash:
            assert any(re.fullmatch(regex, label) for regex in drops), (name, label)


SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
# The pods of kubernetes_test.yml: the example Deployment's pod template, here and in another
# namespace; the last one scraped without the endpoint labeldrop (the counter-example).
RULE_TEST_PODS = {
    "sglang-example-7c9d8b6f5d-k2x8p": (EXAMPLE_POD, True),
    "sglang-b-5f6d7c8b9-q4r7t": (("team-b", "sglang-b-5f6d7c8b9-q4r7t", "10.42.5.9",
                                  "gpu-node-2"), True),
    "sglang-no-labeldrop-6b7c8d9f4-z9y8x": (("sglang", "sglang-no-labeldrop-6b7c8d9f4-z9y8x",
                                             "10.42.3.40", "gpu-node-1"), False),
}


def test_kubernetes_rule_test_series_carry_the_labels_the_podmonitors_give():
    spec, pms, seen = load(KUBERNETES_RULE_TEST), pod_monitors(), 0
    for group in spec["tests"]:
        for item in group["input_series"]:
            name, body = SERIES.match(item["series"]).groups()
            labels = dict(LABEL.findall(body))
            (pod_args, with_drop) = RULE_TEST_PODS[labels["pod"]]
            pm = copy.deepcopy(pms[labels["job"]])
            endpoint = pm["spec"]["podMetricsEndpoints"][0]
            if not with_drop:
                endpoint["relabelings"] = [r for r in endpoint["relabelings"]
                                           if r.get("action") != "labeldrop"]
            target = the_target(pm, example_pod(*pod_args))
            if name == "up":  # Prometheus's own series: the target labels only
                assert labels == target, item["series"]
                continue
            raw = {k.removeprefix("exported_"): v for k, v in labels.items()
                   if k not in target}
            stored = scrape(target, {"__name__": name, **raw}, endpoint)
            assert stored == {"__name__": name, **labels}, item["series"]
            seen += 1
    assert seen > 10


# --- AlertmanagerConfig: alertmanager.yml -------------------------------------------------------


def alertmanager_config() -> dict:
    return one(base_objects(), "AlertmanagerConfig")


def back_to_alertmanager(route: dict, prefix: str = "") -> dict:
    """An AlertmanagerConfig route as alertmanager.yml writes it (receivers prefixed as
    prometheus-operator names them)."""
    fields = {v: k for k, v in kubernetes.ROUTE_KEYS.items()}
    out = {fields[k]: v for k, v in route.items() if k in fields}
    out["receiver"] = prefix + route["receiver"]
    if route.get("matchers"):
        out["matchers"] = [f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}'
                           for m in route["matchers"]]
    if route.get("routes"):
        out["routes"] = [back_to_alertmanager(r, prefix) for r in route["routes"]]
    return out


def test_alertmanagerconfig_has_alertmanager_ymls_routes_inhibitions_and_receivers():
    am, spec = load(ALERTMANAGER_YML), alertmanager_config()["spec"]
    route = copy.deepcopy(spec["route"])
    scope = route["matchers"].pop(0)
    # Nested under Alertmanager's own root, the route takes this stack's alerts and no others.
    assert scope == {"name": "alertname", "matchType": "=~",
                     "value": "|".join(kubernetes.alert_names(
                         load(PROMETHEUS_YML), products.kubernetes_sources(S).rule_texts))}
    if not route["matchers"]:
        del route["matchers"]

    def normal(r):  # matchers as (name, op, value)
        r = dict(r)
        if "matchers" in r:
            r["matchers"] = [tuple(kubernetes.matcher(m).values()) for m in r["matchers"]]
        if "routes" in r:
            r["routes"] = [normal(x) for x in r["routes"]]
        return r

    assert normal(back_to_alertmanager(route)) == normal(am["route"])
    inhibit = [{"source_matchers": [f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}'
                                    for m in r["sourceMatch"]],
                "target_matchers": [f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}'
                                    for m in r["targetMatch"]],
                "equal": r["equal"]} for r in spec["inhibitRules"]]
    assert [normal({"matchers": r["source_matchers"]}) for r in inhibit] == [
        normal({"matchers": r["source_matchers"]}) for r in am["inhibit_rules"]]
    assert [normal({"matchers": r["target_matchers"]}) for r in inhibit] == [
        normal({"matchers": r["target_matchers"]}) for r in am["inhibit_rules"]]
    assert [r["equal"] for r in inhibit] == [r["equal"] for r in am["inhibit_rules"]]
    assert [r["name"] for r in spec["receivers"]] == [r["name"] for r in am["receivers"]]
    for ours, theirs in zip(spec["receivers"], am["receivers"], strict=True):
        hooks, source = ours.get("webhookConfigs", []), theirs.get("webhook_configs", [])
        assert len(hooks) == len(source), ours["name"]
        for hook, original in zip(hooks, source, strict=True):
            assert "url" not in hook  # the URL is the user's, in the Secret
            assert hook["urlSecret"]["name"] == kubernetes.RECEIVER_SECRET
            assert hook.get("sendResolved", True) == original.get("send_resolved", True)


def operator_rendered(namespace_matcher: bool) -> dict:
    """The Alertmanager configuration prometheus-operator 0.93 builds from our AlertmanagerConfig
    in namespace monitoring on kube-prometheus-stack's default one: our route first with
    continue: true, receivers named monitoring/sglang-obs/<name>, and with the OnNamespace
    strategy (the default) a namespace matcher on the route and the inhibit rules."""
    spec, prefix = alertmanager_config()["spec"], "monitoring/sglang-obs/"
    ours = back_to_alertmanager(spec["route"], prefix)
    ours["continue"] = True
    ns = ['namespace="monitoring"'] if namespace_matcher else []
    ours["matchers"] = ns + ours["matchers"]
    receivers = [{"name": "null"}] + [
        {"name": prefix + r["name"],
         **({"webhook_configs": [{"url": "https://example.invalid/hook",
                                  **({"send_resolved": h["sendResolved"]}
                                     if "sendResolved" in h else {})}
                                 for h in r["webhookConfigs"]]} if "webhookConfigs" in r else {})}
        for r in spec["receivers"]]
    inhibit = [{"source_matchers": ns + [f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}'
                                         for m in r["sourceMatch"]],
                "target_matchers": ns + [f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}'
                                         for m in r["targetMatch"]],
                "equal": r["equal"]} for r in spec["inhibitRules"]]
    return {"route": {"receiver": "null", "group_by": ["namespace"],
                      "routes": [ours, {"matchers": ['alertname="Watchdog"'],
                                        "receiver": "null"}]},
            "receivers": receivers, "inhibit_rules": inhibit}


def routes(amtool: str, config: Path, labels: dict) -> list[str]:
    result = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}",
                             *(f"{k}={v}" for k, v in labels.items())],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().split(",")


def test_amtool_routes_every_alert_as_alertmanager_yml_does(tmp_path):
    """Each alert of the rules (labels as they fire: no namespace) reaches the same receiver
    through the AlertmanagerConfig as through alertmanager.yml; another stack's critical alert
    does not reach ours; under the default OnNamespace strategy ours would not either."""
    amtool = require_binary("amtool")
    rendered, strategy_default = tmp_path / "rendered.yml", tmp_path / "on-namespace.yml"
    rendered.write_text(yaml.safe_dump(operator_rendered(False)))
    strategy_default.write_text(yaml.safe_dump(operator_rendered(True)))
    check = subprocess.run([amtool, "check-config", str(rendered), str(strategy_default)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    prefix = "monitoring/sglang-obs/"
    alerts = {rule["alert"]: rule["labels"]["severity"] for group in source_groups()
              for rule in group["rules"] if "alert" in rule}
    for name, severity in alerts.items():
        labels = {"alertname": name, "severity": severity, "instance": "10.42.3.17:30000"}
        expected = routes(amtool, ALERTMANAGER_YML, labels)
        got = [r.removeprefix(prefix) for r in routes(amtool, rendered, labels) if r != "null"]
        assert got == expected, (name, got, expected)
    other = {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "x"}
    assert routes(amtool, rendered, other) == ["null"]
    state = {"alertname": "SGLangPrefillBacklog", "severity": "warning", "instance": "i:1"}
    assert routes(amtool, strategy_default, state) == ["null"]  # why docs/kubernetes.md says so


def test_receiver_urls_come_from_a_secret_that_is_never_committed():
    keys = kubernetes.secret_keys(alertmanager_config())
    [secret] = load_all(KPS / "receivers-secret.example.yaml")
    assert sorted(secret["stringData"]) == sorted(keys)
    assert all(re.fullmatch(r"https://REPLACE-ME\.invalid/[\w-]+", url)
               for url in secret["stringData"].values()), secret["stringData"]
    assert secret["metadata"]["name"] == kubernetes.RECEIVER_SECRET
    for folder in {p.parent for p in K8S.rglob("kustomization.yaml")}:
        assert not [p for p in listed_files(folder) if p.name.endswith(".example.yaml")]
    secrets = [p for p in K8S.rglob("*.yaml") if any(
        doc.get("kind") == "Secret" for doc in load_all(p))]
    assert secrets == [KPS / "receivers-secret.example.yaml"]


# --- dashboards ---------------------------------------------------------------------------------


def dashboard_configmaps() -> list[dict]:
    return [cm for cm in by_kind(base_objects(), "ConfigMap")
            if cm["metadata"]["labels"].get("grafana_dashboard") == "1"]


def test_dashboard_configmaps_hold_the_json_byte_for_byte():
    files = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
    held = {key: value for cm in dashboard_configmaps() for key, value in cm["data"].items()}
    assert sorted(held) == [p.name for p in files]
    for path in files:
        assert held[path.name] == path.read_text(), path.name
    for cm in dashboard_configmaps():
        assert len(cm["data"]) == 1
        # kubectl's client-side apply keeps the object in a 256 KiB annotation
        assert len(json.dumps(cm)) < 262144, cm["metadata"]["name"]


def datasource_references(node, path="$"):
    if isinstance(node, dict):
        if "datasource" in node and isinstance(node["datasource"], dict | str):
            yield path, node["datasource"]
        for key, value in node.items():
            yield from datasource_references(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from datasource_references(value, f"{path}[{i}]")


def test_dashboards_find_kube_prometheus_stacks_datasource():
    """kube-prometheus-stack provisions Prometheus (uid prometheus) as the default data source;
    the dashboards select theirs by a `datasource` variable of type datasource, so they
    resolve to it without naming it."""
    default = next(ds for ds in KPS_DATASOURCES if ds.get("isDefault"))
    for cm in dashboard_configmaps():
        [text] = cm["data"].values()
        assert "__inputs" not in text
        assert "${DS_" not in text
        dashboard = json.loads(text)
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        variable = variables["datasource"]
        assert (variable["type"], variable["query"]) == ("datasource", default["type"])
        current = variable["current"]["value"]
        assert current == "default" or current in {ds["uid"] for ds in KPS_DATASOURCES} | {
            ds["name"] for ds in KPS_DATASOURCES}
        references = list(datasource_references(dashboard["panels"]))
        assert references
        for path, ref in references:
            uid = ref["uid"] if isinstance(ref, dict) else ref
            assert uid == "${datasource}" or uid in {ds["uid"] for ds in KPS_DATASOURCES}, (
                cm["metadata"]["name"], path, ref)


# --- valid objects --------------------------------------------------------------------------


def test_custom_resources_follow_prometheus_operators_crds():
    custom = [o for o in every_object() if o["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert {o["kind"] for o in custom} == {"PrometheusRule", "PodMonitor", "AlertmanagerConfig",
                                           "ScaledObject"}
    for obj in custom:
        assert (obj["apiVersion"], obj["kind"]) in crd_schemas(), "vendor its CRD"
        assert crd_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])
    # Child routes are free-form in the CRD (x-kubernetes-preserve-unknown-fields): the operator
    # reads them as routes, so each is checked against the route schema.
    config = alertmanager_config()
    schema = subschema(config, "spec", "route")

    def walk(route):
        for child in route.get("routes", []):
            assert crd_errors(child, schema) == [], child
            walk(child)

    walk(config["spec"]["route"])
    assert config["spec"]["route"]["routes"]


def test_strict_crd_validation_rejects_a_misspelt_field():
    pm = copy.deepcopy(pod_monitors()["sglang"])
    pm["spec"]["sampleLimt"] = 1
    assert any("sampleLimt" in e for e in crd_errors(pm))


def test_core_objects_pass_kubernetes_validate():
    kubernetes_validate = require_module("kubernetes_validate")
    core = [o for o in every_object() if not o["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert {o["kind"] for o in core} >= {"Deployment", "DaemonSet", "ConfigMap", "Secret",
                                         "Service", "ServiceAccount", "NetworkPolicy",
                                         "HorizontalPodAutoscaler"}
    for obj in core:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {err.message} at "
                        f"{'/'.join(map(str, err.path))}")


def test_kustomizations_list_every_file_and_every_listed_file_exists():
    folders = sorted({p.parent for p in K8S.rglob("*") if p.is_file()})
    for folder in folders:
        assert (folder / "kustomization.yaml").is_file(), f"{folder}: no kustomization.yaml"
        spec = kustomization(folder)
        listed = listed_files(folder)
        for path in listed:
            assert path.exists(), f"{folder}: lists missing {path}"
        for path in folder.glob("*.yaml"):
            if path.name in ("kustomization.yaml", "helm-values.yaml") or path.name.endswith(
                    ".example.yaml"):  # kustomize's own, Helm's, and examples never applied
                continue
            assert path.resolve() in listed, f"{path.relative_to(ROOT)} is in no kustomization"
        if spec["kind"] == "Component":
            assert spec["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    components = {p.parent for p in K8S.glob("components/*/kustomization.yaml")}
    used = {p for folder in folders for p in listed_files(folder)} | {
        GPU_PROCESSES, GATEWAY_POLICY, *AUTOSCALERS.values()}
    assert components <= used, "a component no overlay lists and no test builds"


def test_the_kube_prometheus_stack_overlay_adds_the_release_label_to_metadata_only():
    base, overlay = base_objects(), kps_objects()
    assert len(base) == len(overlay)
    for before, after in zip(base, overlay, strict=True):
        assert "release" not in before["metadata"]["labels"]
        assert after["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert after["metadata"]["namespace"] == "monitoring"
        assert after["spec" if "spec" in after else "data"] == (
            before["spec" if "spec" in before else "data"])  # selectors untouched
    # another release: one line of the overlay
    spec = kustomization(KPS)
    assert spec["labels"] == [{"pairs": {"release": "kube-prometheus-stack"},
                               "includeSelectors": False}]


def test_helm_values_let_our_alertmanagerconfig_see_alerts_without_a_namespace():
    """The rules aggregate by instance: an AlertmanagerConfig under the default OnNamespace
    strategy would see none of those alerts (test_amtool_routes_every_alert...)."""
    text = (KPS / "helm-values.yaml").read_text()
    values = yaml.safe_load(text)
    strategy = values["alertmanager"]["alertmanagerSpec"]["alertmanagerConfigMatcherStrategy"]
    assert strategy == {"type": "OnNamespaceExceptForAlertmanagerNamespace"}
    # ... which exempts only the Alertmanager's namespace: the overlay's, the Helm release's.
    namespace = kustomization(KPS)["namespace"]
    assert f"-n {namespace} " in text
    assert one(kps_objects(), "AlertmanagerConfig")["metadata"]["namespace"] == namespace
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"-n {namespace} " in docs


def test_the_release_label_is_one_edit_away(tmp_path):
    overlay = tmp_path / "deploy" / "kubernetes" / "overlays" / "mine"
    shutil.copytree(K8S, tmp_path / "deploy" / "kubernetes")
    overlay.mkdir()
    spec = kustomization(KPS)
    spec["labels"][0]["pairs"]["release"] = "prom"
    spec["namespace"] = "observability"
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    for obj in build(overlay):
        assert obj["metadata"]["labels"]["release"] == "prom"
        assert obj["metadata"]["namespace"] == "observability"


# --- the exporter and the example workload ------------------------------------------------------


def test_exporter_containers_are_hardened():
    dockerfile = (ROOT / "exporter" / "Dockerfile").read_text()
    uid = int(re.search(r"^USER (\d+)", dockerfile, re.M).group(1))
    found = exporter_containers(example_objects(True))
    assert {obj["kind"] for obj, _ in found} == {"Deployment", "DaemonSet"}
    for obj, container in found:
        where = f"{obj['kind']} {container['name']}"
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True, where
        assert sc["runAsUser"] == uid, where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["capabilities"] == {"drop": ["ALL"]}, where
        assert not sc.get("privileged"), where
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), (where, kind)
        assert "nvidia.com/gpu" not in json.dumps(container["resources"]), where
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, f"{where}: a writable /tmp (read-only root)"
        pod = pod_spec(obj)
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        assert "readinessProbe" not in container, f"{where}: must not gate SGLang's readiness"


def test_no_host_pid_unless_per_process_gpu_memory_is_on():
    for objects, processes in ((example_objects(), False), (example_objects(True), True)):
        for obj in objects:
            if obj["kind"] not in ("Deployment", "DaemonSet"):
                continue
            pod = pod_spec(obj)
            assert not pod.get("hostNetwork"), obj["kind"]
            assert not pod.get("hostIPC"), obj["kind"]
            on = env(pod["containers"][0]).get("SGLANG_OBS_COLLECTOR_NVML_PROCESSES") == "true"
            expected = processes and obj["kind"] == "DaemonSet"
            assert bool(pod.get("hostPID")) == expected == on, (obj["kind"], processes)


def test_every_exporter_env_variable_is_a_flag_of_the_exporter():
    parser = exporter_cli.build_parser()
    flags = {exporter_cli.env_name(a.option_strings[0]): a for a in parser._actions
             if a.option_strings and a.option_strings[0].startswith("--") and a.dest != "help"}
    for _, container in exporter_containers(example_objects(True)):
        for name, value in env(container).items():
            if not name.startswith(exporter_cli.ENV_PREFIX):
                continue
            assert name in flags, f"{name}: no exporter flag reads it"
            if flags[name].nargs == 0:  # a --[no-]toggle
                assert value in ("true", "false"), (name, value)


def test_the_example_deployment_is_wired_to_the_podmonitors():
    objects, pms = example_objects(), pod_monitors()
    deployment = one(objects, "Deployment")
    template = deployment["spec"]["template"]
    for name in (S.selectors["sglang_job"], S.selectors["exporter_job"]):
        for key, value in pms[name]["spec"]["selector"]["matchLabels"].items():
            assert template["metadata"]["labels"][key] == value  # both SGLang monitors find it
    gateway = pms[S.selectors["gateway_job"]]["spec"]["selector"]["matchLabels"]
    assert not gateway.items() <= template["metadata"]["labels"].items()  # not a gateway
    sglang, exporter = template["spec"]["containers"]
    command = " ".join(sglang["command"] + sglang["args"])
    assert "--enable-metrics" in command
    assert "--host 0.0.0.0" in command
    port = {p["name"]: p["containerPort"] for p in sglang["ports"]}[kubernetes.SGLANG_PORT_NAME]
    assert f"--port {port}" in command
    assert sglang["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert {p["name"] for p in exporter["ports"]} == {kubernetes.EXPORTER_PORT_NAME}
    variables = env(exporter)
    assert variables["SGLANG_OBS_SGLANG_URL"] == f"http://$(POD_IP):{port}"
    pod_ip = next(e for e in exporter["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert variables["SGLANG_OBS_COLLECTOR_NVML"] == "false"  # GPUs: the DaemonSet's
    log = variables["SGLANG_OBS_SGLANG_LOG_FILE"]
    assert log in command  # SGLang writes the file the sidecar follows
    writer = {m["name"]: m for m in sglang["volumeMounts"]}
    reader = {m["name"]: m for m in exporter["volumeMounts"]}
    [shared] = [n for n in writer if n in reader and log.startswith(writer[n]["mountPath"])]
    assert reader[shared]["readOnly"] is True
    assert not writer[shared].get("readOnly")
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()


def test_the_gpu_daemonset_reads_every_gpu_of_its_node_without_taking_one():
    daemonset = one(example_objects(), "DaemonSet")
    [container] = pod_spec(daemonset)["containers"]
    variables = env(container)
    assert variables["SGLANG_OBS_COLLECTOR_SGLANG"] == "false"
    assert "SGLANG_OBS_COLLECTOR_NVML" not in variables  # on, the default
    assert variables["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert pod_spec(daemonset)["runtimeClassName"] == "nvidia"
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels[kubernetes.SCRAPE_LABEL[0]] == kubernetes.SCRAPE_LABEL[1]


def test_the_exporter_image_is_the_packages_version_as_in_compose():
    compose = load(ROOT / "docker-compose.yml")["services"]["exporter"]["image"]
    assert compose == f"{kubernetes.IMAGE}:{__version__}"
    raw = load_all(K8S / "overlays" / "example" / "deployment.yaml") + load_all(
        K8S / "components" / "gpu-node-exporter" / "daemonset.yaml")
    images = {c["image"] for obj in raw for c in pod_spec(obj)["containers"]
              if c["image"].startswith(kubernetes.IMAGE)}
    assert images == {compose}
    [mapping] = kustomization(EXAMPLE)["images"]
    assert mapping["name"] == kubernetes.IMAGE
    assert mapping["newTag"] == __version__


def test_docs_explain_the_layout_and_the_readme_links_them():
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "docs/kubernetes.md" in (ROOT / "README.md").read_text()
    for folder in sorted({p.parent for p in K8S.rglob("kustomization.yaml")}):
        assert folder.relative_to(K8S).as_posix() in docs, folder
    for needle in ("alertmanagerConfigMatcherStrategy", "remoteWrite", "externalLabels",
                   kubernetes.RECEIVER_SECRET, "grafana_dashboard"):
        assert needle in docs, needle


# --- network policies -------------------------------------------------------------------------

# prometheus-operator labels every Prometheus pod it runs so (kube-prometheus-stack's among them).
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace
DNS = {("UDP", 53), ("TCP", 53)}
HTTPS = ("TCP", 443)


def builds() -> dict[str, list[dict]]:
    """What `kubectl apply -k` sends for each overlay (and with the opt-in component)."""
    return {"kube-prometheus-stack": kps_objects(), "example": example_objects(),
            "example+gpu-processes": example_objects(True),
            "example+gateway-networkpolicy": example_objects(with_gateway_policy=True)}


def workloads(objects) -> list[dict]:
    """Every object that runs pods (all of them have a pod template; a bare Pod or a CronJob
    would need another reading)."""
    assert not [o for o in objects if o["kind"] in ("Pod", "CronJob")]
    return [o for o in objects if "template" in o.get("spec", {})]


def selects(policy: dict, workload: dict) -> bool:
    selector = policy["spec"]["podSelector"]
    assert set(selector) <= {"matchLabels"}, "only matchLabels is read here"
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return (policy["metadata"].get("namespace") == workload["metadata"].get("namespace")
            and selector.get("matchLabels", {}).items() <= labels.items())


def policies_of(objects, workload) -> list[dict]:
    return [p for p in by_kind(objects, "NetworkPolicy") if selects(p, workload)]


def prometheus_peer() -> dict:
    """The Prometheus of the kube-prometheus-stack overlay: its namespace, its pods' labels."""
    namespace = kustomization(KPS)["namespace"]
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}},
            "podSelector": {"matchLabels": PROMETHEUS_POD_LABELS}}


def declared_ports(workload) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in pod_spec(workload)["containers"]
            for p in c.get("ports", [])}


def rule_ports(rule: dict, workload: dict | None = None) -> set[tuple[str, int]]:
    """(protocol, port number) of a rule; named ports read from the workload's containers."""
    out = set()
    for port in rule["ports"]:
        assert "endPort" not in port, "a port range"
        number = port["port"]
        if isinstance(number, str):
            number = declared_ports(workload)[number]
        out.add((port.get("protocol", "TCP"), number))
    return out


def test_every_pod_shipped_is_selected_by_a_networkpolicy_for_ingress_and_egress():
    seen = 0
    for build_name, objects in builds().items():
        for workload in workloads(objects):
            where = f"{build_name}: {workload['kind']} {workload['metadata']['name']}"
            found = policies_of(objects, workload)
            assert found, f"{where}: no NetworkPolicy selects its pods"
            types = {t for p in found for t in p["spec"]["policyTypes"]}
            assert types == {"Ingress", "Egress"}, where
            seen += 1
    assert seen >= 4  # the example Deployment and the GPU DaemonSet, with and without hostPID


def test_the_exporters_port_admits_only_the_prometheus_that_scrapes_it():
    """On every pod running the exporter: each ingress rule names its sources and its ports
    (no rule admits everything), the exporter's port is admitted from the Prometheus selector
    alone, and nothing the pod does not declare is admitted."""
    checked = 0
    for build_name, objects in builds().items():
        for workload, container in exporter_containers(objects):
            where = f"{build_name}: {workload['kind']} {workload['metadata']['name']}"
            port = {p["name"]: p["containerPort"] for p in container["ports"]}[
                kubernetes.EXPORTER_PORT_NAME]
            rules = [r for p in policies_of(objects, workload) for r in p["spec"]["ingress"]]
            for rule in rules:
                assert rule.get("from"), f"{where}: a rule without `from` admits every source"
                assert rule.get("ports"), f"{where}: a rule without `ports` admits every port"
            admitting = [r for r in rules if ("TCP", port) in rule_ports(r, workload)]
            assert admitting, f"{where}: Prometheus cannot scrape the exporter"
            for rule in admitting:
                assert rule["from"] == [prometheus_peer()], where
            admitted = set().union(*(rule_ports(r, workload) for r in rules))
            assert admitted <= {("TCP", p) for p in declared_ports(workload).values()}, where
            if all(c["name"] == container["name"] for c in pod_spec(workload)["containers"]):
                assert admitted == {("TCP", port)}, f"{where}: its metrics port only"
            checked += 1
    assert checked >= 4


def test_the_example_servers_port_admits_prometheus_its_sidecar_and_its_namespace():
    objects = example_objects()
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    port = declared_ports(deployment)[kubernetes.SGLANG_PORT_NAME]
    rules = [r for p in policies_of(objects, deployment) for r in p["spec"]["ingress"]]
    peers = [peer for r in rules if ("TCP", port) in rule_ports(r, deployment)
             for peer in r["from"]]
    assert prometheus_peer() in peers  # the sglang PodMonitor
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": labels[
        "app.kubernetes.io/name"]}}} in peers  # the sidecar, over the pod IP
    assert {"podSelector": {}} in peers  # the clients: pods of the server's namespace
    for peer in peers:  # nothing from other namespaces but Prometheus
        assert "ipBlock" not in peer
        assert peer == prometheus_peer() or "namespaceSelector" not in peer, peer


def test_egress_is_dns_the_sidecars_poll_and_the_model_download_only():
    objects = example_objects(True)
    daemonset = one(objects, "DaemonSet")
    for policy in policies_of(objects, daemonset):  # NVML only: no network at all
        assert "Egress" in policy["spec"]["policyTypes"]
        assert policy["spec"].get("egress", []) == []
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    sglang_port = declared_ports(deployment)[kubernetes.SGLANG_PORT_NAME]
    rules = [r for p in policies_of(objects, deployment) for r in p["spec"]["egress"]]
    for rule in rules:
        assert rule.get("to"), f"a rule without `to` admits every destination: {rule}"
        assert rule.get("ports"), f"a rule without `ports` admits every port: {rule}"
    by_port = {}
    for rule in rules:
        for port in rule_ports(rule, deployment):
            by_port.setdefault(port, []).extend(rule["to"])
    assert set(by_port) == DNS | {("TCP", sglang_port), HTTPS}
    for peer in by_port[("TCP", sglang_port)]:  # the sidecar polls its own pod
        assert set(peer) == {"podSelector"}, peer
        assert peer["podSelector"]["matchLabels"].items() <= labels.items()
    for port in DNS:
        for peer in by_port[port]:
            assert peer["namespaceSelector"] == {"matchLabels": {NAMESPACE_LABEL: "kube-system"}}
    for peer in by_port[HTTPS]:  # the Hugging Face Hub: outside the cluster's networks
        assert set(peer) == {"ipBlock"}, peer
        assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(
            peer["ipBlock"]["except"])
    # The exporter's own address for SGLang is an IP: it needs no DNS.
    [exporter] = [c for _, c in exporter_containers([deployment])]
    assert env(exporter)["SGLANG_OBS_SGLANG_URL"].startswith("http://$(POD_IP):")


def test_the_gateway_policy_admits_prometheus_to_the_podmonitors_port_alone():
    """The opt-in gateway component: on the pods the smg PodMonitor selects, ingress only (the
    gateway's clients and egress are the user's policies'), one rule: the Prometheus peer to
    the PodMonitor's port."""
    objects = example_objects(with_gateway_policy=True)
    extra = [p for p in by_kind(objects, "NetworkPolicy")
             if p not in by_kind(example_objects(), "NetworkPolicy")]
    [policy] = extra
    pm = pod_monitors()[S.selectors["gateway_job"]]
    assert policy["metadata"]["name"] == kubernetes.GATEWAY_NETWORK_POLICY
    assert policy["metadata"]["namespace"] == kustomization(EXAMPLE)["namespace"]
    assert policy["spec"]["podSelector"] == {"matchLabels": pm["spec"]["selector"][
        "matchLabels"]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert "egress" not in policy["spec"]
    port = pm["spec"]["podMetricsEndpoints"][0]["port"]
    assert policy["spec"]["ingress"] == [{"from": [prometheus_peer()],
                                          "ports": [{"protocol": "TCP", "port": port}]}]
    router = {"spec": {"template": {"spec": {"containers": gateway_pod().containers}}}}
    assert rule_ports(policy["spec"]["ingress"][0], router) == {("TCP", 29000)}
    assert not [w for w in workloads(objects) if selects(policy, w)]  # no pod of ours


def test_the_prometheus_selector_is_one_overlay_patch_away(tmp_path):
    """The example overlay names the Prometheus peer once, in a patch of its kustomization:
    another namespace or other pod labels is an edit there."""
    [patch] = [p for p in kustomization(EXAMPLE)["patches"]
               if p["target"] == {"kind": "NetworkPolicy"}]
    [op] = yaml.safe_load(patch["patch"])
    assert op["value"] == prometheus_peer()  # the kube-prometheus-stack overlay's namespace
    for policy in by_kind(example_objects(True, with_gateway_policy=True), "NetworkPolicy"):
        assert policy["spec"]["ingress"][0]["from"] == [prometheus_peer()]
    shutil.copytree(K8S, tmp_path / "deploy" / "kubernetes")
    mine = tmp_path / "deploy" / "kubernetes" / "overlays" / "mine"
    shutil.copytree(EXAMPLE, mine)
    spec = kustomization(mine)
    spec["components"].append("../../components/gateway-networkpolicy")  # the opt-in one too
    other = {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "observability"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus",
                                             "operator.prometheus.io/name": "main"}}}
    for p in spec["patches"]:
        if p["target"] == {"kind": "NetworkPolicy"}:
            p["patch"] = yaml.safe_dump([{**op, "value": other}])
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    policies = by_kind(build(mine), "NetworkPolicy")
    assert len(policies) == 3
    for policy in policies:
        peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
        assert other in peers
        assert prometheus_peer() not in peers


def test_the_example_sglang_container_is_hardened():
    deployment = one(example_objects(), "Deployment")
    pod = pod_spec(deployment)
    [sglang] = [c for c in pod["containers"] if c["name"] == "sglang"]
    sc = sglang["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert isinstance(sc["runAsUser"], int)
    assert sc["runAsUser"] > 0  # not root
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert not sc.get("privileged")
    assert pod["securityContext"]["runAsNonRoot"] is True
    seccomp = sc.get("seccompProfile", pod["securityContext"].get("seccompProfile"))
    assert seccomp == {"type": "RuntimeDefault"}
    assert sglang["resources"]["limits"]["nvidia.com/gpu"] >= 1  # the GPU request still there
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in sglang["volumeMounts"]}
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"  # NCCL, torch multiprocessing
    assert "/tmp" in mounts  # tempfile, SGLang's PROMETHEUS_MULTIPROC_DIR, TorchInductor
    variables = env(sglang)
    for name in ("HOME", "HF_HOME"):  # ~/.cache (Triton, FlashInfer...), the model weights
        assert variables[name] in mounts, f"{name}: not a writable mount"
    for path, volume in mounts.items():
        assert "emptyDir" in volume, f"{path}: writable, and gone with the pod"
        assert volume["emptyDir"].get("sizeLimit"), f"{path}: bounded"
        # A mount inside another is created root-owned by the runtime: the non-root user
        # could not write next to it.
        assert not [p for p in mounts if p != path and p.startswith(path.rstrip("/") + "/")]
    # Its writable folders are its own: not the sidecar's.
    [exporter] = [c for c in pod["containers"] if c["name"] != "sglang"]
    shared = {m["name"] for m in sglang["volumeMounts"]} & {
        m["name"] for m in exporter["volumeMounts"]}
    assert all(m["readOnly"] for m in exporter["volumeMounts"] if m["name"] in shared)
