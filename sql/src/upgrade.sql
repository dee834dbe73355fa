\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.2'" to load this file. \quit

-- 0.4.1 -> 0.4.2: the claim's plans no longer depend on whether x_jobs.job has statistics
-- (no sequential or bitmap scans), so a worker that first claimed on an empty table keeps up;
-- the outbox relay's likewise.

--@function x_jobs.version
--@function x_jobs.claim
--@function x_jobs.relay_outbox

SELECT x_jobs._adopt();
