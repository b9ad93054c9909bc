"""Comparison standards, their thresholds, and the settings a case is judged by.

Standards, one `Standard` subclass each (docs/compare.md documents them for users; docs/operator.md
section 4 has the sources):

* `double-benchmark` (default, `double_benchmark.py`): CANN/ATK, the device's errors over the benchmark's;
* `mixed-tolerance` (`mixed_tolerance.py`): opbase's open standard, the matched ratio within atol + rtol |g|
  and the largest absolute error, a preset per document version;
* `single` (`single.py`): MERE < T and MARE < 10 T;
* `allclose` (`allclose.py`): at most a fraction `mismatch` of elements with |a - g| > atol + rtol |g|; or
  msOpST's form (`allclose:msopst`, or any of diff_thd / pct_thd / max_diff given);
* `fa-ratio` (`fa_ratio.py`): max abs error <= k x the benchmark's max abs error + an ULP-sized floor.

A new standard is one module with one subclass of `Standard` (`base.py` says what it defines), imported
here; nothing outside this package names a standard.

Settings precedence, for each case (one rule, also in docs/compare.md):

1. standard: `--standard` > the case's `compare.standard` (from its spec) > `double-benchmark`;
2. thresholds: the standard's defaults for the case dtype (with its preset) < the case's
   `compare.thresholds` (dropped, except the general keys, when `--standard` names another standard)
   < `--threshold`; a `--threshold` key the case's standard does not know is a usage error;
3. padding: `--padding` > the case's `compare.padding` > `ignore`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from ..core.errors import suggest
from . import allclose, double_benchmark, fa_ratio, mixed_tolerance, single  # noqa: F401 (a module's class registers its standard)
from .base import GENERAL_KEYS, STANDARDS, Standard, ThresholdNotApplicable
from .double_benchmark import ERR_THD as ERR_THD
from .double_benchmark import SMALL_VALUE_THD as SMALL_VALUE_THD

if TYPE_CHECKING:
    from ..core.case import Case

DEFAULT_STANDARD = "double-benchmark"
Padding = Literal["ignore", "zero"]
PADDING_MODES: tuple[Padding, ...] = ("ignore", "zero")
SETTINGS_KEYS = ("standard", "thresholds", "padding")


def parse_standard(text: str) -> tuple[Standard, str | None]:
    """Split 'name' or 'name:preset' and check both.

    Raises:
        ValueError: unknown standard or preset, with the allowed names.
    """
    allowed = ", ".join(label for standard in STANDARDS.values() for label in standard.labels)
    if not isinstance(text, str):
        raise ValueError(f"standard {text!r} is not a name; allowed: {allowed}")
    name, _, preset = text.partition(":")
    if name not in STANDARDS:
        raise ValueError(f"unknown standard {text!r}{suggest(name, STANDARDS)}; allowed: {allowed}")
    presets = STANDARDS[name].presets
    if preset and preset not in presets:
        listed = ", ".join(f"{name}:{p}" for p in presets) or "none"
        raise ValueError(f"standard {name!r} has no preset {preset!r}{suggest(preset, presets)}; presets: {listed}")
    if not preset and ":" in text:
        raise ValueError(f"standard {text!r} has an empty preset; write {name!r}")
    return STANDARDS[name], preset or None


def _check_padding(padding: Any) -> None:
    if padding not in PADDING_MODES:
        raise ValueError(f"padding {padding!r} is not one of {', '.join(PADDING_MODES)}")


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
    standard, preset = parse_standard(settings.get("standard", DEFAULT_STANDARD))
    standard.check(settings.get("thresholds") or {}, preset)
    _check_padding(settings.get("padding", "ignore"))


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
        if self.padding is not None:
            _check_padding(self.padding)
        if self.standard is not None:
            standard, preset = parse_standard(self.standard)
            standard.check(dict(self.thresholds), preset)
            return
        known = {k for s in STANDARDS.values() for k in s.threshold_keys}
        for key, value in self.thresholds.items():
            if key not in known:
                raise ValueError(f"unknown threshold {key!r}{suggest(key, known)}; keys: {', '.join(sorted(known))}")
            next(s for s in STANDARDS.values() if key in s.threshold_keys).check({key: value})


@dataclass(frozen=True)
class Settings:
    """The resolved comparison settings of one case."""

    standard: Standard  # a report read back holds its name: __post_init__ makes it the standard again
    preset: str | None
    thresholds: Mapping[str, float]  # every key the standard uses, resolved
    padding: Padding
    origin: Mapping[str, str]  # "standard", "padding" and each threshold key -> default|preset|case|cli

    def __post_init__(self) -> None:
        # A report of another bsa may name a standard this one lacks: read back, it stays that name.
        object.__setattr__(self, "standard", STANDARDS.get(self.standard, self.standard))

    @property
    def label(self) -> str:
        return f"{self.standard}:{self.preset}" if self.preset else str(self.standard)

    @property
    def msopst(self) -> bool:
        """Whether an allclose standard uses msOpST's form (diff_thd is its key alone)."""
        return "diff_thd" in self.thresholds


