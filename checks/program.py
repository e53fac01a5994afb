"""What every check program shares: its command line, and the rule that whatever goes wrong ends
as UNKNOWN with the reason, printed (``--json``: one JSON line) with the matching exit code."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from checks.result import CheckResult, Verdict, unknown

Run = Callable[[argparse.Namespace], CheckResult]


def check_main(name: str, describe: str, add_arguments: Callable[[argparse.ArgumentParser], None], run: Run) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m checks.{name}", description=describe)
    parser.add_argument("--json", action="store_true", help="print one JSON line (for the agent and the sweep)")
    add_arguments(parser)
    args = parser.parse_args()  # bad arguments: argparse names them and exits 2, which reads as UNKNOWN
    started = time.time()
    try:
        result = run(args)
    except Exception as exc:  # a crashed check is UNKNOWN, never healthy
        result = unknown(name, f"the check crashed: {exc!r}", started)
    print(result.to_json() if args.json else describe_result(result), flush=True)
    sys.exit(result.verdict.exit_code)


def describe_result(result: CheckResult) -> str:
    lines = [f"{result.check}: {result.verdict.value} - {result.reason}"]
    lines += [f"  {key} = {value:.4g}" for key, value in sorted(result.figures.items())]
    return "\n".join(lines)


def verdict_for(problems: list[str], ok_reason: str) -> tuple[Verdict, str]:
    return (Verdict.FAIL, "; ".join(problems)) if problems else (Verdict.OK, ok_reason)
