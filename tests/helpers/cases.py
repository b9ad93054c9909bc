"""`Case` factories: `make_case` (the house case: small, BNSD, float16) and `case_factory` (a file's own
defaults over it); `scale=None` means 1/sqrt(head_dim). And the small specs many tests write: `SPEC`, `BASE`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bsa_cli.core.case import Case

CASE_DEFAULTS: dict[str, Any] = dict(
    source="cases/test.yaml",
    layout="BNSD",
    dtype="float16",
    batch=1,
    num_heads=2,
    num_kv_heads=2,
    head_dim=32,
    q_seq_len=96,
    kv_seq_len=80,
    actual_seq_lengths=None,
    actual_seq_lengths_kv=None,
    block_shape=(32, 16),
    scale=0.17,
    seed=1,
)
"""The house case: small, BNSD, float16, a partial last block on both axes."""


def make_case(name: str = "c", **fields: Any) -> Case:
    """Return a `Case`: CASE_DEFAULTS, then `fields`; `scale=None` stands for 1/sqrt(head_dim)."""
    values = {**CASE_DEFAULTS, "name": name, **fields}
    if values["scale"] is None:
        values["scale"] = 1 / math.sqrt(values["head_dim"])
    return Case(**values)


def case_factory(*, tnd_sizes_from_lengths: bool = False, **defaults: Any) -> Callable[..., Case]:
    """Return a `make_case` with a file's own defaults over CASE_DEFAULTS; a call's fields override both.

    With `tnd_sizes_from_lengths`, a TND case the call does not size itself gets batch = the number of
    entries, and q_seq_len, kv_seq_len = the largest lengths.
    """

    def make(name: str | None = None, **fields: Any) -> Case:
        values = {**defaults, **fields}
        if name is not None:
            values["name"] = name
        if tnd_sizes_from_lengths and values.get("layout") == "TND":
            sizes = dict(
                batch=len(values["actual_seq_lengths"]),
                q_seq_len=max(values["actual_seq_lengths"]),
                kv_seq_len=max(values["actual_seq_lengths_kv"]),
            )
            values.update({key: value for key, value in sizes.items() if key not in fields})
        return make_case(**values)

    return make


SPEC = {
    "defaults": {"head_dim": 16, "block_shape": [16, 16], "num_heads": 2, "seed": 5, "dtype": "fp16"},
    "cases": [
        {"name": "t-bnsd-tail", "q_seq_len": 40, "kv_seq_len": 24, "sparsity": {"pattern": "causal"}},
        {
            "name": "t-tnd-gqa",
            "layout": "TND",
            "dtype": "bf16",
            "actual_seq_lengths": [16, 0, 24],
            "num_kv_heads": 1,
            "sparsity": {"pattern": "random", "density": 0.6},
        },
        {"name": "t-neg-dtype", "dtype": "float32", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
        {"name": "t-neg-tnd", "layout": "TND", "q_seq_len": 16, "expect": "ACLNN_ERR_PARAM_INVALID"},
    ],
}
"""A small spec of run's tests: a tail, TND GQA with an empty entry, and two negative cases."""

BASE = {"name": "c", "num_heads": 1, "head_dim": 16, "q_seq_len": 32, "block_shape": [16, 16], "dtype": "fp16"}
"""One tiny valid case as a spec writes it (the hostile and untrusted tests change one key of it)."""
