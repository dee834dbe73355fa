"""Declarations in the database (0.4.0): what ``@app.job`` declares is recorded when a worker
starts, so that a SQL producer's rows get it; a worker never spends an attempt of a job it has
no handler for, nor claims it in a loop (it hands it back: parked while no worker serves the
name, delayed for one that does); and in a rolling deploy the new build's jobs run on the new
workers, on their first attempt, however many old workers claim them first.

The rolling-deploy tests run real worker processes (``apps.deploy:old`` and ``apps.deploy:new``);
the others run a worker on a thread of the test.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.workers import Fleet
from conftest import Conn, Connect, fresh_database, serving, wait_for

import x_jobs
from x_jobs import declarations, errors

logger = logging.getLogger(__name__)

OLD = "apps.deploy:old"
NEW = "apps.deploy:new"
UNHANDLED = "no handler for job 'deploy.report' in this worker; handed back"


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def job_type(conn: Conn, name: str) -> declarations.JobType | None:
    found = [t for t in declarations.job_types(conn) if t.name == name]
    return found[0] if found else None


def declared(conn: Conn, name: str) -> bool:
    found = job_type(conn, name)
    return found is not None and found.declared_at is not None


def served_by(conn: Conn, name: str) -> list[str]:
    found = job_type(conn, name)
    return [] if found is None else found.served_by


def enqueue_sql(conn: Conn, name: str, queue: str | None = None) -> int:
    """A job enqueued as a SQL producer would: its name (and queue), nothing else."""
    row = conn.execute(
        "SELECT id FROM x_jobs.enqueue(name => %s, queue => %s)", [name, queue]
    ).fetchone()
    assert row is not None
    return int(row[0])


def run_one(fleet: Fleet, conn: Conn) -> None:
    """Enqueue a ping and wait for it to be done: a claim (or more) of the worker since."""
    ping = [enqueue_sql(conn, "deploy.ping")]
    fleet.wait_for(lambda: fleet.all_in(ping, "done"), "a ping to run")


def row_of(conn: Conn, job_id: int) -> dict[str, Any]:
    cur = conn.execute(
        "SELECT state::text AS state, attempt, max_attempts, claims, queue, last_error"
        " FROM x_jobs.job WHERE id = %s",
        [job_id],
    )
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def is_parked(conn: Conn, job_id: int) -> bool:
    """The row is delayed until infinity (read as text: Python holds no infinite datetime)."""
    found = conn.execute(
        "SELECT state::text, run_at = 'infinity' FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    return found == ("delayed", True)


def test_a_sql_producers_row_gets_what_the_worker_declared(dsn: str, conn: Conn) -> None:
    """The issue's "attempt 4 of 25": a row enqueued by SQL with no options took the SQL
    defaults, not what @app.job declared. Once a worker started, it gets the declaration."""
    app = x_jobs.App(dsn)

    @app.job(
        name="decl.flaky",
        queue="decl",
        max_attempts=2,
        retry=x_jobs.Retry(base=0.01, max=0.02, dead_letter=False),
        timeout=30,
        concurrency=2,
        priority=3,
        keep_done=False,
    )
    def flaky(input: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    @app.job(name="decl.keyed", queue="decl", concurrency=x_jobs.Concurrency(3, key=str))
    def keyed(input: dict[str, Any]) -> None: ...

    with serving(app) as worker:
        wait_for(lambda: declared(conn, "decl.flaky"), "the worker to declare its jobs")
        found = job_type(conn, "decl.flaky")
        assert found is not None
        assert (found.queue, found.max_attempts, found.priority) == ("decl", 2, 3)
        assert (found.dead_letter, found.keep_done) == (False, False)
        assert (found.backoff_base, found.backoff_max) == (
            timedelta(seconds=0.01),
            timedelta(seconds=0.02),
        )
        assert found.timeout == timedelta(seconds=30)
        assert (found.concurrency_key, found.concurrency_limit) == ("job:decl.flaky", 2)
        assert found.declared_by == worker.worker_id
        # A key derived from the input is declared as its limit alone.
        other = job_type(conn, "decl.keyed")
        assert other is not None
        assert (other.concurrency_key, other.concurrency_limit) == (None, 3)
        wait_for(
            lambda: served_by(conn, "decl.flaky") == [worker.worker_id],
            "the worker to announce the jobs it serves",
        )

        job_id = enqueue_sql(conn, "decl.flaky")
        first = conn.execute(
            "SELECT queue, max_attempts, priority, dead_letter, keep_done, concurrency_key,"
            " concurrency_limit FROM x_jobs.job WHERE id = %s",
            [job_id],
        ).fetchone()
        assert first == ("decl", 2, 3, False, False, "job:decl.flaky", 2)
        wait_for(lambda: row_of(conn, job_id)["state"] == "failed", "the job to fail for good")
        assert row_of(conn, job_id)["attempt"] == 2

        # An explicit argument still wins.
        explicit = conn.execute(
            "SELECT id FROM x_jobs.enqueue(name => 'decl.flaky', queue => 'elsewhere',"
            " max_attempts => 7)"
        ).fetchone()
        assert explicit is not None
        assert row_of(conn, int(explicit[0]))["max_attempts"] == 7
        assert row_of(conn, int(explicit[0]))["queue"] == "elsewhere"


def test_a_job_without_a_handler_is_parked_not_attempted_and_not_claimed_again(
    fleet: Fleet, conn: Conn
) -> None:
    """The old worker claims a job of a type it has no handler for: before 0.4.0 it failed the
    attempt, and retried it through all 25. It hands it back instead, the attempt not spent,
    and no worker serving the name, it is parked: not claimed again however often the worker
    claims (here: 20 jobs run one after another, each a claim or more), and logged once."""
    old = fleet.start(target=OLD, poll=0.05)
    stranger = enqueue_sql(conn, "deploy.report", "deploy")
    fleet.wait_for(lambda: is_parked(conn, stranger), "the job without a handler to be parked")
    assert row_of(conn, stranger)["attempt"] == 0
    assert row_of(conn, stranger)["claims"] == 1

    for _ in range(20):
        run_one(fleet, conn)
    row = row_of(conn, stranger)
    assert row["claims"] == 1, row
    assert row["attempt"] == 0, row
    assert is_parked(conn, stranger)
    assert old.log().count(UNHANDLED) == 1, old.log()
    assert "parked until a worker declares it" in old.log()
    assert not [run for run in fleet.runs() if run.job == "deploy.report"]
    # Parked rows are no demand: no scaler adds a worker that would claim it for nothing.
    demand = conn.execute(
        "SELECT coalesce(sum(demand), 0) FROM x_jobs.queue_demand() WHERE queue = 'deploy'"
    ).fetchone()
    assert demand == (0,)
    found = job_type(conn, "deploy.report")
    assert found is not None and found.parked == 1 and found.declared_at is None


def test_rolling_deploy_the_new_jobs_run_on_the_new_worker_on_their_first_attempt(
    fleet: Fleet, conn: Conn
) -> None:
    """Old and new workers side by side. Jobs of the new type enqueued before any new worker
    ran are parked by the old one; the new worker's start wakes them and runs them. Jobs
    enqueued while both run get the new declaration (max_attempts 3), and whichever worker
    claims them first, they run on the new one, each on its first attempt."""
    old = fleet.start(target=OLD, poll=0.05)
    early = [enqueue_sql(conn, "deploy.report", "deploy") for _ in range(5)]
    fleet.wait_for(lambda: all(is_parked(conn, i) for i in early), "the old worker to park them")
    assert {row_of(conn, i)["max_attempts"] for i in early} == {25}  # nobody declared it yet

    new = fleet.start(target=NEW, poll=0.05)
    fleet.wait_for(lambda: fleet.all_in(early, "done"), "the parked jobs to run on the new worker")

    late = [enqueue_sql(conn, "deploy.report", "deploy") for _ in range(20)]
    pings = [enqueue_sql(conn, "deploy.ping") for _ in range(20)]
    fleet.wait_for(lambda: fleet.all_in(late + pings, "done"), "every job to run")

    assert {row_of(conn, i)["max_attempts"] for i in late} == {3}
    reports = [run for run in fleet.runs() if run.job == "deploy.report"]
    assert sorted(run.job_id for run in reports) == sorted(early + late)  # each once
    assert {run.pid for run in reports} == {new.pid}
    assert {run.attempt for run in reports} == {1}
    assert {row_of(conn, i)["attempt"] for i in early + late} == {1}
    # The old worker said it once, however many it handed back.
    assert old.log().count(UNHANDLED) == 1, old.log()
    assert new.log().count("no handler for job") == 0, new.log()
    assert old.alive() and new.alive()


def test_on_a_database_before_0_4_1_the_worker_refuses_to_start_until_it_is_updated(
    admin: Conn,
) -> None:
    """This worker reads its jobs' states through 0.4.1's readers: on 0.4.0 it stops at its
    start, before it declares or claims anything; updated in place, the database's jobs run."""
    with (
        fresh_database(admin, "template1", prefix="x_jobs_old") as old_dsn,
        psycopg.connect(old_dsn, autocommit=True) as conn,
    ):
        conn.execute("CREATE EXTENSION x_jobs VERSION '0.4.0'")
        app = x_jobs.App(old_dsn)

        @app.job(name="known", queue="q")
        def known(input: dict[str, Any]) -> None: ...

        row = conn.execute(
            "SELECT id FROM x_jobs.enqueue(name => 'known', queue => 'q')"
        ).fetchone()
        assert row is not None
        job_id = int(row[0])
        try:
            worker = x_jobs.Worker(app, queues=["q"], poll_interval=0.05)
            with pytest.raises(errors.VersionUnsupported, match=r"the database has 0\.4\.0"):
                worker.run(install_signals=False)
            assert row_of(conn, job_id)["state"] == "ready"
            assert conn.execute("SELECT count(*) FROM x_jobs.job_type").fetchone() == (0,)

            conn.execute("ALTER EXTENSION x_jobs UPDATE TO '0.4.1'")
            with serving(app):
                wait_for(lambda: row_of(conn, job_id)["state"] == "done", "the job to run")
        finally:
            app.close()


