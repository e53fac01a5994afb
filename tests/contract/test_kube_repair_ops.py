"""What a repair asks of Kubernetes, through the real ``kubernetes`` client against an API server on
loopback: the GPU Operator's labels paused and put back as they were, the reboot Job as the API
server receives it, a person's cordon seen as another owner, and the NodeHealthCheck example
selecting exactly the nodes Vigil quarantined."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controller.act.kube.actuator import KubeActuator
from controller.act.kube.client import RETRY, api_client
from controller.act.kube.repair_ops import HOST_NVIDIA_SMI, KubeRepairOps, remedy_outcome
from controller.repairs.steps import OPERATOR_PAUSE
from controller.vocab.actions import Quarantine
from tests.fakes.kube_api import KubeApiServer
from tests.helpers import poll_until

ROOT = Path(__file__).resolve().parents[2]
NHC = ROOT / "deploy" / "kustomize" / "components" / "remediation" / "node-health-check.yaml"


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


def clients(kube: KubeApiServer, tmp_path: Path) -> tuple[KubeActuator, KubeRepairOps]:
    api = api_client(kube.kubeconfig(tmp_path / "kubeconfig"), retry=RETRY.new(backoff_factor=0.01))
    return KubeActuator(api), KubeRepairOps(api)


def test_the_gpu_operator_s_components_are_paused_and_put_back_as_they_were(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    kube.add_node("gpu-1", labels={"nvidia.com/gpu.deploy.dcgm-exporter": "true", "rack": "r1"})
    _, ops = clients(kube, tmp_path)
    before = ops.set_labels("gpu-1", dict[str, str | None](OPERATOR_PAUSE))
    labels = kube.node("gpu-1")["metadata"]["labels"]
    assert all(labels[k] == "false" for k in OPERATOR_PAUSE) and labels["rack"] == "r1"
    assert before["nvidia.com/gpu.deploy.dcgm-exporter"] == "true" and before["nvidia.com/gpu.deploy.dcgm"] is None
    ops.set_labels("gpu-1", before)
    assert kube.node("gpu-1")["metadata"]["labels"] == {"nvidia.com/gpu.deploy.dcgm-exporter": "true", "rack": "r1"}


def test_the_reboot_job_is_pinned_to_the_node_privileged_and_never_retried(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1")
    _, ops = clients(kube, tmp_path)
    assert ops.run_reboot_job("gpu-1", "vigil-reboot-gpu-1-3", "vigil", "busybox:1.36").endswith("created")
    assert "created already" in ops.run_reboot_job("gpu-1", "vigil-reboot-gpu-1-3", "vigil", "busybox:1.36")
    (post, *_) = kube.requests("POST", r"/apis/batch/v1/namespaces/vigil/jobs$")
    job = post.body
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["backoffLimit"] == 0 and pod["nodeName"] == "gpu-1" and pod["hostPID"] is True
    assert pod["containers"][0]["securityContext"] == {"privileged": True}
    assert pod["containers"][0]["command"][-2:] == ["systemctl", "reboot"]
    assert {"operator": "Exists"} in pod["tolerations"]  # it runs on the quarantined (tainted, cordoned) node


def test_a_persons_cordon_after_the_quarantine_makes_the_node_someone_elses(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    from kubernetes import client as k8s

    kube.add_node("gpu-1")
    actuator, ops = clients(kube, tmp_path)
    actuator.quarantine(Quarantine("inc-1", "gpu-1", "XID 48", "reset the GPU", 1.0))
    assert ops.held_by_others("gpu-1") == ""
    person = k8s.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "person-kubeconfig")))
    taints = [*kube.node("gpu-1")["spec"]["taints"], {"key": "repair", "value": "rma", "effect": "NoSchedule"}]
    person.patch_node("gpu-1", {"spec": {"taints": taints}}, field_manager="kubectl-taint")
    # The double keeps no managedFields: the cordon and taints unlike what the quarantine left say it.
    assert ops.held_by_others("gpu-1") == "someone changed its cordon or taints after Vigil quarantined it"


def test_who_holds_a_node_is_read_from_the_watch_not_one_get_a_second(kube: KubeApiServer, tmp_path: Path) -> None:
    from kubernetes import client as k8s

    from controller.act.kube.actuator import watching

    kube.add_node("gpu-1")
    api = api_client(kube.kubeconfig(tmp_path / "kubeconfig"), retry=RETRY.new(backoff_factor=0.01))
    actuator = watching(api)
    assert actuator.cache is not None
    cache = actuator.cache
    try:
        poll_until(lambda: cache.synced, 10)
        ops = KubeRepairOps(api, cache=cache)
        actuator.quarantine(Quarantine("inc-1", "gpu-1", "XID 48", "reset the GPU", 1.0))
        poll_until(lambda: bool((cache.get("gpu-1") or {}).get("spec", {}).get("unschedulable")), 10)
        assert [ops.held_by_others("gpu-1") for _ in range(5)] == [""] * 5  # as a repair asks, tick after tick
        person = k8s.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "person-kubeconfig")))
        taints = [*kube.node("gpu-1")["spec"]["taints"], {"key": "repair", "value": "rma", "effect": "NoSchedule"}]
        person.patch_node("gpu-1", {"spec": {"taints": taints}}, field_manager="kubectl-taint")
        poll_until(lambda: ops.held_by_others("gpu-1") != "", 10)  # the watch brings the person's taint
        assert ops.held_by_others("gpu-1") == "someone changed its cordon or taints after Vigil quarantined it"
        assert not kube.requests("GET", r"/api/v1/nodes/gpu-1$")  # every reading from the watch
        cache.synced = False  # the watch lost: read from the API server until it has listed again
        assert ops.held_by_others("gpu-1") == "someone changed its cordon or taints after Vigil quarantined it"
        assert len(kube.requests("GET", r"/api/v1/nodes/gpu-1$")) == 1
    finally:
        actuator.close()


def _unhealthy(node: dict[str, object], check: dict[str, object]) -> bool:
    """NodeHealthCheck's test of a node (its unhealthyConditions; the duration is its own wait)."""
    conditions = (node.get("status") or {}).get("conditions") or []  # type: ignore[attr-defined]
    wanted = check["spec"]["unhealthyConditions"]  # type: ignore[index]
    return any(c["type"] == w["type"] and c["status"] == w["status"] for c in conditions for w in wanted)


