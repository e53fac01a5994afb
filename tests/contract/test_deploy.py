"""The Kubernetes deployment (deploy/kustomize) as ``kubectl apply -k`` would send it.

Every overlay renders with ``kubectl kustomize`` (the example one after the README's own steps:
``vigil certs`` into it, a Slack token file); every object validates against the Kubernetes 1.32
schema (``kubernetes-validate``, strict: unknown fields are errors); the controller's RBAC grants
exactly the verbs its code calls, read from the code; the configuration files the pods mount load
with Vigil's own loaders; the alert rules pass ``promtool check rules`` and their unit tests; and
every query of the Grafana dashboard and the rules names a metric Vigil exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import load_agent_config
from agent.metrics import AgentMetrics
from controller.config import load_controller_config
from controller.metrics import ControllerMetrics
from controller.relay.metrics import RelayMetrics

ROOT = Path(__file__).parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
KUBERNETES_VERSION = "1.32.0"
# Custom resources: no schema in kubernetes-validate. promtool checks the PrometheusRule's rules;
# the others are checked by their operators when applied.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"}

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed: its kustomize renders the manifests"
)

Objects = list[dict[str, Any]]


def render(directory: Path) -> Objects:
    done = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.fixture(scope="module")
def overlays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Objects]:
    """Each overlay rendered from a copy of deploy/kustomize, prepared as the README says."""
    copy = tmp_path_factory.mktemp("deploy") / "kustomize"
    shutil.copytree(KUSTOMIZE, copy)
    example = copy / "overlays" / "example"
    command = [sys.executable, "-m", "vigil", "certs", str(example / "certs"), "--agents", "--admin", "alice",
               "--controller-name", "vigil-controller.vigil.svc"]  # fmt: skip
    assert subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    (example / "slack-token").write_text("xoxb-test")
    drain = copy / "overlays" / "with-drain"  # the base and the drain component alone
    drain.mkdir()
    (drain / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../../base"], "components": ["../../components/drain"]})
    )
    postgres = copy / "overlays" / "with-postgres"  # the base and the PostgreSQL component alone
    postgres.mkdir()
    (postgres / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../../base"], "components": ["../../components/postgres"]})
    )
    remediation = copy / "overlays" / "with-remediation"  # the base and the remediation component alone
    remediation.mkdir()
    (remediation / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../../base"], "components": ["../../components/remediation"]})
    )
    relay = copy / "overlays" / "with-relay"  # the base and the relay component alone
    relay.mkdir()
    (relay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../../base"], "components": ["../../components/relay"]})
    )
    names = ("example", "cert-manager", "with-drain", "with-postgres", "with-remediation", "with-relay")
    return {name: render(copy / "overlays" / name) for name in names}


def find(objects: Objects, kind: str, name: str = "") -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (not name or o["metadata"]["name"].startswith(name))]


# The objects ---------------------------------------------------------------------------------


def test_every_object_validates_against_the_kubernetes_schema(overlays: dict[str, Objects]) -> None:
    import kubernetes_validate

    for name, objects in overlays.items():
        kinds = {o["kind"] for o in objects}
        assert {"Deployment", "DaemonSet", "ClusterRole", "NetworkPolicy"} <= kinds, name
        for obj in objects:
            if obj["kind"] in CUSTOM_KINDS:
                assert obj["apiVersion"].split("/")[0] in ("monitoring.coreos.com", "cert-manager.io")
                continue
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)  # raises, naming the field
            assert obj["metadata"].get("namespace", "vigil") == "vigil", (name, obj["metadata"])


@pytest.mark.parametrize("overlay", ["example", "cert-manager"])
def test_the_monitoring_objects_carry_the_label_prometheus_operator_selects(
    overlays: dict[str, Objects], overlay: str
) -> None:
    """kube-prometheus-stack selects ServiceMonitors and PrometheusRules by ``release``: each
    overlay sets it (a setting in its kustomization.yaml)."""
    monitoring = find(overlays[overlay], "ServiceMonitor") + find(overlays[overlay], "PrometheusRule")
    assert len(monitoring) == 4  # the controller's, the agents', the relays' ServiceMonitors, the rules
    assert all(o["metadata"].get("labels", {}).get("release") == "kube-prometheus-stack" for o in monitoring)


def disruptions_allowed(budget: dict[str, Any], pods: int, ready: int) -> int:
    """The Eviction API's arithmetic (policy/v1): healthy (Ready) pods less those the budget wants."""
    spec = budget["spec"]
    wanted = spec["minAvailable"] if "minAvailable" in spec else pods - spec["maxUnavailable"]
    return max(0, ready - wanted)


