"""Declarations in the database (SQL API 0.4.0 and later).

What ``@app.job`` declares of a job (its queue, attempts, retry policy, dead letters, timeout,
concurrency, keep_done, priority) is recorded in ``x_jobs.job_type`` when a worker starts
(``x_jobs.declare_jobs``), so that ``x_jobs.enqueue`` fills what any producer leaves out (a
psql script, a Node service) from it. Workers announce the names they have handlers for, and
hand back (``x_jobs.hand_back``) a claimed job they cannot run without spending its attempt.
``x_jobs.job_types()`` reads the declarations back, for ``x-jobs manifest``.

Nothing here is called on a database older than 0.4.0 (:func:`speaks_declarations`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from x_jobs import health
from x_jobs.app import App
from x_jobs.errors import PermissionDenied, translate
from x_jobs.jobs import Job, interval, seconds

logger = logging.getLogger(__name__)

#: The first SQL API version with declarations, hand-backs and announced job names.
SINCE = (0, 4, 0)

SET_RATE_LIMIT: LiteralString = (
    "SELECT (x_jobs.set_rate_limit(key => %s, max_starts => %s, per => %s)).key"
)
DECLARE_JOBS: LiteralString = (
    "SELECT name FROM x_jobs.declare_jobs(jobs => %s, declared_by => %s, build => %s)"
)
HAND_BACK: LiteralString = (
    "SELECT id, name, parked, served_by FROM x_jobs.hand_back(ids => %s::bigint[], worker => %s)"
)
ANNOUNCE: LiteralString = """
    SELECT draining_at FROM x_jobs.announce_worker(
        worker => %s, queues => %s, build => %s, draining => %s, ttl => %s)
"""
#: With the names of the jobs the worker has handlers for (a database that declares).
ANNOUNCE_JOBS: LiteralString = """
    SELECT draining_at FROM x_jobs.announce_worker(
        worker => %s, queues => %s, build => %s, draining => %s, ttl => %s, jobs => %s)
"""
JOB_TYPES: LiteralString = """
    SELECT name, queue, max_attempts, priority, dead_letter, backoff_base, backoff_max, keep_done,
           concurrency_key, concurrency_limit, timeout, declared_at, declared_by, build,
           served_by, parked
    FROM x_jobs.job_types()
"""


def speaks_declarations(version: str) -> bool:
    """Does the SQL API ``version`` (``x_jobs.version()``) have declarations?"""
    try:
        return tuple(int(part) for part in version.split(".")) >= SINCE
    except ValueError:
        return False


def _interval(value: float) -> str:
    # Fixed-point, as Job.request sends them: "1e-05 seconds" is no SQL interval.
    return f"{value:f} seconds"


def declaration(job: Job[Any]) -> dict[str, Any]:
    """What ``job`` declares, as one object of ``x_jobs.declare_jobs``: every field, so that a
    later declaration replaces the whole row. A concurrency key the input gives (a function) is
    declared as its limit alone: producers pass their key, and the limit goes with it."""
    return {
        "name": job.name,
        "queue": job.queue,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "dead_letter": job.retry.dead_letter,
        "backoff_base": _interval(seconds(job.retry.base)),
        "backoff_max": _interval(seconds(job.retry.max)),
        "keep_done": job.keep_done,
        "timeout": None if job.timeout is None else _interval(job.timeout),
        "concurrency_limit": None if job.concurrency is None else job.concurrency.limit,
        "concurrency_key": job.fixed_concurrency_key,
        # Left out without a limit, so that the declaration reads as it did before rate limits.
        **({} if job.rate_limit is None else {"rate_limit_key": job.rate_limit.key}),
    }


def declarations(app: App) -> list[dict[str, Any]]:
    """Every job ``app`` declares, by name."""
    return [declaration(app.jobs[name]) for name in sorted(app.jobs)]


def declare(
    conn: psycopg.Connection[Any], app: App, *, declared_by: str, build: str | None
) -> list[str]:
    """Record the declarations of ``app``'s jobs in one call; answers the names declared."""
    if not app.jobs:
        return []
    # The rate limits first: a declaration (and an enqueue) naming a key needs its limit.
    # Two jobs naming one key with different limits: the later name's wins, as a later
    # declaration does.
    for name in sorted(app.jobs):
        limit = app.jobs[name].rate_limit
        if limit is not None:
            conn.execute(
                SET_RATE_LIMIT, [limit.key, limit.max, timedelta(seconds=seconds(limit.per))]
            )
    rows = conn.execute(DECLARE_JOBS, [Jsonb(declarations(app)), declared_by, build]).fetchall()
    return [str(row[0]) for row in rows]


