"""``x-jobs jobs list|show|retry|cancel``: jobs newest first and page by page, one job with its
steps and errors, and the jobs to re-queue or cancel, by ID or by filter (see :mod:`._bulk`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, LiteralString

import typer
from psycopg.rows import class_row
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from x_jobs.cli._bulk import (
    CANCELLING,
    RETRYING,
    ByName,
    ByQueue,
    ByTenant,
    CreatedAfter,
    CreatedBefore,
    Yes,
    _by_filters,
    _filters,
    _ids_or_filters,
)
from x_jobs.cli._database import _require_0_4, database, in_tenant
from x_jobs.cli._options import BIGINT_MAX, BIGINT_MIN, AsJson, Dsn, InTenant, PageSize
from x_jobs.cli._output import (
    Output,
    _cell,
    _dumps,
    _fields,
    _json_view,
    _next_page,
    _or_dash,
    _safe,
    _shorten,
    _table,
    _utc,
    _when,
    _width,
)
from x_jobs.cli._rows import JOB_COLUMNS, JOB_STATE, STEP_COLUMNS, JobRow, StepRow
from x_jobs.errors import JobNotFound
from x_jobs.errors import first_line as _first_line

logger = logging.getLogger(__name__)


jobs_cli = typer.Typer(help="List, show, retry and cancel jobs.", no_args_is_help=True)


@dataclass(frozen=True)
class JobErrorRow:
    """One failed attempt of a job (x_jobs.job_errors)."""

    attempt: int
    failed_at: datetime
    worker: str | None
    error: str
    error_stack: str | None


LIST_JOBS: LiteralString = (
    "SELECT "
    + JOB_COLUMNS
    + """
    FROM x_jobs.list_jobs(state => %(state)s, queue => %(queue)s, before_id => %(before)s::bigint,
                          max_rows => %(limit)s::integer)
    ORDER BY id DESC
"""
)
# With a job name (x_jobs 0.4.0 and later); LIST_JOBS reads every version this client speaks to.
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

RETRY: LiteralString = "SELECT x_jobs.retry(id => %(id)s)"
CANCEL: LiteralString = "SELECT x_jobs.cancel(id => %(id)s)"

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
    tenant: InTenant = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Jobs newest first, one page at a time (x_jobs.list_jobs); page on with --before.

    After a full page it prints the command for the next one: --before the page's last id.
    """
    out = Output(as_json)
    params = {"state": state, "queue": queue, "before": before, "limit": limit, "name": name}
    with database(dsn, out, tenant=tenant) as conn:
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
        args += ["--tenant", tenant] if tenant is not None else []
        args += ["--limit", str(limit)] if limit != 50 else []
        args += ["--before", str(next_before)]
        human += _next_page(args, dsn)
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
def jobs_show(
    job_id: JobId, tenant: InTenant = None, dsn: Dsn = None, as_json: AsJson = False
) -> None:
    """One job: its row and progress, its steps in the order the run reached them
    (x_jobs.job_steps), then every failed attempt (x_jobs.job_errors), oldest first."""
    out = Output(as_json)
    # REPEATABLE READ: one snapshot for the row, its steps and its errors, which autocommit's
    # READ COMMITTED would give each statement on its own.
    with database(dsn, out) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        in_tenant(conn, tenant)  # after the isolation level, which must come first
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
