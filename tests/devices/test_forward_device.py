"""Tests of bsa_cli.devices.forward: the reference device's forward, its NaN-prefilled outputs and its faults."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import golden
from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.devices import faults, reference
from bsa_cli.devices import forward as device_forward
from tests import helpers

make_case = helpers.case_factory(tnd_sizes_from_lengths=True, name="fwd", source="test")


def draw(case: Case, seed: int = 0, density: float = 0.6, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Random query/key/value/dout of the case dtype and a random uint8 block mask."""
    return helpers.draw_forward(case, seed, density, mask)


def kernel(case: Case, t: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return golden.forward_kernel(case, t["query"], t["key"], t["value"], t["block_sparse_mask"])


def bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint16 if array.itemsize == 2 else np.uint32)


LONG = dict(num_heads=2, num_kv_heads=1, head_dim=64, q_seq_len=256, kv_seq_len=1100, block_shape=(256, 128))
"""GQA, a 256-row block row (two 128-row pieces), rows of up to 1100 columns (three stacks) and a kv tail."""

GEOMETRIES = {
    "bnsd-tails": dict(q_seq_len=96, kv_seq_len=80, block_shape=(32, 16)),
    "long-gqa": LONG,
    "long-inner-precise-1": {**LONG, "inner_precise": 1},
    "bf16": dict(dtype="bfloat16", q_seq_len=64, kv_seq_len=700, block_shape=(16, 128)),
    "bnsd-lengths": dict(
        batch=2,
        q_seq_len=64,
        kv_seq_len=64,
        actual_seq_lengths=(40, 64),
        actual_seq_lengths_kv=(64, 20),
        block_shape=(16, 16),
        bnsd_lengths="ignored",
    ),
    "tnd": dict(layout="TND", actual_seq_lengths=(30, 0, 50), actual_seq_lengths_kv=(40, 17, 0), block_shape=(16, 16)),
    "squeezed-lse": dict(q_seq_len=64, kv_seq_len=64, block_shape=(16, 16), lse_shape="squeezed"),
}


@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_the_reference_forward_is_forward_kernel_to_the_last_bit(geometry: str) -> None:
    """Own tiling, same precision path: out within one unit of its last place, lse within fp32 rounding.

    What may differ: each stack's scores come from a product of their own (the kernel path multiplies the
    row's scores at once) and the row sums run over gathered copies, so a BLAS or a sum could order its
    additions otherwise; on OpenBLAS both give the same bits here, which the counts below show."""
    case = make_case(**GEOMETRIES[geometry])
    t = draw(case, seed=2)
    out, lse = kernel(case, t)
    result = device_forward.run_forward(case, t)
    assert result["out"].dtype == out.dtype and result["out"].shape == case.q_shape
    assert result["lse"].dtype == np.float32 and result["lse"].shape == case.lse_shape_dims
    rows = golden.written_rows(case, t["block_sparse_mask"])
    device_out, device_lse = result["out"][rows], result["lse"].reshape(case.q_shape[:-1])[rows]
    ulps = np.abs(bits(device_out).astype(np.int64) - bits(out[rows]).astype(np.int64))
    assert ulps.max(initial=0) <= 1  # same signs: out is never near 0 here with these tolerances
    assert np.mean(ulps != 0) <= 0.01
    np.testing.assert_allclose(device_lse, lse[rows], rtol=2e-7, atol=1e-6)


@pytest.mark.parametrize("geometry", ["bnsd-lengths", "tnd", "bnsd-tails"])
def test_unwritten_rows_keep_the_nan_prefill(geometry: str) -> None:
    case = make_case(**GEOMETRIES[geometry])
    mask = np.random.default_rng(3).random(case.mask_shape) < 0.6
    mask[0, 0, 0] = False  # an empty block row
    t = draw(case, seed=3, mask=mask)
    rows = golden.written_rows(case, t["block_sparse_mask"])
    assert (~rows).any() and rows.any()
    result = device_forward.run_forward(case, t)
    nan16 = device_forward.NAN_BITS[case.dtype]
    assert np.all(bits(result["out"])[~rows] == nan16)
    assert np.all(np.isfinite(result["out"][rows].astype(np.float32)))
    lse = result["lse"].reshape(case.q_shape[:-1])
    assert np.all(bits(lse)[~rows] == 0x7FC00000) and np.all(np.isfinite(lse[rows]))


def test_with_softmax_lse_flag_0_lse_stays_the_prefill() -> None:
    case = make_case(**GEOMETRIES["bnsd-tails"], softmax_lse_flag=0)
    t = draw(case)
    result = device_forward.run_forward(case, t)
    assert np.all(bits(result["lse"]) == 0x7FC00000)
    np.testing.assert_array_equal(
        bits(result["out"]), bits(device_forward.run_forward(dataclasses.replace(case, softmax_lse_flag=1), t)["out"])
    )


