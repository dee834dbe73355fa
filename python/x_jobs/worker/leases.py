"""Leases: the worker keeps the jobs it holds with ``x_jobs.extend_lease`` (the heartbeat,
and the confirmation of a job that waited to start) and gives them back with ``x_jobs.release``.

An id that ``extend_lease`` no longer answers was lost (cancelled, or its lease lapsed and
another worker took it): its handler is told to stop and its outcome is dropped. A claimed job
that waited in the local queue a while (a quarter of the heartbeat interval) is confirmed the
same way before its handler starts, so that one cancelled meanwhile never starts. A handler whose
lease went unrenewed too long while the database is silent is told to stop before another worker
may take its job as lapsed.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import LiteralString

import psycopg

from x_jobs import declarations
from x_jobs._leased import Link
from x_jobs._listen import DB_GONE
from x_jobs.jobs import interval
from x_jobs.metrics import WorkerMetrics
from x_jobs.worker._run import Outcome, Run, ids_array

# The worker's log, whichever part writes it: its records carry the package's name, as log
# filters and pipelines match them.
logger = logging.getLogger(__package__)

EXTEND: LiteralString = (
    "SELECT e FROM x_jobs.extend_lease(ids => %s::bigint[], worker => %s, lease => %s) AS e"
)
RELEASE: LiteralString = "SELECT r FROM x_jobs.release(ids => %s::bigint[], worker => %s) AS r"
#: The same with the attempt of each id (x_jobs 0.4.2, the fence): a row this worker holds at
#: another attempt than the one it knows (claimed again after a lapse) is left alone.
EXTEND_AT: LiteralString = (
    "SELECT e FROM x_jobs.extend_lease(ids => %s::bigint[], worker => %s, lease => %s,"
    " attempts => %s::integer[]) AS e"
)
RELEASE_AT: LiteralString = (
    "SELECT r FROM x_jobs.release(ids => %s::bigint[], worker => %s, attempts => %s::integer[])"
    " AS r"
)
#: Does the database take the attempts (the fence's signatures, x_jobs 0.4.2)?
FENCED: LiteralString = (
    "SELECT pg_catalog.to_regprocedure("
    "'x_jobs.complete_many(bigint[], text, jsonb[], integer[])') IS NOT NULL"
)


def attempts_array(attempts: Iterable[int | None]) -> str:
    """Attempts as an integer[] literal (NULL: not checked), as ids_array makes the ids'."""
    return "{" + ",".join("NULL" if a is None else str(a) for a in attempts) + "}"


ROW_STATES: LiteralString = "SELECT id, state FROM x_jobs.job_states(ids => %s::bigint[])"
#: The rows this worker holds in the database, less those it knows of (see sweep_unknown).
UNKNOWN_HELD: LiteralString = (
    "SELECT id FROM x_jobs.held_jobs(worker => %s) WHERE NOT id = ANY(%s::bigint[])"
)


