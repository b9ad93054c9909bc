"""The diagnosis of failing cases (compare/diagnose.py): every planted fault names its true kind, clean
outputs get none, the recomputed golden agrees with gen's, and the reports show it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bsa_cli import compare
from bsa_cli.cli import main
from bsa_cli.compare import diagnose
from bsa_cli.compare.diagnose import hypotheses
from bsa_cli.compare.results import DIAGNOSIS_KINDS
from bsa_cli.core.case import numpy_dtype
from bsa_cli.devices import faults, reference
from bsa_cli.gen.generate import generate_case
from bsa_cli.specs import load_specs
from bsa_cli.store import load_manifest, read_array
from bsa_cli.store.manifest import GRAD_NAMES, case_from_manifest
from tests.helpers import CASES

TRUE_KIND = {
    "drop-tail-block": "tail-block",
    "no-gqa-sum": "gqa-group-sum",
    "dk-no-scale": "scale",
    "mask-transposed": "block-selection",
    "block-shift": "block-selection",
    "lse-base2": "softmax-lse",
    "no-dsum": "softmax-grad",
    "nan-row": "non-finite",
    "stale-output": "not-written",
    "race-lost-update": "accumulation-race",
    "scale-rounded": "scale",
    "tile-noise": "tile-local",
    "rows-swapped": "rows-permuted",
    "heads-interleaved": "gqa-head-mapping",
    "dq-scaled-twice": "scale",
    "lse-row-max": "softmax-lse",
    "dv-slightly-scaled": "scale",
    "dk-missing-q-block": "partial-missing",
}
"""The kind each fault of the reference device is (docs/compare.md, "Diagnosis")."""


def named_first(result: compare.CaseResult, kind: str) -> bool:
    """Whether the first cause is `kind`, or is tied with a cause of `kind` and says the evidence cannot tell
    them apart (a factor of 1 + 2^-8 below bf16's resolution biases as a rounding path does)."""
    if not result.diagnosis:
        return False
    first = result.diagnosis[0]
    tied = [c.kind for c in result.diagnosis if c.score == first.score]
    return first.kind == kind or ("not told apart from" in first.evidence and kind in tied)


def test_every_fault_has_a_true_kind_of_the_vocabulary():
    assert set(TRUE_KIND) == set(faults.FAULTS)
    assert set(TRUE_KIND.values()) <= set(diagnose.TESTED_KINDS) <= set(DIAGNOSIS_KINDS)


def _suite(generated_suite: Callable[[str], Path], suite: str) -> list[Path]:
    """The folders of cases/SUITE.yaml's positive cases, generated once per session (read-only)."""
    root = generated_suite(suite)
    return [root / case.name for case in load_specs([CASES / f"{suite}.yaml"]) if case.expect.ok]


def _confusion(
    generated_suite: Callable[[str], Path], tmp_path: Path, suite: str
) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Run every applicable fault on every case of a suite: (true fault, top kind) -> count, and the misses."""
    table: dict[tuple[str, str], int] = {}
    missed = []
    for case_dir in _suite(generated_suite, suite):
        manifest = load_manifest(case_dir)
        case = case_from_manifest(manifest)
        mask = read_array(case_dir, manifest["inputs"]["block_sparse_mask"])
        for fault in faults.applicable_faults(case, mask):
            output_dir = tmp_path / "out" / case_dir.name / fault
            reference.emulate_case_dir(case_dir, output_dir, fault=fault)
            result = compare.compare_case(case_dir, output_dir, workers=1)
            top = result.diagnosis[0].kind if result.diagnosis else "-"
            table[(fault, top)] = table.get((fault, top), 0) + 1
            if result.verdict != compare.FAIL or not named_first(result, TRUE_KIND[fault]):
                missed.append(
                    f"{case_dir.name} {fault}: {result.verdict}, top {top}: "
                    f"{[(c.kind, c.score) for c in result.diagnosis]}"
                )
    return table, missed


def test_smoke_suite_every_fault_names_its_true_kind(generated_suite, tmp_path):
    table, missed = _confusion(generated_suite, tmp_path, "smoke")
    assert missed == []
    assert {fault for fault, _ in table} >= set(TRUE_KIND) - {"heads-interleaved"}  # smoke has no N1 > N2 > 1


@pytest.mark.slow  # about 70 s: 35 cases, 18 faults
def test_edge_suite_every_fault_names_its_true_kind(generated_suite, tmp_path):
    table, missed = _confusion(generated_suite, tmp_path, "edge")
    assert missed == []
    assert {fault for fault, _ in table} == set(TRUE_KIND)


def test_clean_outputs_with_atomic_order_noise_get_no_diagnosis(generated_suite, tmp_path):
    for case_dir in _suite(generated_suite, "smoke"):
        for seed in (None, 1, 2):
            output_dir = tmp_path / "out" / case_dir.name / str(seed)
            reference.emulate_case_dir(case_dir, output_dir, order_seed=seed)
            result = compare.compare_case(case_dir, output_dir, workers=1)
            assert result.verdict == compare.PASS, result.message
            assert result.diagnosis == () and result.hypotheses == ()


@pytest.mark.slow
def test_clean_stress_cases_get_no_diagnosis(generated_suite, tmp_path):
    for case_dir in _suite(generated_suite, "stress"):
        output_dir = tmp_path / "out" / case_dir.name
        reference.emulate_case_dir(case_dir, output_dir, order_seed=3)
        result = compare.compare_case(case_dir, output_dir, workers=1)
        assert result.verdict == compare.PASS and result.diagnosis == () and result.hypotheses == ()


@pytest.mark.parametrize("name", ["smoke-tnd-varlen", "smoke-gqa-empty-rows", "smoke-bnsd-causal-tail"])
def test_the_recomputed_golden_equals_gens_on_every_block(tmp_path, name):
    """The diagnosis's float64 block formula, without a hypothesis, is the golden `bsa gen` wrote (float32)."""
    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == name]
    case_dir = generate_case(case, tmp_path)
    manifest = load_manifest(case_dir)
    inputs = {n: read_array(case_dir, e) for n, e in manifest.entries("inputs")}
    golden = {n: read_array(case_dir, e) for n, e in manifest.entries("golden")}
    spans = {s.batch: s for s in case.spans() if s.q_len and s.kv_len}
    ctx = hypotheses.Context(case, inputs, spans)
    x, y = case.block_shape
    for batch, span in spans.items():
        for tensor in GRAD_NAMES:
            heads = case.num_heads if tensor == "dq" else case.num_kv_heads
            count = -(-(span.q_len if tensor == "dq" else span.kv_len) // (x if tensor == "dq" else y))
            for head in range(heads):
                for block in range(count):
                    target = hypotheses.Target(tensor, batch, head, block)
                    mine = hypotheses.recompute(ctx, hypotheses.NULL, target)
                    theirs = hypotheses.block_of(case, golden[tensor], target, spans)
                    scale = max(float(np.abs(theirs).max(initial=0.0)), 1e-6)
                    assert np.abs(mine - theirs).max(initial=0.0) <= 1e-5 * scale, target


def test_a_wrong_hypothesis_is_ruled_out_and_the_true_one_explains_the_error(tmp_path):
    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == "smoke-tnd-varlen"]
    case_dir = generate_case(case, tmp_path)
    output_dir = tmp_path / "out"
    reference.emulate_case_dir(case_dir, output_dir, fault="no-dsum")
    result = compare.compare_case(case_dir, output_dir, workers=1)
    tried = {h.supposes: h for h in result.hypotheses}
    assert tried["Dsum omitted: dS = P dP"].score > 0.95
    assert tried["Dsum omitted: dS = P dP"].outcome.startswith("explains ")
    assert tried["the block mask read transposed ([.., j, i])"].outcome.startswith("ruled out: ")
    assert result.diagnosis[0].kind == "softmax-grad" and result.diagnosis[0].score > 0.95


