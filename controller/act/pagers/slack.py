"""The Slack pager (slack-sdk WebClient): one message per incident, later words in its thread.

- The first page of an incident posts a Block Kit message (node, GPU, signal, what Vigil did, what
  the person should do) carrying the incident id as message metadata; its ``ts`` is kept in the
  incident store. An escalation, the quarantine's completion and the resolution are replies in
  that thread; the parent message is edited to show the current state.
- 429 is retried by the SDK after ``Retry-After`` (the request was not processed). A network error
  or a 5xx is ambiguous (the message may have been posted), so before posting again the pager looks
  for the incident's metadata in the channel's recent history: a message is never posted twice.
- A new leader learns the incidents already paged from the same history (``resync``).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import structlog
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from controller.act.actuators import NotReadyYet, PermanentActionError
from controller.vocab.actions import Page, PageUpdate

log = structlog.get_logger(__name__)

EVENT_TYPE = "vigil_incident"
# Slack errors that no retry can fix: the configuration is wrong.
_PERMANENT = {
    "channel_not_found",
    "not_in_channel",
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "missing_scope",
    "is_archived",
    "invalid_blocks",
    "msg_too_long",
}
_HISTORY_WINDOW_S = 7 * 24 * 3600.0


class ThreadMemory(Protocol):
    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...


def page_blocks(page: Page, state: str) -> list[dict[str, Any]]:
    """The incident's message. ``state`` heads it: the severity, or RESOLVED."""
    where = f"*Node*\n`{page.node}`" if page.node else "*Scope*\nthe cluster"
    fields = [
        where,
        f"*GPU*\n{page.gpu or '-'}",
        f"*Severity*\n{page.severity.value}",
        f"*Incident*\n`{page.incident_id}`",
    ]
    return [
        {"type": "header", "text": {"type": "plain_text", "text": f"Vigil {state}: {page.node or 'cluster'}"[:150]}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Signal*\n{page.summary}"[:3000]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*What Vigil did*\n{page.did or '-'}"[:3000]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*What to do*\n{page.remedy or 'investigate'}"[:3000]}},
    ]


def page_text(page: Page, state: str) -> str:
    """The plain-text fallback (notifications, screen readers)."""
    return f"Vigil {state} on {page.node or 'the cluster'}: {page.summary}"[:3000]


class SlackPager:
    def __init__(
        self,
        token: str,
        channel: str,
        memory: ThreadMemory,
        base_url: str = WebClient.BASE_URL,
        timeout_s: float = 10.0,
        max_rate_limit_retries: int = 5,
    ) -> None:
        self._client = WebClient(
            token=token,
            base_url=base_url,
            timeout=int(timeout_s),
            retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=max_rate_limit_retries)],
        )
        self._channel = channel
        self._memory = memory

    # Pager ------------------------------------------------------------------------------------

    def page(self, action: Page) -> str:
        severity = action.severity.value
        metadata = {
            "event_type": EVENT_TYPE,
            "event_payload": {"incident_id": action.incident_id, "severity": severity},
        }
        known = self._thread_of(action.incident_id)
        if known is not None and known[1] == severity:
            return f"already in Slack (ts {known[0]})"  # a repeated attempt, or a new leader's replay
        if known is not None:  # an escalation of an incident already in Slack
            parent = known[0]
            self._call(
                "chat_update",
                channel=self._channel,
                ts=parent,
                metadata=metadata,
                text=page_text(action, severity.upper()),
                blocks=page_blocks(action, severity.upper()),
            )
            self._reply(parent, f"Escalated to {severity}: {action.summary}\n{action.did}")
            self._remember(action.incident_id, parent, severity)
            return f"escalated in Slack thread {parent}"
        self._memory.set_meta(_key(action.incident_id), "posting")  # if no answer comes, look before re-posting
        reply = self._call(
            "chat_postMessage",
            channel=self._channel,
            text=page_text(action, severity.upper()),
            blocks=page_blocks(action, severity.upper()),
            metadata=metadata,
            unfurl_links=False,
        )
        ts = str(reply["ts"])
        self._remember(action.incident_id, ts, severity)
        return f"posted to Slack {self._channel} (ts {ts})"

    def update(self, action: PageUpdate) -> str:
        if self._memory.get_meta(_key(action.incident_id)) == "posting":
            # The page's own retry settles whether it landed (it looks in the history); a reply
            # waiting here must not poll the history, a rate-limited call, while it does.
            raise NotReadyYet("the incident's Slack message is being posted")
        known = self._thread_of(action.incident_id)
        if known is None:
            if action.resolve:
                return "no Slack message for this incident: nothing to update"
            raise NotReadyYet("the incident's Slack message is not posted yet")
        parent = known[0]
        self._reply(parent, action.text)
        if action.resolve:
            self._call(
                "chat_update",
                channel=self._channel,
                ts=parent,
                text=f"Vigil RESOLVED: {action.node}: {action.text}"[:3000],
                blocks=[
                    {
                        "type": "section",
                        "text": {
                            "type": "mrkdwn",
                            "text": f":white_check_mark: *RESOLVED* `{action.incident_id}` on `{action.node}`\n"
                            f"{action.text}"[:3000],
                        },
                    }
                ],
            )
        return f"replied in Slack thread {parent}"

    def resync(self) -> int:
        found = self._history()
        for incident, (ts, severity) in found.items():
            self._remember(incident, ts, severity)
        return len(found)

    # Internals ----------------------------------------------------------------------------------

    def _remember(self, incident_id: str, ts: str, severity: str) -> None:
        self._memory.set_meta(_key(incident_id), f"{ts} {severity}")

    def _thread_of(self, incident_id: str) -> tuple[str, str] | None:
        """(ts, severity posted) of the incident's message, or None if it has none."""
        value = self._memory.get_meta(_key(incident_id))
        if value == "posting":
            # An earlier attempt got no answer (network error, 5xx, a restart): it may have posted.
            found = self._history().get(incident_id)
            if found is None:
                return None
            log.info("slack_post_found_after_error", incident=incident_id, ts=found[0])
            self._remember(incident_id, *found)
            return found
        if not value:
            return None
        ts, _, severity = value.partition(" ")
        return ts, severity

    def _reply(self, parent: str, text: str) -> None:
        self._call("chat_postMessage", channel=self._channel, thread_ts=parent, text=text[:3000])

    def _history(self) -> dict[str, tuple[str, str]]:
        """incident id -> (ts, severity) of Vigil's messages in the channel's recent history."""
        found: dict[str, tuple[str, str]] = {}
        cursor = None
        while True:
            reply = self._call(
                "conversations_history",
                channel=self._channel,
                limit=200,
                cursor=cursor,
                include_all_metadata=True,
                oldest=str(time.time() - _HISTORY_WINDOW_S),
            )
            for message in reply.get("messages", []):
                meta = message.get("metadata") or {}
                payload = meta.get("event_payload") or {}
                incident = payload.get("incident_id")
                top_level = message.get("thread_ts", message["ts"]) == message["ts"]
                if meta.get("event_type") == EVENT_TYPE and incident and top_level:
                    found.setdefault(str(incident), (str(message["ts"]), str(payload.get("severity", ""))))
            cursor = (reply.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return found

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(**{k: v for k, v in kwargs.items() if v is not None})
        except SlackApiError as exc:
            error = str(exc.response.get("error", ""))
            if error in _PERMANENT:
                raise PermanentActionError(f"Slack {method}: {error}") from None
            raise


def _key(incident_id: str) -> str:
    return f"slack_ts:{incident_id}"
