"""Durable steps: ``ctx.step.run``, ``ctx.step.sleep``, ``ctx.step.wait_for_event``.

A run records each step it reaches in ``x_jobs.step`` (through ``x_jobs.step_record``,
``x_jobs.step_sleep`` and ``x_jobs.step_wait``). When the job runs again (a retry, a claim after
a crash, the wake-up after a sleep or an event), the handler starts from the top and every step
already recorded answers its recorded output instead of running: the body must reach its steps
in the same order with the same names, and put its side effects inside steps.

A sleep or a wait that cannot answer yet suspends the run in SQL (its row is ``suspended``,
held by no worker) and unwinds the handler with :class:`Suspended`, which the worker takes as
"nothing to settle". Outputs go through JSON both ways, so the first run sees exactly what a
replay will see.

Sagas: ``run(name, fn, compensate=undo)`` registers ``undo(output)``. When the run fails for
good (its last attempt fails or times out, or it raises ``PermanentError``), the worker calls
:meth:`Steps.compensate`: the completed steps' compensations run in reverse order, each
recorded (``compensation => true``) so that it runs once across crashes. A worker that no
longer holds the job (cancelled, or its lease taken over) undoes nothing. A compensation is code
registered as the handler reaches its step, so only the steps the final attempt reaches are
undone: those that completed on an earlier attempt and were not reached again are named in the
job's error (the rows do not say whether they had a compensation, so "if any").

A lost connection (a server restart ends every connection of the pool) does not fail a step
call: the idle connections are checked, and the call is sent again on a connection of its own,
with backoff while the server is away, until it answers or the job is told to stop (then the call
raises ``JobCancelled``, as a stopped step does). Sending a call again is safe: every step
function checks that the worker still holds the job (a retry after the job was lost is refused
with ``X_JOB_NOT_HELD``, as before), and each is idempotent for its holder when its first try
committed and only the reply was lost: ``step_record`` never changes a done step and answers
it done again (no conflict), ``step_sleep`` and ``step_wait`` keep the row they made (and a
suspension that committed is answered as one, see :func:`_call`), ``steps`` and ``progress``
write nothing that a second call changes.

A sync handler's steps and compensations must be sync functions: one that is a coroutine function
is refused when the step is declared, and one that returns an awaitable (a lambda calling an
``async def``) fails, its coroutine closed unrun, rather than be taken as done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, LiteralString, Protocol

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from x_jobs._conn import PATIENCE, connect, pool_kwargs
from x_jobs._listen import DB_GONE
from x_jobs.errors import JobNotHeld, OutputInvalid, StepConflict, XJobsError, translate
from x_jobs.errors import StepTimeout as StepTimeout  # noqa: PLC0414 - re-exported here
from x_jobs.errors import Suspended as Suspended  # noqa: PLC0414 - re-exported here
from x_jobs.jobs import Seconds, interval

logger = logging.getLogger(__name__)


class StepContext(Protocol):
    """What the steps read of a run's context (x_jobs.context.JobContext is one): its job,
    its holder, and the signal to stop. A protocol, so that this module needs nothing of the
    context, which makes its ``ctx.step`` from here."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def worker(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def created_at(self) -> datetime | None: ...
    @property
    def cancelled(self) -> threading.Event: ...
    def raise_if_cancelled(self) -> None: ...


STEPS: LiteralString = "SELECT * FROM x_jobs.steps(id => %s, worker => %s)"
RECORD: LiteralString = """
    SELECT x_jobs.step_record(id => %s, worker => %s, step => %s, output => %s, error => %s,
                              compensation => %s)::text
"""
SLEEP: LiteralString = (
    "SELECT * FROM x_jobs.step_sleep(id => %s, worker => %s, step => %s, duration => %s)"
)
WAIT: LiteralString = """
    SELECT * FROM x_jobs.step_wait(id => %s, worker => %s, step => %s, event => %s,
                                   event_key => %s, match => %s, timeout => %s, since => %s)
"""
PROGRESS: LiteralString = """
    SELECT x_jobs.progress(id => %s, worker => %s, done => %s, total => %s, note => %s)
"""
#: The same calls with the attempt the run holds, last (x_jobs 0.4.2, the fence): a call of an
#: attempt this worker gave up on (timed out, lost, then claimed again) acts on nothing. Sent
#: when the store is ``fenced`` (the worker found the database takes them); the attempt is the
#: last parameter.
FENCED: dict[str, LiteralString] = {
    STEPS: "SELECT * FROM x_jobs.steps(id => %s, worker => %s, attempt => %s)",
    RECORD: """
    SELECT x_jobs.step_record(id => %s, worker => %s, step => %s, output => %s, error => %s,
                              compensation => %s, attempt => %s)::text
""",
    SLEEP: (
        "SELECT * FROM x_jobs.step_sleep(id => %s, worker => %s, step => %s, duration => %s,"
        " attempt => %s)"
    ),
    WAIT: """
    SELECT * FROM x_jobs.step_wait(id => %s, worker => %s, step => %s, event => %s,
                                   event_key => %s, match => %s, timeout => %s, since => %s,
                                   attempt => %s)
""",
    PROGRESS: """
    SELECT x_jobs.progress(id => %s, worker => %s, done => %s, total => %s, note => %s,
                           attempt => %s)
""",
}

