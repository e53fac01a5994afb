"""The bundled MoE job on a real GPU (skipped elsewhere): `pytest -m gpu -s tests/gpu`.

Runs the 1b preset (bf16, NCCL, FSDP2 over one rank per GPU) for a few dozen steps and prints
tokens/s and MFU after warm-up, for the record; then resumes it from its checkpoint.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.gpu.nvidia import gpus
from tests.training.launch import events, run

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("need_a_gpu")]


def test_the_1b_preset_trains_in_bf16_and_reports_mfu(tmp_path: Path) -> None:
    ranks = gpus()
    args = ("--preset", "1b", "--steps", "40", "--global-batch", str(8 * ranks), "--checkpoint-every", "20")
    assert run(ranks, tmp_path, *args, timeout=1800) == [0] * ranks, (tmp_path / "rank0.log").read_text()[-3000:]
    steps = events(tmp_path, "step")
    after_warmup = steps[10:]
    mfu = statistics.median(e["mfu"] for e in after_warmup)
    tokens = statistics.median(e["tokens_per_s"] for e in after_warmup)
    blocked = [e["blocked_s"] for e in events(tmp_path, "checkpoint")]
    print(f"\n1b on {ranks} GPU(s): median {tokens:.0f} tokens/s, MFU {mfu:.1%}, async checkpoint blocked {blocked} s")
    assert all(e["loss"] == e["loss"] for e in steps) and steps[-1]["loss"] < steps[0]["loss"]
    assert mfu > 0.05  # a floor that catches a broken setup (fp32, no FSDP); the record is the print
    assert (
        run(ranks, tmp_path, *args[:2], "--steps", "42", "--global-batch", str(8 * ranks), timeout=1800) == [0] * ranks
    )
    assert events(tmp_path, "start")[-1]["step"] == 40
