"""Schedules: cron expressions that enqueue jobs (SQL API 0.4.2 and later).

A schedule lives in the database (``x_jobs.set_schedule``): its cron expression, its IANA time
zone, the job it enqueues and the instant it fires next, stored, so that no restart forgets a
fire. Whoever calls ``x_jobs.tick_schedules`` fires what is due (every worker, by default, at
each whole minute; or pg_cron; or ``x-jobs tick``); any number may at once, and none is a leader.

An app declares its schedules in code: ``@app.job(schedule=x_jobs.Cron("0 9 * * MON-FRI",
tz="Europe/Berlin"))`` or ``app.schedule(name, job, cron, ...)`` (:class:`Schedule`).
:func:`sync_schedules` writes them (a worker at its start; ``x-jobs schedules sync`` from a
deploy step), never touching a schedule the app does not declare, and with ``prune`` drops
those this app once declared and no longer does. The rest are thin wrappers of the SQL
functions, answering dataclasses: :func:`list_schedules`, :func:`show`, :func:`pause`,
:func:`resume`, :func:`run_now`, :func:`preview` (``x_jobs.cron_next``) and :func:`tick`.

Python checks the types of a declaration; the database checks the rest (a bad expression is
:class:`~x_jobs.errors.CronInvalid`, a bad zone :class:`~x_jobs.errors.TimeZoneInvalid`, a bad
policy :class:`~x_jobs.errors.ScheduleInvalid`), every refusal typed (x_jobs.errors).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Any, LiteralString, Protocol

import psycopg
from psycopg.rows import class_row, tuple_row
from psycopg.types.json import Jsonb

from x_jobs.errors import ScheduleNotFound, typed_refusals
from x_jobs.jobs import Enqueued, Job, Seconds, interval, seconds

logger = logging.getLogger(__name__)

#: What ``catchup`` and ``overlap`` take (the database refuses anything else, XJ049).
CATCHUPS = ("latest", "all", "none")
OVERLAPS = ("allow", "skip")

#: The origin of the schedules an app declares: the ones sync may prune.
CODE = "code"

#: The most schedules one tick_schedules call fires, by default.
TICK_MAX_ROWS = 1000


@dataclass(frozen=True)
class Cron:
    """When a job runs: a cron expression (five fields, or ``@hourly``, ``@daily``,
    ``@weekly``, ``@monthly``, ``@yearly``) read in the IANA time zone ``tz``.

    ``catchup``: what a tick does with instants missed while nothing ticked: ``latest`` (one
    run, for the last), ``all`` (each, oldest first, at most ``catchup_max``), ``none`` (none
    older than ``grace``). ``overlap``: ``allow``, or ``skip`` (no run while one of the
    schedule's is live). ``grace`` (seconds or a timedelta, up to a day): how late a run may be
    enqueued and still count as on time (``ctx.schedule.late``). ``input``: the job's input (an
    object; each run gets ``_schedule`` beside it, which the worker hands to ``ctx.schedule``).
    ``name``: the schedule's name (default: see ``App.job``).
    """

    expr: str
    tz: str = "UTC"
    _: KW_ONLY
    catchup: str = "latest"
    catchup_max: int = 100
    overlap: str = "allow"
    grace: Seconds = 60
    input: Mapping[str, Any] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        for label, value in (("expr", self.expr), ("tz", self.tz)):
            if not isinstance(value, str):
                raise TypeError(f"Cron {label} is a str, not {type(value).__name__}")
        if not isinstance(self.catchup_max, int) or isinstance(self.catchup_max, bool):
            raise TypeError(f"catchup_max is an int, not {type(self.catchup_max).__name__}")
        if not isinstance(self.grace, int | float | timedelta) or isinstance(self.grace, bool):
            raise TypeError(f"grace is seconds or a timedelta, not {type(self.grace).__name__}")
        if self.input is not None and not isinstance(self.input, Mapping):
            raise TypeError(f"a schedule's input is a mapping, not {type(self.input).__name__}")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"a schedule's name is a str, not {type(self.name).__name__}")


@dataclass(frozen=True)
class Schedule:
    """A schedule an app declares: its name, the job it enqueues (by name: a job of the app,
    or one that another service runs), when (:class:`Cron`), and the enqueue options it sets.
    An option left None is the job's own when the app declares the job (as ``job.enqueue``
    sends it), else the job's declaration in the database, else the built-in default."""

    name: str
    job: str
    cron: Cron
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    tenant_id: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    dead_letter: bool | None = None
    backoff_base: Seconds | None = None
    backoff_max: Seconds | None = None
    keep_done: bool | None = None


