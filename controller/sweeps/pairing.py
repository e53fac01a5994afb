"""Pairwise inter-node all-reduce: pair the nodes, flag the slow pairs, and isolate the culprit. Pure.

Round 1 pairs every node with another (a perfect matching; with an odd count the last node also
joins a pair of the round, as a third run later). All pairs of a round run at once, so a round
costs one all-reduce's time whatever the node count. A pair is slow when its bus bandwidth is
below the threshold, or far below the fleet (``checks.judge.fleet_outliers``: median and spread).
Round 2 re-pairs each member of a slow pair with a different known-good node (a member of a fast
pair): the member whose new pair is slow again is the culprit; its partner is cleared. A member
that is slow with every partner is the culprit even if both are; a slow pair whose members are
both fast with good partners is run once more, and reported as the link between them only if it is
slow again (a pair slow once by chance is "not reproduced").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from checks.judge import fleet_outliers

Pair = tuple[str, str]


def pair_up(nodes: Sequence[str]) -> list[Pair]:
    """Round 1: (n0, n1), (n2, n3), ...; an odd last node is paired with n0 (run in a later batch)."""
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 == 1 and len(nodes) > 1:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def batches(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """Split pairs into batches in which no node appears twice (each batch runs at once)."""
    out: list[list[Pair]] = []
    for pair in pairs:
        for batch in out:
            if not any(n in p for p in batch for n in pair):
                batch.append(pair)
                break
        else:
            out.append([pair])
    return out


def slow_pairs(busbw: Mapping[Pair, float], min_busbw_gbps: float, max_below_median: float) -> list[Pair]:
    """Pairs below the fixed threshold, or far below the fleet of pairs."""
    named = {f"{a}|{b}": v for (a, b), v in busbw.items()}
    outliers = set(fleet_outliers(named, max_below_median))
    return [p for p, v in busbw.items() if v < min_busbw_gbps or f"{p[0]}|{p[1]}" in outliers]


@dataclass(frozen=True, slots=True)
class IsolationPlan:
    pairs: list[Pair]  # (suspect, known-good partner)
    untestable: list[str]  # suspects left without a good partner (too few good nodes)


def plan_isolation(
    slow: Sequence[Pair],
    all_pairs: Sequence[Pair],
    prefer: Callable[[str, list[str]], list[str]] | None = None,
    exclude: Collection[str] = (),
    suspects: Sequence[str] | None = None,
) -> IsolationPlan:
    """Each member of a slow pair with a known-good node (one that was in a fast pair only),
    spread over them. ``prefer(suspect, good)``: the good nodes to take first for this suspect
    (a topology-aware sweep re-tests across leaves what was slow across leaves). ``exclude``: nodes
    that are nobody's known-good partner whatever their pairs (those behind a blamed switch).
    ``suspects``: the members to re-test, where not every member of a slow pair is one (a node
    behind a blamed uplink is no suspect for its slow pairs across: the uplink explains them).
    Where no node was in fast pairs only (a small fleet with a bad node and a pair slow by
    chance), a suspect is re-paired with a node that was fast somewhere and never slow with it,
    the fewest slow pairs first."""
    suspects = list(dict.fromkeys(n for p in slow for n in p) if suspects is None else suspects)
    in_slow = {n for p in slow for n in p}
    good = [n for p in all_pairs if p not in slow for n in p if n not in in_slow and n not in exclude]
    good = list(dict.fromkeys(good))
    fast = [n for p in all_pairs if p not in slow for n in p if n not in exclude]
    slow_count = {n: sum(n in p for p in slow) for n in fast}
    fast = sorted(dict.fromkeys(fast), key=lambda n: slow_count[n])
    pairs, untestable = [], []
    for i, suspect in enumerate(suspects):
        candidates, pick = (prefer(suspect, good) if prefer else []) or good, i  # spread over the good
        if not candidates:
            met = {n for p in slow if suspect in p for n in p}
            fallback = [n for n in fast if n not in met]
            candidates, pick = (prefer(suspect, fallback) if prefer else []) or fallback, 0  # the likeliest first
        if candidates:
            pairs.append((suspect, candidates[pick % len(candidates)]))
        else:
            untestable.append(suspect)
    return IsolationPlan(pairs, untestable)


@dataclass(frozen=True, slots=True)
class Finding:
    node: str  # the culprit node, "a|b" for the link between two nodes that are each fine, or a component
    reason: str  # the evidence
    kind: str = "node"  # node, link, node-uplink; leaf, leaf-uplink, spine (controller.fabric)
    nodes: tuple[str, ...] = ()  # the nodes behind a component
    # The one slow run the blame rests on, to run once more (``to_confirm``): a node's re-test with
    # its known-good partner, a link's own pair; None where it needs none (a run that failed outright).
    pair: Pair | None = None

    @property
    def is_component(self) -> bool:
        """A part of the fabric above the nodes: nobody's own fault."""
        return self.kind in ("leaf", "leaf-uplink", "spine")


