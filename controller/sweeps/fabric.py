"""Topology-aware pairing: pair neighbours, then across leaves; judge each payload size against the
fleet; blame the smallest component the evidence points to. Pure.

Round 1 pairs the nodes under each leaf (their traffic crosses only that leaf switch); the cross
stage pairs the k-th node of each leaf with the k-th node of another leaf, a different leaf for each
k (the rounds of a round-robin tournament between leaves), so one round has each leaf meet up to
as many other leaves as it has nodes. A second cross round runs only where some leaf met fewer than
two others. Each pair all-reduces at several sizes (8 B latency to 1 GiB bandwidth); at each size a
pair is judged against the healthy pairs of its class (``references``, ``judge_pairs``). The slow
pairs run once more, and each counts at its better run (``better_of``): on a busy host a pair can
be slow once by chance, and one such pair beside a fault can make a small fabric's evidence point
at the wrong part (a node of a leaf of two slow in every pair, its pair across no evidence then).

Localisation, from the largest component down (each explains the slow pairs through it):
- a **leaf switch**: most of its nodes slow in every pair they ran (within the leaf and across),
  each with a partner that is not slow in every pair (a good node whose partners were all bad
  nodes is slow in every pair too: no evidence against its switch);
- a **leaf's uplink**: the leaf is fine within, every pair across of its own is slow, and it is slow
  with most of the other leaves it met (two or more); two leaves are "slow with each other" when
  most of their pairs are. Leaves are taken greedily, the one slow with the most leaves first, while
  a leaf is slow with two or more leaves not yet explained. A node slow in every pair it ran, its
  leaf's included, is a suspect of its own: its pairs across are no evidence against an uplink;
- a **spine or pod**: two or more of its leaves taken so, more than half its leaves (with no spine
  labels, all leaves are under one spine layer). With two leaves only, their slow pairs are the
  path between them: which uplink cannot be told;
- what is left is re-tested node by node (``controller.sweeps.pairing``): a node slow with every partner
  is to blame; one fine within its leaf and slow across is that **node's uplink**; two fine nodes
  slow together are the **link** between them. A node, its uplink or a link is blamed only once the
  pair its blame rests on (the node's re-test, the link's pair) is slow again when run once more (a
  pair slow once by chance, on a busy host, is not reproduced and blames nothing).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.sweeps.judge import PairRun, measured
from controller.sweeps.pairing import Finding, IsolationPlan, Pair, confirmed, culprits, plan_isolation
from controller.sweeps.topology import Place, Topology, leaves, size_label

WITHIN, ACROSS, ALL = "within", "across", "all"


def neighbour_pairs(nodes: Sequence[str], topology: Topology) -> list[Pair]:
    """Nodes under one leaf, two by two; a leaf's odd one out also pairs with its leaf's first (a
    later batch). Unplaced nodes are paired among themselves."""
    pairs: list[Pair] = []
    for members in leaves(nodes, topology).values():
        pairs += [(members[i], members[i + 1]) for i in range(0, len(members) - 1, 2)]
        if len(members) % 2 == 1 and len(members) >= 3:
            pairs.append((members[-1], members[0]))
    return pairs


def tournament(teams: int) -> list[list[tuple[int, int]]]:
    """Round-robin rounds (the circle method): every team meets every other once; with an odd
    count one team sits each round out."""
    ids: list[int | None] = [*range(teams), *([None] if teams % 2 else [])]
    n = len(ids)
    rounds = []
    for _ in range(n - 1):
        matches = [(ids[i], ids[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in matches if a is not None and b is not None])
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def cross_pairs(nodes: Sequence[str], topology: Topology, shift: int = 0) -> list[Pair]:
    """One round across leaves: the k-th node of each leaf meets the k-th node of the leaf it plays
    in the tournament's (k + shift)-th round. Every node at most once: a perfect matching or less."""
    groups = list(leaves(nodes, topology).values())
    schedule = tournament(len(groups))
    if not schedule:
        return []
    pairs: list[Pair] = []
    for k in range(max(len(g) for g in groups)):
        for a, b in schedule[(k + shift) % len(schedule)]:
            if k < len(groups[a]) and k < len(groups[b]):
                pairs.append((groups[a][k], groups[b][k]))
    return pairs


