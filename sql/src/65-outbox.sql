------------------------------------------------------------------------------------------------
-- Functions: the outbox and its relays
------------------------------------------------------------------------------------------------
--
-- outbox_put / outbox_put_many  write messages in the caller's transaction (a rollback leaves
--                               nothing) and NOTIFY 'x_jobs_outbox' with the topic.
-- relay_outbox                  hands a relay the oldest due messages, at most one per key in
--                               flight, for `lease`; lapsed leases are handed out again.
-- outbox_ack / outbox_nack      settle them, only by the relay that holds them: delivered, or
--                               back to pending after a backoff, or dead.
-- outbox_redrive                dead messages back to pending; purge_outbox: retention.

-- The refusals shared by the put functions: a topic, headers that are an object, a payload.
CREATE FUNCTION x_jobs._require_message(
    p_topic text, p_payload jsonb, p_headers jsonb, p_max_attempts integer
)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_topic IS NULL OR p_topic = '' OR pg_catalog.length(p_topic) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ034',
            MESSAGE = pg_catalog.format('X_TOPIC_INVALID: topic %s is missing, empty or longer than 200 characters',
                coalesce(pg_catalog.quote_literal(p_topic), 'NULL')),
            HINT = 'Name the topic the relays route by, such as ''orders.created''.';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: message of topic %L has no payload', p_topic),
            HINT = 'Pass a JSON payload (use ''null''::jsonb for a message that carries nothing).';
    END IF;
    -- Headers count with the payload: a relay delivers them together, so together they are what
    -- a sink must take, and one limit bounds what a message stores (50 MB of headers passed
    -- beside a small payload). A cap of their own would be a second limit to set.
    IF x_jobs._payload_bytes(p_payload) + coalesce(x_jobs._payload_bytes(p_headers), 0)
        > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes%s exceeds the limit of %s',
                x_jobs._payload_bytes(p_payload),
                CASE WHEN p_headers IS NOT NULL
                    THEN pg_catalog.format(' with headers of %s bytes', x_jobs._payload_bytes(p_headers))
                END,
                x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For a message of topic %L.', p_topic),
            HINT = 'Put a reference to large data in the message, or raise x_jobs.max_payload_bytes.';
    END IF;
    IF p_headers IS NOT NULL AND (pg_catalog.jsonb_typeof(p_headers) <> 'object' OR EXISTS (
        SELECT FROM pg_catalog.jsonb_each(p_headers) AS h WHERE pg_catalog.jsonb_typeof(h.value) <> 'string'
    )) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: headers %s are not an object of strings', p_headers),
            HINT = 'Pass headers as a JSON object of string values, such as ''{"x-tenant": "acme"}''.';
    END IF;
    IF p_max_attempts < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ004',
            MESSAGE = pg_catalog.format('X_MAX_ATTEMPTS_INVALID: max_attempts %s is below 1', p_max_attempts),
            HINT = 'Pass 1 or more, or NULL for the default of 10.';
    END IF;
END
$$;

-- Put one message, in the caller's transaction. `key` orders delivery: the messages of one key
-- go out one at a time, in put order; messages without a key go out in any order. Answers the
-- message id.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_put(
    topic text,
    payload jsonb,
    key text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    max_attempts integer DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_id bigint;
    -- The message is the tenant's of a scoped caller (the one in scope, or the one
    -- x_jobs.tenant names; several: XJ061), 'none' for an unscoped one.
    v_tenant text := coalesce(x_jobs._stamp_tenant(NULL, x_jobs._tenant_scope()), 'none');
BEGIN
    PERFORM x_jobs._require_message(outbox_put.topic, outbox_put.payload, outbox_put.headers,
        outbox_put.max_attempts);
    -- The key is in outbox_key_idx: past a btree entry's size (about 2.7 kB) an insert failed
    -- with a bare 54000. 400 characters, as event keys, keep it within that in any encoding.
    IF pg_catalog.length(outbox_put.key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %L... is %s characters, longer than 400',
                pg_catalog.left(outbox_put.key, 64), pg_catalog.length(outbox_put.key)),
            DETAIL = pg_catalog.format('For a message of topic %L.', outbox_put.topic),
            HINT = 'Key messages with a short text, such as an order id (up to 400 characters): hash a longer one.';
    END IF;
    INSERT INTO x_jobs.outbox (
        created_at, max_attempts, topic, key, headers, payload, state, available_at, tenant_id
    )
    VALUES (v_now, coalesce(outbox_put.max_attempts, 10), outbox_put.topic, outbox_put.key,
        coalesce(outbox_put.headers, '{}'), outbox_put.payload, 'pending', v_now, v_tenant)
    RETURNING id INTO v_id;
    PERFORM x_jobs._notify('x_jobs_outbox', outbox_put.topic);
    RETURN v_id;
END
$$;

