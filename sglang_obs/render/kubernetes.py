"""Generates deploy/kubernetes/ from the stack's own files (`make generate`).

    python -m sglang_obs.generate kubernetes            # write deploy/kubernetes/
    python -m sglang_obs.generate --check kubernetes    # exit 1 listing stale, missing, extra files
    sglang-obs [--config-dir DIR] kubernetes [--check] [--out DIR]

Nothing here restates a rule, a relabelling or a route: each object is read from the file the
compose stack runs, so the two deployments cannot drift apart.

- PrometheusRule, one per rule group of the rule files prometheus.yml loads: the group's text
  (comments included) under `spec.groups`, plus `interval:` = prometheus.yml's
  evaluation_interval (prometheus-operator's default is 30 s; the rules' sustains assume 15 s).
- PodMonitor per scrape job of prometheus.yml that watches SGLang (`sglang`, `sglang-obs`) or a
  PD deployment's gateway (`smg`): the job's limits, interval and metric_relabel_configs, keys
  translated to prometheus-operator's camelCase fields; pod discovery replaces static, HTTP and
  DNS discovery, and a relabeling sets `job` to the job's name, which the rules select on
  (thresholds.yml `selectors:`). The gateway's pods are found by the labels its Helm chart sets.
- AlertmanagerConfig from alertmanager/alertmanager.yml: its route tree, inhibit rules and
  receivers, each webhook URL replaced by a key of the Secret the user creates.
- ConfigMap per dashboard (label grafana_dashboard: "1", kube-prometheus-stack's sidecar),
  holding grafana/dashboards/*.json byte for byte.
- The exporter: a sidecar in the example SGLang Deployment, a node DaemonSet for GPU health
  (kustomize components), kustomizations; docs/kubernetes.md explains the choices.
- NetworkPolicy per pod shipped (the GPU DaemonSet's in its component, the example server's in
  its overlay): the exporter's port admits the scraping Prometheus only, from the ports and
  labels above; the example overlay names that Prometheus once, in a patch. An opt-in component
  admits that Prometheus to the gateway's metrics port where the gateway's pods are fenced.
- Autoscaling on the replica recommendation, two opt-in components (KEDA, or an HPA with
  prometheus-adapter): sglang_obs/render/kubernetes_scaling.py.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from sglang_obs import __version__
from sglang_obs.core.settings import Settings
from sglang_obs.core.sglang import EXPORTER_PORT, SGLANG_PORT
from sglang_obs.exporter import catalogue

OUT = Path("deploy", "kubernetes")  # in the checkout

PART_OF = {"app.kubernetes.io/part-of": "sglang-obs"}
# The one label a user sets on an SGLang pod (and the GPU DaemonSet sets on its own) for the
# PodMonitors to find it, in any namespace.
SCRAPE_LABEL = ("sglang-obs/scrape", "true")
# Container port names the PodMonitors scrape: SGLang's --port and the exporter's listen port.
SGLANG_PORT_NAME = "sglang"
EXPORTER_PORT_NAME = "sglang-obs"


# The PD gateway (SGLang's model gateway, smg) as its Helm chart runs it (lightseekorg/smg,
# deploy/helm/smg, 1.9.0): the router pods carry the chart's selector labels (name: the chart's
# name unless nameOverride) and component "router" (its worker pods carry "worker"), and name
# their --prometheus-port container port "metrics".
GATEWAY_POD_LABELS = {"app.kubernetes.io/name": "smg", "app.kubernetes.io/component": "router"}
GATEWAY_PORT_NAME = "metrics"
GATEWAY_NETWORK_POLICY = "smg-metrics"


def job_ports(selectors: dict) -> dict[str, str]:
    """The jobs of prometheus.yml that become PodMonitors, named as the rules select them
    (thresholds.yml `selectors:`): job name -> container port name."""
    return {selectors["sglang_job"]: SGLANG_PORT_NAME,
            selectors["exporter_job"]: EXPORTER_PORT_NAME,
            selectors["gateway_job"]: GATEWAY_PORT_NAME}


def pod_labels(job: str, selectors: dict) -> dict[str, str]:
    """The labels a job's PodMonitor selects pods by: the one label a user sets on an SGLang pod
    (and the GPU DaemonSet on its own), or the gateway chart's."""
    if job == selectors["gateway_job"]:
        return dict(GATEWAY_POD_LABELS)
    return {SCRAPE_LABEL[0]: SCRAPE_LABEL[1]}


# kube-prometheus-stack as the kube-prometheus-stack overlay installs it: the Helm release's
# namespace (the overlay's, the Secret's, the NetworkPolicies' Prometheus peer) and its name.
MONITORING_NAMESPACE = "monitoring"
KPS_RELEASE = "kube-prometheus-stack"
# Every pod prometheus-operator runs for a Prometheus carries this label (kube-prometheus-stack's
# among them): with the namespace, the only source the exporter's port admits.
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # Kubernetes sets it on every namespace
# The example workload: its name (Deployment, Service, ServiceAccount, pod label) and namespace.
EXAMPLE_NAME = "sglang-example"
EXAMPLE_NAMESPACE = "sglang"
# Egress of the example pod besides its own SGLang port: the cluster DNS (CoreDNS keeps
# kube-dns's label) and HTTPS out of the cluster's networks (the model download).
DNS_PEER = {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
DNS_PORT = 53
HTTPS_PORT = 443
# Private, carrier-grade NAT and link-local (cloud metadata) ranges: pods, services, nodes and
# the API server live there; the Hugging Face Hub does not.
NOT_THE_INTERNET = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                    "169.254.0.0/16")

# Receivers' webhook URLs live in this Secret (created by the user, never committed).
RECEIVER_SECRET = "sglang-obs-receivers"
IMAGE = "sglang-obs"  # as docker-compose.yml; the example overlay maps it to a registry
ALERTMANAGER_CONFIG_NAME = "sglang-obs"
GPU_DAEMONSET = "sglang-obs-gpu"

