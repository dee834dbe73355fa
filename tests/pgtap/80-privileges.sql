-- The grants: a producer enqueues, publishes (through the SECURITY DEFINER publish, with no right
-- of its own on jobs, steps or events) and puts outbox messages, and no more; the receiver's role
-- (x_jobs_webhook) receives webhooks and does nothing else; a
-- worker claims, settles and runs the steps of what it holds and relays the outbox, but does not
-- operate; an admin operates (resolves steps, redrives messages, runs every retention); a role
-- without a grant cannot reach the schema, and pg_monitor reads demand and gauge counts but not
-- the jobs, steps, events, messages or webhooks. Each role is created here and rolled back with
-- the test; each block runs under SET ROLE and ends with RESET ROLE. The clock is moved with
-- SET LOCAL "x_jobs.fake_now", which only a superuser's session may do (the last block).
BEGIN;
SELECT plan(192);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE ROLE t80_producer LOGIN;
CREATE ROLE t80_worker LOGIN;
CREATE ROLE t80_admin LOGIN;
CREATE ROLE t80_nobody LOGIN;
CREATE ROLE t80_monitor LOGIN;
CREATE ROLE t80_webhook LOGIN;
GRANT x_jobs_webhook TO t80_webhook;
GRANT x_jobs_producer TO t80_producer;
GRANT x_jobs_worker TO t80_worker;
GRANT x_jobs_admin TO t80_admin;
GRANT pg_monitor TO t80_monitor;

------------------------------------------------------------------------------------------------
-- Producer
------------------------------------------------------------------------------------------------

SET ROLE t80_producer;

SELECT is(
    (SELECT e.deduped FROM x_jobs.enqueue('t80_p1', queue => 't80-q') AS e),
    FALSE,
    'A producer should be able to enqueue a job'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.enqueue_many('[{"name": "t80_p2", "queue": "t80-q"}, {"name": "t80_p3", "queue": "t80-q"}]')
    ),
    2,
    'A producer should be able to enqueue a batch with enqueue_many'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.claim(ARRAY['t80-q'], 't80-w')$$,
    '42501',
    'permission denied for function claim',
    'A producer should not be able to claim'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel(1)$$,
    '42501',
    'permission denied for function cancel',
    'A producer should not be able to cancel'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(queue => 't80-q')$$,
    '42501',
    'permission denied for function cancel_jobs',
    'A producer should not be able to cancel jobs by filter'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(queue => 't80-q')$$,
    '42501',
    'permission denied for function retry_jobs',
    'A producer should not be able to retry jobs by filter'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.queue_gauges()$$,
    '42501',
    'permission denied for function queue_gauges',
    'A producer should not be able to read the queue gauges'
);

-- 0.3.6: enqueue runs as its owner and a producer has no right on x_jobs.job, so it reads no
-- other job's input and writes no row that skips enqueue's checks.
SELECT results_eq(
    $$SELECT e.deduped FROM x_jobs.enqueue('t80_p4', queue => 't80-own', idempotency_key => 't80-k4') AS e
      UNION ALL
      SELECT e.deduped FROM x_jobs.enqueue('t80_p4', queue => 't80-own', idempotency_key => 't80-k4') AS e$$,
    ARRAY[FALSE, TRUE],
    'A producer''s enqueue should still find the live row of its idempotency key (it reads as its owner)'
);

SELECT throws_ok(
    $$SELECT j.input FROM x_jobs.job AS j$$,
    '42501',
    'permission denied for table job',
    'A producer should not be able to read the jobs (other producers'' inputs)'
);

SELECT throws_ok(
    $$INSERT INTO x_jobs.job (run_id, created_at, backoff_base, backoff_max, max_attempts, name, queue,
          tenant_id, input, state, run_at, updated_at, claimed_by, visible_at)
      VALUES (gen_random_uuid(), now(), '1 s', '1 h', 1, 't80_forged', 't80-own', 'none', '{}', 'running',
          now(), now(), 'somebody', now() + '1 hour')$$,
    '42501',
    'permission denied for table job',
    'A producer should not be able to insert a row past enqueue''s checks (a forged running row)'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs._enqueue(ARRAY[]::x_jobs.enqueue_request[])$$,
    '42501',
    'permission denied for function _enqueue',
    'A producer should not be able to call the helper that enqueue calls as its owner'
);

SELECT results_eq(
    -- The deduped enqueue answers the id of the row the statements above inserted.
    $$SELECT r.state, r.output, r.last_error
      FROM x_jobs.enqueue('t80_p4', queue => 't80-own', idempotency_key => 't80-k4') AS e,
          x_jobs.result(e.id) AS r$$,
    $$VALUES ('ready'::text, NULL::jsonb, NULL::text)$$,
    'A producer should be able to read a job''s outcome through result()'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.result(-1)$$,
    'result() of an id no job has should answer no row'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- Worker
------------------------------------------------------------------------------------------------

SET ROLE t80_worker;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t80-q'], 't80-w', qty => 10)),
    3,
    'A worker should be able to claim'
);

