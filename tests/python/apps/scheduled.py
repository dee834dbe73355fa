"""Two builds of an app with schedules, for the sync tests (``x-jobs schedules sync
apps.scheduled:v1``, then ``:v2 --prune``) and a worker process run with ``--no-tick``.

v1 declares ``report`` on two schedules (one through ``@app.job(schedule=...)``, named as the
job, and ``report-evening`` through ``app.schedule``) and ``ping``, an ordinary job. v2 keeps
``report`` on its first schedule, with a new time, and no longer declares ``report-evening``.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

import x_jobs

logger = logging.getLogger(__name__)


class Report(BaseModel):
    region: str = "all"


v1 = x_jobs.App()
v2 = x_jobs.App()


@v1.job(name="report", queue="reports", schedule=x_jobs.Cron("0 9 * * MON-FRI", tz="Europe/Berlin"))
def report_v1(input: Report, ctx: x_jobs.JobContext) -> None:
    pass


v1.schedule("report-evening", "report", "0 18 * * *", tz="Europe/Berlin", input={"region": "eu"})


@v1.job(name="ping", queue="reports")
def ping(input: dict[str, Any]) -> None:
    pass


@v2.job(
    name="report", queue="reports", schedule=x_jobs.Cron("30 9 * * MON-FRI", tz="Europe/Berlin")
)
def report_v2(input: Report, ctx: x_jobs.JobContext) -> None:
    pass
