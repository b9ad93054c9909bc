"""The Ascend C++ harness compiles against declaration-only acl headers, and follows the binary contract.

CI has no CANN: tests/fake_acl/ declares the few acl/aclnn functions the harness uses (with the real
signatures), so a type or syntax error in harness/ fails here. Linked with the fake host runtime in
tests/fake_acl/fake_acl_runtime.cpp (a toy operator: dq/dk/dv = copies of query/key/value) the harness
also runs end to end: case.txt parsing, tensors, status.txt, outputs, and every acl resource freed on
every path. Skipped only when no C++ compiler is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from tests.helpers import REPO, TESTS

HARNESS = REPO / "harness"
SOURCE = HARNESS / "bsa_grad_harness.cpp"
FAKE_ACL = TESTS / "fake_acl"
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler installed")

REPORT = re.compile(r"fake_acl report: (.*)")

SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 3},
    "cases": [
        {"name": "h-bnsd", "dtype": "fp16", "q_seq_len": 40, "kv_seq_len": 24},
        {
            "name": "h-tnd",
            "layout": "TND",
            "dtype": "bf16",
            "actual_seq_lengths": [16, 0, 24],
            "seq_lengths_encoding": "cumulative",
            "num_kv_heads": 1,
        },
        {"name": "h-neg-dtype", "dtype": "float32", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
        {
            "name": "h-neg-tnd-lengths",
            "layout": "TND",
            "dtype": "fp16",
            "q_seq_len": 16,
            "expect": "ACLNN_ERR_PARAM_INVALID",
        },
    ],
}


def compile_flags() -> list[str]:
    return ["-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{FAKE_ACL}", f"-I{FAKE_ACL / 'aclnnop'}"]


def test_harness_compiles_against_the_declaration_only_headers():
    result = subprocess.run(
        [CXX, *compile_flags(), "-Wpedantic", "-fsyntax-only", str(SOURCE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    """Build the harness with the fake runtime: through harness/CMakeLists.txt when cmake is there."""
    build = tmp_path_factory.mktemp("harness-build")
    cmake = shutil.which("cmake")
    if cmake:
        configure = [cmake, "-S", str(HARNESS), "-B", str(build), f"-DBSA_FAKE_ACL={FAKE_ACL}"]
        configure += ["-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_CXX_FLAGS=-Werror", f"-DCMAKE_CXX_COMPILER={CXX}"]
        for command in (configure, [cmake, "--build", str(build), "-j", "2"]):
            result = subprocess.run(command, capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr
        return build / "bsa_grad_harness"
    binary = build / "bsa_grad_harness"
    sources = [str(SOURCE), str(FAKE_ACL / "fake_acl_runtime.cpp")]
    result = subprocess.run([CXX, *compile_flags(), "-O0", *sources, "-o", str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return binary


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("harness-cases")
    spec = root / "harness.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(root / "out")])
    assert result.exit_code == 0, result.output
    return root / "out"


def leaks(stderr: str) -> dict[str, int]:
    """Return the fake runtime's count of live acl resources at exit (all zero when nothing leaked)."""
    match = REPORT.search(stderr)
    assert match, f"no fake_acl report in: {stderr}"
    counts = dict(item.split("=") for item in match.group(1).split())
    return {name: int(count) for name, count in counts.items() if int(count) != 0}


