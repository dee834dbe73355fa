-- The transactional outbox and the webhook ledger. outbox_put and outbox_put_many write pending
-- messages (ids in input order, with their defaults); relay_outbox hands a relay the oldest due
-- messages, at most one per key in flight (a key's next message waits until the one before it is
-- delivered, or dead), keyless messages all at once, filtered by topic, and hands lapsed leases
-- out again; outbox_ack and outbox_nack settle them, only by the relay that holds them (a nack
-- backs off, honours retry_at, or buries); outbox_redrive sends dead messages again;
-- purge_outbox deletes old delivered messages in bounded batches; receive_webhook turns a
-- webhook into one job however often it is redelivered, and purge_webhook_ledger forgets old
-- webhooks. Every refusal, with its SQLSTATE, message and HINT. Each scenario has topics (and
-- keys) of its own, and every relay_outbox call names its topics, so no scenario sees another's
-- messages; a message's payload carries its tag. The clock is moved with SET LOCAL
-- "x_jobs.fake_now". The NOTIFY the puts send, and everything that takes two sessions, is in
-- tests/python/test_outbox_sql.py.

-- The isolation refusals need a transaction whose isolation is set before its first query, which
-- the test transaction below cannot be (relay_outbox and receive_webhook must run at READ
-- COMMITTED). So they run first, in two short transactions of their own that change no shared
-- row (both functions refuse before they read or write anything, and tap_helpers.caught rolls
-- the call back): what they caught is kept in a temporary table, private to this session, and
-- asserted inside the test transaction.
SET default_transaction_isolation = 'repeatable read';
BEGIN;

CREATE TEMP TABLE isolation_refusal AS
SELECT
    'relay_outbox' AS fn,
    'repeatable read' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.relay_outbox('isolation-relay') $$) AS c;
INSERT INTO isolation_refusal
SELECT
    'receive_webhook' AS fn,
    'repeatable read' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.receive_webhook('t36', 'isolation', 't36_webhook') $$) AS c;
COMMIT;

SET default_transaction_isolation = 'serializable';
BEGIN;
INSERT INTO isolation_refusal
SELECT
    'relay_outbox' AS fn,
    'serializable' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.relay_outbox('isolation-relay') $$) AS c;
INSERT INTO isolation_refusal
SELECT
    'receive_webhook' AS fn,
    'serializable' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.receive_webhook('t36', 'isolation', 't36_webhook') $$) AS c;
COMMIT;

RESET default_transaction_isolation;
BEGIN;
SELECT plan(192);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- Puts a message whose payload is {"tag": p_tag}; answers its id.
CREATE FUNCTION pg_temp.put(p_topic text, p_tag text, p_key text DEFAULT NULL, p_max_attempts integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
VOLATILE
AS $$
    SELECT x_jobs.outbox_put(p_topic, pg_catalog.jsonb_build_object('tag', p_tag), p_key,
        max_attempts => p_max_attempts)
$$;

-- The id of the message of a tag.
CREATE FUNCTION pg_temp.mid(p_tag text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$ SELECT o.id FROM x_jobs.outbox AS o WHERE o.payload ->> 'tag' = p_tag $$;

-- The ids of the messages of some tags.
CREATE FUNCTION pg_temp.mids(p_tags text[])
RETURNS bigint[]
LANGUAGE sql
STABLE
AS $$
    SELECT pg_catalog.array_agg(o.id ORDER BY o.id) FROM x_jobs.outbox AS o WHERE o.payload ->> 'tag' = ANY (p_tags)
$$;

-- One relay_outbox call for `p_relay` over one topic: answers the tags it handed out, in the
-- order it answered them ('{}' for none).
CREATE FUNCTION pg_temp.relay(
    p_relay text, p_topic text, p_qty integer DEFAULT 100, p_lease interval DEFAULT '30 seconds'
)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    v_tags text[] := '{}';
    v_row record;
BEGIN
    FOR v_row IN SELECT r.payload ->> 'tag' AS tag FROM x_jobs.relay_outbox(p_relay, p_qty, p_lease, ARRAY[p_topic]) AS r
    LOOP
        v_tags := v_tags || v_row.tag;
    END LOOP;
    RETURN v_tags;
END
$$;

-- Acks the messages of some tags for `p_relay`: answers the tags the ack answered, in tag order.
CREATE FUNCTION pg_temp.ack(p_relay text, p_tags text[])
RETURNS text[]
LANGUAGE sql
VOLATILE
AS $$
    SELECT coalesce(pg_catalog.array_agg(o.payload ->> 'tag' ORDER BY o.payload ->> 'tag'), '{}')
    FROM x_jobs.outbox_ack(pg_temp.mids(p_tags), p_relay) AS a (id)
    INNER JOIN x_jobs.outbox AS o ON a.id = o.id
$$;

-- The state of the message of a tag, as (state, attempt, relay, available_at, last_error).
CREATE FUNCTION pg_temp.held(p_tag text)
RETURNS TABLE (state text, attempt integer, relay text, available_at timestamptz, last_error text)
LANGUAGE sql
STABLE
AS $$
    SELECT o.state::text, o.attempt, o.relay, o.available_at, o.last_error
    FROM x_jobs.outbox AS o WHERE o.payload ->> 'tag' = p_tag
$$;

------------------------------------------------------------------------------------------------
-- outbox_put and outbox_put_many
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE put_one AS
SELECT x_jobs.outbox_put('t36-put', '{"tag": "p1"}') AS id;

SELECT results_eq(
    $$
    SELECT o.topic, o.key, o.headers, o.payload, o.state::text, o.attempt, o.max_attempts, o.created_at,
           o.available_at, o.relay, o.delivered_at, o.last_error
    FROM x_jobs.outbox AS o INNER JOIN put_one AS p ON o.id = p.id
    $$,
    $$
    VALUES ('t36-put', NULL::text, '{}'::jsonb, '{"tag": "p1"}'::jsonb, 'pending', 0, 10,
            timestamptz '2030-01-01 12:00:00+00', timestamptz '2030-01-01 12:00:00+00', NULL::text,
            NULL::timestamptz, NULL::text)
    $$,
    'outbox_put should store a pending message due now, on attempt 0, with headers {} and 10 attempts'
);

SELECT is(
    x_jobs.outbox_put('t36-put', '{"tag": "p2"}', 'k-put', '{"x-tenant": "acme"}', 3),
    (SELECT p.id + 1 FROM put_one AS p),
    'outbox_put should answer the id of the message it put'
);

SELECT results_eq(
    $$ SELECT o.key, o.headers, o.max_attempts FROM x_jobs.outbox AS o WHERE o.id = pg_temp.mid('p2') $$,
    $$ VALUES ('k-put', '{"x-tenant": "acme"}'::jsonb, 3) $$,
    'outbox_put should store the key, headers and max_attempts it was given'
);

CREATE TEMP TABLE put_many AS
SELECT m.*
FROM x_jobs.outbox_put_many($$[
    {"topic": "t36-many", "payload": {"tag": "pm1"}},
    {"topic": "t36-many", "payload": {"tag": "pm2"}, "key": "k-many", "headers": {"h": "v"}, "max_attempts": 2},
    {"topic": "t36-many-2", "payload": {"tag": "pm3"}, "key": "k-many"},
    {"topic": "t36-many", "payload": null}
]$$) AS m;

SELECT results_eq(
    $$
    SELECT p.ord, o.topic, o.key, o.headers, o.payload, o.state::text, o.attempt, o.max_attempts, o.available_at
    FROM put_many AS p INNER JOIN x_jobs.outbox AS o ON p.id = o.id
    ORDER BY p.ord
    $$,
    $$
    VALUES
        (1, 't36-many', NULL::text, '{}'::jsonb, '{"tag": "pm1"}'::jsonb, 'pending', 0, 10,
         timestamptz '2030-01-01 12:00:00+00'),
        (2, 't36-many', 'k-many', '{"h": "v"}', '{"tag": "pm2"}', 'pending', 0, 2, '2030-01-01 12:00:00+00'),
        (3, 't36-many-2', 'k-many', '{}', '{"tag": "pm3"}', 'pending', 0, 10, '2030-01-01 12:00:00+00'),
        (4, 't36-many', NULL, '{}', 'null', 'pending', 0, 10, '2030-01-01 12:00:00+00')
    $$,
    'outbox_put_many should put every message with its fields and the defaults, and answer each by ord'
);

SELECT is(
    (SELECT pg_catalog.array_agg(p.id ORDER BY p.ord) = pg_catalog.array_agg(p.id ORDER BY p.id) FROM put_many AS p),
    TRUE,
    'outbox_put_many should draw ids in input order, so a key''s messages go out in the order given'
);

SELECT is_empty(
    $$ SELECT * FROM x_jobs.outbox_put_many('[]') $$,
    'outbox_put_many of an empty array should put nothing and answer nothing'
);

------------------------------------------------------------------------------------------------
-- Refusals
------------------------------------------------------------------------------------------------

SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put(NULL, '{}') $$,
    'XJ034', 'X_TOPIC_INVALID: topic NULL is missing, empty or longer than 200 characters',
    'A put without a topic should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put('', '{}') $$,
    'XJ034', 'X_TOPIC_INVALID: topic '''' is missing, empty or longer than 200 characters',
    'A put with an empty topic should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put(repeat('t', 201), '{}') $$,
    'XJ034', 'X_TOPIC_INVALID: topic ''' || repeat('t', 201) || ''' is missing, empty or longer than 200 characters',
    'A put with a topic longer than 200 characters should be refused'
);
SELECT lives_ok(
    $$ SELECT x_jobs.outbox_put(repeat('t', 200), '{"tag": "long-topic"}') $$,
    'A put with a topic of 200 characters should be accepted'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused', NULL) $$,
    'XJ035', 'X_MESSAGE_INVALID: message of topic ''t36-refused'' has no payload',
    'A put without a payload should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused', '{}', headers => '["a"]') $$,
    'XJ035', 'X_MESSAGE_INVALID: headers ["a"] are not an object of strings',
    'A put whose headers are not an object should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused', '{}', headers => '{"a": "b", "n": 1}') $$,
    'XJ035', 'X_MESSAGE_INVALID: headers {"a": "b", "n": 1} are not an object of strings',
    'A put whose headers hold a value that is not a string should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused', '{}', max_attempts => 0) $$,
    'XJ004', 'X_MAX_ATTEMPTS_INVALID: max_attempts 0 is below 1',
    'A put with max_attempts below 1 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many(NULL) $$,
    'XJ035', 'X_MESSAGE_INVALID: messages NULL are not an array of objects',
    'outbox_put_many of NULL should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('{"topic": "t36-refused", "payload": {}}') $$,
    'XJ035', 'X_MESSAGE_INVALID: messages {"topic": "t36-refused", "payload": {}} are not an array of objects',
    'outbox_put_many of an object should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}}, 1]') $$,
    'XJ035', 'X_MESSAGE_INVALID: messages [{"topic": "t36-refused", "payload": {}}, 1] are not an array of objects',
    'outbox_put_many of an array holding something other than an object should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}}, {"topic": "t36-refused"}]') $$,
    'XJ035', 'X_MESSAGE_INVALID: message of topic ''t36-refused'' has no payload',
    'outbox_put_many with a message without a payload should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}, "max_attempts": 0}]') $$,
    'XJ004', 'X_MAX_ATTEMPTS_INVALID: max_attempts 0 is below 1',
    'outbox_put_many with a message whose max_attempts is below 1 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"payload": {}}]') $$,
    'XJ034', 'X_TOPIC_INVALID: topic NULL is missing, empty or longer than 200 characters',
    'outbox_put_many with a message without a topic should be refused'
);
-- A field outbox_put has no parameter for is refused, not dropped: a misspelt key would put the
-- message unordered. So is a key or max_attempts of the wrong JSON type.
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message, c.err_hint
    FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}},
                                               {"topic": "t36-refused", "payload": {}, "kye": "k"}]')
    $q$) AS c
    $$,
    $$ VALUES ('XJ035', 'X_MESSAGE_INVALID: message 2 has an unknown field ''kye''',
               'A message has topic, payload, key, headers and max_attempts: check the spelling of the others.') $$,
    'outbox_put_many with a misspelt field should be refused, naming the message and the field, with a HINT'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}, "key": 7}]') $$,
    'XJ035', 'X_MESSAGE_INVALID: key 7 of message 1 is not a string',
    'outbox_put_many with a key that is not a string should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}, "max_attempts": "abc"}]') $$,
    'XJ035', 'X_MESSAGE_INVALID: max_attempts "abc" of message 1 is not a whole number of attempts',
    'outbox_put_many with a max_attempts that is not a number should be refused with its code, not a cast error'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}, "max_attempts": 2.5}]') $$,
    'XJ035', 'X_MESSAGE_INVALID: max_attempts 2.5 of message 1 is not a whole number of attempts',
    'outbox_put_many with a fractional max_attempts should be refused'
);
SELECT is_empty(
    $$ SELECT * FROM x_jobs.outbox AS o WHERE o.topic = 't36-refused' $$,
    'A refused put should leave no message, not even the valid messages of its batch'
);