# Target labels prometheus-operator gives every PodMonitor target (besides job and instance).
OPERATOR_TARGET_LABELS = ("namespace", "container", "pod", "endpoint")
# Labels that SGLang's own /metrics carries and that clash with one of those: the scraped value
# would be renamed exported_<label> (honor_labels is off), and the rules select on it.
SGLANG_EMITTED = {"endpoint": "sglang:http_requests_total and sglang:http_responses_total "
                              "carry the HTTP route (endpoint=\"/v1/chat/completions\")"}
# The same for the gateway (model_gateway/src/observability/metrics.rs): its routing series.
GATEWAY_EMITTED = {"endpoint": "smg_router_requests_total, smg_router_request_duration_seconds, "
                               "smg_router_ttft_seconds, smg_worker_retries_total and others "
                               "carry the API (endpoint=\"chat\")"}

GENERATED = ("# GENERATED by `make generate` (sglang_obs/render/kubernetes.py) from {source}:\n"
             "# edit that, not this file. docs/kubernetes.md explains the objects.\n")


class TranslationError(ValueError):
    """A key of prometheus.yml or alertmanager.yml with no prometheus-operator equivalent here."""


# --- YAML output ------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow=False, indentless=False):  # lists indented under their key
        return super().increase_indent(flow, False)


def _str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=4096, allow_unicode=True)


def document(source: str, obj: Any) -> str:
    return GENERATED.format(source=source) + dump(obj)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it


def parse(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)  # a safe loader


# --- PrometheusRule ---------------------------------------------------------------------------


# The fleet's alerts watch hosts that ship into a central store. In a cluster a "host" is a
# node, and pods move between nodes: a node that no longer runs a scraped pod would page as a
# host that stopped reporting for an hour. Kubernetes' own alerts (kube-state-metrics) cover
# nodes there.
NOT_IN_KUBERNETES = {"rules/fleet.alerts.yml"}


@dataclass(frozen=True)
class Sources:
    """The files the objects translate, as text (the generator reads them; nothing here does):
    the rule files prometheus.yml loads (by the name it gives them), the dashboards' JSON (by
    file name) and alertmanager.yml."""

    rule_texts: dict[str, str]
    dashboards: dict[str, str]
    alertmanager: str


def rule_files(prom: dict) -> list[str]:
    """The rule files prometheus.yml loads (as it names them), in its order, less the fleet's."""
    return [name for name in prom["rule_files"] if name not in NOT_IN_KUBERNETES]


def _group_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(name, lines) of each `- name:` block of a generated rule file, comments included."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("- name: ")]
    if not starts or lines[starts[0] - 1] != "groups:":
        raise TranslationError("a rule file must be `groups:` with `- name:` blocks at column 0")
    bounds = [*starts, len(lines)]
    return [(lines[a][len("- name: "):].strip(), lines[a:b]) for a, b in pairwise(bounds)]


def rule_object_name(group: str) -> str:
    """The PrometheusRule's name: the group's, prefixed where it does not say sglang."""
    return group if group.startswith("sglang") else f"sglang-obs-{group}"


def prometheus_rules(prom: dict, rule_texts: dict[str, str]) -> dict[str, str]:
    interval = prom["global"]["evaluation_interval"]
    out = {}
    for name_in_prom in rule_files(prom):
        text = rule_texts[name_in_prom]
        parsed = {g["name"]: g for g in parse(text)["groups"]}
        for name, lines in _group_blocks(text):
            head = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                    "metadata": {"name": rule_object_name(name), "labels": dict(PART_OF)},
                    "spec": {"groups": None}}
            body = [lines[0], f"  interval: {interval}", *lines[1:]]
            indented = "\n".join(("  " + line) if line else line for line in body)
            text_out = (document(f"prometheus/{name_in_prom}", head)
                        .replace("  groups: null\n", "  groups:\n") + indented + "\n")
            group = parse(text_out)["spec"]["groups"][0]
            expected = {"name": name, "interval": interval, "rules": parsed[name]["rules"]}
            if group != expected:  # the text transplant must not change a rule
                raise TranslationError(f"rule group {name}: the PrometheusRule differs")
            out[f"base/prometheusrule-{name}.yaml"] = text_out
    return out


# --- PodMonitor -------------------------------------------------------------------------------

RELABEL_KEYS = {"source_labels": "sourceLabels", "separator": "separator",
                "target_label": "targetLabel", "regex": "regex", "modulus": "modulus",
                "replacement": "replacement", "action": "action"}
SPEC_KEYS = {"sample_limit": "sampleLimit", "target_limit": "targetLimit",
             "label_limit": "labelLimit", "label_name_length_limit": "labelNameLengthLimit",
             "label_value_length_limit": "labelValueLengthLimit",
             "body_size_limit": "bodySizeLimit", "keep_dropped_targets": "keepDroppedTargets"}
ENDPOINT_KEYS = {"scrape_interval": "interval", "scrape_timeout": "scrapeTimeout",
                 "metrics_path": "path", "scheme": "scheme", "honor_labels": "honorLabels",
                 "honor_timestamps": "honorTimestamps"}
# Replaced by pod discovery (the PodMonitor's selector) and the job relabeling.
DISCOVERY_KEYS = {"job_name", "static_configs", "http_sd_configs", "dns_sd_configs"}


def relabel_config(rule: dict) -> dict:
    unknown = set(rule) - set(RELABEL_KEYS)
    if unknown:
        raise TranslationError(f"relabel config keys {sorted(unknown)}: no RelabelConfig field")
    return {RELABEL_KEYS[key]: value for key, value in rule.items()}


