"""Judge a device's dq, dk, dv against the golden: metrics, standards, structural checks, verdicts.

Nothing here prints. `compare_suite` reads case directories and device output directories and returns a
`SuiteResult`; `report.py` renders it. The pure core is `judge_tensors` (arrays in, `TensorResult`s out).

Standards (docs/compare.md documents them for users; docs/operator.md section 4 has the sources):

* `double-benchmark` (default): CANN/ATK. Each error metric of the device against the golden is divided by
  the same metric of the benchmark (the kernel-faithful result in the case dtype written by `bsa gen`),
  floored at `err_thd`: MARE, MERE and RMSE ratios, and a small-value error count ratio. bsa adds a
  localized check, `tile_ratio`: the RMSE ratio of every 16x16 tile of every block (the cube unit's
  fractal), so a precision bug confined to one tile cannot hide in the tensor-wide means.
  Preset `double-benchmark:fa` has the stricter flash-attention limits 2 / 1.2 / 1.2.
* `single`: MERE < T and MARE < 10 T (relative error |a - g| / (|g| + 1e-7) over all elements).
* `allclose`: at most a fraction `mismatch` of elements with |a - g| > atol + rtol |g|; or msOpST's
  form (`allclose:msopst`, or any of diff_thd / pct_thd / max_diff given).
* `fa-ratio`: max abs error <= k x the benchmark's max abs error + an ULP-sized floor (FlashAttention 3).

Structural checks run under every standard: NaN/Inf where the golden has none; dq rows of empty query
rows and dk/dv rows of never-selected kv positions exactly 0 (`zero_atol` relaxes); padding rows of BNSD
cases whose actual lengths are honored are ignored, or required to be 0 with `padding: zero`.

Settings precedence, for each case (one rule, also in docs/compare.md):

1. standard: `--standard` > the case's `compare.standard` (from its spec) > `double-benchmark`;
2. thresholds: the standard's defaults for the case dtype (with its preset) < the case's
   `compare.thresholds` (dropped, except the general keys, when `--standard` names another standard)
   < `--threshold`; a `--threshold` key the case's standard does not know is a usage error;
3. padding: `--padding` > the case's `compare.padding` > `ignore`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .case import ACLNN_STATUS, Case, numpy_dtype
from .errors import DataError, clip, show, suggest
from .layout import mask_view
from .manifest import GRAD_NAMES, case_from_manifest, json_number
from .store import (
    MANIFEST,
    OUTPUTS_DIR,
    check_output_dir,
    entry_path,
    inside,
    iter_entries,
    load_manifest,
    map_array,
    map_read_only,
    read_regular,
    sha256_file,
)
from .workers import cpu_count, worker_pool

__all__ = [
    "DEFAULT_STANDARD",
    "STANDARDS",
    "BlockMap",
    "CaseResult",
    "Check",
    "DeviceOutcome",
    "ErrorStats",
    "HotBlock",
    "RunSettings",
    "Settings",
    "SuiteResult",
    "TensorResult",
    "WorstElement",
    "compare_case",
    "compare_suite",
    "judge_outcome",
    "judge_tensors",
    "resolve_settings",
    "validate_settings",
]

STATUS_FILE = "status.txt"
RUN_RECORD = "run.json"
PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"

# ---- standards and settings ---------------------------------------------------------------------

ERR_THD = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-14}
"""ATK's err_thd: the floor of benchmark errors, and the |golden| above which relative errors count."""
SMALL_VALUE_THD = {"float16": 2.0**-16, "bfloat16": 2.0**-16, "float32": 2.0**-30}
"""ATK's small-value rule: an element with |golden| <= err_thd is an error when |a - g| exceeds this."""
SINGLE_T = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-13}
"""The single-reference standard's T per dtype."""
ALLCLOSE_TOL = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5)}
"""torch.testing.assert_close defaults (rtol, atol) per dtype."""

TILE = 16
"""Side of the cube unit's fractal: the tile the localized check and the hot-block map work in."""


@dataclass(frozen=True)
class Standard:
    """A named comparison standard: its threshold keys (with their meaning) and presets."""

    name: str
    summary: str
    keys: Mapping[str, str]
    presets: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    needs_benchmark: bool = False


GENERAL_KEYS: dict[str, str] = {
    "zero_atol": "largest |value| allowed where the output must be 0 (empty rows, never-selected kv "
    "positions, zero padding); default 0 (exactly 0); inf turns those checks off",
    "rtol": "relative tolerance of the mismatch count (torch assert_close default of the dtype)",
    "atol": "absolute tolerance of the mismatch count (torch assert_close default of the dtype)",
}
"""Threshold keys every standard accepts."""

STANDARDS: dict[str, Standard] = {
    s.name: s
    for s in (
        Standard(
            "double-benchmark",
            "CANN/ATK: device error / max(benchmark error, err_thd) for MARE, MERE, RMSE, small-value "
            "errors; and per 16x16 tile RMSE ratio",
            {
                "mare_ratio": "limit of max relative error ratio (default 10)",
                "mere_ratio": "limit of mean relative error ratio (default 2)",
                "rmse_ratio": "limit of RMSE ratio (default 2)",
                "small_value_ratio": "limit of small-value error count ratio, device / max(benchmark, 1) (default 2)",
                "err_thd": "error floor and large-value bound (2^-11 fp16, 2^-8 bf16)",
                "small_value_thd": "error bound of small values (2^-16)",
                "tile_ratio": "limit of any 16x16 tile's RMSE ratio (default 3; inf turns it off)",
                "tile_floor": "a tile's benchmark RMSE is floored at this fraction of the tensor's (default 0.1)",
            },
            {"fa": {"mare_ratio": 2.0, "mere_ratio": 1.2, "rmse_ratio": 1.2}},
            needs_benchmark=True,
        ),
        Standard(
            "single",
            "CANN single reference: MERE < T and MARE < 10 T",
            {
                "mere": "limit of mean relative error (T: 2^-10 fp16, 2^-7 bf16)",
                "mare": "limit of max relative error (default 10 x mere)",
            },
        ),
        Standard(
            "allclose",
            "|a - g| <= atol + rtol |g| for all but a fraction `mismatch` of elements; or msOpST's "
            "[diff_thd, pct_thd] form",
            {
                "mismatch": "allowed fraction of mismatched elements (default 0)",
                "diff_thd": "msOpST: per-element error bound, absolute below it, relative above (default 0.01)",
                "pct_thd": "msOpST: allowed fraction of elements over diff_thd (default 0.05)",
                "max_diff": "msOpST: the largest element error must stay below this (default 0.1)",
            },
            {"msopst": {"diff_thd": 0.01, "pct_thd": 0.05, "max_diff": 0.1}},
        ),
        Standard(
            "fa-ratio",
            "FlashAttention: max abs error <= k x benchmark max abs error + ULP floor",
            {
                "k": "factor on the benchmark's max abs error (default 3, FlashAttention's for gradients)",
                "floor_factor": "ULP floor: this times max |(g + 0.3) - 0.3 - g| in the case dtype (default 2)",
            },
            needs_benchmark=True,
        ),
    )
}
"""The comparison standards by name."""

DEFAULT_STANDARD = "double-benchmark"
PADDING_MODES = ("ignore", "zero")
SETTINGS_KEYS = ("standard", "thresholds", "padding")
_MSOPST_KEYS = ("diff_thd", "pct_thd", "max_diff")


def parse_standard(text: str) -> tuple[str, str | None]:
    """Split 'name' or 'name:preset' and check both.

    Raises:
        ValueError: unknown standard or preset, with the allowed names.
    """
    if not isinstance(text, str):
        raise ValueError(f"standard {text!r} is not a name; allowed: {', '.join(_standard_names())}")
    name, _, preset = text.partition(":")
    if name not in STANDARDS:
        raise ValueError(
            f"unknown standard {text!r}{suggest(name, STANDARDS)}; allowed: {', '.join(_standard_names())}"
        )
    presets = STANDARDS[name].presets
    if preset and preset not in presets:
        allowed = ", ".join(f"{name}:{p}" for p in presets) or "none"
        raise ValueError(f"standard {name!r} has no preset {preset!r}{suggest(preset, presets)}; presets: {allowed}")
    if not preset and ":" in text:
        raise ValueError(f"standard {text!r} has an empty preset; write {name!r}")
    return name, preset or None


def _standard_names() -> list[str]:
    names = []
    for name, standard in STANDARDS.items():
        names.append(name)
        names.extend(f"{name}:{p}" for p in standard.presets)
    return names


def threshold_keys(standard: str) -> list[str]:
    """Return the threshold keys a standard accepts (its own and the general ones)."""
    return [*STANDARDS[standard].keys, *GENERAL_KEYS]


