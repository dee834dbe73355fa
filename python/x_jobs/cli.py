"""The ``x-jobs`` command line (also ``python -m x_jobs``).

``worker`` runs the jobs of an App, ``relay`` delivers its outbox. The operator's commands call
the SQL API and print what it answers: ``enqueue``, ``jobs list|show|retry|cancel``,
``outbox list|show|redrive``, ``events publish``, ``steps resolve``, ``queues [pause|resume]``,
and ``install`` (the schema without CREATE EXTENSION, see :mod:`x_jobs.install`). Each takes
``--dsn`` (default ``DATABASE_URL``, else libpq's PG* environment, as ``App()``) and ``--json``
(one JSON document on stdout instead of tables).

Exit codes: 0 done; 1 the database refused (an x_jobs refusal such as X_JOB_NOT_FOUND, one
this client makes in the same manner such as X_MESSAGE_NOT_FOUND, or any other SQL error); 2 a
usage or connection problem (bad arguments, a bad DSN, an unreachable server, a database without
x_jobs or with a version this client cannot speak to). An error is one line on stderr, then a
hint; with ``--json`` stdout also gets ``{"error": {...}}``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import shlex
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, LiteralString, NoReturn

import psycopg
import typer
from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from rich.console import Console, RenderableType
from rich.json import JSON
from rich.table import Table
from rich.text import Text

from x_jobs import install as installer
from x_jobs import maintenance
from x_jobs.app import App
from x_jobs.errors import (
    ClientError,
    JobNotFound,
    QtyInvalid,
    StateUnknown,
    VersionUnsupported,
    XJobsError,
    translate,
)
from x_jobs.maintenance import Retention, parse_age

logger = logging.getLogger(__name__)

cli = typer.Typer(
    name="x-jobs",
    help="Operate x_jobs: run workers, enqueue, inspect and steer jobs and queues.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@cli.callback()
def _commands() -> None:
    """Operate x_jobs: run workers, enqueue, inspect and steer jobs and queues."""


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields."""

    _plain = frozenset(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._plain})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def load_app(target: str) -> App:
    """The App at MODULE:ATTRIBUTE (``myproject.jobs:app``)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(f"{target!r} is not MODULE:APP, such as myproject.jobs:app")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise typer.BadParameter(f"cannot import {module_name!r}: {err}") from err
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{target!r} is not an x_jobs.App (found {type(app).__name__})")
    return app


@cli.command()
def worker(
    app_path: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="A queue to serve (repeatable).")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Jobs run at once.")] = 10,
    prefetch: Annotated[
        int | None,
        typer.Option(help="Claimed jobs waiting in a local queue (default: concurrency)."),
    ] = None,
    lease: Annotated[float, typer.Option(help="Lease of a claimed job, seconds.")] = 30.0,
    poll: Annotated[float, typer.Option(help="Poll interval, seconds.")] = 1.0,
    grace: Annotated[float, typer.Option(help="Drain grace on SIGTERM, seconds.")] = 30.0,
    build: Annotated[str | None, typer.Option(help="Build id announced by the worker.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port.")
    ] = None,
    dsn: Annotated[str | None, typer.Option(help="Database; default DATABASE_URL or PG*.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: Annotated[str, typer.Option(help="text or json.")] = "text",
) -> None:
    """Run a worker: claim, run and settle the jobs of MODULE:APP until SIGTERM or SIGINT."""
    from x_jobs.worker import Worker  # noqa: PLC0415 - the other commands do not need it

    setup_logging(log_level, log_format)
    app = load_app(app_path)
    if dsn is not None:
        app.dsn = dsn
    try:
        Worker(
            app,
            queues=queue or None,
            concurrency=concurrency,
            prefetch=prefetch,
            lease=lease,
            poll_interval=poll,
            grace=grace,
            build=build,
            metrics_port=metrics_port,
        ).run()
    except XJobsError as err:
        typer.echo(f"x-jobs: {err}", err=True)
        raise typer.Exit(2) from err


@cli.command()
def relay(
    app_path: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    concurrency: Annotated[int, typer.Option(help="Deliveries in flight at once.")] = 16,
    lease: Annotated[
        float, typer.Option(help="Lease of a claimed message, seconds (above sink timeouts).")
    ] = 60.0,
    poll: Annotated[float, typer.Option(help="Poll interval, seconds.")] = 1.0,
    grace: Annotated[float, typer.Option(help="Drain grace on SIGTERM, seconds.")] = 30.0,
    dsn: Annotated[str | None, typer.Option(help="Database; default DATABASE_URL or PG*.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: Annotated[str, typer.Option(help="text or json.")] = "text",
) -> None:
    """Run an outbox relay: deliver the messages of the topics MODULE:APP has sinks for
    (app.outbox.webhook / to_job / sink) until SIGTERM or SIGINT."""
    from x_jobs.relay import Relay  # noqa: PLC0415 - the other commands do not need it

    setup_logging(log_level, log_format)
    app = load_app(app_path)
    if dsn is not None:
        app.dsn = dsn
    try:
        Relay(app, concurrency=concurrency, lease=lease, poll_interval=poll, grace=grace).run()
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    except XJobsError as err:
        typer.echo(f"x-jobs: {err}", err=True)
        raise typer.Exit(2) from err


# --- the operator's commands ------------------------------------------------------------------

EXIT_REFUSED = 1
EXIT_USAGE = 2

Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="Database conninfo or URL; default DATABASE_URL, else libpq's PG* environment.",
        show_default=False,
    ),
]
AsJson = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")
]

CONNECT_HINT = (
    "Check --dsn, DATABASE_URL or the PG* variables (PGHOST, PGPORT, PGDATABASE, PGUSER), "
    "and that the server is running."
)
PRIVILEGE_HINT = (
    "Your role lacks a privilege x_jobs needs: have it granted x_jobs_admin "
    "(or x_jobs_producer, x_jobs_worker for less)."
)


@dataclass(frozen=True)
class JobRow:
    """A row of x_jobs.job as the operator reads it (``JOB_COLUMNS``)."""

    id: int
    name: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: datetime
    visible_at: datetime | None
    claimed_by: str | None
    tenant_id: str
    idempotency_key: str | None
    concurrency_key: str | None
    concurrency_limit: int | None
    dead_letter: bool
    keep_done: bool
    backoff_base: timedelta
    backoff_max: timedelta
    claims: int
    run_id: str
    traceparent: str | None
    enqueued_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    input: Any
    output: Any
    progress: Any
    last_error: str | None
    last_error_stack: str | None


@dataclass(frozen=True)
class JobErrorRow:
    """One failed attempt of a job (x_jobs.job_error)."""

    attempt: int
    failed_at: datetime
    worker: str | None
    error: str
    error_stack: str | None


@dataclass(frozen=True)
class EnqueuedRow:
    """What x_jobs.enqueue answers."""

    id: int
    run_id: str
    deduped: bool


@dataclass(frozen=True)
class QueueRow:
    """One queue of x_jobs.queue_stats()."""

    queue: str
    ready: int
    delayed: int
    suspended: int
    running: int
    demand: int
    paused: bool


@dataclass(frozen=True)
class StepRow:
    """A step a run reached (x_jobs.step, ``STEP_COLUMNS``)."""

    job_id: int
    name: str
    compensation: bool
    kind: str
    created_at: datetime
    event: str | None
    event_key: str | None
    match: Any
    since: datetime | None
    timeout_at: datetime | None
    status: str
    attempt: int
    output: Any
    error: str | None
    event_id: int | None
    resolved_by: str | None
    resolved_at: datetime | None


@dataclass(frozen=True)
class PublishedRow:
    """What x_jobs.publish answers."""

    event_id: int
    woken: int


@dataclass(frozen=True)
class OutboxRow:
    """A message of x_jobs.outbox as the operator reads it (``OUTBOX_COLUMNS``)."""

    id: int
    created_at: datetime
    max_attempts: int
    topic: str
    key: str | None
    headers: Any
    payload: Any
    state: str
    attempt: int
    available_at: datetime
    relay: str | None
    delivered_at: datetime | None
    last_error: str | None


JOB_COLUMNS: LiteralString = """
    id, name, queue, state::text AS state, attempt, max_attempts, priority, run_at, visible_at,
    claimed_by, tenant_id, idempotency_key, concurrency_key, concurrency_limit, dead_letter,
    keep_done, backoff_base, backoff_max, claims, run_id::text AS run_id, traceparent, enqueued_by,
    created_at, started_at, finished_at, updated_at, input, output, progress, last_error,
    last_error_stack
