"""The relay's side towards agents: the agent gateway's ``Connect``, served with the messages as
bytes. Each agent stream is passed on to the controller as it comes (its first message checked here
under TLS: the agent's certificate must name the node its Hello names), and what the controller sends
back is written to it; the controller's end of a stream ends the agent's call with the same status
(and a Hello's turn as ``vigil-retry-after-ms``). A Hello is passed on only while the controller has
room for it (``controller.relay.hello_room``); else its agent is told to wait and called in turn,
those whose Hello says faults are waiting first. An agent told to wait while the relay reaches the
controller again says its Hello unasked (``HelloAgain.takes_hello``; an agent that knows only
``takes_urgent_hello``, once a fault waits): it is kept, the last said, and passed on when the
controller has room, an urgent one's before the others; a Hello that comes once the one before went on
is passed over (its answer is that one's).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import structlog
from google.protobuf.message import DecodeError

from controller.edge.authz import bearer
from controller.edge.open_files import raise_open_files
from controller.nodes.agent_outboxes import Outbox
from controller.relay.hello_room import FIRST_ROOM, MIN_WAITING, WAIT_S, HelloRoom, Place
from controller.relay.uplink import ITEM_OVERHEAD, LINGER_MS, OK, UNAVAILABLE, Back, Lost, Uplink
from controller.vocab.lanes import HELLO_TAG
from protos.vigil.v1 import agent_pb2, relay_pb2
from vigil_core import gc_keeper, gc_young, loop_lag, thread_names
from vigil_core.call_taken import say_taken
from vigil_core.cert_reload import CertificateSource, server_credentials
from vigil_core.http_status import serve_http
from vigil_core.log_tally import TalliedEvent
from vigil_core.loop_lag import stuck
from vigil_core.rpc_errors import RETRY_AFTER_KEY, status_code
from vigil_core.supervise import Tasks, supervise
from vigil_core.tls import Identity, bind, peer_identity, server_options
from vigil_core.urgent_port import refusal as urgent_port_refusal
from vigil_core.waiting import wait_either

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RelaySettings:
    controller: str  # host:port of the controller (its Service)
    listen: str  # host:port agents dial
    # A relay:NAME certificate, both to agents and to the controller, its directory read again for
    # each new connection (a renewal taken up without a restart); None: plaintext.
    tls: CertificateSource | None
    first_message_s: float = 30.0
    max_message_bytes: int = 4 << 20
    metrics_port: int | None = None  # /metrics and /readyz (0: any free port); None: not served
    # host:port of the urgent port (``vigil_core.urgent_port``): agents with faults waiting only, their
    # calls taken beside the main port's, not behind a fleet connecting at once; None: none.
    urgent_listen: str | None = None
    # Freeze what survives full collections (vigil_core.gc_keeper, experimental): process-wide, so the
    # CLI's choice (--gc-freeze), never a test's that serves a relay inside its own process.
    gc_freeze: bool = False
    gc_young_objects: int = 0  # vigil_core.gc_young, process-wide likewise (0: CPython's own)
    # How long an agent's call waits here for the controller (a restart, a failover) before it is
    # ended UNAVAILABLE and its agent reconnects on its own: a held call costs nothing new, a fleet
    # reconnecting at once costs a great deal. Not first_message_s, which is an agent's bound.
    controller_wait_s: float = 120.0
    # What a Hello passed on to the controller should wait for its answer: the relay sizes its room
    # for Hellos at the controller by it and queues the other agents, calling each as a place comes
    # free (``controller.relay.hello_room``); 0: every Hello passed on at once.
    hello_wait_s: float = WAIT_S
    hello_min_waiting: int = MIN_WAITING
    hello_first_room: int = int(FIRST_ROOM)  # the room until the waits at the controller size it
    # How long what only waits to be recorded (heartbeats, record-only signals, a Hello with no fault
    # behind it, a stream's end) may wait for more before it goes to the controller: one message
    # there for many agents' (``Uplink._linger``).
    linger_ms: float = LINGER_MS


def decoded(raw: bytes) -> agent_pb2.AgentMessage | str:
    """An agent's message, or why it is not one. Pure."""
    try:
        return agent_pb2.AgentMessage.FromString(raw)
    except DecodeError as exc:
        return f"the first message is not a valid AgentMessage: {exc}"