def cover_leftovers(nodes: Sequence[str], topology: Topology, across: Sequence[Pair]) -> list[Pair]:
    """Pairs across leaves for the nodes the cross rounds left out (a leaf sitting a tournament round
    out, leaves of unequal size): each with a node of another leaf, a different one each where it can."""
    paired = {n for p in across for n in p}
    used: set[str] = set()
    out = []
    for node in nodes:
        if node in paired or not _leaf(topology, node):
            continue
        others = [n for n in nodes if _leaf(topology, n) not in ("", _leaf(topology, node))]
        fresh = [n for n in others if n not in used and n not in paired] or [n for n in others if n not in used]
        if choice := fresh or others:
            out.append((node, choice[0]))
            used.update((node, choice[0]))
    return out


def leaves_met(pairs: Sequence[Pair], topology: Topology) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, b in pairs:
        la, lb = _leaf(topology, a), _leaf(topology, b)
        out.setdefault(la, set()).add(lb)
        out.setdefault(lb, set()).add(la)
    return out


def needs_second_cross_round(nodes: Sequence[str], topology: Topology, first: Sequence[Pair]) -> bool:
    """Whether some leaf met fewer than two other leaves (when there are three or more): then one
    leaf's uplink cannot be told from the other's."""
    groups = [g for g in leaves(nodes, topology) if g]
    if len(groups) < 3:
        return False
    met = leaves_met(first, topology)
    return any(len(met.get(g, set())) < 2 for g in groups)


def pair_class(pair: Pair, topology: Topology) -> str:
    return WITHIN if _leaf(topology, pair[0]) == _leaf(topology, pair[1]) else ACROSS


References = dict[tuple[str, int], float]  # (class, size) -> what healthy pairs do there


def references(runs: Mapping[Pair, PairRun], topology: Topology) -> tuple[References, bool]:
    """What healthy pairs do at each size and class: the upper quartile, not the median (a bad leaf
    or spine can slow half the pairs of a small fleet). A class of fewer than three pairs is pooled
    with the other (the bool: whether the classes were pooled)."""
    ran = {p: r for p, r in runs.items() if not r.error and not r.not_run}
    classes = {cls: [r for p, r in ran.items() if pair_class(p, topology) == cls] for cls in (WITHIN, ACROSS)}
    pooled = min(len(c) for c in classes.values()) < 3
    if pooled:
        classes = {ALL: list(ran.values())}
    out: References = {}
    for cls, mine in classes.items():
        for size in {s for r in mine for s in r.by_size}:
            values = [r.by_size[size] for r in mine if size in r.by_size]
            if len(values) >= 3:
                out[(cls, size)] = statistics.quantiles(values, n=4, method="inclusive")[2]
    return out, pooled


def judge_pairs(
    runs: Mapping[Pair, PairRun],
    refs: tuple[References, bool],
    topology: Topology,
    min_busbw_gbps: float,
    max_below: float,
) -> dict[Pair, str]:
    """The slow pairs, each with its evidence: at each size, more than ``max_below`` under what healthy
    pairs of its class do (``references``, from the first stage: re-tests are judged against the same);
    the fixed threshold applies at the largest size. A pair that failed as it ran is slow, with its
    reason; one not run at all (``PairRun.not_run``) is neither slow nor fast."""
    table, pooled = refs
    out: dict[Pair, list[str]] = {}
    for pair, run in measured(runs).items():
        if run.error:
            out[pair] = [run.error]
            continue
        cls = ALL if pooled else pair_class(pair, topology)
        largest = max(run.by_size, default=0)
        for size in sorted(run.by_size):
            v, reference = run.by_size[size], table.get((cls, size), 0.0)
            where = "pairs" if pooled else f"pairs {cls} leaves"
            if cls == ACROSS and size == largest and table.get((WITHIN, size), 0.0) > reference:
                # Bandwidth: a non-blocking fabric carries as much across leaves as within one (and a
                # bad spine slows most pairs across: they cannot be their own only reference).
                reference, where = table[(WITHIN, size)], "pairs within leaves"
            if reference and v < (1 - max_below) * reference:
                below = f"{1 - v / reference:.0%} below healthy {where} ({reference:.3g})"
                out.setdefault(pair, []).append(f"{size_label(size)}: {v:.3g} GB/s, {below}")
        if min_busbw_gbps and largest and (v := run.by_size[largest]) < min_busbw_gbps:
            out.setdefault(pair, []).append(f"{size_label(largest)}: {v:.3g} GB/s, below {min_busbw_gbps:g}")
    return {p: "; ".join(why) for p, why in out.items()}


