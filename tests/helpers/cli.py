"""`invoke`: `bsa ARGS` in process through click's CliRunner."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner, Result

from bsa_cli.cli import main


def invoke(*args: object, catch_exceptions: bool = True, **kwargs: Any) -> Result:
    """Run `bsa ARGS` in process (each argument through str) and return click's result, stdout and stderr apart."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=catch_exceptions, **kwargs)