#: How often a failing compensation is tried within the failing attempt, and the first pause.
COMPENSATION_TRIES = 3
COMPENSATION_BACKOFF = 0.2

#: A step call whose connection was lost waits this long before its next try while the server
#: is away, doubling up to RECONNECT_MAX (the worker's own reconnect backoff).
RECONNECT_FIRST = 0.1
RECONNECT_MAX = 5.0
#: How long a step call waits for a connection of the pool before it takes one of its own (the
#: pool may be reconnecting after an outage, on a backoff of its own that can reach minutes).
CHECKOUT_TIMEOUT = 2.0


@dataclass
class StepRow:
    name: str
    compensation: bool
    kind: str
    status: str
    output: Any
    error: str | None


def _row(values: dict[str, Any]) -> StepRow:
    return StepRow(
        name=values["name"],
        compensation=values["compensation"],
        kind=values["kind"],
        status=str(values["status"]),
        output=values["output"],
        error=values["error"],
    )


def _as_json(what: str, value: Any) -> Any:
    """``value`` as a replay will see it (through JSON), or OutputInvalid. As jsonb takes it:
    no NaN or infinity, no NUL in a string; a value it refused would fail the record after the
    step ran, and a retry would run the step again."""
    try:
        copy = json.loads(json.dumps(value, allow_nan=False))
        if _holds_nul(copy):
            raise ValueError("a string holds a NUL character, which PostgreSQL cannot store")
        return copy
    except (TypeError, ValueError) as err:
        raise OutputInvalid(
            f"X_OUTPUT_INVALID: {what} returned a {type(value).__name__}, which is not JSON: {err}",
            hint="Return JSON values (dict, list, str, int, float, bool, None).",
        ) from err


def _holds_nul(value: Any) -> bool:
    """Does a JSON value hold a NUL character in a string or a key? jsonb refuses it."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


class StepStore:
    """The step functions' connections: a pool of the worker's, shared by its handler threads
    and opened on the first step any handler takes.

    The pool does not check a connection as it hands it out (``check=``): that costs a round
    trip per step call, and psycopg_pool sleeps a second, then two, four... between the stale
    connections it finds, so that after a restart a pool of six failed its checkout for 30 s.
    A call that finds its connection dead goes through :func:`_call` instead, which sweeps the
    idle ones (:meth:`sweep`) and sends the call again on a connection of its own
    (:meth:`fetch_alone`)."""

    def __init__(self, dsn: str, max_size: int, *, patience: float = PATIENCE) -> None:
        self._dsn = dsn
        self._max_size = max(1, max_size)
        #: How long its connections wait on a silent network (see network_settings).
        self._patience = patience
        self._pool: ConnectionPool | None = None
        # Handler threads take their first steps at once: one pool, not one each (which would
        # leak the others).
        self._pool_lock = threading.Lock()
        #: Pass each call the attempt its run holds (see FENCED): set by the worker once it
        #: found a database that takes it.
        self.fenced = False

    def _connections(self) -> ConnectionPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self._dsn,
                    min_size=1,
                    max_size=self._max_size,
                    kwargs=pool_kwargs(self._dsn, "x_jobs steps", patience=self._patience),
                    open=True,
                    name="x_jobs-steps",
                    timeout=CHECKOUT_TIMEOUT,
                )
            return self._pool

    def fetch(self, sql: LiteralString, params: list[Any]) -> list[dict[str, Any]]:
        """One try on a connection of the pool. A lost connection raises one of DB_GONE (a
        PoolTimeout too, when none came within CHECKOUT_TIMEOUT); a refusal its typed error."""
        with self._connections().connection() as conn:
            return _execute(conn, sql, params)

    def fetch_alone(self, sql: LiteralString, params: list[Any]) -> list[dict[str, Any]]:
        """One try on a connection opened for it and closed after: the retry of a call whose
        pooled connection was lost, which must not wait for the pool's own reconnection."""
        with connect(self._dsn, "x_jobs steps", patience=self._patience) as conn:
            return _execute(conn, sql, params)

    def sweep(self) -> None:
        """Check the pool's idle connections now, replacing the dead ones (in the background):
        after a restart every one of them is dead, and each would fail a step call once."""
        if self._pool is not None:
            # Best effort: the retry that follows does not need it.
            with contextlib.suppress(psycopg.Error):
                self._pool.check()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _execute(
    conn: psycopg.Connection[Any], sql: LiteralString, params: list[Any]
) -> list[dict[str, Any]]:
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(sql, params).fetchall()
    except psycopg.Error as err:
        typed = translate(err)
        if typed is err:
            raise
        raise typed from err


