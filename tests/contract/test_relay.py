"""Agents through a relay (``vigil relay``) over real gRPC on loopback: the controller admits,
records, acknowledges and asks them exactly as when they connect to it, many streams on one."""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from agent.link import ControllerLink
from agent.spool import Spool
from controller.config import LimitsConfig
from controller.daemon import Controller
from controller.relay.server import AgentStreams, RelaySettings, decoded, identity_problem, serve
from controller.relay.uplink import ITEM_OVERHEAD, UP_BATCH_BYTES, Uplink, take
from controller.vocab.lanes import lanes_message
from controller.vocab.policy import Policy
from protos.vigil.v1 import agent_pb2, agent_pb2_grpc, common_pb2, relay_pb2
from tests.contract.test_agent_link import duplicates, signals_received, xid
from tests.helpers import free_port, start_controller, stop_controller, wait_until
from vigil_core import loop_lag
from vigil_core.rpc_errors import retry_after_s
from vigil_core.tls import Identity

NODE = "node-a"


async def answer_ok(request: agent_pb2.RunCheck) -> common_pb2.CheckResult:
    return common_pb2.CheckResult(request_id=request.request_id, check=request.check, verdict=common_pb2.OK)


def link_for(spool: Spool, port: int, node: str = NODE) -> ControllerLink:
    def hello() -> agent_pb2.Hello:
        return agent_pb2.Hello(node=node, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq)

    return ControllerLink(f"127.0.0.1:{port}", spool, hello, answer_ok, heartbeat_s=0.2)


class Relay:
    """A relay on this event loop, in front of ``controller``."""

    def __init__(
        self,
        controller_port: int | str,
        port: int = 0,
        metrics_port: int | None = None,
        first_message_s: float = 30.0,
        controller_wait_s: float = 30.0,
        **settings: Any,
    ) -> None:
        self.port = port or free_port()
        target = f"127.0.0.1:{controller_port}" if isinstance(controller_port, int) else controller_port
        listen = f"127.0.0.1:{self.port}"
        self.settings = RelaySettings(
            target,
            listen,
            None,
            first_message_s,
            metrics_port=metrics_port,
            controller_wait_s=controller_wait_s,
            **settings,
        )
        self.stop = asyncio.Event()
        self.ready = asyncio.Event()
        self.task: asyncio.Task[int] | None = None

    async def __aenter__(self) -> Relay:
        self.task = asyncio.create_task(serve(self.settings, self.stop, self.ready))
        await asyncio.wait_for(self.ready.wait(), 20)
        return self

    async def __aexit__(self, *_: Any) -> None:
        self.stop.set()
        assert self.task is not None
        await self.task


def connected(controller: Controller, node: str = NODE) -> bool:
    return node in controller.nodes.fleet.nodes and controller.nodes.fleet.entry(node).connected


def run(test: Callable[[Controller, Path], Awaitable[None]], tmp_path: Path, **config: Any) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db", **config)
        try:
            await test(controller, tmp_path)
        finally:
            await stop_controller(controller)

    asyncio.run(scenario())


def test_signals_through_a_relay_are_acknowledged_once_recorded_and_replayed_after_it_restarts(tmp_path: Path) -> None:
    async def test(controller: Controller, tmp_path: Path) -> None:
        spool = Spool(tmp_path / "spool.db")
        stop = asyncio.Event()
        relay = Relay(controller.port)
        async with relay:
            link = link_for(spool, relay.port)
            running = asyncio.create_task(link.run(stop))
            spool.append([xid(45) for _ in range(5)])
            link.notify()
            await wait_until(lambda: spool.acked_seq == 5, what="five acknowledged through the relay")
            assert signals_received(controller) == 5 and connected(controller)
        # The relay went away: its agent's session ended with it, and the agent keeps spooling.
        await wait_until(lambda: not connected(controller), what="the node disconnected with its relay")
        await wait_until(lambda: not link.connected, what="the agent's link down")
        spool.append([xid(45) for _ in range(3)])
        link.notify()
        async with Relay(controller.port, relay.port):  # the same port again
            await wait_until(lambda: spool.acked_seq == 8, timeout=20, what="the replay acknowledged")
            assert signals_received(controller) == 8 and duplicates(controller) == 0
            assert controller.store.incidents.signals_from(NODE) == 8 and connected(controller)
            stop.set()
            await running
            await wait_until(lambda: not connected(controller), what="the agent's own goodbye seen")

    run(test, tmp_path)