def identity_problem(first: agent_pb2.AgentMessage | str, identity: Identity | None, token: str) -> str:
    """Why an agent with this certificate identity may not open a stream with this first message
    (``decoded``); "" when it may (the shared ``agents`` certificate with a token: the controller
    reviews the token). Pure."""
    if isinstance(first, str):
        return first
    node = first.hello.node if first.HasField("hello") else ""
    who = str(identity) if identity is not None else "a client with no Vigil identity"
    if identity is not None and identity.role == "agents":  # its node: what its token proves
        return "" if token else "the shared agents certificate needs the pod's service-account token"
    if identity is None or identity.role != "node" or identity.name != node:
        return f"{who} cannot report for {node or 'no node (the first message must be Hello)'}"
    return ""


RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
WAIT_FOR_CONTROLLER = agent_pb2.ControllerMessage(hello_again=agent_pb2.HelloAgain(wait=True)).SerializeToString()
# To an agent that waits for a kept Hello, while the relay reaches the controller again: its Hello is
# taken now, faults or none (``HelloAgain.takes_hello``), kept, and passed on once there is room.
WAIT_TAKES_HELLO = agent_pb2.ControllerMessage(
    hello_again=agent_pb2.HelloAgain(wait=True, takes_urgent_hello=True, takes_hello=True)
).SerializeToString()
HELLO_NOW = agent_pb2.ControllerMessage(hello_again=agent_pb2.HelloAgain()).SerializeToString()
WAIT_KEPT = agent_pb2.ControllerMessage(hello_again=agent_pb2.HelloAgain(wait=True, kept=True)).SerializeToString()
QUEUED, CALLED = Place(called=False), Place(called=True)


def hello_again_in(ended: relay_pb2.StreamEnd | Lost, resumable: bool) -> int | None:
    """Whether a session's end keeps its agent's call for a Hello again on it, and when: the
    milliseconds the agent waits first (the uplink lost: 0, asked once the controller is reached
    again; a turn the controller gave the Hello: that turn); None: the call ends with the session,
    as for an agent that cannot say Hello again (``Hello.resumable`` unset). Pure."""
    if not resumable:
        return None
    if isinstance(ended, Lost):
        return 0
    if ended.code == RESOURCE_EXHAUSTED and ended.retry_after_ms > 0:
        return int(ended.retry_after_ms)
    return None


def taken_said_at_once(passed_on: bool, keeps: bool, urgent: bool) -> bool:
    """Whether a call is said taken (``vigil_core.call_taken``) as its first Hello comes: one whose
    Hello goes on to the controller at once, from an agent that does not wait for a Hello the relay
    keeps, or whose Hello says faults wait (its patience runs: it would rather try its relay's
    other port than wait). Any other agent that does (``Hello.waits_for_kept_hello``) is told
    nothing until that Hello's answer, which says it with it, whether the Hello goes on at once or
    waits here for room: not told its call is taken, its patience is not running, and it waits up
    to ``TAKEN_PATIENCE_S``, as long as it would for a Hello it was told is kept
    (``agent.link.KEPT_HELLO_PATIENCE_S``). A word to wait would cost each end a batch more for most
    of a fleet connecting at once, and a patience running at the controller only gave up on Hellos
    waiting their turn there. Pure."""
    return passed_on and (not keeps or urgent)


def hello_in(message: agent_pb2.AgentMessage | str) -> agent_pb2.Hello | None:
    """The Hello a ``decoded`` message is, if it is one. Pure."""
    return message.hello if not isinstance(message, str) and message.HasField("hello") else None


def hello_of(raw: bytes) -> agent_pb2.Hello | None:
    """The Hello an agent's message is, if it is one. Pure."""
    return hello_in(decoded(raw))


