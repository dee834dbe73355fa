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
        coalesce((p_request).keep_done, (p_type).keep_done),
        coalesce((p_request).rate_limit_key, (p_type).rate_limit_key)
    )::x_jobs.enqueue_request
$$;

-- The jobs of `p_requests` that name a rate limit key, parked for its budget: one x_jobs.job_rate
-- row each, with the state and run_at the claim restores (_enqueue inserted them 'delayed' at
-- x_jobs._rate_parked_at()). Request i was inserted as p_ids[i], if it was (a deduped one was
-- not: no row has its id). A call without such a request costs one pass over the requests.
CREATE FUNCTION x_jobs._park_rated(p_requests x_jobs.enqueue_request[], p_ids bigint[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM unnest(p_requests) AS r WHERE r.rate_limit_key IS NOT NULL) THEN
        RETURN;
    END IF;
    INSERT INTO x_jobs.job_rate (job_id, rate_limit_key, queue, priority, run_at, parked_state)
    SELECT j.id, r.rate_limit_key, j.queue, j.priority, coalesce(r.run_at, p_now),
           CASE WHEN r.run_at > p_now THEN 'delayed' ELSE 'ready' END::x_jobs.job_state
    FROM unnest(p_requests) WITH ORDINALITY AS r
    JOIN x_jobs.job AS j ON j.id = p_ids[r.ordinality]
    WHERE r.rate_limit_key IS NOT NULL
    ON CONFLICT ON CONSTRAINT job_rate_pkey DO NOTHING;
END
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
    v_scope text[] := x_jobs._tenant_scope();
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
                       r.keep_done, r.rate_limit_key
                   )::x_jobs.enqueue_request, t)
            FROM unnest(p_requests) WITH ORDINALITY AS r
            LEFT JOIN x_jobs.job_type AS t ON t.name = r.name
            ORDER BY r.ordinality
        );
    END IF;

    -- A scoped caller's rows are stamped with its tenant (x_jobs._stamp_tenant: the one it
    -- names, checked, or the only one in scope). Unscoped calls keep the requests as they are
    -- and pay one probe of the bindings a call.
    IF v_scope IS NOT NULL THEN
        p_requests := ARRAY(
            SELECT ROW(
                       r.name, r.input, r.queue, r.run_at, r.idempotency_key, r.max_attempts,
                       r.priority, x_jobs._stamp_tenant(r.tenant_id, v_scope), r.concurrency_key,
                       r.concurrency_limit, r.traceparent, r.enqueued_by, r.dead_letter,
                       r.backoff_base, r.backoff_max, r.keep_done, r.rate_limit_key
                   )::x_jobs.enqueue_request
            FROM unnest(p_requests) WITH ORDINALITY AS r
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
                   WHEN r.rate_limit_key = '' OR pg_catalog.length(r.rate_limit_key) > 400 THEN 'rate_limit_key'
                   -- One job, one gate: a claim grants a row under its concurrency key or its
                   -- rate limit, and the two paths do not meet (see x_jobs.claim).
                   WHEN r.rate_limit_key IS NOT NULL AND r.concurrency_key IS NOT NULL THEN 'rate_limit_conflict'
                   -- A key without a declared limit is refused rather than run unlimited: a typo
                   -- ('stripe_api') would otherwise lift the limit silently.
                   WHEN r.rate_limit_key IS NOT NULL AND NOT EXISTS (
                       SELECT FROM x_jobs.rate_limit AS l WHERE l.key = r.rate_limit_key
                   ) THEN 'rate_limit_unknown'
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
            WHEN 'rate_limit_key' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ063',
                    MESSAGE = pg_catalog.format(
                        'X_RATE_LIMIT_INVALID: rate limit key %L is empty or longer than 400 characters',
                        pg_catalog.left(v_bad.rate_limit_key, 64)),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Name a rate limit declared with x_jobs.set_rate_limit, or leave rate_limit_key out.';
            WHEN 'rate_limit_conflict' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ065',
                    MESSAGE = pg_catalog.format(
                        'X_RATE_LIMIT_CONFLICT: rate limit key %L and concurrency key %L on one job',
                        v_bad.rate_limit_key, v_bad.concurrency_key),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Give a job a rate_limit_key or a concurrency_key, not both.';
            WHEN 'rate_limit_unknown' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ064',
                    MESSAGE = pg_catalog.format('X_RATE_LIMIT_UNKNOWN: no rate limit has key %L',
                        v_bad.rate_limit_key),
                    DETAIL = pg_catalog.format('In request %s (job %L).', v_bad_ord, v_bad.name),
                    HINT = 'Declare the limit first with x_jobs.set_rate_limit(key, max_starts, per), '
                        'or leave rate_limit_key out.';
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
    -- insertion, an extra WAL record and lock per row (a third of a keyless batch's
    -- throughput), and matching inserted rows back to requests cost another third.
    INSERT INTO x_jobs.job (
        id, run_at, created_at, updated_at, run_id, backoff_base, backoff_max, state,
        max_attempts, concurrency_limit, priority, dead_letter, name, queue, tenant_id,
        concurrency_key, traceparent, enqueued_by, input, keep_done
    )
    OVERRIDING SYSTEM VALUE
    SELECT v_ids[r.ordinality],
           CASE WHEN r.rate_limit_key IS NULL THEN coalesce(r.run_at, v_now) ELSE x_jobs._rate_parked_at() END,
           v_now, v_now, v_run_ids[r.ordinality],
           coalesce(r.backoff_base, interval '1 second'),
           coalesce(r.backoff_max, interval '1 hour'),
           CASE WHEN r.run_at > v_now OR r.rate_limit_key IS NOT NULL THEN 'delayed' ELSE 'ready' END::x_jobs.job_state,
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
        PERFORM x_jobs._park_rated(p_requests, v_ids, v_now);
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
                   CASE WHEN s.rate_limit_key IS NULL THEN coalesce(s.run_at, v_now)
                       ELSE x_jobs._rate_parked_at() END AS run_at,
                   coalesce(s.backoff_base, interval '1 second') AS backoff_base,
                   coalesce(s.backoff_max, interval '1 hour') AS backoff_max,
                   CASE WHEN s.run_at > v_now OR s.rate_limit_key IS NOT NULL THEN 'delayed' ELSE 'ready' END::x_jobs.job_state
                       AS state,
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
                -- The first request of each key of each tenant (keys are unique per tenant).
                JOIN (
                    SELECT coalesce(k.tenant_id, 'none') AS tenant_id, k.idempotency_key,
                           min(k.ordinality) AS first_ord
                    FROM unnest(p_requests) WITH ORDINALITY AS k
                    WHERE k.idempotency_key IS NOT NULL
                    GROUP BY coalesce(k.tenant_id, 'none'), k.idempotency_key
                ) AS f ON f.idempotency_key = r.idempotency_key
                    AND f.tenant_id = coalesce(r.tenant_id, 'none')
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
            ORDER BY r.tenant_id, r.idempotency_key
            ON CONFLICT (tenant_id, idempotency_key)
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
            WHERE j.tenant_id = coalesce(o.tenant_id, 'none')
                AND j.idempotency_key = o.idempotency_key
                AND j.state IN ('ready', 'delayed', 'suspended', 'running')
        ) AS live ON TRUE
        WHERE o.ordinality IN (SELECT t.ord FROM unnest(v_todo) AS t (ord));

        EXIT WHEN pg_catalog.cardinality(v_todo) = 0;
    END LOOP;

    PERFORM x_jobs._park_rated(p_requests, v_ids, v_now);
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
-- rate_limit_key: each start (claim) of the row spends a start of that key's rate limit, which
-- must have been declared (x_jobs.set_rate_limit; else XJ064); not with a concurrency_key.
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
    keep_done boolean DEFAULT NULL,
    rate_limit_key text DEFAULT NULL
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
        enqueue.backoff_base, enqueue.backoff_max, enqueue.keep_done, enqueue.rate_limit_key
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
        'name', 'queue', 'idempotency_key', 'tenant_id', 'concurrency_key', 'traceparent', 'enqueued_by',
        'rate_limit_key'
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
            OR pg_catalog.jsonb_typeof(e.value -> 'rate_limit_key') NOT IN ('string', 'null')
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
    SELECT j.state::text, j.output, j.last_error
    FROM x_jobs.job AS j
    WHERE j.id = result.id
        -- A scoped caller reads its tenants' results only: another's id answers no row, as a
        -- missing id does.
        AND (x_jobs._tenant_scope() IS NULL OR j.tenant_id = ANY (x_jobs._tenant_scope()))
$$;

-- Tests: tests/pgtap/10-enqueue.sql, tests/pgtap/11-enqueue-many.sql,
--        tests/pgtap/12-declarations.sql, tests/python/test_enqueue_race.py,
--        tests/python/test_enqueue_options.py, tests/python/test_app_inputs.py,
--        tests/python/test_notify.py, tests/python/test_producer_role.py
