"""How x-jobs ends on an error (a review's findings): the worker's start-up refusals, a relay
whose login lacks x_jobs_worker, the password of a DSN in error messages and in the "next page"
line, one rule for exit codes with a code for every error in --json, an input jsonb cannot
store, the time of a log line, --input from a file or stdin."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Conn
from test_permission_denied import login
from typer.testing import CliRunner, Result

import x_jobs
from x_jobs import errors
from x_jobs._conn import connect as client_connect
from x_jobs._conn import redact
from x_jobs.cli import JsonLogFormatter, TextLogFormatter, cli

TESTS = Path(__file__).resolve().parent
runner = CliRunner(env={"COLUMNS": None})
SECRET = "s3cret"


def x_jobs_cli(
    *args: str, env: Mapping[str, str | None] | None = None, input: str | None = None
) -> Result:
    return runner.invoke(cli, list(args), env=env, input=input)


def process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m x_jobs ARGS`` with tests/python importable (the apps.* modules), ahead of
    whatever PYTHONPATH names (the checkout's package under test)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "300"  # click's error box folds nothing
    return subprocess.run(
        [sys.executable, "-m", "x_jobs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=TESTS,
        env=env,
    )


def ends_with_line_and_hint(proc: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The process exited ``exit_code`` without a traceback, its stderr ending with the error
    line and its hint; the error line."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == exit_code, output
    assert "Traceback" not in output, output
    *_, line, hint = proc.stderr.splitlines()
    assert line.startswith("x-jobs: "), output
    assert hint.startswith("hint: "), output
    return line


def json_logs(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def error_doc(result: Result, exit_code: int) -> dict[str, Any]:
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    doc: dict[str, Any] = json.loads(result.stdout)["error"]
    return doc


# --- 1. the worker's start-up errors ----------------------------------------------------------


def test_a_worker_given_an_empty_queue_exits_2_with_x_queues_invalid(dsn: str, conn: Conn) -> None:
    """It ended in psycopg's InternalError and its traceback (exit 1)."""
    proc = process("worker", "apps.basic:app", "--queue", "", "--dsn", dsn)
    line = ends_with_line_and_hint(proc, 2)
    assert line.startswith("x-jobs: X_QUEUES_INVALID: "), line
    proc = process("worker", "apps.basic:app", "--queue", "", "--log-format", "json", "--dsn", dsn)
    ends_with_line_and_hint(proc, 2)
    last = json_logs(proc.stderr)[-1]
    assert last["level"] == "error"
    assert last["code"] == "X_QUEUES_INVALID"
    assert last["sqlstate"] == "XJ010"
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_a_worker_of_an_app_without_jobs_and_no_queue_is_a_usage_error(dsn: str) -> None:
    """It ended in "ValueError: the worker has no queue to serve" and its traceback."""
    proc = process("worker", "apps.empty:app", "--dsn", dsn)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert "the worker has no queue to serve" in proc.stderr
    assert "--queue" in proc.stderr
    proc = process("worker", "apps.empty:app", "--log-format", "json", "--dsn", dsn)
    assert proc.returncode == 2, proc.stderr
    assert json_logs(proc.stderr)[-1]["code"] == "X_USAGE"


def test_an_embedded_worker_given_an_empty_queue_raises_queues_invalid(dsn: str) -> None:
    app = x_jobs.App(dsn)
    try:
        with pytest.raises(errors.QueuesInvalid) as refused:
            x_jobs.Worker(app, queues=[""]).run(install_signals=False)
    finally:
        app.close()
    assert refused.value.sqlstate == "XJ010"
    assert refused.value.message.startswith("X_QUEUES_INVALID: ")
    assert isinstance(refused.value.__cause__, psycopg.Error)


# --- 2. a relay whose login lacks x_jobs_worker ------------------------------------------------


def test_a_relay_whose_login_lacks_x_jobs_worker_exits_2_as_the_worker_does(
    admin: Conn, dsn: str
) -> None:
    """It logged "claiming was refused; retrying" forever (here: until the timeout)."""
    with login(admin, "x_jobs_producer") as role:
        as_producer = f"{dsn} user={role}"
        relay = process("relay", "apps.relays:app", "--dsn", as_producer, timeout=30)
        worker = process("worker", "apps.basic:app", "--dsn", as_producer, timeout=30)
    relay_line = ends_with_line_and_hint(relay, 2)
    worker_line = ends_with_line_and_hint(worker, 2)
    assert relay_line.startswith("x-jobs: X_PERMISSION_DENIED: permission denied for function ")
    assert worker_line.startswith("x-jobs: X_PERMISSION_DENIED: permission denied for function ")
    assert relay.stderr.splitlines()[-1] == worker.stderr.splitlines()[-1]  # the same hint
    assert "retrying" not in relay.stderr


