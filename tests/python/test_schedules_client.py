"""Schedules from Python and the command line (x_jobs.schedules, ``x-jobs schedules``, ``x-jobs
tick``, the worker's sync and ticks), against a real server on the test clock.

An app's declarations are written by sync (create, update keeping the instant a schedule fires
next, never touching what it does not declare; prune drops only its own stale ones); the
database's refusals come out typed; a worker syncs at its start, ticks, and hands a fired job's
handler its ``ctx.schedule``, unless it runs with --no-tick.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Conn, serving, wait_for
from psycopg import sql
from pydantic import BaseModel
from test_cli import as_json, failed, x_jobs

import x_jobs as xj
from x_jobs import errors, schedules
from x_jobs.maintenance import Retention

TESTS = Path(__file__).resolve().parent

#: Monday 7 January 2030, 06:00 UTC (07:00 in Berlin, winter time: UTC+1).
T0 = datetime(2030, 1, 7, 6, 0, tzinfo=UTC)


def at(conn: Conn, when: datetime) -> None:
    """The test clock of this session (x_jobs.now()) at ``when``."""
    conn.execute("SELECT pg_catalog.set_config('x_jobs.fake_now', %s, false)", [when.isoformat()])


def for_every_session(conn: Conn, when: datetime) -> None:
    """The test clock at ``when`` for every session that connects to the database from now on
    (a worker's), and for this one."""
    db = sql.Identifier(conn.info.dbname)
    literal = sql.Literal(when.isoformat())
    conn.execute(sql.SQL("ALTER DATABASE {} SET x_jobs.fake_now = {}").format(db, literal))
    at(conn, when)


def row(conn: Conn, name: str) -> dict[str, Any]:
    found = conn.execute(
        "SELECT next_fire_at, origin, declared_by, updated_at, cron, paused, fires, input"
        " FROM x_jobs.schedule WHERE name = %s",
        [name],
    ).fetchone()
    assert found is not None, name
    keys = ("next_fire_at", "origin", "declared_by", "updated_at", "cron", "paused", "fires")
    return dict(zip((*keys, "input"), found, strict=True))


class Region(BaseModel):
    region: str = "all"


def report_app(dsn: str, *, evening: bool = True, cron: str = "0 9 * * MON-FRI") -> xj.App:
    """An app with ``report`` scheduled (named as the job) and, with ``evening``, a second
    schedule of it by app.schedule."""
    app = xj.App(dsn)

    @app.job(name="report", queue="reports", schedule=xj.Cron(cron, tz="Europe/Berlin"))
    def report(input: Region) -> None:
        pass

    if evening:
        app.schedule(
            "report-evening", report, "0 18 * * *", tz="Europe/Berlin", input={"region": "eu"}
        )
    return app


# --- declarations ---------------------------------------------------------------------------


def test_declarations_name_their_schedules_and_refuse_wrong_types() -> None:
    app = xj.App("")

    @app.job(name="one", schedule=xj.Cron("@daily"))
    def one(input: dict[str, Any]) -> None:
        pass

    @app.job(
        name="two",
        schedule=[
            xj.Cron("0 * * * *"),
            xj.Cron("0 9 * * *", "Europe/Berlin"),
            xj.Cron("@weekly", name="w"),
        ],
    )
    def two(input: dict[str, Any]) -> None:
        pass

    app.schedule("one-hourly", one, "5 * * * *", queue="elsewhere", grace=timedelta(minutes=5))
    assert sorted(app.schedules) == [
        "one",
        "one-hourly",
        "two@0 * * * *",
        "two@0 9 * * * Europe/Berlin",
        "w",
    ]
    assert app.schedules["one"].cron == xj.Cron("@daily", name="one")
    assert app.schedules["one-hourly"].job == "one"
    assert app.schedules["one-hourly"].queue == "elsewhere"

    with pytest.raises(ValueError, match="'one' is declared already"):
        app.schedule("one", "one", "* * * * *")
    with pytest.raises(ValueError, match="two schedules of one name"):
        app.job(name="three", schedule=[xj.Cron("@daily"), xj.Cron("@daily")])(one.fn)
    assert "three" not in app.jobs
    with pytest.raises(TypeError, match=r"x_jobs\.Cron"):
        app.job(name="four", schedule="@daily")(one.fn)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expression as a str"):
        app.schedule("five", "one", xj.Cron("@daily"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expr is a str"):
        xj.Cron(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="grace is seconds"):
        xj.Cron("@daily", grace="1 minute")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="input is a mapping"):
        xj.Cron("@daily", input=[1])  # type: ignore[arg-type]


def test_sync_creates_updates_and_never_touches_what_it_does_not_declare(
    dsn: str, conn: Conn
) -> None:
    at(conn, T0)
    conn.execute(
        "SELECT x_jobs.set_schedule(name => 'by-hand', job => 'report', cron => '@hourly')"
    )
    conn.execute(
        "SELECT x_jobs.set_schedule(name => 'other-app', job => 'elsewhere', cron => '@daily',"
        " origin => 'code', declared_by => 'another app')"
    )
    untouched = {name: row(conn, name) for name in ("by-hand", "other-app")}

    app = report_app(dsn)
    synced = schedules.sync_schedules(conn, app, declared_by="deploy 1")
    assert [s.name for s in synced.schedules] == ["report", "report-evening"]
    assert synced.dropped == []
    report = synced.schedules[0]
    # 09:00 in Berlin, winter time; the job's own options, as job.enqueue sends them.
    assert report.next_fire_at == datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
    assert (report.queue, report.max_attempts, report.input) == ("reports", 25, {"region": "all"})
    assert (report.origin, report.declared_by, report.tz) == ("code", "deploy 1", "Europe/Berlin")
    assert row(conn, "report-evening")["input"] == {"region": "eu"}

    # Past the instant, before any tick: declared again, the due fire stays (a recomputation
    # from now would skip to the next day), and an operator's pause outlives the deploy.
    at(conn, T0 + timedelta(hours=2, seconds=30))
    schedules.pause(conn, "report-evening")
    again = schedules.sync_schedules(conn, app, declared_by="deploy 2")
    assert again.schedules[0].next_fire_at == datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
    assert again.schedules[0].declared_by == "deploy 2"
    assert row(conn, "report-evening")["paused"] is True

    # A new time: the instants change, so does the next one. prune drops the schedule of this
    # app's job that it no longer declares, and only that one.
    later = report_app(dsn, evening=False, cron="30 9 * * MON-FRI")
    pruned = schedules.sync_schedules(conn, later, prune=True)
    assert [s.name for s in pruned.schedules] == ["report"]
    assert pruned.schedules[0].next_fire_at == datetime(2030, 1, 7, 8, 30, tzinfo=UTC)
    assert pruned.dropped == ["report-evening"]
    names = [s.name for s in schedules.list_schedules(conn)]
    assert names == ["by-hand", "other-app", "report"]
    for name, before in untouched.items():
        assert row(conn, name) == before
    for closed in (app, later):
        closed.close()


def test_refusals_are_typed_and_a_refused_sync_writes_nothing(dsn: str, conn: Conn) -> None:
    def app_with(cron: xj.Cron) -> xj.App:
        app = report_app(dsn)
        app.schedule("bad", "report", cron.expr, tz=cron.tz, catchup=cron.catchup)
        return app

    cases: list[tuple[xj.Cron, type[errors.XJobsError], str]] = [
        (xj.Cron("0 25 * * *"), errors.CronInvalid, "XJ043"),
        (xj.Cron("0 9 * * * *"), errors.CronInvalid, "XJ043"),
        (xj.Cron("@daily", "Mars/Olympus"), errors.TimeZoneInvalid, "XJ046"),
        (xj.Cron("@daily", "UTC+3"), errors.TimeZoneInvalid, "XJ046"),
        (xj.Cron("@daily", catchup="some"), errors.ScheduleInvalid, "XJ049"),
    ]
    for cron, cls, sqlstate in cases:
        with pytest.raises(cls) as refused:
            schedules.sync_schedules(conn, app_with(cron))
        assert refused.value.sqlstate == sqlstate
        assert refused.value.hint, cron
    assert schedules.list_schedules(conn) == []

    # An input the job's type refuses is refused here, before the database.
    app = report_app(dsn)
    app.schedule("typed", "report", "@daily", input={"region": ["not", "a", "str"]})
    with pytest.raises(errors.InputInvalid):
        schedules.sync_schedules(conn, app)
    with pytest.raises(errors.CronInvalid):
        schedules.preview(conn, "61 * * * *")
    with pytest.raises(errors.QtyInvalid):
        schedules.preview(conn, "@daily", count=0)
    for call in (schedules.show, schedules.pause, schedules.resume, schedules.run_now):
        with pytest.raises(errors.ScheduleNotFound, match="X_SCHEDULE_NOT_FOUND: no schedule"):
            call(conn, "nope")
    assert schedules.drop(conn, "nope") is False


@pytest.mark.parametrize("expr", ["* * *", "", "* * * * * * *"])
def test_an_expression_of_the_wrong_number_of_fields_is_cron_invalid(conn: Conn, expr: str) -> None:
    with pytest.raises(errors.CronInvalid, match="fields, not 5"):
        schedules.preview(conn, expr)


def test_preview_follows_the_zone_across_its_dst_change(conn: Conn) -> None:
    # Berlin springs forward at 02:00 on 31 March 2030: 02:30 does not exist that day, and the
    # daily 02:30 fires once at 03:00 (Vixie's rule).
    after = datetime(2030, 3, 29, 12, 0, tzinfo=UTC)
    fires = schedules.preview(conn, "30 2 * * *", "Europe/Berlin", after=after, count=3)
    assert fires == [
        datetime(2030, 3, 30, 1, 30, tzinfo=UTC),
        datetime(2030, 3, 31, 1, 0, tzinfo=UTC),
        datetime(2030, 4, 1, 0, 30, tzinfo=UTC),
    ]


# --- the command line -------------------------------------------------------------------------


def test_cli_schedules_commands(dsn: str, conn: Conn) -> None:
    def run(*args: str) -> Any:
        return as_json(x_jobs(*args, "--json", "--dsn", dsn))

    # sync from a deploy step, then the second build with --prune.
    synced = run("schedules", "sync", "apps.scheduled:v1")
    assert [s["name"] for s in synced["schedules"]] == ["report", "report-evening"]
    assert synced["schedules"][0]["declared_by"] == "x-jobs schedules sync"
    pruned = run("schedules", "sync", "apps.scheduled:v2", "--prune")
    assert ([s["name"] for s in pruned["schedules"]], pruned["dropped"]) == (
        ["report"],
        ["report-evening"],
    )
    assert pruned["schedules"][0]["cron"] == "30 9 * * MON-FRI"

    listed = run("schedules", "list")["schedules"]
    assert [(s["name"], s["job"], s["tz"], s["paused"]) for s in listed] == [
        ("report", "report", "Europe/Berlin", False)
    ]
    shown = run("schedules", "show", "report")["schedule"]
    assert (shown["queue"], shown["grace"], shown["catchup"]) == ("reports", 60.0, "latest")
    assert run("schedules", "pause", "report")["schedule"]["paused"] is True
    assert run("schedules", "resume", "report")["schedule"]["paused"] is False

    ran = run("schedules", "run", "report")
    assert (ran["schedule"], ran["deduped"]) == ("report", False)
    job = conn.execute("SELECT input, enqueued_by FROM x_jobs.job WHERE id = %s", [ran["id"]])
    input_, enqueued_by = job.fetchone() or (None, None)
    assert enqueued_by == "schedule:report"
    assert input_["_schedule"]["manual"] is True

    preview = run(
        "schedules", "preview", "30 2 * * *", "--tz", "Europe/Berlin", "--count", "2",
        "--after", "2030-03-30T12:00",
    )  # fmt: skip
    # A naive --after is Berlin's wall clock (11:00 UTC).
    assert preview["after"] == "2030-03-30T11:00:00+00:00"
    assert preview["instants"] == [
        {"fire_at": "2030-03-31T01:00:00+00:00", "local": "2030-03-31T03:00:00+02:00"},
        {"fire_at": "2030-04-01T00:30:00+00:00", "local": "2030-04-01T02:30:00+02:00"},
    ]
    human = x_jobs("schedules", "preview", "0 12 * * *", "--tz", "America/New_York", "--dsn", dsn)
    assert "(-0" in human.stdout, human.stdout

    # Due now on the test clock: tick fires it (one call: fewer than --max-rows were due).
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET x_jobs.fake_now = '2031-01-06 09:00:10+01'").format(
            sql.Identifier(conn.info.dbname)
        )
    )
    conn.execute(
        "SELECT x_jobs.set_schedule(name => 'soon', job => 'ping', cron => '* * * * *')"
    )  # due at once for the new sessions: made at the real time, in the past of theirs
    ticked = run("tick", "--max-rows", "1")
    assert ticked["calls"] >= 2 and ticked["enqueued"] >= 2, ticked
    assert run("tick")["schedules"] == 0

    for args, code in [
        (("schedules", "show", "nope"), "X_SCHEDULE_NOT_FOUND"),
        (("schedules", "run", "nope"), "X_SCHEDULE_NOT_FOUND"),
        (("schedules", "preview", "61 * * * *"), "X_CRON_INVALID"),
        (("schedules", "preview", "@daily", "--tz", "Nowhere/City"), "X_TIME_ZONE_INVALID"),
        (
            ("schedules", "preview", "@daily", "--tz", "Nowhere/City", "--after", "2030-01-01"),
            "X_TIME_ZONE_INVALID",
        ),
    ]:
        result = failed(x_jobs(*args, "--json", "--dsn", dsn), 1)
        assert json.loads(result.stdout)["error"]["code"] == code, args
    failed(x_jobs("tick", "--max-rows", "0", "--dsn", dsn), 2)
    failed(x_jobs("schedules", "preview", "@daily", "--count", "1001", "--dsn", dsn), 2)


