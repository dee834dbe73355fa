"""Worker processes killed with -9 and a server restarted under a worker: every job still ends
done (or, on its final attempt, buried), and no job ever runs in two places at once.

"At once" is judged on what the handlers recorded (see ``apps.basic``): a run lasts from its
start record to its end record or, when it has none, to the moment its process was seen dead.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from apps.workers import Fleet, RunRow, WorkerProcess
from conftest import Conn, needs_pg_ctl, restart_server, server_stopped

logger = logging.getLogger(__name__)

LAPSED = "lease lapsed: the worker stopped heartbeating before it settled the job"


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def _runs_by_job(fleet: Fleet) -> dict[int, list[RunRow]]:
    runs: dict[int, list[RunRow]] = defaultdict(list)
    for run in fleet.runs():
        runs[run.job_id].append(run)
    return runs


def _done_jobs(fleet: Fleet) -> int:
    return int(fleet.scalar("SELECT count(*) FROM x_jobs.job WHERE state = 'done'"))


def _assert_each_job_done_by_its_last_run(fleet: Fleet, ids: list[int]) -> None:
    """Every job is done, and the run that settled it (its last attempt, by the worker that
    holds the row) ran to the end; no run is recorded past the job's last attempt."""
    jobs = {
        int(job_id): (str(state), int(attempt), str(claimed_by))
        for job_id, state, attempt, claimed_by in fleet.execute(
            "SELECT id, state::text, attempt, claimed_by FROM x_jobs.job WHERE id = ANY (%s)",
            [ids],
        )
    }
    assert len(jobs) == len(ids)
    runs = _runs_by_job(fleet)
    for job_id, (state, attempt, claimed_by) in jobs.items():
        assert state == "done", job_id
        mine = runs[job_id]
        assert mine, f"job {job_id} is done but no run of it was recorded"
        last = [(r.worker, r.outcome) for r in mine if r.attempt == attempt]
        assert last == [(claimed_by, "returned")], (job_id, attempt, mine)
        assert all(r.attempt <= attempt for r in mine), (job_id, attempt, mine)


def test_kill_9_mid_run_loses_nothing_and_runs_no_job_twice_at_once(
    fleet: Fleet, conn: Conn
) -> None:
    rng = random.Random(20261129)
    # Three jobs that run until the gate opens come first: A's first claim takes them, so A is
    # surely in the middle of them when it dies. The rest sleep 0.05-0.2 s.
    gated = [e.id for e in basic.app.enqueue_many(basic.gated, [{}] * 3, conn=conn)]
    inputs = [{"seconds": rng.uniform(0.05, 0.2)} for _ in range(197)]
    sleeping = [e.id for e in basic.app.enqueue_many(basic.sleep, inputs, conn=conn)]
    ids = gated + sleeping

    a = fleet.start(concurrency=8, lease=2)

    def a_is_mid_run() -> bool:
        runs = [r for r in fleet.runs() if r.pid == a.pid]
        finished = [r for r in runs if r.finished is not None]
        return {r.job_id for r in runs} >= set(gated) and len(finished) >= 40

    fleet.wait_for(a_is_mid_run, "A to hold the gated jobs and finish 40 others")
    a_id = fleet.worker_id(a)
    a.kill()
    assert a.proc.returncode == -signal.SIGKILL
    fleet.open_gate()

    b = fleet.start(concurrency=8, lease=2)
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "B to finish every job")
    _assert_each_job_done_by_its_last_run(fleet, ids)
    runs = _runs_by_job(fleet)
    # The gated jobs died with A, mid-body, and came back to B once A's leases lapsed.
    for job_id in gated:
        assert [(r.pid, r.attempt, r.finished is None) for r in runs[job_id]] == [
            (a.pid, 1, True),
            (b.pid, 2, False),
        ], job_id
    lapses = fleet.execute(
        "SELECT job_id, attempt, worker FROM x_jobs.job_error WHERE job_id = ANY (%s)"
        " AND error = %s ORDER BY job_id",
        [gated, LAPSED],
    )
    assert lapses == [(job_id, 1, a_id) for job_id in gated]
    # Every run before a job's last one is one A did not settle before it died.
    for job_id in ids:
        assert all(r.pid == a.pid for r in runs[job_id][:-1]), runs[job_id]
    assert fleet.overlaps() == []