SET LOCAL "x_jobs.max_payload_bytes" = 100;
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE 'X_PAYLOAD_TOO_LARGE: payload of % bytes exceeds the limit of 100',
           c.err_detail
    FROM tap_helpers.caught($q$ SELECT x_jobs.outbox_put('t36-refused', jsonb_build_object('x', repeat('a', 200))) $q$)
        AS c
    $$,
    $$ VALUES ('XJ003', TRUE, 'For a message of topic ''t36-refused''.') $$,
    'A put of a payload larger than x_jobs.max_payload_bytes should be refused, naming its topic in DETAIL'
);
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE 'X_PAYLOAD_TOO_LARGE: payload of % bytes exceeds the limit of 100'
    FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.outbox_put_many(jsonb_build_array(
            jsonb_build_object('topic', 't36-refused', 'payload', jsonb_build_object('x', repeat('a', 200)))))
    $q$) AS c
    $$,
    $$ VALUES ('XJ003', TRUE) $$,
    'outbox_put_many with a payload larger than x_jobs.max_payload_bytes should be refused'
);
SELECT lives_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused-small', '{"tag": "small"}') $$,
    'A put of a payload under x_jobs.max_payload_bytes should be accepted'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';

-- Headers count with the payload (0.3.8): 50 MB of headers passed beside a small payload.
SET LOCAL "x_jobs.max_payload_bytes" = 100;
SELECT results_eq(
    $$
    SELECT c.err_state,
           c.err_message
           LIKE 'X_PAYLOAD_TOO_LARGE: payload of % bytes with headers of % bytes exceeds the limit of 100',
           c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$
        SELECT x_jobs.outbox_put('t36-refused', '{}', headers => jsonb_build_object('h', repeat('a', 200)))
    $q$) AS c
    $$,
    $$ VALUES ('XJ003', TRUE, 'For a message of topic ''t36-refused''.',
               'Put a reference to large data in the message, or raise x_jobs.max_payload_bytes.') $$,
    'A put whose headers take it past x_jobs.max_payload_bytes should be refused, naming both sizes'
);
SELECT throws_like(
    $$
    SELECT * FROM x_jobs.outbox_put_many(jsonb_build_array(jsonb_build_object(
        'topic', 't36-refused', 'payload', '{}'::jsonb, 'headers', jsonb_build_object('h', repeat('a', 200)))))
    $$,
    'X_PAYLOAD_TOO_LARGE: payload of % bytes with headers of % bytes exceeds the limit of 100',
    'outbox_put_many should count the headers with the payload too'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';
SELECT throws_like(
    $$ SELECT x_jobs.outbox_put('t36-refused', '{}', headers => jsonb_build_object('h', repeat('a', 2000000))) $$,
    'X_PAYLOAD_TOO_LARGE: payload of % bytes with headers of % bytes exceeds the limit of 1048576',
    'Headers of 2 MB beside an empty payload should be refused under the default limit'
);

-- A key is in outbox_key_idx (0.3.8): 6,400 incompressible characters failed with a bare 54000.
CREATE TEMP TABLE long_text AS
SELECT string_agg(md5(g.i::text), '' ORDER BY g.i) AS v FROM generate_series(1, 200) AS g (i);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$
        SELECT x_jobs.outbox_put('t36-refused', '{}', key => (SELECT v FROM long_text))
    $q$) AS c
    $$,
    $$ VALUES ('XJ035',
               'X_MESSAGE_INVALID: key ''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... '
               'is 6400 characters, longer than 400',
               'For a message of topic ''t36-refused''.',
               'Key messages with a short text, such as an order id (up to 400 characters): hash a longer one.') $$,
    'A put with a key of 6,400 characters should be refused with X_MESSAGE_INVALID, its length and a HINT'
);
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message, c.err_hint FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.outbox_put_many(jsonb_build_array(
            jsonb_build_object('topic', 't36-refused', 'payload', '{}'::jsonb),
            jsonb_build_object('topic', 't36-refused', 'payload', '{}'::jsonb, 'key', (SELECT v FROM long_text))))
    $q$) AS c
    $$,
    $$ VALUES ('XJ035',
               'X_MESSAGE_INVALID: key ''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... '
               'of message 2 is 6400 characters, longer than 400',
               'Key messages with a short text, such as an order id (up to 400 characters): hash a longer one.') $$,
    'outbox_put_many with a key of 6,400 characters should be refused, naming the message'
);
SELECT lives_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused-edge', '{"tag": "edge"}', key => repeat('🔑', 400)) $$,
    'A key of 400 four-byte characters should be accepted'
);

