-- keep_done => false (0.3.0): completing such a job deletes its row, with its steps and its
-- error history, in the statement that counts the completion. Until then it is a row like any
-- other: a stale worker cannot complete it, a failure keeps it (to retry, or as a dead letter),
-- and its idempotency key is free once it is gone.
-- The clock is moved with SET LOCAL "x_jobs.fake_now" (quoted so that sqlfluff parses it).
BEGIN;
SELECT plan(23);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- Each job has a queue of its own, so a claim picks exactly the job it names.
INSERT INTO j (tag, id)
SELECT
    t.tag,
    (x_jobs.enqueue(
        't37_' || t.tag, queue => 't37-' || t.tag, keep_done => t.keep, max_attempts => t.attempts,
        idempotency_key => t.ikey
    )).id AS id
FROM (
    VALUES
    ('gone', FALSE, 25, NULL),
    ('kept', NULL, 25, NULL),
    ('errs', FALSE, 3, NULL),
    ('other', TRUE, 3, NULL),
    ('stale', FALSE, 25, NULL),
    ('dies', FALSE, 1, NULL),
    ('keyed', FALSE, 25, 't37-key'),
    ('mixgone', FALSE, 25, NULL),
    ('mixkept', TRUE, 25, NULL),
    ('nullgone', FALSE, 25, NULL),
    ('nullkept', TRUE, 25, NULL)
) AS t (tag, keep, attempts, ikey);

INSERT INTO j (tag, id)
SELECT
    CASE e.ord WHEN 1 THEN 'many' ELSE 'manykept' END AS tag,
    e.id
FROM x_jobs.enqueue_many(
    '[{"name": "t37_many", "queue": "t37-many", "keep_done": false},
      {"name": "t37_manykept", "queue": "t37-manykept"}]'
) AS e;

SELECT bag_eq(
    $$SELECT j.tag, x.keep_done FROM j JOIN x_jobs.job AS x ON x.id = j.id$$,
    $$VALUES ('dies', FALSE), ('errs', FALSE), ('gone', FALSE), ('keyed', FALSE), ('kept', TRUE),
             ('many', FALSE), ('manykept', TRUE), ('mixgone', FALSE), ('mixkept', TRUE), ('nullgone', FALSE),
             ('nullkept', TRUE), ('other', TRUE), ('stale', FALSE)$$,
    'enqueue and enqueue_many should store keep_done as given, true when left out or NULL'
);

SELECT is(
    (SELECT count(*) FROM x_jobs.claim(array(SELECT 't37-' || j.tag FROM j), 'w1', qty => 100)), -- noqa: LT14
    13::bigint,
    'Every job of the test should be claimed by w1'
);

------------------------------------------------------------------------------------------------
-- complete deletes the row, and counts it
------------------------------------------------------------------------------------------------

SELECT is(
    x_jobs.complete(tap_helpers.jid('gone'), 'w1', '{"unread": true}'),
    TRUE,
    'complete should answer true for a keep_done => false row its worker holds'
);

SELECT is_empty(
    $$SELECT FROM x_jobs.job WHERE id = tap_helpers.jid('gone')$$,
    'A completed keep_done => false row should be deleted'
);

SELECT results_eq(
    $$SELECT sum(completed)::bigint FROM x_jobs.counter WHERE job = 't37_gone'$$,
    $$VALUES (1::bigint)$$,
    'The deleted row should still be counted as completed'
);

SELECT bag_eq(
    $$SELECT c FROM x_jobs.complete_many(
          ARRAY[tap_helpers.jid('kept'), tap_helpers.jid('many')], 'w1', ARRAY['{"a": 1}', '{"b": 2}']::jsonb[]
      ) AS c$$,
    $$VALUES (tap_helpers.jid('kept')), (tap_helpers.jid('many'))$$,
    'complete_many should answer the ids it completed, kept and deleted alike'
);

SELECT results_eq(
    $$SELECT j.tag, x.state::text, x.output FROM j JOIN x_jobs.job AS x ON x.id = j.id
      WHERE j.tag IN ('kept', 'many')$$,
    $$VALUES ('kept', 'done', '{"a": 1}'::jsonb)$$,
    'In one batch, the kept row should be done with its output and the other one deleted'
);

------------------------------------------------------------------------------------------------
-- its steps and error history go with it; another job's stay
------------------------------------------------------------------------------------------------

SELECT is(
    ARRAY[
        x_jobs.fail(tap_helpers.jid('errs'), 'w1', 'first try', retry_delay => '0 seconds'),
        x_jobs.fail(tap_helpers.jid('other'), 'w1', 'first try', retry_delay => '0 seconds')
    ]::text[],
    ARRAY['ready', 'ready'],
    'A failed keep_done => false row should be retried like any other (here at once)'
);

SELECT is(
    (SELECT count(*) FROM x_jobs.claim(ARRAY['t37-errs', 't37-other'], 'w1', qty => 10)),
    2::bigint,
    'Both failed rows should be claimed again'
);

SELECT is(
    ARRAY[
        x_jobs.step_record(tap_helpers.jid('errs'), 'w1', 'fetch', '{"n": 1}'),
        x_jobs.step_record(tap_helpers.jid('other'), 'w1', 'fetch', '{"n": 2}')
    ]::text[],
    ARRAY['done', 'done'],
    'Both runs should record a step'
);