def _cli_case(tmp_path: Path, fault: str | None) -> Path:
    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == "smoke-gqa-empty-rows"]
    case_dir = generate_case(case, tmp_path / "suite")
    reference.emulate_case_dir(case_dir, case_dir / "outputs", fault=fault)
    return case_dir


def test_terminal_likely_line_json_and_junit_carry_the_diagnosis(tmp_path):
    case_dir = _cli_case(tmp_path, "stale-output")
    runner = CliRunner()
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    result = runner.invoke(
        main, ["compare", str(case_dir), "-v", "--json", str(report), "--junit", str(junit)], terminal_width=400
    )
    assert result.exit_code == 1  # -v: the likely cause with its evidence (the default view names the cause only)
    likely = "likely: not-written (1.00): dq, dk, dv all zero where the golden is not, as if never written"
    lines = result.output.splitlines()
    assert lines[4].split("|")[3].strip().startswith("dq is all zero, as if never written, where the golden is not")
    assert lines[5].split("|")[1:3] == [" " * 22, " " * 9] and lines[5].split("|")[3].strip() == likely
    document = json.loads(report.read_text())
    assert document["schema_minor"] >= 3  # diagnosis and hypotheses came with minor 3
    assert document["cases"][0]["diagnosis"] == [
        {"kind": "not-written", "score": 1.0, "evidence": likely[28:], "tensors": ["dq", "dk", "dv"], "where": []}
    ]
    assert likely in junit.read_text()
    merged = runner.invoke(
        main, ["compare", "--merge", str(report), "--explain", "smoke-gqa-empty-rows"], terminal_width=400
    )
    assert "hypotheses tried (1), best first:" in merged.output
    assert f"  [1.00] not-written: an output never written: explains: {likely[28:]}" in merged.output


