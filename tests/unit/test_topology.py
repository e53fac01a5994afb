"""Where each node sits in the fabric: from labels, from a topology file (``controller.sweeps.topology``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controller.sweeps.topology import (
    Place,
    TopologyConfig,
    TopologyError,
    from_labels,
    is_topology_aware,
    merged,
    parse_topology_file,
    size_label,
)


def test_places_come_from_the_configured_label_names() -> None:
    cfg = TopologyConfig(leaf_label="example.com/tor", spine_label="example.com/pod")
    labels = {
        "n1": {"example.com/tor": "t1", "example.com/pod": "p1", "nvidia.com/gpu.clique": "c7"},
        "n2": {"vigil.dev/leaf-switch": "ignored: not the configured name"},
    }
    assert from_labels(labels, cfg) == {"n1": Place(leaf="t1", spine="p1", nvlink="c7")}


def test_a_topology_file_by_leaf_and_by_node_and_it_wins_over_labels() -> None:
    text = """
leaves:
  leaf-a: {spine: pod-1, nodes: [n1, n2]}
  leaf-b: {spine: pod-1, nodes: [n3]}
nodes:
  n2: {rack: r9}
  n4: {leaf: leaf-b, nvlink: clique-2}
"""
    found = parse_topology_file(text, "topo.yaml")
    assert found["n2"] == Place(leaf="leaf-a", spine="pod-1", rack="r9")
    assert found["n4"] == Place(leaf="leaf-b", nvlink="clique-2")
    assert merged({"n1": Place(leaf="old")}, found)["n1"].leaf == "leaf-a"
    assert is_topology_aware(["n1", "n3"], found) and not is_topology_aware(["n1", "n2", "n9"], found)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("leaves: [a, b]", "topo.yaml: leaves: Input should be a valid dictionary"),
        ("leaves: {a: {nodes: [n1]}, b: {nodes: [n1]}}", "node n1 is under two leaves: a and b"),
        ("nodes: {n1: {leaf: a, switch: x}}", "topo.yaml: nodes.n1.switch: Extra inputs are not permitted"),
        ("leaves: {a: [", "topo.yaml: not YAML"),
    ],
)
def test_a_bad_topology_file_is_refused_by_name(text: str, says: str) -> None:
    with pytest.raises(TopologyError, match=says.replace("[", r"\[")):
        parse_topology_file(text, "topo.yaml")


def test_pair_sizes_are_bytes_in_reason() -> None:
    assert TopologyConfig(pair_sizes=(1 << 20, 8, 8)).pair_sizes == (8, 1 << 20)
    with pytest.raises(ValidationError, match="pair sizes are bytes from 4 to 16 GiB"):
        TopologyConfig(pair_sizes=(2,))
    assert [size_label(s) for s in (8, 1 << 16, 3 << 20, 1 << 30, 1000)] == [
        "8 B",
        "64 KiB",
        "3 MiB",
        "1 GiB",
        "1000 B",
    ]
