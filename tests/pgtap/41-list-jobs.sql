-- x_jobs.list_jobs: the operator's listing, newest first, per state, queue and job name, paged by
-- before_id.
-- Each kind of state reads its own index (dead, failed and cancelled rows job_ended_idx, done and
-- all rows the primary key), so every state is listed here, with rows of the other states and
-- queues between its own.
BEGIN;
SELECT plan(15);

-- Five rows of each state, enqueued round-robin over the states, so that each state's rows lie
-- between those of the others: rounds 1-3 in t41-a, rounds 4-5 in t41-b. Rows are set to their
-- state directly: list_jobs reads only state, queue and id.
CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

INSERT INTO j (tag, id)
SELECT
    s.state || '-' || r.round AS tag,
    e.id
FROM generate_series(1, 5) AS r (round)
CROSS JOIN unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
CROSS JOIN
    LATERAL x_jobs.enqueue(
        't41_' || s.state, queue => CASE WHEN r.round <= 3 THEN 't41-a' ELSE 't41-b' END
    ) AS e;

UPDATE x_jobs.job AS x
SET
    state = split_part(t.tag, '-', 1)::x_jobs.job_state,
    claimed_by = CASE WHEN t.tag LIKE 'running-%' THEN 't41-w' END,
    visible_at = CASE WHEN t.tag LIKE 'running-%' THEN now() + interval '1 hour' END,
    finished_at = CASE
        WHEN split_part(t.tag, '-', 1) IN ('done', 'failed', 'dead', 'cancelled') THEN now()
    END
FROM j AS t
WHERE x.id = t.id;

-- What each listing should answer: the fixture's rows, newest first.
CREATE TEMP VIEW want AS
SELECT
    x.id,
    x.state::text AS state,
    x.queue
FROM x_jobs.job AS x
WHERE x.id IN (SELECT t.id FROM j AS t);

SELECT is(
    (SELECT count(DISTINCT w.state)::integer FROM want AS w),
    pg_catalog.cardinality(pg_catalog.enum_range(NULL::x_jobs.job_state)),
    'The fixture should hold rows of every job state'
);

SELECT set_eq(
    $$
    SELECT s.state, ARRAY(SELECT l.id FROM x_jobs.list_jobs(state => s.state, queue => 't41-a') AS l)
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
    $$,
    $$
    SELECT s.state, ARRAY(
        SELECT w.id FROM want AS w WHERE w.state = s.state AND w.queue = 't41-a' ORDER BY w.id DESC
    )
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
    $$,
    'list_jobs of each state and a queue should answer exactly that state''s rows of the queue, newest first'
);

SELECT set_eq(
    $$
    SELECT s.state, ARRAY(SELECT l.id FROM x_jobs.list_jobs(state => s.state) AS l)
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
    $$,
    $$
    SELECT s.state, ARRAY(SELECT w.id FROM want AS w WHERE w.state = s.state ORDER BY w.id DESC)
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
    $$,
    'list_jobs of each state without a queue should answer that state''s rows of every queue, newest first'
);

SELECT results_eq(
    $$ SELECT l.id FROM x_jobs.list_jobs(queue => 't41-b') AS l $$,
    $$ SELECT w.id FROM want AS w WHERE w.queue = 't41-b' ORDER BY w.id DESC $$,
    'list_jobs of a queue without a state should answer all its rows, newest first'
);

SELECT results_eq(
    $$ SELECT l.id FROM x_jobs.list_jobs(max_rows => 1000) AS l $$,
    $$ SELECT w.id FROM want AS w ORDER BY w.id DESC $$,
    'list_jobs without a state or a queue should answer every row, newest first'
);

