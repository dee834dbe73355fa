"""``x-jobs install``: the x_jobs schema for databases where CREATE EXTENSION cannot be used.

Managed services that allow no extension files still run plain SQL. This module runs the same
versioned scripts that ``CREATE EXTENSION x_jobs`` and ``ALTER EXTENSION x_jobs UPDATE`` run,
shipped inside the package (``x_jobs/sql`` is the repository's ``sql/``), so that the result is
the same schema:

* nothing installed (no ``x_jobs.version()``): the newest full script, ``sql/x_jobs--V.sql``
  for V the ``default_version`` of ``sql/x_jobs.control`` (``make`` builds it from ``sql/src/``:
  in a checkout, run ``make`` once before installing);
* an older version installed: the upgrade scripts ``sql/x_jobs--A--B.sql`` along the shortest
  chain to the newest, as ALTER EXTENSION would pick it;
* the newest installed: nothing.

Each script is made runnable outside CREATE EXTENSION: its ``\\echo ... \\quit`` guard line and its
``pg_extension_config_dump(...)`` calls (valid only inside CREATE EXTENSION) are dropped, and
``@extowner@`` names the calling role as CREATE EXTENSION would. All of it runs in one
transaction, under an advisory lock so that two installers do not interleave. The version is
recorded by the scripts themselves (each replaces ``x_jobs.version()``), which is how a later
install knows where to start; it is checked after every script.

The scripts run as the caller, not as a superuser. A database owner without CREATEROLE whose
server lacks the x_jobs roles is refused before anything changes, with the statements an
administrator runs first (``X_ROLES_MISSING``); its objects are then its own rather than
x_jobs_owner's, and it wants ``pg_read_all_stats`` for the restart grace. What
``x_jobs.health()`` finds wrong afterwards comes back with the result (:attr:`Installed.failing`).
"""

from __future__ import annotations

import collections
import importlib.resources
import logging
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import Any, LiteralString

import psycopg
from psycopg import errors as pg_errors

from x_jobs import health
from x_jobs.errors import ExtensionPresent as ExtensionPresent  # noqa: PLC0414 - re-exported here
from x_jobs.errors import InstallFailed as InstallFailed  # noqa: PLC0414 - re-exported here
from x_jobs.errors import InstallRefused as InstallRefused  # noqa: PLC0414 - re-exported here
from x_jobs.errors import RequirementMissing as RequirementMissing  # noqa: PLC0414 - re-exported here
from x_jobs.errors import RolesMissing, RoleUnsafe, translate
from x_jobs.errors import SchemaConflict as SchemaConflict  # noqa: PLC0414 - re-exported here
from x_jobs.errors import UpgradePathMissing as UpgradePathMissing  # noqa: PLC0414 - re-exported here

logger = logging.getLogger(__name__)

CONTROL_FILE = "x_jobs.control"

# Two installers at once would both find nothing installed and both run the full script; the
# second waits here instead, then reads the version the first one committed.
LOCK: LiteralString = (
    "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('x_jobs install'))"
)
EXTENSION_VERSION: LiteralString = (
    "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'x_jobs'"
)
MISSING_REQUIRED: LiteralString = """
    SELECT r.name
    FROM unnest(%s::text[]) AS r (name)
    WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = r.name)
    ORDER BY r.name
"""
SCHEMA_EXISTS: LiteralString = "SELECT pg_catalog.to_regnamespace('x_jobs') IS NOT NULL"
VERSION: LiteralString = "SELECT x_jobs.version()"
# What CREATE EXTENSION substitutes for @extowner@: the calling role, quoted if it must be.
CALLER: LiteralString = "SELECT pg_catalog.quote_ident(current_user)"
# What CREATE EXTENSION sets around a script: quiet notices, and a search_path that cannot
# capture a name (the scripts qualify every object; an unqualified CREATE fails loudly here).
# Local to the transaction; put back afterwards for a caller whose transaction goes on.
SETTINGS: LiteralString = (
    "SELECT pg_catalog.current_setting('search_path'),"
    " pg_catalog.current_setting('client_min_messages'),"
    " pg_catalog.current_setting('check_function_bodies')"
)
SET_SETTINGS: LiteralString = (
    "SELECT pg_catalog.set_config('search_path', %s, true),"
    " pg_catalog.set_config('client_min_messages', %s, true),"
    " pg_catalog.set_config('check_function_bodies', %s, true)"
)
# As CREATE EXTENSION runs a script: a SQL function may then name one defined further down.
SCRIPT_SETTINGS = ("pg_catalog, pg_temp", "warning", "off")

