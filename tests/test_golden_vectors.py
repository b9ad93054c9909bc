"""`bsa gen` reproduces the committed golden vectors of the smoke suite (golden/smoke/).

Inputs must match bit for bit (their sha256 in the committed manifests); golden gradients must match the
committed float32 arrays to within float32 rounding (BLAS builds may sum in another order).
Set BSA_UPDATE_GOLDEN=1 to rewrite golden/smoke/ after an intended change, and say why in the commit.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bsa_cli.generate import generate_case
from bsa_cli.spec import load_specs
from bsa_cli.store import load_manifest, read_array

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "golden" / "smoke"
SMOKE = load_specs([ROOT / "cases" / "smoke.yaml"])


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    for case in SMOKE:
        generate_case(case, out)
    if os.environ.get("BSA_UPDATE_GOLDEN") == "1":
        shutil.rmtree(COMMITTED, ignore_errors=True)
        for case in SMOKE:
            target = COMMITTED / case.name
            (target / "golden").mkdir(parents=True)
            manifest = load_manifest(out / case.name)
            manifest["spec"] = "cases/smoke.yaml"
            (target / "case.json").write_text(json.dumps(manifest, indent=2) + "\n")
            for grad in ("dq", "dk", "dv"):
                shutil.copy(out / case.name / "golden" / f"{grad}.bin", target / "golden" / f"{grad}.bin")
    return out


def test_every_smoke_case_has_committed_vectors() -> None:
    assert sorted(p.name for p in COMMITTED.iterdir()) == sorted(c.name for c in SMOKE)


@pytest.mark.parametrize("name", [c.name for c in SMOKE])
def test_gen_reproduces_inputs_bit_for_bit(generated: Path, name: str) -> None:
    committed = json.loads((COMMITTED / name / "case.json").read_text())
    fresh = load_manifest(generated / name)
    for tensor, entry in committed["inputs"].items():
        assert fresh["inputs"][tensor]["sha256"] == entry["sha256"], f"{name}: input {tensor} changed"
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
