"""The fence: a claim is a credential. Two real logins, each granted x_jobs_worker: the second
can read the first's worker id (x_jobs.job.claimed_by) and pass it, and before 0.4.2 it could
settle, extend, release and step the first's running jobs that way, and announce the id as
draining. Now each of those calls answers "not held" to it, and claim and announce_worker refuse
it (WorkerNotYours, XJ052). And a worker's stale attempt (the same worker id, the row claimed
again since) settles nothing: the Python worker passes the attempts it holds."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from conftest import Conn, serving, wait_for
from psycopg import sql

import x_jobs
from x_jobs.errors import WorkerNotYours, translate


@contextmanager
def worker_login(admin: Conn) -> Iterator[str]:
    """A LOGIN role granted x_jobs_worker only; its name."""
    role = f"x_jobs_test_fence_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE x_jobs_worker").format(sql.Identifier(role))
    )
    try:
        yield role
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def refused(conn: Conn, query: sql.Composable | str, params: list[Any]) -> x_jobs.XJobsError:
    """The typed error ``query`` raises."""
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(query, params)  # type: ignore[arg-type]
    typed = translate(caught.value)
    assert isinstance(typed, x_jobs.XJobsError), caught.value
    return typed


def test_another_login_passing_the_holders_id_holds_nothing(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    job_id = conn.execute(
        "SELECT id FROM x_jobs.enqueue('fence_held', queue => 'fence')"
    ).fetchone()
    assert job_id is not None
    with (
        worker_login(admin) as a,
        worker_login(admin) as b,
        psycopg.connect(f"{dsn} user={a}", autocommit=True) as as_a,
        psycopg.connect(f"{dsn} user={b}", autocommit=True) as as_b,
    ):
        claimed = as_a.execute(
            "SELECT id, attempt FROM x_jobs.claim(ARRAY['fence'], 'fence-a', '1 minute')"
        ).fetchall()
        assert claimed == [(job_id[0], 1)]
        # B reads A's id where every worker may read it.
        (holder,) = as_b.execute(
            "SELECT claimed_by FROM x_jobs.job WHERE id = %s", [job_id[0]]
        ).fetchone() or (None,)
        assert holder == "fence-a"
        one = [job_id[0], holder]
        assert as_b.execute('SELECT x_jobs.complete(%s, %s, \'{"by": "b"}\')', one).fetchone() == (
            False,
        )
        assert (
            as_b.execute(
                "SELECT * FROM x_jobs.complete_many(ARRAY[%s]::bigint[], %s)", one
            ).fetchall()
            == []
        )
        assert as_b.execute("SELECT x_jobs.fail(%s, %s, 'sabotage')::text", one).fetchone() == (
            None,
        )
        assert (
            as_b.execute(
                "SELECT * FROM x_jobs.extend_lease(ARRAY[%s]::bigint[], %s, '1 day')", one
            ).fetchall()
            == []
        )
        assert (
            as_b.execute("SELECT * FROM x_jobs.release(ARRAY[%s]::bigint[], %s)", one).fetchall()
            == []
        )
        assert (
            as_b.execute("SELECT * FROM x_jobs.hand_back(ARRAY[%s]::bigint[], %s)", one).fetchall()
            == []
        )
        assert as_b.execute("SELECT x_jobs.progress(%s, %s, 1, 2)", one).fetchone() == (False,)
        not_held = refused(as_b, "SELECT x_jobs.step_record(%s, %s, 'charge', '{}')", one)
        assert isinstance(not_held, x_jobs.errors.JobNotHeld)
        drained = refused(
            as_b,
            "SELECT * FROM x_jobs.announce_worker(%s, ARRAY['fence'], draining => true)",
            [holder],
        )
        assert isinstance(drained, WorkerNotYours)
        assert drained.sqlstate == "XJ052"
        assert "'fence-a'" in drained.message
        assert drained.hint
        assert isinstance(
            refused(as_b, "SELECT * FROM x_jobs.claim(ARRAY['fence'], %s)", [holder]),
            WorkerNotYours,
        )
        # A's job is as A's claim left it, and A settles it.
        row = conn.execute(
            "SELECT state::text, claimed_by, progress, output FROM x_jobs.job WHERE id = %s",
            [job_id[0]],
        ).fetchone()
        assert row == ("running", "fence-a", None, None)
        assert conn.execute(
            "SELECT count(*) FROM x_jobs.step WHERE job_id = %s", [job_id[0]]
        ).fetchone() == (0,)
        assert as_a.execute(
            "SELECT x_jobs.complete(%s, %s, attempt => 1)", [job_id[0], "fence-a"]
        ).fetchone() == (True,)


def test_the_workers_stale_attempt_settles_nothing(admin: Conn, dsn: str, conn: Conn) -> None:
    """A real worker (login A) runs attempt 1; meanwhile the row moves on to attempt 2 under the
    same worker id (what a lapse and a claim of its own again leave, made here by the admin).
    The outcome of attempt 1, the heartbeats and the hand-back at the stop pass attempt 1, and
    take nothing: the row stays as attempt 2 has it."""
    with worker_login(admin) as a:
        app = x_jobs.App(f"{dsn} user={a}")
        started = threading.Event()
        finish = threading.Event()

        @app.job(name="fence_slow", queue="fence-slow")
        def slow(input: dict[str, Any]) -> dict[str, int]:
            started.set()
            finish.wait(20)
            return {"attempt": 1}

        job = conn.execute("SELECT id FROM x_jobs.enqueue('fence_slow', queue => 'fence-slow')")
        job_id = (job.fetchone() or (0,))[0]
        with serving(app, concurrency=1, worker_id="fence-worker", lease=3) as worker:
            assert started.wait(20), "the worker should have started the job"
            conn.execute(
                "UPDATE x_jobs.job SET attempt = attempt + 1 WHERE id = %s AND claimed_by = %s",
                [job_id, worker.worker_id],
            )
            finish.set()
            # The worker tries to settle attempt 1, and is told it no longer holds it (its
            # heartbeat with attempt 1 finds nothing either).
            wait_for(lambda: not worker._held, "the worker to let go of the stale attempt")
        row = conn.execute(
            "SELECT state::text, attempt, claimed_by, output FROM x_jobs.job WHERE id = %s",
            [job_id],
        ).fetchone()
        assert row == ("running", 2, "fence-worker", None)
        (login,) = conn.execute(
            "SELECT login::text FROM x_jobs.worker_login WHERE worker = 'fence-worker'"
        ).fetchone() or (None,)
        assert login == a
        conn.execute("DELETE FROM x_jobs.job WHERE id = %s", [job_id])
        conn.execute("DELETE FROM x_jobs.worker WHERE id = 'fence-worker'")


def test_a_stranger_holding_the_old_event_lock_keys_blocks_no_publish_or_wait(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    """A login of no x_jobs role takes the advisory keys publish and step_wait locked before
    0.4.2 (classes 2024061702 and 2024061703), exclusive: a publish and a wait of that event
    still go through at once (they lock rows of x_jobs.event_lock, which it cannot lock)."""
    with (
        worker_login(admin) as a,
        psycopg.connect(f"{dsn} user={a}", autocommit=True) as as_a,
    ):
        conn.execute("CREATE ROLE x_jobs_test_stranger LOGIN")
        try:
            with psycopg.connect(f"{dsn} user=x_jobs_test_stranger", autocommit=True) as stranger:
                stranger.execute("SET statement_timeout = 0")
                stranger.execute(
                    "SELECT pg_advisory_lock(2024061702, hashtext('fence.paid')),"
                    " pg_advisory_lock(2024061703, hashtext('fence.paid' || E'\\x1f' || 'k1'))"
                )
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    stranger.execute("SELECT FROM x_jobs.event_lock FOR UPDATE")
                conn.execute("SELECT x_jobs.enqueue('fence_wait', queue => 'fence-wait')")
                (job_id,) = as_a.execute(
                    "SELECT id FROM x_jobs.claim(ARRAY['fence-wait'], 'fence-waiter')"
                ).fetchone() or (None,)
                for c in (conn, as_a):
                    c.execute("SET statement_timeout = '5s'")
                waited = as_a.execute(
                    "SELECT status::text FROM x_jobs.step_wait(%s, 'fence-waiter', 'pay',"
                    " 'fence.paid', event_key => 'k1')",
                    [job_id],
                ).fetchone()
                assert waited == ("waiting",)
                published = conn.execute(
                    "SELECT woken FROM x_jobs.publish('fence.paid', '{}', key => 'k1')"
                ).fetchone()
                assert published == (1,)
        finally:
            conn.execute("DROP ROLE x_jobs_test_stranger")