-- The topic must be a JSON string (0.3.8): ->> took an object or a number as its JSON text.
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message, c.err_hint FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.outbox_put_many('[{"topic": {"a": 1}, "payload": {}}]')
    $q$) AS c
    $$,
    $$ VALUES ('XJ035', 'X_MESSAGE_INVALID: topic {"a": 1} of message 1 is not a string',
               'Pass the topic as a string, such as "orders.created".') $$,
    'outbox_put_many with a topic that is a JSON object should be refused, with a HINT'
);
SELECT throws_ok(
    $$
    SELECT * FROM x_jobs.outbox_put_many('[{"topic": "t36-refused", "payload": {}}, {"topic": 5, "payload": {}}]')
    $$,
    'XJ035', 'X_MESSAGE_INVALID: topic 5 of message 2 is not a string',
    'outbox_put_many with a topic that is a JSON number should be refused'
);

-- A malformed x_jobs.max_payload_bytes is refused by its own code (0.3.8), not a bare cast error.
SET LOCAL "x_jobs.max_payload_bytes" = 'abc';
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_put('t36-refused', '{}') $$,
    'XJ040',
    'X_SETTING_INVALID: x_jobs.max_payload_bytes ''abc'' is not a whole number of bytes from 1 to 2147483647',
    'A put under a max_payload_bytes of ''abc'' should be refused with X_SETTING_INVALID'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.relay_outbox(NULL) $$,
    'XJ036', 'X_RELAY_INVALID: relay id NULL is empty',
    'relay_outbox without a relay id should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.relay_outbox('') $$,
    'XJ036', 'X_RELAY_INVALID: relay id '''' is empty',
    'relay_outbox with an empty relay id should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.relay_outbox('r', lease => '0 seconds') $$,
    'XJ012', 'X_LEASE_INVALID: lease 00:00:00 is not positive',
    'relay_outbox with a lease of zero should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.relay_outbox('r', lease => NULL) $$,
    'XJ012', 'X_LEASE_INVALID: lease NULL is not positive',
    'relay_outbox without a lease should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.relay_outbox('r', qty => 0) $$,
    'XJ013', 'X_QTY_INVALID: qty 0 is outside 1..1000',
    'relay_outbox with qty 0 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.relay_outbox('r', qty => 1001) $$,
    'XJ013', 'X_QTY_INVALID: qty 1001 is outside 1..1000',
    'relay_outbox with qty over 1000 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.outbox_ack(ARRAY[1]::bigint [], '') $$,
    'XJ036', 'X_RELAY_INVALID: relay id '''' is empty',
    'outbox_ack with an empty relay id should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_nack(1, NULL, 'boom') $$,
    'XJ036', 'X_RELAY_INVALID: relay id NULL is empty',
    'outbox_nack without a relay id should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_nack(12345, 'r', NULL) $$,
    'XJ023', 'X_ERROR_MISSING: message 12345 failed without an error message',
    'outbox_nack without an error should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_nack(12345, 'r', '') $$,
    'XJ023', 'X_ERROR_MISSING: message 12345 failed without an error message',
    'outbox_nack with an empty error should be refused'
);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$ SELECT x_jobs.outbox_nack(id => NULL, relay => 'r', error => '') $q$) AS c
    $$,
    $$ VALUES ('XJ023', 'X_ERROR_MISSING: message NULL failed without an error message', '',
               'Pass what went wrong as error, such as the HTTP status and body.') $$,
    'outbox_nack without an id or an error should name the id as NULL (0.3.8: it read "message  failed")'
);
SELECT throws_ok(
    $$ SELECT x_jobs.outbox_redrive(max_rows => 0) $$,
    'XJ013', 'X_QTY_INVALID: max_rows 0 is outside 1..100000',
    'outbox_redrive with max_rows 0 should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.purge_outbox(NULL) $$,
    'XJ020', 'X_RETENTION_INVALID: purge outbox older than NULL in batches of 10000',
    'purge_outbox without an age should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.purge_outbox('-1 day') $$,
    'XJ020', 'X_RETENTION_INVALID: purge outbox older than -1 days in batches of 10000',
    'purge_outbox with a negative age should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.purge_outbox('1 day', 0) $$,
    'XJ020', 'X_RETENTION_INVALID: purge outbox older than 1 day in batches of 0',
    'purge_outbox with a batch below 1 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.receive_webhook(NULL, 'evt', 't36_webhook') $$,
    'XJ037', 'X_WEBHOOK_INVALID: webhook source NULL and id ''evt'' must both be given',
    'receive_webhook without a source should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.receive_webhook('', 'evt', 't36_webhook') $$,
    'XJ037', 'X_WEBHOOK_INVALID: webhook source '''' and id ''evt'' must both be given',
    'receive_webhook with an empty source should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.receive_webhook('stripe', NULL, 't36_webhook') $$,
    'XJ037', 'X_WEBHOOK_INVALID: webhook source ''stripe'' and id NULL must both be given',
    'receive_webhook without a webhook id should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.receive_webhook('stripe', '', 't36_webhook') $$,
    'XJ037', 'X_WEBHOOK_INVALID: webhook source ''stripe'' and id '''' must both be given',
    'receive_webhook with an empty webhook id should be refused'
);
SELECT throws_ok(
    pg_catalog.format(
        $$ SELECT * FROM x_jobs.receive_webhook('stripe', %L, 't36_webhook') $$, pg_catalog.repeat('i', 3000)
    ),
    'XJ037',
    pg_catalog.format(
        'X_WEBHOOK_INVALID: webhook source ''stripe'' or id %L is longer than 200 characters',
        pg_catalog.repeat('i', 210)
    ),
    'receive_webhook with a webhook id of 3000 characters should be refused (it was a bare btree error)'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.receive_webhook('stripe', 'evt', 't36_webhook', request => '[1]') $$,
    'XJ009', 'X_JOBS_INVALID: request [1] is not an object',
    'receive_webhook with a request that is not an object should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.receive_webhook('stripe', 'evt', 't36_webhook', request => '{"que": "q"}') $$,
    'XJ009', 'X_JOBS_INVALID: request 1 has an unknown field ''que''',
    'receive_webhook with a request holding an unknown field should be refused, as enqueue_many refuses it'
);
SELECT throws_ok(
    $$ SELECT x_jobs.purge_webhook_ledger('-1 day') $$,
    'XJ020', 'X_RETENTION_INVALID: purge webhooks older than -1 days in batches of 10000',
    'purge_webhook_ledger with a negative age should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.purge_webhook_ledger('1 day', 0) $$,
    'XJ020', 'X_RETENTION_INVALID: purge webhooks older than 1 day in batches of 0',
    'purge_webhook_ledger with a batch below 1 should be refused'
);
SELECT is_empty(
    $$ SELECT * FROM x_jobs.webhook_ledger AS l WHERE l.source = 'stripe' $$,
    'A refused receipt should leave no ledger row'
);

-- Every refusal: its SQLSTATE, a message that starts with the X_ code x_jobs.error_codes() lists
-- for it, and a HINT that says what to do.
CREATE TEMP TABLE refusal (n integer PRIMARY KEY, stmt text NOT NULL);
INSERT INTO refusal (n, stmt) VALUES
(1, $$ SELECT x_jobs.outbox_put('', '{}') $$),
(2, $$ SELECT x_jobs.outbox_put('t36-refused', NULL) $$),
(3, $$ SELECT x_jobs.outbox_put('t36-refused', '{}', headers => '{"n": 1}') $$),
(4, $$ SELECT * FROM x_jobs.outbox_put_many('{}') $$),
(5, $$ SELECT x_jobs.outbox_put('t36-refused', '{}', max_attempts => 0) $$),
(6, $$ SELECT * FROM x_jobs.relay_outbox('') $$),
(7, $$ SELECT * FROM x_jobs.relay_outbox('r', lease => '-1 second') $$),
(8, $$ SELECT * FROM x_jobs.relay_outbox('r', qty => 0) $$),
(9, $$ SELECT * FROM x_jobs.outbox_ack('{}', NULL) $$),
(10, $$ SELECT x_jobs.outbox_nack(1, '', 'boom') $$),
(11, $$ SELECT x_jobs.outbox_nack(1, 'r', NULL) $$),
(12, $$ SELECT x_jobs.outbox_redrive(max_rows => 100001) $$),
(13, $$ SELECT x_jobs.purge_outbox('1 day', NULL) $$),
(14, $$ SELECT * FROM x_jobs.receive_webhook('stripe', NULL, 't36_webhook') $$),
(16, $$ SELECT * FROM x_jobs.receive_webhook('stripe', 'evt', 't36_webhook', request => '"q"') $$),
(17, $$ SELECT x_jobs.purge_webhook_ledger(NULL) $$),
(18, $$ SELECT x_jobs.outbox_nack(1, 'r', 'boom', retry_at => 'infinity') $$),
(19, $$ SELECT * FROM x_jobs.receive_webhook('stripe', repeat('i', 201), 't36_webhook') $$);
SET LOCAL "x_jobs.max_payload_bytes" = 100;
INSERT INTO refusal (n, stmt) VALUES
(15, $$ SELECT x_jobs.outbox_put('t36-refused', jsonb_build_object('x', repeat('a', 200))) $$);

