"""A private Slurm cluster for the tests (Debian's ``slurmctld``, ``slurmd`` and ``slurm-client``
packages, 22.05; not a double).

A generated ``slurm.conf`` names several nodes on this machine, each served by its own ``slurmd
-N NODE`` on a port of its own (Slurm's multiple-slurmd set-up), and one ``slurmctld``; all of them
keep their state, logs and sockets in a temporary directory and listen on free loopback ports, so
several clusters can run side by side. Authentication is ``auth/none`` (no munge daemon: the
cluster is reachable only from this machine, by whoever reads its ``slurm.conf``). ``SLURM_CONF``
points Slurm's commands at it. ``unavailable()`` says why it cannot run here, so tests skip with
the reason (``.ci/run`` installs the packages).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import free_port

PROGRAMS = ("slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch")
START_S = 30.0


def unavailable() -> str | None:
    """Why a private Slurm cluster cannot be started here, or None."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        packages = "Debian's slurmctld, slurmd and slurm-client packages"
        return f"needs {packages} ({', '.join(missing)} missing; .ci/run installs them)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users: needs root (CI runs as root)"
    return None


def _conf(root: Path, nodes: Sequence[str], ctld_port: int, node_ports: Sequence[int], extra: Sequence[str]) -> str:
    lines = [
        "ClusterName=vigiltest",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={node_ports[0]}",
        "AuthType=auth/none",
        "CredType=cred/none",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "MpiDefault=none",
        "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=2",
        *extra,
    ]
    for node, port in zip(nodes, node_ports, strict=True):
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=100 State=UNKNOWN"
        )
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: tuple[str, ...]
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """One of Slurm's commands against this cluster, as a person would type it."""
        # In the cluster's folder: sbatch writes its jobs' output (slurm-JOBID.out) where it is run.
        done = subprocess.run(list(args), env=self.env, cwd=self.root, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def node(self, name: str) -> dict[str, object]:
        """The node as ``sinfo --json`` shows it."""
        nodes = json.loads(self.command("sinfo", "--json").stdout)["nodes"]
        (found,) = [n for n in nodes if n["name"] == name]
        return dict(found)

    def state(self, name: str) -> str:
        """``IDLE``, ``IDLE+DRAIN``, ``ALLOCATED+DRAIN``, ... (the base state, then its flags)."""
        n = self.node(name)
        return "+".join([str(n["state"]).upper(), *sorted(str(f).upper() for f in n.get("state_flags") or [])])

    def reason(self, name: str) -> str:
        return str(self.node(name).get("reason") or "")

    def drain(self, name: str, reason: str) -> None:
        """A drain by someone else than Vigil (a person, NHC)."""
        self.command("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def submit(self, nodes: Sequence[str], script: str = "sleep 300") -> str:
        """``sbatch`` a job on exactly these nodes; returns its id once it runs."""
        done = self.command("sbatch", "--parsable", "-N", str(len(nodes)), "-w", ",".join(nodes), "--wrap", script)
        job = done.stdout.strip().split(";")[0]
        self.wait(lambda: self.job_state(job) == "RUNNING", f"job {job} running")
        return job

    def job_state(self, job: str) -> str:
        jobs = json.loads(self.command("squeue", "--json").stdout)["jobs"]
        return next((str(j["job_state"]) for j in jobs if str(j["job_id"]) == job), "")

    def cancel(self, job: str) -> None:
        self.command("scancel", job)

    def wait(self, ready: object, what: str, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(ready) and ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"Slurm: {what} not within {timeout:g} s ({self._logs()})")

    def _logs(self) -> str:
        log = self.root / "slurmctld.log"
        return log.read_text(errors="replace")[-800:] if log.exists() else "no slurmctld log"

    def _spawn(self, name: str, command: list[str]) -> None:
        out = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps its own descriptor
        with out:
            self._procs[name] = subprocess.Popen(
                command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self) -> None:
        for proc in self._procs.values():  # each daemon's session: slurmstepd and the jobs' tasks too
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs.values():
            proc.wait(10)


@contextmanager
def slurm_cluster(
    nodes: Sequence[str] = ("gpu-01", "gpu-02", "gpu-03"), extra: Sequence[str] = ()
) -> Iterator[SlurmCluster]:
    """A running cluster whose nodes are all IDLE, stopped and removed afterwards (``extra``: more
    slurm.conf lines, e.g. ``Prolog=...``)."""
    root = Path(tempfile.mkdtemp(prefix="vigil-slurm-"))
    (root / "state").mkdir()
    for node in nodes:
        (root / "spool" / node).mkdir(parents=True)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, nodes, free_port(), [free_port() for _ in nodes], extra))
    cluster = SlurmCluster(root, conf, tuple(nodes))
    try:
        cluster._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])
        for node in nodes:
            cluster._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(conf)])

        def all_idle() -> bool:
            try:
                return all(cluster.state(n) == "IDLE" for n in nodes)
            except (AssertionError, ValueError, KeyError, subprocess.TimeoutExpired):
                return False

        cluster.wait(all_idle, "every node IDLE")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
