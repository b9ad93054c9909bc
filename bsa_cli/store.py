"""Files of a case directory: raw `.bin` arrays, the `case.json` manifest and the flat `case.txt`.

Layout of one generated case (the contract other tools read; README.md documents it):

    OUT/<case>/case.json        manifest, format "bsa-case/1"
    OUT/<case>/case.txt         the op parameters as flat `key value...` lines for a C++ harness
    OUT/<case>/inputs/*.bin     query, key, value, dout, attention_out, softmax_lse, block_sparse_mask
    OUT/<case>/golden/*.bin     golden dq, dk, dv (float32 or float64)
    OUT/<case>/benchmark/*.bin  kernel-faithful dq, dk, dv in the case dtype
    OUT/<case>/outputs/         where a device (or the reference device) writes dq.bin, dk.bin, dv.bin

Arrays are raw little-endian C-order bytes. A case directory is written under a temporary name and
renamed into place once complete, so an interrupted run never leaves a case that looks complete.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .case import numpy_dtype
from .errors import DataError

FORMAT = "bsa-case/1"
MANIFEST = "case.json"
FLAT_PARAMS = "case.txt"
OUTPUTS_DIR = "outputs"


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
    count = int(np.prod(entry["shape"], dtype=np.int64))
    return count * numpy_dtype(entry["dtype"]).itemsize


def check_size(directory: Path, entry: Mapping[str, Any]) -> Path:
    """Return the path of a manifest entry's file after checking that it exists with the promised size.

    Raises:
        DataError: the file is missing, truncated or oversized (bytes found and expected, shape and dtype).
    """
    path = Path(directory) / entry["file"]
    expected = expected_nbytes(entry)
    shape_text = f"shape {list(entry['shape'])} {entry['dtype']}"
    if not path.is_file():
        raise DataError(str(path), f"missing (expected {expected} bytes for {shape_text})")
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


POPULATE_MAX_BYTES = 256 << 20
"""Largest file mapped up front: a larger one is faulted in as it is read, so a file that does not fit in
free memory is not read twice (and an interrupt is not held up by one long mapping call)."""


def read_array(directory: Path, entry: Mapping[str, Any], *, verify: bool = True) -> np.ndarray:
    """Read the array a manifest entry describes, relative to `directory`.

    Raises:
        DataError: the file is missing, its size does not match shape and dtype, or (with `verify` and a
            recorded sha256) its content changed since the manifest was written.
    """
    path = check_size(directory, entry)
    data = path.read_bytes()
    if verify and entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise DataError(
            str(path), "sha256 differs from the manifest: the file is stale or was changed; run `bsa gen` again"
        )
    dtype = numpy_dtype(entry["dtype"]).newbyteorder("<")
    return np.frombuffer(data, dtype=dtype).reshape(entry["shape"])


def load_manifest(case_dir: Path) -> dict[str, Any]:
    """Read and check `case_dir/case.json`."""
    path = Path(case_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(str(path), "no manifest: not a case directory written by `bsa gen`") from None
    except json.JSONDecodeError as exc:
        raise DataError(str(path), f"not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise DataError(str(path), f"format {found!r} is not {FORMAT!r}")
    return manifest


def find_cases(root: Path) -> list[Path]:
    """Return the case directories under `root` (itself, or its subdirectories holding case.json), sorted."""
    root = Path(root)
    if (root / MANIFEST).is_file():
        return [root]
    if not root.exists():
        raise DataError(str(root), "no such directory")
    if not root.is_dir():
        raise DataError(str(root), "is a file, not a case directory or a folder of cases written by `bsa gen`")
    return sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))


def select_cases(roots: Sequence[Path], patterns: Sequence[str] = ()) -> list[Path]:
    """Return the case directories under `roots` whose directory name matches any glob of `patterns`.

    A case's name is its directory's name (the manifest's `name`, as `bsa gen` writes it); no patterns
    selects every case.

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
            raise DataError(", ".join(str(r) for r in roots), f"--filter {shown} matches none of {len(found)} cases")
        found = selected
    return found


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to `path` through a temporary file in the same directory and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CaseWriter:
    """Build a case directory under a temporary name; `commit()` renames it into place.

    Use as a context manager: leaving the block without `commit()` (an error, Ctrl-C) removes the
    temporary directory, so OUT never holds a half-written case under its real name.
    """

    def __init__(self, final_dir: Path) -> None:
        self.final_dir = Path(final_dir)
        self.final_dir.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(dir=self.final_dir.parent, prefix=f".{self.final_dir.name}.partial-"))

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
        if self.final_dir.exists():
            old = Path(tempfile.mkdtemp(dir=self.final_dir.parent, prefix=f".{self.final_dir.name}.old-"))
            os.replace(self.final_dir, old / "case")
            os.replace(self.dir, self.final_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.dir, self.final_dir)
        return self.final_dir


def iter_entries(manifest: Mapping[str, Any], section: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (name, entry) of a manifest section such as "inputs", "golden" or "outputs"."""
    yield from (manifest.get(section) or {}).items()


def verify_inputs(case_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Check every input file against its recorded size and sha256.

    Raises:
        DataError: naming the first file that is missing, of the wrong size, or stale.
    """
    for _, entry in iter_entries(manifest, "inputs"):
        path = Path(case_dir) / entry["file"]
        if not path.is_file():
            raise DataError(str(path), "missing input file")
        if path.stat().st_size != expected_nbytes(entry):
            raise DataError(str(path), f"{path.stat().st_size} bytes, expected {expected_nbytes(entry)}")
        if entry.get("sha256") and sha256_file(path) != entry["sha256"]:
            raise DataError(str(path), "sha256 differs from the manifest: stale input; run `bsa gen` again")