def _check_thresholds(standard: str, thresholds: Any, origin: str = "thresholds") -> dict[str, float]:
    """Return thresholds as floats after checking their keys against `standard` and their values."""
    if not isinstance(thresholds, Mapping):
        raise ValueError(f"{origin} must be a mapping of key: number, got {thresholds!r}")
    allowed = threshold_keys(standard)
    checked = {}
    for key, value in thresholds.items():
        if key not in allowed:
            raise ValueError(
                f"threshold {key!r} does not apply to standard {standard!r}{suggest(str(key), allowed)}; "
                f"its keys: {', '.join(allowed)}"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
            raise ValueError(f"threshold {key!r} must be a number >= 0 (inf allowed), got {value!r}")
        checked[str(key)] = float(value)
    if standard == "allclose":
        msopst = [k for k in _MSOPST_KEYS if k in checked]
        if msopst and "mismatch" in checked:
            raise ValueError(
                "allclose takes either mismatch (with rtol/atol) or msOpST's diff_thd/pct_thd/max_diff, "
                f"not both (got mismatch and {', '.join(msopst)})"
            )
    return checked


def validate_settings(settings: Mapping[str, Any]) -> None:
    """Check a case's `compare:` settings: {standard: NAME[:PRESET], thresholds: {key: number}, padding}.

    Thresholds are checked against the given standard, or the default one when none is given.

    Raises:
        ValueError: an unknown key, standard, preset or threshold key, or a bad value; the message lists
            what is allowed.
    """
    if not isinstance(settings, Mapping):
        raise ValueError(f"compare settings must be a mapping with keys {', '.join(SETTINGS_KEYS)}")
    for key in settings:
        if key not in SETTINGS_KEYS:
            raise ValueError(
                f"unknown compare key {key!r}{suggest(str(key), SETTINGS_KEYS)}; allowed: {', '.join(SETTINGS_KEYS)}"
            )
    name, preset = parse_standard(settings.get("standard", DEFAULT_STANDARD))
    thresholds = _check_thresholds(name, settings.get("thresholds") or {})
    if preset == "msopst" and "mismatch" in thresholds:
        raise ValueError("allclose:msopst does not take mismatch (it uses diff_thd and pct_thd)")
    padding = settings.get("padding", "ignore")
    if padding not in PADDING_MODES:
        raise ValueError(f"padding {padding!r} is not one of {', '.join(PADDING_MODES)}")


@dataclass(frozen=True)
class RunSettings:
    """Comparison settings given for a whole run (the command line); None/empty: the case decides."""

    standard: str | None = None
    thresholds: Mapping[str, float] = field(default_factory=dict)
    padding: str | None = None

    def validate(self) -> None:
        """Check the run's settings on their own.

        Raises:
            ValueError: a bad standard or padding, or a threshold key no standard knows (without
                `standard`) or that the given standard does not know.
        """
        if self.padding is not None and self.padding not in PADDING_MODES:
            raise ValueError(f"padding {self.padding!r} is not one of {', '.join(PADDING_MODES)}")
        if self.standard is not None:
            name, preset = parse_standard(self.standard)
            checked = _check_thresholds(name, dict(self.thresholds))
            if preset == "msopst" and "mismatch" in checked:
                raise ValueError("allclose:msopst does not take mismatch (it uses diff_thd and pct_thd)")
            return
        known = {k for s in STANDARDS for k in threshold_keys(s)}
        for key, value in self.thresholds.items():
            if key not in known:
                raise ValueError(f"unknown threshold {key!r}{suggest(key, known)}; keys: {', '.join(sorted(known))}")
            _check_thresholds(next(s for s in STANDARDS if key in threshold_keys(s)), {key: value})


@dataclass(frozen=True)
class Settings:
    """The resolved comparison settings of one case."""

    standard: str  # base name, a key of STANDARDS
    preset: str | None
    thresholds: Mapping[str, float]  # every key the standard uses, resolved
    padding: str  # ignore | zero
    origin: Mapping[str, str]  # "standard", "padding" and each threshold key -> default|preset|case|cli

    @property
    def label(self) -> str:
        return f"{self.standard}:{self.preset}" if self.preset else self.standard

    @property
    def msopst(self) -> bool:
        """Whether an allclose standard uses msOpST's form."""
        return self.standard == "allclose" and "diff_thd" in self.thresholds


def default_thresholds(standard: str, dtype: str, preset: str | None = None) -> dict[str, float]:
    """Return a standard's thresholds for a dtype before any override (with `preset` applied)."""
    rtol, atol = ALLCLOSE_TOL.get(dtype, ALLCLOSE_TOL["float32"])
    general = {"zero_atol": 0.0, "rtol": rtol, "atol": atol}
    if standard == "double-benchmark":
        values = {
            "mare_ratio": 10.0,
            "mere_ratio": 2.0,
            "rmse_ratio": 2.0,
            "small_value_ratio": 2.0,
            "err_thd": ERR_THD.get(dtype, ERR_THD["float32"]),
            "small_value_thd": SMALL_VALUE_THD.get(dtype, SMALL_VALUE_THD["float32"]),
            "tile_ratio": 3.0,
            "tile_floor": 0.1,
        }
    elif standard == "single":
        t = SINGLE_T.get(dtype, SINGLE_T["float32"])
        values = {"mere": t, "mare": 10 * t}
    elif standard == "allclose":
        values = {"mismatch": 0.0}
    elif standard == "fa-ratio":
        values = {"k": 3.0, "floor_factor": 2.0}
    else:
        raise ValueError(f"unknown standard {standard!r}")
    if preset:
        preset_values = dict(STANDARDS[standard].presets[preset])
        if standard == "allclose" and preset == "msopst":
            values.pop("mismatch")
        values.update(preset_values)
    return {**values, **general}


def resolve_settings(dtype: str, case_settings: Mapping[str, Any] | None, run: RunSettings) -> Settings:
    """Combine a case's `compare` settings with the run's, by the precedence in this module's docstring.

    Raises:
        ValueError: the case's settings are invalid, or a run threshold does not apply to the standard
            the case is judged by.
    """
    case_settings = dict(case_settings or {})
    validate_settings(case_settings)
    origin: dict[str, str] = {}
    if run.standard is not None:
        name, preset = parse_standard(run.standard)
        origin["standard"] = "cli"
    elif "standard" in case_settings:
        name, preset = parse_standard(case_settings["standard"])
        origin["standard"] = "case"
    else:
        name, preset = DEFAULT_STANDARD, None
        origin["standard"] = "default"
    case_standard = parse_standard(case_settings.get("standard", DEFAULT_STANDARD))[0]
    thresholds = default_thresholds(name, dtype, None)
    origin.update(dict.fromkeys(thresholds, "default"))
    if preset:
        for key, value in default_thresholds(name, dtype, preset).items():
            if thresholds.get(key) != value or key not in thresholds:
                origin[key] = "preset"
        thresholds = default_thresholds(name, dtype, preset)
        origin = {k: v for k, v in origin.items() if k in thresholds or k == "standard"}
    for key, value in (case_settings.get("thresholds") or {}).items():
        if case_standard == name or key in GENERAL_KEYS:
            thresholds[key] = float(value)
            origin[key] = "case"
    for key, value in run.thresholds.items():
        if key not in threshold_keys(name):
            raise ValueError(
                f"--threshold {key}: does not apply to standard {name!r} that judges this case; "
                f"its keys: {', '.join(threshold_keys(name))} (pass --standard to judge every case by one standard)"
            )
        thresholds[key] = float(value)
        origin[key] = "cli"
    if name == "allclose":
        given = {k for k, o in origin.items() if o in ("case", "cli")}
        if preset == "msopst" or any(k in given for k in _MSOPST_KEYS):
            if "mismatch" in given:
                raise ValueError("allclose takes either mismatch or msOpST's diff_thd/pct_thd/max_diff, not both")
            thresholds.pop("mismatch", None)
            origin.pop("mismatch", None)
            for key, value in STANDARDS["allclose"].presets["msopst"].items():
                thresholds.setdefault(key, value)
                origin.setdefault(key, "preset")
    if name == "single" and "mare" not in {k for k, o in origin.items() if o in ("case", "cli")}:
        thresholds["mare"] = 10 * thresholds["mere"]
    padding = run.padding or case_settings.get("padding") or "ignore"
    origin["padding"] = "cli" if run.padding else "case" if case_settings.get("padding") else "default"
    return Settings(name, preset, thresholds, padding, origin)


# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One pass/fail decision: a metric of a tensor (or the case) against a limit.

    `severity` is value / limit for upper limits (above 1 fails), so checks of different kinds can be
    ranked; structural checks that fail have severity inf.
    """

    name: str
    tensor: str | None
    value: float
    limit: float | None
    passed: bool
    detail: str
    severity: float = 0.0


@dataclass(frozen=True)
class ErrorStats:
    """Error metrics of one array (device or benchmark) against the golden, over the judged elements.

    Relative errors: `max_rel_err`/`mean_rel_err` are ATK's (|a - g| / |g| over |g| > err_thd);
    `mare`/`mere` are the single standard's (|a - g| / (|g| + 1e-7) over all elements). ULP errors are
    msprobe's, |a - g| / ulp(g) with ulp(g) the golden's unit in the last place in the case dtype, except
    that |g| is floored at err_thd (`_ulp_floor`: a golden that cancelled to nearly 0 would otherwise
    give astronomical counts, 10^33 in bfloat16). Non-finite
    elements are counted and left out of every numeric metric. Metrics only the device needs are None
    for the benchmark.
    """

    count: int
    max_abs_err: float
    mean_abs_err: float
    rmse: float
    max_rel_err: float
    mean_rel_err: float
    large_count: int
    small_value_count: int
    small_value_err_count: int
    nan_count: int
    inf_count: int
    nonfinite_mismatch: int
    mare: float | None = None
    mere: float | None = None
    cosine: float | None = None
    mismatch_count: int | None = None
    mismatch_ratio: float | None = None
    ulp_max: float | None = None
    ulp_mean: float | None = None
    ulp_histogram: tuple[int, ...] | None = None
    msopst_err_count: int | None = None
    msopst_max_err: float | None = None
    # msprobe's compare figures (device only): fractions of elements whose relative error |a - g| / (|g| + 1e-7)
    # is below 0.001 and 0.005, and the values' statistics of both sides (finite elements).
    thousandth_ratio: float | None = None
    five_thousandths_ratio: float | None = None
    value_max: float | None = None
    value_min: float | None = None
    value_mean: float | None = None
    value_l2norm: float | None = None
    golden_max: float | None = None
    golden_min: float | None = None
    golden_mean: float | None = None
    golden_l2norm: float | None = None


MSPROBE_FIELDS = ("thousandth_ratio", "five_thousandths_ratio", "value_max", "value_min", "value_mean",
                  "value_l2norm", "golden_max", "golden_min", "golden_mean", "golden_l2norm")  # fmt: skip
"""`ErrorStats` fields added for msprobe's CSV: a benchmark summary written before them may lack them."""


@dataclass(frozen=True)
class WorstElement:
    """One of the largest absolute errors: where it is and what the three results say there."""

    index: tuple[int, ...]  # in the tensor's layout
    coords: Mapping[str, int]  # b, n, s, d (BNSD) or t, n, d and the b, s they map to (TND)
    block: int  # q block i (dq) or kv block j (dk/dv)
    device: float
    golden: float
    benchmark: float | None
    abs_err: float
    ulp: float


@dataclass(frozen=True)
class HotBlock:
    """A block of the error map with its score; for dq a query block i, for dk/dv a kv block j."""

    batch: int
    head: int  # query head n (dq) or kv head n2 (dk/dv)
    block: int
    rows: tuple[int, int]  # positions [start, stop) in the sequence
    score: float
    rmse: float
    rmse_benchmark: float | None
    max_abs_err: float
    tile: tuple[int, int] | None  # worst 16x16 tile: (first row in the sequence, first column)
    tile_ratio: float | None
    tiles: np.ndarray | None = None  # each 16x16 tile's ratio [tile rows, tile cols]: hottest block of a failure


@dataclass(frozen=True)
class BlockMap:
    """Errors aggregated per block: arrays [B, heads, max blocks], NaN where a batch entry has no block.

    `score` ranks blocks: the worst 16x16 tile RMSE ratio against the benchmark when there is one, else the
    block RMSE divided by the tensor's.
    """

    axis: str  # "q" (dq: per query block) or "kv" (dk, dv: per kv block)
    block_size: int
    rmse: np.ndarray
    rmse_benchmark: np.ndarray | None
    max_abs_err: np.ndarray
    score: np.ndarray


ULP_CHART_EDGES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
"""Upper edges of the ULP-error chart's bins (the last bin holds everything above 1024 ULP)."""


@dataclass(frozen=True)
class UlpChart:
    """Element counts by ULP error (`ulp_error`'s unit), device and benchmark against the golden, in the
    bins of `ULP_CHART_EDGES` plus one for more; the pictures of a failing tensor draw it."""

    edges: tuple[float, ...]
    device: tuple[int, ...]
    benchmark: tuple[int, ...] | None


@dataclass(frozen=True)
class TensorResult:
    """The judgement of one gradient."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    axes: tuple[str, ...]
    device: ErrorStats
    benchmark: ErrorStats | None
    checks: tuple[Check, ...]
    worst: tuple[WorstElement, ...]
    hot_blocks: tuple[HotBlock, ...]
    block_map: BlockMap | None
    extra: Mapping[str, float] = field(default_factory=dict)  # standard-specific figures (fa-ratio floor)
    ulp_chart: UlpChart | None = None  # failing tensors only
    golden_dtype: str | None = None  # float32, or float64 for a golden generated with --precision float64

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


SELECTION_MAX_CELLS = 1 << 16
"""Largest block mask (cells) a failing case's result keeps for its pictures."""


@dataclass(frozen=True)
class Selection:
    """A case's block mask as the judge read it, kept with a failing case for the heat maps.

    `rows` holds one string per (batch entry, query head, query block) of the mask's [B, N1, nQ, nKV]
    shape, one character per kv block: "1" selected, "0" not selected (never computed), "-" past the
    batch entry's actual lengths (no such block).
    """

    shape: tuple[int, ...]
    rows: tuple[str, ...]

    def grid(self, batch: int, head: int) -> list[str]:
        """Return the rows of one batch entry and query head."""
        blocks = self.shape[2]
        first = (batch * self.shape[1] + head) * blocks
        return list(self.rows[first : first + blocks])


@dataclass(frozen=True)
class CaseResult:
    """The verdict of one case: PASS, FAIL or ERROR (could not be judged), with everything measured."""

    name: str
    case_dir: str
    output_dir: str
    verdict: str
    spec: str | None  # the spec file the case came from (manifest "spec")
    device: str | None  # who produced the outputs, from run.json (None without a run record)
    standard: str
    settings: Settings | None
    dtype: str | None
    layout: str | None
    expect_status: int | None
    status: int | None
    status_message: str | None
    checks: tuple[Check, ...]  # case-level: status, run record
    tensors: tuple[TensorResult, ...]
    errors: tuple[str, ...]  # why an ERROR case could not be judged
    output_bytes: int
    seconds: float
    device_kind: str | None = None  # reference | torch_npu | binary (run.json); None when not recorded
    fault: str | None = None  # the fault planted in the reference device, if any (run.json)
    binary_sha256: str | None = None  # the device binary's sha256 (run.json)
    notes: tuple[str, ...] = ()  # what a reader must know beyond the checks (a planted fault that does not apply)
    selection: Selection | None = None  # the block mask, kept with a failing case for its pictures

    @property
    def passed(self) -> bool:
        """Whether the verdict is PASS."""
        return self.verdict == PASS

    @property
    def headline(self) -> str:
        """One line saying what happened: the notes, then the deciding check (or the first error)."""
        if self.verdict == ERROR:
            main = self.errors[0] if self.errors else ""
        else:
            deciding = self.deciding
            main = deciding.detail if deciding else ""
        return "; ".join([*self.notes, main] if main else self.notes)

    @property
    def all_checks(self) -> tuple[Check, ...]:
        return self.checks + tuple(c for t in self.tensors for c in t.checks)

    @property
    def deciding(self) -> Check | None:
        """The check that decided the verdict: the most severe failure, else the one closest to its limit."""
        checks = self.all_checks
        failed = [c for c in checks if not c.passed]
        pool = failed or [c for c in checks if c.limit is not None] or list(checks)
        return max(pool, key=lambda c: c.severity) if pool else None

    @property
    def message(self) -> str:
        """One line: the errors of an ERROR case, the failed checks of a FAIL, the deciding check of a PASS."""
        if self.verdict == ERROR:
            return "; ".join(self.errors)
        if self.verdict == FAIL:
            failed = sorted((c for c in self.all_checks if not c.passed), key=lambda c: -c.severity)
            return "; ".join(c.detail for c in failed)
        deciding = self.deciding
        return deciding.detail if deciding else ""


@dataclass(frozen=True)
class SuiteResult:
    """All case results of one comparison (or of merged shards)."""

    cases: tuple[CaseResult, ...]
    seconds: float = 0.0

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cases)

    @property
    def output_bytes(self) -> int:
        return sum(c.output_bytes for c in self.cases)

    @property
    def return_code(self) -> int:
        """Exit code of `bsa compare`, the one place the policy is written.

        3 if any case could not be judged (ERROR: missing, truncated or stale files, a harness crash or
        timeout recorded in run.json, no status.txt); else 1 if any case failed (a metric over its limit,
        a structural check, a negative case's status not matching `expect`, a valid case's nonzero
        status); else 0. Exit code 2 (usage, spec or user-file error) is raised by the CLI before any
        case is judged.
        """
        if self.count(ERROR):
            return 3
        if self.count(FAIL):
            return 1
        return 0


# ---- geometry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Geometry:
    """How a gradient's rows map to batch entries, heads, positions and blocks."""

    name: str
    kind: str  # q | kv
    layout: str
    shape: tuple[int, ...]
    heads: int
    dim: int
    block: int
    lengths: tuple[int, ...]
    starts: tuple[int, ...]  # TND token offsets of each batch entry

    @property
    def axes(self) -> tuple[str, ...]:
        return ("t", "n", "d") if self.layout == "TND" else ("b", "n", "s", "d")

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64))

    @property
    def seq_axis(self) -> int:
        return self.shape[2] if self.layout != "TND" else 0

    def seq_view(self, per_row: np.ndarray, batch: int) -> np.ndarray:
        """Return batch entry `batch` of a per-row array ([rows, ...]) as [heads, length, ...]."""
        length = self.lengths[batch]
        tail = per_row.shape[1:]
        if self.layout == "TND":
            start = self.starts[batch]
            return per_row.reshape(-1, self.heads, *tail)[start : start + length].swapaxes(0, 1)
        seq = self.shape[2]
        return per_row.reshape(-1, self.heads, seq, *tail)[batch, :, :length]

    def segments(self) -> list[tuple[int, int]]:
        """Return the [start, stop) row ranges that hold real positions (all rows unless BNSD padding)."""
        if self.layout == "TND" or all(n == self.shape[2] for n in self.lengths):
            return [(0, self.rows)] if self.rows else []
        seq = self.shape[2]
        spans = []
        for b, length in enumerate(self.lengths):
            for n in range(self.heads):
                first = (b * self.heads + n) * seq
                if length:
                    spans.append((first, first + length))
        return spans

    def locate(self, row: int) -> tuple[int, int, int]:
        """Return (batch, head, position in the sequence) of a row."""
        if self.layout == "TND":
            t, n = divmod(row, self.heads)
            b = int(np.searchsorted(np.asarray(self.starts) + np.asarray(self.lengths), t, side="right"))
            return b, n, t - self.starts[b]
        seq = self.shape[2]
        bn, s = divmod(row, seq)
        b, n = divmod(bn, self.heads)
        return b, n, s

    def index(self, row: int, col: int) -> tuple[tuple[int, ...], dict[str, int]]:
        """Return the layout index of an element and its named coordinates (with b and s for TND)."""
        b, n, s = self.locate(row)
        if self.layout == "TND":
            t = row // self.heads
            return (t, n, col), {"t": t, "n": n, "d": col, "b": b, "s": s}
        return (b, n, s, col), {"b": b, "n": n, "s": s, "d": col}


