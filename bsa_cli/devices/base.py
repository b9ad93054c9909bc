"""What every device is: the `Device` protocol, one run of a case (`Attempt`, `Execution`), the words for
device kinds and run outcomes, and the pieces of the binary contract every device shares.

The binary contract (docs/run.md documents it for users):

    BINARY <case_dir>/case.json <output_dir>        (or a --cmd template, split with shlex, no shell)

with `ASCEND_DEVICE_ID` set. The binary writes the outputs the manifest's `outputs` say (`dq.bin`,
`dk.bin`, `dv.bin` for the backward; `out.bin`, `lse.bin` for the forward; all five for a chain), and
`status.txt` (first line the aclnn status as a decimal integer, an optional second line a
message); a negative case writes only `status.txt`. It exits 0 once the status is recorded, whatever the
status; a non-zero exit means the binary itself failed.

Three devices keep it: an external binary or --cmd template (`binary.BinaryDevice`), the torch_npu child
(`torch_npu.TorchNpuDevice`) and the built-in reference device (`reference.ReferenceDevice`). Callers ask
the device what it does (`reference_results`, `seeded`, `reports_progress`, ...), never which one it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..core.errors import BsaError
from ..core.untrusted import inside_parent
from ..store import check_output_dir, replace_atomically
from ..store.manifest import Manifest

#: How records name the kind of device.
DeviceKind = Literal["reference", "torch_npu", "cann_ops_transformer", "binary"]

#: How running one case ended (a key of `OUTCOMES`).
Outcome = Literal["ok", "nondeterministic", "error", "crashed", "timeout", "interrupted", "skipped"]

#: Outcome of running one case, and what each means. Only `ok` leaves a result `bsa compare` can judge.
OUTCOMES: dict[Outcome, str] = {
    "ok": "ran and left a complete result: a status, and dq/dk/dv when the status is 0",
    "nondeterministic": "ran --repeat times and met a race that matters: the status or dq differed between runs "
    "(with --deterministic: any output), or a repeat failed the standard (last-bit noise in dk/dv alone is "
    "reported, not failed, unless the run asked for deterministic mode)",
    "error": "inputs failed verification, the binary exited non-zero, or its outputs are missing or of the wrong size",
    "crashed": "the binary was killed by a signal (the reference device: raised an exception)",
    "timeout": "ran past --timeout; its whole process group was killed",
    "interrupted": "stopped by Ctrl-C before it finished",
    "skipped": "not run: the case folder is an op gen skipped (its operator refuses the case), or an op this "
    "device cannot run (autograd needs torch_npu); run.json says why and compare reports it as SKIP",
}

#: What asks one run for its dK/dV accumulation order (arguments added to its command line), and the seed of
#: that order (None: one fixed order, or an order bsa does not choose).
RunOrder = tuple[list[str], int | None]

#: The file every device writes the aclnn status into (first line), with an optional message after it.
STATUS_FILE = "status.txt"


class RunConfigError(BsaError):
    """A run cannot start: bad --device, --binary, --cmd, --fault or --devices value."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write bytes through a temporary file in the same directory and an atomic rename."""
    replace_atomically(path, data)  # as the store writes its own files


def write_status(output_dir: Path, status: int, message: str | None = None) -> int:
    """Write status.txt (the status, then `message` when there is one); return the status. A status of 0 is
    written last: it promises complete output files."""
    text = f"{status}\n" if message is None else f"{status}\n{message}\n"
    write_atomic(output_dir / STATUS_FILE, text.encode())
    return status


def fresh_outputs(output_dir: Path, manifest: Manifest) -> dict[str, Path]:
    """Make the output folder and remove an earlier status and output files (links as links, never outside
    `output_dir`); return where each output of the manifest goes.

    Raises:
        DataError: the output folder is a link or an output's file leaves it.
    """
    check_output_dir(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: inside_parent(output_dir, entry["file"]) for name, entry in manifest.entries("outputs")}
    for path in [output_dir / STATUS_FILE, *paths.values()]:
        if path.is_symlink() or path.is_file():
            path.unlink()
    return paths


