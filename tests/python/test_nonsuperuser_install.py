"""Installs by a database owner who is not a superuser (issue 19), on a server of the test's own
where the x_jobs roles do not exist yet: roles belong to the whole server, so the shared test
server, which has them, cannot show what a first install on a fresh server does.

* ``CREATE EXTENSION x_jobs`` by an owner without CREATEROLE works (the extension is trusted
  for real: its scripts run as the bootstrap superuser), in a second database of the same
  server by another such owner too; each owner grants the roles to its app logins, which
  enqueue, claim and settle; the objects belong to x_jobs_owner, which may read the WAL
  writer's start (the restart grace), and ``x_jobs.health()`` says so.
* ``ALTER EXTENSION x_jobs UPDATE`` from 0.3.9 by such an owner works the same way.
* ``x-jobs install`` by such an owner where extensions are barred: refused with exactly the
  statements an administrator runs first, nothing changed; it works once they were run, and a
  missing pg_read_all_stats shows in what it prints, in ``x_jobs.health()`` and in the log of a
  worker that starts there.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Conn, wait_for
from psycopg import sql
from psycopg.conninfo import make_conninfo
from test_cli import failed, one_line_and_hint, succeeded, x_jobs

import x_jobs as xj
from x_jobs import install

logger = logging.getLogger(__name__)

NEWEST = install.read_control(install.bundled_scripts()).default_version
ROLES = ("x_jobs_producer", "x_jobs_worker", "x_jobs_admin")


def _bindir() -> Path:
    """The server's programs (Debian's client-side pg_config points at /usr/bin wrappers)."""
    found = subprocess.run(
        ["pg_config", "--bindir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if (Path(found) / "initdb").exists():
        return Path(found)
    version = subprocess.run(
        ["pg_config", "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    return Path(f"/usr/lib/postgresql/{version.split('.')[0]}/bin")


@dataclass(frozen=True)
class Server:
    """A server of the test's own: its socket directory and its superuser."""

    host: str
    superuser: str

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        return make_conninfo(
            "", host=self.host, port="5432", dbname=dbname, user=user or self.superuser
        )

    def connect(self, dbname: str = "postgres", user: str | None = None) -> Conn:
        return psycopg.connect(self.dsn(dbname, user), autocommit=True)


@contextmanager
def fresh_server(stage: str) -> Iterator[Server]:
    """A new cluster (initdb) on a Unix socket of its own that finds this checkout's x_jobs
    where the shared test server does (``extension_destdir``); stopped and removed after."""
    tmp = tempfile.mkdtemp(prefix="xjns.", dir="/tmp")  # a socket path stays short
    os.chmod(tmp, 0o755)
    data = Path(tmp) / "data"
    data.mkdir()
    if os.geteuid() == 0:  # initdb and pg_ctl refuse root: run them as postgres
        owner, as_owner = "postgres", ["runuser", "-u", "postgres", "--"]
        shutil.chown(tmp, owner)
        shutil.chown(data, owner)
    else:
        owner, as_owner = getpass.getuser(), []
    bindir = _bindir()

    def run(*command: str) -> None:
        done = subprocess.run(
            [*as_owner, *command], cwd="/", capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr

    run(str(bindir / "initdb"), "--no-sync", "-A", "trust", "-U", owner, "-D", str(data))
    with open(data / "postgresql.conf", "a") as conf:
        conf.write(
            f"listen_addresses = ''\nunix_socket_directories = '{tmp}'\n"
            "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            "max_connections = 40\n"
        )
        if stage:
            conf.write(f"extension_destdir = '{stage}'\n")
    pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-l", f"{tmp}/server.log", "-w"]
    run(*pg_ctl, "start")
    try:
        yield Server(host=tmp, superuser=owner)
    finally:
        subprocess.run(
            [*as_owner, *pg_ctl, "-m", "immediate", "stop"],
            cwd="/",
            capture_output=True,
            check=False,
        )
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def server(admin: Conn) -> Iterator[Server]:
    row = admin.execute("SHOW extension_destdir").fetchone()
    with fresh_server(str(row[0]) if row else "") as made:
        yield made


def owner_of(server: Server, role: str, database: str) -> None:
    """A login that owns ``database`` and may not create roles (nor is a superuser)."""
    with server.connect() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        su.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(role)
            )
        )


