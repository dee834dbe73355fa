------------------------------------------------------------------------------------------------
-- Functions: the stream and the consumers' cursors
------------------------------------------------------------------------------------------------

-- The refusal of a stream name that is missing, empty or over 200 characters (XJ067), and of an
-- entry's key over 400 (the key is in stream_entry_key_idx: past a btree entry's size an insert
-- failed with a bare 54000, as the outbox's keys did).
CREATE FUNCTION x_jobs._require_stream(p_stream text, p_key text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_stream IS NULL OR p_stream = '' OR pg_catalog.length(p_stream) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ067',
            MESSAGE = pg_catalog.format('X_STREAM_INVALID: stream %s is not a stream name',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(p_stream, 64)), 'NULL')),
            HINT = 'Name the stream with 1 to 200 characters, such as ''orders''.';
    END IF;
    IF pg_catalog.length(p_key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ067',
            MESSAGE = pg_catalog.format('X_STREAM_INVALID: key %L... is %s characters, longer than 400',
                pg_catalog.left(p_key, 64), pg_catalog.length(p_key)),
            HINT = 'Key entries with a short text, such as an order id (up to 400 characters): hash a longer one.';
    END IF;
END
$$;

-- An entry's position as stream_read answers it and takes it back (`after`): its transaction's
-- id and its own, 'xid/id'. Text, so that any client keeps it as it is.
CREATE FUNCTION x_jobs._stream_position(p_xid xid8, p_id bigint)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_xid::text || '/' || p_id::text
$$;

-- Append an entry to `stream`, in the caller's transaction: it is read once that commits, and
-- never if it rolls back. `key` (optional) lets a reader follow one key's entries. Answers the
-- entry's position. A scoped caller's entry is its tenant's, as an outbox message is.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.stream_append(stream text, key text, payload jsonb) -- noqa: RF04
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_tenant text := coalesce(x_jobs._stamp_tenant(NULL, x_jobs._tenant_scope()), 'none');
    v_position text;
BEGIN
    PERFORM x_jobs._require_stream(stream_append.stream, stream_append.key);
    IF stream_append.payload IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ067',
            MESSAGE = pg_catalog.format('X_STREAM_INVALID: the entry for stream %L has no payload', stream_append.stream),
            HINT = 'Pass the entry as a JSON value, such as ''{"order": 42}''.';
    END IF;
    IF x_jobs._payload_bytes(stream_append.payload) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: stream entry of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(stream_append.payload), x_jobs._max_payload_bytes()),
            HINT = 'Append a reference to the data (a key, a URL) rather than the data itself.';
    END IF;
    INSERT INTO x_jobs.stream_entry (stream, key, appended_at, tenant_id, payload)
    VALUES (stream_append.stream, stream_append.key, pg_catalog.clock_timestamp(), v_tenant, stream_append.payload)
    RETURNING x_jobs._stream_position(xid, id) INTO v_position;
    RETURN v_position;
END
$$;