SELECT bag_eq(
    $$SELECT c FROM x_jobs.complete_many(ARRAY[tap_helpers.jid('errs'), tap_helpers.jid('other')], 'w1') AS c$$,
    $$VALUES (tap_helpers.jid('errs')), (tap_helpers.jid('other'))$$,
    'complete_many should complete both'
);

SELECT results_eq(
    $$SELECT j.tag, (SELECT count(*) FROM x_jobs.job_error AS e WHERE e.job_id = j.id),
             (SELECT count(*) FROM x_jobs.step AS s WHERE s.job_id = j.id)
      FROM j WHERE j.tag IN ('errs', 'other') ORDER BY j.tag$$,
    $$VALUES ('errs', 0::bigint, 0::bigint), ('other', 1::bigint, 1::bigint)$$,
    'The deleted row''s errors and steps should be deleted with it, the kept row''s should stay'
);

------------------------------------------------------------------------------------------------
-- a worker that does not hold it cannot delete it; failures keep it
------------------------------------------------------------------------------------------------

SELECT is(
    x_jobs.complete(tap_helpers.jid('stale'), 'w2'),
    FALSE,
    'complete should answer false to a worker that does not hold the keep_done => false row'
);

SELECT results_eq(
    $$SELECT state::text, claimed_by FROM x_jobs.job WHERE id = tap_helpers.jid('stale')$$,
    $$VALUES ('running', 'w1')$$,
    'The row another worker tried to complete should still be running, held by its worker'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('dies'), 'w1', 'last try')::text,
    'dead',
    'fail should bury a keep_done => false row out of attempts'
);

SELECT results_eq(
    $$SELECT state::text, last_error FROM x_jobs.job WHERE id = tap_helpers.jid('dies')$$,
    $$VALUES ('dead', 'last try')$$,
    'The dead keep_done => false row should be kept as a dead letter, with its error'
);

------------------------------------------------------------------------------------------------
-- the idempotency key is free once the row is gone
------------------------------------------------------------------------------------------------

SELECT is(
    x_jobs.complete(tap_helpers.jid('keyed'), 'w1'),
    TRUE,
    'The keyed keep_done => false row should complete'
);

SELECT results_eq(
    $$SELECT e.deduped, e.id <> tap_helpers.jid('keyed')
      FROM x_jobs.enqueue('t37_keyed', queue => 't37-keyed', idempotency_key => 't37-key') AS e$$,
    $$VALUES (FALSE, TRUE)$$,
    'The key of a deleted row should be free: a new enqueue makes a new row'
);

------------------------------------------------------------------------------------------------
-- a batch led by a deleted row: the kept ones after it keep their own outputs (0.3.4 settles the
-- ids of the first row's kind first, then the rest)
------------------------------------------------------------------------------------------------

SELECT bag_eq(
    $$SELECT c FROM x_jobs.complete_many(
          ARRAY[tap_helpers.jid('mixgone'), tap_helpers.jid('stale'), tap_helpers.jid('mixkept'), -1],
          'w2', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[]
      ) AS c$$,
    $$SELECT 1 WHERE FALSE$$,
    'complete_many should complete none of a batch that another worker holds'
);

SELECT bag_eq(
    $$SELECT c FROM x_jobs.complete_many(
          ARRAY[tap_helpers.jid('mixgone'), -1, tap_helpers.jid('mixkept'), tap_helpers.jid('mixkept')],
          'w1', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 3}']::jsonb[]
      ) AS c$$,
    $$VALUES (tap_helpers.jid('mixgone')), (tap_helpers.jid('mixkept'))$$,
    'complete_many should answer each held id once, past an unknown id and a repeated one'
);

SELECT results_eq(
    $$SELECT j.tag, x.state::text, x.output,
             (SELECT sum(c.completed)::integer FROM x_jobs.counter AS c WHERE c.job = 't37_' || j.tag)
      FROM j LEFT JOIN x_jobs.job AS x ON x.id = j.id
      WHERE j.tag IN ('mixgone', 'mixkept') ORDER BY j.tag$$,
    $$VALUES ('mixgone', NULL, NULL, 1), ('mixkept', 'done', '{"n": 3}'::jsonb, 1)$$,
    'The deleted row should be gone, the kept one done with its own output, each counted once'
);

-- The same without outputs (jobs that answered nothing), which 0.3.9 settles by `id = ANY`
-- with the ids as they came: the kept row after the deleted one is still done, once.
SELECT bag_eq(
    $$SELECT c FROM x_jobs.complete_many(
          ARRAY[tap_helpers.jid('nullgone'), -1, tap_helpers.jid('nullkept'), tap_helpers.jid('nullkept')], 'w1'
      ) AS c$$,
    $$VALUES (tap_helpers.jid('nullgone')), (tap_helpers.jid('nullkept'))$$,
    'complete_many without outputs should answer each held id once, past an unknown id and a repeated one'
);

SELECT results_eq(
    $$SELECT j.tag, x.state::text, x.output,
             (SELECT sum(c.completed)::integer FROM x_jobs.counter AS c WHERE c.job = 't37_' || j.tag)
      FROM j LEFT JOIN x_jobs.job AS x ON x.id = j.id
      WHERE j.tag IN ('nullgone', 'nullkept') ORDER BY j.tag$$,
    $$VALUES ('nullgone', NULL, NULL::jsonb, 1), ('nullkept', 'done', NULL::jsonb, 1)$$,
    'Without outputs, the deleted row should be gone and the kept one done, each counted once'
);

SELECT * FROM finish();
ROLLBACK;
