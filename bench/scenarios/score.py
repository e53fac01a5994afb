"""Judging a scenario's run against what it expects, and the scorecard over many (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.record import percentile
from bench.scenarios.spec import Scenario, Sweep


@dataclass(frozen=True)
class SweepSeen:
    """What one ``vigil sweep --json`` printed, and its exit status."""

    exit_code: int
    verdict: str = ""
    rows: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, check) -> verdict
    findings: tuple[str, ...] = ()  # culprit nodes, or "a|b" for a link
    error: str = ""
    # The evidence, to show when the verdicts are not the expected ones: (node, check) -> the row's
    # figure and reason; finding -> its reason.
    why: dict[tuple[str, str], str] = field(default_factory=dict)
    why_found: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Observed:
    """What Vigil did during a run, as its admin API tells it."""

    quarantined: frozenset[str]  # nodes taken out of service at any time (a dry run's "would" is not)
    paged: frozenset[str]  # nodes a page was sent for
    health: dict[str, str]  # each node's health at the end
    fault_to_action_s: tuple[float, ...] = ()  # first injected fault on a node -> its first quarantine or page
    pages: dict[str, int] = field(default_factory=dict)  # node -> pages sent for it
    fleet_pages: int = 0  # pages about a job or a domain, not one node (an MFU drop, a job's crash, a rack)
    page_texts: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node (or "fleet") -> what its pages said
    cordoned: frozenset[str] = frozenset()  # Nodes cordoned at the end (a Kubernetes fleet)
    drained: dict[str, str] = field(default_factory=dict)  # node -> its drain reason at the end (a Slurm fleet)
    incident_texts: dict[str, tuple[str, ...]] = field(
        default_factory=dict
    )  # node -> its incidents' reason and message
    went_unknown: frozenset[str] = frozenset()  # nodes found silent at any time (the controller's log)
    undone: dict[str, int] = field(default_factory=dict)  # rule -> quarantines a person undid (vigil rules)
    job_restarted_without: frozenset[str] | None = None  # the nodes a CheckpointAndRestart told the job to leave
    paged_incidents: frozenset[str] = frozenset()  # incidents the controller recorded a sent page for
    slack_posts: tuple[str, ...] = ()  # the incident of each top-level message in the Slack channel
    sweeps: tuple[SweepSeen, ...] = ()  # in the order of the scenario's sweep events
    remedied: frozenset[str] = frozenset()  # nodes that had a reset or a reboot carried out on them
    back_in_service_s: dict[str, float] = field(default_factory=dict)  # node -> first fault -> released by a repair
    error: str = ""  # the run itself broke (a process died, the fleet never came up)


@dataclass(frozen=True)
class Outcome:
    name: str
    family: str
    passed: bool
    problems: tuple[str, ...]
    known_defect: str
    true_quarantines: int
    false_quarantines: int
    missed_quarantines: int
    false_pages: int
    missed_pages: int
    fault_to_action_s: tuple[float, ...] = field(default=())
    # Remediation (controller remediation on): faults (nodes quarantined), those repaired and back in
    # service without a page, the pages sent for nodes, and fault -> back in service.
    remediation: bool = False
    faults: int = 0
    recoverable: int = 0  # faults the scenario expects back in service (a machine can repair them)
    self_healed: int = 0
    node_pages: int = 0
    back_in_service_s: tuple[float, ...] = field(default=())


def judge(name: str, scenario: Scenario, seen: Observed) -> Outcome:
    want = scenario.expect
    problems = [f"the run broke: {seen.error}"] if seen.error else []
    loose = frozenset(n for a in want.among for n in a.of)  # judged by their bounds, not one by one
    false_q, missed_q = seen.quarantined - want.quarantined - loose, want.quarantined - seen.quarantined
    false_p, missed_p = seen.paged - want.paged - loose, want.paged - seen.paged
    true_q, extra_q, short_q = len(seen.quarantined & want.quarantined), 0, 0
    for among in want.among:
        taken = sorted(seen.quarantined & among.of)
        true_q += min(len(taken), among.most)
        if len(taken) > among.most:
            extra_q += len(taken) - among.most
            problems.append(
                f"{len(taken)} of {sorted(among.of)} quarantined ({', '.join(taken)}), at most {among.most}"
            )
        if len(taken) < among.at_least:
            short_q += among.at_least - len(taken)
            problems.append(f"{len(taken)} of {sorted(among.of)} quarantined, at least {among.at_least}")
    for node, words in sorted(want.page_says.items()):
        texts = [t.lower() for t in seen.page_texts.get(node, ())]
        for word in words:
            if not any(word.lower() in t for t in texts):
                problems.append(
                    f"no page for {node} says {word!r}" + (f" (it said: {texts[0][:300]})" if texts else "")
                )
    for what, nodes in (
        ("quarantined, not expected", false_q),
        ("not quarantined, expected", missed_q),
        ("paged, not expected", false_p),
        ("not paged, expected", missed_p),
    ):
        if nodes:
            problems.append(f"{what}: {', '.join(sorted(nodes))}")
    for node, count in sorted(want.pages.items()):
        if seen.pages.get(node, 0) != count:
            problems.append(f"{node} was paged {seen.pages.get(node, 0)} time(s), expected {count}")
    if want.fleet_pages is not None and seen.fleet_pages != want.fleet_pages:
        problems.append(f"{seen.fleet_pages} page(s) about a job or a domain, expected {want.fleet_pages}")
    if want.cordoned is not None and seen.cordoned != want.cordoned:
        problems.append(f"cordoned at the end: {sorted(seen.cordoned)}, expected {sorted(want.cordoned)}")
    for node, words in sorted(want.incident_says.items()):
        texts = [t.lower() for t in seen.incident_texts.get(node, ())]
        if not any(all(w.lower() in t for w in words) for t in texts):
            problems.append(f"no incident of {node} says {list(words)}: {list(seen.incident_texts.get(node, ()))}")
    if want.drained is not None:
        wrong = sorted(set(want.drained) ^ set(seen.drained)) or [
            n for n, start in sorted(want.drained.items()) if not seen.drained[n].startswith(start)
        ]
        if wrong:
            problems.append(f"drained at the end: {seen.drained}, expected reasons starting {want.drained}")
    if want.job_restarted_without is not None and seen.job_restarted_without != want.job_restarted_without:
        told = "never told to restart" if seen.job_restarted_without is None else sorted(seen.job_restarted_without)
        problems.append(f"the job: {told}, expected a restart without {sorted(want.job_restarted_without)}")
    for rule, count in sorted(want.undone.items()):
        if seen.undone.get(rule, 0) != count:
            problems.append(f"vigil rules: {rule} undone {seen.undone.get(rule, 0)} time(s), expected {count}")
    if want.went_unknown is not None and seen.went_unknown != want.went_unknown:
        found, expected = sorted(seen.went_unknown), sorted(want.went_unknown)
        problems.append(f"found silent (UNKNOWN) at some time: {found}, expected {expected}")
    if want.remedied is not None and seen.remedied != want.remedied:
        problems.append(f"repairs carried out on {sorted(seen.remedied)}, expected {sorted(want.remedied)}")
    for node, health in sorted(want.health.items()):
        if seen.health.get(node) != health:
            problems.append(f"{node} is {seen.health.get(node, 'unknown to the controller')}, expected {health}")
    if not seen.error:
        problems += _slack_problems(seen)
        wanted = [e.sweep for e in sorted(scenario.events, key=lambda e: e.at) if e.sweep is not None]
        for i, (sweep, got) in enumerate(zip(wanted, seen.sweeps, strict=False)):
            problems += [f"sweep {i + 1}: {p}" for p in _sweep_problems(sweep, got)]
        if len(seen.sweeps) != len(wanted):
            problems.append(f"{len(seen.sweeps)} sweep(s) ran, expected {len(wanted)}")
    return Outcome(
        name=name,
        family=scenario.family,
        passed=not problems,
        problems=tuple(problems),
        known_defect=scenario.known_defect,
        true_quarantines=true_q,
        false_quarantines=len(false_q) + extra_q,
        missed_quarantines=len(missed_q) + short_q,
        false_pages=len(false_p),
        missed_pages=len(missed_p),
        fault_to_action_s=seen.fault_to_action_s,
        remediation=bool((scenario.controller.get("remediation") or {}).get("enabled")),
        faults=len(seen.quarantined),
        recoverable=sum(1 for n in want.quarantined if want.health.get(n) == "HEALTHY"),
        self_healed=sum(1 for n in seen.back_in_service_s if n not in seen.paged),
        node_pages=sum(seen.pages.values()),
        back_in_service_s=tuple(sorted(seen.back_in_service_s.values())),
    )


def _slack_problems(seen: Observed) -> list[str]:
    """Each incident the controller recorded as paged is exactly one top-level Slack message (an
    escalation updates it), and the channel holds nothing else."""
    posts = Counter(seen.slack_posts)
    problems = [f"incident {i} posted {n} times to Slack" for i, n in sorted(posts.items()) if n > 1]
    if missing := seen.paged_incidents - set(posts):
        problems.append(f"recorded as paged but not in Slack: {', '.join(sorted(missing))}")
    if extra := set(posts) - seen.paged_incidents:
        problems.append(f"in Slack but not recorded as paged: {', '.join(sorted(extra))}")
    return problems


def _sweep_problems(want: Sweep, got: SweepSeen) -> list[str]:
    if got.error:
        return [got.error]
    problems = []
    if want.verdict is not None and got.verdict != want.verdict:
        problems.append(f"verdict {got.verdict or 'none'}, expected {want.verdict}")
    for node, checks in sorted(want.rows.items()):
        for check, verdict in sorted(checks.items()):
            if got.rows.get((node, check)) != verdict:
                because = f" ({why})" if (why := got.why.get((node, check))) else ""
                problems.append(f"{node} {check}: {got.rows.get((node, check), 'no row')}, expected {verdict}{because}")
    if want.findings is not None and got.findings != tuple(sorted(want.findings)):
        evidence = "; ".join(f"{f}: {got.why_found[f]}" for f in got.findings if f in got.why_found)
        because = f" ({evidence})" if evidence else ""
        problems.append(f"findings {list(got.findings)}, expected {sorted(want.findings)}{because}")
    return problems


def scorecard(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Over every scenario: how many passed, quarantine precision and recall, false pages, missed
    faults, and fault -> action times; and the same per family of mistakes."""
    families = sorted({o.family for o in outcomes})
    return {
        **_card(outcomes),
        "families": {f: _card([o for o in outcomes if o.family == f], timed=False) for f in families},
    }