SELECT
    is(
        x_jobs.complete(k.id, 't80-w', '{"ok": true}'),
        TRUE,
        'A worker should be able to complete the row it holds'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p1';

SELECT
    is(
        x_jobs.fail(k.id, 't80-w', 'boom', retry_delay => '1 hour'),
        'delayed'::x_jobs.job_state,
        'A worker should be able to fail the row it holds'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p2';

SELECT results_eq(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY(SELECT id FROM x_jobs.job WHERE name = 't80_p3'), 't80-w')$$,
    $$SELECT id FROM x_jobs.job WHERE name = 't80_p3'$$,
    'A worker should be able to extend the lease of the row it holds'
);

SELECT is(
    (SELECT w.id FROM x_jobs.announce_worker('t80-w', ARRAY['t80-q']) AS w),
    't80-w',
    'A worker should be able to announce itself'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel((SELECT id FROM x_jobs.job WHERE name = 't80_p3'))$$,
    '42501',
    'permission denied for function cancel',
    'A worker should not be able to cancel'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(queue => 't80-q', dry_run => TRUE)$$,
    '42501',
    'permission denied for function cancel_jobs',
    'A worker should not be able to cancel jobs by filter, not even count them'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(queue => 't80-q', dry_run => TRUE)$$,
    '42501',
    'permission denied for function retry_jobs',
    'A worker should not be able to retry jobs by filter, not even count them'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge('0 seconds')$$,
    '42501',
    'permission denied for function purge',
    'A worker should not be able to purge'
);

-- 0.3.6: the worker's functions run as their owner; the worker writes no table itself.
SELECT throws_ok(
    $$UPDATE x_jobs.job SET state = 'running', claimed_by = 'forged', visible_at = now() + '1 day'
      WHERE queue = 't80-q'$$,
    '42501',
    'permission denied for table job',
    'A worker should not be able to rewrite job rows directly (take one it did not claim)'
);

SELECT throws_ok(
    $$DELETE FROM x_jobs.job WHERE queue = 't80-q'$$,
    '42501',
    'permission denied for table job',
    'A worker should not be able to delete job rows directly'
);

SELECT throws_ok(
    $$INSERT INTO x_jobs.step (job_id, name, kind, status) VALUES (1, 'forged', 'run', 'done')$$,
    '42501',
    'permission denied for table step',
    'A worker should not be able to write steps directly'
);

SELECT throws_ok(
    $$UPDATE x_jobs.worker SET draining_at = now()$$,
    '42501',
    'permission denied for table worker',
    'A worker should not be able to rewrite other workers'' announcements'
);

-- The metrics gauges: counted and stored through queue_gauges, which runs as its owner.
SELECT lives_ok(
    $$SELECT * FROM x_jobs.queue_gauges(max_age => '0')$$,
    'A worker should be able to read the queue gauges, counting and storing their snapshot'
);

SELECT throws_ok(
    $$DELETE FROM x_jobs.queue_snapshot$$,
    '42501',
    'permission denied for table queue_snapshot',
    'A worker should not be able to write the gauges'' snapshot directly'
);

RESET ROLE;

-- 10:00:40: p3's lease (extended to 10:00:30) lapsed. Taking over a lapsed row also writes the
-- lapse into job_error and counter, which a worker must be allowed to do.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:40+00';

SET ROLE t80_worker;

SELECT results_eq(
    $$SELECT name, claimed_by, attempt FROM x_jobs.claim(ARRAY['t80-q'], 't80-w2')$$,
    $$VALUES ('t80_p3', 't80-w2', 2)$$,
    'A worker should be able to take over a row whose lease lapsed'
);

RESET ROLE;

SELECT results_eq(
    $$SELECT e.worker, e.attempt FROM x_jobs.job_error AS e JOIN x_jobs.job AS k ON k.id = e.job_id
      WHERE k.name = 't80_p3'$$,
    $$VALUES ('t80-w', 1)$$,
    'The take-over by the worker role should have logged the lapsed attempt'
);

------------------------------------------------------------------------------------------------
-- Admin
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:50+00';

SET ROLE t80_admin;

SELECT
    is(
        x_jobs.cancel(k.id),
        TRUE,
        'An admin should be able to cancel a running row'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p3';

SELECT
    is(
        x_jobs.retry(k.id),
        TRUE,
        'An admin should be able to retry a cancelled row'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p3';

-- By filter: p3 is ready again, cancelled once more and retried back.
SELECT is(
    x_jobs.cancel_jobs(queue => 't80-q', name => 't80_p3', dry_run => TRUE),
    1::bigint,
    'An admin should be able to count the jobs a cancel by filter would cancel'
);

SELECT is(
    x_jobs.cancel_jobs(queue => 't80-q', name => 't80_p3'),
    1::bigint,
    'An admin should be able to cancel jobs by filter'
);

SELECT is(
    x_jobs.retry_jobs(queue => 't80-q', state => 'cancelled'),
    1::bigint,
    'An admin should be able to retry jobs by filter (the steps and counters it touches included)'
);

SELECT results_eq(
    $$SELECT name, state::text FROM x_jobs.list_jobs(queue => 't80-q', name => 't80_p3')$$,
    $$VALUES ('t80_p3', 'ready')$$,
    'An admin should be able to list the jobs of one name'
);

SELECT is(x_jobs.pause_queue('t80-q'), TRUE, 'An admin should be able to pause a queue');

SELECT is(x_jobs.resume_queue('t80-q'), TRUE, 'An admin should be able to resume a queue');

SELECT is(x_jobs.purge('0 seconds'), 1::bigint, 'An admin should be able to purge (the done row)');

SELECT is(
    x_jobs.rollup_counters('0 seconds', '2 days', '400 days'),
    3::bigint,
    'An admin should be able to roll the counters up (the 10:00 minute of each of the three job names)'
);

SELECT results_eq(
    $$SELECT name, state::text FROM x_jobs.job WHERE name LIKE 't80%' AND queue = 't80-q' ORDER BY name$$,
    $$VALUES ('t80_p2', 'delayed'), ('t80_p3', 'ready')$$,
    'The admin''s calls should have taken effect: p1 purged, p3 retried'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- No grant
------------------------------------------------------------------------------------------------

SET ROLE t80_nobody;

SELECT throws_ok(
    $$SELECT x_jobs.enqueue('t80_nobody')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to enqueue'
);

RESET ROLE;

SELECT is_empty(
    $$SELECT * FROM x_jobs.job WHERE name = 't80_nobody'$$,
    'The refused enqueue should have inserted nothing'
);

------------------------------------------------------------------------------------------------
-- Notifications: any login may LISTEN, so a payload is a tag made of a secret only the owner
-- reads; a worker (listener) asks the tags of the names it names.
------------------------------------------------------------------------------------------------

SET ROLE t80_nobody;

SELECT throws_ok(
    $$SELECT secret FROM x_jobs.notify_secret$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to read the secret notifications are tagged with'
);

SELECT throws_ok(
    $$SELECT x_jobs.notify_tags(channel => 'x_jobs', names => ARRAY['t80-q'])$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to ask the tag of a queue'
);

SET ROLE t80_producer;

SELECT throws_ok(
    $$SELECT secret FROM x_jobs.notify_secret$$,
    '42501',
    'permission denied for table notify_secret',
    'A producer should not be able to read the secret notifications are tagged with'
);

SELECT throws_ok(
    $$SELECT x_jobs.notify_tags(channel => 'x_jobs', names => ARRAY['t80-q'])$$,
    '42501',
    'permission denied for function notify_tags',
    'A producer should not be able to ask the tag of a queue'
);

SELECT throws_ok(
    $$SELECT x_jobs._notify_tag('x_jobs', 't80-q')$$,
    '42501',
    'permission denied for function _notify_tag',
    'A producer should not be able to make the tag of a queue'
);

SET ROLE t80_monitor;

SELECT throws_ok(
    $$SELECT secret FROM x_jobs.notify_secret$$,
    '42501',
    'permission denied for table notify_secret',
    'A monitor should not be able to read the secret notifications are tagged with'
);

SET ROLE t80_admin;

SELECT throws_ok(
    $$SELECT secret FROM x_jobs.notify_secret$$,
    '42501',
    'permission denied for table notify_secret',
    'An admin should not be able to read the secret notifications are tagged with'
);

SET ROLE t80_worker;

SELECT throws_ok(
    $$SELECT secret FROM x_jobs.notify_secret$$,
    '42501',
    'permission denied for table notify_secret',
    'A worker should not be able to read the secret notifications are tagged with'
);

CREATE TEMP TABLE t80_tags ON COMMIT DROP AS
SELECT x_jobs.notify_tags(channel => 'x_jobs', names => ARRAY['t80-q', 'default']) AS tags;

RESET ROLE;

SELECT is(
    (SELECT t.tags FROM t80_tags AS t),
    ARRAY[x_jobs._notify_tag('x_jobs', 't80-q'), x_jobs._notify_tag('x_jobs', 'default')],
    'A worker should be told the tags notifications carry for its queues, in the order it named them'
);

SELECT ok(
    x_jobs._notify_tag('x_jobs', 't80-q') ~ '^[0-9a-f]{16}$'
    AND x_jobs._notify_tag('x_jobs', 't80-q') <> 't80-q',
    'The tag of a queue should be 16 hex digits, not its name'
);

SELECT isnt(
    x_jobs._notify_tag('x_jobs', 't80-q'),
    x_jobs._notify_tag('x_jobs_outbox', 't80-q'),
    'A queue and a topic of the same name should have different tags'
);

-- No function sends a name: each pg_notify of the extension's sends a tag.
SELECT is_empty(
    $$
    SELECT p.proname
    FROM pg_catalog.pg_proc AS p
    WHERE p.pronamespace = 'x_jobs'::regnamespace
        AND (SELECT count(*) FROM regexp_matches(p.prosrc, 'pg_notify\(', 'g'))
        <> (SELECT count(*) FROM regexp_matches(p.prosrc, 'pg_notify\([^,]+, x_jobs\._notify_tag\(', 'g'))
    $$,
    'Every notification the extension sends should carry a tag made by _notify_tag, never a name'
);

------------------------------------------------------------------------------------------------
-- Monitoring
------------------------------------------------------------------------------------------------

SET ROLE t80_monitor;

-- p3 is ready again; p2 waits until 11:00.
SELECT results_eq(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue = 't80-q'$$,
    $$VALUES ('t80-q', 1::bigint)$$,
    'A pg_monitor member should be able to read queue_demand'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.job',
    '42501',
    'permission denied for table job',
    'A pg_monitor member should not be able to read the jobs'
);

SELECT results_eq(
    $$SELECT queue, demand FROM x_jobs.queue_gauges(max_age => '0') WHERE queue = 't80-q'$$,
    $$VALUES ('t80-q', 1::bigint)$$,
    'A pg_monitor member should be able to read the queue gauges, the same demand included'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.queue_snapshot',
    '42501',
    'permission denied for table queue_snapshot',
    'A pg_monitor member should not be able to read the gauges'' snapshot but through queue_gauges'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.job_error',
    '42501',
    'permission denied for table job_error',
    'A pg_monitor member should not be able to read the error history'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.step',
    '42501',
    'permission denied for table step',
    'A pg_monitor member should not be able to read the steps (their outputs)'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.event',
    '42501',
    'permission denied for table event',
    'A pg_monitor member should not be able to read the events (their payloads)'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- Steps and events (0.2.0)
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:00:00+00';

-- Two jobs for the steps, enqueued by the test (the producer's enqueue is checked above); every
-- role of the test reads their ids.
CREATE TEMP TABLE t80_s AS
SELECT
    t.tag,
    e.id
FROM unnest(ARRAY['wait', 'sleep']) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t80_s_' || t.tag, queue => 't80-s') AS e;

GRANT SELECT ON t80_s TO public;

CREATE FUNCTION pg_temp.sid(p_tag text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$ SELECT t.id FROM t80_s AS t WHERE t.tag = p_tag $$;

SET ROLE t80_worker;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t80-s'], 't80-ws', qty => 10)),
    2,
    'A worker should claim the two step jobs (setup)'
);

SELECT is(
    x_jobs.step_record(pg_temp.sid('wait'), 't80-ws', 'fetch', '{"n": 1}'),
    'done'::x_jobs.step_status,
    'A worker should be able to record a step of the job it holds'
);

SELECT is(
    x_jobs.progress(pg_temp.sid('wait'), 't80-ws', 1, 2, 'half'),
    TRUE,
    'A worker should be able to report the progress of the job it holds'
);

SELECT results_eq(
    $$SELECT name, status::text FROM x_jobs.steps(pg_temp.sid('wait'), 't80-ws')$$,
    $$VALUES ('fetch', 'done')$$,
    'A worker should be able to read the steps of the job it holds'
);

SELECT results_eq(
    $$SELECT status::text FROM x_jobs.step_wait(pg_temp.sid('wait'), 't80-ws', 'pay', 't80.paid')
      UNION ALL
      SELECT status::text FROM x_jobs.step_sleep(pg_temp.sid('sleep'), 't80-ws', 'nap', '1 hour')$$,
    $$VALUES ('waiting'), ('waiting')$$,
    'A worker should be able to suspend the jobs it holds on a wait and on a sleep'
);

SELECT throws_ok(
    $$SELECT x_jobs.resolve_step(pg_temp.sid('sleep'), 'nap')$$,
    '42501',
    'permission denied for function resolve_step',
    'A worker should not be able to resolve a step by hand'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge_events('0 seconds')$$,
    '42501',
    'permission denied for function purge_events',
    'A worker should not be able to purge events'
);

RESET ROLE;

SELECT results_eq(
    $$SELECT k.state::text, k.claimed_by FROM x_jobs.job AS k JOIN t80_s AS t ON t.id = k.id ORDER BY t.tag$$,
    $$VALUES ('suspended', NULL::text), ('suspended', NULL::text)$$,
    'The worker''s wait and sleep should have suspended both jobs'
);

SET ROLE t80_producer;

SELECT is(
    (SELECT p.woken FROM x_jobs.publish('t80.paid', '{"paid": true}') AS p),
    1,
    'A producer should be able to publish an event and wake the run waiting for it'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.steps(pg_temp.sid('wait'), 't80-ws')$$,
    '42501',
    'permission denied for function steps',
    'A producer should not be able to read steps through the worker functions'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_record(pg_temp.sid('wait'), 't80-ws', 'x')$$,
    '42501',
    'permission denied for function step_record',
    'A producer should not be able to record a step'
);

SELECT throws_ok(
    $$SELECT x_jobs.resolve_step(pg_temp.sid('sleep'), 'nap')$$,
    '42501',
    'permission denied for function resolve_step',
    'A producer should not be able to resolve a step by hand'
);

-- publish runs as its owner: the producer itself has no right on jobs beyond enqueue, none on
-- steps or events, and none on the helpers publish calls.
SELECT throws_ok(
    $$UPDATE x_jobs.job SET state = 'ready', run_at = x_jobs.now() WHERE id = pg_temp.sid('sleep')$$,
    '42501',
    'permission denied for table job',
    'A producer should not be able to update a job directly, not even the columns a publish writes'
);

SELECT throws_ok(
    $$UPDATE x_jobs.step SET status = 'done' WHERE job_id = pg_temp.sid('sleep')$$,
    '42501',
    'permission denied for table step',
    'A producer should not be able to resolve a step by updating it directly'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.step$$,
    '42501',
    'permission denied for table step',
    'A producer should not be able to read the steps (their outputs) directly'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.event$$,
    '42501',
    'permission denied for table event',
    'A producer should not be able to read the events (other producers'' payloads) directly'
);

SELECT throws_ok(
    $$INSERT INTO x_jobs.event (name, published_at) VALUES ('t80.forged', x_jobs.now())$$,
    '42501',
    'permission denied for table event',
    'A producer should not be able to insert an event without publish'
);

SELECT throws_ok(
    $$DELETE FROM x_jobs.event$$,
    '42501',
    'permission denied for table event',
    'A producer should not be able to delete events'
);

SELECT throws_ok(
    $$SELECT x_jobs._clock()$$,
    '42501',
    'permission denied for function _clock',
    'A producer should not be able to call the step helpers that publish calls as its owner'
);

RESET ROLE;

SELECT results_eq(
    $$SELECT s.name, s.status::text, s.output, k.state::text
      FROM x_jobs.step AS s JOIN x_jobs.job AS k ON k.id = s.job_id
      WHERE s.job_id = pg_temp.sid('wait') AND s.name = 'pay'$$,
    $$VALUES ('pay', 'done', '{"paid": true}'::jsonb, 'ready')$$,
    'The producer''s publish should have resolved the wait and made its run ready'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:01:00+00';

SET ROLE t80_admin;

SELECT results_eq(
    $$SELECT status::text, resolved_by FROM x_jobs.resolve_step(pg_temp.sid('sleep'), 'nap')$$,
    $$VALUES ('done', 'operator')$$,
    'An admin should be able to resolve a waiting step by hand'
);

SELECT lives_ok(
    $$SELECT x_jobs.purge_events('0 seconds')$$,
    'An admin should be able to purge events'
);

RESET ROLE;

SELECT is_empty(
    $$SELECT * FROM x_jobs.event WHERE name = 't80.paid'$$,
    'The admin''s purge_events should have deleted the event published before'
);

SET ROLE t80_nobody;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.publish('t80.nobody')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to publish'
);

RESET ROLE;

-- A worker reads the events its waits match: a wait on an event published before it, since an
-- earlier instant, is resolved at once from the event table.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:02:00+00';

SET ROLE t80_producer;

SELECT is(
    (SELECT p.woken FROM x_jobs.publish('t80.shipped', '{"ship": 1}') AS p),
    0,
    'A producer should be able to publish an event nobody waits for yet'
);

RESET ROLE;

SET ROLE t80_worker;

SELECT results_eq(
    $$SELECT c.name FROM x_jobs.claim(ARRAY['t80-s'], 't80-ws2', qty => 10) AS c ORDER BY c.name$$,
    $$VALUES ('t80_s_sleep'), ('t80_s_wait')$$,
    'A worker should claim the two step jobs woken by the publish and the admin (setup)'
);

SELECT results_eq(
    $$SELECT status::text, output, resolved_by
      FROM x_jobs.step_wait(pg_temp.sid('wait'), 't80-ws2', 'ship', 't80.shipped',
          since => '2030-01-01 11:00:00+00')$$,
    $$VALUES ('done', '{"ship": 1}'::jsonb, 'event')$$,
    'A worker should be able to match a wait against an event published before it (it reads x_jobs.event)'
);

SELECT throws_ok(
    $$INSERT INTO x_jobs.event (name, published_at) VALUES ('t80.forged', x_jobs.now())$$,
    '42501',
    'permission denied for table event',
    'A worker should not be able to insert an event without publish'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- The outbox and the webhook ledger (0.2.0)
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

SET ROLE t80_producer;

SELECT isnt(
    x_jobs.outbox_put('t80.topic', '{"n": 1}', key => 't80-k'),
    NULL,
    'A producer should be able to put a message in the outbox'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.outbox_put_many(
            '[{"topic": "t80.topic", "payload": {"n": 2}}, {"topic": "t80.topic", "payload": {"n": 3}}]'
        )
    ),
    2,
    'A producer should be able to put a batch of messages with outbox_put_many'
);

-- A producer that could record a webhook id would have the real, signed delivery of it
-- answered as a duplicate and dropped: only the receiver's role receives (0.4.2).
SELECT throws_ok(
    $$SELECT * FROM x_jobs.receive_webhook('t80-src', 't80-wh-1', 't80_hook', '{"a": 1}', 't80-h')$$,
    '42501',
    'permission denied for function receive_webhook',
    'A producer should not be able to receive a webhook (and so record an id ahead of its delivery)'
);

RESET ROLE;
SET ROLE t80_webhook;

SELECT results_eq(
    $$SELECT w.duplicate FROM x_jobs.receive_webhook('t80-src', 't80-wh-1', 't80_hook', '{"a": 1}', 't80-h') AS w
      UNION ALL
      SELECT w.duplicate FROM x_jobs.receive_webhook('t80-src', 't80-wh-1', 't80_hook', '{"a": 1}', 't80-h') AS w$$,
    ARRAY[FALSE, TRUE],
    'The receiver''s role should be able to receive a webhook, and its redelivery should be a duplicate'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.enqueue('t80_hook_direct')$$,
    '42501',
    'permission denied for function enqueue',
    'The receiver''s role should not be able to enqueue but through a webhook'
);

SELECT throws_ok(
    $$SELECT l.webhook_id FROM x_jobs.webhook_ledger AS l$$,
    '42501',
    'permission denied for table webhook_ledger',
    'The receiver''s role should not be able to read the webhook ledger'
);

RESET ROLE;
SET ROLE t80_admin;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.receive_webhook('t80-src', 't80-wh-3', 't80_hook')$$,
    '42501',
    'permission denied for function receive_webhook',
    'An admin should not be able to receive a webhook: x_jobs_admin is no member of x_jobs_webhook'
);

RESET ROLE;
SET ROLE t80_producer;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.relay_outbox('t80-r')$$,
    '42501',
    'permission denied for function relay_outbox',
    'A producer should not be able to relay the outbox'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.outbox_ack(ARRAY[1::bigint], 't80-r')$$,
    '42501',
    'permission denied for function outbox_ack',
    'A producer should not be able to acknowledge a message'
);

SELECT throws_ok(
    $$UPDATE x_jobs.outbox SET state = 'delivered' WHERE topic = 't80.topic'$$,
    '42501',
    'permission denied for table outbox',
    'A producer should not be able to settle messages by updating the outbox directly'
);

SELECT throws_ok(
    $$SELECT x_jobs.outbox_redrive(topic => 't80.topic')$$,
    '42501',
    'permission denied for function outbox_redrive',
    'A producer should not be able to redrive messages'
);

SELECT throws_ok(
    $$SELECT o.payload FROM x_jobs.outbox AS o$$,
    '42501',
    'permission denied for table outbox',
    'A producer should not be able to read the outbox (other producers'' payloads)'
);

SELECT throws_ok(
    $$INSERT INTO x_jobs.outbox (created_at, max_attempts, topic, payload, state, available_at)
      VALUES (now(), 1, 't80.topic', '{}', 'pending', now())$$,
    '42501',
    'permission denied for table outbox',
    'A producer should not be able to put a message past outbox_put''s checks'
);

SELECT throws_ok(
    $$SELECT l.webhook_id FROM x_jobs.webhook_ledger AS l$$,
    '42501',
    'permission denied for table webhook_ledger',
    'A producer should not be able to read the webhook ledger'
);

RESET ROLE;

SET ROLE t80_worker;

SELECT results_eq(
    $$SELECT r.payload, r.attempt FROM x_jobs.relay_outbox('t80-r', 10, topics => ARRAY['t80.topic']) AS r
      ORDER BY r.id$$,
    $$VALUES ('{"n": 1}'::jsonb, 1), ('{"n": 2}'::jsonb, 1), ('{"n": 3}'::jsonb, 1)$$,
    'A worker should be able to relay the outbox (claim the due messages)'
);

SELECT results_eq(
    $$SELECT *
      FROM x_jobs.outbox_ack(ARRAY(SELECT o.id FROM x_jobs.outbox AS o WHERE o.payload = '{"n": 1}'), 't80-r')$$,
    $$SELECT o.id FROM x_jobs.outbox AS o WHERE o.payload = '{"n": 1}'$$,
    'A worker should be able to acknowledge a message it holds'
);

SELECT results_eq(
    $$SELECT x_jobs.outbox_nack(o.id, 't80-r', 'refused', retryable => o.payload = '{"n": 3}')::text
      FROM x_jobs.outbox AS o WHERE o.payload IN ('{"n": 2}', '{"n": 3}') ORDER BY o.id$$,
    $$VALUES ('dead'), ('pending')$$,
    'A worker should be able to nack the messages it holds: for good (dead) or for a retry (pending)'
);

SELECT throws_ok(
    $$SELECT x_jobs.outbox_redrive(topic => 't80.topic')$$,
    '42501',
    'permission denied for function outbox_redrive',
    'A worker should not be able to redrive dead messages'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge_outbox('0 seconds')$$,
    '42501',
    'permission denied for function purge_outbox',
    'A worker should not be able to purge the outbox'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge_webhook_ledger('0 seconds')$$,
    '42501',
    'permission denied for function purge_webhook_ledger',
    'A worker should not be able to purge the webhook ledger'
);

SELECT throws_ok(
    $$DELETE FROM x_jobs.outbox WHERE topic = 't80.topic'$$,
    '42501',
    'permission denied for table outbox',
    'A worker should not be able to delete messages directly'
);

RESET ROLE;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';

SET ROLE t80_admin;

SELECT is(
    x_jobs.outbox_redrive(topic => 't80.topic'),
    1::bigint,
    'An admin should be able to redrive the dead message'
);

SELECT is(
    x_jobs.purge_outbox('0 seconds'),
    1::bigint,
    'An admin should be able to purge the delivered message'
);

SELECT is(
    x_jobs.purge_webhook_ledger('0 seconds'),
    1::bigint,
    'An admin should be able to purge the webhook ledger'
);

SELECT is(
    x_jobs.purge_events('0 seconds'),
    1::bigint,
    'An admin should be able to purge events (the t80.shipped event)'
);

RESET ROLE;

SELECT results_eq(
    $$SELECT o.payload, o.state::text, o.attempt FROM x_jobs.outbox AS o WHERE o.topic = 't80.topic' ORDER BY o.id$$,
    $$VALUES ('{"n": 2}'::jsonb, 'pending', 0), ('{"n": 3}'::jsonb, 'pending', 1)$$,
    'The admin''s calls should have taken effect: n=1 purged, n=2 redriven with all its attempts'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.webhook_ledger WHERE source = 't80-src'$$,
    'The admin''s purge_webhook_ledger should have deleted the ledger row'
);

SET ROLE t80_monitor;

SELECT throws_ok(
    'SELECT * FROM x_jobs.outbox',
    '42501',
    'permission denied for table outbox',
    'A pg_monitor member should not be able to read the outbox (its payloads)'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.webhook_ledger',
    '42501',
    'permission denied for table webhook_ledger',
    'A pg_monitor member should not be able to read the webhook ledger'
);

RESET ROLE;

SET ROLE t80_nobody;

SELECT throws_ok(
    $$SELECT x_jobs.outbox_put('t80.nobody', '{}')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to put a message'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.receive_webhook('t80-src', 't80-wh-2', 't80_nobody')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to receive a webhook'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.relay_outbox('t80-nobody')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to relay the outbox'
);

RESET ROLE;

SELECT is_empty(
    $$SELECT o.topic FROM x_jobs.outbox AS o WHERE o.topic = 't80.nobody'
      UNION ALL
      SELECT l.webhook_id FROM x_jobs.webhook_ledger AS l WHERE l.webhook_id = 't80-wh-2'
      UNION ALL
      SELECT k.name FROM x_jobs.job AS k WHERE k.name = 't80_nobody'$$,
    'The refused put and webhook should have written no message, ledger row or job'
);

------------------------------------------------------------------------------------------------
-- The health of the installation (0.4.0): workers (so admins) and monitors read it, producers
-- and logins without a grant do not; nobody runs the scripts' role helpers
------------------------------------------------------------------------------------------------

SET ROLE t80_worker;
SELECT is(
    (
        SELECT pg_catalog.count(*)::integer FROM x_jobs.health() AS h
        WHERE h.ok
    ),
    4,
    'A worker should be able to read health(), every check holding'
);
SELECT throws_ok(
    $$SELECT x_jobs._setup_roles()$$,
    '42501',
    'permission denied for function _setup_roles',
    'A worker should not be able to run the scripts'' role helper'
);
SELECT throws_ok(
    $$SELECT x_jobs._adopt()$$,
    '42501',
    'permission denied for function _adopt',
    'A worker should not be able to run the scripts'' ownership helper'
);
RESET ROLE;

SET ROLE t80_admin;
SELECT lives_ok(
    $$SELECT * FROM x_jobs.health()$$,
    'An admin should be able to read health()'
);
RESET ROLE;

SET ROLE t80_monitor;
SELECT lives_ok(
    $$SELECT * FROM x_jobs.health()$$,
    'pg_monitor should be able to read health()'
);
RESET ROLE;

SET ROLE t80_producer;
SELECT throws_ok(
    $$SELECT * FROM x_jobs.health()$$,
    '42501',
    'permission denied for function health',
    'A producer should not be able to read health()'
);
RESET ROLE;

SET ROLE t80_nobody;
SELECT throws_ok(
    $$SELECT * FROM x_jobs.health()$$,
    '42501',
    NULL,
    'A login without an x_jobs role should not be able to read health()'
);
RESET ROLE;

------------------------------------------------------------------------------------------------
-- Worker: a job that is deleted when it completes
------------------------------------------------------------------------------------------------

-- keep_done => false: completing the job deletes its row and its steps, which the worker role
-- may do (0.3.0). Last, so that its counters are in none of the counts above.
SET ROLE t80_producer;
SELECT x_jobs.enqueue('t80_unkept', queue => 't80-kd', keep_done => FALSE);
SET ROLE t80_worker;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t80-kd'], 't80-w3')),
    1,
    'A worker should be able to claim a keep_done => false job'
);

SELECT
    is(
        x_jobs.step_record(k.id, 't80-w3', 'first', '{"n": 1}'),
        'done'::x_jobs.step_status,
        'A worker should be able to record a step of the keep_done => false job'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_unkept';

SELECT
    is(
        x_jobs.complete(k.id, 't80-w3'),
        TRUE,
        'A worker should be able to complete a keep_done => false job, which deletes it'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_unkept';

RESET ROLE;

SELECT is_empty(
    $$SELECT FROM x_jobs.job WHERE name = 't80_unkept'
      UNION ALL
      SELECT FROM x_jobs.step WHERE job_id NOT IN (SELECT id FROM x_jobs.job)$$,
    'The worker role''s complete should have deleted the row and its steps'
);

------------------------------------------------------------------------------------------------
-- Declarations (0.4.0)
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:00:00+00';

SET ROLE t80_producer;

SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t80_d1')$$,
    '42501',
    'permission denied for function declare_job',
    'A producer should not be able to declare a job'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t80_d0', queue => 't80-d')$$,
    'A producer should be able to enqueue a job whose type nobody declared (enqueue reads the declarations as '
    'its owner)'
);

RESET ROLE;

SET ROLE t80_worker;

SELECT is(
    (
        SELECT d.max_attempts
        FROM x_jobs.declare_job('t80_d1', queue => 't80-d', max_attempts => 3, declared_by => 't80-w') AS d
    ),
    3,
    'A worker should be able to declare a job'
);

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.declare_jobs('[{"name": "t80_d2"}, {"name": "t80_d3"}]', 't80-w')),
    2,
    'A worker should be able to declare many jobs in one call'
);

SELECT results_eq(
    $$SELECT name, max_attempts, declared_by FROM x_jobs.job_types() WHERE name LIKE 't80_d%' ORDER BY name$$,
    $$VALUES ('t80_d1', 3, 't80-w'), ('t80_d2', NULL, 't80-w'), ('t80_d3', NULL, 't80-w')$$,
    'A worker should be able to read the declarations'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_type$$,
    '42501',
    'permission denied for table job_type',
    'A worker should not be able to read the declarations table itself'
);

SELECT throws_ok(
    $$UPDATE x_jobs.job_type SET max_attempts = 99$$,
    '42501',
    'permission denied for table job_type',
    'A worker should not be able to rewrite declarations but by declaring'
);

SELECT throws_ok(
    $$SELECT x_jobs.drop_job_type('t80_d1')$$,
    '42501',
    'permission denied for function drop_job_type',
    'A worker should not be able to forget a declaration'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t80_d1')$$,
    'A worker should be able to enqueue a job it declared'
);

SELECT results_eq(
    $$SELECT queue, max_attempts FROM x_jobs.job WHERE name = 't80_d1'$$,
    $$VALUES ('t80-d', 3)$$,
    'A worker''s enqueue should get the declared queue and max_attempts (enqueue reads them as its owner)'
);

SELECT results_eq(
    $$SELECT h.name, h.parked FROM x_jobs.hand_back(
          ARRAY(SELECT c.id FROM x_jobs.claim(ARRAY['t80-d'], 't80-wd', qty => 10) AS c WHERE c.name = 't80_d0'),
          't80-wd') AS h$$,
    $$VALUES ('t80_d0', TRUE)$$,
    'A worker should be able to hand back a job it claimed, parked when no worker serves it'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.hand_back(ARRAY(SELECT id FROM x_jobs.job WHERE claimed_by = 't80-wd'), 't80-other')$$,
    'A worker should not be able to hand back a job another worker holds'
);

SELECT is(
    (SELECT w.jobs FROM x_jobs.announce_worker('t80-wd2', ARRAY['t80-d'], jobs => ARRAY['t80_d0']) AS w),
    ARRAY['t80_d0'],
    'A worker should be able to announce the jobs it serves (which wakes their parked rows as the owner)'
);

RESET ROLE;

SELECT is(
    (
        SELECT state::text FROM x_jobs.job
        WHERE name = 't80_d0'
    ),
    'ready',
    'The worker''s announce should have made the parked row due'
);

SET ROLE t80_admin;

SELECT is(x_jobs.drop_job_type('t80_d3'), TRUE, 'An admin should be able to forget a declaration');

SELECT results_eq(
    $$SELECT name FROM x_jobs.job_type WHERE name LIKE 't80_d%' ORDER BY name$$,
    $$VALUES ('t80_d1'), ('t80_d2')$$,
    'An admin should be able to read the declarations table'
);

RESET ROLE;

SET ROLE t80_monitor;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_types()$$,
    '42501',
    'permission denied for function job_types',
    'A pg_monitor member should not be able to read the declarations'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- Readers (0.4.1): an admin reads a job, its errors and steps, the outbox and the counters; a
-- worker asks its jobs' states and what it holds; each runs as its caller.
------------------------------------------------------------------------------------------------

SET ROLE t80_admin;

SELECT lives_ok($$SELECT x_jobs.enqueue('t80_r1', queue => 't80-r')$$, 'An admin should be able to enqueue');

SELECT is(
    (SELECT d.name FROM x_jobs.job_detail((SELECT max(j.id) FROM x_jobs.list_jobs(name => 't80_r1') AS j)) AS d),
    't80_r1',
    'An admin should be able to read a job''s detail'
);

SELECT lives_ok(
    $$SELECT * FROM x_jobs.job_errors(1) UNION ALL SELECT * FROM x_jobs.job_errors(2)$$,
    'An admin should be able to read a job''s errors'
);

SELECT lives_ok($$SELECT * FROM x_jobs.job_steps(1)$$, 'An admin should be able to read a job''s steps');

SELECT lives_ok(
    $$SELECT * FROM x_jobs.list_outbox(max_rows => 5) UNION ALL SELECT * FROM x_jobs.outbox_message(1)$$,
    'An admin should be able to list the outbox and read one message'
);

SELECT lives_ok($$SELECT * FROM x_jobs.job_counters()$$, 'An admin should be able to read the counters');

RESET ROLE;

SET ROLE t80_worker;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.job_states(ARRAY[1, 2]::bigint[])),
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE id IN (1, 2)
    ),
    'A worker should be able to ask the states of jobs by id'
);