# --- 3. a DSN's password ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ('in URI: "postgresql://u:s3cret@[bad/db"', 'in URI: "postgresql://u:***@[bad/db"'),
        ("postgres://u:s3c@ret@host/db", "postgres://u:***@host/db"),
        ("postgresql://u@host/db?sslmode=off&password=s3cret", None),
        ("host=h password=s3cret user=u", "host=h password=*** user=u"),
        ("host=h password = 's3 \\' cret' user=u", "host=h password = *** user=u"),
        ("PASSWORD=s3cret", "PASSWORD=***"),
        ("postgresql://u@host/db host=h user=u", "postgresql://u@host/db host=h user=u"),
    ],
)
def test_redact_hides_the_password_of_every_dsn_form(text: str, redacted: str | None) -> None:
    assert SECRET not in redact(text)
    if redacted is not None:
        assert redact(text) == redacted


BAD_URI = f"postgresql://u:{SECRET}@[bad/db"


def test_a_connection_error_never_prints_the_password() -> None:
    """libpq quotes the whole URI in this error: the command printed it, password and all."""
    for args, env in [
        (["queues", "--dsn", BAD_URI], None),
        (["queues", "--json", "--dsn", BAD_URI], None),
        (["jobs", "list", "--json"], {"DATABASE_URL": BAD_URI}),
    ]:
        result = x_jobs_cli(*args, env=env)
        assert result.exit_code == 2, result.output
        assert SECRET not in result.stdout + result.stderr
        assert "X_CONNECT_FAILED" in result.stderr
        assert "postgresql://u:***@[bad/db" in result.stderr
        if "--json" in args:
            error = json.loads(result.stdout)["error"]
            assert error["code"] == "X_CONNECT_FAILED"
            assert SECRET not in error["message"]


@pytest.mark.parametrize("command", [["worker", "apps.basic:app"], ["relay", "apps.relays:app"]])
def test_a_worker_or_relay_that_cannot_connect_never_prints_the_password(
    command: list[str],
) -> None:
    proc = process(*command, "--dsn", BAD_URI, "--log-format", "json")
    line = ends_with_line_and_hint(proc, 2)
    assert line.startswith("x-jobs: X_CONNECT_FAILED: "), line
    assert SECRET not in proc.stdout + proc.stderr
    assert json_logs(proc.stderr)[-1]["code"] == "X_CONNECT_FAILED"


def test_the_clients_connections_fail_without_the_password() -> None:
    """What the worker, the relay and the App connect with: its error, and the error it was
    raised from, quote the URI with the password hidden."""
    with pytest.raises(psycopg.Error) as failed:
        client_connect(BAD_URI, "x_jobs test")
    assert "postgresql://u:***@[bad/db" in str(failed.value)
    assert SECRET not in str(failed.value)
    assert SECRET not in str(failed.value.__context__)


# --- 4. the next page line keeps --dsn --------------------------------------------------------


def next_page(output: str) -> list[str]:
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("next page: "))
    return lines[at:]


def test_the_next_page_line_keeps_the_dsn_given(dsn: str, conn: Conn) -> None:
    for n in range(3):
        conn.execute("SELECT x_jobs.enqueue(name => %s, input => '{}')", [f"job{n}"])
        conn.execute("SELECT x_jobs.outbox_put(topic => 't', payload => '{}')")
    for command in (["jobs", "list"], ["outbox", "list"]):
        result = x_jobs_cli(*command, "--limit", "1", "--dsn", dsn)
        assert result.exit_code == 0, result.output
        line, *notes = next_page(result.stdout)
        assert line.startswith(f"next page: x-jobs {' '.join(command)} --limit 1 --before ")
        assert "--dsn" in line
        assert not notes
        # The line is the command: run as it says, it lists the next page.
        again = x_jobs_cli(*shlex.split(line.removeprefix("next page: "))[1:])
        assert again.exit_code == 0, again.output


def test_the_next_page_line_hides_a_password_in_the_dsn(dsn: str, conn: Conn) -> None:
    for n in range(2):
        conn.execute("SELECT x_jobs.enqueue(name => %s, input => '{}')", [f"job{n}"])
    result = x_jobs_cli("jobs", "list", "--limit", "1", "--dsn", f"{dsn} password={SECRET}")
    assert result.exit_code == 0, result.output
    assert SECRET not in result.stdout
    line, note = next_page(result.stdout)
    assert "password=***" in line
    assert "password in --dsn is shown as ***" in note


# --- 5. exit codes and a code for every error -------------------------------------------------


def test_permission_denied_exits_2_from_every_command(admin: Conn, dsn: str) -> None:
    with login(admin, "x_jobs_worker") as role:
        result = x_jobs_cli("jobs", "list", "--json", "--dsn", f"{dsn} user={role}")
    error = error_doc(result, 2)
    assert error["code"] == "X_PERMISSION_DENIED"
    assert error["sqlstate"] == "42501"


