"""Checkpoint-and-restart across real processes: a controller, two simulated-GPU agents (node-a,
node-b), and ``vigil launch`` running the bundled MoE job with one gloo rank per node.

- A fault on node-b (an XID 79 line in its kernel log): the job checkpoints at a step boundary,
  exits with its code, and starts again on node-a only, at exactly the committed step.
- node-b's rank turns slow (an injected sleep): the MFU monitor sees the drop within the configured
  windows, blames node-b, quarantines it, stops the job, sweeps node-a, and the job comes back on
  node-a.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training job needs torch (make test installs the CPU build)")

from protos.vigil.v1 import common_pb2  # noqa: E402
from tests.e2e.processes import JobCluster, job_cluster, json_lines  # noqa: E402
from tests.helpers import poll_until  # noqa: E402
from tests.training.launch import events, losses, run  # noqa: E402
from vigil.admin_client import AdminClient  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ARGS = ("--steps", "150", "--global-batch", "6", "--checkpoint-every", "10")
WINDOW_STEPS = 10  # as checkpoint_every: each window has one save in it, so windows compare evenly


ENV = {"VIGIL_WINDOW_STEPS": str(WINDOW_STEPS), "OMP_NUM_THREADS": "1"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[JobCluster]:
    # The slow rank's drop is about 78 %; on a shared CPU, throughput noise alone can dip 20 % (the GPU
    # default), so the test's jobs, like the training demo's, call a drop only past 40 %. A cluster
    # failing absurdly often (2,000,000 failures per 1,000 GPU-days: a 2-GPU job's MTBF is 22 s) makes
    # the recommended checkpoint interval about a second, for the job that follows it (auto).
    jobs = {"drop_fraction": 0.4, "failures_per_1000_gpu_days": 2e6}
    with job_cluster(tmp_path, pager="console", jobs=jobs) as c:
        yield c


def launch(cluster: JobCluster, *job_args: str) -> subprocess.Popen[bytes]:
    return cluster.launch("moe", ["node-a", "node-b"], [*ARGS, *job_args], ENV)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The same job on two ranks, never stopped, without Vigil."""
    out = tmp_path_factory.mktemp("uninterrupted")
    assert run(2, out, *ARGS) == [0, 0], (out / "rank0.log").read_text()[-2000:]
    return losses(out)


def test_a_fault_on_node_b_restarts_the_job_on_node_a_at_the_committed_step(
    cluster: JobCluster, uninterrupted: dict[int, float]
) -> None:
    run_dir = cluster.tmp / "run"
    launcher = launch(cluster)
    poll_until(lambda: any(e["step"] >= 10 for e in events(run_dir, "step")), timeout=120, what="training")
    cluster.xid("node-b")
    assert launcher.wait(180) == 0, (cluster.tmp / "launch.log").read_text()[-3000:]

    (stopped,) = events(run_dir, "checkpointed_and_exiting")
    k = stopped["step"]
    assert 10 <= k < 150 and "node-b quarantined: XID 79" in stopped["why"] and stopped["acknowledged"]
    first, second = events(run_dir, "start")
    assert (first["world_size"], second["world_size"], second["node"], second["restart"]) == (2, 1, "node-a", 1)
    # Nothing lost beyond the checkpoint: the restart begins at the committed step, at the next sample.
    assert (second["step"], second["consumed"]) == (k, 6 * k)
    assert second["resumed_from"].endswith(f"step-{k:08d}")
    assert events(run_dir, "finished")[-1]["step"] == 150
    resumed = losses(run_dir)
    assert [resumed[s] for s in range(1, k + 1)] == [uninterrupted[s] for s in range(1, k + 1)]
    # One rank now computes what two did: the same weights and samples, summed in another order.
    assert resumed[k + 1] == pytest.approx(uninterrupted[k + 1], abs=1e-5)

    launch_log = (cluster.tmp / "launch.log").read_text()
    assert '"how": "checkpointed", "exit_codes": [75, 75]' in launch_log
    with AdminClient(cluster.controller) as admin:
        (job,) = admin.jobs()
    # A clean stop wastes nothing; the restart's load and the gap before it are accounted for.
    assert (job.state, job.restart_count, job.step, job.wasted_s) == ("finished", 1, 150, 0.0)
    assert job.productive_s > 0 and job.checkpoint_s > 0 and job.restore_s > 0 and job.recovery_s > 0
    assert job.goodput == pytest.approx(job.productive_s / sum(
        (job.productive_s, job.checkpoint_s, job.restore_s, job.wasted_s, job.recovery_s)))  # fmt: skip
    pages = (cluster.tmp / "ctl.out").read_text()
    assert f"JOB-CHECKPOINTED:moe: Job moe checkpointed at step {k}" in pages
    assert f"JOB-RESUMED:moe: Job moe restarted on 1 node(s), node-b left out; resumed at step {k}" in pages


