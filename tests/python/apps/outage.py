"""Handlers for tests/python/test_worker_outage.py: ``python -m x_jobs worker apps.outage:app``.

They record what they saw in files of a directory their input names, not in the database: the
tests stop the server while they run. A note is a file written whole (renamed into place), so a
test that sees it reads all of it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pydantic import BaseModel

import x_jobs

logger = logging.getLogger(__name__)

app = x_jobs.App()

QUEUE = "outage"
#: The timeout of ``timed`` jobs: long enough that the test has stopped the server, and the
#: worker noticed, before it passes.
TIMEOUT_SECONDS = 3.0
#: How long a first attempt waits to be told to stop before it gives up (a test gone wrong).
GIVE_UP_SECONDS = 120.0


class Notes(BaseModel):
    #: Where the handler writes its notes.
    dir: str


def note(notes: Notes, name: str, text: str = "") -> None:
    path = Path(notes.dir) / name
    partial = path.with_name(f".{name}.partial")
    partial.write_text(text)
    partial.replace(path)


def _start(notes: Notes, ctx: x_jobs.JobContext) -> None:
    note(notes, f"start-{ctx.id}-{ctx.attempt}", f"{os.getpid()}")


def _first_attempt_waits(notes: Notes, ctx: x_jobs.JobContext) -> str:
    """Attempt 1 runs until the worker tells it to stop, and notes why; a later one returns."""
    _start(notes, ctx)
    if ctx.attempt == 1:
        ctx.cancelled.wait(GIVE_UP_SECONDS)
        note(notes, f"stopped-{ctx.id}-{ctx.attempt}", ctx.reason or "not told")
        ctx.raise_if_cancelled()
    return f"done by attempt {ctx.attempt}"


@app.job(name="hold", queue=QUEUE)
def hold(input: Notes, ctx: x_jobs.JobContext) -> str:
    return _first_attempt_waits(input, ctx)


@app.job(name="timed", queue=QUEUE, timeout=TIMEOUT_SECONDS)
def timed(input: Notes, ctx: x_jobs.JobContext) -> str:
    return _first_attempt_waits(input, ctx)


@app.job(name="gated", queue=QUEUE)
def gated(input: Notes, ctx: x_jobs.JobContext) -> None:
    """Runs until the test writes the note ``open`` (or the worker tells it to stop)."""
    _start(input, ctx)
    gate = Path(input.dir) / "open"
    while not gate.exists() and not ctx.cancelled.wait(0.01):
        pass


@app.job(name="quick", queue=QUEUE)
def quick(input: Notes, ctx: x_jobs.JobContext) -> None:
    _start(input, ctx)
