"""Device binaries and runs: `fake_device` (tests/bin/fake_device.py as an executable), run options and
the records a run writes, and the stand-in torch_npu's environment."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from bsa_cli import devices
from bsa_cli.devices import record
from tests.helpers.paths import FAKE_DEVICE, STANDIN, STANDIN_FAULT


def fake_device(tmp_path: Path) -> Path:
    """Copy the fake device binary into tmp_path and make it executable."""
    binary = tmp_path / "fake_device.py"
    shutil.copy(FAKE_DEVICE, binary)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


def read_record(result: devices.RunResult) -> dict:
    """Return the run record the runner wrote for `result`."""
    return json.loads((result.output_dir / record.RUN_RECORD).read_text())


def run_options(binary: Path | None = None, **kwargs) -> devices.RunOptions:
    """Return RunOptions for `binary` (or `cmd=`; neither: the reference device) and any other option."""
    cmd = kwargs.pop("cmd", None)
    return devices.RunOptions(device=devices.create(binary=binary, cmd=cmd), **kwargs)


def run_record(case_dir: Path) -> dict:
    """Return the run.json a run wrote into `case_dir`/outputs."""
    return json.loads((case_dir / "outputs" / "run.json").read_text())


def standin_env(patch: pytest.MonkeyPatch) -> None:
    """Make torch_npu importable here (bsa's check) and in the device's child processes."""
    patch.syspath_prepend(str(STANDIN))
    patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])))
    patch.delenv(STANDIN_FAULT, raising=False)
