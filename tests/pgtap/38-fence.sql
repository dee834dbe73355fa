-- The fence: a claim is a credential. A worker id is bound to the login that first claimed or
-- announced with it (x_jobs.worker_login), and every function that acts on a held run takes it
-- from that login only; another login that passes the id (it can read it in claimed_by) gets
-- each function's "not held" answer, and claim and announce_worker refuse it (XJ052). With the
-- optional attempt(s), a row is acted on only at the attempt the caller holds, so that a stale
-- attempt's result cannot settle a newer attempt of the same worker. Two login roles granted
-- x_jobs_worker act under SET ROLE (what x_jobs._caller() answers); the clock is moved with
-- SET LOCAL "x_jobs.fake_now" between the blocks, as the superuser.
BEGIN;
SELECT plan(33);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE ROLE t38_a LOGIN;
CREATE ROLE t38_b LOGIN;
GRANT x_jobs_worker TO t38_a, t38_b;

CREATE TEMP TABLE t38 (tag text PRIMARY KEY, id bigint NOT NULL);
GRANT SELECT ON t38 TO t38_a, t38_b;
INSERT INTO t38 (tag, id)
SELECT
    t.tag,
    e.id
FROM unnest(ARRAY['held', 'stale', 'many', 'old']) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t38_' || t.tag, queue => 't38-' || t.tag, max_attempts => 5) AS e;

-- A claims with its id: the claim binds the id to A.
SET ROLE t38_a;
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t38-held', 't38-many'], 't38-wa', qty => 10)),
    2,
    'A worker login should claim its jobs with its id'
);
RESET ROLE;

SELECT is(
    (
        SELECT l.login::text FROM x_jobs.worker_login AS l
        WHERE l.worker = 't38-wa'
    ),
    't38_a',
    'The first claim of a worker id should bind it to the claiming login'
);

-- B passes A's id (readable in claimed_by): every act on A's runs is "not held".
SET ROLE t38_b;
SELECT is(
    x_jobs.complete((
        SELECT id FROM t38
        WHERE tag = 'held'
    ), 't38-wa', '{"by": "b"}'),
    FALSE,
    'Another login should not complete a job by passing the holder''s worker id'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.complete_many(ARRAY(SELECT id FROM t38 WHERE tag IN ('held', 'many')), 't38-wa')$$,
    'Another login should not complete a batch of the holder''s jobs'
);
SELECT is(
    x_jobs.fail((
        SELECT id FROM t38
        WHERE tag = 'held'
    ), 't38-wa', 'sabotage'),
    NULL,
    'Another login should not fail the holder''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY(SELECT id FROM t38 WHERE tag = 'held'), 't38-wa', '1 hour')$$,
    'Another login should not extend the holder''s lease'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.release(ARRAY(SELECT id FROM t38 WHERE tag = 'held'), 't38-wa')$$,
    'Another login should not release the holder''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.hand_back(ARRAY(SELECT id FROM t38 WHERE tag = 'held'), 't38-wa')$$,
    'Another login should not hand back the holder''s job'
);
SELECT is(
    x_jobs.progress((
        SELECT id FROM t38
        WHERE tag = 'held'
    ), 't38-wa', 1, 2, 'b was here'),
    FALSE,
    'Another login should not report progress on the holder''s job'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.steps((SELECT id FROM t38 WHERE tag = 'held'), 't38-wa')$$,
    'XJ026',
    NULL,
    'Another login should not replay the holder''s steps (the existing not-held error)'
);
SELECT throws_ok(
    $$SELECT x_jobs.step_record((SELECT id FROM t38 WHERE tag = 'held'), 't38-wa', 'charge', '{"fake": true}')$$,
    'XJ026',
    NULL,
    'Another login should not record a step of the holder''s run'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.step_sleep((SELECT id FROM t38 WHERE tag = 'held'), 't38-wa', 'nap', '1 day')$$,
    'XJ026',
    NULL,
    'Another login should not suspend the holder''s run'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.announce_worker('t38-wa', ARRAY['t38-held'], draining => TRUE)$$,
    'XJ052',
    'X_WORKER_NOT_YOURS: worker id ''t38-wa'' belongs to another login',
    'Another login should not announce the holder''s worker id (as draining)'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.claim(ARRAY['t38-stale'], 't38-wa')$$,
    'XJ052',
    'X_WORKER_NOT_YOURS: worker id ''t38-wa'' belongs to another login',
    'Another login should not claim with the holder''s worker id'
);
-- B's own id is B's.
SELECT lives_ok(
    $$SELECT * FROM x_jobs.announce_worker('t38-wb', ARRAY['t38-old'])$$,
    'A login should announce a worker id of its own'
);
RESET ROLE;

