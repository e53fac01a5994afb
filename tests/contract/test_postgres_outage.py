"""The PostgreSQL backend when its server goes away (a real server, Debian's ``postgresql`` package,
started privately; skipped with the reason where it cannot be).

The store runs on the controller's event loop: a caller waiting for a pooled connection holds the
loop, so that wait must end soon after the server is seen away, not after the pool's timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.postgres import PostgresServer, postgres_cluster, unavailable

pytestmark = pytest.mark.skipif(bool(why := unavailable()), reason=why or "")


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    with postgres_cluster() as s:
        yield s


def test_a_wait_for_a_connection_begun_before_an_outage_ends_soon_after_it(server: PostgresServer) -> None:
    """One connection, held by a long query; a read waits for it while the server answers (the pool
    is busy, so it may wait its whole timeout, 60 s here). The server stops: the query fails, and
    the waiting read gives up within a slice of the outage, not at the end of its 60 s."""
    from controller.store.postgres import PostgresDatabase

    db = PostgresDatabase(server.dsn, pool_size=1, timeout_s=60.0, away_wait_s=0.2)
    outcomes: dict[str, BaseException | None] = {}

    def run(name: str, sql: str) -> None:
        try:
            db.read(sql)
            outcomes[name] = None
        except BaseException as exc:  # noqa: BLE001 - the test reads what each caller got
            outcomes[name] = exc

    holder = threading.Thread(target=run, args=("holder", "SELECT pg_sleep(120)"))
    holder.start()
    time.sleep(0.5)  # the holder has the pool's one connection
    waiter = threading.Thread(target=run, args=("waiter", "SELECT 1"))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive(), outcomes  # waiting for the busy pool, as it may while the server answers
    try:
        server.stop()
        stopped = time.monotonic()
        waiter.join(timeout=30)
        ended_after = time.monotonic() - stopped
        holder.join(timeout=30)
        assert not waiter.is_alive(), "the read still waits for a connection 30 s after the server stopped"
        assert outcomes["holder"] is not None and outcomes["waiter"] is not None, outcomes
        assert ended_after < 30
        assert "PoolTimeout" in type(outcomes["waiter"]).__name__, outcomes
        # Back: the next caller reads again (after the pool's reconnection).
        server.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert db.read("SELECT 2") == [(2,)]
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        db.close()
