"""The binary contract: run a device binary (or the reference device) on case directories and record it.

The contract (docs/run.md documents it for users):

    BINARY <case_dir>/case.json <output_dir>        (or a --cmd template, split with shlex, no shell)

with `ASCEND_DEVICE_ID` set. The binary writes `dq.bin`, `dk.bin`, `dv.bin` as the manifest's `outputs`
say, and `status.txt` (first line the aclnn status as a decimal integer, an optional second line a
message); a negative case writes only `status.txt`. It exits 0 once the status is recorded, whatever the
status; a non-zero exit means the binary itself failed. The torch_npu device is such a binary too:
`python -m bsa_cli.torch_npu_device <case_dir>/case.json <output_dir>` in a child process per run.

Each run of a binary writes into a fresh staging directory `<output_dir>/.run-K`; when the case is done,
the first run's files move up into `<output_dir>` and `run.json` (this module's record) is written last,
atomically. Stale results of an earlier run are deleted before a case starts, so nothing left over from
another binary can be judged, and an interrupted case never leaves gradients without a record.

This module never prints: callers watch progress through `RunEvent`s.
"""

from __future__ import annotations

import datetime as _dt
import os
import queue
import selectors
import shutil
import signal
import subprocess
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import device_software
from ._version import __version__
from .case import numpy_dtype
from .devices import Device, RunConfigError, RunOptions, _emulator
from .errors import BsaError, DataError, clip, show
from .manifest import flat_params
from .store import (
    FLAT_PARAMS,
    OUTPUTS_DIR,
    check_output_dir,
    expected_nbytes,
    inside,
    inside_parent,
    iter_entries,
    load_manifest,
    parse_status,
    read_regular,
    refresh_flat_params,
    sha256_file,
    verify_inputs,
    write_json_atomic,
)

RUN_FORMAT = "bsa-run/1"
RUN_RECORD = "run.json"
STATUS_FILE = "status.txt"


KILL_GRACE_S = 2.0
"""Seconds between SIGTERM and SIGKILL when a process group is stopped."""

LOG_HEAD_BYTES = 1 << 20
LOG_TAIL_BYTES = 1 << 20
"""A binary's stdout and stderr logs keep their first and last MiB; what lies between is cut (and counted)."""

STATUS_MAX_BYTES = 64 << 10
"""Bytes of status.txt read (its status line and message)."""

PIPE_DRAIN_S = 2.0
"""Seconds to keep reading a binary's output after its process group ended (a descendant that left the
group may hold the pipe open)."""

OUTCOMES: dict[str, str] = {
    "ok": "ran and left a complete result: a status, and dq/dk/dv when the status is 0",
    "nondeterministic": "ran --repeat times and met a race that matters: the status or dq differed between runs "
    "(with --deterministic: any output), or a repeat failed the standard (last-bit noise in dk/dv alone is "
    "reported, not failed, unless the run asked for deterministic mode)",
    "error": "inputs failed verification, the binary exited non-zero, or its outputs are missing or of the wrong size",
    "crashed": "the binary was killed by a signal (the reference device: raised an exception)",
    "timeout": "ran past --timeout; its whole process group was killed",
    "interrupted": "stopped by Ctrl-C before it finished",
}
"""Outcome of running one case, and what each means. Only `ok` leaves a result `bsa compare` can judge."""




# ---- configuration ------------------------------------------------------------------------------


















# ---- selecting cases ----------------------------------------------------------------------------


def output_dir_for(case_dir: Path, outputs_root: Path | None) -> Path:
    """Return where a case's device outputs go: `<case_dir>/outputs`, or `<outputs_root>/<case name>`."""
    return Path(case_dir) / OUTPUTS_DIR if outputs_root is None else Path(outputs_root) / Path(case_dir).name


# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseResult:
    """The outcome of running one case (its `run.json` holds the full record)."""

    name: str
    case_dir: Path
    output_dir: Path
    outcome: str  # a key of OUTCOMES
    problems: tuple[str, ...] = ()
    status: int | None = None
    expect_status: int | None = None
    device_id: int = 0
    duration_s: float = 0.0
    record: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass(frozen=True)
