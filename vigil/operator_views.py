"""What the operator commands print: tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from google.protobuf.message import Message
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controller.jobs.goodput import KINDS
from protos.vigil.v1 import admin_pb2, common_pb2
from vigil.admin_client import AdminClient
from vigil.json_out import json_of
from vigil_core.rpc_errors import explain
from vigil_core.tls import TlsError

PIPED_WIDTH = 1000  # columns when stdout is not a terminal: whole rows for grep, files and pagers


def table_console() -> Console:
    """A terminal's own width; piped or redirected, wide enough that no table row wraps."""
    return Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)


_console = table_console()
T = TypeVar("T")


def _ask(target: str, call: Callable[[AdminClient], T]) -> T | None:
    """One admin call; None (said on the console) when the controller does not answer it."""
    try:
        with AdminClient(target) as client:
            return call(client)
    except grpc.RpcError as exc:
        _console.print(f"[red]error:[/] {escape(explain(exc, target))}")
        return None
    except TlsError as exc:
        _console.print(f"[red]error:[/] VIGIL_TLS_DIR: {exc}")
        return None


def _print_json(found: Message | Sequence[Message]) -> None:
    print(json.dumps([json_of(m) for m in found] if isinstance(found, Sequence) else json_of(found), indent=2))


def print_status(target: str, as_json: bool) -> int:
    reply = _ask(target, AdminClient.status)
    if reply is None:
        return 2
    if as_json:
        _print_json(reply)
        return 0
    counts = Counter(n.health for n in reply.nodes)
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no nodes"
    style = "red" if reply.automation.startswith("paused") else "yellow" if reply.automation == "dry-run" else "green"
    _console.print(f"automation: [{style}]{reply.automation or 'active'}[/]   nodes: {by_state}")
    if reply.held_nodes:
        _console.print(f"held by the circuit breaker: {', '.join(reply.held_nodes)}  (vigil resume [--apply-held])")
    for problem in reply.problems:
        _console.print(f"[red]the controller is impaired: {escape(problem)}[/]")
    if reply.problems:
        _console.print("[red]faults wait in the agents' spools until it records again: health may be stale[/]")
    table = Table(title=f"Vigil nodes ({len(reply.nodes)})")
    for column in ("node", "health", "GPUs", "last heartbeat", "open incident"):
        table.add_column(column)
    for n in reply.nodes:
        age = f"{reply.now - n.last_heartbeat:.0f}s ago" if n.last_heartbeat else "never"
        table.add_row(n.node, n.health, str(n.gpus), age, n.open_incident or "-")
    _console.print(table)
    return 0


def _figure(mfu: float, tokens_per_s: float) -> str:
    """A job's baseline or window for a person: MFU where it reports it, else tokens/s; "-": none yet."""
    if mfu:
        return f"{mfu:.1%}"
    return f"{tokens_per_s:,.0f} tok/s" if tokens_per_s else "-"


def goodput_line(job: admin_pb2.JobStatus) -> str:
    """Where a job's time went, in one line."""
    return f"goodput {job.goodput:.1%}: " + ", ".join(f"{k} {s}" for k, s in zip(KINDS, _seconds(job), strict=True))


def _seconds(job: admin_pb2.JobStatus) -> list[str]:
    return [f"{getattr(job, f'{kind}_s'):.1f}s" for kind in KINDS]


def print_jobs(target: str, as_json: bool) -> int:
    jobs = _ask(target, AdminClient.jobs)
    if jobs is None:
        return 2
    if as_json:
        _print_json(jobs)
        return 0
    table = Table(title=f"Vigil training jobs ({len(jobs)})")
    columns = (
        "job",
        "state",
        "nodes",
        "step",
        "committed",
        "restarts",
        "baseline",
        "last",
        "goodput",
        "plan",
        "save every",
    )
    for column in (*columns, *KINDS):
        table.add_column(column)
    for j in jobs:
        table.add_row(
            j.job_id, _state(j), ",".join(j.nodes) + (f" (out: {','.join(j.excluded)})" if j.excluded else ""),
            str(j.step), str(j.committed_step), str(j.restart_count),
            _figure(j.baseline_mfu, j.baseline_tokens_per_s), _figure(j.last_mfu, j.last_tokens_per_s),
            f"{j.goodput:.1%}", *_plan(j), *_seconds(j),
        )  # fmt: skip
    _console.print(table)
    if any(j.gpus for j in jobs):
        _console.print(
            "[dim]plan: the ETTR vigil plan expects at the job's size (jobs.failures_per_1000_gpu_days), "
            "with its measured save and restart times; save every: Daly's interval for its save time[/]"
        )
    return 0


