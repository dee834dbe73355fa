"""Claim and settle: the statements of ``x_jobs.claim``, ``x_jobs.complete_many`` and
``x_jobs.fail``, and the worker's settler, which settles finished jobs in batches on a connection
and a thread of its own (all completions of a batch in one ``complete_many`` call, failures one
by one), so that the server settles one batch while the dispatcher claims the next.

A batch whose connection was lost is sent again once the database answers, first reading which
of its jobs this worker still holds (``HELD_AT``): its commit may have gone through.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

from x_jobs._conn import connect
from x_jobs._leased import Stopping
from x_jobs._refusal import described, refuses_value
from x_jobs._watch import CallWatch
from x_jobs.errors import ascii_only, storable
from x_jobs.jobs import interval
from x_jobs.metrics import WorkerMetrics
from x_jobs.worker._run import Outcome, Run, Settlement, ids_array
from x_jobs.worker.leases import EXTEND, EXTEND_AT, attempts_array

# The worker's log, whichever part writes it: its records carry the package's name, as log
# filters and pipelines match them.
logger = logging.getLogger(__package__)

# The input comes as JSON text, which the handler's run parses and validates in one step
# (pydantic's validate_json): parsing it in the dispatcher would cost it a tenth of its time.
CLAIM: LiteralString = """
    SELECT id, name, queue, state::text, input::text, attempt, max_attempts, run_id::text,
           tenant_id, created_at
    FROM x_jobs.claim(queues => %s, worker => %s, lease => %s, qty => %s)
"""
# Id lists go as bigint[] literals (see _run.ids_array).
COMPLETE_MANY: LiteralString = (
    "SELECT c FROM x_jobs.complete_many(ids => %s::bigint[], worker => %s, outputs => %s::jsonb[])"
    " AS c"
)
FAIL: LiteralString = """
    SELECT x_jobs.fail(id => %s, worker => %s, error => %s, error_stack => %s,
                       retry_delay => %s, retryable => %s)::text
"""
#: The same with the attempts the worker holds (x_jobs 0.4.2, the fence): the outcome of an
#: attempt the worker gave up on (its lease lapsed, it claimed the job again) settles nothing.
COMPLETE_MANY_AT: LiteralString = (
    "SELECT c FROM x_jobs.complete_many(ids => %s::bigint[], worker => %s, outputs => %s::jsonb[],"
    " attempts => %s::integer[]) AS c"
)
FAIL_AT: LiteralString = """
    SELECT x_jobs.fail(id => %s, worker => %s, error => %s, error_stack => %s,
                       retry_delay => %s, retryable => %s, attempt => %s)::text
