"""The client names no x_jobs table: it reads and writes through the SQL API's functions (the
readers among them: job_detail, job_states, list_outbox, ...), so that the table layout is not
a client API. Every string literal of the package is scanned, docstrings and comments aside,
for a table of the installed schema as the catalog lists it.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from conftest import Conn

import x_jobs

PACKAGE = Path(x_jobs.__file__).parent

TABLES = """
    SELECT c.relname::text FROM pg_catalog.pg_class AS c
    WHERE c.relnamespace = 'x_jobs'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
    ORDER BY 1
"""


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                found.add(id(body[0].value))
    return found


def table_names(source: str, tables: list[str]) -> list[tuple[int, str]]:
    """(line, text) of each string literal in ``source`` that names one of ``tables`` of the
    x_jobs schema (x_jobs.job, "x_jobs"."job", or the two as separate literals, as
    psycopg.sql.Identifier("x_jobs", "job") takes them), docstrings left out."""
    alternatives = "|".join(re.escape(t) for t in tables)
    qualified = re.compile(rf'"?\bx_jobs"?\s*\.\s*"?({alternatives})\b(?!\s*\()')
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            match = qualified.search(node.value)
            if match:
                before = node.value[: match.start()]
                line = (
                    node.value.splitlines()[before.count("\n")]
                    if "\n" in node.value
                    else node.value
                )
                found.append((node.lineno + before.count("\n"), line.strip()[:100]))
        elif isinstance(node, ast.Call):
            texts = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
            for first, second in itertools.pairwise(texts):
                if first == "x_jobs" and second in tables:
                    found.append((node.lineno, f"{first}, {second}"))
    return sorted(found)


def test_the_package_names_no_x_jobs_table(conn: Conn) -> None:
    tables = [str(row[0]) for row in conn.execute(TABLES)]
    assert {"job", "job_error", "step", "outbox", "counter"} <= set(tables)
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 10, f"no package found at {PACKAGE}"
    named = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
        for path in modules
        for line, text in table_names(path.read_text(encoding="utf-8"), tables)
    ]
    assert named == [], "Python names x_jobs tables (call a reader function instead):\n" + (
        "\n".join(named)
    )


def test_the_scan_finds_a_table_and_ignores_docstrings_and_comments() -> None:
    source = '''
"""Reads x_jobs.job."""
import psycopg

# SELECT * FROM x_jobs.job
QUERY = "SELECT id FROM x_jobs.job_detail(id => %s)"
STATES = "SELECT enum_range(NULL::x_jobs.job_state)"


def f():
    """From x_jobs.outbox."""
    return "SELECT * FROM x_jobs.outbox WHERE id = %s", f"FROM \\"x_jobs\\".\\"step\\" {f}"


IDENT = psycopg.sql.Identifier("x_jobs", "counter")
'''
    assert sorted(
        line for line, _ in table_names(source, ["job", "outbox", "step", "counter"])
    ) == [
        12,
        12,
        15,
    ]
