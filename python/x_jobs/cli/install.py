"""``x-jobs install``: x_jobs installed or upgraded without CREATE EXTENSION
(:mod:`x_jobs.install`).
"""

from __future__ import annotations

import logging

from x_jobs import install as installer
from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn
from x_jobs.cli._output import Output

logger = logging.getLogger(__name__)


def install_command(dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Install or upgrade x_jobs where CREATE EXTENSION cannot be used (managed services).

    Runs the extension's own versioned scripts as plain SQL, in one transaction: the full script
    when nothing is installed, the upgrade scripts from the installed x_jobs.version() on, or
    nothing when the newest is installed. Refuses a database that has the extension, and a
    caller that may not create the x_jobs roles (with what an administrator runs first). Prints
    what x_jobs.health() finds wrong afterwards.
    """
    out = Output(as_json)
    with database(dsn, out, check_version=False) as conn:
        done = installer.install(conn)
    if not done.changed:
        said = f"x_jobs {done.after} is installed and current; nothing changed"
    elif done.before is None:
        said = f"installed x_jobs {done.after} ({', '.join(done.scripts)})"
    else:
        said = f"upgraded x_jobs {done.before} -> {done.after} ({', '.join(done.scripts)})"
    # What x_jobs.health() finds wrong (a right an administrator should still grant): after
    # the outcome, a check's finding and its fix each on a line of their own.
    unhealthy: list[str] = []
    for check in done.failing:
        unhealthy.append(f"warning: {check.check_name}: {check.detail}")
        if check.hint:
            unhealthy.append(f"hint: {check.hint}")
    out.emit(
        {
            "before": done.before,
            "after": done.after,
            "scripts": list(done.scripts),
            "changed": done.changed,
            "failing": [
                {"check": check.check_name, "detail": check.detail, "hint": check.hint}
                for check in done.failing
            ],
        },
        said,
        *unhealthy,
    )