class AgentCall:
    """One agent's call on the relay, and its sessions one after another: the relay stream of the
    session now (None between two, while the agent is asked for Hello again)."""

    __slots__ = (
        "node", "resumable", "keeps", "peer", "token", "stream", "back", "waiting_hello", "hello_due", "hello_at",
        "kept", "urgent", "queued_at", "takes_hello",
    )  # fmt: skip

    def __init__(self, first: agent_pb2.Hello | None, peer: str, token: str) -> None:
        self.node = first.node if first is not None else ""
        self.resumable = first is not None and first.resumable
        self.keeps = self.resumable and first is not None and first.waits_for_kept_hello
        self.peer, self.token = peer, token
        self.stream: int | None = None
        self.back = Outbox[Back]()  # what comes back, every session's in turn
        self.waiting_hello = False  # asked for Hello again, not said yet
        self.hello_due = 0.0  # asked: the Hello again is due by then, on the relay's own time (0: none due)
        self.hello_at = 0.0  # when its Hello went to the controller (monotonic: what the agent waits; 0: answered)
        self.kept: bytes | None = None  # its Hello, queued here for room at the controller (``keeps``)
        self.urgent = first is not None and first.urgent_waiting > 0  # its last Hello said faults wait
        self.queued_at = 0.0  # told to wait for room at the controller then (monotonic; 0: not queued)
        self.takes_hello = False  # told the relay takes its Hello unasked, faults or none (``WAIT_TAKES_HELLO``)

    def ask(self) -> None:
        """Its Hello again is asked for: due afresh from its turn (``AgentStreams._next``)."""
        self.waiting_hello, self.hello_due, self.takes_hello = True, 0.0, False


