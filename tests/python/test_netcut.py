"""A worker whose network to the database goes silent: no reset, no error, no answer.

The worker reaches the server through :class:`netcut.Proxy`, a TCP way the test cuts: calls
already sent are never answered and new connections never complete, as when a NAT forgets a
connection or the server's host drops off the network. The worker's dispatcher waited in its
heartbeat for good: its handlers ran on while their leases lapsed and another worker ran the
same jobs beside them, and after the network healed the worker still waited in that call.

Here the worker tells a handler to stop before its lease can lapse, abandons the call that is
never answered, gives up on connects that never complete, and works again once the network is
back. Its handlers record their runs over the usual way (``apps.basic``), which is not cut.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from apps.workers import Fleet
from conftest import DEADLINE_SECONDS, Conn, Connect, wait_for
from netcut import Proxy

from x_jobs import _conn

logger = logging.getLogger(__name__)

#: The worker's lease: its heartbeat every lease/3, a handler told to stop with a quarter of it
#: left, and a call abandoned after 5 s (the least).
LEASE = 4.0
#: How long the lock test holds its lock: past both of those.
LOCK_HELD_SECONDS = 7.0
#: How long a lock is held once a call waits for it, for a probe to find the call at work
#: (probes run every half heartbeat interval, 0.67 s at this lease).
PROBED_AT_WORK_SECONDS = 2.0


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def test_a_worker_cut_off_stops_its_handler_before_the_lease_lapses_and_recovers(
    fleet: Fleet, conn: Conn, proxy: Proxy
) -> None:
    """Cut while a gated job runs: the handler is told to stop ("lease") before the row's
    lease lapses, so that the other worker, which takes the job once it lapsed, never runs it
    beside the first. Healed, the cut-off worker leaves its dead connection and runs jobs."""
    job_id = basic.app.enqueue(basic.gated, {"gate": "first"}, conn=conn).id
    cut_off = fleet.start(concurrency=2, lease=LEASE, via=proxy.dsn(fleet.dbname))
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the worker to start the job")

    proxy.cut()
    fleet.wait_for(
        lambda: fleet.runs()[0].outcome is not None, "the cut-off handler to be told to stop"
    )
    first = fleet.runs()[0]
    assert first.outcome == "cancelled:lease", cut_off.log()
    # Stopped before the lease it last renewed ran out: until then no claim may take the job.
    lapses = fleet.scalar("SELECT visible_at FROM x_jobs.job WHERE id = %s", [job_id])
    assert first.finished is not None and first.finished < lapses, (first, lapses)

    other = fleet.start(concurrency=2, lease=LEASE)
    fleet.wait_for(lambda: len(fleet.runs()) == 2, "the other worker to take the lapsed job")
    fleet.open_gate("first")
    fleet.wait_for(lambda: fleet.all_in([job_id], "done"), "the job to be done")
    second = fleet.runs()[1]
    assert second.pid == other.pid
    assert fleet.overlaps() == []

    # Its heartbeat, never answered, was abandoned; then its connects never completed.
    fleet.wait_for(lambda: "its connection is abandoned" in cut_off.log(), "the call abandoned")
    fleet.wait_for(
        lambda: (
            'unreachable; retrying retry_in_s=0.1 error="connection timeout expired"'
            in cut_off.log()
        ),
        "a reconnect to time out",
    )

    proxy.heal()
    other.signal(signal.SIGTERM)
    assert other.wait() == 0, other.log()
    later = basic.app.enqueue(basic.noop, {}, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([later], "done"), "the healed worker to run a job")
    assert fleet.runs()[-1].pid == cut_off.pid
    cut_off.signal(signal.SIGTERM)
    assert cut_off.wait() == 0, cut_off.log()


def test_a_worker_whose_reconnects_are_refused_still_stops_its_handler_in_time(
    fleet: Fleet, proxy: Proxy, conn: Conn
) -> None:
    """Cut, and then every new connection refused at once (a firewall that rejects, a route
    gone): a refusal was taken for a server down for everyone, so once the unanswered call was
    abandoned the handler ran on past its lease, beside the worker that took the job (a
    review, 2 of 2). At the default lease of 30 s the heartbeat sent 5 s after the last
    renewal is abandoned 15 s later, before the handler's stop is due (22.5 s): the case."""
    lease = 30.0
    job_id = basic.app.enqueue(basic.gated, {"gate": "refused"}, conn=conn).id
    cut_off = fleet.start(concurrency=2, lease=lease, via=proxy.dsn(fleet.dbname))
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the worker to start the job")

    proxy.cut()
    proxy.refuse()
    try:
        wait_for(
            lambda: fleet.runs()[0].outcome is not None,
            "the cut-off handler to be told to stop",
            timeout=lease + DEADLINE_SECONDS,
        )
    except pytest.fail.Exception as err:
        pytest.fail(f"{err}\n{fleet.report()}")
    first = fleet.runs()[0]
    assert first.outcome == "cancelled:lease", cut_off.log()
    lapses = fleet.scalar("SELECT visible_at FROM x_jobs.job WHERE id = %s", [job_id])
    assert first.finished is not None and first.finished < lapses, (first, lapses)
    assert "its connection is abandoned" in cut_off.log()


