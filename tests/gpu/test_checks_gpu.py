"""The workload checks on real GPUs (skipped elsewhere): `pytest -m gpu -s tests/gpu`.

Each prints its figures against the model's peak, for the record: matmul TFLOP/s (bf16) per GPU,
copy bandwidth per GPU, and NCCL all-reduce bus bandwidth across the node's GPUs.
"""

from __future__ import annotations

import pytest

from checks.result import Verdict
from checks.runner import run_check
from tests.gpu.nvidia import gpus

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("need_a_gpu")]


@pytest.mark.parametrize(("check", "args"), [("matmul", ["--seconds", "10"]), ("membw", ["--iters", "100"])])
def test_workload_reaches_its_figure(check: str, args: list[str]) -> None:
    result = run_check(check, args, deadline_s=300)
    print(f"\n{check}: {result.verdict.value} {result.reason}")
    for key, value in sorted(result.figures.items()):
        print(f"  {key} = {value:.1f}")
    assert result.verdict is Verdict.OK, result.reason


def test_nccl_allreduce() -> None:
    if gpus() < 2:
        pytest.skip("one GPU: no all-reduce between GPUs to measure")
    result = run_check("allreduce", [], deadline_s=300)
    print(f"\nallreduce: {result.reason}")
    assert result.verdict is Verdict.OK and "nccl" in result.reason


@pytest.mark.parametrize("check", ["matmul", "allreduce"])
def test_an_invasive_check_refuses_a_gpu_a_workload_is_using(check: str) -> None:
    import subprocess
    import sys
    import time

    hog = subprocess.Popen(
        [sys.executable, "-c", "import torch, time; x = torch.ones(1, device='cuda:0'); time.sleep(60)"]
    )
    try:
        time.sleep(8)  # its CUDA context is up
        result = run_check(check, [], deadline_s=120)
        print(f"\n{check} beside a workload: {result.verdict.value} {result.reason}")
        assert result.verdict is Verdict.UNKNOWN and "a workload is using the GPU" in result.reason
    finally:
        hog.kill()
        hog.wait()