def _leaf(topology: Topology, node: str) -> str:
    return topology.get(node, Place()).leaf


@dataclass(frozen=True, slots=True)
class Localised:
    components: list[Finding]  # leaf, leaf-uplink and spine findings, with the nodes behind each
    explained: set[Pair]  # the slow pairs those components account for
    domains: dict[str, str]  # component name -> the failure domain it is (label=value)


def localise(
    nodes: Sequence[str],
    topology: Topology,
    runs: Sequence[Pair],
    slow: Mapping[Pair, str],
    leaf_label: str,
    spine_label: str,
) -> Localised:
    """The leaf switches, spines and leaf uplinks the slow pairs point to (module docstring)."""
    groups = {leaf: members for leaf, members in leaves(nodes, topology).items() if leaf}
    mine: dict[str, list[Pair]] = {}
    for pair in runs:
        for node in pair:
            mine.setdefault(node, []).append(pair)
    components: list[Finding] = []
    explained: set[Pair] = set()
    domains: dict[str, str] = {}

    def blame(kind: str, name: str, domain: str, behind: list[str], through: set[Pair], evidence: str) -> None:
        components.append(Finding(name, evidence, kind, tuple(behind)))
        explained.update(p for p in through if p in slow)
        domains[name] = domain

    # Leaf switches: most of the leaf's nodes slow in every pair, its pairs within included. A node
    # counts only when it is slow with a partner that is not: a good node whose every partner was a
    # bad node (slow in every pair itself) is slow in every pair too, and that is no evidence
    # against its switch (three bad nodes in three leaves blamed one of the leaves otherwise).
    slow_everywhere = {n for n, pairs in mine.items() if all(p in slow for p in pairs)}

    def slow_itself(node: str) -> bool:
        return node in slow_everywhere and any(
            partner not in slow_everywhere for p in mine[node] for partner in p if partner != node
        )

    bad_leaves = set()
    for leaf, members in groups.items():
        within = _within(runs, topology, leaf)
        all_slow = [n for n in members if slow_itself(n)]
        mostly_slow = bool(within) and sum(p in slow for p in within) * 2 > len(within)
        if len(members) >= 2 and mostly_slow and len(all_slow) * 2 > len(members):
            bad_leaves.add(leaf)
            through = {p for n in members for p in mine.get(n, [])}
            evidence = (
                f"{len(all_slow)} of its {len(members)} nodes slow in every pair, within the leaf and across "
                f"({_example(slow, within)})"
            )
            blame("leaf", f"leaf {leaf}", f"{leaf_label}={leaf}", members, through, evidence)

    # A node slow in every pair it ran, within its leaf too, is a suspect of its own (its link, its
    # NIC: the re-tests say): its pairs across are no evidence against an uplink or a spine.
    suspects = {
        n
        for leaf, members in groups.items()
        if leaf not in bad_leaves
        for n in members
        if mine.get(n) and all(p in slow for p in mine[n]) and any(pair_class(p, topology) == WITHIN for p in mine[n])
    }
    # Leaves slow across while fine within: their uplinks, or the spine above several of them.
    across = [
        p
        for p in runs
        if pair_class(p, topology) == ACROSS
        and not ({_leaf(topology, n) for n in p} & bad_leaves)
        and not (set(p) & suspects)
    ]
    between: dict[frozenset[str], list[Pair]] = {}
    for pair in across:
        between.setdefault(frozenset(_leaf(topology, n) for n in pair), []).append(pair)
    # A bad edge: two leaves whose pairs are mostly slow.
    edges = {e for e, ps in between.items() if "" not in e and sum(p in slow for p in ps) * 2 > len(ps)}
    within_of = {leaf: _within(runs, topology, leaf) for leaf in groups}
    fine_within = {leaf for leaf, ps in within_of.items() if sum(p in slow for p in ps) * 2 <= len(ps)}
    # A leaf slow with most of the leaves it met (two or more) is a candidate; take the one with the
    # most slow leaves not yet explained, until every slow pair of leaves is explained.
    met = {leaf: sum(leaf in e for e in between if "" not in e) for leaf in fine_within}
    slow_with = {leaf: sum(leaf in e for e in edges) for leaf in fine_within}
    # ...and every pair across of its own slow: a bad uplink slows each of them, while a good leaf
    # whose partners' faults (and one pair slow by chance) slow some may look slow with two leaves.
    all_across_slow = {
        leaf for leaf in fine_within if all(p in slow for p in across if leaf in (_leaf(topology, n) for n in p))
    }
    candidates = [
        leaf
        for leaf in groups
        if leaf in slow_with
        and leaf in all_across_slow
        and slow_with[leaf] * 2 > met[leaf]
        and (slow_with[leaf] >= 2 or len(groups) == 2)
    ]
    picked: list[str] = []
    while edges and candidates:
        degree = {leaf: sum(leaf in e for e in edges) for leaf in candidates}
        leaf = max(candidates, key=lambda name: degree[name])
        if degree[leaf] < (1 if len(groups) == 2 else 2):
            break  # one pair of leaves left slow is no uplink's evidence: its pairs are re-tested
        picked.append(leaf)
        candidates.remove(leaf)
        edges = {e for e in edges if leaf not in e}
        if len(groups) == 2:
            break  # two leaves: which of the two uplinks cannot be told
    spines: dict[str, list[str]] = {}
    for leaf, members in groups.items():
        spines.setdefault(topology[members[0]].spine, []).append(leaf)
    for spine, under in spines.items():
        bad = [leaf for leaf in picked if leaf in under]
        if len(groups) == 2 and bad:
            bad = list(groups)  # the path between the two leaves: neither uplink alone is proven
        elif len(bad) < 2 or len(bad) * 2 <= len(under):
            continue
        through = {p for p in across if {_leaf(topology, n) for n in p} & set(bad)}
        name = f"spine {spine}" if spine else f"the spine layer above leaves {', '.join(under)}"
        domain = f"{spine_label}={spine}" if spine else ""
        shown = ", ".join(f"{leaf} {_slow_of(slow, through, leaf, topology)}" for leaf in bad)
        behind = [n for leaf in under for n in groups[leaf]]
        blame("spine", name, domain, behind, through, f"leaves slow across, fine within: {shown}")
        picked = [leaf for leaf in picked if leaf not in bad]
    for leaf in picked:
        through = {p for p in across if leaf in (_leaf(topology, n) for n in p)}
        evidence = (
            f"fine within the leaf, slow across: {_slow_of(slow, through, leaf, topology)} "
            f"({_example(slow, sorted(through))})"
        )
        blame("leaf-uplink", f"uplink of leaf {leaf}", f"{leaf_label}={leaf}", groups[leaf], through, evidence)
    return Localised(components, explained, domains)