def test_the_controller_asks_a_relayed_agent_and_hears_its_answer(tmp_path: Path) -> None:
    async def test(controller: Controller, tmp_path: Path) -> None:
        stop = asyncio.Event()
        async with Relay(controller.port) as relay:
            nodes = [f"node-{i}" for i in range(3)]
            links = [link_for(Spool(tmp_path / f"{n}.db"), relay.port, n) for n in nodes]
            running = [asyncio.create_task(link.run(stop)) for link in links]
            await wait_until(lambda: all(connected(controller, n) for n in nodes), what="three agents on one relay")
            runs = [agent_pb2.RunCheck(request_id=f"r-{n}", check="gpu_burn", deadline_s=5) for n in nodes]
            asked = [controller.nodes.checks.ask(n, run) for n, run in zip(nodes, runs, strict=True)]
            assert all(f is not None for f in asked)
            answers = await asyncio.wait_for(asyncio.gather(*[f for f in asked if f is not None]), 10)
            assert [(a.request_id, a.verdict) for a in answers] == [(f"r-{n}", common_pb2.OK) for n in nodes]
            stop.set()
            await asyncio.gather(*running)

    run(test, tmp_path)


async def first_reply(port: int, hello: agent_pb2.Hello) -> grpc.aio.AioRpcError | agent_pb2.ControllerMessage:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = agent_pb2_grpc.AgentGatewayStub(channel).Connect(iter([agent_pb2.AgentMessage(hello=hello)]))
        try:
            async for message in call:
                return message
        except grpc.aio.AioRpcError as exc:
            return exc
    raise AssertionError("the stream ended with no reply")


@pytest.mark.parametrize("through_relay", [False, True])
def test_a_relayed_agent_is_refused_as_a_direct_one_with_the_same_status(tmp_path: Path, through_relay: bool) -> None:
    async def test(controller: Controller, tmp_path: Path) -> None:
        async with Relay(controller.port) as relay:
            port = relay.port if through_relay else controller.port
            bad = await first_reply(port, agent_pb2.Hello(node="Not A Node!", spool_id="s"))
            assert isinstance(bad, grpc.aio.AioRpcError) and bad.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "is not a valid node name" in (bad.details() or "")
            first = await first_reply(port, agent_pb2.Hello(node="node-1", spool_id="s"))
            assert isinstance(first, agent_pb2.ControllerMessage) and first.HasField("ack")
            full = await first_reply(port, agent_pb2.Hello(node="node-2", spool_id="s"))
            assert isinstance(full, grpc.aio.AioRpcError) and full.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "1 nodes are known already (limits.max_nodes)" in (full.details() or "")

    run(test, tmp_path, limits=LimitsConfig(max_nodes=1))


def test_the_controller_paces_direct_hellos_and_leaves_a_relays_to_its_room(tmp_path: Path) -> None:
    """One Hello a second after a burst of one: relayed agents are all taken at once (the relay meters
    its own, ``controller.relay.hello_room``) and take nothing of the burst; direct ones after them have the
    burst, then a turn."""

    async def test(controller: Controller, tmp_path: Path) -> None:
        stop = asyncio.Event()
        async with Relay(controller.port, metrics_port=(metrics_port := free_port())) as relay:
            nodes = [f"node-{i}" for i in range(3)]
            links = [link_for(Spool(tmp_path / f"{n}.db"), relay.port, n) for n in nodes]
            running = [asyncio.create_task(link.run(stop)) for link in links]
            await wait_until(lambda: all(link.connected for link in links), timeout=20, what="all three in")
            assert [(link.streams, link.connections, link.resumed) for link in links] == [(1, 1, 0)] * 3
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_hello_again_total{why="paced"}', absent=0) == 0
            assert sample(text, "vigil_relay_hello_answer_seconds_count") == 3  # each Hello answered once
            assert controller.engine.metrics.hellos_paced._value.get() == 0
            burst = await first_reply(controller.port, agent_pb2.Hello(node="node-8", spool_id="s"))
            assert isinstance(burst, agent_pb2.ControllerMessage) and burst.HasField("ack")  # the relay's took none
            direct = await first_reply(controller.port, agent_pb2.Hello(node="node-9", spool_id="s"))
            assert isinstance(direct, grpc.aio.AioRpcError) and direct.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            turn = retry_after_s(direct)
            assert turn is not None and 0 < turn <= 1.0
            assert controller.engine.metrics.hellos_paced._value.get() == 1
            stop.set()
            await asyncio.gather(*running)

    run(test, tmp_path, limits=LimitsConfig(hellos_per_s=1, hello_burst=1))