SELECT lives_ok($$SELECT * FROM x_jobs.held_jobs('t80-w')$$, 'A worker should be able to ask what it holds');

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_detail(1)$$,
    '42501',
    'permission denied for function job_detail',
    'A worker should not be able to read a job''s detail (its input), an operator''s read'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.list_outbox()$$,
    '42501',
    'permission denied for function list_outbox',
    'A worker should not be able to list the outbox, an operator''s read'
);

RESET ROLE;

SET ROLE t80_producer;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_states(ARRAY[1]::bigint[])$$,
    '42501',
    'permission denied for function job_states',
    'A producer should not be able to ask the states of jobs (it reads its own through result)'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_errors(1)$$,
    '42501',
    'permission denied for function job_errors',
    'A producer should not be able to read a job''s errors'
);

RESET ROLE;

SET ROLE t80_monitor;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.job_counters()$$,
    '42501',
    'permission denied for function job_counters',
    'A pg_monitor member should not be able to read the counters through job_counters'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.held_jobs('t80-w')$$,
    '42501',
    'permission denied for function held_jobs',
    'A pg_monitor member should not be able to ask what a worker holds'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- Schedules (0.4.2): anyone with a role previews a cron expression; a worker declares, lists and
-- ticks schedules through functions that run as their owner, with no right on the table; an
-- admin pauses, resumes, drops and runs them, as itself; PUBLIC reaches none of it
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:00:00+00';

