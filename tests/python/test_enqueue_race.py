"""Connections enqueueing one idempotency key at once: one live row, every answer points at it."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from conftest import DEADLINE_SECONDS, Conn, Connect, wait_for_lock_waiters
from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)

KEY = "order-42"
RACERS = 7


def _enqueue(conn: Conn, key: str = KEY) -> tuple[int, bool]:
    row = conn.execute(
        "SELECT id, deduped FROM x_jobs.enqueue('charge', idempotency_key => %s)", [key]
    ).fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


def _rows_of(conn: Conn, key: str = KEY) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, state::text FROM x_jobs.job WHERE idempotency_key = %s ORDER BY id", [key]
    ).fetchall()


def test_eight_connections_enqueue_one_key_at_once(conn: Conn, connect: Connect) -> None:
    conns = [connect(name=f"enqueuer-{n}") for n in range(8)]
    barrier = threading.Barrier(len(conns))

    def run(c: Conn) -> tuple[int, bool]:
        barrier.wait(timeout=DEADLINE_SECONDS)
        return _enqueue(c)

    with ThreadPoolExecutor(max_workers=len(conns)) as pool:
        answers = list(pool.map(run, conns, timeout=DEADLINE_SECONDS))

    rows = _rows_of(conn)
    assert len(rows) == 1
    (row_id, state) = rows[0]
    assert state == "ready"
    assert {job_id for job_id, _ in answers} == {row_id}
    assert sorted(deduped for _, deduped in answers) == [False] + [True] * 7


def test_waiters_on_an_uncommitted_key_answer_its_row_once_it_commits(
    conn: Conn, connect: Connect
) -> None:
    holder = connect(name="holder")
    racers = [connect(name=f"racer-{n}") for n in range(RACERS)]
    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        with holder.transaction():
            held_id, held_deduped = _enqueue(holder)
            assert not held_deduped
            futures = [pool.submit(_enqueue, c) for c in racers]
            # Every racer's insert found the uncommitted row in the unique index and waits on it.
            wait_for_lock_waiters(conn, [c.info.backend_pid for c in racers])
            assert not any(f.done() for f in futures)
        answers = [f.result(timeout=DEADLINE_SECONDS) for f in futures]

    assert answers == [(held_id, True)] * RACERS
    assert _rows_of(conn) == [(held_id, "ready")]


def test_waiters_on_a_rolled_back_key_elect_one_new_row(conn: Conn, connect: Connect) -> None:
    holder = connect(name="holder")
    racers = [connect(name=f"racer-{n}") for n in range(RACERS)]
    with ThreadPoolExecutor(max_workers=RACERS) as pool:
        with holder.transaction():
            held_id, _ = _enqueue(holder)
            futures = [pool.submit(_enqueue, c) for c in racers]
            wait_for_lock_waiters(conn, [c.info.backend_pid for c in racers])
            assert not any(f.done() for f in futures)
            raise psycopg.Rollback()
        answers = [f.result(timeout=DEADLINE_SECONDS) for f in futures]

    rows = _rows_of(conn)
    assert len(rows) == 1
    (row_id, state) = rows[0]
    assert state == "ready"
    assert row_id != held_id
    assert {job_id for job_id, _ in answers} == {row_id}
    assert sorted(deduped for _, deduped in answers) == [False] + [True] * (RACERS - 1)
    # The rolled back row is gone for good.
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (1,)


def _enqueue_many(conn: Conn, keys: list[str]) -> list[tuple[int, int, bool]]:
    requests = [{"name": "sync", "idempotency_key": key} for key in keys]
    rows = conn.execute(
        "SELECT ord, id, deduped FROM x_jobs.enqueue_many(%s)", [Jsonb(requests)]
    ).fetchall()
    return [(int(o), int(i), bool(d)) for o, i, d in rows]


def _check_batches(
    conn: Conn, batches: list[list[str]], answers: list[list[tuple[int, int, bool]]]
) -> None:
    """Every key has one row; every answer names it; each key is deduped false exactly once."""
    row_of: dict[str, int] = dict(
        conn.execute(
            "SELECT idempotency_key, id FROM x_jobs.job WHERE idempotency_key IS NOT NULL"
        ).fetchall()
    )
    all_keys = {key for keys in batches for key in keys}
    assert set(row_of) == all_keys
    total = conn.execute("SELECT count(*) FROM x_jobs.job").fetchone()
    assert total == (len(all_keys),), "a key got two rows"

    inserted: dict[str, int] = dict.fromkeys(all_keys, 0)
    for keys, rows in zip(batches, answers, strict=True):
        assert [ord_ for ord_, _, _ in rows] == list(range(1, len(keys) + 1))
        for key, (_, job_id, deduped) in zip(keys, rows, strict=True):
            assert job_id == row_of[key], key
            inserted[key] += not deduped
    assert all(count == 1 for count in inserted.values()), inserted


def test_enqueue_many_with_overlapping_keys_at_once(conn: Conn, connect: Connect) -> None:
    # Both batches also repeat a key of their own: the later request answers the first one's row.
    batch_a = [f"k{n:03}" for n in range(0, 300)] + ["k010"]
    batch_b = [f"k{n:03}" for n in range(150, 450)] + ["k200"]
    first, second = connect(name="batch-a"), connect(name="batch-b")
    barrier = threading.Barrier(2)

    def run(c: Conn, keys: list[str]) -> list[tuple[int, int, bool]]:
        barrier.wait(timeout=DEADLINE_SECONDS)
        return _enqueue_many(c, keys)

    with ThreadPoolExecutor(max_workers=2) as pool:
        fa = pool.submit(run, first, batch_a)
        fb = pool.submit(run, second, batch_b)
        answers = [fa.result(timeout=DEADLINE_SECONDS), fb.result(timeout=DEADLINE_SECONDS)]

    _check_batches(conn, [batch_a, batch_b], answers)
    # The in-batch repeats are deduped onto their batch's earlier request.
    assert answers[0][-1][2] is True
    assert answers[1][-1][2] is True


def test_enqueue_many_waits_for_an_uncommitted_overlap(conn: Conn, connect: Connect) -> None:
    batch_a = [f"k{n:03}" for n in range(0, 100)]
    batch_b = [f"k{n:03}" for n in range(50, 150)]
    first, second = connect(name="batch-a"), connect(name="batch-b")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with first.transaction():
            answers_a = _enqueue_many(first, batch_a)
            future = pool.submit(_enqueue_many, second, batch_b)
            wait_for_lock_waiters(conn, [second.info.backend_pid])
        answers_b = future.result(timeout=DEADLINE_SECONDS)

    assert not any(deduped for _, _, deduped in answers_a)
    ids_a = {key: job_id for key, (_, job_id, _) in zip(batch_a, answers_a, strict=True)}
    for key, (_, job_id, deduped) in zip(batch_b, answers_b, strict=True):
        if key in ids_a:
            assert (job_id, deduped) == (ids_a[key], True), key
        else:
            assert not deduped, key
    _check_batches(conn, [batch_a, batch_b], [answers_a, answers_b])


def test_enqueue_many_in_opposite_key_orders_does_not_deadlock(
    conn: Conn, connect: Connect
) -> None:
    # Inserted in input order, these two batches took their keys in opposite orders and one of
    # them died of a deadlock (40P01) in every round; inserted in key order they just wait.
    keys = [f"k{n:04}" for n in range(2000)]
    batches = [keys, list(reversed(keys))]
    first, second = connect(name="ascending"), connect(name="descending")

    def run(c: Conn, batch: list[str], start: threading.Barrier) -> list[tuple[int, int, bool]]:
        start.wait(timeout=DEADLINE_SECONDS)
        return _enqueue_many(c, batch)

    for _ in range(3):
        conn.execute("DELETE FROM x_jobs.job")
        start = threading.Barrier(2)
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [
                pool.submit(run, c, b, start) for c, b in zip((first, second), batches, strict=True)
            ]
            answers = [f.result(timeout=DEADLINE_SECONDS) for f in futures]
        _check_batches(conn, batches, answers)
