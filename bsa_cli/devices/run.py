"""Run cases on a device and record them: `run_cases` schedules the cases over the device ids, one worker
thread per id; `run_case` runs one case with its repeats.

Each run of a device writes into a fresh staging directory `<output_dir>/.run-K`; when the case is done,
the first run's files move up into `<output_dir>` and `run.json` (`record.case_record`) is written last,
atomically. Stale results of an earlier run are deleted before a case starts, so nothing left over from
another binary can be judged, and an interrupted case never leaves outputs without a record. A case
folder gen skipped (`Manifest.skip`), or one whose op the device cannot run (`Device.unsupported`), is
not run: its run.json says "skipped" and why.

This module never prints: callers watch progress through `RunEvent`s.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import store
from ..core.errors import DataError, clip
from ..core.exit_codes import exit_code
from ..core.untrusted import inside_parent
from ..store import FLAT_PARAMS, check_output_dir, load_manifest, refresh_flat_params, verify_inputs, write_json_atomic
from ..store.manifest import Manifest, flat_params
from .base import STATUS_FILE, Attempt, Cancel, Device, Execution, Outcome, RunConfigError
from .config import RunOptions
from .record import RUN_RECORD, case_record, check_outputs, now, read_status
from .repeat import differences as differences_of
from .repeat import judge_repeat


def output_dir_for(case_dir: Path, outputs_root: Path | None) -> Path:
    """Return where a case's device outputs go: `<case_dir>/outputs`, or `<outputs_root>/<case name>`."""
    return Path(case_dir) / store.OUTPUTS_DIR if outputs_root is None else Path(outputs_root) / Path(case_dir).name


@dataclass(frozen=True)
class RunResult:
    """The outcome of running one case (its `run.json` holds the full record)."""

    name: str
    case_dir: Path
    output_dir: Path
    outcome: Outcome
    problems: tuple[str, ...] = ()
    status: int | None = None
    expect_status: int | None = None
    device_id: int = 0
    duration_s: float = 0.0
    record: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    skipped: str | None = None  # why the case was not run (outcome "skipped")

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass(frozen=True)
class RunEvent:
    """Progress of a run: `kind` is "start" (a case began on a device) or "done" (with its result)."""

    kind: Literal["start", "done"]
    case: str
    device_id: int
    result: RunResult | None = None


@dataclass
class RunSummary:
    """All case results of a run, in case order, and whether Ctrl-C stopped it."""

    results: list[RunResult]
    device: Device
    interrupted: bool = False
    not_run: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)

    @property
    def return_code(self) -> int:
        """Exit code of `bsa run`.

        3 if any case could not be judged (error, crashed, timeout, interrupted, or cases never run);
        else 1 if any case was nondeterministic under --repeat (a failure of the kernel);
        else 0. A skipped case (an op gen skipped, or one the device cannot run) is not a failure. A run
        does not judge the outputs or the status: `bsa compare` does.
        """
        unjudged = {"error", "crashed", "timeout", "interrupted"}
        return exit_code(
            unjudged=self.interrupted or bool(self.not_run) or any(r.outcome in unjudged for r in self.results),
            failed=any(r.outcome == "nondeterministic" for r in self.results),
        )


#: Output files of every op (the backward's, the forward's) deleted before a case runs, whatever its manifest says.
STALE_OUTPUT_FILES = ("dq.bin", "dk.bin", "dv.bin", "out.bin", "lse.bin")


def _run_file(name: str) -> bool:
    """Whether a file name is one `bsa run` keeps for itself: a staging folder `.run-K` or a log."""
    return name.startswith(".run-") or (name.startswith(("stdout", "stderr")) and name.endswith(".log"))


