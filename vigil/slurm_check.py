"""``vigil check NAME --slurm-drain``: a check as Slurm's ``HealthCheckProgram``, prolog or epilog.

Slurm runs these on the node itself. A check that FAILs drains the node, the way LBNL NHC does,
with a reason Slurm shows in ``sinfo -R`` and that Vigil's controller reads back as the node's
problem: ``vigil check: NAME FAIL: <the check's reason>``. That is not a drain of the controller's
(its reason does not start ``vigil:``): it stays until a person, or a passing certification they
ask for, resumes the node. Exit codes, for Slurm: 0 OK; 1 FAIL (a prolog's failure requeues the
job Slurm was about to start, and the node is already drained with the real reason, not Slurm's
"Prolog error"); a check that cannot judge (UNKNOWN) exits 0 unless ``--strict``: a check that
could not run says nothing against the node, and a prolog must not fail a job for it.
"""

from __future__ import annotations

import os
import socket

from checks.result import CheckResult, Verdict
from controller.act.actuators import PermanentActionError
from controller.act.slurm.client import SlurmCommands, SlurmUnavailable

PREFIX = "vigil check"
_REASON_CHARS = 200


def drain_reason(result: CheckResult) -> str:
    """The reason the node is drained with. Pure."""
    reason = " ".join(result.reason.split())  # one line: scontrol takes the rest of the argument
    return f"{PREFIX}: {result.check} {result.verdict.value}: {reason}"[:_REASON_CHARS]


def slurm_exit_code(verdict: Verdict, strict: bool) -> int:
    """Slurm's reading: only a FAIL (or, ``strict``, an UNKNOWN) fails the prolog. Pure."""
    if verdict is Verdict.FAIL or (strict and verdict is Verdict.UNKNOWN):
        return verdict.exit_code
    return 0


def this_node() -> str:
    """Slurm's name for this node: ``SLURMD_NODENAME`` where slurmd set it (prolog, epilog,
    HealthCheckProgram), else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def drain_node(node: str, reason: str, commands: SlurmCommands | None = None) -> str:
    """Drain the node in Slurm (the controller's own ``scontrol update``); returns '' when done, else
    what went wrong (said, never raised: the check's verdict stands either way)."""
    try:
        (commands or SlurmCommands(timeout_s=30.0)).drain(node, reason)
    except (PermanentActionError, SlurmUnavailable) as exc:
        return f"the drain was not made: {exc}"
    return ""