@dataclass(frozen=True)
class HandedBack:
    """A row ``x_jobs.hand_back`` gave back: parked (no live worker serves its name), or
    delayed for the workers in ``served_by``."""

    id: int
    name: str
    parked: bool
    served_by: list[str]


def hand_back(conn: psycopg.Connection[Any], ids: Iterable[int], worker: str) -> list[HandedBack]:
    """``x_jobs.hand_back`` of the rows ``worker`` claimed and has no handler for."""
    literal = "{" + ",".join(map(str, ids)) + "}"
    rows = conn.execute(HAND_BACK, [literal, worker]).fetchall()
    return [HandedBack(int(r[0]), str(r[1]), bool(r[2]), list(r[3])) for r in rows]


def describe(handed: HandedBack) -> str:
    """Where a handed-back job went, for the worker's log line."""
    if handed.parked:
        return "parked until a worker declares it"
    return "served by: " + ", ".join(handed.served_by)


@dataclass(frozen=True)
class JobType:
    """A row of ``x_jobs.job_types()``: a declaration (NULL fields: not declared, the built-in
    default applies), the live workers that announced the name, and its parked rows."""

    name: str
    queue: str | None
    max_attempts: int | None
    priority: int | None
    dead_letter: bool | None
    backoff_base: timedelta | None
    backoff_max: timedelta | None
    keep_done: bool | None
    concurrency_key: str | None
    concurrency_limit: int | None
    timeout: timedelta | None
    declared_at: datetime | None
    declared_by: str | None
    build: str | None
    served_by: list[str]
    parked: int


def job_types(conn: psycopg.Connection[Any]) -> list[JobType]:
    """The declarations the database holds, by name (``x_jobs.job_types()``)."""
    return conn.cursor(row_factory=class_row(JobType)).execute(JOB_TYPES).fetchall()


def start(
    conn: psycopg.Connection[Any],
    app: App,
    *,
    worker: str,
    build: str | None,
    check_version: bool,
    log: logging.Logger,
) -> bool:
    """A worker's start, on its first connection: check the version (unless told not to),
    and where the database takes declarations (speaks_declarations) record what the app's jobs
    declare (x_jobs.declare_jobs), so that every producer's enqueue of them gets it; answers
    whether it did. Where it does not, nothing is declared, and a job the worker has no handler
    for fails its attempt."""
    if check_version:
        version = app.check_version(conn)
    else:
        try:
            row = conn.execute("SELECT x_jobs.version()").fetchone()
        except psycopg.Error:
            row = None
        version = str(row[0]) if row else ""
    health.log_failing(conn, version, log)  # once, at start
    if not speaks_declarations(version):
        return False
    try:
        names = declare(conn, app, declared_by=worker, build=build)
    except psycopg.errors.InsufficientPrivilege as err:
        # A login without x_jobs_worker, refused here before its first claim.
        raise PermissionDenied.of(err) from err
    except psycopg.Error as err:
        # A declaration the database refuses (a timeout of 0: X_JOB_TIMEOUT_INVALID).
        typed = translate(err)
        if typed is err:
            raise
        raise typed from err
    log.info("jobs declared", extra={"worker": worker, "jobs": names})
    return True


def announce(
    conn: psycopg.Connection[Any],
    *,
    worker: str,
    queues: list[str],
    build: str | None,
    draining: bool,
    ttl: float,
    jobs: list[str] | None,
) -> None:
    """``x_jobs.announce_worker``: the worker is alive (for ``ttl`` seconds), serves ``queues``,
    and drains or not. ``jobs``, where the database declares: the names it has handlers for, by
    which a hand-back finds it, and which wake the rows parked for them."""
    params: list[Any] = [worker, queues, build, draining, interval(ttl)]
    if jobs is None:
        conn.execute(ANNOUNCE, params).fetchall()
    else:
        conn.execute(ANNOUNCE_JOBS, [*params, jobs]).fetchall()