def test_a_read_only_transaction_is_x_database_error_with_its_sqlstate(
    dsn: str, conn: Conn
) -> None:
    read_only = f"{dsn} options='-c default_transaction_read_only=on'"
    result = x_jobs_cli("enqueue", "ping", "--input", "{}", "--json", "--dsn", read_only)
    error = error_doc(result, 1)
    assert error["code"] == "X_DATABASE_ERROR"
    assert error["sqlstate"] == "25006"
    assert error["message"].startswith("X_DATABASE_ERROR: ")
    assert result.stderr.startswith("x-jobs: X_DATABASE_ERROR: ")


def test_a_statement_timeout_is_x_database_error_with_its_sqlstate(dsn: str, connect: Any) -> None:
    locker = connect(autocommit=False)
    locker.execute("LOCK TABLE x_jobs.job IN ACCESS EXCLUSIVE MODE")
    try:
        timing_out = f"{dsn} options='-c statement_timeout=200'"
        result = x_jobs_cli("jobs", "list", "--json", "--dsn", timing_out)
    finally:
        locker.rollback()
    error = error_doc(result, 1)
    assert error["code"] == "X_DATABASE_ERROR"
    assert error["sqlstate"] == "57014"


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "ping", "--input", '{"note": "a\\u0000b"}'],
        ["enqueue", "ping", "--input", '{"a\\u0000": 1}'],
        ["enqueue", "ping", "--input", '["\\ud800"]'],
        ["enqueue", "ping", "--input", "[" * 5000 + '"\\u0000"' + "]" * 5000],
        ["events", "publish", "order.paid", "--payload", '"\\u0000"'],
        ["steps", "resolve", "1", "nap", "--output", '{"x": "\\u0000"}'],
    ],
)
def test_an_input_jsonb_cannot_store_is_a_usage_error_before_sending(
    dsn: str, conn: Conn, args: list[str]
) -> None:
    """A NUL reached the database: "unsupported Unicode escape sequence", code null, exit 1."""
    error = error_doc(x_jobs_cli(*args, "--json", "--dsn", dsn), 2)
    assert error["code"] == "X_USAGE"
    assert "PostgreSQL cannot store" in error["message"]
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM x_jobs.event").fetchone() == (0,)


def test_an_escaped_backslash_before_u0000_is_no_nul(dsn: str, conn: Conn) -> None:
    text = "[" * 5000 + '"\\\\u0000"' + "]" * 5000  # a backslash, then the text u0000
    result = x_jobs_cli("enqueue", "ping", "--input", text, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.output


# --- 6. the time of a log line ----------------------------------------------------------------


def a_record() -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "x_jobs.worker", "levelname": "INFO", "msg": "hi"})
    record.created = 1796066810.123456  # 2026-11-30T19:26:50.123456Z
    record.msecs = 123.456
    return record


def test_json_log_lines_write_utc_with_milliseconds_and_z(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        entry = json.loads(JsonLogFormatter().format(a_record()))
        text = TextLogFormatter().format(a_record())
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert entry["ts"] == "2026-11-30T19:26:50.123Z"
    assert text.startswith("2026-11-30T19:26:50.123Z INFO x_jobs.worker: hi")


# --- minor: --input from a file or stdin ------------------------------------------------------


def test_input_reads_a_file_or_stdin(dsn: str, conn: Conn, tmp_path: Path) -> None:
    big = {"blob": "x" * 300_000}  # past what one argument of the command line can hold
    path = tmp_path / "input.json"
    path.write_text(json.dumps(big))
    result = x_jobs_cli("enqueue", "big", "--input", f"@{path}", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["id"]
    assert conn.execute("SELECT input FROM x_jobs.job WHERE id = %s", [job_id]).fetchone() == (big,)
    result = x_jobs_cli(
        "enqueue", "piped", "--input", "-", "--json", "--dsn", dsn, input='{"n": 1}'
    )
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["id"]
    assert conn.execute("SELECT input FROM x_jobs.job WHERE id = %s", [job_id]).fetchone() == (
        {"n": 1},
    )
    missing = x_jobs_cli("enqueue", "x", "--input", f"@{tmp_path / 'nope.json'}", "--json")
    assert error_doc(missing, 2)["code"] == "X_USAGE"


@pytest.mark.parametrize("command", [["jobs", "list"], ["outbox", "list"]])
def test_limit_help_shows_the_page_sizes_taken(command: list[str]) -> None:
    """It showed [-2147483648<=x<=2147483647] beside "1 to 1000"."""
    result = x_jobs_cli(*command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stdout.splitlines() if "--limit" in line]
    assert "1<=x<=1000" in line
    assert "2147483647" not in line
