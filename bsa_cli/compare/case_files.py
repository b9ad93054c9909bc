"""Reading a case directory and a device output directory: status, run record, hashes, mapped arrays, and
outputs given in memory checked against the manifest.

Everything read is untrusted: files are read bounded, inside their folder, and every problem becomes a
message (the case then ends as an ERROR), never an exception.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core import rounding
from ..core.case import Case, numpy_dtype
from ..core.chips import peak_tflops
from ..core.errors import DataError, clip, show
from ..core.layout import mask_view
from ..core.untrusted import entry_path, inside, load_json, parse_status, read_regular
from ..standards import Settings
from ..store import MANIFEST, map_array, map_read_only, sha256_file
from ..store.manifest import Manifest
from .results import NOT_RUN, SELECTION_MAX_CELLS, Check, Selection, StepTime
from .summary import SUMMARIZED, BenchmarkSummary, summary_from_document, summary_key

STATUS_FILE = "status.txt"
RUN_RECORD = "run.json"


def not_run_message(case_dir: Path, output_dir: Path) -> str | None:
    """Return why a case cannot be judged when no device has run it (its output folder is missing or holds
    no visible file), with the command that runs it; None when something ran there."""
    try:
        ran = output_dir.is_dir() and any(not p.name.startswith(".") for p in output_dir.iterdir())
    except OSError:
        return None
    if ran or output_dir.is_symlink() or (output_dir.exists() and not output_dir.is_dir()):
        return None
    suite = Path(case_dir).parent
    root = "" if output_dir == Path(case_dir) / "outputs" else f" --outputs-root {output_dir.parent}"
    return f"{NOT_RUN}no result in {output_dir}; run it first: bsa run {suite}{root}"


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
        status = parse_status(first)
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
        return load_json(read_regular(path, RUN_RECORD_MAX_BYTES))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataError(str(path), f"not valid JSON ({show(str(exc), 100)})") from None


#: Largest run.json read (one of `bsa run` is a few KiB).
RUN_RECORD_MAX_BYTES = 16 << 20

#: Bytes of status.txt read (its status line and message).
STATUS_MAX_BYTES = 64 << 10


def _run_device_info(record: Any) -> dict[str, Any]:
    """Return what a run record (`_loaded_record`) says of the device: the `CaseResult` fields device,
    device_kind, fault, binary_sha256 and device_cann (those it gives)."""
    device = record.get("device") if isinstance(record, dict) else None
    if not isinstance(device, dict) or "name" not in device:
        return {}
    info: dict[str, Any] = {"device": clip(device["name"])}
    if isinstance(device.get("kind"), str):
        info["device_kind"] = clip(device["kind"])
    if isinstance(device.get("fault"), str):
        info["fault"] = clip(device["fault"])
    binary, software = record.get("binary"), record.get("device_software")
    if isinstance(binary, dict) and isinstance(binary.get("sha256"), str):
        info["binary_sha256"] = clip(binary["sha256"])
    if isinstance(software, dict) and isinstance(software.get("cann"), str):
        info["device_cann"] = clip(software["cann"], 64)
    info.update(_run_timing(record.get("timing")))
    return info


#: The keys of a step in run.json's `timing.steps` that a `StepTime` takes, in its order.
_STEP_KEYS = ("median_us", "spread_us", "kept", "outliers_dropped")


def _run_timing(timing: Any) -> dict[str, Any]:
    """Return the `CaseResult` fields kernel_time and untimed that run.json's `timing` gives (those it gives)."""
    if not isinstance(timing, dict):
        return {}
    steps = timing.get("steps")
    raw = timing.get("chip")  # a SoC name, as `devices.timing.read_chip` takes it
    chip = raw if isinstance(raw, str) and raw.isidentifier() and len(raw) <= 32 else None
    found = []
    for step in ("forward", "backward"):
        entry = steps.get(step) if isinstance(steps, dict) else None
        values: list[Any] = [entry.get(k) for k in _STEP_KEYS] if isinstance(entry, dict) else []
        if len(values) == len(_STEP_KEYS) and all(_is_number(v) and v >= 0 for v in values):
            median, spread, kept, dropped = float(values[0]), float(values[1]), int(values[2]), int(values[3])
            found.append(StepTime(step, median, spread, kept, dropped, chip=chip, peak_tflops=peak_tflops(chip)))
    why = timing.get("not_timed")
    return {"kernel_time": tuple(found), **({"untimed": clip(why, 300)} if isinstance(why, str) and why else {})}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _loaded_record(output_dir: Path) -> Any:
    """Return the parsed `run.json` of an output directory, None when it cannot be read (`_load_record`)."""
    try:
        return _load_record(output_dir)
    except DataError:
        return None


