"""The diagnosis of failing cases (compare/diagnose.py): every planted fault names its true kind, clean
outputs get none, the recomputed golden agrees with gen's, and the reports show it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bsa_cli import compare, emulator
from bsa_cli.cli import main
from bsa_cli.compare import diagnose
from bsa_cli.compare.diagnose import hypotheses
from bsa_cli.compare.results import DIAGNOSIS_KINDS
from bsa_cli.generate import generate_case
from bsa_cli.manifest import GRAD_NAMES, case_from_manifest
from bsa_cli.spec import load_specs
from bsa_cli.store import iter_entries, load_manifest, read_array

CASES = Path(__file__).resolve().parent.parent / "cases"

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
}
"""The kind each fault of the reference device is (docs/compare.md, "Diagnosis")."""


def test_every_fault_has_a_true_kind_of_the_vocabulary():
    assert set(TRUE_KIND) == set(emulator.FAULTS)
    assert set(TRUE_KIND.values()) <= set(diagnose.TESTED_KINDS) <= set(DIAGNOSIS_KINDS)


def _suite(tmp_path: Path, suite: str) -> list[Path]:
    return [generate_case(case, tmp_path / "cases") for case in load_specs([CASES / f"{suite}.yaml"]) if case.expect.ok]


def _confusion(tmp_path: Path, suite: str) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Run every applicable fault on every case of a suite: (true fault, top kind) -> count, and the misses."""
    table: dict[tuple[str, str], int] = {}
    missed = []
    for case_dir in _suite(tmp_path, suite):
        manifest = load_manifest(case_dir)
        case = case_from_manifest(manifest)
        mask = read_array(case_dir, manifest["inputs"]["block_sparse_mask"])
        for fault in emulator.applicable_faults(case, mask):
            output_dir = tmp_path / "out" / case_dir.name / fault
            emulator.emulate_case_dir(case_dir, output_dir, fault=fault)
            result = compare.compare_case(case_dir, output_dir, workers=1)
            top = result.diagnosis[0].kind if result.diagnosis else "-"
            table[(fault, top)] = table.get((fault, top), 0) + 1
            if result.verdict != compare.FAIL or top != TRUE_KIND[fault]:
                missed.append(f"{case_dir.name} {fault}: {result.verdict}, top {top}: "
                              f"{[(c.kind, c.score) for c in result.diagnosis]}")  # fmt: skip
    return table, missed


def test_smoke_suite_every_fault_names_its_true_kind(tmp_path):
    table, missed = _confusion(tmp_path, "smoke")
    assert missed == []
    assert {fault for fault, _ in table} >= set(TRUE_KIND) - {"heads-interleaved"}  # smoke has no N1 > N2 > 1


@pytest.mark.slow  # about 70 s: 35 cases, 15 faults
def test_edge_suite_every_fault_names_its_true_kind(tmp_path):
    table, missed = _confusion(tmp_path, "edge")
    assert missed == []
    assert {fault for fault, _ in table} == set(TRUE_KIND)


def test_clean_outputs_with_atomic_order_noise_get_no_diagnosis(tmp_path):
    for case_dir in _suite(tmp_path, "smoke"):
        for seed in (None, 1, 2):
            output_dir = tmp_path / "out" / case_dir.name / str(seed)
            emulator.emulate_case_dir(case_dir, output_dir, order_seed=seed)
            result = compare.compare_case(case_dir, output_dir, workers=1)
            assert result.verdict == compare.PASS, result.message
            assert result.diagnosis == () and result.hypotheses == ()


@pytest.mark.slow
def test_clean_stress_cases_get_no_diagnosis(tmp_path):
    for case_dir in _suite(tmp_path, "stress"):
        output_dir = tmp_path / "out" / case_dir.name
        emulator.emulate_case_dir(case_dir, output_dir, order_seed=3)
        result = compare.compare_case(case_dir, output_dir, workers=1)
        assert result.verdict == compare.PASS and result.diagnosis == () and result.hypotheses == ()


