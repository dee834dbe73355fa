"""The ``x-jobs`` command line (also ``python -m x_jobs``).

``worker`` runs the jobs of an App, ``relay`` delivers its outbox. The operator's commands call
the SQL API and print what it answers: ``enqueue``, ``jobs list|show|retry|cancel``,
``outbox list|show|redrive``, ``events publish``, ``steps resolve``,
``queues [pause|resume|policy]``, ``schedules list|show|pause|resume|run|preview|sync``,
``tenants bind|unbind|list``, ``rate-limits``, ``tick`` (fire the due schedules),
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

The package holds a module per command group (:mod:`.serve` for ``worker`` and ``relay``,
:mod:`.enqueue`, :mod:`.jobs`, :mod:`.events`, :mod:`.steps`, :mod:`.queues`, :mod:`.outbox`,
:mod:`.schedules` (with ``tick``), :mod:`.maintain`, :mod:`.install`, :mod:`.manifest`) over the
helpers they share: the output (:mod:`._output`), the options (:mod:`._options`), the connection
(:mod:`._database`), the rows of jobs and steps (:mod:`._rows`). This module assembles the app
from them; the names the module ``x_jobs.cli`` always had are importable from here.
"""

from __future__ import annotations

import logging

import typer

from x_jobs.cli import enqueue
from x_jobs.cli._bulk import (
    BULK_BATCH,
    CANCEL_JOBS,
    CANCELLING,
    IN_OWN_TIMEZONE,
    RETRY_JOBS,
    RETRYING,
    ByName,
    ByQueue,
    ByTenant,
    CreatedAfter,
    CreatedBefore,
    Yes,
)
from x_jobs.cli._database import (
    BULK_VERSION,
    CONNECT_HINT,
    OWN_TIMEZONE,
    PIN_UTC,
    VERSION,
    database,
)
from x_jobs.cli._group import WANTS_JSON, _Commands
from x_jobs.cli._logs import JsonLogFormatter, TextLogFormatter, setup_logging
from x_jobs.cli._options import (
    BIGINT_MAX,
    BIGINT_MIN,
    INT_MAX,
    INT_MIN,
    AsJson,
    Dsn,
    PageSize,
    load_app,
)
from x_jobs.cli._output import (
    EXIT_REFUSED,
    EXIT_USAGE,
    INFINITY,
    JSON_DEPTH,
    NEG_INFINITY,
    PIPE_WIDTH,
    SHORT,
    Output,
    RawJson,
)
from x_jobs.cli._rows import JOB_COLUMNS, JOB_STATE, STEP_COLUMNS, JobRow, StepRow
from x_jobs.cli.enqueue import ENQUEUE, SHOWABLE, EnqueuedRow
from x_jobs.cli.events import PUBLISH, PublishedRow, events_cli, events_publish
from x_jobs.cli.install import install_command
from x_jobs.cli.jobs import (
    CANCEL,
    JOB_ERRORS,
    JOB_STEPS,
    LIST_JOBS,
    LIST_JOBS_NAMED,
    RETRY,
    SHOW_JOB,
    JobErrorRow,
    JobId,
    JobIds,
    jobs_cancel,
    jobs_cli,
    jobs_list,
    jobs_retry,
    jobs_show,
)
from x_jobs.cli.maintain import DEFAULT_RETENTION, maintain_command
from x_jobs.cli.manifest import manifest_command
from x_jobs.cli.outbox import (
    LIST_OUTBOX,
    OUTBOX_COLUMNS,
    OUTBOX_STATES,
    REDRIVE,
    SHOW_OUTBOX,
    OutboxRow,
    outbox_cli,
    outbox_list,
    outbox_redrive,
    outbox_show,
)
from x_jobs.cli.queues import (
    PAUSE,
    QUEUE_STATS,
    RESUME,
    QueueName,
    QueueRow,
    queues_cli,
    queues_pause,
    queues_policy,
    queues_resume,
)
from x_jobs.cli.ratelimits import rate_limits
from x_jobs.cli.schedules import (
    PREVIEW,
    SYNCED_BY,
    ScheduleName,
    schedules_cli,
    schedules_list,
    schedules_pause,
    schedules_preview,
    schedules_resume,
    schedules_run,
    schedules_show,
    schedules_sync,
    tick_command,
)
from x_jobs.cli.serve import (
    LEASE_LEAST,
    LOG_LEVELS,
    MAX_CONCURRENCY,
    MAX_SECONDS,
    METRICS_HOST,
    POLL_LEAST,
    Grace,
    ListenDsn,
    LogFormat,
    LogLevel,
    MetricsHost,
    MetricsPort,
    Poll,
    relay,
    worker,
)
from x_jobs.cli.steps import RESOLVE_STEP, steps_cli, steps_resolve
from x_jobs.cli.tenants import tenants_bind, tenants_cli, tenants_list, tenants_unbind
from x_jobs.errors import DatabaseError, MessageNotFound

