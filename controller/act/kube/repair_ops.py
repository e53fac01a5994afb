"""What a repair asks of Kubernetes (``controller.repairs``): whether someone else holds the node,
the GPU Operator's per-node component labels (paused around a GPU reset, then restored), and the
reboot Job. The Job's manifest is built by ``reboot_job`` (pure)."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.act.kube.actuator import MERGE_PATCH, json_body
from controller.act.kube.plans import FIELD_MANAGER, Json, changed_since_quarantine


def reboot_job(node: str, name: str, namespace: str, image: str) -> Json:
    """A privileged Job pinned to the node that asks its host for an orderly reboot (systemd, in the
    host's namespaces through PID 1). It never retries: a second reboot is the repair's decision."""
    command = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--", "systemctl", "reboot"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "vigil"}},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "vigil-reboot", "vigil.dev/node": node}},
                "spec": {
                    "nodeName": node,
                    "hostPID": True,
                    "restartPolicy": "Never",
                    # Vigil's own quarantine taint, and any cordon: the Job must run on the node out of service.
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "reboot",
                            "image": image,
                            "command": command,
                            "securityContext": {"privileged": True},
                        }
                    ],
                },
            },
        },
    }


class KubeRepairOps:
    def __init__(self, api: client.ApiClient, timeout_s: float = 10.0) -> None:
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._timeout = timeout_s

    def _node(self, name: str) -> Json:
        resp = self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout)
        return json_body(resp)

    def held_by_others(self, node: str) -> str:
        return changed_since_quarantine(self._node(node))

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
