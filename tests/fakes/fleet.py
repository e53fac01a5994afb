"""A fleet of simulated agents in one process: one real gRPC stream per node to a real controller.

Each node says Hello, heartbeats every ``heartbeat_s`` (jittered; with ``idle_heartbeat_s``, as the
agent does, only that often while it has no jobs to report) and, when asked, sends a signal
stamped with the time it is sent (``observed_at``), so the controller's fault-to-action clock starts
exactly there. By default every stream of the process shares one HTTP/2 connection (gRPC shares it
between channels to one target); ``streams_per_connection`` gives every N nodes a connection of
their own (1: as real agents, each on its own machine, and as the controller then holds them).
With ``checks`` (``tests.fakes.sim_checks``) the nodes answer RunCheck too.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import random
import time
from collections.abc import Callable
from functools import partial

import grpc

from agent.link import hello_patience_s, turn_with_spread
from checks.result import NotRun
from protos.codec import signal_from_proto
from protos.vigil.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from tests.fakes.sim_checks import SimulatedChecks
from vigil_core import loop_lag
from vigil_core.call_taken import TAKEN_PATIENCE_S
from vigil_core.rpc_errors import retry_after_s
from vigil_core.tls import NO_BDP_PROBE
from vigil_core.waiting import backoff_delay

NODES_PER_CHANNEL = 100


class FleetNode:
    def __init__(
        self,
        name: str,
        stub: agent_pb2_grpc.AgentGatewayStub,
        checks: SimulatedChecks | None = None,
        urgent_stub: agent_pb2_grpc.AgentGatewayStub | None = None,
    ) -> None:
        self.name = name
        self._stub = stub
        # As the agent given an urgent port (``vigil_core.urgent_port``): a stream opened with faults
        # waiting goes there; one that broke there before its Hello was answered, to the main port.
        self._urgent_stub = urgent_stub
        self._urgent_closed = False
        self.urgent_streams = 0  # streams opened on the urgent port
        self._on_urgent = False  # the stream now is the urgent port's
        # As the agent (``agent.link``): a fault that comes while the node waits before its Hello (a
        # turn, a backoff) ends the wait; one that comes while its Hello, which said none, waits for
        # its answer gives the call up for the urgent port. False: as the agent before it, the fault
        # waits with its Hello (the benchmark's side-by-side baseline).
        self.leave_for_urgent = True
        self.left_for_urgent = 0  # calls given up for the urgent port when a fault came
        self._hello_urgent = 0  # the faults waiting its last Hello said
        self._answered_generation = 0  # the last stream whose Hello was answered (an Ack)
        self._leaving = False  # its call cancelled for the urgent port
        self._woken: asyncio.Future[None] | None = None  # a wait before its next Hello, a fault ends it
        self._checks = checks
        self._answering: set[asyncio.Task[None]] = set()
        self._running: dict[str, asyncio.Task[None]] = {}  # request id -> its check's task
        self._queue: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()  # the current stream's
        self._generation = 0  # which stream is the current one
        self._beats: dict[int, asyncio.TimerHandle] = {}  # each open stream's next heartbeat (``_beat``)
        self._unacked: dict[int, agent_pb2.AgentMessage] = {}  # signals sent, not yet acknowledged
        self._urgent: set[int] = set()  # the seqs among them the agent keeps above all (``Signal.must_keep``)
        self._takes_urgent = False  # told to wait by a relay that takes an urgent Hello unasked, not asked yet
        self._unasked = False  # said a Hello unasked: a Hello again that crossed it is not answered
        self._early = False  # said a Hello unasked with no fault: one that comes says it again, once
        self.unasked = 0  # urgent Hellos said unasked, in all
        self.seq = 0
        self.acked = 0
        self.ready = asyncio.Event()
        self.reconnects = 0
        self.paced = 0  # Hellos the controller turned away with a turn to come back at
        self.resumable = True  # as the agent: says so in its Hello, and says Hello again when a relay asks
        self.resumed = 0  # Hellos said again on a stream a relay kept
        self.last_error = ""  # why its stream last broke
        self.connected_at = 0.0  # when its stream was last taken (the controller's first ack on it)
        self.idle_heartbeat_s = 0.0  # as the agent's setting: 0, a heartbeat every heartbeat_s
        self.jobs: list[str] = []  # the training jobs this node's processes run, said in every heartbeat
        # How long each Hello waited for its first answer (an Ack, or a Hello again), as the agent's
        # link bounds it (agent.link.hello_patience_s; these wait on); told to ``answered``.
        self.answered: Callable[[float], None] = lambda _: None
        self._hello_said_at = 0.0
        # As the agent's link, when its Fleet has a patience: a Hello unanswered past
        # ``hello_patience_s(unanswered, patience_first_s)`` on the process's own time is given up on
        # (the stream cancelled, the node reconnects after its backoff), and the next waits twice as long.
        self.clock: Callable[[], float] = time.monotonic  # the process's own time (its Fleet's)
        self.hello_own_at = 0.0  # when the Hello now unanswered was said, on ``clock`` (0: none)
        # As the agent, the first Hello of a stream counts its patience once the server has taken the
        # call (``vigil_core.call_taken``); until then this is when it was said (0: taken, or none).
        self.untaken_own_at = 0.0
        self.mind: Callable[[FleetNode], None] = lambda _: None  # told of each Hello's wait (its Fleet's patience)
        self.taken_in: Callable[[float], None] = lambda _: None  # how long each stream waited to be taken
        self._taken_generation = 0  # the last stream the server took
        self._taking: asyncio.Task[None] | None = None
        self.unanswered = 0  # Hellos in a row given up on
        self.gave_up = 0  # Hellos given up on, in all
        self._call: grpc.aio.StreamStreamCall | None = None
        self._giving_up = False
        self.ranks: list[agent_pb2.RankProgress] = []  # their ranks' progress records, likewise
        # For the signals sent with ``watch``, by their batch's id: the batch, and its times (sent;
        # the stream took it, its write began; gRPC was done with it, flow control let it through).
        self._watched: dict[int, tuple[agent_pb2.AgentMessage, list[float]]] = {}
        self.last_watched: list[float] = []  # the times of the last signal sent with ``watch``

    async def run(self, heartbeat_s: float, stop: asyncio.Event) -> None:
        """Like an agent: a broken stream is opened again. A stream the server refuses before taking it
        (gRPC's own bound on calls waiting for a server's event loop: ``vigil_core.tls.server_options``)
        or ends while its Hello is still being sent breaks INTERNAL or CANCELLED on this side, whatever
        the server said; the scale benchmark counts the breaks and spreads its fleet over processes."""
        attempt = 0
        while not stop.is_set():
            # Each stream its own queue, holding first what was sent and not acknowledged (an agent's
            # spool): a broken stream's request iterator never takes what the next stream must send.
            # Each stream its own queue: a broken stream's request iterator never takes what the next
            # stream must send. What was sent and not acknowledged goes again once a Hello is answered
            # (as the agent replays its spool after the Ack): a relay that keeps a Hello drops what comes
            # after it until it passes it on.
            self._generation += 1
            self._queue = asyncio.Queue()
            self._takes_urgent = self._unasked = self._early = False
            self._hello_said_at = 0.0  # this stream's Hello is said in ``_messages``
            urgent = self._urgent_stub is not None and bool(self._urgent) and not self._urgent_closed
            stub = self._urgent_stub if urgent and self._urgent_stub is not None else self._stub
            self._on_urgent = urgent
            self.urgent_streams += urgent
            try:
                self._call = call = stub.Connect(self._messages(heartbeat_s, stop, self._generation, self._queue))
                self._taking = asyncio.create_task(self._taken(call, self._generation))
                first = True
                async for msg in call:
                    if self._hello_said_at and (msg.HasField("hello_again") or msg.HasField("ack")):
                        self.answered(time.monotonic() - self._hello_said_at)
                        self._hello_said_at = 0.0
                        self.hello_own_at, self.untaken_own_at, self.unanswered = 0.0, 0.0, 0
                    if msg.HasField("hello_again"):  # a relay keeps the stream for a new session
                        again = msg.hello_again
                        first = True
                        if self._unasked and not again.wait and not again.after_ms:
                            self._unasked = False  # asked for the urgent Hello said unasked as it went out
                        elif not again.wait:
                            self.resumed += 1
                            later = turn_with_spread(again.after_ms / 1000)
                            asyncio.get_running_loop().call_later(later, self._hello_again, self._queue)
                        elif not again.kept:  # the relay reaches the controller again: asked for Hello later
                            self._takes_urgent = again.takes_urgent_hello
                            if again.takes_hello or self._takes_urgent and self._urgent:  # said now, kept there
                                self._early = not self._urgent
                                self._say_unasked()
                    elif msg.HasField("ack"):
                        self.acked = max(self.acked, msg.ack.acked_seq)
                        for seq in [s for s in self._unacked if s <= self.acked]:
                            del self._unacked[seq]
                            self._urgent.discard(seq)
                        if first:  # the Hello's answer: what it holds is known, the rest goes again, in order
                            self.connected_at, first, attempt = time.time(), False, 0
                            self._answered_generation = self._generation
                            urgent, self._urgent_closed = False, False
                            self._unasked = self._early = False
                            for seq in sorted(self._unacked):
                                self._queue.put_nowait(self._unacked[seq])
                        self.ready.set()
                    elif msg.HasField("run_check") and self._checks is not None:
                        task = asyncio.create_task(self._answer(msg.run_check))
                        self._answering.add(task)
                        task.add_done_callback(self._answering.discard)
                        self._running[msg.run_check.request_id] = task
                    elif msg.HasField("stop_check") and (stopping := self._running.get(msg.stop_check.request_id)):
                        stopping.cancel(msg.stop_check.why)  # as the agent ends a stopped check's processes
            except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and not self._giving_up and not self._leaving:
                    raise  # the node's task itself
                self.reconnects += 1
                if self._leaving:  # a fault came while its Hello waited: the urgent port at once
                    self._leaving = self._giving_up = False
                    self.left_for_urgent += 1
                    self.last_error = "a fault came while its Hello waited: left for the urgent port"
                    continue
                if urgent:  # the urgent port did not answer its Hello: the main port, at once
                    self._urgent_closed, self._giving_up, self.last_error = True, False, f"urgent port: {exc!r:.80}"
                    continue
                if self._giving_up:  # its Hello given up on (``give_up``): as the agent, after its backoff
                    self._giving_up, self.last_error = False, "gave up on its Hello (the agent's patience)"
                    attempt += 1
                    await self._wait(backoff_delay(attempt, base=0.5))
                    continue
                assert isinstance(exc, grpc.aio.AioRpcError)
                self.last_error = f"{exc.code().name}: {exc.details()}"
                if (turn := retry_after_s(exc)) is not None:  # the controller gave it a turn, as the agent takes it
                    self.paced, self.last_error = self.paced + 1, "RESOURCE_EXHAUSTED: given a turn (paced)"
                    await self._wait(turn_with_spread(turn))
                    continue
                attempt += 1
                await self._wait(backoff_delay(attempt, base=0.5))  # as the agent's link does

    async def _wait(self, delay_s: float) -> None:
        """A wait before the next Hello (a turn, a backoff): ended by a fault that comes meanwhile
        (``_fault_came``)."""
        if not self.leave_for_urgent:
            await asyncio.sleep(delay_s)
            return
        if self._urgent and self._hello_urgent == 0:
            return  # a fault its last Hello did not say: no wait
        self._woken = asyncio.get_running_loop().create_future()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken, delay_s)
        finally:
            self._woken = None

    def _fault_came(self) -> None:
        """A fault came that its last Hello did not say (it said none): a wait before the next Hello
        ends; a call whose Hello waits for its answer on the main port is given up for the urgent
        port (as the agent, ``agent.link.FaultCame``)."""
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)
            return
        call = self._call
        if (
            self._urgent_stub is not None
            and not self._urgent_closed
            and not self._on_urgent
            and self._answered_generation != self._generation
            and call is not None
            and not call.done()
        ):
            self._leaving = True
            call.cancel()

    async def _taken(self, call: grpc.aio.StreamStreamCall, generation: int) -> None:
        """As the agent: its first Hello's patience counts once the server has taken the call
        (``vigil_core.call_taken``); the wait until then is told to ``taken_in``."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            await call.initial_metadata()
        if generation != self._generation:
            return
        self._taken_generation = generation
        if self._hello_said_at and not self.hello_own_at:  # its Hello said, not answered: patience from now
            self.hello_own_at, self.untaken_own_at = self.clock(), 0.0
            self.mind(self)
            self.taken_in(time.monotonic() - self._hello_said_at)

    def give_up(self) -> None:
        """Its Hello waited past its patience: its stream is cancelled, and it reconnects (``run``)."""
        self.hello_own_at, self.unanswered, self.gave_up = 0.0, self.unanswered + 1, self.gave_up + 1
        self.untaken_own_at = 0.0
        if self._call is not None and not self._call.done():
            self._giving_up = True
            self._call.cancel()

    @property
    def unsent(self) -> int:
        """Messages waiting for the stream to take them (gRPC's flow control holds them back)."""
        return self._queue.qsize()

    def beat(self) -> None:
        """A heartbeat now (what the node says of itself, its jobs among it)."""
        self._queue.put_nowait(
            agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=time.time(), jobs=self.jobs, ranks=self.ranks))
        )

    def cancel_checks(self) -> None:
        for task in self._answering:
            task.cancel()

    async def _answer(self, run: agent_pb2.RunCheck) -> None:
        assert self._checks is not None
        try:
            result = await self._checks.answer(self.name, run)
        except asyncio.CancelledError as exc:
            if not exc.args:  # cancel_checks(): the agent went away with its checks
                raise
            why = f"stopped by the controller: {exc.args[0]}"  # a StopCheck: answered as the agent does
            result = common_pb2.CheckResult(request_id=run.request_id, node=self.name, check=run.check, reason=why)
            result.verdict, result.not_run = common_pb2.UNKNOWN, NotRun.STOPPED
            self._checks.stopped.append((self.name, run.request_id))
        finally:
            self._running.pop(run.request_id, None)
        if result is not None:  # None: the check hangs, and its agent never answers
            self._queue.put_nowait(agent_pb2.AgentMessage(check_result=result))

    def _hello(self) -> agent_pb2.AgentMessage:
        gpus = [common_pb2.GpuRef(index=i, uuid=f"GPU-{self.name}-{i}") for i in range(8)]
        hello = agent_pb2.Hello(
            node=self.name,
            spool_id=f"bench-{self.name}",
            gpus=gpus,
            address=f"{self.name}.sim",
            idle_heartbeat_s=self.idle_heartbeat_s,
            resumable=self.resumable,
            waits_for_kept_hello=self.resumable,  # as the agent: a relay keeps its Hello for room, it waits
            urgent_waiting=len(self._urgent),
        )
        self._hello_urgent = len(self._urgent)
        return agent_pb2.AgentMessage(hello=hello)

    def _hello_again(self, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        """Hello on the same stream (what was sent and not acknowledged goes again once it is answered;
        whatever waits before it goes nowhere: the relay takes only a Hello between sessions)."""
        if queue is self._queue:
            self._takes_urgent = False
            self._hello_said_at, self.hello_own_at = time.monotonic(), self.clock()
            self.mind(self)
            queue.put_nowait(self._hello())

    def _say_unasked(self) -> None:
        """As the agent told to wait by a relay that takes a Hello unasked (any, ``takes_hello``; or an
        urgent one, and a fault waits): its Hello goes now; the relay keeps it until the controller has
        room, and calls a node with faults waiting before those without."""
        self._takes_urgent, self._unasked = False, True
        self.unasked += 1
        self._hello_again(self._queue)
        self.hello_own_at = 0.0  # kept by the relay: its answer may take long, and no patience runs on it

    async def _messages(self, heartbeat_s: float, stop: asyncio.Event, generation: int, queue: asyncio.Queue):  # type: ignore[no-untyped-def,type-arg]
        self._hello_said_at = time.monotonic()
        if self._taken_generation == generation:  # taken before its Hello went (``_taken``)
            self.hello_own_at = self.clock()
        else:  # its patience waits for the call to be taken, within the agent's bound on that
            self.hello_own_at, self.untaken_own_at = 0.0, self.clock()
        self.mind(self)
        yield self._hello()
        # Its heartbeats: a timer that puts each in the stream's queue (not a wait with a timeout on
        # every message: a task and a timer each, a tenth of the simulator's time after a failover).
        loop = asyncio.get_running_loop()
        first = random.uniform(0, self._interval(heartbeat_s))
        self._beats[generation] = loop.call_later(first, self._beat, heartbeat_s, stop, generation, queue)
        try:
            while (msg := await queue.get()) is not None:  # None: stopped, or a newer stream (``_beat``)
                if self._watched and (watched := self._watched.get(id(msg))) and watched[0] is msg:
                    watched[1].append(time.time())
                    yield msg
                    watched[1].append(time.time())
                    continue
                yield msg
        finally:
            if (beat := self._beats.pop(generation, None)) is not None:
                beat.cancel()

    def _beat(self, heartbeat_s: float, stop: asyncio.Event, generation: int, queue: asyncio.Queue) -> None:  # type: ignore[type-arg]
        """A heartbeat due on the stream ``generation``: put in its queue, the next one timed; a
        stopped node's, or a stream no longer the current one's, iterator is ended instead."""
        if stop.is_set() or generation != self._generation:
            queue.put_nowait(None)
            return
        queue.put_nowait(
            agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=time.time(), jobs=self.jobs, ranks=self.ranks))
        )
        if generation in self._beats:  # its stream still open
            self._beats[generation] = asyncio.get_running_loop().call_later(
                self._interval(heartbeat_s), self._beat, heartbeat_s, stop, generation, queue
            )

    def _interval(self, heartbeat_s: float) -> float:
        """As the agent beats: every ``heartbeat_s`` while it has something to say (its jobs' ranks move),
        else every ``idle_heartbeat_s`` (0: steadily)."""
        return heartbeat_s if self.jobs or self.ranks or not self.idle_heartbeat_s else self.idle_heartbeat_s

    def fault(
        self,
        code: int = 79,
        kind: int = common_pb2.XID,
        message: str = "GPU has fallen off the bus.",
        watch: bool = False,
    ) -> float:
        """Send a signal now (an XID by default); returns its observed_at. ``watch``: its stream's
        times for it are kept (``last_watched``)."""
        self.seq += 1
        now = time.time()
        signal = common_pb2.Signal(
            node=self.name,
            gpu=common_pb2.GpuRef(index=2, uuid=f"GPU-{self.name}-2"),
            kind=kind,  # type: ignore[arg-type]
            code=code,
            message=message,
            source="bench",
            observed_at=now,
            seq=self.seq,
        )
        batch = agent_pb2.AgentMessage(signals=agent_pb2.SignalBatch(signals=[signal]))
        self._unacked[self.seq] = batch
        if signal_from_proto(signal).must_keep:
            self._urgent.add(self.seq)
            if self._takes_urgent:  # it waits to be asked for Hello: a fault came, so it says Hello now
                self._say_unasked()
            elif self._early:  # its Hello said unasked said none: said again, once (the relay keeps the last)
                self._early = False
                self._say_unasked()
            elif self.leave_for_urgent and self._hello_urgent == 0:
                self._fault_came()
        if watch:
            self.last_watched = [now]
            self._watched[id(batch)] = (batch, self.last_watched)
        self._queue.put_nowait(batch)
        return now


