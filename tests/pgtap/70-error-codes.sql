-- x_jobs.error_codes() is the catalogue of refusals that clients branch on: it must be complete
-- (every SQLSTATE and X_ code an x_jobs body raises is in it, paired as raised) and true (every
-- entry is raised somewhere), with unique codes and SQLSTATEs. The bodies are read from pg_proc.
BEGIN;
SELECT plan(10);

-- Every RAISE EXCEPTION of every x_jobs function, one row each: the text from that RAISE to the
-- next one (or the end of the body), the ERRCODE it names and the X_ code its MESSAGE starts with
-- (the message is either a literal or the format string of pg_catalog.format).
CREATE TEMP VIEW raised AS
SELECT
    r.fn,
    r.n,
    substring(r.chunk FROM $re$^\s+USING\s+ERRCODE\s*=\s*'([^']*)'$re$) AS sqlstate,
    substring(
        r.chunk
        FROM $re$^\s+USING\s+ERRCODE\s*=\s*'[^']*'\s*,\s*MESSAGE\s*=\s*$re$
        || $re$(?:pg_catalog\.format\(\s*)?'(X_[A-Z_]+):$re$
    ) AS code
FROM (
    SELECT
        p.oid::regprocedure::text AS fn,
        s.n,
        s.chunk
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL regexp_split_to_table(p.prosrc, 'RAISE\s+EXCEPTION') WITH ORDINALITY AS s (chunk, n)
    WHERE p.pronamespace = 'x_jobs'::regnamespace
) AS r
WHERE r.n > 1;

SELECT cmp_ok(
    (SELECT count(*)::integer FROM raised),
    '>=',
    30,
    'The bodies of the x_jobs functions should hold the RAISE statements this test reads'
);

SELECT is_empty(
    $$SELECT fn, n FROM raised WHERE sqlstate IS NULL OR code IS NULL$$,
    'Every RAISE EXCEPTION should be USING ERRCODE, then a MESSAGE that starts with an X_ code'
);

SELECT is_empty(
    $$SELECT m[1] AS sqlstate
      FROM pg_catalog.pg_proc AS p
      CROSS JOIN LATERAL regexp_matches(p.prosrc, $re$ERRCODE\s*=\s*'([^']*)'$re$, 'g') AS m
      WHERE p.pronamespace = 'x_jobs'::regnamespace
      EXCEPT
      SELECT sqlstate FROM x_jobs.error_codes()$$,
    'Every SQLSTATE in an ERRCODE of an x_jobs body should be in error_codes()'
);

SELECT is_empty(
    $$SELECT m[1] AS code
      FROM pg_catalog.pg_proc AS p
      CROSS JOIN LATERAL regexp_matches(p.prosrc, $re$'(X_[A-Z_]+):$re$, 'g') AS m
      WHERE p.pronamespace = 'x_jobs'::regnamespace
      EXCEPT
      SELECT code FROM x_jobs.error_codes()$$,
    'Every X_ code that starts a message in an x_jobs body should be in error_codes()'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM raised
      EXCEPT
      SELECT sqlstate, code FROM x_jobs.error_codes()$$,
    'Every RAISE should pair its SQLSTATE and X_ code as error_codes() does'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()
      EXCEPT
      SELECT sqlstate, code FROM raised$$,
    'Every entry of error_codes() should be raised, with its X_ code, by some x_jobs function'
);

SELECT is_empty(
    $$SELECT sqlstate FROM x_jobs.error_codes() GROUP BY sqlstate HAVING count(*) > 1$$,
    'No SQLSTATE should appear twice in error_codes()'
);

SELECT is_empty(
    $$SELECT code FROM x_jobs.error_codes() GROUP BY code HAVING count(*) > 1$$,
    'No X_ code should appear twice in error_codes()'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()
      WHERE sqlstate !~ '^[0-9A-Z]{5}$' OR code !~ '^X_[A-Z_]+$' OR coalesce(meaning, '') = ''$$,
    'Every entry of error_codes() should have a five-character SQLSTATE, an X_ code and a meaning'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()
      WHERE sqlstate LIKE 'XJ%' AND sqlstate !~ '^XJ[0-9]{3}$'$$,
    'The SQLSTATEs of our own class should be XJ followed by three digits'
);

SELECT * FROM finish();
ROLLBACK;