-- Put many messages in one statement: `messages` is a JSON array of objects with the fields of
-- outbox_put (topic, payload, key, headers, max_attempts). Answers (ord, id) in input order.
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_put_many(messages jsonb)
RETURNS TABLE (ord integer, id bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_bad record;
    -- As outbox_put's: one tenant for the whole batch.
    v_tenant text := coalesce(x_jobs._stamp_tenant(NULL, x_jobs._tenant_scope()), 'none');
BEGIN
    IF outbox_put_many.messages IS NULL OR pg_catalog.jsonb_typeof(outbox_put_many.messages) <> 'array'
        OR EXISTS (
            SELECT FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value)
            WHERE pg_catalog.jsonb_typeof(m.value) <> 'object'
        ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: messages %s are not an array of objects',
                pg_catalog.left(coalesce(outbox_put_many.messages::text, 'NULL'), 200)),
            HINT = 'Pass a JSON array of objects such as [{"topic": "t", "payload": {}, "key": "k"}].';
    END IF;

    -- The first message with a field outbox_put has no parameter for (a misspelt "key" would put
    -- the message unordered), a topic, key or max_attempts of the wrong JSON type (->> would
    -- take an object or a number as its JSON text), or a key too long (see outbox_put).
    SELECT m.ord, m.value,
           m.value - ARRAY['topic', 'payload', 'key', 'headers', 'max_attempts'] AS unknown
    INTO v_bad
    FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) WITH ORDINALITY AS m (value, ord)
    WHERE m.value - ARRAY['topic', 'payload', 'key', 'headers', 'max_attempts'] <> '{}'::jsonb
        OR pg_catalog.jsonb_typeof(m.value -> 'topic') NOT IN ('string', 'null')
        OR pg_catalog.jsonb_typeof(m.value -> 'key') NOT IN ('string', 'null')
        OR pg_catalog.length(m.value ->> 'key') > 400
        OR pg_catalog.jsonb_typeof(m.value -> 'max_attempts') NOT IN ('number', 'null')
        OR (pg_catalog.jsonb_typeof(m.value -> 'max_attempts') = 'number'
            AND ((m.value ->> 'max_attempts')::numeric % 1 <> 0
                OR abs((m.value ->> 'max_attempts')::numeric) > 2147483647))
    ORDER BY m.ord
    LIMIT 1;
    IF FOUND AND v_bad.unknown <> '{}'::jsonb THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: message %s has an unknown field %L', v_bad.ord,
                (SELECT min(f.name) FROM pg_catalog.jsonb_object_keys(v_bad.unknown) AS f (name))),
            HINT = 'A message has topic, payload, key, headers and max_attempts: check the spelling of the others.';
    ELSIF FOUND AND pg_catalog.jsonb_typeof(v_bad.value -> 'topic') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: topic %s of message %s is not a string',
                CASE WHEN pg_catalog.length((v_bad.value -> 'topic')::text) > 64
                    THEN pg_catalog.format('%s... (%s characters)', pg_catalog.left((v_bad.value -> 'topic')::text, 64),
                        pg_catalog.length((v_bad.value -> 'topic')::text))
                    ELSE (v_bad.value -> 'topic')::text
                END, v_bad.ord),
            HINT = 'Pass the topic as a string, such as "orders.created".';
    ELSIF FOUND AND pg_catalog.jsonb_typeof(v_bad.value -> 'key') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %s of message %s is not a string',
                CASE WHEN pg_catalog.length((v_bad.value -> 'key')::text) > 64
                    THEN pg_catalog.format('%s... (%s characters)', pg_catalog.left((v_bad.value -> 'key')::text, 64),
                        pg_catalog.length((v_bad.value -> 'key')::text))
                    ELSE (v_bad.value -> 'key')::text
                END, v_bad.ord),
            HINT = 'Pass the key as a string, such as "order-42", or leave it out.';
    ELSIF FOUND AND pg_catalog.length(v_bad.value ->> 'key') > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %L... of message %s is %s characters, longer than 400',
                pg_catalog.left(v_bad.value ->> 'key', 64), v_bad.ord, pg_catalog.length(v_bad.value ->> 'key')),
            HINT = 'Key messages with a short text, such as an order id (up to 400 characters): hash a longer one.';
    ELSIF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: max_attempts %s of message %s is not a whole number of attempts',
                v_bad.value -> 'max_attempts', v_bad.ord),
            HINT = 'Pass max_attempts as a whole number of 1 or more, or leave it out for 10.';
    END IF;

    PERFORM x_jobs._require_message(m.value ->> 'topic', m.value -> 'payload', m.value -> 'headers',
        (m.value ->> 'max_attempts')::integer)
    FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value);

    RETURN QUERY
    WITH input AS (
        SELECT m.ord::integer AS ord, m.value
        FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) WITH ORDINALITY AS m (value, ord)
    ),
    put AS (
        INSERT INTO x_jobs.outbox AS o (
            created_at, max_attempts, topic, key, headers, payload, state, available_at, tenant_id
        )
        SELECT v_now, coalesce((i.value ->> 'max_attempts')::integer, 10), i.value ->> 'topic',
               i.value ->> 'key', coalesce(i.value -> 'headers', '{}'), i.value -> 'payload', 'pending', v_now,
               v_tenant
        FROM input AS i
        ORDER BY i.ord
        RETURNING o.id
    )
    -- Identity values are drawn in insert order, which is input order: rank them back.
    SELECT (pg_catalog.row_number() OVER (ORDER BY p.id))::integer, p.id FROM put AS p ORDER BY p.id;

    PERFORM x_jobs._notify('x_jobs_outbox', t.topic)
    FROM (
        SELECT DISTINCT m.value ->> 'topic' AS topic
        FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value)
    ) AS t;
