"""A worker told to stop, stops: after SIGTERM an ``x-jobs worker`` process exits within its grace
(plus the bounded time it takes to hand its jobs back, HAND_BACK_SECONDS), whatever it was doing
when the signal came and whatever goes on around it, and its jobs come to no harm: each ends
done, and none runs twice at once.

The randomised test plays rounds of three workers on a queue of short and longer jobs (sync and
async handlers), on a timeline drawn from a seeded generator: a SIGTERM for each worker at a
moment of its life (right after its spawn, before it connected; while it claims and settles;
while the server is down, crashing or recovering; once it is back), a kill -9 of one now and
then, a server crash or a stop of a second or three. The wait on a stopped worker is a
condition with a deadline, ``proc.wait(timeout=grace + MARGIN)``; one still running then has
its stack dumped (py-spy) into the failure. The seed is printed: ``X_JOBS_SIGTERM_SEED=N``
replays a run, ``X_JOBS_SIGTERM_ROUNDS=N`` (and ``X_JOBS_SIGTERM_CHAOS_ROUNDS=N``) make a soak;
the defaults are short enough for ``make test``.

The focused tests each hold one cause a worker did not stop for: an async handler blocked in a
thread of its event loop's executor (the interpreter joined those at exit), a settlement or a
heartbeat waiting on a row lock another session holds (the worker waited for as long as the lock
was held; blocked in a heartbeat, it did not even see the signal), and the 10 s it waited for
its settler past the grace.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from apps import basic
from apps.workers import Fleet, WorkerProcess
from conftest import (
    DEADLINE_SECONDS,
    Conn,
    Connect,
    needs_pg_ctl,
    pg_ctl,
    restart_server,
    wait_for,
)
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from x_jobs.worker import HAND_BACK_SECONDS

logger = logging.getLogger(__name__)

#: How long past its grace a stopped worker may take to exit: its hand-back, a tick of its
#: watch, the interpreter's exit, on a machine shared with other tests.
MARGIN = HAND_BACK_SECONDS + 2.0
ROUNDS = int(os.environ.get("X_JOBS_SIGTERM_ROUNDS", "8"))
CHAOS_ROUNDS = int(os.environ.get("X_JOBS_SIGTERM_CHAOS_ROUNDS", "1"))
WORKERS_PER_ROUND = 3

EXITED_AT: LiteralString = """
    INSERT INTO public.worker_exit (pid, exited) VALUES (%s, %s)
    ON CONFLICT (pid) DO UPDATE SET exited = excluded.exited
"""
LOCK_WAITERS: LiteralString = """
    SELECT count(*) FROM pg_catalog.pg_stat_activity
    WHERE datname = pg_catalog.current_database() AND application_name = ANY (%s)
        AND wait_event_type = 'Lock'
"""


@pytest.fixture
def fleet(dsn: str, tmp_path: Path, admin: Conn) -> Iterator[Fleet]:
    # The test server runs with synchronous_commit off, and a crash (restart -m immediate)
    # forgets the commits of its last moments: a claim forgotten so is handed out again while
    # the worker that made it runs its job. The check that no job runs twice at once holds the
    # workers to a server that keeps what it commits.
    name = str(conninfo_to_dict(dsn)["dbname"])
    admin.execute(
        sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(sql.Identifier(name))
    )
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def _seed() -> int:
    seed = int(os.environ.get("X_JOBS_SIGTERM_SEED", random.randrange(1 << 32)))
    print(f"X_JOBS_SIGTERM_SEED={seed}")
    return seed


def stack_of(pid: int) -> str:
    """The Python stacks of every thread of process ``pid`` (py-spy), for a failure's text."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid)],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"(no stack: {err})"
    return done.stdout + done.stderr