class Leases:
    """The leases of the jobs a worker holds (``held``, the dispatcher's map, touched on its
    thread; ``stop_unrenewed`` runs on the watch thread and only reads it). ``start_lock``
    serializes a handler's start with a hand-back or a loss of the same job: a job is either
    started here or released (or lost) and never started, not both."""

    def __init__(
        self,
        *,
        link: Link,
        worker_id: str,
        lease: float,
        heartbeat_interval: float,
        held: dict[int, Run],
        metrics: WorkerMetrics,
        tell_stop: Callable[[Run, str], None],
        dispatcher_wake: threading.Event,
    ) -> None:
        self._link = link
        self._watch = link.watch
        self.worker_id = worker_id
        self.lease = lease
        self.heartbeat_interval = heartbeat_interval
        self._held = held
        self.metrics = metrics
        self._tell_stop = tell_stop
        self._dispatcher_wake = dispatcher_wake
        self.start_lock = threading.Lock()
        #: A claimed job that waited in the local queue longer than this since the worker last
        #: knew it held it is confirmed (extend_lease) before its handler starts: a cancel that
        #: came meanwhile is seen by the next heartbeat only, too late to keep it from starting.
        self.confirm_after = heartbeat_interval / 4
        #: When the last heartbeat that was answered was sent: every job held then was held.
        self.confirmed_at = 0.0
        #: The runs an executor found waiting past confirm_after, for the dispatcher to confirm.
        self.unconfirmed: queue.SimpleQueue[Run] = queue.SimpleQueue()
        #: Jobs to hand back (release) once the database answers: their runs are over (never
        #: started, or stopped); if the worker exits first, they are left to their leases.
        self.unreleased: list[Run] = []
        #: A running handler whose lease this worker has not renewed for this long (the
        #: database away, or its calls hanging) is told to stop: the lease may lapse soon, and
        #: another worker could then run the job beside it. A heartbeat interval or a quarter of
        #: the lease (at most half) is left to stop in before the lapse.
        self.unrenewed_after = lease - min(max(heartbeat_interval, lease / 4), lease / 2)
        #: Pass the attempts the worker holds (see EXTEND_AT): set at the start where the
        #: database takes them.
        self.fenced = False

    def heartbeat(self) -> bool:
        """Extend the leases of the held jobs; stop those that were lost. False when the
        database did not answer. A finished job whose outcome waits for its settlement is
        extended too: were its lease to lapse first, a claim could run it again."""
        if not self._held:
            return True
        sent = time.monotonic()
        held = self.extend(self._held)
        if held is None:
            return False
        # A finished one that was not extended is settled already, or its settlement will say
        # that the worker lost it.
        gone = [run for job_id, run in self._held.items() if not run.done and job_id not in held]
        if gone:
            self.drop_gone(gone)
        # Only now: a run that an executor takes meanwhile is not taken as confirmed before the
        # runs that this heartbeat found gone are marked so (see Executors.begin).
        self.confirmed_at = sent
        return True

    def extend(self, ids: Iterable[int]) -> set[int] | None:
        """extend_lease of ``ids``: those this worker still holds, or None when the database did
        not answer (the connection is dropped, for the loop to reconnect)."""
        assert self._link.conn is not None
        ids = list(ids)
        try:
            if self.fenced:
                attempts = [run.ctx.attempt if run else None for run in map(self._held.get, ids)]
                rows = self._link.query(
                    EXTEND_AT,
                    [
                        ids_array(ids),
                        self.worker_id,
                        interval(self.lease),
                        attempts_array(attempts),
                    ],
                )
            else:
                rows = self._link.query(
                    EXTEND, [ids_array(ids), self.worker_id, interval(self.lease)]
                )
        except DB_GONE as err:
            self._link.lost(err)
            return None
        return {row[0] for row in rows}

    def sweep_unknown(self, handing_back: Iterable[int]) -> None:
        """Hand back the jobs the database says this worker holds and that it does not know of:
        a claim whose answer was lost may have committed, its rows this worker's for a lease.
        They would wait that lease out, and one on its final attempt would then be buried
        without having run. Asked at each heartbeat for a lease after such a loss."""
        known = [*self._held, *(run.ctx.id for run in self.unreleased), *handing_back]
        try:
            ids = [
                row[0] for row in self._link.query(UNKNOWN_HELD, [self.worker_id, ids_array(known)])
            ]
            if not ids:
                return
            released = self._link.query(RELEASE, [ids_array(ids), self.worker_id])
        except DB_GONE as err:
            self._link.lost(err)
            return
        logger.warning(
            "handed back jobs taken by a claim whose answer was lost",
            extra={"job_ids": ids, "released": len(released)},
        )

    def drop_gone(self, runs: list[Run]) -> None:
        """The held runs that extend_lease did not answer: none starts from now on, a running
        handler is told to stop, and the worker forgets them (nothing to settle)."""
        assert self._link.conn is not None
        # Say why: an operator's cancel, or a lease another worker took over.
        try:
            states = dict(self._link.query(ROW_STATES, [ids_array(run.ctx.id for run in runs)]))
        except DB_GONE as err:
            self._link.lost(err)
            states = {}
        with self.start_lock:  # none of them starts from now on (see hand_back)
            for run in runs:
                run.done = True
        for run in runs:
            job_id = run.ctx.id
            if self._held.get(job_id) is run:
                del self._held[job_id]
            if states.get(job_id) == "suspended":
                # Its handler suspended it (a sleep, a wait) and its outcome is on the way.
                self.metrics.settled(run.job.name, "suspended")
                continue
            reason = "cancelled" if states.get(job_id) == "cancelled" else "lost"
            self._tell_stop(run, reason)
            logger.warning(
                "job cancelled"
                if reason == "cancelled"
                else "job lost: its lease went to another worker",
                extra={"job_id": job_id, "job": run.job.name, "started": run.started is not None},
            )
            self.metrics.settled(run.job.name, reason)

    def confirm(self, dispatch: Callable[[list[Run]], None]) -> bool:
        """Start the runs that an executor found waiting past confirm_after (see
        Executors.begin) once extend_lease answers that this worker still holds them, all of
        them in one call (``dispatch`` puts them in their executors' queue); drop
        the others, cancelled or lost while they waited (they never ran: nothing to settle).
        False when the database did not answer: they wait for the reconnect."""
        runs: list[Run] = []
        with contextlib.suppress(queue.Empty):
            while True:
                runs.append(self.unconfirmed.get_nowait())
        runs = [run for run in runs if not run.done]  # handed back or lost meanwhile
        if not runs:
            return True
        sent = time.monotonic()
        # Those a heartbeat confirmed since they were put back need no other check.
        stale = [run for run in runs if not self.fresh(run, sent)]
        if stale:
            held = self.extend(run.ctx.id for run in stale)
            if held is None:
                for run in runs:
                    self.unconfirmed.put(run)
                return False
            for run in stale:
                if run.ctx.id in held:
                    run.checked = sent
            gone = [run for run in stale if run.ctx.id not in held]
            if gone:
                self.drop_gone(gone)
        dispatch([run for run in runs if not run.done])
        return self._link.conn is not None  # lost by drop_gone's question, maybe

    def fresh(self, run: Run, now: float) -> bool:
        """Did this worker know it held the job a short while ago (see confirm_after)?"""
        return now - max(run.checked, self.confirmed_at) <= self.confirm_after

    def hand_back(self, *, started: bool, reason: str, returned_by: float | None = None) -> int:
        """Give jobs back to the queue (x_jobs.release): those not started yet, or (started=True)
        every one still held, whose handlers are told to stop. Answers how many.

        ``returned_by`` (monotonic): the handlers told to stop are waited for until then, and
        their jobs released only once they returned (or the time is up). Released at once, a
        job could start elsewhere while its handler here had yet to see the stop; what they
        answer is dropped all the same."""
        # Under the start lock: a run is either marked started by _begin, and then kept unless
        # started=True, or marked done here first, and then _begin never starts it.
        with self.start_lock:
            runs = [
                run
                for run in self._held.values()
                if not run.done and (started or run.started is None)
            ]
            for run in runs:
                run.done = True
        for run in runs:
            self._tell_stop(run, reason)
        if returned_by is not None:
            running = [run for run in runs if run.started is not None]
            while any(not run.returned for run in running):
                left = returned_by - time.monotonic()
                if left <= 0:
                    break
                # An executor wakes the dispatcher when it leaves an outcome (see Executors._nudge).
                if self._dispatcher_wake.wait(min(left, 0.05)):
                    self._dispatcher_wake.clear()
        return self.release(runs)

    def release(self, runs: list[Run]) -> int:
        """x_jobs.release the jobs of `runs` (marked done): due again at once, the attempt not
        counted. Answers how many the database released."""
        ids = [run.ctx.id for run in runs]
        if not ids:
            return 0
        try:
            if self._link.conn is None:
                raise psycopg.OperationalError("no connection to the database")
            if self.fenced:
                attempts = attempts_array(run.ctx.attempt for run in runs)
                rows = self._link.query(RELEASE_AT, [ids_array(ids), self.worker_id, attempts])
            else:
                rows = self._link.query(RELEASE, [ids_array(ids), self.worker_id])
        except DB_GONE as err:
            # Handed back once the database answers (they run no more here, and are not
            # extended meanwhile); if the worker exits first, they are left to their leases.
            for run in runs:
                self._held.pop(run.ctx.id, None)
            self.unreleased += runs
            if self._link.conn is not None:
                self._link.lost(err)
            return 0
        except psycopg.Error as err:
            logger.warning(
                "could not hand jobs back; their leases will lapse", extra={"error": str(err)}
            )
            for run in runs:  # not held any more: not extended, and not waited for
                self._held.pop(run.ctx.id, None)
            return 0
        for run in runs:
            self._held.pop(run.ctx.id, None)
            self.metrics.settled(run.job.name, "released")
        logger.info("handed jobs back", extra={"released": len(rows)})
        return len(rows)

    def stop_unrenewed(self, now: float) -> None:
        """On the watch thread: tell the running handlers whose lease went unrenewed for
        unrenewed_after to stop, while the worker cannot reach the database (its connection
        lost and not back, or a call waiting a heartbeat interval that a new connection could
        not get an answer beside): another worker may then be taking the job as lapsed. The
        worker cannot tell a server down for everyone from a network that cut it off alone, so
        a long outage stops handlers too. Not a call that waits while the server answers (a lock
        held elsewhere, a busy server): no claim takes the job meanwhile. Every job held was
        renewed at the last heartbeat answered, or claimed after it."""
        if now - self.confirmed_at < self.unrenewed_after:
            return
        if now - self._watch.awake_since < self.heartbeat_interval:
            return  # the process was stopped: its dispatcher gets a heartbeat to catch up
        if not self._watch.silent and not self._watch.unanswered(now, self.heartbeat_interval):
            return
        stopped = [
            run
            for run in list(self._held.values())
            if run.started is not None
            and not run.done
            and not run.ctx.is_cancelled()
            and now - max(run.checked, self.confirmed_at) >= self.unrenewed_after
        ]
        for run in stopped:
            run.unrenewed = True
            self._tell_stop(run, "lease")
        if stopped:
            logger.warning(
                "the database is silent and these jobs' leases went unrenewed; their handlers "
                "are told to stop before another worker may take the jobs",
                extra={"job_ids": [run.ctx.id for run in stopped], "lease_s": self.lease},
            )

    def drop_stale(self, old: Run, pending: list[Outcome]) -> list[Outcome]:
        """This worker claimed a job it still ran, or whose outcome it had yet to send: its
        lease had lapsed (the database was away past it), or an operator cancelled and retried
        it before a heartbeat told this worker of the cancel. The old attempt is over: its
        handler is told to stop, and its outcome must not settle the new attempt. (A failed
        attempt whose settlement is out, made due again at once, is claimed again in the normal
        way.) Answers ``pending`` without the old attempt's outcome."""
        with self.start_lock:
            old.done = True
        self._tell_stop(old, "lost")
        logger.warning(
            "job claimed again by this worker while it still held an earlier attempt (its lease "
            "lapsed, or it was cancelled and retried); the earlier attempt is dropped",
            extra={"job_id": old.ctx.id, "job": old.job.name, "attempt": old.ctx.attempt},
        )
        return [o for o in pending if o.run is not old]

    def left_to_leases(self) -> None:
        """Exiting: say what the worker leaves behind without handing it back or settling it
        (the database did not answer). Each job stays claimed until its lease lapses; then
        another worker runs it again (an outcome not settled is lost, not the job)."""
        unsettled = len(self._held)  # finished, their outcomes not settled
        left = unsettled + len(self.unreleased)
        if left:
            logger.warning(
                "exiting without the database: jobs left to their leases (other workers run "
                "them again once the leases lapse)",
                extra={
                    "left_to_leases": left,
                    "unsettled": unsettled,
                    "not_handed_back": len(self.unreleased),
                },
            )