-- Append many entries to `stream` in one statement: `entries` is a JSON array of objects with a
-- `payload` and an optional `key`. Answers (ord, position) in input order. One bad entry refuses
-- them all.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.stream_append_many(stream text, entries jsonb)
RETURNS TABLE (ord integer, pos text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_tenant text := coalesce(x_jobs._stamp_tenant(NULL, x_jobs._tenant_scope()), 'none');
    v_bad record;
BEGIN
    PERFORM x_jobs._require_stream(stream_append_many.stream, NULL);
    IF pg_catalog.jsonb_typeof(stream_append_many.entries) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ067',
            MESSAGE = pg_catalog.format('X_STREAM_INVALID: entries for stream %L are not a JSON array',
                stream_append_many.stream),
            HINT = 'Pass entries as a JSON array of objects, such as ''[{"key": "a", "payload": {}}]''.';
    END IF;
    SELECT e.n, e.value INTO v_bad
    FROM pg_catalog.jsonb_array_elements(stream_append_many.entries) WITH ORDINALITY AS e (value, n)
    WHERE pg_catalog.jsonb_typeof(e.value) IS DISTINCT FROM 'object'
        OR NOT e.value ? 'payload' OR pg_catalog.jsonb_typeof(e.value -> 'payload') = 'null'
        OR (e.value ? 'key' AND pg_catalog.jsonb_typeof(e.value -> 'key') NOT IN ('string', 'null'))
        OR EXISTS (SELECT FROM pg_catalog.jsonb_object_keys(e.value) AS k WHERE k NOT IN ('key', 'payload'))
        OR pg_catalog.length(e.value ->> 'key') > 400
        OR x_jobs._payload_bytes(e.value -> 'payload') > x_jobs._max_payload_bytes()
    ORDER BY e.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ067',
            MESSAGE = pg_catalog.format('X_STREAM_INVALID: entry %s for stream %L is not an object of a payload and a key',
                v_bad.n, stream_append_many.stream),
            DETAIL = pg_catalog.format('The entry: %s', pg_catalog.left(v_bad.value::text, 200)),
            HINT = 'Give each entry a "payload" (any JSON but null, within x_jobs.max_payload_bytes) and, if it has one, a "key" of up to 400 characters.';
    END IF;
    RETURN QUERY
    WITH added AS (
        INSERT INTO x_jobs.stream_entry (stream, key, appended_at, tenant_id, payload)
        SELECT stream_append_many.stream, e.value ->> 'key', pg_catalog.clock_timestamp(), v_tenant, e.value -> 'payload'
        FROM pg_catalog.jsonb_array_elements(stream_append_many.entries) WITH ORDINALITY AS e (value, n)
        ORDER BY e.n
        RETURNING xid, id
    )
    SELECT (pg_catalog.row_number() OVER (ORDER BY a.id))::integer, x_jobs._stream_position(a.xid, a.id)
    FROM added AS a
    ORDER BY a.id;
END
$$;

-- Up to `max_rows` entries of `stream` after the position `after` (NULL: from the first), in
-- position order, each with its position for the reader to pass back as `after`; with `key`, that
-- key's entries only. A scoped caller reads its tenants' entries only. `pos` is each entry's
-- position, `entry_key` its key.
--
-- COMMIT-SAFE. Entries are ordered by their transaction's id, then their own, and read only when
-- their transaction's id is below the oldest transaction still running (the xmin of the
-- reader's snapshot, pg_snapshot_xmin). Every transaction below it has ended, so every entry it
-- appended is there to read; every transaction that has not (and every one to come) has an id at
-- or above it, so an entry it appends, whenever it commits, comes after every position read so
-- far. So a reader that moved past a position never misses an entry before it, whatever order
-- the producers committed in, and reads none twice. What it costs: an entry is read only once
-- every transaction older than its own has ended, so a long transaction anywhere on the server
-- (any database) holds back what was appended after it began, until it ends.
-- SECURITY DEFINER: readers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.stream_read(
    stream text,
    after text DEFAULT NULL,
    max_rows integer DEFAULT 100,
    key text DEFAULT NULL -- noqa: RF04
)
RETURNS TABLE (pos text, entry_key text, payload jsonb, appended_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_scope text[] := x_jobs._tenant_scope();
    v_horizon xid8 := pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot());
    v_xid xid8 := '0'::xid8;
    v_id bigint := 0::bigint;
BEGIN
    PERFORM x_jobs._require_stream(stream_read.stream, stream_read.key);
    IF stream_read.max_rows IS NULL OR stream_read.max_rows < 1 OR stream_read.max_rows > 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..10000',
                coalesce(stream_read.max_rows::text, 'NULL')),
            HINT = 'Pass how many entries to read at most, from 1 to 10000.';
    END IF;
    IF stream_read.after IS NOT NULL THEN
        IF stream_read.after !~ '^[0-9]{1,20}/[0-9]{1,19}$' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ068',
                MESSAGE = pg_catalog.format('X_POSITION_INVALID: position %L is not a stream position',
                    pg_catalog.left(stream_read.after, 64)),
                HINT = 'Pass back a position stream_read answered (''xid/id''), or NULL to read from the first entry.';
        END IF;
        v_xid := pg_catalog.split_part(stream_read.after, '/', 1)::xid8;
        v_id := pg_catalog.split_part(stream_read.after, '/', 2)::bigint;
    END IF;

    IF stream_read.key IS NULL THEN
        RETURN QUERY
        SELECT x_jobs._stream_position(e.xid, e.id), e.key, e.payload, e.appended_at
        FROM x_jobs.stream_entry AS e
        WHERE e.stream = stream_read.stream
            AND (e.xid, e.id) > (v_xid, v_id)
            AND e.xid < v_horizon
            AND (v_scope IS NULL OR e.tenant_id = ANY (v_scope))
        ORDER BY e.xid, e.id
        LIMIT stream_read.max_rows;
    ELSE
        RETURN QUERY
        SELECT x_jobs._stream_position(e.xid, e.id), e.key, e.payload, e.appended_at
        FROM x_jobs.stream_entry AS e
        WHERE e.stream = stream_read.stream AND e.key = stream_read.key
            AND (e.xid, e.id) > (v_xid, v_id)
            AND e.xid < v_horizon
            AND (v_scope IS NULL OR e.tenant_id = ANY (v_scope))
        ORDER BY e.xid, e.id
        LIMIT stream_read.max_rows;
    END IF;
