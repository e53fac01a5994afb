"""The GPU poll collector: reads every GPU through the backend and reports what changed.

Signals come from transitions (a counter that grew, a flag that turned on), so a steady fault is
reported once, not once per poll. Harmful throttling is reported when it starts and then every
``throttle_report_s`` while it lasts, with the seconds it has been active as the value; the
controller's policy decides how long is too long. A THROTTLE signal with code 0 says it ended.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.backend import GpuBackend, GpuReading
from vigil.signals import THROTTLE_HARMFUL_MASK, Signal, SignalKind


@dataclass
class _Throttle:
    reasons: int = 0
    since: float = 0.0
    reported_at: float = 0.0


def diff_readings(node: str, before: GpuReading | None, now_reading: GpuReading, now: float) -> list[Signal]:
    """Signals for what changed between two readings of the same GPU (throttling aside)."""
    gpu, r, b = now_reading.gpu, now_reading, before

    def signal(kind: SignalKind, value: float = 0.0, message: str = "") -> Signal:
        return Signal(node, kind, gpu, 0, value, message, "gpu-poll", now)

    if r.lost:
        return [] if b is not None and b.lost else [signal(SignalKind.GPU_LOST, message="GPU is lost")]
    out = []
    old_dbe = (b.ecc_dbe_volatile or 0) if b is not None else 0
    if r.ecc_dbe_volatile is not None and r.ecc_dbe_volatile > old_dbe:
        delta = r.ecc_dbe_volatile - old_dbe
        out.append(signal(SignalKind.ECC_DBE, delta, f"{delta} new double-bit ECC error(s)"))
    if r.remap_pending and not (b is not None and b.remap_pending):
        out.append(signal(SignalKind.ROW_REMAP_PENDING, 1, "row remap pending: GPU reset needed"))
    if r.remap_failure and not (b is not None and b.remap_failure):
        out.append(signal(SignalKind.ROW_REMAP_FAILURE, 1, "row remap failure"))
    return out


class GpuCollector:
    def __init__(
        self, node: str, backend: GpuBackend, clock: Callable[[], float], throttle_report_s: float = 5.0
    ) -> None:
        self._node = node
        self._backend = backend
        self._clock = clock
        self._throttle_report_s = throttle_report_s
        self._last: dict[int, GpuReading] = {}
        self._throttle: dict[int, _Throttle] = {}
        self.readings: list[GpuReading] = []

    def collect(self) -> list[Signal]:
        """One poll of every GPU (blocking: the daemon runs it off the event loop)."""
        now = self._clock()
        signals: list[Signal] = []
        readings = [self._backend.read(g.index) for g in self._backend.gpus()]
        for reading in readings:
            index = reading.gpu.index
            signals += diff_readings(self._node, self._last.get(index), reading, now)
            signals += self._throttle_signals(reading, now)
            self._last[index] = reading
        for event in self._backend.drain_xid_events():
            signals.append(
                Signal(
                    self._node,
                    SignalKind.XID,
                    event.gpu,
                    event.code,
                    0.0,
                    event.message or f"XID {event.code} (NVML event)",
                    "nvml-event",
                    event.observed_at,
                )
            )
        self.readings = readings
        return signals

    def _throttle_signals(self, reading: GpuReading, now: float) -> list[Signal]:
        state = self._throttle.setdefault(reading.gpu.index, _Throttle())
        harmful = (reading.throttle_reasons or 0) & THROTTLE_HARMFUL_MASK
        if harmful == state.reasons:
            if not harmful or now - state.reported_at < self._throttle_report_s:
                return []
        elif harmful and state.reasons:
            pass  # the reason bits changed while throttling: keep the start time, report now
        else:
            state.since = now
        state.reasons, state.reported_at = harmful, now
        active = now - state.since if harmful else 0.0
        message = f"throttle reasons 0x{harmful:x} active {active:.0f}s" if harmful else "throttle ended"
        return [Signal(self._node, SignalKind.THROTTLE, reading.gpu, harmful, active, message, "gpu-poll", now)]
