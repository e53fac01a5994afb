"""What the operator commands print: tables for people, JSON for scripts."""

from __future__ import annotations

import json
import time
from collections import Counter

import grpc
from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.table import Table

from protos.vigil.v1 import common_pb2
from vigil.admin_client import AdminClient

_console = Console()


def _unreachable(target: str, exc: grpc.RpcError) -> int:
    _console.print(f"[red]error:[/] controller at {target} answered {exc.code().name}: {exc.details()}")
    return 2


def print_status(target: str, as_json: bool) -> int:
    try:
        with AdminClient(target) as client:
            reply = client.status()
    except grpc.RpcError as exc:
        return _unreachable(target, exc)
    if as_json:
        print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))
        return 0
    counts = Counter(n.health for n in reply.nodes)
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no nodes"
    style = "red" if reply.automation.startswith("paused") else "yellow" if reply.automation == "dry-run" else "green"
    _console.print(f"automation: [{style}]{reply.automation or 'active'}[/]   nodes: {by_state}")
    if reply.held_nodes:
        _console.print(f"held by the circuit breaker: {', '.join(reply.held_nodes)}  (vigil resume [--apply-held])")
    table = Table(title=f"Vigil nodes ({len(reply.nodes)})")
    for column in ("node", "health", "GPUs", "last heartbeat", "open incident"):
        table.add_column(column)
    for n in reply.nodes:
        age = f"{reply.now - n.last_heartbeat:.0f}s ago" if n.last_heartbeat else "never"
        table.add_row(n.node, n.health, str(n.gpus), age, n.open_incident or "-")
    _console.print(table)
    return 0


def print_incidents(target: str, open_only: bool, node: str, limit: int, as_json: bool) -> int:
    try:
        with AdminClient(target) as client:
            incidents = client.incidents(open_only, node, limit)
    except grpc.RpcError as exc:
        return _unreachable(target, exc)
    if as_json:
        print(json.dumps([MessageToDict(i, preserving_proto_field_name=True) for i in incidents], indent=2))
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


def request_uncordon(target: str, node: str, who: str, reason: str) -> int:
    try:
        with AdminClient(target) as client:
            reply = client.uncordon(node, who, reason)
    except grpc.RpcError as exc:
        return _unreachable(target, exc)
    _console.print(f"{reply.node}: {reply.health} ({reply.detail})")
    return 0


def request_resume(target: str, who: str, reason: str, apply_held: bool) -> int:
    try:
        with AdminClient(target) as client:
            reply = client.resume(who, reason, apply_held)
    except grpc.RpcError as exc:
        return _unreachable(target, exc)
    _console.print(
        f"automation: {reply.automation} (held quarantines applied {reply.applied}, dropped {reply.dropped})"
    )
    return 0
