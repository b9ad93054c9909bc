"""The torch_npu device (`--device torch_npu`) against the stand-in torch_npu of tests/torch_npu_standin.

The device runs each case in a child process that imports torch and torch_npu; the tests put the
stand-in on that child's PYTHONPATH (and on this process's sys.path, where `bsa` looks for torch_npu
before it starts). The stand-in's own strictness is tested here too, in this process: importing it
patches `torch.Tensor.npu`/`.cpu` and registers the `npu` operator namespace for the rest of the session
(harmless to other tests: unmarked tensors keep torch's `.cpu()`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import yaml

from bsa_cli import devices, store
from bsa_cli.devices import torch_npu
from bsa_cli.devices.torch_npu import NotExpressible, aclnn_status, plan_call
from bsa_cli.devices.torch_npu_ops import to_array, to_tensor
from tests.helpers import REPO, STANDIN, STANDIN_FAULT, invoke, run_record, standin_env, write_case_dir

SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 3, "dtype": "fp16"},
    "cases": [
        {
            "name": "tn-bnsd-bf16",
            "dtype": "bf16",
            "batch": 2,
            "q_seq_len": 40,
            "kv_seq_len": 24,
            "sparsity": {"pattern": "random", "density": 0.6},
        },
        {
            "name": "tn-tnd-gqa",
            "layout": "TND",
            "actual_seq_lengths": [16, 0, 24],
            "num_kv_heads": 1,
            "sparsity": {"pattern": "causal"},
        },
        {"name": "tn-neg-block-zero", "q_seq_len": 16, "block_shape": [0, 16], "expect": "ACLNN_ERR_PARAM_INVALID"},
        {
            "name": "tn-neg-null-lse",
            "q_seq_len": 16,
            "tensors": {"softmax_lse": None},
            "expect": "ACLNN_ERR_PARAM_NULLPTR",
        },
    ],
}


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("specs") / "tiny.yaml"
    path.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def generated(generated_spec) -> Path:
    """SPEC's cases, generated once (shared: tests that write into them take `out`, a copy)."""
    return generated_spec(SPEC)


@pytest.fixture
def out(generated, tmp_path) -> Path:
    """A private copy of the generated cases (runs write into them)."""
    return Path(shutil.copytree(generated, tmp_path / "out"))


@pytest.fixture
def with_standin(monkeypatch) -> None:
    standin_env(monkeypatch)


@pytest.fixture(scope="module")
def standin() -> Any:
    """The stand-in torch_npu, imported into this process."""
    if str(STANDIN) not in sys.path:
        sys.path.insert(0, str(STANDIN))
    module = importlib.import_module("torch_npu")
    assert module.__file__ and Path(module.__file__).is_relative_to(STANDIN)
    return module


@pytest.fixture(scope="module")
def checked(tmp_path_factory, spec_file, generated) -> tuple[Path, Any, dict]:
    """`bsa check` of the small suite on the torch_npu device (once): the cases, the result, the JSON report."""
    out = Path(shutil.copytree(generated, tmp_path_factory.mktemp("checked") / "out"))
    report = out.parent / "report.json"
    with pytest.MonkeyPatch.context() as patch:
        standin_env(patch)
        result = invoke(
            "check", spec_file, "-o", out, "--device", "torch_npu", "--devices", "0,1", "-j", "1", "--json", report
        )
    return out, result, json.loads(report.read_text()) if report.exists() else {}


def options(**kwargs: Any) -> devices.RunOptions:
    return devices.RunOptions(device=devices.create(kind="torch_npu"), **kwargs)


# ---- bsa check / bsa run --device torch_npu ------------------------------------------------------------


def test_check_passes_a_small_suite_through_torch_npu(checked):
    out, result, report = checked

    assert result.exit_code == 0, result.output
    verdicts = {case["name"]: (case["verdict"], case["status"]) for case in report["cases"]}
    assert verdicts == {
        "tn-bnsd-bf16": ("PASS", 0),
        "tn-tnd-gqa": ("PASS", 0),
        "tn-neg-block-zero": ("PASS", 161002),
        "tn-neg-null-lse": ("PASS", 161001),
    }
    assert "device: torch_npu (torch_npu.npu_block_sparse_attention_backward)" in result.stderr
    rec = run_record(out / "tn-tnd-gqa")
    assert rec["device"]["kind"] == "torch_npu" and "torch_npu" in rec["device"]["name"]
    assert rec["binary"] is None and rec["timeout_s"] == 600.0
    assert rec["command"][:3] == [sys.executable, "-m", "bsa_cli.devices.torch_npu"]
    assert rec["command"][3] == str((out / "tn-tnd-gqa" / "case.json").resolve())
    assert "torch_npu 0.0.0+bsa.standin" in (out / "tn-tnd-gqa" / "outputs" / "stdout.log").read_text()


