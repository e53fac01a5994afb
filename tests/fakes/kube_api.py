"""A Kubernetes API server on loopback, for the real ``kubernetes`` client: kmock's emulator, taught
the parts of the API server's behaviour that Vigil's correctness depends on.

- ``resourceVersion``: every write bumps it; a write that names an older one gets 409 Conflict
  (optimistic concurrency: what the actuator's node writes and the Lease election rely on).
- PATCH by content type: JSON merge patch (RFC 7386: null deletes a key, lists are replaced) and
  strategic merge patch for node conditions (merged by ``type``); PUT replaces the object.
- TokenReview of the service-account tokens ``issue_token`` made, with the audience check and the
  pod's node in ``user.extra`` as the API server (1.30+) gives them for pod-bound tokens.
- Faults on demand: ``fail("PATCH", r"/nodes/node-1$", 409, times=1)``.
- A log of every request with its method, path, content type and JSON body, for exact assertions.
- Nodes at scale: a LIST pages with ``limit`` and ``continue``, and a WATCH of nodes
  (``watch=true&resourceVersion=N``) streams every change after N, or 410 Gone when N is older than
  the changes it keeps, as the API server's watch cache does; ``add_nodes`` puts thousands at once.

It runs its own event loop in a thread, so synchronous code and other processes can talk to it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import json
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import yaml
from aiohttp import web
from kmock._internal import apps, enums, k8s_dicts, rendering

from tests.fakes.server_thread import ServerThread


@dataclass
class Logged:
    method: str
    path: str
    content_type: str
    body: Any
    at: float = field(default_factory=time.time)  # when the server received it


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int


@dataclass
class _Token:
    username: str
    audiences: list[str]
    node: str


@dataclass
class _Rules:
    faults: list[_Fault] = field(default_factory=list)
    tokens: dict[str, _Token] = field(default_factory=dict)
    log: list[Logged] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Merge patch, except that ``status.conditions`` merge by ``type`` as the API server does."""
    conditions = patch.get("status", {}).get("conditions")
    result = merge_patch(target, {k: v for k, v in patch.items() if k != "status"})
    if "status" in patch:
        status_rest = {k: v for k, v in patch["status"].items() if k != "conditions"}
        result["status"] = merge_patch(result.get("status", {}), status_rest)
    if conditions is not None:
        merged = {c["type"]: c for c in result.get("status", {}).get("conditions", [])}
        for c in conditions:
            merged[c["type"]] = {**merged.get(c["type"], {}), **c}
        result.setdefault("status", {})["conditions"] = list(merged.values())
    return result


NODE_EVENTS_KEPT = 20_000  # the node changes a watch may resume from (older: 410 Gone, list again)


