"""cases/upstream.yaml: the shapes of the operator's own tests (ops-transformer, op-plugin) as bsa cases.

They pass on the reference device, and a subset passes through the torch_npu stand-in
(tests/torch_npu_standin, on the child's PYTHONPATH as in tests/devices/test_torch_npu.py); the whole suite does
too (2 min here: too slow for the fast loop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from tests.helpers import REPO, STANDIN

SUITE = REPO / "cases" / "upstream.yaml"

STANDIN_SUBSET = (
    "upstream-ot-tiling-bnsd-gqa",  # uint8 mask, squeezed lse, 64x64 blocks, GQA 4/2
    "upstream-opplugin-tnd-mqa",  # TND MQA 8/1, explicit mask
    "upstream-opplugin-tnd-gqa-tail-64x128",  # TND GQA, [64, 128] blocks, odd lengths
    "upstream-opplugin-bnsd-sparse-32x128",  # BNSD [32, 128] blocks, one kv block per query block
    "upstream-atk-fwd-16",  # BNSD N1 = N2 = 3, fp16, inputs in [-5, 5]
)


def names() -> list[str]:
    spec = yaml.safe_load(SUITE.read_text())
    found = []
    for case in spec["cases"]:
        dtypes = (case.get("matrix") or {}).get("dtype")
        found += [f"{case['name']}.{d}" for d in dtypes] if dtypes else [case["name"]]
    return found


def test_the_suite_validates_and_covers_its_sources():
    result = CliRunner().invoke(main, ["validate", str(SUITE)])

    assert result.exit_code == 0, result.output
    assert "34 cases OK" in result.output
    all_names = names()
    assert len([n for n in all_names if n.startswith("upstream-atk-fwd-")]) == 20  # the forward's ATK json
    assert set(STANDIN_SUBSET) <= set(all_names)
    text = SUITE.read_text()
    for commit in ("5778144076def6311557939ab5cbfe8303f13e8f", "7145df39cd61e527efcf53220e167985453817e9"):
        assert commit in text


def test_check_passes_the_suite_on_the_reference_device(tmp_path):
    report = tmp_path / "report.json"

    result = CliRunner().invoke(main, ["check", str(SUITE), "-o", str(tmp_path / "out"), "--json", str(report)])

    assert result.exit_code == 0, result.output
    cases = json.loads(report.read_text())["cases"]
    assert {case["name"]: case["verdict"] for case in cases} == dict.fromkeys(names(), "PASS")


def test_a_subset_passes_through_the_torch_npu_standin(tmp_path):
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])))
    env.pop("BSA_TORCH_NPU_STANDIN_FAULT", None)
    filters = [arg for name in STANDIN_SUBSET for arg in ("--filter", name)]
    command = [
        sys.executable,
        "-m",
        "bsa_cli",
        "check",
        str(SUITE),
        "-o",
        str(tmp_path / "out"),
        "--device",
        "torch_npu",
        "--devices",
        "0,1",
        "--json",
        str(report),
        *filters,
    ]

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-2000:]
    cases = json.loads(report.read_text())["cases"]
    assert {case["name"]: case["verdict"] for case in cases} == dict.fromkeys(STANDIN_SUBSET, "PASS")
    assert all(case["status"] == 0 for case in cases)
