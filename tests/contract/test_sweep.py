"""Sweeps over real gRPC: a real controller, a fleet of simulated agents answering RunCheck.

The checks' answers are scripted (``tests.fakes.sim_checks``); what is under test is the
controller's side: fan-out, deadlines, fleet judgement, pairing rounds, culprit isolation, the
incident store and the guarded quarantine path. Real all-reduce between processes and a real slow
link, leaf or uplink are in ``tests/e2e/test_sweep_fabric_netns.py`` and the fabric scenario.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.act.local_actuator import LocalQuarantines
from controller.config import ControllerConfig
from controller.daemon import Controller
from controller.nodes.guards.rules import GuardrailConfig
from controller.sweeps.spec import SweepConfig
from protos.vigil.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from tests.fakes.fleet import Fleet
from tests.fakes.kube_api import KubeApiServer
from tests.fakes.sim_checks import SimulatedChecks
from tests.helpers import stop_controller, wait_until


@dataclass
class Cluster:
    controller: Controller
    fleet: Fleet
    checks: SimulatedChecks
    admin: admin_pb2_grpc.AdminStub

    async def sweep(self, **request: Any) -> tuple[list[admin_pb2.SweepUpdate], admin_pb2.SweepSummary]:
        updates = [u async for u in self.admin.Sweep(admin_pb2.SweepRequest(**request))]
        assert updates[-1].phase == "done" and updates[-1].HasField("summary")
        return updates[:-1], updates[-1].summary


@asynccontextmanager
async def cluster(tmp_path: Path, nodes: int, checks: SimulatedChecks, **config: Any) -> AsyncIterator[Cluster]:
    cfg = ControllerConfig(
        listen="127.0.0.1", port=0, database=tmp_path / "ctl.db", pager="none", plaintext=True, **config
    )
    controller = Controller(cfg)
    await controller.start()
    fleet = Fleet(f"127.0.0.1:{controller.port}", [f"node-{i}" for i in range(nodes)], checks=checks)
    await fleet.start(timeout_s=20)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.port}") as channel:
            yield Cluster(controller, fleet, checks, admin_pb2_grpc.AdminStub(channel))
    finally:
        await fleet.close()
        await controller.sweeper.stop()
        await stop_controller(controller)


def run(
    tmp_path: Path, nodes: int, checks: SimulatedChecks, test: Callable[[Cluster], Awaitable[None]], **cfg: Any
) -> None:
    async def scenario() -> None:
        async with cluster(tmp_path, nodes, checks, **cfg) as c:
            await test(c)

    asyncio.run(scenario())


def rows(summary: admin_pb2.SweepSummary, check: str) -> dict[str, admin_pb2.SweepRow]:
    return {r.node: r for r in summary.rows if r.check == check}


def verdicts(summary: admin_pb2.SweepSummary, check: str) -> dict[str, str]:
    return {n: common_pb2.Verdict.Name(r.verdict) for n, r in rows(summary, check).items()}


def test_the_slow_node_is_named_not_its_partner_and_everything_is_filed(tmp_path: Path) -> None:
    sim = SimulatedChecks(link_gbps={"node-5": 4.0})

    async def test(c: Cluster) -> None:
        updates, summary = await c.sweep(checks=["gpu_health", "pairs"], requested_by="sre")
        assert [f.node for f in summary.findings] == ["node-5"]
        assert "slow with known-good" in summary.findings[0].reason
        assert "slow again when run once more" in summary.findings[0].reason
        pairs = verdicts(summary, "pairs")
        assert pairs["node-5"] == "FAIL" and pairs["node-4"] == "OK"  # node-4 was node-5's partner
        assert "node-5 is to blame" in rows(summary, "pairs")["node-4"].reason
        assert set(pairs.values()) == {"OK", "FAIL"} and list(pairs.values()).count("FAIL") == 1
        # 8 nodes: 4 pairs, then 2 re-pairs, then node-5's re-test once more (its blame confirmed)
        assert summary.rounds == 3 and summary.pairs == 4 + 2 + 1
        assert common_pb2.Verdict.Name(summary.verdict) == "FAIL" and summary.failed_nodes == 1
        assert set(verdicts(summary, "gpu_health").values()) == {"OK"}
        # Progress: one update per check and per pair, counting up to a total that grew.
        assert [u.done for u in updates] == list(range(1, len(updates) + 1))
        assert updates[-1].total == 8 + 4 + 2 + 1
        assert {u.phase for u in updates} == {"checks", "pairs", "isolation", "once more"}
        # Rank 0 of a round's k-th pair listens on base + k, at the address its agent gave.
        masters = sorted({r.params["master"] for _, r in c.checks.requests if "master" in r.params})
        assert "node-0.sim:26000" in masters and "node-2.sim:26001" in masters
        # Filed: the summary and every check's result, under the sweep's id.
        stored = json.loads(c.controller.store.records.sweep_summary(summary.sweep_id) or "{}")
        assert stored["findings"][0]["node"] == "node-5" and stored["rounds"] == 3
        ((filed,),) = c.controller.store.read(
            "SELECT count(*) FROM check_results WHERE request_id LIKE ?", (f"{summary.sweep_id}/%",)
        )
        assert filed == 8 + 2 * (4 + 2 + 1)  # gpu_health per node, both members of every pair
        assert LocalQuarantines(c.controller.store.db).nodes() == {}  # no --quarantine: nothing done to nodes

    run(tmp_path, 8, sim, test)


def test_a_crashed_hung_or_missing_check_is_unknown_and_the_others_finish(tmp_path: Path) -> None:
    sim = SimulatedChecks(
        script={("node-1", "matmul"): "crash", ("node-2", "matmul"): "hang", ("node-3", "membw"): "misnamed"}
    )
    fast = SweepConfig(deadline_s={"matmul": 0.5}, answer_grace_s=0.5)

    async def test(c: Cluster) -> None:
        nodes = ["node-0", "node-1", "node-2", "node-3", "ghost"]
        _, summary = await c.sweep(nodes=nodes, checks=["matmul", "membw", "pairs"])
        matmul = rows(summary, "matmul")
        assert common_pb2.Verdict.Name(matmul["node-1"].verdict) == "UNKNOWN" and "crashed" in matmul["node-1"].reason
        assert common_pb2.Verdict.Name(matmul["node-2"].verdict) == "UNKNOWN"
        assert "no answer from the node's agent within 1 s" in matmul["node-2"].reason
        assert "not connected" in matmul["ghost"].reason
        assert verdicts(summary, "membw") == {
            "node-0": "OK",
            "node-1": "OK",
            "node-2": "OK",
            "node-3": "OK",
            "ghost": "UNKNOWN",
        }  # node-2's next check still ran after its matmul hung
        assert verdicts(summary, "pairs")["ghost"] == "UNKNOWN"
        assert {verdicts(summary, "pairs")[n] for n in nodes[:4]} == {"OK"}
        assert common_pb2.Verdict.Name(summary.verdict) == "UNKNOWN" and summary.unknown_nodes == 3

    run(tmp_path, 4, sim, test, sweep=fast)


def test_an_agent_that_goes_away_mid_check_is_unknown_at_once(tmp_path: Path) -> None:
    sim = SimulatedChecks(script={("node-1", "matmul"): "hang"})

    async def test(c: Cluster) -> None:
        sweep = asyncio.ensure_future(c.sweep(checks=["matmul"]))
        await wait_until(lambda: any(n == "node-1" for n, _ in c.checks.requests), what="node-1 asked")
        c.fleet.disconnect("node-1")
        _, summary = await asyncio.wait_for(sweep, 10)  # the deadline is 180 s: nobody waits for it
        lost = rows(summary, "matmul")["node-1"]
        assert common_pb2.Verdict.Name(lost.verdict) == "UNKNOWN" and "disconnected while the check ran" in lost.reason
        assert verdicts(summary, "matmul")["node-0"] == "OK"

    run(tmp_path, 3, sim, test)


def test_a_node_far_below_the_fleet_fails_though_its_own_gpus_agree(tmp_path: Path) -> None:
    sim = SimulatedChecks(script={("node-3", "matmul"): "slow"})

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["matmul"])
        matmul = rows(summary, "matmul")
        assert common_pb2.Verdict.Name(matmul["node-3"].verdict) == "FAIL"
        assert "below the fleet median" in matmul["node-3"].reason and "GPU0" in matmul["node-3"].reason
        assert {n: common_pb2.Verdict.Name(r.verdict) for n, r in matmul.items() if n != "node-3"} == dict.fromkeys(
            ["node-0", "node-1", "node-2", "node-4", "node-5"], "OK"
        )
        assert matmul["node-0"].figure.startswith("790 TFLOP/s")

    run(tmp_path, 6, sim, test)


def test_quarantine_goes_through_the_policy_and_the_circuit_breaker(tmp_path: Path) -> None:
    failing = ["node-1", "node-4", "node-6"]
    sim = SimulatedChecks(script={(n, "gpu_health"): "fail" for n in failing})
    guard = GuardrailConfig(breaker_max_nodes=2, breaker_max_fraction=1.0, breaker_page_delay_s=0.01)

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["gpu_health"], quarantine=True)
        assert sorted(summary.quarantine) == failing
        outcomes = sorted(summary.quarantine.values())
        assert [o.split(" (")[0] for o in outcomes] == ["held by the circuit breaker"] + ["quarantine requested"] * 2
        await c.controller.engine.wait_for_actions()
        assert len(LocalQuarantines(c.controller.store.db).nodes()) == 2
        (incident,) = c.controller.store.incidents.list(node="node-1")
        assert incident.kind == "CHECK_FAILED" and "gpu_health: GPU 3 row remap failure" in incident.first_message
        assert incident.id == f"node-1-{summary.sweep_id}"
        assert c.controller.engine.guard.breaker.tripped

    run(tmp_path, 8, sim, test, guardrails=guard)


def test_one_sweep_at_a_time_and_bad_requests_are_named(tmp_path: Path) -> None:
    sim = SimulatedChecks(script={("node-0", "gpu_health"): "hang"})
    slow = SweepConfig(deadline_s={"gpu_health": 2.0}, answer_grace_s=0.5)

    async def test(c: Cluster) -> None:
        first = c.admin.Sweep(admin_pb2.SweepRequest(checks=["gpu_health"]))
        await first.initial_metadata()
        cases = [
            ({"checks": ["gpu_health"]}, grpc.StatusCode.FAILED_PRECONDITION, "one sweep at a time"),
            ({"checks": ["burn"]}, grpc.StatusCode.INVALID_ARGUMENT, "no check named 'burn'"),
            ({"params": {"matmul": "5"}}, grpc.StatusCode.INVALID_ARGUMENT, "expected CHECK.ARG=VALUE"),
            ({"params": {"pairs.master": "x:1"}}, grpc.StatusCode.INVALID_ARGUMENT, "set by the sweep itself"),
            ({"params": {"matmul.size": "1; rm"}}, grpc.StatusCode.INVALID_ARGUMENT, "characters"),
            ({"params": {"matmul.seconds": "abc"}}, grpc.StatusCode.INVALID_ARGUMENT, "invalid float value: 'abc'"),
            ({"selector": "gpu=h100"}, grpc.StatusCode.INVALID_ARGUMENT, "needs the kubernetes actuator"),
            ({"nodes": ["Bad_Name"]}, grpc.StatusCode.INVALID_ARGUMENT, "not a node name"),
        ]
        for request, code, words in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in c.admin.Sweep(admin_pb2.SweepRequest(**request)):
                    pass
            assert err.value.code() == code and words in (err.value.details() or ""), request
        updates = [u async for u in first]
        assert updates[-1].summary.unknown_nodes == 1  # the first sweep finished despite the hang
        _, again = await c.sweep(checks=["gpu_health"], nodes=["node-1"])  # and the next may start
        assert verdicts(again, "gpu_health") == {"node-1": "OK"}

    run(tmp_path, 2, sim, test, sweep=slow)


def test_a_sweep_goes_on_when_its_watcher_leaves(tmp_path: Path) -> None:
    sim = SimulatedChecks(duration_s=0.3, script={("node-2", "gpu_health"): "fail"})

    async def test(c: Cluster) -> None:
        call = c.admin.Sweep(admin_pb2.SweepRequest(checks=["gpu_health"], quarantine=True))
        await call.initial_metadata()
        call.cancel()  # the operator's terminal closed
        await asyncio.sleep(1.0)
        await c.controller.engine.wait_for_actions()
        assert list(LocalQuarantines(c.controller.store.db).nodes()) == ["node-2"]

    run(tmp_path, 4, sim, test)


def test_a_label_selector_picks_the_nodes_through_the_kubernetes_api(tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        for i in range(4):
            kube.add_node(f"node-{i}", labels={"pool": "a" if i % 2 else "b"})
        settings = {"actuator": "kubernetes", "kubernetes": {"kubeconfig": kube.kubeconfig(tmp_path / "kubeconfig")}}

        async def test(c: Cluster) -> None:
            _, summary = await c.sweep(selector="pool=a", checks=["gpu_health"])
            assert verdicts(summary, "gpu_health") == {"node-1": "OK", "node-3": "OK"}
            with pytest.raises(grpc.aio.AioRpcError, match="no nodes to sweep"):
                await c.sweep(selector="pool=c")

        run(tmp_path, 4, SimulatedChecks(), test, **settings)


def test_vigil_sweep_prints_the_table_and_exits_by_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vigil.sweep_view import run_sweep

    sim = SimulatedChecks(script={("node-1", "gpu_health"): "fail"}, link_gbps={"node-6": 1.0})

    async def test(c: Cluster) -> None:
        target = f"127.0.0.1:{c.controller.port}"

        def cli(as_json: bool, show_all: bool = False, **request: Any) -> int:
            return run_sweep(target, admin_pb2.SweepRequest(**request), as_json, show_all)

        assert await asyncio.to_thread(cli, False, checks=["gpu_health"], nodes=["node-0", "node-2"]) == 0
        out = capsys.readouterr().out
        assert "node-0" in out and "8 GPUs" in out and "OK: 2 node(s), 0 failed" in out

        assert await asyncio.to_thread(cli, False, checks=["gpu_health", "pairs"]) == 1
        out = capsys.readouterr().out
        assert "GPU 3 row remap failure" in out and "culprit: node-6" in out and "8 node(s), 2 failed" in out

        assert await asyncio.to_thread(cli, True, checks=["gpu_health"], nodes=["node-0", "ghost"]) == 2
        out = capsys.readouterr().out  # the in-process controller logs to stdout too: the JSON starts at "{"
        summary = json.loads(out[out.index("\n{\n") + 1 :])
        assert summary["verdict"] == "UNKNOWN" and summary["unknown_nodes"] == 1

        assert await asyncio.to_thread(cli, False, checks=["warp_drive"]) == 2
        assert "INVALID_ARGUMENT: no check named 'warp_drive'" in capsys.readouterr().err

    run(tmp_path, 8, sim, test)


def fat_tree(bad: str) -> tuple[dict[str, dict[str, str]], SimulatedChecks]:
    """Twelve nodes under three leaves; ``bad`` is "leaf-b" (the switch: every pair through it
    slow), "uplink-c" (leaf-c's uplink: its pairs across leaves slow, within fine) or "none"."""
    leaf = {f"node-{i}": "abc"[i // 4] for i in range(12)}

    def path_gbps(a: str, b: str) -> float:
        ends = {leaf[a], leaf[b]}
        slow = "b" in ends if bad == "leaf-b" else ("c" in ends and len(ends) == 2 and bad == "uplink-c")
        return 2.0 if slow else 40.0

    labels = {n: {"vigil.dev/leaf-switch": f"leaf-{x}"} for n, x in leaf.items()}
    return labels, SimulatedChecks(path_gbps=path_gbps)


def test_a_slow_leaf_switch_is_named_and_its_nodes_held_not_cordoned(tmp_path: Path) -> None:
    labels, sim = fat_tree("leaf-b")
    behind = [f"node-{i}" for i in range(4, 8)]

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["pairs"], quarantine=True, requested_by="sre")
        assert [(f.kind, f.node, list(f.nodes)) for f in summary.findings] == [("leaf", "leaf leaf-b", behind)]
        assert "4 of its 4 nodes slow in every pair" in summary.findings[0].reason
        pairs = verdicts(summary, "pairs")
        assert {n: pairs[n] for n in behind} == dict.fromkeys(behind, "UNKNOWN")  # not blamed: behind it
        assert {v for n, v in pairs.items() if n not in behind} == {"OK"}, summary
        assert common_pb2.Verdict.Name(summary.verdict) == "FAIL" and summary.failed_nodes == 0
        assert "none taken out of service; paged once" in summary.quarantine["leaf leaf-b"]
        assert LocalQuarantines(c.controller.store.db).nodes() == {}
        assert c.controller.engine.guard.holding  # the nodes behind it wait for a person
        sizes = {r.params.get("sizes") for _, r in c.checks.requests if "master" in r.params}
        assert sizes == {"8,65536,16777216,1073741824"}  # latency to bandwidth, nccl-tests style
        # Neighbours, across, the nodes a leaf's bye left out; the slow pairs once more (each node
        # of the leaf in up to three of them)
        assert summary.rounds <= 4 + 3

    guard = GuardrailConfig(breaker_max_fraction=1.0, breaker_page_delay_s=0)
    run(tmp_path, 12, sim, test, node_labels=labels, guardrails=guard)


def test_a_slow_uplink_is_named_and_its_nodes_are_fine_within_their_leaf(tmp_path: Path) -> None:
    labels, sim = fat_tree("uplink-c")

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["pairs"], requested_by="sre")
        ((kind, node),) = [(f.kind, f.node) for f in summary.findings]
        assert (kind, node) == ("leaf-uplink", "uplink of leaf leaf-c")
        pairs = rows(summary, "pairs")
        assert pairs["node-9"].verdict == common_pb2.OK and "uplink of leaf leaf-c is slow" in pairs["node-9"].reason
        assert summary.quarantine == {}  # without --quarantine nothing is done

    run(tmp_path, 12, sim, test, node_labels=labels)


def test_a_topology_file_places_the_nodes_and_a_bad_one_is_refused_before_the_sweep(tmp_path: Path) -> None:
    """The leaves come from a topology file (no labels): the sweep names the slow leaf. Once the
    file is broken, the next sweep is refused at once, the file and the problem named."""
    labels, sim = fat_tree("leaf-b")
    topology = tmp_path / "topology.yaml"
    by_leaf: dict[str, list[str]] = {}
    for node, mine in labels.items():
        by_leaf.setdefault(mine["vigil.dev/leaf-switch"], []).append(node)
    topology.write_text(json.dumps({"leaves": {leaf: {"nodes": nodes} for leaf, nodes in by_leaf.items()}}))

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["pairs"])
        assert [(f.kind, f.node) for f in summary.findings] == [("leaf", "leaf leaf-b")]
        topology.write_text("leaves: {leaf-a: {nodes: [node-0]}, leaf-b: {nodes: [node-0]}}")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in c.admin.Sweep(admin_pb2.SweepRequest(checks=["pairs"])):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"{topology}: node node-0 is under two leaves" in (err.value.details() or "")

    run(tmp_path, 12, sim, test, sweep=SweepConfig(topology={"file": topology}))


