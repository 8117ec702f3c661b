"""Kubernetes without a cluster, for tests/test_kubernetes.py: the vendored prometheus-operator
and KEDA CRD schemas (strict: a misspelt field fails, where the API server would silently prune
it), Prometheus relabelling, what prometheus-operator does to a PodMonitor target, and the part of
kustomize the manifests use (resources, components, namespace, labels, images, JSON patches)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jsonschema
import yaml

from conftest import ROOT

# Vendored CRDs (schemas/README.md): prometheus-operator's, KEDA's ScaledObject.
CRD_DIRS = (ROOT / "schemas" / "prometheus-operator", ROOT / "schemas" / "keda")


class CrdLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """YAML 1.1 reads a bare `=` as the `!!value` tag; the CRDs mean the string."""


CrdLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node:
                          loader.construct_scalar(node))


@cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema of every vendored CRD version."""
    out = {}
    for path in sorted(p for folder in CRD_DIRS for p in folder.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=CrdLoader)  # a SafeLoader
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return out


def strict(schema: dict) -> dict:
    """The schema with additionalProperties: false wherever it lists properties and does not
    keep unknown fields: an unknown field is an error, as kubeconform -strict has it."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(strict(crd_schemas()[(api_version, kind)]))


def crd_errors(obj: dict, schema: dict | None = None) -> list[str]:
    """Errors of a custom resource against its CRD (or of a part against `schema`)."""
    validator = (_crd_validator(obj["apiVersion"], obj["kind"]) if schema is None
                 else jsonschema.Draft202012Validator(strict(schema)))
    return [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
            for e in validator.iter_errors(obj)]


def subschema(obj: dict, *path: str) -> dict:
    """The schema of a field below the CRD root, e.g. ('spec', 'route')."""
    node = crd_schemas()[(obj["apiVersion"], obj["kind"])]
    for key in path:
        node = node["properties"][key]
    return node


# --- Prometheus relabelling -------------------------------------------------------------------

SNAKE = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def _expand(template: str, match: re.Match) -> str:
    def group(m):
        name = m.group(1) or m.group(2)
        try:
            value = match.group(int(name) if name.isdigit() else name)
        except IndexError:  # Go's Expand: an unknown group is empty
            return ""
        return value or ""

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", group, template)


def relabel(labels: dict[str, str] | None, configs: list[dict]) -> dict[str, str] | None:
    """Prometheus's relabel_config (either key spelling) applied in order; None: dropped."""
    for raw in configs:
        config = {SNAKE.get(k, k): v for k, v in raw.items()}
        action = config.get("action", "replace").lower()
        regex = re.compile(config.get("regex", "(.*)"))
        if action in ("labeldrop", "labelkeep"):
            keep = action == "labelkeep"
            labels = {k: v for k, v in labels.items() if bool(regex.fullmatch(k)) == keep}
            continue
        value = config.get("separator", ";").join(labels.get(name, "")
                                                   for name in config.get("source_labels", []))
        match = regex.fullmatch(value)
        if action == "keep" and not match or action == "drop" and match:
            return None
        if action in ("keep", "drop"):
            continue
        if action != "replace":
            raise NotImplementedError(f"relabel action {action}")
        if not match:
            continue
        target = _expand(config["target_label"], match)
        result = _expand(config.get("replacement", "$1"), match)
        labels = dict(labels)
        if result:
            labels[target] = result
        else:
            labels.pop(target, None)
    return labels


# --- a PodMonitor target, as prometheus-operator configures it --------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    ip: str
    node: str
    labels: dict
    containers: list  # the pod spec's containers


def targets(pod_monitor: dict, pod: Pod) -> list[dict[str, str]]:
    """The target labels (after relabelling, meta labels gone) of each of the pod's ports a
    PodMonitor's endpoints scrape; prometheus-operator 0.93's generatePodMonitorConfig."""
    spec = pod_monitor["spec"]
    selector = spec["selector"].get("matchLabels", {})
    if any(pod.labels.get(k) != v for k, v in selector.items()):
        return []
    if not spec.get("namespaceSelector", {}).get("any") and (
            pod.namespace != pod_monitor["metadata"].get("namespace")):
        return []
    out = []
    for endpoint in spec["podMetricsEndpoints"]:
        for container in pod.containers:
            for port in container.get("ports", []):
                if port.get("name") != endpoint["port"]:
                    continue
                labels = {
                    "__address__": f"{pod.ip}:{port['containerPort']}",
                    "__metrics_path__": endpoint.get("path", "/metrics"),
                    "__meta_kubernetes_namespace": pod.namespace,
                    "__meta_kubernetes_pod_name": pod.name,
                    "__meta_kubernetes_pod_node_name": pod.node,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port["name"],
                    **{f"__meta_kubernetes_pod_label_{re.sub(r'[^A-Za-z0-9_]', '_', k)}": v
                       for k, v in pod.labels.items()},
                }
                name = pod_monitor["metadata"]["name"]
                namespace = pod_monitor["metadata"].get("namespace", pod.namespace)
                operator = [
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_container_name"],
                     "target_label": "container"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    {"target_label": "job", "replacement": f"{namespace}/{name}"},
                    {"target_label": "endpoint", "replacement": endpoint["port"]},
                ]
                labels = relabel(labels, operator + endpoint.get("relabelings", []))
                if labels is None:
                    continue
                labels.setdefault("instance", labels["__address__"])
                out.append({k: v for k, v in labels.items() if not k.startswith("__")})
    return out


