"""The agent's own checks: a fault is FAIL, an unknown check is UNKNOWN, never OK."""

from __future__ import annotations

import asyncio

from agent.local_checks import LocalChecks
from gpus.simulated import SimulatedBackend
from protos.vigil.v1 import agent_pb2, common_pb2
from tests.fakes.gpu_faults import GpuFaults
from vigil_core.signals import THROTTLE_HW_SLOWDOWN


def run(backend: SimulatedBackend, check: str) -> common_pb2.CheckResult:
    request = agent_pb2.RunCheck(request_id="r1", check=check, deadline_s=5)
    return asyncio.run(LocalChecks("n1", backend).run(request))


def test_healthy_node_passes() -> None:
    result = run(SimulatedBackend("n1", 4), "gpu_health")
    assert result.verdict == common_pb2.OK and result.figures["gpus"] == 4 and result.request_id == "r1"


def test_faults_fail_with_the_reason() -> None:
    backend = SimulatedBackend("n1", 4)
    GpuFaults(backend).gpu_lost(1)
    GpuFaults(backend).row_remap(2, pending=True)
    GpuFaults(backend).throttle(3, THROTTLE_HW_SLOWDOWN)
    result = run(backend, "gpu_health")
    assert result.verdict == common_pb2.FAIL
    for text in ("GPU 1 is lost", "GPU 2 row remap pending", "GPU 3 throttled"):
        assert text in result.reason


def test_unknown_check_is_unknown_not_ok() -> None:
    result = run(SimulatedBackend("n1", 1), "matmul_burn")
    assert result.verdict == common_pb2.UNKNOWN and "no check named 'matmul_burn'" in result.reason


def test_a_crashing_backend_is_unknown() -> None:
    class Broken(SimulatedBackend):
        def read(self, index: int):  # type: ignore[no-untyped-def]
            raise RuntimeError("NVML_ERROR_UNKNOWN")

    result = run(Broken("n1", 1), "gpu_health")
    assert result.verdict == common_pb2.UNKNOWN and "NVML_ERROR_UNKNOWN" in result.reason
