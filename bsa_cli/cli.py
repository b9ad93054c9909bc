"""The `bsa` command line: the command group, built from the command modules.

Each command module defines click commands that parse options, call the library, turn its errors into
messages and render; `cli_common` holds what they share (exit codes, `UserError`). This module only
imports them and adds their commands to `main`: imports flow one way, from here down.
"""

from __future__ import annotations

import click

from . import __version__
from .cli_common import EXIT_INTERRUPTED, UserError
from .cli_compare import compare_command
from .cli_export import export_command
from .cli_gen import gen_command, list_command, validate_command
from .cli_run import check_command, emulate_command, run_command
from .cli_trend import trend_command


class _Commands(click.Group):
    """The command group: Ctrl-C in any command ends it with exit code 130 and one line on stderr; a file
    that cannot be read or written (a full disk, no permission) or memory running out end it with one
    `Error:` line and exit code 2, never a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted: finished work is complete, unfinished work was not written", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise UserError(f"{where}{exc.strerror or exc}") from None
        except MemoryError:
            raise UserError("out of memory; try fewer processes (-j), --filter or --shard") from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bsa")
def main() -> None:
    """Test data and verdicts for aclnnBlockSparseAttentionGrad."""


for _command in (validate_command, list_command, gen_command, run_command, emulate_command, check_command,
                 compare_command, export_command, trend_command):  # fmt: skip
    main.add_command(_command)
