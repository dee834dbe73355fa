"""A database of the previous release updated in place while a worker of the previous client
drains it: ``ALTER EXTENSION x_jobs UPDATE`` in the middle of the drain, jobs enqueued after it
by the newest client's App and by plain SQL, and every job run exactly once by that worker.

The previous release, its commit and its client come from tests/python/previous.py (the tag
``v<version>`` or the commit that recorded its update script in sql/RELEASED; ``git archive`` of
its python/). The worker is ``python -m x_jobs worker apps.upgrade:app`` with that client first on
PYTHONPATH, logged in as a role granted x_jobs_worker alone (as a deployment runs it, so the
update must keep what that client calls granted); every run records ``x_jobs.__version__`` as
the worker process saw it, so the test knows the runs were the previous client's.

What the previous client does against a newer database: its worker checks the version once, when
it starts (``App.check_version``: ``x_jobs.version()`` must be one of its SUPPORTED_VERSIONS,
which cannot name a later release). A worker that started before the update is never checked
again and keeps serving through and after it; a worker of the previous client started on a
database of the newest version refuses: ``X_VERSION_UNSUPPORTED: this client speaks x_jobs [...],
the database has <newest>``, exit status 2, nothing claimed. So an update in place keeps the
running workers working, and the workers are then restarted with the new client.
"""

from __future__ import annotations

import collections
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import upgrade
from apps.workers import Fleet
from conftest import Conn, fresh_database
from previous import Client, PreviousUnavailable, newest_version, previous_client
from psycopg import sql
from psycopg.conninfo import make_conninfo

import x_jobs

#: Jobs enqueued before the update (the first is ``hold``), by the App after it, by SQL after it.
BEFORE, BY_APP, BY_SQL = 4000, 250, 250
#: The update starts once this many runs are recorded: the worker is well into the drain.
UPDATE_AFTER_RUNS = 400
#: The worker's lease, seconds; a heartbeat after the update pushes visible_at past it.
LEASE = 2.0

ENQUEUE_MANY = "SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)"


@pytest.fixture(scope="session")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Client:
    """The previous release's client, materialised once per session."""
    try:
        return previous_client(tmp_path_factory.mktemp("previous"))
    except PreviousUnavailable as err:
        pytest.fail(str(err))


@pytest.fixture
def previous_dsn(admin: Conn, previous: Client) -> Iterator[str]:
    """A database of this test's own at the previous release, installed as a user would:
    CREATE EXTENSION ... VERSION, through whatever chain of scripts reaches it."""
    with fresh_database(admin, "template0", prefix="x_jobs_previous") as conninfo:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE EXTENSION x_jobs VERSION {}").format(sql.Literal(previous.version))
            )
        yield conninfo


@pytest.fixture
def worker_login(admin: Conn) -> Iterator[str]:
    """A LOGIN role granted x_jobs_worker alone, as a deployment runs its workers: the update
    must keep what the previous client calls granted to it."""
    role = f"x_jobs_test_worker_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE x_jobs_worker").format(sql.Identifier(role))
    )
    try:
        yield role
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _jobs(name: str, numbers: range) -> str:
    return json.dumps([{"name": name, "queue": upgrade.QUEUE, "input": {"n": n}} for n in numbers])


def _extversion(conn: Conn) -> Any:
    row = conn.execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'x_jobs'")
    return row.fetchone()


