"""The claim SEEKS: on a big table its statements read about qty rows, through the partial indexes.

A module database gets 1,000,000 done rows and 100,000 due ready rows (plus some not-yet-due
delayed rows, parked rows of a name no worker serves, unexpired running rows, and a few
concurrency keys), so that any plan that reads
the backlog instead of seeking into it shows up as tens of thousands of rows. auto_explain logs
the real (ANALYZE) plan of every statement the claim runs, as JSON, through NOTICEs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import Conn, Connect, connections, fresh_database
from plans import (
    ARM_INDEXES,
    SLACK,
    PlanLog,
    access_problems,
    arm_scans,
    is_job,
    is_key_visit,
    is_keyed_window,
    is_pick,
    nodes,
    rows_read,
    seek_problems,
    window,
)

logger = logging.getLogger(__name__)

#: The rows FILL writes, by state.
#: Rows handed back while no worker served their name (x_jobs.hand_back): delayed until
#: infinity, in every queue, some with a concurrency key.
PARKED = 20_000
FILLED = {
    "done": 1_000_000,
    "ready": 100_000,
    "delayed": 10_000 + PARKED,
    "suspended": 10_000,
    "running": 10_000,
}
READY_ROWS = FILLED["ready"]
QTY = 10


FILL: list[LiteralString] = [
    # The history: done rows in all three queues, none in any partial index of the claim.
    """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, started_at, finished_at, run_id, backoff_base,
        backoff_max, state, attempt, max_attempts, claims, name, queue, tenant_id, claimed_by,
        input
    )
    SELECT t, t, t, t, t, gen_random_uuid(), '1 second', '1 hour', 'done', 1, 25, 1, 'old',
           (ARRAY['default', 'q2', 'q3'])[1 + g % 3], 'none', 'old-worker', '{}'
    FROM generate_series(1, 1000000) AS g,
         LATERAL (SELECT now() - interval '30 days' + g * interval '1 second' AS t) AS x
    """,
    # The backlog: due ready rows, 80% in 'default'; every 7th carries a concurrency key.
    """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        priority, name, queue, tenant_id, concurrency_key, concurrency_limit, input
    )
    SELECT now() - interval '1 day' + g * interval '500 milliseconds', now(), now(),
           gen_random_uuid(), '1 second', '1 hour', 'ready', 25, 0, 'work',
           CASE g % 10 WHEN 0 THEN 'q2' WHEN 1 THEN 'q3' ELSE 'default' END, 'none',
           CASE WHEN g % 7 = 0 THEN 'key-' || g % 5 END,
           CASE WHEN g % 7 = 0 THEN 1000 END,
           '{}'
    FROM generate_series(1, 100000) AS g
    """,
    # Not due yet: the waiting arm must read none of them.
    """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        name, queue, tenant_id, input
    )
    SELECT now() + interval '1 day' + g * interval '1 second', now(), now(), gen_random_uuid(),
           '1 second', '1 hour',
           CASE WHEN g % 2 = 0 THEN 'delayed' ELSE 'suspended' END::x_jobs.job_state,
           25, 'later', (ARRAY['default', 'q2', 'q3'])[1 + g % 3], 'none', '{}'
    FROM generate_series(1, 20000) AS g
    """,
    # Parked (0.4.0): due at no time, last in the waiting arm's order; no claim may read them,
    # however many pile up at a queue while no worker serves their name.
    """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        claims, name, queue, tenant_id, concurrency_key, concurrency_limit, input
    )
    SELECT 'infinity', now(), now(), gen_random_uuid(), '1 second', '1 hour', 'delayed', 25, 1,
           'unserved', (ARRAY['default', 'q2', 'q3'])[1 + g % 3], 'none',
           CASE WHEN g % 10 = 0 THEN 'unserved-' || g % 7 END,
           CASE WHEN g % 10 = 0 THEN 1 END,
           '{}'
    FROM generate_series(1, 20000) AS g
    """,
    # Held under unexpired leases: the lapsed arm must read none of them. A few hold a key.
    """
    INSERT INTO x_jobs.job (
        run_at, visible_at, started_at, created_at, updated_at, run_id, backoff_base,
        backoff_max, state, attempt, claims, max_attempts, name, queue, tenant_id, claimed_by,
        concurrency_key, concurrency_limit, input
    )
    SELECT now() - interval '1 hour', now() + interval '1 day', now(), now(), now(),
           gen_random_uuid(), '1 second', '1 hour', 'running', 1, 1, 25, 'busy',
           (ARRAY['default', 'q2', 'q3'])[1 + g % 3], 'none', 'busy-worker',
           CASE WHEN g % 400 = 0 THEN 'key-' || (g / 400) % 5 END,
           CASE WHEN g % 400 = 0 THEN 1000 END,
           '{}'
    FROM generate_series(1, 10000) AS g
    """,
    "VACUUM ANALYZE x_jobs.job",
]


NAIVE = """
    SELECT id FROM x_jobs.job
    WHERE queue = 'default' AND state IN ('ready', 'delayed', 'suspended') AND run_at <= now()
    ORDER BY run_at
    LIMIT 10
    FOR UPDATE SKIP LOCKED