# --- the worker -------------------------------------------------------------------------------


def worker_of(app: xj.App, **options: Any) -> AbstractContextManager[xj.Worker]:
    return serving(app, concurrency=2, **options)


def test_a_worker_syncs_ticks_and_hands_the_handler_its_schedule(dsn: str, conn: Conn) -> None:
    """Declared at 08:59 and first ticked five minutes past its 09:00 instant (nothing ticked
    meanwhile): the worker's sync keeps the instant, its first tick fires it, late, and the
    handler gets the schedule's input alone, and ctx.schedule."""
    seen: list[tuple[Any, xj.Scheduled | None]] = []
    app = xj.App(dsn)

    @app.job(name="daily", schedule=xj.Cron("0 9 * * *", input={"region": "eu"}, grace=60))
    def daily(input: Region, ctx: xj.JobContext) -> None:
        seen.append((input, ctx.schedule))

    at(conn, datetime(2030, 1, 7, 8, 59, tzinfo=UTC))
    schedules.sync_schedules(conn, app)
    for_every_session(conn, datetime(2030, 1, 7, 9, 5, tzinfo=UTC))
    with worker_of(app) as worker:
        wait_for(lambda: len(seen) == 1, "the fired job to run")
        assert seen[0] == (
            Region(region="eu"),
            xj.Scheduled("daily", datetime(2030, 1, 7, 9, 0, tzinfo=UTC), late=True, manual=False),
        )
        ticker = worker._ticker
        assert ticker is not None
        # The job can run before the ticker's thread counts the tick that fired it.
        wait_for(lambda: ticker.ticks >= 1, "the ticker to count its tick")
        schedules.run_now(conn, "daily")
        wait_for(lambda: len(seen) == 2, "the run asked by hand")
        assert seen[1][1] == xj.Scheduled(
            "daily", datetime(2030, 1, 7, 9, 5, tzinfo=UTC), late=False, manual=True
        )
    info = schedules.show(conn, "daily")
    assert info.next_fire_at == datetime(2030, 1, 8, 9, 0, tzinfo=UTC)
    assert (info.fires, info.last_job_state) == (2, "done")
    assert info.declared_by == worker.worker_id