SET ROLE t80_producer;

SELECT is(
    (SELECT f.fire_at FROM x_jobs.cron_next('*/5 * * * *', 'Europe/Berlin', '2030-01-01 14:01+00') AS f),
    '2030-01-01 14:05:00+00'::timestamptz,
    'A producer should be able to preview a cron expression'
);

SELECT throws_ok(
    $$SELECT x_jobs.set_schedule('t80_s0', 't80_s_job', '*/5 * * * *')$$,
    '42501',
    'permission denied for function set_schedule',
    'A producer should not be able to set a schedule'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.tick_schedules()$$,
    '42501',
    'permission denied for function tick_schedules',
    'A producer should not be able to tick the schedules'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.list_schedules()$$,
    '42501',
    'permission denied for function list_schedules',
    'A producer should not be able to list the schedules'
);

RESET ROLE;

SET ROLE t80_worker;

SELECT is(
    (SELECT s.next_fire_at FROM x_jobs.set_schedule('t80_s1', 't80_s_job', '*/5 * * * *', queue => 't80-s') AS s),
    '2030-01-01 14:05:00+00'::timestamptz,
    'A worker should be able to set a schedule (set_schedule runs as its owner)'
);

SELECT is(
    (SELECT s.declared_by FROM x_jobs.list_schedules('t80_s1') AS s),
    session_user::text,
    'A worker should be able to list the schedules, each declared by the login that set it'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.schedule$$,
    '42501',
    'permission denied for table schedule',
    'A worker should not be able to read the schedule table itself'
);