"""


@pytest.fixture(scope="module")
def big_dsn(admin: Conn, template_db: str) -> Iterator[str]:
    """A database of this module's own with a big job table (about 15-25 s to fill)."""
    with fresh_database(admin, template_db, prefix="x_jobs_plan") as dsn:
        started = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in FILL:
                conn.execute(statement)
            filled = conn.execute(
                "SELECT state::text, count(*) FROM x_jobs.job GROUP BY 1"
            ).fetchall()
            assert dict(filled) == FILLED
        logger.info("filled the big job table in %.1f s", time.monotonic() - started)
        yield dsn


@pytest.fixture
def big_connect(big_dsn: str) -> Iterator[Connect]:
    with connections(big_dsn) as opener:
        yield opener


def _claim_plans(conn: Conn, log: PlanLog, queues: list[str]) -> list[dict[str, Any]]:
    """Run one claim of QTY; answer the plans of the statements it ran inside."""
    log.take()
    rows = conn.execute(
        "SELECT id, state::text, queue FROM x_jobs.claim(%s, 'plan-worker', '1 hour', %s)",
        [queues, QTY],
    ).fetchall()
    # A claim that found nothing would pass every check below without seeking anything.
    assert len(rows) == QTY
    assert {state for _, state, _ in rows} == {"running"}
    assert {queue for _, _, queue in rows} <= set(queues)
    nested = [p for p in log.take() if "x_jobs.claim(" not in str(p.get("Query Text", ""))]
    assert any(is_pick(p) for p in nested), "auto_explain logged no picking statement"
    return nested


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan", "force_generic_plan"])
def test_claim_seeks_on_a_big_table(big_connect: Connect, plan_cache_mode: str) -> None:
    conn = big_connect(name="plan-claimer")
    log = PlanLog(conn)
    # JIT changes no plan, only what a call costs; test_claim_statements_are_not_jit_compiled
    # holds that part. Off here, so these claims take milliseconds, not a second each.
    conn.execute("SET jit = off")
    # PL/pgSQL plans its statements afresh for 5 calls, then may keep a generic plan; the
    # session's plan_cache_mode covers both, unless the function pins a mode of its own.
    conn.execute("SELECT set_config('plan_cache_mode', %s, false)", [plan_cache_mode])

    calls = [["default"]] * 8 + [["default", "q2", "q3"]]
    for call, queues in enumerate(calls, 1):
        plans = _claim_plans(conn, log, queues)
        for plan in plans:
            where = f"call {call} ({queues}): {plan['Query Text'][:60]!r}"
            # The keys here have room: their windows suffice, no claim visits the keys.
            assert not is_key_visit(plan), where
            if is_keyed_window(plan):
                # The keyed rows (every 7th, on keys with room): each queue's window of them,
                # ready and waiting, read whole to rank them per key, and no more.
                bound = 2 * window(QTY) * len(queues) + SLACK
                assert seek_problems(plan, QTY, len(queues), bound) == [], where
            elif is_pick(plan):
                assert seek_problems(plan, QTY, len(queues)) == [], where
                arms = arm_scans(plan)
                # A seek per arm and queue at most, each through its own index (the ready arm
                # skips a queue the first pass found none of the first QTY rows in).
                assert sorted(n.get("Index Name", "") for n in arms) == sorted(ARM_INDEXES), where
                assert all(1 <= n["Actual Loops"] <= len(queues) for n in arms), where
            elif "CROSS JOIN LATERAL" in str(plan.get("Query Text", "")):
                # The first pass over several queues: how many ready rows each one holds of
                # the first QTY, read as the ready arm reads them, without locks.
                assert len(queues) > 1, where
                assert seek_problems(plan, QTY, len(queues)) == [], where
            else:
                assert access_problems(plan) == [], where


#: Due rows of one concurrency key at its limit, ahead of everything else in their queue.
FULL_KEY_BACKLOG = 20_000
#: Keys with room behind them, one due row each.
FREE_KEYS = 30


