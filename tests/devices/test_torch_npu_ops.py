"""The torch_npu device on forward, chain and autograd folders, against the stand-in torch_npu.

The folders are written by hand as gen writes them (`helpers.build_op_folder`); the device runs each in a
child process that imports the stand-in (tests/torch_npu_standin), whose forward is computed apart from
bsa's golden. The stand-in's own strictness (the binding's schema and checks, its autograd link) is tested
in this process.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bsa_cli import golden, store
from bsa_cli.core.case import numpy_dtype
from bsa_cli.devices import binary, torch_npu, torch_npu_ops
from bsa_cli.devices.base import Attempt, Cancel, Execution
from bsa_cli.devices.torch_npu_ops import CannotRun, NotExpressible, plan_op
from tests.helpers import REPO, STANDIN, build_op_folder, case_factory, invoke, make_inputs, run_record, standin_env

make = case_factory(
    head_dim=64, num_heads=2, num_kv_heads=1, q_seq_len=200, kv_seq_len=256, block_shape=(64, 128), scale=0.125, seed=7
)
"""Cases the A2/A3 forward accepts: D 64, Y 128, GQA, a partial last query block."""

CASES = {
    "fwd": (make("fwd"), "forward", {}),
    "fwd-flag0": (make("fwd-flag0", softmax_lse_flag=0, inner_precise=1), "forward", {}),
    "fwd-tnd": (
        make(
            "fwd-tnd",
            layout="TND",
            actual_seq_lengths=(100, 60),
            actual_seq_lengths_kv=(256, 130),
            batch=2,
            q_seq_len=100,
        ),
        "forward",
        {},
    ),
    "fwd-d32": (make("fwd-d32", head_dim=32), "forward", {}),
    "chain": (make("chain"), "chain", {}),
    "chain-int8": (make("chain-int8"), "chain", {"mask_dtype": "int8"}),
    "auto": (make("auto"), "autograd", {}),
}


def mask_of(case: Any) -> np.ndarray:
    """The mask make_inputs draws for a case, with one query block of head 0 selecting nothing."""
    rng = np.random.default_rng(case.seed + 1)
    mask = (rng.random(case.mask_shape) < 0.7).astype(np.uint8)
    mask[0, 0, 1] = 0
    return mask


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Path:
    """Every folder of CASES, run once through `bsa run --device torch_npu --deterministic`."""
    root = tmp_path_factory.mktemp("ops") / "out"
    for case, op, options in CASES.values():
        build_op_folder(root, case, op, mask_of(case), **options)
    with pytest.MonkeyPatch.context() as patch:
        standin_env(patch)
        result = invoke("run", root, "--device", "torch_npu", "--devices", "0,1", "--deterministic")
    assert result.exit_code == 0, result.output
    return root


def folder(root: Path, name: str) -> Path:
    case, op, _ = CASES[name]
    return root / (case.name if op == "backward" else f"{case.name}@{op}")


def output(root: Path, name: str, tensor: str) -> np.ndarray:
    entry = store.load_manifest(folder(root, name)).entry("outputs", tensor)
    data = np.fromfile(folder(root, name) / "outputs" / entry["file"], dtype=numpy_dtype(entry["dtype"]))
    with np.errstate(invalid="ignore"):  # an lse never written holds any bit pattern
        return data.reshape(entry["shape"]).astype(np.float64)


def inputs_of(name: str) -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    case = CASES[name][0]
    mask = mask_of(case)
    return case, make_inputs(case, mask), mask


# ---- the forward --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fwd", "fwd-tnd"])
def test_the_forward_writes_out_and_lse_on_the_rows_it_computes(ran, name):
    case, tensors, mask = inputs_of(name)
    gold_out, gold_lse, _, _ = golden.forward_golden_and_benchmark(
        case, tensors["query"], tensors["key"], tensors["value"], mask, np.dtype(np.float64), 1
    )
    written = golden.written_rows(case, mask)

    out, lse = output(ran, name, "out"), output(ran, name, "lse").reshape(written.shape)

    assert run_record(folder(ran, name))["status"] == 0
    assert 0 < written.sum() < written.size  # the test has rows of both kinds
    np.testing.assert_allclose(out[written], gold_out[written], atol=4e-3, rtol=4e-3)
    np.testing.assert_allclose(lse[written], gold_lse.reshape(written.shape)[written], atol=1e-4, rtol=1e-4)
    assert np.isnan(out[~written]).all() and np.isnan(lse[~written]).all()  # the stand-in's garbage: NaN


def test_the_forward_hands_the_mask_over_as_int8_and_claims_no_prefill(ran):
    record = run_record(folder(ran, "fwd"))
    stdout = (folder(ran, "fwd") / "outputs" / "stdout.log").read_text()

    assert "op forward: npu_block_sparse_attention (mask as int8)" in stdout
    assert "prefilled_outputs" not in record["device"]
    assert set(record["outputs"]) == {"out", "lse"}


def test_with_softmax_lse_flag_0_the_lse_is_left_uninitialised(ran):
    case, tensors, mask = inputs_of("fwd-flag0")
    _, gold_lse, _, _ = golden.forward_golden_and_benchmark(
        case, tensors["query"], tensors["key"], tensors["value"], mask, np.dtype(np.float64), 1
    )
    written = golden.written_rows(case, mask)

    lse = output(ran, "fwd-flag0", "lse").reshape(written.shape)

    assert not np.allclose(lse[written], gold_lse.reshape(written.shape)[written], atol=0.1, equal_nan=True)
    assert run_record(folder(ran, "fwd-flag0"))["status"] == 0


def test_a_forward_the_tiling_refuses_records_its_status(ran):
    lines = (folder(ran, "fwd-d32") / "outputs" / "status.txt").read_text().splitlines()

    assert lines[0] == "561002"
    assert "call aclnnBlockSparseAttention failed, error code is 561002" in lines[1]
    assert not (folder(ran, "fwd-d32") / "outputs" / "out.bin").exists()


# ---- the chain and autograd -----------------------------------------------------------------------------


def test_the_chain_runs_the_backward_on_the_forwards_own_outputs(ran):
    case, tensors, mask = inputs_of("chain")
    args = (tensors["dout"], tensors["query"], tensors["key"], tensors["value"], mask)
    gold, _ = golden.chain_golden_and_benchmark(case, *args, np.dtype(np.float64), 1)
    stdout = (folder(ran, "chain") / "outputs" / "stdout.log").read_text()

    assert "op chain: npu_block_sparse_attention (mask as int8), then npu_block_sparse_attention_backward" in stdout
    assert run_record(folder(ran, "chain"))["status"] == 0
    for grad in ("dq", "dk", "dv"):
        found, expected = output(ran, "chain", grad), np.asarray(gold[grad], dtype=np.float64)
        error = np.sqrt(np.mean((found - expected) ** 2)) / np.sqrt(np.mean(expected**2))
        assert error < 5e-3, (grad, error)


def test_an_int8_mask_reaches_the_chains_backward_and_is_refused(ran):
    lines = (folder(ran, "chain-int8") / "outputs" / "status.txt").read_text().splitlines()

    assert lines[0] == "161002" and "call aclnnBlockSparseAttentionGrad failed" in lines[1]
    assert not (folder(ran, "chain-int8") / "outputs" / "dq.bin").exists()


def test_autograd_gives_what_the_chain_gives(ran):
    """The same inputs (both folders draw them from the same case values): out.backward(dout) reaches the
    backward with the forward's own out and lse, as the chain's explicit call does (deterministic mode)."""
    stdout = (folder(ran, "auto") / "outputs" / "stdout.log").read_text()

    assert "op autograd: npu_block_sparse_attention (mask as uint8), then out.backward(dout)" in stdout
    assert run_record(folder(ran, "auto"))["status"] == 0
    for tensor in ("out", "lse", "dq", "dk", "dv"):
        assert np.array_equal(output(ran, "auto", tensor), output(ran, "chain", tensor), equal_nan=True), tensor


def test_timed_runs_time_the_forward_and_the_backward_apart(tmp_path, monkeypatch):
    """The stand-in's clock moves 40 us per forward and 250 us per backward: a forward timed into the
    backward (autograd needs a new forward before each out.backward) would read 290."""
    for name in ("chain", "auto"):  # a forward folder's call is the chain's forward (and cann_ops_transformer's)
        case, op, options = CASES[name]
        build_op_folder(tmp_path, case, op, mask_of(case), **options)
    standin_env(monkeypatch)
    monkeypatch.setenv("TORCH_NPU_STANDIN_FORWARD_US", "40")
    monkeypatch.setenv("TORCH_NPU_STANDIN_KERNEL_US", "250")

    result = invoke("run", tmp_path, "--device", "torch_npu", "--time", "--time-runs", "2", "--warmup", "1")

    assert result.exit_code == 0, result.output
    steps = {name: run_record(folder(tmp_path, name))["timing"]["steps"] for name in ("chain", "auto")}
    assert {name: {step: s["times_us"] for step, s in timed.items()} for name, timed in steps.items()} == {
        "chain": {"forward": [40.0, 40.0], "backward": [250.0, 250.0]},
        "auto": {"forward": [40.0, 40.0], "backward": [250.0, 250.0]},
    }
    stdout = (folder(tmp_path, "auto") / "outputs" / "stdout.log").read_text()
    assert "bsa-timing: forward warmup 1 runs 2" in stdout and "bsa-timing: backward warmup 1 runs 2" in stdout


# ---- what the device cannot run ------------------------------------------------------------------------


def test_autograd_before_torch_2_6_cannot_run(monkeypatch, tmp_path):
    case = make("old")
    manifest = store.load_manifest(build_op_folder(tmp_path, case, "autograd", mask_of(case)))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.1.0+cpu")

    reason = torch_npu.TorchNpuDevice().unsupported(manifest)

    assert reason == (
        "autograd needs torch 2.6 or later (torch_npu registers the forward's gradient for v2.6 and newer, "
        "op-plugin derivatives.yaml); this Python has torch 2.1.0+cpu"
    )
    assert torch_npu.TorchNpuDevice().unsupported(store.load_manifest(build_op_folder(tmp_path, case, "chain"))) is None
    old_torch = type("OldTorch", (), {"__version__": "2.5.1"})
    with pytest.raises(CannotRun, match="this Python has torch 2.5.1"):
        torch_npu_ops.run_op(plan_op(manifest), manifest, {}, old_torch, None, tmp_path)


def test_a_childs_cannot_run_becomes_a_skip(tmp_path):
    attempt = Attempt(index=1, argv=["x"], staging=tmp_path, stdout_log="stdout.log", stderr_log="stderr.log")
    attempt.exit_code, attempt.problems = 5, ["exited with code 5 (see stderr.log)"]
    execution = Execution(case_dir=tmp_path, output_dir=tmp_path, env={}, timeout=None, cancel=Cancel())
    (tmp_path / "stderr.log").write_text("cannot run: autograd needs torch 2.6 or later\nmore\n")

    binary.mark_cannot_run(attempt, execution)

    assert attempt.outcome == "skipped" and attempt.skipped == "autograd needs torch 2.6 or later"
    other = Attempt(index=1, argv=["x"], staging=tmp_path, stdout_log="o", stderr_log="stderr.log", exit_code=3)
    other.problems = ["exited with code 3"]
    binary.mark_cannot_run(other, execution)
    assert other.outcome == "error"


# ---- the plan --------------------------------------------------------------------------------------------


def test_plan_op_passes_the_forwards_keywords(tmp_path):
    bnsd = plan_op(store.load_manifest(build_op_folder(tmp_path, make("p"), "forward")))
    tnd_case = make(
        "t", layout="TND", actual_seq_lengths=(100, 60), actual_seq_lengths_kv=(256, 130), batch=2, q_seq_len=100
    )
    tnd = plan_op(store.load_manifest(build_op_folder(tmp_path, tnd_case, "chain")))

    assert bnsd.forward.block_shape == [64, 128] and bnsd.backward is None
    assert bnsd.forward.keywords() == {
        "q_input_layout": "BNSD",
        "kv_input_layout": "BNSD",
        "num_key_value_heads": 1,
        "scale_value": 0.125,
        "inner_precise": 0,
        "actual_seq_lengths": [200],  # BNSD without lengths: [S] * B for both (autograd's backward reads them)
        "actual_seq_lengths_kv": [256],
        "softmax_lse_flag": 1,
    }
    assert (tnd.forward.actual_seq_lengths, tnd.forward.actual_seq_lengths_kv) == ([100, 60], [256, 130])
    assert tnd.backward is not None and tnd.backward["actual_seq_lengths"] == [100, 60]
    assert tnd.outputs == ("out", "lse", "dq", "dk", "dv")


def test_plan_op_calls_each_step_of_a_chain_at_its_own_scale(tmp_path):
    """A chain folder's `params.forward_scale` and `backward_scale` (what gen writes for `step_scales`, as in
    cases/chain.yaml's chain-scale-forward-default): each step called with its own."""
    manifest = store.load_manifest(build_op_folder(tmp_path, make("c"), "chain"))
    manifest.raw["params"].update(forward_scale=1.0, backward_scale=0.125)
    plan = plan_op(manifest)

    assert plan.forward.scale_value == 1.0
    assert plan.backward is not None and plan.backward["scale_value"] == 0.125
    plain = plan_op(store.load_manifest(build_op_folder(tmp_path, make("d"), "chain")))
    assert plain.forward.scale_value == 0.125 and plain.backward is not None and plain.backward["scale_value"] == 0.125


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda m: m["params"].update(block_shape=None),
            "blockShape None: the binding's block_shape is a required int[]",
        ),
        (lambda m: m["params"].update(mask_type=1), "maskType 1: the binding always passes 0"),
        (lambda m: m["params"].update(null_layouts=["q"]), "a null layout: the binding takes a str"),
        (
            lambda m: m["outputs"]["out"].update(dtype="float32"),
            "out is float32 [1, 2, 200, 64], but the binding returns float16 [1, 2, 200, 64]",
        ),
        (lambda m: m["inputs"].update(query=None), "query is null: the binding takes a Tensor"),
    ],
)
def test_plan_op_refuses_what_the_binding_cannot_express(tmp_path, change, reason):
    manifest = store.load_manifest(build_op_folder(tmp_path, make("r"), "forward"))
    change(manifest.raw)

    with pytest.raises(NotExpressible) as caught:
        plan_op(manifest)

    assert (
        str(caught.value) == f"case r@forward: torch_npu.npu_block_sparse_attention cannot express this call: {reason}"
    )


