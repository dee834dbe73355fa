\echo Use "CREATE EXTENSION x_jobs" to load this file. \quit

-- x_jobs: a durable job queue that lives inside PostgreSQL.
--
-- The objects. One table, x_jobs.job, holds every job from enqueue until it is purged; its
-- state says where it is (ready, delayed, suspended and running are live; done, failed, dead and
-- cancelled are terminal). Beside it: x_jobs.job_error (one row per failed attempt, for the
-- operator's `show`), x_jobs.queue_pause (queues held back), x_jobs.worker (who is serving and
-- who drains), x_jobs.queue_snapshot (the last count of the metrics gauges), x_jobs.counter (per
-- job name, per minute: how many settled and how), and for workflows x_jobs.step (what each run
-- did so far) and x_jobs.event (what was published); for messaging x_jobs.outbox (messages put in
-- application transactions, delivered by relays) and x_jobs.webhook_ledger (webhooks received, by
-- sender id); x_jobs.job_type holds what workers declare of each job (its enqueue defaults, its
-- timeout).
--
-- The flow.
--   enqueue / enqueue_many  insert rows, dedupe live idempotency keys, NOTIFY 'x_jobs' with the
--                           queue name for rows due now (a hint: workers also poll).
--   claim                   hands due rows and lapsed leases to a worker for `lease`, skipping
--                           locked rows, paused queues and full concurrency keys; a lapsed row
--                           on its final attempt is buried instead of handed out again.
--   extend_lease            the heartbeat of a running job; release hands jobs back (drain).
--   complete / fail         settle a row, only by the worker that holds it; fail retries with
--                           exponential backoff and jitter, or settles dead (or failed).
--   cancel / retry          the operator's: stop a live row, re-queue a finished one;
--   cancel_jobs / retry_jobs
--                           the same for every row that matches filters, in bounded batches;
--   list_jobs               and a keyset-paged listing.
--   queue_demand            what an autoscaler polls: the rows a serving worker must hold.
--   queue_gauges            the live rows per queue and state for metrics, counted at most once
--                           per max_age whoever asks (a snapshot in x_jobs.queue_snapshot).
--   declare_job / declare_jobs
--                           a worker records at its start what its jobs declare: enqueue fills
--                           what a request leaves out from there, for producers of any language.
--   hand_back               a worker gives back a job it has no handler for, the attempt not
--                           spent: delayed for a worker that serves it, else parked until one
--                           announces itself (announce_worker's jobs) or declares it.
--   steps / step_record     a run's memoized steps, replayed after a retry or a crash;
--   step_sleep / step_wait  suspend the run (no lease, no worker) until a time or an event;
--   publish / resolve_step  resolve waiting steps (an event, an operator) and make runs due.
--   outbox_put / relay_outbox / outbox_ack / outbox_nack / outbox_redrive
--                           the transactional outbox: put in the caller's transaction, relayed
--                           at least once, in order per key; receive_webhook: a webhook once.
--   purge / purge_events    retention: bounded deletes of old terminal rows (with their steps),
--   / purge_outbox          of old events and delivered messages;
--   / rollup_counters       folding of counters.
--   health                  what an installation should fix: its roles, the owner of the
--                           functions that run as their owner, the restart grace's right.
--
-- Conventions. Every function pins search_path and names our objects x_jobs.*. Public parameter
-- names are an API (callers use named notation), so bodies declare `#variable_conflict
-- use_column` and refer to parameters as function.parameter. The clock is x_jobs.now(), which
-- a test can move with SET x_jobs.fake_now. Every refusal raises SQLSTATE XJnnn with a message
-- that starts with its X_ code and a HINT; x_jobs.error_codes() lists them all.

CREATE SCHEMA x_jobs;

COMMENT ON SCHEMA x_jobs IS 'x_jobs: durable job queue (see x_jobs.error_codes() for refusals)';

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

------------------------------------------------------------------------------------------------
-- Types
------------------------------------------------------------------------------------------------

CREATE TYPE x_jobs.job_state AS ENUM (
    'ready',      -- due now: claimable
    'delayed',    -- due at run_at: a future enqueue or a retry waiting out its backoff
    'suspended',  -- waiting on a step (an event or a sleep); due at run_at if that is set
    'running',    -- held by claimed_by until visible_at (the lease)
    'done',
    'failed',     -- out of attempts, for a job that wants no dead letters
    'dead',       -- out of attempts, kept as a dead letter for inspection and retry
    'cancelled'   -- stopped by an operator; never handed to a worker again
);

-- One request of enqueue_many, and what enqueue builds from its arguments: the field names are
-- the JSON keys enqueue_many accepts. NULL means "not given": the default applies.
CREATE TYPE x_jobs.enqueue_request AS (
    name text,
    input jsonb,
    queue text,
    run_at timestamptz,
    idempotency_key text,
    max_attempts integer,
    priority integer,
    tenant_id text,
    concurrency_key text,
    concurrency_limit integer,
    traceparent text,
    enqueued_by text,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean
);

CREATE TYPE x_jobs.enqueue_result AS (
    id bigint,
    run_id uuid,
    deduped boolean
);

CREATE TYPE x_jobs.enqueue_many_result AS (
    ord integer,
    id bigint,
    run_id uuid,
    deduped boolean
);

------------------------------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------------------------------

-- Column order is for the write path. What enqueue sets once comes first, what claims and
-- settlements change comes last: an update whose new version lands on the same page is logged
-- as the bytes that differ between the common prefix and suffix of the two versions, so the
-- name, input and the rest are not written to WAL again on each claim and settle.
CREATE TABLE x_jobs.job (
    id bigint GENERATED ALWAYS AS IDENTITY,
    run_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    backoff_base interval NOT NULL,
    backoff_max interval NOT NULL,
    max_attempts integer NOT NULL,
    concurrency_limit integer,
    priority smallint NOT NULL DEFAULT 0,
    dead_letter boolean NOT NULL DEFAULT TRUE,
    name text NOT NULL, -- noqa: RF04
    queue text NOT NULL,
    tenant_id text NOT NULL,
    idempotency_key text,
    concurrency_key text,
    traceparent text,
    enqueued_by text,
    input jsonb NOT NULL, -- noqa: RF04
    state x_jobs.job_state NOT NULL,
    attempt integer NOT NULL DEFAULT 0,
    claims integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL,
    visible_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL,
    claimed_by text,
    output jsonb,
    progress jsonb,
    last_error text,
    last_error_stack text,
    -- Last, where ALTER TABLE ADD COLUMN put it in the 0.2.0 -> 0.3.0 update: a fresh install
    -- and an updated one have the same row type. It never changes, so it is in the common
    -- suffix of every version a claim or a settle writes.
    keep_done boolean NOT NULL DEFAULT TRUE,
    CONSTRAINT job_pkey PRIMARY KEY (id),
    CONSTRAINT job_attempt_in_range CHECK (attempt >= 0 AND attempt <= max_attempts),
    CONSTRAINT job_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT job_concurrency_limit_positive CHECK (concurrency_limit >= 1),
    CONSTRAINT job_running_is_held CHECK (
        state <> 'running' OR (claimed_by IS NOT NULL AND visible_at IS NOT NULL)
    )
)
-- Room on each page for the versions a claim and a settle write: a new version on the same page
-- is logged as its changed bytes only (see the column order). Measured 2026-11-29, 100 rows per
-- call: complete_many wrote 35.7 kB of WAL at fillfactor 100, 24 kB at 70.
WITH (fillfactor = 70);

COMMENT ON TABLE x_jobs.job IS 'Every job from enqueue until purge; state says where it is.';
COMMENT ON COLUMN x_jobs.job.visible_at IS 'Lease expiry of a running row: from then on, a claim may take the row.';
COMMENT ON COLUMN x_jobs.job.keep_done IS 'false: completing the job deletes its row, steps and errors.';
COMMENT ON COLUMN x_jobs.job.claims IS 'How many times a claim handed the row out (lapsed leases included).';

-- The claim's arms, one index each, every one partial so that done rows (the bulk of the table)
-- are in none of them. Each is scanned per queue in the claim's order, so a claim reads about
-- `qty` entries per arm whatever the backlog. The predicates are repeated word for word in
-- x_jobs.claim: the planner uses a partial index only when it can prove the predicate.
--
-- Rows with a concurrency key have indexes of their own (since 0.3.8): a key at its limit can
-- hold thousands of due rows that no claim may take, and a row without a key behind them was
-- reached only by stepping over all of them (170-330 ms a claim at 100,000). The keyed ones
-- carry the key and its limit, so that a claim ranks them per key without the heap.
CREATE INDEX job_ready_idx ON x_jobs.job (queue, priority, run_at, id)
WHERE state = 'ready' AND concurrency_key IS NULL;

CREATE INDEX job_waiting_idx ON x_jobs.job (queue, run_at, id)
WHERE state IN ('delayed', 'suspended') AND concurrency_key IS NULL;

CREATE INDEX job_ready_keyed_idx ON x_jobs.job (queue, priority, run_at, id)
INCLUDE (concurrency_key, concurrency_limit)
WHERE state = 'ready' AND concurrency_key IS NOT NULL;

CREATE INDEX job_waiting_keyed_idx ON x_jobs.job (queue, run_at, id)
INCLUDE (priority, concurrency_key, concurrency_limit)
WHERE state IN ('delayed', 'suspended') AND concurrency_key IS NOT NULL;

-- Only the claim's lapsed arm should read it. The statements that settle or heartbeat rows by
-- id compare state as text, which does not prove this predicate: given `state = 'running'`, the
-- planner reads every running row of every worker here whenever the statistics last saw few
-- running rows (a backlog analyzed before a drain), and complete_many of 250 ids beside 5,000
-- running rows took 15 ms instead of 1.5 (measured 2026-11-30). By id, the cost follows the ids.
CREATE INDEX job_running_idx ON x_jobs.job (queue, visible_at, id)
WHERE state = 'running';

-- An idempotency key is unique among live rows only: once its row settles, the key is free.
CREATE UNIQUE INDEX job_idempotency_key_idx ON x_jobs.job (idempotency_key)
WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended', 'running');

-- How many rows of a concurrency key run now: the claim counts here before it takes one.
CREATE INDEX job_concurrency_idx ON x_jobs.job (concurrency_key)
WHERE concurrency_key IS NOT NULL AND state = 'running';

-- The due rows of each concurrency key, per queue in the claim's grant order, with what
-- queue_demand reads of them, so that it ranks only keyed rows, without the heap. A claim whose
-- windows are full of keys without room seeks here the first rows of each key it visits with
-- room, in each of its queues (0.3.8: by key alone, it stepped over the key's rows in other
-- queues). Only keyed live rows that wait are in it: a row without a key never enters it, and a
-- claimed one leaves it.
CREATE INDEX job_keyed_idx ON x_jobs.job (concurrency_key, queue, priority, run_at, id)
INCLUDE (concurrency_limit)
WHERE concurrency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended');

-- The keys with waiting rows in each queue, each key's limits highest first: what the claim's
-- visit of keys walks, a seek from one key of its queues to the next, so that it never meets the
-- keys of other queues (0.3.9; it walked job_keyed_idx, every key of the table). The first entry
-- of a key tells the highest limit its rows there carry, which bounds how many of them can run.
-- The columns repeat row after row, which btree deduplication folds into one entry a key and
-- limit: small, and one more insert per keyed row that enters the waiting states.
CREATE INDEX job_queue_key_idx ON x_jobs.job (queue, concurrency_key, concurrency_limit DESC)
WHERE concurrency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended');

-- The rows that ended badly, for list_jobs to page newest first: few beside the done ones, and
-- a row enters only when it ends that way, so the claim and settle path pays nothing for it.
CREATE INDEX job_ended_idx ON x_jobs.job (id)
WHERE state IN ('dead', 'failed', 'cancelled');

-- One row per failed attempt (and per lapsed lease), so an operator sees every error, not only
-- the last one the job row keeps.
CREATE TABLE x_jobs.job_error (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    failed_at timestamptz NOT NULL,
    worker text,
    error text NOT NULL,
    error_stack text
);

CREATE INDEX job_error_job_idx ON x_jobs.job_error (job_id, attempt);

CREATE TABLE x_jobs.queue_pause (
    queue text NOT NULL,
    paused_at timestamptz NOT NULL,
    paused_by text NOT NULL,
    CONSTRAINT queue_pause_pkey PRIMARY KEY (queue)
);

CREATE TABLE x_jobs.worker (
    id text NOT NULL,
    queues text[] NOT NULL,
    build text,
    started_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    draining_at timestamptz,
    -- Last, where ALTER TABLE ADD COLUMN put it in the 0.3.9 -> 0.4.0 update.
    jobs text[],
    CONSTRAINT worker_pkey PRIMARY KEY (id)
);

COMMENT ON COLUMN x_jobs.worker.draining_at IS
'Set by the first draining announce and kept: queue_demand leaves what a draining worker holds out.';
COMMENT ON COLUMN x_jobs.worker.jobs IS
'The job names the worker has handlers for; NULL: it did not say, and is taken to serve every job of its queues.';

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

-- Per job name and bucket: what settled and how. Settling statements add to the current minute;
-- rollup_counters folds old minutes into hours and old hours into days, so the rows per job name
-- stay bounded whatever the throughput. `shard` spreads concurrent settlers over several rows of
-- one bucket: with one row, every settling transaction would queue behind the previous one's
-- commit on its row lock. Readers sum over shards.
CREATE TABLE x_jobs.counter (
    job text NOT NULL,
    bucket_seconds integer NOT NULL,
    bucket_start timestamptz NOT NULL,
    shard smallint NOT NULL,
    completed bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    dead bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    run_ms bigint NOT NULL DEFAULT 0,
    CONSTRAINT counter_pkey PRIMARY KEY (job, bucket_seconds, bucket_start, shard)
);

COMMENT ON COLUMN x_jobs.counter.run_ms IS
'Sum of the durations (claim to settle) of the attempts counted in this bucket.';

-- pg_dump keeps the rows of these tables (and the id sequence, so restored ids do not collide).
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_error', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.queue_pause', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.counter', '');

------------------------------------------------------------------------------------------------
-- Steps and events (0.2.0): durable workflows
------------------------------------------------------------------------------------------------

CREATE TYPE x_jobs.step_status AS ENUM (
    'waiting',  -- a sleep or a wait on an event: its run is suspended until this is resolved
    'done',     -- recorded: a replay answers the output without running the step again
    -- ended in an error: a wait that timed out (replayed as that error), a run step that
    -- raised (run again by the next attempt), a failed compensation
    'failed'
);

-- What a run did so far, one row per step it reached, so that a retried or re-claimed run skips
-- what already happened. Keyed by the job: a job's run_id never changes (x_jobs.retry keeps it,
-- so a re-queued workflow resumes). A compensation (saga) is recorded beside its step under the
-- same name.
CREATE TABLE x_jobs.step (
    job_id bigint NOT NULL,
    name text NOT NULL, -- noqa: RF04
    compensation boolean NOT NULL DEFAULT FALSE,
    kind text NOT NULL,
    created_at timestamptz NOT NULL,
    event text, -- noqa: RF04
    event_key text,
    match jsonb, -- noqa: RF04
    since timestamptz,
    timeout_at timestamptz,
    status x_jobs.step_status NOT NULL,
    attempt integer NOT NULL,
    output jsonb,
    error text,
    event_id bigint,
    resolved_by text,
    resolved_at timestamptz,
    CONSTRAINT step_pkey PRIMARY KEY (job_id, name, compensation),
    CONSTRAINT step_kind_known CHECK (kind IN ('run', 'sleep', 'wait')),
    CONSTRAINT step_wait_names_event CHECK (kind <> 'wait' OR event IS NOT NULL)
);

COMMENT ON TABLE x_jobs.step IS 'The recorded steps of each run: replayed, not re-run, after a retry or a crash.';
COMMENT ON COLUMN x_jobs.step.created_at IS 'When the run first reached the step.';
COMMENT ON COLUMN x_jobs.step.since IS 'A wait matches the events published from this instant on.';
COMMENT ON COLUMN x_jobs.step.timeout_at IS 'When a sleep ends, or when a wait gives up.';
COMMENT ON COLUMN x_jobs.step.resolved_by IS 'worker, event, timeout or operator.';

-- The open waits, which is all a publish reads: partial, so a publish costs the same beside a
-- million done steps as beside none. Keyed waits are found by (event, key), keyless ones by
-- (event, NULL).
CREATE INDEX step_waiting_idx ON x_jobs.step (event, event_key)
WHERE status = 'waiting';

-- Every published event, kept for the waits that reach their step after it was published (a
-- wait may ask for the events since its run began) and for the operator, until purge_events.
CREATE TABLE x_jobs.event (
    id bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL, -- noqa: RF04
    key text, -- noqa: RF04
    published_at timestamptz NOT NULL,
    payload jsonb,
    CONSTRAINT event_pkey PRIMARY KEY (id)
);

COMMENT ON COLUMN x_jobs.event.published_at IS
'The clock when the publish ran (not the transaction start), taken under the event''s lock.';

-- What a wait reaching its step looks up: the first event of a name (and key) since an instant.
CREATE INDEX event_name_idx ON x_jobs.event (name, published_at);

CREATE INDEX event_key_idx ON x_jobs.event (name, key, published_at)
WHERE key IS NOT NULL;

SELECT pg_catalog.pg_extension_config_dump('x_jobs.step', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.event', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.event_id_seq', '');

------------------------------------------------------------------------------------------------
-- The transactional outbox and the webhook ledger (0.2.0)
------------------------------------------------------------------------------------------------

CREATE TYPE x_jobs.outbox_state AS ENUM (
    'pending',    -- waiting for a relay, due at available_at (a retry waits out its backoff)
    'inflight',   -- held by `relay` until available_at (the lease)
    'delivered',
    'dead'        -- out of attempts, or refused for good by its sink: kept for redrive
);

-- Messages an application writes in its own transaction, delivered afterwards by relays, at
-- least once, in order per key. Column order as for x_jobs.job: what the put sets first, what
-- relays change last.
CREATE TABLE x_jobs.outbox (
    id bigint GENERATED ALWAYS AS IDENTITY,
    created_at timestamptz NOT NULL,
    max_attempts integer NOT NULL,
    topic text NOT NULL,
    key text, -- noqa: RF04
    headers jsonb NOT NULL,
    payload jsonb NOT NULL,
    state x_jobs.outbox_state NOT NULL,
    attempt integer NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL,
    relay text,
    delivered_at timestamptz,
    last_error text,
    CONSTRAINT outbox_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT outbox_inflight_is_held CHECK (state <> 'inflight' OR relay IS NOT NULL)
)
WITH (fillfactor = 80);

COMMENT ON TABLE x_jobs.outbox IS 'Messages put in application transactions, delivered by relays in order per key.';
COMMENT ON COLUMN x_jobs.outbox.available_at IS 'pending: due from then on; inflight: the lease expiry.';

-- The relay's arms, as the claim's: due pending messages without a key, due pending messages
-- with one, and lapsed leases, each in order, each partial so the delivered messages kept for
-- inspection are in none. Keyless and keyed pending messages are apart so that keyless ones
-- never wait behind the keyed messages of busy keys (see relay_outbox).
CREATE INDEX outbox_pending_keyless_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'pending' AND key IS NULL;

CREATE INDEX outbox_pending_keyed_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'pending' AND key IS NOT NULL;

CREATE INDEX outbox_inflight_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'inflight';

-- The undelivered messages of each key: its pending ones in put order, then those in flight.
-- A message goes out only when it heads its key (nothing earlier of its key is pending, nothing
-- of its key is in flight): two seeks here, each answered by its first entry. A key's first
-- entry is its head, which lets relay_outbox visit the keys one seek each.
CREATE INDEX outbox_key_idx ON x_jobs.outbox (key, state, id)
WHERE key IS NOT NULL AND state IN ('pending', 'inflight');

-- Webhooks received from other services, by their sender's message id: a redelivered webhook
-- finds its row and enqueues nothing again.
CREATE TABLE x_jobs.webhook_ledger (
    source text NOT NULL, -- noqa: RF04
    webhook_id text NOT NULL,
    received_at timestamptz NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT webhook_ledger_pkey PRIMARY KEY (source, webhook_id)
);

-- What purge_webhook_ledger deletes first.
CREATE INDEX webhook_ledger_received_idx ON x_jobs.webhook_ledger (received_at);

SELECT pg_catalog.pg_extension_config_dump('x_jobs.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.webhook_ledger', '');

------------------------------------------------------------------------------------------------
-- Declarations (0.4.0): job types, and the rows no worker serves
------------------------------------------------------------------------------------------------

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

------------------------------------------------------------------------------------------------
-- Functions: helpers
------------------------------------------------------------------------------------------------

-- The test clock: x_jobs.fake_now, for a session whose login role is a superuser, and for no
-- other. Any role can set a custom setting, and a clock moved forward makes every other worker's
-- lease look lapsed to the mover's claims, which would take those jobs while they run. By
-- session_user: SET ROLE and SECURITY DEFINER functions change current_user, not the login.
CREATE FUNCTION x_jobs._fake_now()
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_setting text := pg_catalog.current_setting('x_jobs.fake_now', true);
BEGIN
    IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user), FALSE) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ038',
            MESSAGE = pg_catalog.format('X_CLOCK_REFUSED: x_jobs.fake_now is set to %L, and role %I may not move the clock',
                v_setting, session_user),
            HINT = 'x_jobs.fake_now is a test clock for superuser sessions: RESET x_jobs.fake_now (or ALTER ROLE ... RESET).';
    END IF;
    RETURN v_setting::timestamptz;
END
$$;

-- The clock: now(), the transaction's start, unless a test moved it (x_jobs._fake_now). One
-- expression, and no SET search_path, so that the planner inlines it: the check costs nothing
-- while the setting is unset.
CREATE FUNCTION x_jobs.now()
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.now()
        ELSE x_jobs._fake_now()
    END
$$;