def print_repairs(target: str, as_json: bool) -> int:
    reply = _ask(target, AdminClient.repairs)
    if reply is None:
        return 2
    if as_json:
        _print_json(reply)
        return 0
    if not reply.enabled:
        _console.print("remediation is off (remediation.enabled in the controller's configuration): a person repairs")
        return 0
    table = Table(title=f"Vigil repairs: {reply.released} released (pages saved), {reply.hands} hands, since its start")
    for column in ("node", "incident", "phase", "step", "ladder", "for", "waiting for / tried"):
        table.add_column(column)
    now = time.time()
    for r in reply.repairs:
        said = r.waiting_for or (r.tried[-1] if r.tried else "")
        table.add_row(r.node, r.incident_id, r.phase, r.step, " > ".join(r.ladder), f"{now - r.since:.0f} s", said)
    _console.print(table)
    return 0


def _state(j: admin_pb2.JobStatus) -> str:
    """running, or HUNG with how long its step has not moved, or what it said it is doing."""
    if j.hung_s > 0:
        return f"[bold red]HUNG {j.hung_s:.0f} s[/]"
    return f"{j.state} ({j.pause})" if j.pause else j.state


def _plan(j: admin_pb2.JobStatus) -> tuple[str, str]:
    if not j.gpus:
        return "-", "-"
    return f"{j.planned_ettr:.1%}", f"{j.recommended_checkpoint_s / 60:.3g} min (a save: {j.planned_save_s:.3g} s)"


def print_rules(target: str, as_json: bool) -> int:
    reply = _ask(target, AdminClient.rules)
    if reply is None:
        return 2
    if as_json:
        _print_json(list(reply.rules))
        return 0
    window = f"{reply.undo_window_s / 60:g} min"
    table = Table(title=f"Vigil rules: decisions, those a person undid within {window}, and those repaired")
    for column in ("rule", "quarantines", "undone", "repaired", "precision", "pages", "resolved by hand"):
        table.add_column(column)
    for r in reply.rules:
        precision = f"{r.precision:.0%}" if r.quarantines else "-"
        counts = (r.quarantines, r.undone, r.repaired)
        table.add_row(r.rule, *map(str, counts), precision, str(r.pages), str(r.resolved_by_hand))
    _console.print(table)
    return 0


def print_incidents(target: str, open_only: bool, node: str, limit: int, as_json: bool) -> int:
    incidents = _ask(target, lambda client: client.incidents(open_only, node, limit))
    if incidents is None:
        return 2
    if as_json:
        _print_json(incidents)
        return 0
    table = Table(title="Vigil incidents")
    for column in ("opened", "incident", "node", "GPU", "signal", "count", "status", "actions"):
        table.add_column(column)
    for i in incidents:
        what = f"XID {i.code}" if i.kind == common_pb2.XID else common_pb2.SignalKind.Name(i.kind)
        actions = ", ".join(f"{a.kind}:{a.status}" for a in i.actions) or "-"
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.opened_at))
        gpu = str(i.gpu.index) if i.gpu.index >= 0 else "-"
        table.add_row(opened, i.id, i.node, gpu, f"{what}: {i.reason}", str(i.signal_count), i.status, actions)
    _console.print(table)
    return 0


def request_uncordon(target: str, node: str, who: str, reason: str, verdict: str = "") -> int:
    return _request(
        target, lambda c: c.uncordon(node, who, reason, verdict), lambda r: f"{r.node}: {r.health} ({r.detail})"
    )


def request_resolve(target: str, incident_id: str, who: str, note: str) -> int:
    return _request(
        target, lambda c: c.resolve(incident_id, who, note), lambda r: f"{r.incident_id} ({r.node}): {r.detail}"
    )


def request_resume(target: str, who: str, reason: str, apply_held: bool) -> int:
    return _request(
        target,
        lambda c: c.resume(who, reason, apply_held),
        lambda r: f"automation: {r.automation} ({_held_said(r)})",
    )


def _held_said(reply: admin_pb2.ResumeReply) -> str:
    """What became of the quarantines the breaker held, by node as status listed them."""
    nodes = list(reply.nodes)
    if not nodes:
        return "nothing was held"
    what = "applied" if reply.applied else "dropped"
    actions = reply.applied or reply.dropped
    return f"held quarantines {what} on {len(nodes)} node(s): {', '.join(nodes)} ({actions} action(s))"


def _request(target: str, call: Callable[[AdminClient], T], say: Callable[[T], str]) -> int:
    """Ask the controller to do something; print what it says it did (0), or why it could not (2)."""
    reply = _ask(target, call)
    if reply is None:
        return 2
    _console.print(say(reply))
    return 0
