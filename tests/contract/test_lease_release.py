"""A leader that stops on purpose hands its Lease back (``controller.act.kube.lease``): the real
kubernetes client's elector against the Kubernetes double. A standby takes a released Lease within
its retry period, not the Lease's duration; the stopping replica's own renewing thread never takes
it back; a Lease another replica holds is left alone."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.act.kube.client import api_client
from controller.act.kube.lease import LeaderElector
from tests.fakes.kube_api import KubeApiServer
from tests.helpers import poll_until

LEASE_S = 15  # the default: a standby that had to wait it out would fail these tests' bounds


MADE: list[LeaderElector] = []  # stopped after each test: no thread polls a port reused later


@pytest.fixture(autouse=True)
def released_after() -> Iterator[None]:
    yield
    while MADE:
        MADE.pop()._lock.released = True  # no more requests (its API double is gone: no release to write)


def elector(kube: KubeApiServer, tmp: Path, identity: str, won: threading.Event) -> LeaderElector:
    api = api_client(kube.kubeconfig(tmp / f"{identity}-kubeconfig"))
    return made(
        LeaderElector(
            api,
            "vigil",
            "vigil-controller",
            identity,
            on_started=won.set,
            on_stopped=lambda: None,
            lease_duration_s=LEASE_S,
            renew_deadline_s=10,
            retry_period_s=1,
        )
    )


def made(e: LeaderElector) -> LeaderElector:
    MADE.append(e)
    return e


def leading(kube: KubeApiServer, tmp: Path, identity: str = "ctl-a") -> LeaderElector:
    """An elector that has taken the Lease."""
    won = threading.Event()
    leader = elector(kube, tmp, identity, won)
    leader.start()
    assert won.wait(10)
    return leader


def lease(kube: KubeApiServer) -> dict[str, Any]:
    return next(o for o in kube.objects_of("leases"))


def test_a_standby_takes_a_released_lease_within_its_retry_period(tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        a, b_won = leading(kube, tmp_path), threading.Event()
        b = elector(kube, tmp_path, "ctl-b", b_won)
        b.start()
        time.sleep(2.5)  # the standby has seen the Lease held (and renewed) twice
        assert not b_won.is_set()

        released_at = time.monotonic()
        assert a.release()
        assert "holderIdentity" not in lease(kube)["spec"]
        assert b_won.wait(5), "the standby waited for the Lease to expire"
        assert time.monotonic() - released_at < LEASE_S / 2
        assert lease(kube)["spec"]["holderIdentity"] == "ctl-b"


def test_the_releasing_replicas_own_renewals_never_take_the_lease_back(tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        a = leading(kube, tmp_path)
        assert a.release()
        renewals = len(kube.requests("PUT", "/leases/"))
        time.sleep(3.5)  # three of its retry periods: its thread renews (and would take a free Lease)
        assert "holderIdentity" not in lease(kube)["spec"]
        assert len(kube.requests("PUT", "/leases/")) == renewals  # nothing written after the release


def test_a_lease_another_replica_holds_is_left_alone(tmp_path: Path) -> None:
    with KubeApiServer() as kube:
        a, b_won = leading(kube, tmp_path), threading.Event()
        b = elector(kube, tmp_path, "ctl-b", b_won)
        assert not b.release()  # a standby stopping: it never held the Lease
        before = lease(kube)["spec"]
        poll_until(lambda: lease(kube)["spec"]["renewTime"] != before["renewTime"], what="ctl-a renewing on")
        assert lease(kube)["spec"]["holderIdentity"] == "ctl-a"
        b.start()  # released before it started: it never takes the Lease, even once it is free
        assert a.release()
        time.sleep(2.5)
        assert not b_won.is_set()
        assert "holderIdentity" not in lease(kube)["spec"]


def short_leader(kube: KubeApiServer, tmp: Path) -> tuple[LeaderElector, threading.Event]:
    """A leader under a 4 s Lease (3 s to renew), and the event its loss of the Lease sets."""
    won, lost = threading.Event(), threading.Event()
    api = api_client(kube.kubeconfig(tmp / "kubeconfig"))
    a = made(LeaderElector(api, "vigil", "lease", "ctl-a", won.set, lost.set, 4, renew_deadline_s=3, retry_period_s=1))
    a.start()
    assert won.wait(10)
    return a, lost


def test_a_leader_that_cannot_reach_the_api_server_stops_leading_within_its_renew_deadline(tmp_path: Path) -> None:
    """The library's lock lets urllib3's errors (a refused connection) out of its thread, which then
    ends without saying the leadership is lost: a leader acting on while a standby takes the Lease.
    Vigil's lock reads them as a failed try, as it reads the API server's refusals."""
    with KubeApiServer() as kube:
        a, lost = short_leader(kube, tmp_path)
        kube.__exit__(None, None, None)  # the API server gone: every request refused
        assert lost.wait(20), "the leader's election thread ended without saying the leadership was lost"


def test_a_leader_whose_api_server_never_answers_stops_leading_within_its_renew_deadline(tmp_path: Path) -> None:
    """The library's requests have no timeout: an API server that takes the connection and never
    answers (a connection half gone, packets dropped) held the renewing thread past its deadline, a
    leader acting on while a standby takes the Lease. Vigil's lock bounds each request."""
    with KubeApiServer() as kube:
        a, lost = short_leader(kube, tmp_path)
        host, port = kube.url.removeprefix("http://").rsplit(":", 1)
        kube.__exit__(None, None, None)
        with socket.socket() as silent:  # the same port: each connection taken, nothing ever answered
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            silent.bind((host, int(port)))
            silent.listen(64)
            assert lost.wait(20), "the leader's renewals waited on an API server that never answers"


def test_a_leader_whose_api_server_answers_something_else_stops_leading(tmp_path: Path) -> None:
    """A proxy's page, or a port another server took, answers the Lease's read: the client's error
    (not the API server's refusal) ended the library's thread silently too."""
    with KubeApiServer() as kube:
        a, lost = short_leader(kube, tmp_path)

        def not_a_lease(*args: object, **kwargs: object) -> object:
            raise ValueError("Input should be a valid dictionary or instance of V1Lease")

        a._lock.api_instance.read_namespaced_lease = not_a_lease  # type: ignore[method-assign]
        assert lost.wait(20), "the leader's election thread ended without saying the leadership was lost"
