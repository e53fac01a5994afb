"""A release leaves a node cordoned when someone else changed it since the quarantine (pure plans)."""

from __future__ import annotations

from controller.act.kube.plans import changed_since_quarantine, plan_quarantine, plan_release

NOW = 1_800_000_000.0


def quarantined(node: dict) -> dict:  # type: ignore[type-arg]
    plan = plan_quarantine(node, "inc-1", "XID 79", NOW, "default")
    assert not isinstance(plan, str) and plan.node_patch is not None
    patch = plan.node_patch
    return {
        "metadata": {**node["metadata"], "annotations": patch["metadata"]["annotations"]},
        "spec": {**node["spec"], **patch["spec"]},
    }


def base() -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": "gpu-1", "resourceVersion": "1"}, "spec": {"taints": [{"key": "gpu", "effect": "X"}]}}


def test_an_untouched_quarantine_is_released_whole() -> None:
    node = quarantined(base())
    assert changed_since_quarantine(node) == ""
    plan = plan_release(node, "check passed", NOW + 60, "default")
    assert plan is not None and not plan.keeps_cordon and plan.node_patch["spec"]["unschedulable"] is None


def test_a_taint_added_since_is_seen_and_the_cordon_kept() -> None:
    node = quarantined(base())
    node["spec"]["taints"].append({"key": "repair", "value": "rma", "effect": "NoSchedule"})
    assert "changed its cordon or taints" in changed_since_quarantine(node)
    plan = plan_release(node, "check passed", NOW + 60, "default")
    assert plan is not None and plan.keeps_cordon and plan.node_patch["spec"]["unschedulable"] is True


def test_a_cordon_by_another_manager_after_the_quarantine_is_seen_in_managed_fields() -> None:
    node = quarantined(base())
    fields = {"f:spec": {"f:unschedulable": {}}}
    node["metadata"]["managedFields"] = [
        {"manager": "vigil", "operation": "Update", "time": "2027-01-15T08:00:00Z", "fieldsV1": fields},
        {"manager": "kubectl-cordon", "operation": "Update", "time": "2020-01-01T00:00:00Z", "fieldsV1": fields},
    ]
    assert changed_since_quarantine(node) == ""  # a cordon from before the quarantine is WAS_UNSCHEDULABLE's
    node["metadata"]["managedFields"].append(
        {"manager": "kubectl-cordon", "operation": "Update", "time": "2027-01-15T09:00:00Z", "fieldsV1": fields}
    )
    assert changed_since_quarantine(node).startswith("kubectl-cordon changed")
    labels_only = {"manager": "someone", "time": "2027-01-15T09:00:00Z", "fieldsV1": {"f:metadata": {}}}
    node["metadata"]["managedFields"] = [labels_only]
    assert changed_since_quarantine(node) == ""  # a label or annotation is not a cordon
