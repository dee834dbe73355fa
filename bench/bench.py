"""x_jobs benchmarks: `make bench` runs this on a throwaway server with durable settings.

It prints the server's settings and a table of figures; each figure is compared with its target
from the issues as a ratio measured in the same run, because the machines are shared and noisy.

  enqueue_many   jobs/s, batches of 1,000 from one connection
  claim latency  median and p99 of one claim call, qty 1 and 10, at a backlog of 1,000 and of
                 100,000 due rows, both beside 1,000,000 done rows
  claim+complete rows/s from 8 connections (claim 100, complete them in one call), against the
                 ceiling: a hand-written FOR UPDATE SKIP LOCKED update of a plain table. Two
                 ways: claim and complete each in its own transaction, and the pipelined loop
                 (complete the previous batch and claim the next in one transaction)
  drain          jobs/s of x-jobs worker processes draining no-op jobs, beside the peers: x_jobs
                 and graphile-worker in interleaved rounds, each counting its best
  outbox         outbox_put throughput inside application transactions (1 and 4 connections,
                 and put_many of 100), and relay throughput to a local no-op HTTP endpoint
                 and to the job sink with 1 and 4 relay processes (and to a no-op function
                 sink: the relay's own cost)
  events         publishes/s (each waking one of 10,000 waiting runs) from 1 and 4
                 connections, and the latency from a publish's commit to the resumed run
  bulk           cancelling 100,000 queued jobs beside 1,000,000 done rows: one cancel_jobs
                 call, `x-jobs jobs cancel --queue ... --yes` (batches of 10,000, each its
                 own transaction), retry_jobs of them all, against one cancel(id) per row
                 on a sample, each its own transaction (extrapolated)
  previous       the newest version against the previous release on the same server: the
                 enqueue, the claim latency and the drain, each database served by its own
                 version's client, in interleaved rounds (bench/previous_release.py)
  soak           steady production (2,000 jobs/s) into a fresh, never-analysed database, one
                 worker at its defaults, x_jobs then graphile-worker: a line every 10 s and
                 whether x_jobs keeps up from the start (bench/soak.py)
  versus         beside graphile-worker: drains of 100,000 and 1,000,000 jobs with the
                 server's CPU per job, x_jobs at its defaults, and the wake latency at 50
                 and 500 jobs/s (bench/versus.py)
  schedules      tick_schedules' cost firing 100 due schedules at 100 and at 100,000 schedules,
                 and the lateness of 10,000 schedules due in one minute, ticked by two
                 processes at the minute's turn (bench/schedules.py)
  fairness       fair queues: the wait of ten small tenants' jobs behind one tenant's 200,000
                 on a fair queue and on a FIFO queue, one worker draining, and the claim's
                 latency at 1, 100 and 10,000 tenants with ready rows (bench/fairness.py)

Run it by hand against any server with `python bench/bench.py` (PGHOST etc. name the server;
it creates and drops its own database). `--quick` shrinks every size for a smoke run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from peers.peerlib import alive, wait_drained
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

BENCH_DB = "x_jobs_bench"


@dataclass(frozen=True)
class Sizes:
    enqueue_batches: int
    done_rows: int
    big_backlog: int
    small_backlog: int
    claims_per_point: int
    throughput_rows: int
    threads: int
    drain_jobs: int
    #: Rounds of the drains of x_jobs and graphile-worker, interleaved; each counts its best.
    drain_rounds: int
    procrastinate_jobs: int
    waiting_runs: int
    resume_samples: int
    put_transactions: int
    relay_messages: int
    bulk_jobs: int
    #: Jobs cancelled one cancel(id) call each, the figure extrapolated to bulk_jobs.
    bulk_sample: int


FULL = Sizes(
    enqueue_batches=200,
    done_rows=1_000_000,
    big_backlog=100_000,
    small_backlog=1_000,
    claims_per_point=400,
    throughput_rows=200_000,
    threads=8,
    drain_jobs=100_000,
    drain_rounds=3,
    procrastinate_jobs=5_000,
    waiting_runs=10_000,
    resume_samples=200,
    put_transactions=4_000,
    relay_messages=20_000,
    bulk_jobs=100_000,
    bulk_sample=2_000,
)
QUICK = Sizes(
    enqueue_batches=6,
    done_rows=20_000,
    big_backlog=5_000,
    small_backlog=500,
    claims_per_point=40,
    throughput_rows=10_000,
    threads=8,
    drain_jobs=10_000,
    drain_rounds=2,
    procrastinate_jobs=500,
    waiting_runs=1_000,
    resume_samples=30,
    put_transactions=400,
    relay_messages=2_000,
    bulk_jobs=5_000,
    bulk_sample=200,
)


@contextmanager
def bench_database() -> Iterator[str]:
    """A fresh database with the extension; its conninfo. Dropped afterwards."""
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(BENCH_DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(BENCH_DB)))
    try:
        with psycopg.connect(dbname=BENCH_DB, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION x_jobs")
        yield f"dbname={BENCH_DB}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(BENCH_DB))
            )


def settings(conn: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str]]:
    names = [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_level",
        "shared_buffers",
        "max_wal_size",
    ]
    rows = conn.execute(
        "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name = ANY(%s)",
        [names],
    ).fetchall()
    found = {str(name): str(value) for name, value in rows}
    return [(name, found.get(name, "?")) for name in names]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def batch_json(
    start: int, count: int, queue: str = "bench", name: str = "bench", keep_done: bool = True
) -> str:
    extra = {} if keep_done else {"keep_done": False}
    return json.dumps(
        [
            {"name": name, "queue": queue, "input": {"n": n}, **extra}
            for n in range(start, start + count)
        ]
    )


def enqueue_backlog(
    dsn: str, rows: int, queue: str, name: str = "bench", keep_done: bool = True
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, rows, 1000):
            count = min(1000, rows - start)
            conn.execute(
                "SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)",
                [batch_json(start, count, queue, name, keep_done)],
            )


# --- enqueue_many ------------------------------------------------------------------------------


RAW_INSERT = """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        name, queue, tenant_id, input)
    SELECT now(), now(), now(), gen_random_uuid(), interval '1 second', interval '1 hour',
           'ready', 25, r.name, r.queue, 'none', r.input
    FROM jsonb_to_recordset(%s::jsonb) AS r (name text, queue text, input jsonb)
