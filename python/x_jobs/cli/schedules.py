"""``x-jobs schedules list|show|pause|resume|run|preview|sync`` and ``x-jobs tick``: the
schedules the database keeps (:mod:`x_jobs.schedules`), the instants a cron expression fires
at, an app's declarations written from a deploy step, and one tick for a Kubernetes CronJob.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any, LiteralString

import typer
from psycopg.rows import tuple_row
from rich.table import Table

from x_jobs import schedules
from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn, _iso_datetime, load_app
from x_jobs.cli._output import (
    Output,
    _cell,
    _fields,
    _json_view,
    _or_dash,
    _table,
    _utc,
    _when,
)
from x_jobs.schedules import ScheduleInfo

logger = logging.getLogger(__name__)


schedules_cli = typer.Typer(
    help="Schedules: list, show, pause, resume, run now, preview, sync an app's.",
    no_args_is_help=True,
)

#: Who ``schedules sync`` says declared the schedules it writes.
SYNCED_BY = "x-jobs schedules sync"

#: The instants of ``preview``, with each one's wall-clock time in the zone: the database
#: reads the zone (cron_next refuses a bad one, XJ046, before a row is read).
PREVIEW: LiteralString = """
    SELECT n.fire_at, n.fire_at AT TIME ZONE %(tz)s
    FROM x_jobs.cron_next(cron => %(cron)s, tz => %(tz)s, after => %(after)s::timestamptz,
                          count => %(count)s::integer) AS n
"""
#: A naive --after is a wall-clock time in --tz; checked first, so that a bad expression or
#: zone is refused as cron_next refuses it rather than by AT TIME ZONE.
CHECK_CRON: LiteralString = (
    "SELECT count(*) FROM x_jobs.cron_next(cron => %(cron)s, tz => %(tz)s, count => 1)"
)
LOCAL_AFTER: LiteralString = "SELECT %(after)s::timestamp AT TIME ZONE %(tz)s"

ScheduleName = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]


def _state(info: ScheduleInfo) -> str:
    return "paused" if info.paused else "active"


def _last_job(info: ScheduleInfo) -> str:
    if info.last_job_id is None:
        return "-"
    return f"{info.last_job_id} ({_or_dash(info.last_job_state)})"


def _schedules_table(rows: list[ScheduleInfo]) -> Table:
    table = _table()
    table.add_column("name", overflow="fold", min_width=8)
    table.add_column("job", overflow="fold", min_width=6)
    table.add_column("cron", no_wrap=True)
    table.add_column("tz", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("next fire (UTC)", no_wrap=True)
    table.add_column("last fire (UTC)", no_wrap=True)
    table.add_column("last job", no_wrap=True)
    table.add_column("fires", justify="right", no_wrap=True)
    table.add_column("skips", justify="right", no_wrap=True)
    for info in rows:
        table.add_row(
            _cell(info.name),
            _cell(info.job),
            _cell(info.cron),
            _cell(info.tz),
            _cell(_state(info)),
            _cell(_utc(info.next_fire_at)),
            _cell(_utc(info.last_fire_at)),
            _cell(_last_job(info)),
            _cell(str(info.fires)),
            _cell(str(info.skips)),
        )
    return table


def _seconds(value: timedelta | None) -> str:
    return "-" if value is None else f"{value.total_seconds():g} s"


def _schedule_fields(info: ScheduleInfo) -> Table:
    concurrency = (
        f"{info.concurrency_key} (limit {_or_dash(info.concurrency_limit)})"
        if info.concurrency_key
        else "-"
    )
    backoff = (
        "-"
        if info.backoff_base is None and info.backoff_max is None
        else f"{_or_dash(info.backoff_base)} .. {_or_dash(info.backoff_max)}"
    )
    catchup = info.catchup + (f" (at most {info.catchup_max})" if info.catchup == "all" else "")
    return _fields(
        [
            ("name", info.name),
            ("job", info.job),
            ("cron", info.cron),
            ("time zone", info.tz),
            ("state", _state(info)),
            ("next fire", _when(info.next_fire_at)),
            ("last fire", _when(info.last_fire_at)),
            ("last enqueued", _when(info.last_enqueued_at)),
            ("last job", _last_job(info)),
            ("fires", str(info.fires)),
            ("skips", str(info.skips)),
            ("last error", _or_dash(info.last_error)),
            ("catch-up", catchup),
            ("overlap", info.overlap),
            ("grace", _seconds(info.grace)),
            ("input", _json_view(info.input)),
            ("queue", _or_dash(info.queue)),
            ("priority", _or_dash(info.priority)),
            ("max attempts", _or_dash(info.max_attempts)),
            ("tenant", _or_dash(info.tenant_id)),
            ("concurrency", concurrency),
            (
                "dead letter",
                "-" if info.dead_letter is None else "yes" if info.dead_letter else "no",
            ),
            (
                "kept when done",
                "-" if info.keep_done is None else "yes" if info.keep_done else "no",
            ),
            ("backoff", backoff),
            ("origin", _or_dash(info.origin)),
            ("declared by", _or_dash(info.declared_by)),
            ("created", _when(info.created_at)),
            ("updated", _when(info.updated_at)),
        ]
    )


@schedules_cli.command("list")
def schedules_list(dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Every schedule, by name (x_jobs.list_schedules).

    When each fires next and fired last, its last job, and how many instants it fired and
    skipped.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        rows = schedules.list_schedules(conn)
    out.emit(
        {"schedules": [dataclasses.asdict(info) for info in rows]},
        _schedules_table(rows) if rows else "no schedules",
    )


@schedules_cli.command("show")
def schedules_show(name: ScheduleName, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """One schedule: its expression and zone, policies, enqueue options and last fire.

    X_SCHEDULE_NOT_FOUND (exit 1) if there is none.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        info = schedules.show(conn, name)
    out.emit({"schedule": dataclasses.asdict(info)}, _schedule_fields(info))