def scrape(target: dict[str, str], sample: dict[str, str], endpoint: dict) -> dict | None:
    """A scraped sample's labels as stored: target labels win (honor_labels off; the scraped
    value moves to exported_<name>), then metric relabelling."""
    if endpoint.get("honorLabels"):
        raise NotImplementedError("honorLabels")
    labels = dict(sample)
    for name, value in target.items():
        if name in labels:
            labels[f"exported_{name}"] = labels.pop(name)
        labels[name] = value
    labels = {k: v for k, v in labels.items() if v != ""}
    return relabel(labels, endpoint.get("metricRelabelings", []))


# --- kustomize, the part the manifests use ----------------------------------------------------

KUSTOMIZATION = "kustomization.yaml"


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML has it


@cache
def _load_all(path: Path, mtime: float) -> tuple:
    return tuple(doc for doc in yaml.load_all(path.read_text(), Loader=LOADER) if doc)


def load_all(path: Path) -> list[dict]:
    """The documents of a YAML file (parsed once per version of the file; a fresh copy)."""
    return copy.deepcopy(list(_load_all(path.resolve(), path.stat().st_mtime)))


def kustomization(folder: Path) -> dict:
    return yaml.safe_load((folder / KUSTOMIZATION).read_text())


def listed_files(folder: Path) -> set[Path]:
    """Files and folders a kustomization names: resources, components (resolved)."""
    spec = kustomization(folder)
    return {(folder / entry).resolve() for key in ("resources", "components")
            for entry in spec.get(key) or []}


def json_patch(obj: dict, ops: list[dict]) -> dict:
    obj = copy.deepcopy(obj)
    for op in ops:
        if op["op"] not in ("add", "replace", "remove"):
            raise NotImplementedError(op["op"])
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].lstrip("/").split("/")]
        node = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "remove":  # a missing path is an error, as in kustomize
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            if last == "-":
                node.append(op["value"])
            elif op["op"] == "add":
                node.insert(int(last), op["value"])
            else:
                node[int(last)] = op["value"]
        else:
            if op["op"] == "replace" and last not in node:
                raise KeyError(op["path"])
            node[last] = op["value"]
    return obj


def _matches(obj: dict, target: dict) -> bool:
    return all(obj.get("kind") == v if k == "kind" else obj["metadata"].get(k) == v
               for k, v in target.items())


def _apply(spec: dict, objects: list[dict]) -> list[dict]:
    """A kustomization's transformers, in kustomize's order."""
    for patch in spec.get("patches") or []:
        if "path" in patch or "target" not in patch:
            raise NotImplementedError("only inline JSON6902 patches with a target")
        ops = yaml.safe_load(patch["patch"])
        hits = [i for i, obj in enumerate(objects) if _matches(obj, patch["target"])]
        assert hits, f"patch target {patch['target']} matches nothing"
        for i in hits:
            objects[i] = json_patch(objects[i], ops)
    if spec.get("namespace"):
        for obj in objects:
            obj["metadata"]["namespace"] = spec["namespace"]
    for entry in spec.get("labels") or []:
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise NotImplementedError("labels into selectors or templates")
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in spec.get("images") or []:
        for obj in objects:
            for container in _containers(obj):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = (f"{image.get('newName', name)}:"
                                          f"{image.get('newTag', tag)}")
    return objects


def _containers(obj: dict) -> list[dict]:
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    return pod.get("containers", []) + pod.get("initContainers", [])


def build(folder: Path, extra_components: tuple[Path, ...] = ()) -> list[dict]:
    """`kustomize build folder` for the features above (with more components appended)."""
    spec = kustomization(folder)
    known = {"apiVersion", "kind", "resources", "components", "namespace", "labels", "images",
             "patches"}
    assert set(spec) <= known, f"{folder}: kustomize fields {set(spec) - known} not modelled"
    objects: list[dict] = []
    for entry in spec.get("resources") or []:
        path = (folder / entry).resolve()
        objects += build(path) if path.is_dir() else load_all(path)
    objects = copy.deepcopy(objects)
    for entry in [*(spec.get("components") or []), *extra_components]:
        component = (folder / entry).resolve()
        cspec = kustomization(component)
        assert cspec["kind"] == "Component", component
        for res in cspec.get("resources") or []:
            objects += load_all(component / res)
        objects = _apply({k: v for k, v in cspec.items() if k != "resources"}, objects)
    return _apply({k: v for k, v in spec.items() if k not in ("resources", "components")},
                  objects)