def test_an_aclnn_rejection_is_recorded_as_its_status(checked):
    outputs = checked[0] / "tn-neg-block-zero" / "outputs"

    status = (outputs / "status.txt").read_text().splitlines()

    assert status[0] == "161002"
    assert "call aclnnBlockSparseAttentionGrad failed, error code is 161002" in status[1]
    assert run_record(outputs.parent)["status"] == 161002 and not (outputs / "dq.bin").exists()
    assert (checked[0] / "tn-neg-null-lse" / "outputs" / "status.txt").read_text().startswith("161001\n")


def test_gradients_arrive_bit_for_bit(checked, standin):
    case_dir = checked[0] / "tn-bnsd-bf16"
    manifest = store.load_manifest(case_dir)
    call = plan_call(manifest)
    tensors = [
        to_tensor(torch, store.read_array(case_dir, manifest["inputs"][name]), manifest["inputs"][name]["dtype"])
        for name in torch_npu.CALL_ORDER
    ]

    expected = standin._backward(
        *tensors,
        call.block_shape,
        call.actual_seq_lengths,
        call.actual_seq_lengths_kv,
        call.q_input_layout,
        call.scale_value,
    )

    for name, grad in zip(("dq", "dk", "dv"), expected, strict=True):
        entry = manifest["outputs"][name]
        assert grad.dtype == torch.bfloat16
        assert (case_dir / "outputs" / entry["file"]).read_bytes() == grad.view(torch.int16).numpy().tobytes()


# ---- the runner's paths: crash, hang, errors ---------------------------------------------------------


def test_a_misbehaving_torch_npu_is_recorded(tmp_path, with_standin, monkeypatch):
    faults = {0: "import", 1: "crash", 2: "hang", 3: "error", 4: "wrong-dtype"}
    monkeypatch.setenv(STANDIN_FAULT, ",".join(f"{fault}@{device}" for device, fault in faults.items()))
    cases = {device: write_case_dir(tmp_path / "out", fault) for device, fault in faults.items()}
    # No time limit but for the hang: however slow the machine, only the hang can time out.
    limits = {device: 2.0 if fault == "hang" else None for device, fault in faults.items()}

    def run(device: int) -> devices.RunResult:
        return devices.run_case(cases[device], options(device_ids=tuple(faults), timeout=limits[device]), device)

    with ThreadPoolExecutor(len(faults)) as pool:  # one case per device id, side by side
        results = dict(zip(faults, pool.map(run, faults), strict=True))

    outcomes = {faults[d]: (r.outcome, r.problems[0].split(" (see")[0]) for d, r in results.items()}
    assert outcomes == {
        "import": ("error", "exited with code 2"),
        "crash": ("crashed", "killed by SIGSEGV"),
        "hang": ("timeout", "timed out after 2 s; its process group was killed"),
        "error": ("error", "exited with code 3"),
        "wrong-dtype": ("error", "exited with code 3"),
    }
    assert not any((r.output_dir / "status.txt").exists() for r in results.values())
    stderr = {faults[d]: (r.output_dir / "stderr.log").read_text() for d, r in results.items()}
    assert stderr["import"] == (
        "Error: cannot import torch_npu: libhccl.so: cannot open shared object file: No such file or directory "
        "(stand-in fault); install the torch_npu release that matches torch " + torch.__version__ + ", and "
        "source <CANN>/set_env.sh first\n"
    )
    first = stderr["error"].splitlines()[0]
    assert first.startswith("Error: npu_block_sparse_attention_backward raised RuntimeError: synchronize:")
    assert "error code is 507015" in first and "Traceback" not in stderr["error"]
    assert stderr["wrong-dtype"] == (
        "Error: dq: torch_npu returned torch.float32 [1, 2, 32, 16], the manifest wants torch.float16 [1, 2, 32, 16]\n"
    )
    assert run_record(cases[2])["timeout_s"] == 2.0


