"""x_jobs: a durable job queue inside PostgreSQL, and its thin Python client.

import x_jobs

app = x_jobs.App()                      # DATABASE_URL, or libpq's PG* environment

@app.job(name="send_email", queue="mail", max_attempts=5)
def send_email(input: Email, ctx: x_jobs.JobContext) -> dict[str, str]: ...

@app.job(name="digest", schedule=x_jobs.Cron("0 9 * * MON-FRI", tz="Europe/Berlin"))
def digest(input: dict[str, str], ctx: x_jobs.JobContext) -> None: ...  # ctx.schedule.at

send_email.enqueue(Email(to="ada@example.com"))
x_jobs.Worker(app).run()                # or: x-jobs worker myapp.jobs:app
"""

from __future__ import annotations

from x_jobs.app import App
from x_jobs.context import AsyncJobContext, CancelEvent, JobContext, Scheduled
from x_jobs.errors import (
    CronInvalid,
    CrossTenantReasonMissing,
    CursorInvalid,
    DeliveryError,
    JobCancelled,
    JobFailed,
    JobTenantMissing,
    PermanentError,
    PermissionDenied,
    PositionInvalid,
    QueuePolicyInvalid,
    RateLimitConflict,
    RateLimitInvalid,
    RateLimitUnknown,
    ResultTimeout,
    ScheduleInvalid,
    ScheduleNotFound,
    StepTimeout,
    StreamInvalid,
    TenantScopeConflict,
    TimeZoneInvalid,
    XJobsError,
    translate,
)
from x_jobs.jobs import Concurrency, Enqueued, Job, RateLimit, Retry
from x_jobs.queues import QueuePolicy
from x_jobs.schedules import Cron, Schedule
from x_jobs.sinks import OutboxMessage
from x_jobs.steps import AsyncSteps, Steps
from x_jobs.tenants import TenantBinding, cross_tenant
from x_jobs.worker import Worker

__all__ = [
    "App",
    "AsyncJobContext",
    "AsyncSteps",
    "CancelEvent",
    "Concurrency",
    "Cron",
    "CronInvalid",
    "CrossTenantReasonMissing",
    "CursorInvalid",
    "DeliveryError",
    "Enqueued",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobTenantMissing",
    "OutboxMessage",
    "PermanentError",
    "PermissionDenied",
    "PositionInvalid",
    "QueuePolicy",
    "QueuePolicyInvalid",
    "RateLimit",
    "RateLimitConflict",
    "RateLimitInvalid",
    "RateLimitUnknown",
    "ResultTimeout",
    "Retry",
    "Schedule",
    "ScheduleInvalid",
    "ScheduleNotFound",
    "Scheduled",
    "StepTimeout",
    "Steps",
    "StreamInvalid",
    "TenantBinding",
    "TenantScopeConflict",
    "TimeZoneInvalid",
    "Worker",
    "XJobsError",
    "cross_tenant",
    "translate",
]
__version__ = "0.4.2"
