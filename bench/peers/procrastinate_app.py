"""The procrastinate App and its no-op task for run_procrastinate.py.

In a module of its own, not in the script that runs, as procrastinate's docs ask ("top-level
app"), so that the runner and its worker processes import one and the same App.
"""

from __future__ import annotations

from procrastinate import App, PsycopgConnector

DBNAME = "x_jobs_peer_procrastinate"

app = App(connector=PsycopgConnector(conninfo=f"dbname={DBNAME}"))


@app.task(name="noop")
async def noop(n: int) -> None:
    return None
