"""The cann_ops_transformer device (`--device cann_ops_transformer`) against the stand-in package of
tests/cann_ops_transformer_standin (on the torch_npu stand-in): forward folders run and pass, the entry's
default scale (1.0) planted fails them, every other op is not this device's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bsa_cli.devices.cann_ops_transformer import plan
from bsa_cli.devices.torch_npu_ops import NotExpressible
from bsa_cli.store import load_manifest
from tests.helpers import STANDIN, TESTS, invoke, run_record, standin_env

COT_STANDIN = TESTS / "cann_ops_transformer_standin"
FAULT = "BSA_COT_STANDIN_FAULT"

#: A forward the A2/A3 forward accepts (D 64, Y 128), a partial last query block, GQA; scale 1/sqrt(64).
SPEC = {
    "defaults": {"layout": "BNSD", "dtype": "fp16", "batch": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 64},
    "cases": [
        {"name": "cot", "q_seq_len": 200, "kv_seq_len": 256, "block_shape": [64, 128], "seed": 4},
        {"name": "cot-flag0", "q_seq_len": 128, "block_shape": [64, 128], "softmax_lse_flag": 0},
    ],
}


@pytest.fixture
def cot_env(monkeypatch):
    standin_env(monkeypatch)
    monkeypatch.syspath_prepend(str(COT_STANDIN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(COT_STANDIN), os.environ["PYTHONPATH"]]))
    monkeypatch.delenv(FAULT, raising=False)


@pytest.fixture(scope="module")
def generated(generated_spec) -> Path:
    return generated_spec(SPEC, "--ops", "forward,backward")


def copy_of(generated: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    for path in generated.rglob("*"):
        if path.is_file() and "outputs" not in path.relative_to(generated).parts:
            (out / path.relative_to(generated)).parent.mkdir(parents=True, exist_ok=True)
            (out / path.relative_to(generated)).write_bytes(path.read_bytes())
    return out


def test_the_plan_always_passes_the_cases_scale_and_asks_for_lse(generated):
    manifest = load_manifest(generated / "cot@forward")
    keywords = plan(manifest)
    assert keywords["scale_value"] == manifest.params["scale"] == 0.125  # never the entry's 1.0
    assert keywords["return_softmax_lse"] is True and "softmax_lse_flag" not in keywords
    assert keywords["block_shape"] == [64, 128] and keywords["q_input_layout"] == "BNSD"
    assert plan(load_manifest(generated / "cot-flag0@forward"))["return_softmax_lse"] is False
    with pytest.raises(NotExpressible, match="the forward alone, not the backward"):
        plan(load_manifest(generated / "cot"))


def test_forward_folders_pass_and_the_backward_is_not_this_devices(generated, tmp_path, cot_env):
    out = copy_of(generated, tmp_path)
    ran = invoke("run", out, "--device", "cann_ops_transformer")
    assert ran.exit_code == 0, ran.output
    stdout = (out / "cot@forward" / "outputs" / "stdout.log").read_text()
    assert "op forward: cann_ops_transformer.block_sparse_attention (mask as int8, scale_value 0.125 given)" in stdout
    assert run_record(out / "cot@forward")["status"] == 0
    assert "no lse; lse.bin holds NaN" in (out / "cot-flag0@forward" / "outputs" / "stdout.log").read_text()
    judged = invoke("compare", out, "--ops", "forward")
    assert judged.exit_code == 0, judged.output
    backward = invoke("compare", out, "--ops", "backward")
    assert "forward alone" in backward.output  # recorded as not this device's, and said


def test_the_entrys_default_scale_planted_fails_the_forward(generated, tmp_path, cot_env, monkeypatch):
    out = copy_of(generated, tmp_path)
    monkeypatch.setenv(FAULT, "default-scale")
    assert invoke("run", out, "--device", "cann_ops_transformer", "--ops", "forward").exit_code == 0
    out_bin = out / "cot@forward" / "outputs" / "out.bin"
    assert np.isfinite(np.fromfile(out_bin, dtype=np.float16)).any()
    judged = invoke("compare", out, "--ops", "forward", "--json", tmp_path / "r.json")
    assert judged.exit_code == 1, judged.output  # scale 1.0, not 1/sqrt(64): another function
    report = json.loads((tmp_path / "r.json").read_text())
    verdicts = {case["name"]: case["verdict"] for case in report["cases"]}
    assert verdicts["cot@forward"] == "FAIL"


def test_the_device_needs_its_package(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(STANDIN))
    result = invoke("run", tmp_path, "--device", "cann_ops_transformer")
    assert result.exit_code == 2 and "cann_ops_transformer is not installed" in result.stderr


def test_timed_runs_time_the_entrys_forward_and_a_slower_one_regresses(generated, tmp_path, cot_env, monkeypatch):
    """The torch_npu stand-in's clock moves a known time per forward, which the entry's call makes; its chip
    (torch.npu.get_device_name()) is Ascend910B2, whose peak bsa has (353 TFLOP/s), then one it has none for."""
    out = copy_of(generated, tmp_path) / "cot@forward"
    monkeypatch.setenv("TORCH_NPU_STANDIN_FORWARD_US", "40")
    timed = ("run", out, "--device", "cann_ops_transformer", "--time", "--time-runs", "3", "--warmup", "1")
    assert invoke(*timed).exit_code == 0
    timing = run_record(out)["timing"]
    assert list(timing["steps"]) == ["forward"] and timing["steps"]["forward"]["times_us"] == [40.0] * 3
    assert timing["chip"] == "Ascend910B2"
    fast = invoke("compare", out, "--json", tmp_path / "fast.json")
    assert fast.exit_code == 0
    (time,) = json.loads((tmp_path / "fast.json").read_text())["cases"][0]["kernel_time"]
    flops = load_manifest(out).flops("forward")
    assert time["chip"] == "Ascend910B2" and time["peak_tflops"] == 353.0
    assert time["peak_share"] == pytest.approx(flops / 40e-6 / 1e12 / 353.0)
    assert f"{time['peak_share']:.1%} of Ascend910B2" in fast.output

    monkeypatch.setenv("TORCH_NPU_STANDIN_FORWARD_US", "60")  # 50% slower, on a chip without a known peak
    monkeypatch.setenv("TORCH_NPU_STANDIN_CHIP", "Ascend910B4")
    assert invoke(*timed).exit_code == 0
    compared = invoke("compare", out, "--baseline", tmp_path / "fast.json", "--json", tmp_path / "slow.json")
    assert compared.exit_code == 4, compared.output
    assert "kernel 40.0 us -> 60.0 us (+50.0%" in compared.output
    (time,) = json.loads((tmp_path / "slow.json").read_text())["cases"][0]["kernel_time"]
    assert (time["chip"], time["peak_tflops"], time["peak_share"]) == ("Ascend910B4", None, None)
