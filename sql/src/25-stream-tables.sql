------------------------------------------------------------------------------------------------
-- The stream and the consumers' cursors
------------------------------------------------------------------------------------------------

-- One row per entry appended to a stream (x_jobs.stream_append), in the producer's transaction.
-- xid is that transaction's id: entries are read in (xid, id) order, and only below the oldest
-- running transaction (see x_jobs.stream_read), so an entry that commits late is never passed
-- over by a reader that already read past it.
CREATE TABLE x_jobs.stream_entry (
    stream text NOT NULL, -- noqa: RF04
    xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    id bigint GENERATED ALWAYS AS IDENTITY,
    key text, -- noqa: RF04
    appended_at timestamptz NOT NULL,
    tenant_id text NOT NULL,
    payload jsonb NOT NULL,
    CONSTRAINT stream_entry_pkey PRIMARY KEY (stream, xid, id)
);

COMMENT ON TABLE x_jobs.stream_entry IS
'Entries appended to streams, read in (xid, id) order below the oldest running transaction.';

-- One key's entries, for a reader that follows a single key.
CREATE INDEX stream_entry_key_idx ON x_jobs.stream_entry (stream, key, xid, id)
WHERE key IS NOT NULL;

-- Where each consumer is, per key: any JSON the consumer chose (a stream position, a table's
-- last id, a partner's page token). Saved by x_jobs.save_cursor in the caller's transaction, so
-- that a batch's writes and its new position commit together or not at all.
CREATE TABLE x_jobs.consumer_cursor (
    consumer text NOT NULL,
    key text NOT NULL, -- noqa: RF04
    tenant_id text NOT NULL,
    cursor jsonb NOT NULL, -- noqa: RF04
    saved_at timestamptz NOT NULL,
    CONSTRAINT consumer_cursor_pkey PRIMARY KEY (consumer, key, tenant_id)
);

COMMENT ON TABLE x_jobs.consumer_cursor IS
'Each consumer''s position per key, saved in the transaction of the batch it follows.';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.stream_entry', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.stream_entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.consumer_cursor', '');

-- Tests: tests/pgtap/53-stream.sql, tests/python/test_stream.py