"""
# NULL is "the default" for every argument of enqueue but name. A delay counts from the
# database's clock, as App.enqueue does.
ENQUEUE: LiteralString = """
    SELECT id, run_id::text AS run_id, deduped
    FROM x_jobs.enqueue(
        name => %(name)s,
        input => %(input)s,
        queue => %(queue)s,
        run_at => coalesce(%(run_at)s::timestamptz, x_jobs.now() + %(delay)s::interval),
        idempotency_key => %(idempotency_key)s,
        max_attempts => %(max_attempts)s::integer,
        priority => %(priority)s::integer,
        tenant_id => %(tenant_id)s,
        keep_done => %(keep_done)s::boolean
    )
"""
LIST_JOBS: LiteralString = (
    "SELECT "
    + JOB_COLUMNS
    + """
    FROM x_jobs.list_jobs(state => %(state)s, queue => %(queue)s, before_id => %(before)s::bigint,
                          max_rows => %(limit)s::integer)
    ORDER BY id DESC
"""
)
# The API has no reader of one job; the admin role reads the table (list_jobs does the same).
SHOW_JOB: LiteralString = "SELECT " + JOB_COLUMNS + " FROM x_jobs.job WHERE id = %(id)s"
# Oldest first: after a retry, attempts count from 1 again, so the time orders them.
JOB_ERRORS: LiteralString = """
    SELECT attempt, failed_at, worker, error, error_stack
    FROM x_jobs.job_error
    WHERE job_id = %(id)s
    ORDER BY failed_at, attempt
"""
JOB_STATE: LiteralString = "SELECT state::text FROM x_jobs.job WHERE id = %(id)s"
RETRY: LiteralString = "SELECT x_jobs.retry(id => %(id)s)"
CANCEL: LiteralString = "SELECT x_jobs.cancel(id => %(id)s)"
QUEUE_STATS: LiteralString = """
    SELECT queue, ready, delayed, suspended, running, demand, paused FROM x_jobs.queue_stats()
"""
STEP_COLUMNS: LiteralString = """
    job_id, name, compensation, kind, created_at, event, event_key, match, since, timeout_at,
    status::text AS status, attempt, output, error, event_id, resolved_by, resolved_at
"""
# x_jobs.steps answers only the worker that holds the run; the operator reads the table, in the
# order x_jobs.steps answers: when the run reached each step, a step before its compensation.
JOB_STEPS: LiteralString = (
    "SELECT "
    + STEP_COLUMNS
    + """
    FROM x_jobs.step
    WHERE job_id = %(id)s
    ORDER BY created_at, compensation, name
"""
)
# NULL payload (no --payload) is the API's default; --payload null publishes JSON null.
PUBLISH: LiteralString = """
    SELECT event_id, woken
    FROM x_jobs.publish(event => %(event)s, payload => %(payload)s, key => %(key)s)