-- The catalogue of refusals: every SQLSTATE an x_jobs function raises, its X_ code, what it
-- means. The README's table is checked against it by the tests.
CREATE FUNCTION x_jobs.error_codes()
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
        ('XJ016', 'X_STATE_UNKNOWN', 'A state name is not one of the job states (list_outbox: of the outbox states).'),
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

-- The version of the SQL API installed here. Clients check it before they speak to the database
-- (the Python worker refuses one it cannot speak to); it answers the same whether the schema came
-- from CREATE EXTENSION or from `x-jobs install` on a server that allows no extension files.
-- Each version's script (and upgrade script) replaces this function with its own number.
CREATE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.1'::text
$$;

-- The bucket a settling statement adds to: its minute, in UTC whatever the session's TimeZone.
CREATE FUNCTION x_jobs._minute(p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT pg_catalog.date_trunc('minute', p_at, 'UTC')
$$;

-- Which counter shard this session adds to. One backend keeps to one shard, so two settlers
-- rarely share a row lock; readers sum over all shards.
CREATE FUNCTION x_jobs._shard()
RETURNS smallint
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT (pg_catalog.pg_backend_pid() % 16)::smallint
$$;

-- x_jobs.max_payload_bytes as set. Any role can SET a custom setting, and producers enqueue
-- through functions that run as their owner, so a session's own value counts only up to 1 MiB;
-- above it, only up to what ALTER DATABASE or ALTER ROLE set (the most specific, as PostgreSQL
-- applies them; only a superuser, or a role granted SET on it, may set those). The catalog is
-- read only for a value above 1 MiB.
--
-- A custom setting is any text, so a value is taken only as digits within 1..2147483647 and
-- refused otherwise: cast as it was, 'abc' or '4MB' failed every enqueue, put and complete with
-- a bare cast error, and '-5' was taken as a limit. Its own code, not X_PAYLOAD_TOO_LARGE: the
-- deployment's setting is wrong, not the caller's payload, and a client that refuses a payload
-- for good (a relay's job, a webhook answered 413) must retry this one once it is fixed.
CREATE FUNCTION x_jobs._max_payload_setting()
RETURNS integer
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value text := pg_catalog.current_setting('x_jobs.max_payload_bytes', true);
    v_scope text; -- where v_value was read: NULL, the session; else the ALTER that set it
    v_bytes integer;
    v_session integer;
BEGIN
    -- The session's value, then (above 1 MiB) the catalog's: each parsed and checked alike.
    LOOP
        v_bytes := CASE
            WHEN coalesce(v_value, '') = '' THEN 1048576
            -- Matched before the cast, so the cast cannot fail.
            WHEN v_value ~ '^\s*[0-9]{1,10}\s*$' THEN
                CASE WHEN v_value::bigint BETWEEN 1 AND 2147483647 THEN v_value::integer END
        END;
        IF v_bytes IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ040',
                MESSAGE = pg_catalog.format(
                    'X_SETTING_INVALID: x_jobs.max_payload_bytes %s is not a whole number of bytes '
                    'from 1 to 2147483647',
                    CASE
                        WHEN pg_catalog.length(v_value) > 64 THEN pg_catalog.format('%L... (%s characters)',
                            pg_catalog.left(v_value, 64), pg_catalog.length(v_value))
                        ELSE pg_catalog.quote_literal(v_value)
                    END),
                DETAIL = CASE
                    WHEN v_scope IS NULL
                        THEN 'As this session reads it (SET, ALTER ROLE, ALTER DATABASE or postgresql.conf).'
                    ELSE pg_catalog.format('Set by %s, which holds a session''s value above 1 MiB to it.', v_scope)
                END,
                HINT = 'Set it to a number of bytes without a unit, such as 4194304 for 4 MiB, or RESET it '
                    'for the default of 1 MiB (1048576).';
        END IF;
        EXIT WHEN v_session IS NOT NULL OR v_bytes <= 1048576;
        v_session := v_bytes;
        -- No row sets both to NULL: the catalog's cap is then the default.
        SELECT pg_catalog.substr(o.setting, pg_catalog.strpos(o.setting, '=') + 1),
               CASE WHEN d.setrole = 0 THEN 'ALTER DATABASE' ELSE 'ALTER ROLE' END
        INTO v_value, v_scope
        FROM pg_catalog.pg_db_role_setting AS d
        CROSS JOIN LATERAL pg_catalog.unnest(d.setconfig) AS o (setting)
        WHERE d.setdatabase IN (0, (SELECT b.oid FROM pg_catalog.pg_database AS b
                                    WHERE b.datname = pg_catalog.current_database()))
            AND d.setrole IN (0, (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user))
            AND pg_catalog.split_part(o.setting, '=', 1) = 'x_jobs.max_payload_bytes'
        ORDER BY d.setrole <> 0 DESC, d.setdatabase <> 0 DESC
        LIMIT 1;
    END LOOP;
    RETURN least(coalesce(v_session, v_bytes), v_bytes);
END
$$;

-- The size limit for inputs and outputs, default 1 MiB, set per database or role:
-- ALTER DATABASE app SET x_jobs.max_payload_bytes = 4194304. One expression, and no SET
-- search_path, so that the planner inlines it: unset, the limit costs nothing (as x_jobs.now()).
-- A value set is read by _max_payload_setting, whose plans are kept. Until 0.3.8 this was one
-- SQL function with a catalog subquery, planned afresh on every call: 0.7-1.4 ms a call against
-- 0.007 unset, 0.03 set to a plain number (measured 2026-11-30, 10,000 calls in a loop).
CREATE FUNCTION x_jobs._max_payload_bytes()
RETURNS integer
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.max_payload_bytes', true), '') = '' THEN 1048576
        ELSE x_jobs._max_payload_setting()
    END
$$;

-- A payload's size as the limit counts it: uncompressed. pg_column_size counts a value as it is
-- stored, and one read from a table can arrive compressed: 80 MB of one repeated letter passed
-- publish as 0.9 MB. A composite value holds its fields uncompressed, so a compressed payload is
-- measured inside a one-field row (less the row's 24-byte header).
CREATE FUNCTION x_jobs._payload_bytes(p_payload jsonb)
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN pg_catalog.pg_column_compression(p_payload) IS NULL THEN pg_catalog.pg_column_size(p_payload)
        ELSE pg_catalog.pg_column_size(ROW(p_payload)) - 24
    END
$$;

-- When the server last began to take connections: the end of its crash recovery (or of its
-- start, or of a standby's promotion), which can come long after pg_postmaster_start_time()
-- (a recovery of 700 MB of WAL took 2 s, and a busy server's minutes). The processes that start
-- then (the WAL writer, the autovacuum launcher) say when, to a role with pg_read_all_stats: it
-- runs as claim's owner, x_jobs_owner, which is granted it. A role without it (the owner under
-- `x-jobs install` by a database owner) sees no such process, and the postmaster's start stands
-- in: x_jobs.health() says so, and workers log it when they start. It reads
-- every backend's status, 0.2 ms a call: only claim's restart grace asks, and only for a lapsed
-- lease last renewed before the server started.
CREATE FUNCTION x_jobs._ready_since()
RETURNS timestamptz
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT GREATEST(pg_catalog.pg_postmaster_start_time(), max(a.backend_start))
    FROM pg_catalog.pg_stat_activity AS a
    WHERE a.backend_type IN ('walwriter', 'autovacuum launcher')
$$;

-- Run ids for `p_count` new jobs, as UUIDv7 (RFC 9562): 48 bits of Unix time in milliseconds,
-- then random bits that count up from a random start through the batch (the RFC's "monotonic
-- random" method), so ids sort by creation and a batch draws randomness once. One
-- gen_random_uuid per row cost a batch of 1,000 about 3 ms, an eighth of its enqueue_many.
CREATE FUNCTION x_jobs._run_ids(p_count integer)
RETURNS uuid[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- 32 hex digits; the 13th (version) and 17th (variant) are fixed, the others random.
    v_random text := pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '');
    v_prefix text := pg_catalog.lpad(pg_catalog.to_hex(pg_catalog.floor(
        pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint), 12, '0')
        || '7' || pg_catalog.substr(v_random, 1, 3);
    -- The low 64 bits: variant 10, then 62 bits starting below 2^60 (15 random hex digits), so
    -- counting through any batch cannot carry into the variant. As a signed bigint the variant
    -- bit is the sign: to_hex prints the two's complement, 16 digits from 8 to b.
    v_start bigint := -9223372036854775808
        + ('x' || pg_catalog.substr(v_random, 18, 15))::bit(60)::bigint;
BEGIN
    RETURN ARRAY(
        SELECT (v_prefix || pg_catalog.to_hex(v_start + g.i))::uuid
        FROM pg_catalog.generate_series(1, p_count) AS g (i)
    );
END
$$;

-- Every NOTIFY of a producer's call (enqueue, publish, outbox puts) goes through here, so that
-- a producer that wants throughput more than a wake-up can turn them off: SET x_jobs.notify =
-- off (per session, role or database). PostgreSQL serializes the commits of transactions that
-- notified, which costs concurrent producers about a third of their commits (docs/benchmarks.md);
-- workers and relays poll as well, so without notifications work waits at most a poll interval.
CREATE FUNCTION x_jobs._notify(p_channel text, p_payload text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(pg_catalog.current_setting('x_jobs.notify', true), '') <> 'off' THEN
        PERFORM pg_catalog.pg_notify(p_channel, p_payload);
    END IF;
END
$$;

-- The refusal of a missing, empty or over-long worker id, shared by every function a worker
-- calls. `p_hint` is the fix for the caller at hand: a new id to claim with, or the id it
-- claimed with. The id is the primary key of x_jobs.worker: past a btree entry's size (about
-- 2.7 kB) announce_worker failed with a bare 54000. 400 characters, as event keys, keep it
-- within that in any encoding, and every function refuses the id announce would refuse.
CREATE FUNCTION x_jobs._require_worker(p_worker text, p_hint text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_worker IS NULL OR p_worker = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ011',
            MESSAGE = pg_catalog.format('X_WORKER_INVALID: worker id %s is empty',
                coalesce(pg_catalog.quote_literal(p_worker), 'NULL')),
            HINT = p_hint;
    END IF;
    IF pg_catalog.length(p_worker) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ011',
            MESSAGE = pg_catalog.format('X_WORKER_INVALID: worker id %L... is %s characters, longer than 400',
                pg_catalog.left(p_worker, 64), pg_catalog.length(p_worker)),
            HINT = 'Use a worker id of 1 to 400 characters, such as host:pid:random.';
    END IF;
END
$$;

-- The refusal of a lease that is missing, not positive, or over 1000 years (one of many
-- millennia ended past what timestamptz holds: "timestamp out of range"), shared by the claims
-- and heartbeats of jobs and outbox messages. `p_hint` is the fix for the caller at hand.
CREATE FUNCTION x_jobs._require_lease(p_lease interval, p_hint text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive', coalesce(p_lease::text, 'NULL')),
            HINT = p_hint;
    END IF;
    IF p_lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years', p_lease),
            HINT = p_hint;
    END IF;
END
$$;

------------------------------------------------------------------------------------------------
-- Functions: enqueue
------------------------------------------------------------------------------------------------

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
CREATE FUNCTION x_jobs._enqueue(p_requests x_jobs.enqueue_request[])
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
CREATE FUNCTION x_jobs.enqueue(
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

-- Enqueue many jobs in one call: `jobs` is a JSON array of objects whose keys are enqueue's
-- argument names; a field left out or null takes the default, as in enqueue (the declaration's,
-- else the built-in one). Answers one row per request, in input order (ord from 1). A request
-- under a key that an earlier request of the batch took answers deduped, pointing at that row.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.enqueue_many(jobs jsonb)
RETURNS SETOF x_jobs.enqueue_many_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_bad record;
    v_fields text[];
    v_text_fields text[] := ARRAY[
        'name', 'queue', 'idempotency_key', 'tenant_id', 'concurrency_key', 'traceparent', 'enqueued_by'
    ];
    v_value text;
    v_requests x_jobs.enqueue_request[];
BEGIN
    IF enqueue_many.jobs IS NULL OR pg_catalog.jsonb_typeof(enqueue_many.jobs) <> 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ009',
            MESSAGE = pg_catalog.format('X_JOBS_INVALID: jobs is %s, not an array',
                coalesce(pg_catalog.jsonb_typeof(enqueue_many.jobs), 'NULL')),
            HINT = 'Pass a JSON array of objects, such as ''[{"name": "send_email", "input": {}}]''.';
    END IF;

    -- A typo in a key ("que" for "queue") would otherwise be dropped silently. The known keys
    -- are the attributes of x_jobs.enqueue_request, so a field added there is accepted here.
    v_fields := ARRAY(
        SELECT a.attname::text
        FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = 'x_jobs.enqueue_request'::regclass AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
    );
    -- The text fields must be JSON strings (or null, or left out): the cast below would take
    -- an object, an array or a number as its JSON text (a job named '{"a": 1}', a key "12").
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
    FROM pg_catalog.jsonb_array_elements(enqueue_many.jobs) WITH ORDINALITY AS e (value, ord)
    WHERE CASE
        WHEN pg_catalog.jsonb_typeof(e.value) <> 'object' THEN TRUE
        ELSE e.value - v_fields <> '{}'::jsonb
            OR pg_catalog.jsonb_typeof(e.value -> 'name') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'queue') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'idempotency_key') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'tenant_id') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'concurrency_key') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'traceparent') NOT IN ('string', 'null')
            OR pg_catalog.jsonb_typeof(e.value -> 'enqueued_by') NOT IN ('string', 'null')
    END
    ORDER BY e.ord
    LIMIT 1;

    IF FOUND THEN
        IF v_bad.kind <> 'object' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ009',
                MESSAGE = pg_catalog.format('X_JOBS_INVALID: request %s is %s, not an object',
                    v_bad.ord, v_bad.kind),
                HINT = 'Make every element of the array an object such as {"name": "send_email"}.';
        END IF;
        IF v_bad.key IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ009',
                MESSAGE = pg_catalog.format('X_JOBS_INVALID: request %s has an unknown field %L',
                    v_bad.ord, v_bad.key),
                HINT = pg_catalog.format('Use the argument names of x_jobs.enqueue: %s.',
                    pg_catalog.array_to_string(v_fields, ', '));
        END IF;
        v_value := (enqueue_many.jobs -> (v_bad.ord::integer - 1) -> v_bad.field)::text;
        RAISE EXCEPTION USING
            ERRCODE = 'XJ009',
            MESSAGE = pg_catalog.format('X_JOBS_INVALID: %s %s of request %s is not a string', v_bad.field,
                CASE WHEN pg_catalog.length(v_value) > 64
                    THEN pg_catalog.format('%s... (%s characters)', pg_catalog.left(v_value, 64),
                        pg_catalog.length(v_value))
                    ELSE v_value
                END, v_bad.ord),
            HINT = pg_catalog.format('Pass %s as JSON strings, such as {"name": "send_email", "queue": "mail"}, '
                'or leave them out (name is required).', pg_catalog.array_to_string(v_text_fields, ', '));
    END IF;

    BEGIN
        v_requests := ARRAY(
            SELECT r
            FROM pg_catalog.jsonb_populate_recordset(NULL::x_jobs.enqueue_request, enqueue_many.jobs) AS r
        );
    EXCEPTION
        WHEN data_exception THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ009',
                MESSAGE = pg_catalog.format('X_JOBS_INVALID: a field has the wrong type: %s', SQLERRM),
                HINT = 'Pass numbers for max_attempts, priority and concurrency_limit, ISO 8601 '
                    'strings for run_at, interval strings such as "5 seconds" for backoff fields.';
    END;

    RETURN QUERY SELECT * FROM x_jobs._enqueue(v_requests);
END
$$;

-- A job's outcome, as its producer may read it: state, output and last error, and nothing else of
-- the row (not its input). No row: no job has this id (never enqueued, purged after its
-- retention, or a keep_done => false job that completed).
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.result(id bigint)
RETURNS TABLE (state text, output jsonb, last_error text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.state::text, j.output, j.last_error FROM x_jobs.job AS j WHERE j.id = result.id
$$;

------------------------------------------------------------------------------------------------
-- Functions: claim and heartbeat
------------------------------------------------------------------------------------------------

-- Hand up to `qty` due jobs of `queues` to `worker` for `lease`. Answers the claimed rows
-- (state 'running', attempt counted) in claim order, and after them any row it buried (state
-- 'dead' or 'failed'): a worker runs only the rows whose state is 'running'.
--
-- SKIP LOCKED is the design: a row another claimer holds is passed over, never waited for, so
-- claimers never queue behind one another.
--
-- It SEEKS. For each open queue three ordered index scans, one per arm, each reading about `qty`
-- entries, whatever the backlog:
--   ready     job_ready_idx    rows due now, in (priority, run_at, id) order;
--   waiting   job_waiting_idx  delayed and suspended rows whose run_at came, in run_at order;
--   lapsed    job_running_idx  running rows whose lease (visible_at) ran out, in lease order
--                              (but not in the first lease after the server started: see there).
-- One `state IN (...) OR running` test over all queues cannot be served in order by any index:
-- it reads and sorts every due row, so a queue slows down exactly when it is behind. The outer
-- sort sees at most 3 x qty x queues rows. Priority orders the ready arm exactly; a row coming
-- due from a delay competes by priority among the earliest-due ones the waiting arm read.
-- The first two arms hold rows without a concurrency key; those with one, see below.
--
-- A lapsed row on its final attempt is buried instead (dead, or failed for a job that wants no
-- dead letters), counted, and returned with that state: handing it out again would be an attempt
-- past max_attempts every lease, forever. Its claimed_by is cleared, so the stalled body cannot
-- settle a row it lost.
--
-- Concurrency keys: a row with a key is taken only while fewer than its limit of the key's rows
-- run. Such rows are looked for in a window of each queue's oldest due keyed rows (10 x qty +
-- 100 ready ones in claim order, as many waiting ones), ranked per key, and as many of each
-- key's first ones as its room are locked in claim order, skipping those another claimer holds.
-- When a window is full of rows whose keys have no room (one key backed up by thousands) and
-- yields fewer than wanted, the claim visits the keys of its queues instead, at most as many
-- as the window holds rows, one seek from each key to the next, starting where the session's
-- last visit ended, and takes the first due rows of those with room. Until 0.3.8 the
-- ready arm walked every row of a full key ahead of it, keyed or not behind it: 170-330 ms a
-- claim at 100,000 (measured 2026-11-30). So a claim reads about the window when keyed rows
-- are at hand, and a few seeks per key of a window's worth of keys at worst.
-- The rows found are then granted under an advisory lock per key, counted again in a new
-- statement, so two claimers cannot both take the last slot. That needs READ COMMITTED, which
-- a claim refuses to run without.
--
-- Slots spent on rows it could not hand out (buried, or denied by a key) are claimed again in
-- up to two more passes. Rows a scan locked and the outer LIMIT dropped stay locked until the
-- transaction ends; called on its own, a claim is its own transaction and that is at once. Over
-- several queues the first pass reads first how many ready rows to lock in each (see there).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.claim(
    queues text[],
    worker text,
    lease interval DEFAULT '30 seconds',
    qty integer DEFAULT 1
)
RETURNS SETOF x_jobs.job
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Every call would otherwise be planned afresh: the generic plans are costed above the custom
-- ones (LIMIT of a parameter), so the plan cache keeps re-planning, which cost 2 ms a call here
-- (measured 2026-11-29: 3.0 ms against 1.0 ms for qty 10). The generic plans are the same seeks.
SET plan_cache_mode = force_generic_plan
-- A generic plan costs the LIMIT as if every due row were read, which is above the JIT
-- thresholds on a big table: each call then compiled its plan with LLVM (70-880 ms against 1 ms,
-- 1.1M rows). The seeks read a few rows; compiling never pays.
SET jit = off
-- Every statement is index walks and seeks from them. A generic plan costs a window as if it
-- were thousands of rows, which invites hashing the whole table to join it back.
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_window integer;
    v_window_full boolean;
    v_found bigint[];
    v_queues text[];
    v_pass integer := 0;
    v_want integer;
    v_got integer := 0;
    v_seen bigint[] := ARRAY[]::bigint[];
    v_picked integer;
    v_take bigint[];
    v_take_at tid[];
    v_bury bigint[];
    v_keyed bigint[];
    v_keys text[];
    v_lapsed bigint[];
    v_lapsed_attempt integer[];
    v_lapsed_worker text[];
    v_granted integer;
    v_busy_keys text[] := ARRAY[]::text[];
    v_claimed x_jobs.job[];
    v_buried x_jobs.job[];
    v_buried_all x_jobs.job[] := ARRAY[]::x_jobs.job[];
    v_limits integer[];
    v_peeked integer;
    v_cursor text;
    v_visit_keys text[];
    v_visit_lims integer[];
    v_last bigint;
BEGIN
    IF claim.queues IS NULL OR pg_catalog.cardinality(claim.queues) = 0
        OR EXISTS (SELECT FROM unnest(claim.queues) AS q WHERE q IS NULL OR q = '') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ010',
            MESSAGE = pg_catalog.format('X_QUEUES_INVALID: queue list %s names no queue',
                coalesce(claim.queues::text, 'NULL')),
            HINT = 'Pass the queues to serve, such as ARRAY[''default''].';
    END IF;
    PERFORM x_jobs._require_worker(
        claim.worker, 'Pass an id unique to the worker process, such as host:pid:random.'
    );
    PERFORM x_jobs._require_lease(
        claim.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );
    IF claim.qty IS NULL OR claim.qty < 1 OR claim.qty > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: qty %s is outside 1..1000',
                coalesce(claim.qty::text, 'NULL')),
            HINT = 'Pass how many jobs the worker has free slots for, from 1 to 1000.';
    END IF;
    -- READ UNCOMMITTED runs as READ COMMITTED in PostgreSQL, so only these two are refused.
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: claim cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call claim in its own READ COMMITTED transaction (autocommit).';
    END IF;

    -- While the server was down no holder could heartbeat: every lease that ran out meanwhile
    -- looks lapsed once it is back, and the first worker to reconnect took the jobs of the
    -- others, which still ran them (seen with a 3 s lease and an 8 s outage). So for one lease
    -- (this claim's) after the server took connections again, a lease last renewed before then
    -- is not taken as lapsed: its holder has that long to reconnect and renew it (a worker
    -- reconnects at least once a heartbeat interval). A holder that died meanwhile costs its
    -- jobs that much more wait. Counted from the end of recovery (_ready_since), not the
    -- postmaster's start: until 0.3.9 a crash recovery longer than the lease used the grace up
    -- before any holder could connect, and a crash of one backend (the postmaster resets every
    -- process and recovers, without starting again) gave no grace at all. The lapsed arm asks
    -- for it only when it meets a lapsed lease (an InitPlan runs on first use), so a claim
    -- with none pays nothing for it.

    -- A queue named twice would be two scans over one queue, and rows this statement locked are
    -- not skipped by itself: the repeat would spend slots on rows already picked.
    v_queues := ARRAY(
        SELECT DISTINCT q.queue
        FROM unnest(claim.queues) AS q (queue)
        WHERE NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = q.queue)
    );

    WHILE v_pass < 3 AND v_got < claim.qty AND pg_catalog.cardinality(v_queues) > 0 LOOP
        v_pass := v_pass + 1;
        v_want := claim.qty - v_got;
        v_granted := NULL;

        -- How many rows the ready arm may lock in each queue. Up to v_want in every queue, as
        -- the other arms, the outer LIMIT keeping v_want of them: over 10 queues with a backlog
        -- a claim of 50 locked 500 rows (a WAL record each), and took half again the time of a
        -- claim over one queue. So the first pass over several queues reads first, without
        -- locks, which queues hold the first v_want ready rows in claim order, and locks that
        -- many in each. A row another claimer holds is counted there and skipped below, where
        -- its queue's next row stands in; should a queue run out that way, the next pass locks
        -- as before, up to v_want in each.
        v_limits := pg_catalog.array_fill(v_want, ARRAY[pg_catalog.cardinality(v_queues)]);
        v_peeked := NULL;
        IF v_pass = 1 AND pg_catalog.cardinality(v_queues) > 1 THEN
            v_limits := ARRAY(
                SELECT count(t.queue)::integer
                FROM unnest(v_queues) WITH ORDINALITY AS q (queue, n)
                LEFT JOIN (
                    SELECT arm.queue
                    FROM unnest(v_queues) AS o (queue)
                    CROSS JOIN LATERAL (
                        SELECT j.queue, j.priority, j.run_at, j.id
                        FROM x_jobs.job AS j
                        WHERE j.queue = o.queue
                            AND j.state = 'ready' AND j.concurrency_key IS NULL
                            AND j.run_at <= v_now
                        ORDER BY j.priority, j.run_at, j.id
                        LIMIT v_want
                    ) AS arm
                    ORDER BY arm.priority, arm.run_at, arm.id
                    LIMIT v_want
                ) AS t ON t.queue = q.queue
                GROUP BY q.n
                ORDER BY q.n
            );
            v_peeked := (SELECT sum(l)::integer FROM unnest(v_limits) AS l);
        END IF;

        -- Rows with a concurrency key: the oldest due ones of each queue (ready ones in claim
        -- order, waiting ones in run_at order), ranked per key in grant order; each key's first
        -- ones up to its room are locked in claim order until v_want are held.
        v_window := 10 * v_want + 100;
        WITH win AS (
            SELECT o.queue, FALSE AS waiting, r.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.concurrency_limit
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'ready' AND j.concurrency_key IS NOT NULL
                    AND j.run_at <= v_now
                ORDER BY j.priority, j.run_at, j.id
                LIMIT v_window
            ) AS r
            UNION ALL
            SELECT o.queue, TRUE AS waiting, r.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.concurrency_limit
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
                    AND j.run_at <= v_now
                ORDER BY j.run_at, j.id
                LIMIT v_window
            ) AS r
        ),
        ranked AS (
            SELECT w.id, w.priority, w.run_at, w.concurrency_key, w.concurrency_limit,
                   pg_catalog.row_number() OVER (
                       PARTITION BY w.concurrency_key ORDER BY w.priority, w.run_at, w.id
                   ) AS rank
            FROM win AS w
            WHERE w.id <> ALL (v_seen)
        )
        SELECT coalesce((
                   SELECT pg_catalog.array_agg(t.id)
                   FROM (
                       SELECT l.id
                       FROM (
                           SELECT r.* FROM ranked AS r
                           WHERE r.rank <= r.concurrency_limit
                           ORDER BY r.priority, r.run_at, r.id
                       ) AS r
                       -- The key's running rows are counted here, for the rows reached in claim
                       -- order only: counted in the window they cost a seek per key in it.
                       CROSS JOIN LATERAL (
                           SELECT j.id FROM x_jobs.job AS j
                           WHERE j.id = r.id
                               AND j.state IN ('ready', 'delayed', 'suspended')
                               AND j.run_at <= v_now
                               AND r.rank <= r.concurrency_limit - (
                                   SELECT count(*) FROM x_jobs.job AS h
                                   WHERE h.concurrency_key = r.concurrency_key AND h.state = 'running'
                               )
                           FOR UPDATE SKIP LOCKED
                       ) AS l
                       ORDER BY r.priority, r.run_at, r.id
                       LIMIT v_want
                   ) AS t
               ), '{}'),
               EXISTS (
                   SELECT FROM win AS w GROUP BY w.queue, w.waiting HAVING count(*) >= v_window
               )
        INTO v_found, v_window_full;

        IF v_window_full AND pg_catalog.cardinality(v_found) < v_want THEN
            -- The windows are mostly rows of keys without room: visit the keys instead. Only keys
            -- with waiting rows in these queues, walked in key order through job_queue_key_idx
            -- (a seek per queue from one key to the next), at most v_window of them per pass, so
            -- that a claim costs the same beside 100 keys or 100,000 (until 0.3.9 it walked
            -- every key of every queue: 550-900 ms a claim beside 100,000 keys of another queue).
            -- The walk starts after the key the session's last visit ended on, and wraps around:
            -- successive claims reach every key. What it trades, in this fallback only: rows are
            -- taken key by key in walk order, not in (priority, run_at, id) order across keys, and
            -- a key behind v_window others waits for a later claim of this session (a session
            -- that claims once starts at the first key each time).
            v_cursor := coalesce(pg_catalog.current_setting('x_jobs.claim_key_cursor', true), '');
            v_visit_keys := '{}';
            v_visit_lims := '{}';
            -- Two laps: the keys after the cursor, then from the first key up to the cursor.
            FOR v_lap IN 1..2 LOOP
                EXIT WHEN pg_catalog.cardinality(v_visit_keys) >= v_window
                    OR (v_lap = 2 AND v_cursor = '');
                SELECT v_visit_keys || coalesce(pg_catalog.array_agg(k.key ORDER BY k.n), '{}'),
                       v_visit_lims || coalesce(pg_catalog.array_agg(k.lim ORDER BY k.n), '{}')
                INTO v_visit_keys, v_visit_lims
                FROM (
                    WITH RECURSIVE keys AS (
                        SELECT s.key, s.lim, 1 AS n
                        FROM (
                            -- Keys are never empty, so '' is before the first one.
                            SELECT f.key, max(f.lim) AS lim
                            FROM unnest(v_queues) AS o (queue)
                            CROSS JOIN LATERAL (
                                SELECT j.concurrency_key AS key, j.concurrency_limit AS lim
                                FROM x_jobs.job AS j
                                WHERE j.queue = o.queue
                                    AND j.concurrency_key > CASE WHEN v_lap = 1 THEN v_cursor ELSE '' END
                                    AND j.concurrency_key IS NOT NULL
                                    AND j.state IN ('ready', 'delayed', 'suspended')
                                ORDER BY j.concurrency_key, j.concurrency_limit DESC
                                LIMIT 1
                            ) AS f
                            GROUP BY f.key
                            ORDER BY f.key
                            LIMIT 1
                        ) AS s
                        UNION ALL
                        SELECT s.key, s.lim, k.n + 1
                        FROM keys AS k
                        CROSS JOIN LATERAL (
                            -- The next key of any of these queues, with the highest limit its rows
                            -- there carry (the index holds the limits of a key highest first):
                            -- no row of the key can run while its running rows reach that.
                            SELECT f.key, max(f.lim) AS lim
                            FROM unnest(v_queues) AS o (queue)
                            CROSS JOIN LATERAL (
                                SELECT j.concurrency_key AS key, j.concurrency_limit AS lim
                                FROM x_jobs.job AS j
                                WHERE j.queue = o.queue
                                    AND j.concurrency_key > k.key
                                    AND j.concurrency_key IS NOT NULL
                                    AND j.state IN ('ready', 'delayed', 'suspended')
                                ORDER BY j.concurrency_key, j.concurrency_limit DESC
                                LIMIT 1
                            ) AS f
                            GROUP BY f.key
                            ORDER BY f.key
                            LIMIT 1
                        ) AS s
                        WHERE k.n < v_window - pg_catalog.cardinality(v_visit_keys)
                            AND (v_lap = 1 OR k.key < v_cursor)
                    )
                    SELECT k.key, k.lim, k.n
                    FROM keys AS k
                    WHERE v_lap = 1 OR k.key <= v_cursor
                ) AS k;
            END LOOP;

            -- Of each key visited that has room by its highest limit, rank its first due rows in
            -- these queues in grant order and keep those whose own limit leaves room at their
            -- rank, as the window does (a row of a lower limit ahead, one from before the limit
            -- was raised, does not hide them). Ranks beyond the highest limit less the running
            -- rows cannot have room, so at most that many rows are read per queue (and at most
            -- v_window), plus ten to step over rows not due yet that rank ahead (a better
            -- priority). Locked key by key, in walk order, until enough are held.
            SELECT v_found || coalesce(pg_catalog.array_agg(t.id), '{}'), max(t.n)
            INTO v_found, v_last
            FROM (
                SELECT l.id, k.n
                FROM unnest(v_visit_keys, v_visit_lims) WITH ORDINALITY AS k (key, lim, n)
                CROSS JOIN LATERAL (
                    SELECT count(*) AS running FROM x_jobs.job AS h
                    WHERE h.concurrency_key = k.key AND h.state = 'running'
                ) AS b
                CROSS JOIN LATERAL (
                    SELECT r.id
                    FROM (
                        SELECT e.id, e.concurrency_limit,
                               pg_catalog.row_number() OVER (ORDER BY e.priority, e.run_at, e.id) AS rank
                        FROM unnest(v_queues) AS o (queue)
                        CROSS JOIN LATERAL (
                            SELECT e.id, e.priority, e.run_at, e.concurrency_limit
                            FROM x_jobs.job AS e
                            WHERE e.concurrency_key = k.key
                                AND e.queue = o.queue
                                AND e.concurrency_key IS NOT NULL
                                AND e.state IN ('ready', 'delayed', 'suspended')
                                AND e.id <> ALL (v_seen)
                                AND e.id <> ALL (v_found)
                            ORDER BY e.priority, e.run_at, e.id
                            LIMIT LEAST(GREATEST(k.lim - b.running, 0), v_window) + 10
                        ) AS e
                        WHERE e.run_at <= v_now
                    ) AS r
                    WHERE k.lim > b.running
                        AND r.rank <= r.concurrency_limit - b.running
                ) AS c
                CROSS JOIN LATERAL (
                    SELECT j.id FROM x_jobs.job AS j
                    WHERE j.id = c.id
                        AND j.state IN ('ready', 'delayed', 'suspended')
                        AND j.run_at <= v_now
                    FOR UPDATE SKIP LOCKED
                ) AS l
                LIMIT v_want - pg_catalog.cardinality(v_found)
            ) AS t;

            -- The next visit starts after the last key this one took a row of when it got enough
            -- (the keys after it get their turn before it comes again), else after the last key
            -- it walked.
            IF pg_catalog.cardinality(v_visit_keys) > 0 THEN
                PERFORM pg_catalog.set_config('x_jobs.claim_key_cursor',
                    v_visit_keys[CASE WHEN pg_catalog.cardinality(v_found) >= v_want THEN v_last
                                      ELSE pg_catalog.cardinality(v_visit_keys) END],
                    FALSE);
            END IF;
        END IF;

        SELECT count(*)::integer,
               coalesce(pg_catalog.array_agg(c.id) FILTER (
                   WHERE NOT c.exhausted AND (c.lapsed OR c.concurrency_key IS NULL)), '{}'),
               coalesce(pg_catalog.array_agg(c.at) FILTER (
                   WHERE NOT c.exhausted AND (c.lapsed OR c.concurrency_key IS NULL)), '{}'),
               coalesce(pg_catalog.array_agg(c.id) FILTER (WHERE c.exhausted), '{}'),
               coalesce(pg_catalog.array_agg(c.id) FILTER (
                   WHERE NOT c.lapsed AND c.concurrency_key IS NOT NULL), '{}'),
               coalesce(pg_catalog.array_agg(DISTINCT c.concurrency_key) FILTER (
                   WHERE NOT c.lapsed AND c.concurrency_key IS NOT NULL), '{}'),
               coalesce(pg_catalog.array_agg(c.id) FILTER (WHERE c.lapsed), '{}'),
               coalesce(pg_catalog.array_agg(c.attempt) FILTER (WHERE c.lapsed), '{}'),
               coalesce(pg_catalog.array_agg(c.claimed_by) FILTER (WHERE c.lapsed), '{}')
        INTO v_picked, v_take, v_take_at, v_bury, v_keyed, v_keys, v_lapsed, v_lapsed_attempt,
             v_lapsed_worker
        FROM (
            SELECT arm.*
            FROM unnest(v_queues, v_limits) AS o (queue, lim)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'ready' AND j.concurrency_key IS NULL
                    AND j.run_at <= v_now
                ORDER BY j.priority, j.run_at, j.id
                LIMIT o.lim
                FOR UPDATE SKIP LOCKED
            ) AS arm
            UNION ALL
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
                    AND j.run_at <= v_now
                ORDER BY j.run_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            UNION ALL
            -- Locked above already.
            SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                   j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
            FROM x_jobs.job AS j
            WHERE j.id = ANY (v_found)
            UNION ALL
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, TRUE AS lapsed,
                       j.attempt >= j.max_attempts AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'running'
                    AND j.visible_at <= v_now
                    AND (j.updated_at >= (SELECT x_jobs._ready_since())
                        OR v_now >= (SELECT x_jobs._ready_since()) + claim.lease)
                ORDER BY j.visible_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            ORDER BY 2, 3, 1
            LIMIT v_want
        ) AS c;

        -- Nothing to take; or, on a first pass that read its limits, nothing free under them.
        EXIT WHEN v_picked = 0 AND coalesce(v_peeked, 0) < v_want;

        IF pg_catalog.cardinality(v_keyed) > 0 THEN
            -- Serialize the claimers of each key, then count its running rows afresh: this
            -- statement's snapshot is taken after the locks, so it sees every claim that held
            -- them before. The rows not granted stay locked, unclaimed, until this call ends.
            -- It only tries, and leaves the rows of a key it cannot have now to other claims: a
            -- claim never waits for another claimer. Until 0.3.6 the first pass waited, in key
            -- order, which stalled every claimer of a key behind a claim made in a long
            -- transaction, and deadlocked two claims whose keys' hashes collided (the lock is
            -- taken on the hash, and text order is not hash order).
            v_busy_keys := ARRAY(
                SELECT k.key
                FROM unnest(v_keys) AS k (key)
                WHERE NOT pg_catalog.pg_try_advisory_xact_lock(2024061701, pg_catalog.hashtext(k.key))
            );

            v_granted := pg_catalog.cardinality(v_take);
            SELECT v_take || coalesce(pg_catalog.array_agg(g.id), '{}'),
                   v_take_at || coalesce(pg_catalog.array_agg(g.at), '{}')
            INTO v_take, v_take_at
            FROM (
                    SELECT j.id, j.ctid AS at,
                           pg_catalog.row_number() OVER (
                               PARTITION BY j.concurrency_key ORDER BY j.priority, j.run_at, j.id
                           ) AS rank,
                           j.concurrency_limit - (
                               SELECT count(*) FROM x_jobs.job AS h
                               WHERE h.concurrency_key = j.concurrency_key AND h.state = 'running'
                           ) AS room
                    FROM x_jobs.job AS j
                    WHERE j.id = ANY (v_keyed)
                        AND j.concurrency_key <> ALL (v_busy_keys)
                ) AS g
            WHERE g.rank <= g.room;
            v_granted := pg_catalog.cardinality(v_take) - v_granted;
            v_seen := v_seen || v_keyed;
        END IF;

        IF pg_catalog.cardinality(v_lapsed) = 0 THEN
            -- The common case, nothing lapsed and so nothing to bury, log or count: one update.
            -- By ctid: this call holds the picked rows locked, so they cannot have moved, and a
            -- TID scan reaches each at once where `id = ANY` descends the primary key per row.
            RETURN QUERY
            WITH claimed AS (
                UPDATE x_jobs.job AS j
                SET state = 'running',
                    attempt = j.attempt + 1,
                    claims = j.claims + 1,
                    claimed_by = claim.worker,
                    visible_at = v_now + claim.lease,
                    started_at = v_now,
                    updated_at = v_now
                WHERE j.ctid = ANY (v_take_at)
                RETURNING j.*
            )
            SELECT * FROM claimed AS c ORDER BY c.priority, c.run_at, c.id;
        ELSE
            -- Buried rows are answered after every claimed one, so they wait for the last pass.
            WITH buried AS (
                UPDATE x_jobs.job AS j
                SET state = CASE WHEN j.dead_letter THEN 'dead' ELSE 'failed' END::x_jobs.job_state,
                    visible_at = NULL,
                    claimed_by = NULL,
                    -- No attempt is left to run the compensations (code in the handler) of the
                    -- steps it completed: name those steps, as a final attempt that did not reach
                    -- them does, so that an operator knows what to undo by hand.
                    last_error = 'lease lapsed on the final attempt' || coalesce((
                        SELECT pg_catalog.format(
                            ': steps %s completed and their compensations, if any, did not run',
                            pg_catalog.string_agg(pg_catalog.quote_literal(s.name), ', ' ORDER BY s.created_at, s.name))
                        FROM x_jobs.step AS s
                        WHERE s.job_id = j.id AND s.kind = 'run' AND NOT s.compensation AND s.status = 'done'
                            AND NOT EXISTS (
                                SELECT FROM x_jobs.step AS c
                                WHERE c.job_id = s.job_id AND c.name = s.name AND c.compensation
                            )
                        HAVING count(*) > 0
                    ), ''),
                    last_error_stack = NULL,
                    finished_at = v_now,
                    updated_at = v_now
                WHERE j.id = ANY (v_bury)
                RETURNING j.*
            ),
            -- A lapsed lease is an attempt that ended without a word: keep it in the error history.
            lapse_logged AS (
                INSERT INTO x_jobs.job_error (job_id, attempt, failed_at, worker, error)
                SELECT l.id, l.attempt, v_now, l.worker,
                       'lease lapsed: the worker stopped heartbeating before it settled the job'
                FROM unnest(v_lapsed, v_lapsed_attempt, v_lapsed_worker) AS l (id, attempt, worker)
            ),
            counted AS (
                INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, retried, failed, dead)
                SELECT l.name, 60, x_jobs._minute(v_now), x_jobs._shard(),
                       count(*) FILTER (WHERE l.state = 'running'),
                       count(*) FILTER (WHERE l.state = 'failed'),
                       count(*) FILTER (WHERE l.state = 'dead')
                FROM (
                    SELECT b.name, b.state FROM buried AS b
                    UNION ALL
                    SELECT j.name, j.state FROM x_jobs.job AS j
                    WHERE j.id = ANY (v_lapsed) AND NOT j.id = ANY (v_bury)
                ) AS l
                GROUP BY l.name
                ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
                SET retried = c.retried + excluded.retried,
                    failed = c.failed + excluded.failed,
                    dead = c.dead + excluded.dead
            ),
            claimed AS (
                UPDATE x_jobs.job AS j
                SET state = 'running',
                    attempt = j.attempt + 1,
                    claims = j.claims + 1,
                    claimed_by = claim.worker,
                    visible_at = v_now + claim.lease,
                    started_at = v_now,
                    updated_at = v_now
                WHERE j.id = ANY (v_take)
                RETURNING j.*
            )
            SELECT (SELECT pg_catalog.array_agg(ROW(c.*)::x_jobs.job ORDER BY c.priority, c.run_at, c.id) FROM claimed AS c),
                   (SELECT pg_catalog.array_agg(ROW(b.*)::x_jobs.job) FROM buried AS b)
            INTO v_claimed, v_buried;

            RETURN QUERY SELECT * FROM unnest(v_claimed);
            v_buried_all := v_buried_all || coalesce(v_buried, ARRAY[]::x_jobs.job[]);
        END IF;

        v_got := v_got + pg_catalog.cardinality(v_take);
        -- Another pass only when this one spent slots on rows it could not hand out (buried, or
        -- denied by a key), since that may have freed a key or left due rows behind; a pick that
        -- came back short with nothing spent means the queues are drained.
        EXIT WHEN v_picked < v_want
            AND pg_catalog.cardinality(v_bury) = 0
            AND pg_catalog.cardinality(v_keyed) = coalesce(v_granted, 0)
            -- Short for a queue that ran out under the limit the first pass read for it?
            AND coalesce(v_peeked, 0) < v_want;
    END LOOP;

    RETURN QUERY SELECT * FROM unnest(v_buried_all);
