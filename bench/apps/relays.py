"""The outbox benchmark's app: topic bench.hook goes to a webhook (X_JOBS_BENCH_URL), topic
bench.job becomes a job, bench.noop goes nowhere (the relay's own cost)."""

from __future__ import annotations

import os
from typing import Any

import x_jobs

app = x_jobs.App()


@app.job(name="from_outbox", queue="bench-outbox")
def from_outbox(input: dict[str, Any]) -> None:
    """Never run: the benchmark counts the jobs the relay enqueued."""


app.outbox.webhook(
    "bench.hook",
    os.environ.get("X_JOBS_BENCH_URL", "http://127.0.0.1:9/"),
    secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    max_concurrent=32,
)
app.outbox.to_job("bench.job", from_outbox)


@app.outbox.sink("bench.noop")
def noop(message: x_jobs.OutboxMessage) -> None:
    """Delivers nowhere: the relay's own cost (claim, hand-off, ack)."""
