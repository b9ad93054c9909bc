"""The pytest plugin (bsa_cli/pytest_plugin.py, entry point pytest11): `pytest --bsa-cases OUT`.

Each test runs pytest inside pytest (`pytester`) on a test file that judges the reference device's
outputs for every case of a small generated suite.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

import bsa_cli as bsa
from bsa_cli import specs
from bsa_cli.gen import generate
from tests.helpers import REPO, STANDIN

pytest_plugins = ["pytester"]

EXAMPLE = REPO / "examples" / "test_torch_npu.py"

SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 3, "dtype": "fp16"},
    "cases": [
        {"name": "p-bnsd", "q_seq_len": 40, "kv_seq_len": 24, "sparsity": {"pattern": "causal"}},
        {
            "name": "p-tnd-bf16",
            "layout": "TND",
            "dtype": "bf16",
            "actual_seq_lengths": [16, 24],
            "sparsity": {"pattern": "random", "density": 0.6},
        },
        {"name": "n-dtype", "dtype": "float32", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
    ],
}
NAMES = ["n-dtype", "p-bnsd", "p-tnd-bf16"]

TEST_FILE = """
import bsa_cli as bsa
from bsa_cli.devices import reference
from bsa_cli.store.manifest import call_tensors

FAULT = {fault!r}


def test_backward(bsa_case):
    if bsa_case.expect:
        status, message = reference.check_interface(bsa_case.params, call_tensors(bsa_case.manifest))
        bsa.assert_passed(bsa.judge_status(bsa_case, status, message))
        return
    grads = reference.emulate(bsa_case.geometry, bsa_case.inputs, fault=FAULT)
    bsa.assert_passed(bsa.judge(bsa_case, grads["dq"], grads["dk"], grads["dv"]))
