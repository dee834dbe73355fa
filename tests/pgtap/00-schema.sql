-- The contract of the extension, pinned: which objects exist, what each function returns, how
-- volatile it is, whose rights it runs with, which settings it pins, and who may use what.
-- A change to any of these is a change to the API: it shows up here first, on purpose.
BEGIN;
SELECT plan(291);

-- The functions of the API, one row each, with what 00-schema pins about them. `args` is how
-- pgTAP's catalog view spells the argument types (regtype output: 'timestamp with time zone',
-- schema-qualified x_jobs types), which function_returns and friends compare as text.
CREATE TEMP TABLE api (
    fn name PRIMARY KEY,
    args name[] NOT NULL,
    return_type text NOT NULL,
    volatility text NOT NULL,
    runs_as_owner boolean NOT NULL
);

INSERT INTO api (fn, args, return_type, volatility, runs_as_owner) VALUES
('now', '{}', 'timestamp with time zone', 'STABLE', FALSE),
('error_codes', '{}', 'setof record', 'IMMUTABLE', FALSE),
('version', '{}', 'text', 'IMMUTABLE', FALSE),
('_minute', '{timestamp with time zone}', 'timestamp with time zone', 'IMMUTABLE', FALSE),
('_shard', '{}', 'smallint', 'STABLE', FALSE),
('_max_payload_bytes', '{}', 'integer', 'STABLE', FALSE),
('_require_worker', '{text,text}', 'void', 'IMMUTABLE', FALSE),
('_enqueue', '{x_jobs.enqueue_request[]}', 'setof x_jobs.enqueue_many_result', 'VOLATILE', FALSE),
(
    'enqueue',
    '{text,jsonb,text,timestamp with time zone,text,integer,integer,text,text,text,text,integer,boolean,'
    'interval,interval}',
    'x_jobs.enqueue_result', 'VOLATILE', FALSE
),
('enqueue_many', '{jsonb}', 'setof x_jobs.enqueue_many_result', 'VOLATILE', FALSE),
('claim', '{text[],text,interval,integer}', 'setof x_jobs.job', 'VOLATILE', FALSE),
('extend_lease', '{bigint[],text,interval}', 'setof bigint', 'VOLATILE', FALSE),
('release', '{bigint[],text}', 'setof bigint', 'VOLATILE', FALSE),
('complete_many', '{bigint[],text,jsonb[]}', 'setof bigint', 'VOLATILE', FALSE),
('complete', '{bigint,text,jsonb}', 'boolean', 'VOLATILE', FALSE),
('fail', '{bigint,text,text,text,interval,boolean}', 'x_jobs.job_state', 'VOLATILE', FALSE),
('cancel', '{bigint}', 'boolean', 'VOLATILE', FALSE),
('retry', '{bigint}', 'boolean', 'VOLATILE', FALSE),
('list_jobs', '{text,text,bigint,integer}', 'setof x_jobs.job', 'STABLE', FALSE),
('queue_stats', '{}', 'setof record', 'STABLE', FALSE),
('pause_queue', '{text}', 'boolean', 'VOLATILE', FALSE),
('resume_queue', '{text}', 'boolean', 'VOLATILE', FALSE),
('announce_worker', '{text,text[],text,boolean,interval}', 'x_jobs.worker', 'VOLATILE', FALSE),
('queue_demand', '{}', 'setof record', 'STABLE', TRUE),
('rollup_counters', '{interval,interval,interval}', 'bigint', 'VOLATILE', FALSE),
('purge', '{interval,integer}', 'bigint', 'VOLATILE', FALSE);

-- Who may execute what, as the Grants section states it: the lowest x_jobs role granted
-- EXECUTE (a worker is a member of producer and an admin of worker, and has_function_privilege,
-- which function_privs_are uses, counts inherited rights), and whether pg_monitor is granted it.
-- PUBLIC is granted nothing.
CREATE TEMP TABLE api_grant (
    fn name PRIMARY KEY REFERENCES api (fn),
    lowest_role name,
    to_pg_monitor boolean NOT NULL
);