@pytest.mark.parametrize("name", ["smoke-tnd-varlen", "smoke-gqa-empty-rows", "smoke-bnsd-causal-tail"])
def test_the_recomputed_golden_equals_gens_on_every_block(tmp_path, name):
    """The diagnosis's float64 block formula, without a hypothesis, is the golden `bsa gen` wrote (float32)."""
    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == name]
    case_dir = generate_case(case, tmp_path)
    manifest = load_manifest(case_dir)
    inputs = {n: read_array(case_dir, e) for n, e in iter_entries(manifest, "inputs")}
    golden = {n: read_array(case_dir, e) for n, e in iter_entries(manifest, "golden")}
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
    emulator.emulate_case_dir(case_dir, output_dir, fault="no-dsum")
    result = compare.compare_case(case_dir, output_dir, workers=1)
    tried = {h.supposes: h for h in result.hypotheses}
    assert tried["Dsum omitted: dS = P dP"].score > 0.95
    assert tried["Dsum omitted: dS = P dP"].outcome.startswith("explains ")
    assert tried["the block mask read transposed ([.., j, i])"].outcome.startswith("ruled out: ")
    assert result.diagnosis[0].kind == "softmax-grad" and result.diagnosis[0].score > 0.95


def _cli_case(tmp_path: Path, fault: str | None) -> Path:
    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == "smoke-gqa-empty-rows"]
    case_dir = generate_case(case, tmp_path / "suite")
    emulator.emulate_case_dir(case_dir, case_dir / "outputs", fault=fault)
    return case_dir


def test_terminal_likely_line_json_and_junit_carry_the_diagnosis(tmp_path):
    case_dir = _cli_case(tmp_path, "stale-output")
    runner = CliRunner()
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    result = runner.invoke(main, ["compare", str(case_dir), "--json", str(report), "--junit", str(junit)],
                           terminal_width=400)  # fmt: skip
    assert result.exit_code == 1
    likely = "likely: not-written (1.00): dq, dk, dv all zero where the golden is not, as if never written"
    lines = result.output.splitlines()
    assert lines[4].split("|")[3].strip().startswith("dq is all zero, as if never written, where the golden is not")
    assert lines[5].split("|")[1:3] == [" " * 22, " " * 9] and lines[5].split("|")[3].strip() == likely
    document = json.loads(report.read_text())
    assert document["schema_minor"] == 3
    assert document["cases"][0]["diagnosis"] == [{"kind": "not-written", "score": 1.0, "evidence": likely[28:],
                                                  "tensors": ["dq", "dk", "dv"], "where": []}]  # fmt: skip
    assert likely in junit.read_text()
    merged = runner.invoke(main, ["compare", "--merge", str(report), "--explain", "smoke-gqa-empty-rows"],
                           terminal_width=400)  # fmt: skip
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
    emulator.emulate_case_dir(case_dir, case_dir / "outputs", fault="lse-base2")
    failed = runner.invoke(main, ["compare", str(case_dir.parent), "--explain", "smoke-gqa-empty-rows"],
                           terminal_width=400)  # fmt: skip
    assert failed.exit_code == 1
    lines = failed.output.splitlines()
    start = lines.index("hypotheses tried (20), best first:")
    tried = lines[start + 1 :]
    assert tried[0].startswith("  [1.00] softmax-lse: P recomputed as exp2(S log2(e) - lse): lse read as a base-2 log: "
                               "explains 100% of the excess error: under the hypothesis, dq's error falls to ")
    assert any(line.startswith("  [0.00] block-selection: the block mask read transposed ([.., j, i]): ruled out: "
                               "explains ") for line in tried)
    # the search ends at the hypothesis that explains the error: the later ones say so
    assert ("  [0.00] softmax-grad: Dsum omitted: dS = P dP: not tried: 'P recomputed as exp2(S log2(e) - lse): "
            "lse read as a base-2 log' already explains 100% of the error") in tried
    assert lines[-1].startswith("judged ") or lines[-1].startswith("  [")


def test_bsa_judge_results_carry_the_diagnosis(tmp_path):
    from bsa_cli import api

    (case,) = [c for c in load_specs([CASES / "smoke.yaml"]) if c.name == "smoke-tnd-varlen"]
    case_dir = generate_case(case, tmp_path)
    loaded = api.load_case(case_dir)
    grads = emulator.emulate(case, loaded.inputs, fault="mask-transposed")
    result = api.judge(loaded, grads["dq"], grads["dk"], grads["dv"])
    assert result.verdict == compare.FAIL and result.diagnosis[0].kind == "block-selection"
    clean = emulator.emulate(case, loaded.inputs)
    passed = api.judge(loaded, clean["dq"], clean["dk"], clean["dv"])
    assert passed.verdict == compare.PASS and passed.diagnosis == () and passed.hypotheses == ()
