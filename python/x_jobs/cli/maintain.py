"""``x-jobs maintain``: delete what is past its retention and fold old counters
(:mod:`x_jobs.maintenance`).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Annotated, Any

import typer

from x_jobs import maintenance
from x_jobs.cli._database import database
from x_jobs.cli._options import INT_MAX, AsJson, Dsn
from x_jobs.cli._output import Output, _table
from x_jobs.maintenance import Retention, parse_age

logger = logging.getLogger(__name__)

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