SELECT throws_ok(
    $$UPDATE x_jobs.schedule SET next_fire_at = now()$$,
    '42501',
    'permission denied for table schedule',
    'A worker should not be able to move a schedule but through its functions'
);

SELECT throws_ok(
    $$SELECT x_jobs.pause_schedule('t80_s1')$$,
    '42501',
    'permission denied for function pause_schedule',
    'A worker should not be able to pause a schedule'
);

SELECT throws_ok(
    $$SELECT x_jobs.resume_schedule('t80_s1')$$,
    '42501',
    'permission denied for function resume_schedule',
    'A worker should not be able to resume a schedule'
);

SELECT throws_ok(
    $$SELECT x_jobs.drop_schedule('t80_s1')$$,
    '42501',
    'permission denied for function drop_schedule',
    'A worker should not be able to drop a schedule'
);

SELECT throws_ok(
    $$SELECT x_jobs.run_schedule_now('t80_s1')$$,
    '42501',
    'permission denied for function run_schedule_now',
    'A worker should not be able to run a schedule by hand'
);

RESET ROLE;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:05:10+00';

SET ROLE t80_worker;

SELECT results_eq(
    $$SELECT schedules, enqueued, skipped FROM x_jobs.tick_schedules()$$,
    $$VALUES (1, 1, 0)$$,
    'A worker should be able to tick the schedules, which enqueues their jobs as the owner'
);