END
$$;

-- The heartbeat: push the lease of the running rows `worker` holds among `ids` to now + lease.
-- Answers the ids still held; an id missing from the answer was lost (lapsed and re-claimed,
-- cancelled, or settled), and its body should stop.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.extend_lease(ids bigint[], worker text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned for a batch of any size, as complete_many is (see there).
SET plan_cache_mode = force_generic_plan
-- Index plans only: they lock the rows in id order, as complete_many does (see there).
SET enable_seqscan = off
-- A bitmap scan of the ids would lock the rows in the table's order, not in id order.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    PERFORM x_jobs._require_worker(extend_lease.worker, 'Pass the id the worker claimed with.');
    PERFORM x_jobs._require_lease(
        extend_lease.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );

    RETURN QUERY
    UPDATE x_jobs.job AS j
    SET visible_at = v_now + extend_lease.lease,
        updated_at = v_now
    WHERE j.id = ANY (extend_lease.ids)
        AND j.state::text = 'running' -- by id only: see job_running_idx
        AND j.claimed_by = extend_lease.worker
    RETURNING j.id;
END
$$;

-- Hand running jobs back: the worker holding them stops without running them to the end (a
-- drain whose grace ran out, a shutdown). They are due again at once, in their old place in the
-- queue (run_at is kept), and the interrupted attempt is not counted, so that deploys cannot
-- use up a job's attempts. Answers the ids released; those the worker no longer held are left.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.release(ids bigint[], worker text)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned for a batch of any size, as complete_many is (see there).
SET plan_cache_mode = force_generic_plan
-- Index plans only: they lock the rows in id order, as complete_many does (see there).
SET enable_seqscan = off
-- A bitmap scan of the ids would lock the rows in the table's order, not in id order.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_queues text[];
    v_ids bigint[];
BEGIN
    PERFORM x_jobs._require_worker(release.worker, 'Pass the id the worker claimed with.');

    WITH released AS (
        UPDATE x_jobs.job AS j
        SET state = 'ready',
            attempt = j.attempt - 1,
            visible_at = NULL,
            claimed_by = NULL,
            updated_at = v_now
        WHERE j.id = ANY (release.ids)
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = release.worker
        RETURNING j.id, j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(r.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT r.queue), '{}')
    INTO v_ids, v_queues
    FROM released AS r;

    -- Another worker should take them now, not at its next poll.
    PERFORM pg_catalog.pg_notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

------------------------------------------------------------------------------------------------
-- Functions: settle
------------------------------------------------------------------------------------------------

-- Complete the running rows `worker` holds among `ids`, with outputs[i] as the output of ids[i]
-- (outputs may be NULL: no output). Answers the ids it completed; an id missing from the answer
-- was not held by this worker (lapsed and re-claimed, cancelled, settled) and is left as it is.
-- The same transaction adds to the job name's counter bucket. A job enqueued with keep_done =>
-- false is deleted instead of kept as 'done', with its steps and error history: for jobs whose
-- result nobody reads, so that the table does not fill with rows only purge would delete.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.complete_many(ids bigint[], worker text, outputs jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned once, for a batch of any size: a seek per id. A custom plan knows the batch's size,
-- and with statistics that saw few running rows (a backlog analyzed before its workers
-- started) it read the whole table rather than seek a batch that is a tenth of it or so:
-- complete_many of 500 in a table of 20,000 rows took 52-57 ms against 7 (measured
-- 2026-11-30), so settling cost as much as the table was big.
SET plan_cache_mode = force_generic_plan
-- Rows are locked in id order, as extend_lease and release lock them: in another order a
-- worker's settlement and its heartbeat (two connections, often the same rows) could each hold
-- a row the other waits for ("deadlock detected", once in a benchmark drain, 2026-11-30). The
-- ids are sorted below and the index plans keep their order; a sequential scan would lock in
-- the table's order, and it is only ever chosen for a table too small to matter; a bitmap scan
-- would lock in the table's order too.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_max_payload integer := x_jobs._max_payload_bytes();
    v_big record;
    v_ids bigint[];
    v_outputs jsonb[];
    v_keep boolean;
    v_turn integer := 0;
    v_settled bigint[];
    v_names text[];
    v_started timestamptz[];
    v_done bigint[] := ARRAY[]::bigint[];
    v_done_names text[] := ARRAY[]::text[];
    v_done_started timestamptz[] := ARRAY[]::timestamptz[];
    v_dropped bigint[] := ARRAY[]::bigint[];
BEGIN
    PERFORM x_jobs._require_worker(complete_many.worker, 'Pass the id the worker claimed with.');
    IF complete_many.outputs IS NOT NULL
        AND pg_catalog.cardinality(complete_many.outputs) <> coalesce(pg_catalog.cardinality(complete_many.ids), 0) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ021',
            MESSAGE = pg_catalog.format('X_OUTPUTS_INVALID: %s outputs for %s ids',
                pg_catalog.cardinality(complete_many.outputs), coalesce(pg_catalog.cardinality(complete_many.ids), 0)),
            HINT = 'Pass one output per id, in the same order, or no outputs at all (NULL).';
    END IF;
    IF complete_many.outputs IS NOT NULL THEN
        SELECT o.id, pg_catalog.pg_column_size(o.output) AS bytes
        INTO v_big
        FROM unnest(complete_many.ids, complete_many.outputs) AS o (id, output)
        WHERE pg_catalog.pg_column_size(o.output) > v_max_payload
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ003',
                MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                    v_big.bytes, v_max_payload),
                DETAIL = pg_catalog.format('For job %s.', coalesce(v_big.id::text, 'NULL')),
                HINT = 'Store large results elsewhere and return a reference, or raise x_jobs.max_payload_bytes.';
        END IF;
    END IF;

    -- In id order, the order the rows are locked in (see enable_seqscan above). Without outputs
    -- (jobs that answered nothing) the ids go as they came: `id = ANY` walks the primary key in
    -- id order itself, and the update needs no join to an output per id (together 1.3-1.6 us of
    -- the 8-10 us a kept row's settle cost, measured 2026-11-30).
    IF complete_many.outputs IS NULL THEN
        v_ids := complete_many.ids;
    ELSE
        SELECT pg_catalog.array_agg(o.id ORDER BY o.id), pg_catalog.array_agg(o.output ORDER BY o.id)
        INTO v_ids, v_outputs
        FROM unnest(complete_many.ids, complete_many.outputs) AS o (id, output);
    END IF;
    -- A batch is mostly of one kind (one job's), so it is settled first the way its first job
    -- asks, kept (updated) or not (deleted), and only the ids that took no effect the other way:
    -- a row is looked up once. Trying the update first for every batch cost a deleted row a
    -- second lookup, a third of its settle (measured 2026-11-30: 16.8 against 11.0 us per row).
    v_keep := coalesce((SELECT j.keep_done FROM x_jobs.job AS j WHERE j.id = v_ids[1]), TRUE);
    WHILE v_turn < 2 AND coalesce(pg_catalog.cardinality(v_ids), 0) > 0 LOOP
        v_turn := v_turn + 1;
        IF v_keep AND v_outputs IS NULL THEN
            WITH kept AS (
                UPDATE x_jobs.job AS j
                SET state = 'done',
                    output = NULL,
                    visible_at = NULL,
                    finished_at = v_now,
                    updated_at = v_now
                WHERE j.id = ANY (v_ids)
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
                    AND j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(k.id), '{}'), pg_catalog.array_agg(k.name),
                   pg_catalog.array_agg(k.started_at)
            INTO v_settled, v_names, v_started
            FROM kept AS k;
        ELSIF v_keep THEN
            WITH kept AS (
                UPDATE x_jobs.job AS j
                SET state = 'done',
                    output = o.output,
                    visible_at = NULL,
                    finished_at = v_now,
                    updated_at = v_now
                FROM unnest(v_ids, v_outputs) AS o (id, output)
                WHERE j.id = o.id
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
                    AND j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(k.id), '{}'), pg_catalog.array_agg(k.name),
                   pg_catalog.array_agg(k.started_at)
            INTO v_settled, v_names, v_started
            FROM kept AS k;
        ELSE
            -- A delete writes no new row version and no index entry: about half the work of
            -- the update (measured 2026-11-30: 0.63 against 1.46 ms per 100 rows, 5.8 against
            -- 23 kB of WAL).
            WITH dropped AS (
                DELETE FROM x_jobs.job AS j
                WHERE j.id = ANY (v_ids)
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
                    AND NOT j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(d.id), '{}'), pg_catalog.array_agg(d.name),
                   pg_catalog.array_agg(d.started_at)
            INTO v_settled, v_names, v_started
            FROM dropped AS d;
            v_dropped := v_dropped || v_settled;
        END IF;
        v_done := v_done || v_settled;
        v_done_names := v_done_names || v_names;
        v_done_started := v_done_started || v_started;
        EXIT WHEN pg_catalog.cardinality(v_settled) = pg_catalog.cardinality(v_ids);
        -- Left: the other kind, and ids this worker no longer holds (which neither way takes).
        -- Still without outputs if the batch came without (an array of NULLs would take the
        -- join, which locks in the order of the ids, unsorted then).
        SELECT pg_catalog.array_agg(o.id),
               CASE WHEN v_outputs IS NOT NULL THEN pg_catalog.array_agg(o.output) END
        INTO v_ids, v_outputs
        FROM unnest(v_ids, v_outputs) AS o (id, output)
        WHERE NOT EXISTS (SELECT FROM unnest(v_settled) AS s (id) WHERE s.id = o.id);
        v_keep := NOT v_keep;
    END LOOP;

    IF pg_catalog.cardinality(v_done) > 0 THEN
        INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, completed, run_ms)
        SELECT d.name, 60, x_jobs._minute(v_now), x_jobs._shard(), count(*),
               coalesce(sum((extract(EPOCH FROM v_now - d.started_at) * 1000)::bigint), 0)
        FROM unnest(v_done_names, v_done_started) AS d (name, started_at)
        GROUP BY d.name
        ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
        SET completed = c.completed + excluded.completed,
            run_ms = c.run_ms + excluded.run_ms;
    END IF;
    -- What purge would delete with the rows later; only when the batch deleted some, so that
    -- settling kept jobs pays nothing for it.
    IF pg_catalog.cardinality(v_dropped) > 0 THEN
        DELETE FROM x_jobs.job_error AS e WHERE e.job_id = ANY (v_dropped);
        DELETE FROM x_jobs.step AS s WHERE s.job_id = ANY (v_dropped);
    END IF;
    RETURN QUERY SELECT unnest(v_done);
END
$$;

-- Complete one job: complete_many for a single id. Answers true when this worker held the row
-- and it is now done, false when the worker no longer held it (nothing changed).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.complete(id bigint, worker text, output jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT FROM x_jobs.complete_many(ARRAY[complete.id], complete.worker, ARRAY[complete.output])
    )
$$;

-- Fail the current attempt of a running row `worker` holds. With attempts left (and retryable)
-- the row waits out its backoff: retry_delay when given, else the row's exponential policy,
-- min(backoff_max, backoff_base * 2^(attempt - 1)), with equal jitter (a random half of it
-- added to the other half) so that a crowd failing together does not retry together. With no
-- attempts left, or retryable false, it settles dead, or failed for a job that wants no dead
-- letters. Answers the state the row is in now, or NULL when the worker no longer held it
-- (nothing changed). Every failed attempt is kept in x_jobs.job_error.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.fail(
    id bigint,
    worker text,
    error text,
    error_stack text DEFAULT NULL,
    retry_delay interval DEFAULT NULL,
    retryable boolean DEFAULT TRUE
)
RETURNS x_jobs.job_state
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_state x_jobs.job_state;
    v_queue text;
    v_error text;
    v_stack text;
BEGIN
    PERFORM x_jobs._require_worker(fail.worker, 'Pass the id the worker claimed with.');
    IF fail.error IS NULL OR fail.error = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ023',
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: job %s failed without an error message',
                coalesce(fail.id::text, 'NULL')),
            HINT = 'Pass what went wrong as error, such as the exception''s message.';
    END IF;
    IF fail.retry_delay < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ018',
            MESSAGE = pg_catalog.format('X_DELAY_INVALID: retry delay %s is negative', fail.retry_delay),
            HINT = 'Pass a delay of zero or more, or NULL for the job''s backoff policy.';
    END IF;
    -- The payload limit does not count error texts, and one of 5,000,000 characters was stored
    -- twice (the row and its history). Each is cut to 65,536 characters, with a note of its
    -- length, rather than refused: a worker reporting a failure must not be refused, or its job
    -- would stay running until the lease lapsed. (So are the errors of outbox_nack and steps.)
    v_error := CASE WHEN pg_catalog.length(fail.error) > 65536
        THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
            pg_catalog.left(fail.error, 65536), pg_catalog.length(fail.error))
        ELSE fail.error
    END;
    v_stack := CASE WHEN pg_catalog.length(fail.error_stack) > 65536
        THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
            pg_catalog.left(fail.error_stack, 65536), pg_catalog.length(fail.error_stack))
        ELSE fail.error_stack
    END;

    WITH failed AS (
        UPDATE x_jobs.job AS j
        SET state = CASE
                WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN
                    CASE WHEN j.dead_letter THEN 'dead' ELSE 'failed' END
                WHEN r.delay > interval '0' THEN 'delayed'
                ELSE 'ready'
            END::x_jobs.job_state,
            run_at = CASE
                WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN j.run_at
                ELSE v_now + r.delay
            END,
            finished_at = CASE
                WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN v_now
            END,
            visible_at = NULL,
            claimed_by = NULL,
            last_error = v_error,
            last_error_stack = v_stack,
            updated_at = v_now
        FROM (
            -- In seconds: an interval times 2^40 overflows ("interval out of range") once the base
            -- is above 8.4 s, and a job that could not fail would run until its lease lapsed.
            -- Due by the last day of the year 9999 at the latest: a backoff of many millennia put
            -- the retry past what timestamptz holds ("timestamp out of range", the same stuck
            -- row), or past what clients can read. (A day short: float seconds of that size are
            -- not exact to the microsecond.)
            SELECT pg_catalog.make_interval(secs => least(
                coalesce(
                    extract(EPOCH FROM fail.retry_delay)::float8,
                    least(
                        extract(EPOCH FROM k.backoff_max)::float8,
                        extract(EPOCH FROM k.backoff_base)::float8 * pg_catalog.power(2, least(k.attempt - 1, 60))
                    ) * (0.5 + pg_catalog.random() / 2)
                ),
                extract(EPOCH FROM timestamptz '9999-12-31 00:00:00+00' - v_now)::float8
            )) AS delay
            FROM x_jobs.job AS k
            WHERE k.id = fail.id
        ) AS r
        WHERE j.id = fail.id
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = fail.worker
        RETURNING j.id, j.name, j.queue, j.state, j.attempt, j.started_at
    ),
    logged AS (
        INSERT INTO x_jobs.job_error (job_id, attempt, failed_at, worker, error, error_stack)
        SELECT f.id, f.attempt, v_now, fail.worker, v_error, v_stack
        FROM failed AS f
    ),
    counted AS (
        INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, retried, failed, dead, run_ms)
        SELECT f.name, 60, x_jobs._minute(v_now), x_jobs._shard(),
               (f.state IN ('ready', 'delayed'))::integer,
               (f.state = 'failed')::integer,
               (f.state = 'dead')::integer,
               (extract(EPOCH FROM v_now - f.started_at) * 1000)::bigint
        FROM failed AS f
        ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
        SET retried = c.retried + excluded.retried,
            failed = c.failed + excluded.failed,
            dead = c.dead + excluded.dead,
            run_ms = c.run_ms + excluded.run_ms
    )
    SELECT f.state, f.queue INTO v_state, v_queue FROM failed AS f;

    -- A retry due at once is work for the queue now: wake it like an enqueue does.
    IF v_state = 'ready' THEN
        PERFORM pg_catalog.pg_notify('x_jobs', v_queue);
    END IF;
    RETURN v_state;
