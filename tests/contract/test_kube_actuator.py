"""The Kubernetes actuator, through the real ``kubernetes`` client, against an API server on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from controller.act.actuators import SelectionError
from controller.act.kube.actuator import MERGE_PATCH, STRATEGIC_PATCH, KubeActuator
from controller.act.kube.client import RETRY, api_client
from controller.act.kube.plans import CONDITION_TYPE, INCIDENT, OWNER, TAINT_KEY, WAS_UNSCHEDULABLE, event_name
from controller.vocab.actions import Quarantine
from tests.fakes.kube_api import KubeApiServer
from tests.helpers import poll_until

REASON = "XID 79 on GPU 3: GPU has fallen off the bus"


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


def actuator(kube: KubeApiServer, tmp_path: Path, **kw: object) -> KubeActuator:
    fast = RETRY.new(backoff_factor=0.01)  # the production retry policy, with short waits
    return KubeActuator(api_client(kube.kubeconfig(tmp_path / "kubeconfig"), retry=fast), **kw)  # type: ignore[arg-type]


def quarantine(node: str, incident: str = "inc-1") -> Quarantine:
    return Quarantine(incident, node, REASON, "reboot the node", 1.0)


def test_quarantine_sends_exactly_the_expected_writes(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}])
    detail = actuator(kube, tmp_path).quarantine(quarantine("gpu-1"))
    assert detail.startswith("tainted, cordoned")

    (patch,) = kube.requests("PATCH", r"/api/v1/nodes/gpu-1$")
    assert patch.content_type == MERGE_PATCH
    assert patch.body["metadata"]["resourceVersion"] == "1"
    assert patch.body["metadata"]["annotations"][OWNER] == "vigil"
    assert patch.body["metadata"]["annotations"][INCIDENT] == "inc-1"
    assert patch.body["metadata"]["annotations"][WAS_UNSCHEDULABLE] == "false"
    assert patch.body["spec"]["unschedulable"] is True
    taints = patch.body["spec"]["taints"]
    assert taints[0] == {"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}  # kept
    assert {k: taints[1][k] for k in ("key", "effect", "value")} == {
        "key": TAINT_KEY,
        "effect": "NoSchedule",
        "value": "XID-79-on-GPU-3-GPU-has-fallen-off-the-bus",
    }

    (status,) = kube.requests("PATCH", r"/api/v1/nodes/gpu-1/status$")
    assert status.content_type == STRATEGIC_PATCH
    (condition,) = status.body["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (CONDITION_TYPE, "True", "VigilQuarantine")
    assert condition["message"] == REASON

    (event,) = kube.requests("POST", r"/api/v1/namespaces/default/events$")
    assert event.body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "uid-gpu-1"}
    assert (event.body["type"], event.body["reason"]) == ("Warning", "VigilQuarantine")
    assert event.body["metadata"]["name"] == event_name("gpu-1", "inc-1")

    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]} == {"Ready": "True", CONDITION_TYPE: "True"}


def test_quarantine_is_idempotent(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1")
    act = actuator(kube, tmp_path)
    act.quarantine(quarantine("gpu-1"))
    again = act.quarantine(quarantine("gpu-1"))
    assert again.startswith("already tainted and cordoned")
    assert len(kube.requests("PATCH", r"/nodes/gpu-1$")) == 1  # the node is not written twice
    assert len(kube.objects_of("events")) == 1  # the repeated Event met 409 AlreadyExists
    other = act.quarantine(quarantine("gpu-1", "inc-2"))
    assert "already quarantined by Vigil (incident inc-1)" in other
    assert len(kube.requests("PATCH", r"/nodes/gpu-1$")) == 1


def test_conflict_and_server_errors_are_survived(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1")
    kube.fail("PATCH", r"/nodes/gpu-1$", 409)  # someone else wrote the node in between
    kube.fail("PATCH", r"/nodes/gpu-1/status$", 500, times=2)  # the API server hiccups
    kube.fail("POST", r"/events$", 503)
    detail = actuator(kube, tmp_path).quarantine(quarantine("gpu-1"))
    assert detail.startswith("tainted, cordoned")
    assert len(kube.requests("PATCH", r"/nodes/gpu-1$")) == 2
    assert len(kube.requests("GET", r"/nodes/gpu-1$")) == 2  # read again after the 409
    assert len(kube.requests("PATCH", r"/nodes/gpu-1/status$")) == 3
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"][INCIDENT] == "inc-1"
    assert len(kube.objects_of("events")) == 1


def test_a_stale_read_meets_a_real_conflict(kube: KubeApiServer, tmp_path: Path) -> None:
    """The emulator enforces resourceVersion: a write planned on an old read is refused, re-planned."""
    kube.add_node("gpu-1")
    act = actuator(kube, tmp_path)
    original_get = act._get
    calls = {"n": 0}

    def get_then_someone_writes(name: str) -> dict[str, object]:
        node = original_get(name)
        calls["n"] += 1
        if calls["n"] == 1:  # a person labels the node right after Vigil read it
            act._core.patch_node(name, {"metadata": {"labels": {"team": "a"}}}, _content_type=MERGE_PATCH)
        return node

    act._get = get_then_someone_writes  # type: ignore[method-assign]
    act.quarantine(quarantine("gpu-1"))
    node = kube.node("gpu-1")
    assert node["metadata"]["labels"] == {"team": "a"}  # the person's write survived
    assert node["metadata"]["annotations"][INCIDENT] == "inc-1"
    assert calls["n"] == 2


def test_a_node_cordoned_by_a_person_is_never_uncordoned(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1", unschedulable=True)  # cordoned by a person, no Vigil annotations
    act = actuator(kube, tmp_path)
    release = act.release("gpu-1", "checks passed")
    assert not release.released and "by someone else" in release.detail
    assert kube.requests("PATCH") == []
    # Vigil quarantines it on top, then releases: the person's cordon stays.
    act.quarantine(quarantine("gpu-1"))
    release = act.release("gpu-1", "checks passed")
    assert release.released and "stays cordoned" in release.detail
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert not node["spec"].get("taints")
    assert not any(k.startswith("vigil.dev/") for k in node["metadata"]["annotations"])
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}[CONDITION_TYPE] == "False"


def test_release_undoes_exactly_what_vigil_did(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}])
    act = actuator(kube, tmp_path)
    act.quarantine(quarantine("gpu-1"))
    assert act.release("gpu-1", "RMA done").released
    node = kube.node("gpu-1")
    assert "unschedulable" not in node["spec"]
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}]
    assert [e["reason"] for e in kube.objects_of("events")] == ["VigilQuarantine", "VigilRelease"]


def test_a_release_leaves_cordoned_a_node_someone_changed_since_the_quarantine(
    kube: KubeApiServer, tmp_path: Path
) -> None:
    from kubernetes import client as k8s

    kube.add_node("gpu-1")
    act = actuator(kube, tmp_path)
    act.quarantine(quarantine("gpu-1"))
    # An SRE marks the node for repair (as `kubectl taint` does), through their own client.
    person = k8s.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "person-kubeconfig")))
    taints = [*kube.node("gpu-1")["spec"]["taints"], {"key": "repair", "value": "rma", "effect": "NoSchedule"}]
    person.patch_node("gpu-1", {"spec": {"taints": taints}}, field_manager="kubectl-taint")
    release = act.release("gpu-1", "check passed")
    assert release.released and "left cordoned" in release.detail
    node = kube.node("gpu-1")
    assert node["spec"]["unschedulable"] is True  # the person's repair is not undone
    assert [t["key"] for t in node["spec"]["taints"]] == ["repair"]  # only Vigil's own taint went
    assert OWNER not in (node["metadata"].get("annotations") or {})


def test_adopt_finds_vigils_quarantines_only(kube: KubeApiServer, tmp_path: Path) -> None:
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        kube.add_node(name)
    kube.add_node("gpu-4", unschedulable=True)
    act = actuator(kube, tmp_path)
    act.quarantine(quarantine("gpu-2", "inc-7"))
    (found,) = act.adopt()
    assert (found.node, found.incident_id, found.reason) == ("gpu-2", "inc-7", REASON)
    assert found.at > 0


def watched(kube: KubeApiServer, tmp_path: Path) -> KubeActuator:
    from controller.act.kube.actuator import watching

    act = watching(api_client(kube.kubeconfig(tmp_path / "kubeconfig"), retry=RETRY.new(total=1)))
    assert act.cache is not None
    poll_until(lambda: act.cache is not None and act.cache.synced, 10)
    return act


def test_a_new_leader_adopts_from_the_watch_without_a_list(kube: KubeApiServer, tmp_path: Path) -> None:
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        kube.add_node(name)
    kube.add_node("gpu-4", unschedulable=True)  # someone else's cordon: not Vigil's to adopt
    earlier = actuator(kube, tmp_path)  # the replica that led before
    earlier.quarantine(quarantine("gpu-2", "inc-7"))
    act = watched(kube, tmp_path)  # a standby's: its watch listed the cluster before it leads
    try:
        lists = len(kube.requests("GET", r"^/api/v1/nodes$"))
        poll_until(lambda: act.adopt_watched() == act.adopt(), 10)  # the watch shows what the cluster holds
        assert [(q.node, q.incident_id) for q in act.adopt_watched() or []] == [("gpu-2", "inc-7")]
        assert len(kube.requests("GET", r"^/api/v1/nodes$")) == lists + 1  # adopt's own LIST only
    finally:
        act.close()


def test_a_watch_that_has_not_listed_adopts_nothing_from_itself(kube: KubeApiServer, tmp_path: Path) -> None:
    from controller.act.kube.node_cache import NodeCache

    api = api_client(kube.kubeconfig(tmp_path / "kubeconfig"))
    assert KubeActuator(api, cache=NodeCache(client.CoreV1Api(api))).adopt_watched() is None  # not started
    assert KubeActuator(api).adopt_watched() is None  # no watch at all


def test_a_burst_reads_nodes_from_the_watch_not_one_get_each(kube: KubeApiServer, tmp_path: Path) -> None:
    names = [f"gpu-{i}" for i in range(40)]
    kube.add_nodes(names, labels={"rack": "r1"})
    act = watched(kube, tmp_path)
    try:
        assert act.node_labels()["gpu-3"] == {"rack": "r1"}
        barrier = threading.Barrier(20)

        def run(name: str) -> None:
            barrier.wait()
            act.quarantine(quarantine(name, f"inc-{name}"))

        threads = [threading.Thread(target=run, args=(n,)) for n in names[:20]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(kube.node(n)["spec"].get("unschedulable") for n in names[:20])
        assert not any(kube.node(n)["spec"].get("unschedulable") for n in names[20:])
        assert not kube.requests("GET", r"/api/v1/nodes/gpu-\d+$")  # every read came from the watch
        assert len(kube.requests("GET", r"^/api/v1/nodes$")) == 1  # one LIST, at start
        # The watch saw Vigil's own writes: the same incident's quarantine again reads it as done.
        poll_until(lambda: bool(cached_spec(act, "gpu-0").get("unschedulable")), 10)
        assert act.quarantine(quarantine("gpu-0", "inc-gpu-0")).startswith("already tainted and cordoned")
        assert not kube.requests("GET", r"/api/v1/nodes/gpu-\d+$")
    finally:
        act.close()  # as the controller's shutdown does: the watch's thread ends
        assert act.cache is not None
        act.cache._thread.join(10)
        assert not act.cache._thread.is_alive()


def test_a_stale_read_from_the_watch_costs_one_conflict_and_one_get(kube: KubeApiServer, tmp_path: Path) -> None:
    kube.add_node("gpu-1")
    act = watched(kube, tmp_path)
    try:
        assert act.cache is not None
        stale = act.cache.get("gpu-1")
        # Someone taints the node; the actuator plans from what it read before (the watch behind): its
        # conditional PATCH gets 409 Conflict, it reads the node again and keeps the person's taint.
        person = {"key": "person/hold", "value": "x", "effect": "NoSchedule"}
        core = client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kc2")))
        core.patch_node("gpu-1", {"spec": {"taints": [person]}}, _content_type=MERGE_PATCH)
        poll_until(lambda: bool(cached_spec(act, "gpu-1").get("taints")), 10)
        act.cache._nodes["gpu-1"] = stale  # type: ignore[assignment]  # held back: as if the watch were behind
        act.quarantine(quarantine("gpu-1", "inc-1"))
        taints = {t["key"] for t in kube.node("gpu-1")["spec"]["taints"]}
        assert taints == {"person/hold", "vigil.dev/quarantined"}
        assert len(kube.requests("GET", r"/api/v1/nodes/gpu-1$")) == 1
        assert len([r for r in kube.requests("PATCH", r"/api/v1/nodes/gpu-1$")]) >= 2  # the 409, then the write
    finally:
        assert act.cache is not None
        act.cache.stop()


def test_the_watch_lists_again_when_its_version_is_gone(
    kube: KubeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controller.act.kube.node_cache import NodeCache
    from tests.fakes import kube_api

    monkeypatch.setattr(kube_api, "NODE_EVENTS_KEPT", 2)
    kube.add_nodes([f"gpu-{i}" for i in range(3)])
    core = client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kubeconfig")))
    for i in range(6):  # more changes than the server keeps
        core.patch_node("gpu-0", {"metadata": {"labels": {"n": str(i)}}}, _content_type=MERGE_PATCH)
    cache = NodeCache(core, retry_s=0.1)
    assert cache._watch("101") == ""  # 410 Gone: a version the server forgot means list again
    cache.start()
    try:
        poll_until(lambda: cache.synced, 10)
        assert cache.labels()["gpu-0"] == {"n": "5"} and cache.lists == 1
        core.patch_node("gpu-1", {"metadata": {"labels": {"rack": "r9"}}}, _content_type=MERGE_PATCH)
        poll_until(lambda: cache.labels().get("gpu-1") == {"rack": "r9"}, 10)  # by the watch, not a list
        assert cache.events >= 1 and cache.lists == 1
    finally:
        cache.stop()


def test_the_node_cache_lists_every_node_once_page_by_page(kube: KubeApiServer, tmp_path: Path) -> None:
    """Pages of the LIST (the API server's continue tokens) cover the fleet exactly: each node once, a
    node deleted meanwhile skipped, one made after the first page still listed, other kinds never."""
    from controller.act.kube.node_cache import PAGE, NodeCache

    names = [f"gpu-{i:05d}" for i in range(PAGE * 2 + 7)]
    kube.add_nodes(names)
    kube.add_pod("default", "worker-0", names[0])
    core = client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kubeconfig")))
    first = core.list_node(limit=PAGE)
    core.delete_node(names[PAGE + 1])  # on the second page, not yet read
    core.create_node({"metadata": {"name": "gpu-late"}})
    second = core.list_node(limit=PAGE, _continue=first.metadata._continue)
    third = core.list_node(limit=PAGE, _continue=second.metadata._continue)
    listed = [n.metadata.name for page in (first, second, third) for n in page.items]
    assert listed == [n for n in names if n != names[PAGE + 1]] + ["gpu-late"]
    assert third.metadata._continue is None
    cache = NodeCache(core)
    cache.start()
    try:
        poll_until(lambda: cache.synced, 10)
        assert sorted(cache.labels()) == sorted(listed) and cache.lists == 1
    finally:
        cache.stop()


def test_node_labels_are_listed_page_by_page_and_then_kept_by_the_cache(kube: KubeApiServer, tmp_path: Path) -> None:
    """Never one LIST of every Node (100,000 real ones are gigabytes): before the node cache has listed,
    the labels are read a page at a time; after, from the cache, also while it lists again after a lost
    watch (stale labels, not a LIST every refresh)."""
    from controller.act.kube.node_cache import PAGE, NodeCache

    names = [f"gpu-{i:05d}" for i in range(PAGE * 2 + 7)]
    kube.add_nodes(names, labels={"rack": "r1"})
    act = actuator(kube, tmp_path)
    labels = act.node_labels()
    assert len(labels) == len(names) and labels[names[-1]] == {"rack": "r1"}
    assert len(kube.requests("GET", r"^/api/v1/nodes$")) == 3  # three pages
    assert len(act.adopt()) == 0 and len(kube.requests("GET", r"^/api/v1/nodes$")) == 6  # adoption pages too
    act.cache = NodeCache(client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kc"))))
    act.cache.start()
    try:
        poll_until(lambda: act.cache is not None and act.cache.synced, 10)
        act.cache.synced = False  # as after a lost watch, while it lists again
        listed = len(kube.requests("GET", r"^/api/v1/nodes$"))
        assert act.node_labels()[names[0]] == {"rack": "r1"}
        assert len(kube.requests("GET", r"^/api/v1/nodes$")) == listed
    finally:
        act.cache.stop()


def test_the_watch_says_which_labels_changed_so_a_refresh_reads_only_those(kube: KubeApiServer, tmp_path: Path) -> None:
    """After its list, the cache tells what the watch saw change in the nodes' labels (a node that joined
    among them) and the nodes gone; a cordon is not a change, and its node keeps its labels' object."""
    from controller.act.kube.node_cache import NodeCache

    kube.add_nodes(["gpu-0", "gpu-1", "gpu-2"], labels={"rack": "r1"})
    act = actuator(kube, tmp_path)
    assert act.label_changes() is None  # no watch: the whole, each time
    act.cache = NodeCache(client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kc"))))
    act.cache.start()
    try:
        poll_until(lambda: act.cache is not None and act.cache.synced, 10)
        assert act.label_changes() is None  # the first: compare the whole
        assert act.label_changes() == ({}, [])
        before = act.cache.labels()["gpu-0"]
        core = client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kc2")))
        core.patch_node("gpu-0", {"spec": {"unschedulable": True}})
        core.patch_node("gpu-1", {"metadata": {"labels": {"rack": "r2"}}})
        core.delete_node("gpu-2")
        core.create_node({"metadata": {"name": "gpu-3", "labels": {"rack": "r3"}}})
        taken: list[tuple[dict[str, dict[str, str]], list[str]]] = []

        def seen_all() -> bool:
            taken.append(act.label_changes() or ({}, []))
            return {n for c, g in taken for n in [*c, *g]} >= {"gpu-1", "gpu-2", "gpu-3"}

        poll_until(seen_all, 10, what="the label changes seen by the watch")
        poll_until(lambda: cached_spec(act, "gpu-0").get("unschedulable") is True, 10)
        changed = {n: labels for c, _ in taken for n, labels in c.items()}
        assert changed == {"gpu-1": {"rack": "r2"}, "gpu-3": {"rack": "r3"}}  # not the cordoned gpu-0
        assert [n for _, g in taken for n in g] == ["gpu-2"]
        assert act.cache.labels()["gpu-0"] is before
        act.cache.synced = False  # a lost watch: it lists again, and the next refresh compares the whole
        act.cache._list()
        assert act.label_changes() is None
    finally:
        act.cache.stop()


def test_a_lost_watch_is_said_and_its_readers_fall_back_to_the_api_server(tmp_path: Path) -> None:
    from controller.act.kube.node_cache import NodeCache

    with KubeApiServer() as kube:
        kube.add_nodes(["gpu-0"], labels={"rack": "r1"})
        cache = NodeCache(client.CoreV1Api(api_client(kube.kubeconfig(tmp_path / "kc"), retry=RETRY.new(total=0))))
        cache._retry_s = 0.1
        cache.start()
        poll_until(lambda: cache.synced, 10)
    try:  # the API server is gone: the watch ends and cannot be opened again
        poll_until(lambda: cache.losses >= 1, 15, what="the lost watch counted")
        assert (
            not cache.synced
        )  # stale: the actuator reads by GET (its labels: the cache's, stale) until it lists again
    finally:
        cache.stop()


def cached_spec(act: KubeActuator, node: str) -> dict[str, object]:
    assert act.cache is not None
    spec: dict[str, object] = (act.cache.get(node) or {}).get("spec", {})
    return spec


def test_missing_node_is_a_permanent_failure(kube: KubeApiServer, tmp_path: Path) -> None:
    from controller.act.actuators import PermanentActionError

    with pytest.raises(PermanentActionError, match="404"):
        actuator(kube, tmp_path).quarantine(quarantine("no-such-node"))


def test_credentials_errors_name_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.act.kube.client import KubeConfigError

    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(KubeConfigError, match="kubeconfig"):
        api_client(bad)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="in-cluster"):
        api_client(None)  # no service-account token mounted here