def _clear_stale(output_dir: Path, manifest: Manifest | None) -> list[str]:
    """Delete results of an earlier run from `output_dir`: outputs, status, record, logs, staging dirs.

    Only files and symbolic links are removed (a link itself, never what it points to), and the staging
    folders `.run-K` that `bsa run` makes; a folder where a result file belongs is left alone and
    reported, never removed.

    Returns:
        problems that keep the case from running (a folder where a result file belongs).
    """
    if not output_dir.is_dir():
        return []
    problems: list[str] = []
    paths = [output_dir / name for name in (STATUS_FILE, RUN_RECORD, *STALE_OUTPUT_FILES)]
    for _, entry in manifest.entries("outputs") if manifest is not None else ():
        try:
            paths.append(inside_parent(output_dir, entry["file"]))
        except DataError as exc:
            problems.append(str(exc))
    paths += [path for path in output_dir.iterdir() if _run_file(path.name)]
    for path in dict.fromkeys(paths):
        try:
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.name.startswith(".run-") and path.parent == output_dir and path.is_dir():
                shutil.rmtree(path)  # a staging folder of an earlier run (rmtree never follows its links)
            elif path.exists():
                problems.append(
                    f"{path} is a folder where bsa writes a result file; bsa removes only what it wrote: "
                    "remove it yourself"
                )
        except OSError as exc:
            problems.append(f"cannot remove {path}: {exc.strerror or exc}")
    return problems


