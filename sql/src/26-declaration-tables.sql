------------------------------------------------------------------------------------------------
-- Declarations: job types, and the rows no worker serves
------------------------------------------------------------------------------------------------

-- What a job type is, as its workers declare it at their start (x_jobs.declare_job): the options
-- every enqueue of the name gets unless it passes its own, for producers of every language, and
-- the run options a worker of any language reads (timeout). One row per name, the latest
-- declaration's; a field left NULL was not declared, and the built-in default applies.
-- A concurrency key declared NULL beside a limit is one the producer derives from the input:
-- the limit applies to every key an enqueue passes.
CREATE TABLE x_jobs.job_type (
    name text NOT NULL, -- noqa: RF04
    queue text,
    max_attempts integer,
    priority integer,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean,
    concurrency_key text,
    concurrency_limit integer,
    timeout interval, -- noqa: RF04
    declared_at timestamptz NOT NULL,
    declared_by text NOT NULL,
    build text,
    -- Last, where the update that added it (ALTER TABLE ADD COLUMN) put it: the rate limit key
    -- every enqueue of the name gets unless it passes its own.
    rate_limit_key text,
    CONSTRAINT job_type_pkey PRIMARY KEY (name)
);

COMMENT ON TABLE x_jobs.job_type IS
'Declared job types: the defaults of their enqueues, and how their workers run them.';
COMMENT ON COLUMN x_jobs.job_type.timeout IS 'How long a run may take: enforced by the worker, not the row.';
COMMENT ON COLUMN x_jobs.job_type.declared_by IS 'The worker id given to declare_job, else the login that declared it.';

-- The parked rows: handed back by a worker without a handler while no live worker served their
-- name (x_jobs.hand_back), due at no time (run_at infinity) until a worker that serves the name
-- announces itself or it is declared. Delayed rows at infinity sort last in job_waiting_idx, so
-- the claim's waiting arm stops before them, and queue_demand (due rows only) counts none of
-- them. Only parked rows are in this index (no enqueue takes an infinite run_at, and a run
-- suspended on a step waits as 'suspended'): an announce finds those it serves with a seek per
-- queue and name, in an index that is empty while nothing is parked.
-- The operators are named with their schema: a script runs as the bootstrap superuser with the
-- search_path set to the extension's schema (public, where a database owner may create), and
-- building the index evaluates the predicate on every row. An unqualified `=` on the enum
-- would find a `=` (x_jobs.job_state, x_jobs.job_state) made there before pg_catalog's
-- anyenum one, and run it as the superuser.
CREATE INDEX job_parked_idx ON x_jobs.job (queue, name, id)
WHERE state OPERATOR (pg_catalog.=) 'delayed' AND run_at OPERATOR (pg_catalog.=) 'infinity';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_type', '');

-- Tests: tests/pgtap/00-schema.sql, tests/pgtap/12-declarations.sql