def test_a_relay_that_loses_the_controller_keeps_its_agents_streams_and_asks_them_for_hello_again(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        async with Relay(port, metrics_port=metrics_port) as relay:
            link = link_for(spool, relay.port)
            running = asyncio.create_task(link.run(stop))
            await wait_until(lambda: connected(controller), what="connected through the relay")
            await stop_controller(controller)
            await wait_until(lambda: not link.connected, what="the agent told its session ended")
            spool.append([xid(45) for _ in range(2)])
            link.notify()  # sent between sessions: nowhere, and sent again after the Hello
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(lambda: spool.acked_seq == 2, timeout=30, what="back through the relay, replayed")
            assert connected(controller) and signals_received(controller) == 2 and duplicates(controller) == 0
            # The same stream: a second session on it, not a new connection.
            assert (link.streams, link.connections, link.resumed) == (1, 2, 1)
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_hello_again_total{why="controller_lost"}') == 1
            assert sample(text, 'vigil_relay_agents_refused_total{why="no_controller"}', absent=0) == 0
            # Each of its two Hellos waited for an answer once (the lost controller gave the first one's
            # session an end, not an answer).
            assert sample(text, "vigil_relay_hello_answer_seconds_count") == 2
            stop.set()
            await running
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_relay_holds_its_agents_for_the_controller_longer_than_an_agent_has_to_say_hello(tmp_path: Path) -> None:
    """The controller away for longer than ``first_message_s`` (an agent's bound) and within
    ``controller_wait_s`` (the relay's): the agent's call is kept, and its second session is on it."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        async with Relay(port, metrics_port=metrics_port, first_message_s=0.5, controller_wait_s=20.0) as relay:
            link = link_for(spool, relay.port)
            running = asyncio.create_task(link.run(stop))
            await wait_until(lambda: connected(controller), what="connected through the relay")
            await stop_controller(controller)
            await wait_until(lambda: not link.connected, what="the agent told its session ended")
            await asyncio.sleep(2.0)  # four times first_message_s without a controller
            controller = await start_controller(tmp_path / "ctl.db", port)
            await wait_until(lambda: connected(controller), timeout=30, what="back through the relay")
            assert (link.streams, link.resumed) == (1, 1)  # the same call: no reconnection
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_agents_refused_total{why="no_controller"}', absent=0) == 0
            stop.set()
            await running
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_relays_loss_is_one_line_for_all_it_carried_and_an_agents_own_end_one_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def scenario() -> str:
        controller = await start_controller(tmp_path / "ctl.db")
        stop, nodes = asyncio.Event(), [f"node-{i}" for i in range(3)]
        async with Relay(controller.port) as relay:
            links = [link_for(Spool(tmp_path / f"{n}.db"), relay.port, n) for n in nodes]
            running = [asyncio.create_task(link.run(stop)) for link in links]
            await wait_until(lambda: all(connected(controller, n) for n in nodes), what="three agents on one relay")
            capsys.readouterr()  # the logs from here on (structlog's loggers are bound once: read what they print)
            running[0].cancel()  # one agent goes away on its own: said for it
            await wait_until(lambda: not connected(controller, "node-0"), what="node-0 gone")
            await stop_controller(controller)  # the relay's stream ends with it: once for the two it carried
            said: list[str] = []

            def logged() -> bool:
                said.append(capsys.readouterr().out)
                return "".join(said).count("relay_disconnected") == 2  # its streams: the fleet's, the urgent one

            await wait_until(logged, what="the relay's loss logged")
            stop.set()
            await asyncio.gather(*running, return_exceptions=True)
        return "".join(said)

    said = asyncio.run(scenario())
    gone = re.findall(r"agent_disconnected +node=(\S+)", said)
    lost = dict((lane, n) for n, lane in re.findall(r"relay_disconnected +agents=(\d+) +lane=(\w+)", said))
    assert gone == ["node-0"] and lost == {"main": "2", "urgent": "0"}, said


async def asked_for_hello_again(agent: RawAgent, controller: Controller, db: Path) -> Controller:
    """The agent's first session through its relay; then the controller restarted under it: the agent
    told to wait, then asked for Hello again on its call. The new controller."""
    port = controller.port
    await agent.hello()
    assert (await agent.read()).HasField("ack")
    await stop_controller(controller)
    assert (await agent.read()).hello_again.wait
    controller = await start_controller(db, port)
    asked = await agent.read()
    assert asked.HasField("hello_again") and not asked.hello_again.wait
    return controller


class RawAgent:
    """An agent's stream by hand, to say exactly what an agent may."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.call = agent_pb2_grpc.AgentGatewayStub(self.channel).Connect()

    async def hello(self, node: str = NODE, resumable: bool = True, waits: bool = False, urgent: int = 0) -> None:
        """Its Hello (``waits``: for a Hello the relay keeps, as the agent does; ``urgent``: faults waiting)."""
        hello = agent_pb2.Hello(
            node=node, spool_id="s", resumable=resumable, waits_for_kept_hello=waits, urgent_waiting=urgent
        )
        await self.call.write(agent_pb2.AgentMessage(hello=hello))

    async def read(self) -> agent_pb2.ControllerMessage:
        message = await asyncio.wait_for(self.call.read(), 20)
        assert message is not grpc.aio.EOF
        return message

    async def close(self) -> None:
        await self.channel.close()


def test_an_agent_that_cannot_say_hello_again_has_its_stream_ended_when_the_relay_loses_the_controller(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        async with Relay(controller.port) as relay:
            agent = RawAgent(relay.port)
            await agent.hello(resumable=False)
            assert (await agent.read()).HasField("ack")
            await stop_controller(controller)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await agent.read()
            assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "the relay lost the controller" in (ended.value.details() or "")
            await agent.close()

    asyncio.run(scenario())


def test_between_sessions_a_relay_takes_only_the_same_nodes_hello_and_drops_the_rest(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        async with Relay(port, metrics_port=metrics_port) as relay:
            agents = [RawAgent(relay.port), RawAgent(relay.port)]
            for agent in agents:
                await agent.hello()
                assert (await agent.read()).HasField("ack")
            await stop_controller(controller)
            for agent in agents:
                told = await agent.read()
                assert told.HasField("hello_again") and told.hello_again.wait
            beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=1.0))
            await agents[0].call.write(beat)  # between sessions: goes nowhere
            controller = await start_controller(tmp_path / "ctl.db", port)
            for agent in agents:
                asked = await agent.read()
                assert asked.HasField("hello_again") and not asked.hello_again.wait and asked.hello_again.after_ms == 0
            await agents[0].call.write(beat)  # asked, not said yet: nowhere either
            await agents[0].hello()
            assert (await agents[0].read()).HasField("ack")
            await wait_until(lambda: connected(controller), what="the node's second session")
            await agents[1].hello(node="node-b")  # a stream opened for node-a
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await agents[1].read()
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            assert "opened for node-a cannot say Hello for node-b" in (refused.value.details() or "")
            assert "node-b" not in controller.nodes.fleet.nodes
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, "vigil_relay_dropped_between_sessions_total") == 2
            for agent in agents:
                await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_an_agent_that_does_not_say_hello_again_in_time_has_its_stream_ended_and_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        async with Relay(port, metrics_port=metrics_port, first_message_s=1.0) as relay:
            agent = RawAgent(relay.port)
            controller = await asked_for_hello_again(agent, controller, tmp_path / "ctl.db")
            with pytest.raises(grpc.aio.AioRpcError) as ended:  # says nothing: ended after first_message_s
                await agent.read()
            assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "no Hello again within 1 s of its turn" in (ended.value.details() or "")
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_agents_refused_total{why="hello_again_late"}') == 1
            await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_an_agent_that_says_hello_again_in_time_keeps_its_stream_long_past_the_bound(tmp_path: Path) -> None:
    """The bound on a Hello again is for that Hello only: once said and answered, nothing left of it
    ends the stream later (``_mind_hellos_due`` passes over a due whose Hello came)."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()
        async with Relay(port, metrics_port=metrics_port, first_message_s=0.5) as relay:
            agent = RawAgent(relay.port)
            controller = await asked_for_hello_again(agent, controller, tmp_path / "ctl.db")
            await agent.hello()
            assert (await agent.read()).HasField("ack")
            reading = asyncio.ensure_future(agent.call.read())
            await asyncio.sleep(2.0)  # four times the bound
            assert not reading.done() and not agent.call.done()  # nothing came, the stream still open
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_agents_refused_total{why="hello_again_late"}', absent=0) == 0
            reading.cancel()
            await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_hello_again_said_while_the_relay_tries_to_reach_the_controller_waits_for_it_and_is_answered(
    tmp_path: Path,
) -> None:
    """Asked for its Hello again, the agent says it as the controller has gone again: its Hello waits at
    the relay for the next controller, through the relay's tries that fail, and is answered (a session
    opened without the controller was ended by the next try that failed, its agent told to wait again)."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        port, metrics_port = controller.port, free_port()

        def tries() -> float:
            return sample(scrape(metrics_port, "/metrics")[1], "vigil_relay_uplink_tries_failed_total", absent=0)

        async with Relay(port, metrics_port=metrics_port) as relay:
            agent = RawAgent(relay.port)
            controller = await asked_for_hello_again(agent, controller, tmp_path / "ctl.db")
            await stop_controller(controller)  # gone before the agent says its Hello: it is told nothing
            await wait_until(lambda: tries() >= 1, what="a try failed")
            await agent.hello()
            failed = tries()
            await wait_until(lambda: tries() > failed, timeout=30, what="a try failed with its Hello in")
            controller = await start_controller(tmp_path / "ctl.db", port)
            assert (await agent.read()).HasField("ack")
            await wait_until(lambda: connected(controller), what="its second session")
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, 'vigil_relay_agents_refused_total{why="no_controller"}', absent=0) == 0
            assert sample(text, 'vigil_relay_hello_again_total{why="controller_lost"}') == 1  # the first loss only
            await agent.close()
        await stop_controller(controller)

    asyncio.run(scenario())


