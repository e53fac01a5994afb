"""The controller's way to a connected agent: one outgoing queue per agent stream.

The agent gateway opens a node's queue when its agent connects and closes it when the stream ends;
the engine and its check requests send through it (an acknowledgement once actions are done, a
RunCheck), and learn at once when that agent is not connected. Both get the same instance through
their constructors.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from protos.vigil.v1 import agent_pb2

Message = agent_pb2.ControllerMessage | None  # None: the stream's reader ended (the gateway's own)
T = TypeVar("T")


class Outbox(Generic[T]):
    """One agent stream's outgoing messages, read by its stream alone. What an ``asyncio.Queue``
    does for one reader, in a list and one future: a Queue holds four deques and an Event, about
    3.5 KB, and there is one per connected agent (350 MB at 100,000). A relay's agent streams use
    it too, for what comes back to them from the controller."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, message: T) -> None:
        self._items.append(message)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> T:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)

    def get_nowait(self) -> T:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.pop(0)

    def hand_over(self, to: Outbox[T], before: bool) -> None:
        """Give ``to`` what this stream did not send (not its end mark), ahead of its own messages
        when they were sent later (``before``), else after them."""
        unsent = [m for m in self._items if m is not None]
        self._items = []
        if unsent:
            to._items = [*unsent, *to._items] if before else [*to._items, *unsent]
            to._wake()

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)


class AgentOutboxes:
    """A node's agent may have more than one stream open for a moment (a reconnection overlapping
    the stream it replaces, a Hello answered late): the node is connected while any is open, and
    what the controller sends goes through the newest."""

    def __init__(self) -> None:
        self._queues: dict[str, list[Outbox[Message]]] = {}
        self.closed = 0  # streams closed so far

    def open(self, node: str, outbox: Outbox[Message] | None = None) -> Outbox[Message]:
        """A new stream from ``node``'s agent (its outgoing messages ``outbox``, a new one when not
        given): it takes what is sent from now on."""
        outbox = outbox or Outbox[Message]()
        self._queues.setdefault(node, []).append(outbox)
        return outbox

    def close(self, node: str, outbox: Outbox[Message]) -> bool:
        """The stream that owned ``outbox`` ended; True when it was the node's last one open. What
        it had not sent goes to the newest stream still open, in the order it was sent."""
        open_now = self._queues.get(node, [])
        if outbox in open_now:
            self.closed += 1
            opened_before_newest = open_now.index(outbox) < len(open_now) - 1
            open_now.remove(outbox)
            if open_now:  # what it did not send goes through the stream still open: nothing is lost
                outbox.hand_over(open_now[-1], before=opened_before_newest)
        if open_now:
            return False
        self._queues.pop(node, None)
        return True

    def sessions(self) -> tuple[int, int]:
        """Nodes with a stream open now, and streams closed so far."""
        return len(self._queues), self.closed

    def is_open(self, node: str) -> bool:
        """Whether a stream from ``node``'s agent is open now."""
        return bool(self._queues.get(node))

    def send(self, node: str, message: agent_pb2.ControllerMessage) -> bool:
        """Queue a message for ``node``'s agent (its newest stream); False when it is not connected."""
        open_now = self._queues.get(node)
        if not open_now:
            return False
        open_now[-1].put_nowait(message)
        return True
