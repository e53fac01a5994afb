"""The agent's link to the controller: one bidirectional gRPC stream, re-opened with backoff.

``target`` may name several controller replicas, comma-separated: only the leader serves (a
standby has not opened its port), so the agent moves to the next address whenever a session fails.

On every (re)connection the agent says Hello and waits for the controller's first Ack, which
names the highest sequence number the controller holds for this node and spool (``HELLO_ACK_TIMEOUT_S``
on the agent's own time, twice as long after each Hello left unanswered: ``hello_patience_s``),
counted once the server has taken the call (``vigil_core.call_taken``: a server takes the calls of a
fleet connecting at once in turn, and a Hello given up on while it waits for its turn queues again). The agent drops
those from its spool and replays exactly the rest, in order. Through a relay (``vigil relay``) the
stream outlives a session: when the relay loses the controller and reaches it again, it asks the
agent for Hello again on the same stream (``HelloAgain``), and the same replay follows. A relay
says nothing to a call until its first Hello's answer, not even that the call is taken, whether
that Hello goes on to the controller at once or waits at the relay for room (kept, and passed on
when a place comes free): its patience does not run (``TAKEN_PATIENCE_S`` bounds the wait), unless
that Hello says faults wait and goes on at once (said taken then, its patience runs); a later
Hello it keeps, it tells the agent so (``HelloAgain{wait, kept}``: an answer, its patience stops). A Hello says
how many faults wait in the spool (``urgent_waiting``), and a relay calls those agents first; an
agent told to wait while the relay reaches the controller again (``HelloAgain{wait,
takes_urgent_hello}``) says its Hello at once when it has a fault waiting, or comes to have one, and
the relay keeps it and calls it before the others (``controller.relay.hello_room``); where the relay
also ``takes_hello``, it says its Hello at once, faults or none (kept there until the controller has
room: nothing to ask for and say then, when a whole fleet comes back at once), and again, once, if a
fault comes while that Hello, which said none, waits for its answer. A fault that
comes while the agent waits, after a Hello that said none, does not wait with it: a wait before the
next Hello (a turn given, a backoff) ends at once, and a call still waiting for its Hello's answer (a
relay's queue for room, a server that has not taken it, the controller's flush) is given up for the
same server's urgent port where there is one (``FaultCame``); once per Hello that said none. Signals are
sent as soon as they are spooled; heartbeats go out every ``heartbeat_s`` when they say something
new (the spool's count, the node's jobs, its ranks' progress), else every ``idle_heartbeat_s``: at
100,000 nodes the stream and HTTP/2 keepalive say a quiet agent is there, not 20,000 messages a
second.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
import structlog

from agent.spool import Spool
from checks.result import NotRun
from protos.vigil.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from vigil_core.call_taken import TAKEN_PATIENCE_S, taken
from vigil_core.loop_lag import loop_time, within
from vigil_core.rpc_errors import retry_after_s
from vigil_core.tls import aio_channel
from vigil_core.urgent_port import CLOSED_FOR_S
from vigil_core.waiting import backoff_delay, wait_event

log = structlog.get_logger(__name__)
T = TypeVar("T")

BATCH_LIMIT = 500
HELLO_ACK_TIMEOUT_S = 10.0  # the first wait for an answer to a Hello; doubled after each left unanswered
HELLO_PATIENCE_DOUBLINGS = 4  # up to 16 times as long (160 s), until a Hello is answered again
# A Hello a relay keeps for room at the controller (``HelloAgain.kept``) is answered once those queued
# before it are: at 100,000 agents reconnecting at once, a minute or so. Past this, as unanswered.
KEPT_HELLO_PATIENCE_S = 600.0
HELLO_TURN_SPREAD_S = 0.05  # added to a turn the controller gave: agents of one slot do not come as one
# What ``_asked_again`` answers when the agent says its Hello unasked (a fault waits, or the relay takes
# any Hello: ``HelloAgain.takes_hello``).
SAY_HELLO_UNASKED = agent_pb2.HelloAgain()


class FaultCame(ConnectionError):
    """A fault came into the spool while the call waited for the answer to a Hello that said none,
    and an urgent port can take it: the call is given up for that port (``ControllerLink._unless_fault``)."""

    def __init__(self, faults: int) -> None:
        super().__init__(f"{faults} faults came into the spool while the Hello, which said none, waited")
        self.faults = faults


CheckRunner = Callable[[agent_pb2.RunCheck], Awaitable[common_pb2.CheckResult]]
RemedyRunner = Callable[[agent_pb2.RunRemedy], Awaitable[common_pb2.CheckResult]]


async def _no_remedies(request: agent_pb2.RunRemedy) -> common_pb2.CheckResult:
    reason = "this agent carries out no remedies"
    return common_pb2.CheckResult(request_id=request.request_id, check=request.remedy, reason=reason)


def hello_patience_s(unanswered: int, first_s: float = HELLO_ACK_TIMEOUT_S) -> float:
    """How long to wait for the answer to a Hello after ``unanswered`` in a row were not answered in
    the time they were given: twice as long each time, up to ``HELLO_PATIENCE_DOUBLINGS`` doublings.
    A controller (or relay) too busy to answer within the first wait is answering late, not gone (a
    gone one ends the stream, or HTTP/2 keepalive does); giving up at once each time would turn its
    overload into reconnections, which add to it. Pure."""
    return first_s * float(2 ** min(max(0, unanswered), HELLO_PATIENCE_DOUBLINGS))


def turn_with_spread(turn_s: float) -> float:
    """When to say Hello at a turn given (by the controller, or a relay's Hello again): the turn plus
    a spread, so that agents given one slot do not come as one."""
    return max(0.0, turn_s) + random.uniform(0, HELLO_TURN_SPREAD_S)


async def done_unless(awaited: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Whether ``awaited`` is done (its result or error to take) before ``stop`` is set; if not, it
    is cancelled."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((awaited, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not awaited.done():
        awaited.cancel()
        return False
    return True


async def read_unless(
    call: grpc.aio.StreamStreamCall, stop: asyncio.Event, reading: asyncio.Future[Any] | None = None
) -> agent_pb2.ControllerMessage | None:
    """The stream's next message (or ``grpc.aio.EOF``, typed as a message as ``call.read`` is), or
    None once ``stop`` is set first. ``reading``: that read, already under way."""
    reading = reading or asyncio.ensure_future(call.read())
    if not await done_unless(reading, stop):
        return None
    return cast(agent_pb2.ControllerMessage, reading.result())


def crossed(message: agent_pb2.ControllerMessage | object) -> bool:
    """Whether a message read after a Hello said unasked is the relay asking for it (a HelloAgain
    to say Hello now, sent as the Hello went out), not its answer. Pure."""
    if not isinstance(message, agent_pb2.ControllerMessage) or not message.HasField("hello_again"):
        return False
    again = message.hello_again
    return not again.wait and not again.after_ms


def beat_content(beat: agent_pb2.Heartbeat) -> bytes:
    """What a heartbeat says besides when it was sent: the same twice is not news. Pure."""
    said = agent_pb2.Heartbeat()
    said.CopyFrom(beat)
    said.ClearField("sent_at")
    return said.SerializeToString(deterministic=True)


def plaintext_channel(target: str) -> grpc.aio.Channel:
    """A plaintext channel with the agent's options (``vigil_core.tls.aio_channel``): tests, local use."""
    return aio_channel(target, None)


class ControllerLink:
    def __init__(
        self,
        target: str,
        spool: Spool,
        hello: Callable[[], agent_pb2.Hello],
        run_check: CheckRunner,
        heartbeat_s: float = 5.0,
        idle_heartbeat_s: float = 0.0,
        channel_factory: Callable[[str], grpc.aio.Channel] = plaintext_channel,
        fill_heartbeat: Callable[[agent_pb2.Heartbeat], None] = lambda beat: None,
        run_remedy: RemedyRunner = _no_remedies,
        clock: Callable[[], float] = loop_time,
        hello_patience_first_s: float = HELLO_ACK_TIMEOUT_S,
        urgent_target: str | None = None,
    ) -> None:
        """``urgent_target``: the same servers' urgent ports (``vigil_core.urgent_port``), one per
        address in ``target``, in its order: a session whose Hello has faults to say dials it."""
        self._run_remedy = run_remedy
        self._clock = clock  # the agent's own time (its loop's, less the loop's lateness): what a Hello is given
        self._patience_first_s = hello_patience_first_s
        self._fill_heartbeat = fill_heartbeat  # what else the node says with each beat
        self._targets = [t.strip() for t in target.split(",") if t.strip()]
        self._target = self._targets[0]
        self._urgent_targets = [t.strip() for t in (urgent_target or "").split(",") if t.strip()]
        if self._urgent_targets and len(self._urgent_targets) != len(self._targets):
            raise ValueError(f"one urgent port per controller address: {urgent_target!r} for {target!r}")
        self._urgent_closed_at: float | None = None  # when the urgent port was last not reached (its own time)
        self._on_urgent_port = False  # the stream now is the urgent port's
        self.urgent_sessions = 0  # sessions acknowledged through the urgent port
        self._spool = spool
        self._hello = hello
        self._run_check = run_check
        self._heartbeat_s = heartbeat_s
        self._idle_heartbeat_s = idle_heartbeat_s  # a beat with nothing new waits this long (0: never)
        self._channel_factory = channel_factory
        self._wake = asyncio.Event()
        self._outbox: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        self._checks: dict[str, asyncio.Future[common_pb2.CheckResult]] = {}  # request id -> the check running
        self._stopped_why: dict[str, str] = {}  # request id -> why the controller stopped it
        self.connected = False
        self.streams = 0  # streams opened
        self.connections = 0  # sessions the controller acknowledged
        self.resumed = 0  # sessions that ended with their stream kept (a relay's HelloAgain)
        self.unanswered = 0  # Hellos in a row not answered in the time they were given
        self.attempt = 0
        self.said_urgent = 0  # the faults waiting that the last Hello said (``Hello.urgent_waiting``)
        self.left_for_urgent = 0  # calls given up for the urgent port when a fault came (``FaultCame``)

    def notify(self) -> None:
        """New signals are in the spool: send them now rather than at the next heartbeat."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        self.attempt = 0  # failed sessions since the controller last acknowledged a Hello
        while not stop.is_set():
            urgent, acked = self._urgent_port(), self.connections
            try:
                await self._session(stop, urgent)
            except grpc.aio.AioRpcError as exc:
                if (turn := retry_after_s(exc)) is not None:  # the controller gave us a turn: come back then
                    log.info("controller_link_paced", target=self._target, turn_in_s=turn)
                    await self._wait_unless_fault(stop, turn_with_spread(turn))
                    continue
                log.warning("controller_link_down", target=self._target, error=exc.details(), attempt=self.attempt)
            except FaultCame as exc:  # the same server's urgent port at once: no backoff, no other address
                self.left_for_urgent += 1
                log.info("controller_link_fault_came", target=self._target, faults_waiting=exc.faults)
                continue
            except (TimeoutError, ConnectionError) as exc:
                log.warning("controller_link_down", target=self._target, error=repr(exc), attempt=self.attempt)
            except Exception:  # never let the link die: the spool keeps everything until it is back
                log.exception("controller_link_error", target=self._target, attempt=self.attempt)
            finally:
                self.connected = False
            if stop.is_set():
                break
            if urgent is not None and self.connections == acked:  # not reached, or refused: the main port at once
                self._urgent_closed_at = self._clock()
                log.info("controller_link_urgent_port_closed", urgent_port=urgent, main_port_for_s=CLOSED_FOR_S)
                continue
            self._target = self._targets[(self._targets.index(self._target) + 1) % len(self._targets)]
            delay = backoff_delay(self.attempt) if self._target == self._targets[0] else 0.05
            self.attempt = min(self.attempt + 1, 16)
            await self._wait_unless_fault(stop, delay)

    def _urgent_port(self) -> str | None:
        """The urgent port to dial for the next session: the current target's, while faults wait in
        the spool, unless it was not reached within ``CLOSED_FOR_S``; None: the main port."""
        if (urgent := self._urgent_port_open()) is None or not (faults := self._spool.urgent_waiting()):
            return None
        log.info("controller_link_urgent_port", urgent_port=urgent, faults_waiting=faults)
        return urgent

    def _urgent_port_open(self) -> str | None:
        """The current target's urgent port, unless there is none or it was not reached within
        ``CLOSED_FOR_S``."""
        if not self._urgent_targets:
            return None
        closed_at = self._urgent_closed_at
        if closed_at is not None and self._clock() - closed_at < CLOSED_FOR_S:
            return None
        return self._urgent_targets[self._targets.index(self._target)]

    def _fault_came(self) -> int:
        """The faults waiting in the spool, where the last Hello said none (0 otherwise): what ends
        a wait before the next Hello, or a call's wait for its Hello's answer. Once per Hello that
        said none, so a controller that stays down while faults come keeps its backoff."""
        return self._spool.urgent_waiting() if self.said_urgent == 0 else 0

    async def _until_faults(self, faults: Callable[[], int]) -> int:
        """Once ``faults()`` (read from the spool) is above 0, that count: read again each time a
        signal spooled wakes the link (``notify``)."""
        while True:
            self._wake.clear()
            if found := faults():
                return found
            await self._wake.wait()

    async def _wait_unless_fault(self, stop: asyncio.Event, delay_s: float) -> bool:
        """Wait ``delay_s`` before the next Hello (a backoff, a turn the controller or a relay gave),
        less if a fault comes that the last Hello did not say: a Hello with faults waiting is
        admitted at once by the controller and called first by a relay. True when ``stop`` is set."""
        if delay_s <= 0 or self._fault_came():
            return stop.is_set()
        coming = asyncio.ensure_future(self._until_faults(self._fault_came))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((coming, stopping), timeout=delay_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            coming.cancel()
            stopping.cancel()
        if coming.done() and not coming.cancelled():
            log.info("controller_link_wait_cut_short", target=self._target, faults_waiting=coming.result())
        return stop.is_set()

    async def _unless_fault(self, awaited: Awaitable[T]) -> T:
        """``awaited`` (a call's wait for its Hello's answer, or to be taken): its result; or, if
        first a fault comes that the Hello did not say while the current target has an urgent port
        (and this call is not on it), ``FaultCame`` with ``awaited`` cancelled: the link dials that
        port at once (``run``), where the fault is taken beside a fleet connecting at once, not in
        turn behind it (a relay's queue for room, the controller's calls not yet taken, its flush)."""
        waiting = asyncio.ensure_future(awaited)
        if self.said_urgent or self._on_urgent_port or self._urgent_port_open() is None:
            return await waiting
        coming = asyncio.ensure_future(self._until_faults(self._fault_came))
        try:
            await asyncio.wait((waiting, coming), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            waiting.cancel()
            raise
        finally:
            coming.cancel()
        if waiting.done():
            return waiting.result()
        waiting.cancel()
        raise FaultCame(coming.result())

    async def _session(self, stop: asyncio.Event, urgent: str | None = None) -> None:
        """One stream to the controller (or a relay): a session per Hello on it. A relay that lost the
        controller and reached it again, or whose controller gave this Hello a later turn, keeps the
        stream and asks for another Hello on it (``HelloAgain``): no new connection, no backoff.
        ``urgent``: dialled at this urgent port instead of the target's main port."""
        self._on_urgent_port = urgent is not None
        async with self._channel_factory(urgent or self._target) as channel:
            call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
            self.streams += 1
            again: agent_pb2.HelloAgain | None = agent_pb2.HelloAgain()
            fresh = True  # the call's first Hello: its patience counts once the server has taken the call
            try:
                while again is not None and not stop.is_set():
                    reading: asyncio.Future[Any] | None = None
                    if again.wait:
                        again, reading = await self._asked_again(call, stop, again)
                        if again is None:
                            break
                    if again.after_ms and await self._wait_unless_fault(stop, turn_with_spread(again.after_ms / 1000)):
                        break
                    again = await self._hello_and_carry(call, stop, reading, fresh)
                    fresh = False
            finally:
                call.cancel()

    async def _taken(self, call: grpc.aio.StreamStreamCall, stop: asyncio.Event) -> bool:
        """Once the server has taken ``call`` (True), or ``stop`` is set first (False); TimeoutError
        past ``TAKEN_PATIENCE_S``. A server with a fleet connecting at once takes calls one at a time:
        the wait here is for its turn, and a Hello given up on meanwhile would only queue again."""
        taking = asyncio.ensure_future(self._unless_fault(taken(call, self._clock)))
        if not await done_unless(taking, stop):
            return False
        try:
            taking.result()
        except TimeoutError:
            log.warning("controller_link_call_not_taken", target=self._target, waited_s=TAKEN_PATIENCE_S)
            raise
        return True

    async def _asked_again(
        self, call: grpc.aio.StreamStreamCall, stop: asyncio.Event, told: agent_pb2.HelloAgain
    ) -> tuple[agent_pb2.HelloAgain | None, asyncio.Future[Any] | None]:
        """While the relay reaches the controller again (``told`` to wait): its word to say Hello (None
        when ``stop`` is set; the relay ends the stream if it does not reach it); or
        ``SAY_HELLO_UNASKED`` with the read still under way (a read cancelled would cancel the call),
        the Hello's answer to come on it: at once where the relay ``takes_hello`` (it keeps the Hello
        until the controller has room: nothing left to say then), else where it ``takes_urgent_hello``
        and a fault waits in the spool, now or once one comes."""
        reading = asyncio.ensure_future(call.read())
        if told.takes_hello:
            return SAY_HELLO_UNASKED, reading
        faults = self._spool.urgent_waiting if told.takes_urgent_hello else None
        found = await self._read_unless_fault(reading, stop, faults)
        if not reading.done() and not stop.is_set():  # a fault waits: its Hello now, the read kept for its answer
            log.info("controller_link_urgent_hello", target=self._target, faults_waiting=found)
            return SAY_HELLO_UNASKED, reading
        if not reading.done():
            reading.cancel()
            return None, None
        message = reading.result()
        if message is grpc.aio.EOF or not message.HasField("hello_again") or message.hello_again.wait:
            raise ConnectionError("the relay did not ask for Hello again")
        return message.hello_again, None

    async def _read_unless_fault(
        self, reading: asyncio.Future[Any], stop: asyncio.Event, faults: Callable[[], int] | None
    ) -> int:
        """Wait until ``reading`` is done, ``stop`` is set or, ``faults`` given, faults wait in the
        spool: those faults then (0 otherwise), the read still under way unless it is done."""
        stopping = asyncio.ensure_future(stop.wait())
        waits: list[asyncio.Future[Any]] = [reading, stopping]
        if faults is not None:
            waits.append(asyncio.ensure_future(self._until_faults(faults)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits[1:]:
                waiting.cancel()
        came = waits[2:]
        return int(came[0].result()) if came and came[0].done() and not came[0].cancelled() else 0

    async def _unasked_answer(
        self, call: grpc.aio.StreamStreamCall, stop: asyncio.Event, reading: asyncio.Future[Any]
    ) -> agent_pb2.ControllerMessage | None:
        """The answer to a Hello said unasked (``reading``: its read, under way), a HelloAgain that
        crossed it passed over; None once ``stop`` is set. A fault that comes meanwhile, where that
        Hello said none, is said in a Hello again, once: the relay keeps it instead and calls this
        agent first (or, the Hello before it gone on already, passes it over: the answer is one)."""
        while True:
            await self._read_unless_fault(reading, stop, None if self.said_urgent else self._spool.urgent_waiting)
            if reading.done():
                said = reading.result()
                if not crossed(said):  # a HelloAgain asking now, sent as the Hello went out: not answered
                    return cast(agent_pb2.ControllerMessage, said)
                reading = asyncio.ensure_future(call.read())
                continue
            if stop.is_set():
                reading.cancel()
                return None
            hello = self._hello_now()  # a fault came: said again, once
            log.info("controller_link_urgent_hello", target=self._target, faults_waiting=self.said_urgent)
            await call.write(hello)

    def _hello_now(self) -> agent_pb2.AgentMessage:
        """The node's Hello as of now, saying how many faults wait in the spool (kept: ``said_urgent``)."""
        hello = self._hello()
        hello.resumable = hello.waits_for_kept_hello = True
        hello.urgent_waiting = self.said_urgent = self._spool.urgent_waiting()
        return agent_pb2.AgentMessage(hello=hello)

    async def _hello_and_carry(
        self,
        call: grpc.aio.StreamStreamCall,
        stop: asyncio.Event,
        reading: asyncio.Future[Any] | None = None,
        fresh: bool = False,
    ) -> agent_pb2.HelloAgain | None:
        """Say Hello on ``call`` and carry the session until it ends: None when ``stop`` is set, the
        relay's HelloAgain when it keeps the stream for another session; a broken stream raises.
        ``reading``: a read already under way, as an urgent Hello said unasked has (``_asked_again``);
        the relay keeps that Hello (its answer may take long), and a HelloAgain that crossed it is
        passed over. ``fresh``: the call's first Hello, whose patience counts once the server has
        taken the call (``vigil_core.call_taken``)."""
        await call.write(self._hello_now())
        if fresh and not await self._taken(call, stop):
            return None
        patience = hello_patience_s(self.unanswered, self._patience_first_s)
        if reading is not None:  # a Hello said unasked, which the relay keeps: its answer may take long
            patience = KEPT_HELLO_PATIENCE_S
        try:
            if reading is not None:  # said unasked
                said = await within(self._unasked_answer(call, stop, reading), patience, self._clock)
                if said is None:
                    return None
                first = said
            else:
                first = await within(self._unless_fault(call.read()), patience, self._clock)
        except TimeoutError:
            self.unanswered += 1
            waits = hello_patience_s(self.unanswered, self._patience_first_s)
            log.warning("controller_link_hello_unanswered", target=self._target, waited_s=patience, next_waits_s=waits)
            raise
        if first is not grpc.aio.EOF:  # answered (an Ack, or a Hello again at a later turn): the first wait again
            self.unanswered = 0
        while first is not grpc.aio.EOF and first.HasField("hello_again") and first.hello_again.kept:
            # A relay keeps this Hello until the controller has room for it: its answer comes here,
            # after the agents queued before it (the relay ends the stream if it cannot pass it on),
            # within a bound of its own all the same.
            try:
                answer = await within(self._unless_fault(read_unless(call, stop)), KEPT_HELLO_PATIENCE_S, self._clock)
            except TimeoutError:
                log.warning(
                    "controller_link_kept_hello_unanswered", target=self._target, waited_s=KEPT_HELLO_PATIENCE_S
                )
                raise
            if answer is None:
                return None
            first = answer
        if first is not grpc.aio.EOF and first.HasField("hello_again"):  # a turn given, or the controller lost
            again = first.hello_again
            log.info("controller_link_hello_again", target=self._target, after_ms=again.after_ms, wait=again.wait)
            return again
        if first is grpc.aio.EOF or not first.HasField("ack"):
            raise ConnectionError("controller did not answer Hello with an Ack")
        if first.ack.acked_seq > self._spool.last_seq:  # the controller holds more than we numbered
            self._spool.renumber_after(first.ack.acked_seq)
        self._apply_ack(first.ack.acked_seq)
        # The controller took us back: the next disconnection starts its backoff afresh, however
        # many came before (a controller restarted every few minutes must not cost 10 s each time).
        self.attempt = 0
        self.connected, self.connections = True, self.connections + 1
        self.urgent_sessions += self._on_urgent_port
        log.info(
            "controller_link_up", target=self._target, acked_seq=self._spool.acked_seq, urgent_port=self._on_urgent_port
        )
        over = asyncio.Event()  # the session ended with the stream kept: the sender stops between writes
        sending = asyncio.create_task(self._send_loop(call, stop, over))
        receiving = asyncio.create_task(self._receive_loop(call))
        stopping = asyncio.create_task(stop.wait())
        tasks = [sending, receiving, stopping]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a broken stream
            if receiving not in done:
                return None  # stopped
            over.set()
            self._wake.set()
            await sending  # never cancelled inside a write: the stream goes on
            self.connected = False
            self.resumed += 1
            again = receiving.result()
            log.info("controller_link_hello_again", target=self._target, after_ms=again.after_ms, wait=again.wait)
            return again
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _apply_ack(self, seq: int) -> None:
        if seq > self._spool.acked_seq:
            self._spool.ack(seq)

    async def _send_loop(self, call: grpc.aio.StreamStreamCall, stop: asyncio.Event, over: asyncio.Event) -> None:
        sent_upto = self._spool.acked_seq  # unacknowledged signals are sent again, unchanged
        loop = asyncio.get_running_loop()
        next_heartbeat, said, said_at = loop.time(), b"", float("-inf")
        while not stop.is_set() and not over.is_set():
            # Cleared before the outbox and the spool are looked at, never after a write: a signal
            # spooled while a heartbeat is written wakes the wait below (it waited a whole beat).
            self._wake.clear()
            while not self._outbox.empty():
                await call.write(self._outbox.get_nowait())
            # Marked handed before the write yields to the loop: a signal recorded meanwhile that goes
            # over the spool's bound is never merged into one the controller may already hold.
            batch = self._spool.take(after_seq=sent_upto, limit=BATCH_LIMIT)
            if batch:
                msg = agent_pb2.SignalBatch()
                for stored in batch:  # the spool's bytes as they are: no round trip through the domain type
                    msg.signals.add().MergeFromString(stored.payload)
                sent_upto = batch[-1].seq
                await call.write(agent_pb2.AgentMessage(signals=msg))
                continue
            if loop.time() >= next_heartbeat:
                beat = agent_pb2.Heartbeat(
                    sent_at=time.time(), spooled=self._spool.count(), dropped_faults=self._spool.dropped_faults
                )
                self._fill_heartbeat(beat)
                content = beat_content(beat)
                if content != said or loop.time() - said_at >= self._idle_heartbeat_s:
                    await call.write(agent_pb2.AgentMessage(heartbeat=beat))
                    said, said_at = content, loop.time()
                next_heartbeat = loop.time() + self._heartbeat_s
            await wait_event(self._wake, next_heartbeat - loop.time())

    async def _receive_loop(self, call: grpc.aio.StreamStreamCall) -> agent_pb2.HelloAgain:
        """The controller's messages until a relay ends the session keeping the stream (its
        HelloAgain); the stream's end raises."""
        while (msg := await call.read()) is not grpc.aio.EOF:
            if msg.HasField("hello_again"):
                return cast(agent_pb2.HelloAgain, msg.hello_again)
            if msg.HasField("ack"):
                self._apply_ack(msg.ack.acked_seq)
            elif msg.HasField("run_check"):
                run = msg.run_check
                check = self._checks[run.request_id] = asyncio.ensure_future(self._run_check(run))
                asyncio.create_task(self._answer_check(check, run.request_id, run.check))
            elif msg.HasField("run_remedy"):
                remedy = asyncio.ensure_future(self._run_remedy(msg.run_remedy))
                asyncio.create_task(self._answer_check(remedy, msg.run_remedy.request_id, msg.run_remedy.remedy))
            elif (
                msg.HasField("stop_check")
                and (running := self._checks.get(msg.stop_check.request_id))
                and not running.done()
            ):
                log.info("check_stopped", request_id=msg.stop_check.request_id, why=msg.stop_check.why)
                self._stopped_why[msg.stop_check.request_id] = msg.stop_check.why or "no reason given"
                running.cancel()
        raise ConnectionError("controller closed the stream")

    async def _answer_check(self, running: asyncio.Future[common_pb2.CheckResult], request_id: str, check: str) -> None:
        """Send the check's answer when it ends: UNKNOWN, not run, when the controller stopped it."""
        try:
            result = await running
        except asyncio.CancelledError:
            if not running.cancelled():  # this task itself was cancelled, not the check
                raise
            why = f"stopped by the controller: {self._stopped_why.pop(request_id, 'no reason given')}"
            result = common_pb2.CheckResult(request_id=request_id, check=check, reason=why, not_run=NotRun.STOPPED)
            result.verdict = common_pb2.UNKNOWN
        finally:
            if self._checks.get(request_id) is running:
                del self._checks[request_id]
        self._outbox.put_nowait(agent_pb2.AgentMessage(check_result=result))
        self._wake.set()
