"""The worker: claim with ``x_jobs.claim``, run handlers, settle with ``x_jobs.complete_many``
and ``x_jobs.fail``, keep leases alive with ``x_jobs.extend_lease``.

One dispatcher thread (this module's :class:`Worker`) owns the bookkeeping and the connection
that claims and heartbeats; the settler (:mod:`x_jobs.worker.settle`) owns a second connection
and settles finished jobs in batches, so that the server settles one batch while it claims the
next. Handlers run on executor threads or an event loop (:mod:`x_jobs.worker._handlers`); a
finished handler drops its outcome in a queue and wakes the dispatcher. The leases, their
heartbeat and hand-backs are :mod:`x_jobs.worker.leases`; the schedules' sync at the start and
their ticks, on a thread and connection of their own, :mod:`x_jobs.worker._ticker`.

The dispatcher claims when a notification names one of its queues, when the poll interval has
passed (no notification comes for a delayed row becoming due or a lease lapsing), and at once
after a claim that filled every free slot (more may be waiting). A claimed job the App has no
handler for is handed back (``x_jobs.hand_back``): its attempt is not spent, and it waits for a
worker that declares it (see :mod:`x_jobs.declarations`).

Stopping: the first SIGTERM or SIGINT drains (announce draining, claim nothing more, let running
jobs finish within ``grace``, hand the rest back with ``x_jobs.release``); a second one stops at
once. Handing back a job whose handler still runs is safe only when the process ends with the
worker (``x-jobs worker``); embedded in a process that lives on, the worker keeps such jobs until
their handlers return. A lost connection is retried with backoff while handlers keep running;
their outcomes wait in memory until the database answers again. Meanwhile timeouts still tell
their handlers to stop, and a drain keeps its grace: when it runs out, ``x-jobs worker`` exits
without waiting for the database, and what it still holds is left to its lease (another worker
runs it again once the lease lapses). Nor does anything else keep it: the grace counts from the
signal, and HAND_BACK_SECONDS after it (or after a second signal) the calls still waiting, on a
lock another session holds as on a silent server, are abandoned and the process exits.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import psycopg

from x_jobs import _leased as leased
from x_jobs import declarations
from x_jobs._conn import connect
from x_jobs._leased import ClaimPacer, Link, Reconnect, Stopping, default_id
from x_jobs._listen import DB_GONE, LISTEN_DSN_ENV, listen
from x_jobs._watch import for_leases, patience
from x_jobs.app import App
from x_jobs.context import AsyncJobContext as AsyncJobContext
from x_jobs.context import CancelEvent as CancelEvent
from x_jobs.context import JobContext as JobContext
from x_jobs.declarations import ANNOUNCE as ANNOUNCE
from x_jobs.declarations import ANNOUNCE_JOBS as ANNOUNCE_JOBS
from x_jobs.errors import JobCancelled as JobCancelled
from x_jobs.errors import PermanentError as PermanentError
from x_jobs.errors import PermissionDenied, translate
from x_jobs.jobs import Seconds, interval, seconds
from x_jobs.metrics import DEFAULT_HOST, GAUGE_INTERVAL, WorkerMetrics
from x_jobs.steps import StepStore
from x_jobs.worker import _ticker
from x_jobs.worker._handlers import Executors
from x_jobs.worker._prefetch import PrefetchSizer
from x_jobs.worker._run import Outcome, Run, Settlement, ids_array, unknown_job
from x_jobs.worker.leases import EXTEND as EXTEND
from x_jobs.worker.leases import FENCED, Leases, UnknownJobs
from x_jobs.worker.leases import RELEASE as RELEASE
from x_jobs.worker.leases import ROW_STATES as ROW_STATES
from x_jobs.worker.leases import UNKNOWN_HELD as UNKNOWN_HELD
from x_jobs.worker.settle import CLAIM as CLAIM
from x_jobs.worker.settle import COMPLETE_MANY as COMPLETE_MANY
from x_jobs.worker.settle import FAIL as FAIL
from x_jobs.worker.settle import HELD_AT as HELD_AT
from x_jobs.worker.settle import Settler

logger = logging.getLogger(__name__)

# The run records under the names x_jobs.worker gave them (tests and bench/prepared.py use them).
_Run, _Outcome, _Settlement, _ids = Run, Outcome, Settlement, ids_array

#: How long ``x-jobs worker`` goes on, once its drain's grace has run out (or a second stop
#: came), handing back what it holds and settling what finished (at the grace, the handlers it
#: tells to stop get the first half of it to return): a database call still waiting then is
#: abandoned, and the worker exits, leaving what it still holds to its leases.
HAND_BACK_SECONDS = 2.0


def default_worker_id() -> str:
    return default_id()


class Worker:
    """Runs the jobs of ``app`` from ``queues`` (default: the queues of its declared jobs).

    ``concurrency`` handlers run at once; up to ``prefetch`` more claimed jobs wait in a local
    queue, so that claims and settlements go to the database in batches (a claim asks for as many
    jobs as there is room for, once half the room is free). A prefetched job holds its lease like
    a running one; its timeout starts when its handler does, and a drain hands it back at once.
    Without ``prefetch``, the local queue holds about half a second of the jobs' work, from
    ``concurrency`` (jobs of a second or more) to 500 (jobs of a millisecond).

    ``metrics_port``: serve Prometheus metrics there, on ``metrics_host`` (default every IPv4
    interface; ``127.0.0.1`` keeps them on this machine), the queue gauges read every
    ``gauge_interval`` (see ``x_jobs.metrics``).

    ``listen_dsn`` (default ``X_JOBS_LISTEN_DSN``, else ``app.dsn``): where the worker LISTENs
    for the notifications that wake it, when ``app.dsn`` goes through a pooler in transaction
    mode, which drops them (docs/poolers.md).

    ``tick_schedules``: fire the database's due schedules at each whole minute (on a thread and
    a connection of its own, see x_jobs.worker._ticker); off where pg_cron or ``x-jobs tick``
    does it. The app's schedules are written at the start either way.
    """

    def __init__(
        self,
        app: App,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        prefetch: int | None = None,
        lease: Seconds = 30,
        poll_interval: Seconds = 1.0,
        heartbeat_interval: Seconds | None = None,
        announce_interval: Seconds = 10,
        settle_delay: Seconds = 0.005,
        grace: Seconds = 30,
        worker_id: str | None = None,
        build: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = DEFAULT_HOST,
        gauge_interval: Seconds = GAUGE_INTERVAL,
        check_version: bool = True,
        listen_dsn: str | None = None,
        tick_schedules: bool = True,
    ) -> None:
        self.app = app
        self.queues = sorted(set(queues or {job.queue for job in app.jobs.values()}))
        if not self.queues:
            raise ValueError("the worker has no queue to serve: declare a job or pass queues")
        # A worker never holds more than a claim can hand out (qty 1000): past that, threads
        # would only wait.
        if not 1 <= concurrency <= 1000:
            raise ValueError(f"concurrency must be 1 to 1000, not {concurrency}")
        self.concurrency = concurrency
        # Without a prefetch, the local queue follows the jobs' run times (see _prefetch).
        self._sizer = PrefetchSizer(concurrency) if prefetch is None else None
        self.prefetch = self._sizer.size if self._sizer else max(0, prefetch or 0)
        # What the worker may hold at once, running or waiting, and the claim that is worth a
        # round trip: at least half of it, unless nothing is held at all.
        self.capacity = min(1000, self.concurrency + self.prefetch)
        self.lease = seconds(lease)
        self.poll_interval = seconds(poll_interval)
        self.heartbeat_interval = leased.heartbeat_interval(
            self.lease, None if heartbeat_interval is None else seconds(heartbeat_interval)
        )
        if self.heartbeat_interval >= self.lease:
            raise ValueError(
                f"heartbeat_interval ({self.heartbeat_interval:g} s) must be shorter than the "
                f"lease ({self.lease:g} s): leases would lapse between heartbeats"
            )
        self.announce_interval = seconds(announce_interval)
        self.settle_delay = seconds(settle_delay)
        self.grace = seconds(grace)
        self.worker_id = worker_id or default_worker_id()
        self.build = build
        self.check_version = check_version
        # Served at metrics_host:metrics_port, with the queue gauges read every gauge_interval
        # on a connection of their own (see metrics.QueueGauges).
        self.metrics = WorkerMetrics(
            metrics_port,
            metrics_host,
            dsn=app.dsn,
            queues=self.queues,
            gauge_interval=seconds(gauge_interval),
        )
        self.metrics.declare(name for name, job in app.jobs.items() if job.queue in self.queues)
        #: Where the listener LISTENs, when not at app.dsn (None): a direct or session-mode DSN
        #: when app.dsn goes through a pooler in transaction mode (see x_jobs._listen).
        self.listen_dsn = listen_dsn or os.environ.get(LISTEN_DSN_ENV) or None
        self._patience = patience(self.lease)
        self._step_store = StepStore(app.dsn, concurrency, patience=self._patience)
        self.tick_schedules = tick_schedules
        #: Made at the start where the database has schedules and the worker ticks them.
        self._ticker: _ticker.Ticker | None = None

        #: Every job claimed and not yet settled (or dropped), running or waiting to run: the
        #: dispatcher's, shared with the leases and the settler's accounting (its thread only).
        self._held: dict[int, Run] = {}
        self._wake = threading.Event()
        self._notified = threading.Event()
        self._stopped = threading.Event()
        #: The stop requests, and (its exit_by) when the worker must be done with the database:
        #: a drain's grace plus HAND_BACK_SECONDS in a process that ends with the worker, a
        #: second stop's moment plus that in any. Past it the watch abandons the calls in
        #: progress (see _tick): none keeps a stopped worker from exiting, whatever it waits for
        #: (a lock, a server that works on it for good).
        self._stopping = Stopping(self._wake, logger, self._count_stop)
        self._draining = False
        self._drain_deadline = 0.0
        self._process_exits = False
        #: Watches the calls of the dispatcher and the settler (see CallWatch), and runs
        #: the leases' stop_unrenewed while the dispatcher may be blocked.
        self._watch = for_leases(
            "x_jobs-watch",
            app.dsn,
            lease=self.lease,
            heartbeat_interval=self.heartbeat_interval,
            on_tick=self._tick,
        )
        self._link = Link(self._watch, "dispatcher", logger)
        self._leases = Leases(
            link=self._link,
            worker_id=self.worker_id,
            lease=self.lease,
            heartbeat_interval=self.heartbeat_interval,
            held=self._held,
            metrics=self.metrics,
            tell_stop=self._tell_stop,
            dispatcher_wake=self._wake,
        )
        self._unknown = UnknownJobs(link=self._link, worker_id=self.worker_id, metrics=self.metrics)
        self._executors = Executors(
            app=app,
            concurrency=concurrency,
            settle_delay=self.settle_delay,
            grace=self.grace,
            leases=self._leases,
            wake=self._wake,
        )
        self._settler = Settler(
            dsn=app.dsn,
            worker_id=self.worker_id,
            lease=self.lease,
            capacity=self.capacity,
            settle_delay=self.settle_delay,
            patience=self._patience,
            watch=self._watch,
            stopping=self._stopping,
            held=self._held,
            metrics=self.metrics,
            dispatcher_wake=self._wake,
        )
        #: Until then, a claim whose answer was lost may have committed: the jobs it took are
        #: this worker's in the database and unknown here (see Leases.sweep_unknown).
        self._claims_in_doubt_until = 0.0
        #: The database records declarations and takes hand-backs: read at the start.
        self._declares = False
        #: No longer than a heartbeat apart: after a restart a claim leaves alone, for one lease,
        #: the jobs whose leases ran out while the server was down, so that their holders can
        #: reconnect and renew them first (see x_jobs.claim).
        self._reconnect = Reconnect(cap=min(5.0, self.heartbeat_interval))

    # --- public -------------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True, process_exits: bool = False) -> None:
        """Serve until stopped (``stop()`` or a signal); blocks the calling thread.

        ``process_exits``: the process ends when this returns (``x-jobs worker``), which ends
        the handlers still running, so a drain whose grace runs out hands their jobs back at
        once. Otherwise a handler cannot be stopped from outside (Python cannot kill a thread),
        and its job, handed back while it ran on, could run twice at once: the worker tells it
        to stop and keeps the job, extending its lease, until it returns."""
        self._process_exits = process_exits
        if install_signals:
            self._stopping.install_signals()
        logger.info(
            "worker starting",
            extra={
                "worker": self.worker_id,
                "queues": self.queues,
                "concurrency": self.concurrency,
                "prefetch": "auto" if self._sizer else self.prefetch,
            },
        )
        self._connect(first=True)
        self._start_threads()
        self.metrics.start()
        try:
            self._loop_forever()
        except psycopg.errors.InsufficientPrivilege as err:
            # A login without x_jobs_worker: refused at its first claim or announce.
            raise PermissionDenied.of(err) from err
        except psycopg.Error as err:
            # An x_jobs refusal of the worker's own arguments (X_QUEUES_INVALID for a queue
            # named ''), typed as everywhere else; any other error as it is.
            typed = translate(err)
            if typed is err:
                raise
            raise typed from err
        finally:
            self._shutdown_threads()
            self._link.close()
            self.metrics.close()
            self._step_store.close()
            self._stopped.set()
            logger.info("worker stopped", extra={"worker": self.worker_id})

    def stop(self) -> None:
        """Drain: claim nothing more, hand back what has not started, let what runs finish
        (within grace), hand back the rest (see ``run``). A second call stops at once: it hands
        back every job still held, and the handlers still running run on beside whichever
        worker takes their jobs next, unless the process ends with them."""
        self._stopping.stop()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # --- the parts, as the tests and the loop reach them --------------------------------------

    @property
    def _conn(self) -> psycopg.Connection[Any] | None:
        """The dispatcher's connection, None while lost."""
        return self._link.conn

    @_conn.setter
    def _conn(self, conn: psycopg.Connection[Any] | None) -> None:
        self._link.conn = conn

    @property
    def _stop_requests(self) -> int:
        return self._stopping.requests

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping.on_signal(signum, frame)

    @property
    def _inbox(self) -> queue.SimpleQueue[Run | None]:
        return self._executors.inbox

    @property
    def _outbox(self) -> queue.SimpleQueue[Outcome]:
        return self._executors.outbox

    @property
    def _settled(self) -> queue.SimpleQueue[Settlement]:
        return self._settler.settled

    def _execute_sync(self) -> None:
        self._executors.execute_sync()

    def _settle_batch(self, conn: psycopg.Connection[Any], batch: list[Outcome]) -> Settlement:
        return self._settler.settle_batch(conn, batch)

    def _settle_together(self, conn: psycopg.Connection[Any], batch: list[Outcome]) -> Settlement:
        return self._settler.settle_together(conn, batch)

    def _take_settled(self) -> None:
        self._settler.take_settled()

    def _hand_back(self, *, started: bool, reason: str, returned_by: float | None = None) -> int:
        return self._leases.hand_back(started=started, reason=reason, returned_by=returned_by)

    def _tell_stop(self, run: Run, reason: str) -> None:
        self._executors.tell_stop(run, reason)

    # --- the dispatcher -----------------------------------------------------------------------

    def _count_stop(self, requests: int, now: float) -> None:
        """One more stop request. The drain's grace counts from the first, not from when the
        dispatcher sees it (it may be blocked in a call); from the second on, the worker stops
        at once. Sets the time by which it must be done (Stopping.exit_by). Takes no lock: it
        runs in a signal handler too."""
        stopping = self._stopping
        if requests == 1:
            if self._process_exits:
                stopping.exit_by = min(stopping.exit_by, now + self.grace + HAND_BACK_SECONDS)
        else:
            stopping.exit_by = min(stopping.exit_by, now + HAND_BACK_SECONDS)

    def _past_grace(self, now: float) -> bool:
        """Is this a process that ends with the worker, past its drain's grace? Then it waits for
        nothing more: not a heartbeat, a reconnect, nor a settlement's retry."""
        return self._process_exits and self._draining and now >= self._drain_deadline

    def _loop_forever(self) -> None:
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        next_announce = 0.0
        pacer = ClaimPacer(self.poll_interval, self._notified)
        while True:
            if self._conn is None:
                # Lost by whichever call noticed it last turn: nothing below runs without it.
                if not self._pause_for_database():
                    return
                # Back: extend every lease this worker holds before it claims. A lease that
                # lapsed meanwhile is this worker's again, and no claim of its own takes that
                # job as lapsed, to run it a second time beside the first. A drain that began
                # meanwhile is announced at once.
                next_heartbeat = next_announce = 0.0
                if self._leases.unreleased:
                    runs, self._leases.unreleased = self._leases.unreleased, []
                    self._leases.release(runs)
                    if self._conn is None:
                        continue
                if self._unknown.pending:
                    self._unknown.hand_back({})
                    if self._conn is None:
                        continue
            now = time.monotonic()
            if self._stopping.requests >= 2:
                self._stop_now()
                return
            if self._stopping.requests == 1 and not self._draining:
                self._begin_drain(now)
                next_announce = 0.0
            if self._past_grace(now):
                self._exit_at_grace()
                return

            self._take_settled()
            self._collect(now)
            next_deadline = self._executors.check_deadlines(now, self._held)
            if self._conn is None:
                continue  # lost by a hand-back (a drain's, or of a job stopped by it)
            if self._settler.due(now, draining=self._draining):
                self._settler.submit()

            if now >= next_heartbeat:
                if not self._leases.heartbeat() or self._conn is None:
                    continue  # the top of the loop reconnects, then extends the leases
                next_heartbeat = now + self.heartbeat_interval
                if now < self._claims_in_doubt_until:
                    self._leases.sweep_unknown(self._unknown.pending)
                    if self._conn is None:
                        continue
            if now >= next_announce:
                self._announce()
                if self._conn is None:
                    continue
                next_announce = now + self.announce_interval
            if not self._leases.unconfirmed.empty() and not self._leases.confirm(
                self._executors.dispatch
            ):
                continue

            if self._draining:
                if not self._held and not self._leases.unreleased:
                    return
                if now >= self._drain_deadline:
                    if self._process_exits:
                        self._exit_at_grace()
                        return
                    self._outlast_grace()
            else:
                room = self._room()
                if pacer.due(now) and pacer.room_for(room, self.capacity, bool(self._held)):
                    got = self._claim(room)
                    if got is None:
                        continue
                    pacer.claimed(got, room)

            wake_at = next_heartbeat if self._draining else min(next_heartbeat, pacer.next_poll)
            # A timeout or the drain's grace is acted on when it comes, not at the next poll.
            if self._draining:
                wake_at = min(wake_at, self._drain_deadline)
            if next_deadline is not None:
                wake_at = min(wake_at, next_deadline)
            # While a settlement is in flight the next waits for it (one at a time), and its
            # end wakes this loop: a wake-up for the settle delay would only spin until then.
            if self._settler.pending and not self._settler.settling:
                wake_at = min(wake_at, self._settler.pending_since + self.settle_delay)
            if self._wake.wait(timeout=min(max(0.0, wake_at - time.monotonic()), 1.0)):
                self._wake.clear()

    def _room(self) -> int:
        """How many jobs a claim may take now. A finished job waiting for its settlement holds
        no slot: counting it would keep the next claim waiting for the settle's round trip, so
        that claims and settlements would take turns instead of overlapping. What waits to be
        settled is bounded all the same: the worker never holds more than twice its capacity."""
        unsettled = len(self._settler.pending) + self._settler.settling_size
        return min(
            self.capacity - (len(self._held) - unsettled), 2 * self.capacity - len(self._held)
        )

    def _claim(self, room: int) -> int | None:
        assert self._conn is not None
        sent = time.monotonic()
        try:
            rows = self._link.query(
                CLAIM, [self.queues, self.worker_id, interval(self.lease), room]
            )
        except DB_GONE as err:
            self._link.lost(err)
            self._claims_in_doubt_until = time.monotonic() + self.lease
            return None
        executors = self._executors
        claimed = 0
        per_job: dict[str, int] = {}
        async_runs: list[Run] = []
        unknown: dict[int, str] = {}
        for (
            job_id,
            name,
            queue_name,
            state,
            payload,
            attempt,
            max_attempts,
            run_id,
            tenant,
            created_at,
        ) in rows:
            if state != "running":
                # Buried by this claim: its lease lapsed on the final attempt.
                logger.warning(
                    "job buried: its lease lapsed on the final attempt",
                    extra={"job_id": job_id, "job": name, "state": state},
                )
                self.metrics.settled(name, state, held=False)
                continue
            claimed += 1
            old = self._held.get(job_id)
            if old is not None and (
                not old.done or any(o.run is old for o in self._settler.pending)
            ):
                self._settler.pending = self._leases.drop_stale(old, self._settler.pending)
            job = self.app.jobs.get(name)
            if job is None and self._declares:
                unknown[job_id] = name
                per_job[name] = per_job.get(name, 0) + 1
                continue
            ctx = (AsyncJobContext if job is not None and job.is_async else JobContext)(
                id=job_id,
                name=name,
                queue=queue_name,
                attempt=attempt,
                max_attempts=max_attempts,
                run_id=run_id,
                tenant_id=tenant,
                worker=self.worker_id,
                created_at=created_at,
                _store=self._step_store,
                _app=self.app,
            )
            run = Run(job or unknown_job(self.app, name), ctx, payload, checked=sent)
            self._held[job_id] = run
            if job is not None and job.timeout is not None:
                executors.timed[job_id] = run
            per_job[name] = per_job.get(name, 0) + 1
            if job is None:
                executors.outbox.put(
                    Outcome(run, ok=False, error=f"no handler for job {name!r} in this worker")
                )
            elif job.is_async:
                async_runs.append(run)
            else:
                executors.inbox.put(run)
        if async_runs:
            assert executors.loop is not None
            # One wake-up of the event loop for the claim's async runs: one each (a thread-safe
            # call, a future chained to each task) costs several times the job's own CPU.
            executors.loop.call_soon_threadsafe(executors.start_async, async_runs)
        for name, count in per_job.items():
            self.metrics.claimed(name, count)
        if unknown:
            self._unknown.hand_back(unknown)
        return claimed

    def _collect(self, now: float) -> None:
        """Take the outcomes the handlers left, and queue each one for its settlement."""
        outbox, settler = self._executors.outbox, self._settler
        while True:
            try:
                outcome = outbox.get_nowait()
            except queue.Empty:
                return
            run = self._held.get(outcome.id)
            if run is None or run is not outcome.run or run.done:
                continue
            run.done = True
            if outcome.suspended:
                # The row is no longer this worker's: suspended in SQL by the step itself.
                del self._held[outcome.id]
                self.metrics.settled(run.job.name, "suspended")
                continue
            if (
                (run.outlasted or run.unrenewed)
                and not run.timed_out
                and not outcome.ok
                and not outcome.lost
            ):
                # Stopped by the drain, or for want of a renewed lease: handed back, the attempt
                # not counted, as a drain does (once the database answers, if it is away). A
                # timeout that came first fails the attempt as timed out, as it would have.
                self._leases.release([run])
                continue
            if not settler.pending:
                settler.pending_since = now
            settler.pending.append(outcome)
            if self._sizer and run.started is not None and self._sizer.ran(now - run.started):
                self.prefetch = self._sizer.size
                self.capacity = settler.capacity = min(1000, self.concurrency + self.prefetch)

    def _announce(self) -> None:
        if self._conn is None:
            return
        try:
            with self._link.calling() as conn:
                declarations.announce(
                    conn,
                    worker=self.worker_id,
                    queues=self.queues,
                    build=self.build,
                    draining=self._draining,
                    ttl=max(3 * self.announce_interval, self.lease),
                    jobs=sorted(self.app.jobs) if self._declares else None,
                )
        except DB_GONE as err:
            self._link.lost(err)

    def _begin_drain(self, now: float) -> None:
        self._draining = True
        self._drain_deadline = min(now, self._stopping.first_at or now) + self.grace
        if self._process_exits:
            self._stopping.exit_by = min(
                self._stopping.exit_by, self._drain_deadline + HAND_BACK_SECONDS
            )
        waiting = self._hand_back(started=False, reason="shutdown")
        logger.info(
            "draining: claiming nothing more",
            extra={"running": len(self._held), "handed_back": waiting, "grace_s": self.grace},
        )

    def _outlast_grace(self) -> None:
        """The drain's grace ran out in a process that lives on: tell the handlers still running
        to stop, and keep their jobs (heartbeated) until they return. One that timed out was told
        already, and fails as timed out."""
        self._drain_deadline = math.inf
        running = [run for run in self._held.values() if not run.done]
        for run in running:
            if not run.timed_out:
                run.outlasted = True
                self._tell_stop(run, "shutdown")
        logger.warning(
            "the drain's grace ran out; the jobs of handlers still running stay held until they "
            "return",
            extra={"running": len(running), "grace_s": self.grace},
        )

    def _stop_now(self) -> None:
        logger.warning("second stop: stopping at once")
        self._hand_back(started=True, reason="shutdown")
        if self._conn is not None:
            self._settler.finish(self._stopping.exit_by, self._collect)
        self._leases.left_to_leases()

    def _exit_at_grace(self) -> None:
        """The drain's grace ran out in a process that ends with the worker (and its handlers):
        hand back every job still held and settle what finished. Without the database (away,
        or lost now) the worker exits all the same: see Leases.left_to_leases. It does so by
        Stopping.exit_by at the latest, the watch abandoning a call that waits past it. The
        handlers get the first half of that time to return before their jobs go back (see
        Leases.hand_back)."""
        # What finished meanwhile is settled, not handed back to run again.
        self._take_settled()
        self._collect(time.monotonic())
        # Without the database nothing is handed back: then nothing is waited for either.
        returned_by = (
            None
            if self._conn is None
            else min(time.monotonic() + HAND_BACK_SECONDS / 2, self._stopping.exit_by)
        )
        self._hand_back(started=True, reason="shutdown", returned_by=returned_by)
        if self._conn is not None:
            self._settler.finish(self._stopping.exit_by, self._collect)
        self._leases.left_to_leases()

    # --- the database connection -------------------------------------------------------------

    def _connect(self, *, first: bool = False) -> None:
        conn = connect(self.app.dsn, "x_jobs worker", patience=self._patience)
        if first:
            try:
                self._start_with(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        self._watch.silent = False

    def _start_with(self, conn: psycopg.Connection[Any]) -> None:
        self._declares = declarations.start(
            conn,
            self.app,
            worker=self.worker_id,
            build=self.build,
            check_version=self.check_version,
            log=logger,
        )
        # Pass the attempts held (a stale one settles nothing) where the database takes them;
        # asked after the version check, which says what a login of no x_jobs role lacks.
        fenced = bool((row := conn.execute(FENCED).fetchone()) and row[0])
        self._leases.fenced = self._settler.fenced = self._step_store.fenced = fenced
        if _ticker.start(conn, self.app, worker=self.worker_id) and self.tick_schedules:
            self._ticker = _ticker.Ticker(
                self.app.dsn,
                worker=self.worker_id,
                patience=self._patience,
                running=lambda: self._stopping.requests == 0,
            )

    def _tick(self, now: float) -> None:
        """On the watch thread, every tick, the dispatcher maybe blocked in a call: abandon the
        calls still waiting once the worker must exit (see Stopping.exit_by), and stop the handlers
        whose leases went unrenewed."""
        if now >= self._stopping.exit_by:
            self._watch.abandon()
        self._leases.stop_unrenewed(now)

    def _pause_for_database(self) -> bool:
        """Reconnect with backoff, while handlers go on and their outcomes wait. The worker
        keeps its clocks meanwhile: a timeout tells its handler to stop, a stop begins the
        drain, and the drain's grace is kept (when it runs out, a process that ends with the
        worker exits without the database; an embedded one tells its handlers to stop, and
        waits on). True once the database answers; False when the worker stopped without it."""
        wait, delay = self._reconnect.start()
        next_try = time.monotonic() + wait
        while True:
            now = time.monotonic()
            if self._stopping.requests >= 2:
                self._stop_now()
                return False
            if self._stopping.requests == 1 and not self._draining:
                self._begin_drain(now)
            if self._past_grace(now):
                self._exit_at_grace()
                return False
            if now >= next_try:
                try:
                    self._connect()
                except DB_GONE as err:
                    self._watch.silent = True
                    logger.warning(
                        "database unreachable; retrying",
                        extra={"retry_in_s": round(delay, 2), "error": str(err).strip()},
                    )
                    next_try = time.monotonic() + delay
                    delay = self._reconnect.after(delay)
                else:
                    self._reconnect.connected(delay)
                    logger.info("database connection back")
                    self._settler.wake_up.set()  # no need to wait out its backoff either
                    return True
            now = time.monotonic()
            self._take_settled()
            self._collect(now)
            next_deadline = self._executors.check_deadlines(now, self._held)
            wake_at = next_try
            if self._draining:
                if not self._held and not self._leases.unreleased:
                    return False  # drained: nothing is left that needs the database
                if now >= self._drain_deadline:
                    if self._process_exits:
                        self._exit_at_grace()
                        return False
                    self._outlast_grace()
                wake_at = min(wake_at, self._drain_deadline)
            if next_deadline is not None:
                wake_at = min(wake_at, next_deadline)
            if self._wake.wait(timeout=min(max(0.0, wake_at - time.monotonic()), 1.0)):
                self._wake.clear()

    # --- threads ------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        threading.Thread(target=self._listen, name="x_jobs-listen", daemon=True).start()
        threading.Thread(target=self._settler.run, name="x_jobs-settle", daemon=True).start()
        self._watch.start()
        self._executors.start()
        if self._ticker is not None:
            self._ticker.start()

    def _shutdown_threads(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        self._watch.stop()
        self._settler.close()
        self._executors.shutdown()

    # --- notifications ------------------------------------------------------------------------

    def _listen(self) -> None:
        """LISTEN x_jobs and wake the dispatcher when one of our queues gets work. A hint only:
        the dispatcher polls as well, so a dropped connection here loses nothing, nor does a
        pooler that drops notifications (the listener proves they arrive, and warns once if
        not)."""
        listen(
            self.listen_dsn or self.app.dsn,
            "x_jobs",
            notify_dsn=self.app.dsn,
            application_name="x_jobs listener",
            wanted=set(self.queues),
            notified=self._notified,
            wake=self._wake,
            running=lambda: not self._stopped.is_set() and self._stopping.requests == 0,
            poll_interval=self.poll_interval,
        )