def test_a_worker_that_does_not_tick_only_syncs(dsn: str, conn: Conn) -> None:
    """tick_schedules=False (and `x-jobs worker --no-tick`, a real process): the schedules are
    written at the start, and a due one stays due while the worker runs other jobs."""
    ran: list[int] = []
    app = xj.App(dsn)

    @app.job(name="daily", schedule=xj.Cron("0 9 * * *"))
    def daily(input: dict[str, Any], ctx: xj.JobContext) -> None:
        ran.append(ctx.id)

    at(conn, datetime(2030, 1, 7, 8, 59, tzinfo=UTC))
    conn.execute("SELECT x_jobs.set_schedule(name => 'report', job => 'report', cron => '@hourly')")
    schedules.sync_schedules(conn, app)
    for_every_session(conn, datetime(2030, 1, 7, 9, 5, tzinfo=UTC))
    with worker_of(app, tick_schedules=False) as worker:
        job = daily.enqueue({})
        wait_for(lambda: ran == [job.id], "the enqueued job to run")
        assert worker._ticker is None
    assert schedules.show(conn, "daily").fires == 0

    # The process: it writes apps.scheduled:v1's schedules, runs a ping, and fires nothing.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DATABASE_URL", None)
    command = [sys.executable, "-m", "x_jobs", "worker", "apps.scheduled:v1", "--no-tick"]
    process = subprocess.Popen(
        [*command, "--dsn", dsn, "--poll", "0.05"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: row_exists(conn, "report-evening"), "the worker to write its schedules")
        assert row(conn, "report")["cron"] == "0 9 * * MON-FRI"  # the app's, over the one by hand
        ping = conn.execute("SELECT id FROM x_jobs.enqueue(name => 'ping', queue => 'reports')")
        (ping_id,) = ping.fetchone() or (None,)
        wait_for(lambda: state(conn, ping_id) == "done", "the worker to run a ping")
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert [row(conn, name)["fires"] for name in ("daily", "report", "report-evening")] == [0, 0, 0]


def row_exists(conn: Conn, name: str) -> bool:
    return bool(conn.execute("SELECT 1 FROM x_jobs.schedule WHERE name = %s", [name]).fetchone())


def state(conn: Conn, job_id: int) -> str | None:
    found = conn.execute("SELECT state::text FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    return None if found is None else str(found[0])


def test_schedule_maintenance_declares_its_job_and_schedule_and_runs(dsn: str, conn: Conn) -> None:
    app = xj.App(dsn)
    job = app.schedule_maintenance("5 * * * *", retention=Retention(jobs=timedelta(days=1)))
    assert job.name == "x_jobs.maintain" and app.jobs["x_jobs.maintain"] is job
    declared = app.schedules["x_jobs.maintain"]
    assert (declared.job, declared.cron.expr, declared.cron.overlap) == (
        "x_jobs.maintain",
        "5 * * * *",
        "skip",
    )
    # A finished job two days old, which a day's retention purges.
    old = conn.execute("SELECT id FROM x_jobs.enqueue(name => 'old', queue => 'past')").fetchone()
    conn.execute(
        "UPDATE x_jobs.job SET state = 'done', finished_at = now() - interval '2 days'"
        " WHERE id = %s",
        [old and old[0]],
    )
    with worker_of(app):
        wait_for(lambda: row_exists(conn, "x_jobs.maintain"), "the worker to write the schedule")
        ran = schedules.run_now(conn, "x_jobs.maintain")
        wait_for(lambda: state(conn, ran.id) == "done", "the maintenance job to run")
    output = conn.execute("SELECT output FROM x_jobs.job WHERE id = %s", [ran.id]).fetchone()
    assert output is not None and output[0]["deleted"]["jobs"] == 1
    assert row(conn, "x_jobs.maintain")["cron"] == "5 * * * *"
