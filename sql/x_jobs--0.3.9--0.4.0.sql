\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.0'" to load this file. \quit

-- 0.3.9 -> 0.4.0: what real deployments need (issue 19): poolers, installs without a superuser,
-- failover, metrics, bulk operations and declarations in the database.
-- Declarations: what workers declare of each job is recorded (x_jobs.job_type: declare_job,
-- declare_jobs, job_types, drop_job_type) and enqueue fills what a request leaves out from it
-- (enqueue's parameters default to NULL); a worker hands back a job it has no handler for
-- (hand_back: delayed for a worker that serves it, else parked, job_parked_idx) and announces
-- the jobs it serves (announce_worker's jobs, x_jobs.worker.jobs), which wakes its parked rows.

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.0'::text
$$;

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
CREATE INDEX job_parked_idx ON x_jobs.job (queue, name, id)
WHERE state = 'delayed' AND run_at = 'infinity';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_type', '');

REVOKE ALL ON x_jobs.job_type FROM public;

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
        ('XJ047', 'X_DECLARATIONS_INVALID', 'declare_jobs got something other than an array of declaration objects, an unknown field or one of the wrong type, or a job declared twice in one call.'),
        ('XJ048', 'X_JOB_TIMEOUT_INVALID', 'A declared job timeout is not above zero, or longer than 1000 years.'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
$$;

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
