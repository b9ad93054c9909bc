"""The one place that writes to the terminal: results on stdout, diagnostics on stderr."""

from __future__ import annotations

from rich.console import Console

stdout = Console(highlight=False)
stderr = Console(stderr=True, highlight=False)


def warn(message: str) -> None:
    """Print a warning line on stderr."""
    stderr.print(f"[yellow]Warning:[/yellow] {message}", markup=True, soft_wrap=True)


def info(message: str) -> None:
    """Print a progress or information line on stderr."""
    stderr.print(message, markup=False, soft_wrap=True)