def test_a_call_waiting_for_a_lock_is_neither_given_up_nor_taken_for_silence(
    fleet: Fleet, conn: Conn, connect: Connect
) -> None:
    """Another session holds a SHARE lock on x_jobs.job (what CREATE INDEX takes, an update of
    the extension included) past the time a handler's stop is due and past the call limit: the
    worker's calls wait for it. The server answers a new connection all along, so nothing is
    stopped or given up: a review saw the handler stopped for nothing, and an abandoned claim
    commit all the same, its jobs this worker's unknown to it, buried at their lapse unrun."""
    job_id = basic.app.enqueue(basic.gated, {"gate": "locked"}, conn=conn).id
    worker = fleet.start(concurrency=8, lease=LEASE)
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the worker to start the job")
    # Due once the lock is held: the worker's next claim waits for it too.
    later = [
        e.id
        for e in basic.app.enqueue_many(
            basic.noop,
            [{}] * 3,
            max_attempts=1,
            delay=1.0,
            conn=conn,
        )
    ]
    locker = connect(autocommit=False, name="locker")
    locker.execute("LOCK TABLE x_jobs.job IN SHARE MODE")
    # Held past the stop's due time (2.7 s after the last renewal) and the call limit (5 s).
    time.sleep(LOCK_HELD_SECONDS)
    locker.rollback()

    fleet.open_gate("locked")
    fleet.wait_for(lambda: fleet.all_in([job_id, *later], "done"), "every job to be done")
    assert fleet.runs()[0].outcome == "returned", worker.log()
    assert "abandoned" not in worker.log()
    assert "leases went unrenewed" not in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def test_a_claim_whose_answer_is_lost_hands_its_jobs_back(
    fleet: Fleet, conn: Conn, connect: Connect, proxy: Proxy
) -> None:
    """The server carries out a claim and commits it, and its answer is lost on the way: the
    jobs were this worker's in the database, unknown to it, until their lease lapsed, and one
    on its final attempt was then buried without having run. Once it can reach the database
    again, the worker hands back the jobs it holds there and does not know of, and they run.
    (The claim is held on a lock until the answers are being dropped, so that it is the one
    whose answer is lost.)"""
    worker = fleet.start(concurrency=4, lease=LEASE, via=proxy.dsn(fleet.dbname))
    fleet.wait_for(
        lambda: int(fleet.scalar("SELECT count(*) FROM x_jobs.worker")) == 1,
        "the worker to announce itself",
    )
    conn.execute("SELECT x_jobs.pause_queue('default')")
    ids = [e.id for e in basic.app.enqueue_many(basic.noop, [{}] * 3, max_attempts=1, conn=conn)]
    locker = connect(autocommit=False, name="locker")
    locker.execute("LOCK TABLE x_jobs.job IN SHARE MODE")
    conn.execute("SELECT x_jobs.resume_queue('default')")
    fleet.wait_for(
        lambda: bool(
            fleet.scalar(
                "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity"
                " WHERE application_name = 'x_jobs worker' AND wait_event_type = 'Lock')"
            )
        ),
        "the worker's claim to wait for the lock",
    )
    proxy.drop_answers()
    locker.rollback()
    fleet.wait_for(lambda: fleet.all_in(ids, "running"), "the worker's claim to commit")
    proxy.heal()

    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "the jobs to run once the answer is lost")
    assert sorted(run.job_id for run in fleet.runs()) == sorted(ids)
    assert "handed back jobs taken by a claim whose answer was lost" in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def _wait_for_the_heartbeat_to_wait(fleet: Fleet, locker: Conn) -> None:
    """Hold a SHARE lock on x_jobs.job until the worker's heartbeat waits for it, and a while
    more: long enough for a probe to find it at work on the call."""
    locker.execute("LOCK TABLE x_jobs.job IN SHARE MODE")
    fleet.wait_for(
        lambda: bool(
            fleet.scalar(
                "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity"
                " WHERE application_name = 'x_jobs worker' AND wait_event_type = 'Lock')"
            )
        ),
        "the worker's heartbeat to wait for the lock",
    )
    time.sleep(PROBED_AT_WORK_SECONDS)


