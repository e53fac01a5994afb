"""Checks the controller asks agents to run, and the futures their results resolve.

Every result is filed in the store, whoever asked, bounded first (``bounded``: an agent's answer is
input like any other; a 3.5 MB reason is not kept whole). Results nobody is waiting for (unsolicited,
or late) are filed at most ``unsolicited_per_hour`` per node and clock hour: past that they are
counted (``refused``) and logged once an hour, never stored, so one node cannot grow the database.
A waiter learns its result or, when the node's agent disconnects first, an UNKNOWN that says so:
nobody waits for a deadline on an agent that is gone.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import structlog

from checks.result import NotRun
from controller.store import Records
from protos.vigil.v1 import agent_pb2, common_pb2

log = structlog.get_logger(__name__)

Send = Callable[[str, agent_pb2.ControllerMessage], bool]  # False: that node's agent is not connected
MAX_REASON_CHARS = 4096
MAX_FIGURES = 256
MAX_NAME_CHARS = 128  # a check's name, a request id, a figure's name
MAX_EVIDENCE_CHARS = 16_384  # a remedy's evidence bundle


def bounded(r: common_pb2.CheckResult) -> common_pb2.CheckResult:
    """The result as the controller keeps it: reason, names and figures bounded, non-finite figures
    dropped, what was cut said in the reason. Pure."""
    cut = []
    reason = r.reason
    if len(reason) > MAX_REASON_CHARS:
        cut.append(f"reason cut from {len(reason)} characters")
        reason = reason[:MAX_REASON_CHARS]
    if len(r.evidence) > MAX_EVIDENCE_CHARS:
        cut.append(f"evidence cut from {len(r.evidence)} characters")
    named = sorted((k, v) for k, v in r.figures.items() if len(k) <= MAX_NAME_CHARS and math.isfinite(v))
    if len(named) != len(r.figures) or len(named) > MAX_FIGURES:
        cut.append(f"{len(r.figures) - min(len(named), MAX_FIGURES)} of {len(r.figures)} figures dropped")
    out = common_pb2.CheckResult()
    out.CopyFrom(r)
    out.request_id, out.check = r.request_id[:MAX_NAME_CHARS], r.check[:MAX_NAME_CHARS]
    out.reason = reason + (f" [{'; '.join(cut)}]" if cut else "")
    out.evidence = r.evidence[:MAX_EVIDENCE_CHARS]
    out.figures.clear()
    out.figures.update(dict(named[:MAX_FIGURES]))
    return out


class CheckRequests:
    def __init__(
        self,
        records: Records,
        send: Send,
        unsolicited_per_hour: int = 120,
        refused: Callable[[str], None] = lambda node: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._send = send
        self._unsolicited_per_hour = unsolicited_per_hour
        self._refused = refused
        self._clock = clock
        self._filed: dict[str, tuple[int, int]] = {}  # node -> (clock hour, unsolicited results filed in it)
        self._waiting: dict[str, tuple[str, str, asyncio.Future[common_pb2.CheckResult]]] = {}  # id -> node, check

    def ask(self, node: str, run: agent_pb2.RunCheck) -> asyncio.Future[common_pb2.CheckResult] | None:
        """Send a check to a node's agent; the future gets its result. None: the agent is not connected."""
        future: asyncio.Future[common_pb2.CheckResult] = asyncio.get_running_loop().create_future()
        self._waiting[run.request_id] = (node, run.check, future)
        if not self._send(node, agent_pb2.ControllerMessage(run_check=run)):
            del self._waiting[run.request_id]
            return None
        return future

    def ask_remedy(self, node: str, run: agent_pb2.RunRemedy) -> asyncio.Future[common_pb2.CheckResult] | None:
        """Send a remedy to a node's agent (``controller.repairs``); answered like a check, under its
        request id. None: the agent is not connected."""
        future: asyncio.Future[common_pb2.CheckResult] = asyncio.get_running_loop().create_future()
        self._waiting[run.request_id] = (node, run.remedy, future)
        if not self._send(node, agent_pb2.ControllerMessage(run_remedy=run)):
            del self._waiting[run.request_id]
            return None
        return future

    def stop(self, node: str, request_id: str, why: str) -> None:
        """Ask the node's agent to stop a check it runs; it answers the check (UNKNOWN, not run),
        and whoever waits for it learns so. An agent that is gone, or runs no such check, says nothing."""
        if request_id in self._waiting:
            self._send(
                node, agent_pb2.ControllerMessage(stop_check=agent_pb2.StopCheck(request_id=request_id, why=why))
            )

    def forget(self, request_id: str) -> None:
        """Stop waiting for a check (it overran its deadline)."""
        self._waiting.pop(request_id, None)

    def _within_budget(self, node: str) -> bool:
        hour = int(self._clock() // 3600)
        seen_hour, filed = self._filed.get(node, (hour, 0))
        if seen_hour != hour:
            filed = 0
        if filed >= self._unsolicited_per_hour:
            if filed == self._unsolicited_per_hour:  # said once an hour
                log.warning("check_results_refused", node=node, per_hour=self._unsolicited_per_hour,
                            why="results nobody asked for, past the node's hourly bound: not stored")  # fmt: skip
            self._filed[node] = (hour, filed + 1)
            self._refused(node)
            return False
        self._filed[node] = (hour, filed + 1)
        return True

    def answered(self, node: str, answer: common_pb2.CheckResult) -> None:
        waiting = self._waiting.get(answer.request_id[:MAX_NAME_CHARS])
        if (waiting is None or waiting[0] != node) and not self._within_budget(node):
            return
        r = bounded(answer)
        verdict = common_pb2.Verdict.Name(r.verdict) if r.verdict in common_pb2.Verdict.values() else "UNKNOWN"
        figures = dict(r.figures)
        self._records.check_result(r.request_id, node, r.check, verdict, r.reason, figures, r.started_at, r.finished_at)
        waiting = self._waiting.get(r.request_id)
        if waiting is not None and waiting[0] == node:  # another node cannot answer for it
            del self._waiting[r.request_id]
            if not waiting[2].done():
                waiting[2].set_result(r)

    def disconnected(self, node: str) -> None:
        for request_id, (owner, check, future) in list(self._waiting.items()):
            if owner != node:
                continue
            del self._waiting[request_id]
            if not future.done():
                reason = "the node's agent disconnected while the check ran"
                lost = common_pb2.CheckResult(
                    request_id=request_id, node=node, check=check, reason=reason, not_run=NotRun.NO_AGENT
                )
                lost.verdict = common_pb2.UNKNOWN
                future.set_result(lost)