"""
RESOLVE_STEP: LiteralString = (
    "SELECT "
    + STEP_COLUMNS
    + " FROM x_jobs.resolve_step(job => %(job)s, step => %(step)s, output => %(output)s)"
)
PAUSE: LiteralString = "SELECT x_jobs.pause_queue(queue => %(queue)s)"
RESUME: LiteralString = "SELECT x_jobs.resume_queue(queue => %(queue)s)"
OUTBOX_COLUMNS: LiteralString = """
    id, created_at, max_attempts, topic, key, headers, payload, state::text AS state, attempt,
    available_at, relay, delivered_at, last_error
"""
OUTBOX_STATES: LiteralString = "SELECT pg_catalog.enum_range(NULL::x_jobs.outbox_state)::text[]"
# The API has no lister of the outbox; the admin role reads the table, newest first and paged by
# id as x_jobs.list_jobs pages jobs (the primary key, read backwards, serves every filter). The
# state is checked against OUTBOX_STATES first, so the cast cannot fail.
LIST_OUTBOX: LiteralString = (
    "SELECT "
    + OUTBOX_COLUMNS
    + """
    FROM x_jobs.outbox
    WHERE (%(state)s::text IS NULL OR state = %(state)s::x_jobs.outbox_state)
        AND (%(topic)s::text IS NULL OR topic = %(topic)s)
        AND (%(key)s::text IS NULL OR key = %(key)s)
        AND (%(before)s::bigint IS NULL OR id < %(before)s)
    ORDER BY id DESC
    LIMIT %(limit)s
"""
)
SHOW_OUTBOX: LiteralString = "SELECT " + OUTBOX_COLUMNS + " FROM x_jobs.outbox WHERE id = %(id)s"
# NULL ids or topic: no restriction there (the command refuses to pass both NULL).
REDRIVE: LiteralString = """
    SELECT x_jobs.outbox_redrive(
        ids => %(ids)s::bigint[], topic => %(topic)s, max_rows => %(limit)s::integer
    )
"""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


#: Columns for output that is no terminal (a pipe, a file): wide enough that `| grep name`
#: finds whole names, where rich would fold everything to 80.
PIPE_WIDTH = 200


def _width() -> int | None:
    """Rich's own choice in a terminal or under COLUMNS; PIPE_WIDTH otherwise."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return None
    return PIPE_WIDTH


class Output:
    """Where a command's answer goes: one JSON document on stdout, or text and tables for a
    person. Values from the database are always wrapped in ``Text``, so rich never reads them as
    markup."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, doc: Mapping[str, Any], *human: RenderableType | str) -> None:
        if self.as_json:
            typer.echo(json.dumps(doc, indent=2, ensure_ascii=False, default=_json_default))
            return
        console = Console(highlight=False, markup=False, emoji=False, width=_width())
        for part in human:
            console.print(Text(part) if isinstance(part, str) else part)

    def fail(
        self,
        exit_code: int,
        message: str,
        hint: str | None,
        *,
        code: str | None = None,
        sqlstate: str | None = None,
    ) -> NoReturn:
        """End the command: one line on stderr, then the hint (and the JSON error document)."""
        message = _first_line(message)
        typer.echo(f"x-jobs: {message}", err=True)
        if hint:
            typer.echo(f"hint: {hint}", err=True)
        if self.as_json:
            error = {"code": code, "sqlstate": sqlstate, "message": message, "hint": hint}
            typer.echo(json.dumps({"error": error}, indent=2, ensure_ascii=False))
        raise typer.Exit(exit_code)

    def refuse(self, exit_code: int, err: XJobsError) -> NoReturn:
        head = err.message.split(":", 1)[0]
        code = head if head.startswith("X_") and head.isupper() else err.code
        self.fail(exit_code, err.message, err.hint, code=code, sqlstate=err.sqlstate)


@contextmanager
def database(
    dsn: str | None, out: Output, *, check_version: bool = True
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the database ``dsn`` names (default: DATABASE_URL, else
    libpq's environment, as App() finds it), checked to hold an x_jobs this client speaks to.
    Whatever goes wrong inside ends the command as one line and a hint, never a traceback."""
    app = App(dsn)
    try:
        conn = psycopg.connect(app.dsn, autocommit=True, application_name="x-jobs")
    except psycopg.Error as err:
        out.fail(
            EXIT_USAGE,
            f"X_CONNECT_FAILED: cannot connect to the database: {_first_line(str(err))}",
            CONNECT_HINT,
            code="X_CONNECT_FAILED",
        )
    try:
        with conn:
            if check_version:
                app.check_version(conn)
            yield conn
    except VersionUnsupported as err:
        out.refuse(EXIT_USAGE, err)
    except XJobsError as err:
        out.refuse(EXIT_REFUSED, err)
    except psycopg.Error as err:
        if conn.broken:
            out.fail(
                EXIT_USAGE,
                f"X_CONNECTION_LOST: the database connection was lost: {_first_line(str(err))}",
                CONNECT_HINT,
                code="X_CONNECTION_LOST",
            )
        typed = translate(err)
        if isinstance(typed, XJobsError):
            out.refuse(EXIT_REFUSED, typed)
        hint = err.diag.message_hint
        if hint is None and isinstance(err, psycopg.errors.InsufficientPrivilege):
            hint = PRIVILEGE_HINT
        out.fail(EXIT_REFUSED, err.diag.message_primary or str(err), hint, sqlstate=err.sqlstate)


def _json_input(value: str, option: str = "--input") -> Any:
    """The JSON value an option gave; a usage error (exit 2) naming ``option`` otherwise."""

    # jsonb has no NaN or Infinity: refuse them here, like any other text that is not JSON.
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(value, parse_constant=no_constants)
    except ValueError as err:
        raise typer.BadParameter(f"not a JSON value ({err})", param_hint=f"'{option}'") from err


def _iso_datetime(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError as err:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 time, such as 2026-12-01T09:00:00+00:00"
        ) from err


