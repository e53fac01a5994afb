"""Rank 0's line to the controller: a thread that sends Progress and brings back commands.

Training never waits on it. ``put`` only appends to a short queue (the oldest window is dropped
when the controller cannot keep up or cannot be reached); the thread sends each window as a unary
``Report`` call with a short deadline, and between windows polls once every ``poll_s`` with a
heartbeat, so a command waits at most that long. An unreachable controller is logged once per
outage and training goes on. Only ``close`` blocks, at the end of the run, to deliver the last word
(the acknowledgement of a checkpoint-and-restart), and for at most its timeout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import grpc
import structlog

from protos.vigil.v1 import trainer_pb2, trainer_pb2_grpc
from vigil_core.tls import TlsFiles, channel

log = structlog.get_logger(__name__)

QUEUE_WINDOWS = 16


class Reporter:
    def __init__(
        self,
        target: str,
        heartbeat: Callable[[], trainer_pb2.Progress],
        on_command: Callable[[trainer_pb2.JobCommand], None],
        poll_s: float = 1.0,
        timeout_s: float = 2.0,
        tls: TlsFiles | None = None,
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
        self.sent = self.failed = 0
        self.recommended_checkpoint_s = 0.0  # the controller's latest advice (0: none yet)

    def start(self) -> None:
        self._thread.start()

    def put(self, progress: trainer_pb2.Progress) -> None:
        """Queue a report; never blocks (a full queue drops its oldest window)."""
        self._queue.append(progress)
        self._wake.set()

    def _run(self) -> None:
        while not self._closing.is_set():
            self._wake.wait(self._poll_s)
            self._wake.clear()
            if self._closing.is_set():
                return
            if not self._queue:
                self._send(self._heartbeat())
            while self._queue and not self._closing.is_set():
                self._send(self._queue.popleft())

    def _send(self, progress: trainer_pb2.Progress, timeout_s: float | None = None) -> bool:
        try:
            reply = self._stub.Report(progress, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as exc:
            self.failed += 1
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code is grpc.StatusCode.INVALID_ARGUMENT:  # our own report is wrong: say so every time
                log.error("vigil_report_refused", target=self.target, error=exc.details())
            elif self.reachable:
                self.reachable = False
                log.warning("vigil_controller_unreachable", target=self.target, code=str(code), training="goes on")
            return False
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
        delivered = last is None or self._send(last)
        deadline = time.monotonic() + timeout_s
        while not delivered and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.2, left))
            delivered = self._send(last, min(self._timeout_s, max(0.1, left))) if last is not None else True
        self._channel.close()
        return delivered