class VigilKubeEmulator(kmock.KubernetesEmulator):
    rules: _Rules
    _node_events: list[tuple[int, str, dict[str, Any]]]
    _node_changed: asyncio.Condition | None = None
    _closing = False  # the server is stopping: open watches end
    _forgotten_upto = 0  # node changes up to this version are no longer kept: a watch from before is 410 Gone
    _listing: list[Any]  # the objects a LIST without selectors pages through (``_page``)
    _listing_stamp: tuple[Any, ...] | None = None  # which resource, namespace and objects it was made for
    _made = 0  # objects made by a POST (one made again in a deleted one's place leaves the count as it was)

    async def __call__(self, raw_request: web.BaseRequest) -> web.StreamResponse:
        if raw_request.path == "/api/v1/nodes" and raw_request.query.get("watch") in ("true", "1"):
            return await self._watch_nodes(raw_request)
        return await super().__call__(raw_request)

    def _node_event(self, kind: str, node: dict[str, Any]) -> None:
        """A change to a node, for its watchers (called with the emulator's lock held)."""
        events = self.__dict__.setdefault("_node_events", [])
        events.append((int(node["metadata"]["resourceVersion"]), kind, node))
        if len(events) > NODE_EVENTS_KEPT * 2:
            self._forgotten_upto = events[-NODE_EVENTS_KEPT - 1][0]
            del events[:-NODE_EVENTS_KEPT]
        if self._node_changed is not None:
            self._node_changed.notify_all()

    async def _watch_nodes(self, raw: web.BaseRequest) -> web.StreamResponse:
        with self.rules.lock:
            self.rules.log.append(Logged("WATCH", raw.path, "", dict(raw.query)))
        try:
            since = int(raw.query.get("resourceVersion") or 0)
            timeout_s = float(raw.query.get("timeoutSeconds") or 1800)
        except ValueError:
            return web.json_response({"kind": "Status", "code": 400, "message": "bad resourceVersion"}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        if self._node_changed is None:
            self._node_changed = asyncio.Condition(self._lock)
        self.__dict__.setdefault("_node_events", [])
        if since < self._forgotten_upto:
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": f"too old resource version: {since}"}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._closing:
            async with self._node_changed:
                events = self.__dict__["_node_events"]  # in the order of their versions
                ready = events[bisect.bisect_right(events, since, key=lambda e: e[0]) :]
                if not ready:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._node_changed.wait(), min(1.0, deadline - time.monotonic()))
                    continue
            for version, kind, obj in ready:
                await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                since = version
        return response

    async def _handle(self, request: rendering.Request) -> Any:
        path = request.url.path
        body = request.data if request.body else None
        method = str(request.method.value).upper()
        with self.rules.lock:
            self.rules.log.append(Logged(method, path, request.headers.get("Content-Type", ""), body))
            fault = next(
                (f for f in self.rules.faults if f.method == method and f.path.search(path) and f.times > 0),
                None,
            )
            if fault is not None:
                fault.times -= 1
        if fault is not None:
            raise kmock.KubernetesError(status=fault.status, reason="Injected", message=f"injected {fault.status}")
        if method == "POST" and path == "/apis/authentication.k8s.io/v1/tokenreviews":
            return web.json_response(self._review(body or {}), status=201)
        if request.resource is not None and method == "POST" and request.subresource == "eviction":
            return web.json_response(await self._evict(request), status=201)
        if request.resource is not None and request.name is not None and method in ("PATCH", "PUT"):
            # kmock merges PATCHes naively and routes no PUT: both are done here, as the API server does.
            return web.json_response(await self._update(request, body or {}))
        if request.resource is not None and request.resource.plural == "nodes" and request.name and method == "DELETE":
            return web.json_response(await self._delete_node(request))  # its watchers see it go
        if request.resource is not None and request.action == enums.action.CREATE and isinstance(request.data, dict):
            return web.json_response(await self._create(request, request.data))
        if request.resource is not None and request.action in (enums.action.FETCH, enums.action.LIST):
            # Served here rather than by kmock's reaction routing, which grows slower with every
            # request it has seen (it matters for the benchmark's thousands of requests).
            return web.json_response(await self._read(request))
        return await super()._handle(request)

    def _review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec") or {}
        with self.rules.lock:
            token = self.rules.tokens.get(spec.get("token", ""))
        wanted = spec.get("audiences") or ["https://kubernetes.default.svc"]
        status: dict[str, Any] = {"authenticated": False, "user": {}}
        if token is None:
            status["error"] = "[invalid bearer token, token lookup failed]"
        elif not set(wanted) & set(token.audiences):
            status["error"] = f"[invalid bearer token, token audiences {token.audiences} is invalid for {wanted}]"
        else:
            extra = {"authentication.kubernetes.io/pod-name": ["agent-x"]}
            if token.node:
                extra["authentication.kubernetes.io/node-name"] = [token.node]
            status = {
                "authenticated": True,
                "audiences": sorted(set(wanted) & set(token.audiences)),
                "user": {
                    "username": token.username,
                    "uid": "u-1",
                    "groups": ["system:serviceaccounts"],
                    "extra": extra,
                },
            }
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec, "status": status}

    async def _create(self, request: rendering.Request, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
        async with self._lock:
            if key in self.objects and not self.objects[key].deleted:
                raise kmock.KubernetesError(status=409, reason="AlreadyExists", message=f"{meta.get('name')} exists")
            meta["resourceVersion"] = self._next_version()
            self.objects[key] = body
            self._made += 1
            if request.resource.plural == "nodes":
                self._node_event("ADDED", body)
            await self._buses[request.resource].put({"type": "ADDED", "object": body})
            return body

    async def _delete_node(self, request: rendering.Request) -> dict[str, Any]:
        key = (request.resource, None, request.name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            gone = copy.deepcopy(self.objects[key].raw)
            gone["metadata"]["resourceVersion"] = self._next_version()
            self.objects[key].delete()
            self._node_event("DELETED", gone)
            await self._buses[request.resource].put({"type": "DELETED", "object": gone})
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": request.name}}

    async def _read(self, request: rendering.Request) -> dict[str, Any]:
        async with self._lock:
            if request.name is not None:
                key = (request.resource, request.namespace, request.name)
                if key not in self.objects or self.objects[key].deleted:
                    raise kmock.KubernetesObjectNotFoundError()
                found: dict[str, Any] = self.objects[key].raw
                return found
            limit = int(request.params.get("limit") or 0)
            if limit and not request.params.get("fieldSelector") and not request.params.get("labelSelector"):
                return self._page(request, limit)  # a page costs its own items, not the whole store's
            items = [
                o.raw
                for (r, ns, _), o in self.objects.items()
                if r == request.resource and (request.namespace is None or ns == request.namespace) and not o.deleted
            ]
        for selector in filter(None, request.params.get("fieldSelector", "").split(",")):
            path, _, value = selector.partition("=")
            items = [o for o in items if _field(o, path) == value]
        for requirement in _requirements(request.params.get("labelSelector", "")):
            items = [o for o in items if _matches(requirement, o["metadata"].get("labels") or {})]
        meta: dict[str, Any] = {"resourceVersion": str(self._version)}
        if limit := int(request.params.get("limit") or 0):  # pages: the continue token is where the next starts
            start = int(request.params.get("continue") or 0)
            if start + limit < len(items):
                meta |= {"continue": str(start + limit), "remainingItemCount": len(items) - start - limit}
            items = items[start : start + limit]
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items}

    def _page(self, request: rendering.Request, limit: int) -> dict[str, Any]:
        """One page of a LIST without selectors (called with the lock held). The continue token is an
        index into this resource's objects in the order they were made, kept while no object is
        made (a new one is appended; a deleted one is skipped, not removed): 100,000
        Nodes listed 500 at a time cost 200 pages' worth, not 200 passes over every object."""
        stamp = (request.resource, request.namespace, len(self.objects), self._made)
        if self._listing_stamp != stamp:
            self._listing = [
                o
                for (r, ns, _), o in self.objects.items()
                if r == request.resource and (request.namespace is None or ns == request.namespace)
            ]
            self._listing_stamp = stamp
        listing = self._listing
        start = int(request.params.get("continue") or 0)
        items: list[dict[str, Any]] = []
        end = start
        while end < len(listing) and len(items) < limit:
            if not listing[end].deleted:
                items.append(listing[end].raw)
            end += 1
        meta: dict[str, Any] = {"resourceVersion": str(self._version)}
        if end < len(listing):
            meta |= {"continue": str(end), "remainingItemCount": len(listing) - end}
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items}

    async def _update(self, request: rendering.Request, body: dict[str, Any]) -> dict[str, Any]:
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            current = self.objects[key].raw
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"].get("resourceVersion"):
                raise kmock.KubernetesError(
                    status=409,
                    reason="Conflict",
                    message="the object has been modified; please apply your changes to the latest version",
                )
            content_type = request.headers.get("Content-Type", "")
            if request.method.value.upper() == "PUT":
                new = copy.deepcopy(body)
            elif "strategic" in content_type:
                new = strategic_merge(current, body)
            else:
                new = merge_patch(current, body)
            new.setdefault("metadata", {})["resourceVersion"] = self._next_version()
            self.objects[key].history.append(k8s_dicts.ObjectVersion(new))
            if request.resource.plural == "nodes":
                self._node_event("MODIFIED", new)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": new})
            return new

    async def _evict(self, request: rendering.Request) -> dict[str, Any]:
        """The Eviction API: the pod goes (a PodDisruptionBudget's refusal is injected as a 429 fault)."""
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            raw = self.objects[key].raw
            self.objects[key].delete()
            await self._buses[request.resource].put({"type": "DELETED", "object": raw})
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    _version: int = 100

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)


