"""The one place that writes to the terminal: results on stdout, diagnostics on stderr."""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 160
"""Width of tables written to a file or pipe (CI logs), where no terminal tells the width."""

stdout = Console(highlight=False, width=None if sys.stdout.isatty() else PIPE_WIDTH)
stderr = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else PIPE_WIDTH)


def warn(message: str) -> None:
    """Print a warning line on stderr."""
    stderr.print(f"[yellow]Warning:[/yellow] {message}", markup=True, soft_wrap=True)


def info(message: str) -> None:
    """Print a progress or information line on stderr."""
    stderr.print(message, markup=False, soft_wrap=True)
