-- Retention. x_jobs.purge deletes, in bounded batches and lowest id first, the terminal rows that
-- finished longer ago than older_than, with their job_error history and their steps, and never a
-- live row. x_jobs.purge_events deletes, the same way, the events published longer ago than
-- older_than. x_jobs.rollup_counters folds old minute buckets into hours, old hours into days,
-- and drops old days, keeping the sums. The clock is moved with SET LOCAL "x_jobs.fake_now".
BEGIN;
SELECT plan(46);

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- The tags of the rows of this test that are still in x_jobs.job.
CREATE FUNCTION pg_temp.left_tags()
RETURNS text[]
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(pg_catalog.array_agg(j.tag ORDER BY j.tag), '{}')
    FROM j JOIN x_jobs.job AS k ON k.id = j.id
$$;

------------------------------------------------------------------------------------------------
-- purge: the fixture
------------------------------------------------------------------------------------------------

-- Terminal rows finish on Jan 1 (done), 2 (failed), 3 (dead), 4 (cancelled) and 15 (done).
-- Live rows: l_ready, l_delayed, l_running (its lease lapsed long ago), l_retried (ready again
-- after a failure, with a job_error row). d1, r1 and l_running recorded steps.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 00:00:00+00';

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (
    VALUES
    ('d1', NULL::timestamptz, 25, TRUE),
    ('f1', NULL, 1, FALSE),
    ('x1', NULL, 1, TRUE),
    ('c1', NULL, 25, TRUE),
    ('l_ready', NULL, 25, TRUE),
    ('l_delayed', '2030-02-01 00:00:00+00', 25, TRUE),
    ('l_running', NULL, 25, TRUE),
    ('l_retried', NULL, 25, TRUE)
) AS t (tag, run_at, max_attempts, dead_letter)
CROSS JOIN LATERAL x_jobs.enqueue(
    't60_' || t.tag, queue => 't60-' || t.tag, run_at => t.run_at, max_attempts => t.max_attempts,
    dead_letter => t.dead_letter
) AS e;

CREATE TEMP TABLE claims AS
SELECT c.id
FROM x_jobs.claim(ARRAY['t60-d1', 't60-f1', 't60-x1', 't60-l_running', 't60-l_retried'], 'w1', qty => 10) AS c;

DO $$
BEGIN
    PERFORM x_jobs.step_record(tap_helpers.jid('d1'), 'w1', 'fetch', '{"d1": 1}');
    PERFORM x_jobs.step_record(tap_helpers.jid('d1'), 'w1', 'fetch', '{"undo": 1}', compensation => TRUE);
    PERFORM x_jobs.step_record(tap_helpers.jid('l_running'), 'w1', 'fetch', '{"l_running": 1}');
    PERFORM x_jobs.complete(tap_helpers.jid('d1'), 'w1');
    PERFORM x_jobs.fail(tap_helpers.jid('l_retried'), 'w1', 'retried error', retry_delay => '0');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-02 00:00:00+00';

DO $$
BEGIN
    PERFORM x_jobs.fail(tap_helpers.jid('f1'), 'w1', 'f1 error');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-03 00:00:00+00';

DO $$
BEGIN
    PERFORM x_jobs.fail(tap_helpers.jid('x1'), 'w1', 'x1 error');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-04 00:00:00+00';

DO $$
BEGIN
    PERFORM x_jobs.cancel(tap_helpers.jid('c1'));
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-15 00:00:00+00';

INSERT INTO j (tag, id)
SELECT
    'r1' AS tag,
    e.id
FROM x_jobs.enqueue('t60_r1', queue => 't60-r1') AS e;

INSERT INTO claims (id)
SELECT c.id FROM x_jobs.claim(ARRAY['t60-r1'], 'w1') AS c;

DO $$
BEGIN
    PERFORM x_jobs.step_record(tap_helpers.jid('r1'), 'w1', 'fetch', '{"r1": 1}');
    PERFORM x_jobs.complete(tap_helpers.jid('r1'), 'w1');
END
$$;