def _call(
    store: StepStore,
    ctx: StepContext,
    sql: LiteralString,
    params: list[Any],
    *,
    patient: bool = True,
    suspends: str | None = None,
) -> list[dict[str, Any]]:
    """A step function's call for ``ctx``'s job. The common path is one try on the pool. When
    the connection is lost (or none comes), the pool's idle connections are swept and the call
    is sent again at once on a connection of its own, then with backoff while the database is
    away, until it answers, or until the job is told to stop (``ctx.cancelled``: a timeout, a
    cancel, a lost lease, a drain's end), which raises JobCancelled as a stopped step does.
    ``patient=False`` (what is best effort) gives up after the immediate try.

    Sending the call again is safe: the step functions check the holder, so a job lost
    meanwhile is refused (JobNotHeld), and each is idempotent for its holder (see the module's
    doc). ``suspends`` names a sleep or a wait: its first try may have committed the run's
    suspension and lost only the reply, and the next try finds the job suspended, no longer
    held; that is the suspension asked for, answered as Suspended (nothing to settle either
    way: a lapsed lease whose next holder suspended the run is no business of this one)."""
    if store.fenced:
        sql, params = FENCED[sql], [*params, ctx.attempt]
    try:
        return store.fetch(sql, params)
    except DB_GONE as err:
        lost: Exception = err
    store.sweep()
    delay = RECONNECT_FIRST
    while True:
        try:
            return store.fetch_alone(sql, params)
        except JobNotHeld as err:
            if suspends is not None and " is suspended " in err.message:
                raise Suspended(suspends) from err
            raise
        except DB_GONE as err:
            lost = err
        if not patient:
            raise lost
        _raise_if_stopped(ctx, lost)
        logger.warning(
            "step call: database unreachable; retrying",
            extra={"job_id": ctx.id, "retry_in_s": round(delay, 2), "error": str(lost).strip()},
        )
        ctx.cancelled.wait(delay)
        _raise_if_stopped(ctx, lost)
        delay = min(delay * 2, RECONNECT_MAX)


def _raise_if_stopped(ctx: StepContext, lost: Exception) -> None:
    """JobCancelled (caused by the lost connection) once the job was told to stop."""
    try:
        ctx.raise_if_cancelled()
    except Exception as stopped:
        raise stopped from lost


