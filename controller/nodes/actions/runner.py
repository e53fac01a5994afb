"""Carries out the actions the engine committed: each once per incident, retried with backoff.

Actions run in threads (actuators make blocking HTTP calls) under the quarantine rate limit; a
quarantine's record waits for the other quarantines' cordons (``controller.nodes.actions.urgent``). The
agent's acknowledgement of a signal waits until the actions that signal asked for are done (or
given up): a controller that dies with an action under way has not acknowledged its signal, so the
agent replays it to the next controller, which carries the action out (idempotently) instead of
losing it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import structlog

from controller.act.actuators import Actuator, NotReadyYet, Pager, PermanentActionError, Unfinished
from controller.metrics import ControllerMetrics
from controller.nodes.actions.apply import execute
from controller.nodes.actions.urgent import UrgentLane
from controller.nodes.guards.rules import TokenBucket
from controller.store import ActionLog, PendingAction, Tx
from controller.store.health import is_database_error
from controller.vocab.actions import ExternalAction, Page, Quarantine, action_kind
from vigil_core.supervise import Tasks

log = structlog.get_logger(__name__)

MAX_ACTION_ATTEMPTS = 8
# Actions block on HTTP: a burst needs more of them under way than the default executor's few threads
# (the rate limit, not the thread count, is what paces the writes).
ACTION_THREADS = 32
PAGES_KEPT = 10_000  # incidents whose page is known without a read (older ones are read)
MAX_WAIT_FOR_OTHER_S = 600.0  # a thread reply waits this long for its message (Slack may rate-limit it)

ActionKey = tuple[str, str]  # (incident id, action kind)
Settle = Callable[[Quarantine | Page], Awaitable[str | None]]  # wait, then why to hold it (None: go)


async def _go(action: Quarantine | Page) -> str | None:
    return None


STORE_RETRY_S = 1.0  # an action that needs the store (its bookkeeping, the local actuator) tries it again this often


def retry_delay(attempt: int) -> float:
    return min(30.0, 0.5 * 2.0**attempt)


@dataclass(frozen=True, slots=True)
class Followed:
    """What follows an action carried out: the actions to ask for next, and what else to store. Both
    are written in the outcome's transaction: a controller stopped between two writes would keep the
    action DONE and lose what it changed (the node's QUARANTINED) or what it asked for (the thread's
    "done"); and as they exist exactly when the outcome is DONE, none is asked for twice."""

    actions: tuple[ExternalAction, ...] = ()
    write: Callable[[Tx], None] | None = None


def _stored(followed: Followed, now: float, db: Tx) -> None:
    """In the outcome's transaction: what the action changed, and the actions that follow it."""
    if followed.write is not None:
        followed.write(db)
    for action in followed.actions:
        ActionLog.add_in(db, action, now)


