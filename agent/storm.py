"""Storms folded at the agent: repeats of one fault leave the node as one signal with a count.

A driver in trouble can write the same XID thousands of times a second (XID 45 after every failed
context, XID 13 from every warp). Sending each one costs the spool, the link and the controller
work in proportion to lines; folding here makes a 100,000-line flood cost work in proportion to
incidents, end to end.

The first ``burst`` signals of a GPU, kind and code go out at once: folding never delays a new
fault, nor a threshold rule up to ``burst`` ("three XID 13 in ten minutes" decides on the third
line, not a fold later; the default policy's highest threshold is 3). Past the burst, repeats
within ``flush_s`` are counted, and at most once per ``flush_s`` they leave as one signal carrying
the count and the first and last times (the controller's incident keeps both), so a higher
threshold is at most ``flush_s`` late. The burst is granted once per storm: a key folds until it
has been quiet for ``flush_s``. State signals (a collector hung, then recovered) are never folded:
their order is their meaning.

The pending counts are part of the agent's durable state: ``snapshot`` goes to the spool in the
same transaction as the kernel-log cursor that read those lines, so a killed agent neither loses
nor double-counts a repeat.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from vigil_core.signals import STATE_KINDS, GpuRef, Signal, SignalKind

MAX_KEYS = 4096  # distinct faults tracked at once; beyond it a new key is simply not folded
BURST = 4  # signals of one key sent at once before folding starts (above the default policy's thresholds)


@dataclass
class _Fold:
    emitted_at: float  # when the last signal of this key left (observed time)
    pending: Signal | None = None  # the first repeat held back, the template of the summary
    count: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    value: float = 0.0
    sent: int = 1  # signals of this storm sent one by one (the burst), before the first fold


class StormFolder:
    def __init__(self, flush_s: float = 1.0, max_keys: int = MAX_KEYS, burst: int = BURST) -> None:
        self.flush_s = flush_s
        self.max_keys = max_keys
        self.burst = max(1, burst)
        self._folds: dict[tuple[str, str, int], _Fold] = {}
        self.folded = 0  # repeats held back into a summary, for the agent's metric
        self.dirty = False  # pending counts changed since the last snapshot was taken

    def fold(self, signals: Iterable[Signal]) -> list[Signal]:
        """The signals to send now; repeats are held back and counted."""
        out: list[Signal] = []
        for s in signals:
            if self.flush_s <= 0 or s.kind in STATE_KINDS:
                out.append(s)
                continue
            key = s.fold_key
            fold = self._folds.get(key)
            at = s.observed_at
            if fold is None or (fold.count == 0 and at - fold.emitted_at >= self.flush_s):
                if fold is not None or len(self._folds) < self.max_keys:
                    self._folds[key] = _Fold(emitted_at=at)
                out.append(s)
                continue
            if fold.count == 0 and fold.sent < self.burst:
                fold.sent += s.count
                fold.emitted_at = at
                out.append(s)
                continue
            first = s.first_observed_at or at
            if fold.count == 0:
                fold.pending, fold.first_at, fold.value = s, first, s.value
            fold.count += s.count
            fold.first_at = min(fold.first_at, first)
            fold.last_at = max(fold.last_at, at)
            fold.value = max(fold.value, s.value)
            self.folded += s.count
            self.dirty = True
        return out

    def due(self, now: float) -> list[Signal]:
        """Summaries of the repeats held for at least ``flush_s``; forgets keys quiet for long."""
        out: list[Signal] = []
        for key, fold in list(self._folds.items()):
            if fold.count and now - fold.emitted_at >= self.flush_s:
                out.append(self._summary(fold))
                fold.emitted_at, fold.pending, fold.count, fold.sent = now, None, 0, self.burst
                self.dirty = True
            elif not fold.count and now - fold.emitted_at > 60 * max(self.flush_s, 1.0):
                del self._folds[key]
        return out

    def flush_all(self) -> list[Signal]:
        """Every held repeat, now (the agent is stopping)."""
        out = [self._summary(f) for f in self._folds.values() if f.count]
        self._folds.clear()
        self.dirty = bool(out)
        return out

    @staticmethod
    def _summary(fold: _Fold) -> Signal:
        assert fold.pending is not None
        return replace(
            fold.pending,
            count=fold.count,
            first_observed_at=fold.first_at,
            observed_at=fold.last_at,
            value=fold.value,
            seq=0,
        )

    # Durable state --------------------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        """The held repeats, for the spool: what a restarted agent must still send."""
        self.dirty = False
        return [_fold_to_json(f) for f in self._folds.values() if f.count and f.pending is not None]

    def restore(self, data: list[dict[str, Any]]) -> None:
        for item in data:
            fold = _fold_from_json(item)
            assert fold.pending is not None
            self._folds[fold.pending.fold_key] = fold


def _fold_to_json(fold: _Fold) -> dict[str, Any]:
    s = fold.pending
    assert s is not None
    return {
        "node": s.node,
        "kind": s.kind.value,
        "gpu": [s.gpu.index, s.gpu.uuid, s.gpu.pci_bus_id],
        "code": s.code,
        "message": s.message,
        "source": s.source,
        "emitted_at": fold.emitted_at,
        "count": fold.count,
        "first_at": fold.first_at,
        "last_at": fold.last_at,
        "value": fold.value,
    }


def _fold_from_json(d: dict[str, Any]) -> _Fold:
    index, uuid, bus = d["gpu"]
    template = Signal(
        node=d["node"],
        kind=SignalKind(d["kind"]),
        gpu=GpuRef(int(index), str(uuid), str(bus)),
        code=int(d["code"]),
        message=str(d["message"]),
        source=str(d["source"]),
        observed_at=float(d["first_at"]),
    )
    return _Fold(
        float(d["emitted_at"]), template, int(d["count"]), float(d["first_at"]), float(d["last_at"]), float(d["value"])
    )
