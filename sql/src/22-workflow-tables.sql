------------------------------------------------------------------------------------------------
-- Steps and events: durable workflows
------------------------------------------------------------------------------------------------

CREATE TYPE x_jobs.step_status AS ENUM (
    'waiting',  -- a sleep or a wait on an event: its run is suspended until this is resolved
    'done',     -- recorded: a replay answers the output without running the step again
    -- ended in an error: a wait that timed out (replayed as that error), a run step that
    -- raised (run again by the next attempt), a failed compensation
    'failed'
);

-- What a run did so far, one row per step it reached, so that a retried or re-claimed run skips
-- what already happened. Keyed by the job: a job's run_id never changes (x_jobs.retry keeps it,
-- so a re-queued workflow resumes). A compensation (saga) is recorded beside its step under the
-- same name.
CREATE TABLE x_jobs.step (
    job_id bigint NOT NULL,
    name text NOT NULL, -- noqa: RF04
    compensation boolean NOT NULL DEFAULT FALSE,
    kind text NOT NULL,
    created_at timestamptz NOT NULL,
    event text, -- noqa: RF04
    event_key text,
    match jsonb, -- noqa: RF04
    since timestamptz,
    timeout_at timestamptz,
    status x_jobs.step_status NOT NULL,
    attempt integer NOT NULL,
    output jsonb,
    error text,
    event_id bigint,
    resolved_by text,
    resolved_at timestamptz,
    CONSTRAINT step_pkey PRIMARY KEY (job_id, name, compensation),
    CONSTRAINT step_kind_known CHECK (kind IN ('run', 'sleep', 'wait')),
    CONSTRAINT step_wait_names_event CHECK (kind <> 'wait' OR event IS NOT NULL)
);

COMMENT ON TABLE x_jobs.step IS 'The recorded steps of each run: replayed, not re-run, after a retry or a crash.';
COMMENT ON COLUMN x_jobs.step.created_at IS 'When the run first reached the step.';
COMMENT ON COLUMN x_jobs.step.since IS 'A wait matches the events published from this instant on.';
COMMENT ON COLUMN x_jobs.step.timeout_at IS 'When a sleep ends, or when a wait gives up.';
COMMENT ON COLUMN x_jobs.step.resolved_by IS 'worker, event, timeout or operator.';

-- The open waits, which is all a publish reads: partial, so a publish costs the same beside a
-- million done steps as beside none. Keyed waits are found by (event, key), keyless ones by
-- (event, NULL).
CREATE INDEX step_waiting_idx ON x_jobs.step (event, event_key)
WHERE status = 'waiting';

-- What a wait and a publish lock, so that neither misses the other (see "The wait and the
-- publish" in 60-steps.sql): a row per slot, 4096 for event names (kind 1) and 4096 for event
-- names with a key (kind 2), an event hashed onto its slot. Row locks, not advisory locks: any
-- login may take an advisory lock of any key, and one holding an event's made its publishes and
-- waits wait for it (until statement_timeout); a row lock needs the right to update the table,
-- which no role holds but its owner, through publish and step_wait. Two events of one slot
-- share its lock: a wait then waits for the other event's publishes in flight too, no more.
CREATE TABLE x_jobs.event_lock (
    kind smallint NOT NULL,
    slot integer NOT NULL,
    CONSTRAINT event_lock_pkey PRIMARY KEY (kind, slot)
);

INSERT INTO x_jobs.event_lock (kind, slot)
SELECT
    k.kind,
    s.slot
FROM generate_series(1, 2) AS k (kind)
CROSS JOIN generate_series(0, 4095) AS s (slot);

-- Every published event, kept for the waits that reach their step after it was published (a
-- wait may ask for the events since its run began) and for the operator, until purge_events.
CREATE TABLE x_jobs.event (
    id bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL, -- noqa: RF04
    key text, -- noqa: RF04
    published_at timestamptz NOT NULL,
    payload jsonb,
    -- Last, where the update that added it (ALTER TABLE ADD COLUMN) put it. The publisher's
    -- tenant: an event resolves only the waits of its tenant's runs, and a wait matches only
    -- the events of its run's tenant, so event names and keys are per tenant.
    tenant_id text NOT NULL DEFAULT 'none',
    CONSTRAINT event_pkey PRIMARY KEY (id)
);

COMMENT ON COLUMN x_jobs.event.published_at IS
'The clock when the publish ran (not the transaction start), taken under the event''s lock.';

-- What a wait reaching its step looks up: the first event of its tenant, of a name (and key),
-- since an instant.
CREATE INDEX event_name_idx ON x_jobs.event (tenant_id, name, published_at);

CREATE INDEX event_key_idx ON x_jobs.event (tenant_id, name, key, published_at)
WHERE key IS NOT NULL;

SELECT pg_catalog.pg_extension_config_dump('x_jobs.step', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.event', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.event_id_seq', '');

-- Tests: tests/pgtap/00-schema.sql, tests/pgtap/34-steps.sql, tests/pgtap/35-events.sql,
--        tests/python/test_plan.py