class _CaseRun:
    """Runs one case (all its repeats) on one device id and writes its record."""

    def __init__(self, case_dir: Path, options: RunOptions, device_id: int, cancel: Cancel) -> None:
        self.case_dir = Path(case_dir).resolve()
        self.options = options
        self.device = options.device
        self.device_id = device_id
        self.cancel = cancel
        root = None if options.outputs_root is None else Path(options.outputs_root).resolve()
        self.output_dir = output_dir_for(self.case_dir, root)  # its last part is never resolved: never a link
        self.name = self.case_dir.name
        self._execution = Execution(self.case_dir, self.output_dir, options.env(device_id), options.timeout, cancel)
        self.attempts: list[Attempt] = []  # the runs made so far, run 1 first
        self.differences: list[dict[str, Any]] = []  # how the repeats differ from run 1, and their verdicts

    def run(self) -> RunResult:
        started, clock = now(), time.monotonic()
        manifest, problems = self._load()
        unwritable = self._make_output_dir()
        if unwritable is not None:  # nowhere to write: the result goes without a record
            return self._result(manifest, "error", [*problems, unwritable], None, time.monotonic() - clock)
        problems += _clear_stale(self.output_dir, manifest)
        outcome: Outcome = "error" if problems else "ok"
        skipped = None
        if manifest is not None and outcome == "ok":  # gen skipped its op, or the device cannot run the op
            skipped = manifest.skip if manifest.skip is not None else self.device.unsupported(manifest)
        outcome = "skipped" if skipped is not None else outcome
        inputs_run = None
        if manifest is not None and outcome == "ok":
            inputs_run, refused = self._prepare(manifest)
            problems += refused
            outcome = "error" if refused else outcome
        if manifest is not None and outcome == "ok":
            outcome, ran = self._run_staged(manifest)
            problems += ran
            skipped = self.attempts[-1].skipped if outcome == "skipped" else None
        moved = self._moved()
        if moved is not None:  # the binary replaced the output folder (or the case folder) with a link
            return self._result(manifest, "error", [*problems, moved], None, time.monotonic() - clock)
        unmoved = self._keep_first_run(outcome)
        if unmoved is not None:
            problems.append(unmoved)
            outcome = "error"
        duration = time.monotonic() - clock
        record = case_record(self, manifest, outcome, problems, started, duration, skipped)
        record["inputs"] = inputs_run
        return self._recorded(manifest, record, duration, skipped)

    def _load(self) -> tuple[Manifest | None, list[str]]:
        """Return the case's manifest (None: unreadable) and the problem that makes it so."""
        try:
            manifest = load_manifest(self.case_dir)
        except DataError as exc:
            return None, [str(exc)]
        self.name = manifest.name
        return manifest, []

    def _make_output_dir(self) -> str | None:
        """Make the output folder; return why it cannot be (then nothing is written, not even a record)."""
        try:
            check_output_dir(self.output_dir)
            self.output_dir.mkdir(parents=True, exist_ok=True)
        except DataError as exc:
            return str(exc)
        except OSError as exc:
            return f"{self.output_dir}: {exc.strerror or exc}"
        return None

    def _prepare(self, manifest: Manifest) -> tuple[dict[str, str] | None, list[str]]:
        """Verify the inputs and write case.txt; return the inputs run (name: sha256) and the problems that
        keep the case from running."""
        try:
            verify_inputs(self.case_dir, manifest)
        except DataError as exc:
            return None, [f"inputs not run: {exc}"]
        entries = manifest.entries("inputs")
        inputs_run = {name: str(entry["sha256"]) for name, entry in entries if entry.get("sha256")}
        try:  # case.txt is derived: what a harness reads always matches the checked case.json
            refresh_flat_params(self.case_dir, flat_params(manifest))
        except (OSError, KeyError, TypeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return inputs_run, [f"cannot write {self.case_dir / FLAT_PARAMS} from case.json: {why}"]
        return inputs_run, []

    def _run_staged(self, manifest: Manifest) -> tuple[Outcome, list[str]]:
        """Run every repeat in its staging folder (`_run_all`); the repeats' folders go afterwards."""
        try:
            return self._run_all(manifest)
        except OSError as exc:  # a staging folder that cannot be made (a full disk, no permission)
            return "error", [f"cannot run the case in {self.output_dir}: {exc.strerror or exc}"]
        finally:
            for attempt in self.attempts[1:]:
                shutil.rmtree(attempt.staging, ignore_errors=True)

    def _keep_first_run(self, outcome: Outcome) -> str | None:
        """Move the first run's files up (an interrupted run's are removed); return why they could not be."""
        if not self.attempts:
            return None
        if outcome == "interrupted":
            shutil.rmtree(self.attempts[0].staging, ignore_errors=True)
            return None
        try:
            self._promote(self.attempts[0].staging)
        except OSError as exc:
            return f"cannot move the outputs into {self.output_dir}: {exc.strerror or exc}"
        return None

    def _recorded(
        self, manifest: Manifest | None, record: dict[str, Any], duration: float, skipped: str | None
    ) -> RunResult:
        """Write run.json; return the result (an error when run.json cannot be written)."""
        try:
            write_json_atomic(self.output_dir / RUN_RECORD, record)
        except OSError as exc:  # a full disk, or a folder in its place: the case ends without a record
            problem = f"cannot write {self.output_dir / RUN_RECORD}: {exc.strerror or exc}"
            record["problems"] = [*record["problems"], problem]
            record["outcome"] = "error"
        return self._result(manifest, record["outcome"], record["problems"], record, duration, skipped)

    def _moved(self, staging: Path | None = None) -> str | None:
        """Return why the folders of this run are no longer bsa's (checked after a binary exits, as before it
        starts): the case folder, the output folder or a run's staging folder replaced by a symbolic link
        or by something other than a folder. None: all still real folders."""
        folders = [(self.case_dir, "case folder"), (self.output_dir, "output folder")]
        if staging is not None:
            folders.append((staging, "run folder"))
        for folder, what in folders:
            if folder.is_symlink() or not folder.is_dir():
                kind = "a symbolic link" if folder.is_symlink() else "no longer a folder"
                return (
                    f"{folder} ({what}) is {kind} after the binary ran: bsa never reads, hashes or writes "
                    "through it; nothing of this run was recorded there"
                )
        return None

    def _result(
        self,
        manifest: Manifest | None,
        outcome: Outcome,
        problems: list[str],
        record: Mapping[str, Any] | None,
        duration: float,
        skipped: str | None = None,
    ) -> RunResult:
        first = self.attempts[0] if self.attempts else None
        return RunResult(
            name=self.name,
            case_dir=self.case_dir,
            output_dir=self.output_dir,
            outcome=outcome,
            problems=tuple(problems),
            status=first.status if first else None,
            expect_status=None if manifest is None else manifest.expect_status,
            device_id=self.device_id,
            duration_s=duration,
            record=record or {},
            skipped=skipped if outcome == "skipped" else None,
        )

    def _run_all(self, manifest: Manifest) -> tuple[Outcome, list[str]]:
        """Run the case --repeat times (`self.attempts`), compare each repeat with run 1 and judge them all
        (`self.differences`); return the outcome and its problems."""
        attempts, differences = self.attempts, self.differences
        for index in range(1, self.options.repeat + 1):
            if self.cancel.event.is_set():
                return "interrupted", []
            attempt = self._attempt(index)
            attempts.append(attempt)
            self._execute(attempt)
            moved = self._moved(attempt.staging)
            if moved is not None:  # never read through what the binary put in its folder's place
                attempt.problems.append(moved)
                return "error", list(attempt.problems)
            if attempt.outcome == "skipped":  # the device found at run time that it cannot run the op
                return "skipped", []
            if attempt.exit_code == 0:
                read_status(attempt.staging, attempt)
                if attempt.status is not None:
                    check_outputs(attempt.staging, manifest, attempt)
            elif attempt.exit_code is not None and (attempt.staging / STATUS_FILE).is_file():
                read_status(attempt.staging, attempt)  # for the record; the exit code already failed it
            outcome = attempt.outcome
            if outcome != "ok":
                prefix = f"run {index} of {self.options.repeat}: " if self.options.repeat > 1 else ""
                return outcome, [prefix + p for p in self._attempt_problems(attempt)]
            if index > 1:
                differences.extend(differences_of(manifest, attempts[0], attempt, self.options.deterministic))
        if self.options.repeat > 1:  # every run is judged, so a race that moves outputs fails the run
            for attempt in attempts:
                differences.extend(judge_repeat(self.case_dir, manifest, attempt, self.options.judge))
        races = [d["message"] for d in differences if d.get("matters")]
        return "nondeterministic" if races else "ok", races

    def _attempt(self, index: int) -> Attempt:
        staging = self.output_dir / f".run-{index}"
        if staging.is_symlink() or staging.is_file():
            staging.unlink()
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        suffix = "" if index == 1 else f".run{index}"
        order_args, order_seed = self.device.run_order(self.options.seed, self.name, index, self.options.deterministic)
        argv = self.device.argv(self.case_dir, staging, self.device_id) + order_args
        return Attempt(index, argv, staging, f"stdout{suffix}.log", f"stderr{suffix}.log", order_seed=order_seed)

    def _attempt_problems(self, attempt: Attempt) -> list[str]:
        if attempt.interrupted:
            return ["interrupted by Ctrl-C"]
        if attempt.timed_out:
            return [f"timed out after {self.options.timeout:g} s; its process group was killed"]
        if attempt.signal is not None:
            return [f"killed by {attempt.signal} (see {attempt.stderr_log})"]
        if attempt.exception is not None:
            return [f"the reference device raised {attempt.exception} (see {attempt.stderr_log})"]
        return attempt.problems

    def _execute(self, attempt: Attempt) -> None:
        attempt.started = now()
        clock = time.monotonic()
        try:
            self.device.execute(attempt, self._execution)
        except OSError as exc:  # a log or output that cannot be written (a full disk, a folder in its place)
            attempt.problems.append(
                f"cannot run the case: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
            )
        finally:
            attempt.duration_s = time.monotonic() - clock
            attempt.finished = now()

    def _promote(self, staging: Path) -> None:
        """Move the first run's files from its staging directory up into the output directory.

        Names `bsa run` keeps for itself (run.json, the logs, .run-K) are not moved, and nothing replaces
        a folder already in the output directory: the staging directory, with what was not moved, is
        removed (never following a link).
        """
        if staging.is_symlink():
            staging.unlink()  # a link the binary left in its run folder's place: the link goes, never its target
            return
        if not staging.is_dir():
            return
        for path in staging.iterdir():
            if path.name == RUN_RECORD or _run_file(path.name):
                continue
            target = self.output_dir / path.name
            if target.is_dir() and not target.is_symlink():
                if not (path.is_dir() and not path.is_symlink() and not any(target.iterdir())):
                    continue  # an earlier folder stays; an empty one is replaced below
            os.replace(path, target)
        shutil.rmtree(staging, ignore_errors=True)


def _unforeseen(case_dir: Path, options: RunOptions, device_id: int, exc: Exception) -> RunResult:
    """Return the error result of a case whose run raised `exc` (one line naming it, no traceback)."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    problem = f"bsa could not run this case: {type(exc).__name__}: {clip(str(exc))}{at} (a bug in bsa?)"
    case_dir = Path(case_dir)
    output_dir = output_dir_for(case_dir, options.outputs_root)
    return RunResult(case_dir.name, case_dir, output_dir, "error", (problem,), device_id=device_id)


def run_case(case_dir: Path, options: RunOptions, device_id: int | None = None) -> RunResult:
    """Run one case (with its repeats) and write its `run.json`; return the result."""
    return _CaseRun(case_dir, options, options.device_ids[0] if device_id is None else device_id, Cancel()).run()


def run_cases(
    case_dirs: Sequence[Path], options: RunOptions, on_event: Callable[[RunEvent], None] | None = None
) -> RunSummary:
    """Run every case, one worker per device id, and return the results in case order.

    `on_event` is called in the calling thread, for each case's start and end. Ctrl-C (KeyboardInterrupt
    in the calling thread) kills the running process groups, records the cases it stopped as
    "interrupted", and returns a summary with `interrupted` set: finished cases keep their records.
    A second Ctrl-C while workers wind down propagates.
    """
    for case_dir in case_dirs:
        if output_dir_for(case_dir, options.outputs_root).resolve() == Path(case_dir).resolve():
            raise RunConfigError(
                f"--outputs-root {options.outputs_root} would put outputs into the case directory {case_dir} "
                "itself; choose a folder outside the generated cases"
            )
    pending: queue.Queue[tuple[int, Path]] = queue.Queue()
    for index, case_dir in enumerate(case_dirs):
        pending.put((index, Path(case_dir)))
    events: queue.Queue[RunEvent] = queue.Queue()
    results: dict[int, RunResult] = {}
    cancel = Cancel()
    failures: list[BaseException] = []

    def worker(device_id: int) -> None:
        while not cancel.event.is_set():
            try:
                index, case_dir = pending.get_nowait()
            except queue.Empty:
                return
            events.put(RunEvent("start", case_dir.name, device_id))
            try:
                result = _CaseRun(case_dir, options, device_id, cancel).run()
            except Exception as exc:  # a bug in bsa or a case it did not foresee: record it, go on
                result = _unforeseen(case_dir, options, device_id, exc)
            except BaseException as exc:  # stop the run and re-raise in the caller
                failures.append(exc)
                cancel.cancel()
                return
            results[index] = result
            events.put(RunEvent("done", result.name, device_id, result))

    workers = [
        threading.Thread(target=worker, args=(d,), name=f"bsa-device-{d}", daemon=True)
        for d in options.device_ids[: max(1, len(case_dirs))]
    ]
    for thread in workers:
        thread.start()

    def drain(timeout: float | None = None) -> None:
        """Hand the waiting events to `on_event` (waiting up to `timeout` s for the first)."""
        while True:
            try:
                event = events.get(timeout=timeout) if timeout else events.get_nowait()
            except queue.Empty:
                return
            timeout = None
            if on_event is not None:
                on_event(event)

    interrupted = False
    try:
        while any(t.is_alive() for t in workers):
            drain(0.1)
    except KeyboardInterrupt:
        interrupted = True
        cancel.cancel()
        for thread in workers:
            while thread.is_alive():
                thread.join(timeout=0.1)
                drain()
    drain()
    if failures:
        raise failures[0]
    ordered = [results[i] for i in sorted(results)]
    not_run = [Path(c).name for i, c in enumerate(case_dirs) if i not in results]
    return RunSummary(results=ordered, device=options.device, interrupted=interrupted, not_run=not_run)
