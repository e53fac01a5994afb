"""``python -m bench.scenarios [NAME ...] [--jobs N] [--json] [--keep] [--no-record]``: run the
labelled fault scenarios (all of them, or those named) through real processes and print the
scorecard; the figures are appended to ``bench/results/scenarios.jsonl``. Exits 1 when a scenario
fails that is not marked as a known defect. A scenario this machine cannot run (network namespaces
need root) is skipped, named, and left out of the figures.

Scenarios run ``--jobs`` at a time (each has its own ports, folder and processes; they mostly wait
on them); those on network namespaces share one subnet and run one at a time after the others, and
those on the Kubernetes API double one at a time among themselves (it patches its process's resolver)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict

from bench.record import append_result, header
from bench.scenarios.runner import run_scenario, unavailable
from bench.scenarios.score import Outcome, judge, scorecard
from bench.scenarios.spec import Scenario, load_scenario, scenario_paths
from vigil_core.config_file import ConfigError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="scenario names (file stems in bench/scenarios/cases); default all")
    parser.add_argument("--json", action="store_true", help="print the outcomes and the scorecard as JSON")
    parser.add_argument("--keep", action="store_true", help="keep each run's working directory (logs)")
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/results/scenarios.jsonl")
    parser.add_argument("--jobs", type=_jobs, default=4, help="scenarios run at once (default 4)")
    args = parser.parse_args()
    try:
        paths = scenario_paths(args.names)
        scenarios = [(p.stem, load_scenario(p)) for p in paths]
    except (ValueError, ConfigError) as exc:
        print(f"scenarios: {exc}", file=sys.stderr)
        return 2
    outcomes: list[Outcome] = []
    skipped: list[str] = []
    started = time.monotonic()
    runnable: list[tuple[str, Scenario]] = []
    for name, scenario in scenarios:
        if why := unavailable(scenario):
            skipped.append(name)
            print(f"SKIP   {name:44} {why}", file=sys.stderr)
        else:
            runnable.append((name, scenario))

    kube = threading.Lock()  # the Kubernetes API double patches aiohttp's resolver for its process: one at a time

    def one(name: str, scenario: Scenario) -> tuple[Outcome, float]:
        with kube if scenario.fleet.kubernetes else contextlib.nullcontext():
            t = time.monotonic()
            return judge(name, scenario, run_scenario(name, scenario, keep=args.keep)), time.monotonic() - t

    alone = [(n, s) for n, s in runnable if s.fleet.fabric is not None]  # one subnet: one at a time
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one, n, s) for n, s in runnable if s.fleet.fabric is None]
        for future in as_completed(futures):
            outcome, wall_s = future.result()
            outcomes.append(outcome)
            if not args.json:
                _print_outcome(outcome, wall_s)
    for name, scenario in alone:
        outcome, wall_s = one(name, scenario)
        outcomes.append(outcome)
        if not args.json:
            _print_outcome(outcome, wall_s)
    outcomes.sort(key=lambda o: o.name)
    card = {**scorecard(outcomes), "skipped": skipped, "wall_s": round(time.monotonic() - started, 1)}
    if args.json:
        print(json.dumps({"outcomes": [asdict(o) for o in outcomes], "scorecard": card}, indent=2))
    else:
        _print_card(card)
    if not args.no_record:
        append_result("scenarios", {**header("scenarios"), **card})
    unexpected = [o for o in outcomes if not o.passed and not o.known_defect]
    return 1 if unexpected else 0


def _jobs(text: str) -> int:
    jobs = int(text) if text.isdigit() else 0
    if not 1 <= jobs <= 16:
        raise argparse.ArgumentTypeError(f"--jobs must be a whole number from 1 to 16, not {text!r}")
    return jobs


def _print_outcome(o: Outcome, wall_s: float) -> None:
    mark = "PASS" if o.passed else ("KNOWN" if o.known_defect else "FAIL")
    print(f"{mark:5}  {o.name:44} {wall_s:5.1f} s")
    for problem in o.problems:
        print(f"         {problem}")
    if o.known_defect and not o.passed:
        print(f"         known defect: {o.known_defect}")


def _print_card(card: dict[str, object]) -> None:
    print()
    print(f"scenarios: {card['passed']}/{card['scenarios']} passed in {card['wall_s']} s")
    if card["skipped"]:
        print(f"skipped here (see SKIP above): {', '.join(card['skipped'])}")  # type: ignore[arg-type]
    print(f"quarantine precision {card['quarantine_precision']}, recall {card['quarantine_recall']}")
    print(f"false quarantines {card['false_quarantines']}, false pages {card['false_pages']}, "
          f"missed faults {card['missed_faults']}")  # fmt: skip
    print(f"fault -> first action (s): {card['fault_to_action_s']}")
    if r := card.get("remediation"):
        print(f"remediation: {r['self_healed']}/{r['faults']} faults self-healed (no page; "  # type: ignore[index]
              f"{r['recoverable']} a machine can repair), "  # type: ignore[index]
              f"{r['pages_per_100_faults']} pages per 100 faults, fault -> back in service (s): "  # type: ignore[index]
              f"{r['back_in_service_s']}")  # type: ignore[index]  # fmt: skip
    print()
    print(f"{'family':24} {'passed':>8} {'precision':>9} {'recall':>7} {'false q':>7} {'false p':>7} {'missed':>6}")
    for family, f in card["families"].items():  # type: ignore[attr-defined]
        passed = f"{f['passed']}/{f['scenarios']}"
        print(f"{family:24} {passed:>8} {f['quarantine_precision']:>9} {f['quarantine_recall']:>7} "
              f"{f['false_quarantines']:>7} {f['false_pages']:>7} {f['missed_faults']:>6}")  # fmt: skip
    if card["known_defects_failing"]:
        print(f"known defects still failing: {', '.join(card['known_defects_failing'])}")  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