def run_forward_record(record: Any) -> tuple[str | None, bool]:
    """Return what a run record (`_loaded_record`) says for an op folder: why the device did not run it
    (outcome "skipped": its `skipped` reason, else None), and whether it pre-filled the forward's outputs
    with NaN (`device.prefilled_outputs: "nan"`)."""
    if not isinstance(record, dict):
        return None, False
    device = record.get("device")
    prefilled = isinstance(device, dict) and device.get("prefilled_outputs") == "nan"
    if record.get("outcome") != "skipped":
        return None, prefilled
    reason = record.get("skipped")
    text = clip(reason, 500) if isinstance(reason, str) and reason else "the device did not run it (no reason given)"
    return text, prefilled


def recorded_fault_notes(record: Any) -> tuple[str, ...]:
    """Return the sentence the run record gives when its planted fault did not apply to the case (the
    device ran it clean), else nothing.

    The reference device records it as `device.fault_not_applied` (null when the fault applied); records
    written before that key existed say nothing. Judging never asks a device instead."""
    device = record.get("device") if isinstance(record, dict) else None
    note = device.get("fault_not_applied") if isinstance(device, dict) else None
    return (clip(note, 1000),) if isinstance(note, str) and note else ()


def _read_run_record(
    output_dir: Path, names: Sequence[str]
) -> tuple[list[str], list[Check], dict[str, str] | None, dict[str, str] | None]:
    """Read the runner's `run.json` if present.

    Returns:
        reasons the case cannot be judged, case-level checks, the sha256 of each input the runner
        checked the files against before the device ran, and the sha256 of each output the runner
        recorded once the device was done (each None when not recorded).
    """
    problems, checks, record = _run_record_checks(output_dir, names)
    inputs = record.get("inputs") if record else None
    if not isinstance(inputs, dict) or not all(isinstance(v, str) for v in inputs.values()):
        inputs = None
    outputs = record.get("outputs") if record else None
    if not isinstance(outputs, dict):
        return problems, checks, inputs, None
    sha256 = {name: entry.get("sha256") for name, entry in outputs.items() if isinstance(entry, dict)}
    return problems, checks, inputs, {name: sha for name, sha in sha256.items() if isinstance(sha, str)}


def _run_record_checks(output_dir: Path, names: Sequence[str]) -> tuple[list[str], list[Check], dict | None]:
    path = output_dir / RUN_RECORD
    if not path.exists() and not path.is_symlink():
        return [], [], None
    try:
        record = _load_record(output_dir)
    except DataError as exc:
        return [str(exc)], [], None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("problems") or [], list)
        or not isinstance(record.get("repeat") or {}, dict)
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
        differences = repeat.get("differences")
        differences = differences if isinstance(differences, list) else []
        detail = "; ".join(
            ", ".join(f"{clip(k, 40)} {clip(v, 40)}" for k, v in list(d.items())[:6])
            for d in differences[:3]
            if isinstance(d, dict)
        )
        text = f"repeated runs differ ({clip(repeat.get('count', '?'), 20)} runs){': ' + detail if detail else ''}"
        return [], [Check("deterministic", None, float(len(differences) or 1), 0.0, False, text, math.inf)], record
    guards = guard_checks(record)
    noise = (record.get("repeat") or {}).get("noise")
    if outcome == "ok" and isinstance(noise, dict) and noise:
        parts = [
            f"{clip(name, 20)} {clip(v.get('elements'), 20)} of {clip(v.get('total'), 20)} elements by <= "
            f"{clip(v.get('max_ulp'), 20)} ULP"
            for name, v in list(noise.items())[:6]
            if isinstance(v, dict)
        ]
        count = clip(record["repeat"].get("count"), 20)
        text = f"dq bitwise identical over {count} runs; atomic-add noise: " + "; ".join(parts)
        return [], [Check("repeat-noise", None, float(len(parts)), None, True, text), *guards], record
    return [], guards, record