END
$$;

-- Hand `relay` up to `qty` messages to deliver, for `lease`: the oldest due pending messages
-- that head their key (nothing earlier of the key is pending, and nothing of the key is in
-- flight: a redriven or late-committed message with a lower id waits for the one out), and the
-- messages whose lease lapsed (a relay that died; dead instead on their final attempt). Locked
-- rows are skipped, so relays never wait for each other. `topics` restricts the claim to the
-- topics this relay has sinks for (NULL: all).
--
-- Keyless messages are a seek of their own index, about `qty` entries. Keyed ones are looked
-- for among the oldest due keyed messages, at most 10 x `qty` + 100 of them, each a head or
-- not by two seeks of outbox_key_idx, and locked as found, skipping those another relay holds,
-- until `qty` are held. When that window is full of messages waiting behind their keys (a
-- backlog on keys whose messages are in flight, or nacked with a backoff) and yields fewer
-- than `qty`, the relay visits every key with undelivered messages instead, one seek each, and
-- takes the oldest of their heads, rather than walk the whole backlog (with every key busy, a
-- call would read every pending message to answer none). So a call costs about `qty` entries
-- when heads are at hand, and a seek per busy key at worst.
--
-- The two checks of a message's key are lateral subqueries with LIMIT 1, which the planner runs
-- per message as a seek of outbox_key_idx. As NOT EXISTS it made them anti-joins and, with
-- statistics that saw few pending messages, compared every message of the window with every
-- pending one: cheap on the table it planned for, quadratic on the backlog the plan is kept
-- for. (With few keys and no delivered history the planner may check "earlier" by walking the
-- primary key up to the message, a message of the key every few rows: cheap there. A row
-- comparison on (state, id), which only the key index can serve, cost 60-80 us a check against
-- 9 here: PostgreSQL 15 reads the key's entries past it.) "In flight" is spelt
-- `state > 'pending'` beside the index's predicate (enum order: of the two, only inflight is
-- above pending), since `state = 'inflight'` matches the predicate of outbox_inflight_idx,
-- which the planner then read whole per message.
--
-- The keys of the picked messages are then locked and checked again under a fresh snapshot:
-- two relays claiming at once cannot both take a message of one key, whatever order the
-- producers committed in; a key whose lock another session holds is left to a later call. A
-- message of a key whose check fails stays locked, unclaimed, until the call ends. Answers the
-- messages in the order to deliver them, with the attempt this delivery is.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.relay_outbox(
    relay text,
    qty integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL
)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, headers jsonb, attempt integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Before the outbox has statistics (a new table, a burst after a quiet spell) the planner chose
-- a bitmap scan of every pending message and a sort, a call at 10,000 pending some twenty-five
-- times the ordered index walk. The walk is right at any size.
SET enable_bitmapscan = off
-- Nor a sequential scan, for the reason the claim pins it off (see there): plans kept from a
-- first call on an empty outbox read all of it on every call once it filled, three statements
-- a call, 60,000 messages each.
SET enable_seqscan = off
-- Every statement here is a walk of an index and seeks from it, and the window's heads are
-- locked as they come, in order, only as many as wanted. A generic plan costs the window as
-- 10,000 rows, and joined it to the outbox with a hash of the whole table (a sequential scan of
-- 300,000 messages a call, 110-150 ms against 5).
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_window integer;
    v_window_full boolean;
    v_heads bigint[];
    v_more bigint[];
    v_cursor text;
    v_walked text[];
    v_last_key text;
    v_picked bigint[];
    v_keys text[];
    v_busy_keys text[];
    v_lapsed boolean;
    -- A bound relay hands out its tenants' messages only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
