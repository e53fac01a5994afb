"""Fixtures the store's contract tests share: every test that takes ``store_target`` runs once on
SQLite (a file) and once on PostgreSQL (a fresh database on a private server of Debian's
``postgresql`` package; skipped with the reason where it cannot be started)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import postgres_server, unavailable

_names = itertools.count()


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str | None]:
    if unavailable():
        yield None
        return
    with postgres_server() as dsn:
        yield dsn


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path | str]:
    if request.param == "sqlite":
        yield tmp_path / "ctl.db"
        return
    dsn = request.getfixturevalue("pg_dsn")
    if dsn is None:
        pytest.skip(unavailable() or "")
    import psycopg

    name = f"t{next(_names)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield dsn.rsplit("/", 1)[0] + f"/{name}"
