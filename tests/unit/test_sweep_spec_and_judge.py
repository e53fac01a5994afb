from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from checks.result import CheckResult, NotRun, Verdict
from controller.edge.agent_sessions import peer_host
from controller.sweeps.judge import (
    NodeCheck,
    PairRun,
    Row,
    headline,
    judge_fleet,
    make_up_pairs,
    outcome,
    pair_basis,
    pair_rows,
    pair_run,
)
from controller.sweeps.pairing import Finding
from controller.sweeps.spec import (
    ALL_CHECKS,
    PAIR_PORT_TRIES,
    SweepConfig,
    SweepError,
    master_address,
    pair_params,
    pair_port,
    pairs_at_once,
    sweep_spec,
)


def matmul(node: str, per_gpu: list[float], peak: float = 989.0) -> NodeCheck:
    figures = {f"tflops_GPU{i}": v for i, v in enumerate(per_gpu)} | {"expected_peak_tflops": peak}
    return NodeCheck(node, CheckResult("matmul", Verdict.OK, "ok", figures))


def test_a_spec_completes_the_request_from_the_configuration() -> None:
    config = SweepConfig(params={"matmul": {"seconds": "10", "size": "8192"}})
    spec = sweep_spec(config, [], {"matmul.seconds": "2"}, False, 0.0, "")
    assert spec.checks == ALL_CHECKS and spec.requested_by == "unknown"
    assert spec.params["matmul"] == {"seconds": "2", "size": "8192"}  # the request's value wins
    assert spec.local_checks == ("gpu_health", "matmul", "membw", "allreduce") and spec.pairs
    spec = sweep_spec(config, ["pairs", "gpu_health", "pairs"], {}, True, 5.0, "sre")
    assert spec.checks == ("pairs", "gpu_health") and spec.min_busbw_gbps == 5.0 and spec.quarantine
    assert pair_params(spec, "10.0.0.1:29400", 1) == {"master": "10.0.0.1:29400", "rank": "1", "world-size": "2"}


@pytest.mark.parametrize(
    ("checks", "params", "words"),
    [
        (["gpu_burn"], {}, "no check named 'gpu_burn'"),
        ([], {"seconds": "5"}, "expected CHECK.ARG=VALUE"),
        ([], {"matmul.Seconds": "5"}, "not an argument name"),
        ([], {"matmul.seconds": "5 && reboot"}, "characters"),
        ([], {"pairs.rank": "0"}, "set by the sweep itself"),
        ([], {"burn.seconds": "5"}, "no check named 'burn'"),
        # As the check's own command line would refuse them, before any node runs it:
        ([], {"matmul.seconds": "abc"}, "matmul: argument --seconds: invalid float value: 'abc'"),
        ([], {"matmul.burn": "5"}, "matmul: unrecognized arguments: --burn 5"),
        ([], {"pairs.iters": "many"}, "pairs: argument --iters: invalid int value: 'many'"),
    ],
)
def test_a_bad_request_names_its_problem(checks: list[str], params: dict[str, str], words: str) -> None:
    with pytest.raises(SweepError, match=words):
        sweep_spec(SweepConfig(), checks, params, False, 0.0, "")


def test_a_bad_configuration_names_its_key() -> None:
    with pytest.raises(ValidationError, match="no check named 'burn'"):
        SweepConfig(checks=("gpu_health", "burn"))
    with pytest.raises(ValidationError, match="deadlines must be positive: matmul"):
        SweepConfig(deadline_s={"matmul": 0})
    partial = SweepConfig(deadline_s={"matmul": 5.0}).deadline_s
    assert partial["matmul"] == 5.0 and partial["gpu_health"] == 30.0  # the others keep their defaults


def test_ipv6_masters_are_bracketed_and_peers_parsed() -> None:
    assert master_address("fd00::7", 29400) == "[fd00::7]:29400"
    assert master_address("10.0.0.7", 29401) == "10.0.0.7:29401"
    assert peer_host("ipv4:10.0.0.7:41234") == "10.0.0.7"
    assert peer_host("ipv6:[fd00::7]:41234") == "fd00::7"
    assert peer_host("ipv6:%5B::1%5D:5") == "::1"
    assert peer_host("unix:/tmp/sock") == ""


