"""A worker keeps its clocks while the database is away, and does not start a claimed job that was
cancelled while it waited in the local queue.

While the worker waited for the database to come back it looked at nothing else: a SIGTERM's
grace ran out unseen (with the server down for good, one SIGTERM never ended the worker), and a
job's timeout told its handler to stop only once the database answered again. And a job claimed
ahead (prefetched) and cancelled before its handler started was started all the same, to be told
to stop at the next heartbeat.

The handlers are in ``apps.outage``; they note what they see in files, since the tests stop the
server (``X_JOBS_PG_CTL``, which scripts/throwaway-pg sets) while they run.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import outage
from apps.workers import Fleet
from conftest import DEADLINE_SECONDS, Conn, needs_pg_ctl, pg_ctl, server_stopped, wait_for

logger = logging.getLogger(__name__)

TARGET = "apps.outage:app"


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


@pytest.fixture
def notes(tmp_path: Path) -> outage.Notes:
    """Where the handlers note what they see (the input of every job of these tests)."""
    path = tmp_path / "notes"
    path.mkdir()
    return outage.Notes(dir=str(path))


def _server_running() -> bool:
    return pg_ctl("status").returncode == 0  # 3: not running


def _note(notes: outage.Notes, name: str) -> Path:
    return Path(notes.dir) / name


def _wait_for_note(fleet: Fleet, notes: outage.Notes, name: str) -> str:
    """Wait for the handlers' note ``name``; answer what it says. Reads no database."""
    path = _note(notes, name)
    try:
        wait_for(path.exists, f"the note {name}")
    except pytest.fail.Exception as err:
        pytest.fail(f"{err}\n{fleet.report()}")
    return path.read_text()


@needs_pg_ctl
def test_sigterm_while_the_database_is_away_exits_at_the_grace_leaving_the_job_to_its_lease(
    fleet: Fleet, conn: Conn, admin: Conn, notes: outage.Notes
) -> None:
    """SIGTERM with --grace 1 while the server is down: the worker exits 0 at the grace without
    waiting for the database (it waited for it, however long, and only a second signal ended
    the wait). The job it ran is left to its lease, and another worker runs it once that lapsed."""
    job_id = outage.hold.enqueue(notes, conn=conn).id
    first = fleet.start(concurrency=1, lease=2, grace=1, target=TARGET)
    _wait_for_note(fleet, notes, f"start-{job_id}-1")

    with server_stopped(admin):
        first.signal(signal.SIGTERM)
        try:
            code = first.proc.wait(DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker still runs with the database away\n{fleet.report()}")
        # Exited while the server was down: it is started only when this block ends.
        assert not _server_running()
    assert code == 0, first.log()
    assert "jobs left to their leases" in first.log(), first.log()
    assert "left_to_leases=1" in first.log(), first.log()

    second = fleet.start(concurrency=1, lease=2, target=TARGET)
    fleet.wait_for(lambda: fleet.all_in([job_id], "done"), "another worker to run the job")
    assert _note(notes, f"start-{job_id}-2").read_text() == str(second.pid)
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log()


@needs_pg_ctl
def test_a_timeout_tells_the_handler_to_stop_while_the_database_is_away(
    fleet: Fleet, conn: Conn, admin: Conn, notes: outage.Notes
) -> None:
    """A job's timeout passes while the server is down: its handler is told to stop then (it
    was told only once the database answered again), and the attempt, failed as timed out, is
    settled once the server is back."""
    job_id = outage.timed.enqueue(notes, conn=conn).id
    # Polls every 0.1 s with room to claim: it finds the server gone well before the timeout.
    worker = fleet.start(concurrency=2, lease=30, poll=0.1, target=TARGET)
    _wait_for_note(fleet, notes, f"start-{job_id}-1")

    with server_stopped(admin):
        reason = _wait_for_note(fleet, notes, f"stopped-{job_id}-1")
        assert not _server_running()
    assert reason == "timeout"

    fleet.wait_for(lambda: fleet.all_in([job_id], "done"), "the job's second attempt")
    errors = fleet.execute(
        "SELECT attempt, error FROM x_jobs.job_error WHERE job_id = %s ORDER BY attempt", [job_id]
    )
    assert errors == [(1, f"timed out after {outage.TIMEOUT_SECONDS:g} s")]
    assert worker.alive(), worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


#: How long the cancelled job waits in the local queue after its cancel: past the time after
#: which the worker confirms that it still holds a job before starting it (a quarter of its
#: heartbeat interval, 1.25 s at --lease 60), and well before the heartbeat (every 5 s), which
#: would tell the worker of the cancel on its own. A condition of the case, not a wait for it.
WAIT_IN_QUEUE_SECONDS = 2.0


def test_a_prefetched_job_cancelled_before_it_starts_never_starts(
    fleet: Fleet, conn: Conn, notes: outage.Notes
) -> None:
    """One slot, two jobs claimed ahead while a gated one runs; the first of them is cancelled.
    When the slot frees, the cancelled one must not start (it started, and ran until the next
    heartbeat told it to stop); the other one runs."""
    gated = outage.gated.enqueue(notes, conn=conn).id
    # Room for three ahead: a claim is made once half the room is free, so the third is too.
    worker = fleet.start(
        concurrency=1, lease=60, poll=0.1, target=TARGET, extra=["--prefetch", "3"]
    )
    _wait_for_note(fleet, notes, f"start-{gated}-1")
    # One at a time, so that they wait in the local queue in this order.
    cancelled = outage.quick.enqueue(notes, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([cancelled], "running"), "the worker to claim a job ahead")
    kept = outage.quick.enqueue(notes, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([kept], "running"), "the worker to claim another ahead")

    assert conn.execute("SELECT x_jobs.cancel(%s)", [cancelled]).fetchone() == (True,)
    time.sleep(WAIT_IN_QUEUE_SECONDS)
    _note(notes, "open").touch()

    _wait_for_note(fleet, notes, f"start-{kept}-1")
    fleet.wait_for(lambda: fleet.all_in([gated, kept], "done"), "the other jobs to be done")
    assert not _note(notes, f"start-{cancelled}-1").exists(), worker.log()
    assert fleet.states([cancelled]) == {cancelled: "cancelled"}
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
