"""``python -m x_jobs``: the ``x-jobs`` command line."""

from x_jobs.cli import main

main()
