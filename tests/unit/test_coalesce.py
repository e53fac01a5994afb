"""The writer's merging: many transactions' statements, grouped per table and run together, leave the
database exactly as the same statements one after another would."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.store.coalesce import Later, Statement, coalesced, made, table_of, upsert_key

SCHEMA = """
CREATE TABLE a (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);
CREATE TABLE b (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);
"""
# The shapes the store's hot writes take: upserts, plain inserts, updates that read their own row,
# deletes, and one that reads another table (a barrier: it may not move).
SHAPES: list[tuple[str, int]] = [
    ("INSERT INTO {t} VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", 2),
    ("INSERT INTO {t} (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", 2),  # replaces its row
    ("INSERT INTO {t} (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v + {t}.v", 2),  # does not
    ("INSERT INTO {t} VALUES (?, ?) ON CONFLICT DO NOTHING", 2),
    ("UPDATE {t} SET v = v * 2 + ? WHERE k = ?", 2),
    ("DELETE FROM {t} WHERE k = ?", 1),
    ("UPDATE {t} SET v = (SELECT COALESCE(SUM(v), 0) FROM {other}) + ? WHERE k = ?", 2),
]


@st.composite
def statements(draw: st.DrawFn) -> Statement:
    table = draw(st.sampled_from("ab"))
    shape, arity = draw(st.sampled_from(SHAPES))
    sql = shape.format(t=table, other="b" if table == "a" else "a")
    row = tuple(draw(st.integers(0, 4)) for _ in range(arity))
    if draw(st.booleans()):  # a value made when written, as the guard's windows are
        row = (*row[:-1], _later(row[-1]))
    if draw(st.booleans()):
        return (sql, row, False)
    return (
        sql,
        [row, *[tuple(draw(st.integers(0, 4)) for _ in range(arity)) for _ in range(draw(st.integers(0, 2)))]],
        True,
    )


def _later(value: int) -> Later:
    return Later(lambda: value)


def _apply(units: list[list[Statement]]) -> list[tuple[object, ...]]:
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    with db:
        for sql, args, many in (s for unit in units for s in unit):
            db.executemany(sql, [made(r) for r in args]) if many else db.execute(sql, made(args))
    return db.execute("SELECT 'a', * FROM a UNION ALL SELECT 'b', * FROM b ORDER BY 1, 2").fetchall()


def _apply_coalesced(units: list[list[Statement]]) -> list[tuple[object, ...]]:
    return _apply([coalesced(units)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(statements(), min_size=1, max_size=4), max_size=12))
def test_merged_statements_leave_the_same_tables(units: list[list[Statement]]) -> None:
    assert _apply_coalesced(units) == _apply(units)


def test_a_batch_of_received_signals_becomes_one_statement_per_table() -> None:
    signal = "INSERT INTO signals VALUES (?, ?) ON CONFLICT DO NOTHING"
    incident = "INSERT INTO incidents VALUES (?, ?)"
    node = "UPDATE nodes SET state = ? WHERE node = ?"
    units = [[(signal, (n, 1), False), (incident, (f"i{n}", n), False), (node, ("{}", n), False)] for n in range(50)]
    merged = coalesced(units)
    assert [(sql, len(rows), many) for sql, rows, many in merged] == [
        (signal, 50, True),
        (incident, 50, True),
        (node, 50, True),
    ]
    assert merged[2][1][-1] == ("{}", 49)  # each table's rows in the order they were recorded


def test_a_statement_that_reads_another_table_stays_where_it_was() -> None:
    first = ("INSERT INTO a VALUES (?, ?)", (1, 1), False)
    reads = ("UPDATE b SET v = (SELECT v FROM a WHERE k = 1) WHERE k = ?", (1,), False)
    later = ("INSERT INTO a VALUES (?, ?)", (2, 2), False)
    assert table_of(reads[0]) is None and table_of(first[0]) == "a"
    assert coalesced([[first], [reads], [later]]) == [
        ("INSERT INTO a VALUES (?, ?)", [(1, 1)], True),
        reads,
        ("INSERT INTO a VALUES (?, ?)", [(2, 2)], True),
    ]


def test_a_statement_without_parameters_is_not_merged() -> None:
    plain = ("DELETE FROM a", (), False)
    assert coalesced([[plain], [plain]]) == [plain, plain]


def test_an_upsert_that_replaces_its_row_is_known_by_its_key() -> None:
    assert (
        upsert_key("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
        == 0
    )
    assert (
        upsert_key(
            "INSERT INTO t (a, k, b) VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE SET a = excluded.a, b = excluded.b"
        )
        == 1
    )
    # Not the whole row, reads its own row, names no columns, or keeps what it finds: a later row does not make it moot.
    assert upsert_key("INSERT INTO t (k, a, b) VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE SET a = excluded.a") is None
    assert upsert_key("INSERT INTO t (k, a) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET a = excluded.a + t.a") is None
    assert upsert_key("INSERT INTO t (k, a) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET a = excluded.b") is None
    assert upsert_key("INSERT INTO t VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET a = excluded.a") is None
    assert upsert_key("INSERT INTO t (k, a) VALUES (?, ?) ON CONFLICT DO NOTHING") is None


def test_of_a_groups_writes_of_one_key_only_the_last_value_is_made() -> None:
    made_values: list[str] = []

    def window(text: str) -> Later:
        return Later(lambda: made_values.append(text) or text)

    upsert = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    units = [[(upsert, [("breaker", window(f"b{i}")), ("shared", window(f"s{i}"))], True)] for i in range(1000)]
    [(sql, rows, many)] = coalesced(units)
    assert [made(r) for r in rows] == [("breaker", "b999"), ("shared", "s999")]
    assert made_values == ["b999", "s999"]