def _geometry(case: Case, name: str) -> _Geometry:
    kind = "q" if name == "dq" else "kv"
    spans = case.spans()
    if kind == "q":
        shape, heads = case.q_shape, case.num_heads
        lengths = tuple(s.q_len for s in spans)
        starts = tuple(s.q_start for s in spans)
        block = case.block_shape[0]
    else:
        shape, heads = case.kv_shape, case.num_kv_heads
        lengths = tuple(s.kv_len for s in spans)
        starts = tuple(s.kv_start for s in spans)
        block = case.block_shape[1]
    return _Geometry(name, kind, case.layout, tuple(shape), heads, case.head_dim, max(block, 1), lengths, starts)


def structural_rows(case: Case, block_mask: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return, per gradient, (rows that must be 0, padding rows) as bool arrays over the tensor's rows.

    Rows that must be 0: dq rows of query rows whose blocks are all unselected, dk/dv rows of kv positions
    no query head of the GQA group selects (all derived from the block mask cut to the actual lengths).
    Padding rows: BNSD positions past a batch entry's honored actual length.
    """
    x, y = case.block_shape
    group = case.group_size
    result = {}
    geometries = {name: _geometry(case, name) for name in GRAD_NAMES}  # once: each walks every batch entry
    for name in GRAD_NAMES:
        geom = geometries[name]
        zero = np.zeros(geom.rows, dtype=bool)
        padding = np.zeros(geom.rows, dtype=bool)
        if geom.layout != "TND" and geom.rows:
            padding.reshape(case.batch, geom.heads, -1)[...] = True
        result[name] = (zero, padding)
    for span in case.spans():
        mask = mask_view(case, block_mask, span)  # [N1, nQ, nKV]
        empty = ~mask.any(axis=2)  # [N1, nQ]
        never = ~mask.reshape(case.num_kv_heads, group, *mask.shape[1:]).any(axis=(1, 2))  # [N2, nKV]
        for name in GRAD_NAMES:
            geom = geometries[name]
            zero, padding = result[name]
            if geom.layout != "TND" and geom.rows:
                geom.seq_view(padding, span.batch)[...] = False
            if name == "dq":
                geom.seq_view(zero, span.batch)[...] = np.repeat(empty, x, axis=1)[:, : span.q_len]
            else:
                geom.seq_view(zero, span.batch)[...] = np.repeat(never, y, axis=1)[:, : span.kv_len]
    return result


# ---- the metrics engine -------------------------------------------------------------------------

CHUNK_ELEMENTS = 1 << 17
"""Elements per work item: small enough that a chunk's temporaries stay in cache, large enough to amortize."""
TOP_K = 5


@dataclass(frozen=True)
class _Params:
    io_dtype: str
    err_thd: float
    small_thd: float
    rtol: float
    atol: float
    diff_thd: float | None  # msOpST form


_MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23}
_MIN_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126}
ULP_EDGES = (0.5, 1.0)
ULP_BUCKETS = ("<=0.5", "0.5-1", ">1")
"""Labels of `ErrorStats.ulp_histogram`: element counts by ULP error (0.5 or less is correctly rounded)."""


_F16_MAGIC = np.float32(2.0**112)


class _Scratch:
    """One thread's reusable work arrays: temporaries of a chunk are never allocated afresh.

    (Fresh half-megabyte temporaries cost page faults on every chunk; reusing buffers makes the metrics
    about a third faster.)
    """

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = np.empty(max(size, CHUNK_ELEMENTS), dtype=dtype)
            self.buffers[name] = buffer
        return buffer[:size].reshape(shape)


_SPARE: list[_Scratch] = []
_SPARE_LOCK = threading.Lock()


def _take_scratch() -> _Scratch:
    """Take a spare set of work arrays (they outlive pool threads, so their pages stay mapped)."""
    with _SPARE_LOCK:
        return _SPARE.pop() if _SPARE else _Scratch()


def _give_scratch(scratch: _Scratch) -> None:
    with _SPARE_LOCK:
        if len(_SPARE) < (os.cpu_count() or 1) * 2:
            _SPARE.append(scratch)


def _upcast(values: np.ndarray, io_dtype: str, scratch: _Scratch | None = None) -> np.ndarray:
    """Return float16/bfloat16 (or float32/64) values as float32; exact for finite 16-bit values.

    float16 goes through integer bit moves and one multiply (faster than NumPy's cast); its Inf/NaN come
    out as finite values >= 65536, which `_chunk` detects and handles on its slow path. With `scratch`,
    the result lives in its "upcast" buffer (valid until the next call).
    """
    if values.dtype.itemsize != 2:
        return values.astype(np.float32)
    scratch = scratch or _Scratch()
    bits = scratch.get("upcast", np.uint32, values.shape)
    np.copyto(bits, values.view(np.uint16), casting="unsafe")
    np.left_shift(bits, np.uint32(16), out=bits)
    if io_dtype == "bfloat16":
        return bits.view(np.float32)
    sign = scratch.get("sign", np.uint32, values.shape)
    np.bitwise_and(bits, np.uint32(0x80000000), out=sign)
    np.bitwise_xor(bits, sign, out=bits)
    np.right_shift(bits, np.uint32(3), out=bits)
    magnitude = bits.view(np.float32)
    np.multiply(magnitude, _F16_MAGIC, out=magnitude)  # rebias the exponent; subnormals come out right too
    np.bitwise_or(bits, sign, out=bits)
    return magnitude


_FLOORS: dict[float, np.ndarray] = {}


def _floor_array(value: float, shape: tuple[int, ...]) -> np.ndarray:
    """Return a read-only float32 array of `value` of at least `shape`'s size, reshaped to it.

    NumPy's maximum against an array is several times faster than against a scalar.
    """
    size = math.prod(shape)
    array = _FLOORS.get(value)
    if array is None or array.size < size:
        array = np.full(max(size, CHUNK_ELEMENTS), value, dtype=np.float32)
        array.flags.writeable = False
        _FLOORS[value] = array
    return array[:size].reshape(shape)


def _ulp_floor(io_dtype: str, err_thd: float | None) -> float:
    """Return the smallest power of two an ULP unit is measured from: 2^floor(log2 err_thd), at least the
    dtype's smallest normal number.

    Below err_thd a golden is one of ATK's small values: its size says nothing of the error its rounding
    may carry (it is usually a sum of larger terms that cancelled). Measured from the golden's own
    exponent, such an element would count in ULPs of an ever smaller number, without bound for bfloat16
    (which shares float32's exponent range): a golden that cancelled to 1e-30 would turn an ordinary
    rounding error into 10^33 ULP. From err_thd up, the ULP is the golden's own.
    """
    tiny = 2.0 ** max(_MIN_EXPONENT.get(io_dtype, -126), -126)
    if err_thd is None or not err_thd > 0 or not math.isfinite(err_thd):
        return tiny
    return max(tiny, 2.0 ** math.floor(math.log2(err_thd)))


def _ulp_power(
    abs_golden: np.ndarray, io_dtype: str, out: np.ndarray | None = None, err_thd: float | None = None
) -> np.ndarray:
    """Return 2^floor(log2 max(|g|, err_thd)) as float32 (see `_ulp_floor`).

    The ULP unit in the case dtype is this times 2^-mantissa_bits; callers divide by the power and apply
    2^mantissa_bits to the reduced figures.
    """
    bits = None if out is None else out.view(np.int32)
    power = np.bitwise_and(abs_golden.view(np.int32), np.int32(0x7F800000), out=bits).view(np.float32)
    return np.maximum(power, _floor_array(_ulp_floor(io_dtype, err_thd), power.shape), out=power)


def ulp_error(value: float, golden: float, io_dtype: str, err_thd: float | None = None) -> float:
    """Return |value - golden| in ULPs of the golden in the case dtype (msprobe's ULP error), the golden's
    magnitude floored at `err_thd` (see `_ulp_floor`; None: at the dtype's smallest normal number)."""
    power = _ulp_power(np.abs(np.asarray([golden], dtype=np.float32)), io_dtype, err_thd=err_thd)[0]
    return float(abs(np.float32(value) - np.float32(golden)) / power * 2.0 ** _MANTISSA_BITS.get(io_dtype, 23))


@dataclass
class _Partial:
    """Sums and extremes of one chunk of one array; `merge` folds chunks together."""

    count: int = 0
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    max_abs: float = 0.0
    sum_rel: float = 0.0
    max_rel: float = 0.0
    large: int = 0
    sum_mre: float = 0.0
    max_mre: float = 0.0
    dot_ag: float = 0.0
    dot_aa: float = 0.0
    dot_gg: float = 0.0
    mismatch: int = 0
    small: int = 0
    small_err: int = 0
    nan: int = 0
    inf: int = 0
    nonfinite_mismatch: int = 0
    ulp_sum: float = 0.0
    ulp_max: float = 0.0
    ulp_over: tuple[int, ...] = (0,) * len(ULP_EDGES)  # elements above each of ULP_EDGES
    msopst_err: int = 0
    msopst_max: float = 0.0
    within_1e3: int = 0
    within_5e3: int = 0
    value_sum: float = 0.0
    value_max: float = -math.inf
    value_min: float = math.inf
    golden_sum: float = 0.0
    golden_max: float = -math.inf
    golden_min: float = math.inf
    nonfinite_rows: list[int] = field(default_factory=list)

    _SUMS = ("count", "sum_abs", "sum_sq", "sum_rel", "large", "sum_mre", "dot_ag", "dot_aa", "dot_gg",
             "mismatch", "small", "small_err", "nan", "inf", "nonfinite_mismatch", "ulp_sum", "msopst_err",
             "within_1e3", "within_5e3", "value_sum", "golden_sum")  # fmt: skip
    _MAXES = ("max_abs", "max_rel", "max_mre", "ulp_max", "msopst_max", "value_max", "golden_max")
    _MINS = ("value_min", "golden_min")

    def merge(self, other: _Partial) -> None:
        for name in self._SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in self._MAXES:
            setattr(self, name, max(getattr(self, name), getattr(other, name)))
        for name in self._MINS:
            setattr(self, name, min(getattr(self, name), getattr(other, name)))
        self.ulp_over = tuple(a + b for a, b in zip(self.ulp_over, other.ulp_over, strict=True))
        self.nonfinite_rows.extend(other.nonfinite_rows[: TOP_K - len(self.nonfinite_rows)])

    def stats(self, params: _Params, full: bool) -> ErrorStats:
        count = max(self.count, 1)
        norm = math.sqrt(self.dot_aa) * math.sqrt(self.dot_gg)
        if norm > 0:
            cosine = self.dot_ag / norm
        else:
            cosine = 1.0 if self.dot_aa == self.dot_gg else 0.0
        over = (self.count, *self.ulp_over, 0)
        histogram = tuple(int(over[i] - over[i + 1]) for i in range(len(ULP_EDGES) + 1))
        return ErrorStats(
            count=self.count,
            max_abs_err=self.max_abs,
            mean_abs_err=self.sum_abs / count,
            rmse=math.sqrt(self.sum_sq / count),
            max_rel_err=self.max_rel,
            mean_rel_err=self.sum_rel / max(self.large, 1),
            large_count=self.large,
            mare=self.max_mre if full else None,
            mere=self.sum_mre / count if full else None,
            cosine=min(cosine, 1.0) if full else None,
            mismatch_count=self.mismatch if full else None,
            mismatch_ratio=self.mismatch / count if full else None,
            small_value_count=self.small,
            small_value_err_count=self.small_err,
            nan_count=self.nan,
            inf_count=self.inf,
            nonfinite_mismatch=self.nonfinite_mismatch,
            ulp_max=self.ulp_max if full else None,
            ulp_mean=self.ulp_sum / count if full else None,
            ulp_histogram=histogram if full else None,
            msopst_err_count=self.msopst_err if full and params.diff_thd is not None else None,
            msopst_max_err=self.msopst_max if full and params.diff_thd is not None else None,
            **(self._msprobe() if full and self.count else {}),
        )

    def _msprobe(self) -> dict[str, float]:
        """msprobe's figures of the measured elements (`ErrorStats.thousandth_ratio` and the rest)."""
        return {
            "thousandth_ratio": self.within_1e3 / self.count,
            "five_thousandths_ratio": self.within_5e3 / self.count,
            "value_max": self.value_max,
            "value_min": self.value_min,
            "value_mean": self.value_sum / self.count,
            "value_l2norm": math.sqrt(self.dot_aa),
            "golden_max": self.golden_max,
            "golden_min": self.golden_min,
            "golden_mean": self.golden_sum / self.count,
            "golden_l2norm": math.sqrt(self.dot_gg),
        }


@dataclass
class _RowOut:
    """Per-row results written by the chunks (disjoint slices, so threads need no lock)."""

    tile_sse: np.ndarray  # [rows, ceil(D / 16)] float32: sum of squared errors per row and 16 columns
    max_abs: np.ndarray | None = None  # [rows] float32 (device only); -1 on rows never judged, inf if NaN/Inf
    argmax: np.ndarray | None = None  # [rows] int32


_ONES = np.ones(TILE, dtype=np.float32)