BEGIN
    IF relay_outbox.relay IS NULL OR relay_outbox.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(relay_outbox.relay), 'NULL')),
            HINT = 'Pass an id unique to the relay process, such as host:pid:random.';
    END IF;
    PERFORM x_jobs._require_lease(
        relay_outbox.lease, 'Pass a lease longer than a delivery takes, such as ''30 seconds''.'
    );
    IF relay_outbox.qty IS NULL OR relay_outbox.qty < 1 OR relay_outbox.qty > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: qty %s is outside 1..1000',
                coalesce(relay_outbox.qty::text, 'NULL')),
            HINT = 'Pass how many messages the relay can deliver at once, from 1 to 1000.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: relay_outbox cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call relay_outbox in its own READ COMMITTED transaction (autocommit).';
    END IF;
    -- Room for the heads other relays are taking at the same time, small calls included.
    v_window := 10 * relay_outbox.qty + 100;

    -- The heads among the oldest due keyed messages, locked in order as they are found, passing
    -- over those another relay holds, until qty are held: the window is read as far as that
    -- takes, so relays calling at once take different heads. A head whose key another session
    -- holds (the key's advisory lock, see below) is passed over too, as it is found, so that it
    -- takes no place among the qty: were the heads cut to qty first, one such key at the front
    -- would leave a relay of qty 1 with nothing, call after call.
    v_heads := ARRAY(
        SELECT h.id
        FROM (
            SELECT o.id, w.key
            FROM (
                SELECT d.id, d.key, d.topic, d.available_at
                FROM x_jobs.outbox AS d
                WHERE d.state = 'pending' AND d.key IS NOT NULL
                    AND d.available_at <= v_now
                ORDER BY d.available_at, d.id
                LIMIT v_window
            ) AS w
            INNER JOIN x_jobs.outbox AS o ON o.id = w.id
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = w.key AND e.state = 'pending' AND e.id < w.id
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS earlier ON TRUE
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = w.key AND e.state > 'pending'
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS out ON TRUE
            WHERE (relay_outbox.topics IS NULL OR w.topic = ANY (relay_outbox.topics))
                AND earlier.id IS NULL
                AND out.id IS NULL
                AND o.state = 'pending'
            ORDER BY w.available_at, w.id
            FOR UPDATE OF o SKIP LOCKED
        ) AS h
        -- Above the row locks: the key's lock is tried only for a head this call holds.
        WHERE pg_catalog.pg_try_advisory_xact_lock(2024061705, pg_catalog.hashtext(h.key))
        LIMIT relay_outbox.qty
    );
    v_window_full := pg_catalog.cardinality(v_heads) < relay_outbox.qty AND v_window = (
        SELECT pg_catalog.count(*)
        FROM (
            SELECT FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NOT NULL
                AND o.available_at <= v_now
            ORDER BY o.available_at, o.id
            LIMIT v_window
        ) AS w
    );

    IF v_window_full THEN
        -- The window is mostly messages waiting behind their keys: visit the keys instead, a
        -- seek of outbox_key_idx from one key to the first entry of the next. That entry is the
        -- key's lowest pending message (its head), or one in flight when none is pending. At
        -- most v_window keys a call, from the key after the one the session's last visit ended
        -- on, wrapping around, so that a call costs the same beside 1,000 keys held back or
        -- 100,000, rather than visit them all. What it
        -- trades: heads go out key by key in walk order, not in put order across keys (their
        -- own key's order is kept), and a session that relays once starts at the first key.
        v_cursor := coalesce(pg_catalog.current_setting('x_jobs.relay_key_cursor', TRUE), '');
        v_walked := '{}';
        v_more := '{}';
        -- Two laps: the keys after the cursor, then from the first key up to the cursor.
        FOR v_lap IN 1..2 LOOP
            EXIT WHEN pg_catalog.cardinality(v_walked) >= v_window OR (v_lap = 2 AND v_cursor = '');
            SELECT v_walked || coalesce(pg_catalog.array_agg(w.key ORDER BY w.n), '{}'),
                   v_more || coalesce(pg_catalog.array_agg(w.id ORDER BY w.n) FILTER (WHERE w.head), '{}')
            INTO v_walked, v_more
            FROM (
                WITH RECURSIVE heads AS (
                    (
                        -- Keys are never empty, so '' is before the first one.
                        SELECT o.key, o.state, o.id, o.topic, o.available_at, 1 AS n
                        FROM x_jobs.outbox AS o
                        WHERE o.key > CASE WHEN v_lap = 1 THEN v_cursor ELSE '' END
                            AND o.key IS NOT NULL AND o.state IN ('pending', 'inflight')
                        ORDER BY o.key, o.state, o.id
                        LIMIT 1
                    )
                    UNION ALL
                    SELECT nx.*, h.n + 1
                    FROM heads AS h
                    CROSS JOIN LATERAL (
                        SELECT o.key, o.state, o.id, o.topic, o.available_at FROM x_jobs.outbox AS o
                        WHERE o.key > h.key AND o.key IS NOT NULL AND o.state IN ('pending', 'inflight')
                        ORDER BY o.key, o.state, o.id
                        LIMIT 1
                    ) AS nx
                    WHERE h.n < v_window - pg_catalog.cardinality(v_walked)
                        AND (v_lap = 1 OR h.key < v_cursor)
                )
                SELECT h.key, h.id, h.n,
                       h.state = 'pending'
                       AND h.available_at <= v_now
                       AND (relay_outbox.topics IS NULL OR h.topic = ANY (relay_outbox.topics))
                       AND out.id IS NULL AS head
                FROM heads AS h
                LEFT JOIN LATERAL (
                    SELECT e.id FROM x_jobs.outbox AS e
                    WHERE e.key = h.key AND e.state > 'pending'
                        AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                    LIMIT 1
                ) AS out ON TRUE
                WHERE v_lap = 1 OR h.key <= v_cursor
            ) AS w;
        END LOOP;
        -- Locked as the window's heads are, in walk order, busy keys passed over, to make up qty.
        SELECT v_heads || coalesce(pg_catalog.array_agg(t.id ORDER BY t.n), '{}'),
               (pg_catalog.array_agg(t.key ORDER BY t.n DESC))[1]
        INTO v_heads, v_last_key
        FROM (
            SELECT m.id, m.key, m.n
            FROM (
                SELECT o.id, o.key, h.n
                FROM unnest(v_more) WITH ORDINALITY AS h (id, n)
                INNER JOIN x_jobs.outbox AS o ON o.id = h.id
                WHERE o.state = 'pending' AND o.id <> ALL (v_heads)
                ORDER BY h.n
                FOR UPDATE OF o SKIP LOCKED
            ) AS m
            WHERE pg_catalog.pg_try_advisory_xact_lock(2024061705, pg_catalog.hashtext(m.key))
            LIMIT relay_outbox.qty - pg_catalog.cardinality(v_heads)
        ) AS t;
        -- The next visit starts after the last key this one took a head of when it got enough
        -- (the keys after it get their turn before it comes again), else after the last key it
        -- walked.
        IF pg_catalog.cardinality(v_walked) > 0 THEN
            PERFORM pg_catalog.set_config('x_jobs.relay_key_cursor',
                CASE WHEN pg_catalog.cardinality(v_heads) >= relay_outbox.qty THEN v_last_key
                     ELSE v_walked[pg_catalog.cardinality(v_walked)] END,
                FALSE);
        END IF;
    END IF;

    SELECT coalesce(pg_catalog.array_agg(p.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT p.key) FILTER (WHERE p.key IS NOT NULL), '{}'),
           coalesce(pg_catalog.bool_or(p.lapsed), FALSE)
    INTO v_picked, v_keys, v_lapsed
    FROM (
        WITH keyless AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NULL
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
                AND (v_scope IS NULL OR o.tenant_id = ANY (v_scope))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        ),
        -- Locked above already. A key's head of another tenant is not the bound relay's.
        keyed AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.id = ANY (v_heads)
                AND (v_scope IS NULL OR o.tenant_id = ANY (v_scope))
        ),
        lapsed AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'inflight'
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
                AND (v_scope IS NULL OR o.tenant_id = ANY (v_scope))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        )
        -- Rows an arm locked and this LIMIT drops stay locked until the call's transaction ends.
        SELECT a.id, a.key, a.available_at, FALSE AS lapsed FROM keyless AS a
        UNION ALL
        SELECT k.id, k.key, k.available_at, FALSE AS lapsed FROM keyed AS k
        UNION ALL
        SELECT l.id, l.key, l.available_at, TRUE AS lapsed FROM lapsed AS l
        ORDER BY 3, 1
        LIMIT relay_outbox.qty
    ) AS p;

    IF pg_catalog.cardinality(v_keys) > 0 THEN
        -- A relay whose snapshot predates another relay's claim of the same key could see that
        -- key free (two producers on one key, the lower id committing last). So: lock the keys
        -- and check them again in a statement whose snapshot comes after the locks, which sees
        -- every claim of these keys that held them before. It only tries, and leaves a key it
        -- cannot have now to a later call, as claim does: were it to wait, one session holding
        -- a key's lock (any login may take advisory locks) would stall every relay call,
        -- keyless messages and other keys included.
        v_busy_keys := ARRAY(
            SELECT k.key
            FROM unnest(v_keys) AS k (key)
            WHERE NOT pg_catalog.pg_try_advisory_xact_lock(2024061705, pg_catalog.hashtext(k.key))
        );

        v_picked := ARRAY(
            SELECT o.id
            FROM x_jobs.outbox AS o
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = o.key AND e.state = 'pending' AND e.id < o.id
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS earlier ON TRUE
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = o.key AND e.state > 'pending'
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS out ON TRUE
            WHERE o.id = ANY (v_picked)
                AND (o.key IS NULL OR o.key <> ALL (v_busy_keys))
                AND (o.key IS NULL OR o.state = 'inflight' OR (earlier.id IS NULL AND out.id IS NULL))
        );
    END IF;

    -- A message whose lease lapsed on its final attempt is not handed out again: a relay died
    -- (or outlived its lease) delivering it max_attempts times, and each redelivery could do the
    -- same while its key waited behind it. It is dead, for outbox_redrive, as a job is buried.
    IF v_lapsed THEN
        UPDATE x_jobs.outbox AS o
        SET state = 'dead',
            available_at = v_now,
            relay = NULL,
            last_error = 'lease lapsed on the final attempt'
        WHERE o.id = ANY (v_picked)
            AND o.state = 'inflight'
            AND o.attempt >= o.max_attempts;
    END IF;

    RETURN QUERY
    WITH taken AS (
        UPDATE x_jobs.outbox AS o
        SET state = 'inflight',
            attempt = o.attempt + 1,
            relay = relay_outbox.relay,
            available_at = v_now + relay_outbox.lease
        WHERE o.id = ANY (v_picked)
            AND o.state <> 'dead'
        RETURNING o.id, o.topic, o.key, o.payload, o.headers, o.attempt
    )
    SELECT t.id, t.topic, t.key, t.payload, t.headers, t.attempt FROM taken AS t ORDER BY t.id;