class AgentStreams:
    def __init__(self, uplink: Uplink, settings: RelaySettings, lateness: loop_lag.Lateness) -> None:
        self._uplink = uplink
        self._settings = settings
        self.room: HelloRoom[AgentCall] | None = None  # None: every Hello passed on at once
        if settings.hello_wait_s > 0:
            room = self.room = HelloRoom(
                wait_s=settings.hello_wait_s, min_waiting=settings.hello_min_waiting, room=settings.hello_first_room
            )
            uplink.metrics.watch_room(lambda: room.waiting, lambda: room.queued, lambda: room.size)
        self._calling_soon = False  # a call of the agents lined up is due this turn of the loop
        # An agent's bounds are kept on the relay's own time: its loop's lateness is not the agent's.
        self._own_time = lateness.own_time
        self._said_late = TalliedEvent(log.warning, "relay_hello_again_late")  # a whole fleet's at once: tallied
        # The Hellos again asked for, by when each is due: (due, order, call), a heap looked at by one
        # task while any is due (``_mind_hellos_due``), not a timer and a task for each call.
        self._hellos_due: list[tuple[float, int, AgentCall, int]] = []  # and the turn given (ms)
        self._asked = itertools.count()
        self._minding: asyncio.Task[None] | None = None
        # While the controller is away, the one wait for it that every call shares (``_controller_reached``).
        self._reaching: asyncio.Task[None] | None = None

    def close(self) -> None:
        """The relay stops: its shared waits end, and the tallied lines' remainder is said now."""
        for task in (self._minding, self._reaching):
            if task is not None:
                task.cancel()
        self._said_late.flush()

    def handler(self, urgent_only: bool = False) -> grpc.GenericRpcHandler:
        """``vigil.v1.AgentGateway/Connect``, bytes in and out; ``urgent_only``: the urgent port's
        (``vigil_core.urgent_port``), which takes only agents whose first Hello says faults wait."""
        connect = grpc.stream_stream_rpc_method_handler(partial(self.connect, urgent_only=urgent_only))
        return grpc.method_handlers_generic_handler("vigil.v1.AgentGateway", {"Connect": connect})

    async def connect(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, urgent_only: bool = False
    ) -> AsyncIterator[bytes]:
        settings = self._settings
        try:
            first = await loop_lag.within(anext(aiter(requests), None), settings.first_message_s, self._own_time)
        except TimeoutError:
            why = f"no Hello within {settings.first_message_s:g} s of opening the stream"
            self._uplink.metrics.refused.labels("no_hello").inc()
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, why)
        if first is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
            return
        token, message = "", decoded(first)  # decoded once, for the identity check and the Hello
        if settings.tls is not None:
            identity = peer_identity(context.auth_context())
            token = bearer(context.invocation_metadata()) if identity is not None and identity.role == "agents" else ""
            if why := identity_problem(message, identity, token):
                log.warning("call_refused", peer=context.peer(), why=why)
                self._uplink.metrics.refused.labels("identity").inc()
                tokenless = identity is not None and identity.role == "agents"  # as the controller says it
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED if tokenless else grpc.StatusCode.PERMISSION_DENIED, why
                )
        hello = hello_in(message)  # None: not a Hello (the controller says so)
        if urgent_only and (why := urgent_port_refusal(hello.urgent_waiting if hello is not None else 0)):
            self._uplink.metrics.refused.labels("not_urgent").inc()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        if (unreached := await self._unreached()) is not None:  # the controller restarting: its agents wait here
            await context.abort(grpc.StatusCode.UNAVAILABLE, unreached.details)
        call = AgentCall(hello, context.peer(), token)
        if call.urgent:
            self._uplink.metrics.urgent_hellos.inc()
        self._say_hello(call, first)
        reader = asyncio.create_task(self._read(call, requests))
        reader.add_done_callback(partial(_reader_ended, call.back, call.node))
        wait_ms: int | None = 0
        try:
            # Said taken now, or with the first word it is told (``taken_said_at_once``); an agent
            # that waits for a kept Hello is told nothing until its answer.
            said = taken_said_at_once(call.stream is not None, call.keeps, call.urgent)
            if said:
                await say_taken(context)
            while True:
                item = await self._next(call, wait_ms or 0)
                if call.hello_at and not isinstance(item, Lost):  # the controller's answer to the Hello
                    self._hello_over(call, answered=True)
                if isinstance(item, bytes):
                    said = True
                    yield item
                    continue
                if isinstance(item, Place):  # the relay's own word on the Hello: no room yet, or room now
                    if not item.called:
                        call.queued_at = time.monotonic()
                        self._uplink.metrics.hello_again.labels("queued").inc()
                        if said or call.kept is None:  # a Hello again kept: its patience is running
                            said = True
                            yield WAIT_KEPT if call.kept is not None else WAIT_FOR_CONTROLLER
                        continue
                    if call.queued_at:  # how long it waited for room
                        self._uplink.metrics.hello_queued.observe(time.monotonic() - call.queued_at)
                        call.queued_at = 0.0
                    if (unreached := await self._unreached()) is not None:  # called as the controller went
                        item = unreached
                        break
                    if call.kept is not None:  # its Hello, kept here, goes on in the place kept for it
                        kept, call.kept = call.kept, None
                        self._say_hello(call, kept)
                    else:
                        call.ask()  # a Hello is due from the agent called
                        wait_ms, said = 0, True
                        yield HELLO_NOW
                    continue
                if isinstance(item, Lost):
                    self._controller_lost(call)
                if (wait_ms := hello_again_in(item, call.resumable)) is None:
                    break
                if call.stream is not None:
                    self._uplink.end(call.stream)  # the session is over; the call is kept
                call.stream = None
                if isinstance(item, Lost):  # the agent is told at once (it is not connected), asked once it can be
                    if call.kept is None:  # not urgent until it says a Hello with faults waiting (``_read``)
                        call.urgent = False
                    said = True
                    call.takes_hello = call.keeps  # its Hello comes now, kept until the controller has room
                    yield WAIT_TAKES_HELLO if call.keeps else WAIT_FOR_CONTROLLER
                    if (unreached := await self._unreached(item)) is not None:
                        item = unreached
                        break
                    self._uplink.metrics.hello_again.labels("controller_lost").inc()
                    if self.room is not None:  # the whole fleet at once: each called as a place comes free
                        call.queued_at = time.monotonic()
                        self.room.line_up(call, call.urgent)
                        self._call_soon()
                        continue
                    if call.kept is not None:  # said unasked meanwhile (a fault waits): it goes on now
                        kept, call.kept = call.kept, None
                        self._say_hello(call, kept)
                        continue
                    call.ask()
                    said = True
                    yield HELLO_NOW
                    continue
                call.ask()
                self._uplink.metrics.hello_again.labels("paced").inc()
                said = True
                yield agent_pb2.ControllerMessage(
                    hello_again=agent_pb2.HelloAgain(after_ms=wait_ms)
                ).SerializeToString()
            if isinstance(item, Lost):  # an agent that cannot say Hello again reconnects
                item = relay_pb2.StreamEnd(code=UNAVAILABLE, details=f"{item.why}: retry")
            if item.code != 0:
                turn = ((RETRY_AFTER_KEY, str(item.retry_after_ms)),) if item.retry_after_ms else ()
                await context.abort(status_code(item.code), item.details, trailing_metadata=turn)
        finally:
            reader.cancel()
            if call.queued_at:  # gone while queued for room: its wait never ended in a call
                self._uplink.metrics.left_queued.inc()
            self._hello_over(call, answered=False)
            if self.room is not None:
                self._call(self.room.left(call))
            if call.stream is not None:
                self._uplink.end(call.stream)

    def _say_hello(self, call: AgentCall, hello: bytes) -> None:
        """The agent's Hello: passed on to the controller in a session of its own (timed until the
        controller answers it), or, with no room for it there now, queued here (``controller.relay.hello_room``):
        the agent told to wait, then its Hello kept here passed on when called (an agent that
        ``waits_for_kept_hello``), or it is asked to say Hello again then. An agent that cannot say
        Hello again is passed on all the same. Only while the relay has its stream to the controller
        (``_unreached``)."""
        room = self.room
        if room is not None and call.resumable and not room.say(call, call.urgent):
            call.kept = hello if call.keeps else None  # else it says Hello again when called
            call.back.put_nowait(QUEUED)
            return
        if room is not None and not call.resumable:
            room.send_anyway()
        call.takes_hello = False
        call.stream, _ = self._uplink.open(call.back, urgent=call.urgent)
        self._uplink.send(call.stream, hello, peer=call.peer, token=call.token)
        call.hello_at = time.monotonic()

    def _call(self, calls: list[AgentCall]) -> None:
        """Places came free for these queued agents: each is asked for its Hello now."""
        for called in calls:
            called.back.put_nowait(CALLED)

    def _call_soon(self) -> None:
        """Call the agents queued once every call woken with this one has lined up (the controller
        reached again wakes the relay's whole fleet in one turn of the loop): the places free then go
        first to the agents with faults waiting."""
        if not self._calling_soon:
            self._calling_soon = True
            asyncio.get_running_loop().call_soon(self._call_lined_up)

    def _call_lined_up(self) -> None:
        self._calling_soon = False
        if self.room is not None:
            self._call(self.room.call())

    def _controller_lost(self, call: AgentCall) -> None:
        """The session ended with the relay's stream to the controller: its Hello, if one waited, will
        not be answered, and the time until the controller is back is not time it answered nothing."""
        self._hello_over(call, answered=False)
        if self.room is not None:
            self.room.lost()

    def _hello_over(self, call: AgentCall, answered: bool) -> None:
        """The agent's Hello passed on is over: ``answered`` by the controller (an Ack, a refusal),
        or never to be (its session or call ended first). Said once per Hello; nothing when none waits."""
        if not call.hello_at:
            return
        now = time.monotonic()
        waited_s, call.hello_at = now - call.hello_at, 0.0
        if answered:
            self._uplink.metrics.hello_answer.observe(waited_s)
        if self.room is not None:
            self._call(self.room.answered(call, now, waited_s) if answered else self.room.dropped(call))

    async def _controller_reached(self) -> bool:
        """Whether the relay has its stream to the controller, waiting up to ``controller_wait_s`` (its
        own time) from when its calls began to wait for it: one wait that every call shares (a
        controller that goes away leaves a relay's whole fleet waiting at once), not a timer each."""
        uplink = self._uplink
        if not uplink.connected.is_set():
            if self._reaching is None or self._reaching.done():
                self._reaching = asyncio.ensure_future(self._reach())
                self._reaching.add_done_callback(self._shared_wait_ended)
            await asyncio.shield(self._reaching)  # a call that ends meanwhile leaves the others' wait be
        return uplink.connected.is_set()

    def _shared_wait_ended(self, task: asyncio.Future[None]) -> None:
        """A wait every call shares that failed (a bug) is said and counted, not left unread: the next
        call that needs it starts it again."""
        if task.cancelled() or (exc := task.exception()) is None:
            return
        log.error("relay_task_failed", task="shared-wait", error=repr(exc)[:300])
        self._uplink.metrics.task_failures.labels("shared-wait").inc()

    async def _unreached(self, lost: Lost | None = None) -> relay_pb2.StreamEnd | None:
        """None once the relay has its stream to the controller (at once, nearly always); else, after
        waiting for it up to ``controller_wait_s``, the end its agent is told (``lost``: the loss that
        ended its session, named), counted. A session is
        opened only with that stream: one opened without it (an agent called to a place freed as the
        controller went, or asked just before) was ended, its Hello with it, by the first try to reach
        the controller that failed, and its agent lost its turn."""
        if await self._controller_reached():
            return None
        self._uplink.metrics.refused.labels("no_controller").inc()
        waited = f"the relay has not reached the controller for {self._settings.controller_wait_s:g} s"
        why = f"{lost.why}, not reached again" if lost is not None else waited
        return relay_pb2.StreamEnd(code=UNAVAILABLE, details=f"{why}: retry")

    async def _reach(self) -> None:
        with contextlib.suppress(TimeoutError):
            await loop_lag.within(self._uplink.connected.wait(), self._settings.controller_wait_s, self._own_time)

    async def _next(self, call: AgentCall, wait_ms: int) -> Back:
        """What comes back to the agent next; between sessions, its Hello again within ``first_message_s``
        past its turn, on the relay's own time (else the call ends, ``_mind_hellos_due``: the agent
        reconnects on its own). Once said, its answer is the controller's to give, however long."""
        if call.waiting_hello and not call.hello_due:
            call.hello_due = self._own_time() + wait_ms / 1000 + self._settings.first_message_s
            heapq.heappush(self._hellos_due, (call.hello_due, next(self._asked), call, wait_ms))
            if self._minding is None or self._minding.done():
                self._minding = asyncio.create_task(self._mind_hellos_due())
                self._minding.add_done_callback(self._shared_wait_ended)
        return await call.back.get()

    async def _mind_hellos_due(self, every_s: float = 0.25) -> None:
        """While any Hello again is due: every ``every_s``, each call whose Hello again is past due
        (still asked for, with the same due) is ended DEADLINE_EXCEEDED, counted and said (tallied)."""
        due = self._hellos_due
        while due:
            await asyncio.sleep(every_s)
            now = self._own_time()
            while due and due[0][0] <= now:
                when, _, call, turn_ms = heapq.heappop(due)
                if not call.waiting_hello or call.hello_due != when:  # said in time, or asked again since
                    continue
                call.hello_due = 0.0
                why = f"no Hello again within {self._settings.first_message_s:g} s of its turn"
                self._said_late(call.node, turn_ms=turn_ms)
                self._uplink.metrics.refused.labels("hello_again_late").inc()
                call.back.put_nowait(relay_pb2.StreamEnd(code=grpc.StatusCode.DEADLINE_EXCEEDED.value[0], details=why))

    async def _read(self, call: AgentCall, requests: AsyncIterator[bytes]) -> None:
        uplink = self._uplink
        async for raw in requests:
            if call.stream is not None:
                if raw[:1] == HELLO_TAG:  # said again as the one before went on (a fault came): its answer comes
                    uplink.metrics.hellos_crossed.inc()
                    continue
                uplink.send(call.stream, raw)
                await uplink.room()
            elif (
                # a Hello is told by its first byte: what else an agent sends between sessions is not decoded
                (call.waiting_hello or call.keeps and raw[:1] == HELLO_TAG)
                and (hello := hello_of(raw)) is not None
                and (call.waiting_hello or hello.urgent_waiting or call.takes_hello)
            ):
                if hello.node != call.node:
                    why = f"a stream opened for {call.node} cannot say Hello for {hello.node or 'no node'}"
                    log.warning("call_refused", peer=call.peer, why=why)
                    call.back.put_nowait(
                        relay_pb2.StreamEnd(code=grpc.StatusCode.PERMISSION_DENIED.value[0], details=why)
                    )
                    return
                call.urgent = hello.urgent_waiting > 0
                if call.urgent:
                    uplink.metrics.urgent_hellos.inc()
                if call.waiting_hello:  # asked for
                    call.waiting_hello, call.hello_due = False, 0.0
                    if (unreached := await self._unreached()) is not None:  # asked as the controller went
                        call.back.put_nowait(unreached)
                        return
                    self._say_hello(call, raw)
                else:  # said unasked: kept (the last said), its agent called before those without if faults wait
                    call.kept = raw
                    uplink.metrics.kept_unasked.labels("urgent" if call.urgent else "calm").inc()
                    if call.urgent and self.room is not None:
                        self._call(self.room.hurry(call))
            else:  # sent after its session ended, before its Hello again: unacknowledged, so sent again
                uplink.metrics.dropped_between_sessions.inc()
        if call.stream is not None:
            uplink.finish(call.stream)  # the agent closed its side: the controller ends the stream after it
        else:  # closed between sessions: nothing to answer
            call.back.put_nowait(relay_pb2.StreamEnd(code=OK))


