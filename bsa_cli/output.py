"""The one place that writes to the terminal: results on stdout, diagnostics on stderr."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console

PIPE_WIDTH = 160
"""Width of tables written to a file or pipe (CI logs), where no terminal tells the width."""



def _width(stream: TextIO) -> int | None:
    """The width of tables: the terminal's (rich reads COLUMNS too), else COLUMNS, else PIPE_WIDTH."""
    if stream.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


stdout = Console(highlight=False, width=_width(sys.stdout))
stderr = Console(stderr=True, highlight=False, width=_width(sys.stderr))


def width() -> int:
    """Return the width a table for stdout should fit now: COLUMNS when set (as rich reads it), else the
    terminal's, else PIPE_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return stdout.width if stdout.is_terminal else PIPE_WIDTH


def warn(message: str) -> None:
    """Print a warning line on stderr."""
    stderr.print(f"[yellow]Warning:[/yellow] {message}", markup=True, soft_wrap=True)


def info(message: str) -> None:
    """Print a progress or information line on stderr."""
    stderr.print(message, markup=False, soft_wrap=True)
