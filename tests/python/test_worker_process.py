"""The worker as a real process (``x-jobs worker apps.basic:app``): what becomes of a handler that
raises, a job enqueued in the caller's transaction, a job past its timeout or cancelled while it
runs, and a database the worker cannot speak to.

The handlers record every run in the test database (see ``apps.basic``); the tests read those
records and the job rows, and wait for conditions with a deadline, never for a fixed time.
Crashes and server restarts are in test_worker_crash.py, SIGTERM in test_worker_drain.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from apps import basic
from apps.workers import Fleet
from conftest import Conn, Connect, fresh_database
from psycopg import sql
from psycopg.conninfo import make_conninfo

import x_jobs
from x_jobs.errors import JobNotFound

logger = logging.getLogger(__name__)


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def test_raising_handlers_are_retried_with_backoff_and_keep_their_tracebacks(
    fleet: Fleet, conn: Conn
) -> None:
    # name -> (state after the last attempt, the job's backoff base in seconds)
    expected = {"always_raises": ("dead", 0.2), "always_raises_no_dead_letter": ("failed", 0.05)}
    ids = {
        name: basic.app.enqueue(name, {}, conn=conn).id
        for name in ("always_raises", "always_raises_no_dead_letter")
    }
    fleet.start()
    fleet.wait_for(
        lambda: fleet.all_in(list(ids.values()), "dead", "failed"),
        "both raising jobs to run out of attempts",
    )
    runs = fleet.runs()

    for name, job_id in ids.items():
        state, base = expected[name]
        row = conn.execute(
            "SELECT state::text, attempt, last_error, last_error_stack FROM x_jobs.job"
            " WHERE id = %s",
            [job_id],
        ).fetchone()
        assert row is not None
        assert row[:3] == (state, 3, "HandlerBoom: boom on attempt 3"), name
        # The Python traceback, down to the handler's own frame.
        stack = str(row[3])
        assert stack.startswith("Traceback (most recent call last):"), stack
        assert f", in {name}\n" in stack, stack
        assert stack.rstrip().endswith("HandlerBoom: boom on attempt 3"), stack

        errors = conn.execute(
            "SELECT attempt, error, error_stack, failed_at FROM x_jobs.job_error"
            " WHERE job_id = %s ORDER BY attempt",
            [job_id],
        ).fetchall()
        assert [(e[0], e[1]) for e in errors] == [
            (n, f"HandlerBoom: boom on attempt {n}") for n in (1, 2, 3)
        ], name
        assert all(f", in {name}\n" in str(e[2]) for e in errors), errors

        mine = [r for r in runs if r.job_id == job_id]
        assert [(r.attempt, r.outcome) for r in mine] == [
            (n, "raised:HandlerBoom") for n in (1, 2, 3)
        ], name
        # Backoff: attempt n+1 cannot be claimed before the retry delay of attempt n ran out,
        # and with equal jitter that delay is at least half of base * 2^(n-1).
        for n in (1, 2):
            waited = mine[n].started - errors[n - 1][3]
            assert waited >= timedelta(seconds=base * 2 ** (n - 1) / 2), (name, n, waited)

    assert fleet.overlaps() == []


def test_enqueue_on_the_callers_connection_is_part_of_its_transaction(
    fleet: Fleet, connect: Connect
) -> None:
    fleet.start()
    caller = connect(name="caller")
    with caller.transaction():
        rolled_back = basic.app.enqueue(basic.noop, {"n": 1}, conn=caller)
        raise psycopg.Rollback()
    with caller.transaction():
        committed = basic.app.enqueue(basic.noop, {"n": 2}, conn=caller)

    fleet.wait_for(lambda: fleet.all_in([committed.id], "done"), "the committed job to run")
    assert caller.execute("SELECT id FROM x_jobs.job").fetchall() == [(committed.id,)]
    assert rolled_back.id != committed.id
    assert [(r.job_id, r.attempt, r.outcome) for r in fleet.runs()] == [
        (committed.id, 1, "returned")
    ]


def test_jobs_declared_keep_done_false_leave_no_row_once_completed(
    fleet: Fleet, conn: Conn, dsn: str
) -> None:
    inputs = [{"n": n} for n in range(200)]
    unkept = [e.id for e in basic.app.enqueue_many(basic.noop_unkept, inputs, conn=conn)]
    flaky = basic.app.enqueue(basic.flaky_unkept, {}, conn=conn).id
    kept = [e.id for e in basic.app.enqueue_many(basic.noop, inputs[:20], conn=conn)]
    assert conn.execute(
        "SELECT count(*) FILTER (WHERE keep_done), count(*) FILTER (WHERE NOT keep_done)"
        " FROM x_jobs.job"
    ).fetchone() == (20, 201)

    fleet.start()
    fleet.wait_for(
        lambda: fleet.scalar("SELECT count(*) FROM x_jobs.job WHERE state <> 'done'") == 0,
        "every job to complete",
    )

    # Only the kept rows are left; the others went with their error history.
    rows = conn.execute("SELECT id, state::text FROM x_jobs.job ORDER BY id").fetchall()
    assert rows == [(job_id, "done") for job_id in kept]
    errors = conn.execute("SELECT count(*) FROM x_jobs.job_error WHERE job_id = %s", [flaky])
    assert errors.fetchone() == (0,)
    # Each ran to completion once (the flaky one after a failure), and each completion counts.
    runs = fleet.runs()
    returned = sorted(r.job_id for r in runs if r.outcome == "returned")
    assert returned == sorted([*unkept, flaky, *kept])
    assert [(r.attempt, r.outcome) for r in runs if r.job_id == flaky] == [
        (1, "raised:HandlerBoom"),
        (2, "returned"),
    ]
    completed: dict[str, int] = dict(
        conn.execute("SELECT job, sum(completed)::int FROM x_jobs.counter GROUP BY job").fetchall()
    )
    assert (completed["noop_unkept"], completed["flaky_unkept"], completed["noop"]) == (200, 1, 20)
    client = x_jobs.App(dsn)
    try:
        with pytest.raises(JobNotFound, match=f"no job has id {unkept[0]}"):
            client.result(unkept[0], timeout=1)
    finally:
        client.close()
    assert fleet.overlaps() == []


def test_a_job_past_its_timeout_is_stopped_and_failed_as_timed_out(
    fleet: Fleet, conn: Conn
) -> None:
    # A sync body that checks ctx.is_cancelled(), and an async one awaiting asyncio.sleep; both
    # declared with timeout=0.5 and given one attempt, so the timeout settles them dead.
    sync_id = basic.app.enqueue(
        basic.gated_timeout, {"gate": "never"}, conn=conn, max_attempts=1
    ).id
    async_id = basic.app.enqueue(
        basic.async_sleep_timeout, {"seconds": 600}, conn=conn, max_attempts=1
    ).id
    fleet.start()
    fleet.wait_for(lambda: fleet.all_in([sync_id, async_id], "dead"), "both jobs to time out")

    for job_id in (sync_id, async_id):
        row = conn.execute(
            "SELECT attempt, last_error FROM x_jobs.job WHERE id = %s", [job_id]
        ).fetchone()
        assert row == (1, "timed out after 0.5 s")
        errors = conn.execute(
            "SELECT attempt, error FROM x_jobs.job_error WHERE job_id = %s", [job_id]
        ).fetchall()
        assert errors == [(1, "timed out after 0.5 s")]

    # Each body was told: the sync one saw ctx.is_cancelled(), the async one got CancelledError.
    def outcomes() -> dict[int, str | None]:
        return {r.job_id: r.outcome for r in fleet.runs()}

    want = {sync_id: "cancelled:timeout", async_id: "async-cancelled:timeout"}
    fleet.wait_for(lambda: outcomes() == want, f"the bodies to see the timeout: {want}")


def test_a_timed_out_handler_keeps_its_job_until_it_returns_so_it_never_runs_twice(
    fleet: Fleet, conn: Conn
) -> None:
    # A sync body cannot be killed: attempt 1 of stubborn_timeout ignores the stop and runs on
    # past its 2 s timeout. Failed then, the job was claimed again (here, or by another worker)
    # and ran twice at once. It stays held until the body returns; a grace later, it is logged.
    job_id = basic.app.enqueue(basic.stubborn_timeout, {}, conn=conn).id
    worker = fleet.start(concurrency=2, grace=0.5)
    other = fleet.start(concurrency=2, grace=0.5)
    fleet.wait_for(
        lambda: "did not stop within the grace" in worker.log() + other.log(),
        "the timeout and the grace to pass with attempt 1 still running",
    )
    marker = basic.app.enqueue(basic.noop, {}, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([marker], "done"), "a later job to run")
    row = conn.execute(
        "SELECT state::text, attempt FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    assert row == ("running", 1), "the timed-out attempt let go of its job while it ran"
    assert [r.attempt for r in fleet.runs() if r.job_id == job_id] == [1]

    # Its body returns: the attempt fails as timed out, whatever it answered, and the retry
    # starts only now.
    fleet.open_gate("first")
    fleet.open_gate("later")
    fleet.wait_for(lambda: fleet.all_in([job_id], "done"), "attempt 2 to finish")
    errors = conn.execute(
        "SELECT attempt, error FROM x_jobs.job_error WHERE job_id = %s", [job_id]
    ).fetchall()
    assert errors == [(1, "timed out after 2 s")]
    assert fleet.overlaps() == []


def test_cancel_reaches_a_running_handler_and_the_row_stays_cancelled(
    fleet: Fleet, conn: Conn
) -> None:
    sync_id = basic.app.enqueue(basic.gated, {"gate": "never"}, conn=conn).id
    async_id = basic.app.enqueue(basic.async_sleep, {"seconds": 600}, conn=conn).id
    fleet.start()
    fleet.wait_for(
        lambda: {r.job_id for r in fleet.runs()} == {sync_id, async_id}, "both jobs to start"
    )

    for job_id in (sync_id, async_id):
        assert conn.execute("SELECT x_jobs.cancel(%s)", [job_id]).fetchone() == (True,)

    def outcomes() -> dict[int, str | None]:
        return {r.job_id: r.outcome for r in fleet.runs()}

    fleet.wait_for(lambda: None not in outcomes().values(), "both bodies to stop after the cancel")
    got = outcomes()
    # The worker learns of a cancel from its heartbeat; ctx.reason names it "cancelled" or, as
    # the worker's docstring files a cancel under, "lost".
    assert got[sync_id] in {"cancelled:cancelled", "cancelled:lost"}, got
    assert got[async_id] in {"async-cancelled:cancelled", "async-cancelled:lost"}, got

    # The bodies returned (sync) and raised (async) after the cancel: neither outcome may settle
    # the row. A job enqueued now is run after the worker took those outcomes in.
    marker = basic.app.enqueue(basic.noop, {}, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([marker], "done"), "a later job to run")
    rows = conn.execute(
        "SELECT id, state::text, claimed_by, output, last_error FROM x_jobs.job"
        " WHERE id = ANY (%s) ORDER BY id",
        [[sync_id, async_id]],
    ).fetchall()
    assert rows == [
        (sync_id, "cancelled", None, None, None),
        (async_id, "cancelled", None, None, None),
    ]
    errors = conn.execute(
        "SELECT job_id, error FROM x_jobs.job_error WHERE job_id = ANY (%s)",
        [[sync_id, async_id]],
    ).fetchall()
    assert errors == []


def test_async_handlers_run_at_most_concurrency_at_once_and_the_claimed_rest_wait(
    fleet: Fleet, conn: Conn
) -> None:
    """A claim takes more runs than there are slots (the prefetch): the extra async runs wait
    for a slot, none starts early, and every one runs once."""
    ids = [
        job.id
        for job in basic.app.enqueue_many(basic.async_sleep, [{"seconds": 0.3}] * 8, conn=conn)
    ]
    fleet.start(concurrency=2, extra=["--prefetch", "6"])
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "every async job to finish")

    runs = fleet.runs()
    assert sorted(r.job_id for r in runs) == sorted(ids)
    # At each start, how many runs had started and not yet finished: never above 2.
    for run in runs:
        at_once = [
            other
            for other in runs
            if other.started <= run.started and (other.finished or run.started) > run.started
        ]
        assert len(at_once) <= 2, at_once
    assert fleet.overlaps() == []


@pytest.mark.parametrize("concurrency", [0, 1001])
def test_a_concurrency_outside_1_to_1000_is_refused_before_anything_starts(
    concurrency: int,
) -> None:
    """A worker holds at most 1000 jobs (claim's qty limit): more threads would only wait, and
    a typo of a few zeros would start a hundred thousand of them."""
    with pytest.raises(ValueError, match=f"concurrency must be 1 to 1000, not {concurrency}"):
        x_jobs.Worker(basic.app, concurrency=concurrency)


def test_the_worker_refuses_a_version_it_cannot_speak_to(fleet: Fleet, conn: Conn) -> None:
    job_id = basic.app.enqueue(basic.noop, {}, conn=conn).id
    conn.execute(
        "CREATE OR REPLACE FUNCTION x_jobs.version() RETURNS text LANGUAGE sql IMMUTABLE"
        " AS $$ SELECT '9.9.9'::text $$"
    )
    worker = fleet.start()
    code = worker.wait()
    log = worker.log()
    assert code > 0, log
    assert "X_VERSION_UNSUPPORTED" in log, log
    assert "9.9.9" in log, log
    # It refused before claiming anything.
    assert fleet.states([job_id]) == {job_id: "ready"}
    assert fleet.runs() == []


def test_the_worker_refuses_a_database_without_x_jobs(
    fleet: Fleet, admin: Conn, tmp_path: Path
) -> None:
    with fresh_database(admin, "template1", prefix="x_jobs_test_plain") as plain:
        dbname = psycopg.conninfo.conninfo_to_dict(plain)["dbname"]
        worker = fleet.start(dbname=str(dbname))
        code = worker.wait()
    log = worker.log()
    assert code > 0, log
    assert "X_NOT_INSTALLED: x_jobs is not installed in this database" in log, log


def test_an_outcome_the_database_refuses_does_not_stop_the_settling(
    fleet: Fleet, conn: Conn, admin: Conn
) -> None:
    """An output over x_jobs.max_payload_bytes (XJ003) and an error text with a NUL byte made
    complete_many and fail raise something other than a lost connection: the settler thread
    died with it, and from then on nothing the worker ran was settled."""
    admin.execute(f"ALTER DATABASE {fleet.dbname} SET x_jobs.max_payload_bytes = 1000")
    big = basic.app.enqueue("big_output", {}, conn=conn).id
    nul = basic.app.enqueue("nul_error", {}, conn=conn).id
    before = [basic.app.enqueue("noop", {}, conn=conn).id for _ in range(3)]
    fleet.start(concurrency=1)
    fleet.wait_for(lambda: fleet.all_in([big, nul, *before], "dead", "done"), "every job to settle")

    rows = dict(
        (r[0], r[1:])
        for r in conn.execute(
            "SELECT id, state::text, last_error FROM x_jobs.job WHERE id = ANY(%s)",
            [[big, nul, *before]],
        )
    )
    assert rows[big][0] == "dead"
    assert rows[big][1].startswith("its output was refused: X_PAYLOAD_TOO_LARGE"), rows[big]
    assert rows[nul] == ("dead", "ValueError: upstream said \\x00 and stopped")
    assert all(rows[job_id] == ("done", None) for job_id in before), rows
    # The settler lives on: a job enqueued now is settled too.
    after = basic.app.enqueue("noop", {}, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([after], "done"), "a later job to be settled")


def test_a_sql_ascii_database_is_served_like_any_other(admin: Conn, tmp_path: Path) -> None:
    """On a SQL_ASCII database psycopg answers text as bytes unless the connection asks for
    UTF-8: the version check read b'0.3.4' and the worker refused to start, and app.result
    never recognised a settled state."""
    name = f"x_jobs_ascii_{uuid.uuid4().hex[:12]}"
    admin.execute(
        sql.SQL("CREATE DATABASE {} ENCODING 'SQL_ASCII' LOCALE 'C' TEMPLATE template0").format(
            sql.Identifier(name)
        )
    )
    try:
        dsn = make_conninfo("", dbname=name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION x_jobs")
            row = conn.execute("SELECT (x_jobs.enqueue('noop')).id").fetchone()
        assert row is not None
        with Fleet(dsn, tmp_path) as fleet:
            fleet.start()
            fleet.wait_for(
                lambda: fleet.scalar("SELECT count(*) FROM x_jobs.job WHERE state = 'done'") == 1,
                "the noop job to be done",
            )
        app = x_jobs.App(dsn)
        try:
            assert app.result(row[0], timeout=5) is None
        finally:
            app.close()
        listed = subprocess.run(
            [sys.executable, "-m", "x_jobs", "jobs", "list", "--json", "--dsn", dsn],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert [(j["id"], j["state"]) for j in json.loads(listed.stdout)["jobs"]] == [
            (row[0], "done")
        ]
    finally:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