def _within(runs: Sequence[Pair], topology: Topology, leaf: str) -> list[Pair]:
    return [p for p in runs if pair_class(p, topology) == WITHIN and _leaf(topology, p[0]) == leaf]


def _slow_of(slow: Mapping[Pair, str], pairs: set[Pair], leaf: str, topology: Topology) -> str:
    mine = [p for p in pairs if leaf in (_leaf(topology, n) for n in p)]
    return f"{sum(p in slow for p in mine)} of {len(mine)} pairs across"


def _example(slow: Mapping[Pair, str], pairs: Sequence[Pair]) -> str:
    """One slow pair's evidence, to show what the component's pairs measured."""
    for pair in pairs:
        if pair in slow:
            return f"e.g. {pair[0]} <-> {pair[1]}: {slow[pair]}"
    return "no pair slow"


def node_uplinks(
    findings: Sequence[Finding], topology: Topology, runs: Sequence[Pair], slow: Mapping[Pair, str]
) -> list[Finding]:
    """A culprit node that was fine within its leaf and slow across leaves: its uplink, not the node."""
    out = []
    for f in findings:
        if f.kind != "node":
            out.append(f)
            continue
        within = [p for p in runs if f.node in p and pair_class(p, topology) == WITHIN]
        across = [p for p in runs if f.node in p and pair_class(p, topology) == ACROSS]
        if within and not any(p in slow for p in within) and any(p in slow for p in across):
            leaf = _leaf(topology, f.node)
            why = f"fine within leaf {leaf}, slow across leaves: {f.reason}"
            out.append(replace(f, reason=why, kind="node-uplink"))
        else:
            out.append(f)
    return out


