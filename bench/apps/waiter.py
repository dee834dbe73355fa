"""The events benchmark's app: a run that waits for one event, then notes when it resumed."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

import x_jobs

app = x_jobs.App()

_local = threading.local()


@app.job(name="waiter", queue="bench")
def waiter(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
    """Suspends until `bench.go` with its key is published; the resumed run stamps the clock."""
    ctx.step.wait_for_event("go", "bench.go", key=str(input["key"]))
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None:
        conn = psycopg.connect(app.dsn, autocommit=True)
        _local.conn = conn
    conn.execute(
        "INSERT INTO public.resumed (key, at) VALUES (%s, pg_catalog.clock_timestamp())",
        [str(input["key"])],
    )