def test_missing_torch_npu_is_a_usage_error(out, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != STANDIN])
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("a torch_npu is installed here")

    result = invoke("run", out, "--device", "torch_npu")

    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"Error: --device torch_npu: the module torch_npu is not installed for {sys.executable}; install torch and "
        "the torch_npu release"
    )
    assert "Traceback" not in result.output and not (out / "tn-bnsd-bf16" / "outputs" / "run.json").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--binary", "/bin/true"], "Error: --device torch_npu cannot be used with --binary: "),
        (["--cmd", "x {output_dir}"], "Error: --device torch_npu cannot be used with --cmd: "),
        (
            ["--fault", "nan-row"],
            "Error: --fault plants a fault in the reference device; it cannot be used with --device torch_npu",
        ),
    ],
)
def test_device_torch_npu_conflicts_with_other_devices(out, with_standin, extra, message):
    result = invoke("run", out, "--device", "torch_npu", *extra)

    assert result.exit_code == 2
    assert result.stderr.startswith(message)


def test_device_reference_is_the_default_and_may_be_named(out):
    result = invoke("run", out / "tn-neg-block-zero", "--device", "reference")

    assert result.exit_code == 0, result.output
    assert run_record(out / "tn-neg-block-zero")["device"]["kind"] == "reference"


def test_deterministic_mode_reaches_the_device_through_its_environment():
    assert devices.RunOptions().env(1) == {"ASCEND_DEVICE_ID": "1"}
    assert devices.RunOptions(deterministic=True).env(1) == {"ASCEND_DEVICE_ID": "1", "BSA_DETERMINISTIC": "1"}


def test_bsa_never_imports_torch():
    code = "import sys, bsa_cli.cli, bsa_cli.cli.run, bsa_cli.devices.torch_npu; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# ---- the call the device makes ----------------------------------------------------------------------


def test_bf16_round_trip_is_bit_exact():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every pattern, NaN payloads included
    array = bits.view(ml_dtypes.bfloat16).reshape(256, 256)

    tensor = to_tensor(torch, array, "bfloat16")
    back = to_array(torch, tensor.clone(), "bfloat16", [256, 256], "dq")

    assert tensor.dtype == torch.bfloat16
    assert back.dtype == ml_dtypes.bfloat16 and back.tobytes() == array.tobytes()


def test_to_array_refuses_a_wrong_dtype_or_shape():
    with pytest.raises(torch_npu.DeviceFailure, match=r"dk: torch_npu returned torch.float32 \[2, 3\]"):
        to_array(torch, torch.zeros(2, 3), "float16", [2, 3], "dk")
    with pytest.raises(torch_npu.DeviceFailure, match=r"returned torch.float16 \[3, 2\], the manifest wants"):
        to_array(torch, torch.zeros(3, 2, dtype=torch.float16), "float16", [2, 3], "dk")


def test_plan_call_passes_what_the_harness_passes(generated):
    bnsd = plan_call(store.load_manifest(generated / "tn-bnsd-bf16"))
    tnd = plan_call(store.load_manifest(generated / "tn-tnd-gqa"))
    null_lse = plan_call(store.load_manifest(generated / "tn-neg-null-lse"))

    assert bnsd.keywords() == {
        "block_shape": [16, 16],
        "actual_seq_lengths": [40, 40],  # BNSD without lengths: [S] * B, never None
        "actual_seq_lengths_kv": [24, 24],
        "q_input_layout": "BNSD",
        "kv_input_layout": "BNSD",
        "num_key_value_heads": 2,
        "scale_value": 0.25,
    }
    assert (tnd.actual_seq_lengths, tnd.actual_seq_lengths_kv, tnd.num_key_value_heads) == ([16, 0, 24], [16, 0, 24], 1)
    assert all(type(v) is int for v in bnsd.block_shape + bnsd.actual_seq_lengths)
    assert null_lse.null_inputs == ("softmax_lse",) and bnsd.null_inputs == ()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda m: m["inputs"].update(atten_mask=dict(m["inputs"]["block_sparse_mask"], dtype="bool")),
            "input atten_mask is passed, but the binding always passes a null attenMask",
        ),
        (lambda m: m["params"].update(mask_type=1), "maskType 1: the binding always passes 0"),
        (lambda m: m["params"].update(next_tokens=0), "next_tokens 0: the binding always passes 2147483647"),
        (lambda m: m["params"].update(block_shape=None), "blockShape None: the binding passes [128, 128]"),
        (lambda m: m["params"].update(block_shape=[64]), "blockShape [64]: the binding passes [128, 128]"),
        (
            lambda m: m["outputs"]["dq"].update(dtype="float32"),
            "dq is float32 [2, 2, 40, 16], but the binding allocates it like query (bfloat16 [2, 2, 40, 16])",
        ),
        (lambda m: m["outputs"].pop("dv"), "dv is null: the binding always allocates dq, dk, dv"),
        (
            lambda m: m["params"].update(block_shape=[16.5, 16]),
            "a value the binding takes as int, int list or float is 16.5, not an integer",
        ),
        (lambda m: m["params"].update(null_layouts=["kv"]), "a null kvInputLayout: the binding takes a str"),
    ],
)
def test_plan_call_refuses_what_the_binding_cannot_express(generated, change, reason):
    manifest = store.load_manifest(generated / "tn-bnsd-bf16")
    change(manifest)

    with pytest.raises(NotExpressible) as caught:
        plan_call(manifest)

    assert str(caught.value) == (
        f"case tn-bnsd-bf16: torch_npu.npu_block_sparse_attention_backward cannot express this call: {reason}"
        + ("" if "[128, 128]" not in reason else " for a null or short block_shape")
    )


