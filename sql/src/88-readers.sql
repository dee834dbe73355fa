------------------------------------------------------------------------------------------------
-- Functions: readers
------------------------------------------------------------------------------------------------

-- What a client reads of the tables, each through a function of its own: the table layout is
-- not an API, these results are. Each answers named columns (states as text), reads by id or
-- through an index whose predicate it repeats, and runs as its caller: the roles granted them
-- hold SELECT on what they read (see Grants). An id that names nothing answers no row, as
-- x_jobs.result does.

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
    last_error text,
    -- Last, where the update that added it (ALTER TYPE ADD ATTRIBUTE) put it.
    tenant_id text
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
                   o.state::text, o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error,
                   o.tenant_id
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NULL
                AND list_outbox.key IS NULL
                AND (list_outbox.topic IS NULL OR o.topic = list_outbox.topic)
                AND (list_outbox.before_id IS NULL OR o.id < list_outbox.before_id)
            UNION ALL
            SELECT o.id, o.created_at, o.max_attempts, o.topic, o.key, o.headers, o.payload,
                   o.state::text, o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error,
                   o.tenant_id
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
           o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error,
           o.tenant_id
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
           o.attempt, o.available_at, o.relay, o.delivered_at, o.last_error,
           o.tenant_id
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
    WHERE (job_counters.since IS NULL OR c.bucket_start >= job_counters.since)
        -- Counters are per job name, summed over every tenant: a scoped caller gets none.
        AND (SELECT x_jobs._tenant_scope()) IS NULL
    GROUP BY c.job
    ORDER BY c.job COLLATE "C"
$$;

-- Tests: tests/pgtap/43-readers.sql, tests/pgtap/00-schema.sql, tests/pgtap/80-privileges.sql,
--        tests/python/test_outbox_sql.py (the outbox listing's plan),
--        tests/python/test_no_table_access.py (the client reads through these only)
