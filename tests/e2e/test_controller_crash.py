"""A controller killed with SIGKILL and restarted neither forgets an incident nor acts twice."""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import pytest

from controller.act.local_actuator import LocalActuator, LocalQuarantines
from controller.compose import node_route
from controller.store import Store
from controller.vocab.actions import Page, PageUpdate, Quarantine
from controller.vocab.policy import Policy
from gpus.simulated import simulated_gpus
from tests.e2e.processes import start_agent, start_controller
from tests.helpers import poll_until
from vigil.admin_client import AdminClient
from vigil.demo import xid_line
from vigil_core.signals import Signal, SignalKind

pytestmark = pytest.mark.e2e


def test_sigkill_after_acting_then_restart_repeats_nothing(tmp_path: Path) -> None:
    ctl, port = start_controller(tmp_path, 1)
    agent, kmsg = start_agent(tmp_path, "node-a", f"127.0.0.1:{port}", spool=tmp_path / "spool.db")
    try:
        admin = AdminClient(f"127.0.0.1:{port}")
        poll_until(lambda: any(n.node == "node-a" for n in admin.status().nodes), what="agent registered")
        gpu = simulated_gpus("node-a", 8)[2]
        with open(kmsg, "a") as f:
            f.write(xid_line(gpu.pci_bus_id, 79, "GPU has fallen off the bus.", 1))

        def acted() -> bool:
            return any(
                {a.status for a in i.actions} == {"DONE"} and len(i.actions) == 3
                for i in admin.incidents(node="node-a")
            )

        poll_until(acted, what="quarantine and page done")
        ctl.send_signal(signal.SIGKILL)
        ctl.wait()
        admin.close()

        ctl, port2 = start_controller(tmp_path, 2, port)
        assert port2 == port
        admin = AdminClient(f"127.0.0.1:{port}")
        poll_until(lambda: admin.status().nodes and admin.status().nodes[0].last_seq == 1, what="agent back")
        # A heartbeat or two after the agent reconnects, nothing may have been repeated.
        poll_until(lambda: "agent_connected" in (tmp_path / "controller2.log").read_text(), what="reconnect")
        with open(kmsg, "a") as f:  # a later, unrelated line proves the pipeline is live again
            f.write(xid_line(gpu.pci_bus_id, 45, "Preemptive cleanup, due to previous errors.", 2))
        poll_until(lambda: len(admin.incidents(node="node-a")) == 2, what="the second signal recorded")
        incidents = admin.incidents(node="node-a")
        (xid79,) = [i for i in incidents if i.code == 79]
        assert sorted((a.kind, a.status) for a in xid79.actions) == [
            ("NOTE:QUARANTINED", "DONE"),
            ("PAGE:quarantine", "DONE"),
            ("QUARANTINE", "DONE"),
        ]
        assert {n.node: n.health for n in admin.status().nodes} == {"node-a": "QUARANTINED"}
        pages = (tmp_path / "controller1.out").read_text() + (tmp_path / "controller2.out").read_text()
        assert pages.count("PAGE [QUARANTINE]") == 1
        admin.close()
    finally:
        for proc in (agent, ctl):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


class BlockingActuator:
    """Hangs in every call, like a process killed half-way through its actions."""

    quarantine_means = "nothing: this process is gone"

    def __init__(self) -> None:
        self.release = threading.Event()

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {}

    def close(self) -> None:
        pass

    def quarantine(self, action: Quarantine) -> str:
        self.release.wait(10)
        raise RuntimeError("this process is gone")

    def page(self, action: Page) -> str:
        self.release.wait(10)
        raise RuntimeError("this process is gone")


class CountingPager:
    def __init__(self) -> None:
        self.pages: list[str] = []

    def page(self, action: Page) -> str:
        self.pages.append(action.incident_id)
        return "counted"

    def update(self, action: PageUpdate) -> str:
        return "noted"

    def resync(self) -> int:
        return 0


def test_actions_pending_at_a_crash_run_once_after_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "ctl.db"
        dead = BlockingActuator()
        first = node_route(Store(db), Policy(), dead, dead).engine
        first.hello("node-a", "spool1", 8)
        first.receive("node-a", [Signal("node-a", SignalKind.XID, code=79, observed_at=1.0, seq=1)])
        await asyncio.sleep(0.05)  # both actions are under way, neither is recorded as done

        store = Store(db)  # the restarted controller, on the same database
        pager = CountingPager()
        second = node_route(store, Policy(), LocalActuator(store.db), pager).engine
        assert second.fleet.nodes["node-a"].state.health.value == "UNHEALTHY"
        assert second.resume_pending() == 2
        await second.wait_for_actions()
        second.receive("node-a", [Signal("node-a", SignalKind.XID, code=79, observed_at=1.0, seq=1)])  # replay
        await second.wait_for_actions()
        assert pager.pages == ["node-a-spool1-1"]
        assert LocalQuarantines(store.db).nodes() == {"node-a": "node-a-spool1-1"}
        assert second.fleet.nodes["node-a"].state.health.value == "QUARANTINED"
        assert second.resume_pending() == 0
        await first.shutdown()
        dead.release.set()

    asyncio.run(scenario())
