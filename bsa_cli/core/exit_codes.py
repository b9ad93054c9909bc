"""The exit-code policy of every command, written once.

0 every case passed; 1 a case failed (a judgement, a nondeterministic rerun, a regression asked to fail);
2 a usage error or a bad spec or user file (raised before any case runs); 3 a case could not be judged
(missing outputs, a harness error, a case never run); 4 every case passed but a case's kernel is slower than
in the baseline report (`bsa compare --baseline` on timed runs); 130 interrupted by Ctrl-C (SIGTERM and SIGHUP end
with 128 + their number: 143 and 129).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a command's exit status says."""

    PASSED = 0
    FAILED = 1
    USAGE = 2
    UNJUDGED = 3
    SLOWER = 4
    INTERRUPTED = 130


def exit_code(*, unjudged: bool = False, failed: bool = False, slower: bool = False) -> ExitCode:
    """Return the exit code of a command's results: a case that could not be judged outranks a failure,
    which outranks a kernel time regression (`slower`), which outranks a pass."""
    if unjudged:
        return ExitCode.UNJUDGED
    if failed:
        return ExitCode.FAILED
    if slower:
        return ExitCode.SLOWER
    return ExitCode.PASSED


def signal_exit(signal_number: int) -> int:
    """Return the exit status of a command ended by a signal it handled (SIGTERM: 143, SIGHUP: 129)."""
    return 128 + signal_number
