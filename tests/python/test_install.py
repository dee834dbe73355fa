"""x-jobs install: the x_jobs schema without CREATE EXTENSION, from the scripts the extension
is built from. In a database that allows no extension it must give the very schema CREATE
EXTENSION gives (compared catalog by catalog), a second run must change nothing, the schema must
serve jobs, upgrades must follow the script chain in one transaction, and a database that has
the extension is refused."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import Conn, Connect, connections, fresh_database, wait_for_lock_waiters
from test_cli import as_json, failed, one_line_and_hint, succeeded, x_jobs

from x_jobs import install

logger = logging.getLogger(__name__)

NEWEST = install.read_control(install.bundled_scripts()).default_version
SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
# The newest full script, built by make from sql/src/.
FULL = install.full_script(NEWEST)

# Everything schema x_jobs holds, as the catalogs describe it, in an order independent of oids.
CATALOG: dict[str, LiteralString] = {
    "schema": """
        SELECT n.nspname, pg_catalog.pg_get_userbyid(n.nspowner), n.nspacl::text,
               pg_catalog.obj_description(n.oid, 'pg_namespace')
        FROM pg_catalog.pg_namespace AS n
        WHERE n.nspname = 'x_jobs'
    """,
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text, c.relacl::text,
               pg_catalog.pg_get_userbyid(c.relowner), c.relrowsecurity, c.relforcerowsecurity,
               c.relreplident, pg_catalog.obj_description(c.oid, 'pg_class')
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY c.relname
    """,
    # Tables, indexes, sequences and composite types, each with its columns in order.
    "columns": """
        SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attidentity,
               a.attgenerated, co.collname, a.attacl::text,
               pg_catalog.col_description(c.oid, a.attnum)
        FROM pg_catalog.pg_class AS c
        JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid
        LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_catalog.pg_collation AS co ON co.oid = a.attcollation
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs')
            AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum
    """,
    "indexes": """
        SELECT i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid),
               i.indisprimary, i.indisunique
        FROM pg_catalog.pg_index AS i
        JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1
    """,
    "constraints": """
        SELECT k.conrelid::regclass::text, k.contypid::regtype::text, k.conname, k.contype,
               pg_catalog.pg_get_constraintdef(k.oid), k.condeferrable, k.condeferred,
               k.convalidated
        FROM pg_catalog.pg_constraint AS k
        WHERE k.connamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1, 2, 3
    """,
    "sequences": """
        SELECT s.seqrelid::regclass::text, pg_catalog.format_type(s.seqtypid, NULL), s.seqstart,
               s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle
        FROM pg_catalog.pg_sequence AS s
        JOIN pg_catalog.pg_class AS c ON c.oid = s.seqrelid
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1
    """,
    "functions": """
        SELECT p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid),
               pg_catalog.pg_get_function_arguments(p.oid),
               pg_catalog.pg_get_function_result(p.oid), p.prokind, l.lanname, p.provolatile,
               p.proparallel, p.prosecdef, p.proisstrict, p.proleakproof, p.procost, p.prorows,
               p.proconfig::text, p.prosrc, pg_catalog.pg_get_userbyid(p.proowner),
               p.proacl::text, pg_catalog.obj_description(p.oid, 'pg_proc')
        FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
        WHERE p.pronamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1, 2
    """,
    "types": """
        SELECT t.typname, t.typtype, t.typcategory, pg_catalog.pg_get_userbyid(t.typowner),
               t.typacl::text, pg_catalog.format_type(t.typbasetype, t.typtypmod),
               pg_catalog.obj_description(t.oid, 'pg_type')
        FROM pg_catalog.pg_type AS t
        WHERE t.typnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1
    """,
    "enum_labels": """
        SELECT t.typname, e.enumlabel
        FROM pg_catalog.pg_enum AS e
        JOIN pg_catalog.pg_type AS t ON t.oid = e.enumtypid
        WHERE t.typnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY t.typname, e.enumsortorder
    """,
    "triggers": """
        SELECT c.relname, t.tgname, pg_catalog.pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_catalog.pg_trigger AS t
        JOIN pg_catalog.pg_class AS c ON c.oid = t.tgrelid
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs') AND NOT t.tgisinternal
        ORDER BY 1, 2
    """,
    "policies": """
        SELECT c.relname, p.polname, p.polcmd, p.polpermissive, p.polroles::regrole[]::text,
               pg_catalog.pg_get_expr(p.polqual, p.polrelid),
               pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)
        FROM pg_catalog.pg_policy AS p
        JOIN pg_catalog.pg_class AS c ON c.oid = p.polrelid
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1, 2
    """,
    "views": """
        SELECT c.relname, pg_catalog.pg_get_viewdef(c.oid)
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = pg_catalog.to_regnamespace('x_jobs') AND c.relkind IN ('v', 'm')
        ORDER BY 1
    """,
    "default_privileges": """
        SELECT pg_catalog.pg_get_userbyid(d.defaclrole), d.defaclobjtype, d.defaclacl::text
        FROM pg_catalog.pg_default_acl AS d
        WHERE d.defaclnamespace = pg_catalog.to_regnamespace('x_jobs')
        ORDER BY 1, 2
    """,
}

