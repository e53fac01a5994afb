"""Many recorded transactions written as few statements. Pure.

The write-behind (``controller.store.write_behind``) writes hundreds of small transactions in one of
the database's; at 800 signals a second each is three statements (the signal, its incident, the
node's row), and each statement costs the writer its own Python work under the interpreter lock the
event loop also needs. Within one database transaction only the end state counts (nobody reads
between its statements), so statements on different tables may be written in any order: here each
table's statements keep their own order, and a run of the same SQL on one table becomes one
``executemany`` (one prepared statement, its rows sent together).

Only a plain ``INSERT INTO t`` / ``UPDATE t`` / ``DELETE FROM t`` moves: a statement that reads
another table (a ``SELECT`` in it) or that names none is a barrier, written where it stood, after
everything recorded before it. The store declares no foreign keys or triggers, which is what makes
tables independent.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

Statement = tuple[str, Any, bool]  # the SQL, its arguments (rows, for executemany), whether many

_TABLE = re.compile(r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)\b", re.IGNORECASE)
_READS = re.compile(r"\bSELECT\b", re.IGNORECASE)


@functools.lru_cache(maxsize=256)  # the store's statements are a few dozen strings
def table_of(sql: str) -> str | None:
    """The one table a plain write touches, or None where the statement may not move."""
    match = _TABLE.match(sql)
    if match is None or _READS.search(sql):
        return None
    return match.group(1).lower()


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
    return merged
