"""Concurrent claimers of a fair queue: a row another claim holds is stepped over and the
tenant's next row taken in its place (no claim comes back short while rows are free), and
worker processes racing over one fair queue run every job exactly once.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import DEADLINE_SECONDS, Conn, Connect
from psycopg.types.json import Jsonb

CLAIM = "SELECT id, tenant_id FROM x_jobs.claim(ARRAY['fair'], %s, '5 minutes', %s)"


def _enqueue(conn: Conn, tenants: list[str], each: int) -> None:
    conn.execute(
        "SELECT count(*) FROM x_jobs.enqueue_many(%s)",
        [
            Jsonb(
                [
                    {"name": "t", "queue": "fair", "tenant_id": t}
                    for t in tenants
                    for _ in range(each)
                ]
            )
        ],
    )


def test_a_claim_steps_over_the_rows_another_claim_holds(conn: Conn, connect: Connect) -> None:
    conn.execute("SELECT x_jobs.set_queue_policy(queue => 'fair', fair => true)")
    _enqueue(conn, ["a"], 20)
    holder = connect(autocommit=False)
    held = holder.execute(CLAIM, ["holder", 5]).fetchall()
    assert len(held) == 5
    # The holder's transaction is open: its rows are locked. Another claim of the one tenant
    # takes the next five, not the holder's (nor none of them).
    other = conn.execute(CLAIM, ["other", 5]).fetchall()
    assert len(other) == 5
    assert not {i for i, _ in held} & {i for i, _ in other}
    assert max(i for i, _ in held) < min(i for i, _ in other)
    # With other tenants beside, each takes its share of the rows not held.
    _enqueue(conn, ["b", "c"], 3)
    more = conn.execute(CLAIM, ["more", 6]).fetchall()
    assert sorted(t for _, t in more) == ["a", "a", "b", "b", "c", "c"]
    assert not {i for i, _ in held} & {i for i, _ in more}
    holder.rollback()
    # The holder's five are back: 20 + 6 rows, 5 + 6 taken.
    rest = conn.execute(CLAIM, ["rest", 100]).fetchall()
    assert len(rest) == 26 - 11
    assert {i for i, _ in held} <= {i for i, _ in rest}


# One claimer process: claim (qty 1..10) and complete, until a claim comes back empty twice.
CLAIMER = """
import random, sys
import psycopg
dsn, worker = sys.argv[1], sys.argv[2]
rng = random.Random(worker)
empty = 0
with psycopg.connect(dsn, autocommit=True) as conn:
    while empty < 2:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM x_jobs.claim(queues => ARRAY['fair'], worker => %s,"
            " lease => '5 minutes', qty => %s)",
            [worker, rng.randint(1, 10)],
        )]
        empty = 0 if ids else empty + 1
        if ids:
            conn.execute(
                "SELECT x_jobs.complete_many(ids => %s::bigint[], worker => %s)", [ids, worker]
            )
"""


def test_racing_workers_run_every_job_of_a_fair_queue_once(conn: Conn, dsn: str) -> None:
    conn.execute("SELECT x_jobs.set_queue_policy(queue => 'fair', fair => true)")
    conn.execute("SELECT x_jobs.set_queue_policy(queue => 'fair', weights => '{\"t3\": 4}')")
    tenants = [f"t{n}" for n in range(40)]
    _enqueue(conn, tenants, 50)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, dsn, f"racer-{n}"], stderr=subprocess.PIPE, text=True
        )
        for n in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=DEADLINE_SECONDS * 4)
        assert p.returncode == 0, err
    rows = conn.execute(
        "SELECT state::text, attempt, claims, count(*) FROM x_jobs.job WHERE queue = 'fair'"
        " GROUP BY 1, 2, 3"
    ).fetchall()
    # Each of the 2,000 jobs was claimed once and completed, by whichever racer took it.
    assert rows == [("done", 1, 1, 2000)]


def test_sessions_that_claim_once_each_go_round_the_tenants(conn: Conn, connect: Connect) -> None:
    conn.execute("SELECT x_jobs.set_queue_policy(queue => 'fair', fair => true)")
    _enqueue(conn, ["a", "b", "c"], 3)
    # Each claim from a new session (as a pool that resets its connections makes them): the
    # session has no cursor, and starts after the tenant claimed last.
    taken = []
    for n in range(6):
        fresh = connect(name=f"once-{n}")
        taken += [t for _, t in fresh.execute(CLAIM, [f"once-{n}", 1]).fetchall()]
        fresh.close()
    assert taken == ["a", "b", "c", "a", "b", "c"]
