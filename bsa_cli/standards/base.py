"""`Standard`: one comparison standard, with everything that differs between the standards as its attributes.

Every layer asks the standard (`standard.needs_benchmark`, `standard.defaults(dtype)`, `standard.checks(...)`)
and never compares its name. A `Standard` is the string of its name (as an `Op` is), so settings, reports
and case.json hold it as they always did. Each standard is one subclass in its own module, and defining the
subclass registers it in `STANDARDS` (as torch.testing's `_comparison.py` has one `Pair` class per kind of
input). Nothing here imports NumPy at module level: validating a spec stands on this package.

`Check`, one pass/fail decision, is here because the standards make them; `compare.results` hands it on.
"""

from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.errors import suggest

if TYPE_CHECKING:
    import numpy as np

#: Default `bias_z` of the standards that run the bias check (`bias.py`): standard errors a bias must
#: exceed to count as certain.
BIAS_Z = 5.0

#: Default `bias_floor`: the relative bias float32 accumulation cannot reach.
BIAS_FLOOR = 2.0**-16

#: torch.testing.assert_close defaults (rtol, atol) per dtype.
ALLCLOSE_TOL = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5)}

#: Threshold keys every standard accepts.
GENERAL_KEYS: dict[str, str] = {
    "zero_atol": "largest |value| allowed where the output must be 0 (empty rows, never-selected kv "
    "positions, zero padding); default 0 (exactly 0); inf turns those checks off",
    "rtol": "relative tolerance of the mismatch count (torch assert_close default of the dtype)",
    "atol": "absolute tolerance of the mismatch count (torch assert_close default of the dtype)",
    "bias_z": "standard errors a systematic relative error must exceed to fail the bias check (default 5 "
    "under double-benchmark; inf, the default of the other standards, turns the check off)",
    "bias_floor": "relative systematic error the bias check never fails below (default 2^-16)",
}

#: A tensor's errors against the golden, as `compare.results.ErrorStats` holds them (a layer above this one).
Stats = Any

#: Resolved thresholds, and where each comes from ("default", "preset", "case", "cli").
Resolved = tuple[dict[str, float], dict[str, str]]


def by_dtype(table: Mapping[str, Any], dtype: str) -> Any:
    """A per-dtype value of `table`, float32's for a dtype it does not name."""
    return table.get(dtype, table["float32"])


class ThresholdNotApplicable(ValueError):
    """A `--threshold` given for the whole run names a key the standard that judges a case does not know."""


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


def fmt(value: float | None) -> str:
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


def upper(
    name: str, tensor: str, value: float, limit: float, text: str, strict: bool = False, detail: str = ""
) -> Check:
    """A check `value <= limit` (or `<` with `strict`); `detail` follows the comparison in its text."""
    passed = value < limit if strict else value <= limit
    severity = value / limit if limit > 0 else 0.0 if value <= 0 else math.inf
    if not passed and severity <= 1:
        severity = 1.0 + 1e-12  # a strict limit reached exactly still fails
    op = ("<" if strict else "<=") if passed else (">=" if strict else ">")
    text = f"{tensor} {text} {fmt(value)} {op} {fmt(limit)}{detail}"
    return Check(name, tensor, float(value), float(limit), passed, text, severity)


@dataclass(frozen=True)
class Measured:
    """What a standard's checks read of one tensor."""

    tensor: str
    device: Stats
    bench: Stats | None  # None where no benchmark was measured (a standard that does not need one)
    tile_max: float | None = None  # the worst 16x16 tile's RMSE ratio; None without the benchmark
    extra: Mapping[str, float] = field(default_factory=dict)  # what the standard's `measure` returned
    dtype: str | None = None  # the tensor's dtype (float16, bfloat16, float32)


#: The comparison standards by name, in the order help and messages list them (`Standard.rank`).
STANDARDS: dict[str, Standard] = {}