_LABEL_REQUIREMENT = re.compile(r"^(?P<neg>!?)(?P<key>[A-Za-z0-9./_-]+)(?:(?P<op>==|=|!=)(?P<value>[A-Za-z0-9._-]*))?$")


def _requirements(selector: str) -> list[str]:
    """A label selector's requirements: split at the commas outside a set's parentheses."""
    return [r for r in re.split(r",(?![^()]*\))", selector) if r.strip()]


_SET_REQUIREMENT = re.compile(r"^(?P<key>[A-Za-z0-9./_-]+)\s+(?P<op>in|notin)\s+\((?P<values>[A-Za-z0-9._,\s-]*)\)$")


def _matches(requirement: str, labels: dict[str, str]) -> bool:
    """Label selectors as the API server reads them: equality-based (k=v, k==v, k!=v, k, !k) and
    set-based (k in (a,b), k notin (a,b))."""
    if s := _SET_REQUIREMENT.match(requirement.strip()):
        values = {v.strip() for v in s["values"].split(",") if v.strip()}
        inside = s["key"] in labels and labels[s["key"]] in values
        return inside if s["op"] == "in" else not inside
    m = _LABEL_REQUIREMENT.match(requirement.strip())
    if m is None or (m["neg"] and m["op"]):
        raise kmock.KubernetesError(
            status=400, reason="BadRequest", message=f"unable to parse requirement: {requirement!r}"
        )
    key, op, value = m["key"], m["op"], m["value"]
    if op is None:
        return (key in labels) != bool(m["neg"])
    return (labels.get(key) == value) == (op != "!=")