def run_harness(harness: Path, case_dir: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    command = [str(harness), *args, str(case_dir / "case.json"), str(out)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=30)


def test_cmake_build_of_the_harness(harness):
    assert harness.is_file() and os.access(harness, os.X_OK)


def test_bsa_run_drives_the_harness_over_valid_and_negative_cases(harness, cases, tmp_path):
    result = CliRunner().invoke(main, ["run", str(cases), "--binary", str(harness), "--devices", "0,1"])

    assert result.exit_code == 0, result.output
    statuses = {}
    for case_dir in sorted(cases.iterdir()):
        record = json.loads((case_dir / "outputs" / "run.json").read_text())
        assert record["outcome"] == "ok", record["problems"]
        assert leaks((case_dir / "outputs" / "stderr.log").read_text()) == {}
        statuses[case_dir.name] = record["status"]
        if record["status"] == 0:
            # The toy operator copies query/key/value: the harness wired each buffer to the right tensor
            # and wrote each gradient where the manifest says.
            for grad, source in (("dq", "query"), ("dk", "key"), ("dv", "value")):
                written = (case_dir / "outputs" / f"{grad}.bin").read_bytes()
                assert written == (case_dir / "inputs" / f"{source}.bin").read_bytes(), grad
        else:
            assert not (case_dir / "outputs" / "dq.bin").exists()
    assert statuses == {"h-bnsd": 0, "h-tnd": 0, "h-neg-dtype": 161002, "h-neg-tnd-lengths": 161002}
    message = (cases / "h-neg-dtype" / "outputs" / "status.txt").read_text().splitlines()[1]
    assert message == "aclnnBlockSparseAttentionGradGetWorkspaceSize: fake: query dtype must be float16 or bfloat16"


def test_bnsd_without_lengths_passes_s_for_every_batch(harness, cases, tmp_path):
    result = run_harness(harness, cases / "h-bnsd", tmp_path / "o")
    assert result.returncode == 0, result.stderr
    assert "fake op: actualSeqLengths [40] actualSeqLengthsKv [24]" in result.stdout
    tnd = run_harness(harness, cases / "h-tnd", tmp_path / "p")
    assert "fake op: actualSeqLengths [16,16,40] actualSeqLengthsKv [16,16,40]" in tnd.stdout  # cumulative


def test_the_negative_suite_through_the_harness_gets_every_expected_status(harness, tmp_path):
    """Null tensors, other dtypes and shapes, an attenMask: the harness passes each as the case says.

    The fake operator checks in master's order, written apart from bsa_cli/ops/interface.py.
    """
    out = tmp_path / "neg"
    gen = CliRunner().invoke(main, ["gen", str(REPO / "cases" / "negative.yaml"), "-o", str(out)])
    assert gen.exit_code == 0, gen.output
    run = CliRunner().invoke(main, ["run", str(out), "--binary", str(harness)])
    assert run.exit_code == 0, run.output
    mismatched = {}
    for case_dir in sorted(out.iterdir()):
        record = json.loads((case_dir / "outputs" / "run.json").read_text())
        if record["status"] != record["expect"]["status"]:
            mismatched[case_dir.name] = (record["status"], record["expect"]["status"], record["status_message"])
    assert mismatched == {}
    assert CliRunner().invoke(main, ["compare", str(out)]).exit_code == 0


def test_harness_passes_lengths_layout_and_device(harness, cases, tmp_path):
    result = run_harness(harness, cases / "h-tnd", tmp_path / "o", ASCEND_DEVICE_ID="5")
    assert result.returncode == 0, result.stderr
    assert "case h-tnd on device 5" in result.stdout
    assert (tmp_path / "o" / "status.txt").read_text() == "0\n"
    override = run_harness(harness, cases / "h-tnd", tmp_path / "p", "--device", "2", ASCEND_DEVICE_ID="5")
    assert "on device 2" in override.stdout


@pytest.mark.parametrize(
    ("fail", "exit_code"),
    [
        ("aclInit", 3),
        ("aclrtSetDevice", 3),
        ("aclrtCreateStream", 3),
        ("aclrtMalloc:1", 3),
        ("aclrtMalloc:6", 3),
        ("aclrtMalloc:11", 3),  # the workspace
        ("aclrtMemcpy:4", 3),
        ("aclCreateTensor:9", 3),
        ("aclrtMemset:2", 3),
        ("aclCreateIntArray:2", 3),
        ("aclrtSynchronizeStream", 3),
        ("aclrtMemcpy:9", 3),  # copying dk back
    ],
)
def test_a_failing_acl_call_frees_everything_and_records_no_status(harness, cases, tmp_path, fail, exit_code):
    out = tmp_path / "o"
    result = run_harness(harness, cases / "h-tnd", out, FAKE_ACL_FAIL=fail)

    assert result.returncode == exit_code, result.stderr
    assert f"fake failure of {fail.split(':')[0]}" in result.stderr or "failed" in result.stderr
    assert leaks(result.stderr) == {}
    assert not (out / "status.txt").exists(), "a status means the op ran; a runtime failure must not write one"


def test_a_failing_second_phase_records_its_status_without_gradients(harness, cases, tmp_path):
    out = tmp_path / "o"
    result = run_harness(harness, cases / "h-bnsd", out, FAKE_ACLNN_RUN_STATUS="561002")

    assert result.returncode == 0, result.stderr
    assert (out / "status.txt").read_text().splitlines() == [
        "561002",
        "aclnnBlockSparseAttentionGrad: fake: forced run status",
    ]
    assert not (out / "dq.bin").exists()
    assert leaks(result.stderr) == {}


def test_bad_arguments_and_case_files_exit_2(harness, cases, tmp_path):
    assert run_harness(harness, tmp_path / "nowhere", tmp_path / "o").returncode == 2
    broken = tmp_path / "broken"
    shutil.copytree(cases / "h-bnsd", broken)
    (broken / "inputs" / "key.bin").write_bytes(b"\0" * 3)
    result = run_harness(harness, broken, tmp_path / "o")
    assert result.returncode == 2
    assert "key.bin: 3 bytes, expected" in result.stderr
    assert leaks(result.stderr) == {}
    assert run_harness(harness, cases / "h-bnsd", tmp_path / "o", "--fill", "pink").returncode == 2


@pytest.mark.parametrize(
    ("section", "name", "file"),
    [
        ("output", "dq", "../../../victim/dq.bin"),
        ("output", "dq", "/VICTIM/dq.bin"),
        ("input", "query", "../../victim/precious.bin"),
        ("input", "query", "linked/precious.bin"),
        ("output", "dk", "linked/dk.bin"),
    ],
)
def test_the_harness_refuses_case_txt_paths_outside_the_case_and_output_folders(
    harness, cases, tmp_path, section, name, file
):
    """case.txt is derived (bsa run rewrites it from case.json), but the harness, run by hand, trusts it no
    more than bsa does: a file that climbs out, is absolute, or passes a link out is refused (exit 2)."""
    case = tmp_path / "case"
    shutil.copytree(cases / "h-bnsd", case)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.bin").write_bytes(b"\1" * (40 * 2 * 16 * 2))
    (victim / "dq.bin").write_text("precious")
    out = tmp_path / "o"
    out.mkdir()
    (case / "linked").symlink_to(victim)
    (out / "linked").symlink_to(victim)
    file = file.replace("/VICTIM", str(victim))
    lines = (case / "case.txt").read_text().splitlines()
    for index, line in enumerate(lines):
        parts = line.split()
        if parts[:2] == [section, name]:
            parts[2] = file
            lines[index] = " ".join(parts)
    (case / "case.txt").write_text("\n".join(lines) + "\n")
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    result = run_harness(harness, case, out)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "case.txt" in result.stderr or "leads out of" in result.stderr, result.stderr
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before
    assert not (out / "dq.bin").exists()


def test_deterministic_mode_sets_acl_opt_deterministic_after_the_device(harness, cases, tmp_path):
    plain = run_harness(harness, cases / "h-tnd", tmp_path / "a")
    assert plain.returncode == 0, plain.stderr
    assert "aclrtCtxSetSysParamOpt" not in plain.stderr + plain.stdout
    for how in ({"BSA_DETERMINISTIC": "1"}, {"args": "--deterministic"}):
        args = (how["args"],) if "args" in how else ()
        env = {k: v for k, v in how.items() if k != "args"}
        result = run_harness(harness, cases / "h-tnd", tmp_path / f"o{len(args)}", *args, **env)
        assert result.returncode == 0, result.stderr
        assert "fake_acl: aclrtCtxSetSysParamOpt(0, 1)" in result.stderr  # ACL_OPT_DETERMINISTIC = 0, value 1
        assert "deterministic mode: aclrtCtxSetSysParamOpt(ACL_OPT_DETERMINISTIC, 1)" in result.stdout
        assert leaks(result.stderr) == {}
    failing = run_harness(
        harness, cases / "h-tnd", tmp_path / "f", "--deterministic", FAKE_ACL_FAIL="aclrtCtxSetSysParamOpt"
    )
    assert failing.returncode == 3 and "aclrtCtxSetSysParamOpt" in failing.stderr
    assert leaks(failing.stderr) == {}


def test_bsa_run_deterministic_reaches_the_harness(harness, cases):
    result = CliRunner().invoke(main, ["run", str(cases / "h-bnsd"), "--binary", str(harness), "--deterministic"])
    assert result.exit_code == 0, result.output
    record = json.loads((cases / "h-bnsd" / "outputs" / "run.json").read_text())
    assert record["deterministic"] is True and record["env"]["BSA_DETERMINISTIC"] == "1"
    assert "aclrtCtxSetSysParamOpt(0, 1)" in (cases / "h-bnsd" / "outputs" / "stderr.log").read_text()
