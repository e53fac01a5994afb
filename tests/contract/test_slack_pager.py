"""The Slack pager, through the real slack-sdk, against a Slack Web API on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from slack_sdk.errors import SlackApiError

from controller.act.actuators import NotReadyYet, PermanentActionError
from controller.act.pagers.slack import SlackPager
from controller.store import Store
from controller.vocab.actions import Page, PageUpdate
from controller.vocab.policy import Severity
from tests.fakes.slack_api import CHANNEL, TOKEN, FakeSlack


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        yield server


def pager(slack: FakeSlack, tmp_path: Path, db: str = "ctl.db") -> SlackPager:
    return SlackPager(TOKEN, CHANNEL, Store(tmp_path / db).records, base_url=slack.base_url)


def page(incident: str = "gpu-7-abc-12", severity: Severity = Severity.QUARANTINE) -> Page:
    return Page(
        incident,
        "gpu-7",
        severity,
        "XID 79 on GPU 3: GPU has fallen off the bus",
        "reboot the node; if it repeats, replace the GPU",
        1.0,
        "GPU 3, PCI 0000:3b:00.0, GPU-1234",
        "quarantining the node: taint, cordon, node condition",
    )


def texts(blocks: list[dict[str, object]]) -> str:
    out = []
    for b in blocks:
        for part in [b.get("text")] + list(b.get("fields", [])):  # type: ignore[operator]
            if isinstance(part, dict):
                out.append(str(part["text"]))
    return "\n".join(out)


def test_one_message_per_incident_with_the_facts(slack: FakeSlack, tmp_path: Path) -> None:
    p = pager(slack, tmp_path)
    assert p.page(page()).startswith("posted to Slack")
    (message,) = slack.state.top_level()
    body = texts(message["blocks"])
    for fact in ("gpu-7", "GPU 3, PCI 0000:3b:00.0, GPU-1234", "XID 79", "What Vigil did", "quarantining", "reboot"):
        assert fact in body
    assert message["metadata"] == {
        "event_type": "vigil_incident",
        "event_payload": {"incident_id": "gpu-7-abc-12", "severity": "quarantine"},
    }
    assert p.page(page()).startswith("already in Slack")  # a repeat posts nothing
    assert len(slack.state.messages) == 1


def test_updates_go_to_the_thread_and_resolve_edits_the_message(slack: FakeSlack, tmp_path: Path) -> None:
    p = pager(slack, tmp_path)
    p.page(page(severity=Severity.SUSPECT))
    p.page(page(severity=Severity.QUARANTINE))  # escalation: same message, a reply
    p.update(PageUpdate("gpu-7-abc-12", "gpu-7", "QUARANTINED", "Done 0.31 s after the fault: tainted, cordoned"))
    p.update(PageUpdate("gpu-7-abc-12", "gpu-7", "RESOLVED", "Resolved: gpu-7 returned by sre", resolve=True))
    (parent,) = slack.state.top_level()
    replies = [m["text"] for m in slack.state.replies(parent["ts"])]
    assert replies[0].startswith("Escalated to quarantine")
    assert replies[1:] == ["Done 0.31 s after the fault: tainted, cordoned", "Resolved: gpu-7 returned by sre"]
    assert "RESOLVED" in parent["text"] and "RESOLVED" in texts(parent["blocks"])


def test_an_update_before_its_message_waits(slack: FakeSlack, tmp_path: Path) -> None:
    p = pager(slack, tmp_path)
    with pytest.raises(NotReadyYet):
        p.update(PageUpdate("inc-9", "gpu-1", "QUARANTINED", "done"))
    assert "nothing to update" in p.update(PageUpdate("inc-9", "gpu-1", "RESOLVED", "ok", resolve=True))
    assert slack.state.messages == []


def test_rate_limit_is_retried_after_retry_after(slack: FakeSlack, tmp_path: Path) -> None:
    slack.rate_limit("chat.postMessage", times=2, retry_after=1)
    pager(slack, tmp_path).page(page())
    assert len(slack.calls("chat.postMessage")) == 3
    assert len(slack.state.messages) == 1


def test_slack_errors_are_retryable_or_permanent(slack: FakeSlack, tmp_path: Path) -> None:
    p = pager(slack, tmp_path)
    slack.error("chat.postMessage", "internal_error")
    with pytest.raises(SlackApiError):
        p.page(page())
    assert p.page(page()).startswith("posted")  # the retry (the engine's) succeeds, once
    slack.error("chat.postMessage", "channel_not_found")
    with pytest.raises(PermanentActionError, match="channel_not_found"):
        p.page(page("another-incident"))
    bad = SlackPager("xoxb-wrong", CHANNEL, Store(tmp_path / "other.db").records, base_url=slack.base_url)
    with pytest.raises(PermanentActionError, match="invalid_auth"):
        bad.page(page("third"))
    assert len(slack.state.top_level()) == 1


def test_a_lost_answer_never_posts_twice(slack: FakeSlack, tmp_path: Path) -> None:
    """Slack posted the message but the connection dropped before its answer: the retry must look first."""
    slack.drop_after_accept("chat.postMessage")
    p = pager(slack, tmp_path)
    with pytest.raises(Exception):  # noqa: B017 (urllib's connection error, whichever class)
        p.page(page())
    assert len(slack.state.messages) == 1
    assert p.page(page()).startswith("already in Slack")
    assert len(slack.state.messages) == 1
    assert len(slack.calls("conversations.history")) == 1
    # And the thread still works.
    p.update(PageUpdate("gpu-7-abc-12", "gpu-7", "QUARANTINED", "done"))
    assert len(slack.state.replies(slack.state.messages[0]["ts"])) == 1


def test_a_new_leader_learns_the_threads_from_history(slack: FakeSlack, tmp_path: Path) -> None:
    first = pager(slack, tmp_path, "leader1.db")
    for i in range(250):  # more than one page of history
        first.page(page(f"inc-{i}"))
    second = pager(slack, tmp_path, "leader2.db")  # an empty store: another replica
    assert second.resync() == 250
    assert second.page(page("inc-3")).startswith("already in Slack")
    second.update(PageUpdate("inc-3", "gpu-7", "QUARANTINED", "done"))
    assert len(slack.state.top_level()) == 250
    parent = next(m for m in slack.state.top_level() if m["metadata"]["event_payload"]["incident_id"] == "inc-3")
    assert [m["text"] for m in slack.state.replies(parent["ts"])] == ["done"]


def test_a_flood_is_one_message_with_its_count_in_the_thread(slack: FakeSlack, tmp_path: Path) -> None:
    import asyncio

    from controller.act.local_actuator import LocalActuator
    from controller.compose import node_route
    from controller.vocab.policy import Policy
    from vigil_core.signals import GpuRef, Signal, SignalKind

    async def scenario() -> None:
        now = [1000.0]
        store = Store(tmp_path / "ctl.db")
        slack_pager = SlackPager(TOKEN, CHANNEL, store.records, base_url=slack.base_url)
        e = node_route(store, Policy(), LocalActuator(store.db), slack_pager, clock=lambda: now[0], fold_report_s=60)
        e.engine.hello("gpu-7", "s", 8)
        for seq in range(1, 52):  # XID 13 (the application's fault) flooding one GPU
            sig = Signal("gpu-7", SignalKind.XID, GpuRef(3, "GPU-3"), code=13, observed_at=now[0] + seq, seq=seq)
            e.engine.receive("gpu-7", [sig])
        await e.wait_for_actions()
        assert e.folds.report() == 0  # not before fold_report_s
        now[0] += 61
        assert e.folds.report() == 1
        await e.wait_for_actions()
        (parent,) = slack.state.top_level()
        (reply,) = slack.state.replies(parent["ts"])
        assert reply["text"] == "Still happening: 51 signals folded into this incident so far"
        now[0] += 61
        assert e.folds.report() == 0  # nothing new folded since
        store.close()

    asyncio.run(scenario())


def test_a_reply_waits_for_an_uncertain_post_without_polling_history(slack: FakeSlack, tmp_path: Path) -> None:
    slack.drop_after_accept("chat.postMessage")
    p = pager(slack, tmp_path)
    with pytest.raises(Exception):  # noqa: B017 (the lost answer)
        p.page(page())
    for _ in range(3):
        with pytest.raises(NotReadyYet):
            p.update(PageUpdate("gpu-7-abc-12", "gpu-7", "QUARANTINED", "done"))
    assert slack.calls("conversations.history") == []
    assert p.page(page()).startswith("already in Slack")  # the page's retry looks, once
    p.update(PageUpdate("gpu-7-abc-12", "gpu-7", "QUARANTINED", "done"))
    assert len(slack.calls("conversations.history")) == 1
