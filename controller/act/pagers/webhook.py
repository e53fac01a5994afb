"""A generic webhook pager: each page and update is a JSON POST, for PagerDuty-style receivers,
Alertmanager webhooks relays, or an in-house bot.

Every request carries an ``Idempotency-Key`` (incident id and action), so a receiver can drop the
repeats that retries after an ambiguous failure may cause. urllib3 retries connection errors, 429
(after ``Retry-After``) and 5xx with backoff.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import urllib3
from urllib3.util.retry import Retry

from controller.act.actuators import PermanentActionError
from controller.vocab.actions import Page, PageUpdate

_RETRY = Retry(
    total=4,
    backoff_factor=0.3,
    status_forcelist=(429, 500, 502, 503, 504),
    allowed_methods=None,
    respect_retry_after_header=True,
    raise_on_status=False,
)


def page_body(action: Page | PageUpdate) -> dict[str, Any]:
    body = {k: v.value if hasattr(v, "value") else v for k, v in asdict(action).items()}
    return {"source": "vigil", "type": "page" if isinstance(action, Page) else "update", **body}


class WebhookPager:
    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> None:
        self._url = url
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._http = urllib3.PoolManager(retries=_RETRY, timeout=urllib3.Timeout(total=timeout_s))

    def page(self, action: Page) -> str:
        return self._post(action, f"{action.incident_id}:page:{action.severity.value}")

    def update(self, action: PageUpdate) -> str:
        return self._post(action, f"{action.incident_id}:update:{action.tag}")

    def resync(self) -> int:
        return 0  # the receiver deduplicates by Idempotency-Key

    def _post(self, action: Page | PageUpdate, key: str) -> str:
        response = self._http.request(
            "POST",
            self._url,
            body=json.dumps(page_body(action)).encode(),
            headers={**self._headers, "Idempotency-Key": key},
        )
        if 200 <= response.status < 300:
            return f"posted to webhook ({response.status})"
        if response.status in (400, 401, 403, 404, 410, 422):
            raise PermanentActionError(f"webhook answered {response.status}: {response.data[:200]!r}")
        raise RuntimeError(f"webhook answered {response.status} after retries")
