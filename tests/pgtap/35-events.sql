-- x_jobs.publish records an event and resolves the open waits that match it (its name; its key,
-- or no key; a match its payload contains), once each: their suspended runs are due at once, a
-- running one is left running. x_jobs.resolve_step is the operator's way to resolve a waiting
-- step by hand. Every refusal of both, with its SQLSTATE, message and HINT. Each scenario is a
-- job in a queue of its own; the clock is moved with SET LOCAL "x_jobs.fake_now". The NOTIFY
-- a publish sends is not checked here (pgTAP cannot listen).

-- The isolation refusal needs a transaction whose isolation is set before its first query, which
-- the test transaction below cannot be (a publish must run at READ COMMITTED). So it runs first,
-- in two short transactions of its own that change no shared row (publish refuses before it
-- records anything, and tap_helpers.caught rolls its call back): what they caught is kept in a
-- temporary table, private to this session, and asserted inside the test transaction.
SET default_transaction_isolation = 'repeatable read';
BEGIN;

CREATE TEMP TABLE isolation_refusal AS
SELECT
    'repeatable read' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.publish('t35.isolation', '{}') $$) AS c;
COMMIT;

SET default_transaction_isolation = 'serializable';
BEGIN;
INSERT INTO isolation_refusal
SELECT
    'serializable' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.publish('t35.isolation', '{}', 'k') $$) AS c;
COMMIT;

-- step_wait refuses those levels too, before it looks at its arguments.
SET default_transaction_isolation = 'repeatable read';
BEGIN;
CREATE TEMP TABLE wait_refusal AS
SELECT
    'repeatable read' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.step_wait(-1, 'w', 'wait', 't35.isolation') $$) AS c;
COMMIT;

SET default_transaction_isolation = 'serializable';
BEGIN;
INSERT INTO wait_refusal
SELECT
    'serializable' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.step_wait(-1, 'w', 'wait', 't35.isolation') $$) AS c;
COMMIT;

RESET default_transaction_isolation;
BEGIN;
SELECT plan(44);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- Claims the job of a tag (its queue is 't35-' || tag) for `p_worker`; answers the attempt it
-- runs, or NULL when nothing was handed out.
CREATE FUNCTION pg_temp.take(p_tag text, p_worker text)
RETURNS integer
LANGUAGE sql
AS $$
    SELECT c.attempt
    FROM x_jobs.claim(ARRAY['t35-' || p_tag], p_worker, '1 hour', 10) AS c
    WHERE c.state = 'running'
$$;

-- What the publishes answered, by tag.
CREATE TEMP TABLE pub (tag text PRIMARY KEY, event_id bigint NOT NULL, woken integer NOT NULL);

-- Publishes an event, keeps what publish answered under a tag, and answers how many it woke.
CREATE FUNCTION pg_temp.publish_as(p_tag text, p_event text, p_payload jsonb DEFAULT NULL, p_key text DEFAULT NULL)
RETURNS integer
LANGUAGE sql
AS $$
    INSERT INTO pub (tag, event_id, woken)
    SELECT p_tag, p.event_id, p.woken FROM x_jobs.publish(p_event, p_payload, p_key) AS p
    RETURNING woken
$$;

