"""How a sweep's results are judged. Pure.

The figures of the per-device checks are judged once more, against every device of the same model
in the sweep: a GPU that passed its own node's comparison can still be far below the fleet. Pairs
are turned into rows and findings (``controller.sweeps.pairing`` finds the culprits), and the rows into
the sweep's outcome.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from checks.judge import fleet_outliers
from checks.result import CheckResult, NotRun, Verdict
from controller.sweeps.pairing import Finding, Pair
from controller.sweeps.spec import PAIRS

# Per-device figures: the check, the figure's key prefix, its unit.
FLEET_JUDGED = (("matmul", "tflops", "TFLOP/s"), ("membw", "gbps", "GB/s"))


@dataclass(frozen=True, slots=True)
class NodeCheck:
    node: str
    result: CheckResult


def device_figures(result: CheckResult, key: str) -> dict[str, float]:
    """A per-device check's figures by device label: {"GPU0": 612.0, ...}."""
    prefix = f"{key}_"
    return {k[len(prefix) :]: v for k, v in result.figures.items() if k.startswith(prefix)}


def _judged_figures(result: CheckResult) -> tuple[float, dict[str, float], str] | None:
    """What the fleet compares of a passing result: (the group it is compared within, its values by
    label, the unit). Devices by GPU model; an intra-node all-reduce by its number of ranks."""
    for check, key, unit in FLEET_JUDGED:
        if result.check == check:
            return result.figures.get(f"expected_peak_{key}", 0.0), device_figures(result, key), unit
    if result.check == "allreduce" and (busbw := largest_busbw(result.figures)) is not None:
        return result.figures.get("world_size", 0.0), {"all-reduce": busbw}, "GB/s busbw"
    return None


def judge_fleet(results: Sequence[NodeCheck], max_below_median: float) -> list[NodeCheck]:
    """Mark FAIL each passing result far below its kind across the sweep (``checks.judge.fleet_outliers``:
    the median and the spread): a GPU against every GPU of its model, a node's all-reduce (its NVLink)
    against every node's with as many ranks."""
    out = list(results)
    groups: dict[tuple[str, float], dict[str, float]] = {}  # (check, group) -> {"node/GPU0": value}
    where: dict[str, int] = {}  # "node/GPU0" + check -> its result's position in out
    units: dict[str, str] = {}
    for i, nc in enumerate(out):
        judged = _judged_figures(nc.result) if nc.result.verdict is Verdict.OK else None
        if judged is None:
            continue
        group, values, units[nc.result.check] = judged
        for label, value in values.items():
            groups.setdefault((nc.result.check, group), {})[f"{nc.node}/{label}"] = value
            where[f"{nc.result.check}:{nc.node}/{label}"] = i
    problems: dict[int, list[str]] = {}
    for (check, _), values in groups.items():
        median = statistics.median(values.values())
        for name in fleet_outliers(values, max_below_median):
            label, value, unit = name.split("/", 1)[1], values[name], units[check]
            problems.setdefault(where[f"{check}:{name}"], []).append(
                f"{label} at {value:.4g} {unit}, {1 - value / median:.0%} below the fleet median {median:.4g}"
            )
    for i, found in problems.items():
        out[i] = NodeCheck(out[i].node, replace(out[i].result, verdict=Verdict.FAIL, reason="; ".join(found)))
    return out


def headline(result: CheckResult) -> str:
    """The one figure the sweep's table shows for a check's result."""
    f = result.figures
    if result.check == "gpu_health" and "gpus" in f:
        return f"{f['gpus']:g} GPUs"
    for check, key, unit in FLEET_JUDGED:
        if result.check == check and (values := device_figures(result, key)):
            label, value = min(values.items(), key=lambda kv: kv[1])
            return f"{value:.4g} {unit} (slowest: {label})" if len(values) > 1 else f"{value:.4g} {unit}"
    if result.check == "allreduce" and (busbw := largest_busbw(f)) is not None:
        return f"{busbw:.3g} GB/s busbw"
    return ""


def largest_busbw(figures: Mapping[str, float]) -> float | None:
    """Bus bandwidth at the largest message size an all-reduce measured."""
    by_size = busbw_by_size(figures)
    return by_size[max(by_size)] if by_size else None


def busbw_by_size(figures: Mapping[str, float]) -> dict[int, float]:
    """An all-reduce's bus bandwidth at each message size it measured (bytes -> GB/s)."""
    prefix = "busbw_gbps_"
    return {int(k[len(prefix) :]): v for k, v in figures.items() if k.startswith(prefix) and k[len(prefix) :].isdigit()}


@dataclass(frozen=True, slots=True)
class PairRun:
    """One pair's all-reduce: its bus bandwidth at the largest size and at each size (GB/s), or 0
    with the reason it failed. ``not_run``: it measured nothing, for a reason that says nothing of
    either node or the link between them (``checks.result.NotRun``: a GPU busy with a workload,
    rank 0's port taken, an agent away): such a pair is neither slow nor fast (``measured``)."""

    busbw_gbps: float
    error: str = ""
    by_size: Mapping[int, float] = field(default_factory=dict)
    not_run: str = ""
    by: str = ""  # the member the error is about


