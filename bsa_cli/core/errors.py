"""Exception types of bsa; the CLI turns them into `Error: ...` lines and exit codes."""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


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


def filter_hint(patterns: Sequence[str], names: Sequence[str]) -> str:
    """Return what a `--filter` that matched none of `names` may have meant: the names it starts (a matrix
    appends its values: `smoke-bnsd-random` is `smoke-bnsd-random.fp16`, ...), else the closest ones; '' when
    none is close."""
    for pattern in patterns:
        longer = [name for name in names if name.startswith(f"{pattern}.")]
        if longer:
            shown = ", ".join(longer[:3]) + (", ..." if len(longer) > 3 else "")
            return f" (a matrix adds its values to a name: --filter '{pattern}*' takes {shown})"
    close = list(dict.fromkeys(c for p in patterns for c in difflib.get_close_matches(p, list(names), n=3, cutoff=0.6)))
    return f" (closest: {', '.join(close[:3])})" if close else ""


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """Return e.g. "1 case", "2 cases", "1 spec path", "0 cases" (`nouns`: an irregular plural)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def show(value: Any, width: int = 60) -> str:
    """Return a short repr of an untrusted value for an error message: one line, at most `width` characters.

    Nested and long values are cut (`reprlib`) before they are rendered, so a huge or self-referencing
    value costs no more than a short one.
    """
    shown = reprlib.Repr()
    shown.maxstring = shown.maxother = width
    shown.maxlist = shown.maxtuple = shown.maxdict = shown.maxset = 4
    shown.maxlevel = 3
    text = shown.repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


#: What untrusted text must not carry to a terminal or page: control characters (C0 but tab and newline,
#: DEL, C1: ESC sequences recolour or rewrite the terminal) and lone surrogates (no encoding can write them).
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """Return `text` with its `UNPRINTABLE` characters written as Python escapes (`\\x1b`, `\\ud800`)."""
    if not UNPRINTABLE.search(text):
        return text
    return UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def clip(value: Any, width: int = 200) -> str:
    """Return untrusted text as one printable line of at most `width` characters (whitespace folded, control
    characters escaped: `printable`); anything else as `show` renders it."""
    if not isinstance(value, str):
        return show(value, width)
    text = printable(" ".join(value[: width * 4].split()))
    return text if len(text) <= width else text[: width - 3] + "..."