def test_a_claim_behind_a_full_key_reads_its_windows_and_then_the_keys(
    big_connect: Connect,
) -> None:
    """A key at its limit with thousands of due rows ahead: the claim reads its window of them,
    finds it full of rows it may not take, and visits the keys (a seek or two each) to find the
    keys with room behind. Until 0.3.8 it stepped over every row of the full key (170-330 ms a
    claim at 100,000)."""
    conn = big_connect(name="plan-claimer")
    conn.execute("SET jit = off")
    with conn.transaction(force_rollback=True):
        conn.execute(
            "SELECT x_jobs.enqueue('head', queue => 'backed-up', concurrency_key => 'full')"
        )
        held = conn.execute(
            "SELECT count(*) FROM x_jobs.claim(ARRAY['backed-up'], 'holder', '1 hour', 1)"
        ).fetchone()
        assert held == (1,)
        conn.execute(
            "SELECT count(*) FROM x_jobs.enqueue_many(("
            " SELECT jsonb_agg(jsonb_build_object("
            "   'name', 'backlog', 'queue', 'backed-up', 'concurrency_key', 'full'))"
            " FROM generate_series(1, %s)))",
            [FULL_KEY_BACKLOG],
        )
        conn.execute(
            "SELECT count(*) FROM x_jobs.enqueue_many(("
            " SELECT jsonb_agg(jsonb_build_object("
            "   'name', 'free', 'queue', 'backed-up', 'concurrency_key', 'free-' || g)"
            "   ORDER BY g)"
            " FROM generate_series(1, %s) AS g))",
            [FREE_KEYS],
        )
        log = PlanLog(conn)
        rows = conn.execute(
            "SELECT name, concurrency_key FROM x_jobs.claim(ARRAY['backed-up'], 'plan-worker',"
            " '1 hour', %s)",
            [QTY],
        ).fetchall()
        # One row of each of QTY free keys, none of the full one. Which keys is the visit's walk
        # order (key order, from where the session's last visit ended), not claim order.
        assert len(rows) == QTY
        assert {name for name, _ in rows} == {"free"}
        assert len({key for _, key in rows}) == QTY
        plans = [p for p in log.take() if "x_jobs.claim(" not in str(p.get("Query Text", ""))]
    assert any(is_key_visit(p) for p in plans), "the claim never visited the keys"
    for plan in plans:
        where = repr(str(plan["Query Text"])[:60])
        # Each node reads less than one window, so none read the full key's backlog.
        assert seek_problems(plan, QTY, 1, window(QTY)) == [], where


def test_the_checker_rejects_a_naive_claim(big_connect: Connect) -> None:
    conn = big_connect(name="naive-claimer")
    with conn.transaction():
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + NAIVE).fetchone()
        assert row is not None
        plan: dict[str, Any] = row[0][0]
        raise psycopg.Rollback()

    problems = seek_problems(plan, QTY, 1)
    assert problems, "the checker passed a query that reads the whole backlog"
    # It is caught for what it does: a scan or sort of (at least) the due backlog of 'default'.
    read = max(rows_read(n) for n in nodes(plan["Plan"]) if is_job(n))
    assert read >= 0.8 * READY_ROWS, problems
    logger.info("the naive claim: %s", problems)


def test_claim_statements_are_not_jit_compiled(big_connect: Connect) -> None:
    """A claim is a few index seeks; compiling its plans with LLVM costs 50-900 ms a call.

    JIT kicks in when a plan's estimated cost passes jit_above_cost (100,000 by default), and a
    generic plan costs a LIMIT of a parameter as if it read much of the table.
    """
    conn = big_connect(name="jit-claimer")
    log = PlanLog(conn)
    for queues in [["default"]] * 8 + [["default", "q2", "q3"]]:
        for plan in _claim_plans(conn, log, queues):
            assert "JIT" not in plan, (
                f"JIT compiled {plan['Query Text'][:60]!r} (plan cost "
                f"{plan['Plan']['Total Cost']}, JIT {plan['JIT']['Timing']['Total']} ms)"
            )


# Declarations: the announce's wake and the hand-back -----------------------------------------

#: How many parked rows an announce wakes at most (see x_jobs.announce_worker).
WAKE_BOUND = 10_000