"""
HELD_AT: LiteralString = (
    "SELECT id, state, attempt, claimed_by FROM x_jobs.job_states(ids => %s::bigint[])"
)


class Settler:
    """The worker's settlements. The dispatcher gathers finished outcomes (``pending``) and
    submits them as a batch when one is due; the settler thread (``run``) settles it and puts
    what it did in ``settled``, which the dispatcher takes (``take_settled``): the jobs leave
    ``held``. One batch is in flight at a time.

    ``held`` is the dispatcher's map of the jobs it holds, touched on the dispatcher's thread
    only; ``stopping`` says when a retry gives up (a second stop, or the time to exit)."""

    def __init__(
        self,
        *,
        dsn: str,
        worker_id: str,
        lease: float,
        capacity: int,
        settle_delay: float,
        patience: float,
        watch: CallWatch,
        stopping: Stopping,
        held: dict[int, Run],
        metrics: WorkerMetrics,
        dispatcher_wake: threading.Event,
    ) -> None:
        self._dsn = dsn
        self.worker_id = worker_id
        self.lease = lease
        self.capacity = capacity
        self.settle_delay = settle_delay
        self._patience = patience
        self._watch = watch
        self._stopping = stopping
        self._held = held
        self.metrics = metrics
        self._dispatcher_wake = dispatcher_wake
        #: Outcomes waiting for the next batch, since pending_since (the dispatcher's).
        self.pending: list[Outcome] = []
        self.pending_since = 0.0
        #: A batch is in flight, of settling_size outcomes.
        self.settling = False
        self.settling_size = 0
        self._batches: queue.SimpleQueue[list[Outcome] | None] = queue.SimpleQueue()
        self.settled: queue.SimpleQueue[Settlement] = queue.SimpleQueue()
        #: Set to cut a retry's backoff short: the database answers again, or the worker exits
        #: and its last settlement is tried now.
        self.wake_up = threading.Event()
        #: Pass the attempts the worker holds (see COMPLETE_MANY_AT): set at the start where
        #: the database takes them.
        self.fenced = False

    def close(self) -> None:
        """The thread ends once the batch in flight is done."""
        self._batches.put(None)

    def due(self, now: float, *, draining: bool) -> bool:
        """Settle in batches, one in flight: when enough finished, when the first of them waited
        settle_delay, or when nothing else is left to finish."""
        pending = len(self.pending)
        return (
            pending > 0
            and not self.settling
            and (
                pending * 2 >= self.capacity
                or now - self.pending_since >= self.settle_delay
                or pending >= len(self._held)
                or draining
            )
        )

    def submit(self) -> None:
        batch, self.pending = self.pending, []
        self.settling = True
        self.settling_size = len(batch)
        self._batches.put(batch)

    def take_settled(self) -> None:
        """Account for the batches the settler finished: the jobs leave this worker."""
        now = time.monotonic()
        while True:
            try:
                done = self.settled.get_nowait()
            except queue.Empty:
                return
            self.settling = False
            self.settling_size = 0
            # Counted per job name and state, once per batch: a metric update takes a lock.
            tally: dict[tuple[str, str], int] = {}
            run_seconds: dict[str, list[float]] = {}
            for outcome in done.batch:
                run = outcome.run
                # A failed job may have been claimed again while its failure was being settled
                # (a short retry delay): its id then holds the new attempt, which stays.
                if self._held.get(run.ctx.id) is run:
                    del self._held[run.ctx.id]
                name = run.job.name
                if outcome.ok and outcome.run.ctx.id in done.completed:
                    state = "done"
                    run_seconds.setdefault(name, []).append(now - (run.started or now))
                elif outcome.ok:
                    state = "lost"
                    logger.warning(
                        "job completed after its lease was lost; the result is dropped",
                        extra={"job_id": run.ctx.id, "job": name},
                    )
                else:
                    state = done.states.get(run.ctx.id) or "lost"
                    logger.info(
                        "job failed",
                        extra={
                            "job_id": run.ctx.id,
                            "job": name,
                            "attempt": run.ctx.attempt,
                            "state": state,
                            "error": outcome.error,
                        },
                    )
                    run_seconds.setdefault(name, []).append(now - (run.started or now))
                tally[name, state] = tally.get((name, state), 0) + 1
            for (name, state), count in tally.items():
                self.metrics.settled(name, state, n=count)
            for name, durations in run_seconds.items():
                self.metrics.observe(name, durations)

    def finish(self, until: float, collect: Callable[[float], None]) -> None:
        """Before exiting: settle what is pending and wait for the settler, until ``until``
        (monotonic), ``collect`` (the dispatcher's) taking the outcomes that come meanwhile. A
        settler waiting out its backoff tries again at once."""
        self.wake_up.set()
        while time.monotonic() < until:
            self.take_settled()
            collect(time.monotonic())
            if not self.settling and self.pending:
                self.submit()
            if not self.settling:
                return
            self._dispatcher_wake.wait(0.05)
            self._dispatcher_wake.clear()

    def run(self) -> None:
        """The settler thread: each batch in one transaction (all completions in one
        complete_many call, failures one by one). A settlement that fails for anything but
        its values (see x_jobs._refusal: a lost connection, a pooler's or the protocol's error,
        a read-only transaction during a failover...) is sent again with backoff on a new
        connection, the batch kept as it was, until a second stop gives up (the leases of what
        it held will lapse). Nothing a batch raises ends the thread: a dead settler would
        settle nothing again."""
        conn: psycopg.Connection[Any] | None = None
        while (batch := self._batches.get()) is not None:
            delay = 0.1
            in_doubt = False
            result: Settlement | None = None
            while True:
                self.wake_up.clear()  # set from now on: try again without waiting
                try:
                    if conn is None:
                        conn = connect(self._dsn, "x_jobs settler", patience=self._patience)
                    with self._watch.calling("settler", conn):
                        if in_doubt:
                            result = self.settle_in_doubt(conn, batch)
                        else:
                            result = self.settle_batch(conn, batch)
                    break
                except psycopg.Error as err:
                    gone = conn is None or conn.broken
                    if conn is not None:
                        conn.close()
                    conn = None
                    # The batch's transaction rolled back, unless the connection went during
                    # its commit: the retry first reads which of its jobs are still held.
                    in_doubt = True
                    if self._stopping.requests >= 2:
                        result = Settlement(batch, set(), {})
                        break
                    now = time.monotonic()
                    if now >= self._stopping.exit_by:
                        # The process exits now: the batch stays held, and is left to its
                        # jobs' leases (see Worker._left_to_leases).
                        break
                    logger.warning(
                        "settling: database unreachable; retrying"
                        if gone
                        else "settling failed, not for its values; retrying on a new connection",
                        extra={"retry_in_s": round(delay, 2), "error": described(err)},
                    )
                    self.wake_up.wait(min(delay, self._stopping.exit_by - now))
                    delay = min(delay * 2, 5.0)
                except Exception:
                    # _settle_batch answers for each outcome what the database refuses; this is
                    # the worker's own fault. The jobs' leases will lapse, and they run again.
                    logger.exception("settling a batch failed", extra={"jobs": len(batch)})
                    result = Settlement(batch, set(), {})
                    break
            if result is not None:
                self.settled.put(result)
            self._dispatcher_wake.set()
        if conn is not None:
            conn.close()

    def settle_in_doubt(self, conn: psycopg.Connection[Any], batch: list[Outcome]) -> Settlement:
        """Settle a batch whose last try lost its connection, maybe once committed: only the
        outcomes whose job this worker still holds at that attempt. Sent again as it was, a
        failure that did commit would fail the job's next attempt, if this worker claimed it
        meanwhile. A job no longer held is taken as settled when its row says so (done, or
        gone after a complete for keep_done=false; failed at that attempt); otherwise lost."""
        rows = {
            row[0]: row[1:]
            for row in conn.execute(HELD_AT, [ids_array(o.id for o in batch)]).fetchall()
        }
        held, completed, states = [], set(), {}
        for outcome in batch:
            state, attempt, holder = rows.get(outcome.id, (None, None, None))
            same = attempt == outcome.run.ctx.attempt
            if state == "running" and same and holder == self.worker_id:
                held.append(outcome)
            elif outcome.ok and (state is None or (state == "done" and same)):
                completed.add(outcome.id)
            elif not outcome.ok and same and state in {"ready", "delayed", "dead", "failed"}:
                states[outcome.id] = state
        if not held:
            return Settlement(batch, completed, states)
        settled = self.settle_batch(conn, held)
        return Settlement(batch, completed | settled.completed, {**states, **settled.states})

    def settle_batch(self, conn: psycopg.Connection[Any], batch: list[Outcome]) -> Settlement:
        """Settle a batch together; when one of its values is refused (an output over
        x_jobs.max_payload_bytes, text the database cannot store, a value psycopg cannot send),
        one by one, so that one outcome cannot stop the others, nor this thread. The refused
        transaction rolled back: nothing of it is settled twice. Any other failure is raised,
        for run to send the batch again as it is."""
        try:
            return self.settle_together(conn, batch)
        except Exception as err:
            if not refuses_value(err):
                raise
            logger.warning(
                "settling a batch was refused; settling its jobs one by one",
                extra={"jobs": len(batch), "error": described(err)},
            )
        completed: set[int] = set()
        states: dict[int, str | None] = {}
        for outcome in batch:
            settled = self.settle_alone(conn, outcome)
            if settled is None:
                states[outcome.id] = None
                continue
            completed |= settled.completed
            states.update(settled.states)
        return Settlement(batch, completed, states)

    def settle_alone(self, conn: psycopg.Connection[Any], outcome: Outcome) -> Settlement | None:
        """One outcome: a refused output fails its job for good, saying why; a refused error
        text is sent again in ASCII (a LATIN1 database cannot store a euro sign). None (logged)
        when even that is refused: the job's lease will lapse. Only a refusal of a value does
        any of that (see x_jobs._refusal); any other failure is raised, the outcome kept."""
        escaped = False
        while True:
            try:
                return self.settle_together(conn, [outcome])
            except Exception as err:
                if not refuses_value(err):
                    raise
                reason = str(err).strip() or type(err).__name__
                if outcome.ok:
                    outcome.ok, outcome.output, outcome.retryable = False, None, False
                    outcome.error = f"its output was refused: {reason}"
                elif not escaped:
                    escaped = True
                    outcome.error = ascii_only(outcome.error)
                    outcome.stack = None if outcome.stack is None else ascii_only(outcome.stack)
                else:
                    logger.error(
                        "could not settle a job; its lease will lapse",
                        extra={"job_id": outcome.id, "error": reason},
                    )
                    return None

    def settle_together(self, conn: psycopg.Connection[Any], batch: list[Outcome]) -> Settlement:
        """One transaction: a refusal, or a connection lost before the commit, leaves none of
        the batch settled, so that it can be sent again. A batch of completions alone is one
        statement, atomic as it is: no BEGIN and COMMIT round trips on the common path."""
        completions = [o for o in batch if o.ok]
        completed: set[int] = set()
        states: dict[int, str | None] = {}
        whole = conn.transaction() if len(completions) < len(batch) else contextlib.nullcontext()
        with whole:
            if len(completions) < len(batch):
                # Every row of the transaction first, in id order, as the heartbeat takes them:
                # complete_many and then fail one by one would lock a failure after completions
                # with higher ids, and the heartbeat holding the one and waiting for the others
                # would deadlock with it (a second's stall, then one side aborts).
                extend = [ids_array(o.id for o in batch), self.worker_id, interval(self.lease)]
                if self.fenced:
                    extend.append(attempts_array(o.run.ctx.attempt for o in batch))
                conn.execute(EXTEND_AT if self.fenced else EXTEND, extend)
            if completions:
                params: list[Any] = [
                    ids_array(o.id for o in completions),
                    self.worker_id,
                    # Outputs NULL when every handler answered None (no-op jobs): no array.
                    None
                    if all(o.output is None for o in completions)
                    else [None if o.output is None else Jsonb(o.output) for o in completions],
                ]
                if self.fenced:
                    params.append(attempts_array(o.run.ctx.attempt for o in completions))
                rows = conn.execute(
                    COMPLETE_MANY_AT if self.fenced else COMPLETE_MANY, params
                ).fetchall()
                completed = {row[0] for row in rows}
            for outcome in batch:
                if outcome.ok:
                    continue
                fail: list[Any] = [
                    outcome.id,
                    self.worker_id,
                    storable(outcome.error) or "error",
                    None if outcome.stack is None else storable(outcome.stack),
                    None,
                    outcome.retryable,
                ]
                if self.fenced:
                    fail.append(outcome.run.ctx.attempt)
                row = conn.execute(FAIL_AT if self.fenced else FAIL, fail).fetchone()
                states[outcome.id] = row[0] if row else None
        return Settlement(batch, completed, states)