END
$$;

-- The cursor `consumer` saved for `key` (x_jobs.save_cursor), NULL when it saved none: where its
-- run starts. Per tenant: a scoped caller reads its tenant's cursor.
-- SECURITY DEFINER: workers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.consumer_cursor(consumer text, key text) -- noqa: RF04
RETURNS jsonb
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.cursor FROM x_jobs.consumer_cursor AS c
    WHERE c.consumer = consumer_cursor.consumer AND c.key = consumer_cursor.key
        AND c.tenant_id = coalesce(x_jobs._stamp_tenant(NULL, x_jobs._tenant_scope()), 'none')
$$;

-- Save the cursor of `consumer` for `key`, in the caller's transaction: call it in the
-- transaction that does the batch's work, and the work and the new position commit together, or
-- neither does (a crash between them replays the batch, and only it). Answers the cursor saved.
-- SECURITY DEFINER: workers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.save_cursor(consumer text, key text, cursor jsonb) -- noqa: RF04
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_tenant text := coalesce(x_jobs._stamp_tenant(NULL, x_jobs._tenant_scope()), 'none');
BEGIN
    IF save_cursor.consumer IS NULL OR save_cursor.consumer = '' OR pg_catalog.length(save_cursor.consumer) > 200
        OR save_cursor.key IS NULL OR pg_catalog.length(save_cursor.key) > 400 OR save_cursor.cursor IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ069',
            MESSAGE = pg_catalog.format('X_CURSOR_INVALID: cursor of consumer %s for key %s is not a consumer, a key and a cursor',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(save_cursor.consumer, 64)), 'NULL'),
                coalesce(pg_catalog.quote_literal(pg_catalog.left(save_cursor.key, 64)), 'NULL')),
            HINT = 'Pass the consumer''s name (1 to 200 characters), the key (up to 400, '''' for a consumer of one key) and the cursor as JSON.';
    END IF;
    INSERT INTO x_jobs.consumer_cursor AS c (consumer, key, tenant_id, cursor, saved_at)
    VALUES (save_cursor.consumer, save_cursor.key, v_tenant, save_cursor.cursor, x_jobs.now())
    ON CONFLICT ON CONSTRAINT consumer_cursor_pkey DO UPDATE
    SET cursor = excluded.cursor, saved_at = excluded.saved_at;
    RETURN save_cursor.cursor;
END
$$;

-- Tests: tests/pgtap/53-stream.sql, tests/python/test_stream.py
