"""The webhook pager against a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controller.act.actuators import PermanentActionError
from controller.act.pagers.webhook import WebhookPager
from controller.vocab.actions import Page, PageUpdate
from controller.vocab.policy import Severity


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.answers: list[int] = []  # statuses to give first, then 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append((dict(self.headers), body))
        status = self.server.answers.pop(0) if self.server.answers else 200
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


PAGE = Page("inc-1", "gpu-1", Severity.QUARANTINE, "XID 79", "reboot", 1.0, "GPU 3", "quarantining")


def test_pages_and_updates_are_json_posts_with_idempotency_keys(receiver: Receiver) -> None:
    hook = WebhookPager(receiver.url, headers={"Authorization": "Bearer s3cret"})
    hook.page(PAGE)
    hook.update(PageUpdate("inc-1", "gpu-1", "RESOLVED", "back in service", resolve=True))
    (h1, b1), (h2, b2) = receiver.received
    assert b1["type"] == "page" and b1["incident_id"] == "inc-1" and b1["severity"] == "quarantine"
    assert b1["gpu"] == "GPU 3" and b1["did"] == "quarantining" and b1["source"] == "vigil"
    assert h1["Idempotency-Key"] == "inc-1:page:quarantine" and h1["Authorization"] == "Bearer s3cret"
    assert b2["type"] == "update" and b2["resolve"] is True and h2["Idempotency-Key"] == "inc-1:update:RESOLVED"


def test_transient_failures_are_retried_and_bad_requests_are_permanent(receiver: Receiver) -> None:
    hook = WebhookPager(receiver.url)
    receiver.answers = [503, 429]
    assert "200" in hook.page(PAGE)
    assert len(receiver.received) == 3
    assert len({h["Idempotency-Key"] for h, _ in receiver.received}) == 1  # the same key each time
    receiver.answers = [404]
    with pytest.raises(PermanentActionError, match="404"):
        hook.page(PAGE)
