------------------------------------------------------------------------------------------------
-- Tenants: binding roles to tenants, and row-level security by the caller's scope
------------------------------------------------------------------------------------------------

-- Bind a role to a tenant: from the next call on, the role acts only for the tenants it is
-- bound to (see x_jobs._tenant_scope). Binding again what is bound changes nothing (the first
-- bound_at and bound_by stay). Answers nothing; an unknown role is refused (XJ058), a tenant
-- as enqueue's tenant_id is (XJ006).
-- SECURITY DEFINER: the bindings are the owner's; only admins may call it (see Grants).
CREATE FUNCTION x_jobs.bind_tenant(role name, tenant text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF bind_tenant.role IS NULL
        OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = bind_tenant.role) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ058',
            MESSAGE = pg_catalog.format('X_ROLE_UNKNOWN: no role is named %s',
                coalesce(pg_catalog.quote_ident(bind_tenant.role), 'NULL')),
            HINT = 'Name an existing role (CREATE ROLE first); the name is case-sensitive.';
    END IF;
    IF bind_tenant.tenant IS NULL OR bind_tenant.tenant = '' OR pg_catalog.length(bind_tenant.tenant) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ006',
            MESSAGE = pg_catalog.format('X_TENANT_INVALID: tenant %s is missing, empty or longer than 200 characters',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(bind_tenant.tenant, 64)), 'NULL')),
            HINT = 'Name the tenant in 1 to 200 characters, as jobs name it in tenant_id.';
    END IF;
    INSERT INTO x_jobs.tenant_binding AS b (role, tenant, bound_at, bound_by)
    VALUES (bind_tenant.role, bind_tenant.tenant, x_jobs.now(), x_jobs._caller())
    ON CONFLICT ON CONSTRAINT tenant_binding_pkey DO NOTHING;
END
$$;

-- Unbind a role from a tenant. Answers whether it was bound. A role whose last binding goes
-- acts for every tenant again, as an unbound role does: unbind it last only on purpose.
-- SECURITY DEFINER: as bind_tenant.
CREATE FUNCTION x_jobs.unbind_tenant(role name, tenant text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF unbind_tenant.role IS NULL
        OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = unbind_tenant.role) THEN
        -- A binding of a dropped role can still be removed: only a name nobody was ever bound
        -- under is unknown.
        IF NOT EXISTS (SELECT FROM x_jobs.tenant_binding AS b WHERE b.role = unbind_tenant.role) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ058',
                MESSAGE = pg_catalog.format('X_ROLE_UNKNOWN: no role is named %s',
                    coalesce(pg_catalog.quote_ident(unbind_tenant.role), 'NULL')),
                HINT = 'Name an existing role; x_jobs.tenant_bindings() lists the bound ones.';
        END IF;
    END IF;
    DELETE FROM x_jobs.tenant_binding AS b
    WHERE b.role = unbind_tenant.role AND b.tenant = unbind_tenant.tenant;
    RETURN FOUND;
END
$$;

-- Every binding, by role and tenant.
-- SECURITY DEFINER: as bind_tenant.
CREATE FUNCTION x_jobs.tenant_bindings()
RETURNS TABLE (role name, tenant text, bound_at timestamptz, bound_by text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.role, b.tenant, b.bound_at, b.bound_by
    FROM x_jobs.tenant_binding AS b
    ORDER BY b.role, b.tenant
$$;

-- Row-level security, forced, on the tables that hold tenant rows and that a role is granted
-- SELECT on (job and outbox to workers; job_error, step, event and webhook_ledger to admins), so that a direct
-- SELECT, and the functions that run as their caller (the admins' readers and acts: cancel,
-- retry, list_jobs, job_detail, resolve_step, ...), see and change only the caller's tenants.
-- Two permissive policies a table, OR'ed:
--   * tenant_scope, to every role: a row is visible when the call's scope (_tenant_scope, once
--     per statement as an InitPlan) is NULL, i.e. an unbound role without x_jobs.tenant, or
--     holds the row's tenant (job_error and step: their job's).
--   * owner_functions, to x_jobs_owner alone (or the installer that owns the objects): true.
--     FORCE makes the owner subject to the policies, and the owner is who runs the SECURITY
--     DEFINER functions (enqueue, claim, the settles, steps, publish, the outbox): for it the
--     planner folds `true OR ...` to true, so the claim and settle path pays nothing per row nor
--     per statement. Those functions scope themselves, from _tenant_scope() computed once per
--     call, which reads _caller(), not current_user. Nobody logs in as x_jobs_owner nor is a
--     member of it (05-roles.sql).
-- A superuser bypasses row-level security, as ever.
ALTER TABLE x_jobs.job ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.job FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.job
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

ALTER TABLE x_jobs.outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.outbox
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

ALTER TABLE x_jobs.event ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.event FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.event
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

ALTER TABLE x_jobs.job_error ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.job_error FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.job_error
USING (
    (SELECT x_jobs._tenant_scope()) IS NULL
    OR EXISTS (
        SELECT FROM x_jobs.job AS j
        WHERE j.id = job_error.job_id AND j.tenant_id = any((SELECT x_jobs._tenant_scope())::text[])
    )
);

ALTER TABLE x_jobs.step ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.step FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.step
USING (
    (SELECT x_jobs._tenant_scope()) IS NULL
    OR EXISTS (
        SELECT FROM x_jobs.job AS j
        WHERE j.id = step.job_id AND j.tenant_id = any((SELECT x_jobs._tenant_scope())::text[])
    )
);

-- The webhook ledger: an admin repairs it by hand (SELECT, DELETE), a bound one its tenants' rows.
ALTER TABLE x_jobs.webhook_ledger ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.webhook_ledger FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.webhook_ledger
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

-- The owner policies, one a table: to x_jobs_owner, who owns the functions that run as their
-- owner; where an install by a database owner left the objects to it (no x_jobs_owner, see
-- 05-roles.sql), to that installer, who then owns them.
DO $$
DECLARE
    v_owner name := CASE
        WHEN EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_owner') THEN 'x_jobs_owner'
        ELSE current_user
    END;
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['job', 'outbox', 'event', 'job_error', 'step', 'webhook_ledger'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE POLICY owner_functions ON x_jobs.%I TO %I USING (TRUE) WITH CHECK (TRUE)', v_table, v_owner
        );
    END LOOP;
END
$$;

-- Tests: tests/pgtap/46-tenants.sql, tests/python/test_tenants.py