SELECT results_eq(
    $$SELECT j.tag, count(*)::integer FROM x_jobs.step AS s JOIN j ON j.id = s.job_id GROUP BY j.tag ORDER BY j.tag$$,
    $$VALUES ('d1', 2), ('l_running', 1), ('r1', 1)$$,
    'The purge fixture should hold the steps of a row purged first, of a row purged later and of a live row'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.finished_at FROM j JOIN x_jobs.job AS k ON k.id = j.id ORDER BY j.tag$$,
    $$VALUES ('c1', 'cancelled', '2030-01-04 00:00:00+00'::timestamptz),
             ('d1', 'done', '2030-01-01 00:00:00+00'::timestamptz),
             ('f1', 'failed', '2030-01-02 00:00:00+00'::timestamptz),
             ('l_delayed', 'delayed', NULL::timestamptz),
             ('l_ready', 'ready', NULL::timestamptz),
             ('l_retried', 'ready', NULL::timestamptz),
             ('l_running', 'running', NULL::timestamptz),
             ('r1', 'done', '2030-01-15 00:00:00+00'::timestamptz),
             ('x1', 'dead', '2030-01-03 00:00:00+00'::timestamptz)$$,
    'The purge fixture should hold terminal rows of every kind and live rows of every kind'
);

------------------------------------------------------------------------------------------------
-- purge
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-20 00:00:00+00';

SELECT is(
    x_jobs.purge('7 days', 3),
    3::bigint,
    'purge should delete at most batch_size rows and answer how many it deleted'
);

SELECT is(
    pg_temp.left_tags(),
    ARRAY['c1', 'l_delayed', 'l_ready', 'l_retried', 'l_running', 'r1'],
    'purge should take the lowest-id finished rows first (done, failed and dead here), and leave the live rows'
);

SELECT is(
    x_jobs.purge('7 days', 10),
    1::bigint,
    'purge should then delete the last old terminal row (the cancelled one)'
);

SELECT is(x_jobs.purge('7 days'), 0::bigint, 'purge should answer 0 when no terminal row is old enough');

SELECT is(
    pg_temp.left_tags(),
    ARRAY['l_delayed', 'l_ready', 'l_retried', 'l_running', 'r1'],
    'purge should keep a terminal row that finished less than older_than ago, and every live row'
);

SELECT results_eq(
    $$SELECT DISTINCT j.tag FROM x_jobs.job_error AS e JOIN j ON j.id = e.job_id ORDER BY j.tag$$,
    $$VALUES ('l_retried')$$,
    'purge should delete the job_error rows of the rows it deleted, and keep those of live rows'
);

SELECT results_eq(
    $$SELECT j.tag, s.name, s.compensation FROM x_jobs.step AS s JOIN j ON j.id = s.job_id ORDER BY j.tag$$,
    $$VALUES ('l_running', 'fetch', FALSE), ('r1', 'fetch', FALSE)$$,
    'purge should delete the steps (compensations included) of the rows it deleted, and keep those of the rows it kept'
);

SELECT is(x_jobs.purge('0 seconds', 100), 1::bigint, 'purge with age 0 should delete every finished row');

SELECT is(
    pg_temp.left_tags(),
    ARRAY['l_delayed', 'l_ready', 'l_retried', 'l_running'],
    'purge should never delete a live row, whatever its age'
);

SELECT results_eq(
    $$SELECT j.tag, s.output FROM x_jobs.step AS s JOIN j ON j.id = s.job_id ORDER BY j.tag$$,
    $$VALUES ('l_running', '{"l_running": 1}'::jsonb)$$,
    'purge should delete the steps of a row purged in a later call, and never those of a live row'
);

