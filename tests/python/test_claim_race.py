"""Claimers racing over one queue: SKIP LOCKED hands every job to exactly one of them."""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import DEADLINE_SECONDS, Conn, Connect, wait_for, wait_for_lock_waiters
from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)

JOBS = 10_000
BATCH = 1_000
CLAIMERS = 8


def _enqueue_all(conn: Conn) -> set[int]:
    ids: set[int] = set()
    for start in range(0, JOBS, BATCH):
        requests = [{"name": "race", "input": {"n": n}} for n in range(start, start + BATCH)]
        rows = conn.execute(
            "SELECT id, deduped FROM x_jobs.enqueue_many(%s)", [Jsonb(requests)]
        ).fetchall()
        assert len(rows) == BATCH
        assert not any(deduped for _, deduped in rows)
        ids.update(int(job_id) for job_id, _ in rows)
    return ids


def _claimer(conn: Conn, worker: str, seed: int, barrier: threading.Barrier) -> list[int]:
    """Claim 10-50 at a time and complete them until no ready row is left; answer the ids."""
    rng = random.Random(seed)
    claimed: list[int] = []
    barrier.wait(timeout=DEADLINE_SECONDS)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        qty = rng.randint(10, 50)
        rows = conn.execute(
            "SELECT id, state, claimed_by, attempt, claims"
            " FROM x_jobs.claim(ARRAY['default'], %s, '5 minutes', %s)",
            [worker, qty],
        ).fetchall()
        if not rows:
            # An empty answer can mean only that the rest is locked by claims in flight.
            left = conn.execute(
                "SELECT EXISTS (SELECT FROM x_jobs.job WHERE state = 'ready')"
            ).fetchone()
            assert left is not None
            if not left[0]:
                return claimed
            continue
        assert len(rows) <= qty
        for job_id, state, claimed_by, attempt, claims in rows:
            assert (state, claimed_by, attempt, claims) == ("running", worker, 1, 1), job_id
        ids = [int(row[0]) for row in rows]
        completed = conn.execute(
            "SELECT x_jobs.complete_many(%s::bigint[], %s)", [ids, worker]
        ).fetchall()
        assert sorted(int(row[0]) for row in completed) == sorted(ids)
        claimed.extend(ids)
    raise TimeoutError(f"{worker} still claiming after 60 s")


def test_concurrent_claimers_take_every_job_exactly_once(conn: Conn, connect: Connect) -> None:
    enqueued = _enqueue_all(conn)
    assert len(enqueued) == JOBS

    conns = [connect(name=f"claimer-{n}") for n in range(CLAIMERS)]
    barrier = threading.Barrier(CLAIMERS)
    with ThreadPoolExecutor(max_workers=CLAIMERS) as pool:
        futures = [pool.submit(_claimer, c, f"worker-{n}", n, barrier) for n, c in enumerate(conns)]
        per_claimer = [f.result(timeout=120) for f in futures]

    every_claim = [job_id for ids in per_claimer for job_id in ids]
    # No id was handed to two claimers (or twice to one), and none was left out.
    assert len(every_claim) == len(set(every_claim)) == JOBS
    assert set(every_claim) == enqueued
    # The work really was shared: more than one claimer got jobs.
    assert sum(1 for ids in per_claimer if ids) > 1, [len(ids) for ids in per_claimer]

    states = conn.execute(
        "SELECT state::text, claims, attempt, count(*) FROM x_jobs.job GROUP BY 1, 2, 3"
    ).fetchall()
    assert states == [("done", 1, 1, JOBS)]

    # Each row was completed by the worker that claimed it.
    owners: dict[int, str] = dict(conn.execute("SELECT id, claimed_by FROM x_jobs.job").fetchall())
    for n, ids in enumerate(per_claimer):
        assert all(owners[job_id] == f"worker-{n}" for job_id in ids)


def test_claims_of_concurrency_keys_in_two_passes_do_not_deadlock(
    conn: Conn, connect: Connect
) -> None:
    """A claim that needs a second pass holds the key locks of its first. Claim A's first pass
    takes key b and its second wants a; claim B's first takes a and its second wants b. Waiting
    in the second pass closed that cycle (40P01, one claim aborted); a second pass only tries,
    and leaves a key it cannot have now to the other claim."""

    def enqueue(queue: str, key: str, priority: int, n: int = 1) -> None:
        conn.execute(
            "SELECT x_jobs.enqueue('keyed', queue => %s, concurrency_key => %s,"
            " concurrency_limit => 1, priority => %s) FROM generate_series(1, %s)",
            [queue, key, priority, n],
        )

    # Each claim's first pass picks two rows of one key and is granted one (the limit); its
    # second pass then picks the row of the other key.
    enqueue("qa", "b", 0, 2)
    enqueue("qa", "a", 1)
    enqueue("qb", "a", 0, 2)
    enqueue("qb", "b", 1)

    # A third session holds key b, so that claim A waits in its first pass until B has run.
    holder = connect(autocommit=False, name="key holder")
    holder.execute("SELECT pg_advisory_xact_lock(2024061701, hashtext('b'))")
    outcomes: dict[str, object] = {}

    def claim(worker: str, queue: str, claimer: Conn) -> None:
        try:
            outcomes[worker] = claimer.execute(
                "SELECT concurrency_key FROM x_jobs.claim(ARRAY[%s], %s, '5 minutes', 2)",
                [queue, worker],
            ).fetchall()
        except Exception as err:  # the assertion below names it
            outcomes[worker] = err

    claimers = {worker: connect(name=worker) for worker in ("A", "B")}
    pids = {worker: _pid(claimer) for worker, claimer in claimers.items()}
    a = threading.Thread(target=claim, args=("A", "qa", claimers["A"]))
    a.start()
    wait_for_lock_waiters(conn, [pids["A"]])
    b = threading.Thread(target=claim, args=("B", "qb", claimers["B"]))
    b.start()
    # B's first pass takes a; its second wants b, which the holder has: it waits (0.3.2) or
    # passes over b (since 0.3.3). Either way it is done with its first pass now.
    wait_for(lambda: not b.is_alive() or _waiting(conn, pids["B"]), "claim B to pass or wait on b")
    holder.commit()
    a.join(timeout=DEADLINE_SECONDS)
    b.join(timeout=DEADLINE_SECONDS)

    assert not isinstance(outcomes.get("A"), Exception), outcomes.get("A")
    assert not isinstance(outcomes.get("B"), Exception), outcomes.get("B")
    # Neither key ever had two running rows.
    running = conn.execute(
        "SELECT concurrency_key, count(*) FROM x_jobs.job WHERE state = 'running'"
        " GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert all(count == 1 for _, count in running), running
    assert outcomes["A"] == [("b",)] and outcomes["B"] == [("a",)], outcomes


def _waiting(observer: Conn, pid: int) -> bool:
    row = observer.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return bool(row and row[0])


def _pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])