def test_prefilled_buffers_hold_the_quiet_nan_of_each_dtype() -> None:
    for dtype, pattern in device_forward.NAN_BITS.items():
        buffer = device_forward.prefilled((2, 3), dtype)
        assert buffer.dtype == numpy_dtype(dtype) and np.all(bits(buffer) == pattern)


def test_the_forward_reads_the_mask_as_int8_with_the_same_bytes() -> None:
    mask = np.array([[0, 1, 255, 3]], dtype=np.uint8)
    as_int8 = device_forward.forward_mask(mask)
    assert as_int8.dtype == np.int8 and as_int8.tobytes() == mask.tobytes()
    case = make_case(**GEOMETRIES["bnsd-tails"])
    t = draw(case, mask=np.random.default_rng(0).integers(0, 256, case.mask_shape))
    int8 = {**t, "block_sparse_mask": device_forward.forward_mask(t["block_sparse_mask"])}
    a, b = device_forward.run_forward(case, t), device_forward.run_forward(case, int8)
    np.testing.assert_array_equal(bits(a["out"]), bits(b["out"]))


# ---- faults -------------------------------------------------------------------------------------------


def long_rows(case: Case, mask: np.ndarray) -> np.ndarray:
    """Which query rows select more than 512 real kv columns (BNSD, one batch entry)."""
    x, y = case.block_shape
    widths = np.minimum(y, case.kv_seq_len - y * np.arange(case.num_kv_blocks))
    columns = (mask[0] != 0) @ widths  # [N1, nQ]
    return np.repeat(columns > 512, x, axis=1)[:, : case.q_seq_len][None]


@pytest.mark.parametrize("fault", ["rescale-skipped", "stack-off-by-one"])
def test_stack_faults_change_the_long_rows_only(fault: str) -> None:
    case = make_case(**LONG)
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    mask[0, 1, 0, 4:] = 0  # head 1: 512 columns, one stack
    t = draw(case, seed=4, mask=mask)
    long = long_rows(case, mask)
    assert long[0, 0].all() and not long[0, 1].any()
    assert faults.fault_applies(fault, case, mask, "forward") and faults.fault_applies(fault, case, mask, "chain")
    clean, faulty = device_forward.run_forward(case, t), device_forward.run_forward(case, t, fault)
    changed = (bits(clean["out"]) != bits(faulty["out"])).any(axis=-1)
    assert not changed[~long].any()
    if fault == "stack-off-by-one":
        assert changed[long].all()
    else:  # only where a later stack raises the row's max (head 0 selects every column, in order)
        scores = t["query"][0, 0].astype(np.float64) @ t["key"][0, 0].astype(np.float64).T * case.kernel_scale
        first, later = scores[:, :512].max(axis=1), scores[:, 512:].max(axis=1)
        assert changed[0, 0][later > first + 1e-3].all() and not changed[0, 0][later < first - 1e-3].any()
        assert 0.2 < changed[long].mean() < 0.9
    worst = np.abs(clean["out"].astype(np.float64) - faulty["out"].astype(np.float64)).max()
    assert worst > 1e-2  # far beyond rounding: a comparator sees it
    short = make_case(**{**LONG, "kv_seq_len": 512})
    short_mask = np.ones(short.mask_shape, dtype=np.uint8)
    assert not faults.fault_applies(fault, short, short_mask, "forward")
    ts = draw(short, seed=4, mask=short_mask)
    np.testing.assert_array_equal(
        bits(device_forward.run_forward(short, ts, fault)["out"]), bits(device_forward.run_forward(short, ts)["out"])
    )


def test_lse_not_written_leaves_the_lse_prefill_and_out_alone() -> None:
    case = make_case(**GEOMETRIES["bnsd-tails"])
    t = draw(case)
    assert faults.fault_applies("lse-not-written", case, t["block_sparse_mask"], "forward")
    clean, faulty = device_forward.run_forward(case, t), device_forward.run_forward(case, t, "lse-not-written")
    assert np.all(bits(faulty["lse"]) == 0x7FC00000) and not np.isnan(clean["lse"]).all()
    np.testing.assert_array_equal(bits(faulty["out"]), bits(clean["out"]))
    flag0 = dataclasses.replace(case, softmax_lse_flag=0)
    assert not faults.fault_applies("lse-not-written", flag0, t["block_sparse_mask"], "forward")
    nothing = np.zeros(case.mask_shape, dtype=np.uint8)
    assert not faults.fault_applies("lse-not-written", case, nothing, "forward")
    assert "softmax_lse_flag 1" in (
        faults.fault_not_applied("lse-not-written", flag0, t["block_sparse_mask"], "forward") or ""
    )