SELECT results_eq(
    $$
    SELECT r.n, c.err_state, c.err_message LIKE e.code || ': %', c.err_hint
    FROM refusal AS r
    CROSS JOIN LATERAL tap_helpers.caught(r.stmt) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    ORDER BY r.n
    $$,
    $$
    VALUES
        (1, 'XJ034', TRUE, 'Name the topic the relays route by, such as ''orders.created''.'),
        (2, 'XJ035', TRUE, 'Pass a JSON payload (use ''null''::jsonb for a message that carries nothing).'),
        (3, 'XJ035', TRUE, 'Pass headers as a JSON object of string values, such as ''{"x-tenant": "acme"}''.'),
        (4, 'XJ035', TRUE, 'Pass a JSON array of objects such as [{"topic": "t", "payload": {}, "key": "k"}].'),
        (5, 'XJ004', TRUE, 'Pass 1 or more, or NULL for the default of 10.'),
        (6, 'XJ036', TRUE, 'Pass an id unique to the relay process, such as host:pid:random.'),
        (7, 'XJ012', TRUE, 'Pass a lease longer than a delivery takes, such as ''30 seconds''.'),
        (8, 'XJ013', TRUE, 'Pass how many messages the relay can deliver at once, from 1 to 1000.'),
        (9, 'XJ036', TRUE, 'Pass the id the relay claimed with.'),
        (10, 'XJ036', TRUE, 'Pass the id the relay claimed with.'),
        (11, 'XJ023', TRUE, 'Pass what went wrong as error, such as the HTTP status and body.'),
        (12, 'XJ013', TRUE, 'Redrive in batches of up to 100000, and call again for more.'),
        (13, 'XJ020', TRUE, 'Pass an age from zero to 1000 years, such as ''7 days'', and a batch size of 1 or more.'),
        (14, 'XJ037', TRUE, 'Pass the sender''s name as source and its webhook-id header as webhook_id.'),
        (15, 'XJ003', TRUE, 'Put a reference to large data in the message, or raise x_jobs.max_payload_bytes.'),
        (16, 'XJ009', TRUE,
         'Pass the job''s options as an object with enqueue_many''s fields, such as {"max_attempts": 5}.'),
        (17, 'XJ020', TRUE, 'Pass an age from zero to 1000 years, longer than senders retry, such as ''30 days'', and a batch size of 1 or more.'),
        (18, 'XJ039', TRUE, 'Pass a time in the years 1 to 9999 (UTC), or leave retry_at out for the backoff.'),
        (19, 'XJ037', TRUE, 'Pass the sender''s name and its webhook-id header, each of 1 to 200 characters.')
    $$,
    'Every refusal should raise its SQLSTATE, with a message that starts with its X_ code and a HINT'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';

SELECT results_eq(
    $$
    SELECT iso_level, err_state, err_message, err_hint FROM isolation_refusal WHERE fn = 'relay_outbox' ORDER BY iso_level
    $$,
    $$
    VALUES
        ('repeatable read', 'XJ022',
         'X_ISOLATION_UNSUPPORTED: relay_outbox cannot run at isolation level repeatable read',
         'Call relay_outbox in its own READ COMMITTED transaction (autocommit).'),
        ('serializable', 'XJ022',
         'X_ISOLATION_UNSUPPORTED: relay_outbox cannot run at isolation level serializable',
         'Call relay_outbox in its own READ COMMITTED transaction (autocommit).')
    $$,
    'relay_outbox should refuse to run at REPEATABLE READ and SERIALIZABLE, with a HINT'
);
SELECT results_eq(
    $$
    SELECT iso_level, err_state, err_message, err_hint FROM isolation_refusal WHERE fn = 'receive_webhook' ORDER BY iso_level
    $$,
    $$
    VALUES
        ('repeatable read', 'XJ022',
         'X_ISOLATION_UNSUPPORTED: receive_webhook cannot run at isolation level repeatable read',
         'Receive webhooks in READ COMMITTED transactions (the default).'),
        ('serializable', 'XJ022',
         'X_ISOLATION_UNSUPPORTED: receive_webhook cannot run at isolation level serializable',
         'Receive webhooks in READ COMMITTED transactions (the default).')
    $$,
    'receive_webhook should refuse to run at REPEATABLE READ and SERIALIZABLE (it reads the ledger after its lock)'
);
SELECT is_empty(
    $$ SELECT * FROM x_jobs.webhook_ledger AS l WHERE l.source = 't36' $$,
    'A refused receipt should record nothing'
);

------------------------------------------------------------------------------------------------
-- relay_outbox: what it hands out, and what a handed-out message holds
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';
CREATE TEMP TABLE fields_relay AS
SELECT r.*
FROM x_jobs.relay_outbox('r-fields', 10, '45 seconds', ARRAY['t36-put']) AS r;

SELECT results_eq(
    $$ SELECT r.id, r.topic, r.key, r.payload, r.headers, r.attempt FROM fields_relay AS r $$,
    $$
    VALUES (pg_temp.mid('p1'), 't36-put', NULL::text, '{"tag": "p1"}'::jsonb, '{}'::jsonb, 1),
           (pg_temp.mid('p2'), 't36-put', 'k-put', '{"tag": "p2"}', '{"x-tenant": "acme"}', 1)
    $$,
    'relay_outbox should answer each message''s id, topic, key, payload, headers and attempt, in id order'
);

SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('p1') AS h $$,
    $$ VALUES ('inflight', 1, 'r-fields', timestamptz '2030-01-01 12:01:45+00', NULL::text) $$,
    'A handed-out message should be in flight, on attempt 1, held by the relay until now + lease'
);

SELECT is(
    pg_temp.relay('r-other', 't36-put'),
    '{}',
    'A message whose lease runs should not be handed to another relay'
);

-- Keyless messages: all at once, oldest first, qty at most -------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put('t36-free', 'free-' || g.n) FROM generate_series(1, 5) AS g (n);
END
$$;
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:05+00';

SELECT is(
    pg_temp.relay('r-free', 't36-free', 2),
    ARRAY['free-1', 'free-2'],
    'relay_outbox should hand out at most qty messages, the oldest first'
);
SELECT is(
    pg_temp.relay('r-free', 't36-free', 100),
    ARRAY['free-3', 'free-4', 'free-5'],
    'relay_outbox should hand out every due keyless message at once'
);

-- Topics -----------------------------------------------------------------------------------

DO $$
BEGIN
    PERFORM pg_temp.put(t.topic, t.tag)
    FROM (VALUES ('t36-topic-a', 'ta1'), ('t36-topic-b', 'tb1'), ('t36-topic-a', 'ta2')) AS t (topic, tag);