@pytest.mark.parametrize("overlay", ["example", "cert-manager", "with-postgres"])
def test_no_budget_keeps_the_leaders_node_from_draining(overlays: dict[str, Objects], overlay: str) -> None:
    """The standby is never Ready (the leader alone is): any PodDisruptionBudget over the controller
    must still allow evicting the leader, or draining its node waits for ever (as maxUnavailable: 1
    did: 1 Ready of the 1 it wanted, 0 evictions allowed)."""
    (deployment,) = find(overlays[overlay], "Deployment", "vigil-controller")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    replicas = deployment["spec"]["replicas"]
    for budget in find(overlays[overlay], "PodDisruptionBudget"):
        selects = budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert not selects or disruptions_allowed(budget, replicas, ready=1) >= 1, budget
    old = {"spec": {"maxUnavailable": 1}}  # what the base had: the check above would have caught it
    assert disruptions_allowed(old, replicas, ready=1) == 0


def test_the_training_job_example_validates_too() -> None:
    import kubernetes_validate

    objects = [o for o in yaml.safe_load_all((ROOT / "deploy" / "training-job.example.yaml").read_text()) if o]
    assert [o["kind"] for o in objects] == ["Service", "Job"]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_schema_check_does_catch_a_bad_field(overlays: dict[str, Objects]) -> None:
    import kubernetes_validate

    (deployment,) = find(overlays["example"], "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_pods_mount_what_the_overlay_generated(overlays: dict[str, Objects]) -> None:
    """Kustomize renames generated secrets and config maps (a hash suffix); the pods must follow."""
    for name, objects in overlays.items():
        if name.startswith("with-"):  # the base and one component: its secrets are the user's
            continue
        generated = {o["metadata"]["name"] for o in objects if o["kind"] in ("Secret", "ConfigMap")}
        generated |= {o["spec"]["secretName"] for o in find(objects, "Certificate")}
        seen = 0
        for workload in find(objects, "Deployment") + find(objects, "DaemonSet"):
            for volume in workload["spec"]["template"]["spec"]["volumes"]:
                ref = (volume.get("secret") or {}).get("secretName") or (volume.get("configMap") or {}).get("name")
                assert ref is None or ref in generated, (name, workload["metadata"]["name"], ref)
                seen += ref is not None
        assert seen >= 2, f"{name}: no pod mounts a generated secret or config map: nothing was checked"


def test_the_relay_component_points_the_agents_at_relays_that_reach_the_controller(
    overlays: dict[str, Objects], tmp_path: Path
) -> None:
    """With components/relay the agents dial the relays' Service (their last --controller wins over
    the config file's), the relays dial the controller's, and the relays' arguments are ones
    ``vigil relay`` takes, with the certificate ``vigil certs --relay`` writes."""
    objects = overlays["with-relay"]
    (agent,) = find(objects, "DaemonSet", "vigil-agent")
    (relay,) = find(objects, "Deployment", "vigil-relay")
    (relays,) = [o for o in find(objects, "Service") if o["metadata"]["name"] == "vigil-relay"]
    (metrics,) = [o for o in find(objects, "Service") if o["metadata"]["name"] == "vigil-relay-metrics"]
    assert metrics["spec"]["publishNotReadyAddresses"]  # a relay that cannot reach the controller is scraped too
    (controller,) = [o for o in find(objects, "Service") if o["metadata"]["name"] == "vigil-controller"]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    served = {p["name"]: p["port"] for p in relays["spec"]["ports"]}
    assert args[-2:] == [
        f"--controller=vigil-relay.vigil.svc:{served['grpc']}",
        f"--urgent-controller=vigil-relay.vigil.svc:{served['grpc-urgent']}",
    ]
    assert relays["spec"]["selector"] == relay["spec"]["template"]["metadata"]["labels"]
    (container,) = relay["spec"]["template"]["spec"]["containers"]
    relay_args = container["args"]
    # The urgent port the Service sends on is the one the relay listens on, and its policy lets it in.
    listening = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert relay_args[relay_args.index("--urgent-listen") + 1] == f"0.0.0.0:{listening['grpc-urgent']}"
    (target,) = [p["targetPort"] for p in relays["spec"]["ports"] if p["name"] == "grpc-urgent"]
    assert target == "grpc-urgent"
    (policy,) = find(objects, "NetworkPolicy", "vigil-relay")
    assert listening["grpc-urgent"] in {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert relay_args[relay_args.index("--controller") + 1] == f"{controller['metadata']['name']}.vigil.svc:7070"
    # The same arguments, with a certificate of the name it serves; a plaintext flag beside them makes
    # the command refuse at once (so it stops once it has read them all).
    certs = [sys.executable, "-m", "vigil", "certs", str(tmp_path / "certs"), "--controller-name", "c",
             "--relay", "vigil-relay.vigil.svc"]  # fmt: skip
    assert subprocess.run(certs, capture_output=True, timeout=60).returncode == 0
    cert_dir = str(tmp_path / "certs" / "relay-vigil-relay.vigil.svc")
    command = [sys.executable, "-m", "vigil", *[cert_dir if a == "/etc/vigil/tls" else a for a in relay_args]]
    done = subprocess.run([*command, "--plaintext"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not both" in done.stderr, done.stderr
    (policy,) = [o for o in find(objects, "NetworkPolicy") if o["metadata"]["name"] == "vigil-relay"]
    assert policy["spec"]["egress"][-1]["to"][0]["podSelector"]["matchLabels"] == controller["spec"]["selector"]


def test_with_relays_the_controller_asks_for_a_whole_core(overlays: dict[str, Objects]) -> None:
    """A fleet large enough for relays: the controller's CPU request (its weight on a busy node) is a
    core; the base, for small fleets, asks for a quarter."""

    def cpu(overlay: str) -> str:
        (controller,) = find(overlays[overlay], "Deployment", "vigil-controller")
        (container,) = controller["spec"]["template"]["spec"]["containers"]
        return str(container["resources"]["requests"]["cpu"])

    assert cpu("with-relay") == "1"
    assert cpu("example") == "250m"


def test_the_agent_runs_unprivileged_with_its_own_node_token(overlays: dict[str, Objects]) -> None:
    (agent,) = find(overlays["example"], "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert not security.get("privileged") and security["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    (token,) = [v for v in pod["volumes"] if v["name"] == "token"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "vigil"
    assert {"operator": "Exists"} in pod["tolerations"]  # Vigil's own quarantine taint included
    hostpaths = [v for v in pod["volumes"] if "hostPath" in v]
    writable = {m["name"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert [v["hostPath"]["path"] for v in hostpaths if v["name"] in writable] == ["/var/lib/vigil"]  # the spool only
    assert "resources" not in container or "nvidia.com/gpu" not in str(container["resources"])  # takes no GPU


# RBAC: granted == used -----------------------------------------------------------------------

# The kubernetes client's method names, by the resource they act on (the rest of the name).
RESOURCES = {
    "node": ("", "nodes"),
    "node_status": ("", "nodes/status"),
    "namespaced_event": ("", "events"),
    "namespaced_pod": ("", "pods"),
    "pod_for_all_namespaces": ("", "pods"),
    "namespaced_pod_eviction": ("", "pods/eviction"),
    "namespaced_lease": ("coordination.k8s.io", "leases"),
    "token_review": ("authentication.k8s.io", "tokenreviews"),
    "namespaced_job": ("batch", "jobs"),
}
VERBS = {"read": "get", "list": "list", "patch": "patch", "create": "create", "replace": "update", "delete": "delete"}
CALL = re.compile(r"\.(read|list|patch|create|replace|delete)_(\w+?)\(")

Grant = tuple[str, str, str]  # API group, resource, verb


# The actuator's lean writes (``KubeActuator._write``): the HTTP verb and the path they name (inline,
# or the ``path = ...`` before them, in order).
WRITE_PATH = re.compile(r'path = f?"(/api/v1/[^"?]*)')
PATHS = {
    r"^/api/v1/nodes/\{[^}]+\}$": ("", "nodes"),
    r"^/api/v1/nodes/\{[^}]+\}/status$": ("", "nodes/status"),
    r"^/api/v1/namespaces/\{[^}]+\}/events$": ("", "events"),
}


def _placed(path: str) -> tuple[str, str]:
    for pattern, where in PATHS.items():
        if re.match(pattern, path):
            return where
    raise AssertionError(f"a write this test cannot place: {path} (add it to PATHS)")


def used_by_the_code(source: str) -> set[Grant]:
    found = set()
    for verb, rest in CALL.findall(source):
        assert rest in RESOURCES, f"a kubernetes call this test cannot place: {verb}_{rest} (add it to RESOURCES)"
        group, resource = RESOURCES[rest]
        found.add((group, resource, VERBS[verb]))
    for call in re.findall(r"\.list_(\w+?)\((?:[^()]|\([^()]*\))*?watch=True", source):
        found.add((*RESOURCES[call], "watch"))
    writes = re.findall(r'self\._write\(\s*"(PATCH|POST)",\s*(?:path|f"([^"]*)")', source)
    paths = iter(WRITE_PATH.findall(source))
    for verb, inline in writes:
        group, resource = _placed((inline or next(paths)).split("?")[0])
        found.add((group, resource, {"PATCH": "patch", "POST": "create"}[verb]))
    return found


def controller_calls() -> set[Grant]:
    """Every API call the controller can make: its own (controller/act/kube) and the client's Lease lock."""
    from kubernetes.leaderelection.resourcelock import leaselock

    sources = [p.read_text() for p in sorted((ROOT / "controller" / "act" / "kube").glob("*.py"))]
    sources.append(Path(leaselock.__file__).read_text())
    return set().union(*(used_by_the_code(s) for s in sources))


def granted(objects: Objects, account: str) -> set[Grant]:
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding")
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    }
    grants = set()
    for role in find(objects, "ClusterRole") + find(objects, "Role"):
        if (role["kind"], role["metadata"]["name"]) in bound:
            for rule in role["rules"]:
                assert "resourceNames" not in rule and "*" not in rule["verbs"] + rule["resources"]
                grants |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return grants


def test_the_controller_is_granted_exactly_the_verbs_its_code_uses(overlays: dict[str, Objects]) -> None:
    calls = controller_calls()
    eviction, reboot = ("", "pods/eviction", "create"), ("batch", "jobs", "create")
    assert {eviction, reboot, ("authentication.k8s.io", "tokenreviews", "create")} <= calls
    assert granted(overlays["example"], "vigil-controller") == calls - {eviction, reboot}  # both opt-in
    assert granted(overlays["cert-manager"], "vigil-controller") == calls - {eviction, reboot}
    assert granted(overlays["with-drain"], "vigil-controller") == calls - {reboot}
    assert granted(overlays["with-remediation"], "vigil-controller") == calls - {eviction}
    assert granted(overlays["example"], "vigil-agent") == set()


def test_the_namespaced_grants_are_where_the_controller_writes(overlays: dict[str, Objects]) -> None:
    """Events and the Lease are granted in the vigil namespace only: the config must write there."""
    (config_map,) = find(overlays["example"], "ConfigMap", "vigil-controller-config")
    cfg = yaml.safe_load(config_map["data"]["controller.yaml"])
    (role,) = find(overlays["example"], "Role")
    namespaced = {r for rule in role["rules"] for r in rule["resources"]}
    assert namespaced == {"events", "leases"} and role["metadata"]["namespace"] == "vigil"
    assert cfg["kubernetes"]["events_namespace"] == cfg["leader_election"]["namespace"] == "vigil"


# The configuration the pods mount ------------------------------------------------------------


@pytest.mark.parametrize("overlay", ["example", "cert-manager"])
def test_the_mounted_configuration_loads(overlays: dict[str, Objects], overlay: str, tmp_path: Path) -> None:
    objects = overlays[overlay]
    (controller_map,) = find(objects, "ConfigMap", "vigil-controller-config")
    (agent_map,) = find(objects, "ConfigMap", "vigil-agent-config")
    (tmp_path / "controller.yaml").write_text(controller_map["data"]["controller.yaml"])
    (tmp_path / "agent.yaml").write_text(agent_map["data"]["agent.yaml"])
    ctl = load_controller_config(tmp_path / "controller.yaml", {})
    agent = load_agent_config(tmp_path / "agent.yaml", {"node": "gpu-001", "token_file": Path("/t")})
    assert ctl.actuator == "kubernetes" and ctl.agent_tokens.enabled and ctl.leader_election.enabled
    (sa,) = find(objects, "ServiceAccount", "vigil-agent")
    assert ctl.agent_tokens.service_account == f"system:serviceaccount:{sa['metadata']['namespace']}:vigil-agent"
    (service,) = [o for o in find(objects, "Service") if o["metadata"]["name"] == "vigil-controller"]
    served = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert agent.controller == f"{service['metadata']['name']}.vigil.svc:{served['grpc']}"
    # The urgent port: the agent dials the Service's, which the controller listens on and its policy lets in.
    assert agent.urgent_controller == f"{service['metadata']['name']}.vigil.svc:{served['grpc-urgent']}"
    (deployment,) = find(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (ports["grpc"], ports["grpc-urgent"], ports["metrics"]) == (ctl.port, ctl.urgent_port, ctl.metrics_port)
    (policy,) = find(objects, "NetworkPolicy", "vigil-controller")
    assert {ctl.port, ctl.urgent_port} <= {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    (daemonset,) = find(objects, "DaemonSet")
    (agent_container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert agent_container["ports"] == [{"name": "metrics", "containerPort": agent.metrics_port}]


def test_the_postgres_component_gives_the_controller_its_dsn_from_the_secret(
    overlays: dict[str, Objects], tmp_path: Path
) -> None:
    (deployment,) = find(overlays["with-postgres"], "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    flag = container["args"].index("--database-dsn-file")
    dsn_file = Path(container["args"][flag + 1])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "postgres"]
    assert dsn_file.parent == Path(mount["mountPath"]) and mount["readOnly"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "postgres"]
    assert volume["secret"]["secretName"] == "vigil-postgres"
    assert volume["secret"]["items"] == [{"key": "dsn", "path": dsn_file.name}]
    assert container["args"][:flag] == [
        "controller",
        "--config",
        "/etc/vigil/config/controller.yaml",
        "--log-format",
        "json",
    ]
    # What the controller makes of that file, with the base's configuration
    (config_map,) = find(overlays["with-postgres"], "ConfigMap", "vigil-controller-config")
    (tmp_path / "controller.yaml").write_text(config_map["data"]["controller.yaml"])
    (tmp_path / "dsn").write_text("postgresql://vigil:secret@db.example:5432/vigil\n")
    ctl = load_controller_config(tmp_path / "controller.yaml", {"database_dsn_file": tmp_path / "dsn"})
    assert ctl.database == "postgresql://vigil:secret@db.example:5432/vigil"


# Prometheus and Grafana ----------------------------------------------------------------------


def exported_metrics() -> set[str]:
    """The sample names the controller, the agent and a relay expose (a counter as NAME_total, ...)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    names = set()
    for registry in (ControllerMetrics().registry, AgentMetrics("n").registry, RelayMetrics().registry):
        for family in registry.collect():
            names |= {family.name + s for s in suffixes[family.type]}
    return names


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bvigil_[a-z0-9_]+", expr))


@pytest.fixture(scope="module")
def rules(overlays: dict[str, Objects], tmp_path_factory: pytest.TempPathFactory) -> Path:
    (rule,) = find(overlays["example"], "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def test_the_rules_and_the_dashboard_name_only_exported_metrics(rules: Path) -> None:
    exported = exported_metrics()
    exprs = [r["expr"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"]]
    dashboard = json.loads((KUSTOMIZE / "components" / "monitoring" / "dashboard.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10 and len(exprs) >= 5
    for panel in panels:
        queries = [t["expr"] for t in panel["targets"]]
        assert queries and all(metric_names(q) for q in queries), panel["title"]
        exprs += queries
    unknown = {name for e in exprs for name in metric_names(e)} - exported
    assert not unknown, f"not exported by Vigil: {sorted(unknown)}"


def test_an_unknown_metric_would_be_caught() -> None:
    assert "vigil_controller_leader" in exported_metrics()
    assert "vigil_controller_signals_total" in exported_metrics()
    assert "vigil_controller_signals" not in exported_metrics()  # a counter's samples end in _total


@pytest.fixture
def promtool() -> Iterator[str]:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/run installs it as root)")
    yield path


def test_promtool_checks_the_rules(promtool: str, rules: Path) -> None:
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 22 rules found" in done.stdout


def test_the_alerts_fire_when_they_should(promtool: str, rules: Path) -> None:
    """promtool's rule unit tests (tests/contract/rules_test.yaml) against the rendered rules."""
    test_file = rules.parent / "rules_test.yaml"
    shutil.copy(Path(__file__).with_name("rules_test.yaml"), test_file)
    done = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# The image ---------------------------------------------------------------------------------------


def test_the_image_copies_every_package_the_wheel_holds() -> None:
    """No container runtime here to build it; what can drift is checked: the Dockerfile copies
    every package the wheel is built from, and has the targets the Makefile and the manifests name."""
    import tomllib

    dockerfile = (ROOT / "deploy" / "image" / "Dockerfile").read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ") and "--from" not in line}
    assert copied == {*packages["packages"], "pyproject.toml"}
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M))
    assert {"controller", "agent", "agent-lite", "train"} <= targets
    makefile = (ROOT / "Makefile").read_text()
    assert "--target controller" in makefile and "--target agent " in makefile and "--target train " in makefile
    # Every image a manifest names is one `make images` builds and pushes.
    manifests = [*(ROOT / "deploy" / "kustomize").rglob("*.yaml"), ROOT / "deploy" / "training-job.example.yaml"]
    named = {m.split("/")[-1].split(":")[0] for f in manifests for m in re.findall(r"image: (\S+)", f.read_text())}
    built = set(re.findall(r"docker push \$\(REGISTRY\)/(\S+):", makefile))
    assert named - {"busybox"} <= built, named - built
