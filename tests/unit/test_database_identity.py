"""A controller database that is damaged, foreign, newer or empty is said aloud, never replaced."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from controller.store import DatabaseRefused, Opened, Store
from controller.store.identity import SCHEMA_VERSION


def test_a_new_database_is_stamped_with_its_schema_and_cluster(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctl.db", cluster="prod-a")
    assert store.opened is Opened.NEW
    assert store.records.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert store.records.get_meta("cluster") == "prod-a"
    store.close()
    again = Store(tmp_path / "ctl.db", cluster="prod-a")
    assert again.opened is Opened.EXISTING
    again.close()


def test_a_database_of_another_cluster_is_refused_naming_both(tmp_path: Path) -> None:
    Store(tmp_path / "ctl.db", cluster="prod-a").close()
    with pytest.raises(DatabaseRefused, match="belongs to cluster 'prod-a', and this controller is cluster 'prod-b'"):
        Store(tmp_path / "ctl.db", cluster="prod-b")


def test_a_newer_schema_is_refused_by_name(tmp_path: Path) -> None:
    store = Store(tmp_path / "ctl.db")
    store.records.set_meta("schema_version", str(SCHEMA_VERSION + 1))
    store.close()
    with pytest.raises(DatabaseRefused, match=f"written by a newer Vigil \\(schema {SCHEMA_VERSION + 1}"):
        Store(tmp_path / "ctl.db")


def test_garbage_and_a_foreign_sqlite_file_are_refused_and_left_in_place(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database " * 100)
    with pytest.raises(DatabaseRefused, match="is damaged .*Vigil does not replace it"):
        Store(garbage)
    assert garbage.read_bytes() == b"this is not a database " * 100  # untouched
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE grafana_dashboards (id INTEGER)")
    with pytest.raises(DatabaseRefused, match="not a Vigil controller's \\(its tables: grafana_dashboards\\)"):
        Store(foreign)


def test_an_empty_file_is_opened_but_said(tmp_path: Path) -> None:
    (tmp_path / "ctl.db").write_bytes(b"")
    store = Store(tmp_path / "ctl.db")
    assert store.opened is Opened.EMPTY
    store.close()


def test_the_controller_command_names_a_refused_database_and_exits_2(tmp_path: Path) -> None:
    Store(tmp_path / "ctl.db", cluster="prod-a").close()
    database = str(tmp_path / "ctl.db")
    out = subprocess.run(
        [sys.executable, "-m", "vigil", "controller", "--plaintext", "--port", "0", "--database", database],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "belongs to cluster 'prod-a', and this controller is cluster 'default'" in out.stderr


def test_a_controller_on_an_empty_file_says_so_in_its_metrics(tmp_path: Path) -> None:
    from controller.config import ControllerConfig
    from controller.daemon import Controller

    (tmp_path / "ctl.db").write_bytes(b"")
    config = ControllerConfig(database=tmp_path / "ctl.db", pager="none", plaintext=True)
    controller = Controller(config)
    assert controller.engine.metrics.registry.get_sample_value("vigil_controller_database_started_empty") == 1
    controller.store.close()
    again = Controller(config)  # the same file, now a database: nothing to say
    assert again.engine.metrics.registry.get_sample_value("vigil_controller_database_started_empty") == 0
    again.store.close()


def test_an_older_database_is_brought_up_to_this_schema(tmp_path: Path) -> None:
    """A database written before schema versions and the later columns (signals.count,
    nodes.expected_gpus): opened, upgraded, stamped, its rows kept."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE signals (node TEXT NOT NULL, spool_id TEXT NOT NULL, seq INTEGER NOT NULL,"
            " kind TEXT NOT NULL, code INTEGER, gpu_index INTEGER, gpu_uuid TEXT, pci_bus_id TEXT, value REAL,"
            " message TEXT, source TEXT, observed_at REAL, received_at REAL, incident_id TEXT,"
            " PRIMARY KEY (node, spool_id, seq));"
            "INSERT INTO signals VALUES ('n1', 's', 1, 'XID', 79, 0, '', '', 0, 'old', '', 1.0, 1.0, 'i1');"
        )
    store = Store(path)
    assert store.opened is Opened.EXISTING
    assert store.records.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert store.read("SELECT node, count FROM signals") == [("n1", 1)]  # the column added, its default filled
    store.close()
