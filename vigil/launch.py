"""``vigil launch``: start a training job's ranks on this machine, and start it again when it stops.

    vigil launch --job-id moe --nodes node-1,node-2 --nproc-per-node 2 --controller 127.0.0.1:7070 \\
        -- python -m trainer_hooks.moe_job.train --preset debug --out runs/moe

Each "node" is a name the ranks carry (VIGIL_NODE): on one machine they are simulated nodes, which
is what the demo and the tests use; on a cluster the same job runs as a Kubernetes Job instead
(``deploy/training-job.example.yaml``). Every rank gets the variables torchrun sets (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and Vigil's hook
settings (VIGIL_JOB_ID, VIGIL_CONTROLLER, VIGIL_NODE, VIGIL_RESTART_COUNT).

How a start ends, and what happens next:
- every rank exits 0: the job is done, and so is the launcher (exit 0);
- the ranks exit with the checkpoint code (75): the job stopped on request. The launcher asks the
  controller for its plan (``Plan``): which nodes to leave out, and to wait while the controller
  sweeps the remaining ones; then it starts the job again on the nodes left;
- the controller's CHECKPOINT_AND_RESTART deadline passes with ranks still running (a dead node
  hangs collectives; a hung job, whose deadline is short since it cannot save): the launcher aborts
  them all (SIGTERM, then SIGKILL after ``term_grace_s``), and the job restarts from its last
  committed checkpoint, as above;
- a rank fails (any other exit): the others would hang in their next collective, so they are
  aborted after ``kill_grace_s``; the job restarts, up to ``max_failures`` times.
An unreachable controller never stops the launcher: it restarts with what it knows.

While the job runs, when the controller finds it hung (its Plan reply wants the stacks), the
launcher asks each rank whose hook listens (VIGIL_STACKS_DIR: its ``rankN.txt`` is there) for every
thread's stack with SIGUSR2, waits up to ``stacks_wait_s`` for them, and sends them with its next
Plan, each with its main thread's state and kernel wait from /proc (a read in C leaves no Python
frame; the kernel says it): a rank that does not answer is stopped or frozen. Nothing is killed for it.

A launcher that is stopped (SIGTERM: its pod or its Slurm job ends; SIGINT; SIGHUP) passes the stop
on, as torchrun does: SIGTERM to every rank (the bundled job saves a checkpoint and exits), SIGKILL
to those left after ``stop_grace_s``; then it removes what it made for the start and exits 128 plus
the signal's number. Never ranks left running with nobody to start them again, or abort them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import grpc
import structlog

from protos.vigil.v1 import trainer_pb2, trainer_pb2_grpc
from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE
from vigil_core.ports import port_block
from vigil_core.rpc_errors import explain, is_refused
from vigil_core.tls import TlsFiles, channel

log = structlog.get_logger(__name__)


class Ended(StrEnum):
    FINISHED = "finished"
    CHECKPOINTED = "checkpointed"
    KILLED_AFTER_DEADLINE = "killed after the deadline"
    FAILED = "failed"
    STOPPED = "stopped with the launcher"


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class LaunchConfig:
    job_id: str
    nodes: tuple[str, ...]
    command: tuple[str, ...]
    nproc_per_node: int = 1
    controller: str = ""
    max_failures: int = 3
    log_dir: Path | None = None
    poll_s: float = 1.0
    plan_wait_s: float = 900.0
    kill_grace_s: float = 10.0
    term_grace_s: float = 5.0  # between SIGTERM and SIGKILL, when the launcher aborts the ranks
    # Between SIGTERM and SIGKILL when the launcher itself is stopped: time for the ranks to save (a
    # Kubernetes pod is given 30 s by default before its processes are killed)
    stop_grace_s: float = 25.0
    rpc_timeout_s: float = 2.0
    stacks_wait_s: float = 2.0  # for the ranks' stacks, when the controller wants them (a hang)
    tls: TlsFiles | None = None  # the launcher's certificate (trainer: or admin:); None: plaintext
    slurm: bool = False  # each start one srun step over the nodes left (vigil.launch_slurm)


@dataclass
class Start:
    number: int
    nodes: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ranks: list[tuple[int, str]] = field(default_factory=list)  # (rank, node) of each process
    stacks_dir: Path | None = None
    stacks_sent: bool = False  # once per start: the controller asks again only for a new hang
    termed_at: float = 0.0  # when the launcher sent its ranks SIGTERM (monotonic; 0: not yet)
    hurried: bool = False  # the launcher was stopped twice: its ranks killed without a grace


def torchrun_env(
    rank: int, local_rank: int, world: int, local_world: int, group_rank: int, port: str
) -> dict[str, str]:
    """What torchrun tells each rank, for a rendezvous on this machine."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group_rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }


