"""x_jobs.errors: the Python classes match the server's catalogue, and translate types refusals."""

from __future__ import annotations

import logging
import os
from typing import LiteralString

import psycopg
import pytest
from conftest import Conn

import x_jobs
from x_jobs import errors

logger = logging.getLogger(__name__)


def _refusal(conn: Conn, query: LiteralString) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(query)
    return caught.value


def test_by_code_is_the_servers_catalogue(conn: Conn) -> None:
    catalogue = {
        str(code): str(sqlstate)
        for sqlstate, code, _ in conn.execute("SELECT * FROM x_jobs.error_codes()").fetchall()
    }
    # Every code the server can raise has its class, under the same SQLSTATE...
    for code, sqlstate in catalogue.items():
        assert code in errors.BY_CODE, f"no Python class for {code}"
        assert errors.BY_CODE[code].sqlstate == sqlstate, code
    # ...and every class names a code the server has.
    for code, cls in errors.BY_CODE.items():
        assert catalogue.get(code) == cls.sqlstate, f"{cls.__name__} ({code}) is not a server code"
        assert cls.code == code
    assert len(errors.BY_CODE) == len(catalogue)


def test_a_refusal_becomes_its_typed_error(conn: Conn) -> None:
    err = _refusal(conn, "SELECT * FROM x_jobs.claim(ARRAY['default'], 'w1', '30 seconds', 0)")
    assert err.sqlstate == "XJ013"

    typed = errors.translate(err)

    assert type(typed) is errors.QtyInvalid
    assert isinstance(typed, errors.InvalidArgument)
    assert typed.code == "X_QTY_INVALID"
    assert typed.message.startswith("X_QTY_INVALID: qty 0 ")
    assert typed.hint
    assert typed.hint == err.diag.message_hint
    assert typed.__cause__ is err
    assert typed.hint in str(typed)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT x_jobs.enqueue('')", errors.NameInvalid),
        ("SELECT x_jobs.enqueue('a', queue => '')", errors.QueueInvalid),
        ("SELECT x_jobs.enqueue('a', max_attempts => 0)", errors.MaxAttemptsInvalid),
        ("SELECT x_jobs.enqueue_many('{}')", errors.JobsInvalid),
        ('SELECT x_jobs.enqueue_many(\'[{"nmae": "a"}]\')', errors.JobsInvalid),
        ("SELECT * FROM x_jobs.claim(ARRAY[]::text[], 'w1')", errors.QueuesInvalid),
        ("SELECT * FROM x_jobs.claim(ARRAY['default'], '')", errors.WorkerInvalid),
        ("SELECT * FROM x_jobs.claim(ARRAY['default'], 'w1', '0 seconds')", errors.LeaseInvalid),
        ("SELECT x_jobs.fail(1, 'w1', '')", errors.ErrorMissing),
        ("SELECT x_jobs.cancel(-1)", errors.JobNotFound),
        ("SELECT x_jobs.purge('-1 day')", errors.RetentionInvalid),
        ("SELECT x_jobs.enqueue('a', run_at => 'infinity')", errors.TimeInvalid),
        ("SELECT x_jobs.enqueue('a', idempotency_key => repeat('k', 401))", errors.JobsInvalid),
        ("SELECT * FROM x_jobs.claim(ARRAY['default'], repeat('w', 401))", errors.WorkerInvalid),
        ("SELECT x_jobs.cancel_jobs(state => 'done')", errors.StateNotAllowed),
        ("SELECT x_jobs.retry_jobs(state => 'ready')", errors.StateNotAllowed),
        ("SELECT x_jobs.retry_jobs(state => 'gone')", errors.StateUnknown),
        ("SELECT x_jobs.cancel_jobs(max_rows => 0)", errors.QtyInvalid),
        (
            "SELECT x_jobs.retry_jobs(created_after => now(), created_before => now())",
            errors.RangeEmpty,
        ),
    ],
)
def test_every_kind_of_refusal_translates(
    conn: Conn, query: LiteralString, expected: type[errors.XJobsError]
) -> None:
    err = _refusal(conn, query)
    typed = errors.translate(err)
    assert type(typed) is expected, err
    assert isinstance(typed, errors.XJobsError)
    assert typed.sqlstate == err.sqlstate
    assert typed.message.startswith(expected.code + ":")
    assert typed.hint
    assert typed.__cause__ is err


