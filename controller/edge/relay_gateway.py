"""Agents that come through a relay (``vigil relay``, ``controller.relay``): many agents' streams on
one ``AgentRelay.Relay`` stream. Each agent stream the relay carries is a session of its own
(``controller.edge.agent_sessions``), admitted, recorded and acknowledged as if it were connected
here; what the controller costs for it is the session's bookkeeping, not a connection and a stream.

The relay numbers its agents' streams. A stream's messages are handled in their order, by one of a
few workers per relay taking the streams with messages waiting in turn (an idle agent costs no task,
and a backlog waits here, not as thousands of tasks in the event loop's queue); a stream whose new
message carries a signal the policy may act on gets a task of its own at once, so an XID 79 is not
decided behind every record-only signal that came before it when the controller is behind. The
relay is told first what the policy only records (``RelayDown.lanes``), and sends such a message
ahead of its own backlog (``controller.vocab.lanes``). Its
replies go back on the relay's stream, batched with every other reply ready at the same turn of the
event loop. The
relay says when an agent's stream ended; the controller ends one by refusing it (a ``StreamEnd`` with
the status, which the relay gives the agent) and forgets it when the relay says it ended. When the
relay's own stream ends, every agent it carried is disconnected.

Under TLS only a ``relay:`` certificate may call it (``controller.edge.authz``); the relay has
checked that each agent's certificate names the node its Hello names, or, for the DaemonSet's
shared ``agents`` certificate, passed on the agent's service-account token, which is reviewed here
for the node it proves (and again every ``agent_tokens.cache_s``, as on a direct stream).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import structlog
from google.protobuf.message import DecodeError

from controller.edge.agent_sessions import AgentSessions, Refused, first_hello
from controller.edge.authz import TokenRefused, caller, token_node, token_still_proves
from controller.nodes.agent_outboxes import Message, Outbox
from controller.vocab.lanes import LANE_KEY, lanes_message
from protos.vigil.v1 import agent_pb2, relay_pb2, relay_pb2_grpc
from vigil_core.tls import Identity

if TYPE_CHECKING:  # the kubernetes client is imported only where agents may bring tokens
    from controller.act.kube.tokens import TokenReviewer

log = structlog.get_logger(__name__)

REPLIES_PER_MESSAGE = 1000  # DownItems in one RelayDown
WORKERS = 32  # per relay: the streams with messages waiting are handled this many at a time
MAX_WAITING_BYTES = 64 << 20  # a relay's messages not handled yet: past this its stream is not read until half of it is
OK, INTERNAL = grpc.StatusCode.OK.value[0], grpc.StatusCode.INTERNAL.value[0]


class RelayedOutbox(Outbox[Message]):
    """A relayed agent's outgoing messages: each goes on to the relay's stream as it is put. Holds its
    relay and stream number, not a closure (a function and its cells: four objects per agent for the
    garbage collector to walk), and keeps nothing it was given (a new list per message would be
    long-lived garbage: each full collection comes sooner)."""

    __slots__ = ("_relay", "_stream_id")

    def __init__(self, relay: _Relay, stream_id: int) -> None:
        super().__init__()
        self._relay = relay
        self._stream_id = stream_id

    def put_nowait(self, message: Message) -> None:
        if message is not None:
            self._relay.send(relay_pb2.DownItem(stream=self._stream_id, message=message.SerializeToString()))

    def _wake(self) -> None:  # what was handed over from a stream that closed goes on at once
        items, self._items = self._items, []
        for message in items:
            self.put_nowait(message)


@dataclass(slots=True, eq=False)
class _Stream:
    """One agent stream carried by the relay."""

    id: int
    peer: str
    outbox: RelayedOutbox
    waiting: list[bytes] = field(default_factory=list)  # its messages not handled yet, in order
    token: str = ""  # a shared-certificate agent's service-account token, which proves its node
    who: Identity | None = None  # the node its token proved
    reviewed_at: float = 0.0  # when its token was last reviewed
    node: str = ""  # once its Hello was written
    busy: bool = False  # its messages are being handled, or it waits its turn for a worker
    running: bool = False  # a task handles its messages now
    finishing: bool = False  # the agent sent all it will: the stream ends once they are handled
    over: bool = False  # ended: what still comes from the relay is dropped


class _Relay:
    """One relay's stream: its agents' sessions, and the replies going back."""

    def __init__(self, sessions: AgentSessions, peer: str, tokens: TokenReviewer | None) -> None:
        self.sessions = sessions
        self.peer = peer
        self.tokens = tokens
        self.streams: dict[int, _Stream] = {}
        self.replies: list[relay_pb2.DownItem] = []
        self.ready = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.turns: deque[_Stream] = deque()  # streams with messages waiting for a worker, in order
        self.workers = 0
        self.waiting_bytes = 0  # of every stream's messages not handled yet
        self.drained = asyncio.Event()
        self.drained.set()

    def send(self, item: relay_pb2.DownItem) -> None:
        self.replies.append(item)
        self.ready.set()

    def take(self, item: relay_pb2.UpItem) -> None:
        """One item from the relay, in its stream's order."""
        stream = self.streams.get(item.stream)
        if item.HasField("end"):
            if stream is None:
                return
            if item.end.code == OK:  # the agent closed its side: what it sent is answered first
                stream.finishing = True
                if not stream.busy:
                    self._finish(stream)
                return
            del self.streams[item.stream]  # its call is over: the relay says nothing more of it
            stream.over = True  # a busy stream's task closes it when it sees this
            if not stream.busy:
                self._close(stream)
            return
        if stream is None:
            stream = _Stream(item.stream, item.peer or self.peer, RelayedOutbox(self, item.stream))
            stream.token = item.token
            self.streams[item.stream] = stream
        if stream.over:
            return
        stream.waiting.append(item.message)
        self._waiting(len(item.message))
        if stream.running:
            return  # handled in order by the task handling it now
        if self.sessions.urgent(item.message):
            # Its own task now, not in turn behind the backlog; running from here on, so that a second
            # urgent message taken before that task starts is left to it, never given a second task.
            stream.busy = stream.running = True
            self._spawn(self._handle(stream))
        elif not stream.busy:
            stream.busy = True
            self.turns.append(stream)
            if self.workers < WORKERS:
                self.workers += 1
                self._spawn(self._work())

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _work(self) -> None:
        """A worker: the streams with messages waiting, in turn, until none wait."""
        try:
            while self.turns:
                stream = self.turns.popleft()
                if stream.busy and not stream.running:  # else an urgent task took it meanwhile
                    await self._handle(stream)
        finally:
            self.workers -= 1

    async def _handle(self, stream: _Stream) -> None:
        stream.running = True
        try:
            while stream.waiting and not stream.over:
                raw = stream.waiting.pop(0)
                self._waiting(-len(raw))
                try:
                    message = agent_pb2.AgentMessage.FromString(raw)
                except DecodeError as exc:
                    raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid AgentMessage: {exc}") from None
                if not stream.node:
                    hello = first_hello(message)
                    # A node certificate the relay checked; a token the controller reviews; the
                    # relay's own room for Hellos, not the pacing, meters them.
                    self.sessions.admit(hello, await self._token_node(stream), stream.peer, paced=False)
                    acked = await self.sessions.start(hello, stream.peer, stream.outbox)
                    stream.node = hello.node
                    stream.outbox.put_nowait(agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked)))
                else:
                    await self._token_again(stream)
                    await self.sessions.handle(stream.node, message, stream.outbox)
        except Refused as refused:
            end = relay_pb2.StreamEnd(code=refused.code.value[0], details=refused.why)
            end.retry_after_ms = refused.retry_after_ms
            self._finish(stream, end)
        except Exception as exc:  # a bug: this agent's stream ends (as a direct one's call would), not the relay's
            log.exception("relayed_stream_failed", node=stream.node, relay=self.peer)
            self._finish(stream, relay_pb2.StreamEnd(code=INTERNAL, details=f"the controller failed: {exc!r:.200}"))
        finally:
            stream.busy = stream.running = False
            if stream.finishing:
                self._finish(stream)
            elif stream.over:
                self._close(stream)

    async def _token_node(self, stream: _Stream) -> Identity | None:
        """The node a shared-certificate agent's token proves; None where the relay checked the agent's
        own certificate (or in plaintext)."""
        if not stream.token:
            return None
        try:
            stream.who = await token_node(self.tokens, stream.token)
        except TokenRefused as refused:
            raise Refused(refused.code, refused.why) from None
        stream.reviewed_at = time.monotonic()
        return stream.who

    async def _token_again(self, stream: _Stream) -> None:
        """A token-proven stream's token reviewed again every ``recheck_s``, as on a direct stream."""
        if not stream.token or self.tokens is None or stream.who is None:
            return
        if time.monotonic() - stream.reviewed_at < self.tokens.recheck_s:
            return
        why = await token_still_proves(self.tokens, stream.token, stream.who)
        if why is not None:
            stream.reviewed_at = time.monotonic()
        if why:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, why)

    def _finish(self, stream: _Stream, end: relay_pb2.StreamEnd | None = None) -> None:
        """The controller ends the stream (OK unless ``end`` says otherwise); the relay's word that
        its call is over forgets it."""
        if not stream.over:
            self.send(relay_pb2.DownItem(stream=stream.id, end=end or relay_pb2.StreamEnd(code=OK)))
            stream.over = True
        self._close(stream)

    def _waiting(self, change: int) -> None:
        self.waiting_bytes += change
        if self.waiting_bytes >= MAX_WAITING_BYTES:
            self.drained.clear()
        elif self.waiting_bytes < MAX_WAITING_BYTES // 2:
            self.drained.set()

    def _close(self, stream: _Stream, say: bool = True) -> None:
        self._waiting(-sum(len(raw) for raw in stream.waiting))
        stream.waiting.clear()
        if stream.node:
            self.sessions.end(stream.node, stream.outbox, say)
            stream.node = ""

    def close(self) -> None:
        """The relay's stream ended: every agent it carried is gone."""
        for task in self.tasks:
            task.cancel()
        for stream in self.streams.values():
            stream.over = True
            if not stream.running:  # a running one's task closes it as it is cancelled
                self._close(stream, say=False)  # said once, for all: relay_disconnected
        self.streams.clear()
        self.turns.clear()