END
$$;

------------------------------------------------------------------------------------------------
-- Functions: steps and events (0.2.0)
------------------------------------------------------------------------------------------------
--
-- A run records each step it reaches. `steps` answers what is recorded (the worker replays it),
-- `step_record` keeps a step's result, and `step_sleep` / `step_wait` suspend the run: its row
-- becomes `suspended`, held by no worker, due again when the sleep ends, the wait times out, or
-- (`publish`, `resolve_step`) the step is resolved. A suspension is not an attempt: the row's
-- attempt count goes back by one, so that a workflow waiting on ten events keeps its retries.
--
-- The wait and the publish, without a lost wake-up. A wait checks the published events, then
-- suspends; a publish records its event, then resolves the open waits. Run side by side, each
-- could miss the other: the wait's check sees no event, the publish sees no wait yet. So both
-- take a transaction-scoped advisory lock on the event first (a publish a shared one on its name
-- and on its name and key; a wait an exclusive one on its name, or on its name and key when it
-- names a key), and read after the lock: whichever comes second sees what the first committed.
-- Publishes of one event never wait for each other; a wait waits for the publishes of its event
-- that are in flight, and a publish for the waits being registered.
--
-- The rule a wait matches by: the first event of its name (and key, and containing `match`)
-- published at or after `since`, which is when the run first reached the step unless the caller
-- passes an earlier instant (the Python client's since="run" passes the job's created_at, for an
-- event that may come before the run reaches its wait). `published_at` is the clock at the
-- publish, taken under the lock, so "before" and "after" are the order the locks gave.

-- The clock for events and first-reached instants: the wall clock (not the transaction start:
-- see "The wait and the publish" above), or the test clock as x_jobs.now() allows it.
CREATE FUNCTION x_jobs._clock()
RETURNS timestamptz
LANGUAGE sql
VOLATILE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.clock_timestamp()
        ELSE x_jobs._fake_now()
    END
$$;

-- The refusals shared by the step functions: the worker must hold the job (it is running and
-- claimed by `p_worker`), and the step needs a name. Locks the job row, so that a cancel or a
-- lapse-and-reclaim cannot slip in between the check and the write.
CREATE FUNCTION x_jobs._require_held(p_id bigint, p_worker text, p_step text)
RETURNS x_jobs.job
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job x_jobs.job;
BEGIN
    PERFORM x_jobs._require_worker(p_worker, 'Pass the id the worker claimed with.');
    IF p_step IS NOT NULL AND (p_step = '' OR pg_catalog.length(p_step) > 200) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ024',
            MESSAGE = pg_catalog.format('X_STEP_INVALID: step name %L is empty or longer than 200 characters',
                p_step),
            HINT = 'Name each step of a run with a short text unique within the run, such as ''charge''.';
    END IF;
    SELECT j.* INTO v_job FROM x_jobs.job AS j WHERE j.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(p_id::text, 'NULL')),
            HINT = 'Pass the id of the job the worker claimed.';
    END IF;
    IF v_job.state <> 'running' OR v_job.claimed_by IS DISTINCT FROM p_worker THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ026',
            MESSAGE = pg_catalog.format('X_JOB_NOT_HELD: job %s is %s and not held by worker %L',
                p_id, v_job.state, p_worker),
            -- A settled row keeps the worker that ran it in claimed_by; only a running row is held.
            DETAIL = CASE
                WHEN v_job.state = 'running' THEN pg_catalog.format('It is held by %s.',
                    coalesce(pg_catalog.quote_literal(v_job.claimed_by), 'no worker'))
                ELSE 'It is held by no worker.'
            END,
            HINT = 'The job was cancelled, or its lease lapsed and another worker took it: stop its body.';
    END IF;
    RETURN v_job;
END
$$;

-- The refusal of a bad event name, shared by publish and step_wait.
CREATE FUNCTION x_jobs._require_event(p_event text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_event IS NULL OR p_event = '' OR pg_catalog.length(p_event) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event name %s is missing, empty or longer than 200 characters',
                coalesce(pg_catalog.quote_literal(p_event), 'NULL')),
            HINT = 'Name the event with a short text, such as ''order.paid''.';
    END IF;
END
$$;

-- Suspend a held run on a step: no worker holds it, and it is due at `p_until` (infinity: only
-- a publish or an operator wakes it). The attempt the claim counted is given back.
CREATE FUNCTION x_jobs._suspend(p_id bigint, p_until timestamptz)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE x_jobs.job AS j
    SET state = 'suspended',
        run_at = p_until,
        attempt = j.attempt - 1,
        visible_at = NULL,
        claimed_by = NULL,
        updated_at = x_jobs.now()
    WHERE j.id = p_id
$$;

-- The steps a run recorded, for the worker to replay: first the timers that ran out are
-- resolved (a sleep is done, a wait failed with a timeout), then every step is answered in the
-- order the run reached them. Refused unless `worker` holds the job.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.steps(id bigint, worker text)
RETURNS SETOF x_jobs.step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    PERFORM x_jobs._require_held(steps.id, steps.worker, NULL);

    UPDATE x_jobs.step AS s
    SET status = CASE WHEN s.kind = 'sleep' THEN 'done' ELSE 'failed' END::x_jobs.step_status,
        error = CASE
            WHEN s.kind = 'wait' THEN pg_catalog.format(
                'X_STEP_TIMEOUT: no event %L%s came before %s', s.event,
                CASE WHEN s.event_key IS NULL THEN '' ELSE pg_catalog.format(' with key %L', s.event_key) END, s.timeout_at)
        END,
        resolved_by = 'timeout',
        resolved_at = v_now
    WHERE s.job_id = steps.id
        AND s.status = 'waiting'
        AND s.timeout_at <= v_now;

    RETURN QUERY
    SELECT s.* FROM x_jobs.step AS s
    WHERE s.job_id = steps.id
    ORDER BY s.created_at, s.compensation, s.name;
END
$$;

-- Record the result of a run step (or, compensation => true, of the compensation of a step):
-- its output, or the error it ended with (status failed). A done step is never changed: the
-- first result recorded is the one every replay answers. A failed one is replaced by the next
-- attempt's result. Answers the status recorded now.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.step_record(
    id bigint,
    worker text,
    step text,
    output jsonb DEFAULT NULL,
    error text DEFAULT NULL,
    compensation boolean DEFAULT FALSE
)
RETURNS x_jobs.step_status
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_status x_jobs.step_status;
    v_kind text;
