"""Judge one case to its verdict: from a device output directory (`compare_case`) or from a device's
outcome held in memory (`judge_outcome`); whatever the files hold, it ends as PASS, FAIL, ERROR or SKIP."""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..core import blas
from ..core.case import ACLNN_STATUS, Case, numpy_dtype
from ..core.errors import DataError, clip
from ..core.layout import mask_view
from ..ops import PAIR_OPS, Op, split_folder_name
from ..ops.interface import release_of_cann
from ..standards import STANDARDS, RunSettings, ThresholdNotApplicable, resolve_settings
from ..store import MANIFEST, OUTPUTS_DIR, check_output_dir, load_manifest, map_array
from ..store.manifest import GRAD_NAMES, Manifest
from .case_files import (
    _open_arrays,
    _read_run_record,
    _read_status,
    _run_device_info,
    not_run_message,
    recorded_fault_notes,
    run_forward_record,
)
from .diagnose import diagnose
from .diagnose.chain import PairInputs, as_forward_step, carried_from_forward, pick_tensors, score_padding
from .diagnose.forward_diagnosis import diagnose_forward
from .forward import FORWARD_NAMES, ForwardSettings, judge_forward
from .judge import judge_tensors
from .pair import cause_checks, expected_verdict, pair_causes
from .results import (
    ERROR,
    FAIL,
    PASS,
    SELECTION_MAX_CELLS,
    SKIP,
    CaseResult,
    Cause,
    Check,
    Hypothesis,
    Selection,
    TensorResult,
    Verdict,
)
from .summary import summary_key


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


OP_TENSORS: dict[Op, tuple[str, ...]] = {
    "backward": GRAD_NAMES,
    "forward": FORWARD_NAMES,
    "chain": (*FORWARD_NAMES, *GRAD_NAMES),
    "autograd": (*FORWARD_NAMES, *GRAD_NAMES),
}
"""The tensors a case folder of each op judges (its manifest's golden and outputs entries)."""


IN_MEMORY = "(in memory)"
"""The `output_dir` of a result judged from arrays in memory (`judge_outcome`)."""


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
            name=Path(case_dir).name,
            op=split_folder_name(Path(case_dir).name)[1],
            verdict=ERROR,
            errors=(text,),
            output_bytes=0,
            seconds=time.perf_counter() - started,
            case_dir=str(case_dir),
            output_dir=str(out),
            standard="-",
            checks=(),
            tensors=(),
            **fields,
        )