END
$$;

-- The messages `relay` delivered: answers the ids it held among `ids` (now delivered); a
-- missing id was not held (its lease lapsed and another relay took it): it goes out again.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_ack(ids bigint[], relay text)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- A bound relay settles its tenants' messages only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
    v_now timestamptz := x_jobs.now();
BEGIN
    IF outbox_ack.relay IS NULL OR outbox_ack.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_ack.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    RETURN QUERY
    UPDATE x_jobs.outbox AS o
    SET state = 'delivered', delivered_at = v_now, available_at = v_now
    WHERE o.id = ANY (outbox_ack.ids)
        AND o.state = 'inflight'
        AND o.relay = outbox_ack.relay
        AND (v_scope IS NULL OR o.tenant_id = ANY (v_scope))
    RETURNING o.id;
END
$$;

-- The relay's heartbeat: push the lease of the inflight messages `relay` holds among `ids` to
-- now + lease. Answers the ids still held; a missing one was lost (its lease lapsed and another
-- relay took it, or it was settled), and its delivery's ack will find it gone. Without it a
-- delivery slower than the lease was claimed again and sent a second time while it ran.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_extend_lease(ids bigint[], relay text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- A bound relay settles its tenants' messages only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
BEGIN
    IF outbox_extend_lease.relay IS NULL OR outbox_extend_lease.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_extend_lease.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    PERFORM x_jobs._require_lease(
        outbox_extend_lease.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );
    RETURN QUERY
    UPDATE x_jobs.outbox AS o
    SET available_at = x_jobs.now() + outbox_extend_lease.lease
    WHERE o.id = ANY (outbox_extend_lease.ids)
        AND o.state = 'inflight'
        AND o.relay = outbox_extend_lease.relay
        AND (v_scope IS NULL OR o.tenant_id = ANY (v_scope))
    RETURNING o.id;
END
$$;

-- A delivery failed. With attempts left (and retryable) the message waits until retry_at, or
-- its backoff: min(1 hour, 1 second * 2^(attempt - 1)) with equal jitter; the messages after it
-- in its key wait too. Else it is dead, kept for outbox_redrive. Answers the state it is in
-- now, or NULL when `relay` did not hold it (nothing changed).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.outbox_nack(
    id bigint,
    relay text,
    error text,
    retry_at timestamptz DEFAULT NULL,
    retryable boolean DEFAULT TRUE
)
RETURNS x_jobs.outbox_state
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- A bound relay settles its tenants' messages only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
    v_now timestamptz := x_jobs.now();
    v_state x_jobs.outbox_state;
BEGIN
    IF outbox_nack.relay IS NULL OR outbox_nack.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_nack.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    IF outbox_nack.error IS NULL OR outbox_nack.error = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ023',
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: message %s failed without an error message',
                coalesce(outbox_nack.id::text, 'NULL')),
            HINT = 'Pass what went wrong as error, such as the HTTP status and body.';
    END IF;
    -- As enqueue's run_at: an infinite retry_at would hold the message, and its key, for good.
    IF outbox_nack.retry_at < timestamptz '0001-01-01 00:00:00+00'
        OR outbox_nack.retry_at >= timestamptz '10000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ039',
            MESSAGE = pg_catalog.format('X_TIME_INVALID: retry_at %s is not a time to retry message %s',
                outbox_nack.retry_at, coalesce(outbox_nack.id::text, 'NULL')),
            HINT = 'Pass a time in the years 1 to 9999 (UTC), or leave retry_at out for the backoff.';
    END IF;

    UPDATE x_jobs.outbox AS o
    SET state = CASE
            WHEN NOT outbox_nack.retryable OR o.attempt >= o.max_attempts THEN 'dead'
            ELSE 'pending'
        END::x_jobs.outbox_state,
        available_at = CASE
            WHEN NOT outbox_nack.retryable OR o.attempt >= o.max_attempts THEN v_now
            ELSE greatest(v_now, coalesce(outbox_nack.retry_at,
                v_now + least(interval '1 hour', interval '1 second' * pg_catalog.power(2, least(o.attempt - 1, 20)))
                * (0.5 + pg_catalog.random() / 2)))
        END,
        relay = NULL,
        -- Cut, not refused, as fail cuts a job's error (see there).
        last_error = CASE WHEN pg_catalog.length(outbox_nack.error) > 65536
            THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
                pg_catalog.left(outbox_nack.error, 65536), pg_catalog.length(outbox_nack.error))
            ELSE outbox_nack.error
        END
    WHERE o.id = outbox_nack.id
        AND o.state = 'inflight'
        AND o.relay = outbox_nack.relay
        AND (v_scope IS NULL OR o.tenant_id = ANY (v_scope))
    RETURNING o.state INTO v_state;
    RETURN v_state;