RESET ROLE;

SELECT is(
    (
        SELECT j.enqueued_by FROM x_jobs.job AS j
        WHERE j.name = 't80_s_job'
    ),
    'schedule:t80_s1',
    'The worker''s tick should have enqueued the schedule''s job'
);

SET ROLE t80_admin;

SELECT is(
    (SELECT s.paused FROM x_jobs.pause_schedule('t80_s1') AS s),
    TRUE,
    'An admin should be able to pause a schedule'
);

SELECT is(
    (SELECT s.paused FROM x_jobs.resume_schedule('t80_s1') AS s),
    FALSE,
    'An admin should be able to resume a schedule'
);

SELECT is(
    (SELECT r.deduped FROM x_jobs.run_schedule_now('t80_s1') AS r),
    FALSE,
    'An admin should be able to run a schedule by hand (it enqueues as the owner)'
);

SELECT results_eq(
    $$SELECT name, fires FROM x_jobs.schedule WHERE name = 't80_s1'$$,
    $$VALUES ('t80_s1', 2::bigint)$$,
    'An admin should be able to read the schedule table'
);

SELECT is(x_jobs.drop_schedule('t80_s1'), TRUE, 'An admin should be able to drop a schedule');

RESET ROLE;

SET ROLE t80_nobody;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.cron_next('* * * * *')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to preview a cron expression'
);

