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

    PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', q.queue))
        FROM unnest(v_queues) AS q (queue);
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
                   -- As at enqueue: a declared key needs its limit, and no concurrency key beside it.
                   WHEN t.rate_limit_key = '' OR pg_catalog.length(t.rate_limit_key) > 400 THEN 'rate_limit_key'
                   WHEN t.rate_limit_key IS NOT NULL AND t.concurrency_key IS NOT NULL THEN 'rate_limit_conflict'
                   WHEN t.rate_limit_key IS NOT NULL AND NOT EXISTS (
                       SELECT FROM x_jobs.rate_limit AS l WHERE l.key = t.rate_limit_key
                   ) THEN 'rate_limit_unknown'
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
            WHEN 'rate_limit_key' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ063',
                    MESSAGE = pg_catalog.format(
                        'X_RATE_LIMIT_INVALID: rate limit key %L is empty or longer than 400 characters',
                        pg_catalog.left(v_bad.rate_limit_key, 64)),
                    DETAIL = pg_catalog.format('In declaration %s.', v_bad_ord),
                    HINT = 'Name a rate limit declared with x_jobs.set_rate_limit, or leave rate_limit_key out.';
            WHEN 'rate_limit_conflict' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ065',
                    MESSAGE = pg_catalog.format(
                        'X_RATE_LIMIT_CONFLICT: rate limit key %L and concurrency key %L on one job',
                        v_bad.rate_limit_key, v_bad.concurrency_key),
                    DETAIL = pg_catalog.format('In declaration %s.', v_bad_ord),
                    HINT = 'Declare a rate_limit_key or a concurrency_key for a job, not both.';
            WHEN 'rate_limit_unknown' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'XJ064',
                    MESSAGE = pg_catalog.format('X_RATE_LIMIT_UNKNOWN: no rate limit has key %L',
                        v_bad.rate_limit_key),
                    DETAIL = pg_catalog.format('In declaration %s.', v_bad_ord),
                    HINT = 'Declare the limit first with x_jobs.set_rate_limit(key, max_starts, per).';
        END CASE;
    END IF;

    RETURN QUERY
    WITH declared AS (
        INSERT INTO x_jobs.job_type AS t (
            name, queue, max_attempts, priority, dead_letter, backoff_base, backoff_max, keep_done,
            concurrency_key, concurrency_limit, timeout, declared_at, declared_by, build,
            rate_limit_key
        )
        SELECT d.name, d.queue, d.max_attempts, d.priority, d.dead_letter, d.backoff_base,
               d.backoff_max, d.keep_done, d.concurrency_key, d.concurrency_limit, d.timeout,
               d.declared_at, d.declared_by, d.build, d.rate_limit_key
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
            build = excluded.build,
            rate_limit_key = excluded.rate_limit_key
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
-- concurrency_limit, rate_limit_key, as enqueue's parameters of those names), and how it runs (timeout: a run
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
    build text DEFAULT NULL,
    rate_limit_key text DEFAULT NULL
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
        declare_job.timeout, x_jobs.now(), x_jobs._declarer(declare_job.declared_by), declare_job.build,
        declare_job.rate_limit_key
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
        'concurrency_limit', 'concurrency_key', 'keep_done', 'priority', 'rate_limit_key'
    ];
    v_text_fields text[] := ARRAY['name', 'queue', 'concurrency_key', 'rate_limit_key'];
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
            OR pg_catalog.jsonb_typeof(e.value -> 'rate_limit_key') NOT IN ('string', 'null')
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
                v_now, v_by, declare_jobs.build, r.rate_limit_key
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
-- parked, and up to 10 of the live workers that serve it, by id. As complete_many: `worker`
-- must be the caller's (x_jobs._fence), and with `attempts` (one per id) a row only at its
-- attempt; the others are not handed back.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.hand_back(
    ids bigint[],
    worker text,
    delay interval DEFAULT '1 second',
    attempts integer[] DEFAULT NULL
)
RETURNS TABLE (id bigint, name text, parked boolean, served_by text[])
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_attempts jsonb;
BEGIN
    PERFORM x_jobs._require_worker(hand_back.worker, 'Pass the id the worker claimed with.');
    IF hand_back.delay IS NULL OR hand_back.delay < interval '0' OR hand_back.delay > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ018',
            MESSAGE = pg_catalog.format('X_DELAY_INVALID: hand-back delay %s is not a delay',
                coalesce(hand_back.delay::text, 'NULL')),
            HINT = 'Pass a delay from zero to 1000 years, such as ''1 second'' (the default).';
    END IF;
    PERFORM x_jobs._require_attempts(hand_back.ids, hand_back.attempts);
    v_attempts := x_jobs._attempt_map(hand_back.ids, hand_back.attempts);
    IF NOT x_jobs._fence(hand_back.worker) THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.name, j.queue
        FROM x_jobs.job AS j
        WHERE j.id = ANY (hand_back.ids)
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = hand_back.worker
            AND (v_attempts IS NULL OR coalesce((v_attempts ->> j.id::text)::integer, j.attempt) = j.attempt)
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

-- Tests: tests/pgtap/12-declarations.sql, tests/python/test_declarations.py,
--        tests/python/test_plan.py, tests/python/test_worker_start_race.py
