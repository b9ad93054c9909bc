"""Which device runs the cases, and how: `Device` (a binary, a --cmd template, torch_npu, or the reference
device with an optional planted fault) and `RunOptions` (device ids, repeats, timeout, where outputs go).

Everything here is checked before any case runs: a bad --device, --binary, --cmd, --fault or --devices
value is a `RunConfigError`. `runner.py` runs the cases.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shlex
import shutil
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BsaError, suggest
from .store import DETERMINISTIC_ENV, MANIFEST, sha256_file

REFERENCE_DEVICE = "reference (bsa emulate)"
"""How the built-in reference device is named in records and output: never presented as device results."""
TORCH_NPU_DEVICE = "torch_npu (torch_npu.npu_block_sparse_attention_backward)"
"""How the torch_npu device is named in records and output."""
TORCH_NPU_MODULE = "bsa_cli.torch_npu_device"
"""The module each run of the torch_npu device executes (`python -m`), one child process per run."""
DEVICE_KINDS: dict[str, str] = {
    "reference": "the built-in reference device (bsa emulate), in this process: reference results",
    "torch_npu": "torch_npu.npu_block_sparse_attention_backward, in a child process per case (an Ascend host)",
}
"""Built-in devices `--device` chooses between (an external binary is chosen with --binary or --cmd)."""

PLACEHOLDERS = ("binary", "case_dir", "manifest", "output_dir", "device_id")
"""Names a --cmd template may use, as `{name}`."""


class RunConfigError(BsaError):
    """A run cannot start: bad --device, --binary, --cmd, --fault or --devices value."""


@dataclass(frozen=True)
class Device:
    """What runs the cases: an external binary and/or --cmd template, the torch_npu device, or the built-in
    reference device.

    Build one with `Device.create`, which checks the binary, the template, the fault and the kind.
    """

    binary: Path | None = None
    cmd: str | None = None
    fault: str | None = None
    binary_sha256: str | None = None
    torch_npu: bool = False

    @classmethod
    def create(
        cls,
        binary: str | Path | None = None,
        cmd: str | None = None,
        fault: str | None = None,
        kind: str | None = None,
    ) -> Device:
        """Check the options and return the device.

        Args:
            kind: a key of `DEVICE_KINDS` (`--device`), or None: the reference device unless a binary or
                template is given.

        Raises:
            RunConfigError: the binary is missing or not executable, the template uses an unknown or
                unavailable placeholder, a fault is asked of another device than the reference one or is
                unknown, the kind is unknown or given with --binary/--cmd, or torch_npu is not installed.
        """
        if kind is not None and kind not in DEVICE_KINDS:
            raise RunConfigError(
                f"unknown device '{kind}'{suggest(kind, DEVICE_KINDS)}; known devices: {', '.join(DEVICE_KINDS)}"
            )
        if kind is not None and (binary is not None or cmd is not None):
            given = "--binary" if binary is not None else "--cmd"
            raise RunConfigError(
                f"--device {kind} cannot be used with {given}: --binary/--cmd run an external binary, "
                "--device runs a built-in one; give one of them"
            )
        if kind == "torch_npu":
            if fault is not None:
                raise RunConfigError(
                    "--fault plants a fault in the reference device; it cannot be used with --device torch_npu"
                )
            _check_torch_npu()
            return cls(torch_npu=True)
        resolved = _resolve_binary(binary) if binary is not None else None
        if cmd is not None:
            _check_template(cmd, has_binary=resolved is not None)
        if fault is not None:
            if resolved is not None or cmd is not None:
                raise RunConfigError(
                    "--fault plants a fault in the reference device; it cannot be used with --binary or --cmd"
                )
            faults = reference_faults()
            if fault not in faults:
                known = ", ".join(sorted(faults)) or "none"
                raise RunConfigError(f"unknown fault '{fault}'{suggest(fault, faults)}; known faults: {known}")
        return cls(
            binary=resolved,
            cmd=cmd,
            fault=fault,
            binary_sha256=sha256_file(resolved) if resolved is not None else None,
        )

    @property
    def is_reference(self) -> bool:
        return self.binary is None and self.cmd is None and not self.torch_npu

    @property
    def kind(self) -> str:
        """How records name the kind of device: "reference", "torch_npu" or "binary"."""
        if self.torch_npu:
            return "torch_npu"
        return "reference" if self.is_reference else "binary"

    @property
    def name(self) -> str:
        """How records and output name the device."""
        if self.torch_npu:
            return TORCH_NPU_DEVICE
        if self.is_reference:
            return REFERENCE_DEVICE + (f" with fault '{self.fault}'" if self.fault else "")
        if self.binary is not None:
            return str(self.binary)
        return shlex.split(self.cmd or "")[0]

    def argv(self, case_dir: Path, output_dir: Path, device_id: int) -> list[str]:
        """Return the command line for one run (the reference device: the equivalent `bsa emulate` call)."""
        manifest = str(case_dir / MANIFEST)
        if self.torch_npu:
            return [sys.executable, "-m", TORCH_NPU_MODULE, manifest, str(output_dir)]
        if self.is_reference:
            argv = ["bsa", "emulate", manifest, str(output_dir)]
            return argv + (["--fault", self.fault] if self.fault else [])
        if self.cmd is None:
            return [str(self.binary), manifest, str(output_dir)]
        values = {
            "binary": str(self.binary) if self.binary is not None else "",
            "case_dir": str(case_dir),
            "manifest": manifest,
            "output_dir": str(output_dir),
            "device_id": str(device_id),
        }
        return [token.format(**values) for token in shlex.split(self.cmd)]


def _check_torch_npu() -> None:
    """Check that this Python finds torch and torch_npu, without importing them (the child imports them).

    Raises:
        RunConfigError: naming the module that is missing and what to install.
    """
    for module in ("torch", "torch_npu"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise RunConfigError(
                f"--device torch_npu: the module {module} is not installed for {sys.executable}; install "
                "torch and the torch_npu release that matches it and your CANN toolkit (README.md, "
                "'On an Ascend host'), or run the C++ harness with --binary"
            )


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


def reference_faults() -> dict[str, str]:
    """Return the faults the reference device can plant (name: description)."""
    return dict(_emulator().ALL_FAULTS)


def _emulator() -> Any:
    try:
        from . import emulator
    except ImportError as exc:  # pragma: no cover - the module ships with bsa
        raise RunConfigError(f"the reference device (bsa_cli.emulator) is not available: {exc}") from None
    return emulator


@dataclass(frozen=True)
class RunOptions:
    """How `run_cases` runs: the device, the device ids, repeats, environment and time limit."""

    device: Device = field(default_factory=Device)
    device_ids: tuple[int, ...] = (0,)
    repeat: int = 1
    timeout: float | None = None  # seconds per run of an external binary or torch_npu child; None: no limit
    outputs_root: Path | None = None  # None: <case_dir>/outputs; else <outputs_root>/<case name>
    seed: int | None = None
    """Seeds the reference device's dK/dV accumulation order, run by run (`order_seed`); None: a fresh one."""
    deterministic: bool = False
    """Ask the device for the operator's deterministic mode (all outputs bitwise reproducible): the C++ harness
    sets ACL_OPT_DETERMINISTIC, the torch_npu child torch.use_deterministic_algorithms(True), the reference
    device sums dK/dV in one fixed order; with --repeat every output must then be bitwise identical."""

    def __post_init__(self) -> None:
        if self.seed is None:
            object.__setattr__(self, "seed", secrets.randbits(32))
        if self.repeat < 1:
            raise RunConfigError(f"--repeat {self.repeat}: give 1 or more runs per case")
        if not self.device_ids:
            raise RunConfigError("--devices is empty; give device ids such as 0 or 0,1")
        if len(set(self.device_ids)) != len(self.device_ids):
            raise RunConfigError(f"--devices {','.join(map(str, self.device_ids))}: a device id is repeated")
        if self.timeout is not None and self.timeout <= 0:
            raise RunConfigError(f"--timeout {self.timeout}: give a positive number of seconds")

    def env(self, device_id: int) -> dict[str, str]:
        """Return the variables bsa sets for a run on `device_id`."""
        return {"ASCEND_DEVICE_ID": str(device_id), **({DETERMINISTIC_ENV: "1"} if self.deterministic else {})}



def parse_device_ids(text: str) -> tuple[int, ...]:
    """Parse `--devices 0,1,3` (a range `0-3` is accepted too).

    Raises:
        RunConfigError: a part is not a non-negative integer or range.
    """
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if low > high or low < 0:
                    raise ValueError
                ids.extend(range(low, high + 1))
            else:
                value = int(part)
                if value < 0:
                    raise ValueError
                ids.append(value)
        except ValueError:
            raise RunConfigError(f"--devices {text!r}: '{part}' is not a device id; write ids like 0,1,2") from None
    return tuple(ids)
