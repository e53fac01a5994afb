"""A pager that keeps what it was asked to send, for tests that read the pages."""

from __future__ import annotations

from controller.act.actuators import NullPager
from controller.vocab.actions import Page


class RecordingPager(NullPager):
    def __init__(self, sent: list[Page] | None = None) -> None:
        self.sent: list[Page] = [] if sent is None else sent  # a caller's own list, where it has one

    def page(self, action: Page) -> str:
        self.sent.append(action)
        return "recorded"