def exporter_emitted() -> dict[str, str]:
    """Operator target labels the exporter also emits, with the families that carry them."""
    clash: dict[str, list[str]] = {}
    for spec in catalogue.METRICS:
        for label in set(spec.labels) & set(OPERATOR_TARGET_LABELS):
            clash.setdefault(label, []).append(spec.name)
    if {"namespace", "pod"} & set(clash):
        raise TranslationError(f"the exporter must not emit namespace or pod: {clash}")
    return {label: ", ".join(sorted(names)) for label, names in sorted(clash.items())}


def discovery_relabelings(job: dict) -> list[dict]:
    """The job's target relabelings that read HTTP discovery's labels (__meta_url: which
    exporter found the server): pod discovery has none of them, and sets `host` itself."""
    rules = job.get("relabel_configs", [])
    other = [r for r in rules if "__meta_url" not in r.get("source_labels", [])]
    if other:
        raise TranslationError(f"job {job['job_name']}: relabel_configs {other} have no "
                               "translation here")
    return rules


def kubernetes_relabelings(job: str, selectors: dict) -> list[dict]:
    """Target relabelings Kubernetes needs beyond prometheus.yml's, after the operator's own."""
    rules: list[dict] = [{"targetLabel": "job", "replacement": job}]
    exporter_job = selectors["exporter_job"]
    if job in (exporter_job, selectors["sglang_job"]):
        # `host` is the node: the GPU DaemonSet and the sidecars of one node share it, as the
        # exporter of one host does in compose (GPULost inhibits SGLangServerDown on it). In
        # prometheus.yml SGLang's targets get it from the discovering exporter's URL instead.
        rules.append({"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host"})
    if job == exporter_job:
        clash = exporter_emitted()
    elif job == selectors["gateway_job"]:
        clash = GATEWAY_EMITTED
    else:
        clash = SGLANG_EMITTED
    if clash:
        rules.append({"action": "labeldrop", "regex": "|".join(sorted(clash))})
    return rules


def pod_monitor(prom: dict, job: dict, selectors: dict) -> dict:
    name = job["job_name"]
    unknown = set(job) - DISCOVERY_KEYS - set(SPEC_KEYS) - set(ENDPOINT_KEYS) - {
        "metric_relabel_configs", "relabel_configs"}
    if unknown:
        raise TranslationError(f"job {name}: keys {sorted(unknown)} have no translation here")
    endpoint: dict[str, Any] = {"port": job_ports(selectors)[name],
                                "path": job.get("metrics_path", "/metrics"),
                                "interval": job.get("scrape_interval",
                                                    prom["global"]["scrape_interval"])}
    for key, field in ENDPOINT_KEYS.items():
        if key in job and field not in endpoint:
            endpoint[field] = job[key]
    discovery_relabelings(job)  # replaced, as the discovery they read
    endpoint["relabelings"] = kubernetes_relabelings(name, selectors)
    if job.get("metric_relabel_configs"):
        endpoint["metricRelabelings"] = [relabel_config(r) for r in job["metric_relabel_configs"]]
    spec: dict[str, Any] = {
        "selector": {"matchLabels": pod_labels(name, selectors)},
        "namespaceSelector": {"any": True},
    }
    spec.update({field: job[key] for key, field in SPEC_KEYS.items() if key in job})
    spec["podMetricsEndpoints"] = [endpoint]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": name, "labels": dict(PART_OF)}, "spec": spec}


def pod_monitors(prom: dict, selectors: dict) -> dict[str, str]:
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    ports = job_ports(selectors)
    missing = set(ports) - set(jobs)
    if missing:
        raise TranslationError(f"prometheus.yml has no job {sorted(missing)}")
    return {f"base/podmonitor-{name}.yaml":
            document(f"prometheus/prometheus.yml (job {name})",
                     pod_monitor(prom, jobs[name], selectors))
            for name in ports}


# --- AlertmanagerConfig -----------------------------------------------------------------------

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')
ROUTE_KEYS = {"receiver": "receiver", "group_by": "groupBy", "group_wait": "groupWait",
              "group_interval": "groupInterval", "repeat_interval": "repeatInterval",
              "continue": "continue", "mute_time_intervals": "muteTimeIntervals",
              "active_time_intervals": "activeTimeIntervals"}
WEBHOOK_KEYS = {"send_resolved": "sendResolved", "max_alerts": "maxAlerts"}


def matcher(text: str) -> dict:
    """'name=~"value"' (Alertmanager's matcher syntax) -> {name, matchType, value}."""
    match = _MATCHER.match(text)
    if not match:
        raise TranslationError(f"matcher {text!r}: expected name, operator, value")
    name, op, value = match.groups()
    if value.startswith('"'):
        if not value.endswith('"') or len(value) < 2:
            raise TranslationError(f"matcher {text!r}: unterminated quote")
        value = json.loads(value)  # Alertmanager's quoting is Go's: \" and \\ escapes
    return {"name": name, "matchType": op, "value": value}


def route(spec: dict) -> dict:
    unknown = set(spec) - set(ROUTE_KEYS) - {"matchers", "routes"}
    if unknown:
        raise TranslationError(f"route keys {sorted(unknown)}: write `matchers:` (the match/"
                               "match_re forms are deprecated) or translate by hand")
    out: dict[str, Any] = {}
    for key, field in ROUTE_KEYS.items():
        if key in spec:
            out[field] = spec[key]
    if spec.get("matchers"):
        out["matchers"] = [matcher(m) for m in spec["matchers"]]
    if spec.get("routes"):
        out["routes"] = [route(r) for r in spec["routes"]]
    return out


def secret_key(receiver: str, index: int) -> str:
    return f"{receiver}-url" if index == 0 else f"{receiver}-url-{index + 1}"


