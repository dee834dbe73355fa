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
--   * Bulk operations: cancel_jobs and retry_jobs act on every job that matches filters (queue,
--     name, state, tenant, created range), in bounded batches; list_jobs takes a job name (a new
--     parameter, so it is dropped and created again). New refusals XJ044 X_STATE_NOT_ALLOWED
--     and XJ045 X_RANGE_EMPTY.
--   * Metrics: x_jobs.queue_gauges(max_age), the live rows per queue and state for the workers'
--     gauges, counted at most once per max_age however many workers ask, from a one-row
--     snapshot table x_jobs.queue_snapshot; granted to x_jobs_worker and pg_monitor. Its
--     refusal XJ051 X_MAX_AGE_INVALID joins error_codes().

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
        ('XJ013', 'X_QTY_INVALID', 'qty or a page size is outside 1..1000 (outbox_redrive max_rows: 1..100000; cancel_jobs and retry_jobs max_rows: 1 or more).'),
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
        ('XJ044', 'X_STATE_NOT_ALLOWED', 'cancel_jobs was asked for a state that is not live, or retry_jobs for one that is not dead, failed or cancelled.'),
        ('XJ045', 'X_RANGE_EMPTY', 'cancel_jobs or retry_jobs got a created_after at or after its created_before.'),
        ('XJ051', 'X_MAX_AGE_INVALID', 'A queue_gauges max_age is missing, negative, or longer than a day.'),
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

