"""Judge one case to its verdict: from a device output directory (`compare_case`) or from a device's
outcome held in memory (`judge_outcome`); whatever the files hold, it ends as PASS, FAIL, ERROR or SKIP."""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..core import blas
from ..core.case import ACLNN_STATUS, Case, Expect
from ..core.errors import DataError, clip
from ..ops import OPS, Op, split_folder_name
from ..ops.interface import release_of_cann
from ..standards import RunSettings, Settings, ThresholdNotApplicable, resolve_settings
from ..store import MANIFEST, OUTPUTS_DIR, check_output_dir, load_manifest
from ..store.manifest import GRAD_NAMES, Manifest
from .case_files import (
    _check_grads,
    _LazyInputs,
    _loaded_record,
    _open_arrays,
    _read_run_record,
    _read_status,
    _run_device_info,
    _shape_problems,
    not_run_message,
    recorded_fault_notes,
    run_forward_record,
    selection,
)
from .diagnose import Diagnosis, diagnose
from .diagnose.chain import PairInputs, as_forward_step, carried_from_forward, pick_tensors, score_padding
from .diagnose.forward_diagnosis import diagnose_forward
from .forward import FORWARD_NAMES, ForwardSettings, judge_forward
from .judge import judge_tensors
from .pair import SCALE_MISMATCH_EXPLAINS, cause_checks, expected_verdict, pair_causes
from .results import ERROR, FAIL, PASS, SKIP, CaseResult, Cause, Check, Hypothesis, TensorResult, Verdict


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

    `status` is the aclnn status (0 for success); `grads` are the outputs of a call that succeeded, as the
    case folder's op has them (`OP_TENSORS`: dq, dk, dv for the backward; out, lse for the forward; all five
    for the pair), of the manifest's dtypes and shapes. `problems` say why the outcome cannot be judged (as
    a crash in run.json does): with any, the case is an ERROR. `prefilled`: the forward's output buffers
    were pre-filled with NaN before the call (as run.json's `device.prefilled_outputs: "nan"`), so rows the
    forward must leave alone are checked.
    """

    status: int | None
    message: str | None = None
    grads: Mapping[str, np.ndarray] | None = None
    device: str | None = None
    problems: tuple[str, ...] = ()
    prefilled: bool = False


#: The tensors a case folder of each op judges (its manifest's golden and outputs entries): the op's outputs.
OP_TENSORS: dict[Op, tuple[str, ...]] = {op: op.outputs for op in OPS}


#: The `output_dir` of a result judged from arrays in memory (`judge_outcome`).
IN_MEMORY = "(in memory)"


def judge_outcome(
    case_dir: Path,
    outcome: DeviceOutcome,
    manifest: Manifest | None = None,
    run: RunSettings | None = None,
    pool: Executor | None = None,
) -> CaseResult:
    """Judge a device's outcome held in memory exactly as `compare_case` judges the same written to files.

    The case's golden, benchmark (or its summary) and block mask are read and hashed from `case_dir`;
    its other inputs are not hashed again (whoever read them for the device checked them, as `bsa run`
    does). Never raises for bad case files (ERROR).

    Args:
        case_dir: a directory written by `bsa gen`.
        outcome: the status the device returned, and the op's outputs (`OP_TENSORS`) when it succeeded.
        manifest: the case's manifest as already read (default: read from `case_dir`).
        run: settings given for the whole run, as `compare_case`.
        pool: an executor hashing files while the metrics are measured (default: serially).

    Raises:
        ValueError: a gradient of a call that returned 0 is missing or not of the case's shape and dtype
            (naming the tensor, what was expected and what was given), or a run threshold does not apply.
    """
    started = time.perf_counter()
    job = _Judging(Path(case_dir), None, started, run or RunSettings(), pool, False, outcome)
    return _judge_case(job, manifest)


@dataclass(frozen=True)
class _Judging:
    """One case being judged: its folder, its device output directory (None: an outcome in memory), when
    judging began, and how (the run's settings, the hashing pool, whether every input is hashed)."""

    case_dir: Path
    output_dir: Path | None
    started: float
    run: RunSettings
    pool: Executor | None
    verify_inputs: bool
    outcome: DeviceOutcome | None = None

    def finish(
        self, name: str, op: Op, known: Mapping[str, Any], checks: list[Check], tensors: tuple[TensorResult, ...] = ()
    ) -> CaseResult:
        """Return the case's judged result (PASS or FAIL), its time taken now (`output_bytes` 0 unless known)."""
        passed = all(c.passed for c in checks) and all(t.passed for t in tensors)
        passed = passed or bool(known.get("expected_failure"))  # a pair that fails as it must
        note = release_note(known.get("release"), known.get("device_cann"))
        if note:
            known = {**known, "notes": (note, *known.get("notes", ()))}
        verdict: Verdict = PASS if passed else FAIL
        fields = {"checks": tuple(checks), "tensors": tensors, "output_bytes": 0, **known}
        return CaseResult(name=name, op=op, verdict=verdict, errors=(), **self._where(), **fields)

    def unjudged(self, name: str, op: Op, errors: Sequence[str], verdict: Verdict = ERROR, **known: Any) -> CaseResult:
        """Return the result of a case that is not judged (an ERROR, or a SKIP), with what is known of it."""
        return CaseResult.unjudged(name, errors, verdict, op=op, **self._where(), **known)

    def _where(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self.started
        return {"case_dir": str(self.case_dir), "output_dir": str(self.output_dir or IN_MEMORY), "seconds": seconds}


def _compare_case(
    case_dir: Path, output_dir: Path | None, run: RunSettings | None, pool: Executor | None, verify_inputs: bool
) -> CaseResult:
    """Judge one case; whatever its files hold, it ends as a verdict (an ERROR naming what went wrong).

    Raises:
        RunThresholdError: as `compare_case`.
    """
    files = Path(output_dir) if output_dir is not None else case_dir / OUTPUTS_DIR
    job = _Judging(case_dir, files, time.perf_counter(), run or RunSettings(), pool, verify_inputs)
    try:
        return _judge_case(job, None)
    except RunThresholdError:
        raise
    except Exception as exc:  # a case bsa did not foresee: one line, not a traceback
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        text = f"{case_dir}: cannot be judged: {type(exc).__name__}: {clip(str(exc))}{at} (a bug in bsa?)"
        return job.unjudged(case_dir.name, split_folder_name(case_dir.name)[1], [text])


class _Unjudged(Exception):
    """A case that cannot be judged (an ERROR) or is not (a SKIP): why, and what more is known of it."""

    def __init__(self, errors: Sequence[str], verdict: Verdict = ERROR, **known: Any) -> None:
        super().__init__(*errors)
        self.errors, self.verdict, self.known = list(errors), verdict, known


@dataclass(frozen=True)
class _Record:
    """What the device's side says of one case: who ran it, the run record's checks and hashes, the status."""

    device: Mapping[str, Any]
    checks: tuple[Check, ...]
    inputs_run: Any
    outputs_run: Any
    prefilled: bool
    status: int
    status_message: str | None
    fault_notes: tuple[str, ...] = ()  # what the run record says of a planted fault that did not apply
    deterministic: bool = False  # run.json says the run asked for deterministic mode (dk/dv copies then bit-equal)


def _judge_case(job: _Judging, manifest: Manifest | None) -> CaseResult:
    """Judge one case: from the files in `job.output_dir`, or from `job.outcome` in memory. The two differ
    only in where the status, the run's problems and the gradients come from."""
    name, op = job.case_dir.name, split_folder_name(job.case_dir.name)[1]
    known: dict[str, Any] = {}
    try:
        manifest = _read_manifest(job.case_dir, manifest)
        name, op = manifest.name, manifest.op
        known = {"dtype": manifest.case.dtype, "layout": manifest.case.layout}
        settings = _case_settings(job.case_dir, manifest, job.run)
        known = {  # the result's fields the manifest and the settings give
            "spec": manifest.spec,
            "inputs_sha256": manifest.inputs_digest,
            "release": manifest.release,
            "standard": settings.label,
            "settings": settings,
            "dtype": manifest.case.dtype,
            "layout": manifest.case.layout,
            "expect_status": manifest.case.expect.status,
        }
        if manifest.skip is not None:  # gen made no files: the op's operator refuses what another op accepts
            raise _Unjudged([manifest.skip], SKIP)
        record = _outcome_record(job.outcome) if job.outcome is not None else _files_record(job, name)
        known.update(record.device, status=record.status, status_message=record.status_message)
        if known.get("kernel_time"):  # each timed call with its FLOPs, for its TFLOP/s
            known["kernel_time"] = tuple(replace(t, flops=manifest.flops(t.step)) for t in known["kernel_time"])
        checks = [*record.checks, _status_check(manifest.case.expect, record.status, record.status_message)]
        if not manifest.case.expect.ok or record.status != 0:
            if not manifest.case.expect.ok and known.get("fault"):
                known["notes"] = (f"fault '{known['fault']}' not planted: the call is refused before any computation",)
            return job.finish(name, op, known, checks)
        return _judge_outputs(job, manifest, settings, record, known, checks)
    except _Unjudged as stop:
        return job.unjudged(name, op, stop.errors, stop.verdict, **{**known, **stop.known})


def _read_manifest(case_dir: Path, manifest: Manifest | None) -> Manifest:
    """Return the case's manifest (read unless given), its case read from it."""
    try:
        manifest = load_manifest(case_dir) if manifest is None else manifest
        manifest.case  # noqa: B018  (reading the case is what checks it)
    except DataError as exc:
        raise _Unjudged([str(exc)]) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise _Unjudged([f"{case_dir / MANIFEST}: malformed manifest ({type(exc).__name__}: {exc})"]) from None
    return manifest


def _case_settings(case_dir: Path, manifest: Manifest, run: RunSettings) -> Settings:
    """Return the settings that judge the case.

    Raises:
        RunThresholdError: a run threshold does not apply to the case's standard.
    """
    try:
        return resolve_settings(manifest.case.dtype, manifest.compare_settings, run)
    except ThresholdNotApplicable as exc:
        raise RunThresholdError(f"case {manifest.name!r}: {exc}") from None
    except ValueError as exc:
        raise _Unjudged([f"{case_dir / MANIFEST}: compare settings: {exc}"]) from None


def _outcome_record(outcome: DeviceOutcome) -> _Record:
    """Return the record of a device's outcome held in memory."""
    device: dict[str, Any] = {"device": outcome.device}
    if outcome.problems:
        raise _Unjudged(outcome.problems, **device)
    if outcome.status is None:
        raise _Unjudged(["no aclnn status given for the outcome"], **device)
    return _Record(device, (), None, None, outcome.prefilled, outcome.status, outcome.message)


def _files_record(job: _Judging, name: str) -> _Record:
    """Return the record of a device's output directory: run.json and status.txt."""
    output_dir = job.output_dir
    assert output_dir is not None
    try:
        check_output_dir(output_dir)
    except DataError as exc:
        raise _Unjudged([str(exc)]) from None
    not_run = not_run_message(job.case_dir, output_dir)
    if not_run is not None:
        raise _Unjudged([not_run])
    record = _loaded_record(output_dir)
    device = {"device": None, **_run_device_info(record)}
    problems, run_checks, inputs_run, outputs_run = _read_run_record(output_dir, (name, job.case_dir.name))
    skipped, prefilled = run_forward_record(record)
    if skipped is not None and not problems:
        raise _Unjudged([skipped], SKIP, **device)
    if problems:
        raise _Unjudged(problems, **device)
    try:
        status, status_message = _read_status(output_dir)
    except DataError as exc:
        raise _Unjudged([str(exc)], **device) from None
    notes = recorded_fault_notes(record)
    deterministic = isinstance(record, dict) and record.get("deterministic") is True
    return _Record(
        device, tuple(run_checks), inputs_run, outputs_run, prefilled, status, status_message, notes, deterministic
    )


def _status_check(expect: Expect, status: int, message: str | None) -> Check:
    """Return the status check: the status a negative case expects, else 0 (ACLNN_SUCCESS)."""
    if not expect.ok:
        passed = status == expect.status
        text = f"status {_status_name(status)} {'==' if passed else '!='} expected {_status_name(expect.status)}"
        if message and not passed:
            text += f": {message}"
        return Check("status", None, float(status), float(expect.status), passed, text, 0.0 if passed else math.inf)
    if status != 0:
        text = f"status {_status_name(status)}, expected 0 (ACLNN_SUCCESS)" + (f": {message}" if message else "")
        return Check("status", None, float(status), 0.0, False, text, math.inf)
    return Check("status", None, 0.0, 0.0, True, "status 0 (ACLNN_SUCCESS)", 0.0)


def _judge_outputs(
    job: _Judging, manifest: Manifest, settings: Settings, record: _Record, known: dict[str, Any], checks: list[Check]
) -> CaseResult:
    """Judge the outputs of a call that returned 0: the op's tensors, its causes, a failure's diagnosis."""
    case, op = manifest.case, manifest.op
    if job.outcome is not None:
        _check_grads(manifest, job.outcome.grads)
    shapes = _shape_problems(case, manifest, job.case_dir / MANIFEST)  # cheap: before anything is hashed
    if shapes:
        raise _Unjudged(shapes)
    opened = _open(job, manifest, settings, record)
    forward = ForwardSettings(prefilled=record.prefilled, **manifest.forward_params)
    try:
        tensors, op_checks, op_notes = _judge_op(op, case, settings, opened, forward, record.deterministic)
    except ValueError as exc:
        opened.stale()
        raise _Unjudged([f"{job.case_dir}: {exc}"]) from None
    stale = opened.stale()  # the verdict only stands if every file hashed as the manifest says
    if stale:
        raise _Unjudged(stale)
    if known.get("fault"):
        known["notes"] = record.fault_notes
    known["notes"] = (*known.get("notes", ()), *op_notes)
    known["kernel_notes"] = manifest.notes
    inputs = _LazyInputs(job.case_dir, dict(manifest.entries("inputs")), opened.inputs)
    inner_precise = int(manifest.forward_params.get("inner_precise", 0))
    at = _Diagnosing(case, tensors, [], opened, inputs, inner_precise, record.prefilled)
    causes = pair_causes(case, manifest.forward_params, tensors, manifest.step_scales) if op.pair else []
    causes, padding = _scored_pair_causes(at, causes)
    causes, scales = _scored_scale_mismatch(at, causes, manifest.step_scales["backward"])
    known["notes"] = (*known["notes"], *padding, *scales)
    causes.sort(key=lambda c: c.kind != case.expect.cause)  # the cause a pitfall case expects leads its message
    checks = [*checks, *cause_checks(causes), *op_checks]
    failing = not all(t.passed for t in tensors)
    if failing:
        known["selection"] = selection(case, opened.block_mask)
    if failing or not all(c.passed for c in checks):
        known.update(_diagnosis(replace(at, checks=checks), op, causes))
    if op.pair:
        extra, known["expected_failure"] = _pair_verdict(case, checks, tensors, causes)
        checks += [extra] if extra is not None else []
    known["output_bytes"] = sum(a.nbytes for a in opened.device.values())
    return job.finish(manifest.name, op, known, checks, tensors)


def _open(job: _Judging, manifest: Manifest, settings: Settings, record: _Record) -> Any:
    """Return the case's arrays opened (mapped, their hashes checked in the job's pool), with the benchmark
    its standard needs."""
    device = job.outcome.grads if job.outcome is not None else None
    where = (job.case_dir, job.output_dir, manifest, settings, job.pool, job.verify_inputs)
    opened = _open_arrays(*where, record.inputs_run, device, record.outputs_run)
    if opened.problems:
        opened.stale()
        raise _Unjudged(opened.problems)
    if settings.standard.needs_benchmark and not opened.benchmark and opened.summary is None:
        opened.stale()
        raise _Unjudged([f"{job.case_dir / MANIFEST}: no benchmark outputs, which standard {settings.label!r} needs"])
    assert opened.block_mask is not None
    return opened


def _pair_verdict(
    case: Case, checks: list[Check], tensors: tuple[TensorResult, ...], causes: list[Cause]
) -> tuple[Check | None, str | None]:
    """Return a pair's expected-verdict check (if any) and what a pair that fails as it must says."""
    every = [*checks, *(c for t in tensors for c in t.checks)]
    failed = sorted((c for c in every if not c.passed), key=lambda c: -c.severity)  # as `CaseResult.message` has them
    forward_failed = not all(t.passed for t in tensors if t.name in FORWARD_NAMES)
    return expected_verdict(case.expect, bool(failed), causes, "; ".join(c.detail for c in failed), forward_failed)


def _judge_op(
    op: Op, case: Case, settings: Any, opened: Any, forward: ForwardSettings, deterministic: bool
) -> tuple[tuple[TensorResult, ...], list[Check], tuple[str, ...]]:
    """Judge the tensors of a case folder's op: (tensors, case-level checks, notes).

    An op that calls the forward: out and lse on the rows it writes (`judge_forward`); one that calls the
    backward: dq, dk, dv (`judge_tensors`); the pair both, the forward step's out and lse first. `deterministic`:
    the run asked for deterministic mode (the batch-consistency check then holds dk and dv to it too).
    """
    arrays = (opened.device, opened.golden, opened.benchmark, opened.block_mask)
    judged, op_checks, notes = (
        judge_forward(case, settings, *arrays, forward, opened.summary) if op.calls_forward else ((), (), ())
    )
    if op.calls_backward:
        judged += judge_tensors(case, settings, *arrays, opened.summary, deterministic)
    return judged, list(op_checks), notes


@dataclass(frozen=True)
class _Diagnosing:
    """What a failing case's diagnosis reads: its case, tensors judged, checks and arrays."""

    case: Case
    tensors: tuple[TensorResult, ...]
    checks: list[Check]
    opened: Any  # the device's, golden and benchmark arrays (`_open_arrays`)
    inputs: Mapping[str, np.ndarray]
    inner_precise: int
    prefilled: bool

    def of(self, names: tuple[str, ...]) -> tuple[TensorResult, ...]:
        return tuple(t for t in self.tensors if t.name in names)

    def arrays(self, names: tuple[str, ...] | None = None) -> tuple[Any, Any, Any]:
        """Return the device's, golden and benchmark arrays (None: no benchmark), those of `names` if given."""
        device, golden, benchmark = self.opened.device, self.opened.golden, self.opened.benchmark or None
        if names is None:
            return device, golden, benchmark
        return pick_tensors(device, names), pick_tensors(golden, names), benchmark and pick_tensors(benchmark, names)

    def forward(self, pick: bool = False, checks: bool = True) -> Any:
        """Return the forward's diagnosis of out and lse (`pick`: the pair's arrays narrowed to them)."""
        arrays = self.arrays(FORWARD_NAMES if pick else None)
        tensors, checked = self.of(FORWARD_NAMES), self.checks if checks else []
        return diagnose_forward(self.case, tensors, checked, *arrays, self.inputs, self.inner_precise, self.prefilled)


def _diagnosis(at: _Diagnosing, op: Op, causes: list[Cause]) -> dict[str, Any]:
    """Return the `diagnosis` and `hypotheses` of a failing case (its inputs mapped, not hashed
    again: the judgement already checked them or the run record answered for them).

    A forward folder: its out and lse (`diagnose_forward`). A pair: its causes first, then the forward's
    diagnosis when its out or lse fail, then dq, dk, dv: not diagnosed when the backward's right answer to
    the device's out and lse explains them (`carried_from_forward`), else as a backward's on what it read
    (the golden out and lse when the forward passes). docs/compare.md, "The forward and the pair".
    """
    first = tuple(causes)
    tried = tuple(Hypothesis(c.kind, "the pair's pitfall", c.score, "explains: " + c.evidence) for c in first)
    try:
        with blas.one_thread_each(), np.errstate(all="ignore"):  # 1 thread: 100x faster; untrusted values
            if not op.calls_backward:
                result = at.forward()
            elif not op.calls_forward:
                result = diagnose(at.case, at.of(GRAD_NAMES), at.checks, *at.arrays(), at.inputs)
            else:
                result = _pair_diagnosis(at)
    except (DataError, ValueError, IndexError, KeyError, FloatingPointError) as exc:  # the verdict stands
        failure = Hypothesis("-", "the diagnosis", 0.0, f"failed: {type(exc).__name__}: {exc}")
        return {"diagnosis": first, "hypotheses": (*tried, failure)}
    return {"diagnosis": (*first, *result.causes), "hypotheses": (*tried, *result.hypotheses)}


def _pair_diagnosis(at: _Diagnosing) -> Diagnosis:
    """Return a pair's causes and hypotheses: the forward step's, then its gradients' (docstring of
    `_diagnosis`)."""
    grads = at.of(GRAD_NAMES)
    forward_failed = any(not t.passed for t in at.of(FORWARD_NAMES))
    found: list[Cause] = []
    notes: list[Hypothesis] = []
    if forward_failed:
        fwd = at.forward(pick=True, checks=False)
        found += [as_forward_step(c) for c in fwd.causes]
        notes += [replace(h, supposes="the forward: " + h.supposes) for h in fwd.hypotheses]
    if all(t.passed for t in grads):
        return Diagnosis(tuple(found), tuple(notes))
    dev_grads, gold_grads, bench_grads = at.arrays(GRAD_NAMES)
    read = PairInputs(at.inputs, at.opened.device if forward_failed else at.opened.golden)
    if forward_failed:
        carried = carried_from_forward(at.case, grads, dev_grads, gold_grads, bench_grads, read)
        notes.append(carried.hypothesis)
        if carried.explains:
            return Diagnosis(tuple(carried.attribute(found)), tuple(notes))
    result = diagnose(at.case, grads, at.checks, dev_grads, gold_grads, bench_grads, read)
    return Diagnosis((*found, *result.causes), (*notes, *result.hypotheses))


def _scored_pair_causes(at: _Diagnosing, causes: list[Cause]) -> tuple[list[Cause], list[str]]:
    """Score a pair's `padding-rows-read` by where the gradients' error is (`chain.score_padding`)."""
    if not any(c.kind == "padding-rows-read" for c in causes):
        return causes, []
    dev, gold, bench = at.arrays(GRAD_NAMES)
    try:
        with blas.one_thread_each():
            return score_padding(at.case, causes, at.tensors, dev, gold, bench, PairInputs(at.inputs, at.opened.device))
    except (DataError, ValueError, IndexError, KeyError, FloatingPointError) as exc:  # the parameters still name it
        return causes, [f"padding-rows-read not scored: {type(exc).__name__}: {exc}"]


def _scored_scale_mismatch(at: _Diagnosing, causes: list[Cause], scale: float) -> tuple[list[Cause], list[str]]:
    """Score `scale-mismatch` by whether dq, dk, dv are the backward's right answer, at the `scale` it was
    called with, to the device's out and lse (`chain.carried_from_forward` on the case at that scale, each
    failing gradient apart; the score is the least share): the steps' scales explain the gradients only where
    the backward did what it was told."""
    if not any(c.kind == "scale-mismatch" for c in causes):
        return causes, []
    dev, gold, bench = at.arrays(GRAD_NAMES)
    at_scale, read = replace(at.case, scale=scale), PairInputs(at.inputs, at.opened.device)
    try:
        with blas.one_thread_each(), np.errstate(all="ignore"):  # untrusted values
            each = [
                carried_from_forward(at_scale, [t], dev, gold, bench, read) for t in at.of(GRAD_NAMES) if not t.passed
            ]
    except (DataError, ValueError, IndexError, KeyError, FloatingPointError) as exc:  # the parameters still name it
        return causes, [f"scale-mismatch not scored: {type(exc).__name__}: {exc}"]
    share = min((c.share for c in each), default=0.0)
    words = f"the backward at {scale:.4g} recomputed from the device's out and lse: " + "; ".join(c.text for c in each)
    kept, notes = [], []
    for cause in causes:
        if cause.kind != "scale-mismatch":
            kept.append(cause)
        elif share >= SCALE_MISMATCH_EXPLAINS:
            kept.append(replace(cause, score=round(share, 4), evidence=f"{cause.evidence} ({words})"))
        else:
            notes.append(f"scale-mismatch not named: it explains {share:.0%} of a gradient's error ({words})")
    return kept, notes


def release_note(release: str | None, device_cann: str | None) -> str | None:
    """Say when the device ran a CANN release whose operator rules are not the ones the case expects."""
    device_release = release_of_cann(device_cann)
    if release is None or device_release is None or device_release == release:
        return None
    return (
        f"the device ran CANN {device_cann} (ops-transformer {device_release}), but the case expects the "
        f"statuses of release {release}: regenerate with --release {device_release}"
    )