def suspect_in(pair: Pair, node: str, topology: Topology, behind: Collection[str]) -> bool:
    """Whether a slow pair is evidence against this member: not for a node behind a blamed component
    (a leaf, an uplink, a spine) when the pair goes across leaves, through that component."""
    return node not in behind or pair_class(pair, topology) == WITHIN


def retest_partners(
    slow: Sequence[Pair], topology: Topology, doubtful: Collection[str] = (), behind: Collection[str] = ()
) -> Callable[[str, list[str]], list[str]]:
    """For ``plan_isolation``: re-test a suspect over the path it was slow on. Slow within its leaf
    only: a good node of its leaf; slow across: a good node of a third leaf (neither end's), else of
    any other leaf. ``doubtful``: nodes taken only where no other will do (those that were in a slow
    pair a component explains: fast elsewhere, but not proven on every path). ``behind``: the nodes
    behind a blamed component, whose slow pairs across are not theirs (``suspect_in``)."""

    def on_path(suspect: str, good: list[str]) -> list[str]:
        mine = [p for p in slow if suspect in p and suspect_in(p, suspect, topology, behind)]
        leaf = _leaf(topology, suspect)
        if mine and all(pair_class(p, topology) == WITHIN for p in mine):
            return [g for g in good if _leaf(topology, g) == leaf]
        ends = {_leaf(topology, n) for p in mine for n in p}
        return [g for g in good if _leaf(topology, g) not in ends] or [g for g in good if _leaf(topology, g) != leaf]

    def prefer(suspect: str, good: list[str]) -> list[str]:
        return on_path(suspect, [g for g in good if g not in doubtful]) or on_path(suspect, good)

    return prefer


# The stages together, for the sweep (which runs the rounds in between) -------------------------


def first_stage(nodes: Sequence[str], topology: Topology) -> tuple[list[Pair], list[Pair]]:
    """The pairs within leaves, and across leaves (a second cross round where a leaf met fewer than
    two others, then the nodes left out)."""
    within = neighbour_pairs(nodes, topology)
    across = cross_pairs(nodes, topology)
    if needs_second_cross_round(nodes, topology, across):
        seen = {frozenset(p) for p in across}
        across += [p for p in cross_pairs(nodes, topology, shift=1) if frozenset(p) not in seen]
    return within, across + cover_leftovers(nodes, topology, across)


@dataclass(frozen=True, slots=True)
class FabricJudge:
    topology: Topology
    min_busbw_gbps: float
    max_below: float
    leaf_label: str
    spine_label: str


