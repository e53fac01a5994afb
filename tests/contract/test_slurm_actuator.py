"""The Slurm actuator against a real slurmctld and slurmd (``tests.slurm``): drains with Vigil's
reason, resumes only its own, adopts its drains from Slurm, leaves everyone else's drains as they
are, waits for DRAIN+IDLE before a repair, and chooses nodes by partition and by job. Each test
runs three times: through Slurm's commands on Debian 12's Slurm 22.05, and on Debian 13's 24.11
through its commands and through slurmrestd."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from controller.act.actuators import PermanentActionError, SelectionError
from controller.act.slurm.actuator import SlurmActuator
from controller.act.slurm.client import SlurmUnavailable
from controller.vocab.actions import Quarantine
from tests.slurm import NEW, OLD, SlurmCluster, slurm_cluster, unavailable

# On one worker: two clusters in all, not two a worker (three workers starting six at once on two cores).
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("slurm-actuator")]

REASON = "XID 79 on GPU 3: GPU has fallen off the bus"


REACHED = [(OLD, "commands"), (NEW, "commands"), (NEW, "slurmrestd")]  # 22.05's REST API updates no node


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "slurm" in metafunc.fixturenames:
        ids = [f"{version}-{via}" for version, via in REACHED]
        metafunc.parametrize(("version", "via"), REACHED, ids=ids, scope="module")


@pytest.fixture(scope="module")
def cluster(version: str) -> Iterator[SlurmCluster]:
    if why := unavailable(version):
        pytest.skip(why)
    with slurm_cluster(("gpu-01", "gpu-02", "gpu-03"), version=version) as running:
        yield running


@pytest.fixture
def slurm(cluster: SlurmCluster, via: str) -> Iterator[SlurmCluster]:
    """The module's cluster, reached through ``via``, with every node IDLE again and no job left,
    whatever the last test did."""
    cluster.via = via
    yield cluster
    for job in cluster.command("squeue", "-h", "-o", "%i").stdout.split():
        cluster.cancel(job)
    for node in cluster.nodes:
        cluster.command("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    cluster.wait(lambda: all(cluster.state(n) == "IDLE" for n in cluster.nodes), "every node IDLE again")


def actuator(slurm: SlurmCluster, names: dict[str, str] | None = None) -> SlurmActuator:
    return SlurmActuator(slurm.client(), names)


def test_a_quarantine_drains_with_vigils_reason_once(slurm: SlurmCluster) -> None:
    slurm_actuator = actuator(slurm)
    said = slurm_actuator.quarantine(Quarantine("gpu-02-a1b2c3-7", "gpu-02", REASON, ""))
    assert slurm.state("gpu-02") == "IDLE+DRAIN" and slurm.state("gpu-01") == "IDLE"
    assert slurm.reason("gpu-02") == "vigil:gpu-02-a1b2c3-7:xid-79-on-gpu-3-gpu-has-fallen-off-the-bus"
    assert "drained in Slurm" in said
    again = slurm_actuator.quarantine(Quarantine("gpu-02-a1b2c3-7", "gpu-02", REASON, ""))
    assert "already drained by Vigil (incident gpu-02-a1b2c3-7)" in again
    assert slurm.reason("gpu-02").startswith("vigil:gpu-02-a1b2c3-7:")


def test_a_release_resumes_vigils_drain_only(slurm: SlurmCluster) -> None:
    slurm_actuator = actuator(slurm)
    slurm_actuator.quarantine(Quarantine("inc-1", "gpu-01", REASON, ""))
    slurm.drain("gpu-03", "bad DIMM, RMA 4411")  # a person's
    released = slurm_actuator.release("gpu-01", "certified")
    assert released.released and "DRAIN" not in slurm.state("gpu-01")  # IDLE (after slurmctld pings it)
    kept = slurm_actuator.release("gpu-03", "certified")
    assert not kept.released and "bad DIMM, RMA 4411" in kept.detail and "by root" in kept.detail
    assert slurm.state("gpu-03") == "IDLE+DRAIN" and slurm.reason("gpu-03") == "bad DIMM, RMA 4411"
    assert "not drained" in slurm_actuator.release("gpu-02", "certified").detail


def test_someone_elses_drain_is_neither_overwritten_nor_resumed(slurm: SlurmCluster) -> None:
    """Before Vigil (a person drained it first) and after (a person re-drained Vigil's node with
    their own reason): the reason is theirs, and so is the resume."""
    slurm_actuator = actuator(slurm)
    slurm.drain("gpu-01", "NHC: check_fs_mount: /scratch not mounted")
    said = slurm_actuator.quarantine(Quarantine("inc-2", "gpu-01", REASON, ""))
    assert "not by Vigil" in said and "node_problem" in said
    assert slurm.reason("gpu-01") == "NHC: check_fs_mount: /scratch not mounted"

    slurm_actuator.quarantine(Quarantine("inc-3", "gpu-02", REASON, ""))
    slurm.drain("gpu-02", "keep out: firmware update")  # a person takes over Vigil's drain
    assert not slurm_actuator.release("gpu-02", "certified").released
    assert slurm.state("gpu-02") == "IDLE+DRAIN" and slurm.reason("gpu-02") == "keep out: firmware update"


def test_a_new_leader_adopts_vigils_drains_from_slurm(slurm: SlurmCluster) -> None:
    first = actuator(slurm)
    first.quarantine(Quarantine("gpu-03-ffee00-12", "gpu-03", REASON, ""))
    slurm.drain("gpu-01", "Kill task failed")  # Slurm's own kind of drain: not Vigil's to adopt
    found = actuator(slurm).adopt()  # another replica, knowing nothing
    assert [(q.node, q.incident_id) for q in found] == [("gpu-03", "gpu-03-ffee00-12")]
    assert found[0].reason.startswith("vigil:gpu-03-ffee00-12:") and found[0].at > 0


def test_a_repair_waits_until_the_drained_node_is_idle(slurm: SlurmCluster) -> None:
    slurm_actuator = actuator(slurm)
    job = slurm.submit(["gpu-02"])
    slurm_actuator.quarantine(Quarantine("inc-4", "gpu-02", REASON, ""))
    assert slurm.state("gpu-02") in ("ALLOCATED+DRAIN", "MIXED+DRAIN")  # the job runs on
    assert "a job still runs on it" in slurm_actuator.held_by_others("gpu-02")
    slurm.cancel(job)
    slurm.wait(lambda: slurm.state("gpu-02") == "IDLE+DRAIN", "gpu-02 DRAIN+IDLE")
    assert slurm_actuator.held_by_others("gpu-02") == ""
    slurm.drain("gpu-02", "hands on: reseating GPU 3")
    assert "drained by someone else" in slurm_actuator.held_by_others("gpu-02")


def test_sweeps_choose_nodes_by_partition_and_by_job(slurm: SlurmCluster) -> None:
    slurm_actuator = actuator(slurm)
    assert slurm_actuator.nodes_matching("partition=gpu") == ["gpu-01", "gpu-02", "gpu-03"]
    assert slurm_actuator.nodes_matching("partition=cpu") == []
    with pytest.raises(SelectionError, match="knows partition, feature and state"):
        slurm_actuator.nodes_matching("pool=h100")
    job = slurm.submit(["gpu-01", "gpu-03"])
    assert slurm_actuator.job_nodes("", job) == ["gpu-01", "gpu-03"]
    with pytest.raises(SelectionError, match="holds no nodes"):
        slurm_actuator.job_nodes("", "999999")
    with pytest.raises(SelectionError, match="a job id is a number"):
        slurm_actuator.job_nodes("", "moe-pretrain")


def test_names_map_between_vigil_and_slurm(slurm: SlurmCluster) -> None:
    slurm_actuator = actuator(slurm, {"node-a": "gpu-01", "node-b": "gpu-02"})
    slurm_actuator.quarantine(Quarantine("inc-5", "node-a", REASON, ""))
    assert slurm.state("gpu-01") == "IDLE+DRAIN"
    assert [q.node for q in slurm_actuator.adopt()] == ["node-a"]
    assert slurm_actuator.nodes_matching("partition=gpu") == ["gpu-03", "node-a", "node-b"]
    assert "slurm.partition/gpu" in slurm_actuator.node_labels()["node-a"]
    assert slurm_actuator.release("node-a", "certified").released and "DRAIN" not in slurm.state("gpu-01")


def test_an_unknown_node_is_permanent_and_a_silent_slurmctld_is_not(slurm: SlurmCluster) -> None:
    with pytest.raises(PermanentActionError, match="no node 'gpu-99'"):
        actuator(slurm).quarantine(Quarantine("inc-6", "gpu-99", REASON, ""))
    elsewhere = slurm.client(elsewhere=True, timeout_s=2)  # nobody answers there: the action is tried again later
    with pytest.raises(SlurmUnavailable):
        SlurmActuator(elsewhere).quarantine(Quarantine("inc-7", "gpu-01", REASON, ""))


def test_others_drains_are_read_with_who_why_and_whose_problem(slurm: SlurmCluster) -> None:
    slurm_actuator = actuator(slurm, {"node-c": "gpu-03"})
    slurm_actuator.quarantine(Quarantine("inc-8", "gpu-01", REASON, ""))  # Vigil's own: not foreign
    slurm.drain("gpu-03", "NHC: check_hw_ib: mlx5_2 port 1 down")
    (found,) = slurm_actuator.foreign_drains()
    assert (found.node, found.reason, found.by, found.kind, found.state) == (
        "node-c", "NHC: check_hw_ib: mlx5_2 port 1 down", "root", "node_problem", "IDLE+DRAIN")  # fmt: skip
    assert found.at > 0


@pytest.mark.parametrize("version", [OLD, NEW])
def test_a_stopped_test_cluster_leaves_no_process_behind(version: str) -> None:
    """The harness itself: a job's slurmstepd leaves slurmd's session (one was left by each run)."""
    if why := unavailable(version):
        pytest.skip(why)
    job = f"sleep {300 + os.getpid() % 1000}.{version.replace('.', '')}"  # its task, told apart from others'
    with slurm_cluster(("gpu-01",), version=version) as running:
        running.submit(["gpu-01"], job)
        running.wait(lambda: _running(job), "the job's task started")  # RUNNING comes before its exec
    assert running.strays() == []
    assert not _running(job)


def _running(command: str) -> bool:
    return subprocess.run(["pgrep", "-f", f"^{command}$"], capture_output=True).returncode == 0
