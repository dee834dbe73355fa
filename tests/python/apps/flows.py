"""Workflows for the step tests: ``python -m x_jobs worker apps.flows:app``.

Every side effect a step body has is a row of ``public.effect`` (``SCHEMA``), written over a
connection of the body's own, outside the step's bookkeeping: a step that ran twice shows as
two rows. The tests read the rows to tell what ran, how often and in which order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, LiteralString

import psycopg
from pydantic import BaseModel

import x_jobs

app = x_jobs.App()

SCHEMA: LiteralString = """
    CREATE TABLE public.effect (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job_id bigint NOT NULL,
        what text NOT NULL,
        attempt integer NOT NULL
    )
"""

_local = threading.local()


def effect(ctx: x_jobs.JobContext, what: str) -> None:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(app.dsn, autocommit=True, application_name="effects")
        _local.conn = conn
    conn.execute(
        "INSERT INTO public.effect (job_id, what, attempt) VALUES (%s, %s, %s)",
        [ctx.id, what, ctx.attempt],
    )


class Boom(Exception):
    """What a failing step raises."""


class Keyed(BaseModel):
    key: str
    timeout: float | None = None


class Nap(BaseModel):
    seconds: float


class Saga(BaseModel):
    bad_undo: bool = False


@app.job(name="three_steps", max_attempts=3, retry=x_jobs.Retry(base=0.05, max=0.05))
def three_steps(input: dict[str, Any], ctx: x_jobs.JobContext) -> dict[str, int]:
    """Three steps; the first attempt stops for good after step two (the test kills it there)."""

    def one() -> int:
        effect(ctx, "one")
        return 1

    def two() -> int:
        effect(ctx, "two")
        return int(a) + 1

    a = ctx.step.run("one", one)
    b = ctx.step.run("two", two)
    if ctx.attempt == 1:
        effect(ctx, "parked")
        time.sleep(600)

    def three() -> int:
        effect(ctx, "three")
        return int(b) + 1

    c = ctx.step.run("three", three)
    return {"a": a, "b": b, "c": c}


@app.job(name="await_approval")
def await_approval(input: Keyed, ctx: x_jobs.JobContext) -> Any:
    ctx.step.run("before", lambda: effect(ctx, "before"))
    try:
        payload = ctx.step.wait_for_event(
            "approval", "approved", key=input.key, timeout=input.timeout
        )
    except x_jobs.StepTimeout as err:
        effect(ctx, "timed out")
        return {"timed_out": str(err)}
    effect(ctx, "after")
    return payload


@app.job(name="await_since_run")
def await_since_run(input: Keyed, ctx: x_jobs.JobContext) -> Any:
    """Waits for an event that may have been published before the run reached its wait."""
    return ctx.step.wait_for_event("approval", "approved", key=input.key, since="run")


@app.job(name="napper", max_attempts=1)
def napper(input: Nap, ctx: x_jobs.JobContext) -> dict[str, int]:
    ctx.step.run("before", lambda: effect(ctx, "before"))
    ctx.step.sleep("nap", input.seconds)
    effect(ctx, "after")
    return {"attempt": ctx.attempt}


@app.job(name="saga", max_attempts=2, retry=x_jobs.Retry(base=0.05, max=0.05))
def saga(input: Saga, ctx: x_jobs.JobContext) -> None:
    def undo_two(output: Any) -> None:
        effect(ctx, f"undo two {output}")
        if input.bad_undo:
            raise Boom("the refund service is down")

    def fail_three() -> None:
        effect(ctx, "three")
        raise Boom("step three failed")

    def one() -> str:
        effect(ctx, "one")
        return "r1"

    def two() -> str:
        effect(ctx, "two")
        return "r2"

    ctx.step.run("one", one, compensate=lambda out: effect(ctx, f"undo one {out}"))
    ctx.step.run("two", two, compensate=undo_two)
    ctx.step.run("three", fail_three, compensate=lambda out: effect(ctx, "undo three"))


class Booking(BaseModel):
    #: How long the body blocks after its step, ignoring the stop, before it looks at it.
    deaf_for: float = 0.0


def _book(ctx: x_jobs.JobContext) -> str:
    effect(ctx, "book")
    return "b1"


@app.job(name="slow_saga", max_attempts=1, timeout=0.5)
def slow_saga(input: Booking, ctx: x_jobs.JobContext) -> None:
    """Books, then blocks past its timeout (as a slow call would) until told to stop."""
    ctx.step.run("book", lambda: _book(ctx), compensate=lambda out: effect(ctx, f"unbook {out}"))
    time.sleep(input.deaf_for)
    ctx.cancelled.wait(30)
    effect(ctx, f"stopped: {ctx.reason}")


@app.job(name="slow_async_saga", max_attempts=1, timeout=0.5)
async def slow_async_saga(input: Booking, ctx: x_jobs.AsyncJobContext) -> None:
    async def unbook(out: Any) -> None:
        effect(ctx, f"unbook {out}")

    await ctx.step.run("book", lambda: _book(ctx), compensate=unbook)
    await asyncio.sleep(30)


@app.job(name="cancelled_saga", max_attempts=1)
def cancelled_saga(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Books, then goes on once an operator cancelled it, seen in its row before the worker's
    heartbeat tells it: its next step finds the job no longer held."""
    ctx.step.run("book", lambda: _book(ctx), compensate=lambda out: effect(ctx, f"unbook {out}"))
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        query: LiteralString = "SELECT state::text FROM x_jobs.job WHERE id = %s"
        # Bounded, so that a test that failed before its cancel does not leave this spinning.
        deadline = time.monotonic() + 60
        while conn.execute(query, [ctx.id]).fetchone() != ("cancelled",):
            if time.monotonic() > deadline:
                raise TimeoutError("nobody cancelled the job")
            time.sleep(0.01)
    ctx.step.sleep("nap", 60)


