-- x_jobs.complete and x_jobs.complete_many: only the worker that holds a running row settles it;
-- every other caller gets false (or the id left out of the answer) and the row stays as it was.
-- Outputs are stored per id, and the settling statement adds to the job name's counter minute.
-- The clock is moved with SET LOCAL "x_jobs.fake_now" (quoted so that sqlfluff parses it).
BEGIN;
SELECT plan(38);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

-- Jobs by tag. Each job has a queue of its own, so a claim picks exactly the jobs it names.
CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- The output that is too large once x_jobs.max_payload_bytes is 100.
CREATE FUNCTION pg_temp.big_output()
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
AS $$ SELECT pg_catalog.jsonb_build_object('pad', pg_catalog.repeat('x', 300)) $$;

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM
    unnest(ARRAY[
        'held', 'other', 'twice', 'cancelled', 'nullout', 'm1', 'm2', 'm3', 'm4', 'mn1', 'mn2', 'big',
        'bigmany', 'lapsed'
    ]) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t30_' || t.tag, queue => 't30-' || t.tag) AS e;

-- The counter jobs share one name; c4 is held by another worker.
INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM unnest(ARRAY['c1', 'c2', 'c3', 'c4', 'c5']) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t30_count', queue => 't30-' || t.tag) AS e;

CREATE TEMP TABLE claimed AS
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(
    array(SELECT 't30-' || j.tag FROM j WHERE j.tag <> 'c4'), -- noqa: LT14
    'w1', lease => '30 seconds', qty => 100
) AS c;

INSERT INTO claimed (id, claimed_by)
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(ARRAY['t30-c4'], 'w2') AS c;

SELECT set_eq(
    'SELECT id, claimed_by FROM claimed',
    'SELECT id, CASE WHEN tag = ''c4'' THEN ''w2'' ELSE ''w1'' END FROM j',
    'Every job of the test should be running, held by its worker, before anything settles'
);

------------------------------------------------------------------------------------------------
-- complete: the holder settles
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:05+00';

SELECT is(
    x_jobs.complete(tap_helpers.jid('held'), 'w1', '{"answer": 42}'),
    TRUE,
    'complete should answer true when the worker holds the running row'
);

SELECT results_eq(
    $$SELECT state::text, output, finished_at, visible_at FROM x_jobs.job WHERE id = tap_helpers.jid('held')$$,
    $$VALUES ('done', '{"answer": 42}'::jsonb, '2030-01-01 10:00:05+00'::timestamptz, NULL::timestamptz)$$,
    'A completed row should be done, keep its output, be finished now and hold no lease'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('nullout'), 'w1'),
    TRUE,
    'complete without an output should still settle the row'
);

SELECT results_eq(
    $$SELECT state::text, output IS NULL FROM x_jobs.job WHERE id = tap_helpers.jid('nullout')$$,
    $$VALUES ('done', TRUE)$$,
    'A row completed without an output should be done with a NULL output'
);

------------------------------------------------------------------------------------------------
-- complete: everyone else gets false and changes nothing
------------------------------------------------------------------------------------------------

DO $$
BEGIN
    PERFORM x_jobs.complete(tap_helpers.jid('twice'), 'w1', '{"first": true}');
    PERFORM x_jobs.cancel(tap_helpers.jid('cancelled'));
END
$$;

CREATE TEMP TABLE snap AS
SELECT * FROM x_jobs.job
WHERE id IN (SELECT j.id FROM j);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:06+00';

SELECT is(
    x_jobs.complete(tap_helpers.jid('other'), 'w2', '{"stolen": true}'),
    FALSE,
    'complete should answer false to a worker that does not hold the row'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id = tap_helpers.jid('other')$$,
    $$SELECT * FROM snap WHERE id = tap_helpers.jid('other')$$,
    'A row another worker tried to complete should be unchanged (running, held by its worker)'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('twice'), 'w1', '{"second": true}'),
    FALSE,
    'complete should answer false for a row that is already done'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id = tap_helpers.jid('twice')$$,
    $$SELECT * FROM snap WHERE id = tap_helpers.jid('twice')$$,
    'A done row completed again should keep its first output and finish time'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('cancelled'), 'w1', '{"late": true}'),
    FALSE,
    'complete should answer false for a row an operator cancelled while it ran'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id = tap_helpers.jid('cancelled')$$,
    $$SELECT * FROM snap WHERE id = tap_helpers.jid('cancelled')$$,
    'A cancelled row should stay cancelled, without output, when its old worker completes it'
);

