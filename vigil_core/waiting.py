"""Waiting on an asyncio event with a time limit, the way every loop in Vigil sleeps; and how long to
wait before trying a lost connection again."""

from __future__ import annotations

import asyncio
import contextlib
import random


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True when the event was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
    return event.is_set()


async def wait_either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Until either event is set."""
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


def backoff_delay(attempt: int, base: float = 0.2, cap: float = 10.0, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff (AWS architecture blog): uniform in [0, min(cap, base·2^n)]."""
    return (rng or random).uniform(0, min(cap, base * 2**attempt))
