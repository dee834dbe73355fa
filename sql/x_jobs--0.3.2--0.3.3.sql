\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.3'" to load this file. \quit

-- 0.3.2 -> 0.3.3: what every function takes and answers is unchanged, but for one refusal.
--   * The test clock (x_jobs.fake_now) is honoured only in a session whose login role is a
--     superuser; any other session that sets it gets XJ038 X_CLOCK_REFUSED from the first call
--     that reads the clock. Any role can set a custom setting, and a clock moved forward made
--     every other worker's lease look lapsed to the mover's claims.
--   * purge, purge_outbox and outbox_redrive keep to their batch size. They picked the batch
--     with `id IN (SELECT ... LIMIT n FOR UPDATE ...)`, which the planner may rescan per row;
--     each rescan passed over the rows the statement had already changed and locked the next
--     ones, so that one call could take every eligible row. The batch is now one array.

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

REVOKE ALL ON FUNCTION x_jobs._fake_now() FROM public;
GRANT EXECUTE ON FUNCTION x_jobs._fake_now() TO x_jobs_producer, pg_monitor;

-- The clock: now(), the transaction's start, unless a test moved it (x_jobs._fake_now). One
-- expression, and no SET search_path, so that the planner inlines it: the check costs nothing
-- while the setting is unset.
CREATE OR REPLACE FUNCTION x_jobs.now()
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
        ('XJ003', 'X_PAYLOAD_TOO_LARGE', 'An input, output, event or message payload is larger than x_jobs.max_payload_bytes.'),
        ('XJ004', 'X_MAX_ATTEMPTS_INVALID', 'max_attempts is below 1.'),
        ('XJ005', 'X_PRIORITY_INVALID', 'priority is outside -32768..32767.'),
        ('XJ006', 'X_TENANT_INVALID', 'tenant_id is empty.'),
        ('XJ007', 'X_CONCURRENCY_INVALID', 'A concurrency limit is below 1 or given without a key.'),
        ('XJ008', 'X_BACKOFF_INVALID', 'backoff_base or backoff_max is negative, or base exceeds max.'),
        ('XJ009', 'X_JOBS_INVALID', 'enqueue_many got something other than an array of request objects (receive_webhook: a request that is not an object).'),
        ('XJ010', 'X_QUEUES_INVALID', 'The queue list is missing, empty or holds an empty name.'),
        ('XJ011', 'X_WORKER_INVALID', 'A worker id is missing or empty.'),
        ('XJ012', 'X_LEASE_INVALID', 'A lease is missing or not positive.'),
        ('XJ013', 'X_QTY_INVALID', 'qty or a page size is outside 1..1000 (outbox_redrive max_rows: 1..100000).'),
        ('XJ014', 'X_JOB_NOT_FOUND', 'No job has this id.'),
        ('XJ015', 'X_JOB_NOT_RETRYABLE', 'retry was asked of a row that is live or done.'),
        ('XJ016', 'X_STATE_UNKNOWN', 'A state name is not one of the job states.'),
        ('XJ017', 'X_IDEMPOTENCY_CONFLICT', 'A live row already holds the idempotency key.'),
        ('XJ018', 'X_DELAY_INVALID', 'A retry delay is negative.'),
        ('XJ019', 'X_TTL_INVALID', 'A worker announce ttl is missing or not positive.'),
        ('XJ020', 'X_RETENTION_INVALID', 'A purge or rollup_counters got a missing or negative age, or a batch below 1.'),
        ('XJ021', 'X_OUTPUTS_INVALID', 'complete_many got a different number of outputs than ids.'),
        ('XJ022', 'X_ISOLATION_UNSUPPORTED', 'claim, publish, relay_outbox or receive_webhook ran in a REPEATABLE READ or SERIALIZABLE transaction.'),
        ('XJ023', 'X_ERROR_MISSING', 'fail or outbox_nack was called without an error message.'),
        ('XJ024', 'X_STEP_INVALID', 'A step name is missing, empty or longer than 200 characters.'),
        ('XJ025', 'X_TIMEOUT_INVALID', 'A sleep is missing or negative, or a wait timeout is negative.'),
        ('XJ026', 'X_JOB_NOT_HELD', 'A step function was called by a worker that does not hold the job.'),
        ('XJ027', 'X_STEP_CONFLICT', 'A step name is already used by a step of another kind in the run.'),
        ('XJ028', 'X_EVENT_INVALID', 'An event name is missing, empty or longer than 200 characters.'),
        ('XJ029', 'X_MATCH_INVALID', 'A wait''s match is not a JSON object.'),
        ('XJ030', 'X_JOB_HELD', 'resolve_step was asked of a job that a worker holds (running).'),
        ('XJ031', 'X_STEP_NOT_FOUND', 'The job has no step of this name.'),
        ('XJ032', 'X_STEP_NOT_WAITING', 'resolve_step was asked of a step that is not waiting.'),
        ('XJ033', 'X_PROGRESS_INVALID', 'Progress is negative, past its total, or its note is too long.'),
        ('XJ034', 'X_TOPIC_INVALID', 'An outbox topic is missing, empty or longer than 200 characters.'),
        ('XJ035', 'X_MESSAGE_INVALID', 'An outbox message has no payload, headers that are not an object of strings, or is not an object.'),
        ('XJ036', 'X_RELAY_INVALID', 'A relay id is missing or empty.'),
        ('XJ037', 'X_WEBHOOK_INVALID', 'receive_webhook got no source or no webhook id.'),
        ('XJ038', 'X_CLOCK_REFUSED', 'x_jobs.fake_now (the test clock) is set in a session whose login role is not a superuser.'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
$$;

-- The three batch takers: each picks its batch once, as an array (see the header).
CREATE OR REPLACE FUNCTION x_jobs.outbox_redrive(
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

CREATE OR REPLACE FUNCTION x_jobs.purge_outbox(older_than interval, batch_size integer DEFAULT 10000)
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

CREATE OR REPLACE FUNCTION x_jobs.purge(older_than interval, batch_size integer DEFAULT 10000)
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
    IF purge.older_than IS NULL OR purge.older_than < interval '0'
        OR purge.batch_size IS NULL OR purge.batch_size < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: purge older than %s in batches of %s',
                coalesce(purge.older_than::text, 'NULL'), coalesce(purge.batch_size::text, 'NULL')),
            HINT = 'Pass an age of zero or more, such as ''7 days'', and a batch size of 1 or more.';
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

-- The version of the SQL API installed here. Clients check it before they speak to the database
-- (the Python worker refuses one it cannot speak to); it answers the same whether the schema came
-- from CREATE EXTENSION or from `x-jobs install` on a server that allows no extension files.
-- Each version's script (and upgrade script) replaces this function with its own number.
CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.3.3'::text
$$;
