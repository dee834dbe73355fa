\echo Use "CREATE EXTENSION x_jobs" to load this file. \quit

-- x_jobs: a durable job queue that lives inside PostgreSQL.
--
-- The objects. One table, x_jobs.job, holds every job from enqueue until it is purged; its
-- state says where it is (ready, delayed, suspended and running are live; done, failed, dead and
-- cancelled are terminal). Beside it: x_jobs.job_error (one row per failed attempt, for the
-- operator's `show`), x_jobs.queue_pause (queues held back), x_jobs.worker (who is serving and
-- who drains), x_jobs.queue_snapshot (the last count of the metrics gauges), x_jobs.counter (per
-- job name, per minute: how many settled and how), and for workflows x_jobs.step (what each run
-- did so far) and x_jobs.event (what was published); for messaging x_jobs.outbox (messages put in
-- application transactions, delivered by relays) and x_jobs.webhook_ledger (webhooks received, by
-- sender id); x_jobs.job_type holds what workers declare of each job (its enqueue defaults, its
-- timeout); x_jobs.schedule the cron schedules, each with the instant it fires next.
--
-- The flow.
--   enqueue / enqueue_many  insert rows, dedupe live idempotency keys, NOTIFY 'x_jobs' with the
--                           queue name for rows due now (a hint: workers also poll).
--   claim                   hands due rows and lapsed leases to a worker for `lease`, skipping
--                           locked rows, paused queues and full concurrency keys; a lapsed row
--                           on its final attempt is buried instead of handed out again.
--   extend_lease            the heartbeat of a running job; release hands jobs back (drain).
--   complete / fail         settle a row, only by the worker that holds it; fail retries with
--                           exponential backoff and jitter, or settles dead (or failed).
--   cancel / retry          the operator's: stop a live row, re-queue a finished one;
--   cancel_jobs / retry_jobs
--                           the same for every row that matches filters, in bounded batches;
--   list_jobs               and a keyset-paged listing.
--   queue_demand            what an autoscaler polls: the rows a serving worker must hold.
--   queue_gauges            the live rows per queue and state for metrics, counted at most once
--                           per max_age whoever asks (a snapshot in x_jobs.queue_snapshot).
--   declare_job / declare_jobs
--                           a worker records at its start what its jobs declare: enqueue fills
--                           what a request leaves out from there, for producers of any language.
--   hand_back               a worker gives back a job it has no handler for, the attempt not
--                           spent: delayed for a worker that serves it, else parked until one
--                           announces itself (announce_worker's jobs) or declares it.
--   steps / step_record     a run's memoized steps, replayed after a retry or a crash;
--   step_sleep / step_wait  suspend the run (no lease, no worker) until a time or an event;
--   publish / resolve_step  resolve waiting steps (an event, an operator) and make runs due.
--   outbox_put / relay_outbox / outbox_ack / outbox_nack / outbox_redrive
--                           the transactional outbox: put in the caller's transaction, relayed
--                           at least once, in order per key; receive_webhook: a webhook once.
--   purge / purge_events    retention: bounded deletes of old terminal rows (with their steps),
--   / purge_outbox          of old events and delivered messages;
--   / rollup_counters       folding of counters.
--   set_schedule / tick_schedules
--                           a cron expression in a time zone enqueues a job at each of its
--                           instants: any number of tickers (workers, pg_cron), no leader, each
--                           instant once (SKIP LOCKED, enqueue and advance in one transaction);
--                           missed instants are caught up by the schedule's policy.
--   health                  what an installation should fix: its roles, the owner of the
--                           functions that run as their owner, the restart grace's right.
--
-- Conventions. Every function pins search_path and names our objects x_jobs.*. Public parameter
-- names are an API (callers use named notation), so bodies declare `#variable_conflict
-- use_column` and refer to parameters as function.parameter. The clock is x_jobs.now(), which
-- a test can move with SET x_jobs.fake_now. Every refusal raises SQLSTATE XJnnn with a message
-- that starts with its X_ code and a HINT; x_jobs.error_codes() lists them all.

CREATE SCHEMA x_jobs;

COMMENT ON SCHEMA x_jobs IS 'x_jobs: durable job queue (see x_jobs.error_codes() for refusals)';

-- Tests: tests/pgtap/00-schema.sql, tests/pgtap/99-plpgsql-check.sql, scripts/check-upgrade,
--        tests/python/test_install.py, tests/python/test_build_sql.py
