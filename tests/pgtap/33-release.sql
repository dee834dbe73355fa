-- x_jobs.release: a stopping worker hands its running jobs back, due at once, in their old place,
-- without spending the interrupted attempt; only the holder can.
BEGIN;
SELECT plan(8);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

CREATE TEMP TABLE t33 AS
SELECT e.id FROM x_jobs.enqueue('t33', queue => 't33', max_attempts => 1) AS e;
INSERT INTO t33 SELECT e.id FROM x_jobs.enqueue('t33', queue => 't33') AS e;
SELECT is(
    (SELECT count(*) FROM x_jobs.claim(ARRAY['t33'], 'w1', '1 minute', 2)),
    2::bigint,
    'Both jobs should be running, held by w1 (setup)'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:10+00';
SELECT is_empty(
    $$ SELECT * FROM x_jobs.release((SELECT array_agg(t.id) FROM t33 AS t), 'w2') $$,
    'A worker that does not hold the jobs should release nothing'
);
SELECT set_eq(
    $$ SELECT * FROM x_jobs.release((SELECT array_agg(t.id) FROM t33 AS t), 'w1') $$,
    $$ SELECT t.id FROM t33 AS t $$,
    'The holder should release its running jobs and answer their ids'
);
SELECT results_eq(
    $$ SELECT j.state::text, j.attempt, j.claims, j.claimed_by, j.visible_at, j.run_at
       FROM x_jobs.job AS j JOIN t33 AS t ON t.id = j.id ORDER BY j.id $$,
    $$ VALUES ('ready', 0, 1, NULL::text, NULL::timestamptz, '2030-01-01 12:00:00+00'::timestamptz),
              ('ready', 0, 1, NULL::text, NULL::timestamptz, '2030-01-01 12:00:00+00'::timestamptz) $$,
    'Released jobs should be ready, unheld, with the attempt given back and run_at kept'
);
SELECT is(
    (
        SELECT count(*) FROM x_jobs.claim(ARRAY['t33'], 'w2', '1 minute', 2) AS c
        WHERE c.state = 'running'
    ),
    2::bigint,
    'Another worker should claim them at once, the one-attempt job included (not buried)'
);
SELECT is_empty(
    $$ SELECT * FROM x_jobs.release((SELECT array_agg(t.id) FROM t33 AS t), 'w1') $$,
    'The first worker, holding nothing now, should release nothing'
);
SELECT is(
    (SELECT count(*) FROM x_jobs.job_error AS e INNER JOIN t33 AS t ON e.job_id = t.id),
    0::bigint,
    'A release is no failure: no error history is written'
);
SELECT throws_ok(
    $$ SELECT x_jobs.release(ARRAY[1::bigint], '') $$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'release should refuse an empty worker id'
);

SELECT * FROM finish();
ROLLBACK;