def receiver(spec: dict) -> dict:
    unknown = set(spec) - {"name", "webhook_configs"}
    if unknown:
        raise TranslationError(f"receiver {spec['name']}: {sorted(unknown)} are not translated; "
                               "only webhooks are (their URLs go to the Secret)")
    out: dict[str, Any] = {"name": spec["name"]}
    hooks = []
    for i, hook in enumerate(spec.get("webhook_configs") or []):
        extra = set(hook) - {"url"} - set(WEBHOOK_KEYS)
        if extra:
            raise TranslationError(f"receiver {spec['name']}: webhook keys {sorted(extra)}")
        item: dict[str, Any] = {"urlSecret": {"name": RECEIVER_SECRET,
                                              "key": secret_key(spec["name"], i)}}
        item.update({field: hook[key] for key, field in WEBHOOK_KEYS.items() if key in hook})
        hooks.append(item)
    if hooks:
        out["webhookConfigs"] = hooks
    return out


def inhibit_rule(spec: dict) -> dict:
    unknown = set(spec) - {"source_matchers", "target_matchers", "equal"}
    if unknown:
        raise TranslationError(f"inhibit rule keys {sorted(unknown)}: use source_matchers/"
                               "target_matchers")
    out: dict[str, Any] = {"sourceMatch": [matcher(m) for m in spec.get("source_matchers", [])],
                           "targetMatch": [matcher(m) for m in spec.get("target_matchers", [])]}
    if spec.get("equal"):
        out["equal"] = list(spec["equal"])
    return out


def alert_names(prom: dict, rule_texts: dict[str, str]) -> list[str]:
    """Every alert name of the rule files, once each, in file order."""
    names = [rule["alert"] for name in rule_files(prom)
             for group in parse(rule_texts[name])["groups"] for rule in group["rules"]
             if "alert" in rule]
    return list(dict.fromkeys(names))


def alertmanager_config(prom: dict, am: dict, rule_texts: dict[str, str]) -> dict:
    top = route(am["route"])
    if "matchers" in top:
        raise TranslationError("alertmanager.yml's root route has matchers: merge them by hand")
    # Under the AlertmanagerConfig the operator nests this route below Alertmanager's own root,
    # so without a matcher it would take every alert of the cluster: it takes ours only.
    top = {"receiver": top.pop("receiver"),
           "matchers": [{"name": "alertname", "matchType": "=~",
                         "value": "|".join(alert_names(prom, rule_texts))}], **top}
    return {
        "apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "AlertmanagerConfig",
        "metadata": {"name": ALERTMANAGER_CONFIG_NAME, "labels": dict(PART_OF)},
        "spec": {"route": top,
                 "inhibitRules": [inhibit_rule(r) for r in am.get("inhibit_rules", [])],
                 "receivers": [receiver(r) for r in am["receivers"]]},
    }


def secret_keys(am_config: dict) -> list[str]:
    return [hook["urlSecret"]["key"] for r in am_config["spec"]["receivers"]
            for hook in r.get("webhookConfigs", [])]


SECRET_EXAMPLE = """\
# The Secret the AlertmanagerConfig reads its receivers' webhook URLs from. An EXAMPLE: it is
# listed in no kustomization, so `kubectl apply -k` never overwrites your real one. Either
#   kubectl -n {namespace} create secret generic {name} {literals}
# or copy this file outside the repository, put your URLs in, and `kubectl apply -f` it.
# prometheus-operator reads it in the AlertmanagerConfig's namespace.
"""


def receivers_secret(am_config: dict) -> str:
    keys = secret_keys(am_config)
    literals = " ".join(f"--from-literal={key}=https://..." for key in keys)
    obj = {"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": RECEIVER_SECRET, "namespace": MONITORING_NAMESPACE,
                        "labels": dict(PART_OF)},
           "type": "Opaque",
           "stringData": {key: f"https://REPLACE-ME.invalid/{key.removesuffix('-url')}"
                          for key in keys}}
    return (GENERATED.format(source="alertmanager/alertmanager.yml (receivers)")
            + SECRET_EXAMPLE.format(namespace=MONITORING_NAMESPACE, name=RECEIVER_SECRET,
                                   literals=literals) + dump(obj))


# --- Grafana dashboards -----------------------------------------------------------------------


def dashboard_configmaps(dashboards: dict[str, str]) -> dict[str, str]:
    out = {}
    for file_name, content in sorted(dashboards.items()):
        path = Path(file_name)
        if not content.endswith("\n") or any(line != line.rstrip() or "\t" in line
                                             for line in content.splitlines()):
            raise TranslationError(f"{path.name}: a literal block cannot hold it byte for byte")
        short = path.stem.removeprefix("sglang-")
        head = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"sglang-obs-dashboard-{short}",
                             "labels": {**PART_OF, "grafana_dashboard": "1"}},
                "data": None}
        body = "\n".join(("    " + line) if line else line for line in content.splitlines())
        text = (document(f"grafana/dashboards/{path.name}", head)
                .replace("data: null\n", "data:\n") + f"  {path.name}: |\n{body}\n")
        if parse(text)["data"][path.name] != content:
            raise TranslationError(f"{path.name}: the ConfigMap does not hold it byte for byte")
        out[f"base/dashboard-{short}.yaml"] = text
    return out


# --- the exporter: GPU DaemonSet and the example workload -------------------------------------

EXPORTER_SECURITY = """\
            runAsNonRoot: true
            runAsUser: 10001          # the image's user (exporter/Dockerfile)
            runAsGroup: 10001
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]"""

