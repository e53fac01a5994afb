"""The scenario fleet's machines, as far as a repair touches them: each node's agent configuration
(its InfiniBand tree, its fake ``nvidia-smi`` and sysfs for resets), the jobs' processes on its
GPUs, and its reboots. A reboot the controller asks for (its command writes the node's name in
``reboots``) is carried out here, single-threaded, between the timeline's events and while the
runner waits: every GPU of the node is reset and its agent starts again, with the GPUs the scenario
says it has after a reboot."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from bench.scenarios.spec import JobProcess, Scenario, Smi
from gpus.simulated import simulated_gpus
from tests.fakes.ib_sysfs import IbSysfs
from vigil.demo import Cluster, xid_line

if TYPE_CHECKING:
    from tests.fakes.kube_api import KubeApiServer

BOOT_SEQ = 900_000  # a line logged at a boot is numbered past every line the timeline writes


class Machines:
    def __init__(self, cluster: Cluster, scenario: Scenario, kube: KubeApiServer | None = None) -> None:
        self._kube = kube  # its Jobs on a node (a reset, a reboot) are run here, as a kubelet would
        self._jobs_run: set[str] = set()
        self._cluster = cluster
        self._scenario = scenario
        self._dir = cluster.workdir
        self._reboots = self._dir / "reboots"
        self._read = 0  # reboots carried out so far
        self._rebooted: set[str] = set()
        self._jobs: dict[tuple[str, int], int] = {}  # (node, GPU) -> the job's process id there
        self.reboot_command = [sys.executable, "-c", f"open({str(self._reboots)!r}, 'a').write('{{node}}\\n')"]

    def _smi_state(self, node: str) -> Path:
        return self._dir / f"{node}.smi.json"

    def write_agent_config(self, node: str, gpus: int) -> None:
        """The node's own agent configuration, where it needs one (InfiniBand, remedies)."""
        fleet, config = self._scenario.fleet, dict(self._scenario.agent)
        if fleet.infiniband:
            ib = IbSysfs(self._dir / "ib" / node)
            if not ib.port_dir("mlx5_0", 1).exists():  # a reboot keeps the node's HCA as it was
                ib.add_port("mlx5_0", 1, "0000:17:00.0")
            config |= {"ib_sysfs_root": str(ib.root), "ib_poll_s": 0.1}
        if fleet.remedies:
            sysfs = self._dir / f"{node}.sysfs"
            for gpu in simulated_gpus(node, gpus):
                (sysfs / f"{gpu.pci_bus_id}.0").mkdir(parents=True, exist_ok=True)
            smi = [sys.executable, "-m", "tests.fakes.nvidia_smi", "--node", node, "--gpus", str(gpus), "--faults",
                   str(self._cluster.fault_file(node)), "--state", str(self._smi_state(node)), "--sysfs", str(sysfs),
                   "--"]  # fmt: skip
            remedies = {"enabled": True, "nvidia_smi": smi, "pci_sysfs": str(sysfs)}
            self._proc(node).mkdir(exist_ok=True)
            config |= {"remedies": remedies, "jobs_scan_s": 0.5, "proc_root": str(self._proc(node))}
        if fleet.infiniband or fleet.remedies:
            path = self._cluster.agent_configs[node] = self._dir / f"{node}.agent.yaml"
            path.write_text(yaml.safe_dump(config))

    # Events ----------------------------------------------------------------------------------

    def _state(self, node: str) -> dict[str, object]:
        path = self._smi_state(node)
        loaded = json.loads(path.read_text()) if path.exists() else {}
        return loaded if isinstance(loaded, dict) else {}

    def _save(self, node: str, state: dict[str, object]) -> None:
        self._smi_state(node).write_text(json.dumps(state))

    def smi(self, node: str, smi: Smi) -> None:
        state = self._state(node)
        state.update(smi.model_dump(mode="json"))
        self._save(node, state)

    def job_process(self, node: str, job: JobProcess) -> None:
        """A job's process on the node: an entry in the node's own process tree (its agent's
        ``proc_root``, so that scenarios run side by side never see each other's) and in its
        nvidia-smi's list."""
        pid = 100_000 + job.gpu
        entry = self._proc(node) / str(pid)
        if job.running:
            entry.mkdir(parents=True, exist_ok=True)
            (entry / "environ").write_bytes(f"VIGIL_JOB_ID={job.job}\0VIGIL_NODE={node}\0".encode())
            self._jobs[(node, job.gpu)] = pid
        elif self._jobs.pop((node, job.gpu), None) is not None:
            shutil.rmtree(entry, ignore_errors=True)
        processes = [{"gpu": gpu, "pid": pid, "name": "python"} for (n, gpu), pid in self._jobs.items() if n == node]
        self._save(node, self._state(node) | {"processes": processes})

    def _proc(self, node: str) -> Path:
        return self._dir / f"{node}.proc"

    # Reboots, while the runner waits ---------------------------------------------------------

    def poll(self) -> None:
        """Carry out the reboots asked since the last look, and the Jobs created on nodes."""
        if self._kube is not None:
            self._kubelet(self._kube)
        if not self._reboots.exists():
            return
        asked = self._reboots.read_text().splitlines()
        for node in asked[self._read :]:
            self._reboot(node.strip())
        self._read = len(asked)

    def _reboot(self, node: str) -> None:
        gpus = self._scenario.fleet.after_reboot.get(node, self._scenario.fleet.gpus)
        for key in [k for k in self._jobs if k[0] == node]:  # a reboot ends every process on the node
            self._jobs.pop(key)
        shutil.rmtree(self._proc(node), ignore_errors=True)
        self._save(node, self._state(node) | {"processes": [], "gone": []})
        with open(self._cluster.fault_file(node), "a") as f:
            f.writelines(json.dumps({"gpu": g, "reset": True}) + "\n" for g in range(self._scenario.fleet.gpus))
        self._cluster.stop_agent(node)
        if (xid := self._scenario.fleet.xid_at_boot.get(node)) is not None:  # logged as the node boots
            bus = simulated_gpus(node, gpus)[xid.gpu].pci_bus_id
            with open(self._cluster.kernel_log(node), "a") as f:
                f.write(xid_line(bus, xid.xid, xid.message, BOOT_SEQ + self._read))
        self.write_agent_config(node, gpus)
        self._cluster.start_agent(node, gpus, restart=True)
        self._rebooted.add(node)

    def _kubelet(self, kube: KubeApiServer) -> None:
        """Run each new Job the controller created on a node: ``vigil remedy`` against the node's
        fake nvidia-smi (its result becomes the pod's termination message), or a reboot."""
        for job in kube.objects_of("jobs"):
            name, spec = job["metadata"]["name"], job["spec"]["template"]["spec"]
            if name in self._jobs_run:
                continue
            self._jobs_run.add(name)
            node, command = spec["nodeName"], list(spec["containers"][0]["command"])
            if "systemctl" in command:
                self._reboot(node)
                continue
            config = yaml.safe_load(self._cluster.agent_configs[node].read_text())["remedies"]
            args = command[command.index("remedy") + 1 :]
            args[args.index("--nvidia-smi") + 1] = " ".join(config["nvidia_smi"])
            result = self._dir / f"{name}.result"
            args[args.index("--result-file") + 1] = str(result)
            done = subprocess.run([sys.executable, "-m", "vigil", "remedy", *args, "--pci-sysfs", config["pci_sysfs"]],
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
            message = result.read_text() if result.exists() else done.stderr[-1000:]
            ended = {"terminated": {"exitCode": done.returncode, "message": message}}
            kube.add_pod(job["metadata"]["namespace"], f"{name}-pod", node, owner_kind="Job",
                         labels={"job-name": name}, phase="Succeeded" if done.returncode == 0 else "Failed",
                         container_statuses=[{"name": "remedy", "state": ended}])  # fmt: skip

    def check(self) -> None:
        """The runner's check while it waits: the reboots asked, then every process alive."""
        self.poll()
        self._cluster.check_alive()

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.poll()
            time.sleep(min(0.05, left))
        self.poll()

    # What was done to them -------------------------------------------------------------------

    def remedied(self) -> frozenset[str]:
        """Nodes that had a reset or a reboot carried out on them."""
        done = set(self._rebooted)
        for node in self._scenario.fleet.names:
            calls = Path(f"{self._smi_state(node)}.calls")
            if calls.exists() and any(json.loads(line)[:1] == ["-r"] for line in calls.read_text().splitlines()):
                done.add(node)
            if any((self._dir / f"{node}.sysfs").glob("*/reset_method")):
                done.add(node)
        return frozenset(done)

    def stop(self) -> None:
        self._jobs.clear()