def test_explain_prints_every_hypothesis_and_a_pass_gets_none(tmp_path):
    case_dir = _cli_case(tmp_path, None)
    runner = CliRunner()
    passed = runner.invoke(main, ["compare", str(case_dir.parent), "--explain", "smoke-gqa-empty-rows"])
    assert passed.exit_code == 0
    assert passed.output.splitlines()[-2:-1] == ["no diagnosis: only a failing case is diagnosed"]
    unknown = runner.invoke(main, ["compare", str(case_dir.parent), "--explain", "nope"])
    assert unknown.exit_code == 2
    assert unknown.output.splitlines()[-1] == "Error: --explain nope: no such case under the given folders"
    reference.emulate_case_dir(case_dir, case_dir / "outputs", fault="lse-base2")
    failed = runner.invoke(
        main, ["compare", str(case_dir.parent), "--explain", "smoke-gqa-empty-rows"], terminal_width=400
    )
    assert failed.exit_code == 1
    lines = failed.output.splitlines()
    start = lines.index("hypotheses tried (26), best first:")
    tried = lines[start + 1 :]
    assert tried[0].startswith(
        "  [1.00] softmax-lse: P recomputed as exp2(S log2(e) - lse): lse read as a base-2 log: "
        "explains 100% of the excess error: under the hypothesis, dq's error falls to "
    )
    assert any(
        line.startswith("  [0.00] block-selection: the block mask read transposed ([.., j, i]): ruled out: explains ")
        for line in tried
    )
    # the search ends at the hypothesis that explains the error: the later ones say so
    assert (
        "  [0.00] softmax-grad: Dsum omitted: dS = P dP: not tried: 'P recomputed as exp2(S log2(e) - lse): "
        "lse read as a base-2 log' already explains 100% of the error"
    ) in tried
    assert lines[-1].startswith("judged ") or lines[-1].startswith("  [")


def test_bsa_judge_results_carry_the_diagnosis(tmp_path):
    from bsa_cli import api

    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == "smoke-tnd-varlen"]
    case_dir = generate_case(case, tmp_path)
    loaded = api.load_case(case_dir)
    grads = reference.emulate(case, loaded.inputs, fault="mask-transposed")
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL and result.diagnosis[0].kind == "block-selection"
    clean = reference.emulate(case, loaded.inputs)
    passed = api.judge(loaded, clean["dq"], clean["dk"], clean["dv"])
    assert passed.verdict == compare.PASS and passed.diagnosis == () and passed.hypotheses == ()


# ---- faults planted directly in a clean device output: each names its kind, a clean output none -----------

PLANTED_SPECS = """
defaults: {dtype: fp16, head_dim: 64, seed: 5, num_heads: 1}
cases:
  - name: planted-pieces
    q_seq_len: 512
    block_shape: [256, 128]
    sparsity: {pattern: random, density: 0.6}
  - name: planted-causal-long
    q_seq_len: 1024
    block_shape: [64, 64]
    sparsity: {pattern: causal}
  - name: planted-heads
    batch: 2
    num_heads: 3
    q_seq_len: 192
    block_shape: [64, 64]
    sparsity: {pattern: random, density: 0.6}
  - name: planted-tnd
    layout: TND
    dtype: bf16
    num_heads: 2
    actual_seq_lengths: [130, 64, 200]
    block_shape: [64, 64]
    sparsity: {pattern: random, density: 0.7}
  - name: planted-padding
    batch: 2
    q_seq_len: 256
    actual_seq_lengths: [256, 150]
    block_shape: [64, 64]
    sparsity: {pattern: random, density: 0.7}
    bnsd_lengths: honored
"""