BEGIN
    v_job := x_jobs._require_held(step_record.id, step_record.worker, coalesce(step_record.step, ''));
    IF x_jobs._payload_bytes(step_record.output) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(step_record.output), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For step %L of job %s.', step_record.step, step_record.id),
            HINT = 'Store large results elsewhere and return a reference, or raise x_jobs.max_payload_bytes.';
    END IF;

    INSERT INTO x_jobs.step AS s (
        job_id, name, compensation, kind, created_at, status, attempt, output, error,
        resolved_by, resolved_at
    )
    VALUES (
        step_record.id, step_record.step, coalesce(step_record.compensation, FALSE), 'run',
        x_jobs._clock(),
        CASE WHEN step_record.error IS NULL THEN 'done' ELSE 'failed' END::x_jobs.step_status,
        v_job.attempt, step_record.output,
        -- Cut, not refused, as fail cuts a job's error (see there).
        CASE WHEN pg_catalog.length(step_record.error) > 65536
            THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
                pg_catalog.left(step_record.error, 65536), pg_catalog.length(step_record.error))
            ELSE step_record.error
        END,
        'worker', v_now
    )
    ON CONFLICT (job_id, name, compensation) DO UPDATE
    SET status = excluded.status,
        attempt = excluded.attempt,
        output = excluded.output,
        error = excluded.error,
        resolved_at = excluded.resolved_at
    WHERE s.kind = 'run' AND s.status = 'failed'
    RETURNING s.status INTO v_status;

    IF v_status IS NOT NULL THEN
        RETURN v_status;
    END IF;
    SELECT s.status, s.kind INTO v_status, v_kind
    FROM x_jobs.step AS s
    WHERE s.job_id = step_record.id
        AND s.name = step_record.step
        AND s.compensation = coalesce(step_record.compensation, FALSE);
    IF v_kind <> 'run' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a run step',
                step_record.step, step_record.id, v_kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    RETURN v_status;
END
$$;

-- Sleep: suspend the run until `duration` after it first reached the step. A replay (after a
-- crash, or the claim that ends the sleep) finds the step and keeps its first wake-up time, so a
-- crash never restarts the sleep. Answers the step: status done when the time has come (go on),
-- waiting when the run is now suspended (the caller stops the body; its row is no longer held).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.step_sleep(id bigint, worker text, step text, duration interval)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
BEGIN
    v_job := x_jobs._require_held(step_sleep.id, step_sleep.worker, coalesce(step_sleep.step, ''));
    IF step_sleep.duration IS NULL OR step_sleep.duration < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: sleep of %s is missing or negative',
                coalesce(step_sleep.duration::text, 'NULL')),
            HINT = 'Pass a duration of zero or more, such as ''1 day''.';
    END IF;
    -- The run is due when the sleep ends: that must be a time clients can read, as enqueue's
    -- run_at (to the day: an interval's months count as 30 days here). Many millennia more
    -- were past what timestamptz holds, a bare "timestamp out of range".
    IF extract(EPOCH FROM step_sleep.duration)
        >= extract(EPOCH FROM timestamptz '10000-01-01 00:00:00+00' - v_now) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: sleep of %s ends past the year 9999',
                step_sleep.duration),
            HINT = 'Pass a duration that ends before the year 10000, such as ''1 day''.';
    END IF;

    INSERT INTO x_jobs.step AS s (job_id, name, kind, created_at, timeout_at, status, attempt)
    VALUES (step_sleep.id, step_sleep.step, 'sleep', x_jobs._clock(), v_now + step_sleep.duration,
        'waiting', v_job.attempt)
    ON CONFLICT (job_id, name, compensation) DO NOTHING;

    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = step_sleep.id AND s.name = step_sleep.step AND NOT s.compensation
    FOR UPDATE;
    IF v_step.kind <> 'sleep' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a sleep',
                step_sleep.step, step_sleep.id, v_step.kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    IF v_step.status = 'waiting' AND v_step.timeout_at <= v_now THEN
        UPDATE x_jobs.step AS s
        SET status = 'done', resolved_by = 'timeout', resolved_at = v_now
        WHERE s.job_id = step_sleep.id AND s.name = step_sleep.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSIF v_step.status = 'waiting' THEN
        PERFORM x_jobs._suspend(step_sleep.id, v_step.timeout_at);
    END IF;
    RETURN v_step;
END
$$;

-- Wait for an event: answers the step done (output: the event's payload) when a matching event
-- was published since `since` (default: when the run first reached this step), failed when the
-- timeout has passed, or waiting when the run is now suspended until a publish resolves the
-- step or the timeout comes. A wait names a key to match only events published with that key,
-- and `match` (a JSON object) to match only payloads that contain it. A replay keeps the step's
-- first `since` and timeout.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.step_wait(
    id bigint,
    worker text,
    step text,
    event text,
    event_key text DEFAULT NULL,
    match jsonb DEFAULT NULL,
    timeout interval DEFAULT NULL,
    since timestamptz DEFAULT NULL
)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
    v_reached timestamptz;
    v_event record;
BEGIN
    -- The event lookup below must see every publish that committed before the lock: a snapshot
    -- taken at the transaction's start would miss one that came while the lock was awaited, and
    -- that publish found no step to wake, so the run would sleep past its event.
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: step_wait cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Wait from a READ COMMITTED transaction (the default).';
    END IF;
    v_job := x_jobs._require_held(step_wait.id, step_wait.worker, coalesce(step_wait.step, ''));
    PERFORM x_jobs._require_event(step_wait.event);
    -- The key is in the events' and the waits' indexes with the name: past a btree entry's size
    -- (about 2.7 kB) an insert failed with a bare 54000. 400 characters keep both within it.
    IF pg_catalog.length(step_wait.event_key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event key %s is longer than 400 characters',
                pg_catalog.quote_literal(pg_catalog.left(step_wait.event_key, 410))),
            HINT = 'Key events with a short text, such as an order id; put the rest in the payload.';
    END IF;
    IF step_wait.timeout < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s is negative', step_wait.timeout),
            HINT = 'Pass a timeout of zero or more, or NULL to wait for as long as it takes.';
    END IF;
    -- As step_sleep: the run is due when the timeout ends, a time clients must be able to read.
    IF extract(EPOCH FROM step_wait.timeout)
        >= extract(EPOCH FROM timestamptz '10000-01-01 00:00:00+00' - v_now) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s ends past the year 9999',
                step_wait.timeout),
            HINT = 'Pass a timeout that ends before the year 10000, or NULL to wait for as long as it takes.';
    END IF;
    IF step_wait.match IS NOT NULL AND pg_catalog.jsonb_typeof(step_wait.match) <> 'object' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ029',
            MESSAGE = pg_catalog.format('X_MATCH_INVALID: match %s is not a JSON object', step_wait.match),
            HINT = 'Pass an object that the payload must contain, such as ''{"order": 42}''.';
    END IF;

    -- See "The wait and the publish": after this lock, every publish of this event that came
    -- first has committed, and every one that comes later waits for this transaction.
    IF step_wait.event_key IS NULL THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(2024061702, pg_catalog.hashtext(step_wait.event));
    ELSE
        PERFORM pg_catalog.pg_advisory_xact_lock(2024061703,
            pg_catalog.hashtext(step_wait.event || E'\x1f' || step_wait.event_key));
    END IF;
    v_reached := x_jobs._clock();

    INSERT INTO x_jobs.step AS s (
        job_id, name, kind, created_at, event, event_key, match, since, timeout_at, status, attempt
    )
    VALUES (
        step_wait.id, step_wait.step, 'wait', v_reached, step_wait.event, step_wait.event_key,
        step_wait.match, least(v_reached, coalesce(step_wait.since, v_reached)),
        v_now + step_wait.timeout, 'waiting', v_job.attempt
    )
    ON CONFLICT (job_id, name, compensation) DO NOTHING;

    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
    FOR UPDATE;
    IF v_step.kind <> 'wait' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a wait',
                step_wait.step, step_wait.id, v_step.kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    IF v_step.status <> 'waiting' THEN
        RETURN v_step;
    END IF;

    SELECT e.id, e.payload INTO v_event
    FROM x_jobs.event AS e
    WHERE e.name = v_step.event
        AND (v_step.event_key IS NULL OR e.key = v_step.event_key)
        AND (v_step.match IS NULL OR e.payload @> v_step.match)
        AND e.published_at >= v_step.since
    ORDER BY e.published_at, e.id
    LIMIT 1;

    IF v_event.id IS NOT NULL THEN
        UPDATE x_jobs.step AS s
        SET status = 'done', output = v_event.payload, event_id = v_event.id,
            resolved_by = 'event', resolved_at = v_now
        WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSIF v_step.timeout_at <= v_now THEN
        UPDATE x_jobs.step AS s
        SET status = 'failed',
            error = pg_catalog.format('X_STEP_TIMEOUT: no event %L%s came before %s', s.event,
                CASE WHEN s.event_key IS NULL THEN '' ELSE pg_catalog.format(' with key %L', s.event_key) END, s.timeout_at),
            resolved_by = 'timeout', resolved_at = v_now
        WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSE
        PERFORM x_jobs._suspend(step_wait.id, coalesce(v_step.timeout_at, 'infinity'));
    END IF;
    RETURN v_step;
END
$$;

-- Publish an event, in the caller's transaction: it is recorded, the open waits that match it
-- are resolved with its payload, their suspended runs are due at once and their queues are
-- notified, all when the caller commits (a rollback wakes nobody). A wait matches when it names
-- this event, names no key or this key, and its `match` is contained in the payload. Answers
-- the event's id and how many runs it woke.
--
-- READ COMMITTED only: the waits registered while this publish waited for the event's lock are
-- read by a statement after it, which under a transaction snapshot would not see them.
--
-- SECURITY DEFINER: a producer publishes (records an event, resolves the waits on it, makes
-- their runs due) without any right to write jobs or steps itself. Every name in the body is
-- schema-qualified and search_path is pinned with pg_temp last.
CREATE FUNCTION x_jobs.publish(event text, payload jsonb DEFAULT NULL, key text DEFAULT NULL)
RETURNS TABLE (event_id bigint, woken integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_id bigint;
    v_jobs bigint[];
    v_queues text[];
BEGIN
    PERFORM x_jobs._require_event(publish.event);
    -- The key is in the events' and the waits' indexes with the name: past a btree entry's size
    -- (about 2.7 kB) an insert failed with a bare 54000. 400 characters keep both within it.
    IF pg_catalog.length(publish.key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event key %s is longer than 400 characters',
                pg_catalog.quote_literal(pg_catalog.left(publish.key, 410))),
            HINT = 'Key events with a short text, such as an order id; put the rest in the payload.';
    END IF;
    IF x_jobs._payload_bytes(publish.payload) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(publish.payload), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For event %L.', publish.event),
            HINT = 'Publish a reference to large data, or raise x_jobs.max_payload_bytes.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: publish cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Publish from a READ COMMITTED transaction (the default).';
    END IF;

    PERFORM pg_catalog.pg_advisory_xact_lock_shared(2024061702, pg_catalog.hashtext(publish.event));
    IF publish.key IS NOT NULL THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(2024061703,
            pg_catalog.hashtext(publish.event || E'\x1f' || publish.key));
    END IF;

    INSERT INTO x_jobs.event (name, key, published_at, payload)
    VALUES (publish.event, publish.key, x_jobs._clock(), publish.payload)
    RETURNING id INTO v_id;

    -- The matching waits, locked in job order so that two publishes resolving the same steps
    -- cannot deadlock; a wait resolved meanwhile by another publish is passed over.
    WITH matched AS (
        SELECT s.job_id, s.name
        FROM x_jobs.step AS s
        WHERE s.status = 'waiting'
            AND s.event = publish.event
            AND (s.event_key IS NULL OR s.event_key = publish.key)
            AND (s.match IS NULL OR publish.payload @> s.match)
        ORDER BY s.job_id, s.name
        FOR UPDATE
    ),
    resolved AS (
        UPDATE x_jobs.step AS s
        SET status = 'done', output = publish.payload, event_id = v_id,
            resolved_by = 'event', resolved_at = v_now
        FROM matched AS m
        WHERE s.job_id = m.job_id AND s.name = m.name AND NOT s.compensation
            AND s.status = 'waiting'
        RETURNING s.job_id
    ),
    woke AS (
        UPDATE x_jobs.job AS j
        SET state = 'ready', run_at = v_now, updated_at = v_now
        FROM resolved AS r
        WHERE j.id = r.job_id AND j.state = 'suspended'
        RETURNING j.id, j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(w.id), '{}'), coalesce(pg_catalog.array_agg(DISTINCT w.queue), '{}')
    INTO v_jobs, v_queues
    FROM woke AS w;

    PERFORM x_jobs._notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
    RETURN QUERY SELECT v_id, pg_catalog.cardinality(v_jobs);
END
$$;

-- An operator resolves a waiting step by hand (a sleep to end now, an approval given outside the
-- system): the step is done with `output`, and its run, if suspended, is due at once. Refused
-- while a worker holds the job (its body may be about to record the step itself).
CREATE FUNCTION x_jobs.resolve_step(job bigint, step text, output jsonb DEFAULT NULL)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
BEGIN
    -- The step row is locked before the job row, as publish locks them: the other order could
    -- deadlock with a publish of the same event (and abort the publisher's transaction).
    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = resolve_step.job AND s.name = resolve_step.step AND NOT s.compensation
    FOR UPDATE;
    SELECT j.* INTO v_job FROM x_jobs.job AS j WHERE j.id = resolve_step.job FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(resolve_step.job::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    IF v_job.state = 'running' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ030',
            MESSAGE = pg_catalog.format('X_JOB_HELD: job %s is running on worker %L', resolve_step.job,
                v_job.claimed_by),
            HINT = 'Resolve a step while its run is suspended; wait for the worker to suspend or settle it.';
    END IF;

    IF v_step.job_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ031',
            MESSAGE = pg_catalog.format('X_STEP_NOT_FOUND: job %s has no step %L', resolve_step.job,
                coalesce(resolve_step.step, 'NULL')),
            HINT = 'List the job''s steps with `x-jobs jobs show`; a step exists once the run reached it.';
    END IF;
    IF v_step.status <> 'waiting' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ032',
            MESSAGE = pg_catalog.format('X_STEP_NOT_WAITING: step %L of job %s is %s', resolve_step.step,
                resolve_step.job, v_step.status),
            HINT = 'Only a waiting step (a sleep or a wait on an event) can be resolved.';
    END IF;
    IF x_jobs._payload_bytes(resolve_step.output) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(resolve_step.output), x_jobs._max_payload_bytes()),
            HINT = 'Pass a smaller output, or raise x_jobs.max_payload_bytes.';
    END IF;

    UPDATE x_jobs.step AS s
    SET status = 'done', output = resolve_step.output, resolved_by = 'operator', resolved_at = v_now
    WHERE s.job_id = resolve_step.job AND s.name = resolve_step.step AND NOT s.compensation
    RETURNING s.* INTO v_step;

    IF v_job.state = 'suspended' THEN
        UPDATE x_jobs.job AS j
        SET state = 'ready', run_at = v_now, updated_at = v_now
        WHERE j.id = resolve_step.job;
        PERFORM pg_catalog.pg_notify('x_jobs', v_job.queue);
    END IF;
    RETURN v_step;
END
$$;

-- A running job's progress, as its body reports it: done out of total (either may be NULL) and
-- a note, with the instant. Answers true, or false when the worker no longer holds the job
-- (nothing changed: its body should stop).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.progress(
    id bigint,
    worker text,
    done double precision DEFAULT NULL,
    total double precision DEFAULT NULL,
    note text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM x_jobs._require_worker(progress.worker, 'Pass the id the worker claimed with.');
    -- NaN and the infinities are no JSON numbers (jsonb writes them as strings), and NaN sorts
    -- above every number, so that a NaN total passed the `done > total` test.
    IF progress.done < 0 OR progress.total < 0 OR progress.done > progress.total
        OR progress.done IN ('NaN', 'Infinity') OR progress.total IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ033',
            MESSAGE = pg_catalog.format('X_PROGRESS_INVALID: progress %s of %s is negative, not finite or past the total',
                coalesce(progress.done::text, 'NULL'), coalesce(progress.total::text, 'NULL')),
            HINT = 'Report done and total as finite numbers of zero or more, with done <= total.';
    END IF;
    -- A message of its own: under the one above, a long note was reported as "progress NULL of
    -- NULL is negative, not finite or past the total".
    IF pg_catalog.length(progress.note) > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ033',
            MESSAGE = pg_catalog.format('X_PROGRESS_INVALID: progress note %L... is %s characters, longer than 1000',
                pg_catalog.left(progress.note, 64), pg_catalog.length(progress.note)),
            HINT = 'Keep a progress note to 1000 characters; log the rest, or put it in the job''s output.';
    END IF;

    UPDATE x_jobs.job AS j
    SET progress = pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
            'done', progress.done, 'total', progress.total, 'note', progress.note,
            'at', x_jobs._clock()))
    WHERE j.id = progress.id
        AND j.state::text = 'running' -- by id only: see job_running_idx
        AND j.claimed_by = progress.worker;
    RETURN FOUND;
END
$$;

-- The refusal of bad retention arguments, shared by purge_events, purge_outbox and
-- purge_webhook_ledger: `p_what` names what is purged, `p_age` is an age that suits it.
CREATE FUNCTION x_jobs._require_retention(
    p_what text, p_older_than interval, p_batch_size integer, p_age text
)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- At most 1000 years (as the x-jobs maintain command): now() minus many millennia is past
    -- what timestamptz holds, a bare "timestamp out of range".
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_older_than > interval '1000 years'
        OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: purge %s older than %s in batches of %s',
                p_what, coalesce(p_older_than::text, 'NULL'), coalesce(p_batch_size::text, 'NULL')),
            HINT = pg_catalog.format('Pass an age from zero to 1000 years, %s, and a batch size of 1 or more.',
                p_age);
    END IF;
END
$$;

