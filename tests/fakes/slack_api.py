"""A Slack Web API on loopback that checks requests as Slack does, for the real ``slack-sdk``.

It keeps a channel's messages and threads, answers ``chat.postMessage``, ``chat.update`` and
``conversations.history`` with Slack's shapes, refuses what Slack refuses (bad token, unknown
channel, a reply to a missing thread, malformed Block Kit) with ``ok: false``, and injects faults:
429 with ``Retry-After``, an ``ok: false`` error, or a request that is carried out but whose answer
never arrives (the connection is closed), which is what makes naive retries post twice.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.server_thread import ServerThread

TOKEN = "xoxb-test-token"
CHANNEL = "C0VIGIL"
_BLOCK_TYPES = {"header", "section", "context", "divider", "actions", "rich_text"}


@dataclass
class _Fault:
    method: str
    kind: str  # ratelimit, error, drop
    times: int
    value: str = ""


@dataclass
class SlackState:
    messages: list[dict[str, Any]] = field(default_factory=list)  # every message, replies included
    calls: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)  # method, args, received at
    faults: list[_Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: float = 1_800_000_000.0

    def top_level(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if "thread_ts" not in m or m["thread_ts"] == m["ts"]]

    def replies(self, ts: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("thread_ts") == ts and m["ts"] != ts]


def _check_blocks(blocks: Any) -> str | None:
    if blocks is None:
        return None
    if isinstance(blocks, str):
        blocks = json.loads(blocks)
    if not isinstance(blocks, list) or len(blocks) > 50:
        return "invalid_blocks"
    for b in blocks:
        if not isinstance(b, dict) or b.get("type") not in _BLOCK_TYPES:
            return "invalid_blocks"
        if b["type"] == "header" and len(b.get("text", {}).get("text", "")) > 150:
            return "invalid_blocks"
        if b["type"] == "section":
            if "text" not in b and "fields" not in b:
                return "invalid_blocks"
            if len(b.get("text", {}).get("text", "")) > 3000 or len(b.get("fields", [])) > 10:
                return "invalid_blocks"
    return None


class FakeSlack(ServerThread):
    what = "Slack emulator"

    def __init__(self) -> None:
        super().__init__()
        self.state = SlackState()
        self.base_url = ""

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/api/"
        try:
            yield
        finally:
            await runner.cleanup()

    # Faults and assertions -------------------------------------------------------------------

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        with self.state.lock:
            self.state.faults.append(_Fault(method, "ratelimit", times, str(retry_after)))

    def error(self, method: str, error: str, times: int = 1) -> None:
        with self.state.lock:
            self.state.faults.append(_Fault(method, "error", times, error))

    def drop_after_accept(self, method: str, times: int = 1) -> None:
        with self.state.lock:
            self.state.faults.append(_Fault(method, "drop", times))

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self.state.lock:
            return [args for m, args, _ in self.state.calls if m == method]

    def timed_calls(self, method: str) -> list[tuple[dict[str, Any], float]]:
        with self.state.lock:
            return [(args, at) for m, args, at in self.state.calls if m == method]

    # The API -----------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                args.update(await request.json())
            else:
                args.update(dict(await request.post()))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}" and args.get("token") != TOKEN:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        with self.state.lock:
            self.state.calls.append((method, args, time.time()))
            fault = next((f for f in self.state.faults if f.method == method and f.times > 0), None)
            if fault is not None:
                fault.times -= 1
        if fault is not None and fault.kind == "ratelimit":
            return web.json_response(
                {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": fault.value}
            )
        if fault is not None and fault.kind == "error":
            return web.json_response({"ok": False, "error": fault.value})
        with self.state.lock:
            answer = self._answer(method, args)
        if fault is not None and fault.kind == "drop":  # carried out, but the answer is lost
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("dropped on purpose")
        return web.json_response(answer)

    def _answer(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        s = self.state
        if method == "auth.test":
            return {"ok": True, "user_id": "U0VIGIL", "team": "test"}
        if args.get("channel") != CHANNEL:
            return {"ok": False, "error": "channel_not_found"}
        if method == "chat.postMessage":
            if not args.get("text") and not args.get("blocks"):
                return {"ok": False, "error": "no_text"}
            if (problem := _check_blocks(args.get("blocks"))) is not None:
                return {"ok": False, "error": problem}
            thread = args.get("thread_ts")
            if thread and not any(m["ts"] == thread for m in s.messages):
                return {"ok": False, "error": "thread_not_found"}
            s.clock += 1
            message = {"type": "message", "ts": f"{s.clock:.6f}", "text": args.get("text", "")}
            for key in ("blocks", "metadata"):
                if args.get(key):
                    message[key] = json.loads(args[key]) if isinstance(args[key], str) else args[key]
            if thread:
                message["thread_ts"] = thread
                parent = next(m for m in s.messages if m["ts"] == thread)
                parent["thread_ts"] = thread
                parent["reply_count"] = parent.get("reply_count", 0) + 1
            s.messages.append(message)
            return {"ok": True, "channel": CHANNEL, "ts": message["ts"], "message": message}
        if method == "chat.update":
            target = next((m for m in s.messages if m["ts"] == args.get("ts")), None)
            if target is None:
                return {"ok": False, "error": "message_not_found"}
            if (problem := _check_blocks(args.get("blocks"))) is not None:
                return {"ok": False, "error": problem}
            for key in ("text", "blocks", "metadata"):
                if args.get(key):
                    target[key] = json.loads(args[key]) if key != "text" and isinstance(args[key], str) else args[key]
            return {"ok": True, "channel": CHANNEL, "ts": target["ts"], "text": target["text"]}
        if method == "conversations.history":
            with_meta = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
            oldest = float(args.get("oldest", 0) or 0)
            limit = int(args.get("limit", 100))
            start = int(args.get("cursor") or 0)
            top = [m for m in reversed(s.top_level()) if float(m["ts"]) > oldest]
            page = top[start : start + limit]
            shown = [m if with_meta else {k: v for k, v in m.items() if k != "metadata"} for m in page]
            more = start + limit < len(top)
            return {
                "ok": True,
                "messages": shown,
                "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""},
            }
        return {"ok": False, "error": "unknown_method"}