-- Lowest id first, whatever the finish time: o1 has the lower id but finished after o2 (both are
-- past the retention, so either may go; the order is the primary key's, which costs no index).
INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM unnest(ARRAY['o1', 'o2']) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t60_' || t.tag, queue => 't60-' || t.tag) AS e;

INSERT INTO claims (id)
SELECT c.id FROM x_jobs.claim(ARRAY['t60-o1', 't60-o2'], 'w1', qty => 2) AS c;

SET LOCAL "x_jobs.fake_now" = '2030-01-21 00:00:00+00';

DO $$
BEGIN
    PERFORM x_jobs.complete(tap_helpers.jid('o2'), 'w1');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-22 00:00:00+00';

DO $$
BEGIN
    PERFORM x_jobs.complete(tap_helpers.jid('o1'), 'w1');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-02-01 00:00:00+00';

SELECT cmp_ok(tap_helpers.jid('o1'), '<', tap_helpers.jid('o2'), 'o1 should have the lower id of the two');

SELECT is(x_jobs.purge('1 day', 1), 1::bigint, 'purge with batch_size 1 should delete one row');

SELECT is(
    pg_temp.left_tags(),
    ARRAY['l_delayed', 'l_ready', 'l_retried', 'l_running', 'o2'],
    'purge should delete the eligible row with the lowest id (o1) first, even if o2 finished earlier'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge('-1 day')$$,
    'XJ020',
    pg_catalog.format('X_RETENTION_INVALID: purge older than %s in batches of 10000', interval '-1 day'),
    'purge should refuse a negative age'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge('7 days', 0)$$,
    'XJ020',
    pg_catalog.format('X_RETENTION_INVALID: purge older than %s in batches of 0', interval '7 days'),
    'purge should refuse a batch size of 0'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge(NULL)$$,
    'XJ020',
    'X_RETENTION_INVALID: purge older than NULL in batches of 10000',
    'purge should refuse a NULL age'
);

------------------------------------------------------------------------------------------------
-- purge_events
------------------------------------------------------------------------------------------------

-- Events published out of id order: e2 has a lower id than e3 but was published later. Both are
-- past the retention at 03-10 with '7 days'; e1 (03-05) and e4 (03-09) are not.
CREATE TEMP TABLE ev (tag text PRIMARY KEY, id bigint NOT NULL);

CREATE FUNCTION pg_temp.left_events()
RETURNS text[]
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(pg_catalog.array_agg(ev.tag ORDER BY ev.tag), '{}')
    FROM ev JOIN x_jobs.event AS e ON e.id = ev.id
$$;

-- Publishes an event named t60.<tag> and keeps its id under the tag.
CREATE FUNCTION pg_temp.publish_as(p_tag text, p_payload jsonb DEFAULT NULL, p_key text DEFAULT NULL)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO ev (tag, id)
    SELECT p_tag, p.event_id FROM x_jobs.publish('t60.' || p_tag, p_payload, p_key) AS p
$$;

SET LOCAL "x_jobs.fake_now" = '2030-03-05 00:00:00+00';
SELECT pg_temp.publish_as('e1');
SET LOCAL "x_jobs.fake_now" = '2030-03-02 00:00:00+00';
SELECT pg_temp.publish_as('e2');
SET LOCAL "x_jobs.fake_now" = '2030-03-01 00:00:00+00';
SELECT pg_temp.publish_as('e3', '{"k": 3}', 'k3');
SET LOCAL "x_jobs.fake_now" = '2030-03-09 00:00:00+00';
SELECT pg_temp.publish_as('e4');

SET LOCAL "x_jobs.fake_now" = '2030-03-10 00:00:00+00';

SELECT results_eq(
    $$SELECT ev.tag, e.published_at FROM ev JOIN x_jobs.event AS e ON e.id = ev.id ORDER BY e.id$$,
    $$VALUES ('e1', '2030-03-05 00:00:00+00'::timestamptz), ('e2', '2030-03-02 00:00:00+00'),
             ('e3', '2030-03-01 00:00:00+00'), ('e4', '2030-03-09 00:00:00+00')$$,
    'The purge_events fixture should hold four events, e2 and e3 published out of id order'
);

SELECT is(x_jobs.purge_events('7 days', 1), 1::bigint, 'purge_events with batch_size 1 should delete one event');

SELECT is(
    pg_temp.left_events(),
    ARRAY['e1', 'e3', 'e4'],
    'purge_events should delete the eligible event with the lowest id (e2) first, even if e3 was published earlier'
);

SELECT is(
    x_jobs.purge_events('7 days', 10),
    1::bigint,
    'purge_events should then delete the last event older than the cutoff, and answer how many'
);

SELECT is(x_jobs.purge_events('7 days'), 0::bigint, 'purge_events should answer 0 when no event is old enough');

SELECT is(
    pg_temp.left_events(),
    ARRAY['e1', 'e4'],
    'purge_events should keep the events published less than older_than ago'
);

SELECT is(x_jobs.purge_events('3 days'), 1::bigint, 'A shorter age should purge the events older than it');

SELECT is(pg_temp.left_events(), ARRAY['e4'], 'purge_events should keep an event newer than the cutoff');

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.purge_events('-1 day') $q$)$$,
    $$VALUES ('XJ020',
              pg_catalog.format(
                  'X_RETENTION_INVALID: purge events older than %s in batches of 10000', interval '-1 day'
              ),
              '', 'Pass an age from zero to 1000 years, such as ''30 days'', and a batch size of 1 or more.')$$,
    'purge_events should refuse a negative age, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge_events(NULL)$$,
    'XJ020',
    'X_RETENTION_INVALID: purge events older than NULL in batches of 10000',
    'purge_events should refuse a missing age'
);