@dataclass
class Stopped:
    """A worker that got SIGTERM, and the wait for its exit, on a thread of its own (the
    timeline goes on meanwhile): ``proc.wait(timeout=deadline)``, the deadline its grace plus
    MARGIN unless given."""

    worker: WorkerProcess
    grace: float
    moment: str
    deadline: float | None = None
    code: int | None = None
    exited: datetime | None = None
    #: The worker's stacks when it had not exited in time.
    stack: str | None = None
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        if self.deadline is None:
            self.deadline = self.grace + MARGIN
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        proc = self.worker.proc
        try:
            self.code = proc.wait(timeout=self.deadline)
        except subprocess.TimeoutExpired:
            self.stack = stack_of(proc.pid)
            proc.kill()
            proc.wait()
        self.exited = datetime.now(UTC)

    def verdict(self) -> str | None:
        """None when the worker exited in time and as it should; else what went wrong."""
        self.thread.join()
        log = self.worker.log()
        if self.stack is not None:
            return (
                f"worker {self.worker.pid} (grace {self.grace:g} s, SIGTERM {self.moment}) still "
                f"ran {self.deadline:g} s after SIGTERM; its stacks:\n{self.stack}\n"
                f"its log:\n{log[-6000:]}"
            )
        # A signal that came before the worker installed its handlers ends the process the
        # default way, before it claimed anything; after that, a drain exits 0. A worker that
        # found the server down as it started refuses to start (X_CONNECT_FAILED), signal or
        # not.
        if self.code == 0 or (self.code == -signal.SIGTERM and "worker starting" not in log):
            return None
        if "X_CONNECT_FAILED" in log and "worker stopped" not in log:
            return None
        return (
            f"worker {self.worker.pid} (grace {self.grace:g} s, SIGTERM {self.moment}) exited "
            f"{self.code}; its log:\n{log[-6000:]}"
        )

    def record(self, fleet: Fleet) -> None:
        """Write down when the process exited, for the overlap check (see Fleet.overlaps)."""
        self.thread.join()
        assert self.exited is not None
        fleet.execute(EXITED_AT, [self.worker.pid, self.exited])


class Round:
    """One round's timeline: actions at offsets from its start, played in order."""

    def __init__(self, fleet: Fleet, admin: Conn) -> None:
        self.fleet = fleet
        self.admin = admin
        self.start = time.monotonic()
        self.events: list[tuple[float, str, Callable[[], None]]] = []
        self.stopped: list[Stopped] = []
        #: The workers killed with -9, and when (written down once the server is surely up).
        self.killed: list[tuple[int, datetime]] = []
        self.server_down = False
        #: A session of the test's holding row locks of jobs, as an operator's might.
        self.locker: Conn | None = None

    def at(self, offset: float, what: str, action: Callable[[], None]) -> None:
        self.events.append((offset, what, action))

    def play(self) -> list[str]:
        """Run the timeline; answer what was done when, for a failure's text."""
        done: list[str] = []
        try:
            for offset, what, action in sorted(self.events, key=lambda e: e[0]):
                delay = self.start + offset - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the moment of a stimulus, not a wait for a condition
                action()
                done.append(f"{time.monotonic() - self.start:5.2f} {what}")
        finally:
            self.unlock()
            if self.server_down:
                self.server_up()
        for pid, exited in self.killed:
            self.fleet.execute(EXITED_AT, [pid, exited])
        return done

    def sigterm(self, worker: WorkerProcess, grace: float, moment: str) -> Callable[[], None]:
        def send() -> None:
            if worker.alive():
                worker.signal(signal.SIGTERM)
                self.stopped.append(Stopped(worker, grace, moment))

        return send

    def kill(self, worker: WorkerProcess) -> Callable[[], None]:
        def send() -> None:
            if worker.alive():
                worker.signal(signal.SIGKILL)
                worker.proc.wait()
                self.killed.append((worker.pid, datetime.now(UTC)))

        return send

    def lock(self, ids: list[int]) -> Callable[[], None]:
        """Hold the row locks of the jobs of ``ids`` that run then (those free within a second)
        until unlock(): their settlements and heartbeats wait for them meanwhile."""

        def take() -> None:
            self.unlock()
            try:
                self.locker = psycopg.connect(self.fleet.dsn, application_name="x_jobs_test_lock")
                self.locker.execute("SET lock_timeout = '1s'")
                self.locker.execute(
                    "SELECT id FROM x_jobs.job WHERE id = ANY (%s) AND state = 'running'"
                    " FOR UPDATE",
                    [ids],
                )
            except psycopg.OperationalError:
                self.unlock()  # the server is down, or a worker held a row for a second

        return take

    def unlock(self) -> None:
        if self.locker is not None:
            self.locker.close()  # its transaction rolls back
            self.locker = None

    def server_crash(self) -> None:
        """The server crashes and recovers at once."""
        restart_server(self.admin, "-m", "immediate")
        self.server_down = False

    def server_stop(self) -> None:
        done = pg_ctl("stop", "-m", "immediate")
        assert done.returncode == 0, done.stdout + done.stderr
        self.server_down = True

    def server_up(self) -> None:
        restart_server(self.admin)  # pg_ctl restart starts a server that is not running
        self.server_down = False

    def failures(self, header: str, timeline: list[str]) -> list[str]:
        """What went wrong with the stopped workers (their exits written down)."""
        found = []
        for stopped in self.stopped:
            verdict = stopped.verdict()
            stopped.record(self.fleet)
            if verdict is not None:
                found.append(f"{header}:\n  " + "\n  ".join(timeline) + "\n" + verdict)
        return found


