"""The ``x-jobs`` command line (also ``python -m x_jobs``).

``worker`` runs the jobs of an App, ``relay`` delivers its outbox. The operator's commands call
the SQL API and print what it answers: ``enqueue``, ``jobs list|show|retry|cancel``,
``outbox list|show|redrive``, ``events publish``, ``steps resolve``, ``queues [pause|resume]``,
``manifest`` (the job declarations), and ``install`` (the schema without CREATE EXTENSION, see
:mod:`x_jobs.install`). Each takes ``--dsn`` (default ``DATABASE_URL``, else libpq's PG*
environment, as ``App()``) and ``--json`` (one JSON document on stdout instead of tables).

Exit codes: 0 done; 1 the database refused what was asked (an x_jobs refusal such as
X_JOB_NOT_FOUND, one this client makes in the same manner such as X_MESSAGE_NOT_FOUND, or any
other SQL error, X_DATABASE_ERROR with its SQLSTATE); 2 the command could not do its work as it
was set up (bad arguments, an input jsonb cannot store, a bad DSN, an unreachable server, a
database without x_jobs or with a version this client cannot speak to, a login without the
x_jobs role it needs; whatever stops a worker or relay from serving). An error is one line on
stderr, then a hint; with ``--json`` stdout also gets ``{"error": {...}}`` whose code is never
null (X_USAGE for a usage error). A DSN's password is never printed (``***``).
Every time is read in UTC (the session's TimeZone is pinned to it); a ``--run-at`` without an
offset is still read in the session's own TimeZone.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import os
import re
import shlex
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, LiteralString, NoReturn

import psycopg
import typer
from psycopg.abc import Buffer
from psycopg.rows import class_row
from psycopg.types.datetime import IntervalLoader, TimestamptzLoader
from psycopg.types.json import set_json_loads
from rich.console import Console, RenderableType
from rich.highlighter import JSONHighlighter
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from x_jobs import declarations, maintenance
from x_jobs import install as installer
from x_jobs._conn import HIDDEN, connect, has_password, redact
from x_jobs._listen import LISTEN_DSN_ENV
from x_jobs.app import App
from x_jobs.errors import (
    ClientError,
    JobNotFound,
    PermissionDenied,
    StateUnknown,
    VersionUnsupported,
    XJobsError,
    translate,
)
from x_jobs.maintenance import Retention, parse_age

try:  # typer 0.2x parses with a copy of click of its own
    from typer._click.core import Context as ClickContext
    from typer._click.exceptions import UsageError
except ImportError:  # older typers use click itself
    from click import Context as ClickContext  # type: ignore[assignment]
    from click import UsageError  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: Where _Commands notes whether --json is among the arguments (ctx.meta is shared by every
#: context of one run).
WANTS_JSON = "x_jobs.wants_json"


def _wants_json(args: list[str]) -> bool:
    """Whether ``--json`` is among the arguments (before a ``--``, after which none is an
    option)."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


class _Commands(TyperGroup):
    """The ``x-jobs`` group. With --json among the arguments, a usage error (a bad or missing
    option, an unknown command, a BadParameter a command raises) ends as every other error of
    a --json command does: one line and a hint on stderr, ``{"error": {...}}`` with code
    X_USAGE on stdout, exit 2; not click's box alone on stderr. Click raises those errors while
    it parses (make_context) and, for subcommands, inside the group's invoke: both pass here.
    """

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: ClickContext | None = None,
        **extra: Any,
    ) -> ClickContext:
        wants_json = _wants_json(args)
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except UsageError as err:
            if wants_json:
                _usage_failed(err)
            raise
        ctx.meta[WANTS_JSON] = wants_json
        return ctx

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            if ctx.meta.get(WANTS_JSON):
                _usage_failed(err)
            raise


def _usage_failed(err: UsageError) -> NoReturn:
    hint = None
    if err.ctx is not None:
        hint = f"Try '{err.ctx.command_path} {err.ctx.help_option_names[0]}' for help."
    Output(as_json=True).fail(EXIT_USAGE, err.format_message(), hint, code="X_USAGE")