END
$$;
SELECT results_eq(
    $$
    SELECT r.payload ->> 'tag'
    FROM x_jobs.relay_outbox('r-topic', topics => ARRAY['t36-topic-a', 't36-topic-none']) AS r
    $$,
    $$ VALUES ('ta1'), ('ta2') $$,
    'relay_outbox should hand out only messages of the topics it names'
);
SELECT is(
    (SELECT h.state FROM pg_temp.held('tb1') AS h),
    'pending',
    'A message of another topic should stay pending'
);
SELECT is(
    pg_temp.relay('r-topic', 't36-topic-b'),
    ARRAY['tb1'],
    'A relay of that topic should then take it'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

------------------------------------------------------------------------------------------------
-- One message per key in flight, in put order
------------------------------------------------------------------------------------------------

DO $$
BEGIN
    PERFORM pg_temp.put('t36-key', t.tag, t.key)
    FROM (
        VALUES ('k1', 'k'), ('k2', 'k'), ('n1', NULL), ('j1', 'j'), ('k3', 'k'), ('n2', NULL), ('j2', 'j')
    ) AS t (tag, key);
END
$$;

SELECT is(
    pg_temp.relay('r-key', 't36-key'),
    ARRAY['k1', 'n1', 'j1', 'n2'],
    'relay_outbox should hand out the first message of each key, and every keyless message'
);
SELECT is(
    pg_temp.relay('r-key', 't36-key'),
    '{}',
    'While a key''s message is in flight, none of its later messages should be handed out'
);
SELECT is(
    pg_temp.ack('r-key', ARRAY['k1']),
    ARRAY['k1'],
    'outbox_ack should answer the message the relay held'
);
SELECT results_eq(
    $$ SELECT o.state::text, o.delivered_at FROM x_jobs.outbox AS o WHERE o.id = pg_temp.mid('k1') $$,
    $$ VALUES ('delivered', timestamptz '2030-01-01 12:00:00+00') $$,
    'An acked message should be delivered, now'
);
SELECT is(
    pg_temp.relay('r-key', 't36-key'),
    ARRAY['k2'],
    'Once a key''s message is delivered, its next message should be handed out'
);
SELECT is(
    pg_temp.ack('r-key', ARRAY['k2', 'j1', 'n1']),
    ARRAY['j1', 'k2', 'n1'],
    'outbox_ack should deliver every message of the list that the relay holds'
);
SELECT is(
    pg_temp.relay('r-key', 't36-key'),
    ARRAY['k3', 'j2'],
    'Each key should then hand out its next message'
);

-- A nacked message holds its key until its retry_at, ahead of the later ones ----------------------

DO $$
BEGIN
    PERFORM pg_temp.put('t36-nack-key', t.tag, t.key)
    FROM (VALUES ('a1', 'a'), ('a2', 'a'), ('a3', 'a'), ('b1', 'b')) AS t (tag, key);
END
$$;

SELECT is(
    pg_temp.relay('r-nk', 't36-nack-key'),
    ARRAY['a1', 'b1'],
    'The first message of each key should be handed out'
);
SELECT is(pg_temp.ack('r-nk', ARRAY['b1']), ARRAY['b1'], 'The other key''s message should be acked');
SELECT throws_ok(
    pg_catalog.format(
        $$ SELECT x_jobs.outbox_nack(%s, 'r-nk', 'sink down', retry_at => 'infinity') $$,
        pg_temp.mid('a1')
    ),
    'XJ039',
    pg_catalog.format('X_TIME_INVALID: retry_at infinity is not a time to retry message %s', pg_temp.mid('a1')),
    'outbox_nack should refuse an infinite retry_at, which would hold the message and its key for good'
);
SELECT is(
    (
        SELECT o.state::text || ' ' || o.relay FROM x_jobs.outbox AS o
        WHERE o.id = pg_temp.mid('a1')
    ),
    'inflight r-nk',
    'The refused nack should leave the message with its relay'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('a1'), 'r-nk', 'sink down', retry_at => '2030-01-01 12:10:00+00'),
    'pending'::x_jobs.outbox_state,
    'outbox_nack with attempts left should answer pending'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:05:00+00';
SELECT is(
    pg_temp.relay('r-nk', 't36-nack-key'),
    '{}',
    'Before its retry_at, neither the nacked message nor the later messages of its key should go out'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:10:00+00';
SELECT results_eq(
    $$
    SELECT r.payload ->> 'tag', r.attempt
    FROM x_jobs.relay_outbox('r-nk', topics => ARRAY['t36-nack-key']) AS r
    $$,
    $$ VALUES ('a1', 2) $$,
    'At its retry_at, the nacked message should go out again, on attempt 2, still ahead of its key'
);
SELECT is(pg_temp.ack('r-nk', ARRAY['a1']), ARRAY['a1'], 'The retried message should be acked');
SELECT is(pg_temp.relay('r-nk', 't36-nack-key'), ARRAY['a2'], 'Then the key''s second message should go out');
SELECT is(pg_temp.ack('r-nk', ARRAY['a2']), ARRAY['a2'], 'The second message should be acked');
SELECT is(pg_temp.relay('r-nk', 't36-nack-key'), ARRAY['a3'], 'Then the key''s third message should go out');

-- A dead message no longer holds its key ----------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:20:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put('t36-dead-key', t.tag, 'dk', 1) FROM (VALUES ('dk1'), ('dk2')) AS t (tag);
END
$$;

SELECT is(pg_temp.relay('r-dk', 't36-dead-key'), ARRAY['dk1'], 'The first message of the key should go out');
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('dk1'), 'r-dk', 'rejected'),
    'dead'::x_jobs.outbox_state,
    'A message nacked on its last attempt should be dead'
);
SELECT is(
    pg_temp.relay('r-dk', 't36-dead-key'),
    ARRAY['dk2'],
    'Once a key''s message is dead, its next message should go out'
);
SELECT is(
    x_jobs.outbox_redrive(ARRAY[pg_temp.mid('dk1')]),
    1::bigint,
    'The dead message should be redriven'
);
-- relay_outbox promises that "a key never has two messages in flight". A redriven message has a
-- lower id than the key's message in flight, so the NOT EXISTS (e.id < o.id) of the due arm does
-- not see that one.
SELECT is(
    pg_temp.relay('r-dk', 't36-dead-key'),
    '{}',
    'A redriven message should not go out while a later message of its key is in flight'
);

------------------------------------------------------------------------------------------------
-- Lapsed leases and settles by a relay that does not hold the message
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put('t36-lapse', t.tag, 'lk') FROM (VALUES ('lap1'), ('lap2')) AS t (tag);
END
$$;

SELECT is(pg_temp.relay('r1', 't36-lapse'), ARRAY['lap1'], 'r1 should take the first message of the key');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:29+00';
SELECT is(pg_temp.relay('r2', 't36-lapse'), '{}', 'Before its lease lapses, no other relay should get the message');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:31+00';
SELECT results_eq(
    $$ SELECT r.payload ->> 'tag', r.attempt FROM x_jobs.relay_outbox('r2', topics => ARRAY['t36-lapse']) AS r $$,
    $$ VALUES ('lap1', 2) $$,
    'Once its lease lapsed, another relay should get the message, on attempt 2, and not the next of its key'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('lap1') AS h $$,
    $$ VALUES ('inflight', 2, 'r2', timestamptz '2030-01-01 12:01:01+00', NULL::text) $$,
    'The re-claimed message should be held by the new relay under a new lease'
);
SELECT is_empty(
    $$ SELECT * FROM x_jobs.outbox_ack(pg_temp.mids(ARRAY['lap1']), 'r1') $$,
    'An ack by a relay that no longer holds the message should answer nothing'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('lap1'), 'r1', 'late failure'),
    NULL::x_jobs.outbox_state,
    'A nack by a relay that no longer holds the message should answer NULL'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('lap1') AS h $$,
    $$ VALUES ('inflight', 2, 'r2', timestamptz '2030-01-01 12:01:01+00', NULL::text) $$,
    'The ack and nack of the old relay should change nothing'
);
SELECT is(pg_temp.ack('r2', ARRAY['lap1']), ARRAY['lap1'], 'The relay that holds it should ack it');
SELECT results_eq(
    $$ SELECT r.payload ->> 'tag', r.attempt FROM x_jobs.relay_outbox('r1', topics => ARRAY['t36-lapse']) AS r $$,
    $$ VALUES ('lap2', 1) $$,
    'Then the next message of the key should go out, on attempt 1'
);
SELECT is(
    pg_temp.ack('r1', ARRAY['lap2', 'lap1']),
    ARRAY['lap2'],
    'An ack should answer only the messages the relay holds, not one already delivered'
);
SELECT is_empty(
    $$ SELECT * FROM x_jobs.outbox_ack(pg_temp.mids(ARRAY['tb1']), 'r-stranger') $$,
    'An ack of an in-flight message by a stranger should answer nothing'
);
SELECT is(
    (SELECT h.state FROM pg_temp.held('tb1') AS h),
    'inflight',
    'The stranger''s ack should leave the message in flight'
);

-- A message whose lease lapses on its final attempt is dead, not handed out again (its relay
-- died delivering it max_attempts times); redriven, it goes out again.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:10:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put('t36-bury', 'bur1', 'bk', 2);
    PERFORM pg_temp.put('t36-bury', 'bur2', 'bk');
END
$$;

SELECT is(pg_temp.relay('r1', 't36-bury'), ARRAY['bur1'], 'r1 should take the message, attempt 1 of 2');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:10:31+00';
SELECT is(pg_temp.relay('r2', 't36-bury'), ARRAY['bur1'], 'Its lease lapsed: r2 should take it, attempt 2 of 2');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:11:02+00';
SELECT is(
    pg_temp.relay('r3', 't36-bury'),
    '{}',
    'Its lease lapsed on the final attempt: no relay should get it again (nor the next of its key, in that call)'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('bur1') AS h $$,
    $$ VALUES ('dead', 2, NULL::text, timestamptz '2030-01-01 12:11:02+00', 'lease lapsed on the final attempt') $$,
    'The message should be dead, with why'
);
SELECT is(
    pg_temp.relay('r3', 't36-bury'),
    ARRAY['bur2'],
    'The dead message should no longer hold its key back'
);
SELECT is(x_jobs.outbox_redrive(ARRAY[pg_temp.mid('bur1')]), 1::bigint, 'The dead message should be redriven');

------------------------------------------------------------------------------------------------
-- outbox_nack: backoff, retry_at, dead
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:00:00+00';
-- 20 messages, because the jitter is random: the bounds must hold for every one.
DO $$
BEGIN
    PERFORM pg_temp.put('t36-backoff', 'bo-' || g.n) FROM generate_series(1, 20) AS g (n);