@schedules_cli.command("pause")
def schedules_pause(name: ScheduleName, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Stop a schedule from firing (x_jobs.pause_schedule).

    It stays paused when its app declares it again. Needs x_jobs_admin.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        info = schedules.pause(conn, name)
    out.emit({"schedule": dataclasses.asdict(info)}, f"schedule {info.name} paused")


@schedules_cli.command("resume")
def schedules_resume(name: ScheduleName, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Let a paused schedule fire again (x_jobs.resume_schedule).

    It fires from its next instant after now: what it missed while paused is not caught up.
    Needs x_jobs_admin.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        info = schedules.resume(conn, name)
    out.emit(
        {"schedule": dataclasses.asdict(info)},
        f"schedule {info.name} active: fires next at {_when(info.next_fire_at)}",
    )


@schedules_cli.command("run")
def schedules_run(name: ScheduleName, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Enqueue a schedule's job now, once (x_jobs.run_schedule_now).

    Paused or not; its next instant stays, and the handler sees ctx.schedule.manual. With
    overlap skip and a run live, that run answers (deduped). Needs x_jobs_admin.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        enqueued = schedules.run_now(conn, name)
    said = (
        f"a run of schedule {name} is live already (overlap skip): job {enqueued.id}"
        if enqueued.deduped
        else f"schedule {name}: job {enqueued.id} enqueued"
    )
    out.emit({"schedule": name, **dataclasses.asdict(enqueued)}, said)


def _local(fire_at: datetime, wall: datetime) -> datetime:
    """The instant ``fire_at`` as the wall-clock time ``wall`` of its zone, with the offset."""
    offset = wall - fire_at.astimezone(UTC).replace(tzinfo=None)
    return wall.replace(tzinfo=timezone(offset))


@schedules_cli.command("preview")
def schedules_preview(
    expr: Annotated[
        str, typer.Argument(metavar="EXPR", help='A cron expression, such as "*/15 9-17 * * 1-5".')
    ],
    tz: Annotated[str, typer.Option(help="The IANA time zone it is read in.")] = "UTC",
    count: Annotated[int, typer.Option(min=1, max=1000, help="How many instants.")] = 5,
    after: Annotated[
        str | None,
        typer.Option(
            metavar="ISO",
            help="From this time on (default now); without an offset, a wall-clock time in --tz.",
            show_default=False,
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """The next instants a cron expression fires at (x_jobs.cron_next).

    In UTC and on the wall clock of --tz: what a schedule would do, without one.
    """
    out = Output(as_json)
    since = None if after is None else _iso_datetime(after)
    params: dict[str, Any] = {"cron": expr, "tz": tz, "count": count, "after": since}
    with database(dsn, out) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        if since is not None and since.tzinfo is None:
            cur.execute(CHECK_CRON, params)
            row = cur.execute(LOCAL_AFTER, params).fetchone()
            assert row is not None
            params["after"] = row[0]
        rows = cur.execute(PREVIEW, params).fetchall()
    instants = [(fire_at, _local(fire_at, wall)) for fire_at, wall in rows]
    table = _table()
    table.add_column("fire at (UTC)", no_wrap=True)
    table.add_column(f"in {tz}", no_wrap=True)
    for fire_at, local in instants:
        table.add_row(_cell(_utc(fire_at)), _cell(local.strftime("%Y-%m-%d %H:%M:%S %a (%z)")))
    out.emit(
        {
            "cron": expr,
            "tz": tz,
            "after": params["after"],
            "instants": [{"fire_at": at, "local": local.isoformat()} for at, local in instants],
        },
        table if instants else f"{expr} fires no more",
    )


@schedules_cli.command("sync")
def schedules_sync(
    app_path: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="Also drop the schedules this app once declared (origin code, a job of its)"
            " and no longer does. Needs x_jobs_admin.",
        ),
    ] = False,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Write the schedules MODULE:APP declares (x_jobs.set_schedule).

    In one transaction, as a worker does at its start, from a deploy step; schedules the app
    does not declare are left alone (see --prune).
    """
    out = Output(as_json)
    app = load_app(app_path)
    with database(dsn, out) as conn:
        synced = schedules.sync_schedules(conn, app, prune=prune, declared_by=SYNCED_BY)
    human: list[Any] = [
        _schedules_table(synced.schedules) if synced.schedules else "the app declares no schedule"
    ]
    human += [f"dropped {name}: the app no longer declares it" for name in synced.dropped]
    out.emit(
        {
            "schedules": [dataclasses.asdict(info) for info in synced.schedules],
            "dropped": synced.dropped,
        },
        *human,
    )


def tick_command(
    max_rows: Annotated[
        int,
        typer.Option(
            min=1, max=100_000, help="Schedules per call; it calls again while one comes back full."
        ),
    ] = schedules.TICK_MAX_ROWS,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Fire the schedules that are due (x_jobs.tick_schedules).

    It calls again until fewer than --max-rows were due. For a Kubernetes CronJob every
    minute, where workers run with --no-tick. Needs x_jobs_worker.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        ticked = schedules.tick(conn, max_rows)
    said = (
        f"{ticked.schedules:,} schedules ticked: {ticked.enqueued:,} jobs enqueued, "
        f"{ticked.skipped:,} instants skipped; next due at {_when(ticked.next_fire_at)}"
    )
    out.emit(dataclasses.asdict(ticked), said)
