\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.6'" to load this file. \quit

-- 0.3.5 -> 0.3.6: producers hold no rights on the tables. What every function takes is unchanged;
-- one is new.
--   * enqueue, enqueue_many, outbox_put, outbox_put_many and receive_webhook run as their owner
--     (SECURITY DEFINER), as publish did, and x_jobs_producer loses SELECT and INSERT on
--     x_jobs.job, x_jobs.outbox and x_jobs.webhook_ledger and USAGE on their sequences. A
--     producer could read every job's input and every message's payload (other tenants' too),
--     and insert rows that skip every check: a row already running under a forged claimed_by,
--     an input past the size limit.
--   * result(id): a job's state, output and last error, for a producer (the Python client's
--     App.result read the row).
--   * Workers keep what the functions they call as themselves need: SELECT on x_jobs.job and
--     x_jobs.outbox (they had it as producers); admins SELECT on x_jobs.webhook_ledger (for
--     purge_webhook_ledger). The helpers only owner-run functions call (_enqueue, _run_ids,
--     _notify, _require_message) are granted to no role; _max_payload_bytes moves to workers.

-- The version of the SQL API installed here. Clients check it before they speak to the database
-- (the Python worker refuses one it cannot speak to); it answers the same whether the schema came
-- from CREATE EXTENSION or from `x-jobs install` on a server that allows no extension files.
-- Each version's script (and upgrade script) replaces this function with its own number.
CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.3.6'::text
$$;

ALTER FUNCTION x_jobs.enqueue(
    text, jsonb, text, timestamptz, text, integer, integer, text, text, text, text, integer, boolean, interval,
    interval, boolean
) SECURITY DEFINER;
ALTER FUNCTION x_jobs.enqueue_many(jsonb) SECURITY DEFINER;
ALTER FUNCTION x_jobs.outbox_put(text, jsonb, text, jsonb, integer) SECURITY DEFINER;
ALTER FUNCTION x_jobs.outbox_put_many(jsonb) SECURITY DEFINER;
ALTER FUNCTION x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb) SECURITY DEFINER;

-- A job's outcome, as its producer may read it: state, output and last error, and nothing else of
-- the row (not its input). No row: no job has this id (never enqueued, purged after its
-- retention, or a keep_done => false job that completed).
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.result(id bigint)
RETURNS TABLE (state text, output jsonb, last_error text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.state::text, j.output, j.last_error FROM x_jobs.job AS j WHERE j.id = result.id
$$;

REVOKE ALL ON FUNCTION x_jobs.result(bigint) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.result(bigint) TO x_jobs_producer;

REVOKE SELECT, INSERT ON x_jobs.job, x_jobs.outbox, x_jobs.webhook_ledger FROM x_jobs_producer;
REVOKE USAGE ON SEQUENCE x_jobs.job_id_seq, x_jobs.outbox_id_seq FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._enqueue(x_jobs.enqueue_request[]) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._run_ids(integer) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._notify(text, text) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._require_message(text, jsonb, jsonb, integer) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._max_payload_bytes() FROM x_jobs_producer;

GRANT SELECT ON x_jobs.job, x_jobs.outbox TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._max_payload_bytes() TO x_jobs_worker;
GRANT SELECT ON x_jobs.webhook_ledger TO x_jobs_admin;
