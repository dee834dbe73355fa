"""Drain a backlog of no-op jobs with procrastinate's own worker, timed.

  bench/peers/.venv/bin/python bench/peers/run_procrastinate.py JOBS [WORKERS]

Creates the database x_jobs_peer_procrastinate (dropped at the end), installs procrastinate's
schema with its own API (SchemaManager.apply_schema_async), enqueues JOBS jobs with
Task.batch_defer_async (10,000 a call; not timed), then times WORKERS processes, each running
App.run_worker_async() with every worker option at its default, until no job of the backlog is
'todo' or 'doing' in procrastinate_jobs. Prints one JSON line. See peerlib.py for how the drain
is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from importlib.metadata import version
from pathlib import Path

import peerlib
from procrastinate_app import DBNAME, app, noop

ENQUEUE_CHUNK = 10_000
USAGE = "usage: run_procrastinate.py JOBS [WORKERS]"


async def load(jobs: int) -> None:
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, jobs - start)
            await noop.batch_defer_async(*({"n": i} for i in range(start, start + n)))


async def work() -> None:
    control = peerlib.Control()
    async with app.open_async():
        control.ready()
        await control.go.wait()
        if control.stop.is_set():
            return
        run = asyncio.create_task(app.run_worker_async())
        stop = asyncio.create_task(control.stop.wait())
        await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            # Cancelling run_worker_async is procrastinate's graceful stop.
            run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        stop.cancel()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        asyncio.run(work())
        return 0
    return peerlib.measure(
        "procrastinate",
        DBNAME,
        argv,
        USAGE,
        load=load,
        worker_argv=[sys.executable, str(Path(__file__).resolve()), "--worker"],
        queued_sql="SELECT count(*) FROM procrastinate_jobs",
        remaining_sql="SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        done_sql="SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        settings=(
            f"procrastinate {version('procrastinate')}, App.run_worker_async() per process with "
            "its defaults: concurrency=1, listen_notify=True, fetch_job_polling_interval=5.0, "
            "abort_job_polling_interval=5.0, delete_jobs='never', update_heartbeat_interval=10.0; "
            "PsycopgConnector (psycopg_pool defaults), async no-op task, asyncio loop; "
            f"enqueued with Task.batch_defer_async, {ENQUEUE_CHUNK:,} a call"
        ),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