END
$$;
SELECT is(
    pg_catalog.cardinality(pg_temp.relay('r-bo', 't36-backoff')),
    20,
    'Every backoff message should be handed out'
);
SELECT results_eq(
    $$
    SELECT DISTINCT x_jobs.outbox_nack(o.id, 'r-bo', 'HTTP 503')::text
    FROM x_jobs.outbox AS o WHERE o.topic = 't36-backoff'
    $$,
    $$ VALUES ('pending') $$,
    'A nack with attempts left should answer pending for every message'
);
SELECT results_eq(
    $$
    SELECT count(*)::integer, min(o.attempt), max(o.attempt), count(o.relay)::integer,
           pg_catalog.array_agg(DISTINCT o.last_error)
    FROM x_jobs.outbox AS o
    WHERE o.topic = 't36-backoff' AND o.state = 'pending'
        AND o.available_at BETWEEN '2030-01-01 13:00:00.5+00' AND '2030-01-01 13:00:01+00'
    $$,
    $$ VALUES (20, 1, 1, 0, ARRAY['HTTP 503']) $$,
    'After attempt 1, a nacked message should wait 1 s times a factor in [0.5, 1.0], unheld, with its error'
);
SELECT cmp_ok(
    (
        SELECT count(DISTINCT o.available_at)::integer
        FROM x_jobs.outbox AS o
        WHERE o.topic = 't36-backoff'
    ),
    '>',
    1,
    'The backoff should be jittered'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:00:00.4+00';
SELECT is(pg_temp.relay('r-bo', 't36-backoff'), '{}', 'A backed-off message should not go out before its time');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:00:01+00';
SELECT results_eq(
    $$
    SELECT count(*)::integer, min(r.attempt), max(r.attempt)
    FROM x_jobs.relay_outbox('r-bo', topics => ARRAY['t36-backoff']) AS r
    $$,
    $$ VALUES (20, 2, 2) $$,
    'After the backoff, every message should go out again on attempt 2'
);
SELECT results_eq(
    $$
    SELECT DISTINCT x_jobs.outbox_nack(o.id, 'r-bo', 'HTTP 503')::text
    FROM x_jobs.outbox AS o WHERE o.topic = 't36-backoff'
    $$,
    $$ VALUES ('pending') $$,
    'A second nack should answer pending'
);
SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.outbox AS o
        WHERE
            o.topic = 't36-backoff'
            AND o.available_at BETWEEN '2030-01-01 13:00:02+00' AND '2030-01-01 13:00:03+00'
    ),
    20,
    'After attempt 2, the backoff should double: 2 s times a factor in [0.5, 1.0]'
);

DO $$
BEGIN
    PERFORM pg_temp.put('t36-nack', t.tag, NULL, t.max_attempts)
    FROM (
        VALUES ('nk-max', 2), ('nk-final', 10), ('nk-retry-at', 10), ('nk-past', 10), ('nk-held', 10),
        ('nk-pending', 10)
    ) AS t (tag, max_attempts);
END
$$;
SELECT is(
    pg_temp.relay('r-nack', 't36-nack', 5),
    ARRAY['nk-max', 'nk-final', 'nk-retry-at', 'nk-past', 'nk-held'],
    'The nack messages should be handed out'
);

SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-max'), 'r-nack', 'first', retry_at => '2030-01-01 13:00:01+00'),
    'pending'::x_jobs.outbox_state,
    'A nack on attempt 1 of 2 should answer pending'
);
SELECT is(pg_temp.relay('r-nack', 't36-nack', 1), ARRAY['nk-max'], 'The message should go out on its last attempt');
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-max'), 'r-nack', 'second'),
    'dead'::x_jobs.outbox_state,
    'A nack on the last attempt should answer dead'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('nk-max') AS h $$,
    $$ VALUES ('dead', 2, NULL::text, timestamptz '2030-01-01 13:00:01+00', 'second') $$,
    'A dead message should be unheld, with its last error'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-final'), 'r-nack', 'HTTP 400', retryable => FALSE),
    'dead'::x_jobs.outbox_state,
    'A nack with retryable => false should answer dead at once, with attempts left'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('nk-final') AS h $$,
    $$ VALUES ('dead', 1, NULL::text, timestamptz '2030-01-01 13:00:01+00', 'HTTP 400') $$,
    'The message refused for good should be dead after its first attempt'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-retry-at'), 'r-nack', 'later', retry_at => '2030-01-01 15:00:00+00'),
    'pending'::x_jobs.outbox_state,
    'A nack with retry_at should answer pending'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('nk-retry-at') AS h $$,
    $$ VALUES ('pending', 1, NULL::text, timestamptz '2030-01-01 15:00:00+00', 'later') $$,
    'A nack with retry_at should make the message due at retry_at, not after a backoff'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-past'), 'r-nack', 'now', retry_at => '2030-01-01 12:00:00+00'),
    'pending'::x_jobs.outbox_state,
    'A nack with a retry_at in the past should answer pending'
);
SELECT results_eq(
    $$ SELECT h.* FROM pg_temp.held('nk-past') AS h $$,
    $$ VALUES ('pending', 1, NULL::text, timestamptz '2030-01-01 13:00:01+00', 'now') $$,
    'A retry_at in the past should make the message due now'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-held'), 'r-stranger', 'not mine'),
    NULL::x_jobs.outbox_state,
    'A nack by a relay that does not hold the message should answer NULL'
);
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('nk-pending'), 'r-nack', 'never claimed'),
    NULL::x_jobs.outbox_state,
    'A nack of a message nobody holds should answer NULL'
);
SELECT results_eq(
    $$ SELECT h.tag, h.state, h.attempt, h.relay, h.last_error FROM (
        SELECT 'nk-held' AS tag, p.* FROM pg_temp.held('nk-held') AS p
        UNION ALL
        SELECT 'nk-pending', p.* FROM pg_temp.held('nk-pending') AS p
    ) AS h ORDER BY h.tag $$,
    $$ VALUES ('nk-held', 'inflight', 1, 'r-nack', NULL::text), ('nk-pending', 'pending', 0, NULL, NULL) $$,
    'Those nacks should change nothing'
);
SELECT is(
    pg_temp.relay('r-nack', 't36-nack'),
    ARRAY['nk-past', 'nk-pending'],
    'Dead messages should never go out; a message due again should'
);

------------------------------------------------------------------------------------------------
-- outbox_redrive
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:00:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put(t.topic, t.tag, NULL, 1)
    FROM (
        VALUES ('t36-rd', 'rd1'), ('t36-rd', 'rd2'), ('t36-rd', 'rd3'), ('t36-rd-other', 'rd4'),
        ('t36-rdm', 'rdm1'), ('t36-rdm', 'rdm2'), ('t36-rdm', 'rdm3')
    ) AS t (topic, tag);
