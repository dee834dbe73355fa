"""Tenants in the Python client and the CLI, against real logins bound to tenants: an app scoped
to one tenant (``App(tenant=...)``, ``app.for_tenant``) stamps its enqueues and scopes its
transactions (locally: nothing outlives them, on a pooled connection or the caller's own);
``App(tenants=True)`` requires every job's tenant; a handler's ``ctx.enqueue`` is stamped with
its job's tenant; ``cross_tenant`` leaves the scope only for a reason it logs; ``x-jobs tenants
bind|unbind|list`` and ``--tenant``."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from conftest import Conn, serving, wait_for
from psycopg import sql
from typer.testing import CliRunner

import x_jobs
from x_jobs import errors
from x_jobs.cli import cli

logger = logging.getLogger(__name__)

runner = CliRunner(env={"COLUMNS": "200"})


@contextmanager
def login(admin: Conn, *roles: str) -> Iterator[str]:
    """A LOGIN role, member of ``roles``; its name. Dropped afterwards (roles are cluster-wide,
    the bindings live in the test's own database)."""
    name = f"x_jobs_test_tenant_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, roles))
        )
    )
    try:
        yield name
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def bind(conn: Conn, role: str, *tenants: str) -> None:
    for tenant in tenants:
        conn.execute("SELECT x_jobs.bind_tenant(role => %s, tenant => %s)", [role, tenant])


