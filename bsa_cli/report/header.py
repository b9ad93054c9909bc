"""What every report says before any case: when, which bsa, where, which device, which standard, how many."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from ..compare import SuiteResult


@dataclass(frozen=True)
class ReportHeader:
    """The circumstances of a report: written `date` by bsa `version` on `host`, about the cases in `out`."""

    date: str
    version: str
    host: str
    out: tuple[str, ...]


def report_header(
    suite: SuiteResult, out: Sequence[str | Path] = (), now: _dt.datetime | None = None, host: str | None = None
) -> ReportHeader:
    """Return the header of a report on `suite`.

    Args:
        out: the folders the cases were read from (default: the common folder of the case directories).
        now: the report's time (default: now, in UTC).
        host: the machine's name (default: this one's).
    """
    moment = (now or _dt.datetime.now(_dt.timezone.utc)).isoformat(timespec="seconds")
    folders = tuple(str(p) for p in out) or _common_folder([c.case_dir for c in suite.cases])
    return ReportHeader(moment, __version__, host or platform.node() or "-", folders)


def _common_folder(case_dirs: Sequence[str]) -> tuple[str, ...]:
    """Return the folder holding every case directory (none for a report without cases)."""
    parents = [str(Path(d).parent) for d in case_dirs if d]
    if not parents:
        return ()
    try:
        return (os.path.commonpath(parents),)
    except ValueError:  # relative and absolute paths mixed
        return tuple(dict.fromkeys(parents))
