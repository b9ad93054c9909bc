"""YAML case specs -> validated, frozen `Case` objects.

A spec file holds `cases:` (a list of mappings), optional `defaults:` merged into every case, and optional
`matrix:` (top level or per case) that expands a case over the cartesian product of listed values. Matrix
keys may be dotted (`sparsity.density`) to reach into a nested mapping.

Every error names the file, the case, the key and the bad value, and says what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from . import interface
from .case import (
    ACLNN_STATUS,
    DTYPES,
    MAX_TOKENS,
    TENSOR_NAMES,
    Case,
    Distribution,
    Expect,
    Init,
    Sparsity,
    TensorOverride,
)
from .errors import SpecError, suggest
from .inputs import fit_explicit
from .manifest import params as case_params
from .manifest import semantics as case_semantics

DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}
PATTERNS = ("dense", "random", "causal", "sliding_window", "strided", "explicit")
TENSORS = ("query", "key", "value", "dout")
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")

CASE_KEYS = (
    "name", "description", "layout", "kv_layout", "dtype", "batch", "num_heads", "num_kv_heads", "head_dim",
    "q_seq_len", "kv_seq_len", "actual_seq_lengths", "actual_seq_lengths_kv", "block_shape", "scale", "seed",
    "sparsity", "init", "expect", "seq_lengths_encoding", "lse_shape", "bnsd_lengths", "empty_row_lse",
    "mask_type", "pre_tokens", "next_tokens", "tensors", "compare", "matrix",
)  # fmt: skip
TENSOR_KEYS = ("dtype", "shape")
MAX_OVERRIDE_ELEMENTS = 1 << 26
"""Largest tensor a `tensors:` shape override may ask for (elements): negative cases need no big data."""
SPARSITY_KEYS = ("pattern", "density", "window", "stride", "mask", "empty_rows", "per_head")
DIST_KEYS = ("distribution", "mean", "std", "low", "high")
FILE_KEYS = ("cases", "defaults", "matrix")


def load_specs(paths: Iterable[str | Path]) -> list[Case]:
    """Load every case of the given spec files or folders (their `*.yaml`/`*.yml` files, sorted).

    Raises:
        SpecError: a file is unreadable or breaks a rule, or two cases share a name.
    """
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for file in spec_files(paths):
        for case in load_spec_file(file):
            if case.name in seen:
                raise SpecError(
                    str(file), f"duplicate case name (also in {seen[case.name]})", case=case.name, key="name"
                )
            seen[case.name] = str(file)
            cases.append(case)
    return cases


def spec_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand folders into their spec files; keep files as given."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                raise SpecError(str(path), "folder holds no *.yaml spec files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise SpecError(str(path), "no such spec file or folder")
    return files


def load_spec_file(path: Path) -> list[Case]:
    """Parse, expand and validate the cases of one spec file."""
    file = str(path)
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(file, f"not valid YAML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(file, f"cannot be read: {exc}") from None
    if not isinstance(document, dict):
        raise SpecError(file, "a spec file is a mapping with a 'cases:' list")
    for key in document:
        if key not in FILE_KEYS:
            raise SpecError(
                file, f"unknown top-level key '{key}'{suggest(str(key), FILE_KEYS)}; allowed: {', '.join(FILE_KEYS)}"
            )
    raw_cases = document.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise SpecError(file, "'cases:' must be a non-empty list of case mappings", key="cases")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError(file, "'defaults:' must be a mapping", key="defaults")
    file_matrix = document.get("matrix") or {}
    cases = []
    for index, raw in enumerate(raw_cases):
        label = str(raw["name"]) if isinstance(raw, dict) and isinstance(raw.get("name"), str) else f"#{index + 1}"
        if not isinstance(raw, dict):
            raise SpecError(file, "each entry of 'cases:' must be a mapping", case=label)
        merged = deep_merge(defaults, raw)
        matrix = {**_matrix(file, label, file_matrix), **_matrix(file, label, merged.pop("matrix", None) or {})}
        for variant, suffix in expand_matrix(file, label, merged, matrix):
            cases.append(build_case(path, variant, suffix))
    return cases


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` updated by `override`, merging nested mappings key by key."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _matrix(file: str, case: str, matrix: Any) -> dict[str, list[Any]]:
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise SpecError(file, "'matrix:' maps keys to non-empty lists of values", case=case, key="matrix")
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
                file, f"matrix key '{key}' is not a case key{suggest(top, CASE_KEYS)}", case=case, key="matrix"
            )
    variants = []
    for values in itertools.product(*(matrix[k] for k in keys)):
        variant = copy.deepcopy(raw)
        for key, value in zip(keys, values, strict=True):
            *parents, leaf = key.split(".")
            node = variant
            for parent in parents:
                node = node.setdefault(parent, {})
                if not isinstance(node, dict):
                    raise SpecError(file, f"matrix key '{key}' reaches into a non-mapping", case=case, key="matrix")
            node[leaf] = copy.deepcopy(value)
        variants.append((variant, "." + ".".join(_label(v) for v in values)))
    return variants


def _label(value: Any) -> str:
    """Render a matrix value as a readable name part: [16, 48] -> 16x48, bfloat16 -> bf16."""
    if isinstance(value, (list, tuple)):
        return "x".join(_label(v) for v in value)
    if isinstance(value, dict):
        return "-".join(f"{k}{_label(v)}" for k, v in value.items())
    text = {"float16": "fp16", "bfloat16": "bf16"}.get(str(value), str(value))
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

    def integer(self, key: str, default: int | None = None, *, minimum: int | None = 0) -> int:
        value = self.raw.get(key, default)
        if value is None:
            raise self.error(key, "is required: give an integer")
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, f"{value!r} is not an integer")
        if minimum is not None and value < minimum:
            raise self.error(key, f"{value} is below the minimum {minimum}")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf", "nan"):
            return float(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, f"{value!r} is not a number")
        return float(value)

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.raw.get(key, default)
        if value not in allowed:
            raise self.error(
                key, f"{value!r} is not allowed{suggest(str(value), allowed)}; allowed: {', '.join(allowed)}"
            )
        return str(value)

    def lengths(self, key: str) -> tuple[int, ...] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise self.error(key, f"{value!r} is not a list of non-negative integers (one per batch)")
        return tuple(value)


def build_case(path: Path, raw: dict[str, Any], suffix: str = "") -> Case:
    """Validate one expanded raw case and return it as a `Case`."""
    base_name = raw.get("name")
    r = _Reader(path, raw, str(base_name) if base_name is not None else "?")
    if not isinstance(base_name, str) or not base_name:
        raise r.error("name", "every case needs a 'name' (letters, digits, '_', '.', '-')")
    name = base_name + suffix
    r.case = name
    if not NAME_RE.match(name):
        raise r.error("name", f"{name!r} may hold only letters, digits, '_', '.', '-'")
    for key in raw:
        if key not in CASE_KEYS:
            raise r.error(str(key), f"unknown key{suggest(str(key), CASE_KEYS)}; allowed: {', '.join(CASE_KEYS)}")

    expect = _expect(r)
    layout = r.get("layout", "BNSD")
    kv_layout = r.get("kv_layout")
    if not isinstance(layout, str):
        raise r.error("layout", f"{layout!r} is not a string; allowed: BNSD, TND")
    dtype = r.get("dtype", "float16")
    dtype = DTYPE_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in DTYPES:
        raise r.error("dtype", f"{dtype!r} is not allowed{suggest(str(dtype), [*DTYPES, *DTYPE_ALIASES])}; "
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
                raise r.error("batch", f"{raw['batch']!r} differs from the {batch} entries of actual_seq_lengths")
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
                raise r.error(key, f"{list(lengths)}: a length exceeds the sequence dimension {limit}")
    for key, lengths in (("actual_seq_lengths", q_lengths), ("actual_seq_lengths_kv", kv_lengths)):
        if lengths is not None and len(lengths) != batch:
            raise r.error(key, f"has {len(lengths)} entries, but batch is {batch}: give one length per batch")
    block_shape = _block_shape(r, expect)
    scale = r.number("scale", 1.0 / math.sqrt(head_dim))
    if not math.isfinite(scale):
        raise r.error("scale", f"{scale!r} must be a finite number")

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
        seed=r.integer("seed", 0),
        sparsity=_sparsity(r, path),
        init=_init(r),
        expect=expect,
        seq_lengths_encoding=r.choice("seq_lengths_encoding", ("per_batch", "cumulative"), "per_batch"),
        lse_shape=r.choice("lse_shape", ("trailing_one", "squeezed"), "trailing_one"),
        bnsd_lengths=r.choice("bnsd_lengths", ("honored", "ignored"), "honored"),
        empty_row_lse=r.number("empty_row_lse", math.inf),
        mask_type=r.integer("mask_type", 0, minimum=None),
        pre_tokens=r.integer("pre_tokens", MAX_TOKENS, minimum=None),
        next_tokens=r.integer("next_tokens", MAX_TOKENS, minimum=None),
        tensors=_tensors(r),
        compare=_compare(r),
    )
    if case.sparsity.explicit is not None:
        try:
            fit_explicit(case.sparsity.explicit, case.mask_shape)
        except ValueError as exc:
            raise r.error("sparsity.mask", str(exc)) from None
    return _check_interface(r, case)


def _expect(r: _Reader) -> Expect:
    value = r.get("expect", "ok")
    if value in ("ok", 0, "ACLNN_SUCCESS"):
        return Expect()
    for name, code in ACLNN_STATUS.items():
        if value in (name, code) and code != 0:
            return Expect(status=code, name=name)
    allowed = ", ".join(f"{n} ({c})" for n, c in ACLNN_STATUS.items() if c)
    raise r.error("expect", f"{value!r} is not allowed{suggest(str(value), ACLNN_STATUS)}; allowed: ok, {allowed}")


def _tensors(r: _Reader) -> tuple[TensorOverride, ...]:
    """Read `tensors:`: {name: null (a null pointer) | {dtype: ..., shape: [...]}} for the call's tensors."""
    raw = r.get("tensors", {})
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise r.error("tensors", f"{raw!r} is not a mapping of tensor names to null or {{dtype, shape}}")
    overrides = []
    for name, value in raw.items():
        key = f"tensors.{name}"
        if name not in TENSOR_NAMES:
            raise r.error(key, f"unknown tensor{suggest(str(name), TENSOR_NAMES)}; allowed: {', '.join(TENSOR_NAMES)}")
        if value is None:
            if name == "atten_mask":
                raise r.error(key, "attenMask is null already; give {dtype: bool} to pass one")
            overrides.append(TensorOverride(name, null=True))
            continue
        if not isinstance(value, dict) or not value:
            raise r.error(key, f"{value!r} is neither null (a null pointer) nor a mapping with dtype and/or shape")
        for sub in value:
            if sub not in TENSOR_KEYS:
                raise r.error(f"{key}.{sub}", f"unknown key{suggest(str(sub), TENSOR_KEYS)}; allowed: dtype, shape")
        dtype = value.get("dtype")
        if dtype is not None:
            dtype = DTYPE_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
            if dtype not in DTYPES:
                raise r.error(f"{key}.dtype", f"{dtype!r} is not allowed{suggest(str(dtype), DTYPES)}; "
                              f"allowed: {', '.join(DTYPES)}")  # fmt: skip
        shape = value.get("shape")
        if shape is not None:
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                raise r.error(f"{key}.shape", f"{shape!r} is not a list of non-negative integers")
            if math.prod(shape) > MAX_OVERRIDE_ELEMENTS:
                raise r.error(f"{key}.shape", f"{shape!r} holds over {MAX_OVERRIDE_ELEMENTS} elements")
            shape = tuple(shape)
        overrides.append(TensorOverride(name, dtype=dtype, shape=shape))
    return tuple(overrides)


