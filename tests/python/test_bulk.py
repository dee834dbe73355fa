"""Bulk operations beside the workers: x_jobs.cancel_jobs and retry_jobs against rows another
session holds right now, through two real connections (what one session does alone is in
tests/pgtap/42-bulk.sql).

A bulk cancel waits for a row a worker holds, as cancel(id) does, so that the worker's
settlement and the cancel are never both lost: whichever commits first wins. Its walk takes the
rows in id order, the order the heartbeat and the settlers lock them in, so those waits cannot
close into a deadlock. Every connection that might be made to wait where it must not has a
statement_timeout, which turns a wrong wait into an error instead of a hang.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conftest import DEADLINE_SECONDS, Conn, Connect, notify_names, wait_for_lock_waiters
from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)

#: What a session that must not wait may take: a wait is an error, well before the test's own
#: deadline (and longer than deadlock_timeout, so that a deadlock shows as one).
NO_WAIT = "SET statement_timeout = '10s'"


def _enqueue(conn: Conn, count: int, queue: str = "bulk", **fields: Any) -> list[int]:
    requests = [{"name": "bulk_job", "queue": queue, **fields} for _ in range(count)]
    rows = conn.execute("SELECT id FROM x_jobs.enqueue_many(%s)", [Jsonb(requests)]).fetchall()
    return sorted(int(row[0]) for row in rows)


def _claim(conn: Conn, worker: str, qty: int, queue: str = "bulk") -> list[int]:
    rows = conn.execute(
        "SELECT id FROM x_jobs.claim(ARRAY[%s], %s, '1 hour', %s)", [queue, worker, qty]
    ).fetchall()
    return sorted(int(row[0]) for row in rows)


def _states(conn: Conn, ids: list[int]) -> dict[int, str]:
    rows = conn.execute(
        "SELECT id, state::text FROM x_jobs.job WHERE id = ANY (%s)", [ids]
    ).fetchall()
    return {int(job_id): str(state) for job_id, state in rows}


def _pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def _one(conn: Conn, query: Any, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def test_a_bulk_cancel_waits_for_a_settling_worker_and_its_settlement_stands(
    conn: Conn, connect: Connect
) -> None:
    """The worker completes a row while the cancel walks: the cancel waits for the row, then
    finds it done and leaves it (the worker's result is not lost), and cancels the rest."""
    ids = _enqueue(conn, 5)
    held = _claim(conn, "w1", 1)
    assert held == ids[:1]
    worker = connect(autocommit=False, name="worker")
    operator = connect(name="operator")
    operator_pid = _pid(operator)
    # The worker's settling transaction, as the Python worker makes it: the rows first, in id
    # order, by a heartbeat; then the settlement.
    extended = worker.execute(
        "SELECT * FROM x_jobs.extend_lease(%s::bigint[], 'w1')", [held]
    ).fetchall()
    assert extended == [(held[0],)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        cancelled = pool.submit(lambda: _one(operator, "SELECT x_jobs.cancel_jobs()"))
        wait_for_lock_waiters(conn, [operator_pid])
        assert not cancelled.done()
        completed = worker.execute(
            "SELECT * FROM x_jobs.complete_many(%s::bigint[], 'w1')", [held]
        ).fetchall()
        assert completed == [(held[0],)]
        worker.commit()
        assert cancelled.result(timeout=DEADLINE_SECONDS) == 4
    assert _states(conn, ids) == {held[0]: "done", **{i: "cancelled" for i in ids[1:]}}
    counts = conn.execute(
        "SELECT sum(completed)::int, sum(cancelled)::int FROM x_jobs.counter WHERE job = 'bulk_job'"
    ).fetchone()
    assert counts == (1, 4)


def test_a_bulk_cancel_that_waited_for_a_heartbeat_cancels_the_row(
    conn: Conn, connect: Connect
) -> None:
    """The worker only renewed its lease: the row is still live when the cancel gets it, so it
    is cancelled (SKIP LOCKED would have passed over it, and it would run on); the worker's
    next heartbeat drops it and its settlement does nothing."""
    ids = _enqueue(conn, 3)
    held = _claim(conn, "w1", 1)
    worker = connect(autocommit=False, name="worker")
    operator = connect(name="operator")
    operator_pid = _pid(operator)
    worker.execute("SELECT * FROM x_jobs.extend_lease(%s::bigint[], 'w1')", [held])
    with ThreadPoolExecutor(max_workers=1) as pool:
        cancelled = pool.submit(lambda: _one(operator, "SELECT x_jobs.cancel_jobs()"))
        wait_for_lock_waiters(conn, [operator_pid])
        worker.commit()
        assert cancelled.result(timeout=DEADLINE_SECONDS) == 3
    assert set(_states(conn, ids).values()) == {"cancelled"}
    worker.autocommit = True
    beat = worker.execute("SELECT * FROM x_jobs.extend_lease(%s::bigint[], 'w1')", [held])
    assert beat.fetchall() == []
    settled = worker.execute("SELECT * FROM x_jobs.complete_many(%s::bigint[], 'w1')", [held])
    assert settled.fetchall() == []
    assert _states(conn, held) == {held[0]: "cancelled"}


def test_a_bulk_cancel_and_a_workers_heartbeats_do_not_deadlock(
    conn: Conn, connect: Connect
) -> None:
    """The cancel walks up the ids and waits at the middle row, which a worker's transaction
    holds; that worker then takes a higher row. It gets it at once: the cancel, going up,
    holds only rows below the one it waits for. (A walk in another order would hold the higher
    row and wait for the middle one while the worker waits for the higher: a deadlock, which
    PostgreSQL ends by aborting one of them.)"""
    ids = _enqueue(conn, 3)
    low, middle, high = _claim(conn, "w1", 3)
    assert [low, middle, high] == ids
    worker = connect(autocommit=False, name="worker")
    worker.execute(NO_WAIT)
    operator = connect(name="operator")
    operator_pid = _pid(operator)
    worker.execute("SELECT * FROM x_jobs.extend_lease(%s::bigint[], 'w1')", [[middle]])
    with ThreadPoolExecutor(max_workers=1) as pool:
        cancelled = pool.submit(lambda: _one(operator, "SELECT x_jobs.cancel_jobs()"))
        wait_for_lock_waiters(conn, [operator_pid])
        later = worker.execute("SELECT * FROM x_jobs.extend_lease(%s::bigint[], 'w1')", [[high]])
        assert later.fetchall() == [(high,)]
        done = worker.execute(
            "SELECT * FROM x_jobs.complete_many(%s::bigint[], 'w1')", [[middle, high]]
        )
        assert sorted(done.fetchall()) == [(middle,), (high,)]
        worker.commit()
        assert cancelled.result(timeout=DEADLINE_SECONDS) == 1
    assert _states(conn, ids) == {low: "cancelled", middle: "done", high: "done"}


def test_claims_pass_over_the_rows_a_bulk_cancel_holds(conn: Conn, connect: Connect) -> None:
    """A cancel not yet committed holds the rows it cancelled: a claim takes the others at once
    and never those, which are cancelled once it commits."""
    ids = _enqueue(conn, 6)
    operator = connect(autocommit=False, name="operator")
    claimer = connect(name="claimer")
    claimer.execute(NO_WAIT)
    assert _one(operator, "SELECT x_jobs.cancel_jobs(max_rows => 2)") == 2
    assert _claim(claimer, "w1", 10) == ids[2:]
    operator.commit()
    assert _states(conn, ids) == {
        **{i: "cancelled" for i in ids[:2]},
        **{i: "running" for i in ids[2:]},
    }


def test_two_bulk_cancels_at_once_cancel_and_count_each_row_once(
    conn: Conn, connect: Connect
) -> None:
    """The second waits for the rows the first holds, then finds them cancelled: every row is
    cancelled by one of them, and counted once."""
    ids = _enqueue(conn, 50)
    first = connect(autocommit=False, name="first")
    second = connect(name="second")
    second_pid = _pid(second)
    assert _one(first, "SELECT x_jobs.cancel_jobs(queue => 'bulk', max_rows => 30)") == 30
    with ThreadPoolExecutor(max_workers=1) as pool:
        other = pool.submit(lambda: _one(second, "SELECT x_jobs.cancel_jobs()"))
        wait_for_lock_waiters(conn, [second_pid])
        first.commit()
        assert other.result(timeout=DEADLINE_SECONDS) == 20
    assert set(_states(conn, ids).values()) == {"cancelled"}
    counted = _one(conn, "SELECT sum(cancelled)::int FROM x_jobs.counter WHERE job = 'bulk_job'")
    assert counted == 50


def _dead(conn: Conn, count: int, queue: str = "bulk", **fields: Any) -> list[int]:
    ids = _enqueue(conn, count, queue, max_attempts=1, **fields)
    assert _claim(conn, "w0", count, queue) == ids
    for job_id in ids:
        conn.execute("SELECT x_jobs.fail(%s, 'w0', 'boom')", [job_id])
    return ids


def test_a_key_taken_by_an_enqueue_during_a_bulk_retry_leaves_that_row_dead(
    conn: Conn, connect: Connect
) -> None:
    """An enqueue takes the key of a dead row between the retry's check and its update: the
    retry waits for the enqueue's transaction, and once it commits, that batch is retried again
    row by row, leaving the row whose key is taken as it was and re-queuing the others; a
    NOTICE says how many were left."""
    keyed = _dead(conn, 1, idempotency_key="K")
    plain = _dead(conn, 2)
    producer = connect(autocommit=False, name="producer")
    operator = connect(name="operator")
    operator_pid = _pid(operator)
    notices: list[str] = []
    operator.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    enqueued = _one(producer, "SELECT id FROM x_jobs.enqueue('bulk_job', idempotency_key => 'K')")
    with ThreadPoolExecutor(max_workers=1) as pool:
        retried = pool.submit(lambda: _one(operator, "SELECT x_jobs.retry_jobs()"))
        wait_for_lock_waiters(conn, [operator_pid])
        producer.commit()
        assert retried.result(timeout=DEADLINE_SECONDS) == 2
    assert _states(conn, [*keyed, *plain, enqueued]) == {
        keyed[0]: "dead",
        plain[0]: "ready",
        plain[1]: "ready",
        enqueued: "ready",
    }
    assert notices == [
        "1 matching jobs were left as they were: a live job holds their idempotency key"
    ]


def test_a_key_given_back_during_a_bulk_retry_is_retried(conn: Conn, connect: Connect) -> None:
    """The enqueue that held the key rolls back: the retry's wait ends without a conflict, and
    every row is re-queued, with no NOTICE."""
    ids = _dead(conn, 1, idempotency_key="K") + _dead(conn, 2)
    producer = connect(autocommit=False, name="producer")
    operator = connect(name="operator")
    operator_pid = _pid(operator)
    notices: list[str] = []
    operator.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    producer.execute("SELECT x_jobs.enqueue('bulk_job', idempotency_key => 'K')")
    with ThreadPoolExecutor(max_workers=1) as pool:
        retried = pool.submit(lambda: _one(operator, "SELECT x_jobs.retry_jobs()"))
        wait_for_lock_waiters(conn, [operator_pid])
        producer.rollback()
        assert retried.result(timeout=DEADLINE_SECONDS) == 3
    assert set(_states(conn, ids).values()) == {"ready"}
    assert notices == []


def test_a_bulk_retry_wakes_the_workers_of_its_queues(conn: Conn, connect: Connect) -> None:
    """As retry(id) does: a NOTIFY on x_jobs per queue it re-queued into, sent at its commit,
    and none for a queue it left alone."""
    _dead(conn, 3, queue="mail")
    _dead(conn, 2, queue="media")
    _dead(conn, 1, queue="left")
    listener = connect(name="listener")
    listener.execute("LISTEN x_jobs")
    assert _one(conn, "SELECT x_jobs.retry_jobs(queue => 'mail')") == 3
    assert _one(conn, "SELECT x_jobs.retry_jobs(state => 'dead', name => 'nobody')") == 0
    assert _one(conn, "SELECT x_jobs.retry_jobs(queue => 'media')") == 2
    assert _one(conn, "SELECT x_jobs.retry_jobs(queue => 'left')") == 1
    queue = notify_names(conn, "x_jobs", ["mail", "media", "left"])
    heard = [queue(n.payload) for n in listener.notifies(timeout=DEADLINE_SECONDS, stop_after=3)]
    assert heard == ["mail", "media", "left"]
