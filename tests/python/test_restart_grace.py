"""The restart grace is counted from when the server took connections again, not from when it
started: a crash recovery longer than the lease used the grace up before any holder could
connect, and the first claim after it took the holders' jobs beside them (a review: 2.1 s of
recovery, a 1.5 s lease, the job claimed again at once, twice out of two).

The server is crashed for real (``pg_ctl stop -m immediate``) and recovers; the claims after it
run on the test clock (``x_jobs.fake_now``), at times chosen from what the recovery took, so
that no figure of this machine's speed is assumed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from conftest import Conn, Connect, crash_backend, needs_pg_ctl, restart_server


def _claim_at(conn: Conn, at: datetime, lease: timedelta) -> list[str]:
    with conn.transaction():
        conn.execute("SELECT set_config('x_jobs.fake_now', %s, true)", [at.isoformat()])
        rows = conn.execute(
            "SELECT name FROM x_jobs.claim(ARRAY['grace'], 'second-worker', %s, 10)", [lease]
        ).fetchall()
    return [name for (name,) in rows]


@needs_pg_ctl
def test_the_grace_after_a_crash_runs_from_the_end_of_recovery(
    conn: Conn, connect: Connect, admin: Conn
) -> None:
    conn.execute("SELECT x_jobs.enqueue('held', queue => 'grace')")
    claimed = conn.execute(
        "SELECT count(*) FROM x_jobs.claim(ARRAY['grace'], 'first-worker', '1 millisecond', 1)"
    ).fetchone()
    assert claimed == (1,)
    # WAL for the recovery to replay: it has to take some time, however little.
    conn.execute(
        "CREATE TABLE public.filler AS SELECT g AS n FROM pg_catalog.generate_series(1, 200000) g"
    )

    restart_server(admin, "-m", "immediate")

    after = connect()
    row = after.execute(
        "SELECT pg_catalog.pg_postmaster_start_time(), x_jobs._ready_since()"
    ).fetchone()
    assert row is not None
    started, ready = row
    assert ready > started, "the recovery took no time: the end of it is not seen"
    # A lease shorter than the recovery: from the start it has run out twice over.
    lease = (ready - started) / 2

    # Half a lease after the server took connections: the first worker may still renew.
    assert _claim_at(after, ready + lease / 2, lease) == []
    # A lease after that, the job is taken as lapsed.
    assert _claim_at(after, ready + 2 * lease, lease) == ["held"]


@needs_pg_ctl
def test_the_grace_after_a_backend_crash_runs_from_the_end_of_recovery(
    conn: Conn, connect: Connect, admin: Conn
) -> None:
    """One backend killed (as the OOM killer does): the postmaster ends every session and
    recovers without starting anew, so pg_postmaster_start_time() stays where it was. A lease
    renewed before the crash counted as renewed since the start, and the first claim after the
    recovery took the job as lapsed (a review: twice out of two)."""
    conn.execute("SELECT x_jobs.enqueue('held', queue => 'grace')")
    claimed = conn.execute(
        "SELECT count(*) FROM x_jobs.claim(ARRAY['grace'], 'first-worker', '1 millisecond', 1)"
    ).fetchone()
    assert claimed == (1,)
    started_before = admin.execute("SELECT pg_catalog.pg_postmaster_start_time()").fetchone()
    # The test server does not wait for the WAL at commit: make the claim survive the crash.
    admin.execute("CHECKPOINT")

    crash_backend(admin, connect())

    after = connect()
    row = after.execute(
        "SELECT pg_catalog.pg_postmaster_start_time(), x_jobs._ready_since()"
    ).fetchone()
    assert row is not None
    started, ready = row
    assert (started,) == started_before, "the postmaster started anew: not the case under test"
    assert ready > started
    lease = timedelta(seconds=1)
    assert _claim_at(after, ready + lease / 2, lease) == []
    assert _claim_at(after, ready + 2 * lease, lease) == ["held"]