def test_aclnn_status_is_read_from_torch_npus_messages():
    full = (
        "npu_block_sparse_attention_backward:build/BlockSparseAttentionBackwardKernelNpuOpApi.cpp:99 NPU function "
        "error: call aclnnBlockSparseAttentionGrad failed, error code is 161002\n[ERROR] 2026-08-21-10:00:00.1 "
        "(PID:7, Device:0, RankID:-1) ERR00100 PTA call acl api failed."
    )
    compact = " NPU function error: call aclnnBlockSparseAttentionGrad failed, error code is 561002 ."
    device = "synchronize: NPU function error: AclrtSynchronizeStreamWithTimeout(stream), error code is 507015"

    assert (aclnn_status(full), aclnn_status(compact), aclnn_status(device)) == (161002, 561002, None)


def test_task_queue_2_and_compact_errors_are_switched_off():
    env = {"TASK_QUEUE_ENABLE": "2", "TORCH_NPU_COMPACT_ERROR_OUTPUT": "1", "OTHER": "x"}

    notes = torch_npu.prepare_environment(env)

    assert env == {"TASK_QUEUE_ENABLE": "1", "OTHER": "x"} and len(notes) == 2
    assert torch_npu.prepare_environment({"TASK_QUEUE_ENABLE": "1"}) == []


# ---- the stand-in is as strict as the binding ---------------------------------------------------------


