"""Rate limits under concurrent claimers: several worker processes, each logged in as a role
granted x_jobs_worker alone, claim one queue as fast as they can for a few windows. A key's
jobs never start more than its budget in one window (counted from the rows' started_at, the
claim's clock), every window the claimers spanned used the budget it had (they are exact, not
merely below it), the jobs of another key and those without a key run as if no limit existed,
and the budget comes back every window by itself. The Python side: ``@app.job(rate_limit=...)``
declares the limit when a worker starts and enqueues name the key.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, serving, wait_for
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb
from typer.testing import CliRunner

import x_jobs
from x_jobs.cli import cli

#: The limit: at most MAX starts of the key per PER-second window.
MAX, PER = 7, 2
#: Jobs of the limited key: far more than the claimers' run can start.
LIMITED = 400
#: Jobs of a key with a budget larger than its jobs, and jobs without a key.
OTHER, PLAIN = 60, 200
CLAIMERS = 6
#: How long each claimer claims, seconds: several windows.
RUN = 7.0

# One claimer process: claim (qty 1..20) and complete, as fast as it can, for RUN seconds.
CLAIMER = """
import random, sys, time
import psycopg
dsn, worker, run = sys.argv[1], sys.argv[2], float(sys.argv[3])
rng = random.Random(worker)
with psycopg.connect(dsn, autocommit=True) as conn:
    end = time.monotonic() + run
    while time.monotonic() < end:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM x_jobs.claim(queues => ARRAY['rl'], worker => %s,"
            " lease => '5 minutes', qty => %s) WHERE state = 'running'",
            [worker, rng.randint(1, 20)],
        )]
        if ids:
            conn.execute(
                "SELECT x_jobs.complete_many(ids => %s::bigint[], worker => %s)", [ids, worker]
            )
