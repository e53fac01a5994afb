"""The Kubernetes actuator: quarantine (taint + cordon + condition + Event + ownership annotations),
release (only what Vigil quarantined), optional drain, and adoption of existing quarantines.

Each call is idempotent: it reads the node, plans the writes (``controller.act.kube.plans``, pure) and
sends them; a 409 (the node changed under us) means read again and plan again. The cordon is
written first, being what the scheduler acts on; the condition and the Event follow, and the action
runner writes them only once no other quarantine's cordon waits (``quarantine_urgent_first``).

Reads: a quarantine plans from the node as the watch last showed it (``node_cache``), so a burst
of a thousand costs no LIST and no GET per node; a stale read costs a 409 and a GET for that node
only. Without a cache (or before its first list), a GET. The rate of quarantines is limited
upstream (the engine's token bucket).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, cast
from urllib.parse import quote

import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.act.actuators import FoundQuarantine, PermanentActionError, Release, SelectionError, Unfinished
from controller.act.kube.node_cache import NodeCache, node_pages
from controller.act.kube.plans import (
    FIELD_MANAGER,
    Json,
    QuarantinePlan,
    found_quarantine,
    plan_quarantine,
    plan_release,
)
from controller.vocab.actions import Drain, Quarantine

log = structlog.get_logger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
_CONFLICT_RETRIES = 5


class DrainBlocked(Exception):
    """Some pods may not be evicted yet: their PodDisruptionBudget forbids it for now."""


class KubeActuator:
    quarantine_means = "a taint, a cordon and a node condition"

    def __init__(
        self,
        api: client.ApiClient,
        events_namespace: str = "default",
        timeout_s: float = 10.0,
        cache: NodeCache | None = None,
    ) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._namespace = events_namespace
        self._timeout = timeout_s
        self.cache = cache  # started by whoever made it (the composition root)

    # Reading ----------------------------------------------------------------------------------

    def _get(self, name: str) -> Json:
        try:
            resp = self._core.read_node(name, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status in (403, 404):
                raise PermanentActionError(f"cannot read node {name!r}: {exc.status} {exc.reason}") from None
            raise
        return json_body(resp)

    def _read(self, name: str, fresh: bool) -> Json:
        node = None if fresh or self.cache is None else self.cache.get(name)
        return node if node is not None else self._get(name)

    # Quarantine -------------------------------------------------------------------------------

    def quarantine(self, action: Quarantine) -> str:
        done = self.quarantine_urgent_first(action)
        return done if isinstance(done, str) else done.finish()

    def quarantine_urgent_first(self, action: Quarantine) -> str | Unfinished:
        """The cordon and taint (what the scheduler acts on); the condition and the Event are the rest."""
        fresh = False
        for _ in range(_CONFLICT_RETRIES):
            node = self._read(action.node, fresh)
            plan = plan_quarantine(node, action.incident_id, action.reason, time.time(), self._namespace)
            if isinstance(plan, str):
                return f"already quarantined by Vigil (incident {plan}); left as it is"
            if plan.node_patch is None:
                return self._record(action.node, plan, "already tainted and cordoned; condition and Event ensured")
            if not self._patch_node(action.node, plan.node_patch):
                fresh = True
                continue
            said = "tainted, cordoned, condition and Event written"
            return Unfinished(partial(self._record, action.node, plan, said))
        raise RuntimeError(f"node {action.node!r} kept changing: {_CONFLICT_RETRIES} conflicts in a row")

    def _record(self, name: str, plan: QuarantinePlan, said: str) -> str:
        self._patch_status(name, plan.status_patch)
        self._create_event(plan.event)
        return said

    def _write(self, method: str, path: str, body: Json, content_type: str) -> None:
        """One write through the client's own connection pool, credentials, TLS and retries, without
        its per-call model validation and serialisation: of a quarantine's three writes, that was
        half the controller's CPU in a burst of a thousand (``bench/scale.py``). Raises
        ApiException for an answer outside 2xx, as the client's typed methods do."""
        api = self._api
        headers = {"Content-Type": content_type, "Accept": "application/json", "User-Agent": api.user_agent}
        api.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        resp = api.call_api(
            method, api.configuration.host + path, header_params=headers, body=body, _request_timeout=self._timeout
        )
        resp.read()
        if not 200 <= resp.status <= 299:
            text = (resp.data or b"").decode(errors="replace")
            raise ApiException.from_response(http_resp=resp, body=text, data=None)

    def _patch_node(self, name: str, body: Json) -> bool:
        """False on 409 (the node changed since it was read)."""
        try:
            path = f"/api/v1/nodes/{quote(name, safe='')}?fieldManager={quote(FIELD_MANAGER, safe='')}"
            self._write("PATCH", path, body, MERGE_PATCH)
        except ApiException as exc:
            if exc.status == 409:
                log.info("node_conflict", node=name)
                return False
            _raise_permanent(exc, f"patch node {name!r}")
            raise
        return True

    def _patch_status(self, name: str, body: Json) -> None:
        try:
            self._write("PATCH", f"/api/v1/nodes/{quote(name, safe='')}/status", body, STRATEGIC_PATCH)
        except ApiException as exc:
            _raise_permanent(exc, f"patch node {name!r} status")
            raise

    def _create_event(self, event: Json) -> None:
        try:
            self._write(
                "POST", f"/api/v1/namespaces/{quote(self._namespace, safe='')}/events", event, "application/json"
            )
        except ApiException as exc:
            if exc.status == 409:
                return  # an earlier attempt wrote it
            _raise_permanent(exc, "create event")
            raise

    # Drain (opt-in) ---------------------------------------------------------------------------

    def drain(self, action: Drain) -> str:
        """Evict the node's pods through the Eviction API, which honours PodDisruptionBudgets.

        DaemonSet pods (Vigil's agent among them) and mirror pods stay. While a budget forbids an
        eviction (429), this raises, naming the pods, and the action runner tries again later.
        """
        node = action.node
        pods = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=self._timeout
        )
        evicted, blocked = 0, []
        for pod in json_body(pods)["items"]:
            meta = pod["metadata"]
            owners = {o.get("kind") for o in meta.get("ownerReferences") or []}
            if "DaemonSet" in owners or "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
                continue
            body: dict[str, Any] = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            }
            try:
                self._core.create_namespaced_pod_eviction(
                    meta["name"], meta["namespace"], cast(Any, body), _request_timeout=self._timeout
                )
                evicted += 1
            except ApiException as exc:
                if exc.status == 404:
                    continue
                if exc.status == 429:
                    blocked.append(f"{meta['namespace']}/{meta['name']}")
                    continue
                raise
        if blocked:
            raise DrainBlocked(f"{evicted} pod(s) evicted; blocked by PodDisruptionBudgets: {', '.join(blocked)}")
        return f"drained: {evicted} pod(s) evicted"

    # Release and adoption ---------------------------------------------------------------------

    def release(self, node: str, reason: str) -> Release:
        for _ in range(_CONFLICT_RETRIES):
            current = self._get(node)
            plan = plan_release(current, reason, time.time(), self._namespace)
            if plan is None:
                cordoned = bool(current.get("spec", {}).get("unschedulable"))
                note = " (it is cordoned, by someone else)" if cordoned else ""
                return Release(False, f"not quarantined by Vigil{note}: left as it is")
            if not self._patch_node(node, plan.node_patch):
                continue
            self._patch_status(node, plan.status_patch)
            self._create_event(plan.event)
            if plan.changed_by:
                log.warning("release_left_cordoned", node=node, changed_by=plan.changed_by)
                return Release(True, f"Vigil's taint removed; left cordoned: {plan.changed_by}")
            kept = "; it stays cordoned, as it was before Vigil" if plan.keeps_cordon else ""
            return Release(True, f"taint removed, uncordoned{kept}")
        raise RuntimeError(f"node {node!r} kept changing: {_CONFLICT_RETRIES} conflicts in a row")

    def close(self) -> None:
        """The node watch's thread ends (its blocking read cut short)."""
        if self.cache is not None:
            self.cache.stop()

    def node_labels(self) -> dict[str, dict[str, str]]:
        """From the node cache once it has listed (stale while it lists again after a lost watch,
        which ``vigil_controller_node_watch_up`` says); before that, listed here, page by page."""
        if self.cache is not None and self.cache.lists:
            return self.cache.labels()
        return {
            n["metadata"]["name"]: dict(n["metadata"].get("labels") or {})
            for items, _ in node_pages(self._core, self._timeout)
            for n in items
        }

    def label_changes(self) -> tuple[dict[str, dict[str, str]], list[str]] | None:
        """From the node cache's watch once it has listed (``WatchedLabels``); None before."""
        if self.cache is not None and self.cache.lists:
            return self.cache.label_changes()
        return None

    def adopt(self) -> list[FoundQuarantine]:
        return found_quarantines(n for items, _ in node_pages(self._core, self._timeout) for n in items)

    def adopt_watched(self) -> list[FoundQuarantine] | None:
        if self.cache is None or not self.cache.synced:
            return None
        return found_quarantines(self.cache.nodes())

    # Choosing nodes (sweeps) -------------------------------------------------------------------

    def nodes_matching(self, selector: str) -> list[str]:
        items = self._list(
            f"label selector {selector!r}",
            lambda: self._core.list_node(
                label_selector=selector, _preload_content=False, _request_timeout=self._timeout
            ),
        )
        return sorted(n["metadata"]["name"] for n in items)

    def job_nodes(self, namespace: str, job: str) -> list[str]:
        """Nodes of the Job's pods that have not finished. Pods carry ``batch.kubernetes.io/job-name``
        since Kubernetes 1.27, ``job-name`` before."""
        pods: list[Json] = []
        for label in ("batch.kubernetes.io/job-name", "job-name"):
            pods = self._list(
                f"Job {namespace}/{job}",
                lambda label=label: self._core.list_namespaced_pod(  # type: ignore[misc]
                    namespace, label_selector=f"{label}={job}", _preload_content=False, _request_timeout=self._timeout
                ),
            )
            if pods:
                break
        nodes = {
            p["spec"]["nodeName"]
            for p in pods
            if p.get("spec", {}).get("nodeName") and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        }
        if not nodes:
            raise SelectionError(f"Job {namespace}/{job} has no running pods on any node")
        return sorted(nodes)

    def _list(self, what: str, call: Callable[[], object]) -> list[Json]:
        try:
            items: list[Json] = json_body(call())["items"]
        except ApiException as exc:
            raise SelectionError(f"{what}: the API server answered {exc.status} {exc.reason}") from None
        except urllib3.exceptions.HTTPError as exc:  # unreachable after the client's retries
            raise SelectionError(f"{what}: cannot reach the API server: {exc}") from None
        return items


def found_quarantines(nodes: Iterable[Json]) -> list[FoundQuarantine]:
    """Vigil's quarantines among ``nodes``, read back from their annotations. Pure."""
    found = []
    for node in nodes:
        if (q := found_quarantine(node)) is not None:
            found.append(FoundQuarantine(node["metadata"]["name"], *q))
    return found


def watching(api: client.ApiClient, events_namespace: str = "default") -> KubeActuator:
    """The controller's actuator: its nodes' labels and what its quarantines plan from kept by a
    watch (``node_cache``), started now."""
    cache = NodeCache(client.CoreV1Api(api))
    cache.start()
    return KubeActuator(api, events_namespace=events_namespace, cache=cache)


def _raise_permanent(exc: ApiException, what: str) -> None:
    if exc.status in (400, 403, 404, 422):
        raise PermanentActionError(f"{what}: {exc.status} {exc.reason}: {str(exc.body)[:300]}") from None


def json_body(response: object) -> Json:
    """The body of a call made with ``_preload_content=False`` (skipping the model classes: a LIST of
    thousands of nodes parses several times faster as plain JSON)."""
    data: Json = json.loads(cast(Any, response).data)
    return data