def _reader_ended(back: Outbox[Back], node: str, reader: asyncio.Task[None]) -> None:
    """An agent stream's reader that failed (a bug, or the agent's call breaking under it) ends the
    agent's stream, said, rather than leave it open with nothing more read: the agent reconnects and
    sends again what was not acknowledged. A reader that ended because its call did (cancelled) or
    because the agent closed its side needs nothing."""
    if reader.cancelled() or (exc := reader.exception()) is None or isinstance(exc, grpc.aio.AbortError):
        return  # an AbortError: the call was ended here already (its end said)
    log.warning("relay_agent_stream_unreadable", node=node, error=repr(exc)[:300])
    internal = grpc.StatusCode.INTERNAL.value[0]
    back.put_nowait(relay_pb2.StreamEnd(code=internal, details="the relay could not read this stream: reconnect"))


async def serve(
    settings: RelaySettings, stop: asyncio.Event, ready: asyncio.Event | None = None, port_file: Path | None = None
) -> int:
    """Run the relay until ``stop``; returns the port it listened on. ``ready`` is set, and the port
    written to ``port_file``, once both the port and the uplink are up."""
    soft, _ = raise_open_files(1 << 20)  # a descriptor per agent: as many as the hard limit allows
    uplink = Uplink(settings.controller, settings.tls, settings.max_message_bytes, linger_ms=settings.linger_ms)
    size, tls = settings.max_message_bytes, settings.tls
    lateness = loop_lag.Lateness()
    streams = AgentStreams(uplink, settings, lateness)

    def serving(address: str, urgent_only: bool) -> tuple[grpc.aio.Server, int]:
        """The agents' streams served on ``address``, with credentials of its own (each server takes up
        renewed files itself); an agent's message must fit in one RelayUp, and as many agents may wait
        as it has descriptors for."""
        server = grpc.aio.server(options=server_options(size - ITEM_OVERHEAD, size, soft, agents_only=True))
        server.add_generic_rpc_handlers((streams.handler(urgent_only),))
        return server, bind(server, address, server_credentials(tls) if tls is not None else None)

    if tls is not None:  # read again at each scrape: a renewal not taken up shows before it expires
        uplink.metrics.certificate_expiry.set_function(tls.expires_at)
    server, port = serving(settings.listen, urgent_only=False)
    urgent_server = None
    if settings.urgent_listen is not None:  # the same streams; its calls taken beside the main port's
        urgent_server, _ = serving(settings.urgent_listen, urgent_only=True)
        await urgent_server.start()
    await server.start()
    http = None
    if settings.metrics_port is not None:
        not_ready_now, alive = partial(not_ready, uplink), partial(stuck, lateness)
        http = serve_http("0.0.0.0", settings.metrics_port, uplink.metrics.registry, not_ready_now, alive)
    running = asyncio.create_task(uplink.run(stop))
    tasks = Tasks(lambda task: uplink.metrics.task_failures.labels(task).inc())
    observe_lag = uplink.metrics.loop_lag.observe
    lag = asyncio.create_task(supervise("loop-lag", lambda: lateness.watch(observe_lag), stop, tasks))
    keeper = None
    if settings.gc_freeze:
        keeper = asyncio.create_task(supervise("gc-keeper", lambda: gc_keeper.keep(uplink.sessions, stop), stop, tasks))
    await wait_either(uplink.connected, stop)  # a relay asked to stop before it reached the controller stops
    if not stop.is_set():
        if port_file is not None:
            port_file.with_suffix(".tmp").write_text(str(port))
            port_file.with_suffix(".tmp").replace(port_file)
        log.info(
            "relay_started",
            port=port,
            urgent_listen=settings.urgent_listen,
            controller=settings.controller,
            tls=settings.tls is not None,
            open_files=soft,
            metrics_port=http.server_port if http is not None else None,
        )
        if ready is not None:
            ready.set()
    await stop.wait()
    if urgent_server is not None:
        await urgent_server.stop(grace=2.0)
    await server.stop(grace=2.0)
    running.cancel()
    lag.cancel()
    if keeper is not None:
        await keeper
    if http is not None:
        http.shutdown()
    streams.close()  # the shared waits, and the last second's tallied lines
    return port


def not_ready(uplink: Uplink) -> list[str]:
    """Why this relay is not ready (``/readyz``): it takes no agent while it has no stream to the
    controller."""
    return [] if uplink.connected.is_set() else [f"not connected to the controller at {', '.join(uplink.targets)}"]


def run_relay(settings: RelaySettings, port_file: Path | None = None) -> None:
    """``vigil relay``: serve until SIGTERM or SIGINT."""
    gc_young.set_young(settings.gc_young_objects)
    thread_names.mirror()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop, port_file=port_file)

    asyncio.run(main())