@settings(max_examples=100, deadline=None)
@given(
    noise=st.lists(st.floats(0.97, 1.03), min_size=8 * 6, max_size=8 * 6),
    slow=st.floats(0.3, 0.7),
    bad=st.integers(0, 5),
)
def test_a_node_whose_gpus_are_all_slow_fails_against_the_fleet(noise: list[float], slow: float, bad: int) -> None:
    nodes = [
        matmul(f"n{n}", [790.0 * noise[n * 8 + g] * (slow if n == bad else 1.0) for g in range(8)]) for n in range(6)
    ]
    judged = {nc.node: nc.result for nc in judge_fleet(nodes, 0.25)}
    assert judged[f"n{bad}"].verdict is Verdict.FAIL and "below the fleet median" in judged[f"n{bad}"].reason
    assert all(r.verdict is Verdict.OK for n, r in judged.items() if n != f"n{bad}")


def test_each_gpu_model_is_judged_against_its_own_kind() -> None:
    fleet = [matmul(f"h{i}", [790.0] * 8) for i in range(4)] + [matmul(f"a{i}", [250.0] * 8, 312.0) for i in range(3)]
    assert all(nc.result.verdict is Verdict.OK for nc in judge_fleet(fleet, 0.25))
    failed = CheckResult("matmul", Verdict.FAIL, "GPU 3 at 10 TFLOP/s", {"tflops_GPU3": 10.0})
    judged = judge_fleet([*fleet, NodeCheck("x", failed)], 0.25)
    assert judged[-1].result == failed  # a failure keeps its own reason; it is not judged again


def test_a_node_whose_all_reduce_lags_the_fleet_fails() -> None:
    def allreduce(node: str, busbw: float, ranks: float = 8.0) -> NodeCheck:
        figures = {"world_size": ranks, "busbw_gbps_1073741824": busbw, "busbw_gbps_1048576": busbw / 10}
        return NodeCheck(node, CheckResult("allreduce", Verdict.OK, "nccl", figures))

    fleet = [allreduce(f"n{i}", 360.0 + i) for i in range(5)] + [allreduce("nvlink-down", 120.0)]
    fleet += [allreduce(f"small{i}", 90.0, ranks=2.0) for i in range(3)]  # 2-GPU nodes: their own kind
    judged = {nc.node: nc.result for nc in judge_fleet(fleet, 0.25)}
    assert judged["nvlink-down"].verdict is Verdict.FAIL
    assert judged["nvlink-down"].reason == "all-reduce at 120 GB/s busbw, 67% below the fleet median 361.5"
    assert [n for n, r in judged.items() if r.verdict is Verdict.FAIL] == ["nvlink-down"]


def test_headlines() -> None:
    assert headline(CheckResult("gpu_health", Verdict.OK, "", {"gpus": 8.0})) == "8 GPUs"
    assert headline(matmul("n", [790.0, 612.4]).result) == "612.4 TFLOP/s (slowest: GPU1)"
    cpu = CheckResult("membw", Verdict.OK, "", {"gbps_CPU": 7.25})
    assert headline(cpu) == "7.25 GB/s"
    ar = {"busbw_gbps_1024": 0.1, "busbw_gbps_1048576": 3.5, "world_size": 2.0}
    assert headline(CheckResult("allreduce", Verdict.OK, "", ar)) == "3.5 GB/s busbw"
    assert headline(CheckResult("allreduce", Verdict.UNKNOWN, "crashed")) == ""


def test_a_pair_that_could_not_run_counts_as_zero_with_its_reason() -> None:
    ok = CheckResult("allreduce", Verdict.OK, "", {"busbw_gbps_1024": 9.0})
    slower = CheckResult("allreduce", Verdict.OK, "", {"busbw_gbps_1024": 8.5})
    crashed = CheckResult("allreduce", Verdict.UNKNOWN, "did not finish within its 60 s deadline")
    assert pair_run(("a", "b"), ok, slower) == PairRun(8.5, by_size={1024: 8.5})
    assert pair_run(("a", "b"), ok, crashed) == PairRun(0.0, "b: did not finish within its 60 s deadline", by="b")
    silent = CheckResult("allreduce", Verdict.OK, "", {})
    assert pair_run(("a", "b"), silent, ok) == PairRun(9.0, by_size={1024: 9.0})  # both time the same all-reduce
    assert pair_run(("a", "b"), silent, silent).error == "the all-reduce reported no bus bandwidth"