def test_under_tls_a_relay_takes_only_an_agent_whose_certificate_names_its_hello() -> None:
    hello = decoded(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node="node-1", spool_id="s")).SerializeToString())
    assert identity_problem(hello, Identity("node", "node-1"), "") == ""
    assert "cannot report for node-1" in identity_problem(hello, Identity("node", "node-2"), "")
    assert "cannot report for node-1" in identity_problem(hello, Identity("admin", "alice"), "")
    assert "cannot report for node-1" in identity_problem(hello, None, "")
    assert identity_problem(hello, Identity("agents"), "a-token") == ""  # the controller reviews the token
    assert "service-account token" in identity_problem(hello, Identity("agents"), "")
    heartbeat = decoded(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()).SerializeToString())
    assert "must be Hello" in identity_problem(heartbeat, Identity("node", "node-1"), "")
    assert "not a valid AgentMessage" in identity_problem(decoded(b"\xff\xff"), Identity("node", "node-1"), "")


def test_an_agent_message_as_big_as_the_relay_takes_goes_alone_and_a_bigger_one_ends_only_its_stream(
    tmp_path: Path,
) -> None:
    async def test(controller: Controller, tmp_path: Path) -> None:
        async with Relay(controller.port) as relay, grpc.aio.insecure_channel(f"127.0.0.1:{relay.port}") as channel:
            stub = agent_pb2_grpc.AgentGatewayStub(channel)
            calls = {n: stub.Connect() for n in ("node-1", "node-2", "node-3")}
            for node, call in calls.items():
                await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, spool_id="s")))
                assert (await asyncio.wait_for(call.read(), 10)).HasField("ack")

            def beat(size: int) -> agent_pb2.AgentMessage:
                """A heartbeat of exactly ``size`` bytes."""
                lines = ["x" * 500] * (size // 503 - 1)
                for last in range(size % 503 + 500, 0, -1):  # the lengths' varints vary: find the one that fits
                    message = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(unparsed_lines=[*lines, "x" * last]))
                    if message.ByteSize() == size:
                        return message
                raise AssertionError(f"no heartbeat of {size} bytes")

            fleet = controller.nodes.fleet
            hellos = {n: fleet.entry(n).last_heartbeat for n in ("node-1", "node-2")}
            await asyncio.sleep(0.01)
            limit = relay.settings.max_message_bytes - ITEM_OVERHEAD
            await calls["node-2"].write(beat(1000))
            await calls["node-1"].write(beat(limit))  # the most the relay takes, with another beside it
            # Under the controller's limit, but not with a relay's wrapping: this stream alone ends.
            await calls["node-3"].write(beat(relay.settings.max_message_bytes - 2))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await asyncio.wait_for(calls["node-3"].read(), 10)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            await wait_until(
                lambda: all(fleet.entry(n).last_heartbeat > at for n, at in hellos.items()),
                what="both heartbeats handled",
            )
            assert connected(controller, "node-1") and connected(controller, "node-2")
            await wait_until(lambda: not connected(controller, "node-3"), what="node-3's stream ended")
            for call in calls.values():
                call.cancel()

    run(test, tmp_path)


