-- x_jobs.enqueue_many: one answer per request in input order, rows inserted in input order,
-- dedupe within the batch and against live rows, and refusals that leave nothing behind.
BEGIN;
SELECT plan(45);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- A batch of four: every field of enqueue in the first request, a delayed one, a keyed one, and
-- one with only a name. `pos` is the position in which the function answered the row.
CREATE TEMP TABLE batch AS
SELECT
    pg_catalog.row_number() OVER () AS pos,
    r.*
FROM x_jobs.enqueue_many($$[
    {"name": "all_fields", "input": {"to": "a@example.com"}, "queue": "many", "run_at": "2030-01-01T11:00:00Z",
     "idempotency_key": "all-fields-key", "max_attempts": 3, "priority": -7, "tenant_id": "acme",
     "concurrency_key": "acme-mail", "concurrency_limit": 4, "traceparent": "00-trace-01",
     "enqueued_by": "tests/pgtap/11-enqueue-many.sql", "dead_letter": false,
     "backoff_base": "5 seconds", "backoff_max": "10 minutes"},
    {"name": "later", "queue": "many", "run_at": "2030-01-01T13:00:00Z"},
    {"name": "keyed", "queue": "many", "concurrency_key": "many-key"},
    {"name": "bare"}
]$$) AS r;

SELECT results_eq(
    $$ SELECT b.pos::integer, b.ord, b.deduped FROM batch AS b $$,
    $$ VALUES (1, 1, FALSE), (2, 2, FALSE), (3, 3, FALSE), (4, 4, FALSE) $$,
    'enqueue_many should answer one row per request, in input order, ord counting from 1, none deduped'
);

SELECT results_eq(
    $$
    SELECT b.ord, j.name, j.run_id = b.run_id
    FROM batch AS b LEFT JOIN x_jobs.job AS j ON b.id = j.id
    ORDER BY b.ord
    $$,
    $$ VALUES (1, 'all_fields', TRUE), (2, 'later', TRUE), (3, 'keyed', TRUE), (4, 'bare', TRUE) $$,
    'Each answer should carry the id and run_id of the row made from its request'
);

SELECT is(
    array(
        SELECT b.id FROM batch AS b
        ORDER BY b.ord
    ),
    array(
        SELECT b.id FROM batch AS b
        ORDER BY b.id
    ),
    'The rows of a batch should be inserted in input order: ids ascend with ord'
);

SELECT results_eq(
    $$
    SELECT j.input, j.queue, j.run_at, j.state::text, j.idempotency_key, j.max_attempts, j.priority::integer,
           j.tenant_id, j.concurrency_key, j.concurrency_limit, j.traceparent, j.enqueued_by, j.dead_letter,
           j.backoff_base, j.backoff_max
    FROM x_jobs.job AS j WHERE j.name = 'all_fields'
    $$,
    $$
    VALUES ('{"to": "a@example.com"}'::jsonb, 'many', timestamptz '2030-01-01 11:00:00+00', 'ready',
            'all-fields-key', 3, -7, 'acme', 'acme-mail', 4, '00-trace-01', 'tests/pgtap/11-enqueue-many.sql',
            FALSE, interval '5 seconds', interval '10 minutes')
    $$,
    'Every argument name of enqueue should be accepted as a field and stored on the row'
);

SELECT results_eq(
    $$
    SELECT j.name, j.state::text, j.run_at, j.concurrency_limit
    FROM x_jobs.job AS j WHERE j.name IN ('later', 'keyed') ORDER BY j.name
    $$,
    $$
    VALUES ('keyed', 'ready', timestamptz '2030-01-01 12:00:00+00', 1),
           ('later', 'delayed', timestamptz '2030-01-01 13:00:00+00', NULL)
    $$,
    'A request due later should be delayed, and a concurrency key without a limit should get limit 1'
);

SELECT results_eq(
    $$
    SELECT j.queue, j.state::text, j.attempt, j.max_attempts, j.priority::integer, j.tenant_id, j.input,
           j.backoff_base, j.backoff_max, j.dead_letter, j.run_at, j.created_at
    FROM x_jobs.job AS j WHERE j.name = 'bare'
    $$,
    $$
    VALUES ('default', 'ready', 0, 25, 0, 'none', '{}'::jsonb, interval '1 second', interval '1 hour', TRUE,
            timestamptz '2030-01-01 12:00:00+00', timestamptz '2030-01-01 12:00:00+00')
    $$,
    'A request with only a name should get the same defaults as enqueue'
);

-- Dedupe within the batch -----------------------------------------------------------------------

