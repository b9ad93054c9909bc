"""The reference device on op folders: the forward (its outputs pre-filled with NaN, written only on the rows
the forward writes), the chain (the backward on the forward's own out and lse), refusals, autograd, faults."""

from __future__ import annotations

import numpy as np
import pytest

from bsa_cli import devices, golden
from bsa_cli.devices import reference
from bsa_cli.devices.reference_ops import AUTOGRAD_REASON, Unsupported
from bsa_cli.golden.forward_op import written_rows
from tests.helpers import build_case, build_op_folder, case_factory, make_inputs, read_output, read_record

make = case_factory(
    head_dim=64, block_shape=(128, 128), q_seq_len=256, kv_seq_len=384, num_heads=2, num_kv_heads=1, scale=None
)

NAN_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000}
"""The NaN the reference device pre-fills the forward's outputs with (the contract's)."""


def mask_of(case) -> np.ndarray:
    """All blocks selected but query block 1 of head 1 (its rows stay unwritten) and the last kv block of head 0."""
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    mask[0, 1, 1, :] = 0
    mask[0, 0, :, -1] = 0
    return mask


def bits(array: np.ndarray) -> np.ndarray:
    return array.view({2: np.uint16, 4: np.uint32}[array.dtype.itemsize])


def assert_prefilled_where_unwritten(array: np.ndarray, rows: np.ndarray, dtype: str) -> None:
    """Written rows finite, every other element the NaN prefill, bit for bit."""
    assert np.isfinite(array[rows].astype(np.float32)).all()
    assert (bits(array[~rows]) == NAN_BITS[dtype]).all()


def emulate(case_dir, fault=None, order_seed=None):
    output_dir = case_dir / "outputs"
    return reference.emulate_into(case_dir, output_dir, fault, order_seed), output_dir


