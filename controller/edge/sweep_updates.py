"""A sweep's events (``controller.sweeps.result``) as the admin service streams them."""

from __future__ import annotations

from checks.codec import result_to_proto
from controller.sweeps.result import SweepDone, SweepEvent, SweepResult
from protos.vigil.v1 import admin_pb2


def summary_to_proto(r: SweepResult) -> admin_pb2.SweepSummary:
    return admin_pb2.SweepSummary(
        sweep_id=r.sweep_id,
        rows=[
            admin_pb2.SweepRow(node=w.node, check=w.check, verdict=w.verdict.value, figure=w.figure, reason=w.reason)
            for w in r.rows
        ],
        findings=[admin_pb2.SweepFinding(node=f.node, reason=f.reason, kind=f.kind, nodes=f.nodes) for f in r.findings],
        nodes=r.nodes,
        failed_nodes=len(r.failed),
        unknown_nodes=len(r.unknown),
        rounds=r.rounds,
        pairs=r.pairs,
        wall_s=r.wall_s,
        quarantine=r.quarantine,
        verdict=r.verdict.value,
    )


def update_to_proto(event: SweepEvent) -> admin_pb2.SweepUpdate:
    if isinstance(event, SweepDone):
        update = admin_pb2.SweepUpdate(done=event.done, total=event.total, phase="done", error=event.error)
        if event.result is not None:
            update.summary.CopyFrom(summary_to_proto(event.result))
        return update
    result = result_to_proto(event.node, event.result, event.request_id)
    return admin_pb2.SweepUpdate(result=result, done=event.done, total=event.total, phase=event.phase)