def guard_checks(record: dict[str, Any]) -> list[Check]:
    """Return a failed `guard-zones` check for each zone around an output that the device wrote into (run.json
    `guards.writes`: the C++ harness's `bsa-guard-write` lines, the reference device's own zones); none when
    the zones were untouched or not kept."""
    guards = record.get("guards")
    if not isinstance(guards, dict):
        return []
    writes = guards.get("writes")
    checks = []
    for write in writes[:20] if isinstance(writes, list) else []:
        if not isinstance(write, dict) or not isinstance(write.get("tensor"), str):
            continue
        offset, elements = write.get("offset"), write.get("elements")
        if not (isinstance(offset, int) and isinstance(elements, int)) or isinstance(offset, bool):
            continue
        tensor = clip(write["tensor"], 16)
        where = "before its first element" if offset < 0 else "past its end"
        text = (
            f"{tensor} written outside the tensor, {where}: {elements} element(s) from element offset {offset} "
            f"(guard zones of {clip(guards.get('bytes'), 20)} bytes around each output)"
        )
        checks.append(Check("guard-zones", tensor, float(elements), 0.0, False, text, math.inf))
    return checks


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


def _changed_since_run(path: Path, sha256: str, record: Path) -> str | None:
    """Return the message for a device output whose content differs from what `bsa run` recorded, else None."""
    if _sha256(path) == sha256:
        return None
    why = f"sha256 differs from the one `bsa run` recorded in {record}: the output changed after the run"
    return str(DataError(str(path), f"{why} (a process the binary left behind?); run the case again"))


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
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # mapped, for the diagnosis (not read)
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
    manifest: Manifest,
    settings: Settings,
    pool: Executor | None,
    verify_inputs: bool,
    inputs_run: Mapping[str, str] | None,
    device: Mapping[str, np.ndarray] | None,
    outputs_run: Mapping[str, str] | None,
) -> _Opened:
    """Map device outputs, golden, benchmark and the block mask; check sizes now and sha256 in `pool`.

    Device outputs given as arrays (`device`) stand for the files of `output_dir`. The tensors are those of
    the case folder's op (dq, dk, dv for the backward; out, lse for the forward; all five for the pair).

    When the manifest's benchmark summary was made under these settings (`summary_key`), it is
    opened too (its tiles hashed like the golden) and stands for measuring the benchmark, whose files are
    still size-checked and hashed.

    Every input is size-checked and hashed: a stale input means the golden no longer matches what the
    device was given. Where `bsa run` recorded the sha256 it checked an input against just before the
    device ran (`inputs_run`, from run.json), that record answers instead: equal to the manifest's, the
    device ran on the inputs this golden comes from (whatever happened to the file since); different,
    the case was generated again after the run (stale). Without `verify_inputs` only the block mask, which
    the judge reads, is hashed. Golden and benchmark files are hashed; device outputs are hashed against
    the sha256 `bsa run` recorded (`outputs_run`, from run.json): an output that changed after the run is
    not judged. Hashing runs alongside the metrics; `_Opened.stale` collects it.
    """
    executor = pool or _Inline()
    opened = _Opened()
    names = manifest.op.outputs
    document = manifest.benchmark_summary
    if isinstance(document, dict) and document.get("key") == summary_key(manifest.case, settings):
        opened.summary = _open_summary(opened, case_dir, document, executor, names)
    sections: list[tuple[str, Path, dict[str, np.ndarray]]] = [("golden", case_dir, opened.golden)]
    if device is not None:
        opened.device.update((name, device[name]) for name in names)
    else:
        assert output_dir is not None
        sections.insert(0, ("outputs", output_dir, opened.device))
    bench_entries = dict(manifest.entries("benchmark"))
    if bench_entries or settings.standard.needs_benchmark:
        opened.benchmark = {}
        sections.append(("benchmark", case_dir, opened.benchmark))
    for section, base, arrays in sections:
        entries = dict(manifest.entries(section))
        # With a summary the benchmark is hashed and read at its worst elements only, not measured.
        populate = section != "benchmark" or opened.summary is None
        for name in names:
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
            elif outputs_run is not None and name in outputs_run:
                path, record = entry_path(base, entries[name]), base / RUN_RECORD
                opened.pending.append(executor.submit(_changed_since_run, path, outputs_run[name], record))
    inputs = dict(manifest.entries("inputs"))
    if "block_sparse_mask" not in inputs:
        opened.problems.append(f"{case_dir / MANIFEST}: no inputs entry for block_sparse_mask")
    for name, entry in inputs.items():
        try:
            opened.inputs[name] = map_array(case_dir, entry)
        except DataError as exc:
            opened.problems.append(str(exc))
            continue
        if name != "block_sparse_mask" and not verify_inputs:
            continue
        if inputs_run is not None and entry.get("sha256") and inputs_run.get(name) != entry["sha256"]:
            where = str(output_dir / RUN_RECORD) if output_dir is not None else RUN_RECORD
            why = f"the device ran on other contents (sha256 in {where}): the case was generated again since"
            opened.problems.append(str(DataError(str(case_dir / entry["file"]), f"{why}; run it again")))
        elif inputs_run is None or name == "block_sparse_mask":  # the judge reads the mask: always hashed
            opened.pending.append(executor.submit(_stale, case_dir / entry["file"], entry.get("sha256"), "input"))
    opened.block_mask = opened.inputs.get("block_sparse_mask")
    return opened


