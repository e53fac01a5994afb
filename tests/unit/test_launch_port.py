"""The rendezvous port ``vigil launch`` tells a start's ranks: one port for all of them, below the
kernel's ephemeral range, where no outgoing connection on the machine can take it before rank 0's
store binds it (a port found free inside that range may be anyone's a moment later: a start failed
for nothing, and counted against the job's failures)."""

from __future__ import annotations

import sys
from pathlib import Path

from vigil.launch import LaunchConfig, Launcher
from vigil_core.ports import ephemeral_range


def test_every_rank_is_told_one_port_below_the_ephemeral_range(tmp_path: Path) -> None:
    tell = f"import os; open({str(tmp_path)!r} + '/port-' + os.environ['RANK'], 'w').write(os.environ['MASTER_PORT'])"
    command = (sys.executable, "-c", tell)
    config = LaunchConfig(job_id="ports", nodes=("n1", "n2"), nproc_per_node=2, command=command, poll_s=0.05)
    assert Launcher(config).run() == 0
    ports = {int((tmp_path / f"port-{rank}").read_text()) for rank in range(4)}
    low, _ = ephemeral_range()
    assert len(ports) == 1 and next(iter(ports)) < low
