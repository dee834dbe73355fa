"""Leases: a lapsed lease goes to the next claimer, and the worker that lost it cannot settle."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from conftest import DEADLINE_SECONDS, Conn, Connect, wait_for_lock_waiters

import x_jobs
from x_jobs.worker import _Outcome

logger = logging.getLogger(__name__)

SHORT_LEASE = "300 milliseconds"
COLUMNS = "id, state::text, claimed_by, attempt, claims"


def _enqueue(conn: Conn, max_attempts: int = 25, dead_letter: bool = True) -> int:
    row = conn.execute(
        "SELECT id FROM x_jobs.enqueue('lease_test', max_attempts => %s, dead_letter => %s)",
        [max_attempts, dead_letter],
    ).fetchone()
    assert row is not None
    return int(row[0])


def _claim(conn: Conn, worker: str, lease: str = "30 seconds") -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT " + COLUMNS + " FROM x_jobs.claim(ARRAY['default'], %s, %s::interval, 10)",
        [worker, lease],
    ).fetchall()


def _claim_until_found(conn: Conn, worker: str) -> list[tuple[Any, ...]]:
    """Claim in a loop until a claim answers rows (the lapse happened); fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        rows = _claim(conn, worker)
        if rows:
            return rows
        time.sleep(0.02)
    pytest.fail(f"{worker} got nothing within {DEADLINE_SECONDS:.0f} s")


