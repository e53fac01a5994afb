"""The controller and the relay collect their young generation every 50,000 new objects, not
CPython's 700 (``vigil_core.gc_young``), and the controller hands the interpreter on every 20 ms,
not CPython's 5 (``vigil_core.switch_interval``): set by each process's entry point, said in its
log, and left alone where a test runs them in its own process. A relay that never reached its
controller stops when told (it waited for the controller first)."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.processes import configured_controller, port_of, vigil
from tests.helpers import free_port, poll_until
from vigil_core.gc_young import YOUNG_OBJECTS, set_young
from vigil_core.switch_interval import INTERVAL_MS, set_interval

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_only_the_young_generations_threshold_moves_and_0_leaves_cpythons() -> None:
    gc.set_threshold(700, 10, 10)
    set_young(0)
    assert gc.get_threshold() == (700, 10, 10)
    set_young(YOUNG_OBJECTS)
    assert gc.get_threshold() == (50_000, 10, 10)


@pytest.fixture
def interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("interval")
def test_the_switch_interval_is_set_in_milliseconds_and_0_leaves_cpythons() -> None:
    sys.setswitchinterval(0.005)
    set_interval(0)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    set_interval(INTERVAL_MS)
    assert sys.getswitchinterval() == pytest.approx(0.020)


def said(log: Path, event: str) -> dict[str, Any] | None:
    """A process's first log line of ``event``, if it said one yet."""
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line.startswith("{") and (entry := json.loads(line)).get("event") == event:
            return dict(entry)
    return None


def said_threshold(log: Path) -> list[int] | None:
    """The threshold a process said it set (its ``gc_young_objects`` log line), if it said one yet."""
    entry = said(log, "gc_young_objects")
    return list(entry["threshold"]) if entry is not None else None


def test_the_controller_and_the_relay_set_it_at_their_start(tmp_path: Path) -> None:
    ctl = configured_controller(tmp_path, "ctl")
    relay = vigil(
        "relay", "--plaintext", "--controller", f"127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{free_port()}",
        "--gc-young-objects", "12345", "--log-format", "json", out=tmp_path / "relay.out",
    )  # fmt: skip
    try:
        port_of(tmp_path, "ctl")
        for log in (tmp_path / "ctl.out", tmp_path / "ctl.log"):
            if (found := said_threshold(log)) is not None:
                break
        assert found is not None and found[0] == YOUNG_OBJECTS, "the controller said no young threshold"
        intervals = [said(tmp_path / f, "switch_interval_set") for f in ("ctl.out", "ctl.log")]
        assert [i["ms"] for i in intervals if i is not None] == [INTERVAL_MS], "the controller said no interval"
        poll_until(
            lambda: any(said_threshold(tmp_path / f) for f in ("relay.out", "relay.log")), 30, what="the relay's"
        )
        relay_said = next(t for f in ("relay.out", "relay.log") if (t := said_threshold(tmp_path / f)))
        assert relay_said[0] == 12345
        relay.terminate()  # it never reached a controller: it stops when told all the same
        assert relay.wait(15) == 0
    finally:
        for proc in (ctl, relay):
            proc.terminate()
            proc.wait(30)
