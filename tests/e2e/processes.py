"""Vigil processes for end-to-end tests: the real CLI in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpus.simulated import simulated_gpus
from tests.helpers import poll_until
from vigil.admin_client import AdminClient
from vigil.demo import simulated_agent_args, xid_line
from vigil.launch import command_line


def vigil(*args: str, out: Path, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``python -m vigil ARGS``; ``prefix`` runs it inside something (``ip netns exec NS``)."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "vigil", *args],
        stdout=open(out, "wb"),
        stderr=open(out.with_suffix(".log"), "wb"),
        stdin=subprocess.DEVNULL,
    )


def start_controller(tmp: Path, run: int, port: int = 0) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp / f"port{run}"
    proc = vigil(
        "controller",
        "--plaintext",
        "--port",
        str(port),
        "--port-file",
        str(port_file),
        "--database",
        str(tmp / "ctl.db"),
        "--log-format",
        "json",
        out=tmp / f"controller{run}.out",
    )
    poll_until(lambda: port_file.exists() or proc.poll() is not None, what="controller port")
    assert proc.poll() is None, (tmp / f"controller{run}.log").read_text()
    return proc, int(port_file.read_text())


def start_agent(
    tmp: Path,
    node: str,
    controller: str,
    spool: Path | None = None,
    prefix: Sequence[str] = (),
    restart: bool = False,
    config: Path | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    """A simulated-GPU agent tailing its own kmsg-format file (returned, for injecting lines); the file
    is made empty, unless the agent is ``restart``ed on the log it had."""
    kmsg = tmp / f"{node}.kmsg"
    if not restart:
        kmsg.write_text("")
    proc = vigil(
        *simulated_agent_args(node, controller, kmsg, spool or tmp / f"{node}.spool"),
        *(["--config", str(config)] if config is not None else []),
        out=tmp / f"{node}.out",
        prefix=prefix,
    )
    return proc, kmsg


def configured_controller(tmp: Path, name: str, **settings: Any) -> subprocess.Popen[bytes]:
    """``vigil controller --config NAME.yaml`` on loopback, its port file and database named after it."""
    config = {
        "listen": "127.0.0.1",
        "port": 0,
        "port_file": str(tmp / f"{name}.port"),
        "database": str(tmp / f"{name}.db"),
        "plaintext": True,
        **settings,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return vigil("controller", "--config", str(path), "--log-format", "json", out=tmp / f"{name}.out")


def port_of(tmp: Path, name: str) -> int:
    """The port a configured controller bound, once it writes it (a standby writes it when it leads);
    when it does not, what the controller said (its log's end) is the failure's message."""
    try:  # a loaded machine: 20 s and more
        poll_until(lambda: (tmp / f"{name}.port").exists(), 60, what=f"{name}'s port")
    except AssertionError:
        said = [p.read_text(errors="replace")[-2000:] for p in (tmp / f"{name}.out", tmp / f"{name}.log") if p.exists()]
        raise AssertionError(f"timed out waiting for {name}'s port; {name} said:\n" + "\n".join(said)) from None
    return int((tmp / f"{name}.port").read_text())


def fast_lease(identity: str) -> dict[str, Any]:
    """Leader election on a short Lease, so a test sees a take-over within seconds."""
    return {
        "enabled": True,
        "namespace": "vigil",
        "identity": identity,
        "lease_duration_s": 3,
        "renew_deadline_s": 2,
        "retry_period_s": 1,
    }


def stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process still running, then wait for each (SIGKILL after 10 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def json_lines(path: Path) -> list[dict[str, Any]]:
    """A process's JSON log lines (other lines, a traceback say, are left out)."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.startswith("{")]


@dataclass
class JobCluster:
    """A controller and simulated-GPU agents as processes, and training jobs under ``vigil launch``."""

    tmp: Path
    controller: str
    kmsg: dict[str, Path]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def launch(
        self,
        job_id: str,
        nodes: Sequence[str],
        job_args: Sequence[str],
        env: dict[str, str],
        module: str = "trainer_hooks.moe_job.train",
    ) -> subprocess.Popen[bytes]:
        """``vigil launch`` of a training module (the bundled job): ranks' logs in ranks/, its own in
        launch.log, the run (``--out``) in run/."""
        job = [sys.executable, "-m", module, "--out", str(self.tmp / "run"), *job_args]
        command = command_line(job_id, nodes, self.controller, self.tmp / "ranks", job)
        out = open(self.tmp / "launch.log", "wb")  # noqa: SIM115 (the child keeps it)
        return subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)

    def kernel_line(self, node: str, text: str) -> None:
        """A line of the node's kernel log, as dmesg prints it."""
        with open(self.kmsg[node], "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def xid(self, node: str, code: int = 79, text: str = "GPU has fallen off the bus.") -> None:
        """An XID line in the node's kernel log, on its third simulated GPU."""
        with open(self.kmsg[node], "a") as f:
            f.write(xid_line(simulated_gpus(node, 8)[2].pci_bus_id, code, text, 1))


@contextmanager
def job_cluster(tmp: Path, nodes: Sequence[str] = ("node-a", "node-b"), **settings: Any) -> Iterator[JobCluster]:
    """A configured controller ("ctl": ctl.log, ctl.out) and one agent per node, all registered."""
    ctl = configured_controller(tmp, "ctl", **settings)
    port = port_of(tmp, "ctl")
    cluster = JobCluster(tmp, f"127.0.0.1:{port}", {}, [ctl])
    for node in nodes:
        agent, cluster.kmsg[node] = start_agent(tmp, node, cluster.controller)
        cluster.procs.append(agent)
    try:
        with AdminClient(cluster.controller) as admin:
            poll_until(lambda: len(admin.status().nodes) == len(nodes), what="every agent registered")
        yield cluster
    finally:
        for proc in cluster.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in cluster.procs:
            proc.wait(10)


def sweep_pairs(target: str, *params: str, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    """``vigil sweep --checks pairs --json`` with ``-p`` parameters: its exit code and its summary."""
    command = [sys.executable, "-m", "vigil", "sweep", "--controller", target, "--checks", "pairs", "--json"]
    for param in params:
        command += ["-p", param]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.stdout.strip(), done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, summary