CREATE TEMP TABLE in_batch AS
SELECT r.*
FROM x_jobs.enqueue_many($$[
    {"name": "lead", "queue": "dedupe", "idempotency_key": "batch-key", "input": {"v": 1}},
    {"name": "follow", "queue": "dedupe", "idempotency_key": "batch-key", "input": {"v": 2}},
    {"name": "unkeyed", "queue": "dedupe"}
]$$) AS r;

SELECT results_eq(
    $$ SELECT f.ord, f.id, f.run_id, f.deduped FROM in_batch AS f WHERE f.ord = 2 $$,
    $$ SELECT 2, l.id, l.run_id, TRUE FROM in_batch AS l WHERE l.ord = 1 $$,
    'A request under a key an earlier request of the batch took should answer deduped with the first one''s row'
);

SELECT results_eq(
    $$ SELECT f.ord, f.deduped FROM in_batch AS f WHERE f.ord <> 2 ORDER BY f.ord $$,
    $$ VALUES (1, FALSE), (3, FALSE) $$,
    'The first request of a key and an unkeyed request should make rows of their own'
);

SELECT results_eq(
    $$ SELECT j.name, j.input FROM x_jobs.job AS j WHERE j.idempotency_key = 'batch-key' $$,
    $$ VALUES ('lead', '{"v": 1}'::jsonb) $$,
    'Only the first request of a key should make a row'
);

-- Dedupe against a live row ------------------------------------------------------------------

CREATE TEMP TABLE existing AS
SELECT e.* FROM x_jobs.enqueue('existing', queue => 'dedupe', idempotency_key => 'live-key') AS e;

CREATE TEMP TABLE against_live AS
SELECT r.*
FROM x_jobs.enqueue_many($$[
    {"name": "before", "queue": "dedupe", "idempotency_key": "new-key-1"},
    {"name": "again", "queue": "dedupe", "idempotency_key": "live-key"},
    {"name": "after", "queue": "dedupe"},
    {"name": "last", "queue": "dedupe", "idempotency_key": "new-key-2"}
]$$) AS r;

SELECT results_eq(
    $$ SELECT a.id, a.run_id, a.deduped FROM against_live AS a WHERE a.ord = 2 $$,
    $$ SELECT e.id, e.run_id, TRUE FROM existing AS e $$,
    'A request under the key of a live row should answer deduped with that row'
);

SELECT results_eq(
    $$ SELECT j.name FROM x_jobs.job AS j WHERE j.idempotency_key = 'live-key' $$,
    $$ VALUES ('existing') $$,
    'A request deduped against a live row should add no row'
);

SELECT is(
    array(
        SELECT a.id FROM against_live AS a
        WHERE NOT a.deduped
        ORDER BY a.ord
    ),
    array(
        SELECT a.id FROM against_live AS a
        WHERE NOT a.deduped
        ORDER BY a.id
    ),
    'Keyed and unkeyed rows of one batch should still get ids in input order'
);

SELECT results_eq(
    $$ SELECT a.ord, a.deduped FROM against_live AS a ORDER BY a.ord $$,
    $$ VALUES (1, FALSE), (2, TRUE), (3, FALSE), (4, FALSE) $$,
    'Around a deduped request, the other requests should make rows and answer in order'
);

-- Two requests of a key that a live row holds: the leader and the follower both answer it.
SELECT results_eq(
    $$
    SELECT r.ord, r.id, r.run_id, r.deduped
    FROM x_jobs.enqueue_many('[
        {"name": "again_lead", "queue": "dedupe", "idempotency_key": "live-key"},
        {"name": "again_follow", "queue": "dedupe", "idempotency_key": "live-key"}
    ]') AS r
    $$,
    $$ SELECT o.ord, e.id, e.run_id, TRUE FROM existing AS e CROSS JOIN (VALUES (1), (2)) AS o (ord) ORDER BY o.ord $$,
    'Every request of a batch under the key of a live row should answer deduped with that row'
);

-- Empty -----------------------------------------------------------------------------------------

SELECT is_empty(
    $$ SELECT * FROM x_jobs.enqueue_many('[]') $$,
    'An empty array should answer nothing'
);

