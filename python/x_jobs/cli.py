"""The ``x-jobs`` command line (also ``python -m x_jobs``)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from typing import Annotated, Any

import typer

from x_jobs.app import App
from x_jobs.errors import XJobsError

logger = logging.getLogger(__name__)

cli = typer.Typer(
    name="x-jobs",
    help="Operate x_jobs: run workers, enqueue, inspect and steer jobs and queues.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@cli.callback()
def _commands() -> None:
    """Operate x_jobs: run workers, enqueue, inspect and steer jobs and queues."""


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields."""

    _plain = frozenset(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._plain})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def load_app(target: str) -> App:
    """The App at MODULE:ATTRIBUTE (``myproject.jobs:app``)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(f"{target!r} is not MODULE:APP, such as myproject.jobs:app")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise typer.BadParameter(f"cannot import {module_name!r}: {err}") from err
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{target!r} is not an x_jobs.App (found {type(app).__name__})")
    return app


@cli.command()
def worker(
    app_path: Annotated[str, typer.Argument(metavar="MODULE:APP", help="Where the App lives.")],
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="A queue to serve (repeatable).")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Jobs run at once.")] = 10,
    lease: Annotated[float, typer.Option(help="Lease of a claimed job, seconds.")] = 30.0,
    poll: Annotated[float, typer.Option(help="Poll interval, seconds.")] = 1.0,
    grace: Annotated[float, typer.Option(help="Drain grace on SIGTERM, seconds.")] = 30.0,
    build: Annotated[str | None, typer.Option(help="Build id announced by the worker.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port.")
    ] = None,
    dsn: Annotated[str | None, typer.Option(help="Database; default DATABASE_URL or PG*.")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: Annotated[str, typer.Option(help="text or json.")] = "text",
) -> None:
    """Run a worker: claim, run and settle the jobs of MODULE:APP until SIGTERM or SIGINT."""
    from x_jobs.worker import Worker  # noqa: PLC0415 - the other commands do not need it

    setup_logging(log_level, log_format)
    app = load_app(app_path)
    if dsn is not None:
        app.dsn = dsn
    try:
        Worker(
            app,
            queues=queue or None,
            concurrency=concurrency,
            lease=lease,
            poll_interval=poll,
            grace=grace,
            build=build,
            metrics_port=metrics_port,
        ).run()
    except XJobsError as err:
        typer.echo(f"x-jobs: {err}", err=True)
        raise typer.Exit(2) from err


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