def test_what_the_relay_sends_is_cut_under_the_controllers_limit_in_order() -> None:
    def item(stream: int, size: int) -> relay_pb2.UpItem:
        return relay_pb2.UpItem(stream=stream, message=b"x" * size)

    first = deque([item(9, 100)])
    rest = deque([item(1, 300), item(2, 300), item(3, 900), item(4, 100), item(5, 2000), item(6, 10)])
    cut = []
    while batch := take((first, rest), 1000):
        cut.append(batch)
    assert [[i.stream for i in batch] for batch in cut] == [[9, 1, 2], [3], [4], [5], [6]]
    assert all(sum(i.ByteSize() + 8 for i in batch) <= 1000 for batch in cut if len(batch) > 1)
    assert take((deque(), deque()), 1000) == [] and not first and not rest


def signals_message(*codes: int, seq: int = 1) -> bytes:
    batch = agent_pb2.SignalBatch()
    for i, code in enumerate(codes):
        batch.signals.add(node="n", kind=common_pb2.XID, code=code, observed_at=1.0, seq=seq + i)
    return agent_pb2.AgentMessage(signals=batch).SerializeToString()


def test_a_relay_sends_a_signal_that_may_act_before_its_backlog_with_its_streams_earlier_messages() -> None:
    """300 streams' record-only XID 63s and heartbeats wait to be sent (the controller reads slowly);
    then an idle stream's XID 79 (nothing of its waits: it goes first alone), then stream 7, which
    has a heartbeat and an XID 63 waiting, sends an XID 79: the next RelayUp starts with the idle
    stream's, then stream 7's messages in their order, its XID 79 among them, and stream 7's next
    message follows them there; nothing else is reordered and nothing is lost."""

    async def scenario() -> None:
        uplink = Uplink("127.0.0.1:1", None)
        uplink._generation = 1
        uplink._deliver(relay_pb2.RelayDown(lanes=lanes_message(Policy().record_only())))
        streams = [uplink.open()[0] for _ in range(300)]
        beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=1.0)).SerializeToString()
        for stream in streams:
            uplink.send(stream, beat)
            uplink.send(stream, signals_message(63))
        seven = streams[6]
        assert uplink._in_up[seven] == 2
        idle = uplink.open()[0]
        uplink.send(idle, signals_message(79))  # an idle stream's fault: first, nothing of its to move
        assert idle in uplink._hot and idle not in uplink._in_up
        uplink.send(seven, signals_message(79, seq=2))
        uplink.send(seven, beat)  # after its XID 79: stays behind it, in the first lane
        sender = uplink._sending(1)
        first = await asyncio.wait_for(anext(sender), 1)
        assert (first.items[0].stream, first.items[0].message) == (idle, signals_message(79))
        assert [i.message for i in first.items[1:5]] == [beat, signals_message(63), signals_message(79, seq=2), beat]
        assert {i.stream for i in first.items[1:5]} == {seven}
        sent = list(first.items)
        while uplink._first or uplink._up:
            sent += (await asyncio.wait_for(anext(sender), 1)).items
        assert len(sent) == 2 * 300 + 2 + 1  # nothing lost
        assert uplink._in_up == {} and not uplink._hot  # its count of what waits agrees: nothing
        for stream in streams:  # each stream's messages in the order it sent them
            got = [i.message for i in sent if i.stream == stream]
            assert got == ([beat, signals_message(63), signals_message(79, seq=2), beat] if stream == seven
                           else [beat, signals_message(63)])  # fmt: skip
        assert uplink.metrics.first._value.get() == 2

    asyncio.run(scenario())


