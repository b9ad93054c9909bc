"""scripts/same_bytes.py, which CI runs on the smoke suite from the newest and the oldest NumPy / ml_dtypes."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from bsa_cli.gen.generate import generate_case
from bsa_cli.specs import load_specs
from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("same_bytes", REPO / "scripts" / "same_bytes.py")
assert spec is not None and spec.loader is not None
same_bytes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(same_bytes)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("a")
    for case in load_specs([REPO / "cases" / "smoke.yaml"])[:2]:
        generate_case(case, out)
    return out


def copy(suite: Path, tmp_path: Path) -> Path:
    other = tmp_path / "b"
    shutil.copytree(suite, other)
    return other


def first_case(root: Path) -> Path:
    return sorted(p for p in root.iterdir() if p.is_dir())[0]


def test_the_same_suite_agrees(suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert same_bytes.main([str(suite), str(copy(suite, tmp_path))]) == 0
    assert " 0 differences" in capsys.readouterr().out


def test_one_input_bit_is_a_difference(suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = copy(suite, tmp_path)
    query = first_case(other) / "inputs" / "query.bin"
    data = bytearray(query.read_bytes())
    data[100] ^= 1
    query.write_bytes(bytes(data))
    assert same_bytes.main([str(suite), str(other)]) == 1
    assert f"differs: {first_case(other).name}/inputs/query.bin" in capsys.readouterr().out


def test_gradients_may_differ_by_float32_rounding_only(suite: Path, tmp_path: Path) -> None:
    other = copy(suite, tmp_path)
    dq = first_case(other) / "golden" / "dq.bin"
    values = np.fromfile(dq, dtype="<f4")
    nonzero = np.flatnonzero(values)[0]
    values[nonzero] = np.nextafter(values[nonzero], np.float32(np.inf))
    values.tofile(dq)
    assert same_bytes.main([str(suite), str(other)]) == 0
    values[nonzero] *= 1.01
    values.tofile(dq)
    assert same_bytes.main([str(suite), str(other)]) == 1


def test_a_missing_file_is_a_difference(suite: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = copy(suite, tmp_path)
    (first_case(other) / "inputs" / "key.bin").unlink()
    assert same_bytes.main([str(suite), str(other)]) == 1
    assert "only in" in capsys.readouterr().out