INSERT INTO api_grant (fn, lowest_role, to_pg_monitor) VALUES
('now', 'x_jobs_producer', TRUE),
('error_codes', 'x_jobs_producer', FALSE),
('version', 'x_jobs_producer', TRUE),
('_max_payload_bytes', 'x_jobs_producer', FALSE),
('_enqueue', 'x_jobs_producer', FALSE),
('enqueue', 'x_jobs_producer', FALSE),
('enqueue_many', 'x_jobs_producer', FALSE),
('_minute', 'x_jobs_worker', FALSE),
('_shard', 'x_jobs_worker', FALSE),
('_require_worker', 'x_jobs_worker', FALSE),
('claim', 'x_jobs_worker', FALSE),
('extend_lease', 'x_jobs_worker', FALSE),
('release', 'x_jobs_worker', FALSE),
('complete', 'x_jobs_worker', FALSE),
('complete_many', 'x_jobs_worker', FALSE),
('fail', 'x_jobs_worker', FALSE),
('announce_worker', 'x_jobs_worker', FALSE),
('queue_demand', 'x_jobs_worker', TRUE),
('cancel', 'x_jobs_admin', FALSE),
('retry', 'x_jobs_admin', FALSE),
('list_jobs', 'x_jobs_admin', FALSE),
('queue_stats', 'x_jobs_admin', FALSE),
('pause_queue', 'x_jobs_admin', FALSE),
('resume_queue', 'x_jobs_admin', FALSE),
('rollup_counters', 'x_jobs_admin', FALSE),
('purge', 'x_jobs_admin', FALSE);

-- The roles a grant is checked for, in the order of their membership chain.
CREATE TEMP TABLE grant_role (grantee name PRIMARY KEY, chain_rank integer);

INSERT INTO grant_role (grantee, chain_rank) VALUES
('x_jobs_producer', 1), ('x_jobs_worker', 2), ('x_jobs_admin', 3), ('pg_monitor', NULL), ('public', NULL);

-- The extension and its schema --------------------------------------------------------------

SELECT has_extension('x_jobs', 'The x_jobs extension should be installed');
SELECT has_schema('x_jobs', 'The x_jobs schema should exist');
SELECT ok(
    EXISTS (
        SELECT
        FROM pg_catalog.pg_depend AS d
        INNER JOIN pg_catalog.pg_extension AS e ON d.refobjid = e.oid
        WHERE
            d.classid = 'pg_catalog.pg_namespace'::regclass
            AND d.objid = 'x_jobs'::regnamespace
            AND d.deptype = 'e'
            AND e.extname = 'x_jobs'
    ),
    'The x_jobs schema should belong to the extension, so DROP EXTENSION removes it'
);

SELECT tables_are(
    'x_jobs', ARRAY['job', 'job_error', 'queue_pause', 'worker', 'counter'],
    'The x_jobs schema should hold exactly the tables job, job_error, queue_pause, worker and counter'
);

SELECT functions_are(
    'x_jobs', array(SELECT a.fn FROM api AS a),
    'The x_jobs schema should hold exactly the functions of the API, private helpers included'
);

SELECT types_are(
    'x_jobs', ARRAY['job_state', 'enqueue_request', 'enqueue_result', 'enqueue_many_result'],
    'The x_jobs schema should define exactly the types job_state, enqueue_request, enqueue_result '
    'and enqueue_many_result'
);

SELECT enum_has_labels(
    'x_jobs', 'job_state',
    ARRAY['ready', 'delayed', 'suspended', 'running', 'done', 'failed', 'dead', 'cancelled'],
    'x_jobs.job_state should have the eight states, live ones first, in this order'
);

