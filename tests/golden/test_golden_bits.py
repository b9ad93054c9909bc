"""Today's bsa_cli/golden/ and `bsa gen` give the same bits as the golden module of commit 2b40f9e.

`golden_2b40f9e.py` is that module, frozen. Both run here, on the same machine and BLAS, over edge cases
(GQA, partial blocks, odd block shapes, TND with zero lengths, BNSD honored lengths, empty rows with a finite
sentinel, fp16 and bf16, wide rows cut into row tiles): out, lse, the golden gradients in float32 and float64
and the kernel-faithful benchmark must agree byte for byte, and `generate.compute_case` must give what
2b40f9e's gen gave (kv-head groups as cases of their own, golden then benchmark), with one lane and with two.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import pytest

from bsa_cli import golden
from bsa_cli.core import blas
from bsa_cli.core.case import Case, Distribution, Init, Sparsity
from bsa_cli.gen.generate import compute_case
from bsa_cli.gen.settings import GenSettings
from bsa_cli.golden import compute, numerics, walk
from bsa_cli.inputs import make_mask, make_tensors
from tests import golden_2b40f9e as before
from tests.helpers import case_factory

CASES = {
    "gqa-tails-fp16": dict(
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        q_seq_len=200,
        kv_seq_len=170,
        block_shape=(16, 48),
        sparsity=Sparsity("random", density=0.6),
    ),
    "gqa4-bf16-causal": dict(
        dtype="bfloat16",
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
        q_seq_len=300,
        kv_seq_len=300,
        block_shape=(64, 64),
        sparsity=Sparsity("causal"),
    ),
    "tnd-zero-lengths": dict(
        layout="TND",
        batch=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        actual_seq_lengths=(0, 37, 20, 50),
        actual_seq_lengths_kv=(45, 0, 29, 61),
        block_shape=(16, 48),
        sparsity=Sparsity("random", density=0.7),
    ),
    "bnsd-honored-empty-rows": dict(
        batch=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        q_seq_len=80,
        kv_seq_len=96,
        actual_seq_lengths=(50, 80),
        actual_seq_lengths_kv=(70, 33),
        block_shape=(16, 32),
        empty_row_lse=1e300,
        sparsity=Sparsity("random", density=0.8, empty_rows=(1,)),
    ),
    "wide-uniform-fp16": dict(
        num_heads=2,
        num_kv_heads=2,
        head_dim=128,
        q_seq_len=256,
        kv_seq_len=640,
        block_shape=(128, 128),
        sparsity=Sparsity("strided", window=2, stride=2),
        init=Init(dout=Distribution("uniform", low=-3.0, high=3.0)),
    ),
}


table_case = case_factory(
    tnd_sizes_from_lengths=True, source="test", q_seq_len=64, kv_seq_len=64, block_shape=(16, 16), seed=7
)


def make_case(name: str) -> Case:
    fields = CASES[name]
    # A scale float32 holds exactly: 2b40f9e computed with the scale as given, today's code with the scale
    # rounded to float32 as the kernel receives it; the bits compared are those of one and the same scale.
    scale = float(np.float32(1 / math.sqrt(fields.get("head_dim", 32))))
    return table_case(name, scale=scale, **fields)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def gen_before(case: Case, precision: str) -> list[np.ndarray]:
    """What 2b40f9e's `generate.compute_case` computed: each kv-head group as a case, golden then benchmark."""
    tensors = make_tensors(case)
    mask = make_mask(case)
    size = case.group_size
    parts = []
    for g in range(case.num_kv_heads):
        heads, kv = slice(g * size, (g + 1) * size), slice(g, g + 1)
        sub = dataclasses.replace(case, num_heads=size, num_kv_heads=1)
        t = {
            name: np.ascontiguousarray(tensors[name][:, kv if name in ("key", "value") else heads])
            for name in ("dout", "query", "key", "value")
        }
        sub_mask = np.ascontiguousarray(mask[:, heads])
        inputs = (t["dout"], t["query"], t["key"], t["value"])
        out, lse, *gold = before.forward_backward(sub, *inputs, sub_mask, precision)
        lse = lse.reshape(sub.lse_shape_dims)
        bench = before.backward_kernel(sub, *inputs, out, lse, sub_mask)
        parts.append([out, lse, *gold, *bench])
    return [np.concatenate(arrays, axis=1) for arrays in zip(*parts, strict=True)]