END
$$;

-- Send dead messages again: back to pending, due now, with all their attempts. By id, or every
-- dead message of `topic` (up to max_rows, oldest first). A redriven message goes out after
-- any message of its key that is pending or in flight ahead of it. Answers how many.
CREATE FUNCTION x_jobs.outbox_redrive(
    ids bigint[] DEFAULT NULL,
    topic text DEFAULT NULL,
    max_rows integer DEFAULT 1000
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_count bigint;
    v_topics text[];
BEGIN
    IF outbox_redrive.max_rows IS NULL OR outbox_redrive.max_rows < 1 OR outbox_redrive.max_rows > 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..100000',
                coalesce(outbox_redrive.max_rows::text, 'NULL')),
            HINT = 'Redrive in batches of up to 100000, and call again for more.';
    END IF;

    -- Picked once, as an array: see purge (a rescan would pass over the rows already redriven
    -- and take more than max_rows).
    WITH redriven AS (
        UPDATE x_jobs.outbox AS o
        SET state = 'pending', attempt = 0, available_at = v_now, relay = NULL
        WHERE o.id = ANY (ARRAY(
            SELECT d.id FROM x_jobs.outbox AS d
            WHERE d.state = 'dead'
                AND (outbox_redrive.ids IS NULL OR d.id = ANY (outbox_redrive.ids))
                AND (outbox_redrive.topic IS NULL OR d.topic = outbox_redrive.topic)
            ORDER BY d.id
            LIMIT outbox_redrive.max_rows
            FOR UPDATE
        ))
        RETURNING o.topic
    )
    SELECT count(*), pg_catalog.array_agg(DISTINCT r.topic) INTO v_count, v_topics FROM redriven AS r;

    PERFORM pg_catalog.pg_notify('x_jobs_outbox', x_jobs._notify_tag('x_jobs_outbox', t.topic))
        FROM unnest(v_topics) AS t (topic);
    RETURN v_count;