def test_the_node_health_check_example_selects_exactly_the_nodes_vigil_quarantined(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    check = yaml.safe_load(NHC.read_text())
    assert check["kind"] == "NodeHealthCheck" and check["apiVersion"].startswith("remediation.medik8s.io/")
    for name in ("gpu-1", "gpu-2"):
        kube.add_node(name, labels={"nvidia.com/gpu.present": "true"})
    actuator, _ = clients(kube, tmp_path)
    actuator.quarantine(Quarantine("inc-1", "gpu-1", "XID 79", "reboot the node", 1.0))
    assert _unhealthy(kube.node("gpu-1"), check) and not _unhealthy(kube.node("gpu-2"), check)
    actuator.release("gpu-1", "repaired and certified")
    assert not _unhealthy(kube.node("gpu-1"), check)  # released: NodeHealthCheck lets it be


def test_a_reset_job_runs_vigil_remedy_with_the_hosts_nvidia_smi_and_its_result_is_read_back(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    kube.add_node("gpu-1")
    _, ops = clients(kube, tmp_path)
    ops.run_remedy_job("gpu-1", "vigil-gpu-reset-gpu-1-1", "vigil", "vigil-agent", "gpu_reset", ["0000:18:00"], 300)
    ops.run_remedy_job("gpu-1", "vigil-gpu-reset-gpu-1-1", "vigil", "vigil-agent", "gpu_reset", ["0000:18:00"], 300)
    (post, _) = kube.requests("POST", r"/apis/batch/v1/namespaces/vigil/jobs$")  # the second met 409
    pod = post.body["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:5] == ["vigil", "remedy", "gpu_reset", "--gpu", "0000:18:00"]
    assert HOST_NVIDIA_SMI in container["command"] and container["securityContext"] == {"privileged": True}
    assert pod["hostPID"] is True and pod["nodeName"] == "gpu-1"
    assert ops.remedy_result("vigil", "vigil-gpu-reset-gpu-1-1") is None  # no pod ended yet
    message = json.dumps({"remedy": "gpu_reset", "verdict": "UNKNOWN", "reason": "refused: pid 7", "busy": True})
    ended = [{"name": "remedy", "state": {"terminated": {"exitCode": 2, "message": message}}}]
    labels = {"job-name": "vigil-gpu-reset-gpu-1-1"}
    kube.add_pod("vigil", "vigil-gpu-reset-1-x", "gpu-1", "Job", labels, "Failed", container_statuses=ended)
    assert ops.remedy_result("vigil", "vigil-gpu-reset-gpu-1-1") == json.loads(message)


def test_a_reset_pod_that_ended_without_a_result_is_a_failure_that_says_so() -> None:
    crashed = {"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 137, "message": "OOMKilled"}}}]}}
    assert remedy_outcome([crashed]) == {"verdict": "FAIL", "reason": "the remedy's pod ended 137: OOMKilled"}
    assert remedy_outcome([{"status": {"phase": "Pending"}}]) is None


def test_the_gpu_operators_pods_still_on_the_node_are_named(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1")
    kube.add_pod("gpu-operator", "nvidia-dcgm-exporter-x1", "gpu-1", "DaemonSet", {"app": "nvidia-dcgm-exporter"})
    kube.add_pod("gpu-operator", "nvidia-dcgm-exporter-x2", "gpu-2", "DaemonSet", {"app": "nvidia-dcgm-exporter"})
    kube.add_pod("ml", "trainer-0", "gpu-1", "Job", {"app": "trainer"})
    _, ops = clients(kube, tmp_path)
    assert ops.operand_pods("gpu-1") == ["nvidia-dcgm-exporter-x1"]  # not another node's, not a workload
    (listed,) = kube.requests("GET", r"/api/v1/pods$")
    assert listed.path == "/api/v1/pods"