-- Now minus millennia was past what timestamptz holds: a bare "timestamp out of range".
SELECT results_eq(
    $$
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT x_jobs.purge('300000 years') $q$) AS c
    UNION ALL
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT x_jobs.purge_events('300000 years') $q$) AS c
    UNION ALL
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT x_jobs.purge_outbox('300000 years') $q$) AS c
    UNION ALL
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT x_jobs.purge_webhook_ledger('300000 years') $q$) AS c
    UNION ALL
    SELECT c.err_state FROM tap_helpers.caught($q$ SELECT x_jobs.rollup_counters(days_for => '300000 years') $q$) AS c
    $$,
    $$ VALUES ('XJ020'), ('XJ020'), ('XJ020'), ('XJ020'), ('XJ020') $$,
    'Every retention function should refuse an age of millennia as X_RETENTION_INVALID'
);
SELECT lives_ok(
    $$
    SELECT x_jobs.purge('1000 years'), x_jobs.purge_events('1000 years'),
           x_jobs.rollup_counters(days_for => '1000 years')
    $$,
    'An age of 1000 years should be accepted'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge_events('0 seconds', 0)$$,
    'XJ020',
    pg_catalog.format('X_RETENTION_INVALID: purge events older than %s in batches of 0', interval '0 seconds'),
    'purge_events should refuse a batch size of 0'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge_events('0 seconds', NULL)$$,
    'XJ020',
    pg_catalog.format('X_RETENTION_INVALID: purge events older than %s in batches of NULL', interval '0 seconds'),
    'purge_events should refuse a missing batch size'
);

SELECT is(pg_temp.left_events(), ARRAY['e4'], 'The refused purge_events calls should have deleted nothing');

------------------------------------------------------------------------------------------------
-- rollup_counters
------------------------------------------------------------------------------------------------

-- Not UTC, with a half-hour offset: buckets must still be UTC hours and days.
SET LOCAL timezone = 'Asia/Kolkata';
SET LOCAL "x_jobs.fake_now" = '2030-01-20 12:34:30+00';

DELETE FROM x_jobs.counter;

