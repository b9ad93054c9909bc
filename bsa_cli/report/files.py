"""Report files: checked before any judging starts, written whole or not at all."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import BsaError
from ..store import umask


@dataclass
class ReportPathError(BsaError):
    """A report cannot be written where an option asks: names the option, the path and why."""

    option: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.option} {self.path}: {self.reason}"


def prepare_report_paths(paths: Mapping[str, Path | None]) -> None:
    """Create the parent folders of the report paths (option -> path; None: not asked) and check that each
    report can be written there, so that a bad path stops the command before the judging starts.

    Raises:
        ReportPathError: a path is a folder, two options name the same file, a parent folder cannot be
            created, or no file can be created in it.
    """
    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        path = Path(path)
        resolved = path.resolve()
        twin = next((p for p in seen if p == resolved or _same_file(p, resolved)), None)  # a hard link too
        if twin is not None:
            raise ReportPathError(option, str(path), f"is also the {seen[twin]} report; give each its own file")
        seen[resolved] = option
        if path.is_dir():
            raise ReportPathError(option, str(path), "is a folder; give a file name, e.g. report.html inside it")
        parent = path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReportPathError(option, str(path), f"cannot create folder {parent}: {exc.strerror or exc}") from None
        if is_character_device(path):
            continue  # written into, as every Unix tool does (/dev/null, /dev/stdout)
        if (reason := target_problem(path)) is not None:
            raise ReportPathError(option, str(path), reason)
        try:
            fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".probe")
        except OSError as exc:
            raise ReportPathError(option, str(path), f"cannot write in {parent}: {exc.strerror or exc}") from None
        os.close(fd)
        os.unlink(probe)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return False


_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def is_character_device(path: Path) -> bool:
    """Whether `path` names a character device (through links): /dev/null, a terminal, /dev/stdout."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def target_problem(path: Path) -> str | None:
    """Return why a report cannot be written at `path` (None: it is a new path or a regular file).

    A report replaces only a regular file (through a symbolic link: the file it points to, the link
    stays): never a block device, a FIFO, a socket or a folder, which a rename would turn into a regular
    file. A character device (/dev/null) is written into instead (`is_character_device`).
    """
    try:
        info = os.stat(path)  # follows links: what the path names
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined: {exc.strerror or exc}"
    if stat.S_ISREG(info.st_mode):
        return None
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    return (
        f"is {kind}, not a regular file; bsa writes a report only as a new file or over a regular file "
        "(it would replace this one); give a file name"
    )


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename (parents created),
    so a reader never sees half a report. A symbolic link stays a link: the file it points to is replaced.

    Raises:
        OSError: `path` is not a regular file or a new path (errno EEXIST; nothing is written), or the
            report cannot be written (a full disk: ENOSPC), with the path as its filename.
    """
    path = Path(path)
    if is_character_device(path):  # written into, never replaced by a file
        with open(path, "w", encoding="utf-8", newline="") as device:
            device.write(text)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if (problem := target_problem(path)) is not None:
        raise OSError(errno.EEXIST, problem, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            # backslashreplace: a folder name of non-UTF-8 bytes (\udcff) is written as its escape
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())  # a full disk shows here at the latest, not after the rename
            os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes the file private; a report is an ordinary file
            if (problem := target_problem(path)) is not None:  # something else may have taken the path meanwhile
                raise OSError(errno.EEXIST, problem, str(path))
            os.replace(tmp, path)
        except OSError as exc:
            if exc.filename is None:  # a write error names no file: name the report
                raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
            raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
