"""What a quarantine or a release writes to a Node: pure functions from the Node (as the API server
returns it, a JSON dict) to the patches to send. No I/O, no ``kubernetes`` import.

A quarantine is, on the Node:
- a ``NoSchedule`` taint ``vigil.dev/quarantined=<reason>`` (the scheduler keeps new pods away; the
  agent's DaemonSet tolerates it so Vigil keeps watching the node);
- ``spec.unschedulable: true`` (the cordon ``kubectl get nodes`` shows);
- annotations recording that Vigil did it: incident, reason, time, and whether the node was
  already cordoned before (by a person), so that a release puts back exactly what was there;
- a ``VigilQuarantined`` node condition (status subresource), and a Kubernetes Event.

The node write carries the ``resourceVersion`` it was computed from: if anything changed the node
in between, the API server answers 409 and the actuator reads the node again and recomputes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

DOMAIN = "vigil.dev"
TAINT_KEY = f"{DOMAIN}/quarantined"
CONDITION_TYPE = "VigilQuarantined"
OWNER = f"{DOMAIN}/quarantined-by"
INCIDENT = f"{DOMAIN}/incident"
REASON = f"{DOMAIN}/reason"
AT = f"{DOMAIN}/quarantined-at"
WAS_UNSCHEDULABLE = f"{DOMAIN}/was-unschedulable"
SPEC_AFTER = f"{DOMAIN}/spec-after"  # a fingerprint of the cordon and taints as the quarantine left them
OWNER_VALUE = "vigil"
FIELD_MANAGER = "vigil"  # the name Vigil's writes carry in the node's managedFields
ANNOTATIONS = (OWNER, INCIDENT, REASON, AT, WAS_UNSCHEDULABLE, SPEC_AFTER)

Json = dict[str, Any]


def rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def taint_value(reason: str) -> str:
    """A label value (≤ 63 characters of [A-Za-z0-9._-], alphanumeric at both ends) naming the reason."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", reason)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value) or "fault"


def _annotations(node: Json) -> dict[str, str]:
    return dict(node.get("metadata", {}).get("annotations") or {})


def owner_incident(node: Json) -> str | None:
    """The incident under which Vigil quarantined this node, or None if Vigil did not."""
    annotations = _annotations(node)
    if annotations.get(OWNER) != OWNER_VALUE:
        return None
    return annotations.get(INCIDENT, "")


@dataclass(frozen=True, slots=True)
class QuarantinePlan:
    node_patch: Json | None  # None: the node already carries this incident's quarantine
    status_patch: Json
    event: Json


def plan_quarantine(node: Json, incident_id: str, reason: str, now: float, namespace: str) -> QuarantinePlan | str:
    """The writes that quarantine ``node``; a string (the other incident) when Vigil already did, for another."""
    owner = owner_incident(node)
    if owner is not None and owner != incident_id:
        return owner
    status_patch = {"status": {"conditions": [_condition("True", "VigilQuarantine", reason, now)]}}
    event = _event(node, incident_id, "VigilQuarantine", f"quarantined by Vigil: {reason}", "Warning", now, namespace)
    if owner == incident_id:
        return QuarantinePlan(None, status_patch, event)  # finish what an interrupted attempt began
    spec = node.get("spec", {})
    taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_KEY]
    taints.append({"key": TAINT_KEY, "value": taint_value(reason), "effect": "NoSchedule", "timeAdded": rfc3339(now)})
    node_patch = {
        "metadata": {
            "resourceVersion": node["metadata"].get("resourceVersion"),
            "annotations": {
                OWNER: OWNER_VALUE,
                INCIDENT: incident_id,
                REASON: reason[:1024],
                AT: rfc3339(now),
                WAS_UNSCHEDULABLE: "true" if spec.get("unschedulable") else "false",
                SPEC_AFTER: spec_fingerprint(True, taints),
            },
        },
        "spec": {"unschedulable": True, "taints": taints},
    }
    return QuarantinePlan(node_patch, status_patch, event)