#: The enqueue options a schedule carries, as x_jobs.set_schedule names them.
OPTIONS = (
    "queue",
    "priority",
    "max_attempts",
    "tenant_id",
    "concurrency_key",
    "concurrency_limit",
    "dead_letter",
    "backoff_base",
    "backoff_max",
    "keep_done",
)


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as the database answers it (``x_jobs.schedule_info``): NULL enqueue options
    are left to the job's declaration; ``next_fire_at`` is when it fires next (``infinity``
    for an expression that never fires again), the ``last_*`` fields its last fire."""

    name: str
    job: str
    cron: str
    tz: str
    input: Any
    queue: str | None
    priority: int | None
    max_attempts: int | None
    tenant_id: str | None
    concurrency_key: str | None
    concurrency_limit: int | None
    dead_letter: bool | None
    backoff_base: timedelta | None
    backoff_max: timedelta | None
    keep_done: bool | None
    catchup: str
    catchup_max: int
    overlap: str
    grace: timedelta
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    last_enqueued_at: datetime | None
    last_job_id: int | None
    last_job_state: str | None
    fires: int
    skips: int
    last_error: str | None
    origin: str | None
    declared_by: str | None
    created_at: datetime
    updated_at: datetime


INFO_COLUMNS: LiteralString = """
    name, job, cron, tz, input, queue, priority, max_attempts, tenant_id, concurrency_key,
    concurrency_limit, dead_letter, backoff_base, backoff_max, keep_done, catchup, catchup_max,
    overlap, grace, paused, next_fire_at, last_fire_at, last_enqueued_at, last_job_id,
    last_job_state::text AS last_job_state, fires, skips, last_error, origin, declared_by,
    created_at, updated_at
"""

# Casts on the numbers: psycopg sends a Python int as the smallest type that holds it, and a
# bigint finds no integer parameter (no function matches, rather than a value out of range).
SET_SCHEDULE: LiteralString = (
    "SELECT "
    + INFO_COLUMNS
    + """
    FROM x_jobs.set_schedule(
        name => %(name)s, job => %(job)s, cron => %(cron)s, tz => %(tz)s, input => %(input)s,
        queue => %(queue)s, catchup => %(catchup)s, catchup_max => %(catchup_max)s::integer,
        overlap => %(overlap)s, grace => %(grace)s::interval,
        priority => %(priority)s::integer, max_attempts => %(max_attempts)s::integer,
        tenant_id => %(tenant_id)s, concurrency_key => %(concurrency_key)s,
        concurrency_limit => %(concurrency_limit)s::integer, dead_letter => %(dead_letter)s,
        backoff_base => %(backoff_base)s::interval, backoff_max => %(backoff_max)s::interval,
        keep_done => %(keep_done)s, origin => %(origin)s, declared_by => %(declared_by)s)
"""
)
LIST_SCHEDULES: LiteralString = (
    "SELECT " + INFO_COLUMNS + " FROM x_jobs.list_schedules(name => %(name)s)"
)
PAUSE_SCHEDULE: LiteralString = (
    "SELECT " + INFO_COLUMNS + " FROM x_jobs.pause_schedule(name => %(name)s)"
)
RESUME_SCHEDULE: LiteralString = (
    "SELECT " + INFO_COLUMNS + " FROM x_jobs.resume_schedule(name => %(name)s)"
)
DROP_SCHEDULE: LiteralString = "SELECT x_jobs.drop_schedule(name => %(name)s)"
RUN_SCHEDULE_NOW: LiteralString = (
    "SELECT id, run_id::text, deduped FROM x_jobs.run_schedule_now(name => %(name)s)"
)
CRON_NEXT: LiteralString = """
    SELECT fire_at FROM x_jobs.cron_next(
        cron => %(cron)s, tz => %(tz)s, after => %(after)s::timestamptz,
        count => %(count)s::integer)
"""
#: The database's clock read in the tick's own statement: a worker waits from it for the next
#: whole minute, so that it ticks when the instants come by the clock the schedules keep.
TICK: LiteralString = """
    SELECT schedules, enqueued, skipped, next_fire_at, x_jobs.now()
    FROM x_jobs.tick_schedules(max_rows => %(max_rows)s::integer)
