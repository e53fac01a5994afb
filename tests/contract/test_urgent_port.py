"""The urgent port (``vigil_core.urgent_port``), over real gRPC on loopback: an agent with faults
waiting dials it and is taken there while the main port makes its calls wait; the controller's and a
relay's take only such agents on it; an agent whose urgent port is not reached goes to the main port
at once; an agent with nothing waiting never dials it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from structlog.testing import capture_logs

from agent.link import ControllerLink
from agent.spool import Spool
from controller.daemon import Controller
from controller.vocab.node_state import Health
from protos.vigil.v1 import agent_pb2
from tests.contract.test_agent_link import xid
from tests.contract.test_call_taken import Gateway, SlowToTake
from tests.contract.test_relay import NODE, RawAgent, Relay, answer_ok, connected, run
from tests.contract.test_relay_hello_room import metric
from tests.helpers import free_port, wait_until
from vigil_core.urgent_port import REFUSED

SLOW_TO_TAKE_S = 60.0  # the main port, as a fleet connecting at once leaves it: far past the test's wait


def link_to(spool: Spool, port: int, urgent_port: int | None) -> ControllerLink:
    def hello() -> agent_pb2.Hello:
        return agent_pb2.Hello(node=NODE, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq)

    urgent = f"127.0.0.1:{urgent_port}" if urgent_port is not None else None
    return ControllerLink(f"127.0.0.1:{port}", spool, hello, answer_ok, heartbeat_s=0.2, urgent_target=urgent)


@dataclass
class Ports:
    """A main port whose calls wait ``SLOW_TO_TAKE_S`` to be taken (as a fleet connecting at once leaves
    it) and an urgent port that takes them at once, each a gateway that answers every Hello."""

    main: Gateway
    urgent: Gateway
    main_port: int
    urgent_port: int


@contextlib.asynccontextmanager
async def slow_main_quick_urgent() -> AsyncIterator[Ports]:
    main, urgent = Gateway(), Gateway()
    slow = grpc.aio.server(interceptors=(SlowToTake(),))
    slow.add_generic_rpc_handlers((main.handler(),))
    main_port = slow.add_insecure_port("127.0.0.1:0")
    quick = grpc.aio.server()
    quick.add_generic_rpc_handlers((urgent.handler(),))
    urgent_port = quick.add_insecure_port("127.0.0.1:0")
    await slow.start()
    await quick.start()
    try:
        yield Ports(main, urgent, main_port, urgent_port)
    finally:
        await slow.stop(None)
        await quick.stop(None)


def run_slow_to_take(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``scenario`` run with ``SlowToTake`` holding each call ``SLOW_TO_TAKE_S``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tests.contract.test_call_taken.TAKES_S", SLOW_TO_TAKE_S)
        asyncio.run(scenario())


def quarantined(controller: Controller) -> bool:
    return controller.nodes.fleet.entry(NODE).state.health is Health.QUARANTINED


def urgent_calls(controller: Controller, outcome: str) -> float:
    return controller.engine.metrics.urgent_port_calls.labels(outcome)._value.get()


async def a_fault_by_the_urgent_port(controller: Controller, tmp_path: Path, port: int, urgent_port: int) -> Spool:
    """An agent with an XID 79 in its spool, given ``urgent_port`` beside ``port``: its fault goes by
    the urgent port, is acknowledged and quarantines the node; its spool, once the agent stopped."""
    spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
    spool.append([xid(79)])
    link = link_to(spool, port, urgent_port)
    running = asyncio.create_task(link.run(stop))
    try:
        await wait_until(lambda: spool.urgent_waiting() == 0, what="the fault acknowledged")
        assert link.urgent_sessions == 1
        await wait_until(lambda: quarantined(controller), what="the node quarantined")
    finally:
        stop.set()
        await running
    return spool


def test_an_agent_with_a_fault_waiting_is_taken_on_the_urgent_port_while_the_main_port_makes_calls_wait(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with slow_main_quick_urgent() as ports:
            spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
            spool.append([xid(79)])
            link = link_to(spool, ports.main_port, ports.urgent_port)
            running = asyncio.create_task(link.run(stop))
            try:
                await wait_until(lambda: link.connected, timeout=20, what="the link acknowledged on the urgent port")
                assert (ports.urgent.streams, ports.main.streams, link.urgent_sessions) == (1, 0, 1)
            finally:
                stop.set()
                await running

    run_slow_to_take(scenario)


def test_an_agent_that_comes_to_have_a_fault_while_the_main_port_makes_its_call_wait_leaves_for_the_urgent_port(
    tmp_path: Path,
) -> None:
    """The agent dialled the main port with nothing waiting; its call waits there to be taken (a fleet
    connecting at once) when a fault comes into its spool: it gives that call up and is taken on the
    urgent port at once, not after the calls queued before it."""

    async def scenario() -> None:
        async with slow_main_quick_urgent() as ports:
            spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
            link = link_to(spool, ports.main_port, ports.urgent_port)
            running = asyncio.create_task(link.run(stop))
            try:
                await wait_until(lambda: link.streams == 1, what="the main port dialled")
                await asyncio.sleep(0.3)
                assert not link.connected and ports.urgent.streams == 0
                spool.append([xid(79)])
                link.notify()  # as the agent's collector does once a signal is spooled
                await wait_until(lambda: link.connected, timeout=5, what="the link acknowledged on the urgent port")
                said = (ports.urgent.streams, ports.main.streams, link.urgent_sessions, link.left_for_urgent)
                assert said == (1, 0, 1, 1)
            finally:
                stop.set()
                await running

    run_slow_to_take(scenario)


def test_the_controller_takes_a_fault_on_its_urgent_port_and_an_agent_with_nothing_waiting_on_its_main_port(
    tmp_path: Path,
) -> None:
    urgent_port = free_port()

    async def test(controller: Controller, tmp_path: Path) -> None:
        spool = await a_fault_by_the_urgent_port(controller, tmp_path, controller.port, urgent_port)
        assert urgent_calls(controller, "taken") == 1
        # The same agent, its spool acknowledged: the main port.
        await wait_until(lambda: not connected(controller), what="the first session over")
        stop = asyncio.Event()
        again = link_to(spool, controller.port, urgent_port)
        running = asyncio.create_task(again.run(stop))
        try:
            await wait_until(lambda: again.connected, what="the agent back with nothing waiting")
            assert again.urgent_sessions == 0 and urgent_calls(controller, "taken") == 1
        finally:
            stop.set()
            await running

    run(test, tmp_path, urgent_port=urgent_port)


@pytest.mark.parametrize("through_relay", [False, True], ids=["controller", "relay"])
def test_the_urgent_port_refuses_a_hello_with_no_fault_waiting_and_takes_one_with(
    tmp_path: Path, through_relay: bool
) -> None:
    urgent_port = free_port()

    async def test(controller: Controller, tmp_path: Path) -> None:
        async def first_answers(port: int) -> tuple[grpc.aio.AioRpcError | None, agent_pb2.ControllerMessage]:
            refused: grpc.aio.AioRpcError | None = None
            plain = RawAgent(port)
            await plain.hello(node="node-b")
            try:
                await plain.read()
            except grpc.aio.AioRpcError as exc:
                refused = exc
            await plain.close()
            urgent = RawAgent(port)
            await urgent.hello(urgent=2)
            answer = await urgent.read()
            await urgent.close()
            return refused, answer

        if through_relay:
            relay_urgent = free_port()
            metrics_port = free_port()
            async with Relay(controller.port, urgent_listen=f"127.0.0.1:{relay_urgent}", metrics_port=metrics_port):
                refused, answer = await first_answers(relay_urgent)
                assert metric(metrics_port, 'vigil_relay_agents_refused_total{why="not_urgent"}') == 1
        else:
            refused, answer = await first_answers(urgent_port)
            assert (urgent_calls(controller, "refused"), urgent_calls(controller, "taken")) == (1, 1)
        assert refused is not None and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.details() == REFUSED
        assert answer.HasField("ack")
        assert "node-b" not in controller.nodes.fleet.nodes  # refused before it was admitted

    run(test, tmp_path, urgent_port=urgent_port)


def test_an_agent_whose_urgent_port_is_not_reached_goes_to_the_main_port_at_once(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there

    async def test(controller: Controller, tmp_path: Path) -> None:
        spool, stop = Spool(tmp_path / "spool.db"), asyncio.Event()
        spool.append([xid(79)])
        link = link_to(spool, controller.port, closed)
        with capture_logs() as logs:
            running = asyncio.create_task(link.run(stop))
            try:
                await wait_until(lambda: spool.urgent_waiting() == 0, what="the fault acknowledged")
            finally:
                stop.set()
                await running
        said = [e for e in logs if e["event"] == "controller_link_urgent_port_closed"]
        assert [e["urgent_port"] for e in said] == [f"127.0.0.1:{closed}"]
        assert (link.urgent_sessions, link.connections) == (0, 1)

    run(test, tmp_path)


def test_through_a_relay_a_fault_goes_by_its_urgent_port_and_is_acknowledged_once_recorded(tmp_path: Path) -> None:
    async def test(controller: Controller, tmp_path: Path) -> None:
        relay_urgent = free_port()
        async with Relay(controller.port, urgent_listen=f"127.0.0.1:{relay_urgent}") as relay:
            await a_fault_by_the_urgent_port(controller, tmp_path, relay.port, relay_urgent)

    run(test, tmp_path)
