"""Write the explicit block masks of cases/upstream.yaml (cases/upstream-masks/*.npy).

The TND tests of op-plugin's test_npu_block_sparse_attention_backward.py (Ascend/op-plugin
7145df39, `_make_tnd_gqa_case(full_mask=False)`) select, for every batch entry b, query head n and
query block i, kv block (i + b + n) mod nkv_b, and also kv block (i + b + n + 1) mod nkv_b when
nkv_b > 1 and i + n is even, where nkv_b = ceil(kv length of b / Y); the mask has
ceil(max q length / X) query blocks and ceil(max kv length / Y) kv blocks. The BNSD sparse test
(`..._bnsd_sparse_mask_cpu_compare`) selects kv block i mod nkv for query block i. This script
builds those patterns (its own code, from that description) so the suite runs the same masks:

    python scripts/upstream_masks.py        # rewrites cases/upstream-masks/
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "cases" / "upstream-masks"

TND_GQA_Q = [355, 17, 41, 83, 129, 211, 7, 53, 97, 151, 233, 301, 19]
TND_GQA_KV = [533, 23, 67, 101, 173, 257, 11, 89, 137, 199, 281, 349, 31]

TND_SPARSE = {
    # name: (N1, block X, block Y, q lengths, kv lengths)
    "opplugin-tnd-gqa-sparse": (12, 128, 128, TND_GQA_Q, TND_GQA_KV),
    "opplugin-tnd-gqa-uneven": (4, 128, 128, [1, 64, 129, 17], [128, 3, 257, 65]),
    "opplugin-tnd-gqa-group4": (8, 128, 128, [96, 137], [111, 259]),
    "opplugin-tnd-mqa": (8, 128, 128, [65, 130], [129, 33]),
    "opplugin-tnd-gqa-tail-64x128": (4, 64, 128, [65, 127, 3], [129, 11, 64]),
}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tnd_sparse(heads: int, x: int, y: int, q: list[int], kv: list[int]) -> np.ndarray:
    mask = np.zeros((len(q), heads, ceil_div(max(q), x), ceil_div(max(kv), y)), dtype=np.uint8)
    for b, kv_len in enumerate(kv):
        nkv = ceil_div(kv_len, y)
        for n in range(heads):
            for i in range(mask.shape[2]):
                mask[b, n, i, (i + b + n) % nkv] = 1
                if nkv > 1 and (i + n) % 2 == 0:
                    mask[b, n, i, (i + b + n + 1) % nkv] = 1
    return mask


def bnsd_diagonal(nq: int, nkv: int) -> np.ndarray:
    mask = np.zeros((nq, nkv), dtype=np.uint8)
    for i in range(nq):
        mask[i, i % nkv] = 1
    return mask


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, (heads, x, y, q, kv) in TND_SPARSE.items():
        np.save(OUT / f"{name}.npy", tnd_sparse(heads, x, y, q, kv))
    # BNSD S=256, block [32, 128]: 8 query blocks, 2 kv blocks, the same for every batch entry and head.
    np.save(OUT / "opplugin-bnsd-sparse-32x128.npy", bnsd_diagonal(8, 2))


if __name__ == "__main__":
    main()