def test_without_the_controllers_word_a_relay_sends_in_the_order_things_came() -> None:
    async def scenario() -> None:
        uplink = Uplink("127.0.0.1:1", None)
        uplink._generation = 1
        a, b = uplink.open()[0], uplink.open()[0]
        uplink.send(a, signals_message(63))
        uplink.send(b, signals_message(79))
        sent = await asyncio.wait_for(anext(uplink._sending(1)), 1)
        assert [i.stream for i in sent.items] == [a, b]

    asyncio.run(scenario())


def test_a_relay_lingers_for_more_of_what_only_waits_to_be_recorded_never_for_what_may_act() -> None:
    """With the controller's word on what may act: a heartbeat and a record-only XID 63 wait for more
    (one message to the controller for many agents'); an XID 79 ends the wait at once and goes first,
    the others with it; past the linger what waits goes alone; so does a batch's worth, at once, and
    before the controller's word nothing waits. A stream that breaks ends its sender's wait."""
    beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=1.0)).SerializeToString()

    async def scenario() -> None:
        uplink = Uplink("127.0.0.1:1", None, linger_ms=60_000)
        uplink._generation = 1
        a, b = uplink.open()[0], uplink.open()[0]
        sender = uplink._sending(1)
        uplink.send(a, signals_message(79))  # no word yet: a fault is in the backlog's lane, never held
        assert [i.stream for i in (await asyncio.wait_for(anext(sender), 1)).items] == [a]
        uplink._deliver(relay_pb2.RelayDown(lanes=lanes_message(Policy().record_only())))
        uplink.send(a, beat)
        waiting = asyncio.ensure_future(anext(sender))
        await asyncio.sleep(0.2)
        uplink.send(b, signals_message(63))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # both wait for more
        uplink.send(b, signals_message(79, seq=2))
        sent = await asyncio.wait_for(waiting, 1)
        assert [(i.stream, i.message) for i in sent.items] == [
            (b, signals_message(63)), (b, signals_message(79, seq=2)), (a, beat)
        ]  # fmt: skip
        uplink.send(a, b"x" * UP_BATCH_BYTES)  # a batch's worth: at once
        assert len((await asyncio.wait_for(anext(sender), 1)).items) == 1
        written = uplink.metrics.uplink_messages.labels("up")._value.get()
        assert (written, uplink.metrics.messages.labels("up")._value.get()) == (2, 4)  # 4 agents' in 2
        uplink.send(a, beat)
        waiting = asyncio.ensure_future(anext(sender))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        uplink._break("the controller went away")  # the sender of the broken stream ends, taking nothing
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 1)

        short = Uplink("127.0.0.1:1", None, linger_ms=50)
        short._generation = 1
        short._deliver(relay_pb2.RelayDown(lanes=lanes_message(Policy().record_only())))
        c = short.open()[0]
        short.send(c, beat)
        assert [i.message for i in (await asyncio.wait_for(anext(short._sending(1)), 5)).items] == [beat]

    asyncio.run(scenario())


def scrape(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, name: str, absent: float | None = None) -> float:
    """A sample's value; ``absent`` for a labelled series not counted yet (else it must be there)."""
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    if not values and absent is not None:
        return absent
    (value,) = values
    return value