@app.job(name="reporter")
def reporter(input: dict[str, Any], ctx: x_jobs.JobContext) -> bool:
    return ctx.progress(3, 10, "three of ten")


@app.job(name="async_flow")
async def async_flow(input: Keyed, ctx: x_jobs.AsyncJobContext) -> dict[str, Any]:
    async def one() -> int:
        effect(ctx, "one")
        return 1

    a = await ctx.step.run("one", one)
    payload = await ctx.step.wait_for_event("go", "go", key=input.key)
    effect(ctx, "after")
    return {"a": a, "payload": payload}


@app.job(name="bad_step", max_attempts=1)
def bad_step(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """A step whose output is not JSON: refused before anything is recorded."""
    ctx.step.run("ids", lambda: {1, 2, 3})


class Unstorable(BaseModel):
    kind: str


@app.job(name="unstorable_step", max_attempts=1)
def unstorable_step(input: Unstorable, ctx: x_jobs.JobContext) -> None:
    """A step whose output Python's json takes and PostgreSQL's jsonb does not."""
    value: Any = float("nan") if input.kind == "nan" else {"note": "a\x00b"}
    ctx.step.run("measure", lambda: value)


@app.job(name="cancelled_while_undoing", max_attempts=1)
def cancelled_while_undoing(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails for good after a booking; an operator cancels the job while its compensation runs,
    so recording the compensation finds the job no longer held (JobNotHeld)."""

    def unbook(out: Any) -> None:
        effect(ctx, f"unbook {out}")
        with psycopg.connect(app.dsn, autocommit=True) as conn:
            conn.execute("SELECT x_jobs.cancel(id => %s)", [ctx.id])

    ctx.step.run("book", lambda: _book(ctx), compensate=unbook)
    raise Boom("declined")


@app.job(
    name="declined_slowly", max_attempts=3, timeout=0.5, retry=x_jobs.Retry(base=0.05, max=0.05)
)
def declined_slowly(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails for good (PermanentError) with attempts left; its compensation outlasts the job's
    timeout. The failure, not a timeout, must settle it: dead, never retried undone."""

    def unbook(out: Any) -> None:
        time.sleep(1.5)
        effect(ctx, f"unbook {out}")

    ctx.step.run("book", lambda: _book(ctx), compensate=unbook)
    raise x_jobs.PermanentError("card declined for good")