def _plan(
    rng: random.Random, round_: Round, workers: list[tuple[WorkerProcess, float]], ids: list[int]
) -> None:
    """Draw a round's timeline: a SIGTERM per worker at a moment of its life, and chaos."""
    if rng.random() < 0.5:
        begin = rng.uniform(0.8, 2.0)  # the longer jobs run, and a heedless one
        round_.at(begin, "lock the rows of the jobs running", round_.lock(ids))
        round_.at(begin + rng.uniform(2.0, 6.0), "unlock them", round_.unlock)
    crash_at: float | None = None
    down: tuple[float, float] | None = None
    chaos = rng.choice(["none", "crash", "crash", "down", "down"])
    if chaos == "crash":
        crash_at = rng.uniform(0.5, 3.0)
        round_.at(crash_at, "server crash (restart -m immediate)", round_.server_crash)
    elif chaos == "down":
        begin = rng.uniform(0.5, 2.5)
        down = (begin, begin + rng.uniform(0.5, 3.0))
        round_.at(down[0], "server stop -m immediate", round_.server_stop)
        round_.at(down[1], "server start", round_.server_up)
    victim = rng.randrange(len(workers)) if rng.random() < 0.4 else None
    for n, (worker, grace) in enumerate(workers):
        if n == victim:
            round_.at(rng.uniform(0.5, 3.0), f"kill -9 worker {n}", round_.kill(worker))
            continue
        moments = ["spawn", "running", "late"]
        if crash_at is not None:
            moments += ["crash", "crash"]
        if down is not None:
            moments += ["down", "down", "back"]
        moment = rng.choice(moments)
        if moment == "spawn":  # before it has connected, or while it does
            offset = rng.uniform(0.0, 1.2)
        elif moment == "running":  # claiming, running, settling
            offset = rng.uniform(1.0, 3.0)
        elif moment == "late":  # after any chaos; maybe idle, polling
            offset = rng.uniform(3.0, 5.0)
        elif moment == "crash":  # around the crash: losing the connection, reconnecting
            assert crash_at is not None
            offset = max(0.0, crash_at + rng.uniform(-0.2, 0.8))
        elif moment == "down":  # while the server is down: in the reconnect backoff
            assert down is not None
            offset = rng.uniform(*down)
        else:  # just after the server is back: reconnecting, settling what waited
            assert down is not None
            offset = down[1] + rng.uniform(0.0, 0.7)
        what = f"SIGTERM worker {n} pid {worker.pid} (grace {grace:g}, {moment})"
        round_.at(offset, what, round_.sigterm(worker, grace, moment))


def _overlap_report(fleet: Fleet, seed: int | None, overlaps: list[tuple[Any, ...]]) -> str:
    jobs = {row[0] for row in overlaps}
    runs = [run for run in fleet.runs() if run.job_id in jobs]
    exits = dict(fleet.execute("SELECT pid, exited FROM public.worker_exit"))
    lines = [f"seed {seed}: jobs run twice at once: {overlaps}"]
    for run in runs:
        lines.append(
            f"  job {run.job_id} attempt {run.attempt} pid {run.pid}: {run.started} to "
            f"{run.finished} ({run.outcome}); the process exited {exits.get(run.pid)}"
        )
    pids = {run.pid for run in runs}
    lines += [f"--- worker {w.pid}:\n{w.log()[-5000:]}" for w in fleet.workers if w.pid in pids]
    return "\n".join(lines)


