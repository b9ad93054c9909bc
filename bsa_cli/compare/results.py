"""The results of judging, as data: checks, error statistics, located errors, case and suite verdicts.

Reports (`bsa_cli.report`) render these dataclasses to the terminal, JSON, JUnit, HTML and CSV; nothing
here computes or prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal, get_args

import numpy as np

from ..core.exit_codes import exit_code
from ..ops import Op, split_folder_name
from ..ops.backward import BACKWARD
from ..standards import Settings
from ..standards.base import Check as Check
from ..standards.base import fmt as _fmt  # noqa: F401 (moved with Check; structural.py imports it here)
from ..standards.bias import Bias

#: A case's verdict: PASS, FAIL, ERROR (it could not be judged), or SKIP (this op of the case is not judged:
#: its operator refuses what another op accepts, or the device cannot run it; `errors` says why).
Verdict = Literal["PASS", "FAIL", "ERROR", "SKIP"]
PASS: Final = "PASS"
FAIL: Final = "FAIL"
ERROR: Final = "ERROR"
SKIP: Final = "SKIP"


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
    # Mismatches at each side-by-side standard's rtol/atol (`standards.side_settings`), and the golden value
    # where the error is largest (mixed tolerance's ULP anchor): the device's only.
    side_mismatch_counts: tuple[int, ...] | None = None
    max_abs_golden: float | None = None
    # The error balance (EB) of CANN's test helpers: mean((a - g) / max(1, |g|)), a signed systematic error that
    # does not vanish on small goldens (docs/compare.md, "Error balance").
    error_balance: float | None = None
    ulp_max: float | None = None
    ulp_mean: float | None = None
    ulp_histogram: tuple[int, ...] | None = None
    msopst_err_count: int | None = None
    msopst_max_err: float | None = None
    # The bias check's figures (device and benchmark): the mean signed relative error (a - g) / g over the
    # large values (|g| > err_thd), a relative systematic error, and its standard error (`compare.bias`).
    bias: float | None = None
    bias_se: float | None = None
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


#: `ErrorStats` fields added for msprobe's CSV: a benchmark summary written before them may lack them.
MSPROBE_FIELDS = tuple(
    f.name for f in fields(ErrorStats) if f.name.startswith(("thousandth", "five_", "value_", "golden_"))
)
#: `ErrorStats` fields of the device alone: a benchmark summary leaves them out (its bytes stay as they were).
DEVICE_ONLY_FIELDS = (*MSPROBE_FIELDS, "side_mismatch_counts", "max_abs_golden", "error_balance")


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


#: Upper edges of the ULP-error chart's bins (the last bin holds everything above 1024 ULP).
ULP_CHART_EDGES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


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
    bias: Bias | None = None  # the bias check's estimate (`bias.py`), where the check ran
    #: The checks each side-by-side standard that does not decide makes of it, by its label
    #: (`standards.side_settings`): what that standard's verdict would be.
    sides: Mapping[str, tuple[Check, ...]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def passed_by(self, label: str) -> bool:
        """Whether a side-by-side standard passes it (its own checks where it has none of that standard's)."""
        return all(c.passed for c in self.sides.get(label, self.checks))

    @property
    def matched_ratio(self) -> float | None:
        """Mixed tolerance's matched ratio (its `matched_ratio` check, deciding or side by side), if judged."""
        every = (*self.checks, *(c for checks in self.sides.values() for c in checks))
        return next((c.value for c in every if c.name == "matched_ratio"), None)

    @property
    def max_abs_error(self) -> float:
        """The largest absolute error over the judged finite elements."""
        return self.device.max_abs_err


#: A kind of cause a diagnosis names.
DiagnosisKind = Literal[
    "non-finite",
    "not-written",
    "block-selection",
    "tail-block",
    "length-boundary",
    "gqa-head-mapping",
    "gqa-group-sum",
    "scale",
    "softmax-lse",
    "softmax-grad",
    "precision-bias",
    "accumulation-precision",
    "accumulation-race",
    "rows-permuted",
    "tile-local",
    "layout",
    "lse-unwritten",
    "padding-rows-read",
    "scale-mismatch",
    "no-information",
    "partial-missing",
]
#: The fixed vocabulary of a diagnosis's causes (docs/compare.md, "Diagnosis"); `compare.diagnose`
#: tests some of them (`diagnose.TESTED_KINDS`).
DIAGNOSIS_KINDS: tuple[DiagnosisKind, ...] = get_args(DiagnosisKind)


@dataclass(frozen=True)
class Cause:
    """One likely cause of a failing case: a kind of `DIAGNOSIS_KINDS`, its score in [0, 1] (the share of
    the error it explains, or how well the errors' pattern fits it), one line of evidence, the tensors it
    concerns and where (blocks, rows) in the operator's terms."""

    kind: str
    score: float
    evidence: str
    tensors: tuple[str, ...]
    where: tuple[str, ...]


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis the diagnosis tried (`bsa compare --explain`): its kind, what it supposes, its score
    and what came of it (explained, or why it was ruled out or not tried)."""

    kind: str
    supposes: str
    score: float
    outcome: str


#: Largest block mask (cells) a failing case's result keeps for its pictures.
SELECTION_MAX_CELLS = 1 << 16


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
class StepTime:
    """The kernel time of one operator call of a case, as run.json's `timing` records it (`bsa run --time`)."""

    step: str  # forward | backward
    median_us: float  # median of the timed calls left after Tukey's fences
    spread_us: float  # their interquartile range
    runs: int  # timed calls kept
    outliers_dropped: int
    flops: float | None = None  # the call's FLOPs in bsa's cost model (`Manifest.flops`), None when unknown
    chip: str | None = None  # the chip it ran on, as the device named it (run.json `timing.chip`)
    peak_tflops: float | None = None  # that chip's FP16/BF16 peak (`core.chips`), None when bsa has no figure

    @property
    def tflops(self) -> float | None:
        """Achieved TFLOP/s: the call's FLOPs over its median time (None without FLOPs or time)."""
        if self.flops is None or self.median_us <= 0:
            return None
        return self.flops / self.median_us / 1e6

    @property
    def peak_share(self) -> float | None:
        """The achieved TFLOP/s as a fraction of the chip's peak (None without either)."""
        tflops = self.tflops
        return None if tflops is None or not self.peak_tflops else tflops / self.peak_tflops


@dataclass(frozen=True)
class Recheck:
    """A narrowly failing case judged again over reseeded runs (`compare.recheck`): how many runs were judged,
    the median of their ratios (deciding severity, 1 at the limit), its bootstrap 95% interval, the verdict
    and why, and each run's ratio in seed order."""

    runs: int
    median: float
    lower: float
    upper: float
    passed: bool
    why: str
    ratios: tuple[float, ...]

    @property
    def text(self) -> str:
        """One line: the runs, the interval and the verdict."""
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"recheck over {self.runs} reseeded runs: median ratio {_fmt(self.median)}, 95% interval "
            f"[{_fmt(self.lower)}, {_fmt(self.upper)}]: {verdict}, {self.why}"
        )


