"""Each rank's progress record: written by the real hook, read by the agent's reader, and where a
hung job's ranks are from them (controller.jobs.progress, pure)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.rank_progress import read_progress
from controller.jobs.progress import progress_wavefront
from controller.jobs.stacks import HangClass
from trainer_hooks.hook import HookConfig, VigilHook
from vigil_core.rank_progress import RECORD_BYTES, RankRecord, decode, encode


def rec(rank: int, step: int, phase: str, node: str = "", at: float = 100.0) -> RankRecord:
    return RankRecord("moe", rank, node or f"node-{rank}", step, phase, at)


def test_a_record_is_one_fixed_size_block_and_reads_back() -> None:
    record = rec(3, 1234, "exchange", at=1700000000.123)
    data = encode(record)
    assert len(data) == RECORD_BYTES and decode(data) == record
    assert decode(data[:40]) is None  # torn: never believed
    assert decode(b"\0" * RECORD_BYTES) is None
    with pytest.raises(ValueError, match="over 256"):
        encode(RankRecord("moe", 1, "n" * 250, 1, "compute", 1.0))


@given(st.binary(max_size=300))
def test_no_bytes_make_decode_raise(data: bytes) -> None:
    decode(data)


@pytest.mark.parametrize(
    "bad",
    [
        rec(1, 1, "has space"),
        rec(1, -1, "compute"),
        RankRecord("Bad Job", 1, "node-1", 1, "compute", 1.0),
        RankRecord("moe", 1, "NODE 1", 1, "compute", 1.0),
        rec(1, 1, ""),
    ],
)
def test_a_record_with_names_or_numbers_a_controller_must_not_keep_is_refused(bad: RankRecord) -> None:
    assert decode(encode(bad)) is None


def test_the_real_hook_keeps_its_record_and_the_agent_reads_it(tmp_path: Path) -> None:
    hook = VigilHook(HookConfig(job_id="moe", node="node-a", progress_dir=str(tmp_path / "{node}")))
    hook.start(7)
    where = tmp_path / "node-a"
    assert [(r.step, r.phase) for r in read_progress(where, "node-a").records] == [(7, "compute")]
    hook.step_end(8, 100, 0.1)
    hook.pause("data reload")  # said in the record's own alphabet
    (record,) = read_progress(where, "node-a").records
    assert (record.job, record.rank, record.node, record.step, record.phase) == ("moe", 0, "node-a", 8, "data-reload")
    elsewhere = read_progress(where, "node-b")  # a record naming another node is not this node's: said
    assert elsewhere.records == [] and elsewhere.unreadable == ["moe.rank0"]
    stale = read_progress(where, "node-a", now=time.time() + 7200)  # long stale: a job long gone, no fault
    assert stale.records == [] and stale.unreadable == []
    (where / "moe.rank5").write_bytes(b'{"job":"moe","ra')  # torn, or written by something else
    assert read_progress(where, "node-a").unreadable == ["moe.rank5"]
    (where / "moe.rank5").unlink()
    hook.end()
    gone = read_progress(where, "node-a")
    assert gone.records == [] and gone.unreadable == [] and not list(where.iterdir())  # the job ended: removed
    assert read_progress(tmp_path / "missing", "node-a").records == []


def test_a_hook_that_cannot_write_its_record_trains_on(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    hook = VigilHook(HookConfig(job_id="moe", node="node-a", progress_dir=str(blocker / "sub")))
    hook.start(0)
    assert hook.step_end(1, 100, 0.1) is False


def test_the_ranks_behind_the_others_are_named() -> None:
    lagging = progress_wavefront([rec(0, 30, "compute"), rec(1, 29, "compute"), rec(2, 30, "compute")])
    assert lagging is not None and lagging.verdict is HangClass.BEHIND
    assert [(c.rank, c.node, c.where) for c in lagging.culprits] == [(1, "node-1", "step 29, in compute")]
    assert lagging.waiting == 2 and "while 2 rank(s) wait for it" in lagging.describe()


def test_at_one_step_the_ranks_that_never_reached_the_exchange_are_named() -> None:
    found = progress_wavefront([rec(0, 30, "exchange"), rec(1, 30, "compute"), rec(2, 30, "exchange")])
    assert found is not None and [c.rank for c in found.culprits] == [1]


def test_every_rank_alike_names_nobody_and_no_records_say_nothing() -> None:
    alike = progress_wavefront([rec(0, 30, "compute"), rec(1, 30, "compute")])
    assert alike is not None and alike.verdict is HangClass.ALIKE and alike.culprits == ()
    assert alike.describe().startswith("all 2 ranks at one step, in the same place: none stands out")
    assert progress_wavefront([]) is None
    newest = progress_wavefront([rec(0, 5, "compute", at=1.0), rec(0, 30, "compute", at=2.0), rec(1, 30, "compute")])
    assert newest is not None and newest.culprits == ()  # a rank's newest record counts
