"""A worker whose database goes away: whichever call notices it, the worker reconnects and goes
on; and once back, it extends its leases before it claims, so that a job whose lease lapsed
meanwhile is neither run a second time by this worker nor settled with the old attempt's outcome.

The worker runs in this process (its own threads and connections, on the real server); the
database goes away for real (its backends terminated, new connections refused for a while).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import Conn, wait_for

import x_jobs


@pytest.fixture
def app(dsn: str) -> Iterator[x_jobs.App]:
    app = x_jobs.App(dsn)
    yield app
    app.close()


def _run(worker: x_jobs.Worker) -> threading.Thread:
    thread = threading.Thread(
        target=worker.run, kwargs={"install_signals": False}, name="worker-under-test", daemon=True
    )
    thread.start()
    return thread


def _stop(worker: x_jobs.Worker, thread: threading.Thread) -> None:
    worker.stop()
    worker.stop()
    thread.join(30)


def _terminate(admin: Conn, dbname: str, application_name: str | None = None) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
        " AND pid <> pg_backend_pid() AND (%s::text IS NULL OR application_name = %s)",
        [dbname, application_name, application_name],
    )


def test_a_connection_lost_under_the_announce_is_reconnected(
    app: x_jobs.App, conn: Conn, admin: Conn
) -> None:
    """The announce noticed the lost connection, dropped it and returned; the same turn then
    claimed on no connection (an AssertionError ended the worker)."""

    @app.job(name="after_loss", queue="announce")
    def after_loss(input: dict[str, Any]) -> str:
        return "ran"

    # Announces and polls every 10 ms: each turn announces, then claims, so the announce is the
    # first call to find the connection gone, and a claim follows in the same turn.
    worker = x_jobs.Worker(
        app, queues=["announce"], concurrency=1, poll_interval=0.01, announce_interval=0.01
    )
    thread = _run(worker)
    try:
        wait_for(lambda: worker._conn is not None and _announced(conn), "the worker to connect")
        dbname = conn.info.dbname
        _terminate(admin, dbname, "x_jobs worker")
        wait_for(
            lambda: thread.is_alive() and worker._conn is not None and _announced(conn),
            "the worker to reconnect and announce again",
        )
        job = app.enqueue(after_loss, {})
        assert app.result(job.id, timeout=30) == "ran"
        assert thread.is_alive()
    finally:
        _stop(worker, thread)


def _announced(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'x_jobs worker'"
    ).fetchone()
    return bool(row and row[0])


def test_a_job_whose_lease_lapsed_in_an_outage_is_run_once_and_settled_as_it_ran(
    app: x_jobs.App, conn: Conn, admin: Conn
) -> None:
    """The database is away for longer than the lease while a job runs and finishes. Back, the
    worker claimed its own lapsed job again (a second run beside the first) and settled the
    new attempt with the first one's outcome."""
    runs: list[int] = []

    @app.job(name="through_outage", queue="outage")
    def through_outage(input: dict[str, Any], ctx: x_jobs.JobContext) -> str:
        runs.append(ctx.attempt)
        time.sleep(1.5)
        return f"attempt {ctx.attempt}"

    job = app.enqueue(through_outage, {})
    dbname = conn.info.dbname
    worker = x_jobs.Worker(
        app, queues=["outage"], concurrency=2, lease=1, heartbeat_interval=0.3, poll_interval=0.1
    )
    thread = _run(worker)
    try:
        wait_for(lambda: runs == [1], "the job to start")
        # Away for 4 s, past the 1 s lease and the job's end: no new connection, none left.
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        try:
            _terminate(admin, dbname)
            time.sleep(4)
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        wait_for(
            lambda: _state(app, job.id)[0] == "done",
            "the job to be settled once the database is back",
        )
        assert _state(app, job.id) == ("done", 1, "attempt 1")
        assert runs == [1]
    finally:
        _stop(worker, thread)


def _state(app: x_jobs.App, job_id: int) -> tuple[Any, ...]:
    """Read on a connection of its own: the outage ended every connection there was."""
    with psycopg.connect(app.dsn, autocommit=True) as db:
        row = db.execute(
            "SELECT state::text, attempt, output FROM x_jobs.job WHERE id = %s", [job_id]
        ).fetchone()
    assert row is not None
    return tuple(row)