Catalog = dict[str, list[tuple[Any, ...]]]


def catalog(dsn: str) -> Catalog:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: conn.execute(query).fetchall() for name, query in CATALOG.items()}


@pytest.fixture
def plain_dsn(admin: Conn) -> Iterator[str]:
    """A database of this test's own without x_jobs (CREATE DATABASE; dropped afterwards)."""
    with fresh_database(admin, "template1", prefix="x_jobs_plain") as conninfo:
        yield conninfo


@pytest.fixture
def plain(plain_dsn: str) -> Iterator[Connect]:
    with connections(plain_dsn) as opener:
        yield opener


def version(conn: Conn) -> str | None:
    return install.installed_version(conn)


def test_install_gives_the_schema_create_extension_gives(plain_dsn: str, dsn: str) -> None:
    assert catalog(plain_dsn)["relations"] == []

    result = succeeded(x_jobs("install", "--dsn", plain_dsn))
    assert result.stdout.strip() == f"installed x_jobs {NEWEST} ({FULL})"

    installed, extension = catalog(plain_dsn), catalog(dsn)
    for name in CATALOG:
        assert installed[name] == extension[name], f"{name} differs from CREATE EXTENSION's"
    # The comparison is of something: the objects x_jobs is made of are there.
    tables = {row[0] for row in extension["relations"] if row[1] == "r"}
    assert tables == {
        "consumer_cursor",
        "counter",
        "event",
        "event_lock",
        "job",
        "job_error",
        "job_rate",
        "job_type",
        "notify_secret",
        "outbox",
        "queue_pause",
        "queue_policy",
        "queue_snapshot",
        "queue_weight",
        "rate_limit",
        "schedule",
        "step",
        "stream_entry",
        "tenant_binding",
        "webhook_ledger",
        "worker",
        "worker_login",
    }
    assert len(extension["functions"]) >= 25
    assert len(extension["indexes"]) >= 10
    assert len(extension["constraints"]) >= 5
    assert [label for _, label in extension["enum_labels"]][:4] == [
        "ready",
        "delayed",
        "suspended",
        "running",
    ]
    assert any("x_jobs_producer=X" in str(row[16]) for row in extension["functions"])

    with psycopg.connect(plain_dsn, autocommit=True) as conn:
        assert version(conn) == NEWEST
        # Plain objects: no extension was created behind the scenes.
        assert conn.execute(
            "SELECT count(*) FROM pg_catalog.pg_extension WHERE extname = 'x_jobs'"
        ).fetchone() == (0,)


def test_a_second_install_changes_nothing_and_says_it_is_current(
    plain_dsn: str, plain: Connect
) -> None:
    succeeded(x_jobs("install", "--dsn", plain_dsn))
    conn = plain()
    conn.execute("SELECT x_jobs.enqueue(name => 'kept')")
    before = catalog(plain_dsn)

    again = succeeded(x_jobs("install", "--dsn", plain_dsn))
    assert again.stdout.strip() == f"x_jobs {NEWEST} is installed and current; nothing changed"
    assert as_json(x_jobs("install", "--json", "--dsn", plain_dsn)) == {
        "before": NEWEST,
        "after": NEWEST,
        "scripts": [],
        "changed": False,
        "failing": [],
    }
    assert catalog(plain_dsn) == before
    assert conn.execute("SELECT name FROM x_jobs.job").fetchall() == [("kept",)]


