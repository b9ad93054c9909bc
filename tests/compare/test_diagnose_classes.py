"""The diagnosis names the kind of a fault, not one planted fault: faults of each kind planted directly in
clean device outputs, varied beyond the reference device's (other tensors, other factors, other rows,
heads and tiles, other shifts), over cases of several shapes. Clean outputs of the same cases get none.

docs/compare.md, "Diagnosis", holds the table these tests assert (true kind -> top kind)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import api, compare
from bsa_cli.core.case import Case
from bsa_cli.core.layout import kv_view, mask_view, q_view
from bsa_cli.devices import reference
from bsa_cli.gen.generate import generate_case
from bsa_cli.specs import load_specs
from tests.helpers import CASES

Grads = dict[str, np.ndarray]

SPECS = """
defaults: {head_dim: 64, seed: 11}
cases:
  - name: classes-bnsd
    dtype: fp16
    batch: 2
    num_heads: 2
    q_seq_len: 256
    block_shape: [64, 64]
    sparsity: {pattern: random, density: 0.6}
  - name: classes-tnd-gqa
    layout: TND
    dtype: bf16
    num_heads: 4
    num_kv_heads: 2
    actual_seq_lengths: [130, 200]
    block_shape: [64, 64]
    sparsity: {pattern: random, density: 0.7}
  - name: classes-gqa-1024
    dtype: fp16
    num_heads: 4
    num_kv_heads: 2
    head_dim: 128
    q_seq_len: 1024
    block_shape: [128, 128]
    sparsity: {pattern: random, density: 0.3}
  - name: classes-tnd-2048
    layout: TND
    dtype: bf16
    num_heads: 2
    actual_seq_lengths: [2048, 700]
    block_shape: [128, 64]
    sparsity: {pattern: causal}
