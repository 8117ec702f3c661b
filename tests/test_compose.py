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


def split_image(image):
    """(repository, tag, digest) of `repo:tag[@sha256:hex]`."""
    name, _, digest = image.partition("@")
    repo, _, tag = name.rpartition(":")
    return repo, tag, digest


def test_every_image_is_pinned_to_an_exact_version():
    for service, spec in services().items():
        image = spec["image"]
        repo, tag, _ = split_image(image)
        assert repo, f"{service}: {image}"
        assert tag not in ("", "latest"), f"{service}: {image}"
        if "/" in repo:  # third-party images: an exact release
            assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{service}: {image}"


def test_third_party_images_are_pinned_by_digest_and_the_local_base_is_explained():
    """A tag can be re-pushed; a digest cannot. The digests come from public material
    (docs/security.md); the exporter's base image keeps its tag, and docs/security.md says so."""
    for service, spec in services().items():
        repo, _, digest = split_image(spec["image"])
        if "/" in repo:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{service}: {spec['image']}"
    security = (ROOT / "docs/security.md").read_text()
    for line in (ROOT / "exporter/Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            base = line.split()[1]
            if "@sha256:" not in base:
                assert base in security, f"docs/security.md must say why {base} has no digest"


def test_every_published_port_is_bound_to_loopback():
    for service, spec in services().items():
        for port in spec.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{service}: {port}"


def test_prometheus_is_3x_as_the_rules_require_both_2_42_and_3():
    tag = split_image(services()["prometheus"]["image"])[1]
    assert tag.startswith("v3.")


# -- hardening (docs/security.md, "Configuration hardening") ---------------------------------
# Services whose root filesystem stays writable, with the reason: none today.
WRITABLE_ROOT: dict[str, str] = {}


def size_bytes(text):
    number, unit = re.fullmatch(r"(\d+)([kmg]?)b?", str(text).lower()).groups()
    return int(number) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


@pytest.mark.parametrize("service", sorted(services()))
def test_every_service_rotates_its_logs(service):
    logging = services()[service].get("logging") or {}
    assert logging.get("driver") == "json-file", service
    options = logging.get("options") or {}
    assert 0 < size_bytes(options.get("max-size", "0")) <= 100 << 20, (service, options)
    assert 1 <= int(options.get("max-file", 0)) <= 10, (service, options)


@pytest.mark.parametrize("service", sorted(services()))
def test_every_service_has_memory_and_process_limits(service):
    spec = services()[service]
    assert "mem_limit" in spec, f"{service}: no mem_limit"
    assert 64 << 20 <= size_bytes(spec["mem_limit"]) <= 8 << 30, (service, spec["mem_limit"])
    assert isinstance(spec.get("pids_limit"), int), f"{service}: no pids_limit"
    assert 32 <= spec["pids_limit"] <= 4096, (service, spec["pids_limit"])


@pytest.mark.parametrize("service", sorted(services()))
def test_every_service_drops_all_capabilities_and_cannot_gain_privileges(service):
    spec = services()[service]
    assert spec.get("cap_drop") == ["ALL"], service
    assert not spec.get("cap_add"), f"{service}: cap_add {spec.get('cap_add')}"
    assert "no-new-privileges:true" in (spec.get("security_opt") or []), service
    assert not spec.get("privileged"), service
    for name in COMPOSE_FILES[1:]:  # the overrides add no capability or privilege either
        override = (load(name).get("services") or {}).get(service) or {}
        assert not override.get("cap_add"), (name, service)
        assert not override.get("privileged"), (name, service)


@pytest.mark.parametrize("service", sorted(services()))
def test_every_root_filesystem_is_read_only_with_tmpfs_where_it_writes(service):
    spec = services()[service]
    if service in WRITABLE_ROOT:
        assert not spec.get("read_only")
        return
    assert spec.get("read_only") is True, f"{service}: read_only: true (or say why not)"
    tmpfs = spec.get("tmpfs") or []
    for entry in [tmpfs] if isinstance(tmpfs, str) else tmpfs:
        assert re.fullmatch(r"/[\w/.-]+(:size=\d+[kmg])", entry), (service, entry)
    if service in ("exporter", "alert-sink", "sglang-sim", "sglang-sim-pd",
                   "grafana"):  # Python, Grafana: /tmp
        assert any(str(e).startswith("/tmp:") for e in tmpfs), f"{service}: no tmpfs /tmp"


def test_data_volumes_are_the_only_writable_paths_of_the_stateful_services():
    svc = services()
    for service, path in (("prometheus", "/prometheus"), ("alertmanager", "/alertmanager"),
                          ("grafana", "/var/lib/grafana")):
        writable = [v for v in svc[service]["volumes"] if not v.endswith(":ro")]
        assert [v.split(":")[1] for v in writable] == [path], (service, writable)
    assert svc["grafana"]["environment"]["GF_LOG_MODE"] == "console"  # no /var/log/grafana


def test_prometheus_has_no_lifecycle_or_admin_api():
    command = services()["prometheus"]["command"]
    assert not [c for c in command if c.startswith(("--web.enable-lifecycle",
                                                      "--web.enable-admin-api"))], command


def test_alertmanager_runs_alone_without_a_cluster_listener():
    command = services()["alertmanager"]["command"]
    assert "--cluster.listen-address=" in command
    assert "9094" not in " ".join(str(p) for p in services()["alertmanager"].get("ports", []))


def test_the_image_installs_python_dependencies_from_the_constraints_file():
    dockerfile = (ROOT / "exporter/Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs, "exporter/Dockerfile installs nothing with pip"
    for line in installs:
        assert "-c constraints.txt" in line, line
    assert "COPY pyproject.toml README.md constraints.txt" in dockerfile
    assert re.search(r"^USER \d+", dockerfile, re.M), "the image runs as a numeric non-root user"


def test_published_ports_are_loopback_on_every_service_of_every_file():
    for name in COMPOSE_FILES:
        for service, spec in (load(name).get("services") or {}).items():
            for port in spec.get("ports", []):
                assert str(port).startswith("127.0.0.1:"), f"{name} {service}: {port}"


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
    assert svc["sglang-sim-pd"]["profiles"] == ["demo-pd"]  # the unified demo stays as it is
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


def exposed_ports() -> dict[str, set[str]]:
    """Each name on the compose network (a service, or a service's network alias) -> the ports
    its service exposes or publishes (the container side)."""
    svc = services()
    exposed = {name: {str(p).split(":")[-1] for p in s.get("expose", []) + s.get("ports", [])}
               for name, s in svc.items()}
    exposed["prometheus"].add("9090")
    for name, s in svc.items():
        networks = s.get("networks") or {}
        for network in networks.values() if isinstance(networks, dict) else []:
            for alias in (network or {}).get("aliases", []):
                assert alias not in svc, f"{name}: alias {alias} is a service's name"
                exposed.setdefault(alias, set()).update(exposed[name])
    return exposed


def test_every_address_in_the_configs_is_a_compose_service_on_its_port():
    exposed = exposed_ports()
    configs = [ROOT / "prometheus/prometheus.yml", ROOT / "alertmanager/alertmanager.yml",
               *sorted((ROOT / "grafana/provisioning").rglob("*.yml"))]
    found = set()
    for path in configs:
        for host, port in addresses(path.read_text()):
            if host in ("localhost", "host", "https", "http"):
                continue
            found.add(host)
            assert host in exposed, f"{path.name}: {host} is not a compose service or alias"
            assert port in exposed[host], f"{path.name}: {host}:{port} not exposed"
    assert {"exporter", "alertmanager", "alert-sink"} <= found


def dns_targets() -> dict[str, set[tuple[str, str]]]:
    """prometheus.yml's jobs that discover by DNS -> their (name, port) pairs."""
    prom = load("prometheus/prometheus.yml")
    return {job["job_name"]: {(name, str(sd["port"])) for sd in job["dns_sd_configs"]
                              for name in sd["names"]}
            for job in prom["scrape_configs"] if "dns_sd_configs" in job}


def test_every_name_prometheus_resolves_is_on_the_compose_network_with_its_port():
    """The gateway's job resolves a name; in compose that name exists only while the service
    that carries it runs (the PD demo), so elsewhere the job has no target at all."""
    exposed = exposed_ports()
    jobs = dns_targets()
    assert set(jobs) == {"smg"}, jobs
    for job, pairs in jobs.items():
        for name, port in pairs:
            assert name in exposed, f"{job}: {name} is not a compose service or alias"
            assert port in exposed[name], f"{job}: {name}:{port} not exposed"
            owners = [s for s, spec in services().items() if s == name or name in (
                ((spec.get("networks") or {}).get("default") or {}).get("aliases", []))]
            assert owners, name
            for owner in owners:  # only an opt-in profile brings the name up
                assert services()[owner].get("profiles"), (job, owner)


# -- the PD demo (profile demo-pd) -------------------------------------------------------------
PD_SERVICE = "sglang-sim-pd"
PD_ENGINES = 4  # pd-healthy: 2 prefill servers on --port and the next, 2 decode servers above


def test_the_pd_demos_engine_count_is_its_scenarios():
    command = services()[PD_SERVICE]["command"]
    path = ROOT / "simulator" / "scenarios" / f"{flag(command, '--scenario')}.yaml"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this checkout")
    sc = yaml.safe_load(path.read_text())
    assert sc["prefill"]["count"] + sc["decode"]["count"] == PD_ENGINES


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def pd_demo_command() -> str:
    """The PD demo's command as docs/simulator.md gives it (one line, `docker compose` last)."""
    text = (ROOT / "docs/simulator.md").read_text()
    [line] = [ln for ln in text.splitlines() if "--profile demo-pd up" in ln]
    return line


def test_the_pd_demo_serves_its_engines_and_the_gateway_on_exposed_ports():
    spec = services()[PD_SERVICE]
    assert spec["entrypoint"] == ["sglang-sim"]
    command = spec["command"]
    assert command[0] == "pd"
    # The simulated gateway names its workers http://HOST:PORT: the engines' instance (the
    # exporter's URLs below) only when HOST is the service's name on the compose network.
    assert flag(command, "--host") == PD_SERVICE
    assert "--loop" in command
    first, gateway = int(flag(command, "--port")), flag(command, "--gateway-port")
    engines = {str(first + i) for i in range(PD_ENGINES)}
    assert {str(p) for p in spec["expose"]} == engines | {gateway}
    assert not spec.get("ports"), "the compose network only, as the unified demo"
    assert f"http://{PD_SERVICE}:{first}/health" in " ".join(spec["healthcheck"]["test"])
    # Prometheus reaches the simulated gateway by the name and port its smg job resolves.
    [(name, port)] = dns_targets()["smg"]
    assert port == gateway
    assert name in spec["networks"]["default"]["aliases"]


def test_the_pd_demos_exporter_watches_exactly_the_simulators_engines():
    """The exporter reads its servers from SGLANG_URL (default: the unified demo); the PD demo's
    documented command names the four PD servers there, and turns the unified demo's GPU feed
    off (the PD simulator serves none)."""
    exporter = services()["exporter"]["environment"]
    assert exporter["SGLANG_OBS_SGLANG_URL"].startswith("${SGLANG_URL:-")
    assert exporter["SGLANG_OBS_COLLECTOR_NVML_SIMULATOR_FEED"].startswith("${GPU_FEED-")
    line = pd_demo_command()
    words = line.split()
    env = dict(w.split("=", 1) for w in words[:words.index("docker")])
    assert env["GPU_FEED"] == ""
    assert "GRAFANA_ADMIN_PASSWORD" in env
    urls = env["SGLANG_URL"].split(",")
    command = services()[PD_SERVICE]["command"]
    first, host = int(flag(command, "--port")), flag(command, "--host")
    assert urls == [f"http://{host}:{first + i}" for i in range(PD_ENGINES)]
    assert words[words.index("docker"):] == ["docker", "compose", "--profile", "demo-pd", "up",
                                             "-d"]


def test_env_example_documents_every_variable_compose_reads():
    """The single-host files and the fleet's (docker-compose.fleet.yml, .central.yml)."""
    names = [*COMPOSE_FILES, "docker-compose.fleet.yml", "docker-compose.central.yml"]
    text = "\n".join((ROOT / n).read_text() for n in names)
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    documented = set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert used <= documented, used - documented


def test_every_compose_file_is_referenced_in_the_readme_or_docs():
    docs = (ROOT / "README.md").read_text() + (ROOT / "docs/containers.md").read_text()
    for name in COMPOSE_FILES[1:]:
        assert name in docs or name in (ROOT / "docker-compose.yml").read_text()