def call_args(standin: Any, **change: Any) -> tuple[list[Any], dict[str, Any]]:
    """A valid BNSD call (B=1, N1=2, N2=1, S=32, D=16, blocks of 16), as torch_npu's own tests make it."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(torch.float16)

    tensors = {
        "d_out": randn(1, 2, 32, 16),
        "query": randn(1, 2, 32, 16),
        "key": randn(1, 1, 32, 16),
        "value": randn(1, 1, 32, 16),
        "attention_out": randn(1, 2, 32, 16),
        "softmax_lse": torch.full((1, 2, 32, 1), 4.0),
        "block_sparse_mask": torch.ones(1, 2, 2, 2, dtype=torch.uint8),
    }
    keywords: dict[str, Any] = {
        "block_shape": [16, 16],
        "actual_seq_lengths": [32],
        "actual_seq_lengths_kv": [32],
        "q_input_layout": "BNSD",
        "kv_input_layout": "BNSD",
        "num_key_value_heads": 1,
        "scale_value": 0.25,
    }
    for key, value in change.items():
        (tensors if key in tensors else keywords)[key] = value
    positional = [t.npu() if isinstance(t, torch.Tensor) else t for t in tensors.values()]
    return positional, keywords


def renamed(keywords: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {new if key == old else key: value for key, value in keywords.items()}


def test_the_standin_takes_the_call_torch_npus_tests_make(standin):
    args, kwargs = call_args(standin)

    dq, dk, dv = standin.npu_block_sparse_attention_backward(*args, **kwargs)

    assert (dq.dtype, list(dq.shape), list(dk.shape), list(dv.shape)) == (
        torch.float16,
        [1, 2, 32, 16],
        [1, 1, 32, 16],
        [1, 1, 32, 16],
    )
    assert dq.cpu().abs().sum() > 0 and not hasattr(dq.cpu(), standin._ON_NPU)
    all_positional = standin.npu_block_sparse_attention_backward(*args, *kwargs.values())
    assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), all_positional, strict=True))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        (lambda a, k: (a, renamed(k, "scale_value", "scale")), "is missing value for argument 'scale_value'"),
        (
            lambda a, k: (a, renamed(k, "kv_input_layout", "kv_layout")),
            "is missing value for argument 'kv_input_layout'",
        ),
        (lambda a, k: (a, {**k, "deterministic": True}), "expected at most 14 argument(s) but received 15"),
        (lambda a, k: ([*a, *k.values(), 1], {}), "expected at most 14 argument(s) but received 15"),
        (
            lambda a, k: ([*a, *list(k.values())[:5], k["scale_value"], k["num_key_value_heads"]], {}),
            "Expected a value of type 'int' for argument 'num_key_value_heads' but instead found type 'float'",
        ),
        (
            lambda a, k: (a, {**k, "block_shape": "16,16"}),
            "Expected a value of type 'Optional[List[int]]' for argument 'block_shape' but instead found type 'str'",
        ),
        (
            lambda a, k: (a, {**k, "actual_seq_lengths": torch.tensor([32])}),
            "for argument 'actual_seq_lengths' but instead found type 'Tensor'",
        ),
        (
            lambda a, k: (a, {**k, "q_input_layout": None}),
            "Expected a value of type 'str' for argument 'q_input_layout' but instead found type 'NoneType'",
        ),
        (
            lambda a, k: (a, {**k, "num_key_value_heads": 1.5}),
            "Expected a value of type 'int' for argument 'num_key_value_heads'",
        ),
    ],
)
def test_the_standin_refuses_wrong_names_order_and_types(standin, how, message):
    args, kwargs = how(*call_args(standin))

    with pytest.raises(RuntimeError) as caught:
        standin.npu_block_sparse_attention_backward(*args, **kwargs)

    assert message in str(caught.value)


def test_the_standin_refuses_tensors_left_on_the_cpu(standin):
    args, kwargs = call_args(standin)
    args[2] = args[2].cpu()

    with pytest.raises(NotImplementedError, match="key is on the CPU"):
        standin.npu_block_sparse_attention_backward(*args, **kwargs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"key": torch.zeros(1, 1, 32, 16, dtype=torch.bfloat16)},
            "query, key, value must have the same dtype, got query=Half, key=BFloat16, value=Half",
        ),
        ({"key": None}, "query, key, value must have the same dtype, got query=Half, key=Undefined, value=Half"),
        ({"query": torch.zeros(1, 2, 32, 256, dtype=torch.float16)}, "head_dim must be <= 128, but got 256"),
        (
            {"q_input_layout": "TND", "kv_input_layout": "TND", "actual_seq_lengths": []},
            "actual_seq_lengths must be specified when q_input_layout is TND",
        ),
        (
            {"q_input_layout": "TND", "kv_input_layout": "TND", "actual_seq_lengths_kv": None},
            "actual_seq_lengths_kv must be specified when kv_input_layout is TND",
        ),
    ],
)
def test_the_standin_makes_the_bindings_own_checks(standin, change, message):
    args, kwargs = call_args(standin, **change)

    with pytest.raises(RuntimeError) as caught:
        standin.npu_block_sparse_attention_backward(*args, **kwargs)

    assert str(caught.value).startswith(message) and "ERR01001 OPS invalid parameter" in str(caught.value)
    assert aclnn_status(str(caught.value)) is None


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"block_shape": [0, 16]}, 161002),
        ({"softmax_lse": None}, 161001),
        ({"block_sparse_mask": torch.ones(1, 2, 2, 2, dtype=torch.int8)}, 161002),
        ({"kv_input_layout": "TND", "actual_seq_lengths_kv": [32]}, 161002),
        (
            {
                "key": torch.zeros(1, 3, 32, 16, dtype=torch.float16),
                "value": torch.zeros(1, 3, 32, 16, dtype=torch.float16),
            },
            561002,
        ),
    ],
)
def test_the_standin_rejects_like_aclnn_in_torch_npus_format(standin, change, status):
    args, kwargs = call_args(standin, **change)

    with pytest.raises(RuntimeError) as caught:
        standin.npu_block_sparse_attention_backward(*args, **kwargs)

    message = str(caught.value)
    assert message.startswith("npu_block_sparse_attention_backward:op_plugin/ops/opapi/")
    assert f"NPU function error: call aclnnBlockSparseAttentionGrad failed, error code is {status}" in message
    assert aclnn_status(message) == status


def test_the_standin_fills_in_a_missing_block_shape_as_the_binding_does(standin):
    one_block = torch.ones(1, 2, 1, 1, dtype=torch.uint8)
    args, kwargs = call_args(standin, block_shape=[128, 128], block_sparse_mask=one_block)
    given = standin.npu_block_sparse_attention_backward(*args, **kwargs)

    filled = [
        standin.npu_block_sparse_attention_backward(*args, **{**kwargs, "block_shape": shape}) for shape in (None, [64])
    ]

    for grads in filled:
        assert all(torch.equal(a, b) for a, b in zip(given, grads, strict=True))


# ---- the suites of the issue ------------------------------------------------------------------------------


@pytest.mark.slow
def test_check_smoke_and_edge_through_torch_npu(tmp_path):
    """The issue's acceptance run, in a fresh `bsa` process with the stand-in on PYTHONPATH.

    Every case passes: the edge suite's BNSD lengths follow the A2/A3 code (computed over all of S), as the
    stand-in does; cases/doc-semantics.yaml, whose golden skips the padding, fails there as on A2/A3.
    """
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])))
    env.pop(STANDIN_FAULT, None)
    command = [
        sys.executable,
        "-m",
        "bsa_cli",
        "check",
        str(REPO / "cases" / "smoke.yaml"),
        str(REPO / "cases" / "edge.yaml"),
        "-o",
        str(tmp_path / "out"),
        "--device",
        "torch_npu",
        "--devices",
        "0,1",
        "--json",
        str(report),
    ]

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)

    cases = json.loads(report.read_text())["cases"]
    failed = {case["name"]: case["message"] for case in cases if case["verdict"] != "PASS"}
    assert failed == {}, failed
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(cases) >= 33


def test_deterministic_repeats_through_the_standin_are_bitwise_identical(out, with_standin):
    result = invoke("run", out, "--device", "torch_npu", "--deterministic", "--repeat", "3", "--filter", "tn-tnd-gqa")
    assert result.exit_code == 0, result.output
    rec = run_record(out / "tn-tnd-gqa")
    assert rec["outcome"] == "ok" and rec["deterministic"] is True and rec["repeat"]["identical"] is True
    assert "torch.use_deterministic_algorithms(True)" in (out / "tn-tnd-gqa" / "outputs" / "stdout.log").read_text()


def test_without_deterministic_mode_the_standin_moves_dk_dv_last_bits(tmp_path, with_standin):
    spec = tmp_path / "noisy.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "cases": [
                    {
                        "name": "noisy",
                        "layout": "TND",
                        "num_heads": 4,
                        "num_kv_heads": 1,
                        "head_dim": 32,
                        "block_shape": [16, 16],
                        "seed": 5,
                        "actual_seq_lengths": [96, 64],
                    }
                ]
            }
        )
    )
    assert invoke("gen", spec, "-o", tmp_path / "out").exit_code == 0
    for flags, noisy in (((), True), (("--deterministic",), False)):
        result = invoke("run", tmp_path / "out", "--device", "torch_npu", "--repeat", "3", *flags)
        assert result.exit_code == 0, result.output
        rec = run_record(tmp_path / "out" / "noisy")
        assert rec["outcome"] == "ok" and rec["deterministic"] is bool(flags)
        assert set(rec["repeat"]["noise"]) <= {"dk", "dv"} and bool(rec["repeat"]["noise"]) is noisy


def test_timed_runs_through_torch_npu_report_the_kernel_time_and_a_slower_one_regresses(out, with_standin, monkeypatch):
    """The stand-in's events read its clock, which each backward call advances by a known time."""
    out = out / "tn-tnd-gqa"
    monkeypatch.setenv("TORCH_NPU_STANDIN_KERNEL_US", "250")
    run = invoke("run", out, "--device", "torch_npu", "--time", "--time-runs", "4", "--warmup", "1")
    assert run.exit_code == 0, run.output
    timing = run_record(out)["timing"]
    assert timing["steps"]["backward"]["times_us"] == [250.0] * 4 and timing["not_timed"] is None
    assert "bsa-timing: backward warmup 1 runs 4" in (out / "outputs" / "stdout.log").read_text()
    report = out.parent / "fast.json"
    assert invoke("compare", out, "--json", report).exit_code == 0

    monkeypatch.setenv("TORCH_NPU_STANDIN_KERNEL_US", "300")  # 20% slower
    assert invoke("run", out, "--device", "torch_npu", "--time", "--time-runs", "4", "--warmup", "1").exit_code == 0
    compared = invoke("compare", out, "--baseline", report)
    assert compared.exit_code == 4, compared.output
    assert "kernel 250.0 us -> 300.0 us (+20.0%" in compared.output
