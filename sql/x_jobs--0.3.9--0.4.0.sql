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
--   * Declarations: what workers declare of each job is recorded (x_jobs.job_type: declare_job,
--     declare_jobs, job_types, drop_job_type) and enqueue fills what a request leaves out from
--     it (enqueue's parameters default to NULL); a worker hands back a job it has no handler for
--     (hand_back: delayed for a worker that serves it, else parked, job_parked_idx) and announces
--     the jobs it serves (announce_worker's jobs, x_jobs.worker.jobs), which wakes its parked
--     rows. New refusals XJ047 X_DECLARATIONS_INVALID and XJ048 X_JOB_TIMEOUT_INVALID.
--   * job_parked_idx's predicate names pg_catalog's operators: this script runs as the bootstrap
--     superuser with public on its search_path, and a `=` for x_jobs.job_state made there by a
--     database owner ran as that superuser while the index was built.
--   * queue_gauges stores no snapshot from a REPEATABLE READ or SERIALIZABLE caller (it counts
--     for it alone): its store failed with 40001 when another caller had stored one since its
--     snapshot.

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
        ('XJ018', 'X_DELAY_INVALID', 'A retry delay is negative, or a hand-back delay is negative or longer than 1000 years.'),
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
        ('XJ047', 'X_DECLARATIONS_INVALID', 'declare_jobs got something other than an array of declaration objects, an unknown field or one of the wrong type, or a job declared twice in one call.'),
        ('XJ048', 'X_JOB_TIMEOUT_INVALID', 'A declared job timeout is not above zero, or longer than 1000 years.'),
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
-- for that caller alone. So is one in REPEATABLE READ or SERIALIZABLE: its snapshot may predate
-- a snapshot another caller stored, and its store would then fail on that row (40001).
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
        IF pg_catalog.current_setting('transaction_read_only')::boolean
            OR pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
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

-- Declarations in the database (issue 19) -----------------------------------------------------

-- What a worker serves: the job names it has handlers for (announce_worker's jobs).
ALTER TABLE x_jobs.worker ADD COLUMN jobs text[];

COMMENT ON COLUMN x_jobs.worker.jobs IS
'The job names the worker has handlers for; NULL: it did not say, and is taken to serve every job of its queues.';

-- What a job type is, as its workers declare it at their start (x_jobs.declare_job): the options
-- every enqueue of the name gets unless it passes its own, for producers of every language, and
-- the run options a worker of any language reads (timeout). One row per name, the latest
-- declaration's; a field left NULL was not declared, and the built-in default applies.
-- A concurrency key declared NULL beside a limit is one the producer derives from the input:
-- the limit applies to every key an enqueue passes.
CREATE TABLE x_jobs.job_type (
    name text NOT NULL, -- noqa: RF04
    queue text,
    max_attempts integer,
    priority integer,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean,
    concurrency_key text,
    concurrency_limit integer,
    timeout interval, -- noqa: RF04
    declared_at timestamptz NOT NULL,
    declared_by text NOT NULL,
    build text,
    CONSTRAINT job_type_pkey PRIMARY KEY (name)
);

COMMENT ON TABLE x_jobs.job_type IS
'Declared job types: the defaults of their enqueues, and how their workers run them.';
COMMENT ON COLUMN x_jobs.job_type.timeout IS 'How long a run may take: enforced by the worker, not the row.';
COMMENT ON COLUMN x_jobs.job_type.declared_by IS 'The worker id given to declare_job, else the login that declared it.';

-- The parked rows: handed back by a worker without a handler while no live worker served their
-- name (x_jobs.hand_back), due at no time (run_at infinity) until a worker that serves the name
-- announces itself or it is declared. Delayed rows at infinity sort last in job_waiting_idx, so
-- the claim's waiting arm stops before them, and queue_demand (due rows only) counts none of
-- them. Only parked rows are in this index (no enqueue takes an infinite run_at, and a run
-- suspended on a step waits as 'suspended'): an announce finds those it serves with a seek per
-- queue and name, in an index that is empty while nothing is parked.
-- The operators are named with their schema: a script runs as the bootstrap superuser with the
-- search_path set to the extension's schema (public, where a database owner may create), and
-- building the index evaluates the predicate on every row. An unqualified `=` on the enum
-- would find a `=` (x_jobs.job_state, x_jobs.job_state) made there before pg_catalog's
-- anyenum one, and run it as the superuser.
CREATE INDEX job_parked_idx ON x_jobs.job (queue, name, id)
WHERE state OPERATOR (pg_catalog.=) 'delayed' AND run_at OPERATOR (pg_catalog.=) 'infinity';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_type', '');

REVOKE ALL ON x_jobs.job_type FROM public;

-- A request with what it leaves out (NULL) taken from its job type's declaration (a NULL row:
-- none, the request as it is); the built-in defaults come after, in _enqueue. A declared limit
-- goes with the key the request ends up with, declared or its own (a key derived from the input
-- is declared as a limit alone), and never makes a limit without a key. One expression and no
-- SET search_path, so that it inlines into the statement or expression that calls it.
CREATE FUNCTION x_jobs._filled(p_request x_jobs.enqueue_request, p_type x_jobs.job_type)
RETURNS x_jobs.enqueue_request
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ROW(
        (p_request).name, (p_request).input, coalesce((p_request).queue, (p_type).queue),
        (p_request).run_at, (p_request).idempotency_key,
        coalesce((p_request).max_attempts, (p_type).max_attempts),
        coalesce((p_request).priority, (p_type).priority), (p_request).tenant_id,
        coalesce((p_request).concurrency_key, (p_type).concurrency_key),
        coalesce((p_request).concurrency_limit, CASE
            WHEN coalesce((p_request).concurrency_key, (p_type).concurrency_key) IS NOT NULL
                THEN (p_type).concurrency_limit
        END),
        (p_request).traceparent, (p_request).enqueued_by,
        coalesce((p_request).dead_letter, (p_type).dead_letter),
        coalesce((p_request).backoff_base, (p_type).backoff_base),
        coalesce((p_request).backoff_max, (p_type).backoff_max),
        coalesce((p_request).keep_done, (p_type).keep_done)
    )::x_jobs.enqueue_request
$$;

-- The one implementation behind enqueue and enqueue_many: validate every request, insert them in
-- order, dedupe live idempotency keys, and wake the queues that got a ready row. Answers one
-- (ord, id, run_id, deduped) per request, ord counting from 1.
--
-- Dedupe, as the same requests one by one would answer it:
--   * within the batch, the first request of a key leads; the later ones answer its row;
--   * against the table, ON CONFLICT DO NOTHING on the live-key index: when another transaction
--     holds the key (even uncommitted), the insert waits for it and then does nothing, and a
--     second statement (a new snapshot, so it sees that commit) reads the row that won.
--   * if that row settled or its transaction rolled back in between, the key is free again and
--     the request goes round once more. A key that keeps changing hands raises 40001.
CREATE OR REPLACE FUNCTION x_jobs._enqueue(p_requests x_jobs.enqueue_request[])
RETURNS SETOF x_jobs.enqueue_many_result
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := x_jobs.now();
    v_max_payload integer := x_jobs._max_payload_bytes();
    v_bad_ord bigint;
    v_problem text;
    v_bad x_jobs.enqueue_request;
    v_keyed boolean;
    v_due_queues text[];
    v_todo bigint[];
    v_result x_jobs.enqueue_many_result[] := ARRAY[]::x_jobs.enqueue_many_result[];
    v_round integer := 0;
    v_ids bigint[];
    v_run_ids uuid[];
    v_type x_jobs.job_type;
BEGIN
    -- What a request leaves out (NULL) its job type's declaration fills (_filled), then the
    -- built-in defaults below: an explicit value wins, for producers of every language alike.
    -- One lookup by name per request: a primary key probe for one request (enqueue), one join
    -- for a batch, and none while nothing is declared.
    IF pg_catalog.cardinality(p_requests) = 1 THEN
        SELECT t.* INTO v_type FROM x_jobs.job_type AS t WHERE t.name = (p_requests[1]).name;
        IF FOUND THEN
            p_requests[1] := x_jobs._filled(p_requests[1], v_type);
        END IF;
    ELSIF EXISTS (SELECT FROM x_jobs.job_type) THEN
        -- The request rebuilt from its fields, which _filled then reads as they are: handed
        -- the row whole, it took each field out of the row apart, which tripled the fill's cost.
        p_requests := ARRAY(
            SELECT x_jobs._filled(ROW(
                       r.name, r.input, r.queue, r.run_at, r.idempotency_key, r.max_attempts,
                       r.priority, r.tenant_id, r.concurrency_key, r.concurrency_limit,
                       r.traceparent, r.enqueued_by, r.dead_letter, r.backoff_base, r.backoff_max,
                       r.keep_done
                   )::x_jobs.enqueue_request, t)
            FROM unnest(p_requests) WITH ORDINALITY AS r
            LEFT JOIN x_jobs.job_type AS t ON t.name = r.name
            ORDER BY r.ordinality
        );
    END IF;

    -- One pass over the requests answers three things: the first that breaks a rule and which
    -- (by ord, so the message names one value), whether any carries an idempotency key, and the
    -- queues that get a row without a key due now, which are woken (keyed rows wake their
    -- queues below, once it is known which of them were inserted).
    SELECT min(v.ord) FILTER (WHERE v.problem IS NOT NULL),
           (pg_catalog.array_agg(v.problem ORDER BY v.ord) FILTER (WHERE v.problem IS NOT NULL))[1],
           coalesce(bool_or(v.idempotency_key IS NOT NULL), FALSE),
           pg_catalog.array_agg(DISTINCT v.queue) FILTER (WHERE v.due AND v.idempotency_key IS NULL)
    INTO v_bad_ord, v_problem, v_keyed, v_due_queues
    FROM (
        SELECT r.ordinality AS ord, r.idempotency_key, coalesce(r.queue, 'default') AS queue,
               r.run_at IS NULL OR r.run_at <= v_now AS due,
               CASE
                   WHEN r.name IS NULL OR r.name = '' OR pg_catalog.length(r.name) > 200 THEN 'name'
                   WHEN r.queue = '' OR pg_catalog.length(r.queue) > 200 THEN 'queue'
                   WHEN pg_catalog.pg_column_size(r.input) > v_max_payload THEN 'input'
                   WHEN r.max_attempts < 1 THEN 'max_attempts'
                   WHEN r.priority NOT BETWEEN -32768 AND 32767 THEN 'priority'
                   WHEN r.tenant_id = '' THEN 'tenant_id'
                   WHEN pg_catalog.length(r.tenant_id) > 200 THEN 'tenant_id_length'
                   WHEN r.concurrency_limit < 1
                       OR (r.concurrency_limit IS NOT NULL AND r.concurrency_key IS NULL)
                       OR r.concurrency_key = '' THEN 'concurrency'
                   -- The keys are in btree indexes (the concurrency key beside a queue name of
                   -- up to 200): past an entry's size (about 2.7 kB) an insert failed with a
                   -- bare 54000. 400 characters keep them within it in any encoding, as event
                   -- keys. The other texts are in no index, but the payload limit does not
                   -- count them: as names and queues, enqueued_by and tenant_id hold up to 200,
                   -- and a traceparent up to 512 (W3C's is 55; 512 is what W3C asks tracers to
                   -- carry of a tracestate, room for other formats or a tracestate passed along).
                   WHEN pg_catalog.length(r.concurrency_key) > 400 THEN 'concurrency_key'
                   WHEN pg_catalog.length(r.idempotency_key) > 400 THEN 'idempotency_key'
                   -- An empty key is most often a field that was left blank: taken as a key, it
                   -- made every such job a duplicate of the first one still live.
                   WHEN r.idempotency_key = '' THEN 'idempotency_key_empty'
                   WHEN pg_catalog.length(r.traceparent) > 512 THEN 'traceparent'
                   WHEN pg_catalog.length(r.enqueued_by) > 200 THEN 'enqueued_by'
                   WHEN r.backoff_base < interval '0' OR r.backoff_max < interval '0'
                       OR coalesce(r.backoff_base, interval '1 second')
                       > coalesce(r.backoff_max, interval '1 hour') THEN 'backoff'
                   -- Years 1 to 9999 (UTC): what clients' date types hold (Python's datetime);
                   -- an infinite run_at would never come due, or sort first forever.
                   WHEN r.run_at < timestamptz '0001-01-01 00:00:00+00'
                       OR r.run_at >= timestamptz '10000-01-01 00:00:00+00' THEN 'run_at'
               END AS problem
        FROM unnest(p_requests) WITH ORDINALITY AS r
    ) AS v;

    IF v_problem IS NOT NULL THEN
        v_bad := p_requests[v_bad_ord];
        CASE v_problem
            WHEN 'name' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ001',
                    MESSAGE = pg_catalog.format('X_NAME_INVALID: job name %s is not a name',
                        coalesce(pg_catalog.quote_literal(pg_catalog.left(v_bad.name, 210)), 'NULL')),
                    DETAIL = pg_catalog.format('In request %s.', v_bad_ord),
                    HINT = 'Give every job a name of 1 to 200 characters, such as ''send_email''.';
            WHEN 'queue' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ002',
                    MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %L is not a queue name',
                        pg_catalog.left(v_bad.queue, 210)),
                    DETAIL = pg_catalog.format('In request %s.', v_bad_ord),
                    HINT = 'Use a queue name of 1 to 200 characters, or leave it out for ''default''.';
            WHEN 'input' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ003',
                    MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: input of %s bytes exceeds the limit of %s',
                        pg_catalog.pg_column_size(v_bad.input), v_max_payload),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Store large data elsewhere and pass a reference, or raise x_jobs.max_payload_bytes.';
            WHEN 'max_attempts' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ004',
                    MESSAGE = pg_catalog.format('X_MAX_ATTEMPTS_INVALID: max_attempts %s is below 1',
                        v_bad.max_attempts),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Pass max_attempts => 1 for a job that must not be retried, or more to retry it.';
            WHEN 'priority' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ005',
                    MESSAGE = pg_catalog.format('X_PRIORITY_INVALID: priority %s is out of range',
                        v_bad.priority),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Use a priority between -32768 and 32767; lower runs first, 0 is the default.';
            WHEN 'tenant_id' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ006',
                    MESSAGE = 'X_TENANT_INVALID: tenant_id '''' is empty',
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Name the tenant the job acts for, or leave tenant_id out for ''none''.';
            WHEN 'tenant_id_length' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ006',
                    MESSAGE = pg_catalog.format('X_TENANT_INVALID: tenant_id %L... is %s characters, longer than 200',
                        pg_catalog.left(v_bad.tenant_id, 64), pg_catalog.length(v_bad.tenant_id)),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Name the tenant in 1 to 200 characters, or leave tenant_id out for ''none''.';
            WHEN 'concurrency_key' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ007',
                    MESSAGE = pg_catalog.format(
                        'X_CONCURRENCY_INVALID: concurrency key %L... is %s characters, longer than 400',
                        pg_catalog.left(v_bad.concurrency_key, 64), pg_catalog.length(v_bad.concurrency_key)),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Key the limit with a short text such as a customer id (up to 400 characters): '
                        'hash a longer one.';
            WHEN 'idempotency_key' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ009',
                    MESSAGE = pg_catalog.format(
                        'X_JOBS_INVALID: idempotency key %L... is %s characters, longer than 400',
                        pg_catalog.left(v_bad.idempotency_key, 64), pg_catalog.length(v_bad.idempotency_key)),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Use a key of up to 400 characters, such as the id of what the job acts on: '
                        'hash a longer one.';
            WHEN 'idempotency_key_empty' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ009',
                    MESSAGE = 'X_JOBS_INVALID: idempotency key '''' is empty',
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Pass a key that names what the job acts on, such as an order id, '
                        'or leave it out (NULL) for no deduplication.';
            WHEN 'traceparent' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ009',
                    MESSAGE = pg_catalog.format('X_JOBS_INVALID: traceparent %L... is %s characters, longer than 512',
                        pg_catalog.left(v_bad.traceparent, 64), pg_catalog.length(v_bad.traceparent)),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Pass the W3C traceparent of the enqueuing span (55 characters), or leave it out.';
            WHEN 'enqueued_by' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ009',
                    MESSAGE = pg_catalog.format('X_JOBS_INVALID: enqueued_by %L... is %s characters, longer than 200',
                        pg_catalog.left(v_bad.enqueued_by, 64), pg_catalog.length(v_bad.enqueued_by)),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Name who enqueued the job in up to 200 characters, such as a service or user, '
                        'or leave it out.';
            WHEN 'concurrency' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ007',
                    MESSAGE = pg_catalog.format(
                        'X_CONCURRENCY_INVALID: concurrency limit %s with key %s is not a limit',
                        coalesce(v_bad.concurrency_limit::text, 'NULL'),
                        coalesce(pg_catalog.quote_literal(v_bad.concurrency_key), 'NULL')),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Pass a non-empty concurrency_key, and a concurrency_limit of 1 or more (default 1).';
            WHEN 'backoff' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ008',
                    MESSAGE = pg_catalog.format('X_BACKOFF_INVALID: backoff from %s to %s is not a range',
                        coalesce(v_bad.backoff_base, interval '1 second'),
                        coalesce(v_bad.backoff_max, interval '1 hour')),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Pass backoff_base and backoff_max of zero or more, base not above max '
                        '(they default to 1 second and 1 hour).';
            WHEN 'run_at' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ039',
                    MESSAGE = pg_catalog.format('X_TIME_INVALID: run_at %s is not a time a job can be due',
                        v_bad.run_at),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Pass a time in the years 1 to 9999 (UTC), or leave run_at out to run it now.';
        END CASE;
    END IF;

    -- Ids and run ids for every request, drawn in input order, so that a batch is claimed first
    -- in, first out: request i gets v_ids[i] and v_run_ids[i] whichever statement inserts it,
    -- in whatever round (a request that dedupes leaves its pair unused).
    v_ids := ARRAY(
        SELECT pg_catalog.nextval('x_jobs.job_id_seq')
        FROM pg_catalog.generate_series(1, pg_catalog.cardinality(p_requests))
    );
    v_run_ids := x_jobs._run_ids(pg_catalog.cardinality(p_requests));

    -- Requests without an idempotency key cannot conflict or dedupe: each is a new row, and all
    -- of them go in one plain INSERT. ON CONFLICT would put every row through speculative
    -- insertion, an extra WAL record and lock per row (a third of a keyless batch's throughput,
    -- measured 2026-11-29), and matching inserted rows back to requests cost another third
    -- (24 against 16 ms per 1,000, measured 2026-11-30).
    INSERT INTO x_jobs.job (
        id, run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state,
        max_attempts, concurrency_limit, priority, dead_letter, name, queue, tenant_id,
        concurrency_key, traceparent, enqueued_by, input, keep_done
    )
    OVERRIDING SYSTEM VALUE
    SELECT v_ids[r.ordinality], coalesce(r.run_at, v_now), v_now, v_now, v_run_ids[r.ordinality],
           coalesce(r.backoff_base, interval '1 second'),
           coalesce(r.backoff_max, interval '1 hour'),
           CASE WHEN r.run_at > v_now THEN 'delayed' ELSE 'ready' END::x_jobs.job_state,
           coalesce(r.max_attempts, 25),
           CASE WHEN r.concurrency_key IS NOT NULL THEN coalesce(r.concurrency_limit, 1) END,
           coalesce(r.priority, 0), coalesce(r.dead_letter, TRUE), r.name,
           coalesce(r.queue, 'default'), coalesce(r.tenant_id, 'none'), r.concurrency_key,
           r.traceparent, r.enqueued_by, coalesce(r.input, '{}'::jsonb),
           coalesce(r.keep_done, TRUE)
    FROM unnest(p_requests) WITH ORDINALITY AS r
    WHERE r.idempotency_key IS NULL;

    PERFORM x_jobs._notify('x_jobs', q.queue) FROM unnest(v_due_queues) AS q (queue);

    IF NOT v_keyed THEN
        RETURN QUERY
        SELECT i::integer, v_ids[i], v_run_ids[i], FALSE
        FROM pg_catalog.generate_series(1, pg_catalog.cardinality(p_requests)) AS i;
        RETURN;
    END IF;

    v_result := ARRAY(
        SELECT ROW(r.ordinality, v_ids[r.ordinality], v_run_ids[r.ordinality], FALSE)::x_jobs.enqueue_many_result
        FROM unnest(p_requests) WITH ORDINALITY AS r
        WHERE r.idempotency_key IS NULL
    );
    -- The keyed requests, until each is resolved: inserted, or deduped onto a live row.
    v_todo := ARRAY(
        SELECT r.ordinality
        FROM unnest(p_requests) WITH ORDINALITY AS r
        WHERE r.idempotency_key IS NOT NULL
    );
    LOOP
        v_round := v_round + 1;
        IF v_round > 5 THEN
            RAISE EXCEPTION USING
                ERRCODE = '40001',
                MESSAGE = 'X_ENQUEUE_RACE: an idempotency key kept changing hands during enqueue',
                DETAIL = pg_catalog.format('Requests %s were still unresolved after 5 rounds.', v_todo),
                HINT = 'Retry the call; the rows holding the key were settling as it ran.';
        END IF;

        -- Insert the leaders, the first request of each key among the unresolved ones.
        WITH req AS MATERIALIZED (
            SELECT s.ordinality AS ord, s.leads, s.idempotency_key,
                   CASE WHEN s.leads THEN v_ids[s.ordinality] END AS id,
                   CASE WHEN s.leads THEN v_run_ids[s.ordinality] END AS run_id,
                   coalesce(s.run_at, v_now) AS run_at,
                   coalesce(s.backoff_base, interval '1 second') AS backoff_base,
                   coalesce(s.backoff_max, interval '1 hour') AS backoff_max,
                   CASE WHEN s.run_at > v_now THEN 'delayed' ELSE 'ready' END::x_jobs.job_state AS state,
                   coalesce(s.max_attempts, 25) AS max_attempts,
                   CASE WHEN s.concurrency_key IS NOT NULL THEN coalesce(s.concurrency_limit, 1) END
                       AS concurrency_limit,
                   coalesce(s.priority, 0) AS priority,
                   coalesce(s.dead_letter, TRUE) AS dead_letter,
                   coalesce(s.keep_done, TRUE) AS keep_done,
                   s.name,
                   coalesce(s.queue, 'default') AS queue,
                   coalesce(s.tenant_id, 'none') AS tenant_id,
                   s.concurrency_key, s.traceparent, s.enqueued_by,
                   coalesce(s.input, '{}'::jsonb) AS input
            FROM (
                SELECT r.*, r.ordinality = f.first_ord AS leads
                FROM unnest(p_requests) WITH ORDINALITY AS r
                -- The first request of each key.
                JOIN (
                    SELECT k.idempotency_key, min(k.ordinality) AS first_ord
                    FROM unnest(p_requests) WITH ORDINALITY AS k
                    WHERE k.idempotency_key IS NOT NULL
                    GROUP BY k.idempotency_key
                ) AS f ON f.idempotency_key = r.idempotency_key
                -- A hashed semi-join: p_requests[i] would walk the array from its start each time.
                WHERE r.ordinality IN (SELECT t.ord FROM unnest(v_todo) AS t (ord))
            ) AS s
        ),
        ins_keyed AS (
            INSERT INTO x_jobs.job AS j (
                id, run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state,
                max_attempts, concurrency_limit, priority, dead_letter, name, queue, tenant_id,
                idempotency_key, concurrency_key, traceparent, enqueued_by, input, keep_done
            )
            OVERRIDING SYSTEM VALUE
            SELECT r.id, r.run_at, v_now, v_now, r.run_id, r.backoff_base, r.backoff_max, r.state,
                   r.max_attempts, r.concurrency_limit, r.priority, r.dead_letter, r.name, r.queue,
                   r.tenant_id, r.idempotency_key, r.concurrency_key, r.traceparent, r.enqueued_by,
                   r.input, r.keep_done
            FROM req AS r
            WHERE r.leads
            -- In key order (the ids were drawn in input order already): two batches that share
            -- keys then wait on each other's keys in one order, never in a cycle (a deadlock).
            ORDER BY r.idempotency_key
            ON CONFLICT (idempotency_key)
            WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended', 'running')
            DO NOTHING
            RETURNING j.id, j.queue, j.state
        ),
        woken AS (
            SELECT x_jobs._notify('x_jobs', q.queue)
            FROM (SELECT DISTINCT i.queue FROM ins_keyed AS i WHERE i.state = 'ready') AS q
        )
        SELECT coalesce(pg_catalog.array_agg(ROW(req.ord, req.id, req.run_id, FALSE)::x_jobs.enqueue_many_result)
                   FILTER (WHERE ins.id IS NOT NULL), '{}') || v_result,
               coalesce(pg_catalog.array_agg(req.ord) FILTER (WHERE ins.id IS NULL), '{}')
        INTO v_result, v_todo
        FROM req
        LEFT JOIN ins_keyed AS ins ON ins.id = req.id
        CROSS JOIN (SELECT count(*) FROM woken) AS w;

        EXIT WHEN pg_catalog.cardinality(v_todo) = 0;

        -- A new statement, so a new snapshot: it sees the rows that won the keys, whether this
        -- call inserted them (a later request of the same key) or another transaction did.
        SELECT v_result || coalesce(pg_catalog.array_agg(ROW(o.ordinality, live.id, live.run_id, TRUE)::x_jobs.enqueue_many_result)
                   FILTER (WHERE live.id IS NOT NULL), '{}'),
               coalesce(pg_catalog.array_agg(o.ordinality) FILTER (WHERE live.id IS NULL), '{}')
        INTO v_result, v_todo
        FROM unnest(p_requests) WITH ORDINALITY AS o
        LEFT JOIN LATERAL (
            SELECT j.id, j.run_id
            FROM x_jobs.job AS j
            WHERE j.idempotency_key = o.idempotency_key
                AND j.state IN ('ready', 'delayed', 'suspended', 'running')
        ) AS live ON TRUE
        WHERE o.ordinality IN (SELECT t.ord FROM unnest(v_todo) AS t (ord));

        EXIT WHEN pg_catalog.cardinality(v_todo) = 0;
    END LOOP;

    RETURN QUERY SELECT r.* FROM unnest(v_result) AS r ORDER BY r.ord;