-- Refusals of the batch's shape (XJ009) ----------------------------------------------------------

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many(NULL) $$,
    'XJ009', 'X_JOBS_INVALID: jobs is NULL, not an array',
    'NULL jobs should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('{"name": "not_in_an_array"}') $$,
    'XJ009', 'X_JOBS_INVALID: jobs is object, not an array',
    'A single object instead of an array should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "fine"}, 3]') $$,
    'XJ009', 'X_JOBS_INVALID: request 2 is number, not an object',
    'An element that is not an object should be refused, by position'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "fine"}, null]') $$,
    'XJ009', 'X_JOBS_INVALID: request 2 is null, not an object',
    'A JSON null element should be refused, by position'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "fine"}, {"name": "typo", "que": "q"}]') $$,
    'XJ009', 'X_JOBS_INVALID: request 2 has an unknown field ''que''',
    'An unknown field should be refused, naming the field and the request'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "typed", "max_attempts": "abc"}]') $$,
    'XJ009', 'X_JOBS_INVALID: a field has the wrong type: invalid input syntax for type integer: "abc"',
    'A field of the wrong type should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "typed", "run_at": "soon"}]') $$,
    'XJ009',
    'X_JOBS_INVALID: a field has the wrong type: invalid input syntax for type timestamp with time zone: "soon"',
    'A run_at that is not a timestamp should be refused'
);

-- The text fields must be JSON strings (0.3.8): the cast took an object, an array or a number as
-- its JSON text, a job named '{"a": 1}' or a key "12".
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.enqueue_many('[{"name": "fine"}, {"name": {"a": 1}}]')
    $q$) AS c
    $$,
    $$
    VALUES ('XJ009', 'X_JOBS_INVALID: name {"a": 1} of request 2 is not a string', '',
            'Pass name, queue, idempotency_key, tenant_id, concurrency_key, traceparent, enqueued_by, rate_limit_key as JSON '
            'strings, such as {"name": "send_email", "queue": "mail"}, or leave them out (name is required).')
    $$,
    'A name that is a JSON object should be refused, naming the field, its value and the request, with a HINT'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "typed", "queue": ["a", "b"]}]') $$,
    'XJ009', 'X_JOBS_INVALID: queue ["a", "b"] of request 1 is not a string',
    'A queue that is a JSON array should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "typed", "idempotency_key": 12}]') $$,
    'XJ009', 'X_JOBS_INVALID: idempotency_key 12 of request 1 is not a string',
    'An idempotency_key that is a JSON number should be refused'
);
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message
    FROM (VALUES ('tenant_id', 'true'), ('concurrency_key', '7'), ('traceparent', '{}'), ('enqueued_by', '[1]'))
        AS f (field, value)
    CROSS JOIN LATERAL tap_helpers.caught(pg_catalog.format(
        'SELECT * FROM x_jobs.enqueue_many(%L)', pg_catalog.format('[{"name": "typed", "%s": %s}]', f.field, f.value)
    )) AS c
    $$,
    $$
    VALUES ('XJ009', 'X_JOBS_INVALID: tenant_id true of request 1 is not a string'),
           ('XJ009', 'X_JOBS_INVALID: concurrency_key 7 of request 1 is not a string'),
           ('XJ009', 'X_JOBS_INVALID: traceparent {} of request 1 is not a string'),
           ('XJ009', 'X_JOBS_INVALID: enqueued_by [1] of request 1 is not a string')
    $$,
    'tenant_id, concurrency_key, traceparent and enqueued_by of another JSON type should be refused'
);
SELECT throws_ok(
    $$
    SELECT * FROM x_jobs.enqueue_many(jsonb_build_array(jsonb_build_object(
        'name', (SELECT jsonb_object_agg('k' || g, g) FROM generate_series(1, 100) AS g)
    )))
    $$,
    'XJ009',
    'X_JOBS_INVALID: name {"k1": 1, "k2": 2, "k3": 3, "k4": 4, "k5": 5, "k6": 6, "k7": 7, ... '
    '(1084 characters) of request 1 is not a string',
    'A long value of the wrong type should be shown by its first 64 characters and its length'
);
SELECT lives_ok(
    $$
    SELECT * FROM x_jobs.enqueue_many('[{"name": "typed", "queue": null, "idempotency_key": null, "tenant_id": null,
        "concurrency_key": null, "traceparent": null, "enqueued_by": null}]')
    $$,
    'JSON nulls should still stand for the defaults'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_hint
    FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.enqueue_many('[{"name": "typo", "que": "q"}]') $q$) AS c
    $$,
    $$
    VALUES ('XJ009',
            'Use the argument names of x_jobs.enqueue: name, input, queue, run_at, idempotency_key, '
            'max_attempts, priority, tenant_id, concurrency_key, concurrency_limit, traceparent, '
            'enqueued_by, dead_letter, backoff_base, backoff_max, keep_done, rate_limit_key.')
    $$,
    'The refusal of an unknown field should hint at every accepted field name'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_hint
    FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.enqueue_many('{}') $q$) AS c
    $$,
    $$
    VALUES ('XJ009', 'Pass a JSON array of objects, such as ''[{"name": "send_email", "input": {}}]''.')
    $$,
    'The refusal of a non-array should hint at the expected shape'
);