def test_announce_and_hand_back_read_only_the_rows_they_touch(big_connect: Connect) -> None:
    """An announce wakes the parked rows it serves through job_parked_idx, a seek per queue and
    name, so that beside 20,000 parked rows of a name it does not serve it reads none of them,
    and wakes at most WAKE_BOUND a call of one it does. A hand-back reaches its rows by id."""
    conn = big_connect(name="plan-announcer")
    conn.execute("SET jit = off")
    log = PlanLog(conn)
    queues = ["default", "q2", "q3"]
    with conn.transaction(force_rollback=True):
        # Past the 5 calls after which PL/pgSQL may keep a generic plan.
        for call in range(7):
            log.take()
            conn.execute(
                "SELECT x_jobs.announce_worker('plan-announcer', %s, jobs => %s)",
                [queues, ["work", "busy", "later"]],
            )
            for plan in _nested(log, "x_jobs.announce_worker("):
                where = f"call {call + 1}: {str(plan['Query Text']).strip()[:60]!r}"
                assert read_problems(plan, {"job": {"job_parked_idx"}}, SLACK) == [], where

        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM x_jobs.claim(ARRAY['default'], 'plan-hander', '1 hour', %s)",
                [QTY],
            ).fetchall()
        ]
        assert len(ids) == QTY
        log.take()
        served = conn.execute(
            "SELECT served_by FROM x_jobs.hand_back(%s, 'plan-hander')", [ids]
        ).fetchall()
        # Not parked: the announcer serves 'work'.
        assert served == [(["plan-announcer"],)] * QTY
        for plan in _nested(log, "x_jobs.hand_back("):
            where = repr(str(plan["Query Text"]).strip()[:60])
            assert read_problems(plan, {"job": {"job_pkey"}}, QTY) == [], where

        log.take()
        conn.execute(
            "SELECT x_jobs.announce_worker('plan-new', %s, jobs => ARRAY['unserved'])", [queues]
        )
        plans = _nested(log, "x_jobs.announce_worker(")
        woken = conn.execute(
            "SELECT count(*) FROM x_jobs.job WHERE name = 'unserved' AND state = 'ready'"
        ).fetchone()
        assert woken == (WAKE_BOUND,)
        for plan in plans:
            where = repr(str(plan["Query Text"]).strip()[:60])
            indexes = {"job": {"job_parked_idx", "job_pkey"}}
            assert read_problems(plan, indexes, WAKE_BOUND + SLACK) == [], where


# The operator's reads -----------------------------------------------------------------------


def _nested(log: PlanLog, call: str) -> list[dict[str, Any]]:
    plans = [p for p in log.take() if call not in str(p.get("Query Text", ""))]
    assert plans, f"auto_explain logged no statement inside {call}"
    return plans


def test_list_jobs_of_a_rare_state_reads_none_of_the_done_rows(big_connect: Connect) -> None:
    """Dead, failed and cancelled rows are listed through job_ended_idx: until 0.3.7 a listing
    of them read the whole table (a parallel scan of the million done rows). A job name is a
    filter on the same walk (0.4.0)."""
    conn = big_connect(name="operator")
    log = PlanLog(conn)
    for state in ("dead", "failed", "cancelled"):
        for name in (None, "old"):
            log.take()
            rows = conn.execute(
                "SELECT id FROM x_jobs.list_jobs(state => %s, name => %s)", [state, name]
            ).fetchall()
            assert rows == []
            for plan in _nested(log, "x_jobs.list_jobs("):
                for node in nodes(plan["Plan"]):
                    where = node.get("Index Name") or node.get("Relation Name") or node["Node Type"]
                    read = rows_read(node)
                    assert read <= SLACK, f"{state} {name}: {where} read {read:.0f}"


#: The live rows of the big table, which a bulk cancel may read (its arms, its walk).
LIVE_ROWS = sum(FILLED[state] for state in ("ready", "delayed", "suspended", "running"))
CANCELLED_HERE = 500