_GUARD = re.compile(r"^\\echo\b.*\\quit[ \t]*(?:\r?\n|\Z)", re.MULTILINE)
_CONFIG_DUMP = re.compile(
    r"^[ \t]*SELECT[ \t]+(?:pg_catalog\.)?pg_extension_config_dump[ \t]*\([^;]*\)[ \t]*;[ \t]*"
    r"(?:\r?\n|\Z)",
    re.MULTILINE | re.IGNORECASE,
)
# What psql or CREATE EXTENSION would resolve and a plain run cannot: meta-commands, the
# @extschema@ substitutions (the scripts name their schema), and @extowner@ when no caller was
# given to put in its place.
_UNRUNNABLE = re.compile(r"^\\\S+|@extschema(?::[^@]*)?@|@extowner@", re.MULTILINE)
_EXTOWNER = "@extowner@"
_CONTROL_LINE = re.compile(r"^\s*(\w+)\s*=\s*'([^']*)'\s*$", re.MULTILINE)
_UPGRADE = re.compile(r"^x_jobs--(.+)--(.+)\.sql$")


@dataclass(frozen=True)
class Control:
    """What ``install`` needs from ``x_jobs.control``."""

    default_version: str
    requires: tuple[str, ...]


@dataclass(frozen=True)
class Installed:
    """What an install did: the version before (None: nothing), after, and the scripts run;
    and the checks of ``x_jobs.health()`` that do not hold (what an administrator should
    still grant, say)."""

    before: str | None
    after: str
    scripts: tuple[str, ...]
    failing: tuple[health.Check, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.scripts)


def bundled_scripts() -> Traversable:
    """The SQL scripts shipped in the package (in a checkout: the repository's ``sql/``)."""
    return importlib.resources.files("x_jobs") / "sql"


def full_script(version: str) -> str:
    """The file name of ``version``'s full script, as CREATE EXTENSION names it."""
    return f"x_jobs--{version}.sql"


def read_control(scripts: Traversable) -> Control:
    """``default_version`` and ``requires`` of ``x_jobs.control`` (``key = 'value'`` lines)."""
    text = (scripts / CONTROL_FILE).read_text(encoding="utf-8")
    settings = dict(_CONTROL_LINE.findall(text))
    if "default_version" not in settings:
        raise InstallRefused(
            f"X_INSTALL_REFUSED: {CONTROL_FILE} sets no default_version",
            hint="The package's SQL scripts are incomplete; reinstall x_jobs.",
        )
    requires = tuple(r.strip() for r in settings.get("requires", "").split(",") if r.strip())
    return Control(default_version=settings["default_version"], requires=requires)


def upgrade_path(scripts: Traversable, start: str, goal: str) -> list[tuple[str, str]] | None:
    """The upgrade scripts from ``start`` to ``goal`` as (file name, version it leads to), the
    fewest steps (ALTER EXTENSION's choice), or None when none leads there; ``[]`` when start is
    goal."""
    steps: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for entry in scripts.iterdir():
        match = _UPGRADE.match(entry.name)
        if match:  # PostgreSQL forbids "--" inside a version name, so the split is unambiguous.
            steps[match[1]].append((match[2], entry.name))
    came_from: dict[str, tuple[str, str] | None] = {start: None}
    todo = collections.deque([start])
    while todo:
        version = todo.popleft()
        if version == goal:
            path: list[tuple[str, str]] = []
            while (step := came_from[version]) is not None:
                path.append((step[1], version))
                version = step[0]
            return path[::-1]
        for target, name in sorted(steps[version]):
            if target not in came_from:
                came_from[target] = (version, name)
                todo.append(target)
    return None


def _blank(match: re.Match[str]) -> str:
    return "\n" * match[0].count("\n")


def plain_sql(script: str, name: str, caller: str | None = None) -> str:
    """``script`` made runnable outside CREATE EXTENSION: without the ``\\echo ... \\quit`` guard
    and the ``pg_extension_config_dump`` calls, and with ``@extowner@`` replaced by ``caller``
    (the calling role's name quoted as an identifier, as CREATE EXTENSION substitutes it).
    Refuses anything else only psql or CREATE EXTENSION could resolve, rather than run it half
    understood. What is dropped leaves its lines blank, so that a line number the server reports
    is the file's."""
    text = _CONFIG_DUMP.sub(_blank, _GUARD.sub(_blank, script))
    if caller is not None:
        text = text.replace(_EXTOWNER, caller)
    leftover = _UNRUNNABLE.search(text)
    if leftover:
        line = text.count("\n", 0, leftover.start()) + 1
        raise InstallRefused(
            f"X_INSTALL_REFUSED: {name} line {line} holds {leftover[0]!r}, which only psql or "
            "CREATE EXTENSION can run",
            hint="Keep meta-commands other than the \\echo guard and @extschema@ out of the "
            "x_jobs scripts; x-jobs install runs them as plain SQL.",
        )
    return text


def _where(text: str, err: psycopg.Error) -> str:
    """Where in a script the server says ``err`` happened: a line, or the PL/pgSQL context."""
    position = err.diag.statement_position
    if position and position.isdigit():
        line = text.count("\n", 0, int(position)) + 1
        return f" line {line}"
    if err.diag.context:
        return f" ({err.diag.context.splitlines()[0]})"
    return ""


