"""The root group of ``x-jobs``: with ``--json`` among the arguments, a usage error ends as
every other error of a --json command does.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from typer.core import TyperGroup

from x_jobs.cli._output import EXIT_USAGE, Output

try:  # typer 0.2x parses with a copy of click of its own
    from typer._click.core import Context as ClickContext
    from typer._click.exceptions import UsageError
except ImportError:  # older typers use click itself
    from click import Context as ClickContext  # type: ignore[assignment]
    from click import UsageError  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: Where _Commands notes whether --json is among the arguments (ctx.meta is shared by every
#: context of one run).
WANTS_JSON = "x_jobs.wants_json"


def _wants_json(args: list[str]) -> bool:
    """Whether ``--json`` is among the arguments (before a ``--``, after which none is an
    option)."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


class _Commands(TyperGroup):
    """The ``x-jobs`` group. With --json among the arguments, a usage error (a bad or missing
    option, an unknown command, a BadParameter a command raises) ends as every other error of
    a --json command does: one line and a hint on stderr, ``{"error": {...}}`` with code
    X_USAGE on stdout, exit 2; not click's box alone on stderr. Click raises those errors while
    it parses (make_context) and, for subcommands, inside the group's invoke: both pass here.
    """

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: ClickContext | None = None,
        **extra: Any,
    ) -> ClickContext:
        wants_json = _wants_json(args)
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except UsageError as err:
            if wants_json:
                _usage_failed(err)
            raise
        ctx.meta[WANTS_JSON] = wants_json
        return ctx

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            if ctx.meta.get(WANTS_JSON):
                _usage_failed(err)
            raise


def _usage_failed(err: UsageError) -> NoReturn:
    hint = None
    if err.ctx is not None:
        hint = f"Try '{err.ctx.command_path} {err.ctx.help_option_names[0]}' for help."
    Output(as_json=True).fail(EXIT_USAGE, err.format_message(), hint, code="X_USAGE")