CREATE FUNCTION pg_temp.eid(p_tag text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$ SELECT p.event_id FROM pub AS p WHERE p.tag = p_tag $$;

-- The waits of the test and the jobs they suspend, one row per tag, ordered by tag.
CREATE FUNCTION pg_temp.waits()
RETURNS TABLE (
    tag text, status text, output jsonb, event_id bigint, resolved_by text, resolved_at timestamptz,
    state text, claimed_by text, run_at timestamptz
)
LANGUAGE sql
STABLE
AS $$
    SELECT j.tag, s.status::text, s.output, s.event_id, s.resolved_by, s.resolved_at,
        k.state::text, k.claimed_by, k.run_at
    FROM j
    INNER JOIN x_jobs.job AS k ON j.id = k.id
    INNER JOIN x_jobs.step AS s ON j.id = s.job_id AND s.name = 'pay'
    ORDER BY j.tag
$$;

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM unnest(ARRAY['any', 'k1', 'k2', 'eur', 'ship', 'run', 'approve', 'sleepy']) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t35_' || t.tag, queue => 't35-' || t.tag) AS e;

SELECT is(
    (
        SELECT count(*)::integer FROM j
        WHERE pg_temp.take(j.tag, 'w1') = 1
    ),
    8,
    'Every job of the test should be running its first attempt, held by w1 (setup)'
);

-- Every wait below is on step 'pay' except the operator's two, and suspends its run.
SELECT results_eq(
    $$
    SELECT s.status::text, count(*)::integer
    FROM (
        SELECT w.* FROM x_jobs.step_wait(tap_helpers.jid('any'), 'w1', 'pay', 't35.paid') AS w
        UNION ALL
        SELECT w.* FROM x_jobs.step_wait(tap_helpers.jid('k1'), 'w1', 'pay', 't35.paid', 'o1') AS w
        UNION ALL
        SELECT w.* FROM x_jobs.step_wait(tap_helpers.jid('k2'), 'w1', 'pay', 't35.paid', 'o2') AS w
        UNION ALL
        SELECT w.*
        FROM x_jobs.step_wait(tap_helpers.jid('eur'), 'w1', 'pay', 't35.paid', match => '{"currency": "EUR"}') AS w
        UNION ALL
        SELECT w.* FROM x_jobs.step_wait(tap_helpers.jid('ship'), 'w1', 'pay', 't35.shipped') AS w
        UNION ALL
        SELECT w.*
        FROM x_jobs.step_wait(tap_helpers.jid('run'), 'w1', 'pay', 't35.paid', 'o1', timeout => '10 minutes') AS w
        UNION ALL
        SELECT w.* FROM x_jobs.step_wait(tap_helpers.jid('approve'), 'w1', 'approval', 't35.approved') AS w
        UNION ALL
        SELECT w.* FROM x_jobs.step_sleep(tap_helpers.jid('sleepy'), 'w1', 'nap', '1 hour') AS w
    ) AS s
    GROUP BY s.status
    $$,
    $$VALUES ('waiting', 8)$$,
    'Every wait and the sleep should be waiting (setup)'
);

-- The run of 'run' times out at 10:10 and is claimed again: running, its wait still open.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:10:00+00';

SELECT is(pg_temp.take('run', 'w2'), 1, 'The run whose wait timed out should be running on w2 again (setup)');

------------------------------------------------------------------------------------------------
-- publish: which waits a publish resolves
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:20:00+00';

SELECT is(
    pg_temp.publish_as('p1', 't35.paid', '{"amount": 5, "currency": "USD"}', 'o1'),
    2,
    'publish should answer how many suspended runs it woke: the keyless wait and the wait on its key'
);

SELECT results_eq(
    $$SELECT name, key, published_at, payload FROM x_jobs.event WHERE id = pg_temp.eid('p1')$$,
    $$VALUES ('t35.paid', 'o1', '2030-01-01 10:20:00+00'::timestamptz, '{"amount": 5, "currency": "USD"}'::jsonb)$$,
    'publish should record the event with its key, payload and the instant it was published'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.waits()$$,
    $$VALUES
        ('any', 'done', '{"amount": 5, "currency": "USD"}'::jsonb, pg_temp.eid('p1'), 'event',
         '2030-01-01 10:20:00+00'::timestamptz, 'ready', NULL::text, '2030-01-01 10:20:00+00'::timestamptz),
        ('eur', 'waiting', NULL, NULL, NULL, NULL, 'suspended', NULL, 'infinity'),
        ('k1', 'done', '{"amount": 5, "currency": "USD"}', pg_temp.eid('p1'), 'event',
         '2030-01-01 10:20:00+00', 'ready', NULL, '2030-01-01 10:20:00+00'),
        ('k2', 'waiting', NULL, NULL, NULL, NULL, 'suspended', NULL, 'infinity'),
        ('run', 'done', '{"amount": 5, "currency": "USD"}', pg_temp.eid('p1'), 'event',
         '2030-01-01 10:20:00+00', 'running', 'w2', '2030-01-01 10:10:00+00'),
        ('ship', 'waiting', NULL, NULL, NULL, NULL, 'suspended', NULL, 'infinity')$$,
    'A keyed publish should resolve the keyless waits and the waits on its key, with its payload, and make their '
    'suspended runs ready now; leave the waits on another key, on a match its payload lacks or on another '
    'event; and leave a running run running'
);

SELECT is(pg_temp.take('k1', 'w3'), 1, 'A run woken by a publish should be claimed at once');

SELECT results_eq(
    $$SELECT status::text, output, event_id
      FROM x_jobs.step_wait(tap_helpers.jid('k1'), 'w3', 'pay', 't35.paid', 'o1')$$,
    $$VALUES ('done', '{"amount": 5, "currency": "USD"}'::jsonb, pg_temp.eid('p1'))$$,
    'The woken run replaying its wait should get the payload of the event that resolved it'
);

SELECT results_eq(
    $$SELECT status::text, output FROM x_jobs.steps(tap_helpers.jid('run'), 'w2')$$,
    $$VALUES ('done', '{"amount": 5, "currency": "USD"}'::jsonb)$$,
    'A wait resolved by a publish after its timeout passed should stay done, not time out'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:30:00+00';

SELECT is(
    pg_temp.publish_as('p2', 't35.paid', '{"currency": "EUR", "amount": 7}'),
    1,
    'A keyless publish should wake only the open keyless wait whose match its payload contains'
);

SELECT results_eq(
    $$SELECT tag, status, event_id, state, run_at FROM pg_temp.waits() WHERE tag IN ('any', 'eur', 'k2')$$,
    $$VALUES ('any', 'done', pg_temp.eid('p1'), 'ready', '2030-01-01 10:20:00+00'::timestamptz),
             ('eur', 'done', pg_temp.eid('p2'), 'ready', '2030-01-01 10:30:00+00'),
             ('k2', 'waiting', NULL, 'suspended', 'infinity')$$,
    'A keyless publish should resolve a wait on its match, not a keyed wait, and not resolve a resolved wait again'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:40:00+00';

SELECT is(pg_temp.publish_as('p3', 't35.paid', '{"n": 3}', 'o2'), 1, 'A publish on a key should wake its wait');

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:41:00+00';

SELECT is(
    pg_temp.publish_as('p4', 't35.paid', '{"n": 4}', 'o2'),
    0,
    'A second publish on the same key should wake nothing: its wait is resolved already'
);

SELECT results_eq(
    $$SELECT tag, status, output, event_id, resolved_at FROM pg_temp.waits() WHERE tag = 'k2'$$,
    $$VALUES ('k2', 'done', '{"n": 3}'::jsonb, pg_temp.eid('p3'), '2030-01-01 10:40:00+00'::timestamptz)$$,
    'A wait resolved once should keep the first event: a second publish does not resolve it again'
);

SELECT is(pg_temp.publish_as('p5', 't35.nobody'), 0, 'An event no one waits for should wake nobody');

SELECT results_eq(
    $$SELECT name, key, payload FROM x_jobs.event WHERE id = pg_temp.eid('p5')$$,
    $$VALUES ('t35.nobody', NULL::text, NULL::jsonb)$$,
    'An event no one waits for should be recorded too, with no key and no payload'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.event
        WHERE name LIKE 't35.%'
    ),
    5,
    'Every publish should have recorded one event'
);

SELECT cmp_ok(
    pg_temp.eid('p1'), '<', pg_temp.eid('p2'),
    'Event ids should follow the order of the publishes'
);

SELECT results_eq(
    $$SELECT tag, status, state FROM pg_temp.waits() WHERE tag = 'ship'$$,
    $$VALUES ('ship', 'waiting', 'suspended')$$,
    'A wait on another event name should be left waiting by every publish'
);

SELECT is(pg_temp.publish_as('p6', 't35.shipped'), 1, 'A publish of another event should wake its own wait');

SELECT results_eq(
    $$SELECT tag, status, output, event_id, state, run_at FROM pg_temp.waits() WHERE tag = 'ship'$$,
    $$VALUES ('ship', 'done', NULL::jsonb, pg_temp.eid('p6'), 'ready', '2030-01-01 10:41:00+00'::timestamptz)$$,
    'A publish without payload should resolve a wait without match, with no output'
);

------------------------------------------------------------------------------------------------
-- publish: refusals
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT iso_level, err_state, err_message, err_hint FROM isolation_refusal ORDER BY iso_level$$,
    $$VALUES
        ('repeatable read', 'XJ022', 'X_ISOLATION_UNSUPPORTED: publish cannot run at isolation level repeatable read',
         'Publish from a READ COMMITTED transaction (the default).'),
        ('serializable', 'XJ022', 'X_ISOLATION_UNSUPPORTED: publish cannot run at isolation level serializable',
         'Publish from a READ COMMITTED transaction (the default).')$$,
    'publish should refuse to run at REPEATABLE READ and SERIALIZABLE, with a HINT'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.event WHERE name = 't35.isolation'$$,
    'The refused publishes should have recorded no event'
);

-- A wait that looked for its event in the snapshot its transaction began with would miss a
-- publish that committed while it waited for the event's lock: that publish found no step to
-- wake, and the run would sleep past its event.
SELECT results_eq(
    $$SELECT iso_level, err_state, err_message, err_hint FROM wait_refusal ORDER BY iso_level$$,
    $$VALUES
        ('repeatable read', 'XJ022', 'X_ISOLATION_UNSUPPORTED: step_wait cannot run at isolation level repeatable read',
         'Wait from a READ COMMITTED transaction (the default).'),
        ('serializable', 'XJ022', 'X_ISOLATION_UNSUPPORTED: step_wait cannot run at isolation level serializable',
         'Wait from a READ COMMITTED transaction (the default).')$$,
    'step_wait should refuse to run at REPEATABLE READ and SERIALIZABLE, with a HINT'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.publish('') $q$)$$,
    $$VALUES ('XJ028', 'X_EVENT_INVALID: event name '''' is missing, empty or longer than 200 characters', '',
              'Name the event with a short text, such as ''order.paid''.')$$,
    'publish should refuse an empty event name, with a HINT'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.publish(NULL, '{}')$$,
    'XJ028',
    'X_EVENT_INVALID: event name NULL is missing, empty or longer than 200 characters',
    'publish should refuse a missing event name'
);

-- A key of thousands of characters was a bare btree error (54000) from publish and step_wait.
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message, c.err_hint
    FROM tap_helpers.caught(pg_catalog.format(
        'SELECT * FROM x_jobs.publish(%L, %L, key => %L)', 't35.long', '{}', pg_catalog.repeat('k', 3000)
    )) AS c
    $$,
    $$VALUES ('XJ028',
              pg_catalog.format('X_EVENT_INVALID: event key %L is longer than 400 characters', pg_catalog.repeat('k', 410)),
              'Key events with a short text, such as an order id; put the rest in the payload.')$$,
    'publish should refuse a key longer than 400 characters, with a HINT'
);
SELECT lives_ok(
    pg_catalog.format('SELECT * FROM x_jobs.publish(%L, %L, key => %L)', 't35.long', '{}', pg_catalog.repeat('k', 400)),
    'publish should accept a key of 400 characters'
);

SELECT throws_ok(
    pg_catalog.format($$SELECT * FROM x_jobs.publish(%L)$$, pg_catalog.repeat('e', 201)),
    'XJ028',
    pg_catalog.format(
        'X_EVENT_INVALID: event name %L is missing, empty or longer than 200 characters', pg_catalog.repeat('e', 201)
    ),
    'publish should refuse an event name of 201 characters'
);

SELECT is(
    (SELECT p.woken FROM x_jobs.publish(pg_catalog.repeat('e', 200)) AS p),
    0,
    'publish should accept an event name of 200 characters'
);

SET LOCAL "x_jobs.max_payload_bytes" = '100';

SELECT results_eq(
    $$SELECT err_state, err_message LIKE 'X_PAYLOAD_TOO_LARGE: payload of % bytes exceeds the limit of 100',
             err_detail, err_hint
      FROM tap_helpers.caught(
          $q$ SELECT * FROM x_jobs.publish('t35.big', pg_catalog.jsonb_build_object('x', pg_catalog.repeat('x', 200)))
          $q$
      )$$,
    $$VALUES ('XJ003', TRUE, 'For event ''t35.big''.',
              'Publish a reference to large data, or raise x_jobs.max_payload_bytes.')$$,
    'publish should refuse a payload larger than x_jobs.max_payload_bytes, with a DETAIL and a HINT'
);

RESET "x_jobs.max_payload_bytes";

-- A payload read from a table arrives compressed: 3 MB of one letter is stored in about 35 kB,
-- which pg_column_size counted (0.3.6 measures it uncompressed).
CREATE TEMP TABLE t35_stored (payload jsonb);
INSERT INTO t35_stored SELECT pg_catalog.jsonb_build_object('x', pg_catalog.repeat('x', 3000000));

SELECT throws_ok(
    $$SELECT p.* FROM t35_stored AS s, x_jobs.publish('t35.big', s.payload) AS p$$,
    'XJ003',
    'X_PAYLOAD_TOO_LARGE: payload of 3000017 bytes exceeds the limit of 1048576',
    'publish should measure a compressed payload (from a table) by its uncompressed size'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.event WHERE name IN ('', 't35.big')$$,
    'The refused publishes should have recorded no event'
);

------------------------------------------------------------------------------------------------
-- resolve_step
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:50:00+00';

SELECT results_eq(
    $$SELECT job_id, name, status::text, output, event_id, resolved_by, resolved_at
      FROM x_jobs.resolve_step(tap_helpers.jid('approve'), 'approval', '{"by": "ops"}')$$,
    $$VALUES (tap_helpers.jid('approve'), 'approval', 'done', '{"by": "ops"}'::jsonb, NULL::bigint, 'operator',
              '2030-01-01 10:50:00+00'::timestamptz)$$,
    'resolve_step should answer the step done with the output given, resolved by the operator now'
);

SELECT results_eq(
    $$SELECT state::text, claimed_by, run_at FROM x_jobs.job WHERE id = tap_helpers.jid('approve')$$,
    $$VALUES ('ready', NULL::text, '2030-01-01 10:50:00+00'::timestamptz)$$,
    'resolve_step should make the suspended run ready now'
);

SELECT results_eq(
    $$SELECT status::text, output, resolved_by FROM x_jobs.resolve_step(tap_helpers.jid('sleepy'), 'nap')$$,
    $$VALUES ('done', NULL::jsonb, 'operator')$$,
    'resolve_step without an output should answer a sleep done, with no output'
);

SELECT results_eq(
    $$SELECT state::text, run_at FROM x_jobs.job WHERE id = tap_helpers.jid('sleepy')$$,
    $$VALUES ('ready', '2030-01-01 10:50:00+00'::timestamptz)$$,
    'resolve_step should end a sleep early: its run ready now instead of at the wake time'
);

SELECT is(pg_temp.take('approve', 'w4'), 1, 'A run resolved by the operator should be claimed at once');

SELECT results_eq(
    $$SELECT status::text, output FROM x_jobs.step_wait(tap_helpers.jid('approve'), 'w4', 'approval', 't35.approved')$$,
    $$VALUES ('done', '{"by": "ops"}'::jsonb)$$,
    'The wait replayed after resolve_step should answer the output the operator gave'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.resolve_step(tap_helpers.jid('approve'), 'approval') $q$)$$,
    $$VALUES ('XJ030',
      pg_catalog.format('X_JOB_HELD: job %s is running on worker ''w4''', tap_helpers.jid('approve')), '',
              'Resolve a step while its run is suspended; wait for the worker to suspend or settle it.')$$,
    'resolve_step should refuse a job that a worker holds, with a HINT'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.resolve_step(tap_helpers.jid('sleepy'), 'nap') $q$)$$,
    $$VALUES ('XJ032',
              pg_catalog.format('X_STEP_NOT_WAITING: step ''nap'' of job %s is done', tap_helpers.jid('sleepy')), '',
              'Only a waiting step (a sleep or a wait on an event) can be resolved.')$$,
    'resolve_step should refuse a step that is no longer waiting, with a HINT'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.resolve_step(tap_helpers.jid('sleepy'), 'charge') $q$)$$,
    $$VALUES ('XJ031',
      pg_catalog.format('X_STEP_NOT_FOUND: job %s has no step ''charge''', tap_helpers.jid('sleepy')), '',
              'List the job''s steps with `x-jobs jobs show`; a step exists once the run reached it.')$$,
    'resolve_step should refuse a step the run never reached, with a HINT'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.resolve_step(-1, 'nap') $q$)$$,
    $$VALUES ('XJ014', 'X_JOB_NOT_FOUND: no job has id -1', '',
              'Check the id; finished jobs are removed by purge after their retention.')$$,
    'resolve_step should refuse a job that does not exist, with a HINT'
);

SELECT results_eq(
    $$SELECT status::text, output, resolved_by FROM x_jobs.step
      WHERE job_id = tap_helpers.jid('sleepy') AND name = 'nap'$$,
    $$VALUES ('done', NULL::jsonb, 'operator')$$,
    'The refused resolve_step calls should have changed nothing'
);

SELECT * FROM finish();
ROLLBACK;
