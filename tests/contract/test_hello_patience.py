"""An agent's wait for the answer to its Hello: a controller that answers late (loaded, its event
loop behind) is given longer each time rather than left for a new connection every time, which
would add to its load; and the agent's own lateness (its node's CPUs busy) is not counted against
the controller. Real gRPC on loopback, a real controller whose Hellos' durable writes the test holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from agent.link import ControllerLink, hello_patience_s
from agent.spool import Spool
from controller.daemon import Controller
from protos.vigil.v1 import agent_pb2
from tests.contract.test_agent_link import hold_hello_writes, no_check
from tests.helpers import start_controller, stop_controller, wait_until
from vigil_core.loop_lag import Lateness, loop_time

NODE = "node-a"
FIRST_S = 0.25  # the agent's first wait for an answer, in these tests


def link_for(spool: Spool, port: int, clock: Callable[[], float] = loop_time) -> ControllerLink:
    def hello() -> agent_pb2.Hello:
        return agent_pb2.Hello(node=NODE, spool_id=spool.spool_id, last_acked_seq=spool.acked_seq)

    return ControllerLink(
        f"127.0.0.1:{port}", spool, hello, no_check, heartbeat_s=0.2, clock=clock, hello_patience_first_s=FIRST_S
    )


def answer_hellos_after(controller: Controller, seconds: float) -> None:
    """From now on every Hello's durable write takes ``seconds`` longer: the controller answers late."""
    durable = controller.engine.durable

    async def late() -> None:
        await asyncio.sleep(seconds)
        await durable()

    controller.engine.durable = late  # type: ignore[method-assign]


def test_the_wait_doubles_after_each_unanswered_hello_up_to_a_bound_and_starts_afresh() -> None:
    assert [hello_patience_s(n, 10.0) for n in range(7)] == [10, 20, 40, 80, 160, 160, 160]
    assert hello_patience_s(-1, 10.0) == 10.0


def test_a_controller_answering_late_is_given_longer_until_the_agent_is_taken(tmp_path: Path) -> None:
    """Every Hello answered 0.6 s late, the agent's first wait 0.25 s: it waits 0.25 s, then 0.5 s,
    then 1 s, and is taken on its third stream. The same wait each time, it reconnected for ever."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")
        answer_hellos_after(controller, 0.6)
        spool = Spool(tmp_path / "spool.db")
        link, stop = link_for(spool, controller.port), asyncio.Event()
        running = asyncio.create_task(link.run(stop))
        try:
            await wait_until(lambda: link.connected, timeout=15, what="the agent taken by a late controller")
            assert link.streams == 3 and link.connections == 1
            assert link.unanswered == 0  # answered: the next Hello is given the first wait again
        finally:
            stop.set()
            await running
            spool.close()
            await stop_controller(controller)

    asyncio.run(scenario())


def test_the_agents_own_held_loop_does_not_count_against_the_controller(tmp_path: Path) -> None:
    """The agent's loop held three times its wait while the controller writes its Hello (the node's
    CPUs busy): the answer, sent once the loop runs again, is taken on the same stream. On the
    loop's plain clock the wait was found over before the answer was read, and the agent reconnected."""

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db")  # on this loop too: held with it
        written, release = hold_hello_writes(controller)
        lateness = Lateness()
        watching = asyncio.create_task(lateness.watch())
        spool = Spool(tmp_path / "spool.db")
        link, stop = link_for(spool, controller.port, lateness.own_time), asyncio.Event()
        running = asyncio.create_task(link.run(stop))
        try:
            await asyncio.wait_for(written.wait(), 10)  # the Hello said; its answer waits on the write
            time.sleep(3 * FIRST_S)  # noqa: ASYNC251 (the point: nothing on this loop runs meanwhile)
            release.set()
            await wait_until(lambda: link.connected, timeout=10, what="the agent taken")
            assert link.streams == 1 and link.unanswered == 0
        finally:
            release.set()
            stop.set()
            await running
            watching.cancel()
            spool.close()
            await stop_controller(controller)

    asyncio.run(scenario())