class ActionRunner:
    def __init__(
        self,
        actions: ActionLog,
        actuator: Actuator,
        pager: Pager,
        metrics: ControllerMetrics,
        bucket: TokenBucket,
        clock: Callable[[], float] = time.time,
        on_done: Callable[[PendingAction, str], Followed] = lambda pending, detail: Followed(),
        on_ack: Callable[[str], None] = lambda node: None,
        tasks: Tasks | None = None,
    ) -> None:
        self.actions = actions
        self.tasks = tasks or Tasks()
        self.actuator = actuator
        self.pager = pager
        self.metrics = metrics
        self.bucket = bucket
        self.clock = clock
        self.on_done = on_done  # an action was carried out: what follows it, asked for here
        self.on_ack = on_ack  # the node's ackable seq moved
        self._in_flight: set[ActionKey] = set()
        self._unfinished: dict[str, dict[ActionKey, int]] = {}  # node -> action -> the signal's seq
        self._tasks: set[asyncio.Task[None]] = set()
        self._pages_asked: dict[str, None] = {}  # incidents whose page this controller asked for, newest last
        self._executor = ThreadPoolExecutor(ACTION_THREADS, thread_name_prefix="action")
        self.urgent = UrgentLane()  # a quarantine's record waits for the other quarantines' cordons
        self.settle: Settle = _go  # the guard's settling window (set by the composition root)

    def held_back_seq(self, node: str) -> int | None:
        """The lowest seq of the node's signals whose actions are not done yet, if any."""
        waiting = self._unfinished.get(node)
        return min(waiting.values()) if waiting else None

    def request(self, action: ExternalAction, now: float | None = None) -> bool:
        """An action the controller asks for itself (not for an agent's signal): record it, once per
        incident and kind, and carry it out. False when that incident already has it."""
        if not self.actions.add(action, self.clock() if now is None else now):
            return False
        self.schedule(PendingAction(action.incident_id, action, 0))
        return True

    def paged(self, incident_id: str) -> bool:
        """Whether the incident has a page: known here for the pages this controller asked for (no
        read, which would wait for the store's writer on the event loop: in a burst, one per
        quarantine); else from the action log (a page held, or asked for by an earlier controller)."""
        return incident_id in self._pages_asked or self.actions.paged(incident_id)

    def schedule(self, pending: PendingAction) -> None:
        key = (pending.incident_id, action_kind(pending.action))
        if key in self._in_flight:
            return
        if isinstance(pending.action, Page):
            self._pages_asked[pending.incident_id] = None
            if len(self._pages_asked) > PAGES_KEPT:
                del self._pages_asked[next(iter(self._pages_asked))]
        self._in_flight.add(key)
        if pending.seq > 0:
            self._unfinished.setdefault(pending.action.node, {})[key] = pending.seq
        task = asyncio.get_running_loop().create_task(self._run(pending, key))
        self.tasks.watch("action", task)  # an exception (the database away at _finish) is said
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, pending: PendingAction, key: ActionKey) -> None:
        action, kind = pending.action, key[1]
        bound = log.bind(incident=pending.incident_id, node=action.node, action=kind)
        try:
            if isinstance(action, (Quarantine, Page)) and (why := await self.settle(action)):
                self.actions.set_status([(pending.incident_id, kind)], "HELD", why)
                bound.warning("action_held", why=why)
                return
            attempt, waited_s = pending.attempts, 0.0
            while attempt < MAX_ACTION_ATTEMPTS:
                try:
                    detail, acted_at = await self._carry_out(action)
                except PermanentActionError as exc:
                    bound.error("action_failed_permanently", error=str(exc))
                    await self._finished(pending, kind, "FAILED", str(exc)[:500])
                    return
                except NotReadyYet as exc:  # waiting on another action is not a failed attempt
                    if waited_s >= MAX_WAIT_FOR_OTHER_S:
                        await self._finished(pending, kind, "FAILED", f"gave up waiting: {exc}")
                        return
                    await asyncio.sleep(0.2)
                    waited_s += 0.2
                    continue
                except Exception as exc:  # the actuator's failure is retried, never fatal
                    if is_database_error(exc):  # the store away (the local actuator writes there): not its attempt
                        bound.warning("action_waits_for_the_store", error=repr(exc))
                        await asyncio.sleep(STORE_RETRY_S)
                        continue
                    bound.warning("action_failed", attempt=attempt, error=repr(exc))
                    count = partial(self.actions.count_attempt, pending.incident_id, kind, repr(exc)[:500])
                    if not self._recorded(count):
                        bound.warning("action_attempt_not_counted", why="the store takes no writes now")
                    await asyncio.sleep(retry_delay(attempt))
                    attempt += 1
                    continue
                followed = self.on_done(pending, detail)
                latency = await self._finished(
                    pending, kind, "DONE", detail, partial(_stored, followed, self.clock()), acted_at
                )
                bound.info("action_done", detail=detail, latency_s=round(latency, 4))
                for follow in followed.actions:  # recorded with the outcome: asked for once, never twice
                    self.schedule(PendingAction(follow.incident_id, follow, 0))
                return
            await self._finished(pending, kind, "FAILED", "gave up after retries")
            bound.error("action_gave_up", attempts=MAX_ACTION_ATTEMPTS)
        finally:
            self._in_flight.discard(key)
            self._release_ack(action.node, key)

    async def _carry_out(self, action: ExternalAction) -> tuple[str, float]:
        """Carry the action out in a thread; returns its account and when it took effect (a
        quarantine: when its urgent part was written). A quarantine waits for the rate limit, and
        its record (``Unfinished``) for the other quarantines' urgent parts (``UrgentLane``)."""
        loop = asyncio.get_running_loop()
        if not isinstance(action, Quarantine) or action.dry_run:
            done = await loop.run_in_executor(self._executor, execute, action, self.actuator, self.pager)
            if isinstance(done, Unfinished):  # only quarantines have an urgent part today
                done = await loop.run_in_executor(self._executor, done.finish)
            return done, self.clock()
        ticket = self.urgent.begin()
        try:
            await asyncio.sleep(self.bucket.reserve(time.monotonic()))
            done = await loop.run_in_executor(self._executor, execute, action, self.actuator, self.pager)
        finally:
            self.urgent.end()
        acted_at = self.clock()
        if isinstance(done, Unfinished):
            await self.urgent.after_urgent(ticket)
            done = await loop.run_in_executor(self._executor, done.finish)
        return done, acted_at

    @staticmethod
    def _recorded(write: Callable[[], object]) -> bool:
        """Run a bookkeeping write; False when the store takes no writes now (anything else raises)."""
        try:
            write()
        except Exception as exc:
            if not is_database_error(exc):
                raise
            return False
        return True

    async def _finished(
        self,
        pending: PendingAction,
        kind: str,
        status: str,
        detail: str,
        also: Callable[[Tx], None] | None = None,
        acted_at: float | None = None,
    ) -> float:
        """Record the action's outcome (with ``also``'s writes, in its transaction), waiting for the
        store while it takes no writes: an outcome left unrecorded would leave the action PENDING,
        carried out again only by the next controller."""
        while True:
            try:
                return self._finish(pending, kind, status, detail, also, acted_at)
            except Exception as exc:
                if not is_database_error(exc):
                    raise
                log.warning("action_outcome_waits_for_the_store", incident=pending.incident_id, action=kind)
                await asyncio.sleep(STORE_RETRY_S)

    def _finish(
        self,
        pending: PendingAction,
        kind: str,
        status: str,
        detail: str,
        also: Callable[[Tx], None] | None,
        acted_at: float | None,
    ) -> float:
        """Returns the fault-to-action latency: to when the action took effect (``acted_at``), else now."""
        now = self.clock()
        self.actions.finish(pending.incident_id, kind, status, detail, now, also)
        family = kind.split(":")[0]
        self.metrics.actions.labels(family, status).inc()
        observed_at, took_effect = pending.action.observed_at, now if acted_at is None else acted_at
        if status == "DONE" and observed_at > 0 and isinstance(pending.action, (Quarantine, Page)):
            self.metrics.fault_to_action.labels(family).observe(took_effect - observed_at)
        return took_effect - observed_at if observed_at > 0 else 0.0

    def _release_ack(self, node: str, key: ActionKey) -> None:
        waiting = self._unfinished.get(node)
        if waiting is None or waiting.pop(key, None) is None:
            return
        if not waiting:
            del self._unfinished[node]
        self.on_ack(node)

    async def drain(self) -> None:
        """Wait for the actions under way to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def shutdown(self) -> None:
        """Stop now: actions still under way stay PENDING in the store and resume at the next start."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)  # a call already in an actuator finishes alone
        self.actuator.close()