END
$$;
CREATE TEMP TABLE rd_relay AS
SELECT r.id FROM x_jobs.relay_outbox('r-rd', topics => ARRAY['t36-rd', 't36-rd-other', 't36-rdm']) AS r;
SELECT results_eq(
    $$ SELECT x_jobs.outbox_nack(r.id, 'r-rd', 'gone')::text, count(*)::integer FROM rd_relay AS r GROUP BY 1 $$,
    $$ VALUES ('dead', 7) $$,
    'The redrive messages should all be dead after their only attempt'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:05:00+00';
SELECT is(x_jobs.outbox_redrive(ARRAY[pg_temp.mid('rd1')]), 1::bigint, 'outbox_redrive by id should answer 1');
SELECT results_eq(
    $$ SELECT h.state, h.attempt, h.relay, h.available_at FROM pg_temp.held('rd1') AS h $$,
    $$ VALUES ('pending', 0, NULL::text, timestamptz '2030-01-01 14:05:00+00') $$,
    'A redriven message should be pending, due now, with all its attempts'
);
SELECT is(
    x_jobs.outbox_redrive(pg_temp.mids(ARRAY['rd1', 'p1'])),
    0::bigint,
    'outbox_redrive should leave alone a message that is not dead'
);
SELECT is(
    x_jobs.outbox_redrive(ARRAY[pg_temp.mid('rd4')], 't36-rd'),
    0::bigint,
    'outbox_redrive by ids and topic should redrive only messages that match both'
);
SELECT is(x_jobs.outbox_redrive(topic => 't36-rd'), 2::bigint, 'outbox_redrive by topic should answer 2');
SELECT results_eq(
    $$
    SELECT o.payload ->> 'tag', o.state::text, o.attempt FROM x_jobs.outbox AS o
    WHERE o.topic IN ('t36-rd', 't36-rd-other') ORDER BY o.id
    $$,
    $$ VALUES ('rd1', 'pending', 0), ('rd2', 'pending', 0), ('rd3', 'pending', 0), ('rd4', 'dead', 1) $$,
    'outbox_redrive by topic should redrive the dead messages of that topic only'
);
SELECT is(
    x_jobs.outbox_redrive(topic => 't36-rdm', max_rows => 2),
    2::bigint,
    'outbox_redrive should redrive no more than max_rows'
);
SELECT results_eq(
    $$ SELECT o.payload ->> 'tag', o.state::text FROM x_jobs.outbox AS o WHERE o.topic = 't36-rdm' ORDER BY o.id $$,
    $$ VALUES ('rdm1', 'pending'), ('rdm2', 'pending'), ('rdm3', 'dead') $$,
    'outbox_redrive should take the lowest ids first'
);
SELECT is(x_jobs.outbox_redrive(topic => 't36-rdm', max_rows => 2), 1::bigint, 'A second redrive should take the rest');
SELECT results_eq(
    $$
    SELECT r.payload ->> 'tag', r.attempt FROM x_jobs.relay_outbox('r-rd', topics => ARRAY['t36-rd', 't36-rdm']) AS r
    $$,
    $$ VALUES ('rd1', 1), ('rd2', 1), ('rd3', 1), ('rdm1', 1), ('rdm2', 1), ('rdm3', 1) $$,
    'Redriven messages should go out again, on attempt 1'
);

------------------------------------------------------------------------------------------------
-- purge_outbox
------------------------------------------------------------------------------------------------

-- In 2029, so that the cutoffs below are before every other message of the test: the answers
-- count this scenario's messages only. pu1 is delivered after pu2, so that lowest id and oldest
-- delivery differ.
SET LOCAL "x_jobs.fake_now" = '2029-01-01 00:00:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put('t36-purge', t.tag, NULL, 1)
    FROM (VALUES ('pu1'), ('pu2'), ('pu3'), ('pu-inflight'), ('pu-dead')) AS t (tag);
END
$$;
SELECT is(
    pg_catalog.cardinality(pg_temp.relay('r-pu', 't36-purge', 100, '365 days')),
    5,
    'The purge messages should be handed out'
);
SELECT is(x_jobs.outbox_nack(pg_temp.mid('pu-dead'), 'r-pu', 'gone')::text, 'dead', 'pu-dead should be dead');
SELECT is(pg_temp.ack('r-pu', ARRAY['pu2']), ARRAY['pu2'], 'pu2 should be delivered on Jan 1');
SET LOCAL "x_jobs.fake_now" = '2029-01-02 00:00:00+00';
SELECT is(pg_temp.ack('r-pu', ARRAY['pu1']), ARRAY['pu1'], 'pu1 should be delivered on Jan 2');
SET LOCAL "x_jobs.fake_now" = '2029-01-05 00:00:00+00';
SELECT is(pg_temp.ack('r-pu', ARRAY['pu3']), ARRAY['pu3'], 'pu3 should be delivered on Jan 5');
DO $$
BEGIN
    PERFORM pg_temp.put('t36-purge', 'pu-pending');
END
$$;

-- The cutoff is Jan 10 - 7 days = Jan 3: pu1 and pu2 are past it, pu3 is not.
SET LOCAL "x_jobs.fake_now" = '2029-01-10 00:00:00+00';
SELECT is(x_jobs.purge_outbox('7 days', 1), 1::bigint, 'A purge in batches of 1 should delete one message');
SELECT is(
    (
        SELECT pg_catalog.array_agg(o.payload ->> 'tag' ORDER BY o.id)
        FROM x_jobs.outbox AS o
        WHERE o.topic = 't36-purge'
    ),
    ARRAY['pu2', 'pu3', 'pu-inflight', 'pu-dead', 'pu-pending'],
    'The purge should take the lowest id first, not the oldest delivery'
);
SELECT is(x_jobs.purge_outbox('7 days', 1), 1::bigint, 'The next batch should delete the other old delivered message');
SELECT is(x_jobs.purge_outbox('7 days', 1), 0::bigint, 'Then nothing past the cutoff should be left');
SELECT is(
    x_jobs.purge_outbox('0 seconds'),
    1::bigint,
    'A purge of everything delivered should delete only the delivered message left'
);
SELECT is(
    (
        SELECT pg_catalog.array_agg(o.payload ->> 'tag' ORDER BY o.id)
        FROM x_jobs.outbox AS o
        WHERE o.topic = 't36-purge'
    ),
    ARRAY['pu-inflight', 'pu-dead', 'pu-pending'],
    'A purge should never delete a pending, in-flight or dead message'
);

------------------------------------------------------------------------------------------------
-- receive_webhook
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 16:00:00+00';
CREATE TEMP TABLE wh_first AS
SELECT w.*
FROM x_jobs.receive_webhook('stripe', 'evt_1', 't36_webhook', '{"amount": 5}', 't36-wh') AS w;

SELECT results_eq(
    $$ SELECT w.duplicate, pg_catalog.count(*) OVER () FROM wh_first AS w $$,
    $$ VALUES (FALSE, 1::bigint) $$,
    'The first receipt of a webhook should answer one row, not a duplicate'
);
SELECT results_eq(
    $$
    SELECT j.name, j.input, j.queue, j.state::text, j.max_attempts, j.priority::integer
    FROM x_jobs.job AS j INNER JOIN wh_first AS w ON j.id = w.job_id
    $$,
    $$ VALUES ('t36_webhook', '{"amount": 5}'::jsonb, 't36-wh', 'ready', 25, 0) $$,
    'The first receipt should enqueue a job with the name, input and queue given, and enqueue''s defaults'
);
SELECT results_eq(
    $$ SELECT l.source, l.webhook_id, l.received_at, l.job_id FROM x_jobs.webhook_ledger AS l $$,
    $$ SELECT 'stripe', 'evt_1', timestamptz '2030-01-01 16:00:00+00', w.job_id FROM wh_first AS w $$,
    'The first receipt should record the webhook in the ledger, with its job'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 16:05:00+00';
SELECT results_eq(
    $$
    SELECT w.job_id, w.duplicate FROM x_jobs.receive_webhook('stripe', 'evt_1', 't36_webhook', '{"amount": 6}') AS w
    $$,
    $$ SELECT w.job_id, TRUE FROM wh_first AS w $$,
    'A redelivery should answer the first job, as a duplicate'
);
SELECT results_eq(
    $$
    SELECT (SELECT count(*) FROM x_jobs.job AS j WHERE j.name = 't36_webhook')::integer,
           (SELECT count(*) FROM x_jobs.webhook_ledger AS l)::integer,
           (SELECT l.received_at FROM x_jobs.webhook_ledger AS l)
    $$,
    $$ VALUES (1, 1, timestamptz '2030-01-01 16:00:00+00') $$,
    'A redelivery should enqueue nothing and leave the ledger as it was'
);
CREATE TEMP TABLE wh_claim AS
SELECT c.id FROM x_jobs.claim(ARRAY['t36-wh'], 'w-wh', '1 minute', 10) AS c;
SELECT results_eq(
    $$ SELECT c.id, x_jobs.complete(c.id, 'w-wh') FROM wh_claim AS c $$,
    $$ SELECT w.job_id, TRUE FROM wh_first AS w $$,
    'The webhook''s job should run and complete'
);
SELECT results_eq(
    $$ SELECT w.job_id, w.duplicate FROM x_jobs.receive_webhook('stripe', 'evt_1', 't36_webhook') AS w $$,
    $$ SELECT w.job_id, TRUE FROM wh_first AS w $$,
    'A redelivery after the job finished should still answer the first job, as a duplicate'
);
SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.job AS j
        WHERE j.name = 't36_webhook'
    ),
    1,
    'A redelivery after the job finished should enqueue nothing'
);

CREATE TEMP TABLE wh_other AS
SELECT w.*
FROM x_jobs.receive_webhook('github', 'evt_1', 't36_webhook_gh') AS w;
SELECT results_eq(
    $$
    SELECT w.duplicate, w.job_id <> f.job_id, j.name, j.queue, j.input
    FROM wh_other AS w CROSS JOIN wh_first AS f INNER JOIN x_jobs.job AS j ON w.job_id = j.id
    $$,
    $$ VALUES (FALSE, TRUE, 't36_webhook_gh', 'default', '{}'::jsonb) $$,
    'The same webhook id from another source should be a webhook of its own, in queue default with input {}'
);

-- The idempotency key is 'webhook:' || source || ':' || webhook_id, and ':' may occur in both.
CREATE TEMP TABLE wh_colon AS
SELECT
    1 AS n,
    w.*
FROM x_jobs.receive_webhook('acme:eu', 'evt', 't36_webhook_x') AS w;
INSERT INTO wh_colon
SELECT
    2 AS n,
    w.*
FROM x_jobs.receive_webhook('acme', 'eu:evt', 't36_webhook_y') AS w;
SELECT results_eq(
    $$ SELECT w.n, w.duplicate, j.name FROM wh_colon AS w INNER JOIN x_jobs.job AS j ON w.job_id = j.id ORDER BY w.n $$,
    $$ VALUES (1, FALSE, 't36_webhook_x'), (2, FALSE, 't36_webhook_y') $$,
    'Two webhooks whose source and id differ only in where a separator falls should become two jobs'
);