END
$$;

-- Enqueue one job. Only `name` is required; NULL for any other argument means its default:
-- what the job type's declaration says (x_jobs.declare_job), else the built-in one (queue
-- 'default', 25 attempts, priority 0, tenant 'none', dead letters, backoff from 1 second to 1
-- hour, keep_done). So the parameters default to NULL, and an omitted argument and an explicit
-- NULL are the same: both leave it to the declaration.
-- Answers the row's id and run_id, and whether an existing live row with the same
-- idempotency_key answered instead (deduped). A row due now wakes its queue (NOTIFY x_jobs).
-- keep_done => false: completing the job deletes its row (see complete_many).
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.enqueue(
    name text,
    input jsonb DEFAULT '{}',
    queue text DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    priority integer DEFAULT NULL,
    tenant_id text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    enqueued_by text DEFAULT NULL,
    concurrency_limit integer DEFAULT NULL,
    dead_letter boolean DEFAULT NULL,
    backoff_base interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL,
    keep_done boolean DEFAULT NULL
)
RETURNS x_jobs.enqueue_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_result x_jobs.enqueue_result;
BEGIN
    SELECT e.id, e.run_id, e.deduped
    INTO v_result
    FROM x_jobs._enqueue(ARRAY[ROW(
        enqueue.name, enqueue.input, enqueue.queue, enqueue.run_at, enqueue.idempotency_key,
        enqueue.max_attempts, enqueue.priority, enqueue.tenant_id, enqueue.concurrency_key,
        enqueue.concurrency_limit, enqueue.traceparent, enqueue.enqueued_by, enqueue.dead_letter,
        enqueue.backoff_base, enqueue.backoff_max, enqueue.keep_done
    )::x_jobs.enqueue_request]) AS e;
    RETURN v_result;
