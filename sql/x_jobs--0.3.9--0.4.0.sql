\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.0'" to load this file. \quit

-- 0.3.9 -> 0.4.0: what real deployments need (issue 19): poolers, installs without a superuser,
-- failover, metrics, bulk operations and declarations in the database.
--
-- Metrics: x_jobs.queue_gauges(max_age), the live rows per queue and state for the workers'
-- gauges, counted at most once per max_age however many workers ask, from a one-row snapshot
-- table x_jobs.queue_snapshot; granted to x_jobs_worker and pg_monitor. Its refusal XJ051
-- X_MAX_AGE_INVALID joins error_codes().

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.0'::text
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
        ('XJ051', 'X_MAX_AGE_INVALID', 'A queue_gauges max_age is missing, negative, or longer than a day.'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
$$;

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
