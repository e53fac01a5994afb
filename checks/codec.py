"""A check's answer on the wire: ``checks.result.CheckResult`` to and from its protobuf message.

The agent sends what a check program answered; the controller reads it back. A verdict the reader
does not know is UNKNOWN, never a pass.
"""

from __future__ import annotations

from checks.result import CheckResult, Verdict
from protos.vigil.v1 import common_pb2


def result_to_proto(node: str, result: CheckResult, request_id: str = "") -> common_pb2.CheckResult:
    return common_pb2.CheckResult(
        request_id=request_id,
        node=node,
        check=result.check,
        verdict=result.verdict.value,  # enum fields take the value's name
        reason=result.reason,
        figures=result.figures,
        started_at=result.started_at,
        finished_at=result.finished_at,
        not_run=result.not_run,
    )


def result_from_proto(msg: common_pb2.CheckResult) -> CheckResult:
    verdict = common_pb2.Verdict.Name(msg.verdict)
    known = verdict in Verdict.__members__
    return CheckResult(
        check=msg.check,
        verdict=Verdict(verdict) if known else Verdict.UNKNOWN,
        reason=msg.reason if known else f"unreadable verdict {verdict}: {msg.reason}",
        figures=dict(msg.figures),
        started_at=msg.started_at,
        finished_at=msg.finished_at,
        not_run=msg.not_run if known else "",
    )
