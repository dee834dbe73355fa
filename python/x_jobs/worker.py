"""The worker loop: claim with ``x_jobs.claim``, run handlers, settle with ``x_jobs.complete_many``
and ``x_jobs.fail``, keep leases alive with ``x_jobs.extend_lease``.

One dispatcher thread owns the bookkeeping and the connection that claims and heartbeats; a
settler thread owns a second connection and settles finished jobs in batches (all completions
of a batch in one ``complete_many`` call), so that the server settles one batch while it claims
the next. Sync handlers run on a fixed set of executor threads, ``async`` ones on an event loop
in a thread of its own. A finished handler drops its outcome in a queue and wakes the
dispatcher.

The dispatcher claims when a notification names one of its queues, when the poll interval has
passed (no notification comes for a delayed row becoming due or a lease lapsing), and at once
after a claim that filled every free slot (more may be waiting). It heartbeats the running jobs:
an id that ``extend_lease`` no longer answers was lost (cancelled, or its lease lapsed and
another worker took it), and its handler is told to stop; its outcome is dropped. A claimed job
that waited in the local queue for a while (a quarter of the heartbeat interval) is confirmed the
same way before its handler starts: one cancelled meanwhile never starts. A claimed job the App
has no handler for is handed back (``x_jobs.hand_back``, from 0.4.0): its attempt is not spent,
and it waits for a worker that declares it (see :mod:`x_jobs.declarations`).

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

import asyncio
import contextlib
import json
import logging
import math
import os
import queue
import random
import signal
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from x_jobs import declarations, health
from x_jobs._conn import QUICK_LOSS_SECONDS, connect
from x_jobs._executor import DaemonExecutor
from x_jobs._listen import DB_GONE, LISTEN_DSN_ENV, listen
from x_jobs._refusal import described, refuses_value
from x_jobs._watch import for_leases, patience
from x_jobs.app import App, Job, Seconds, interval, seconds
from x_jobs.errors import (
    InputInvalid,
    JobNotHeld,
    OutputInvalid,
    PermissionDenied,
    ascii_only,
    storable,
    translate,
)
from x_jobs.metrics import DEFAULT_HOST, GAUGE_INTERVAL, WorkerMetrics
from x_jobs.steps import AsyncSteps, Steps, StepStore, Suspended, _Journal, progress

logger = logging.getLogger(__name__)

# The input comes as JSON text, which the handler's run parses and validates in one step
# (pydantic's validate_json): parsing it here cost the dispatcher a tenth of its time.
CLAIM: LiteralString = """
    SELECT id, name, queue, state::text, input::text, attempt, max_attempts, run_id::text,
           tenant_id, created_at
    FROM x_jobs.claim(queues => %s, worker => %s, lease => %s, qty => %s)
"""
# Id lists go as bigint[] literals (see _ids).
COMPLETE_MANY: LiteralString = (
    "SELECT c FROM x_jobs.complete_many(ids => %s::bigint[], worker => %s, outputs => %s::jsonb[])"
    " AS c"
)
FAIL: LiteralString = """
    SELECT x_jobs.fail(id => %s, worker => %s, error => %s, error_stack => %s,
                       retry_delay => %s, retryable => %s)::text
"""
EXTEND: LiteralString = (
    "SELECT e FROM x_jobs.extend_lease(ids => %s::bigint[], worker => %s, lease => %s) AS e"
)
RELEASE: LiteralString = "SELECT r FROM x_jobs.release(ids => %s::bigint[], worker => %s) AS r"
ROW_STATES: LiteralString = "SELECT id, state FROM x_jobs.job_states(ids => %s::bigint[])"
#: The rows this worker holds in the database, less those it knows of (see _sweep_unknown).
UNKNOWN_HELD: LiteralString = (
    "SELECT id FROM x_jobs.held_jobs(worker => %s) WHERE NOT id = ANY(%s::bigint[])"
)
HELD_AT: LiteralString = (
    "SELECT id, state, attempt, claimed_by FROM x_jobs.job_states(ids => %s::bigint[])"
)
#: How long ``x-jobs worker`` goes on, once its drain's grace has run out (or a second stop
#: came), handing back what it holds and settling what finished (at the grace, the handlers it
#: tells to stop get the first half of it to return): a database call still waiting then is
#: abandoned, and the worker exits, leaving what it still holds to its leases.
HAND_BACK_SECONDS = 2.0

ANNOUNCE: LiteralString = """
    SELECT draining_at FROM x_jobs.announce_worker(
        worker => %s, queues => %s, build => %s, draining => %s, ttl => %s)
"""
#: From 0.4.0: with the names of the jobs this worker has handlers for.
ANNOUNCE_JOBS: LiteralString = """
    SELECT draining_at FROM x_jobs.announce_worker(
        worker => %s, queues => %s, build => %s, draining => %s, ttl => %s, jobs => %s)
"""


class JobCancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()`` once the job was cancelled, timed out or lost."""


class PermanentError(Exception):
    """Raise it (or a subclass) from a handler to fail the job for good, with no retry."""


#: Guards the lazy creation of a context's Event against a concurrent stop (rarely contended).
_CANCEL_LOCK = threading.Lock()