def test_drain_evicts_workloads_and_waits_for_budgets(kube: KubeApiServer, tmp_path: Path) -> None:
    from controller.act.kube.actuator import DrainBlocked
    from controller.vocab.actions import Drain

    kube.add_node("gpu-1")
    kube.add_node("gpu-2")
    kube.add_pod("train", "worker-0", "gpu-1")
    kube.add_pod("train", "worker-1", "gpu-1")  # its budget allows no disruption right now
    kube.add_pod("vigil", "vigil-agent-x", "gpu-1", owner_kind="DaemonSet")
    kube.add_pod("train", "worker-2", "gpu-2")
    # The client retries a 429 a few times itself (RETRY in controller.act.kube.client); a budget that
    # keeps refusing outlasts that, and the drain reports the pod and is tried again later.
    kube.fail("POST", r"/pods/worker-1/eviction$", 429, times=100)
    act = actuator(kube, tmp_path)
    with pytest.raises(DrainBlocked, match="train/worker-1"):
        act.drain(Drain("inc-1", "gpu-1"))
    remaining = {p["metadata"]["name"] for p in kube.objects_of("pods")}
    assert remaining == {"worker-1", "vigil-agent-x", "worker-2"}  # the DaemonSet's pod and other nodes stay
    kube.clear_faults()  # the budget allows it now
    assert act.drain(Drain("inc-1", "gpu-1")) == "drained: 1 pod(s) evicted"
    assert {p["metadata"]["name"] for p in kube.objects_of("pods")} == {"vigil-agent-x", "worker-2"}
    evictions = kube.requests("POST", r"/eviction$")
    assert evictions[0].body["kind"] == "Eviction" and evictions[0].body["apiVersion"] == "policy/v1"


