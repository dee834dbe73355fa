"""SIGTERM stops a worker process gracefully: it drains (claims nothing more, finishes what runs
within its grace), hands back what is still running when the grace runs out, and a second
SIGTERM stops it at once. Nothing is lost: another worker runs the rest.

The long jobs are ``gated`` (see ``apps.basic``): they run until the test opens their gate, so
"still running when the signal comes" is a fact the test sets up, not a guess about timing.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps import basic
from apps.workers import Fleet, WorkerProcess
from conftest import DEADLINE_SECONDS, Conn

import x_jobs
from x_jobs.relay import Relay

logger = logging.getLogger(__name__)


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def _started_by(fleet: Fleet, worker: WorkerProcess) -> set[int]:
    return {run.job_id for run in fleet.runs() if run.pid == worker.pid}


def _draining(fleet: Fleet, worker_id: str) -> bool:
    rows = fleet.execute("SELECT draining_at FROM x_jobs.worker WHERE id = %s", [worker_id])
    return bool(rows) and rows[0][0] is not None


def _rows(conn: Conn, ids: list[int]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, state::text, attempt, claimed_by, visible_at FROM x_jobs.job"
        " WHERE id = ANY (%s) ORDER BY id",
        [ids],
    ).fetchall()


def test_sigterm_finishes_the_running_jobs_claims_nothing_more_and_exits_0(
    fleet: Fleet, conn: Conn
) -> None:
    # Four long jobs first in the queue, then twenty short ones waiting behind them.
    long_ids = [e.id for e in basic.app.enqueue_many(basic.gated, [{}] * 4, conn=conn)]
    short_ids = [
        e.id for e in basic.app.enqueue_many(basic.sleep, [{"seconds": 0.05}] * 20, conn=conn)
    ]
    a = fleet.start(concurrency=2, grace=120)
    fleet.wait_for(lambda: len(_started_by(fleet, a)) == 2, "A to start two jobs")
    in_flight = _started_by(fleet, a)
    assert in_flight < set(long_ids)
    a_id = fleet.worker_id(a)

    a.signal(signal.SIGTERM)
    fleet.wait_for(lambda: _draining(fleet, a_id), "A to announce that it drains")
    # Draining, A holds only what it runs: whatever else it had claimed ahead (its prefetch)
    # is handed back, its attempt not counted.
    waiting = sorted(set(long_ids + short_ids) - in_flight)
    assert _rows(conn, waiting) == [(job_id, "ready", 0, None, None) for job_id in waiting]
    b = fleet.start(concurrency=8)
    fleet.wait_for(lambda: fleet.all_in(short_ids, "done"), "B to run the waiting jobs")
    # A still waits for its two jobs, which hold their gate: its grace is far from over.
    assert a.alive(), fleet.report()

    fleet.open_gate()
    assert a.wait() == 0, a.log()
    fleet.wait_for(lambda: fleet.all_in(long_ids + short_ids, "done"), "every job to be done")

    runs = fleet.runs()
    # A ran the two jobs it had when the signal came, to the end, and claimed nothing more.
    a_runs = [(r.job_id, r.attempt, r.outcome) for r in runs if r.pid == a.pid]
    assert sorted(a_runs) == [(job_id, 1, "returned") for job_id in sorted(in_flight)]
    rows = conn.execute(
        "SELECT id, claimed_by FROM x_jobs.job WHERE id = ANY (%s) ORDER BY id",
        [sorted(in_flight)],
    ).fetchall()
    assert rows == [(job_id, a_id) for job_id in sorted(in_flight)]
    # B ran all the others; every job ran exactly once.
    b_runs = sorted(r.job_id for r in runs if r.pid == b.pid)
    assert b_runs == sorted(set(long_ids + short_ids) - in_flight)
    assert len(runs) == len(long_ids + short_ids)
    assert all((r.attempt, r.outcome) == (1, "returned") for r in runs), runs
    assert fleet.overlaps() == []


def test_a_drain_whose_grace_runs_out_hands_the_jobs_back(fleet: Fleet, conn: Conn) -> None:
    ids = [e.id for e in basic.app.enqueue_many(basic.gated, [{}] * 2, conn=conn)]
    a = fleet.start(concurrency=2, grace=0.5)
    fleet.wait_for(lambda: _started_by(fleet, a) == set(ids), "A to start both jobs")

    a.signal(signal.SIGTERM)
    assert a.wait() == 0, a.log()
    # Handed back (x_jobs.release) before A exited, not left to a lapsing lease: due again at
    # once, unheld, and the interrupted attempt is not counted. No other worker runs yet.
    assert _rows(conn, ids) == [(job_id, "ready", 0, None, None) for job_id in ids]
    assert (
        conn.execute(
            "SELECT job_id FROM x_jobs.job_error WHERE job_id = ANY (%s)", [ids]
        ).fetchall()
        == []
    ), "a hand-back is no failed attempt"

    fleet.open_gate()
    b = fleet.start()
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "B to run the handed-back jobs")
    assert [row[:3] for row in _rows(conn, ids)] == [(job_id, "done", 1) for job_id in ids]
    b_runs = sorted((r.job_id, r.attempt, r.outcome) for r in fleet.runs() if r.pid == b.pid)
    assert b_runs == [(job_id, 1, "returned") for job_id in ids]
    assert fleet.overlaps() == []


def test_a_drain_rides_out_a_connection_lost_just_before_the_signal(
    fleet: Fleet, conn: Conn
) -> None:
    job_id = basic.app.enqueue(basic.gated, {}, conn=conn).id
    # A long poll and a 2 s heartbeat: once the job runs, the worker leaves its connection
    # alone for a while, so the first statement to meet the dead connection is the draining
    # announce that the signal triggers.
    a = fleet.start(concurrency=1, lease=6, poll=60, grace=3600)
    fleet.wait_for(lambda: _started_by(fleet, a) == {job_id}, "A to start the job")
    lease = conn.execute("SELECT visible_at FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    assert lease is not None

    terminated = conn.execute(
        "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
        " WHERE datname = pg_catalog.current_database() AND application_name = 'x_jobs worker'"
    ).fetchall()
    assert terminated == [(True,)]
    a.signal(signal.SIGTERM)

    # The worker reconnects and goes on heartbeating the job it drains.
    def lease_extended() -> bool:
        row = conn.execute("SELECT visible_at FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
        return not a.alive() or (row is not None and row[0] > lease[0])

    fleet.wait_for(lease_extended, "A to heartbeat the job again")
    assert a.alive(), a.log()
    fleet.open_gate()
    assert a.wait() == 0, a.log()
    assert fleet.states([job_id]) == {job_id: "done"}


def test_a_second_sigterm_stops_at_once(fleet: Fleet, conn: Conn) -> None:
    ids = [e.id for e in basic.app.enqueue_many(basic.gated, [{}] * 2, conn=conn)]
    # A grace far longer than the test's deadlines: exiting at all proves the second signal
    # cut the drain short.
    a = fleet.start(concurrency=2, grace=3600)
    fleet.wait_for(lambda: _started_by(fleet, a) == set(ids), "A to start both jobs")
    a_id = fleet.worker_id(a)

    a.signal(signal.SIGTERM)
    fleet.wait_for(lambda: _draining(fleet, a_id), "A to announce that it drains")
    a.signal(signal.SIGTERM)
    assert a.wait() == 0, a.log()
    # What ran is handed back, as when the grace runs out.
    assert _rows(conn, ids) == [(job_id, "ready", 0, None, None) for job_id in ids]


@pytest.mark.parametrize("kind", ["worker", "relay"])
def test_a_signal_that_lands_while_the_loop_holds_its_wake_lock_does_not_hang(
    dsn: str, kind: str
) -> None:
    """A signal handler runs in the main thread, maybe while that thread is inside the wake
    event's wait or clear, holding the event's lock. The handler must not take that lock itself
    (a worker hung for good on two SIGTERMs 2 ms apart). Here the lock is held by the thread
    that calls the handler, as the main thread would hold it."""
    app = x_jobs.App(dsn)
    app.outbox.sink("t")(lambda message: None)
    loop: x_jobs.Worker | Relay = (
        x_jobs.Worker(basic.app, queues=["default"]) if kind == "worker" else Relay(app)
    )
    wake = loop._wake
    handled = threading.Event()

    def signalled_mid_wait() -> None:
        with wake._cond:  # type: ignore[attr-defined]  # what Event.wait/clear hold
            loop._on_signal(signal.SIGTERM, None)
        handled.set()

    threading.Thread(target=signalled_mid_wait, daemon=True).start()
    assert handled.wait(DEADLINE_SECONDS), "the signal handler waited for a lock its thread holds"
    assert wake.wait(DEADLINE_SECONDS)
    assert loop._stop_requests == 1