def _when(value: datetime | None) -> str:
    """A time for a person: UTC, to the second (psycopg answers in the session's TimeZone)."""
    return "-" if value is None else value.astimezone(UTC).isoformat(sep=" ", timespec="seconds")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _table(title: str | None = None) -> Table:
    """A table in the manner of `ps`: no box, two spaces between columns, so more fits."""
    return Table(
        title=title,
        title_justify="left",
        box=None,
        padding=(0, 1),
        pad_edge=False,
        header_style="bold",
    )


def _fields(rows: list[tuple[str, RenderableType | str]]) -> Table:
    """A two-column grid of labels and values, for one record."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, Text(value) if isinstance(value, str) else value)
    return grid


@cli.command()
def enqueue(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The job's name (any name; no App needed).")
    ],
    input_json: Annotated[
        str, typer.Option("--input", metavar="JSON", help="The job's input, a JSON value.")
    ],
    queue: Annotated[
        str | None, typer.Option(help="Queue; default 'default'.", show_default=False)
    ] = None,
    run_at: Annotated[
        datetime | None,
        typer.Option(
            metavar="ISO8601",
            parser=_iso_datetime,
            help="Due time; without an offset, in the session's TimeZone.",
            show_default=False,
        ),
    ] = None,
    delay: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS", min=0, help="Due this long from now (the database's clock)."
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="A live job with this key answers instead (deduped).", show_default=False
        ),
    ] = None,
    priority: Annotated[
        int | None, typer.Option(help="Lower runs first; default 0.", show_default=False)
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Attempts before dead; default 25.", show_default=False)
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="Tenant id; default 'none'.", show_default=False)
    ] = None,
    keep_done: Annotated[
        bool | None,
        typer.Option(
            "--keep-done/--no-keep-done",
            help="Keep the row once done (the default), or delete it when it completes.",
            show_default=False,
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Enqueue one job with x_jobs.enqueue; prints its id, run_id and whether it was deduped."""
    out = Output(as_json)
    payload = _json_input(input_json)
    if run_at is not None and delay is not None:
        raise typer.BadParameter("give --run-at or --delay, not both", param_hint="'--delay'")
    params = {
        "name": name,
        "input": Jsonb(payload),
        "queue": queue,
        "run_at": run_at,
        "delay": None if delay is None else timedelta(seconds=delay),
        "idempotency_key": idempotency_key,
        "max_attempts": max_attempts,
        "priority": priority,
        "tenant_id": tenant,
        "keep_done": keep_done,
    }
    with database(dsn, out) as conn:
        row = conn.cursor(row_factory=class_row(EnqueuedRow)).execute(ENQUEUE, params).fetchone()
    assert row is not None  # enqueue answers one row or raises
    out.emit(
        dataclasses.asdict(row),
        _fields(
            [
                ("id", str(row.id)),
                ("run_id", row.run_id),
                ("deduped", "yes: a live job holds this key" if row.deduped else "no"),
            ]
        ),
    )


jobs_cli = typer.Typer(help="List, show, retry and cancel jobs.", no_args_is_help=True)
cli.add_typer(jobs_cli, name="jobs")


