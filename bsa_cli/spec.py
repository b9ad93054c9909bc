"""YAML case specs -> validated, frozen `Case` objects.

A spec file holds `cases:` (a list of mappings), optional `defaults:` merged into every case, and optional
`matrix:` (top level or per case) that expands a case over the cartesian product of listed values. Matrix
keys may be dotted (`sparsity.density`) to reach into a nested mapping.

Every error names the file, the case, the key and the bad value, and says what is allowed.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import yaml

from . import interface, stress
from .case import (
    ACLNN_STATUS,
    DTYPES,
    MAX_TOKENS,
    TENSOR_NAMES,
    Case,
    Distribution,
    Expect,
    Init,
    Outliers,
    RowScale,
    Sink,
    Sparsity,
    TensorOverride,
)
from .errors import DataError, SpecError, show, suggest
from .inputs import ALIGNMENTS, fit_explicit, unreachable_kv_blocks
from .manifest import params as case_params
from .manifest import semantics as case_semantics
from .store import MAX_NAME_BYTES, inside, is_case_name, read_regular

DTYPE_ALIASES = {
    "fp16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16", "bfloat": "bfloat16",
    "fp32": "float32", "float": "float32", "single": "float32", "f32": "float32",
    "fp64": "float64", "double": "float64", "f64": "float64",
    "u8": "uint8", "i8": "int8", "i32": "int32", "int": "int32", "i64": "int64", "long": "int64",
    "boolean": "bool",
}  # fmt: skip
"""Other names of spec dtypes; names are read case-insensitively, with an optional 'torch.' or 'np.' prefix."""
PATTERNS = ("dense", "random", "causal", "sliding_window", "strided", "explicit")
TENSORS = ("query", "key", "value", "dout")
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+\Z")  # \Z: `$` would also match before a final newline

CASE_KEYS = (
    "name", "description", "layout", "kv_layout", "dtype", "batch", "num_heads", "num_kv_heads", "head_dim",
    "q_seq_len", "kv_seq_len", "actual_seq_lengths", "actual_seq_lengths_kv", "block_shape", "scale", "seed",
    "sparsity", "init", "expect", "seq_lengths_encoding", "lse_shape", "bnsd_lengths", "empty_row_lse",
    "mask_type", "pre_tokens", "next_tokens", "tensors", "compare", "matrix", "release", "null_layouts",
)  # fmt: skip
TENSOR_KEYS = ("dtype", "shape")
MAX_OVERRIDE_ELEMENTS = 1 << 26
"""Largest tensor a `tensors:` shape override may ask for (elements): negative cases need no big data."""
SPARSITY_KEYS = ("pattern", "density", "window", "stride", "mask", "empty_rows", "per_head", "causal_alignment")
PATTERN_KEYS = {
    "density": ("random",), "per_head": ("random",), "window": ("sliding_window", "strided"), "stride": ("strided",),
    "causal_alignment": ("causal", "sliding_window", "strided"), "mask": ("explicit",),
}  # fmt: skip
"""Sparsity keys that only some patterns use (`pattern` and `empty_rows` apply to every pattern); another
pattern refuses them, so a key that would change nothing is never written unseen."""
DIST_KEYS = ("distribution", "mean", "std", "low", "high", "outliers", "row_scale")
SHAPE_KEYS = ("distribution", "mean", "std", "low", "high")
"""Keys that shape a distribution (what `init.logit_std` decides for query and key)."""
INIT_KEYS = (*DIST_KEYS, *("query", "key", "value", "dout"), "sink", "logit_std")
OUTLIER_KEYS = ("fraction", "factor", "axis")
ROW_SCALE_KEYS = ("low", "high")
SINK_KEYS = ("token", "strength")
FILE_KEYS = ("cases", "defaults", "matrix")


MAX_SPEC_BYTES = 4 << 20
"""Largest spec file read (4 MiB): specs are a few KiB; large explicit masks belong in .npy files."""

MAX_YAML_VALUES = 500_000
"""Most values (scalars, lists, mappings) a spec may hold once its YAML aliases are expanded."""

MAX_YAML_DEPTH = 32
"""Deepest nesting of lists and mappings in a spec."""

MAX_CASES = 10_000
"""Default limit on the cases a set of specs may expand to (`--max-cases` raises it)."""

MAX_ELEMENTS = 1 << 40
"""Most elements of one tensor (query, key/value or the block mask) of a case: beyond any real case, and
far enough from int64 overflow that every size and cost bsa computes stays exact."""

MAX_MASK_BYTES = 256 << 20
"""Largest explicit mask (.npy) read."""

MAX_DIM = 2**31 - 1
"""Largest size, length, head count, window or stride (the kernel's tiling counts in 32 bits)."""

INT64_LIMIT = 2**63
"""Integers passed to the operator (seed, mask_type, pre/next_tokens) lie in [-2^63, 2^63)."""

LAYOUT_RE = re.compile(r"^[A-Za-z0-9_]{1,16}\Z")
"""What a layout string may be (a negative case may pass one the operator rejects)."""


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


def load_specs(paths: Iterable[str | Path], max_cases: int = MAX_CASES, release: str | None = None) -> list[Case]:
    """Load every case of the given spec files or folders (their `*.yaml`/`*.yml` files, sorted).

    `release` (`--release`), if given, replaces every case's own `release:` (interface.RELEASES).

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
            loaded = load_spec_file(file, max_cases, before=len(cases), release=release)
        except SpecError as exc:
            errors.append(exc)  # every file's errors are reported, in order
            continue
        for case in loaded:
            if case.name in seen:
                errors.append(SpecError(
                    str(file), f"duplicate case name (also in {seen[case.name]})", case=case.name, key="name"
                ))  # fmt: skip
                continue
            other = folded.get(case.name.casefold())
            if other is not None:
                errors.append(SpecError(
                    str(file), f"case name differs from {other!r} (in {seen[other]}) only in upper and lower case: on "
                    "a case-insensitive file system (macOS, Windows) both are one folder; give distinct names",
                    case=case.name, key="name",
                ))  # fmt: skip
                continue
            seen[case.name] = str(file)
            folded[case.name.casefold()] = case.name
            cases.append(case)
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


class _SpecLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader, refusing duplicate keys, and reading `1e-3` as the number users mean.

    It stops composing once a document holds more than MAX_YAML_VALUES values (untagged ones are counted
    as they are read; the file size bounds the rest).
    """

    values = 0

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        self.values += 1
        if self.values > MAX_YAML_VALUES:
            raise yaml.YAMLError(f"more than {MAX_YAML_VALUES} values in one spec")
        return super().resolve(kind, value, implicit)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {show(key)} (first on line {first + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml(path: Path) -> Any:
    """Read one YAML document of a spec file, within MAX_SPEC_BYTES, MAX_YAML_VALUES and MAX_YAML_DEPTH.

    Aliases are counted as often as they are used, so an alias bomb is refused before anything expands it.

    Raises:
        SpecError: the file cannot be read, is too large, is not YAML, has a duplicate key, or nests or
            expands beyond the limits.
    """
    file = str(path)
    try:
        data = read_regular(path, MAX_SPEC_BYTES)
    except DataError as exc:
        if "more than" in exc.message:
            raise SpecError(file, f"{exc.message}: a spec holds at most {MAX_SPEC_BYTES >> 20} MiB "
                            "(put large explicit masks in .npy files)") from None  # fmt: skip
        raise SpecError(file, f"cannot be read: {exc.message}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(file, f"cannot be read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(file, node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        text = " ".join(str(exc).replace('"<unicode string>"', repr(file)).split())
        raise SpecError(file, "not valid YAML: " + show(text, 300).strip("'")) from None
    except RecursionError:
        raise SpecError(file, f"nested deeper than the {MAX_YAML_DEPTH} levels a spec may use") from None
    except (ValueError, OverflowError) as exc:  # a value YAML's types cannot hold (a date, a huge integer)
        raise SpecError(file, f"not valid YAML: {show(str(exc), 120)}") from None
    finally:
        loader.dispose()


def _check_nodes(file: str, root: yaml.Node) -> None:
    """Refuse a YAML node graph that nests more than MAX_YAML_DEPTH levels, refers to itself, or expands
    (aliases counted each time they are used) to more than MAX_YAML_VALUES values.

    Each distinct collection is visited once, without recursion, so the check costs no more than reading.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id -> (values once expanded, nesting height)
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = (1, 1)
            continue
        children = _children(node)
        if done:
            open_nodes.discard(key)
            size, height = 1, 1
            for child in children:
                child_size, child_height = (1, 1) if isinstance(child, yaml.ScalarNode) else sizes[id(child)]
                size += child_size
                height = max(height, child_height + 1)
            sizes[key] = (size, height)
            if size > MAX_YAML_VALUES:
                raise SpecError(file, f"its YAML expands to more than {MAX_YAML_VALUES} values (aliases "
                                "counted each time they are used): an alias bomb?")  # fmt: skip
            if height > MAX_YAML_DEPTH:
                raise SpecError(file, f"nested deeper than the {MAX_YAML_DEPTH} levels a spec may use")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            line = node.start_mark.line + 1 if node.start_mark else "?"
            raise SpecError(file, f"a YAML alias refers to a value that contains it (line {line})")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend(
            (child, False)
            for child in children
            if not isinstance(child, yaml.ScalarNode) and id(child) not in sizes
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_spec_file(
    path: Path, max_cases: int = MAX_CASES, before: int = 0, release: str | None = None
) -> list[Case]:
    """Parse, expand and validate the cases of one spec file: at most `max_cases` less the `before` cases
    that earlier files of the same run expanded to; `release` replaces each case's own."""
    try:
        return _load_spec_file(path, max_cases, before, release)
    finally:
        _SHARED.clear()


def _load_spec_file(path: Path, max_cases: int, before: int = 0, release: str | None = None) -> list[Case]:
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
            raise SpecError(file, f"its matrix of {sizes} values expands to {count} cases, more than the limit "
                            f"of {max_cases}; raise it with --max-cases", case=label, key="matrix")  # fmt: skip
        if total + before > max_cases:
            raise SpecError(file, f"the cases expand to more than the limit of {max_cases} cases{earlier}; "
                            "raise it with --max-cases")  # fmt: skip
    cases: list[Case] = []
    errors: list[SpecError] = []
    for label, merged, matrix in planned:
        try:  # a case's first error is reported, then the next case is read
            variants = expand_matrix(file, label, merged, matrix)
            cases.extend(build_case(path, variant, suffix, release) for variant, suffix in variants)
        except SpecError as exc:
            errors.append(exc)
    raise_spec_errors(errors)
    return cases


def _key(key: Any) -> str:
    """Return a mapping key as an error message names it (a string as it is, anything else as a short repr)."""
    return key if isinstance(key, str) and len(key) <= 60 else show(key)


def dtype_name(value: Any) -> str | None:
    """Return the dtype name of DTYPES that a spec's `value` names (FP16, half, torch.bfloat16, ...), or None."""
    if not isinstance(value, str):
        return None
    name = value.strip().lower()
    for prefix in ("torch.", "np.", "numpy."):
        name = name.removeprefix(prefix)
    name = DTYPE_ALIASES.get(name, name)
    return name if name in DTYPES else None


def _dtype_suggestion(value: Any, allowed: Iterable[str]) -> str:
    """Return ' (did you mean ...?)' for a dtype name that is not one, compared in lower case.

    A name that gives its width (float8, int4) is only offered names of that width: 'float8' is not a
    misspelt 'float' (float32).
    """
    if not isinstance(value, str):
        return ""
    word = value.strip().lower()
    names = [*allowed, *DTYPE_ALIASES]
    digits = sorted(re.sub(r"\D", "", word))
    if digits:  # the same digits in any order: 'bfloat61' is a misspelt 'bfloat16'
        names = [name for name in names if sorted(re.sub(r"\D", "", name)) == digits]
    return suggest(word, names)


def _suggest(value: Any, choices: Iterable[str]) -> str:
    """Return `suggest` for a string value ('' for anything else)."""
    return suggest(value, choices) if isinstance(value, str) else ""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` updated by `override`, merging nested mappings key by key.

    Only the mappings on the way to a merged key are new; other values are shared with `base` and
    `override` (specs are read, never changed, so a large default is not copied into every case).
    """
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _matrix(file: str, case: str | None, matrix: Any) -> dict[str, list[Any]]:
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise SpecError(file, "'matrix:' maps keys to non-empty lists of values", case=case, key="matrix")
    for key in matrix:
        if not isinstance(key, str):
            raise SpecError(file, f"matrix key {show(key)} is not a string", case=case, key="matrix")
    return matrix


def expand_matrix(
    file: str, case: str, raw: dict[str, Any], matrix: Mapping[str, list[Any]]
) -> list[tuple[dict[str, Any], str]]:
    """Return one (raw case, name suffix) per combination of matrix values; no matrix gives one."""
    if not matrix:
        return [(raw, "")]
    keys = list(matrix)
    for key in keys:
        top = key.split(".")[0]
        if top not in CASE_KEYS or top == "matrix":
            raise SpecError(
                file, f"matrix key '{_key(key)}' is not a case key{suggest(top, CASE_KEYS)}", case=case, key="matrix"
            )
    variants = []
    for values in itertools.product(*(matrix[k] for k in keys)):
        variant = dict(raw)  # mappings on the way to a matrix key are copied; values are shared
        for key, value in zip(keys, values, strict=True):
            *parents, leaf = key.split(".")
            node = variant
            for parent in parents:
                child = node.get(parent)
                if child is None:
                    child = {}
                elif not isinstance(child, dict):
                    message = f"matrix key '{_key(key)}' reaches into a non-mapping"
                    raise SpecError(file, message, case=case, key="matrix")
                node[parent] = dict(child)
                node = node[parent]
            node[leaf] = value
        variants.append((variant, "." + ".".join(_label(v) for v in values)))
    return variants


def _label(value: Any, budget: int = 256) -> str:
    """Render a matrix value as a readable name part: [16, 48] -> 16x48, bfloat16 -> bf16.

    Stops once the text passes `budget` characters (such a name is refused as too long anyway).
    """
    if isinstance(value, (list, tuple, dict)):
        parts: list[str] = []
        used = 0
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        for key, item in items:
            part = ("" if key is None else _label(key, budget - used)) + _label(item, budget - used)
            parts.append(part)
            used += len(part) + 1
            if used > budget:
                break
        return ("-" if isinstance(value, dict) else "x").join(parts)
    text = str(value)[: budget + 1]
    text = {"float16": "fp16", "bfloat16": "bf16"}.get(text, text)
    return re.sub(r"[^A-Za-z0-9_\-]", "_", text.replace(".", "p"))


class _Reader:
    """Typed access to one raw case mapping, raising SpecErrors that name the file, case and key."""

    def __init__(self, path: Path, raw: Mapping[str, Any], case: str, prefix: str = "") -> None:
        self.path, self.raw, self.case, self.prefix = path, raw, case, prefix

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(str(self.path), message, case=self.case, key=self.prefix + key)

    def nested(self, key: str, raw: Mapping[str, Any]) -> _Reader:
        """Return a reader of the mapping under `key`, whose errors name keys as `key.sub`."""
        return _Reader(self.path, raw, self.case, f"{self.prefix}{key}.")

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def integer(
        self, key: str, default: int | None = None, *, minimum: int | None = 0, maximum: int = MAX_DIM
    ) -> int:
        value = self.raw.get(key, default)
        if value is None:
            raise self.error(key, "is required: give an integer")
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, f"{show(value)} is not an integer")
        if minimum is not None and value < minimum:
            raise self.error(key, f"{show(value)} is below the minimum {minimum}")
        if value > maximum:
            raise self.error(key, f"{show(value)} is above the maximum {maximum}")
        if value < -INT64_LIMIT:
            raise self.error(key, f"{show(value)} is below the minimum {-INT64_LIMIT}")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf", "nan"):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # '1e-3' and the like, when quoted
            except ValueError:
                pass
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, f"{show(value)} is not a number")
        try:
            return float(value)
        except OverflowError:
            raise self.error(key, f"{show(value)} is too large for a floating-point number") from None

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.raw.get(key, default)
        if value not in allowed:
            raise self.error(
                key, f"{show(value)} is not allowed{_suggest(value, allowed)}; allowed: {', '.join(allowed)}"
            )
        return str(value)

    def lengths(self, key: str) -> tuple[int, ...] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        shared = _SHARED.get(("lengths", id(value)))
        if shared is not None:
            return shared  # type: ignore[no-any-return]
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM for v in value
        ):
            raise self.error(
                key, f"{show(value)} is not a list of integers from 0 to {MAX_DIM} (one per batch)"
            )
        if not value:
            raise self.error(key, "is empty: give one length per batch entry (at least one)")
        lengths = _SHARED[("lengths", id(value))] = tuple(value)
        return lengths


def build_case(path: Path, raw: dict[str, Any], suffix: str = "", release: str | None = None) -> Case:
    """Validate one expanded raw case and return it as a `Case` (`release`, if given, replacing its own)."""
    base_name = raw.get("name")
    r = _Reader(path, raw, base_name if isinstance(base_name, str) else show(base_name))
    if not isinstance(base_name, str) or not base_name:
        raise r.error("name", "every case needs a 'name' (letters, digits, '_', '.', '-')")
    name = base_name + suffix
    r.case = show(name, 80).strip("'")
    if not NAME_RE.match(name):
        raise r.error("name", f"{show(name)} may hold only letters, digits, '_', '.', '-'")
    if not is_case_name(name):
        raise r.error("name", f"{show(name)} cannot name a case folder: a name is not '.' or '..', does not "
                      f"start with '.' (hidden), and has at most {MAX_NAME_BYTES} characters")  # fmt: skip
    for key in raw:
        if key not in CASE_KEYS:
            raise r.error(_key(key), f"unknown key{_suggest(key, CASE_KEYS)}; allowed: {', '.join(CASE_KEYS)}")

    expect = _expect(r)
    layout = r.get("layout", "BNSD")
    kv_layout = r.get("kv_layout")
    nulls = _null_layouts(r, raw)
    for key, value in (("layout", layout), ("kv_layout", kv_layout)):
        if value is not None and not (isinstance(value, str) and LAYOUT_RE.match(value)):
            raise r.error(key, f"{show(value)} is not a layout string (up to 16 letters, digits or '_'); "
                          "allowed: BNSD, TND")  # fmt: skip
    raw_dtype = r.get("dtype", "float16")
    dtype = dtype_name(raw_dtype)
    if dtype is None:
        raise r.error("dtype", f"{show(raw_dtype)} is not allowed{_dtype_suggestion(raw_dtype, DTYPES)}; "
                      "allowed: float16 (fp16), bfloat16 (bf16)")  # fmt: skip
    num_heads = r.integer("num_heads", minimum=1)
    num_kv_heads = r.integer("num_kv_heads", num_heads, minimum=1)
    head_dim = r.integer("head_dim", 128, minimum=1)
    q_lengths = r.lengths("actual_seq_lengths")
    kv_lengths = r.lengths("actual_seq_lengths_kv")
    tnd = layout == "TND"
    kv_lengths_null = "actual_seq_lengths_kv" in raw and raw["actual_seq_lengths_kv"] is None
    if tnd:
        if kv_lengths is None and q_lengths is not None and not kv_lengths_null:
            kv_lengths = q_lengths
        for key in ("q_seq_len", "kv_seq_len"):
            if raw.get(key) is not None and q_lengths is not None:
                raise r.error(key, "applies to BNSD only; TND takes its maximum from actual_seq_lengths")
        if q_lengths is None:  # a negative case (missing lengths): tensors still need a shape
            q_seq_len = r.integer("q_seq_len", 128)
            kv_seq_len = r.integer("kv_seq_len", q_seq_len)
            batch = r.integer("batch", 1, minimum=1)
        else:
            batch = len(q_lengths)
            if "batch" in raw and raw["batch"] != batch:
                raise r.error("batch", f"{show(raw['batch'])} differs from the {batch} entries of actual_seq_lengths")
            q_seq_len = max(q_lengths, default=0)
            # a negative case with null kv lengths: kv tensors take the q lengths' shape
            kv_seq_len = max(kv_lengths if kv_lengths is not None else q_lengths, default=0)
    else:
        batch = r.integer("batch", 1, minimum=1)
        q_seq_len = r.integer("q_seq_len", minimum=1)
        kv_seq_len = r.integer("kv_seq_len", q_seq_len, minimum=1)
        if kv_lengths is None and q_lengths is not None and kv_seq_len == q_seq_len and not kv_lengths_null:
            kv_lengths = q_lengths
        for key, lengths, limit in (
            ("actual_seq_lengths", q_lengths, q_seq_len),
            ("actual_seq_lengths_kv", kv_lengths, kv_seq_len),
        ):
            if lengths is not None and max(lengths, default=0) > limit:
                raise r.error(key, f"{show(list(lengths))}: a length exceeds the sequence dimension {limit}")
    for key, lengths in (("actual_seq_lengths", q_lengths), ("actual_seq_lengths_kv", kv_lengths)):
        if lengths is not None and len(lengths) != batch:
            raise r.error(key, f"has {len(lengths)} entries, but batch is {batch}: give one length per batch")
    block_shape = _block_shape(r, expect)
    scale = r.number("scale", 1.0 / math.sqrt(head_dim))
    if not math.isfinite(scale):
        raise r.error("scale", f"{show(scale)} must be a finite number")
    if abs(scale) > FLOAT32_MAX:
        raise r.error("scale", f"{show(scale)} overflows float32 (the kernel receives float(scale)): "
                      "the golden cannot be finite")  # fmt: skip

    case = Case(
        name=name,
        source=str(path),
        layout=layout,
        kv_layout=kv_layout if kv_layout is not None else None,
        dtype=dtype,
        batch=batch,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        q_seq_len=q_seq_len,
        kv_seq_len=kv_seq_len,
        actual_seq_lengths=q_lengths,
        actual_seq_lengths_kv=kv_lengths,
        block_shape=block_shape,
        scale=scale,
        seed=r.integer("seed", 0, maximum=2**64 - 1),
        sparsity=_sparsity(r, path),
        init=_init(r),
        expect=expect,
        seq_lengths_encoding=r.choice("seq_lengths_encoding", ("per_batch", "cumulative"), "per_batch"),
        lse_shape=r.choice("lse_shape", ("trailing_one", "squeezed"), "trailing_one"),
        bnsd_lengths=r.choice("bnsd_lengths", ("honored", "ignored"), "honored"),
        empty_row_lse=r.number("empty_row_lse", math.inf),
        mask_type=r.integer("mask_type", 0, minimum=None, maximum=INT64_LIMIT - 1),
        pre_tokens=r.integer("pre_tokens", MAX_TOKENS, minimum=None, maximum=INT64_LIMIT - 1),
        next_tokens=r.integer("next_tokens", MAX_TOKENS, minimum=None, maximum=INT64_LIMIT - 1),
        tensors=_tensors(r),
        compare=_compare(r),
        release=release if release is not None else _release(r),
        null_layouts=nulls,
    )
    _check_sizes(r, case)
    _check_finite(r, case)
    if case.sparsity.explicit is not None:
        try:
            fit_explicit(case.sparsity.explicit, case.mask_shape)
        except ValueError as exc:
            raise r.error("sparsity.mask", str(exc)) from None
    rows = case.sparsity.empty_rows
    if isinstance(rows, tuple) and rows and max(rows) >= case.num_q_blocks:
        raise r.error("sparsity.empty_rows", f"index {max(rows)} is beyond the case's {case.num_q_blocks} query-block "
                      f"rows (indices 0 to {case.num_q_blocks - 1}): the mask has no such row")  # fmt: skip
    return _check_interface(r, case)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_sizes(r: _Reader, case: Case) -> None:
    """Refuse a case whose tensors hold more than MAX_ELEMENTS elements, or that has nothing to compute."""
    for what, shape in (
        ("query", case.q_shape),
        ("key and value", case.kv_shape),
        ("block_sparse_mask", case.mask_shape),
    ):
        count = math.prod(shape)
        if count > MAX_ELEMENTS:
            raise r.error("batch" if what != "block_sparse_mask" else "block_shape",
                          f"{what} would have shape {list(shape)}: {count:.3g} elements, more than bsa's limit "
                          f"of 2^{MAX_ELEMENTS.bit_length() - 1}")  # fmt: skip
    if case.expect.ok and math.prod(case.q_shape) == 0 and math.prod(case.kv_shape) == 0:
        raise r.error("actual_seq_lengths", "every length is 0: the case has nothing to compute or compare")


def _magnitude(dist: Distribution) -> float:
    """Return a bound that drawn values exceed only rarely: |mean| + 4 std, or the larger uniform bound."""
    if dist.kind == "uniform":
        return max(abs(dist.low), abs(dist.high))
    return abs(dist.mean) + 4.0 * dist.std


def _check_finite(r: _Reader, case: Case) -> None:
    """Refuse init values and scales with which the inputs or the golden cannot be finite.

    Inputs are drawn then rounded to the case dtype: values beyond its largest finite number become inf.
    Scores (scale * q.k over head_dim), dP and the gradients are bounded with those magnitudes; a bound
    past float32's largest number means the golden overflows.
    """
    if case.dtype not in ("float16", "bfloat16", "float32", "float64"):
        return  # a negative case of another dtype: the operator rejects it before reading values
    largest = float(ml_dtypes.finfo(DTYPES[case.dtype]).max)
    size = {}
    init = case.init
    if (init.sink is not None or init.logit_std is not None) and case.kernel_scale == 0:
        raise r.error("init.sink" if init.sink is not None else "init.logit_std", "needs a nonzero scale: it is "
                      "defined by the scaled scores")  # fmt: skip
    if init.sink is not None and stress.query_spread(case) == 0:
        raise r.error("init.sink", "needs queries that vary (std or range > 0): they move by twice their std")
    for tensor in TENSORS:
        dist = getattr(init, tensor)
        if init.logit_std is not None and tensor in ("query", "key"):
            dist = dataclasses.replace(dist, kind="normal", mean=0.0, std=stress.logit_std_spread(case))
        size[tensor] = _magnitude(dist)
        if dist.row_scale is not None:
            size[tensor] *= dist.row_scale.high
        if dist.outliers is not None:
            size[tensor] *= max(1.0, dist.outliers.factor)
        if init.sink is not None and tensor == "query":
            size[tensor] += stress.sink_query_shift(case)
        if init.sink is not None and tensor == "key":
            size[tensor] = max(size[tensor], stress.sink_key_length(case))
        if size[tensor] > largest:
            raise r.error(f"init.{tensor}", f"values of {tensor} reach about {size[tensor]:.3g}, beyond "
                          f"{case.dtype}'s largest number {largest:.5g}: the inputs and the golden cannot be "
                          "finite")  # fmt: skip
    d = case.head_dim
    scores = abs(case.scale) * d * size["query"] * size["key"]
    dscores = 2.0 * d * size["dout"] * size["value"]
    grads = abs(case.scale) * max(case.q_seq_len, case.kv_seq_len) * dscores * max(size["key"], size["query"])
    for what, bound in (("scores scale*q.k", scores), ("dP = dout.v", dscores), ("dq and dk", grads)):
        if bound > FLOAT32_MAX:
            raise r.error("init", f"with these values and scale {case.scale:.3g}, {what} may reach {bound:.3g}, "
                          "beyond float32's largest number: the golden cannot be finite; use a smaller scale or "
                          "init")  # fmt: skip


def _expect(r: _Reader) -> Expect:
    value = r.get("expect", "ok")
    if value in ("ok", 0, "ACLNN_SUCCESS"):
        return Expect()
    for name, code in ACLNN_STATUS.items():
        if value in (name, code) and code != 0:
            return Expect(status=code, name=name)
    allowed = ", ".join(f"{n} ({c})" for n, c in ACLNN_STATUS.items() if c)
    raise r.error("expect", f"{show(value)} is not allowed{_suggest(value, ACLNN_STATUS)}; allowed: ok, {allowed}")


def _tensors(r: _Reader) -> tuple[TensorOverride, ...]:
    """Read `tensors:`: {name: null (a null pointer) | {dtype: ..., shape: [...]}} for the call's tensors."""
    raw = r.get("tensors", {})
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise r.error("tensors", f"{show(raw)} is not a mapping of tensor names to null or {{dtype, shape}}")
    overrides = []
    for name, value in raw.items():
        key = f"tensors.{_key(name)}"
        if name not in TENSOR_NAMES:
            raise r.error(key, f"unknown tensor{_suggest(name, TENSOR_NAMES)}; allowed: {', '.join(TENSOR_NAMES)}")
        if value is None:
            if name == "atten_mask":
                raise r.error(key, "attenMask is null already; give {dtype: bool} to pass one")
            overrides.append(TensorOverride(name, null=True))
            continue
        if not isinstance(value, dict) or not value:
            raise r.error(key, f"{show(value)} is neither null (a null pointer) nor a mapping with dtype and/or shape")
        for sub in value:
            if sub not in TENSOR_KEYS:
                raise r.error(f"{key}.{_key(sub)}", f"unknown key{_suggest(sub, TENSOR_KEYS)}; allowed: dtype, shape")
        raw_dtype = value.get("dtype")
        dtype = None
        if raw_dtype is not None:
            dtype = dtype_name(raw_dtype)
            if dtype is None:
                raise r.error(f"{key}.dtype", f"{show(raw_dtype)} is not allowed"
                              f"{_dtype_suggestion(raw_dtype, DTYPES)}; "
                              f"allowed: {', '.join(DTYPES)}")  # fmt: skip
        shape = value.get("shape")
        if shape is not None:
            if not isinstance(shape, list) or len(shape) > 8 or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape
            ):
                raise r.error(f"{key}.shape", f"{show(shape)} is not a list of non-negative integers "
                              f"(up to 8, each at most {MAX_DIM})")
            if math.prod(shape) > MAX_OVERRIDE_ELEMENTS:
                raise r.error(f"{key}.shape", f"{show(shape)} holds over {MAX_OVERRIDE_ELEMENTS} elements")
            shape = tuple(shape)
        overrides.append(TensorOverride(name, dtype=dtype, shape=shape))
    return tuple(overrides)


def _block_shape(r: _Reader, expect: Expect) -> tuple[int, ...]:
    value = r.get("block_shape", [128, 128])
    valid = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_DIM for v in value)
    )
    if valid:
        return tuple(value)
    if not expect.ok and value is None:
        return ()  # a negative case passing a null blockShape
    if (
        not expect.ok
        and isinstance(value, list)
        and len(value) <= 8
        and all(isinstance(v, int) and -INT64_LIMIT <= v < INT64_LIMIT for v in value)
    ):
        return tuple(value)  # a negative case breaking the block-shape rule on purpose
    raise r.error("block_shape", f"{show(value)} is not [X, Y] with two positive integers")


def _sparsity(r: _Reader, path: Path) -> Sparsity:
    raw = r.get("sparsity", {"pattern": "dense"})
    if isinstance(raw, str):
        raw = {"pattern": raw}
    if not isinstance(raw, dict):
        raise r.error("sparsity", f"{show(raw)} is not a mapping with a 'pattern'")
    for key in raw:
        if key not in SPARSITY_KEYS:
            allowed = ", ".join(SPARSITY_KEYS)
            raise r.error(f"sparsity.{_key(key)}", f"unknown key{_suggest(key, SPARSITY_KEYS)}; allowed: {allowed}")
    sub = r.nested("sparsity", raw)
    pattern = sub.choice("pattern", PATTERNS, "dense")
    for key in raw:
        users = PATTERN_KEYS.get(key)
        if users is not None and pattern not in users:
            which = " or ".join(users)
            raise sub.error(key, f"pattern {show(pattern)} does not use it ({key} is for pattern {which}); remove "
                            f"it, or set pattern: {users[0]}")  # fmt: skip
    density = sub.number("density", 0.5)
    if not 0.0 <= density <= 1.0:
        raise sub.error("density", f"{density} is not within [0, 1]")
    window = sub.integer("window", 1, minimum=1)
    stride = sub.integer("stride", 4, minimum=1)
    explicit, source = None, None
    if pattern == "explicit":
        explicit, source = _explicit_mask(sub, path)
    empty_rows = raw.get("empty_rows", ())
    empty: float | tuple[int, ...]
    if isinstance(empty_rows, float) and 0.0 <= empty_rows <= 1.0:
        empty = empty_rows
    elif isinstance(empty_rows, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in empty_rows
    ):
        empty = tuple(empty_rows)
    elif empty_rows in ((), 0) and not isinstance(empty_rows, bool):
        empty = ()
    else:
        raise sub.error("empty_rows", f"{show(empty_rows)} is neither a fraction in [0, 1] (like 0.25) "
                        "nor a list of query-block row indices")  # fmt: skip
    per_head = raw.get("per_head", True)
    if not isinstance(per_head, bool):
        raise sub.error("per_head", f"{show(per_head)} is not true or false")
    alignment = sub.choice("causal_alignment", ALIGNMENTS, "top_left")
    return Sparsity(pattern=pattern, density=density, window=window, stride=stride, explicit=explicit,
                    explicit_source=source, empty_rows=empty, per_head=per_head,
                    causal_alignment=alignment)  # fmt: skip


_SHARED: dict[Any, Any] = {}
"""Values converted while one spec file loads, by file or by the YAML value's identity: explicit masks and
length lists. Cases of one matrix (or of shared defaults) share them instead of each holding a copy."""


def _explicit_mask(r: _Reader, path: Path) -> tuple[np.ndarray, str]:
    """Return the explicit mask of a case as a read-only bool array, and its source ('inline' or the path).

    A file is a .npy file inside the spec's folder; values, inline or in the file, are 0/1 (or booleans).
    """
    value = r.get("mask")
    if value is None:
        raise r.error(
            "mask", "pattern explicit needs 'mask': a nested list of 0/1, or a .npy path relative to the spec"
        )
    key = ("file", str(path.parent.resolve() / value)) if isinstance(value, str) else ("inline", id(value))
    if key in _SHARED:
        return _SHARED[key]
    if isinstance(value, str):
        array = _read_npy(r, path, value)
        source = value
    else:
        try:
            array = np.array(value)
        except (ValueError, TypeError, OverflowError):
            raise r.error("mask", "is a ragged nested list: every row needs the same length") from None
        source = "inline"
    if array.dtype == object or array.ndim not in (2, 3, 4) or not (
        array.dtype == bool or np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise r.error(
            "mask",
            f"needs 2 to 4 dimensions of 0/1 ([nQ, nKV], [N1, nQ, nKV] or [B, N1, nQ, nKV]), got shape "
            f"{list(array.shape)} of {array.dtype}",
        )
    if array.dtype != bool:
        bad = ~((array == 0) | (array == 1))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise r.error("mask", f"holds {show(array[where].item())} at index {list(where)} (and "
                          f"{int(bad.sum())} such values): a mask holds only 0 and 1")  # fmt: skip
    selected = array != 0
    selected.setflags(write=False)
    _SHARED[key] = (selected, source)
    return selected, source


def _read_npy(r: _Reader, spec: Path, relative: str) -> np.ndarray:
    """Read a .npy mask inside the spec's folder: a regular file, its header checked before any data is read."""
    try:
        file = inside(spec.parent, relative, f"{spec.parent}/{relative}")
        data = read_regular(file, MAX_MASK_BYTES)
    except DataError as exc:
        raise r.error("mask", f"{exc}; a mask file is a .npy file inside the spec's folder") from None
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, EOFError, OSError, SyntaxError, TypeError) as exc:
        raise r.error("mask", f"{str(file)!r} is not a .npy array file: {show(str(exc), 100)}") from None
    if dtype.hasobject or not (dtype.kind == "b" or np.issubdtype(dtype, np.number)):
        raise r.error("mask", f"{str(file)!r} holds {dtype}, not 0/1 numbers")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise r.error("mask", f"{str(file)!r}: its header promises shape {list(shape)}: a dimension is negative")
    count = math.prod(shape)
    body = len(data) - stream.tell()
    if count * dtype.itemsize != body:
        raise r.error("mask", f"{str(file)!r}: its header promises shape {list(shape)} {dtype} "
                      f"({count * dtype.itemsize} bytes), the file holds {body} bytes")  # fmt: skip
    return np.frombuffer(data, dtype=dtype, offset=stream.tell()).reshape(shape, order="F" if fortran else "C")


def _mapping(r: _Reader, key: str, raw: Any, keys: tuple[str, ...], what: str) -> _Reader:
    """Return a reader of the mapping `raw` under `key`, refusing a non-mapping or an unknown key."""
    if not isinstance(raw, dict):
        raise r.error(key, f"{show(raw)} is not a mapping of {what}")
    for k in raw:
        if k not in keys:
            raise r.error(f"{key}.{_key(k)}", f"unknown key{_suggest(k, keys)}; allowed: {', '.join(keys)}")
    return r.nested(key, raw)


def _positive(r: _Reader, key: str, default: float, what: str) -> float:
    value = r.number(key, default)
    if not (math.isfinite(value) and value > 0):
        raise r.error(key, f"{show(value)} is not allowed; allowed: {what}")
    return value


def _outliers(r: _Reader, key: str, raw: Any) -> Outliers:
    sub = _mapping(r, key, raw, OUTLIER_KEYS, "fraction, factor, axis")
    fraction = sub.number("fraction", 0.01)
    if not 0.0 < fraction <= 1.0:
        raise sub.error("fraction", f"{show(fraction)} is not allowed; allowed: a fraction in (0, 1], like 0.01")
    factor = _positive(sub, "factor", 20.0, "a finite number > 0, like 20")
    axis = sub.choice("axis", ("token", "channel"), "token")
    return Outliers(fraction=fraction, factor=factor, axis=axis)


def _row_scale(r: _Reader, key: str, raw: Any) -> RowScale:
    sub = _mapping(r, key, raw, ROW_SCALE_KEYS, "low, high (log-uniform row factors)")
    low = _positive(sub, "low", 1e-3, "a finite number > 0, like 1e-3")
    high = _positive(sub, "high", 1e2, "a finite number > 0, like 100")
    if low > high:
        raise sub.error("low", f"{show(low)} is above high {show(high)}")
    return RowScale(low=low, high=high)


def _distribution(r: _Reader, key: str, raw: Mapping[str, Any]) -> Distribution:
    for k in raw:
        if k not in DIST_KEYS:
            raise r.error(f"{key}.{_key(k)}", f"unknown key{_suggest(k, DIST_KEYS)}; allowed: {', '.join(DIST_KEYS)}")
    sub = r.nested(key, raw)
    kind = sub.choice("distribution", ("normal", "uniform"), "normal")
    dist = Distribution(kind=kind, mean=sub.number("mean", 0.0), std=sub.number("std", 1.0),
                        low=sub.number("low", -1.0), high=sub.number("high", 1.0))  # fmt: skip
    if not all(math.isfinite(v) for v in (dist.mean, dist.std, dist.low, dist.high)):
        raise r.error(key, "distribution parameters must be finite numbers")
    if dist.std < 0:
        raise sub.error("std", f"{dist.std} is negative")
    if dist.low > dist.high:
        raise sub.error("low", f"low {dist.low} is above high {dist.high}")
    if raw.get("outliers") is not None:
        dist = dataclasses.replace(dist, outliers=_outliers(sub, "outliers", raw["outliers"]))
    if raw.get("row_scale") is not None:
        dist = dataclasses.replace(dist, row_scale=_row_scale(sub, "row_scale", raw["row_scale"]))
    return dist


def _init(r: _Reader) -> Init:
    raw = r.get("init", {})
    if not isinstance(raw, dict):
        raise r.error("init", f"{show(raw)} is not a mapping")
    for key in raw:
        if key not in INIT_KEYS:
            raise r.error(f"init.{_key(key)}", f"unknown key{_suggest(key, INIT_KEYS)}; "
                          f"allowed: {', '.join(INIT_KEYS)}")  # fmt: skip
    base = {k: v for k, v in raw.items() if k in DIST_KEYS}
    per_tensor = {}
    for tensor in TENSORS:
        override = raw.get(tensor, {})
        if not isinstance(override, dict):
            raise r.error(f"init.{tensor}", f"{show(override)} is not a mapping of distribution keys")
        per_tensor[tensor] = _distribution(r, f"init.{tensor}" if override else "init", {**base, **override})
    sink = None
    if raw.get("sink") is not None:
        sub = _mapping(r, "init.sink", raw["sink"], SINK_KEYS, "token, strength")
        sink = Sink(token=sub.integer("token", 0), strength=_positive(sub, "strength", 8.0, "a finite number > 0 "
                    "(the sink's score in nats), like 8"))  # fmt: skip
    logit_std = None
    if raw.get("logit_std") is not None:
        logit_std = _positive(r.nested("init", raw), "logit_std", 1.0, "a finite number > 0 (the std of "
                              "scale * q.k), like 20 or 0.01")  # fmt: skip
        for tensor in ("query", "key"):
            for k in SHAPE_KEYS:
                if k in (raw.get(tensor) or {}):
                    raise r.error(f"init.{tensor}.{k}", "logit_std sets the distribution of query and key; give "
                                  "one or the other")  # fmt: skip
    return Init(**per_tensor, sink=sink, logit_std=logit_std)


def _compare(r: _Reader) -> dict[str, Any]:
    raw = r.get("compare", {})
    if not isinstance(raw, dict):
        raise r.error("compare", f"{show(raw)} is not a mapping (standard, thresholds)")
    try:
        from .compare import validate_settings
    except ImportError:  # the comparator is not installed in this build; pass the settings through
        return dict(raw)
    try:
        validate_settings(raw)
    except ValueError as exc:
        raise r.error("compare", str(exc)) from None
    return dict(raw)


def _fix_first(case: Case, v: interface.Violation) -> str | None:
    """Return the message of an interface violation that a case meant to pass has most likely made by
    mistake, with the fix first and `expect:` (for a negative case) second; None for any other."""
    negative = (f"for a negative case that tests this instead, set 'expect: {v.status}' (the operator returns "
                f"{v.status})")  # fmt: skip
    if v.key in ("layout", "kv_layout"):
        value = getattr(case, v.key)
        if isinstance(value, str) and value != value.upper() and value.upper() in interface.TILING_LAYOUTS:
            return (f"{show(value)} is not a layout the operator knows (did you mean '{value.upper()}'? layout "
                    f"strings are upper case); {negative}")  # fmt: skip
    if v.key in ("actual_seq_lengths", "actual_seq_lengths_kv") and "TND" in v.message and "is null" in v.message:
        which = "query" if v.key == "actual_seq_lengths" else "key/value"
        return (f"{v.message}: add '{v.key}: [...]' to the case, one {which} length per batch entry (for example "
                f"'{v.key}: [1000, 333]'); {negative}")  # fmt: skip
    return None


def _release(r: _Reader) -> str:
    """Return the case's operator release: its `release:` key, else interface.DEFAULT_RELEASE."""
    value = r.get("release", interface.DEFAULT_RELEASE)
    text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    if text not in interface.RELEASES:
        raise r.error("release", f"{show(value)} is not a release bsa knows{_suggest(str(value), interface.RELEASES)}; "
                      f"allowed: {', '.join(interface.RELEASES)} (write 9.1.0 in quotes or as a string)")  # fmt: skip
    return text


def _null_layouts(r: _Reader, raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Return which layouts the call passes as null: `null_layouts: [q, kv]`, or an explicit `kv_layout: null`."""
    value = r.get("null_layouts", [])
    valid = isinstance(value, list) and all(isinstance(v, str) and v in interface.LAYOUT_KEYS for v in value)
    if not valid or len(set(value)) != len(value):
        raise r.error("null_layouts", f"{show(value)} is not a list of distinct 'q' (qInputLayout) and 'kv' "
                      "(kvInputLayout): the layouts the call passes as null pointers")  # fmt: skip
    nulls = set(value)
    if "kv_layout" in raw and raw["kv_layout"] is None:
        nulls.add("kv")
    return tuple(n for n in ("q", "kv") if n in nulls)


def _check_interface(r: _Reader, case: Case) -> Case:
    """Refuse interface violations the case does not expect; attach kernel-constraint warnings."""
    params = case_params(case)
    tensors = case.tensor_descs()
    undefined = interface.undefined_behaviour(params, tensors, case.release)
    if undefined:
        key = "tensors" if case.tensors else "layout"
        key = "null_layouts" if case.null_layouts and "layout" in undefined[0] else key
        raise r.error(key, f"{undefined[0]}: undefined behaviour, no status to expect (ops-transformer "
                      f"{case.release} reads it unchecked)")  # fmt: skip
    broken = interface.violations(params, tensors, case.release)
    if case.expect.ok:
        if broken:
            v = broken[0]
            key = v.key if v.key in CASE_KEYS or v.key != "query" or case.override("query") else "dtype"
            key = key if key in CASE_KEYS else f"tensors.{key}"
            raise r.error(key, _fix_first(case, v) or f"{v.message}: the operator returns {v.status}; "
                          f"set 'expect: {v.status}' for a negative case")  # fmt: skip
        warnings = (*interface.kernel_constraints(params, case_semantics(case)), *unreachable_kv_blocks(case))
        return dataclasses.replace(case, warnings=tuple(warnings))
    if not broken:
        raise r.error(
            "expect", f"expects {case.expect.name} ({case.expect.status}), but the case breaks no interface rule"
        )
    if broken[0].status != case.expect.status:
        v = broken[0]
        raise r.error(
            "expect", f"expects {case.expect.status}, but '{v.key}' ({v.message}) makes the operator return {v.status}"
        )
    return case