@pytest.mark.serial  # a slow rank is told from the others by its step times: nothing else may load the CPUs
def test_a_slow_rank_is_detected_blamed_on_its_node_and_left_out_of_the_restart(cluster: JobCluster) -> None:
    run_dir = cluster.tmp / "run"
    # Steps of at least 60 ms: each window is 10 steps (it is also 0.5 s at least) on a fast machine too,
    # so the baseline (windows 2-4) is learnt before the slow rank starts.
    launcher = launch(
        cluster, "--slow-node", "node-b", "--slow-s", "0.15", "--slow-from-step", "40", "--step-floor-s", "0.06"
    )
    assert launcher.wait(180) == 0, (cluster.tmp / "launch.log").read_text()[-3000:]

    log = json_lines(cluster.tmp / "ctl.log")
    blamed = [e for e in log if e["event"] == "mfu_drop" and e["blamed"]]
    # Windows of 10 steps (give or take the hook's exchange rhythm): warm-up, 3 for the baseline, then
    # slow from step 41. Two low windows in a row are the drop: found within the third window at most.
    # The drop that blames a node is the slow rank's, and it blames node-b alone; an unblamed dip
    # of a loaded machine would only page (and is not what this test is about).
    (drop,) = blamed
    assert 40 + WINDOW_STEPS < drop["step"] <= 40 + 3 * WINDOW_STEPS and drop["blamed"] == ["node-b"]
    assert "on node-b: step time" in drop["evidence"]
    (sweep,) = [e for e in log if e["event"] == "job_recovery_sweep"]
    assert sweep["nodes"] == ["node-a"]
    (stopped,) = events(run_dir, "checkpointed_and_exiting")
    assert "node-b quarantined" in stopped["why"] and "step time" in stopped["why"]
    restarted = events(run_dir, "start")[-1]
    assert (restarted["node"], restarted["world_size"], restarted["step"]) == ("node-a", 1, stopped["step"])
    with AdminClient(cluster.controller) as admin:
        health = {n.node: n.health for n in admin.status().nodes}
        (incident,) = admin.incidents(node="node-b")
    assert health == {"node-a": "HEALTHY", "node-b": "QUARANTINED"}
    assert incident.kind == common_pb2.CHECK_FAILED and "step time" in incident.first_message


def test_the_job_saves_on_an_early_warning_and_as_often_as_recommended(cluster: JobCluster) -> None:
    """--checkpoint-every auto: the job saves as often as the controller recommends for its size and
    measured save time (about a second here), none on a step schedule. A non-fatal NVSwitch error on
    node-b (an early warning: counted, nobody quarantined) makes the controller ask for a checkpoint
    now: every rank saves at the same step, acknowledges it, and trains on to the end."""
    run_dir = cluster.tmp / "run"
    launcher = launch(cluster, "--checkpoint-every", "auto")
    poll_until(lambda: any(e["step"] >= 10 for e in events(run_dir, "step")), timeout=120, what="training")
    sxid = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"
    with open(cluster.kmsg["node-b"], "a") as f:
        f.write(f"3,500,{int(1e9)},-;{sxid}\n")
    assert launcher.wait(180) == 0, (cluster.tmp / "launch.log").read_text()[-3000:]

    saves = events(run_dir, "checkpoint")  # rank 0's log
    assert len(saves) >= 3 and all(s["asked_by_vigil"] for s in saves)
    assert not events(run_dir, "checkpointed_and_exiting") and events(run_dir, "finished")[-1]["step"] == 150
    log = json_lines(cluster.tmp / "ctl.log")
    (request,) = [e for e in log if e["event"] == "job_asked_to_save"]
    assert "node-b: SXid 12028 (non-fatal: egress non-posted PRIV error)" in request["reason"]
    (done,) = [e for e in log if e["event"] == "job_saved_on_request"]
    assert done["command"] == request["command"] and done["step"] in {s["step"] for s in saves}
    with AdminClient(cluster.controller) as admin:
        health = {n.node: n.health for n in admin.status().nodes}
        (job,) = admin.jobs()
    assert health["node-b"] == "HEALTHY" and job.restart_count == 0  # saved, not stopped
    assert 0 < job.recommended_checkpoint_s < 5