def _block_shape(r: _Reader, expect: Expect) -> tuple[int, ...]:
    value = r.get("block_shape", [128, 128])
    valid = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )
    if valid:
        return tuple(value)
    if not expect.ok and value is None:
        return ()  # a negative case passing a null blockShape
    if not expect.ok and isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)  # a negative case breaking the block-shape rule on purpose
    raise r.error("block_shape", f"{value!r} is not [X, Y] with two positive integers")


def _sparsity(r: _Reader, path: Path) -> Sparsity:
    raw = r.get("sparsity", {"pattern": "dense"})
    if isinstance(raw, str):
        raw = {"pattern": raw}
    if not isinstance(raw, dict):
        raise r.error("sparsity", f"{raw!r} is not a mapping with a 'pattern'")
    for key in raw:
        if key not in SPARSITY_KEYS:
            raise r.error(
                f"sparsity.{key}", f"unknown key{suggest(str(key), SPARSITY_KEYS)}; allowed: {', '.join(SPARSITY_KEYS)}"
            )
    sub = r.nested("sparsity", raw)
    pattern = sub.choice("pattern", PATTERNS, "dense")
    density = sub.number("density", 0.5)
    if not 0.0 <= density <= 1.0:
        raise sub.error("density", f"{density} is not within [0, 1]")
    window = sub.integer("window", 1, minimum=1)
    stride = sub.integer("stride", 4, minimum=1)
    explicit, source = None, None
    if pattern == "explicit":
        explicit, source = _explicit_mask(sub, path)
    elif "mask" in raw:
        raise sub.error("mask", "is only used with pattern: explicit")
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
        raise sub.error("empty_rows", f"{empty_rows!r} is neither a fraction in [0, 1] (like 0.25) "
                        "nor a list of query-block row indices")  # fmt: skip
    per_head = raw.get("per_head", True)
    if not isinstance(per_head, bool):
        raise sub.error("per_head", f"{per_head!r} is not true or false")
    return Sparsity(pattern=pattern, density=density, window=window, stride=stride, explicit=explicit,
                    explicit_source=source, empty_rows=empty, per_head=per_head)  # fmt: skip


