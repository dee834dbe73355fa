"""``x-jobs worker`` and ``x-jobs relay``: the long-running commands, their options and how
they end when they cannot start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Annotated, NoReturn

import psycopg
import typer

from x_jobs._conn import redact
from x_jobs._listen import LISTEN_DSN_ENV
from x_jobs.cli._database import CONNECT_HINT
from x_jobs.cli._logs import setup_logging
from x_jobs.cli._options import load_app
from x_jobs.cli._output import EXIT_USAGE, Output, _code_of
from x_jobs.errors import (
    DatabaseError,
    PermissionDenied,
    XJobsError,
    translate,
)
from x_jobs.errors import first_line as _first_line

# The name the worker's and relay's error lines carry (the "logger" of a JSON log line): that
# of the package, for whoever filters its logs by it.
logger = logging.getLogger("x_jobs.cli")

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
        typer.Option(
            min=0,
            help="Claimed jobs waiting in a local queue (default: about half a second of the"
            " jobs' run time, from concurrency up to 500).",
        ),
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
    no_tick: Annotated[
        bool,
        typer.Option(
            "--no-tick",
            help="Do not fire the database's due schedules (at each whole minute): pg_cron or"
            " `x-jobs tick` does. The app's schedules are written at the start either way.",
        ),
    ] = False,
    log_level: LogLevel = "info",
    log_format: LogFormat = "text",
) -> None:
    """Run a worker: claim, run and settle the jobs of MODULE:APP until SIGTERM or SIGINT.

    At its start it writes the app's schedules; it ticks them unless --no-tick.
    """
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
            tick_schedules=not no_tick,
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
