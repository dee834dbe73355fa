"""Tenants, with real logins: a login bound to a tenant, and an unbound login that SET ROLEs to
a bound role (a pooled backend), try every function and every table they are granted against
another tenant's rows. Each refuses as for a missing id, byte for byte, or sees nothing; what
they write is stamped with their tenant; a bound login cannot leave its tenant by SET ROLE."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from conftest import Conn
from psycopg import sql

# Calls on one job id by a bound role: %(id)s is the other tenant's id.
CALLS_ON_AN_ID = [
    "SELECT * FROM x_jobs.cancel(%(id)s)",
    "SELECT * FROM x_jobs.retry(%(id)s)",
    "SELECT * FROM x_jobs.resolve_step(%(id)s, 'wait')",
    "SELECT * FROM x_jobs.steps(%(id)s, 'u-worker')",
    "SELECT * FROM x_jobs.step_record(%(id)s, 'u-worker', 'run', '{}')",
    "SELECT * FROM x_jobs.step_sleep(%(id)s, 'u-worker', 'nap', '1 second')",
    "SELECT * FROM x_jobs.step_wait(%(id)s, 'u-worker', 'wait2', 'paid')",
]

# Calls that answer rows or a count: another tenant's id answers what a missing one does.
READS_OF_AN_ID = [
    "SELECT * FROM x_jobs.result(%(id)s)",
    "SELECT * FROM x_jobs.job_detail(%(id)s)",
    "SELECT * FROM x_jobs.job_errors(%(id)s)",
    "SELECT * FROM x_jobs.job_steps(%(id)s)",
    "SELECT * FROM x_jobs.job_states(ARRAY[%(id)s]::bigint[])",
    "SELECT * FROM x_jobs.held_jobs('u-worker')",
    "SELECT * FROM x_jobs.complete(%(id)s, 'u-worker')",
    "SELECT * FROM x_jobs.extend_lease(ARRAY[%(id)s]::bigint[], 'u-worker')",
    "SELECT * FROM x_jobs.release(ARRAY[%(id)s]::bigint[], 'u-worker')",
    "SELECT * FROM x_jobs.progress(%(id)s, 'u-worker', 1, 2)",
    "SELECT * FROM x_jobs.outbox_message(%(msg)s)",
    "SELECT * FROM x_jobs.outbox_redrive(ARRAY[%(msg)s]::bigint[])",
    "SELECT * FROM x_jobs.list_jobs() WHERE tenant_id = 'globex'",
    "SELECT * FROM x_jobs.list_outbox() WHERE id = %(msg)s",
    "SELECT * FROM x_jobs.job WHERE tenant_id = 'globex'",
    "SELECT * FROM x_jobs.job_error",
    "SELECT * FROM x_jobs.step",
    "SELECT * FROM x_jobs.event WHERE tenant_id = 'globex'",
    "SELECT * FROM x_jobs.outbox WHERE tenant_id = 'globex'",
    "SELECT * FROM x_jobs.job_counters()",
]


@contextmanager
def role(admin: Conn, options: str) -> Iterator[str]:
    name = f"x_jobs_test_tenant_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE ROLE {} " + options).format(sql.Identifier(name)))
    try:
        yield name
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def globex(conn: Conn) -> dict[str, int]:
    """Another tenant's rows, made by the (unbound) superuser: a running job of u-worker with
    a waiting step, an error, an event and an outbox message."""
    conn.execute("SET x_jobs.fake_now = '2030-01-01 12:00:00+00'")
    (job,) = conn.execute(
        "SELECT id FROM x_jobs.enqueue('u_job', queue => 'u-q', tenant_id => 'globex', "
        "idempotency_key => 'shared-key')"
    ).fetchone() or (None,)
    conn.execute("SELECT * FROM x_jobs.claim(ARRAY['u-q'], 'u-worker')")
    conn.execute("SELECT * FROM x_jobs.step_record(%s, 'u-worker', 'run', '{}')", [job])
    conn.execute("SET x_jobs.tenant = 'globex'")
    conn.execute("SELECT * FROM x_jobs.publish('seen', '{}')")
    (msg,) = conn.execute("SELECT x_jobs.outbox_put('u-topic', '{}')").fetchone() or (None,)
    conn.execute("RESET x_jobs.tenant")
    assert isinstance(job, int) and isinstance(msg, int)
    return {"id": job, "msg": msg}


def said(conn: Conn, query: str, ids: dict[str, int]) -> tuple[object, ...]:
    """What a call answers: its rows, or its refusal (SQLSTATE, message, detail, hint)."""
    try:
        with conn.transaction():
            return ("rows", conn.execute(query, ids).fetchall())
    except psycopg.Error as err:
        d = err.diag
        return (err.sqlstate, d.message_primary, d.message_detail, d.message_hint)


def as_acme(dsn: str, login: str, set_role: str | None) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(f"{dsn} user={login}", autocommit=True)
    if set_role:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(set_role)))
    return conn


@pytest.mark.parametrize("reached_by", ["login", "set_role"])
def test_a_bound_role_cannot_tell_another_tenants_rows_from_missing_ones(
    admin: Conn, dsn: str, conn: Conn, globex: dict[str, int], reached_by: str
) -> None:
    with (
        role(admin, "NOLOGIN IN ROLE x_jobs_admin") as bound,
        role(admin, "LOGIN") as pooler,
    ):
        admin.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(bound), sql.Identifier(pooler))
        )
        conn.execute("SELECT x_jobs.bind_tenant(role => %s, tenant => 'acme')", [bound])
        if reached_by == "login":
            admin.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(bound)))
            acme = as_acme(dsn, bound, None)
        else:
            acme = as_acme(dsn, pooler, bound)
        try:
            before = {q: said(acme, q, globex) for q in CALLS_ON_AN_ID + READS_OF_AN_ID}
            # The other tenant's rows gone, the same calls again: the very same answers.
            conn.execute("DELETE FROM x_jobs.step; DELETE FROM x_jobs.job_error")
            conn.execute("DELETE FROM x_jobs.job; DELETE FROM x_jobs.outbox")
            after = {q: said(acme, q, globex) for q in CALLS_ON_AN_ID + READS_OF_AN_ID}
            assert before == after
            for query in CALLS_ON_AN_ID:
                assert before[query][0] in ("XJ014", "XJ031"), (query, before[query])
            for query in READS_OF_AN_ID:
                assert before[query][0] == "rows", (query, before[query])
                assert before[query][1] in ([], [(0,)], [(False,)]), (query, before[query])
        finally:
            acme.close()


def test_a_bound_login_stamps_its_tenant_and_cannot_leave_it_by_set_role(
    admin: Conn, dsn: str, conn: Conn, globex: dict[str, int]
) -> None:
    with role(admin, "LOGIN IN ROLE x_jobs_admin") as login:
        conn.execute("SELECT x_jobs.bind_tenant(role => %s, tenant => 'acme')", [login])
        with psycopg.connect(f"{dsn} user={login}", autocommit=True) as acme:
            row = acme.execute(
                "SELECT id, deduped FROM x_jobs.enqueue('a_job', queue => 'a-q', "
                "idempotency_key => 'shared-key')"
            ).fetchone()
            assert row is not None and row[1] is False  # keys are per tenant
            stamped = conn.execute("SELECT tenant_id FROM x_jobs.job WHERE id = %s", [row[0]])
            assert stamped.fetchone() == ("acme",)
            with pytest.raises(psycopg.Error) as refused:
                acme.execute("SELECT x_jobs.enqueue('a_job', tenant_id => 'globex')")
            assert refused.value.sqlstate == "XJ060"
            # SET ROLE to an unbound role it is a member of keeps the login's tenant.
            acme.execute("SET ROLE x_jobs_admin")
            seen = acme.execute("SELECT DISTINCT tenant_id FROM x_jobs.job").fetchall()
            assert seen == [("acme",)]
            assert acme.execute("SELECT * FROM x_jobs.result(%s)", [globex["id"]]).fetchall() == []
            with pytest.raises(psycopg.Error) as crossing:
                acme.execute("SELECT x_jobs.cancel_jobs(tenant_id => 'globex')")
            assert crossing.value.sqlstate == "XJ062"


def test_a_scoped_publish_resolves_only_its_tenants_waits(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    conn.execute("SET x_jobs.fake_now = '2030-01-01 12:00:00+00'")
    ids: dict[str, object] = {}
    for tenant in ("acme", "globex"):
        (ids[tenant],) = conn.execute(
            "SELECT id FROM x_jobs.enqueue('w_job', queue => %s, tenant_id => %s)",
            [f"w-{tenant}", tenant],
        ).fetchone() or (None,)
        conn.execute("SELECT * FROM x_jobs.claim(ARRAY[%s], 'w-worker')", [f"w-{tenant}"])
        conn.execute(
            "SELECT * FROM x_jobs.step_wait(%s, 'w-worker', 'pay', 'paid', event_key => 'o-1')",
            [ids[tenant]],
        )
    with role(admin, "LOGIN IN ROLE x_jobs_producer") as login:
        conn.execute("SELECT x_jobs.bind_tenant(role => %s, tenant => 'acme')", [login])
        with psycopg.connect(f"{dsn} user={login}", autocommit=True) as acme:
            woken = acme.execute("SELECT woken FROM x_jobs.publish('paid', '{}', 'o-1')").fetchone()
            assert woken == (1,)
    states: dict[object, object] = dict(
        conn.execute(
            "SELECT tenant_id, state::text FROM x_jobs.job WHERE id = ANY (%s)",
            [list(ids.values())],
        ).fetchall()
    )
    assert states == {"acme": "ready", "globex": "suspended"}
    published = conn.execute("SELECT tenant_id FROM x_jobs.event WHERE name = 'paid'").fetchall()
    assert published == [("acme",)]