def _row(conn: Conn, job_id: int) -> tuple[Any, ...]:
    row = conn.execute("SELECT " + COLUMNS + " FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row


def test_lapsed_lease_is_reclaimed_and_the_loser_cannot_settle(
    conn: Conn, connect: Connect
) -> None:
    a, b = connect(name="worker-a"), connect(name="worker-b")
    job_id = _enqueue(conn)

    assert _claim(a, "A", SHORT_LEASE) == [(job_id, "running", "A", 1, 1)]
    # While A holds the lease the job is nobody else's: B's claims answer nothing until it lapses.
    assert _claim_until_found(b, "B") == [(job_id, "running", "B", 2, 2)]

    # A lost the lease: none of its settling calls touch the row.
    assert a.execute("SELECT x_jobs.complete(%s, 'A')", [job_id]).fetchone() == (False,)
    assert a.execute("SELECT x_jobs.fail(%s, 'A', 'boom')", [job_id]).fetchone() == (None,)
    assert (
        a.execute(
            "SELECT * FROM x_jobs.extend_lease(ARRAY[%s]::bigint[], 'A')", [job_id]
        ).fetchall()
        == []
    )
    assert (
        a.execute(
            "SELECT * FROM x_jobs.complete_many(ARRAY[%s]::bigint[], 'A')", [job_id]
        ).fetchall()
        == []
    )
    assert _row(conn, job_id) == (job_id, "running", "B", 2, 2)

    # The lapse is in the job's error history as attempt 1 of worker A; A's refused fail is not.
    errors = conn.execute(
        "SELECT attempt, worker FROM x_jobs.job_error WHERE job_id = %s", [job_id]
    ).fetchall()
    assert errors == [(1, "A")]

    # B still holds it: its heartbeat and its complete work.
    assert b.execute(
        "SELECT * FROM x_jobs.extend_lease(ARRAY[%s]::bigint[], 'B')", [job_id]
    ).fetchall() == [(job_id,)]
    assert b.execute("SELECT x_jobs.complete(%s, 'B')", [job_id]).fetchone() == (True,)
    done = conn.execute(
        "SELECT state::text, visible_at, finished_at IS NOT NULL FROM x_jobs.job WHERE id = %s",
        [job_id],
    ).fetchone()
    assert done == ("done", None, True)
    counted = conn.execute(
        "SELECT sum(completed), sum(retried), sum(dead)"
        " FROM x_jobs.counter WHERE job = 'lease_test'"
    ).fetchone()
    assert counted == (1, 1, 0)


@pytest.mark.parametrize(("dead_letter", "buried_as"), [(True, "dead"), (False, "failed")])
def test_lapse_on_the_final_attempt_buries_the_job(
    conn: Conn, connect: Connect, dead_letter: bool, buried_as: str
) -> None:
    a, b = connect(name="worker-a"), connect(name="worker-b")
    job_id = _enqueue(conn, max_attempts=1, dead_letter=dead_letter)

    assert _claim(a, "A", SHORT_LEASE) == [(job_id, "running", "A", 1, 1)]
    # The next claim after the lapse answers the row beside its claims, buried, not handed out.
    assert _claim_until_found(b, "B") == [(job_id, buried_as, None, 1, 1)]
    buried = conn.execute(
        "SELECT state::text, claimed_by, visible_at, finished_at IS NOT NULL, last_error"
        " FROM x_jobs.job WHERE id = %s",
        [job_id],
    ).fetchone()
    assert buried is not None
    assert buried[:4] == (buried_as, None, None, True)
    assert buried[4]

    # Never handed out again, and the stalled worker cannot settle it.
    assert _claim(b, "B") == []
    assert _claim(conn, "C") == []
    assert a.execute("SELECT x_jobs.complete(%s, 'A')", [job_id]).fetchone() == (False,)
    assert a.execute("SELECT x_jobs.fail(%s, 'A', 'late')", [job_id]).fetchone() == (None,)
    assert _row(conn, job_id) == (job_id, buried_as, None, 1, 1)

    counted = conn.execute(
        "SELECT sum(dead), sum(failed), sum(retried) FROM x_jobs.counter WHERE job = 'lease_test'"
    ).fetchone()
    assert counted == ((1, 0, 0) if buried_as == "dead" else (0, 1, 0))


def test_a_settlement_and_a_heartbeat_of_one_worker_lock_rows_in_one_order(
    conn: Conn, connect: Connect
) -> None:
    """A worker settles on one connection while it heartbeats on another, the same rows often
    (finished jobs awaiting settlement are extended too). extend_lease locks rows in id order;
    complete_many locked them in the order given, so each could hold a row the other waited for:
    "deadlock detected", seen in a benchmark drain. The heartbeat here takes its two rows in
    two statements of one transaction, which leaves the gap a single statement leaves by
    chance."""
    low, high = sorted(_enqueue(conn) for _ in range(2))
    assert len(_claim(conn, "w1")) == 2
    extend = "SELECT x_jobs.extend_lease(ARRAY[%s]::bigint[], 'w1', '30 seconds')"
    # A new version of `low`, placed after `high`'s: the table's order is no longer the ids'.
    conn.execute(extend, [low])
    heartbeat = connect(autocommit=False, name="heartbeat")
    heartbeat.execute(extend, [low])
    settler = connect(name="settler")
    settled: list[int] = []
    failed: list[BaseException] = []

    def settle() -> None:
        try:
            rows = settler.execute(
                "SELECT c FROM x_jobs.complete_many(%s::bigint[], 'w1') AS c", [[high, low]]
            ).fetchall()
            settled.extend(int(r[0]) for r in rows)
        except BaseException as err:  # reported below, not lost in the thread
            failed.append(err)

    thread = threading.Thread(target=settle)
    thread.start()
    wait_for_lock_waiters(conn, [settler.info.backend_pid])
    # The settler waits for `low`; holding `high` as well would close a cycle here.
    heartbeat.execute(extend, [high])
    heartbeat.commit()
    thread.join(DEADLINE_SECONDS)
    assert not failed, failed
    assert sorted(settled) == [low, high]


def test_a_worker_settling_failures_and_heartbeating_takes_rows_in_one_order(
    dsn: str, conn: Conn, connect: Connect
) -> None:
    """A batch holding a failure is settled in one transaction: complete_many for its
    completions, then fail for each failure. The worker's heartbeat, on its own connection,
    takes the same rows in id order. A failure with a lower id than a completion was locked
    after it, so each side could hold a row the other waited for. The settler now takes every
    row of such a batch in id order first."""
    app = x_jobs.App(dsn)

    @app.job(name="lease_test", queue="default")
    def lease_test(input: dict[str, Any]) -> None:
        """Never run: the test hands the worker its outcomes."""

    worker = x_jobs.Worker(app, concurrency=2)
    worker._connect(first=True)
    assert worker._conn is not None
    settler = worker._conn
    try:
        low, high = sorted(_enqueue(conn) for _ in range(2))
        assert worker._claim(2) == 2
        batch = [
            _Outcome(worker._held[high], ok=True),
            _Outcome(worker._held[low], ok=False, error="boom"),
        ]
        extend = "SELECT x_jobs.extend_lease(ARRAY[%s]::bigint[], %s, '30 seconds')"
        heartbeat = connect(autocommit=False, name="heartbeat")
        heartbeat.execute(extend, [low, worker.worker_id])
        settled: list[Any] = []
        failed: list[BaseException] = []

        def settle() -> None:
            try:
                settled.append(worker._settle_together(settler, batch))
            except BaseException as err:  # reported below, not lost in the thread
                failed.append(err)

        thread = threading.Thread(target=settle)
        thread.start()
        wait_for_lock_waiters(conn, [settler.info.backend_pid])
        # The settler waits for `low`; holding `high` as well would close a cycle here.
        heartbeat.execute(extend, [high, worker.worker_id])
        heartbeat.commit()
        thread.join(DEADLINE_SECONDS)
        assert not failed, failed
        [settlement] = settled
        assert settlement.completed == {high}
        assert settlement.states == {low: "delayed"}  # its backoff
    finally:
        settler.close()