def test_bulk_operations_read_none_of_the_done_rows(big_connect: Connect) -> None:
    """cancel_jobs finds the live rows through the claim's partial indexes and walks only the
    range of their ids by primary key; retry_jobs walks job_ended_idx. Neither reads the million
    done rows below them, which a walk of the primary key from its start, or a sequential scan,
    reads on every call. Each call is rolled back: the table is the module's."""
    conn = big_connect(name="operator")
    log = PlanLog(conn)
    calls: list[tuple[LiteralString, float]] = [
        ("SELECT x_jobs.cancel_jobs(queue => 'q3', dry_run => true)", LIVE_ROWS),
        ("SELECT x_jobs.cancel_jobs(queue => 'q3', name => 'nobody')", LIVE_ROWS),
        ("SELECT x_jobs.retry_jobs(dry_run => true)", SLACK),
        ("SELECT x_jobs.retry_jobs(state => 'cancelled')", SLACK),
    ]
    for call, bound in calls:
        log.take()
        with conn.transaction(force_rollback=True):
            conn.execute(call)
        for plan in _nested(log, call):
            for node in nodes(plan["Plan"]):
                where = node.get("Index Name") or node.get("Relation Name") or node["Node Type"]
                assert rows_read(node) <= bound, f"{call}: {where} read {rows_read(node):.0f}"
    # A batch: the oldest delayed rows of q3 cancelled, then re-queued, reading about them.
    with conn.transaction(force_rollback=True):
        log.take()
        cancel = "SELECT x_jobs.cancel_jobs(queue => 'q3', state => 'delayed', max_rows => %s)"
        assert conn.execute(cancel, [CANCELLED_HERE]).fetchone() == (CANCELLED_HERE,)
        cancelled = log.take()
        retry = "SELECT x_jobs.retry_jobs(state => 'cancelled')"
        assert conn.execute(retry).fetchone() == (CANCELLED_HERE,)
        retried = log.take()
    for plans, bound in [(cancelled, FILLED["delayed"]), (retried, CANCELLED_HERE + SLACK)]:
        for plan in plans:
            if "x_jobs." in str(plan.get("Query Text", ""))[:30]:
                continue  # the call itself, whose plan is a Result
            for node in nodes(plan["Plan"]):
                where = node.get("Index Name") or node.get("Relation Name") or node["Node Type"]
                assert rows_read(node) <= bound, f"{where} read {rows_read(node):.0f}"


def test_queue_demand_ranks_only_the_keyed_rows(big_connect: Connect) -> None:
    """queue_demand counts due rows per queue off the claim's indexes and sorts only the rows
    that hold a concurrency key (their rank within the key decides whether they count): until
    0.3.7 it sorted every due row, 100,000 here, each time an autoscaler asked."""
    conn = big_connect(name="autoscaler")
    row = conn.execute(
        "SELECT count(*) FROM x_jobs.job WHERE concurrency_key IS NOT NULL"
        " AND state IN ('ready', 'delayed', 'suspended')"
    ).fetchone()
    assert row is not None
    keyed = int(row[0])
    assert 0 < keyed < READY_ROWS // 2
    log = PlanLog(conn)
    demand: dict[str, int] = dict(
        conn.execute("SELECT queue, demand FROM x_jobs.queue_demand()").fetchall()
    )
    assert demand.get("default", 0) > READY_ROWS // 2, demand
    for plan in _nested(log, "x_jobs.queue_demand("):
        for node in nodes(plan["Plan"]):
            if is_job(node):
                # Through the partial indexes: an index or bitmap scan, never the whole table.
                assert node["Node Type"] != "Seq Scan", node["Node Type"]
            if node["Node Type"] == "Sort" and node.get("Plans"):
                fed = node["Plans"][0]
                sorted_rows = float(fed.get("Actual Rows", 0)) * float(fed.get("Actual Loops", 0))
                assert sorted_rows <= keyed + SLACK, f"a sort of {sorted_rows:.0f} rows"


# Settling by id ----------------------------------------------------------------------------

#: Ids each round of test_settling_reads_only_its_ids claims, then heartbeats, fails, completes
#: and releases. Rounds: enough for PL/pgSQL to move from custom plans to a generic one.
SETTLE_BATCH = 60
SETTLE_ROUNDS = 7
#: Rows another worker runs beside them.
BUSY = 10_000


