"""Many recorded transactions written as few statements. Pure.

The write-behind (``controller.store.write_behind``) writes hundreds of small transactions in one of
the database's; at 800 signals a second each is three statements (the signal, its incident, the
node's row), and each statement costs the writer its own Python work under the interpreter lock the
event loop also needs. Within one database transaction only the end state counts (nobody reads
between its statements), so statements on different tables may be written in any order: here each
table's statements keep their own order, and a run of the same SQL on one table becomes one
``executemany`` (one prepared statement, its rows sent together).

An upsert that replaces its whole row (``INSERT INTO t (k, a, b) ... ON CONFLICT (k) DO UPDATE SET
a = excluded.a, b = excluded.b``) leaves the row as its last write for that key says, whatever came
before it: of a run of them, only each key's last row is written (a burst of decisions each storing
the guard's windows, ``controller.nodes.guards``, costs one write of each window, not one per
decision). A value recorded as ``Later`` is made only when its statement is written, so one that is
replaced is never made at all.

Only a plain ``INSERT INTO t`` / ``UPDATE t`` / ``DELETE FROM t`` moves: a statement that reads
another table (a ``SELECT`` in it) or that names none is a barrier, written where it stood, after
everything recorded before it. The store declares no foreign keys or triggers, which is what makes
tables independent.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Statement = tuple[str, Any, bool]  # the SQL, its arguments (rows, for executemany), whether many

_TABLE = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)\b", re.IGNORECASE)
_READS = re.compile(r"\bSELECT\b", re.IGNORECASE)
_UPSERT = re.compile(
    r"^\s*INSERT\s+INTO\s+\w+\s*\((?P<columns>[\w\s,]+)\)\s*VALUES\s*\([?,\s]+\)\s*"
    r"ON\s+CONFLICT\s*\(\s*(?P<key>\w+)\s*\)\s*DO\s+UPDATE\s+SET\s+(?P<sets>.+?)\s*$",
    re.IGNORECASE | re.DOTALL,
)
_SET_FROM_EXCLUDED = re.compile(r"^(\w+)\s*=\s*excluded\.(\w+)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Later:
    """A value made when its statement is written (by the writer, ``controller.store.write_behind``),
    not when it is recorded: ``make`` must give what it would have given then (it closes over
    immutable state)."""

    make: Callable[[], Any]


def made(row: Sequence[Any]) -> tuple[Any, ...]:
    """The row with each ``Later`` value made."""
    return tuple(v.make() if isinstance(v, Later) else v for v in row)


@functools.lru_cache(maxsize=256)  # the store's statements are a few dozen strings
def table_of(sql: str) -> str | None:
    """The one table a plain write touches, or None where the statement may not move."""
    match = _TABLE.match(sql)
    if match is None or _READS.search(sql):
        return None
    return match.group(1).lower()


@functools.lru_cache(maxsize=256)
def upsert_key(sql: str) -> int | None:
    """For an upsert that replaces every column it names but its conflict key from what it inserts,
    the key's position in its row (a later row for the same key then makes an earlier one moot);
    None for any other statement."""
    match = _UPSERT.match(sql)
    if match is None or _READS.search(sql):
        return None
    columns = [c.strip().lower() for c in match["columns"].split(",")]
    key = match["key"].lower()
    sets = [_SET_FROM_EXCLUDED.match(part.strip()) for part in match["sets"].split(",")]
    replaced = {m.group(1).lower() for m in sets if m is not None and m.group(1).lower() == m.group(2).lower()}
    if key not in columns or None in sets or replaced != set(columns) - {key}:
        return None
    return columns.index(key)


def coalesced(units: Iterable[Sequence[Statement]]) -> list[Statement]:
    """The statements of ``units`` (transactions, in order) as one transaction's, grouped by table
    and merged where the same SQL follows itself."""
    out: list[Statement] = []
    by_table: dict[str, list[Statement]] = {}

    def flush() -> None:
        for statements in by_table.values():
            out.extend(_merged(statements))
        by_table.clear()

    for unit in units:
        for statement in unit:
            table = table_of(statement[0])
            if table is None:
                flush()
                out.append(statement)
            else:
                by_table.setdefault(table, []).append(statement)
    flush()
    return out


def _merged(statements: Sequence[Statement]) -> list[Statement]:
    merged: list[Statement] = []
    for sql, args, many in statements:
        if not many and not args:  # no parameters: not something executemany takes
            merged.append((sql, args, many))
            continue
        rows = list(args) if many else [args]
        last = merged[-1] if merged else None
        if last is not None and last[2] and last[0] == sql:
            last[1].extend(rows)
        else:
            merged.append((sql, rows, True))
    return [(sql, _last_per_key(sql, rows) if many else rows, many) for sql, rows, many in merged]


def _last_per_key(sql: str, rows: list[Any]) -> list[Any]:
    key = upsert_key(sql)
    if key is None:
        return rows
    return list({row[key]: row for row in rows}.values())  # keys are independent rows: any order will do