class CancelEvent(threading.Event):
    """The Event of ``ctx.cancelled``, true once set: a plain Event, an object like any other,
    is always true, so ``if ctx.cancelled: raise ...`` failed every attempt."""

    def __bool__(self) -> bool:
        return self.is_set()


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
    _stopped: bool = field(default=False, repr=False)
    _event: CancelEvent | None = field(default=None, repr=False)
    _store: StepStore | None = field(default=None, repr=False)
    _steps: Steps | AsyncSteps | None = field(default=None, repr=False)

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

        Made on first use: an Event per claimed job cost the dispatcher a third of its time on
        short jobs, and most handlers never ask."""
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


@dataclass(slots=True)
class _Run:
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
    #: Still running when its lease had gone unrenewed too long (see Worker._unrenewed_after):
    #: told to stop, and then, like an outlasted run, handed back or settled.
    unrenewed: bool = False
    #: Its handler has returned (or raised): it no longer runs here.
    returned: bool = False


@dataclass(slots=True)
class _Outcome:
    #: The run it is the outcome of: a late outcome of an attempt the dispatcher gave up on
    #: (timed out, lost) must not settle a later attempt of the same job this worker holds.
    run: _Run
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
class _Settlement:
    """What the settler did with a batch: the completions the database took (the others were no
    longer held by this worker) and the state each failure left its row in."""

    batch: list[_Outcome]
    completed: set[int]
    states: dict[int, str | None]


def _ids(ids: Iterable[int]) -> str:
    """Job ids as a bigint[] literal, for a parameter cast to bigint[]: psycopg's list dumper
    looks at each element in Python (about 5% of a worker's CPU on no-op jobs)."""
    return "{" + ",".join(map(str, ids)) + "}"


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"


class Worker:
    """Runs the jobs of ``app`` from ``queues`` (default: the queues of its declared jobs).

    ``concurrency`` handlers run at once; up to ``prefetch`` more claimed jobs wait in a local
    queue, so that claims and settlements go to the database in batches (a claim asks for as many
    jobs as there is room for, once half the room is free). A prefetched job holds its lease like
    a running one; its timeout starts when its handler does, and a drain hands it back at once.

    ``metrics_port``: serve Prometheus metrics there, on ``metrics_host`` (default every IPv4
    interface; ``127.0.0.1`` keeps them on this machine), the queue gauges read every
    ``gauge_interval`` (see ``x_jobs.metrics``).

    ``listen_dsn`` (default ``X_JOBS_LISTEN_DSN``, else ``app.dsn``): where the worker LISTENs
    for the notifications that wake it, when ``app.dsn`` goes through a pooler in transaction
    mode, which drops them (docs/poolers.md).
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
        self.prefetch = concurrency if prefetch is None else max(0, prefetch)
        # What the worker may hold at once, running or waiting, and the claim that is worth a
        # round trip: at least half of it, unless nothing is held at all.
        self.capacity = min(1000, self.concurrency + self.prefetch)
        self.lease = seconds(lease)
        self.poll_interval = seconds(poll_interval)
        # Well before the lease lapses, and often enough that a cancel reaches a handler soon.
        self.heartbeat_interval = (
            seconds(heartbeat_interval)
            if heartbeat_interval is not None
            else min(self.lease / 3, 5.0)
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

        #: Every job claimed and not yet settled (or dropped), running or waiting to run.
        self._held: dict[int, _Run] = {}
        #: The held jobs that have a timeout: the only ones whose deadline is checked.
        self._timed: dict[int, _Run] = {}
        self._outbox: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()
        self._inbox: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._notified = threading.Event()
        self._stop_requests = 0
        self._draining = False
        self._drain_deadline = 0.0
        self._process_exits = False
        #: When the worker must be done with the database (monotonic), inf until it is stopping:
        #: a drain's grace plus HAND_BACK_SECONDS in a process that ends with the worker, a
        #: second stop's moment plus that in any. Past it the watch abandons the calls in
        #: progress (see _tick): none keeps a stopped worker from exiting, whatever it waits for
        #: (a lock, a server that works on it for good).
        self._exit_by = math.inf
        #: When the first stop request came (monotonic; see _count_stop).
        self._first_stop_at = 0.0
        #: Set to cut the settler's backoff short: the database answers again, or the worker
        #: exits and its last settlement is tried now.
        self._settler_wake = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The async runs' tasks not yet done, at most `concurrency`, and the claimed runs
        #: waiting for a slot among them (no task yet); both touched on the event loop only.
        self._async_live: set[asyncio.Task[None]] = set()
        self._async_waiting: deque[_Run] = deque()
        self._stopped = threading.Event()
        #: Outcomes waiting for the next settlement batch, since _pending_since.
        self._pending: list[_Outcome] = []
        self._pending_since = 0.0
        # Settlements run on a connection of their own, in a thread of their own, so that the
        # server settles one batch while it claims the next: one batch in flight at a time.
        self._to_settle: queue.SimpleQueue[list[_Outcome] | None] = queue.SimpleQueue()
        self._settled: queue.SimpleQueue[_Settlement] = queue.SimpleQueue()
        self._settling = False
        self._settling_size = 0
        self._last_nudge = 0.0
        # Serializes a handler's start with a hand-back or a loss of the same job: a job is
        # either started here or released (or lost) and never started, not both.
        self._start_lock = threading.Lock()
        #: A claimed job that waited in the local queue longer than this since the worker last
        #: knew it held it is confirmed (extend_lease) before its handler starts: a cancel that
        #: came meanwhile is seen by the next heartbeat only, too late to keep it from starting.
        self._confirm_after = self.heartbeat_interval / 4
        #: When the last heartbeat that was answered was sent: every job held then was held.
        self._confirmed_at = 0.0
        #: The runs an executor found waiting past _confirm_after, for the dispatcher to confirm.
        self._unconfirmed: queue.SimpleQueue[_Run] = queue.SimpleQueue()
        #: Jobs to hand back (release) once the database answers: their runs are over (never
        #: started, or stopped); if the worker exits first, they are left to their leases.
        self._unreleased: list[_Run] = []
        #: A running handler whose lease this worker has not renewed for this long (the
        #: database away, or its calls hanging) is told to stop: the lease may lapse soon, and
        #: another worker could then run the job beside it. A heartbeat interval or a quarter of
        #: the lease (at most half) is left to stop in before the lapse.
        self._unrenewed_after = self.lease - min(
            max(self.heartbeat_interval, self.lease / 4), self.lease / 2
        )
        #: Watches the calls of the dispatcher and the settler (see CallWatch), and runs
        #: _stop_unrenewed while the dispatcher may be blocked.
        self._watch = for_leases(
            "x_jobs-watch",
            app.dsn,
            lease=self.lease,
            heartbeat_interval=self.heartbeat_interval,
            on_tick=self._tick,
        )
        #: Until then, a claim whose answer was lost may have committed: the jobs it took are
        #: this worker's in the database and unknown here (see _sweep_unknown).
        self._claims_in_doubt_until = 0.0
        #: The database records declarations and takes hand-backs (0.4.0): read at the start.
        self._declares = False
        #: Claimed jobs this worker has no handler for, by id, to hand back once the database
        #: answers (see _hand_back_unknown); and the names it said so of (once each).
        self._unhanded: dict[int, str] = {}
        self._unhandled_names: set[str] = set()
        #: When the dispatcher's connection was last made, and how long to wait before the next
        #: try if it is lost soon after (see QUICK_LOSS_SECONDS).
        self._connected_at = -math.inf
        self._reconnect_delay = 0.1

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
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        logger.info(
            "worker starting",
            extra={
                "worker": self.worker_id,
                "queues": self.queues,
                "concurrency": self.concurrency,
                "prefetch": self.prefetch,
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
            if self._conn is not None:
                self._conn.close()
            self.metrics.close()
            self._step_store.close()
            self._stopped.set()
            logger.info("worker stopped", extra={"worker": self.worker_id})

    def stop(self) -> None:
        """Drain: claim nothing more, hand back what has not started, let what runs finish
        (within grace), hand back the rest (see ``run``). A second call stops at once: it hands
        back every job still held, and the handlers still running run on beside whichever
        worker takes their jobs next, unless the process ends with them."""
        self._count_stop()
        self._wake.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # --- the dispatcher -----------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # A handler runs in the main thread between two bytecodes, maybe while that thread holds
        # the lock inside self._wake (in its wait or clear): setting the event from here could
        # wait for itself forever (two quick signals did). Count the request here and set the
        # event from a thread of its own, which waits for the lock like any other thread.
        self._count_stop()
        threading.Thread(target=self._wake.set, name="x_jobs-signal", daemon=True).start()
        logger.info("signal received", extra={"signal": signal.Signals(signum).name})

    def _count_stop(self) -> None:
        """One more stop request. The drain's grace counts from the first, not from when the
        dispatcher sees it (it may be blocked in a call); from the second on, the worker stops
        at once. Sets the time by which it must be done (see _exit_by). Takes no lock: it runs
        in a signal handler too."""
        now = time.monotonic()
        self._stop_requests += 1
        if self._stop_requests == 1:
            self._first_stop_at = now
            if self._process_exits:
                self._exit_by = min(self._exit_by, now + self.grace + HAND_BACK_SECONDS)
        else:
            self._exit_by = min(self._exit_by, now + HAND_BACK_SECONDS)

    def _past_grace(self, now: float) -> bool:
        """Is this a process that ends with the worker, past its drain's grace? Then it waits for
        nothing more: not a heartbeat, a reconnect, nor a settlement's retry."""
        return self._process_exits and self._draining and now >= self._drain_deadline

    def _loop_forever(self) -> None:
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        next_announce = 0.0
        next_poll = 0.0
        claim_now = True
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
                if self._unreleased:
                    runs, self._unreleased = self._unreleased, []
                    self._release(runs)
                    if self._conn is None:
                        continue
                if self._unhanded:
                    self._hand_back_unknown({})
                    if self._conn is None:
                        continue
            now = time.monotonic()
            if self._stop_requests >= 2:
                self._stop_now()
                return
            if self._stop_requests == 1 and not self._draining:
                self._begin_drain(now)
                next_announce = 0.0
            if self._past_grace(now):
                self._exit_at_grace()
                return

            self._take_settled()
            self._collect(now)
            next_deadline = self._check_deadlines(now)
            if self._conn is None:
                continue  # lost by a hand-back (a drain's, or of a job stopped by it)
            if self._settle_due(now):
                self._submit_settlement()

            if now >= next_heartbeat:
                if not self._heartbeat() or self._conn is None:
                    continue  # the top of the loop reconnects, then extends the leases
                next_heartbeat = now + self.heartbeat_interval
                if now < self._claims_in_doubt_until:
                    self._sweep_unknown()
                    if self._conn is None:
                        continue
            if now >= next_announce:
                self._announce()
                if self._conn is None:
                    continue
                next_announce = now + self.announce_interval
            if not self._unconfirmed.empty() and not self._confirm():
                continue

            if self._draining:
                if not self._held and not self._unreleased:
                    return
                if now >= self._drain_deadline:
                    if self._process_exits:
                        self._exit_at_grace()
                        return
                    self._outlast_grace()
            else:
                if self._notified.is_set():
                    self._notified.clear()
                    claim_now = True
                if now >= next_poll:
                    claim_now = True
                room = self._room()
                if claim_now and (room * 2 >= self.capacity or not self._held):
                    got = self._claim(room)
                    if got is None:
                        continue
                    # A full claim means more may wait: claim again as soon as there is room.
                    claim_now = got == room
                    next_poll = time.monotonic() + self.poll_interval

            wake_at = next_heartbeat if self._draining else min(next_heartbeat, next_poll)
            # A timeout or the drain's grace is acted on when it comes, not at the next poll.
            if self._draining:
                wake_at = min(wake_at, self._drain_deadline)
            if next_deadline is not None:
                wake_at = min(wake_at, next_deadline)
            # While a settlement is in flight the next waits for it (one at a time), and its
            # end wakes this loop: a wake-up for the settle delay would only spin until then.
            if self._pending and not self._settling:
                wake_at = min(wake_at, self._pending_since + self.settle_delay)
            if self._wake.wait(timeout=min(max(0.0, wake_at - time.monotonic()), 1.0)):
                self._wake.clear()

    def _room(self) -> int:
        """How many jobs a claim may take now. A finished job waiting for its settlement holds
        no slot: counting it would keep the next claim waiting for the settle's round trip, so
        that claims and settlements would take turns instead of overlapping. What waits to be
        settled is bounded all the same: the worker never holds more than twice its capacity."""
        unsettled = len(self._pending) + self._settling_size
        return min(
            self.capacity - (len(self._held) - unsettled), 2 * self.capacity - len(self._held)
        )

    def _claim(self, room: int) -> int | None:
        assert self._conn is not None
        sent = time.monotonic()
        try:
            rows = self._query(CLAIM, [self.queues, self.worker_id, interval(self.lease), room])
        except DB_GONE as err:
            self._lost_connection(err)
            self._claims_in_doubt_until = time.monotonic() + self.lease
            return None
        claimed = 0
        per_job: dict[str, int] = {}
        async_runs: list[_Run] = []
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
            if old is not None and (not old.done or any(o.run is old for o in self._pending)):
                self._drop_stale(old)
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
            )
            run = _Run(job or _unknown_job(self.app, name), ctx, payload, checked=sent)
            self._held[job_id] = run
            if job is not None and job.timeout is not None:
                self._timed[job_id] = run
            per_job[name] = per_job.get(name, 0) + 1
            if job is None:
                self._outbox.put(
                    _Outcome(run, ok=False, error=f"no handler for job {name!r} in this worker")
                )
            elif job.is_async:
                async_runs.append(run)
            else:
                self._inbox.put(run)
        if async_runs:
            assert self._loop is not None
            # One wake-up of the event loop for the claim's async runs: one each (a thread-safe
            # call, a future chained to each task) cost four times the worker's CPU per job.
            self._loop.call_soon_threadsafe(self._start_async, async_runs)
        for name, count in per_job.items():
            self.metrics.claimed(name, count)
        if unknown:
            self._hand_back_unknown(unknown)
        return claimed

    def _hand_back_unknown(self, unknown: dict[int, str]) -> None:
        """Hand back (x_jobs.hand_back) claimed jobs this worker has no handler for, and those
        left over from a hand-back the database did not answer: the attempt is not spent, and
        the row is not due again at once (delayed for a worker that serves the name, or parked
        until one announces it), so this worker neither runs it nor claims it again in a loop.
        Logged once per name. Without the database they wait here for the reconnect (a lease
        that lapsed meanwhile would cost the job an attempt)."""
        pending = {**self._unhanded, **unknown}
        self._unhanded = {}
        try:
            if self._conn is None:
                raise psycopg.OperationalError("no connection to the database")
            with self._watch.calling("dispatcher", self._conn):
                handed = declarations.hand_back(self._conn, pending, self.worker_id)
        except DB_GONE as err:
            self._unhanded = pending
            if self._conn is not None:
                self._lost_connection(err)
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
            if row.name in self._unhandled_names:
                continue
            self._unhandled_names.add(row.name)
            logger.warning(
                f"no handler for job {row.name!r} in this worker; handed back "
                f"({declarations.describe(row)})",
                extra={"job": row.name, "parked": row.parked, "served_by": row.served_by},
            )
        # Not handed back (no longer held: its lease lapsed meanwhile, or it was cancelled).
        for job_id in pending.keys() - {row.id for row in handed}:
            self.metrics.settled(pending[job_id], "lost")

    def _drop_stale(self, old: _Run) -> None:
        """This worker claimed a job it still ran, or whose outcome it had yet to send: its
        lease had lapsed (the database was away past it), or an operator cancelled and retried
        it before a heartbeat told this worker of the cancel. The old attempt is over: its
        handler is told to stop, and its outcome must not settle the new attempt. (A failed
        attempt whose settlement is out, made due again at once, is claimed again in the normal
        way.)"""
        with self._start_lock:
            old.done = True
        self._tell_stop(old, "lost")
        self._pending = [o for o in self._pending if o.run is not old]
        logger.warning(
            "job claimed again by this worker while it still held an earlier attempt (its lease "
            "lapsed, or it was cancelled and retried); the earlier attempt is dropped",
            extra={"job_id": old.ctx.id, "job": old.job.name, "attempt": old.ctx.attempt},
        )

    def _collect(self, now: float) -> None:
        """Take the outcomes the handlers left, and queue each one for its settlement."""
        while True:
            try:
                outcome = self._outbox.get_nowait()
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
                self._release([run])
                continue
            if not self._pending:
                self._pending_since = now
            self._pending.append(outcome)

    def _settle_due(self, now: float) -> bool:
        """Settle in batches, one in flight: when enough finished, when the first of them waited
        settle_delay, or when nothing else is left to finish."""
        pending = len(self._pending)
        return (
            pending > 0
            and not self._settling
            and (
                pending * 2 >= self.capacity
                or now - self._pending_since >= self.settle_delay
                or pending >= len(self._held)
                or self._draining
            )
        )

    def _submit_settlement(self) -> None:
        batch, self._pending = self._pending, []
        self._settling = True
        self._settling_size = len(batch)
        self._to_settle.put(batch)

    def _take_settled(self) -> None:
        """Account for the batches the settler finished: the jobs leave this worker."""
        now = time.monotonic()
        while True:
            try:
                done = self._settled.get_nowait()
            except queue.Empty:
                return
            self._settling = False
            self._settling_size = 0
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

    def _finish_settlements(self, until: float) -> None:
        """Before exiting: settle what is pending and wait for the settler, until ``until``
        (monotonic). A settler waiting out its backoff tries again at once."""
        self._settler_wake.set()
        while time.monotonic() < until:
            self._take_settled()
            self._collect(time.monotonic())
            if not self._settling and self._pending:
                self._submit_settlement()
            if not self._settling:
                return
            self._wake.wait(0.05)
            self._wake.clear()

    def _settle_loop(self) -> None:
        """The settler thread: each batch in one transaction (all completions in one
        complete_many call, failures one by one). A settlement that fails for anything but
        its values (see x_jobs._refusal: a lost connection, a pooler's or the protocol's error,
        a read-only transaction during a failover...) is sent again with backoff on a new
        connection, the batch kept as it was, until a second stop gives up (the leases of what
        it held will lapse). Nothing a batch raises ends the thread: a dead settler would
        settle nothing again."""
        conn: psycopg.Connection[Any] | None = None
        while (batch := self._to_settle.get()) is not None:
            delay = 0.1
            in_doubt = False
            result: _Settlement | None = None
            while True:
                self._settler_wake.clear()  # set from now on: try again without waiting
                try:
                    if conn is None:
                        conn = connect(self.app.dsn, "x_jobs settler", patience=self._patience)
                    with self._watch.calling("settler", conn):
                        if in_doubt:
                            result = self._settle_in_doubt(conn, batch)
                        else:
                            result = self._settle_batch(conn, batch)
                    break
                except psycopg.Error as err:
                    gone = conn is None or conn.broken
                    if conn is not None:
                        conn.close()
                    conn = None
                    # The batch's transaction rolled back, unless the connection went during
                    # its commit: the retry first reads which of its jobs are still held.
                    in_doubt = True
                    if self._stop_requests >= 2:
                        result = _Settlement(batch, set(), {})
                        break
                    now = time.monotonic()
                    if now >= self._exit_by:
                        # The process exits now: the batch stays held, and is left to its
                        # jobs' leases (see _left_to_leases).
                        break
                    logger.warning(
                        "settling: database unreachable; retrying"
                        if gone
                        else "settling failed, not for its values; retrying on a new connection",
                        extra={"retry_in_s": round(delay, 2), "error": described(err)},
                    )
                    self._settler_wake.wait(min(delay, self._exit_by - now))
                    delay = min(delay * 2, 5.0)
                except Exception:
                    # _settle_batch answers for each outcome what the database refuses; this is
                    # the worker's own fault. The jobs' leases will lapse, and they run again.
                    logger.exception("settling a batch failed", extra={"jobs": len(batch)})
                    result = _Settlement(batch, set(), {})
                    break
            if result is not None:
                self._settled.put(result)
            self._wake.set()
        if conn is not None:
            conn.close()

    def _settle_in_doubt(self, conn: psycopg.Connection[Any], batch: list[_Outcome]) -> _Settlement:
        """Settle a batch whose last try lost its connection, maybe once committed: only the
        outcomes whose job this worker still holds at that attempt. Sent again as it was, a
        failure that did commit would fail the job's next attempt, if this worker claimed it
        meanwhile. A job no longer held is taken as settled when its row says so (done, or
        gone after a complete for keep_done=false; failed at that attempt); otherwise lost."""
        rows = {
            row[0]: row[1:] for row in conn.execute(HELD_AT, [_ids(o.id for o in batch)]).fetchall()
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
            return _Settlement(batch, completed, states)
        settled = self._settle_batch(conn, held)
        return _Settlement(batch, completed | settled.completed, {**states, **settled.states})

    def _settle_batch(self, conn: psycopg.Connection[Any], batch: list[_Outcome]) -> _Settlement:
        """Settle a batch together; when one of its values is refused (an output over
        x_jobs.max_payload_bytes, text the database cannot store, a value psycopg cannot send),
        one by one, so that one outcome cannot stop the others, nor this thread. The refused
        transaction rolled back: nothing of it is settled twice. Any other failure is raised,
        for _settle_loop to send the batch again as it is."""
        try:
            return self._settle_together(conn, batch)
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
            settled = self._settle_alone(conn, outcome)
            if settled is None:
                states[outcome.id] = None
                continue
            completed |= settled.completed
            states.update(settled.states)
        return _Settlement(batch, completed, states)

    def _settle_alone(self, conn: psycopg.Connection[Any], outcome: _Outcome) -> _Settlement | None:
        """One outcome: a refused output fails its job for good, saying why; a refused error
        text is sent again in ASCII (a LATIN1 database cannot store a euro sign). None (logged)
        when even that is refused: the job's lease will lapse. Only a refusal of a value does
        any of that (see x_jobs._refusal); any other failure is raised, the outcome kept."""
        escaped = False
        while True:
            try:
                return self._settle_together(conn, [outcome])
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

    def _settle_together(self, conn: psycopg.Connection[Any], batch: list[_Outcome]) -> _Settlement:
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
                # deadlocked (a second's stall, then one side aborted).
                conn.execute(
                    EXTEND, [_ids(o.id for o in batch), self.worker_id, interval(self.lease)]
                )
            if completions:
                rows = conn.execute(
                    COMPLETE_MANY,
                    [
                        _ids(o.id for o in completions),
                        self.worker_id,
                        # Outputs NULL when every handler answered None (no-op jobs): no array.
                        None
                        if all(o.output is None for o in completions)
                        else [None if o.output is None else Jsonb(o.output) for o in completions],
                    ],
                ).fetchall()
                completed = {row[0] for row in rows}
            for outcome in batch:
                if outcome.ok:
                    continue
                row = conn.execute(
                    FAIL,
                    [
                        outcome.id,
                        self.worker_id,
                        storable(outcome.error) or "error",
                        None if outcome.stack is None else storable(outcome.stack),
                        None,
                        outcome.retryable,
                    ],
                ).fetchone()
                states[outcome.id] = row[0] if row else None
        return _Settlement(batch, completed, states)

    def _check_deadlines(self, now: float) -> float | None:
        """Tell the handlers whose timeout passed to stop, and answer the next deadline (for
        the loop's wake-up). The attempt is settled as timed out when the handler returns, not
        now: a sync body cannot be killed, and a job failed (or handed back) while its body runs
        on could be claimed again and run twice at once. A handler still running a grace later
        is logged once; it keeps the job, and its slot."""
        upcoming: float | None = None
        for run in list(self._timed.values()):
            if run.done or run.ctx.id not in self._held:
                del self._timed[run.ctx.id]
                continue
            if run.deadline is None:
                continue
            if now < run.deadline:
                upcoming = run.deadline if upcoming is None else min(upcoming, run.deadline)
                continue
            assert run.job.timeout is not None
            if run.timed_out:
                del self._timed[run.ctx.id]
                logger.warning(
                    "job timed out and its handler did not stop within the grace; the job stays "
                    "held, and its slot taken, until the handler returns",
                    extra={"job_id": run.ctx.id, "job": run.job.name, "grace_s": self.grace},
                )
                continue
            run.timed_out = True
            # On the final attempt the failure is for good: see _final.
            run.undoing = run.ctx.attempt >= run.ctx.max_attempts
            run.deadline = now + self.grace
            upcoming = run.deadline if upcoming is None else min(upcoming, run.deadline)
            self._tell_stop(run, "timeout")
        return upcoming

    def _heartbeat(self) -> bool:
        """Extend the leases of the held jobs; stop those that were lost. False when the
        database did not answer. A finished job whose outcome waits for its settlement is
        extended too: were its lease to lapse first, a claim could run it again."""
        if not self._held:
            return True
        sent = time.monotonic()
        held = self._extend(self._held)
        if held is None:
            return False
        # A finished one that was not extended is settled already, or its settlement will say
        # that the worker lost it.
        gone = [run for job_id, run in self._held.items() if not run.done and job_id not in held]
        if gone:
            self._drop_gone(gone)
        # Only now: a run that an executor takes meanwhile is not taken as confirmed before the
        # runs that this heartbeat found gone are marked so (see _begin).
        self._confirmed_at = sent
        return True

    def _extend(self, ids: Iterable[int]) -> set[int] | None:
        """extend_lease of ``ids``: those this worker still holds, or None when the database did
        not answer (the connection is dropped, for the loop to reconnect)."""
        assert self._conn is not None
        try:
            rows = self._query(EXTEND, [_ids(ids), self.worker_id, interval(self.lease)])
        except DB_GONE as err:
            self._lost_connection(err)
            return None
        return {row[0] for row in rows}

    def _sweep_unknown(self) -> None:
        """Hand back the jobs the database says this worker holds and that it does not know of:
        a claim whose answer was lost may have committed, its rows this worker's for a lease.
        They would wait that lease out, and one on its final attempt would then be buried
        without having run. Asked at each heartbeat for a lease after such a loss."""
        known = [*self._held, *(run.ctx.id for run in self._unreleased), *self._unhanded]
        try:
            ids = [row[0] for row in self._query(UNKNOWN_HELD, [self.worker_id, _ids(known)])]
            if not ids:
                return
            released = self._query(RELEASE, [_ids(ids), self.worker_id])
        except DB_GONE as err:
            self._lost_connection(err)
            return
        logger.warning(
            "handed back jobs taken by a claim whose answer was lost",
            extra={"job_ids": ids, "released": len(released)},
        )

    def _drop_gone(self, runs: list[_Run]) -> None:
        """The held runs that extend_lease did not answer: none starts from now on, a running
        handler is told to stop, and the worker forgets them (nothing to settle)."""
        assert self._conn is not None
        # Say why: an operator's cancel, or a lease another worker took over.
        try:
            states = dict(self._query(ROW_STATES, [_ids(run.ctx.id for run in runs)]))
        except DB_GONE as err:
            self._lost_connection(err)
            states = {}
        with self._start_lock:  # none of them starts from now on (see _hand_back)
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

    def _confirm(self) -> bool:
        """Start the runs that an executor found waiting past _confirm_after (see _begin) once
        extend_lease answers that this worker still holds them, all of them in one call; drop
        the others, cancelled or lost while they waited (they never ran: nothing to settle).
        False when the database did not answer: they wait for the reconnect."""
        runs: list[_Run] = []
        with contextlib.suppress(queue.Empty):
            while True:
                runs.append(self._unconfirmed.get_nowait())
        runs = [run for run in runs if not run.done]  # handed back or lost meanwhile
        if not runs:
            return True
        sent = time.monotonic()
        # Those a heartbeat confirmed since they were put back need no other check.
        stale = [run for run in runs if not self._fresh(run, sent)]
        if stale:
            held = self._extend(run.ctx.id for run in stale)
            if held is None:
                for run in runs:
                    self._unconfirmed.put(run)
                return False
            for run in stale:
                if run.ctx.id in held:
                    run.checked = sent
            gone = [run for run in stale if run.ctx.id not in held]
            if gone:
                self._drop_gone(gone)
        self._dispatch([run for run in runs if not run.done])
        return self._conn is not None  # lost by _drop_gone's question, maybe

    def _fresh(self, run: _Run, now: float) -> bool:
        """Did this worker know it held the job a short while ago (see _confirm_after)?"""
        return now - max(run.checked, self._confirmed_at) <= self._confirm_after

    def _dispatch(self, runs: list[_Run]) -> None:
        """Put claimed runs in the local queue of their executors (threads, or the event loop)."""
        async_runs = [run for run in runs if run.job.is_async]
        for run in runs:
            if not run.job.is_async:
                self._inbox.put(run)
        if async_runs:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._start_async, async_runs)

    def _announce(self) -> None:
        if self._conn is None:
            return
        params = [
            self.worker_id,
            self.queues,
            self.build,
            self._draining,
            interval(max(3 * self.announce_interval, self.lease)),
        ]
        try:
            if self._declares:
                # The jobs it has handlers for: a hand-back finds this worker by them, and the
                # announce wakes the rows parked for them.
                self._query(ANNOUNCE_JOBS, [*params, sorted(self.app.jobs)])
            else:
                self._query(ANNOUNCE, params)
        except DB_GONE as err:
            self._lost_connection(err)

    def _begin_drain(self, now: float) -> None:
        self._draining = True
        self._drain_deadline = min(now, self._first_stop_at or now) + self.grace
        if self._process_exits:
            self._exit_by = min(self._exit_by, self._drain_deadline + HAND_BACK_SECONDS)
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

    def _hand_back(self, *, started: bool, reason: str, returned_by: float | None = None) -> int:
        """Give jobs back to the queue (x_jobs.release): those not started yet, or (started=True)
        every one still held, whose handlers are told to stop. Answers how many.

        ``returned_by`` (monotonic): the handlers told to stop are waited for until then, and
        their jobs released only once they returned (or the time is up). Released at once, a
        job could start elsewhere while its handler here had yet to see the stop; what they
        answer is dropped all the same."""
        # Under the start lock: a run is either marked started by _begin, and then kept unless
        # started=True, or marked done here first, and then _begin never starts it.
        with self._start_lock:
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
                # An executor wakes the dispatcher when it leaves an outcome (see _nudge).
                if self._wake.wait(min(left, 0.05)):
                    self._wake.clear()
        return self._release(runs)

    def _release(self, runs: list[_Run]) -> int:
        """x_jobs.release the jobs of `runs` (marked done): due again at once, the attempt not
        counted. Answers how many the database released."""
        ids = [run.ctx.id for run in runs]
        if not ids:
            return 0
        try:
            if self._conn is None:
                raise psycopg.OperationalError("no connection to the database")
            rows = self._query(RELEASE, [_ids(ids), self.worker_id])
        except DB_GONE as err:
            # Handed back once the database answers (they run no more here, and are not
            # extended meanwhile); if the worker exits first, they are left to their leases.
            for run in runs:
                self._held.pop(run.ctx.id, None)
            self._unreleased += runs
            if self._conn is not None:
                self._lost_connection(err)
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

    def _stop_now(self) -> None:
        logger.warning("second stop: stopping at once")
        self._hand_back(started=True, reason="shutdown")
        if self._conn is not None:
            self._finish_settlements(until=self._exit_by)
        self._left_to_leases()

    def _exit_at_grace(self) -> None:
        """The drain's grace ran out in a process that ends with the worker (and its handlers):
        hand back every job still held and settle what finished. Without the database (away,
        or lost now) the worker exits all the same: see _left_to_leases. It does so by _exit_by
        at the latest, the watch abandoning a call that waits past it. The handlers get the
        first half of that time to return before their jobs go back (see _hand_back)."""
        # What finished meanwhile is settled, not handed back to run again.
        self._take_settled()
        self._collect(time.monotonic())
        # Without the database nothing is handed back: then nothing is waited for either.
        returned_by = (
            None
            if self._conn is None
            else min(time.monotonic() + HAND_BACK_SECONDS / 2, self._exit_by)
        )
        self._hand_back(started=True, reason="shutdown", returned_by=returned_by)
        if self._conn is not None:
            self._finish_settlements(until=self._exit_by)
        self._left_to_leases()

    def _left_to_leases(self) -> None:
        """Exiting: say what the worker leaves behind without handing it back or settling it
        (the database did not answer). Each job stays claimed until its lease lapses; then
        another worker runs it again (an outcome not settled is lost, not the job)."""
        unsettled = len(self._held)  # finished, their outcomes not settled
        left = unsettled + len(self._unreleased)
        if left:
            logger.warning(
                "exiting without the database: jobs left to their leases (other workers run "
                "them again once the leases lapse)",
                extra={
                    "left_to_leases": left,
                    "unsettled": unsettled,
                    "not_handed_back": len(self._unreleased),
                },
            )

    def _tell_stop(self, run: _Run, reason: str) -> None:
        run.ctx._stop(reason)
        # The task is made on the loop (_start_async), which cancels it itself if the stop came
        # first; either it sees the stop or this sees the task.
        if run.task is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(run.task.cancel)

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
        """At the start: check the version (unless told not to), and on 0.4.0 or later record
        what the app's jobs declare (x_jobs.declare_jobs), so that every producer's enqueue of
        them gets it. On an older database the worker does as 0.3.9's did: no declarations, and
        a job it has no handler for fails its attempt."""
        if self.check_version:
            version = self.app.check_version(conn)
        else:
            try:
                row = conn.execute("SELECT x_jobs.version()").fetchone()
            except psycopg.Error:
                row = None
            version = str(row[0]) if row else ""
        health.log_failing(conn, version, logger)  # once, at start (0.4.0 on)
        self._declares = declarations.speaks_declarations(version)
        if not self._declares:
            return
        try:
            names = declarations.declare(
                conn, self.app, declared_by=self.worker_id, build=self.build
            )
        except psycopg.errors.InsufficientPrivilege as err:
            # A login without x_jobs_worker, refused here before its first claim.
            raise PermissionDenied.of(err) from err
        except psycopg.Error as err:
            # A declaration the database refuses (a timeout of 0: X_JOB_TIMEOUT_INVALID).
            typed = translate(err)
            if typed is err:
                raise
            raise typed from err
        logger.info("jobs declared", extra={"worker": self.worker_id, "jobs": names})

    def _query(self, statement: LiteralString, params: list[Any]) -> list[tuple[Any, ...]]:
        """One call on the dispatcher's connection, watched (see CallWatch)."""
        assert self._conn is not None
        with self._watch.calling("dispatcher", self._conn):
            return self._conn.execute(statement, params).fetchall()

    def _tick(self, now: float) -> None:
        """On the watch thread, every tick, the dispatcher maybe blocked in a call: abandon the
        calls still waiting once the worker must exit (see _exit_by), and stop the handlers
        whose leases went unrenewed."""
        if now >= self._exit_by:
            self._watch.abandon()
        self._stop_unrenewed(now)

    def _stop_unrenewed(self, now: float) -> None:
        """On the watch thread: tell the running handlers whose lease went unrenewed for
        _unrenewed_after to stop, while the worker cannot reach the database (its connection
        lost and not back, or a call waiting a heartbeat interval that a new connection could
        not get an answer beside): another worker may then be taking the job as lapsed. The
        worker cannot tell a server down for everyone from a network that cut it off alone, so
        a long outage stops handlers too. Not a call that waits while the server answers (a lock
        held elsewhere, a busy server): no claim takes the job meanwhile. Every job held was
        renewed at the last heartbeat answered, or claimed after it."""
        if now - self._confirmed_at < self._unrenewed_after:
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
            and now - max(run.checked, self._confirmed_at) >= self._unrenewed_after
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

    def _lost_connection(self, err: Exception) -> None:
        self._watch.silent = True
        logger.warning("database connection lost", extra={"error": str(err).strip()})
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _pause_for_database(self) -> bool:
        """Reconnect with backoff, while handlers go on and their outcomes wait. The worker
        keeps its clocks meanwhile: a timeout tells its handler to stop, a stop begins the
        drain, and the drain's grace is kept (when it runs out, a process that ends with the
        worker exits without the database; an embedded one tells its handlers to stop, and
        waits on). True once the database answers; False when the worker stopped without it."""
        delay = 0.1
        next_try = time.monotonic()
        if next_try - self._connected_at < QUICK_LOSS_SECONDS:
            # Lost as soon as it was made (a pooler took the login, the server behind it away):
            # a connect that failed, and the backoff goes on.
            next_try += self._reconnect_delay
            delay = min(self._reconnect_delay * 2, 5.0, self.heartbeat_interval)
        while True:
            now = time.monotonic()
            if self._stop_requests >= 2:
                self._stop_now()
                return False
            if self._stop_requests == 1 and not self._draining:
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
                    # No longer than a heartbeat apart: after a restart a claim leaves alone, for
                    # one lease, the jobs whose leases ran out while the server was down, so that
                    # their holders can reconnect and renew them first (see x_jobs.claim).
                    delay = min(delay * 2, 5.0, self.heartbeat_interval)
                else:
                    self._connected_at, self._reconnect_delay = time.monotonic(), delay
                    logger.info("database connection back")
                    self._settler_wake.set()  # no need to wait out its backoff either
                    return True
            now = time.monotonic()
            self._take_settled()
            self._collect(now)
            next_deadline = self._check_deadlines(now)
            wake_at = next_try
            if self._draining:
                if not self._held and not self._unreleased:
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

    # --- handler threads ----------------------------------------------------------------------

    def _start_threads(self) -> None:
        listener = threading.Thread(target=self._listen, name="x_jobs-listen", daemon=True)
        listener.start()
        settler = threading.Thread(target=self._settle_loop, name="x_jobs-settle", daemon=True)
        settler.start()
        self._watch.start()
        self._threads += [listener, settler]
        if any(not job.is_async for job in self.app.jobs.values()):
            for n in range(self.concurrency):
                thread = threading.Thread(
                    target=self._execute_sync, name=f"x_jobs-exec-{n}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        if any(job.is_async for job in self.app.jobs.values()):
            loop = asyncio.new_event_loop()
            # Its threads end with the process, as the sync handlers' do (see DaemonExecutor).
            loop.set_default_executor(DaemonExecutor(thread_name_prefix="x_jobs-to-thread"))
            self._loop = loop
            thread = threading.Thread(target=self._run_loop, name="x_jobs-async", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run_loop(self) -> None:
        assert self._loop is not None
        try:
            self._loop.run_forever()
        finally:
            # A Worker.run() embedded in a process that lives on left the loop open, its
            # selector and self-pipe sockets leaked (ResourceWarnings at garbage collection).
            self._loop.close()

    def _shutdown_threads(self) -> None:
        self._watch.stop()
        self._to_settle.put(None)
        for _ in range(self.concurrency):
            self._inbox.put(None)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _nudge(self, queued: bool) -> None:
        """Wake the dispatcher for an outcome, but not for every one: waking it per job (a
        notify, a thread switch, the GIL) cost more than the job. It is woken when no work is
        left `queued`, when a batch's worth is waiting, or when the settle delay has passed."""
        if self._wake.is_set():
            return  # the dispatcher has yet to wake: setting it again is a contended no-op
        now = time.monotonic()
        if not queued or self._outbox.qsize() >= 64 or now - self._last_nudge >= self.settle_delay:
            self._last_nudge = now
            self._wake.set()

    def _begin(self, run: _Run) -> bool:
        """Mark a run started (its timeout starts now), unless it was dropped meanwhile, or it
        waited in the local queue so long that a cancel may have come unseen: then it goes back
        to the dispatcher, which starts it again once extend_lease answers that the worker still
        holds it (see _confirm). A run started soon after its claim is not checked."""
        now = time.monotonic()
        with self._start_lock:
            if run.done:
                return False
            # _fresh, inline: this runs once per job.
            if now - max(run.checked, self._confirmed_at) > self._confirm_after:
                self._unconfirmed.put(run)
                stale = True
            else:
                run.started = now
                stale = False
        if stale:
            self._wake.set()
            return False
        if run.job.timeout is not None:
            run.deadline = now + run.job.timeout
        return True

    def _execute_sync(self) -> None:
        while True:
            run = self._inbox.get()
            if run is None:
                return
            if not self._begin(run):
                continue
            try:
                outcome = self._call(run)
            except BaseException as err:
                # _call keeps what the handler raises; this is the worker's own failure around
                # it. The thread lives on, and the job fails with it rather than run on unsettled.
                logger.exception("running a job failed", extra={"job_id": run.ctx.id})
                outcome = self._failure(run, err)
            run.returned = True
            self._outbox.put(outcome)
            self._nudge(queued=not self._inbox.empty())

    def _start_async(self, runs: list[_Run]) -> None:
        """On the event loop: the runs of a claim wait their turn; a task is made for one only
        when a slot is free. A task each at once, waiting on a semaphore, cost a future and a
        wake-up per waiting run (the prefetched ones are most of a claim)."""
        self._async_waiting.extend(runs)
        self._fill_async()

    def _fill_async(self) -> None:
        assert self._loop is not None
        while self._async_waiting and len(self._async_live) < self.concurrency:
            run = self._async_waiting.popleft()
            if run.done:
                continue  # handed back or lost while it waited: nothing to start
            task = self._loop.create_task(self._run_async(run))
            self._async_live.add(task)
            task.add_done_callback(self._async_finished)
            run.task = task
            if run.ctx.is_cancelled():
                task.cancel()  # told to stop before its task was made: see _tell_stop

    def _async_finished(self, task: asyncio.Task[None]) -> None:
        self._async_live.discard(task)
        self._fill_async()

    async def _run_async(self, run: _Run) -> None:
        if not self._begin(run):
            return
        try:
            outcome = await self._call_async(run)
        except BaseException as err:
            # As in _execute_sync: the worker's own failure around the handler. The job fails
            # with it rather than stay held, unsettled, for as long as the worker runs.
            logger.exception("running a job failed", extra={"job_id": run.ctx.id})
            outcome = _Outcome(run, ok=False, error=f"the worker failed running it: {err!r}")
        run.returned = True
        self._outbox.put(outcome)
        # This task is done: its slot goes to the next waiting run now, not when its done
        # callback runs (a loop iteration later), and counted among the live ones it made a
        # burst's last outcome look queued, so that the dispatcher slept through it.
        if (task := asyncio.current_task()) is not None:
            self._async_live.discard(task)
        self._fill_async()
        self._nudge(queued=bool(self._async_waiting) or len(self._async_live) >= self.concurrency)

    async def _call_async(self, run: _Run) -> _Outcome:
        try:
            output = await self._invoke_async(run)
            outcome = self._success(run, output)
        except Suspended:
            return _Outcome(run, ok=False, suspended=True)
        except asyncio.CancelledError:
            outcome = _Outcome(run, ok=False, error=f"stopped: {run.ctx.reason}")
        except BaseException as err:
            # Whatever a handler raises (SystemExit included) is its job's outcome, and never
            # stops the worker.
            outcome = self._failure(run, err)
        outcome = self._timed_out(run, outcome)
        if self._final(run, outcome):
            try:
                # Made here if this attempt reached no step: earlier ones may have.
                steps = run.ctx.step
                assert isinstance(steps, AsyncSteps)
                self._add_compensation_errors(outcome, await steps.compensate())
            except BaseException as err:
                outcome = self._compensations_stopped(outcome, err)
        return outcome

    def _invoke(self, run: _Run) -> Any:
        value = self._input(run)
        return run.job.fn(value, run.ctx) if run.job.takes_ctx else run.job.fn(value)

    async def _invoke_async(self, run: _Run) -> Any:
        value = self._input(run)
        call: Coroutine[Any, Any, Any] = (
            run.job.fn(value, run.ctx) if run.job.takes_ctx else run.job.fn(value)
        )
        return await call

    @staticmethod
    def _input(run: _Run) -> Any:
        """The handler's input, validated against the job's declaration. A row enqueued past
        App.enqueue (x-jobs enqueue, SQL, another language) may not fit it: no attempt would
        run it, so it fails for good at once, where each of its 25 attempts failed alike."""
        try:
            return run.job.validate_json(run.payload)
        except ValidationError as err:
            raise InputInvalid(
                f"X_INPUT_INVALID: the input of job {run.job.name!r} does not fit its "
                f"declared {run.job.type_name}: {err}",
                hint="Enqueue it again with an input that validates (App.enqueue checks it "
                "before it reaches the database).",
            ) from err

    def _call(self, run: _Run) -> _Outcome:
        try:
            outcome = self._success(run, self._invoke(run))
        except Suspended:
            return _Outcome(run, ok=False, suspended=True)
        except BaseException as err:
            # As in _run_async: the job's outcome, never the worker's end.
            outcome = self._failure(run, err)
        outcome = self._timed_out(run, outcome)
        if self._final(run, outcome):
            try:
                # Made here if this attempt reached no step: earlier ones may have.
                self._add_compensation_errors(outcome, run.ctx.step.compensate())
            except BaseException as err:
                outcome = self._compensations_stopped(outcome, err)
        return outcome

    @staticmethod
    def _timed_out(run: _Run, outcome: _Outcome) -> _Outcome:
        """A handler stopped by its timeout failed as timed out, whatever it answered: for good
        when it undoes its steps (its final attempt), else to be retried."""
        if not run.timed_out or outcome.lost:
            return outcome
        assert run.job.timeout is not None
        return _Outcome(
            run,
            ok=False,
            error=f"timed out after {run.job.timeout:g} s",
            stack=outcome.stack,
            retryable=not run.undoing,
        )

    def _final(self, run: _Run, outcome: _Outcome) -> bool:
        """Does this failure end the run for good, so that its compensations run and the steps
        of earlier attempts it did not reach are named? Asked of every such failure, steps or
        none: a final attempt that failed before its first step reached none, and the step rows
        (one query) still say what earlier attempts completed. Not when the worker stopped the
        handler (cancel, lost, shutdown, a timeout with attempts left): the row's next claim (or
        its burial) decides. A final attempt that timed out does (it is undoing), unless the
        dispatcher dropped the run meanwhile (handed back in a drain, lost: checked under the
        lock that the dispatcher drops runs under)."""
        if outcome.ok or outcome.lost:
            return False
        if run.ctx.is_cancelled() and not (run.undoing and run.ctx.reason == "timeout"):
            return False
        if outcome.retryable and run.ctx.attempt < run.ctx.max_attempts:
            return False
        with self._start_lock:
            return not run.done

    @staticmethod
    def _compensations_stopped(outcome: _Outcome, err: BaseException) -> _Outcome:
        """The compensations could not go on: the job was no longer held (nothing to settle
        here), or recording one failed (the job fails, saying so)."""
        if isinstance(err, JobNotHeld):
            outcome.lost = True
        stopped = f"compensations stopped: {type(err).__name__}: {err}"
        outcome.error = f"{outcome.error}; {stopped}" if outcome.error else stopped
        outcome.stack = "\n".join([outcome.stack or "", stopped])
        return outcome

    @staticmethod
    def _add_compensation_errors(outcome: _Outcome, failures: list[str]) -> None:
        """Keep both: the run's error first, then each compensation that failed (and the steps
        of earlier attempts whose compensations could not run, see Steps.compensate)."""
        if failures:
            outcome.error = "; ".join([outcome.error, *failures])
            outcome.stack = "\n".join([outcome.stack or "", *failures])

    def _success(self, run: _Run, output: Any) -> _Outcome:
        # An int is checked too: one past Python's 4300 digits has no JSON text.
        if output is not None and not isinstance(output, str | bool):
            try:
                json.dumps(output)
            except (TypeError, ValueError) as err:
                return self._failure(
                    run,
                    OutputInvalid(
                        f"X_OUTPUT_INVALID: job {run.job.name!r} returned a "
                        f"{type(output).__name__}, which is not JSON: {err}",
                        hint="Return JSON values (dict, list, str, int, float, bool, None).",
                    ),
                )
        return _Outcome(run, ok=True, output=output)

    @staticmethod
    def _failure(run: _Run, err: BaseException) -> _Outcome:
        # Whatever the exception's __str__ raises: describing it must not fail its job's outcome.
        try:
            error = f"{type(err).__name__}: {err}"
        except Exception:
            error = f"{type(err).__name__} (its message could not be read)"
        try:
            stack = "".join(traceback.format_exception(err))
        except Exception:
            stack = None
        return _Outcome(
            run,
            ok=False,
            error=error,
            stack=stack,
            retryable=not isinstance(err, PermanentError | JobNotHeld | InputInvalid),
            lost=isinstance(err, JobNotHeld),
        )

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
            running=lambda: not self._stopped.is_set() and self._stop_requests == 0,
            poll_interval=self.poll_interval,
        )


def _unknown_job(app: App, name: str) -> Job[Any]:
    """A stand-in for a claimed job this worker has no handler for (it is failed at once)."""

    def missing(_input: Any) -> None:
        raise LookupError(name)

    return Job(app=app, name=name, fn=missing)
