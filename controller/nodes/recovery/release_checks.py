"""Automatic release: the agent of a quarantined node past its hold-down is asked for its health
check, and a pass returns the node to service (``controller.nodes.recovery.rules`` holds the pure rules)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from controller.nodes.check_requests import CheckRequests
from controller.nodes.fleet import Fleet
from controller.nodes.recovery.rules import RecoveryConfig, check_releases, release_check_due
from controller.nodes.rule_stats import AUTOMATIC
from controller.vocab.node_state import Health
from protos.vigil.v1 import agent_pb2, common_pb2
from vigil_core.supervise import Tasks

log = structlog.get_logger(__name__)

Release = Callable[[str, str, str], Coroutine[Any, Any, object]]  # (node, requested_by, reason)


class ReleaseChecks:
    def __init__(
        self,
        fleet: Fleet,
        checks: CheckRequests,
        config: RecoveryConfig,
        release: Release,
        clock: Callable[[], float],
        tasks: Tasks | None = None,
    ) -> None:
        self._supervisor = tasks or Tasks()
        self._fleet = fleet
        self._checks = checks
        self.config = config
        self._release = release
        self._clock = clock
        self._last_asked: dict[str, float] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self.skip: Callable[[str], bool] = lambda node: False  # a node whose repair certifies it (controller.repairs)

    def ask(self) -> list[str]:
        """Ask the agents of quarantined nodes past their hold-down for their check; returns the nodes asked."""
        now, asked = self._clock(), []
        for name in self._fleet.in_health(Health.QUARANTINED):
            entry = self._fleet.entry(name)
            if self.skip(name) or not release_check_due(entry.state, self._last_asked.get(name), self.config, now):
                continue
            request_id = f"release-{name}-{int(now * 1000)}"
            run = agent_pb2.RunCheck(
                request_id=request_id, check=self.config.check, deadline_s=self.config.check_deadline_s
            )
            answer = self._checks.ask(name, run)
            if answer is not None:
                answer.add_done_callback(functools.partial(self._answered, name))
                self._last_asked[name] = now
                asked.append(name)
                log.info("release_check_sent", node=name, check=self.config.check, request=request_id)
        return asked

    async def drain(self) -> None:
        """Wait for the releases under way (tests and benchmarks); an answer's callback runs first."""
        await asyncio.sleep(0)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _answered(self, node: str, answer: asyncio.Future[common_pb2.CheckResult]) -> None:
        if answer.cancelled():
            return
        r = answer.result()
        verdict = common_pb2.Verdict.Name(r.verdict)
        entry = self._fleet.entry(node)
        if check_releases(entry.state, verdict, r.started_at, self.config, entry.gpus, entry.expected_gpus):
            reason = f"{r.check} passed after the hold-down: {r.reason}"
            task: asyncio.Task[object] = asyncio.get_running_loop().create_task(self._release(node, AUTOMATIC, reason))
            self._supervisor.watch("release", task)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            log.warning("release_check_not_passed", node=node, check=r.check, verdict=verdict, reason=r.reason)