def _field(obj: dict[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


def _node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "annotations": {},
            "labels": dict(labels or {}),
        },
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


class KubeApiServer(ServerThread):
    """The emulator on 127.0.0.1 in a background thread, with a kubeconfig pointing at it."""

    what = "Kubernetes API emulator"

    def __init__(self) -> None:
        super().__init__()
        self.rules = _Rules()
        self.url = ""
        self.handler: VigilKubeEmulator | None = None

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        handler = VigilKubeEmulator()
        handler.rules = self.rules
        async with handler, apps.Server(handler) as server:
            self.handler = handler
            self.url = str(server.url).rstrip("/")
            try:
                yield
            finally:
                handler._closing = True  # the watches end within their next second

    # Test-side helpers (thread-safe enough: they run between the client's calls) ---------------

    def add_node(self, name: str, labels: dict[str, str] | None = None, **spec: Any) -> None:
        self.call(self._put_object(kmock.resource("v1/nodes"), None, name, _node(name, labels, **spec)))

    def add_nodes(self, names: list[str], labels: dict[str, str] | None = None) -> None:
        """Many nodes at once (a fleet of 100,000 for the scale benchmark)."""

        async def put_all() -> None:
            for name in names:
                await self._put_object(kmock.resource("v1/nodes"), None, name, _node(name, labels))

        self.call(put_all())

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        owner_kind: str = "ReplicaSet",
        labels: dict[str, str] | None = None,
        phase: str = "Running",
        container_statuses: list[dict[str, Any]] | None = None,
    ) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": "1",
                "labels": labels or {},
                "ownerReferences": [{"kind": owner_kind, "name": f"{name}-owner", "apiVersion": "apps/v1"}],
            },
            "spec": {"nodeName": node},
            "status": {"phase": phase, **({"containerStatuses": container_statuses} if container_statuses else {})},
        }
        self.call(self._put_object(kmock.resource("v1/pods"), namespace, name, pod))

    def node(self, name: str) -> dict[str, Any]:
        return self.call(self._get_object(kmock.resource("v1/nodes"), None, name))

    def objects_of(self, plural: str) -> list[dict[str, Any]]:
        assert self.handler is not None
        return [o.raw for (r, _, _), o in list(self.handler.objects.items()) if r.plural == plural and not o.deleted]

    def issue_token(
        self,
        node: str,
        username: str = "system:serviceaccount:vigil:vigil-agent",
        audiences: tuple[str, ...] = ("vigil",),
    ) -> str:
        """A pod-bound service-account token for a pod on ``node`` ("": a token without a node)."""
        token = f"sa-token-{len(self.rules.tokens)}-{node or 'none'}"
        with self.rules.lock:
            self.rules.tokens[token] = _Token(username, list(audiences), node)
        return token

    def revoke(self, token: str) -> None:
        """The token's pod is gone (or its service account deleted): reviews no longer accept it."""
        with self.rules.lock:
            self.rules.tokens.pop(token, None)

    def fail(self, method: str, path: str, status: int, times: int = 1) -> None:
        with self.rules.lock:
            self.rules.faults.append(_Fault(method, re.compile(path), status, times))

    def clear_faults(self) -> None:
        with self.rules.lock:
            self.rules.faults.clear()

    def requests(self, method: str | None = None, path: str = "") -> list[Logged]:
        with self.rules.lock:
            log = list(self.rules.log)  # copy under the lock, filter outside it: the server keeps serving
        return [r for r in log if (method is None or r.method == method) and re.search(path, r.path)]

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
                    "users": [{"name": "vigil", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "vigil"}}],
                    "current-context": "loopback",
                }
            )
        )
        return path

    async def _put_object(self, resource: Any, namespace: str | None, name: str, obj: dict[str, Any]) -> None:
        assert self.handler is not None
        self.handler.objects[resource, namespace, name] = obj

    async def _get_object(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any]:
        assert self.handler is not None
        raw: dict[str, Any] = self.handler.objects[resource, namespace, name].raw
        return copy.deepcopy(raw)