def _planted_case(tmp_path: Path, name: str):
    from bsa_cli import api

    spec = tmp_path / "planted.yaml"
    spec.write_text(PLANTED_SPECS)
    (case,) = [c for c in load_specs([spec]) if c.name == name]
    loaded = api.load_case(generate_case(case, tmp_path / "cases"))
    return case, loaded, reference.emulate(case, loaded.inputs, order_seed=7)


def _judge(loaded, grads):
    from bsa_cli import api

    return api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])


def _shift_entry(case, grads, batch=1, shift=3):
    out = {name: array.copy() for name, array in grads.items()}
    span = case.spans()[batch]
    if case.layout == "TND":
        rows = out["dq"][span.q_start : span.q_start + span.q_len]
        rows[shift:] = grads["dq"][span.q_start : span.q_start + span.q_len - shift]  # the entry written late
        rows[:shift] = 0
    else:
        count = min(span.q_len, grads["dq"].shape[2] - shift)  # past the length: into the padding rows
        out["dq"][batch, :, shift : shift + count] = grads["dq"][batch, :, :count]
        out["dq"][batch, :, :shift] = 0
    return out


def _bits_of_other_dtype(case, grads):
    other = numpy_dtype("float16" if case.dtype == "bfloat16" else "bfloat16")
    return {name: np.asarray(array, dtype=np.float32).astype(other).view(array.dtype) for name, array in grads.items()}


def _s_and_n_transposed(case, grads):
    out = dict(grads)
    dq = grads["dq"]
    if case.layout == "TND":
        out["dq"] = np.ascontiguousarray(dq.transpose(1, 0, 2)).reshape(dq.shape)
    else:
        out["dq"] = np.ascontiguousarray(dq.transpose(0, 2, 1, 3)).reshape(dq.shape)
    return out


def _error_growing_with_blocks(case, grads, inputs):
    """dq accumulated in low precision: a relative error growing with the kv blocks each query block adds."""
    out = dict(grads)
    dq = grads["dq"].astype(np.float64)
    counts = (np.asarray(inputs["block_sparse_mask"]) != 0).sum(axis=3)  # [B, N, nQ]
    x = case.block_shape[0]
    per_row = np.repeat(counts, x, axis=2)[:, :, : dq.shape[2], None]
    rng = np.random.default_rng(4)
    out["dq"] = (dq * (1 + 2e-3 * per_row * rng.standard_normal(dq.shape))).astype(grads["dq"].dtype)
    return out


def _error_growing_with_pairs(case, grads, inputs):
    """dk accumulated in low precision: a relative error growing with the query blocks each kv block adds."""
    out = dict(grads)
    dk = grads["dk"].astype(np.float64)
    counts = (np.asarray(inputs["block_sparse_mask"]) != 0).sum(axis=2)  # [B, N, nKV] (MHA)
    per_row = np.repeat(counts, case.block_shape[1], axis=2)[:, :, : dk.shape[2], None]
    rng = np.random.default_rng(6)
    out["dk"] = (dk * (1 + 2e-3 * np.sqrt(per_row) * rng.standard_normal(dk.shape))).astype(grads["dk"].dtype)
    return out


def _region_left_zero(case, grads):
    out = {name: array.copy() for name, array in grads.items()}
    out["dv"][0, 0, 64:96, :32] = 0  # two 16x16 tiles never written
    return out


def _one_block_corrupted(case, grads):
    out = {name: array.copy() for name, array in grads.items()}
    rng = np.random.default_rng(8)
    block = out["dq"][1, 2, 64:128]
    scale = float(np.abs(block.astype(np.float64)).mean())
    block[:] = (block + rng.standard_normal(block.shape) * scale).astype(block.dtype)
    return out


def _one_piece_corrupted(case, grads):
    out = {name: array.copy() for name, array in grads.items()}
    rng = np.random.default_rng(5)
    piece = out["dq"][0, 0, 128:256]
    scale = float(np.abs(piece.astype(np.float64)).mean())
    piece[:] = (piece + rng.standard_normal(piece.shape) * scale).astype(piece.dtype)
    return out


PLANTED = [
    ("planted-tnd", "shift-entry", "length-boundary"),
    ("planted-heads", "shift-entry", "length-boundary"),
    ("planted-padding", "shift-entry", "length-boundary"),
    ("planted-tnd", "other-dtype-bits", "layout"),
    ("planted-heads", "other-dtype-bits", "layout"),
    ("planted-heads", "s-n-transposed", "layout"),
    ("planted-tnd", "s-n-transposed", "layout"),
    ("planted-causal-long", "error-growing-with-blocks", "accumulation-precision"),
    ("planted-causal-long", "error-growing-with-pairs", "accumulation-precision"),
    ("planted-pieces", "one-piece", "tile-local"),
    ("planted-heads", "one-block", "tile-local"),
    ("planted-heads", "region-left-zero", "not-written"),
]


