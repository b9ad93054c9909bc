"""Files of a case directory: raw `.bin` arrays, the `case.json` manifest and the flat `case.txt`.

Layout of one generated case (the contract other tools read; README.md documents it):

    OUT/<case>/case.json        manifest, format "bsa-case/1"
    OUT/<case>/case.txt         the op parameters as flat `key value...` lines for a C++ harness
    OUT/<case>/inputs/*.bin     query, key, value, dout, attention_out, softmax_lse, block_sparse_mask
    OUT/<case>/golden/*.bin     golden dq, dk, dv (float32 or float64)
    OUT/<case>/benchmark/*.bin  kernel-faithful dq, dk, dv in the case dtype
    OUT/<case>/outputs/         where a device (or the reference device) writes dq.bin, dk.bin, dv.bin
    OUT/<case>@<op>/            the same for another op of the case (forward, chain, autograd: `op_folders`)

Arrays are raw little-endian C-order bytes. A case directory is written under a temporary name and
renamed into place once complete, so an interrupted run never leaves a case that looks complete.

Case folders travel between machines and teams, so everything read from them is untrusted. This module
is the one place that turns a manifest's `file` into a path (`entry_path`, through `untrusted.inside`: a
plain relative path that stays inside its folder), and files are read only when they are regular files of
bounded size (`untrusted.read_regular`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import mmap
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..core.case import DTYPES, numpy_dtype
from ..core.errors import DataError, filter_hint, plural
from ..core.errors import show as _show
from ..core.untrusted import MAX_NAME_BYTES, check_relative, entry_path, inside, is_case_name, load_json, read_regular
from ..ops.folders import op_problem
from .manifest import FORMAT, SECTIONS, Manifest

MANIFEST = "case.json"
FLAT_PARAMS = "case.txt"
OUTPUTS_DIR = "outputs"

#: Set to 1 in a device's environment when `bsa run --deterministic` asks for the operator's deterministic
#: mode (the binary contract: the C++ harness then sets ACL_OPT_DETERMINISTIC, the torch_npu child
#: torch.use_deterministic_algorithms(True)).
DETERMINISTIC_ENV = "BSA_DETERMINISTIC"

#: Files of an output directory that belong to the contract or to `bsa run`, never to an `outputs` entry
#: (nor are `stdout*.log`, `stderr*.log` and `.run-*`).
RESERVED_OUTPUT_NAMES = ("status.txt", "run.json")

#: Largest `case.json` read (a generated one is a few KiB).
MAX_MANIFEST_BYTES = 64 << 20

#: Largest array a manifest entry may promise (16 TiB): beyond any real case, and far from int64 overflow.
MAX_ARRAY_BYTES = 1 << 44

#: Names of the temporary folders `CaseWriter` makes (with the pid of their writer since bsa 0.1.0).
_LEFTOVER_RE = re.compile(r"^\.(.+)\.(partial|old)-(?:(\d+)-)?[A-Za-z0-9_]+\Z")


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def array_bytes(array: np.ndarray) -> bytes:
    """Return the raw little-endian C-order bytes of an array."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


