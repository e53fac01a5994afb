"""A node's link dropped inside its network namespace hangs a real two-rank job, and that node's own
InfiniBand port flap, joined with the hang, names it.

Two "nodes", each a network namespace joined through a bridge (``tests/e2e/netns.py``): the job's
fabric. Each runs one gloo rank of a small job (``bench/hang_job.py``, a step every 0.3 s with a real
all-reduce and the real hook), started by hand, not under ``vigil launch``: no stacks will come. The
agents and the controller talk over the host's own network (a management network apart from the
fabric), each agent reading its node's ranks' progress records and, for node-1, an InfiniBand port in
a sysfs tree. node-1's link goes down, and its port flaps (down a second: recorded, alone nothing).
Every rank then waits in the all-reduce: the controller finds the job hung, locates it from the
ranks' progress records (every rank alike at one step), joins that with node-1's flap, and
quarantines node-1; node-0 stays healthy. Root only (namespaces); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.e2e.netns import HOST, namespaced_nodes, unavailable
from tests.e2e.processes import configured_controller, json_lines, port_of, start_agent
from tests.fakes.ib_sysfs import IbSysfs
from tests.helpers import free_port, poll_until
from vigil.admin_client import AdminClient

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("netns"), pytest.mark.timeout(300)]

pytest.importorskip("torch", reason="the job's ranks need torch (make test installs the CPU build)")

NAMES = ["node-0", "node-1"]


def agent_config(tmp: Path, node: str, ib: IbSysfs | None) -> Path:
    config = {"progress_dir": str(tmp / "progress" / node), "heartbeat_s": 0.5}
    if ib is not None:
        config |= {"ib_sysfs_root": str(ib.root), "ib_poll_s": 0.2}
    path = tmp / f"{node}-agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        p.kill()
    psutil.wait_procs(tree, timeout=10)


@pytest.mark.skipif(bool(why := unavailable()), reason=why or "")
def test_a_dropped_link_hangs_the_job_and_the_nodes_own_port_flap_names_it(tmp_path: Path) -> None:
    ib = IbSysfs(tmp_path / "sys-node-1")
    ib.add_port("mlx5_0")
    jobs = {"hang": {"floor_s": 3.0, "stacks_wait_s": 2.0}, "checkpoint_now": False}
    with namespaced_nodes(2, prefix=f"vh{os.getpid() % 1000}") as nodes:
        ctl = configured_controller(tmp_path, "ctl", listen=HOST, pager="console", jobs=jobs)
        target = f"{HOST}:{port_of(tmp_path, 'ctl')}"
        agents = [
            start_agent(tmp_path, node, target, config=agent_config(tmp_path, node, ib if i == 1 else None))[0]
            for i, node in enumerate(NAMES)
        ]
        port, ranks = str(free_port()), []
        try:
            with AdminClient(target) as admin:
                poll_until(lambda: len(admin.status().nodes) == 2, what="both agents connected", timeout=60)
                for i, node in enumerate(NAMES):
                    env = {
                        **os.environ, "RANK": str(i), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                        "MASTER_ADDR": nodes.address(0), "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": nodes.veth(i),
                        "VIGIL_JOB_ID": "net", "VIGIL_CONTROLLER": target, "VIGIL_NODE": node,
                        "VIGIL_PROGRESS_DIR": str(tmp_path / "progress" / "{node}"), "BENCH_STEP_S": "0.3",
                        "OMP_NUM_THREADS": "1",
                    }  # fmt: skip
                    out = open(tmp_path / f"rank{i}.log", "wb")  # noqa: SIM115 (the child keeps it)
                    command = [*nodes.exec_prefix(i), sys.executable, "-m", "bench.hang_job"]
                    ranks.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
                poll_until(lambda: any(j.step >= 30 for j in admin.jobs()), timeout=120, what="30 steps")
                subprocess.run(["ip", "-n", nodes.namespace(1), "link", "set", nodes.veth(1), "down"], check=True)
                ib.set_up("mlx5_0", 1, False)  # its port flaps with it: a second down, then up
                time.sleep(1.0)  # the agent reads it every 0.2 s: seen down, shorter than the transport timeout
                ib.set_up("mlx5_0", 1, True)

                def health() -> dict[str, str]:
                    return {n.node: n.health for n in admin.status().nodes}

                poll_until(lambda: health()["node-1"] == "QUARANTINED", timeout=90, what="node-1 quarantined")
                assert health()["node-0"] == "HEALTHY"
            out = (tmp_path / "ctl.out").read_text()
            (wave,) = [ln for ln in out.splitlines() if "WAVEFRONT" in ln]
            assert "from its 2 ranks' progress records: all 2 ranks at one step" in wave, wave
            (hardware,) = [ln for ln in out.splitlines() if "HARDWARE" in ln]
            assert "every rank alike in its progress record, joined with the nodes' own signals" in hardware
            assert "node-1: IB_PORT_FLAP" in hardware and "quarantine requested" in hardware, hardware
            (hung,) = [e for e in json_lines(tmp_path / "ctl.log") if e["event"] == "job_hung"]
            assert hung["step"] >= 30 and not hung["silent"]  # rank 0 still reports over the host's network
        finally:
            for rank in ranks:
                _kill(rank)
            for proc in (*agents, ctl):
                proc.send_signal(signal.SIGTERM)
            for proc in (*agents, ctl):
                proc.wait(15)