-- Pages of one row, each starting before the last id of the one before, for every state and for
-- no state, with and without a queue: every row once, in order, and then an empty page.
SELECT set_eq(
    $$
    WITH RECURSIVE
    asks (state, queue) AS (
        SELECT s.state, q.queue
        FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[] || NULL::text) AS s (state)
        CROSS JOIN (VALUES ('t41-a'), ('t41-b'), (NULL)) AS q (queue)
    ),
    walk (state, queue, page, id) AS (
        SELECT a.state, a.queue, 1,
               (SELECT l.id FROM x_jobs.list_jobs(a.state, a.queue, NULL, 1) AS l)
        FROM asks AS a
        UNION ALL
        SELECT w.state, w.queue, w.page + 1,
               (SELECT l.id FROM x_jobs.list_jobs(w.state, w.queue, w.id, 1) AS l)
        FROM walk AS w
        WHERE w.id IS NOT NULL
    )
    SELECT w.state, w.queue, pg_catalog.array_agg(w.id ORDER BY w.page)
    FROM walk AS w
    GROUP BY w.state, w.queue
    $$,
    $$
    SELECT a.state, a.queue,
           ARRAY(
               SELECT w.id FROM want AS w
               WHERE (a.state IS NULL OR w.state = a.state) AND (a.queue IS NULL OR w.queue = a.queue)
               ORDER BY w.id DESC
           ) || NULL::bigint
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[] || NULL::text) AS s (state)
    CROSS JOIN (VALUES ('t41-a'), ('t41-b'), (NULL)) AS q (queue)
    CROSS JOIN LATERAL (SELECT s.state, q.queue) AS a
    $$,
    'Paging one row at a time with before_id should answer each row of a state and queue once, newest first'
);

-- Each state's rows are of one job name, t41_<state>: a name alone, and with a state and queue.
SELECT set_eq(
    $$
    SELECT s.state, ARRAY(SELECT l.id FROM x_jobs.list_jobs(name => 't41_' || s.state) AS l)
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
    $$,
    $$
    SELECT s.state, ARRAY(SELECT w.id FROM want AS w WHERE w.state = s.state ORDER BY w.id DESC)
    FROM unnest(pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) AS s (state)
    $$,
    'list_jobs of a job name should answer that name''s rows of every state and queue, newest first'
);

SELECT results_eq(
    $$
    SELECT l.id
    FROM x_jobs.list_jobs(state => 'dead', queue => 't41-a', name => 't41_dead', before_id => NULL, max_rows => 2) AS l
    $$,
    $$ VALUES (tap_helpers.jid('dead-3')), (tap_helpers.jid('dead-2')) $$,
    'list_jobs of a name, a state and a queue should answer the rows with all three, a page at a time'
);

SELECT is_empty(
    $$ SELECT * FROM x_jobs.list_jobs(state => 'dead', name => 't41_ready') $$,
    'list_jobs should answer nothing for a name none of the state''s rows has'
);

SELECT results_eq(
    $$
    SELECT l.id
    FROM x_jobs.list_jobs(state => 'dead', before_id => tap_helpers.jid('dead-4'), max_rows => 2) AS l
    $$,
    $$ VALUES (tap_helpers.jid('dead-3')), (tap_helpers.jid('dead-2')) $$,
    'A page should start below before_id and hold at most max_rows rows'
);

-- A row leaves the listing of its old state and enters that of its new one: retry re-queues a
-- dead row (it is no longer dead), cancel ends a ready one.
DO $$
BEGIN
    PERFORM x_jobs.retry(tap_helpers.jid('dead-5'));
    PERFORM x_jobs.cancel(tap_helpers.jid('ready-5'));
END
$$;

SELECT results_eq(
    $$ SELECT l.id FROM x_jobs.list_jobs(state => 'dead', queue => 't41-b') AS l $$,
    $$ VALUES (tap_helpers.jid('dead-4')) $$,
    'A retried row should leave the listing of dead rows'
);

SELECT results_eq(
    $$ SELECT l.id FROM x_jobs.list_jobs(state => 'cancelled', queue => 't41-b') AS l $$,
    $$ VALUES (tap_helpers.jid('cancelled-5')), (tap_helpers.jid('ready-5')), (tap_helpers.jid('cancelled-4')) $$,
    'A cancelled row should enter the listing of cancelled rows, newest first by id'
);

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.list_jobs(state => 'gone') $$,
    'XJ016',
    'X_STATE_UNKNOWN: ''gone'' is not a job state',
    'list_jobs should refuse a state that is not a job state'
);

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.list_jobs(state => 'dead', max_rows => 0) $$,
    'XJ013',
    'X_QTY_INVALID: max_rows 0 is outside 1..1000',
    'list_jobs should refuse a page of 0 rows'
);

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.list_jobs(state => 'dead', max_rows => 1001) $$,
    'XJ013',
    'X_QTY_INVALID: max_rows 1001 is outside 1..1000',
    'list_jobs should refuse a page of over 1000 rows'
);

SELECT * FROM finish();
ROLLBACK;