@pytest.fixture(scope="module")
def stale_dsn(admin: Conn, template_db: str) -> Iterator[str]:
    """A database whose statistics saw no running row, where another worker runs BUSY rows: the
    state of a backlog analyzed before its workers started. Autovacuum is off for the table, so
    that no ANALYZE corrects the statistics while the test runs."""
    with fresh_database(admin, template_db, prefix="x_jobs_plan_stale") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT count(*) FROM x_jobs.enqueue_many(("
                " SELECT jsonb_agg(jsonb_build_object('name', 'work', 'queue', 'q1'))"
                " FROM generate_series(1, %s)))",
                [2 * BUSY],
            )
            conn.execute("VACUUM ANALYZE x_jobs.job")
            conn.execute("ALTER TABLE x_jobs.job SET (autovacuum_enabled = false)")
            for _ in range(BUSY // 1000):
                conn.execute("SELECT x_jobs.claim(ARRAY['q1'], 'busy-worker', '1 hour', 1000)")
            running = conn.execute(
                "SELECT count(*) FROM x_jobs.job WHERE state = 'running'"
            ).fetchone()
            assert running == (BUSY,)
        yield dsn


@pytest.fixture
def stale_connect(stale_dsn: str) -> Iterator[Connect]:
    with connections(stale_dsn) as opener:
        yield opener


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan", "force_generic_plan"])
def test_settling_reads_only_its_ids(stale_connect: Connect, plan_cache_mode: str) -> None:
    """extend_lease, progress, fail, complete_many and release find a worker's rows by id.

    A statement that reached them through job_running_idx (whose `state = 'running'` predicate
    matches these statements' check, and which the statistics call empty) would read every row
    the other worker runs, on each call: settling would cost more as the fleet grows.
    """
    conn = stale_connect(name="plan-settler")
    conn.execute("SET jit = off")
    conn.execute("SELECT set_config('plan_cache_mode', %s, false)", [plan_cache_mode])
    log = PlanLog(conn)
    for round_ in range(SETTLE_ROUNDS):
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM x_jobs.claim(ARRAY['q1'], 'plan-settler', '1 hour', %s)",
                [SETTLE_BATCH],
            ).fetchall()
        ]
        assert len(ids) == SETTLE_BATCH
        log.take()
        held = conn.execute(
            "SELECT count(*) FROM x_jobs.extend_lease(%s, 'plan-settler', '2 hours')", [ids]
        ).fetchone()
        progressed = conn.execute(
            "SELECT x_jobs.progress(%s, 'plan-settler', done => 1, total => 2)", [ids[0]]
        ).fetchone()
        failed = conn.execute(
            "SELECT x_jobs.fail(%s, 'plan-settler', 'boom', retry_delay => '1 hour')::text",
            [ids[0]],
        ).fetchone()
        completed = conn.execute(
            "SELECT count(*) FROM x_jobs.complete_many(%s, 'plan-settler')", [ids[1:30]]
        ).fetchone()
        released = conn.execute(
            "SELECT count(*) FROM x_jobs.release(%s, 'plan-settler')", [ids[30:]]
        ).fetchone()
        # Each call did its work: a plan that read nothing would pass the checks below.
        assert (held, progressed, failed, completed, released) == (
            (SETTLE_BATCH,),
            (True,),
            ("delayed",),
            (29,),
            (SETTLE_BATCH - 30,),
        )
        for plan in log.take():
            text = str(plan.get("Query Text", ""))
            if "x_jobs.job" not in text or text.lstrip().startswith("SELECT count(*) FROM x_jobs."):
                continue
            where = f"round {round_ + 1}: {text.strip()[:60]!r}"
            # complete_many's update and delete each read the batch once.
            assert read_problems(plan, {"job": {"job_pkey"}}, SETTLE_BATCH) == [], where


#: A worker's full batch: half of what the settler can hold, a tenth of the table beside it.
BIG_BATCH = 1000


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan"])
def test_settling_a_big_batch_reads_only_its_ids(
    stale_connect: Connect, plan_cache_mode: str
) -> None:
    """A batch that is a large share of a small table is still reached by id.

    Planned for the batch's real size, with statistics that call the worker's rows few, reading
    the whole table looks cheaper than a thousand seeks; settling then cost the table's size on
    every call (complete_many of 500 in a table of 20,000 rows: 52-57 ms against 7). The
    settling functions plan once for a batch of any size, which is a seek per id. It fails on
    0.3.1.
    """
    conn = stale_connect(name="plan-big-settler")
    conn.execute("SET jit = off")
    conn.execute("SELECT set_config('plan_cache_mode', %s, false)", [plan_cache_mode])
    log = PlanLog(conn)
    for round_ in range(2):
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM x_jobs.claim(ARRAY['q1'], 'plan-big-settler', '1 hour', %s)",
                [BIG_BATCH],
            ).fetchall()
        ]
        assert len(ids) == BIG_BATCH
        half = BIG_BATCH // 2
        log.take()
        answers = [
            conn.execute(statement, [batch]).fetchone()
            for statement, batch in [
                ("SELECT count(*) FROM x_jobs.extend_lease(%s, 'plan-big-settler')", ids),
                ("SELECT count(*) FROM x_jobs.complete_many(%s, 'plan-big-settler')", ids[:half]),
                ("SELECT count(*) FROM x_jobs.release(%s, 'plan-big-settler')", ids[half:]),
            ]
        ]
        assert answers == [(BIG_BATCH,), (half,), (half,)]
        for plan in log.take():
            text = str(plan.get("Query Text", ""))
            if "x_jobs.job" not in text or text.lstrip().startswith("SELECT count(*) FROM x_jobs."):
                continue
            where = f"round {round_ + 1}: {text.strip()[:60]!r}"
            assert read_problems(plan, {"job": {"job_pkey"}}, BIG_BATCH) == [], where


