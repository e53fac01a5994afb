"""Rank 0's line to the controller: a thread that sends Progress and brings back commands.

Training never waits on it. ``put`` only appends to a short queue (the oldest window is dropped
when the controller cannot keep up or cannot be reached); the thread sends each window as a unary
``Report`` call with a short deadline, and between windows polls once every ``poll_s`` with a
heartbeat, so a command waits at most that long. Calls are paced: never two within
``min_interval_s`` (0.5 s: 2 a second, under the controller's default of 5 a job), whatever the
step time; a call the controller refuses over its rate (RESOURCE_EXHAUSTED) is logged as such,
kept, and sent again after a pause that doubles up to 10 s. An unreachable controller is logged
once per outage and training goes on. Only ``close`` blocks, at the end of the run, to deliver the
last word (the end, or the acknowledgement of a checkpoint-and-restart), for at most its timeout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import grpc
import structlog

from protos.vigil.v1 import trainer_pb2, trainer_pb2_grpc
from vigil_core.rpc_errors import code_of, details_of, explain, is_refused
from vigil_core.tls import TlsFiles, channel

log = structlog.get_logger(__name__)

QUEUE_WINDOWS = 16
MAX_BACKOFF_S = 10.0


class Reporter:
    def __init__(
        self,
        target: str,
        heartbeat: Callable[[], trainer_pb2.Progress],
        on_command: Callable[[trainer_pb2.JobCommand], None],
        poll_s: float = 1.0,
        timeout_s: float = 2.0,
        tls: TlsFiles | None = None,
        min_interval_s: float = 0.5,
    ) -> None:
        self._channel = channel(target, tls)
        self._stub = trainer_pb2_grpc.TrainerGatewayStub(self._channel)
        self._heartbeat = heartbeat
        self._on_command = on_command
        self._poll_s, self._timeout_s = poll_s, timeout_s
        self._queue: deque[trainer_pb2.Progress] = deque(maxlen=QUEUE_WINDOWS)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vigil-reporter", daemon=True)
        self.target = target
        self.reachable = True
        self.sent = self.failed = self.refused = self.dropped = 0
        self.recommended_checkpoint_s = 0.0  # the controller's latest advice (0: none yet)
        self._min_interval_s = min_interval_s
        self._next_call = 0.0  # monotonic: no call before this (pacing, or a refusal's pause)
        self._backoff_s = 0.0  # after a refusal over the rate; 0: none

    def start(self) -> None:
        self._thread.start()

    def put(self, progress: trainer_pb2.Progress) -> None:
        """Queue a report; never blocks (a full queue drops its oldest window: counted in
        ``dropped`` and logged, the first and every hundredth)."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
            if self.dropped % 100 == 1:
                log.warning("vigil_report_windows_dropped", target=self.target, dropped=self.dropped,
                            why="the controller is unreachable, or refuses calls over its rate")  # fmt: skip
        self._queue.append(progress)
        self._wake.set()

    def _run(self) -> None:
        while not self._closing.is_set():
            self._wake.wait(self._poll_s)
            self._wake.clear()
            if self._closing.is_set():
                return
            if not self._queue:
                self._pace()
                if not self._closing.is_set():
                    self._send(self._heartbeat())
            while self._queue and not self._closing.is_set():
                self._pace()
                if self._closing.is_set():
                    return
                window = self._queue.popleft()
                if not self._send(window) and self._backoff_s:
                    self._queue.appendleft(window)  # refused over the rate: kept, sent after the pause

    def _pace(self) -> None:
        """Wait (unless closing) until the next call may go."""
        if (wait := self._next_call - time.monotonic()) > 0:
            self._closing.wait(wait)

    def _send(self, progress: trainer_pb2.Progress, timeout_s: float | None = None) -> bool:
        self._next_call = time.monotonic() + self._min_interval_s
        try:
            reply = self._stub.Report(progress, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as exc:
            self.failed += 1
            code = code_of(exc)
            if code is grpc.StatusCode.INVALID_ARGUMENT:  # our own report is wrong: say so every time
                log.error("vigil_report_refused", target=self.target, error=details_of(exc))
            elif is_refused(exc):
                self.refused += 1
                if not self._backoff_s:
                    log.warning("vigil_report_over_rate", target=self.target, error=explain(exc, self.target))
                self._backoff_s = min(MAX_BACKOFF_S, max(1.0, self._backoff_s * 2))
                self._next_call = time.monotonic() + self._backoff_s
            elif self.reachable:
                self.reachable = False
                why = explain(exc, self.target)
                log.warning("vigil_controller_unreachable", target=self.target, error=why, training="goes on")
            return False
        self._backoff_s = 0.0
        if not self.reachable:
            self.reachable = True
            log.info("vigil_controller_reachable_again", target=self.target)
        self.sent += 1
        if reply.recommended_checkpoint_s > 0:
            self.recommended_checkpoint_s = reply.recommended_checkpoint_s  # read by the training thread
        for command in reply.commands:
            self._on_command(command)
        return True

    def close(self, last: trainer_pb2.Progress | None = None, timeout_s: float = 0.0) -> bool:
        """Stop the thread; deliver ``last``: once, or retried for ``timeout_s`` (and once more if the
        controller was unreachable until then). True if it was delivered."""
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=self._timeout_s + 1)
        deadline = time.monotonic() + timeout_s
        if last is not None:
            time.sleep(max(0.0, min(self._next_call, deadline) - time.monotonic()))  # paced, as every call
        if last is None:
            self._channel.close()
            return True
        delivered = self._send(last)
        while not delivered and (left := deadline - time.monotonic()) > 0:
            time.sleep(max(0.0, min(max(0.2, self._next_call - time.monotonic()), left)))
            left = deadline - time.monotonic()
            delivered = self._send(last, min(self._timeout_s, max(0.1, left)))
        if not delivered:
            log.warning("vigil_last_report_not_delivered", target=self.target, report=last.event, step=last.step)
        self._channel.close()
        return delivered
