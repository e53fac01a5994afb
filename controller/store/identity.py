"""What the database file is, before the controller trusts it: damage said aloud, never replaced.

- missing: a new database (said once, at info);
- a file of 0 bytes where a database was (truncated, or a volume that came back empty): the
  controller starts on it, but says so loudly (a warning and the ``database_started_empty`` gauge),
  since every incident, count and held action it had is gone;
- not SQLite, or SQLite that fails its ``quick_check``: refused, named, with the remedy;
- SQLite that is not a Vigil controller's (no ``meta`` table among other tables): refused;
- a Vigil database of a newer schema than this controller knows: refused by name (an older
  controller never writes a newer database); an older schema is brought up to this one;
- a Vigil database of another cluster (``cluster_name``): refused, naming both.
"""

from __future__ import annotations

import sqlite3
from enum import Enum
from pathlib import Path

from controller.store.database import Database, SqliteDatabase
from controller.store.postgres import PostgresDatabase, is_postgres

SCHEMA_VERSION = 1  # bumped with each change an older controller could not read; migrations in Store


class Opened(Enum):
    NEW = "new"
    EMPTY = "empty"  # a file was there, with nothing in it
    EXISTING = "existing"


class DatabaseRefused(ValueError):
    """A database this controller must not use; the message names the file, why, and what to do."""


def open_database(target: Path | str) -> tuple[Database, Opened]:
    """The database a file path or a ``postgresql://`` DSN names, and what it was before."""
    if isinstance(target, str) and is_postgres(target):
        db: Database = PostgresDatabase(target)
        return db, Opened.EXISTING if db.tables() else Opened.NEW
    path = Path(target)
    opened = Opened.NEW if not path.exists() else Opened.EMPTY if path.stat().st_size == 0 else Opened.EXISTING
    try:
        db = SqliteDatabase(path)
        problems = db.check()
    except sqlite3.DatabaseError as exc:
        raise DatabaseRefused(_damaged(path, str(exc))) from None
    if problems:
        db.close()
        raise DatabaseRefused(_damaged(path, "; ".join(problems)[:500]))
    return db, opened


def check_identity(db: Database, cluster: str) -> None:
    """Refuse a database that is not this cluster's Vigil database of a schema this controller knows."""
    path = db.where
    tables = db.tables()
    if tables and "meta" not in tables:
        raise DatabaseRefused(
            f"{path} is a database but not a Vigil controller's (its tables: {', '.join(sorted(tables)[:8])}): "
            "point --database at the controller's own file"
        )
    if "meta" not in tables:
        return
    meta = dict(db.read("SELECT key, value FROM meta WHERE key IN ('schema_version', 'cluster')"))
    version = int(meta.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        raise DatabaseRefused(
            f"{path} was written by a newer Vigil (schema {version}; this controller knows up to {SCHEMA_VERSION}): "
            "run the newer controller, or restore a backup taken before the upgrade"
        )
    if (theirs := meta.get("cluster")) is not None and theirs != cluster:
        raise DatabaseRefused(
            f"{path} belongs to cluster {theirs!r}, and this controller is cluster {cluster!r} (cluster_name): "
            "point --database at this cluster's own file, or set cluster_name if this is the same cluster renamed"
        )


def stamp(db: Database, cluster: str) -> None:
    """Record the schema this database is now at and the cluster it belongs to."""
    with db.tx() as c:
        c.execute(
            "INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
        c.execute("INSERT INTO meta VALUES ('cluster', ?) ON CONFLICT DO NOTHING", (cluster,))


def _damaged(path: Path | str, detail: str) -> str:
    return (
        f"{path} is damaged ({detail}). Vigil does not replace it: move it aside to start with an empty history, "
        "or restore it from a backup"
    )