@dataclass(frozen=True, slots=True)
class Judged:
    """The first stage judged: what healthy pairs do, the slow pairs, the components they point to,
    and the re-tests for the slow pairs no component explains."""

    refs: tuple[References, bool]
    slow: dict[Pair, str]
    where: Localised
    rest: list[Pair]
    plan: IsolationPlan


def slow_in_first_stage(first: Mapping[Pair, PairRun], judge: FabricJudge) -> list[Pair]:
    """The first stage's slow pairs (and those that failed), to run once more before they count."""
    refs = references(first, judge.topology)
    return list(judge_pairs(first, refs, judge.topology, judge.min_busbw_gbps, judge.max_below))


def better_of(first: Mapping[Pair, PairRun], again: Mapping[Pair, PairRun]) -> dict[Pair, PairRun]:
    """The first stage with each pair run once more taken at its better run, size by size: a pair
    slow once by chance (a busy host) is fast the second time, while a fault slows both. A pair
    that failed and then ran is taken as it ran; one that failed again keeps its first answer."""
    out = dict(first)
    for pair, second in again.items():
        one = first.get(pair)
        if one is None or second.error:
            continue
        if one.error:
            out[pair] = second
            continue
        by_size = {
            s: max(v for v in (one.by_size.get(s), second.by_size.get(s)) if v is not None)
            for s in {*one.by_size, *second.by_size}
        }
        out[pair] = PairRun(max(one.busbw_gbps, second.busbw_gbps), by_size=by_size)
    return out


def judge_first_stage(nodes: Sequence[str], first: Mapping[Pair, PairRun], judge: FabricJudge) -> Judged:
    first = measured(first)  # a pair not run makes nobody a known-good partner, nor counts for a leaf
    refs = references(first, judge.topology)
    slow = judge_pairs(first, refs, judge.topology, judge.min_busbw_gbps, judge.max_below)
    where = localise(nodes, judge.topology, list(first), slow, judge.leaf_label, judge.spine_label)
    rest = [p for p in slow if p not in where.explained]
    behind = {n for component in where.components for n in component.nodes}
    doubtful = {n for pair in slow for n in pair}
    prefer = retest_partners(rest, judge.topology, doubtful, behind)
    # A node behind a blamed uplink, slow across with a node no component explains (one slow in
    # every pair it ran): the uplink explains the node's side; only the other member is re-tested
    # (re-testing the node across would cross the bad uplink again and blame the node for it).
    suspects = list(dict.fromkeys(n for p in rest for n in p if suspect_in(p, n, judge.topology, behind)))
    plan = plan_isolation(rest, list(first), prefer=prefer, exclude=behind, suspects=suspects)
    return Judged(refs, slow, where, rest, plan)


def findings(
    judged: Judged,
    first: Mapping[Pair, PairRun],
    retest: Mapping[Pair, PairRun],
    judge: FabricJudge,
    again: Mapping[Pair, PairRun] | None = None,
) -> list[Finding]:
    """The components, then the nodes, node uplinks and links the re-tests blame; ``again``: the
    pairs those blames rest on, run once more (``to_confirm``), each blame kept only if slow again.
    A pair not run (``PairRun.not_run``) is no evidence: a re-test not run blames and clears nobody."""
    first, retest = measured(first), measured(retest)
    retest_slow = judge_pairs(retest, judged.refs, judge.topology, judge.min_busbw_gbps, judge.max_below)
    errors = {p: run.error for p, run in retest.items() if run.error}
    busbw = {p: run.busbw_gbps for p, run in first.items()}
    rerun = {p: run.busbw_gbps for p, run in retest.items()}
    found = culprits(judged.rest, rerun, busbw, 0.0, judge.max_below, errors, retest_slow)
    if again is not None:
        again = measured(again)
        slow_again = judge_pairs(again, judged.refs, judge.topology, judge.min_busbw_gbps, judge.max_below)
        found = confirmed(found, again, slow_again)
    return judged.where.components + node_uplinks(found, judge.topology, list(first), judged.slow)
