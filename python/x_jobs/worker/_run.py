"""A claimed job as the worker tracks it, from its claim to its settlement (``Run``), the
outcome its handler left (``Outcome``), and what a settlement did with a batch of them
(``Settlement``): the records the worker's dispatcher, executors, leases and settler share.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from x_jobs.app import App
from x_jobs.context import JobContext
from x_jobs.jobs import Job

# The worker's log, whichever part writes it: its records carry the package's name, as log
# filters and pipelines match them.
logger = logging.getLogger(__package__)


@dataclass(slots=True)
class Run:
    """A claimed job, from its claim to its settlement, as the dispatcher tracks it."""

    job: Job[Any]
    ctx: JobContext
    #: The input as the row holds it, JSON text.
    payload: str = "null"
    #: When its handler began (monotonic), None while it waits in the local queue.
    started: float | None = None
    #: When this worker last knew that it held the job (monotonic): its claim, or extend_lease
    #: answering it before its start (a heartbeat counts too: see Worker._confirmed_at).
    checked: float = 0.0
    deadline: float | None = None
    task: asyncio.Task[None] | None = None  # an async handler's, made on the event loop
    #: Set once the dispatcher settled or dropped the job: a late outcome is ignored.
    done: bool = False
    #: Its timeout passed: the handler was told to stop, and the attempt fails as timed out
    #: once it returns. The job stays held (and its slot taken) until then.
    timed_out: bool = False
    #: Its final attempt timed out: once the handler has unwound, its steps are undone (and
    #: those of earlier attempts it did not reach named), as for a failure of its own.
    undoing: bool = False
    #: Still running when a drain's grace ran out in a process that lives on: told to stop, and
    #: handed back if it fails (as the drain would have), settled as usual if it completes.
    outlasted: bool = False
    #: Still running when its lease had gone unrenewed too long (see Leases.unrenewed_after):
    #: told to stop, and then, like an outlasted run, handed back or settled.
    unrenewed: bool = False
    #: Its handler has returned (or raised): it no longer runs here.
    returned: bool = False


@dataclass(slots=True)
class Outcome:
    #: The run it is the outcome of: a late outcome of an attempt the dispatcher gave up on
    #: (timed out, lost) must not settle a later attempt of the same job this worker holds.
    run: Run
    ok: bool
    output: Any = None
    error: str = ""
    stack: str | None = None
    retryable: bool = True
    #: The run suspended itself in SQL (a sleep, a wait): nothing to settle.
    suspended: bool = False
    #: The handler found that this worker no longer holds the job (JobNotHeld): another worker
    #: or an operator has it now, so nothing is settled or undone here.
    lost: bool = False

    @property
    def id(self) -> int:
        return self.run.ctx.id


@dataclass
class Settlement:
    """What the settler did with a batch: the completions the database took (the others were no
    longer held by this worker) and the state each failure left its row in."""

    batch: list[Outcome]
    completed: set[int]
    states: dict[int, str | None]


def ids_array(ids: Iterable[int]) -> str:
    """Job ids as a bigint[] literal, for a parameter cast to bigint[]: psycopg's list dumper
    looks at each element in Python (about 5% of a worker's CPU on no-op jobs)."""
    return "{" + ",".join(map(str, ids)) + "}"


def unknown_job(app: App, name: str) -> Job[Any]:
    """A stand-in for a claimed job this worker has no handler for (it is failed at once)."""

    def missing(_input: Any) -> None:
        raise LookupError(name)

    return Job(app=app, name=name, fn=missing)
