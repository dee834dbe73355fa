-- The roles. Roles belong to the whole server, so a second database finds them made and linked
-- and its install only checks them.
--
--   x_jobs_producer < x_jobs_worker < x_jobs_admin
--       granted to a deployment's logins: a worker is a producer too (a job may enqueue jobs),
--       an admin is a worker.
--   x_jobs_webhook
--       granted to the login of a webhook receiver (x_jobs.webhooks.Receiver, or any
--       service that calls receive_webhook), and the only role that may call it: whoever
--       records a webhook id decides what the real, signed delivery of that id becomes (a
--       duplicate, dropped), so only the process that verified the signature may. A member of
--       no other x_jobs role, and no x_jobs role is a member of it, x_jobs_admin included:
--       an admin repairs the ledger through its table rights (SELECT, DELETE) and
--       purge_webhook_ledger, and never needs to register an id.
--   x_jobs_owner
--       owns every object of the schema (x_jobs._adopt), so that the functions that run as
--       their owner (SECURITY DEFINER) run with the rights on x_jobs's tables and
--       pg_read_all_stats (the restart grace, x_jobs._ready_since), not with a superuser's.
--       CREATE EXTENSION runs the scripts as a superuser (the bootstrap superuser when a
--       database owner installs: see x_jobs.control), whose objects would otherwise be, and a
--       flaw in any of those functions would then be a superuser's. Nobody logs in as it and
--       nobody is made a member of it: it owns the x_jobs objects of every database.
--
-- The installer (the extension's owner, or under `x-jobs install` the caller) gets the four
-- roles WITH ADMIN OPTION, so that a database owner without CREATEROLE can grant them to its
-- own logins. The extension's owner is read from pg_extension, not substituted into the script
-- (CREATE EXTENSION's extowner substitution): an update run by a superuser would name that
-- superuser, and a name substituted into a literal breaks on a quote.

-- What makes an existing role of x_jobs's names more than x_jobs made it, one row per problem:
-- a login, an attribute, membership in a role outside the chain (x_jobs_owner: but
-- pg_read_all_stats), and for x_jobs_owner any member. Granting such a role to the installer,
-- or letting it own this database's objects, would hand on rights that are not x_jobs's to
-- give. _setup_roles refuses them, health() reports them. PostgreSQL 16 records the implicit
-- ADMIN OPTION of a role's non-superuser creator as a member: an x_jobs_owner made in advance
-- by a role with CREATEROLE is refused for it.
CREATE FUNCTION x_jobs._role_problems()
RETURNS TABLE (role_name name, problem text)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH expected (role_name, may_be_in) AS (
        VALUES
            ('x_jobs_producer'::name, '{}'::name []),
            ('x_jobs_worker'::name, '{x_jobs_producer}'::name []),
            ('x_jobs_admin'::name, '{x_jobs_worker}'::name []),
            ('x_jobs_webhook'::name, '{}'::name []),
            ('x_jobs_owner'::name, '{pg_read_all_stats}'::name [])
    )
    SELECT DISTINCT r.rolname, p.problem
    FROM expected AS x
    JOIN pg_catalog.pg_roles AS r ON r.rolname = x.role_name
    CROSS JOIN LATERAL (
        SELECT 'can log in' WHERE r.rolcanlogin
        UNION ALL SELECT 'is a superuser' WHERE r.rolsuper
        UNION ALL SELECT 'has CREATEROLE' WHERE r.rolcreaterole
        UNION ALL SELECT 'has CREATEDB' WHERE r.rolcreatedb
        UNION ALL SELECT 'has REPLICATION' WHERE r.rolreplication
        UNION ALL SELECT 'has BYPASSRLS' WHERE r.rolbypassrls
        UNION ALL
        SELECT pg_catalog.format('is a member of %I', g.rolname)
        FROM pg_catalog.pg_auth_members AS m
        JOIN pg_catalog.pg_roles AS g ON g.oid = m.roleid
        WHERE m.member = r.oid AND g.rolname <> ALL (x.may_be_in)
        UNION ALL
        SELECT pg_catalog.format('has the member %I', u.rolname)
        FROM pg_catalog.pg_auth_members AS m
        JOIN pg_catalog.pg_roles AS u ON u.oid = m.member
        WHERE m.roleid = r.oid AND x.role_name = 'x_jobs_owner'
    ) AS p (problem)
    ORDER BY 1, 2
$$;

-- Creates and links the roles that are missing, and grants the installer the four roles WITH
-- ADMIN OPTION, as whoever runs the script. Each install and update script runs it before it
-- makes anything else. Under CREATE EXTENSION that is a superuser, which may do it all. Under
-- `x-jobs install` by a database owner without CREATEROLE, what it may not do is refused with
-- every statement an administrator runs first, its owner's name filled in (X_ROLES_MISSING):
-- the refusal rolls the whole install back, so the list is all of them, not the ones that
-- failed. Not granting the installer ADMIN OPTION refuses nothing (an administrator may grant
-- the roles to logins itself). x_jobs_owner is made only by a superuser: another installer
-- keeps its objects (x_jobs._adopt), and then wants pg_read_all_stats for itself, which the
-- refusal lists too.
CREATE FUNCTION x_jobs._setup_roles()
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_installer name := coalesce(
        (SELECT pg_catalog.pg_get_userbyid(e.extowner) FROM pg_catalog.pg_extension AS e WHERE e.extname = 'x_jobs'),
        current_user
    );
    v_installer_super boolean := (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_installer);
    v_super boolean := (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user);
    v_unsafe text;
    v_role name;
    v_required text[] := ARRAY[]::text[];
    v_granted name[] := ARRAY[]::name[];
    v_statement text;
    v_refused boolean := FALSE;
BEGIN
    -- x_jobs_owner is to own this database's objects (when a superuser runs this, see _adopt);
    -- the others are to be granted to a non-superuser installer. A superuser is granted nothing.
    SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', p.role_name, p.problem), ', ')
    INTO v_unsafe
    FROM x_jobs._role_problems() AS p
    WHERE CASE WHEN p.role_name = 'x_jobs_owner' THEN v_super ELSE NOT v_installer_super END;
    IF v_unsafe IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ041',
            MESSAGE = pg_catalog.format('X_ROLE_UNSAFE: x_jobs will not use roles with more than its rights: %s',
                v_unsafe),
            HINT = 'An administrator makes each x_jobs role NOLOGIN with no other attribute and a member of none '
                'but the x_jobs role below it (x_jobs_owner: of pg_read_all_stats), grants x_jobs_owner to nobody, '
                'and grants other rights to the logins instead (ALTER ROLE, REVOKE); then install again.';
    END IF;

    FOREACH v_role IN ARRAY ARRAY['x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin', 'x_jobs_webhook']::name [] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_role) THEN
            v_required := v_required || pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
        END IF;
    END LOOP;
    -- The links, read from the catalog rather than pg_has_role, which fails on a missing role.
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_auth_members AS m
        WHERE m.roleid = (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_producer')
            AND m.member = (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_worker')
    ) THEN
        v_required := v_required || 'GRANT x_jobs_producer TO x_jobs_worker'::text;
    END IF;
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_auth_members AS m
        WHERE m.roleid = (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_worker')
            AND m.member = (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_admin')
    ) THEN
        v_required := v_required || 'GRANT x_jobs_worker TO x_jobs_admin'::text;
    END IF;
    IF v_super THEN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_owner') THEN
            v_required := v_required || 'CREATE ROLE x_jobs_owner NOLOGIN'::text
                || 'GRANT pg_read_all_stats TO x_jobs_owner'::text;
        ELSIF NOT pg_catalog.pg_has_role('x_jobs_owner', 'pg_read_all_stats', 'MEMBER') THEN
            v_required := v_required || 'GRANT pg_read_all_stats TO x_jobs_owner'::text;
        END IF;
    END IF;

    FOREACH v_statement IN ARRAY v_required LOOP
        BEGIN
            EXECUTE v_statement;
        EXCEPTION WHEN insufficient_privilege OR undefined_object THEN
            v_refused := TRUE;  -- not allowed, or a role that could not be made
        END;
    END LOOP;

    -- The roles exist now (or the install is refused below): which of them may the installer
    -- not grant yet?
    IF NOT v_installer_super THEN
        FOREACH v_role IN ARRAY ARRAY['x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin', 'x_jobs_webhook']::name [] LOOP
            -- Apart: pg_has_role fails on a missing role, and OR may evaluate either side first.
            IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_role) THEN
                v_granted := v_granted || v_role;
            ELSIF NOT pg_catalog.pg_has_role(v_installer, v_role, 'MEMBER WITH ADMIN OPTION') THEN
                v_granted := v_granted || v_role;
            END IF;
        END LOOP;
    END IF;
    IF v_refused THEN
        IF pg_catalog.cardinality(v_granted) > 0 THEN
            v_required := v_required || pg_catalog.format('GRANT %s TO %I WITH ADMIN OPTION',
                (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(g.r), ', ') FROM pg_catalog.unnest(v_granted) AS g (r)),
                v_installer);
        END IF;
        IF NOT pg_catalog.pg_has_role(v_installer, 'pg_read_all_stats', 'USAGE') THEN
            v_required := v_required || pg_catalog.format('GRANT pg_read_all_stats TO %I', v_installer);
        END IF;
        RAISE EXCEPTION USING
            ERRCODE = 'XJ042',
            MESSAGE = pg_catalog.format('X_ROLES_MISSING: role %I may not create or link the x_jobs roles', current_user),
            HINT = pg_catalog.format('An administrator runs first: %s; then install again.',
                pg_catalog.array_to_string(v_required, '; '));
    END IF;
    IF pg_catalog.cardinality(v_granted) > 0 THEN
        BEGIN
            EXECUTE pg_catalog.format('GRANT %s TO %I WITH ADMIN OPTION',
                (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(g.r), ', ') FROM pg_catalog.unnest(v_granted) AS g (r)),
                v_installer);
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;  -- an administrator grants the roles to the logins
        END;
    END IF;
