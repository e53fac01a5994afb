"""``vigil demo``: Vigil's main job on one machine.

Starts a controller and N agents as separate processes (simulated GPUs, a kmsg-format kernel log
per node), waits until every node reports, writes a real-format XID 79 line into one node's kernel
log, and follows the fault through the system: observed by the agent, received by the controller,
incident opened, node quarantined, person paged. Exits 0 only when exactly the faulted node was
quarantined and paged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from rich.console import Console

from gpus.simulated import simulated_gpus
from protos.vigil.v1 import admin_pb2
from vigil.admin_client import AdminClient

T = TypeVar("T")


class DemoFailed(Exception):
    pass


@dataclass
class Cluster:
    workdir: Path
    nodes: list[str]
    gpus: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    port: int = 0
    agent_config: Path | None = None  # every agent's --config
    agent_configs: dict[str, Path] = field(default_factory=dict)  # a node's own --config, if it has one
    env: dict[str, str] = field(default_factory=dict)  # added to every process's environment
    host: str = "127.0.0.1"  # where the controller listens (its config's listen) and the agents dial
    prefixes: dict[str, list[str]] = field(default_factory=dict)  # a node's command prefix (ip netns exec ...)
    relays: int = 0  # agents reach the controller through this many `vigil relay`s: node i through i mod relays
    relay_ports: dict[int, int] = field(default_factory=dict)  # each relay's, kept across its restarts
    _holding: list[tuple[threading.Event, threading.Thread]] = field(default_factory=list)

    def kernel_log(self, node: str) -> Path:
        return self.workdir / f"{node}.kmsg"

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        # The child keeps its own copies of the descriptors; ours can close at once.
        with open(self.workdir / f"{name}.out", "ab") as out, open(self.workdir / f"{name}.log", "ab") as err:
            self.procs[name] = subprocess.Popen(
                [*self.prefixes.get(name, []), sys.executable, "-m", "vigil", *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
            )

    def start_controller(self, timeout: float, config: Path | None = None) -> None:
        """Start the controller; again after ``stop_controller``: on the same database and port."""
        port_file = self.workdir / "controller.port"
        port_file.unlink(missing_ok=True)
        self._spawn(
            "controller",
            [
                "controller",
                "--plaintext",  # the demo runs on loopback; a cluster uses mutual TLS (vigil certs)
                *(["--config", str(config)] if config else []),
                "--port",
                str(self.port),
                "--port-file",
                str(port_file),
                "--database",
                str(self.workdir / "controller.db"),
                "--log-format",
                "json",
            ],
        )
        self.port = int(
            wait_for(
                lambda: port_file.read_text() if port_file.exists() else None,
                timeout,
                "the controller to listen",
                self.check_alive,
            )
        )

    def start_relays(self, timeout: float) -> None:
        for relay in range(self.relays):
            self.start_relay(relay, timeout)

    def start_relay(self, relay: int, timeout: float) -> None:
        """Start a relay in front of the controller; again after ``stop_relay``: on the same port.
        It is up once it has reached the controller."""
        port_file = self.workdir / f"relay-{relay}.port"
        port_file.unlink(missing_ok=True)
        listen = f"{self.host}:{self.relay_ports.get(relay, 0)}"
        args = ["relay", "--plaintext", "--controller", self.target, "--listen", listen, "--port-file", str(port_file)]
        self._spawn(f"relay-{relay}", [*args, "--log-format", "json"])
        found = wait_for(
            lambda: port_file.read_text() if port_file.exists() else None, timeout, "the relay", self.check_alive
        )
        self.relay_ports[relay] = int(found)

    def stop_relay(self, relay: int, kill: bool = False) -> None:
        self._stop(f"relay-{relay}", kill)

    def agent_target(self, node: str) -> str:
        """Where a node's agent dials: the controller, or its relay."""
        if not self.relays:
            return self.target
        return f"{self.host}:{self.relay_ports[self.nodes.index(node) % self.relays]}"

    def fault_file(self, node: str) -> Path:
        """The node's simulated GPUs read faults from this file as it grows (``gpus.simulated``)."""
        return self.workdir / f"{node}.faults"

    def start_agents(self) -> None:
        for node in self.nodes:
            self.start_agent(node)

    def start_agent(self, node: str, gpus: int | None = None, restart: bool = False) -> None:
        """Start a node's agent; ``restart``: again, after it stopped, on the kernel log and spool it had
        (``gpus``: the node comes back with this many GPUs)."""
        log = self.kernel_log(node)
        if not restart:
            log.write_text("".join(_boot_lines(node, self.gpus)))
        spool = self.workdir / f"{node}.spool.db"
        args = simulated_agent_args(node, self.agent_target(node), log, spool, gpus or self.gpus, self.fault_file(node))
        config = self.agent_configs.get(node, self.agent_config)
        self._spawn(node, [*args, *(["--config", str(config)] if config else [])])

    def stop_controller(self, kill: bool = False) -> None:
        self._stop("controller", kill)

    def stop_agent(self, node: str, kill: bool = False) -> None:
        self._stop(node, kill)

    def freeze_agent(self, node: str) -> None:
        """SIGSTOP: the agent's process and its connection stay, and nothing in it answers (a
        stuck agent, a frozen node's userspace); ``stop`` wakes it to end it."""
        self.procs[node].send_signal(signal.SIGSTOP)

    def pause(self, name: str, seconds: float) -> None:
        """SIGSTOP, then SIGCONT after ``seconds``: the process held whole (its event loop, its
        sockets unread), as a long garbage collection or a paused VM holds it."""
        self.procs[name].send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.procs[name].send_signal(signal.SIGCONT)

    def hold_again_and_again(self, name: str, seconds: float, every_s: float) -> None:
        """In the background until ``stop``: the process held ``seconds`` (``pause``) at the start
        of every ``every_s``, as sustained load holds a process's event loop late, tick after tick."""
        done = threading.Event()

        def hold() -> None:
            while not done.is_set() and (proc := self.procs.get(name)) is not None and proc.poll() is None:
                proc.send_signal(signal.SIGSTOP)
                try:
                    done.wait(seconds)
                finally:
                    proc.send_signal(signal.SIGCONT)
                done.wait(every_s - seconds)

        thread = threading.Thread(target=hold, name=f"hold-{name}", daemon=True)
        thread.start()
        self._holding.append((done, thread))

    def _stop(self, name: str, kill: bool) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text()[-2000:]
                raise DemoFailed(f"{name} exited with code {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for done, thread in self._holding:  # each one lets its process go on before it ends
            done.set()
            thread.join()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a frozen agent must run to end
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    check: Callable[[], None] = lambda: None,
    every: float = 0.01,
) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check()
        try:
            value = probe()
        except grpc.RpcError:
            value = None
        if value:
            return value
        time.sleep(every)
    raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")


