"""``x-jobs enqueue``: one job through x_jobs.enqueue, from any shell, without an App."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, LiteralString

import typer
from psycopg.rows import class_row

from x_jobs.cli._database import _OWN_TIMEZONES, OWN_TIMEZONE, database
from x_jobs.cli._options import INT_MAX, INT_MIN, AsJson, Dsn, _iso_datetime, _json_input
from x_jobs.cli._output import INFINITY, Output, _fields

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnqueuedRow:
    """What x_jobs.enqueue answers."""

    id: int
    run_id: str
    deduped: bool


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

# A time without an offset, read in the session's TimeZone: does it fall in the years 1 to 9999
# in UTC?
SHOWABLE: LiteralString = """
    SELECT %s::timestamp::timestamptz
        BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'
"""


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