def _tile_sums(squared: np.ndarray) -> np.ndarray:
    """Sum [rows, D] squared errors over groups of 16 columns: [rows, ceil(D / 16)]."""
    rows, dim = squared.shape
    if dim % TILE == 0:
        return (squared.reshape(-1, TILE) @ _ONES).reshape(rows, dim // TILE)
    return np.add.reduceat(squared, np.arange(0, dim, TILE), axis=1)


@dataclass
class _Shared:
    """What the golden contributes to every array's metrics in one chunk, computed once."""

    golden: np.ndarray  # float32 [rows, D]
    abs_golden: np.ndarray
    large: np.ndarray  # bool: |g| > err_thd
    inv_large: np.ndarray  # 1 / |g| where large, else 0
    large_count: int
    max_abs: float  # largest |g|


def _shared(golden: np.ndarray, params: _Params, scratch: _Scratch) -> _Shared:
    shape = golden.shape
    if golden.dtype == np.float32:
        g = golden
    else:
        g = scratch.get("golden", np.float32, shape)
        np.copyto(g, golden, casting="same_kind")
    abs_g = np.abs(g, out=scratch.get("abs_golden", np.float32, shape))
    large = np.greater(abs_g, np.float32(params.err_thd), out=scratch.get("large", np.bool_, shape))
    # 1 / |g| where large, else 0; adding 1e-30 leaves every |g| > err_thd unchanged and keeps 0 / 0 away.
    # (NumPy's maximum with a scalar is several times slower than these two operations.)
    inv_large = np.add(abs_g, np.float32(1e-30), out=scratch.get("inv_large", np.float32, shape))
    np.divide(large, inv_large, out=inv_large)
    return _Shared(g, abs_g, large, inv_large, int(np.count_nonzero(large)), float(abs_g.max(initial=0.0)))


_INDEX = np.arange(CHUNK_ELEMENTS, dtype=np.intp)


def _measure_chunk(
    a: np.ndarray, s: _Shared, params: _Params, out: _RowOut, rows: slice, full: bool, scratch: _Scratch
) -> _Partial:
    """Measure float32 values `a` [rows, D] (all finite) against the shared golden of the chunk."""
    part = _Partial()
    diff = np.subtract(a, s.golden, out=scratch.get("diff", np.float32, a.shape))
    work = np.multiply(diff, diff, out=scratch.get("work", np.float32, a.shape))
    tiles = _tile_sums(work)
    out.tile_sse[rows] = tiles
    part.count = diff.size
    part.sum_sq = float(tiles.sum(dtype=np.float64))
    abs_diff = np.abs(diff, out=diff)
    part.sum_abs = float(abs_diff.sum())
    np.multiply(abs_diff, s.inv_large, out=work)  # ATK's relative error, 0 on small values
    part.sum_rel = float(work.sum())
    part.max_rel = float(work.max(initial=0.0))
    part.large = s.large_count
    part.small = diff.size - s.large_count
    flags = np.greater(abs_diff, np.float32(params.small_thd), out=scratch.get("flags", np.bool_, a.shape))
    part.small_err = int(np.count_nonzero(np.greater(flags, s.large, out=flags)))
    if out.max_abs is not None and out.argmax is not None:
        arg = abs_diff.argmax(axis=1)
        row_max = abs_diff[_INDEX[: len(arg)], arg]
        out.argmax[rows] = arg
        out.max_abs[rows] = row_max
        part.max_abs = float(row_max.max(initial=0.0))
    else:
        part.max_abs = float(abs_diff.max(initial=0.0))
    if not full:
        return part
    flat_a, flat_g = a.reshape(-1), s.golden.reshape(-1)
    part.dot_ag = float(np.dot(flat_a, flat_g))
    part.dot_aa = float(np.dot(flat_a, flat_a))
    part.dot_gg = float(np.dot(flat_g, flat_g))
    np.add(s.abs_golden, np.float32(1e-7), out=work)
    np.divide(abs_diff, work, out=work)  # the single standard's relative error
    part.sum_mre = float(work.sum())
    part.max_mre = float(work.max(initial=0.0))
    part.within_1e3 = int(np.count_nonzero(np.less(work, np.float32(1e-3), out=flags)))
    part.within_5e3 = int(np.count_nonzero(np.less(work, np.float32(5e-3), out=flags)))
    if flat_a.size:
        ones = _floor_array(1.0, flat_a.shape)  # a dot with ones: three times faster than NumPy's sum here
        part.value_sum, part.golden_sum = float(np.dot(flat_a, ones)), float(np.dot(flat_g, ones))
        part.value_max, part.value_min = float(flat_a.max()), float(flat_a.min())
        part.golden_max, part.golden_min = float(flat_g.max()), float(flat_g.min())
    np.multiply(s.abs_golden, np.float32(params.rtol), out=work)
    work += np.float32(params.atol)
    part.mismatch = int(np.count_nonzero(np.greater(abs_diff, work, out=flags)))
    np.divide(abs_diff, _ulp_power(s.abs_golden, params.io_dtype, work, params.err_thd), out=work)  # ULP / 2^m
    unit = 2.0 ** _MANTISSA_BITS.get(params.io_dtype, 23)
    part.ulp_sum = float(work.sum()) * unit
    part.ulp_max = float(work.max(initial=0.0)) * unit
    part.ulp_over = tuple(
        int(np.count_nonzero(np.greater(work, np.float32(edge / unit), out=flags))) for edge in ULP_EDGES
    )
    if params.diff_thd is not None:
        # msOpST: absolute error below diff_thd, else relative to max(|a|, |g|, 2^-14 / diff_thd).
        floor = np.float32(2.0**-14 / params.diff_thd)
        denominator = np.maximum(np.maximum(np.abs(a), s.abs_golden), floor) + np.float32(1e-9)
        rdiff = np.where(abs_diff < params.diff_thd, abs_diff, abs_diff / denominator)
        part.msopst_err = int(np.count_nonzero(rdiff > params.diff_thd))
        part.msopst_max = float(rdiff.max(initial=0.0))
    return part


def _chunk(
    device: np.ndarray | None,
    bench: np.ndarray | None,
    golden: np.ndarray,
    params: _Params,
    device_out: _RowOut | None,
    bench_out: _RowOut | None,
    first: int,
) -> tuple[_Partial | None, _Partial | None]:
    """Measure rows [first, first + len(golden)) of the device and benchmark arrays (either may be None)
    against the golden.

    Arrays are [rows, D]: device and benchmark in the case dtype, golden float32 or float64. Non-finite
    elements are counted, then judged as if equal to the golden (their error shows in the counts and the
    structural check, not in every metric).
    """
    rows = slice(first, first + len(golden))
    scratch = _take_scratch()
    try:
        # Overflowing squares and sums of a wild device (huge errors) are expected: they mean failure.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return _chunk_in(device, bench, golden, params, device_out, bench_out, first, rows, scratch)
    finally:
        _give_scratch(scratch)


def _chunk_in(
    device: np.ndarray | None,
    bench: np.ndarray | None,
    golden: np.ndarray,
    params: _Params,
    device_out: _RowOut | None,
    bench_out: _RowOut | None,
    first: int,
    rows: slice,
    scratch: _Scratch,
) -> tuple[_Partial | None, _Partial | None]:
    shared = _shared(golden, params, scratch)
    parts: list[_Partial | None] = []
    for values, out, full in ((device, device_out, True), (bench, bench_out, False)):
        if values is None or out is None:
            parts.append(None)
            continue
        a = _upcast(values, params.io_dtype, scratch)
        part = _measure_chunk(a, shared, params, out, rows, full, scratch)
        # float16 Inf/NaN come out of _upcast as finite values >= 65536: an error that large, or a golden
        # that large, sends the chunk to the exact (slow) path; bfloat16 Inf/NaN propagate as themselves.
        suspect = values.dtype == np.float16 and part.max_abs + shared.max_abs >= 65504.0
        if suspect or not math.isfinite(part.sum_sq + part.sum_abs):
            a = values.astype(np.float32)
            part = _measure_nonfinite(a, shared, params, out, rows, full)
            if full and out.max_abs is not None:
                bad_rows = np.flatnonzero(~np.isfinite(a).all(axis=1))
                out.max_abs[first + bad_rows] = np.inf
            part.nonfinite_rows = [first + int(r) for r in part.nonfinite_rows]
        parts.append(part)
    return parts[0], parts[1]


def _measure_nonfinite(a: np.ndarray, s: _Shared, params: _Params, out: _RowOut, rows: slice, full: bool) -> _Partial:
    """The slow path of a chunk holding NaN/Inf (or errors too large to square in float32)."""
    finite_a, finite_g = np.isfinite(a), np.isfinite(s.golden)
    bad = finite_a != finite_g
    both = ~finite_a & ~finite_g
    bad |= both & (a != s.golden) & ~(np.isnan(a) & np.isnan(s.golden))
    golden = np.where(finite_g, s.golden, np.float32(0))
    cleaned = np.where(finite_a & finite_g, a, golden)
    limit = np.float32(1e18)  # squares of larger errors would overflow float32
    cleaned = np.clip(cleaned, golden - limit, golden + limit)
    scratch = _Scratch()  # not the thread's: `s` lives in those buffers
    shared = _shared(golden, params, scratch) if not finite_g.all() else s
    part = _measure_chunk(cleaned.astype(np.float32), shared, params, out, rows, full, scratch)
    left_out = ~(finite_a & finite_g)  # judged as equal to the golden above; now left out of the counts
    n_left, n_large = int(np.count_nonzero(left_out)), int(np.count_nonzero(left_out & shared.large))
    part.count -= n_left
    part.large -= n_large
    part.small -= n_left - n_large
    part.nan = int(np.count_nonzero(np.isnan(a)))
    part.inf = int(np.count_nonzero(np.isinf(a)))
    part.nonfinite_mismatch = int(np.count_nonzero(bad))
    part.nonfinite_rows = [int(r) for r in np.flatnonzero(bad.any(axis=1))[:TOP_K]]
    return part


def _chunks(geom: _Geometry) -> list[tuple[int, int]]:
    """Split the judged row segments of a tensor into work items of about CHUNK_ELEMENTS elements."""
    step = max(1, CHUNK_ELEMENTS // max(geom.dim, 1))
    items: list[tuple[int, int]] = []
    for start, stop in geom.segments():
        items.extend((r, min(r + step, stop)) for r in range(start, stop, step))
    return items


def _measure(
    device: np.ndarray | None,
    bench: np.ndarray | None,
    golden: np.ndarray,
    geom: _Geometry,
    params: _Params,
) -> tuple[ErrorStats | None, _RowOut | None, list[int], ErrorStats | None, _RowOut | None]:
    """Measure the device and benchmark arrays (either may be None) against the golden over the judged
    rows, chunk by chunk: (device stats, device rows, device non-finite rows, benchmark stats and rows).

    Chunks run one after another in the calling thread: each is a few dozen short NumPy passes, and
    threads sharing them spend more time handing the GIL back and forth than they gain (measured: two
    threads no faster than one). Parallelism comes from hashing alongside, and from processes per case.
    """
    rows, dim = geom.rows, geom.dim
    golden2d = golden.reshape(rows, dim)
    device2d = None if device is None else device.reshape(rows, dim)
    bench2d = None if bench is None else bench.reshape(rows, dim)
    tiles = -(-dim // TILE)
    device_out = None
    if device is not None:
        device_out = _RowOut(
            np.zeros((rows, tiles), dtype=np.float32),
            np.full(rows, -1.0, dtype=np.float32),
            np.zeros(rows, dtype=np.int32),
        )
    bench_out = None if bench is None else _RowOut(np.zeros((rows, tiles), dtype=np.float32))

    def work(item: tuple[int, int]) -> tuple[_Partial | None, _Partial | None]:
        start, stop = item
        device_rows = None if device2d is None else device2d[start:stop]
        bench_rows = None if bench2d is None else bench2d[start:stop]
        return _chunk(device_rows, bench_rows, golden2d[start:stop], params, device_out, bench_out, start)

    device_total, bench_total = _Partial(), _Partial()
    for device_part, bench_part in map(work, _chunks(geom)):
        if device_part is not None:
            device_total.merge(device_part)
        if bench_part is not None:
            bench_total.merge(bench_part)
    device_stats = None if device is None else device_total.stats(params, full=True)
    bench_stats = None if bench is None else bench_total.stats(params, full=False)
    return device_stats, device_out, device_total.nonfinite_rows, bench_stats, bench_out


# ---- block maps ---------------------------------------------------------------------------------


@dataclass
class _SpanTiles:
    """One batch entry's tile grid: ratio per (head, tile row, tile column) and which block each row is in."""

    starts: np.ndarray  # first position of each tile row
    stops: np.ndarray
    block_of: np.ndarray  # block index of each tile row
    ratio: np.ndarray | None  # [heads, tile rows, tile cols]


def _block_map(
    geom: _Geometry,
    device_rows: _RowOut,
    bench_rows: _RowOut | None,
    bench_rmse: float,
    device_rmse: float,
    tile_floor: float,
) -> tuple[BlockMap, dict[int, _SpanTiles]]:
    """Aggregate per-row errors into blocks (and 16x16 tiles) of each batch entry."""
    batches = len(geom.lengths)
    max_blocks = max((-(-n // geom.block) for n in geom.lengths), default=0)
    shape = (batches, geom.heads, max_blocks)
    rmse = np.full(shape, np.nan)
    rmse_bench = np.full(shape, np.nan) if bench_rows is not None else None
    max_abs = np.full(shape, np.nan)
    score = np.full(shape, np.nan)
    dim = geom.dim
    col_sizes = np.minimum(TILE, dim - np.arange(0, dim, TILE)).astype(np.float64)
    floor = max(tile_floor * bench_rmse, 1e-30)
    spans: dict[int, _SpanTiles] = {}
    assert device_rows.max_abs is not None
    for b, length in enumerate(geom.lengths):
        if length == 0:
            continue
        starts = range(0, length, geom.block)
        block_starts = np.asarray(starts)
        n_blocks = len(starts)
        tiles_per_block = [range(s, min(s + geom.block, length), TILE) for s in starts]
        tile_starts = np.concatenate([np.asarray(tiles) for tiles in tiles_per_block])
        tile_stops = np.append(tile_starts[1:], length)
        block_of = np.repeat(np.arange(n_blocks), [len(tiles) for tiles in tiles_per_block])
        first_tile = np.searchsorted(tile_starts, block_starts)
        dev_tiles = np.add.reduceat(geom.seq_view(device_rows.tile_sse, b).astype(np.float64), tile_starts, axis=1)
        counts = (tile_stops - tile_starts)[:, None] * col_sizes[None, :]  # [tile rows, tile cols]
        block_rows = np.minimum(block_starts + geom.block, length) - block_starts
        dev_block = np.add.reduceat(dev_tiles.sum(axis=2), first_tile, axis=1)
        rmse[b, :, :n_blocks] = np.sqrt(dev_block / (block_rows * dim))
        row_max = geom.seq_view(device_rows.max_abs, b)
        max_abs[b, :, :n_blocks] = np.maximum.reduceat(row_max, block_starts, axis=1)
        ratio = None
        if bench_rows is not None and rmse_bench is not None:
            bench_tiles = np.add.reduceat(geom.seq_view(bench_rows.tile_sse, b).astype(np.float64), tile_starts, axis=1)
            bench_block = np.add.reduceat(bench_tiles.sum(axis=2), first_tile, axis=1)
            rmse_bench[b, :, :n_blocks] = np.sqrt(bench_block / (block_rows * dim))
            ratio = np.sqrt(dev_tiles / counts) / np.maximum(np.sqrt(bench_tiles / counts), floor)
            score[b, :, :n_blocks] = np.maximum.reduceat(ratio.max(axis=2), first_tile, axis=1)
        else:
            score[b, :, :n_blocks] = rmse[b, :, :n_blocks] / max(device_rmse, 1e-30)
        nonfinite = np.isinf(max_abs[b, :, :n_blocks])  # rows with NaN/Inf (see _chunk)
        score[b, :, :n_blocks][nonfinite] = np.inf
        spans[b] = _SpanTiles(tile_starts, tile_stops, block_of, ratio)
    block_map = BlockMap(geom.kind, geom.block, rmse, rmse_bench, max_abs, score)
    return block_map, spans


def _hot_blocks(
    block_map: BlockMap, spans: dict[int, _SpanTiles], geom: _Geometry, count: int = TOP_K, keep_tiles: bool = False
) -> tuple[HotBlock, ...]:
    """Return the `count` blocks of highest score, worst first (with `keep_tiles`, the first with its tiles)."""
    score = np.where(np.isnan(block_map.score), -np.inf, block_map.score)
    if score.size == 0:
        return ()
    order = np.argsort(score, axis=None)[::-1][:count]
    hot: list[HotBlock] = []
    for flat in order:
        b, n, j = (int(v) for v in np.unravel_index(flat, score.shape))
        if score[b, n, j] == -np.inf:
            break
        length = geom.lengths[b]
        rows = (j * geom.block, min((j + 1) * geom.block, length))
        tile = tile_ratio = block_tiles = None
        tiles = spans.get(b)
        if tiles is not None and tiles.ratio is not None:
            members = np.flatnonzero(tiles.block_of == j)
            sub = tiles.ratio[n, members]
            r, c = np.unravel_index(int(np.argmax(sub)), sub.shape)
            tile = (int(tiles.starts[members[r]]), int(c) * TILE)
            tile_ratio = float(sub[r, c])
            if keep_tiles and not hot:
                block_tiles = np.array(sub, dtype=np.float64)
        hot.append(
            HotBlock(
                batch=b,
                head=n,
                block=j,
                rows=rows,
                score=float(score[b, n, j]),
                rmse=float(block_map.rmse[b, n, j]),
                rmse_benchmark=None if block_map.rmse_benchmark is None else float(block_map.rmse_benchmark[b, n, j]),
                max_abs_err=float(block_map.max_abs_err[b, n, j]),
                tile=tile,
                tile_ratio=tile_ratio,
                tiles=block_tiles,
            )
        )
    return tuple(hot)


def _worst_elements(
    geom: _Geometry,
    rows_out: _RowOut,
    device: np.ndarray,
    golden: np.ndarray,
    bench: np.ndarray | None,
    io_dtype: str,
    count: int = TOP_K,
    err_thd: float | None = None,
) -> tuple[WorstElement, ...]:
    """Return the elements of largest absolute error (at most one per row), worst first."""
    assert rows_out.max_abs is not None and rows_out.argmax is not None
    row_max = rows_out.max_abs
    if row_max.size == 0:
        return ()
    k = min(count, row_max.size)
    top = np.argpartition(row_max, row_max.size - k)[-k:]
    top = top[np.argsort(row_max[top])[::-1]]
    device2d = device.reshape(geom.rows, geom.dim)
    golden2d = golden.reshape(geom.rows, geom.dim)
    bench2d = None if bench is None else bench.reshape(geom.rows, geom.dim)
    worst = []
    for row in top:
        if row_max[row] < 0:
            break
        col = int(rows_out.argmax[row])
        value = device2d[row, col : col + 1]
        gold = np.asarray(golden2d[row, col : col + 1], dtype=np.float32)
        index, coords = geom.index(int(row), col)
        worst.append(
            WorstElement(
                index=index,
                coords=coords,
                block=coords["s"] // geom.block,
                device=float(value.astype(np.float32)[0]),
                golden=float(golden2d[row, col]),
                benchmark=None if bench2d is None else float(bench2d[row, col].astype(np.float32)),
                abs_err=float(row_max[row]),
                ulp=ulp_error(float(value.astype(np.float32)[0]), float(gold[0]), io_dtype, err_thd),
            )
        )
    return tuple(worst)


# ---- judging ------------------------------------------------------------------------------------


def _ratio(value: float, reference: float, floor: float) -> float:
    return value / max(reference, floor)


def _upper(name: str, tensor: str, value: float, limit: float, text: str, strict: bool = False) -> Check:
    """A check `value <= limit` (or `<` with `strict`)."""
    passed = value < limit if strict else value <= limit
    if limit > 0:
        severity = value / limit
    else:
        severity = 0.0 if value <= 0 else math.inf
    if not passed and severity <= 1:
        severity = 1.0 + 1e-12  # a strict limit reached exactly still fails
    op = ("<" if strict else "<=") if passed else (">=" if strict else ">")
    return Check(
        name,
        tensor,
        float(value),
        float(limit),
        passed,
        f"{tensor} {text} {_fmt(value)} {op} {_fmt(limit)}",
        severity,
    )


def _fmt(value: float | None) -> str:
    """Format a metric for a check's text: integers plainly, others with 4 significant digits."""
    if value is None:
        return "-"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    text = f"{value:.4g}"
    if "." not in text and "e" not in text:  # 1.00004 would read as the integer 1
        text = f"{value:.3f}"
    return text


def _standard_checks(
    name: str,
    settings: Settings,
    device: ErrorStats,
    bench: ErrorStats | None,
    tile_max: float | None,
    extra: dict[str, float],
) -> list[Check]:
    """Return the checks of the case's standard for one tensor."""
    t = settings.thresholds
    checks: list[Check] = []
    if settings.standard == "double-benchmark":
        assert bench is not None
        thd = t["err_thd"]
        for key, label, dev, ref in (
            ("mare_ratio", "MARE ratio", device.max_rel_err, bench.max_rel_err),
            ("mere_ratio", "MERE ratio", device.mean_rel_err, bench.mean_rel_err),
            ("rmse_ratio", "RMSE ratio", device.rmse, bench.rmse),
        ):
            ratio = _ratio(dev, ref, thd)
            check = _upper(key, name, ratio, t[key], label)
            if ref < thd:  # the ratio's denominator is err_thd, not the benchmark's error: say so
                detail = f" (device {_fmt(dev)} / err_thd {_fmt(thd)}: benchmark {_fmt(ref)} floored at err_thd)"
            else:
                detail = f" (device {_fmt(dev)}, benchmark {_fmt(ref)}, err_thd {_fmt(thd)})"
            checks.append(_with_detail(check, detail))
        ratio = _ratio(device.small_value_err_count, bench.small_value_err_count, 1)
        check = _upper("small_value_ratio", name, ratio, t["small_value_ratio"], "small-value error ratio")
        detail = f" (device {device.small_value_err_count}, benchmark {bench.small_value_err_count} errors"
        detail += ", floored at 1)" if bench.small_value_err_count < 1 else ")"
        checks.append(_with_detail(check, detail))
        if tile_max is not None and math.isfinite(t["tile_ratio"]):
            checks.append(_upper("tile_ratio", name, tile_max, t["tile_ratio"], "worst 16x16 tile RMSE ratio"))
    elif settings.standard == "single":
        assert device.mere is not None and device.mare is not None
        checks.append(_upper("mere", name, device.mere, t["mere"], "MERE", strict=True))
        checks.append(_upper("mare", name, device.mare, t["mare"], "MARE", strict=True))
    elif settings.standard == "allclose":
        if settings.msopst:
            assert device.msopst_err_count is not None and device.msopst_max_err is not None
            fraction = device.msopst_err_count / max(device.count, 1)
            check = _upper("pct_thd", name, fraction, t["pct_thd"], f"fraction over diff_thd {_fmt(t['diff_thd'])}")
            checks.append(_with_detail(check, f" ({device.msopst_err_count} of {device.count})"))
            checks.append(
                _upper("max_diff", name, device.msopst_max_err, t["max_diff"], "msOpST max error", strict=True)
            )
        else:
            assert device.mismatch_ratio is not None
            check = _upper("mismatch", name, device.mismatch_ratio, t["mismatch"], "mismatch fraction")
            detail = (
                f" ({device.mismatch_count} of {device.count} beyond atol {_fmt(t['atol'])} + rtol {_fmt(t['rtol'])})"
            )
            checks.append(_with_detail(check, detail))
    elif settings.standard == "fa-ratio":
        assert bench is not None
        limit = t["k"] * bench.max_abs_err + extra["ulp_floor"]
        check = _upper("max_abs_err", name, device.max_abs_err, limit, "max abs error")
        detail = f" (k {_fmt(t['k'])} x benchmark {_fmt(bench.max_abs_err)} + floor {_fmt(extra['ulp_floor'])})"
        checks.append(_with_detail(check, detail))
    return checks


def _with_detail(check: Check, suffix: str) -> Check:
    return Check(
        check.name,
        check.tensor,
        check.value,
        check.limit,
        check.passed,
        check.detail + suffix,
        check.severity,
    )


def _zero_check(
    name: str, check: str, label: str, values: np.ndarray, rows: np.ndarray, geom: _Geometry, zero_atol: float
) -> Check | None:
    """Check that the rows flagged in `rows` hold only |value| <= zero_atol; None when no row is flagged."""
    if not rows.any():
        return None
    values2d = values.reshape(geom.rows, geom.dim)
    flagged = np.flatnonzero(rows)
    bad_count = 0
    first_bad: int | None = None
    worst = 0.0
    step = max(1, CHUNK_ELEMENTS // max(geom.dim, 1))
    for start in range(0, len(flagged), step):
        ids = flagged[start : start + step]
        magnitude = np.abs(values2d[ids].astype(np.float32))
        bad = ~(magnitude <= zero_atol)
        n_bad = int(np.count_nonzero(bad))
        if n_bad:
            bad_count += n_bad
            if first_bad is None:
                first_bad = int(ids[np.flatnonzero(bad.any(axis=1))[0]])
            worst_here = magnitude[bad]
            worst = max(worst, float(np.where(np.isnan(worst_here), np.inf, worst_here).max()))
    total = len(flagged) * geom.dim
    if bad_count == 0:
        return Check(check, name, 0.0, 0.0, True, f"{name} {label}: all {total} elements 0", 0.0)
    assert first_bad is not None
    b, n, s = geom.locate(first_bad)
    where = f"first at b={b} n={n} s={s} ({'q' if geom.kind == 'q' else 'kv'} block {s // geom.block})"
    text = f"{name} {label}: {bad_count} of {total} elements nonzero (largest |value| {_fmt(worst)}), {where}"
    return Check(check, name, float(bad_count), 0.0, False, text, math.inf)


def _all_zero_check(name: str, values: np.ndarray, stats: ErrorStats) -> Check | None:
    """Return a failed check when the device output is all zero and the golden is not; else None.

    An output that is all zero was most likely never written: every ratio against it is huge, and a
    headline such as "tile ratio 4214" would hide what happened. The metrics tell the case for free
    (the cosine of a zero vector with a nonzero golden is exactly 0); only then are the values read.
    """
    if stats.cosine != 0.0 or stats.large_count + stats.small_value_count == 0:
        return None
    flat = values.reshape(-1)
    step = CHUNK_ELEMENTS * 8
    for start in range(0, flat.size, step):
        chunk = flat[start : start + step]
        magnitude = chunk.view(np.uint16) & np.uint16(0x7FFF) if chunk.dtype.itemsize == 2 else np.abs(chunk)
        if np.count_nonzero(magnitude):
            return None
    detail = f"{name} is all zero, as if never written, where the golden is not"
    if stats.large_count:
        detail += f" ({stats.large_count} elements with |golden| > err_thd)"
    return Check("all_zero", name, float(flat.size), 0.0, False, detail, math.inf)


def _fa_floor(golden: np.ndarray, io_dtype: str, factor: float) -> float:
    """FlashAttention 3's ULP floor: factor x max |(g + 0.3) - 0.3 - g|, all in the case dtype."""
    dtype = numpy_dtype(io_dtype)
    flat = golden.reshape(-1)
    worst = 0.0
    step = CHUNK_ELEMENTS * 8
    for start in range(0, flat.size, step):
        g = flat[start : start + step].astype(dtype).astype(np.float32)
        shifted = (g + np.float32(0.3)).astype(dtype).astype(np.float32)
        back = (shifted - np.float32(np.asarray(0.3, dtype=dtype))).astype(dtype).astype(np.float32)
        worst = max(worst, float(np.abs(back - g).max(initial=0.0)))
    return factor * worst


def _params(case: Case, settings: Settings) -> _Params:
    t = settings.thresholds
    return _Params(
        io_dtype=case.dtype,
        err_thd=t.get("err_thd", ERR_THD.get(case.dtype, ERR_THD["float32"])),
        small_thd=t.get("small_value_thd", SMALL_VALUE_THD.get(case.dtype, SMALL_VALUE_THD["float32"])),
        rtol=t["rtol"],
        atol=t["atol"],
        diff_thd=t["diff_thd"] if settings.msopst else None,
    )


SUMMARY_FORMAT = 1
"""Version of the benchmark summary's arithmetic: a summary of another version is measured again."""


@dataclass(frozen=True)
class BenchmarkSummary:
    """The benchmark (kernel-faithful) outputs measured against the golden once, at `bsa gen`.

    Neither depends on the device, so every judgement of the case can reuse the figures instead of
    reading, hashing and measuring the benchmark again. `key` holds what else they depend on.
    """

    key: Mapping[str, Any]
    stats: Mapping[str, ErrorStats]  # per gradient, as `_measure` gives for the benchmark
    tiles: Mapping[str, np.ndarray]  # per gradient, [rows, ceil(D / 16)] float32 sums of squared errors


def case_settings(case: Case) -> Settings:
    """Return the settings a case is judged by when the command line sets nothing (its spec, else defaults)."""
    return resolve_settings(case.dtype, case.compare or None, RunSettings())


def summary_key(case: Case, settings: Settings) -> dict[str, Any]:
    """Return what a benchmark summary depends on besides the golden and benchmark files, as strict JSON.

    The thresholds that shape the benchmark's figures, and what the float32 arithmetic could differ by
    in its last bits: the bsa and NumPy versions and the machine's architecture (a case generated on x86
    and judged on an aarch64 host measures its benchmark again).
    """
    params = _params(case, settings)
    return {
        "format": SUMMARY_FORMAT,
        "bsa": __version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "dtype": case.dtype,
        "err_thd": json_number(params.err_thd),
        "small_value_thd": json_number(params.small_thd),
        "chunk_elements": CHUNK_ELEMENTS,
    }


def summarize_benchmark(
    case: Case, settings: Settings, golden: Mapping[str, np.ndarray], benchmark: Mapping[str, np.ndarray]
) -> BenchmarkSummary:
    """Measure the benchmark against the golden as `judge_tensors` would under `settings`."""
    params = _params(case, settings)
    stats, tiles = {}, {}
    for name in GRAD_NAMES:
        geom = _geometry(case, name)
        _, _, _, bench_stats, bench_rows = _measure(None, benchmark[name], golden[name], geom, params)
        assert bench_stats is not None and bench_rows is not None
        stats[name], tiles[name] = bench_stats, bench_rows.tile_sse
    return BenchmarkSummary(summary_key(case, settings), stats, tiles)


def summary_document(summary: BenchmarkSummary) -> dict[str, Any]:
    """Return a summary's key and figures as strict JSON (the tiles are stored as arrays of their own)."""

    def plain(value: Any) -> Any:
        if isinstance(value, float):
            return json_number(value)
        return list(value) if isinstance(value, tuple) else value

    # msprobe's figures are the device's only: left out (not null), a summary stays readable by a bsa before them
    stats = {name: {k: plain(v) for k, v in asdict(s).items() if not (k in MSPROBE_FIELDS and v is None)}
             for name, s in summary.stats.items()}  # fmt: skip
    return {"key": dict(summary.key), "stats": stats}


def summary_from_document(document: Mapping[str, Any], tiles: Mapping[str, np.ndarray]) -> BenchmarkSummary:
    """Rebuild a summary from `summary_document` and its tiles; ValueError if the document is malformed."""
    try:
        stats = {name: ErrorStats(**_stats_fields(document["stats"][name])) for name in GRAD_NAMES}
        return BenchmarkSummary(dict(document["key"]), stats, {name: tiles[name] for name in GRAD_NAMES})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed benchmark summary ({type(exc).__name__}: {exc})") from None


_BENCHMARK_FIELDS = {f.name: f.type for f in dataclasses.fields(ErrorStats)}


def _stats_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Check and convert a benchmark's `ErrorStats` fields from JSON; ValueError names the first bad one."""
    wrong = (set(_BENCHMARK_FIELDS) - set(MSPROBE_FIELDS) - set(data)) | (set(data) - set(_BENCHMARK_FIELDS))
    if wrong:  # msprobe's figures may be absent: a summary never holds them (the device's only)
        raise ValueError(f"fields {sorted(wrong)} missing or unknown")
    fields: dict[str, Any] = {}
    for name, value in data.items():
        kind = str(_BENCHMARK_FIELDS[name])
        if value is None and "None" in kind:
            fields[name] = None
        elif kind.startswith("int") and isinstance(value, int) and not isinstance(value, bool):
            fields[name] = value
        elif kind.startswith("float") and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            fields[name] = float(value)  # "inf", "-inf", "nan" as json_number writes them
        elif kind.startswith("tuple") and isinstance(value, list) and all(isinstance(v, int) for v in value):
            fields[name] = tuple(value)
        else:
            raise ValueError(f"{name}: {value!r} is not {kind}")
    return fields


def ulp_chart(
    device: np.ndarray, bench: np.ndarray | None, golden: np.ndarray, geom: _Geometry, params: _Params
) -> UlpChart:
    """Count the judged elements of device and benchmark by ULP error in the bins of `ULP_CHART_EDGES`.

    One more pass over the arrays, made for failing tensors only (their pictures). NaN/Inf elements are
    left out, as from the other metrics.
    """
    unit = 2.0 ** _MANTISSA_BITS.get(params.io_dtype, 23)
    edges = np.asarray(ULP_CHART_EDGES, dtype=np.float64) / unit
    counts: dict[str, np.ndarray] = {}
    golden2d = golden.reshape(geom.rows, geom.dim)
    arrays = {"device": device, "benchmark": bench}
    with np.errstate(over="ignore", invalid="ignore"):
        for label, values in arrays.items():
            if values is None:
                continue
            total = np.zeros(len(edges) + 1, dtype=np.int64)
            values2d = values.reshape(geom.rows, geom.dim)
            for start, stop in _chunks(geom):
                g = np.asarray(golden2d[start:stop], dtype=np.float32)
                a = np.asarray(values2d[start:stop]).astype(np.float32)
                power = _ulp_power(np.abs(g), params.io_dtype, err_thd=params.err_thd)
                error = (np.abs(a - g) / power).astype(np.float64)
                error = error[np.isfinite(error)]
                total += np.bincount(np.searchsorted(edges, error, side="left"), minlength=len(edges) + 1)
            counts[label] = total
    bench_counts = counts.get("benchmark")
    return UlpChart(
        edges=ULP_CHART_EDGES,
        device=tuple(int(c) for c in counts["device"]),
        benchmark=None if bench_counts is None else tuple(int(c) for c in bench_counts),
    )


def judge_tensors(
    case: Case,
    settings: Settings,
    device: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray] | None,
    block_mask: np.ndarray,
    summary: BenchmarkSummary | None = None,
) -> tuple[TensorResult, ...]:
    """Judge dq, dk, dv of a valid case: metrics, the standard's checks, structural checks, block maps.

    Args:
        case: the case geometry (`manifest.case_from_manifest`).
        settings: resolved settings (`resolve_settings`).
        device, golden, benchmark: {"dq", "dk", "dv"} arrays of the case's shapes; device and benchmark in
            the case dtype, golden float32 or float64. `benchmark` may be None when the standard needs none
            or `summary` stands for it (then it only adds the benchmark's values to the worst elements).
        block_mask: the case's blockSparseMask input.
        summary: the benchmark measured against this golden beforehand (`summarize_benchmark`); used
            instead of measuring `benchmark` again when its key matches these settings.

    Raises:
        ValueError: the standard needs a benchmark and none is given, or shapes do not match the case.
    """
    standard = STANDARDS[settings.standard]
    usable = summary if summary is not None and summary.key == summary_key(case, settings) else None
    if standard.needs_benchmark and not benchmark and usable is None:
        raise ValueError(f"standard {settings.label!r} needs the benchmark (kernel-faithful) outputs")
    t = settings.thresholds
    params = _params(case, settings)
    rows = structural_rows(case, block_mask)
    results = []
    for name in GRAD_NAMES:
        geom = _geometry(case, name)
        dev, gold = device[name], golden[name]
        bench = benchmark.get(name) if benchmark else None
        for label, array in (("device", dev), ("golden", gold), ("benchmark", bench)):
            if array is not None and tuple(array.shape) != geom.shape:
                raise ValueError(f"{name}: {label} shape {list(array.shape)} is not {list(geom.shape)}")
        measured = _measure(dev, None if usable else bench, gold, geom, params)
        dev_stats, dev_rows, nonfinite_rows, bench_stats, bench_rows = measured
        if usable is not None:
            tiles = usable.tiles[name]
            expected = (geom.rows, -(-geom.dim // TILE))
            if tiles.dtype != np.float32 or tuple(tiles.shape) != expected:
                raise ValueError(f"{name}: benchmark summary tiles are {tiles.dtype} {list(tiles.shape)}, "
                                 f"expected float32 {list(expected)}")  # fmt: skip
            bench_stats, bench_rows = usable.stats[name], _RowOut(tiles)
        assert dev_stats is not None and dev_rows is not None
        block_map, spans = _block_map(
            geom,
            dev_rows,
            bench_rows,
            bench_stats.rmse if bench_stats else 0.0,
            dev_stats.rmse,
            t.get("tile_floor", 0.1),
        )
        tile_max = None
        if bench_rows is not None:
            ratios = [float(t.ratio.max()) for t in spans.values() if t.ratio is not None and t.ratio.size]
            tile_max = max(ratios, default=0.0)
        extra: dict[str, float] = {}
        if settings.standard == "fa-ratio":
            extra["ulp_floor"] = _fa_floor(gold, case.dtype, t["floor_factor"])
        checks = _structural_checks(name, geom, dev, dev_stats, nonfinite_rows, rows[name], settings)
        checks += _standard_checks(name, settings, dev_stats, bench_stats, tile_max, extra)
        failed = not all(c.passed for c in checks)
        chart = ulp_chart(dev, bench, gold, geom, params) if failed else None
        results.append(
            TensorResult(
                name=name,
                shape=geom.shape,
                dtype=case.dtype,
                axes=geom.axes,
                device=dev_stats,
                benchmark=bench_stats,
                checks=tuple(checks),
                worst=_worst_elements(geom, dev_rows, dev, gold, bench, case.dtype, err_thd=params.err_thd),
                hot_blocks=_hot_blocks(block_map, spans, geom, keep_tiles=failed),
                block_map=block_map,
                extra=extra,
                ulp_chart=chart,
                golden_dtype=str(gold.dtype),
            )
        )
    return tuple(results)


def _structural_checks(
    name: str,
    geom: _Geometry,
    values: np.ndarray,
    stats: ErrorStats,
    nonfinite_rows: list[int],
    rows: tuple[np.ndarray, np.ndarray],
    settings: Settings,
) -> list[Check]:
    checks = []
    bad = stats.nonfinite_mismatch
    if bad:
        places = []
        for row in nonfinite_rows[:3]:
            b, n, s = geom.locate(row)
            places.append(f"b={b} n={n} s={s} ({geom.kind} block {s // geom.block})")
        elements = f"{bad} element{'s' if bad != 1 else ''} ({stats.nan_count} NaN, {stats.inf_count} Inf)"
        detail = f"{name} NaN/Inf where the golden is finite: {elements}, rows {', '.join(places)}"
        checks.append(Check("nonfinite", name, float(bad), 0.0, False, detail, math.inf))
    else:
        checks.append(Check("nonfinite", name, 0.0, 0.0, True, f"{name} no NaN/Inf where the golden is finite", 0.0))
    check = _all_zero_check(name, values, stats)
    if check is not None:
        checks.append(check)
    zero_rows, padding_rows = rows
    zero_atol = settings.thresholds["zero_atol"]
    if math.isfinite(zero_atol):
        label = "empty query rows" if geom.kind == "q" else "never-selected kv rows"
        check = _zero_check(name, "empty_rows" if geom.kind == "q" else "unselected_kv", label, values,
                            zero_rows & ~padding_rows, geom, zero_atol)  # fmt: skip
        if check is not None:
            checks.append(check)
        if settings.padding == "zero":
            check = _zero_check(
                name, "padding", "padding past the actual length", values, padding_rows, geom, zero_atol
            )
            if check is not None:
                checks.append(check)
    return checks


# ---- reading a case -----------------------------------------------------------------------------


def _read_status(output_dir: Path) -> tuple[int, str | None]:
    """Read `status.txt`: the aclnn status on the first line, an optional message after it.

    Raises:
        DataError: the file is missing or its first line is not a decimal integer.
    """
    path = output_dir / STATUS_FILE
    if not path.exists():
        raise DataError(str(path), "missing: the binary writes the aclnn status there (first line, decimal)")
    inside(output_dir, STATUS_FILE)
    lines = read_regular(path, STATUS_MAX_BYTES, truncate=True).decode("utf-8", errors="replace").splitlines()
    first = lines[0].strip() if lines else ""
    try:
        if len(first) > 20:
            raise ValueError
        status = int(first)
    except ValueError:
        raise DataError(str(path), f"first line {show(first)} is not a decimal aclnn status") from None
    message = "\n".join(lines[1:]).strip() or None
    return status, message


def _load_record(output_dir: Path) -> Any:
    """Return the parsed `run.json` of an output directory (a regular file inside it, of bounded size).

    Raises:
        DataError: it is not a readable regular file inside the folder, or not JSON.
    """
    path = inside(output_dir, RUN_RECORD)
    try:
        return json.loads(read_regular(path, RUN_RECORD_MAX_BYTES))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataError(str(path), f"not valid JSON ({show(str(exc), 100)})") from None


RUN_RECORD_MAX_BYTES = 16 << 20
"""Largest run.json read (one of `bsa run` is a few KiB)."""

STATUS_MAX_BYTES = 64 << 10
"""Bytes of status.txt read (its status line and message)."""


def _run_device_info(output_dir: Path) -> dict[str, Any]:
    """Return what a run record says of the device: the `CaseResult` fields device, device_kind, fault and
    binary_sha256 (those it gives)."""
    try:
        record = _load_record(output_dir)
        device = record["device"]
        info: dict[str, Any] = {"device": clip(device["name"])}
    except (DataError, KeyError, TypeError):
        return {}
    if isinstance(device, dict):
        if isinstance(device.get("kind"), str):
            info["device_kind"] = clip(device["kind"])
        if isinstance(device.get("fault"), str):
            info["fault"] = clip(device["fault"])
    binary = record.get("binary") if isinstance(record, dict) else None
    if isinstance(binary, dict) and isinstance(binary.get("sha256"), str):
        info["binary_sha256"] = clip(binary["sha256"])
    return info


def _read_run_record(output_dir: Path, names: Sequence[str]) -> tuple[list[str], list[Check], dict[str, str] | None]:
    """Read the runner's `run.json` if present.

    Returns:
        reasons the case cannot be judged, case-level checks, and the sha256 of each input the runner
        checked the files against before the device ran (None when not recorded).
    """
    problems, checks, record = _run_record_checks(output_dir, names)
    inputs = record.get("inputs") if record else None
    if not isinstance(inputs, dict) or not all(isinstance(v, str) for v in inputs.values()):
        inputs = None
    return problems, checks, inputs


def _run_record_checks(output_dir: Path, names: Sequence[str]) -> tuple[list[str], list[Check], dict | None]:
    path = output_dir / RUN_RECORD
    if not path.exists() and not path.is_symlink():
        return [], [], None
    try:
        record = _load_record(output_dir)
    except DataError as exc:
        return [str(exc)], [], None
    if not isinstance(record, dict) or not isinstance(record.get("problems") or [], list) or not isinstance(
        record.get("repeat") or {}, dict
    ):
        return [f"{path}: not a run record"], [], None
    if record.get("case") not in (None, *names):
        text = f"{path}: a record of case {show(record.get('case'))}, not of this case (a stale output directory?)"
        return [text], [], None
    outcome = record.get("outcome")
    problems = [clip(p, 300) for p in (record.get("problems") or [])[:20]]
    if outcome in ("timeout", "crashed", "interrupted", "error") or record.get("timed_out"):
        why = {
            "timeout": "timed out",
            "crashed": f"crashed ({clip(record.get('signal') or 'exception', 40)})",
            "interrupted": "was interrupted",
        }.get(str(outcome), "failed")
        exit_code = record.get("exit_code")
        text = f"the run {why}" + (f", exit code {clip(exit_code, 20)}" if exit_code not in (None, 0) else "")
        log = record.get("stderr_log")
        where = f"log {output_dir / clip(log)}, record {path}" if isinstance(log, str) and log else f"see {path}"
        return [text + (": " + "; ".join(problems) if problems else "") + f" ({where})"], [], record
    if outcome == "nondeterministic":
        repeat = record.get("repeat") or {}
        differences = repeat.get("differences") or []
        if not isinstance(differences, list):
            differences = []
        detail = "; ".join(
            ", ".join(f"{clip(k, 40)} {clip(v, 40)}" for k, v in list(d.items())[:6])
            for d in differences[:3]
            if isinstance(d, dict)
        )
        text = f"repeated runs differ ({clip(repeat.get('count', '?'), 20)} runs){': ' + detail if detail else ''}"
        return [], [Check("deterministic", None, float(len(differences) or 1), 0.0, False, text, math.inf)], record
    noise = (record.get("repeat") or {}).get("noise")
    if outcome == "ok" and isinstance(noise, dict) and noise:
        parts = [f"{clip(name, 20)} {clip(v.get('elements'), 20)} of {clip(v.get('total'), 20)} elements by <= "
                 f"{clip(v.get('max_ulp'), 20)} ULP"
                 for name, v in list(noise.items())[:6] if isinstance(v, dict)]  # fmt: skip
        count = clip(record["repeat"].get("count"), 20)
        text = f"dq bitwise identical over {count} runs; atomic-add noise: " + "; ".join(parts)
        return [], [Check("repeat-noise", None, float(len(parts)), None, True, text)], record
    return [], [], record


_VERIFIED: dict[tuple[object, ...], str] = {}
_VERIFIED_LOCK = threading.Lock()
_RACY_NS = 2_000_000_000


def _signature(path: Path) -> tuple[object, ...]:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _sha256(path: Path) -> str:
    """Return the hex sha256 of a file, hashed straight from a read-only mapping (no copy).

    Digests are remembered for the life of the process, keyed by the file's identity, size and change
    times, so judging several output directories of one case hashes its golden and inputs once. A file
    changed less than two seconds before hashing is not remembered (a later write in the same clock tick
    could otherwise go unseen).
    """
    signature = _signature(path)
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(signature)
    if known is not None:
        return known
    started = time.time_ns()
    if path.stat().st_size == 0:
        digest = sha256_file(path)
    else:
        with open(path, "rb") as f, map_read_only(f.fileno(), populate=True) as mapped:
            digest = hashlib.sha256(mapped).hexdigest()
    changed = max(int(signature[4]), int(signature[5]))  # type: ignore[call-overload]
    if _signature(path) == signature and changed < started - _RACY_NS:
        with _VERIFIED_LOCK:
            _VERIFIED[signature] = digest
    return digest


def _stale(path: Path, sha256: str | None, what: str) -> str | None:
    """Return the message for a file whose content no longer matches its manifest sha256, else None."""
    if not sha256 or _sha256(path) == sha256:
        return None
    return str(DataError(str(path), f"sha256 differs from the manifest: stale {what}; run `bsa gen` again"))


@dataclass
class _Opened:
    """A valid case's arrays, mapped; `pending` hash checks must all come back None before a verdict."""

    device: dict[str, np.ndarray] = field(default_factory=dict)
    golden: dict[str, np.ndarray] = field(default_factory=dict)
    benchmark: dict[str, np.ndarray] | None = None
    block_mask: np.ndarray | None = None
    summary: BenchmarkSummary | None = None
    problems: list[str] = field(default_factory=list)
    pending: list[Future[str | None]] = field(default_factory=list)

    def stale(self) -> list[str]:
        """Wait for the hash checks; return the stale files' messages."""
        return [message for future in self.pending if (message := future.result()) is not None]


class _Inline(Executor):
    """An executor that runs each job at once (no pool given)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def _open_arrays(
    case_dir: Path,
    output_dir: Path | None,
    manifest: Mapping[str, Any],
    need_benchmark: bool,
    pool: Executor | None,
    verify_inputs: bool = True,
    inputs_run: Mapping[str, str] | None = None,
    key: Mapping[str, Any] | None = None,
    device: Mapping[str, np.ndarray] | None = None,
) -> _Opened:
    """Map device outputs, golden, benchmark and the block mask; check sizes now and sha256 in `pool`.

    Device outputs given as arrays (`device`) stand for the files of `output_dir`.

    When the manifest's benchmark summary was made under `key` (`summary_key(case, settings)`), it is
    opened too (its tiles hashed like the golden) and stands for measuring the benchmark, whose files are
    still size-checked and hashed.

    Every input is size-checked and hashed: a stale input means the golden no longer matches what the
    device was given. Where `bsa run` recorded the sha256 it checked an input against just before the
    device ran (`inputs_run`, from run.json), that record answers instead: equal to the manifest's, the
    device ran on the inputs this golden comes from (whatever happened to the file since); different,
    the case was generated again after the run (stale). Without `verify_inputs` only the block mask, which
    the judge reads, is hashed. Golden and benchmark files are hashed; device outputs are not (nothing to
    compare their hash with). Hashing runs alongside the metrics; `_Opened.stale` collects it.
    """
    executor = pool or _Inline()
    opened = _Opened()
    document = manifest.get("benchmark_summary")
    if isinstance(document, dict) and key is not None and document.get("key") == dict(key):
        opened.summary = _open_summary(case_dir, manifest, document, executor, opened)
    sections: list[tuple[str, Path, dict[str, np.ndarray]]] = [("golden", case_dir, opened.golden)]
    if device is not None:
        opened.device.update((name, device[name]) for name in GRAD_NAMES)
    else:
        assert output_dir is not None
        sections.insert(0, ("outputs", output_dir, opened.device))
    bench_entries = dict(iter_entries(manifest, "benchmark"))
    if bench_entries or need_benchmark:
        opened.benchmark = {}
        sections.append(("benchmark", case_dir, opened.benchmark))
    for section, base, arrays in sections:
        entries = dict(iter_entries(manifest, section))
        # With a summary the benchmark is hashed and read at its worst elements only, not measured.
        populate = section != "benchmark" or opened.summary is None
        for name in GRAD_NAMES:
            if name not in entries:
                opened.problems.append(f"{case_dir / MANIFEST}: no {section} entry for {name}")
                continue
            try:
                arrays[name] = map_array(base, entries[name], populate=populate)
            except DataError as exc:
                opened.problems.append(str(exc))
                continue
            if section != "outputs":
                path, sha = entry_path(base, entries[name]), entries[name].get("sha256")
                opened.pending.append(executor.submit(_stale, path, sha, section))
    inputs = dict(iter_entries(manifest, "inputs"))
    if "block_sparse_mask" not in inputs:
        opened.problems.append(f"{case_dir / MANIFEST}: no inputs entry for block_sparse_mask")
    for name, entry in inputs.items():
        try:
            array = map_array(case_dir, entry)
        except DataError as exc:
            opened.problems.append(str(exc))
            continue
        if name == "block_sparse_mask":
            opened.block_mask = array
        elif not verify_inputs:
            continue
        if inputs_run is not None and entry.get("sha256") and inputs_run.get(name) != entry["sha256"]:
            record = output_dir / RUN_RECORD if output_dir is not None else RUN_RECORD
            opened.problems.append(
                str(DataError(str(case_dir / entry["file"]), "the device ran on other contents (sha256 in "
                              f"{record}): the case was generated again since; run it again"))
            )  # fmt: skip
        elif inputs_run is None or name == "block_sparse_mask":  # the judge reads the mask: always hashed
            opened.pending.append(executor.submit(_stale, case_dir / entry["file"], entry.get("sha256"), "input"))
    return opened


def _open_summary(
    case_dir: Path, manifest: Mapping[str, Any], document: Mapping[str, Any], executor: Executor, opened: _Opened
) -> BenchmarkSummary | None:
    """Map a benchmark summary's tiles (hashed in `executor`) and rebuild it; None, with a problem noted,
    if it is malformed or a tiles file is missing or of the wrong size."""
    tiles = {}
    try:
        for name, entry in dict(document["tiles"]).items():
            tiles[name] = map_array(case_dir, entry, populate=True)
            path, sha = case_dir / entry["file"], entry.get("sha256")
            opened.pending.append(executor.submit(_stale, path, sha, "benchmark summary"))
        return summary_from_document(document, tiles)
    except DataError as exc:
        opened.problems.append(str(exc))
    except (KeyError, TypeError, ValueError) as exc:
        opened.problems.append(f"{case_dir / MANIFEST}: benchmark_summary: {exc}")
    return None


def _status_name(status: int | None) -> str:
    names = {code: name for name, code in ACLNN_STATUS.items()}
    return f"{status} ({names[status]})" if status in names else str(status)


def compare_case(
    case_dir: Path,
    output_dir: Path | None = None,
    run: RunSettings | None = None,
    pool: Executor | None = None,
    verify_inputs: bool = True,
    workers: int | None = None,
) -> CaseResult:
    """Judge one case directory's device outputs; never raises for bad case or output files (ERROR).

    Args:
        case_dir: a directory written by `bsa gen`.
        output_dir: the device output directory; default `<case_dir>/outputs`.
        run: settings given for the whole run (command line).
        pool: an executor hashing files while the metrics are measured; without one, a pool of `workers`
            threads (default: the CPU count) is made for the call, and `workers=1` works serially.
        verify_inputs: hash every input file, not only the block mask the judge reads.

    Raises:
        ValueError: a run threshold does not apply to the standard that judges this case (a usage error).
    """
    if pool is None and (workers or os.cpu_count() or 1) > 1:
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count()) as own:
            return _compare_case(Path(case_dir), output_dir, run, own, verify_inputs)
    return _compare_case(Path(case_dir), output_dir, run, pool, verify_inputs)


class RunThresholdError(ValueError):
    """A --threshold given for the whole run does not apply to a case's standard (a usage error)."""


@dataclass(frozen=True)
class DeviceOutcome:
    """What a device returned for one case, held in memory instead of written to an output directory.

    `status` is the aclnn status (0 for success); `grads` are dq, dk, dv for a call that succeeded (the
    case's dtype and shapes). `problems` say why the outcome cannot be judged (as a crash in run.json
    does): with any, the case is an ERROR.
    """

    status: int | None
    message: str | None = None
    grads: Mapping[str, np.ndarray] | None = None
    device: str | None = None
    problems: tuple[str, ...] = ()


IN_MEMORY = "(in memory)"
"""The `output_dir` of a result judged from arrays in memory (`judge_outcome`)."""


def judge_outcome(
    case_dir: Path,
    outcome: DeviceOutcome,
    manifest: Mapping[str, Any] | None = None,
    run: RunSettings | None = None,
    pool: Executor | None = None,
) -> CaseResult:
    """Judge a device's outcome held in memory exactly as `compare_case` judges the same written to files.

    The case's golden, benchmark (or its summary) and block mask are read and hashed from `case_dir`;
    its other inputs are not hashed again (whoever read them for the device checked them, as `bsa run`
    does). Never raises for bad case files (ERROR).

    Args:
        case_dir: a directory written by `bsa gen`.
        outcome: the status the device returned, and dq, dk, dv when it succeeded.
        manifest: the case's manifest as already read (default: read from `case_dir`).
        run: settings given for the whole run, as `compare_case`.
        pool: an executor hashing files while the metrics are measured (default: serially).

    Raises:
        ValueError: a gradient of a call that returned 0 is missing or not of the case's shape and dtype
            (naming the tensor, what was expected and what was given), or a run threshold does not apply.
    """
    started = time.perf_counter()
    return _judge_case(Path(case_dir), None, manifest, run, pool, False, started, outcome)


def _compare_case(
    case_dir: Path, output_dir: Path | None, run: RunSettings | None, pool: Executor | None, verify_inputs: bool
) -> CaseResult:
    """Judge one case; whatever its files hold, it ends as a verdict (an ERROR naming what went wrong).

    Raises:
        RunThresholdError: as `compare_case`.
    """
    started = time.perf_counter()
    try:
        case_dir = Path(case_dir)
        files = Path(output_dir) if output_dir is not None else case_dir / OUTPUTS_DIR
        return _judge_case(case_dir, files, None, run, pool, verify_inputs, started, None)
    except RunThresholdError:
        raise
    except Exception as exc:  # a case bsa did not foresee: one line, not a traceback
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        text = f"{case_dir}: cannot be judged: {type(exc).__name__}: {clip(str(exc))}{at} (a bug in bsa?)"
        out = Path(output_dir) if output_dir is not None else Path(case_dir) / OUTPUTS_DIR
        fields: dict[str, Any] = dict.fromkeys(
            ("spec", "device", "settings", "dtype", "layout", "expect_status", "status", "status_message")
        )
        return CaseResult(
            name=Path(case_dir).name, verdict=ERROR, errors=(text,), output_bytes=0,
            seconds=time.perf_counter() - started, case_dir=str(case_dir), output_dir=str(out),
            standard="-", checks=(), tensors=(), **fields,
        )  # fmt: skip


def _judge_case(
    case_dir: Path,
    output_dir: Path | None,
    manifest: Mapping[str, Any] | None,
    run: RunSettings | None,
    pool: Executor | None,
    verify_inputs: bool,
    started: float,
    outcome: DeviceOutcome | None,
) -> CaseResult:
    """Judge one case: from the files in `output_dir`, or from `outcome` in memory (then `output_dir` is None).

    The two differ only in where the status, the run's problems and the gradients come from.
    """
    run = run or RunSettings()
    base: dict[str, Any] = {"case_dir": str(case_dir), "output_dir": str(output_dir or IN_MEMORY)}

    def error(name: str, errors: list[str], **known: Any) -> CaseResult:
        fields: dict[str, Any] = dict.fromkeys(
            ("spec", "device", "settings", "dtype", "layout", "expect_status", "status", "status_message")
        )
        fields.update(standard="-", checks=(), tensors=())
        fields.update(known)
        seconds = time.perf_counter() - started
        return CaseResult(
            name=name, verdict=ERROR, errors=tuple(errors), output_bytes=0, seconds=seconds, **base, **fields
        )

    try:
        manifest = load_manifest(case_dir) if manifest is None else manifest
        case = case_from_manifest(manifest)
    except DataError as exc:
        return error(case_dir.name, [str(exc)])
    except (KeyError, TypeError, ValueError) as exc:
        return error(case_dir.name, [f"{case_dir / MANIFEST}: malformed manifest ({type(exc).__name__}: {exc})"])
    name = str(manifest.get("name", case_dir.name))
    try:
        settings = resolve_settings(case.dtype, manifest.get("compare"), run)
    except ValueError as exc:
        if str(exc).startswith("--threshold"):
            raise RunThresholdError(f"case {name!r}: {exc}") from None
        return error(name, [f"{case_dir / MANIFEST}: compare settings: {exc}"], dtype=case.dtype, layout=case.layout)
    known: dict[str, Any] = {
        "spec": manifest.get("spec"),
        "standard": settings.label,
        "settings": settings,
        "dtype": case.dtype,
        "layout": case.layout,
        "expect_status": case.expect.status,
    }
    if outcome is None:
        assert output_dir is not None
        try:
            check_output_dir(output_dir)
        except DataError as exc:
            return error(name, [str(exc)], **known)
        known.update({"device": None, **_run_device_info(output_dir)})
        problems, run_checks, inputs_run = _read_run_record(output_dir, (name, case_dir.name))
    else:
        known["device"] = outcome.device
        problems, run_checks, inputs_run = list(outcome.problems), [], None
    if problems:
        return error(name, problems, **known)
    if outcome is None:
        assert output_dir is not None
        try:
            status, status_message = _read_status(output_dir)
        except DataError as exc:
            return error(name, [str(exc)], **known)
    elif outcome.status is None:
        return error(name, ["no aclnn status given for the outcome"], **known)
    else:
        status, status_message = outcome.status, outcome.message
    known.update(status=status, status_message=status_message)
    checks = list(run_checks)
    if not case.expect.ok:
        passed = status == case.expect.status
        op = "==" if passed else "!="
        text = f"status {_status_name(status)} {op} expected {_status_name(case.expect.status)}"
        if status_message and not passed:
            text += f": {status_message}"
        checks.append(
            Check(
                "status",
                None,
                float(status),
                float(case.expect.status),
                passed,
                text,
                0.0 if passed else math.inf,
            )
        )
        if known.get("fault"):
            known["notes"] = (f"fault '{known['fault']}' not planted: the call is refused before any computation",)
        return _finish(name, base, known, checks, (), started, 0)
    if status != 0:
        text = f"status {_status_name(status)}, expected 0 (ACLNN_SUCCESS)" + (
            f": {status_message}" if status_message else ""
        )
        checks.append(Check("status", None, float(status), 0.0, False, text, math.inf))
        return _finish(name, base, known, checks, (), started, 0)
    checks.append(Check("status", None, 0.0, 0.0, True, "status 0 (ACLNN_SUCCESS)", 0.0))
    if outcome is not None:
        _check_grads(manifest, outcome.grads)
    need_bench = STANDARDS[settings.standard].needs_benchmark
    key = summary_key(case, settings)
    opened = _open_arrays(
        case_dir, output_dir, manifest, need_bench, pool, verify_inputs, inputs_run, key,
        device=outcome.grads if outcome is not None else None,
    )  # fmt: skip
    if opened.problems:
        opened.stale()
        return error(name, opened.problems, **known)
    if need_bench and not opened.benchmark and opened.summary is None:
        opened.stale()
        text = f"{case_dir / MANIFEST}: no benchmark outputs, which standard {settings.label!r} needs"
        return error(name, [text], **known)
    assert opened.block_mask is not None
    try:
        tensors = judge_tensors(
            case, settings, opened.device, opened.golden, opened.benchmark, opened.block_mask, opened.summary
        )
    except ValueError as exc:
        opened.stale()
        return error(name, [f"{case_dir}: {exc}"], **known)
    stale = opened.stale()  # the verdict only stands if every file hashed as the manifest says
    if stale:
        return error(name, stale, **known)
    if known.get("fault"):
        known["notes"] = _fault_notes(str(known["fault"]), case, opened.block_mask)
    if not all(t.passed for t in tensors):
        known["selection"] = selection(case, opened.block_mask)
    output_bytes = sum(a.nbytes for a in opened.device.values())
    return _finish(name, base, known, checks, tensors, started, output_bytes)


def _fault_notes(fault: str, case: Case, block_mask: np.ndarray) -> tuple[str, ...]:
    """Return a note when the planted fault does not apply to the case (the device ran it clean)."""
    from . import emulator  # only cases run with a planted fault need it

    try:
        reason = emulator.fault_not_applied(fault, case, block_mask)
    except ValueError:  # a fault this bsa does not know (a record of another version)
        return ()
    return () if reason is None else (reason,)


def selection(case: Case, block_mask: np.ndarray) -> Selection | None:
    """Return the case's block mask as a `Selection`, or None when it has more than SELECTION_MAX_CELLS cells."""
    shape = tuple(int(n) for n in block_mask.shape)
    if len(shape) != 4 or math.prod(shape) > SELECTION_MAX_CELLS:
        return None
    cells = np.full(shape, "-", dtype="<U1")
    for span in case.spans():
        mask = mask_view(case, block_mask, span)
        n_q, n_kv = mask.shape[1:]
        cells[span.batch, :, :n_q, :n_kv] = np.where(mask, "1", "0")
    rows = tuple("".join(row) for row in cells.reshape(-1, shape[3]))
    return Selection(shape, rows)


def _check_grads(manifest: Mapping[str, Any], grads: Mapping[str, np.ndarray] | None) -> None:
    """Raise ValueError unless `grads` holds dq, dk, dv of the dtypes and shapes the manifest's `outputs` give."""
    outputs = manifest.get("outputs") or {}
    for name in GRAD_NAMES:
        entry = outputs.get(name)
        if entry is None:
            continue  # the manifest's own problem: _open_arrays reports it
        expected = f"{entry['dtype']} {list(entry['shape'])}"
        array = (grads or {}).get(name)
        if array is None:
            raise ValueError(f"{name}: missing; expected {expected}")
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{name}: a {type(array).__name__}, not a NumPy array; expected {expected}")
        got = f"{_dtype_name(array.dtype)} {list(array.shape)}"
        if array.dtype != numpy_dtype(entry["dtype"]) or list(array.shape) != list(entry["shape"]):
            raise ValueError(f"{name}: expected {expected}, got {got}")


def _dtype_name(dtype: np.dtype) -> str:
    """Return the manifest name of a NumPy dtype (bfloat16 for ml_dtypes' type)."""
    return "bfloat16" if dtype == numpy_dtype("bfloat16") else dtype.name


def _finish(
    name: str,
    base: Mapping[str, Any],
    known: Mapping[str, Any],
    checks: list[Check],
    tensors: tuple[TensorResult, ...],
    started: float,
    output_bytes: int,
) -> CaseResult:
    passed = all(c.passed for c in checks) and all(t.passed for t in tensors)
    return CaseResult(
        name=name,
        verdict=PASS if passed else FAIL,
        errors=(),
        checks=tuple(checks),
        tensors=tensors,
        output_bytes=output_bytes,
        seconds=time.perf_counter() - started,
        **base,
        **known,
    )


def _check_run_thresholds(case_dirs: Sequence[Path], run: RunSettings) -> None:
    """Raise ValueError before any judging when a run threshold does not apply to some case's standard."""
    for case_dir in case_dirs:
        try:
            manifest = load_manifest(Path(case_dir))
            dtype = manifest["params"]["dtype"]
            case_settings = manifest.get("compare")
            validate_settings(case_settings or {})
        except (DataError, KeyError, TypeError, ValueError):
            continue  # the case will be an ERROR; its settings do not matter here
        try:
            resolve_settings(dtype, case_settings, run)
        except ValueError as exc:
            raise ValueError(f"case {manifest.get('name', Path(case_dir).name)!r}: {exc}") from None


PARALLEL_MIN_BYTES = 384 << 20
"""Device output bytes (384 MiB) from which a suite is judged in several processes by default. A worker
takes about half a second to start: on the 2-core development machine, 300 MB of outputs took as long
with two processes as with one, 600 MB 20-30% less."""


def suite_jobs(case_dirs: Sequence[Path], outputs_root: Path | None, jobs: int | None) -> int:
    """Return how many processes judge the suite: `jobs` if given, else the CPU count for a large suite, else 1."""
    if jobs is not None:
        return max(1, min(jobs, len(case_dirs)))
    if len(case_dirs) < 2:
        return 1
    total = sum(_output_bytes(_output_dir(Path(case_dir), outputs_root)) for case_dir in case_dirs)
    return min(cpu_count(), len(case_dirs)) if total >= PARALLEL_MIN_BYTES else 1


def _output_dir(case_dir: Path, outputs_root: Path | None) -> Path:
    return case_dir / OUTPUTS_DIR if outputs_root is None else Path(outputs_root) / case_dir.name


def _judge_in_worker(case_dir: Path, output_dir: Path, run: RunSettings, verify_inputs: bool) -> CaseResult:
    """Judge one case in a worker process, hashing alongside on a thread of its own."""
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as hashing:
        return _compare_case(case_dir, output_dir, run, hashing, verify_inputs)


HASH_THREADS = 2
"""Threads hashing a case's golden, benchmark and input files while the metrics are measured."""


def compare_suite(
    case_dirs: Sequence[Path],
    outputs_root: Path | None = None,
    run: RunSettings | None = None,
    workers: int | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
    verify_inputs: bool = True,
    jobs: int | None = 1,
) -> SuiteResult:
    """Judge every case directory; a case that cannot be judged is an ERROR, the others still get judged.

    Args:
        case_dirs: case directories (see `store.select_cases`).
        outputs_root: where device outputs are, as `<outputs_root>/<case dir name>`; default each case's
            `outputs/`.
        run: settings given for the whole run.
        workers: threads hashing files while the metrics are measured, when judging in this process only
            (default: the CPU count; 1 hashes in the measuring thread, before the metrics). With several
            processes each has `HASH_THREADS`.
        on_case: called with each result as it is done (progress).
        verify_inputs: hash every input file (default), not only the block mask the judge reads.
        jobs: processes judging cases side by side; None picks `suite_jobs`'s default. Results are the
            same as with one process and come back in the order of `case_dirs`.

    Raises:
        ValueError: the run settings are invalid, or a run threshold does not apply to a case's standard.
    """
    run = run or RunSettings()
    run.validate()
    started = time.perf_counter()
    if run.thresholds:
        _check_run_thresholds(case_dirs, run)
    work = [(Path(case_dir), _output_dir(Path(case_dir), outputs_root)) for case_dir in case_dirs]
    processes = suite_jobs(case_dirs, outputs_root, jobs)
    if processes > 1:
        results = _judge_in_processes(work, run, verify_inputs, processes, on_case)
    else:
        results = []
        workers = workers or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=workers) if workers > 1 else contextlib.nullcontext() as pool:
            for case_dir, output_dir in work:
                result = _compare_case(case_dir, output_dir, run, pool, verify_inputs)
                results.append(result)
                if on_case is not None:
                    on_case(result)
    return SuiteResult(tuple(results), time.perf_counter() - started)


def _judge_in_processes(
    work: Sequence[tuple[Path, Path]],
    run: RunSettings,
    verify_inputs: bool,
    processes: int,
    on_case: Callable[[CaseResult], None] | None,
) -> list[CaseResult]:
    """Judge cases here and in `processes - 1` fresh worker processes; return results in the order of `work`.

    All draw from one queue, largest case first. This process starts judging at once (a worker takes
    about half a second to start), and a thread keeps each worker fed. The cases of a worker that dies
    go back to the queue and are judged here. Workers ignore Ctrl-C: on an interrupt here no new case
    starts, the workers' cases in flight end unreported, and the interrupt goes on.
    """
    queue = collections.deque(sorted(range(len(work)), key=lambda i: -_output_bytes(work[i][1])))
    results: list[CaseResult | None] = [None] * len(work)
    lock = threading.Lock()
    stop = threading.Event()

    def take() -> int | None:
        with lock:
            return None if stop.is_set() or not queue else queue.popleft()

    def hand_back(indices: list[int]) -> None:
        with lock:
            queue.extendleft(sorted(indices, reverse=True))

    def finish(index: int, result: CaseResult) -> None:
        with lock:
            results[index] = result
            if on_case is not None and not stop.is_set():
                on_case(result)

    def feed(pool: ProcessPoolExecutor) -> None:
        running: dict[Future[CaseResult], int] = {}
        while True:
            while len(running) < processes - 1 and (index := take()) is not None:
                try:
                    running[pool.submit(_judge_in_worker, *work[index], run, verify_inputs)] = index
                except BrokenProcessPool:  # a worker died since the last case came back
                    hand_back([index, *running.values()])
                    return
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                index = running.pop(future)
                try:
                    result = future.result()
                except BrokenProcessPool:  # a worker died (killed, out of memory): this process takes over
                    hand_back([index, *running.values()])
                    return
                finish(index, result)

    def judge_here(hashing: Executor) -> None:
        while (index := take()) is not None:
            finish(index, _compare_case(*work[index], run, hashing, verify_inputs))

    with worker_pool(processes - 1, blas_threads=1, ignore_interrupt=True) as pool:
        feeder = _Feeder(feed, pool)
        try:
            with ThreadPoolExecutor(max_workers=HASH_THREADS) as hashing:
                judge_here(hashing)
                feeder.join()
                judge_here(hashing)  # cases handed back by a worker that died
        except BaseException:
            stop.set()
            feeder.join(reraise=False)
            raise
    missing = [str(work[i][0]) for i, result in enumerate(results) if result is None]
    if missing:
        raise RuntimeError(f"cases left unjudged: {', '.join(missing)}")
    return [result for result in results if result is not None]


class _Feeder(threading.Thread):
    """Runs `feed(pool)` on a thread; `join` re-raises what it raised (a worker's unexpected exception)."""

    def __init__(self, feed: Callable[[ProcessPoolExecutor], None], pool: ProcessPoolExecutor) -> None:
        super().__init__(daemon=True)
        self._feed, self._pool = feed, pool
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._feed(self._pool)
        except BaseException as exc:  # handed to the joining thread
            self._error = exc

    def join(self, timeout: float | None = None, reraise: bool = True) -> None:
        super().join(timeout)
        if reraise and self._error is not None:
            error, self._error = self._error, None
            raise error


def _output_bytes(output_dir: Path) -> int:
    total = 0
    if output_dir.is_symlink():
        return 0
    for name in GRAD_NAMES:
        with contextlib.suppress(OSError):
            total += (output_dir / f"{name}.bin").stat().st_size
    return total


__all__ += ["ERROR", "FAIL", "PASS"]
