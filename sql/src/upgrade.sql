\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.1'" to load this file. \quit

-- 0.4.0 -> 0.4.1: the SQL source laid out by concern (sql/src/, built by scripts/build-sql), its
-- comments keeping the invariant and the reason (their history moved to CHANGELOG.md). No change
-- of behaviour: the functions below are replaced for their comments and their version.

-- The comments inside these bodies keep the reason, and no longer its history.
--@function x_jobs._enqueue
--@function x_jobs.claim
--@function x_jobs.complete_many
--@function x_jobs.relay_outbox

--@function x_jobs.version

-- Ownership: keep this last. Every object this script or an earlier version made goes to
-- x_jobs_owner (see x_jobs._adopt), and its privileges are recorded anew for pg_dump.
SELECT x_jobs._adopt();