@pytest.mark.parametrize(("name", "fault", "kind"), PLANTED)
def test_a_fault_planted_in_the_output_names_its_kind_first(tmp_path, name, fault, kind):
    case, loaded, grads = _planted_case(tmp_path, name)
    planted = {
        "shift-entry": lambda: _shift_entry(case, grads),
        "other-dtype-bits": lambda: _bits_of_other_dtype(case, grads),
        "s-n-transposed": lambda: _s_and_n_transposed(case, grads),
        "error-growing-with-blocks": lambda: _error_growing_with_blocks(case, grads, loaded.inputs),
        "one-piece": lambda: _one_piece_corrupted(case, grads),
        "error-growing-with-pairs": lambda: _error_growing_with_pairs(case, grads, loaded.inputs),
        "region-left-zero": lambda: _region_left_zero(case, grads),
        "one-block": lambda: _one_block_corrupted(case, grads),
    }[fault]()
    result = _judge(loaded, planted)
    assert result.verdict == compare.FAIL
    assert result.diagnosis and result.diagnosis[0].kind == kind, [
        (c.kind, c.score, c.evidence) for c in result.diagnosis
    ]


@pytest.mark.parametrize(
    "name", ["planted-pieces", "planted-causal-long", "planted-heads", "planted-tnd", "planted-padding"]
)
def test_clean_outputs_of_the_planted_cases_get_no_diagnosis(tmp_path, name):
    _, loaded, grads = _planted_case(tmp_path, name)
    result = _judge(loaded, grads)
    assert result.verdict == compare.PASS and result.diagnosis == () and result.hypotheses == ()


STRESS_FAULTS = ("block-shift", "no-dsum", "tile-noise", "dk-no-scale", "rows-swapped", "lse-base2")
STRESS_UNEXPLAINED = {("stress-outlier-tokens.bf16", "lse-base2"), ("stress-peaked.fp16", "lse-base2")}
"""lse read in base 2 where the scores are large: P reaches 1e10-1e17, dq and dk are sums of terms many orders
beyond the result, and the device's rounding of those terms (not the benchmark's) is their error: the true
hypothesis is 3e-4 to 3e-3 of dv away (the dtype's rounding), 1 to 1e8 of dq and dk (docs/compare.md, "The
stress suite")."""


STRESS_PASSING = {("rows-swapped", "stress-dout-mixed.bf16"), ("tile-noise", "stress-uniform.fp16")}


@pytest.mark.slow  # about 25 s: 12 cases, 6 faults
def test_stress_suite_every_fault_names_its_true_kind(generated_suite, tmp_path):
    table: dict[tuple[str, str], int] = {}
    missed, unexplained = [], set()
    for case_dir in _suite(generated_suite, "stress"):
        manifest = load_manifest(case_dir)
        case = case_from_manifest(manifest)
        mask = read_array(case_dir, manifest["inputs"]["block_sparse_mask"])
        for fault in STRESS_FAULTS:
            if not faults.fault_applies(fault, case, mask):
                continue
            output_dir = tmp_path / "out" / case_dir.name / fault
            reference.emulate_case_dir(case_dir, output_dir, fault=fault)
            result = compare.compare_case(case_dir, output_dir, workers=1)
            top = result.diagnosis[0].kind if result.diagnosis else "-"
            table[(fault, top)] = table.get((fault, top), 0) + 1
            # Passes: a swap of two small rows (mixed dout rows, bf16); tile noise on stress-uniform.fp16, whose
            # gradients (RMS about 1e-6) lie below err_thd, so the tile check's floor at small_value_thd hides it.
            if result.verdict == compare.PASS:
                assert result.diagnosis == () and (fault, case_dir.name) in STRESS_PASSING, (fault, case_dir.name)
            elif (case_dir.name, fault) in STRESS_UNEXPLAINED:
                unexplained.add((case_dir.name, fault))
                # no wrong cause named: values dominated by terms far beyond the golden carry nothing of it
                assert top in ("-", "non-finite", "no-information"), (case_dir.name, fault, top)
            elif top != TRUE_KIND[fault]:
                missed.append(f"{case_dir.name} {fault}: top {top}: {[(c.kind, c.score) for c in result.diagnosis]}")
    assert missed == []
    assert unexplained == STRESS_UNEXPLAINED
    assert sum(table.values()) == 70