logger = logging.getLogger(__name__)

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


# The commands in the order `x-jobs --help` lists them (commands first, then the groups).
cli.command()(worker)
cli.command()(relay)
cli.command()(enqueue.enqueue)
cli.add_typer(jobs_cli, name="jobs")
cli.add_typer(events_cli, name="events")
cli.add_typer(steps_cli, name="steps")
cli.add_typer(queues_cli, name="queues")
cli.add_typer(outbox_cli, name="outbox")
cli.add_typer(schedules_cli, name="schedules")
cli.add_typer(tenants_cli, name="tenants")
cli.command("tick")(tick_command)
cli.command("maintain")(maintain_command)
cli.command("install")(install_command)
cli.command("manifest")(manifest_command)
cli.command("rate-limits")(rate_limits)

__all__ = [
    "BIGINT_MAX",
    "BIGINT_MIN",
    "BULK_BATCH",
    "BULK_VERSION",
    "CANCEL",
    "CANCELLING",
    "CANCEL_JOBS",
    "CONNECT_HINT",
    "DEFAULT_RETENTION",
    "ENQUEUE",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "INFINITY",
    "INT_MAX",
    "INT_MIN",
    "IN_OWN_TIMEZONE",
    "JOB_COLUMNS",
    "JOB_ERRORS",
    "JOB_STATE",
    "JOB_STEPS",
    "JSON_DEPTH",
    "LEASE_LEAST",
    "LIST_JOBS",
    "LIST_JOBS_NAMED",
    "LIST_OUTBOX",
    "LOG_LEVELS",
    "MAX_CONCURRENCY",
    "MAX_SECONDS",
    "METRICS_HOST",
    "NEG_INFINITY",
    "OUTBOX_COLUMNS",
    "OUTBOX_STATES",
    "OWN_TIMEZONE",
    "PAUSE",
    "PIN_UTC",
    "PIPE_WIDTH",
    "POLL_LEAST",
    "PREVIEW",
    "PUBLISH",
    "QUEUE_STATS",
    "REDRIVE",
    "RESOLVE_STEP",
    "RESUME",
    "RETRY",
    "RETRYING",
    "RETRY_JOBS",
    "SHORT",
    "SHOWABLE",
    "SHOW_JOB",
    "SHOW_OUTBOX",
    "STEP_COLUMNS",
    "SYNCED_BY",
    "VERSION",
    "WANTS_JSON",
    "AsJson",
    "ByName",
    "ByQueue",
    "ByTenant",
    "CreatedAfter",
    "CreatedBefore",
    "DatabaseError",
    "Dsn",
    "EnqueuedRow",
    "Grace",
    "JobErrorRow",
    "JobId",
    "JobIds",
    "JobRow",
    "JsonLogFormatter",
    "ListenDsn",
    "LogFormat",
    "LogLevel",
    "MessageNotFound",
    "MetricsHost",
    "MetricsPort",
    "OutboxRow",
    "Output",
    "PageSize",
    "Poll",
    "PublishedRow",
    "QueueName",
    "QueueRow",
    "RawJson",
    "ScheduleName",
    "StepRow",
    "TextLogFormatter",
    "Yes",
    "cli",
    "database",
    "events_cli",
    "events_publish",
    "install_command",
    "jobs_cancel",
    "jobs_cli",
    "jobs_list",
    "jobs_retry",
    "jobs_show",
    "load_app",
    "main",
    "maintain_command",
    "manifest_command",
    "outbox_cli",
    "outbox_list",
    "outbox_redrive",
    "outbox_show",
    "queues_cli",
    "queues_pause",
    "queues_policy",
    "queues_resume",
    "relay",
    "schedules_cli",
    "schedules_list",
    "schedules_pause",
    "schedules_preview",
    "schedules_resume",
    "schedules_run",
    "schedules_show",
    "schedules_sync",
    "setup_logging",
    "steps_cli",
    "steps_resolve",
    "tenants_bind",
    "tenants_cli",
    "tenants_list",
    "tenants_unbind",
    "tick_command",
    "worker",
]


def main() -> None:
    cli()
