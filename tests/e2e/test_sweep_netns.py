"""The sweep finds the node with the slow link, among real agents in network namespaces.

Six "nodes", each a network namespace with its own agent, joined by veth pairs through a bridge;
the controller listens on the bridge. One node's link is throttled with ``tc ... tbf``. The sweep
pairs the nodes for real gloo all-reduces between the namespaces, flags the slow pair against the
others, re-pairs both members with known-good nodes and must name the throttled node, never its
partner: with the throttle on a rank-0 member, then on a rank-1 member.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.e2e.netns import HOST, namespaced_nodes, unavailable
from tests.e2e.processes import configured_controller, port_of, start_agent, sweep_pairs
from tests.helpers import poll_until
from vigil.admin_client import AdminClient

pytestmark = pytest.mark.e2e

NODES = 6


@pytest.mark.skipif(bool(why := unavailable()), reason=why or "")
def test_the_throttled_node_is_named_rank_0_or_rank_1(tmp_path: Path) -> None:
    with namespaced_nodes(NODES, prefix=f"vg{os.getpid() % 1000}") as nodes:
        # Six nodes' all-reduces share two cores here: a healthy pair may run at half another's speed. A
        # pair counts as slow 80% below the median (the default, 50%, suits a real fabric); throttled
        # pairs run 20-40 times slower.
        sweep_config = {"pair_max_below_median": 0.8}
        ctl = configured_controller(tmp_path, "ctl", listen=HOST, pager="none", sweep=sweep_config)
        target = f"{HOST}:{port_of(tmp_path, 'ctl')}"
        agents = [start_agent(tmp_path, f"node-{i}", target, prefix=nodes.exec_prefix(i))[0] for i in range(NODES)]
        try:
            with AdminClient(target) as admin:
                poll_until(lambda: len(admin.status().nodes) == NODES, what="every agent connected", timeout=60)
            for throttled in (2, 5):  # node-2 is rank 0 of its pair, node-5 rank 1 of its own
                nodes.throttle(throttled)
                code, summary = sweep_pairs(target, "pairs.sizes=1048576", "pairs.iters=9")
                nodes.unthrottle(throttled)
                figures = {r["node"]: r.get("figure", "") for r in summary["rows"]}
                print(f"\nthrottled node-{throttled}: {figures}; {summary['findings']}")  # pytest -s: the record
                findings = summary.get("findings", [])
                assert [f["node"] for f in findings] == [f"node-{throttled}"], json.dumps(summary, indent=1)
                pairs = {r["node"]: r for r in summary["rows"]}
                partner = throttled ^ 1
                assert pairs[f"node-{partner}"]["verdict"] == "OK", pairs[f"node-{partner}"]
                assert code == 1 and summary["rounds"] == 2
        finally:
            for proc in (*agents, ctl):
                proc.send_signal(signal.SIGTERM)
            for proc in (*agents, ctl):
                proc.wait(15)