class RunEvent:
    """Progress of a run: `kind` is "start" (a case began on a device) or "done" (with its result)."""

    kind: str
    case: str
    device_id: int
    result: CaseResult | None = None


@dataclass
class RunSummary:
    """All case results of a run, in case order, and whether Ctrl-C stopped it."""

    results: list[CaseResult]
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
        else 0. A run does not judge the gradients or the status: `bsa compare` does.
        """
        unjudged = {"error", "crashed", "timeout", "interrupted"}
        if self.interrupted or self.not_run or any(r.outcome in unjudged for r in self.results):
            return 3
        if any(r.outcome == "nondeterministic" for r in self.results):
            return 1
        return 0


# ---- running ------------------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Cancel:
    """Shared between workers: the cancel flag and the process groups running now."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._groups: set[int] = set()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._groups.discard(pgid)

    def cancel(self) -> None:
        self.event.set()
        with self._lock:
            groups = list(self._groups)
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a run's whole process group: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


@dataclass
class _Attempt:
    """One run of a case: what was run, how it ended, what it left."""

    index: int
    argv: list[str]
    staging: Path
    stdout_log: str
    stderr_log: str
    started: str = ""
    finished: str = ""
    duration_s: float = 0.0
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    exception: str | None = None
    status: int | None = None
    status_message: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    order_seed: int | None = None  # the reference device's accumulation order for this run

    @property
    def outcome(self) -> str:
        if self.interrupted:
            return "interrupted"
        if self.timed_out:
            return "timeout"
        if self.signal is not None or self.exception is not None:
            return "crashed"
        return "error" if self.problems else "ok"

    def as_record(self) -> dict[str, Any]:
        return {
            "run": self.index,
            "command": self.argv,
            "output_dir": str(self.staging),
            "started": self.started,
            "finished": self.finished,
            "duration_s": round(self.duration_s, 4),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "outcome": self.outcome,
            "status": self.status,
            "status_message": self.status_message,
            "outputs": self.outputs,
            "stdout_log": self.stdout_log,
            "stderr_log": self.stderr_log,
            "problems": self.problems,
            "order_seed": self.order_seed,
        }


def _clear_stale(output_dir: Path, manifest: Mapping[str, Any] | None) -> list[str]:
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
    paths = [output_dir / STATUS_FILE, output_dir / RUN_RECORD]
    paths += [output_dir / name for name in ("dq.bin", "dk.bin", "dv.bin")]
    for _, entry in iter_entries(manifest or {}, "outputs"):
        try:
            paths.append(inside_parent(output_dir, entry["file"]))
        except DataError as exc:
            problems.append(str(exc))
    for path in output_dir.iterdir():
        if path.name.startswith(".run-") or (path.name.startswith(("stdout", "stderr")) and path.name.endswith(".log")):
            paths.append(path)
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


def _read_status(staging: Path, attempt: _Attempt) -> None:
    path = staging / STATUS_FILE
    if not path.exists():
        attempt.problems.append(f"no {STATUS_FILE}: the binary must write the aclnn status there")
        return
    try:
        text = read_regular(path, STATUS_MAX_BYTES, truncate=True).decode("utf-8", errors="replace")
    except DataError as exc:
        attempt.problems.append(f"{STATUS_FILE}: {exc.message}")
        return
    lines = text.splitlines()
    first = lines[0].strip() if lines else ""
    try:
        attempt.status = parse_status(first)
    except ValueError:
        attempt.problems.append(f"{STATUS_FILE}: first line {show(first)} is not a decimal aclnn status")
        return
    message = "\n".join(lines[1:]).strip()
    attempt.status_message = message or None