"""


@pytest.fixture(autouse=True)
def own_rootdir(pytester: pytest.Pytester) -> None:
    """Root the inner pytest runs in their own folder, so test ids read test_mine.py::..."""
    pytester.makeini("[pytest]\n")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugin")
    spec_file = root / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    generate.generate_suite(specs.load_specs([spec_file]), root / "out")
    return root / "out"


def test_cases_become_tests_named_after_them_and_reference_outputs_pass(pytester: pytest.Pytester, suite: Path):
    pytester.makepyfile(test_mine=TEST_FILE.format(fault=None))
    result = pytester.runpytest(f"--bsa-cases={suite}", "-v", f"--junitxml={pytester.path / 'junit.xml'}")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"test_mine.py::test_backward[[]{name}[]] PASSED*" for name in NAMES])
    junit = (pytester.path / "junit.xml").read_text()
    assert all(f'name="test_backward[{name}]"' in junit for name in NAMES)


def test_bsa_cases_with_a_space_gives_the_ids_and_classnames_of_bsa_cases_with_an_equals_sign(
    pytester: pytest.Pytester, suite: Path
) -> None:
    """pytest roots a run before it knows a plugin's options: `--bsa-cases OUT` made OUT a test path, and the
    ids `../bsa::test_backward[...]` with an empty JUnit classname."""
    pytester.makepyfile(test_mine=TEST_FILE.format(fault=None))
    runs = {}
    for form, args in (("space", ["--bsa-cases", str(suite)]), ("equals", [f"--bsa-cases={suite}"])):
        junit = pytester.path / f"{form}.xml"
        result = pytester.runpytest(*args, "-v", f"--junitxml={junit}")
        result.assert_outcomes(passed=3)
        cases = ET.parse(junit).getroot().iter("testcase")
        runs[form] = sorted((case.get("classname"), case.get("name")) for case in cases)
        result.stdout.fnmatch_lines([f"test_mine.py::test_backward[[]{name}[]] PASSED*" for name in NAMES])
    assert runs["space"] == runs["equals"] == [("test_mine", f"test_backward[{name}]") for name in NAMES]


def test_a_planted_fault_fails_the_test_with_the_deciding_check(pytester: pytest.Pytester, suite: Path) -> None:
    pytester.makepyfile(test_mine=TEST_FILE.format(fault="dk-no-scale"))
    result = pytester.runpytest(f"--bsa-cases={suite}")
    result.assert_outcomes(passed=1, failed=2)  # the negative case is not computed
    result.stdout.fnmatch_lines(
        [
            "_*_ test_backward[[]p-bnsd[]] _*_",
            "E * AssertionError: p-bnsd: FAIL (double-benchmark): dk worst 16x16 tile RMSE ratio * > 3",
            "E * FAIL dk MERE ratio * > 2 (device *",  # the other failed checks and the report's details follow
            "E * dk worst at b=*",
            "test_mine.py:14: AssertionError",  # the test's line, not bsa's
            "_*_ test_backward[[]p-tnd-bf16[]] _*_",
            "E * AssertionError: p-tnd-bf16: FAIL (double-benchmark): dk *",
        ]
    )


def test_a_filter_selects_cases_and_a_filter_matching_none_is_a_usage_error(pytester: pytest.Pytester, suite: Path):
    pytester.makepyfile(test_mine=TEST_FILE.format(fault=None))
    result = pytester.runpytest(f"--bsa-cases={suite}", "--bsa-filter", "p-*", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        ["test_mine.py::test_backward[[]p-bnsd[]]", "test_mine.py::test_backward[[]p-tnd-bf16[]]"]
    )
    assert "n-dtype" not in result.stdout.str()
    result = pytester.runpytest(f"--bsa-cases={suite}", "--bsa-filter", "zzz*")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --bsa-cases: *--bsa-filter 'zzz[*]' matches none of 3 cases"])
    result = pytester.runpytest(f"--bsa-cases={pytester.path / 'nowhere'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --bsa-cases: */nowhere: no such directory"])
    result = pytester.runpytest("--bsa-filter", "p-*")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --bsa-filter needs --bsa-cases OUT"])


def test_without_bsa_cases_a_test_using_the_fixture_is_skipped(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine=TEST_FILE.format(fault=None) + "\n\ndef test_other():\n    pass\n")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * no cases: run pytest with --bsa-cases OUT (a folder of cases written by *"])


def test_the_plugin_loads_through_its_entry_point_without_numpy_or_torch(tmp_path: Path) -> None:
    probe = tmp_path / "conftest.py"
    probe.write_text(
        "import sys\n\n"
        "def pytest_configure(config):\n"
        "    assert config.pluginmanager.has_plugin('bsa'), 'the bsa entry point is not installed: pip install -e .'\n"
        "    heavy = [m for m in ('numpy', 'torch', 'bsa_cli.api') if m in sys.modules]\n"
        "    assert not heavy, heavy\n"
    )
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---- the torch_npu example, on the stand-in --------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_and_edge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smoke-edge") / "out"
    generate.generate_suite(specs.load_specs([REPO / "cases" / "smoke.yaml", REPO / "cases" / "edge.yaml"]), out)
    return out


@pytest.mark.slow  # generates smoke and edge (36 cases) and runs them all on the CPU: 10-30 s
def test_the_torch_npu_example_passes_smoke_and_edge_on_the_stand_in(
    pytester: pytest.Pytester, smoke_and_edge: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]))
    pytester.path.joinpath(EXAMPLE.name).write_text(EXAMPLE.read_text())
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(f"--bsa-cases={smoke_and_edge}", f"--junitxml={junit}")
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not case.get("name", "").startswith("test_block_sparse_attention_backward["):
            continue  # the example's forward test has no forward folder here
        name = case.get("name", "").removeprefix("test_block_sparse_attention_backward[").removesuffix("]")
        outcomes[name] = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
    assert outcomes == dict.fromkeys(sorted(d.name for d in smoke_and_edge.iterdir()), "passed"), result.stdout.str()


@pytest.mark.slow  # generates smoke and chain with their forward folders and runs the example on them
def test_the_torch_npu_example_judges_forward_folders_on_the_stand_in(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("torch") is None:  # the example runs in a subprocess: no import here
        pytest.skip("torch is not installed")
    out = tmp_path / "out"
    cases = specs.load_specs([REPO / "cases" / "smoke.yaml", REPO / "cases" / "chain.yaml"], ops=("forward",))
    generate.generate_suite(cases, out)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]))
    pytester.path.joinpath(EXAMPLE.name).write_text(EXAMPLE.read_text())
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(f"--bsa-cases={out}", f"--junitxml={junit}")
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.get("name", "").startswith("test_block_sparse_attention_forward["):
            tags = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name", "")] = tags[0] if tags else "passed"
    assert len(outcomes) == len(cases), result.stdout.str()
    assert set(outcomes.values()) <= {"passed", "skipped"}, (outcomes, result.stdout.str())
    assert list(outcomes.values()).count("skipped") == 1  # the Y = 64 case, skipped by gen with why


@pytest.mark.slow  # shares the generated smoke and edge suites
def test_the_example_passes_the_arguments_the_torch_npu_device_passes(smoke_and_edge: Path) -> None:
    from bsa_cli.devices.torch_npu import plan_call

    for case_dir in sorted(smoke_and_edge.iterdir()):
        case = bsa.load_case(case_dir)
        assert case.op_args == plan_call(case.manifest).keywords(), case.name
