"""Group commit: many transactions made durable by one flush, off the event loop.

The hot writes (a received batch, an agent's Hello, an action's outcome) commit at once without
waiting for the disk (``Database.tx(durable=False)``: still safe from a crash of the controller,
not yet from one of the machine). Whoever must not go on before they are on disk (an agent's ack:
the agent drops what was acknowledged) awaits ``durable()``: one flush in a thread of its own
(SQLite: fdatasync of the write-ahead log; PostgreSQL: one commit that waits for the WAL) covers
every commit made before it, however many. While a flush runs, the commits that come in wait for
the next, so under load each flush carries a group, and at rest a lone write waits one flush as
before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from controller.store.database import Database

log = structlog.get_logger(__name__)


class GroupCommit:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._synced = 0  # lazy commits known to be on disk
        self._flush: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="group-commit")
        self._waiting: set[asyncio.Task[None]] = set()
        self._requested = False
        self.flushes = 0

    @property
    def pending(self) -> int:
        """Commits made and not yet known to be on disk."""
        return self._db.lazy_commits - self._synced

    @property
    def made(self) -> int:
        """Commits made so far: what ``durable(upto)`` counts."""
        return self._db.lazy_commits

    async def durable(self, upto: int | None = None) -> None:
        """Return once every commit made before the call (``upto``: the first that many, ``made``
        then) is on disk; raises the database's error. Nothing to wait for: no flush at all."""
        target = self._db.lazy_commits if upto is None else upto
        while self._synced < target:
            await asyncio.shield(self._start())

    def soon(self) -> None:
        """Flush without anyone waiting (what the controller found itself, the guard's state). Outside
        an event loop (a command, a test), at once."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._db.sync()
            self._synced = self._db.lazy_commits
            return
        self._requested = True  # a flush under way may have begun before this: another follows it
        self._start().add_done_callback(_said)

    def then(self, say: Callable[[], object]) -> None:
        """Call ``say`` (an ack) once every commit made so far is on disk; not at all if it fails."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.soon()
            say()
            return
        task = asyncio.get_running_loop().create_task(self._then(say))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _then(self, say: Callable[[], object]) -> None:
        try:
            await self.durable()
        except Exception as exc:  # the database failed: the agent keeps its spool and is asked again
            log.warning("ack_not_durable", error=repr(exc)[:300])
            return
        say()

    def _start(self) -> asyncio.Task[None]:
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._run())
        return self._flush

    async def _run(self) -> None:
        self._requested = False
        target = self._db.lazy_commits
        if target > self._synced:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._db.sync)
            self._synced = max(self._synced, target)
            self.flushes += 1
        if self._requested or self._db.lazy_commits > self._synced:
            # Written, or asked for, while this flush ran: the next flush starts once this one is done
            # (its waiters are answered first: they wait for this task, not for the load to stop).
            asyncio.get_running_loop().call_soon(self.soon)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _said(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("group_commit_failed", error=repr(exc)[:300])  # the store's health says it too
