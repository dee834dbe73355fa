"""A login without the x_jobs role a call needs gets ``x_jobs.PermissionDenied``
(X_PERMISSION_DENIED, SQLSTATE 42501 kept, the database's InsufficientPrivilege as its cause):
from the App, and as one line and a hint from every command, the worker's too. The worker ended
in a raw traceback, the App raised psycopg's error, and --json printed code null."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Conn
from psycopg import sql
from typer.testing import CliRunner

import x_jobs
from x_jobs.cli import cli

TESTS = Path(__file__).resolve().parent


@contextmanager
def login(admin: Conn, *roles: str) -> Iterator[str]:
    """A LOGIN role that is a member of ``roles`` only (none: of no x_jobs role); its name."""
    role = f"x_jobs_test_login_{uuid.uuid4().hex[:8]}"
    member_of = sql.SQL(" IN ROLE {}").format(sql.SQL(", ").join(map(sql.Identifier, roles)))
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN{}").format(
            sql.Identifier(role), member_of if roles else sql.SQL("")
        )
    )
    try:
        yield role
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def greeting_app(dsn: str) -> x_jobs.App:
    """An App of one job, "greet", that does nothing."""
    app = x_jobs.App(dsn)

    @app.job(name="greet")
    def greet(input: dict[str, Any]) -> None: ...

    return app


def test_a_worker_run_by_a_producer_login_says_which_role_it_lacks(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    with login(admin, "x_jobs_producer") as role:
        as_producer = f"{dsn} user={role}"
        proc = subprocess.run(
            [sys.executable, "-m", "x_jobs", "worker", "apps.basic:app", "--dsn", as_producer],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=TESTS,
            # The checkout's package under test (PYTHONPATH) stays importable after the apps.
            env=dict(
                os.environ,
                PYTHONPATH=os.pathsep.join(
                    filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])
                ),
            ),
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "Traceback" not in output, output
    *_, line, hint = proc.stderr.splitlines()
    assert line.startswith("x-jobs: X_PERMISSION_DENIED: permission denied for "), output
    assert hint.startswith("hint: ") and "x_jobs_worker" in hint, output
    # Refused before it claimed anything, so it never announced itself either.
    assert conn.execute("SELECT count(*) FROM x_jobs.worker").fetchone() == (0,)


def test_enqueue_by_a_login_of_no_x_jobs_role_raises_permission_denied(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    with login(admin) as role:
        app = greeting_app(f"{dsn} user={role}")
        try:
            with pytest.raises(x_jobs.PermissionDenied) as refused:
                app.enqueue("greet", {"who": "ada"})
        finally:
            app.close()
    err = refused.value
    assert isinstance(err, x_jobs.XJobsError)
    assert err.code == "X_PERMISSION_DENIED"
    assert err.message.startswith("X_PERMISSION_DENIED: permission denied for ")
    assert err.sqlstate == "42501"
    assert isinstance(err.__cause__, psycopg.errors.InsufficientPrivilege)
    assert err.hint is not None and "x_jobs_producer" in err.hint
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_an_embedded_worker_of_a_login_of_no_x_jobs_role_raises_permission_denied(
    admin: Conn, dsn: str
) -> None:
    """Refused at its first query, the version check, before its loop: that query raised the
    driver's error, past the loop's translation."""
    with login(admin) as role:
        app = greeting_app(f"{dsn} user={role}")
        try:
            with pytest.raises(x_jobs.PermissionDenied) as refused:
                x_jobs.Worker(app).run(install_signals=False)
        finally:
            app.close()
    assert refused.value.sqlstate == "42501"
    assert isinstance(refused.value.__cause__, psycopg.errors.InsufficientPrivilege)


def test_jobs_list_json_by_a_worker_login_prints_the_code(admin: Conn, dsn: str) -> None:
    with login(admin, "x_jobs_worker") as role:
        result = CliRunner().invoke(cli, ["jobs", "list", "--json", "--dsn", f"{dsn} user={role}"])
    assert result.exit_code == 2, result.output  # the login's setup, as the worker's
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "X_PERMISSION_DENIED"
    assert error["sqlstate"] == "42501"
    assert error["message"].startswith("X_PERMISSION_DENIED: permission denied for ")
    assert "x_jobs_admin" in error["hint"]
