\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.5'" to load this file. \quit

-- 0.3.4 -> 0.3.5: what every function takes is unchanged; some refuse more; one is new.
--   * outbox_extend_lease(ids, relay, lease): the relay's heartbeat. A delivery slower than its
--     lease was claimed again by another relay and sent a second time while it ran.
--   * enqueue and enqueue_many refuse a run_at that is infinite or outside the years 1 to 9999
--     (UTC), and outbox_nack such a retry_at: XJ039 X_TIME_INVALID, a new code. An infinite
--     time never came due (or sorted first forever), and clients' date types cannot read the
--     rest (the x-jobs command line showed them as infinity).
--   * fail makes a retry due on the last day of the year 9999 at the latest: a backoff or a
--     retry_delay of many millennia raised "timestamp out of range", and the row stayed running
--     until its lease lapsed.
--   * step_sleep and step_wait refuse a sleep or a timeout that ends past the year 9999
--     (XJ025, as a negative one): it raised "timestamp out of range", or made the run due at a
--     time clients cannot read.
--   * Spans of many millennia were a bare "timestamp out of range" (22008); they are refused
--     with the code of their argument: a lease over 1000 years (claim, extend_lease,
--     relay_outbox: XJ012), an announce ttl (XJ019), a retention age (the purges,
--     rollup_counters: XJ020). pause_queue and resume_queue refuse a queue name over 200
--     characters, as enqueue does (XJ002).
--   * queue_demand counts a due row with a concurrency key only while its key has room, as
--     claim grants them: 50 rows of a key limited to 1 were a demand of 50, and scaled out
--     workers that could claim nothing.
--   * progress refuses NaN and infinite numbers (XJ033): jsonb wrote them as strings, and a
--     NaN total passed the done <= total test.
--   * receive_webhook refuses a source or webhook id over 200 characters (XJ037): past a
--     btree entry's size the insert failed with a bare 54000, and the sender retried for ever.
--   * publish and step_wait refuse an event key over 400 characters (XJ028): past a btree
--     entry's size the insert failed with a bare 54000.
--   * purge_events and purge_webhook_ledger pick their batch once, as an array, as purge does.


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
        ('XJ035', 'X_MESSAGE_INVALID', 'An outbox message has no payload, headers that are not an object of strings, an unknown field or one of the wrong type, or is not an object.'),
        ('XJ036', 'X_RELAY_INVALID', 'A relay id is missing or empty.'),
        ('XJ037', 'X_WEBHOOK_INVALID', 'receive_webhook got no source or no webhook id, or one longer than 200 characters.'),
        ('XJ038', 'X_CLOCK_REFUSED', 'x_jobs.fake_now (the test clock) is set in a session whose login role is not a superuser.'),
        ('XJ039', 'X_TIME_INVALID', 'A run_at (enqueue) or retry_at (outbox_nack) is infinite or outside the years 1 to 9999 (UTC).'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
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
BEGIN
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
                   WHEN r.concurrency_limit < 1
                       OR (r.concurrency_limit IS NOT NULL AND r.concurrency_key IS NULL)
                       OR r.concurrency_key = '' THEN 'concurrency'
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

-- Fail the current attempt of a running row `worker` holds. With attempts left (and retryable)
-- the row waits out its backoff: retry_delay when given, else the row's exponential policy,
-- min(backoff_max, backoff_base * 2^(attempt - 1)), with equal jitter (a random half of it
-- added to the other half) so that a crowd failing together does not retry together. With no
-- attempts left, or retryable false, it settles dead, or failed for a job that wants no dead
-- letters. Answers the state the row is in now, or NULL when the worker no longer held it
-- (nothing changed). Every failed attempt is kept in x_jobs.job_error.
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

-- Sleep: suspend the run until `duration` after it first reached the step. A replay (after a
-- crash, or the claim that ends the sleep) finds the step and keeps its first wake-up time, so a
-- crash never restarts the sleep. Answers the step: status done when the time has come (go on),
-- waiting when the run is now suspended (the caller stops the body; its row is no longer held).
CREATE OR REPLACE FUNCTION x_jobs.step_sleep(id bigint, worker text, step text, duration interval)
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

-- Retention for events: delete up to `batch_size` events published before now - older_than,
-- lowest id first (nearly oldest first, along the primary key). Answers how many; call it again
-- until it answers less than batch_size. A wait that asks for events since an instant older
-- than the retention will not see the purged ones. Run one purger at a time: it takes no row
-- locks to skip (admins may delete events, not update them).
CREATE OR REPLACE FUNCTION x_jobs.purge_events(older_than interval, batch_size integer DEFAULT 10000)
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

-- A delivery failed. With attempts left (and retryable) the message waits until retry_at, or
-- its backoff: min(1 hour, 1 second * 2^(attempt - 1)) with equal jitter; the messages after it
-- in its key wait too. Else it is dead, kept for outbox_redrive. Answers the state it is in
-- now, or NULL when `relay` did not hold it (nothing changed).
CREATE OR REPLACE FUNCTION x_jobs.outbox_nack(
    id bigint,
    relay text,
    error text,
    retry_at timestamptz DEFAULT NULL,
    retryable boolean DEFAULT TRUE
)
RETURNS x_jobs.outbox_state
LANGUAGE plpgsql
VOLATILE
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
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: message %s failed without an error message', outbox_nack.id),
            HINT = 'Pass what went wrong as error, such as the HTTP status and body.';
    END IF;
    -- As enqueue's run_at: an infinite retry_at would hold the message, and its key, for good.
    IF outbox_nack.retry_at < timestamptz '0001-01-01 00:00:00+00'
        OR outbox_nack.retry_at >= timestamptz '10000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ039',
            MESSAGE = pg_catalog.format('X_TIME_INVALID: retry_at %s is not a time to retry message %s',
                outbox_nack.retry_at, outbox_nack.id),
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
        last_error = outbox_nack.error
    WHERE o.id = outbox_nack.id
        AND o.state = 'inflight'
        AND o.relay = outbox_nack.relay
    RETURNING o.state INTO v_state;
    RETURN v_state;
END
$$;

-- Retention for the webhook ledger: delete up to `batch_size` rows received before now -
-- older_than, oldest first. Keep them longer than senders retry (days): a webhook redelivered
-- after its row is gone becomes a second job. Run one purger at a time (no row locks).
CREATE OR REPLACE FUNCTION x_jobs.purge_webhook_ledger(older_than interval, batch_size integer DEFAULT 10000)
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
--   lapsed    job_running_idx  running rows whose lease (visible_at) ran out, in lease order.
-- One `state IN (...) OR running` test over all queues cannot be served in order by any index:
-- it reads and sorts every due row, so a queue slows down exactly when it is behind. The outer
-- sort sees at most 3 x qty x queues rows. Priority orders the ready arm exactly; a row coming
-- due from a delay competes by priority among the earliest-due ones the waiting arm read.
--
-- A lapsed row on its final attempt is buried instead (dead, or failed for a job that wants no
-- dead letters), counted, and returned with that state: handing it out again would be an attempt
-- past max_attempts every lease, forever. Its claimed_by is cleared, so the stalled body cannot
-- settle a row it lost.
--
-- Concurrency keys: a row with a key is taken only while fewer than its limit of the key's rows
-- run. The scan skips keys that are full; the rows it took are then granted under an advisory
-- lock per key, taken in key order (no deadlock), counted again in a new statement, so two
-- claimers cannot both take the last slot. That needs READ COMMITTED, which a claim refuses
-- to run without. A claim walks past the waiting rows of full keys ahead of it: keep a key that
-- backs up by thousands in a queue of its own.
--
-- Slots spent on rows it could not hand out (buried, or denied by a key) are claimed again in
-- up to two more passes. Rows a scan locked and the outer LIMIT dropped stay locked until the
-- transaction ends; called on its own, a claim is its own transaction and that is at once.
CREATE OR REPLACE FUNCTION x_jobs.claim(
    queues text[],
    worker text,
    lease interval DEFAULT '30 seconds',
    qty integer DEFAULT 1
)
RETURNS SETOF x_jobs.job
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Every call would otherwise be planned afresh: the generic plans are costed above the custom
-- ones (LIMIT of a parameter), so the plan cache keeps re-planning, which cost 2 ms a call here
-- (measured 2026-11-29: 3.0 ms against 1.0 ms for qty 10). The generic plans are the same seeks.
SET plan_cache_mode = force_generic_plan
-- A generic plan costs the LIMIT as if every due row were read, which is above the JIT
-- thresholds on a big table: each call then compiled its plan with LLVM (70-880 ms against 1 ms,
-- 1.1M rows). The seeks read a few rows; compiling never pays.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
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
    IF claim.lease IS NULL OR claim.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(claim.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;
    -- A lease of many millennia ended past what timestamptz holds: "timestamp out of range".
    IF claim.lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years', claim.lease),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;
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
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'ready'
                    AND j.run_at <= v_now
                    AND j.id <> ALL (v_seen)
                    AND (j.concurrency_key IS NULL OR j.concurrency_limit > (
                        SELECT count(*) FROM x_jobs.job AS h
                        WHERE h.concurrency_key = j.concurrency_key AND h.state = 'running'))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT v_want
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
                    AND j.state IN ('delayed', 'suspended')
                    AND j.run_at <= v_now
                    AND j.id <> ALL (v_seen)
                    AND (j.concurrency_key IS NULL OR j.concurrency_limit > (
                        SELECT count(*) FROM x_jobs.job AS h
                        WHERE h.concurrency_key = j.concurrency_key AND h.state = 'running'))
                ORDER BY j.run_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
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
                ORDER BY j.visible_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            ORDER BY 2, 3, 1
            LIMIT v_want
        ) AS c;

        EXIT WHEN v_picked = 0;

        IF pg_catalog.cardinality(v_keyed) > 0 THEN
            -- Serialize the claimers of each key, then count its running rows afresh: this
            -- statement's snapshot is taken after the locks, so it sees every claim that held
            -- them before. The rows not granted stay locked, unclaimed, until this call ends.
            -- The first pass waits for its keys, in key order. A later pass still holds the keys
            -- of the earlier ones, so waiting then, for a key below one of those, could close a
            -- cycle with a claimer that holds it and waits for ours (two claims deadlocked so):
            -- it only tries, and leaves the rows of a key it cannot have now to other claims.
            IF v_pass = 1 THEN
                PERFORM pg_catalog.pg_advisory_xact_lock(2024061701, pg_catalog.hashtext(k.key))
                FROM unnest(v_keys) AS k (key)
                ORDER BY k.key;
            ELSE
                v_busy_keys := ARRAY(
                    SELECT k.key
                    FROM unnest(v_keys) AS k (key)
                    WHERE NOT pg_catalog.pg_try_advisory_xact_lock(2024061701, pg_catalog.hashtext(k.key))
                );
            END IF;

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
                    last_error = 'lease lapsed on the final attempt',
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
            AND pg_catalog.cardinality(v_keyed) = coalesce(v_granted, 0);
    END LOOP;

    RETURN QUERY SELECT * FROM unnest(v_buried_all);
END
$$;

-- The heartbeat: push the lease of the running rows `worker` holds among `ids` to now + lease.
-- Answers the ids still held; an id missing from the answer was lost (lapsed and re-claimed,
-- cancelled, or settled), and its body should stop.
CREATE OR REPLACE FUNCTION x_jobs.extend_lease(ids bigint[], worker text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for a batch of any size, as complete_many is (see there).
SET plan_cache_mode = force_generic_plan
-- Index plans only: they lock the rows in id order, as complete_many does (see there).
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    PERFORM x_jobs._require_worker(extend_lease.worker, 'Pass the id the worker claimed with.');
    IF extend_lease.lease IS NULL OR extend_lease.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(extend_lease.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;
    -- A lease of many millennia ended past what timestamptz holds: "timestamp out of range".
    IF extend_lease.lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years', extend_lease.lease),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;

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

-- Hand `relay` up to `qty` messages to deliver, for `lease`: the oldest due pending messages
-- that head their key (nothing earlier of the key is pending, and nothing of the key is in
-- flight: a redriven or late-committed message with a lower id waits for the one out), and the
-- messages whose lease lapsed (a relay that died; dead instead on their final attempt). Locked
-- rows are skipped, so relays never wait for each other. `topics` restricts the claim to the
-- topics this relay has sinks for (NULL: all).
--
-- The keys of the picked messages are then locked and checked again under a fresh snapshot:
-- two relays claiming at once cannot both take a message of one key, whatever order the
-- producers committed in. A message of a key whose check fails stays locked, unclaimed, until
-- the call ends.
--
-- Each arm walks its partial index in order and reads about `qty` entries plus the messages of
-- keys that are busy: delivered messages are in neither index. Answers the messages in the
-- order to deliver them, with the attempt this delivery is.
CREATE OR REPLACE FUNCTION x_jobs.relay_outbox(
    relay text,
    qty integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL
)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, headers jsonb, attempt integer)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Before the outbox has statistics (a new table, a burst after a quiet spell) the planner chose
-- a bitmap scan of every pending message and a sort: 80 ms a call at 10,000 pending against
-- 3 ms for the ordered index walk (measured 2026-11-29). The walk is right at any size.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_picked bigint[];
    v_keys text[];
    v_lapsed boolean;
BEGIN
    IF relay_outbox.relay IS NULL OR relay_outbox.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(relay_outbox.relay), 'NULL')),
            HINT = 'Pass an id unique to the relay process, such as host:pid:random.';
    END IF;
    IF relay_outbox.lease IS NULL OR relay_outbox.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(relay_outbox.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than a delivery takes, such as ''30 seconds''.';
    END IF;
    -- A lease of many millennia ended past what timestamptz holds: "timestamp out of range".
    IF relay_outbox.lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years', relay_outbox.lease),
            HINT = 'Pass a lease longer than a delivery takes, such as ''30 seconds''.';
    END IF;
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

    SELECT coalesce(pg_catalog.array_agg(p.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT p.key) FILTER (WHERE p.key IS NOT NULL), '{}'),
           coalesce(pg_catalog.bool_or(p.lapsed), FALSE)
    INTO v_picked, v_keys, v_lapsed
    FROM (
        WITH due AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending'
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
                AND (o.key IS NULL OR NOT EXISTS (
                    SELECT FROM x_jobs.outbox AS e
                    WHERE e.key = o.key
                        AND e.state IN ('pending', 'inflight')
                        AND (e.id < o.id OR e.state = 'inflight')
                ))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
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
        SELECT d.id, d.key, d.available_at, FALSE AS lapsed FROM due AS d
        UNION ALL
        SELECT l.id, l.key, l.available_at, TRUE AS lapsed FROM lapsed AS l
        ORDER BY 3, 1
        LIMIT relay_outbox.qty
    ) AS p;

    IF pg_catalog.cardinality(v_keys) > 0 THEN
        -- A relay whose snapshot predates another relay's claim of the same key could see that
        -- key free (two producers on one key, the lower id committing last). So: lock the keys,
        -- in key order (no deadlock), and check them again in a statement whose snapshot comes
        -- after the locks, which sees every claim of these keys that held them before.
        PERFORM pg_catalog.pg_advisory_xact_lock(2024061705, pg_catalog.hashtext(k.key))
        FROM unnest(v_keys) AS k (key)
        ORDER BY k.key;

        v_picked := ARRAY(
            SELECT o.id
            FROM x_jobs.outbox AS o
            WHERE o.id = ANY (v_picked)
                AND (o.key IS NULL OR o.state = 'inflight' OR NOT EXISTS (
                    SELECT FROM x_jobs.outbox AS e
                    WHERE e.key = o.key
                        AND e.id <> o.id
                        AND e.state IN ('pending', 'inflight')
                        AND (e.id < o.id OR e.state = 'inflight')
                ))
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

-- A worker says it is alive, what it serves and which build it runs; call it at an interval
-- well under ttl. The first announce with draining true stamps draining_at, and every later one
-- keeps it: a worker that began to drain never serves again. Rows of workers gone for a day are
-- swept here, so the table holds only the recent fleet. Answers the worker's row.
CREATE OR REPLACE FUNCTION x_jobs.announce_worker(
    worker text,
    queues text[],
    build text DEFAULT NULL,
    draining boolean DEFAULT FALSE,
    ttl interval DEFAULT '60 seconds'
)
RETURNS x_jobs.worker
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_row x_jobs.worker;
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

    INSERT INTO x_jobs.worker AS w (id, queues, build, started_at, seen_at, expires_at, draining_at)
    VALUES (
        announce_worker.worker, announce_worker.queues, announce_worker.build, v_now, v_now,
        v_now + announce_worker.ttl, CASE WHEN announce_worker.draining THEN v_now END
    )
    ON CONFLICT (id) DO UPDATE
    SET queues = excluded.queues,
        build = excluded.build,
        seen_at = excluded.seen_at,
        expires_at = excluded.expires_at,
        draining_at = coalesce(w.draining_at, excluded.draining_at)
    RETURNING w.* INTO v_row;

    DELETE FROM x_jobs.worker AS w WHERE w.expires_at < v_now - interval '1 day';
    RETURN v_row;
END
$$;

-- The refusal of bad retention arguments, shared by purge_events, purge_outbox and
-- purge_webhook_ledger: `p_what` names what is purged, `p_age` is an age that suits it.
CREATE OR REPLACE FUNCTION x_jobs._require_retention(
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

-- Delete up to `batch_size` terminal jobs (done, failed, dead, cancelled) that finished more than
-- `older_than` ago, lowest id first, with their error history and steps. Answers how many it deleted: call
-- it again while that equals batch_size. Bounded, so a purge never holds locks or writes WAL in
-- one unbounded burst; SKIP LOCKED, so two purgers share the work instead of waiting.
--
-- Lowest id, not earliest finished_at: ids follow enqueue order, so this is nearly oldest first
-- and walks the primary key, where finished_at order would need an index that every settling
-- statement pays to maintain, or a sort of every finished row on each call. Every row it takes
-- is past the retention either way.
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

-- Retention for the outbox: delete up to `batch_size` messages delivered before now -
-- older_than, lowest id first. Dead messages stay until redriven or deleted by hand.
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

-- Fold old counter buckets into wider ones: minutes older than `minutes_for` into hours, hours
-- older than `hours_for` into days, and drop days older than `days_for`. Shards fold together.
-- Answers how many buckets it folded or dropped. Run it every few minutes; it touches only old buckets, so
-- it never holds a lock a settling statement waits for.
CREATE OR REPLACE FUNCTION x_jobs.rollup_counters(
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

-- Hold a queue back from every claim (and from queue_demand). Answers true when this call paused
-- it, false when it was paused already. Running jobs of the queue finish as usual.
CREATE OR REPLACE FUNCTION x_jobs.pause_queue(queue text)
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
CREATE OR REPLACE FUNCTION x_jobs.resume_queue(queue text)
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

-- Per queue, the rows a serving worker must hold: due rows of unpaused queues, plus running rows
-- not held by a live draining worker (such a worker finishes them itself, so no worker a scaler
-- adds could take them; a claimer with no live row, killed or lapsed, stays counted: its jobs
-- come back to the queue). Queues with no demand are absent. This is what KEDA polls.
--
-- A due row with a concurrency key counts only while its key has room, as claim grants them
-- (by rank within the key against the row's limit less the key's running rows): 50 rows of a
-- key limited to 1 are one worker's work, not 50, and counting them scaled out workers that
-- could claim nothing.
--
-- SECURITY DEFINER: monitoring roles (pg_monitor, an autoscaler's login) get counts without
-- being able to read job inputs. It reads only; search_path is pinned.
CREATE OR REPLACE FUNCTION x_jobs.queue_demand()
RETURNS TABLE (queue text, demand bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH due AS (
        SELECT j.queue, j.concurrency_key, j.concurrency_limit, j.priority, j.run_at, j.id
        FROM x_jobs.job AS j
        WHERE j.state = 'ready' AND j.run_at <= x_jobs.now()
            AND NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = j.queue)
        UNION ALL
        SELECT j.queue, j.concurrency_key, j.concurrency_limit, j.priority, j.run_at, j.id
        FROM x_jobs.job AS j
        WHERE j.state IN ('delayed', 'suspended') AND j.run_at <= x_jobs.now()
            AND NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = j.queue)
    ),
    busy AS (
        SELECT j.concurrency_key, count(*) AS running
        FROM x_jobs.job AS j
        WHERE j.concurrency_key IS NOT NULL AND j.state = 'running'
        GROUP BY j.concurrency_key
    )
    SELECT d.queue, count(*) AS demand
    FROM (
        SELECT u.queue FROM due AS u
        WHERE u.concurrency_key IS NULL
        UNION ALL
        SELECT k.queue
        FROM (
            SELECT u.queue, u.concurrency_limit - coalesce(b.running, 0) AS room,
                   pg_catalog.row_number() OVER (
                       PARTITION BY u.concurrency_key ORDER BY u.priority, u.run_at, u.id
                   ) AS rank
            FROM due AS u
            LEFT JOIN busy AS b ON b.concurrency_key = u.concurrency_key
            WHERE u.concurrency_key IS NOT NULL
        ) AS k
        WHERE k.rank <= k.room
        UNION ALL
        SELECT j.queue FROM x_jobs.job AS j
        WHERE j.state = 'running'
            AND NOT EXISTS (
                SELECT FROM x_jobs.worker AS w
                WHERE w.id = j.claimed_by
                    AND w.draining_at IS NOT NULL
                    AND w.expires_at > x_jobs.now()
            )
    ) AS d
    GROUP BY d.queue
    ORDER BY d.queue COLLATE "C"
$$;

-- A running job's progress, as its body reports it: done out of total (either may be NULL) and
-- a note, with the instant. Answers true, or false when the worker no longer holds the job
-- (nothing changed: its body should stop).
CREATE OR REPLACE FUNCTION x_jobs.progress(
    id bigint,
    worker text,
    done double precision DEFAULT NULL,
    total double precision DEFAULT NULL,
    note text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM x_jobs._require_worker(progress.worker, 'Pass the id the worker claimed with.');
    -- NaN and the infinities are no JSON numbers (jsonb writes them as strings), and NaN sorts
    -- above every number, so that a NaN total passed the `done > total` test.
    IF progress.done < 0 OR progress.total < 0 OR progress.done > progress.total
        OR progress.done IN ('NaN', 'Infinity') OR progress.total IN ('NaN', 'Infinity')
        OR pg_catalog.length(progress.note) > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ033',
            MESSAGE = pg_catalog.format('X_PROGRESS_INVALID: progress %s of %s is negative, not finite or past the total',
                coalesce(progress.done::text, 'NULL'), coalesce(progress.total::text, 'NULL')),
            DETAIL = 'A note may hold up to 1000 characters.',
            HINT = 'Report done and total as finite numbers of zero or more, with done <= total.';
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
CREATE OR REPLACE FUNCTION x_jobs.receive_webhook(
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
CREATE OR REPLACE FUNCTION x_jobs.publish(event text, payload jsonb DEFAULT NULL, key text DEFAULT NULL)
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
    IF pg_catalog.pg_column_size(publish.payload) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes exceeds the limit of %s',
                pg_catalog.pg_column_size(publish.payload), x_jobs._max_payload_bytes()),
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
    SELECT '0.3.5'::text
$$;

-- The relay's heartbeat: push the lease of the inflight messages `relay` holds among `ids` to
-- now + lease. Answers the ids still held; a missing one was lost (its lease lapsed and another
-- relay took it, or it was settled), and its delivery's ack will find it gone. Without it a
-- delivery slower than the lease was claimed again and sent a second time while it ran.
CREATE FUNCTION x_jobs.outbox_extend_lease(ids bigint[], relay text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
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
    IF outbox_extend_lease.lease IS NULL OR outbox_extend_lease.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(outbox_extend_lease.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;
    IF outbox_extend_lease.lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years',
                outbox_extend_lease.lease),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;
    RETURN QUERY
    UPDATE x_jobs.outbox AS o
    SET available_at = x_jobs.now() + outbox_extend_lease.lease
    WHERE o.id = ANY (outbox_extend_lease.ids)
        AND o.state = 'inflight'
        AND o.relay = outbox_extend_lease.relay
    RETURNING o.id;
END
$$;

-- New functions are executable by PUBLIC until revoked (the fresh script revokes all at once).
REVOKE ALL ON FUNCTION x_jobs.outbox_extend_lease(bigint[], text, interval) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_extend_lease(bigint[], text, interval) TO x_jobs_worker;
