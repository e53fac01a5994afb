"""The controller's way to a connected agent: one outgoing queue per agent stream.

The agent gateway opens a node's queue when its agent connects and closes it when the stream ends;
the engine and its check requests send through it (an acknowledgement once actions are done, a
RunCheck), and learn at once when that agent is not connected. Both get the same instance through
their constructors.
"""

from __future__ import annotations

import asyncio

from protos.vigil.v1 import agent_pb2

Outbox = asyncio.Queue[agent_pb2.ControllerMessage | None]  # None: the stream's reader ended (the gateway's own)


class AgentOutboxes:
    def __init__(self) -> None:
        self._queues: dict[str, Outbox] = {}

    def open(self, node: str) -> Outbox:
        """A new stream from ``node``'s agent: it replaces any earlier one."""
        outbox: Outbox = asyncio.Queue()
        self._queues[node] = outbox
        return outbox

    def close(self, node: str, outbox: Outbox) -> bool:
        """The stream that owned ``outbox`` ended; False when a newer stream has replaced it."""
        if self._queues.get(node) is not outbox:
            return False
        del self._queues[node]
        return True

    def is_open(self, node: str) -> bool:
        """Whether a stream from ``node``'s agent is open now."""
        return node in self._queues

    def send(self, node: str, message: agent_pb2.ControllerMessage) -> bool:
        """Queue a message for ``node``'s agent; False when that agent is not connected."""
        outbox = self._queues.get(node)
        if outbox is None:
            return False
        outbox.put_nowait(message)
        return True