DAEMONSET = f"""\
# Node-level GPU health: one exporter per GPU node, NVML only (--no-collector.sglang). It sees
# every GPU of the node the way NVIDIA's dcgm-exporter does: the NVIDIA container runtime
# (runtimeClassName nvidia, installed by the GPU Operator) injects the devices named by
# NVIDIA_VISIBLE_DEVICES=all, without requesting nvidia.com/gpu (that would take a GPU away
# from SGLang). No hostPID: per-process GPU memory is the gpu-processes component.
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {GPU_DAEMONSET}
  labels:
    app.kubernetes.io/name: {GPU_DAEMONSET}
    app.kubernetes.io/part-of: sglang-obs
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: {GPU_DAEMONSET}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {GPU_DAEMONSET}
        app.kubernetes.io/part-of: sglang-obs
        {SCRAPE_LABEL[0]}: "{SCRAPE_LABEL[1]}"   # the sglang-obs PodMonitor scrapes it
    spec:
      serviceAccountName: {GPU_DAEMONSET}
      automountServiceAccountToken: false   # it never talks to the Kubernetes API
      runtimeClassName: nvidia
      nodeSelector:
        nvidia.com/gpu.present: "true"      # the GPU Operator's node label
      tolerations:
        - key: nvidia.com/gpu
          operator: Exists
          effect: NoSchedule
      securityContext:
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: exporter
          image: {IMAGE}:{__version__}
          imagePullPolicy: IfNotPresent
          env:
            - name: SGLANG_OBS_COLLECTOR_SGLANG
              value: "false"
            - name: SGLANG_OBS_COLLECTOR_DOCKER
              value: "false"
            - name: NVIDIA_VISIBLE_DEVICES
              value: all
            - name: NVIDIA_DRIVER_CAPABILITIES
              value: utility                # NVML needs no compute
          ports:
            - name: {EXPORTER_PORT_NAME}
              containerPort: {EXPORTER_PORT}
          livenessProbe:
            httpGet:
              path: /metrics
              port: {EXPORTER_PORT_NAME}
            periodSeconds: 15
            timeoutSeconds: 3
          resources:
            requests:
              cpu: 20m
              memory: 64Mi
            limits:
              cpu: 250m
              memory: 256Mi
          securityContext:
{EXPORTER_SECURITY}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
"""

GPU_SERVICE_ACCOUNT = f"""\
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {GPU_DAEMONSET}
  labels:
    app.kubernetes.io/part-of: sglang-obs
automountServiceAccountToken: false
"""

GPU_COMPONENT = """\
# The GPU DaemonSet (node-level GPU health); needs the image pushed to a registry your nodes
# pull from (docs/kubernetes.md). Add it to an overlay's `components:`.
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - serviceaccount.yaml
  - daemonset.yaml
  - networkpolicy.yaml
"""

GPU_PROCESSES_COMPONENT = f"""\
# Opt-in: GPU memory per process (--collector.nvml.processes) on the GPU DaemonSet. NVML names
# processes by their host pid, so the pod joins the host's pid namespace: the exporter then
# sees every process of the node. Listed after gpu-node-exporter in `components:`.
# On the DaemonSet no SGLang server is in the exporter's network namespace, so the memory is
# reported per GPU under server="" (docs/kubernetes.md).
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
patches:
  - target:
      kind: DaemonSet
      name: {GPU_DAEMONSET}
    patch: |-
      - op: add
        path: /spec/template/spec/hostPID
        value: true
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value:
          name: SGLANG_OBS_COLLECTOR_NVML_PROCESSES
          value: "true"
"""

LOG_DIR = "/var/log/sglang"
LOG_FILE = f"{LOG_DIR}/scheduler.log"
# The example SGLang container runs as this uid (the image's default user is root; no user of
# its own is needed: HOME and USER are set), with its writable folders as emptyDirs.
SGLANG_UID = 1000
SGLANG_HOME = "/home/sglang"
HF_HOME = "/var/cache/huggingface"

