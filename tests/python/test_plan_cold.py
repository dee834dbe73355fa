"""The claim seeks whatever statistics the table had when a session first claimed.

A session keeps the generic plans it built at its first claim until x_jobs.job is next analysed.
Workers start on an empty table (a fresh install, a TRUNCATE): plans built there, where reading
the few pages costs less than any index, read the whole table on every claim once it fills, and a
worker fell behind steady production for the minute until the first autoanalyze. Here a session
claims first on a table in each such state, the table fills without being analysed (autovacuum
is off for it), and the same session's claims must then seek as on an analysed table
(test_plan.py), and so must the worker's other statements on the rows it claimed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import Conn, fresh_database
from plans import PlanLog, access_problems, is_pick, nodes, rows_read, seek_problems

QTY = 10
#: Rows the fill writes in each state: enough that a plan reading the table shows as thousands.
DONE_ROWS = 30_000
READY_ROWS = 30_000

FILL: list[LiteralString] = [
    """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, started_at, finished_at, run_id, backoff_base,
        backoff_max, state, attempt, max_attempts, claims, name, queue, tenant_id, claimed_by,
        input
    )
    SELECT now(), now(), now(), now(), now(), gen_random_uuid(), '1 second', '1 hour', 'done',
           1, 25, 1, 'old', (ARRAY['default', 'q2'])[1 + g %% 2], 'none', 'old-worker', '{}'
    FROM generate_series(1, %(done)s) AS g
    """,
    """
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        name, queue, tenant_id, concurrency_key, concurrency_limit, input
    )
    SELECT now() - interval '1 hour', now(), now(), gen_random_uuid(), '1 second', '1 hour',
           'ready', 25, 'work', (ARRAY['default', 'q2'])[1 + g %% 2], 'none',
           CASE WHEN g %% 7 = 0 THEN 'key-' || g %% 5 END, CASE WHEN g %% 7 = 0 THEN 1000 END, '{}'
    FROM generate_series(1, %(ready)s) AS g
    """,
]


def _fill(conn: Conn) -> None:
    for statement in FILL:
        conn.execute(statement, {"done": DONE_ROWS, "ready": READY_ROWS})


def _statistics(conn: Conn) -> tuple[float, int]:
    """reltuples (-1: never analysed) and how many times the table was analysed."""
    row = conn.execute(
        "SELECT c.reltuples, s.analyze_count + s.autoanalyze_count"
        " FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid"
        " WHERE c.oid = 'x_jobs.job'::regclass"
    ).fetchone()
    assert row is not None
    return float(row[0]), int(row[1])


@pytest.fixture
def cold_dsn(admin: Conn, template_db: str) -> Iterator[str]:
    with fresh_database(admin, template_db, prefix="x_jobs_cold") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # No analyze may come between the first claims and the ones checked.
            conn.execute("ALTER TABLE x_jobs.job SET (autovacuum_enabled = off)")
        yield dsn


def _claim(conn: Conn, queues: list[str]) -> list[Any]:
    return conn.execute(
        "SELECT id, state::text FROM x_jobs.claim(%s, 'cold-worker', '1 hour', %s)",
        [queues, QTY],
    ).fetchall()


#: The table as the session's first claims find it.
STARTS = {
    # A fresh install: never analysed, reltuples -1.
    "never analysed": [],
    # Analysed while empty (a first autovacuum, a manual ANALYZE): reltuples 0.
    "analysed empty": ["ANALYZE x_jobs.job"],
    # Analysed full, then emptied: a TRUNCATE resets the statistics to none.
    "truncated": ["ANALYZE x_jobs.job", "TRUNCATE x_jobs.job"],
}


@pytest.mark.parametrize("start", list(STARTS))
def test_a_claim_planned_on_an_empty_table_seeks_once_it_fills(cold_dsn: str, start: str) -> None:
    with (
        psycopg.connect(cold_dsn, autocommit=True) as admin,
        psycopg.connect(cold_dsn, autocommit=True) as conn,
    ):
        if start == "truncated":
            _fill(admin)
        for statement in STARTS[start]:
            admin.execute(statement)
        assert admin.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)
        statistics = _statistics(admin)
        assert (statistics[0] == -1) == (start != "analysed empty"), statistics

        # Past the 5 calls after which PL/pgSQL keeps a generic plan in the modes that choose.
        for _ in range(7):
            assert _claim(conn, ["default"]) == []
            assert _claim(conn, ["default", "q2"]) == []

        _fill(admin)
        assert _statistics(admin) == statistics, "the table was analysed while it filled"

        log = PlanLog(conn)
        for queues in (["default"], ["default", "q2"]):
            log.take()
            rows = _claim(conn, queues)
            assert len(rows) == QTY
            assert {state for _, state in rows} == {"running"}
            plans = [p for p in log.take() if "x_jobs.claim(" not in str(p.get("Query Text"))]
            assert any(is_pick(p) for p in plans), "auto_explain logged no picking statement"
            for plan in plans:
                where = f"{start}, {queues}: {str(plan['Query Text']).strip()[:60]!r}"
                assert access_problems(plan) == [], where
                if is_pick(plan):
                    assert seek_problems(plan, QTY, len(queues)) == [], where

            # What the worker does next with them reaches its rows by id as well.
            ids = [row[0] for row in rows]
            for call in (
                "SELECT count(*) FROM x_jobs.extend_lease(%(ids)s, 'cold-worker')",
                "SELECT x_jobs.fail(id => %(first)s, worker => 'cold-worker', error => 'e')",
                "SELECT count(*) FROM x_jobs.complete_many(%(rest)s, 'cold-worker')",
            ):
                log.take()
                conn.execute(call, {"ids": ids, "first": ids[0], "rest": ids[1:]})
                for plan in log.take():
                    where = f"{start}, {call}: {str(plan['Query Text']).strip()[:60]!r}"
                    assert access_problems(plan) == [], where


OUTBOX_ROWS = 30_000


def test_a_relay_planned_on_an_empty_outbox_seeks_once_it_fills(cold_dsn: str) -> None:
    """The outbox relay keeps generic plans as the claim does, with the same hazard: planned on
    an empty outbox, three of its statements read every message on each call once it filled."""
    qty = 10
    put = (
        "SELECT count(*) FROM x_jobs.outbox_put_many(("
        " SELECT jsonb_agg(jsonb_build_object('topic', 't', 'payload', '{}'::jsonb,"
        "   'key', CASE WHEN g %% 2 = 0 THEN 'k' || g %% 50 END))"
        " FROM generate_series(1, %s) AS g))"
    )
    relay = "SELECT id FROM x_jobs.relay_outbox(relay => 'cold-relay', qty => %s)"
    with (
        psycopg.connect(cold_dsn, autocommit=True) as admin,
        psycopg.connect(cold_dsn, autocommit=True) as conn,
    ):
        admin.execute("ALTER TABLE x_jobs.outbox SET (autovacuum_enabled = off)")
        for _ in range(7):
            assert conn.execute(relay, [qty]).fetchall() == []
        admin.execute(put, [OUTBOX_ROWS])
        row = admin.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'x_jobs.outbox'::regclass"
        ).fetchone()
        assert row == (-1,), "the outbox was analysed while it filled"

        log = PlanLog(conn)
        assert len(conn.execute(relay, [qty]).fetchall()) == qty
        plans = [p for p in log.take() if "x_jobs.relay_outbox(" not in str(p.get("Query Text"))]
        assert plans, "auto_explain logged nothing"
        # The keyed window at most, twice over (heads and their checks), never the backlog.
        bound = 2 * (10 * qty + 100)
        for plan in plans:
            where = repr(str(plan["Query Text"]).strip()[:60])
            for node in nodes(plan["Plan"]):
                if node.get("Relation Name") == "outbox":
                    assert node["Node Type"] not in ("Seq Scan", "Bitmap Heap Scan"), where
                assert rows_read(node) <= bound, (where, node["Node Type"], rows_read(node))