class Standard(str, metaclass=ABCMeta):
    """A comparison standard: its name (the string itself), threshold keys, defaults, rules and checks.

    A new standard is one subclass in its own module (imported by the package's face), and nothing outside
    this package changes. It sets `name`, `summary`, `keys` and `own_defaults`, and defines `checks` (Checks
    from a tensor's measured errors, `upper` makes most). Where it differs from the usual, it also sets
    `presets`, `needs_benchmark`, `bias_z`, `atk_name`/`atk_keys` and `rank`, and overrides the hooks:
    `defaults` (a preset that drops a key, other general defaults), `check_rules` (keys that exclude each
    other), `finish` (a default derived from a given key) and `measure` (a value its checks need from the
    golden itself).

    Attributes:
        name: what `--standard` and a spec's `compare.standard` call it.
        summary: one line for `--help` and docs.
        keys: its own threshold keys with their meaning (every standard also takes `GENERAL_KEYS`).
        own_defaults: its own keys' defaults (without a preset): a number, or a table by dtype (`by_dtype`).
        presets: `name:preset` threshold sets.
        needs_benchmark: its checks measure the device against the benchmark (kernel-faithful) outputs.
        bias_z: its default `bias_z` (inf: the bias check is off unless asked for).
        atk_name, atk_keys: ATK's name of the standard and of its limits (bsa key -> ATK key), for export;
            None where ATK has no such standard (export then writes bsa's own).
        ttk_compare, ttk_note: TTK's compare method closest to it (`--compare`, hicann/ops-test-kit
            docs/Precision_Comparison.md 36750932), and how TTK's judges otherwise ("" where it is its rule);
            `ttk_fields` the CSV's tolerance columns that method reads, for export.
        rank: where lists of standards put it, lowest first.
        side_by_side: reports show its verdict beside the deciding standard's, whichever that is (issue 30:
            a team moving between double-benchmark and mixed tolerance sees which cases change).
        recheck_margin: a failing case whose failed checks are all its own, each at most this many times its
            limit (`Check.severity`), fails narrowly: `bsa check --recheck` reruns it (docs/compare.md).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    keys: ClassVar[Mapping[str, str]]
    own_defaults: ClassVar[Mapping[str, float | Mapping[str, float]]]
    presets: ClassVar[Mapping[str, Mapping[str, float]]] = {}
    needs_benchmark: ClassVar[bool] = False
    bias_z: ClassVar[float] = math.inf
    atk_name: ClassVar[str | None] = None
    atk_keys: ClassVar[Mapping[str, str]] = {}
    ttk_compare: ClassVar[str] = "mixed"
    ttk_note: ClassVar[str] = ""
    rank: ClassVar[float] = math.inf
    side_by_side: ClassVar[bool] = False
    recheck_margin: ClassVar[float] = 1.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name in STANDARDS:
            raise ValueError(f"two standards named {cls.name!r}")
        ranked = sorted([*STANDARDS.values(), cls()], key=lambda s: s.rank)
        STANDARDS.clear()
        STANDARDS.update((str(s), s) for s in ranked)

    def __new__(cls) -> Standard:
        return super().__new__(cls, cls.name)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return get, (str(self),)  # unpickled as the one standard of that name (worker processes)

    def ttk_fields(self, thresholds: Mapping[str, float], outputs: int) -> dict[str, str]:
        """Return TTK's CSV tolerance columns (`precision_tolerances`, `absolute_precision`) for a case of
        `outputs` outputs judged by `thresholds`; none by default (TTK's mixed reads no CSV column)."""
        return {}

    @property
    def threshold_keys(self) -> list[str]:
        """Every threshold key it accepts: its own, then the general ones."""
        return [*self.keys, *GENERAL_KEYS]

    @property
    def labels(self) -> list[str]:
        """How `--standard` may name it: alone and with each preset."""
        return [str(self), *(f"{self}:{p}" for p in self.presets)]

    def defaults(self, dtype: str, preset: str | None = None) -> dict[str, float]:
        """Return its thresholds for a dtype before any override, with `preset` applied: its own, then the
        general ones."""
        rtol, atol = by_dtype(ALLCLOSE_TOL, dtype)
        general = {"zero_atol": 0.0, "rtol": rtol, "atol": atol, "bias_z": self.bias_z, "bias_floor": BIAS_FLOOR}
        own = {k: by_dtype(v, dtype) if isinstance(v, Mapping) else v for k, v in self.own_defaults.items()}
        return {**own, **(self.presets[preset] if preset else {}), **general}

    def check(self, thresholds: Any, preset: str | None = None) -> dict[str, float]:
        """Return given thresholds as floats after checking their keys, their values and its own rules.

        Raises:
            ValueError: not a mapping, a key it does not know (with the keys it does), a value that is not
                a number >= 0, or thresholds its rules forbid together.
        """
        if not isinstance(thresholds, Mapping):
            raise ValueError(f"thresholds must be a mapping of key: number, got {thresholds!r}")
        allowed = self.threshold_keys
        checked = {}
        for key, value in thresholds.items():
            if key not in allowed:
                raise ValueError(
                    f"threshold {key!r} does not apply to standard {str(self)!r}{suggest(str(key), allowed)}; "
                    f"its keys: {', '.join(allowed)}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"threshold {key!r} must be a number >= 0 (inf allowed), got {value!r}")
            checked[str(key)] = float(value)
        self.check_rules(checked, preset)
        return checked

    def check_rules(self, thresholds: Mapping[str, float], preset: str | None) -> None:
        """Raise ValueError where given thresholds break its own rules (none by default)."""

    def finish(self, thresholds: dict[str, float], origin: dict[str, str], preset: str | None) -> Resolved:
        """Return resolved thresholds and their origins after its own rules of resolution (none by default).

        Args:
            thresholds, origin: resolved by precedence; an origin of "case" or "cli" marks a key given.
        """
        return thresholds, origin

    def measure(self, golden: np.ndarray, dtype: str, thresholds: Mapping[str, float]) -> dict[str, float]:
        """Return what its checks need of the golden beyond the metrics (a tensor's `extra`; none by default)."""
        return {}

    @abstractmethod
    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        """Return its checks of one tensor, measured as `m`, under the resolved thresholds `t`."""


def get(name: str) -> Standard:
    """Return the standard of a name (a `Standard` is returned as it is).

    Raises:
        ValueError: a name that is no standard.
    """
    standard = STANDARDS.get(name)
    if standard is None:
        raise ValueError(f"unknown standard {name!r:.60}; allowed: {', '.join(STANDARDS)}")
    return standard