EXAMPLE_DEPLOYMENT = f"""\
# An example SGLang server with the exporter as a sidecar: validated by the tests, never
# applied by them. The parts that matter for sglang-obs are marked (*). Both containers run
# non-root on a read-only root filesystem; what they write goes to emptyDirs (below).
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {EXAMPLE_NAME}
  labels:
    app.kubernetes.io/name: {EXAMPLE_NAME}
spec:
  replicas: 1
  selector:
    matchLabels:
      app.kubernetes.io/name: {EXAMPLE_NAME}
  strategy:
    type: Recreate          # one GPU per replica: no second pod while the old one holds it
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {EXAMPLE_NAME}
        {SCRAPE_LABEL[0]}: "{SCRAPE_LABEL[1]}"   # (*) the sglang, sglang-obs PodMonitors select it
    spec:
      serviceAccountName: {EXAMPLE_NAME}
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 60
      tolerations:
        - key: nvidia.com/gpu
          operator: Exists
          effect: NoSchedule
      securityContext:
        runAsNonRoot: true              # each container names its uid
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: sglang
          image: lmsysorg/sglang:v0.5.23   # pin the release (and digest) you run
          command: ["bash", "-c"]
          # (*) --enable-metrics: /metrics on --port. The scheduler log goes to the container
          # log and to a file the sidecar follows, cut back to empty past 64 MiB (the exporter
          # follows truncation); SGLang stays the container's main process (exec).
          args:
            - |
              exec python3 -m sglang.launch_server --model-path "$MODEL_PATH" \\
                --host 0.0.0.0 --port {SGLANG_PORT} --enable-metrics \\
                > >(python3 -u -c '
              import sys
              log = open("{LOG_FILE}", "a")
              for line in sys.stdin:
                  sys.stdout.write(line)
                  log.write(line)
                  log.flush()
                  if log.tell() > 64 << 20:
                      log.truncate(0)
              ') 2>&1
          env:
            - name: MODEL_PATH
              value: Qwen/Qwen2.5-7B-Instruct
            - name: HOME                  # the JIT caches under ~ (the sglang-home mount)
              value: {SGLANG_HOME}
            - name: HF_HOME               # the Hugging Face Hub's downloads (the hf-cache mount)
              value: {HF_HOME}
            - name: USER                  # getpass.getuser() (TorchInductor's cache folder name)
              value: sglang               # without an /etc/passwd entry for the uid
          ports:
            - name: {SGLANG_PORT_NAME}             # (*) the sglang PodMonitor's port
              containerPort: {SGLANG_PORT}
          startupProbe:                   # loading weights and capturing CUDA graphs
            httpGet:
              path: /health
              port: {SGLANG_PORT_NAME}
            periodSeconds: 10
            failureThreshold: 90
          readinessProbe:
            httpGet:
              path: /health
              port: {SGLANG_PORT_NAME}
            periodSeconds: 10
          resources:
            requests:
              cpu: "4"
              memory: 32Gi
            limits:
              nvidia.com/gpu: 1           # (*) the GPU; the sidecar requests none
              memory: 64Gi
          securityContext:
            runAsNonRoot: true
            runAsUser: {SGLANG_UID}
            runAsGroup: {SGLANG_UID}
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: [ALL]                 # the GPU needs none: /dev/nvidia* are open to all
          # Writable, each an emptyDir of its own (a mount inside another would be created
          # root-owned, and the uid could not write beside it):
          volumeMounts:
            # shared memory for NCCL and torch multiprocessing (the runtime gives 64 MiB)
            - name: dshm
              mountPath: /dev/shm
            # tempfile: --enable-metrics' PROMETHEUS_MULTIPROC_DIR, TorchInductor's cache
            - name: sglang-tmp
              mountPath: /tmp
            # $HOME: ~/.triton, ~/.cache (FlashInfer, torch extensions, grammar backends),
            # ~/.nv (CUDA's JIT cache): kernels compiled at start
            - name: sglang-home
              mountPath: {SGLANG_HOME}
            # $HF_HOME: the model, downloaded at start (a PVC or a read-only volume with the
            # weights avoids the download and the HTTPS egress: docs/kubernetes.md)
            - name: hf-cache
              mountPath: {HF_HOME}
            # the scheduler log the sidecar follows
            - name: sglang-log
              mountPath: {LOG_DIR}
        # (*) The exporter: polls this pod's SGLang every second over the pod IP (the address
        # the sglang PodMonitor scrapes, so `server` = SGLang's `instance`), follows the
        # scheduler log. No readinessProbe: the exporter must never take SGLang out of its
        # Service. NVML off: Kubernetes gives GPUs to the container that requests them, so
        # the node DaemonSet reports GPU health (docs/kubernetes.md).
        - name: exporter
          image: {IMAGE}:{__version__}
          imagePullPolicy: IfNotPresent
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: SGLANG_OBS_SGLANG_URL
              value: http://$(POD_IP):{SGLANG_PORT}
            - name: SGLANG_OBS_SGLANG_LOG_FILE
              value: {LOG_FILE}
            - name: SGLANG_OBS_COLLECTOR_NVML
              value: "false"
            - name: SGLANG_OBS_COLLECTOR_DOCKER
              value: "false"
          ports:
            - name: {EXPORTER_PORT_NAME}           # (*) the sglang-obs PodMonitor's port
              containerPort: {EXPORTER_PORT}
          livenessProbe:
            httpGet:
              path: /metrics
              port: {EXPORTER_PORT_NAME}
            periodSeconds: 15
            timeoutSeconds: 3
          resources:
            requests:
              cpu: 50m
              memory: 64Mi
            limits:
              cpu: 500m
              memory: 256Mi
          securityContext:
{EXPORTER_SECURITY}
          volumeMounts:
            - name: sglang-log
              mountPath: {LOG_DIR}
              readOnly: true
            - name: tmp
              mountPath: /tmp
      volumes:
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: 16Gi
        - name: sglang-tmp
          emptyDir:
            sizeLimit: 8Gi
        - name: sglang-home
          emptyDir:
            sizeLimit: 8Gi
        - name: hf-cache
          emptyDir:
            sizeLimit: 64Gi
        - name: sglang-log
          emptyDir:
            sizeLimit: 256Mi
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
"""

EXAMPLE_SERVICE = f"""\
# SGLang's API for clients. Prometheus does not use it: the PodMonitors scrape the pods.
apiVersion: v1
kind: Service
metadata:
  name: {EXAMPLE_NAME}
  labels:
    app.kubernetes.io/name: {EXAMPLE_NAME}
spec:
  selector:
    app.kubernetes.io/name: {EXAMPLE_NAME}
  ports:
    - name: {SGLANG_PORT_NAME}
      port: {SGLANG_PORT}
      targetPort: {SGLANG_PORT_NAME}
"""

EXAMPLE_SERVICE_ACCOUNT = f"""\
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {EXAMPLE_NAME}
  labels:
    app.kubernetes.io/name: {EXAMPLE_NAME}
automountServiceAccountToken: false
"""

BASE_KUSTOMIZATION = """\
# The monitoring side, namespace-free: rules, PodMonitors, AlertmanagerConfig, dashboards.
# Use it through an overlay that sets the namespace and kube-prometheus-stack's `release` label
# (overlays/kube-prometheus-stack).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
{resources}"""

KPS_KUSTOMIZATION = f"""\
# sglang-obs on kube-prometheus-stack (docs/kubernetes.md): the base in the stack's namespace,
# labelled with the Helm release the stack's Prometheus selects rules and monitors by.
# Another release name or namespace: change them here (or in an overlay of your own).
# receivers-secret.example.yaml is deliberately not listed: the Secret is yours. helm-values.yaml
# is for Helm, not kubectl.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: {MONITORING_NAMESPACE}
resources:
  - ../../base
labels:
  - pairs:
      release: {KPS_RELEASE}
    includeSelectors: false    # metadata only: the PodMonitors' selectors stay as they are
"""

