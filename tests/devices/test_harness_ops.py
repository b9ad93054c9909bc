"""The C++ harness on forward, chain and autograd folders, built against the fake ACL (tests/fake_acl).

The fake's forward makes the forward's checks in the operator's order and computes a CPU forward (float,
dense over each row's selected columns), so the harness's forward and chain run end to end on generated
case folders: the tensors it passes (nulls, the int8 mask), the NaN prefill of out and lse, the chain's
backward on the forward's own device outputs, the statuses of negative forward cases, and every acl
resource freed. Skipped only when no C++ compiler is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from bsa_cli import golden, store
from bsa_cli.core.case import numpy_dtype
from tests.helpers import REPO, TESTS, invoke

SOURCES = [REPO / "harness" / "bsa_grad_harness.cpp", TESTS / "fake_acl" / "fake_acl_runtime.cpp"]
FAKE_ACL = TESTS / "fake_acl"
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler installed")

REPORT = re.compile(r"fake_acl report: (.*)")

DEFAULTS = {"head_dim": 64, "block_shape": [128, 128], "num_heads": 2, "num_kv_heads": 1, "seed": 3, "dtype": "fp16"}
SPEC = {
    "defaults": DEFAULTS,
    "cases": [
        {
            "name": "hf-bnsd",
            "q_seq_len": 300,
            "kv_seq_len": 384,
            "sparsity": {"pattern": "random", "density": 0.5},
            "ops": ["forward", "chain", "autograd"],
        },
        {
            "name": "hf-tnd",
            "layout": "TND",
            "dtype": "bf16",
            "actual_seq_lengths": [100, 200],
            "actual_seq_lengths_kv": [256, 130],
            "ops": ["forward", "chain"],
        },
        {
            "name": "hf-flag0",
            "q_seq_len": 256,
            "kv_seq_len": 256,
            "softmax_lse_flag": 0,
            "inner_precise": 1,
            "ops": ["forward"],
        },
        {
            "name": "hf-int8-chain",
            "q_seq_len": 256,
            "kv_seq_len": 256,
            "ops": ["chain"],
            "tensors": {"block_sparse_mask": {"dtype": "int8"}},
            "expect": "ACLNN_ERR_PARAM_INVALID",
        },
    ],
}


def build(directory: Path, *defines: str) -> Path:
    binary = directory / "bsa_grad_harness"
    flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{FAKE_ACL}", f"-I{FAKE_ACL / 'aclnnop'}"]
    command = [CXX, *flags, *(f"-D{d}" for d in defines), *map(str, SOURCES), "-o", str(binary)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return binary


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("harness-ops"))


def generate(root: Path, spec: dict) -> Path:
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = invoke("gen", path, "-o", root / "out")
    assert result.exit_code == 0, result.output
    return root / "out"


@pytest.fixture(scope="module")
def ran(tmp_path_factory, harness) -> Path:
    """The folders of SPEC, run once through `bsa run --binary`."""
    out = generate(tmp_path_factory.mktemp("harness-ops-cases"), SPEC)
    result = invoke("run", out, "--binary", harness)
    assert result.exit_code == 0, result.output
    return out


def leaks(stderr: str) -> dict[str, int]:
    match = REPORT.search(stderr)
    assert match, f"no fake_acl report in: {stderr}"
    counts = dict(item.split("=") for item in match.group(1).split())
    return {name: int(count) for name, count in counts.items() if int(count) != 0}


def record(case_dir: Path) -> dict:
    return json.loads((case_dir / "outputs" / "run.json").read_text())


def output(case_dir: Path, name: str) -> np.ndarray:
    entry = store.load_manifest(case_dir).entry("outputs", name)
    data = np.fromfile(case_dir / "outputs" / entry["file"], dtype=numpy_dtype(entry["dtype"]))
    return data.reshape(entry["shape"])


def run_harness(harness: Path, case_dir: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    command = [str(harness), *args, str(case_dir / "case.json"), str(out)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=60)


# ---- forward and chain -----------------------------------------------------------------------------------


def test_bsa_run_drives_the_forward_and_the_chain_and_skips_autograd(ran):
    outcomes = {case.name: (record(case)["outcome"], record(case)["status"]) for case in sorted(ran.iterdir())}

    assert outcomes == {
        "hf-bnsd@autograd": ("skipped", None),
        "hf-bnsd@chain": ("ok", 0),
        "hf-bnsd@forward": ("ok", 0),
        "hf-flag0@forward": ("ok", 0),
        "hf-int8-chain@chain": ("ok", 161002),
        "hf-tnd@chain": ("ok", 0),
        "hf-tnd@forward": ("ok", 0),
    }
    assert "run it with --device torch_npu" in record(ran / "hf-bnsd@autograd")["skipped"]
    for case in ran.iterdir():
        if record(case)["outcome"] == "ok":
            assert leaks((case / "outputs" / "stderr.log").read_text()) == {}, case.name
            assert record(case)["device"]["prefilled_outputs"] == "nan"


@pytest.mark.parametrize("name", ["hf-bnsd@forward", "hf-tnd@forward"])
def test_the_forward_writes_the_rows_it_computes_and_leaves_the_nan_prefill_elsewhere(ran, name):
    case_dir = ran / name
    manifest = store.load_manifest(case_dir)
    gold_out = store.read_array(case_dir, manifest.entry("golden", "out")).astype(np.float64)
    gold_lse = store.read_array(case_dir, manifest.entry("golden", "lse")).astype(np.float64)
    mask = store.read_array(case_dir, manifest.entry("inputs", "block_sparse_mask"))
    written = golden.written_rows(manifest.case, mask)
    out, lse = output(case_dir, "out"), output(case_dir, "lse").reshape(written.shape)
    nan_bits = {"float16": 0x7E00, "bfloat16": 0x7FC0}[manifest.case.dtype]

    assert 0 < written.sum()
    np.testing.assert_allclose(out.astype(np.float64)[written], gold_out[written], atol=1e-2, rtol=1e-2)
    np.testing.assert_allclose(lse[written], gold_lse.reshape(written.shape)[written], atol=1e-4, rtol=1e-4)
    assert (out.view(np.uint16)[~written] == nan_bits).all()
    assert (lse.view(np.uint32)[~written] == 0x7FC00000).all()
    assert "fake forward: actualSeqLengths" in (case_dir / "outputs" / "stdout.log").read_text()


def test_with_softmax_lse_flag_0_lse_keeps_the_prefill(ran):
    lse = output(ran / "hf-flag0@forward", "lse")

    assert (lse.view(np.uint32) == 0x7FC00000).all()
    assert np.isfinite(output(ran / "hf-flag0@forward", "out").astype(np.float32)).any()


def test_the_chain_hands_the_forwards_device_outputs_to_the_backward(ran):
    chain, forward = ran / "hf-bnsd@chain", ran / "hf-bnsd@forward"
    stdout = (chain / "outputs" / "stdout.log").read_text()

    assert output(chain, "out").tobytes() == output(forward, "out").tobytes()
    assert output(chain, "lse").tobytes() == output(forward, "lse").tobytes()
    # The toy backward copies query/key/value into dq/dk/dv: each reached its place.
    for grad, source in (("dq", "query"), ("dk", "key"), ("dv", "value")):
        assert (chain / "outputs" / f"{grad}.bin").read_bytes() == (chain / "inputs" / f"{source}.bin").read_bytes()
    assert "chain: forward mask int8, backward mask uint8" in stdout
    # BNSD without lengths: [S] * B for both calls.
    assert "fake forward: actualSeqLengths [300] actualSeqLengthsKv [384]" in stdout
    assert "fake op: actualSeqLengths [300] actualSeqLengthsKv [384]" in stdout


def test_the_chain_calls_each_step_at_its_own_scale(harness, tmp_path):
    """`step_scales` (case.txt `forward_scale`, `backward_scale`): each call gets its own; without them both
    get `scale`."""
    spec = {"defaults": {**DEFAULTS, "q_seq_len": 128, "ops": ["chain"]}, "cases": [
        {"name": "hf-scales", "step_scales": {"forward": 1.0}},
        {"name": "hf-one-scale"},
    ]}  # fmt: skip
    out = generate(tmp_path, spec)
    for name, forward in (("hf-scales", "1"), ("hf-one-scale", "0.125")):
        done = run_harness(harness, out / f"{name}@chain", tmp_path / name)
        assert done.returncode == 0, done.stderr
        assert f"fake forward: scaleValue {forward}\n" in done.stdout
        assert "fake op: scaleValue 0.125\n" in done.stdout


def test_an_int8_mask_into_the_chains_backward_is_refused_after_the_forward_wrote(ran):
    outputs = ran / "hf-int8-chain@chain" / "outputs"

    assert (outputs / "status.txt").read_text().splitlines() == [
        "161002",
        "aclnnBlockSparseAttentionGradGetWorkspaceSize: fake: blockSparseMask dtype must be bool or uint8",
    ]
    assert (outputs / "out.bin").exists() and (outputs / "lse.bin").exists() and not (outputs / "dq.bin").exists()


def test_the_negative_forward_suite_gets_every_expected_status_through_the_harness(harness, tmp_path):
    """cases/negative-forward.yaml (one forward rule per case) and cases/chain.yaml: gen works out each
    status from bsa's forward rules, the fake from its own reading of the operator; the harness must hand
    every tensor, null and value over as the case says."""
    out = tmp_path / "out"
    gen = invoke("gen", REPO / "cases" / "negative-forward.yaml", REPO / "cases" / "chain.yaml", "-o", out)
    assert gen.exit_code == 0, gen.output
    result = invoke("run", out, "--binary", harness)
    assert result.exit_code == 0, result.output
    ran_folders = [
        case for case in sorted(out.iterdir()) if (case / "outputs" / "run.json").exists()
    ]  # gen's skips never run

    mismatched = {
        case.name: (record(case)["status"], record(case)["expect"]["status"], record(case)["status_message"])
        for case in ran_folders
        if record(case)["outcome"] != "skipped" and record(case)["status"] != record(case)["expect"]["status"]
    }

    assert mismatched == {}
    negatives = [case for case in ran_folders if case.name.startswith("fwd-")]
    assert len(negatives) >= 20 and all(record(case)["status"] != 0 for case in negatives)


# ---- what it cannot run, and failing acl calls -------------------------------------------------------------


def test_an_autograd_folder_run_by_hand_exits_5_cannot_run(harness, ran, tmp_path):
    result = run_harness(harness, ran / "hf-bnsd@autograd", tmp_path / "o")

    assert result.returncode == 5
    assert result.stderr.splitlines()[0].startswith("cannot run: autograd is the chain through torch_npu's autograd")
    assert not (tmp_path / "o" / "status.txt").exists() and leaks(result.stderr) == {}


def test_a_harness_built_without_the_forward_cannot_run_forward_folders(ran, tmp_path):
    binary = build(tmp_path, "BSA_NO_FORWARD")

    result = run_harness(binary, ran / "hf-bnsd@forward", tmp_path / "o")

    assert result.returncode == 5
    assert result.stderr.startswith("cannot run: this harness was built without aclnn_block_sparse_attention.h")


def test_fill_none_claims_no_prefill(harness, ran, tmp_path):
    result = run_harness(harness, ran / "hf-bnsd@forward", tmp_path / "o", "--fill", "none")

    assert result.returncode == 0, result.stderr
    assert "bsa-prefilled-outputs" not in result.stdout


@pytest.mark.parametrize(
    "fail",
    [
        "aclrtMalloc:3",  # the mask
        "aclrtMemcpy:5",  # the out prefill
        "aclCreateTensor:6",  # lse
        "aclCreateIntArray:1",
        "aclrtMalloc:7",  # the forward's workspace
        "aclrtSynchronizeStream:1",  # after the forward
        "aclrtMemcpy:13",  # the backward's mask
        "aclrtSynchronizeStream:2",  # after the backward
    ],
)
def test_a_failing_acl_call_in_a_chain_frees_everything_and_records_no_status(harness, ran, tmp_path, fail):
    result = run_harness(harness, ran / "hf-bnsd@chain", tmp_path / "o", FAKE_ACL_FAIL=fail)

    assert result.returncode == 3, result.stdout + result.stderr
    assert leaks(result.stderr) == {}
    assert not (tmp_path / "o" / "status.txt").exists()


def test_a_forced_forward_refusal_is_recorded_and_frees_everything(harness, ran, tmp_path):
    result = run_harness(
        harness, ran / "hf-tnd@chain", tmp_path / "o", FAKE_ACL_FAIL="aclnnBlockSparseAttentionGetWorkspaceSize"
    )

    assert result.returncode == 0 and leaks(result.stderr) == {}
    assert (tmp_path / "o" / "status.txt").read_text().startswith("161002\n")
    assert not (tmp_path / "o" / "out.bin").exists()