END
$$;

-- Hands every object of the schema to x_jobs_owner (see the roles above): the schema, tables,
-- sequences, types and functions; indexes, the sequences of identity columns and the row
-- types of tables follow their table. Each install and update script calls it once it made
-- its objects. pg_dump writes an extension's privileges as changes from pg_init_privs, which
-- records an object's privileges at each GRANT or REVOKE of the script and which ALTER ...
-- OWNER leaves naming the old owner (PostgreSQL 15): every object handed over that has
-- privileges already is granted to its new owner once more (a change of nothing), which
-- records them anew (with any granted by hand since, as every GRANT of an update script does).
-- Only a superuser may give an object to a role it is not a member of: under `x-jobs install`
-- by another role the objects stay that role's, and this does nothing.
CREATE FUNCTION x_jobs._adopt()
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner oid := (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_owner');
    v_object record;
    v_regrants text[] := ARRAY[]::text[];
    v_statement text;
BEGIN
    IF v_owner IS NULL
        OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
        RETURN;
    END IF;
    FOR v_object IN
        SELECT 'SCHEMA' AS kind, pg_catalog.quote_ident(n.nspname) AS name, n.nspacl IS NOT NULL AS granted,
            FALSE AS follows
        FROM pg_catalog.pg_namespace AS n
        WHERE n.nspname = 'x_jobs' AND n.nspowner <> v_owner
        UNION ALL
        SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.oid::regclass::text, c.relacl IS NOT NULL,
            EXISTS (
                SELECT FROM pg_catalog.pg_depend AS d
                WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid
                    AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.deptype IN ('a', 'i')
            )
        FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = 'x_jobs'::regnamespace AND c.relowner <> v_owner
            AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
        UNION ALL
        SELECT 'TYPE', t.oid::regtype::text, t.typacl IS NOT NULL, FALSE
        FROM pg_catalog.pg_type AS t
        LEFT JOIN pg_catalog.pg_class AS c ON c.oid = t.typrelid
        WHERE t.typnamespace = 'x_jobs'::regnamespace AND t.typowner <> v_owner
            AND t.typtype IN ('c', 'd', 'e', 'r') AND (t.typrelid = 0 OR c.relkind = 'c')
        UNION ALL
        SELECT 'ROUTINE', p.oid::regprocedure::text, p.proacl IS NOT NULL, FALSE
        FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = 'x_jobs'::regnamespace AND p.proowner <> v_owner AND p.prokind IN ('f', 'p')
    LOOP
        IF NOT v_object.follows THEN
            EXECUTE pg_catalog.format('ALTER %s %s OWNER TO x_jobs_owner', v_object.kind, v_object.name);
        END IF;
        IF v_object.granted THEN
            v_regrants := v_regrants || pg_catalog.format('GRANT ALL ON %s %s TO x_jobs_owner',
                CASE v_object.kind WHEN 'TABLE' THEN '' ELSE v_object.kind END, v_object.name);
        END IF;
    END LOOP;
    -- After every ALTER: a sequence is handed over with its table.
    FOREACH v_statement IN ARRAY v_regrants LOOP
        EXECUTE v_statement;
    END LOOP;
END
$$;

SELECT x_jobs._setup_roles();

-- Tests: tests/pgtap/52-health.sql, tests/pgtap/80-privileges.sql,
--        tests/python/test_nonsuperuser_install.py, tests/python/test_install.py,
--        scripts/check-upgrade
