"""Exception types of bsa; the CLI turns them into `Error: ...` lines and exit codes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


class BsaError(Exception):
    """Base of every error that is the user's to fix (bad spec, bad file), not a bug in bsa."""


@dataclass
class SpecError(BsaError):
    """A case spec breaks a rule: names the file, the case, the key, the value and what is allowed."""

    file: str
    message: str
    case: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.case is not None:
            where += f": case '{self.case}'"
        if self.key is not None:
            where += f": key '{self.key}'"
        return f"{where}: {self.message}"


@dataclass
class DataError(BsaError):
    """A generated or device file is missing, malformed, stale or of the wrong size."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def suggest(word: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