"""


def bench_enqueue_many(dsn: str, sizes: Sizes) -> tuple[float, float]:
    """jobs/s of enqueue_many in batches of 1,000 from one connection, and of the floor: a raw
    INSERT ... SELECT of the same rows (no validation, no dedupe, no wake), in alternate batches.
    """
    payloads = [batch_json(i * 1000, 1000) for i in range(sizes.enqueue_batches)]
    ours = raw = 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)", [batch_json(0, 10)])
        for n, payload in enumerate(payloads):
            started = time.perf_counter()
            if n % 2:
                conn.execute(RAW_INSERT, [payload])
                raw += time.perf_counter() - started
            else:
                conn.execute("SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)", [payload])
                ours += time.perf_counter() - started
        conn.execute("DELETE FROM x_jobs.job")
    half = sizes.enqueue_batches // 2 * 1000
    return half / ours, half / raw


# --- claim latency -----------------------------------------------------------------------------


def fill_done_rows(dsn: str, rows: int) -> None:
    """`rows` finished jobs, written straight into the table: history a claim must not read."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO x_jobs.job (
                run_at, created_at, updated_at, finished_at, started_at, run_id, backoff_base,
                backoff_max, state, attempt, max_attempts, name, queue, tenant_id, input, output)
            SELECT now() - interval '1 hour', now() - interval '1 hour', now(), now(), now(),
                   gen_random_uuid(), interval '1 second', interval '1 hour', 'done', 1, 25,
                   'bench', 'bench', 'none', jsonb_build_object('n', g), '{}'
            FROM generate_series(1, %s) AS g
            """,
            [rows],
        )
        conn.execute("VACUUM ANALYZE x_jobs.job")


def claim_latency(dsn: str, sizes: Sizes, qty: int) -> list[float]:
    """Seconds per claim call, the backlog topped up (untimed) after each call."""
    samples: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(sizes.claims_per_point):
            started = time.perf_counter()
            rows = conn.execute(
                "SELECT id FROM x_jobs.claim(ARRAY['bench'], 'bench-worker', '5 minutes', %s)",
                [qty],
            ).fetchall()
            samples.append(time.perf_counter() - started)
            ids = [row[0] for row in rows]
            conn.execute("SELECT count(*) FROM x_jobs.complete_many(%s, 'bench-worker')", [ids])
            conn.execute(
                "SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)",
                [batch_json(i * qty, len(ids))],
            )
    return samples


def bench_claim_latency(dsn: str, sizes: Sizes) -> dict[tuple[int, int], list[float]]:
    fill_done_rows(dsn, sizes.done_rows)
    results: dict[tuple[int, int], list[float]] = {}
    backlog = 0
    for target in (sizes.small_backlog, sizes.big_backlog):
        enqueue_backlog(dsn, target - backlog, "bench")
        backlog = target
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE x_jobs.job")
        for qty in (1, 10):
            results[(target, qty)] = claim_latency(dsn, sizes, qty)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM x_jobs.job")
        conn.execute("VACUUM ANALYZE x_jobs.job")
    return results


# --- claim + complete throughput ----------------------------------------------------------------


Step = Callable[[psycopg.Connection[tuple[int]]], int]


def run_threads(dsn: str, threads: int, make_step: Callable[[str], Step]) -> int:
    """Run a step per connection until it answers 0; the rows handled in total.

    `make_step(worker_id)` makes each thread's step, so a step may keep state between calls.
    """
    barrier = threading.Barrier(threads)
    totals = [0] * threads
    errors: list[BaseException] = []

    def loop(slot: int) -> None:
        step = make_step(f"bench-{slot}")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                while (n := step(conn)) > 0:
                    totals[slot] += n
        except BaseException as err:
            errors.append(err)
            raise

    workers = [threading.Thread(target=loop, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(totals)


CLAIM_100 = "SELECT id FROM x_jobs.claim(ARRAY['bench'], %s, '5 minutes', 100)"
COMPLETE = "SELECT count(*) FROM x_jobs.complete_many(%s, %s)"


def claim_then_complete(worker: str) -> Step:
    """A claim and a complete_many, each its own transaction: two commits per batch."""

    def step(conn: psycopg.Connection[tuple[int]]) -> int:
        ids = [row[0] for row in conn.execute(CLAIM_100, [worker]).fetchall()]
        if ids:
            conn.execute(COMPLETE, [ids, worker])
        return len(ids)

    return step


def claim_only(worker: str) -> Step:
    """A claim of 100 whose rows are never settled: what the first of the two writes costs, for
    scale against the ceiling, whose one statement both picks a row and finishes it."""

    def step(conn: psycopg.Connection[tuple[int]]) -> int:
        return len(conn.execute(CLAIM_100, [worker]).fetchall())

    return step


def complete_and_claim(worker: str) -> Step:
    """One transaction completes the previous batch and claims the next: one commit per batch.

    What a worker does when it settles and claims in one round trip; a crash between the two
    loses nothing (the claim rolls back with the completion).
    """
    pending: list[int] = []

    def step(conn: psycopg.Connection[tuple[int]]) -> int:
        with conn.transaction():
            if pending:
                conn.execute(COMPLETE, [pending, worker])
            ids = [row[0] for row in conn.execute(CLAIM_100, [worker]).fetchall()]
        done = len(pending)
        pending[:] = ids
        return done or len(ids)

    return step


def plain_update(worker: str) -> Step:
    """The ceiling: claim 100 rows of a plain table and update them in one statement."""

    def step(conn: psycopg.Connection[tuple[int]]) -> int:
        rows = conn.execute(
            """
            UPDATE bench_plain SET state = 'done'
            WHERE id IN (
                SELECT id FROM bench_plain WHERE state = 'ready'
                ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
            )
            RETURNING id
            """
        ).fetchall()
        return len(rows)

    return step


def measure(dsn: str, sizes: Sizes, make_step: Callable[[str], Step]) -> float:
    started = time.perf_counter()
    handled = run_threads(dsn, sizes.threads, make_step)
    rate = handled / (time.perf_counter() - started)
    if handled < sizes.throughput_rows:
        raise RuntimeError(f"handled {handled} rows of {sizes.throughput_rows}")
    return rate


def bench_throughput(dsn: str, sizes: Sizes, rounds: int = 2) -> dict[str, list[float]]:
    """rows/s of the ceiling and of x_jobs both ways, in alternating rounds on one server."""
    rates: dict[str, list[float]] = {
        "ceiling": [],
        "two": [],
        "one": [],
        "unkept": [],
        "claim": [],
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """
            CREATE TABLE bench_plain (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                state text NOT NULL,
                payload jsonb NOT NULL
            )
            """
        )
        conn.execute("CREATE INDEX bench_plain_ready ON bench_plain (id) WHERE state = 'ready'")

    def fresh_plain() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE bench_plain")
            conn.execute(
                "INSERT INTO bench_plain (state, payload) "
                "SELECT 'ready', jsonb_build_object('n', g) FROM generate_series(1, %s) AS g",
                [sizes.throughput_rows],
            )
            conn.execute("VACUUM ANALYZE bench_plain")

    def fresh_jobs(keep_done: bool = True) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE x_jobs.job")
        enqueue_backlog(dsn, sizes.throughput_rows, "bench", keep_done=keep_done)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE x_jobs.job")

    for _ in range(rounds):
        fresh_plain()
        rates["ceiling"].append(measure(dsn, sizes, plain_update))
        fresh_jobs()
        rates["two"].append(measure(dsn, sizes, claim_then_complete))
        fresh_jobs()
        rates["one"].append(measure(dsn, sizes, complete_and_claim))
        fresh_jobs(keep_done=False)
        rates["unkept"].append(measure(dsn, sizes, claim_then_complete))
        fresh_jobs()
        rates["claim"].append(measure(dsn, sizes, claim_only))
    return rates


# --- end to end: worker processes draining a backlog -------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
#: The worker settings of the drain, the counterpart of graphile-worker's documented ones.
WORKER_ARGS = [
    "--concurrency",
    "24",
    "--prefetch",
    "500",
    "--poll",
    "0.1",
    "--log-level",
    "warning",
]


def drain_with_workers(
    dsn: str,
    jobs: int,
    workers: int,
    keep_done: bool = True,
    job: str = "noop",
    *,
    client: Path = ROOT / "python",
    worker_args: Sequence[str] = WORKER_ARGS,
    on_clock: Callable[[str, list[int], int], None] | None = None,
) -> float:
    """jobs/s of `workers` x-jobs worker processes draining `jobs` no-op jobs (enqueued with
    keep_done => false when keep_done is False: completing them deletes them). `job` names the
    handler in bench/apps/noop.py: "noop" (sync) or "noop_async". `client` is the directory
    holding the x_jobs package the workers import (this checkout's, or the previous release's
    for bench/previous_release.py); `dsn` names the database. `worker_args` are the workers'
    options. `on_clock` (bench/versus.py's CPU samples) is called with "start", the workers'
    process ids and the polling connection's backend pid right before the clock starts, and
    with "stop" and the same right after it stops.

    The queue is paused while the workers start and resumed once all of them have announced
    themselves, so start-up is outside the clock, as in the peers' runners.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs.job, x_jobs.worker, x_jobs.counter")
        enqueue_backlog(dsn, jobs, "bench", name=job, keep_done=keep_done)
        conn.execute("VACUUM ANALYZE x_jobs.job")
        conn.execute("CHECKPOINT")
        conn.execute("SELECT x_jobs.pause_queue('bench')")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(client), str(ROOT / "bench")]),
            PGDATABASE=str(conninfo_to_dict(dsn)["dbname"]),
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "x_jobs", "worker", "apps.noop:app", *worker_args],
                env=env,
            )
            for _ in range(workers)
        ]
        try:
            while conn.execute("SELECT count(*) FROM x_jobs.worker").fetchone() != (workers,):
                time.sleep(0.02)
            if on_clock is not None:
                on_clock("start", [proc.pid for proc in procs], conn.info.backend_pid)
            started = time.perf_counter()
            conn.execute("SELECT x_jobs.resume_queue('bench')")
            # Polled on the peers' schedule (bench/peers/peerlib.py). complete_many counts what
            # it settles in x_jobs.counter, in the same transaction, so the counters say exactly
            # how many are done. Counting the rows instead reads the whole table when the rows
            # are kept (graphile-worker's shrinks as it drains): 8-9 us of the server's CPU per
            # job, a tenth of a two-process drain (measured 2026-11-30). The rows are checked
            # once the clock has stopped.
            remaining = "SELECT %(jobs)s - coalesce(sum(completed), 0) FROM x_jobs.counter"
            seconds = wait_drained(
                conn, remaining, jobs, started, alive(procs), params={"jobs": jobs}
            )
            if on_clock is not None:
                on_clock("stop", [proc.pid for proc in procs], conn.info.backend_pid)
            left = conn.execute("SELECT count(*) FROM x_jobs.job WHERE state <> 'done'")
            if (row := left.fetchone()) != (0,):
                raise RuntimeError(f"the counters say drained, yet {row} jobs are not done")
            return jobs / seconds
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)
            # The peers drop their database after a drain; leaving these rows would leave
            # autovacuum a table to clean while the next runner drains.
            conn.execute("TRUNCATE x_jobs.job, x_jobs.worker, x_jobs.counter")