@dataclass(frozen=True)
class CaseResult:
    """The verdict of one case: PASS, FAIL or ERROR (could not be judged), with everything measured."""

    name: str
    case_dir: str
    output_dir: str
    verdict: Verdict
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
    errors: tuple[str, ...]  # why an ERROR case could not be judged, or why a SKIP is not judged
    output_bytes: int
    seconds: float
    device_kind: str | None = None  # reference | torch_npu | binary (run.json); None when not recorded
    fault: str | None = None  # the fault planted in the reference device, if any (run.json)
    binary_sha256: str | None = None  # the device binary's sha256 (run.json)
    notes: tuple[str, ...] = ()  # what a reader must know beyond the checks (a planted fault that does not apply)
    selection: Selection | None = None  # the block mask, kept with a failing case for its pictures
    kernel_notes: tuple[str, ...] = ()  # what `bsa gen` noted of the kernel's precision path (fp16 overflow, underflow)
    inputs_sha256: str | None = None  # `manifest.inputs_digest`: which input bytes the case ran on
    release: str | None = None  # the operator release whose rules the case's expected status follows
    device_cann: str | None = None  # the CANN version the device side ran (run.json device_software), if known
    diagnosis: tuple[Cause, ...] = ()  # a FAIL's likely causes, best first (`compare.diagnose`); a PASS none
    hypotheses: tuple[Hypothesis, ...] = ()  # every hypothesis the diagnosis tried, for `--explain`
    op: Op = BACKWARD  # the operator call this result judges (bsa_cli/ops.py); `name` is its folder
    expected_failure: str | None = None  # a pair that must fail did, for its cause: "fails as it must: ..." (a PASS)
    kernel_time: tuple[StepTime, ...] = ()  # each call's time of a `bsa run --time` (run.json `timing`)
    untimed: str | None = None  # why a `bsa run --time` recorded no time (the reference device), else None
    recheck: Recheck | None = None  # a narrow failure judged again over reseeded runs (`bsa check --recheck`)

    @classmethod
    def unjudged(cls, name: str, errors: Sequence[str], verdict: Verdict = ERROR, **known: Any) -> CaseResult:
        """Return the result of a case that is not judged (an ERROR, or a SKIP: `errors` say why), with what is
        known of it (`case_dir`, `output_dir` and `seconds` at least); what is not known is None, or empty."""
        fields: dict[str, Any] = dict.fromkeys(
            ("spec", "device", "settings", "dtype", "layout", "expect_status", "status", "status_message")
        )
        fields.update(standard="-", checks=(), tensors=(), output_bytes=0)
        fields.update(known)
        return cls(name=name, verdict=verdict, errors=tuple(errors), **fields)

    @property
    def case_name(self) -> str:
        """The case this result is one op of (`NAME` of the folder `NAME@forward`)."""
        return split_folder_name(self.name)[0]

    @property
    def passed(self) -> bool:
        """Whether the verdict is PASS."""
        return self.verdict == PASS

    @property
    def not_run(self) -> bool:
        """Whether the case could not be judged only because no device has run it yet (its error says what
        to type)."""
        return self.verdict == ERROR and len(self.errors) == 1 and self.errors[0].startswith(NOT_RUN)

    @property
    def headline(self) -> str:
        """One line saying what happened: the notes, then the deciding check (or the first error)."""
        if self.verdict in (ERROR, SKIP):
            main = self.errors[0] if self.errors else ""
        elif self.verdict == PASS and self.expected_failure:
            main = self.expected_failure
        else:
            deciding = self.deciding
            main = deciding.detail if deciding else ""
            limited = deciding is not None and deciding.limit is not None and deciding.name != "status"
            if self.verdict == PASS and limited:
                main = f"{CLOSEST} {main}"  # a PASS names the check nearest its limit, never as a failure
        return "; ".join([*self.notes, main] if main else self.notes)

    @property
    def side_verdicts(self) -> dict[str, Verdict]:
        """The verdict each side-by-side standard that does not decide would give (a judged case only): its
        checks of the tensors with the case-level ones; a pair that must fail passes when it fails."""
        if self.verdict not in (PASS, FAIL):
            return {}
        labels = dict.fromkeys(label for t in self.tensors for label in t.sides)
        case_checks = [c for c in self.checks if c.name != EXPECTED_VERDICT]
        must_fail = self.expected_failure is not None or len(case_checks) < len(self.checks)
        verdicts: dict[str, Verdict] = {}
        for label in labels:
            passed = all(c.passed for c in case_checks) and all(t.passed_by(label) for t in self.tensors)
            verdicts[label] = PASS if passed != must_fail else FAIL
        return verdicts

    @property
    def verdicts_differ(self) -> bool:
        """Whether a side-by-side standard's verdict differs from the deciding one."""
        return any(v != self.verdict for v in self.side_verdicts.values())

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
        if self.verdict in (ERROR, SKIP):
            return "; ".join(self.errors)
        if self.verdict == PASS and self.expected_failure:
            return self.expected_failure
        if self.verdict == FAIL:
            failed = sorted((c for c in self.all_checks if not c.passed), key=lambda c: -c.severity)
            return "; ".join(c.detail for c in failed)
        deciding = self.deciding
        return deciding.detail if deciding else ""


