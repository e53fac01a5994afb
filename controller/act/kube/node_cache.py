"""The cluster's Nodes as the API server has them, kept by a paged LIST and then a WATCH, in a thread.

What Vigil reads of a node every day comes from here, not from a LIST of every Node each time: the
labels (each node's failure domains, for the guard), what a quarantine is planned from (its
cordon, taints and Vigil's own annotations, with the resourceVersion the PATCH is conditional on),
and who else changed a quarantined node's cordon or taints (a repair asks every second). Only those
parts are kept (``trimmed``): a real Node is 5-20 KB, and 100,000 of them whole would cost
gigabytes. A read that was stale costs the writer a 409 Conflict and one GET, as before.

The watch resumes from the last resourceVersion it saw; 410 Gone (the API server no longer holds
changes that old) or a broken stream lists again, after a backoff. Until the first list is whole,
``synced`` is False and readers fall back to a GET.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any, cast

import structlog
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from controller.act.kube.plans import DOMAIN, Json

log = structlog.get_logger(__name__)

PAGE = 500  # Nodes per LIST page
WATCH_S = 300  # the server ends each watch after this; it is opened again from where it stopped


CORDON_FIELDS = ("f:unschedulable", "f:taints")


def trimmed(node: Json) -> Json:
    """The parts of a Node that Vigil reads: name, uid, resourceVersion, labels, Vigil's annotations,
    cordon and taints, and who last wrote the cordon or taints and when (its managedFields entries that
    touch them, cut to those fields: what tells a person's cordon after a quarantine). Label keys and
    values are interned (thousands of nodes share them). Pure."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels = {sys.intern(k): sys.intern(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(DOMAIN)}
    kept: Json = {
        "metadata": {
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
    }
    if writers := cordon_writers(meta.get("managedFields") or []):
        kept["metadata"]["managedFields"] = writers
    return kept


def cordon_writers(entries: list[Json]) -> list[Json]:
    """The managedFields entries that own a node's cordon or taints, each cut to its manager, time
    and those fields. Pure."""
    kept = []
    for entry in entries:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if owned := {f: spec[f] for f in CORDON_FIELDS if f in spec}:
            kept.append({"manager": entry.get("manager"), "time": entry.get("time"), "fieldsV1": {"f:spec": owned}})
    return kept


class NodeCache:
    def __init__(self, core: client.CoreV1Api, timeout_s: float = 10.0, retry_s: float = 5.0) -> None:
        self._core = core
        self._timeout = timeout_s
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._nodes: dict[str, Json] = {}
        # Each node whose labels changed since label_changes was last asked (None: the node went);
        # _relisted: a list replaced every node since, so its reader compares them all.
        self._label_changes: dict[str, dict[str, str] | None] = {}
        self._relisted = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)
        self._resp: Any = None  # the watch's open response
        self.synced = False
        self.lists = 0  # full LISTs made (one at start, and one after each lost watch)
        self.events = 0  # changes received by the watch
        self.losses = 0  # watches lost (the API server away, a broken stream)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:  # the watch's blocking read ends now, not at the server's timeout
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def get(self, name: str) -> Json | None:
        with self._lock:
            return self._nodes.get(name)

    def read(self, name: str) -> Json | None:
        """The node as the watch last showed it, while the watch is up (None: not synced, or no such
        node: read it from the API server)."""
        return self.get(name) if self.synced else None

    def nodes(self) -> list[Json]:
        """Every node as the watch last showed it (trimmed; do not change them)."""
        with self._lock:
            return list(self._nodes.values())

    def labels(self) -> dict[str, dict[str, str]]:
        with self._lock:
            return {name: node["metadata"]["labels"] for name, node in self._nodes.items()}

    def label_changes(self) -> tuple[dict[str, dict[str, str]], list[str]] | None:
        """The labels of each node whose labels changed (or that joined) since the last call, and the
        nodes gone; None where a list replaced every node since, or on the first call: compare the whole
        of ``labels()`` then. One reader (the controller's upkeep): a call takes what it returns."""
        with self._lock:
            changes, self._label_changes = self._label_changes, {}
            relisted, self._relisted = self._relisted, False
        if relisted:
            return None
        return {n: labels for n, labels in changes.items() if labels is not None}, [
            n for n, labels in changes.items() if labels is None
        ]

    # The thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
            except Exception as exc:  # the API server away, a broken stream: list again after a pause
                # Stale until listed again: readers fall back to a GET and a LIST (``synced``), and the
                # controller's vigil_controller_node_watch_up says so.
                self.synced, self.losses = False, self.losses + 1
                log.warning("node_watch_lost", error=repr(exc)[:300], losses=self.losses)
                version = ""
                self._stop.wait(self._retry_s)

    def _list(self) -> str:
        nodes: dict[str, Json] = {}
        version = ""
        for items, page_version in node_pages(self._core, self._timeout):
            for item in items:
                kept = trimmed(item)
                nodes[kept["metadata"]["name"]] = kept
            version = page_version  # the last page's: where the watch starts
        with self._lock:
            self._nodes = nodes
            self._label_changes, self._relisted = {}, True
        self.synced, self.lists = True, self.lists + 1
        log.info("nodes_listed", nodes=len(nodes), resource_version=version)
        return str(version)

    def _watch(self, version: str) -> str:
        """Follow changes from ``version`` until the server ends the watch; returns where it stopped
        ("" when it must list again)."""
        resp: Any = self._core.list_node(
            watch=True,
            resource_version=version,
            timeout_seconds=WATCH_S,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(self._timeout, WATCH_S + 30),
        )
        self._resp = resp
        try:
            for event in _events(resp):
                if self._stop.is_set():
                    break
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    log.info("node_watch_expired", status=obj.get("code"), message=str(obj.get("message"))[:200])
                    return ""
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                name = (obj.get("metadata") or {}).get("name", "")
                self.events += 1
                node = None if kind == "DELETED" else trimmed(obj)
                with self._lock:
                    self._keep(name, node)
        finally:
            self._resp = None
            resp.release_conn()
        return version

    def _keep(self, name: str, node: Json | None) -> None:
        """One watch event's node (None: deleted), with the lock held; a node whose labels did not change
        keeps its labels' object (most events are cordons and taints), one whose labels did is noted."""
        old = self._nodes.pop(name, None) if node is None else self._nodes.get(name)
        if node is None:
            if old is not None:
                self._label_changes[name] = None
            return
        labels = node["metadata"]["labels"]
        if old is not None and old["metadata"]["labels"] == labels:
            node["metadata"]["labels"] = old["metadata"]["labels"]
        else:
            self._label_changes[name] = labels
        self._nodes[name] = node


def node_pages(core: client.CoreV1Api, timeout_s: float) -> Iterator[tuple[list[Json], str]]:
    """Every Node, a page of ``PAGE`` at a time (never one response with all of them: 100,000 real
    Nodes are gigabytes): each page's Nodes as parsed JSON, with the list's resourceVersion."""
    token = ""
    while True:
        resp = core.list_node(limit=PAGE, _continue=token or None, _preload_content=False, _request_timeout=timeout_s)
        page = json.loads(cast(Any, resp).data)
        meta = page.get("metadata") or {}
        yield page.get("items") or [], str(meta.get("resourceVersion", ""))
        token = meta.get("continue") or ""
        if not token:
            return


def _events(resp: Any) -> Iterator[Json]:
    for line in iter_resp_lines(resp):
        if line.strip():
            yield json.loads(line)
