"""Who else must know that a node is being taken out of service: the job monitor stops the jobs
running on it. The engine publishes each quarantine it carries out (not a dry-run, not one the
breaker holds); the feed is given to both through their constructors, so neither reaches into the
other to wire a callback."""

from __future__ import annotations

from collections.abc import Callable

from controller.actions import Quarantine


class QuarantineFeed:
    def __init__(self) -> None:
        self._listeners: list[Callable[[Quarantine], None]] = []

    def subscribe(self, listener: Callable[[Quarantine], None]) -> None:
        self._listeners.append(listener)

    def publish(self, action: Quarantine) -> None:
        for listener in self._listeners:
            listener(action)