def _judge_case(
    case_dir: Path,
    output_dir: Path | None,
    manifest: Manifest | None,
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
    base: dict[str, Any] = {
        "case_dir": str(case_dir),
        "output_dir": str(output_dir or IN_MEMORY),
        "op": split_folder_name(case_dir.name)[1],
    }

    def error(name: str, errors: list[str], verdict: Verdict = ERROR, **known: Any) -> CaseResult:
        fields: dict[str, Any] = dict.fromkeys(
            ("spec", "device", "settings", "dtype", "layout", "expect_status", "status", "status_message")
        )
        fields.update(standard="-", checks=(), tensors=())
        fields.update(known)
        seconds = time.perf_counter() - started
        return CaseResult(
            name=name, verdict=verdict, errors=tuple(errors), output_bytes=0, seconds=seconds, **base, **fields
        )

    try:
        manifest = load_manifest(case_dir) if manifest is None else manifest
        case = manifest.case
    except DataError as exc:
        return error(case_dir.name, [str(exc)])
    except (KeyError, TypeError, ValueError) as exc:
        return error(case_dir.name, [f"{case_dir / MANIFEST}: malformed manifest ({type(exc).__name__}: {exc})"])
    name = manifest.name
    op: Op = manifest.op
    base["op"] = op
    try:
        settings = resolve_settings(case.dtype, manifest.compare_settings, run)
    except ThresholdNotApplicable as exc:
        raise RunThresholdError(f"case {name!r}: {exc}") from None
    except ValueError as exc:
        return error(name, [f"{case_dir / MANIFEST}: compare settings: {exc}"], dtype=case.dtype, layout=case.layout)
    known: dict[str, Any] = {
        "spec": manifest.spec,
        "inputs_sha256": manifest.inputs_digest,
        "release": manifest.release,
        "standard": settings.label,
        "settings": settings,
        "dtype": case.dtype,
        "layout": case.layout,
        "expect_status": case.expect.status,
    }
    if manifest.skip is not None:  # gen made no files: the op's operator refuses what another op accepts
        return error(name, [manifest.skip], SKIP, **known)
    prefilled = outcome.prefilled if outcome is not None else False
    if outcome is None:
        assert output_dir is not None
        try:
            check_output_dir(output_dir)
        except DataError as exc:
            return error(name, [str(exc)], **known)
        not_run = not_run_message(case_dir, output_dir)
        if not_run is not None:
            return error(name, [not_run], **known)
        known.update({"device": None, **_run_device_info(output_dir)})
        problems, run_checks, inputs_run, outputs_run = _read_run_record(output_dir, (name, case_dir.name))
        skipped, prefilled = run_forward_record(output_dir)
        if skipped is not None and not problems:
            return error(name, [skipped], SKIP, **known)
    else:
        known["device"] = outcome.device
        problems, run_checks, inputs_run, outputs_run = list(outcome.problems), [], None, None
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
        relation = "==" if passed else "!="
        text = f"status {_status_name(status)} {relation} expected {_status_name(case.expect.status)}"
        if status_message and not passed:
            text += f": {status_message}"
        checks.append(
            Check("status", None, float(status), float(case.expect.status), passed, text, 0.0 if passed else math.inf)
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
    names = OP_TENSORS[op]
    if outcome is not None:
        _check_grads(manifest, outcome.grads, names)
    shapes = _shape_problems(case, manifest, case_dir / MANIFEST)  # cheap: before anything is hashed
    if shapes:
        return error(name, shapes, **known)
    need_bench = STANDARDS[settings.standard].needs_benchmark
    key = summary_key(case, settings)
    opened = _open_arrays(
        case_dir,
        output_dir,
        manifest,
        need_bench,
        pool,
        verify_inputs,
        inputs_run,
        key,
        device=outcome.grads if outcome is not None else None,
        outputs_run=outputs_run,
        names=names,
    )
    if opened.problems:
        opened.stale()
        return error(name, opened.problems, **known)
    if need_bench and not opened.benchmark and opened.summary is None:
        opened.stale()
        text = f"{case_dir / MANIFEST}: no benchmark outputs, which standard {settings.label!r} needs"
        return error(name, [text], **known)
    assert opened.block_mask is not None
    forward = ForwardSettings(prefilled=prefilled, **manifest.forward_params)
    try:
        tensors, op_checks, op_notes = _judge_op(op, case, settings, opened, forward)
    except ValueError as exc:
        opened.stale()
        return error(name, [f"{case_dir}: {exc}"], **known)
    stale = opened.stale()  # the verdict only stands if every file hashed as the manifest says
    if stale:
        return error(name, stale, **known)
    if known.get("fault"):
        known["notes"] = recorded_fault_notes(output_dir) if output_dir is not None else ()
    known["notes"] = (*known.get("notes", ()), *op_notes)
    known["kernel_notes"] = manifest.notes
    causes = pair_causes(case, manifest.forward_params, tensors) if op in PAIR_OPS else []
    causes, padding = _scored_pair_causes(case_dir, manifest, case, tensors, opened, causes)
    known["notes"] = (*known["notes"], *padding)
    causes.sort(key=lambda c: c.kind != case.expect.cause)  # the cause a pitfall case expects leads its message
    checks += [*cause_checks(causes), *op_checks]
    if not all(t.passed for t in tensors):
        known["selection"] = selection(case, opened.block_mask)
    if not all(t.passed for t in tensors) or not all(c.passed for c in checks):
        known.update(_diagnosis(case_dir, manifest, case, tensors, checks, opened, causes, prefilled))
    if op in PAIR_OPS:
        failed = not all(c.passed for c in checks) or not all(t.passed for t in tensors)
        message = "; ".join(c.detail for c in _failed_checks(checks, tensors))
        forward_ok = all(t.passed for t in tensors if t.name in FORWARD_NAMES)
        extra, met = expected_verdict(case.expect, failed, causes, message, not forward_ok)
        if extra is not None:
            checks.append(extra)
        known["expected_failure"] = met
    output_bytes = sum(a.nbytes for a in opened.device.values())
    return _finish(name, base, known, checks, tensors, started, output_bytes)


def _judge_op(
    op: Op, case: Case, settings: Any, opened: Any, forward: ForwardSettings
) -> tuple[tuple[TensorResult, ...], list[Check], tuple[str, ...]]:
    """Judge the tensors of a case folder's op: (tensors, case-level checks, notes).

    The backward: dq, dk, dv (`judge_tensors`). The forward: out and lse on the rows it writes
    (`judge_forward`). The pair: both, the forward step's out and lse, then the backward's dq, dk, dv.
    """
    if op == "backward":
        tensors = judge_tensors(
            case, settings, opened.device, opened.golden, opened.benchmark, opened.block_mask, opened.summary
        )
        return tensors, [], ()
    judged, op_checks, notes = judge_forward(
        case, settings, opened.device, opened.golden, opened.benchmark, opened.block_mask, forward, opened.summary
    )
    if op in PAIR_OPS:
        judged += judge_tensors(
            case, settings, opened.device, opened.golden, opened.benchmark, opened.block_mask, opened.summary
        )
    return judged, list(op_checks), notes


def _failed_checks(checks: list[Check], tensors: tuple[TensorResult, ...]) -> list[Check]:
    """The failed checks, most severe first (as `CaseResult.message` lists them)."""
    every = [*checks, *(c for t in tensors for c in t.checks)]
    return sorted((c for c in every if not c.passed), key=lambda c: -c.severity)


def _diagnosis(
    case_dir: Path,
    manifest: Manifest,
    case: Case,
    tensors: tuple[TensorResult, ...],
    checks: list[Check],
    opened: Any,
    causes: list[Cause] | None = None,
    prefilled: bool = False,
) -> dict[str, Any]:
    """Return the `diagnosis` and `hypotheses` of a failing case (its inputs mapped, not hashed again: the
    judgement already checked them or the run record answered for them).

    A forward folder: its out and lse (`diagnose_forward`). A pair: its causes first, then the forward's
    diagnosis when its out or lse fail, then dq, dk, dv: not diagnosed when the backward's right answer to
    the device's out and lse explains them (`carried_from_forward`), else as a backward's on what it read
    (the golden out and lse when the forward passes). docs/compare.md, "The forward and the pair".
    """
    op = manifest.op
    first = tuple(causes or ())
    tried = tuple(Hypothesis(c.kind, "the pair's pitfall", c.score, "explains: " + c.evidence) for c in first)
    entries, inner_precise = dict(manifest.entries("inputs")), int(manifest.forward_params.get("inner_precise", 0))
    device, golden = opened.device, opened.golden
    benchmark = opened.benchmark or None
    forward_tensors = tuple(t for t in tensors if t.name in FORWARD_NAMES)
    grads = tuple(t for t in tensors if t.name in GRAD_NAMES)
    try:
        inputs: Mapping[str, np.ndarray] = _LazyInputs(case_dir, entries, opened.inputs)
        with blas.one_thread_each(), np.errstate(all="ignore"):  # 1 thread: 100x faster; untrusted values
            if op == "forward":
                result = diagnose_forward(
                    case, forward_tensors, checks, device, golden, benchmark, inputs, inner_precise, prefilled
                )
                return {"diagnosis": result.causes, "hypotheses": result.hypotheses}
            if op not in PAIR_OPS:
                result = diagnose(case, grads, checks, device, golden, benchmark, inputs)
                return {"diagnosis": (*first, *result.causes), "hypotheses": (*tried, *result.hypotheses)}
            forward_failed = any(not t.passed for t in forward_tensors)
            found: list[Cause] = []
            notes: list[Hypothesis] = []
            if forward_failed:
                fwd = diagnose_forward(
                    case,
                    forward_tensors,
                    [],
                    pick_tensors(device, FORWARD_NAMES),
                    pick_tensors(golden, FORWARD_NAMES),
                    pick_tensors(benchmark, FORWARD_NAMES) if benchmark else None,
                    inputs,
                    inner_precise,
                    prefilled,
                )
                found += [as_forward_step(c) for c in fwd.causes]
                notes += [replace(h, supposes="the forward: " + h.supposes) for h in fwd.hypotheses]
            if any(not t.passed for t in grads):
                read = PairInputs(inputs, device if forward_failed else golden)
                bench_grads = pick_tensors(benchmark, GRAD_NAMES) if benchmark else None
                dev_grads, gold_grads = pick_tensors(device, GRAD_NAMES), pick_tensors(golden, GRAD_NAMES)
                carried = None
                if forward_failed:
                    carried = carried_from_forward(case, grads, dev_grads, gold_grads, bench_grads, read)
                    notes.append(carried.hypothesis)
                if carried is not None and carried.explains:
                    found = carried.attribute(found)
                else:
                    result = diagnose(case, grads, checks, dev_grads, gold_grads, bench_grads, read)
                    found += result.causes
                    notes += result.hypotheses
    except (DataError, ValueError, IndexError, KeyError, FloatingPointError) as exc:  # the verdict stands
        failure = Hypothesis("-", "the diagnosis", 0.0, f"failed: {type(exc).__name__}: {exc}")
        return {"diagnosis": first, "hypotheses": (*tried, failure)}
    return {"diagnosis": (*first, *found), "hypotheses": (*tried, *notes)}


def _scored_pair_causes(
    case_dir: Path, manifest: Manifest, case: Case, tensors: tuple[TensorResult, ...], opened: Any, causes: list[Cause]
) -> tuple[list[Cause], list[str]]:
    """Score a pair's `padding-rows-read` by where the gradients' error is (`chain.score_padding`)."""
    if not any(c.kind == "padding-rows-read" for c in causes):
        return causes, []
    inputs = PairInputs(_LazyInputs(case_dir, dict(manifest.entries("inputs")), opened.inputs), opened.device)
    bench = pick_tensors(opened.benchmark, GRAD_NAMES) if opened.benchmark else None
    dev, gold = pick_tensors(opened.device, GRAD_NAMES), pick_tensors(opened.golden, GRAD_NAMES)
    try:
        with blas.one_thread_each():
            return score_padding(case, causes, tensors, dev, gold, bench, inputs)
    except (DataError, ValueError, IndexError, KeyError, FloatingPointError) as exc:  # the parameters still name it
        return causes, [f"padding-rows-read not scored: {type(exc).__name__}: {exc}"]


class _LazyInputs(Mapping[str, np.ndarray]):
    """A case's inputs, each mapped when the diagnosis first reads it (one that stops early reads none),
    unless the judgement mapped it already (`mapped`: its size checked, its hash under way or done)."""

    def __init__(self, case_dir: Path, entries: dict[str, Any], mapped: Mapping[str, np.ndarray]) -> None:
        self.case_dir, self.entries = case_dir, entries
        self.arrays: dict[str, np.ndarray] = {n: a for n, a in mapped.items() if n in entries}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            self.arrays[name] = map_array(self.case_dir, self.entries[name])
        return self.arrays[name]

    def __iter__(self) -> Any:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


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


def _check_grads(
    manifest: Manifest, grads: Mapping[str, np.ndarray] | None, names: tuple[str, ...] = GRAD_NAMES
) -> None:
    """Raise ValueError unless `grads` holds the tensors `names` (the op's: dq, dk, dv for the backward) of
    the dtypes and shapes the manifest's `outputs` give."""
    outputs = manifest.outputs
    for name in names:
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


def _shape_problems(case: Case, manifest: Manifest, where: Path) -> list[str]:
    """Return where a gradient entry's shape contradicts the case's geometry (`params`): dq has query's
    shape, dk and dv key's. Checked before any file is hashed or read, so a manifest promising an 8 GiB
    golden for a small case costs nothing."""
    wanted = {"dq": list(case.q_shape), "dk": list(case.kv_shape), "dv": list(case.kv_shape), "out": list(case.q_shape)}
    problems = []
    for section in ("outputs", "golden", "benchmark"):
        for grad, entry in manifest.entries(section):
            if grad in wanted and list(entry["shape"]) != wanted[grad]:
                problems.append(
                    f"{where}: {section}.{grad}.shape {list(entry['shape'])} differs from the case's "
                    f"{wanted[grad]} (its params)"
                )
    return problems


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
    passed = passed or bool(known.get("expected_failure"))  # a pair that fails as it must
    note = release_note(known.get("release"), known.get("device_cann"))
    if note:
        known = {**known, "notes": (note, *known.get("notes", ()))}
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


def release_note(release: str | None, device_cann: str | None) -> str | None:
    """Say when the device ran a CANN release whose operator rules are not the ones the case expects."""
    device_release = release_of_cann(device_cann)
    if release is None or device_release is None or device_release == release:
        return None
    return (
        f"the device ran CANN {device_cann} (ops-transformer {device_release}), but the case expects the "
        f"statuses of release {release}: regenerate with --release {device_release}"
    )
