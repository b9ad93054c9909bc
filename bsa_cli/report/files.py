"""Report files: checked before any judging starts, written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import BsaError


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
        if resolved in seen:
            raise ReportPathError(option, str(path), f"is also the {seen[resolved]} report; give each its own file")
        seen[resolved] = option
        if path.is_dir():
            raise ReportPathError(option, str(path), "is a folder; give a file name, e.g. report.html inside it")
        parent = path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ReportPathError(option, str(path), f"cannot create folder {parent}: {exc.strerror or exc}") from None
        try:
            fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".probe")
        except OSError as exc:
            raise ReportPathError(option, str(path), f"cannot write in {parent}: {exc.strerror or exc}") from None
        os.close(fd)
        os.unlink(probe)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename (parents created),
    so a reader never sees half a report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; a report is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
