"""What every check program shares: its command line, and the rule that whatever goes wrong ends
as UNKNOWN with the reason, printed (``--json``: one JSON line) with the matching exit code."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from checks.result import CheckResult, Verdict, unknown

Run = Callable[[argparse.Namespace], CheckResult]


class BadArguments(ValueError):
    """A check's arguments it would refuse, named as argparse names them."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadArguments(message)


def make_parser(
    name: str, describe: str, add_arguments: Callable[[argparse.ArgumentParser], None], prog: str = ""
) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog or f"python -m checks.{name}", description=describe)
    parser.add_argument("--json", action="store_true", help="print one JSON line (for the agent and the sweep)")
    add_arguments(parser)
    return parser


def parser_of(name: str, prog: str = "") -> argparse.ArgumentParser:
    """The command line of the check ``name`` (``checks.<name>``; importing one loads no torch)."""
    module = importlib.import_module(f"checks.{name}")
    return make_parser(name, module.__doc__ or "", module.add_arguments, prog)


def argument_problem(name: str, args: Sequence[str]) -> str | None:
    """What the check would refuse in ``args`` (before anything runs: vigil check, a sweep's
    -p CHECK.ARG=VALUE), or None."""
    try:
        parser_of(name).parse_args(list(args))
    except BadArguments as exc:
        return f"{name}: {exc}"
    return None


def check_main(name: str, describe: str, add_arguments: Callable[[argparse.ArgumentParser], None], run: Run) -> None:
    parser = make_parser(name, describe, add_arguments)
    try:
        args = parser.parse_args()
    except BadArguments as exc:  # exit 2 reads as UNKNOWN, with the reason on the last line
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        sys.exit(2)
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