# A pair that measured nothing, for a reason outside both nodes and their link, blames nobody: the
# family of a healthy node named slow because its pair could not run (its GPU busy with a job, rank
# 0's port held by another program, its agent not answering).


def test_a_pair_whose_rank_0_port_is_held_runs_again_on_another_port(tmp_path: Path) -> None:
    # node-0 is rank 0 of the first round's first pair: its port, the first the sweep uses, is held
    # there (as torchrun's rendezvous held 29400, the old default).
    sim = SimulatedChecks(held_ports={"node-0": {26000}})

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["pairs"], quarantine=True, requested_by="sre")
        assert set(verdicts(summary, "pairs").values()) == {"OK"}, summary
        assert list(summary.findings) == [] and common_pb2.Verdict.Name(summary.verdict) == "OK"
        masters = [(n, r.params["master"], r.params["rank"]) for n, r in c.checks.requests if "master" in r.params]
        # 4 nodes, 2 pairs a round: the pair's second try listens on the port after both first tries
        assert ("node-0", "node-0.sim:26000", "0") in masters and ("node-0", "node-0.sim:26002", "0") in masters
        assert [n for n, _ in c.checks.stopped] == ["node-1"]  # its partner stopped, not left to time out
        assert LocalQuarantines(c.controller.store.db).nodes() == {}

    run(tmp_path, 4, sim, test)