def spec_fingerprint(unschedulable: bool, taints: list[Json]) -> str:
    """What the scheduler sees of a node besides Vigil's own taint: the cordon and the other taints."""
    others = sorted(
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in taints if t.get("key") != TAINT_KEY
    )
    return hashlib.sha1(f"{bool(unschedulable)}|{'|'.join(others)}".encode()).hexdigest()[:16]


def changed_since_quarantine(node: Json) -> str:
    """Who or what changed the node's cordon or taints since Vigil quarantined it ('' when nobody):
    another writer of ``spec`` in its managedFields after the quarantine, or a cordon and taints
    that differ from what the quarantine left (older quarantines, without the fingerprint: '')."""
    annotations = _annotations(node)
    try:
        since = parse_rfc3339(annotations.get(AT, ""))
    except ValueError:
        since = None
    for entry in node.get("metadata", {}).get("managedFields") or []:
        spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if entry.get("manager") in (FIELD_MANAGER, None) or not ({"f:unschedulable", "f:taints"} & set(spec)):
            continue
        try:
            at = parse_rfc3339(entry.get("time", ""))
        except ValueError:
            continue
        if since is not None and at >= since:
            return f"{entry['manager']} changed its cordon or taints at {entry['time']}"
    expected = annotations.get(SPEC_AFTER)
    spec = node.get("spec", {})
    if expected and spec_fingerprint(bool(spec.get("unschedulable")), spec.get("taints") or []) != expected:
        return "someone changed its cordon or taints after Vigil quarantined it"
    return ""


@dataclass(frozen=True, slots=True)
class ReleasePlan:
    node_patch: Json
    status_patch: Json
    event: Json
    keeps_cordon: bool  # a person had cordoned the node before Vigil, or changed it since: it stays cordoned
    changed_by: str = ""  # who or what changed it since the quarantine ('' when nobody)


def plan_release(node: Json, reason: str, now: float, namespace: str) -> ReleasePlan | None:
    """The writes that undo Vigil's quarantine; None when Vigil did not quarantine this node."""
    incident = owner_incident(node)
    if incident is None:
        return None
    changed_by = changed_since_quarantine(node)
    keeps_cordon = _annotations(node).get(WAS_UNSCHEDULABLE) == "true" or bool(changed_by)
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != TAINT_KEY]
    node_patch = {
        "metadata": {
            "resourceVersion": node["metadata"].get("resourceVersion"),
            "annotations": dict.fromkeys(ANNOTATIONS),  # null removes a key in a merge patch
        },
        "spec": {"unschedulable": keeps_cordon or None, "taints": taints or None},
    }
    status_patch = {"status": {"conditions": [_condition("False", "VigilReleased", reason, now)]}}
    event = _event(
        node, f"{incident}-release", "VigilRelease", f"released by Vigil: {reason}", "Normal", now, namespace
    )
    return ReleasePlan(node_patch, status_patch, event, keeps_cordon, changed_by)


def found_quarantine(node: Json) -> tuple[str, str, float] | None:
    """(incident, reason, when) for a node Vigil quarantined, read back from its annotations."""
    incident = owner_incident(node)
    if incident is None:
        return None
    annotations = _annotations(node)
    try:
        at = parse_rfc3339(annotations.get(AT, ""))
    except ValueError:
        at = 0.0
    return incident, annotations.get(REASON, ""), at


def _condition(status: str, reason: str, message: str, now: float) -> Json:
    return {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastHeartbeatTime": rfc3339(now),
        "lastTransitionTime": rfc3339(now),
    }


def event_name(node: str, incident_id: str) -> str:
    """Deterministic, so a repeated attempt meets 409 AlreadyExists instead of a second Event."""
    return f"{node}.vigil-{hashlib.sha1(incident_id.encode()).hexdigest()[:12]}"


def _event(node: Json, incident_id: str, reason: str, message: str, kind: str, now: float, namespace: str) -> Json:
    meta = node["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(meta["name"], incident_id), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta.get("uid", "")},
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": "vigil-controller"},
        "reportingComponent": f"{DOMAIN}/controller",
        "firstTimestamp": rfc3339(now),
        "lastTimestamp": rfc3339(now),
        "count": 1,
    }