# The publish -------------------------------------------------------------------------------

#: The history a publish must not read: a million resolved waits of the very event it publishes,
#: with 1,000 keys, so that each key of an open wait has 1,000 resolved steps beside it.
DONE_STEPS = 1_000_000
EVENT = "order.paid"
#: The open waits of EVENT, of suspended runs, one key each.
WAITING_STEPS = 100
#: More suspended runs, waiting on another event: a publish reads neither their steps nor their
#: jobs (a job table of only the 100 runs above is so small that a plan may read it whole).
OTHER_WAITS = 20_000
#: Rows a publish that matches one keyed wait may read in any node, on the step table (the
#: event's keyless waits and the waits of its key, then the matched step again by its key) and
#: on the job table (the woken run by its key).
PUBLISH_BOUND = 10

#: Through which indexes a publish may read each table.
PUBLISH_INDEXES = {
    "step": {"step_waiting_idx", "step_pkey"},
    "job": {"job_pkey"},
}

STEP_FILL: list[LiteralString] = [
    # The history: resolved waits of 250,000 finished runs, in no partial index. There is no
    # foreign key to x_jobs.job, so the runs need no rows of their own.
    """
    INSERT INTO x_jobs.step (
        job_id, name, kind, created_at, event, event_key, since, status, attempt, output,
        event_id, resolved_by, resolved_at
    )
    SELECT 1000000000 + g / 4, 'wait-' || g % 4, 'wait', t, 'order.paid', 'order-' || g % 1000,
           t, 'done', 1, '{"paid": true}', g, 'event', t
    FROM generate_series(0, 999999) AS g,
         LATERAL (SELECT now() - interval '30 days' + g * interval '1 second' AS t) AS x
    """,
    # Suspended runs waiting on another event (ids far from those the identity hands out).
    """
    INSERT INTO x_jobs.job (
        id, run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state,
        max_attempts, claims, name, queue, tenant_id, input
    )
    OVERRIDING SYSTEM VALUE
    SELECT 2000000000 + g, 'infinity', now(), now(), gen_random_uuid(), '1 second', '1 hour',
           'suspended', 25, 1, 'flow', 'default', 'none', '{}'
    FROM generate_series(1, 20000) AS g
    """,
    """
    INSERT INTO x_jobs.step (
        job_id, name, kind, created_at, event, event_key, since, status, attempt
    )
    SELECT 2000000000 + g, 'shipped', 'wait', now(), 'order.shipped', 'order-' || g, now(),
           'waiting', 1
    FROM generate_series(1, 20000) AS g
    """,
    "VACUUM ANALYZE x_jobs.step",
    "VACUUM ANALYZE x_jobs.job",
]


@pytest.fixture(scope="module")
def steps_dsn(admin: Conn, template_db: str) -> Iterator[str]:
    """A database of its own with a million resolved steps and open waits (about 10 s to fill)."""
    with fresh_database(admin, template_db, prefix="x_jobs_plan_steps") as dsn:
        started = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in STEP_FILL:
                conn.execute(statement)
            # The open waits of EVENT, through the API: suspended runs, one key each.
            conn.execute(
                "SELECT x_jobs.enqueue_many(jsonb_agg(jsonb_build_object('name', 'flow')))"
                " FROM generate_series(1, %s)",
                [WAITING_STEPS],
            )
            claimed = conn.execute(
                "SELECT id FROM x_jobs.claim(ARRAY['default'], 'plan-worker', '1 hour', %s)",
                [WAITING_STEPS],
            ).fetchall()
            assert len(claimed) == WAITING_STEPS
            for n, (job_id,) in enumerate(claimed):
                row = conn.execute(
                    "SELECT status::text FROM x_jobs.step_wait(id => %s, worker => 'plan-worker',"
                    " step => 'paid', event => %s, event_key => %s)",
                    [job_id, EVENT, f"order-{n}"],
                ).fetchone()
                assert row == ("waiting",)
            conn.execute("ANALYZE x_jobs.step")
            conn.execute("ANALYZE x_jobs.job")
            counts = conn.execute(
                "SELECT event, status::text, count(*) FROM x_jobs.step GROUP BY 1, 2"
            ).fetchall()
            assert sorted(counts) == [
                (EVENT, "done", DONE_STEPS),
                (EVENT, "waiting", WAITING_STEPS),
                ("order.shipped", "waiting", OTHER_WAITS),
            ]
        logger.info("filled the big step table in %.1f s", time.monotonic() - started)
        yield dsn


