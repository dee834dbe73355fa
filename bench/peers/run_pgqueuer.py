"""Drain a backlog of no-op jobs with pgqueuer's own worker (QueueManager), timed.

  bench/peers/.venv/bin/python bench/peers/run_pgqueuer.py JOBS [WORKERS]

Creates the database x_jobs_peer_pgqueuer (dropped at the end), installs pgqueuer's schema with
its own API (Queries.install, durability "durable": every table logged), enqueues JOBS jobs with
the batch form of Queries.enqueue (lists of entrypoints, payloads and priorities, 10,000 a call;
not timed), then times WORKERS processes, each a QueueManager on one asyncpg connection running
QueueManager.run(batch_size=100) under uvloop (as `pgq run` does), until pgqueuer's queue table
is empty (a finished job is deleted from it and logged to pgqueuer_log, in batches). Prints one
JSON line. See peerlib.py for how the drain is timed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version
from pathlib import Path

import asyncpg
import peerlib
import uvloop
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

DBNAME = "x_jobs_peer_pgqueuer"
ENTRYPOINT = "noop"
BATCH_SIZE = 100
ENQUEUE_CHUNK = 10_000
USAGE = "usage: run_pgqueuer.py JOBS [WORKERS]"


async def load(jobs: int) -> None:
    conn = await asyncpg.connect(database=DBNAME)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for start in range(0, jobs, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue(
                [ENTRYPOINT] * n,
                [json.dumps({"n": i}).encode() for i in range(start, start + n)],
                [0] * n,
            )
    finally:
        await conn.close()


async def work() -> None:
    control = peerlib.Control()
    conn = await asyncpg.connect(database=DBNAME)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    control.ready()
    await control.go.wait()
    if control.stop.is_set():
        await conn.close()
        return
    run = asyncio.create_task(qm.run(batch_size=BATCH_SIZE))
    stop = asyncio.create_task(control.stop.wait())
    await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
    qm.shutdown.set()
    await run
    stop.cancel()
    if not conn.is_closed():
        await conn.close()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        uvloop.run(work())
        return 0
    return peerlib.measure(
        "pgqueuer",
        DBNAME,
        argv,
        USAGE,
        load=load,
        worker_argv=[sys.executable, str(Path(__file__).resolve()), "--worker"],
        queued_sql="SELECT count(*) FROM pgqueuer",
        remaining_sql="SELECT count(*) FROM pgqueuer",
        done_sql="SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
        settings=(
            f"pgqueuer {version('pgqueuer')}, "
            f"QueueManager.run(batch_size={BATCH_SIZE}) per process, "
            "other run() options at their defaults, one asyncpg connection (AsyncpgDriver), "
            "uvloop, async no-op entrypoint (concurrency_limit 0 = unlimited), "
            "durability=durable (default); "
            f"enqueued with Queries.enqueue lists of {ENQUEUE_CHUNK:,}"
        ),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