def peer_drains(sizes: Sizes, workers: int, peers: str | None = None) -> list[dict[str, Any]]:
    """The peers' own runners (bench/peers/run_all) on the same server: one dict per peer.
    `peers` picks some (run_all's PEERS, space-separated); default all."""
    env = dict(os.environ, **({"PEERS": peers} if peers else {}))
    out = subprocess.run(
        [
            str(ROOT / "bench/peers/run_all"),
            str(sizes.drain_jobs),
            str(workers),
            str(sizes.procrastinate_jobs),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# --- events: publish and wake ------------------------------------------------------------------


def park_waiting_runs(dsn: str, runs: int) -> None:
    """`runs` jobs suspended on `bench.go`, each waiting with its own key (its id)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs.job, x_jobs.step, x_jobs.event")
        enqueue_backlog(dsn, runs, "parked", name="parked")
        while conn.execute(
            "SELECT count(x_jobs.step_wait(id => c.id, worker => 'bench', step => 'go',"
            " event => 'bench.go', event_key => c.id::text))"
            " FROM x_jobs.claim(ARRAY['parked'], 'bench', '1 hour', 1000) AS c"
        ).fetchone() != (0,):
            pass
        conn.execute("VACUUM ANALYZE x_jobs.job, x_jobs.step")


def publish_rate(dsn: str, keys: list[int], threads: int, wakes: int = 1) -> float:
    """publishes/s of `threads` connections publishing one event per key, each in its own
    transaction; each must wake `wakes` runs."""
    share = [keys[n::threads] for n in range(threads)]
    woken = [0] * threads

    def publish(n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for key in share[n]:
                row = conn.execute(
                    "SELECT woken FROM x_jobs.publish('bench.go', '{\"ok\": true}', %s)",
                    [str(key)],
                ).fetchone()
                woken[n] += row[0] if row else 0

    started = time.perf_counter()
    pool = [threading.Thread(target=publish, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    elapsed = time.perf_counter() - started
    if sum(woken) != len(keys) * wakes:
        raise RuntimeError(f"{len(keys)} publishes woke {sum(woken)} runs, not {wakes} each")
    return len(keys) / elapsed


def bench_publish_rate(dsn: str, sizes: Sizes) -> dict[int, float]:
    """publishes/s from 1 and 4 connections, with `sizes.waiting_runs` runs waiting at the
    start; each round publishes for a fifth of them, so most still wait at its end."""
    rates: dict[int, float] = {}
    park_waiting_runs(dsn, sizes.waiting_runs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM x_jobs.job ORDER BY id")]
    fifth = len(ids) // 5
    for n, threads in enumerate((1, 4)):
        rates[threads] = publish_rate(dsn, ids[n * fifth : (n + 1) * fifth], threads)
    # The same publishes for keys nobody waits on: no wake, and so no NOTIFY. PostgreSQL
    # serializes the commits of notifying transactions, which is what this comparison shows.
    rates[0] = publish_rate(dsn, [-key for key in ids[:fifth]], 4, wakes=0)
    return rates


def bench_resume_latency(dsn: str, sizes: Sizes) -> list[float]:
    """Seconds from a publish's commit to the resumed run's first statement, one waiting run
    at a time, served by one x-jobs worker process (woken by NOTIFY, polling every 1 s)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs.job, x_jobs.step, x_jobs.event, x_jobs.worker")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.resumed (key text PRIMARY KEY, at timestamptz)"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT / "bench"), PGDATABASE=BENCH_DB)
        proc = subprocess.Popen(
            [sys.executable, "-m", "x_jobs", "worker", "apps.waiter:app", "--log-level", "warning"],
            env=env,
        )
        samples: list[float] = []
        try:
            for key in range(sizes.resume_samples):
                (job_id,) = conn.execute(
                    "SELECT id FROM x_jobs.enqueue(name => 'waiter', queue => 'bench',"
                    " input => jsonb_build_object('key', %s::text))",
                    [key],
                ).fetchone() or (None,)
                while conn.execute(
                    "SELECT state::text FROM x_jobs.job WHERE id = %s", [job_id]
                ).fetchone() != ("suspended",):
                    time.sleep(0.002)
                with conn.transaction():
                    conn.execute("SELECT x_jobs.publish('bench.go', NULL, %s::text)", [key])
                # The commit's instant on the server's clock, which the run stamps too.
                row = conn.execute("SELECT pg_catalog.clock_timestamp()").fetchone()
                assert row is not None
                committed = row[0]
                while (
                    resumed := conn.execute(
                        "SELECT at FROM public.resumed WHERE key = %s::text", [key]
                    ).fetchone()
                ) is None:
                    time.sleep(0.0005)
                samples.append(max(0.0, (resumed[0] - committed).total_seconds()))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    return samples


