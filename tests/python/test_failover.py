"""Failover to a streaming standby: a primary killed mid-drain, its synchronous standby promoted,
and workers that were given the multi-host DSN every deployment with a standby uses
(``host=a,b target_session_attrs=read-write``).

Every job committed before the failover ends done, none runs twice at once (judged on what the
handlers recorded, as in test_worker_crash.py), and the worker reconnects to the new primary by
itself. A lease that lapsed while no primary was up is left to its holder for one lease after the
promoted server took writes (the restart grace), so a worker started on the new primary at once
does not run the jobs the old worker still holds. The readers an operator, a dashboard or an
autoscaler polls answer on the hot standby.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import basic
from apps.workers import Fleet
from psycopg.types.json import Jsonb
from standby import Pair

DBNAME = "x_jobs_failover"
JOBS = 10_000
LEASE = 3.0


@contextmanager
def _installed_pair() -> Iterator[Pair]:
    with Pair() as servers:
        with servers.primary.connect() as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
        with servers.primary.connect(DBNAME) as conn:
            conn.execute("CREATE EXTENSION x_jobs")
        yield servers


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A pair of this test's own, for a test that kills its primary."""
    with _installed_pair() as servers:
        yield servers


@pytest.fixture(scope="module")
def standing_pair() -> Iterator[Pair]:
    """A pair the read-only tests share: none of them writes to its standby."""
    with _installed_pair() as servers:
        yield servers


@pytest.fixture
def fleet(pair: Pair, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(pair.dsn(DBNAME), tmp_path) as workers:
        yield workers


def _enqueue(dsn: str, job: Any, inputs: list[dict[str, Any]]) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [e.id for e in basic.app.enqueue_many(job, inputs, conn=conn)]


def test_a_drain_survives_the_primary_killed_and_the_standby_promoted(
    pair: Pair, fleet: Fleet
) -> None:
    dsn = pair.dsn(DBNAME)
    # Three jobs that run until the gate opens come first, so that the worker surely holds
    # jobs mid-run through the whole failover; the rest record their run and return.
    gated = _enqueue(dsn, basic.gated, [{}] * 3)
    ids = gated + _enqueue(dsn, basic.noop, [{}] * (JOBS - 3))

    a = fleet.start(concurrency=8, lease=LEASE, poll=0.2, via=dsn)
    fleet.wait_for(
        lambda: fleet.scalar("SELECT count(*) FROM public.run_log") >= 2_000,
        "the worker to have run 2,000 jobs",
    )
    killed_at = fleet.scalar("SELECT pg_catalog.clock_timestamp()")
    pair.primary.kill()
    # The outage lasts longer than a lease: the leases of what the worker holds run out while
    # no server takes writes.
    time.sleep(LEASE * 1.5)
    pair.promote()
    promoted_at = fleet.scalar("SELECT pg_catalog.now()")
    # The grace runs from when the promoted server took writes, not from its start as a standby.
    assert fleet.scalar("SELECT x_jobs._ready_since()") > killed_at
    # A second worker on the new primary at once: the restart grace keeps it from the gated
    # jobs whose leases lapsed during the switch, which the first worker still runs.
    b = fleet.start(concurrency=8, lease=LEASE, poll=0.2, via=dsn)
    fleet.wait_for(
        lambda: (
            fleet.scalar(
                "SELECT count(*) FROM public.run_log WHERE pid = %s AND started > %s",
                [a.pid, promoted_at],
            )
            > 0
        ),
        "the first worker to run jobs on the new primary",
    )
    fleet.open_gate()
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "every job to be done on the new primary")

    assert a.alive() and b.alive(), fleet.report()
    assert fleet.overlaps() == [], fleet.report()
    # Not one job was buried or failed for the switch: each ended done, on its first attempt
    # or on a later one that a lapse (never a failure) began.
    errors = fleet.execute(
        "SELECT job_id, error FROM x_jobs.job_error WHERE job_id = ANY (%s)", [ids]
    )
    assert all("lease lapsed" in str(error) for _, error in errors), errors
    # The gated jobs ran in the first worker through the switch (nobody took them from it).
    holders = fleet.execute(
        "SELECT DISTINCT pid FROM public.run_log WHERE job_id = ANY (%s)", [gated]
    )
    assert holders == [(a.pid,)], fleet.report()


READERS = [
    ("version", "SELECT x_jobs.version()"),
    ("now", "SELECT x_jobs.now() IS NOT NULL"),
    ("error_codes", "SELECT count(*) > 0 FROM x_jobs.error_codes()"),
    ("result", "SELECT state::text FROM x_jobs.result(id => %(id)s)"),
    ("list_jobs", "SELECT count(*) FROM x_jobs.list_jobs(state => 'ready', max_rows => 10)"),
    ("queue_stats", "SELECT ready FROM x_jobs.queue_stats() WHERE queue = 'default'"),
    ("queue_demand", "SELECT demand FROM x_jobs.queue_demand() WHERE queue = 'default'"),
    (
        "queue_gauges",
        "SELECT ready FROM x_jobs.queue_gauges(max_age => '0') WHERE queue = 'default'",
    ),
    ("health", "SELECT check_name, ok FROM x_jobs.health() ORDER BY check_name"),
    ("job_types", "SELECT count(*) FROM x_jobs.job_types()"),
]


@pytest.mark.parametrize(("reader", "query"), READERS, ids=[r for r, _ in READERS])
def test_readers_answer_on_a_hot_standby_as_on_the_primary(
    standing_pair: Pair, reader: str, query: Any
) -> None:
    pair = standing_pair
    with pair.primary.connect(DBNAME) as primary:
        job_id = basic.app.enqueue(basic.noop, {}, conn=primary).id
        basic.app.enqueue_many(basic.noop, [{}] * 4, conn=primary)
        on_primary = primary.execute(query, {"id": job_id}).fetchall()
    pair.replayed(DBNAME)
    with pair.standby.connect(DBNAME) as standby:
        assert standby.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone() == (True,)
        assert standby.execute(query, {"id": job_id}).fetchall() == on_primary


def test_writers_are_refused_on_a_hot_standby_with_the_read_only_sqlstate(
    standing_pair: Pair,
) -> None:
    pair = standing_pair
    pair.replayed(DBNAME)
    with (
        pair.standby.connect(DBNAME) as standby,
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        standby.execute("SELECT x_jobs.enqueue(name => 'x', input => %s)", [Jsonb({})])
