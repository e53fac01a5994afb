"""The fleet's network topology: the leaf switch each node hangs from, the spine or pod above the
leaf, its rack and NVLink domain. Pure.

It comes from the nodes' labels (the label keys are ``TopologyConfig``'s, Kubernetes-style) or from a
topology file (YAML, ``parse_topology_file``); where both place a node, the file wins. A sweep pairs
neighbours under one leaf first, then across leaves, and blames the smallest component the evidence
points to (``controller.sweeps.fabric``). The rack and the NVLink domain are carried for the record (rows
and findings name them); localisation uses the leaf and the spine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vigil_core.config_file import ConfigModel, FilePath

# nccl-tests style: latency (8 B) up to bandwidth (1 GiB). Each is judged against the fleet at that size.
DEFAULT_PAIR_SIZES = (8, 1 << 16, 1 << 24, 1 << 30)


class TopologyConfig(ConfigModel):
    leaf_label: str = Field(default="vigil.dev/leaf-switch", min_length=1, description="node label naming its leaf")
    spine_label: str = Field(default="vigil.dev/spine", min_length=1, description="the spine or pod above the leaf")
    rack_label: str = Field(default="vigil.dev/rack", min_length=1)
    nvlink_label: str = Field(default="nvidia.com/gpu.clique", min_length=1, description="NVLink domain (clique)")
    file: FilePath | None = Field(default=None, description="a topology file; where it places a node it wins")
    pair_sizes: tuple[int, ...] = Field(
        default=DEFAULT_PAIR_SIZES, min_length=1, description="payloads (bytes) of a topology-aware sweep's pairs"
    )

    @field_validator("pair_sizes")
    @classmethod
    def _sizes(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if bad := [s for s in value if not 4 <= s <= 1 << 34]:
            raise ValueError(f"pair sizes are bytes from 4 to 16 GiB, not {bad}")
        return tuple(sorted(set(value)))


@dataclass(frozen=True, slots=True)
class Place:
    leaf: str = ""
    spine: str = ""
    rack: str = ""
    nvlink: str = ""


Topology = Mapping[str, Place]


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names the problem."""


def from_labels(labels: Mapping[str, Mapping[str, str]], config: TopologyConfig) -> dict[str, Place]:
    """Each labelled node's place (a node with none of the labels has none)."""
    out = {}
    for node, mine in labels.items():
        place = Place(
            mine.get(config.leaf_label, ""),
            mine.get(config.spine_label, ""),
            mine.get(config.rack_label, ""),
            mine.get(config.nvlink_label, ""),
        )
        if place != Place():
            out[node] = place
    return out


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _NodePlace(_Strict):
    leaf: str = ""
    spine: str = ""
    rack: str = ""
    nvlink: str = ""


class _Leaf(_Strict):
    spine: str = ""
    nodes: list[str] = Field(default_factory=list)


class _TopologyFile(_Strict):
    leaves: dict[str, _Leaf] = Field(default_factory=dict, description="leaf -> its spine and nodes")
    nodes: dict[str, _NodePlace] = Field(default_factory=dict, description="node -> its place (wins over leaves)")


def parse_topology_file(text: str, source: str) -> dict[str, Place]:
    """A topology file: ``leaves: {leaf-a: {spine: pod-1, nodes: [n1, n2]}}`` and/or per node
    ``nodes: {n1: {leaf: leaf-a, spine: pod-1, rack: r1, nvlink: clique-1}}``."""
    try:
        raw = yaml.safe_load(text) or {}
        parsed = _TopologyFile.model_validate(raw)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{source}: not YAML: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise TopologyError(f"{source}: {where}: {first['msg']}") from None
    out: dict[str, Place] = {}
    for leaf, entry in parsed.leaves.items():
        for node in entry.nodes:
            if node in out:
                raise TopologyError(f"{source}: node {node} is under two leaves: {out[node].leaf} and {leaf}")
            out[node] = Place(leaf=leaf, spine=entry.spine)
    for node, p in parsed.nodes.items():
        under = out.get(node, Place())
        out[node] = Place(p.leaf or under.leaf, p.spine or under.spine, p.rack, p.nvlink)
    return out


def merged(from_cluster: Topology, from_file: Topology) -> dict[str, Place]:
    return {**from_cluster, **from_file}


def leaves(nodes: Sequence[str], topology: Topology) -> dict[str, list[str]]:
    """The swept nodes grouped by leaf, in the order they were given; unplaced nodes under ''."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        out.setdefault(topology.get(node, Place()).leaf, []).append(node)
    return out


def is_topology_aware(nodes: Sequence[str], topology: Topology) -> bool:
    """A sweep can localise above the node when its nodes span two leaves or more."""
    return len([leaf for leaf in leaves(nodes, topology) if leaf]) >= 2


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