-- Retention for events: delete up to `batch_size` events published before now - older_than,
-- lowest id first (nearly oldest first, along the primary key). Answers how many; call it again
-- until it answers less than batch_size. A wait that asks for events since an instant older
-- than the retention will not see the purged ones. Run one purger at a time: it takes no row
-- locks to skip (admins may delete events, not update them).
CREATE FUNCTION x_jobs.purge_events(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('events', purge_events.older_than, purge_events.batch_size,
        'such as ''30 days''');

    -- The batch is picked once, as an array, as purge picks its own (see there).
    DELETE FROM x_jobs.event AS e
    WHERE e.id = ANY (ARRAY(
        SELECT k.id
        FROM x_jobs.event AS k
        WHERE k.published_at < x_jobs.now() - purge_events.older_than
        ORDER BY k.id
        LIMIT purge_events.batch_size
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

------------------------------------------------------------------------------------------------
-- Functions: the outbox and its relays (0.2.0)
------------------------------------------------------------------------------------------------
--
-- outbox_put / outbox_put_many  write messages in the caller's transaction (a rollback leaves
--                               nothing) and NOTIFY 'x_jobs_outbox' with the topic.
-- relay_outbox                  hands a relay the oldest due messages, at most one per key in
--                               flight, for `lease`; lapsed leases are handed out again.
-- outbox_ack / outbox_nack      settle them, only by the relay that holds them: delivered, or
--                               back to pending after a backoff, or dead.
-- outbox_redrive                dead messages back to pending; purge_outbox: retention.

-- The refusals shared by the put functions: a topic, headers that are an object, a payload.
CREATE FUNCTION x_jobs._require_message(
    p_topic text, p_payload jsonb, p_headers jsonb, p_max_attempts integer
)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_topic IS NULL OR p_topic = '' OR pg_catalog.length(p_topic) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ034',
            MESSAGE = pg_catalog.format('X_TOPIC_INVALID: topic %s is missing, empty or longer than 200 characters',
                coalesce(pg_catalog.quote_literal(p_topic), 'NULL')),
            HINT = 'Name the topic the relays route by, such as ''orders.created''.';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: message of topic %L has no payload', p_topic),
            HINT = 'Pass a JSON payload (use ''null''::jsonb for a message that carries nothing).';
    END IF;
    -- Headers count with the payload: a relay delivers them together, so together they are what
    -- a sink must take, and one limit bounds what a message stores (50 MB of headers passed
    -- beside a small payload). A cap of their own would be a second limit to set.
    IF x_jobs._payload_bytes(p_payload) + coalesce(x_jobs._payload_bytes(p_headers), 0)
        > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes%s exceeds the limit of %s',
                x_jobs._payload_bytes(p_payload),
                CASE WHEN p_headers IS NOT NULL
                    THEN pg_catalog.format(' with headers of %s bytes', x_jobs._payload_bytes(p_headers))
                END,
                x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For a message of topic %L.', p_topic),
            HINT = 'Put a reference to large data in the message, or raise x_jobs.max_payload_bytes.';
    END IF;
    IF p_headers IS NOT NULL AND (pg_catalog.jsonb_typeof(p_headers) <> 'object' OR EXISTS (
        SELECT FROM pg_catalog.jsonb_each(p_headers) AS h WHERE pg_catalog.jsonb_typeof(h.value) <> 'string'
    )) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: headers %s are not an object of strings', p_headers),
            HINT = 'Pass headers as a JSON object of string values, such as ''{"x-tenant": "acme"}''.';
    END IF;
    IF p_max_attempts < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ004',
            MESSAGE = pg_catalog.format('X_MAX_ATTEMPTS_INVALID: max_attempts %s is below 1', p_max_attempts),
            HINT = 'Pass 1 or more, or NULL for the default of 10.';
    END IF;
END
$$;

-- Put one message, in the caller's transaction. `key` orders delivery: the messages of one key
-- go out one at a time, in put order; messages without a key go out in any order. Answers the
-- message id.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_put(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    max_attempts integer DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_id bigint;
BEGIN
    PERFORM x_jobs._require_message(outbox_put.topic, outbox_put.payload, outbox_put.headers,
        outbox_put.max_attempts);
    -- The key is in outbox_key_idx: past a btree entry's size (about 2.7 kB) an insert failed
    -- with a bare 54000. 400 characters, as event keys, keep it within that in any encoding.
    IF pg_catalog.length(outbox_put.key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %L... is %s characters, longer than 400',
                pg_catalog.left(outbox_put.key, 64), pg_catalog.length(outbox_put.key)),
            DETAIL = pg_catalog.format('For a message of topic %L.', outbox_put.topic),
            HINT = 'Key messages with a short text, such as an order id (up to 400 characters): hash a longer one.';
    END IF;
    INSERT INTO x_jobs.outbox (created_at, max_attempts, topic, key, headers, payload, state, available_at)
    VALUES (v_now, coalesce(outbox_put.max_attempts, 10), outbox_put.topic, outbox_put.key,
        coalesce(outbox_put.headers, '{}'), outbox_put.payload, 'pending', v_now)
    RETURNING id INTO v_id;
    PERFORM x_jobs._notify('x_jobs_outbox', outbox_put.topic);
    RETURN v_id;
END
$$;

-- Put many messages in one statement: `messages` is a JSON array of objects with the fields of
-- outbox_put (topic, payload, key, headers, max_attempts). Answers (ord, id) in input order.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_put_many(messages jsonb)
RETURNS TABLE (ord integer, id bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_bad record;
BEGIN
    IF outbox_put_many.messages IS NULL OR pg_catalog.jsonb_typeof(outbox_put_many.messages) <> 'array'
        OR EXISTS (
            SELECT FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value)
            WHERE pg_catalog.jsonb_typeof(m.value) <> 'object'
        ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: messages %s are not an array of objects',
                pg_catalog.left(coalesce(outbox_put_many.messages::text, 'NULL'), 200)),
            HINT = 'Pass a JSON array of objects such as [{"topic": "t", "payload": {}, "key": "k"}].';
    END IF;

    -- The first message with a field outbox_put has no parameter for (a misspelt "key" would put
    -- the message unordered), a topic, key or max_attempts of the wrong JSON type (->> would
    -- take an object or a number as its JSON text), or a key too long (see outbox_put).
    SELECT m.ord, m.value,
           m.value - ARRAY['topic', 'payload', 'key', 'headers', 'max_attempts'] AS unknown
    INTO v_bad
    FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) WITH ORDINALITY AS m (value, ord)
    WHERE m.value - ARRAY['topic', 'payload', 'key', 'headers', 'max_attempts'] <> '{}'::jsonb
        OR pg_catalog.jsonb_typeof(m.value -> 'topic') NOT IN ('string', 'null')
        OR pg_catalog.jsonb_typeof(m.value -> 'key') NOT IN ('string', 'null')
        OR pg_catalog.length(m.value ->> 'key') > 400
        OR pg_catalog.jsonb_typeof(m.value -> 'max_attempts') NOT IN ('number', 'null')
        OR (pg_catalog.jsonb_typeof(m.value -> 'max_attempts') = 'number'
            AND ((m.value ->> 'max_attempts')::numeric % 1 <> 0
                OR abs((m.value ->> 'max_attempts')::numeric) > 2147483647))
    ORDER BY m.ord
    LIMIT 1;
    IF FOUND AND v_bad.unknown <> '{}'::jsonb THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: message %s has an unknown field %L', v_bad.ord,
                (SELECT min(f.name) FROM pg_catalog.jsonb_object_keys(v_bad.unknown) AS f (name))),
            HINT = 'A message has topic, payload, key, headers and max_attempts: check the spelling of the others.';
    ELSIF FOUND AND pg_catalog.jsonb_typeof(v_bad.value -> 'topic') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: topic %s of message %s is not a string',
                CASE WHEN pg_catalog.length((v_bad.value -> 'topic')::text) > 64
                    THEN pg_catalog.format('%s... (%s characters)', pg_catalog.left((v_bad.value -> 'topic')::text, 64),
                        pg_catalog.length((v_bad.value -> 'topic')::text))
                    ELSE (v_bad.value -> 'topic')::text
                END, v_bad.ord),
            HINT = 'Pass the topic as a string, such as "orders.created".';
    ELSIF FOUND AND pg_catalog.jsonb_typeof(v_bad.value -> 'key') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %s of message %s is not a string',
                CASE WHEN pg_catalog.length((v_bad.value -> 'key')::text) > 64
                    THEN pg_catalog.format('%s... (%s characters)', pg_catalog.left((v_bad.value -> 'key')::text, 64),
                        pg_catalog.length((v_bad.value -> 'key')::text))
                    ELSE (v_bad.value -> 'key')::text
                END, v_bad.ord),
            HINT = 'Pass the key as a string, such as "order-42", or leave it out.';
    ELSIF FOUND AND pg_catalog.length(v_bad.value ->> 'key') > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %L... of message %s is %s characters, longer than 400',
                pg_catalog.left(v_bad.value ->> 'key', 64), v_bad.ord, pg_catalog.length(v_bad.value ->> 'key')),
            HINT = 'Key messages with a short text, such as an order id (up to 400 characters): hash a longer one.';
    ELSIF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: max_attempts %s of message %s is not a whole number of attempts',
                v_bad.value -> 'max_attempts', v_bad.ord),
            HINT = 'Pass max_attempts as a whole number of 1 or more, or leave it out for 10.';
    END IF;

    PERFORM x_jobs._require_message(m.value ->> 'topic', m.value -> 'payload', m.value -> 'headers',
        (m.value ->> 'max_attempts')::integer)
    FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value);

    RETURN QUERY
    WITH input AS (
        SELECT m.ord::integer AS ord, m.value
        FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) WITH ORDINALITY AS m (value, ord)
    ),
    put AS (
        INSERT INTO x_jobs.outbox AS o (created_at, max_attempts, topic, key, headers, payload, state, available_at)
        SELECT v_now, coalesce((i.value ->> 'max_attempts')::integer, 10), i.value ->> 'topic',
               i.value ->> 'key', coalesce(i.value -> 'headers', '{}'), i.value -> 'payload', 'pending', v_now
        FROM input AS i
        ORDER BY i.ord
        RETURNING o.id
    )
    -- Identity values are drawn in insert order, which is input order: rank them back.
    SELECT (pg_catalog.row_number() OVER (ORDER BY p.id))::integer, p.id FROM put AS p ORDER BY p.id;

    PERFORM x_jobs._notify('x_jobs_outbox', t.topic)
    FROM (
        SELECT DISTINCT m.value ->> 'topic' AS topic
        FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value)
    ) AS t;
END
$$;

-- Hand `relay` up to `qty` messages to deliver, for `lease`: the oldest due pending messages
-- that head their key (nothing earlier of the key is pending, and nothing of the key is in
-- flight: a redriven or late-committed message with a lower id waits for the one out), and the
-- messages whose lease lapsed (a relay that died; dead instead on their final attempt). Locked
-- rows are skipped, so relays never wait for each other. `topics` restricts the claim to the
-- topics this relay has sinks for (NULL: all).
--
-- Keyless messages are a seek of their own index, about `qty` entries. Keyed ones are looked
-- for among the oldest due keyed messages, at most 10 x `qty` + 100 of them, each a head or
-- not by two seeks of outbox_key_idx, and locked as found, skipping those another relay holds,
-- until `qty` are held. When that window is full of messages waiting behind their keys (a
-- backlog on keys whose messages are in flight, or nacked with a backoff) and yields fewer
-- than `qty`, the relay visits every key with undelivered messages instead, one seek each, and
-- takes the oldest of their heads. Until 0.3.7 it walked the whole backlog: with
-- every key busy, a call read 500,000 pending messages to answer none (5-6 s, measured
-- 2026-11-30). So a call costs about `qty` entries when heads are at hand, and a seek per busy
-- key at worst.
--
-- The two checks of a message's key are lateral subqueries with LIMIT 1, which the planner runs
-- per message as a seek of outbox_key_idx. As NOT EXISTS it made them anti-joins and, with
-- statistics that saw few pending messages, compared every message of the window with every
-- pending one: cheap on the table it planned for, quadratic on the backlog the plan is kept
-- for. (With few keys and no delivered history the planner may check "earlier" by walking the
-- primary key up to the message, a message of the key every few rows: cheap there. A row
-- comparison on (state, id), which only the key index can serve, cost 60-80 us a check against
-- 9 here: PostgreSQL 15 reads the key's entries past it.) "In flight" is spelt
-- `state > 'pending'` beside the index's predicate (enum order: of the two, only inflight is
-- above pending), since `state = 'inflight'` matches the predicate of outbox_inflight_idx,
-- which the planner then read whole per message.
--
-- The keys of the picked messages are then locked and checked again under a fresh snapshot:
-- two relays claiming at once cannot both take a message of one key, whatever order the
-- producers committed in; a key whose lock another session holds is left to a later call. A
-- message of a key whose check fails stays locked, unclaimed, until the call ends. Answers the
-- messages in the order to deliver them, with the attempt this delivery is.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.relay_outbox(
    relay text,
    qty integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL
)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, headers jsonb, attempt integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Before the outbox has statistics (a new table, a burst after a quiet spell) the planner chose
-- a bitmap scan of every pending message and a sort: 80 ms a call at 10,000 pending against
-- 3 ms for the ordered index walk (measured 2026-11-29). The walk is right at any size.
SET enable_bitmapscan = off
-- Every statement here is a walk of an index and seeks from it, and the window's heads are
-- locked as they come, in order, only as many as wanted. A generic plan costs the window as
-- 10,000 rows, and joined it to the outbox with a hash of the whole table (a sequential scan of
-- 300,000 messages a call, 110-150 ms against 5).
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_window integer;
    v_window_full boolean;
    v_heads bigint[];
    v_more bigint[];
    v_cursor text;
    v_walked text[];
    v_last_key text;
    v_picked bigint[];
    v_keys text[];
    v_busy_keys text[];
    v_lapsed boolean;
BEGIN
    IF relay_outbox.relay IS NULL OR relay_outbox.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(relay_outbox.relay), 'NULL')),
            HINT = 'Pass an id unique to the relay process, such as host:pid:random.';
    END IF;
    PERFORM x_jobs._require_lease(
        relay_outbox.lease, 'Pass a lease longer than a delivery takes, such as ''30 seconds''.'
    );
    IF relay_outbox.qty IS NULL OR relay_outbox.qty < 1 OR relay_outbox.qty > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: qty %s is outside 1..1000',
                coalesce(relay_outbox.qty::text, 'NULL')),
            HINT = 'Pass how many messages the relay can deliver at once, from 1 to 1000.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: relay_outbox cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call relay_outbox in its own READ COMMITTED transaction (autocommit).';
    END IF;
    -- Room for the heads other relays are taking at the same time, small calls included.
    v_window := 10 * relay_outbox.qty + 100;

    -- The heads among the oldest due keyed messages, locked in order as they are found, passing
    -- over those another relay holds, until qty are held: the window is read as far as that
    -- takes, so relays calling at once take different heads. A head whose key another session
    -- holds (the key's advisory lock, see below) is passed over too, as it is found, so that it
    -- takes no place among the qty: until 0.3.9 the heads were cut to qty first, and one such
    -- key at the front left a relay of qty 1 with nothing, call after call.
    v_heads := ARRAY(
        SELECT h.id
        FROM (
            SELECT o.id, w.key
            FROM (
                SELECT d.id, d.key, d.topic, d.available_at
                FROM x_jobs.outbox AS d
                WHERE d.state = 'pending' AND d.key IS NOT NULL
                    AND d.available_at <= v_now
                ORDER BY d.available_at, d.id
                LIMIT v_window
            ) AS w
            INNER JOIN x_jobs.outbox AS o ON o.id = w.id
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = w.key AND e.state = 'pending' AND e.id < w.id
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS earlier ON TRUE
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = w.key AND e.state > 'pending'
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS out ON TRUE
            WHERE (relay_outbox.topics IS NULL OR w.topic = ANY (relay_outbox.topics))
                AND earlier.id IS NULL
                AND out.id IS NULL
                AND o.state = 'pending'
            ORDER BY w.available_at, w.id
            FOR UPDATE OF o SKIP LOCKED
        ) AS h
        -- Above the row locks: the key's lock is tried only for a head this call holds.
        WHERE pg_catalog.pg_try_advisory_xact_lock(2024061705, pg_catalog.hashtext(h.key))
        LIMIT relay_outbox.qty
    );
    v_window_full := pg_catalog.cardinality(v_heads) < relay_outbox.qty AND v_window = (
        SELECT pg_catalog.count(*)
        FROM (
            SELECT FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NOT NULL
                AND o.available_at <= v_now
            ORDER BY o.available_at, o.id
            LIMIT v_window
        ) AS w
    );

    IF v_window_full THEN
        -- The window is mostly messages waiting behind their keys: visit the keys instead, a
        -- seek of outbox_key_idx from one key to the first entry of the next. That entry is the
        -- key's lowest pending message (its head), or one in flight when none is pending. At
        -- most v_window keys a call, from the key after the one the session's last visit ended
        -- on, wrapping around, so that a call costs the same beside 1,000 keys held back or
        -- 100,000 (until 0.3.9 it visited them all: 0.75-1.05 s a call at 100,000). What it
        -- trades: heads go out key by key in walk order, not in put order across keys (their
        -- own key's order is kept), and a session that relays once starts at the first key.
        v_cursor := coalesce(pg_catalog.current_setting('x_jobs.relay_key_cursor', TRUE), '');
        v_walked := '{}';
        v_more := '{}';
        -- Two laps: the keys after the cursor, then from the first key up to the cursor.
        FOR v_lap IN 1..2 LOOP
            EXIT WHEN pg_catalog.cardinality(v_walked) >= v_window OR (v_lap = 2 AND v_cursor = '');
            SELECT v_walked || coalesce(pg_catalog.array_agg(w.key ORDER BY w.n), '{}'),
                   v_more || coalesce(pg_catalog.array_agg(w.id ORDER BY w.n) FILTER (WHERE w.head), '{}')
            INTO v_walked, v_more
            FROM (
                WITH RECURSIVE heads AS (
                    (
                        -- Keys are never empty, so '' is before the first one.
                        SELECT o.key, o.state, o.id, o.topic, o.available_at, 1 AS n
                        FROM x_jobs.outbox AS o
                        WHERE o.key > CASE WHEN v_lap = 1 THEN v_cursor ELSE '' END
                            AND o.key IS NOT NULL AND o.state IN ('pending', 'inflight')
                        ORDER BY o.key, o.state, o.id
                        LIMIT 1
                    )
                    UNION ALL
                    SELECT nx.*, h.n + 1
                    FROM heads AS h
                    CROSS JOIN LATERAL (
                        SELECT o.key, o.state, o.id, o.topic, o.available_at FROM x_jobs.outbox AS o
                        WHERE o.key > h.key AND o.key IS NOT NULL AND o.state IN ('pending', 'inflight')
                        ORDER BY o.key, o.state, o.id
                        LIMIT 1
                    ) AS nx
                    WHERE h.n < v_window - pg_catalog.cardinality(v_walked)
                        AND (v_lap = 1 OR h.key < v_cursor)
                )
                SELECT h.key, h.id, h.n,
                       h.state = 'pending'
                       AND h.available_at <= v_now
                       AND (relay_outbox.topics IS NULL OR h.topic = ANY (relay_outbox.topics))
                       AND out.id IS NULL AS head
                FROM heads AS h
                LEFT JOIN LATERAL (
                    SELECT e.id FROM x_jobs.outbox AS e
                    WHERE e.key = h.key AND e.state > 'pending'
                        AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                    LIMIT 1
                ) AS out ON TRUE
                WHERE v_lap = 1 OR h.key <= v_cursor
            ) AS w;
        END LOOP;
        -- Locked as the window's heads are, in walk order, busy keys passed over, to make up qty.
        SELECT v_heads || coalesce(pg_catalog.array_agg(t.id ORDER BY t.n), '{}'),
               (pg_catalog.array_agg(t.key ORDER BY t.n DESC))[1]
        INTO v_heads, v_last_key
        FROM (
            SELECT m.id, m.key, m.n
            FROM (
                SELECT o.id, o.key, h.n
                FROM unnest(v_more) WITH ORDINALITY AS h (id, n)
                INNER JOIN x_jobs.outbox AS o ON o.id = h.id
                WHERE o.state = 'pending' AND o.id <> ALL (v_heads)
                ORDER BY h.n
                FOR UPDATE OF o SKIP LOCKED
            ) AS m
            WHERE pg_catalog.pg_try_advisory_xact_lock(2024061705, pg_catalog.hashtext(m.key))
            LIMIT relay_outbox.qty - pg_catalog.cardinality(v_heads)
        ) AS t;
        -- The next visit starts after the last key this one took a head of when it got enough
        -- (the keys after it get their turn before it comes again), else after the last key it
        -- walked.
        IF pg_catalog.cardinality(v_walked) > 0 THEN
            PERFORM pg_catalog.set_config('x_jobs.relay_key_cursor',
                CASE WHEN pg_catalog.cardinality(v_heads) >= relay_outbox.qty THEN v_last_key
                     ELSE v_walked[pg_catalog.cardinality(v_walked)] END,
                FALSE);
        END IF;
    END IF;

    SELECT coalesce(pg_catalog.array_agg(p.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT p.key) FILTER (WHERE p.key IS NOT NULL), '{}'),
           coalesce(pg_catalog.bool_or(p.lapsed), FALSE)
    INTO v_picked, v_keys, v_lapsed
    FROM (
        WITH keyless AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NULL
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        ),
        -- Locked above already.
        keyed AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.id = ANY (v_heads)
        ),
        lapsed AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'inflight'
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        )
        -- Rows an arm locked and this LIMIT drops stay locked until the call's transaction ends.
        SELECT a.id, a.key, a.available_at, FALSE AS lapsed FROM keyless AS a
        UNION ALL
        SELECT k.id, k.key, k.available_at, FALSE AS lapsed FROM keyed AS k
        UNION ALL
        SELECT l.id, l.key, l.available_at, TRUE AS lapsed FROM lapsed AS l
        ORDER BY 3, 1
        LIMIT relay_outbox.qty
    ) AS p;

    IF pg_catalog.cardinality(v_keys) > 0 THEN
        -- A relay whose snapshot predates another relay's claim of the same key could see that
        -- key free (two producers on one key, the lower id committing last). So: lock the keys
        -- and check them again in a statement whose snapshot comes after the locks, which sees
        -- every claim of these keys that held them before. It only tries, and leaves a key it
        -- cannot have now to a later call, as claim does: until 0.3.8 it waited, so that one
        -- session holding a key's lock (any login may take advisory locks) stalled every relay
        -- call, keyless messages and other keys included.
        v_busy_keys := ARRAY(
            SELECT k.key
            FROM unnest(v_keys) AS k (key)
            WHERE NOT pg_catalog.pg_try_advisory_xact_lock(2024061705, pg_catalog.hashtext(k.key))
        );

        v_picked := ARRAY(
            SELECT o.id
            FROM x_jobs.outbox AS o
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = o.key AND e.state = 'pending' AND e.id < o.id
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS earlier ON TRUE
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = o.key AND e.state > 'pending'
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS out ON TRUE
            WHERE o.id = ANY (v_picked)
                AND (o.key IS NULL OR o.key <> ALL (v_busy_keys))
                AND (o.key IS NULL OR o.state = 'inflight' OR (earlier.id IS NULL AND out.id IS NULL))
        );
    END IF;

    -- A message whose lease lapsed on its final attempt is not handed out again: a relay died
    -- (or outlived its lease) delivering it max_attempts times, and each redelivery could do the
    -- same while its key waited behind it. It is dead, for outbox_redrive, as a job is buried.
    IF v_lapsed THEN
        UPDATE x_jobs.outbox AS o
        SET state = 'dead',
            available_at = v_now,
            relay = NULL,
            last_error = 'lease lapsed on the final attempt'
        WHERE o.id = ANY (v_picked)
            AND o.state = 'inflight'
            AND o.attempt >= o.max_attempts;
    END IF;

    RETURN QUERY
    WITH taken AS (
        UPDATE x_jobs.outbox AS o
        SET state = 'inflight',
            attempt = o.attempt + 1,
            relay = relay_outbox.relay,
            available_at = v_now + relay_outbox.lease
        WHERE o.id = ANY (v_picked)
            AND o.state <> 'dead'
        RETURNING o.id, o.topic, o.key, o.payload, o.headers, o.attempt
    )
    SELECT t.id, t.topic, t.key, t.payload, t.headers, t.attempt FROM taken AS t ORDER BY t.id;
END
$$;

-- The messages `relay` delivered: answers the ids it held among `ids` (now delivered); a
-- missing id was not held (its lease lapsed and another relay took it): it goes out again.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_ack(ids bigint[], relay text)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    IF outbox_ack.relay IS NULL OR outbox_ack.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_ack.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    RETURN QUERY
    UPDATE x_jobs.outbox AS o
    SET state = 'delivered', delivered_at = v_now, available_at = v_now
    WHERE o.id = ANY (outbox_ack.ids)
        AND o.state = 'inflight'
        AND o.relay = outbox_ack.relay
    RETURNING o.id;
END
$$;