def test_drain_is_a_separate_action_after_the_quarantine(kube: KubeApiServer, tmp_path: Path) -> None:
    import asyncio

    from controller.act.actuators import NullPager
    from controller.compose import node_route
    from controller.store import Store
    from controller.vocab.policy import Policy
    from vigil_core.signals import GpuRef, Signal, SignalKind

    kube.add_node("gpu-1")
    kube.add_pod("train", "worker-0", "gpu-1")

    async def scenario() -> None:
        store = Store(tmp_path / "ctl.db")
        e = node_route(store, Policy(), actuator(kube, tmp_path), NullPager(), drain=True).engine
        e.hello("gpu-1", "s", 8)
        e.receive("gpu-1", [Signal("gpu-1", SignalKind.XID, GpuRef(0), code=79, seq=1)])
        await e.wait_for_actions()
        (incident,) = store.incidents.list(node="gpu-1")
        actions = {a.kind: (a.status, a.detail) for a in incident.actions}
        assert actions["QUARANTINE"][0] == "DONE"
        assert actions["DRAIN"] == ("DONE", "drained: 1 pod(s) evicted")
        assert kube.objects_of("pods") == []
        store.close()

    asyncio.run(scenario())


def test_sweeps_choose_nodes_by_label_and_by_job(kube: KubeApiServer, tmp_path: Path) -> None:
    for i in range(4):
        kube.add_node(f"gpu-{i}", labels={"pool": "h100" if i < 3 else "a100", "zone": f"z{i % 2}"})
    act = actuator(kube, tmp_path)
    assert act.nodes_matching("pool=h100") == ["gpu-0", "gpu-1", "gpu-2"]
    assert act.nodes_matching("pool=h100,zone!=z0") == ["gpu-1"]
    assert act.nodes_matching("pool=tpu") == []
    with pytest.raises(SelectionError, match="label selector 'pool in h100': the API server answered 400"):
        act.nodes_matching("pool in h100")

    job = "batch.kubernetes.io/job-name"
    kube.add_pod("train", "moe-0", "gpu-2", owner_kind="Job", labels={job: "moe"})
    kube.add_pod("train", "moe-1", "gpu-0", owner_kind="Job", labels={job: "moe"})
    kube.add_pod("train", "moe-old", "gpu-3", owner_kind="Job", labels={job: "moe"}, phase="Failed")
    kube.add_pod("other", "moe-0", "gpu-1", owner_kind="Job", labels={job: "moe"})  # another namespace's
    assert act.job_nodes("train", "moe") == ["gpu-0", "gpu-2"]
    kube.add_pod("train", "legacy-0", "gpu-1", owner_kind="Job", labels={"job-name": "legacy"})  # before 1.27
    assert act.job_nodes("train", "legacy") == ["gpu-1"]
    with pytest.raises(SelectionError, match="Job train/nope has no running pods"):
        act.job_nodes("train", "nope")


def test_choosing_nodes_from_an_unreachable_api_server_says_so(tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    act = KubeActuator(api_client(kubeconfig, retry=RETRY.new(total=1, backoff_factor=0.01)))
    with pytest.raises(SelectionError, match="cannot reach the API server"):
        act.nodes_matching("pool=h100")
