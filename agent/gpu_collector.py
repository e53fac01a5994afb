"""The GPU poll collector: reads every GPU through the backend and reports what changed.

Fault transitions come from ``agent.faults``. Harmful throttling (hardware slowdown, hardware or
software thermal, power brake) is reported when it starts and then every ``throttle_report_s``
while it lasts, with the seconds it has been active as the value; the controller's policy decides
how long is too long. A THROTTLE signal with code 0 says it ended. Idle and the software power cap
are normal and never reported.

``snapshot()``/``restore()`` carry the per-GPU state across agent restarts (the daemon stores it
in the spool in the same transaction as the signals it explains).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.faults import FaultState, FaultTracker
from gpus.backend import GpuBackend, GpuReading, XidEvent
from vigil_core.signals import THROTTLE_HARMFUL_MASK, Signal, SignalKind, throttle_reason_names


@dataclass
class _Throttle:
    reasons: int = 0
    since: float = 0.0
    reported_at: float = 0.0


def xid_signals(node: str, events: list[XidEvent]) -> list[Signal]:
    """NVML XID events as signals (the daemon drains them on its fast path, not in the poll)."""
    return [
        Signal(
            node,
            SignalKind.XID,
            e.gpu,
            e.code,
            0.0,
            e.message or f"XID {e.code} (NVML event)",
            "nvml-event",
            e.observed_at,
        )
        for e in events
    ]


class GpuCollector:
    def __init__(
        self, node: str, backend: GpuBackend, clock: Callable[[], float], throttle_report_s: float = 5.0
    ) -> None:
        self._node = node
        self._backend = backend
        self._clock = clock
        self._throttle_report_s = throttle_report_s
        self._faults = FaultTracker(node, "gpu-poll")
        self._throttle: dict[str, _Throttle] = {}
        self.readings: list[GpuReading] = []

    def collect(self) -> list[Signal]:
        """One poll of every GPU (blocking: the daemon runs it in a worker thread, under a watchdog)."""
        readings = [self._backend.read(g.index) for g in self._backend.gpus()]
        now = self._clock()
        signals: list[Signal] = []
        for reading in readings:
            signals += self._faults.observe(reading, now)
            if not reading.lost:
                signals += self._throttle_signals(reading, now)
        self.readings = readings
        return signals

    def _throttle_signals(self, reading: GpuReading, now: float) -> list[Signal]:
        state = self._throttle.setdefault(reading.gpu.key, _Throttle())
        harmful = (reading.throttle_reasons or 0) & THROTTLE_HARMFUL_MASK
        if harmful == state.reasons:
            if not harmful or now - state.reported_at < self._throttle_report_s:
                return []
        elif not (harmful and state.reasons):  # started or ended; a change of bits keeps the start
            state.since = now
        state.reasons, state.reported_at = harmful, now
        active = now - state.since if harmful else 0.0
        if harmful:
            message = f"clocks held down by {throttle_reason_names(harmful)} for {active:.0f}s"
            if reading.throttle_ns:
                totals = {
                    throttle_reason_names(bit): ns / 1e9 for bit, ns in reading.throttle_ns.items() if bit & harmful
                }
                message += "; driver totals " + ", ".join(f"{k} {v:.0f}s" for k, v in totals.items())
        else:
            message = "throttling ended"
        return [Signal(self._node, SignalKind.THROTTLE, reading.gpu, harmful, active, message, "gpu-poll", now)]

    # Persistence across restarts -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "faults": {k: v.to_json() for k, v in self._faults.states.items()},
            "throttle": {k: [t.reasons, t.since, t.reported_at] for k, t in self._throttle.items()},
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        self._faults.states = {k: FaultState.from_json(v) for k, v in snapshot.get("faults", {}).items()}
        self._throttle = {
            k: _Throttle(int(r), float(s), float(t)) for k, (r, s, t) in snapshot.get("throttle", {}).items()
        }