def resolve_settings(dtype: str, case_settings: Mapping[str, Any] | None, run: RunSettings) -> Settings:
    """Combine a case's `compare` settings with the run's, by the precedence in this module's docstring.

    Raises:
        ThresholdNotApplicable: a run threshold does not apply to the standard the case is judged by.
        ValueError: the case's settings are invalid.
    """
    case_settings = dict(case_settings or {})
    validate_settings(case_settings)
    case_standard, case_preset = parse_standard(case_settings.get("standard", DEFAULT_STANDARD))
    standard, preset = parse_standard(run.standard) if run.standard is not None else (case_standard, case_preset)
    source = "cli" if run.standard is not None else "case" if "standard" in case_settings else "default"
    plain, thresholds = standard.defaults(dtype), standard.defaults(dtype, preset)
    keys = [*(k for k in plain if k in thresholds), *(k for k in thresholds if k not in plain)]  # reports' order
    origin = {"standard": source} | {k: "default" if plain.get(k) == thresholds[k] else "preset" for k in keys}
    for key in run.thresholds:
        if key not in standard.threshold_keys:
            raise ThresholdNotApplicable(
                f"--threshold {key}: does not apply to standard {str(standard)!r} that judges this case; "
                f"its keys: {', '.join(standard.threshold_keys)} (pass --standard to judge every case by one standard)"
            )
    case_thresholds = case_settings.get("thresholds") or {}
    given = {k: v for k, v in case_thresholds.items() if case_standard == standard or k in GENERAL_KEYS}
    for where, values in (("case", given), ("cli", run.thresholds)):
        thresholds.update((k, float(v)) for k, v in values.items())
        origin.update(dict.fromkeys(values, where))
    thresholds, origin = standard.finish(thresholds, origin, preset)
    padding = run.padding or case_settings.get("padding") or "ignore"
    origin["padding"] = "cli" if run.padding else "case" if case_settings.get("padding") else "default"
    return Settings(standard, preset, thresholds, cast(Padding, padding), origin)


def side_settings(dtype: str, case_settings: Mapping[str, Any] | None, settings: Settings) -> tuple[Settings, ...]:
    """Return the settings of each side-by-side standard (`Standard.side_by_side`) other than the one that
    decides: as `--standard NAME` would resolve them for the case (its own thresholds where its spec names that
    standard), with the deciding settings' padding and general keys."""
    sides = []
    for standard in STANDARDS.values():
        if standard.side_by_side and standard != settings.standard:
            side = resolve_settings(dtype, case_settings, RunSettings(standard=str(standard)))
            general = {k: v for k, v in settings.thresholds.items() if k in ("zero_atol", "bias_floor")}
            thresholds = {**side.thresholds, **general}
            sides.append(Settings(standard, side.preset, thresholds, settings.padding, side.origin))
    return tuple(sides)


def case_settings(case: Case) -> Settings:
    """Return the settings a case is judged by when the command line sets nothing (its spec, else defaults)."""
    return resolve_settings(case.dtype, case.compare or None, RunSettings())