def test_the_installed_schema_serves_jobs(plain_dsn: str, plain: Connect) -> None:
    doc = as_json(x_jobs("install", "--json", "--dsn", plain_dsn))
    assert doc == {
        "before": None,
        "after": NEWEST,
        "scripts": [FULL],
        "changed": True,
        "failing": [],
    }
    conn = plain()

    row = conn.execute("SELECT id, deduped FROM x_jobs.enqueue(name => 'send_email')").fetchone()
    assert row is not None
    job_id, deduped = row
    assert deduped is False
    claimed = conn.execute(
        "SELECT id, state::text FROM x_jobs.claim(queues => ARRAY['default'], worker => 'w1')"
    ).fetchall()
    assert claimed == [(job_id, "running")]
    done = conn.execute(
        "SELECT x_jobs.complete(id => %s, worker => 'w1', output => '{\"sent\": true}')",
        [job_id],
    ).fetchone()
    assert done == (True,)
    assert conn.execute(
        "SELECT state::text, output FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone() == ("done", {"sent": True})
    counted = conn.execute("SELECT sum(completed) FROM x_jobs.counter").fetchone()
    assert counted is not None
    assert counted[0] == 1

    # The command line speaks to it as to the extension.
    listed = as_json(x_jobs("jobs", "list", "--json", "--dsn", plain_dsn))
    assert [(job["id"], job["state"]) for job in listed["jobs"]] == [(job_id, "done")]


def test_install_refuses_a_database_with_the_extension(dsn: str) -> None:
    before = catalog(dsn)
    result = failed(x_jobs("install", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(result)
    assert line == f"x-jobs: X_EXTENSION_PRESENT: this database has x_jobs {NEWEST} as an extension"
    assert "ALTER EXTENSION x_jobs UPDATE" in hint
    error = json.loads(failed(x_jobs("install", "--json", "--dsn", dsn), 1).stdout)["error"]
    assert error["code"] == "X_EXTENSION_PRESENT"
    assert catalog(dsn) == before


def test_install_refuses_a_schema_x_jobs_it_did_not_make(plain_dsn: str, plain: Connect) -> None:
    conn = plain()
    conn.execute("CREATE SCHEMA x_jobs")
    conn.execute("CREATE TABLE x_jobs.mine (id integer)")
    result = failed(x_jobs("install", "--dsn", plain_dsn), 1)
    line, _ = one_line_and_hint(result)
    assert line.startswith("x-jobs: X_SCHEMA_CONFLICT: ")
    assert [row[0] for row in catalog(plain_dsn)["relations"]] == ["mine"]


def test_two_installs_at_once_install_once(plain_dsn: str, plain: Connect) -> None:
    # The first installer holds its transaction open; the second must wait for it, then find
    # the version it committed, rather than fail on CREATE SCHEMA.
    first = plain(autocommit=False)
    first.execute(install.LOCK)
    second = plain()
    outcome: list[install.Installed | BaseException] = []

    def run_second() -> None:
        try:
            outcome.append(install.install(second))
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=run_second)
    thread.start()
    wait_for_lock_waiters(plain(), [second.info.backend_pid])
    path_before = first.execute("SHOW search_path").fetchone()
    assert install.install(first) == install.Installed(None, NEWEST, (FULL,))
    # The caller's transaction goes on with its own settings, not the scripts'.
    assert first.execute("SHOW search_path").fetchone() == path_before
    first.commit()
    thread.join(timeout=60)
    assert outcome == [install.Installed(NEWEST, NEWEST, ())]


def write_scripts(directory: Path, newest: str, scripts: dict[str, str]) -> Path:
    """A scripts directory like sql/: a control file, a full script, and upgrade scripts."""
    directory.mkdir(exist_ok=True)
    (directory / "x_jobs.control").write_text(
        f"default_version = '{newest}'\nrelocatable = false\nrequires = 'plpgsql'\n"
    )
    (directory / install.full_script(newest)).write_text(
        "SELECT 1/0;  -- never run: only upgrades here\n"
    )
    for name, text in scripts.items():
        (directory / name).write_text(text)
    return directory


def step(old: str, new: str, body: str, *, record: str | None = None) -> str:
    """An upgrade script written the way sql/x_jobs--A--B.sql are."""
    return f"""-- {old} -> {new}: a step of the test's chain
\\echo Use "ALTER EXTENSION x_jobs UPDATE TO '{new}'" to load this file. \\quit

{body}
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_error', '');

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '{record or new}'::text
$$;
"""


def test_an_older_version_is_upgraded_along_the_chain(
    plain_dsn: str, plain: Connect, tmp_path: Path
) -> None:
    succeeded(x_jobs("install", "--dsn", plain_dsn))
    scripts = write_scripts(
        tmp_path / "sql",
        "90.2.0",
        {
            f"x_jobs--{NEWEST}--90.1.0.sql": step(
                NEWEST, "90.1.0", "ALTER TABLE x_jobs.job_error ADD COLUMN note text;"
            ),
            "x_jobs--90.1.0--90.2.0.sql": step(
                "90.1.0", "90.2.0", "CREATE INDEX job_error_note_idx ON x_jobs.job_error (note);"
            ),
            # A branch that leads elsewhere, and a step from before the installed version.
            "x_jobs--90.1.0--90.1.1.sql": step(
                "90.1.0", "90.1.1", "CREATE TABLE x_jobs.dead_end ();"
            ),
            f"x_jobs--0.0.9--{NEWEST}.sql": step("0.0.9", NEWEST, "CREATE TABLE x_jobs.old ();"),
        },
    )
    conn = plain()
    done = install.install(conn, scripts)
    assert done == install.Installed(
        before=NEWEST,
        after="90.2.0",
        scripts=(f"x_jobs--{NEWEST}--90.1.0.sql", "x_jobs--90.1.0--90.2.0.sql"),
    )
    assert version(conn) == "90.2.0"
    objects = catalog(plain_dsn)
    assert ("job_error", "note") in [row[:2] for row in objects["columns"]]
    assert "x_jobs.job_error_note_idx" in [row[0] for row in objects["indexes"]]
    names = [row[0] for row in objects["relations"]]
    assert "dead_end" not in names
    assert "old" not in names

    assert install.install(conn, scripts) == install.Installed("90.2.0", "90.2.0", ())
    # This package's own scripts do not reach back from 90.2.0: refused, nothing changed.
    refused = failed(x_jobs("install", "--dsn", plain_dsn), 1)
    line, hint = one_line_and_hint(refused)
    assert line.startswith("x-jobs: X_UPGRADE_PATH_MISSING: ")
    assert "90.2.0" in line
    assert "newer x_jobs package" in hint
    assert version(conn) == "90.2.0"


def test_a_failing_upgrade_changes_nothing(plain_dsn: str, plain: Connect, tmp_path: Path) -> None:
    succeeded(x_jobs("install", "--dsn", plain_dsn))
    before = catalog(plain_dsn)
    conn = plain()

    broken = write_scripts(
        tmp_path / "broken",
        "90.2.0",
        {
            f"x_jobs--{NEWEST}--90.1.0.sql": step(
                NEWEST, "90.1.0", "ALTER TABLE x_jobs.job_error ADD COLUMN note text;"
            ),
            "x_jobs--90.1.0--90.2.0.sql": step(
                "90.1.0", "90.2.0", "SELECT x_jobs.no_such_thing();"
            ),
        },
    )
    with pytest.raises(install.InstallFailed) as caught:
        install.install(conn, broken)
    assert caught.value.message.startswith("X_INSTALL_FAILED: x_jobs--90.1.0--90.2.0.sql line 4")
    assert "x_jobs.no_such_thing() does not exist" in caught.value.message
    assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedFunction)

    # A script that does not record its version is refused as well.
    silent = write_scripts(
        tmp_path / "silent",
        "90.1.0",
        {
            f"x_jobs--{NEWEST}--90.1.0.sql": step(
                NEWEST,
                "90.1.0",
                "ALTER TABLE x_jobs.job_error ADD COLUMN note text;",
                record=NEWEST,
            ),
        },
    )
    with pytest.raises(install.InstallFailed, match=f"answers {NEWEST}, not 90.1.0"):
        install.install(conn, silent)

    # Nothing of either: one transaction each, rolled back whole.
    assert version(conn) == NEWEST
    assert catalog(plain_dsn) == before


def test_scripts_lose_only_what_create_extension_alone_can_run() -> None:
    source = (SQL_DIR / FULL).read_text()
    plain_text = install.plain_sql(source, FULL)
    assert source.startswith("\\echo Use")
    assert "\\echo" not in plain_text
    assert re.search(r"^SELECT pg_catalog.pg_extension_config_dump", source, re.MULTILINE)
    assert not re.search(r"pg_extension_config_dump\(", plain_text)
    # Dropped lines are left blank, so a line number the server reports is the file's.
    assert plain_text.count("\n") == source.count("\n")
    kept = [line for line in source.splitlines() if "\\echo" not in line]
    kept = [line for line in kept if "pg_extension_config_dump(" not in line]
    assert [line for line in plain_text.splitlines() if line] == [line for line in kept if line]

    for unrunnable in ("\\i other.sql", "CREATE TABLE @extschema@.t ();", "\\set x 1"):
        with pytest.raises(install.InstallRefused, match="only psql or CREATE EXTENSION"):
            install.plain_sql(f"SELECT 1;\n{unrunnable}\n", "x_jobs--0.1.0--0.2.0.sql")

    # @extowner@ is the calling role, as CREATE EXTENSION substitutes it (a quoted identifier);
    # without a caller to put there, it is refused like the others.
    owned = "GRANT x_jobs_admin TO @extowner@;\n"
    assert install.plain_sql(owned, FULL, '"Web Owner"') == ('GRANT x_jobs_admin TO "Web Owner";\n')
    with pytest.raises(install.InstallRefused, match="@extowner@"):
        install.plain_sql(owned, FULL)


def test_the_package_ships_the_repositorys_scripts() -> None:
    shipped = install.bundled_scripts()
    for name in (FULL, "x_jobs.control"):
        assert (shipped / name).read_text() == (SQL_DIR / name).read_text()
    control = (SQL_DIR / "x_jobs.control").read_text()
    assert re.findall(r"^default_version = '(.*)'$", control, re.MULTILINE) == [NEWEST]