INSERT INTO x_jobs.counter (
    job, bucket_seconds, bucket_start, shard, completed, retried, failed, dead, cancelled, run_ms
)
VALUES
-- Minutes within minutes_for (2 hours: after 10:34:30): untouched.
('t60_r', 60, '2030-01-20 12:30:00+00', 0, 1, 0, 0, 0, 0, 10),
('t60_r', 60, '2030-01-20 12:30:00+00', 1, 2, 0, 0, 0, 0, 20),
('t60_r', 60, '2030-01-20 11:00:00+00', 3, 3, 1, 0, 0, 0, 30),
-- Older minutes, several shards: folded into the hours 08:00 and 09:00.
('t60_r', 60, '2030-01-20 09:05:00+00', 0, 1, 2, 3, 4, 5, 100),
('t60_r', 60, '2030-01-20 09:05:00+00', 7, 10, 20, 30, 40, 50, 1000),
('t60_r', 60, '2030-01-20 09:59:00+00', 2, 100, 200, 300, 400, 500, 10000),
('t60_r', 60, '2030-01-20 08:10:00+00', 1, 7, 0, 1, 0, 2, 700),
('t60_s', 60, '2030-01-20 09:30:00+00', 4, 1, 0, 0, 0, 0, 5),
-- An hour bucket from an earlier rollup, which the folded minutes add to.
('t60_r', 3600, '2030-01-20 09:00:00+00', 0, 1000, 2000, 3000, 4000, 5000, 100000),
-- Hours older than hours_for (2 days: before 2030-01-18 12:34:30): folded into the day 01-17.
('t60_r', 3600, '2030-01-17 05:00:00+00', 0, 1, 1, 1, 1, 1, 11),
('t60_r', 3600, '2030-01-17 23:00:00+00', 0, 2, 2, 2, 2, 2, 22),
-- A recent hour: untouched.
('t60_r', 3600, '2030-01-19 05:00:00+00', 0, 5, 5, 5, 5, 5, 55),
-- Days: older than days_for (30 days: before 2029-12-21 12:34:30) is dropped, the other kept.
('t60_r', 86400, '2029-12-01 00:00:00+00', 0, 9, 9, 9, 9, 9, 99),
('t60_r', 86400, '2029-12-25 00:00:00+00', 0, 8, 8, 8, 8, 8, 88);

SELECT is(
    x_jobs.rollup_counters('2 hours', '2 days', '30 days'),
    8::bigint,
    'rollup_counters should answer how many buckets it folded or dropped (5 minutes, 2 hours, 1 day)'
);

SELECT results_eq(
    $$SELECT bucket_start, shard::integer, completed, retried, failed, dead, cancelled, run_ms
      FROM x_jobs.counter WHERE bucket_seconds = 60 ORDER BY bucket_start, shard$$,
    $$VALUES ('2030-01-20 11:00:00+00'::timestamptz, 3, 3::bigint, 1::bigint, 0::bigint, 0::bigint,
              0::bigint, 30::bigint),
             ('2030-01-20 12:30:00+00', 0, 1, 0, 0, 0, 0, 10),
             ('2030-01-20 12:30:00+00', 1, 2, 0, 0, 0, 0, 20)$$,
    'rollup_counters should leave the minutes within minutes_for untouched and fold the older ones'
);

SELECT results_eq(
    $$SELECT job, bucket_start, shard::integer, completed, retried, failed, dead, cancelled, run_ms
      FROM x_jobs.counter WHERE bucket_seconds = 3600 ORDER BY job, bucket_start$$,
    $$VALUES ('t60_r', '2030-01-19 05:00:00+00'::timestamptz, 0, 5::bigint, 5::bigint, 5::bigint,
              5::bigint, 5::bigint, 55::bigint),
             ('t60_r', '2030-01-20 08:00:00+00', 0, 7, 0, 1, 0, 2, 700),
             ('t60_r', '2030-01-20 09:00:00+00', 0, 1111, 2222, 3333, 4444, 5555, 111100),
             ('t60_s', '2030-01-20 09:00:00+00', 0, 1, 0, 0, 0, 0, 5)$$,
    'Old minutes should fold into UTC hour buckets of shard 0 per job, every column summed over the shards'
);

SELECT results_eq(
    $$SELECT job, bucket_start, shard::integer, completed, retried, failed, dead, cancelled, run_ms
      FROM x_jobs.counter WHERE bucket_seconds = 86400 ORDER BY job, bucket_start$$,
    $$VALUES ('t60_r', '2029-12-25 00:00:00+00'::timestamptz, 0, 8::bigint, 8::bigint, 8::bigint,
              8::bigint, 8::bigint, 88::bigint),
             ('t60_r', '2030-01-17 00:00:00+00', 0, 3, 3, 3, 3, 3, 33)$$,
    'Old hours should fold into UTC day buckets with their sums, and days older than days_for be dropped'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.counter
        WHERE bucket_seconds NOT IN (60, 3600, 86400)
    ),
    0,
    'rollup_counters should make only minute, hour and day buckets'
);

