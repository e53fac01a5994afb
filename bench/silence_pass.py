"""A new leader's first look at its fleet's silence: how long it holds the event loop at once.

    python -m bench.silence_pass [--nodes 100000]

A controller that takes over (a restart, a failover) loads every node from its store, and each is
due to be looked at at once (``Fleet.due``): when it counts as silent, if its agent says nothing. At
100,000 nodes that first look held the new leader's event loop for seconds while the whole fleet
said Hello again through the relays (``bench.scale --failover``, sampled). Here, the same: N nodes
written by one controller's node route, then a second built on the same store, its clock a few
seconds on, looks at each (none is silent yet: each is looked at again later); the whole pass in
one step (``check_silence(limit=None)``) against batches of ``SILENCE_BATCH`` with the loop free
between (what ``Upkeep.watch`` does), on fresh stores side by side in one run: the longest step, the
steps' sum, how many. SQLite. Printed and appended to ``bench/results/silence_pass.jsonl`` with the
command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import append_result, header, revision
from controller.act.actuators import NullPager
from controller.act.local_actuator import LocalActuator
from controller.compose import NodeRoute, node_route
from controller.nodes.guards.rules import GuardrailConfig
from controller.nodes.upkeep import SILENCE_BATCH
from controller.store import Store
from controller.vocab.policy import load_policy


def route(store: Store, now: list[float]) -> NodeRoute:
    guard = GuardrailConfig(shared={"enabled": False}, breaker_max_fraction=1.0)  # type: ignore[arg-type]
    return node_route(
        store, load_policy(None), LocalActuator(store.db), NullPager(), clock=lambda: now[0], guardrails=guard
    )


async def first_look(path: Path, nodes: int, limit: int | None) -> dict[str, Any]:
    now = [1000.0]
    store = Store(path)
    earlier = route(store, now)
    for i in range(nodes):
        earlier.engine.hello(f"n{i:06d}", f"spool-{i}", 8)
        earlier.engine.connected(f"n{i:06d}")
    await store.group.durable()
    store.close()
    now[0] += 5.0  # the next controller: the same store, a few seconds on
    store = Store(path)
    leader = route(store, now)
    steps: list[float] = []
    silenced = 0
    while leader.fleet.has_due(now[0]):
        started = time.perf_counter()
        silenced += len(leader.upkeep.check_silence(limit))
        steps.append(time.perf_counter() - started)
        await asyncio.sleep(0)
    store.close()
    return {
        "steps": len(steps),
        "longest_s": round(max(steps, default=0.0), 4),
        "sum_s": round(sum(steps), 3),
        "silenced": silenced,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        whole = asyncio.run(first_look(Path(tmp) / "whole.db", args.nodes, None))
        batched = asyncio.run(first_look(Path(tmp) / "batched.db", args.nodes, SILENCE_BATCH))
    record = {
        **header("silence_pass"),
        "revision": revision(),
        "nodes": args.nodes,
        "batch": SILENCE_BATCH,
        "one_pass": whole,
        "batched": batched,
        "longest_ratio": round(batched["longest_s"] / whole["longest_s"], 4) if whole["longest_s"] else None,
    }
    print(json.dumps(record, indent=2))
    append_result("silence_pass", record)


if __name__ == "__main__":
    main()