def test_a_worker_whose_app_declares_what_enqueue_refuses_does_not_start(dsn: str) -> None:
    """A declaration is refused as an enqueue of it would be, with enqueue's codes (a timeout
    has its own): the worker stops at its start, typed, rather than serve a job every enqueue
    of which, or every run, would fail."""
    for declare, refused in (
        ({"timeout": 0}, errors.JobTimeoutInvalid),
        ({"max_attempts": 0}, errors.MaxAttemptsInvalid),
        ({"queue": ""}, errors.QueueInvalid),
    ):
        app = x_jobs.App(dsn)
        app.job(name="decl.bad", **declare)(_noop)
        worker = x_jobs.Worker(app, queues=["decl"], poll_interval=0.05)
        try:
            with pytest.raises(refused):
                worker.run(install_signals=False)
        finally:
            app.close()


def test_a_worker_without_the_worker_role_is_refused_at_its_declaration(
    dsn: str, admin: Conn
) -> None:
    role = f"x_jobs_test_producer_{os.getpid()}"
    admin.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE x_jobs_producer')
    try:
        app = x_jobs.App(f"{dsn} user={role}")
        app.job(name="decl.noop")(_noop)
        with pytest.raises(errors.PermissionDenied) as refused:
            x_jobs.Worker(app).run(install_signals=False)
        assert "declare_jobs" in refused.value.message
        app.close()
    finally:
        admin.execute(f'DROP ROLE "{role}"')


