"""`bsa fuzz`: cases a pure function of the seed, legal by the spec rules; failures found, shrunk, reproduced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from bsa_cli import devices
from bsa_cli.devices import faults, reference
from bsa_cli.fuzz import Bounds, FuzzSettings, fuzz
from bsa_cli.fuzz.draw import build, draw, features
from bsa_cli.fuzz.shrink import candidates
from tests.helpers import make_case, make_inputs
from tests.helpers.cli import invoke

#: Small ranges, so a case costs a fraction of a second.
SMALL = Bounds(batch=4, num_heads=8, seq_len=96, head_dim=64)


def test_the_cases_are_a_pure_function_of_the_seed_and_the_rules_accept_each() -> None:
    first = [draw(7, index, SMALL)[0] for index in range(30)]
    assert first == [draw(7, index, SMALL)[0] for index in range(30)]
    assert first != [draw(8, index, SMALL)[0] for index in range(30)]
    for raw in first:
        case = build(raw, None, None)
        assert case is not None and case.expect.ok
        assert case.batch <= SMALL.batch and case.num_heads <= SMALL.num_heads and case.head_dim <= SMALL.head_dim
    # boundaries are drawn: tails of one row, GQA groups, non-square blocks, both layouts
    held = set().union(*(features(build(raw, None, None)) for raw in first))  # type: ignore[arg-type]
    assert {"tail-1", "non-square", "layout=TND", "dtype=bfloat16"} <= held
    assert any(h.startswith("group=") for h in held)


def test_every_shrink_candidate_is_smaller_or_simpler() -> None:
    raw, case = draw(3, 0, SMALL)
    for candidate in candidates(raw):
        assert candidate != raw
        smaller = build(candidate, None, None)
        if smaller is not None:
            assert smaller.batch <= case.batch and smaller.num_heads <= case.num_heads
            assert smaller.head_dim <= case.head_dim


@pytest.mark.parametrize(
    ("fault", "fields"),
    [
        ("tail-row-unwritten", dict(q_seq_len=17, kv_seq_len=17)),
        ("batch-past-second", dict(batch=3)),
        ("gqa8-head-unwritten", dict(num_heads=8, num_kv_heads=1)),
        ("nonsquare-d64-half", dict(head_dim=64, block_shape=(16, 32))),
        ("after-empty-skipped", dict(layout="TND", actual_seq_lengths=(20, 0, 20), actual_seq_lengths_kv=(20, 0, 20))),
    ],
)
def test_a_shape_fault_strikes_its_shape_only(fault: str, fields: dict) -> None:
    base = dict(q_seq_len=32, kv_seq_len=32, block_shape=(16, 16), head_dim=32, batch=2, num_heads=2, num_kv_heads=2)
    if fields.get("layout") == "TND":
        base.update(batch=3, q_seq_len=20, kv_seq_len=20)
    struck = make_case("struck", **{**base, **fields})
    tensors = make_inputs(struck, np.ones(struck.mask_shape, dtype=np.uint8))
    clean, planted = reference.emulate(struck, tensors), reference.emulate(struck, tensors, fault)
    assert faults.fault_applies(fault, struck, tensors["block_sparse_mask"])
    assert any(not np.array_equal(clean[g], planted[g]) for g in clean)
    plain = make_case("plain", **base)  # the shapes shipped suites hold: the fault changes nothing
    tensors = make_inputs(plain, np.ones(plain.mask_shape, dtype=np.uint8))
    assert not faults.fault_applies(fault, plain, tensors["block_sparse_mask"])
    clean, planted = reference.emulate(plain, tensors), reference.emulate(plain, tensors, fault)
    assert all(np.array_equal(clean[g], planted[g]) for g in clean)


def _settings(out: Path, fault: str | None, max_cases: int, seed: int) -> FuzzSettings:
    options = devices.RunOptions(device=devices.create(fault=fault))
    return FuzzSettings(
        out=out, seed=seed, budget=600.0, options=options, bounds=SMALL, max_cases=max_cases, max_shrink_runs=12
    )


def test_a_planted_fault_is_found_shrunk_and_reproduced_by_bsa_check(tmp_path: Path) -> None:
    # seed 56's first case is BNSD, Sq = 65 with 64-row blocks, dense, GQA 2: a tail of one row
    result = fuzz(_settings(tmp_path / "fz", "tail-row-unwritten", max_cases=1, seed=56))
    assert result.return_code == 1 and result.failures
    failure = result.failures[0]
    assert failure.repro_flops * 10 <= failure.first_flops and failure.shrink_steps >= 1
    assert "tail-1" in failure.features
    record = json.loads((tmp_path / "fz" / "fuzz.json").read_text())
    assert record["drawn"] == 1 and len(record["cases"]) == len(result.tried) == 1 + failure.shrink_runs
    assert {"params", "flops", "verdict", "diagnosis"} <= set(record["cases"][0])
    repro = tmp_path / "fz" / "repro" / f"{failure.repro}.yaml"
    text = repro.read_text()
    assert "--seed 56" in text and "first failing case" in text
    assert yaml.safe_load(text)["cases"][0]["name"] == failure.repro
    report = tmp_path / "r.json"
    again = invoke("check", repro, "-o", tmp_path / "again", "--fault", "tail-row-unwritten", "--json", report)
    assert again.exit_code == 1
    [case] = json.loads(report.read_text())["cases"]
    assert case["verdict"] == "FAIL" and case["diagnosis"][0]["kind"] == failure.diagnosis.split(":")[0]
    assert invoke("check", repro, "-o", tmp_path / "clean").exit_code == 0  # the repro fails only with the fault


def test_a_clean_device_passes_and_the_command_exits_0(tmp_path: Path) -> None:
    result = invoke("fuzz", "-o", tmp_path / "fz", "--budget", "5m", "--max-cases", "4", "--seed", "2")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "fz" / "fuzz.json").read_text())
    assert record["drawn"] == 4 and {c["verdict"] for c in record["cases"]} == {"PASS"}
    assert not (tmp_path / "fz" / "repro").exists()


def test_a_bad_budget_is_one_error_line(tmp_path: Path) -> None:
    result = invoke("fuzz", "-o", tmp_path / "fz", "--budget", "soon")
    assert result.exit_code == 2 and "'soon' is not a duration > 0 such as 90s, 10m or 1h" in result.output
