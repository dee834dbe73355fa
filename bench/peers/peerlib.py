"""What run_pgqueuer.py and run_procrastinate.py share: the database, the timed drain, the report.

The drain is timed the same way in every runner (run_graphile.mjs does the same in Node):

  1. the runner creates a database of its own, installs the peer's schema and enqueues the
     backlog (not timed), then runs VACUUM ANALYZE and CHECKPOINT so that every peer starts
     from settled statistics and no pending checkpoint;
  2. it starts W worker processes (this script again, with --worker); each imports the peer,
     connects, prints "ready" and waits;
  3. the clock starts when "go" is written to all of them, and stops when a poll of the peer's
     own table shows no job left to do. The poll backs off while many jobs are left (a few
     dozen cheap queries in a run) and comes every 5 ms near the end;
  4. the workers get "stop" (graceful shutdown) and the database is dropped.

Connections use libpq's environment (PGHOST, PGPORT, PGUSER), as scripts/throwaway-pg sets it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import IO, Any, LiteralString

import psycopg
from psycopg import sql


def fresh_database(name: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(name: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def settle(dbname: str) -> None:
    """VACUUM ANALYZE the freshly loaded backlog and CHECKPOINT, before the clock starts."""
    with psycopg.connect(dbname=dbname, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def count(dbname: str, query: LiteralString) -> int:
    with psycopg.connect(dbname=dbname, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def alive(procs: Sequence[subprocess.Popen[Any]]) -> Callable[[], None]:
    """A check for wait_drained: raises once one of the worker processes has exited."""

    def check() -> None:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker {proc.args!r} exited early ({proc.returncode})")

    return check


def wait_drained(
    conn: psycopg.Connection[Any],
    remaining_sql: LiteralString,
    jobs: int,
    started: float,
    check: Callable[[], None],
    *,
    stall_timeout: float = 120.0,
    params: Mapping[str, Any] | None = None,
) -> float:
    """Poll `remaining_sql` (with `params`) until it answers 0; the seconds from `started` to the
    poll that saw the backlog empty. Every runner polls on this schedule (x_jobs' in
    bench/bench.py too): a poll is a query on the server the workers share, so polling more
    often takes from them. `check` runs after each poll and raises if a worker died.

    The poll runs serially (run_graphile.mjs does the same): a count over a big table is planned
    as a parallel scan, and its two extra processes took a 2-core machine from the workers.
    Measured 2026-11-30: x_jobs with kept rows (the biggest table) drained 15% faster with serial
    polls, graphile-worker no differently."""
    conn.execute("SET max_parallel_workers_per_gather = 0")
    left = jobs
    last_progress = started
    while True:
        # The query's snapshot is taken when it starts: an empty answer means the backlog was
        # drained by then.
        now = time.perf_counter()
        row = conn.execute(remaining_sql, params).fetchone()
        assert row is not None
        if int(row[0]) == 0:
            return now - started
        if int(row[0]) < left:
            left, last_progress = int(row[0]), now
        elif now - last_progress > stall_timeout:
            raise RuntimeError(f"no progress for {stall_timeout:.0f} s, {left} jobs left")
        check()
        done = jobs - left
        if done > 0:
            # Sleep a third of the expected time left: few polls while the backlog is big,
            # one every 5 ms near the end.
            expected = left * (now - started) / done
            time.sleep(min(0.5, max(0.005, expected / 3)))
        else:
            time.sleep(0.02)


def timed_drain(
    worker_argv: Sequence[str],
    workers: int,
    dbname: str,
    remaining_sql: LiteralString,
    jobs: int,
    *,
    stall_timeout: float = 120.0,
) -> float:
    """Seconds from "go" to an empty backlog, with `workers` processes running `worker_argv`."""
    procs = [
        subprocess.Popen(
            [*worker_argv, f"{n}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for n in range(workers)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"worker {proc.args!r} said {line!r} instead of 'ready'")
            # Anything else a worker prints goes to stderr, away from the JSON line.
            threading.Thread(target=copy_lines, args=(proc.stdout,), daemon=True).start()
        with psycopg.connect(dbname=dbname, autocommit=True) as conn:
            started = time.perf_counter()
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            return wait_drained(
                conn, remaining_sql, jobs, started, alive(procs), stall_timeout=stall_timeout
            )
    finally:
        for proc in procs:
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write("stop\n")
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def copy_lines(source: IO[str]) -> None:
    for line in source:
        sys.stderr.write(line)


def report(peer: str, jobs: int, workers: int, seconds: float, settings: str) -> None:
    print(
        json.dumps(
            {
                "peer": peer,
                "jobs": jobs,
                "workers": workers,
                "seconds": round(seconds, 3),
                "jobs_per_s": round(jobs / seconds, 1),
                "settings": settings,
            }
        ),
        flush=True,
    )


class Control:
    """A worker's side of the protocol: says "ready", then waits for "go" and "stop" on stdin.

    End of input counts as "stop", so a worker never outlives its runner.
    """

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def read() -> None:
            for line in sys.stdin:
                if line.strip() == "go":
                    loop.call_soon_threadsafe(self.go.set)
                elif line.strip() == "stop":
                    break
            loop.call_soon_threadsafe(self.go.set)
            loop.call_soon_threadsafe(self.stop.set)

        threading.Thread(target=read, daemon=True).start()

    def ready(self) -> None:
        print("ready", flush=True)


def measure(
    peer: str,
    dbname: str,
    argv: Sequence[str],
    usage: str,
    *,
    load: Callable[[int], Coroutine[Any, Any, None]],
    worker_argv: Sequence[str],
    queued_sql: LiteralString,
    remaining_sql: LiteralString,
    done_sql: LiteralString,
    settings: str,
) -> int:
    """A runner's whole measurement: a fresh database, the backlog loaded (untimed) and counted,
    the timed drain, the check that every job succeeded, the report. Answers the exit code."""
    jobs, workers = parse_counts(argv, usage)
    fresh_database(dbname)
    try:
        asyncio.run(load(jobs))
        queued = count(dbname, queued_sql)
        if queued != jobs:
            raise RuntimeError(f"enqueued {queued} jobs, not {jobs}")
        settle(dbname)
        seconds = timed_drain(worker_argv, workers, dbname, remaining_sql, jobs)
        succeeded = count(dbname, done_sql)
    finally:
        drop_database(dbname)
    if succeeded != jobs:
        print(f"{peer}: {succeeded} of {jobs} jobs succeeded", file=sys.stderr)
        return 1
    report(peer, jobs, workers, seconds, settings)
    return 0


def parse_counts(argv: Sequence[str], usage: str) -> tuple[int, int]:
    """JOBS [WORKERS] from the command line."""
    if not 1 <= len(argv) <= 2:
        raise SystemExit(usage)
    try:
        jobs = int(argv[0])
        workers = int(argv[1]) if len(argv) > 1 else 1
    except ValueError:
        raise SystemExit(usage) from None
    if jobs < 1 or workers < 1:
        raise SystemExit(usage)
    return jobs, workers
