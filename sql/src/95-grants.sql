------------------------------------------------------------------------------------------------
-- Grants
------------------------------------------------------------------------------------------------

-- Nothing is left to PUBLIC: new functions are executable by PUBLIC unless revoked.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA x_jobs FROM public;
REVOKE ALL ON ALL TABLES IN SCHEMA x_jobs FROM public;

GRANT USAGE ON SCHEMA x_jobs TO x_jobs_producer, pg_monitor;

-- Producers: enqueue and read a job's result. Those functions run as their owner (SECURITY
-- DEFINER), as do the outbox's and publish below, so a producer holds no right on any table: it
-- can neither read other jobs' inputs nor insert a row that skips enqueue's checks (one already
-- running, a forged claimed_by, an input past the size limit).
GRANT EXECUTE ON FUNCTION x_jobs.now() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._fake_now() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.error_codes() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.version() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.enqueue(
    text, jsonb, text, timestamptz, text, integer, integer, text, text, text, text, integer, boolean, interval,
    interval, boolean, text
) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.enqueue_many(jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.result(bigint) TO x_jobs_producer;

-- Workers: claim, heartbeat, settle, announce, read demand. These functions run as their owner,
-- so a worker writes no table but through them: it can settle only what it
-- claimed, and cannot rewrite or delete other rows. It reads the jobs (the Python worker asks
-- its jobs' states after a lost connection). The helpers below are granted for the admins'
-- functions, which run as the caller.
GRANT SELECT ON x_jobs.job TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._max_payload_bytes() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._max_payload_setting() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._payload_bytes(jsonb) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._minute(timestamptz) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_worker(text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_lease(interval, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._shard() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.claim(text[], text, interval, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.extend_lease(bigint[], text, interval, integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.release(bigint[], text, integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.complete(bigint, text, jsonb, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.complete_many(bigint[], text, jsonb[], integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.fail(bigint, text, text, text, interval, boolean, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.announce_worker(text, text[], text, boolean, interval, text[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.queue_demand() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.queue_gauges(interval, text[]) TO x_jobs_worker;
-- The tags a worker's or a relay's listener matches notifications against (notify_tags runs as
-- its owner: the secret is the owner's alone).
GRANT EXECUTE ON FUNCTION x_jobs.notify_tags(text, text[]) TO x_jobs_worker;

-- Admins: operate the queues and run retention. These functions run as the caller: an admin
-- holds the rights on the rows they change.
GRANT EXECUTE ON FUNCTION x_jobs.cancel(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.retry(bigint) TO x_jobs_admin;
-- The admins' functions that wake (retry, resume_queue, redrive, resolve_step) notify as their
-- caller: the tag of a name runs as its owner (the secret is the owner's alone).
GRANT EXECUTE ON FUNCTION x_jobs._notify_tag(text, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.list_jobs(text, text, bigint, integer, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._bulk_states(
    text, text, x_jobs.job_state[], x_jobs.job_state[], text, timestamptz, timestamptz, integer
) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.cancel_jobs(
    text, text, text, text, timestamptz, timestamptz, integer, boolean
) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.retry_jobs(
    text, text, text, text, timestamptz, timestamptz, integer, boolean
) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.queue_stats() TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.pause_queue(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.resume_queue(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.rollup_counters(interval, interval, interval) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge(interval, integer) TO x_jobs_admin;
GRANT UPDATE, DELETE ON x_jobs.job TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.job_error TO x_jobs_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON x_jobs.counter TO x_jobs_admin;
GRANT SELECT, INSERT, DELETE ON x_jobs.queue_pause TO x_jobs_admin;
GRANT SELECT ON x_jobs.worker TO x_jobs_admin;
-- The fence's bindings (x_jobs._fence): workers never touch them but through the functions
-- above; admins may read which login an id belongs to.
GRANT SELECT ON x_jobs.worker_login TO x_jobs_admin;

-- Monitoring: counts only (queue_demand and queue_gauges are SECURITY DEFINER, see above).
GRANT EXECUTE ON FUNCTION x_jobs.queue_demand(), x_jobs.queue_gauges(interval, text[]), x_jobs.now(), x_jobs.version()
TO pg_monitor;
-- Whoever may read the clock may reach its refusal (a monitor's session cannot move it).
GRANT EXECUTE ON FUNCTION x_jobs._fake_now() TO pg_monitor;

-- The health of the installation: to workers (which log it when they start), so admins, and
-- monitors. It reads catalogs only, as its caller, and so does the helper it calls. The role
-- helpers and _adopt are the scripts' own: nobody is granted them.
GRANT EXECUTE ON FUNCTION x_jobs.health(), x_jobs._role_problems() TO x_jobs_worker, pg_monitor;

-- Steps and events. A producer publishes; publish runs as its owner (see there).
GRANT EXECUTE ON FUNCTION x_jobs.publish(text, jsonb, text) TO x_jobs_producer;
-- Workers replay, record and suspend the steps of the runs they hold, through functions that
-- run as their owner: they hold no right on x_jobs.step or x_jobs.event.
GRANT EXECUTE ON FUNCTION x_jobs._clock() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_event(text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_held(bigint, text, text, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._suspend(bigint, timestamptz) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.steps(bigint, text, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_record(bigint, text, text, jsonb, text, boolean, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_sleep(bigint, text, text, interval, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_wait(
    bigint, text, text, text, text, jsonb, interval, timestamptz, integer
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.progress(bigint, text, double precision, double precision, text, integer)
TO x_jobs_worker;
-- Admins resolve steps by hand and purge old events (and the steps of purged jobs).
GRANT EXECUTE ON FUNCTION x_jobs.resolve_step(bigint, text, jsonb) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._require_retention(text, interval, integer, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge_events(interval, integer) TO x_jobs_admin;
GRANT SELECT, UPDATE, DELETE ON x_jobs.step TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.event TO x_jobs_admin;

-- The outbox. Producers put messages, through functions that run as their owner.
GRANT EXECUTE ON FUNCTION x_jobs.outbox_put(text, jsonb, text, jsonb, integer) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_put_many(jsonb) TO x_jobs_producer;
-- Webhooks are received (a ledger row and its job) by the receiver's login alone, through a
-- function that runs as its owner: a producer that could record an id would turn the real,
-- signed delivery of it into a dropped duplicate. x_jobs_webhook gets nothing else.
GRANT USAGE ON SCHEMA x_jobs TO x_jobs_webhook;
GRANT EXECUTE ON FUNCTION x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb) TO x_jobs_webhook;
-- Workers relay: they claim, deliver and settle messages.
GRANT EXECUTE ON FUNCTION x_jobs.relay_outbox(text, integer, interval, text[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_ack(bigint[], text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_extend_lease(bigint[], text, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_nack(bigint, text, text, timestamptz, boolean) TO x_jobs_worker;
GRANT SELECT ON x_jobs.outbox TO x_jobs_worker;
-- Admins redrive dead messages, purge delivered ones and old ledger rows.
GRANT EXECUTE ON FUNCTION x_jobs.outbox_redrive(bigint[], text, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge_outbox(interval, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.purge_webhook_ledger(interval, integer) TO x_jobs_admin;
GRANT UPDATE, DELETE ON x_jobs.outbox TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.webhook_ledger TO x_jobs_admin;

-- Declarations. Workers declare the jobs they run, read the declarations and hand back
-- the jobs they have no handler for, through functions that run as their owner. Admins forget a
-- declaration: drop_job_type runs as the admin, who holds what it deletes.
GRANT EXECUTE ON FUNCTION x_jobs.declare_job(
    text, text, integer, interval, interval, boolean, interval, integer, text, boolean, integer, text, text, text
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.declare_jobs(jsonb, text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.job_types() TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.hand_back(bigint[], text, interval, integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.drop_job_type(text) TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.job_type TO x_jobs_admin;

-- Schedules. Every x_jobs role may preview a cron expression (cron_next runs as its caller,
-- through the pure helpers granted with it). Workers declare their app's schedules, read them
-- and tick, through functions that run as their owner; pg_cron's job ticks as a login granted
-- x_jobs_worker. Admins pause, resume and drop schedules, as themselves, holding the rights on
-- the rows; run_schedule_now enqueues, as its owner.
GRANT EXECUTE ON FUNCTION x_jobs.cron_next(text, text, timestamptz, integer) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_parse(text) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_field(text, text, text, integer, integer, text[], text) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._require_time_zone(text) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_next(x_jobs.cron_fields, text, timestamptz) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_match_after(x_jobs.cron_fields, timestamp) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._zone_change(timestamptz, timestamptz) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.set_schedule(
    text, text, text, text, jsonb, text, text, integer, text, interval, integer, integer, text, text,
    integer, boolean, interval, interval, boolean, boolean, text, text
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.list_schedules(text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.tick_schedules(integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.drop_schedule(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.pause_schedule(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.resume_schedule(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.run_schedule_now(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._schedule_info(x_jobs.schedule) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._schedule_not_found(text) TO x_jobs_admin;
GRANT SELECT, UPDATE, DELETE ON x_jobs.schedule TO x_jobs_admin;

-- Rate limits. Workers declare their app's limits (an app's @app.job(rate_limit=...)) and
-- read them, through functions that run as their owner, as monitoring reads them; admins drop
-- one. None holds a right on x_jobs.rate_limit itself: every change goes through the checks.
GRANT EXECUTE ON FUNCTION x_jobs.set_rate_limit(text, integer, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.rate_limits() TO x_jobs_worker, pg_monitor;
GRANT EXECUTE ON FUNCTION x_jobs.drop_rate_limit(text) TO x_jobs_admin;
-- purge, which runs as the admin, deletes the rate limit rows of the jobs it deletes.
GRANT SELECT, DELETE ON x_jobs.job_rate TO x_jobs_admin;

-- The stream. Producers append in their own transactions; workers (consumers) read and keep
-- their cursors, through functions that run as their owner. None holds a right on the tables.
GRANT EXECUTE ON FUNCTION x_jobs.stream_append(text, text, jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.stream_append_many(text, jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.stream_read(text, text, integer, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.consumer_cursor(text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.save_cursor(text, text, jsonb) TO x_jobs_worker;

-- Fair queues. Workers and monitors read the policies, through a function that runs as its
-- owner; admins set them (which builds or drops an index, see set_queue_policy). None holds a
-- right on the policy tables: every change goes through the checks.
GRANT EXECUTE ON FUNCTION x_jobs.queue_policies() TO x_jobs_worker, pg_monitor;
GRANT EXECUTE ON FUNCTION x_jobs.set_queue_policy(text, boolean, jsonb) TO x_jobs_admin;

-- Readers. They run as their caller, who holds SELECT on what each reads: admins (through
-- x_jobs_worker, and their own grants on job_error, step and counter) read a job, its errors and
-- steps, the outbox and the counters; workers ask their jobs' states and what they hold.
GRANT EXECUTE ON FUNCTION x_jobs.job_detail(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_errors(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_steps(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_message(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_counters(timestamptz) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_states(bigint[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.held_jobs(text) TO x_jobs_worker;

-- Tenants. Every x_jobs role computes its own scope: the row-level security policies call
-- _tenant_scope as the role a statement runs as (it runs as its owner and answers the caller's
-- tenants only), and the admins' functions that run as their caller stamp, refuse and name the
-- caller through the helpers. Only admins bind, unbind and list bindings; nobody reads the
-- bindings' table but through them.
GRANT EXECUTE ON FUNCTION x_jobs._tenant_scope() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._caller() TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._stamp_tenant(text, text[]) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._refuse_cross_tenant(text, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.bind_tenant(name, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.unbind_tenant(name, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.tenant_bindings() TO x_jobs_admin;

-- Tests: tests/pgtap/80-privileges.sql, tests/pgtap/00-schema.sql,
--        tests/python/test_producer_role.py, tests/python/test_permission_denied.py
