"""Publish a set of files into a folder whole: staged in a temporary folder, then renamed into place.

`bsa export` builds every file it writes in memory (or names the verified file to hard-link) before it
touches the target folder, so a refused case, a full disk or Ctrl-C while writing leaves the target as it
was. The files are written into a temporary folder (inside the target when it exists, else beside it, so
the renames stay on one file system); a new target is then that folder renamed, and an existing one gets
each of its top-level entries by `os.replace`, which replaces a symbolic link (or a file, or a folder of an
earlier export) of that name itself and never writes through it into the file it points to.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: What a staged file holds: text (written as UTF-8), or a file whose bytes were verified, to be
#: hard-linked (copied where a link cannot be made: another file system); None: remove an earlier export's
#: file of that name (a top-level one).
Content = str | Path | None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _stage(root: Path, files: Mapping[str, Content]) -> None:
    for relative, content in files.items():
        if content is None:
            continue
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            try:
                os.link(content, path)
            except OSError:
                shutil.copyfile(content, path)
        else:
            with open(path, "w", encoding="utf-8", newline="") as handle:
                handle.write(content)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _put(staged: Path, target: Path, trash: Path) -> None:
    """Move `staged` to `target`, replacing whatever `target` is (a link itself, never its target)."""
    if staged.is_dir() and (target.is_symlink() or target.exists()):
        if target.is_dir() and not target.is_symlink():
            target.rename(trash / target.name)  # the old folder goes once the new one is in place
        else:
            target.unlink()
    os.replace(staged, target)


def publish(out_dir: Path, files: Mapping[str, Content]) -> list[Path]:
    """Write `files` (paths relative to `out_dir`, each with its content) into `out_dir` (created with its
    parents), each top-level entry replacing the one of its name; return the paths written.

    Raises:
        OSError: a file cannot be written (nothing in `out_dir` has changed then), or `out_dir` is not a folder.
    """
    out_dir = Path(out_dir)
    fresh = not out_dir.exists() and not out_dir.is_symlink()
    if fresh:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
    home = out_dir.parent if fresh else out_dir
    staging = Path(tempfile.mkdtemp(dir=home, prefix=f".{out_dir.name}.export."))
    try:
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's folder is private; a new target is an ordinary folder
        _stage(staging, files)
        if fresh:
            staging.rename(out_dir)
        else:
            trash = staging / ".replaced"
            trash.mkdir()
            for name in sorted({Path(relative).parts[0] for relative, content in files.items() if content is not None}):
                _put(staging / name, out_dir / name, trash)
            for name in sorted(relative for relative, content in files.items() if content is None):
                if (out_dir / name).is_symlink() or (out_dir / name).is_file():
                    (out_dir / name).unlink()
    except BaseException:
        if staging.exists():
            _remove(staging)
        raise
    if not fresh:
        _remove(staging)
    return [out_dir / relative for relative, content in files.items() if content is not None]
