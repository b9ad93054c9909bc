"""The `bsa` command line: parse options, call the library, turn its errors into messages, render.

Exit codes (one policy for every command):
    0  everything passed
    1  a case failed its comparison
    2  usage error, or a bad spec or file given by the user
    3  a case could not be judged (missing outputs, harness error)
  130  interrupted (Ctrl-C); what was finished is complete, nothing is left half-written
"""

from __future__ import annotations

import click

from . import __version__

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_UNJUDGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UserError(click.ClickException):
    """A user mistake (bad spec, bad file, bad option value): `Error: ...` on stderr, exit code 2."""

    exit_code = EXIT_USAGE


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


# Commands of the other modules register themselves on `main` when imported.
from . import cli_compare, cli_export, cli_gen, cli_run, cli_trend  # noqa: E402, F401
