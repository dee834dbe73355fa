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
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from apps.workers import Fleet
from conftest import DEADLINE_SECONDS, Conn
from netcut import Proxy

from x_jobs._conn import connect, network_settings

logger = logging.getLogger(__name__)

#: The worker's lease: its heartbeat every lease/3, a handler told to stop with a quarter of it
#: left, and a call abandoned after 5 s (the least).
LEASE = 4.0


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
    fleet.wait_for(lambda: "connection timeout expired" in cut_off.log(), "a reconnect to time out")
    assert "a database call went unanswered; its connection is abandoned" in cut_off.log()

    proxy.heal()
    other.signal(signal.SIGTERM)
    assert other.wait() == 0, other.log()
    later = basic.app.enqueue(basic.noop, {}, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([later], "done"), "the healed worker to run a job")
    assert fleet.runs()[-1].pid == cut_off.pid
    cut_off.signal(signal.SIGTERM)
    assert cut_off.wait() == 0, cut_off.log()


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
    with connect(dsn, "x_jobs_test") as conn:
        got = conn.info.get_parameters()
    assert (got["connect_timeout"], got["tcp_user_timeout"], got["keepalives_idle"]) == (
        "10",
        "10000",
        "10",
    )
    with connect(f"{dsn} connect_timeout=3 keepalives_idle=60", "x_jobs_test", patience=4) as conn:
        got = conn.info.get_parameters()
    assert (got["connect_timeout"], got["tcp_user_timeout"], got["keepalives_idle"]) == (
        "3",
        "4000",
        "60",
    )
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")
    with connect(dsn, "x_jobs_test") as conn:
        assert conn.info.get_parameters()["connect_timeout"] == "7"
    assert network_settings("service=reporting") == {}