def not_run(reason: str, cause: str) -> CheckResult:
    return CheckResult("allreduce", Verdict.UNKNOWN, reason, not_run=cause)


def test_a_pair_not_run_says_the_cause_that_is_neither_node_or_link() -> None:
    taken, stopped = not_run("port taken", NotRun.PORT_TAKEN), not_run("stopped", NotRun.STOPPED)
    crashed = CheckResult("allreduce", Verdict.UNKNOWN, "NCCL error: unhandled system error")
    ok = CheckResult("allreduce", Verdict.OK, "", {"busbw_gbps_1024": 9.0})
    # The member that could not run explains its partner, stopped for it or timed out waiting for it.
    assert pair_run(("a", "b"), taken, stopped) == PairRun(0.0, "a: port taken", not_run=NotRun.PORT_TAKEN, by="a")
    assert pair_run(("a", "b"), crashed, not_run("busy", NotRun.BUSY)).not_run == NotRun.BUSY
    assert pair_run(("a", "b"), ok, not_run("gone", NotRun.NO_AGENT)).not_run == NotRun.NO_AGENT
    # A member that failed as it ran explains a partner stopped for it: that failure is evidence.
    assert pair_run(("a", "b"), stopped, crashed) == PairRun(0.0, "b: NCCL error: unhandled system error", by="b")
    assert pair_run(("a", "b"), stopped, stopped).not_run == NotRun.STOPPED


def test_a_node_whose_pairs_were_not_run_is_unknown_never_judged() -> None:
    first = {
        ("a", "b"): PairRun(0.0, "a: a workload is using the GPU", not_run=NotRun.BUSY),
        ("c", "d"): PairRun(10.0),
        ("e", "f"): PairRun(10.2),
        ("g", "h"): PairRun(9.9),
    }
    basis = pair_basis(first, 0.0, 0.5)
    assert basis == "within 50% of the median pair (10 GB/s)"  # the pair not run is not a 0 in the median
    rows = {r.node: r for r in pair_rows(list("abcdefgh"), first, {}, [], [], [], basis)}
    assert rows["a"].verdict is rows["b"].verdict is Verdict.UNKNOWN
    assert rows["b"].reason == "not measured: a: a workload is using the GPU"
    assert rows["b"].figure == "not run with a" and rows["c"].verdict is Verdict.OK
    assert rows["a"].not_run == rows["b"].not_run == NotRun.BUSY and rows["c"].not_run == ""  # certification reads it
    # A suspect whose re-test could not run is UNKNOWN, with why; not "fast with" its partner at 0 GB/s.
    first[("a", "b")] = PairRun(1.0)
    retest = {("a", "c"): PairRun(0.0, "c: no answer", not_run=NotRun.NO_AGENT), ("b", "d"): PairRun(10.0)}
    rows = {r.node: r for r in pair_rows(list("abcd"), first, retest, [("a", "b")], [], [], basis)}
    assert rows["a"].verdict is Verdict.UNKNOWN and "the re-test with c could not run: c: no answer" in rows["a"].reason
    assert rows["a"].not_run == NotRun.NO_AGENT


