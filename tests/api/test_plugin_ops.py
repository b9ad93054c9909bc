"""The pytest plugin over (case, op) folders (issue 21): ids `NAME` and `NAME[op]`, a case's ops side by side,
`--bsa-ops`, the `bsa_ops` marker, and folders gen skipped.

The op folders are made from a generated backward folder: a copy whose manifest names the op (and, for a
skipped op, holds `skip` and no inputs), enough for what the plugin reads (folder names, `op`, `skip`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from bsa_cli import specs
from bsa_cli.gen import generate

pytest_plugins = ["pytester"]

SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 3, "dtype": "fp16"},
    "cases": [
        {"name": "p-bnsd", "q_seq_len": 40, "kv_seq_len": 24, "sparsity": {"pattern": "causal"}},
        {"name": "p-bnsd-long", "q_seq_len": 32, "kv_seq_len": 32},
    ],
}
Y64 = "the A2/A3 forward refuses block_shape [16, 16]: Y % 128 != 0 (tiling, 561002); the backward accepts it"

TEST_FILE = """
import pytest


@pytest.mark.bsa_ops("forward", "backward", "chain")
def test_every_op(bsa_case):
    assert bsa_case.manifest.op in ("forward", "backward", "chain")
    assert bsa_case.name.startswith("p-bnsd")


def test_unmarked(bsa_case):
    assert bsa_case.manifest.op == "backward"


@pytest.mark.bsa_ops("forward", "chain")
def test_forward_ops(bsa_case):
    assert bsa_case.manifest.op != "backward"


@pytest.mark.bsa_ops("autograd")
def test_autograd(bsa_case):
    raise AssertionError("no autograd folder: never called")
"""


def op_folder(backward: Path, op: str, skip: str | None = None) -> Path:
    """Copy a backward folder as the folder of another op (`NAME@op`), its manifest naming the op."""
    target = backward.parent / f"{backward.name}@{op}"
    shutil.copytree(backward, target)
    path = target / "case.json"
    manifest = json.loads(path.read_text())
    manifest["name"], manifest["op"] = target.name, op
    if skip is not None:
        manifest["skip"] = skip
        for section in ("inputs", "golden", "benchmark", "outputs"):
            manifest[section] = {}
        manifest.pop("benchmark_summary", None)
        shutil.rmtree(target / "inputs")
    path.write_text(json.dumps(manifest, indent=1))
    return target


@pytest.fixture(autouse=True)
def own_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugin-ops")
    spec_file = root / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    out = root / "out"
    generate.generate_suite(specs.load_specs([spec_file]), out)
    op_folder(out / "p-bnsd", "forward")
    op_folder(out / "p-bnsd", "chain", skip=Y64)
    return out


def test_each_op_folder_is_a_test_named_after_its_case_and_op(pytester: pytest.Pytester, suite: Path) -> None:
    pytester.makepyfile(test_mine=TEST_FILE)
    result = pytester.runpytest(f"--bsa-cases={suite}", "-v", "-rs")
    result.stdout.fnmatch_lines(
        [
            "test_mine.py::test_every_op[[]p-bnsd[[]forward[]][]] PASSED*",
            "test_mine.py::test_every_op[[]p-bnsd[]] PASSED*",
            "test_mine.py::test_every_op[[]p-bnsd[[]chain[]][]] SKIPPED*",
            "test_mine.py::test_every_op[[]p-bnsd-long[]] PASSED*",
            "test_mine.py::test_unmarked[[]p-bnsd[]] PASSED*",  # an unmarked test: the backward's folders only
            "test_mine.py::test_unmarked[[]p-bnsd-long[]] PASSED*",
            "test_mine.py::test_forward_ops[[]p-bnsd[[]forward[]][]] PASSED*",
            "test_mine.py::test_forward_ops[[]p-bnsd[[]chain[]][]] SKIPPED*",
            "test_mine.py::test_autograd[[]no-folder[]] SKIPPED*",
        ]
    )
    assert f"test_mine.py:4: p-bnsd@chain: not judged: {Y64}" in result.stdout.str()
    result.assert_outcomes(passed=6, skipped=3)


def test_an_unmarked_test_on_folders_of_other_ops_only_is_skipped_naming_the_marker(
    pytester: pytest.Pytester, suite: Path
) -> None:
    pytester.makepyfile(test_mine=TEST_FILE)
    result = pytester.runpytest(f"--bsa-cases={suite}", "--bsa-ops", "forward", "-rs", "-k", "unmarked")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no case folder of this test's ops *@pytest.mark.bsa_ops('forward'*"])


def test_bsa_ops_keeps_the_folders_of_some_ops(pytester: pytest.Pytester, suite: Path) -> None:
    pytester.makepyfile(test_mine=TEST_FILE)
    result = pytester.runpytest(f"--bsa-cases={suite}", "--bsa-ops", "forward", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "test_mine.py::test_every_op[[]p-bnsd[[]forward[]][]]",
            "test_mine.py::test_forward_ops[[]p-bnsd[[]forward[]][]]",
        ]
    )
    assert "test_every_op[p-bnsd]" not in result.stdout.str()
    result = pytester.runpytest(f"--bsa-cases={suite}", "--bsa-ops", "sideways")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --bsa-ops: sideways: ops are forward, backward, chain, autograd"])
    result = pytester.runpytest(f"--bsa-cases={suite}", "--bsa-ops", "autograd")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --bsa-ops: none of the 4 case folders is of autograd: generate them with `bsa gen --ops autograd`"]
    )
    result = pytester.runpytest("--bsa-ops", "forward")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --bsa-ops needs --bsa-cases OUT"])


def test_a_marker_naming_no_op_is_a_usage_error(pytester: pytest.Pytester, suite: Path) -> None:
    pytester.makepyfile(test_mine="import pytest\n\n@pytest.mark.bsa_ops('fwd')\ndef test_x(bsa_case):\n    pass\n")
    result = pytester.runpytest(f"--bsa-cases={suite}")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*test_mine.py::test_x: @pytest.mark.bsa_ops('fwd'): give one or more of forward*"])


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.bsa_ops(*ops): run this test only on the case folders of these ops*"])


FORWARD_TEST = """
import numpy as np
import pytest

