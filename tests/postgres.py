"""A private PostgreSQL server for the store's tests (Debian's ``postgresql`` package; not a double).

``initdb`` makes a cluster in a temporary directory and ``pg_ctl`` starts it on a free loopback
port, trusting local connections; the server runs as the ``postgres`` user when the tests run as
root (PostgreSQL refuses to run as root), else as the current user. ``unavailable()`` says why it
cannot be had here, so tests skip with that reason (``.ci/run`` installs the package).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import free_port

BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def _tool(name: str) -> str | None:
    for d in BIN_DIRS:
        if (d / name).exists():
            return str(d / name)
    return shutil.which(name)


def unavailable() -> str | None:
    """Why a PostgreSQL server cannot be started here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "needs psycopg (pip install 'vigil-gpu[postgres]'; make test installs it)"
    if _tool("initdb") is None or _tool("pg_ctl") is None:
        return "needs Debian's postgresql package (apt-get install postgresql; .ci/run installs it)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root needs runuser to start PostgreSQL as another user"
    return None


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@dataclass
class PostgresServer:
    """A running private server: its DSN, and a stop and start of the same cluster (an outage)."""

    dsn: str
    _ctl: list[str]

    def stop(self) -> None:
        subprocess.run(_as_server_user([*self._ctl, "-m", "immediate", "-w", "stop"]), check=True, capture_output=True)

    def start(self) -> None:
        subprocess.run(_as_server_user([*self._ctl, "-w", "start"]), check=True, capture_output=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    """A fresh server; yields the DSN of its empty ``vigil`` database."""
    with postgres_cluster() as server:
        yield server.dsn


@contextmanager
def postgres_cluster(fsync: bool = False) -> Iterator[PostgresServer]:
    """A fresh server, as a handle that can stop and start it again (``fsync``: durable commits, as a
    production server makes them; the tests run without, for speed)."""
    initdb, pg_ctl = _tool("initdb"), _tool("pg_ctl")
    assert initdb and pg_ctl, unavailable()
    root = Path(tempfile.mkdtemp(prefix="vigil-pg-"))
    data, port = root / "data", free_port()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    run = lambda *cmd: subprocess.run(_as_server_user(list(cmd)), check=True, capture_output=True, text=True)  # noqa: E731
    try:
        run(initdb, "-D", str(data), "-U", "vigil", "--auth=trust", "--no-sync", "-E", "UTF8")
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}"
        ctl = [pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "server.log")]
        run(*ctl, "-w", "start")
        try:
            run(_tool("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "vigil", "vigil")
            yield PostgresServer(f"postgresql://vigil@127.0.0.1:{port}/vigil", ctl)
        finally:
            subprocess.run(
                _as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]), capture_output=True
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
