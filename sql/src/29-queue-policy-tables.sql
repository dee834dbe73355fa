------------------------------------------------------------------------------------------------
-- Queue policies: fair shares of a queue's workers between its tenants
------------------------------------------------------------------------------------------------

-- One row per queue an admin gave a policy (x_jobs.set_queue_policy). fair: the queue's claims
-- take its ready rows round-robin across tenants (x_jobs._claim_fair), not in FIFO order. A
-- fair queue has an index of its own on x_jobs.job, made and dropped with the policy (its name
-- is x_jobs._fair_index(queue)): a partial index on that queue's ready rows, tenant first.
CREATE TABLE x_jobs.queue_policy (
    queue text NOT NULL,
    fair boolean NOT NULL,
    updated_at timestamptz NOT NULL,
    updated_by text NOT NULL,
    CONSTRAINT queue_policy_pkey PRIMARY KEY (queue)
);

COMMENT ON TABLE x_jobs.queue_policy IS
'Queue policies: fair, claims take the queue''s ready rows round-robin across tenants.';

-- A tenant's weight in a fair queue: it takes `weight` rows a turn where a tenant without a row
-- here takes one. A table, not a field of the policy: a claim looks up only the tenants it
-- visits, however many have weights.
CREATE TABLE x_jobs.queue_weight (
    queue text NOT NULL,
    tenant_id text NOT NULL,
    weight integer NOT NULL,
    CONSTRAINT queue_weight_pkey PRIMARY KEY (queue, tenant_id),
    CONSTRAINT queue_weight_in_range CHECK (weight BETWEEN 1 AND 1000)
);

COMMENT ON TABLE x_jobs.queue_weight IS
'Weights of tenants in fair queues: rows a turn (1 when absent).';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.queue_policy', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.queue_weight', '');

-- Tests: tests/pgtap/49-fair-queues.sql, tests/python/test_fair_queues.py
