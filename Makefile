# x_jobs: a PGXS extension (SQL only) plus its Python client, tests and benchmarks.
#
#   make demo     the demo on a throwaway server (installs what is missing first)
#   make test     every test on a throwaway server (installs what is missing first)
#   make bench    the benchmarks on a throwaway server with durable settings
#   make install  PGXS install of the control file and the versioned scripts
#
# The check-* targets (check-all runs them all) use whatever server PGHOST/PGPORT name;
# `make test` wraps them in scripts/throwaway-pg, and they re-run one suite by hand.

# The control file lives in sql/, so it is installed as DATA (PGXS's EXTENSION variable would
# look for it at the top); MODULEDIR puts everything in share/extension all the same.
MODULEDIR  = extension
EXTVERSION = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" sql/x_jobs.control)

# sql/src/ is the editable source of the newest version, in parts that sql/src/MANIFEST lists in
# order; scripts/build-sql (Python 3 standard library, no virtualenv) concatenates them into
# sql/x_jobs--$(EXTVERSION).sql. Released versions are reached from one frozen base,
# sql/x_jobs--0.1.0.sql, through the released sql/x_jobs--A--B.sql (CREATE EXTENSION ... VERSION
# follows the chain). The upgrade to the newest from the last release is written once, in
# sql/src/upgrade.sql (`-- A -> B:` header, what is not a function, a `--@function x_jobs.NAME`
# line per changed function); the build expands it into sql/x_jobs--A--B.sql and fails when a
# function changed in sql/src is not named there. `make release` freezes it (docs/releasing.md).
# `make` (PGXS's all) builds both; the Python package ships them (python/x_jobs/sql
# is sql/), so an editable install of the package wants `make` run once before `x-jobs install`.
SQL_PARTS    = $(addprefix sql/src/,$(shell sed -n 's/^\([0-9][^ ]*\.sql\).*/\1/p' sql/src/MANIFEST))
OPEN_FROM    = $(shell sed -n 's/^-- \([^ ]*\) -> $(EXTVERSION):.*/\1/p' sql/src/upgrade.sql)
OPEN_UPGRADE = $(if $(OPEN_FROM),sql/x_jobs--$(OPEN_FROM)--$(EXTVERSION).sql)
BUILT_SQL    = sql/x_jobs--$(EXTVERSION).sql $(OPEN_UPGRADE)
DATA_built   = $(BUILT_SQL)
DATA         = sql/x_jobs.control $(wildcard sql/x_jobs--*.control) \
               $(filter-out $(BUILT_SQL),$(wildcard sql/x_jobs--*.sql))
EXTRA_CLEAN  = $(BUILT_SQL)

VENV        ?= .venv
VENV_PYTHON  = $(VENV)/bin/python
SQL_SOURCES  = $(wildcard sql/src/*.sql) $(wildcard sql/x_jobs--*--*.sql)

.PHONY: demo demo-sql test bench deps lint release check-all check-sql check-upgrade check-python check-released

# Build the newest version's full script and the open upgrade script from the editable source
# (one run writes both).
sql/x_jobs--$(EXTVERSION).sql: sql/src/MANIFEST $(SQL_PARTS) sql/src/upgrade.sql sql/x_jobs.control \
                               sql/RELEASED scripts/build-sql
	python3 scripts/build-sql
ifneq ($(OPEN_UPGRADE),)
$(OPEN_UPGRADE): sql/x_jobs--$(EXTVERSION).sql
	@test -f $@ || python3 scripts/build-sql
endif

# Freeze the open upgrade as released (run by the lead when the version lands; docs/releasing.md).
release:
	python3 scripts/build-sql release

# Install what is missing: Debian packages (pgTAP, plpgsql_check) and the virtualenv.
deps:
	scripts/ensure-deps

# The demo: a throwaway server, 10,000 jobs, a worker with a progress bar, a summary.
demo: deps
	scripts/throwaway-pg -- $(VENV_PYTHON) demo/demo.py

# The SQL tour: the same flow as plain SQL in psql, for any language.
demo-sql: deps
	scripts/throwaway-pg -- psql -X -q -f demo/sql_tour.sql

# Every test, on a throwaway server that is removed afterwards.
test: deps
	scripts/throwaway-pg -- $(MAKE) --no-print-directory check-all

# Benchmarks, on a throwaway server with fsync and synchronous_commit on.
bench: deps
	scripts/throwaway-pg --durable -- $(VENV_PYTHON) bench/bench.py

# All suites against the server in PGHOST; stops at the first that fails. Each suite installs
# or reads the built script, so each depends on it.
check-all: lint check-released check-sql check-upgrade check-python
check-released check-sql check-upgrade check-python: $(BUILT_SQL)

# sqlfluff over the DDL, ruff and mypy over the Python.
lint:
	$(VENV)/bin/sqlfluff lint --disable-progress-bar $(SQL_SOURCES) tests/pgtap
	$(VENV)/bin/ruff check python tests/python bench demo scripts/build-sql
	$(VENV)/bin/ruff format --check python tests/python bench demo scripts/build-sql
	$(VENV)/bin/mypy

# A released version's script must never change: compare with the recorded checksums.
check-released:
	scripts/check-released

# The SQL contract: pgTAP files (plpgsql_check runs as one of them) in a fresh database.
check-sql:
	scripts/run-pgtap

# Every released version, updated to the newest, = a fresh install of the newest.
check-upgrade:
	scripts/check-upgrade

# The Python client and the worker, on real connections. The files are shared out among
# PYTEST_WORKERS processes (pytest-xdist, a whole file each at a time), each with a server of its
# own (scripts/pg-python): the tests mostly wait (on workers, leases, restarts), so they overlap
# well even on two cores. PYTEST_WORKERS=0 runs them in this process, on PGHOST's server.
PYTEST_WORKERS ?= 2
check-python:
ifeq ($(PYTEST_WORKERS),0)
	$(VENV)/bin/pytest -q tests/python
else
	X_JOBS_PYTHON=$(abspath $(VENV_PYTHON)) $(VENV)/bin/pytest -q --dist loadfile \
	  --tx $(PYTEST_WORKERS)*popen//python=scripts/pg-python tests/python
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
