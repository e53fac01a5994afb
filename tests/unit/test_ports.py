"""Blocks of ports held by one process (``vigil_core.ports.port_block``, ``reserved_port``): below the
kernel's ephemeral range, free when taken, and never a port another process holds."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from vigil_core.ports import BLOCKS_DIR, ephemeral_range, port_block, reserved_port


def test_blocks_held_at_once_are_apart_below_the_ephemeral_range_and_free() -> None:
    low, _ = ephemeral_range()
    with port_block(16) as a, port_block(16) as b:
        assert a != b and abs(a - b) >= 16
        for start in (a, b):
            assert start >= 10_000 and start + 16 <= low
            for port in range(start, start + 16):
                with socket.socket() as s:
                    s.bind(("", port))  # free: nothing listens there


def test_a_block_another_process_holds_is_not_taken() -> None:
    # Another process holds every block of 4 but one of the last ten, as a run beside this one would.
    low, _ = ephemeral_range()
    first = low - 40
    starts = list(range(first, low - 4 + 1, 4))
    free = starts[len(starts) // 2]
    holder = (
        "import fcntl, sys, pathlib\n"
        f"d = pathlib.Path({str(BLOCKS_DIR)!r}); d.mkdir(exist_ok=True)\n"
        f"held = [open(d / f'{{p}}.lock', 'w') for s in {starts!r} if s != {free} for p in range(s, s + 4)]\n"
        "[fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB) for f in held]\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    other = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        with port_block(4, first=first) as start:
            assert start == free
    finally:
        other.communicate("", timeout=30)


def test_a_port_of_a_block_held_is_not_given_again_whatever_the_size_asked() -> None:
    low, _ = ephemeral_range()
    first = low - 64  # one block of 64 fits there: every single port there is one of its
    with port_block(64, first=first) as start:
        assert start == first
        with pytest.raises(OSError, match="no 1 consecutive free ports"), port_block(1, first=first):
            pass
    assert reserved_port() < low
