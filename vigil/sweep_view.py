"""``vigil sweep``: follow a sweep on the controller with a progress bar, then print its table.

Exit code: 0 every node passed, 1 a node failed or a link is slow, 2 something could not be judged
(or the controller could not be reached) — the same contract as a single check's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from checks.result import Verdict
from protos.vigil.v1 import admin_pb2, common_pb2
from vigil.admin_client import AdminClient
from vigil.json_out import json_of
from vigil.operator_views import table_console
from vigil_core.rpc_errors import explain
from vigil_core.tls import TlsError

_console = table_console()
_errors = Console(stderr=True, soft_wrap=True)
_STYLE = {"OK": "green", "FAIL": "bold red", "UNKNOWN": "yellow"}
FULL_TABLE_NODES = 50  # above this many nodes the table lists only the rows that did not pass


def _verdict(value: int) -> str:
    return common_pb2.Verdict.Name(value)


def run_sweep(target: str, request: admin_pb2.SweepRequest, as_json: bool, show_all: bool) -> int:
    try:
        with AdminClient(target) as client:
            updates = client.sweep(request)
            summary = _collect(updates) if as_json else _follow(updates)
    except grpc.RpcError as exc:
        _errors.print(f"[red]error:[/] the sweep ended: {escape(explain(exc, target))}")
        return 2
    except TlsError as exc:
        _errors.print(f"[red]error:[/] VIGIL_TLS_DIR: {exc}")
        return 2
    if summary is None:
        _errors.print("[red]error:[/] the controller ended the sweep without a summary")
        return 2
    if as_json:
        print(json.dumps(json_of(summary), indent=2))
    else:
        print_summary(summary, show_all)
    return Verdict(_verdict(summary.verdict)).exit_code if summary.verdict else 2


def _collect(updates: Iterator[admin_pb2.SweepUpdate]) -> admin_pb2.SweepSummary | None:
    for update in updates:
        if update.HasField("summary"):
            return update.summary
    return None


def _follow(updates: Iterator[admin_pb2.SweepUpdate]) -> admin_pb2.SweepSummary | None:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[latest]}"),
    )
    with Progress(*columns, console=_console, transient=True) as progress:
        task = progress.add_task("sweep: checks", total=None, latest="")
        for update in updates:
            if update.HasField("summary"):
                return update.summary
            r = update.result
            verdict = _verdict(r.verdict)
            progress.update(
                task,
                description=f"sweep: {update.phase}",
                completed=update.done,
                total=update.total,
                latest=f"{r.node} {r.check} {verdict}",
            )
            if verdict != "OK":  # problems as they happen, above the bar
                progress.console.print(f"[{_STYLE.get(verdict, '')}]{verdict}[/] {r.node} {r.check}: {r.reason}")
    return None


_FINDING = {
    "node": "culprit",
    "node-uplink": "culprit (a node's uplink)",
    "link": "culprit (link)",
    "leaf": "culprit (leaf switch)",
    "leaf-uplink": "culprit (a leaf's uplink)",
    "spine": "culprit (spine)",
}


def _named(f: admin_pb2.SweepFinding) -> str:
    """What a finding blames, in words: the link's two ends, a component with how many nodes sit behind it."""
    if f.kind == "link" or (not f.kind and "|" in f.node):
        return f.node.replace("|", " <-> ")
    if f.kind in ("leaf", "leaf-uplink", "spine"):
        return f"{f.node} ({len(f.nodes)} node(s) behind it)"
    return f.node


def print_summary(summary: admin_pb2.SweepSummary, show_all: bool = False) -> None:
    every_row = show_all or summary.nodes <= FULL_TABLE_NODES
    rows = [r for r in summary.rows if every_row or r.verdict != common_pb2.OK]
    table = Table(title=f"Vigil sweep {summary.sweep_id}")
    for column in ("node", "check", "figure", "verdict", "reason"):
        table.add_column(column, overflow="fold")
    for r in rows:
        verdict = _verdict(r.verdict)
        table.add_row(r.node, r.check, r.figure or "-", f"[{_STYLE.get(verdict, '')}]{verdict}[/]", r.reason)
    if rows:
        _console.print(table)
    if not every_row:
        passed = summary.nodes - summary.failed_nodes - summary.unknown_nodes
        _console.print(f"{passed} node(s) passed every check (--all lists them)")
    for f in summary.findings:
        _console.print(f"[bold red]{_FINDING.get(f.kind, 'culprit')}:[/] {_named(f)}: {f.reason}")
    for node, what in sorted(summary.quarantine.items()):
        _console.print(f"[bold]quarantine:[/] {node}: {what}")
    verdict = _verdict(summary.verdict)
    pairs = f", {summary.pairs} pair(s) in {summary.rounds} round(s)" if summary.rounds else ""
    _console.print(
        f"[{_STYLE.get(verdict, '')}]{verdict}[/]: {summary.nodes} node(s), {summary.failed_nodes} failed, "
        f"{summary.unknown_nodes} could not be judged{pairs}, {summary.wall_s:.1f} s"
    )
