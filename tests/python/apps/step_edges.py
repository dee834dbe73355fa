"""Step edge cases for tests/python/test_workflows.py: ``python -m x_jobs worker
apps.step_edges:app``.

Side effects are rows of ``public.effect``, written by ``apps.flows.effect`` (the fleet fixture
creates the table): an ``async def`` given to a sync handler's steps, an event wait on an int
key, and a final attempt that fails before it reaches the steps an earlier one completed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

import x_jobs
from apps.flows import effect

app = x_jobs.App()

FAST_RETRY = x_jobs.Retry(base=0.05, max=0.05)


class AsyncInSync(BaseModel):
    #: "step" or "undo": which function is an ``async def``.
    which: str
    #: True: passed as such (refused when declared); False: called by a sync lambda, which
    #: returns its coroutine.
    declared: bool


@app.job(name="async_in_sync", max_attempts=1)
def async_in_sync(input: AsyncInSync, ctx: x_jobs.JobContext) -> None:
    """A sync handler handed an ``async def`` as a step or as a compensation, then failing for
    good: nothing may take the coroutine for the work done."""

    async def charge() -> str:
        await asyncio.sleep(0)
        effect(ctx, "charge")
        return "ch_1"

    async def refund(charged: Any) -> None:
        await asyncio.sleep(0)
        effect(ctx, f"refund {charged}")

    def sync_charge() -> str:
        effect(ctx, "charge")
        return "ch_1"

    # The lambdas are the point: sync functions that return a coroutine.
    if input.which == "step":
        ctx.step.run("charge", charge if input.declared else lambda: charge())  # noqa: PLW0108
    else:
        undo = refund if input.declared else lambda c: refund(c)  # noqa: PLW0108
        ctx.step.run("charge", sync_charge, compensate=undo)
    raise x_jobs.PermanentError("out of stock")


class IntKey(BaseModel):
    key: int


@app.job(name="int_key", max_attempts=1)
def int_key(input: IntKey, ctx: x_jobs.JobContext) -> Any:
    return ctx.step.wait_for_event("paid", "order.paid", key=input.key, timeout=60)


@app.job(name="async_int_key", max_attempts=1)
async def async_int_key(input: IntKey, ctx: x_jobs.AsyncJobContext) -> Any:
    return await ctx.step.wait_for_event("paid", "order.paid", key=input.key, timeout=60)


class Unreached(BaseModel):
    #: True: the final attempt fails before its first step; False: after "reserve".
    before_any: bool


def _config(ctx: x_jobs.JobContext) -> None:
    """A plain call outside any step (say a config fetch) that fails on the final attempt."""
    if ctx.attempt == ctx.max_attempts:
        raise ConnectionError("config service down")


def _done(ctx: x_jobs.JobContext, what: str, output: str) -> str:
    effect(ctx, what)
    return output


def _ship(ctx: x_jobs.JobContext) -> None:
    effect(ctx, "ship")
    raise RuntimeError("carrier timeout")


@app.job(name="unreached", max_attempts=2, retry=FAST_RETRY)
def unreached(input: Unreached, ctx: x_jobs.JobContext) -> None:
    """Attempt 1 reserves and charges, then fails at ship; the final attempt fails at _config,
    before the steps that come after it."""
    if input.before_any:
        _config(ctx)
    ctx.step.run(
        "reserve",
        lambda: _done(ctx, "reserve", "r1"),
        compensate=lambda out: effect(ctx, f"unreserve {out}"),
    )
    if not input.before_any:
        _config(ctx)
    ctx.step.run(
        "charge",
        lambda: _done(ctx, "charge", "ch_1"),
        compensate=lambda out: effect(ctx, f"refund {out}"),
    )
    ctx.step.run("ship", lambda: _ship(ctx))


@app.job(name="unreached_timeout", max_attempts=2, retry=FAST_RETRY, timeout=0.5)
def unreached_timeout(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Attempt 1 reserves and charges, then fails at ship; the final attempt times out before
    its first step."""
    if ctx.attempt > 1:
        ctx.cancelled.wait(30)
        return
    ctx.step.run(
        "reserve",
        lambda: _done(ctx, "reserve", "r1"),
        compensate=lambda out: effect(ctx, f"unreserve {out}"),
    )
    ctx.step.run(
        "charge",
        lambda: _done(ctx, "charge", "ch_1"),
        compensate=lambda out: effect(ctx, f"refund {out}"),
    )
    ctx.step.run("ship", lambda: _ship(ctx))


@app.job(name="async_unreached", max_attempts=2, retry=FAST_RETRY)
async def async_unreached(input: Unreached, ctx: x_jobs.AsyncJobContext) -> None:
    """As ``unreached``, awaited."""
    if input.before_any:
        _config(ctx)

    async def reserve() -> str:
        effect(ctx, "reserve")
        return "r1"

    async def unreserve(out: Any) -> None:
        effect(ctx, f"unreserve {out}")

    await ctx.step.run("reserve", reserve, compensate=unreserve)
    if not input.before_any:
        _config(ctx)
    await ctx.step.run(
        "charge",
        lambda: _done(ctx, "charge", "ch_1"),
        compensate=lambda out: effect(ctx, f"refund {out}"),
    )
    await ctx.step.run("ship", lambda: _ship(ctx))