-- The refusals cancel_jobs and retry_jobs share, and the states a call acts on: `p_state` when
-- given, else `p_default`. A state that is no job state is X_STATE_UNKNOWN (as list_jobs); a
-- job state the caller does not act on (cancel_jobs(state => 'done')) is X_STATE_NOT_ALLOWED,
-- so that a call that could change nothing says why instead of answering 0. `p_verb` and
-- `p_hint` are the caller's words for that refusal. An empty created range is refused too: it
-- is a mistake (the bounds swapped), and its answer of 0 would read as "nothing to do".
CREATE FUNCTION x_jobs._bulk_states(
    p_verb text,
    p_state text,
    p_allowed x_jobs.job_state[],
    p_default x_jobs.job_state[],
    p_hint text,
    p_created_before timestamptz,
    p_created_after timestamptz,
    p_max_rows integer
)
RETURNS x_jobs.job_state[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_state IS NOT NULL AND p_state <> ALL (pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ016',
            MESSAGE = pg_catalog.format('X_STATE_UNKNOWN: %L is not a job state', p_state),
            HINT = 'Use one of: ' || pg_catalog.array_to_string(
                pg_catalog.enum_range(NULL::x_jobs.job_state)::text[], ', ') || '.';
    END IF;
    IF p_state IS NOT NULL AND p_state::x_jobs.job_state <> ALL (p_allowed) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ044',
            MESSAGE = pg_catalog.format('X_STATE_NOT_ALLOWED: cannot %s jobs that are %s', p_verb, p_state),
            HINT = p_hint;
    END IF;
    IF p_max_rows < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is below 1', p_max_rows),
            HINT = 'Pass max_rows of 1 or more and call again while the answer equals it, '
                'or NULL for every matching job.';
    END IF;
    IF p_created_after >= p_created_before THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ045',
            MESSAGE = pg_catalog.format('X_RANGE_EMPTY: created_after %s is not before created_before %s',
                p_created_after, p_created_before),
            HINT = 'Both bounds are exclusive: pass a created_after earlier than created_before '
                '(were they swapped?), or only one of them.';
    END IF;
    IF p_state IS NULL THEN
        RETURN p_default;
    END IF;
    RETURN ARRAY[p_state::x_jobs.job_state];
END
$$;

-- Cancel every live job that matches the filters given, each NULL (the default) matching any:
-- `queue`, `name`, `state` (ready, delayed, suspended or running; NULL: all four), `tenant_id`,
-- and a creation time strictly before `created_before` and after `created_after`. Each row as
-- x_jobs.cancel cancels it, the same result as calling it row by row: finished now, a running
-- one loses its worker (claimed_by and the lease cleared, so its settle does nothing and its
-- heartbeat drops the id, the body's signal to stop), and the job name's counter bucket counts
-- it. Answers how many it cancelled; with dry_run, how many would be, changing nothing. With
-- max_rows, at most that many, oldest id first: a caller cancels a big backlog in transactions
-- of its own size by calling again until the answer is below max_rows.
--
-- The walk. The live rows are all in the claim's partial indexes (the done history is in none of
-- them), read first, without locks, for their count and their lowest and highest id. The rows
-- between are then walked by primary key, a batch of 5,000 per statement that locks and cancels
-- them, so that no statement sorts or holds more than a batch, and the history between live
-- rows is read once per call, not once per batch; a call made again after a first one starts at
-- the oldest row still live, not at the rows the first one cancelled.
--
-- Locks. A row another transaction holds (a worker settling or heartbeating it, a claim taking
-- it) is waited for, as cancel waits: it is then cancelled if it is still live, or left if it
-- settled first, so neither the settlement nor the cancel is lost. SKIP LOCKED would lose the
-- cancel of a row a claim held for an instant: it would run on. Those holders are statements or
-- short transactions, and they take rows in id order (the heartbeat, the settlers, the Python
-- worker's settling transaction), as this walk does, so the waits cannot close into a deadlock.
-- The counters are added at the end, once, when every row is held: a settler waits for a row of
-- this call before it counts, never while it holds a counter row this call waits for. Claims
-- pass over the rows this call holds. They stay held until the caller's transaction ends: pass
-- max_rows and commit between calls (x-jobs does) so that workers' heartbeats of those rows
-- never wait long.
CREATE FUNCTION x_jobs.cancel_jobs(
    queue text DEFAULT NULL,
    name text DEFAULT NULL,
    state text DEFAULT NULL,
    tenant_id text DEFAULT NULL,
    created_before timestamptz DEFAULT NULL,
    created_after timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL,
    dry_run boolean DEFAULT FALSE
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for each statement's values: the states become constants, which prove the partial
-- indexes' predicates (and drop the arms of the states not asked for), and every filter left
-- NULL folds away.
SET plan_cache_mode = force_custom_plan
-- Index plans only: the live rows through the claim's indexes, the walk through the primary key
-- in id order, the order the rows are locked in. Statistics taken before a backlog arrived make
-- a sequential scan and a sort of every batch look cheaper; a bitmap scan would read the walk's
-- range in the table's order and sort it.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_batch constant integer := 5000;
    v_states x_jobs.job_state[];
    v_count bigint;
    v_after bigint;
    v_last bigint;
    v_limit integer;
    v_n integer;
    v_done bigint := 0::bigint;
    v_names text[] := ARRAY[]::text[];
    v_counts bigint[] := ARRAY[]::bigint[];
    v_batch_names text[];
    v_batch_counts bigint[];
BEGIN
    v_states := x_jobs._bulk_states('cancel', cancel_jobs.state,
        ARRAY['ready', 'delayed', 'suspended', 'running']::x_jobs.job_state[],
        ARRAY['ready', 'delayed', 'suspended', 'running']::x_jobs.job_state[],
        'Cancel jobs that are ready, delayed, suspended or running (leave state out for all four); '
        'a finished job stays as it ended.',
        cancel_jobs.created_before, cancel_jobs.created_after, cancel_jobs.max_rows);

    -- Each arm repeats its index's predicate word for word (see job_ready_idx), which is how the
    -- planner may use it; the filters are pushed into every arm.
    SELECT count(*), min(l.id), max(l.id) INTO v_count, v_after, v_last
    FROM (
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state = 'ready' AND j.concurrency_key IS NULL
            AND 'ready' = ANY (v_states)
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
            AND j.state = ANY (v_states) AND v_states && ARRAY['delayed', 'suspended']::x_jobs.job_state[]
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state = 'ready' AND j.concurrency_key IS NOT NULL
            AND 'ready' = ANY (v_states)
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
            AND j.state = ANY (v_states) AND v_states && ARRAY['delayed', 'suspended']::x_jobs.job_state[]
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state = 'running'
            AND 'running' = ANY (v_states)
    ) AS l
    WHERE (cancel_jobs.queue IS NULL OR l.queue = cancel_jobs.queue)
        AND (cancel_jobs.name IS NULL OR l.name = cancel_jobs.name)
        AND (cancel_jobs.tenant_id IS NULL OR l.tenant_id = cancel_jobs.tenant_id)
        AND (cancel_jobs.created_before IS NULL OR l.created_at < cancel_jobs.created_before)
        AND (cancel_jobs.created_after IS NULL OR l.created_at > cancel_jobs.created_after);

    IF cancel_jobs.dry_run OR v_count = 0 THEN
        RETURN LEAST(v_count, coalesce(cancel_jobs.max_rows, v_count));
    END IF;

    v_after := v_after - 1;
    LOOP
        v_limit := LEAST(v_batch, coalesce(cancel_jobs.max_rows - v_done, v_batch))::integer;
        -- Picked once, as an array: see purge. A row that settled while this waited for it is
        -- no longer live, and the lock passes over it to the next.
        WITH cancelled AS (
            UPDATE x_jobs.job AS j
            SET state = 'cancelled',
                visible_at = NULL,
                claimed_by = NULL,
                finished_at = v_now,
                updated_at = v_now
            WHERE j.id = ANY (ARRAY(
                SELECT k.id
                FROM x_jobs.job AS k
                WHERE k.id > v_after AND k.id <= v_last
                    AND k.state = ANY (v_states)
                    AND (cancel_jobs.queue IS NULL OR k.queue = cancel_jobs.queue)
                    AND (cancel_jobs.name IS NULL OR k.name = cancel_jobs.name)
                    AND (cancel_jobs.tenant_id IS NULL OR k.tenant_id = cancel_jobs.tenant_id)
                    AND (cancel_jobs.created_before IS NULL OR k.created_at < cancel_jobs.created_before)
                    AND (cancel_jobs.created_after IS NULL OR k.created_at > cancel_jobs.created_after)
                ORDER BY k.id
                LIMIT v_limit
                FOR NO KEY UPDATE
            ))
                AND j.state = ANY (v_states)
            RETURNING j.id, j.name
        ),
        per_name AS (
            SELECT c.name, count(*) AS n, max(c.id) AS last_id
            FROM cancelled AS c
            GROUP BY c.name
        )
        SELECT coalesce(sum(p.n), 0)::integer, max(p.last_id), pg_catalog.array_agg(p.name),
               pg_catalog.array_agg(p.n)
        INTO v_n, v_after, v_batch_names, v_batch_counts
        FROM per_name AS p;

        v_done := v_done + v_n;
        v_names := v_names || v_batch_names;
        v_counts := v_counts || v_batch_counts;
        EXIT WHEN v_n < v_limit OR v_done = cancel_jobs.max_rows;
    END LOOP;

    -- One row per job name, in name order, so that two calls counting the same names cannot
    -- wait for each other's rows in opposite orders.
    INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, cancelled)
    SELECT t.name, 60, x_jobs._minute(v_now), x_jobs._shard(), sum(t.n)
    FROM unnest(v_names, v_counts) AS t (name, n)
    GROUP BY t.name
    ORDER BY t.name
    ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
    SET cancelled = c.cancelled + excluded.cancelled;

    RETURN v_done;
END
$$;

-- Re-queue every dead and failed job that matches the filters given, each NULL (the default)
-- matching any: `queue`, `name`, `state`, `tenant_id`, and a creation time strictly before
-- `created_before` and after `created_after`. Cancelled jobs only when `state => 'cancelled'`
-- names them: an operator who cancelled a backlog on purpose does not want a bare retry to
-- bring it back. Each row as x_jobs.retry re-queues it, the same result as calling it row by
-- row: due now with all its attempts, the same run_id, its error history kept, and the steps its
-- run resumes with those still in effect (see retry). Answers how many it re-queued; with
-- dry_run, how many would be, changing nothing. With max_rows, at most that many, oldest id
-- first: call again until the answer is below max_rows.
--
-- A row whose idempotency key a live row holds is left as it is (retry refuses it with
-- X_IDEMPOTENCY_CONFLICT), and so is every row but the oldest of those that share a key (the
-- oldest, re-queued, holds it), each skipped row said in one NOTICE at the end; the walk goes on
-- past them, so an answer below max_rows still means that nothing more can be re-queued. A
-- dry run counts the rows of a shared key each, and is then above what the call re-queues.
--
-- The walk: job_ended_idx, which holds only the dead, failed and cancelled rows, in id order, a
-- batch of 5,000 per statement that locks them (as retry locks its row, waiting for a holder:
-- a purge deleting it, another retry) and then re-queues them, so that no statement sorts or
-- holds more than a batch. A batch in which a key was taken between the check and the update
-- (an enqueue that committed meanwhile) is re-queued again one row at a time, through retry.
CREATE FUNCTION x_jobs.retry_jobs(
    queue text DEFAULT NULL,
    name text DEFAULT NULL,
    state text DEFAULT NULL,
    tenant_id text DEFAULT NULL,
    created_before timestamptz DEFAULT NULL,
    created_after timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL,
    dry_run boolean DEFAULT FALSE
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for each statement's values: the states become constants, which prove
-- job_ended_idx's predicate, and every filter left NULL folds away.
SET plan_cache_mode = force_custom_plan
-- Index plans only: the walk through job_ended_idx in id order, the order the rows are locked
-- in, and the steps and live keys by their indexes.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_batch constant integer := 5000;
    v_states x_jobs.job_state[];
    v_after bigint := 0::bigint;
    v_limit integer;
    v_picked integer;
    v_ids bigint[];
    v_id bigint;
    v_n integer;
    v_queues text[];
    v_done bigint := 0::bigint;
    v_skipped bigint := 0::bigint;
BEGIN
    v_states := x_jobs._bulk_states('retry', retry_jobs.state,
        ARRAY['dead', 'failed', 'cancelled']::x_jobs.job_state[],
        ARRAY['dead', 'failed']::x_jobs.job_state[],
        'Retry jobs that are dead or failed (leave state out for both), or cancelled with '
        'state => ''cancelled''; a live job runs already, and a done job is enqueued anew.',
        retry_jobs.created_before, retry_jobs.created_after, retry_jobs.max_rows);

    IF retry_jobs.dry_run THEN
        SELECT count(*)::integer INTO v_n
        FROM (
            SELECT
            FROM x_jobs.job AS k
            WHERE k.state = ANY (v_states)
                AND (retry_jobs.queue IS NULL OR k.queue = retry_jobs.queue)
                AND (retry_jobs.name IS NULL OR k.name = retry_jobs.name)
                AND (retry_jobs.tenant_id IS NULL OR k.tenant_id = retry_jobs.tenant_id)
                AND (retry_jobs.created_before IS NULL OR k.created_at < retry_jobs.created_before)
                AND (retry_jobs.created_after IS NULL OR k.created_at > retry_jobs.created_after)
                AND NOT EXISTS (
                    SELECT FROM x_jobs.job AS l
                    WHERE l.idempotency_key = k.idempotency_key
                        AND l.state IN ('ready', 'delayed', 'suspended', 'running')
                )
            LIMIT retry_jobs.max_rows
        ) AS m;
        RETURN v_n::bigint;
    END IF;

    LOOP
        v_limit := LEAST(v_batch, coalesce(retry_jobs.max_rows - v_done, v_batch))::integer;
        -- The batch, locked, and which of it may be re-queued: rows without a key, and of each
        -- key the oldest, when no live row holds it (job_idempotency_key_idx). A row re-queued
        -- by an earlier batch of this call is live, and holds its key.
        WITH picked AS MATERIALIZED (
            SELECT k.id, k.idempotency_key
            FROM x_jobs.job AS k
            WHERE k.id > v_after
                AND k.state = ANY (v_states)
                AND (retry_jobs.queue IS NULL OR k.queue = retry_jobs.queue)
                AND (retry_jobs.name IS NULL OR k.name = retry_jobs.name)
                AND (retry_jobs.tenant_id IS NULL OR k.tenant_id = retry_jobs.tenant_id)
                AND (retry_jobs.created_before IS NULL OR k.created_at < retry_jobs.created_before)
                AND (retry_jobs.created_after IS NULL OR k.created_at > retry_jobs.created_after)
            ORDER BY k.id
            LIMIT v_limit
            FOR NO KEY UPDATE
        ),
        ranked AS (
            SELECT p.id, p.idempotency_key,
                   pg_catalog.row_number() OVER (PARTITION BY p.idempotency_key ORDER BY p.id) AS nth
            FROM picked AS p
        )
        SELECT count(*)::integer, max(r.id),
               coalesce(pg_catalog.array_agg(r.id ORDER BY r.id) FILTER (
                   WHERE r.idempotency_key IS NULL
                       OR (r.nth = 1 AND NOT EXISTS (
                           SELECT FROM x_jobs.job AS l
                           WHERE l.idempotency_key = r.idempotency_key
                               AND l.state IN ('ready', 'delayed', 'suspended', 'running')
                       ))
               ), ARRAY[]::bigint[])
        INTO v_picked, v_after, v_ids
        FROM ranked AS r;

        IF pg_catalog.cardinality(v_ids) > 0 THEN
            BEGIN
                DELETE FROM x_jobs.step AS s
                WHERE s.job_id = ANY (v_ids)
                    AND (
                        s.status = 'failed'
                        OR EXISTS (
                            SELECT FROM x_jobs.step AS c
                            WHERE c.job_id = s.job_id AND c.name = s.name AND c.compensation
                                AND c.status = 'done'
                        )
                    );
                WITH retried AS (
                    UPDATE x_jobs.job AS j
                    SET state = 'ready',
                        attempt = 0,
                        run_at = v_now,
                        visible_at = NULL,
                        claimed_by = NULL,
                        finished_at = NULL,
                        output = NULL,
                        updated_at = v_now
                    WHERE j.id = ANY (v_ids)
                    RETURNING j.queue
                )
                SELECT count(*)::integer, coalesce(pg_catalog.array_agg(DISTINCT r.queue), ARRAY[]::text[])
                INTO v_n, v_queues
                FROM retried AS r;
                PERFORM pg_catalog.pg_notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
            EXCEPTION
                WHEN unique_violation THEN
                    -- Undone with the block: retry each row as retry does, skipping a taken key.
                    v_n := 0;
                    FOREACH v_id IN ARRAY v_ids LOOP
                        BEGIN
                            PERFORM x_jobs.retry(v_id);
                            v_n := v_n + 1;
                        EXCEPTION
                            WHEN SQLSTATE 'XJ017' THEN
                                NULL;
                        END;
                    END LOOP;
            END;
        ELSE
            v_n := 0;
        END IF;

        v_done := v_done + v_n;
        v_skipped := v_skipped + (v_picked - v_n);
        EXIT WHEN v_picked < v_limit OR v_done = retry_jobs.max_rows;
    END LOOP;

    IF v_skipped > 0 THEN
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format('%s matching jobs were left as they were: a live job holds their idempotency key',
                v_skipped),
            HINT = 'Wait for the live jobs to finish, or cancel them, then retry these.';
    END IF;
    RETURN v_done;
END
$$;

DROP FUNCTION x_jobs.list_jobs(text, text, bigint, integer);

-- The operator's listing: jobs newest first, optionally of one state, one queue and one job
-- name, one page at a time. Keyset paging: pass the last id of a page as before_id to get the next, which
-- costs the same on page 1 and page 1,000 (an OFFSET would read every row it skips).
--
-- Planned for each call's values (see plan_cache_mode below), so the planner sees the state as
-- a constant and may use a partial index whose predicate it implies: dead, failed and cancelled
-- rows walk job_ended_idx newest first, so a listing of 50 dead rows beside a million done ones
-- reads them and no more (a Parallel Seq Scan of the whole table until 0.3.7: 290-460 ms at
-- 1.1M rows). A live state may read its claim arm index and sort what it found, or walk the
-- primary key, whichever costs lower: live rows are bounded by the backlog, not the history.
-- Done rows, and all rows, walk the primary key. A name is a filter on what these read: no
-- index leads with it, and one would cost every enqueue and purge for the operator's reads.
CREATE FUNCTION x_jobs.list_jobs(
    state text DEFAULT NULL,
    queue text DEFAULT NULL,
    before_id bigint DEFAULT NULL,
    max_rows integer DEFAULT 50,
    name text DEFAULT NULL
)
RETURNS SETOF x_jobs.job
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
-- An operator's call, planned for its values each time: a generic plan proves no partial
-- index's predicate from `state = $1`, and reads `queue IS NULL OR queue = $2` as a filter.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_state x_jobs.job_state;
BEGIN
    IF list_jobs.state IS NOT NULL
        AND list_jobs.state <> ALL (pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ016',
            MESSAGE = pg_catalog.format('X_STATE_UNKNOWN: %L is not a job state', list_jobs.state),
            HINT = 'Use one of: ' || pg_catalog.array_to_string(
                pg_catalog.enum_range(NULL::x_jobs.job_state)::text[], ', ') || '.';
    END IF;
    IF list_jobs.max_rows IS NULL OR list_jobs.max_rows < 1 OR list_jobs.max_rows > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..1000',
                coalesce(list_jobs.max_rows::text, 'NULL')),
            HINT = 'Ask for a page of 1 to 1000 rows and page on with before_id.';
    END IF;
    v_state := list_jobs.state::x_jobs.job_state;

    RETURN QUERY
    SELECT j.*
    FROM x_jobs.job AS j
    WHERE (v_state IS NULL OR j.state = v_state)
        AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
        AND (list_jobs.name IS NULL OR j.name = list_jobs.name)
        AND (list_jobs.before_id IS NULL OR j.id < list_jobs.before_id)
    ORDER BY j.id DESC
    LIMIT list_jobs.max_rows;
END
$$;

REVOKE ALL ON FUNCTION x_jobs.list_jobs(text, text, bigint, integer, text) FROM public;
REVOKE ALL ON FUNCTION x_jobs._bulk_states(
    text, text, x_jobs.job_state[], x_jobs.job_state[], text, timestamptz, timestamptz, integer
) FROM public;
REVOKE ALL ON FUNCTION x_jobs.cancel_jobs(
    text, text, text, text, timestamptz, timestamptz, integer, boolean
) FROM public;
REVOKE ALL ON FUNCTION x_jobs.retry_jobs(
    text, text, text, text, timestamptz, timestamptz, integer, boolean
) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.list_jobs(text, text, bigint, integer, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._bulk_states(
    text, text, x_jobs.job_state[], x_jobs.job_state[], text, timestamptz, timestamptz, integer
) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.cancel_jobs(
    text, text, text, text, timestamptz, timestamptz, integer, boolean
) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.retry_jobs(
    text, text, text, text, timestamptz, timestamptz, integer, boolean
) TO x_jobs_admin;

-- The last count queue_gauges took, in one row: when, and what queue_stats answered then (a JSON
-- array of its rows). A cache, not data: pg_dump leaves its row out, and a restored database
-- counts afresh at its first read.
CREATE TABLE x_jobs.queue_snapshot (
    only_row boolean NOT NULL DEFAULT TRUE,
    taken_at timestamptz NOT NULL,
    stats jsonb NOT NULL,
    CONSTRAINT queue_snapshot_pkey PRIMARY KEY (only_row),
    CONSTRAINT queue_snapshot_one_row CHECK (only_row)
);

-- Per queue, what queue_stats answers (live rows by state, paused, demand) from a snapshot at most
-- `max_age` old, and when that snapshot was taken: what the workers' metrics gauges read. Every
-- worker reads it once per its own interval, so fifty workers would count fifty times as often as
-- one; this counts at most once per max_age, however many ask.
--
-- A caller that finds the stored snapshot fresh is answered from it, a JSON document of a row:
-- no job row is read. One that finds it stale takes a transaction-scoped advisory lock WITHOUT
-- WAITING; holding it, it reads the snapshot again (one who held the lock just before may have
-- stored a fresh one: in READ COMMITTED each statement sees what committed before it), counts
-- when it is still stale, and stores the count. A caller that finds the lock taken (another is
-- counting now) is answered the stored snapshot as it is, older than max_age by at most one
-- count: nobody waits on a count, and two never count at once. The lock is transaction-scoped,
-- never session-level, so the function works behind PgBouncer in transaction mode (a session
-- lock would stay with whichever client the server connection serves next). A snapshot taken in
-- the future of the caller's clock by more than max_age (a test clock moved back) is stale too.
-- `queues` are answered even when the snapshot lists them not (no live row, no pause), at 0, with
-- when the snapshot was taken: a worker asks for its own, and shows them at 0 rather than not.
-- A read-only transaction (a hot standby) can store nothing: a stale snapshot is counted again
-- for that caller alone. A caller in REPEATABLE READ may count once more than needed, nothing
-- worse.
--
-- SECURITY DEFINER: workers and monitoring roles (pg_monitor) get the counts and store the
-- snapshot without any right on the tables, nor a sight of job inputs. search_path is pinned.
CREATE FUNCTION x_jobs.queue_gauges(max_age interval DEFAULT '15 seconds', queues text[] DEFAULT NULL)
RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    suspended bigint,
    running bigint,
    paused boolean,
    demand bigint,
    taken_at timestamptz
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_taken timestamptz;
    v_stats jsonb;
BEGIN
    IF queue_gauges.max_age IS NULL OR queue_gauges.max_age < interval '0'
        OR queue_gauges.max_age > interval '1 day' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ051',
            MESSAGE = pg_catalog.format('X_MAX_AGE_INVALID: max_age %s is outside 0 to 1 day',
                coalesce(queue_gauges.max_age::text, 'NULL')),
            HINT = 'Pass how old the snapshot may be, from ''0'' (count now) to ''1 day'', such as ''15 seconds''.';
    END IF;
    SELECT s.taken_at, s.stats INTO v_taken, v_stats FROM x_jobs.queue_snapshot AS s;
    IF v_taken IS NULL OR v_taken <= v_now - queue_gauges.max_age OR v_taken >= v_now + queue_gauges.max_age THEN
        IF pg_catalog.current_setting('transaction_read_only')::boolean THEN
            v_taken := v_now;
            v_stats := (SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(q)) FROM x_jobs.queue_stats() AS q);
        ELSIF pg_catalog.pg_try_advisory_xact_lock(2024061751, 0) THEN
            SELECT s.taken_at, s.stats INTO v_taken, v_stats FROM x_jobs.queue_snapshot AS s;
            IF v_taken IS NULL OR v_taken <= v_now - queue_gauges.max_age
                OR v_taken >= v_now + queue_gauges.max_age THEN
                v_taken := v_now;
                v_stats := (SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(q)) FROM x_jobs.queue_stats() AS q);
                INSERT INTO x_jobs.queue_snapshot AS s (only_row, taken_at, stats)
                VALUES (TRUE, v_taken, coalesce(v_stats, '[]'))
                ON CONFLICT (only_row) DO UPDATE SET taken_at = excluded.taken_at, stats = excluded.stats;
            END IF;
        END IF;
    END IF;
    RETURN QUERY
    SELECT coalesce(r.queue, w.queue), coalesce(r.ready, 0), coalesce(r.delayed, 0), coalesce(r.suspended, 0),
           coalesce(r.running, 0), coalesce(r.paused, FALSE), coalesce(r.demand, 0), v_taken
    FROM pg_catalog.jsonb_to_recordset(coalesce(v_stats, '[]')) AS r (
        queue text, ready bigint, delayed bigint, suspended bigint, running bigint, paused boolean, demand bigint
    )
    FULL JOIN (
        SELECT DISTINCT u.queue FROM pg_catalog.unnest(queue_gauges.queues) AS u (queue)
        WHERE u.queue IS NOT NULL
    ) AS w ON w.queue = r.queue
    ORDER BY coalesce(r.queue, w.queue) COLLATE "C";
END
$$;

GRANT EXECUTE ON FUNCTION x_jobs.queue_gauges(interval, text[]) TO x_jobs_worker, pg_monitor;
REVOKE ALL ON FUNCTION x_jobs.queue_gauges(interval, text[]) FROM public;
REVOKE ALL ON TABLE x_jobs.queue_snapshot FROM public;

------------------------------------------------------------------------------------------------
-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
------------------------------------------------------------------------------------------------

SELECT x_jobs._adopt();
