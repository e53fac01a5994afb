"""An agent's check result is input like any other: bounded before it is kept (``controller.nodes.check_requests``)."""

from __future__ import annotations

import math
from pathlib import Path

from controller.nodes.check_requests import MAX_FIGURES, MAX_REASON_CHARS, CheckRequests, bounded
from controller.store import Store
from protos.vigil.v1 import common_pb2


def test_a_huge_reason_and_too_many_figures_are_cut_and_the_cut_is_said() -> None:
    figures = {f"f{i}": float(i) for i in range(MAX_FIGURES + 10)} | {"nan": math.nan, "x" * 200: 1.0}
    r = common_pb2.CheckResult(request_id="r1", check="matmul", verdict=common_pb2.OK, reason="y" * 3_500_000)
    r.figures.update(figures)
    kept = bounded(r)
    assert kept.reason.startswith("y" * 100) and len(kept.reason) < MAX_REASON_CHARS + 200
    assert "reason cut from 3500000 characters" in kept.reason
    assert f"12 of {len(figures)} figures dropped" in kept.reason
    assert len(kept.figures) == MAX_FIGURES and "nan" not in kept.figures
    small = common_pb2.CheckResult(request_id="r2", check="gpu_health", verdict=common_pb2.OK, reason="8 GPUs healthy")
    assert bounded(small) == small  # nothing to cut: unchanged


def test_ten_huge_results_do_not_grow_the_database_by_their_size(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctl.db")
    checks = CheckRequests(store.records, lambda node, message: True)
    for i in range(10):
        huge = common_pb2.CheckResult(request_id=f"r{i}", check="matmul", verdict=99, reason="z" * 3_500_000)
        checks.answered("n1", huge)  # an unknown verdict too: filed as UNKNOWN, never a crash
    store.close()
    assert (tmp_path / "ctl.db").stat().st_size + sum(
        p.stat().st_size for p in tmp_path.glob("ctl.db-*")
    ) < 2 << 20  # was 40 MiB


def test_results_nobody_asked_for_are_stored_at_most_the_hourly_bound_per_node(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctl.db")
    refused: list[str] = []
    now = [7200.0]
    checks = CheckRequests(store.records, lambda node, message: True, 5, refused.append, lambda: now[0])

    def flood(node: str, n: int) -> None:
        for i in range(n):
            checks.answered(node, common_pb2.CheckResult(request_id=f"u{now[0]}-{i}", check="matmul", reason="x"))

    def stored(node: str) -> int:
        return int(store.read("SELECT COUNT(*) FROM check_results WHERE node = ?", (node,))[0][0])

    flood("n1", 50)
    flood("n2", 3)  # another node's bound is its own
    assert (stored("n1"), stored("n2"), len(refused)) == (5, 3, 45)
    now[0] += 3600  # the next hour: five more
    flood("n1", 10)
    assert stored("n1") == 10
    store.close()
