"""A private Slurm cluster for the tests (Debian's ``slurmctld``, ``slurmd`` and ``slurm-client``
packages; not a double): Debian 12's Slurm 22.05 on this machine, or Debian 13's Slurm 24.11 with
``slurmrestd``, in a Debian 13 tree of its own (``NEW_SLURM``, made by ``.ci/run`` with
debootstrap) whose programs run under ``chroot``.

A generated ``slurm.conf`` names several nodes on this machine, each served by its own ``slurmd
-N NODE`` on a port of its own (Slurm's multiple-slurmd set-up), and one ``slurmctld``; all of them
keep their state, logs and sockets in a temporary directory and listen on free loopback ports, so
several clusters can run side by side. Authentication is ``auth/none`` (no munge daemon: the
cluster is reachable only from this machine, by whoever reads its ``slurm.conf``). ``SLURM_CONF``
points Slurm's commands at it. ``unavailable()`` says why it cannot run here, so tests skip with
the reason (``.ci/run`` installs the packages).

On 24.11 slurmctld also takes JWTs (``auth/jwt``, the key in the cluster's folder) and a
``slurmrestd`` listens on a loopback port, with a token for root in ``SlurmCluster.token_file``;
Slurm's commands run through small scripts in the cluster's ``bin`` folder that enter the tree.
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

from controller.act.slurm.client import Slurm, SlurmCommands
from controller.act.slurm.rest import SlurmRest
from tests.helpers import free_port

PROGRAMS = ("slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch")
COMMANDS = ("sinfo", "squeue", "scontrol", "sbatch", "scancel")  # wrapped for a cluster in NEW_SLURM
START_S = 30.0
NEW_SLURM = Path(os.environ.get("VIGIL_SLURM_24_11", "/opt/vigil-slurm-24.11"))
OLD, NEW = "22.05", "24.11"


def unavailable(version: str = OLD) -> str | None:
    """Why a private Slurm cluster of this version cannot be started here, or None."""
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users: needs root (CI runs as root)"
    if version == NEW:
        if not (NEW_SLURM / "usr/sbin/slurmrestd").exists():
            return f"needs Debian 13's Slurm 24.11 in {NEW_SLURM} (.ci/run makes it with debootstrap)"
        return None
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        packages = "Debian's slurmctld, slurmd and slurm-client packages"
        return f"needs {packages} ({', '.join(missing)} missing; .ci/run installs them)"
    return None


def _conf(
    root: Path, nodes: Sequence[str], ctld_port: int, node_ports: Sequence[int], extra: Sequence[str], version: str
) -> str:
    jwt = ["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={root}/jwt.key"] if version == NEW else []
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
        "MessageTimeout=30",  # a loaded test machine: slurmctld answers late, not never
        *jwt,
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
    root: Path  # its folder, as this machine sees it
    conf: Path  # its slurm.conf, as its programs see it (inside NEW_SLURM for 24.11)
    nodes: tuple[str, ...]
    version: str = OLD
    rest_url: str = ""  # slurmrestd's (24.11)
    via: str = "commands"  # how ``client`` reaches it: Slurm's commands, or slurmrestd (24.11)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def bin_dir(self) -> Path | None:
        """Where Slurm's commands for this cluster are (None: the PATH's)."""
        return self.root / "bin" if self.version == NEW else None

    @property
    def token_file(self) -> Path:
        """A JWT for root, for slurmrestd (24.11)."""
        return self.root / "token"

    def client(self, elsewhere: bool = False, timeout_s: float = 10.0) -> Slurm:
        """What the actuator reaches this cluster with (``via``); ``elsewhere``: the same, pointed at
        a slurmctld (or slurmrestd) that nobody runs."""
        if self.via == "slurmrestd":
            url = "http://127.0.0.1:9" if elsewhere else self.rest_url
            return SlurmRest(url, self.token_file, timeout_s=timeout_s)
        conf = self.root / "slurm.conf"
        if not elsewhere:
            return SlurmCommands(conf=None if self.bin_dir else conf, bin_dir=self.bin_dir, timeout_s=timeout_s)
        gone = self.root / "elsewhere"
        gone.mkdir(exist_ok=True)
        port = next(line for line in conf.read_text().splitlines() if line.startswith("SlurmctldPort="))
        (gone / "slurm.conf").write_text(conf.read_text().replace(port, "SlurmctldPort=9"))
        if self.version == OLD:
            return SlurmCommands(conf=gone / "slurm.conf", timeout_s=timeout_s)
        _wrappers(gone / "bin", self.conf.parent / "elsewhere" / "slurm.conf")
        return SlurmCommands(bin_dir=gone / "bin", timeout_s=timeout_s)

    def _argv(self, args: Sequence[str]) -> list[str]:
        return [str(self.bin_dir / args[0]), *args[1:]] if self.bin_dir and args[0] in COMMANDS else list(args)

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """One of Slurm's commands against this cluster, as a person would type it."""
        # In the cluster's folder: sbatch writes its jobs' output (slurm-JOBID.out) where it is run.
        done = subprocess.run(self._argv(args), env=self.env, cwd=self.root, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def node(self, name: str) -> dict[str, object]:
        """The node as Slurm's JSON shows it (``sinfo --json`` on 22.05, ``scontrol --json`` after)."""
        listing = ("sinfo", "--json") if self.version == OLD else ("scontrol", "--json", "show", "nodes")
        nodes = json.loads(self.command(*listing).stdout)["nodes"]
        (found,) = [n for n in nodes if n["name"] == name]
        return dict(found)

    def state(self, name: str) -> str:
        """``IDLE``, ``IDLE+DRAIN``, ``ALLOCATED+DRAIN``, ... (the base state, then its flags)."""
        n = self.node(name)
        raw = n["state"]
        base, *flags = raw if isinstance(raw, list) else [raw, *(n.get("state_flags") or [])]  # type: ignore[attr-defined]
        return "+".join([str(base).upper(), *sorted(str(f).upper() for f in flags)])

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
        states = [j["job_state"] for j in jobs if str(j["job_id"]) == job]
        state = states[0] if states else ""
        return str(state[0] if isinstance(state, list) else state)

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

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        if self.version == NEW:
            command = ["chroot", str(NEW_SLURM), *command]
        out = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps its own descriptor
        with out:
            self._procs[name] = subprocess.Popen(
                command, env={**self.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self) -> None:
        # Jobs first: a job's slurmstepd leaves slurmd's session, and outlives it unless its job ends.
        jobs = self.command("squeue", "-h", "-o", "%i", check=False).stdout.split() if self._procs else []
        if jobs:
            self.command("scancel", *jobs, check=False)
            with suppress(TimeoutError):
                self.wait(lambda: not self.command("squeue", "-h", "-o", "%i", check=False).stdout.split(), "", 10)
        for proc in self._procs.values():  # each daemon's session
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs.values():
            proc.wait(10)
        deadline = time.monotonic() + 10
        while (strays := self.strays()) and time.monotonic() < deadline:  # a job's slurmstepd and tasks
            for pid in strays:  # left the daemons' sessions: each on its own
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def strays(self) -> list[int]:
        """This cluster's processes still running (``SLURM_CONF`` names its slurm.conf)."""
        mine, found = f"SLURM_CONF={self.conf}".encode(), []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with suppress(OSError):
                    if mine in (entry / "environ").read_bytes().split(b"\0"):
                        found.append(int(entry.name))
        return found


@contextmanager
def slurm_cluster(
    nodes: Sequence[str] = ("gpu-01", "gpu-02", "gpu-03"), extra: Sequence[str] = (), version: str = OLD
) -> Iterator[SlurmCluster]:
    """A running cluster whose nodes are all IDLE, stopped and removed afterwards (``extra``: more
    slurm.conf lines, e.g. ``Prolog=...``); on 24.11 with slurmrestd too. A port found free and taken
    by someone else before a daemon bound it (other clusters start beside this one) is tried again
    with others."""
    for attempt in range(3):
        cluster = _cluster(nodes, extra, version)
        try:
            _start(cluster)
        except (TimeoutError, AssertionError):
            cluster.stop()
            taken = "Address already in use" in "".join(
                f.read_text(errors="replace") for f in cluster.root.glob("*.log")
            )
            shutil.rmtree(cluster.root, ignore_errors=True)
            if taken and attempt < 2:
                continue
            raise
        try:
            yield cluster
        finally:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
        return


def _cluster(nodes: Sequence[str], extra: Sequence[str], version: str) -> SlurmCluster:
    """Its folder and configuration, on free ports."""
    if version == NEW:
        _mount_proc()
        root = Path(tempfile.mkdtemp(prefix="vigil-slurm-", dir=NEW_SLURM / "tmp"))
        inside = Path("/") / root.relative_to(NEW_SLURM)  # the same folder, as the programs see it
        root.chmod(0o755)  # slurmrestd runs as nobody and reads slurm.conf
    else:
        root = inside = Path(tempfile.mkdtemp(prefix="vigil-slurm-"))
    (root / "state").mkdir()
    for node in nodes:
        (root / "spool" / node).mkdir(parents=True)
    ports = [free_port() for _ in nodes]
    (root / "slurm.conf").write_text(_conf(inside, nodes, free_port(), ports, extra, version))
    cluster = SlurmCluster(root, inside / "slurm.conf", tuple(nodes), version)
    if version == NEW:
        _new_slurm_files(cluster)
    return cluster


def _start(cluster: SlurmCluster) -> None:
    """Its daemons, until every node is IDLE (and slurmrestd listens, on 24.11)."""
    cluster._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(cluster.conf)])
    for node in cluster.nodes:
        cluster._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(cluster.conf)])

    def all_idle() -> bool:
        try:
            return all(cluster.state(n) == "IDLE" for n in cluster.nodes)
        except (AssertionError, ValueError, KeyError, subprocess.TimeoutExpired):
            return False

    cluster.wait(all_idle, "every node IDLE")
    if cluster.version == NEW:
        _start_slurmrestd(cluster)


