"""The app the worker process tests run: ``python -m x_jobs worker apps.basic:app``.

Every handler records its run in the test database's ``run_log`` table (``SCHEMA`` below; the
tests create it): one row per run, written when the body starts and updated when it ends, with
the job id, the attempt, the worker's pid and id, the database's clock at both ends, and what the
body saw (``outcome``). The body's work lies between those two writes, so two rows of one job
whose intervals overlap are two runs of the job at once.

Handlers write over a connection of their own, one per thread, never the worker's, and ride out
a server restart by reconnecting: a recording is idempotent (keyed by a random run id), so
sending it again after a lost answer does no harm.

``gated`` jobs run until the test opens their gate (a row of ``gate``) or the worker tells them
to stop: they stand for a long job whose end the test decides, without a sleep to guess.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, LiteralString

import psycopg
from pydantic import BaseModel

import x_jobs

logger = logging.getLogger(__name__)

app = x_jobs.App()

#: What the tests create in their database before a worker starts.
SCHEMA: LiteralString = """
    CREATE TABLE public.run_log (
        run uuid PRIMARY KEY,
        job_id bigint NOT NULL,
        job text NOT NULL,
        attempt integer NOT NULL,
        pid integer NOT NULL,
        worker text NOT NULL,
        started timestamptz NOT NULL,
        finished timestamptz,
        outcome text
    );
    CREATE TABLE public.gate (name text PRIMARY KEY, open boolean NOT NULL);
    CREATE TABLE public.worker_exit (pid integer PRIMARY KEY, exited timestamptz NOT NULL);
"""

START: LiteralString = """
    WITH started AS (
        INSERT INTO public.run_log (run, job_id, job, attempt, pid, worker, started)
        VALUES (%s, %s, %s, %s, %s, %s, pg_catalog.clock_timestamp())
        ON CONFLICT (run) DO NOTHING
    )
    SELECT count(*) FROM public.run_log WHERE job_id = %s AND run <> %s
"""
FINISH: LiteralString = """
    UPDATE public.run_log SET finished = pg_catalog.clock_timestamp(), outcome = %s
    WHERE run = %s AND finished IS NULL
"""
GATE_OPEN: LiteralString = "SELECT open FROM public.gate WHERE name = %s"

#: How long a recording keeps trying while the database is away.
RECORD_DEADLINE_SECONDS = 60.0
#: How long a gated job waits for its gate before it gives up (a test that forgot to open it).
GATE_DEADLINE_SECONDS = 120.0

#: Where the recordings go when the worker's own way to the database is not theirs (a test
#: that cuts the worker's network): Fleet.start(via=...) sets it.
RECORD_DSN = os.environ.get("X_JOBS_TEST_RECORD_DSN", "")

_local = threading.local()


def _db(query: LiteralString, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run one statement over this thread's own connection, reconnecting while the server is
    away (a restart), until RECORD_DEADLINE_SECONDS have passed."""
    deadline = time.monotonic() + RECORD_DEADLINE_SECONDS
    while True:
        conn: psycopg.Connection[tuple[Any, ...]] | None = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(
                    RECORD_DSN or app.dsn, autocommit=True, application_name="run_log"
                )
                _local.conn = conn
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Run:
    """One run of a handler, recorded in run_log when the body starts and when it ends."""

    def __init__(self, ctx: x_jobs.JobContext) -> None:
        self.ctx = ctx
        self.id = uuid.uuid4()
        #: What the body saw; set by the body when it stops early, else "returned"/"raised:...".
        self.outcome: str | None = None
        #: How many runs of this job were recorded before this one.
        self.earlier = 0

    def __enter__(self) -> Run:
        ctx = self.ctx
        rows = _db(
            START,
            [self.id, ctx.id, ctx.name, ctx.attempt, os.getpid(), ctx.worker, ctx.id, self.id],
        )
        self.earlier = int(rows[0][0])
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outcome = self.outcome
        if outcome is None:
            outcome = "returned" if exc_type is None else f"raised:{exc_type.__name__}"
        _db(FINISH, [outcome, self.id])

    def stopped(self) -> bool:
        """True (and the outcome noted) once the worker told the body to stop."""
        if self.ctx.is_cancelled():
            self.outcome = f"cancelled:{self.ctx.reason}"
            return True
        return False


class Sleep(BaseModel):
    seconds: float = 0.0


class Gate(BaseModel):
    gate: str = "gate"


class HandlerBoom(Exception):
    """What the raising handlers raise."""


def _sleep(run: Run, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not run.stopped():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.01))