def _explicit_mask(r: _Reader, path: Path) -> tuple[np.ndarray, str]:
    value = r.get("mask")
    if value is None:
        raise r.error(
            "mask", "pattern explicit needs 'mask': a nested list of 0/1, or a .npy path relative to the spec"
        )
    if isinstance(value, str):
        file = path.parent / value
        try:
            array = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise r.error("mask", f"cannot load {str(file)!r} as a .npy array: {exc}") from None
        source = value
    else:
        try:
            array = np.array(value)
        except ValueError:
            raise r.error("mask", "is a ragged nested list: every row needs the same length") from None
        source = "inline"
    if (
        array.dtype == object
        or array.ndim not in (2, 3, 4)
        or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool)
    ):
        raise r.error(
            "mask",
            f"needs 2 to 4 dimensions of 0/1 ([nQ, nKV], [N1, nQ, nKV] or [B, N1, nQ, nKV]), got shape {array.shape}",
        )
    return array != 0, source


def _distribution(r: _Reader, key: str, raw: Mapping[str, Any]) -> Distribution:
    for k in raw:
        if k not in DIST_KEYS:
            raise r.error(f"{key}.{k}", f"unknown key{suggest(str(k), DIST_KEYS)}; allowed: {', '.join(DIST_KEYS)}")
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
    return dist