def test_a_call_found_at_work_that_then_goes_silent_stops_the_handler_in_time(
    fleet: Fleet, conn: Conn, connect: Connect, proxy: Proxy
) -> None:
    """The heartbeat waits for a lock and a probe finds its server process at work; then the
    network goes silent and the lock goes. One such answer covered the call for good: no
    other probe, no stop, and the handler ran on beside the worker that took the job as lapsed
    (a review, 2 of 2)."""
    job_id = basic.app.enqueue(basic.gated, {"gate": "then-silent"}, conn=conn).id
    cut_off = fleet.start(concurrency=2, lease=LEASE, via=proxy.dsn(fleet.dbname))
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the worker to start the job")
    locker = connect(autocommit=False, name="locker")
    _wait_for_the_heartbeat_to_wait(fleet, locker)
    proxy.cut()
    locker.rollback()

    fleet.wait_for(
        lambda: fleet.runs()[0].outcome is not None, "the cut-off handler to be told to stop"
    )
    first = fleet.runs()[0]
    assert first.outcome == "cancelled:lease", cut_off.log()
    lapses = fleet.scalar("SELECT visible_at FROM x_jobs.job WHERE id = %s", [job_id])
    assert first.finished is not None and first.finished < lapses, (first, lapses)


def test_a_call_found_at_work_whose_answer_is_then_lost_is_given_up(
    fleet: Fleet, conn: Conn, connect: Connect, proxy: Proxy
) -> None:
    """The same, but only the heartbeat's answer is lost and the server answers new
    connections at once: the dispatcher waited for good, its server process idle."""
    fleet_job = basic.app.enqueue(basic.gated, {"gate": "then-lost"}, conn=conn).id
    worker = fleet.start(concurrency=2, lease=LEASE, via=proxy.dsn(fleet.dbname))
    fleet.wait_for(lambda: len(fleet.runs()) == 1, "the worker to start the job")
    locker = connect(autocommit=False, name="locker")
    _wait_for_the_heartbeat_to_wait(fleet, locker)
    proxy.drop_answers()
    locker.rollback()
    fleet.wait_for(
        lambda: (
            not bool(
                fleet.scalar(
                    "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity"
                    " WHERE application_name = 'x_jobs worker' AND state <> 'idle')"
                )
            )
        ),
        "the heartbeat to be done on the server",
    )
    proxy.heal()

    fleet.wait_for(lambda: "answer was lost" in worker.log(), "the call to be given up on")
    fleet.open_gate("then-lost")
    fleet.wait_for(lambda: fleet.all_in([fleet_job], "done"), "the job to be done")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def test_a_command_gives_up_on_a_database_that_never_answers(proxy: Proxy, fleet: Fleet) -> None:
    """`x-jobs queues` against a server whose connect never completes: it ends with exit 2 and
    a connection error after the client's connect_timeout (libpq alone waits for good), and
    names no password."""
    proxy.cut()
    dsn = proxy.dsn(fleet.dbname) + " password=s3cret"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "x_jobs", "queues", "--dsn", dsn],
            capture_output=True,
            text=True,
            timeout=DEADLINE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("x-jobs queues still waits for a database that never answers")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "timeout expired" in done.stderr, done.stderr
    assert "s3cret" not in done.stdout + done.stderr


def test_connections_bound_their_waits_unless_the_dsn_says_otherwise(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection of the client opens with a connect timeout, a TCP user timeout and
    keepalives; what the DSN (or PGCONNECT_TIMEOUT) sets is kept, and a DSN naming a service
    is left to its service file."""
    with _conn.connect(dsn, "x_jobs_test") as conn:
        got = conn.info.get_parameters()
    assert (got["connect_timeout"], got["tcp_user_timeout"], got["keepalives_idle"]) == (
        "10",
        "10000",
        "10",
    )
    with _conn.connect(
        f"{dsn} connect_timeout=3 keepalives_idle=60", "x_jobs_test", patience=4
    ) as conn:
        got = conn.info.get_parameters()
    assert (got["connect_timeout"], got["tcp_user_timeout"], got["keepalives_idle"]) == (
        "3",
        "4000",
        "60",
    )
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    with _conn.connect(dsn, "x_jobs_test") as conn:
        assert conn.info.get_parameters()["connect_timeout"] == "7"
    assert _conn.network_settings("service=reporting") == {}
