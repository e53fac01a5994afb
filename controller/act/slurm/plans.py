"""What a drain, a resume and a reading of Slurm mean, decided without Slurm. Pure.

Vigil drains a node with the reason ``vigil:<incident>:<class>`` (``class``: the quarantine's reason
as a short slug). That reason is the ownership record, as the annotations are on Kubernetes: a
release resumes a node only while its reason is still Vigil's, so a node a person (or NHC, or Slurm
itself) drained, before Vigil or after it, is never resumed by Vigil.

Drains made by others are classified the way operators of large Slurm fleets read them: a *node*
problem (hardware, a health check, Slurm finding the node unresponsive or unable to kill a task)
or a *user* problem (a job left the node in a bad state: out of memory, a task that would not die
is the node's, not the user's; soperator marks these ``[user_problem]``), or a person's own
reason, which is kept as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

Json = dict[str, Any]

PREFIX = "vigil:"
_CLASS_CHARS = 48  # Slurm keeps the whole reason; sinfo's default column shows 20: the prefix and incident

# The states in which a node runs (or is finishing) a job: a drained node in one of them is
# "draining", and is only safe to work on once it is idle.
_BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


class DrainKind(Enum):
    VIGIL = "vigil"  # Vigil's own drain
    NODE = "node_problem"  # the hardware or the node's software: a health check, Slurm's own findings
    USER = "user_problem"  # a job left the node unusable (soperator's tag, a person's note)
    PERSON = "person"  # a reason nobody classified: a person's, kept as written and respected


# A node's base state, where later releases (24.11 seen) write the state and its flags as one list.
_BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as Slurm shows it (``sinfo --json`` of 22.05, ``scontrol --json show nodes`` and
    slurmrestd of later releases, ``scontrol show node -o``)."""

    name: str
    state: str  # the base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, COMPLETING, NOT_RESPONDING, ...
    reason: str = ""
    reason_by: str = ""
    reason_at: float = 0.0
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        """Drained or draining: Slurm places no new job here."""
        return "DRAIN" in self.flags

    @property
    def busy(self) -> bool:
        """A job runs here, or is finishing."""
        return self.state in _BUSY or bool(self.flags & _BUSY)

    def describe(self) -> str:
        """Slurm's own spelling of the state: IDLE+DRAIN, ALLOCATED+DRAIN, ..."""
        return "+".join([self.state, *sorted(self.flags)])


class SlurmAnswerError(ValueError):
    """Slurm answered something that does not read as expected (its errors, or another format)."""


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job as ``squeue --json`` or slurmrestd shows it."""

    id: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: str  # the host list it holds (``gpu-[01-03]``), '' when none
    hosts: tuple[str, ...] = ()  # the same, one name each, where the answer lists them (later releases)


# Slurm's words for a request that can never succeed as written (its commands' and slurmrestd's).
_PERMANENT = ("invalid node name", "invalid node state", "access/permission denied", "invalid user")


def refused_for_good(said: str) -> bool:
    """Whether Slurm's answer refuses the request itself (trying again changes nothing)."""
    return any(word in said.lower() for word in _PERMANENT)


def errors_of(doc: Json) -> str:
    """Slurm's own errors in an answer ('' when none)."""
    errors = doc.get("errors") or []
    return "; ".join(_error(e) for e in errors)


def _error(e: object) -> str:
    if not isinstance(e, dict):
        return str(e)
    words = [str(e[k]) for k in ("description", "error") if e.get(k) and e.get(k) != "No error"]
    return ": ".join(words) or str(e)


def parse_nodes(doc: Json) -> list[SlurmNode]:
    """The nodes of an answer (``nodes``, as Slurm 22.05's ``sinfo --json`` and later releases'
    ``scontrol --json`` and slurmrestd write them); raises SlurmAnswerError on Slurm's own errors."""
    if errors := errors_of(doc):
        raise SlurmAnswerError(errors)
    try:
        return [_node(n) for n in doc["nodes"]]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SlurmAnswerError(f"not a node list as Slurm writes it ({exc!r})") from None


