------------------------------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------------------------------

-- Column order is for the write path. What enqueue sets once comes first, what claims and
-- settlements change comes last: an update whose new version lands on the same page is logged
-- as the bytes that differ between the common prefix and suffix of the two versions, so the
-- name, input and the rest are not written to WAL again on each claim and settle.
CREATE TABLE x_jobs.job (
    id bigint GENERATED ALWAYS AS IDENTITY,
    run_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    backoff_base interval NOT NULL,
    backoff_max interval NOT NULL,
    max_attempts integer NOT NULL,
    concurrency_limit integer,
    priority smallint NOT NULL DEFAULT 0,
    dead_letter boolean NOT NULL DEFAULT TRUE,
    name text NOT NULL, -- noqa: RF04
    queue text NOT NULL,
    tenant_id text NOT NULL,
    idempotency_key text,
    concurrency_key text,
    traceparent text,
    enqueued_by text,
    input jsonb NOT NULL, -- noqa: RF04
    state x_jobs.job_state NOT NULL,
    attempt integer NOT NULL DEFAULT 0,
    claims integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL,
    visible_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL,
    claimed_by text,
    output jsonb,
    progress jsonb,
    last_error text,
    last_error_stack text,
    -- Last, where the update that added it (ALTER TABLE ADD COLUMN) put it: a fresh install
    -- and an updated one have the same row type. It never changes, so it is in the common
    -- suffix of every version a claim or a settle writes.
    keep_done boolean NOT NULL DEFAULT TRUE,
    CONSTRAINT job_pkey PRIMARY KEY (id),
    CONSTRAINT job_attempt_in_range CHECK (attempt >= 0 AND attempt <= max_attempts),
    CONSTRAINT job_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT job_concurrency_limit_positive CHECK (concurrency_limit >= 1),
    CONSTRAINT job_running_is_held CHECK (
        state <> 'running' OR (claimed_by IS NOT NULL AND visible_at IS NOT NULL)
    )
)
-- Room on each page for the versions a claim and a settle write: a new version on the same page
-- is logged as its changed bytes only (see the column order), about a third less WAL a settle.
WITH (fillfactor = 70);

COMMENT ON TABLE x_jobs.job IS 'Every job from enqueue until purge; state says where it is.';
COMMENT ON COLUMN x_jobs.job.visible_at IS 'Lease expiry of a running row: from then on, a claim may take the row.';
COMMENT ON COLUMN x_jobs.job.keep_done IS 'false: completing the job deletes its row, steps and errors.';
COMMENT ON COLUMN x_jobs.job.claims IS 'How many times a claim handed the row out (lapsed leases included).';

-- The claim's arms, one index each, every one partial so that done rows (the bulk of the table)
-- are in none of them. Each is scanned per queue in the claim's order, so a claim reads about
-- `qty` entries per arm whatever the backlog. The predicates are repeated word for word in
-- x_jobs.claim: the planner uses a partial index only when it can prove the predicate.
--
-- Rows with a concurrency key have indexes of their own: a key at its limit can hold thousands
-- of due rows that no claim may take, and a row without a key behind them in a shared index is
-- reached only by stepping over all of them. The keyed ones
-- carry the key and its limit, so that a claim ranks them per key without the heap.
CREATE INDEX job_ready_idx ON x_jobs.job (queue, priority, run_at, id)
WHERE state = 'ready' AND concurrency_key IS NULL;

CREATE INDEX job_waiting_idx ON x_jobs.job (queue, run_at, id)
WHERE state IN ('delayed', 'suspended') AND concurrency_key IS NULL;

CREATE INDEX job_ready_keyed_idx ON x_jobs.job (queue, priority, run_at, id)
INCLUDE (concurrency_key, concurrency_limit)
WHERE state = 'ready' AND concurrency_key IS NOT NULL;

CREATE INDEX job_waiting_keyed_idx ON x_jobs.job (queue, run_at, id)
INCLUDE (priority, concurrency_key, concurrency_limit)
WHERE state IN ('delayed', 'suspended') AND concurrency_key IS NOT NULL;

-- Only the claim's lapsed arm should read it. The statements that settle or heartbeat rows by
-- id compare state as text, which does not prove this predicate: given `state = 'running'`, the
-- planner reads every running row of every worker here whenever the statistics last saw few
-- running rows (a backlog analyzed before a drain), and complete_many of 250 ids beside 5,000
-- running rows took ten times as long. By id, the cost follows the ids.
CREATE INDEX job_running_idx ON x_jobs.job (queue, visible_at, id)
WHERE state = 'running';

