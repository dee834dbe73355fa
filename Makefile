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
# sql/x_jobs--$(EXTVERSION).sql. Released versions are frozen as sql/x_jobs--A.sql and moved
# forward by sql/x_jobs--A--B.sql (see README, "Releasing"). `make` (PGXS's all) builds the
# script; the Python package ships it (python/x_jobs/sql is sql/), so an editable install of
# the package wants `make` run once before `x-jobs install`.
SQL_PARTS  = $(addprefix sql/src/,$(shell sed -n 's/^\([0-9][^ ]*\.sql\).*/\1/p' sql/src/MANIFEST))
DATA_built = sql/x_jobs--$(EXTVERSION).sql
DATA       = sql/x_jobs.control $(wildcard sql/x_jobs--*.control) \
             $(filter-out sql/x_jobs--$(EXTVERSION).sql,$(wildcard sql/x_jobs--*.sql))
EXTRA_CLEAN = sql/x_jobs--$(EXTVERSION).sql

VENV        ?= .venv
VENV_PYTHON  = $(VENV)/bin/python
SQL_SOURCES  = $(wildcard sql/src/*.sql) $(wildcard sql/x_jobs--*--*.sql)

.PHONY: demo demo-sql test bench deps lint check-all check-sql check-upgrade check-python check-released

# Build the newest version's full script from the editable source.
sql/x_jobs--$(EXTVERSION).sql: sql/src/MANIFEST $(SQL_PARTS) sql/x_jobs.control scripts/build-sql
	python3 scripts/build-sql

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
check-released check-sql check-upgrade check-python: sql/x_jobs--$(EXTVERSION).sql

# sqlfluff over the DDL, ruff and mypy over the Python.
lint:
	$(VENV)/bin/sqlfluff lint --disable-progress-bar $(SQL_SOURCES) tests/pgtap
	$(VENV)/bin/ruff check python tests/python bench demo
	$(VENV)/bin/ruff format --check python tests/python bench demo
	$(VENV)/bin/mypy

# A released version's script must never change: compare with the recorded checksums.
check-released:
	scripts/check-released

# The SQL contract: pgTAP files (plpgsql_check runs as one of them) in a fresh database.
check-sql:
	scripts/run-pgtap

# Oldest released version + every upgrade script = a fresh install of the newest.
check-upgrade:
	scripts/check-upgrade

# The Python client and the worker, on real connections.
check-python:
	$(VENV)/bin/pytest -q tests/python

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
