"""The relay's streams to the controller (``AgentRelay.Relay``): every agent stream it carries,
numbered, in one direction; the controller's replies and its ends of streams in the other.

Two of them, each on a connection of its own: one for the agents whose first Hello said faults
wait (``Hello.urgent_waiting``), every message of such an agent stream on it, and one for all the
others. A fault waits behind no fleet on the way either: with one stream, an urgent Hello, sent
first by the relay, still waited 2-3 s behind what gRPC had already taken of the fleet's Hellos on
the same stream (measured at 100,000 agents connecting at once: the relay's own queue held 0-5
messages, the controller read the stream that far behind). The controller takes each as a relay's
stream of its own (its agent streams are numbered by the relay, never on both).

When it breaks every agent stream it carried is told (``Lost``: their sessions were the
controller's and ended with the stream; the agent's call is kept for a Hello again, or ended
UNAVAILABLE, ``controller.relay.server``), and while it is down a new agent stream waits for it (up
to ``controller_wait_s``, then UNAVAILABLE: its agent tries again, as with a controller that is down).
Nothing is kept to send later; an agent resends what it has not had acknowledged.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import structlog

from controller.nodes.agent_outboxes import Outbox
from controller.relay.hello_room import Place
from controller.relay.metrics import RelayMetrics
from controller.vocab.lanes import LANE_KEY, URGENT, Lanes
from protos.vigil.v1 import relay_pb2, relay_pb2_grpc
from vigil_core.cert_reload import CertificateSource
from vigil_core.tls import aio_channel
from vigil_core.waiting import backoff_delay, wait_event

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Lost:
    """The stream to the controller broke: this agent stream's session is over (said to its stream
    instead of an end, so that its call can be kept for a new session)."""

    why: str


# What comes back to an agent stream: ControllerMessages (encoded), then its end or the uplink's loss;
# or, for a Hello the relay answers itself, its place (``controller.relay.hello_room``).
Back = bytes | relay_pb2.StreamEnd | Lost | Place
OK, CANCELLED, UNAVAILABLE = (
    code.value[0] for code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
)
ITEM_OVERHEAD = 1024  # an UpItem's bytes beside its agent's message, with room to spare
UP_BATCH_BYTES = 1 << 20  # a RelayUp carries what is ready up to this much, or one message alone when bigger
LINGER_MS = 20.0  # what only waits to be recorded may wait this long for more: one write for many
MAX_QUEUED_BYTES = 64 << 20  # not sent yet past this much: the agents' streams are not read until it drains
# The longest pause between two rounds of tries for the controller: a relay holds its agents' calls
# while it has none, so a new leader is reached at most this long after it serves (with 2 s, 0.2-3.2 s
# after at 100,000 agents); a few relays trying a closed port that often cost nothing.
RETRY_CAP_S = 0.5


def _done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def take(lanes: tuple[deque[relay_pb2.UpItem], ...], limit: int) -> list[relay_pb2.UpItem]:
    """The next RelayUp's items: the first lane's before the next's, in order, up to ``limit`` bytes
    (an item bigger than that goes alone: the relay takes no agent message that would not fit in
    one with room to spare); taken off the lanes."""
    out: list[relay_pb2.UpItem] = []
    size = 0
    for lane in lanes:
        while lane:
            n = lane[0].ByteSize() + 8  # its tag and length in the RelayUp
            if out and size + n > limit:
                return out
            out.append(lane.popleft())
            size += n
    return out


class Uplink:
    def __init__(
        self,
        target: str,
        tls: CertificateSource | None,
        max_message_bytes: int = 4 << 20,
        metrics: RelayMetrics | None = None,
        linger_ms: float = 0.0,
    ) -> None:
        self.targets = [t.strip() for t in target.split(",") if t.strip()]  # every replica's, as agents list them
        self.target = self.targets[0]  # the one tried now: the leader's once found
        self.metrics = metrics or RelayMetrics()
        self._tls = tls
        self._max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)
        self._streams: dict[int, Outbox[Back]] = {}  # each agent stream's way back: its messages, then its end
        self._urgent_streams: set[int] = set()  # those carried on the urgent stream to the controller
        self._urgent_up: deque[relay_pb2.UpItem] = deque()  # what waits to be sent on it, in order
        self._urgent_ready = asyncio.Event()
        self.ended = 0  # agent streams ended so far
        # What waits to be sent, in two lanes (``controller.vocab.lanes``): a stream whose message may
        # act goes first with its messages waiting, in their order (``_first``, its stream ``_hot``
        # until the lane is empty), everything else in the order it came (``_up``).
        self._lanes: Lanes | None = None  # what the controller said its policy only records
        self._first: deque[relay_pb2.UpItem] = deque()
        self._hot: set[int] = set()
        self._up: deque[relay_pb2.UpItem] = deque()
        self._in_up: dict[int, int] = {}  # stream -> its items in ``_up`` (an idle stream's fault: no scan)
        self._queued_bytes = 0
        self._generation = 0  # of the stream to the controller: one more at each connection
        self._ready = asyncio.Event()
        self._linger_s = linger_ms / 1000
        self._now: asyncio.Future[None] | None = None  # while the sender lingers: done ends the linger
        self._drained = asyncio.Event()  # set while what waits to be sent is below MAX_QUEUED_BYTES
        self._drained.set()
        self.connected = asyncio.Event()
        self.metrics.watch(lambda: len(self._streams), self.connected.is_set, lambda: self._queued_bytes)

    @property
    def carried(self) -> int:
        return len(self._streams)

    def sessions(self) -> tuple[int, int]:
        """Agent streams carried now, and ended so far."""
        return len(self._streams), self.ended

    def open(self, box: Outbox[Back] | None = None, urgent: bool = False) -> tuple[int, Outbox[Back]]:
        """A new agent stream (a new session: an agent's call may hold several, one after another);
        its messages back will arrive in the outbox returned (``box``, or a new one). ``urgent``:
        its Hello says faults wait: it goes on the urgent stream to the controller, all of it."""
        stream, box = next(self._ids), box if box is not None else Outbox[Back]()
        self._streams[stream] = box
        if urgent:
            self._urgent_streams.add(stream)
        return stream, box

    def send(self, stream: int, message: bytes, peer: str = "", token: str = "") -> None:
        if stream in self._streams:  # else its uplink broke: its agent is being told
            first = self._lanes is not None and stream not in self._hot and self._lanes.urgent(message)
            self._queue(relay_pb2.UpItem(stream=stream, message=message, peer=peer, token=token), first)

    def finish(self, stream: int) -> None:
        """The agent sent all it will (it closed its side): the controller answers what it sent, then
        ends the stream."""
        if stream in self._streams:
            self._queue(relay_pb2.UpItem(stream=stream, end=relay_pb2.StreamEnd(code=OK)))

    def end(self, stream: int) -> None:
        """The agent's call is over (however it ended): the controller forgets the stream; said once
        for every stream opened, also one the controller ended."""
        if self._streams.pop(stream, None) is not None:
            self.ended += 1
            self._queue(relay_pb2.UpItem(stream=stream, end=relay_pb2.StreamEnd(code=CANCELLED)))
            self._urgent_streams.discard(stream)

    def _queue(self, item: relay_pb2.UpItem, first: bool = False) -> None:
        if item.stream in self._urgent_streams:  # on the urgent stream, at once: it carries little
            self._urgent_up.append(item)
            self._urgent_ready.set()
            return
        if item.stream in self._hot:  # after its messages in the first lane, never before them
            self._first.append(item)
        elif first:  # with its messages waiting in the other lane, in their order
            if self._in_up.pop(item.stream, 0):
                self._first.extend(waiting for waiting in self._up if waiting.stream == item.stream)
                self._up = deque(waiting for waiting in self._up if waiting.stream != item.stream)
            self._first.append(item)
            self._hot.add(item.stream)
            self.metrics.first.inc()
        else:
            self._up.append(item)
            self._in_up[item.stream] = self._in_up.get(item.stream, 0) + 1
        self._queued_bytes += len(item.message)
        if self._queued_bytes >= MAX_QUEUED_BYTES:
            self._drained.clear()
        if self._worth_a_write():
            self._stop_lingering()
        self._ready.set()

    def _worth_a_write(self) -> bool:
        """What waits goes now, lingering or not: a message that may act, or a batch's worth."""
        return bool(self._first) or self._queued_bytes >= UP_BATCH_BYTES

    def _stop_lingering(self) -> None:
        if self._now is not None:
            _done(self._now)

    async def _linger(self, generation: int) -> None:
        """Wait a moment for more before writing what waits in the other lane alone: one message to
        the controller for many agents' (each message is work for both ends' loops, its size hardly),
        ended at once by a message that may act or by a batch's worth. Not before the controller has
        said which messages may act (until then a fault is in the other lane too), and never for the
        sender of a stream past (``generation``): the wait is the stream's now, one at a time, and
        only its own timer, a write's worth or a break ends it."""
        if generation != self._generation:
            return
        if not (self._up and self._linger_s and self._lanes is not None) or self._worth_a_write():
            return
        loop = asyncio.get_running_loop()
        now = self._now = loop.create_future()
        timer = loop.call_later(self._linger_s, _done, now)
        try:
            await now
        finally:
            timer.cancel()
            if self._now is now:
                self._now = None

    async def room(self) -> None:
        """Wait while too much waits to be sent: an agent's next message is read only then, so a
        controller that falls behind slows the agents (gRPC's flow control) instead of filling the
        relay's memory."""
        await self._drained.wait()

    def _sent(self, items: list[relay_pb2.UpItem]) -> None:
        self._queued_bytes -= sum(len(item.message) for item in items)
        if self._queued_bytes < MAX_QUEUED_BYTES // 2:
            self._drained.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the stream to the controller open, reconnecting with backoff, until ``stop``."""
        attempt = 0
        while not stop.is_set():
            files = self._tls.latest() if self._tls is not None else None  # renewed files: the next connection's
            size = self._max_message_bytes
            channel = aio_channel(self.target, files, max_message_bytes=size)
            # A connection of its own (each channel its own: ``tls.RECONNECT_CLIENT``), so that
            # nothing of the fleet's is ahead of it in any buffer.
            urgent_channel = aio_channel(self.target, files, max_message_bytes=size)
            was_up = False
            readers: list[asyncio.Task[None]] = []
            try:
                self._generation += 1  # a broken stream's sender, still waiting, must not take the next one's
                stub, urgent_stub = (
                    relay_pb2_grpc.AgentRelayStub(channel),
                    relay_pb2_grpc.AgentRelayStub(urgent_channel),
                )
                call = stub.Relay(self._sending(self._generation))
                urgent_call = urgent_stub.Relay(self._sending_urgent(self._generation), metadata=((LANE_KEY, URGENT),))
                await asyncio.gather(call.wait_for_connection(), urgent_call.wait_for_connection())
                self.connected.set()
                was_up, attempt = True, 0
                log.info("relay_uplink_connected", controller=self.target)
                readers = [asyncio.create_task(self._read(c)) for c in (call, urgent_call)]
                done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
                for reader in done:
                    reader.result()  # the first to end: its error, if it failed
                why = "the controller ended the stream"
            except grpc.aio.AioRpcError as exc:
                why = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # never let the uplink die: a relay without it carries nobody, silently
                log.exception("relay_uplink_error", controller=self.target)
                why = f"{exc!r:.200}"
            finally:
                self.connected.clear()
                for reader in readers:
                    reader.cancel()
                await asyncio.gather(channel.close(grace=None), urgent_channel.close(grace=None))
            self._break(why)
            if was_up:
                self.metrics.uplink_losses.inc()
                log.warning("relay_uplink_lost", controller=self.target, why=why)
            else:
                self.metrics.uplink_tries_failed.inc()
                if attempt % 10 == 0:  # not reached again: said now and then, not at every try
                    log.warning("relay_uplink_unreachable", controller=self.target, why=why, tries=attempt + 1)
            # The next replica at once (the leader may be another); round the list, after a pause: a
            # few relays, not a fleet, so they try again soon, while their agents wait for them.
            self.target = self.targets[(self.targets.index(self.target) + 1) % len(self.targets)]
            pause = backoff_delay(attempt, base=0.25, cap=RETRY_CAP_S) if self.target == self.targets[0] else 0.05
            if not await wait_event(stop, pause) and self.target == self.targets[0]:
                attempt += 1

    async def _read(self, call: AsyncIterator[relay_pb2.RelayDown]) -> None:
        """What the controller sends on one of the two streams, until it ends."""
        async for down in call:
            self._deliver(down)

    def _deliver(self, down: relay_pb2.RelayDown) -> None:
        if down.HasField("lanes"):
            self._lanes = Lanes.from_message(down.lanes)
            log.info("relay_lanes", record_only_xids=len(self._lanes.xids), acting_xids=len(self._lanes.acting_xids))
        self.metrics.messages.labels("down").inc(len(down.items))
        self.metrics.uplink_messages.labels("down").inc()
        for item in down.items:
            box = self._streams.get(item.stream)
            if box is None:  # its agent is gone already
                continue
            box.put_nowait(item.end if item.HasField("end") else item.message)

    def _break(self, why: str) -> None:
        """Every agent stream carried is ended: the controller has ended their sessions. The broken
        stream's sender, if gRPC still holds it waiting, is of a generation past from here: what is
        queued before the next stream opens is that stream's, not lost into this one."""
        self._generation += 1
        self._stop_lingering()
        self._up.clear()
        self._first.clear()
        self._hot.clear()
        self._urgent_up.clear()
        self._urgent_streams.clear()
        self._urgent_ready.set()  # its senders, of a generation past now, end
        self._ready.set()
        self._in_up.clear()
        self._lanes = None  # the next controller says its own
        self._queued_bytes = 0
        self._drained.set()
        streams, self._streams = self._streams, {}
        self.ended += len(streams)
        lost = Lost(f"the relay lost the controller ({why:.200})")
        for box in streams.values():
            box.put_nowait(lost)

    async def _sending_urgent(self, generation: int) -> AsyncIterator[relay_pb2.RelayUp]:
        """What waits for the urgent stream, for the stream of this generation only, at once."""
        while True:
            await self._urgent_ready.wait()
            if generation != self._generation:
                return
            self._urgent_ready.clear()
            while generation == self._generation and (batch := take((self._urgent_up,), UP_BATCH_BYTES)):
                yield relay_pb2.RelayUp(items=batch)
                self.metrics.messages.labels("up").inc(len(batch))
                self.metrics.uplink_messages.labels("up").inc()

    async def _sending(self, generation: int) -> AsyncIterator[relay_pb2.RelayUp]:
        """What waits to be sent, for the stream of this generation only: gRPC may still hold the
        sender of a stream that broke, waiting; woken, it ends without touching anything of the next
        stream's (it took a Hello to a stream that no longer was; it took over the next stream's
        linger, whose sender then waited for good; it took its batch off the next stream's count)."""
        while True:
            await self._ready.wait()
            await self._linger(generation)
            if generation != self._generation:
                return
            self._ready.clear()
            # A batch at a time, taken when gRPC takes it: what came meanwhile, the first lane's
            # before the rest, goes in the next (a backlog is not fixed in its order ahead of time).
            while generation == self._generation and (batch := take((self._first, self._up), UP_BATCH_BYTES)):
                for item in batch:  # a hot stream has nothing in ``_up``: the others' items came from there
                    if item.stream not in self._hot and (left := self._in_up.get(item.stream, 0) - 1) >= 0:
                        if left:
                            self._in_up[item.stream] = left
                        else:
                            del self._in_up[item.stream]
                if not self._first:
                    self._hot.clear()  # none of their messages wait in the first lane any more
                yield relay_pb2.RelayUp(items=batch)
                if generation != self._generation:  # broke while gRPC held it: the count began afresh
                    return
                self._sent(batch)
                self.metrics.messages.labels("up").inc(len(batch))
                self.metrics.uplink_messages.labels("up").inc()
                await self._linger(generation)  # what came meanwhile waits for more too, unless it may act
