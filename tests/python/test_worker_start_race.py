"""The worker's bookkeeping of the jobs it holds, where its threads and its own claims race.

A job a worker holds is either started by one of its handler threads or handed back (or given up
as lost), never both: otherwise a job handed back at shutdown could run here while another
worker runs it too.

The dispatcher's hand-back and the handler threads race for the same runs. The test drives the
worker's own parts (a claim, its handler threads, a hand-back) on a real server, many rounds,
with Python switching threads every microsecond, and the clock a handler thread reads as it
starts a run giving the other threads a turn: that is the moment a hand-back must not slip in.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Conn

import x_jobs
from x_jobs.worker import _Outcome

ROUNDS = 100
JOBS = 100
THREADS = 8


@pytest.fixture
def fast_switching(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    clock = time.monotonic

    def yielding_clock() -> float:
        time.sleep(0)  # another thread's turn
        return clock()

    monkeypatch.setattr(time, "monotonic", yielding_clock)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_a_handed_back_job_is_never_started(dsn: str, conn: Conn, fast_switching: None) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="race", queue="race")
    def race(input: dict[str, Any]) -> None:
        """Does nothing: the test looks at which runs started, not at what they did."""

    worker = x_jobs.Worker(app, concurrency=THREADS, prefetch=JOBS)
    worker._connect(first=True)
    both: list[int] = []
    handed_back = started = 0
    try:
        for _ in range(ROUNDS):
            app.enqueue_many(race, [{}] * JOBS, conn=conn)
            assert worker._claim(JOBS) == JOBS
            threads = [
                threading.Thread(target=worker._execute_sync, daemon=True) for _ in range(THREADS)
            ]
            for thread in threads:
                thread.start()
            worker._hand_back(started=False, reason="shutdown")
            released = {
                row[0]
                for row in conn.execute(
                    "SELECT id FROM x_jobs.job WHERE state = 'ready' AND queue = 'race'"
                ).fetchall()
            }
            for _ in threads:
                worker._inbox.put(None)
            for thread in threads:
                thread.join()
            ran = set()
            while not worker._outbox.empty():
                ran.add(worker._outbox.get_nowait().id)
            both += sorted(ran & released)
            handed_back += len(released)
            started += len(ran)
            # The next round starts from an empty queue and an empty worker.
            conn.execute("DELETE FROM x_jobs.job WHERE queue = 'race'")
            worker._held.clear()
    finally:
        if worker._conn is not None:
            worker._conn.close()
    assert both == [], f"{len(both)} jobs were both started and handed back"
    # The race was run: both sides took runs in the rounds.
    assert handed_back > 0 and started > 0, (handed_back, started)


def test_a_job_claimed_again_before_its_failure_is_accounted_stays_held(
    dsn: str, conn: Conn
) -> None:
    """A failed attempt's settlement can reach the dispatcher after the job, due again at once,
    was claimed for its next attempt. Accounting for the old attempt must leave the new one
    held: dropped, its outcome would be ignored and the job run again once its lease lapsed."""
    app = x_jobs.App(dsn)

    @app.job(name="again", queue="again", retry=x_jobs.Retry(base=0, max=0))
    def again(input: dict[str, Any]) -> None:
        """Never run: the test settles the first attempt itself."""

    worker = x_jobs.Worker(app, concurrency=1)
    worker._connect(first=True)
    assert worker._conn is not None
    try:
        [job] = app.enqueue_many(again, [{}], conn=conn)
        assert worker._claim(1) == 1
        first = worker._held[job.id]
        settled = worker._settle_batch(worker._conn, [_Outcome(first, ok=False, error="boom")])
        assert settled.states == {job.id: "ready"}
        # Due again at once (no backoff): claimed before the dispatcher accounts for the failure.
        assert worker._claim(1) == 1
        second = worker._held[job.id]
        assert second is not first and second.ctx.attempt == 2
        worker._settled.put(settled)
        worker._take_settled()
        assert worker._held.get(job.id) is second
    finally:
        worker._conn.close()
