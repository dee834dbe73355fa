"""The rows of jobs and steps that more than one command group reads (``jobs show`` and
``steps resolve``, ``jobs retry|cancel`` and ``steps resolve``), with the columns they read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobRow:
    """A job as the operator reads it (x_jobs.job_detail, ``JOB_COLUMNS``)."""

    id: int
    name: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: datetime
    visible_at: datetime | None
    claimed_by: str | None
    tenant_id: str
    idempotency_key: str | None
    concurrency_key: str | None
    concurrency_limit: int | None
    dead_letter: bool
    keep_done: bool
    backoff_base: timedelta
    backoff_max: timedelta
    claims: int
    run_id: str
    traceparent: str | None
    enqueued_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    input: Any
    output: Any
    progress: Any
    last_error: str | None
    last_error_stack: str | None


@dataclass(frozen=True)
class StepRow:
    """A step a run reached (x_jobs.job_steps, ``STEP_COLUMNS``)."""

    job_id: int
    name: str
    compensation: bool
    kind: str
    created_at: datetime
    event: str | None
    event_key: str | None
    match: Any
    since: datetime | None
    timeout_at: datetime | None
    status: str
    attempt: int
    output: Any
    error: str | None
    event_id: int | None
    resolved_by: str | None
    resolved_at: datetime | None


JOB_COLUMNS: LiteralString = """
    id, name, queue, state::text AS state, attempt, max_attempts, priority, run_at, visible_at,
    claimed_by, tenant_id, idempotency_key, concurrency_key, concurrency_limit, dead_letter,
    keep_done, backoff_base, backoff_max, claims, run_id::text AS run_id, traceparent, enqueued_by,
    created_at, started_at, finished_at, updated_at, input, output, progress, last_error,
    last_error_stack
"""

STEP_COLUMNS: LiteralString = """
    job_id, name, compensation, kind, created_at, event, event_key, match, since, timeout_at,
    status::text AS status, attempt, output, error, event_id, resolved_by, resolved_at
"""

JOB_STATE: LiteralString = "SELECT state FROM x_jobs.result(id => %(id)s)"
