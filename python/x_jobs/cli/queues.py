"""``x-jobs queues [pause|resume]``: live jobs per queue and state, demand, and the pauses."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, LiteralString

import typer
from psycopg.rows import class_row

from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn, InTenant
from x_jobs.cli._output import Output, _cell, _table

logger = logging.getLogger(__name__)


queues_cli = typer.Typer(help="Queues: live jobs per state, demand, pauses.")


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


QUEUE_STATS: LiteralString = """
    SELECT queue, ready, delayed, suspended, running, demand, paused FROM x_jobs.queue_stats()
"""

PAUSE: LiteralString = "SELECT x_jobs.pause_queue(queue => %(queue)s)"
RESUME: LiteralString = "SELECT x_jobs.resume_queue(queue => %(queue)s)"


@queues_cli.callback(invoke_without_command=True)
def queues(
    ctx: typer.Context, tenant: InTenant = None, dsn: Dsn = None, as_json: AsJson = False
) -> None:
    """Per queue: live jobs by state, demand, paused (x_jobs.queue_stats); pause or resume one.

    Queues with no live job and no pause are absent. `pause` holds a queue back from every claim,
    `resume` lets it go.
    """
    if ctx.invoked_subcommand is not None:
        return  # pause/resume read --dsn/--json given here from ctx.parent
    out = Output(as_json)
    with database(dsn, out, tenant=tenant) as conn:
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
