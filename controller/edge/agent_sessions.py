"""An agent's session, whatever carries its stream: the checks on its Hello, the Hello written, each
message after it, the stream's end. The agent gateway (an agent connected to the controller) and the
relay gateway (agents connected to a ``vigil relay``, many streams on one) both speak through it, so
an agent is admitted, limited, recorded and acknowledged the same way on either.

A session refuses by raising ``Refused``, a gRPC status that names the problem; the transport ends
the agent's stream with it.
"""

from __future__ import annotations

import asyncio
import time
from typing import NoReturn
from urllib.parse import unquote

import grpc
import structlog

from controller.edge.hello_pacing import HelloPacing, turn_ms
from controller.edge.limits import LimitsConfig
from controller.nodes.agent_outboxes import AgentOutboxes, Message, Outbox
from controller.nodes.check_requests import CheckRequests
from controller.nodes.engine import Engine
from controller.nodes.fleet import Fleet
from controller.nodes.guards.rules import RateLimiter
from controller.store.health import is_database_error
from controller.vocab.lanes import Lanes, lanes_message
from controller.vocab.policy import RecordOnly
from protos.codec import BadSignal, signal_from_proto
from protos.vigil.v1 import agent_pb2
from vigil_core.log_tally import TalliedEvent
from vigil_core.names import is_address, is_node_name
from vigil_core.rank_progress import RankRecord
from vigil_core.signals import Signal
from vigil_core.tls import Identity
from vigil_core.urgent_port import refusal as urgent_port_refusal

log = structlog.get_logger(__name__)

MAX_GPUS = 1024
MAX_IDLE_HEARTBEAT_S = 600.0  # an agent quiet longer than this could be stuck for half an hour unseen
RECEIVE_CHUNK = 50  # signals decided and committed between two turns of the event loop


class Refused(Exception):
    """The agent's stream ends with this status (and, for a Hello paced, the turn it was given)."""

    def __init__(self, code: grpc.StatusCode, why: str, retry_after_ms: int = 0) -> None:
        super().__init__(why)
        self.code, self.why, self.retry_after_ms = code, why, retry_after_ms


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer ("ipv4:10.0.0.7:41234", "ipv6:[fd00::7]:41234"); "" for others."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host = unquote(rest).rpartition(":")[0]
    return host.strip("[]")


def hello_problem(hello: agent_pb2.Hello) -> str:
    """What is wrong with an agent's Hello; "" when nothing. Pure."""
    if not is_node_name(hello.node):
        return f"Hello.node {hello.node[:100]!r} is not a valid node name"
    if not 0 < len(hello.spool_id) <= 128:
        return "Hello.spool_id must be 1 to 128 characters"
    if len(hello.gpus) > MAX_GPUS:
        return f"Hello.gpus lists {len(hello.gpus)} GPUs, more than {MAX_GPUS}"
    if not is_address(hello.address):
        return "Hello.address is not a host name or an IP address"
    if len(hello.agent_version) > 64 or len(hello.gpu_backend) > 32:
        return "Hello.agent_version or gpu_backend is too long"
    if not 0 <= hello.idle_heartbeat_s <= MAX_IDLE_HEARTBEAT_S:  # NaN fails this too
        return f"Hello.idle_heartbeat_s must be from 0 to {MAX_IDLE_HEARTBEAT_S:g} s"
    if not 0 <= hello.booted_at < 1e11:  # unix seconds (0: not said); NaN and infinity fail this too
        return "Hello.booted_at must be unix seconds (0 when not known)"
    return ""


def seq_problem(signals: list[Signal], last_seq: int, max_gap: int) -> str:
    """Why a batch's numbering cannot be taken; "" when it can. A spool numbers its signals one by
    one (a gap is what its bound dropped, far below ``max_gap``), so a number far past the last one
    received is a broken or hostile agent: taken, it would make every later signal look replayed.
    Before anything was received from the spool, any number is the spool's own. Pure."""
    top = max((s.seq for s in signals), default=0)
    if last_seq and top - last_seq > max_gap:
        return f"signal seq={top} is {top - last_seq} past this spool's last ({last_seq}); at most {max_gap}"
    return ""


def first_hello(message: agent_pb2.AgentMessage | None) -> agent_pb2.Hello:
    """The Hello a stream must open with."""
    if message is None or not message.HasField("hello"):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
    return message.hello


