"""Handlers at the edges of the worker loop, for tests/python/test_worker_edges.py:
``python -m x_jobs worker apps.edges:app``.

Outcomes the settler cannot send as they are (an int too long for Python to print, an error text
with a lone surrogate), an exception that cannot be printed, a sync body that outlives its
timeout, and two failures that land in one settlement batch. The handlers record their runs in
``run_log`` as ``apps.basic`` does (the fleet creates the table).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import x_jobs
from apps.basic import Run

logger = logging.getLogger(__name__)

app = x_jobs.App()

FAST_RETRY = x_jobs.Retry(base=0.05, max=0.05)

#: How long the stubborn body runs, ignoring the worker's stop (its timeout is 1 s).
STUBBORN_SECONDS = 4.0

#: The first attempts of the two ``twin_fail`` jobs meet here, so that both fail at once and
#: their failures are settled in one batch.
_twins = threading.Barrier(2, timeout=30)


class Unprintable(Exception):
    """An exception whose ``str()`` raises (a broken ``__str__`` in some library)."""

    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


@app.job(name="noop")
def noop(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        pass


@app.job(name="huge_int", max_attempts=1)
def huge_int(input: dict[str, Any], ctx: x_jobs.JobContext) -> int:
    """An int of 5001 digits: JSON in principle, but past Python's int-to-str digit limit."""
    with Run(ctx):
        return 10**5000


@app.job(name="surrogate_error", max_attempts=1)
def surrogate_error(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails with a lone surrogate, as ``surrogateescape`` decoding of a stray byte leaves."""
    with Run(ctx):
        raise ValueError(b"upstream said \x80".decode("utf-8", "surrogateescape"))


@app.job(name="unprintable_async", max_attempts=1)
async def unprintable_async(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        raise Unprintable()


@app.job(name="unprintable_sync", max_attempts=1)
def unprintable_sync(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        raise Unprintable()


@app.job(name="stubborn", timeout=1.0, max_attempts=2, retry=FAST_RETRY)
def stubborn(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Attempt 1 ignores the worker's stop and runs STUBBORN_SECONDS, past its 1 s timeout (a
    sync body cannot be killed); a later attempt returns at once."""
    with Run(ctx):
        if ctx.attempt == 1:
            time.sleep(STUBBORN_SECONDS)


@app.job(name="twin_fail", max_attempts=3, retry=FAST_RETRY)
def twin_fail(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Fails every attempt with an error naming the attempt; the first attempts of two such jobs
    wait for each other, so that they fail together: after the run is recorded, so that no write
    of a busy machine comes between the two failures and the settle delay splits them."""
    try:
        with Run(ctx):
            raise ValueError(f"attempt {ctx.attempt}")
    finally:
        if ctx.attempt == 1:
            _twins.wait()