class _Journal:
    """What one run recorded, loaded on its first step, and what this attempt did since."""

    def __init__(self, ctx: StepContext, store: StepStore) -> None:
        self.ctx = ctx
        self.store = store
        self.steps: dict[str, StepRow] | None = None
        self.compensations: dict[str, StepRow] = {}
        self.reached: set[str] = set()
        #: (name, undo, output) of the completed steps that declared a compensation, in order.
        self.undo: list[tuple[str, Callable[[Any], Any], Any]] = []

    def load(self, name: str) -> StepRow | None:
        """The recorded step ``name`` (None if not reached before); refuses a name reached
        twice in one run."""
        if name in self.reached:
            raise StepConflict(
                f"X_STEP_CONFLICT: step {name!r} was reached twice in one run of job {self.ctx.id}",
                hint="Give every step of a run its own name (add a counter for steps in a loop).",
            )
        self.reached.add(name)
        return self.rows().get(name)

    def call(
        self,
        sql: LiteralString,
        params: list[Any],
        *,
        patient: bool = True,
        suspends: str | None = None,
    ) -> list[dict[str, Any]]:
        return _call(self.store, self.ctx, sql, params, patient=patient, suspends=suspends)

    def rows(self) -> dict[str, StepRow]:
        """The run's recorded steps (compensations apart), read once per attempt."""
        if self.steps is None:
            steps: dict[str, StepRow] = {}
            for values in self.call(STEPS, [self.ctx.id, self.ctx.worker]):
                row = _row(values)
                (self.compensations if row.compensation else steps)[row.name] = row
            self.steps = steps
        return self.steps

    def record(
        self,
        name: str,
        output: Any = None,
        error: str | None = None,
        compensation: bool = False,
        *,
        patient: bool = True,
    ) -> None:
        self.call(
            RECORD,
            [
                self.ctx.id,
                self.ctx.worker,
                name,
                None if error is not None else Jsonb(output),
                error,
                compensation,
            ],
            patient=patient,
        )

    def record_failure(self, name: str, err: BaseException) -> None:
        """Keep a run step's error for the operator (the next attempt runs the step again);
        best effort: the handler's own error is what the attempt fails with (no wait for a
        database that is away)."""
        try:
            self.record(name, error=f"{type(err).__name__}: {err}", patient=False)
        except (XJobsError, psycopg.Error) as record_err:
            logger.warning(
                "could not record a failed step",
                extra={"job_id": self.ctx.id, "step": name, "error": str(record_err)},
            )

    def suspend_or_answer(self, row: StepRow, what: str) -> Any:
        if row.status == "done":
            return row.output
        if row.status == "failed":
            raise StepTimeout(row.error or f"X_STEP_TIMEOUT: {what} timed out")
        raise Suspended(what)

    def wait_params(
        self,
        name: str,
        *,
        event: str,
        timeout: Seconds | timedelta | None,
        match: dict[str, Any] | None,
        key: str | None,
        since: Literal["step", "run"] | datetime,
    ) -> list[Any]:
        """The parameters of ``x_jobs.step_wait``; ``key`` is already text (see _event_key)."""
        if since == "step":
            since_at = None
        elif since == "run":
            since_at = self.ctx.created_at
        else:
            since_at = since
        return [
            self.ctx.id,
            self.ctx.worker,
            name,
            event,
            key,
            None if match is None else Jsonb(match),
            _duration(timeout),
            since_at,
        ]

    def failed_compensation(self, name: str, err: BaseException) -> str:
        message = f"compensation of step {name!r} failed: {type(err).__name__}: {err}"
        try:
            self.record(name, error=message, compensation=True, patient=False)
        except (XJobsError, psycopg.Error) as record_err:
            logger.warning(
                "could not record a failed compensation",
                extra={"job_id": self.ctx.id, "step": name, "error": str(record_err)},
            )
        logger.error(message, extra={"job_id": self.ctx.id, "job": self.ctx.name})
        return message

    def pending_undo(self) -> list[tuple[str, Callable[[Any], Any], Any]]:
        """The compensations still to run, last completed step first."""
        return [
            entry
            for entry in reversed(self.undo)
            if (done := self.compensations.get(entry[0])) is None or done.status != "done"
        ]

    def unreached(self) -> list[str]:
        """Once the final attempt failed: a note naming the steps that completed on an earlier
        attempt and that this one did not reach (nor was their undoing recorded before), so
        that no compensation of theirs can have run; none if there are none. The rows do not
        say whether such a step declared a compensation: that code was never registered."""
        names = [
            name
            for name, row in self.rows().items()
            if row.kind == "run"
            and row.status == "done"
            and name not in self.reached
            and ((undone := self.compensations.get(name)) is None or undone.status != "done")
        ]
        if not names:
            return []
        listed = ", ".join(repr(name) for name in names)
        if len(names) == 1:
            return [
                f"step {listed} completed on an earlier attempt and was not reached on the "
                "final one: its compensation, if any, did not run"
            ]
        return [
            f"steps {listed} completed on an earlier attempt and were not reached on the final "
            "one: their compensations, if any, did not run"
        ]


def _duration(value: Seconds | timedelta | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return interval(value)


def _event_key(key: str | int | None) -> str | None:
    """An event key as ``step_wait`` takes it: text. An int is its decimal text (so ``key=42``
    matches ``publish(..., key => '42')``); anything else is refused here, before the database
    is asked (psycopg sends an int as a smallint, which no step_wait takes)."""
    if key is None or isinstance(key, str):
        return key
    # bool is an int, and str(True) would quietly wait for the key 'True'.
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key)
    raise TypeError(f"an event key is a str or an int, not a {type(key).__name__}: {key!r}")