def _mount_proc() -> None:
    """slurmd reads its jobs' processes from /proc: the tree's own, mounted once and left mounted
    (clusters of other test workers may be using it)."""
    proc = NEW_SLURM / "proc"
    if not os.path.ismount(proc):
        subprocess.run(["mount", "-t", "proc", "proc", str(proc)], check=False, capture_output=True)


def _new_slurm_files(cluster: SlurmCluster) -> None:
    """24.11's extra files: no cgroups in the tree (``cgroup.conf``), a JWT key, and the scripts that
    run Slurm's commands inside the tree."""
    (cluster.root / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
    key = cluster.root / "jwt.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    assert cluster.bin_dir is not None
    _wrappers(cluster.bin_dir, cluster.conf)


def _wrappers(bin_dir: Path, conf: Path) -> None:
    """Slurm's commands, each a script that runs it inside NEW_SLURM against ``conf`` (a path there)."""
    bin_dir.mkdir(exist_ok=True)
    for program in COMMANDS:
        script = bin_dir / program
        script.write_text(
            f'#!/bin/sh\nexec chroot {NEW_SLURM} /usr/bin/env --chdir={conf.parent} SLURM_CONF={conf} {program} "$@"\n'
        )
        script.chmod(0o755)


def _start_slurmrestd(cluster: SlurmCluster) -> None:
    port = free_port()
    cluster.rest_url = f"http://127.0.0.1:{port}"
    serve = ["slurmrestd", "-u", "nobody", "-g", "nogroup", "-a", "rest_auth/jwt", "-s", "openapi/slurmctld"]
    cluster._spawn("slurmrestd", [*serve, f"127.0.0.1:{port}"], env={"SLURM_JWT": "daemon"})
    token = cluster.command("scontrol", "token", "username=root", "lifespan=7200").stdout.strip()
    cluster.token_file.write_text(token + "\n")

    def answers() -> bool:
        import socket

        with suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    cluster.wait(answers, "slurmrestd listening")
