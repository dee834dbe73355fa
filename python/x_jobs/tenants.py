"""Tenants: which roles act for which tenants, and leaving a tenant's scope on purpose.

A database role bound to tenants (``x_jobs.bind_tenant``) acts only for them; the bindings are
the admin's (:func:`bind_tenant`, :func:`unbind_tenant`, :func:`tenant_bindings`, and
``x-jobs tenants bind|unbind|list``). Within them, an app scoped to one tenant
(``App(tenant=...)``, ``app.for_tenant``) sets ``x_jobs.tenant`` in each of its transactions
(see :mod:`x_jobs.app`).

:func:`cross_tenant` is the seed's ``crossTenant(reason, fn)``: a handler that must read other
tenants' jobs does it through a login bound to none, inside ``with cross_tenant(reason,
dsn=...) as app:``; the reason is required and logged with the role.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.rows import class_row

from x_jobs.app import App

logger = logging.getLogger(__name__)

BIND: LiteralString = "SELECT x_jobs.bind_tenant(role => %(role)s, tenant => %(tenant)s)"
UNBIND: LiteralString = "SELECT x_jobs.unbind_tenant(role => %(role)s, tenant => %(tenant)s)"
BINDINGS: LiteralString = (
    "SELECT role::text, tenant, bound_at, bound_by FROM x_jobs.tenant_bindings()"
    " ORDER BY role, tenant"
)


@dataclass(frozen=True)
class TenantBinding:
    """A row of ``x_jobs.tenant_bindings()``: ``role`` acts for ``tenant`` (and its other
    tenants), since ``bound_at``, bound by ``bound_by``."""

    role: str
    tenant: str
    bound_at: datetime | None
    bound_by: str | None


def bind_tenant(conn: psycopg.Connection[Any], role: str, tenant: str) -> None:
    """Bind ``role`` to ``tenant`` (``x_jobs.bind_tenant``): from then on it acts only for its
    bound tenants. Binding it again is no change."""
    conn.execute(BIND, {"role": role, "tenant": tenant})


def unbind_tenant(conn: psycopg.Connection[Any], role: str, tenant: str) -> bool:
    """Unbind ``role`` from ``tenant`` (``x_jobs.unbind_tenant``); False when it was not bound.
    A role left with no binding acts as an unbound one does again."""
    row = conn.execute(UNBIND, {"role": role, "tenant": tenant}).fetchone()
    return bool(row and row[0])


def tenant_bindings(conn: psycopg.Connection[Any]) -> list[TenantBinding]:
    """Every binding, by role and tenant (``x_jobs.tenant_bindings()``)."""
    return conn.cursor(row_factory=class_row(TenantBinding)).execute(BINDINGS).fetchall()


@contextmanager
def cross_tenant(reason: str, *, dsn: str | None = None, app: App | None = None) -> Iterator[App]:
    """Leave the tenant scope, for ``reason``: answers an app that sets no tenant, through the
    login of ``dsn`` (default DATABASE_URL, else libpq's environment; a role bound to no tenant,
    which sees every tenant's jobs) or, given ``app``, through that app's login (its
    ``app.cross_tenant``). An empty reason is refused (X_CROSS_TENANT_REASON_MISSING); the
    reason is logged as a warning with the role. A bound role stays refused by the database:
    nothing here widens what a login may do, it only stops narrowing it.

    ``with cross_tenant("support ticket 4711", dsn=AUDIT_DSN) as audit:
    audit.result(job_id)``"""
    if app is not None:
        with app.cross_tenant(reason, dsn=dsn) as view:
            yield view
        return
    own = App(dsn)
    try:
        with own.cross_tenant(reason) as view:
            yield view
    finally:
        own.close()
