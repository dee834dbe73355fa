\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.1'" to load this file. \quit

-- 0.4.0 -> 0.4.1: the SQL source laid out by concern (sql/src/, built by scripts/build-sql), its
-- comments keeping the invariant and the reason (their history moved to CHANGELOG.md); readers,
-- so that what a client reads of the tables it reads through functions of its own (a job's
-- detail, errors and steps, the jobs a worker holds and their states, the outbox listing and one
-- message, the settled counters) and the table layout is no client API.

-- The comments inside these bodies keep the reason, and no longer its history.
--@function x_jobs._enqueue
--@function x_jobs.claim
--@function x_jobs.complete_many
--@function x_jobs.relay_outbox

-- Readers: the type the outbox readers answer, then the functions, each granted to its role.
CREATE TYPE x_jobs.outbox_entry AS (
    id bigint,
    created_at timestamptz,
    max_attempts integer,
    topic text,
    key text, -- noqa: RF04
    headers jsonb,
    payload jsonb,
    state text,
    attempt integer,
    available_at timestamptz,
    relay text,
    delivered_at timestamptz,
    last_error text
);
--@function x_jobs.job_detail
--@function x_jobs.job_errors
--@function x_jobs.job_steps
--@function x_jobs.job_states
--@function x_jobs.held_jobs
--@function x_jobs.list_outbox
--@function x_jobs.outbox_message
--@function x_jobs.job_counters
REVOKE ALL ON FUNCTION x_jobs.job_detail(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_errors(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_steps(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_states(bigint[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs.held_jobs(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) FROM public;
REVOKE ALL ON FUNCTION x_jobs.outbox_message(bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.job_counters(timestamptz) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.job_detail(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_errors(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_steps(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.list_outbox(text, text, text, bigint, integer) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.outbox_message(bigint) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_counters(timestamptz) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.job_states(bigint[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.held_jobs(text) TO x_jobs_worker;

-- X_STATE_UNKNOWN (XJ016) is list_outbox's refusal of an unknown outbox state too.
--@function x_jobs.error_codes

--@function x_jobs.version

-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
SELECT x_jobs._adopt();