-- A request that breaks a rule: the whole batch is refused -----------------------------------

CREATE TEMP TABLE before_refusal AS
SELECT
    (SELECT count(*) FROM x_jobs.job) AS n_rows,
    (SELECT s.last_value FROM x_jobs.job_id_seq AS s) AS last_id;

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "ok1"}, {"name": "ok2"}, {"name": ""}, {"name": "ok4"}]') $$,
    'XJ001', 'X_NAME_INVALID: job name '''' is not a name',
    'A batch whose third request has an empty name should be refused with the name''s SQLSTATE'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message, c.err_detail
    FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.enqueue_many('[{"name": "ok1"}, {"name": "ok2"}, {"name": ""}, {"name": "ok4"}]')
    $q$) AS c
    $$,
    $$ VALUES ('XJ001', 'X_NAME_INVALID: job name '''' is not a name', 'In request 3.') $$,
    'The refusal should name the request that broke the rule in its DETAIL'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_detail
    FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.enqueue_many('[{"name": "ok1"}, {"name": "zero", "max_attempts": 0}]')
    $q$) AS c
    $$,
    $$ VALUES ('XJ004', 'In request 2 (job ''zero'').') $$,
    'A refusal in a batch should name the request and its job in its DETAIL'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_detail
    FROM tap_helpers.caught($q$
        SELECT * FROM x_jobs.enqueue_many('[{"name": "ok1"}, {"name": "p", "priority": 40000}, {"name": ""}]')
    $q$) AS c
    $$,
    $$ VALUES ('XJ005', 'In request 2 (job ''p'').') $$,
    'When several requests break rules, the first one in the batch should be reported'
);

SELECT throws_like(
    $$ SELECT * FROM x_jobs.enqueue_many('[{"name": "ok1"}, {"name": "c", "concurrency_limit": 2}]') $$,
    '%X_CONCURRENCY_INVALID%',
    'A validation refusal of enqueue should apply to a request of a batch too'
);

SELECT results_eq(
    $$
    SELECT (SELECT count(*) FROM x_jobs.job), (SELECT s.last_value FROM x_jobs.job_id_seq AS s)
    $$,
    $$ SELECT b.n_rows, b.last_id FROM before_refusal AS b $$,
    'A refused batch should insert nothing, not even its valid requests, and draw no id'
);

-- NULL (an omitted field) means the default (1 second, 1 hour), and the defaults are checked
-- with the given values: a max below the default base, or a base above the default max, is
-- refused exactly as enqueue refuses it.
SELECT throws_ok(
    $$SELECT * FROM x_jobs.enqueue_many('[{"name": "backoff_default_job", "backoff_max": "500 milliseconds"}]')$$,
    'XJ008',
    pg_catalog.format(
        'X_BACKOFF_INVALID: backoff from %s to %s is not a range', interval '1 second',
        interval '500 milliseconds'
    ),
    'A backoff_max below the default backoff_base should be refused, not stored as base above max'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.enqueue_many('[{"name": "backoff_default_job", "backoff_base": "2 hours"}]')$$,
    'XJ008',
    pg_catalog.format(
        'X_BACKOFF_INVALID: backoff from %s to %s is not a range', interval '2 hours',
        interval '1 hour'
    ),
    'A backoff_base above the default backoff_max should be refused, as enqueue refuses it'
);

-- A batch without idempotency keys: nothing can dedupe, so enqueue takes its one-INSERT path.
-- The same answers and the same rows as the general path above, every field included.
CREATE TEMP TABLE keyless AS
SELECT
    pg_catalog.row_number() OVER () AS pos,
    r.*
FROM x_jobs.enqueue_many($$[
    {"name": "kl_all", "input": {"n": 1}, "queue": "kl", "run_at": "2030-01-01T11:00:00Z",
     "max_attempts": 3, "priority": -7, "tenant_id": "acme", "concurrency_key": "kl-key",
     "concurrency_limit": 4, "traceparent": "00-kl-01", "enqueued_by": "pgtap",
     "dead_letter": false, "backoff_base": "5 seconds", "backoff_max": "10 minutes",
     "keep_done": false},
    {"name": "kl_later", "queue": "kl", "run_at": "2030-01-01T13:00:00Z"},
    {"name": "kl_bare"}
]$$) AS r;