END
$$;

DROP FUNCTION x_jobs.announce_worker(text, text[], text, boolean, interval);

-- A worker says it is alive, what it serves and which build it runs; call it at an interval
-- well under ttl. The first announce with draining true stamps draining_at, and every later one
-- keeps it: a worker that began to drain never serves again. Rows of workers gone for a day are
-- swept here, so the table holds only the recent fleet. Answers the worker's row.
--
-- `jobs` names the jobs it has handlers for (NULL: it does not say, and is taken to serve every
-- job of its queues). A worker that does not drain wakes the parked rows it serves (see
-- x_jobs.hand_back), at most 10,000 an announce, the rest at the next ones. At every announce, not
-- only the first: a row parked by a hand-back that ran beside this worker's first announce saw
-- no serving worker yet, and the announce did not see the row parked.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.announce_worker(
    worker text,
    queues text[],
    build text DEFAULT NULL,
    draining boolean DEFAULT FALSE,
    ttl interval DEFAULT '60 seconds',
    jobs text[] DEFAULT NULL
)
RETURNS x_jobs.worker
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_row x_jobs.worker;
    v_bad_job text;
BEGIN
    PERFORM x_jobs._require_worker(
        announce_worker.worker, 'Pass an id unique to the worker process, such as host:pid:random.'
    );
    IF announce_worker.queues IS NULL OR pg_catalog.cardinality(announce_worker.queues) = 0
        OR EXISTS (SELECT FROM unnest(announce_worker.queues) AS q WHERE q IS NULL OR q = '') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ010',
            MESSAGE = pg_catalog.format('X_QUEUES_INVALID: queue list %s is not a list of queues',
                coalesce(announce_worker.queues::text, 'NULL')),
            HINT = 'Pass the queues the worker serves, such as ARRAY[''default''].';
    END IF;
    IF announce_worker.ttl IS NULL OR announce_worker.ttl <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ019',
            MESSAGE = pg_catalog.format('X_TTL_INVALID: ttl %s is not positive',
                coalesce(announce_worker.ttl::text, 'NULL')),
            HINT = 'Pass a ttl of a few announce intervals, such as ''60 seconds''.';
    END IF;
    -- As a lease: many millennia ended past what timestamptz holds.
    IF announce_worker.ttl > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ019',
            MESSAGE = pg_catalog.format('X_TTL_INVALID: ttl %s is longer than 1000 years', announce_worker.ttl),
            HINT = 'Pass a ttl of a few announce intervals, such as ''60 seconds''.';
    END IF;
    -- The names enqueue accepts: what a hand-back compares with a row's name.
    SELECT j.name INTO v_bad_job
    FROM unnest(announce_worker.jobs) WITH ORDINALITY AS j (name, n)
    WHERE j.name IS NULL OR j.name = '' OR pg_catalog.length(j.name) > 200
    ORDER BY j.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ001',
            MESSAGE = pg_catalog.format('X_NAME_INVALID: job name %s in the jobs list is not a name',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(v_bad_job, 210)), 'NULL')),
            HINT = 'List the names of the jobs the worker has handlers for (1 to 200 characters each), '
                'or pass NULL.';
    END IF;

    INSERT INTO x_jobs.worker AS w (id, queues, build, started_at, seen_at, expires_at, draining_at, jobs)
    VALUES (
        announce_worker.worker, announce_worker.queues, announce_worker.build, v_now, v_now,
        v_now + announce_worker.ttl, CASE WHEN announce_worker.draining THEN v_now END,
        announce_worker.jobs
    )
    ON CONFLICT (id) DO UPDATE
    SET queues = excluded.queues,
        build = excluded.build,
        seen_at = excluded.seen_at,
        expires_at = excluded.expires_at,
        draining_at = coalesce(w.draining_at, excluded.draining_at),
        jobs = excluded.jobs
    RETURNING w.* INTO v_row;

    IF v_row.draining_at IS NULL THEN
        PERFORM x_jobs._wake_parked(announce_worker.jobs, announce_worker.queues, 10000);
    END IF;

    DELETE FROM x_jobs.worker AS w WHERE w.expires_at < v_now - interval '1 day';
    RETURN v_row;
