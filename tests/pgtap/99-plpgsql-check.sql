-- plpgsql_check lints every PL/pgSQL body of the extension against the real tables: wrong
-- columns, type mismatches, unused variables, dead code, bad enum literals. sqlfluff cannot: to
-- it a body is an opaque string.
BEGIN;
SELECT plan(3);

CREATE EXTENSION IF NOT EXISTS plpgsql_check;

SELECT isnt_empty(
    $$
    SELECT p.oid
    FROM pg_catalog.pg_proc AS p
    JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
    JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'x_jobs'
    JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
    $$,
    'The extension should have PL/pgSQL functions for plpgsql_check to read'
);

SELECT is_empty(
    $$
    SELECT p.oid::regprocedure::text AS fn, c.lineno, c.level, c.message, c.hint
    FROM pg_catalog.pg_proc AS p
    JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
    JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'x_jobs'
    JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
    CROSS JOIN LATERAL plpgsql_check_function_tb(p.oid, extra_warnings => true, performance_warnings => true) AS c
    $$,
    'plpgsql_check should find nothing in any PL/pgSQL function of the extension'
);

-- A fair queue's function (made by set_queue_policy, outside the extension's scripts) likewise,
-- but for the advice to mark it STABLE: its statement locks rows (FOR UPDATE), which a STABLE
-- function may not.
SELECT x_jobs.set_queue_policy('lint-fair', fair => TRUE);
SELECT is_empty(
    $$
    SELECT c.lineno, c.level, c.message, c.hint
    FROM plpgsql_check_function_tb(
        ('x_jobs.' || x_jobs._fair_function('lint-fair') || '(text, integer, timestamptz, text[], integer)')::regprocedure,
        extra_warnings => true, performance_warnings => true
    ) AS c
    WHERE c.message <> 'routine is marked as VOLATILE, should be STABLE'
    $$,
    'plpgsql_check should find nothing in a fair queue''s function'
);

SELECT * FROM finish();
ROLLBACK;
