"""``vigil launch --slurm`` inside a real Slurm allocation (``tests.slurm``): the bundled MoE job
runs as one srun step over three nodes; an XID 79 on gpu-02 drains it in Slurm (the controller's
Slurm actuator), the job checkpoints when told, and the next step runs on gpu-01 and gpu-03 only,
from the committed step, inside the same allocation."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training job needs torch (make test installs the CPU build)")

from tests.e2e.processes import JobCluster, job_cluster, json_lines  # noqa: E402
from tests.helpers import poll_until  # noqa: E402
from tests.slurm import SlurmCluster, slurm_cluster, unavailable  # noqa: E402
from tests.training.launch import events  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(bool(unavailable()), reason=unavailable() or ""),
]

NODES = ("gpu-01", "gpu-02", "gpu-03")
ARGS = "--steps 150 --global-batch 6 --checkpoint-every 10"


@pytest.fixture
def slurm() -> Iterator[SlurmCluster]:
    with slurm_cluster(NODES) as running:
        yield running


@pytest.fixture
def cluster(tmp_path: Path, slurm: SlurmCluster) -> Iterator[JobCluster]:
    with job_cluster(tmp_path, NODES, pager="console", actuator="slurm", slurm={"conf": str(slurm.conf)}) as c:
        yield c


def test_a_drained_node_is_left_out_of_the_next_srun_step(
    tmp_path: Path, slurm: SlurmCluster, cluster: JobCluster
) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "ranks"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"  # the batch script a person writes: the launcher, then the job's own command
        f"export PYTHONPATH={Path(__file__).resolve().parents[2]} OMP_NUM_THREADS=1 VIGIL_WINDOW_STEPS=10\n"
        f"exec {sys.executable} -m vigil launch --slurm --job-id moe --controller {cluster.controller} "
        f"--log-dir {logs} --log-format json -- "
        f"{sys.executable} -m trainer_hooks.moe_job.train --out {run_dir} {ARGS}\n"
    )
    script.chmod(0o755)
    out = tmp_path / "slurm-job.out"
    job = slurm.command("sbatch", "--parsable", "-N3", "-o", str(out), str(script)).stdout.strip()
    poll_until(lambda: any(e["step"] >= 10 for e in events(run_dir, "step")), timeout=150, what="training")
    assert events(run_dir, "start")[0]["world_size"] == 3

    cluster.xid("gpu-02")
    slurm.wait(lambda: slurm.job_state(job) in ("COMPLETED", "FAILED", ""), "the Slurm job's end", timeout=200)
    said = out.read_text()
    assert slurm.job_state(job) in ("COMPLETED", ""), said[-3000:]
    assert slurm.reason("gpu-02").startswith("vigil:gpu-02-"), slurm.reason("gpu-02")

    (stopped,) = events(run_dir, "checkpointed_and_exiting")
    k = stopped["step"]
    first, second = events(run_dir, "start")[0], events(run_dir, "start")[-1]
    assert (first["world_size"], second["world_size"], second["restart"]) == (3, 2, 1)
    starts = [e for e in json_lines(out) if e.get("event") == "job_starting"]
    assert [s["nodes"] for s in starts] == [list(NODES), ["gpu-01", "gpu-03"]], said[-3000:]
    assert (second["step"], second["consumed"]) == (k, 6 * k)
    assert events(run_dir, "finished")[-1]["step"] == 150
    assert sorted(p.name for p in logs.iterdir()) == ["step0.log", "step1.log"], os.listdir(logs)