def logins(server: Server, *roles: str) -> None:
    """App logins, which a role administrator makes (the owners cannot)."""
    with server.connect() as su:
        for role in roles:
            su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))


def roles_present(server: Server) -> list[str]:
    with server.connect() as su:
        rows = su.execute(
            "SELECT rolname FROM pg_catalog.pg_roles WHERE rolname LIKE 'x\\_jobs\\_%'"
            " ORDER BY rolname"
        ).fetchall()
    return [str(name) for (name,) in rows]


def health(conn: Conn) -> dict[str, tuple[bool, str, str | None]]:
    rows = conn.execute("SELECT check_name, ok, detail, hint FROM x_jobs.health()").fetchall()
    return {str(name): (bool(ok), str(detail), hint) for name, ok, detail, hint in rows}


def owners(conn: Conn) -> set[str]:
    """Who owns the objects of schema x_jobs (functions, relations, types, the schema)."""
    rows = conn.execute(
        """
        SELECT pg_catalog.pg_get_userbyid(p.proowner) FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = 'x_jobs'::regnamespace
        UNION SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = 'x_jobs'::regnamespace
        UNION SELECT pg_catalog.pg_get_userbyid(t.typowner) FROM pg_catalog.pg_type AS t
        WHERE t.typnamespace = 'x_jobs'::regnamespace
        UNION SELECT pg_catalog.pg_get_userbyid(n.nspowner) FROM pg_catalog.pg_namespace AS n
        WHERE n.nspname = 'x_jobs'
        """
    ).fetchall()
    return {str(name) for (name,) in rows}


def enqueue_claim_complete(server: Server, database: str, producer: str, worker: str) -> None:
    """The app logins at work through the SQL API: one job enqueued, claimed and completed."""
    with server.connect(database, producer) as web:
        row = web.execute("SELECT id FROM x_jobs.enqueue(name => 'mail')").fetchone()
        assert row is not None
        job_id = row[0]
        # A producer holds no right on the jobs table: only what enqueue and result give it.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            web.execute("SELECT count(*) FROM x_jobs.job")
    with server.connect(database, worker) as runner:
        claimed = runner.execute(
            "SELECT id FROM x_jobs.claim(queues => ARRAY['default'], worker => 'w1')"
        ).fetchall()
        assert claimed == [(job_id,)]
        assert runner.execute("SELECT x_jobs.complete(%s, 'w1')", [job_id]).fetchone() == (True,)
    with server.connect(database, producer) as web:
        state = web.execute("SELECT state FROM x_jobs.result(%s)", [job_id]).fetchone()
        assert state is not None and str(state[0]) == "done"