def test_plan_op_takes_a_squeezed_lse_and_one_given_length_as_is(tmp_path):
    manifest = store.load_manifest(build_op_folder(tmp_path, make("s", lse_shape="squeezed"), "forward"))
    manifest.raw["params"]["actual_seq_lengths"] = [150]

    plan = plan_op(manifest)

    assert (plan.forward.actual_seq_lengths, plan.forward.actual_seq_lengths_kv) == ([150], None)


def test_statuses_of_both_steps_are_read():
    forward = "x.cpp:86 NPU function error: call aclnnBlockSparseAttention failed, error code is 561002"
    backward = "NPU function error: call aclnnBlockSparseAttentionGrad failed, error code is 161002"

    assert torch_npu_ops.aclnn_status(forward) == 561002 and torch_npu_ops.aclnn_status(backward) == 161002
    assert torch_npu.aclnn_status(forward) is None  # the backward's own reader keeps to the backward


# ---- the stand-in is as strict as the binding ----------------------------------------------------------


@pytest.fixture(scope="module")
def standin() -> Any:
    if str(STANDIN) not in sys.path:
        sys.path.insert(0, str(STANDIN))
    module = importlib.import_module("torch_npu")
    assert module.__file__ and Path(module.__file__).is_relative_to(STANDIN)
    return module


