"""Who else must know what happens to a node: the job monitor. A node being taken out of service
stops the jobs running on it; an early warning on a node asks them to save (``controller.jobs.save_now``).
The engine publishes each quarantine it carries out (not a dry-run, not one the breaker holds) and
each new signal of an early-warning kind; the feed is given to both through their constructors, so
neither reaches into the other to wire a callback."""

from __future__ import annotations

from collections.abc import Callable

from controller.vocab.actions import Quarantine


class NodeEvents:
    def __init__(self) -> None:
        self._listeners: list[Callable[[Quarantine], None]] = []
        self._warned: list[Callable[[str, str], None]] = []

    def subscribe(self, listener: Callable[[Quarantine], None]) -> None:
        self._listeners.append(listener)

    def publish(self, action: Quarantine) -> None:
        for listener in self._listeners:
            listener(action)

    def subscribe_warnings(self, listener: Callable[[str, str], None]) -> None:
        """``listener(node, what)`` for each early warning."""
        self._warned.append(listener)

    def warn(self, node: str, what: str) -> None:
        for listener in self._warned:
            listener(node, what)
