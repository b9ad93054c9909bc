"""Reading what bsa did not write: JSON without duplicate keys and of bounded cost, status lines, paths
confined to their folder (no absolute path, no `..`, no symbolic link leading out), regular files of bounded
size, case names that are one visible folder name.

Case folders, device outputs and reports travel between machines and teams, so everything read from them
is untrusted; `store` (case directories) and the report readers go through here.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import DataError
from .errors import printable as _printable
from .errors import show as _show

#: Longest case (folder) name: the file system's 255 bytes less room for bsa's temporary names around it.
MAX_NAME_BYTES = 200

# ---- JSON and status lines read from untrusted files ----------------------------------------------------


class DuplicateKeyError(ValueError):
    """A JSON object holds one key twice (readers disagree on which one counts: bsa refuses it)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKeyError(f"duplicate key {_show(key, 60)}: a JSON object names each key once")
        result[key] = value
    return result


#: Fewest bytes of JSON text per object or array bsa parses: a Python dict costs 64 bytes or more, so
#: `[{}, {}, ...]` would cost 20 times its size to read; bsa's own files carry a hundred bytes or more per
#: object. The bound keeps what a JSON file costs in memory within a few times its size.
JSON_BYTES_PER_CONTAINER = 16


def load_json(data: bytes | str) -> Any:
    """Parse untrusted JSON: refuse duplicate keys in any object, and text that holds more objects and
    arrays than one per JSON_BYTES_PER_CONTAINER bytes (counted before parsing, so a file of `{}`s costs
    no more than its size to refuse).

    Raises:
        ValueError: not JSON (JSONDecodeError, UnicodeDecodeError), a duplicate key (DuplicateKeyError),
            too many containers for its size, or nested too deeply (RecursionError becomes ValueError).
    """
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > 64 and containers * JSON_BYTES_PER_CONTAINER > len(raw):
        raise ValueError(
            f"{containers} objects and arrays in {len(raw)} bytes: more than one per "
            f"{JSON_BYTES_PER_CONTAINER} bytes, which no file of bsa holds"
        )
    try:
        value = json.loads(raw, object_pairs_hook=_no_duplicates)
        return _printable_strings(value) if MAY_BE_UNPRINTABLE.search(raw) else value
    except RecursionError:
        raise ValueError("nested too deeply") from None


#: JSON text that may hold an `errors.UNPRINTABLE` character in a string: its escape (`\u001b`, `\r`,
#: `\ud800`), a raw DEL or a raw C1 character. Most files hold none, and cost no walk over their strings.
MAY_BE_UNPRINTABLE = re.compile(
    rb"\\u00[0-1][0-9a-fA-F]|\\u00[7-9][0-9a-fA-F]|\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\\[bfr]|\x7f|\xc2[\x80-\x9f]"
)


def _printable_strings(value: Any) -> Any:
    """Return parsed JSON with every string (keys too) `errors.printable`: whatever a case folder or report
    holds, what bsa shows or writes of it carries no control character and encodes (no lone surrogate)."""
    if isinstance(value, str):
        return _printable(value)
    if isinstance(value, list):
        return [_printable_strings(v) for v in value]
    if isinstance(value, dict):
        return {_printable(k): _printable_strings(v) for k, v in value.items()}
    return value


#: A status line: a decimal integer in ASCII digits (no '_', '+', spaces or other scripts' digits).
STATUS_DIGITS = re.compile(r"-?[0-9]{1,19}")


def parse_status(first_line: str) -> int:
    """Return the aclnn status of a status.txt first line (surrounding ASCII blanks allowed).

    Raises:
        ValueError: not a decimal integer of ASCII digits in the int64 range.
    """
    text = first_line.strip(" \t\r\n")
    if not STATUS_DIGITS.fullmatch(text):
        raise ValueError(f"{text!r} is not a decimal integer")
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{text!r} is beyond int64")
    return value


# ---- paths confined to their folder ------------------------------------------------------------------


def check_relative(relative: Any, what: str) -> str:
    """Return `relative` if it is a plain relative file path that cannot climb out of its folder.

    Raises:
        DataError: it is not a non-empty string, is absolute, holds a `..` part or a NUL, or names the
            folder itself. The message names `what` (such as `outputs.dq.file`).
    """
    if not isinstance(relative, str) or not relative.strip():
        raise DataError(what, f"{_show(relative)} is not a file name")
    pure = PurePosixPath(relative)
    problem = None
    if "\0" in relative:
        problem = "holds a NUL character"
    elif pure.is_absolute() or relative.startswith("\\") or re.match(r"^[A-Za-z]:", relative):
        problem = "is an absolute path"
    elif ".." in pure.parts:
        problem = "climbs out of its folder with '..'"
    elif not pure.parts or pure.parts == (".",):
        problem = "names the folder itself, not a file in it"
    if problem:
        raise DataError(what, f"{_show(relative)} {problem}; files are relative paths inside their folder")
    return relative


def inside(base: Path, relative: str, what: str | None = None) -> Path:
    """Return `base / relative` after checking that it stays inside `base`, symbolic links followed.

    Raises:
        DataError: `relative` is not a plain relative path (`check_relative`), or a symbolic link on the
            way leads out of `base` (or back to `base` itself).
    """
    base = Path(base)
    check_relative(relative, what or str(base / str(relative)))
    path = base / relative
    try:
        real_base = base.resolve()
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise DataError(str(path), f"cannot be resolved: {exc}") from None
    if real == real_base or not real.is_relative_to(real_base):
        raise DataError(
            str(path), f"leads out of {base} through a symbolic link; bsa reads and writes only inside the folder"
        )
    return path


def inside_parent(base: Path, relative: str, what: str | None = None) -> Path:
    """Return `base / relative` after checking that its folder lies inside `base` (links followed); the
    last part itself may be anything, a link leading anywhere included: for removing or replacing it
    (which never follows it), not for reading through it.

    Raises:
        DataError: as `inside`, for the folder that holds the file.
    """
    base = Path(base)
    check_relative(relative, what or str(base / str(relative)))
    path = base / relative
    parent = PurePosixPath(relative).parent
    if str(parent) != ".":
        inside(base, str(parent), what)
    return path


def entry_path(directory: Path, entry: Mapping[str, Any]) -> Path:
    """Return the path of a manifest entry's file inside `directory` (see `inside`)."""
    if not isinstance(entry, Mapping):
        raise DataError(str(directory), f"manifest entry {_show(entry)} is not a mapping with a 'file'")
    file = check_relative(entry.get("file"), str(Path(directory) / str(entry.get("file"))))
    return inside(directory, file)


def read_regular(path: Path, limit: int, *, truncate: bool = False) -> bytes:
    """Read a regular file of at most `limit` bytes (with `truncate`: its first `limit` bytes).

    A FIFO, device or folder is refused without being opened for reading in a way that could block.

    Raises:
        DataError: the file is missing, not a regular file, larger than `limit` (without `truncate`) or
            cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise DataError(str(path), "missing") from None
    except OSError as exc:
        raise DataError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DataError(str(path), "is not a regular file")
        if info.st_size > limit and not truncate:
            raise DataError(str(path), f"is {info.st_size} bytes, more than the {limit} bytes bsa reads")
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise DataError(str(path), f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def is_case_name(name: str) -> bool:
    """Return whether `name` can be a case folder: one visible path component of at most MAX_NAME_BYTES."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not name.startswith(".")
        and "/" not in name
        and "\0" not in name
        and not any(ord(c) < 32 or ord(c) == 127 for c in name)  # no newline, tab or other control character
        and len(name.encode("utf-8", "surrogateescape")) <= MAX_NAME_BYTES
    )