def _open_summary(
    opened: _Opened, case_dir: Path, document: Mapping[str, Any], executor: Executor, names: Sequence[str]
) -> BenchmarkSummary | None:
    """Map a benchmark summary's tiles (their hashes checked in `executor`, pending in `opened`) and rebuild
    it. No summary, with a problem in `opened`, if it is malformed, lacks a tensor of `names` the standard
    judges (lse never is summarized), or a tiles file is missing or of the wrong size."""
    tiles = {}
    try:
        for name, entry in dict(document["tiles"]).items():
            tiles[name] = map_array(case_dir, entry, populate=True)
            path, sha = case_dir / entry["file"], entry.get("sha256")
            opened.pending.append(executor.submit(_stale, path, sha, "benchmark summary"))
        summary = summary_from_document(document, tiles)
        lacking = [name for name in names if name in SUMMARIZED and name not in summary.stats]
        if lacking:
            raise ValueError(f"no stats of {', '.join(lacking)}")
        return summary
    except DataError as exc:
        opened.problems.append(str(exc))
    except (KeyError, TypeError, ValueError) as exc:
        opened.problems.append(f"{case_dir / MANIFEST}: benchmark_summary: {exc}")
    return None


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


def _check_grads(manifest: Manifest, grads: Mapping[str, np.ndarray] | None) -> None:
    """Raise ValueError unless `grads` holds the tensors of the manifest's op (dq, dk, dv for the backward) of
    the dtypes and shapes the manifest's `outputs` give."""
    outputs = manifest.outputs
    for name in manifest.op.outputs:
        entry = outputs.get(name)
        if entry is None:
            continue  # the manifest's own problem: _open_arrays reports it
        expected = f"{entry['dtype']} {list(entry['shape'])}"
        array = (grads or {}).get(name)
        if array is None:
            raise ValueError(f"{name}: missing; expected {expected}")
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{name}: a {type(array).__name__}, not a NumPy array; expected {expected}")
        dtype = "bfloat16" if rounding.is_bfloat16(array.dtype) else array.dtype.name  # the manifest's name
        if array.dtype != numpy_dtype(entry["dtype"]) or list(array.shape) != list(entry["shape"]):
            raise ValueError(f"{name}: expected {expected}, got {dtype} {list(array.shape)}")


def _shape_problems(case: Case, manifest: Manifest, where: Path) -> list[str]:
    """Return where a gradient entry's shape contradicts the case's geometry (`params`): dq has query's
    shape, dk and dv key's. Checked before any file is hashed or read, so a manifest promising an 8 GiB
    golden for a small case costs nothing."""
    wanted = {"dq": list(case.q_shape), "dk": list(case.kv_shape), "dv": list(case.kv_shape), "out": list(case.q_shape)}
    return [
        f"{where}: {section}.{grad}.shape {list(entry['shape'])} differs from the case's {wanted[grad]} (its params)"
        for section in ("outputs", "golden", "benchmark")
        for grad, entry in manifest.entries(section)
        if grad in wanted and list(entry["shape"]) != wanted[grad]
    ]