def _card(outcomes: Sequence[Outcome], timed: bool = True) -> dict[str, Any]:
    tp = sum(o.true_quarantines for o in outcomes)
    fp = sum(o.false_quarantines for o in outcomes)
    fn = sum(o.missed_quarantines for o in outcomes)
    return {
        "scenarios": len(outcomes),
        "passed": sum(o.passed for o in outcomes),
        "failed": sorted(o.name for o in outcomes if not o.passed),
        "known_defects_failing": sorted(o.name for o in outcomes if not o.passed and o.known_defect),
        "quarantine_precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "quarantine_recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
        "false_quarantines": fp,
        "false_pages": sum(o.false_pages for o in outcomes),
        "missed_faults": fn + sum(o.missed_pages for o in outcomes),
        **({} if not timed else {"fault_to_action_s": _times(outcomes)}),
        **({"remediation": card} if (card := _remediation(outcomes)) else {}),
    }


def _remediation(outcomes: Sequence[Outcome]) -> dict[str, Any] | None:
    """Over the scenarios run with remediation on: self-healed / total, pages per 100 faults, and
    fault -> back in service (the scenarios' own short timeouts and waits: simulated time)."""
    runs = [o for o in outcomes if o.remediation]
    faults = sum(o.faults for o in runs)
    if not runs or not faults:
        return None
    healed, pages = sum(o.self_healed for o in runs), sum(o.node_pages for o in runs)
    recoverable = sum(o.recoverable for o in runs)
    back = [t for o in runs for t in o.back_in_service_s]
    return {
        "scenarios": len(runs),
        "faults": faults,
        "self_healed": healed,
        "self_healed_share": round(healed / faults, 4),
        "recoverable": recoverable,
        "recoverable_self_healed_share": round(healed / recoverable, 4) if recoverable else None,
        "pages_per_100_faults": round(100 * pages / faults, 1),
        "back_in_service_s": {"n": len(back), "p50": round(percentile(back, 0.5), 2), "max": round(max(back), 2)}
        if back
        else None,
    }


def _times(outcomes: Sequence[Outcome]) -> dict[str, Any] | None:
    times = [t for o in outcomes for t in o.fault_to_action_s]
    if not times:
        return None
    return {
        "n": len(times),
        "p50": round(percentile(times, 0.5), 4),
        "p99": round(percentile(times, 0.99), 4),
        "max": round(max(times), 4),
    }
