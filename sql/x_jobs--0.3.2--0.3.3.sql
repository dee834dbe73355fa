\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.3'" to load this file. \quit

-- 0.3.2 -> 0.3.3: what every function takes and answers is unchanged, but for two refusals.
--   * The test clock (x_jobs.fake_now) is honoured only in a session whose login role is a
--     superuser; any other session that sets it gets XJ038 X_CLOCK_REFUSED from the first call
--     that reads the clock (now() or _clock()). Any role can set a custom setting, and a clock
--     moved forward made every other worker's lease look lapsed to the mover's claims.
--   * step_wait refuses REPEATABLE READ and SERIALIZABLE (XJ022), as publish does: its event
--     lookup must see every publish that committed before its lock, and a snapshot taken at
--     the transaction's start missed one that came while the lock was awaited (the run slept
--     past its event).
--   * fail computes the backoff in seconds: base times 2^40 overflowed an interval once the
--     base was above 8.4 s ("interval out of range"), and such a job could not fail at all.
--   * purge, purge_outbox and outbox_redrive keep to their batch size. They picked the batch
--     with `id IN (SELECT ... LIMIT n FOR UPDATE ...)`, which the planner may rescan per row;
--     each rescan passed over the rows the statement had already changed and locked the next
--     ones, so that one call could take every eligible row. The batch is now one array.

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

CREATE OR REPLACE FUNCTION x_jobs._clock()
RETURNS timestamptz
LANGUAGE sql
VOLATILE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.clock_timestamp()
        ELSE x_jobs._fake_now()
    END
$$;

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
        ('XJ022', 'X_ISOLATION_UNSUPPORTED', 'claim, publish, step_wait, relay_outbox or receive_webhook ran in a REPEATABLE READ or SERIALIZABLE transaction.'),
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

CREATE OR REPLACE FUNCTION x_jobs.fail(
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
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_state x_jobs.job_state;
    v_queue text;
BEGIN
    PERFORM x_jobs._require_worker(fail.worker, 'Pass the id the worker claimed with.');
    IF fail.error IS NULL OR fail.error = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ023',
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: job %s failed without an error message', fail.id),
            HINT = 'Pass what went wrong as error, such as the exception''s message.';
    END IF;
    IF fail.retry_delay < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ018',
            MESSAGE = pg_catalog.format('X_DELAY_INVALID: retry delay %s is negative', fail.retry_delay),
            HINT = 'Pass a delay of zero or more, or NULL for the job''s backoff policy.';
    END IF;

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
            last_error = fail.error,
            last_error_stack = fail.error_stack,
            updated_at = v_now
        FROM (
            -- In seconds: an interval times 2^40 overflows ("interval out of range") once the base
            -- is above 8.4 s, and a job that could not fail would run until its lease lapsed.
            SELECT coalesce(
                fail.retry_delay,
                pg_catalog.make_interval(secs => least(
                    extract(EPOCH FROM k.backoff_max)::float8,
                    extract(EPOCH FROM k.backoff_base)::float8 * pg_catalog.power(2, least(k.attempt - 1, 60))
                ) * (0.5 + pg_catalog.random() / 2))
            ) AS delay
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
        SELECT f.id, f.attempt, v_now, fail.worker, fail.error, fail.error_stack
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

CREATE OR REPLACE FUNCTION x_jobs.step_wait(
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
    IF step_wait.timeout < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s is negative', step_wait.timeout),
            HINT = 'Pass a timeout of zero or more, or NULL to wait for as long as it takes.';
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

-- The three batch takers: each picks its batch once, as an array.
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

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.3.3'::text
$$;
