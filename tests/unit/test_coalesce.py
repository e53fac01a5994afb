"""The writer's merging: many transactions' statements, grouped per table and run together, leave the
database exactly as the same statements one after another would."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.store.coalesce import Statement, coalesced, table_of

SCHEMA = """
CREATE TABLE a (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);
CREATE TABLE b (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);
"""
# The shapes the store's hot writes take: upserts, plain inserts, updates that read their own row,
# deletes, and one that reads another table (a barrier: it may not move).
SHAPES: list[tuple[str, int]] = [
    ("INSERT INTO {t} VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", 2),
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
    if draw(st.booleans()):
        return (sql, row, False)
    return (
        sql,
        [row, *[tuple(draw(st.integers(0, 4)) for _ in range(arity)) for _ in range(draw(st.integers(0, 2)))]],
        True,
    )


def _apply(units: list[list[Statement]]) -> list[tuple[object, ...]]:
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    with db:
        for sql, args, many in (s for unit in units for s in unit):
            db.executemany(sql, args) if many else db.execute(sql, args)
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