def forward_args(**change: Any) -> tuple[list[Any], dict[str, Any]]:
    """A valid BNSD forward call (B=1, N1=2, N2=1, S=256, D=64, blocks [128, 128]) as op-plugin's example."""
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "query": torch.randn(1, 2, 256, 64, generator=generator).half(),
        "key": torch.randn(1, 1, 256, 64, generator=generator).half(),
        "value": torch.randn(1, 1, 256, 64, generator=generator).half(),
        "block_sparse_mask": torch.ones(1, 2, 2, 2, dtype=torch.int8),
    }
    keywords: dict[str, Any] = {
        "q_input_layout": "BNSD",
        "kv_input_layout": "BNSD",
        "num_key_value_heads": 1,
        "scale_value": 0.125,
        "inner_precise": 0,
        "softmax_lse_flag": 1,
    }
    block_shape = change.pop("block_shape", [128, 128])
    for key, value in change.items():
        (tensors if key in tensors else keywords)[key] = value
    return [*(t.npu() if isinstance(t, torch.Tensor) else t for t in tensors.values()), block_shape], keywords


def test_the_standins_forward_takes_the_examples_call(standin):
    args, kwargs = forward_args()

    out, lse = standin.npu_block_sparse_attention(*args, **kwargs)

    q, k, v = (t.float() for t in args[:3])
    dense = torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1) @ v
    assert (out.dtype, list(lse.shape), lse.dtype) == (torch.float16, [1, 2, 256, 1], torch.float32)
    assert torch.allclose(out.float(), dense, atol=2e-3)
    assert torch.allclose(lse[..., 0], torch.logsumexp(q @ k.transpose(-1, -2) * 0.125, dim=-1), atol=1e-4)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        (lambda a, k: ([*a, "BNSD"], k), "takes 5 positional argument(s) but 6 was/were given"),
        (lambda a, k: ([*a[:4], None], k), "Expected a value of type 'List[int]' for argument 'block_shape'"),
        (lambda a, k: (a, {**k, "layout": "BNSD"}), "Unknown keyword argument 'layout'"),
        (lambda a, k: (a, {**k, "softmax_lse_flag": 1.0}), "for argument 'softmax_lse_flag'"),
    ],
)
def test_the_standins_forward_refuses_wrong_names_order_and_types(standin, how, message):
    args, kwargs = how(*forward_args())

    with pytest.raises(RuntimeError) as caught:
        standin.npu_block_sparse_attention(*args, **kwargs)

    assert message in str(caught.value)


