"""Run-to-run noise: the reference device's atomic-add order, and what `bsa run --repeat` makes of it.

dQ rows have one owner in the kernel (bitwise identical on every run); dK and dV are summed with fp32
atomic adds (their last bits may move). A race that matters (dq or the status differs, or a run fails the
standard) fails the run; last-bit noise in dk/dv is reported, not failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bsa_cli import compare, devices, pipeline
from bsa_cli.cli import main
from bsa_cli.devices import repeat
from bsa_cli.devices.faults import applicable_faults
from bsa_cli.devices.reference import emulate
from bsa_cli.gen.generate import generate_suite
from bsa_cli.specs import load_specs
from bsa_cli.store import load_manifest, read_array
from bsa_cli.store.manifest import case_from_manifest
from tests.helpers import REPO

EDGE = load_specs([REPO / "cases" / "edge.yaml"])
NOISY = ["edge-tail.256.300", "edge-gqa.2.fp16", "edge-varlen-tnd", "edge-dense-all-ones.bf16"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("edge")
    generate_suite([c for c in EDGE if c.name in NOISY], out)
    return out


def case_inputs(case_dir: Path):
    manifest = load_manifest(case_dir)
    return case_from_manifest(manifest), {n: read_array(case_dir, e) for n, e in manifest["inputs"].items()}


def bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint16)


@pytest.mark.parametrize("name", NOISY)
def test_order_seeds_move_dk_dv_last_bits_and_never_dq(suite: Path, name: str) -> None:
    case, tensors = case_inputs(suite / name)
    runs = [emulate(case, tensors, order_seed=seed) for seed in range(6)]
    for other in runs[1:]:
        assert np.array_equal(bits(runs[0]["dq"]), bits(other["dq"])), "dq rows have one owner"
    moved = sum(not np.array_equal(bits(runs[0][t]), bits(r[t])) for r in runs[1:] for t in ("dk", "dv"))
    assert moved, f"{name}: six accumulation orders left dk and dv bit-identical"
    same_seed = emulate(case, tensors, order_seed=3)
    for tensor in ("dq", "dk", "dv"):
        assert np.array_equal(bits(runs[3][tensor]), bits(same_seed[tensor])), "a seed repeats its order"
        golden = np.abs(runs[0][tensor].astype(np.float64) - runs[1][tensor].astype(np.float64))
        scale = np.abs(runs[0][tensor].astype(np.float64)).max()
        assert golden.max() <= 2.0**-6 * scale, "noise is last-bit sized"


def test_repeat_reports_dk_dv_noise_without_failing(suite: Path) -> None:
    summary = devices.run_cases(
        sorted(suite.iterdir()), devices.RunOptions(repeat=3, seed=11, judge=pipeline.judge_run)
    )
    assert summary.return_code == 0
    noisy = 0
    for result in summary.results:
        assert result.outcome == "ok", result.problems
        repeat = result.record["repeat"]
        assert repeat["seed"] == 11 and repeat["count"] == 3
        assert "dq" not in repeat["noise"]
        assert all(d["output"] in ("dk", "dv") and not d["matters"] for d in repeat["differences"])
        for entry in repeat["noise"].values():
            assert 0 < entry["elements"] <= entry["total"] and entry["max_ulp"] >= 1
        noisy += bool(repeat["noise"])
        seeds = [run["order_seed"] for run in result.record["runs"]]
        assert len(set(seeds)) == 3, "every run gets its own accumulation order"
        verdict = compare.compare_case(result.case_dir, result.output_dir, workers=1)
        assert verdict.verdict == "PASS", verdict.message
        if repeat["noise"]:
            (check,) = [c for c in verdict.all_checks if c.name == "repeat-noise"]
            assert check.passed and "dq bitwise identical over 3 runs" in check.detail
    assert noisy, "no case showed atomic-add noise over three runs"


def test_a_planted_race_that_moves_outputs_fails_the_run(suite: Path, tmp_path: Path) -> None:
    case_dirs = sorted(suite.iterdir())
    for case_dir in case_dirs:
        case, tensors = case_inputs(case_dir)
        assert "race-lost-update" in applicable_faults(case, tensors["block_sparse_mask"])
    device = devices.create(fault="race-lost-update")
    options = devices.RunOptions(
        device=device, repeat=4, seed=5, outputs_root=tmp_path / "outputs", judge=pipeline.judge_run
    )
    summary = devices.run_cases(case_dirs, options)
    assert summary.return_code == 1
    failed = [r for r in summary.results if r.outcome == "nondeterministic"]
    assert failed, "a lost update in about half the runs went unnoticed over four runs of four cases"
    for result in failed:
        assert any("by the standard" in p for p in result.problems)
        verdicts = [d for d in result.record["repeat"]["differences"] if d["output"] == "verdict"]
        assert verdicts and all(d["matters"] and d["verdict"] == "FAIL" for d in verdicts)


def test_the_race_fault_strikes_in_odd_seeded_runs_and_always_without_a_seed(suite: Path) -> None:
    case, tensors = case_inputs(suite / NOISY[0])
    clean = emulate(case, tensors, order_seed=2)
    struck = [emulate(case, tensors, "race-lost-update", seed) for seed in (None, 1, 3)]
    spared = emulate(case, tensors, "race-lost-update", order_seed=2)
    for tensor in ("dk", "dv"):
        assert np.array_equal(bits(clean[tensor]), bits(spared[tensor]))
        assert all(not np.array_equal(bits(clean[tensor]), bits(run[tensor])) for run in struck)
    assert all(np.array_equal(bits(clean["dq"]), bits(run["dq"])) for run in struck)


def test_cli_repeat_with_a_race_exits_1_and_says_why(suite: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["run", str(suite), "--repeat", "6", "--fault", "race-lost-update", "--outputs-root", str(tmp_path / "o")]
    )
    assert result.exit_code == 1, result.output
    record = json.loads(next((tmp_path / "o").glob("*/run.json")).read_text())
    assert record["repeat"]["count"] == 6


def test_differing_elements_counts_ulps_across_zero(tmp_path: Path) -> None:
    first, other = tmp_path / "a.bin", tmp_path / "b.bin"
    np.array([1.0, 2.0, -0.0, 3.0], dtype=np.float16).tofile(first)
    values = np.array([1.0, 2.0, 0.0, 3.0], dtype=np.float16)
    values.view(np.uint16)[3] += 2  # two ULPs up
    values.tofile(other)
    assert repeat.differing_elements(first, other, "float16") == (2, 4, 2)


# ---- deterministic mode ---------------------------------------------------------------------------


def test_deterministic_repeats_are_bitwise_identical_on_the_reference_device(suite: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", str(suite), "--deterministic", "--repeat", "3"])
    assert result.exit_code == 0, result.output
    for case_dir in sorted(suite.iterdir()):
        record = json.loads((case_dir / "outputs" / "run.json").read_text())
        assert record["outcome"] == "ok" and record["deterministic"] is True
        assert record["repeat"]["identical"] is True and record["repeat"]["noise"] == {}
        assert [run["order_seed"] for run in record["runs"]] == [None, None, None]  # one fixed order


def test_a_device_that_ignores_deterministic_mode_fails_as_nondeterministic(suite: Path) -> None:
    name = "edge-gqa.2.fp16"
    result = CliRunner().invoke(
        main, ["run", str(suite / name), "--deterministic", "--repeat", "3", "--fault", "deterministic-ignored"]
    )
    assert result.exit_code == 1, result.output
    record = json.loads((suite / name / "outputs" / "run.json").read_text())
    assert record["outcome"] == "nondeterministic"
    raced = {d["output"] for d in record["repeat"]["differences"] if d["matters"]}
    assert raced and raced <= {"dk", "dv"}
    assert any("deterministic mode asks all three outputs bitwise identical" in p for p in record["problems"])
    assert any(
        f"of {read_array(suite / name, load_manifest(suite / name)['inputs']['key']).size} elements" in p
        for p in record["problems"]
    )


def test_without_deterministic_mode_the_same_fault_is_noise_and_passes(suite: Path) -> None:
    name = "edge-gqa.2.fp16"
    result = CliRunner().invoke(main, ["run", str(suite / name), "--repeat", "3", "--fault", "deterministic-ignored"])
    assert result.exit_code == 0, result.output
    record = json.loads((suite / name / "outputs" / "run.json").read_text())
    assert record["outcome"] == "ok" and record["deterministic"] is False and record["repeat"]["noise"]


def test_bsa_emulate_deterministic_ignores_the_seed(suite: Path, tmp_path: Path) -> None:
    case_dir = suite / "edge-gqa.2.fp16"
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        result = CliRunner().invoke(main, ["emulate", str(case_dir), str(out), "--seed", seed, "--deterministic"])
        assert result.exit_code == 0, result.output
        outs.append((out / "dk.bin").read_bytes())
    assert outs[0] == outs[1]