def test_a_job_whose_workers_keep_dying_is_buried_on_its_final_attempt(
    fleet: Fleet, conn: Conn
) -> None:
    job_id = basic.app.enqueue(basic.gated, {"gate": "never"}, conn=conn, max_attempts=2).id
    killed: list[WorkerProcess] = []
    worker_ids: list[str] = []
    for attempt in (1, 2):
        worker = fleet.start(lease=2)
        fleet.wait_for(
            lambda: any(r.pid == worker.pid for r in fleet.runs()),  # noqa: B023
            f"a worker to start attempt {attempt}",
        )
        killed.append(worker)
        worker_ids.append(fleet.worker_id(worker))
        worker.kill()

    last = fleet.start(lease=2)
    fleet.wait_for(lambda: fleet.all_in([job_id], "dead"), "the job to be buried")
    # The claim that buried it answered it as dead; the worker must not run it.
    fleet.wait_for(lambda: "job buried" in last.log(), "the worker to log the burial")
    last.signal(signal.SIGTERM)
    assert last.wait() == 0, last.log()

    row = fleet.execute(
        "SELECT state::text, attempt, claimed_by, last_error FROM x_jobs.job WHERE id = %s",
        [job_id],
    )
    assert row == [("dead", 2, None, "lease lapsed on the final attempt")]
    runs = [(r.pid, r.attempt, r.finished) for r in fleet.runs()]
    assert runs == [(killed[0].pid, 1, None), (killed[1].pid, 2, None)], "never a third run"
    lapses = fleet.execute(
        "SELECT attempt, worker, error FROM x_jobs.job_error WHERE job_id = %s ORDER BY attempt",
        [job_id],
    )
    assert lapses == [(1, worker_ids[0], LAPSED), (2, worker_ids[1], LAPSED)]
    assert fleet.overlaps() == []


@needs_pg_ctl
def test_a_server_down_past_the_lease_leaves_each_job_to_the_worker_running_it(
    fleet: Fleet, conn: Conn, admin: Conn
) -> None:
    """Leases run out while the server is down, and no holder can renew them. Once it was back,
    the first worker to reconnect took the other's jobs as lapsed and ran them beside it (three
    runs of three in a review). A claim leaves such leases alone for one lease after the server
    started, so that their holder can reconnect and renew them: here the holder is held stopped
    (SIGSTOP) until the other worker has claimed after the restart, then let go."""
    lease = 3.0
    ids = [e.id for e in basic.app.enqueue_many(basic.sleep, [{"seconds": 12}] * 2, conn=conn)]
    holder = fleet.start(concurrency=2, lease=lease)
    fleet.wait_for(lambda: fleet.all_in(ids, "running"), "the holder to run both jobs")
    idle = fleet.start(concurrency=2, lease=lease)
    fleet.wait_for(
        lambda: int(fleet.scalar("SELECT count(*) FROM x_jobs.worker")) == 2,
        "the idle worker to announce itself",
    )
    holder.signal(signal.SIGSTOP)
    try:
        with server_stopped(admin):
            # Down for twice the lease: every lease the holder took runs out meanwhile.
            time.sleep(2 * lease)
        # The holder is stopped: the only worker connected is the idle one, and it has claimed.
        fleet.wait_for(
            lambda: bool(
                fleet.scalar(
                    "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity"
                    " WHERE application_name = 'x_jobs worker' AND state = 'idle'"
                    " AND query LIKE '%%x_jobs.claim(%%')"
                )
            ),
            "the idle worker to claim after the restart",
        )
        claims = fleet.execute("SELECT claims FROM x_jobs.job WHERE id = ANY (%s)", [ids])
        assert claims == [(1,), (1,)], f"a job was handed out again: {claims}\n{fleet.report()}"
    finally:
        holder.signal(signal.SIGCONT)

    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "both jobs to be done")
    claims = fleet.execute("SELECT claims FROM x_jobs.job WHERE id = ANY (%s)", [ids])
    assert claims == [(1,), (1,)], f"a job was handed out again: {claims}\n{fleet.report()}"
    assert fleet.overlaps() == []
    assert {run.pid for run in fleet.runs()} == {holder.pid}
    for worker in (holder, idle):
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()


@needs_pg_ctl
def test_server_restarts_mid_run_lose_nothing(fleet: Fleet, conn: Conn, admin: Conn) -> None:
    ids = [e.id for e in basic.app.enqueue_many(basic.sleep, [{"seconds": 0.01}] * 1000, conn=conn)]
    worker = fleet.start(concurrency=8, lease=2)
    for threshold in (150, 550):
        fleet.wait_for(lambda: _done_jobs(fleet) >= threshold, f"{threshold} jobs done")  # noqa: B023
        assert _done_jobs(fleet) < len(ids), "the restart must come mid-run"
        restart_server(admin)

    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "every job to be done after the restarts")
    assert worker.alive(), worker.log()
    _assert_each_job_done_by_its_last_run(fleet, ids)
    assert fleet.overlaps() == []
    # The worker lived through both restarts: it lost its connection and got it back each time.
    assert worker.log().count("database connection back") >= 2, worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