class UnknownJobs:
    """Claimed jobs this worker has no handler for, handed back (x_jobs.hand_back): the attempt
    is not spent, and the row is not due again at once (delayed for a worker that serves the
    name, or parked until one announces it), so this worker neither runs it nor claims it again
    in a loop. Logged once per name. Without the database they wait here (``pending``) for the
    reconnect: a lease that lapsed meanwhile would cost the job an attempt."""

    def __init__(self, *, link: Link, worker_id: str, metrics: WorkerMetrics) -> None:
        self._link = link
        self.worker_id = worker_id
        self.metrics = metrics
        #: By id, to hand back once the database answers; and the names said so of.
        self.pending: dict[int, str] = {}
        self._names: set[str] = set()

    def hand_back(self, unknown: dict[int, str]) -> None:
        """Hand back ``unknown`` and those left over from a hand-back not answered."""
        pending = {**self.pending, **unknown}
        self.pending = {}
        try:
            if self._link.conn is None:
                raise psycopg.OperationalError("no connection to the database")
            with self._link.calling() as conn:
                handed = declarations.hand_back(conn, pending, self.worker_id)
        except DB_GONE as err:
            self.pending = pending
            if self._link.conn is not None:
                self._link.lost(err)
            return
        except psycopg.Error as err:
            logger.warning(
                "could not hand back jobs this worker has no handler for; their leases will lapse",
                extra={"job_ids": sorted(pending), "error": str(err).strip()},
            )
            for name in pending.values():
                self.metrics.settled(name, "lost")
            return
        for row in handed:
            self.metrics.settled(row.name, "handed_back")
            if row.name in self._names:
                continue
            self._names.add(row.name)
            logger.warning(
                f"no handler for job {row.name!r} in this worker; handed back "
                f"({declarations.describe(row)})",
                extra={"job": row.name, "parked": row.parked, "served_by": row.served_by},
            )
        # Not handed back (no longer held: its lease lapsed meanwhile, or it was cancelled).
        for job_id in pending.keys() - {row.id for row in handed}:
            self.metrics.settled(pending[job_id], "lost")
