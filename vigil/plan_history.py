"""``vigil plan --from-history``: the failure rate the controller's own record gives."""

from __future__ import annotations

import grpc

from controller.planning.model import DAY_S
from controller.planning.plan import HistoryError, rate_from_history
from vigil.admin_client import AdminClient
from vigil_core.rpc_errors import explain


def fitted_rate(target: str, days: float) -> float:
    """Failures per 1,000 GPU-days: the nodes quarantined in the last ``days`` over the GPUs the
    connected agents report (the fleet as it is now stands for the fleet over the window)."""
    try:
        with AdminClient(target) as admin:  # mutual TLS where VIGIL_TLS_DIR names the certificates
            status = admin.status()
            incidents = admin.incidents(limit=100_000)
    except grpc.RpcError as exc:
        raise HistoryError(explain(exc, target)) from None
    quarantined = [
        i.opened_at
        for i in incidents
        if any(a.kind == "QUARANTINE" and a.status == "DONE" and not a.detail.startswith("dry run") for a in i.actions)
    ]
    now = status.now
    first = min((i.opened_at for i in incidents), default=now)
    since = max(now - days * DAY_S, first)
    return rate_from_history(quarantined, sum(n.gpus for n in status.nodes), since, now)
