------------------------------------------------------------------------------------------------
-- Types
------------------------------------------------------------------------------------------------

CREATE TYPE x_jobs.job_state AS ENUM (
    'ready',      -- due now: claimable
    'delayed',    -- due at run_at: a future enqueue or a retry waiting out its backoff
    'suspended',  -- waiting on a step (an event or a sleep); due at run_at if that is set
    'running',    -- held by claimed_by until visible_at (the lease)
    'done',
    'failed',     -- out of attempts, for a job that wants no dead letters
    'dead',       -- out of attempts, kept as a dead letter for inspection and retry
    'cancelled'   -- stopped by an operator; never handed to a worker again
);

-- One request of enqueue_many, and what enqueue builds from its arguments: the field names are
-- the JSON keys enqueue_many accepts. NULL means "not given": the default applies.
CREATE TYPE x_jobs.enqueue_request AS (
    name text,
    input jsonb,
    queue text,
    run_at timestamptz,
    idempotency_key text,
    max_attempts integer,
    priority integer,
    tenant_id text,
    concurrency_key text,
    concurrency_limit integer,
    traceparent text,
    enqueued_by text,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean,
    -- Last, where the update that added it (ALTER TYPE ADD ATTRIBUTE) put it.
    rate_limit_key text
);

CREATE TYPE x_jobs.enqueue_result AS (
    id bigint,
    run_id uuid,
    deduped boolean
);

CREATE TYPE x_jobs.enqueue_many_result AS (
    ord integer,
    id bigint,
    run_id uuid,
    deduped boolean
);

-- Tests: tests/pgtap/00-schema.sql, tests/pgtap/10-enqueue.sql, tests/pgtap/11-enqueue-many.sql,
--        tests/pgtap/31-fail.sql
