"""A free TCP port on loopback, for a server that must be told its port before it starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (it may be taken again before it is used: bind soon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
