"""``vigil launch --slurm``: the job's ranks as one ``srun`` step inside a Slurm allocation.

Run from the batch script (``sbatch -N 16 ... --wrap 'vigil launch --slurm -- python train.py'``),
the launcher takes the allocation's nodes (``SLURM_JOB_NODELIST``), starts every rank with one
``srun`` over the nodes still in service, and, when the controller takes a node out (it drains it
in Slurm), starts the next step on the nodes left: the drained node stays in the allocation
(DRAIN+ALLOCATED) until the job ends, and no rank runs on it again.

Each task runs ``python -m vigil.launch_slurm COMMAND...``, which gives the command the variables
torchrun sets, from the ones srun sets (SLURM_PROCID, SLURM_LOCALID, ...), and VIGIL_NODE (the
node's Slurm name), then becomes the command. ``srun --wait`` ends the step a while after its first
task ends (a rank that failed leaves the others hanging in their next collective).

Not here: the ranks' stacks on a hang (the launcher asks its own child processes; across nodes it
would need a shared directory), and a requeue of the whole job (``scontrol requeue``) in place of a
smaller step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence


class SlurmLaunchError(Exception):
    """Slurm could not be asked what the launcher needs (no allocation, a command that failed)."""


STEP_WAIT_S = 60  # after a step's first task ends, how long the others have to end with it


def allocation_nodes(hostnames: str) -> list[str]:
    """The allocation's nodes from ``scontrol show hostnames`` output. Pure."""
    return [line.strip() for line in hostnames.splitlines() if line.strip()]


def srun_command(nodes: Sequence[str], ntasks_per_node: int, command: Sequence[str], python: str) -> list[str]:
    """One step over exactly these nodes, ``ntasks_per_node`` ranks each. Pure."""
    return [
        "srun", f"--nodes={len(nodes)}", f"--ntasks-per-node={ntasks_per_node}", f"--nodelist={','.join(nodes)}",
        f"--wait={STEP_WAIT_S}", "--kill-on-bad-exit=0", "--export=ALL",
        python, "-m", "vigil.launch_slurm", *command,
    ]  # fmt: skip


def this_allocation() -> list[str]:
    """The nodes of the allocation this runs in; raises SlurmLaunchError outside one."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        raise SlurmLaunchError(
            "--slurm: not inside a Slurm allocation (no SLURM_JOB_NODELIST: run it from sbatch or salloc)"
        )
    return allocation_nodes(_slurm("scontrol", "show", "hostnames", nodelist))


def address_of(node: str) -> str:
    """Where the node listens (its NodeAddr), for the ranks' rendezvous; the name where Slurm says none."""
    for n in json.loads(_slurm("sinfo", "--json")).get("nodes", []):
        if n.get("name") == node:
            return str(n.get("address") or node)
    return node


def _slurm(*command: str) -> str:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmLaunchError(f"--slurm: {' '.join(command[:2])} failed: {exc}") from None
    return done.stdout


def rank_env(slurm: Mapping[str, str]) -> dict[str, str]:
    """What torchrun would tell this rank, from what srun told the task. Pure; raises KeyError for a
    variable srun always sets and this task lacks (not started by srun)."""
    world = int(slurm["SLURM_NTASKS"])
    nodes = int(slurm["SLURM_STEP_NUM_NODES"])
    return {
        "RANK": slurm["SLURM_PROCID"],
        "LOCAL_RANK": slurm["SLURM_LOCALID"],
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world // nodes),
        "GROUP_RANK": slurm["SLURM_NODEID"],
        "VIGIL_NODE": slurm["SLURMD_NODENAME"],
    }


def main(argv: Sequence[str]) -> None:
    """The task's side: set the rank's variables and become the command."""
    if not argv:
        sys.exit("usage: python -m vigil.launch_slurm COMMAND... (run by vigil launch --slurm, through srun)")
    try:
        env = {**os.environ, **rank_env(os.environ)}
    except KeyError as exc:
        sys.exit(f"vigil.launch_slurm: {exc.args[0]} is not set: this runs as an srun task, started by vigil launch")
    os.execvpe(argv[0], list(argv), env)


if __name__ == "__main__":
    main(sys.argv[1:])