def test_a_worker_of_the_previous_client_drains_through_an_update_in_place(
    previous: Client,
    previous_dsn: str,
    worker_login: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    newest = newest_version()
    # Fleet puts tests/python (the apps) first on the workers' PYTHONPATH, then this one.
    monkeypatch.setenv("PYTHONPATH", str(previous.python))
    with (
        Fleet(previous_dsn, tmp_path) as fleet,
        psycopg.connect(previous_dsn, autocommit=True) as conn,
    ):
        fleet.execute(upgrade.SCHEMA)
        assert _extversion(conn) == (previous.version,)
        conn.execute(ENQUEUE_MANY, [_jobs("hold", range(1))])
        conn.execute(ENQUEUE_MANY, [_jobs("record", range(1, BEFORE))])
        worker = fleet.start(
            target="apps.upgrade:app",
            concurrency=4,
            lease=LEASE,
            poll=0.1,
            via=make_conninfo(previous_dsn, user=worker_login),
        )

        def runs() -> int:
            return int(fleet.scalar("SELECT count(*) FROM public.upgrade_run"))

        fleet.wait_for(
            lambda: (
                fleet.scalar("SELECT count(*) FROM public.upgrade_run WHERE n = 0") == 1
                and runs() >= UPDATE_AFTER_RUNS
            ),
            f"the hold job and {UPDATE_AFTER_RUNS} others to run on {previous.version}",
        )

        try:
            conn.execute("ALTER EXTENSION x_jobs UPDATE")
        except psycopg.errors.DeadlockDetected as err:
            pytest.fail(
                f"ALTER EXTENSION x_jobs UPDATE from {previous.version} to {newest} deadlocked "
                f"with the worker: {err}\nAn update script that locks a table in one mode and "
                "later in a stronger one (CREATE INDEX, then ALTER TABLE ... OWNER) deadlocks "
                "with a worker's transaction that read the table and then writes it. Take the "
                "strongest locks first, at the top of the update script (LOCK TABLE ... IN "
                "ACCESS EXCLUSIVE MODE, in one order)."
            )
        row = conn.execute(
            "SELECT pg_catalog.clock_timestamp(), count(*) FILTER (WHERE state <> 'done')"
            " FROM x_jobs.job"
        ).fetchone()
        assert row is not None
        updated_at, not_done = row
        assert _extversion(conn) == (newest,)
        assert conn.execute("SELECT x_jobs.version()").fetchone() == (newest,)
        # The update landed in the middle of the drain, not after it: the hold job and a part
        # of the others were still to settle.
        assert not_done > 1, f"the worker had drained all but {not_done} before the update"

        app = x_jobs.App(previous_dsn)

        @app.job(name="record", queue=upgrade.QUEUE)
        def record(input: dict[str, Any]) -> None:
            """Declared to be enqueued by name; the previous client's worker runs it."""

        try:
            app.enqueue_many("record", [{"n": n} for n in range(BEFORE, BEFORE + BY_APP)])
        finally:
            app.close()
        conn.execute(
            "SELECT count(x_jobs.enqueue(name => 'record', queue => %s,"
            " input => pg_catalog.jsonb_build_object('n', g)))"
            " FROM pg_catalog.generate_series(%s::integer, %s::integer) AS g",
            [upgrade.QUEUE, BEFORE + BY_APP, BEFORE + BY_APP + BY_SQL - 1],
        )

        # The job claimed before the update is still the worker's: a heartbeat after the update
        # extends its lease past where the claim before it could have put it.
        fleet.wait_for(
            lambda: bool(
                fleet.scalar(
                    "SELECT visible_at > %s + %s * interval '1 second'"
                    " FROM x_jobs.job WHERE name = 'hold'",
                    [updated_at, LEASE],
                )
            ),
            "a heartbeat of the hold job after the update",
        )
        fleet.open_gate(upgrade.GATE)
        total = BEFORE + BY_APP + BY_SQL
        fleet.wait_for(
            lambda: (
                fleet.scalar("SELECT count(*) FROM x_jobs.job WHERE state <> 'done'") == 0
                and runs() >= total
            ),
            f"all {total} jobs to be done",
        )

        recorded = fleet.execute("SELECT n, pid, client, at FROM public.upgrade_run")
        counts = collections.Counter(int(r[0]) for r in recorded)
        twice = sorted(n for n, count in counts.items() if count > 1)
        assert not twice, f"jobs run more than once: {twice[:20]}"
        assert sorted(counts) == list(range(total)), "jobs never run"
        assert {(r[1], r[2]) for r in recorded} == {(worker.pid, previous.version)}
        # The worker kept serving after the update: it ran the jobs enqueued after it.
        assert all(r[3] > updated_at for r in recorded if int(r[0]) >= BEFORE)

        jobs = conn.execute(
            "SELECT state::text, attempt, count(*) FROM x_jobs.job GROUP BY 1, 2"
        ).fetchall()
        assert jobs == [("done", 1, total)]
        hold = conn.execute(
            "SELECT started_at < %s, finished_at > %s FROM x_jobs.job WHERE name = 'hold'",
            [updated_at, updated_at],
        ).fetchone()
        assert hold == (True, True), "the hold job was not claimed before and settled after"
        assert conn.execute("SELECT count(*) FROM x_jobs.job_error").fetchone() == (0,)

        assert worker.alive(), fleet.report()
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, fleet.report()
        assert "Traceback" not in worker.log(), worker.log()


def test_a_worker_of_the_previous_client_refuses_to_start_on_the_newest_version(
    previous: Client, dsn: str, conn: Conn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newest = newest_version()
    monkeypatch.setenv("PYTHONPATH", str(previous.python))
    with Fleet(dsn, tmp_path) as fleet:
        fleet.execute(upgrade.SCHEMA)
        conn.execute(ENQUEUE_MANY, [_jobs("record", range(1))])
        worker = fleet.start(target="apps.upgrade:app")
        assert worker.wait() == 2, fleet.report()
        log = worker.log()
        assert "X_VERSION_UNSUPPORTED" in log and f"the database has {newest}" in log, log
    assert conn.execute("SELECT state::text, attempt FROM x_jobs.job").fetchall() == [("ready", 0)]
