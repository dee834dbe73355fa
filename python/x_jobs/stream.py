"""The stream, and consumers' cursors: thin calls of the SQL functions, on the caller's connection.

Producers append in their own transaction (an entry is read once it commits, never if it rolls
back); consumers read after the position they saved, in commit-safe order (``x_jobs.stream_read``:
a late commit is never passed over), and save the next position with :func:`save_cursor` in the
transaction that does the batch's work, so that the work and the position commit together.
Every function here runs on ``conn`` as it is: in its open transaction, or in one of its own on an
autocommit connection (docs/sql-api.md#the-stream-and-consumers-cursors).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from x_jobs.errors import typed_refusals

APPEND: LiteralString = (
    "SELECT x_jobs.stream_append(stream => %(stream)s, key => %(key)s, payload => %(payload)s)"
)
APPEND_MANY: LiteralString = (
    "SELECT pos FROM x_jobs.stream_append_many(stream => %(stream)s, entries => %(entries)s)"
    " ORDER BY ord"
)
READ: LiteralString = (
    "SELECT pos, entry_key AS key, payload, appended_at FROM x_jobs.stream_read("
    "stream => %(stream)s, after => %(after)s, max_rows => %(max_rows)s, key => %(key)s)"
)
CURSOR: LiteralString = "SELECT x_jobs.consumer_cursor(consumer => %(consumer)s, key => %(key)s)"
SAVE_CURSOR: LiteralString = (
    "SELECT x_jobs.save_cursor(consumer => %(consumer)s, key => %(key)s, cursor => %(cursor)s)"
)


@dataclass(frozen=True)
class StreamEntry:
    """An entry as :func:`read` answers it: its position (pass it back as ``after``), its key,
    its payload (as JSON decodes it) and when it was appended."""

    pos: str
    key: str | None
    payload: Any
    appended_at: datetime


def append(
    conn: psycopg.Connection[Any], stream: str, payload: Any, *, key: str | None = None
) -> str:
    """Append ``payload`` (any JSON value) to ``stream`` in ``conn``'s transaction; answer its
    position. A malformed stream, key or payload is :class:`~x_jobs.errors.StreamInvalid`."""
    with typed_refusals():
        row = conn.execute(
            APPEND, {"stream": stream, "key": key, "payload": Jsonb(payload)}
        ).fetchone()
    assert row is not None  # stream_append answers a position, or raises
    return str(row[0])


def append_many(
    conn: psycopg.Connection[Any], stream: str, entries: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Append ``entries`` (mappings of a ``payload`` and an optional ``key``) to ``stream`` in one
    statement, in ``conn``'s transaction; answer their positions in order."""
    with typed_refusals():
        rows = conn.execute(
            APPEND_MANY, {"stream": stream, "entries": Jsonb([dict(e) for e in entries])}
        ).fetchall()
    return [str(r[0]) for r in rows]


def read(
    conn: psycopg.Connection[Any],
    stream: str,
    *,
    after: str | None = None,
    max_rows: int = 100,
    key: str | None = None,
) -> list[StreamEntry]:
    """Up to ``max_rows`` entries of ``stream`` after the position ``after`` (None: from the
    first), in commit-safe order; with ``key``, that key's entries only."""
    with typed_refusals():
        cur = conn.cursor(row_factory=class_row(StreamEntry))
        return cur.execute(
            READ, {"stream": stream, "after": after, "max_rows": max_rows, "key": key}
        ).fetchall()


def consumer_cursor(conn: psycopg.Connection[Any], consumer: str, key: str = "") -> Any:
    """The cursor ``consumer`` saved for ``key`` (None before its first save)."""
    with typed_refusals():
        row = conn.execute(CURSOR, {"consumer": consumer, "key": key}).fetchone()
    return None if row is None else row[0]


def save_cursor(conn: psycopg.Connection[Any], consumer: str, cursor: Any, key: str = "") -> None:
    """Save ``cursor`` (any JSON value) as where ``consumer`` is for ``key``, in ``conn``'s open
    transaction: call it in the transaction of the batch's work, and commit them together."""
    with typed_refusals():
        conn.execute(SAVE_CURSOR, {"consumer": consumer, "key": key, "cursor": Jsonb(cursor)})
