"""x_jobs: a durable job queue inside PostgreSQL, and its thin Python client.

import x_jobs

app = x_jobs.App()                      # DATABASE_URL, or libpq's PG* environment

@app.job(name="send_email", queue="mail", max_attempts=5)
def send_email(input: Email, ctx: x_jobs.JobContext) -> dict[str, str]: ...

send_email.enqueue(Email(to="ada@example.com"))
x_jobs.Worker(app).run()                # or: x-jobs worker myapp.jobs:app
"""

from __future__ import annotations

from x_jobs.app import App, Concurrency, Enqueued, Job, Retry
from x_jobs.errors import JobFailed, PermissionDenied, ResultTimeout, XJobsError, translate
from x_jobs.outbox import DeliveryError, OutboxMessage
from x_jobs.steps import AsyncSteps, Steps, StepTimeout
from x_jobs.worker import (
    AsyncJobContext,
    CancelEvent,
    JobCancelled,
    JobContext,
    PermanentError,
    Worker,
)

__all__ = [
    "App",
    "AsyncJobContext",
    "AsyncSteps",
    "CancelEvent",
    "Concurrency",
    "DeliveryError",
    "Enqueued",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "OutboxMessage",
    "PermanentError",
    "PermissionDenied",
    "ResultTimeout",
    "Retry",
    "StepTimeout",
    "Steps",
    "Worker",
    "XJobsError",
    "translate",
]
__version__ = "0.4.1"