def test_a_relay_says_what_it_carries_and_is_not_ready_without_the_controller(tmp_path: Path) -> None:
    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        metrics_port, spool, stop = free_port(), Spool(tmp_path / "spool.db"), asyncio.Event()
        async with Relay(controller.port, metrics_port=metrics_port, controller_wait_s=1.0) as relay:
            link = link_for(spool, relay.port)
            running = asyncio.create_task(link.run(stop))
            await wait_until(lambda: connected(controller), what="connected through the relay")
            status, text = await asyncio.to_thread(scrape, metrics_port, "/metrics")
            assert status == 200 and sample(text, "vigil_relay_agents") == 1
            assert sample(text, "vigil_relay_uplink_up") == 1
            assert sample(text, 'vigil_relay_messages_total{direction="up"}') >= 1
            ticks = "vigil_relay_event_loop_lag_seconds_count"  # its event loop's ticks, observed
            await wait_until(lambda: sample(scrape(metrics_port, "/metrics")[1], ticks) >= 1, what="a tick observed")
            assert await asyncio.to_thread(scrape, metrics_port, "/readyz") == (200, "ok\n")
            # The controller told the relay its lanes: a signal that may act goes first, one that records only does not.
            assert sample(text, "vigil_relay_sent_first_total") == 0
            spool.append([xid(63)])
            link.notify()
            await wait_until(lambda: spool.acked_seq == 1, what="the XID 63 acknowledged")
            spool.append([xid(79)])
            link.notify()
            await wait_until(lambda: spool.acked_seq == 2, what="the XID 79 acknowledged")
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, "vigil_relay_sent_first_total") == 1
            await stop_controller(controller)
            await wait_until(lambda: not link.connected, what="the agent's stream ended")
            status, why = await asyncio.to_thread(scrape, metrics_port, "/readyz")
            assert status == 503 and f"not connected to the controller at 127.0.0.1:{controller.port}" in why
            text = (await asyncio.to_thread(scrape, metrics_port, "/metrics"))[1]
            assert sample(text, "vigil_relay_uplink_up") == 0 and sample(text, "vigil_relay_agents") == 0
            assert sample(text, "vigil_relay_uplink_losses_total") == 1
            refused = 'vigil_relay_agents_refused_total{why="no_controller"}'
            await wait_until(
                lambda: sample(scrape(metrics_port, "/metrics")[1], refused, absent=0) >= 1,
                timeout=20,
                what="the agent's retry refused by the relay",
            )
            stop.set()
            await running

    asyncio.run(scenario())


def test_a_broken_streams_sender_takes_nothing_the_next_stream_must_send() -> None:
    """gRPC may keep waiting on the sender of a relay stream that broke; woken by what is queued for
    the next stream, it must end without it (it took a new agent's Hello to nowhere: seen as
    'the first message must be Hello' from the controller after a restart)."""

    async def scenario() -> None:
        uplink = Uplink("127.0.0.1:1", None)
        uplink._generation = 1
        old = uplink._sending(1)
        waiting = asyncio.ensure_future(anext(old))
        await asyncio.sleep(0)
        uplink._generation = 2  # the stream broke and another opened
        new = uplink._sending(2)
        stream, _ = uplink.open()
        uplink.send(stream, b"hello")
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 1)
        sent = await asyncio.wait_for(anext(new), 1)
        assert [(i.stream, i.message) for i in sent.items] == [(stream, b"hello")]

    asyncio.run(scenario())


def test_a_broken_streams_sender_leaves_the_next_streams_linger_and_count_be() -> None:
    """The same sender of a stream past, woken by the next stream's first record-only message just
    after that stream's sender began to linger on it: it waits for more too and, its own wait ended
    by the other's timer, the next stream's sender waited for good (a relay that carried Hellos and
    nothing more after a failover, seen in CI). And one that gRPC held at its last batch when the
    stream broke takes that batch off the next stream's count of what waits."""
    beat = agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(sent_at=1.0)).SerializeToString()
    lanes = relay_pb2.RelayDown(lanes=lanes_message(Policy().record_only()))

    async def scenario() -> None:
        uplink = Uplink("127.0.0.1:1", None, linger_ms=50)
        uplink._generation = 1
        uplink._deliver(lanes)
        old = uplink._sending(1)
        old_waiting = asyncio.ensure_future(anext(old))
        await asyncio.sleep(0)  # it waits for something to send
        uplink._break("the controller went away")
        uplink._generation += 1  # the next stream opens, and its controller says its lanes
        uplink._deliver(lanes)
        new = uplink._sending(uplink._generation)
        new_waiting = asyncio.ensure_future(anext(new))  # runs first: it finds the beat and lingers on it
        stream, _ = uplink.open()
        uplink.send(stream, beat)
        sent = await asyncio.wait_for(new_waiting, 2)
        assert [(i.stream, i.message) for i in sent.items] == [(stream, beat)]
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(old_waiting, 1)

        uplink.send(stream, beat)  # the next batch, which gRPC takes and holds as the stream breaks
        assert len((await asyncio.wait_for(anext(new), 2)).items) == 1
        uplink._break("the controller went away again")
        uplink._generation += 1
        uplink._deliver(lanes)
        again, _ = uplink.open()
        uplink.send(again, signals_message(63))
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(new), 1)
        assert uplink._queued_bytes == len(signals_message(63))  # the next stream's, nothing taken off

    asyncio.run(scenario())


