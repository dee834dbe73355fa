"""A login granted only x_jobs_producer, as a web app's is: the Python client's producer side
(enqueue, enqueue_many, enqueue in the caller's transaction, the outbox, App.result) works
through the functions alone, and the tables stay closed to it (since 0.3.6)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from conftest import Conn, fresh_database
from psycopg import sql

import x_jobs
from x_jobs import errors


@contextmanager
def producer_login(admin: Conn) -> Iterator[str]:
    """A LOGIN role that is a member of x_jobs_producer only; its name. Dropped afterwards."""
    role = f"x_jobs_test_producer_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE x_jobs_producer").format(sql.Identifier(role))
    )
    try:
        yield role
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def settle(conn: Conn, queue: str, output: dict[str, Any]) -> list[int]:
    """Claim every due job of ``queue`` and complete it with ``output``, as a worker would."""
    rows = conn.execute(
        "SELECT c.id, x_jobs.complete(c.id, 'test-worker', %s)"
        " FROM x_jobs.claim(ARRAY[%s], 'test-worker', qty => 100) AS c",
        [psycopg.types.json.Jsonb(output), queue],
    ).fetchall()
    assert all(done for _, done in rows)
    return sorted(int(job_id) for job_id, _ in rows)


def test_a_producer_login_enqueues_puts_and_reads_results_without_table_rights(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    with producer_login(admin) as role:
        app = x_jobs.App(f"{dsn} user={role}")

        @app.job(name="greet", queue="greetings")
        def greet(input: dict[str, str]) -> None: ...

        try:
            one = app.enqueue(greet, {"who": "ada"})
            many = app.enqueue_many(greet, [{"who": "bob"}, {"who": "cy"}])
            deduped = app.enqueue(greet, {"who": "ada"}, idempotency_key="ada")
            again = app.enqueue(greet, {"who": "ada"}, idempotency_key="ada")
            with psycopg.connect(f"{dsn} user={role}") as own:
                app.enqueue(greet, {"who": "rolled back"}, conn=own)
                own.rollback()
                kept = app.enqueue(greet, {"who": "committed"}, conn=own)
                app.outbox.put("greetings.sent", {"who": "ada"}, conn=own)
                own.commit()
            message = app.outbox.put("greetings.sent", {"who": "bob"}, key="bob")

            with pytest.raises(errors.ResultTimeout):
                app.result(one.id, timeout=0)
            ids = settle(conn, "greetings", {"greeted": True})
            assert app.result(one.id, timeout=5) == {"greeted": True}
            with pytest.raises(errors.JobNotFound):
                app.result(-1, timeout=0)
        finally:
            app.close()

        # What the producer wrote is all there, and nothing of the rolled-back transaction.
        assert ids == sorted([one.id, *(e.id for e in many), deduped.id, kept.id])
        assert again.deduped and again.id == deduped.id
        inputs = conn.execute("SELECT input ->> 'who' FROM x_jobs.job ORDER BY id").fetchall()
        assert [who for (who,) in inputs] == ["ada", "bob", "cy", "ada", "committed"]
        topics = conn.execute("SELECT id, topic FROM x_jobs.outbox ORDER BY id").fetchall()
        assert len(topics) == 2 and topics[-1][0] == message

        # ...and the tables themselves are closed to it.
        with psycopg.connect(f"{dsn} user={role}", autocommit=True) as own:
            for table in ("job", "outbox", "webhook_ledger"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    own.execute(sql.SQL("SELECT * FROM x_jobs.{}").format(sql.Identifier(table)))


def test_result_on_a_database_before_0_4_1_is_refused_until_it_is_updated(admin: Conn) -> None:
    """On 0.4.0 App.result refuses (VersionUnsupported) and reads nothing; when the database is
    updated under the running App, its next read answers, for a job enqueued before."""
    with (
        fresh_database(admin, "template1", prefix="x_jobs_old") as old_dsn,
        producer_login(admin) as role,
        psycopg.connect(old_dsn, autocommit=True) as owner,
    ):
        owner.execute("CREATE EXTENSION x_jobs VERSION '0.4.0'")
        app = x_jobs.App(f"{old_dsn} user={role}")

        @app.job(name="greet", queue="greetings")
        def greet(input: dict[str, str]) -> None: ...

        try:
            before = app.enqueue(greet, {"who": "ada"})
            settle(owner, "greetings", {"n": 1})
            with pytest.raises(errors.VersionUnsupported, match=r"the database has 0\.4\.0"):
                app.result(before.id, timeout=5)

            owner.execute("ALTER EXTENSION x_jobs UPDATE TO '0.4.1'")
            assert app.result(before.id, timeout=5) == {"n": 1}
        finally:
            app.close()
