"""The GPU workload tests skip, saying why, on a machine without an NVIDIA GPU."""

from __future__ import annotations

import pytest

from tests.gpu.nvidia import gpus


@pytest.fixture(scope="module")
def need_a_gpu() -> None:
    if gpus() == 0:
        pytest.skip("no NVIDIA GPU here (nvidia-smi -L lists none)")
