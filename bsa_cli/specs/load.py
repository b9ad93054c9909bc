"""Spec files and folders -> the list of their cases, every bad case reported, in file and case order.

`load_specs` reads each file (`safe_yaml`), checks its shape (`cases:`, `defaults:`, `matrix:`), bounds the
cases its matrices expand to (MAX_CASES, `--max-cases`), expands and builds each case (`expand`, `build`),
and refuses two cases of one name, also names that only a case-insensitive file system would confuse.
Each bad case's first error is kept, and all of them are raised together (`SpecErrors`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.case import Case
from ..core.errors import DataError, SpecError, show
from ..core.untrusted import inside
from ..ops import Op
from .build import build_case
from .expand import _matrix, deep_merge, expand_matrix
from .fields import _SHARED, _suggest
from .safe_yaml import read_yaml

FILE_KEYS = ("cases", "defaults", "matrix")


#: Default limit on the cases a set of specs may expand to (`--max-cases` raises it).
MAX_CASES = 10_000


class SpecErrors(SpecError):
    """Errors of several cases (or files) of one load, in order: one line each (each case's first error)."""

    def __init__(self, errors: list[SpecError]) -> None:
        flat = [e for error in errors for e in (error.errors if isinstance(error, SpecErrors) else [error])]
        first = flat[0]
        super().__init__(first.file, first.message, first.case, first.key)
        self.errors: list[SpecError] = flat

    def __str__(self) -> str:
        return "\n".join(SpecError.__str__(e) for e in self.errors)


def raise_spec_errors(errors: list[SpecError]) -> None:
    """Raise nothing for no error, the error itself for one, and SpecErrors holding them all for more."""
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SpecErrors(errors)


def load_specs(
    paths: Iterable[str | Path],
    max_cases: int = MAX_CASES,
    release: str | None = None,
    ops: tuple[Op, ...] | None = None,
) -> list[Case]:
    """Load every case of the given spec files or folders (their `*.yaml`/`*.yml` files, sorted).

    `release` (`--release`), if given, replaces every case's own `release:` (interface.RELEASES).
    `ops` (`--ops`: `ops.parse_ops("forward,backward")`), if given, replaces every case's own `ops:`, and
    each case's per-op expectations (`Case.op_expect`) and skipped ops (`Case.skipped_ops`) are worked out
    for those ops (specs/build.py); a case that no op of `ops` accepts is a spec error, as a valid case
    breaking a rule is. `ops=("backward",)` builds every case as bsa always did (the backward alone).

    Raises:
        SpecError: a file is unreadable or breaks a rule, two cases share a name, or the specs expand to
            more than `max_cases` cases.
    """
    cases: list[Case] = []
    seen: dict[str, str] = {}
    folded: dict[str, str] = {}  # names as a case-insensitive file system sees them
    errors: list[SpecError] = []
    for file in spec_files(paths):
        try:
            loaded = load_spec_file(file, max_cases, before=len(cases), release=release, ops=ops)
        except SpecError as exc:
            errors.append(exc)  # every file's errors are reported, in order
            continue
        for case in loaded:
            other = folded.get(case.name.casefold())
            if case.name in seen:
                message = f"duplicate case name (also in {seen[case.name]})"
            elif other is not None:
                message = (
                    f"case name differs from {other!r} (in {seen[other]}) only in upper and lower case: on "
                    "a case-insensitive file system (macOS, Windows) both are one folder; give distinct names"
                )
            else:
                seen[case.name] = str(file)
                folded[case.name.casefold()] = case.name
                cases.append(case)
                continue
            errors.append(SpecError(str(file), message, case=case.name, key="name"))
    raise_spec_errors(errors)
    return cases


def spec_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders into their spec files; keep files as given."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in [*path.glob("*.yaml"), *path.glob("*.yml")] if not p.name.startswith("."))
            if not found:
                raise SpecError(str(path), "folder holds no *.yaml spec files")
            for file in found:
                try:
                    inside(path, file.name)
                except DataError as exc:
                    raise SpecError(str(file), exc.message) from None
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise SpecError(str(path), "is not a regular file or a folder of spec files")
        else:
            raise SpecError(str(path), "no such spec file or folder")
    return files


def build_alone(path: Path, raw: dict[str, Any], release: str | None = None, ops: tuple[Op, ...] | None = None) -> Case:
    """Validate one raw case mapping on its own, as a spec file of that one case would (a case `bsa fuzz` drew).

    Raises:
        SpecError: the case breaks a rule.
    """
    try:
        return build_case(path, raw, release=release, ops=ops)
    finally:
        _SHARED.clear()  # what the readers share is keyed by the ids of this mapping's values


def load_spec_file(
    path: Path,
    max_cases: int = MAX_CASES,
    before: int = 0,
    release: str | None = None,
    ops: tuple[Op, ...] | None = None,
) -> list[Case]:
    """Parse, expand and validate the cases of one spec file: at most `max_cases` less the `before` cases
    that earlier files of the same run expanded to; `release` and `ops` (as `load_specs`) replace each case's own."""
    try:
        return _load_spec_file(path, max_cases, before, release, ops)
    finally:
        _SHARED.clear()


def _load_spec_file(
    path: Path, max_cases: int, before: int = 0, release: str | None = None, ops: tuple[Op, ...] | None = None
) -> list[Case]:
    file = str(path)
    document = read_yaml(path)
    if not isinstance(document, dict):
        raise SpecError(file, "a spec file is a mapping with a 'cases:' list")
    for key in document:
        if key not in FILE_KEYS:
            raise SpecError(
                file, f"unknown top-level key {show(key)}{_suggest(key, FILE_KEYS)}; allowed: {', '.join(FILE_KEYS)}"
            )
    raw_cases = document.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise SpecError(file, "'cases:' must be a non-empty list of case mappings", key="cases")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError(file, "'defaults:' must be a mapping", key="defaults")
    file_matrix = _matrix(file, None, document.get("matrix") or {})
    planned = []
    for index, raw in enumerate(raw_cases):
        label = str(raw["name"]) if isinstance(raw, dict) and isinstance(raw.get("name"), str) else f"#{index + 1}"
        if not isinstance(raw, dict):
            raise SpecError(file, "each entry of 'cases:' must be a mapping", case=label)
        merged = deep_merge(defaults, raw)
        matrix = {**file_matrix, **_matrix(file, label, merged.pop("matrix", None) or {})}
        planned.append((label, merged, matrix))
    total = 0
    earlier = f" ({before} in earlier files)" if before else ""
    for label, _, matrix in planned:
        count = math.prod(len(values) for values in matrix.values())
        total += count
        if count > max_cases:
            sizes = " x ".join(str(len(v)) for v in matrix.values())
            message = f"its matrix of {sizes} values expands to {count} cases, more than the limit of {max_cases}"
            raise SpecError(file, f"{message}; raise it with --max-cases", case=label, key="matrix")
        if total + before > max_cases:
            raise SpecError(
                file,
                f"the cases expand to more than the limit of {max_cases} cases{earlier}; raise it with --max-cases",
            )
    cases: list[Case] = []
    errors: list[SpecError] = []
    for label, merged, matrix in planned:
        try:  # a case's first error is reported, then the next case is read
            variants = expand_matrix(file, label, merged, matrix)
            cases.extend(build_case(path, variant, suffix, release, ops) for variant, suffix in variants)
        except SpecError as exc:
            errors.append(exc)
    raise_spec_errors(errors)
    return cases