# ---- the forward ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_forward_writes_its_rows_and_leaves_the_nan_prefill_elsewhere(tmp_path, dtype):
    case = make("c", dtype=dtype)
    mask = mask_of(case)
    case_dir = build_op_folder(tmp_path, case, "forward", mask)

    done, output_dir = emulate(case_dir)

    assert done.status == 0 and done.prefilled_outputs == "nan"
    assert (output_dir / "status.txt").read_text() == "0\n"
    rows = written_rows(case, mask)
    assert rows.any() and not rows.all()
    out, lse = read_output(output_dir, "out", case), read_output(output_dir, "lse", case)
    assert_prefilled_where_unwritten(out, rows, dtype)
    assert_prefilled_where_unwritten(lse.reshape(rows.shape), rows, "float32")
    tensors = make_inputs(case, mask)
    gold_out, gold_lse = golden.forward(case, tensors["query"], tensors["key"], tensors["value"], mask)
    np.testing.assert_allclose(out[rows].astype(np.float64), gold_out[rows], atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(lse.reshape(rows.shape)[rows], gold_lse.reshape(rows.shape)[rows], rtol=1e-5)


def test_the_forward_leaves_lse_alone_with_softmax_lse_flag_0(tmp_path):
    case = make("c", softmax_lse_flag=0)
    mask = mask_of(case)
    case_dir = build_op_folder(tmp_path, case, "forward", mask)

    done, output_dir = emulate(case_dir)

    assert done.status == 0
    rows = written_rows(case, mask)
    assert_prefilled_where_unwritten(read_output(output_dir, "out", case), rows, "float16")
    assert (bits(read_output(output_dir, "lse", case)) == NAN_BITS["float32"]).all()


def test_a_forward_the_forward_refuses_writes_only_its_status(tmp_path):
    case = make("c", head_dim=32)  # the A2/A3 forward takes D in {64, 128}; the backward any D
    case_dir = build_op_folder(tmp_path, case, "forward")

    done, output_dir = emulate(case_dir)

    assert done.status == 561002 and done.prefilled_outputs is None
    assert sorted(p.name for p in output_dir.iterdir()) == ["status.txt"]
    assert (output_dir / "status.txt").read_text().startswith("561002\n")


# ---- the chain -----------------------------------------------------------------------------------------


GEOMETRIES = {
    "bnsd-gqa": {},
    "tnd": dict(
        layout="TND",
        batch=2,
        actual_seq_lengths=(200, 56),
        actual_seq_lengths_kv=(256, 128),
        num_heads=2,
        num_kv_heads=2,
        q_seq_len=200,
        kv_seq_len=256,
    ),
    "bnsd-lengths-bf16": dict(dtype="bfloat16", actual_seq_lengths=(200,), actual_seq_lengths_kv=(300,)),
}
"""Chains of several geometries: GQA, TND with two batch entries, BNSD lengths below S (honoured)."""


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_the_chain_runs_the_backward_on_the_forwards_own_outputs(tmp_path, geometry):
    case = make("c", **GEOMETRIES[geometry])
    mask = mask_of(case)
    forward_dir = build_op_folder(tmp_path, case, "forward", mask)
    chain_dir = build_op_folder(tmp_path, case, "chain", mask)
    _, forward_out = emulate(forward_dir)

    done, output_dir = emulate(chain_dir, order_seed=5)

    assert done.status == 0 and done.prefilled_outputs == "nan"
    for name in ("out", "lse"):  # the same forward, the mask given as int8 in both
        assert (output_dir / f"{name}.bin").read_bytes() == (forward_out / f"{name}.bin").read_bytes()
    out, lse = read_output(output_dir, "out", case), read_output(output_dir, "lse", case)
    tensors = {**make_inputs(case, mask), "attention_out": out, "softmax_lse": lse}
    expected = reference.emulate(case, tensors, order_seed=5)
    for name in ("dq", "dk", "dv"):
        assert (read_output(output_dir, name, case) == expected[name]).all(), name
    rows = written_rows(case, mask)
    finite_out = np.where(rows[..., None], out.astype(np.float64), 0.0)
    finite_lse = np.where(rows, lse.reshape(rows.shape), np.inf).reshape(lse.shape)
    args = [tensors[n] for n in ("dout", "query", "key", "value")]
    grads = golden.backward(case, *args, finite_out, finite_lse, mask)
    for name, gold in zip(("dq", "dk", "dv"), grads, strict=True):
        device = read_output(output_dir, name, case).astype(np.float64)
        assert np.isfinite(device).all(), name
        scale = np.abs(gold).max()
        assert np.abs(device - gold).max() <= 2e-2 * scale, name


def test_the_chain_with_an_unwritten_lse_feeds_the_backward_the_prefill(tmp_path):
    case = make("c", softmax_lse_flag=0)
    mask = mask_of(case)
    case_dir = build_op_folder(tmp_path, case, "chain", mask)

    done, output_dir = emulate(case_dir)

    assert done.status == 0
    rows = written_rows(case, mask)
    dq = read_output(output_dir, "dq", case)
    assert np.isnan(dq[rows].astype(np.float32)).all()  # the backward read lse the forward never wrote
    assert (dq[~rows] == 0).all()  # rows with no selected block are never formed


def test_a_chain_whose_backward_refuses_keeps_the_forwards_outputs(tmp_path):
    case = make("c")
    case_dir = build_op_folder(tmp_path, case, "chain", mask_of(case), mask_dtype="int8")

    done, output_dir = emulate(case_dir)

    assert done.status == 161002  # the backward refuses an int8 mask since v9.1.0
    assert sorted(p.name for p in output_dir.iterdir()) == ["lse.bin", "out.bin", "status.txt"]
    assert "block_sparse_mask" in (output_dir / "status.txt").read_text()


def test_a_chain_the_forward_refuses_has_the_forwards_status(tmp_path):
    case = make("c", head_dim=32)
    case_dir = build_op_folder(tmp_path, case, "chain")

    done, output_dir = emulate(case_dir)

    assert done.status == 561002
    assert sorted(p.name for p in output_dir.iterdir()) == ["status.txt"]


# ---- what the reference device does not run ----------------------------------------------------------


def test_autograd_and_skipped_folders_are_not_emulated(tmp_path):
    case = make("c")
    with pytest.raises(Unsupported, match="no autograd"):
        emulate(build_op_folder(tmp_path, case, "autograd"))
    with pytest.raises(Unsupported, match="gen skipped this op"):
        emulate(build_op_folder(tmp_path, case, "forward", skip="the A2/A3 forward refuses it"))
    assert AUTOGRAD_REASON == "the reference device has no autograd: run it with --device torch_npu"


# ---- bsa run's record ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "names"), [("forward", ["lse", "out"]), ("chain", ["dk", "dq", "dv", "lse", "out"])])
def test_run_records_the_prefill_and_every_output(tmp_path, op, names):
    case = make("c")
    case_dir = build_op_folder(tmp_path, case, op, mask_of(case))

    result = devices.run_case(case_dir, devices.RunOptions(repeat=2))

    assert result.outcome == "ok", result.problems
    record = read_record(result)
    assert record["device"]["prefilled_outputs"] == "nan"
    assert sorted(record["outputs"]) == names
    assert all(d["output"] in ("dk", "dv") for d in record["repeat"]["differences"])


# ---- planted faults ------------------------------------------------------------------------------------

long_rows = case_factory(
    head_dim=64, block_shape=(128, 128), q_seq_len=128, kv_seq_len=1024, num_heads=2, num_kv_heads=1, scale=None
)
"""A case whose rows select 1024 kv columns: two 512-column stacks of the forward's online softmax."""


def clean_and_faulty(tmp_path, case, op, fault, mask=None):
    """Return (clean outputs dir, faulty outputs dir, the faulty run's Emulated) of one op folder."""
    clean_dir = build_op_folder(tmp_path / "clean", case, op, mask)
    faulty_dir = build_op_folder(tmp_path / "faulty", case, op, mask)
    _, clean = emulate(clean_dir, order_seed=None)
    done, faulty = emulate(faulty_dir, fault, order_seed=None)
    return clean, faulty, done


def same(first, second, name) -> bool:
    return (first / f"{name}.bin").read_bytes() == (second / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("fault", ["rescale-skipped", "stack-off-by-one"])
def test_a_forward_fault_of_the_stacks_changes_out_on_long_rows(tmp_path, fault):
    clean, faulty, done = clean_and_faulty(tmp_path, long_rows("c"), "forward", fault)

    assert done.status == 0 and done.fault_not_applied is None
    assert not same(clean, faulty, "out")


def test_lse_not_written_leaves_the_prefill_in_lse(tmp_path):
    case = make("c")
    clean, faulty, done = clean_and_faulty(tmp_path, case, "forward", "lse-not-written", mask_of(case))

    assert done.fault_not_applied is None and same(clean, faulty, "out")
    assert (bits(read_output(faulty, "lse", case)) == NAN_BITS["float32"]).all()


def test_a_backward_fault_does_not_apply_to_a_forward_folder(tmp_path):
    case = make("c")
    clean, faulty, done = clean_and_faulty(tmp_path, case, "forward", "dk-no-scale", mask_of(case))

    assert done.fault_not_applied is not None and "does not apply" in done.fault_not_applied
    assert same(clean, faulty, "out") and same(clean, faulty, "lse")


def test_a_chain_plants_a_backward_fault_in_its_backward_step(tmp_path):
    case = make("c")
    clean, faulty, done = clean_and_faulty(tmp_path, case, "chain", "dk-no-scale", mask_of(case))

    assert done.fault_not_applied is None
    assert all(same(clean, faulty, name) for name in ("out", "lse", "dq", "dv"))
    assert not same(clean, faulty, "dk")


def test_a_chain_plants_a_forward_fault_in_its_forward_step(tmp_path):
    case = make("c")
    mask = mask_of(case)
    clean, faulty, done = clean_and_faulty(tmp_path, case, "chain", "lse-not-written", mask)

    assert done.fault_not_applied is None and same(clean, faulty, "out")
    rows = written_rows(case, mask)
    assert np.isnan(read_output(faulty, "dq", case)[rows].astype(np.float32)).all()  # the backward read the NaN


def test_run_records_a_fault_that_cannot_apply_to_the_op(tmp_path):
    case = make("c")
    forward_dir = build_op_folder(tmp_path, case, "forward", mask_of(case))
    chain_result = devices.run_case(
        build_op_folder(tmp_path, case, "chain", mask_of(case)),
        devices.RunOptions(device=reference.ReferenceDevice("lse-not-written")),
    )

    result = devices.run_case(forward_dir, devices.RunOptions(device=reference.ReferenceDevice("no-dsum")))

    assert result.outcome == "ok"
    assert "does not apply" in read_record(result)["device"]["fault_not_applied"]
    assert read_record(chain_result)["device"]["fault_not_applied"] is None


def test_a_forward_fault_does_not_apply_to_a_backward_folder(tmp_path):
    case = make("c")
    clean_dir = build_case(tmp_path / "clean", case, mask_of(case), outputs=False)
    faulty_dir = build_case(tmp_path / "faulty", case, mask_of(case), outputs=False)
    _, clean = emulate(clean_dir)

    done, faulty = emulate(faulty_dir, "lse-not-written")

    assert done.prefilled_outputs is None and "does not apply" in (done.fault_not_applied or "")
    assert all(same(clean, faulty, name) for name in ("dq", "dk", "dv"))
