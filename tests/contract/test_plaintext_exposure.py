"""Plaintext gRPC has no identities: it stays on loopback unless told otherwise, and says so when it
does not (a warning at start, a metric); /metrics and /readyz follow the gRPC address by default."""

from __future__ import annotations

import asyncio
from pathlib import Path

from structlog.testing import capture_logs

from agent.config import AgentConfig
from controller.config import ControllerConfig
from controller.daemon import Controller
from tests.helpers import stop_controller


def test_plaintext_listens_on_loopback_by_default_and_tls_on_every_address(tmp_path: Path) -> None:
    plain = ControllerConfig(database=tmp_path / "c.db", plaintext=True)
    assert (plain.listen_address, plain.metrics_bind) == ("127.0.0.1", "127.0.0.1")
    told = ControllerConfig(database=tmp_path / "c.db", plaintext=True, listen="0.0.0.0", metrics_address="127.0.0.2")
    assert (told.listen_address, told.metrics_bind) == ("0.0.0.0", "127.0.0.2")
    tls = ControllerConfig(database=tmp_path / "c.db", tls_dir=tmp_path)
    assert tls.listen_address == "0.0.0.0"
    assert AgentConfig(node="n1", plaintext=True, spool=tmp_path / "s.db").metrics_bind == "127.0.0.1"


def test_plaintext_on_a_network_address_is_warned_about_and_exported(tmp_path: Path) -> None:
    async def start(listen: str) -> tuple[float, list[str]]:
        cfg = ControllerConfig(listen=listen, port=0, database=tmp_path / f"{listen}.db", pager="none", plaintext=True)
        controller = Controller(cfg)
        with capture_logs() as logs:
            await controller.start()
        exposed = controller.engine.metrics.plaintext_exposed._value.get()
        await stop_controller(controller)
        return exposed, [e["event"] for e in logs]

    exposed, events = asyncio.run(start("0.0.0.0"))
    assert exposed == 1 and "plaintext_on_a_network_address" in events
    exposed, events = asyncio.run(start("127.0.0.1"))
    assert exposed == 0 and "plaintext_on_a_network_address" not in events
