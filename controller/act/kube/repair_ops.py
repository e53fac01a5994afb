"""What a repair asks of Kubernetes (``controller.repairs``): whether someone else holds the node,
the GPU Operator's per-node component labels (paused around a GPU reset, then restored), the reboot
Job, and the reset Job (``remediation.resets: job``: a short-lived privileged pod on the node runs
``vigil remedy`` with the host's nvidia-smi, so the agent's DaemonSet stays unprivileged; its result
comes back as the container's termination message). The Jobs' manifests and the reading of a
result are pure (``reboot_job``, ``remedy_job``, ``remedy_outcome``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.act.kube.actuator import MERGE_PATCH, json_body
from controller.act.kube.node_cache import NodeCache
from controller.act.kube.plans import FIELD_MANAGER, Json, changed_since_quarantine

# The GPU Operator's component pods that hold the GPUs open (their `app` labels), stopped on a node by
# its nvidia.com/gpu.deploy.* labels.
GPU_OPERANDS = ("nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter", "nvidia-dcgm", "gpu-feature-discovery")
HOST_NVIDIA_SMI = "nsenter --target 1 --mount -- nvidia-smi"  # the host's own, from a hostPID pod
_TOLERATE_ALL = [{"operator": "Exists"}]  # Vigil's quarantine taint and the cordon: it must run there


def node_job(node: str, name: str, namespace: str, what: str, container: Json, deadline_s: float = 0) -> Json:
    """A Job of one privileged pod pinned to the node, in the host's PID namespace, never retried (a
    second try is the repair's decision); ``deadline_s``: Kubernetes ends it after that (0: never)."""
    spec: Json = {"backoffLimit": 0, "ttlSecondsAfterFinished": 3600}
    if deadline_s:
        spec["activeDeadlineSeconds"] = int(deadline_s) + 60
    pod = {"nodeName": node, "hostPID": True, "restartPolicy": "Never", "tolerations": _TOLERATE_ALL}
    pod["containers"] = [{"name": what, **container, "securityContext": {"privileged": True}}]
    labels = {"app.kubernetes.io/name": f"vigil-{what}", "vigil.dev/node": node}
    spec["template"] = {"metadata": {"labels": labels}, "spec": pod}
    meta = {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "vigil"}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def reboot_job(node: str, name: str, namespace: str, image: str) -> Json:
    """Asks the node's host for an orderly reboot (systemd, in the host's namespaces through PID 1)."""
    command = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--", "systemctl", "reboot"]
    return node_job(node, name, namespace, "reboot", {"image": image, "command": command})


def remedy_job(
    node: str, name: str, namespace: str, image: str, remedy: str, gpus: Sequence[str], deadline_s: float
) -> Json:
    """Runs ``vigil remedy`` once on the node, within the deadline; its result is the termination message."""
    command = ["vigil", "remedy", remedy, *(a for bus in gpus for a in ("--gpu", bus))]
    command += ["--nvidia-smi", HOST_NVIDIA_SMI, "--deadline", f"{deadline_s:g}"]
    command += ["--result-file", "/dev/termination-log"]
    container = {
        "image": image,
        "command": command,
        "env": [{"name": "NODE_NAME", "value": node}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return node_job(node, name, namespace, "remedy", container, deadline_s)


def remedy_outcome(pods: Sequence[Json]) -> Json | None:
    """The result ``vigil remedy`` wrote, from the Job's pod once its container ended; None while it
    runs. A container that ended without a readable result failed, said with its exit code."""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (status.get("state") or {}).get("terminated")
            if not ended:
                continue
            try:
                result: Json = json.loads(ended.get("message") or "")
            except ValueError:
                said = (ended.get("message") or ended.get("reason") or "").strip()[-300:]
                return {"verdict": "FAIL", "reason": f"the remedy's pod ended {ended.get('exitCode')}: {said}"}
            return result if isinstance(result, dict) else {"verdict": "FAIL", "reason": "an unreadable result"}
        if (pod.get("status") or {}).get("phase") == "Failed":
            return {"verdict": "FAIL", "reason": f"the remedy's pod failed: {pod['status'].get('reason', '')}"}
    return None


class KubeRepairOps:
    def __init__(self, api: client.ApiClient, timeout_s: float = 10.0, cache: NodeCache | None = None) -> None:
        """``cache``: the actuator's node watch, where ``held_by_others`` reads while it is up (a repair
        asks every second for each node it holds: a GET each would be one per node a second)."""
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._timeout = timeout_s
        self._cache = cache

    def _node(self, name: str) -> Json:
        resp = self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout)
        return json_body(resp)

    def held_by_others(self, node: str) -> str:
        cached = self._cache.read(node) if self._cache is not None else None
        return changed_since_quarantine(cached if cached is not None else self._node(node))

    def set_labels(self, node: str, labels: dict[str, str | None]) -> dict[str, str | None]:
        """Set (None: remove) the node's labels; returns what they were, to put back."""
        current = self._node(node)["metadata"].get("labels") or {}
        before = {key: current.get(key) for key in labels}
        self._core.patch_node(
            node,
            {"metadata": {"labels": labels}},
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
            _request_timeout=self._timeout,
        )
        return before

    def operand_pods(self, node: str) -> list[str]:
        resp = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}",
            label_selector=f"app in ({','.join(GPU_OPERANDS)})",
            _preload_content=False,
            _request_timeout=self._timeout,
        )
        return sorted(p["metadata"]["name"] for p in json_body(resp)["items"])

    def run_reboot_job(self, node: str, name: str, namespace: str, image: str) -> str:
        try:
            self._batch.create_namespaced_job(
                namespace, cast(Any, reboot_job(node, name, namespace, image)), _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status == 409:
                return f"reboot Job {namespace}/{name} was created already"
            raise
        return f"reboot Job {namespace}/{name} created"

    def run_remedy_job(
        self, node: str, name: str, namespace: str, image: str, remedy: str, gpus: Sequence[str], deadline_s: float
    ) -> None:
        body = remedy_job(node, name, namespace, image, remedy, gpus, deadline_s)
        try:
            self._batch.create_namespaced_job(namespace, cast(Any, body), _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 409:  # 409: an earlier attempt created it; its result is read the same way
                raise

    def remedy_result(self, namespace: str, name: str) -> Json | None:
        resp = self._core.list_namespaced_pod(
            namespace, label_selector=f"job-name={name}", _preload_content=False, _request_timeout=self._timeout
        )
        return remedy_outcome(json_body(resp)["items"])
