"""``x-jobs queues [pause|resume|policy]``: live jobs per queue and state, demand, the pauses,
and the queues' policies (fair shares across tenants, their weights)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, Any, LiteralString

import typer
from psycopg.rows import class_row

from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn, InTenant
from x_jobs.cli._output import Output, _cell, _table, _when
from x_jobs.queues import QueuePolicy, queue_policies, set_queue_policy

logger = logging.getLogger(__name__)


queues_cli = typer.Typer(help="Queues: live jobs per state, demand, pauses, fair shares.")


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
    `resume` lets it go; `policy` lists or sets which queues share their claims fairly across
    tenants.
    """
    if ctx.invoked_subcommand is not None:
        return  # pause/resume/policy read --dsn/--json given here from ctx.parent
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


Fair = Annotated[
    bool | None,
    typer.Option(
        "--fair/--no-fair",
        help="Take the queue's ready jobs in turns across tenants, or in FIFO order again.",
        show_default=False,
    ),
]
Weights = Annotated[
    list[str] | None,
    typer.Option(
        "--weight",
        metavar="TENANT=N",
        help="A tenant's jobs a turn, 1 to 1000 (repeatable): these replace the queue's weights.",
        show_default=False,
    ),
]
ClearWeights = Annotated[
    bool,
    typer.Option("--clear-weights", help="Drop the queue's weights: 1 a turn for every tenant."),
]


def _weights(given: list[str] | None, clear: bool) -> dict[str, int] | None:
    """The weights --weight TENANT=N (repeated) or --clear-weights ask for; None: keep them. A
    number out of 1..1000 goes to the database, which refuses it (X_QUEUE_POLICY_INVALID)."""
    if clear and given:
        raise typer.BadParameter(
            "--clear-weights drops every weight; give it or --weight, not both",
            param_hint="'--clear-weights' / '--weight'",
        )
    if clear:
        return {}
    if not given:
        return None
    weights: dict[str, int] = {}
    for item in given:
        # The last '=': a tenant id may hold one, a number does not.
        tenant, sep, number = item.rpartition("=")
        try:
            weight = int(number)
        except ValueError:
            weight = None
        if not sep or not tenant or weight is None:
            raise typer.BadParameter(
                f"{item!r} is not TENANT=N, such as acme=3", param_hint="'--weight'"
            )
        if tenant in weights:
            raise typer.BadParameter(f"tenant {tenant!r} is given twice", param_hint="'--weight'")
        weights[tenant] = weight
    return weights


def _policy_doc(p: QueuePolicy) -> dict[str, Any]:
    return dataclasses.asdict(p)


def _weights_cell(weights: dict[str, int]) -> str:
    return " ".join(f"{t}={n}" for t, n in sorted(weights.items())) if weights else "-"


def _said(p: QueuePolicy) -> str:
    if not p.fair:
        how = f"queue {p.queue} takes its jobs in FIFO order"
    else:
        ready = "" if p.index_ready else "; its index is missing: set the policy again to build it"
        how = f"queue {p.queue} takes its jobs in turns across tenants{ready}"
    return f"{how}; weights: {_weights_cell(p.weights)}"


@queues_cli.command("policy")
def queues_policy(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(metavar="QUEUE", help="The queue to set (or show); none: every policy."),
    ] = None,
    fair: Fair = None,
    weight: Weights = None,
    clear_weights: ClearWeights = False,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """List the queues' policies (x_jobs.queue_policies), or set one (x_jobs.set_queue_policy).

    A fair queue's claims take its ready jobs in turns across tenants, a tenant's weight at a
    time (1 without one), so that one tenant's flood delays another's jobs by about a turn.
    Making a queue fair builds an index and holds off writes to x_jobs.job while it builds.
    Setting needs x_jobs_admin; what is not given is kept.
    """
    dsn, as_json = _inherited(ctx, dsn, as_json)
    weights = _weights(weight, clear_weights)
    setting = fair is not None or weights is not None
    if setting and name is None:
        raise typer.BadParameter("name the queue whose policy to set", param_hint="'QUEUE'")
    out = Output(as_json)
    if setting:
        assert name is not None
        with database(dsn, out) as conn:
            policy = set_queue_policy(conn, name, fair=fair, weights=weights)
        out.emit(_policy_doc(policy), _said(policy))
        return
    with database(dsn, out) as conn:
        rows = [p for p in queue_policies(conn) if name is None or p.queue == name]
    table = _table()
    for column in ("queue", "fair", "weights", "index", "updated at", "updated by"):
        table.add_column(column, overflow="fold")
    for p in rows:
        index = (
            "-" if p.fair_index is None else p.fair_index + ("" if p.index_ready else " (missing)")
        )
        table.add_row(
            _cell(p.queue),
            _cell("yes" if p.fair else "no"),
            _cell(_weights_cell(p.weights)),
            _cell(index),
            _cell(_when(p.updated_at)),
            _cell(p.updated_by),
        )
    empty = "no queue has a policy" if name is None else f"queue {name} has no policy (FIFO)"
    out.emit({"policies": [_policy_doc(p) for p in rows]}, table if rows else empty)
