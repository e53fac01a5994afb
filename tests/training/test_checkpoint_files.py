"""Which checkpoint a run resumes from, and which ones are pruned: the files alone, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training job needs torch (make test installs the CPU build)")

from trainer_hooks.moe_job.checkpoint import LATEST, commit, prune, resume_point, step_dir  # noqa: E402


def make(root: Path, step: int, complete: bool = True) -> Path:
    path = step_dir(root, step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if complete:
        (path / ".metadata").write_bytes(b"meta")
    return path


def test_resume_follows_the_commit_and_falls_back_to_the_newest_complete(tmp_path: Path) -> None:
    assert resume_point(tmp_path) is None
    for step in (10, 20, 30):
        make(tmp_path, step)
    make(tmp_path, 40, complete=False)  # being written, or torn
    assert resume_point(tmp_path) == step_dir(tmp_path, 30)  # no pointer: the newest complete
    commit(tmp_path, 20)
    assert (tmp_path / LATEST).read_text() == "step-00000020\n" and resume_point(tmp_path) == step_dir(tmp_path, 20)
    (tmp_path / LATEST).write_text("step-00000040\n")  # names a torn checkpoint
    assert resume_point(tmp_path) == step_dir(tmp_path, 30)
    (tmp_path / LATEST).write_text("../../etc\n")  # names nothing of ours
    assert resume_point(tmp_path) == step_dir(tmp_path, 30)


def test_pruning_keeps_the_newest_and_the_committed_and_an_unfinished_newer_one(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        make(tmp_path, step)
    make(tmp_path, 15, complete=False)  # abandoned before the commit: goes
    make(tmp_path, 50, complete=False)  # still being written: stays
    commit(tmp_path, 40)
    removed = prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["step-00000010", "step-00000015", "step-00000020"]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000030", "step-00000040", "step-00000050"]