def _init(r: _Reader) -> Init:
    raw = r.get("init", {})
    if not isinstance(raw, dict):
        raise r.error("init", f"{raw!r} is not a mapping")
    for key in raw:
        if key not in (*DIST_KEYS, *TENSORS):
            raise r.error(f"init.{key}", f"unknown key{suggest(str(key), (*DIST_KEYS, *TENSORS))}; "
                          f"allowed: {', '.join((*DIST_KEYS, *TENSORS))}")  # fmt: skip
    base = {k: v for k, v in raw.items() if k in DIST_KEYS}
    per_tensor = {}
    for tensor in TENSORS:
        override = raw.get(tensor, {})
        if not isinstance(override, dict):
            raise r.error(f"init.{tensor}", f"{override!r} is not a mapping of distribution keys")
        per_tensor[tensor] = _distribution(r, f"init.{tensor}" if override else "init", {**base, **override})
    return Init(**per_tensor)


def _compare(r: _Reader) -> dict[str, Any]:
    raw = r.get("compare", {})
    if not isinstance(raw, dict):
        raise r.error("compare", f"{raw!r} is not a mapping (standard, thresholds)")
    try:
        from .compare import validate_settings
    except ImportError:  # the comparator is not installed in this build; pass the settings through
        return dict(raw)
    try:
        validate_settings(raw)
    except ValueError as exc:
        raise r.error("compare", str(exc)) from None
    return dict(raw)


def _check_interface(r: _Reader, case: Case) -> Case:
    """Refuse interface violations the case does not expect; attach kernel-constraint warnings."""
    params = case_params(case)
    tensors = case.tensor_descs()
    undefined = interface.undefined_behaviour(params, tensors)
    if undefined:
        raise r.error("tensors" if case.tensors else "layout", f"{undefined[0]}: undefined behaviour, "
                      "no status to expect (ops-transformer master reads it unchecked)")  # fmt: skip
    broken = interface.violations(params, tensors)
    if case.expect.ok:
        if broken:
            v = broken[0]
            key = v.key if v.key in CASE_KEYS or v.key != "query" or case.override("query") else "dtype"
            key = key if key in CASE_KEYS else f"tensors.{key}"
            raise r.error(key, f"{v.message}: the operator returns {v.status}; "
                          f"set 'expect: {v.status}' for a negative case")  # fmt: skip
        warnings = tuple(interface.kernel_constraints(params, case_semantics(case)))
        return dataclasses.replace(case, warnings=warnings)
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
