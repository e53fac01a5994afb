"""Background work that never dies silently.

A resident process (the controller, the agent) runs loops beside its servers: the controller's
periodic checks, the job monitor, the agent's collectors and its link. Before this module, one
exception ended such a loop for good while the servers kept answering. Now each is *supervised*:

- ``Tasks`` keeps the state of every named task: an exception is logged with its traceback,
  counted (``on_failure``, a Prometheus counter ``vigil_*_task_failures_total{task}``), and the task
  is *down* until it next succeeds; ``down`` is what a readiness probe reads.
- ``supervise`` runs a long-lived coroutine and starts it again after a failure, with capped
  exponential backoff (up again, and its backoff reset, once it has run ``up_after_s``).
- ``Tasks.run_step`` guards one step of a periodic loop: a failing step is skipped until its backoff
  has passed, and the loop's other steps go on (a failing retention never stops silence detection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from vigil_core.waiting import wait_event

log = structlog.get_logger(__name__)


def backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (1, 2, ...). Pure."""
    return min(cap_s, base_s * 2.0 ** max(0, failures - 1))


@dataclass
class TaskState:
    failures: int = 0  # in a row; 0 while it is up
    total: int = 0
    last_error: str = ""
    retry_at: float = 0.0  # monotonic: a failed step is not tried again before this


class Tasks:
    def __init__(
        self,
        on_failure: Callable[[str], None] = lambda task: None,
        base_s: float = 0.5,
        cap_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        **context: str,
    ) -> None:
        self._on_failure = on_failure
        self.base_s, self.cap_s = base_s, cap_s
        self._clock = clock
        self._context = context  # logged with every failure (node=..., replica=...)
        self.states: dict[str, TaskState] = {}

    def failed(self, task: str, exc: BaseException) -> float:
        """Log and count a failure; returns the seconds to wait before trying again."""
        state = self.states.setdefault(task, TaskState())
        state.failures += 1
        state.total += 1
        state.last_error = repr(exc)[:300]
        delay = backoff_s(state.failures, self.base_s, self.cap_s)
        state.retry_at = self._clock() + delay
        self._on_failure(task)
        log.error(
            "task_failed",
            task=task,
            failures_in_a_row=state.failures,
            retry_in_s=round(delay, 2),
            exc_info=exc,
            **self._context,
        )
        return delay

    def failed_once(self, task: str, exc: BaseException) -> None:
        """A one-shot task (an action, a release) ended in an exception: logged and counted; nothing
        restarts it, so it is not held down."""
        self.states.setdefault(task, TaskState()).total += 1
        self._on_failure(task)
        log.error("task_failed", task=task, exc_info=exc, **self._context)

    def watch(self, task: str, handle: asyncio.Task[object]) -> None:
        """Say it when a fire-and-forget task dies of an exception (asyncio would only at garbage collection)."""

        def done(t: asyncio.Task[object]) -> None:
            if not t.cancelled() and (exc := t.exception()) is not None:
                self.failed_once(task, exc)

        handle.add_done_callback(done)

    def succeeded(self, task: str) -> None:
        state = self.states.setdefault(task, TaskState())
        if state.failures:
            log.warning("task_recovered", task=task, after_failures=state.failures, **self._context)
        state.failures = 0

    def down(self) -> dict[str, str]:
        """The tasks failing now, each with its last error."""
        return {name: s.last_error for name, s in sorted(self.states.items()) if s.failures}

    def run_step(self, task: str, step: Callable[[], object]) -> bool:
        """One guarded step of a periodic loop; False when it failed or waits out its backoff."""
        if self._waits(task):
            return False
        try:
            step()
        except Exception as exc:
            self.failed(task, exc)
            return False
        self.succeeded(task)
        return True

    async def run_step_in_thread(self, task: str, step: Callable[[], object]) -> bool:
        """``run_step`` for a step that blocks (a database's bulk work): run in a thread, the event
        loop free meanwhile."""
        if self._waits(task):
            return False
        try:
            await asyncio.to_thread(step)
        except Exception as exc:
            self.failed(task, exc)
            return False
        self.succeeded(task)
        return True

    def _waits(self, task: str) -> bool:
        """A failed step waits out its backoff."""
        state = self.states.get(task)
        return state is not None and state.failures > 0 and self._clock() < state.retry_at


async def supervise(
    task: str,
    body: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    tasks: Tasks,
    up_after_s: float = 5.0,
) -> None:
    """Run ``body()`` until ``stop`` is set, starting it again whenever it raises (or returns early).
    A restarted body counts as up again once it has run ``up_after_s`` without failing."""
    while not stop.is_set():
        runner = asyncio.ensure_future(body())
        try:
            done, _ = await asyncio.wait({runner}, timeout=up_after_s)
            if not done:
                tasks.succeeded(task)
            await runner
        except asyncio.CancelledError:
            runner.cancel()
            raise
        except Exception as exc:
            await wait_event(stop, tasks.failed(task, exc))
            continue
        if stop.is_set():
            return
        await wait_event(stop, tasks.failed(task, RuntimeError(f"{task} returned before the process stopped")))