-- The composite types are the shape of what enqueue takes and answers: callers read them by name.
SELECT results_eq(
    $$
    SELECT a.attrelid::regclass::text, a.attname::text COLLATE "default", pg_catalog.format_type(a.atttypid, a.atttypmod)
    FROM pg_catalog.pg_attribute AS a
    WHERE
        a.attrelid IN (
            'x_jobs.enqueue_request'::regclass, 'x_jobs.enqueue_result'::regclass,
            'x_jobs.enqueue_many_result'::regclass
        )
        AND a.attnum > 0
        AND NOT a.attisdropped
    ORDER BY a.attrelid::regclass::text, a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.enqueue_many_result', 'ord', 'integer'),
        ('x_jobs.enqueue_many_result', 'id', 'bigint'),
        ('x_jobs.enqueue_many_result', 'run_id', 'uuid'),
        ('x_jobs.enqueue_many_result', 'deduped', 'boolean'),
        ('x_jobs.enqueue_request', 'name', 'text'),
        ('x_jobs.enqueue_request', 'input', 'jsonb'),
        ('x_jobs.enqueue_request', 'queue', 'text'),
        ('x_jobs.enqueue_request', 'run_at', 'timestamp with time zone'),
        ('x_jobs.enqueue_request', 'idempotency_key', 'text'),
        ('x_jobs.enqueue_request', 'max_attempts', 'integer'),
        ('x_jobs.enqueue_request', 'priority', 'integer'),
        ('x_jobs.enqueue_request', 'tenant_id', 'text'),
        ('x_jobs.enqueue_request', 'concurrency_key', 'text'),
        ('x_jobs.enqueue_request', 'concurrency_limit', 'integer'),
        ('x_jobs.enqueue_request', 'traceparent', 'text'),
        ('x_jobs.enqueue_request', 'enqueued_by', 'text'),
        ('x_jobs.enqueue_request', 'dead_letter', 'boolean'),
        ('x_jobs.enqueue_request', 'backoff_base', 'interval'),
        ('x_jobs.enqueue_request', 'backoff_max', 'interval'),
        ('x_jobs.enqueue_result', 'id', 'bigint'),
        ('x_jobs.enqueue_result', 'run_id', 'uuid'),
        ('x_jobs.enqueue_result', 'deduped', 'boolean')
    $$,
    'The request and result types should have the documented fields, in order'
);

-- Indexes of x_jobs.job: the claim's three arms, the live-key uniqueness, the concurrency count.
SELECT indexes_are(
    'x_jobs', 'job',
    ARRAY[
        'job_pkey', 'job_ready_idx', 'job_waiting_idx', 'job_running_idx',
        'job_idempotency_key_idx', 'job_concurrency_idx'
    ],
    'x_jobs.job should have exactly its primary key, the three claim arms, the live-key and the concurrency indexes'
);