-- The rest of the job's request: its fields, under name, input and queue.
CREATE TEMP TABLE wh_request AS
SELECT w.*
FROM x_jobs.receive_webhook(
    'stripe', 'evt_request', 't36_webhook_request', '{"a": 1}', 't36-wh-request',
    '{"max_attempts": 5, "priority": 3, "name": "not_this", "input": {"not": "this"}, "queue": "not-this"}'
) AS w;
SELECT results_eq(
    $$
    SELECT w.duplicate, j.name, j.input, j.queue, j.max_attempts, j.priority::integer
    FROM wh_request AS w INNER JOIN x_jobs.job AS j ON w.job_id = j.id
    $$,
    $$ VALUES (FALSE, 't36_webhook_request', '{"a": 1}'::jsonb, 't36-wh-request', 5, 3) $$,
    'request should set the job''s other fields; name, input and queue should win over its fields'
);

-- purge_webhook_ledger, in 2029 so that the cutoffs below are before every other ledger row.
-- old-b is received first, on Jun 2; old-a after it, on Jun 1: oldest first is not insert order.
SET LOCAL "x_jobs.fake_now" = '2029-06-02 00:00:00+00';
CREATE TEMP TABLE wh_old AS
SELECT
    'old-b' AS webhook_id,
    w.job_id
FROM x_jobs.receive_webhook('t36-old', 'old-b', 't36_webhook_old') AS w;
SET LOCAL "x_jobs.fake_now" = '2029-06-01 00:00:00+00';
INSERT INTO wh_old
SELECT
    'old-a' AS webhook_id,
    w.job_id
FROM x_jobs.receive_webhook('t36-old', 'old-a', 't36_webhook_old') AS w;
SET LOCAL "x_jobs.fake_now" = '2029-06-05 00:00:00+00';
INSERT INTO wh_old
SELECT
    'old-c' AS webhook_id,
    w.job_id
FROM x_jobs.receive_webhook('t36-old', 'old-c', 't36_webhook_old') AS w;

-- The cutoff is Jun 10 - 7 days = Jun 3: old-a and old-b are past it, old-c is not.
SET LOCAL "x_jobs.fake_now" = '2029-06-10 00:00:00+00';
SELECT is(x_jobs.purge_webhook_ledger('7 days', 1), 1::bigint, 'A ledger purge in batches of 1 should delete one row');
SELECT is(
    (
        SELECT pg_catalog.array_agg(l.webhook_id ORDER BY l.webhook_id)
        FROM x_jobs.webhook_ledger AS l
        WHERE l.source = 't36-old'
    ),
    ARRAY['old-b', 'old-c'],
    'The ledger purge should delete the oldest receipt first'
);
SELECT is(x_jobs.purge_webhook_ledger('7 days'), 1::bigint, 'The next purge should delete the other old receipt');
SELECT is(x_jobs.purge_webhook_ledger('7 days'), 0::bigint, 'Then nothing past the cutoff should be left');
SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.webhook_ledger AS l
        WHERE l.source <> 't36-old'
    ),
    5,
    'The ledger purge should leave the newer receipts'
);
SELECT results_eq(
    $$ SELECT w.duplicate, w.job_id = o.job_id FROM x_jobs.receive_webhook('t36-old', 'old-a', 't36_webhook_old') AS w
       CROSS JOIN wh_old AS o WHERE o.webhook_id = 'old-a' $$,
    $$ VALUES (FALSE, FALSE) $$,
    'A webhook redelivered after its ledger row was purged should become a second job (retention must outlast retries)'
);

-- outbox_redrive and purge_outbox keep to their batch whatever the plan: these planner settings
-- make the batch's subquery the inner side of a nested loop, rescanned per row, under which
-- (before 0.3.3) a batch of 2 took all five messages. DISCARD PLANS: planned anew.
CREATE TEMP TABLE bound AS
SELECT p.id
FROM x_jobs.outbox_put_many(
    (
        SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('topic', 't36.bound', 'payload', g))
        FROM pg_catalog.generate_series(1, 5) AS g
    )
) AS p;

UPDATE x_jobs.outbox SET state = 'dead'
WHERE id IN (SELECT b.id FROM bound AS b);

SET LOCAL enable_hashjoin = off;
SET LOCAL enable_mergejoin = off;
SET LOCAL enable_material = off;
SET LOCAL enable_hashagg = off;
SET LOCAL enable_sort = off;
DISCARD PLANS;

SELECT is(
    x_jobs.outbox_redrive(topic => 't36.bound', max_rows => 2),
    2::bigint,
    'outbox_redrive should redrive max_rows messages and no more, under a plan that rescans the batch'
);

SELECT results_eq(
    $$ SELECT o.state::text, count(*)::integer FROM x_jobs.outbox AS o
       WHERE o.id IN (SELECT b.id FROM bound AS b) GROUP BY 1 ORDER BY 1 $$,
    $$ VALUES ('dead', 3), ('pending', 2) $$,
    'outbox_redrive with max_rows 2 should leave three of the five dead messages dead'
);

UPDATE x_jobs.outbox SET state = 'delivered', delivered_at = x_jobs.now() - interval '30 days'
WHERE id IN (SELECT b.id FROM bound AS b);
DELETE FROM x_jobs.outbox
WHERE state = 'delivered' AND id NOT IN (SELECT b.id FROM bound AS b);

SELECT is(
    x_jobs.purge_outbox('1 day', 2),
    2::bigint,
    'purge_outbox should delete batch_size messages and no more, under a plan that rescans the batch'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.outbox AS o
        WHERE o.id IN (SELECT b.id FROM bound AS b)
    ),
    3,
    'purge_outbox with a batch of 2 should leave three of the five old messages'
);

-- outbox_extend_lease: the relay's heartbeat. A delivery slower than its lease was claimed
-- again by another relay and sent a second time while it ran.
SET LOCAL "x_jobs.fake_now" = '2030-03-01 00:00:00+00';
DO $$
BEGIN
    PERFORM pg_temp.put('t36-hb', t.tag) FROM (VALUES ('hb1'), ('hb2'), ('hb3')) AS t (tag);
END
$$;

SELECT is(pg_temp.relay('r-hb', 't36-hb', 2, '10 seconds'), ARRAY['hb1', 'hb2'], 'r-hb should hold two messages');
SELECT is(pg_temp.relay('r-other', 't36-hb', 1, '10 seconds'), ARRAY['hb3'], 'r-other should hold the third');
SELECT is(pg_temp.ack('r-hb', ARRAY['hb2']), ARRAY['hb2'], 'r-hb should deliver one of its two');

SET LOCAL "x_jobs.fake_now" = '2030-03-01 00:00:08+00';
SELECT results_eq(
    $$
    SELECT e FROM x_jobs.outbox_extend_lease(pg_temp.mids(ARRAY['hb1', 'hb2', 'hb3']), 'r-hb', '10 seconds') AS e
    $$,
    $$ SELECT pg_temp.mid('hb1') $$,
    'outbox_extend_lease should answer only the inflight messages the relay holds (not a delivered one, not another''s)'
);
SELECT results_eq(
    $$
    SELECT o.payload ->> 'tag', o.state::text, o.available_at FROM x_jobs.outbox AS o
    WHERE o.payload ->> 'tag' IN ('hb1', 'hb3') ORDER BY o.id
    $$,
    $$ VALUES ('hb1', 'inflight', '2030-03-01 00:00:18+00'::timestamptz),
              ('hb3', 'inflight', '2030-03-01 00:00:10+00'::timestamptz) $$,
    'The held lease should run from now, the other relay''s should be as it was'
);

-- Past the first lease (10 s), the extended message is not handed out again; the other is.
SET LOCAL "x_jobs.fake_now" = '2030-03-01 00:00:12+00';
SELECT is(
    pg_temp.relay('r-late', 't36-hb', 10, '10 seconds'),
    ARRAY['hb3'],
    'A message whose lease was extended should not be claimed again; one whose lease lapsed should'
);
SELECT results_eq(
    $$
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.outbox_extend_lease('{1}', '') $q$) AS c
    UNION ALL
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.outbox_extend_lease('{1}', 'r', '0 seconds') $q$) AS c
    $$,
    $$ VALUES ('XJ036'), ('XJ012') $$,
    'outbox_extend_lease should refuse an empty relay id and a lease that is not positive'
);

-- A nack's error is cut, not refused (0.3.8): 5,000,000 characters were stored whole.
SELECT lives_ok(
    $$ SELECT pg_temp.put('t36-errtext', 'errtext') $$,
    'A message for the error text should be put (setup)'
);
SELECT is(pg_temp.relay('r-err', 't36-errtext'), ARRAY['errtext'], 'r-err should hold it (setup)');
SELECT is(
    x_jobs.outbox_nack(pg_temp.mid('errtext'), 'r-err', repeat('e', 5000000))::text,
    'pending',
    'outbox_nack with an error of 5,000,000 characters should still nack the message'
);
SELECT results_eq(
    $$
    SELECT length(h.last_error), left(h.last_error, 65536) = repeat('e', 65536), substr(h.last_error, 65537)
    FROM pg_temp.held('errtext') AS h
    $$,
    $$ VALUES (65536 + 39, TRUE, E'\n[truncated: 5000000 characters in all]') $$,
    'The error should be kept to its first 65,536 characters and a note of its length'
);

SELECT * FROM finish();
ROLLBACK;
