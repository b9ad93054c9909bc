#!/usr/bin/env python3
"""Check that two folders `bsa gen` wrote from the same specs agree: inputs byte for byte, gradients closely.

Usage: python scripts/same_bytes.py DIR_A DIR_B

- Every file must exist in both.
- inputs/ and every other file must have the same sha256, except the three below.
- golden/*.bin and benchmark/*.bin are float32 sums of BLAS products: a NumPy wheel bundles its own
  OpenBLAS, whose kernels may add a product's terms in another order, so they must agree in shape and to
  within float32 rounding: float32 golden files |a - b| <= 1e-5 |b| + 1e-6 max |b| (as
  tests/golden/test_golden_vectors.py asks), benchmark files in the case dtype within 1 ULP of that dtype
  (a float32 sum a last bit apart can round to the neighbouring float16 / bfloat16 value), or 2 ULP for at
  most `CARRIED_SHARE` of them (a dS rounded the other way carries one more ULP into its gradient).
- case.json must agree in everything but the sha256 of those files and `benchmark_summary` (a cache of
  compare's figures keyed by the NumPy version and machine that measured them).
Exit 0 when the folders agree, 1 with one line per difference otherwise, 2 for a usage error.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

GRADIENT_FOLDERS = ("golden", "benchmark")
CARRIED_SHARE = 1e-4
"""Share of a benchmark file's values that may differ by 2 ULP (not 1): the backward rounds dS to the case
dtype before its products, so a float32 sum a last bit apart that rounds dS the other way moves the
gradient it feeds by one more ULP (a chain's benchmark, 640 rows at D 128: 1 value in 160k)."""
VERSION_KEYED = ("benchmark_summary",)


def manifest_digest(path: Path) -> str:
    """Return the sha256 of a case.json without what may differ with the BLAS build (see the module doc)."""
    manifest = json.loads(path.read_bytes())
    for key in VERSION_KEYED:
        manifest.pop(key, None)
    for folder in GRADIENT_FOLDERS:
        for entry in (manifest.get(folder) or {}).values():
            if isinstance(entry, dict):
                entry.pop("sha256", None)
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _ordinals(bits: np.ndarray) -> np.ndarray:
    """Return the IEEE bit patterns of 16-bit floats as integers in value order (for ULP distances)."""
    signed = bits.astype(np.int64)
    return np.where(signed & 0x8000, -(signed & 0x7FFF), signed)


def gradient_difference(a: Path, b: Path, dtype: str) -> str | None:
    """Return why two gradient files of `dtype` disagree beyond float32 rounding, or None."""
    if dtype == "float32":
        x, y = np.fromfile(a, dtype="<f4").astype(np.float64), np.fromfile(b, dtype="<f4").astype(np.float64)
        if x.shape != y.shape:
            return f"{x.size} vs {y.size} values"
        scale = float(np.abs(y).max(initial=0.0)) or 1.0
        beyond = np.abs(x - y) > 1e-5 * np.abs(y) + 1e-6 * scale
    else:  # float16 / bfloat16 bits
        x, y = np.fromfile(a, dtype="<u2"), np.fromfile(b, dtype="<u2")
        if x.shape != y.shape:
            return f"{x.size} vs {y.size} values"
        ulps = np.abs(_ordinals(x) - _ordinals(y))
        beyond = ulps > 1
        if not (ulps > 2).any() and beyond.sum() <= x.size * CARRIED_SHARE:
            beyond[:] = False  # a dS rounded the other way in one build carries one more ULP into a gradient
    if beyond.any() or not np.array_equal(x == 0, y == 0):
        return f"{int(beyond.sum())} of {x.size} values beyond float32 rounding (or zeros moved)"
    return None


def entry_dtype(path: Path) -> str:
    """Return the dtype case.json gives a golden or benchmark file."""
    manifest = json.loads((path.parent.parent / "case.json").read_bytes())
    relative = f"{path.parent.name}/{path.name}"
    for entry in (manifest.get(path.parent.name) or {}).values():
        if isinstance(entry, dict) and entry.get("file") == relative:
            return str(entry["dtype"])
    raise SystemExit(f"{path}: not in its case.json")


def files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    a, b = (Path(arg) for arg in argv)
    left, right = files(a), files(b)
    problems = [f"only in {a}: {name}" for name in sorted(left.keys() - right.keys())]
    problems += [f"only in {b}: {name}" for name in sorted(right.keys() - left.keys())]
    close = 0
    for name in sorted(left.keys() & right.keys()):
        x, y = left[name], right[name]
        if x.read_bytes() == y.read_bytes():
            continue
        if x.name == "case.json":
            if manifest_digest(x) != manifest_digest(y):
                problems.append(f"differs: {name}")
        elif x.parent.name in GRADIENT_FOLDERS and x.name.endswith(".bin") and not x.name.endswith(".tiles.bin"):
            why = gradient_difference(x, y, entry_dtype(x))
            if why:
                problems.append(f"differs: {name}: {why}")
            else:
                close += 1
        elif x.parent.name == "benchmark" and x.name.endswith(".tiles.bin"):
            close += 1  # per-tile error sums of the benchmark above: follow its last bits
        else:
            problems.append(f"differs: {name}")
    for line in problems:
        print(line)
    print(
        f"{len(left.keys() & right.keys())} files compared: {len(problems)} differences; "
        f"{close} gradient files equal only to within float32 rounding (another BLAS build's sums)"
    )
    return 1 if problems or not left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