def test_a_relay_given_every_replica_finds_the_one_that_serves_and_follows_a_failover(tmp_path: Path) -> None:
    """As agents list every replica (only the leader serves), a relay does: it carries its agents to
    whichever answers, and to the other when that one goes and the other starts serving."""

    async def scenario() -> None:
        first_port, second_port = free_port(), free_port()
        controller = await start_controller(tmp_path / "a.db", second_port)  # the second listed leads
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        async with Relay(f"127.0.0.1:{first_port},127.0.0.1:{second_port}") as relay:
            link = link_for(spool, relay.port)
            running = asyncio.create_task(link.run(stop))
            spool.append([xid(45)])
            link.notify()
            await wait_until(lambda: spool.acked_seq == 1, what="acknowledged through the serving replica")
            await stop_controller(controller)
            controller = await start_controller(tmp_path / "a.db", first_port)  # the other replica now leads
            spool.append([xid(45)])
            link.notify()
            await wait_until(lambda: spool.acked_seq == 2, timeout=30, what="acknowledged by the new leader")
            assert connected(controller) and signals_received(controller) == 1
            stop.set()
            await running
        await stop_controller(controller)

    asyncio.run(scenario())


def test_a_stream_the_relay_cannot_read_on_is_ended_for_its_agent_not_left_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while passing on one agent's message (a bug, here injected) ends that agent's call
    (INTERNAL: it reconnects and sends again what was not acknowledged); before, the call stayed
    open with nothing more read from it, the agent never told."""
    send = Uplink.send

    def failing_on_poison(self: Uplink, stream: int, message: bytes, peer: str = "", token: str = "") -> None:
        if b"poison" in message:
            raise RuntimeError("a bug in passing this message on")
        send(self, stream, message, peer, token)

    monkeypatch.setattr(Uplink, "send", failing_on_poison)

    async def test(controller: Controller, tmp_path: Path) -> None:
        async with Relay(controller.port) as relay, grpc.aio.insecure_channel(f"127.0.0.1:{relay.port}") as channel:
            stub = agent_pb2_grpc.AgentGatewayStub(channel)
            calls = {n: stub.Connect() for n in ("node-1", "node-2")}
            for node, call in calls.items():
                await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(node=node, spool_id="s")))
                assert (await asyncio.wait_for(call.read(), 10)).HasField("ack")
            await calls["node-1"].write(
                agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(unparsed_lines=["poison"]))
            )
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await asyncio.wait_for(calls["node-1"].read(), 10)
            assert ended.value.code() is grpc.StatusCode.INTERNAL
            await wait_until(
                lambda: not connected(controller, "node-1"), what="node-1's stream ended at the controller"
            )
            fleet = controller.nodes.fleet
            before = fleet.entry("node-2").last_heartbeat
            await asyncio.sleep(0.01)
            await calls["node-2"].write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
            await wait_until(lambda: fleet.entry("node-2").last_heartbeat > before, what="node-2 still carried")
            calls["node-2"].cancel()

    run(test, tmp_path)


def test_a_relay_without_its_controller_tries_again_at_least_every_retry_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """However long the controllers are away (a failover's Lease running out), a relay's pause between
    two rounds of tries stays under half a second (``RETRY_CAP_S``): a new leader is reached soon after
    it serves, and every agent the relay holds with it."""
    import controller.relay.uplink as uplink_module

    pauses: list[float] = []
    stop = asyncio.Event()

    async def pause(event: asyncio.Event, timeout_s: float) -> bool:  # the rounds' pauses, taken at once
        pauses.append(timeout_s)
        if len(pauses) >= 40:
            stop.set()
        await asyncio.sleep(0)
        return event.is_set()

    monkeypatch.setattr(uplink_module, "wait_event", pause)

    async def scenario() -> None:
        closed = [free_port(), free_port()]  # two replicas, neither serving
        uplink = uplink_module.Uplink(",".join(f"127.0.0.1:{p}" for p in closed), None)
        await asyncio.wait_for(uplink.run(stop), 60)

    asyncio.run(scenario())
    rounds = pauses[1::2]  # after each round of both addresses (the next replica's try comes at once)
    assert len(rounds) >= 15 and max(rounds) <= 0.5
    assert max(pauses[0::2]) <= 0.05


def test_a_relays_shared_wait_that_fails_is_said_and_counted() -> None:
    async def scenario() -> None:
        uplink = Uplink("127.0.0.1:1", None)
        streams = AgentStreams(uplink, RelaySettings("127.0.0.1:1", "127.0.0.1:0", None), loop_lag.Lateness())
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("a bug"))
        with capture_logs() as logs:
            streams._shared_wait_ended(failed)
        assert [e["task"] for e in logs if e["event"] == "relay_task_failed"] == ["shared-wait"]
        text = generate_latest(uplink.metrics.registry).decode()
        assert sample(text, 'vigil_relay_task_failures_total{task="shared-wait"}') == 1

    asyncio.run(scenario())