-- The claim repeats these predicates word for word (a partial index is used only when the
-- planner can prove its predicate), so their columns and predicates are part of the contract.
SELECT results_eq(
    $$
    SELECT i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid)
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid = 'x_jobs.job'::regclass
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.job_concurrency_idx',
         'CREATE INDEX job_concurrency_idx ON x_jobs.job USING btree (concurrency_key) '
         'WHERE ((concurrency_key IS NOT NULL) AND (state = ''running''::x_jobs.job_state))'),
        ('x_jobs.job_idempotency_key_idx',
         'CREATE UNIQUE INDEX job_idempotency_key_idx ON x_jobs.job USING btree (idempotency_key) '
         'WHERE ((idempotency_key IS NOT NULL) AND (state = ANY (ARRAY[''ready''::x_jobs.job_state, '
         '''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state, ''running''::x_jobs.job_state])))'),
        ('x_jobs.job_pkey',
         'CREATE UNIQUE INDEX job_pkey ON x_jobs.job USING btree (id)'),
        ('x_jobs.job_ready_idx',
         'CREATE INDEX job_ready_idx ON x_jobs.job USING btree (queue, priority, run_at, id) '
         'WHERE (state = ''ready''::x_jobs.job_state)'),
        ('x_jobs.job_running_idx',
         'CREATE INDEX job_running_idx ON x_jobs.job USING btree (queue, visible_at, id) '
         'WHERE (state = ''running''::x_jobs.job_state)'),
        ('x_jobs.job_waiting_idx',
         'CREATE INDEX job_waiting_idx ON x_jobs.job USING btree (queue, run_at, id) '
         'WHERE (state = ANY (ARRAY[''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state]))')
    $$,
    'Each index of x_jobs.job should have its documented columns, uniqueness and partial predicate'
);

-- pg_dump keeps the rows of an extension's tables only when they are registered.
SELECT results_eq(
    $$
    SELECT c.config::regclass::text, e.extcondition[c.n] COLLATE "default"
    FROM pg_catalog.pg_extension AS e
    CROSS JOIN LATERAL unnest(e.extconfig) WITH ORDINALITY AS c (config, n)
    WHERE e.extname = 'x_jobs'
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.counter', ''),
        ('x_jobs.job', ''),
        ('x_jobs.job_error', ''),
        ('x_jobs.job_id_seq', ''),
        ('x_jobs.queue_pause', '')
    $$,
    'pg_dump should keep every row of job, job_error, queue_pause and counter, and the job id sequence'
);

-- Every function: return type, volatility, security ------------------------------------------

SELECT
    function_returns(
        'x_jobs', a.fn, a.args, a.return_type,
        pg_catalog.format(
            'x_jobs.%s(%s) should return %s', a.fn, pg_catalog.array_to_string(a.args, ', '), a.return_type
        )
    )
FROM api AS a
ORDER BY a.fn;

SELECT
    volatility_is(
        'x_jobs', a.fn, a.args, a.volatility,
        pg_catalog.format('x_jobs.%s(%s) should be %s', a.fn, pg_catalog.array_to_string(a.args, ', '), a.volatility)
    )
FROM api AS a
ORDER BY a.fn;

SELECT
    CASE
        WHEN a.runs_as_owner
            THEN is_definer(
                'x_jobs', a.fn, a.args,
                pg_catalog.format(
                    'x_jobs.%s() should run as its owner, so monitoring roles get counts without reading jobs', a.fn
                )
            )
        ELSE isnt_definer(
            'x_jobs', a.fn, a.args,
            pg_catalog.format(
                'x_jobs.%s(%s) should run with the rights of its caller', a.fn, pg_catalog.array_to_string(a.args, ', ')
            )
        )
    END
FROM api AS a
ORDER BY a.fn;

-- The two table functions: their output columns are what callers select by name.
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.error_codes()'::regprocedure),
    'TABLE(sqlstate text, code text, meaning text)',
    'x_jobs.error_codes() should answer (sqlstate, code, meaning)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.queue_demand()'::regprocedure),
    'TABLE(queue text, demand bigint)',
    'x_jobs.queue_demand() should answer (queue, demand)'
);

-- search_path ---------------------------------------------------------------------------------

SELECT set_eq(
    $$
    SELECT p.proname::text COLLATE "default"
    FROM pg_catalog.pg_proc AS p
    WHERE
        p.pronamespace = 'x_jobs'::regnamespace
        AND NOT EXISTS (
            SELECT FROM unnest(p.proconfig) AS s (setting) WHERE s.setting LIKE 'search\_path=%'
        )
    $$,
    ARRAY['now', '_minute', '_shard', '_max_payload_bytes'],
    'Every function should pin search_path except the tiny SQL helpers now, _minute, _shard and _max_payload_bytes'
);

SELECT is_empty(
    $$
    SELECT p.proname, l.lanname, p.proconfig, p.prosecdef, p.proisstrict
    FROM pg_catalog.pg_proc AS p
    INNER JOIN pg_catalog.pg_language AS l ON p.prolang = l.oid
    WHERE
        p.pronamespace = 'x_jobs'::regnamespace
        AND p.proname IN ('now', '_minute', '_shard', '_max_payload_bytes')
        AND (l.lanname <> 'sql' OR p.proconfig IS NOT NULL OR p.prosecdef)
    $$,
    'The helpers that skip search_path should be plain SQL functions with no SET clause, so they can inline'
);

SELECT is_empty(
    $$
    SELECT p.proname, s.setting
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL unnest(p.proconfig) AS s (setting)
    WHERE
        p.pronamespace = 'x_jobs'::regnamespace
        AND s.setting LIKE 'search\_path=%'
        AND s.setting <> 'search_path=pg_catalog, pg_temp'
    $$,
    'A pinned search_path should be exactly pg_catalog, pg_temp'
);

-- Parameter names and defaults: callers use named notation, so both are API -----------------

SELECT
    is(
        pg_catalog.pg_get_function_arguments(p.oid),
        e.arguments,
        pg_catalog.format('x_jobs.%s should take the parameters (%s)', p.proname, e.arguments)
    )
FROM (
    VALUES
    ('now', ''),
    ('error_codes', ''),
    (
        'enqueue',
        'name text, input jsonb DEFAULT ''{}''::jsonb, queue text DEFAULT ''default''::text, '
        'run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, '
        'idempotency_key text DEFAULT NULL::text, max_attempts integer DEFAULT 25, '
        'priority integer DEFAULT 0, tenant_id text DEFAULT ''none''::text, '
        'concurrency_key text DEFAULT NULL::text, traceparent text DEFAULT NULL::text, '
        'enqueued_by text DEFAULT NULL::text, concurrency_limit integer DEFAULT NULL::integer, '
        'dead_letter boolean DEFAULT true, backoff_base interval DEFAULT ''00:00:01''::interval, '
        'backoff_max interval DEFAULT ''01:00:00''::interval'
    ),
    ('enqueue_many', 'jobs jsonb'),
    (
        'claim',
        'queues text[], worker text, lease interval DEFAULT ''00:00:30''::interval, qty integer DEFAULT 1'
    ),
    ('extend_lease', 'ids bigint[], worker text, lease interval DEFAULT ''00:00:30''::interval'),
    ('complete_many', 'ids bigint[], worker text, outputs jsonb[] DEFAULT NULL::jsonb[]'),
    ('complete', 'id bigint, worker text, output jsonb DEFAULT NULL::jsonb'),
    (
        'fail',
        'id bigint, worker text, error text, error_stack text DEFAULT NULL::text, '
        'retry_delay interval DEFAULT NULL::interval, retryable boolean DEFAULT true'
    ),
    ('cancel', 'id bigint'),
    ('retry', 'id bigint'),
    (
        'list_jobs',
        'state text DEFAULT NULL::text, queue text DEFAULT NULL::text, before_id bigint DEFAULT NULL::bigint, '
        'max_rows integer DEFAULT 50'
    ),
    ('pause_queue', 'queue text'),
    ('resume_queue', 'queue text'),
    (
        'announce_worker',
        'worker text, queues text[], build text DEFAULT NULL::text, draining boolean DEFAULT false, '
        'ttl interval DEFAULT ''00:01:00''::interval'
    ),
    ('queue_demand', ''),
    (
        'rollup_counters',
        'minutes_for interval DEFAULT ''02:00:00''::interval, hours_for interval DEFAULT ''2 days''::interval, '
        'days_for interval DEFAULT ''400 days''::interval'
    ),
    ('purge', 'older_than interval, batch_size integer DEFAULT 10000')
) AS e (fn, arguments)
LEFT JOIN pg_catalog.pg_proc AS p ON p.pronamespace = 'x_jobs'::regnamespace AND e.fn = p.proname
ORDER BY e.fn;

-- Roles and privileges ------------------------------------------------------------------------

SELECT has_role('x_jobs_producer', 'The role x_jobs_producer should exist');
SELECT has_role('x_jobs_worker', 'The role x_jobs_worker should exist');
SELECT has_role('x_jobs_admin', 'The role x_jobs_admin should exist');
SELECT is_member_of(
    'x_jobs_producer', ARRAY['x_jobs_worker'], 'A worker should be a producer too, since a job may enqueue jobs'
);
SELECT is_member_of('x_jobs_worker', ARRAY['x_jobs_admin'], 'An admin should be a worker too');

SELECT
    schema_privs_are(
        'x_jobs', r.grantee, CASE WHEN r.grantee = 'public' THEN '{}' ELSE '{USAGE}' END::name[],
        pg_catalog.format(
            'Role %s should %s the x_jobs schema, and create nothing in it',
            r.grantee, CASE WHEN r.grantee = 'public' THEN 'not use' ELSE 'use' END
        )
    )
FROM grant_role AS r
ORDER BY r.grantee;

-- Effective EXECUTE rights: what a member of each role can run, inherited rights included.
SELECT
    function_privs_are(
        'x_jobs', g.fn, a.args, r.grantee,
        CASE
            WHEN r.chain_rank >= lr.chain_rank OR (r.grantee = 'pg_monitor' AND g.to_pg_monitor) THEN '{EXECUTE}'
            ELSE '{}'
        END::name[],
        pg_catalog.format(
            'Role %s should %s x_jobs.%s',
            r.grantee,
            CASE
                WHEN r.chain_rank >= lr.chain_rank OR (r.grantee = 'pg_monitor' AND g.to_pg_monitor)
                    THEN 'be able to run'
                ELSE 'not be able to run'
            END,
            g.fn
        )
    )
FROM api_grant AS g
INNER JOIN api AS a ON g.fn = a.fn
INNER JOIN grant_role AS lr ON g.lowest_role = lr.grantee
CROSS JOIN grant_role AS r
ORDER BY g.fn, r.grantee;

-- The grants themselves: each right is granted once, to the lowest role that needs it.
SELECT set_eq(
    $$
    SELECT p.proname::text COLLATE "default", coalesce(r.rolname::text COLLATE "default", 'public')
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS acl
    LEFT JOIN pg_catalog.pg_roles AS r ON acl.grantee = r.oid
    WHERE p.pronamespace = 'x_jobs'::regnamespace AND acl.grantee <> p.proowner
    $$,
    $$
    SELECT g.fn::text, g.lowest_role::text FROM api_grant AS g
    UNION ALL
    SELECT g.fn::text, 'pg_monitor' FROM api_grant AS g WHERE g.to_pg_monitor
    $$,
    'EXECUTE should be granted directly only as the Grants section states: to the lowest role, and to pg_monitor'
);

SELECT set_eq(
    $$
    SELECT c.relname::text COLLATE "default", coalesce(r.rolname::text COLLATE "default", 'public'), acl.privilege_type
    FROM pg_catalog.pg_class AS c
    CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS acl
    LEFT JOIN pg_catalog.pg_roles AS r ON acl.grantee = r.oid
    WHERE c.relnamespace = 'x_jobs'::regnamespace AND acl.grantee <> c.relowner
    $$,
    $$
    VALUES
        ('job', 'x_jobs_producer', 'SELECT'),
        ('job', 'x_jobs_producer', 'INSERT'),
        ('job', 'x_jobs_worker', 'UPDATE'),
        ('job', 'x_jobs_admin', 'DELETE'),
        ('job_error', 'x_jobs_worker', 'SELECT'),
        ('job_error', 'x_jobs_worker', 'INSERT'),
        ('job_error', 'x_jobs_admin', 'SELECT'),
        ('job_error', 'x_jobs_admin', 'DELETE'),
        ('queue_pause', 'x_jobs_worker', 'SELECT'),
        ('queue_pause', 'x_jobs_admin', 'INSERT'),
        ('queue_pause', 'x_jobs_admin', 'DELETE'),
        ('worker', 'x_jobs_worker', 'SELECT'),
        ('worker', 'x_jobs_worker', 'INSERT'),
        ('worker', 'x_jobs_worker', 'UPDATE'),
        ('worker', 'x_jobs_worker', 'DELETE'),
        ('worker', 'x_jobs_admin', 'SELECT'),
        ('counter', 'x_jobs_worker', 'SELECT'),
        ('counter', 'x_jobs_worker', 'INSERT'),
        ('counter', 'x_jobs_worker', 'UPDATE'),
        ('counter', 'x_jobs_admin', 'SELECT'),
        ('counter', 'x_jobs_admin', 'DELETE'),
        ('job_id_seq', 'x_jobs_producer', 'USAGE')
    $$,
    'Table and sequence privileges should be granted directly only as the Grants section states, none to PUBLIC'
);

SELECT set_eq(
    $$
    SELECT coalesce(r.rolname::text COLLATE "default", 'public'), acl.privilege_type
    FROM pg_catalog.pg_namespace AS n
    CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) AS acl
    LEFT JOIN pg_catalog.pg_roles AS r ON acl.grantee = r.oid
    WHERE n.nspname = 'x_jobs' AND acl.grantee <> n.nspowner
    $$,
    $$ VALUES ('x_jobs_producer', 'USAGE'), ('pg_monitor', 'USAGE') $$,
    'USAGE on the schema should be granted directly to x_jobs_producer and pg_monitor only'
);

-- Effective table rights, inherited ones included.
SELECT
    table_privs_are(
        'x_jobs', t.tbl, r.grantee, t.privs::name[],
        pg_catalog.format(
            'Role %s should have %s on x_jobs.%s',
            r.grantee, coalesce(nullif(pg_catalog.array_to_string(t.privs::text[], ', '), ''), 'no privilege'), t.tbl
        )
    )
FROM (
    VALUES
    ('job', 'x_jobs_producer', '{INSERT,SELECT}'),
    ('job', 'x_jobs_worker', '{INSERT,SELECT,UPDATE}'),
    ('job', 'x_jobs_admin', '{DELETE,INSERT,SELECT,UPDATE}'),
    ('job', 'pg_monitor', '{}'),
    ('job', 'public', '{}'),
    ('job_error', 'x_jobs_producer', '{}'),
    ('job_error', 'x_jobs_worker', '{INSERT,SELECT}'),
    ('job_error', 'x_jobs_admin', '{DELETE,INSERT,SELECT}'),
    ('job_error', 'pg_monitor', '{}'),
    ('job_error', 'public', '{}'),
    ('queue_pause', 'x_jobs_producer', '{}'),
    ('queue_pause', 'x_jobs_worker', '{SELECT}'),
    ('queue_pause', 'x_jobs_admin', '{DELETE,INSERT,SELECT}'),
    ('queue_pause', 'pg_monitor', '{}'),
    ('queue_pause', 'public', '{}'),
    ('worker', 'x_jobs_producer', '{}'),
    ('worker', 'x_jobs_worker', '{DELETE,INSERT,SELECT,UPDATE}'),
    ('worker', 'x_jobs_admin', '{DELETE,INSERT,SELECT,UPDATE}'),
    ('worker', 'pg_monitor', '{}'),
    ('worker', 'public', '{}'),
    ('counter', 'x_jobs_producer', '{}'),
    ('counter', 'x_jobs_worker', '{INSERT,SELECT,UPDATE}'),
    ('counter', 'x_jobs_admin', '{DELETE,INSERT,SELECT,UPDATE}'),
    ('counter', 'pg_monitor', '{}'),
    ('counter', 'public', '{}')
) AS t (tbl, grantee, privs)
INNER JOIN grant_role AS r ON t.grantee = r.grantee
ORDER BY t.tbl, r.grantee;

-- enqueue draws ids with nextval, so whoever may enqueue needs the sequence.
SELECT
    sequence_privs_are(
        'x_jobs', 'job_id_seq', r.grantee,
        CASE WHEN r.chain_rank IS NOT NULL THEN '{USAGE}' ELSE '{}' END::name[],
        pg_catalog.format(
            'Role %s should %s ids from x_jobs.job_id_seq', r.grantee,
            CASE WHEN r.chain_rank IS NOT NULL THEN 'be able to draw' ELSE 'not be able to draw' END
        )
    )
FROM grant_role AS r
ORDER BY r.grantee;

-- The grants suffice: each role can do its job through the functions --------------------------

SET LOCAL ROLE x_jobs_producer;
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue('schema_grants', queue => 'schema_grants') $$,
    'A producer should be able to enqueue'
);
SELECT throws_ok(
    $$ SELECT x_jobs.claim(ARRAY['schema_grants'], 'w') $$,
    '42501', 'permission denied for function claim',
    'A producer should not be able to claim'
);
RESET ROLE;

SET LOCAL ROLE x_jobs_worker;
SELECT results_eq(
    $$
    SELECT x_jobs.complete(c.id, 'schema-worker')
    FROM x_jobs.claim(ARRAY['schema_grants'], 'schema-worker') AS c
    $$,
    ARRAY[TRUE],
    'A worker should be able to claim a job and complete it'
);
RESET ROLE;

SET LOCAL ROLE x_jobs_admin;
SELECT results_eq(
    $$
    SELECT x_jobs.pause_queue('schema_grants')
    UNION ALL
    SELECT x_jobs.cancel((x_jobs.enqueue('schema_grants_cancel', queue => 'schema_grants')).id)
    $$,
    ARRAY[TRUE, TRUE],
    'An admin should be able to pause a queue and cancel a job'
);
RESET ROLE;

SET LOCAL ROLE pg_monitor;
SELECT lives_ok(
    $$ SELECT * FROM x_jobs.queue_demand() $$,
    'pg_monitor should be able to read queue demand'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.job $$,
    '42501', 'permission denied for table job',
    'pg_monitor should not be able to read job rows (inputs) directly'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