cli = typer.Typer(
    name="x-jobs",
    cls=_Commands,
    help="Operate x_jobs: run workers, enqueue, inspect and steer jobs and queues.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@cli.callback()
def _commands() -> None:
    """Operate x_jobs: run workers, enqueue, inspect and steer jobs and queues."""


#: The attributes every log record has; the others are the fields a call passed as ``extra``.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}


class TextLogFormatter(logging.Formatter):
    """A line per record: time, level, logger, message, then the extra fields as key=value
    (the job id, the error): without them "job failed" or "claiming was refused" says neither
    which nor why."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc_ts(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={_logfmt(v)}" for k, v in _extra(record).items())
        if fields:
            head, newline, rest = line.partition("\n")  # after the message, before a traceback
            line = f"{head} {fields}{newline}{rest}"
        return redact(line)  # a DSN's password, in a connection error of psycopg's pool say


def _logfmt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\n\\'):
        return text
    return json.dumps(text)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _utc_ts(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extra(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(entry, default=str))


def _utc_ts(record: logging.LogRecord) -> str:
    """A log record's time in UTC to the millisecond, as ISO 8601 with a Z:
    2026-11-30T19:26:50.123Z, whatever the process's time zone."""
    when = datetime.fromtimestamp(int(record.created), UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{int(record.msecs):03d}Z"


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(TextLogFormatter())
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


#: The level names logging knows, as setup_logging hands them over (any case).
LOG_LEVELS = ("debug", "info", "warning", "warn", "error", "critical", "fatal", "notset")
#: The longest duration a worker or relay option takes, about 31 years: longer ones overflow
#: timedelta (an SQL interval) or a thread's wait.
MAX_SECONDS = 1e9


def _log_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not a log level: use debug, info, warning or error")
    return value.lower()


def _log_format(value: str) -> str:
    if value.lower() not in ("text", "json"):
        raise typer.BadParameter(f"{value!r} is not a log format: use text or json")
    return value.lower()


def _seconds(least: float) -> Callable[[str | float], float]:
    """A parser of an option in seconds: a finite number from ``least`` to MAX_SECONDS (click
    passes the default through it too, already a float)."""

    def parse(value: str | float) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not least <= number <= MAX_SECONDS:  # NaN too
            raise typer.BadParameter(
                f"{value!r} is not a number of seconds from {least:g} to {MAX_SECONDS:.0f}"
            )
        return number

    return parse


def _whole(least: int, most: int) -> Callable[[str | int], int]:
    """A parser of a whole number from ``least`` to ``most``, whose refusal names the range
    (click passes the default through it too, already an int)."""

    def parse(value: str | int) -> int:
        try:
            number = int(value)
        except ValueError as err:
            raise typer.BadParameter(f"{value!r} is not a whole number") from err
        if not least <= number <= most:
            raise typer.BadParameter(f"{number} is outside {least}..{most}")
        return number

    return parse


def _metrics_port(value: str | int) -> int:
    """--metrics-port: 1 to 65535. Not 0 (any free port): the worker and the relay log the port
    they were given, not the one they bound, so nobody could learn where the metrics are."""
    try:
        port = int(value)
    except ValueError:
        port = -1
    if port == 0:
        raise typer.BadParameter(
            "0 (any free port) is refused: the worker would not say which port it bound;"
            " give a port from 1 to 65535"
        )
    if not 1 <= port <= 65535:
        raise typer.BadParameter(f"{value!r} is not a port from 1 to 65535")
    return port


# A lease under a second can lapse before the worker extends it (and under 1 µs is no SQL
# interval); a poll under 10 ms is a hot loop of claims; a grace under 0 makes the first signal
# a second one.
LEASE_LEAST, POLL_LEAST = 1.0, 0.01
#: The most jobs a worker holds (x_jobs.claim's qty) and messages a relay has in flight
#: (x_jobs.relay_outbox's qty): more threads than that would only wait.
MAX_CONCURRENCY = 1000
LogLevel = Annotated[
    str,
    typer.Option(parser=_log_level, help="debug, info, warning, error (or critical)."),
]
LogFormat = Annotated[str, typer.Option(parser=_log_format, help="text or json.")]
Poll = Annotated[
    float, typer.Option(parser=_seconds(POLL_LEAST), help="Poll interval, seconds (0.01 or more).")
]
Grace = Annotated[
    float, typer.Option(parser=_seconds(0), help="Drain grace on SIGTERM, seconds (0 or more).")
]
MetricsPort = Annotated[
    int | None,
    typer.Option(parser=_metrics_port, help="Serve Prometheus metrics on this port (1 to 65535)."),
]


#: x_jobs.metrics.DEFAULT_HOST, not imported from there: the other commands need no
#: prometheus_client (a tenth of the start-up time of a command).
METRICS_HOST = "0.0.0.0"


def _metrics_host(value: str) -> str:
    if not value.strip():
        raise typer.BadParameter("an empty host: give an address such as 0.0.0.0 or 127.0.0.1")
    return value.strip()


MetricsHost = Annotated[
    str,
    typer.Option(
        parser=_metrics_host,
        envvar="X_JOBS_METRICS_HOST",
        help="The address --metrics-port listens on: 0.0.0.0 (every IPv4 interface, for a"
        " Prometheus on another host), 127.0.0.1 (this machine only), :: (IPv6 too), or a name.",
    ),
]

ListenDsn = Annotated[
    str | None,
    typer.Option(
        envvar=LISTEN_DSN_ENV,
        show_envvar=True,
        help="Where to LISTEN for wake-ups when --dsn goes through a pooler in transaction"
        " mode: a direct or session-mode DSN (default: --dsn).",
    ),
]


@cli.command()
def worker(
    app_path: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="A queue to serve (repeatable).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(parser=_whole(1, MAX_CONCURRENCY), help="Jobs run at once (1 to 1000).")
    ] = 10,
    prefetch: Annotated[
        int | None,
        typer.Option(min=0, help="Claimed jobs waiting in a local queue (default: concurrency)."),
    ] = None,
    lease: Annotated[
        float,
        typer.Option(parser=_seconds(LEASE_LEAST), help="Lease of a claimed job, seconds (1+)."),
    ] = 30.0,
    poll: Poll = 1.0,
    grace: Grace = 30.0,
    build: Annotated[str | None, typer.Option(help="Build id announced by the worker.")] = None,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = METRICS_HOST,
    dsn: Annotated[str | None, typer.Option(help="Database; default DATABASE_URL or PG*.")] = None,
    listen_dsn: ListenDsn = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run a worker: claim, run and settle the jobs of MODULE:APP until SIGTERM or SIGINT."""
    from x_jobs.worker import Worker  # noqa: PLC0415 - the other commands do not need it

    setup_logging(log_level, log_format)
    app = load_app(app_path)
    if dsn is not None:
        app.dsn = dsn
    out = _LoopOutput(log_format == "json")
    loop: Worker | None = None
    try:
        loop = Worker(
            app,
            queues=queue or None,
            concurrency=concurrency,
            prefetch=prefetch,
            lease=lease,
            poll_interval=poll,
            grace=grace,
            build=build,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            listen_dsn=listen_dsn,
        )
        # The process ends with the worker, and the handlers still running with it: a drain
        # whose grace runs out hands their jobs back for another worker to take at once.
        loop.run(process_exits=True)
    except ValueError as err:
        if loop is not None:
            raise  # not the Worker's refusal of its arguments
        # An App without jobs and no --queue: nothing to serve.
        out.usage(str(err), "'MODULE:APP' / '--queue'")
    except XJobsError as err:
        # A database without x_jobs (or too old), a login without x_jobs_worker, a metrics port
        # another process holds, a --queue the claim refuses (X_QUEUES_INVALID): its setup.
        out.refuse(EXIT_USAGE, err)
    except psycopg.Error as err:
        if loop is not None and loop.wait_stopped(0):
            raise  # it ran: no start-up failure (it rides out a lost connection itself)
        _start_failed(out, err)


@cli.command()
def relay(
    app_path: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    concurrency: Annotated[
        int,
        typer.Option(
            parser=_whole(1, MAX_CONCURRENCY), help="Deliveries in flight at once (1 to 1000)."
        ),
    ] = 16,
    lease: Annotated[
        float,
        typer.Option(
            parser=_seconds(LEASE_LEAST),
            help="Lease of a claimed message, seconds (1+; extended while it is delivered).",
        ),
    ] = 60.0,
    poll: Poll = 1.0,
    grace: Grace = 30.0,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = METRICS_HOST,
    dsn: Annotated[str | None, typer.Option(help="Database; default DATABASE_URL or PG*.")] = None,
    listen_dsn: ListenDsn = None,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run an outbox relay: deliver the messages of the topics MODULE:APP has sinks for
    (app.outbox.webhook / to_job / sink) until SIGTERM or SIGINT."""
    from x_jobs.relay import Relay  # noqa: PLC0415 - the other commands do not need it

    setup_logging(log_level, log_format)
    app = load_app(app_path)
    if dsn is not None:
        app.dsn = dsn
    out = _LoopOutput(log_format == "json")
    loop: Relay | None = None
    try:
        loop = Relay(
            app,
            concurrency=concurrency,
            lease=lease,
            poll_interval=poll,
            grace=grace,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
            listen_dsn=listen_dsn,
        )
        loop.run()
    except ValueError as err:
        out.usage(str(err))
    except XJobsError as err:
        # As the worker's: a database without x_jobs, a login without x_jobs_worker (refused
        # at its first claim), a metrics port another process holds...
        out.refuse(EXIT_USAGE, err)
    except psycopg.Error as err:
        if loop is not None and loop.wait_stopped(0):
            raise  # it ran: no start-up failure (it rides out a lost connection itself)
        _start_failed(out, err)


class _LoopOutput:
    """How `worker` and `relay`, which take no --json, end on an error: one line and a hint on
    stderr, exit 2, as every command; with --log-format json the same error is also logged as
    one JSON line (code, sqlstate, hint), the machine-readable form of their output."""

    def __init__(self, json_logs: bool) -> None:
        self.json_logs = json_logs
        self.out = Output(as_json=False)

    def _log(self, message: str, hint: str | None, code: str, sqlstate: str | None) -> None:
        if self.json_logs:
            extra = {"code": code, "sqlstate": sqlstate, "hint": hint}
            logger.error(_first_line(message), extra=extra)

    def fail(
        self, message: str, hint: str | None, *, code: str, sqlstate: str | None = None
    ) -> NoReturn:
        self._log(message, hint, code, sqlstate)
        self.out.fail(EXIT_USAGE, message, hint, code=code, sqlstate=sqlstate)

    def refuse(self, exit_code: int, err: XJobsError) -> NoReturn:
        self._log(err.message, err.hint, _code_of(err), err.sqlstate)
        self.out.refuse(exit_code, err)

    def usage(self, message: str, param_hint: str | None = None) -> NoReturn:
        """A usage error, as click reports a bad option (exit 2): X_USAGE in the JSON log."""
        self._log(message, None, "X_USAGE", None)
        raise typer.BadParameter(message, param_hint=param_hint)


def _start_failed(out: _LoopOutput, err: psycopg.Error) -> NoReturn:
    """A worker or relay that could not start on its database: one line and a hint, exit 2, as
    any command. Raised before the loop began, so by the first connection or the version
    check: an error without an SQLSTATE (a bad DSN) or an OperationalError is the connection's."""
    if err.sqlstate is None or isinstance(err, psycopg.OperationalError):
        out.fail(
            f"X_CONNECT_FAILED: cannot connect to the database: {_first_line(redact(str(err)))}",
            CONNECT_HINT,
            code="X_CONNECT_FAILED",
        )
    if isinstance(err, psycopg.errors.InsufficientPrivilege):
        out.refuse(EXIT_USAGE, PermissionDenied.of(err))
    typed = translate(err)
    out.refuse(EXIT_USAGE, typed if isinstance(typed, XJobsError) else DatabaseError.of(err))


# --- the operator's commands ------------------------------------------------------------------

#: The database refused what a command asked: an x_jobs refusal (X_JOB_NOT_FOUND), one this
#: client makes in the same manner (X_MESSAGE_NOT_FOUND, the install refusals), or any other
#: SQL error (X_DATABASE_ERROR: a statement timeout, a read-only transaction).
EXIT_REFUSED = 1
#: The command could not do its work as it was set up: a usage error (X_USAGE, an input the
#: database cannot store), a connection problem (X_CONNECT_FAILED, X_CONNECTION_LOST), a
#: database without x_jobs or with a version this client cannot speak to (X_NOT_INSTALLED,
#: X_VERSION_UNSUPPORTED), a login without the x_jobs role it needs (X_PERMISSION_DENIED); and
#: whatever stops `worker` or `relay` (X_METRICS_PORT_UNAVAILABLE, a --queue the claim refuses).
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

#: The rows a page of `jobs list` or `outbox list` may hold: those x_jobs.list_jobs takes (a
#: usage error outside them, before anything is sent).
PageSize = Annotated[int, typer.Option(min=1, max=1000, help="Rows per page.")]

# The ranges of SQL's bigint and integer: a number outside them is a usage error here, not an
# "out of range" or "function ... does not exist" from the database.
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
INT_MIN, INT_MAX = -(2**31), 2**31 - 1

CONNECT_HINT = (
    "Check --dsn, DATABASE_URL or the PG* variables (PGHOST, PGPORT, PGDATABASE, PGUSER), "
    "and that the server is running."
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
        input => %(input)s::jsonb,
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
# With a job name (0.4.0): LIST_JOBS reads every version this client speaks to.
LIST_JOBS_NAMED: LiteralString = (
    "SELECT "
    + JOB_COLUMNS
    + """
    FROM x_jobs.list_jobs(state => %(state)s, queue => %(queue)s, before_id => %(before)s::bigint,
                          max_rows => %(limit)s::integer, name => %(name)s)
    ORDER BY id DESC
"""
)
SHOW_JOB: LiteralString = "SELECT " + JOB_COLUMNS + " FROM x_jobs.job_detail(id => %(id)s)"
# Oldest first: after a retry, attempts count from 1 again, so the time orders them.
JOB_ERRORS: LiteralString = """
    SELECT attempt, failed_at, worker, error, error_stack
    FROM x_jobs.job_errors(id => %(id)s)
    ORDER BY failed_at, attempt
"""
JOB_STATE: LiteralString = "SELECT state FROM x_jobs.result(id => %(id)s)"
RETRY: LiteralString = "SELECT x_jobs.retry(id => %(id)s)"
CANCEL: LiteralString = "SELECT x_jobs.cancel(id => %(id)s)"
# The bulk forms (0.4.0): every job that matches the filters, NULL matching any.
CANCEL_JOBS: LiteralString = """
    SELECT x_jobs.cancel_jobs(
        queue => %(queue)s, name => %(name)s, state => %(state)s, tenant_id => %(tenant_id)s,
        created_before => %(created_before)s::timestamptz,
        created_after => %(created_after)s::timestamptz,
        max_rows => %(max_rows)s::integer, dry_run => %(dry_run)s::boolean
    )
"""
RETRY_JOBS: LiteralString = """
    SELECT x_jobs.retry_jobs(
        queue => %(queue)s, name => %(name)s, state => %(state)s, tenant_id => %(tenant_id)s,
        created_before => %(created_before)s::timestamptz,
        created_after => %(created_after)s::timestamptz,
        max_rows => %(max_rows)s::integer, dry_run => %(dry_run)s::boolean
    )
"""
VERSION: LiteralString = "SELECT x_jobs.version()"
# A time without an offset as the session's own TimeZone reads it (inside OWN_TIMEZONE).
IN_OWN_TIMEZONE: LiteralString = "SELECT %s::timestamp::timestamptz"
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
# A time without an offset, read in the session's TimeZone: does it fall in the years 1 to 9999
# in UTC?
SHOWABLE: LiteralString = """
    SELECT %s::timestamp::timestamptz
        BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'
"""
QUEUE_STATS: LiteralString = """
    SELECT queue, ready, delayed, suspended, running, demand, paused FROM x_jobs.queue_stats()
"""
STEP_COLUMNS: LiteralString = """
    job_id, name, compensation, kind, created_at, event, event_key, match, since, timeout_at,
    status::text AS status, attempt, output, error, event_id, resolved_by, resolved_at
"""
# x_jobs.steps answers only the worker that holds the run; the operator reads job_steps, in the
# order x_jobs.steps answers: when the run reached each step, a step before its compensation.
JOB_STEPS: LiteralString = (
    "SELECT "
    + STEP_COLUMNS
    + """
    FROM x_jobs.job_steps(id => %(id)s)
    ORDER BY created_at, compensation, name
"""
)
# NULL payload (no --payload) is the API's default; --payload null publishes JSON null.
PUBLISH: LiteralString = """
    SELECT event_id, woken
    FROM x_jobs.publish(event => %(event)s, payload => %(payload)s::jsonb, key => %(key)s)
"""
RESOLVE_STEP: LiteralString = (
    "SELECT "
    + STEP_COLUMNS
    + " FROM x_jobs.resolve_step(job => %(job)s, step => %(step)s, output => %(output)s::jsonb)"
)
PAUSE: LiteralString = "SELECT x_jobs.pause_queue(queue => %(queue)s)"
RESUME: LiteralString = "SELECT x_jobs.resume_queue(queue => %(queue)s)"
OUTBOX_COLUMNS: LiteralString = """
    id, created_at, max_attempts, topic, key, headers, payload, state::text AS state, attempt,
    available_at, relay, delivered_at, last_error
"""
OUTBOX_STATES: LiteralString = "SELECT pg_catalog.enum_range(NULL::x_jobs.outbox_state)::text[]"
# Newest first, paged by id as x_jobs.list_jobs pages jobs. The state is checked against
# OUTBOX_STATES first, as list_outbox itself would refuse it.
LIST_OUTBOX: LiteralString = (
    "SELECT "
    + OUTBOX_COLUMNS
    + """
    FROM x_jobs.list_outbox(state => %(state)s, topic => %(topic)s, key => %(key)s,
                            before_id => %(before)s::bigint, max_rows => %(limit)s::integer)
    ORDER BY id DESC
"""
)
SHOW_OUTBOX: LiteralString = (
    "SELECT " + OUTBOX_COLUMNS + " FROM x_jobs.outbox_message(id => %(id)s)"
)
# NULL ids or topic: no restriction there (the command refuses to pass both NULL).
REDRIVE: LiteralString = """
    SELECT x_jobs.outbox_redrive(
        ids => %(ids)s::bigint[], topic => %(topic)s, max_rows => %(limit)s::integer
    )
"""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text


#: What the CLI's connections load for a timestamp Python cannot hold: 'infinity' (a run
#: suspended on an event without a timeout is due then) and '-infinity', years past 9999 or BC.
INFINITY = datetime.max.replace(tzinfo=UTC)
NEG_INFINITY = datetime.min.replace(tzinfo=UTC)


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
    reach 178 million years, Python's 2.7 million): a job enqueued with backoff_max => '100000000
    years' made every page that listed it unreadable."""

    def load(self, data: Buffer) -> timedelta:
        try:
            return super().load(data)
        except psycopg.DataError:
            return -timedelta.max if bytes(data).lstrip().startswith(b"-") else timedelta.max


def _json_int(text: str) -> int | Decimal:
    # Python reads no int of more than 4300 digits (a guard against slow parsing); jsonb can.
    return int(text) if len(text) <= 4000 else Decimal(text)


#: JSON nested deeper than this is printed as the text jsonb wrote. Python decodes, copies
#: (dataclasses.asdict) and encodes JSON by recursion, one or two frames a level, and jsonb
#: nests far deeper than the recursion limit (1000 frames): 5,000 levels made jobs list and
#: show end in a RecursionError, 500 already did.
JSON_DEPTH = 100


class RawJson:
    """A JSON value nested deeper than JSON_DEPTH, kept as jsonb's text; _dumps writes that text
    as it is, so --json still prints the very value."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __deepcopy__(self, memo: dict[int, Any]) -> RawJson:
        return self  # immutable; dataclasses.asdict deep-copies what is no list or dict

    def __repr__(self) -> str:
        return f"RawJson({self.text[:20]!r}...)"


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


#: Unicode's Bidi_Control characters (ALM, LRM, RLM, the embeddings and overrides U+202A to
#: U+202E, the isolates U+2066 to U+2069): invisible, they reorder what a terminal shows after
#: them, so that "invoice\\u202egpj.exe" reads as "invoiceexe.jpg".
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
#: C0 controls but tab and newline, DEL and C1: text from the database (a job's name, an error
#: a handler raised) must not steer the operator's terminal with ESC or CSI sequences; nor
#: reorder it with the bidi controls, shown as \\u escapes.
_CONTROLS = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (0x09, 0x0A)},
    **{c: f"\\u{c:04x}" for c in _BIDI},
}
#: json.dumps escapes C0 but, with ensure_ascii=False, leaves DEL, C1 and the bidi controls
#: raw; in JSON they can only be inside strings, where \\u escapes say the same.
_JSON_CONTROLS = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *_BIDI)}
# A Decimal's or RawJson's stand-in while json.dumps runs: NUL, which no PostgreSQL text or
# jsonb holds.
_VERBATIM = re.compile(r'"\\u0000(\d+)\\u0000"')


def _safe(text: str) -> str:
    """``text`` with its control characters shown as escapes (\\x1b, \\u202e), for a person's
    terminal."""
    return text.translate(_CONTROLS)


def _cell(text: str) -> Text:
    """Database text in a table cell: never markup (Text), never a terminal control."""
    return Text(_safe(text))


def _dumps(value: Any, indent: int | None = None) -> str:
    """JSON for ``value`` with Decimals written as the exact numbers they are (json.dumps would
    refuse them, or round them through float) and RawJson as the text it is."""
    verbatim: list[str] = []

    def mark(item: Any) -> Any:
        if isinstance(item, Decimal | RawJson):
            verbatim.append(item.text if isinstance(item, RawJson) else str(item))
            return f"\0{len(verbatim) - 1}\0"
        if isinstance(item, dict):
            return {key: mark(inner) for key, inner in item.items()}
        if isinstance(item, list | tuple):
            return [mark(inner) for inner in item]
        return item

    text = json.dumps(mark(value), indent=indent, ensure_ascii=False, default=_json_default)
    if verbatim:
        text = _VERBATIM.sub(lambda found: verbatim[int(found[1])], text)
    return text.translate(_JSON_CONTROLS)


def _json_view(value: Any) -> Text:
    """A JSON value for a person: indented and highlighted as rich's JSON, digits kept. A
    RawJson is one long line: folded, not cropped."""
    return JSONHighlighter()(Text(_dumps(value, indent=2), no_wrap=not isinstance(value, RawJson)))


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return _infinite(value) or value.isoformat()
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
            typer.echo(_dumps(doc, indent=2))
            return
        console = Console(highlight=False, markup=False, emoji=False, width=_width())
        for part in human:
            console.print(_cell(part) if isinstance(part, str) else part)

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
        typer.echo(f"x-jobs: {_safe(message)}", err=True)
        if hint:
            typer.echo(f"hint: {_safe(hint)}", err=True)
        if self.as_json:
            error = {"code": code, "sqlstate": sqlstate, "message": message, "hint": hint}
            typer.echo(_dumps({"error": error}, indent=2))
        raise typer.Exit(exit_code)

    def refuse(self, exit_code: int, err: XJobsError) -> NoReturn:
        self.fail(exit_code, err.message, err.hint, code=_code_of(err), sqlstate=err.sqlstate)


def _code_of(err: XJobsError) -> str:
    """The X_ code an error's message starts with (that of the refusal it was made of), else
    its class's."""
    head = err.message.split(":", 1)[0]
    return head if head.startswith("X_") and head.isupper() else err.code


class DatabaseError(XJobsError):
    """Any other error the database answered a command with (a statement timeout, a read-only
    transaction): X_DATABASE_ERROR, carrying PostgreSQL's SQLSTATE, so that --json never prints
    a code of null."""

    code = "X_DATABASE_ERROR"

    @classmethod
    def of(cls, err: psycopg.Error) -> DatabaseError:
        said = err.diag.message_primary or _first_line(str(err))
        state = f" (SQLSTATE {err.sqlstate})" if err.sqlstate else ""
        typed = cls(f"X_DATABASE_ERROR: {said}{state}", hint=err.diag.message_hint)
        typed.__cause__ = err
        typed.sqlstate = err.sqlstate
        return typed


#: The TimeZone each connection of database() started with, before PIN_UTC (see OWN_TIMEZONE).
_OWN_TIMEZONES: weakref.WeakKeyDictionary[psycopg.Connection[Any], str] = (
    weakref.WeakKeyDictionary()
)


@contextmanager
def database(
    dsn: str | None, out: Output, *, check_version: bool = True
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the database ``dsn`` names (default: DATABASE_URL, else
    libpq's environment, as App() finds it), checked to hold an x_jobs this client speaks to.
    Whatever goes wrong inside ends the command as one line and a hint, never a traceback."""
    app = App(dsn)
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


def _json_input(value: str, option: str = "--input") -> str:
    """The JSON text an option gave, checked; a usage error (exit 2) naming ``option`` otherwise.
    ``@PATH`` reads it from a file, ``-`` from stdin (no JSON text starts with @ or is a lone -):
    the command line holds about 128 KiB, the database takes up to 1 MiB.

    The text itself goes to the database (``%s::jsonb``): read into Python floats, a number
    would lose digits jsonb keeps."""
    text = _read_json_source(value, option)

    # jsonb has no NaN or Infinity: refuse them here, like any other text that is not JSON.
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        parsed = json.loads(text, parse_constant=no_constants, parse_int=len, parse_float=len)
    except ValueError as err:
        raise typer.BadParameter(f"not a JSON value ({err})", param_hint=f"'{option}'") from err
    except RecursionError:
        # Nested deeper than Python decodes (jsonb nests deeper): the database checks the rest,
        # but not the NUL escape it cannot store, refused here all the same.
        if _NUL_ESCAPE.search(text):
            raise _unstorable(option, "a NUL character (\\u0000)") from None
        return text
    why = _unstorable_text(parsed)
    if why is not None:
        raise _unstorable(option, why)
    return text


#: A \\u0000 escape in JSON text: a backslash that no other backslash escapes, then u0000.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _unstorable(option: str, what: str) -> typer.BadParameter:
    return typer.BadParameter(
        f"it holds {what}, which PostgreSQL cannot store in jsonb: nothing was sent",
        param_hint=f"'{option}'",
    )


def _unstorable_text(value: Any) -> str | None:
    """Why jsonb cannot store the strings (keys too) of a JSON value: a NUL character, or half
    of a surrogate pair; None when it can. Walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        texts: list[str] = []
        if isinstance(item, dict):
            texts = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            texts = [item]
        for text in texts:
            if "\x00" in text:
                return "a NUL character (\\u0000)"
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return "half of a UTF-16 surrogate pair (such as \\ud800 alone)"
    return None


def _read_json_source(value: str, option: str) -> str:
    """``value``, or the text of the file ``@PATH`` or of stdin (``-``) it names."""
    if value != "-" and not value.startswith("@"):
        return value
    where = "stdin" if value == "-" else value[1:]
    try:
        if value == "-":
            return sys.stdin.read()
        with open(value[1:], encoding="utf-8") as source:
            return source.read()
    except (OSError, UnicodeDecodeError) as err:
        raise typer.BadParameter(
            f"cannot read JSON from {where}: {err}", param_hint=f"'{option}'"
        ) from err


def _iso_datetime(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError as err:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 time, such as 2026-12-01T09:00:00+00:00"
        ) from err


def _infinite(value: datetime) -> str | None:
    """ "infinity" or "-infinity" for the stand-ins of times Python cannot hold (== as asdict
    copies them), else None."""
    if value == INFINITY:
        return "infinity"
    return "-infinity" if value == NEG_INFINITY else None


def _when(value: datetime | None) -> str:
    """A time for a person: UTC, to the second."""
    if value is None:
        return "-"
    return _infinite(value) or value.astimezone(UTC).isoformat(sep=" ", timespec="seconds")


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
        grid.add_row(label, _cell(value) if isinstance(value, str) else value)
    return grid


@cli.command()
def enqueue(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The job's name (any name; no App needed).")
    ],
    input_json: Annotated[
        str,
        typer.Option(
            "--input",
            metavar="JSON",
            help="The job's input, a JSON value; @PATH reads it from a file, - from stdin.",
        ),
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
        int | None,
        typer.Option(
            min=INT_MIN, max=INT_MAX, help="Lower runs first; default 0.", show_default=False
        ),
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            min=INT_MIN, max=INT_MAX, help="Attempts before dead; default 25.", show_default=False
        ),
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
    if delay is not None and not _showable_delay(delay):
        raise typer.BadParameter(
            f"{delay:g} seconds from now is past the year 9999, a due time x-jobs could not show"
            " back: give a shorter delay",
            param_hint="'--delay'",
        )
    if run_at is not None and not _showable_run_at(run_at):
        raise _run_at_unshowable(run_at)
    params = {
        "name": name,
        "input": payload,
        "queue": queue,
        "run_at": run_at,
        "delay": None if delay is None else timedelta(seconds=delay),
        "idempotency_key": idempotency_key,
        "max_attempts": max_attempts,
        "priority": priority,
        "tenant_id": tenant,
        "keep_done": keep_done,
    }
    with database(dsn, out) as conn, conn.transaction():
        if run_at is not None and run_at.tzinfo is None:
            # A time without an offset is read in the session's own TimeZone, as the help says,
            # not in the UTC database() pinned.
            conn.execute(OWN_TIMEZONE, [_OWN_TIMEZONES.get(conn, "UTC")])
            if not _naive_far_from_the_ends(run_at):
                # Only that TimeZone tells whether it falls past the year 9999 in UTC.
                found = conn.execute(SHOWABLE, [run_at]).fetchone()
                if not (found and found[0]):
                    raise _run_at_unshowable(run_at)
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


def _showable_delay(delay: float) -> bool:
    """Whether a due time ``delay`` seconds from now is one x-jobs can show back."""
    return math.isfinite(delay) and delay <= (INFINITY - datetime.now(UTC)).total_seconds()


def _showable_run_at(run_at: datetime) -> bool:
    """Whether ``run_at`` (with an offset) falls in the years 1 to 9999 in UTC, the times x-jobs
    can show back. A time without an offset is checked by the database (SHOWABLE)."""
    if run_at.tzinfo is None:
        return True
    try:
        run_at.astimezone(UTC)
    except OverflowError:
        return False
    return True


def _naive_far_from_the_ends(run_at: datetime) -> bool:
    # No TimeZone is a day off UTC: within these, a time without an offset is showable anywhere.
    return datetime(1, 1, 2) <= run_at <= datetime(9999, 12, 30)


def _run_at_unshowable(run_at: datetime) -> typer.BadParameter:
    return typer.BadParameter(
        f"{run_at.isoformat()} is outside the years 1 to 9999 in UTC, a due time x-jobs could not"
        " show back: give a time within them",
        param_hint="'--run-at'",
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
            _cell(str(job.id)),
            _cell(job.name),
            _cell(job.queue),
            _cell(job.state),
            _cell(f"{job.attempt}/{job.max_attempts}"),
            _cell(_utc(job.run_at)),
            _cell(_first_line(job.last_error) if job.last_error else ""),
        )
    return table


@jobs_cli.command("list")
def jobs_list(
    state: Annotated[
        str | None, typer.Option(help="Only jobs in this state (dead, ready, ...).")
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Only jobs of this queue.")] = None,
    name: Annotated[
        str | None, typer.Option(help="Only jobs of this name (x_jobs 0.4.0 and later).")
    ] = None,
    before: Annotated[
        int | None,
        typer.Option(
            metavar="ID",
            min=BIGINT_MIN,
            max=BIGINT_MAX,
            help="Only ids below this one: the next page's start.",
        ),
    ] = None,
    limit: PageSize = 50,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Jobs newest first, one page at a time (x_jobs.list_jobs); page on with --before.

    After a full page it prints the command for the next one: --before the page's last id.
    """
    out = Output(as_json)
    params = {"state": state, "queue": queue, "before": before, "limit": limit, "name": name}
    with database(dsn, out) as conn:
        if name is not None:
            _require_0_4(conn, "listing by --name", "or list without --name")
        query = LIST_JOBS if name is None else LIST_JOBS_NAMED
        jobs = conn.cursor(row_factory=class_row(JobRow)).execute(query, params).fetchall()
    next_before = jobs[-1].id if len(jobs) == limit else None
    human: list[RenderableType | str] = [_jobs_table(jobs) if jobs else "no jobs"]
    if next_before is not None:
        args = ["x-jobs", "jobs", "list"]
        args += ["--state", state] if state is not None else []
        args += ["--queue", queue] if queue is not None else []
        args += ["--name", name] if name is not None else []
        args += ["--limit", str(limit)] if limit != 50 else []
        args += ["--before", str(next_before)]
        human += _next_page(args, dsn)
    out.emit(
        {"jobs": [dataclasses.asdict(job) for job in jobs], "next_before": next_before}, *human
    )


def _next_page(args: list[str], dsn: str | None) -> list[str]:
    """The line that says how to ask for the next page: ``args`` and the --dsn the command was
    given (none when it read DATABASE_URL or PG*: the next command reads them too). A password
    in that --dsn is never printed: it shows as *** and a second line says to put it back."""
    if dsn is None:
        return [f"next page: {shlex.join(args)}"]
    line = f"next page: {shlex.join([*args, '--dsn', redact(dsn)])}"
    if not has_password(dsn):
        return [line]
    return [
        line,
        f"(the password in --dsn is shown as {HIDDEN}: give it in its place, or keep it out of"
        " the DSN with PGPASSWORD or ~/.pgpass)",
    ]


def _errors_table(errors: list[JobErrorRow]) -> RenderableType:
    if not errors:
        return "no errors recorded"
    table = _table(title="errors, oldest first")
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("failed at", no_wrap=True)
    table.add_column("worker", overflow="fold")
    table.add_column("error", overflow="fold")
    for error in errors:
        message = Text(_safe(error.error))
        if error.error_stack:
            message.append("\n" + _safe(error.error_stack), style="dim")
        table.add_row(
            _cell(str(error.attempt)),
            _cell(_when(error.failed_at)),
            _cell(_or_dash(error.worker)),
            message,
        )
    return table


def _number(value: object) -> str:
    """3.0 as 3: progress counts are double precision in SQL, whole numbers in practice."""
    if value is None:
        return "?"
    if isinstance(value, float | Decimal) and value == int(value):
        return str(int(value))
    return str(value)


def _progress(progress: Any) -> str:
    """A job's progress for a person: ``3/10 (30%), note, at <UTC time>``; "-" when unset."""
    if not isinstance(progress, dict):
        return "-" if progress is None else _dumps(progress)
    done, total = progress.get("done"), progress.get("total")
    parts = []
    if done is not None or total is not None:
        count = f"{_number(done)}/{_number(total)}"
        if isinstance(done, int | Decimal) and isinstance(total, int | Decimal) and total > 0:
            count += f" ({done / total:.0%})"
        parts.append(count)
    if progress.get("note") is not None:
        parts.append(_safe(str(progress["note"])))
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
    if value is None:
        return "-"
    return _infinite(value) or value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


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
        name = Text(_safe(step.name))
        if step.compensation:
            name.append(" (compensation)", style="italic")
        event = "-"
        if step.event is not None:
            event = step.event if step.event_key is None else f"{step.event} key={step.event_key}"
        if step.error is not None:
            result = Text(_safe(_shorten(_first_line(step.error))), style="red")
        elif step.output is not None:
            result = _cell(_shorten(_dumps(step.output)))
        else:
            result = _cell("-")
        table.add_row(
            name,
            _cell(step.kind),
            _cell(step.status),
            _cell(str(step.attempt)),
            _cell(event),
            _cell(_utc(step.timeout_at)),
            _cell(
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
            ("input", _json_view(job.input)),
            ("output", "-" if job.output is None else _json_view(job.output)),
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


JobId = Annotated[
    int, typer.Argument(metavar="ID", min=BIGINT_MIN, max=BIGINT_MAX, help="The job's id.")
]


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


#: The first SQL API with cancel_jobs, retry_jobs and list_jobs(name => ...).
BULK_VERSION = (0, 4, 0)
#: Jobs per call of x_jobs.cancel_jobs or retry_jobs (their max_rows), each call a transaction
#: of its own: the rows a call changes stay locked until it commits, and a worker's heartbeat
#: of one of them waits that long.
BULK_BATCH = 10_000


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


JobIds = Annotated[
    list[int] | None,
    typer.Argument(
        metavar="ID",
        min=BIGINT_MIN,
        max=BIGINT_MAX,
        help="The jobs' ids; or leave them out and name the jobs by filters.",
        show_default=False,
    ),
]
ByQueue = Annotated[
    str | None, typer.Option("--queue", help="Every job of this queue.", show_default=False)
]
ByName = Annotated[
    str | None, typer.Option("--name", help="Every job of this name.", show_default=False)
]
ByTenant = Annotated[
    str | None, typer.Option("--tenant", help="Every job of this tenant.", show_default=False)
]
CreatedBefore = Annotated[
    datetime | None,
    typer.Option(
        "--created-before",
        metavar="ISO8601",
        parser=_iso_datetime,
        help="Every job created before this time; without an offset, in the session's TimeZone.",
        show_default=False,
    ),
]
CreatedAfter = Annotated[
    datetime | None,
    typer.Option(
        "--created-after",
        metavar="ISO8601",
        parser=_iso_datetime,
        help="Every job created after this time; without an offset, in the session's TimeZone.",
        show_default=False,
    ),
]
Yes = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Change the matching jobs without asking (needed when stdin is no terminal).",
    ),
]


@dataclass(frozen=True)
class _Bulk:
    """What `jobs cancel` or `jobs retry` does by filter: the verb, its forms (the past tense is
    the --json key), the SQL function, and why a job the dry run counted may be left."""

    verb: str
    doing: str
    done: str
    call: LiteralString
    left: str


CANCELLING = _Bulk("cancel", "cancelling", "cancelled", CANCEL_JOBS, "they finished meanwhile")
RETRYING = _Bulk(
    "retry",
    "retrying",
    "retried",
    RETRY_JOBS,
    "a live job holds their idempotency key, or they changed meanwhile",
)


def _jobs(count: int) -> str:
    return f"{count:,} job{'' if count == 1 else 's'}"


def _own_times(conn: psycopg.Connection[Any], filters: dict[str, Any]) -> None:
    """The --created-* times without an offset, read in the session's own TimeZone (as
    --run-at is), not in the UTC that database() pinned: from then on, instants."""
    naive = [k for k in ("created_before", "created_after") if _is_naive(filters[k])]
    if not naive:
        return
    with conn.transaction():
        conn.execute(OWN_TIMEZONE, [_OWN_TIMEZONES.get(conn, "UTC")])
        for key in naive:
            row = conn.execute(IN_OWN_TIMEZONE, [filters[key]]).fetchone()
            assert row is not None
            filters[key] = row[0]


def _is_naive(value: object) -> bool:
    return isinstance(value, datetime) and value.tzinfo is None


def _bulk_count(
    conn: psycopg.Connection[Any],
    bulk: _Bulk,
    filters: Mapping[str, Any],
    *,
    max_rows: int | None,
    dry_run: bool,
) -> int:
    row = conn.execute(bulk.call, {**filters, "max_rows": max_rows, "dry_run": dry_run}).fetchone()
    return 0 if row is None else int(row[0])


def _by_filters(
    bulk: _Bulk, filters: dict[str, Any], yes: bool, out: Output, dsn: str | None
) -> None:
    """Count the matching jobs (a dry run), ask on a terminal unless --yes, then change them in
    calls of BULK_BATCH, each its own transaction, and at most as many as were counted: jobs
    that match only later (enqueued meanwhile) were not confirmed."""
    shown = " ".join(
        f"{key.removesuffix('_id')}={value.isoformat() if isinstance(value, datetime) else value}"
        for key, value in filters.items()
        if value is not None
    )
    with database(dsn, out) as conn:
        _require_0_4(conn, f"to {bulk.verb} jobs by filter", f"or {bulk.verb} them by ID")
        _own_times(conn, filters)
        matching = _bulk_count(conn, bulk, filters, max_rows=None, dry_run=True)
        if matching == 0:
            out.emit({bulk.done: 0}, f"no job to {bulk.verb} matches {shown}; nothing changed")
            return
        what = f"{_jobs(matching)} matching {shown}"
        if not yes:
            if not sys.stdin.isatty():
                out.fail(
                    EXIT_USAGE,
                    f"X_USAGE: {bulk.doing} {what} needs a confirmation, and stdin is not a"
                    " terminal",
                    f"Pass --yes to {bulk.verb} them without asking.",
                    code="X_USAGE",
                )
            if not typer.confirm(_safe(f"{bulk.verb.capitalize()} {what}?"), err=True):
                out.emit({bulk.done: 0}, "nothing changed")
                return
        changed = 0
        while changed < matching:
            batch = min(BULK_BATCH, matching - changed)
            got = _bulk_count(conn, bulk, filters, max_rows=batch, dry_run=False)
            changed += got
            if got < batch:
                break
    said = f"{_jobs(changed)} {bulk.done}"
    if changed < matching:
        said += f" of the {matching:,} that matched: for the others, {bulk.left}"
    out.emit({bulk.done: changed}, said)


def _filters(
    queue: str | None,
    name: str | None,
    state: str | None,
    tenant: str | None,
    created_before: datetime | None,
    created_after: datetime | None,
) -> dict[str, Any]:
    return {
        "queue": queue,
        "name": name,
        "state": state,
        "tenant_id": tenant,
        "created_before": created_before,
        "created_after": created_after,
    }


def _ids_or_filters(verb: str, ids: list[int], filters: Mapping[str, Any]) -> bool:
    """Whether the command goes by filters; a usage error unless it has IDs or filters alone."""
    named = any(value is not None for value in filters.values())
    if ids and named:
        raise typer.BadParameter(
            f"give the IDs of the jobs to {verb}, or filters, not both", param_hint="'ID'"
        )
    if not ids and not named:
        raise typer.BadParameter(
            f"name the jobs to {verb}: give their IDs, or filters (--queue, --name, --state,"
            " --tenant, --created-before, --created-after)",
            param_hint="'ID' / '--queue' ...",
        )
    return named


def _each(docs: list[dict[str, Any]], lines: list[str], out: Output) -> None:
    """One ID's document as it always was; several IDs' as {"jobs": [...]}, a line each."""
    out.emit(docs[0] if len(docs) == 1 else {"jobs": docs}, *lines)


@jobs_cli.command("retry")
def jobs_retry(
    job_ids: JobIds = None,
    queue: ByQueue = None,
    name: ByName = None,
    state: Annotated[
        str | None,
        typer.Option(
            help="Every job in this state: dead or failed (leave it out for both), or cancelled.",
            show_default=False,
        ),
    ] = None,
    tenant: ByTenant = None,
    created_before: CreatedBefore = None,
    created_after: CreatedAfter = None,
    yes: Yes = False,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Re-queue dead, failed or cancelled jobs (x_jobs.retry): due now, attempts from 0.

    By ID, all of them in one transaction (a refusal of one changes none); or every job that
    matches the filters (x_jobs.retry_jobs: dead and failed ones, cancelled ones only with
    --state cancelled), counted first and confirmed on a terminal (--yes: without asking).
    """
    out = Output(as_json)
    ids = list(dict.fromkeys(job_ids or []))
    filters = _filters(queue, name, state, tenant, created_before, created_after)
    if _ids_or_filters("retry", ids, filters):
        _by_filters(RETRYING, filters, yes, out, dsn)
        return
    docs, lines = [], []
    with database(dsn, out) as conn, conn.transaction():
        for job_id in ids:
            conn.execute(RETRY, {"id": job_id})
            row = conn.execute(JOB_STATE, {"id": job_id}).fetchone()
            state_now = None if row is None else str(row[0])
            docs.append({"id": job_id, "retried": True, "state": state_now})
            lines.append(f"job {job_id} re-queued: {state_now}, its attempts start over")
    _each(docs, lines, out)


@jobs_cli.command("cancel")
def jobs_cancel(
    job_ids: JobIds = None,
    queue: ByQueue = None,
    name: ByName = None,
    state: Annotated[
        str | None,
        typer.Option(
            help="Every job in this state: ready, delayed, suspended or running (leave it out"
            " for all four).",
            show_default=False,
        ),
    ] = None,
    tenant: ByTenant = None,
    created_before: CreatedBefore = None,
    created_after: CreatedAfter = None,
    yes: Yes = False,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Cancel live jobs (x_jobs.cancel); a job that had finished already is left as it is.

    By ID, all of them in one transaction; or every live job that matches the filters
    (x_jobs.cancel_jobs), counted first and confirmed on a terminal (--yes: without asking).
    """
    out = Output(as_json)
    ids = list(dict.fromkeys(job_ids or []))
    filters = _filters(queue, name, state, tenant, created_before, created_after)
    if _ids_or_filters("cancel", ids, filters):
        _by_filters(CANCELLING, filters, yes, out, dsn)
        return
    docs, lines = [], []
    with database(dsn, out) as conn, conn.transaction():
        for job_id in ids:
            answer = conn.execute(CANCEL, {"id": job_id}).fetchone()
            row = conn.execute(JOB_STATE, {"id": job_id}).fetchone()
            cancelled = bool(answer and answer[0])
            state_now = None if row is None else str(row[0])
            docs.append({"id": job_id, "cancelled": cancelled, "state": state_now})
            lines.append(
                f"job {job_id} cancelled"
                if cancelled
                else f"job {job_id} had already finished ({state_now}); nothing changed"
            )
    _each(docs, lines, out)


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
    payload = None if payload_json is None else _json_input(payload_json, "--payload")
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
    job_id: Annotated[
        int, typer.Argument(metavar="JOB", min=BIGINT_MIN, max=BIGINT_MAX, help="The job's id.")
    ],
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
    output = None if output_json is None else _json_input(output_json, "--output")
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
                ("output", "-" if row.output is None else _json_view(row.output)),
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
            _cell(q.queue), *(_cell(str(n)) for n in counts), _cell("yes" if q.paused else "no")
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
            _cell(str(message.id)),
            _cell(message.topic),
            _cell(_or_dash(message.key)),
            _cell(message.state),
            _cell(f"{message.attempt}/{message.max_attempts}"),
            _cell(_utc(message.available_at)),
            _cell(_shorten(_first_line(message.last_error)) if message.last_error else ""),
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
        typer.Option(
            metavar="ID",
            min=BIGINT_MIN,
            max=BIGINT_MAX,
            help="Only ids below this one: the next page's start.",
        ),
    ] = None,
    limit: PageSize = 50,
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
        human += _next_page(args, dsn)
    out.emit(
        {"messages": [dataclasses.asdict(m) for m in messages], "next_before": next_before},
        *human,
    )


@outbox_cli.command("show")
def outbox_show(
    message_id: Annotated[
        int,
        typer.Argument(metavar="ID", min=BIGINT_MIN, max=BIGINT_MAX, help="The message's id."),
    ],
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
                ("headers", _json_view(row.headers)),
                ("payload", _json_view(row.payload)),
            ]
        ),
    )


@outbox_cli.command("redrive")
def outbox_redrive(
    message_ids: Annotated[
        list[int] | None,
        typer.Argument(
            metavar="ID",
            min=BIGINT_MIN,
            max=BIGINT_MAX,
            help="Dead messages to send again.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(help="Every dead message of this topic (with IDs: only those of it)."),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=INT_MIN, max=INT_MAX, help="At most this many, oldest first, 1 to 100000."
        ),
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
        if ids and redriven == limit < len(ids):
            # The ids past the limit were not looked at: dead or not, nobody knows yet.
            said += f"; the --limit of {limit} was reached: run it again for the other ids"
        elif ids and redriven < len(ids):
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
        int,
        typer.Option(min=1, max=INT_MAX, help="Rows per purge call, each its own transaction."),
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
    nothing when the newest is installed. Refuses a database that has the extension, and a
    caller that may not create the x_jobs roles (with what an administrator runs first). Prints
    what x_jobs.health() finds wrong afterwards.
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
    # What x_jobs.health() finds wrong (a right an administrator should still grant): after
    # the outcome, a check's finding and its fix each on a line of their own.
    unhealthy: list[str] = []
    for check in done.failing:
        unhealthy.append(f"warning: {check.check_name}: {check.detail}")
        if check.hint:
            unhealthy.append(f"hint: {check.hint}")
    out.emit(
        {
            "before": done.before,
            "after": done.after,
            "scripts": list(done.scripts),
            "changed": done.changed,
            "failing": [
                {"check": check.check_name, "detail": check.detail, "hint": check.hint}
                for check in done.failing
            ],
        },
        said,
        *unhealthy,
    )


def _duration(value: timedelta | None) -> str:
    return "-" if value is None else f"{value.total_seconds():g}s"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _manifest_table(types: list[declarations.JobType], *, from_database: bool) -> Table:
    """The declarations, one row a job: what an enqueue that leaves an option out gets ("-":
    not declared, the built-in default), and from the database who declared it and serves it."""
    table = _table()
    table.add_column("job", overflow="fold", min_width=8)
    table.add_column("queue", overflow="fold", min_width=5)
    for column in ("attempts", "retry", "dead letters", "timeout", "concurrency", "keep done"):
        table.add_column(column, no_wrap=column != "concurrency", overflow="fold")
    if from_database:
        table.add_column("declared (UTC)", overflow="fold")
        table.add_column("served by", overflow="fold", min_width=8)
        table.add_column("parked", justify="right", no_wrap=True)
    for t in types:
        retry = (
            "-"
            if t.backoff_base is None and t.backoff_max is None
            else f"{_duration(t.backoff_base)}..{_duration(t.backoff_max)}"
        )
        concurrency = "-"
        if t.concurrency_limit is not None:
            concurrency = f"{t.concurrency_limit} per {t.concurrency_key or 'key from the input'}"
        elif t.concurrency_key is not None:
            concurrency = f"1 per {t.concurrency_key}"
        row = [
            t.name,
            _or_dash(t.queue),
            _or_dash(t.max_attempts),
            retry,
            _yes_no(t.dead_letter),
            _duration(t.timeout),
            concurrency,
            _yes_no(t.keep_done),
        ]
        if from_database:
            declared = "not declared"
            if t.declared_at is not None:
                declared = f"{_utc(t.declared_at)} by {t.declared_by}"
                declared += f" ({t.build})" if t.build else ""
            row += [declared, ", ".join(t.served_by) or "-", str(t.parked)]
        table.add_row(*(_cell(cell) for cell in row))
    return table


def _as_job_type(declared: Mapping[str, Any]) -> declarations.JobType:
    """A declaration the app would send, as the database would answer it back."""

    def interval(name: str) -> timedelta | None:
        value = declared.get(name)
        return None if value is None else timedelta(seconds=float(str(value).split()[0]))

    return declarations.JobType(
        name=str(declared["name"]),
        queue=declared.get("queue"),
        max_attempts=declared.get("max_attempts"),
        priority=declared.get("priority"),
        dead_letter=declared.get("dead_letter"),
        backoff_base=interval("backoff_base"),
        backoff_max=interval("backoff_max"),
        keep_done=declared.get("keep_done"),
        concurrency_key=declared.get("concurrency_key"),
        concurrency_limit=declared.get("concurrency_limit"),
        timeout=interval("timeout"),
        declared_at=None,
        declared_by=None,
        build=None,
        served_by=[],
        parked=0,
    )


@cli.command("manifest")
def manifest_command(
    app_path: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODULE:APP]",
            help="Print what this App declares, without a database.",
            show_default=False,
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """The job declarations: what workers recorded in the database (x_jobs.job_types), or what
    MODULE:APP would declare.

    From the database: per job, the defaults an enqueue gets for what it leaves out (from any
    language), the timeout, who declared it when, the live workers that announced it, and how
    many of its jobs are parked (handed back while no worker served it). Needs x_jobs_worker
    and x_jobs 0.4.0.
    """
    out = Output(as_json)
    if app_path is not None:
        app = load_app(app_path)
        declared = declarations.declarations(app)
        types = [_as_job_type(d) for d in declared]
        out.emit(
            {"declarations": declared},
            _manifest_table(types, from_database=False) if types else "the app declares no job",
        )
        return
    with database(dsn, out) as conn:
        row = conn.execute("SELECT x_jobs.version()").fetchone()
        version = "?" if row is None else str(row[0])
        if not declarations.speaks_declarations(version):
            raise VersionUnsupported(
                f"X_VERSION_UNSUPPORTED: declarations are recorded from x_jobs 0.4.0 on, "
                f"the database has {version}",
                hint="Upgrade the database (ALTER EXTENSION x_jobs UPDATE, or x-jobs install) "
                "and start the workers again, or pass MODULE:APP to see what an app declares.",
            )
        types = declarations.job_types(conn)
    out.emit(
        {"job_types": [dataclasses.asdict(t) for t in types]},
        _manifest_table(types, from_database=True)
        if types
        else "no job is declared, served or parked",
    )


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
