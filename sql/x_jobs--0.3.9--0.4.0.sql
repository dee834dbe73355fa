\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.0'" to load this file. \quit

-- 0.3.9 -> 0.4.0: what real deployments need (issue 19): poolers, installs without a superuser,
-- failover, metrics, bulk operations and declarations in the database.

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.0'::text
$$;