# What the demo and the tests give a launcher's ranks to save once it is stopped: they stop it with
# SIGTERM and SIGKILL it 10 s later, so it must be done with its ranks, and have cleaned up, by then.
LOCAL_STOP_GRACE_S = 5.0


def command_line(job_id: str, nodes: Sequence[str], controller: str, log_dir: Path, job: Sequence[str]) -> list[str]:
    """``vigil launch`` of ``job`` (a command) with this Python, JSON logs; for the demo and the tests."""
    return [
        sys.executable, "-m", "vigil", "launch", "--job-id", job_id, "--nodes", ",".join(nodes),
        "--controller", controller, "--log-dir", str(log_dir), "--log-format", "json",
        "--stop-grace-s", str(LOCAL_STOP_GRACE_S), "--", *job,
    ]  # fmt: skip


STACKS_BYTES = 32768  # of one rank's dump: the innermost frames are at the top of each thread


def _settled(path: Path) -> bool:
    """A dump is there and has stopped growing (faulthandler writes it in one go from C)."""
    try:
        size = path.stat().st_size
        time.sleep(0.02)
        return size > 0 and path.stat().st_size == size
    except OSError:
        return False


def _read(path: Path) -> str:
    try:
        with path.open("rb") as f:
            return f.read(STACKS_BYTES).decode(errors="replace")
    except OSError:
        return ""


def _fr(stacks: Path) -> Path:
    """Where a rank's hook writes its collective state, beside its stacks."""
    return stacks.with_name(stacks.name.replace(".txt", ".fr.json"))


def collectives_in(path: Path) -> list[trainer_pb2.Collective]:
    """A rank's collective state as its hook wrote it (``trainer_hooks.collectives``); [] where there is
    none or it is not what the hook writes."""
    try:
        rows = json.loads(path.read_bytes()[:STACKS_BYTES])
        return [
            trainer_pb2.Collective(
                group=str(r["group"])[:128], seq=int(r["seq"]), op=str(r["op"])[:64], completed=bool(r["completed"])
            )  # fmt: skip
            for r in rows[:16]
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def kernel_view(pid: int) -> dict[str, str]:
    """The rank's main thread as the kernel sees it: its state letter and the function it waits in
    (``/proc/PID/stat``, ``/proc/PID/wchan``); empty where /proc does not say (not Linux, gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return {}
    state = stat.rsplit(")", 1)[-1].split()[:1]  # after the command's name, which may hold spaces
    return {"state": state[0] if state else "", "kernel_wait": "" if wchan == "0" else wchan}


def _remove(start: Start) -> None:
    """A start's stacks directory, removed (its ranks write there only when the launcher asks)."""
    if start.stacks_dir is not None:
        shutil.rmtree(start.stacks_dir, ignore_errors=True)


def exit_code_for(signum: int) -> int:
    """What a launcher stopped by ``signum`` exits with: 128 plus its number, as a shell says it. Pure."""
    return 128 + signum


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[int], None]) -> Iterator[None]:
    """While inside: ``STOP_SIGNALS`` call ``stop`` with their number instead of ending the process
    (whose ranks would run on with nobody to watch them); the handlers before are put back after.
    Only the main thread can take signals: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda number, _frame: stop(number))
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def ended(codes: list[int]) -> Ended:
    """How a start ended, from its ranks' exit codes. Pure."""
    if all(c == 0 for c in codes):
        return Ended.FINISHED
    if all(c in (0, CHECKPOINTED_EXIT_CODE) for c in codes):
        return Ended.CHECKPOINTED
    return Ended.FAILED


