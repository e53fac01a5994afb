"""Sharded checkpoints with torch.distributed.checkpoint: asynchronous, committed, pruned, resumed.

Under ``<out>/checkpoints``:

    step-00000040/   one DCP file or more per rank, and ``.metadata``, which DCP writes last
    latest           the name of the committed checkpoint, replaced atomically

A checkpoint is complete once its ``.metadata`` exists: rank 0 writes it only after gathering every
rank's write results. It is committed when ``latest`` names it; rank 0 moves the pointer only then
(write a temporary file, fsync, rename, fsync the folder). Resuming reads ``latest``; if it is
missing or names something incomplete, the newest complete checkpoint is used. A half-written
checkpoint (no ``.metadata``) is never picked. After each commit, complete checkpoints beyond
``keep`` and abandoned half-written ones older than the commit are removed.

An asynchronous save copies the state to host memory in a background thread while the next step's
forward and backward run, then writes it in another thread while training goes on. Only the
optimizer step mutates what is being copied, so it waits for the copy (``before_update``): that
wait and the call itself are all the training loop gives up. The save's collectives run on their
own gloo group, never interleaved with the training's. At most one save is in flight: the next
waits for it.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


class TrainState(Stateful):
    """What a checkpoint holds: the model, the optimizer, and how far the run got."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.step = 0
        self.consumed = 0  # samples the run has trained on: where the data loader resumes

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        progress = torch.tensor([self.step, self.consumed], dtype=torch.int64)
        return {"model": model_sd, "optim": optim_sd, "progress": progress}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.step, self.consumed = (int(v) for v in state["progress"].tolist())


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def is_complete(path: Path) -> bool:
    return (path / ".metadata").is_file()


def _steps(root: Path) -> list[tuple[int, Path]]:
    found = [(int(m[1]), p) for p in root.glob("step-*") if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def resume_point(root: Path) -> Path | None:
    """The committed checkpoint, else the newest complete one, else None."""
    latest = root / LATEST
    if latest.is_file():
        named = root / latest.read_text().strip()
        if _STEP_DIR.match(named.name) and is_complete(named):
            return named
    complete = [p for _, p in _steps(root) if is_complete(p)]
    return complete[-1] if complete else None


def commit(root: Path, step: int) -> None:
    """Point ``latest`` at the checkpoint of ``step``, atomically and durably."""
    tmp = root / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(step_dir(root, step).name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)
    folder = os.open(root, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def prune(root: Path, keep: int) -> list[Path]:
    """Remove complete checkpoints beyond the newest ``keep`` (never the committed one), and
    half-written ones older than it. Returns what was removed."""
    committed = resume_point(root)
    committed_step = int(_STEP_DIR.match(committed.name)[1]) if committed else -1  # type: ignore[index]
    complete = [p for _, p in _steps(root) if is_complete(p)]
    doomed = [p for p in complete[:-keep] if p != committed]
    doomed += [p for s, p in _steps(root) if not is_complete(p) and s < committed_step]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


class Checkpointer:
    def __init__(self, root: Path, rank: int, keep: int) -> None:
        self.root, self.rank, self.keep = root, rank, keep
        root.mkdir(parents=True, exist_ok=True)
        # The checkpoint's own collectives (planning, gathering the metadata) on a group of their own:
        # a save thread must never interleave its collectives with the training loop's.
        self.group = dist.new_group(backend="gloo")
        self._pending: tuple[int, Future[Any]] | None = None
        self._staging: Future[Any] | None = None
        self.last_committed = -1

    def save(self, state: TrainState, asynchronous: bool) -> float:
        """Save at ``state.step``; returns the seconds training was blocked. A step already committed
        is not written again (rewriting the committed checkpoint in place could tear it)."""
        self.wait()
        if state.step == self.last_committed:
            return 0.0
        path = step_dir(self.root, state.step)
        started = time.perf_counter()
        if asynchronous:
            on_gpu = torch.cuda.is_available()
            stager = DefaultStager(StagingOptions(on_gpu, False, True, on_gpu))  # pinned, -, async, non-blocking
            response = state_dict_saver.async_save(
                {"train": state}, checkpoint_id=path, process_group=self.group, async_stager=stager
            )
            assert isinstance(response, state_dict_saver.AsyncSaveResponse)
            response.upload_completion.add_done_callback(lambda _: stager.close())
            self._staging = response.staging_completion
            self._pending = (state.step, response.upload_completion)
            return time.perf_counter() - started
        state_dict_saver.save({"train": state}, checkpoint_id=path, process_group=self.group)
        blocked = time.perf_counter() - started
        self._committed(state.step)
        return blocked

    def before_update(self) -> float:
        """Wait until the save in flight has copied the state (call before anything mutates it, the
        optimizer step); returns the seconds waited."""
        if self._staging is None:
            return 0.0
        started = time.perf_counter()
        self._staging.result()
        self._staging = None
        return time.perf_counter() - started

    def poll(self) -> None:
        """Commit the save in flight if it has finished (never waits)."""
        if self._pending is not None and self._pending[1].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        step, future = self._pending
        self._pending = None
        self.before_update()
        future.result()  # a failed write raises here: the run stops rather than train on uncommitted
        self._committed(step)

    def _committed(self, step: int) -> None:
        self.last_committed = step
        if self.rank == 0:
            commit(self.root, step)
            prune(self.root, self.keep)

    def load(self, state: TrainState) -> Path | None:
        """Resume from the committed (or newest complete) checkpoint, resharding to this world size."""
        path = resume_point(self.root)
        if path is not None:
            state_dict_loader.load({"train": state}, checkpoint_id=path, process_group=self.group)
            self.last_committed = state.step
        return path
