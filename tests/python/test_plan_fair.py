"""A fair queue's claim SEEKS: it reads about qty rows however many tenants have due rows.

A module database gets two fair queues: 'many', with 10,000 tenants of 10 ready rows each
and one tenant of 200,000 (a flood that no claim may read past), and 'solo', with 200,000
ready rows of one tenant; beside them a plain queue of 100,000 ready rows. auto_explain logs
the real (ANALYZE) plan of every statement the claim runs, the queue's own function's
included (see x_jobs._claim_fair), so a plan that walks a tenant's rows, or every tenant, shows
up as thousands of rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import Conn, Connect, connections, fresh_database
from plans import ALLOWED_INDEXES, PlanLog, is_job, nodes, rows_read

QTY = 10
TENANTS = 10_000
PER_TENANT = 10
FLOOD = 200_000

FILL: list[LiteralString] = [
    # 'many': tenants t00000..t09999 with PER_TENANT rows each, and the flood tenant 'f' (first
    # in tenant order).
    f"""
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        name, queue, tenant_id, input
    )
    SELECT now() - interval '1 hour', now(), now(), gen_random_uuid(), '1 second', '1 hour',
           'ready', 25, 'work', 'many', 't' || lpad((g % {TENANTS})::text, 5, '0'), '{{}}'
    FROM generate_series(1, {TENANTS * PER_TENANT}) AS g
    """,
    f"""
    INSERT INTO x_jobs.job (
        run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state, max_attempts,
        name, queue, tenant_id, input
    )
    SELECT now() - interval '2 hours', now(), now(), gen_random_uuid(), '1 second', '1 hour',
           'ready', 25, 'work', q, t, '{{}}'
    FROM generate_series(1, {FLOOD}) AS g,
         (VALUES ('many', 'f'), ('solo', 'only'), ('plain', 'f')) AS v (q, t)
    """,
    "SELECT x_jobs.set_queue_policy('many', fair => true)",
    "SELECT x_jobs.set_queue_policy('solo', fair => true)",
    "VACUUM ANALYZE x_jobs.job",
]


@pytest.fixture(scope="module")
def fair_dsn(admin: Conn, template_db: str) -> Iterator[str]:
    with fresh_database(admin, template_db, prefix="x_jobs_plan_fair") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in FILL:
                conn.execute(statement)
        yield dsn


@pytest.fixture
def fair_connect(fair_dsn: str) -> Iterator[Connect]:
    with connections(fair_dsn) as opener:
        yield opener


def _fair_statement(plan: dict[str, Any]) -> bool:
    """The queue function's statement: the walk of the tenants and the pick of their rows."""
    return "after AS" in str(plan.get("Query Text", "")) or "visited AS" in str(
        plan.get("Query Text", "")
    )


def _claims(conn: Conn, log: PlanLog, queue: str, claims: int) -> list[list[dict[str, Any]]]:
    """Run `claims` claims of QTY (each its own transaction); the fair statement's plans."""
    found = []
    for _ in range(claims):
        log.take()
        rows = conn.execute(
            "SELECT tenant_id FROM x_jobs.claim(ARRAY[%s], 'plan-fair', '1 hour', %s)",
            [queue, QTY],
        ).fetchall()
        assert len(rows) == QTY
        found.append([p for p in log.take() if _fair_statement(p)])
    return found


def _problems(plan: dict[str, Any], bound: int) -> list[str]:
    """How the statement reads x_jobs.job other than by seeks of a fair index, or too much."""
    problems = []
    for node in nodes(plan["Plan"]):
        if rows_read(node) > bound:
            where = node.get("Index Name") or node.get("Relation Name") or ""
            problems.append(f"{node['Node Type']} {where} handled {rows_read(node):.0f} rows")
        if not is_job(node) or node["Node Type"] in ("ModifyTable", "Tid Scan"):
            continue
        if node["Node Type"] not in ("Index Scan", "Index Only Scan") or not (
            str(node.get("Index Name", "")).startswith("job_fair_")
        ):
            problems.append(f"{node['Node Type']} on x_jobs.job (index {node.get('Index Name')})")
    return problems


def _total(plans: list[dict[str, Any]]) -> float:
    return sum(rows_read(n) for p in plans for n in nodes(p["Plan"]) if is_job(n))


def test_a_fair_claim_reads_about_qty_rows_at_ten_thousand_tenants_and_at_one(
    fair_connect: Connect,
) -> None:
    conn = fair_connect(name="plan-fair")
    log = PlanLog(conn)
    conn.execute("SET jit = off")
    # Enough claims to go past the first tenants: each claim visits QTY of them, and the
    # plans are generic from the sixth call of the session on (the claim forces them).
    many = _claims(conn, log, "many", 12)
    solo = _claims(conn, log, "solo", 12)
    # Bound: QTY tenants visited, QTY rows read of each at most, and some room.
    bound = QTY * QTY + 50
    for n, plans in enumerate(many + solo, 1):
        assert len(plans) == 1, f"claim {n}: the fair statement ran {len(plans)} times"
        assert _problems(plans[0], bound) == [], f"claim {n}"
    # Flat: the rows read at 10,000 tenants are of the order of those at one tenant (a seek
    # per tenant visited, where one tenant's rows are read in a row).
    assert max(_total(p) for p in many) <= 3 * max(_total(p) for p in solo) + 50
    # And the claims took their rows in turns: 120 rows of 120 tenants, one of them the flood's
    # (first in tenant order: one row in the first turn, then the 10,000 others have theirs).
    taken = conn.execute(
        "SELECT count(DISTINCT tenant_id), count(*) FILTER (WHERE tenant_id = 'f')"
        " FROM x_jobs.job WHERE queue = 'many' AND state = 'running'"
    ).fetchone()
    assert taken == (12 * QTY, 1)


def test_the_fair_index_is_the_queues_own(fair_connect: Connect) -> None:
    conn = fair_connect()
    # A plain queue's claim never reads a fair queue's index; its statements are the plain ones.
    log = PlanLog(conn)
    conn.execute("SET jit = off")
    log.take()
    rows = conn.execute(
        "SELECT id FROM x_jobs.claim(ARRAY['plain'], 'plan-plain', '1 hour', %s)", [QTY]
    ).fetchall()
    assert len(rows) == QTY
    for plan in log.take():
        for node in nodes(plan["Plan"]):
            if is_job(node) and node.get("Index Name"):
                assert node["Index Name"] in ALLOWED_INDEXES, plan["Query Text"][:80]
    sizes: dict[str, int] = dict(
        conn.execute(
            "SELECT p.queue, pg_relation_size(('x_jobs.' || p.fair_index)::regclass)"
            " FROM x_jobs.queue_policies() AS p"
        ).fetchall()
    )
    # The fair indexes hold their queues' rows only: 'solo' (200,000 rows) is about the size of
    # 'many' (300,000), not of the whole table's ready rows (600,000).
    assert set(sizes) == {"many", "solo"}
    assert sizes["solo"] < sizes["many"], sizes