def test_the_standins_forward_makes_the_bindings_check_and_aclnns(standin):
    args, kwargs = forward_args(key=torch.zeros(1, 1, 256, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="query, key, value must have the same dtype, got query=Half, key=BFloat16"):
        standin.npu_block_sparse_attention(*args, **kwargs)
    refusals = {
        "block_shape": ([128, 64], 561002),  # Y % 128
        "inner_precise": (2, 161002),
        "kv_input_layout": ("TND", 161002),
        "block_sparse_mask": (torch.ones(1, 2, 2, 3, dtype=torch.int8), 561002),  # not exactly the mask shape
    }
    for key, (value, status) in refusals.items():
        args, kwargs = forward_args(**{key: value})
        with pytest.raises(RuntimeError) as caught:
            standin.npu_block_sparse_attention(*args, **kwargs)
        assert f"call aclnnBlockSparseAttention failed, error code is {status}" in str(caught.value), key


def test_the_standins_lse_is_garbage_with_flag_0_and_differs_call_to_call(standin):
    args, kwargs = forward_args(softmax_lse_flag=0)

    first = standin.npu_block_sparse_attention(*args, **kwargs)[1]
    second = standin.npu_block_sparse_attention(*args, **kwargs)[1]

    assert not torch.equal(first.view(torch.int32), second.view(torch.int32))


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6), reason="autograd: torch 2.6+")
def test_the_standins_autograd_calls_the_backward_on_the_forwards_own_outputs(standin):
    # BNSD with the lengths: derivatives.yaml hands the backward the forward's (None would be read out of bounds)
    mask = torch.ones(1, 2, 2, 2, dtype=torch.uint8)
    args, kwargs = forward_args(block_sparse_mask=mask, actual_seq_lengths=[256], actual_seq_lengths_kv=[256])
    for tensor in args[:3]:
        tensor.requires_grad_(True)
    dout = torch.randn(1, 2, 256, 64, generator=torch.Generator().manual_seed(1)).half().npu()
    torch.use_deterministic_algorithms(True)
    try:
        out, lse = standin.npu_block_sparse_attention(*args, **kwargs)
        out.backward(dout)
        explicit = standin.npu_block_sparse_attention_backward(
            dout,
            *(t.detach().npu() for t in (*args[:3], out, lse)),
            args[3],
            [128, 128],
            [256],
            [256],
            "BNSD",
            "BNSD",
            1,
            0.125,
        )
    finally:
        torch.use_deterministic_algorithms(False)

    assert not lse.requires_grad  # output_differentiability: [true, false]
    for tensor, expected in zip(args[:3], explicit, strict=True):
        assert torch.equal(tensor.grad, expected)


