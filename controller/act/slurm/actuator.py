"""The Slurm actuator: a quarantine drains the node through slurmctld with Vigil's reason, a
release resumes only a drain that is still Vigil's, and a new leader adopts Vigil's drains from
Slurm itself (the reason is the record, so drains survive a controller failover as cordons do).

A drained node with a job on it stays DRAIN+ALLOCATED (or MIXED) until the job ends: the job is
told to checkpoint and leave by the job monitor, not by Slurm; a repair waits until the node is
DRAIN+IDLE (``held_by_others``). Vigil's node names map to Slurm's through ``names`` (the same
name where the map says nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import structlog

from controller.act.actuators import ForeignDrain, FoundQuarantine, Release, SelectionError
from controller.act.slurm.client import Slurm, SlurmUnavailable
from controller.act.slurm.plans import (
    AlreadyOurs,
    HeldByOther,
    SlurmAnswerError,
    classify,
    held_by_others,
    matches,
    plan_quarantine,
    plan_release,
    vigil_drain,
)
from controller.vocab.actions import Drain, Quarantine

log = structlog.get_logger(__name__)
T = TypeVar("T")

# Slurm's job states in which the job holds its nodes.
_HOLDING = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED"})


class SlurmActuator:
    quarantine_means = "a drain in Slurm, with Vigil's reason"

    def __init__(
        self,
        slurm: Slurm,
        names: dict[str, str] | None = None,
        labels: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self._slurm = slurm
        self._to_slurm = dict(names or {})
        self._to_vigil = {s: v for v, s in self._to_slurm.items()}
        self._labels = labels or {}  # the configuration's node_labels (failure domains), beside Slurm's

    def slurm_name(self, node: str) -> str:
        return self._to_slurm.get(node, node)

    def vigil_name(self, node: str) -> str:
        return self._to_vigil.get(node, node)

    # Quarantine and release -------------------------------------------------------------------

    def quarantine(self, action: Quarantine) -> str:
        name = self.slurm_name(action.node)
        plan = plan_quarantine(self._slurm.node(name), action.incident_id, action.reason)
        if isinstance(plan, AlreadyOurs):
            return f"already drained by Vigil (incident {plan.incident_id}); left as it is"
        if isinstance(plan, HeldByOther):
            log.warning("slurm_drained_by_others", node=action.node, held=plan.why, incident=action.incident_id)
            return f"already drained, not by Vigil ({plan.why}): its reason is left as it is"
        self._slurm.drain(name, plan.reason)
        return f"drained in Slurm ({plan.reason})"

    def release(self, node: str, reason: str) -> Release:
        current = self._slurm.node(self.slurm_name(node))
        why_not = plan_release(current)
        if why_not is not None:
            return Release(False, why_not)
        self._slurm.resume(current.name)
        return Release(True, f"resumed in Slurm (was {current.describe()}, {current.reason})")

    def drain(self, action: Drain) -> str:
        return "nothing to evict: Slurm lets the running job end (the job is asked to checkpoint and leave)"

    def adopt(self) -> list[FoundQuarantine]:
        found = []
        for node in self._slurm.nodes():
            ours = vigil_drain(node.reason) if node.drained else None
            if ours is not None:
                found.append(FoundQuarantine(self.vigil_name(node.name), ours[0], node.reason, node.reason_at))
        return found

    def foreign_drains(self) -> list[ForeignDrain]:
        """Every drain that is not Vigil's: a health check's, a person's, Slurm's own."""
        return [
            ForeignDrain(self.vigil_name(n.name), n.reason, n.reason_by, n.reason_at, classify(n).value, n.describe())
            for n in self._slurm.nodes()
            if n.drained and vigil_drain(n.reason) is None
        ]

    def node_labels(self) -> dict[str, dict[str, str]]:
        labels = {node: dict(values) for node, values in self._labels.items()}
        for node in self._slurm.nodes():
            mine = labels.setdefault(self.vigil_name(node.name), {})
            mine.update({f"slurm.partition/{p}": "true" for p in node.partitions})
            mine.update({f"slurm.feature/{f}": "true" for f in node.features})
        return labels

    def close(self) -> None:
        self._slurm.close()

    # Choosing nodes (sweeps) -------------------------------------------------------------------

    def nodes_matching(self, selector: str) -> list[str]:
        nodes = self._read(f"Slurm selector {selector!r}", self._slurm.nodes)
        try:
            chosen = [n.name for n in nodes if matches(n, selector)]
        except ValueError as exc:
            raise SelectionError(f"Slurm selector {selector!r}: {exc}") from None
        return sorted(self.vigil_name(n) for n in chosen)

    def job_nodes(self, namespace: str, job: str) -> list[str]:
        """The nodes Slurm job ``job`` holds (``namespace`` means nothing to Slurm)."""
        if not job.isdigit():
            raise SelectionError(f"Slurm job {job!r}: a job id is a number")
        jobs = self._read(f"Slurm job {job}", self._slurm.jobs)
        held = [j for j in jobs if j.id == job and j.state in _HOLDING and (j.nodes or j.hosts)]
        if not held:
            raise SelectionError(f"Slurm job {job} holds no nodes (not running, or unknown to slurmctld)")
        hosts = self._read(f"Slurm job {job}", lambda: self._slurm.hosts(held[0]))
        return sorted(self.vigil_name(h) for h in hosts)

    @staticmethod
    def _read(what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except (SlurmUnavailable, SlurmAnswerError) as exc:
            raise SelectionError(f"{what}: {exc}") from None

    # What a repair asks (controller.repairs) --------------------------------------------------

    def held_by_others(self, node: str) -> str:
        return held_by_others(self._slurm.node(self.slurm_name(node)))

    def set_labels(self, node: str, labels: dict[str, str | None]) -> dict[str, str | None]:
        """Slurm nodes have no labels to pause the GPU Operator with: nothing to set or restore."""
        return {key: None for key in labels}

    def operand_pods(self, node: str) -> list[str]:
        return []  # no GPU Operator pods on a Slurm node