def _finish(
    fleet: Fleet, ids: list[int], seed: int | None, heedless: frozenset[int] = frozenset()
) -> None:
    """One more worker runs what is left: every job ends done, none ran twice at once. Except
    ``heedless`` ones: a handler that ignores its stop runs until its process ends, and that
    may be just after its job was handed back (see docs/python.md, "The worker")."""
    last = fleet.start(concurrency=32, lease=2, poll=0.05)
    fleet.wait_for(lambda: "worker starting" in last.log(), "the last worker to start")
    try:
        # What a soak's rounds leave takes longer: about a second a hundred jobs.
        wait_for(
            lambda: fleet.all_in(ids, "done"),
            "the last worker to finish every job",
            timeout=DEADLINE_SECONDS + len(ids) / 100,
        )
    except pytest.fail.Exception as err:
        pytest.fail(f"{err}\n{fleet.report()}")
    overlaps = [row for row in fleet.overlaps() if row[0] not in heedless]
    assert overlaps == [], _overlap_report(fleet, seed, overlaps)
    last.signal(signal.SIGTERM)
    assert last.wait() == 0, last.log()


@needs_pg_ctl
def test_sigterm_at_random_moments_ends_each_worker_within_its_grace(
    fleet: Fleet, connect: Connect, admin: Conn
) -> None:
    seed = _seed()
    rng = random.Random(seed)
    ids: list[int] = []
    heedless: set[int] = set()
    for number in range(ROUNDS):
        # Many short jobs (claims and settlements all the time) and a few that outlast a small
        # grace (handed back when it runs out), sync and async (asyncio.to_thread); now and
        # then one whose handler heeds no stop, blocked in a thread until the round is over.
        job = rng.choice([basic.sleep, basic.async_thread_sleep])
        inputs = [{"seconds": rng.uniform(0.0, 0.05)} for _ in range(150)]
        inputs += [{"seconds": rng.uniform(0.5, 2.5)} for _ in range(4)]
        # A connection of the round's own: the last round may have crashed the server.
        db = connect()
        round_ids = [e.id for e in basic.app.enqueue_many(job, inputs, conn=db)]
        gate = f"round-{number}"
        if rng.random() < 0.5:
            stubborn = basic.app.enqueue(basic.async_thread_gated, {"gate": gate}, conn=db).id
            heedless.add(stubborn)
            round_ids.append(stubborn)
        ids += round_ids
        round_ = Round(fleet, admin)
        workers = [
            (
                fleet.start(
                    concurrency=rng.choice([1, 2, 4, 8]),
                    lease=rng.choice([1.0, 2.0, 3.0]),
                    poll=rng.choice([0.05, 0.2, 1.0]),
                    grace=grace,
                ),
                grace,
            )
            for grace in (rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(WORKERS_PER_ROUND))
        ]
        _plan(rng, round_, workers, round_ids)
        timeline = round_.play()
        failures = round_.failures(f"round {number} of seed {seed}, {job.name} jobs", timeline)
        for worker, _grace in workers:  # killed by the timeline, or stopped before it spawned
            if worker.alive():
                worker.kill()
        fleet.open_gate(gate)
        assert not failures, "\n\n".join(failures)
    _finish(fleet, ids, seed, frozenset(heedless))


@needs_pg_ctl
def test_sigterm_after_a_run_of_kills_and_a_crash_ends_each_worker_within_its_grace(
    fleet: Fleet, connect: Connect, admin: Conn
) -> None:
    """Three workers, one killed with -9 (and replaced) every few seconds, the server crashed
    mid-run; once every job is done, SIGTERM to each worker."""
    seed = _seed()
    rng = random.Random(seed)
    grace = 10.0
    for number in range(CHAOS_ROUNDS):
        inputs = [{"seconds": rng.uniform(0.01, 0.3)} for _ in range(300)]
        ids = [e.id for e in basic.app.enqueue_many(basic.sleep, inputs, conn=connect())]
        round_ = Round(fleet, admin)
        workers = [fleet.start(grace=grace) for _ in range(WORKERS_PER_ROUND)]
        round_.at(rng.uniform(1.0, 5.0), "server crash (restart -m immediate)", round_.server_crash)

        def replace(
            slot: int, round_: Round = round_, workers: list[WorkerProcess] = workers
        ) -> Callable[[], None]:
            def send() -> None:
                round_.kill(workers[slot])()
                workers[slot] = fleet.start(grace=grace)

            return send

        at = 0.0
        while (at := at + rng.uniform(1.0, 3.0)) < 7.0:
            round_.at(at, "kill -9 a worker, start another", replace(rng.randrange(len(workers))))
        timeline = round_.play()
        fleet.wait_for(partial(fleet.all_in, ids, "done"), "every job to be done")
        for worker in workers:
            round_.sigterm(worker, grace, "idle, after the chaos")()
        failures = round_.failures(f"round {number} of seed {seed}", timeline)
        assert not failures, "\n\n".join(failures)
        overlaps = fleet.overlaps()
        assert overlaps == [], _overlap_report(fleet, seed, overlaps)