def test_claim_outside_read_committed_is_refused(conn: Conn) -> None:
    with pytest.raises(psycopg.Error) as caught, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT * FROM x_jobs.claim(ARRAY['default'], 'w1')")
    typed = errors.translate(caught.value)
    assert type(typed) is errors.IsolationUnsupported
    assert typed.__cause__ is caught.value


def test_an_enqueue_race_is_told_from_other_serialization_failures(conn: Conn) -> None:
    # The same SQLSTATE as any serialization failure: the X_ code decides.
    race = _refusal(
        conn,
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001',"
        " MESSAGE = 'X_ENQUEUE_RACE: an idempotency key kept changing hands'; END $$",
    )
    typed = errors.translate(race)
    assert type(typed) is errors.EnqueueRace
    assert typed.__cause__ is race

    other = _refusal(
        conn,
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001',"
        " MESSAGE = 'could not serialize access'; END $$",
    )
    assert errors.translate(other) is other


def test_errors_that_are_no_refusal_come_back_unchanged(conn: Conn) -> None:
    division = _refusal(conn, "SELECT 1 / 0")
    assert division.sqlstate == "22012"
    assert errors.translate(division) is division

    # An X_ code under a SQLSTATE that is not its own is no x_jobs refusal either...
    foreign = _refusal(
        conn,
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'P0001',"
        " MESSAGE = 'X_QTY_INVALID: not from x_jobs'; END $$",
    )
    assert errors.translate(foreign) is foreign
    # ...nor an x_jobs SQLSTATE without the X_ code at the head of the message.
    headless = _refusal(
        conn, "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'XJ013', MESSAGE = 'qty'; END $$"
    )
    assert errors.translate(headless) is headless
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_malformed_payload_limit_is_a_setting_error_not_an_argument_error(conn: Conn) -> None:
    """x_jobs.max_payload_bytes = 'abc' failed every enqueue with a bare cast error. It is the
    deployment's setting, not the call's value: not an InvalidArgument, which the outbox relay and
    the webhook receiver refuse for good."""
    conn.execute("SET x_jobs.max_payload_bytes = '4MB'")
    err = _refusal(conn, "SELECT x_jobs.enqueue('a')")
    typed = errors.translate(err)
    assert type(typed) is errors.SettingInvalid
    assert not isinstance(typed, errors.InvalidArgument)
    assert typed.sqlstate == "XJ040"
    assert typed.message.startswith("X_SETTING_INVALID: x_jobs.max_payload_bytes '4MB' ")
    assert typed.hint and "RESET" in typed.hint


def test_the_test_clock_is_refused_to_a_session_that_is_not_a_superusers(
    dsn: str, admin: Conn
) -> None:
    """x_jobs.fake_now moved forward would make other workers' leases look lapsed to this
    session's claims: a worker's login that sets it gets X_CLOCK_REFUSED, typed, with a hint."""
    role = f"x_jobs_test_clock_{os.getpid()}"
    admin.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE x_jobs_worker')
    try:
        with psycopg.connect(
            f"{dsn} user={role}", options="-c x_jobs.fake_now=2099-01-01", autocommit=True
        ) as moved:
            err = _refusal(moved, "SELECT * FROM x_jobs.claim(ARRAY['default'], 'w1')")
        with psycopg.connect(f"{dsn} user={role}", autocommit=True) as plain:
            assert plain.execute("SELECT x_jobs.now() = now()").fetchone() == (True,)
    finally:
        admin.execute(f'DROP ROLE "{role}"')

    typed = errors.translate(err)
    assert type(typed) is errors.ClockRefused
    assert typed.sqlstate == "XJ038"
    assert typed.message.startswith("X_CLOCK_REFUSED: x_jobs.fake_now is set to '2099-01-01'")
    assert role in typed.message
    assert typed.hint and "RESET x_jobs.fake_now" in typed.hint


def test_an_input_postgresql_cannot_store_is_refused_before_the_enqueue(
    dsn: str, conn: Conn
) -> None:
    """A NUL character passes Python's JSON and not jsonb: the enqueue raised the bare database
    error (UntranslatableCharacter) where every bad input is InputInvalid."""
    app = x_jobs.App(dsn)

    @app.job(name="notes")
    def notes(input: dict[str, str]) -> None: ...

    try:
        with pytest.raises(errors.InputInvalid) as refused:
            app.enqueue(notes, {"text": "a\x00b"})
    finally:
        app.close()
    assert "holds a NUL character" in refused.value.message
    assert refused.value.hint
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)
