"""The diagnostic checks as programs: real torch work on CPU, real gloo collectives across
processes, and the runner's rule that a crash, a hang or a contradiction is UNKNOWN."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from checks.allreduce import Timing, bus_bandwidth_gbps, figures_for, route_interface, typical_and_mean
from checks.result import CheckResult, Verdict
from checks.runner import interpret, run_check
from protos.vigil.v1 import common_pb2
from tests.helpers import free_port

# Not importorskip: importing torch here would hide whether the agent's side loads it.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="the workload checks need torch (make test installs the CPU build)",
)

SIZES = "1024,65536,1048576"


@pytest.mark.parametrize("world_size", [2, 4])
def test_allreduce_between_real_processes_reports_bus_bandwidth(world_size: int) -> None:
    result = run_check("allreduce", ["--nproc", str(world_size), "--sizes", SIZES, "--iters", "3"], deadline_s=120)
    assert result.verdict is Verdict.OK, result.reason
    assert result.figures["world_size"] == world_size
    for nbytes in map(int, SIZES.split(",")):
        algbw = result.figures[f"algbw_gbps_{nbytes}"]
        assert algbw > 0
        assert algbw == pytest.approx(nbytes / (result.figures[f"us_{nbytes}"] / 1e6) / 1e9)
        assert result.figures[f"busbw_gbps_{nbytes}"] == pytest.approx(algbw * 2 * (world_size - 1) / world_size)
        assert result.figures[f"us_mean_{nbytes}"] > 0
    assert f"{world_size} ranks" in result.reason


def test_a_one_gpu_allreduce_is_not_applicable_rather_than_ok_at_zero() -> None:
    result = run_check("allreduce", ["--nproc", "1", "--sizes", SIZES, "--iters", "3"], deadline_s=60)
    assert result.verdict is Verdict.UNKNOWN and result.reason.startswith("not applicable")
    assert not any(k.startswith("busbw") for k in result.figures)


def test_bandwidth_is_the_median_calls_so_one_stalled_call_does_not_make_a_link_slow() -> None:
    # 4 calls of 1 MB at 2 ms and one stalled for 100 ms: the mean (21.6 ms) would read as a link
    # ten times slower; the median is the link's speed. The mean stays in the figures.
    median_s, mean_s = typical_and_mean([0.002, 0.002, 0.1, 0.002, 0.002])
    figures = figures_for([Timing(2**20, median_s, mean_s)], world_size=2)
    assert figures["algbw_gbps_1048576"] == pytest.approx(2**20 / 0.002 / 1e9)
    assert figures["us_1048576"] == pytest.approx(2000) and figures["us_mean_1048576"] == pytest.approx(21600)


def test_two_machines_with_two_ranks_each_form_one_group_of_four() -> None:
    master = f"127.0.0.1:{free_port()}"

    def machine(rank: int) -> CheckResult:
        args = ["--master", master, "--rank", str(rank), "--world-size", "2", "--local-ranks", "2"]
        return run_check("allreduce", [*args, "--sizes", "65536", "--iters", "3"], deadline_s=120)

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(machine, (0, 1))
    for result in (first, second):
        assert result.verdict is Verdict.OK, result.reason
        assert result.figures["world_size"] == 4 and "4 ranks" in result.reason
        algbw = result.figures["algbw_gbps_65536"]
        assert result.figures["busbw_gbps_65536"] == pytest.approx(algbw * 2 * 3 / 4)
    assert first.figures["us_65536"] == second.figures["us_65536"]  # both report the slowest rank's time


def test_allreduce_below_the_required_bandwidth_fails() -> None:
    args = ["--nproc", "2", "--sizes", "65536", "--iters", "2", "--min-busbw-gbps", "100000"]
    result = run_check("allreduce", args, deadline_s=120)
    assert result.verdict is Verdict.FAIL and "below the 100000 GB/s required" in result.reason


def test_bus_bandwidth_as_nccl_tests_counts_it() -> None:
    assert bus_bandwidth_gbps(10.0, 2) == 10.0
    assert bus_bandwidth_gbps(10.0, 8) == 17.5
    assert bus_bandwidth_gbps(10.0, 1) == 0.0  # one rank moves nothing over a link


def test_a_group_member_uses_the_interface_that_reaches_rank_0() -> None:
    import psutil

    loopback = route_interface("127.0.0.1")
    assert loopback is not None and any(a.address == "127.0.0.1" for a in psutil.net_if_addrs()[loopback])
    assert route_interface("not-an-address") is None


def test_matmul_and_membw_measure_the_cpu() -> None:
    matmul = run_check("matmul", ["--seconds", "0.3", "--size", "256"], deadline_s=120)
    assert matmul.verdict is Verdict.OK and matmul.figures["tflops_CPU"] > 0 and "fp32" in matmul.reason
    membw = run_check("membw", ["--mib", "16", "--iters", "3"], deadline_s=120)
    assert membw.verdict is Verdict.OK and membw.figures["gbps_CPU"] > 0


def test_a_hang_past_the_deadline_is_unknown() -> None:
    result = run_check("matmul", ["--seconds", "600", "--size", "64"], deadline_s=2)
    assert result.verdict is Verdict.UNKNOWN and "did not finish within its 2 s deadline" in result.reason


def test_a_crash_is_unknown_with_the_reason() -> None:
    result = run_check("allreduce", ["--sizes", "not-a-number"], deadline_s=60)  # argparse refuses, exit 2
    assert result.verdict is Verdict.UNKNOWN and "without an answer" in result.reason and "--sizes" in result.reason
    result = run_check("allreduce", ["--master", "127.0.0.1:1", "--world-size", "2", "--rank", "1"], deadline_s=3)
    assert result.verdict is Verdict.UNKNOWN  # the group never forms: hung, then killed


def test_answers_that_contradict_themselves_are_unknown() -> None:
    ok = '{"check": "matmul", "verdict": "OK", "reason": "fine", "figures": {}}'
    assert interpret("matmul", 0, ok, "", 0.0).verdict is Verdict.OK
    assert "exited 1" in interpret("matmul", 1, ok, "", 0.0).reason
    assert "unreadable" in interpret("matmul", 0, '{"check": "matmul"}', "", 0.0).reason
    assert interpret("matmul", -9, "", "Killed", 0.0).reason == "exited -9 without an answer: Killed"


_IN_A_FRESH_PROCESS = """
import asyncio, sys
from agent.local_checks import LocalChecks
from gpus.simulated import SimulatedBackend
from protos.vigil.v1 import agent_pb2
request = agent_pb2.RunCheck(request_id="r1", check="matmul", params={"seconds": "0.2", "size": "128"}, deadline_s=120)
result = asyncio.run(LocalChecks("n1", SimulatedBackend("n1", 1)).run(request))
print(result.verdict, result.figures["tflops_CPU"], "torch" in sys.modules)
"""


def test_the_agent_runs_a_workload_check_as_a_subprocess() -> None:
    """In a process of its own (this one has loaded torch long ago): the agent's answer comes from a
    workload that ran, and torch never entered the agent's process."""
    out = subprocess.run([sys.executable, "-c", _IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    verdict, tflops, torch_loaded = out.stdout.split()
    assert int(verdict) == common_pb2.OK and float(tflops) > 0
    assert torch_loaded == "False"


def test_the_allreduce_guards_exactly_the_gpus_its_members_use() -> None:
    import argparse

    from checks.allreduce import add_arguments, gpus_used

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert gpus_used(parser.parse_args([]), 8) == list(range(8))  # local: every GPU
    assert gpus_used(parser.parse_args(["--nproc", "2"]), 8) == [0, 1]
    pairwise = ["--master", "10.0.0.1:29400", "--rank", "1", "--world-size", "2", "--gpu", "5"]
    assert gpus_used(parser.parse_args(pairwise), 8) == [5]  # one member of a pair: its own GPU
    assert gpus_used(parser.parse_args([*pairwise[:6], "--local-ranks", "4"]), 8) == [0, 1, 2, 3]
