"""The connection of an operator's command: opened from ``--dsn`` (else DATABASE_URL, else
libpq's PG* environment), checked to hold an x_jobs this client speaks to, every time read in
UTC, JSON read with every digit; whatever goes wrong ends the command as one line and a hint.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, LiteralString

import psycopg
from psycopg.abc import Buffer
from psycopg.types.datetime import IntervalLoader, TimestamptzLoader
from psycopg.types.json import set_json_loads

from x_jobs._conn import connect, redact
from x_jobs.app import App
from x_jobs.cli._output import (
    EXIT_REFUSED,
    EXIT_USAGE,
    INFINITY,
    JSON_DEPTH,
    NEG_INFINITY,
    Output,
    RawJson,
)
from x_jobs.errors import (
    DatabaseError,
    PermissionDenied,
    VersionUnsupported,
    XJobsError,
    translate,
)
from x_jobs.errors import first_line as _first_line

logger = logging.getLogger(__name__)

CONNECT_HINT = (
    "Check --dsn, DATABASE_URL or the PG* variables (PGHOST, PGPORT, PGDATABASE, PGUSER), "
    "and that the server is running."
)

VERSION: LiteralString = "SELECT x_jobs.version()"

# Every time the CLI reads arrives in UTC, whatever TimeZone the server, the database, the role
# or PGTZ give the session: psycopg cannot read a local time past the year 9999 (the last hours
# of 9999 in UTC, 14 hours ahead), which the loader would show as infinity. A session setting,
# which PgBouncer carries from one server connection to the next (it tracks TimeZone for each
# client, in transaction mode too).
PIN_UTC: LiteralString = "SET TimeZone TO 'UTC'"
# The session's own TimeZone back, for one transaction: the one the server reported at login
# (server, database, role, PGTZ), before PIN_UTC. Not SET LOCAL TimeZone TO DEFAULT: behind a
# pooler the default is that of whichever server connection the transaction runs on.
OWN_TIMEZONE: LiteralString = "SELECT pg_catalog.set_config('TimeZone', %s, true)"


class _TimestamptzLoader(TimestamptzLoader):
    """psycopg's loader, with INFINITY or NEG_INFINITY where it refuses a value: one such row
    would otherwise make a whole page unreadable."""

    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            return NEG_INFINITY if text.startswith(b"-") or text.endswith(b"BC") else INFINITY


class _IntervalLoader(IntervalLoader):
    """psycopg's loader, with the longest timedelta where an interval is longer (PostgreSQL's
    reach 178 million years, Python's 2.7 million): one job enqueued with backoff_max =>
    '100000000 years' would otherwise make every page that lists it unreadable."""

    def load(self, data: Buffer) -> timedelta:
        try:
            return super().load(data)
        except psycopg.DataError:
            return -timedelta.max if bytes(data).lstrip().startswith(b"-") else timedelta.max


def _json_int(text: str) -> int | Decimal:
    # Python reads no int of more than 4300 digits (a guard against slow parsing); jsonb can.
    return int(text) if len(text) <= 4000 else Decimal(text)


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``depth`` levels (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        inner = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if inner and level > depth:
            return True
        stack.extend((child, level + 1) for child in inner if isinstance(child, dict | list))
    return False


def _json_loads(data: str | bytes) -> Any:
    """jsonb as the CLI reads it: numbers with every digit jsonb holds, not rounded to floats;
    a value nested deeper than JSON_DEPTH as its text (RawJson)."""
    text = data if isinstance(data, str) else bytes(data).decode()
    try:
        value = json.loads(text, parse_float=Decimal, parse_int=_json_int)
    except RecursionError:
        return RawJson(text)
    # Counting brackets (strings' too) is cheap: only a value with enough of them is walked.
    if text.count("[") + text.count("{") > JSON_DEPTH and _deeper_than(value, JSON_DEPTH):
        return RawJson(text)
    return value


#: The TimeZone each connection of database() started with, before PIN_UTC (see OWN_TIMEZONE).
_OWN_TIMEZONES: weakref.WeakKeyDictionary[psycopg.Connection[Any], str] = (
    weakref.WeakKeyDictionary()
)


@contextmanager
def database(
    dsn: str | None, out: Output, *, check_version: bool = True, tenant: str | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the database ``dsn`` names (default: DATABASE_URL, else
    libpq's environment, as App() finds it), checked to hold an x_jobs this client speaks to.
    Whatever goes wrong inside ends the command as one line and a hint, never a traceback.

    ``tenant`` (``--tenant``): the command runs in one transaction that sets ``x_jobs.tenant``
    locally, as an App(tenant=...) does, so that it shows only that tenant's rows."""
    try:
        app = App(dsn, tenant=tenant)
    except XJobsError as err:
        out.refuse(EXIT_USAGE, err)
    try:
        conn = connect(app.dsn, "x-jobs")
    except psycopg.Error as err:
        out.fail(
            EXIT_USAGE,
            f"X_CONNECT_FAILED: cannot connect to the database: {_first_line(redact(str(err)))}",
            CONNECT_HINT,
            code="X_CONNECT_FAILED",
        )
    conn.adapters.register_loader("timestamptz", _TimestamptzLoader)
    conn.adapters.register_loader("interval", _IntervalLoader)
    set_json_loads(_json_loads, conn)
    try:
        with conn:
            _OWN_TIMEZONES[conn] = conn.info.parameter_status("TimeZone") or "UTC"
            conn.execute(PIN_UTC)
            if check_version:
                app.check_version(conn)
            with app.scope(conn):
                yield conn
    except (VersionUnsupported, PermissionDenied) as err:
        # No x_jobs there (or one this client cannot speak to), a login without the role the
        # command needs: the command's setup, not what it asked (see EXIT_USAGE).
        out.refuse(EXIT_USAGE, err)
    except XJobsError as err:
        out.refuse(EXIT_REFUSED, err)
    except psycopg.Error as err:
        if conn.broken:
            out.fail(
                EXIT_USAGE,
                "X_CONNECTION_LOST: the database connection was lost: "
                + _first_line(redact(str(err))),
                CONNECT_HINT,
                code="X_CONNECTION_LOST",
            )
        if isinstance(err, psycopg.errors.InsufficientPrivilege):
            out.refuse(EXIT_USAGE, PermissionDenied.of(err))
        typed = translate(err)
        out.refuse(EXIT_REFUSED, typed if isinstance(typed, XJobsError) else DatabaseError.of(err))


def in_tenant(conn: psycopg.Connection[Any], tenant: str | None) -> None:
    """Scope the transaction ``conn`` is in to ``tenant`` (``--tenant``; None: nothing), for a
    command that opens its transaction itself (its isolation level first)."""
    if tenant is not None:
        with App(tenant=tenant).scope(conn):
            pass


#: The first SQL API with cancel_jobs, retry_jobs and list_jobs(name => ...).
BULK_VERSION = (0, 4, 0)


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return ()


def _require_0_4(conn: psycopg.Connection[Any], what: str, instead: str) -> None:
    """Refuse ``what`` (X_VERSION_UNSUPPORTED, exit 2) on a database older than 0.4.0, whose
    functions do not take it; ``instead`` is what the hint offers besides the upgrade."""
    row = conn.execute(VERSION).fetchone()
    version = str(row[0]) if row else "?"
    if _version_tuple(version) < BULK_VERSION:
        raise VersionUnsupported(
            f"X_VERSION_UNSUPPORTED: {what} needs x_jobs 0.4.0 or later, the database has"
            f" {version}",
            hint="Upgrade the database (ALTER EXTENSION x_jobs UPDATE, or x-jobs install where it"
            f" was installed that way), {instead}.",
        )