SELECT results_eq(
    $$SELECT j.state::text, j.claimed_by, j.attempt, j.progress, j.visible_at
      FROM x_jobs.job AS j WHERE j.id = (SELECT id FROM t38 WHERE tag = 'held')$$,
    $$VALUES ('running', 't38-wa', 1, NULL::jsonb, timestamptz '2030-01-01 10:00:30+00')$$,
    'The holder''s job should be as its claim left it after the other login''s attempts'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.step AS s
        WHERE s.job_id = (
            SELECT t.id FROM t38 AS t
            WHERE t.tag = 'held'
        )
    ),
    0,
    'The other login should have recorded no step of the holder''s run'
);
SELECT is(
    (
        SELECT w.draining_at FROM x_jobs.worker AS w
        WHERE w.id = 't38-wa'
    ),
    NULL,
    'The holder''s worker should not have been marked draining by the other login'
);

-- The attempt: A acts only at the attempt it holds.
SET ROLE t38_a;
SELECT is(
    x_jobs.complete((
        SELECT id FROM t38
        WHERE tag = 'held'
    ), 't38-wa', attempt => 2),
    FALSE,
    'The holder should not complete its job at an attempt it does not hold'
);
SELECT is(
    x_jobs.fail((
        SELECT id FROM t38
        WHERE tag = 'held'
    ), 't38-wa', 'late', attempt => 7),
    NULL,
    'The holder should not fail its job at an attempt it does not hold'
);
SELECT is(
    x_jobs.progress((
        SELECT id FROM t38
        WHERE tag = 'held'
    ), 't38-wa', note => 'x', attempt => 3),
    FALSE,
    'The holder should not report progress at an attempt it does not hold'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.steps((SELECT id FROM t38 WHERE tag = 'held'), 't38-wa', attempt => 2)$$,
    'XJ026',
    NULL,
    'The holder should not replay steps at an attempt it does not hold'
);
SELECT set_eq(
    $$SELECT * FROM x_jobs.extend_lease(
        ARRAY(SELECT id FROM t38 WHERE tag IN ('held', 'many') ORDER BY tag),
        't38-wa', '1 minute', attempts => ARRAY[1, 9])$$,
    $$SELECT id FROM t38 WHERE tag = 'held'$$,
    'A heartbeat with attempts should extend only the rows at their attempt'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.complete_many(
        ARRAY(SELECT id FROM t38 WHERE tag = 'held'), 't38-wa', attempts => ARRAY[1, 1])$$,
    'XJ053',
    NULL,
    'An attempts list that does not pair with the ids should be refused'
);
SELECT set_eq(
    $$SELECT * FROM x_jobs.complete_many(
        ARRAY(SELECT id FROM t38 WHERE tag IN ('held', 'many') ORDER BY tag),
        't38-wa', attempts => ARRAY[1, NULL])$$,
    $$SELECT id FROM t38 WHERE tag IN ('held', 'many')$$,
    'The holder should complete its jobs at the attempts it holds (a NULL attempt is not checked)'
);
SELECT lives_ok(
    $$SELECT * FROM x_jobs.announce_worker('t38-wa', ARRAY['t38-held'])$$,
    'The holder should announce its own worker id'
);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t38-stale'], 't38-wa')),
    1,
    'The holder should claim again with its id'
);
RESET ROLE;

-- Its lease lapses; A claims the same job again (attempt 2): attempt 1's late result is stale.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:05:00+00';
SET ROLE t38_a;
SELECT is(
    (SELECT c.attempt FROM x_jobs.claim(ARRAY['t38-stale'], 't38-wa') AS c),
    2,
    'The holder should claim its lapsed job again, at attempt 2'
);
SELECT is(
    x_jobs.complete((
        SELECT id FROM t38
        WHERE tag = 'stale'
    ), 't38-wa', '{"attempt": 1}', attempt => 1),
    FALSE,
    'A stale attempt''s result should not settle the same worker''s newer attempt'
);
SELECT is(
    x_jobs.complete((
        SELECT id FROM t38
        WHERE tag = 'stale'
    ), 't38-wa', '{"attempt": 2}', attempt => 2),
    TRUE,
    'The attempt the worker holds should settle'
);
RESET ROLE;

SELECT is(
    (
        SELECT j.output FROM x_jobs.job AS j
        WHERE j.id = (
            SELECT t.id FROM t38 AS t
            WHERE t.tag = 'stale'
        )
    ),
    '{"attempt": 2}'::jsonb,
    'The job''s output should be the held attempt''s'
);

-- A run claimed before the fence existed (no binding): its first user binds it, then only it.
UPDATE x_jobs.job AS j
SET
    state = 'running', attempt = 1, claimed_by = 't38-old', started_at = x_jobs.now(),
    visible_at = x_jobs.now() + interval '1 minute'
WHERE j.id = (
    SELECT id FROM t38
    WHERE tag = 'old'
);
SET ROLE t38_b;
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.extend_lease(array(
        SELECT id FROM t38
        WHERE tag = 'old'
    ), 't38-old')),
    1,
    'The first login to use an unbound worker id should bind it, and hold its runs'
);
RESET ROLE;
SET ROLE t38_a;
SELECT is(
    x_jobs.complete((
        SELECT id FROM t38
        WHERE tag = 'old'
    ), 't38-old'),
    FALSE,
    'Once bound by its first user, an old worker id should hold nothing for another login'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