def _noop(input: dict[str, Any]) -> None: ...


def test_a_row_parked_beside_a_serving_workers_first_announce_wakes_at_its_next(
    connect: Connect,
) -> None:
    """The race the announce's wake closes: a hand-back that has not committed when a worker
    that serves the name first announces sees no such worker and parks the row, and the
    announce does not see the row parked. Every announce wakes the parked rows it serves, so
    the row waits one announce interval, not for good."""
    old, new = connect(), connect()
    old.execute("SELECT x_jobs.enqueue('race.job', queue => 'race', idempotency_key => 'r1')")
    with old.transaction():
        handed = old.execute(
            "SELECT h.parked FROM x_jobs.hand_back("
            " ARRAY(SELECT id FROM x_jobs.claim(ARRAY['race'], 'race-old')), 'race-old') AS h"
        ).fetchall()
        assert handed == [(True,)]
        # The serving worker's first announce, committed while the hand-back is not.
        new.execute(
            "SELECT x_jobs.announce_worker('race-new', ARRAY['race'], jobs => ARRAY['race.job'])"
        )
    parked = "SELECT state::text, run_at = 'infinity' FROM x_jobs.job WHERE idempotency_key = 'r1'"
    assert old.execute(parked).fetchone() == ("delayed", True)
    new.execute(
        "SELECT x_jobs.announce_worker('race-new', ARRAY['race'], jobs => ARRAY['race.job'])"
    )
    assert old.execute(parked).fetchone() == ("ready", False)
