"""``x-jobs tenants bind|unbind|list``: which roles act for which tenants (the admin's)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated

import typer

from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn
from x_jobs.cli._output import Output, _cell, _table, _when
from x_jobs.tenants import bind_tenant, tenant_bindings, unbind_tenant

logger = logging.getLogger(__name__)

tenants_cli = typer.Typer(help="Tenants: bind roles to the tenants they act for.")

Role = Annotated[str, typer.Argument(metavar="ROLE", help="The database role.")]
Tenant = Annotated[str, typer.Argument(metavar="TENANT", help="The tenant.")]


@tenants_cli.command("bind")
def tenants_bind(role: Role, tenant: Tenant, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Bind a role to a tenant (x_jobs.bind_tenant): it then acts only for its bound tenants.

    Binding it again changes nothing.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        bind_tenant(conn, role, tenant)
    out.emit({"role": role, "tenant": tenant, "bound": True}, f"role {role} acts for {tenant}")


@tenants_cli.command("unbind")
def tenants_unbind(role: Role, tenant: Tenant, dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Unbind a role from a tenant (x_jobs.unbind_tenant).

    A role left with no tenant acts as an unbound one does again (every tenant its x_jobs roles
    allow).
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        changed = unbind_tenant(conn, role, tenant)
    said = (
        f"role {role} no longer acts for {tenant}"
        if changed
        else f"role {role} was not bound to {tenant}; nothing changed"
    )
    out.emit({"role": role, "tenant": tenant, "bound": False, "changed": changed}, said)


@tenants_cli.command("list")
def tenants_list(dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Every binding of a role to a tenant, by role (x_jobs.tenant_bindings)."""
    out = Output(as_json)
    with database(dsn, out) as conn:
        rows = tenant_bindings(conn)
    table = _table()
    for column in ("role", "tenant", "bound at", "bound by"):
        table.add_column(column, overflow="fold")
    for b in rows:
        table.add_row(
            _cell(b.role),
            _cell(b.tenant),
            _cell(_when(b.bound_at) if b.bound_at else "-"),
            _cell(b.bound_by or "-"),
        )
    out.emit(
        {"bindings": [dataclasses.asdict(b) for b in rows]},
        table if rows else "no role is bound to a tenant",
    )