import bsa_cli as bsa
from bsa_cli.core.case import numpy_dtype


@pytest.mark.bsa_ops("forward")
def test_forward(bsa_case):
    assert bsa_case.op == "forward"
    outputs = {
        name: np.fromfile(bsa_case.dir / "outputs" / entry["file"], dtype=numpy_dtype(entry["dtype"])).reshape(
            entry["shape"]
        )
        for name, entry in bsa_case.manifest["outputs"].items()
    }
    bsa.assert_passed(bsa.judge(bsa_case, out=outputs["out"], lse=outputs["lse"], prefilled=True))
"""


def test_a_forward_folder_is_judged_through_the_api(pytester: pytest.Pytester, tmp_path: Path) -> None:
    from tests.helpers import build_case, build_judged_op_folder, make_case

    case = make_case("fwd", head_dim=64, block_shape=(128, 128), q_seq_len=128, kv_seq_len=128)
    build_case(tmp_path, case)
    build_judged_op_folder(tmp_path, case, "forward")
    build_judged_op_folder(tmp_path, dataclasses.replace(case, name="fwd-bad"), "forward", fault="lse-not-written")
    pytester.makepyfile(test_mine=FORWARD_TEST)
    result = pytester.runpytest(f"--bsa-cases={tmp_path}", "-v")
    result.stdout.fnmatch_lines(
        [
            "test_mine.py::test_forward[[]fwd[[]forward[]][]] PASSED*",  # the case of the first folder first
            "test_mine.py::test_forward[[]fwd-bad[[]forward[]][]] FAILED*",
        ]
    )
    result.stdout.fnmatch_lines(["E * AssertionError: fwd-bad@forward: FAIL (double-benchmark): lse *"])
    result.assert_outcomes(passed=1, failed=1)