def _jobs_table(jobs: list[JobRow]) -> Table:
    # In a terminal of 80 columns the fixed columns stay narrow (times in UTC without the
    # offset) and name, queue and last error fold into what is left.
    table = _table()
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("name", overflow="fold", min_width=8)
    table.add_column("queue", overflow="fold", min_width=5)
    table.add_column("state", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("run at (UTC)", no_wrap=True)
    table.add_column("last error", overflow="fold", min_width=10, max_width=60)
    for job in jobs:
        table.add_row(
            Text(str(job.id)),
            Text(job.name),
            Text(job.queue),
            Text(job.state),
            Text(f"{job.attempt}/{job.max_attempts}"),
            Text(job.run_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")),
            Text(_first_line(job.last_error) if job.last_error else ""),
        )
    return table


@jobs_cli.command("list")
def jobs_list(
    state: Annotated[
        str | None, typer.Option(help="Only jobs in this state (dead, ready, ...).")
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only jobs of this queue.")] = None,
    before: Annotated[
        int | None,
        typer.Option(metavar="ID", help="Only ids below this one: the next page's start."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Rows per page, 1 to 1000.")] = 50,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Jobs newest first, one page at a time (x_jobs.list_jobs); page on with --before.

    After a full page it prints the command for the next one: --before the page's last id.
    """
    out = Output(as_json)
    params = {"state": state, "queue": queue, "before": before, "limit": limit}
    with database(dsn, out) as conn:
        jobs = conn.cursor(row_factory=class_row(JobRow)).execute(LIST_JOBS, params).fetchall()
    next_before = jobs[-1].id if len(jobs) == limit else None
    human: list[RenderableType | str] = [_jobs_table(jobs) if jobs else "no jobs"]
    if next_before is not None:
        args = ["x-jobs", "jobs", "list"]
        args += ["--state", state] if state is not None else []
        args += ["--queue", queue] if queue is not None else []
        args += ["--limit", str(limit)] if limit != 50 else []
        args += ["--before", str(next_before)]
        human.append(f"next page: {shlex.join(args)}")
    out.emit(
        {"jobs": [dataclasses.asdict(job) for job in jobs], "next_before": next_before}, *human
    )


def _errors_table(errors: list[JobErrorRow]) -> RenderableType:
    if not errors:
        return "no errors recorded"
    table = _table(title="errors, oldest first")
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("failed at", no_wrap=True)
    table.add_column("worker", overflow="fold")
    table.add_column("error", overflow="fold")
    for error in errors:
        message = Text(error.error)
        if error.error_stack:
            message.append("\n" + error.error_stack, style="dim")
        table.add_row(
            Text(str(error.attempt)),
            Text(_when(error.failed_at)),
            Text(_or_dash(error.worker)),
            message,
        )
    return table


def _number(value: object) -> str:
    """3.0 as 3: progress counts are double precision in SQL, whole numbers in practice."""
    if value is None:
        return "?"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _progress(progress: Any) -> str:
    """A job's progress for a person: ``3/10 (30%), note, at <UTC time>``; "-" when unset."""
    if not isinstance(progress, dict):
        return "-" if progress is None else json.dumps(progress, ensure_ascii=False)
    done, total = progress.get("done"), progress.get("total")
    parts = []
    if done is not None or total is not None:
        count = f"{_number(done)}/{_number(total)}"
        if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
            count += f" ({done / total:.0%})"
        parts.append(count)
    if progress.get("note") is not None:
        parts.append(str(progress["note"]))
    at = progress.get("at")
    if isinstance(at, str):
        try:
            parts.append(f"at {_when(datetime.fromisoformat(at))}")
        except ValueError:
            parts.append(f"at {at}")
    return ", ".join(parts) or "-"


#: Characters of a step's output or error in the steps table; --json has them whole.
SHORT = 60


def _shorten(text: str, limit: int = SHORT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _utc(value: datetime | None) -> str:
    """A time in a table: UTC without the offset (the header says UTC), as `jobs list`."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _steps_table(steps: list[StepRow]) -> RenderableType:
    if not steps:
        return "no steps recorded"
    # Rich narrows the widest foldable columns first, evenly, and crops cells when the columns'
    # min_width add up to more than it has. So no min_width: below 140 columns the times get a
    # fixed width that puts the time under the date, and name, event and output share the rest.
    narrow = Console(width=_width()).width < 140
    times: dict[str, Any] = {"width": 10} if narrow else {"no_wrap": True}
    table = _table(title="steps, in the order the run reached them")
    table.add_column("step", overflow="fold")
    table.add_column("kind", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("event", overflow="fold")
    table.add_column("timeout at (UTC)", overflow="fold", **times)
    table.add_column("resolved (UTC)", overflow="fold", **times)
    table.add_column("output / error", overflow="fold")
    for step in steps:
        name = Text(step.name)
        if step.compensation:
            name.append(" (compensation)", style="italic")
        event = "-"
        if step.event is not None:
            event = step.event if step.event_key is None else f"{step.event} key={step.event_key}"
        if step.error is not None:
            result = Text(_shorten(_first_line(step.error)), style="red")
        elif step.output is not None:
            result = Text(_shorten(json.dumps(step.output, ensure_ascii=False)))
        else:
            result = Text("-")
        table.add_row(
            name,
            Text(step.kind),
            Text(step.status),
            Text(str(step.attempt)),
            Text(event),
            Text(_utc(step.timeout_at)),
            Text(
                "-" if step.resolved_by is None else f"{step.resolved_by} {_utc(step.resolved_at)}"
            ),
            result,
        )
    return table


def _job_fields(job: JobRow) -> Table:
    concurrency = (
        f"{job.concurrency_key} (limit {job.concurrency_limit})" if job.concurrency_key else "-"
    )
    return _fields(
        [
            ("id", str(job.id)),
            ("name", job.name),
            ("queue", job.queue),
            ("state", job.state),
            ("attempt", f"{job.attempt}/{job.max_attempts}"),
            ("priority", str(job.priority)),
            ("run at", _when(job.run_at)),
            ("lease until", _when(job.visible_at)),
            ("claimed by", _or_dash(job.claimed_by)),
            ("tenant", job.tenant_id),
            ("idempotency key", _or_dash(job.idempotency_key)),
            ("concurrency", concurrency),
            ("dead letter", "yes" if job.dead_letter else "no"),
            ("kept when done", "yes" if job.keep_done else "no (deleted)"),
            ("backoff", f"{job.backoff_base} .. {job.backoff_max}"),
            ("claims", str(job.claims)),
            ("run id", job.run_id),
            ("traceparent", _or_dash(job.traceparent)),
            ("enqueued by", _or_dash(job.enqueued_by)),
            ("created", _when(job.created_at)),
            ("started", _when(job.started_at)),
            ("finished", _when(job.finished_at)),
            ("updated", _when(job.updated_at)),
            ("input", JSON.from_data(job.input)),
            ("output", "-" if job.output is None else JSON.from_data(job.output)),
            ("progress", _progress(job.progress)),
            ("last error", _or_dash(job.last_error)),
            ("stack", _or_dash(job.last_error_stack)),
        ]
    )


def _not_found(job_id: int) -> JobNotFound:
    # The words x_jobs.cancel and x_jobs.retry raise for XJ014.
    return JobNotFound(
        f"X_JOB_NOT_FOUND: no job has id {job_id}",
        hint="Check the id; finished jobs are removed by purge after their retention.",
    )


JobId = Annotated[int, typer.Argument(metavar="ID", help="The job's id.")]


@jobs_cli.command("show")
def jobs_show(job_id: JobId, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """One job: its row and progress, its steps in the order the run reached them (x_jobs.step),
    then every failed attempt from x_jobs.job_error, oldest first."""
    out = Output(as_json)
    # REPEATABLE READ: one snapshot for the row, its steps and its errors, which autocommit's
    # READ COMMITTED would give each statement on its own.
    with database(dsn, out) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        job = conn.cursor(row_factory=class_row(JobRow)).execute(SHOW_JOB, {"id": job_id})
        row = job.fetchone()
        if row is None:
            raise _not_found(job_id)
        steps = (
            conn.cursor(row_factory=class_row(StepRow))
            .execute(JOB_STEPS, {"id": job_id})
            .fetchall()
        )
        cur = conn.cursor(row_factory=class_row(JobErrorRow))
        errors = cur.execute(JOB_ERRORS, {"id": job_id}).fetchall()
    out.emit(
        {
            "job": dataclasses.asdict(row),
            "progress": row.progress,
            "steps": [dataclasses.asdict(s) for s in steps],
            "errors": [dataclasses.asdict(e) for e in errors],
        },
        _job_fields(row),
        "",
        _steps_table(steps),
        "",
        _errors_table(errors),
    )


@jobs_cli.command("retry")
def jobs_retry(job_id: JobId, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Re-queue a dead, failed or cancelled job (x_jobs.retry): due now, attempts from 0."""
    out = Output(as_json)
    with database(dsn, out) as conn, conn.transaction():
        conn.execute(RETRY, {"id": job_id})
        row = conn.execute(JOB_STATE, {"id": job_id}).fetchone()
    state = None if row is None else str(row[0])
    out.emit(
        {"id": job_id, "retried": True, "state": state},
        f"job {job_id} re-queued: {state}, its attempts start over",
    )


@jobs_cli.command("cancel")
def jobs_cancel(job_id: JobId, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Cancel a live job (x_jobs.cancel); a job that had finished already is left as it is."""
    out = Output(as_json)
    with database(dsn, out) as conn, conn.transaction():
        answer = conn.execute(CANCEL, {"id": job_id}).fetchone()
        row = conn.execute(JOB_STATE, {"id": job_id}).fetchone()
    cancelled = bool(answer and answer[0])
    state = None if row is None else str(row[0])
    out.emit(
        {"id": job_id, "cancelled": cancelled, "state": state},
        f"job {job_id} cancelled"
        if cancelled
        else f"job {job_id} had already finished ({state}); nothing changed",
    )


events_cli = typer.Typer(help="Publish events to waiting workflow runs.", no_args_is_help=True)
cli.add_typer(events_cli, name="events")


@events_cli.command("publish")
def events_publish(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The event, such as order.paid.")],
    payload_json: Annotated[
        str | None,
        typer.Option(
            "--payload",
            metavar="JSON",
            help="The event's payload, a JSON value: the output of the waits it resolves.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="Wake only the waits on this key (and those naming no key).", show_default=False
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Publish an event (x_jobs.publish): the waits that match it are done with its payload and
    their suspended runs are due at once. Prints the event's id and how many runs it woke."""
    out = Output(as_json)
    payload = None if payload_json is None else Jsonb(_json_input(payload_json, "--payload"))
    params = {"event": name, "payload": payload, "key": key}
    with database(dsn, out) as conn, conn.transaction():
        cur = conn.cursor(row_factory=class_row(PublishedRow))
        row = cur.execute(PUBLISH, params).fetchone()
    assert row is not None  # publish answers one row or raises
    keyed = f" with key {key!r}" if key is not None else ""
    woke = "no run waited for it" if row.woken == 0 else f"woke {row.woken} run"
    woke += "s" if row.woken > 1 else ""
    out.emit(
        dataclasses.asdict(row),
        f"event {name!r}{keyed} published as id {row.event_id}: {woke}",
    )


steps_cli = typer.Typer(help="Resolve the waiting steps of workflow runs.", no_args_is_help=True)
cli.add_typer(steps_cli, name="steps")


@steps_cli.command("resolve")
def steps_resolve(
    job_id: Annotated[int, typer.Argument(metavar="JOB", help="The job's id.")],
    step: Annotated[str, typer.Argument(metavar="STEP", help="The step's name.")],
    output_json: Annotated[
        str | None,
        typer.Option(
            "--output",
            metavar="JSON",
            help="The step's output, a JSON value: what the run's wait or sleep answers.",
            show_default=False,
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Resolve a waiting step by hand (x_jobs.resolve_step): a sleep ends now, a wait is done
    with --output, and the suspended run is due at once. Refused while a worker holds the job."""
    out = Output(as_json)
    output = None if output_json is None else Jsonb(_json_input(output_json, "--output"))
    params = {"job": job_id, "step": step, "output": output}
    with database(dsn, out) as conn, conn.transaction():
        cur = conn.cursor(row_factory=class_row(StepRow))
        row = cur.execute(RESOLVE_STEP, params).fetchone()
        state = conn.execute(JOB_STATE, {"id": job_id}).fetchone()
    assert row is not None  # resolve_step answers the step or raises
    job_state = None if state is None else str(state[0])
    out.emit(
        {"step": dataclasses.asdict(row), "state": job_state},
        _fields(
            [
                ("job", str(row.job_id)),
                ("step", row.name),
                ("kind", row.kind),
                ("status", row.status),
                ("output", "-" if row.output is None else JSON.from_data(row.output)),
                ("resolved by", _or_dash(row.resolved_by)),
                ("resolved at", _when(row.resolved_at)),
            ]
        ),
        f"job {row.job_id} is {job_state}",
    )


queues_cli = typer.Typer(help="Queues: live jobs per state, demand, pauses.")
cli.add_typer(queues_cli, name="queues")


@queues_cli.callback(invoke_without_command=True)
def queues(ctx: typer.Context, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Per queue: live jobs by state, demand, paused (x_jobs.queue_stats); pause or resume one.

    Queues with no live job and no pause are absent. `pause` holds a queue back from every claim,
    `resume` lets it go.
    """
    if ctx.invoked_subcommand is not None:
        return  # pause/resume read --dsn/--json given here from ctx.parent
    out = Output(as_json)
    with database(dsn, out) as conn:
        rows = conn.cursor(row_factory=class_row(QueueRow)).execute(QUEUE_STATS).fetchall()
    table = _table()
    for column in ("queue", "ready", "delayed", "suspended", "running", "demand", "paused"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for q in rows:
        counts = (q.ready, q.delayed, q.suspended, q.running, q.demand)
        table.add_row(
            Text(q.queue), *(Text(str(n)) for n in counts), Text("yes" if q.paused else "no")
        )
    out.emit(
        {"queues": [dataclasses.asdict(q) for q in rows]},
        table if rows else "no queue has live jobs or a pause",
    )


def _inherited(ctx: typer.Context, dsn: str | None, as_json: bool) -> tuple[str | None, bool]:
    """--dsn and --json given to `queues` before the subcommand count for it too."""
    parent = ctx.parent.params if ctx.parent is not None else {}
    return (dsn if dsn is not None else parent.get("dsn")), as_json or bool(parent.get("as_json"))


def _toggle(ctx: typer.Context, name: str, dsn: str | None, as_json: bool, pause: bool) -> None:
    dsn, as_json = _inherited(ctx, dsn, as_json)
    out = Output(as_json)
    with database(dsn, out) as conn:
        row = conn.execute(PAUSE if pause else RESUME, {"queue": name}).fetchone()
    changed = bool(row and row[0])
    if pause:
        said = f"queue {name} paused" if changed else f"queue {name} was paused already"
    else:
        said = f"queue {name} resumed" if changed else f"queue {name} was not paused"
    out.emit({"queue": name, "paused": pause, "changed": changed}, said)


QueueName = Annotated[str, typer.Argument(metavar="NAME", help="The queue.")]


@queues_cli.command("pause")
def queues_pause(
    ctx: typer.Context, name: QueueName, dsn: Dsn = None, as_json: AsJson = False
) -> None:
    """Hold a queue back from every claim (x_jobs.pause_queue); running jobs finish."""
    _toggle(ctx, name, dsn, as_json, pause=True)


@queues_cli.command("resume")
def queues_resume(
    ctx: typer.Context, name: QueueName, dsn: Dsn = None, as_json: AsJson = False
) -> None:
    """Let a paused queue be claimed again (x_jobs.resume_queue)."""
    _toggle(ctx, name, dsn, as_json, pause=False)


outbox_cli = typer.Typer(
    help="List and show outbox messages, send dead ones again.", no_args_is_help=True
)
cli.add_typer(outbox_cli, name="outbox")

#: The page sizes `outbox list` takes, as x_jobs.list_jobs for `jobs list`.
OUTBOX_PAGE = range(1, 1001)


class MessageNotFound(ClientError):
    """No outbox message has the id an outbox command was given."""

    code = "X_MESSAGE_NOT_FOUND"


def _outbox_table(messages: list[OutboxRow]) -> Table:
    # As `jobs list`: the fixed columns stay narrow, topic, key and last error fold.
    table = _table()
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("topic", overflow="fold", min_width=8)
    table.add_column("key", overflow="fold", min_width=5)
    table.add_column("state", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("available at (UTC)", no_wrap=True)
    table.add_column("last error", overflow="fold", min_width=10, max_width=SHORT)
    for message in messages:
        table.add_row(
            Text(str(message.id)),
            Text(message.topic),
            Text(_or_dash(message.key)),
            Text(message.state),
            Text(f"{message.attempt}/{message.max_attempts}"),
            Text(_utc(message.available_at)),
            Text(_shorten(_first_line(message.last_error)) if message.last_error else ""),
        )
    return table


def _literal(text: str) -> str:
    """``text`` quoted as SQL's %L does, so the refusal reads as the one `jobs list` prints."""
    return "'" + text.replace("'", "''") + "'"


@outbox_cli.command("list")
def outbox_list(
    state: Annotated[
        str | None,
        typer.Option(help="Only messages in this state (pending, inflight, delivered, dead)."),
    ] = None,
    topic: Annotated[str | None, typer.Option(help="Only messages of this topic.")] = None,
    key: Annotated[str | None, typer.Option(help="Only messages of this key.")] = None,
    before: Annotated[
        int | None,
        typer.Option(metavar="ID", help="Only ids below this one: the next page's start."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Rows per page, 1 to 1000.")] = 50,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Outbox messages newest first, one page at a time (x_jobs.outbox); page on with --before.

    After a full page it prints the command for the next one: --before the page's last id.
    """
    out = Output(as_json)
    params = {"state": state, "topic": topic, "key": key, "before": before, "limit": limit}
    with database(dsn, out) as conn:
        # The refusals x_jobs.list_jobs makes for `jobs list`, in its order.
        if state is not None:
            row = conn.execute(OUTBOX_STATES).fetchone()
            states: list[str] = [] if row is None else list(row[0])
            if state not in states:
                raise StateUnknown(
                    f"X_STATE_UNKNOWN: {_literal(state)} is not an outbox state",
                    hint=f"Use one of: {', '.join(states)}.",
                )
        if limit not in OUTBOX_PAGE:
            raise QtyInvalid(
                f"X_QTY_INVALID: --limit {limit} is outside 1..1000",
                hint="Ask for a page of 1 to 1000 rows and page on with --before.",
            )
        cur = conn.cursor(row_factory=class_row(OutboxRow))
        messages = cur.execute(LIST_OUTBOX, params).fetchall()
    next_before = messages[-1].id if len(messages) == limit else None
    human: list[RenderableType | str] = [_outbox_table(messages) if messages else "no messages"]
    if next_before is not None:
        args = ["x-jobs", "outbox", "list"]
        args += ["--state", state] if state is not None else []
        args += ["--topic", topic] if topic is not None else []
        args += ["--key", key] if key is not None else []
        args += ["--limit", str(limit)] if limit != 50 else []
        args += ["--before", str(next_before)]
        human.append(f"next page: {shlex.join(args)}")
    out.emit(
        {"messages": [dataclasses.asdict(m) for m in messages], "next_before": next_before},
        *human,
    )


@outbox_cli.command("show")
def outbox_show(
    message_id: Annotated[int, typer.Argument(metavar="ID", help="The message's id.")],
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """One outbox message: every column, its headers and payload as JSON."""
    out = Output(as_json)
    with database(dsn, out) as conn:
        cur = conn.cursor(row_factory=class_row(OutboxRow))
        row = cur.execute(SHOW_OUTBOX, {"id": message_id}).fetchone()
        if row is None:
            raise MessageNotFound(
                f"X_MESSAGE_NOT_FOUND: no outbox message has id {message_id}",
                hint="Check the id with `x-jobs outbox list`; delivered messages are removed "
                "by purge_outbox after their retention.",
            )
    out.emit(
        {"message": dataclasses.asdict(row)},
        _fields(
            [
                ("id", str(row.id)),
                ("topic", row.topic),
                ("key", _or_dash(row.key)),
                ("state", row.state),
                ("attempt", f"{row.attempt}/{row.max_attempts}"),
                ("available at", _when(row.available_at)),
                ("relay", _or_dash(row.relay)),
                ("created", _when(row.created_at)),
                ("delivered", _when(row.delivered_at)),
                ("last error", _or_dash(row.last_error)),
                ("headers", JSON.from_data(row.headers)),
                ("payload", JSON.from_data(row.payload)),
            ]
        ),
    )


@outbox_cli.command("redrive")
def outbox_redrive(
    message_ids: Annotated[
        list[int] | None,
        typer.Argument(metavar="ID", help="Dead messages to send again.", show_default=False),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(help="Every dead message of this topic (with IDs: only those of it)."),
    ] = None,
    limit: Annotated[
        int, typer.Option(help="At most this many, oldest first, 1 to 100000.")
    ] = 1000,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Send dead messages again (x_jobs.outbox_redrive): pending, due now, attempts from 0.

    Name them by ID, by --topic or both; a bare `redrive` is refused, never all by accident.

    Prints how many were dead and went back.
    """
    out = Output(as_json)
    ids = list(dict.fromkeys(message_ids or []))
    if not ids and topic is None:
        raise typer.BadParameter(
            "name the dead messages to send again: give their IDs, --topic, or both",
            param_hint="'ID' / '--topic'",
        )
    params = {"ids": ids or None, "topic": topic, "limit": limit}
    with database(dsn, out) as conn:
        row = conn.execute(REDRIVE, params).fetchone()
    redriven = 0 if row is None else int(row[0])
    if redriven == 0:
        said = "no dead message matched; nothing changed"
    else:
        said = f"{redriven} dead message{'s' if redriven > 1 else ''} sent again"
        if ids and redriven < len(ids):
            said += f"; {len(ids) - redriven} of the ids named no dead message"
        elif not ids and redriven == limit:
            said += f"; there may be more: run it again to send the next {limit}"
    out.emit({"redriven": redriven, "ids": ids, "topic": topic, "limit": limit}, said)


DEFAULT_RETENTION = Retention()


def _age(value: str | timedelta | None) -> timedelta | None:
    """An --AGE option's value (click passes the defaults through here too, already parsed)."""
    if value is None or isinstance(value, timedelta):
        return value
    try:
        return parse_age(value)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err


def _age_option(kind: str, what: str) -> Any:
    default: timedelta | None = getattr(DEFAULT_RETENTION, kind)
    return typer.Option(
        f"--{kind}",
        metavar="AGE",
        parser=_age,
        help=f"Keep {what} this long (or off).",
        show_default="off" if default is None else f"{default.days}d",
    )


def _for_a_person(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


@cli.command("maintain")
def maintain_command(
    jobs: Annotated[
        timedelta | None, _age_option("jobs", "finished jobs, their errors and steps")
    ] = DEFAULT_RETENTION.jobs,
    events: Annotated[
        timedelta | None, _age_option("events", "published events")
    ] = DEFAULT_RETENTION.events,
    outbox: Annotated[
        timedelta | None, _age_option("outbox", "delivered outbox messages")
    ] = DEFAULT_RETENTION.outbox,
    webhooks: Annotated[
        timedelta | None, _age_option("webhooks", "the ledger of received webhooks")
    ] = DEFAULT_RETENTION.webhooks,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Rows per purge call, each its own transaction.")
    ] = 10_000,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Delete what is past its retention and fold old counters (x_jobs.purge and its kin).

    AGE: a number and a unit (30s, 90m, 36h, 7d, 2w), or off to keep that kind for good.

    Needs x_jobs_admin. Run it every hour or so (cron, a Kubernetes CronJob).
    """
    out = Output(as_json)
    retention = Retention(jobs=jobs, events=events, outbox=outbox, webhooks=webhooks)
    with database(dsn, out) as conn:
        done = maintenance.maintain(conn, retention, batch_size)
    table = _table()
    for column in ("rows", "kept for", "deleted"):
        table.add_column(column, justify="right" if column == "deleted" else "left")
    purged: dict[str, Any] = {}
    for kind, (label, _) in maintenance.PURGES.items():
        age: timedelta | None = getattr(retention, kind)
        deleted = done.deleted.get(kind)
        purged[kind] = {"older_than": age, "deleted": deleted}
        table.add_row(
            label,
            "ever (off)" if age is None else _for_a_person(age),
            "-" if deleted is None else f"{deleted:,}",
        )
    out.emit(
        {"purged": purged, "counters_folded": done.counters_folded},
        table,
        f"{done.counters_folded:,} old counter buckets folded into wider ones",
    )


@cli.command("install")
def install_command(dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Install or upgrade x_jobs where CREATE EXTENSION cannot be used (managed services).

    Runs the extension's own versioned scripts as plain SQL, in one transaction: the full script
    when nothing is installed, the upgrade scripts from the installed x_jobs.version() on, or
    nothing when the newest is installed. Refuses a database that has the extension.
    """
    out = Output(as_json)
    with database(dsn, out, check_version=False) as conn:
        done = installer.install(conn)
    if not done.changed:
        said = f"x_jobs {done.after} is installed and current; nothing changed"
    elif done.before is None:
        said = f"installed x_jobs {done.after} ({', '.join(done.scripts)})"
    else:
        said = f"upgraded x_jobs {done.before} -> {done.after} ({', '.join(done.scripts)})"
    out.emit(
        {
            "before": done.before,
            "after": done.after,
            "scripts": list(done.scripts),
            "changed": done.changed,
        },
        said,
    )


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