#: The name of a pair's expected-verdict check (`compare.pair.expected_verdict`).
EXPECTED_VERDICT = "expected-verdict"
#: How a PASS headline introduces its deciding check: the one nearest its limit.
CLOSEST = "closest to its limit:"
#: How the error of a case that no device has run begins (`CaseResult.not_run`).
NOT_RUN = "not run yet: "


@dataclass(frozen=True)
class SuiteResult:
    """All case results of one comparison (or of merged shards)."""

    cases: tuple[CaseResult, ...]
    seconds: float = 0.0

    def count(self, verdict: Verdict) -> int:
        return sum(c.verdict == verdict for c in self.cases)

    @property
    def output_bytes(self) -> int:
        return sum(c.output_bytes for c in self.cases)

    @property
    def verdict(self) -> Verdict:
        """The suite's verdict, as reports head it: FAIL if a case failed, else ERROR if one could not be judged,
        else PASS; SKIP when every case was skipped (nothing was judged)."""
        if self.cases and self.count(SKIP) == len(self.cases):
            return SKIP
        return FAIL if self.count(FAIL) else ERROR if self.count(ERROR) else PASS

    @property
    def return_code(self) -> int:
        """Exit code of `bsa compare`, the one place the policy is written.

        3 if any case could not be judged (ERROR: missing, truncated or stale files, a harness crash or
        timeout recorded in run.json, no status.txt); else 1 if any case failed (a metric over its limit,
        a structural check, a negative case's status not matching `expect`, a valid case's nonzero
        status); else 0. Exit code 2 (usage, spec or user-file error) is raised by the CLI before any
        case is judged.
        """
        return int(exit_code(unjudged=self.count(ERROR) > 0, failed=self.count(FAIL) > 0))
