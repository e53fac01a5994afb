"""Free TCP ports on this machine, for servers that must be told their port before they start."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

# A lock file per port held (``port_block``); a directory per user, so another user's (made with
# their umask) never refuses this one's locks: on a shared machine users' runs are kept apart by
# the bind check alone, as before the locks.
BLOCKS_DIR = Path(tempfile.gettempdir()) / f"vigil-port-blocks-{os.getuid()}"


class NoFreePorts(OSError):
    """No block of ports of the size asked is free below the ephemeral range."""


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for a bind to port 0 and to outgoing connections (Linux's
    ``ip_local_port_range``; its default where that cannot be read)."""
    try:
        low, high = (int(p) for p in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def port_block(size: int, first: int = 10_000, end: int | None = None) -> Iterator[int]:
    """The first of ``size`` consecutive ports, none listened on now, held for this process until the
    block is left: below the kernel's ephemeral range (a bind to port 0 and every outgoing connection
    on the machine take from that range, so a port picked there may be anyone's a moment later), and
    each port held by one process at a time (a lock file each: runs side by side take different
    ports). For servers told their ports before they bind them, as a sweep's pairs are from
    ``pair_port_base``. Between ``first`` and ``end`` (not included; the ephemeral range's start by
    default, and never past it)."""
    low, _ = ephemeral_range()
    end = low if end is None else min(end, low)
    starts = list(range(first, end - size + 1, size))
    random.shuffle(starts)
    BLOCKS_DIR.mkdir(exist_ok=True)
    for start in starts:
        with contextlib.ExitStack() as held:
            if all(_hold(held, port) and _bindable(port) for port in range(start, start + size)):
                yield start
                return
    raise NoFreePorts(f"no {size} consecutive free ports between {first} and {end}")


def _hold(held: contextlib.ExitStack, port: int) -> bool:
    """Whether this process now holds ``port``'s lock (kept until ``held`` closes); False: another does."""
    lock = held.enter_context(open(BLOCKS_DIR / f"{port}.lock", "w"))  # noqa: SIM115 (closed with held)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


_reserved = contextlib.ExitStack()  # the ports reserved by this process, held until it exits


def reserved_port() -> int:
    """A port nothing listens on now, below the kernel's ephemeral range, that no caller of
    ``port_block`` or of this (in any process) is given while this process lives: for a port a server
    is told before it binds it (one the kernel picks may be anyone's a moment later), or one that must
    stay unanswered."""
    return _reserved.enter_context(port_block(1))