@dataclass
class Attempt:
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
    fault_not_applied: str | None = None  # the reference device: why its planted fault left this case clean
    prefilled_outputs: str | None = None  # what the device pre-filled the outputs with ("nan"), None: not pre-filled
    skipped: str | None = None  # why the device did not run the op after all (a torch_npu child: torch < 2.6)
    times: dict[str, list[float]] | None = None  # microseconds of each timed call, by step (`timing.read_lines`)
    guards: dict[str, Any] | None = None  # run.json's `guards`: the zones kept around the outputs; None: none kept
    chip: str | None = None  # the chip the timed calls ran on, as the device names it (`timing.read_chip`)

    @property
    def outcome(self) -> Outcome:
        if self.interrupted:
            return "interrupted"
        if self.timed_out:
            return "timeout"
        if self.signal is not None or self.exception is not None:
            return "crashed"
        if self.skipped is not None and not self.problems:
            return "skipped"
        return "error" if self.problems else "ok"


class Cancel:
    """Shared between workers: the cancel flag and the process groups running now (Ctrl-C kills them)."""

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
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


@dataclass(frozen=True)
class Execution:
    """What a device needs to run one attempt besides the attempt itself."""

    case_dir: Path
    output_dir: Path  # where the attempt's stdout and stderr logs go
    env: Mapping[str, str]  # the variables bsa sets for the run (`RunOptions.env`)
    timeout: float | None
    cancel: Cancel


class Device(Protocol):
    """What runs the cases. Build one with `devices.create`, which checks it before any case runs."""

    @property
    def kind(self) -> DeviceKind:
        """How records name the kind of device."""

    @property
    def name(self) -> str:
        """How records and output name the device."""

    @property
    def fault(self) -> str | None:
        """The fault it plants (only the reference device plants one)."""

    @property
    def reference_results(self) -> bool:
        """Whether its results are a reference, never device results (the reference device)."""

    @property
    def seeded(self) -> bool:
        """Whether its runs sum dK/dV in an order seeded run by run (`RunOptions.seed`)."""

    @property
    def reports_progress(self) -> bool:
        """Whether it reports progress within a case (see `reporting`)."""

    @property
    def untimed(self) -> str | None:
        """Why `bsa run --time` records no kernel time of it (the reference device is no device), or None."""

    @property
    def announcement(self) -> str:
        """The line that says, before a run, which device runs."""

    @property
    def binary_record(self) -> dict[str, Any] | None:
        """run.json's `binary`: the external binary's path and sha256, or None."""

    def unsupported(self, manifest: Manifest) -> str | None:
        """Return why this device cannot run the op of a case folder (`manifest.op`), or None when it can.

        A reason makes the case "skipped" before anything runs (run.json `skipped` says why, compare
        reports SKIP). A device that only learns it at run time (a torch_npu child that finds torch < 2.6)
        sets `Attempt.skipped` instead."""

    def argv(self, case_dir: Path, output_dir: Path, device_id: int) -> list[str]:
        """Return the command line of one run (the reference device: the equivalent `bsa emulate` call)."""

    def run_order(self, seed: int | None, case_name: str, index: int, deterministic: bool) -> RunOrder:
        """Return run `index`'s accumulation order (`RunOrder`)."""

    def time_limit(self, timeout: float | None) -> float | None:
        """Return the time limit a run of this device runs under (--timeout, where it applies)."""

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        """Run one attempt: write its outputs into `attempt.staging` and its logs into the output folder;
        record how it ended in `attempt` (exit code, signal, timeout, interruption, problems)."""

    def software(self, stdout_log: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
        """Return run.json's `device_software` (never raises: unknown values are null)."""

    def reporting(self, callback: Callable[[str, float], None]) -> AbstractContextManager[None]:
        """While the block runs, report progress within a case as `callback(case name, fraction done)`."""


class ChildDevice:
    """What the devices that run a child process per run share (an external binary, the torch_npu child):
    no fault, device results, no order of their own, --timeout, no progress within a case."""

    fault = None
    reference_results = False
    seeded = False
    reports_progress = False
    untimed = None

    def run_order(self, seed: int | None, case_name: str, index: int, deterministic: bool) -> RunOrder:
        return [], None  # the NPU's atomic adds choose their own order

    def time_limit(self, timeout: float | None) -> float | None:
        return timeout

    def reporting(self, callback: Callable[[str, float], None]) -> AbstractContextManager[None]:
        return nullcontext()
