"""The fleet's configuration without running a fleet (docs/fleet.md): the shipper configurations
are generated from prometheus.yml and never drift from it, every tool here accepts what it is
given (vmagent, VictoriaMetrics, vmalert with -dryRun; promtool), the vmalert rule variant is the
shipped rules minus what vmalert 1.79 rejects, and the compose files carry the same flags."""

from __future__ import annotations

import json
import re
import subprocess

import jsonschema
import pytest
import yaml

from sglang_obs.core.settings import default as _settings
from sglang_obs.generate import detection, fleet_timing
from sglang_obs.generate.__main__ import main as generate_main
from sglang_obs.render import rules, shipper
from sglang_obs.tools import fleet

from conftest import ROOT, require_binary

S = _settings()  # the checkout's configuration, read once

VM = "victoria-metrics"
PROM = yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())


def _jobs(config: dict) -> dict[str, dict]:
    return {j["job_name"]: j for j in config["scrape_configs"]}


def test_committed_shipper_files_are_generated_from_prometheus_yml():
    for path, text in shipper.files(dict(S.prometheus)).items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} drifted from prometheus.yml: run make "
            "generate")
    assert generate_main(["--check", "shipper"]) == 0


@pytest.mark.parametrize("flavour", ["vmagent", "prometheus-agent"])
def test_shipper_jobs_are_prometheus_yml_jobs_with_only_the_identity_added(flavour):
    config = shipper.shipper_config(PROM, "c1", "h1", "127.0.0.1:8429", flavour)
    source, shipped = _jobs(PROM), _jobs(config)
    assert set(shipped) == set(shipper.HOST_JOBS) | {shipper.SHIPPER_JOB}
    for name in shipper.HOST_JOBS:
        job, original = shipped[name], source[name]
        # exactly prometheus.yml's relabelling, after the two identity rules
        assert job["relabel_configs"][:2] == shipper.identity_relabel("c1", "h1")
        assert job["relabel_configs"][2:] == original.get("relabel_configs", [])
        assert job.get("metric_relabel_configs") == original.get("metric_relabel_configs")
        dropped = set(shipper.VMAGENT_UNSUPPORTED) if flavour == "vmagent" else set()
        for key, value in original.items():
            if key in ("relabel_configs", "http_sd_configs") or key in dropped:
                continue
            assert job[key] == value, (name, key)
        assert set(job) - set(original) <= {"relabel_configs"}
    assert config["global"]["scrape_interval"] == PROM["global"]["scrape_interval"]


def test_the_hosts_jobs_are_the_selectors_jobs():
    """A host ships SGLang, its exporter and a PD gateway, by the job names the rules select on
    (thresholds.yml `selectors:`); the gateway's job discovers by DNS, so a host without a
    gateway ships no target for it (and no `up` series)."""
    selectors = S.selectors
    named = (selectors["sglang_job"], selectors["exporter_job"], selectors["gateway_job"])
    assert named == shipper.HOST_JOBS
    gateway = _jobs(PROM)[selectors["gateway_job"]]
    assert "static_configs" not in gateway
    assert [sd["type"] for sd in gateway["dns_sd_configs"]] == ["A"]


def test_the_flags_carry_the_limits_vmagent_cannot_parse_with_the_same_values():
    exporter, sglang = _jobs(PROM)["sglang-obs"], _jobs(PROM)["sglang"]
    flags = shipper.vmagent_flags(PROM)
    assert "-promscrape.maxScrapeSize=16777216" in flags  # sglang's 16MiB, the larger one
    assert f"-promscrape.httpSDCheckInterval={sglang['http_sd_configs'][0]['refresh_interval']}" \
        in flags
    store = shipper.store_flags(PROM)
    assert f"-maxLabelsPerTimeseries={max(exporter['label_limit'], sglang['label_limit']) + 2}" \
        in store
    assert "-maxLabelValueLen=2048" in store
    command = shipper.vmagent_command("/c.yml", "http://s/api/v1/write", "/buf", ":8429", PROM)
    assert f"-remoteWrite.maxDiskUsagePerURL={shipper.BUFFER_BYTES}" in command
    assert "-remoteWrite.tmpDataPath=/buf" in command