END
$$;

-- Retention for the outbox: delete up to `batch_size` messages delivered before now -
-- older_than, lowest id first. Dead messages stay until redriven or deleted by hand.
CREATE FUNCTION x_jobs.purge_outbox(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('outbox', purge_outbox.older_than, purge_outbox.batch_size,
        'such as ''7 days''');

    -- Picked once, as an array: see purge.
    DELETE FROM x_jobs.outbox AS o
    WHERE o.id = ANY (ARRAY(
        SELECT k.id
        FROM x_jobs.outbox AS k
        WHERE k.state = 'delivered'
            AND k.delivered_at < x_jobs.now() - purge_outbox.older_than
        ORDER BY k.id
        LIMIT purge_outbox.batch_size
        FOR UPDATE SKIP LOCKED
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- The tenant a received webhook is recorded for, and its id unique within: the one its job is
-- stamped with, so that the ledger row and the job name one tenant. A receiver login bound to
-- tenants records for the request's tenant_id if it is one of them (else XJ060) or for its only
-- one; an unbound login for the request's tenant_id, else 'none'. STABLE: the scope is fixed for
-- a statement. Called by receive_webhook, as its owner; granted to nobody.
CREATE FUNCTION x_jobs._webhook_tenant(request jsonb)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(x_jobs._stamp_tenant(_webhook_tenant.request ->> 'tenant_id', x_jobs._tenant_scope()), 'none')
$$;

-- A webhook received from `source` with its sender's message id: in one transaction, the
-- ledger row and the job it becomes: `name`, `input` and `queue`, with the rest of the job's
-- enqueue request in `request` (max_attempts, priority, ... as enqueue_many takes them). A
-- webhook id seen before from the same source for the same tenant (x_jobs._webhook_tenant)
-- answers its first job with duplicate = true and enqueues nothing: a redelivery (senders
-- deliver at least once) becomes exactly one job. Another tenant's receipt of the same id is
-- its own.
--
-- Two receipts of one id at once are serialized by a transaction-scoped advisory lock on
-- (source, tenant, webhook id), and the ledger is read after it: the second waits for the
-- first to commit and then answers duplicate. READ COMMITTED only: a transaction snapshot would
-- not see the first receipt's commit.
--
-- Granted to x_jobs_webhook alone, the role of the receiver's login (see 05-roles.sql): whoever
-- records an id decides that the real delivery of it is a duplicate.
--
-- SECURITY DEFINER: the receiver's role holds no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.receive_webhook(
    source text,
    webhook_id text,
    name text,
    input jsonb DEFAULT NULL,
    queue text DEFAULT NULL,
    request jsonb DEFAULT NULL
)
RETURNS TABLE (job_id bigint, duplicate boolean)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job bigint;
    v_tenant text;
BEGIN
    IF receive_webhook.source IS NULL OR receive_webhook.source = ''
        OR receive_webhook.webhook_id IS NULL OR receive_webhook.webhook_id = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ037',
            MESSAGE = pg_catalog.format('X_WEBHOOK_INVALID: webhook source %s and id %s must both be given',
                coalesce(pg_catalog.quote_literal(receive_webhook.source), 'NULL'),
                coalesce(pg_catalog.quote_literal(receive_webhook.webhook_id), 'NULL')),
            HINT = 'Pass the sender''s name as source and its webhook-id header as webhook_id.';
    END IF;
    -- Both are the ledger's primary key: past a btree entry's size (about 2.7 kB) an insert
    -- failed with a bare 54000, answered 500, and the sender retried it for ever.
    IF pg_catalog.length(receive_webhook.source) > 200 OR pg_catalog.length(receive_webhook.webhook_id) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ037',
            MESSAGE = pg_catalog.format('X_WEBHOOK_INVALID: webhook source %s or id %s is longer than 200 characters',
                pg_catalog.quote_literal(pg_catalog.left(receive_webhook.source, 210)),
                pg_catalog.quote_literal(pg_catalog.left(receive_webhook.webhook_id, 210))),
            HINT = 'Pass the sender''s name and its webhook-id header, each of 1 to 200 characters.';
    END IF;
    IF receive_webhook.request IS NOT NULL AND pg_catalog.jsonb_typeof(receive_webhook.request) <> 'object' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ009',
            MESSAGE = pg_catalog.format('X_JOBS_INVALID: request %s is not an object', receive_webhook.request),
            HINT = 'Pass the job''s options as an object with enqueue_many''s fields, such as {"max_attempts": 5}.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: receive_webhook cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Receive webhooks in READ COMMITTED transactions (the default).';
    END IF;

    v_tenant := x_jobs._webhook_tenant(receive_webhook.request);
    -- Keyed by all three: a hash collision (or a \x1f inside a name that shifts the boundary)
    -- only serializes two receipts, which the ledger lookup below still tells apart.
    PERFORM pg_catalog.pg_advisory_xact_lock(2024061704,
        pg_catalog.hashtext(receive_webhook.source || E'\x1f' || v_tenant || E'\x1f' || receive_webhook.webhook_id));

    SELECT l.job_id INTO v_job
    FROM x_jobs.webhook_ledger AS l
    WHERE l.source = receive_webhook.source AND l.tenant_id = v_tenant
        AND l.webhook_id = receive_webhook.webhook_id;
    IF FOUND THEN
        RETURN QUERY SELECT v_job, TRUE;
        RETURN;
    END IF;

    SELECT e.id INTO v_job
    FROM x_jobs.enqueue_many(pg_catalog.jsonb_build_array(
        coalesce(receive_webhook.request, '{}')
        || pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
            'name', receive_webhook.name, 'queue', receive_webhook.queue))
        || CASE WHEN receive_webhook.input IS NULL THEN '{}'
            ELSE pg_catalog.jsonb_build_object('input', receive_webhook.input) END
    )) AS e;
    INSERT INTO x_jobs.webhook_ledger (source, webhook_id, received_at, job_id, tenant_id)
    VALUES (receive_webhook.source, receive_webhook.webhook_id, x_jobs.now(), v_job, v_tenant);
    RETURN QUERY SELECT v_job, FALSE;
