-- x_jobs.announce_worker keeps the fleet's rows (draining_at is stamped once and kept; rows gone
-- for a day are swept), and x_jobs.queue_demand counts per queue what a serving worker must hold:
-- due rows of open queues, and running rows not held by a live draining worker.
-- The clock is moved with SET LOCAL "x_jobs.fake_now".
BEGIN;
SELECT plan(41);

------------------------------------------------------------------------------------------------
-- announce_worker
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

SELECT results_eq(
    $$SELECT * FROM x_jobs.announce_worker('t50-w1', ARRAY['a', 'b'], 'v1', FALSE, '60 seconds')$$,
    $$VALUES ('t50-w1', ARRAY['a', 'b'], 'v1', '2030-01-01 10:00:00+00'::timestamptz,
              '2030-01-01 10:00:00+00'::timestamptz, '2030-01-01 10:01:00+00'::timestamptz, NULL::timestamptz,
              NULL::text[])$$,
    'The first announce should answer a new row: started and seen now, expiring at now + ttl, not draining'
);

SELECT results_eq(
    $$SELECT * FROM x_jobs.worker WHERE id = 't50-w1'$$,
    $$VALUES ('t50-w1', ARRAY['a', 'b'], 'v1', '2030-01-01 10:00:00+00'::timestamptz,
              '2030-01-01 10:00:00+00'::timestamptz, '2030-01-01 10:01:00+00'::timestamptz, NULL::timestamptz,
              NULL::text[])$$,
    'The first announce should insert the worker''s row'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:20+00';

SELECT results_eq(
    $$SELECT * FROM x_jobs.announce_worker('t50-w1', ARRAY['c'], 'v2', FALSE, '2 minutes')$$,
    $$VALUES ('t50-w1', ARRAY['c'], 'v2', '2030-01-01 10:00:00+00'::timestamptz,
              '2030-01-01 10:00:20+00'::timestamptz, '2030-01-01 10:02:20+00'::timestamptz, NULL::timestamptz,
              NULL::text[])$$,
    'A later announce should update queues, build, seen_at and expires_at, and keep started_at'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.worker
        WHERE id = 't50-w1'
    ),
    1,
    'Announcing twice should keep one row per worker'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:40+00';

SELECT is(
    (SELECT w.draining_at FROM x_jobs.announce_worker('t50-w1', ARRAY['c'], 'v2', TRUE) AS w),
    '2030-01-01 10:00:40+00'::timestamptz,
    'The first draining announce should stamp draining_at with now'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:00+00';

SELECT is(
    (SELECT w.draining_at FROM x_jobs.announce_worker('t50-w1', ARRAY['c'], 'v2', TRUE) AS w),
    '2030-01-01 10:00:40+00'::timestamptz,
    'A later draining announce should keep the first draining_at'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:20+00';

SELECT results_eq(
    $$SELECT draining_at, seen_at, expires_at FROM x_jobs.announce_worker('t50-w1', ARRAY['c'], 'v2', FALSE)$$,
    $$VALUES ('2030-01-01 10:00:40+00'::timestamptz, '2030-01-01 10:01:20+00'::timestamptz,
              '2030-01-01 10:02:20+00'::timestamptz)$$,
    'An announce with draining false should keep draining_at (a draining worker never serves again)'
);

SELECT is(
    (SELECT w.draining_at FROM x_jobs.announce_worker('t50-w2', ARRAY['a'], draining => TRUE) AS w),
    '2030-01-01 10:01:20+00'::timestamptz,
    'A worker whose first announce is draining should be stamped at once'
);

-- Rows of workers that stopped announcing: one expired over a day ago, one 23 hours ago.
INSERT INTO x_jobs.worker (id, queues, build, started_at, seen_at, expires_at, draining_at)
VALUES
('t50-old', ARRAY['a'], NULL, '2029-12-20 00:00:00+00', '2029-12-31 10:00:00+00', '2029-12-31 10:01:19+00', NULL),
('t50-recent', ARRAY['a'], NULL, '2029-12-20 00:00:00+00', '2029-12-31 11:00:00+00', '2029-12-31 11:01:20+00', NULL);

SELECT is(
    (SELECT w.id FROM x_jobs.announce_worker('t50-w3', ARRAY['a']) AS w),
    't50-w3',
    'Another worker''s announce should answer its own row'
);

SELECT results_eq(
    $$SELECT id FROM x_jobs.worker WHERE id LIKE 't50-%' ORDER BY id$$,
    $$VALUES ('t50-recent'), ('t50-w1'), ('t50-w2'), ('t50-w3')$$,
    'Any announce should delete the rows that expired over a day ago, and keep the others'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('', ARRAY['a'])$$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'announce_worker should refuse an empty worker id'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker(NULL, ARRAY['a'])$$,
    'XJ011',
    'X_WORKER_INVALID: worker id NULL is empty',
    'announce_worker should refuse a NULL worker id'
);

-- The id is the primary key of x_jobs.worker (0.3.8): 6,400 incompressible characters failed
-- with a bare 54000. Every function taking a worker id refuses what announce would.
CREATE TEMP TABLE long_text AS
SELECT string_agg(md5(g.i::text), '' ORDER BY g.i) AS v FROM generate_series(1, 200) AS g (i);
SELECT results_eq(
    $$
    SELECT c.*
    FROM tap_helpers.caught($q$ SELECT x_jobs.announce_worker((SELECT v FROM long_text), ARRAY['a']) $q$) AS c
    $$,
    $$VALUES ('XJ011',
              'X_WORKER_INVALID: worker id ''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... '
              'is 6400 characters, longer than 400',
              '', 'Use a worker id of 1 to 400 characters, such as host:pid:random.')$$,
    'announce_worker should refuse a worker id of 6,400 characters, naming its length, with a HINT'
);
SELECT results_eq(
    $$
    SELECT f.fn, c.err_state, c.err_message LIKE 'X_WORKER_INVALID: worker id % is 6400 characters, longer than 400'
    FROM (VALUES
        ('claim', $q$ SELECT * FROM x_jobs.claim(ARRAY['a'], (SELECT v FROM long_text)) $q$),
        ('extend_lease', $q$ SELECT * FROM x_jobs.extend_lease('{1}', (SELECT v FROM long_text)) $q$),
        ('release', $q$ SELECT * FROM x_jobs.release('{1}', (SELECT v FROM long_text)) $q$),
        ('complete', $q$ SELECT x_jobs.complete(1, (SELECT v FROM long_text)) $q$),
        ('fail', $q$ SELECT x_jobs.fail(1, (SELECT v FROM long_text), 'boom') $q$),
        ('steps', $q$ SELECT * FROM x_jobs.steps(1, (SELECT v FROM long_text)) $q$),
        ('progress', $q$ SELECT x_jobs.progress(1, (SELECT v FROM long_text)) $q$)
    ) AS f (fn, stmt)
    CROSS JOIN LATERAL tap_helpers.caught(f.stmt) AS c
    $$,
    $$VALUES ('claim', 'XJ011', TRUE), ('extend_lease', 'XJ011', TRUE), ('release', 'XJ011', TRUE),
             ('complete', 'XJ011', TRUE), ('fail', 'XJ011', TRUE), ('steps', 'XJ011', TRUE),
             ('progress', 'XJ011', TRUE)$$,
    'Every function taking a worker id should refuse one of 6,400 characters'
);
SELECT lives_ok(
    $$SELECT x_jobs.announce_worker(repeat('🔑', 400), ARRAY['a'])$$,
    'announce_worker should accept a worker id of 400 four-byte characters'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', NULL)$$,
    'XJ010',
    'X_QUEUES_INVALID: queue list NULL is not a list of queues',
    'announce_worker should refuse a NULL queue list'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', '{}')$$,
    'XJ010',
    'X_QUEUES_INVALID: queue list {} is not a list of queues',
    'announce_worker should refuse an empty queue list, as claim does'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', ARRAY['a', ''])$$,
    'XJ010',
    pg_catalog.format('X_QUEUES_INVALID: queue list %s is not a list of queues', ARRAY['a', '']),
    'announce_worker should refuse a queue list holding an empty name'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', ARRAY['a', NULL])$$,
    'XJ010',
    pg_catalog.format('X_QUEUES_INVALID: queue list %s is not a list of queues', ARRAY['a', NULL]),
    'announce_worker should refuse a queue list holding a NULL name'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', ARRAY['a'], ttl => '0')$$,
    'XJ019',
    pg_catalog.format('X_TTL_INVALID: ttl %s is not positive', interval '0'),
    'announce_worker should refuse a ttl of 0'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', ARRAY['a'], ttl => NULL)$$,
    'XJ019',
    'X_TTL_INVALID: ttl NULL is not positive',
    'announce_worker should refuse a NULL ttl'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', ARRAY['a'], ttl => '-1 minute')$$,
    'XJ019',
    pg_catalog.format('X_TTL_INVALID: ttl %s is not positive', interval '-1 minute'),
    'announce_worker should refuse a negative ttl'
);

SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t50-w1', ARRAY['a'], ttl => '300000 years')$$,
    'XJ019',
    'X_TTL_INVALID: ttl 300000 years is longer than 1000 years',
    'announce_worker should refuse a ttl of millennia'
);

------------------------------------------------------------------------------------------------
-- queue_demand
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

CREATE FUNCTION pg_temp.demand(p_queue text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$ SELECT d.demand FROM x_jobs.queue_demand() AS d WHERE d.queue = p_queue $$;

CREATE FUNCTION pg_temp.put(p_tag text, p_queue text, p_run_at timestamptz DEFAULT NULL)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO j (tag, id)
    SELECT p_tag, e.id FROM x_jobs.enqueue('t50_job', queue => p_queue, run_at => p_run_at) AS e
$$;

CREATE TEMP TABLE claims (id bigint NOT NULL, worker text NOT NULL);

CREATE FUNCTION pg_temp.take(p_queue text, p_worker text, p_qty integer)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO claims (id, worker)
    SELECT c.id, c.claimed_by FROM x_jobs.claim(ARRAY[p_queue], p_worker, '1 minute', p_qty) AS c
$$;

-- 09:00: a delayed row due at 09:30, and a draining worker that claims two rows and goes away
-- (its row expires at 09:01).
SET LOCAL "x_jobs.fake_now" = '2030-01-01 09:00:00+00';

DO $$
BEGIN
    PERFORM pg_temp.put('a_delayed_due', 'dq-a', '2030-01-01 09:30:00+00');
    PERFORM x_jobs.announce_worker('t50-gone', ARRAY['dq-c'], draining => TRUE, ttl => '1 minute');
    PERFORM pg_temp.put('c_gone1', 'dq-c');
    PERFORM pg_temp.put('c_gone2', 'dq-c');
    PERFORM pg_temp.take('dq-c', 't50-gone', 2);
END
$$;

-- 10:00: the rest. dq-b: two rows held by a live draining worker, one by a live serving worker,
-- one ready. dq-d: a row held by a worker that never announced. dq-p: paused, one row running.
-- dq-e: only a future row. dq-f: only a done row.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

DO $$
BEGIN
    PERFORM pg_temp.put('a_ready1', 'dq-a');
    PERFORM pg_temp.put('a_ready2', 'dq-a');
    PERFORM pg_temp.put('a_delayed_future', 'dq-a', '2030-01-01 11:00:00+00');
    PERFORM pg_temp.put('a_suspended_due', 'dq-a');
    PERFORM pg_temp.put('a_suspended_future', 'dq-a');
    PERFORM pg_temp.put('a_cancelled', 'dq-a');
    PERFORM x_jobs.cancel(tap_helpers.jid('a_cancelled'));

    PERFORM x_jobs.announce_worker('t50-drainer', ARRAY['dq-b'], draining => TRUE, ttl => '10 minutes');
    PERFORM x_jobs.announce_worker('t50-steady', ARRAY['dq-b', 'dq-p'], ttl => '10 minutes');
    PERFORM pg_temp.put('b_drain1', 'dq-b');
    PERFORM pg_temp.put('b_drain2', 'dq-b');
    PERFORM pg_temp.take('dq-b', 't50-drainer', 2);
    PERFORM pg_temp.put('b_steady', 'dq-b');
    PERFORM pg_temp.take('dq-b', 't50-steady', 1);
    PERFORM pg_temp.put('b_ready', 'dq-b');

    PERFORM pg_temp.put('d_nobody', 'dq-d');
    PERFORM pg_temp.take('dq-d', 't50-nobody', 1);

    PERFORM pg_temp.put('p_running', 'dq-p');
    PERFORM pg_temp.take('dq-p', 't50-steady', 1);
    PERFORM pg_temp.put('p_ready1', 'dq-p');
    PERFORM pg_temp.put('p_ready2', 'dq-p');
    PERFORM x_jobs.pause_queue('dq-p');

    PERFORM pg_temp.put('e_future', 'dq-e', '2030-01-01 11:00:00+00');

    PERFORM pg_temp.put('f_done', 'dq-f');
    PERFORM pg_temp.take('dq-f', 't50-steady', 1);
    PERFORM x_jobs.complete(tap_helpers.jid('f_done'), 't50-steady');
END
$$;

-- Suspended rows come from steps; there is no API to make one here, so set them directly.
UPDATE x_jobs.job SET
    state = 'suspended',
    run_at = '2030-01-01 09:45:00+00'
WHERE id = tap_helpers.jid('a_suspended_due');

UPDATE x_jobs.job SET
    state = 'suspended',
    run_at = '2030-01-01 11:00:00+00'
WHERE id = tap_helpers.jid('a_suspended_future');

SELECT results_eq(
    $$SELECT c.worker, count(*)::integer FROM claims AS c GROUP BY c.worker ORDER BY c.worker$$,
    $$VALUES ('t50-drainer', 2), ('t50-gone', 2), ('t50-nobody', 1), ('t50-steady', 3)$$,
    'The demand fixture should have its running rows held by the intended workers'
);

SELECT is(
    pg_temp.demand('dq-a'),
    4::bigint,
    'queue_demand should count ready rows and the delayed and suspended rows whose run_at came, not future ones'
);

SELECT is(
    pg_temp.demand('dq-b'),
    2::bigint,
    'queue_demand should leave out the running rows of a live draining worker, and count those of a serving one'
);

SELECT is(
    pg_temp.demand('dq-c'),
    2::bigint,
    'queue_demand should count the running rows of a draining worker whose row expired'
);

SELECT is(
    pg_temp.demand('dq-d'),
    1::bigint,
    'queue_demand should count a running row whose claimer never announced'
);

SELECT is(
    pg_temp.demand('dq-p'),
    1::bigint,
    'queue_demand should leave out the due rows of a paused queue and count its running row'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue IN ('dq-e', 'dq-f')$$,
    'A queue with only future or finished rows should be absent from queue_demand'
);

SELECT results_eq(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue LIKE 'dq-%'$$,
    $$VALUES ('dq-a', 4::bigint), ('dq-b', 2::bigint), ('dq-c', 2::bigint), ('dq-d', 1::bigint),
             ('dq-p', 1::bigint)$$,
    'queue_demand should answer one row per queue with demand, ordered by queue'
);

-- 10:05: the leases of 10:00 (1 minute) lapsed; the workers' rows (10 minutes) live on.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:05:00+00';

SELECT is(
    pg_temp.demand('dq-b'),
    4::bigint,
    'queue_demand should count the lapsed rows of a live draining worker: the next claim takes them'
);

SELECT is(
    pg_temp.demand('dq-p'),
    NULL,
    'queue_demand should leave out a lapsed running row of a paused queue: no claim can take it'
);

-- 12:00: the future rows came due, and the draining worker's row expired (10:10).
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

SELECT results_eq(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue LIKE 'dq-%'$$,
    $$VALUES ('dq-a', 6::bigint), ('dq-b', 4::bigint), ('dq-c', 2::bigint), ('dq-d', 1::bigint),
             ('dq-e', 1::bigint)$$,
    'Later, queue_demand should count the rows that came due and the lapsed running rows of open queues'
);

SELECT is(
    pg_temp.demand('dq-b'),
    4::bigint,
    'The running rows of a draining worker should count again once its row expired'
);

-- Keyed rows count while their key has room, as claim grants them. dk-keyed: five rows of k1
-- (limit 2, one running), three of k2 (limit 1), two without a key: 1 running + 1 + 1 + 2.
DO $$
BEGIN
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-keyed', concurrency_key => 'k1', concurrency_limit => 2)
    FROM generate_series(1, 5);
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-keyed', concurrency_key => 'k2')
    FROM generate_series(1, 3);
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-keyed') FROM generate_series(1, 2);
    PERFORM pg_temp.take('dk-keyed', 't50-steady', 1);
END
$$;

SELECT is(
    pg_temp.demand('dk-keyed'),
    5::bigint,
    'queue_demand should count a key''s due rows only up to its room (limit less its running rows)'
);
SELECT is(
    (
        SELECT q.demand FROM x_jobs.queue_stats() AS q
        WHERE q.queue = 'dk-keyed'
    ),
    5::bigint,
    'queue_stats should show the same demand'
);

-- A key's rank runs across queues, in claim order (priority, then run_at, then id), and only over
-- rows of open queues. k3 (limit 1): the oldest row is in paused dk-x, so dk-y's row has the
-- slot. k4 (limit 2): a row of dk-y2 ahead by priority, then the oldest of dk-y1; dk-y1's
-- second row and dk-y2's later one wait. k5 (limit 1) runs a row already, so dk-z, whose only
-- due rows are k5's, has no demand and is absent.
DO $$
BEGIN
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-x', concurrency_key => 'k3');
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-y', concurrency_key => 'k3');
    PERFORM x_jobs.pause_queue('dk-x');
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-y1', concurrency_key => 'k4', concurrency_limit => 2)
    FROM generate_series(1, 2);
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-y2', concurrency_key => 'k4', concurrency_limit => 2,
        priority => 1);
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-y2', concurrency_key => 'k4', concurrency_limit => 2,
        priority => -1);
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-z', concurrency_key => 'k5') FROM generate_series(1, 3);
    PERFORM pg_temp.take('dk-z', 't50-steady', 1);
END
$$;

SELECT results_eq(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue IN ('dk-x', 'dk-y', 'dk-y1', 'dk-y2')$$,
    $$VALUES ('dk-y', 1::bigint), ('dk-y1', 1::bigint), ('dk-y2', 1::bigint)$$,
    'A key''s room should go to its rows of open queues in claim order, whichever queue they are in'
);

SELECT is(
    pg_temp.demand('dk-z'),
    1::bigint,
    'A queue whose due rows are all denied by a full key should count only its running row'
);

-- A keyed row whose run_at came ranks with the ready ones: it is older, so it takes k6's slot.
DO $$
BEGIN
    PERFORM pg_temp.put('kd_delayed', 'dk-w');
    PERFORM x_jobs.enqueue('t50_job', queue => 'dk-v', concurrency_key => 'k6');
    UPDATE x_jobs.job SET concurrency_key = 'k6', concurrency_limit = 1, state = 'delayed',
        run_at = '2030-01-01 11:30:00+00'
    WHERE id = tap_helpers.jid('kd_delayed');
END
$$;

SELECT results_eq(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue IN ('dk-v', 'dk-w')$$,
    $$VALUES ('dk-w', 1::bigint)$$,
    'A due delayed row with a key should rank with the ready rows of its key, by run_at'
);

DO $$
BEGIN
    PERFORM x_jobs.resume_queue('dq-p');
END
$$;

SELECT is(
    pg_temp.demand('dq-p'),
    3::bigint,
    'Once resumed, a queue''s due rows should count again'
);

SELECT * FROM finish();
ROLLBACK;