-- An idempotency key is unique among live rows only: once its row settles, the key is free.
-- Per tenant: two tenants may use one key, and neither learns of the other's row.
CREATE UNIQUE INDEX job_idempotency_key_idx ON x_jobs.job (tenant_id, idempotency_key)
WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended', 'running');

-- How many rows of a concurrency key run now: the claim counts here before it takes one.
CREATE INDEX job_concurrency_idx ON x_jobs.job (concurrency_key)
WHERE concurrency_key IS NOT NULL AND state = 'running';

-- The due rows of each concurrency key, per queue in the claim's grant order, with what
-- queue_demand reads of them, so that it ranks only keyed rows, without the heap. A claim whose
-- windows are full of keys without room seeks here the first rows of each key it visits with
-- room, in each of its queues (by key alone, it would step over the key's rows in other
-- queues). Only keyed live rows that wait are in it: a row without a key never enters it, and a
-- claimed one leaves it.
CREATE INDEX job_keyed_idx ON x_jobs.job (concurrency_key, queue, priority, run_at, id)
INCLUDE (concurrency_limit)
WHERE concurrency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended');

-- The keys with waiting rows in each queue, each key's limits highest first: what the claim's
-- visit of keys walks, a seek from one key of its queues to the next, so that it never meets the
-- keys of other queues (job_keyed_idx would walk every key of the table). The first entry
-- of a key tells the highest limit its rows there carry, which bounds how many of them can run.
-- The columns repeat row after row, which btree deduplication folds into one entry a key and
-- limit: small, and one more insert per keyed row that enters the waiting states.
CREATE INDEX job_queue_key_idx ON x_jobs.job (queue, concurrency_key, concurrency_limit DESC)
WHERE concurrency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended');

-- The rows that ended badly, for list_jobs to page newest first: few beside the done ones, and
-- a row enters only when it ends that way, so the claim and settle path pays nothing for it.
CREATE INDEX job_ended_idx ON x_jobs.job (id)
WHERE state IN ('dead', 'failed', 'cancelled');

-- One row per failed attempt (and per lapsed lease), so an operator sees every error, not only
-- the last one the job row keeps.
CREATE TABLE x_jobs.job_error (
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    failed_at timestamptz NOT NULL,
    worker text,
    error text NOT NULL,
    error_stack text
);

CREATE INDEX job_error_job_idx ON x_jobs.job_error (job_id, attempt);

CREATE TABLE x_jobs.queue_pause (
    queue text NOT NULL,
    paused_at timestamptz NOT NULL,
    paused_by text NOT NULL,
    CONSTRAINT queue_pause_pkey PRIMARY KEY (queue)
);

CREATE TABLE x_jobs.worker (
    id text NOT NULL,
    queues text[] NOT NULL,
    build text,
    started_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    draining_at timestamptz,
    -- Last, where the update that added it (ALTER TABLE ADD COLUMN) put it.
    jobs text[],
    CONSTRAINT worker_pkey PRIMARY KEY (id)
);

COMMENT ON COLUMN x_jobs.worker.draining_at IS
'Set by the first draining announce and kept: queue_demand leaves what a draining worker holds out.';
COMMENT ON COLUMN x_jobs.worker.jobs IS
'The job names the worker has handlers for; NULL: it did not say, and is taken to serve every job of its queues.';

-- Which login a worker id belongs to: the fence that makes a claim a credential. A worker id is
-- no secret (x_jobs.job.claimed_by shows it to every worker), so the functions that act on a
-- held run (settles, heartbeats, releases, steps, progress, hand-backs) take it only from the
-- login it is bound to (x_jobs._caller(), see x_jobs._fence). The first claim or announce of an
-- id binds it to its caller. A table of its own, not a column of x_jobs.worker: announce_worker
-- answers that row type, and a column added to it would change the result of a running older
-- worker's prepared announce; and a claimer need not announce. Swept by announce_worker once
-- its worker row is gone and it went unused for a day.
CREATE TABLE x_jobs.worker_login (
    worker text NOT NULL,
    login name NOT NULL, -- noqa: RF04
    bound_at timestamptz NOT NULL,
    CONSTRAINT worker_login_pkey PRIMARY KEY (worker)
);

