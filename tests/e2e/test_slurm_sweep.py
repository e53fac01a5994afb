"""``vigil sweep --partition`` and ``--slurm-job`` through a controller whose actuator is Slurm's,
against a real slurmctld and slurmd (``tests.slurm``), with a simulated agent on each node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.processes import configured_controller, port_of, start_agent, stop_all
from tests.helpers import poll_until
from tests.slurm import slurm_cluster, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")]

NODES = ("gpu-01", "gpu-02", "gpu-03")


def vigil(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vigil", *args], capture_output=True, text=True, timeout=120)


def test_a_sweep_picks_a_partitions_and_a_jobs_nodes_from_slurm(tmp_path: Path) -> None:
    with slurm_cluster(NODES) as slurm:
        ctl = configured_controller(tmp_path, "ctl", pager="none", actuator="slurm", slurm={"conf": str(slurm.conf)})
        procs = [ctl]
        try:
            target = f"127.0.0.1:{port_of(tmp_path, 'ctl')}"
            procs += [start_agent(tmp_path, node, target)[0] for node in NODES]
            poll_until(lambda: all(n in vigil("status", "--controller", target).stdout for n in NODES), 60, "agents")

            whole = vigil("sweep", "--partition", "gpu", "--checks", "gpu_health", "--json", "--controller", target)
            assert whole.returncode == 0, whole.stdout + whole.stderr
            assert sorted(r["node"] for r in json.loads(whole.stdout)["rows"]) == list(NODES)

            job = slurm.submit(["gpu-01", "gpu-03"])
            picked = vigil("sweep", "--slurm-job", job, "--checks", "gpu_health", "--json", "--controller", target)
            assert picked.returncode == 0, picked.stdout + picked.stderr
            assert sorted(r["node"] for r in json.loads(picked.stdout)["rows"]) == ["gpu-01", "gpu-03"]

            gone = vigil("sweep", "--slurm-job", "999999", "--controller", target)
            assert gone.returncode == 2 and "Slurm job 999999 holds no nodes" in gone.stderr + gone.stdout
            assert "Traceback" not in gone.stderr
        finally:
            stop_all(procs)
