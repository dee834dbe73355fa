"""The x_jobs demo: `make demo` runs it on a throwaway server.

It declares two jobs, enqueues 10,000 of them in batches (one in fifty fails its first attempt,
to show a retry), runs a worker in this process with a progress bar, then prints the throughput
and how the jobs settled. Then a durable workflow: a run that waits for an approval without
holding a worker, woken by a publish made in the same transaction as an outbox message.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

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


@app.job(name="refund_order", queue="flows")
def refund_order(input: dict[str, int], ctx: x_jobs.JobContext) -> dict[str, Any]:
    """Look the order up, wait for a person to approve, refund: each step runs once per run."""
    order = input["order"]
    found = ctx.step.run("look up", lambda: {"order": order, "amount": 25})
    approval = ctx.step.wait_for_event("approval", "refund.approved", key=str(order))
    ctx.step.run("refund", lambda: {"refunded": found["amount"], "by": approval["by"]})
    return {"order": order, "refunded": found["amount"], "approved_by": approval["by"]}


def workflow(conn: psycopg.Connection[Any]) -> None:
    console.print("\n[bold]a durable workflow[/]: a refund waits for its approval")
    job = refund_order.enqueue({"order": 7})
    state = None
    while state != "suspended":
        time.sleep(0.05)
        row = conn.execute("SELECT state FROM x_jobs.result(id => %s)", [job.id]).fetchone()
        state = row[0] if row else None
    console.print(f"job {job.id} is [cyan]suspended[/] on its wait: no worker holds it")
    with conn.transaction():  # the approving application's own transaction
        conn.execute("""SELECT x_jobs.publish('refund.approved', '{"by": "ada"}', '7')""")
        conn.execute("""SELECT x_jobs.outbox_put('refunds', '{"order": 7}', key => '7')""")
    console.print("published refund.approved (and put an outbox message) in one transaction")
    console.print(f"result: {app.result(job.id, timeout=30)}")
    table = Table("step", "kind", "status", "attempt", title=f"The steps of job {job.id}")
    for name, kind, status, attempt in conn.execute(
        "SELECT name, kind, status, attempt FROM x_jobs.job_steps(id => %s)",
        [job.id],
    ):
        table.add_row(name, kind, status, str(attempt))
    console.print(table)


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
            # Every job is enqueued before the worker starts: what is no longer live settled.
            row = conn.execute(
                "SELECT coalesce(sum(ready + delayed + suspended + running), 0)"
                " FROM x_jobs.queue_stats() WHERE queue IN ('media', 'mail')"
            ).fetchone()
            settled = TOTAL - (int(row[0]) if row else 0)
            progress.update(bar, completed=settled)
            if settled >= TOTAL:
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - started

        console.print(f"drained {TOTAL:,} jobs in {elapsed:.2f} s: {TOTAL / elapsed:,.0f} jobs/s")
        table = Table("job", "completed", "retried", "failed", "dead", title="How the jobs settled")
        for name, completed, retried, failed, dead in conn.execute(
            "SELECT job, completed, retried, failed, dead FROM x_jobs.job_counters()"
        ):
            table.add_row(name, f"{completed:,}", f"{retried:,}", f"{failed:,}", f"{dead:,}")
        console.print(table)

    with psycopg.connect(autocommit=True) as conn:
        workflow(conn)
    worker.stop()
    thread.join()


if __name__ == "__main__":
    main()