def _check_outputs(staging: Path, manifest: Mapping[str, Any], attempt: _Attempt) -> None:
    """Record size and sha256 of each output; note missing or wrong-size ones when the status is 0."""
    for name, entry in iter_entries(manifest, "outputs"):
        try:
            path = inside(staging, entry["file"])
        except DataError as exc:
            attempt.problems.append(str(exc))
            continue
        expected = expected_nbytes(entry)
        if not path.is_file() or path.is_symlink():
            if attempt.status == 0:
                kind = "missing" if not (path.exists() or path.is_symlink()) else "not a regular file"
                attempt.problems.append(
                    f"{entry['file']} {kind} (status 0 promises {expected} bytes, "
                    f"shape {list(entry['shape'])} {entry['dtype']})"
                )
            continue
        size = path.stat().st_size
        digest = sha256_file(path) if size == expected else None  # an oversized file is not read
        attempt.outputs[name] = {"file": entry["file"], "bytes": size, "sha256": digest}
        if size != expected and attempt.status == 0:
            kind = "truncated" if size < expected else "oversized"
            attempt.problems.append(
                f"{entry['file']} {kind}: {size} bytes, expected {expected} "
                f"(shape {list(entry['shape'])} {entry['dtype']})"
            )


ATOMIC_OUTPUTS = ("dk", "dv")
"""Outputs the kernel sums with fp32 atomic adds: not bitwise reproducible run to run (docs/operator.md section 2)."""


def _differing_elements(first: Path, other: Path, dtype_name: str) -> tuple[int, int, int] | None:
    """Return (elements that differ, elements, largest difference in ULPs) of two output files, or None.

    ULPs count the representable values between the two (across zero too: a near-zero sum whose sign
    flips counts every value between -x and x).
    """
    a, b = first.read_bytes(), other.read_bytes()
    itemsize = numpy_dtype(dtype_name).itemsize
    if len(a) != len(b) or len(a) % itemsize:
        return None
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    x, y = np.frombuffer(a, dtype=view), np.frombuffer(b, dtype=view)
    differ = x != y
    count = int(np.count_nonzero(differ))
    if not count:
        return 0, int(x.size), 0
    return count, int(x.size), _max_ulp(x[differ], y[differ], itemsize)