def test_faults_apply_only_to_the_step_they_belong_to() -> None:
    case = make_case(**LONG)
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    for name in faults.FORWARD_FAULTS:
        applies = faults.fault_applies(name, case, mask, "forward")
        assert applies == faults.fault_applies(name, case, mask, "chain")
        assert applies or name in ("forward-block-shift", "forward-heads-interleaved")  # all-ones mask, one kv head
        assert not faults.fault_applies(name, case, mask)  # the default op: the backward
        assert "fault of the forward" in (faults.fault_not_applied(name, case, mask, "backward") or "")
    t = draw(case, mask=mask)
    clean = device_forward.run_forward(case, t)
    for name in faults.FAULTS:
        assert not faults.fault_applies(name, case, mask, "forward")
        assert "fault of the backward" in (faults.fault_not_applied(name, case, mask, "forward") or "")
        assert faults.fault_applies(name, case, mask, "chain") == faults.fault_applies(name, case, mask)
        np.testing.assert_array_equal(bits(device_forward.run_forward(case, t, name)["out"]), bits(clean["out"]))
    assert set(faults.FORWARD_FAULTS) <= set(faults.ALL_FAULTS)


# ---- the chain on the reference device --------------------------------------------------------------------


def test_the_chain_is_the_forward_then_the_backward_on_its_own_outputs() -> None:
    case = make_case(**GEOMETRIES["bnsd-tails"])
    t = draw(case, seed=5)
    forward_outputs = device_forward.run_forward(case, t)
    grads = reference.emulate(case, device_forward.backward_tensors(t, forward_outputs))
    args = (t["dout"], t["query"], t["key"], t["value"], t["block_sparse_mask"])
    gold, bench = golden.chain_golden_and_benchmark(case, *args)
    for name in ("dq", "dk", "dv"):
        scale = np.abs(gold[name]).max()
        device_error = np.abs(grads[name].astype(np.float64) - gold[name]).max()
        bench_error = np.abs(bench[name].astype(np.float64) - gold[name]).max()
        assert device_error <= 2 * bench_error + 2.0**-11 * scale, name
    # softmax_lse_flag 0: the backward reads the lse the forward never wrote (the NaN prefill)
    flag0 = dataclasses.replace(case, softmax_lse_flag=0)
    unwritten = reference.emulate(flag0, device_forward.backward_tensors(t, device_forward.run_forward(flag0, t)))
    assert np.isnan(unwritten["dq"].astype(np.float32)).any()


#: A forward the A2/A3 forward accepts (D 64, Y 128), tested as a forward, a chain and a backward folder.
GUARDED = {
    "defaults": {"layout": "BNSD", "dtype": "fp16", "batch": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 64},
    "cases": [{"name": "g", "q_seq_len": 128, "kv_seq_len": 256, "block_shape": [64, 128], "seed": 4}],
}


def test_a_write_past_lse_shows_in_its_guard_zone_alone(generated_spec, tmp_path: Path) -> None:
    """lse-write-past-end leaves out and lse right: the forward and the chain fail by the guard zone after lse
    (its 2 x 128 elements, then 8 more); the backward folder, which writes no lse, is clean; without it all pass."""
    out = Path(shutil.copytree(generated_spec(GUARDED, "--ops", "forward,chain,backward"), tmp_path / "out"))
    assert helpers.invoke("run", out, "--fault", "lse-write-past-end").exit_code == 0
    result = helpers.invoke("compare", out, "--json", tmp_path / "r.json")

    assert result.exit_code == 1, result.output
    verdicts = {case["name"]: case for case in json.loads((tmp_path / "r.json").read_text())["cases"]}
    for name in ("g@forward", "g@chain"):
        (guard,) = [c for c in verdicts[name]["checks"] if c["name"] == "guard-zones"]
        assert verdicts[name]["verdict"] == "FAIL" and guard["tensor"] == "lse"
        assert "lse written outside the tensor, past its end: 8 element(s) from element offset 256" in guard["detail"]
        others = [c for c in verdicts[name]["checks"] if c["name"] != "guard-zones" and not c["passed"]]
        assert others == []  # the outputs themselves are right
    assert verdicts["g"]["verdict"] == "PASS"
    assert "fault of the forward" in (helpers.run_record(out / "g")["device"]["fault_not_applied"] or "")

    assert helpers.invoke("run", out).exit_code == 0
    assert helpers.invoke("compare", out).exit_code == 0


def test_stack_off_by_one_on_a_row_of_513_columns_drops_its_last_column() -> None:
    case = make_case(num_heads=1, num_kv_heads=1, q_seq_len=16, kv_seq_len=513, block_shape=(16, 128), head_dim=32)
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    t = draw(case, seed=8, mask=mask)
    assert faults.fault_applies("stack-off-by-one", case, mask, "forward")
    faulty = device_forward.run_forward(case, t, "stack-off-by-one")
    short = make_case(num_heads=1, num_kv_heads=1, q_seq_len=16, kv_seq_len=512, block_shape=(16, 128), head_dim=32)
    first_512 = {**t, "key": t["key"][:, :, :512], "value": t["value"][:, :, :512], "block_sparse_mask": mask[..., :4]}
    np.testing.assert_array_equal(bits(faulty["out"]), bits(device_forward.run_forward(short, first_512)["out"]))