COMMENT ON TABLE x_jobs.worker_login IS
'The login each worker id is bound to: only it may act on the runs the id holds.';

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

-- Per job name and bucket: what settled and how. Settling statements add to the current minute;
-- rollup_counters folds old minutes into hours and old hours into days, so the rows per job name
-- stay bounded whatever the throughput. `shard` spreads concurrent settlers over several rows of
-- one bucket: with one row, every settling transaction would queue behind the previous one's
-- commit on its row lock. Readers sum over shards.
CREATE TABLE x_jobs.counter (
    job text NOT NULL,
    bucket_seconds integer NOT NULL,
    bucket_start timestamptz NOT NULL,
    shard smallint NOT NULL,
    completed bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    dead bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0,
    run_ms bigint NOT NULL DEFAULT 0,
    CONSTRAINT counter_pkey PRIMARY KEY (job, bucket_seconds, bucket_start, shard)
);

COMMENT ON COLUMN x_jobs.counter.run_ms IS
'Sum of the durations (claim to settle) of the attempts counted in this bucket.';

-- Rate limits: at most max_starts starts (claims) of the jobs naming `key` in each window of
-- length `per`. The windows are FIXED, aligned to the epoch (a window starts at a multiple of
-- `per` since 1970-01-01 UTC): window_start and starts count the current window's starts, and a
-- claim in a later window counts afresh, so a budget recovers by itself, with no maintenance.
-- So no window holds more than max_starts starts; a sliding interval of length `per` that
-- straddles a boundary may hold up to twice that (the end of one window and the start of the
-- next). A claim locks the key's row (FOR UPDATE SKIP LOCKED) before it counts and keeps the
-- lock until it commits, so two claimers can never both spend the last start.
CREATE TABLE x_jobs.rate_limit (
    key text NOT NULL, -- noqa: RF04
    max_starts integer NOT NULL,
    per interval NOT NULL, -- noqa: RF04
    window_start timestamptz,
    starts integer NOT NULL DEFAULT 0, -- noqa: RF04
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT rate_limit_pkey PRIMARY KEY (key),
    CONSTRAINT rate_limit_max_starts_positive CHECK (max_starts >= 1),
    CONSTRAINT rate_limit_per_positive CHECK (per > interval '0')
);

COMMENT ON TABLE x_jobs.rate_limit IS
'Rate limits per key: at most max_starts claims of the key''s jobs per fixed window of length per.';

-- The jobs that name a rate limit key, beside x_jobs.job rather than in it: a column of
-- x_jobs.job changes the row type x_jobs.claim returns, and a claim of the previous release in
-- flight while the update commits then fails (its caller planned the old row type; see
-- CHANGELOG 0.4.2). A job waiting for its key's budget is PARKED: its x_jobs.job row is
-- 'delayed' at x_jobs._rate_parked_at() (a time no enqueue may take, so every keyless arm of
-- the claim stops before it, as before parked rows at infinity), and its row here keeps what
-- the claim restores when the budget allows (parked_state: 'ready' or 'delayed', and run_at,
-- the time it is due), and what the claim orders the key's jobs by. A granted job keeps its row
-- here with parked_state NULL. Rows of jobs that are gone are removed by x_jobs.purge.
CREATE TABLE x_jobs.job_rate (
    job_id bigint NOT NULL,
    rate_limit_key text NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    run_at timestamptz NOT NULL,
    parked_state x_jobs.job_state,
    CONSTRAINT job_rate_pkey PRIMARY KEY (job_id)
);

COMMENT ON TABLE x_jobs.job_rate IS
'The rate limit key of each job that names one; parked_state set: the job waits for the key''s budget.';

-- The parked jobs of each key, per queue in grant order: the claim seeks from one key of a
-- queue to the next here (a loose index scan) and takes the first due jobs of keys with budget.
CREATE INDEX job_rate_parked_idx ON x_jobs.job_rate (queue, rate_limit_key, priority, run_at, job_id)
WHERE parked_state IS NOT NULL;

-- pg_dump keeps the rows of these tables (and the id sequence, so restored ids do not collide).
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_error', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.queue_pause', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.counter', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.rate_limit', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_rate', '');

-- Tests: tests/pgtap/00-schema.sql, tests/pgtap/80-privileges.sql, tests/python/test_plan.py,
--        scripts/check-upgrade
