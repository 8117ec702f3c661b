"""docker-compose.yml without Docker: the Compose specification schema, then what the schema
cannot check — mounted paths, pinned images, loopback ports, and that every address the
configs use is a compose service."""

import json
import re

import jsonschema
import pytest
import yaml

from conftest import ROOT

COMPOSE_FILES = ["docker-compose.yml", "docker-compose.gpu.yml",
                 "docker-compose.containers.yml"]
SCHEMA = ROOT / "schemas" / "compose-spec.json"  # vendored: schemas/README.md


def load(name):
    return yaml.safe_load((ROOT / name).read_text())


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA.read_text())


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_files_follow_the_compose_specification(schema, name):
    jsonschema.Draft7Validator(schema).validate(load(name))  # the schema is draft 7


def services():
    return load("docker-compose.yml")["services"]


def test_every_bind_mounted_path_exists_in_the_repo():
    for name in COMPOSE_FILES:
        for service, spec in (load(name).get("services") or {}).items():
            for volume in spec.get("volumes", []):
                source = volume.split(":")[0]
                if source.startswith("./"):
                    assert (ROOT / source).exists(), f"{name} {service}: {source} missing"


def test_every_image_is_pinned_to_an_exact_version():
    for service, spec in services().items():
        image = spec["image"]
        repo, _, tag = image.rpartition(":")
        assert repo, f"{service}: {image}"
        assert tag not in ("", "latest"), f"{service}: {image}"
        if "/" in repo:  # third-party images: an exact release
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{service}: {image}"


def test_every_published_port_is_bound_to_loopback():
    for service, spec in services().items():
        for port in spec.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{service}: {port}"


def test_prometheus_is_3x_as_the_rules_require_both_2_42_and_3():
    tag = services()["prometheus"]["image"].rpartition(":")[2]
    assert tag.startswith("v3.")


def test_depends_on_names_services_and_waits_for_health_where_there_is_a_healthcheck():
    svc = services()
    for service, spec in svc.items():
        for dep, cond in (spec.get("depends_on") or {}).items():
            assert dep in svc, f"{service} depends on unknown {dep}"
            if "healthcheck" in svc[dep]:
                assert cond["condition"] == "service_healthy", f"{service} -> {dep}"


def test_data_lives_in_named_volumes_so_down_and_up_loses_nothing():
    compose = load("docker-compose.yml")
    for service, path in (("prometheus", "/prometheus"), ("alertmanager", "/alertmanager"),
                          ("grafana", "/var/lib/grafana")):
        mounts = [v for v in services()[service]["volumes"] if v.endswith(":" + path)]
        assert mounts, f"{service}: no volume for {path}"
        assert mounts[0].split(":")[0] in compose["volumes"]


def test_demo_services_are_behind_the_demo_profile_and_the_gpu_and_socket_are_opt_in():
    svc = services()
    assert svc["sglang-sim"]["profiles"] == ["demo"]
    assert "deploy" not in svc["exporter"]
    assert not any("docker.sock" in v for s in svc.values() for v in s.get("volumes", []))
    socket = load("docker-compose.containers.yml")["services"]["exporter"]["volumes"]
    assert socket == ["/var/run/docker.sock:/var/run/docker.sock:ro"]
    gpu = load("docker-compose.gpu.yml")["services"]["exporter"]["deploy"]
    assert gpu["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_grafana_refuses_the_default_password_and_anonymous_access():
    grafana = services()["grafana"]
    assert "?" in grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]  # required
    assert "!= admin" in " ".join(grafana["entrypoint"])
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def addresses(text):
    return set(re.findall(r"(?:https?://)?([a-z][a-z0-9-]*):(\d{2,5})", text))


def test_every_address_in_the_configs_is_a_compose_service_on_its_port():
    svc = services()
    exposed = {name: {str(p).split(":")[-1] for p in s.get("expose", []) + s.get("ports", [])}
               for name, s in svc.items()}
    exposed["prometheus"].add("9090")
    configs = [ROOT / "prometheus/prometheus.yml", ROOT / "alertmanager/alertmanager.yml",
               *sorted((ROOT / "grafana/provisioning").rglob("*.yml"))]
    found = set()
    for path in configs:
        for host, port in addresses(path.read_text()):
            if host in ("localhost", "host", "https", "http"):
                continue
            found.add(host)
            assert host in svc, f"{path.name}: {host} is not a compose service"
            assert port in exposed[host], f"{path.name}: {host}:{port} not exposed"
    assert {"exporter", "alertmanager", "alert-sink"} <= found


def test_env_example_documents_every_variable_compose_reads():
    text = "\n".join((ROOT / n).read_text() for n in COMPOSE_FILES)
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    documented = set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert used <= documented, used - documented


def test_every_compose_file_is_referenced_in_the_readme_or_docs():
    docs = (ROOT / "README.md").read_text() + (ROOT / "docs/containers.md").read_text()
    for name in COMPOSE_FILES[1:]:
        assert name in docs or name in (ROOT / "docker-compose.yml").read_text()
