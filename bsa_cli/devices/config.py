"""A run's configuration, all checked before any case runs (a bad value is a `RunConfigError`): which device
runs (`create` checks --device, --binary, --cmd and --fault), and how (`RunOptions`: device ids from
--devices, repeats, timeout, where outputs go, the order seed, deterministic mode)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import suggest
from ..store import DETERMINISTIC_ENV
from .base import Device, DeviceKind, RunConfigError
from .binary import BinaryDevice
from .faults import ALL_FAULTS
from .reference import ReferenceDevice
from .repeat import RunJudge
from .timing import Timing

#: Built-in devices `--device` chooses between (an external binary is chosen with --binary or --cmd).
DEVICE_KINDS: dict[DeviceKind, str] = {
    "reference": "the built-in reference device (bsa emulate), in this process: reference results",
    "torch_npu": "torch_npu's npu_block_sparse_attention_backward (and npu_block_sparse_attention for the forward, the "
    "chain and autograd), in a child process per case (an Ascend host)",
    "cann_ops_transformer": "ops-transformer's own PyTorch entry cann_ops_transformer.block_sparse_attention, for "
    "forward folders (the forward alone), in a child process per case (an Ascend host)",
}


def create(
    binary: str | Path | None = None, cmd: str | None = None, fault: str | None = None, kind: str | None = None
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
    if kind in ("torch_npu", "cann_ops_transformer"):
        if fault is not None:
            raise RunConfigError(
                f"--fault plants a fault in the reference device; it cannot be used with --device {kind}"
            )
        if kind == "cann_ops_transformer":
            from .cann_ops_transformer import CannOpsTransformerDevice

            return CannOpsTransformerDevice.create()
        from .torch_npu import TorchNpuDevice

        return TorchNpuDevice.create()
    if binary is None and cmd is None:
        return ReferenceDevice.create(fault)
    device = BinaryDevice.create(binary, cmd)
    if fault is not None:
        raise RunConfigError("--fault plants a fault in the reference device; it cannot be used with --binary or --cmd")
    return device


def reference_faults() -> dict[str, str]:
    """Return the faults the reference device can plant (name: description)."""
    return dict(ALL_FAULTS)


@dataclass(frozen=True)
class RunOptions:
    """How `run_cases` runs: the device, the device ids, repeats, environment and time limit."""

    device: Device = field(default_factory=ReferenceDevice)
    device_ids: tuple[int, ...] = (0,)
    repeat: int = 1
    timeout: float | None = None  # seconds per run of an external binary or torch_npu child; None: no limit
    outputs_root: Path | None = None  # None: <case_dir>/outputs; else <outputs_root>/<case name>
    #: Seeds the reference device's dK/dV accumulation order, run by run (`order_seed`); None: a fresh one.
    seed: int | None = None
    #: Ask the device for the operator's deterministic mode (all outputs bitwise reproducible): the C++ harness
    #: sets ACL_OPT_DETERMINISTIC, the torch_npu child torch.use_deterministic_algorithms(True), the reference
    #: device sums dK/dV in one fixed order; with --repeat every output must then be bitwise identical.
    deterministic: bool = False
    #: Judges each run of a --repeat by the case's standard (`repeat.RunJudge`; `pipeline.run_suite` passes
    #: compare's); None: repeats are compared with each other only.
    judge: RunJudge | None = field(default=None, compare=False)
    #: `bsa run --time`: the device child times its operator calls (`timing.Timing`); None: not timed.
    timing: Timing | None = None

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
        env = {"ASCEND_DEVICE_ID": str(device_id), **({DETERMINISTIC_ENV: "1"} if self.deterministic else {})}
        return {**env, **(self.timing.env() if self.timing is not None else {})}


def parse_device_ids(text: str) -> tuple[int, ...]:
    """Parse `--devices 0,1,3` (a range `0-3` is accepted too).

    Raises:
        RunConfigError: a part is not a non-negative integer or range.
    """
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            low, dash, high = part.partition("-")
            first = int(low)
            last = int(high) if dash else first
            if first < 0 or first > last:
                raise ValueError
            ids.extend(range(first, last + 1))
        except ValueError:
            raise RunConfigError(f"--devices {text!r}: '{part}' is not a device id; write ids like 0,1,2") from None
    return tuple(ids)
