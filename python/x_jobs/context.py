"""The context a handler gets (``ctx``): its job's ids and attempt, the signal to stop
(``ctx.cancelled``), the schedule instant a fired job was enqueued for (``ctx.schedule``), and
its durable steps and progress, which it reaches through the worker's step store. The worker
makes one per claimed job and tells it to stop (``_stop``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from x_jobs.errors import JobCancelled as JobCancelled  # noqa: PLC0414 - re-exported here
from x_jobs.jobs import Enqueued, Job, JobsApp
from x_jobs.steps import AsyncSteps, Steps, StepStore, _Journal, progress

logger = logging.getLogger(__name__)

#: Guards the lazy creation of a context's Event against a concurrent stop (rarely contended).
_CANCEL_LOCK = threading.Lock()


class CancelEvent(threading.Event):
    """The Event of ``ctx.cancelled``, true once set: a plain Event, an object like any other,
    is always true, and ``if ctx.cancelled: raise ...`` would fail every attempt."""

    def __bool__(self) -> bool:
        return self.is_set()


@dataclass(frozen=True)
class Scheduled:
    """The instant a schedule fired a job for (``ctx.schedule``): the schedule's ``name``, the
    instant ``at`` (UTC), whether the job was enqueued later than the schedule's grace after it
    (``late``: a tick came late, or a catch-up), and whether an operator asked for the run
    (``manual``: ``x-jobs schedules run``, ``x_jobs.run_schedule_now``; ``at`` is then when)."""

    name: str
    at: datetime
    late: bool
    manual: bool = False


#: The key of a fired job's input under which the schedule says what fired it.
SCHEDULE_KEY = "_schedule"


def split_schedule(payload: str) -> tuple[str, Scheduled | None]:
    """A job's input (JSON text) without the ``_schedule`` its schedule added, and what that
    said. An input whose ``_schedule`` is no schedule's (not an object with a name and an ISO
    instant) is the job's own: left as it is, with None. Cheap for other inputs: the text is
    parsed only when it holds the key."""
    if f'"{SCHEDULE_KEY}"' not in payload:
        return payload, None
    try:
        value: Any = json.loads(payload)
    except (ValueError, RecursionError):
        return payload, None  # what Python cannot read (an int of 5000 digits): left to pydantic
    if not isinstance(value, dict) or not isinstance(mark := value.get(SCHEDULE_KEY), dict):
        return payload, None
    try:
        scheduled = Scheduled(
            name=str(mark["name"]),
            at=datetime.fromisoformat(str(mark["at"])),
            late=bool(mark.get("late", False)),
            manual=bool(mark.get("manual", False)),
        )
    except (KeyError, ValueError):
        return payload, None
    del value[SCHEDULE_KEY]
    # Validated from JSON text again, as every other input is (pydantic's JSON mode).
    return json.dumps(value), scheduled


@dataclass
class JobContext:
    """What a handler knows about its run: ids, attempt, and the signal to stop."""

    id: int
    name: str
    queue: str
    attempt: int
    max_attempts: int
    run_id: str
    tenant_id: str
    worker: str
    #: When the job was enqueued: a wait_for_event(since="run") matches events from then on.
    created_at: datetime | None = None
    #: Why the job was told to stop: "cancelled", "timeout", "lost", "shutdown", or "lease"
    #: (the worker could not renew its lease: the database did not answer); None if not.
    reason: str | None = None
    #: The schedule instant this job was fired for (see :class:`Scheduled`); None for a job
    #: enqueued otherwise.
    schedule: Scheduled | None = None
    _stopped: bool = field(default=False, repr=False)
    _event: CancelEvent | None = field(default=None, repr=False)
    _store: StepStore | None = field(default=None, repr=False)
    _steps: Steps | AsyncSteps | None = field(default=None, repr=False)
    #: The worker's app, whose view for the job's tenant ctx.enqueue sends through.
    _app: JobsApp | None = field(default=None, repr=False)

    def _tenant_app(self) -> JobsApp:
        if self._app is None:
            raise RuntimeError("ctx.enqueue is for a job that a Worker runs")
        return self._app.for_tenant(self.tenant_id)

    def enqueue(self, job: Job[Any] | str, input: Any = None, **options: Any) -> Enqueued:
        """Enqueue a job for this job's tenant (``ctx.tenant_id``): stamped with it, in a
        transaction scoped to it; a job or option that names another tenant is refused
        (X_TENANT_SCOPE_CONFLICT). Another tenant's work is enqueued through
        ``app.cross_tenant(reason)``. A short blocking call, async handlers too."""
        return self._tenant_app().enqueue(job, input, **options)

    def enqueue_many(
        self, job: Job[Any] | str, inputs: Iterable[Any], **options: Any
    ) -> list[Enqueued]:
        """Enqueue many jobs of one kind for this job's tenant, in one round trip (see
        :meth:`enqueue`)."""
        return self._tenant_app().enqueue_many(job, inputs, **options)

    def _journal(self) -> _Journal:
        if self._store is None:
            raise RuntimeError("steps and progress are for a job that a Worker runs")
        return _Journal(self, self._store)

    @property
    def step(self) -> Steps:
        """The run's durable steps: ``run``, ``sleep``, ``wait_for_event`` (see x_jobs.steps)."""
        if self._steps is None:
            self._steps = Steps(self._journal())
        assert isinstance(self._steps, Steps)
        return self._steps

    def progress(
        self, done: float | None = None, total: float | None = None, note: str | None = None
    ) -> bool:
        """Write the job's progress (``x-jobs jobs show`` prints it). False when the worker no
        longer holds the job (its body should stop). A short blocking call, async handlers too."""
        if self._store is None:
            raise RuntimeError("steps and progress are for a job that a Worker runs")
        return progress(self._store, self, done, total, note)

    @property
    def cancelled(self) -> CancelEvent:
        """Set, and true, when the job must stop: ``if ctx.cancelled:`` in a loop, or
        ``ctx.cancelled.wait(timeout)`` to sleep until then.

        Made on first use: an Event per claimed job is a large share of the dispatcher's work
        on short jobs, and most handlers never ask."""
        if self._event is None:
            with _CANCEL_LOCK:
                if self._event is None:
                    event = CancelEvent()
                    if self._stopped:
                        event.set()
                    self._event = event
        return self._event

    def is_cancelled(self) -> bool:
        return self._stopped

    def raise_if_cancelled(self) -> None:
        if self._stopped:
            raise JobCancelled(self.reason or "cancelled")

    def _stop(self, reason: str) -> None:
        with _CANCEL_LOCK:
            self.reason = reason
            self._stopped = True
            if self._event is not None:
                self._event.set()


@dataclass
class AsyncJobContext(JobContext):
    """The context of an ``async`` handler: its ``step`` methods are awaited."""

    @property
    def step(self) -> AsyncSteps:  # type: ignore[override]
        """The run's durable steps, awaited: ``await ctx.step.run("name", fn)``."""
        if self._steps is None:
            self._steps = AsyncSteps(self._journal())
        assert isinstance(self._steps, AsyncSteps)
        return self._steps