class RelayGateway(relay_pb2_grpc.AgentRelayServicer):
    def __init__(self, sessions: AgentSessions) -> None:
        self.sessions = sessions
        self.tokens: TokenReviewer | None = None  # where agents' tokens are reviewed (set by the daemon)
        self._relays: set[_Relay] = set()  # the relays' streams open now

    def waiting(self) -> tuple[int, int]:
        """What the relays carried here and the controller has not handled yet: its bytes, and the
        agent streams waiting their turn for a worker (``vigil_controller_relayed_waiting_*``)."""
        return sum(r.waiting_bytes for r in self._relays), sum(len(r.turns) for r in self._relays)

    async def Relay(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[relay_pb2.RelayUp], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[relay_pb2.RelayDown]:
        peer = context.peer()  # read now: the call's context is not to be touched once it ended
        lane = dict(context.invocation_metadata() or ()).get(LANE_KEY, "main")  # a relay's urgent stream says so
        name = str(caller() or peer)
        relay = _Relay(self.sessions, peer, self.tokens)
        self._relays.add(relay)
        log.info("relay_connected", relay=name, lane=lane)
        reader = asyncio.create_task(self._read(relay, request_iterator))
        reader.add_done_callback(lambda _: relay.ready.set())
        try:
            yield relay_pb2.RelayDown(lanes=lanes_message(self.sessions.record_only()))  # the relay's lanes
            while True:
                await relay.ready.wait()
                relay.ready.clear()
                while relay.replies:
                    batch, relay.replies = relay.replies[:REPLIES_PER_MESSAGE], relay.replies[REPLIES_PER_MESSAGE:]
                    yield relay_pb2.RelayDown(items=batch)
                if reader.done():
                    reader.result()
                    return
        finally:
            reader.cancel()
            carried = len(relay.streams)
            relay.close()
            self._relays.discard(relay)
            log.info("relay_disconnected", relay=name, lane=lane, agents=carried)

    @staticmethod
    async def _read(relay: _Relay, requests: AsyncIterator[relay_pb2.RelayUp]) -> None:
        async for up in requests:
            for item in up.items:
                relay.take(item)
            await relay.drained.wait()  # behind: the relay waits (gRPC's flow control), and its agents with it