class Fleet:
    def __init__(
        self,
        target: str,
        names: list[str],
        heartbeat_s: float = 5.0,
        checks: SimulatedChecks | None = None,
        idle_heartbeat_s: float = 0.0,
        streams_per_connection: int | None = None,
        resumable: bool = True,
        hello_patience_first_s: float | None = None,
        urgent_target: str | None = None,
    ) -> None:
        """``streams_per_connection``: None, every stream of this process on one HTTP/2 connection
        (gRPC shares a connection between channels to one target: the cheapest for tests); N, a
        connection of its own for every N nodes (1: as real agents, each on its own machine).
        ``resumable``: the nodes say Hello again on a stream a relay keeps (as the agent does).
        ``hello_patience_first_s``: the nodes give up on a Hello unanswered that long on this process's
        own time, then twice as long each time, as the agent does (None: they wait on).
        ``urgent_target``: the same server's urgent port, where a node with faults waiting opens its
        stream (one connection for them all; None: none)."""
        if streams_per_connection is None:
            count, options = max(1, len(names) // NODES_PER_CHANNEL + 1), list(NO_BDP_PROBE)
        else:
            count = max(1, -(-len(names) // streams_per_connection))
            options = [("grpc.use_local_subchannel_pool", 1), *NO_BDP_PROBE]  # as the agent's channel
        self._channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]
        urgent = None
        if urgent_target is not None:
            self._channels.append(grpc.aio.insecure_channel(urgent_target, options=options))
            urgent = agent_pb2_grpc.AgentGatewayStub(self._channels[-1])
        self.nodes = {
            name: FleetNode(name, agent_pb2_grpc.AgentGatewayStub(self._channels[i % count]), checks, urgent)
            for i, name in enumerate(names)
        }
        for node in self.nodes.values():
            node.idle_heartbeat_s = idle_heartbeat_s
            node.resumable = resumable
        self._heartbeat_s = heartbeat_s
        self._stop = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._patience_first_s = hello_patience_first_s
        self._lateness = loop_lag.Lateness()
        self._minders: list[asyncio.Task[None]] = []
        # When each Hello's patience runs out, and the wait it was for (``_watch``): a heap.
        self._deadlines: list[tuple[float, int, FleetNode, float, float]] = []
        self._pushed = itertools.count()

    @property
    def gave_up(self) -> int:
        """Hellos the nodes gave up on (their patience), in all."""
        return sum(n.gave_up for n in self.nodes.values())

    async def start(self, timeout_s: float = 120.0, start_in: dict[str, float] | None = None) -> None:
        """Every node's agent started (those in ``start_in`` that many seconds from now), until each
        has been answered once."""
        if self._patience_first_s is not None:
            self._minders = [
                asyncio.create_task(self._lateness.watch()),
                asyncio.create_task(self._mind_patience()),
            ]
            for node in self.nodes.values():
                node.clock = self._lateness.own_time
                node.mind = partial(self._watch, self._patience_first_s)
        later = start_in or {}
        self._tasks = {
            name: asyncio.create_task(self._run_in(n, later.get(name, 0.0))) for name, n in self.nodes.items()
        }
        await asyncio.wait_for(asyncio.gather(*(n.ready.wait() for n in self.nodes.values())), timeout_s)

    async def _run_in(self, node: FleetNode, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        await node.run(self._heartbeat_s, self._stop)

    def _watch(self, first_s: float, node: FleetNode) -> None:
        """A Hello of ``node``'s waits: when its patience runs out, as the node's wait stands now."""
        if node.hello_own_at:
            due = node.hello_own_at + hello_patience_s(node.unanswered, first_s)
        else:  # its first Hello, its call not taken yet
            due = node.untaken_own_at + TAKEN_PATIENCE_S
        heapq.heappush(self._deadlines, (due, next(self._pushed), node, node.hello_own_at, node.untaken_own_at))

    async def _mind_patience(self, every_s: float = 0.25) -> None:
        """Every ``every_s``, each node whose Hello has waited past its patience gives up on it: the
        deadlines come due in order, and one the node's wait has moved on from (answered, taken,
        said again) is passed over. Not a timer per Hello, nor a look at every node: the simulator's
        own cost stays small while a whole fleet waits."""
        deadlines = self._deadlines
        while True:
            await asyncio.sleep(every_s)
            now = self._lateness.own_time()
            while deadlines and deadlines[0][0] < now:
                _, _, node, hello_at, untaken_at = heapq.heappop(deadlines)
                if (hello_at or untaken_at) and (node.hello_own_at, node.untaken_own_at) == (hello_at, untaken_at):
                    node.give_up()

    def disconnect(self, name: str) -> None:
        """The node's agent goes away (its stream closes; it does not come back)."""
        self._tasks[name].cancel()
        self.nodes[name].cancel_checks()

    async def close(self) -> None:
        self._stop.set()
        for minder in self._minders:
            minder.cancel()
        for task in self._tasks.values():
            task.cancel()
        for node in self.nodes.values():
            node.cancel_checks()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for channel in self._channels:
            await channel.close()
