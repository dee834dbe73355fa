"""Reading plans from inside functions: auto_explain's JSON plans, sent to the client as
NOTICEs, for the tests that hold a statement to its indexes (test_plan.py, test_outbox_sql.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg

#: auto_explain on one session: every statement, nested ones (a function's) included, with
#: actual row counts, as JSON NOTICEs.
AUTO_EXPLAIN: list[LiteralString] = [
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_format = 'json'",
    "SET auto_explain.log_level = 'notice'",
    "SET client_min_messages = 'notice'",
]


class PlanLog:
    """Collects the JSON plans auto_explain sends as NOTICEs on one connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.plans: list[dict[str, Any]] = []
        for statement in AUTO_EXPLAIN:
            conn.execute(statement)
        conn.add_notice_handler(self._on_notice)

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith("duration:") and "{" in message:
            self.plans.append(json.loads(message[message.index("{") :]))

    def take(self) -> list[dict[str, Any]]:
        plans, self.plans = self.plans, []
        return plans


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A plan node and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def rows_read(node: dict[str, Any]) -> float:
    """Rows a node handled over all its loops, counting those its filters threw away."""
    per_loop = (
        node.get("Actual Rows", 0)
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    )
    return float(per_loop) * float(node.get("Actual Loops", 0))