def _node(n: Json) -> SlurmNode:
    state, flags = _state(n["state"])
    flags |= frozenset(str(f).upper() for f in n.get("state_flags") or [])
    features = n.get("active_features") or n.get("features") or ""
    if isinstance(features, str):
        features = [f for f in features.split(",") if f]
    return SlurmNode(
        name=str(n["name"]),
        state=state,
        flags=flags,
        reason=str(n.get("reason") or ""),
        reason_by=str(n.get("reason_set_by_user") or ""),
        reason_at=_number(n.get("reason_changed_at")),
        partitions=tuple(str(p) for p in n.get("partitions") or ()),
        features=tuple(str(f) for f in features),
    )


def _state(raw: object) -> tuple[str, frozenset[str]]:
    """(base state, flags): 22.05 writes the base state alone (its flags apart); later releases one
    list, the base state among the flags (``["IDLE", "DRAIN"]``)."""
    if not isinstance(raw, list):
        return str(raw).upper(), frozenset()
    words = [str(w).upper() for w in raw]
    base = next((w for w in words if w in _BASE_STATES), words[0] if words else "UNKNOWN")
    return base, frozenset(w for w in words if w != base)


def _number(raw: object) -> float:
    """A number as 22.05 writes it, or as later releases do (``{"set": true, "number": N}``)."""
    if isinstance(raw, dict):
        return float(raw.get("number") or 0) if raw.get("set", True) else 0.0
    return float(raw) if isinstance(raw, (int, float, str)) and raw != "" else 0.0


