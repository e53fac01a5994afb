"""The controller's side of a relay (``controller.edge.relay_gateway``): one agent stream's failure
is that stream's, never the relay's other agents'."""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.act.local_actuator import LocalActuator
from controller.compose import node_route
from controller.edge.agent_sessions import AgentSessions
from controller.edge.relay_gateway import INTERNAL, _Relay
from controller.nodes.agent_outboxes import Message, Outbox
from controller.store import Store
from controller.vocab.policy import Policy
from protos.vigil.v1 import agent_pb2, relay_pb2
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