def _boot_lines(node: str, gpus: int) -> list[str]:
    """What a node's kernel log holds before the fault: the driver announcing each GPU."""
    lines = ["6,1000,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"]
    for i, gpu in enumerate(simulated_gpus(node, gpus)):
        lines.append(f"6,{1001 + i},{5100000 + i * 1000},-;NVRM: GPU at PCI:{gpu.pci_bus_id}: {gpu.uuid}\n")
    return lines


def simulated_agent_args(
    node: str, controller: str, kernel_log: Path, spool: Path, gpus: int = 8, faults: Path | None = None
) -> list[str]:
    """``vigil`` arguments for a local agent: simulated GPUs (``faults``: their fault file), a
    kmsg-format file for its kernel log, plaintext to a loopback controller, JSON logs, any free
    metrics port."""
    return [
        "agent", "--plaintext", "--node", node, "--controller", controller, "--kernel-log", str(kernel_log),
        "--spool", str(spool), "--gpu-backend", "simulated", "--simulated-gpus", str(gpus),
        "--metrics-port", "0", "--log-format", "json",
        *(["--simulated-faults", str(faults)] if faults is not None else []),
    ]  # fmt: skip


def xid_line(pci_bus_id: str, code: int, detail: str, seq: int) -> str:
    uptime_us = int(time.monotonic() * 1e6)
    return f"3,{seq},{uptime_us},-;NVRM: Xid (PCI:{pci_bus_id}): {code}, pid=0, {detail}\n"


def run_demo(nodes: int = 4, gpus: int = 8, as_json: bool = False, keep: bool = False, timeout: float = 30.0) -> int:
    console = Console(stderr=as_json, quiet=as_json)
    workdir = Path(tempfile.mkdtemp(prefix="vigil-demo-"))
    cluster = Cluster(workdir, [f"node-{i + 1}" for i in range(nodes)], gpus)
    victim = cluster.nodes[1]
    victim_gpu = simulated_gpus(victim, gpus)[min(3, gpus - 1)]
    started = time.monotonic()
    summary: dict[str, Any] = {
        "ok": False,
        "nodes": nodes,
        "gpus_per_node": gpus,
        "faulted_node": victim,
        "faulted_gpu": victim_gpu.index,
        "workdir": str(workdir) if keep else None,
    }
    with demo_run(cluster, summary, console, keep):
        console.print(f"[bold]Vigil demo[/]: {nodes} nodes × {gpus} simulated GPUs, one controller, on this machine")
        cluster.start_controller(timeout)
        console.print(f"  controller listening on 127.0.0.1:{cluster.port}   ({time.monotonic() - started:.2f} s)")
        cluster.start_agents()
        with AdminClient(f"127.0.0.1:{cluster.port}", plaintext=True) as admin:
            wait_for(
                lambda: _all_healthy(admin, cluster.nodes), timeout, "every agent to register", cluster.check_alive
            )
            console.print(f"  {nodes} agents connected, all nodes HEALTHY   ({time.monotonic() - started:.2f} s)")
            line = xid_line(victim_gpu.pci_bus_id, 79, "GPU has fallen off the bus.", 2000)
            console.print(f"\n[bold]Injecting[/] into {victim}'s kernel log:\n  {line.strip()}\n")
            injected_at = time.time()
            with open(cluster.kernel_log(victim), "a") as f:
                f.write(line)
            incident = wait_for(
                lambda: _acted_on(admin, victim), timeout, f"Vigil to act on {victim}", cluster.check_alive
            )
            time.sleep(0.5)  # let any wrong action on another node show itself
            final = {n.node: n.health for n in admin.status().nodes}
            others = admin.incidents()
        summary.update(_summarise(incident, injected_at, final, [i for i in others if i.node != victim]))
        summary["page_text"] = (workdir / "controller.out").read_text().strip()
        summary["wall_s"] = round(time.monotonic() - started, 2)
        _print_timeline(console, summary)
    return finish(summary, as_json)


