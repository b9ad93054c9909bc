"""`causal_alignment`: where the diagonal of causal, sliding-window and strided masks sits when Sq != Skv.

Block masks are checked against a token-level brute force written here, independent of `inputs.py`: a
block (i, j) is selected when some query token t of block i and some key token k of block j have
k <= t + offset (offset 0 for top-left, Skv - Sq for bottom-right), counting only each batch entry's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from bsa_cli.core.case import Case, Sparsity
from bsa_cli.core.errors import SpecError
from bsa_cli.gen.generate import generate_case
from bsa_cli.gen.schedule import pattern_counts
from bsa_cli.inputs import make_mask, mask_counts
from bsa_cli.specs import load_specs
from tests.helpers import case_factory

make_case = case_factory(
    tnd_sizes_from_lengths=True,
    name="c",
    source="t",
    num_kv_heads=1,
    head_dim=8,
    q_seq_len=100,
    kv_seq_len=230,
    block_shape=(32, 48),
    scale=0.25,
    seed=3,
)


def brute_force(q_len: int, kv_len: int, x: int, y: int, n_q: int, n_kv: int, bottom_right: bool) -> np.ndarray:
    """Return the [n_q, n_kv] blocks holding at least one (query, key) token pair a causal mask keeps."""
    offset = kv_len - q_len if bottom_right else 0
    blocks = np.zeros((n_q, n_kv), dtype=bool)
    for t in range(q_len):
        for k in range(kv_len):
            if k <= t + offset:
                blocks[t // x, k // y] = True
    return blocks


def real_region(q_len: int, kv_len: int, x: int, y: int, n_q: int, n_kv: int) -> np.ndarray:
    rows = np.arange(n_q) * x < q_len
    cols = np.arange(n_kv) * y < kv_len
    return rows[:, None] & cols[None, :]


BOTTOM_RIGHT_CASES = {
    "sq-below-skv": dict(q_seq_len=100, kv_seq_len=230, block_shape=(32, 48)),
    "sq-above-skv": dict(q_seq_len=230, kv_seq_len=100, block_shape=(32, 48)),
    "sq-above-skv-wide-rows": dict(q_seq_len=300, kv_seq_len=70, block_shape=(64, 16)),
    "bnsd-lengths": dict(
        batch=3,
        q_seq_len=200,
        kv_seq_len=150,
        actual_seq_lengths=(200, 37, 5),
        actual_seq_lengths_kv=(150, 150, 90),
        block_shape=(16, 32),
    ),
    "tnd-varying": dict(
        layout="TND",
        actual_seq_lengths=(0, 50, 37, 70, 200, 45),
        actual_seq_lengths_kv=(30, 0, 130, 200, 70, 45),
        block_shape=(32, 16),
    ),
}


@pytest.mark.parametrize("name", BOTTOM_RIGHT_CASES)
def test_bottom_right_causal_blocks_match_the_token_level_brute_force(name: str) -> None:
    case = make_case(sparsity=Sparsity("causal", causal_alignment="bottom_right"), **BOTTOM_RIGHT_CASES[name])
    mask = make_mask(case)
    x, y = case.block_shape
    _, heads, n_q, n_kv = mask.shape
    for b, (q_len, kv_len) in enumerate(zip(case.q_lengths(), case.kv_lengths(), strict=True)):
        expected = brute_force(q_len, kv_len, x, y, n_q, n_kv, bottom_right=True)
        for n in range(heads):
            assert np.array_equal(mask[b, n] != 0, expected), f"{name}: batch {b} head {n}"


@pytest.mark.parametrize("name", BOTTOM_RIGHT_CASES)
def test_top_left_is_the_block_diagonal_and_the_token_rule_when_blocks_are_square(name: str) -> None:
    fields = dict(BOTTOM_RIGHT_CASES[name])
    case = make_case(sparsity=Sparsity("causal"), **fields)
    mask = make_mask(case)
    n_q, n_kv = mask.shape[2:]
    assert np.array_equal(mask[:, :] != 0, np.broadcast_to(np.tri(n_q, n_kv, dtype=bool), mask.shape))
    square = make_case(sparsity=Sparsity("causal", causal_alignment="top_left"), **{**fields, "block_shape": (32, 32)})
    mask = make_mask(square)
    n_q, n_kv = mask.shape[2:]
    for b, (q_len, kv_len) in enumerate(zip(square.q_lengths(), square.kv_lengths(), strict=True)):
        region = real_region(q_len, kv_len, 32, 32, n_q, n_kv)
        expected = brute_force(q_len, kv_len, 32, 32, n_q, n_kv, bottom_right=False)
        assert np.array_equal((mask[b, 0] != 0) & region, expected), f"{name}: batch {b}"


@pytest.mark.parametrize("pattern", ["sliding_window", "strided"])
def test_windows_follow_the_bottom_right_diagonal(pattern: str) -> None:
    case = make_case(
        sparsity=Sparsity(pattern, window=2, stride=3, causal_alignment="bottom_right"),
        **BOTTOM_RIGHT_CASES["tnd-varying"],
    )
    mask = make_mask(case)
    x, y = case.block_shape
    n_q, n_kv = mask.shape[2:]
    j = np.arange(n_kv)
    for b, (q_len, kv_len) in enumerate(zip(case.q_lengths(), case.kv_lengths(), strict=True)):
        causal = brute_force(q_len, kv_len, x, y, n_q, n_kv, bottom_right=True)
        last = np.where(causal.any(axis=1), n_kv - 1 - np.argmax(causal[:, ::-1], axis=1), -1)[:, None]
        near = (j > last - 2) & (j <= last)
        expected = near | (causal & (j % 3 == 2)) if pattern == "strided" else near
        assert np.array_equal(mask[b, 0] != 0, expected), f"batch {b}"


def test_bottom_right_and_top_left_differ_only_when_lengths_differ() -> None:
    same = dict(q_seq_len=160, kv_seq_len=160, block_shape=(32, 32))
    top = make_mask(make_case(sparsity=Sparsity("causal"), **same))
    bottom = make_mask(make_case(sparsity=Sparsity("causal", causal_alignment="bottom_right"), **same))
    assert np.array_equal(top, bottom)
    shorter = dict(q_seq_len=64, kv_seq_len=160, block_shape=(32, 32))
    bottom = make_mask(make_case(sparsity=Sparsity("causal", causal_alignment="bottom_right"), **shorter))
    assert bottom[0, 0].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("pattern", ["causal", "sliding_window", "strided"])
@pytest.mark.parametrize("name", ["sq-below-skv", "sq-above-skv", "tnd-varying"])
def test_estimates_count_bottom_right_patterns_as_drawn(pattern: str, name: str) -> None:
    case = make_case(
        sparsity=Sparsity(pattern, window=2, stride=3, causal_alignment="bottom_right"), **BOTTOM_RIGHT_CASES[name]
    )
    exact, estimated = mask_counts(case, make_mask(case)), pattern_counts(case)
    assert estimated.selected_blocks == exact.selected_blocks
    assert estimated.cells == exact.cells
    assert estimated.active_rows == exact.active_rows


# ---- the spec key, its warning and the manifest --------------------------------------------------------------

BASE = {"name": "c", "num_heads": 2, "q_seq_len": 128, "kv_seq_len": 300, "head_dim": 16, "block_shape": [64, 64]}


def load(tmp_path: Path, **fields: object) -> Case:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"cases": [{**BASE, **fields}]}, sort_keys=False))
    return load_specs([path])[0]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (
            "bottom-right",
            "'bottom-right' is not allowed (did you mean 'bottom_right'?); allowed: top_left, bottom_right",
        ),
        ("topleft", "(did you mean 'top_left'?)"),
        (1, "1 is not allowed; allowed: top_left, bottom_right"),
    ],
)
def test_bad_alignment_names_the_key_and_what_is_allowed(tmp_path: Path, value: object, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, sparsity={"pattern": "causal", "causal_alignment": value})
    message = str(info.value)
    assert "spec.yaml" in message and "case 'c'" in message and "key 'sparsity.causal_alignment'" in message
    assert fragment in message


def test_top_left_with_more_keys_than_queries_warns_of_blocks_never_selected(tmp_path: Path) -> None:
    case = load(tmp_path, sparsity={"pattern": "causal"})
    assert case.sparsity.causal_alignment == "top_left"
    assert case.warnings == (
        "causal pattern with causal_alignment top_left: kv blocks 2..4 (key tokens 128..299 of 300, Sq 128) "
        "of batch entry 0 can never be selected by any query block",
    )
    assert load(tmp_path, sparsity={"pattern": "causal", "causal_alignment": "bottom_right"}).warnings == ()
    assert load(tmp_path, sparsity={"pattern": "random"}).warnings == ()
    assert load(tmp_path, kv_seq_len=100, sparsity={"pattern": "causal"}).warnings == ()


def test_bottom_right_sliding_window_never_reaches_past_the_last_key(tmp_path: Path) -> None:
    case = load(
        tmp_path,
        layout="TND",
        q_seq_len=None,
        kv_seq_len=None,
        actual_seq_lengths=[300, 64, 64],
        actual_seq_lengths_kv=[100, 300, 300],
        sparsity={"pattern": "sliding_window", "window": 1, "causal_alignment": "top_left"},
    )
    assert len(case.warnings) == 1
    assert "kv blocks 1..4 (key tokens 64..299 of 300, Sq 64) of batch entries 1, 2" in case.warnings[0]


def test_manifest_records_the_pattern_and_its_alignment(tmp_path: Path) -> None:
    case = load(
        tmp_path,
        head_dim=8,
        q_seq_len=64,
        kv_seq_len=96,
        block_shape=[32, 32],
        sparsity={"pattern": "sliding_window", "window": 2, "causal_alignment": "bottom_right"},
    )
    manifest = json.loads((generate_case(case, tmp_path / "out") / "case.json").read_text())
    assert manifest["sparsity"] == {
        "pattern": "sliding_window",
        "window": 2,
        "causal_alignment": "bottom_right",
        "empty_rows": [],
    }
    mask = np.fromfile(tmp_path / "out" / "c" / manifest["inputs"]["block_sparse_mask"]["file"], dtype=np.uint8)
    assert mask.reshape(1, 2, 2, 3)[0, 0].tolist() == [[1, 1, 0], [0, 1, 1]]
