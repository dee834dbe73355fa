"""``x_jobs.health()``: what an installation should fix (0.4.0 and later).

One row per check: the roles exist and are linked, the functions that run as their owner have
one owner, and that owner may read the WAL writer's start (without it claim's restart grace
falls back to the postmaster's start). The worker logs each failing check once when it starts;
``x-jobs install`` prints them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg.rows import class_row

logger = logging.getLogger(__name__)

HEALTH: LiteralString = "SELECT check_name, ok, detail, hint FROM x_jobs.health()"
#: Whether this database has x_jobs.health() (0.4.0 on), for a caller that knows no version.
HAS_HEALTH: LiteralString = "SELECT pg_catalog.to_regprocedure('x_jobs.health()') IS NOT NULL"

#: The first version that has x_jobs.health().
SINCE = (0, 4, 0)


@dataclass(frozen=True)
class Check:
    """One row of ``x_jobs.health()``: ``hint`` is the fix, None when the check holds."""

    check_name: str
    ok: bool
    detail: str
    hint: str | None


def checks(conn: psycopg.Connection[Any]) -> list[Check]:
    """Every row of ``x_jobs.health()``."""
    return conn.cursor(row_factory=class_row(Check)).execute(HEALTH).fetchall()


def failing(conn: psycopg.Connection[Any]) -> list[Check]:
    """The checks that do not hold, or [] where the database has no ``x_jobs.health()``."""
    row = conn.execute(HAS_HEALTH).fetchone()
    if row is None or not row[0]:
        return []
    return [check for check in checks(conn) if not check.ok]


def _release(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return ()


def log_failing(conn: psycopg.Connection[Any], version: str, log: logging.Logger) -> None:
    """Log one warning per failing check on ``log``, when ``version`` has ``x_jobs.health()``.
    A start-up that cannot read it (a login without the right) logs that instead of failing:
    what the checks are about does not stop a worker."""
    if _release(version) < SINCE:
        return
    try:
        found = [check for check in checks(conn) if not check.ok]
    except psycopg.Error as err:
        if not conn.autocommit:
            conn.rollback()
        log.warning(
            "x_jobs.health() could not be read",
            extra={"error": (err.diag.message_primary or str(err)).strip()},
        )
        return
    for check in found:
        log.warning(
            "x_jobs.health() %s: %s",
            check.check_name,
            check.detail,
            extra={"check": check.check_name, "hint": check.hint},
        )