@contextmanager
def demo_run(cluster: Cluster, summary: dict[str, Any], console: Console, keep: bool) -> Iterator[None]:
    """Around a demo's body: a DemoFailed is said and recorded in the summary; the cluster always
    stops, and its working directory goes unless kept."""
    try:
        yield
    except DemoFailed as exc:
        summary["error"] = str(exc)
        console.print(f"[red]demo failed:[/] {exc}")
    finally:
        cluster.stop()
        if not keep:
            shutil.rmtree(cluster.workdir, ignore_errors=True)


def finish(summary: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


def _all_healthy(admin: AdminClient, nodes: list[str]) -> bool:
    health = {n.node: n.health for n in admin.status().nodes}
    return all(health.get(n) == "HEALTHY" for n in nodes)


def _acted_on(admin: AdminClient, node: str) -> admin_pb2.Incident | None:
    for incident in admin.incidents(node=node):
        done = {a.kind.split(":")[0] for a in incident.actions if a.status == "DONE"}
        if {"QUARANTINE", "PAGE"} <= done:
            return incident
    return None


def _summarise(
    incident: admin_pb2.Incident, injected_at: float, health: dict[str, str], other_incidents: list[admin_pb2.Incident]
) -> dict[str, Any]:
    done = {a.kind.split(":")[0]: a.done_at for a in incident.actions if not a.kind.startswith("NOTE:")}
    stamps = {
        "observed": incident.first_observed_at,
        "received": incident.received_at,
        "incident_opened": incident.opened_at,
        "quarantined": done["QUARANTINE"],
        "paged": done["PAGE"],
    }
    latencies = {k: round(v - injected_at, 4) for k, v in stamps.items()}
    quarantined = sorted(n for n, h in health.items() if h == "QUARANTINED")
    victim = incident.node
    ok = (
        quarantined == [victim]
        and incident.code == 79
        and not other_incidents
        and all(h == "HEALTHY" for n, h in health.items() if n != victim)
    )
    return {
        "ok": ok,
        "incident_id": incident.id,
        "xid": incident.code,
        "reason": incident.reason,
        "remedy": incident.remedy,
        "quarantined_nodes": quarantined,
        "node_health": health,
        "latency_s": latencies,
        "fault_to_quarantine_s": latencies["quarantined"],
        "fault_to_page_s": latencies["paged"],
        "incidents_on_other_nodes": len(other_incidents),
    }


def _print_timeline(console: Console, s: dict[str, Any]) -> None:
    lat = s["latency_s"]
    rows = [
        ("injected", 0.0, f"XID 79 line written to {s['faulted_node']}'s kernel log (GPU {s['faulted_gpu']})"),
        ("observed", lat["observed"], f"agent on {s['faulted_node']} parsed the line, spooled the signal"),
        ("received", lat["received"], "controller stored the signal and acknowledged it"),
        ("incident", lat["incident_opened"], f"incident {s['incident_id']} opened: {s['reason']}"),
        ("quarantined", lat["quarantined"], f"{s['faulted_node']} quarantined (local actuator)"),
        ("paged", lat["paged"], "on-call paged (console pager)"),
    ]
    console.print("[bold]Timeline[/] (seconds after the fault)")
    for name, t, text in rows:
        console.print(f"  +{t:7.3f}s  {name:<12} {text}")
    console.print(f"\n[bold]Page sent[/]:\n{s['page_text']}\n")
    verdict = "[green]OK[/]" if s["ok"] else "[red]UNEXPECTED OUTCOME[/]"
    console.print(
        f"[bold]Summary[/]: {verdict}: quarantined {', '.join(s['quarantined_nodes']) or 'nothing'}; "
        f"fault → quarantine {s['fault_to_quarantine_s'] * 1000:.0f} ms, "
        f"fault → page {s['fault_to_page_s'] * 1000:.0f} ms; other nodes: "
        + ", ".join(f"{n} {h}" for n, h in s["node_health"].items() if n != s["faulted_node"])
    )
    console.print(f"  demo wall time {s['wall_s']:.1f} s")