END
$$;

-- Make parked rows (see x_jobs.hand_back) due now: those of `p_names` (NULL: of every name) in
-- `p_queues` (NULL: in every queue), at most `p_max_rows`, and wake their queues. Rows another
-- transaction holds are skipped: a cancel is deciding about them, or another announce woke them.
-- One statement per case, so that each is planned with the index conditions it has: by queue,
-- or by queue and name, seeks into job_parked_idx; by name alone (a declaration), a read of the
-- parked rows.
CREATE FUNCTION x_jobs._wake_parked(p_names text[], p_queues text[], p_max_rows integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := x_jobs.now();
    v_ids bigint[];
    v_queues text[];
BEGIN
    -- By queue (and name): a seek per queue (and name), each an equality, so that a generic
    -- plan seeks too (given `= ANY` of the arrays, it read every parked row of the index).
    -- Rows a seek locked past the outer LIMIT stay locked until the transaction ends, as in
    -- the claim.
    IF p_names IS NULL THEN
        v_ids := ARRAY(
            SELECT p.id
            FROM unnest(p_queues) AS q (queue)
            CROSS JOIN LATERAL (
                SELECT j.id FROM x_jobs.job AS j
                WHERE j.queue = q.queue AND j.state = 'delayed' AND j.run_at = 'infinity'
                LIMIT p_max_rows
                FOR UPDATE SKIP LOCKED
            ) AS p
            LIMIT p_max_rows
        );
    ELSIF p_queues IS NULL THEN
        -- A declaration, at a worker's start: one read of the parked rows, of every queue.
        v_ids := ARRAY(
            SELECT p.id FROM x_jobs.job AS p
            WHERE p.state = 'delayed' AND p.run_at = 'infinity'
                AND p.name = ANY (p_names)
            LIMIT p_max_rows
            FOR UPDATE SKIP LOCKED
        );
    ELSE
        v_ids := ARRAY(
            SELECT p.id
            FROM unnest(p_queues) AS q (queue)
            CROSS JOIN unnest(p_names) AS n (name)
            CROSS JOIN LATERAL (
                SELECT j.id FROM x_jobs.job AS j
                WHERE j.queue = q.queue AND j.name = n.name
                    AND j.state = 'delayed' AND j.run_at = 'infinity'
                LIMIT p_max_rows
                FOR UPDATE SKIP LOCKED
            ) AS p
            LIMIT p_max_rows
        );
    END IF;
    IF pg_catalog.cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;

    -- Due now, behind what is due already: its place in the queue is where it comes back.
    WITH woken AS (
        UPDATE x_jobs.job AS j
        SET state = 'ready',
            run_at = v_now,
            updated_at = v_now
        WHERE j.id = ANY (v_ids)
        RETURNING j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(DISTINCT w.queue), '{}') INTO v_queues FROM woken AS w;

    PERFORM pg_catalog.pg_notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
    RETURN pg_catalog.cardinality(v_ids);
END
$$;

-- Validate and record declarations, one row per name: the latest declaration replaces the whole
-- row (a field it leaves NULL is no longer declared, and the built-in default applies again).
-- Each value is refused as enqueue would refuse it, with enqueue's code, so that no declaration
-- can make every later enqueue of its name fail; a limit may come without a key here (the key is
-- the input's, see x_jobs.job_type). Answers the rows in input order, and wakes the parked rows
-- of the names declared: whoever declares a job means to run it (a worker of another language
-- may claim without announcing what it serves).
CREATE FUNCTION x_jobs._declare(p_types x_jobs.job_type[])
RETURNS SETOF x_jobs.job_type
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad_ord bigint;
    v_problem text;
    v_bad x_jobs.job_type;
BEGIN
    SELECT min(v.ord) FILTER (WHERE v.problem IS NOT NULL),
           (pg_catalog.array_agg(v.problem ORDER BY v.ord) FILTER (WHERE v.problem IS NOT NULL))[1]
    INTO v_bad_ord, v_problem
    FROM (
        SELECT t.ordinality AS ord,
               CASE
                   WHEN t.name IS NULL OR t.name = '' OR pg_catalog.length(t.name) > 200 THEN 'name'
                   -- ON CONFLICT DO UPDATE cannot touch one row twice in a statement.
                   WHEN pg_catalog.count(*) OVER (PARTITION BY t.name) > 1 THEN 'twice'
                   WHEN t.queue = '' OR pg_catalog.length(t.queue) > 200 THEN 'queue'
                   WHEN t.max_attempts < 1 THEN 'max_attempts'
                   WHEN t.priority NOT BETWEEN -32768 AND 32767 THEN 'priority'
                   WHEN t.concurrency_limit < 1 OR t.concurrency_key = '' THEN 'concurrency'
                   WHEN pg_catalog.length(t.concurrency_key) > 400 THEN 'concurrency_key'
                   WHEN t.backoff_base < interval '0' OR t.backoff_max < interval '0'
                       OR coalesce(t.backoff_base, interval '1 second')
                       > coalesce(t.backoff_max, interval '1 hour') THEN 'backoff'
                   WHEN t.timeout <= interval '0' OR t.timeout > interval '1000 years' THEN 'timeout'
               END AS problem
        FROM unnest(p_types) WITH ORDINALITY AS t
    ) AS v;

    IF v_problem IS NOT NULL THEN
        v_bad := p_types[v_bad_ord];
        CASE v_problem
            WHEN 'name' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ001',
                    MESSAGE = pg_catalog.format('X_NAME_INVALID: job name %s is not a name',
                        coalesce(pg_catalog.quote_literal(pg_catalog.left(v_bad.name, 210)), 'NULL')),
                    DETAIL = pg_catalog.format('In declaration %s.', v_bad_ord),
                    HINT = 'Declare every job by a name of 1 to 200 characters, such as ''send_email''.';
            WHEN 'twice' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ047',
                    MESSAGE = pg_catalog.format('X_DECLARATIONS_INVALID: job %L is declared twice in one call',
                        v_bad.name),
                    DETAIL = pg_catalog.format('In declaration %s.', v_bad_ord),
                    HINT = 'Declare each job once per call.';
            WHEN 'queue' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ002',
                    MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %L is not a queue name',
                        pg_catalog.left(v_bad.queue, 210)),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Use a queue name of 1 to 200 characters, or leave it out for ''default''.';
            WHEN 'max_attempts' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ004',
                    MESSAGE = pg_catalog.format('X_MAX_ATTEMPTS_INVALID: max_attempts %s is below 1',
                        v_bad.max_attempts),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Declare max_attempts => 1 for a job that must not be retried, or more to retry it.';
            WHEN 'priority' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ005',
                    MESSAGE = pg_catalog.format('X_PRIORITY_INVALID: priority %s is out of range',
                        v_bad.priority),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Use a priority between -32768 and 32767; lower runs first, 0 is the default.';
            WHEN 'concurrency' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ007',
                    MESSAGE = pg_catalog.format(
                        'X_CONCURRENCY_INVALID: concurrency limit %s with key %s is not a limit',
                        coalesce(v_bad.concurrency_limit::text, 'NULL'),
                        coalesce(pg_catalog.quote_literal(v_bad.concurrency_key), 'NULL')),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Declare a concurrency_limit of 1 or more, with a non-empty concurrency_key or '
                        'none (the key then comes with each enqueue).';
            WHEN 'concurrency_key' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ007',
                    MESSAGE = pg_catalog.format(
                        'X_CONCURRENCY_INVALID: concurrency key %L... is %s characters, longer than 400',
                        pg_catalog.left(v_bad.concurrency_key, 64), pg_catalog.length(v_bad.concurrency_key)),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Key the limit with a short text (up to 400 characters), such as job:send_email.';
            WHEN 'backoff' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ008',
                    MESSAGE = pg_catalog.format('X_BACKOFF_INVALID: backoff from %s to %s is not a range',
                        coalesce(v_bad.backoff_base, interval '1 second'),
                        coalesce(v_bad.backoff_max, interval '1 hour')),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Declare backoff_base and backoff_max of zero or more, base not above max '
                        '(they default to 1 second and 1 hour).';
            WHEN 'timeout' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ048',
                    MESSAGE = pg_catalog.format('X_JOB_TIMEOUT_INVALID: timeout %s is not a run time',
                        v_bad.timeout),
                    DETAIL = pg_catalog.format('In declaration %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Declare a timeout above zero and up to 1000 years, such as ''30 seconds'', '
                        'or NULL for none.';
        END CASE;
    END IF;

    RETURN QUERY
    WITH declared AS (
        INSERT INTO x_jobs.job_type AS t (
            name, queue, max_attempts, priority, dead_letter, backoff_base, backoff_max, keep_done,
            concurrency_key, concurrency_limit, timeout, declared_at, declared_by, build
        )
        SELECT d.name, d.queue, d.max_attempts, d.priority, d.dead_letter, d.backoff_base,
               d.backoff_max, d.keep_done, d.concurrency_key, d.concurrency_limit, d.timeout,
               d.declared_at, d.declared_by, d.build
        FROM unnest(p_types) AS d
        -- In name order: two workers declaring the same jobs at once wait on each other's rows
        -- in one order, never in a cycle (a deadlock).
        ORDER BY d.name
        ON CONFLICT (name) DO UPDATE
        SET queue = excluded.queue,
            max_attempts = excluded.max_attempts,
            priority = excluded.priority,
            dead_letter = excluded.dead_letter,
            backoff_base = excluded.backoff_base,
            backoff_max = excluded.backoff_max,
            keep_done = excluded.keep_done,
            concurrency_key = excluded.concurrency_key,
            concurrency_limit = excluded.concurrency_limit,
            timeout = excluded.timeout,
            declared_at = excluded.declared_at,
            declared_by = excluded.declared_by,
            build = excluded.build
        RETURNING t.*
    )
    SELECT d.*
    FROM declared AS d
    JOIN unnest(p_types) WITH ORDINALITY AS o ON o.name = d.name
    ORDER BY o.ordinality;

    PERFORM x_jobs._wake_parked(ARRAY(SELECT t.name FROM unnest(p_types) AS t), NULL, 10000);
END
$$;

-- Who declared: the worker id a declaration names, else the login.
CREATE FUNCTION x_jobs._declarer(p_declared_by text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_declared_by IS NULL THEN
        RETURN session_user::text;
    END IF;
    PERFORM x_jobs._require_worker(p_declared_by, 'Pass the id of the worker that declares, or NULL for the login.');
    RETURN p_declared_by;
END
$$;

-- Declare a job type: what every enqueue of `name` gets for what it leaves out (queue,
-- max_attempts, priority, dead_letter, backoff_base, backoff_max, keep_done, concurrency_key and
-- concurrency_limit, as enqueue's parameters of those names), and how it runs (timeout: a run
-- deadline the worker enforces). Workers call it at their start, for every job they have a
-- handler for (the Python worker through declare_jobs), so that a SQL, Node or Go producer's
-- rows get what the handler's declaration says. NULL leaves a field undeclared. Answers the
-- recorded row. declared_by names the declaring worker (default: the login), build its build.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.declare_job(
    name text,
    queue text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    backoff_base interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL,
    dead_letter boolean DEFAULT NULL,
    timeout interval DEFAULT NULL,
    concurrency_limit integer DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    keep_done boolean DEFAULT NULL,
    priority integer DEFAULT NULL,
    declared_by text DEFAULT NULL,
    build text DEFAULT NULL
)
RETURNS x_jobs.job_type
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_row x_jobs.job_type;
BEGIN
    SELECT d.* INTO v_row
    FROM x_jobs._declare(ARRAY[ROW(
        declare_job.name, declare_job.queue, declare_job.max_attempts, declare_job.priority,
        declare_job.dead_letter, declare_job.backoff_base, declare_job.backoff_max,
        declare_job.keep_done, declare_job.concurrency_key, declare_job.concurrency_limit,
        declare_job.timeout, x_jobs.now(), x_jobs._declarer(declare_job.declared_by), declare_job.build
    )::x_jobs.job_type]) AS d;
    RETURN v_row;
END
$$;

-- Declare many job types in one call and one statement, as a worker with many jobs does at its
-- start: `jobs` is a JSON array of objects whose keys are declare_job's argument names (but
-- declared_by and build, given once here). Answers the recorded rows in input order.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.declare_jobs(jobs jsonb, declared_by text DEFAULT NULL, build text DEFAULT NULL)
RETURNS SETOF x_jobs.job_type
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_fields text[] := ARRAY[
        'name', 'queue', 'max_attempts', 'backoff_base', 'backoff_max', 'dead_letter', 'timeout',
        'concurrency_limit', 'concurrency_key', 'keep_done', 'priority'
    ];
    v_text_fields text[] := ARRAY['name', 'queue', 'concurrency_key'];
    v_bad record;
    v_now timestamptz := x_jobs.now();
    v_by text := x_jobs._declarer(declare_jobs.declared_by);
    v_types x_jobs.job_type[];
BEGIN
    IF declare_jobs.jobs IS NULL OR pg_catalog.jsonb_typeof(declare_jobs.jobs) <> 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ047',
            MESSAGE = pg_catalog.format('X_DECLARATIONS_INVALID: jobs is %s, not an array',
                coalesce(pg_catalog.jsonb_typeof(declare_jobs.jobs), 'NULL')),
            HINT = 'Pass a JSON array of objects, such as ''[{"name": "send_email", "max_attempts": 5}]''.';
    END IF;

    -- As enqueue_many: an unknown key (a typo) or a text field that is not a string would
    -- otherwise be taken silently, or as its JSON text.
    SELECT e.ord, pg_catalog.jsonb_typeof(e.value) AS kind,
           CASE WHEN pg_catalog.jsonb_typeof(e.value) = 'object' THEN (
               SELECT k.key FROM pg_catalog.jsonb_object_keys(e.value - v_fields) AS k (key) LIMIT 1
           ) END AS key,
           CASE WHEN pg_catalog.jsonb_typeof(e.value) = 'object' THEN (
               SELECT f.field FROM unnest(v_text_fields) WITH ORDINALITY AS f (field, n)
               WHERE pg_catalog.jsonb_typeof(e.value -> f.field) NOT IN ('string', 'null')
               ORDER BY f.n
               LIMIT 1
           ) END AS field
    INTO v_bad
    FROM pg_catalog.jsonb_array_elements(declare_jobs.jobs) WITH ORDINALITY AS e (value, ord)
    WHERE CASE
        WHEN pg_catalog.jsonb_typeof(e.value) <> 'object' THEN TRUE
        ELSE e.value - v_fields <> '{}'::jsonb
            OR pg_catalog.jsonb_typeof(e.value -> 'name') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'queue') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'concurrency_key') NOT IN ('string', 'null')
    END
    ORDER BY e.ord
    LIMIT 1;

    IF FOUND THEN
        IF v_bad.kind <> 'object' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ047',
                MESSAGE = pg_catalog.format('X_DECLARATIONS_INVALID: declaration %s is %s, not an object',
                    v_bad.ord, v_bad.kind),
                HINT = 'Make every element of the array an object such as {"name": "send_email"}.';
        END IF;
        IF v_bad.key IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ047',
                MESSAGE = pg_catalog.format('X_DECLARATIONS_INVALID: declaration %s has an unknown field %L',
                    v_bad.ord, pg_catalog.left(v_bad.key, 210)),
                HINT = pg_catalog.format('Use the argument names of x_jobs.declare_job: %s.',
                    pg_catalog.array_to_string(v_fields, ', '));
        END IF;
        RAISE EXCEPTION USING
            ERRCODE = 'XJ047',
            MESSAGE = pg_catalog.format('X_DECLARATIONS_INVALID: %s of declaration %s is not a string',
                v_bad.field, v_bad.ord),
            HINT = pg_catalog.format('Pass %s as JSON strings, or leave them out (name is required).',
                pg_catalog.array_to_string(v_text_fields, ', '));
    END IF;

    BEGIN
        v_types := ARRAY(
            SELECT ROW(
                r.name, r.queue, r.max_attempts, r.priority, r.dead_letter, r.backoff_base,
                r.backoff_max, r.keep_done, r.concurrency_key, r.concurrency_limit, r.timeout,
                v_now, v_by, declare_jobs.build
            )::x_jobs.job_type
            FROM pg_catalog.jsonb_populate_recordset(NULL::x_jobs.job_type, declare_jobs.jobs)
                WITH ORDINALITY AS r
            ORDER BY r.ordinality
        );
    EXCEPTION
        WHEN data_exception THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ047',
                MESSAGE = pg_catalog.format('X_DECLARATIONS_INVALID: a field has the wrong type: %s', SQLERRM),
                HINT = 'Pass numbers for max_attempts, priority and concurrency_limit, booleans for '
                    'dead_letter and keep_done, interval strings such as "5 seconds" for backoff_base, '
                    'backoff_max and timeout.';
    END;

    RETURN QUERY SELECT * FROM x_jobs._declare(v_types);
