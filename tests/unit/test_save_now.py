"""When a running job is asked to save now (``controller.jobs.save_now``)."""

from __future__ import annotations

from controller.jobs.save_now import SaveRequests

NODES = ("n1", "n2", "n3")


def test_a_suspect_node_asks_once_per_suspicion() -> None:
    s = SaveRequests()
    first = s.decide("job", NODES, {"n2"}, now=1000.0, every_s=600.0)
    assert first is not None and first.id == "job-save-1" and first.reason == "n2 is SUSPECT"
    assert s.decide("job", NODES, {"n2"}, now=5000.0, every_s=600.0) is None  # still the same suspicion
    assert s.decide("job", NODES, set(), now=5100.0, every_s=600.0) is None  # cleared
    again = s.decide("job", NODES, {"n2"}, now=5200.0, every_s=600.0)  # suspect anew: a new ask
    assert again is not None and again.id == "job-save-2"


def test_warnings_ask_too_at_most_once_per_interval_and_wait_for_the_next() -> None:
    s = SaveRequests()
    s.warn("n1", "THROTTLE on n1 GPU 2")
    assert s.decide("job", NODES, set(), now=100.0, every_s=600.0) is not None
    s.warn("n3", "IB_PORT_FLAP on n3 mlx5_0 port 1")
    assert s.decide("job", NODES, set(), now=200.0, every_s=600.0) is None  # too soon: it waits
    later = s.decide("job", NODES, set(), now=800.0, every_s=600.0)
    assert later is not None and later.reason == "n3: IB_PORT_FLAP on n3 mlx5_0 port 1"
    s.warn("elsewhere", "THROTTLE")
    assert s.decide("job", NODES, set(), now=2000.0, every_s=600.0) is None  # not the job's node


def test_the_request_goes_out_until_acknowledged_or_stale() -> None:
    s = SaveRequests()
    asked = s.decide("job", NODES, {"n1"}, now=0.0, every_s=600.0)
    assert asked is not None and s.outstanding(10.0, resend_s=60.0) == asked
    assert not s.acknowledged("other") and s.acknowledged(asked.id)
    assert s.outstanding(11.0, resend_s=60.0) is None
    s.decide("job", NODES, {"n2"}, now=1000.0, every_s=600.0)
    assert s.outstanding(1100.0, resend_s=60.0) is None  # never acknowledged: not sent forever
