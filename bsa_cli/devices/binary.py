"""The external device: a binary (`--binary`) or a command template (`--cmd`), run as a child process per
run of a case, as the binary contract says (`base`)."""

from __future__ import annotations

import enum
import os
import shlex
import shutil
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..core.errors import suggest
from ..core.exit_codes import ExitCode
from ..store import MANIFEST, sha256_file
from ..store.manifest import Manifest
from . import software, timing
from .base import Attempt, ChildDevice, DeviceKind, Execution, RunConfigError
from .process import spawn


class ChildExit(enum.IntEnum):
    """The exit codes of a device child (the torch_npu child, the C++ harness): the binary contract's, not
    bsa's own (`core.exit_codes`)."""

    STATUS = ExitCode.PASSED  # a status was recorded, whatever it is
    USAGE = ExitCode.USAGE  # bad arguments, an unreadable case, a call it cannot make, a module missing
    DEVICE = ExitCode.UNJUDGED  # the operator or device failed without an aclnn status
    WRITE = 4  # an output file could not be written
    #: It cannot run the folder's op here (the C++ harness on autograd, the torch_npu child on autograd before
    #: torch 2.6); the first line of its stderr is `CANNOT_RUN_PREFIX` + why.
    CANNOT_RUN = 5


CANNOT_RUN_PREFIX = "cannot run: "
#: The stdout line of a binary that pre-filled the forward's out and lse with NaN before the call (the C++
#: harness with its default --fill nan); run.json then records `device.prefilled_outputs: "nan"`.
PREFILL_LINE = "bsa-prefilled-outputs: nan"

#: Names a --cmd template may use, as `{name}`.
PLACEHOLDERS = ("binary", "case_dir", "manifest", "output_dir", "device_id")


@dataclass(frozen=True)
class BinaryDevice(ChildDevice):
    """An external binary and/or --cmd template. Build one with `create`, which checks both."""

    binary: Path | None = None
    cmd: str | None = None
    binary_sha256: str | None = None

    kind: ClassVar[DeviceKind] = "binary"

    @classmethod
    def create(cls, binary: str | Path | None = None, cmd: str | None = None) -> BinaryDevice:
        """Check the binary and the template and return the device.

        Raises:
            RunConfigError: the binary is missing or not executable, or the template uses an unknown or
                unavailable placeholder.
        """
        resolved = _resolve_binary(binary) if binary is not None else None
        if cmd is not None:
            _check_template(cmd, has_binary=resolved is not None)
        return cls(binary=resolved, cmd=cmd, binary_sha256=sha256_file(resolved) if resolved is not None else None)

    @property
    def name(self) -> str:
        return str(self.binary) if self.binary is not None else shlex.split(self.cmd or "")[0]

    @property
    def announcement(self) -> str:
        return f"device: {self.name} (sha256 {self.binary_sha256 or '-'})"

    @property
    def binary_record(self) -> dict[str, Any] | None:
        return {"path": str(self.binary), "sha256": self.binary_sha256} if self.binary is not None else None

    def argv(self, case_dir: Path, output_dir: Path, device_id: int) -> list[str]:
        """Return the command line of one run: `BINARY <case_dir>/case.json <output_dir>`, or the template's."""
        manifest = str(case_dir / MANIFEST)
        if self.cmd is None:
            return [str(self.binary), manifest, str(output_dir)]
        binary = str(self.binary) if self.binary is not None else ""
        values = (binary, str(case_dir), manifest, str(output_dir), str(device_id))  # in PLACEHOLDERS' order
        return [token.format(**dict(zip(PLACEHOLDERS, values, strict=True))) for token in shlex.split(self.cmd)]

    def unsupported(self, manifest: Manifest) -> str | None:
        if manifest.op.autograd_only:
            return "a device binary has no autograd (torch_npu's link): run it with --device torch_npu"
        return None

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        spawn(attempt, execution)
        mark_cannot_run(attempt, execution)
        mark_prefill(attempt, execution)
        mark_device_lines(attempt, execution)

    def software(self, stdout_log: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
        return software.binary({**os.environ, **env})


def _resolve_binary(binary: str | Path) -> Path:
    path = Path(binary)
    if not path.exists() and os.sep not in str(binary):
        found = shutil.which(str(binary))
        if found:
            path = Path(found)
    if not path.exists():
        raise RunConfigError(f"--binary {binary}: no such file")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RunConfigError(f"--binary {binary}: not an executable file (chmod +x?)")
    return path.resolve()


def _check_template(cmd: str, *, has_binary: bool) -> None:
    try:
        tokens = shlex.split(cmd)
    except ValueError as exc:
        raise RunConfigError(f"--cmd {cmd!r}: cannot split it like a shell would: {exc}") from None
    if not tokens:
        raise RunConfigError("--cmd is empty; give a command template such as '{binary} {manifest} {output_dir}'")
    used = set()
    for token in tokens:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(token) if f is not None]
        except ValueError as exc:
            raise RunConfigError(f"--cmd {cmd!r}: {exc} (write literal braces as {{{{ and }}}})") from None
        for name in fields:
            if name not in PLACEHOLDERS:
                allowed = " ".join("{" + p + "}" for p in PLACEHOLDERS)
                raise RunConfigError(
                    f"--cmd {cmd!r}: unknown placeholder {{{name}}}{suggest(name, PLACEHOLDERS)}; allowed: {allowed}"
                )
            used.add(name)
    if "binary" in used and not has_binary:
        raise RunConfigError("--cmd uses {binary} but no --binary was given")
    if "output_dir" not in used:
        raise RunConfigError(
            f"--cmd {cmd!r} has no {{output_dir}}: the binary would not know where to write dq, dk, dv"
        )


def mark_cannot_run(attempt: Attempt, execution: Execution) -> None:
    """Turn a child's "cannot run this op" (exit `ChildExit.CANNOT_RUN`, stderr `cannot run: WHY`) into a skip.

    `attempt.skipped` gets WHY and the exit code's problem goes (the run is "skipped", not an error); any
    other exit 5 stays what it was.
    """
    if attempt.exit_code != ChildExit.CANNOT_RUN or attempt.signal is not None or attempt.timed_out:
        return
    head = software.read_head(execution.output_dir / attempt.stderr_log, 4096)
    first = [] if head is None else head.splitlines()[:1]
    if not first or not first[0].startswith(CANNOT_RUN_PREFIX) or not first[0][len(CANNOT_RUN_PREFIX) :].strip():
        return
    attempt.skipped = first[0][len(CANNOT_RUN_PREFIX) :].strip()[:500]
    attempt.problems = [p for p in attempt.problems if not p.startswith(f"exited with code {ChildExit.CANNOT_RUN:d}")]


def mark_prefill(attempt: Attempt, execution: Execution) -> None:
    """Record that the binary pre-filled the forward's outputs with NaN (its stdout line `PREFILL_LINE`,
    read from the first 64 KiB of its log)."""
    if PREFILL_LINE in (software.read_head(execution.output_dir / attempt.stdout_log, 65536) or "").splitlines():
        attempt.prefilled_outputs = "nan"


def mark_device_lines(attempt: Attempt, execution: Execution) -> None:
    """Record the times of the timed calls, the chip and the guard zones a child reported on its stdout
    (`timing.read_lines`: `bsa-time-us:`, `bsa-guard-zones:`, `bsa-guard-write:` lines; `timing.read_chip`)."""
    text = software.read_head(execution.output_dir / attempt.stdout_log, timing.LOG_MAX_BYTES) or ""
    times, guards = timing.read_lines(text)
    attempt.times, attempt.guards, attempt.chip = times or None, guards, timing.read_chip(text)