def _noise(differences: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Summarize run-to-run differences per output: runs that differed, most elements, most ULPs."""
    noise: dict[str, dict[str, int]] = {}
    for diff in differences:
        if "elements" not in diff:
            continue
        entry = noise.setdefault(diff["output"], {"runs": 0, "elements": 0, "total": diff["total"], "max_ulp": 0})
        entry["runs"] += 1
        entry["elements"] = max(entry["elements"], diff["elements"])
        entry["max_ulp"] = max(entry["max_ulp"], diff["max_ulp"])
    return noise


def _max_ulp(x: np.ndarray, y: np.ndarray, itemsize: int) -> int:
    """Return the largest ULP distance between bit patterns of floats (sign-magnitude mapped to a line)."""
    bits = itemsize * 8
    sign = np.uint64(1) << np.uint64(bits - 1)

    def ordinal(v: np.ndarray) -> np.ndarray:
        u = v.astype(np.uint64)
        magnitude = (u & (sign - np.uint64(1))).astype(np.int64)
        return np.where((u & sign) != 0, -magnitude, magnitude)

    return int(np.abs(ordinal(x) - ordinal(y)).max())


class _CaseRun:
    """Runs one case (all its repeats) on one device id and writes its record."""

    def __init__(self, case_dir: Path, options: RunOptions, device_id: int, cancel: _Cancel) -> None:
        self.case_dir = Path(case_dir).resolve()
        self.options = options
        self.device = options.device
        self.device_id = device_id
        self.cancel = cancel
        root = None if options.outputs_root is None else Path(options.outputs_root).resolve()
        self.output_dir = output_dir_for(self.case_dir, root)  # its last part is never resolved: never a link
        self.name = self.case_dir.name

    def run(self) -> CaseResult:
        started = _now()
        clock = time.monotonic()
        manifest: dict[str, Any] | None = None
        attempts: list[_Attempt] = []
        problems: list[str] = []
        differences: list[dict[str, Any]] = []
        outcome = "ok"
        try:
            manifest = load_manifest(self.case_dir)
            self.name = manifest.get("name", self.name)
        except DataError as exc:
            problems.append(str(exc))
            outcome = "error"
        try:
            check_output_dir(self.output_dir)
            self.output_dir.mkdir(parents=True, exist_ok=True)
        except (DataError, OSError) as exc:  # nowhere to write: the result goes without a record
            problems.append(str(exc) if isinstance(exc, DataError) else f"{self.output_dir}: {exc.strerror or exc}")
            return self._result(manifest, [], "error", problems, None, time.monotonic() - clock)
        stale = _clear_stale(self.output_dir, manifest)
        if stale:
            problems.extend(stale)
            outcome = "error"
        inputs_run: dict[str, str] | None = None
        if manifest is not None and outcome == "ok":
            try:
                verify_inputs(self.case_dir, manifest)
                entries = iter_entries(manifest, "inputs")
                inputs_run = {name: str(entry["sha256"]) for name, entry in entries if entry.get("sha256")}
            except DataError as exc:
                problems.append(f"inputs not run: {exc}")
                outcome = "error"
        if manifest is not None and outcome == "ok":
            try:  # case.txt is derived: what a harness reads always matches the checked case.json
                refresh_flat_params(self.case_dir, flat_params(manifest))
            except (OSError, KeyError, TypeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                problems.append(f"cannot write {self.case_dir / FLAT_PARAMS} from case.json: {why}")
                outcome = "error"
        try:
            if outcome == "ok" and manifest is not None:
                outcome = self._run_all(manifest, attempts, problems, differences)
        except OSError as exc:  # a staging folder that cannot be made (a full disk, no permission)
            problems.append(f"cannot run the case in {self.output_dir}: {exc.strerror or exc}")
            outcome = "error"
        finally:
            for attempt in attempts[1:]:
                shutil.rmtree(attempt.staging, ignore_errors=True)
        moved = self._moved()
        if moved is not None:  # the binary replaced the output folder (or the case folder) with a link
            problems.append(moved)
            return self._result(manifest, attempts, "error", problems, None, time.monotonic() - clock)
        if attempts and outcome != "interrupted":
            try:
                self._promote(attempts[0].staging)
            except OSError as exc:
                problems.append(f"cannot move the outputs into {self.output_dir}: {exc.strerror or exc}")
                outcome = "error"
        elif attempts:
            shutil.rmtree(attempts[0].staging, ignore_errors=True)
        duration = time.monotonic() - clock
        record = self._record(manifest, attempts, outcome, problems, differences, started, duration)
        record["inputs"] = inputs_run
        try:
            write_json_atomic(self.output_dir / RUN_RECORD, record)
        except OSError as exc:  # a full disk, or a folder in its place: the case ends without a record
            problems.append(f"cannot write {self.output_dir / RUN_RECORD}: {exc.strerror or exc}")
            record["outcome"], record["problems"] = "error", problems
            outcome = "error"
        return self._result(manifest, attempts, outcome, problems, record, duration)

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
                return (f"{folder} ({what}) is {kind} after the binary ran: bsa never reads, hashes or writes "
                        "through it; nothing of this run was recorded there")  # fmt: skip
        return None

    def _result(
        self,
        manifest: Mapping[str, Any] | None,
        attempts: list[_Attempt],
        outcome: str,
        problems: list[str],
        record: Mapping[str, Any] | None,
        duration: float,
    ) -> CaseResult:
        first = attempts[0] if attempts else None
        return CaseResult(
            name=self.name,
            case_dir=self.case_dir,
            output_dir=self.output_dir,
            outcome=outcome,
            problems=tuple(problems),
            status=first.status if first else None,
            expect_status=(manifest or {}).get("expect", {}).get("status"),
            device_id=self.device_id,
            duration_s=duration,
            record=record or {},
        )

    def _run_all(
        self,
        manifest: Mapping[str, Any],
        attempts: list[_Attempt],
        problems: list[str],
        differences: list[dict[str, Any]],
    ) -> str:
        for index in range(1, self.options.repeat + 1):
            if self.cancel.event.is_set():
                return "interrupted"
            attempt = self._attempt(index)
            attempts.append(attempt)
            self._execute(attempt)
            moved = self._moved(attempt.staging)
            if moved is not None:  # never read through what the binary put in its folder's place
                attempt.problems.append(moved)
                problems.extend(attempt.problems)
                return "error"
            if attempt.exit_code == 0:
                _read_status(attempt.staging, attempt)
                if attempt.status is not None:
                    _check_outputs(attempt.staging, manifest, attempt)
            elif attempt.exit_code is not None and (attempt.staging / STATUS_FILE).is_file():
                _read_status(attempt.staging, attempt)  # for the record; the exit code already failed it
            outcome = attempt.outcome
            if outcome != "ok":
                prefix = f"run {index} of {self.options.repeat}: " if self.options.repeat > 1 else ""
                problems.extend(prefix + p for p in self._attempt_problems(attempt))
                return outcome
            if index > 1:
                differences.extend(self._differences(manifest, attempts[0], attempt))
        if self.options.repeat > 1:  # every run is judged, so a race that moves outputs fails the run
            for attempt in attempts:
                differences.extend(self._judge_repeat(manifest, attempt))
        races = [d for d in differences if d.get("matters")]
        for diff in races:
            problems.append(diff["message"])
        return "nondeterministic" if races else "ok"

    def _judge_repeat(self, manifest: Mapping[str, Any], attempt: _Attempt) -> list[dict[str, Any]]:
        """Judge one run's outputs by the case's own standard (as `bsa compare` would); a failure is a race."""
        expect = (manifest.get("expect") or {}).get("status", 0)
        if attempt.status != 0 or expect != 0 or not manifest.get("golden"):
            return []
        from . import compare  # judging is only needed for repeats

        result = compare.compare_case(self.case_dir, attempt.staging, workers=1, verify_inputs=False)
        if result.verdict == "PASS":
            return []
        why = result.deciding.detail if result.deciding is not None else result.message
        return [{"run": attempt.index, "output": "verdict", "verdict": result.verdict, "matters": True,
                 "message": f"run {attempt.index} is {result.verdict} by the standard: {why}"}]  # fmt: skip

    def _attempt(self, index: int) -> _Attempt:
        staging = self.output_dir / f".run-{index}"
        if staging.is_symlink() or staging.is_file():
            staging.unlink()
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        suffix = "" if index == 1 else f".run{index}"
        argv = self.device.argv(self.case_dir, staging, self.device_id)
        order_seed = None
        if self.device.is_reference:
            order_seed = zlib.crc32(f"{self.options.seed}:{self.name}:{index}".encode())
            argv += ["--seed", str(order_seed)]
            if self.options.deterministic:
                argv.append("--deterministic")
                if self.device.fault != "deterministic-ignored":
                    order_seed = None  # one fixed order: (head, query block), as the mode's fixed-order sum
        return _Attempt(
            index=index,
            argv=argv,
            staging=staging,
            stdout_log=f"stdout{suffix}.log",
            stderr_log=f"stderr{suffix}.log",
            order_seed=order_seed,
        )

    def _attempt_problems(self, attempt: _Attempt) -> list[str]:
        if attempt.interrupted:
            return ["interrupted by Ctrl-C"]
        if attempt.timed_out:
            return [f"timed out after {self.options.timeout:g} s; its process group was killed"]
        if attempt.signal is not None:
            return [f"killed by {attempt.signal} (see {attempt.stderr_log})"]
        if attempt.exception is not None:
            return [f"the reference device raised {attempt.exception} (see {attempt.stderr_log})"]
        return attempt.problems

    def _execute(self, attempt: _Attempt) -> None:
        attempt.started = _now()
        clock = time.monotonic()
        try:
            if self.device.is_reference:
                self._emulate(attempt)
            else:
                self._spawn(attempt)
        except OSError as exc:  # a log or output that cannot be written (a full disk, a folder in its place)
            attempt.problems.append(f"cannot run the case: {exc.strerror or exc}"
                                    + (f" ({exc.filename})" if exc.filename else ""))  # fmt: skip
        finally:
            attempt.duration_s = time.monotonic() - clock
            attempt.finished = _now()

    def _emulate(self, attempt: _Attempt) -> None:
        """Run the reference device in this process (same contract, same record). Ctrl-C stops it within
        one kv block (its progress calls look at the cancel flag): the case is recorded as interrupted."""
        stdout = self.output_dir / attempt.stdout_log
        stderr = self.output_dir / attempt.stderr_log
        stdout.write_text("")
        emulator = _emulator()

        def stop_if_cancelled(_name: str, _fraction: float) -> None:
            if self.cancel.event.is_set():
                raise _Stopped

        try:
            if self.cancel.event.is_set():
                raise _Stopped
            with emulator.reporting(stop_if_cancelled):
                emulator.emulate_case_dir(
                    self.case_dir, attempt.staging, fault=self.device.fault, order_seed=attempt.order_seed
                )
            if self.cancel.event.is_set():
                raise _Stopped
        except _Stopped:
            stderr.write_text("interrupted by Ctrl-C\n")
            attempt.interrupted = True
            return
        except BsaError as exc:
            stderr.write_text(f"Error: {exc}\n")
            attempt.exit_code = 2
            attempt.problems.append(f"the reference device refused the case: {exc}")
            return
        except OSError as exc:
            stderr.write_text(f"Error: {exc}\n")
            attempt.exit_code = 2
            attempt.problems.append(f"the reference device could not write its outputs: {exc.strerror or exc}")
            return
        except Exception as exc:
            stderr.write_text(traceback.format_exc())
            attempt.exception = type(exc).__name__
            return
        stderr.write_text("")
        attempt.exit_code = 0

    def _spawn(self, attempt: _Attempt) -> None:
        env = dict(os.environ)
        env.update(self.options.env(self.device_id))
        deadline = None if self.options.timeout is None else time.monotonic() + self.options.timeout
        with (
            _CappedLog(self.output_dir / attempt.stdout_log) as out,
            _CappedLog(self.output_dir / attempt.stderr_log) as err,
        ):
            try:
                proc = subprocess.Popen(
                    attempt.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                attempt.problems.append(f"cannot start {attempt.argv[0]}: {exc.strerror or exc}")
                return
            self.cancel.add(proc.pid)
            assert proc.stdout is not None and proc.stderr is not None
            reader = _PipeReader({proc.stdout: out, proc.stderr: err})
            try:
                while True:
                    try:
                        proc.wait(timeout=0.05)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if self.cancel.event.is_set():
                        attempt.interrupted = True
                        _stop_group(proc)
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        attempt.timed_out = True
                        _stop_group(proc)
                        break
            finally:
                # Children the binary left behind belong to the run: stop them too.
                _signal_group(proc.pid, signal.SIGKILL)
                self.cancel.discard(proc.pid)
                reader.finish(PIPE_DRAIN_S)
        code = proc.returncode
        if code is not None and code < 0 and self.cancel.event.is_set() and not attempt.timed_out:
            attempt.interrupted = True  # killed by the Ctrl-C handler before this worker saw the flag
        if code is not None and code < 0 and not (attempt.timed_out or attempt.interrupted):
            attempt.signal = _signal_name(-code)
        elif code is not None and code >= 0:
            attempt.exit_code = code
            if code != 0 and not (attempt.timed_out or attempt.interrupted):
                status_hint = ""
                if (attempt.staging / STATUS_FILE).is_file():
                    status_hint = " although it wrote status.txt (exit 0 once the status is recorded)"
                attempt.problems.append(f"exited with code {code}{status_hint} (see {attempt.stderr_log})")

    def _differences(self, manifest: Mapping[str, Any], first: _Attempt, other: _Attempt) -> list[dict[str, Any]]:
        """Compare a repeat with run 1: the status, and each output element by element.

        dQ rows have one owner in the kernel, so dQ must be bitwise identical; dK and dV are summed with
        fp32 atomic adds, so their last bits may move from run to run (noise, reported, not a failure).
        A differing status or dQ (or an output that vanished) is a race that matters (`matters`); in deterministic
        mode every output must be bitwise identical, dK and dV too.
        """
        diffs: list[dict[str, Any]] = []
        if first.status != other.status:
            diffs.append(
                {
                    "run": other.index,
                    "output": "status",
                    "matters": True,
                    "message": f"status differs: run 1 {first.status}, run {other.index} {other.status}",
                }
            )
        for name, entry in iter_entries(manifest, "outputs"):
            a, b = first.outputs.get(name), other.outputs.get(name)
            if (a or {}).get("sha256") == (b or {}).get("sha256"):
                continue
            matters = name not in ATOMIC_OUTPUTS or self.options.deterministic
            diff: dict[str, Any] = {"run": other.index, "output": name, "matters": matters}
            counted = None
            if a and b:
                counted = _differing_elements(
                    first.staging / entry["file"], other.staging / entry["file"], entry["dtype"]
                )
            if counted is None:
                diff["matters"] = True
                diff["message"] = f"{name} not bitwise identical: run {other.index} differs from run 1"
            else:
                diff["elements"], diff["total"], diff["max_ulp"] = counted
                what = (
                    "deterministic mode asks all three outputs bitwise identical"
                    if self.options.deterministic and name in ATOMIC_OUTPUTS
                    else "a race: its rows have one owner" if diff["matters"] else "fp32 atomic-add noise"
                )
                diff["message"] = (
                    f"{name} not bitwise identical: run {other.index} differs from run 1 in {counted[0]} of "
                    f"{counted[1]} elements, by at most {counted[2]} ULP ({what})"
                )
            diffs.append(diff)
        return diffs

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
            name = path.name
            if name == RUN_RECORD or name.startswith(".run-") or (
                name.startswith(("stdout", "stderr")) and name.endswith(".log")
            ):
                continue
            target = self.output_dir / name
            if target.is_dir() and not target.is_symlink():
                if not (path.is_dir() and not path.is_symlink() and not any(target.iterdir())):
                    continue  # an earlier folder stays; an empty one is replaced below
            os.replace(path, target)
        shutil.rmtree(staging, ignore_errors=True)

    def _record(
        self,
        manifest: Mapping[str, Any] | None,
        attempts: list[_Attempt],
        outcome: str,
        problems: list[str],
        differences: list[dict[str, Any]],
        started: str,
        duration: float,
    ) -> dict[str, Any]:
        first = attempts[0] if attempts else None
        device = self.device
        expect = (manifest or {}).get("expect")
        runs = [a.as_record() for a in attempts]
        if runs:
            runs[0]["output_dir"] = str(self.output_dir)  # its files were moved up there
        return {
            "format": RUN_FORMAT,
            "tool": {"name": "bsa", "version": __version__},
            "case": self.name,
            "case_dir": str(self.case_dir),
            "output_dir": str(self.output_dir),
            "device": {
                "name": device.name,
                "kind": device.kind,
                "id": self.device_id,
                "fault": device.fault,
            },
            "binary": (
                {"path": str(device.binary), "sha256": device.binary_sha256} if device.binary is not None else None
            ),
            "command": first.argv if first else None,
            "env": self.options.env(self.device_id),
            "timeout_s": None if device.is_reference else self.options.timeout,
            "started": started,
            "finished": _now(),
            "duration_s": round(duration, 4),
            "outcome": outcome,
            "problems": problems,
            "exit_code": first.exit_code if first else None,
            "signal": first.signal if first else None,
            "status": first.status if first else None,
            "status_message": first.status_message if first else None,
            "expect": expect,
            "outputs": first.outputs if first else {},
            "stdout_log": first.stdout_log if first else None,
            "stderr_log": first.stderr_log if first else None,
            "deterministic": self.options.deterministic,
            "device_software": self._software(first),
            "repeat": {
                "count": self.options.repeat,
                "completed": sum(a.outcome == "ok" for a in attempts),
                "identical": not differences,
                "differences": [{k: v for k, v in d.items() if k != "message"} for d in differences],
                "noise": _noise(differences),
                "seed": self.options.seed if self.device.is_reference else None,
            },
            "runs": runs,
        }


    def _software(self, first: _Attempt | None) -> dict[str, Any]:
        """What the device side runs (docs/run.md, `device_software`); never raises: unknown values are null."""
        if self.device.is_reference:
            return device_software.reference()
        if self.device.torch_npu:
            return device_software.from_torch_npu_log(self.output_dir / first.stdout_log if first else None)
        return device_software.binary({**os.environ, **self.options.env(self.device_id)})


def _unforeseen(case_dir: Path, options: RunOptions, device_id: int, exc: Exception) -> CaseResult:
    """Return the error result of a case whose run raised `exc` (one line naming it, no traceback)."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    problem = f"bsa could not run this case: {type(exc).__name__}: {clip(str(exc))}{at} (a bug in bsa?)"
    return CaseResult(
        name=Path(case_dir).name,
        case_dir=Path(case_dir),
        output_dir=output_dir_for(Path(case_dir), options.outputs_root),
        outcome="error",
        problems=(problem,),
        device_id=device_id,
    )


class _Stopped(Exception):
    """Raised inside the reference device when Ctrl-C cancelled the run."""


class _CappedLog:
    """A log file that keeps the first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES written to it and says,
    between them, how many bytes were cut."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "wb")  # noqa: SIM115 - closed in __exit__
        self.head = 0
        self.tail = bytearray()
        self.cut = 0

    def __enter__(self) -> _CappedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.cut:
                self.file.write(
                    f"\n[bsa: {self.cut} bytes cut here; a log keeps its first {LOG_HEAD_BYTES} and last "
                    f"{LOG_TAIL_BYTES} bytes]\n".encode()
                )
            self.file.write(self.tail)
        finally:
            self.file.close()

    def write(self, data: bytes) -> None:
        try:
            self._write(data)
        except OSError:  # a full disk: the rest of the output is read and dropped, so the child never blocks
            self.cut += len(data)

    def _write(self, data: bytes) -> None:
        if self.head < LOG_HEAD_BYTES:
            part = data[: LOG_HEAD_BYTES - self.head]
            self.file.write(part)
            self.head += len(part)
            data = data[len(part) :]
        if data:
            self.tail += data
            if len(self.tail) > LOG_TAIL_BYTES:
                extra = len(self.tail) - LOG_TAIL_BYTES
                del self.tail[:extra]
                self.cut += extra


class _PipeReader(threading.Thread):
    """Copies a child's stdout and stderr pipes into capped logs until both close or `finish` stops it."""

    def __init__(self, pipes: Mapping[Any, _CappedLog]) -> None:
        super().__init__(daemon=True, name="bsa-logs")
        self.pipes = dict(pipes)
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for pipe, log in self.pipes.items():
                selector.register(pipe, selectors.EVENT_READ, log)
            while selector.get_map() and not self.stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    try:
                        data = os.read(key.fd, 1 << 16)
                    except OSError:
                        data = b""
                    if data:
                        key.data.write(data)
                    else:
                        selector.unregister(key.fileobj)

    def finish(self, timeout: float) -> None:
        """Wait up to `timeout` s for the pipes to close (the process group is gone), then stop reading."""
        self.join(timeout)
        self.stop.set()
        self.join()
        for pipe in self.pipes:
            pipe.close()


def run_case(case_dir: Path, options: RunOptions, device_id: int | None = None) -> CaseResult:
    """Run one case (with its repeats) and write its `run.json`; return the result."""
    cancel = _Cancel()
    return _CaseRun(case_dir, options, options.device_ids[0] if device_id is None else device_id, cancel).run()


def run_cases(
    case_dirs: Sequence[Path],
    options: RunOptions,
    on_event: Callable[[RunEvent], None] | None = None,
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
    results: dict[int, CaseResult] = {}
    cancel = _Cancel()
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

    def drain() -> None:
        while True:
            try:
                event = events.get_nowait()
            except queue.Empty:
                return
            if on_event is not None:
                on_event(event)

    interrupted = False
    try:
        while any(t.is_alive() for t in workers):
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                continue
            if on_event is not None:
                on_event(event)
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