def test_the_host_label_set_by_the_shipper_survives_the_exporter_jobs_relabelling():
    """prometheus.yml defaults host to the exporter's address only for a target without one."""
    for job in ("sglang", "sglang-obs"):
        rule = next(r for r in _jobs(PROM)[job].get("relabel_configs", []) +
                    _jobs(PROM)[job].get("metric_relabel_configs", [])
                    if r.get("target_label") == "host")
        assert rule["source_labels"][0] == "host", rule
        assert rule["regex"].startswith(";"), rule


def test_vmagent_accepts_the_generated_config(tmp_path):
    require_binary("vmagent", VM)
    result = subprocess.run(
        ["vmagent", f"-promscrape.config={S.root / shipper.VMAGENT_YML}", "-dryRun"],
        capture_output=True, text=True, env={shipper.CLUSTER_ENV: "c", shipper.HOST_ENV: "h"},
        cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_vmagent_rejects_what_it_cannot_parse_so_the_generator_must_strip_it(tmp_path):
    """Why VMAGENT_UNSUPPORTED exists: prometheus.yml's jobs verbatim fail vmagent 1.79."""
    require_binary("vmagent", VM)
    path = tmp_path / "verbatim.yml"
    path.write_text(yaml.safe_dump(shipper.shipper_config(PROM, "c", "h", "x:1",
                                                          "prometheus-agent")))
    result = subprocess.run(["vmagent", f"-promscrape.config={path}", "-dryRun"],
                            capture_output=True, text=True, cwd=tmp_path)
    if result.returncode == 0:
        pytest.skip("this vmagent parses every Prometheus field: the stripping is not needed")
    assert "label_limit" in result.stdout + result.stderr


def test_prometheus_agent_config_is_valid_for_promtool():
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "config", str(S.root / shipper.AGENT_YML)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((S.root / shipper.AGENT_YML).read_text())
    assert "rule_files" not in config  # agent mode has neither
    assert "alerting" not in config
    assert config["remote_write"][0]["url"] == shipper.CENTRAL_WRITE_URL


def test_shipper_config_command_writes_a_valid_config_for_one_host(tmp_path):
    promtool = require_binary("promtool")
    text = fleet.shipper_config_text("prometheus-agent", "eu-1", "gpu-07",
                                     "http://store:8428/api/v1/write", "10.0.0.7:9840")
    path = tmp_path / "agent.yml"
    path.write_text(text)
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = _jobs(yaml.safe_load(text))
    assert jobs["sglang-obs"]["static_configs"][0]["targets"] == ["10.0.0.7:9840"]
    assert jobs["sglang"]["http_sd_configs"][0]["url"] == "http://10.0.0.7:9840/sd/sglang"
    assert jobs["sglang"]["relabel_configs"][:2] == shipper.identity_relabel("eu-1", "gpu-07")


def test_victoria_metrics_accepts_the_central_scrape_config(tmp_path):
    require_binary(VM, VM)
    result = subprocess.run([VM, f"-promscrape.config={S.root / shipper.CENTRAL_SCRAPE_YML}",
                             "-promscrape.config.dryRun"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the vmalert variant of the rules ------------------------------------------------------------
def test_vmalert_variant_is_current_and_is_the_rules_without_the_dropped_fields():
    t = rules.inputs()
    files = rules.vmalert_rule_files(t)
    for path, text in files.items():
        assert path.read_text() == text, f"{path} stale: python -m sglang_obs.generate rules"
    assert sorted(p.name for p in S.vmalert_rules_dir.glob("*.yml")) == sorted(
        p.name for p in files), "a rule file vmalert would load that the generator no longer makes"
    # Prometheus' rules, file by file and group by group, in the order it evaluates them...
    expected = []
    for name, _ in rules.RULE_FILES:
        for group in yaml.safe_load((S.rules_dir / name).read_text())["groups"]:
            for rule in group["rules"]:
                for field in rules.VMALERT_DROPPED_FIELDS:
                    rule.pop(field, None)
                expected.append(rule)
    # ...are vmalert's one group, which bypasses the store's latency offset.
    (group,) = yaml.safe_load(next(iter(files.values())))["groups"]
    assert group["rules"] == expected
    assert group["params"] == {"nocache": ["1"]}


# -- onset to page on the fleet path (docs/fleet.md) ---------------------------------------------
def test_fleet_onset_to_page_block_is_current():
    assert generate_main(["--check", "fleet-timing"]) == 0, "run make generate"


def test_the_fleet_budget_counts_one_evaluation_per_recorded_link():
    t = rules.inputs()
    records = {r.name: r.expr for g in rules.recording_groups(t) for r in g.rules}
    assert fleet_timing.depth("sglang:num_running_reqs", records) == 0
    assert fleet_timing.depth("instance:sglang_prefill_backlog_tokens:max", records) == 1
    # the alert reads the state record, which reads the backlog record, which reads the exporter
    assert fleet_timing.depth("instance:sglang_state:code", records) == 3  # the 1h baseline too
    backlog = fleet_timing.budgets(S)["SGLangPrefillBacklog"]
    one_host = detection.budgets(S)["SGLangPrefillBacklog"]
    assert backlog.links == 2
    # one more evaluation than on one host (whose recording group costs one), plus the shipping
    assert backlog.notify_worst == one_host.notify_worst + one_host.evaluation + backlog.transport


def test_the_recorded_fleet_page_came_inside_the_budget():
    recorded = fleet_timing.load_e2e(S.docs_dir / fleet_timing.FLEET_E2E)
    assert recorded, "docs/fleet-e2e.json missing: SGLANG_OBS_RECORD_FLEET=1 pytest test_fleet.py"
    m = recorded["prefill_backlog_page"]
    assert m["budget_s"] == fleet_timing.budgets(S)["SGLangPrefillBacklog"].notify_worst, (
        "the budget changed since the recorded run: rerun it")
    assert 0 < m["onset_to_page_s"] <= m["budget_s"]
    assert m["margin_s"] == m["budget_s"] - m["onset_to_page_s"]
    chain = m["chain"]
    assert (0 <= chain["recorded_signal"] <= chain["recorded_state"] <= chain["pending"]
            < chain["firing"] <= m["onset_to_page_s"]), chain


def test_vmalert_accepts_the_variant_and_rejects_what_it_drops(tmp_path):
    require_binary("vmalert", VM)
    ok = subprocess.run(["vmalert", "-dryRun", f"-rule={S.vmalert_rules_dir}/*.yml"],
                        capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    shipped = subprocess.run(["vmalert", "-dryRun", f"-rule={S.rules_dir}/*.yml"],
                             capture_output=True, text=True, cwd=tmp_path)
    if shipped.returncode == 0:
        pytest.skip("this vmalert (>= 1.92) reads keep_firing_for: the variant is not needed")
    assert "keep_firing_for" in shipped.stdout + shipped.stderr


# -- compose ---------------------------------------------------------------------------------------
FLEET_COMPOSE = ("docker-compose.fleet.yml", "docker-compose.central.yml")


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


@pytest.mark.parametrize("name", FLEET_COMPOSE)
def test_fleet_compose_files_follow_the_compose_specification(name):
    schema = json.loads((ROOT / "schemas/compose-spec.json").read_text())
    jsonschema.Draft7Validator(schema).validate(_load(name))


def test_fleet_override_runs_the_generated_vmagent_command_and_no_local_store():
    services = _load("docker-compose.fleet.yml")["services"]
    command = services["vmagent"]["command"]
    expected = shipper.vmagent_command("/etc/vmagent/vmagent.yml", "URL", "/vmagent-buffer",
                                       ":8429", PROM)
    assert [re.sub(r"\$\{CENTRAL_WRITE_URL[^}]*\}", "URL", c) for c in command] == expected
    for local in ("prometheus", "alertmanager", "alert-sink", "grafana"):
        assert services[local] == {"profiles": ["local-store"]}, local
    env = services["vmagent"]["environment"]
    assert env[shipper.CLUSTER_ENV].startswith("${CLUSTER:?")  # refuses to start without it
    assert env[shipper.HOST_ENV].startswith("${HOST_NAME:?")
    assert "./prometheus/fleet:/etc/vmagent:ro" in services["vmagent"]["volumes"]


def test_central_compose_runs_the_rules_variant_with_the_store_flags_and_grafana_on_the_store():
    services = _load("docker-compose.central.yml")["services"]
    store = services["victoriametrics"]["command"]
    for flag in shipper.store_flags(PROM):
        assert flag in store
    assert "-promscrape.config=/etc/prometheus/fleet/central-scrape.yml" in store
    vmalert = services["vmalert"]["command"]
    assert "-rule=/etc/prometheus/rules-vmalert/*.yml" in vmalert
    assert "-datasource.queryStep=15s" in vmalert  # as fleet.vmalert_args: a silent host ends
    native = fleet.vmalert_args("http://vm", "http://am", ":8880", S)
    assert {a.split("=")[0] for a in native} == {a.split("=")[0] for a in vmalert}
    assert any(c.startswith("-notifier.url=http://alertmanager:9093")
               for c in services["vmalert"]["command"])
    datasources = yaml.safe_load((ROOT / "grafana/provisioning-central/datasources/"
                                  "datasources.yml").read_text())["datasources"]
    assert datasources[0]["url"] == "http://victoriametrics:8428"
    assert datasources[0]["uid"] == "prometheus"  # the same uid as the single-host datasource
    for address in shipper.CENTRAL_ADDRESSES.values():
        host, port = address.split(":")
        assert host in services, address
        exposed = {str(p).split(":")[-1] for p in services[host].get("expose", []) +
                   services[host].get("ports", [])}
        assert port in exposed, address


@pytest.mark.parametrize("name", FLEET_COMPOSE)
def test_fleet_services_are_hardened_like_the_others(name):
    services = _load(name)["services"]
    for service, spec in services.items():
        if spec.get("profiles") == ["local-store"] and len(spec) == 1:
            continue
        assert spec.get("cap_drop") == ["ALL"], service
        assert "no-new-privileges:true" in spec.get("security_opt", []), service
        assert spec.get("read_only") is True, service
        assert "mem_limit" in spec, service
        assert isinstance(spec.get("pids_limit"), int), service
        assert spec.get("logging", {}).get("driver") == "json-file", service
        for port in spec.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (service, port)
        repo, _, tag = spec["image"].partition("@")[0].rpartition(":")
        assert tag, (service, spec["image"])
        assert tag != "latest", (service, spec["image"])


def test_prometheus_as_the_central_store_loads_the_shipped_rules():
    """The remote-write-receiver alternative (docs/fleet.md): promtool checks the config and the
    four rule files it names (prometheus/rules/ as shipped, keep_firing_for included)."""
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "config",
                             str(S.root / shipper.PROMETHEUS_CENTRAL_YML)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(PROM['rule_files'])} rule files found" in result.stdout
    jobs = _jobs(yaml.safe_load((S.root / shipper.PROMETHEUS_CENTRAL_YML).read_text()))
    assert not set(jobs) & set(shipper.HOST_JOBS), "the hosts' jobs are the shippers'"


def test_the_documented_configs_for_other_stores_parse():
    """docs/fleet.md's Mimir and Thanos snippets (neither binary is installed here, so they are
    only parsed) and the Prometheus agent command it shows."""
    text = (ROOT / "docs/fleet.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        yaml.safe_load(block)
    assert "--enable-feature=agent" in text
    assert str(shipper.AGENT_WAL_MAX_TIME) in text


def test_the_cli_prints_a_hosts_shipper_config_and_flags(capsys):
    from sglang_obs import cli

    assert cli.main(["fleet", "shipper-config", "--cluster", "eu-1", "--host", "gpu-07"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert _jobs(config)["sglang"]["relabel_configs"][:2] == shipper.identity_relabel(
        "eu-1", "gpu-07")
    assert cli.main(["fleet", "shipper-flags", "--write-url", "http://s/api/v1/write"]) == 0
    assert f"-remoteWrite.maxDiskUsagePerURL={shipper.BUFFER_BYTES}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["stack", "up", "--native", "--fleet", "0"])


def test_a_simulated_fleet_spreads_hosts_over_clusters_and_demos_on_the_first(tmp_path):
    f = fleet.Fleet.simulated(tmp_path, 5, clusters=2, demo=True)
    assert [h.cluster for h in f.hosts] == ["cluster-a", "cluster-b"] * 2 + ["cluster-a"]
    assert [h.scenario for h in f.hosts] == [fleet.INCIDENT] + [fleet.QUIET] * 4
    assert len({h.name for h in f.hosts}) == 5
    ports = fleet.free_ports(40)
    assert len(set(ports)) == 40