CREATE TEMP TABLE counter_after AS
SELECT * FROM x_jobs.counter;

SELECT is(
    x_jobs.rollup_counters('2 hours', '2 days', '30 days'),
    0::bigint,
    'A second rollup_counters at the same time should find nothing to do'
);

SELECT set_eq(
    'SELECT * FROM x_jobs.counter',
    'SELECT * FROM counter_after',
    'A second rollup_counters at the same time should change nothing'
);

SELECT throws_ok(
    $$SELECT x_jobs.rollup_counters('-1 minute')$$,
    'XJ020',
    pg_catalog.format(
        'X_RETENTION_INVALID: retention %s / %s / %s is not a set of ages',
        interval '-1 minute', interval '2 days', interval '400 days'
    ),
    'rollup_counters should refuse a negative minutes_for'
);

SELECT throws_ok(
    $$SELECT x_jobs.rollup_counters('2 hours', '-1 hour', '30 days')$$,
    'XJ020',
    pg_catalog.format(
        'X_RETENTION_INVALID: retention %s / %s / %s is not a set of ages',
        interval '2 hours', interval '-1 hour', interval '30 days'
    ),
    'rollup_counters should refuse a negative hours_for'
);

SELECT throws_ok(
    $$SELECT x_jobs.rollup_counters('2 hours', '2 days', '-1 day')$$,
    'XJ020',
    pg_catalog.format(
        'X_RETENTION_INVALID: retention %s / %s / %s is not a set of ages',
        interval '2 hours', interval '2 days', interval '-1 day'
    ),
    'rollup_counters should refuse a negative days_for'
);

SELECT throws_ok(
    $$SELECT x_jobs.rollup_counters(NULL, '2 days', '400 days')$$,
    'XJ020',
    pg_catalog.format(
        'X_RETENTION_INVALID: retention NULL / %s / %s is not a set of ages',
        interval '2 days', interval '400 days'
    ),
    'rollup_counters should refuse a missing age rather than fold nothing'
);

------------------------------------------------------------------------------------------------
-- purge keeps to its batch whatever the plan
------------------------------------------------------------------------------------------------

-- Five done rows and nothing else to purge. The planner settings below make the batch's
-- subquery the inner side of a nested loop, rescanned per row: under that plan, before 0.3.3,
-- purge with a batch of 2 deleted all five. DISCARD PLANS: purge's statements are planned anew.
SET LOCAL "x_jobs.fake_now" = '2031-01-01 00:00:00+00';

DO $$
BEGIN
    PERFORM x_jobs.purge('0 seconds', 100000);
    PERFORM x_jobs.enqueue_many(
        (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', 't60_bound', 'queue', 't60-bound'))
         FROM pg_catalog.generate_series(1, 5))
    );
    PERFORM x_jobs.complete_many(
        ARRAY(SELECT c.id FROM x_jobs.claim(ARRAY['t60-bound'], 'w-bound', qty => 10) AS c), 'w-bound'
    );
END
$$;

SET LOCAL "x_jobs.fake_now" = '2031-01-02 00:00:00+00';
SET LOCAL enable_hashjoin = off;
SET LOCAL enable_mergejoin = off;
SET LOCAL enable_material = off;
SET LOCAL enable_hashagg = off;
SET LOCAL enable_sort = off;
DISCARD PLANS;

SELECT is(
    x_jobs.purge('1 hour', 2),
    2::bigint,
    'purge should delete batch_size rows and no more, under a plan that rescans the batch'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.job
        WHERE queue = 't60-bound'
    ),
    3,
    'purge with a batch of 2 should leave three of the five old rows'
);

SELECT * FROM finish();
ROLLBACK;