def write_array(directory: Path, relative: str, array: np.ndarray, dtype_name: str) -> dict[str, Any]:
    """Write `array` as raw bytes under `directory/relative`; return its manifest entry.

    The entry is `{"file", "dtype", "shape", "sha256"}` with `file` relative to `directory`.
    """
    if array.dtype != numpy_dtype(dtype_name):
        raise ValueError(f"array of dtype {array.dtype} written as {dtype_name}")
    data = array_bytes(array)
    path = directory / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {
        "file": relative,
        "dtype": dtype_name,
        "shape": list(array.shape),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def expected_nbytes(entry: Mapping[str, Any]) -> int:
    """Return the byte size a manifest array entry promises."""
    count = math.prod(int(d) for d in entry["shape"])
    return count * numpy_dtype(entry["dtype"]).itemsize


def check_size(directory: Path, entry: Mapping[str, Any]) -> Path:
    """Return the path of a manifest entry's file after checking that it exists with the promised size.

    Raises:
        DataError: the entry is malformed or its file lies outside `directory` (`entry_path`), or the file is
            missing, not a regular file, truncated or oversized (bytes found and expected, shape and dtype).
    """
    path = entry_path(directory, entry)
    check_entry(entry, str(path))
    expected = expected_nbytes(entry)
    shape_text = f"shape {list(entry['shape'])} {entry['dtype']}"
    if not path.is_file():
        problem = "missing" if not path.exists() else "not a regular file"
        raise DataError(str(path), f"{problem} (expected {expected} bytes for {shape_text})")
    found = path.stat().st_size
    if found != expected:
        kind = "truncated" if found < expected else "oversized"
        raise DataError(str(path), f"{kind}: {found} bytes, expected {expected} bytes for {shape_text}")
    return path


def map_array(directory: Path, entry: Mapping[str, Any], populate: bool = False) -> np.ndarray:
    """Map the array a manifest entry describes, read-only and without a copy; its sha256 is not checked.

    With `populate` (for arrays about to be read whole) the pages are mapped up front, see `map_read_only`.

    Raises:
        DataError: as `check_size`.
    """
    path = check_size(directory, entry)
    dtype = numpy_dtype(entry["dtype"]).newbyteorder("<")
    if path.stat().st_size == 0:
        return np.zeros(entry["shape"], dtype=dtype)
    with open(path, "rb") as f:
        mapped = map_read_only(f.fileno(), populate)
    return np.frombuffer(mapped, dtype=dtype).reshape(entry["shape"])


def map_read_only(fileno: int, populate: bool = False) -> mmap.mmap:
    """Map a whole file read-only; with `populate`, on Linux, its pages are mapped up front (MAP_POPULATE).

    For a file about to be read to the end: faulting a cached file in one call is several times faster
    than page by page.
    """
    flag = getattr(mmap, "MAP_POPULATE", 0)
    small = os.fstat(fileno).st_size <= POPULATE_MAX_BYTES
    if populate and small and flag and hasattr(mmap, "MAP_SHARED"):
        return mmap.mmap(fileno, 0, flags=mmap.MAP_SHARED | flag, prot=mmap.PROT_READ)
    return mmap.mmap(fileno, 0, access=mmap.ACCESS_READ)


#: Largest file mapped up front: a larger one is faulted in as it is read, so a file that does not fit in
#: free memory is not read twice (and an interrupt is not held up by one long mapping call).
POPULATE_MAX_BYTES = 256 << 20


def read_array(directory: Path, entry: Mapping[str, Any], *, verify: bool = True) -> np.ndarray:
    """Read the array a manifest entry describes, relative to `directory`.

    Raises:
        DataError: the file is missing, its size does not match shape and dtype, or (with `verify` and a
            recorded sha256) its content changed since the manifest was written.
    """
    path = check_size(directory, entry)
    data = read_regular(path, expected_nbytes(entry))
    if verify and entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise DataError(
            str(path), "sha256 differs from the manifest: the file is stale or was changed; run `bsa gen` again"
        )
    dtype = numpy_dtype(entry["dtype"]).newbyteorder("<")
    return np.frombuffer(data, dtype=dtype).reshape(entry["shape"])


def load_manifest(case_dir: Path) -> Manifest:
    """Read and check `case_dir/case.json` (`check_manifest`): the one place a manifest is parsed.

    Raises:
        DataError: the manifest is missing, not a regular file inside the case folder, too large, not
            JSON, or breaks a rule of `check_manifest` (the message names the entry).
    """
    path = Path(case_dir) / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise DataError(str(path), "no manifest: not a case directory written by `bsa gen`")
    inside(Path(case_dir), MANIFEST)
    data = read_regular(path, MAX_MANIFEST_BYTES)
    try:
        manifest = load_json(data)
    except ValueError as exc:  # JSON, UTF-8, or an integer of more digits than Python converts
        raise DataError(str(path), f"not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise DataError(str(path), f"format {_show(found)} is not {FORMAT!r}")
    check_manifest(manifest, str(path))
    return Manifest(manifest)


def check_entry(entry: Any, what: str) -> None:
    """Check one array entry: a mapping with a relative `file`, a known `dtype`, a `shape` of
    non-negative integers of at most MAX_ARRAY_BYTES, and an optional string `sha256`.

    Raises:
        DataError: naming `what` and the bad field.
    """
    if not isinstance(entry, Mapping):
        raise DataError(what, f"{_show(entry)} is not a mapping with file, dtype and shape")
    for field_name in ("file", "dtype", "shape"):
        if field_name not in entry:
            raise DataError(what, f"has no '{field_name}'")
    check_relative(entry["file"], f"{what}.file")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise DataError(f"{what}.dtype", f"{_show(dtype)} is not one of {', '.join(DTYPES)}")
    shape = entry["shape"]
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or len(shape) > 8
    ):
        raise DataError(f"{what}.shape", f"{_show(shape)} is not a list of up to 8 non-negative integers")
    nbytes = math.prod(shape) * numpy_dtype(dtype).itemsize
    if nbytes > MAX_ARRAY_BYTES:
        raise DataError(f"{what}.shape", f"{_show(shape)} {dtype} is {nbytes} bytes, more than bsa's limit")
    if entry.get("sha256") is not None and not isinstance(entry["sha256"], str):
        raise DataError(f"{what}.sha256", f"{_show(entry['sha256'])} is not a hex string")


def check_manifest(manifest: Mapping[str, Any], where: str) -> None:
    """Check the parts of a manifest that bsa turns into paths, reads or indexes.

    `name` a string; `params`, `expect` and every section mappings; an op folder's fields as
    `op_folders.op_problem`; every array entry as `check_entry`; `outputs` files distinct and none of the
    files `bsa run` keeps for itself.

    Raises:
        DataError: `where: KEY: problem`, naming the entry.
    """
    name = manifest.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(where, f"name {_show(name)} is not a non-empty string")
    if not is_case_name(name):
        raise DataError(
            where,
            f"name {_show(name)} cannot name a case: one visible folder name ('.' and "
            f"'..', a leading '.', '/', control characters and names over {MAX_NAME_BYTES} bytes "
            "are not)",
        )
    for key in ("params", "expect"):
        if not isinstance(manifest.get(key), dict):
            raise DataError(where, f"{key}: {_show(manifest.get(key))} is not a mapping")
    status = manifest["expect"].get("status", 0)
    if not isinstance(status, int) or isinstance(status, bool) or not -(2**63) <= status < 2**63:
        raise DataError(where, f"expect.status: {_show(status)} is not a 64-bit integer")
    problem = op_problem(manifest)  # an op folder's op, skip and forward parameters
    if problem is not None:
        raise DataError(where, problem)
    summary = manifest.get("benchmark_summary")
    tiles = summary.get("tiles") if isinstance(summary, dict) else None
    tables = {section: manifest.get(section) for section in SECTIONS}
    tables["benchmark_summary.tiles"] = tiles if isinstance(tiles, dict) else None  # tiles of another kind: unread
    for section, entries in tables.items():
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise DataError(where, f"{section}: {_show(entries)} is not a mapping of array entries")
        for entry_name, entry in entries.items():
            if entry is None and section in SECTIONS:
                continue  # a null tensor (a negative case passes a null pointer)
            try:
                check_entry(entry, f"{section}.{entry_name}")
            except DataError as exc:
                raise DataError(where, str(exc)) from None
    seen: set[str] = set()
    for entry_name, entry in Manifest(manifest).entries("outputs"):  # each checked above
        file = PurePosixPath(entry["file"])
        first = file.parts[0]
        if (
            first in RESERVED_OUTPUT_NAMES
            or first.startswith(".run-")
            or (first.startswith(("stdout", "stderr")) and first.endswith(".log"))
        ):
            raise DataError(
                where,
                f"outputs.{entry_name}.file: {_show(entry['file'])} is a file bsa run keeps "
                "for itself (status.txt, run.json, logs, .run-*)",
            )
        normal = str(file)
        if normal in seen:
            raise DataError(where, f"outputs.{entry_name}.file: {_show(entry['file'])} names another output too")
        seen.add(normal)


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name one file or folder: the same resolved path, or (through a hard link or a
    symbolic link) the same device and inode."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except (OSError, ValueError):  # a path that does not exist (yet), or holds a NUL
        return False


def case_folder_of(path: Path) -> Path | None:
    """Return the case folder (one holding case.json) that `path` is or lies in, links followed; None if none."""
    try:
        real = Path(os.path.realpath(path))
        return next((folder for folder in (real, *real.parents) if (folder / MANIFEST).is_file()), None)
    except (OSError, ValueError):
        return None


def output_problem(output: Path, inputs: Sequence[Path], *, device_outputs: bool = False) -> str | None:
    """Return why bsa must not write `output` (a report file, or a folder it writes into), or None.

    It must not be one of `inputs` (the same file or folder, also through a symbolic or hard link), nor
    lie inside a case folder, whose files bsa reads; with `device_outputs` (a device's outputs folder)
    the case folder's outputs/ is where it belongs.
    """
    for given in inputs:
        if _same(output, given):
            return f"is the input {given} (the same file); bsa never writes over what it reads"
    case_dir = case_folder_of(output)
    if case_dir is None:
        return None
    inner = Path(os.path.realpath(output)).relative_to(case_dir).parts
    if device_outputs and inner[:1] == ("outputs",):
        return None
    where = "its outputs/ folder" if device_outputs else "another folder"
    return f"lies inside the case folder {case_dir}, whose files bsa reads; write it in {where}"


def find_cases(root: Path) -> list[Path]:
    """Return the case directories under `root` (itself, or its subdirectories holding case.json), sorted.

    Hidden folders (names starting with '.', such as bsa's temporary ones) and symbolic links are never
    taken as cases.
    """
    root = Path(root)
    if (root / MANIFEST).is_file():
        return [root]
    if not root.exists():
        raise DataError(str(root), "no such directory")
    if not root.is_dir():
        raise DataError(str(root), "is a file, not a case directory or a folder of cases written by `bsa gen`")
    try:
        children = sorted(root.iterdir())
    except OSError as exc:
        raise DataError(str(root), f"cannot be listed: {exc.strerror or exc}") from None
    return [
        child
        for child in children
        if not child.name.startswith(".") and not child.is_symlink() and child.is_dir() and (child / MANIFEST).is_file()
    ]


def select_cases(roots: Sequence[Path], patterns: Sequence[str] = (), option: str = "--filter") -> list[Path]:
    """Return the case directories under `roots` whose directory name matches any glob of `patterns`.

    A case's name is its directory's name (the manifest's `name`, as `bsa gen` writes it); no patterns
    selects every case. `option` is how the caller's user gave the patterns (the pytest plugin's
    `--bsa-filter`), for the error.

    Raises:
        DataError: a root is not a directory, holds no case directories, or no case matches the filter.
    """
    found: list[Path] = []
    for root in roots:
        cases = find_cases(Path(root))
        if not cases:
            raise DataError(str(root), "no case directories (*/case.json) here; write them with `bsa gen`")
        found.extend(c for c in cases if c not in found)
    if patterns:
        selected = [p for p in found if any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)]
        if not selected:
            shown = " or ".join(repr(p) for p in patterns)
            hint = filter_hint(patterns, [p.name for p in found])
            raise DataError(
                ", ".join(str(r) for r in roots), f"{option} {shown} matches none of {plural(len(found), 'case')}{hint}"
            )
        found = selected
    return found