RESET ROLE;

SET ROLE t80_monitor;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.list_schedules()$$,
    '42501',
    'permission denied for function list_schedules',
    'A pg_monitor member should not be able to list the schedules (their inputs)'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.cron_next('* * * * *')$$,
    '42501',
    'permission denied for function cron_next',
    'A pg_monitor member should not be able to preview a cron expression'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- The test clock: only a superuser's session moves it
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-02 00:00:00+00';

-- SET ROLE leaves the login as it was: this file's superuser session still moves the clock.
SET ROLE t80_worker;

SELECT is(
    x_jobs.now(),
    '2030-01-02 00:00:00+00'::timestamptz,
    'A superuser''s session under SET ROLE should still read the test clock'
);

RESET ROLE;

-- A session that logged in as a worker cannot: the first call that reads the clock refuses.
SET SESSION AUTHORIZATION t80_worker;

SELECT throws_ok(
    $$SELECT x_jobs.now()$$,
    'XJ038',
    'X_CLOCK_REFUSED: x_jobs.fake_now is set to ''2030-01-02 00:00:00+00'', and role t80_worker may not move the clock',
    'A worker''s session should not be able to move the clock'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.claim(ARRAY['t80-q'], 't80-w4')$$,
    'XJ038',
    NULL,
    'A worker''s session with the test clock set should not be able to claim'
);

SELECT throws_ok(
    $$SELECT x_jobs._clock()$$,
    'XJ038',
    NULL,
    'A worker''s session should not be able to move the wall clock that dates steps and events'
);

SET LOCAL "x_jobs.fake_now" = '';

SELECT is(
    x_jobs.now(),
    pg_catalog.now(),
    'A worker''s session without the test clock should read the transaction''s start'
);

RESET SESSION AUTHORIZATION;

SELECT * FROM finish();
ROLLBACK;
