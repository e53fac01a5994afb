"""A fleet found silent at once is said in a few lines, not one per node (``vigil_core.log_tally``):
a real controller whose 30 agents went away together marks every node UNKNOWN, says 20 of them on
lines of their own and the rest of that second on one line with their count, once the second is over."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from controller.vocab.node_state import Health
from tests.contract.test_relay import RawAgent
from tests.helpers import start_controller, stop_controller, wait_until

NODES = [f"node-{i:02d}" for i in range(30)]
TIMEOUT_S = 0.5  # the policy's heartbeat_timeout_s


def test_thirty_nodes_silent_at_once_are_twenty_lines_and_one_for_the_rest(tmp_path: Path) -> None:
    (policy := tmp_path / "policy.yaml").write_text(f"heartbeat_timeout_s: {TIMEOUT_S}\n")

    async def scenario() -> None:
        controller = await start_controller(tmp_path / "ctl.db", policy=policy)
        fleet = controller.nodes.fleet
        try:
            agents = [RawAgent(controller.port) for _ in NODES]
            for agent, node in zip(agents, NODES, strict=True):
                await agent.hello(node)
                assert (await agent.read()).HasField("ack")
            for agent in agents:
                await agent.close()
            await wait_until(lambda: not any(fleet.entry(n).connected for n in NODES), what="all gone")
            await asyncio.sleep(TIMEOUT_S + 0.2)  # every node past its deadline: one look finds them all
            with capture_logs() as logs:
                assert sorted(controller.nodes.upkeep.check_silence(limit=None)) == NODES
                await asyncio.sleep(1.2)  # the second is over: its remainder said
            assert all(fleet.entry(n).state.health is Health.UNKNOWN for n in NODES)
            own = [e["node"] for e in logs if e["event"] == "node_unknown"]
            (rest,) = [e for e in logs if e["event"] == "node_unknown_more"]
            assert len(own) == 20 and rest["count"] == 10 and len(rest["nodes"]) == 5
            assert not set(own) & set(rest["nodes"]) and set(own) | set(rest["nodes"]) <= set(NODES)
        finally:
            await stop_controller(controller)

    asyncio.run(scenario())
