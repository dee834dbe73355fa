-- The x_jobs demo: a producer enqueues, a worker claims and settles, an operator looks on.
-- `make demo` runs it with psql on a throwaway server; any language that can run SQL can do
-- the same, and the Python worker (python/x_jobs) does exactly this in a loop.
\set ON_ERROR_STOP on
\pset footer off
SET client_min_messages = warning;
CREATE EXTENSION x_jobs;

\echo '== A producer enqueues: three e-mails, one of them twice under the same idempotency key'
SELECT * FROM x_jobs.enqueue(name => 'send_email', input => '{"to": "ada@example.com"}',
                             idempotency_key => 'welcome:ada');
SELECT * FROM x_jobs.enqueue(name => 'send_email', input => '{"to": "ada@example.com"}',
                             idempotency_key => 'welcome:ada');
SELECT * FROM x_jobs.enqueue_many('[
  {"name": "send_email", "input": {"to": "bob@example.com"}},
  {"name": "send_email", "input": {"to": "cy@example.com"}, "priority": -1},
  {"name": "resize_image", "queue": "media", "input": {"id": 7}, "run_at": "2999-01-01T00:00:00Z"}
]');

\echo '== Queue demand (what an autoscaler polls): due rows per queue'
SELECT * FROM x_jobs.queue_demand();

\echo '== A worker announces itself and claims up to 10 jobs of the default queue for 30 s'
SELECT id, draining_at FROM x_jobs.announce_worker(worker => 'demo-worker', queues => ARRAY['default']);
CREATE TEMP TABLE claimed AS
SELECT id, name, input, attempt, state
FROM x_jobs.claim(queues => ARRAY['default'], worker => 'demo-worker', lease => '30 seconds', qty => 10);
TABLE claimed;

\echo '== It completes two of them in one call, and one fails (it will be retried with backoff)'
SELECT x_jobs.complete_many(
    ids => (SELECT array_agg(id ORDER BY id) FROM (SELECT id FROM claimed ORDER BY id LIMIT 2) AS c),
    worker => 'demo-worker',
    outputs => ARRAY['{"sent": true}', '{"sent": true}']::jsonb[]
) AS completed;
SELECT x_jobs.fail(id => (SELECT max(id) FROM claimed), worker => 'demo-worker',
                   error => 'SMTP 451: try again later') AS state_after_failure;

\echo '== Another worker cannot settle a job it does not hold'
SELECT x_jobs.complete(id => (SELECT min(id) FROM claimed), worker => 'impostor') AS impostor_completed;

\echo '== A refusal: every error has a stable SQLSTATE, an X_ code and a hint'
\set ON_ERROR_STOP off
\set VERBOSITY verbose
SELECT * FROM x_jobs.claim(queues => ARRAY['default'], worker => 'demo-worker', qty => 0);
\set VERBOSITY default
\set ON_ERROR_STOP on

\echo '== The jobs now'
SELECT id, name, queue, state, attempt, priority, run_at > now() AS in_future, last_error
FROM x_jobs.list_jobs(max_rows => 100) ORDER BY id;

\echo '== Counters for this minute (what the settling statements added)'
SELECT job, completed, retried, dead FROM x_jobs.job_counters();