class Launcher:
    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.excluded: set[str] = set()
        self._channel = channel(config.controller, config.tls) if config.controller else None
        self._stub = trainer_pb2_grpc.TrainerGatewayStub(self._channel) if self._channel else None
        self._reachable = True
        self._stopped_by = 0  # the signal that stopped the launcher (0: none)
        self._hurried = False  # stopped twice: no grace left

    def stop(self, signum: int) -> None:
        """Stop the job and the launcher (what a stop signal calls): the ranks are told SIGTERM at the
        next turn of the supervising loop, and nothing starts again; a second stop kills those left
        at once (an operator who will not wait for a save)."""
        if self._stopped_by:
            self._hurried = True
        self._stopped_by = self._stopped_by or signum

    def run(self) -> int:
        with stop_on_signals(self.stop):
            return self._run()

    def _run(self) -> int:
        cfg, failures, number = self.config, 0, 0
        self._plan(list(cfg.nodes), stopped=False)  # never start on a node already out of service
        while not self._stopped_by:
            nodes = [n for n in cfg.nodes if n not in self.excluded]
            if not nodes:
                log.error("launch_no_nodes_left", job=cfg.job_id, excluded=sorted(self.excluded))
                return 1
            # The rendezvous port, below the kernel's ephemeral range: a port free now inside it may be
            # any outgoing connection's before rank 0 binds it (a start failed for nothing).
            with port_block(1) as port:
                start = self._spawn(number, nodes, str(port))
                try:
                    how, codes = self._supervise(start)
                finally:  # however it ended (a bug too): no rank left running, nothing left behind
                    self._end(start)
            log.info("job_start_ended", job=cfg.job_id, start=number, how=how.value, exit_codes=codes)
            if how is Ended.FINISHED:
                return 0
            if how is Ended.FAILED:
                failures += 1
                if failures > cfg.max_failures:
                    log.error("launch_gave_up", job=cfg.job_id, failures=failures)
                    return next((c for c in codes if c not in (0, CHECKPOINTED_EXIT_CODE)), 1) or 1
            if how is not Ended.STOPPED:
                self._wait_for_plan(nodes)
            number += 1
        log.warning("launch_stopped", job=cfg.job_id, signal=signal.Signals(self._stopped_by).name)
        return exit_code_for(self._stopped_by)

    # One start -----------------------------------------------------------------------------

    def _spawn(self, number: int, nodes: list[str], port: str) -> Start:
        if self.config.slurm:
            return self._srun(number, nodes, port)
        cfg = self.config
        start = Start(number, nodes)
        start.stacks_dir = Path(tempfile.mkdtemp(prefix=f"vigil-stacks-{cfg.job_id}-{number}-"))
        world = len(nodes) * cfg.nproc_per_node
        log.info("job_starting", job=cfg.job_id, start=number, nodes=nodes, world_size=world)
        for group_rank, node in enumerate(nodes):
            for local in range(cfg.nproc_per_node):
                rank = group_rank * cfg.nproc_per_node + local
                env = {
                    **os.environ,
                    **torchrun_env(rank, local, world, cfg.nproc_per_node, group_rank, port),
                    "VIGIL_JOB_ID": cfg.job_id,
                    "VIGIL_CONTROLLER": cfg.controller,
                    "VIGIL_NODE": node,
                    "VIGIL_RESTART_COUNT": str(number),
                    "VIGIL_STACKS_DIR": str(start.stacks_dir),
                    # PyTorch's flight recorder (gloo's and NCCL's collectives), read in a hang
                    "TORCH_FR_BUFFER_SIZE": os.environ.get("TORCH_FR_BUFFER_SIZE", "2000"),
                }
                out: int | None = None
                if cfg.log_dir is not None:
                    cfg.log_dir.mkdir(parents=True, exist_ok=True)
                    out = os.open(cfg.log_dir / f"{node}-rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                try:
                    start.procs.append(subprocess.Popen(list(cfg.command), env=env, stdout=out, stderr=out))
                    start.ranks.append((rank, node))
                finally:
                    if out is not None:
                        os.close(out)  # the child keeps its own copy
        return start

    def _srun(self, number: int, nodes: list[str], port: str) -> Start:
        """One srun step over ``nodes``: its ranks' exit codes come back as srun's own (the highest)."""
        from vigil.launch_slurm import address_of, srun_command

        cfg, start = self.config, Start(number, nodes)
        env = {
            **os.environ,
            "MASTER_ADDR": address_of(nodes[0]),
            "MASTER_PORT": port,  # on nodes[0]: below its ephemeral range too, though not checked free there
            "VIGIL_JOB_ID": cfg.job_id,
            "VIGIL_CONTROLLER": cfg.controller,
            "VIGIL_RESTART_COUNT": str(number),
            "TORCH_FR_BUFFER_SIZE": os.environ.get("TORCH_FR_BUFFER_SIZE", "2000"),
        }
        command = srun_command(nodes, cfg.nproc_per_node, cfg.command, sys.executable)
        log.info("job_starting", job=cfg.job_id, start=number, nodes=nodes, world_size=len(nodes) * cfg.nproc_per_node)
        out: int | None = None
        if cfg.log_dir is not None:
            cfg.log_dir.mkdir(parents=True, exist_ok=True)
            out = os.open(cfg.log_dir / f"step{number}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            start.procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=out))
        finally:
            if out is not None:
                os.close(out)
        return start

    def _supervise(self, start: Start) -> tuple[Ended, list[int]]:
        cfg, deadline, killed = self.config, 0.0, False
        first_failure_at: float | None = None
        next_plan = time.monotonic() + cfg.poll_s
        stacks: list[trainer_pb2.RankStacks] = []
        while True:
            codes = [p.poll() for p in start.procs]
            if all(c is not None for c in codes):
                done = [c for c in codes if c is not None]
                if self._stopped_by:
                    return Ended.STOPPED, done
                return (Ended.KILLED_AFTER_DEADLINE if killed else ended(done)), done
            if self._stopped_by:  # the launcher is stopped: its ranks with it, given time to save
                grace_s = 0.0 if self._hurried else cfg.stop_grace_s
                if not start.termed_at or (self._hurried and not start.hurried):
                    start.hurried = self._hurried
                    log.warning("launch_stopping", job=cfg.job_id, start=start.number, kill_in_s=grace_s,
                                signal=signal.Signals(self._stopped_by).name)  # fmt: skip
                    _remove(start)  # nothing more is asked of the ranks: gone even if the launcher is killed now
                self._kill(start, grace_s)
                time.sleep(0.1)
                continue
            if first_failure_at is None and any(c not in (None, 0, CHECKPOINTED_EXIT_CODE) for c in codes):
                first_failure_at = time.monotonic()
                log.warning("rank_failed", job=cfg.job_id, exit_codes=codes, kill_others_in_s=cfg.kill_grace_s)
            if first_failure_at is not None and time.monotonic() - first_failure_at > cfg.kill_grace_s:
                self._kill(start)
            if time.monotonic() >= next_plan:
                next_plan = time.monotonic() + cfg.poll_s
                reply = self._plan(start.nodes, stopped=False, stacks=stacks)
                stacks = []
                if reply is not None and reply.want_stacks and not start.stacks_sent:
                    stacks, start.stacks_sent = self._stacks(start), True
                    next_plan = time.monotonic()  # sent at once
                for command in reply.commands if reply else []:
                    if command.HasField("checkpoint_and_restart"):
                        deadline = command.checkpoint_and_restart.deadline
                if deadline and time.time() > deadline and not killed:
                    log.warning("job_deadline_passed_killing", job=cfg.job_id, start=start.number)
                    killed = True
            if killed:
                self._kill(start)
            time.sleep(0.1)

    def _stacks(self, start: Start) -> list[trainer_pb2.RankStacks]:
        """Every listening rank's stacks (SIGUSR2 to faulthandler), within ``stacks_wait_s``."""
        asked: list[tuple[int, str, Path, int]] = []
        for (rank, node), proc in zip(start.ranks, start.procs, strict=True):
            path = (start.stacks_dir or Path()) / f"rank{rank}.txt"
            if proc.poll() is not None or not path.exists():  # gone, or no handler: SIGUSR2 would kill it
                continue
            path.write_text("")  # the hook appends: only this dump will be there
            _fr(path).unlink(missing_ok=True)
            path.with_name(f"rank{rank}.fr.want").touch()  # its collective state, from the hook's thread
            proc.send_signal(signal.SIGUSR2)
            asked.append((rank, node, path, proc.pid))
        give_up = time.monotonic() + self.config.stacks_wait_s
        while time.monotonic() < give_up and not all(_settled(p) and _fr(p).exists() for _, _, p, _ in asked):
            time.sleep(0.05)
        found = [
            trainer_pb2.RankStacks(
                rank=rank,
                node=node,
                answered=path.stat().st_size > 0,
                text=_read(path),
                collectives=collectives_in(_fr(path)),
                **kernel_view(pid),
            )
            for rank, node, path, pid in asked
        ]
        log.warning("job_stacks_taken", job=self.config.job_id, ranks=len(found),
                    silent=[s.rank for s in found if not s.answered])  # fmt: skip
        return found

    def _kill(self, start: Start, grace_s: float | None = None) -> None:
        """Abort the ranks: SIGTERM first (a rank may still leave cleanly), SIGKILL after ``grace_s``
        (``term_grace_s`` unless said: a hung rank never will). Called again on every turn of the
        supervising loop until they are gone."""
        grace_s = self.config.term_grace_s if grace_s is None else grace_s
        if not start.termed_at:
            start.termed_at = time.monotonic()
            how = signal.SIGTERM
        elif time.monotonic() - start.termed_at > grace_s:
            how = signal.SIGKILL
        else:
            return
        for p in start.procs:
            if p.poll() is None:
                p.send_signal(how)

    def _end(self, start: Start) -> None:
        """What is left of a start once its supervision is over: ranks still running (only after an
        error in the launcher) aborted and waited for, its stacks directory removed."""
        while any(p.poll() is None for p in start.procs):
            self._kill(start)
            time.sleep(0.05)
        _remove(start)

    # The controller --------------------------------------------------------------------------

    def _plan(
        self, nodes: list[str], stopped: bool, stacks: Sequence[trainer_pb2.RankStacks] = ()
    ) -> trainer_pb2.PlanReply | None:
        if self._stub is None:
            return None
        request = trainer_pb2.PlanRequest(job_id=self.config.job_id, nodes=nodes, stopped=stopped, stacks=stacks)
        try:
            reply: trainer_pb2.PlanReply = self._stub.Plan(request, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            if self._reachable:
                self._reachable = False
                event = "launch_controller_refused" if is_refused(exc) else "launch_controller_unreachable"
                log.warning(event, controller=self.config.controller, error=explain(exc, self.config.controller))
            return None
        self._reachable = True
        new = set(reply.exclude_nodes) - self.excluded
        if new:
            log.warning("launch_excluding", job=self.config.job_id, nodes=sorted(new), detail=reply.detail)
            self.excluded |= new
        return reply

    def _wait_for_plan(self, nodes: list[str]) -> None:
        """After a stop: wait until the controller's recovery (a sweep) is done, or gives no answer."""
        give_up = time.monotonic() + self.config.plan_wait_s
        while time.monotonic() < give_up and not self._stopped_by:
            reply = self._plan(nodes, stopped=True)
            if reply is None or reply.ready:
                if reply is not None and reply.detail:
                    log.info("launch_plan", job=self.config.job_id, detail=reply.detail)
                return
            time.sleep(self.config.poll_s)
        if not self._stopped_by:
            log.warning("launch_plan_wait_gave_up", job=self.config.job_id, waited_s=self.config.plan_wait_s)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