-- The relay's heartbeat: push the lease of the inflight messages `relay` holds among `ids` to
-- now + lease. Answers the ids still held; a missing one was lost (its lease lapsed and another
-- relay took it, or it was settled), and its delivery's ack will find it gone. Without it a
-- delivery slower than the lease was claimed again and sent a second time while it ran.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_extend_lease(ids bigint[], relay text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF outbox_extend_lease.relay IS NULL OR outbox_extend_lease.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_extend_lease.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    PERFORM x_jobs._require_lease(
        outbox_extend_lease.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );
    RETURN QUERY
    UPDATE x_jobs.outbox AS o
    SET available_at = x_jobs.now() + outbox_extend_lease.lease
    WHERE o.id = ANY (outbox_extend_lease.ids)
        AND o.state = 'inflight'
        AND o.relay = outbox_extend_lease.relay
    RETURNING o.id;
END
$$;

-- A delivery failed. With attempts left (and retryable) the message waits until retry_at, or
-- its backoff: min(1 hour, 1 second * 2^(attempt - 1)) with equal jitter; the messages after it
-- in its key wait too. Else it is dead, kept for outbox_redrive. Answers the state it is in
-- now, or NULL when `relay` did not hold it (nothing changed).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_nack(
    id bigint,
    relay text,
    error text,
    retry_at timestamptz DEFAULT NULL,
    retryable boolean DEFAULT TRUE
)
RETURNS x_jobs.outbox_state
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_state x_jobs.outbox_state;
BEGIN
    IF outbox_nack.relay IS NULL OR outbox_nack.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_nack.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    IF outbox_nack.error IS NULL OR outbox_nack.error = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ023',
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: message %s failed without an error message',
                coalesce(outbox_nack.id::text, 'NULL')),
            HINT = 'Pass what went wrong as error, such as the HTTP status and body.';
    END IF;
    -- As enqueue's run_at: an infinite retry_at would hold the message, and its key, for good.
    IF outbox_nack.retry_at < timestamptz '0001-01-01 00:00:00+00'
        OR outbox_nack.retry_at >= timestamptz '10000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ039',
            MESSAGE = pg_catalog.format('X_TIME_INVALID: retry_at %s is not a time to retry message %s',
                outbox_nack.retry_at, coalesce(outbox_nack.id::text, 'NULL')),
            HINT = 'Pass a time in the years 1 to 9999 (UTC), or leave retry_at out for the backoff.';
    END IF;

    UPDATE x_jobs.outbox AS o
    SET state = CASE
            WHEN NOT outbox_nack.retryable OR o.attempt >= o.max_attempts THEN 'dead'
            ELSE 'pending'
        END::x_jobs.outbox_state,
        available_at = CASE
            WHEN NOT outbox_nack.retryable OR o.attempt >= o.max_attempts THEN v_now
            ELSE greatest(v_now, coalesce(outbox_nack.retry_at,
                v_now + least(interval '1 hour', interval '1 second' * pg_catalog.power(2, least(o.attempt - 1, 20)))
                * (0.5 + pg_catalog.random() / 2)))
        END,
        relay = NULL,
        -- Cut, not refused, as fail cuts a job's error (see there).
        last_error = CASE WHEN pg_catalog.length(outbox_nack.error) > 65536
            THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
                pg_catalog.left(outbox_nack.error, 65536), pg_catalog.length(outbox_nack.error))
            ELSE outbox_nack.error
        END
    WHERE o.id = outbox_nack.id
        AND o.state = 'inflight'
        AND o.relay = outbox_nack.relay
    RETURNING o.state INTO v_state;
    RETURN v_state;
END
$$;

-- Send dead messages again: back to pending, due now, with all their attempts. By id, or every
-- dead message of `topic` (up to max_rows, oldest first). A redriven message goes out after
-- any message of its key that is pending or in flight ahead of it. Answers how many.
CREATE FUNCTION x_jobs.outbox_redrive(
    ids bigint[] DEFAULT NULL,
    topic text DEFAULT NULL,
    max_rows integer DEFAULT 1000
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_count bigint;
    v_topics text[];
BEGIN
    IF outbox_redrive.max_rows IS NULL OR outbox_redrive.max_rows < 1 OR outbox_redrive.max_rows > 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..100000',
                coalesce(outbox_redrive.max_rows::text, 'NULL')),
            HINT = 'Redrive in batches of up to 100000, and call again for more.';
    END IF;

    -- Picked once, as an array: see purge (a rescan would pass over the rows already redriven
    -- and take more than max_rows).
    WITH redriven AS (
        UPDATE x_jobs.outbox AS o
        SET state = 'pending', attempt = 0, available_at = v_now, relay = NULL
        WHERE o.id = ANY (ARRAY(
            SELECT d.id FROM x_jobs.outbox AS d
            WHERE d.state = 'dead'
                AND (outbox_redrive.ids IS NULL OR d.id = ANY (outbox_redrive.ids))
                AND (outbox_redrive.topic IS NULL OR d.topic = outbox_redrive.topic)
            ORDER BY d.id
            LIMIT outbox_redrive.max_rows
            FOR UPDATE
        ))
        RETURNING o.topic
    )
    SELECT count(*), pg_catalog.array_agg(DISTINCT r.topic) INTO v_count, v_topics FROM redriven AS r;

    PERFORM pg_catalog.pg_notify('x_jobs_outbox', t.topic) FROM unnest(v_topics) AS t (topic);
    RETURN v_count;
END
$$;

