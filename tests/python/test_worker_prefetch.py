"""A worker started without --prefetch sizes its local queue from its jobs' run times: short
jobs go to the database in big claims (what made a drain at the defaults a sixth of a tuned
one), long ones are not hoarded away from other workers.

Each claim stamps the rows it hands out with its own now (started_at), so the rows' started_at
values tell how many claims a worker made and how many rows each handed out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import basic
from apps.workers import Fleet
from conftest import Conn

from x_jobs.worker._prefetch import HORIZON, MOST, PrefetchSizer

CLAIMS: str = """
    SELECT count(*) AS rows FROM x_jobs.job WHERE id = ANY (%s)
    GROUP BY claimed_by, started_at ORDER BY 1 DESC
"""


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def claim_sizes(conn: Conn, ids: list[int]) -> list[int]:
    """How many of the rows each claim handed out, biggest first."""
    return [int(row[0]) for row in conn.execute(CLAIMS, [ids]).fetchall()]


def test_short_jobs_are_claimed_in_big_batches(fleet: Fleet, conn: Conn) -> None:
    jobs = 2_000
    ids = [e.id for e in basic.app.enqueue_many(basic.noop, [{}] * jobs, conn=conn)]
    fleet.start(concurrency=2)
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "the jobs to be done")
    sizes = claim_sizes(conn, ids)
    assert sum(sizes) == jobs
    # With a local queue of `concurrency` (the old default), a claim takes 4 rows at most: 500
    # claims. Sized from run times of a millisecond or so, it holds up to MOST waiting.
    assert len(sizes) < 50, sizes
    assert sizes[0] > 100, sizes


def test_long_jobs_are_not_hoarded(fleet: Fleet, conn: Conn) -> None:
    jobs, seconds, concurrency = 12, 0.3, 2
    ids = [
        e.id for e in basic.app.enqueue_many(basic.sleep, [{"seconds": seconds}] * jobs, conn=conn)
    ]
    fleet.start(concurrency=concurrency)
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "the jobs to be done")
    sizes = claim_sizes(conn, ids)
    assert sum(sizes) == jobs
    # Never more than HORIZON seconds of them waiting beside the running ones (a fixed
    # prefetch of 500 takes all 12 in the first claim).
    most = concurrency + max(concurrency, int(concurrency * HORIZON / seconds))
    assert sizes[0] <= most, sizes


def test_the_size_follows_the_mean_run_time() -> None:
    sizer = PrefetchSizer(concurrency=10)
    assert sizer.size == 10  # nothing known yet: one claim's worth
    assert sizer.ran(0.001)
    assert sizer.size == MOST  # 10 x 0.5 s / 1 ms = 5,000, at most MOST
    for _ in range(200):
        sizer.ran(0.1)
    # The mean has moved to about 0.1 s: 10 x 0.5 / 0.1 = 50.
    assert 45 <= sizer.size <= 55, sizer.size
    for _ in range(200):
        sizer.ran(5.0)
    assert sizer.size == 10  # never below the concurrency
    assert not sizer.ran(5.0)  # unchanged