def healthy_median(first: Mapping[Pair, float], slow: Collection[Pair]) -> float:
    """The first round's healthy pairs' median bandwidth (0 without any)."""
    good_level = [v for p, v in first.items() if p not in slow]
    return statistics.median(good_level) if good_level else 0.0


def slow_beside_first(
    runs: Mapping[Pair, float],
    first: Mapping[Pair, float],
    slow: Collection[Pair],
    min_busbw_gbps: float,
    max_below_median: float,
) -> dict[Pair, float]:
    """The later runs that are slow against the first round's healthy pairs (their median)."""
    reference = healthy_median(first, slow)
    return {
        p: v
        for p, v in runs.items()
        if v < min_busbw_gbps or (reference > 0 and v < (1 - max_below_median) * reference)
    }


def culprits(
    slow: Sequence[Pair],
    retest: Mapping[Pair, float],
    first: Mapping[Pair, float],
    min_busbw_gbps: float,
    max_below_median: float,
    errors: Mapping[Pair, str] | None = None,
    retest_slow: Mapping[Pair, str] | None = None,
) -> list[Finding]:
    """Who is to blame for each slow pair, from the re-pairing round. ``errors``: why a pair that
    counts as 0 GB/s could not run at all. ``retest_slow``: the re-tests judged already (at each
    size, with the evidence), instead of by their bandwidth against the first round's. A node or a
    link found here is a hypothesis until its pair runs again (``to_confirm``, ``confirmed``)."""
    reference = healthy_median(first, slow)
    errors = errors or {}
    if retest_slow is not None:
        slow_alone = {pair: v for pair, v in retest.items() if pair in retest_slow}
    else:
        slow_alone = slow_beside_first(retest, first, slow, min_busbw_gbps, max_below_median)
    findings: list[Finding] = []
    for a, b in slow:
        for (n, good), value in slow_alone.items():
            if n not in (a, b):
                continue
            if error := errors.get((n, good)):
                findings.append(Finding(n, f"all-reduce with known-good {good} failed too: {error}", "node", (n,)))
            else:
                measured = retest_slow[(n, good)] if retest_slow is not None else f"{value:.3g} GB/s"
                why = f"slow with known-good {good} too: {measured}" + (
                    "" if retest_slow is not None else f" (fleet {reference:.3g})"
                )
                findings.append(Finding(n, why, "node", (n,), (n, good)))
        blamed = [n for n in (a, b) if any(s == n for s, _ in slow_alone)]
        # The link only on evidence: each member was re-tested with a known-good node and was fast
        # there. A member never re-tested (no known-good partner, no agent to run it) is unknown.
        fast_elsewhere = all(any((n, g) not in slow_alone for g in _partners(retest, n)) for n in (a, b))
        if not blamed and fast_elsewhere:
            why = f"each is fast with another node: the link between them, {first[(a, b)]:.3g} GB/s"
            findings.append(Finding(f"{a}|{b}", why, "link", (a, b), (a, b)))
    return list({f.node: f for f in findings}.values())


def to_confirm(found: Sequence[Finding]) -> list[Pair]:
    """The pairs the node and link findings rest on, each to run once more before it is blamed (a
    re-test slow once, or two nodes slow together once, may have met a busy moment, not a fault)."""
    return list(dict.fromkeys(f.pair for f in found if f.pair is not None))


def confirmed(found: Sequence[Finding], again: Collection[Pair], slow_again: Mapping[Pair, str]) -> list[Finding]:
    """The findings less each whose pair ran again (``again``) and was fast: not reproduced. One
    slow again says so; one that could not run again stands on the first evidence."""
    out = []
    for f in found:
        if f.pair is None or f.pair not in again:
            out.append(f)
        elif f.pair in slow_again:
            why = f"{f.reason}; slow again when run once more: {slow_again[f.pair]}"
            out.append(replace(f, reason=why))
    return out


def _partners(retest: Mapping[Pair, float], node: str) -> list[str]:
    return [g for (s, g) in retest if s == node]