def test_a_node_whose_port_is_held_on_every_try_is_measured_where_it_does_not_listen(tmp_path: Path) -> None:
    sim = SimulatedChecks(held_ports={"node-0": set(range(26000, 29000))})

    async def test(c: Cluster) -> None:
        updates, summary = await c.sweep(checks=["pairs"], quarantine=True, requested_by="sre")
        pairs = rows(summary, "pairs")
        # node-0 cannot be rank 0 anywhere: its first pair was not run (3 tries, each on a port of its
        # own), then both it and its partner were paired with measured nodes, node-0 as rank 1.
        tries = [r.params["master"] for n, r in c.checks.requests if n == "node-0" and r.params.get("rank") == "0"]
        assert len(tries) == 3 and len(set(tries)) == 3
        assert set(verdicts(summary, "pairs").values()) == {"OK"}, summary
        assert pairs["node-0"].figure.startswith("not run with node-1; 40 GB/s with")
        assert list(summary.findings) == [] and common_pb2.Verdict.Name(summary.verdict) == "OK"
        assert "make-up pairs" in {u.phase for u in updates}
        assert LocalQuarantines(c.controller.store.db).nodes() == {}

    run(tmp_path, 4, sim, test)


@pytest.mark.parametrize("topology", [False, True], ids=["plain", "by-leaf"])
def test_a_node_whose_gpu_is_busy_is_not_measured_and_nobody_is_blamed(tmp_path: Path, topology: bool) -> None:
    labels, sim = fat_tree("none") if topology else ({}, SimulatedChecks())
    sim.script[("node-5", "pairs")] = "busy"

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["pairs"], quarantine=True, requested_by="sre")
        pairs = rows(summary, "pairs")
        assert common_pb2.Verdict.Name(pairs["node-5"].verdict) == "UNKNOWN", summary
        assert "a workload is using the GPU" in pairs["node-5"].reason
        assert list(summary.findings) == [] and summary.failed_nodes == 0, summary.findings
        # Every other node is measured (node-5's partner in a make-up pair where it had no other) and passes.
        assert {n for n, v in verdicts(summary, "pairs").items() if v != "OK"} == {"node-5"}
        assert "FAIL" not in verdicts(summary, "pairs").values()
        assert LocalQuarantines(c.controller.store.db).nodes() == {}

    run(tmp_path, 12, sim, test, node_labels=labels)


def test_a_node_whose_agent_never_answers_its_pair_is_unknown_and_its_partner_stopped(tmp_path: Path) -> None:
    sim = SimulatedChecks()
    sim.script[("node-5", "pairs")] = "hang"
    quick = SweepConfig(deadline_s={"pairs": 1.0}, answer_grace_s=0.5)

    async def test(c: Cluster) -> None:
        _, summary = await c.sweep(checks=["pairs"], quarantine=True, requested_by="sre")
        pairs = rows(summary, "pairs")
        assert common_pb2.Verdict.Name(pairs["node-5"].verdict) == "UNKNOWN", summary
        assert "no answer from the node's agent" in pairs["node-5"].reason
        assert list(summary.findings) == [] and summary.failed_nodes == 0
        assert LocalQuarantines(c.controller.store.db).nodes() == {}

    run(tmp_path, 8, sim, test, sweep=quick)
