-- The readers: what a client reads of the tables, through functions (job_detail, job_errors,
-- job_steps, job_states, held_jobs, list_outbox, outbox_message, job_counters). Each answers
-- its rows in its order, no row for an id that names nothing, and is refused to a role it is not
-- granted to.
BEGIN;
SELECT plan(27);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- Job a: failed once by t43-w1 (an error row), claimed again by t43-w2, a step recorded. Job b:
-- claimed by t43-w1 and completed (a counter). Job c: ready.
CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

INSERT INTO j (tag, id)
SELECT
    t.tag,
    (x_jobs.enqueue('t43_' || t.tag, input => jsonb_build_object('tag', t.tag), queue => 't43-' || t.tag)).id AS id
FROM (VALUES ('a'), ('b'), ('c')) AS t (tag);

SELECT ok(
    (SELECT count(*) = 1 FROM x_jobs.claim(ARRAY['t43-a'], 't43-w1')),
    'The fixture: job a should be claimed by t43-w1'
);

SELECT is(
    x_jobs.fail((
        SELECT id FROM j
        WHERE tag = 'a'
    ), 't43-w1', 'boom', 'at line 1', retry_delay => '0 seconds')::text,
    'ready',
    'The fixture: job a should fail its first attempt, due again at once'
);

SELECT ok(
    (SELECT count(*) = 1 FROM x_jobs.claim(ARRAY['t43-a'], 't43-w2')),
    'The fixture: job a should be claimed again, by t43-w2'
);

SELECT is(
    x_jobs.step_record((
        SELECT id FROM j
        WHERE tag = 'a'
    ), 't43-w2', 'fetch', '{"n": 1}')::text,
    'done',
    'The fixture: job a should record a step'
);

SELECT ok(
    (SELECT count(*) = 1 FROM x_jobs.claim(ARRAY['t43-b'], 't43-w1'))
    AND x_jobs.complete((
        SELECT id FROM j
        WHERE tag = 'b'
    ), 't43-w1', '{"ok": true}'),
    'The fixture: job b should be claimed and completed by t43-w1'
);

-- job_detail ----------------------------------------------------------------------------------

SELECT results_eq(
    $$
    SELECT d.id, d.name, d.queue, d.state, d.attempt, d.claimed_by, d.input, d.last_error, d.last_error_stack
    FROM x_jobs.job_detail((SELECT id FROM j WHERE tag = 'a')) AS d
    $$,
    $$
    SELECT id, 't43_a', 't43-a', 'running', 2, 't43-w2', '{"tag": "a"}'::jsonb, 'boom', 'at line 1'
    FROM j WHERE tag = 'a'
    $$,
    'job_detail should answer the job''s row, its state as text, its input and its last error'
);

SELECT results_eq(
    $$SELECT d.* FROM j, LATERAL x_jobs.job_detail(j.id) AS d ORDER BY d.id$$,
    $$
    SELECT x.id, x.name, x.queue, x.state::text, x.attempt, x.max_attempts, x.priority, x.run_at,
           x.visible_at, x.claimed_by, x.tenant_id, x.idempotency_key, x.concurrency_key,
           x.concurrency_limit, x.dead_letter, x.keep_done, x.backoff_base, x.backoff_max, x.claims,
           x.run_id, x.traceparent, x.enqueued_by, x.created_at, x.started_at, x.finished_at,
           x.updated_at, x.input, x.output, x.progress, x.last_error, x.last_error_stack
    FROM x_jobs.job AS x
    WHERE x.id IN (SELECT id FROM j)
    ORDER BY x.id
    $$,
    'job_detail should answer every field of the row, for each job'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.job_detail(-1)$$,
    'job_detail should answer no row for an id that names no job'
);

-- job_errors ----------------------------------------------------------------------------------

SELECT results_eq(
    $$
    SELECT e.attempt, e.worker, e.error, e.error_stack
    FROM x_jobs.job_errors((SELECT id FROM j WHERE tag = 'a')) AS e
    $$,
    $$VALUES (1, 't43-w1'::text, 'boom'::text, 'at line 1'::text)$$,
    'job_errors should answer the failed attempt, with its worker, error and stack'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.job_errors((SELECT id FROM j WHERE tag = 'b'))$$,
    'job_errors should answer no row for a job that never failed'
);

SELECT is_empty($$SELECT * FROM x_jobs.job_errors(-1)$$, 'job_errors should answer no row for an unknown id');

-- job_steps -----------------------------------------------------------------------------------

SELECT results_eq(
    $$
    SELECT s.job_id, s.name, s.compensation, s.kind, s.status, s.attempt, s.output
    FROM x_jobs.job_steps((SELECT id FROM j WHERE tag = 'a')) AS s
    $$,
    $$SELECT id, 'fetch'::text, FALSE, 'run'::text, 'done'::text, 2, '{"n": 1}'::jsonb FROM j WHERE tag = 'a'$$,
    'job_steps should answer the steps the run recorded, their status as text'
);

