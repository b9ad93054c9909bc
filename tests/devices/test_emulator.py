"""The reference device: kernel precision path, edge semantics, planted faults, interface checks, I/O."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from bsa_cli import store
from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.core.errors import DataError
from bsa_cli.core.layout import kv_view, lse_view, mask_view, q_view
from bsa_cli.devices.base import STATUS_FILE
from bsa_cli.devices.faults import FAULTS, applicable_faults, fault_applies, fault_site
from bsa_cli.devices.reference import emulate, emulate_case_dir
from bsa_cli.store import manifest
from tests.helpers import case_factory

GRADS = ("dq", "dk", "dv")
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2}
"""Largest |emulated - float64| allowed, relative to max |float64| of the tensor."""


# ---- helpers: cases, inputs and an independent dense float64 reference ----------------------------


make_case = case_factory(
    name="t", source="test", q_seq_len=128, kv_seq_len=128, block_shape=(32, 32), scale=None, seed=0
)


def element_mask(case: Case, block_mask: np.ndarray, span) -> np.ndarray:
    """Expand a batch entry's block mask to [N1, q_len, kv_len] bool."""
    x, y = case.block_shape
    blocks = mask_view(case, block_mask, span)
    return np.repeat(np.repeat(blocks, x, axis=1), y, axis=2)[:, : span.q_len, : span.kv_len]


def kv_heads_of(case: Case, tensor: np.ndarray) -> np.ndarray:
    """Repeat [N2, s, D] kv heads to the [N1, s, D] heads that use them."""
    return np.repeat(tensor, case.group_size, axis=0)


def dense_forward(case: Case, query, key, value, block_mask) -> tuple[np.ndarray, np.ndarray]:
    """Dense float64 forward: out (q shape) and lse (q shape without D; empty rows: case.empty_row_lse)."""
    out = np.zeros(case.q_shape)
    lse = np.full(case.q_shape[:-1], case.empty_row_lse)
    for span in case.spans():
        if span.q_len == 0:
            continue
        q = q_view(case, query, span).astype(np.float64)
        k = kv_heads_of(case, kv_view(case, key, span).astype(np.float64))
        v = kv_heads_of(case, kv_view(case, value, span).astype(np.float64))
        mask = element_mask(case, block_mask, span)
        scores = np.where(mask, case.kernel_scale * q @ k.transpose(0, 2, 1), -np.inf)
        row_max = scores.max(axis=2, keepdims=True, initial=-np.inf)
        empty = ~mask.any(axis=2)
        with np.errstate(invalid="ignore"):
            probs = np.where(mask, np.exp(scores - row_max), 0.0)
        total = probs.sum(axis=2, keepdims=True)
        total[empty] = 1.0
        q_view(case, out, span)[...] = (probs / total) @ v
        row_lse = np.where(empty, case.empty_row_lse, row_max[..., 0] + np.log(total[..., 0]))
        lse_view(case, lse, span)[...] = row_lse
    return out, lse