def test_an_async_handler_blocked_in_a_thread_does_not_keep_the_process_past_its_grace(
    fleet: Fleet, conn: Conn
) -> None:
    """An async handler awaits a blocking call that heeds no stop (asyncio.to_thread). The
    interpreter joined the event loop's executor threads at exit: the worker logged that it
    stopped at its grace, and its process ran on until the call returned, the job it had
    handed back free to run elsewhere meanwhile."""
    job_id = basic.app.enqueue(basic.async_thread_gated, {}, conn=conn).id
    worker = fleet.start(concurrency=1, lease=2, grace=0.5)
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the handler to start")
    worker.signal(signal.SIGTERM)
    stopped = Stopped(worker, 0.5, "while its handler waits in a thread")
    assert stopped.verdict() is None, stopped.verdict()
    stopped.record(fleet)
    # Handed back at the grace: due again, the attempt not counted.
    assert fleet.execute(
        "SELECT state::text, attempt, claimed_by FROM x_jobs.job WHERE id = %s", [job_id]
    ) == [("ready", 0, None)]

    fleet.open_gate()
    _finish(fleet, [job_id], None)


def _signals_handled(worker: WorkerProcess, count: int) -> bool:
    return worker.log().count("signal received") == count


@pytest.mark.parametrize(
    ("waiting", "grace", "signals"),
    [
        # Its settlement waits: it was waited for 10 s past the grace.
        (["x_jobs settler"], 0.5, 1),
        # Its heartbeat waits too: the dispatcher, blocked, did not see the signal at all.
        (["x_jobs settler", "x_jobs worker"], 0.5, 1),
        # A second signal stops it at once, blocked or not.
        (["x_jobs settler", "x_jobs worker"], 3600.0, 2),
    ],
    ids=["settler", "dispatcher", "second-signal"],
)
def test_a_call_waiting_on_a_lock_does_not_keep_the_worker_past_its_grace(
    fleet: Fleet, connect: Connect, waiting: list[str], grace: float, signals: int
) -> None:
    """Another session holds the row lock of a job whose handler has returned: its settlement
    (and then its heartbeat) waits for the lock, and the server is at work on it the while, so
    that the watch of calls leaves it waiting. The worker must exit all the same, leaving the
    job to its lease: nothing is lost, and nothing runs twice."""
    job_id = basic.app.enqueue(basic.gated, {}, conn=connect()).id
    worker = fleet.start(concurrency=1, lease=3, grace=grace)
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the handler to start")
    locker = connect(autocommit=False)
    locker.execute("SELECT id FROM x_jobs.job WHERE id = %s FOR UPDATE", [job_id])
    fleet.open_gate()
    fleet.wait_for(
        lambda: fleet.scalar(LOCK_WAITERS, [waiting]) == len(waiting),
        f"{' and '.join(waiting)} to wait on the row lock",
    )
    for n in range(1, signals + 1):
        worker.signal(signal.SIGTERM)
        # Two signals pending at once are one: the next is sent once this one was handled.
        fleet.wait_for(partial(_signals_handled, worker, n), "the worker to handle the signal")
    # A second signal: no grace left, only the hand-back.
    stopped = Stopped(
        worker, grace, "while a call waits on a lock", deadline=MARGIN if signals == 2 else None
    )
    try:
        assert stopped.verdict() is None, stopped.verdict()
    finally:
        locker.rollback()
    stopped.record(fleet)
    assert "jobs left to their leases" in worker.log(), worker.log()
    _finish(fleet, [job_id], None)