HELM_VALUES = f"""\
# Helm values sglang-obs needs from kube-prometheus-stack (76.0.0 or later: prometheus-operator
# 0.84+), merged into yours (docs/kubernetes.md):
#   helm upgrade --install {KPS_RELEASE} prometheus-community/kube-prometheus-stack \\
#     -n {MONITORING_NAMESPACE} --create-namespace --reuse-values \\
#     -f deploy/kubernetes/overlays/kube-prometheus-stack/helm-values.yaml
# Not a Kubernetes object: no kustomization lists it.
alertmanager:
  alertmanagerSpec:
    # prometheus-operator adds namespace="<its namespace>" to an AlertmanagerConfig's route and
    # inhibit rules. The rules aggregate by instance, so most alerts carry no namespace and
    # would never match. With this strategy an AlertmanagerConfig in the Alertmanager's own
    # namespace (the overlay puts ours in {MONITORING_NAMESPACE}) sees every alert; the route's own
    # matcher keeps it to sglang-obs's alerts. Other namespaces' configs stay namespaced.
    alertmanagerConfigMatcherStrategy:
      type: OnNamespaceExceptForAlertmanagerNamespace
prometheus:
  prometheusSpec:
    # The `cluster` label the Alertmanager routes group by: an external label, added to alerts
    # and remote-written series, never stored by the exporter or the rules.
    # externalLabels:
    #   cluster: my-cluster
    # Long-term storage, several clusters: Mimir, Thanos Receive (docs/kubernetes.md).
    # remoteWrite:
    #   - url: https://mimir.example.com/api/v1/push
    #     headers:
    #       X-Scope-OrgID: my-tenant
"""

EXAMPLE_KUSTOMIZATION = f"""\
# An example workload: SGLang with the exporter sidecar, the GPU DaemonSet and their
# NetworkPolicies, in namespace {EXAMPLE_NAMESPACE} (`kubectl create namespace {EXAMPLE_NAMESPACE}`
# first). Validated by the tests, not applied.
# The exporter image: build it (exporter/Dockerfile), push it, and name your registry below.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: {EXAMPLE_NAMESPACE}
resources:
  - serviceaccount.yaml
  - deployment.yaml
  - service.yaml
  - networkpolicy.yaml
components:
  - ../../components/gpu-node-exporter
  # - ../../components/gpu-processes     # GPU memory per process: hostPID (read the docs)
  # - ../../components/gateway-networkpolicy   # a PD gateway your policies fence (read the docs)
  # - ../../components/autoscaling-keda   # replicas = the recommendation, with KEDA (the docs)
  # - ../../components/autoscaling-hpa    # or with an HPA and prometheus-adapter: one of the two
images:
  - name: {IMAGE}
    newName: registry.example.com/{IMAGE}
    newTag: "{__version__}"
patches:
  # The Prometheus that scrapes these pods, the first source of every NetworkPolicy here (the
  # GPU DaemonSet's too): kube-prometheus-stack's pods in the kube-prometheus-stack overlay's
  # namespace. Another namespace or another Prometheus: edit this value (docs/kubernetes.md).
  - target:
      kind: NetworkPolicy
    patch: |-
      - op: replace
        path: /spec/ingress/0/from/0
        value:
{{peer}}"""


# --- NetworkPolicies ----------------------------------------------------------------------------

NETWORK_POLICY_NOTE = """\
# Kubelet probes come from the node, and Kubernetes specifies that traffic between a pod and its
# own node is always allowed (most CNIs do so): no rule admits them (docs/kubernetes.md).
"""


def prometheus_peer() -> dict:
    """The Prometheus that scrapes the exporter and SGLang: kube-prometheus-stack's pods, in the
    kube-prometheus-stack overlay's namespace (the example overlay patches it: one place)."""
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: MONITORING_NAMESPACE}},
            "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}}


def _ports(protocol: str, *ports: int | str) -> list[dict]:
    return [{"protocol": protocol, "port": port} for port in ports]


def network_policy(name: str, labels: dict, pods: dict, ingress: list[dict],
                   egress: list[dict] | None) -> dict:
    """A policy on the pods labelled `pods` (their workload's selector), both directions: what
    the rules do not admit is refused. The Prometheus rule comes first: the example overlay's
    patch replaces /spec/ingress/0/from/0. `egress` None: an ingress-only policy (a pod this
    stack does not ship, whose traffic other policies govern)."""
    if ingress[0]["from"] != [prometheus_peer()]:
        raise TranslationError(f"{name}: the first ingress rule must admit Prometheus alone")
    spec: dict[str, Any] = {"podSelector": {"matchLabels": dict(pods)},
                            "policyTypes": ["Ingress"] if egress is None else ["Ingress", "Egress"],
                            "ingress": ingress}
    if egress is not None:
        spec["egress"] = egress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": dict(labels)}, "spec": spec}


GPU_NETWORK_POLICY_HEAD = f"""\
# The GPU DaemonSet's pods: Prometheus scrapes its port {EXPORTER_PORT_NAME}, and nothing else comes
# in. Nothing goes out: NVML is local, and with the SGLang collector off it calls no server.
""" + NETWORK_POLICY_NOTE


def gpu_network_policy() -> dict:
    pods = {"app.kubernetes.io/name": GPU_DAEMONSET}  # the DaemonSet's selector
    return network_policy(GPU_DAEMONSET, {**pods, **PART_OF}, pods,
                          ingress=[{"from": [prometheus_peer()],
                                    "ports": _ports("TCP", EXPORTER_PORT)}],
                          egress=[])


GATEWAY_NETWORK_POLICY_HEAD = f"""\
# Opt-in: the PD gateway's router pods (smg's Helm chart labels) where NetworkPolicies of your own
# already fence them. Admits the Prometheus that scrapes them to port {GATEWAY_PORT_NAME} (the smg
# PodMonitor's), and nothing else: ingress only, so their clients, their mesh peers and their
# egress stay as your policies have them. On pods no other policy selects, this one alone would
# refuse every other connection to them: do not add it there (docs/kubernetes.md).
""" + NETWORK_POLICY_NOTE


