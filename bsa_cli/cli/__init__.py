"""The `bsa` command line: the command group, built from the command modules.

One module per command group; each defines click commands that parse options, call the library, turn its
errors into `Error:` lines and render:

    gen.py       bsa validate, bsa list, bsa gen
    run.py       bsa run, bsa emulate, bsa check
    compare.py   bsa compare
    export.py    bsa export
    trend.py     bsa trend

Below them, what several commands share (they import these and the library, never each other):

    common.py    exit codes, `UserError`, `user_errors()`; cases from specs, folders of suites, report files
    options.py   click options defined once (--filter, -j, the device's, the reports', ...)
    progress.py  the progress display of gen, run and check
    output.py    the rich consoles: results on stdout, diagnostics on stderr

This module names the commands in `main` (and turns Ctrl-C, SIGTERM, SIGHUP, files that cannot be read or
written and memory running out into one line): imports flow one way, from here down. A command's module is
imported when that command runs, so each command loads what it uses and `bsa --help` loads none of them
(tests/cli/test_startup.py holds each command to its modules).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from .._version import __version__
from ..core.exit_codes import ExitCode, signal_exit

#: Signals handled as Ctrl-C is (and ended with exit code 128 + the signal's number: 143 for SIGTERM).
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: it unwinds as Ctrl-C does, so every command cleans up the same way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []


def _terminate(signum: int, _frame: Any) -> None:
    """Turn SIGTERM or SIGHUP into what Ctrl-C does: worker processes get SIGINT (a Ctrl-C at a terminal
    reaches them too), and this process unwinds with KeyboardInterrupt (device process groups are killed,
    half-written cases and reports removed)."""
    _received.append(signum)
    for child in multiprocessing.active_children():
        if child.pid is None:  # not started
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.pid, signal.SIGINT)
    raise Terminated(signum)


@contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    """While a command runs (in the main thread), SIGTERM and SIGHUP are handled as Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _terminate) for signum in TERMINATING}
    _received.clear()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupted_code() -> int:
    """130 after Ctrl-C; 128 + N after signal N (SIGTERM: 143)."""
    return signal_exit(_received[0]) if _received else ExitCode.INTERRUPTED


#: Each command: its module (of this package), its click command there, and its line in `bsa --help` (the
#: first sentence of its help; tests/cli/test_startup.py checks it): listing the commands imports none of them.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("run", "check_command", "Generate, run and compare in one command: the main job."),
    "compare": (
        "compare",
        "compare_command",
        "Judge the device's dq, dk, dv of every case under OUT (or merge shard reports with --merge).",
    ),
    "emulate": ("run", "emulate_command", "Act as a device binary on one case: the built-in reference device."),
    "export": (
        "export",
        "export_command",
        "Write each case under PATHS (folders written by `bsa gen`) as an msOpST, ATK or TTK test case.",
    ),
    "fuzz": (
        "fuzz",
        "fuzz_command",
        "Draw cases the operator accepts and check each on a device; shrink each failure to a repro.",
    ),
    "gen": (
        "gen",
        "gen_command",
        "Write inputs, golden and benchmark gradients and a manifest for every case of SPECS.",
    ),
    "list": (
        "gen",
        "list_command",
        "Show the expanded cases: shapes, density, FLOPs, bytes, estimated time and memory.",
    ),
    "run": ("run", "run_command", "Run a device (default: the reference device) on every case under CASES."),
    "trend": (
        "trend",
        "trend_command",
        "Draw each case's deciding ratio across the JSON reports REPORTS (written by `bsa compare --json`).",
    ),
    "validate": (
        "gen",
        "validate_command",
        "Check case specs and print how many cases they expand to, and which operator release they expect.",
    ),
}


class _Loaded(dict[str, click.Command]):
    """The group's commands: a command's module is imported when the command is first looked up (only then:
    each command loads what it uses)."""

    def __missing__(self, name: str) -> click.Command:
        if name not in COMMANDS:
            raise KeyError(name)
        module, attribute, _ = COMMANDS[name]
        command: click.Command = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
        self[name] = command
        return command


def _escape_unencodable() -> None:
    """Let stdout and stderr write what their encoding cannot as escapes (`\\udcff`: a folder name of non-UTF-8
    bytes; an ASCII terminal), never end a command with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(ValueError, OSError):  # a closed or detached stream
                stream.reconfigure(errors="backslashreplace")


class _Commands(click.Group):
    """The command group: Ctrl-C in any command ends it with exit code 130 and one line on stderr (SIGTERM
    and SIGHUP: the same handling, exit code 143 and 129); a file that cannot be read or written (a full
    disk, no permission) or memory running out end it with one `Error:` line and exit code 2, never a
    traceback."""

    def invoke(self, ctx: click.Context) -> object:
        _escape_unencodable()
        with _signals_as_interrupts():
            try:
                return self._invoke(ctx)
            except click.exceptions.Exit as exc:
                if exc.exit_code == ExitCode.INTERRUPTED and _received:
                    raise click.exceptions.Exit(_interrupted_code()) from None
                raise
            except KeyboardInterrupt:
                what = "interrupted" if not _received else f"terminated by {signal.Signals(_received[0]).name}"
                click.echo(f"{what}: finished work is complete, unfinished work was not written", err=True)
                raise click.exceptions.Exit(_interrupted_code()) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Loaded()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self.commands[cmd_name] if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with their lines of `COMMANDS`, cut as click cuts a command's help, importing none."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _invoke(self, ctx: click.Context) -> object:
        from .common import UserError  # here: `bsa --help` needs none of what common loads

        try:
            return super().invoke(ctx)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            raise UserError(f"{where}{exc.strerror or exc}") from None
        except MemoryError:
            raise UserError("out of memory; try fewer processes (-j), --filter or --shard") from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bsa")
def main() -> None:
    """Test data and verdicts for aclnnBlockSparseAttentionGrad."""
