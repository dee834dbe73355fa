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


# The claim's statements: which indexes they may read x_jobs.job through, and how many rows.

#: Through which indexes the claim may read x_jobs.job: the three arms, the concurrency count,
#: and the primary key for the statements that update the picked ids.
ARM_INDEXES = {"job_ready_idx", "job_waiting_idx", "job_running_idx"}
#: The rows with a concurrency key: each queue's window of them, and the visit of the keys (the
#: walk of a queue's keys, the seek into a key's rows).
KEYED_INDEXES = {
    "job_ready_keyed_idx",
    "job_waiting_keyed_idx",
    "job_keyed_idx",
    "job_queue_key_idx",
}
ALLOWED_INDEXES = ARM_INDEXES | KEYED_INDEXES | {"job_concurrency_idx", "job_pkey"}
#: Room over 3 x qty x queues for the concurrency-key count (a few running rows per key).
SLACK = 50


def arm_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The scans under the LockRows nodes: the rows each arm of the pick locked."""
    return [
        child
        for node in nodes(plan["Plan"])
        if node["Node Type"] == "LockRows"
        for child in node.get("Plans", [])
        if child.get("Parent Relationship") == "Outer"
    ]


def is_job(node: dict[str, Any]) -> bool:
    return node.get("Relation Name") == "job" and node.get("Schema", "x_jobs") == "x_jobs"


def access_problems(plan: dict[str, Any]) -> list[str]:
    """How a statement's plan reads x_jobs.job other than by the allowed index scans."""
    problems = []
    for node in nodes(plan["Plan"]):
        if not is_job(node) or node["Node Type"] == "ModifyTable":
            continue
        kind, index = node["Node Type"], node.get("Index Name")
        if kind == "Tid Scan":
            # The claim's update reaches the rows its pick locked by their ctid: no scan at all.
            continue
        if kind not in ("Index Scan", "Index Only Scan") or index not in ALLOWED_INDEXES:
            problems.append(f"{kind} on x_jobs.job (index {index})")
    return problems


def window(qty: int) -> int:
    """How many due keyed rows of a queue and kind a claim of qty reads at most (see claim)."""
    return 10 * qty + 100


def seek_problems(
    plan: dict[str, Any], qty: int, queues: int, bound: int | None = None
) -> list[str]:
    """Why a picking statement's plan is no seek: bad access paths or too many rows anywhere."""
    if bound is None:
        bound = 3 * qty * queues + SLACK
    problems = access_problems(plan)
    for node in nodes(plan["Plan"]):
        if node["Node Type"] == "Sort" and node.get("Plans"):
            fed = node["Plans"][0]
            sorted_rows = float(fed.get("Actual Rows", 0)) * float(fed.get("Actual Loops", 0))
            if sorted_rows > bound:
                problems.append(f"Sort of {sorted_rows:.0f} rows (bound {bound})")
        if rows_read(node) > bound:
            where = node.get("Index Name") or node.get("Relation Name") or ""
            problems.append(
                f"{node['Node Type']} {where} handled {rows_read(node):.0f} rows (bound {bound})"
            )
    return problems


def is_keyed_window(plan: dict[str, Any]) -> bool:
    return "WITH win AS" in str(plan.get("Query Text", ""))


def is_key_visit(plan: dict[str, Any]) -> bool:
    """The visit of keys: its walk of the keys, or its seek and lock of their rows."""
    text = str(plan.get("Query Text", ""))
    return "WITH RECURSIVE keys AS" in text or "unnest(v_visit_keys" in text


def is_pick(plan: dict[str, Any]) -> bool:
    text = str(plan.get("Query Text", ""))
    return (
        "FOR UPDATE SKIP LOCKED" in text
        and "CROSS JOIN LATERAL" in text
        and not is_keyed_window(plan)
        and not is_key_visit(plan)
    )