class AgentSessions:
    def __init__(
        self,
        engine: Engine,
        fleet: Fleet,
        checks: CheckRequests,
        outboxes: AgentOutboxes,
        limits: LimitsConfig | None = None,
    ) -> None:
        self._engine = engine  # an agent's session: hello, heartbeats, batches, going away
        self._fleet = fleet  # who is known already (limits.max_nodes), and each spool's last seq
        self._checks = checks  # the answers to the checks the controller asked for
        self._outboxes = outboxes  # the engine's too: what it sends a connected agent goes out here
        self.limits = limits or LimitsConfig()
        self._rate = RateLimiter(self.limits.agent_messages_per_s, self.limits.agent_burst)  # per node
        self._pacing = HelloPacing(self.limits.hellos_per_s, self.limits.hello_burst)  # the whole fleet's
        self._lanes: tuple[object, Lanes] | None = None  # ``urgent``'s reading, and the policy it is of
        # A line per agent, up to 20 a second; a fleet reconnecting at once is counted past that.
        self._said_connected = TalliedEvent(log.info, "agent_connected")
        self._said_disconnected = TalliedEvent(log.info, "agent_disconnected")
        self._said_full = TalliedEvent(log.warning, "call_refused")

    def flush_lines(self) -> None:
        """Say the tallied lines' remainder now (the process stops: a fleet's last second of
        disconnections is not lost)."""
        for said in (self._said_connected, self._said_disconnected, self._said_full):
            said.flush()

    def admit(
        self, hello: agent_pb2.Hello, who: Identity | None, peer: str, paced: bool = True, urgent_port: bool = False
    ) -> None:
        """Whether this Hello may open a session now: its content, its caller (None: nobody to check,
        plaintext or a relay that checked), the fleet's size limit, and its turn (``paced``; a relay's
        Hellos are not: it passes on only so many at once, sized by how long they wait here for their
        answer, ``controller.relay.hello_room``, and a turn given on top only sends its agent round again). A
        Hello that says faults wait in its agent's spool (``urgent_waiting``) is admitted at once; on the
        urgent port (``vigil_core.urgent_port``), only such a Hello is."""
        node = hello.node
        if problem := hello_problem(hello):
            log.warning("bad_hello", peer=peer, error=problem)
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if urgent_port:
            why = urgent_port_refusal(hello.urgent_waiting)
            self._engine.metrics.urgent_port_calls.labels("refused" if why else "taken").inc()
            if why:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, why)
        if who is not None and who.name != node:
            log.warning("call_refused", peer=peer, why=f"{who} said Hello as {node}")
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{who} cannot report for {node}")
        fleet = self._fleet  # a name past the limit is refused before it takes a turn it cannot use
        if node not in fleet.nodes and len(fleet) >= self.limits.max_nodes:  # names are the caller's to make up
            why = f"{len(fleet)} nodes are known already (limits.max_nodes); {node!r} is not one of them"
            self._said_full(node, peer=peer, why=why)  # the fleet's whole remainder, retrying: tallied
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        if hello.urgent_waiting > 0:  # faults wait in its spool: a fault waits behind no fleet
            self._engine.metrics.hellos_urgent.inc()
            return
        if paced and (wait_s := self._pacing.ask(node, time.monotonic())) > 0:
            self._engine.metrics.hellos_paced.inc()
            why = f"{self.limits.hellos_per_s:g} agents/s are being admitted; {node}'s turn is in {wait_s:.1f} s"
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, why, retry_after_ms=turn_ms(wait_s))

    async def start(self, hello: agent_pb2.Hello, peer: str, outbox: Outbox[Message]) -> int:
        """Write an admitted Hello and open the node's stream (``outbox``); returns what its spool has
        acknowledged, the first message back."""
        node = hello.node
        address = hello.address or peer_host(peer)
        opened = False
        try:
            acked = self._engine.hello(
                node, hello.spool_id, len(hello.gpus), address, hello.idle_heartbeat_s, list(hello.jobs),
                hello.booted_at,
            )  # fmt: skip
            if hello.urgent_waiting > 0:  # a fault waits behind no fleet's writes (``Engine.hello_durable``)
                await self._engine.hello_durable(node)
            else:  # the fleet's wait for the flush of all before them paces them (``Engine.hello_durable``)
                await self._engine.durable()
            # Open now, whatever ended meanwhile: an older stream of this node's that closed while this
            # Hello was written counted the node as gone.
            self._outboxes.open(node, outbox)
            opened = True
            self._engine.connected(node)
        except Exception as exc:
            cannot_record(exc)
        finally:
            # Not answered (the database failed, or the call was cancelled while the Hello was written:
            # the agent died or gave up on it), and no other stream of the node's is open: the node is
            # not connected, else a dead node would stay HEALTHY for three of its idle heartbeats.
            if not opened and not self._outboxes.is_open(node):
                self._engine.disconnected(node)
        self._said_connected(node, peer=peer, acked_seq=acked, gpus=len(hello.gpus))
        return acked

    def record_only(self) -> RecordOnly:
        """What the policy only records: a relay's lanes (``controller.vocab.lanes``)."""
        return self._engine.policy.record_only()

    def urgent(self, raw: bytes) -> bool:
        """Whether an agent's message, as it came, carries a signal the policy may act on (not only
        record): a relay's streams with one are handled before those in turn. The relay's own reading
        (``Lanes.urgent``) of what ``record_only`` tells it, so the two never differ: only a signal
        batch can, or a Hello that says faults wait behind it (told by its first byte: a heartbeat,
        most of what comes, is not decoded twice); one that does not decode counts as urgent, its
        refusal comes as soon."""
        policy = self._engine.policy
        if self._lanes is None or self._lanes[0] is not policy:
            self._lanes = (policy, Lanes.from_message(lanes_message(policy.record_only())))
        return self._lanes[1].urgent(raw)

    async def handle(self, node: str, msg: agent_pb2.AgentMessage, outbox: Outbox[Message]) -> None:
        """One message after the Hello, in the stream's order; an ack goes to ``outbox``."""
        if not self._rate.allow(node, time.monotonic()):  # the spool keeps what was not acknowledged
            why = f"{node} sends more than {self.limits.agent_messages_per_s:g} messages/s"
            log.warning("agent_rate_limited", node=node, why=why)
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        body = msg.WhichOneof("body")
        if body == "heartbeat":
            beat = msg.heartbeat
            unparsed = list(beat.unparsed_lines)
            ranks = [RankRecord(r.job_id, r.rank, node, r.step, r.phase, r.at) for r in beat.ranks]
            self._engine.heartbeat(
                node, beat.dropped_faults, beat.spooled, list(beat.jobs), unparsed, beat.unparsed_total, ranks
            )
        elif body == "signals":
            try:
                signals = [signal_from_proto(s) for s in msg.signals.signals]
            except BadSignal as exc:
                log.warning("bad_signal", node=node, error=str(exc))
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            if problem := seq_problem(signals, self._fleet.entry(node).last_seq, self.limits.max_seq_gap):
                log.warning("bad_signal", node=node, error=problem)
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, problem)
            if foreign := [s.node for s in signals if s.node != node]:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"agent for {node!r} sent a signal for {foreign[0]!r}")
            try:
                acked = await self._receive(node, signals)
                await self._engine.durable()  # the agent drops what is acknowledged: on disk first
            except Exception as exc:
                cannot_record(exc)
            outbox.put_nowait(agent_pb2.ControllerMessage(ack=agent_pb2.Ack(acked_seq=acked)))
        elif body == "check_result":
            self._checks.answered(node, msg.check_result)
        else:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected message {body!r} after Hello")

    def end(self, node: str, outbox: Outbox[Message], say: bool = True) -> None:
        """The stream that owned ``outbox`` ended: the node is gone when it was its last one. ``say``:
        logged for this node (a relay's loss is logged once for all it carried: a line per agent was
        most of a controller's time to stop with 20,000 agents through relays)."""
        if self._outboxes.close(node, outbox):
            self._engine.disconnected(node)
        if say:
            self._said_disconnected(node)

    async def _receive(self, node: str, signals: list[Signal]) -> int:
        """Decide a batch in chunks, letting the event loop run between them: one node's flood never
        holds up another node's fault (or an operator's ``vigil status``) for a whole batch."""
        acked = 0
        for start in range(0, max(len(signals), 1), RECEIVE_CHUNK):
            if start:
                await asyncio.sleep(0)
            acked = self._engine.receive(node, signals[start : start + RECEIVE_CHUNK])
        return acked


def cannot_record(exc: Exception) -> NoReturn:
    """The database failed (said aloud by the store's health): the agent is told UNAVAILABLE and keeps
    the batch in its spool, to send again. Anything else is a bug, raised as it is."""
    if not is_database_error(exc):
        raise exc
    raise Refused(
        grpc.StatusCode.UNAVAILABLE, f"the controller cannot record now ({exc!r:.200}): keep the signals, retry"
    ) from None
