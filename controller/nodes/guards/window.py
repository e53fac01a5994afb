"""A guard's window: what was seen within the last so many seconds, each with when. Pure.

The guards count what went on within their windows (the nodes quarantined, those of each domain,
those with one fault) on every decision. Filtered anew by a pass over every entry, a burst of a
thousand quarantines made a thousand passes over up to a thousand entries each, in Python, on the
event loop: the burst's cost grew with its square, and with every burst before it in the window.

A window keeps its entries oldest first in one dict, and a ``GroupWindow`` the count of each
group's members beside them: a change copies the dicts (in C, nothing in Python per entry), and
forgetting the expired entries reads only those. Immutable all the same: each change returns a new
window, so a guard's state is still a value (compared, stored, put back when a batch fails).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Window(Generic[K]):
    """Keys, each with when it was seen (its latest, or with ``first`` when it came in), oldest first."""

    at: Mapping[K, float] = field(default_factory=dict)  # never changed in place

    @classmethod
    def of(cls, entries: Iterable[tuple[K, float]], first: bool = False) -> Window[K]:
        """From (key, when) pairs in any order (a stored window, or one with a key twice)."""
        at: dict[K, float] = {}
        for key, when in sorted(entries, key=lambda e: e[1]):
            if key in at:
                if first:
                    continue
                del at[key]
            at[key] = when
        return cls(at)

    def __len__(self) -> int:
        return len(self.at)

    def __contains__(self, key: object) -> bool:
        return key in self.at

    def __iter__(self) -> Iterator[K]:
        return iter(self.at)

    def entries(self) -> list[tuple[K, float]]:
        """Oldest first: the stored form."""
        return list(self.at.items())

    def after(self, cutoff: float) -> Window[K]:
        """Without the entries seen at or before ``cutoff``: reads only those."""
        expired = 0
        for when in self.at.values():
            if when > cutoff:
                break
            expired += 1
        return self if not expired else Window(dict(islice(self.at.items(), expired, None)))

    def seen(self, key: K, when: float, first: bool = False) -> Window[K]:
        """With ``key`` seen at ``when``: a key already in keeps the later of the two (``first``: the
        one it has)."""
        if key in self.at and (first or self.at[key] >= when):
            return self
        at = dict(self.at)
        at.pop(key, None)
        if at and when < next(reversed(at.values())):  # the clock stepped back: keep oldest first
            return Window.of([*at.items(), (key, when)], first)
        at[key] = when
        return Window(at)


@dataclass(frozen=True, slots=True)
class GroupWindow:
    """A window of (group, member) pairs (a domain and its nodes, a fault's rule and its nodes) with
    how many members each group has in it."""

    window: Window[tuple[str, str]] = field(default_factory=Window)
    counts: Mapping[str, int] = field(default_factory=dict)  # group -> members in the window; never changed in place

    @classmethod
    def of(cls, entries: Iterable[tuple[str, str, float]], first: bool = False) -> GroupWindow:
        window = Window.of((((g, m), t) for g, m, t in entries), first)
        return cls(window, dict(Counter(g for g, _ in window)))

    def __contains__(self, pair: object) -> bool:
        return pair in self.window

    def __len__(self) -> int:
        return len(self.window)

    def count(self, group: str) -> int:
        return self.counts.get(group, 0)

    def members(self, group: str) -> list[tuple[str, float]]:
        """A group's members and when, oldest first: a pass over the whole window (for a page, not a decision)."""
        return [(m, t) for (g, m), t in self.window.at.items() if g == group]

    def entries(self) -> list[tuple[str, str, float]]:
        """Oldest first: the stored form."""
        return [(g, m, t) for (g, m), t in self.window.at.items()]

    def after(self, cutoff: float) -> GroupWindow:
        window = self.window.after(cutoff)
        if window is self.window:
            return self
        counts = dict(self.counts)
        for group, _ in islice(self.window.at, len(self.window) - len(window)):  # the expired, oldest first
            counts[group] -= 1
            if not counts[group]:
                del counts[group]
        return GroupWindow(window, counts)

    def seen(self, group: str, member: str, when: float, first: bool = False) -> GroupWindow:
        window = self.window.seen((group, member), when, first)
        if window is self.window:
            return self
        if (group, member) in self.window:
            return GroupWindow(window, self.counts)
        return GroupWindow(window, {**self.counts, group: self.counts.get(group, 0) + 1})
