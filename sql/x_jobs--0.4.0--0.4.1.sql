\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.1'" to load this file. \quit

-- 0.4.0 -> 0.4.1: the SQL source laid out by concern (sql/src/, built by scripts/build-sql), its
-- comments keeping the invariant and the reason (their history moved to CHANGELOG.md); readers,
-- so that what a client reads of the tables it reads through functions of its own (a job's
-- detail, errors and steps, the jobs a worker holds and their states, the outbox listing and one
-- message, the settled counters) and the table layout is no client API.

-- The comments inside these bodies keep the reason, and no longer its history.
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
    -- insertion, an extra WAL record and lock per row (a third of a keyless batch's
    -- throughput), and matching inserted rows back to requests cost another third.
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
-- last visit ended, and takes the first due rows of those with room, rather than walk every
-- row of a full key ahead of the rows behind it. So a claim reads about the window when keyed
-- rows are at hand, and a few seeks per key of a window's worth of keys at worst.
-- The rows found are then granted under an advisory lock per key, counted again in a new
-- statement, so two claimers cannot both take the last slot. That needs READ COMMITTED, which
-- a claim refuses to run without.
--
-- Slots spent on rows it could not hand out (buried, or denied by a key) are claimed again in
-- up to two more passes. Rows a scan locked and the outer LIMIT dropped stay locked until the
-- transaction ends; called on its own, a claim is its own transaction and that is at once. Over
-- several queues the first pass reads first how many ready rows to lock in each (see there).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.claim(
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
-- ones (LIMIT of a parameter), so the plan cache keeps re-planning, which costs twice the
-- claim itself. The generic plans are the same seeks.
SET plan_cache_mode = force_generic_plan
-- A generic plan costs the LIMIT as if every due row were read, which is above the JIT
-- thresholds on a big table: each call then compiles its plan with LLVM, tens to hundreds of
-- times the cost of the claim. The seeks read a few rows; compiling never pays.
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
    -- postmaster's start: a crash recovery longer than the lease would use the grace up before
    -- any holder could connect, and a crash of one backend (the postmaster resets every
    -- process and recovers, without starting again) would give no grace at all. The lapsed arm asks
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
            -- that a claim costs the same beside 100 keys or 100,000, and never walks the keys
            -- of other queues.
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
            -- claim never waits for another claimer. Waiting, in key order, would stall every
            -- claimer of a key behind a claim made in a long transaction, and deadlock two
            -- claims whose keys' hashes collided (the lock is taken on the hash, and text order
            -- is not hash order).
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
-- Complete the running rows `worker` holds among `ids`, with outputs[i] as the output of ids[i]
-- (outputs may be NULL: no output). Answers the ids it completed; an id missing from the answer
-- was not held by this worker (lapsed and re-claimed, cancelled, settled) and is left as it is.
-- The same transaction adds to the job name's counter bucket. A job enqueued with keep_done =>
-- false is deleted instead of kept as 'done', with its steps and error history: for jobs whose
-- result nobody reads, so that the table does not fill with rows only purge would delete.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.complete_many(ids bigint[], worker text, outputs jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned once, for a batch of any size: a seek per id. A custom plan knows the batch's size,
-- and with statistics that saw few running rows (a backlog analyzed before its workers
-- started) it reads the whole table rather than seek a batch that is a tenth of it or so, and
-- settling would cost as much as the table is big.
SET plan_cache_mode = force_generic_plan
-- Rows are locked in id order, as extend_lease and release lock them: in another order a
-- worker's settlement and its heartbeat (two connections, often the same rows) could each hold
-- a row the other waits for ("deadlock detected"). The
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
    -- id order itself, and the update needs no join to an output per id (together a sixth of
    -- a kept row's settle).
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
    -- second lookup, a third of its settle.
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
            -- the update, and a quarter of its WAL.
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
-- takes the oldest of their heads, rather than walk the whole backlog (with every key busy, a
-- call would read every pending message to answer none). So a call costs about `qty` entries
-- when heads are at hand, and a seek per busy key at worst.
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
CREATE OR REPLACE FUNCTION x_jobs.relay_outbox(
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
-- a bitmap scan of every pending message and a sort, a call at 10,000 pending some twenty-five
-- times the ordered index walk. The walk is right at any size.
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
    -- takes no place among the qty: were the heads cut to qty first, one such key at the front
    -- would leave a relay of qty 1 with nothing, call after call.
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
        -- 100,000, rather than visit them all. What it
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
        -- cannot have now to a later call, as claim does: were it to wait, one session holding
        -- a key's lock (any login may take advisory locks) would stall every relay call,
        -- keyless messages and other keys included.
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

-- Readers: the type the outbox readers answer, then the functions, each granted to its role.
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
-- One job as an operator reads it (`x-jobs jobs show`): every field of its row, its input too.
CREATE OR REPLACE FUNCTION x_jobs.job_detail(id bigint)
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
CREATE OR REPLACE FUNCTION x_jobs.job_errors(id bigint)
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
CREATE OR REPLACE FUNCTION x_jobs.job_steps(id bigint)
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
CREATE OR REPLACE FUNCTION x_jobs.job_states(ids bigint[])
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
CREATE OR REPLACE FUNCTION x_jobs.held_jobs(worker text)
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
-- The operator's listing of the outbox: messages newest first, optionally of one state, one
-- topic and one key, one page at a time, paged as list_jobs pages jobs (the last id of a page as
-- before_id gives the next). Planned for each call's values, as list_jobs is, so that the
-- undelivered states read the relays' partial indexes, bounded by the backlog: pending messages
-- those with a key and those without (each arm proves its index's predicate, which
-- `state = 'pending'` alone does not), in-flight ones outbox_inflight_idx, a key of either
-- outbox_key_idx; each sorted by id. Otherwise the primary key is read backwards from
-- before_id, the filters applied on that walk: a page of all messages reads its page, a
-- listing of a rare state or topic (dead, say) reads the history newer than its rows.
CREATE OR REPLACE FUNCTION x_jobs.list_outbox(
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
CREATE OR REPLACE FUNCTION x_jobs.outbox_message(id bigint)
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
CREATE OR REPLACE FUNCTION x_jobs.job_counters(since timestamptz DEFAULT NULL)
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
REVOKE ALL ON FUNCTION x_jobs.job_detail(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_errors(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_steps(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_states(bigint[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs.held_jobs(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) FROM public;
REVOKE ALL ON FUNCTION x_jobs.outbox_message(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_counters(timestamptz) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.job_detail(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_errors(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_steps(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_message(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_counters(timestamptz) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_states(bigint[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.held_jobs(text) TO x_jobs_worker;

-- X_STATE_UNKNOWN (XJ016) is list_outbox's refusal of an unknown outbox state too.
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
CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.1'::text
$$;

-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
SELECT x_jobs._adopt();
