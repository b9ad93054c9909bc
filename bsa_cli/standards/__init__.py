"""Comparison standards, their thresholds, and the settings a case is judged by.

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

Settings precedence, for each case (one rule, also in docs/compare.md):

1. standard: `--standard` > the case's `compare.standard` (from its spec) > `double-benchmark`;
2. thresholds: the standard's defaults for the case dtype (with its preset) < the case's
   `compare.thresholds` (dropped, except the general keys, when `--standard` names another standard)
   < `--threshold`; a `--threshold` key the case's standard does not know is a usage error;
3. padding: `--padding` > the case's `compare.padding` > `ignore`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.case import Case
from ..core.errors import suggest
from .bias import BIAS_FLOOR, BIAS_Z

ERR_THD = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-14}
"""ATK's err_thd: the floor of benchmark errors, and the |golden| above which relative errors count."""
SMALL_VALUE_THD = {"float16": 2.0**-16, "bfloat16": 2.0**-16, "float32": 2.0**-30}
"""ATK's small-value rule: an element with |golden| <= err_thd is an error when |a - g| exceeds this."""
SINGLE_T = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-13}
"""The single-reference standard's T per dtype."""
ALLCLOSE_TOL = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5)}
"""torch.testing.assert_close defaults (rtol, atol) per dtype."""


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
    "bias_z": "standard errors a systematic relative error must exceed to fail the bias check (default 5 "
    "under double-benchmark; inf, the default of the other standards, turns the check off)",
    "bias_floor": "relative systematic error the bias check never fails below (default 2^-16)",
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
    bias_z = BIAS_Z if standard == "double-benchmark" else math.inf
    general = {"zero_atol": 0.0, "rtol": rtol, "atol": atol, "bias_z": bias_z, "bias_floor": BIAS_FLOOR}
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


def case_settings(case: Case) -> Settings:
    """Return the settings a case is judged by when the command line sets nothing (its spec, else defaults)."""
    return resolve_settings(case.dtype, case.compare or None, RunSettings())
