"""What a failed settlement was refused for, told by its SQLSTATE (``x_jobs._refusal``): only a
refusal of a value may fail a job for its output; any other error sends the settlement again and
never changes the outcome.

The worker took every error of a settlement but a lost connection for a refusal of its output:
a read-only transaction during a failover, a pooler's "prepared statement does not exist", a
deadlock, all settled jobs that had succeeded as dead ("its output was refused: ...").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import poolers
from apps.workers import Fleet
from conftest import Conn, Connect
from psycopg import sql
from psycopg.types.json import Jsonb

from x_jobs._refusal import refuses_value

logger = logging.getLogger(__name__)


def _raised(action: Callable[[], Any]) -> BaseException:
    try:
        action()
    except Exception as err:
        return err
    pytest.fail("the call succeeded")


def _raise(state: str) -> Callable[[Conn], Any]:
    """A call that the server fails with SQLSTATE ``state`` (what a failover, a deadlock, a
    pooler or an exhausted server answer, raised here on purpose)."""
    return lambda conn: conn.execute(
        sql.SQL(
            "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = {}, MESSAGE = 'on purpose'; END $$"
        ).format(sql.Literal(state))
    )


def _closed(conn: Conn) -> Conn:
    conn.close()
    return conn


VALUES: dict[str, Callable[[Conn], Any]] = {
    # x_jobs refuses an argument: a payload past x_jobs.max_payload_bytes (XJ003).
    "XJ003 payload too large": lambda conn: conn.execute(
        "SELECT set_config('x_jobs.max_payload_bytes', '100', false),"
        " x_jobs.enqueue(name => 'big', input => %s)",
        [Jsonb({"pad": "x" * 500})],
    ),
    "XJ039 a retry_at past 9999": lambda conn: conn.execute(
        "SELECT x_jobs.outbox_nack(id => 1, relay => 'r', error => 'e',"
        " retry_at => 'infinity', retryable => true)"
    ),
    "22P02 NaN in jsonb": lambda conn: conn.execute(
        "SELECT %s::jsonb", [Jsonb({"n": float("nan")})]
    ),
    "22P05 \\u0000 in jsonb": lambda conn: conn.execute("SELECT %s::jsonb", [Jsonb({"s": "\x00"})]),
    "54000 program_limit_exceeded": lambda conn: conn.execute(
        "SELECT length(repeat('x', 1024 * 1024 * 1024 + 1))"
    ),
    "a NUL in text (psycopg)": lambda conn: conn.execute("SELECT %s::text", ["a\x00b"]),
    "a type psycopg cannot adapt": lambda conn: conn.execute("SELECT %s", [object()]),
    "a value json cannot write": lambda conn: conn.execute("SELECT %s", [Jsonb(object())]),
}

NOT_VALUES: dict[str, Callable[[Conn], Any]] = {
    "26000 prepared statement does not exist": lambda conn: conn.execute("EXECUTE _pg3_1"),
    "42P05 prepared statement already exists": lambda conn: [
        conn.execute("PREPARE twice AS SELECT 1") for _ in range(2)
    ],
    "25006 read-only transaction": lambda conn: [
        conn.execute("SET default_transaction_read_only = on"),
        conn.execute("SELECT x_jobs.complete_many(ids => '{1}', worker => 'w')"),
    ],
    "57014 statement timeout": lambda conn: conn.execute(
        "SET statement_timeout = '10ms'; SELECT pg_sleep(1)"
    ),
    "XJ040 a setting, not an argument": lambda conn: conn.execute(
        "SELECT set_config('x_jobs.max_payload_bytes', 'lots', false),"
        " x_jobs.enqueue(name => 'n', input => '{}')"
    ),
    "42501 insufficient privilege": lambda conn: conn.execute(
        "SET ROLE x_jobs_producer; SELECT x_jobs.extend_lease(ids => '{1}', worker => 'w')"
    ),
    "a closed connection": lambda conn: _closed(conn).execute("SELECT 1"),
    **{f"{state} raised": _raise(state) for state in ("08P01", "40001", "40P01", "53300", "XX000")},
}


@pytest.mark.parametrize("case", VALUES)
def test_a_refusal_of_a_value_is_one(case: str, connect: Connect) -> None:
    err = _raised(lambda: VALUES[case](connect()))
    assert refuses_value(err), repr(err)


@pytest.mark.parametrize("case", NOT_VALUES)
def test_an_error_of_the_way_or_the_session_is_no_refusal_of_a_value(
    case: str, connect: Connect
) -> None:
    err = _raised(lambda: NOT_VALUES[case](connect()))
    assert isinstance(err, psycopg.Error), repr(err)
    assert not refuses_value(err), repr(err)


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def test_a_read_only_settler_session_is_retried_and_the_job_completes(
    fleet: Fleet, conn: Conn
) -> None:
    """A failover's read-only transaction (25006) refused the settlement of a job that had
    succeeded: the worker took it for a refusal of the output and buried the job as dead. It
    retries on a new connection until the database takes writes again; the job is done, once."""
    database = sql.Identifier(fleet.dbname)
    worker = fleet.start(target="apps.poolers:app", concurrency=1, lease=5)
    job_id = poolers.app.enqueue(poolers.gated_echo, {"gate": "ro"}, conn=conn).id
    fleet.wait_for(lambda: any(r.job_id == job_id for r in fleet.runs()), "the job to start")
    try:
        # Sessions from now on are read-only: the settler's (it connects for its first batch),
        # not the dispatcher's, nor the handler's own, which predate it.
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(database)
        )
        fleet.open_gate("ro")
        fleet.wait_for(
            lambda: worker.log().count("settling failed, not for its values; retrying") >= 2,
            "the settlement to be refused, and tried again",
        )
        assert fleet.states([job_id]) == {job_id: "running"}
    finally:
        conn.execute(
            sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(database)
        )
    fleet.wait_for(lambda: fleet.all_in([job_id], "done", "dead", "failed"), "the job to settle")

    row = conn.execute(
        "SELECT state::text, attempt, output, last_error FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    assert row == ("done", 1, {"gate": "ro"}, None), worker.log()
    assert [(r.attempt, r.outcome) for r in fleet.runs()] == [(1, "returned")]
    assert worker.alive(), worker.log()
