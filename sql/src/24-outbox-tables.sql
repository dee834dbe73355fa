------------------------------------------------------------------------------------------------
-- The transactional outbox and the webhook ledger
------------------------------------------------------------------------------------------------

CREATE TYPE x_jobs.outbox_state AS ENUM (
    'pending',    -- waiting for a relay, due at available_at (a retry waits out its backoff)
    'inflight',   -- held by `relay` until available_at (the lease)
    'delivered',
    'dead'        -- out of attempts, or refused for good by its sink: kept for redrive
);

-- Messages an application writes in its own transaction, delivered afterwards by relays, at
-- least once, in order per key. Column order as for x_jobs.job: what the put sets first, what
-- relays change last.
CREATE TABLE x_jobs.outbox (
    id bigint GENERATED ALWAYS AS IDENTITY,
    created_at timestamptz NOT NULL,
    max_attempts integer NOT NULL,
    topic text NOT NULL,
    key text, -- noqa: RF04
    headers jsonb NOT NULL,
    payload jsonb NOT NULL,
    state x_jobs.outbox_state NOT NULL,
    attempt integer NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL,
    relay text,
    delivered_at timestamptz,
    last_error text,
    -- Last, where the update that added it (ALTER TABLE ADD COLUMN) put it: the tenant of the
    -- call that put the message ('none' for an unscoped one), for row-level security and the
    -- listings. It never changes.
    tenant_id text NOT NULL DEFAULT 'none',
    CONSTRAINT outbox_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT outbox_inflight_is_held CHECK (state <> 'inflight' OR relay IS NOT NULL)
)
WITH (fillfactor = 80);

COMMENT ON TABLE x_jobs.outbox IS 'Messages put in application transactions, delivered by relays in order per key.';
COMMENT ON COLUMN x_jobs.outbox.available_at IS 'pending: due from then on; inflight: the lease expiry.';

-- The relay's arms, as the claim's: due pending messages without a key, due pending messages
-- with one, and lapsed leases, each in order, each partial so the delivered messages kept for
-- inspection are in none. Keyless and keyed pending messages are apart so that keyless ones
-- never wait behind the keyed messages of busy keys (see relay_outbox).
CREATE INDEX outbox_pending_keyless_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'pending' AND key IS NULL;

CREATE INDEX outbox_pending_keyed_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'pending' AND key IS NOT NULL;

CREATE INDEX outbox_inflight_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'inflight';

-- The undelivered messages of each key: its pending ones in put order, then those in flight.
-- A message goes out only when it heads its key (nothing earlier of its key is pending, nothing
-- of its key is in flight): two seeks here, each answered by its first entry. A key's first
-- entry is its head, which lets relay_outbox visit the keys one seek each.
CREATE INDEX outbox_key_idx ON x_jobs.outbox (key, state, id)
WHERE key IS NOT NULL AND state IN ('pending', 'inflight');

-- Webhooks received from other services, by their sender's message id: a redelivered webhook
-- finds its row and enqueues nothing again.
CREATE TABLE x_jobs.webhook_ledger (
    source text NOT NULL, -- noqa: RF04
    webhook_id text NOT NULL,
    received_at timestamptz NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT webhook_ledger_pkey PRIMARY KEY (source, webhook_id)
);

-- What purge_webhook_ledger deletes first.
CREATE INDEX webhook_ledger_received_idx ON x_jobs.webhook_ledger (received_at);

SELECT pg_catalog.pg_extension_config_dump('x_jobs.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.webhook_ledger', '');

-- Tests: tests/pgtap/00-schema.sql, tests/pgtap/36-outbox.sql, tests/python/test_outbox_sql.py
