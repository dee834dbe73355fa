"""Claimers racing over one queue: SKIP LOCKED hands every job to exactly one of them."""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import DEADLINE_SECONDS, Conn, Connect
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


def test_a_claim_never_waits_for_a_key_another_claim_holds(conn: Conn, connect: Connect) -> None:
    """A claim that meets a key whose lock another claim holds (here a session in a long
    transaction) leaves that key's rows to the others and takes the rest at once. Until 0.3.6 a
    claim's first pass waited for its keys: every claimer of a key stalled behind a claim made
    in a long transaction, and two claims whose keys' hashes collided (key102617 and key114849,
    with key11 between them in text order) deadlocked, since the lock is on the hash."""
    conn.execute(
        "SELECT x_jobs.enqueue('keyed', queue => 'qa', concurrency_key => k,"
        " concurrency_limit => 1, priority => p)"
        " FROM (VALUES ('b', 0), ('b', 0), ('a', 1)) AS v (k, p)"
    )
    conn.execute("SELECT x_jobs.enqueue('plain', queue => 'qa', priority => 2)")
    holder = connect(autocommit=False, name="key holder")
    holder.execute("SELECT pg_advisory_xact_lock(2024061701, hashtext('b'))")
    claimer = connect(name="claimer")
    # A wait would end here, as an error, rather than hang the test.
    claimer.execute("SET statement_timeout = '10s'")

    def claim(worker: str) -> list[str | None]:
        rows = claimer.execute(
            "SELECT concurrency_key FROM x_jobs.claim(ARRAY['qa'], %s, '5 minutes', 3)", [worker]
        ).fetchall()
        return sorted((key for (key,) in rows), key=str)

    assert claim("A") == [None, "a"]
    holder.commit()
    assert claim("B") == ["b"]  # the key's limit is 1: one of its two rows
    running = conn.execute(
        "SELECT concurrency_key, count(*) FROM x_jobs.job WHERE state = 'running'"
        " AND concurrency_key IS NOT NULL GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert running == [("a", 1), ("b", 1)]


def _waiting(observer: Conn, pid: int) -> bool:
    row = observer.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return bool(row and row[0])


def _pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])