def gateway_network_policy() -> dict:
    return network_policy(GATEWAY_NETWORK_POLICY, PART_OF, GATEWAY_POD_LABELS,
                          ingress=[{"from": [prometheus_peer()],
                                    "ports": _ports("TCP", GATEWAY_PORT_NAME)}],
                          egress=None)


GATEWAY_COMPONENT = """\
# Opt-in (docs/kubernetes.md): the scraping Prometheus admitted to a PD gateway whose pods your
# NetworkPolicies fence. List it in the `components:` of an overlay in the gateway's namespace,
# with the Prometheus peer patch of overlays/example.
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - networkpolicy.yaml
"""


EXAMPLE_NETWORK_POLICY_HEAD = f"""\
# The example SGLang pod (SGLang and the exporter sidecar share its network).
# In:  1. Prometheus: the exporter's port and SGLang's (/metrics), the two PodMonitors;
#      2. the pod's own sidecar, which polls SGLang over the pod IP (Kubernetes specifies that a
#         pod cannot block itself: stated anyway, so that narrowing 3 never cuts it off);
#      3. the clients: every pod of the server's namespace ({EXAMPLE_NAMESPACE}), SGLang's port
#         only. An ingress controller or clients elsewhere: add a rule (docs/kubernetes.md).
# Out: the cluster DNS and HTTPS outside the cluster's networks, SGLang's model download from
#      the Hugging Face Hub (not needed with the weights on a volume: drop both); the sidecar's
#      poll of SGLang. The exporter itself needs no DNS: it polls an IP.
""" + NETWORK_POLICY_NOTE


def example_network_policy() -> dict:
    pods = {"app.kubernetes.io/name": EXAMPLE_NAME}  # the Deployment's selector

    def itself() -> dict:  # a fresh dict each time: one shared would be dumped as a YAML alias
        return {"podSelector": {"matchLabels": dict(pods)}}

    return network_policy(
        EXAMPLE_NAME, pods, pods,
        ingress=[{"from": [prometheus_peer()],
                  "ports": _ports("TCP", EXPORTER_PORT, SGLANG_PORT)},
                 {"from": [itself()], "ports": _ports("TCP", SGLANG_PORT)},
                 {"from": [{"podSelector": {}}], "ports": _ports("TCP", SGLANG_PORT)}],
        egress=[{"to": [copy.deepcopy(DNS_PEER)],
                 "ports": _ports("UDP", DNS_PORT) + _ports("TCP", DNS_PORT)},
                {"to": [itself()], "ports": _ports("TCP", SGLANG_PORT)},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NOT_THE_INTERNET)}}],
                 "ports": _ports("TCP", HTTPS_PORT)}])


def example_kustomization() -> str:
    peer = "".join(f"          {line}\n" for line in dump(prometheus_peer()).splitlines())
    return EXAMPLE_KUSTOMIZATION.format(peer=peer)


# --- all files --------------------------------------------------------------------------------


def files(s: Settings, sources: Sources) -> dict[str, str]:
    """Relative path under deploy/kubernetes/ -> content, from the settings' prometheus.yml and
    selectors and the `sources`' rule files, alertmanager.yml and dashboards."""
    prom = dict(s.prometheus)
    am = parse(sources.alertmanager)
    am_config = alertmanager_config(prom, am, sources.rule_texts)
    base = {
        **prometheus_rules(prom, sources.rule_texts),
        **pod_monitors(prom, s.selectors),
        "base/alertmanagerconfig.yaml": document("alertmanager/alertmanager.yml", am_config),
        **dashboard_configmaps(sources.dashboards),
    }
    listing = "".join(f"  - {Path(p).name}\n" for p in base)
    out = {
        **base,
        "base/kustomization.yaml": BASE_KUSTOMIZATION.format(resources=listing),
        "overlays/kube-prometheus-stack/kustomization.yaml": KPS_KUSTOMIZATION,
        "overlays/kube-prometheus-stack/helm-values.yaml": HELM_VALUES,
        "overlays/kube-prometheus-stack/receivers-secret.example.yaml":
            receivers_secret(am_config),
        "overlays/example/kustomization.yaml": example_kustomization(),
        "overlays/example/networkpolicy.yaml":
            EXAMPLE_NETWORK_POLICY_HEAD + dump(example_network_policy()),
        "overlays/example/deployment.yaml": EXAMPLE_DEPLOYMENT,
        "overlays/example/service.yaml": EXAMPLE_SERVICE,
        "overlays/example/serviceaccount.yaml": EXAMPLE_SERVICE_ACCOUNT,
        "components/gpu-node-exporter/kustomization.yaml": GPU_COMPONENT,
        "components/gpu-node-exporter/daemonset.yaml": DAEMONSET,
        "components/gpu-node-exporter/serviceaccount.yaml": GPU_SERVICE_ACCOUNT,
        "components/gpu-node-exporter/networkpolicy.yaml":
            GPU_NETWORK_POLICY_HEAD + dump(gpu_network_policy()),
        "components/gpu-processes/kustomization.yaml": GPU_PROCESSES_COMPONENT,
        "components/gateway-networkpolicy/kustomization.yaml": GATEWAY_COMPONENT,
        "components/gateway-networkpolicy/networkpolicy.yaml":
            GATEWAY_NETWORK_POLICY_HEAD + dump(gateway_network_policy()),
    }
    # The autoscaling components build on this module's names: imported here, not above.
    from sglang_obs.render import kubernetes_scaling
    out.update(kubernetes_scaling.files(s))
    header = GENERATED.format(source="sglang_obs/render/kubernetes.py")
    for path, text in out.items():
        if not text.startswith("# GENERATED"):
            out[path] = header + text
        parse(out[path])  # every file parses
    return dict(sorted(out.items()))