def test_a_database_owner_creates_the_extension_in_two_databases(server: Server) -> None:
    owner_of(server, "shop_owner", "shop")
    owner_of(server, "blog_owner", "blog")
    logins(server, "shop_web", "shop_runner", "blog_web", "blog_runner")
    assert roles_present(server) == []

    with server.connect("shop", "shop_owner") as owner:
        owner.execute("CREATE EXTENSION x_jobs")
        # The owner can grant the roles to its logins, without CREATEROLE.
        owner.execute("GRANT x_jobs_producer TO shop_web")
        owner.execute("GRANT x_jobs_worker TO shop_runner")
        assert owner.execute(
            "SELECT extversion, pg_catalog.pg_get_userbyid(extowner) FROM pg_catalog.pg_extension"
            " WHERE extname = 'x_jobs'"
        ).fetchone() == (NEWEST, "shop_owner")
        assert owners(owner) == {"x_jobs_owner"}
        # What it may grant is the four roles, not x_jobs_owner, and it became no superuser.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            owner.execute("GRANT x_jobs_owner TO shop_web")
    assert roles_present(server) == [
        "x_jobs_admin",
        "x_jobs_owner",
        "x_jobs_producer",
        "x_jobs_webhook",
        "x_jobs_worker",
    ]
    enqueue_claim_complete(server, "shop", "shop_web", "shop_runner")

    # A second database of the same server: the roles exist already, and are used as they are.
    with server.connect("blog", "blog_owner") as owner:
        owner.execute("CREATE EXTENSION x_jobs")
        owner.execute("GRANT x_jobs_producer TO blog_web")
        owner.execute("GRANT x_jobs_worker TO blog_runner")
        assert owners(owner) == {"x_jobs_owner"}
    enqueue_claim_complete(server, "blog", "blog_web", "blog_runner")

    # Every check holds, the restart grace's among them: claim runs as x_jobs_owner, which may
    # read the WAL writer's start, and does see it.
    for database, runner in (("shop", "shop_runner"), ("blog", "blog_runner")):
        with server.connect(database, runner) as conn:
            checks = health(conn)
            assert all(ok for ok, _, _ in checks.values()), checks
            assert checks["restart_grace"][1].startswith("claim runs as x_jobs_owner, which may")
    with server.connect("shop") as su:
        su.execute("SET ROLE x_jobs_owner")
        seen = su.execute(
            "SELECT x_jobs._ready_since() > pg_catalog.pg_postmaster_start_time(),"
            " count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
        assert seen is not None and seen[1] == 1, "x_jobs_owner does not see the WAL writer"

    # The owner drops what it made; the roles stay for the other database.
    with server.connect("shop", "shop_owner") as owner:
        owner.execute("DROP EXTENSION x_jobs")
        assert owner.execute("SELECT pg_catalog.to_regnamespace('x_jobs')").fetchone() == (None,)


def test_an_owner_updates_its_extension_from_0_3_9(server: Server) -> None:
    owner_of(server, "shop_owner", "shop")
    logins(server, "shop_web", "shop_runner")
    # 0.3.9 as it was released (x_jobs--0.3.9.control: not trusted, its script runs as the
    # caller): an owner without CREATEROLE installed it on roles an administrator made first.
    with server.connect() as su:
        su.execute("CREATE ROLE x_jobs_producer NOLOGIN")
        su.execute("CREATE ROLE x_jobs_worker NOLOGIN IN ROLE x_jobs_producer")
        su.execute("CREATE ROLE x_jobs_admin NOLOGIN IN ROLE x_jobs_worker")
    with server.connect("shop", "shop_owner") as owner:
        owner.execute("CREATE EXTENSION x_jobs VERSION '0.3.9'")
        assert owners(owner) == {"shop_owner"}
        # 0.3.9 gave its installer no say over the roles.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            owner.execute("GRANT x_jobs_producer TO shop_web")
    with server.connect("shop") as su:
        old = su.execute("SELECT id FROM x_jobs.enqueue(name => 'before')").fetchone()
        assert old is not None
    with server.connect("shop", "shop_owner") as owner:
        owner.execute("ALTER EXTENSION x_jobs UPDATE")
        assert owner.execute("SELECT x_jobs.version()").fetchone() == (NEWEST,)
        assert owners(owner) == {"x_jobs_owner"}
        owner.execute("GRANT x_jobs_producer TO shop_web")
        owner.execute("GRANT x_jobs_worker TO shop_runner")
    with server.connect("shop", "shop_runner") as runner:
        checks = health(runner)
        assert all(ok for ok, _, _ in checks.values()), checks
        # The job from before the update is served after it.
        claimed = runner.execute(
            "SELECT id FROM x_jobs.claim(queues => ARRAY['default'], worker => 'w1')"
        ).fetchall()
        assert claimed == [(old[0],)]
    enqueue_claim_complete(server, "shop", "shop_web", "shop_runner")


def test_x_jobs_install_by_an_owner_names_what_an_administrator_runs_first(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Where extensions are barred, ``x-jobs install`` runs the scripts as the caller. An owner
    without CREATEROLE on a server without the roles is refused, nothing changed, with the
    statements to run (its name quoted where it must be); they suffice."""
    owner = "Shop Owner"  # a name that must be quoted in the statements
    owner_of(server, owner, "shop")
    logins(server, "shop_runner")
    dsn = server.dsn("shop", owner)

    refused = failed(x_jobs("install", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(refused)
    assert (
        line == 'x-jobs: X_ROLES_MISSING: role "Shop Owner" may not create or link the x_jobs roles'
    )
    statements = [
        "CREATE ROLE x_jobs_producer NOLOGIN",
        "CREATE ROLE x_jobs_worker NOLOGIN",
        "CREATE ROLE x_jobs_admin NOLOGIN",
        "CREATE ROLE x_jobs_webhook NOLOGIN",
        "GRANT x_jobs_producer TO x_jobs_worker",
        "GRANT x_jobs_worker TO x_jobs_admin",
        'GRANT x_jobs_producer, x_jobs_worker, x_jobs_admin, x_jobs_webhook TO "Shop Owner"'
        " WITH ADMIN OPTION",
        'GRANT pg_read_all_stats TO "Shop Owner"',
    ]
    assert (
        hint == f"hint: An administrator runs first: {'; '.join(statements)}; then install again."
    )
    error = json.loads(failed(x_jobs("install", "--json", "--dsn", dsn), 1).stdout)["error"]
    assert (error["code"], error["sqlstate"]) == ("X_ROLES_MISSING", "XJ042")
    # Nothing changed: no schema, no role.
    with server.connect("shop") as su:
        assert su.execute("SELECT pg_catalog.to_regnamespace('x_jobs')").fetchone() == (None,)
    assert roles_present(server) == []

    # The administrator runs them, all but the right to read other sessions' start times.
    with server.connect() as su:
        for statement in statements[:-1]:
            su.execute(statement.encode())

    done = succeeded(x_jobs("install", "--dsn", dsn))
    # Printed after the outcome (the console wraps long lines: compared as words).
    said = " ".join(done.stdout.split())
    assert said.startswith(
        f"installed x_jobs {NEWEST} ({install.full_script(NEWEST)}) warning: restart_grace: "
    )
    assert said.endswith('hint: An administrator runs: GRANT pg_read_all_stats TO "Shop Owner";')
    again = json.loads(succeeded(x_jobs("install", "--json", "--dsn", dsn)).stdout)
    assert again["changed"] is False
    (failing,) = again["failing"]
    assert failing["check"] == "restart_grace"
    assert failing["detail"].startswith(
        'claim runs as "Shop Owner", which may not read other sessions\' start times'
    )
    assert failing["hint"] == 'An administrator runs: GRANT pg_read_all_stats TO "Shop Owner";'

    with server.connect("shop", owner) as conn:
        # The scripts ran as the caller: what they made is its own, no x_jobs_owner was made.
        assert owners(conn) == {owner}
        assert "x_jobs_owner" not in roles_present(server)
        checks = health(conn)
        assert [name for name, (ok, _, _) in checks.items() if not ok] == ["restart_grace"]
        assert (
            checks["version"][1] == f"x_jobs {NEWEST}, installed by x-jobs install (no extension)"
        )
        # Claim's restart grace cannot see the WAL writer: the postmaster's start stands in.
        assert conn.execute(
            "SELECT x_jobs._ready_since() = pg_catalog.pg_postmaster_start_time()"
        ).fetchone() == (True,)
        conn.execute("GRANT x_jobs_worker TO shop_runner")

    # A worker that starts there says so once, in its log.
    app = xj.App(server.dsn("shop", "shop_runner"))
    done_jobs: list[Any] = []

    @app.job(name="noop")
    def noop(input: dict[str, Any]) -> dict[str, bool]:
        done_jobs.append(input)
        return {"ok": True}

    caplog.set_level(logging.WARNING, logger="x_jobs.worker")
    worker = xj.Worker(app, concurrency=1, poll_interval=0.05, grace=1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        noop.enqueue({"n": 1})
        wait_for(lambda: bool(done_jobs), "the worker to run a job")
    finally:
        worker.stop()
        thread.join(timeout=30)
        app.close()
    warned = [r for r in caplog.records if r.getMessage().startswith("x_jobs.health() ")]
    assert [getattr(r, "check", None) for r in warned] == ["restart_grace"]
    assert getattr(warned[0], "hint", None) == (
        'An administrator runs: GRANT pg_read_all_stats TO "Shop Owner";'
    )

    # Granted, the grace reads the WAL writer's start, and health() holds.
    with server.connect() as su:
        su.execute(statements[-1].encode())
    with server.connect("shop", owner) as conn:
        assert all(ok for ok, _, _ in health(conn).values())
        assert conn.execute(
            "SELECT x_jobs._ready_since() > pg_catalog.pg_postmaster_start_time()"
        ).fetchone() == (True,)


def test_an_owner_cannot_run_code_as_a_superuser_through_the_update(server: Server) -> None:
    """The scripts run as the bootstrap superuser (trusted), with the search_path set to the
    extension's schema: public, where a database owner may create objects. A statement of an
    update script that resolves an operator then (an index predicate) must not find one of the
    owner's: it would run as the superuser. Here the owner makes itself a producer with the
    ADMIN OPTION an earlier install of 0.4.0 left it (roles outlive DROP EXTENSION), so that it
    may name x_jobs.job_state, plants `=` for it in public, and updates from 0.3.9."""
    owner_of(server, "shop_owner", "shop")
    with server.connect("shop", "shop_owner") as owner:
        owner.execute("CREATE EXTENSION x_jobs")
        owner.execute("DROP EXTENSION x_jobs")
        owner.execute("GRANT x_jobs_producer TO shop_owner")
        owner.execute("CREATE EXTENSION x_jobs VERSION '0.3.9'")
        owner.execute("SELECT x_jobs.enqueue(name => 'mail')")
        # Declared immutable (an index predicate takes nothing else), it calls a volatile
        # function, which may change anything its caller may.
        owner.execute(
            """
            CREATE FUNCTION public.promote() RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
            BEGIN
                IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                    EXECUTE 'ALTER ROLE shop_owner SUPERUSER';
                END IF;
            END
            $f$
            """
        )
        owner.execute(
            """
            CREATE FUNCTION public.state_eq(a x_jobs.job_state, b x_jobs.job_state)
            RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
            BEGIN
                PERFORM public.promote();
                RETURN a::text OPERATOR(pg_catalog.=) b::text;
            END
            $f$
            """
        )
        owner.execute(
            "CREATE OPERATOR public.= (LEFTARG = x_jobs.job_state, RIGHTARG = x_jobs.job_state,"
            " FUNCTION = public.state_eq)"
        )
        owner.execute("ALTER EXTENSION x_jobs UPDATE")
    with server.connect() as su:
        row = su.execute(
            "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = 'shop_owner'"
        ).fetchone()
    assert row == (False,), "the database owner made itself a superuser through the update"


@pytest.mark.parametrize("old", ["0.3.6", "0.3.7", "0.3.8"])
def test_an_owner_cannot_run_code_as_a_superuser_through_an_older_update(
    server: Server, old: str
) -> None:
    """The same through a released update script, which cannot be changed: the control file is
    the newest one's for every version, so a database owner may install an old version and run
    its update steps as the bootstrap superuser, one at a time (0.3.6 -> 0.3.7 -> ... each
    builds indexes on x_jobs.job with `state = ...` predicates)."""
    owner_of(server, "shop_owner", "shop")
    with server.connect("shop", "shop_owner") as owner:
        owner.execute("CREATE EXTENSION x_jobs")
        owner.execute("DROP EXTENSION x_jobs")
        owner.execute("GRANT x_jobs_producer TO shop_owner")
        owner.execute(sql.SQL("CREATE EXTENSION x_jobs VERSION {}").format(sql.Literal(old)))
        # Keyed: some predicates test the key first.
        owner.execute("SELECT x_jobs.enqueue(name => 'mail', concurrency_key => 'k')")
        # Declared immutable (an index predicate takes nothing else), it calls a volatile
        # function, which may change anything its caller may.
        owner.execute(
            """
            CREATE FUNCTION public.promote() RETURNS void LANGUAGE plpgsql VOLATILE AS $f$
            BEGIN
                IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                    EXECUTE 'ALTER ROLE shop_owner SUPERUSER';
                END IF;
            END
            $f$
            """
        )
        owner.execute(
            """
            CREATE FUNCTION public.state_eq(a x_jobs.job_state, b x_jobs.job_state)
            RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $f$
            BEGIN
                PERFORM public.promote();
                RETURN a::text OPERATOR(pg_catalog.=) b::text;
            END
            $f$
            """
        )
        owner.execute(
            "CREATE OPERATOR public.= (LEFTARG = x_jobs.job_state, RIGHTARG = x_jobs.job_state,"
            " FUNCTION = public.state_eq)"
        )
        with contextlib.suppress(psycopg.Error):  # refused would do
            owner.execute(
                sql.SQL("ALTER EXTENSION x_jobs UPDATE TO {}").format(
                    sql.Literal({"0.3.6": "0.3.7", "0.3.7": "0.3.8", "0.3.8": "0.3.9"}[old])
                )
            )
    with server.connect() as su:
        row = su.execute(
            "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = 'shop_owner'"
        ).fetchone()
    assert row == (False,), "the database owner made itself a superuser through the update"
