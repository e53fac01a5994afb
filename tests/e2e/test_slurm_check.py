"""``vigil check --slurm-drain`` as Slurm runs it: by hand on a node, and as the Prolog slurmd runs
before a job, against a real slurmctld and slurmd (``tests.slurm``). A FAIL drains the node with the
check's own reason, which the controller's Slurm actuator then reads as the node's problem."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.act.slurm.actuator import SlurmActuator
from controller.act.slurm.client import SlurmCommands
from tests.slurm import slurm_cluster, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")]

FAILING = ["allreduce", "--sizes", "1024", "--min-busbw-gbps", "1000000"]  # gloo on CPU: far below that


def vigil_check(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURM_CONF": str(conf)}
    command = [sys.executable, "-m", "vigil", "check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_a_failing_check_drains_its_node_and_only_a_fail_does() -> None:
    with slurm_cluster(("gpu-01", "gpu-02")) as slurm:
        passed = vigil_check(slurm.conf, "gpu_health", "--backend", "simulated", "--slurm-drain", "--node", "gpu-01")
        assert passed.returncode == 0 and slurm.state("gpu-01") == "IDLE", passed.stderr

        hung = vigil_check(slurm.conf, "matmul", "--deadline", "0.05", "--slurm-drain", "--node", "gpu-01")
        assert hung.returncode == 0 and "UNKNOWN" in hung.stdout and slurm.state("gpu-01") == "IDLE"
        strict = vigil_check(
            slurm.conf, "matmul", "--deadline", "0.05", "--slurm-drain", "--strict", "--node", "gpu-01"
        )
        assert strict.returncode == 2 and slurm.state("gpu-01") == "IDLE"

        failed = vigil_check(slurm.conf, *FAILING, "--slurm-drain", "--node", "gpu-02")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert slurm.state("gpu-02") == "IDLE+DRAIN"
        assert slurm.reason("gpu-02").startswith("vigil check: allreduce FAIL: gloo, 2 ranks: bus bandwidth")
        (seen,) = SlurmActuator(SlurmCommands(conf=slurm.conf)).foreign_drains()
        assert (seen.node, seen.kind) == ("gpu-02", "node_problem")


def test_as_slurms_prolog_a_failing_check_keeps_the_job_off_the_node(tmp_path: Path) -> None:
    """deploy/slurm/vigil-healthcheck as the Prolog: the job is requeued and held, the node drained."""
    script = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "vigil-healthcheck"
    prolog = tmp_path / "prolog.sh"
    with slurm_cluster(("gpu-01",), extra=[f"Prolog={prolog}"]) as slurm:
        prolog.write_text(
            "#!/bin/sh\n"  # what a site's Prolog would set: which checks, and where vigil is
            f"export SLURM_CONF={slurm.conf} PYTHONPATH={script.parents[2]} VIGIL='{sys.executable} -m vigil'\n"
            f"export VIGIL_CHECKS='gpu_health --backend simulated; {' '.join(FAILING)}'\n"
            f"exec {script} >> {tmp_path}/prolog.log 2>&1\n"
        )
        prolog.chmod(0o755)
        job = slurm.command("sbatch", "--parsable", "-N1", "-w", "gpu-01", "--wrap", "true").stdout.strip()
        slurm.wait(lambda: "DRAIN" in slurm.state("gpu-01"), "the prolog's drain", timeout=90)
        assert slurm.reason("gpu-01").startswith("vigil check: allreduce FAIL"), (tmp_path / "prolog.log").read_text()
        # Slurm requeues the job and holds it: it never ran on the node the check failed.
        said = lambda: slurm.command("squeue", "-h", "-o", "%T %r", "-j", job).stdout.strip()  # noqa: E731
        slurm.wait(lambda: said() == "PENDING launch failed requeued held", "the job requeued and held", timeout=60)
        log = (tmp_path / "prolog.log").read_text()
        assert "gpu_health: OK" in log and "Traceback" not in log, log