"""


@pytest.fixture
def worker_dsn(admin: Conn, dsn: str) -> Iterator[str]:
    """A LOGIN role granted x_jobs_worker alone, and a DSN that logs in as it."""
    role = f"x_jobs_test_rl_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE x_jobs_worker").format(sql.Identifier(role))
    )
    try:
        params: dict[str, Any] = conninfo_to_dict(dsn)
        params["user"] = role
        yield make_conninfo("", **params)
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _windows(conn: Conn, key: str | None) -> dict[int, int]:
    """Starts per PER-second window (the window's number since the epoch) of the key's jobs."""
    rows = conn.execute(
        "SELECT floor(extract(epoch FROM j.started_at) / %s)::bigint, count(*)"
        " FROM x_jobs.job AS j LEFT JOIN x_jobs.job_rate AS r ON r.job_id = j.id"
        " WHERE j.queue = 'rl' AND j.started_at IS NOT NULL"
        " AND r.rate_limit_key IS NOT DISTINCT FROM %s GROUP BY 1",
        [PER, key],
    ).fetchall()
    return {int(w): int(n) for w, n in rows}


def test_concurrent_claimers_never_start_more_than_the_budget(conn: Conn, worker_dsn: str) -> None:
    conn.execute(
        "SELECT x_jobs.set_rate_limit('stripe-api', %s, %s * interval '1 second')", [MAX, PER]
    )
    conn.execute("SELECT x_jobs.set_rate_limit('roomy', 100000, '1 minute')")
    requests = (
        [{"name": "call", "queue": "rl", "rate_limit_key": "stripe-api"}] * LIMITED
        + [{"name": "other", "queue": "rl", "rate_limit_key": "roomy"}] * OTHER
        + [{"name": "plain", "queue": "rl"}] * PLAIN
    )
    conn.execute("SELECT count(*) FROM x_jobs.enqueue_many(%s)", [Jsonb(requests)])

    started = time.time()
    claimers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, worker_dsn, f"claimer-{n}", str(RUN)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(CLAIMERS)
    ]
    for p in claimers:
        _, err = p.communicate(timeout=DEADLINE_SECONDS + RUN)
        assert p.returncode == 0, err
    ended = time.time()

    limited = _windows(conn, "stripe-api")
    # Never one start more than the budget in any window, whatever the claimers raced.
    assert limited and max(limited.values()) <= MAX, limited
    # Exact, not merely below: every window between the claimers' first and last (those two
    # may be partial: the processes start and stop within them) used its whole budget.
    first, last = min(limited), max(limited)
    assert first >= started // PER and last <= ended // PER
    inner = {w: limited.get(w, 0) for w in range(first + 1, last)}
    assert inner and all(n == MAX for n in inner.values()), (inner, limited)
    # The budget recovered by itself in each window: more started than one window allows.
    assert sum(limited.values()) > MAX
    # Others were not held back: every job of the roomy key and every one without a key ran.
    assert sum(_windows(conn, "roomy").values()) == OTHER
    assert sum(_windows(conn, None).values()) == PLAIN
    # What is left of the limited key waits, parked, and is listed so.
    row = conn.execute(
        "SELECT waiting FROM x_jobs.rate_limits() WHERE key = 'stripe-api'"
    ).fetchone()
    assert row is not None and row[0] == LIMITED - sum(limited.values())


def test_a_worker_declares_the_limit_and_enqueues_name_the_key(dsn: str, conn: Conn) -> None:
    app = x_jobs.App(dsn)
    ran: list[int] = []

    @app.job(name="charge", queue="rl-app", rate_limit=x_jobs.RateLimit(key="psp", max=3, per=3600))
    def charge(input: dict[str, Any]) -> None:
        ran.append(int(input["n"]))

    plain_ran: list[int] = []

    @app.job(name="plain", queue="rl-app")
    def plain(input: dict[str, Any]) -> None:
        plain_ran.append(int(input["n"]))

    try:
        # Before any worker declared it the key has no limit: the enqueue is refused, coded.
        with pytest.raises(x_jobs.RateLimitUnknown):
            charge.enqueue({"n": -1})
        with serving(app):
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT EXISTS (SELECT FROM x_jobs.rate_limits() WHERE key = 'psp')"
                    ).fetchone()
                    == (True,)
                ),
                "the worker's declaration of the limit",
            )
            for n in range(5):
                charge.enqueue({"n": n})
            wait_for(lambda: len(ran) >= 3, "three runs of the limited job")
            # A job without a key, enqueued after them, runs: the worker claimed again since,
            # with the other two of the key due, and passed them over.
            plain.enqueue({"n": 0})
            wait_for(lambda: plain_ran == [0], "the run of the job without a key")
            # Three an hour: the other two wait, parked.
            assert len(ran) == 3
            row = conn.execute(
                "SELECT max_starts, per, starts, waiting FROM x_jobs.rate_limits()"
                " WHERE key = 'psp'"
            ).fetchone()
            assert row is not None
            assert (row[0], row[1].total_seconds(), row[2], row[3]) == (3, 3600.0, 3, 2)
    finally:
        app.close()
    names = collections.Counter(
        r[0]
        for r in conn.execute(
            "SELECT rate_limit_key FROM x_jobs.job_types() AS t"
            " JOIN x_jobs.job_type AS d USING (name) WHERE name = 'charge'"
        )
    )
    assert names == {"psp": 1}


def test_bad_limits_are_refused_with_typed_errors(conn: Conn) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT x_jobs.set_rate_limit('k', 0, '1 minute')")
    typed = x_jobs.translate(caught.value)
    assert isinstance(typed, x_jobs.RateLimitInvalid)
    assert typed.hint
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT x_jobs.drop_rate_limit('nope')")
    assert isinstance(x_jobs.translate(caught.value), x_jobs.RateLimitUnknown)
    with pytest.raises(TypeError):
        app = x_jobs.App("")

        @app.job(name="both", concurrency=1, rate_limit=x_jobs.RateLimit(key="k", max=1))
        def both(input: dict[str, Any]) -> None: ...


def test_the_cli_lists_the_limits(dsn: str, conn: Conn) -> None:
    runner = CliRunner(env={"COLUMNS": None})
    empty = runner.invoke(cli, ["rate-limits", "--dsn", dsn])
    assert empty.exit_code == 0, empty.output
    assert empty.stdout.strip() == "no rate limit is declared"
    conn.execute("SELECT x_jobs.set_rate_limit('stripe-api', 100, '1 minute')")
    conn.execute("SELECT x_jobs.enqueue('charge', rate_limit_key => 'stripe-api')")
    listed = runner.invoke(cli, ["rate-limits", "--json", "--dsn", dsn])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)["rate_limits"]
    assert (row["key"], row["max_starts"], row["per"], row["waiting"]) == (
        "stripe-api",
        100,
        60.0,
        1,
    )
    table = runner.invoke(cli, ["rate-limits", "--dsn", dsn])
    assert table.exit_code == 0 and "stripe-api" in table.stdout