END
$$;

-- The declarations, for `x-jobs manifest` and for workers of other languages that read how a
-- job runs (its timeout): one row per name that is declared, served by a live worker that is
-- not draining, or parked, by name. served_by lists the live workers that announced the name
-- among their jobs (a worker that announced no list is left out: it did not say); parked counts
-- the rows waiting for a worker that serves the name (see x_jobs.hand_back). An undeclared name
-- has NULL for every declared field and declared_at.
-- SECURITY DEFINER: a worker reads declarations and worker ids, and no job input.
CREATE FUNCTION x_jobs.job_types()
RETURNS TABLE (
    name text,
    queue text,
    max_attempts integer,
    priority integer,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean,
    concurrency_key text,
    concurrency_limit integer,
    timeout interval,
    declared_at timestamptz,
    declared_by text,
    build text,
    served_by text[],
    parked bigint
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH live AS (
        SELECT w.id, w.jobs FROM x_jobs.worker AS w
        WHERE w.expires_at > x_jobs.now() AND w.draining_at IS NULL AND w.jobs IS NOT NULL
    ),
    parked AS (
        SELECT j.name, count(*) AS n
        FROM x_jobs.job AS j
        WHERE j.state = 'delayed' AND j.run_at = 'infinity'
        GROUP BY j.name
    ),
    names AS (
        SELECT t.name FROM x_jobs.job_type AS t
        UNION
        SELECT n.name FROM live AS l CROSS JOIN LATERAL unnest(l.jobs) AS n (name)
        UNION
        SELECT p.name FROM parked AS p
    )
    SELECT n.name, t.queue, t.max_attempts, t.priority, t.dead_letter, t.backoff_base,
           t.backoff_max, t.keep_done, t.concurrency_key, t.concurrency_limit, t.timeout,
           t.declared_at, t.declared_by, t.build,
           coalesce((SELECT pg_catalog.array_agg(l.id ORDER BY l.id) FROM live AS l WHERE n.name = ANY (l.jobs)),
               '{}'),
           coalesce(p.n, 0)
    FROM names AS n
    LEFT JOIN x_jobs.job_type AS t ON t.name = n.name
    LEFT JOIN parked AS p ON p.name = n.name
    ORDER BY n.name COLLATE "C"
$$;

-- Forget the declaration of a job type, as an admin does for a job no build has any more: its
-- enqueues get the built-in defaults again. Answers whether there was one. Rows of the name are
-- left as they are (a parked one stays parked until a worker serves the name).
CREATE FUNCTION x_jobs.drop_job_type(name text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    DELETE FROM x_jobs.job_type AS t WHERE t.name = drop_job_type.name;
    RETURN FOUND;
END
$$;

-- Hand back jobs that `worker` claimed and has no handler for (a job type a newer build added,
-- in a rolling deploy): the attempt the claim counted is given back, as release does, but the
-- row is not due again at once, where the same worker would claim it again in a loop. If a live
-- worker that is not draining serves the row's name in its queue (it announced the name among
-- its jobs, or announced no list), the row is delayed by `delay`, for such a worker to claim
-- (any worker of the queue may: a claim takes rows whatever their name, so that its cost stays
-- flat beside rows of names nobody serves; a worker without the handler hands it back again,
-- once a delay). If none does, the row is parked: delayed until infinity, never due, counted by
-- no demand, until a worker that serves the name announces itself or it is declared (see
-- x_jobs.announce_worker, x_jobs._wake_parked). A worker that is not serving is seen only once
-- its announce commits: a row parked beside the first announce of a worker that serves it waits
-- for that worker's next announce. Answers each row handed back: id, name, whether it was
-- parked, and up to 10 of the live workers that serve it, by id.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.hand_back(ids bigint[], worker text, delay interval DEFAULT '1 second')
RETURNS TABLE (id bigint, name text, parked boolean, served_by text[])
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    PERFORM x_jobs._require_worker(hand_back.worker, 'Pass the id the worker claimed with.');
    IF hand_back.delay IS NULL OR hand_back.delay < interval '0' OR hand_back.delay > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ018',
            MESSAGE = pg_catalog.format('X_DELAY_INVALID: hand-back delay %s is not a delay',
                coalesce(hand_back.delay::text, 'NULL')),
            HINT = 'Pass a delay from zero to 1000 years, such as ''1 second'' (the default).';
    END IF;

    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.name, j.queue
        FROM x_jobs.job AS j
        WHERE j.id = ANY (hand_back.ids)
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = hand_back.worker
        -- Locked in id order whatever the plan (the rows are locked as they leave the sort), as
        -- the heartbeat and the settling functions lock them: no deadlock with either.
        ORDER BY j.id
        FOR UPDATE
    ),
    served AS (
        SELECT h.id, (
                   SELECT pg_catalog.array_agg(s.id ORDER BY s.id)
                   FROM (
                       SELECT w.id FROM x_jobs.worker AS w
                       WHERE w.expires_at > v_now
                           AND w.draining_at IS NULL
                           AND w.id <> hand_back.worker
                           AND h.queue = ANY (w.queues)
                           AND (w.jobs IS NULL OR h.name = ANY (w.jobs))
                       ORDER BY w.id
                       LIMIT 10
                   ) AS s
               ) AS servers
        FROM held AS h
    ),
    handed AS (
        UPDATE x_jobs.job AS j
        SET state = 'delayed',
            run_at = CASE WHEN s.servers IS NULL THEN 'infinity' ELSE v_now + hand_back.delay END,
            attempt = j.attempt - 1,
            visible_at = NULL,
            claimed_by = NULL,
            updated_at = v_now
        FROM served AS s
        WHERE j.id = s.id
        RETURNING j.id, j.name, s.servers
    )
    SELECT h.id, h.name, h.servers IS NULL, coalesce(h.servers, '{}')
    FROM handed AS h
    ORDER BY h.id;
