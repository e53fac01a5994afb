"""Floods: a paged incident that keeps folding signals gets its count in its thread, at most once
per ``every_s`` (best effort, not persisted: the count is in the store either way)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controller.store import PendingAction
from controller.vocab.actions import PageUpdate


class FoldReports:
    def __init__(
        self,
        every_s: float,
        counts: Callable[[Sequence[str]], dict[str, int]],
        schedule: Callable[[PendingAction], None],
        clock: Callable[[], float],
    ) -> None:
        self.every_s = every_s
        self._counts = counts  # incident ids -> their signal counts, from the store
        self._schedule = schedule
        self._clock = clock
        self._paged: dict[str, str] = {}  # incident id -> node, for incidents paged by this process
        self._folded: set[str] = set()
        self._last = clock()

    def paged(self, incident_id: str, node: str) -> None:
        self._paged[incident_id] = node

    def folded(self, incident_id: str) -> None:
        if incident_id in self._paged:
            self._folded.add(incident_id)

    def resolved(self, incident_id: str) -> None:
        """No more counts for it."""
        self._paged.pop(incident_id, None)
        self._folded.discard(incident_id)

    def report(self) -> int:
        """Tell the pager how many signals each flooding incident has folded; returns how many were told."""
        now = self._clock()
        if now - self._last < self.every_s or not self._folded:
            return 0
        self._last = now
        counts = self._counts(sorted(self._folded))
        for incident_id, count in counts.items():
            text = f"Still happening: {count} signals folded into this incident so far"
            note = PageUpdate(incident_id, self._paged[incident_id], "COUNT", text)
            self._schedule(PendingAction(incident_id, note, 0))
        self._folded.clear()
        return len(counts)
