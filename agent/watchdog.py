"""The collector watchdog: a collector that hangs is reported, not mistaken for a quiet healthy one.

A wedged driver can hang any NVML call, and a hung NFS mount can hang a ``statvfs`` of the
checkpoint path. So each collector's blocking call runs in its own daemon thread under a
deadline. A call that overruns marks the collector hung: one COLLECTOR_HUNG signal (code 1,
``source`` names the collector), which the controller turns into UNKNOWN health. No new call is
started while the stuck one has not returned (threads do not pile up, and a daemon thread never
keeps the agent from exiting). When it returns, its result is delivered (the signals it found are
not lost) and the collector is reported recovered (code 0).

Long-running listeners (the NVML event thread) prove they are alive through a progress time; the
same transitions apply when it is older than the deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import structlog

from vigil_core.signals import Signal, SignalKind

log = structlog.get_logger(__name__)
T = TypeVar("T")


class GuardedWorker:
    """Runs one blocking call at a time in a daemon thread; ``hung`` while a call overruns."""

    def __init__(self, name: str, deadline_s: float) -> None:
        self.name = name
        self.deadline_s = deadline_s
        self._stuck: Future[object] | None = None

    @property
    def hung(self) -> bool:
        return self._stuck is not None and not self._stuck.done()

    async def call(self, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """``(True, value)`` when the call finished in time; ``(False, None)`` when it is hung.
        An exception from ``fn`` propagates."""
        if self._stuck is not None:
            if not self._stuck.done():
                return False, None
            # It came back. Its result is delivered now rather than dropped: the collector has
            # already moved its baseline past what that call saw, so dropping it would lose faults.
            late, self._stuck = self._stuck, None
            return True, late.result()  # type: ignore[return-value]
        future: Future[T] = Future()

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the awaiting task, not lost in the thread
                future.set_exception(exc)

        threading.Thread(target=target, name=f"vigil-{self.name}", daemon=True).start()
        done, _ = await asyncio.wait({asyncio.wrap_future(future)}, timeout=self.deadline_s)
        if not done:
            self._stuck = future  # type: ignore[assignment]
            return False, None
        return True, future.result()


class Watchdog:
    """Turns each collector's hung/responsive state into COLLECTOR_HUNG transitions."""

    def __init__(self, node: str, clock: Callable[[], float] = time.time) -> None:
        self._node = node
        self._clock = clock
        self._hung_since: dict[str, float] = {}

    @property
    def hung(self) -> list[str]:
        return sorted(self._hung_since)

    def report(self, collector: str, hung: bool, deadline_s: float) -> list[Signal]:
        now = self._clock()
        if hung and collector not in self._hung_since:
            self._hung_since[collector] = now
            log.error("collector_hung", node=self._node, collector=collector, deadline_s=deadline_s)
            message = f"collector {collector} has not answered within {deadline_s:g}s (driver wedged?)"
            return [self._signal(collector, 1, deadline_s, message, now)]
        if not hung and collector in self._hung_since:
            stuck_for = now - self._hung_since.pop(collector)
            log.warning("collector_recovered", node=self._node, collector=collector, stuck_for_s=round(stuck_for, 1))
            message = f"collector {collector} answers again after {stuck_for:.0f}s"
            return [self._signal(collector, 0, stuck_for, message, now)]
        return []

    def _signal(self, collector: str, code: int, value: float, message: str, now: float) -> Signal:
        """COLLECTOR_HUNG names the collector in ``source``: code 1 stuck, code 0 recovered."""
        kind = SignalKind.COLLECTOR_HUNG
        return Signal(self._node, kind, code=code, value=value, message=message, source=collector, observed_at=now)
