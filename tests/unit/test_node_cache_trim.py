"""The node cache keeps of a Node what Vigil reads, and no less: whoever changed a quarantined node's
cordon or taints since is told from the trimmed node as from the whole one (``held_by_others`` reads
the cache, not a GET per node a second)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.act.kube.node_cache import trimmed
from controller.act.kube.plans import changed_since_quarantine, plan_quarantine

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
TIMES = ["2020-01-01T00:00:00Z", "2027-01-15T08:00:00Z", "2027-01-15T09:00:00Z", "not a time", ""]
SPEC_FIELDS = ["f:unschedulable", "f:taints", "f:podCIDR", "f:providerID"]

entries = st.lists(
    st.fixed_dictionaries(
        {
            "manager": st.sampled_from(["vigil", "kubectl-cordon", "kubelet", None]),
            "operation": st.sampled_from(["Update", "Apply"]),
            "time": st.sampled_from(TIMES),
            "fieldsV1": st.one_of(
                st.builds(lambda fs: {"f:spec": {f: {} for f in fs}}, st.sets(st.sampled_from(SPEC_FIELDS))),
                st.just({"f:metadata": {"f:labels": {}}}),
                st.just({}),
            ),
        }
    ),
    max_size=5,
)
taints = st.lists(
    st.fixed_dictionaries({"key": st.sampled_from(["gpu", "repair", "vigil.dev/quarantined"]), "effect": st.just("X")}),
    max_size=3,
)


def quarantined() -> dict[str, Any]:
    node: dict[str, Any] = {"metadata": {"name": "gpu-1", "resourceVersion": "1"}, "spec": {"taints": []}}
    plan = plan_quarantine(node, "inc-1", "XID 79", NOW, "default")
    assert not isinstance(plan, str) and plan.node_patch is not None
    return {
        "metadata": {**node["metadata"], "annotations": plan.node_patch["metadata"]["annotations"]},
        "spec": {**node["spec"], **plan.node_patch["spec"]},
    }


@given(entries, st.none() | taints, st.none() | st.booleans())
def test_who_changed_the_cordon_is_told_from_the_trimmed_node_as_from_the_whole(
    fields: list[dict[str, Any]], new_taints: list[dict[str, str]] | None, cordoned: bool | None
) -> None:
    node = quarantined()
    node["metadata"]["managedFields"] = fields
    node["metadata"]["labels"] = {"rack": "r1"}
    node["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}  # what the cache leaves out
    if new_taints is not None:
        node["spec"]["taints"] = new_taints
    if cordoned is not None:
        node["spec"]["unschedulable"] = cordoned
    assert changed_since_quarantine(trimmed(node)) == changed_since_quarantine(node)


def test_only_the_cordons_writers_are_kept() -> None:
    node = quarantined()
    node["metadata"]["managedFields"] = [
        {"manager": "kubelet", "time": TIMES[2], "fieldsV1": {"f:status": {"f:conditions": {}}}},
        {
            "manager": "kubectl-cordon",
            "time": TIMES[2],
            "fieldsV1": {"f:spec": {"f:unschedulable": {}, "f:podCIDR": {}}},
        },
    ]
    assert trimmed(node)["metadata"]["managedFields"] == [
        {"manager": "kubectl-cordon", "time": TIMES[2], "fieldsV1": {"f:spec": {"f:unschedulable": {}}}}
    ]
    node["metadata"]["managedFields"] = node["metadata"]["managedFields"][:1]
    assert "managedFields" not in trimmed(node)["metadata"]