def parse_jobs(doc: Json) -> list[SlurmJob]:
    """The jobs of a ``squeue --json`` or slurmrestd answer; raises SlurmAnswerError on Slurm's errors."""
    if errors := errors_of(doc):
        raise SlurmAnswerError(errors)
    try:
        return [_job(j) for j in doc["jobs"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise SlurmAnswerError(f"not a job list as Slurm writes it ({exc!r})") from None


def _job(j: Json) -> SlurmJob:
    state, _ = _state(j.get("job_state") or "")
    resources = j.get("job_resources")
    nodes = resources.get("nodes") if isinstance(resources, dict) else None  # 22.05: a host list, not this
    allocation = nodes.get("allocation") if isinstance(nodes, dict) else None
    hosts = tuple(str(a["name"]) for a in allocation or () if isinstance(a, dict) and a.get("name"))
    return SlurmJob(str(j["job_id"]), state, str(j.get("nodes") or ""), hosts)


_REASON_TAIL = re.compile(r" \[(?P<by>[^@\]]*)@(?P<at>[0-9T:-]+)\]$")


def parse_show_node(line: str, to_epoch: Callable[[str], float]) -> SlurmNode:
    """One node from ``scontrol show node -o NAME`` (one line of KEY=VALUE; the reason, which may
    hold spaces and '=', comes last as ``Reason=TEXT [USER@TIME]``); ``to_epoch`` reads TIME, which
    Slurm writes in the controller's local time. Raises SlurmAnswerError for another answer."""
    head, _, reason = line.strip().partition(" Reason=")
    fields = dict(re.findall(r"(\w+)=(\S*)", head))
    if "NodeName" not in fields or "State" not in fields:
        raise SlurmAnswerError(f"scontrol show node: not a node as Slurm writes it: {line[:200]!r}")
    state, *flags = fields["State"].upper().split("+")
    by, at = "", 0.0
    if tail := _REASON_TAIL.search(reason):
        reason, by, at = reason[: tail.start()], tail["by"], to_epoch(tail["at"])
    features = fields.get("ActiveFeatures", "")
    return SlurmNode(
        name=fields["NodeName"],
        state=state,
        flags=frozenset(flags),
        reason=reason,
        reason_by=by,
        reason_at=at,
        partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p),
        features=tuple(f for f in features.split(",") if f and features != "(null)"),
    )


def reason_class(reason: str) -> str:
    """The quarantine's reason as a short slug of [a-z0-9._-] (never a colon: it ends Vigil's reason)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", reason.lower())[:_CLASS_CHARS]
    return slug.strip("-._") or "fault"


def drain_reason(incident_id: str, reason: str) -> str:
    """The reason Vigil drains with: ``vigil:<incident>:<class>``."""
    return f"{PREFIX}{incident_id}:{reason_class(reason)}"


def vigil_drain(reason: str) -> tuple[str, str] | None:
    """(incident, class) of a reason Vigil wrote, or None for anyone else's."""
    if not reason.startswith(PREFIX):
        return None
    incident, colon, klass = reason[len(PREFIX) :].rpartition(":")
    if not colon or not incident:
        return None
    return incident, klass


# What Slurm itself writes, and what health checks write, read as the node's problem. Lower case,
# matched as words anywhere in the reason.
_NODE_WORDS = (
    "not responding",
    "kill task failed",
    "node unexpectedly rebooted",
    "low realmemory",
    "low tmpdisk",
    "low socket",
    "health check",
    "healthcheck",
    "nhc",
    "gpu",
    "xid",
    "ecc",
    "nvlink",
    "infiniband",
    "hca",
    "prolog error",
    "epilog error",
    "batch job complete failure",
    "duplicate jobid",
    "[node_problem]",
    "vigil check",  # vigil check --slurm-drain, run by slurmd as its health check, prolog or epilog
)
_USER_WORDS = ("[user_problem]", "user problem", "job oom", "user job")


def classify(node: SlurmNode) -> DrainKind:
    """Whose problem a drain says it is. Pure."""
    if vigil_drain(node.reason) is not None:
        return DrainKind.VIGIL
    text = node.reason.lower()
    if any(w in text for w in _USER_WORDS):
        return DrainKind.USER
    if any(w in text for w in _NODE_WORDS):
        return DrainKind.NODE
    return DrainKind.PERSON


@dataclass(frozen=True, slots=True)
class Drain:
    reason: str  # drain with this reason


@dataclass(frozen=True, slots=True)
class AlreadyOurs:
    incident_id: str  # Vigil drained it already (this incident or another)


@dataclass(frozen=True, slots=True)
class HeldByOther:
    why: str  # drained by someone else: left as it is (their reason is theirs to clear)


QuarantinePlan = Drain | AlreadyOurs | HeldByOther


def plan_quarantine(node: SlurmNode, incident_id: str, reason: str) -> QuarantinePlan:
    """Drain the node, unless it is drained already: by Vigil (nothing to do) or by someone else,
    whose reason stays (overwriting it would make the drain Vigil's, to be resumed by Vigil)."""
    if not node.drained:
        return Drain(drain_reason(incident_id, reason))
    ours = vigil_drain(node.reason)
    if ours is not None:
        return AlreadyOurs(ours[0])
    return HeldByOther(_whose(node))


def plan_release(node: SlurmNode) -> str | None:
    """None: resume it (Vigil's drain); otherwise why it is left as it is."""
    if not node.drained:
        return f"not drained ({node.describe()}): left as it is"
    if vigil_drain(node.reason) is None:
        return f"drained by someone else ({_whose(node)}): left as it is"
    return None


def held_by_others(node: SlurmNode) -> str:
    """Why a repair must not touch the node yet ('' when it may): a job still runs on it, or the
    drain is no longer Vigil's."""
    if node.drained and vigil_drain(node.reason) is None:
        return f"drained by someone else: {_whose(node)}"
    if node.busy:
        return f"a job still runs on it ({node.describe()}): waiting for DRAIN+IDLE"
    return ""


def _whose(node: SlurmNode) -> str:
    by = f" by {node.reason_by}" if node.reason_by else ""
    return f"{node.reason or 'no reason given'!r}{by}, {classify(node).value}"


def matches(node: SlurmNode, selector: str) -> bool:
    """``partition=P``, ``feature=F`` or ``state=S``, comma-separated (all must hold). Raises
    ValueError naming a term it does not know."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        key, eq, value = term.partition("=")
        if not eq or not value:
            raise ValueError(f"{term!r}: expected partition=P, feature=F or state=S")
        if key == "partition":
            ok = value in node.partitions
        elif key == "feature":
            ok = value in node.features
        elif key == "state":
            ok = value.upper() in {node.state, *node.flags}
        else:
            raise ValueError(f"{key!r}: a Slurm selector knows partition, feature and state")
        if not ok:
            return False
    return True
