"""The controller's side of a relay (``controller.edge.relay_gateway``): one agent stream's failure
is that stream's, never the relay's other agents'; a signal that acts is not decided behind a
backlog of record-only ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.edge.agent_sessions import AgentSessions
from controller.edge.relay_gateway import INTERNAL, WORKERS, RelayGateway, _Relay
from controller.nodes.agent_outboxes import Message, Outbox
from controller.store import Store
from controller.vocab.policy import Policy
from protos.vigil.v1 import agent_pb2, common_pb2, relay_pb2
from tests.fakes.pagers import RecordingPager


class FailingFor(AgentSessions):
    """The real sessions, with a bug for one node's Hello."""

    async def start(self, hello: agent_pb2.Hello, peer: str, outbox: Outbox[Message]) -> int:
        if hello.node == "bad":
            raise RuntimeError("a bug")
        return await super().start(hello, peer, outbox)


def hello(stream: int, node: str) -> relay_pb2.UpItem:
    message = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, spool_id="s"))
    return relay_pb2.UpItem(stream=stream, message=message.SerializeToString())


def test_a_bug_in_one_relayed_stream_ends_that_stream_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        route = node_route(store, Policy(), LocalActuator(store.db), RecordingPager())
        sessions = FailingFor(route.engine, route.fleet, route.checks, route.outboxes)
        relay = _Relay(sessions, "ipv4:127.0.0.1:1", None)
        relay.take(hello(1, "bad"))
        relay.take(hello(2, "good"))
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        ends = {i.stream: i.end.code for i in relay.replies if i.HasField("end")}
        acks = [i.stream for i in relay.replies if i.HasField("message")]
        assert ends == {1: INTERNAL} and acks == [2]
        assert route.fleet.nodes["good"].connected and "bad" not in route.fleet.nodes
        await route.engine.shutdown()

    asyncio.run(scenario())


def signal(stream: int, node: str, code: int, seq: int) -> relay_pb2.UpItem:
    xid = common_pb2.Signal(
        node=node, gpu=common_pb2.GpuRef(index=0), kind=common_pb2.XID, code=code, observed_at=1.0, seq=seq
    )
    message = agent_pb2.AgentMessage(signals=agent_pb2.SignalBatch(signals=[xid]))
    return relay_pb2.UpItem(stream=stream, message=message.SerializeToString())


def test_a_signal_that_acts_is_decided_before_the_record_only_backlog(tmp_path: Path) -> None:
    """A controller behind on a relay's record-only signals (XID 63) decides an XID 79 that comes after
    them within a few turns, not after every one of them (it waited 44 s at 100,000 agents, 500
    record-only signals a second, 2 cores)."""

    async def scenario() -> list[str]:
        store = Store(tmp_path / "ctl.db")
        route = node_route(store, Policy(), LocalActuator(store.db), RecordingPager())
        order: list[str] = []

        class Recording(AgentSessions):
            async def handle(self, node: str, msg: agent_pb2.AgentMessage, outbox: Outbox[Message]) -> None:
                order.append(node)
                await super().handle(node, msg, outbox)

        relay = _Relay(Recording(route.engine, route.fleet, route.checks, route.outboxes), "ipv4:127.0.0.1:1", None)
        streams = 300
        for i in range(streams):
            relay.take(hello(i + 1, f"node-{i}"))
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        for i in range(streams - 1):  # as one RelayUp brings them: every stream's record-only XID, then the XID 79
            relay.take(signal(i + 1, f"node-{i}", 63, seq=1))
        relay.take(signal(streams, f"node-{streams - 1}", 79, seq=1))
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        await route.engine.wait_for_actions()
        assert route.fleet.nodes[f"node-{streams - 1}"].state.health.value == "QUARANTINED"
        await route.engine.shutdown()
        return order

    order = asyncio.run(scenario())
    assert len(order) == 300 and order.index("node-299") <= WORKERS + 1


def test_two_urgent_messages_of_one_stream_are_handled_by_one_task_in_order(tmp_path: Path) -> None:
    """Two messages that act, taken in one RelayUp for one stream, are handled one after the other in
    their order, never by two tasks at once (which would interleave the stream's messages)."""

    async def scenario() -> tuple[int, list[int]]:
        store = Store(tmp_path / "ctl.db")
        route = node_route(store, Policy(), LocalActuator(store.db), RecordingPager())
        busy, most, seqs = [0], [0], []

        class Counting(AgentSessions):
            async def handle(self, node: str, msg: agent_pb2.AgentMessage, outbox: Outbox[Message]) -> None:
                busy[0] += 1
                most[0] = max(most[0], busy[0])
                seqs.extend(s.seq for s in msg.signals.signals)
                try:
                    await super().handle(node, msg, outbox)
                finally:
                    busy[0] -= 1

        relay = _Relay(Counting(route.engine, route.fleet, route.checks, route.outboxes), "ipv4:127.0.0.1:1", None)
        relay.take(hello(1, "node-a"))
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        relay.take(signal(1, "node-a", 79, seq=1))
        relay.take(signal(1, "node-a", 48, seq=2))
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        await route.engine.shutdown()
        return most[0], seqs

    most, seqs = asyncio.run(scenario())
    assert seqs == [1, 2] and most == 1


def test_what_waits_at_the_controller_is_counted_and_drains_to_nothing(tmp_path: Path) -> None:
    """``RelayGateway.waiting`` (``vigil_controller_relayed_waiting_*``): the bytes and the streams a
    relay brought that the controller has not handled yet, back to nothing once handled."""

    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        route = node_route(store, Policy(), LocalActuator(store.db), RecordingPager())
        gateway = RelayGateway(AgentSessions(route.engine, route.fleet, route.checks, route.outboxes))
        relay = _Relay(gateway.sessions, "ipv4:127.0.0.1:1", None)
        gateway._relays.add(relay)
        streams = WORKERS * 3
        for i in range(streams):
            relay.take(hello(i + 1, f"node-{i}"))
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        assert gateway.waiting() == (0, 0)
        items = [signal(i + 1, f"node-{i}", 63, seq=1) for i in range(streams)]
        for item in items:
            relay.take(item)
        waiting_bytes, waiting_streams = gateway.waiting()
        assert waiting_bytes == sum(len(i.message) for i in items)  # none handled yet: no task ran
        assert waiting_streams == streams  # each waits its turn: no worker ran yet
        while relay.tasks:
            await asyncio.gather(*relay.tasks)
        assert gateway.waiting() == (0, 0)
        await route.engine.shutdown()

    asyncio.run(scenario())