"""
#: Whether the database has schedules (x_jobs 0.4.2 on), asked of the catalogue.
HAS_SCHEDULES: LiteralString = (
    "SELECT pg_catalog.to_regprocedure('x_jobs.tick_schedules(integer)') IS NOT NULL"
)


def speaks_schedules(conn: psycopg.Connection[Any]) -> bool:
    """Does the database have schedules (x_jobs.tick_schedules)?"""
    row = conn.cursor(row_factory=tuple_row).execute(HAS_SCHEDULES).fetchone()
    return bool(row and row[0])


class SchedulesApp(Protocol):
    """What sync reads of an App: its jobs, and the schedules it declares."""

    @property
    def jobs(self) -> Mapping[str, Job[Any]]: ...

    @property
    def schedules(self) -> Mapping[str, Schedule]: ...


def _interval(value: Seconds | str | None) -> str | None:
    """A backoff as SQL interval text: Job.request's is already; a schedule's own is seconds or
    a timedelta, written fixed-point as Job.request writes them ("1e-05 seconds" is no SQL
    interval)."""
    if value is None or isinstance(value, str):
        return value
    return f"{seconds(value):f} seconds"


def parameters(app: SchedulesApp, schedule: Schedule) -> dict[str, Any]:
    """The arguments of ``x_jobs.set_schedule`` for ``schedule``. A job the app declares gives
    what its enqueue would (``Job.request``: the input validated, InputInvalid if it does not;
    its queue, attempts, retry, priority, tenant and concurrency), and the schedule's own
    options win over those."""
    cron = schedule.cron
    given: dict[str, Any] = dict(cron.input or {})
    job = app.jobs.get(schedule.job)
    request: dict[str, Any] = job.request(given) if job is not None else {"input": given}
    options: dict[str, Any] = {name: request.get(name) for name in OPTIONS}
    for name in OPTIONS:
        value = getattr(schedule, name)
        if value is not None:
            options[name] = value
    options["backoff_base"] = _interval(options["backoff_base"])
    options["backoff_max"] = _interval(options["backoff_max"])
    return {
        "name": schedule.name,
        "job": schedule.job,
        "cron": cron.expr,
        "tz": cron.tz,
        "input": Jsonb(request["input"]),
        "catchup": cron.catchup,
        "catchup_max": cron.catchup_max,
        "overlap": cron.overlap,
        "grace": interval(cron.grace),
        **options,
    }


@dataclass(frozen=True)
class Synced:
    """What :func:`sync_schedules` did: the schedules it wrote, as the database answered them
    (by name), and the names it dropped (``prune``)."""

    schedules: list[ScheduleInfo] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def sync_schedules(
    conn: psycopg.Connection[Any],
    app: SchedulesApp,
    *,
    prune: bool = False,
    declared_by: str | None = None,
) -> Synced:
    """Write every schedule ``app`` declares (``x_jobs.set_schedule``, origin 'code'), in one
    transaction: a refusal of one writes none. An update keeps the instant a schedule fires
    next while its expression and zone mean the same instants, and keeps it paused if an
    operator paused it. Schedules the app does not declare are left alone; with ``prune``,
    those whose origin is 'code' and whose job is one of the app's, but whose name it no longer
    declares, are dropped (``x_jobs.drop_schedule``, which needs x_jobs_admin). ``declared_by``
    names the writer (default: the session's user)."""
    params = [parameters(app, app.schedules[name]) for name in sorted(app.schedules)]
    cur = conn.cursor(row_factory=class_row(ScheduleInfo))
    written: list[ScheduleInfo] = []
    dropped: list[str] = []
    with typed_refusals(), conn.transaction():
        for values in params:
            row = cur.execute(SET_SCHEDULE, {**values, "origin": CODE, "declared_by": declared_by})
            written.append(_one(row.fetchone(), values["name"]))
        if prune:
            for info in cur.execute(LIST_SCHEDULES, {"name": None}).fetchall():
                if info.origin == CODE and info.job in app.jobs and info.name not in app.schedules:
                    cur.execute(DROP_SCHEDULE, {"name": info.name})
                    dropped.append(info.name)
    return Synced(written, dropped)


def _one(row: ScheduleInfo | None, name: str) -> ScheduleInfo:
    if row is None:  # the functions answer a row or raise; this is a guard, not a path
        raise _not_found(name)
    return row


def _not_found(name: str) -> ScheduleNotFound:
    # The words of x_jobs._schedule_not_found (XJ050).
    return ScheduleNotFound(
        f"X_SCHEDULE_NOT_FOUND: no schedule is named {name!r}",
        hint="SELECT name FROM x_jobs.list_schedules() lists them; set_schedule makes one.",
    )


def list_schedules(conn: psycopg.Connection[Any]) -> list[ScheduleInfo]:
    """Every schedule, by name (``x_jobs.list_schedules()``)."""
    with typed_refusals():
        cur = conn.cursor(row_factory=class_row(ScheduleInfo))
        return cur.execute(LIST_SCHEDULES, {"name": None}).fetchall()


def show(conn: psycopg.Connection[Any], name: str) -> ScheduleInfo:
    """The schedule ``name``; ScheduleNotFound when there is none."""
    with typed_refusals():
        cur = conn.cursor(row_factory=class_row(ScheduleInfo))
        row = cur.execute(LIST_SCHEDULES, {"name": name}).fetchone()
    if row is None:
        raise _not_found(name)
    return row


def pause(conn: psycopg.Connection[Any], name: str) -> ScheduleInfo:
    """Stop ``name`` from firing (``x_jobs.pause_schedule``, x_jobs_admin); it stays paused
    when its app declares it again."""
    with typed_refusals():
        cur = conn.cursor(row_factory=class_row(ScheduleInfo))
        return _one(cur.execute(PAUSE_SCHEDULE, {"name": name}).fetchone(), name)


def resume(conn: psycopg.Connection[Any], name: str) -> ScheduleInfo:
    """Let ``name`` fire again from its next instant after now (``x_jobs.resume_schedule``,
    x_jobs_admin): what it would have fired while paused is not caught up."""
    with typed_refusals():
        cur = conn.cursor(row_factory=class_row(ScheduleInfo))
        return _one(cur.execute(RESUME_SCHEDULE, {"name": name}).fetchone(), name)


def drop(conn: psycopg.Connection[Any], name: str) -> bool:
    """Delete the schedule ``name`` (``x_jobs.drop_schedule``, x_jobs_admin); False if there
    was none. The jobs it enqueued stay."""
    with typed_refusals():
        row = conn.cursor(row_factory=tuple_row).execute(DROP_SCHEDULE, {"name": name}).fetchone()
    return bool(row and row[0])


def run_now(conn: psycopg.Connection[Any], name: str) -> Enqueued:
    """Enqueue the job of ``name`` now, once, as a run asked by hand
    (``x_jobs.run_schedule_now``, x_jobs_admin); its next instant stays. With overlap 'skip'
    and a run live, that run answers (deduped)."""
    with typed_refusals():
        cur = conn.cursor(row_factory=tuple_row)
        row = cur.execute(RUN_SCHEDULE_NOW, {"name": name}).fetchone()
    assert row is not None
    return Enqueued(id=int(row[0]), run_id=str(row[1]), deduped=bool(row[2]))


def preview(
    conn: psycopg.Connection[Any],
    cron: str,
    tz: str = "UTC",
    *,
    after: datetime | None = None,
    count: int = 5,
) -> list[datetime]:
    """The next ``count`` instants (1 to 1000) after ``after`` (default: the database's now)
    at which ``cron`` fires in ``tz`` (``x_jobs.cron_next``); fewer when it fires no more."""
    with typed_refusals():
        cur = conn.cursor(row_factory=tuple_row)
        params = {"cron": cron, "tz": tz, "after": after, "count": count}
        rows = cur.execute(CRON_NEXT, params).fetchall()
    return [row[0] for row in rows]


@dataclass(frozen=True)
class Ticked:
    """What :func:`tick` did over its ``calls`` of ``x_jobs.tick_schedules``: schedules
    advanced, jobs enqueued, instants skipped (overlap, catch-up, a refused job), the next
    instant any schedule is due at (None: none is), and the database's clock at the first call."""

    schedules: int
    enqueued: int
    skipped: int
    next_fire_at: datetime | None
    now: datetime
    calls: int


def tick(conn: psycopg.Connection[Any], max_rows: int = TICK_MAX_ROWS) -> Ticked:
    """Fire what is due: ``x_jobs.tick_schedules(max_rows)``, each call its own transaction
    (``conn`` in autocommit), again while a call advanced ``max_rows`` schedules (more may be
    due), and the sums."""
    totals = [0, 0, 0]
    now: datetime | None = None
    calls = 0
    cur = conn.cursor(row_factory=tuple_row)
    with typed_refusals():
        while True:
            row = cur.execute(TICK, {"max_rows": max_rows}).fetchone()
            assert row is not None
            calls += 1
            for i in range(3):
                totals[i] += int(row[i])
            next_fire_at = row[3]
            now = row[4] if now is None else now
            if int(row[0]) < max_rows:
                break
    assert now is not None
    return Ticked(totals[0], totals[1], totals[2], next_fire_at, now, calls)
