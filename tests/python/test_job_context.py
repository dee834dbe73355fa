"""``ctx.cancelled`` as a handler reads it, under a real Worker: ``if ctx.cancelled:`` is false
while the job may run on and true once it must stop (cancelled, timed out), in sync and async
handlers alike. It was a plain threading.Event, always true, so a handler written that way
failed every attempt."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from conftest import Conn, serving, wait_for

import x_jobs

logger = logging.getLogger(__name__)

#: How long a test waits for what a sound worker does in well under a second.
SETTLE_SECONDS = 15.0


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_that_stops_if_ctx_cancelled_completes_when_nobody_stops_it(
    dsn: str, kind: str
) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="careful", queue="careful", max_attempts=1)
    def careful(input: dict[str, int], ctx: x_jobs.JobContext) -> dict[str, Any]:
        for turn in range(input["turns"]):
            if ctx.cancelled:
                raise RuntimeError(f"told to stop at turn {turn}")
        return {"turns": input["turns"], "set": ctx.cancelled.is_set()}

    @app.job(name="careful_async", queue="careful", max_attempts=1)
    async def careful_async(input: dict[str, int], ctx: x_jobs.AsyncJobContext) -> dict[str, Any]:
        for turn in range(input["turns"]):
            if ctx.cancelled:
                raise RuntimeError(f"told to stop at turn {turn}")
            await asyncio.sleep(0)
        return {"turns": input["turns"], "set": ctx.cancelled.is_set()}

    job = careful if kind == "sync" else careful_async
    job_id = app.enqueue(job, {"turns": 50}).id
    with serving(app):
        assert app.result(job_id, timeout=SETTLE_SECONDS) == {"turns": 50, "set": False}


def test_if_ctx_cancelled_turns_true_once_the_job_is_cancelled_or_timed_out(
    dsn: str, conn: Conn
) -> None:
    app = x_jobs.App(dsn)
    started: set[int] = set()
    #: job id -> (ctx.reason, bool(ctx.cancelled)) when the handler saw the stop.
    seen: dict[int, tuple[str | None, bool]] = {}

    def loop_until_told(ctx: x_jobs.JobContext) -> None:
        started.add(ctx.id)
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            if ctx.cancelled:
                seen[ctx.id] = (ctx.reason, ctx.cancelled.is_set())
                raise RuntimeError("told to stop")
            ctx.cancelled.wait(0.01)  # the Event's own wait still works

    @app.job(name="looping", queue="careful", max_attempts=1)
    def looping(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
        loop_until_told(ctx)

    @app.job(name="looping_timeout", queue="careful", max_attempts=1, timeout=0.3)
    def looping_timeout(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
        loop_until_told(ctx)

    @app.job(name="awaiting", queue="careful", max_attempts=1)
    async def awaiting(input: dict[str, Any], ctx: x_jobs.AsyncJobContext) -> None:
        started.add(ctx.id)
        try:
            await asyncio.sleep(SETTLE_SECONDS)
        except asyncio.CancelledError:
            seen[ctx.id] = (ctx.reason, bool(ctx.cancelled))
            raise

    cancelled = looping.enqueue({}).id
    timed_out = looping_timeout.enqueue({}).id
    awaited = awaiting.enqueue({}).id
    with serving(app):
        wait_for(lambda: {cancelled, awaited} <= started, "the handlers to start")
        # Running, and nobody has told them anything yet.
        assert cancelled not in seen and awaited not in seen
        for job_id in (cancelled, awaited):
            assert conn.execute("SELECT x_jobs.cancel(%s)", [job_id]).fetchone() == (True,)
        wait_for(lambda: len(seen) == 3, "each handler to see its stop", timeout=SETTLE_SECONDS)

    # A cancel is seen as "cancelled", or as "lost" when the heartbeat finds the row gone first.
    assert seen[cancelled] in {("cancelled", True), ("lost", True)}, seen
    assert seen[awaited] in {("cancelled", True), ("lost", True)}, seen
    assert seen[timed_out] == ("timeout", True)
    rows = conn.execute(
        "SELECT id, state::text, last_error FROM x_jobs.job WHERE id = ANY (%s) ORDER BY id",
        [[cancelled, timed_out, awaited]],
    ).fetchall()
    assert rows == [
        (cancelled, "cancelled", None),
        (timed_out, "dead", "timed out after 0.3 s"),
        (awaited, "cancelled", None),
    ]
