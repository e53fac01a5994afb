from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.sweeps.pairing import (
    batches,
    confirmed,
    culprits,
    pair_up,
    plan_isolation,
    slow_beside_first,
    slow_pairs,
    to_confirm,
)


def simulate(nodes: list[str], speed: dict[str, float], pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """A pair runs at the speed of its slower member (a throttled NIC caps the link)."""
    return {(a, b): min(speed[a], speed[b]) for a, b in pairs}


def sweep(nodes: list[str], speed: dict[str, float], threshold: float = 1.0) -> tuple[list[str], int]:
    first_pairs = pair_up(nodes)
    first = simulate(nodes, speed, first_pairs)
    slow = slow_pairs(first, min_busbw_gbps=threshold, max_below_median=0.3)
    plan = plan_isolation(slow, first_pairs)
    retest = simulate(nodes, speed, plan.pairs)
    rounds = len(batches(first_pairs)) + len(batches(plan.pairs))
    return sorted(f.node for f in culprits(slow, retest, first, threshold, 0.3)), rounds


def test_pairs_cover_every_node_once_per_batch() -> None:
    assert pair_up(["a", "b", "c", "d"]) == [("a", "b"), ("c", "d")]
    assert pair_up(["a", "b", "c"]) == [("a", "b"), ("c", "a")]
    assert batches(pair_up(["a", "b", "c"])) == [[("a", "b")], [("c", "a")]]


def test_the_slow_node_is_named_not_its_partner() -> None:
    nodes = [f"n{i}" for i in range(8)]
    speed = dict.fromkeys(nodes, 10.0) | {"n5": 2.0}
    found, rounds = sweep(nodes, speed)
    assert found == ["n5"] and rounds == 2


def test_a_bad_link_between_two_good_nodes_is_named_as_the_link() -> None:
    nodes = ["a", "b", "c", "d", "e", "f"]
    first_pairs = pair_up(nodes)
    first = {p: 10.0 for p in first_pairs} | {("a", "b"): 2.0}
    slow = slow_pairs(first, 1.0, 0.3)
    plan = plan_isolation(slow, first_pairs)
    retest = dict.fromkeys(plan.pairs, 10.0)
    (finding,) = culprits(slow, retest, first, 1.0, 0.3)
    assert finding.node == "a|b" and "link between them" in finding.reason


def test_a_link_is_blamed_only_if_its_pair_is_slow_again() -> None:
    """Two nodes slow together once, each fast with a known-good node: their pair runs once more;
    fast then, it was a busy moment (no finding); slow again, it is the link, said so."""
    nodes = ["a", "b", "c", "d", "e", "f"]
    first_pairs = pair_up(nodes)
    first = {p: 10.0 for p in first_pairs} | {("a", "b"): 2.0}
    slow = slow_pairs(first, 1.0, 0.3)
    retest = dict.fromkeys(plan_isolation(slow, first_pairs).pairs, 10.0)
    found = culprits(slow, retest, first, 1.0, 0.3)
    assert to_confirm(found) == [("a", "b")]
    assert confirmed(found, [("a", "b")], {}) == []
    (link,) = confirmed(found, [("a", "b")], {("a", "b"): "2.1 GB/s"})
    assert link.node == "a|b" and "slow again when run once more: 2.1 GB/s" in link.reason
    assert confirmed(found, [], {}) == found  # not run again (its agents gone): the first evidence stands
    again = slow_beside_first({("a", "b"): 9.5}, first, slow, 1.0, 0.3)
    assert again == {}


def test_without_good_nodes_nothing_can_be_isolated() -> None:
    plan = plan_isolation([("a", "b")], [("a", "b")])
    assert plan.pairs == [] and plan.untestable == ["a", "b"]


def fleet(n: int, data: st.DataObject, bad_speed: st.SearchStrategy[float]) -> tuple[list[str], str, dict[str, float]]:
    nodes = [f"n{i:03d}" for i in range(n)]
    bad = data.draw(st.sampled_from(nodes))
    noise = data.draw(st.lists(st.floats(9.0, 11.0), min_size=n, max_size=n))
    return nodes, bad, dict(zip(nodes, noise, strict=True)) | {bad: data.draw(bad_speed)}


@settings(max_examples=200, deadline=None)
@given(st.integers(4, 300), st.data())
def test_one_node_below_the_threshold_is_found_in_a_fixed_number_of_rounds(n: int, data: st.DataObject) -> None:
    nodes, bad, speed = fleet(n, data, st.floats(0.5, 7.9))
    found, rounds = sweep(nodes, speed, threshold=8.0)
    assert found == [bad]
    assert rounds <= 4  # two batches a round at most (an odd count adds one): never more with more nodes


@settings(max_examples=200, deadline=None)
@given(st.integers(8, 300), st.data())
def test_one_node_far_below_the_fleet_is_found_without_a_threshold(n: int, data: st.DataObject) -> None:
    nodes, bad, speed = fleet(n, data, st.floats(0.5, 5.0))
    found, _ = sweep(nodes, speed, threshold=0.0)
    assert found == [bad]


def test_a_slow_pair_with_no_known_good_partner_blames_nobody() -> None:
    slow = [("a", "b")]
    first = {("a", "b"): 2.0}
    # Nobody was re-tested (a two-node cluster, the whole fabric slow, agents that cannot run it):
    assert culprits(slow, {}, first, 10.0, 0.3) == []
    # Only one member re-tested, and fast: the other is unknown, so still no link.
    assert culprits(slow, {("a", "c"): 50.0}, {**first, ("c", "d"): 50.0}, 10.0, 0.3) == []
    # Both re-tested and fast elsewhere: now it is the link.
    retest = {("a", "c"): 50.0, ("b", "d"): 50.0}
    (finding,) = culprits(slow, retest, {**first, ("c", "d"): 50.0}, 10.0, 0.3)
    assert finding.node == "a|b"


def test_a_node_is_blamed_only_if_its_re_test_is_slow_again() -> None:
    """n0 and n1 slow together (n1's fault); n0's re-test with a known-good node slow too, once, by
    chance (a busy host): both are found, and the pairs their blames rest on run once more; n0's
    fast then is not reproduced, n1's slow again stands, saying so."""
    nodes = [f"n{i}" for i in range(6)]
    first_pairs = pair_up(nodes)
    first = {p: 10.0 for p in first_pairs} | {("n0", "n1"): 2.0}
    slow = slow_pairs(first, 1.0, 0.3)
    plan = plan_isolation(slow, first_pairs)
    retest = dict.fromkeys(plan.pairs, 2.0)  # n1's slow for its fault, n0's by chance
    found = culprits(slow, retest, first, 1.0, 0.3)
    assert sorted(f.node for f in found) == ["n0", "n1"]
    again = to_confirm(found)
    assert sorted(again) == sorted(plan.pairs)
    slow_again = {p: "2.0 GB/s" for p in again if p[0] == "n1"}
    (n1,) = confirmed(found, again, slow_again)
    assert n1.node == "n1" and "slow again when run once more: 2.0 GB/s" in n1.reason
    # An all-reduce that failed outright is not a busy moment: that blame is not run again.
    errors = {p: "connection refused" for p in plan.pairs if p[0] == "n1"}
    failed = culprits(slow, retest, first, 1.0, 0.3, errors)
    assert [f.pair for f in failed if f.node == "n1"] == [None]
