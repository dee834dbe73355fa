------------------------------------------------------------------------------------------------
-- Ownership: after every object is made, before any grant (see x_jobs._adopt)
------------------------------------------------------------------------------------------------

SELECT x_jobs._adopt();

-- Tests: tests/pgtap/52-health.sql, tests/pgtap/80-privileges.sql,
--        tests/python/test_nonsuperuser_install.py, scripts/check-upgrade