def tenant_of(conn: Conn, job_id: int) -> str:
    # The test's superuser connection: row-level security does not apply to it.
    row = conn.execute("SELECT tenant_id FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    assert row is not None, f"job {job_id} is not there"
    return str(row[0])


def job_count(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM x_jobs.job").fetchone()
    assert row is not None
    return int(row[0])


def sqlstate(err: BaseException) -> str | None:
    return getattr(err, "sqlstate", None)


# --- declarations ---------------------------------------------------------------------------


def test_an_app_with_tenants_refuses_a_job_that_does_not_say_its_tenant() -> None:
    app = x_jobs.App("", tenants=True)
    with pytest.raises(errors.JobTenantMissing) as refused:

        @app.job(name="untenanted")
        def untenanted(input: dict[str, str]) -> None: ...

    assert refused.value.code == "X_JOB_TENANT_MISSING"
    assert str(refused.value).startswith("X_JOB_TENANT_MISSING: job 'untenanted'")
    assert refused.value.hint and "tenant=lambda input" in refused.value.hint
    assert "untenanted" not in app.jobs

    @app.job(name="tenanted", tenant=lambda input: input["org"])
    def tenanted(input: dict[str, str]) -> None: ...

    assert tenanted.request({"org": "acme"})["tenant_id"] == "acme"
    # The operator's job is no tenant's: declared on such an app all the same.
    assert app.schedule_maintenance().tenant == "none"


def test_an_app_without_tenants_takes_tenant_as_an_option_of_the_job() -> None:
    app = x_jobs.App("")

    @app.job(name="loose")
    def loose(input: dict[str, str]) -> None: ...

    @app.job(name="own", tenant=lambda input: input["org"])
    def own(input: dict[str, str]) -> None: ...

    assert "tenant_id" not in loose.request({})
    assert own.request({"org": "globex"})["tenant_id"] == "globex"


def test_a_view_for_a_tenant_shares_the_declarations_sinks_and_pool() -> None:
    app = x_jobs.App("")

    @app.job(name="shared")
    def shared(input: dict[str, str]) -> None: ...

    @app.outbox.sink("orders")
    def deliver(message: x_jobs.OutboxMessage) -> None: ...

    view = app.for_tenant("acme")
    assert (view.tenant, app.tenant) == ("acme", None)
    assert view.jobs is app.jobs and view.schedules is app.schedules
    assert view.outbox.sinks is app.outbox.sinks and view.outbox.app is view
    assert view._pools is app._pools
    assert view.for_tenant("globex").tenant == "globex"


def test_a_tenant_is_checked_where_the_app_is_made() -> None:
    with pytest.raises(errors.TenantInvalid):
        x_jobs.App("", tenant="")
    with pytest.raises(errors.TenantInvalid):
        x_jobs.App("").for_tenant("t" * 201)
    with pytest.raises(TypeError):
        x_jobs.App("", tenant=7)  # type: ignore[arg-type]


# --- scoped apps against bound logins -------------------------------------------------------


def test_a_scoped_app_stamps_its_enqueues_and_the_bound_login_is_held_to_its_tenants(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    with login(admin, "x_jobs_producer") as role:
        bind(conn, role, "acme", "globex")
        app = x_jobs.App(f"{dsn} user={role}", tenant="acme")

        @app.job(name="report", queue="reports")
        def report(input: dict[str, str]) -> None: ...

        @app.job(name="by_org", queue="reports", tenant=lambda input: input["org"])
        def by_org(input: dict[str, str]) -> None: ...

        try:
            acme = app.enqueue(report, {"n": "1"})
            globex = app.for_tenant("globex").enqueue(report, {"n": "2"})
            assert tenant_of(conn, acme.id) == "acme"
            assert tenant_of(conn, globex.id) == "globex"
            # The job's declared tenant agrees with the scope: taken as it is.
            assert tenant_of(conn, app.enqueue(by_org, {"org": "acme"}).id) == "acme"

            # Another tenant, named by the job or the call: refused before anything is sent.
            before = job_count(conn)
            with pytest.raises(errors.TenantScopeConflict) as conflict:
                app.enqueue(by_org, {"org": "globex"})
            assert str(conflict.value).startswith("X_TENANT_SCOPE_CONFLICT: job 'by_org'")
            with pytest.raises(errors.TenantScopeConflict):
                app.enqueue_many(report, [{"n": "3"}], tenant_id="globex")
            assert job_count(conn) == before

            # The database holds the login to its tenants, whatever the client says.
            with pytest.raises((errors.XJobsError, psycopg.Error)) as out_of_scope:
                app.for_tenant("initech").enqueue(report, {"n": "4"})
            assert sqlstate(out_of_scope.value) == "XJ060"
            unscoped = x_jobs.App(f"{dsn} user={role}")
            unscoped.jobs.update(app.jobs)
            try:
                with pytest.raises((errors.XJobsError, psycopg.Error)) as ambiguous:
                    unscoped.enqueue("report", {"n": "5"})
                assert sqlstate(ambiguous.value) == "XJ061"
            finally:
                unscoped.close()
            assert job_count(conn) == before
        finally:
            app.close()


def test_the_scope_is_local_to_each_transaction(dsn: str, conn: Conn) -> None:
    app = x_jobs.App(dsn, tenant="acme", pool_size=1)

    @app.job(name="note")
    def note(input: dict[str, str]) -> None: ...

    setting = "SELECT coalesce(current_setting('x_jobs.tenant', true), '')"
    try:
        app.enqueue(note, {})
        # The pool's one connection, handed on: it keeps nothing of the app's tenant.
        with app.pool.connection() as pooled:
            assert pooled.execute(setting).fetchone() == ("",)

        # The caller's transaction, not in autocommit and idle: the enqueue joins it (psycopg's
        # transaction block would have committed it), and the scope lasts as long as it does.
        with psycopg.connect(dsn) as own:
            assert not own.autocommit
            before = job_count(conn)
            app.enqueue(note, {"n": "rolled back"}, conn=own)
            assert own.execute(setting).fetchone() == ("acme",)
            own.rollback()
            assert own.execute(setting).fetchone() == ("",)
            assert job_count(conn) == before
            kept = app.enqueue(note, {"n": "kept"}, conn=own)
            own.commit()
            assert tenant_of(conn, kept.id) == "acme"

        # An autocommit connection outside a transaction: one of its own, committed.
        with psycopg.connect(dsn, autocommit=True) as bare:
            done = app.enqueue(note, {"n": "bare"}, conn=bare)
            assert bare.execute(setting).fetchone() == ("",)
            assert tenant_of(conn, done.id) == "acme"
    finally:
        app.close()


def test_a_scoped_app_puts_outbox_messages_for_its_tenant(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    app = x_jobs.App(dsn, tenant="acme")
    try:
        first = app.outbox.put("orders", {"n": 1})
        second = app.for_tenant("globex").outbox.put("orders", {"n": 2})
        rows: dict[int, str] = dict(
            conn.execute(
                "SELECT id, tenant_id FROM x_jobs.outbox WHERE id = ANY (%s)", [[first, second]]
            ).fetchall()
        )
        assert rows == {first: "acme", second: "globex"}
        with login(admin, "x_jobs_admin") as role:
            bind(conn, role, "acme", "globex")
            as_role = f"{dsn} user={role}"
            code, messages = invoke("outbox", "list", "--tenant", "globex", "--dsn", as_role)
            assert code == 0 and [m["id"] for m in messages["messages"]] == [second]
            code, messages = invoke("outbox", "list", "--tenant", "acme", "--dsn", as_role)
            assert code == 0 and [m["id"] for m in messages["messages"]] == [first]
    finally:
        app.close()


def test_a_scoped_app_publishes_for_its_tenant(dsn: str, conn: Conn) -> None:
    app = x_jobs.App(dsn, tenant="acme")
    try:
        published = app.publish("order.paid", {"order": 1}, key="o-1")
        other = app.for_tenant("globex").publish("order.paid")
        assert (published.woken, other.woken) == (0, 0)
        rows: dict[int, str] = dict(
            conn.execute(
                "SELECT id, tenant_id FROM x_jobs.event WHERE id = ANY (%s)",
                [[published.event_id, other.event_id]],
            ).fetchall()
        )
        assert rows == {published.event_id: "acme", other.event_id: "globex"}
    finally:
        app.close()


def test_a_scoped_app_reads_no_result_of_another_tenant(admin: Conn, dsn: str, conn: Conn) -> None:
    with login(admin, "x_jobs_producer") as role:
        bind(conn, role, "acme", "globex")
        app = x_jobs.App(f"{dsn} user={role}", tenant="acme")

        @app.job(name="answer")
        def answer(input: dict[str, str]) -> None: ...

        try:
            theirs = app.for_tenant("globex").enqueue(answer, {})
            mine = app.enqueue(answer, {})
            with pytest.raises(errors.ResultTimeout):
                app.result(mine.id, timeout=0)
            with pytest.raises(errors.JobNotFound) as missing:
                app.result(theirs.id, timeout=0)
            with pytest.raises(errors.JobNotFound) as none:
                app.result(theirs.id + 1000, timeout=0)
            # No oracle: "another tenant's" reads as "no such id".
            assert str(missing.value).replace(str(theirs.id), "N") == str(none.value).replace(
                str(theirs.id + 1000), "N"
            )
        finally:
            app.close()


# --- handlers -------------------------------------------------------------------------------


def test_a_handler_knows_its_tenant_and_what_it_enqueues_is_stamped_with_it(
    dsn: str, conn: Conn
) -> None:
    app = x_jobs.App(dsn, tenants=True)
    seen: dict[str, Any] = {}
    done = threading.Event()

    @app.job(name="child", queue="tenants", tenant=lambda input: input["org"])
    def child(input: dict[str, str]) -> None: ...

    @app.job(name="plain_child", queue="tenants", tenant=lambda input: input.get("org", "none"))
    def plain_child(input: dict[str, str]) -> None: ...

    @app.job(name="parent", queue="tenants", tenant=lambda input: input["org"])
    def parent(input: dict[str, str], ctx: x_jobs.JobContext) -> None:
        try:
            seen["tenant"] = ctx.tenant_id
            seen["child"] = ctx.enqueue(child, {"org": ctx.tenant_id}).id
            seen["many"] = [e.id for e in ctx.enqueue_many("child", [{"org": ctx.tenant_id}])]
            try:
                ctx.enqueue(child, {"org": "globex"})
            except errors.TenantScopeConflict as err:
                seen["conflict"] = err.code
        finally:
            done.set()

    try:
        parent.enqueue({"org": "acme"})
        with serving(app, 1, queues=["tenants"]):
            wait_for(done.is_set, "the parent job to run")
        assert seen["tenant"] == "acme"
        assert tenant_of(conn, seen["child"]) == "acme"
        assert [tenant_of(conn, i) for i in seen["many"]] == ["acme"]
        assert seen["conflict"] == "X_TENANT_SCOPE_CONFLICT"
    finally:
        app.close()


# --- leaving the scope ----------------------------------------------------------------------


def test_cross_tenant_needs_a_reason_and_logs_it_with_the_role(
    admin: Conn, dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        pytest.raises(errors.CrossTenantReasonMissing) as refused,
        x_jobs.cross_tenant("", dsn=dsn),
    ):
        pytest.fail("entered without a reason")
    assert refused.value.code == "X_CROSS_TENANT_REASON_MISSING"
    app = x_jobs.App(dsn, tenant="acme")
    with pytest.raises(errors.CrossTenantReasonMissing), app.cross_tenant("   "):
        pytest.fail("entered with a blank reason")

    with login(admin, "x_jobs_producer") as bound, login(admin, "x_jobs_producer") as unbound:
        bind(conn, bound, "acme")
        scoped = x_jobs.App(f"{dsn} user={bound}", tenant="acme")

        @scoped.job(name="look")
        def look(input: dict[str, str]) -> None: ...

        other = x_jobs.App(dsn, tenant="globex")
        other.jobs.update(scoped.jobs)
        try:
            theirs = other.enqueue("look", {})
            with pytest.raises(errors.JobNotFound):
                scoped.result(theirs.id, timeout=0)
            caplog.set_level(logging.WARNING, logger="x_jobs.app")
            with scoped.cross_tenant("ticket 4711: audit", dsn=f"{dsn} user={unbound}") as audit:
                assert audit.tenant is None
                with pytest.raises(errors.ResultTimeout):  # seen: live, not missing
                    audit.result(theirs.id, timeout=0)
            records = [r for r in caplog.records if r.name == "x_jobs.app"]
            assert any(
                getattr(r, "reason", None) == "ticket 4711: audit"
                and getattr(r, "role", None) == unbound
                for r in records
            ), records
            # The module's function, through a login of its own.
            alone_dsn = f"{dsn} user={unbound}"
            with (
                x_jobs.cross_tenant("ticket 4712", dsn=alone_dsn) as alone,
                pytest.raises(errors.ResultTimeout),
            ):
                alone.result(theirs.id, timeout=0)
            # A bound login stays held to its tenants: leaving the scope widens nothing.
            with (
                scoped.cross_tenant("ticket 4713") as still_bound,
                pytest.raises(errors.JobNotFound),
            ):
                still_bound.result(theirs.id, timeout=0)
        finally:
            scoped.close()
            other.close()
            app.close()


# --- the command line -----------------------------------------------------------------------


def invoke(*args: str) -> tuple[int, Any]:
    result = runner.invoke(cli, [*args, "--json"])
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        doc = result.stdout
    return result.exit_code, doc


def test_tenants_bind_list_and_unbind(admin: Conn, dsn: str) -> None:
    with login(admin, "x_jobs_producer") as role:
        code, bound = invoke("tenants", "bind", role, "acme", "--dsn", dsn)
        assert (code, bound) == (0, {"role": role, "tenant": "acme", "bound": True})
        assert invoke("tenants", "bind", role, "globex", "--dsn", dsn)[0] == 0
        code, listed = invoke("tenants", "list", "--dsn", dsn)
        assert code == 0
        assert [(b["role"], b["tenant"]) for b in listed["bindings"]] == [
            (role, "acme"),
            (role, "globex"),
        ]
        assert all(b["bound_at"] and b["bound_by"] for b in listed["bindings"])
        code, unbound = invoke("tenants", "unbind", role, "globex", "--dsn", dsn)
        assert (code, unbound["changed"]) == (0, True)
        code, again = invoke("tenants", "unbind", role, "globex", "--dsn", dsn)
        assert (code, again["changed"]) == (0, False)
        code, listed = invoke("tenants", "list", "--dsn", dsn)
        assert [(b["role"], b["tenant"]) for b in listed["bindings"]] == [(role, "acme")]
        # A login without x_jobs_admin may not bind.
        code, refused = invoke("tenants", "bind", role, "initech", "--dsn", f"{dsn} user={role}")
        assert code == 2
        assert refused["error"]["code"] == "X_PERMISSION_DENIED"


def test_listing_commands_take_a_tenant_scope(admin: Conn, dsn: str, conn: Conn) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="listed", queue="listing")
    def listed(input: dict[str, str]) -> None: ...

    try:
        acme = app.for_tenant("acme").enqueue(listed, {})
        globex = app.for_tenant("globex").enqueue(listed, {})
        with login(admin, "x_jobs_admin") as role:
            bind(conn, role, "acme", "globex")
            as_role = f"{dsn} user={role}"
            code, listing = invoke("jobs", "list", "--tenant", "acme", "--dsn", as_role)
            assert code == 0
            assert [j["id"] for j in listing["jobs"]] == [acme.id]
            code, listing = invoke("jobs", "list", "--dsn", as_role)
            assert sorted(j["id"] for j in listing["jobs"]) == sorted([acme.id, globex.id])
            code, shown = invoke(
                "jobs", "show", str(globex.id), "--tenant", "acme", "--dsn", as_role
            )
            assert code == 1 and shown["error"]["code"] == "X_JOB_NOT_FOUND"
            code, shown = invoke("jobs", "show", str(acme.id), "--tenant", "acme", "--dsn", as_role)
            assert code == 0 and shown["job"]["tenant_id"] == "acme"
            code, queues = invoke("queues", "--tenant", "globex", "--dsn", as_role)
            assert code == 0
            assert [(q["queue"], q["ready"]) for q in queues["queues"]] == [("listing", 1)]
            # A tenant the bound login does not act for: refused, as the database says.
            code, refused = invoke("jobs", "list", "--tenant", "initech", "--dsn", as_role)
            assert code == 1 and refused["error"]["code"] == "X_TENANT_OUT_OF_SCOPE"
    finally:
        app.close()