def test_the_standins_autograd_feeds_an_int8_mask_to_the_backward(standin):
    args, kwargs = forward_args(actual_seq_lengths=[256], actual_seq_lengths_kv=[256])
    for tensor in args[:3]:
        tensor.requires_grad_(True)
    out, _ = standin.npu_block_sparse_attention(*args, **kwargs)

    with pytest.raises(RuntimeError, match="call aclnnBlockSparseAttentionGrad failed, error code is 161002"):
        out.backward(torch.ones(1, 2, 256, 64, dtype=torch.float16).npu())


# ---- the acceptance run ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ops", ["forward,backward,chain", "autograd"])
def test_check_smoke_and_chain_with_ops_through_torch_npu(tmp_path, ops):
    """`bsa check cases/smoke.yaml cases/chain.yaml --ops ...` through the stand-in, in a fresh process: every
    folder passes or is skipped for its reason (each pitfall case gives its named verdict).

    chain.yaml's chain-y64-backward-only is refused by every op `--ops autograd` asks for: it is skipped
    with why (an override never makes a spec error).
    """
    chain = REPO / "cases" / "chain.yaml"
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])))
    env.pop("BSA_TORCH_NPU_STANDIN_FAULT", None)
    command = [sys.executable, "-m", "bsa_cli", "check", str(REPO / "cases" / "smoke.yaml"), str(chain)]
    command += ["--ops", ops, "-o", str(tmp_path / "out"), "--device", "torch_npu", "--devices", "0,1"]

    done = subprocess.run([*command, "--json", str(report)], env=env, capture_output=True, text=True, timeout=1800)

    cases = json.loads(report.read_text())["cases"]
    failed = {
        (case["name"], case.get("op")): case["message"] for case in cases if case["verdict"] not in ("PASS", "SKIP")
    }
    assert failed == {}, failed
    assert done.returncode == 0, done.stderr[-2000:]
    assert {case.get("op") for case in cases} == set(ops.split(","))


def test_a_child_on_torch_before_2_6_skips_an_autograd_folder(tmp_path, monkeypatch):
    """bsa's process sees a new torch (its metadata), the child's torch says 2.5.1: the child exits 5 and
    the case is skipped with its reason, not an error."""
    case = make("old-child")
    case_dir = build_op_folder(tmp_path / "out", case, "autograd", mask_of(case))
    standin_env(monkeypatch)
    monkeypatch.setenv("BSA_TORCH_NPU_STANDIN_FAULT", "old-torch")

    result = invoke("run", case_dir, "--device", "torch_npu")

    assert result.exit_code == 0, result.output
    rec = run_record(case_dir)
    assert rec["outcome"] == "skipped" and rec["problems"] == []
    assert rec["skipped"].startswith("autograd needs torch 2.6 or later") and "torch 2.5.1" in rec["skipped"]
    assert not (case_dir / "outputs" / "dq.bin").exists()
