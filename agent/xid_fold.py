"""One fault, one signal: the kernel log and NVML's event API both report most XIDs.

An XID signal is dropped when a *different* source reported the same code on the same GPU within
``window_s``; whichever source saw it first wins (the kernel log line usually carries more: the
pid and the driver's words). Repeats from the same source are kept, since the policy counts them
(three XID 13 in ten minutes) and the controller folds floods into one incident.
"""

from __future__ import annotations

from vigil_core.signals import Signal, SignalKind


class XidFolder:
    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._last: dict[tuple[str, int], tuple[str, float]] = {}  # (gpu, code) -> (source, time)
        self.folded = 0

    def keep(self, signal: Signal) -> bool:
        if signal.kind is not SignalKind.XID:
            return True
        gpu = signal.gpu.pci_bus_id or signal.gpu.uuid or str(signal.gpu.index)
        key, at = (gpu, signal.code), signal.observed_at
        seen = self._last.get(key)
        if seen is not None and seen[0] != signal.source and abs(at - seen[1]) <= self.window_s:
            self.folded += 1
            return False
        self._last[key] = (signal.source, at)
        if len(self._last) > 4096:  # forget old keys; a GPU has few distinct XIDs at once
            horizon = at - self.window_s
            self._last = {k: v for k, v in self._last.items() if v[1] >= horizon}
        return True
