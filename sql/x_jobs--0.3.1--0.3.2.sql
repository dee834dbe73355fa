\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.2'" to load this file. \quit

-- 0.3.1 -> 0.3.2: what every function takes and answers is unchanged.
--   * complete_many, extend_lease and release are planned once, for a batch of any size: a
--     seek per id. Planned for the batch at hand, with statistics that saw few running rows,
--     they read the whole table whenever the batch was a tenth of it or so (complete_many of
--     500 in a table of 20,000 rows: 52-57 ms against 7), so settling cost as much as the
--     table was big. Their bodies are unchanged.

ALTER FUNCTION x_jobs.extend_lease(bigint[], text, interval) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION x_jobs.release(bigint[], text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION x_jobs.complete_many(bigint[], text, jsonb[]) SET plan_cache_mode = force_generic_plan;

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
    SELECT '0.3.2'::text
$$;
