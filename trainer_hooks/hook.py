"""The callback a training loop calls: Vigil's eyes inside the job, and its hand on the stop flag.

    import sys
    from trainer_hooks.hook import HookConfig, VigilHook
    from trainer_hooks.protocol import CHECKPOINTED_EXIT_CODE

    hook = VigilHook(HookConfig.from_env(flops_per_token=flops_per_token, peak_flops=peak_flops))
    hook.start(start_step)                        # after the process group is up, on every rank
    for step in range(start_step + 1, last_step + 1):
        tokens, seconds, loss = train_step(step)  # the job's own step: tokens of the whole job, its time
        if hook.step_end(step, tokens, seconds, loss):  # every rank, at every step boundary
            save_checkpoint(step)
            hook.end(checkpoint_step=step)
            sys.exit(CHECKPOINTED_EXIT_CODE)      # 75: the launcher restarts the job without the bad node
    hook.end()

(``train_step``, ``save_checkpoint`` and the figures are the job's own; the suite runs this snippet
as written.)

What it does:
- At every step end, one small all-gather on a gloo group of its own (never the training's NCCL
  group, never a GPU sync): each rank's step time and stop flag. Every rank learns whether any rank
  must stop, so all stop at the same step; rank 0 also collects every rank's step time. With
  ``sync_s`` > 0 the exchange happens only every few steps (about that many seconds apart), for
  jobs whose steps are so short that a collective each would cost them: the ranks then wait for a
  slow one inside the job's own collectives, which hides the skew, and a stop waits that long.
  ``end`` (on every rank) destroys that group, so that its threads end before the process does.
- Every ``window_steps`` steps, and at least ``window_min_s`` apart (the reporter's pace: a job
  stepping in milliseconds neither floods the controller nor loses windows), rank 0 turns the
  window into Progress (tokens/s and MFU at the pace of the slowest rank, each rank's mean step
  time, the nodes) and hands it to the reporter thread.
  Nothing on the step path waits on the network; an unreachable controller costs nothing but logs.
- A stop is asked for by ``request_stop`` (safe in a signal handler: it only sets a string) or by
  the controller's CHECKPOINT_AND_RESTART, which reaches rank 0's reporter thread.
- A save without a stop: the controller's CHECKPOINT_NOW (a node of the job shows early signs of
  failing), or, with ``auto_checkpoint``, the interval the controller recommends for the job's size
  and measured save time (vigil plan) having passed since the last save. Rank 0 decides; the
  exchange tells every rank, so ``save_due`` turns True on all of them at the same step: the loop
  saves then and calls ``checkpoint_saved`` (which acknowledges the command).

- Rank 0's reports carry the step it is at, heartbeats too (every ``poll_s``): the controller
  pages a job whose step stops moving for longer than its own steps make likely (a hang); while the
  loop saves, rank 0 says so ("checkpoint"), and ``pause("evaluation")`` says any other planned gap.
  Every rank also keeps its progress record (its step, and whether it is computing, in the exchange
  or paused) where its node's agent reads it, when ``progress_dir`` is set: two ``os.pwrite`` of
  256 bytes a step, never a wait.

``step_time_s`` is the rank's own time for the step, measured before ``step_end`` (the exchange,
where ranks wait for each other, is not in it). Skew across ranks shows a rank that is slow outside
the step's collectives (its host, its data loading); a GPU that is slow inside them makes its peers
wait in those collectives, and shows as the job's drop plus the node's own signals (throttling).

Configured from the environment by whoever launches the job (``vigil launch``, a Kubernetes Job):
VIGIL_JOB_ID, VIGIL_CONTROLLER (host:port; empty: report nothing), VIGIL_NODE, VIGIL_RESTART_COUNT,
VIGIL_WINDOW_STEPS, VIGIL_SYNC_S, VIGIL_AUTO_CHECKPOINT, VIGIL_STACKS_DIR (every thread's stack on
SIGUSR2, which ``vigil launch`` sends when the controller finds the job hung, and the flight
recorder's collective state, ``trainer_hooks.collectives``), VIGIL_PROGRESS_DIR (every rank's
progress record, which the node's agent reads: ``vigil_core.rank_progress``; ``{node}`` stands for
the node's name).
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import psutil
import structlog
import torch
import torch.distributed as dist
from pydantic import Field, ValidationError, field_validator

from protos.vigil.v1 import trainer_pb2
from trainer_hooks.collectives import watch_requests
from trainer_hooks.reporter import Reporter
from trainer_hooks.window import RankWindow, figures
from vigil_core.config_file import ConfigModel
from vigil_core.names import is_job_id, is_node_name
from vigil_core.rank_progress import RankRecord, encode, file_name
from vigil_core.tls import TlsError, TlsFiles

log = structlog.get_logger(__name__)

_ENV = {
    "job_id": "VIGIL_JOB_ID",
    "controller": "VIGIL_CONTROLLER",
    "node": "VIGIL_NODE",
    "restart_count": "VIGIL_RESTART_COUNT",
    "window_steps": "VIGIL_WINDOW_STEPS",
    "sync_s": "VIGIL_SYNC_S",
    "tls_dir": "VIGIL_TLS_DIR",
    "auto_checkpoint": "VIGIL_AUTO_CHECKPOINT",
    "stacks_dir": "VIGIL_STACKS_DIR",
    "progress_dir": "VIGIL_PROGRESS_DIR",
}


class HookConfigError(ValueError):
    pass


class HookConfig(ConfigModel):
    job_id: str = "job"
    controller: str = Field(default="", description="the controller's host:port; empty: report nothing")
    node: str = Field(default_factory=lambda: socket.gethostname().lower())
    restart_count: int = Field(default=0, ge=0, description="starts of this job before this one")
    window_steps: int = Field(default=10, ge=1, description="steps per reporting window")
    window_min_s: float = Field(
        default=0.5, ge=0.5, le=600, description="a window is at least this long, whatever the step time"
    )
    poll_s: float = Field(default=1.0, gt=0, description="how often rank 0 asks for commands between windows")
    sync_s: float = Field(
        default=0.0,
        ge=0,
        description="exchange step times and the stop flag about this often; 0: every step (stragglers show)",
    )
    tls_dir: Path | None = Field(default=None, description="mutual TLS: a trainer: certificate (vigil certs)")
    stacks_dir: Path | None = Field(
        default=None, description="on SIGUSR2 every thread's stack goes to rankN.txt here (asked for in a hang)"
    )
    progress_dir: str = Field(
        default="",
        description="every rank keeps its progress record (vigil_core.rank_progress) in a file here, which "
        "the node's agent reads; '{node}' stands for the node's name; empty: none",
    )
    auto_checkpoint: bool = Field(
        default=False, description="save_due also when the controller's recommended interval has passed"
    )
    auto_fallback_s: float = Field(
        default=1800.0, gt=0, description="auto_checkpoint without the controller's advice (none yet): this often"
    )
    flops_per_token: float = Field(default=0.0, ge=0, description="the model's training FLOPs per token")
    peak_flops: float = Field(default=0.0, ge=0, description="one device's peak FLOP/s; 0: MFU unknown")

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str) -> str:
        if not is_job_id(value):
            raise ValueError(f"{value!r} is not a job id (letters, digits, -_.)")
        return value

    @field_validator("node")
    @classmethod
    def _node(cls, value: str) -> str:
        if not is_node_name(value):
            raise ValueError(f"{value!r} is not a node name (lower case, digits, -.)")
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **given: Any) -> HookConfig:
        """Explicit arguments, then the VIGIL_* variables, then the defaults; a bad one names itself."""
        env = os.environ if env is None else env
        values = {k: env[var] for k, var in _ENV.items() if env.get(var)} | given
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(f"{_ENV.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}" for e in exc.errors())
            raise HookConfigError(f"Vigil hook configuration: {problems}") from None


class VigilHook:
    def __init__(self, config: HookConfig) -> None:
        """Raises HookConfigError for a certificate directory it cannot read: named now, not at the
        first report."""
        self.config = config
        try:
            self._tls = TlsFiles.load(config.tls_dir) if config.tls_dir is not None else None
        except TlsError as exc:
            raise HookConfigError(f"Vigil hook configuration: {_ENV['tls_dir']}: {exc}") from None
        self.rank, self.world = 0, 1
        self.rank_nodes: list[str] = [config.node]
        self.step = self.committed_step = 0
        self.stopping = False
        self.stop_reason = ""
        self.overhead_s = 0.0  # time spent in step_end: what the hook costs the step path
        self._group: Any = None
        self._stop_why = ""  # this rank's own request (a signal)
        self._command: trainer_pb2.CheckpointAndRestart | None = None  # rank 0: from the controller
        self._save_command: trainer_pb2.CheckpointNow | None = None  # rank 0: a save asked for, not yet done
        self._acks: list[trainer_pb2.CommandAck] = []  # rank 0: saves done for a command, for the next report
        self._last_save = time.monotonic()
        self.save_due = False  # every rank: save at this step boundary (then call checkpoint_saved)
        self._pause = ""  # what the job says it does between steps (pause): a long gap then is not a hang
        self._reporter: Reporter | None = None
        self._stacks: IO[str] | None = None  # where faulthandler writes this rank's stacks on SIGUSR2
        self._progress: int | None = None  # this rank's progress record's file (a descriptor), or None
        self._progress_path: Path | None = None
        self._sync_every = 1  # steps between exchanges; rank 0 adapts it to the step time
        self._pending_s, self._pending_steps = 0.0, 0  # this rank's steps since the last exchange
        self._reset_window(time.time())

    def _reset_window(self, now: float) -> None:
        self._window_start = now
        self._window_steps = self._tokens = 0
        self._sums = [0.0] * self.world
        self._loss = 0.0
        self._checkpoint_s = 0.0

    # Lifecycle -----------------------------------------------------------------------------

    def start(self, step: int = 0, committed_step: int = 0, restore_s: float | None = None) -> None:
        """On every rank, after the process group is up (it makes a gloo group: a collective), just
        before the first step. ``restore_s`` (goodput): the time this run took to start and load its
        checkpoint; by default, the time since this process started."""
        self.step, self.committed_step = step, committed_step
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world > 1:
            self._group = dist.new_group(backend="gloo")
            nodes: list[Any] = [None] * self.world
            dist.all_gather_object(nodes, self.config.node, group=self._group)
            self.rank_nodes = [str(n) for n in nodes]
        self._reset_window(time.time())
        self._dump_stacks_on_signal()
        self._open_progress()
        self._mark("compute")
        if self.rank == 0 and self.config.controller:
            cfg = self.config
            self._reporter = Reporter(
                cfg.controller, self._heartbeat, self._received, cfg.poll_s, tls=self._tls, min_interval_s=0.5
            )
            self._reporter.start()
            first = self._base("start")
            first.restore_s = max(0.0, time.time() - psutil.Process().create_time() if restore_s is None else restore_s)
            self._reporter.put(first)
            log.info("vigil_hook_started", job=self.config.job_id, controller=self.config.controller,
                     world_size=self.world, restart=self.config.restart_count)  # fmt: skip

    def _dump_stacks_on_signal(self) -> None:
        """With ``stacks_dir``: SIGUSR2 writes every thread's Python stack to ``rankN.txt`` there (from C,
        so a rank blocked in a collective or a read still answers). The file is opened for appending,
        so its launcher can empty it before it asks; its being there says the handler is."""
        if self.config.stacks_dir is None or self._stacks is not None:
            return
        try:
            self.config.stacks_dir.mkdir(parents=True, exist_ok=True)
            self._stacks = open(self.config.stacks_dir / f"rank{self.rank}.txt", "a")  # noqa: SIM115 (kept open)
            faulthandler.register(signal.SIGUSR2, file=self._stacks, all_threads=True)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("vigil_stacks_unavailable", dir=str(self.config.stacks_dir), error=str(exc))
            return
        watch_requests(self.config.stacks_dir, self.rank)  # and the collective state, from another thread

    def _open_progress(self) -> None:
        """This rank's progress record's file, where the node's agent reads it; a directory it cannot
        write is said once and the job trains on without it."""
        if not self.config.progress_dir:
            return
        where = Path(self.config.progress_dir.replace("{node}", self.config.node))
        path = where / file_name(self.config.job_id, self.rank)
        try:
            where.mkdir(parents=True, exist_ok=True)
            self._progress, self._progress_path = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), path
        except OSError as exc:
            log.warning("vigil_progress_unavailable", dir=str(where), error=str(exc))

    def _mark(self, phase: str) -> None:
        """Where this rank is, in its progress record: a few microseconds, never a wait."""
        if self._progress is None:
            return
        said = "".join(c if c.isalnum() or c in "-_" else "-" for c in phase)
        record = RankRecord(self.config.job_id, self.rank, self.config.node, self.step, said, time.time())
        try:
            os.pwrite(self._progress, encode(record), 0)
        except (OSError, ValueError) as exc:
            log.warning("vigil_progress_unavailable", path=str(self._progress_path), error=str(exc))
            self._close_progress()

    def _close_progress(self) -> None:
        if self._progress is None:
            return
        os.close(self._progress)
        self._progress = None
        if self._progress_path is not None:
            self._progress_path.unlink(missing_ok=True)  # the job ended here: nothing to watch

    def pause(self, what: str) -> None:
        """Say the job is busy between steps (``"evaluation"``, a long data reload), so that a long
        gap is not taken for a hang; ``resume``, the next ``step_end`` or, for ``"checkpoint"``,
        ``checkpoint_saved`` ends it. A save Vigil asked for needs no word (while ``save_due`` or a
        stop's save is on, rank 0 says "checkpoint" itself); the job's own scheduled saves say
        ``pause("checkpoint")`` before they begin."""
        self._pause = what[:64] or "paused"
        self._mark(self._pause)

    def resume(self) -> None:
        self._pause = ""
        self._mark("compute")

    def request_stop(self, why: str) -> None:
        """Ask every rank to stop at the next step boundary. Safe in a signal handler."""
        if not self._stop_why:
            self._stop_why = why

    def step_end(self, step: int, tokens: int, step_time_s: float, loss: float | None = None) -> bool:
        """After each step, on every rank. ``tokens``: trained in this step by the whole job.
        Returns True when every rank must checkpoint and exit now."""
        entered = time.perf_counter()
        self.step, self._pause = step, ""
        self._mark("exchange")
        self._pending_s += step_time_s
        self._pending_steps += 1
        self._tokens += tokens
        if loss is not None:
            self._loss = loss
        stop = False
        if self._pending_steps >= self._sync_every:
            stop = self._exchange()
            long_enough = time.time() - self._window_start >= self.config.window_min_s
            if self._window_steps >= self.config.window_steps and long_enough:
                if self._reporter is not None:
                    self._reporter.put(self._window())
                self._reset_window(time.time())
        if stop and not self.stopping:
            self.stopping = True
            command = self._command
            self.stop_reason = self._stop_why or (f"Vigil: {command.reason}" if command else "another rank asked")
        self._mark("compute")
        self.overhead_s += time.perf_counter() - entered
        return stop

    def _exchange(self) -> bool:
        """Every rank's step time since the last exchange, and whether any must stop. Rank 0 also
        sets the steps until the next exchange (the same on every rank, as they must agree when to
        meet): as many as take ``sync_s``, so short steps do not pay for a collective each."""
        asked = bool(self._stop_why) or self._command is not None
        save = self._save_wanted()
        if self._group is not None:
            mean_s = self._pending_s / self._pending_steps
            every = math.ceil(self.config.sync_s / max(mean_s, 1e-6))
            proposal = min(self.config.window_steps, max(1, every))
            mine = torch.tensor([self._pending_s, float(asked), float(proposal), float(save)], dtype=torch.float64)
            rows = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(rows, mine, group=self._group)
            times, stop = [float(r[0]) for r in rows], any(float(r[1]) > 0 for r in rows)
            self._sync_every = int(rows[0][2])
            self.save_due = any(float(r[3]) > 0 for r in rows)
        else:
            times, stop = [self._pending_s], asked
            self.save_due = save
        self._sums = [s + t for s, t in zip(self._sums, times, strict=True)]
        self._window_steps += self._pending_steps
        self._pending_s, self._pending_steps = 0.0, 0
        return stop

    def _save_wanted(self) -> bool:
        """Rank 0: a CHECKPOINT_NOW is waiting, or (auto_checkpoint) the recommended interval passed."""
        if self._save_command is not None:
            return True
        advice = self._reporter.recommended_checkpoint_s if self._reporter is not None else 0.0
        every = advice if advice > 0 else self.config.auto_fallback_s
        return self.config.auto_checkpoint and time.monotonic() - self._last_save >= every

    @property
    def recommended_checkpoint_s(self) -> float:
        """Rank 0: the interval the controller recommends (0: none yet, or not rank 0)."""
        return self._reporter.recommended_checkpoint_s if self._reporter is not None else 0.0

    def checkpoint_saved(self, blocked_s: float, committed_step: int, saved_step: int | None = None) -> None:
        """A save, on every rank: the seconds training was blocked, the newest committed step, and
        the step this save holds (an asynchronous save commits it later; default: committed_step).
        Ends a ``pause("checkpoint")``: training goes on now, and a stall from here is not the save's."""
        if self._pause == "checkpoint":
            self.resume()
        self._checkpoint_s += blocked_s
        self.committed_step = max(self.committed_step, committed_step)
        self.save_due, self._last_save = False, time.monotonic()
        if self._save_command is not None:
            step = committed_step if saved_step is None else saved_step
            self._acks.append(trainer_pb2.CommandAck(id=self._save_command.id, checkpoint_step=step))
            log.info("vigil_checkpoint_now_done", job=self.config.job_id, command=self._save_command.id, step=step)
            self._save_command = None

    def end(self, checkpoint_step: int = 0, checkpoint_s: float = 0.0) -> bool:
        """At the end of the run, or after the stop's checkpoint is committed (``checkpoint_step``);
        ``checkpoint_s``: the time that last save blocked training.
        Rank 0 delivers its last word; True if it reached the controller (or none was due)."""
        self._close_progress()
        self._release_group()
        if self._reporter is None:
            return True
        command, acks = self._command, []
        if checkpoint_step and command is not None:
            acks = [trainer_pb2.CommandAck(id=command.id, checkpoint_step=checkpoint_step, detail=self.stop_reason)]
        self.committed_step = max(self.committed_step, checkpoint_step)
        last = self._base("checkpointed" if checkpoint_step else "end")
        last.acks.extend([*self._acks, *acks])  # a CHECKPOINT_NOW done since the last window, too
        last.checkpoint_s = self._checkpoint_s + max(0.0, checkpoint_s)  # saves since the last window too
        # A few seconds of retries, for an acknowledgement (the controller moves on at once, not at the
        # deadline) as for the end of a run (else the job shows running until it is judged silent).
        delivered = self._reporter.close(last, timeout_s=5.0)
        self._reporter = None
        return delivered

    def _release_group(self) -> None:
        """Destroy the hook's gloo group and drop it, so that its threads end here, while Python is whole:
        ``destroy_process_group`` alone leaves a group's threads running while anything holds the group,
        and gloo threads still running as the interpreter exits can abort a rank that finished cleanly
        (SIGABRT, "terminate called without an active exception"), which its launcher counts a failure."""
        group, self._group = self._group, None
        if group is None or not dist.is_initialized():
            return
        with contextlib.suppress(ValueError):  # the job destroyed every group already
            dist.destroy_process_group(group)

    # Rank 0 --------------------------------------------------------------------------------

    @property
    def command(self) -> trainer_pb2.CheckpointAndRestart | None:
        return self._command

    def _received(self, command: trainer_pb2.JobCommand) -> None:
        """On the reporter thread: remember the command; the next step boundary acts on it."""
        if command.HasField("checkpoint_and_restart") and self._command is None:
            self._command = command.checkpoint_and_restart
            log.warning("vigil_checkpoint_and_restart", job=self.config.job_id, command=self._command.id,
                        reason=self._command.reason, exclude=list(self._command.exclude_nodes))  # fmt: skip
        elif command.HasField("checkpoint_now") and self._save_command is None:
            if any(a.id == command.checkpoint_now.id for a in self._acks):
                return  # done already; the acknowledgement is on its way
            self._save_command = command.checkpoint_now
            log.warning("vigil_checkpoint_now", job=self.config.job_id, command=self._save_command.id,
                        reason=self._save_command.reason)  # fmt: skip

    def _base(self, event: str) -> trainer_pb2.Progress:
        return trainer_pb2.Progress(
            job_id=self.config.job_id,
            step=self.step,
            restart_count=self.config.restart_count,
            nodes=list(dict.fromkeys(self.rank_nodes)),
            world_size=self.world,
            committed_step=self.committed_step,
            event=event,
            window_end=time.time(),  # an event's time; a window sets its own
            pause=self.saying,
        )

    @property
    def saying(self) -> str:
        """What rank 0 tells the controller the job does between steps ('' for nothing): a long gap
        then is not a hang."""
        return self._pause or ("checkpoint" if self.save_due or self.stopping else "")

    def _heartbeat(self) -> trainer_pb2.Progress:
        return self._base("heartbeat")  # acknowledgements go with the next window (the training thread's)

    def _window(self) -> trainer_pb2.Progress:
        p = self._base("")
        windows = [RankWindow(r, s, self._window_steps) for r, s in enumerate(self._sums)]
        fig = figures(windows, self._tokens, self.config.flops_per_token, self.config.peak_flops)
        p.window_start, p.window_end = self._window_start, time.time()
        p.tokens, p.tokens_per_s, p.mfu, p.loss = self._tokens, fig.tokens_per_s, fig.mfu, self._loss
        p.checkpoint_s = self._checkpoint_s
        p.acks.extend(self._acks)
        self._acks = []
        p.step_times.extend(
            trainer_pb2.RankStepTime(rank=w.rank, node=self.rank_nodes[w.rank], step_time_s=w.mean_step_s)
            for w in windows
        )
        return p
