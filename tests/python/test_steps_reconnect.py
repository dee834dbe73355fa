"""Step calls across a lost connection: a server restart ends every connection of the step pool,
and the next ``ctx.step.run`` (or sleep, wait, progress, the journal load) failed with
AdminShutdown, spending the attempt: a one-attempt job ended dead, and a step body that had
completed ran again on the next attempt. A step call now sends its statement again on a new
connection, with backoff while the server is away, for as long as the job is the worker's.

The first tests restart the real server under real worker processes (apps.step_reconnect); the
others call the steps of a job claimed here, on a pool whose connections the test terminates.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import flows, step_reconnect
from apps.workers import Fleet
from conftest import Conn, Connect, needs_pg_ctl, restart_server, wait_for
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import x_jobs
from x_jobs.errors import JobNotHeld
from x_jobs.steps import StepStore, Suspended

TARGET = "apps.step_reconnect:app"


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        fleet.execute(flows.SCHEMA)
        yield fleet


def _effects(fleet: Fleet, ids: list[int]) -> list[tuple[int, str, int]]:
    return [
        (int(job_id), str(what), int(attempt))
        for job_id, what, attempt in fleet.execute(
            "SELECT job_id, what, attempt FROM public.effect WHERE job_id = ANY (%s)"
            " ORDER BY job_id, seq",
            [ids],
        )
    ]


def _finished(fleet: Fleet, ids: list[int]) -> bool:
    return fleet.all_in(ids, "done", "dead", "failed", "cancelled")


@needs_pg_ctl
def test_one_attempt_step_jobs_after_a_restart_all_complete(
    fleet: Fleet, conn: Conn, connect: Connect, admin: Conn
) -> None:
    """The reviewer's r2: a worker ran step jobs (its step pool holds connections), the server
    restarted, and of ten one-attempt step jobs enqueued once it was back, half ended dead with
    "AdminShutdown: terminating connection due to administrator command"."""
    worker = fleet.start(target=TARGET, concurrency=10, lease=30)
    before = [
        e.id for e in step_reconnect.app.enqueue_many(step_reconnect.one_step, [{}] * 10, conn=conn)
    ]
    fleet.wait_for(lambda: fleet.all_in(before, "done"), "the first jobs to be done")

    restart_server(admin, "-m", "fast")
    fleet.wait_for(
        lambda: "database connection back" in worker.log(), "the worker to reconnect after it"
    )
    after = [
        e.id
        for e in step_reconnect.app.enqueue_many(
            step_reconnect.one_step,
            [{}] * 10,
            conn=connect(),  # conn died with the server
        )
    ]
    fleet.wait_for(lambda: _finished(fleet, after), "the jobs enqueued after the restart")

    rows = fleet.execute(
        "SELECT id, state::text, attempt, last_error FROM x_jobs.job WHERE id = ANY (%s)"
        " ORDER BY id",
        [after],
    )
    assert rows == [(job_id, "done", 1, None) for job_id in after], fleet.report()
    assert _effects(fleet, after) == [(job_id, "only", 1) for job_id in after]
    assert worker.alive(), worker.log()


@needs_pg_ctl
@pytest.mark.parametrize(
    ("job", "where"),
    [("paused", "between"), ("paused", "inside"), ("paused_async", "between")],
    ids=["between-steps", "inside-step-one", "async-between-steps"],
)
def test_a_job_paused_across_a_restart_completes_and_runs_each_step_once(
    fleet: Fleet, conn: Conn, admin: Conn, job: str, where: str
) -> None:
    """The restart comes while the job waits at its gate: between its steps (the next step call
    is the first to meet the dead connection), or inside step one's body (its record is). The
    failed call spent the attempt, and the next one ran a step body again."""
    worker = fleet.start(target=TARGET, concurrency=2, lease=30)
    handler = step_reconnect.paused if job == "paused" else step_reconnect.paused_async
    job_id = step_reconnect.app.enqueue(handler, {"where": where}, conn=conn).id
    fleet.wait_for(
        lambda: _effects(fleet, [job_id]) == [(job_id, "one", 1)], "step one's body to run"
    )
    if where == "between":
        fleet.wait_for(
            lambda: bool(
                fleet.execute(
                    "SELECT 1 FROM x_jobs.step WHERE job_id = %s AND name = 'one'"
                    " AND status = 'done'",
                    [job_id],
                )
            ),
            "step one to be recorded",
        )

    restart_server(admin, "-m", "fast")
    fleet.open_gate("resume")
    fleet.wait_for(lambda: _finished(fleet, [job_id]), "the job to finish")

    ((state, attempt, output, last_error),) = fleet.execute(
        "SELECT state::text, attempt, output, last_error FROM x_jobs.job WHERE id = %s", [job_id]
    )
    assert (state, attempt, last_error) == ("done", 1, None), fleet.report()
    assert output == {"a": 1, "b": 2, "attempt": 1}
    assert _effects(fleet, [job_id]) == [(job_id, "one", 1), (job_id, "two", 1)]
    steps = fleet.execute(
        "SELECT name, status::text, attempt FROM x_jobs.step WHERE job_id = %s ORDER BY name",
        [job_id],
    )
    assert steps == [("one", "done", 1), ("two", "done", 1)]
    assert worker.alive(), worker.log()


# --- step calls of a job claimed here -------------------------------------------------------


@pytest.fixture
def app(dsn: str) -> Iterator[x_jobs.App]:
    app = x_jobs.App(dsn)
    yield app
    app.close()


@pytest.fixture
def store(dsn: str) -> Iterator[StepStore]:
    store = StepStore(dsn, max_size=2)
    yield store
    store.close()


WORKER = "test-steps-reconnect"


def _claimed(app: x_jobs.App, conn: Conn, store: StepStore) -> x_jobs.JobContext:
    """A job claimed by WORKER, and the context its handler would have."""

    @app.job(name="held")
    def held(input: dict[str, Any]) -> None: ...

    app.enqueue(held, {}, conn=conn)
    ((job_id, attempt),) = conn.execute(
        "SELECT id, attempt FROM x_jobs.claim(queues => ARRAY['default'], worker => %s,"
        " lease => '5 minutes', qty => 1)",
        [WORKER],
    ).fetchall()
    return x_jobs.JobContext(
        id=job_id,
        name="held",
        queue="default",
        attempt=attempt,
        max_attempts=3,
        run_id="",
        tenant_id="",
        worker=WORKER,
        _store=store,
    )


def _kill_step_connections(conn: Conn) -> None:
    """What a server restart does to the step pool: its backends terminated (AdminShutdown)."""
    killed = [
        pid
        for (pid,) in conn.execute(
            "SELECT pid FROM pg_catalog.pg_stat_activity"
            " WHERE application_name = 'x_jobs steps' AND datname = current_database()"
        ).fetchall()
    ]
    conn.execute(
        "SELECT pg_catalog.pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [killed]
    )
    # Those backends, not every step connection: the pool may open new ones meanwhile.
    wait_for(
        lambda: (
            not conn.execute(
                "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = ANY (%s)", [killed]
            ).fetchall()
        ),
        "the step connections to end",
    )


def test_a_step_call_on_a_terminated_connection_is_sent_again(
    app: x_jobs.App, conn: Conn, store: StepStore
) -> None:
    ctx = _claimed(app, conn, store)
    ran: list[str] = []

    def body(name: str, output: int) -> int:
        ran.append(name)
        return output

    assert ctx.step.run("one", lambda: body("one", 1)) == 1
    _kill_step_connections(conn)
    assert ctx.step.run("two", lambda: body("two", 2)) == 2
    _kill_step_connections(conn)
    assert ctx.progress(2, 2, "two steps") is True
    assert ran == ["one", "two"]
    assert conn.execute(
        "SELECT name, status::text FROM x_jobs.step WHERE job_id = %s ORDER BY name", [ctx.id]
    ).fetchall() == [("one", "done"), ("two", "done")]


def test_a_step_call_sent_again_for_a_job_no_longer_held_is_refused(
    app: x_jobs.App, conn: Conn, store: StepStore
) -> None:
    """The retry asks the database again, which checks the holder: a job cancelled while the
    connection was down is X_JOB_NOT_HELD, as it was before, and the body does not run."""
    ctx = _claimed(app, conn, store)
    ctx.step.run("one", lambda: 1)
    _kill_step_connections(conn)
    conn.execute("SELECT x_jobs.cancel(%s)", [ctx.id])
    ran: list[str] = []
    with pytest.raises(JobNotHeld):
        ctx.step.run("two", lambda: ran.append("two"))
    # The journal was loaded before: the body ran, and its record was refused.
    assert ran == ["two"]
    assert conn.execute(
        "SELECT name FROM x_jobs.step WHERE job_id = %s ORDER BY name", [ctx.id]
    ).fetchall() == [("one",)]


def test_a_sleep_whose_suspension_committed_before_the_connection_died_suspends(
    app: x_jobs.App, conn: Conn, store: StepStore
) -> None:
    """The sleep's commit suspended the run but its reply was lost: sent again, step_sleep finds
    the job suspended, not held by the worker. That is the suspension the call asked for."""
    ctx = _claimed(app, conn, store)
    ctx.step.run("one", lambda: 1)  # the journal is loaded: the sleep's is the next call
    conn.execute(
        "SELECT x_jobs.step_sleep(id => %s, worker => %s, step => 'nap', duration => '1 hour')",
        [ctx.id, WORKER],
    )
    _kill_step_connections(conn)
    with pytest.raises(Suspended):
        ctx.step.sleep("nap", 3600)
    assert conn.execute(
        "SELECT state::text FROM x_jobs.job WHERE id = %s", [ctx.id]
    ).fetchall() == [("suspended",)]


class _Retries(logging.Handler):
    """Sets ``waiting`` once a step call logs that it waits for the database."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "database unreachable" in record.getMessage():
            self.waiting.set()