def gen_now(case: Case, precision: str, jobs: int) -> list[np.ndarray]:
    tensors, gold, bench = compute_case(case, GenSettings(precision, jobs))
    return [tensors["attention_out"], tensors["softmax_lse"], *gold.values(), *bench.values()]


@pytest.fixture(autouse=True)
def one_blas_thread() -> Iterator[None]:
    """Both modules on one BLAS thread, as bsa's walks always run: OpenBLAS's bits can change with its thread
    count (bsa_cli/core/blas.py), and 2b40f9e's module left it at the machine's."""
    with blas.one_thread_each():
        yield


@pytest.fixture(autouse=True)
def walks_in_threads_however_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let `-j 2` run the walks of these small cases in threads (they would stay in one thread otherwise)."""
    monkeypatch.setattr(compute, "_THREADS_MIN_ROW_FLOPS", 0)


NAMES = ("attention_out", "softmax_lse", "golden dq", "golden dk", "golden dv", "bench dq", "bench dk", "bench dv")


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("name", CASES)
def test_gen_writes_the_bits_of_2b40f9e(name: str, precision: str) -> None:
    case = make_case(name)
    expected = gen_before(case, precision)
    for jobs in (1, 2):
        for label, a, b in zip(NAMES, gen_now(case, precision, jobs), expected, strict=True):
            assert same_bits(a, b), f"{name} {precision} -j {jobs}: {label} differs"


def test_gen_writes_the_bits_of_2b40f9e_in_row_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    case = make_case("wide-uniform-fp16")
    for tiles, products in ((walk, numerics), (before, before)):  # tiles of 32 rows, dK/dV shares of two blocks
        monkeypatch.setattr(tiles, "_TILE_ELEMENTS", 32 * 640)
        monkeypatch.setattr(products, "_PRODUCT_ELEMENTS", 2 * 128 * 128)
    monkeypatch.setattr(numerics, "_CHUNK_ELEMENTS", 700)  # elementwise steps row by row (rows of 384 or 640)
    expected = gen_before(case, "float32")
    for jobs in (1, 3):
        for label, a, b in zip(NAMES, gen_now(case, "float32", jobs), expected, strict=True):
            assert same_bits(a, b), f"-j {jobs}: {label} differs"


@pytest.mark.parametrize("name", CASES)
def test_separate_passes_give_the_bits_of_2b40f9e(name: str) -> None:
    """`forward`, `backward` (float32, float64) and `backward_kernel` on their own, from given out and lse."""
    case = make_case(name)
    t = make_tensors(case)
    mask = make_mask(case)
    qkv = (t["query"], t["key"], t["value"])
    forward_now, forward_before = golden.forward(case, *qkv, mask), before.forward(case, *qkv, mask)
    assert all(same_bits(a, b) for a, b in zip(forward_now, forward_before, strict=True))
    io = t["query"].dtype
    with np.errstate(over="ignore", under="ignore"):
        out, lse = forward_now[0].astype(io), forward_now[1].astype(np.float32)
    given = (t["dout"], *qkv, out, lse, mask)
    for precision in (np.float32, np.float64):
        now, then = golden.backward(case, *given, precision), before.backward(case, *given, precision)
        assert all(same_bits(a, b) for a, b in zip(now, then, strict=True)), precision
    now, then = golden.backward_kernel(case, *given), before.backward_kernel(case, *given)
    assert all(same_bits(a, b) for a, b in zip(now, then, strict=True))


def test_gen_writes_the_bits_of_2b40f9e_in_rounds_of_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    case = make_case("tnd-zero-lengths")  # 3 entries with rows (one without kv) x 2 kv heads: 6 golden walks
    monkeypatch.setattr(compute, "_WALKS_PER_ROUND", 4)
    expected = gen_before(case, "float32")
    for jobs in (1, 2):
        for label, a, b in zip(NAMES, gen_now(case, "float32", jobs), expected, strict=True):
            assert same_bits(a, b), f"-j {jobs}: {label} differs"
