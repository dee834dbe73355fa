"""The app of tests/python/test_schedules_pg_cron.py: ``python -m x_jobs worker
apps.cron_echo:app``. Its one job answers what its schedule put in its input, and the pid of the
process that ran it, so that the test sees which run completed it and for which instant."""

from __future__ import annotations

import logging
import os
from typing import Any

import x_jobs

logger = logging.getLogger(__name__)

app = x_jobs.App()


@app.job(name="cron_echo")
def cron_echo(input: dict[str, Any], ctx: x_jobs.JobContext) -> dict[str, Any]:
    # The worker takes `_schedule` out of the input and hands it over as ctx.schedule.
    assert ctx.schedule is not None and "_schedule" not in input
    return {
        "greeting": input.get("greeting"),
        "at": ctx.schedule.at.isoformat(),
        "pid": os.getpid(),
    }