def installed_version(conn: psycopg.Connection[Any]) -> str | None:
    """What ``x_jobs.version()`` answers here, or None when there is no such function. Runs in
    a savepoint, so that a missing function leaves the caller's transaction usable."""
    try:
        with conn.transaction():
            row = conn.execute(VERSION).fetchone()
    except (pg_errors.UndefinedFunction, pg_errors.InvalidSchemaName):
        return None
    return None if row is None else str(row[0])


def install(conn: psycopg.Connection[Any], scripts: Traversable | None = None) -> Installed:
    """Install or upgrade x_jobs in the database of ``conn`` without CREATE EXTENSION, in one
    transaction (a savepoint when the caller has one open: its commit then makes the install).
    See the module's docstring."""
    scripts = bundled_scripts() if scripts is None else scripts
    control = read_control(scripts)
    newest = control.default_version
    with conn.transaction():
        conn.execute(LOCK)
        row = conn.execute(EXTENSION_VERSION).fetchone()
        if row is not None:
            raise ExtensionPresent(
                f"X_EXTENSION_PRESENT: this database has x_jobs {row[0]} as an extension",
                hint="Update it with ALTER EXTENSION x_jobs UPDATE; x-jobs install is for "
                "databases where CREATE EXTENSION cannot be used.",
            )
        missing = [str(r[0]) for r in conn.execute(MISSING_REQUIRED, [list(control.requires)])]
        if missing:
            raise RequirementMissing(
                f"X_REQUIREMENT_MISSING: x_jobs needs {', '.join(missing)}, which this database "
                "does not have",
                hint=f"Run CREATE EXTENSION {missing[0]} first (it ships with PostgreSQL).",
            )

        before = installed_version(conn)
        if before == newest:
            return Installed(
                before=before, after=newest, scripts=(), failing=tuple(health.failing(conn))
            )
        if before is None:
            exists = conn.execute(SCHEMA_EXISTS).fetchone()
            if exists is not None and exists[0]:
                raise SchemaConflict(
                    "X_SCHEMA_CONFLICT: a schema x_jobs exists but has no x_jobs.version()",
                    hint="It was not made by x_jobs, or by an interrupted manual install: "
                    "rename or drop it, then run x-jobs install again.",
                )
            if not (scripts / full_script(newest)).is_file():
                raise InstallRefused(
                    f"X_INSTALL_REFUSED: the package has no {full_script(newest)}",
                    hint="In a checkout, run make first: it builds the script from sql/src/. "
                    "Otherwise reinstall x_jobs.",
                )
            plan = [(full_script(newest), newest)]
        else:
            path = upgrade_path(scripts, before, newest)
            if path is None:
                raise UpgradePathMissing(
                    f"X_UPGRADE_PATH_MISSING: no upgrade scripts lead from the installed x_jobs "
                    f"{before} to {newest}, the newest this package ships",
                    hint="If the database is newer than this package, use a newer x_jobs "
                    "package; otherwise the package lacks an x_jobs--A--B.sql script.",
                )
            plan = path

        caller_settings = conn.execute(SETTINGS).fetchone()
        assert caller_settings is not None  # current_setting answers one row
        caller = conn.execute(CALLER).fetchone()
        assert caller is not None
        conn.execute(SET_SETTINGS, SCRIPT_SETTINGS)
        for name, version in plan:
            text = plain_sql((scripts / name).read_text(encoding="utf-8"), name, str(caller[0]))
            logger.info("running %s", name, extra={"script": name, "version": version})
            try:
                # bytes: the script is read from a file, not a literal; psycopg sends it with
                # the simple query protocol, so the server runs its statements in order.
                conn.execute(text.encode("utf-8"))
            except psycopg.Error as err:
                typed = translate(err)
                if isinstance(typed, (RolesMissing, RoleUnsafe)):
                    # The script's own refusal, with what an administrator runs or changes.
                    raise typed from err
                raise InstallFailed(
                    f"X_INSTALL_FAILED: {name}{_where(text, err)} failed: "
                    f"{err.diag.message_primary or err}",
                    hint="Nothing was changed: the install runs in one transaction. Fix the "
                    "cause (often a missing privilege: the install creates a schema, roles and "
                    "grants) and run it again.",
                ) from err
            recorded = installed_version(conn)
            if recorded != version:
                raise InstallFailed(
                    f"X_INSTALL_FAILED: after {name}, x_jobs.version() answers {recorded}, "
                    f"not {version}",
                    hint="Every script must replace x_jobs.version() with its own version; "
                    "nothing was changed.",
                )
        conn.execute(SET_SETTINGS, caller_settings)
        failing = tuple(health.failing(conn))
    return Installed(
        before=before, after=newest, scripts=tuple(name for name, _ in plan), failing=failing
    )