"""
"""Two small cases for the fast tests, two larger ones (S 1024 GQA, S 2048 TND) for the slow sweep."""

RECOMPUTED = ("tail-block", "block-selection", "gqa-head-mapping", "gqa-group-sum", "softmax-lse", "softmax-grad")
"""Kinds a recomputed hypothesis names: a fault no hypothesis recomputes must not be named one of them."""


# ---- where to plant: a selected region of a case ---------------------------------------------------


def _spans(case: Case) -> list:
    return [s for s in case.spans() if s.q_len and s.kv_len]


def _selected_kv(case: Case, inputs: Mapping[str, np.ndarray]) -> tuple[object, int, int]:
    """(span, kv head, kv block) of the first kv block some (query head, query block) pair selects."""
    for span in _spans(case):
        mask = mask_view(case, np.asarray(inputs["block_sparse_mask"]), span)  # [N1, nQ, nKV]
        per_kv = mask.any(axis=1).reshape(case.num_kv_heads, case.group_size, -1).any(axis=1)
        heads, blocks = np.nonzero(per_kv)
        if heads.size:
            middle = heads.size // 2
            return span, int(heads[middle]), int(blocks[middle])
    raise AssertionError("no selected kv block")


def _selected_rows(case: Case, inputs: Mapping[str, np.ndarray], head: int = 0) -> tuple[object, np.ndarray]:
    """(span, query rows of `head` that select some kv block) of the first span with such rows."""
    x = case.block_shape[0]
    for span in _spans(case):
        mask = mask_view(case, np.asarray(inputs["block_sparse_mask"]), span)
        blocks = np.flatnonzero(mask[head].any(axis=1))
        rows = np.concatenate([np.arange(b * x, min((b + 1) * x, span.q_len)) for b in blocks]) if blocks.size else []
        if len(rows) >= 8:
            return span, np.asarray(rows)
    raise AssertionError("no selected rows")


def _copy(grads: Mapping[str, np.ndarray]) -> Grads:
    return {name: array.copy() for name, array in grads.items()}


def _cast(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(like.dtype)


# ---- the planted faults ----------------------------------------------------------------------------


def rows_swapped_across_heads(case, inputs, grads):
    """dq row r of query head 0 and the same row of head 1 written to each other's places."""
    if case.num_heads < 2:
        return None
    span, rows = _selected_rows(case, inputs, 0)
    out = _copy(grads)
    view, clean = q_view(case, out["dq"], span), q_view(case, grads["dq"], span)
    row = int(rows[len(rows) // 2])
    view[0, row], view[1, row] = clean[1, row], clean[0, row]
    return out


def rows_swapped_far_apart(case, inputs, grads):
    """dq's first and last selected rows of head 0 exchanged."""
    span, rows = _selected_rows(case, inputs, 0)
    out = _copy(grads)
    view, clean = q_view(case, out["dq"], span), q_view(case, grads["dq"], span)
    a, b = int(rows[1]), int(rows[-2])
    view[0, a], view[0, b] = clean[0, b], clean[0, a]
    return out


def several_row_pairs(case, inputs, grads):
    """Three pairs of dq rows of head 0 exchanged, in different query blocks."""
    span, rows = _selected_rows(case, inputs, 0)
    out = _copy(grads)
    view, clean = q_view(case, out["dq"], span), q_view(case, grads["dq"], span)
    picks = rows[np.linspace(0, rows.size - 1, 6).astype(int)]
    for a, b in zip(picks[0::2], picks[1::2], strict=True):
        view[0, a], view[0, b] = clean[0, b], clean[0, a]
    return out


def _scaled(name: str, factor: Callable[[Case], float]):
    def plant(case, inputs, grads):
        out = dict(grads)
        out[name] = _cast(np.asarray(grads[name], dtype=np.float64) * factor(case), grads[name])
        return out

    plant.__doc__ = f"{name} multiplied by a constant factor"
    return plant


def _mask_read(how: str):
    """The device reads the block mask shifted (lse and out stay the forward's)."""

    def plant(case, inputs, grads):
        mask = np.asarray(inputs["block_sparse_mask"])
        read = np.zeros_like(mask)
        if how == "kv+2":  # kv block j reads the selection of block j - 2
            read[..., 2:] = mask[..., :-2]
        elif how == "q-1":  # query block i reads the selection of block i + 1
            read[..., :-1, :] = mask[..., 1:, :]
        if np.array_equal(read != 0, mask != 0):
            return None
        return reference.emulate(case, {**inputs, "block_sparse_mask": read}, order_seed=7)

    return plant


def _tiles_corrupted(name: str, count: int):
    def plant(case, inputs, grads):
        span, head, block = _selected_kv(case, inputs)
        out = _copy(grads)
        view = kv_view(case, out[name], span)[head]
        y = case.block_shape[1]
        rng = np.random.default_rng(3)
        for k in range(count):
            tile = view[block * y + 16 * k : block * y + 16 * (k + 1), 16 * k : 16 * (k + 1)]
            size = float(np.abs(tile.astype(np.float64)).mean()) or 1.0
            tile[:] = _cast(tile.astype(np.float64) + size * rng.standard_normal(tile.shape), tile)
        return out

    plant.__doc__ = f"{count} 16x16 tile(s) of {name} corrupted"
    return plant


def dv_block_left_zero(case, inputs, grads):
    """A whole selected kv block of dv never written."""
    span, head, block = _selected_kv(case, inputs)
    out = _copy(grads)
    y = case.block_shape[1]
    kv_view(case, out["dv"], span)[head, block * y : (block + 1) * y] = 0
    return out


def dk_block_nan(case, inputs, grads):
    """A selected kv block of dk written NaN."""
    span, head, block = _selected_kv(case, inputs)
    out = _copy(grads)
    y = case.block_shape[1]
    kv_view(case, out["dk"], span)[head, block * y : (block + 1) * y] = np.nan
    return out


def dk_entry_shifted(case, inputs, grads):
    """The last batch entry's dk rows written 3 rows late (TND tokens)."""
    if case.layout != "TND" or len(_spans(case)) < 2:
        return None
    span = _spans(case)[-1]
    out = _copy(grads)
    rows = out["dk"][span.kv_start : span.kv_start + span.kv_len]
    rows[3:] = grads["dk"][span.kv_start : span.kv_start + span.kv_len - 3]
    rows[:3] = 0
    return out


def dv_written_bsnd(case, inputs, grads):
    """dv's [B, S, N, D] bytes read as [B, N, S, D]."""
    if case.layout != "BNSD" or case.num_kv_heads < 2:
        return None
    out = dict(grads)
    dv = grads["dv"]
    out["dv"] = np.ascontiguousarray(dv.transpose(0, 2, 1, 3)).reshape(dv.shape)
    return out


def one_pair_lost(case, inputs, grads):
    """A kv block two or more pairs select loses one pair's dK/dV partial (that pair computed alone)."""
    block_mask = np.asarray(inputs["block_sparse_mask"])
    for span in _spans(case):
        mask = mask_view(case, block_mask, span)  # [N1, nQ, nKV]
        for kv_head in range(case.num_kv_heads):
            group = mask[kv_head * case.group_size : (kv_head + 1) * case.group_size]
            counts = group.sum(axis=(0, 1))
            shared = np.flatnonzero(counts >= 2)
            if not shared.size:
                continue
            block = int(shared[shared.size // 2])
            member, q_block = (int(i[0]) for i in np.nonzero(group[:, :, block]))
            alone = np.zeros_like(block_mask)
            alone[span.batch, kv_head * case.group_size + member, q_block, block] = 1
            part = reference.emulate(case, {**inputs, "block_sparse_mask": alone})
            out = dict(grads)
            for name in ("dk", "dv"):
                out[name] = _cast(np.asarray(grads[name], np.float64) - np.asarray(part[name], np.float64), grads[name])
            return out
    return None


def _kv_rows_swapped(name: str, across: bool):
    """Two rows of a selected kv block of dk or dv exchanged: the block's first two, or its first row and
    the same row of the next kv head."""

    def plant(case, inputs, grads):
        span, head, block = _selected_kv(case, inputs)
        row = block * case.block_shape[1]
        if (across and case.num_kv_heads < 2) or row + 1 >= span.kv_len:
            return None
        out = _copy(grads)
        view, clean = kv_view(case, out[name], span), kv_view(case, grads[name], span)
        other, other_row = ((head + 1) % case.num_kv_heads, row) if across else (head, row + 1)
        view[head, row], view[other, other_row] = clean[other, other_row], clean[head, row]
        return out

    return plant


def dq_block_left_zero(case, inputs, grads):
    """A selected query block of dq (head 0) never written."""
    span, rows = _selected_rows(case, inputs, 0)
    out = _copy(grads)
    x = case.block_shape[0]
    block = int(rows[len(rows) // 2]) // x
    q_view(case, out["dq"], span)[0, block * x : (block + 1) * x] = 0
    return out


def dv_row_nan(case, inputs, grads):
    """One row of a selected kv block of dv written NaN."""
    span, head, block = _selected_kv(case, inputs)
    out = _copy(grads)
    kv_view(case, out["dv"], span)[head, block * case.block_shape[1]] = np.nan
    return out


def dq_tiles_in_two_blocks(case, inputs, grads):
    """A 16x16 tile of dq (head 0) corrupted in the first and in a late selected query block."""
    span, rows = _selected_rows(case, inputs, 0)
    out = _copy(grads)
    view = q_view(case, out["dq"], span)
    rng = np.random.default_rng(1)
    for row in (int(rows[0]), int(rows[-16]) if rows.size > 32 else int(rows[0])):
        tile = view[0, row : row + 16, 16:32]
        size = float(np.abs(tile.astype(np.float64)).mean()) or 1.0
        tile[:] = _cast(tile.astype(np.float64) + size * rng.standard_normal(tile.shape), tile)
    return out


PLANTS: dict[str, tuple[Callable, str | None]] = {
    "rows swapped across heads": (rows_swapped_across_heads, "rows-permuted"),
    "rows swapped far apart": (rows_swapped_far_apart, "rows-permuted"),
    "three row pairs swapped": (several_row_pairs, "rows-permuted"),
    "dk x 2": (_scaled("dk", lambda c: 2.0), "scale"),
    "dv x 1/2": (_scaled("dv", lambda c: 0.5), "scale"),
    "dv x -1": (_scaled("dv", lambda c: -1.0), "scale"),
    "dk x scale^2": (_scaled("dk", lambda c: float(c.kernel_scale) ** 2), "scale"),
    "kv block j reads j - 2": (_mask_read("kv+2"), None),
    "query block i reads i + 1": (_mask_read("q-1"), None),
    "one dk tile corrupted": (_tiles_corrupted("dk", 1), "tile-local"),
    "two dv tiles corrupted": (_tiles_corrupted("dv", 2), "tile-local"),
    "a dv kv block left zero": (dv_block_left_zero, "not-written"),
    "a dk block NaN": (dk_block_nan, "non-finite"),
    "a TND entry of dk 3 rows late": (dk_entry_shifted, "length-boundary"),
    "dv written as BSND": (dv_written_bsnd, "layout"),
    "one pair's dK/dV partial lost": (one_pair_lost, "accumulation-race"),
    "dk rows swapped in a kv block": (_kv_rows_swapped("dk", False), "rows-permuted"),
    "dv rows swapped across kv heads": (_kv_rows_swapped("dv", True), "rows-permuted"),
    "dq x 1/2": (_scaled("dq", lambda c: 0.5), "scale"),
    "dk x -1": (_scaled("dk", lambda c: -1.0), "scale"),
    "dq x 1/scale": (_scaled("dq", lambda c: 1 / float(c.kernel_scale)), "scale"),
    "a dq block left zero": (dq_block_left_zero, "not-written"),
    "a dv row NaN": (dv_row_nan, "non-finite"),
    "dq tiles in two blocks": (dq_tiles_in_two_blocks, "tile-local"),
}
"""Each planted fault and its true kind (None: a misreading no hypothesis recomputes; the diagnosis must
then not name a recomputed kind other than block-selection with a score of 0.8 or more)."""


def _loaded(tmp_path: Path, spec: Path, name: str):
    (case,) = [c for c in load_specs([spec]) if c.name == name]
    loaded = api.load_case(generate_case(case, tmp_path / "cases"))
    return case, loaded, reference.emulate(case, loaded.inputs, order_seed=7)


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "classes.yaml"
    spec.write_text(SPECS)
    return spec


def judged(case: Case, loaded, grads: Mapping[str, np.ndarray], plant: str) -> tuple[str, str, float] | None:
    """(verdict, top kind, its score) of a planted fault, or None where it does not apply."""
    planted = PLANTS[plant][0](case, loaded.inputs, grads)
    if planted is None:
        return None
    result = api.judge(loaded, planted["dq"], planted["dk"], planted["dv"])
    top = result.diagnosis[0] if result.diagnosis else None
    return result.verdict, top.kind if top else "-", top.score if top else 0.0


def right(plant: str, verdict: str, top: str, score: float) -> bool:
    """Whether the diagnosis of a planted fault is right: its true kind first (a PASS has nothing to name)."""
    kind = PLANTS[plant][1]
    if verdict == compare.PASS:
        return top == "-"
    if kind is None:
        return top == "block-selection" or top not in RECOMPUTED or score < 0.8
    return top == kind


def _sweep(case: Case, loaded, grads, plants) -> list[str]:
    wrong = []
    for plant in plants:
        outcome = judged(case, loaded, grads, plant)
        if outcome is not None and not right(plant, *outcome):
            wrong.append(f"{case.name} {plant}: {outcome}")
    return wrong


@pytest.mark.parametrize("name", ["classes-bnsd", "classes-tnd-gqa"])
def test_every_planted_class_names_its_kind_on_small_cases(tmp_path, name):
    case, loaded, grads = _loaded(tmp_path, _spec(tmp_path), name)
    clean = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert clean.verdict == compare.PASS and clean.diagnosis == () and clean.hypotheses == ()
    assert _sweep(case, loaded, grads, PLANTS) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["classes-gqa-1024", "classes-tnd-2048"])
def test_every_planted_class_names_its_kind_on_larger_cases(tmp_path, name):
    case, loaded, grads = _loaded(tmp_path, _spec(tmp_path), name)
    clean = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert clean.verdict == compare.PASS and clean.diagnosis == ()
    assert _sweep(case, loaded, grads, PLANTS) == []


@pytest.mark.slow  # smoke about 5 s, each half of stress about 25 s
@pytest.mark.parametrize(("suite", "dtype"), [("smoke", None), ("stress", "float16"), ("stress", "bfloat16")])
def test_every_planted_class_names_its_kind_on_a_suite(tmp_path, suite, dtype):
    wrong, swept = [], 0
    for spec_case in load_specs([CASES / f"{suite}.yaml"]):
        if not spec_case.expect.ok or dtype not in (None, spec_case.dtype):
            continue
        loaded = api.load_case(generate_case(spec_case, tmp_path / "cases"))
        grads = reference.emulate(spec_case, loaded.inputs, order_seed=7)
        clean = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
        assert clean.verdict == compare.PASS and clean.diagnosis == (), spec_case.name
        wrong += _sweep(spec_case, loaded, grads, PLANTS)
        swept += 1
    assert swept >= 5 and wrong == []