def pair_run(pair: Pair, first: CheckResult, second: CheckResult) -> PairRun:
    """One pair's measurement from its two members' answers; 0 GB/s with the reason when it failed.
    A member that could not run explains its partner's failure (stopped for it, or timed out
    waiting for it); a member that failed running explains a partner stopped for it."""
    failed = [(node, r) for node, r in zip(pair, (first, second), strict=True) if r.verdict is Verdict.UNKNOWN]
    could_not = [(n, r) for n, r in failed if r.not_run and r.not_run != NotRun.STOPPED]
    for node, r in could_not or [(n, r) for n, r in failed if not r.not_run] or failed:
        return PairRun(0.0, f"{node}: {r.reason}", not_run=r.not_run, by=node)
    values = [v for r in (first, second) if (v := largest_busbw(r.figures)) is not None]
    if not values:
        return PairRun(0.0, "the all-reduce reported no bus bandwidth")
    sized = [busbw_by_size(r.figures) for r in (first, second)]
    by_size = {s: min(m[s] for m in sized if s in m) for s in set().union(*sized)}
    return PairRun(min(values), by_size=by_size)


def make_up_pairs(runs: Mapping[Pair, PairRun]) -> list[Pair]:
    """For each node left with no pair measured through no fault of its own (its partner's GPU busy,
    its partner's agent away), a node that was measured to pair with, spread over them. A node whose
    own port was taken can still be measured where it does not listen: its make-up pair makes it
    rank 1 (the second). Nodes left over with nobody measured pair up among themselves. Pure."""
    ran = list(dict.fromkeys(n for pair, run in runs.items() if not run.not_run for n in pair))
    left = [
        n
        for pair, run in runs.items()
        if run.not_run
        for n in pair
        if n not in ran and (n != run.by or run.not_run == NotRun.PORT_TAKEN)
    ]
    left = list(dict.fromkeys(left))
    if ran:
        return [(ran[i % len(ran)], node) for i, node in enumerate(left)]
    return [(left[i], left[i + 1]) for i in range(0, len(left) - 1, 2)]


def measured(runs: Mapping[Pair, PairRun]) -> dict[Pair, PairRun]:
    """The pairs that ran (fast, slow, or failing as they ran): those not run say nothing to judge."""
    return {p: r for p, r in runs.items() if not r.not_run}


def pair_result(run: PairRun, rank0: CheckResult) -> CheckResult:
    """What the progress stream shows for a pair, before the fleet judges it."""
    if run.error:
        return CheckResult(PAIRS, Verdict.UNKNOWN, run.error, {}, rank0.started_at, rank0.finished_at, run.not_run)
    figures = {"busbw_gbps": run.busbw_gbps}
    reason = f"{run.busbw_gbps:.3g} GB/s bus bandwidth"
    return CheckResult(PAIRS, Verdict.OK, reason, figures, rank0.started_at, rank0.finished_at)


@dataclass(frozen=True, slots=True)
class Row:
    node: str
    check: str
    verdict: Verdict
    figure: str
    reason: str
    not_run: str = ""  # UNKNOWN for a reason that is not the node's (checks.result.NotRun): nothing judged it