def _wait_for_gate(run: Run, gate: str, *, heed_stop: bool = True) -> None:
    deadline = time.monotonic() + GATE_DEADLINE_SECONDS
    while not (heed_stop and run.stopped()):
        rows = _db(GATE_OPEN, [gate])
        if rows and rows[0][0]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate!r} never opened")
        time.sleep(0.02)


@app.job(name="noop")
def noop(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        pass


@app.job(name="sleep")
def sleep(input: Sleep, ctx: x_jobs.JobContext) -> None:
    with Run(ctx) as run:
        _sleep(run, input.seconds)


@app.job(name="gated")
def gated(input: Gate, ctx: x_jobs.JobContext) -> None:
    with Run(ctx) as run:
        _wait_for_gate(run, input.gate)


@app.job(name="gated_timeout", timeout=0.5)
def gated_timeout(input: Gate, ctx: x_jobs.JobContext) -> None:
    with Run(ctx) as run:
        _wait_for_gate(run, input.gate)


@app.job(
    name="stubborn_timeout",
    timeout=2.0,
    max_attempts=3,
    retry=x_jobs.Retry(base=0.05, max=0.05),
)
def stubborn_timeout(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Attempt 1 ignores the worker's stop and runs until gate "first" opens, so it outlives
    its timeout; later attempts wait for gate "later" and stop when told."""
    with Run(ctx) as run:
        if ctx.attempt == 1:
            _wait_for_gate(run, "first", heed_stop=False)
        else:
            _wait_for_gate(run, "later")


async def _async_sleep(input: Sleep, ctx: x_jobs.JobContext) -> None:
    # The recordings block the event loop for a round trip: harmless in a test app.
    with Run(ctx) as run:
        try:
            await asyncio.sleep(input.seconds)
        except asyncio.CancelledError:
            run.outcome = f"async-cancelled:{ctx.reason}"
            raise


@app.job(name="async_sleep")
async def async_sleep(input: Sleep, ctx: x_jobs.JobContext) -> None:
    await _async_sleep(input, ctx)


@app.job(name="async_sleep_timeout", timeout=0.5)
async def async_sleep_timeout(input: Sleep, ctx: x_jobs.JobContext) -> None:
    await _async_sleep(input, ctx)


@app.job(name="async_thread_sleep")
async def async_thread_sleep(input: Sleep, ctx: x_jobs.JobContext) -> None:
    """Sleeps in a thread of the event loop's executor (asyncio.to_thread), heeding a stop."""
    with Run(ctx) as run:
        await asyncio.to_thread(_sleep, run, input.seconds)


@app.job(name="async_thread_gated")
async def async_thread_gated(input: Gate, ctx: x_jobs.JobContext) -> None:
    """Waits for its gate in a thread of the event loop's executor, and heeds no stop: a
    blocking call an async handler awaits, which the worker cannot end."""
    with Run(ctx) as run:
        await asyncio.to_thread(_wait_for_gate, run, input.gate, heed_stop=False)


@app.job(name="always_raises", max_attempts=3, retry=x_jobs.Retry(base=0.2, max=1.0))
def always_raises(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        raise HandlerBoom(f"boom on attempt {ctx.attempt}")


@app.job(
    name="always_raises_no_dead_letter",
    max_attempts=3,
    retry=x_jobs.Retry(base=0.05, max=1.0, dead_letter=False),
)
def always_raises_no_dead_letter(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        raise HandlerBoom(f"boom on attempt {ctx.attempt}")


@app.job(name="noop_unkept", keep_done=False)
def noop_unkept(input: dict[str, Any], ctx: x_jobs.JobContext) -> dict[str, Any]:
    with Run(ctx):
        return {"unread": True}


@app.job(
    name="flaky_unkept", keep_done=False, max_attempts=3, retry=x_jobs.Retry(base=0.05, max=0.05)
)
def flaky_unkept(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails its first attempt, so that its row has an error history when it completes."""
    with Run(ctx):
        if ctx.attempt == 1:
            raise HandlerBoom("boom on attempt 1")


@app.job(name="big_output", max_attempts=1)
def big_output(input: dict[str, Any], ctx: x_jobs.JobContext) -> dict[str, str]:
    """An output over x_jobs.max_payload_bytes when a test lowers it to 1,000."""
    return {"pad": "x" * 5000}


@app.job(name="nul_error", max_attempts=1)
def nul_error(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails with a message PostgreSQL cannot store as it is (a NUL byte)."""
    raise ValueError("upstream said \x00 and stopped")


@app.job(name="quoted_error", max_attempts=1)
def quoted_error(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails with a message holding spaces, quotes and an equals sign: a log line's field value
    that must be quoted to stay parseable."""
    raise ValueError('upstream said "no" = refused')
