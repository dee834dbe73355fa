------------------------------------------------------------------------------------------------
-- Tenants: which roles act for which tenants
------------------------------------------------------------------------------------------------

-- One row per (role, tenant) an admin bound (x_jobs.bind_tenant). A role with rows here acts
-- only for those tenants (x_jobs._tenant_scope); a role with none acts as before, for every
-- tenant. The role is kept by name, not by oid, so that a dump restored into another cluster
-- keeps its bindings; a role dropped and made again under its name is bound again, which errs
-- on the side of less access. Only x_jobs_owner reads it, through the functions of
-- 86-tenants.sql and the scope helper: a role learns its own scope, never another's.
CREATE TABLE x_jobs.tenant_binding (
    role name NOT NULL, -- noqa: RF04
    tenant text NOT NULL,
    bound_at timestamptz NOT NULL,
    bound_by text NOT NULL,
    CONSTRAINT tenant_binding_pkey PRIMARY KEY (role, tenant),
    CONSTRAINT tenant_binding_tenant_valid CHECK (tenant <> '' AND pg_catalog.length(tenant) <= 200)
);

COMMENT ON TABLE x_jobs.tenant_binding IS
'Roles bound to tenants: a role with rows here acts only for those tenants.';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.tenant_binding', '');

-- Tests: tests/pgtap/46-tenants.sql, tests/python/test_tenants.py
