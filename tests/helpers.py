"""Shared helpers for the contract and end-to-end tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.config import ControllerConfig
from controller.daemon import Controller
from vigil_core.ports import reserved_port


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def poll_until(condition: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def start_controller(db: Path, port: int = 0, **config: Any) -> Controller:
    cfg = ControllerConfig(listen="127.0.0.1", port=port, database=db, pager="none", plaintext=True, **config)
    controller = Controller(cfg)
    await controller.start()
    return controller


async def stop_controller(controller: Controller) -> None:
    assert controller.server is not None
    if controller.urgent_server is not None:
        await controller.urgent_server.stop(0)
    await controller.server.stop(0)
    await controller.engine.wait_for_actions()
    await controller.engine.shutdown()  # the actuator lets go too (a Kubernetes node watch's thread)
    controller.store.close()


def free_port() -> int:
    """A port for a test's server to be told before it starts, or one that must stay unanswered:
    reserved for this process below the kernel's ephemeral range (``vigil_core.ports.reserved_port``).
    One the kernel picked (a bind to port 0) could be any process's a moment later,
    parallel tests' outgoing connections among them: a training run's rendezvous port, a sweep
    pair's, a port "nothing listens on"."""
    return reserved_port()