END
$$;

-- Retention for the webhook ledger: delete up to `batch_size` rows received before now -
-- older_than, oldest first. Keep them longer than senders retry (days): a webhook redelivered
-- after its row is gone becomes a second job. Run one purger at a time (no row locks).
CREATE FUNCTION x_jobs.purge_webhook_ledger(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('webhooks', purge_webhook_ledger.older_than, purge_webhook_ledger.batch_size,
        'longer than senders retry, such as ''30 days''');

    -- The batch is picked once, as an array, as purge picks its own (see there). By ctid: the
    -- rows are only ever inserted and deleted, and a TID scan reaches each at once.
    DELETE FROM x_jobs.webhook_ledger AS l
    WHERE l.ctid = ANY (ARRAY(
        SELECT k.ctid
        FROM x_jobs.webhook_ledger AS k
        WHERE k.received_at < x_jobs.now() - purge_webhook_ledger.older_than
        ORDER BY k.received_at
        LIMIT purge_webhook_ledger.batch_size
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- Tests: tests/pgtap/36-outbox.sql, tests/pgtap/60-retention.sql, tests/python/test_outbox_sql.py,
--        tests/python/test_relay.py, tests/python/test_webhooks.py, tests/pgtap/39-webhooks.sql,
--        tests/python/test_webhooks_hardening.py