SELECT is_empty($$SELECT * FROM x_jobs.job_steps(-1)$$, 'job_steps should answer no row for an unknown id');

-- job_states and held_jobs --------------------------------------------------------------------

SELECT results_eq(
    $$
    SELECT s.id, s.state, s.attempt, s.claimed_by
    FROM x_jobs.job_states((SELECT array_agg(id) || -1::bigint FROM j)) AS s
    $$,
    $$
    SELECT id,
           CASE tag WHEN 'a' THEN 'running' WHEN 'b' THEN 'done' ELSE 'ready' END,
           CASE tag WHEN 'c' THEN 0 ELSE CASE tag WHEN 'a' THEN 2 ELSE 1 END END,
           CASE tag WHEN 'a' THEN 't43-w2' WHEN 'b' THEN 't43-w1' END
    FROM j ORDER BY id
    $$,
    'job_states should answer each job by id, in id order, and leave out an id that names none'
);

SELECT results_eq(
    $$SELECT h.id, h.attempt FROM x_jobs.held_jobs('t43-w2') AS h$$,
    $$SELECT id, 2 FROM j WHERE tag = 'a'$$,
    'held_jobs should answer the jobs the worker holds now'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.held_jobs('t43-w1')$$,
    'held_jobs should answer nothing for a worker whose jobs were settled or taken over'
);

-- list_outbox and outbox_message --------------------------------------------------------------

CREATE TEMP TABLE m (n integer PRIMARY KEY, id bigint NOT NULL);

INSERT INTO m (n, id)
SELECT
    g AS n,
    x_jobs.outbox_put(
        CASE WHEN g % 2 = 0 THEN 't43-even' ELSE 't43-odd' END, jsonb_build_object('n', g),
        key => CASE WHEN g <= 3 THEN 't43-k' END
    ) AS id
FROM generate_series(1, 6) AS g;

UPDATE x_jobs.outbox SET state = 'dead', last_error = 'refused'
WHERE id = (
    SELECT id FROM m
    WHERE n = 5
);

SELECT results_eq(
    $$SELECT o.id FROM x_jobs.list_outbox(max_rows => 4) AS o$$,
    $$SELECT id FROM m ORDER BY id DESC LIMIT 4$$,
    'list_outbox should answer the newest messages first, a page of max_rows'
);

SELECT results_eq(
    $$
    SELECT o.id FROM x_jobs.list_outbox(before_id => (SELECT id FROM m WHERE n = 3)) AS o
    WHERE o.topic LIKE 't43-%'
    $$,
    $$SELECT id FROM m WHERE n < 3 ORDER BY id DESC$$,
    'list_outbox should page on below before_id'
);

SELECT results_eq(
    $$SELECT o.id FROM x_jobs.list_outbox(topic => 't43-even', key => 't43-k', state => 'pending') AS o$$,
    $$SELECT id FROM m WHERE n = 2$$,
    'list_outbox should answer only the messages of the topic, key and state asked for'
);

SELECT results_eq(
    $$SELECT o.id, o.state, o.last_error FROM x_jobs.list_outbox(state => 'dead') AS o WHERE o.topic LIKE 't43-%'$$,
    $$SELECT id, 'dead'::text, 'refused'::text FROM m WHERE n = 5$$,
    'list_outbox should answer the dead messages, their state as text'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.list_outbox(state => 'lost')$$,
    'XJ016',
    'X_STATE_UNKNOWN: ''lost'' is not an outbox state',
    'list_outbox should refuse a state that is not an outbox state'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.list_outbox(max_rows => 0)$$,
    'XJ013',
    'X_QTY_INVALID: max_rows 0 is outside 1..1000',
    'list_outbox should refuse a page of no rows'
);

SELECT results_eq(
    $$SELECT o.id, o.topic, o.key, o.payload, o.state FROM x_jobs.outbox_message((SELECT id FROM m WHERE n = 1)) AS o$$,
    $$SELECT id, 't43-odd'::text, 't43-k'::text, '{"n": 1}'::jsonb, 'pending'::text FROM m WHERE n = 1$$,
    'outbox_message should answer the message'
);

SELECT is_empty($$SELECT * FROM x_jobs.outbox_message(-1)$$, 'outbox_message should answer no row for an unknown id');

-- job_counters --------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT c.job, c.completed, c.retried FROM x_jobs.job_counters() AS c WHERE c.job LIKE 't43_%'$$,
    $$VALUES ('t43_a'::text, 0::bigint, 1::bigint), ('t43_b', 1, 0)$$,
    'job_counters should sum what settled per job name'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.job_counters(since => '2030-01-02 00:00:00+00') AS c WHERE c.job LIKE 't43_%'$$,
    'job_counters should leave out the buckets before since'
);

-- Grants --------------------------------------------------------------------------------------

CREATE ROLE t43_producer;
GRANT x_jobs_producer TO t43_producer;
SET LOCAL ROLE t43_producer;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_detail(1)$$,
    '42501',
    'permission denied for function job_detail',
    'A producer should not be able to read a job''s detail'
);

RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