END
$$;

-- Nothing is left to PUBLIC (see Grants in x_jobs.sql).
REVOKE ALL ON FUNCTION x_jobs._filled(x_jobs.enqueue_request, x_jobs.job_type) FROM public;
REVOKE ALL ON FUNCTION x_jobs.announce_worker(text, text[], text, boolean, interval, text[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs._wake_parked(text[], text[], integer) FROM public;
REVOKE ALL ON FUNCTION x_jobs._declare(x_jobs.job_type[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs._declarer(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.declare_job(
    text, text, integer, interval, interval, boolean, interval, integer, text, boolean, integer, text, text
) FROM public;
REVOKE ALL ON FUNCTION x_jobs.declare_jobs(jsonb, text, text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_types() FROM public;
REVOKE ALL ON FUNCTION x_jobs.drop_job_type(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.hand_back(bigint[], text, interval) FROM public;

GRANT EXECUTE ON FUNCTION x_jobs.announce_worker(text, text[], text, boolean, interval, text[]) TO x_jobs_worker;

-- Declarations (0.4.0). Workers declare the jobs they run, read the declarations and hand back
-- the jobs they have no handler for, through functions that run as their owner. Admins forget a
-- declaration: drop_job_type runs as the admin, who holds what it deletes.
GRANT EXECUTE ON FUNCTION x_jobs.declare_job(
    text, text, integer, interval, interval, boolean, interval, integer, text, boolean, integer, text, text
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.declare_jobs(jsonb, text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.job_types() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.hand_back(bigint[], text, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.drop_job_type(text) TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.job_type TO x_jobs_admin;

------------------------------------------------------------------------------------------------
-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
------------------------------------------------------------------------------------------------

SELECT x_jobs._adopt();
