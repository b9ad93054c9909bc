"""`bsa gen` reproduces the committed golden vectors of the smoke suite (golden/smoke/).

Inputs must match bit for bit (their sha256 in the committed manifests, their arrays committed beside them
so that a change says which elements moved); golden gradients must match the committed float32 arrays to
within float32 rounding (BLAS builds may sum in another order). golden/smoke/PROVENANCE.json names the
library versions of the run that wrote them.
Set BSA_UPDATE_GOLDEN=1 to rewrite golden/smoke/ after an intended change, and say why in the commit.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from bsa_cli.specs import load_specs
from bsa_cli.store import load_manifest, read_array
from tests.helpers import REPO

COMMITTED = REPO / "golden" / "smoke"
SMOKE = load_specs([REPO / "cases" / "smoke.yaml"])
PROVENANCE = COMMITTED / "PROVENANCE.json"


def versions() -> dict[str, str]:
    return {"python": platform.python_version(), "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}


@pytest.fixture(scope="module")
def generated(generated_suite: Callable[[str], Path]) -> Path:
    out = generated_suite("smoke")
    if os.environ.get("BSA_UPDATE_GOLDEN") == "1":
        shutil.rmtree(COMMITTED, ignore_errors=True)
        COMMITTED.mkdir(parents=True)
        PROVENANCE.write_text(json.dumps({"written_by": versions()}, indent=2) + "\n")
        for case in SMOKE:
            target = COMMITTED / case.name
            (target / "golden").mkdir(parents=True)
            shutil.copytree(out / case.name / "inputs", target / "inputs")
            manifest = dict(load_manifest(out / case.name).raw)
            manifest["spec"] = "cases/smoke.yaml"
            (target / "case.json").write_text(json.dumps(manifest, indent=2) + "\n")
            for grad in ("dq", "dk", "dv"):
                shutil.copy(out / case.name / "golden" / f"{grad}.bin", target / "golden" / f"{grad}.bin")
    return out


def test_every_smoke_case_has_committed_vectors() -> None:
    assert sorted(p.name for p in COMMITTED.iterdir() if p.is_dir()) == sorted(c.name for c in SMOKE)


def changed_elements(name: str, tensor: str, pinned: dict, fresh_dir: Path, fresh: dict) -> str:
    """Say how a regenerated input differs from the committed one: elements, first index, the two runs' versions."""
    before = read_array(COMMITTED / name, pinned)
    after = read_array(fresh_dir, fresh)
    written_by = json.loads(PROVENANCE.read_text())["written_by"]
    runs = f"pinned by a run with {written_by}, regenerated with {versions()}"
    if before.shape != after.shape or before.dtype != after.dtype:
        shapes = f"{before.dtype}{list(before.shape)} -> {after.dtype}{list(after.shape)}"
        return f"{name}: input {tensor} changed: {shapes}; {runs}"
    differ = before.view(np.uint8).reshape(before.size, -1) != after.view(np.uint8).reshape(after.size, -1)
    index = np.flatnonzero(differ.any(axis=1))
    first = np.unravel_index(index[0], before.shape) if index.size else ()
    return (
        f"{name}: input {tensor} changed: {index.size} of {before.size} elements differ (first at "
        f"{tuple(int(i) for i in first)}: {before.reshape(-1)[index[0]]} -> {after.reshape(-1)[index[0]]}); {runs}"
        if index.size
        else f"{name}: input {tensor} changed in its bytes, not its elements; {runs}"
    )


@pytest.mark.parametrize("name", [c.name for c in SMOKE])
def test_gen_reproduces_inputs_bit_for_bit(generated: Path, name: str) -> None:
    committed = json.loads((COMMITTED / name / "case.json").read_text())
    fresh = load_manifest(generated / name)
    for tensor, entry in committed["inputs"].items():
        if fresh["inputs"][tensor]["sha256"] != entry["sha256"]:
            pytest.fail(changed_elements(name, tensor, entry, generated / name, fresh["inputs"][tensor]))
    assert fresh["params"] == committed["params"]
    assert fresh["semantics"] == committed["semantics"]


@pytest.mark.parametrize("name", [c.name for c in SMOKE])
def test_gen_reproduces_golden_gradients(generated: Path, name: str) -> None:
    committed = json.loads((COMMITTED / name / "case.json").read_text())
    fresh = load_manifest(generated / name)
    for grad, entry in committed["golden"].items():
        expected = read_array(COMMITTED / name, entry)
        actual = read_array(generated / name, fresh["golden"][grad])
        scale = float(np.abs(expected).max()) or 1.0
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{name} {grad}")
        assert np.array_equal(actual == 0, expected == 0), f"{name} {grad}: zero pattern differs"
