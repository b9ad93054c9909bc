"""The one place that writes to the terminal: results on stdout, diagnostics on stderr."""

from __future__ import annotations

import os
import sys
import textwrap
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

#: Width of tables written to a file or pipe with no terminal anywhere (CI logs).
PIPE_WIDTH = 160


def _columns() -> int | None:
    """COLUMNS from the environment, when it is a positive number."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def terminal_width() -> int | None:
    """The width the person sees: COLUMNS when set, else the terminal's of stdout, stderr or stdin (a piped
    `bsa check ... | tee log` still has one on stderr), else None (no terminal: a CI log)."""
    columns = _columns()
    if columns is not None:
        return columns
    for stream in (sys.__stdout__, sys.__stderr__, sys.__stdin__):
        try:
            if stream is not None and stream.isatty():
                return os.get_terminal_size(stream.fileno()).columns or None
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _width(stream: TextIO) -> int | None:
    """The width of a console: the terminal's when it writes to one (rich reads COLUMNS too), else the width
    of a terminal this process still has (`terminal_width`), else PIPE_WIDTH."""
    if stream.isatty():
        return None
    return terminal_width() or PIPE_WIDTH


stdout = Console(highlight=False, width=_width(sys.stdout))
stderr = Console(stderr=True, highlight=False, width=_width(sys.stderr))


def width() -> int:
    """Return the width a table for stdout should fit now: COLUMNS when set (as rich reads it), else the
    terminal's, else PIPE_WIDTH."""
    columns = _columns()
    if columns is not None:
        return columns
    return stdout.width if stdout.is_terminal else terminal_width() or PIPE_WIDTH


#: Indent of a wrapped warning's further lines.
WARNING_INDENT = "  "


def warn(message: str) -> None:
    """Print a warning on stderr: wrapped at words to the width a person sees, further lines indented, never
    inside a word or path; one line where no terminal tells a width (a CI log)."""
    line = f"Warning: {message}"
    shown = terminal_width() if not stderr.is_terminal else stderr.width
    wrap: dict[str, Any] = {"subsequent_indent": WARNING_INDENT, "break_long_words": False, "break_on_hyphens": False}
    lines = [line] if shown is None else textwrap.wrap(line, shown, **wrap) or [line]
    text = "\n".join(escape(part) for part in lines)
    stderr.print("[yellow]Warning:[/yellow]" + text[len("Warning:") :], markup=True, soft_wrap=True)


def info(message: str) -> None:
    """Print a progress or information line on stderr."""
    stderr.print(message, markup=False, soft_wrap=True)