def pair_rows(
    nodes: Sequence[str],
    first: Mapping[Pair, PairRun],
    retest: Mapping[Pair, PairRun],
    slow: Collection[Pair],
    untestable: Sequence[str],
    findings: Sequence[Finding],
    basis: str,
    explained: Collection[Pair] = (),
    again: Mapping[Pair, PairRun] | None = None,
) -> list[Row]:
    """Each paired node's verdict for the pairwise stage, from both rounds and the findings.
    ``basis``: what a pair that is not slow was judged against (``pair_basis``). A node behind a
    blamed component (a leaf switch, an uplink, a spine) is not blamed itself, nor one slow only
    with such nodes (``explained``: the slow pairs the components account for). ``again``: the
    pairs run once more (a node's re-test, a link's pair: ``pairing.to_confirm``); one no longer
    slow was not reproduced."""
    again = measured(again or {})  # a pair not run once more confirms and clears nothing
    blamed = {f.node: f.reason for f in findings if not f.is_component}
    behind = {n: f for f in findings if f.is_component for n in f.nodes}
    links = {n for f in findings if f.kind == "link" for n in f.node.split("|")}
    rows = []
    for node in nodes:
        everything = [(p, run) for p, run in first.items() if node in p]
        if not everything:
            continue
        figure = "; ".join(_pair_figure(node, p, r) for p, r in everything)
        mine = [(p, run) for p, run in everything if not run.not_run]
        if not mine:
            first_unrun = everything[0][1]
            why = f"not measured: {first_unrun.error}"
            rows.append(Row(node, PAIRS, Verdict.UNKNOWN, figure, why, first_unrun.not_run))
            continue
        slow_mine = [(p, run) for p, run in mine if p in slow and p not in explained]
        through = [p[1] if p[0] == node else p[0] for p, _ in mine if p in explained]
        pair, run = (slow_mine or mine)[0]
        partner = pair[1] if pair[0] == node else pair[0]
        if node in blamed:
            rows.append(Row(node, PAIRS, Verdict.FAIL, figure, blamed[node]))
        elif node in behind and behind[node].kind == "leaf":
            why = f"behind {behind[node].node}, which is slow: the node itself cannot be judged"
            rows.append(Row(node, PAIRS, Verdict.UNKNOWN, figure, why))
        elif node in behind:
            rows.append(Row(node, PAIRS, Verdict.OK, figure, f"fine within its leaf; {behind[node].node} is slow"))
        elif not slow_mine and through:
            why = f"slow only with nodes behind a blamed component ({', '.join(through)}); {basis} otherwise"
            rows.append(Row(node, PAIRS, Verdict.OK, figure, why))
        elif not slow_mine:
            rows.append(Row(node, PAIRS, Verdict.OK, figure, basis))
        elif node in untestable:
            why = run.error or "slow"
            rows.append(Row(node, PAIRS, Verdict.UNKNOWN, figure, f"{why}; no known-good node to re-pair with"))
        elif rerun_of := [(p, r) for p, r in measured(retest).items() if p[0] == node]:
            (_suspect, good), rerun = rerun_of[0]
            if (node, good) in again:  # slow with the known-good node once, not when run once more
                once_more = again[(node, good)].busbw_gbps
                cleared = f"slow with {partner}; with {good} slow once ({rerun.busbw_gbps:.3g} GB/s), "
                cleared += f"{once_more:.3g} GB/s once more: not reproduced"
            else:
                cleared = f"slow with {partner}, fast with {good} ({rerun.busbw_gbps:.3g} GB/s)"
            if node in links:
                cleared += f"; the link to {partner} is slow"
            elif pair in again:
                cleared += f"; {again[pair].busbw_gbps:.3g} GB/s with {partner} once more: not reproduced"
            elif partner in blamed:
                cleared += f": {partner} is to blame"
            elif partner in behind:
                cleared += f": {partner} is behind {behind[partner].node}"
            else:
                cleared += f"; {partner} is not blamed either"
            rows.append(Row(node, PAIRS, Verdict.OK, figure, cleared))
        elif unrun := [(p, r) for p, r in retest.items() if p[0] == node]:
            (_suspect, good), rerun = unrun[0]
            why = f"slow with {partner}; the re-test with {good} could not run: {rerun.error}"
            rows.append(Row(node, PAIRS, Verdict.UNKNOWN, figure, why, rerun.not_run))
        else:
            rows.append(Row(node, PAIRS, Verdict.UNKNOWN, figure, "slow pair, not re-tested"))
    return rows


def _pair_figure(node: str, pair: Pair, run: PairRun) -> str:
    partner = pair[1] if pair[0] == node else pair[0]
    return f"not run with {partner}" if run.not_run else f"{run.busbw_gbps:.3g} GB/s with {partner}"


def pair_basis(first: Mapping[Pair, PairRun], min_busbw_gbps: float, max_below_median: float) -> str:
    """What the first round's pairs were judged against, in words."""
    values = [r.busbw_gbps for r in measured(first).values()]
    against = []
    if min_busbw_gbps:
        against.append(f"above the {min_busbw_gbps:g} GB/s threshold")
    if len(values) >= 3:
        against.append(f"within {max_below_median:.0%} of the median pair ({statistics.median(values):.3g} GB/s)")
    if not against:
        return "measured, not judged: too few pairs to compare (3+) and no min_busbw_gbps threshold"
    return " and ".join(against)


def row_for(node: str, result: CheckResult) -> Row:
    return Row(node, result.check, result.verdict, headline(result), result.reason, result.not_run)


@dataclass(frozen=True, slots=True)
class Outcome:
    failed: list[str]  # nodes with a FAIL, in order
    unknown: list[str]  # nodes with an UNKNOWN and no FAIL
    # FAIL: a node failed, or a link or a fabric component is slow; UNKNOWN: something could not be judged
    verdict: Verdict


def outcome(rows: Sequence[Row], findings: Sequence[Finding]) -> Outcome:
    failed = list(dict.fromkeys(r.node for r in rows if r.verdict is Verdict.FAIL))
    unknown = list(dict.fromkeys(r.node for r in rows if r.verdict is Verdict.UNKNOWN and r.node not in failed))
    bad_fabric = any(f.kind == "link" or f.is_component for f in findings)
    verdict = Verdict.FAIL if failed or bad_fabric else Verdict.UNKNOWN if unknown else Verdict.OK
    return Outcome(failed, unknown, verdict)


def failure_reasons(rows: Sequence[Row], node: str) -> str:
    """What a failing node's quarantine says: every check it failed, with the reason."""
    return "; ".join(f"{r.check}: {r.reason}" for r in rows if r.node == node and r.verdict is Verdict.FAIL)
