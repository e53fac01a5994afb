"""vigil check --slurm-drain's reason and exit code, as Slurm reads them."""

from __future__ import annotations

from checks.result import CheckResult, Verdict
from controller.act.slurm.plans import DrainKind, SlurmNode, classify, vigil_drain
from vigil.slurm_check import drain_reason, slurm_exit_code


def test_the_drain_reason_is_one_line_names_the_check_and_reads_as_a_node_problem() -> None:
    result = CheckResult("membw", Verdict.FAIL, "GPU 3: 410 GB/s,\nbelow 50% of\t3350", {}, 0.0, 1.0)
    reason = drain_reason(result)
    assert reason == "vigil check: membw FAIL: GPU 3: 410 GB/s, below 50% of 3350"
    assert vigil_drain(reason) is None  # not the controller's drain: Vigil does not resume it
    assert classify(SlurmNode("gpu-01", "IDLE", frozenset({"DRAIN"}), reason)) is DrainKind.NODE
    long = CheckResult("matmul", Verdict.FAIL, "x" * 1000, {}, 0.0, 1.0)
    assert len(drain_reason(long)) == 200


def test_only_a_fail_fails_the_prolog_unless_strict() -> None:
    assert [slurm_exit_code(v, strict=False) for v in Verdict] == [1 if v is Verdict.FAIL else 0 for v in Verdict]
    assert slurm_exit_code(Verdict.UNKNOWN, strict=True) == 2 and slurm_exit_code(Verdict.OK, strict=True) == 0
