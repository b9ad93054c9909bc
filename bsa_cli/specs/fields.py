"""Each key of a case and its checks: typed access to a raw case (`_Reader`), one reader per key or section.

Every reader returns the key's value as `Case` holds it, or raises a SpecError naming the file, the case,
the key (dotted for nested ones: `sparsity.mask`) and the bad value, with what is allowed and the closest
allowed word for a misspelt one. The key vocabularies (CASE_KEYS, SPARSITY_KEYS, ...), dtype names and
their aliases, and the bounds on values (MAX_DIM, INT64_LIMIT, MAX_MASK_BYTES) are here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..core.case import (
    ACLNN_STATUS,
    DTYPES,
    TENSOR_NAMES,
    Distribution,
    Expect,
    Init,
    Outliers,
    RowScale,
    Sink,
    Sparsity,
    TensorOverride,
)
from ..core.errors import DataError, SpecError, show, suggest
from ..core.untrusted import inside, read_regular
from ..inputs import ALIGNMENTS
from ..ops import interface
from ..standards import validate_settings

#: Other names of spec dtypes; names are read case-insensitively, with an optional 'torch.' or 'np.' prefix.
DTYPE_ALIASES = {
    **dict.fromkeys(("fp16", "half", "f16"), "float16"),
    **dict.fromkeys(("bf16", "bfloat"), "bfloat16"),
    **dict.fromkeys(("fp32", "float", "single", "f32"), "float32"),
    **dict.fromkeys(("fp64", "double", "f64"), "float64"),
    **{"u8": "uint8", "i8": "int8", "i32": "int32", "int": "int32", "i64": "int64", "long": "int64"},
    "boolean": "bool",
}
PATTERNS = ("dense", "random", "causal", "sliding_window", "strided", "explicit")
TENSORS = ("query", "key", "value", "dout")
CASE_KEYS = tuple(
    "name description layout kv_layout dtype batch num_heads num_kv_heads head_dim q_seq_len kv_seq_len "
    "actual_seq_lengths actual_seq_lengths_kv block_shape scale seed sparsity init expect seq_lengths_encoding "
    "lse_shape bnsd_lengths empty_row_lse mask_type pre_tokens next_tokens tensors compare matrix release "
    "null_layouts ops inner_precise softmax_lse_flag step_scales copies".split()
)
TENSOR_KEYS = ("dtype", "shape")
#: Largest tensor a `tensors:` shape override may ask for (elements): negative cases need no big data.
MAX_OVERRIDE_ELEMENTS = 1 << 26
SPARSITY_KEYS = ("pattern", "density", "window", "stride", "mask", "empty_rows", "per_head", "causal_alignment")
#: Sparsity keys that only some patterns use (`pattern` and `empty_rows` apply to every pattern); another
#: pattern refuses them, so a key that would change nothing is never written unseen.
PATTERN_KEYS = {
    "density": ("random",),
    "per_head": ("random",),
    "window": ("sliding_window", "strided"),
    "stride": ("strided",),
    "causal_alignment": ("causal", "sliding_window", "strided"),
    "mask": ("explicit",),
}
#: Value distributions: normal(mean, std), uniform(low, high), noisy (normal with the commercial standard's
#: outliers), and exact: the integers and halves in [low, high], each equally likely, which float16 and bfloat16
#: hold exactly (the forward's products are then exact).
DISTRIBUTIONS = ("normal", "uniform", "noisy", "exact")
#: Largest |low| or |high| of exact values: every half up to it is exact in bfloat16 (8 significant bits).
EXACT_LIMIT = 64.0
DIST_KEYS = ("distribution", "mean", "std", "low", "high", "outliers", "row_scale")
#: Keys that shape a distribution (what `init.logit_std` decides for query and key).
SHAPE_KEYS = ("distribution", "mean", "std", "low", "high")
INIT_KEYS = (*DIST_KEYS, *("query", "key", "value", "dout"), "sink", "logit_std")
OUTLIER_KEYS = ("fraction", "factor", "axis")
ROW_SCALE_KEYS = ("low", "high")
SINK_KEYS = ("token", "strength")
#: Largest explicit mask (.npy) read.
MAX_MASK_BYTES = 256 << 20

#: Largest size, length, head count, window or stride (the kernel's tiling counts in 32 bits).
MAX_DIM = 2**31 - 1

#: Integers passed to the operator (seed, mask_type, pre/next_tokens) lie in [-2^63, 2^63).
INT64_LIMIT = 2**63

#: Values converted while one spec file loads, by file or by the YAML value's identity: explicit masks and
#: length lists. Cases of one matrix (or of shared defaults) share them instead of each holding a copy.
_SHARED: dict[Any, Any] = {}


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


def read_dtype(r: _Reader, key: str, value: Any, allowed: str) -> str:
    """Return the dtype name that `value` names, or refuse it (with the likeliest name meant, and `allowed`)."""
    dtype = dtype_name(value)
    if dtype is None:
        raise r.error(key, f"{show(value)} is not allowed{_dtype_suggestion(value, DTYPES)}; allowed: {allowed}")
    return dtype


def _suggest(value: Any, choices: Iterable[str]) -> str:
    """Return `suggest` for a string value ('' for anything else)."""
    return suggest(value, choices) if isinstance(value, str) else ""


def _ints(value: Any, low: int, high: float = math.inf) -> bool:
    """Whether `value` is a list of integers (booleans are not) from `low` to `high`."""
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in value
    )


_Word = TypeVar("_Word", bound=str)


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

    def integer(self, key: str, default: int | None = None, *, minimum: int | None = 0, maximum: int = MAX_DIM) -> int:
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
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return float(value)  # '1e-3', 'inf', 'nan' and the like, when quoted
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, f"{show(value)} is not a number")
        try:
            return float(value)
        except OverflowError:
            raise self.error(key, f"{show(value)} is too large for a floating-point number") from None

    def choice(self, key: str, allowed: tuple[_Word, ...], default: _Word) -> _Word:
        value = self.raw.get(key, default)
        if value not in allowed:
            raise self.error(
                key, f"{show(value)} is not allowed{_suggest(value, allowed)}; allowed: {', '.join(allowed)}"
            )
        return allowed[allowed.index(value)]

    def lengths(self, key: str) -> tuple[int, ...] | None:
        value = self.raw.get(key)
        if value is None:
            return None
        shared = _SHARED.get(("lengths", id(value)))
        if shared is not None:
            return shared  # type: ignore[no-any-return]
        if not _ints(value, 0, MAX_DIM):
            raise self.error(key, f"{show(value)} is not a list of integers from 0 to {MAX_DIM} (one per batch)")
        if not value:
            raise self.error(key, "is empty: give one length per batch entry (at least one)")
        lengths = _SHARED[("lengths", id(value))] = tuple(value)
        return lengths


def refuse_unknown(r: _Reader, raw: Mapping[str, Any], keys: tuple[str, ...], prefix: str = "") -> None:
    """Refuse the first key of `raw` that is not one of `keys`, with the likeliest meant one."""
    for key in (key for key in raw if key not in keys):
        raise r.error(f"{prefix}{_key(key)}", f"unknown key{_suggest(key, keys)}; allowed: {', '.join(keys)}")


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
        refuse_unknown(r, value, TENSOR_KEYS, f"{key}.")
        raw_dtype = value.get("dtype")
        dtype = None if raw_dtype is None else read_dtype(r, f"{key}.dtype", raw_dtype, ", ".join(DTYPES))
        shape = value.get("shape")
        if shape is not None:
            if not _ints(shape, 0, MAX_DIM) or len(shape) > 8:
                raise r.error(
                    f"{key}.shape",
                    f"{show(shape)} is not a list of non-negative integers (up to 8, each at most {MAX_DIM})",
                )
            if math.prod(shape) > MAX_OVERRIDE_ELEMENTS:
                raise r.error(f"{key}.shape", f"{show(shape)} holds over {MAX_OVERRIDE_ELEMENTS} elements")
            shape = tuple(shape)
        overrides.append(TensorOverride(name, dtype=dtype, shape=shape))
    return tuple(overrides)


def _block_shape(r: _Reader, expect: Expect) -> tuple[int, ...]:
    value = r.get("block_shape", [128, 128])
    if _ints(value, 1, MAX_DIM) and len(value) == 2:
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
    refuse_unknown(r, raw, SPARSITY_KEYS, "sparsity.")
    sub = r.nested("sparsity", raw)
    pattern = sub.choice("pattern", PATTERNS, "dense")
    for key in raw:
        users = PATTERN_KEYS.get(key)
        if users is not None and pattern not in users:
            raise sub.error(
                key,
                f"pattern {show(pattern)} does not use it ({key} is for pattern {' or '.join(users)}); remove "
                f"it, or set pattern: {users[0]}",
            )
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
    elif _ints(empty_rows, 0):
        empty = tuple(empty_rows)
    elif empty_rows in ((), 0) and not isinstance(empty_rows, bool):
        empty = ()
    else:
        raise sub.error(
            "empty_rows",
            f"{show(empty_rows)} is neither a fraction in [0, 1] (like 0.25) nor a list of query-block row indices",
        )
    per_head = raw.get("per_head", True)
    if not isinstance(per_head, bool):
        raise sub.error("per_head", f"{show(per_head)} is not true or false")
    alignment = sub.choice("causal_alignment", ALIGNMENTS, "top_left")
    return Sparsity(pattern, density, window, stride, explicit, source, empty, per_head, alignment)


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
    else:
        try:
            array = np.array(value)
        except (ValueError, TypeError, OverflowError):
            raise r.error("mask", "is a ragged nested list: every row needs the same length") from None
    if array.ndim not in (2, 3, 4) or array.dtype.kind not in "biuf":  # bool, integers or floats
        raise r.error(
            "mask",
            f"needs 2 to 4 dimensions of 0/1 ([nQ, nKV], [N1, nQ, nKV] or [B, N1, nQ, nKV]), got shape "
            f"{list(array.shape)} of {array.dtype}",
        )
    if array.dtype != bool:
        bad = ~((array == 0) | (array == 1))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise r.error(
                "mask",
                f"holds {show(array[where].item())} at index {list(where)} (and "
                f"{int(bad.sum())} such values): a mask holds only 0 and 1",
            )
    selected = array != 0
    selected.setflags(write=False)
    source = value if isinstance(value, str) else "inline"
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
        raise r.error(
            "mask",
            f"{str(file)!r}: its header promises shape {list(shape)} {dtype} "
            f"({count * dtype.itemsize} bytes), the file holds {body} bytes",
        )
    return np.frombuffer(data, dtype=dtype, offset=stream.tell()).reshape(shape, order="F" if fortran else "C")


def _mapping(r: _Reader, key: str, raw: Any, keys: tuple[str, ...], what: str) -> _Reader:
    """Return a reader of the mapping `raw` under `key`, refusing a non-mapping or an unknown key."""
    if not isinstance(raw, dict):
        raise r.error(key, f"{show(raw)} is not a mapping of {what}")
    refuse_unknown(r, raw, keys, f"{key}.")
    return r.nested(key, raw)


#: The largest float32: a scaleValue beyond it overflows the float the kernel receives.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def scale_value(r: _Reader, key: str, default: float) -> float:
    """Return a scaleValue (`scale`, a chain step's in `step_scales`): a finite double whose float32 is finite."""
    scale = r.number(key, default)
    if not math.isfinite(scale):
        raise r.error(key, f"{show(scale)} must be a finite number")
    if abs(scale) > FLOAT32_MAX:
        raise r.error(
            key, f"{show(scale)} overflows float32 (the kernel receives float(scale)): the golden cannot be finite"
        )
    return scale


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
    sub = _mapping(r, key, raw, DIST_KEYS, "distribution keys")
    dist = Distribution(
        kind=sub.choice("distribution", DISTRIBUTIONS, "normal"),
        mean=sub.number("mean", 0.0),
        std=sub.number("std", 1.0),
        low=sub.number("low", -1.0),
        high=sub.number("high", 1.0),
    )
    if not all(math.isfinite(v) for v in (dist.mean, dist.std, dist.low, dist.high)):
        raise r.error(key, "distribution parameters must be finite numbers")
    if dist.std < 0:
        raise sub.error("std", f"{dist.std} is negative")
    if dist.low > dist.high:
        raise sub.error("low", f"low {dist.low} is above high {dist.high}")
    if dist.kind == "exact":
        for bound in ("low", "high"):
            value = getattr(dist, bound)
            if value * 2 != round(value * 2) or abs(value) > EXACT_LIMIT:
                shown = show(raw.get(bound, value))
                raise sub.error(bound, f"{shown} is not a half-integer within +-{EXACT_LIMIT:g} (exact values)")
        if raw.get("outliers") is not None or raw.get("row_scale") is not None:
            raise r.error(key, "exact values stay exact only without outliers or row_scale; drop one or the other")
    if raw.get("outliers") is not None:
        dist = dataclasses.replace(dist, outliers=_outliers(sub, "outliers", raw["outliers"]))
    if raw.get("row_scale") is not None:
        dist = dataclasses.replace(dist, row_scale=_row_scale(sub, "row_scale", raw["row_scale"]))
    return dist


def _init(r: _Reader) -> Init:
    raw = r.get("init", {})
    if not isinstance(raw, dict):
        raise r.error("init", f"{show(raw)} is not a mapping")
    refuse_unknown(r, raw, INIT_KEYS, "init.")
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
        sink = Sink(
            token=sub.integer("token", 0),
            strength=_positive(sub, "strength", 8.0, "a finite number > 0 (the sink's score in nats), like 8"),
        )
    logit_std = None
    if raw.get("logit_std") is not None:
        logit_std = _positive(
            r.nested("init", raw), "logit_std", 1.0, "a finite number > 0 (the std of scale * q.k), like 20 or 0.01"
        )
        for tensor in ("query", "key"):
            for k in SHAPE_KEYS:
                if k in (raw.get(tensor) or {}):
                    raise r.error(
                        f"init.{tensor}.{k}", "logit_std sets the distribution of query and key; give one or the other"
                    )
    return Init(**per_tensor, sink=sink, logit_std=logit_std)


def _compare(r: _Reader) -> dict[str, Any]:
    raw = r.get("compare", {})
    if not isinstance(raw, dict):
        raise r.error("compare", f"{show(raw)} is not a mapping (standard, thresholds)")
    try:
        validate_settings(raw)
    except ValueError as exc:
        raise r.error("compare", str(exc)) from None
    return dict(raw)


def _release(r: _Reader) -> str:
    """Return the case's operator release: its `release:` key, else interface.DEFAULT_RELEASE."""
    value = r.get("release", interface.DEFAULT_RELEASE)
    text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    if text not in interface.RELEASES:
        raise r.error(
            "release",
            f"{show(value)} is not a release bsa knows{_suggest(str(value), interface.RELEASES)}; "
            f"allowed: {', '.join(interface.RELEASES)} (write 9.1.0 in quotes or as a string)",
        )
    return text


def _null_layouts(r: _Reader, raw: Mapping[str, Any]) -> tuple[str, ...]:
    """Return which layouts the call passes as null: `null_layouts: [q, kv]`, or an explicit `kv_layout: null`."""
    value = r.get("null_layouts", [])
    valid = isinstance(value, list) and all(isinstance(v, str) and v in interface.LAYOUT_KEYS for v in value)
    if not valid or len(set(value)) != len(value):
        raise r.error(
            "null_layouts",
            f"{show(value)} is not a list of distinct 'q' (qInputLayout) and 'kv' "
            "(kvInputLayout): the layouts the call passes as null pointers",
        )
    nulls = set(value)
    if "kv_layout" in raw and raw["kv_layout"] is None:
        nulls.add("kv")
    return tuple(n for n in ("q", "kv") if n in nulls)