def dense_backward(case: Case, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Dense float64 backward from the given out and lse (docs/operator.md section 1)."""
    dq = np.zeros(case.q_shape)
    dk = np.zeros(case.kv_shape)
    dv = np.zeros(case.kv_shape)
    lse_all = tensors["softmax_lse"].astype(np.float64)
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        q, do, out = (q_view(case, tensors[n], span).astype(np.float64) for n in ("query", "dout", "attention_out"))
        k = kv_heads_of(case, kv_view(case, tensors["key"], span).astype(np.float64))
        v = kv_heads_of(case, kv_view(case, tensors["value"], span).astype(np.float64))
        lse = lse_view(case, lse_all, span)
        mask = element_mask(case, tensors["block_sparse_mask"], span)
        with np.errstate(invalid="ignore", over="ignore"):
            probs = np.where(mask, np.exp(case.kernel_scale * q @ k.transpose(0, 2, 1) - lse[..., None]), 0.0)
        dsum = (do * out).sum(axis=2, keepdims=True)
        dscores = probs * (do @ v.transpose(0, 2, 1) - dsum)
        q_view(case, dq, span)[...] = case.kernel_scale * dscores @ k
        group = (case.num_kv_heads, case.group_size)
        dk_heads = case.kernel_scale * dscores.transpose(0, 2, 1) @ q
        dv_heads = probs.transpose(0, 2, 1) @ do
        kv_view(case, dk, span)[...] = dk_heads.reshape(*group, *dk_heads.shape[1:]).sum(axis=1)
        kv_view(case, dv, span)[...] = dv_heads.reshape(*group, *dv_heads.shape[1:]).sum(axis=1)
    return {"dq": dq, "dk": dk, "dv": dv}


def dense_kernel_path(case: Case, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Dense fp32 backward on the kernel's precision path (docs/operator.md section 2), in the case dtype."""
    io_dtype = numpy_dtype(case.dtype)
    scale = np.float32(case.kernel_scale)
    grads = {"dq": np.zeros(case.q_shape, np.float32), "dk": np.zeros(case.kv_shape, np.float32)}
    grads["dv"] = np.zeros(case.kv_shape, np.float32)
    lse_all = tensors["softmax_lse"].astype(np.float32)
    for span in case.spans():
        if span.q_len == 0 or span.kv_len == 0:
            continue
        q, do, out = (q_view(case, tensors[n], span).astype(np.float32) for n in ("query", "dout", "attention_out"))
        k = kv_heads_of(case, kv_view(case, tensors["key"], span).astype(np.float32))
        v = kv_heads_of(case, kv_view(case, tensors["value"], span).astype(np.float32))
        scores = (q @ k.transpose(0, 2, 1)) * scale - lse_view(case, lse_all, span)[..., None]
        with np.errstate(invalid="ignore", over="ignore"):
            probs = np.where(element_mask(case, tensors["block_sparse_mask"], span), np.exp(scores), np.float32(0))
        dsum = (do * out).sum(axis=2, dtype=np.float32)[..., None]
        dscores = (probs * (do @ v.transpose(0, 2, 1) - dsum)).astype(io_dtype).astype(np.float32)
        probs = probs.astype(io_dtype).astype(np.float32)
        group = (case.num_kv_heads, case.group_size)
        dk_heads = dscores.transpose(0, 2, 1) @ q
        dv_heads = probs.transpose(0, 2, 1) @ do
        q_view(case, grads["dq"], span)[...] = dscores @ k
        kv_view(case, grads["dk"], span)[...] = dk_heads.reshape(*group, *dk_heads.shape[1:]).sum(axis=1)
        kv_view(case, grads["dv"], span)[...] = dv_heads.reshape(*group, *dv_heads.shape[1:]).sum(axis=1)
    grads["dq"] *= scale
    grads["dk"] *= scale
    return {name: grad.astype(io_dtype) for name, grad in grads.items()}


def significant_mismatch(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Fraction of elements above 1% of the peak whose bits differ (below it, cancellation noise rules)."""
    ours64, theirs64 = ours.astype(np.float64), theirs.astype(np.float64)
    significant = np.abs(theirs64) > 1e-2 * np.abs(theirs64).max(initial=0.0)
    return float(np.mean(ours64[significant] != theirs64[significant])) if significant.any() else 0.0


def random_mask(case: Case, density: float, rng: np.random.Generator) -> np.ndarray:
    return (rng.random(case.mask_shape) < density).astype(np.uint8)


def make_inputs(case: Case, block_mask: np.ndarray | None = None, density: float = 0.6) -> dict[str, np.ndarray]:
    """Random inputs of a case rounded to its dtype, with out and lse from the dense float64 forward."""
    rng = np.random.default_rng(case.seed)
    dtype = numpy_dtype(case.dtype)
    if block_mask is None:
        block_mask = random_mask(case, density, rng)
    query, key, value = (rng.standard_normal(s).astype(dtype) for s in (case.q_shape, case.kv_shape, case.kv_shape))
    dout = rng.standard_normal(case.q_shape).astype(dtype)
    out, lse = dense_forward(case, query, key, value, block_mask)
    return {
        "query": query,
        "key": key,
        "value": value,
        "dout": dout,
        "attention_out": out.astype(dtype),
        "softmax_lse": lse.astype(np.float32).reshape(case.lse_shape_dims),
        "block_sparse_mask": block_mask.astype(np.uint8),
    }


def relative_error(actual: np.ndarray, reference: np.ndarray) -> float:
    scale = max(float(np.abs(reference).max(initial=0.0)), 1e-30)
    return float(np.abs(actual.astype(np.float64) - reference).max(initial=0.0)) / scale


def assert_close_to_reference(case: Case, grads: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> None:
    for name in GRADS:
        grad = grads[name]
        assert grad.dtype == numpy_dtype(case.dtype)
        assert grad.shape == reference[name].shape
        assert np.isfinite(grad.astype(np.float32)).all(), f"{name} has NaN/Inf"
        err = relative_error(grad, reference[name])
        assert err <= TOLERANCE[case.dtype], f"{name}: relative max error {err:.3g}"


# ---- clean emulation vs the float64 reference -----------------------------------------------------

CASES = {
    "mha-fp16": dict(num_heads=2, num_kv_heads=2, head_dim=64, q_seq_len=192, kv_seq_len=256),
    "mha-bf16": dict(dtype="bfloat16", num_heads=2, num_kv_heads=2, head_dim=64, q_seq_len=192, kv_seq_len=128),
    "gqa2": dict(num_heads=4, num_kv_heads=2),
    "gqa4-bf16": dict(dtype="bfloat16", num_heads=4, num_kv_heads=1),
    "gqa4-n2": dict(num_heads=8, num_kv_heads=2, q_seq_len=96, kv_seq_len=160),
    "tails-16x48": dict(block_shape=(16, 48), q_seq_len=257, kv_seq_len=333),
    "tails-80x32-gqa": dict(block_shape=(80, 32), q_seq_len=333, kv_seq_len=257, num_heads=4, num_kv_heads=2),
    "batch2": dict(batch=2, q_seq_len=100, kv_seq_len=70, block_shape=(32, 16)),
    "bnsd-honored": dict(
        batch=2, q_seq_len=160, kv_seq_len=128, actual_seq_lengths=(100, 160), actual_seq_lengths_kv=(128, 33)
    ),
    "bnsd-ignored": dict(
        batch=2,
        q_seq_len=160,
        kv_seq_len=128,
        actual_seq_lengths=(100, 160),
        actual_seq_lengths_kv=(128, 33),
        bnsd_lengths="ignored",
    ),
    "tnd-zero-first-last": dict(
        layout="TND",
        batch=5,
        num_heads=4,
        num_kv_heads=2,
        q_seq_len=130,
        kv_seq_len=97,
        actual_seq_lengths=(0, 130, 40, 25, 0),
        actual_seq_lengths_kv=(0, 97, 0, 64, 0),
        block_shape=(32, 48),
    ),
    "tnd-squeezed-lse-bf16": dict(
        layout="TND",
        dtype="bfloat16",
        batch=3,
        q_seq_len=77,
        kv_seq_len=90,
        actual_seq_lengths=(77, 0, 33),
        actual_seq_lengths_kv=(50, 20, 90),
        lse_shape="squeezed",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_clean_emulation_matches_float64_reference(name):
    case = make_case(name=name, **CASES[name])
    tensors = make_inputs(case)
    assert_close_to_reference(case, emulate(case, tensors), dense_backward(case, tensors))


@pytest.mark.parametrize("name", CASES)
def test_clean_emulation_follows_the_kernel_precision_path(name):
    # Another summation order of the same path differs in a few last bits; a missing cast of P or dS
    # to the input dtype, or an fp32 Dsum from recomputed out, would change a third of the elements.
    case = make_case(name=name, **CASES[name])
    tensors = make_inputs(case)
    grads, kernel = emulate(case, tensors), dense_kernel_path(case, tensors)
    for grad in GRADS:
        assert significant_mismatch(grads[grad], kernel[grad]) < 0.01, grad


def test_heads_of_one_group_with_different_masks_sum_into_dk_dv():
    case = make_case(num_heads=4, num_kv_heads=1, q_seq_len=64, kv_seq_len=128)
    block_mask = np.zeros(case.mask_shape, dtype=np.uint8)
    for head in range(4):
        block_mask[0, head, :, head] = 1  # head h alone selects kv block h
    tensors = make_inputs(case, block_mask)
    grads = emulate(case, tensors)
    assert_close_to_reference(case, grads, dense_backward(case, tensors))
    for head in range(4):
        assert np.abs(grads["dk"][0, 0, head * 32 : (head + 1) * 32].astype(np.float32)).max() > 0


@pytest.mark.parametrize("empty_row_lse", [math.inf, -math.inf, math.nan, 0.0])
def test_empty_rows_get_exact_zero_dq_whatever_their_lse(empty_row_lse):
    case = make_case(q_seq_len=128, kv_seq_len=96, empty_row_lse=empty_row_lse)
    block_mask = np.ones(case.mask_shape, dtype=np.uint8)
    block_mask[0, 0, 1] = 0  # head 0, query block 1 empty
    block_mask[0, 1, 3] = 0  # head 1, query block 3 empty
    tensors = make_inputs(case, block_mask)
    grads = emulate(case, tensors)
    for grad in grads.values():
        assert np.isfinite(grad.astype(np.float32)).all()
    assert not grads["dq"][0, 0, 32:64].any()
    assert not grads["dq"][0, 1, 96:128].any()
    assert grads["dq"][0, 0, :32].any()
    assert_close_to_reference(case, grads, dense_backward(case, tensors))


def test_never_selected_kv_positions_get_exact_zero_dk_dv():
    case = make_case(num_heads=4, num_kv_heads=2, kv_seq_len=120)
    block_mask = np.ones(case.mask_shape, dtype=np.uint8)
    block_mask[..., 1] = 0  # kv block 1 selected by no query head
    block_mask[0, 2:4, :, 3] = 0  # partial tail block 3 of kv head 1 selected by no head of its group
    tensors = make_inputs(case, block_mask)
    grads = emulate(case, tensors)
    for name in ("dk", "dv"):
        assert not grads[name][0, :, 32:64].any()
        assert not grads[name][0, 1, 96:].any()
        assert grads[name][0, 0, 96:].any()


def test_padding_past_actual_lengths_stays_zero():
    case = make_case(**CASES["bnsd-honored"])
    grads = emulate(case, make_inputs(case, density=1.0))
    assert not grads["dq"][0, :, 100:].any()
    assert not grads["dk"][1, :, 33:].any()
    assert not grads["dv"][1, :, 33:].any()


def test_emulation_is_deterministic():
    case = make_case(**CASES["tails-80x32-gqa"])
    tensors = make_inputs(case)
    first, second = emulate(case, tensors), emulate(case, tensors)
    for name in GRADS:
        assert first[name].tobytes() == second[name].tobytes()


def test_input_arrays_are_not_modified():
    case = make_case(**CASES["tnd-zero-first-last"])
    tensors = make_inputs(case)
    before = {name: array.copy() for name, array in tensors.items()}
    for fault in (None, *FAULTS):
        emulate(case, tensors, fault)
    for name, array in tensors.items():
        assert array.tobytes() == before[name].tobytes(), name


# ---- agreement with golden.backward_kernel (another tiling of the same precision path) ------------

try:  # golden.py is written concurrently; these tests wait for its kernel-faithful backward.
    from bsa_cli import golden
except Exception:  # noqa: BLE001
    golden = None
HAS_KERNEL_GOLDEN = hasattr(golden, "backward_kernel")


@pytest.mark.skipif(not HAS_KERNEL_GOLDEN, reason="golden.backward_kernel not written yet")
@pytest.mark.parametrize("name", ["mha-fp16", "gqa4-bf16", "tails-80x32-gqa", "tnd-zero-first-last", "bnsd-honored"])
def test_agrees_with_golden_backward_kernel_to_a_few_ulps(name):
    case = make_case(name=name, **CASES[name])
    tensors = make_inputs(case)
    grads = emulate(case, tensors)
    order = ("dout", "query", "key", "value", "attention_out", "softmax_lse", "block_sparse_mask")
    kernel = dict(zip(GRADS, golden.backward_kernel(case, *(tensors[n] for n in order)), strict=True))
    eps = float(ml_dtypes.finfo(numpy_dtype(case.dtype)).eps)
    for name in GRADS:
        assert kernel[name].dtype == grads[name].dtype
        ours, theirs = grads[name].astype(np.float64), kernel[name].astype(np.float64)
        peak = np.abs(theirs).max(initial=0.0)
        # Different summation order: at most a couple of output ulps apart, relative to the tensor's peak.
        assert np.abs(ours - theirs).max(initial=0.0) <= 4 * eps * max(peak, 1e-30), name
        assert significant_mismatch(grads[name], kernel[name]) < 0.01, name


# ---- planted faults -------------------------------------------------------------------------------


def fault_case() -> tuple[Case, dict[str, np.ndarray]]:
    """A case every fault applies to: GQA, a partial kv tail block, an asymmetric random mask."""
    case = make_case(num_heads=4, num_kv_heads=2, q_seq_len=96, kv_seq_len=112, head_dim=32)
    return case, make_inputs(case, density=0.6)


def test_scale_rounded_shifts_dq_by_the_scale_rounding_error():
    """The subtle fault the bias check exists for: dQ = scale * dS K comes out shifted by at least the
    rounded scale's relative error (about -1.1e-4 for 1/sqrt(128) in float16; the scores' scale moves P
    too), far inside one ULP, while every element stays within the clean tolerance."""
    case, tensors = fault_case()
    assert fault_applies("scale-rounded", case, tensors["block_sparse_mask"])
    scale32 = np.float32(case.kernel_scale)
    error = float(np.float32(scale32.astype(numpy_dtype(case.dtype)))) / float(scale32) - 1
    assert 1e-5 < abs(error) < 2.0**-10
    faulty, reference = emulate(case, tensors, "scale-rounded"), dense_backward(case, tensors)
    g = reference["dq"].astype(np.float64).reshape(-1)
    large = np.abs(g) > 1e-2
    mean_relative = float(np.mean((faulty["dq"].astype(np.float64).reshape(-1)[large] - g[large]) / g[large]))
    assert mean_relative * error > 0 and abs(error) / 2 < abs(mean_relative) < 2.0**-11
    assert relative_error(faulty["dq"], reference["dq"]) < 10 * TOLERANCE[case.dtype]


def test_dv_slightly_scaled_is_dv_times_one_plus_two_to_the_minus_8_and_nothing_else():
    """The small factor a fuzzer meets (issue 31): dV is 1 + 2^-8 times the clean one, to dV's rounding; dQ and dK
    are the clean ones bit for bit."""
    case, tensors = fault_case()
    clean, faulty = emulate(case, tensors), emulate(case, tensors, "dv-slightly-scaled")
    assert np.array_equal(faulty["dq"], clean["dq"]) and np.array_equal(faulty["dk"], clean["dk"])
    f, c = faulty["dv"].astype(np.float64), clean["dv"].astype(np.float64) * (1 + 2**-8)
    large = np.abs(c) > 1e-2
    assert np.allclose(f, c, rtol=2.0**-10, atol=1e-3) and abs(float(np.mean(f[large] / c[large])) - 1) < 2.0**-12


def test_dk_missing_q_block_changes_only_dk_and_only_where_the_site_block_adds_into_it():
    """dK leaves out one (query head, query block)'s partials: dQ and dV are the clean ones bit for bit, and dK
    changes exactly in the kv blocks that pair selects."""
    case, tensors = fault_case()
    clean, faulty = emulate(case, tensors), emulate(case, tensors, "dk-missing-q-block")
    assert np.array_equal(faulty["dq"], clean["dq"]) and np.array_equal(faulty["dv"], clean["dv"])
    site = fault_site(case, tensors["block_sparse_mask"])
    assert site is not None
    y = case.block_shape[1]
    selected = set(np.flatnonzero(mask_view(case, tensors["block_sparse_mask"], site.span)[site.head, site.q_block]))
    dk_f, dk_c = (kv_view(case, a, site.span)[site.head // case.group_size] for a in (faulty["dk"], clean["dk"]))
    moved = {int(j) // y for j in np.flatnonzero((dk_f != dk_c).any(axis=1))}
    assert moved and moved <= selected


def test_lse_row_max_is_the_backward_given_each_rows_largest_score_as_lse():
    """lse-row-max equals the clean emulation run on an lse replaced by each row's largest scaled score over its
    selected columns (the forward's running max, the log-sum never added)."""
    case, tensors = fault_case()
    q = tensors["query"].astype(np.float64)
    k = np.repeat(tensors["key"].astype(np.float64), case.group_size, axis=1)
    x, y = case.block_shape
    mask = np.repeat(np.repeat(tensors["block_sparse_mask"] != 0, x, axis=2), y, axis=3)
    mask = mask[:, :, : case.q_seq_len, : case.kv_seq_len]
    scores = np.where(mask, case.kernel_scale * q @ k.transpose(0, 1, 3, 2), -np.inf).max(axis=3)
    lse = np.asarray(tensors["softmax_lse"], dtype=np.float32).copy().reshape(scores.shape)
    lse = np.where(np.isfinite(scores), scores, lse).astype(np.float32)
    told = emulate(case, {**tensors, "softmax_lse": lse.reshape(np.asarray(tensors["softmax_lse"]).shape)})
    faulty = emulate(case, tensors, "lse-row-max")
    for name in GRADS:
        assert relative_error(faulty[name], told[name].astype(np.float64)) < TOLERANCE[case.dtype], name


def changed(faulty: np.ndarray, clean: np.ndarray) -> bool:
    faulty32, clean32 = faulty.astype(np.float32), clean.astype(np.float32)
    return bool(np.any((faulty32 != clean32) | np.isnan(faulty32)))


@pytest.mark.parametrize("fault", [f for f in FAULTS if f not in ("tile-noise", "scale-rounded", "dv-slightly-scaled")])
def test_every_fault_changes_the_outputs_substantially(fault):
    case, tensors = fault_case()
    assert fault_applies(fault, case, tensors["block_sparse_mask"])
    clean = emulate(case, tensors)
    faulty = emulate(case, tensors, fault)
    reference = dense_backward(case, tensors)
    worst = 0.0
    for name in GRADS:
        assert faulty[name].dtype == clean[name].dtype and faulty[name].shape == clean[name].shape
        values = faulty[name].astype(np.float64)
        if np.isnan(values).any():
            worst = math.inf
            continue
        worst = max(worst, relative_error(faulty[name], reference[name]))
    # 10x the tolerance the clean emulation meets against the same reference.
    assert worst > 10 * TOLERANCE[case.dtype], f"{fault}: worst relative error {worst:.3g}"


def test_nan_row_poisons_exactly_one_dq_row():
    case, tensors = fault_case()
    dq = emulate(case, tensors, "nan-row")["dq"].astype(np.float32)
    nan_rows = np.isnan(dq).any(axis=-1)
    assert nan_rows.sum() == 1 and np.isnan(dq[nan_rows]).all()


def test_tile_noise_stays_in_one_16x16_dq_tile_and_grows_its_error():
    case, tensors = fault_case()
    clean = emulate(case, tensors)
    noisy = emulate(case, tensors, "tile-noise")
    for name in ("dk", "dv"):
        assert noisy[name].tobytes() == clean[name].tobytes()
    changed = np.argwhere(noisy["dq"] != clean["dq"])
    assert len(changed) > 64
    b, n = changed[0][:2]
    assert (changed[:, :2] == (b, n)).all()
    rows, cols = changed[:, 2], changed[:, 3]
    assert rows.max() - rows.min() < 16 and cols.max() - cols.min() < 16
    assert rows.min() % case.block_shape[0] == 0 and cols.min() % 16 == 0
    tile = (b, n, slice(rows.min(), rows.min() + 16), slice(cols.min(), cols.min() + 16))
    assert tensors["block_sparse_mask"][b, n, rows.min() // case.block_shape[0]].any()
    reference = dense_backward(case, tensors)["dq"][tile]
    clean_err = np.abs(clean["dq"][tile].astype(np.float64) - reference).mean()
    noisy_err = np.abs(noisy["dq"][tile].astype(np.float64) - reference).mean()
    assert 3.0 * clean_err < noisy_err < 7.0 * clean_err
    # Still a precision bug, not a gross one.
    assert relative_error(noisy["dq"], dense_backward(case, tensors)["dq"]) < 5 * TOLERANCE[case.dtype]


def outputs_differ(case: Case, tensors: dict[str, np.ndarray], fault: str) -> bool:
    clean = emulate(case, tensors)
    faulty = emulate(case, tensors, fault)
    return any(changed(faulty[n], clean[n]) for n in GRADS)


APPLICABILITY_CASES = {
    "mha-dense-square": (dict(num_heads=2, num_kv_heads=2), 1.0),
    "gqa-tails-random": (dict(num_heads=4, num_kv_heads=2, q_seq_len=100, kv_seq_len=128), 0.5),
    "q-tail-only": (dict(q_seq_len=100, kv_seq_len=64, block_shape=(32, 32)), 1.0),
    "scale-one-nonsquare": (dict(scale=1.0, q_seq_len=64, kv_seq_len=128), 1.0),
    "nothing-selected": (dict(num_heads=4, num_kv_heads=1), 0.0),
    "tnd-zero-lengths": (CASES["tnd-zero-first-last"], 0.5),
    "all-lengths-zero": (
        dict(layout="TND", batch=2, q_seq_len=0, kv_seq_len=0, actual_seq_lengths=(0, 0), actual_seq_lengths_kv=(0, 0)),
        1.0,
    ),
}


@pytest.mark.parametrize("name", APPLICABILITY_CASES)
def test_fault_applies_exactly_when_the_fault_changes_the_outputs(name):
    overrides, density = APPLICABILITY_CASES[name]
    case = make_case(**overrides)
    tensors = make_inputs(case, density=density)
    block_mask = tensors["block_sparse_mask"]
    listed = applicable_faults(case, block_mask)
    for fault in FAULTS:
        assert (fault in listed) == outputs_differ(case, tensors, fault), fault


def test_no_gqa_sum_does_not_apply_when_only_first_heads_of_groups_select():
    case = make_case(num_heads=4, num_kv_heads=2)
    block_mask = np.zeros(case.mask_shape, dtype=np.uint8)
    block_mask[:, ::2] = 1  # heads 0 and 2: the first of each group
    tensors = make_inputs(case, block_mask)
    assert not fault_applies("no-gqa-sum", case, block_mask)
    assert not outputs_differ(case, tensors, "no-gqa-sum")


def test_applicable_faults_names_the_faults_a_case_cannot_show():
    mha_dense = make_case()
    ones = np.ones(mha_dense.mask_shape, dtype=np.uint8)
    listed = applicable_faults(mha_dense, ones)
    assert "no-gqa-sum" not in listed and "drop-tail-block" not in listed
    assert "mask-transposed" not in listed and "block-shift" not in listed
    assert {"dk-no-scale", "lse-base2", "no-dsum", "nan-row", "stale-output", "tile-noise"} <= set(listed)
    # Without the mask only the geometry decides.
    assert "mask-transposed" in applicable_faults(mha_dense)
    assert "no-gqa-sum" in applicable_faults(make_case(num_heads=4, num_kv_heads=2))


def test_unknown_fault_is_refused():
    case, tensors = fault_case()
    with pytest.raises(ValueError, match="unknown fault 'typo'"):
        emulate(case, tensors, "typo")


# ---- the binary contract ----------------------------------------------------------------------------


def write_case_dir(root: Path, case: Case, tensors: dict[str, np.ndarray]) -> Path:
    with store.CaseWriter(root / case.name) as writer:
        inputs = {}
        for name in manifest.INPUT_NAMES:
            array = tensors[name]
            dtype_name = {np.dtype(np.float32): "float32", np.dtype(np.uint8): "uint8"}.get(array.dtype, case.dtype)
            inputs[name] = writer.array(f"inputs/{name}.bin", array, dtype_name)
        built = manifest.build_manifest(case, inputs, {}, {}, {})
        return writer.commit(built, manifest.flat_params(built))


def test_emulate_case_dir_writes_the_gradients_and_status(tmp_path):
    case = make_case(name="round-trip", **{k: v for k, v in CASES["tnd-zero-first-last"].items()})
    tensors = make_inputs(case)
    case_dir = write_case_dir(tmp_path, case, tensors)
    output_dir = tmp_path / "out"
    assert emulate_case_dir(case_dir, output_dir) == 0
    assert (output_dir / STATUS_FILE).read_text() == "0\n"
    expected = emulate(case, tensors)
    built = store.load_manifest(case_dir)
    for name in GRADS:
        found = store.read_array(output_dir, built["outputs"][name])
        assert found.tobytes() == expected[name].tobytes()
    assert sorted(p.name for p in output_dir.iterdir()) == ["dk.bin", "dq.bin", "dv.bin", STATUS_FILE]


def test_emulate_case_dir_plants_a_fault(tmp_path):
    case = make_case(name="faulty", dtype="bfloat16")
    tensors = make_inputs(case)
    case_dir = write_case_dir(tmp_path, case, tensors)
    assert emulate_case_dir(case_dir, tmp_path / "out", fault="stale-output") == 0
    dq = store.read_array(tmp_path / "out", store.load_manifest(case_dir)["outputs"]["dq"])
    assert dq.dtype == ml_dtypes.bfloat16 and not dq.astype(np.float32).any()


def test_rejected_call_writes_only_the_status_and_clears_stale_results(tmp_path):
    case = make_case(name="negative")
    case_dir = write_case_dir(tmp_path, case, make_inputs(case))
    built = dict(store.load_manifest(case_dir).raw)
    built["params"]["mask_type"] = 1
    store.write_json_atomic(case_dir / store.MANIFEST, built)
    output_dir = case_dir / store.OUTPUTS_DIR
    (output_dir / "dq.bin").write_bytes(b"stale")
    assert emulate_case_dir(case_dir, output_dir) == 161002
    lines = (output_dir / STATUS_FILE).read_text().splitlines()
    assert lines[0] == "161002" and "mask_type" in lines[1]
    assert [p.name for p in output_dir.iterdir()] == [STATUS_FILE]


def test_stale_input_is_a_data_error_and_leaves_no_status(tmp_path):
    case = make_case(name="stale")
    case_dir = write_case_dir(tmp_path, case, make_inputs(case))
    path = case_dir / "inputs" / "query.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / STATUS_FILE).write_text("0\n")
    with pytest.raises(DataError, match="sha256"):
        emulate_case_dir(case_dir, output_dir)
    assert not (output_dir / STATUS_FILE).exists()


def test_case_from_manifest_round_trip_gives_the_same_emulation(tmp_path):
    case = dataclasses.replace(make_case(**CASES["bnsd-ignored"]), name="semantics")
    tensors = make_inputs(case)
    case_dir = write_case_dir(tmp_path, case, tensors)
    rebuilt = manifest.case_from_manifest(store.load_manifest(case_dir))
    ours, theirs = emulate(case, tensors), emulate(rebuilt, tensors)
    for name in GRADS:
        assert ours[name].tobytes() == theirs[name].tobytes()