SELECT results_eq(
    $$
    SELECT k.pos::integer, k.ord, k.deduped, j.name, j.run_id = k.run_id
    FROM keyless AS k LEFT JOIN x_jobs.job AS j ON j.id = k.id
    ORDER BY k.pos
    $$,
    $$ VALUES (1, 1, FALSE, 'kl_all', TRUE), (2, 2, FALSE, 'kl_later', TRUE), (3, 3, FALSE, 'kl_bare', TRUE) $$,
    'A keyless batch should answer each request in input order with the id and run_id of its row'
);

SELECT is(
    array(
        SELECT k.id FROM keyless AS k
        ORDER BY k.ord
    ),
    array(
        SELECT k.id FROM keyless AS k
        ORDER BY k.id
    ),
    'The rows of a keyless batch should be inserted in input order: ids ascend with ord'
);

SELECT results_eq(
    $$
    SELECT j.name, j.input, j.queue, j.run_at, j.state::text, j.max_attempts, j.priority::integer,
           j.tenant_id, j.concurrency_key, j.concurrency_limit, j.traceparent, j.enqueued_by,
           j.dead_letter, j.backoff_base, j.backoff_max, j.keep_done, j.created_at, j.attempt
    FROM keyless AS k JOIN x_jobs.job AS j ON j.id = k.id
    ORDER BY k.ord
    $$,
    $$ VALUES
    ('kl_all', '{"n": 1}'::jsonb, 'kl', '2030-01-01 11:00:00+00'::timestamptz, 'ready', 3, -7, 'acme',
     'kl-key', 4, '00-kl-01', 'pgtap', FALSE, interval '5 seconds', interval '10 minutes', FALSE,
     '2030-01-01 12:00:00+00'::timestamptz, 0),
    ('kl_later', '{}'::jsonb, 'kl', '2030-01-01 13:00:00+00'::timestamptz, 'delayed', 25, 0, 'none',
     NULL, NULL, NULL, NULL, TRUE, interval '1 second', interval '1 hour', TRUE,
     '2030-01-01 12:00:00+00'::timestamptz, 0),
    ('kl_bare', '{}'::jsonb, 'default', '2030-01-01 12:00:00+00'::timestamptz, 'ready', 25, 0, 'none',
     NULL, NULL, NULL, NULL, TRUE, interval '1 second', interval '1 hour', TRUE,
     '2030-01-01 12:00:00+00'::timestamptz, 0)
    $$,
    'A keyless batch should store every field it was given and the defaults of the ones it left out'
);

-- Run ids are UUIDv7: version 7, the RFC variant, the time of the enqueue in their first 48
-- bits, and within a batch they count up, so they ascend with ord and never repeat.
CREATE TEMP TABLE thousand AS
SELECT
    r.*,
    pg_catalog.clock_timestamp() AS answered_at
FROM x_jobs.enqueue_many(
    (
        SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', 'many_' || g))
        FROM generate_series(1, 1000) AS g
    )
) AS r;

SELECT results_eq(
    $$
    SELECT count(*)::integer, count(DISTINCT t.run_id)::integer,
           count(*) FILTER (WHERE pg_catalog.substr(t.run_id::text, 15, 1) = '7')::integer,
           count(*) FILTER (WHERE pg_catalog.substr(t.run_id::text, 20, 1) IN ('8', '9', 'a', 'b'))::integer
    FROM thousand AS t
    $$,
    $$ VALUES (1000, 1000, 1000, 1000) $$,
    'Each of 1,000 run ids of a batch should be distinct, of version 7 and of the RFC variant'
);

SELECT is(
    array(
        SELECT t.run_id FROM thousand AS t
        ORDER BY t.ord
    ),
    array(
        SELECT t.run_id FROM thousand AS t
        ORDER BY t.run_id
    ),
    'The run ids of a batch should ascend with ord'
);

SELECT ok(
    (
        SELECT
            bool_and(
                pg_catalog.to_timestamp(
                    (
                        'x'
                        || pg_catalog.lpad(pg_catalog.replace(pg_catalog.left(t.run_id::text, 13), '-', ''), 16, '0')
                    )::bit(64)::bigint
                    / 1000.0
                ) BETWEEN pg_catalog.statement_timestamp() - interval '1 minute' AND t.answered_at
            )
        FROM thousand AS t
    ),
    'A run id should carry the time it was drawn (the clock, not x_jobs.now) in its first 48 bits'
);

SELECT isnt(
    (SELECT pg_catalog.right(e.run_id::text, 12) FROM x_jobs.enqueue('one') AS e),
    (SELECT pg_catalog.right(e.run_id::text, 12) FROM x_jobs.enqueue('two') AS e),
    'Two calls should draw their run ids from different random starts'
);

SELECT * FROM finish();
ROLLBACK;
