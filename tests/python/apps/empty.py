"""An App that declares no job (and no outbox sink): ``x-jobs worker apps.empty:app`` has no
queue to serve unless --queue names one."""

from __future__ import annotations

import x_jobs

app = x_jobs.App()
