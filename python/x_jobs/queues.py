"""Queue policies: which queues are fair, and the weights of their tenants.

A fair queue's claims take its ready rows round-robin across tenants, a tenant's weight
(rows a turn, 1 to 1000; 1 without one) at a time, instead of in the queue's FIFO order, so
that one tenant's flood delays another's few jobs by about one turn (``x_jobs.set_queue_policy``,
docs/tenants.md#fair-queues). :func:`set_queue_policy` is the admin's call, and
:func:`queue_policies` lists what is set (workers and monitors may read it); ``x-jobs queues
policy`` is both on the command line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from x_jobs.errors import typed_refusals

logger = logging.getLogger(__name__)

SET_POLICY: LiteralString = (
    "SELECT queue FROM x_jobs.set_queue_policy("
    "queue => %(queue)s, fair => %(fair)s, weights => %(weights)s)"
)
POLICIES: LiteralString = (
    "SELECT queue, fair, weights, fair_index, index_ready, updated_at, updated_by"
    " FROM x_jobs.queue_policies()"
)
POLICY_OF: LiteralString = POLICIES + " WHERE queue = %(queue)s"


@dataclass(frozen=True)
class QueuePolicy:
    """A row of ``x_jobs.queue_policies()``: whether ``queue`` is fair, its tenants' weights
    (tenant to rows a turn; a tenant absent takes 1), the name of the index a fair queue's
    claims walk and whether it is there and valid (False after a restored dump: set the policy
    again to build it; None for a queue that is not fair), and who set the policy when."""

    queue: str
    fair: bool
    weights: dict[str, int]
    fair_index: str | None
    index_ready: bool | None
    updated_at: datetime
    updated_by: str


def set_queue_policy(
    conn: psycopg.Connection[Any],
    queue: str,
    *,
    fair: bool | None = None,
    weights: Mapping[str, int] | None = None,
) -> QueuePolicy:
    """Set the policy of ``queue`` (``x_jobs.set_queue_policy``, x_jobs_admin) and answer it as
    :func:`queue_policies` lists it. ``fair``: True makes its claims take turns across tenants,
    False FIFO again, None keeps what is set (not fair, for a queue without a policy).
    ``weights`` replaces the queue's weights (``{}`` clears them, None keeps them); a weight
    that is no whole number from 1 to 1000 is refused (:class:`~x_jobs.errors.QueuePolicyInvalid`,
    X_QUEUE_POLICY_INVALID), and so is a call by a role bound to tenants (X_CROSS_TENANT).

    Making a queue fair builds its index in this transaction, holding off writes to
    ``x_jobs.job`` until it commits: set it while the table is quiet, or before the queue
    fills."""
    params = {
        "queue": queue,
        "fair": fair,
        "weights": None if weights is None else Jsonb(dict(weights)),
    }
    with typed_refusals(), conn.transaction():
        conn.execute(SET_POLICY, params)
        cur = conn.cursor(row_factory=class_row(QueuePolicy))
        row = cur.execute(POLICY_OF, {"queue": queue}).fetchone()
    assert row is not None  # set_queue_policy answers the row it wrote, or raises
    return row


def queue_policies(conn: psycopg.Connection[Any]) -> list[QueuePolicy]:
    """Every queue with a policy, by name (``x_jobs.queue_policies()``, x_jobs_worker and
    pg_monitor). A queue without one is FIFO, its tenants unweighted."""
    with typed_refusals():
        return conn.cursor(row_factory=class_row(QueuePolicy)).execute(POLICIES).fetchall()