_MAKE_SYNC = "make the handler async or the function sync"


def _refuse_async(fn: Callable[..., Any], what: str, kind: str) -> None:
    """Refuse a coroutine function given to a sync handler's steps, before anything runs."""
    if inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"{what} is an async function: a sync handler's {kind} must be sync functions; "
            f"{_MAKE_SYNC}"
        )


def _not_sync(value: Any, what: str, kind: str) -> TypeError | None:
    """The error of a sync handler's step or compensation that returned an awaitable (a lambda
    calling an ``async def``), None for any other value. Nothing awaits it here: a coroutine is
    closed, so its body never runs and no "never awaited" warning follows."""
    if not inspect.isawaitable(value):
        return None
    if inspect.iscoroutine(value):
        value.close()
        returned = "a coroutine"
    else:
        returned = f"an awaitable ({type(value).__name__})"
    return TypeError(
        f"{what} returned {returned}: a sync handler's {kind} must be sync functions; {_MAKE_SYNC}"
    )


class Steps:
    """``ctx.step`` of a sync handler."""

    def __init__(self, journal: _Journal) -> None:
        self._journal = journal

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        compensate: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Run ``fn()`` once per run and answer its output; later runs answer the recorded
        output without calling it. ``compensate(output)`` undoes it if the run fails for good.
        Both must be sync functions (TypeError otherwise: nothing here would await them)."""
        _refuse_async(fn, f"step {name!r}", "steps")
        if compensate is not None:
            _refuse_async(compensate, f"the compensation of step {name!r}", "compensations")
        journal = self._journal
        row = journal.load(name)
        if row is not None and row.kind == "run" and row.status == "done":
            output = row.output
        else:
            journal.ctx.raise_if_cancelled()
            try:
                value = fn()
                if (refused := _not_sync(value, f"step {name!r}", "steps")) is not None:
                    raise refused
            except Exception as err:
                journal.record_failure(name, err)
                raise
            output = _as_json(f"step {name!r}", value)
            journal.record(name, output)
        if compensate is not None:
            journal.undo.append((name, compensate, output))
        return output

    def sleep(self, name: str, duration: Seconds | timedelta) -> None:
        """Suspend the run for ``duration`` (seconds or a timedelta) from when it first reached
        this step; no worker is held meanwhile."""
        journal = self._journal
        row = journal.load(name)
        if row is not None and row.kind == "sleep" and row.status == "done":
            return
        (values,) = journal.call(
            SLEEP,
            [journal.ctx.id, journal.ctx.worker, name, _duration(duration)],
            suspends=f"sleep {name!r}",
        )
        journal.suspend_or_answer(_row(values), f"sleep {name!r}")

    def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        timeout: Seconds | timedelta | None = None,
        match: dict[str, Any] | None = None,
        key: str | int | None = None,
        since: Literal["step", "run"] | datetime = "step",
    ) -> Any:
        """Answer the payload of the first ``event`` (with ``key``, containing ``match``)
        published since this step was first reached (``since="run"``: since the job was
        enqueued), suspending the run until it comes; :class:`StepTimeout` after ``timeout``.
        An int ``key`` is its decimal text (``key=42`` matches a publish with ``key => '42'``)."""
        text_key = _event_key(key)
        journal = self._journal
        row = journal.load(name)
        if row is not None and row.kind == "wait" and row.status != "waiting":
            return journal.suspend_or_answer(row, f"wait {name!r}")
        (values,) = journal.call(
            WAIT,
            journal.wait_params(
                name, event=event, timeout=timeout, match=match, key=text_key, since=since
            ),
            suspends=f"wait {name!r} for {event!r}",
        )
        return journal.suspend_or_answer(_row(values), f"wait {name!r} for {event!r}")

    def compensate(self) -> list[str]:
        """Run the pending compensations, last completed step first, each retried a few times;
        answers the messages of those that failed for good (recorded and logged), then the note
        of the steps an earlier attempt completed that this one did not reach (see unreached).
        Called once the final attempt failed, whether or not it reached a step."""
        journal = self._journal
        journal.rows()  # read here if this attempt reached no step: earlier ones may have
        failures: list[str] = []
        for name, undo, output in journal.pending_undo():
            delay = COMPENSATION_BACKOFF
            for attempt in range(1, COMPENSATION_TRIES + 1):
                try:
                    returned = undo(output)
                except Exception as err:
                    if attempt == COMPENSATION_TRIES:
                        failures.append(journal.failed_compensation(name, err))
                        break
                    time.sleep(delay)
                    delay *= 2
                else:
                    # Not retried: it would return an awaitable again, and undo nothing again.
                    if (refused := _not_sync(returned, "it", "compensations")) is not None:
                        failures.append(journal.failed_compensation(name, refused))
                    else:
                        journal.record(name, compensation=True)
                    break
        return failures + journal.unreached()

    @property
    def has_compensations(self) -> bool:
        return bool(self._journal.pending_undo())


class AsyncSteps:
    """``ctx.step`` of an ``async`` handler: the same steps, awaited. ``fn`` and ``compensate``
    may be coroutine functions or plain ones; database calls run in a thread, off the loop."""

    def __init__(self, journal: _Journal) -> None:
        self._journal = journal

    async def _fetch(
        self, sql: LiteralString, params: list[Any], *, suspends: str
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(
            functools.partial(self._journal.call, sql, params, suspends=suspends)
        )

    async def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        compensate: Callable[[Any], Any] | None = None,
    ) -> Any:
        journal = self._journal
        row = await asyncio.to_thread(journal.load, name)
        if row is not None and row.kind == "run" and row.status == "done":
            output = row.output
        else:
            journal.ctx.raise_if_cancelled()
            try:
                value = await _maybe_await(fn())
            except Exception as err:
                await asyncio.to_thread(journal.record_failure, name, err)
                raise
            output = _as_json(f"step {name!r}", value)
            await asyncio.to_thread(journal.record, name, output)
        if compensate is not None:
            journal.undo.append((name, compensate, output))
        return output

    async def sleep(self, name: str, duration: Seconds | timedelta) -> None:
        journal = self._journal
        row = await asyncio.to_thread(journal.load, name)
        if row is not None and row.kind == "sleep" and row.status == "done":
            return
        (values,) = await self._fetch(
            SLEEP,
            [journal.ctx.id, journal.ctx.worker, name, _duration(duration)],
            suspends=f"sleep {name!r}",
        )
        journal.suspend_or_answer(_row(values), f"sleep {name!r}")

    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        timeout: Seconds | timedelta | None = None,
        match: dict[str, Any] | None = None,
        key: str | int | None = None,
        since: Literal["step", "run"] | datetime = "step",
    ) -> Any:
        text_key = _event_key(key)
        journal = self._journal
        row = await asyncio.to_thread(journal.load, name)
        if row is not None and row.kind == "wait" and row.status != "waiting":
            return journal.suspend_or_answer(row, f"wait {name!r}")
        (values,) = await self._fetch(
            WAIT,
            journal.wait_params(
                name, event=event, timeout=timeout, match=match, key=text_key, since=since
            ),
            suspends=f"wait {name!r} for {event!r}",
        )
        return journal.suspend_or_answer(_row(values), f"wait {name!r} for {event!r}")

    async def compensate(self) -> list[str]:
        journal = self._journal
        await asyncio.to_thread(journal.rows)  # as in Steps.compensate
        failures: list[str] = []
        for name, undo, output in journal.pending_undo():
            delay = COMPENSATION_BACKOFF
            for attempt in range(1, COMPENSATION_TRIES + 1):
                try:
                    await _maybe_await(undo(output))
                except Exception as err:
                    if attempt == COMPENSATION_TRIES:
                        failures.append(
                            await asyncio.to_thread(journal.failed_compensation, name, err)
                        )
                        break
                    await asyncio.sleep(delay)
                    delay *= 2
                else:
                    await asyncio.to_thread(journal.record, name, None, None, True)
                    break
        return failures + journal.unreached()

    @property
    def has_compensations(self) -> bool:
        return bool(self._journal.pending_undo())


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def progress(
    store: StepStore, ctx: StepContext, done: float | None, total: float | None, note: str | None
) -> bool:
    (values,) = _call(store, ctx, PROGRESS, [ctx.id, ctx.worker, done, total, note])
    return bool(values["progress"])


__all__ = [
    "AsyncSteps",
    "StepStore",
    "StepTimeout",
    "Steps",
    "Suspended",
    "progress",
]