# --- the outbox: put and relay -----------------------------------------------------------------


def put_rate(
    dsn: str, transactions: int, threads: int, per_transaction: int, *, notify: bool = True
) -> float:
    """messages/s of `threads` connections committing transactions that each put
    `per_transaction` messages (one outbox_put, or one outbox_put_many), each beside an
    application row, as an application would; `notify=False` sets x_jobs.notify = off."""
    share = transactions // threads
    batch = json.dumps(
        [
            {"topic": "bench.put", "payload": {"n": n}, "key": f"k{n % 100}"}
            for n in range(per_transaction)
        ]
    )

    def put(n: int) -> None:
        with psycopg.connect(dsn, options="" if notify else "-c x_jobs.notify=off") as conn:
            for i in range(share):
                with conn.transaction():
                    conn.execute("INSERT INTO public.app_order (note) VALUES ('order')")
                    if per_transaction == 1:
                        conn.execute(
                            "SELECT x_jobs.outbox_put('bench.put', '{\"n\": 1}', %s)",
                            [f"k{i % 100}"],
                        )
                    else:
                        conn.execute("SELECT count(*) FROM x_jobs.outbox_put_many(%s)", [batch])

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS public.app_order (id bigserial PRIMARY KEY, note text)"
        )
    started = time.perf_counter()
    pool = [threading.Thread(target=put, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return share * threads * per_transaction / (time.perf_counter() - started)


class _NoContent(BaseHTTPRequestHandler):
    """The no-op webhook endpoint: reads the request, answers 204, keeps the connection."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _QuietServer(ThreadingHTTPServer):
    """Relays stopped at the end of a round drop their kept-alive connections: not an error.
    The accept queue holds every relay's connections at once (the default, 5, reset some)."""

    request_queue_size = 256

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


def relay_rate(dsn: str, messages: int, relays: int, topic: str, url: str) -> float:
    """messages/s of `relays` x-jobs relay processes delivering `messages` messages of `topic`
    (on 1,000 keys), start-up outside the clock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs.outbox, x_jobs.job")
        for start in range(0, messages, 1000):
            conn.execute(
                "SELECT count(*) FROM x_jobs.outbox_put_many(%s)",
                [
                    json.dumps(
                        [
                            {"topic": "parked." + topic, "payload": {"n": n}, "key": f"k{n % 1000}"}
                            for n in range(start, min(messages, start + 1000))
                        ]
                    )
                ],
            )
        conn.execute("VACUUM ANALYZE x_jobs.outbox")
        env = dict(
            os.environ, PYTHONPATH=str(ROOT / "bench"), PGDATABASE=BENCH_DB, X_JOBS_BENCH_URL=url
        )
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "x_jobs",
                    "relay",
                    "apps.relays:app",
                    "--concurrency",
                    "32",
                    "--poll",
                    "0.1",
                    "--log-level",
                    "warning",
                    "--log-format",
                    "json",
                ],
                env=env,
            )
            for _ in range(relays)
        ]
        try:
            # Start-up stays outside the clock: wait until every relay listens (it polls too).
            while conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                ["x_jobs relay listener"],
            ).fetchone() != (relays,):
                time.sleep(0.02)
            started = time.perf_counter()
            conn.execute("UPDATE x_jobs.outbox SET topic = %s", [topic])
            conn.execute("SELECT pg_notify('x_jobs_outbox', %s)", [topic])
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM x_jobs.outbox WHERE state <> 'delivered'"
                ).fetchone()
                if row == (0,):
                    break
                time.sleep(0.01)
            return messages / (time.perf_counter() - started)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=60)


def bench_outbox(dsn: str, sizes: Sizes) -> list[tuple[str, float]]:
    figures = [
        ("put, 1 message per transaction, 1 conn", put_rate(dsn, sizes.put_transactions, 1, 1)),
        ("put, 1 message per transaction, 4 conns", put_rate(dsn, sizes.put_transactions, 4, 1)),
        (
            "put, 1 message per transaction, 4 conns, x_jobs.notify off",
            put_rate(dsn, sizes.put_transactions, 4, 1, notify=False),
        ),
        (
            "put_many, 100 messages per transaction, 4 conns",
            put_rate(dsn, sizes.put_transactions // 20, 4, 100),
        ),
    ]
    server = _QuietServer(("127.0.0.1", 0), _NoContent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        for relays in (1, 4):
            rate = relay_rate(dsn, sizes.relay_messages, relays, "bench.hook", url)
            figures.append((f"relay to a no-op HTTP endpoint, {relays} relay(s)", rate))
        for relays in (1, 4):
            rate = relay_rate(dsn, sizes.relay_messages, relays, "bench.job", url)
            figures.append((f"relay to the job sink, {relays} relay(s)", rate))
        for relays in (1, 4):
            rate = relay_rate(dsn, sizes.relay_messages, relays, "bench.noop", url)
            figures.append((f"relay to a no-op function sink, {relays} relay(s)", rate))
    finally:
        server.shutdown()
    return figures


# --- bulk operations ---------------------------------------------------------------------------


def bench_bulk(dsn: str, sizes: Sizes) -> list[tuple[str, float]]:
    """Seconds to cancel `sizes.bulk_jobs` queued jobs of one queue, beside `sizes.done_rows`
    done ones: by one cancel_jobs call, by the CLI (its dry run, then calls of 10,000, each its
    own transaction, in a process of its own), and by one cancel(id) per row in its own
    transaction as before 0.4.0, timed on a sample and extrapolated; and to re-queue them all
    with retry_jobs. Each starts from a vacuumed table with the backlog queued."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs.job, x_jobs.counter, x_jobs.step, x_jobs.job_error")
    fill_done_rows(dsn, sizes.done_rows)
    enqueue_backlog(dsn, sizes.bulk_jobs, "bulk")
    figures: list[tuple[str, float]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:

        def timed(query: str, expected: int) -> float:
            conn.execute("VACUUM x_jobs.job")
            started = time.perf_counter()
            row = conn.execute(query).fetchone()
            elapsed = time.perf_counter() - started
            if row is None or row[0] != expected:
                raise RuntimeError(f"{query} answered {row}, not {expected}")
            return elapsed

        figures.append(
            (
                "cancel_jobs(queue), one call",
                timed("SELECT x_jobs.cancel_jobs(queue => 'bulk')", sizes.bulk_jobs),
            )
        )
        figures.append(
            (
                "retry_jobs(queue, state cancelled), one call",
                timed(
                    "SELECT x_jobs.retry_jobs(queue => 'bulk', state => 'cancelled')",
                    sizes.bulk_jobs,
                ),
            )
        )

        conn.execute("VACUUM x_jobs.job")
        env = dict(os.environ, PGDATABASE=BENCH_DB)
        command = [sys.executable, "-m", "x_jobs", "jobs", "cancel", "--queue", "bulk", "--yes"]
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        figures.append(
            ("x-jobs jobs cancel --queue --yes (a process)", time.perf_counter() - started)
        )
        left = conn.execute(
            "SELECT count(*) FROM x_jobs.job WHERE queue = 'bulk' AND state = 'ready'"
        )
        if left.fetchone() != (0,):
            raise RuntimeError("x-jobs jobs cancel left ready jobs")

        timed("SELECT x_jobs.retry_jobs(queue => 'bulk', state => 'cancelled')", sizes.bulk_jobs)
        conn.execute("VACUUM x_jobs.job")
        ids = [
            int(row[0])
            for row in conn.execute(
                "SELECT id FROM x_jobs.job WHERE queue = 'bulk' ORDER BY id LIMIT %s",
                [sizes.bulk_sample],
            )
        ]
        started = time.perf_counter()
        for job_id in ids:
            conn.execute("SELECT x_jobs.cancel(%s)", [job_id])
        per_row = (time.perf_counter() - started) / len(ids)
        figures.append(
            (
                f"cancel(id) per row, each its own transaction ({len(ids):,} timed)",
                per_row * sizes.bulk_jobs,
            )
        )
    return figures


# --- report ------------------------------------------------------------------------------------


#: run_all's name for graphile-worker, the peer that drains closest to x_jobs.
GRAPHILE = "graphile-worker"


def rounds_text(rates: list[float], unit: str) -> str:
    """Every round's figure, the best first when there are several."""
    if len(rates) == 1:
        return f"{rates[0]:,.0f} {unit}"
    rest = ", ".join(f"{rate:,.0f}" for rate in rates)
    return f"{max(rates):,.0f} {unit} (best of {rest})"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--only",
        choices=[
            "enqueue",
            "latency",
            "throughput",
            "drain",
            "events",
            "outbox",
            "bulk",
            "previous",
            "soak",
            "versus",
            "schedules",
            "fairness",
        ],
        action="append",
        help="run only these parts (repeatable)",
    )
    parser.add_argument(
        "--soak", type=float, metavar="MINUTES", help="soak each system this long (default 3)"
    )
    parser.add_argument(
        "--soak-rate", type=float, default=2_000, metavar="JOBS_PER_S", help="the soak's load"
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    parts = set(
        args.only
        or [
            "enqueue",
            "latency",
            "throughput",
            "drain",
            "events",
            "outbox",
            "bulk",
            "previous",
            "soak",
            "versus",
            "schedules",
            "fairness",
        ]
    )

    with bench_database() as dsn:
        with psycopg.connect(dsn) as conn:
            print(f"x_jobs benchmark, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
            print(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}")
            print("server: " + ", ".join(f"{k}={v}" for k, v in settings(conn)))
            print(f"sizes: {sizes}")
            print()

        lines: list[tuple[str, str, str, str]] = []
        if "enqueue" in parts:
            rate, floor = bench_enqueue_many(dsn, sizes)
            lines.append(
                (
                    "enqueue_many, batches of 1,000",
                    f"{rate:,.0f} jobs/s",
                    ">= 50,000 jobs/s",
                    verdict(rate >= 50_000),
                )
            )
            lines.append(
                ("floor: raw INSERT ... SELECT, batches of 1,000", f"{floor:,.0f} jobs/s", "", "")
            )
            lines.append(("enqueue_many / floor", f"{rate / floor:.0%}", "", ""))

        if "latency" in parts:
            lat = bench_claim_latency(dsn, sizes)
            for (backlog, qty), samples in sorted(lat.items()):
                lines.append(
                    (
                        f"claim qty {qty:>2}, backlog {backlog:,}",
                        f"median {statistics.median(samples) * 1000:.2f} ms, "
                        f"p99 {percentile(samples, 0.99) * 1000:.2f} ms",
                        "",
                        "",
                    )
                )
            for qty in (1, 10):
                big = statistics.median(lat[(sizes.big_backlog, qty)])
                small = statistics.median(lat[(sizes.small_backlog, qty)])
                lines.append(
                    (
                        f"claim qty {qty}, median ratio big/small backlog",
                        f"{big / small:.2f}",
                        "<= 1.5",
                        verdict(big / small <= 1.5),
                    )
                )
            big10 = statistics.median(lat[(sizes.big_backlog, 10)]) * 1000
            lines.append(
                (
                    f"claim qty 10 median at backlog {sizes.big_backlog:,}",
                    f"{big10:.2f} ms",
                    "< 2 ms",
                    verdict(big10 < 2),
                )
            )

        if "throughput" in parts:
            rates = bench_throughput(dsn, sizes)
            best = {name: max(values) for name, values in rates.items()}
            for name, label in (
                ("ceiling", "ceiling: plain SKIP LOCKED update of 100"),
                ("two", "x_jobs: claim 100, complete_many (2 transactions)"),
                ("one", "x_jobs: complete_many + claim 100 (1 transaction)"),
                ("unkept", "x_jobs keep_done=false: claim 100, complete_many"),
                ("claim", "x_jobs: claim 100 alone, never settled"),
            ):
                runs = ", ".join(f"{r:,.0f}" for r in rates[name])
                lines.append((f"{label}, {sizes.threads} conns", f"{runs} rows/s", "", ""))
            for name, label in (
                ("two", "2 transactions"),
                ("one", "1 transaction"),
                ("unkept", "keep_done=false"),
            ):
                ratio = best[name] / best["ceiling"]
                lines.append(
                    (
                        f"x_jobs / ceiling, {label} (best rounds)",
                        f"{ratio:.0%}",
                        ">= 70%",
                        verdict(ratio >= 0.7),
                    )
                )
            # Not a target: the scale of the one above. A settle is a second write of the row,
            # so a claim and its settle together cannot come near a ceiling that a claim alone
            # barely reaches.
            lines.append(
                (
                    "x_jobs / ceiling, claim alone (best rounds)",
                    f"{best['claim'] / best['ceiling']:.0%}",
                    "",
                    "",
                )
            )

        if "drain" in parts:
            sql_rate = max(rates["two"]) if "throughput" in parts else None
            for workers in (1, 2):
                # Rounds interleave x_jobs with graphile-worker, the closest peer, and each
                # counts its best round: the machine's speed drifts by a third within minutes
                # (docs/benchmarks.md), and one drain each would compare two moments, not two
                # systems. The far slower peers run in the first round only.
                drains: dict[str, list[float]] = {"kept": [], "unkept": []}
                peer_jobs: dict[str, int] = {}
                for round_ in range(sizes.drain_rounds):
                    drains["kept"].append(drain_with_workers(dsn, sizes.drain_jobs, workers))
                    drains["unkept"].append(
                        drain_with_workers(dsn, sizes.drain_jobs, workers, keep_done=False)
                    )
                    if round_ == 0:
                        # Async handlers take another path through the worker (an event loop);
                        # once a run, beside the sync rounds.
                        drains["async"] = [
                            drain_with_workers(dsn, sizes.drain_jobs, workers, job="noop_async")
                        ]
                    for peer in peer_drains(sizes, workers, None if round_ == 0 else GRAPHILE):
                        drains.setdefault(peer["peer"], []).append(float(peer["jobs_per_s"]))
                        peer_jobs[peer["peer"]] = int(peer["jobs"])
                ours, unkept = max(drains["kept"]), max(drains["unkept"])
                for label, key in (
                    ("", "kept"),
                    (", keep_done=false", "unkept"),
                    (", async handlers", "async"),
                ):
                    lines.append(
                        (
                            f"x_jobs worker drain, {workers} process(es), "
                            f"{sizes.drain_jobs:,} jobs{label}",
                            rounds_text(drains[key], "jobs/s"),
                            "",
                            "",
                        )
                    )
                # Each peer against both: graphile-worker and pgqueuer delete a job when it
                # completes (as keep_done=false does); procrastinate keeps it (as the default).
                for name, jobs in peer_jobs.items():
                    rate = max(drains[name])
                    lines.append(
                        (
                            f"  {name}, {workers} process(es), {jobs:,} jobs",
                            rounds_text(drains[name], "jobs/s"),
                            f"x_jobs {ours / rate:.2f}x kept, {unkept / rate:.2f}x keep_done=false",
                            f"{verdict(ours > rate)} / {verdict(unkept > rate)}",
                        )
                    )
                if sql_rate is not None and workers == 1:
                    lines.append(
                        (
                            "  x_jobs drain / pure-SQL claim+complete",
                            f"{ours / sql_rate:.0%}",
                            ">= 50%",
                            verdict(ours >= sql_rate / 2),
                        )
                    )

        if "events" in parts:
            for threads, rate in bench_publish_rate(dsn, sizes).items():
                lines.append(
                    (
                        f"publish waking one run, {threads} conn(s), "
                        f"{sizes.waiting_runs:,} runs waiting"
                        if threads
                        else "publish waking nobody (no NOTIFY), 4 conns",
                        f"{rate:,.0f} publishes/s",
                        "",
                        "",
                    )
                )
            resume = bench_resume_latency(dsn, sizes)
            lines.append(
                (
                    f"publish commit to resumed run, 1 worker, {len(resume)} runs",
                    f"median {statistics.median(resume) * 1000:.1f} ms, "
                    f"p99 {percentile(resume, 0.99) * 1000:.1f} ms",
                    "",
                    "",
                )
            )

        if "outbox" in parts:
            for label, rate in bench_outbox(dsn, sizes):
                lines.append((label, f"{rate:,.0f} messages/s", "", ""))

        if "bulk" in parts:
            figures = bench_bulk(dsn, sizes)
            for label, seconds in figures:
                lines.append(
                    (
                        f"{label}, {sizes.bulk_jobs:,} jobs",
                        f"{seconds:.2f} s ({sizes.bulk_jobs / seconds:,.0f} jobs/s)",
                        "",
                        "",
                    )
                )
            one_call, per_row = figures[0][1], figures[-1][1]
            lines.append(
                (
                    f"cancel_jobs, {sizes.bulk_jobs:,} jobs in one call",
                    f"{one_call:.2f} s",
                    "< 10 s (seconds)",
                    verdict(one_call < 10),
                )
            )
            lines.append(("cancel(id) per row / cancel_jobs", f"{per_row / one_call:.0f}x", "", ""))

        if "previous" in parts:
            # The newest against the previous release, on databases of its own (it imports
            # this module's measures, so it is imported only here).
            from previous_release import compare_with_previous  # noqa: PLC0415

            lines.extend(compare_with_previous(sizes))

        if "soak" in parts:
            # Steady production into fresh databases of its own, beside graphile-worker.
            from soak import soak  # noqa: PLC0415

            lines.extend(soak(args.soak, args.quick, args.soak_rate))

        if "versus" in parts:
            # Beside graphile-worker: drains with CPU per job, defaults, wake latency.
            from versus import compare_with_graphile  # noqa: PLC0415

            lines.extend(compare_with_graphile(dsn, args.quick))

        if "schedules" in parts:
            # Tick cost and lateness, on databases of its own.
            from schedules import bench_schedules  # noqa: PLC0415

            lines.extend(bench_schedules(args.quick))

        if "fairness" in parts:
            # Noisy neighbour and the claim at many tenants, on databases of its own.
            from fairness import bench_fairness  # noqa: PLC0415

            lines.extend(bench_fairness(args.quick))

    width = max(len(line[0]) for line in lines)
    value_width = max(len(line[1]) for line in lines)
    print(f"{'measure':<{width}}  {'result':<{value_width}}  target")
    for name, value, target, met in lines:
        print(f"{name:<{width}}  {value:<{value_width}}  {target} {met}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
