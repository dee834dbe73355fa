\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.1'" to load this file. \quit

-- 0.4.0 -> 0.4.1: readers (issue 20). What a client reads of the tables it reads through
-- functions of its own (a job's detail, errors and steps, the jobs a worker holds and their
-- states, the outbox listing and one message, the settled counters), so that the table layout
-- is no client API; the Python client calls them and no longer names a table.

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

-- error_codes: X_STATE_UNKNOWN (XJ016) is list_outbox's refusal of an unknown outbox state too.
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

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.1'::text
$$;

-- Nothing is left to PUBLIC (see Grants in x_jobs.sql).
REVOKE ALL ON FUNCTION x_jobs.job_detail(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_errors(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_steps(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_states(bigint[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs.held_jobs(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) FROM public;
REVOKE ALL ON FUNCTION x_jobs.outbox_message(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_counters(timestamptz) FROM public;

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

------------------------------------------------------------------------------------------------
-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
------------------------------------------------------------------------------------------------

SELECT x_jobs._adopt();
