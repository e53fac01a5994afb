"""The store's writer on its own: how many received batches a second it writes, and at what CPU.

    python -m bench.store_writer [--database postgresql|sqlite] [--nodes 2000] [--batches 20000]
    python -m bench.store_writer [--database postgresql|sqlite] --hellos 100000

Each batch is what the controller records for one record-only signal (XID 63, a row remap event,
as ``bench.scale``'s background): decided by the controller's own ``decide`` and written by the
store's own statements (the signal, its incident, the node's row) in a ``tx(durable=False)``, as
``Applier.commit`` does, then one ``sync`` (the group commit's flush) at the end. The batches are
recorded as fast as the writer takes them (it holds at most ``max_pending``), so the figure is the
writer's ceiling, not the controller's: in the controller the same interpreter also runs the event
loop, and every CPU-second the writer spends is one the loop does not have.

The writer with its statements merged per table (``controller.store.coalesce``) and without, each
on a fresh database, side by side in one run: batches a second, the process's CPU per 1,000
batches. PostgreSQL is Debian's, private, fsync on (``tests/postgres.py``). Printed and appended to
``bench/results/store_writer.jsonl`` with the command.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from bench.record import append_result, header, revision
from controller.nodes.decide import decide
from controller.nodes.engine import incident_id_for
from controller.store import Store
from controller.store.incidents import IncidentLog
from controller.store.nodes import NodeTable
from controller.vocab.actions import FoldIntoIncident, OpenIncident
from controller.vocab.node_state import NodeState
from controller.vocab.policy import load_policy
from tests.postgres import postgres_cluster
from tests.postgres import unavailable as postgres_unavailable
from vigil_core.signals import GpuRef, Signal, SignalKind


def _run(target: str, nodes: int, batches: int, coalesce: bool) -> dict[str, Any]:
    store = Store(target, coalesce=coalesce)
    policy = load_policy(None)
    names = [f"node-{i:05d}" for i in range(nodes)]
    states = {n: NodeState(n) for n in names}
    for name in names:
        store.nodes.register(states[name], "spool0", 0, 8, 0.0)
    store.db.sync()
    seqs = dict.fromkeys(names, 0)
    writer = store.writer.thread_id
    cpu0, writer0, t0 = time.process_time(), _thread_cpu(writer), time.perf_counter()
    for k in range(batches):
        node = names[k % nodes]
        seqs[node] += 1
        now = time.time()
        signal = Signal(node, SignalKind.XID, GpuRef(k % 8), 63, message="row remap", observed_at=now, seq=seqs[node])
        incident_id = incident_id_for(node, "spool0", seqs[node])
        decision = decide(states[node], signal, policy, now, incident_id)
        with store.tx(durable=False) as db:
            IncidentLog.signal(db, node, "spool0", signal, incident_id, now)
            for action in decision.actions:
                if isinstance(action, OpenIncident):
                    IncidentLog.open(db, action, now)
                elif isinstance(action, FoldIntoIncident):
                    IncidentLog.fold(db, action)
            NodeTable.received(db, decision.state, seqs[node], now)
        states[node] = decision.state
    store.db.sync()
    wall, cpu, writer_cpu = time.perf_counter() - t0, time.process_time() - cpu0, _thread_cpu(writer) - writer0
    size = store.db.size_bytes()
    store.close()  # the group commit's thread too, not only the database
    return {
        "coalesce": coalesce,
        "batches_per_s": round(batches / wall, 1),
        "cpu_s_per_1000": round(cpu / batches * 1000, 3),
        "writer_cpu_s_per_1000": round(writer_cpu / batches * 1000, 3),
        "wall_s": round(wall, 2),
        "database_mb": round(size / 1e6, 1),
    }


def _hellos(target: str, hellos: int, every: int = 500) -> dict[str, Any]:
    """A fleet's first Hellos: each a new node's row (``NodeTable.register``, as the engine writes
    it, its state as JSON), a ``sync`` (the group commit behind the agents' acks) every ``every``."""
    store = Store(target)
    writer = store.writer.thread_id
    cpu0, writer0, t0 = time.process_time(), _thread_cpu(writer), time.perf_counter()
    for k in range(hellos):
        store.nodes.register(NodeState(f"node-{k:06d}"), f"spool-{k}", 0, 8, time.time(), 8)
        if k % every == every - 1:
            store.db.sync()
    store.db.sync()
    wall, cpu, writer_cpu = time.perf_counter() - t0, time.process_time() - cpu0, _thread_cpu(writer) - writer0
    store.close()
    return {
        "hellos_per_s": round(hellos / wall, 1),
        "cpu_s_per_1000": round(cpu / hellos * 1000, 3),
        "writer_cpu_s_per_1000": round(writer_cpu / hellos * 1000, 3),
        "wall_s": round(wall, 2),
    }


def _thread_cpu(native_id: int) -> float:
    """One thread of this process: its CPU seconds so far."""
    for thread in psutil.Process().threads():
        if thread.id == native_id:
            return float(thread.user_time + thread.system_time)
    return 0.0


@contextlib.contextmanager
def _fresh_database(database: str) -> Iterator[str]:
    """A new, empty database of the kind named, its target, removed after: PostgreSQL is a private
    server with fsync on (``tests/postgres.py``), SQLite a file in a temporary folder."""
    if database == "postgresql":
        with postgres_cluster(fsync=True) as cluster:
            yield cluster.dsn
    else:
        with tempfile.TemporaryDirectory() as folder:
            yield str(Path(folder) / "vigil.db")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.store_writer", description=__doc__.split("\n")[0])
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20000)
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--hellos", type=int, default=0, help="instead: a fleet of N agents' first Hellos")
    args = parser.parse_args()
    if args.database == "postgresql" and (why := postgres_unavailable()):
        parser.error(f"--database postgresql: {why}")
    if args.hellos > 0:
        with _fresh_database(args.database) as target:
            figures = _hellos(target, args.hellos)
        print(figures)
        if not args.no_record:
            hellos = {**header("store_writer", database=args.database), "revision": revision(), "hellos": args.hellos}
            print(append_result("store_writer", hellos | figures))
        return
    rows = []
    for coalesce in (False, True):
        with _fresh_database(args.database) as target:
            rows.append(_run(target, args.nodes, args.batches, coalesce))
            print(rows[-1], flush=True)
    before, after = rows
    record = {
        **header("store_writer", database=args.database),
        "revision": revision(),
        "nodes": args.nodes,
        "batches": args.batches,
        "runs": rows,
        "batches_per_s_ratio": round(after["batches_per_s"] / before["batches_per_s"], 2),
        "cpu_ratio": round(after["cpu_s_per_1000"] / before["cpu_s_per_1000"], 2),
        "writer_cpu_ratio": round(after["writer_cpu_s_per_1000"] / before["writer_cpu_s_per_1000"], 2),
    }
    print(
        f"{args.database}: {before['batches_per_s']:.0f} -> {after['batches_per_s']:.0f} batches/s"
        f" (x{record['batches_per_s_ratio']}), CPU per 1,000 batches {before['cpu_s_per_1000']:.2f}"
        f" -> {after['cpu_s_per_1000']:.2f} s (x{record['cpu_ratio']}), of which the writer's"
        f" {before['writer_cpu_s_per_1000']:.3f} -> {after['writer_cpu_s_per_1000']:.3f} s"
        f" (x{record['writer_cpu_ratio']})"
    )
    if not args.no_record:
        print(append_result("store_writer", record))


if __name__ == "__main__":
    main()