SELECT results_eq(
    $$SELECT job, sum(completed)::bigint FROM x_jobs.counter
      WHERE job IN ('t30_other', 't30_twice', 't30_cancelled') GROUP BY job ORDER BY job$$,
    $$VALUES ('t30_cancelled', 0::bigint), ('t30_twice', 1::bigint)$$,
    'A refused complete should add nothing to completed (the cancelled row has the cancel''s counter row)'
);

------------------------------------------------------------------------------------------------
-- complete_many
------------------------------------------------------------------------------------------------

SELECT is_empty(
    $$SELECT * FROM x_jobs.complete_many(
        ARRAY[tap_helpers.jid('m2'), tap_helpers.jid('m1'), tap_helpers.jid('other')], 'w2',
        ARRAY['{"n": 2}', '{"n": 1}', '{"n": "other"}']::jsonb[])$$,
    'complete_many should answer no id to a worker that holds none of them'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.complete_many(
        ARRAY[tap_helpers.jid('m2'), tap_helpers.jid('m1'), tap_helpers.jid('twice')], 'w1',
        ARRAY['{"n": 2}', '{"n": 1}', '{"n": "twice"}']::jsonb[])$$,
    ARRAY[tap_helpers.jid('m1'), tap_helpers.jid('m2')],
    'complete_many should answer the ids it completed and leave out a done row'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.output
      FROM j JOIN x_jobs.job AS k ON k.id = j.id
      WHERE j.tag IN ('m1', 'm2', 'twice') ORDER BY j.tag$$,
    $$VALUES ('m1', 'done', '{"n": 1}'::jsonb), ('m2', 'done', '{"n": 2}'::jsonb),
             ('twice', 'done', '{"first": true}'::jsonb)$$,
    'complete_many should store outputs[i] as the output of ids[i], and not touch a row it left out'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('m3'), tap_helpers.jid('m4')], 'w1',
        ARRAY['{"k": 3}', NULL]::jsonb[])$$,
    ARRAY[tap_helpers.jid('m3'), tap_helpers.jid('m4')],
    'complete_many should accept a NULL among the outputs'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.output
      FROM j JOIN x_jobs.job AS k ON k.id = j.id
      WHERE j.tag IN ('m3', 'm4') ORDER BY j.tag$$,
    $$VALUES ('m3', 'done', '{"k": 3}'::jsonb), ('m4', 'done', NULL::jsonb)$$,
    'A NULL output among outputs should leave that row done with no output'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('mn1'), tap_helpers.jid('mn2')], 'w1')$$,
    ARRAY[tap_helpers.jid('mn1'), tap_helpers.jid('mn2')],
    'complete_many without outputs should complete every held row'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.output
      FROM j JOIN x_jobs.job AS k ON k.id = j.id
      WHERE j.tag IN ('mn1', 'mn2') ORDER BY j.tag$$,
    $$VALUES ('mn1', 'done', NULL::jsonb), ('mn2', 'done', NULL::jsonb)$$,
    'Rows completed without outputs should be done with NULL outputs'
);

------------------------------------------------------------------------------------------------
-- Refusals
------------------------------------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT x_jobs.complete(tap_helpers.jid('other'), '')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'complete should refuse an empty worker id'
);

SELECT throws_ok(
    $$SELECT x_jobs.complete(tap_helpers.jid('other'), NULL)$$,
    'XJ011',
    'X_WORKER_INVALID: worker id NULL is empty',
    'complete should refuse a NULL worker id'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('other')], '')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'complete_many should refuse an empty worker id'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('big'), tap_helpers.jid('bigmany')], 'w1',
        ARRAY['{}']::jsonb[])$$,
    'XJ021',
    'X_OUTPUTS_INVALID: 1 outputs for 2 ids',
    'complete_many should refuse fewer outputs than ids'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('big')], 'w1', ARRAY['{}', '{}']::jsonb[])$$,
    'XJ021',
    'X_OUTPUTS_INVALID: 2 outputs for 1 ids',
    'complete_many should refuse more outputs than ids'
);

SET LOCAL "x_jobs.max_payload_bytes" = 100;

