"""Two builds of one service, for the rolling-deploy tests: ``old`` has no handler for
``deploy.report``, which ``new`` adds (``python -m x_jobs worker apps.deploy:old`` beside
``apps.deploy:new``). Both run ``deploy.ping``. Every run is recorded in run_log (apps.basic)."""

from __future__ import annotations

import logging
from typing import Any

import x_jobs
from apps.basic import Run

logger = logging.getLogger(__name__)

old = x_jobs.App()
new = x_jobs.App()


def _ping(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        pass


for _app in (old, new):
    _app.job(name="deploy.ping", queue="deploy")(_ping)


@new.job(
    name="deploy.report",
    queue="deploy",
    max_attempts=3,
    retry=x_jobs.Retry(base=0.05, max=0.05),
    timeout=60,
)
def report(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    with Run(ctx):
        pass