@pytest.mark.parametrize("reason", ["timeout", "cancelled", "shutdown"])
def test_a_step_call_waiting_for_the_database_stops_when_its_job_is_told_to(
    app: x_jobs.App, conn: Conn, dsn: str, reason: str
) -> None:
    """The database never answers (the step store's is one that does not exist): the journal
    load waits, and the job's stop ends the wait with what a stopped step call raises."""
    unreachable = make_conninfo(dsn, dbname=f"{conninfo_to_dict(dsn)['dbname']}_gone")
    store = StepStore(unreachable, max_size=1)
    ctx = _claimed(app, conn, store)
    retries = _Retries()
    steps_logger = logging.getLogger("x_jobs.steps")
    # Its own level: an earlier test's CLI run may have left the root logger at ERROR.
    level = steps_logger.level
    steps_logger.setLevel(logging.WARNING)
    steps_logger.addHandler(retries)
    ran: list[str] = []
    raised: list[BaseException] = []

    def call() -> None:
        try:
            ctx.step.run("one", lambda: ran.append("one"))
        except BaseException as err:
            raised.append(err)

    thread = threading.Thread(target=call)
    try:
        thread.start()
        assert retries.waiting.wait(30), "the step call never waited for the database"
        assert thread.is_alive()
        ctx._stop(reason)
        thread.join(30)
        assert not thread.is_alive()
    finally:
        steps_logger.removeHandler(retries)
        steps_logger.setLevel(level)
        ctx.cancelled.set()
        thread.join(30)
        store.close()
    assert ran == []
    assert [(type(err).__name__, str(err)) for err in raised] == [("JobCancelled", reason)]
    assert isinstance(raised[0].__cause__, psycopg.OperationalError)