def test_a_node_left_unmeasured_by_its_partner_gets_a_make_up_pair_and_the_cause_only_where_it_can_run() -> None:
    busy = PairRun(0.0, "b: a workload is using the GPU", not_run=NotRun.BUSY, by="b")
    taken = PairRun(0.0, "c: rank 0 could not listen", not_run=NotRun.PORT_TAKEN, by="c")
    runs = {("a", "b"): busy, ("c", "d"): taken, ("e", "f"): PairRun(10.0), ("g", "h"): PairRun(9.0)}
    # a (its partner busy), c (its own port: it can be rank 1) and d: each with a measured node, as rank 1
    assert make_up_pairs(runs) == [("e", "a"), ("f", "c"), ("g", "d")]
    gone = PairRun(0.0, "x: no answer", not_run=NotRun.NO_AGENT, by="x")
    busy_z = PairRun(0.0, "z: a workload is using the GPU", not_run=NotRun.BUSY, by="z")
    assert make_up_pairs({("x", "y"): gone, ("z", "w"): busy_z}) == [("y", "w")]  # nobody measured: each other
    assert make_up_pairs({("e", "f"): PairRun(10.0)}) == []


@given(base=st.integers(1024, 65000), span=st.integers(PAIR_PORT_TRIES, 70000), pairs=st.integers(1, 5000))
def test_no_two_pairs_of_a_round_nor_two_tries_share_a_port(base: int, span: int, pairs: int) -> None:
    config = SweepConfig(pair_port_base=base, pair_port_span=span)
    pairs = min(pairs, pairs_at_once(config))
    ports = [pair_port(config, k, pairs, attempt) for k in range(pairs) for attempt in range(PAIR_PORT_TRIES)]
    assert len(set(ports)) == len(ports) and base <= min(ports) and max(ports) <= 65535


def test_the_default_ports_keep_clear_of_torchrun_and_kubernetes_node_ports() -> None:
    config = SweepConfig()
    ports = {pair_port(config, k, pairs_at_once(config), a) for k in range(1000) for a in range(PAIR_PORT_TRIES)}
    assert not ports & {29400, 29500} and max(ports) < 29400  # torchrun's rendezvous and master ports; 30000+


def test_pair_rows_blame_the_culprit_and_clear_its_partner() -> None:
    first = {("a", "b"): PairRun(10.0), ("c", "d"): PairRun(1.0), ("e", "f"): PairRun(10.2)}
    retest = {("c", "a"): PairRun(1.1), ("d", "b"): PairRun(9.9)}
    findings = [Finding("c", "slow with known-good a too")]
    basis = pair_basis(first, 0.0, 0.5)
    rows = {r.node: r for r in pair_rows(list("abcdef"), first, retest, [("c", "d")], [], findings, basis)}
    assert rows["c"].verdict is Verdict.FAIL and rows["c"].figure == "1 GB/s with d"
    assert rows["d"].verdict is Verdict.OK and rows["d"].reason == "slow with c, fast with b (9.9 GB/s): c is to blame"
    assert rows["a"].reason == "within 50% of the median pair (10 GB/s)"
    untestable = pair_rows(["a", "b"], {("a", "b"): PairRun(0.0, "a: crashed")}, {}, [("a", "b")], ["a", "b"], [], "")
    assert [r.verdict for r in untestable] == [Verdict.UNKNOWN] * 2 and "no known-good node" in untestable[0].reason


def test_what_a_pair_is_judged_against_is_said() -> None:
    two = {("a", "b"): PairRun(5.0), ("c", "d"): PairRun(5.0)}
    assert pair_basis(two, 0.0, 0.5).startswith("measured, not judged")
    assert pair_basis(two, 2.0, 0.5) == "above the 2 GB/s threshold"


def test_the_outcome_fails_on_a_slow_link_even_when_every_node_passes() -> None:
    ok = [Row("a", "pairs", Verdict.OK, "", ""), Row("b", "pairs", Verdict.OK, "", "")]
    assert outcome(ok, []).verdict is Verdict.OK
    assert outcome(ok, [Finding("a|b", "the link between them", "link", ("a", "b"))]).verdict is Verdict.FAIL
    assert outcome(ok, [Finding("leaf x", "slow", "leaf", ("a", "b"))]).verdict is Verdict.FAIL
    mixed = [*ok, Row("a", "matmul", Verdict.UNKNOWN, "", ""), Row("b", "gpu_health", Verdict.FAIL, "", "")]
    result = outcome(mixed, [])
    assert (result.failed, result.unknown, result.verdict) == (["b"], ["a"], Verdict.FAIL)
