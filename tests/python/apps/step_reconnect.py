"""Step jobs that live through a server restart, for tests/python/test_steps_reconnect.py:
``python -m x_jobs worker apps.step_reconnect:app``.

Every step body records what it did as a row of ``public.effect`` (``apps.flows.SCHEMA``), on a
connection opened for that row alone: a connection kept from before a restart would fail the
body itself. Only the connect is tried again (nothing was sent yet), so a body that ran once is
one row. A paused job waits for its gate, a row of ``public.gate`` (``apps.basic.SCHEMA``), read
the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, LiteralString, TypeVar

import psycopg
from pydantic import BaseModel

import x_jobs

app = x_jobs.App()

#: How long a body keeps trying to reach the database for its own rows (a restart takes ~1 s).
DEADLINE_SECONDS = 60.0

EFFECT: LiteralString = "INSERT INTO public.effect (job_id, what, attempt) VALUES (%s, %s, %s)"
GATE_OPEN: LiteralString = "SELECT coalesce(bool_or(open), false) FROM public.gate WHERE name = %s"

T = TypeVar("T")


def _once(use: Callable[[psycopg.Connection[Any]], T]) -> T:
    """``use`` a connection opened for it, trying the connect again while the server is away."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        try:
            conn = psycopg.connect(app.dsn, autocommit=True, application_name="effects")
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        with conn:
            return use(conn)


def effect(ctx: x_jobs.JobContext, what: str) -> None:
    _once(lambda conn: conn.execute(EFFECT, [ctx.id, what, ctx.attempt]))


def _gate_open(gate: str) -> bool:
    """Read over a connection of its own: the server restarts while a job polls its gate."""
    try:
        return _once(lambda conn: bool(conn.execute(GATE_OPEN, [gate]).fetchall()[0][0]))
    except psycopg.OperationalError:
        return False  # the server went away mid-read: ask again


def wait_for_gate(ctx: x_jobs.JobContext, gate: str) -> None:
    deadline = time.monotonic() + 2 * DEADLINE_SECONDS
    while not _gate_open(gate):
        ctx.raise_if_cancelled()
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate!r} never opened")
        time.sleep(0.02)


@app.job(name="one_step", max_attempts=1)
def one_step(input: dict[str, Any], ctx: x_jobs.JobContext) -> Any:
    """The reviewer's r2 job: one step, one attempt."""

    def only() -> str:
        effect(ctx, "only")
        return "ok"

    return ctx.step.run("only", only)


class Paused(BaseModel):
    #: "between": the gate is waited for between steps one and two; "inside": at the end of
    #: step one's body, so that the restart comes between the body and its record.
    where: Literal["between", "inside"]
    gate: str = "resume"


RETRY_AT_ONCE = x_jobs.Retry(base=0.05, max=0.05)


@app.job(name="paused", max_attempts=2, retry=RETRY_AT_ONCE)
def paused(input: Paused, ctx: x_jobs.JobContext) -> dict[str, int]:
    """Two steps, paused at its gate while the test restarts the server. Two attempts: a step
    call that failed on the restart shows as a second attempt that runs a step body again."""

    def one() -> int:
        effect(ctx, "one")
        if input.where == "inside":
            wait_for_gate(ctx, input.gate)
        return 1

    def two() -> int:
        effect(ctx, "two")
        return 2

    a = ctx.step.run("one", one)
    if input.where == "between":
        wait_for_gate(ctx, input.gate)
    b = ctx.step.run("two", two)
    ctx.progress(1, 1, "both steps done")
    return {"a": int(a), "b": int(b), "attempt": ctx.attempt}


@app.job(name="paused_async", max_attempts=2, retry=RETRY_AT_ONCE)
async def paused_async(input: Paused, ctx: x_jobs.AsyncJobContext) -> dict[str, int]:
    """``paused`` "between", in an async handler (its step calls run in threads). The gate and
    the effects block the loop: harmless in a test app."""

    def one() -> int:
        effect(ctx, "one")
        return 1

    def two() -> int:
        effect(ctx, "two")
        return 2

    a = await ctx.step.run("one", one)
    wait_for_gate(ctx, input.gate)
    b = await ctx.step.run("two", two)
    return {"a": int(a), "b": int(b), "attempt": ctx.attempt}
