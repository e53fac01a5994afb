"""A sweep of a fleet with one bad leaf switch: the topology-aware sweep beside the node-level one.

    python -m bench.sweep_fabric [--nodes 1000] [--leaves 32] [--pair-s 1.0]

The same fleet of simulated agents (``tests.fakes.sim_checks``) is swept twice by a real
``vigil controller`` process, pairwise all-reduce only, each pair taking ``--pair-s``: once as today
(no topology: node pairs in order, then re-pairs), once knowing each node's leaf (a topology file).
Every pair through one leaf switch runs at a twentieth of the others' speed. Printed: rounds, pairs,
wall time and what each sweep blames (the leaf as one component, or its nodes one by one).
Figures are appended to bench/results/sweep_fabric.jsonl with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.record import append_result, header
from bench.sweep import run_sweep
from tests.fakes.sim_checks import SimulatedChecks


def fleet(nodes: int, leaves: int) -> dict[str, str]:
    """Node -> its leaf, in order, as evenly as they divide."""
    return {f"gpu-{i:05d}": f"leaf-{i * leaves // nodes:02d}" for i in range(nodes)}


async def sweep(
    leaf_of: dict[str, str], bad: str, aware: bool, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    def path_gbps(a: str, b: str) -> float:
        return 2.0 if bad in (leaf_of[a], leaf_of[b]) else 40.0

    settings: dict[str, Any] = {"database": str(workdir / f"ctl-{'aware' if aware else 'nodes'}.db")}
    if aware:
        by_leaf: dict[str, list[str]] = {}
        for node, leaf in leaf_of.items():
            by_leaf.setdefault(leaf, []).append(node)
        topology = workdir / "topology.yaml"
        topology.write_text(yaml.safe_dump({"leaves": {leaf: {"nodes": n} for leaf, n in by_leaf.items()}}))
        settings["sweep"] = {"topology": {"file": str(topology)}}
    sim = SimulatedChecks(pair_duration_s=args.pair_s, path_gbps=path_gbps)
    swept = await run_sweep(list(leaf_of), sim, settings, workdir, ["pairs"])
    summary = swept.summary
    behind = sorted(n for n, leaf in leaf_of.items() if leaf == bad)
    blamed = [(f.kind or "node", f.node) for f in summary.findings]
    return {
        "sweep": "topology-aware" if aware else "node-level",
        "pairs": summary.pairs,
        "rounds": summary.rounds,
        "wall_s": round(swept.wall_s, 3),
        "floor_s": summary.rounds * args.pair_s,
        "controller_cpu_s": round(swept.controller_cpu_s, 2),
        "findings": len(blamed),
        "blamed": blamed[:5] + ([("...", f"{len(blamed) - 5} more")] if len(blamed) > 5 else []),
        "leaf_named": blamed == [("leaf", f"leaf {bad}")],
        "nodes_blamed": sum(1 for kind, node in blamed if kind == "node" and node in behind),
        "failed_nodes": summary.failed_nodes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--leaves", type=int, default=32)
    parser.add_argument("--pair-s", type=float, default=1.0, help="how long each simulated pair all-reduce takes")
    args = parser.parse_args()
    leaf_of = fleet(args.nodes, args.leaves)
    bad = sorted(set(leaf_of.values()))[args.leaves // 3]
    runs = []
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
        for aware in (False, True):
            try:
                runs.append(asyncio.run(sweep(leaf_of, bad, aware, args, Path(tmp))))
            except (TimeoutError, RuntimeError) as exc:
                print(f"bench failed: {exc!r}", file=sys.stderr)
                return 1
    record = {
        **header("sweep_fabric"),
        "nodes": args.nodes,
        "leaves": args.leaves,
        "bad_leaf": bad,
        "pair_s": args.pair_s,
        "runs": runs,
    }
    print(json.dumps(record, indent=2))
    base = runs[0]
    for r in runs:
        print(
            f"{r['sweep']:>15}: {r['pairs']:5} pairs in {r['rounds']} rounds, wall {r['wall_s']:.2f} s "
            f"(x{r['wall_s'] / base['wall_s']:.2f} the node-level), {r['findings']} finding(s), "
            f"{r['failed_nodes']} node(s) failed; leaf {bad} named: {r['leaf_named']}, "
            f"its nodes blamed one by one: {r['nodes_blamed']}"
        )
    append_result("sweep_fabric", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
