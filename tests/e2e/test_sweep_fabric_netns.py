"""A topology-aware sweep blames the switch, not its nodes, on a real two-tier fabric.

Six "nodes", each a network namespace with its own agent, hang two by two from three leaf bridges;
each leaf joins the spine bridge (where the controller listens) through an uplink veth pair. The
controller knows each node's leaf from its labels. One part is throttled with ``tc ... tbf`` at a
time: a whole leaf (every port of it) here; a leaf's uplink and one node's own link are the scenarios
``fabric-bad-uplink-is-named-not-its-nodes`` and ``fabric-throttled-node-is-the-node-not-an-uplink``,
on the same fabric. The
sweep pairs neighbours, then across leaves, runs real gloo all-reduces between the namespaces at
two sizes, and must name the throttled part: the leaf as such (its nodes are not blamed), the node
as a node, never its partner (re-paired with known-good nodes, as a sweep without a topology does).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.netns import HOST, Nodes, namespaced_nodes, unavailable
from tests.e2e.processes import configured_controller, port_of, start_agent, sweep_pairs
from tests.helpers import poll_until
from vigil.admin_client import AdminClient

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("netns")]  # one subnet: one at a time

NODES, LEAVES = 6, 3


# A throttled uplink and a throttled node are scenarios on the same fabric (with --quarantine,
# fabric-bad-uplink-is-named-not-its-nodes and fabric-throttled-node-is-the-node-not-an-uplink): they
# are not swept again here (each sweep is a minute of all-reduces on a loaded machine).
CASES: list[tuple[str, Callable[[Nodes], None], tuple[str, str]]] = [
    ("leaf-1", lambda n: n.throttle_leaf(1), ("leaf", "leaf leaf-1")),
]


@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(why := unavailable()), reason=why or "")
def test_a_throttled_leaf_is_named_as_such(tmp_path: Path) -> None:
    names = [f"node-{i}" for i in range(NODES)]
    with namespaced_nodes(NODES, prefix=f"vf{os.getpid() % 1000}", leaves=LEAVES) as nodes:
        # Six nodes' all-reduces share two cores here: a pair counts as slow 80% below healthy pairs
        # (the default, 50%, suits a real fabric); throttled pairs run 20-40 times slower.
        sweep_config = {"pair_max_below_median": 0.8}
        ctl = configured_controller(
            tmp_path, "ctl", listen=HOST, pager="none", sweep=sweep_config, node_labels=nodes.labels(names)
        )
        target = f"{HOST}:{port_of(tmp_path, 'ctl')}"
        agents = [start_agent(tmp_path, names[i], target, prefix=nodes.exec_prefix(i))[0] for i in range(NODES)]
        try:
            with AdminClient(target) as admin:
                poll_until(lambda: len(admin.status().nodes) == NODES, what="every agent connected", timeout=60)
            for what, throttle, expected in CASES:
                throttle(nodes)
                code, summary = sweep_pairs(target, "pairs.sizes=1048576,4194304", "pairs.iters=5")
                nodes.unthrottle_fabric()
                findings = summary.get("findings", [])
                print(f"\nthrottled {what}: {json.dumps(findings)}")  # pytest -s: the record
                assert [(f["kind"], f["node"]) for f in findings] == [expected], json.dumps(summary, indent=1)
                verdicts = {r["node"]: r["verdict"] for r in summary["rows"]}
                assert "FAIL" not in verdicts.values()  # the component is blamed, not its nodes
                assert code == 1
        finally:
            for proc in (*agents, ctl):
                proc.send_signal(signal.SIGTERM)
            for proc in (*agents, ctl):
                proc.wait(15)
