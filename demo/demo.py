"""The x_jobs demo: `make demo` runs it on a throwaway server.

It declares two jobs, enqueues 10,000 of them in batches (one in fifty fails its first attempt,
to show a retry), runs a worker in this process with a progress bar, then prints the throughput
and where every job ended.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import x_jobs

TOTAL = 10_000
console = Console()
app = x_jobs.App()  # libpq's environment: the throwaway server's PGHOST and friends


class Resize(BaseModel):
    image: int
    width: int


@app.job(name="resize_image", queue="media", max_attempts=3, retry=x_jobs.Retry(base=0.2, max=1))
def resize_image(input: Resize, ctx: x_jobs.JobContext) -> dict[str, int]:
    if input.image % 50 == 0 and ctx.attempt == 1:
        raise ConnectionError(f"image store timed out fetching image {input.image}")
    return {"image": input.image, "width": input.width}


@app.job(name="send_receipt", queue="mail")
def send_receipt(input: dict[str, str]) -> None:
    """A no-op standing in for a mail API call."""


def main() -> None:
    with psycopg.connect(autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS x_jobs")
    console.print(f"[bold]x_jobs demo[/]: enqueueing {TOTAL:,} jobs in batches of 1,000")
    started = time.perf_counter()
    for start in range(0, TOTAL // 2, 1000):
        resize_image.enqueue_many(Resize(image=n, width=640) for n in range(start, start + 1000))
        send_receipt.enqueue_many({"order": str(n)} for n in range(start, start + 1000))
    console.print(f"enqueued in {time.perf_counter() - started:.2f} s")

    try:
        resize_image.enqueue({"image": "not a number", "width": 640})
    except x_jobs.XJobsError as err:
        console.print(f"[yellow]refused at enqueue[/] ({err.code}): {err.message[:90]}...")

    logging.basicConfig(level=logging.WARNING)
    worker = x_jobs.Worker(app, concurrency=100, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    started = time.perf_counter()
    thread.start()
    with (
        psycopg.connect(autocommit=True) as conn,
        Progress(
            TextColumn("[bold]draining"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        bar = progress.add_task("jobs", total=TOTAL)
        while True:
            row = conn.execute(
                "SELECT count(*) FROM x_jobs.job WHERE state IN ('done', 'dead', 'failed')"
            ).fetchone()
            settled = int(row[0]) if row else 0
            progress.update(bar, completed=settled)
            if settled >= TOTAL:
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - started
        worker.stop()
        thread.join()

        console.print(f"drained {TOTAL:,} jobs in {elapsed:.2f} s: {TOTAL / elapsed:,.0f} jobs/s")
        table = Table("job", "state", "jobs", "attempts", title="Where every job ended")
        for name, state, jobs, attempts in conn.execute(
            "SELECT name, state::text, count(*), sum(attempt) FROM x_jobs.job"
            " GROUP BY 1, 2 ORDER BY 1, 2"
        ):
            table.add_row(name, state, f"{jobs:,}", f"{attempts:,}")
        console.print(table)
        row = conn.execute("SELECT sum(completed), sum(retried) FROM x_jobs.counter").fetchone()
        assert row is not None
        console.print(f"counters: {row[0]:,} completed, {row[1]:,} retried (x_jobs.counter)")


if __name__ == "__main__":
    main()