@pytest.fixture
def steps_connect(steps_dsn: str) -> Iterator[Connect]:
    with connections(steps_dsn) as opener:
        yield opener


def read_problems(plan: dict[str, Any], indexes: dict[str, set[str]], bound: int) -> list[str]:
    """How a statement's plan reads the tables of ``indexes`` other than by small index seeks.

    A Bitmap Heap Scan reads through the Bitmap Index Scans below it (under a BitmapOr or
    BitmapAnd): those must use allowed indexes too, and each is bounded like a scan.
    """
    problems = []
    for node in nodes(plan["Plan"]):
        table = node.get("Relation Name")
        if node.get("Schema", "x_jobs") != "x_jobs" or table not in indexes:
            continue
        kind = node["Node Type"]
        if kind == "ModifyTable":
            continue
        if kind == "Bitmap Heap Scan":
            seeks = [n for n in nodes(node) if n["Node Type"] == "Bitmap Index Scan"]
        elif kind in ("Index Scan", "Index Only Scan"):
            seeks = [node]
        else:
            problems.append(f"{kind} on x_jobs.{table}")
            seeks = []
        for seek in seeks:
            if seek.get("Index Name") not in indexes[table]:
                problems.append(f"{seek['Node Type']} on x_jobs.{table} ({seek.get('Index Name')})")
        for read in [node, *(seek for seek in seeks if seek is not node)]:
            if rows_read(read) > bound:
                problems.append(
                    f"{read['Node Type']} on x_jobs.{table} ({read.get('Index Name')}) handled"
                    f" {rows_read(read):.0f} rows (bound {bound})"
                )
    return problems


def _reads(plan: dict[str, Any], table: str) -> bool:
    return any(node.get("Relation Name") == table for node in nodes(plan["Plan"]))


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_custom_plan", "force_generic_plan"])
def test_publish_reads_only_the_waits_it_matches(
    steps_connect: Connect, plan_cache_mode: str
) -> None:
    conn = steps_connect(name="plan-publisher")
    log = PlanLog(conn)
    conn.execute("SET jit = off")
    conn.execute("SELECT set_config('plan_cache_mode', %s, false)", [plan_cache_mode])

    # Past the 5 calls after which PL/pgSQL may keep a generic plan; each call wakes one run
    # (the module's three tests use 21 of the 100 waits).
    keys = [
        str(key)
        for (key,) in conn.execute(
            "SELECT event_key FROM x_jobs.step WHERE status = 'waiting' AND event = %s"
            " ORDER BY event_key LIMIT 7",
            [EVENT],
        ).fetchall()
    ]
    assert len(keys) == 7
    for call, key in enumerate(keys, 1):
        log.take()
        woken = conn.execute(
            "SELECT woken FROM x_jobs.publish(%s, '{\"paid\": true}', %s)", [EVENT, key]
        ).fetchone()
        # A publish that matched nothing would pass every check below without reading a wait.
        assert woken == (1,), key
        nested = [p for p in log.take() if "x_jobs.publish(" not in str(p.get("Query Text", ""))]
        for plan in nested:
            where = f"call {call} ({key}): {str(plan['Query Text']).strip()[:40]!r}"
            assert read_problems(plan, PUBLISH_INDEXES, PUBLISH_BOUND) == [], where
        # The statement that resolves the waits found them through the partial index.
        resolving = [p for p in nested if _reads(p, "step")]
        assert len(resolving) == 1, [p.get("Query Text") for p in nested]
        used = {n.get("Index Name") for n in nodes(resolving[0]["Plan"])}
        assert "step_waiting_idx" in used, f"call {call} ({key}): {sorted(map(str, used))}"


def test_the_read_checker_rejects_a_lookup_of_the_history(steps_connect: Connect) -> None:
    """A lookup of a key's waits that forgets the status reads the key's resolved steps too."""
    conn = steps_connect(name="naive-publisher")
    with conn.transaction():
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON)"
            " SELECT job_id, name FROM x_jobs.step WHERE event = %s AND event_key = 'order-50'"
            " ORDER BY job_id, name FOR UPDATE",
            [EVENT],
        ).fetchone()
        assert row is not None
        plan: dict[str, Any] = row[0][0]
        raise psycopg.Rollback()

    problems = read_problems(plan, PUBLISH_INDEXES, PUBLISH_BOUND)
    assert problems, "the checker passed a lookup that reads the history"
    read = max(rows_read(n) for n in nodes(plan["Plan"]) if n.get("Relation Name") == "step")
    assert read >= DONE_STEPS // 1000, problems
    logger.info("the naive lookup: %s", problems)
