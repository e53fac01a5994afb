"""vigil launch --slurm: the srun step it starts, and what each task tells the rank."""

from __future__ import annotations

from vigil.launch_slurm import rank_env, srun_command


def test_a_task_gets_torchruns_variables_from_sruns() -> None:
    srun = {"SLURM_NTASKS": "8", "SLURM_STEP_NUM_NODES": "2", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu-07"}  # fmt: skip
    assert rank_env(srun) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                              "GROUP_RANK": "1", "VIGIL_NODE": "gpu-07"}  # fmt: skip
    command = srun_command(["gpu-01", "gpu-03"], 4, ["python", "train.py"], "/usr/bin/python3")
    assert command[:4] == ["srun", "--nodes=2", "--ntasks-per-node=4", "--nodelist=gpu-01,gpu-03"]
    assert command[-5:] == ["/usr/bin/python3", "-m", "vigil.launch_slurm", "python", "train.py"]
