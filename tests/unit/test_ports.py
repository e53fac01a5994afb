"""Blocks of ports held by one process (``vigil_core.ports.port_block``, ``reserved_port``): below the
kernel's ephemeral range, free when taken, and never a port another process holds."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vigil_core import ports
from vigil_core.ports import ephemeral_range, port_block, reserved_port


def test_blocks_held_at_once_are_apart_below_the_ephemeral_range_and_free() -> None:
    low, _ = ephemeral_range()
    with port_block(16) as a, port_block(16) as b:
        assert a != b and abs(a - b) >= 16
        for start in (a, b):
            assert start >= 10_000 and start + 16 <= low
            for port in range(start, start + 16):
                with socket.socket() as s:
                    s.bind(("", port))  # free: nothing listens there


@pytest.fixture
def region(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[int]:
    """The first of 64 ports that no other process on this machine takes while the test runs (held
    through the machine's own lock files), with this test's ``port_block`` calls kept in a lock
    directory of their own: other tests running beside this one reserve ports too, anywhere below
    the ephemeral range, and must not be what a test here meets."""
    with port_block(64) as start:
        monkeypatch.setattr(ports, "BLOCKS_DIR", tmp_path / "locks")
        yield start


def test_a_block_another_process_holds_is_not_taken(region: int) -> None:
    # Another process holds every block of 4 in the region but one, as a run beside this one would.
    starts = list(range(region, region + 40, 4))
    free = starts[len(starts) // 2]
    holder = (
        "import fcntl, sys, pathlib\n"
        f"d = pathlib.Path({str(ports.BLOCKS_DIR)!r}); d.mkdir(exist_ok=True)\n"
        f"held = [open(d / f'{{p}}.lock', 'w') for s in {starts!r} if s != {free} for p in range(s, s + 4)]\n"
        "[fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB) for f in held]\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    other = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        with port_block(4, first=region, end=region + 40) as start:
            assert start == free
    finally:
        other.communicate("", timeout=30)


def test_a_port_of_a_block_held_is_not_given_again_whatever_the_size_asked(region: int) -> None:
    end = region + 64  # one block of 64 fits there: every single port there is one of its
    with port_block(64, first=region, end=end) as start:
        assert start == region
        with pytest.raises(OSError, match="no 1 consecutive free ports"), port_block(1, first=region, end=end):
            pass
    low, _ = ephemeral_range()
    assert reserved_port() < low
