"""Pages only when hands are needed. Pure.

With remediation on, a quarantine whose repair a machine can try is not paged when it is made:
the repair pages a person if it reaches "replace" (with what it tried), and a node repaired and
certified is one line in the day's digest thread. A quarantine held by a guardrail, a dry run, or
one whose ladder starts at "replace" is paged as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.repairs.config import RemediationConfig
from controller.repairs.ladder import Fault, OwnLadder, Step, plan_ladder
from controller.vocab.actions import Action, Page, Quarantine
from controller.vocab.policy import Severity
from vigil_core.signals import Signal

DIGEST_PREFIX = "digest-"  # the day's digest "incident": a thread of repairs, never a page


def repairable(signal: Signal, config: RemediationConfig, own_ladder: OwnLadder = lambda fault: None) -> bool:
    """Whether a machine can try to repair what this signal found."""
    fault = Fault(signal.kind, signal.code, signal.message)
    return plan_ladder([fault], config.steps, own_ladder)[0] is not Step.REPLACE


def defer_pages(
    signal: Signal,
    actions: Sequence[Action],
    held: frozenset[str],
    config: RemediationConfig,
    own_ladder: OwnLadder = lambda fault: None,
) -> tuple[Action, ...]:
    """The decision's actions, less the quarantine's page when the repair will page if it must."""
    if not config.enabled or "QUARANTINE" in held:
        return tuple(actions)
    quarantines = any(isinstance(a, Quarantine) and not a.dry_run for a in actions)
    if not quarantines or not repairable(signal, config, own_ladder):
        return tuple(actions)
    return tuple(a for a in actions if not (isinstance(a, Page) and a.severity is Severity.QUARANTINE))


def digest_id(day: str) -> str:
    return f"{DIGEST_PREFIX}{day}"


def is_digest(incident_id: str) -> bool:
    return incident_id.startswith(DIGEST_PREFIX)