-- Retention for the outbox: delete up to `batch_size` messages delivered before now -
-- older_than, lowest id first. Dead messages stay until redriven or deleted by hand.
CREATE FUNCTION x_jobs.purge_outbox(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('outbox', purge_outbox.older_than, purge_outbox.batch_size,
        'such as ''7 days''');

    -- Picked once, as an array: see purge.
    DELETE FROM x_jobs.outbox AS o
    WHERE o.id = ANY (ARRAY(
        SELECT k.id
        FROM x_jobs.outbox AS k
        WHERE k.state = 'delivered'
            AND k.delivered_at < x_jobs.now() - purge_outbox.older_than
        ORDER BY k.id
        LIMIT purge_outbox.batch_size
        FOR UPDATE SKIP LOCKED
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- A webhook received from `source` with its sender's message id: in one transaction, the
-- ledger row and the job it becomes: `name`, `input` and `queue`, with the rest of the job's
-- enqueue request in `request` (max_attempts, priority, ... as enqueue_many takes them). A
-- webhook id seen before answers its first job with duplicate = true and enqueues nothing: a
-- redelivery (senders deliver at least once) becomes exactly one job.
--
-- Two receipts of one id at once are serialized by a transaction-scoped advisory lock on
-- (source, webhook id), and the ledger is read after it: the second waits for the first to
-- commit and then answers duplicate. READ COMMITTED only: a transaction snapshot would not see
-- the first receipt's commit.
--
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.receive_webhook(
    source text,
    webhook_id text,
    name text,
    input jsonb DEFAULT NULL,
    queue text DEFAULT NULL,
    request jsonb DEFAULT NULL
)
RETURNS TABLE (job_id bigint, duplicate boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job bigint;
BEGIN
    IF receive_webhook.source IS NULL OR receive_webhook.source = ''
        OR receive_webhook.webhook_id IS NULL OR receive_webhook.webhook_id = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ037',
            MESSAGE = pg_catalog.format('X_WEBHOOK_INVALID: webhook source %s and id %s must both be given',
                coalesce(pg_catalog.quote_literal(receive_webhook.source), 'NULL'),
                coalesce(pg_catalog.quote_literal(receive_webhook.webhook_id), 'NULL')),
            HINT = 'Pass the sender''s name as source and its webhook-id header as webhook_id.';
    END IF;
    -- Both are the ledger's primary key: past a btree entry's size (about 2.7 kB) an insert
    -- failed with a bare 54000, answered 500, and the sender retried it for ever.
    IF pg_catalog.length(receive_webhook.source) > 200 OR pg_catalog.length(receive_webhook.webhook_id) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ037',
            MESSAGE = pg_catalog.format('X_WEBHOOK_INVALID: webhook source %s or id %s is longer than 200 characters',
                pg_catalog.quote_literal(pg_catalog.left(receive_webhook.source, 210)),
                pg_catalog.quote_literal(pg_catalog.left(receive_webhook.webhook_id, 210))),
            HINT = 'Pass the sender''s name and its webhook-id header, each of 1 to 200 characters.';
    END IF;
    IF receive_webhook.request IS NOT NULL AND pg_catalog.jsonb_typeof(receive_webhook.request) <> 'object' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ009',
            MESSAGE = pg_catalog.format('X_JOBS_INVALID: request %s is not an object', receive_webhook.request),
            HINT = 'Pass the job''s options as an object with enqueue_many''s fields, such as {"max_attempts": 5}.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: receive_webhook cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Receive webhooks in READ COMMITTED transactions (the default).';
    END IF;

    PERFORM pg_catalog.pg_advisory_xact_lock(2024061704,
        pg_catalog.hashtext(receive_webhook.source || E'\x1f' || receive_webhook.webhook_id));

    SELECT l.job_id INTO v_job
    FROM x_jobs.webhook_ledger AS l
    WHERE l.source = receive_webhook.source AND l.webhook_id = receive_webhook.webhook_id;
    IF FOUND THEN
        RETURN QUERY SELECT v_job, TRUE;
        RETURN;
    END IF;

    SELECT e.id INTO v_job
    FROM x_jobs.enqueue_many(pg_catalog.jsonb_build_array(
        coalesce(receive_webhook.request, '{}')
        || pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
            'name', receive_webhook.name, 'queue', receive_webhook.queue))
        || CASE WHEN receive_webhook.input IS NULL THEN '{}'
            ELSE pg_catalog.jsonb_build_object('input', receive_webhook.input) END
    )) AS e;
    INSERT INTO x_jobs.webhook_ledger (source, webhook_id, received_at, job_id)
    VALUES (receive_webhook.source, receive_webhook.webhook_id, x_jobs.now(), v_job);
    RETURN QUERY SELECT v_job, FALSE;
END
$$;

-- Retention for the webhook ledger: delete up to `batch_size` rows received before now -
-- older_than, oldest first. Keep them longer than senders retry (days): a webhook redelivered
-- after its row is gone becomes a second job. Run one purger at a time (no row locks).
CREATE FUNCTION x_jobs.purge_webhook_ledger(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('webhooks', purge_webhook_ledger.older_than, purge_webhook_ledger.batch_size,
        'longer than senders retry, such as ''30 days''');

    -- The batch is picked once, as an array, as purge picks its own (see there). By ctid: the
    -- rows are only ever inserted and deleted, and a TID scan reaches each at once.
    DELETE FROM x_jobs.webhook_ledger AS l
    WHERE l.ctid = ANY (ARRAY(
        SELECT k.ctid
        FROM x_jobs.webhook_ledger AS k
        WHERE k.received_at < x_jobs.now() - purge_webhook_ledger.older_than
        ORDER BY k.received_at
        LIMIT purge_webhook_ledger.batch_size
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

------------------------------------------------------------------------------------------------
-- Functions: operator
------------------------------------------------------------------------------------------------

-- Cancel a live job. A running one loses its worker at once: its claimed_by is cleared, so the
-- worker's settle does nothing and its next heartbeat does not list the id (the signal to stop
-- the body). Answers true when this call cancelled the row, false when it had already finished
-- (done, failed, dead or cancelled: nothing changes).
CREATE FUNCTION x_jobs.cancel(id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_name text;
BEGIN
    WITH cancelled AS (
        UPDATE x_jobs.job AS j
        SET state = 'cancelled',
            visible_at = NULL,
            claimed_by = NULL,
            finished_at = v_now,
            updated_at = v_now
        WHERE j.id = cancel.id
            AND j.state IN ('ready', 'delayed', 'suspended', 'running')
        RETURNING j.name
    ),
    counted AS (
        INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, cancelled)
        SELECT k.name, 60, x_jobs._minute(v_now), x_jobs._shard(), 1
        FROM cancelled AS k
        ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
        SET cancelled = c.cancelled + excluded.cancelled
    )
    SELECT k.name INTO v_name FROM cancelled AS k;

    IF v_name IS NOT NULL THEN
        RETURN TRUE;
    END IF;
    IF NOT EXISTS (SELECT FROM x_jobs.job AS j WHERE j.id = cancel.id) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(cancel.id::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    RETURN FALSE;
END
$$;

-- Re-queue a dead, failed or cancelled job: due now, with all its attempts again and the same
-- run_id (so a workflow resumes, not restarts). Its error history stays. Refused for live and
-- done rows, and when another live row now holds its idempotency key.
--
-- The steps it resumes with are those still in effect: a step its compensation undid runs again
-- (the run replayed it as done, and went on from a refunded charge to ship the order, in a
-- review), and so does a step that failed (a wait that timed out replayed its timeout at once,
-- so the workflow could never be recovered). A compensation that failed is forgotten, so that
-- the step it did not undo can be undone if this run fails for good.
CREATE FUNCTION x_jobs.retry(id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job record;
BEGIN
    SELECT j.state, j.queue, j.idempotency_key INTO v_job
    FROM x_jobs.job AS j
    WHERE j.id = retry.id
    FOR UPDATE;

    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(retry.id::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    IF v_job.state NOT IN ('dead', 'failed', 'cancelled') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ015',
            MESSAGE = pg_catalog.format('X_JOB_NOT_RETRYABLE: job %s is %s', retry.id, v_job.state),
            HINT = 'Only dead, failed and cancelled jobs can be retried; a live job runs already, '
                'and a done job is enqueued anew.';
    END IF;

    DELETE FROM x_jobs.step AS s
    WHERE s.job_id = retry.id
        AND (
            s.status = 'failed'
            OR EXISTS (
                SELECT FROM x_jobs.step AS c
                WHERE c.job_id = s.job_id AND c.name = s.name AND c.compensation AND c.status = 'done'
            )
        );

    BEGIN
        UPDATE x_jobs.job AS j
        SET state = 'ready',
            attempt = 0,
            run_at = v_now,
            visible_at = NULL,
            claimed_by = NULL,
            finished_at = NULL,
            output = NULL,
            updated_at = v_now
        WHERE j.id = retry.id;
    EXCEPTION
        WHEN unique_violation THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ017',
                MESSAGE = pg_catalog.format('X_IDEMPOTENCY_CONFLICT: a live job already holds key %L',
                    v_job.idempotency_key),
                DETAIL = pg_catalog.format('Job %s cannot be re-queued while that job is live.', retry.id),
                HINT = 'Wait for the live job to finish, or cancel it, then retry this one.';
    END;

    PERFORM pg_catalog.pg_notify('x_jobs', v_job.queue);
    RETURN TRUE;
END
$$;

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

-- Hold a queue back from every claim (and from queue_demand). Answers true when this call paused
-- it, false when it was paused already. Running jobs of the queue finish as usual.
CREATE FUNCTION x_jobs.pause_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- The names enqueue accepts: 1 to 200 characters.
    IF pause_queue.queue IS NULL OR pause_queue.queue = '' OR pg_catalog.length(pause_queue.queue) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ002',
            MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %s is not a queue name',
                coalesce(pg_catalog.quote_literal(pause_queue.queue), 'NULL')),
            HINT = 'Name the queue to pause (1 to 200 characters), such as ''default''.';
    END IF;
    INSERT INTO x_jobs.queue_pause (queue, paused_at, paused_by)
    VALUES (pause_queue.queue, x_jobs.now(), current_user)
    ON CONFLICT (queue) DO NOTHING;
    RETURN FOUND;
END
$$;

-- Let a paused queue be claimed again, and wake its workers. Answers true when it was paused.
CREATE FUNCTION x_jobs.resume_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- The names enqueue accepts: 1 to 200 characters.
    IF resume_queue.queue IS NULL OR resume_queue.queue = '' OR pg_catalog.length(resume_queue.queue) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ002',
            MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %s is not a queue name',
                coalesce(pg_catalog.quote_literal(resume_queue.queue), 'NULL')),
            HINT = 'Name the queue to resume (1 to 200 characters), such as ''default''.';
    END IF;
    DELETE FROM x_jobs.queue_pause AS p WHERE p.queue = resume_queue.queue;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('x_jobs', resume_queue.queue);
        RETURN TRUE;
    END IF;
    RETURN FALSE;
END
$$;

------------------------------------------------------------------------------------------------
-- Functions: workers and demand
------------------------------------------------------------------------------------------------

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

-- Per queue, the rows a serving worker must hold: due rows of unpaused queues; running rows
-- whose lease holds, unless a live draining worker holds them (it finishes them itself, so no
-- worker a scaler adds could take them; a claimer with no live row, killed or lapsed, stays
-- counted: its jobs come back to the queue); and running rows whose lease lapsed, which the
-- next claim takes, so only in unpaused queues and whoever held them. Queues with no demand are
-- absent. This is what KEDA polls.
--
-- A due row with a concurrency key counts only while its key has room, as claim grants them
-- (by rank within the key against the row's limit less the key's running rows): 50 rows of a
-- key limited to 1 are one worker's work, not 50, and counting them scaled out workers that
-- could claim nothing.
--
-- It COUNTS OFF THE INDEXES. Due and lapsed rows are counted per queue by index-only scans of
-- the claim's arm indexes, in their queue order (no sort, no heap), and a pause drops a queue's
-- counts, not its rows one by one. Keyed rows alone are ranked, read key by key from
-- job_keyed_idx (and sorted within a key whose rows are in several queues), and count what
-- their keys grant (the plain counts hold no keyed row since the claim's keyed rows got indexes
-- of their own in 0.3.8). The rows a
-- lease holds need claimed_by from the heap only while a live worker drains. Until 0.3.7 one
-- CTE of every due row was materialised, fetched from the heap and sorted: at 100k ready rows
-- over 50 queues 183 ms against 24 now, at 500k 1.0 s against 0.18 (measured 2026-11-30, pages
-- all-visible). Pages vacuum has not marked yet cost a heap visit per row still (154 ms, 100k).
--
-- SECURITY DEFINER: monitoring roles (pg_monitor, an autoscaler's login) get counts without
-- being able to read job inputs. It reads only; search_path is pinned.
CREATE FUNCTION x_jobs.queue_demand()
RETURNS TABLE (queue text, demand bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH busy AS (
        SELECT j.concurrency_key, count(*) AS running
        FROM x_jobs.job AS j
        WHERE j.concurrency_key IS NOT NULL AND j.state = 'running'
        GROUP BY j.concurrency_key
    ),
    draining AS (
        SELECT w.id FROM x_jobs.worker AS w
        WHERE w.draining_at IS NOT NULL AND w.expires_at > x_jobs.now()
    )
    SELECT d.queue, sum(d.n)::bigint AS demand
    FROM (
        SELECT o.queue, o.n
        FROM (
            SELECT j.queue, count(*) AS n FROM x_jobs.job AS j
            WHERE j.state = 'ready' AND j.concurrency_key IS NULL AND j.run_at <= x_jobs.now()
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, count(*) FROM x_jobs.job AS j
            WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
                AND j.run_at <= x_jobs.now()
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, count(*) FROM x_jobs.job AS j
            WHERE j.state = 'running' AND j.visible_at <= x_jobs.now()
            GROUP BY j.queue
        ) AS o
        WHERE NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = o.queue)
        UNION ALL
        SELECT k.queue, count(*) FILTER (WHERE k.rank <= k.concurrency_limit - coalesce(b.running, 0))
        FROM (
            SELECT j.queue, j.concurrency_key, j.concurrency_limit,
                   pg_catalog.row_number() OVER (
                       PARTITION BY j.concurrency_key ORDER BY j.priority, j.run_at, j.id
                   ) AS rank
            FROM x_jobs.job AS j
            WHERE j.concurrency_key IS NOT NULL
                AND j.state IN ('ready', 'delayed', 'suspended')
                AND j.run_at <= x_jobs.now()
                AND j.queue <> ALL (ARRAY(SELECT p.queue FROM x_jobs.queue_pause AS p))
        ) AS k
        LEFT JOIN busy AS b ON b.concurrency_key = k.concurrency_key
        GROUP BY k.queue
        UNION ALL
        SELECT j.queue, count(*) FROM x_jobs.job AS j
        WHERE j.state = 'running' AND j.visible_at > x_jobs.now()
            AND NOT EXISTS (SELECT FROM draining)
        GROUP BY j.queue
        UNION ALL
        SELECT j.queue, count(*) FROM x_jobs.job AS j
        WHERE j.state = 'running' AND j.visible_at > x_jobs.now()
            AND EXISTS (SELECT FROM draining)
            AND j.claimed_by NOT IN (SELECT r.id FROM draining AS r)
        GROUP BY j.queue
    ) AS d
    GROUP BY d.queue
    HAVING sum(d.n) > 0
    ORDER BY d.queue COLLATE "C"
$$;

-- Per queue, how many live rows are in each state, whether the queue is paused, and its demand
-- (as queue_demand counts it). Queues with no live row and no pause are absent. For an operator's
-- `x-jobs queues`: it reads the partial indexes of the claim, never the finished rows. Each is counted
-- per queue before anything is joined, ready and running rows by index-only scans; only the
-- waiting rows come from the heap, which alone tells a delayed row from a suspended one.
CREATE FUNCTION x_jobs.queue_stats()
RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    suspended bigint,
    running bigint,
    paused boolean,
    demand bigint
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH counted AS (
        SELECT l.queue, sum(l.ready) AS ready, sum(l.delayed) AS delayed,
               sum(l.suspended) AS suspended, sum(l.running) AS running
        FROM (
            SELECT j.queue, count(*) AS ready, 0 AS delayed, 0 AS suspended, 0 AS running
            FROM x_jobs.job AS j WHERE j.state = 'ready' AND j.concurrency_key IS NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, count(*), 0, 0, 0
            FROM x_jobs.job AS j WHERE j.state = 'ready' AND j.concurrency_key IS NOT NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, count(*) FILTER (WHERE j.state = 'delayed'),
                   count(*) FILTER (WHERE j.state = 'suspended'), 0
            FROM x_jobs.job AS j WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, count(*) FILTER (WHERE j.state = 'delayed'),
                   count(*) FILTER (WHERE j.state = 'suspended'), 0
            FROM x_jobs.job AS j WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, 0, 0, count(*)
            FROM x_jobs.job AS j WHERE j.state = 'running'
            GROUP BY j.queue
        ) AS l
        GROUP BY l.queue
    )
    SELECT q.queue,
           coalesce(c.ready, 0)::bigint, coalesce(c.delayed, 0)::bigint,
           coalesce(c.suspended, 0)::bigint, coalesce(c.running, 0)::bigint,
           p.queue IS NOT NULL,
           coalesce(d.demand, 0)
    FROM (SELECT c.queue FROM counted AS c UNION SELECT p.queue FROM x_jobs.queue_pause AS p) AS q
    LEFT JOIN counted AS c ON c.queue = q.queue
    LEFT JOIN x_jobs.queue_pause AS p ON p.queue = q.queue
    LEFT JOIN x_jobs.queue_demand() AS d ON d.queue = q.queue
    ORDER BY q.queue COLLATE "C"
$$;

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

------------------------------------------------------------------------------------------------
-- Functions: retention
------------------------------------------------------------------------------------------------

-- Fold old counter buckets into wider ones: minutes older than `minutes_for` into hours, hours
-- older than `hours_for` into days, and drop days older than `days_for`. Shards fold together.
-- Answers how many buckets it folded or dropped. Run it every few minutes; it touches only old buckets, so
-- it never holds a lock a settling statement waits for.
CREATE FUNCTION x_jobs.rollup_counters(
    minutes_for interval DEFAULT '2 hours',
    hours_for interval DEFAULT '2 days',
    days_for interval DEFAULT '400 days'
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_removed bigint := 0::bigint;
    v_n bigint;
    v_step record;
BEGIN
    -- At most 1000 years each, as _require_retention.
    IF rollup_counters.minutes_for IS NULL OR rollup_counters.minutes_for < interval '0'
        OR rollup_counters.hours_for IS NULL OR rollup_counters.hours_for < interval '0'
        OR rollup_counters.days_for IS NULL OR rollup_counters.days_for < interval '0'
        OR greatest(rollup_counters.minutes_for, rollup_counters.hours_for, rollup_counters.days_for)
        > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: retention %s / %s / %s is not a set of ages',
                coalesce(rollup_counters.minutes_for::text, 'NULL'),
                coalesce(rollup_counters.hours_for::text, 'NULL'),
                coalesce(rollup_counters.days_for::text, 'NULL')),
            HINT = 'Pass ages from zero to 1000 years, such as minutes_for => ''2 hours''.';
    END IF;

    FOR v_step IN
        SELECT *
        FROM (VALUES (60, 3600, 'hour', rollup_counters.minutes_for),
                     (3600, 86400, 'day', rollup_counters.hours_for)) AS s (from_seconds, to_seconds, unit, keep)
    LOOP
        WITH moved AS (
            DELETE FROM x_jobs.counter AS c
            WHERE c.bucket_seconds = v_step.from_seconds
                AND c.bucket_start < v_now - v_step.keep
            RETURNING c.*
        ),
        folded AS (
            INSERT INTO x_jobs.counter AS c (
                job, bucket_seconds, bucket_start, shard, completed, retried, failed, dead, cancelled, run_ms
            )
            SELECT m.job, v_step.to_seconds, pg_catalog.date_trunc(v_step.unit, m.bucket_start, 'UTC'), 0,
                   sum(m.completed), sum(m.retried), sum(m.failed), sum(m.dead), sum(m.cancelled), sum(m.run_ms)
            FROM moved AS m
            GROUP BY 1, 2, 3
            ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
            SET completed = c.completed + excluded.completed,
                retried = c.retried + excluded.retried,
                failed = c.failed + excluded.failed,
                dead = c.dead + excluded.dead,
                cancelled = c.cancelled + excluded.cancelled,
                run_ms = c.run_ms + excluded.run_ms
        )
        SELECT count(*) INTO v_n FROM moved;
        v_removed := v_removed + v_n;
    END LOOP;

    DELETE FROM x_jobs.counter AS c
    WHERE c.bucket_seconds = 86400 AND c.bucket_start < v_now - rollup_counters.days_for;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_removed + v_n;
END
$$;

-- Delete up to `batch_size` terminal jobs (done, failed, dead, cancelled) that finished more than
-- `older_than` ago, lowest id first, with their error history and steps. Answers how many it deleted: call
-- it again while that equals batch_size. Bounded, so a purge never holds locks or writes WAL in
-- one unbounded burst; SKIP LOCKED, so two purgers share the work instead of waiting.
--
-- Lowest id, not earliest finished_at: ids follow enqueue order, so this is nearly oldest first
-- and walks the primary key, where finished_at order would need an index that every settling
-- statement pays to maintain, or a sort of every finished row on each call. Every row it takes
-- is past the retention either way.
CREATE FUNCTION x_jobs.purge(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
BEGIN
    -- At most 1000 years, as _require_retention.
    IF purge.older_than IS NULL OR purge.older_than < interval '0' OR purge.older_than > interval '1000 years'
        OR purge.batch_size IS NULL OR purge.batch_size < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: purge older than %s in batches of %s',
                coalesce(purge.older_than::text, 'NULL'), coalesce(purge.batch_size::text, 'NULL')),
            HINT = 'Pass an age from zero to 1000 years, such as ''7 days'', and a batch size of 1 or more.';
    END IF;
    v_cutoff := x_jobs.now() - purge.older_than;

    -- The batch is picked once, as an array: under `id IN (subquery)` the planner may rescan the
    -- subquery per row, and each rescan skips the rows this statement already deleted and locks
    -- the next ones, so that one call deleted every eligible row whatever batch_size said.
    WITH gone AS (
        DELETE FROM x_jobs.job AS j
        WHERE j.id = ANY (ARRAY(
            SELECT k.id
            FROM x_jobs.job AS k
            WHERE k.state IN ('done', 'failed', 'dead', 'cancelled')
                AND k.finished_at < v_cutoff
            ORDER BY k.id
            LIMIT purge.batch_size
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING j.id
    )
    SELECT coalesce(pg_catalog.array_agg(g.id), '{}') INTO v_ids FROM gone AS g;

    DELETE FROM x_jobs.job_error AS e WHERE e.job_id = ANY (v_ids);
    DELETE FROM x_jobs.step AS s WHERE s.job_id = ANY (v_ids);
    RETURN pg_catalog.cardinality(v_ids)::bigint;
END
$$;

------------------------------------------------------------------------------------------------
-- Health
------------------------------------------------------------------------------------------------

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

------------------------------------------------------------------------------------------------
-- Functions: declarations
------------------------------------------------------------------------------------------------

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

------------------------------------------------------------------------------------------------
-- Functions: readers
------------------------------------------------------------------------------------------------

-- What a client reads of the tables, each through a function of its own: the table layout is
-- not an API, these results are. Each answers named columns (states as text), reads by id or
-- through an index whose predicate it repeats, and runs as its caller: the roles granted them
-- hold SELECT on what they read (see Grants). An id that names nothing answers no row, as
-- x_jobs.result does.
-- Tests: tests/pgtap/43-readers.sql; the outbox listing's plan in tests/python/test_outbox_sql.py.

-- One job as an operator reads it (`x-jobs jobs show`): every field of its row, its input too.
CREATE FUNCTION x_jobs.job_detail(id bigint)
RETURNS TABLE (
    id bigint,
    name text,
    queue text,
    state text,
    attempt integer,
    max_attempts integer,
    priority smallint,
    run_at timestamptz,
    visible_at timestamptz,
    claimed_by text,
    tenant_id text,
    idempotency_key text,
    concurrency_key text,
    concurrency_limit integer,
    dead_letter boolean,
    keep_done boolean,
    backoff_base interval,
    backoff_max interval,
    claims integer,
    run_id uuid,
    traceparent text,
    enqueued_by text,
    created_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz,
    input jsonb,
    output jsonb,
    progress jsonb,
    last_error text,
    last_error_stack text
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.name, j.queue, j.state::text, j.attempt, j.max_attempts, j.priority, j.run_at,
           j.visible_at, j.claimed_by, j.tenant_id, j.idempotency_key, j.concurrency_key,
           j.concurrency_limit, j.dead_letter, j.keep_done, j.backoff_base, j.backoff_max, j.claims,
           j.run_id, j.traceparent, j.enqueued_by, j.created_at, j.started_at, j.finished_at,
           j.updated_at, j.input, j.output, j.progress, j.last_error, j.last_error_stack
    FROM x_jobs.job AS j
    WHERE j.id = job_detail.id
$$;

-- Every failed attempt of a job (and every lapsed lease), oldest first: after a retry the
-- attempts count from 1 again, so the time orders them, the attempt breaks a tie.
CREATE FUNCTION x_jobs.job_errors(id bigint)
RETURNS TABLE (
    attempt integer,
    failed_at timestamptz,
    worker text,
    error text,
    error_stack text
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.attempt, e.failed_at, e.worker, e.error, e.error_stack
    FROM x_jobs.job_error AS e
    WHERE e.job_id = job_errors.id
    ORDER BY e.failed_at, e.attempt
$$;

-- The steps a run reached, as an operator reads them, in the order x_jobs.steps answers them to
-- the worker (when the run reached each, a step before its compensation). Unlike steps, it
-- resolves no timer and asks no lease: it reads.
CREATE FUNCTION x_jobs.job_steps(id bigint)
RETURNS TABLE (
    job_id bigint,
    name text,
    compensation boolean,
    kind text,
    created_at timestamptz,
    event text,
    event_key text,
    match jsonb,
    since timestamptz,
    timeout_at timestamptz,
    status text,
    attempt integer,
    output jsonb,
    error text,
    event_id bigint,
    resolved_by text,
    resolved_at timestamptz
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.job_id, s.name, s.compensation, s.kind, s.created_at, s.event, s.event_key, s.match,
           s.since, s.timeout_at, s.status::text, s.attempt, s.output, s.error, s.event_id,
           s.resolved_by, s.resolved_at
    FROM x_jobs.step AS s
    WHERE s.job_id = job_steps.id
    ORDER BY s.created_at, s.compensation, s.name
$$;

-- Each of `ids` that names a job, with its state, attempt and holder: what a worker asks after
-- a lost connection or heartbeat, to tell a job it still holds from one settled, cancelled or
-- taken over. Ids that name no job are left out.
CREATE FUNCTION x_jobs.job_states(ids bigint[])
RETURNS TABLE (
    id bigint,
    state text,
    attempt integer,
    claimed_by text
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.state::text, j.attempt, j.claimed_by
    FROM x_jobs.job AS j
    WHERE j.id = ANY (job_states.ids)
    ORDER BY j.id
$$;

-- The jobs `worker` holds now (running, claimed by it) and until when: a worker whose claim's
-- answer was lost hands back those it does not know of. Read through job_running_idx, whose
-- predicate this repeats: the running rows of every worker, bounded by the live work, never the
-- history.
CREATE FUNCTION x_jobs.held_jobs(worker text)
RETURNS TABLE (
    id bigint,
    attempt integer,
    visible_at timestamptz
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.attempt, j.visible_at
    FROM x_jobs.job AS j
    WHERE j.state = 'running' AND j.claimed_by = held_jobs.worker
    ORDER BY j.id
$$;

-- An outbox message as the readers answer it (list_outbox, outbox_message): a type of its own,
-- not the table's row type, so that the table may change without changing what they answer; and
-- a type rather than OUT columns, because list_outbox takes parameters of the same names
-- (state, topic, key), which PL/pgSQL refuses beside OUT columns.
CREATE TYPE x_jobs.outbox_entry AS (
    id bigint,
    created_at timestamptz,
    max_attempts integer,
    topic text,
    key text, -- noqa: RF04
    headers jsonb,
    payload jsonb,
    state text,
    attempt integer,
    available_at timestamptz,
    relay text,
    delivered_at timestamptz,
    last_error text
);

-- The operator's listing of the outbox: messages newest first, optionally of one state, one
-- topic and one key, one page at a time, paged as list_jobs pages jobs (the last id of a page as
-- before_id gives the next). Planned for each call's values, as list_jobs is, so that the
-- undelivered states read the relays' partial indexes, bounded by the backlog: pending messages
-- those with a key and those without (each arm proves its index's predicate, which
-- `state = 'pending'` alone does not), in-flight ones outbox_inflight_idx, a key of either
-- outbox_key_idx; each sorted by id. Otherwise the primary key is read backwards from
-- before_id, the filters applied on that walk: a page of all messages reads its page, a
-- listing of a rare state or topic (dead, say) reads the history newer than its rows.
CREATE FUNCTION x_jobs.list_outbox(
    state text DEFAULT NULL,
    topic text DEFAULT NULL,
    key text DEFAULT NULL,
    before_id bigint DEFAULT NULL,
    max_rows integer DEFAULT 50
)
RETURNS SETOF x_jobs.outbox_entry
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
-- A generic plan proves no partial index's predicate from `state = $1`, and reads
-- `before_id IS NULL OR id < $4` as a filter, not a bound of the walk.
SET plan_cache_mode = force_custom_plan
-- A parallel walk of the primary key splits the index among workers, and each reads its share
-- to the end when its share holds too few of the page's rows: the whole history, for a page.
SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
DECLARE
    v_state x_jobs.outbox_state;
BEGIN
    IF list_outbox.state IS NOT NULL
        AND list_outbox.state <> ALL (pg_catalog.enum_range(NULL::x_jobs.outbox_state)::text[]) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ016',
            MESSAGE = pg_catalog.format('X_STATE_UNKNOWN: %L is not an outbox state', list_outbox.state),
            HINT = 'Use one of: ' || pg_catalog.array_to_string(
                pg_catalog.enum_range(NULL::x_jobs.outbox_state)::text[], ', ') || '.';
    END IF;
    IF list_outbox.max_rows IS NULL OR list_outbox.max_rows < 1 OR list_outbox.max_rows > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..1000',
                coalesce(list_outbox.max_rows::text, 'NULL')),
            HINT = 'Ask for a page of 1 to 1000 rows and page on with before_id.';
    END IF;
    v_state := list_outbox.state::x_jobs.outbox_state;

    IF v_state = 'pending' THEN
        RETURN QUERY
        SELECT p.* FROM (
            SELECT o.id, o.created_at, o.max_attempts, o.topic, o.key, o.headers, o.payload,
                   o.state::text, o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NULL
                AND list_outbox.key IS NULL
                AND (list_outbox.topic IS NULL OR o.topic = list_outbox.topic)
                AND (list_outbox.before_id IS NULL OR o.id < list_outbox.before_id)
            UNION ALL
            SELECT o.id, o.created_at, o.max_attempts, o.topic, o.key, o.headers, o.payload,
                   o.state::text, o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NOT NULL
                AND (list_outbox.key IS NULL OR o.key = list_outbox.key)
                AND (list_outbox.topic IS NULL OR o.topic = list_outbox.topic)
                AND (list_outbox.before_id IS NULL OR o.id < list_outbox.before_id)
        ) AS p
        ORDER BY p.id DESC
        LIMIT list_outbox.max_rows;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT o.id, o.created_at, o.max_attempts, o.topic, o.key, o.headers, o.payload, o.state::text,
           o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error
    FROM x_jobs.outbox AS o
    WHERE (v_state IS NULL OR o.state = v_state)
        AND (list_outbox.topic IS NULL OR o.topic = list_outbox.topic)
        AND (list_outbox.key IS NULL OR o.key = list_outbox.key)
        AND (list_outbox.before_id IS NULL OR o.id < list_outbox.before_id)
    ORDER BY o.id DESC
    LIMIT list_outbox.max_rows;
END
$$;

-- One outbox message as an operator reads it (`x-jobs outbox show`), the columns list_outbox
-- answers.
CREATE FUNCTION x_jobs.outbox_message(id bigint)
RETURNS SETOF x_jobs.outbox_entry
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.id, o.created_at, o.max_attempts, o.topic, o.key, o.headers, o.payload, o.state::text,
           o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error
    FROM x_jobs.outbox AS o
    WHERE o.id = outbox_message.id
$$;

-- What settled, per job name, summed over the counters' buckets and shards that start at or
-- after `since` (every bucket when NULL): completed, retried, failed, dead, cancelled, and the
-- milliseconds the counted attempts ran. A job name with no bucket there is absent. Reads
-- x_jobs.counter only, whose rows per name rollup_counters keeps bounded.
CREATE FUNCTION x_jobs.job_counters(since timestamptz DEFAULT NULL)
RETURNS TABLE (
    job text,
    completed bigint,
    retried bigint,
    failed bigint,
    dead bigint,
    cancelled bigint,
    run_ms bigint
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.job, sum(c.completed)::bigint, sum(c.retried)::bigint, sum(c.failed)::bigint,
           sum(c.dead)::bigint, sum(c.cancelled)::bigint, sum(c.run_ms)::bigint
    FROM x_jobs.counter AS c
    WHERE job_counters.since IS NULL OR c.bucket_start >= job_counters.since
    GROUP BY c.job
    ORDER BY c.job COLLATE "C"
$$;

------------------------------------------------------------------------------------------------
-- Ownership: after every object is made, before any grant (see x_jobs._adopt)
------------------------------------------------------------------------------------------------

SELECT x_jobs._adopt();

------------------------------------------------------------------------------------------------
-- Grants
------------------------------------------------------------------------------------------------

-- Nothing is left to PUBLIC: new functions are executable by PUBLIC unless revoked.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA x_jobs FROM public;
REVOKE ALL ON ALL TABLES IN SCHEMA x_jobs FROM public;

GRANT USAGE ON SCHEMA x_jobs TO x_jobs_producer, pg_monitor;

-- Producers: enqueue and read a job's result. Those functions run as their owner (SECURITY
-- DEFINER), as do the outbox's and publish below, so a producer holds no right on any table: it
-- can neither read other jobs' inputs nor insert a row that skips enqueue's checks (one already
-- running, a forged claimed_by, an input past the size limit). Until 0.3.6 it held SELECT and
-- INSERT on x_jobs.job, x_jobs.outbox and x_jobs.webhook_ledger.
GRANT EXECUTE ON FUNCTION x_jobs.now() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._fake_now() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.error_codes() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.version() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.enqueue(
    text, jsonb, text, timestamptz, text, integer, integer, text, text, text, text, integer, boolean, interval,
    interval, boolean
) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.enqueue_many(jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.result(bigint) TO x_jobs_producer;

-- Workers: claim, heartbeat, settle, announce, read demand. These functions run as their owner
-- (since 0.3.6), so a worker writes no table but through them: it can settle only what it
-- claimed, and cannot rewrite or delete other rows. It reads the jobs (the Python worker asks
-- its jobs' states after a lost connection). The helpers below are granted for the admins'
-- functions, which run as the caller.
GRANT SELECT ON x_jobs.job TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._max_payload_bytes() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._max_payload_setting() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._payload_bytes(jsonb) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._minute(timestamptz) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_worker(text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_lease(interval, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._shard() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.claim(text[], text, interval, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.extend_lease(bigint[], text, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.release(bigint[], text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.complete(bigint, text, jsonb) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.complete_many(bigint[], text, jsonb[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.fail(bigint, text, text, text, interval, boolean) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.announce_worker(text, text[], text, boolean, interval, text[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.queue_demand() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.queue_gauges(interval, text[]) TO x_jobs_worker;

-- Admins: operate the queues and run retention. These functions run as the caller: an admin
-- holds the rights on the rows they change (before 0.3.6 some came through x_jobs_worker).
GRANT EXECUTE ON FUNCTION x_jobs.cancel(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.retry(bigint) TO x_jobs_admin;
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
GRANT EXECUTE ON FUNCTION x_jobs.queue_stats() TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.pause_queue(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.resume_queue(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.rollup_counters(interval, interval, interval) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge(interval, integer) TO x_jobs_admin;
GRANT UPDATE, DELETE ON x_jobs.job TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.job_error TO x_jobs_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON x_jobs.counter TO x_jobs_admin;
GRANT SELECT, INSERT, DELETE ON x_jobs.queue_pause TO x_jobs_admin;
GRANT SELECT ON x_jobs.worker TO x_jobs_admin;

-- Monitoring: counts only (queue_demand and queue_gauges are SECURITY DEFINER, see above).
GRANT EXECUTE ON FUNCTION x_jobs.queue_demand(), x_jobs.queue_gauges(interval, text[]), x_jobs.now(), x_jobs.version()
TO pg_monitor;
-- Whoever may read the clock may reach its refusal (a monitor's session cannot move it).
GRANT EXECUTE ON FUNCTION x_jobs._fake_now() TO pg_monitor;

-- The health of the installation: to workers (which log it when they start), so admins, and
-- monitors. It reads catalogs only, as its caller, and so does the helper it calls. The role
-- helpers and _adopt are the scripts' own: nobody is granted them.
GRANT EXECUTE ON FUNCTION x_jobs.health(), x_jobs._role_problems() TO x_jobs_worker, pg_monitor;

-- Steps and events (0.2.0). A producer publishes; publish runs as its owner (see there).
GRANT EXECUTE ON FUNCTION x_jobs.publish(text, jsonb, text) TO x_jobs_producer;
-- Workers replay, record and suspend the steps of the runs they hold, through functions that
-- run as their owner (since 0.3.6: they held every right on x_jobs.step, and read x_jobs.event).
GRANT EXECUTE ON FUNCTION x_jobs._clock() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_event(text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_held(bigint, text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._suspend(bigint, timestamptz) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.steps(bigint, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_record(bigint, text, text, jsonb, text, boolean) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_sleep(bigint, text, text, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_wait(
    bigint, text, text, text, text, jsonb, interval, timestamptz
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.progress(bigint, text, double precision, double precision, text)
TO x_jobs_worker;
-- Admins resolve steps by hand and purge old events (and the steps of purged jobs).
GRANT EXECUTE ON FUNCTION x_jobs.resolve_step(bigint, text, jsonb) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._require_retention(text, interval, integer, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge_events(interval, integer) TO x_jobs_admin;
GRANT SELECT, UPDATE, DELETE ON x_jobs.step TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.event TO x_jobs_admin;

-- The outbox (0.2.0). Producers put messages and receive webhooks (which enqueue jobs), through
-- functions that run as their owner.
GRANT EXECUTE ON FUNCTION x_jobs.outbox_put(text, jsonb, text, jsonb, integer) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_put_many(jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb) TO x_jobs_producer;
-- Workers relay: they claim, deliver and settle messages.
GRANT EXECUTE ON FUNCTION x_jobs.relay_outbox(text, integer, interval, text[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_ack(bigint[], text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_extend_lease(bigint[], text, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_nack(bigint, text, text, timestamptz, boolean) TO x_jobs_worker;
GRANT SELECT ON x_jobs.outbox TO x_jobs_worker;
-- Admins redrive dead messages, purge delivered ones and old ledger rows.
GRANT EXECUTE ON FUNCTION x_jobs.outbox_redrive(bigint[], text, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge_outbox(interval, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge_webhook_ledger(interval, integer) TO x_jobs_admin;
GRANT UPDATE, DELETE ON x_jobs.outbox TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.webhook_ledger TO x_jobs_admin;

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

-- Readers. They run as their caller, who holds SELECT on what each reads: admins (through
-- x_jobs_worker, and their own grants on job_error, step and counter) read a job, its errors and
-- steps, the outbox and the counters; workers ask their jobs' states and what they hold.
GRANT EXECUTE ON FUNCTION x_jobs.job_detail(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_errors(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_steps(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_message(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_counters(timestamptz) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_states(bigint[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.held_jobs(text) TO x_jobs_worker;
