\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.0'" to load this file. \quit

-- 0.3.9 -> 0.4.0: what real deployments need (issue 19): poolers, installs without a superuser,
-- failover, metrics, bulk operations and declarations in the database.
--   * CREATE EXTENSION by a database owner who is not a superuser: the control file
--     says superuser = true (PostgreSQL honours trusted = true only then), so the scripts run
--     as the bootstrap superuser, which may create the cluster-wide roles. The roles are made
--     and linked by x_jobs._setup_roles (new), which grants the extension's owner the three
--     roles WITH ADMIN OPTION (to grant them to its logins) and refuses x_jobs roles that carry
--     more than x_jobs's rights (X_ROLE_UNSAFE, XJ041); `x-jobs install` by a role that may not
--     create or link them is refused with the statements an administrator runs first
--     (X_ROLES_MISSING, XJ042).
--   * Every object belongs to x_jobs_owner (new role, NOLOGIN, no members, pg_read_all_stats),
--     handed over by x_jobs._adopt (new): the functions that run as their owner ran as the
--     superuser who installed the extension.
--   * x_jobs.health() (new): the installed version, the roles, the owner of the functions that
--     run as their owner, and whether claim's restart grace may read the WAL writer's start;
--     to workers, admins and pg_monitor.

-- The roles. Roles belong to the whole server, so a second database finds them made and linked
-- and its install only checks them.
--
--   x_jobs_producer < x_jobs_worker < x_jobs_admin
--       granted to a deployment's logins: a worker is a producer too (a job may enqueue jobs),
--       an admin is a worker.
--   x_jobs_owner
--       owns every object of the schema (x_jobs._adopt), so that the functions that run as
--       their owner (SECURITY DEFINER) run with the rights on x_jobs's tables and
--       pg_read_all_stats (the restart grace, x_jobs._ready_since), not with a superuser's.
--       CREATE EXTENSION runs the scripts as a superuser (the bootstrap superuser when a
--       database owner installs: see x_jobs.control), whose objects would otherwise be, and a
--       flaw in any of those functions would then be a superuser's. Nobody logs in as it and
--       nobody is made a member of it: it owns the x_jobs objects of every database.
--
-- The installer (the extension's owner, or under `x-jobs install` the caller) gets the three
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

-- Creates and links the roles that are missing, and grants the installer the three roles WITH
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

    FOREACH v_role IN ARRAY ARRAY['x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin']::name [] LOOP
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
        FOREACH v_role IN ARRAY ARRAY['x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin']::name [] LOOP
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

SELECT x_jobs._setup_roles();

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

-- The catalogue of refusals: every SQLSTATE an x_jobs function raises, its X_ code, what it
-- means. The README's table is checked against it by the tests.
CREATE OR REPLACE FUNCTION x_jobs.error_codes()
RETURNS TABLE (sqlstate text, code text, meaning text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES
        ('XJ001', 'X_NAME_INVALID', 'A job name is missing, empty or longer than 200 characters.'),
        ('XJ002', 'X_QUEUE_INVALID', 'A queue name is empty or longer than 200 characters.'),
        ('XJ003', 'X_PAYLOAD_TOO_LARGE', 'An input, output or event payload, or an outbox message''s payload and headers together, is larger than x_jobs.max_payload_bytes.'),
        ('XJ004', 'X_MAX_ATTEMPTS_INVALID', 'max_attempts is below 1.'),
        ('XJ005', 'X_PRIORITY_INVALID', 'priority is outside -32768..32767.'),
        ('XJ006', 'X_TENANT_INVALID', 'tenant_id is empty or longer than 200 characters.'),
        ('XJ007', 'X_CONCURRENCY_INVALID', 'A concurrency limit is below 1 or given without a key, or the key is empty or longer than 400 characters.'),
        ('XJ008', 'X_BACKOFF_INVALID', 'backoff_base or backoff_max is negative, or base exceeds max.'),
        ('XJ009', 'X_JOBS_INVALID', 'enqueue_many got something other than an array of request objects, or a field of the wrong JSON type (receive_webhook: a request that is not an object); an idempotency_key is empty or longer than 400 characters, a traceparent longer than 512 or enqueued_by than 200.'),
        ('XJ010', 'X_QUEUES_INVALID', 'The queue list is missing, empty or holds an empty name.'),
        ('XJ011', 'X_WORKER_INVALID', 'A worker id is missing, empty or longer than 400 characters.'),
        ('XJ012', 'X_LEASE_INVALID', 'A lease is missing, not positive, or longer than 1000 years.'),
        ('XJ013', 'X_QTY_INVALID', 'qty or a page size is outside 1..1000 (outbox_redrive max_rows: 1..100000).'),
        ('XJ014', 'X_JOB_NOT_FOUND', 'No job has this id.'),
        ('XJ015', 'X_JOB_NOT_RETRYABLE', 'retry was asked of a row that is live or done.'),
        ('XJ016', 'X_STATE_UNKNOWN', 'A state name is not one of the job states.'),
        ('XJ017', 'X_IDEMPOTENCY_CONFLICT', 'A live row already holds the idempotency key.'),
        ('XJ018', 'X_DELAY_INVALID', 'A retry delay is negative.'),
        ('XJ019', 'X_TTL_INVALID', 'A worker announce ttl is missing, not positive, or longer than 1000 years.'),
        ('XJ020', 'X_RETENTION_INVALID', 'A purge or rollup_counters got a missing or negative age, an age over 1000 years, or a batch below 1.'),
        ('XJ021', 'X_OUTPUTS_INVALID', 'complete_many got a different number of outputs than ids.'),
        ('XJ022', 'X_ISOLATION_UNSUPPORTED', 'claim, publish, step_wait, relay_outbox or receive_webhook ran in a REPEATABLE READ or SERIALIZABLE transaction.'),
        ('XJ023', 'X_ERROR_MISSING', 'fail or outbox_nack was called without an error message.'),
        ('XJ024', 'X_STEP_INVALID', 'A step name is missing, empty or longer than 200 characters.'),
        ('XJ025', 'X_TIMEOUT_INVALID', 'A sleep is missing or negative, or a wait timeout is negative; either ends past the year 9999.'),
        ('XJ026', 'X_JOB_NOT_HELD', 'A step function was called by a worker that does not hold the job.'),
        ('XJ027', 'X_STEP_CONFLICT', 'A step name is already used by a step of another kind in the run.'),
        ('XJ028', 'X_EVENT_INVALID', 'An event name is missing, empty or longer than 200 characters, or its key is longer than 400.'),
        ('XJ029', 'X_MATCH_INVALID', 'A wait''s match is not a JSON object.'),
        ('XJ030', 'X_JOB_HELD', 'resolve_step was asked of a job that a worker holds (running).'),
        ('XJ031', 'X_STEP_NOT_FOUND', 'The job has no step of this name.'),
        ('XJ032', 'X_STEP_NOT_WAITING', 'resolve_step was asked of a step that is not waiting.'),
        ('XJ033', 'X_PROGRESS_INVALID', 'Progress is negative, past its total, or its note is too long.'),
        ('XJ034', 'X_TOPIC_INVALID', 'An outbox topic is missing, empty or longer than 200 characters.'),
        ('XJ035', 'X_MESSAGE_INVALID', 'An outbox message has no payload, headers that are not an object of strings, a key longer than 400 characters, an unknown field or one of the wrong type, or is not an object.'),
        ('XJ036', 'X_RELAY_INVALID', 'A relay id is missing or empty.'),
        ('XJ037', 'X_WEBHOOK_INVALID', 'receive_webhook got no source or no webhook id, or one longer than 200 characters.'),
        ('XJ038', 'X_CLOCK_REFUSED', 'x_jobs.fake_now (the test clock) is set in a session whose login role is not a superuser.'),
        ('XJ039', 'X_TIME_INVALID', 'A run_at (enqueue) or retry_at (outbox_nack) is infinite or outside the years 1 to 9999 (UTC).'),
        ('XJ040', 'X_SETTING_INVALID', 'x_jobs.max_payload_bytes is set to something other than a whole number of bytes from 1 to 2147483647.'),
        ('XJ041', 'X_ROLE_UNSAFE', 'An install or update found an x_jobs role that can log in, has an attribute, or is a member of a role outside x_jobs''s (x_jobs_owner: has a member).'),
        ('XJ042', 'X_ROLES_MISSING', 'x-jobs install by a role that may not create or link the missing x_jobs roles; the hint lists what an administrator runs first.'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
$$;

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.0'::text
$$;

-- What a deployment should fix about this installation, one row per check: its name, whether it
-- holds, what was found, and the fix (NULL when it holds). Workers log the failing checks when
-- they start, and `x-jobs install` prints them. Catalog reads only, no x_jobs table, so it is
-- cheap and a monitor may call it. It runs as the caller: every catalog it reads is open to
-- every role, and pg_has_role(owner, 'pg_read_all_stats', 'USAGE') is the very rule by which
-- pg_stat_activity shows other sessions' start times to claim's owner, so the caller needs no
-- right to see them itself.
--
--   version         the installed version, and how: an extension (and whose) or x-jobs install;
--                   fails when the extension's recorded version and x_jobs.version() differ.
--   roles           x_jobs_producer < x_jobs_worker < x_jobs_admin exist and are linked, and no
--                   x_jobs role has more than x_jobs made it with (x_jobs._role_problems).
--   function_owner  the functions that run as their owner have one owner: x_jobs_owner, or the
--                   role that ran `x-jobs install` without being a superuser.
--   restart_grace   that owner may read the WAL writer's start (pg_read_all_stats). If not,
--                   claim's restart grace counts from the postmaster's start (x_jobs._ready_since),
--                   which can be long before a crash recovery ended: the first claims after it
--                   may take jobs whose workers had no time to renew their leases.
CREATE FUNCTION x_jobs.health()
RETURNS TABLE (check_name text, ok boolean, detail text, hint text)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH ext AS (
        SELECT e.extversion, pg_catalog.pg_get_userbyid(e.extowner) AS owner
        FROM pg_catalog.pg_extension AS e
        WHERE e.extname = 'x_jobs'
    ),
    definer AS (
        SELECT
            pg_catalog.array_agg(o.owner ORDER BY o.owner) AS owners,
            pg_catalog.string_agg(pg_catalog.quote_ident(o.owner), ', ' ORDER BY o.owner) AS named
        FROM (
            SELECT DISTINCT pg_catalog.pg_get_userbyid(p.proowner)::text AS owner
            FROM pg_catalog.pg_proc AS p
            WHERE p.pronamespace = 'x_jobs'::regnamespace AND p.prosecdef
        ) AS o
    ),
    blind AS (
        SELECT
            pg_catalog.array_agg(o.owner ORDER BY o.owner) AS owners,
            pg_catalog.string_agg(pg_catalog.quote_ident(o.owner), ', ' ORDER BY o.owner) AS named
        FROM definer AS d
        CROSS JOIN LATERAL pg_catalog.unnest(d.owners) AS o (owner)
        WHERE NOT pg_catalog.pg_has_role(o.owner::name, 'pg_read_all_stats', 'USAGE')
    ),
    missing AS (
        SELECT pg_catalog.array_agg(m.statement ORDER BY m.n) AS statements
        FROM (
            SELECT g.n, pg_catalog.format('CREATE ROLE %I NOLOGIN', g.role_name) AS statement
            FROM pg_catalog.unnest(ARRAY['x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin']::name [])
                WITH ORDINALITY AS g (role_name, n)
            WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = g.role_name)
            UNION ALL
            SELECT l.n, pg_catalog.format('GRANT %I TO %I', l.granted, l.member)
            FROM (
                VALUES
                    (4, 'x_jobs_producer'::name, 'x_jobs_worker'::name),
                    (5, 'x_jobs_worker'::name, 'x_jobs_admin'::name)
            ) AS l (n, granted, member)
            WHERE NOT EXISTS (
                SELECT FROM pg_catalog.pg_auth_members AS a
                JOIN pg_catalog.pg_roles AS g ON g.oid = a.roleid
                JOIN pg_catalog.pg_roles AS u ON u.oid = a.member
                WHERE g.rolname = l.granted AND u.rolname = l.member
            )
        ) AS m
    ),
    unsafe AS (
        SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', p.role_name, p.problem), ', ') AS problems
        FROM x_jobs._role_problems() AS p
    )
    -- In this order, whatever plan the UNION gets.
    SELECT c.check_name, c.ok, c.detail, c.hint
    FROM (
        SELECT
            1,
            'version',
            e.extversion IS NULL OR e.extversion = x_jobs.version(),
            CASE
                WHEN NOT EXISTS (SELECT FROM ext) THEN
                    pg_catalog.format('x_jobs %s, installed by x-jobs install (no extension)', x_jobs.version())
                WHEN e.extversion = x_jobs.version() THEN
                    pg_catalog.format('x_jobs %s, the extension owned by %I', x_jobs.version(), e.owner)
                ELSE pg_catalog.format('the extension says x_jobs %s, its functions say %s', e.extversion, x_jobs.version())
            END,
            CASE WHEN e.extversion <> x_jobs.version() THEN 'Run ALTER EXTENSION x_jobs UPDATE.' END
        FROM (SELECT) AS one
        LEFT JOIN ext AS e ON TRUE
        UNION ALL
        SELECT
            2,
            'roles',
            m.statements IS NULL AND u.problems IS NULL,
            CASE
                WHEN m.statements IS NULL AND u.problems IS NULL THEN
                    'x_jobs_producer, x_jobs_worker and x_jobs_admin exist, each a member of the one before'
                ELSE pg_catalog.concat_ws('; ',
                    CASE WHEN m.statements IS NOT NULL THEN 'the x_jobs roles are missing or unlinked' END,
                    u.problems)
            END,
            NULLIF(pg_catalog.concat_ws(' ',
                CASE WHEN m.statements IS NOT NULL THEN
                    pg_catalog.format('An administrator runs: %s;', pg_catalog.array_to_string(m.statements, '; '))
                END,
                CASE WHEN u.problems IS NOT NULL THEN
                    'An administrator makes each x_jobs role NOLOGIN with no other attribute and a member of none but '
                    'the x_jobs role below it (x_jobs_owner: of pg_read_all_stats), grants x_jobs_owner to nobody, '
                    'and grants other rights to the logins instead.'
                END
            ), '')
        FROM missing AS m, unsafe AS u
        UNION ALL
        SELECT
            3,
            'function_owner',
            pg_catalog.cardinality(d.owners) = 1,
            pg_catalog.format('the functions that run as their owner run as %s', d.named),
            CASE WHEN pg_catalog.cardinality(d.owners) <> 1 THEN
                'A superuser runs: SELECT x_jobs._adopt(); (it hands every x_jobs object to x_jobs_owner)'
            END
        FROM definer AS d
        UNION ALL
        SELECT
            4,
            'restart_grace',
            b.owners IS NULL,
            CASE
                WHEN b.owners IS NULL THEN
                    pg_catalog.format('claim runs as %s, which may read the WAL writer''s start: the restart grace '
                        'counts from when the server last began to take connections', d.named)
                ELSE pg_catalog.format('claim runs as %s, which may not read other sessions'' start times '
                    '(pg_read_all_stats): the restart grace counts from the postmaster''s start instead, and after a '
                    'crash recovery a claim may take jobs whose workers had no time to renew their leases', b.named)
            END,
            CASE WHEN b.owners IS NOT NULL THEN
                pg_catalog.format('An administrator runs: GRANT pg_read_all_stats TO %s;', b.named)
            END
        FROM definer AS d, blind AS b
    ) AS c (n, check_name, ok, detail, hint)
    ORDER BY c.n
$$;

-- Nothing is left to PUBLIC; the health of the installation to workers (so admins) and monitors
-- (see x_jobs.sql's Grants).
REVOKE ALL ON FUNCTION x_jobs._role_problems(), x_jobs._setup_roles(), x_jobs._adopt(), x_jobs.health() FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.health(), x_jobs._role_problems() TO x_jobs_worker, pg_monitor;

------------------------------------------------------------------------------------------------
-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
------------------------------------------------------------------------------------------------

SELECT x_jobs._adopt();