def check_unique_names(case_dirs: Sequence[Path]) -> None:
    """Check that no two case folders of one folder of cases have manifests that name the same case (a
    folder copied under another name: its report would name one case twice). Suites side by side
    (OUT/smoke, OUT/edge) may hold cases of the same names.

    A manifest that cannot be read is left to the reader that judges its case.

    Raises:
        DataError: naming both folders and the name.
    """
    seen: dict[tuple[Path, str], Path] = {}
    for case_dir in case_dirs:
        try:
            name = (Path(case_dir).resolve().parent, load_manifest(case_dir)["name"])
        except (DataError, OSError):
            continue
        if name in seen:
            raise DataError(
                str(case_dir),
                f"its manifest names the case {_show(name[1])}, as the manifest of {seen[name]} does: "
                "a report names each case once; give each case folder its own case (or compare them apart)",
            )
        seen[name] = Path(case_dir)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to `path` through a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


def umask() -> int:
    """Return the process's umask without changing it (read from /proc where it can be: setting and
    restoring it would race with the threads that write files meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace_atomically(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` to `path` through a temporary file in the same directory and an atomic rename; the file
    gets `mode`, else what `open` would give a new file under the umask (mkstemp's own is owner-only)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~umask() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Largest case.txt read back (one of `bsa gen` is a few KiB).
FLAT_PARAMS_MAX_BYTES = 1 << 20


def refresh_flat_params(case_dir: Path, text: str) -> bool:
    """Make `case_dir/case.txt` hold `text` (the flat parameters derived from the checked case.json): a C++
    harness reads its file table, so an edited case.txt must never steer one outside the case. Rewritten
    atomically when it differs (a link in its place is replaced, never written through); return whether it
    was rewritten.

    Raises:
        OSError: it cannot be written (a folder in its place, a full disk, no permission).
    """
    path = Path(case_dir) / FLAT_PARAMS
    data = text.encode("utf-8")
    if not path.is_symlink() and path.is_file():
        try:
            if read_regular(path, FLAT_PARAMS_MAX_BYTES) == data:
                return False
        except DataError:
            pass  # too large, unreadable: written again
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(21, "a folder is where case.txt belongs", str(path))
    replace_atomically(path, data)
    return True


def check_output_dir(output_dir: Path) -> Path:
    """Return `output_dir` after checking that a device may write there: a folder or nothing, never a
    symbolic link (a case folder could carry one pointing anywhere).

    Raises:
        DataError: it is a symbolic link, or something other than a folder.
    """
    output_dir = Path(output_dir)
    if output_dir.is_symlink():
        raise DataError(
            str(output_dir),
            "is a symbolic link; bsa never reads or writes outputs through a link (remove it, or give --outputs-root)",
        )
    if output_dir.exists() and not output_dir.is_dir():
        raise DataError(str(output_dir), "is not a folder; it cannot hold a device's outputs")
    return output_dir


@dataclass(frozen=True)
class Leftover:
    """A temporary folder of `CaseWriter` in a folder of cases: `.NAME.partial-PID-x` (a case being written,
    complete once it holds case.json) or `.NAME.old-PID-x` (the case it replaces, in `case/`)."""

    path: Path
    name: str  # the case it belongs to
    kind: str  # "partial" or "old"
    pid: int | None  # its writer (None: written before bsa 0.1.0)

    @property
    def complete_copy(self) -> Path | None:
        """The complete case it holds (a folder with case.json), if any."""
        folder = self.path / "case" if self.kind == "old" else self.path
        return folder if (folder / MANIFEST).is_file() and not folder.is_symlink() else None

    @property
    def writer_alive(self) -> bool:
        return self.pid is not None and _alive(self.pid)


def find_leftovers(out_root: Path) -> list[Leftover]:
    """Return the temporary folders of `CaseWriter`s in `out_root` (real folders only, never links), sorted."""
    try:
        children = sorted(Path(out_root).iterdir())
    except OSError:
        return []
    found = []
    for child in children:
        match = _LEFTOVER_RE.match(child.name)
        if match and not child.is_symlink() and child.is_dir():
            pid = int(match.group(3)) if match.group(3) else None
            found.append(Leftover(child, match.group(1), match.group(2), pid))
    return found


def remove_leftovers(out_root: Path) -> list[Path]:
    """Remove the temporary folders a killed `bsa gen` left in `out_root`; return them.

    Only real folders (never a symbolic link) named as `CaseWriter` names them are removed, and not those
    of a writer that is still running (its pid is in the name). A case killed between the two renames of
    a replacement (where the file system cannot exchange two folders at once) is restored first: its
    complete copy (the old case, else the new one if complete) goes back under its name.
    """
    removed: list[Path] = []
    leftovers = [left for left in find_leftovers(out_root) if not left.writer_alive]
    for left in sorted(leftovers, key=lambda left: left.kind != "old"):  # the old, known complete, first
        final = Path(out_root) / left.name
        copy = left.complete_copy
        if copy is not None and is_case_name(left.name) and not (final.exists() or final.is_symlink()):
            try:
                os.replace(copy, final)
            except OSError:
                continue  # left as it is: a complete copy is never removed while its case is missing
        if left.path.exists():
            shutil.rmtree(left.path, ignore_errors=True)
        removed.append(left.path)
    return removed


_RENAME_EXCHANGE = 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two folders in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    return renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), _RENAME_EXCHANGE) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


class CaseWriter:
    """Build a case directory under a temporary name; `commit()` renames it into place.

    Use as a context manager: leaving the block without `commit()` (an error, Ctrl-C) removes the
    temporary directory, so OUT never holds a half-written case under its real name. The case's name
    must be one visible path component (`is_case_name`): a case never replaces its output folder or a
    folder outside it.
    """

    def __init__(self, final_dir: Path) -> None:
        self.final_dir = Path(final_dir)
        if not is_case_name(self.final_dir.name):
            raise DataError(str(self.final_dir), "a case name must name one visible folder inside the output folder")
        self.final_dir.parent.mkdir(parents=True, exist_ok=True)
        prefix = f".{self.final_dir.name}.partial-{os.getpid()}-"
        self.dir = Path(tempfile.mkdtemp(dir=self.final_dir.parent, prefix=prefix))
        # mkdtemp's folder is owner-only; renamed into place it is the case folder, which others (a device
        # account, a colleague) read as the umask allows.
        os.chmod(self.dir, 0o777 & ~umask())

    def __enter__(self) -> CaseWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)

    def array(self, relative: str, array: np.ndarray, dtype_name: str) -> dict[str, Any]:
        return write_array(self.dir, relative, array, dtype_name)

    def commit(self, manifest: Mapping[str, Any], flat_params: str) -> Path:
        """Write the manifest and flat parameters, then move the case into place (replacing an old one)."""
        (self.dir / OUTPUTS_DIR).mkdir(exist_ok=True)
        (self.dir / FLAT_PARAMS).write_text(flat_params)
        # The manifest is written last: a directory with case.json is a complete case.
        write_json_atomic(self.dir / MANIFEST, manifest)
        if self.final_dir.is_dir() and not self.final_dir.is_symlink() and _exchange(self.dir, self.final_dir):
            shutil.rmtree(self.dir, ignore_errors=True)  # the old case, swapped out in the same step
        elif self.final_dir.exists() or self.final_dir.is_symlink():
            prefix = f".{self.final_dir.name}.old-{os.getpid()}-"
            old = Path(tempfile.mkdtemp(dir=self.final_dir.parent, prefix=prefix))
            os.replace(self.final_dir, old / "case")
            os.replace(self.dir, self.final_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.dir, self.final_dir)
        return self.final_dir


def verify_inputs(case_dir: Path, manifest: Manifest) -> None:
    """Check every input file against its recorded size and sha256.

    Raises:
        DataError: naming the first file that is missing, of the wrong size, or stale.
    """
    for _, entry in manifest.entries("inputs"):
        path = entry_path(case_dir, entry)
        if not path.is_file():
            raise DataError(str(path), "missing input file" if not path.exists() else "not a regular file")
        if path.stat().st_size != expected_nbytes(entry):
            raise DataError(str(path), f"{path.stat().st_size} bytes, expected {expected_nbytes(entry)}")
        if entry.get("sha256") and sha256_file(path) != entry["sha256"]:
            raise DataError(str(path), "sha256 differs from the manifest: stale input; run `bsa gen` again")