-- The size the function measures: a jsonb taken out of an array, as unnest hands it over.
SELECT throws_ok(
    $$SELECT x_jobs.complete(tap_helpers.jid('big'), 'w1', pg_temp.big_output())$$,
    'XJ003',
    pg_catalog.format(
        'X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of 100',
        (SELECT pg_catalog.pg_column_size(o.v) FROM unnest(ARRAY[pg_temp.big_output()]) AS o (v))
    ),
    'complete should refuse an output larger than x_jobs.max_payload_bytes'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('bigmany'), tap_helpers.jid('big')], 'w1',
        ARRAY['{}', pg_temp.big_output()]::jsonb[])$$,
    'XJ003',
    pg_catalog.format(
        'X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of 100',
        (SELECT pg_catalog.pg_column_size(o.v) FROM unnest(ARRAY[pg_temp.big_output()]) AS o (v))
    ),
    'complete_many should refuse a batch in which one output is too large'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job
      WHERE id IN (tap_helpers.jid('big'), tap_helpers.jid('bigmany'), tap_helpers.jid('other'))$$,
    $$SELECT * FROM snap WHERE id IN (tap_helpers.jid('big'), tap_helpers.jid('bigmany'), tap_helpers.jid('other'))$$,
    'Refused calls should leave every row they named unchanged, the small-output row of a batch included'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('big'), 'w1', '{"small": true}'),
    TRUE,
    'An output under x_jobs.max_payload_bytes should still be accepted'
);

RESET "x_jobs.max_payload_bytes";

------------------------------------------------------------------------------------------------
-- Counters: completed and run_ms in the minute of the settle
------------------------------------------------------------------------------------------------

-- All the counter jobs were claimed at 10:00:00.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:10.5+00';

SELECT is(
    x_jobs.complete(tap_helpers.jid('c1'), 'w1'),
    TRUE,
    'The holder should complete a counter job'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:20+00';

SELECT set_eq(
    $$SELECT * FROM x_jobs.complete_many(
        ARRAY[tap_helpers.jid('c2'), tap_helpers.jid('c3'), tap_helpers.jid('c4')], 'w1')$$,
    ARRAY[tap_helpers.jid('c2'), tap_helpers.jid('c3')],
    'complete_many should leave out the counter job another worker holds'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:05+00';

SELECT is(
    x_jobs.complete(tap_helpers.jid('c5'), 'w1'),
    TRUE,
    'The holder should complete a counter job in the next minute'
);

SELECT results_eq(
    $$SELECT bucket_seconds, bucket_start, sum(completed)::bigint, sum(run_ms)::bigint,
             sum(retried + failed + dead + cancelled)::bigint
      FROM x_jobs.counter WHERE job = 't30_count'
      GROUP BY bucket_seconds, bucket_start ORDER BY bucket_start$$,
    $$VALUES (60, '2030-01-01 10:00:00+00'::timestamptz, 3::bigint, 50500::bigint, 0::bigint),
             (60, '2030-01-01 10:01:00+00'::timestamptz, 1::bigint, 65000::bigint, 0::bigint)$$,
    'Completions should count per job name and UTC minute, with run_ms the sum of settle minus start in ms'
);

------------------------------------------------------------------------------------------------
-- A lease that lapsed and was re-claimed by another worker
------------------------------------------------------------------------------------------------

-- Claimed by w1 at 10:00:00 for 30 seconds; at 10:01:05 w2 takes it over.
INSERT INTO claimed (id, claimed_by)
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(ARRAY['t30-lapsed'], 'w2') AS c;

SELECT results_eq(
    $$SELECT claimed_by, state::text, attempt FROM x_jobs.job WHERE id = tap_helpers.jid('lapsed')$$,
    $$VALUES ('w2', 'running', 2)$$,
    'A row whose lease lapsed should be re-claimed by the next worker'
);

CREATE TEMP TABLE snap_lapsed AS
SELECT * FROM x_jobs.job
WHERE id = tap_helpers.jid('lapsed');

SELECT is(
    x_jobs.complete(tap_helpers.jid('lapsed'), 'w1', '{"late": true}'),
    FALSE,
    'complete should answer false to the worker whose lapsed lease another worker took over'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id = tap_helpers.jid('lapsed')$$,
    'SELECT * FROM snap_lapsed',
    'The re-claimed row should stay running under the new worker when the old one completes it'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('lapsed')], 'w1', ARRAY['{"late": true}']::jsonb[])$$,
    'complete_many should not answer the id of a row re-claimed by another worker'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('lapsed'), 'w2', '{"winner": "w2"}'),
    TRUE,
    'The worker that re-claimed the row should complete it'
);

SELECT results_eq(
    $$SELECT state::text, output FROM x_jobs.job WHERE id = tap_helpers.jid('lapsed')$$,
    $$VALUES ('done', '{"winner": "w2"}'::jsonb)$$,
    'The row should carry the output of the worker that held it'
);

SELECT * FROM finish();
ROLLBACK;
