"""The commercial standard's recheck: the bootstrap interval of the median ratio, what fails narrowly, and
`bsa check --recheck N` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

from bsa_cli.compare import Check
from bsa_cli.compare.recheck import MIN_RUNS, bootstrap, fails_narrowly, run_ratio
from tests.helpers import BASE, case, invoke, tensor


def test_runs_whose_median_is_below_the_limit_pass() -> None:
    ratios = np.random.default_rng(1).uniform(0.7, 1.2, size=MIN_RUNS)  # median about 0.95
    judged = bootstrap(ratios)
    assert judged.passed and judged.runs == MIN_RUNS
    assert judged.lower <= judged.median <= judged.upper and judged.lower <= 1.0
    assert judged.ratios == tuple(float(r) for r in ratios)


def test_runs_whose_whole_interval_is_above_the_limit_fail() -> None:
    ratios = np.random.default_rng(2).uniform(1.05, 1.3, size=MIN_RUNS)
    judged = bootstrap(ratios)
    assert not judged.passed and judged.lower > 1.0 and "above 1" in judged.why


def test_an_interval_straddling_the_limit_passes_since_only_its_lower_end_decides() -> None:
    ratios = np.concatenate([np.full(100, 0.99), np.full(100, 1.01)])
    judged = bootstrap(ratios)
    assert judged.lower < 1.0 < judged.upper and judged.passed


def test_too_few_runs_fail_whatever_their_ratios() -> None:
    judged = bootstrap([0.1] * (MIN_RUNS - 1))
    assert not judged.passed and "fewer than 200" in judged.why
    assert not bootstrap([]).passed


def test_the_interval_is_the_order_statistics_of_the_resampled_medians() -> None:
    """With B = 2000 the ends are the 50th and 1951st smallest medians (the text's 25th and 976th of 1000)."""
    ratios = np.arange(MIN_RUNS, dtype=float)
    medians = np.sort(np.median(ratios[np.random.Generator(np.random.PCG64(0)).integers(0, 200, (2000, 200))], axis=1))
    judged = bootstrap(ratios)
    assert (judged.lower, judged.upper) == (medians[49], medians[1950])


def test_only_failures_within_the_standards_margin_are_narrow() -> None:
    judged = (tensor("dq", False),)
    narrow = case("n", "FAIL", checks=(check_of(1.2),), tensors=judged)
    far = case("f", "FAIL", checks=(check_of(1.3),), tensors=judged)  # double-benchmark's margin is 1.25
    structural = case("s", "FAIL", checks=(check_of(math.inf),), tensors=judged)
    assert fails_narrowly(narrow) and not fails_narrowly(far) and not fails_narrowly(structural)
    assert not fails_narrowly(case("p", "PASS")) and run_ratio(narrow) == 1.2


def check_of(severity: float) -> Check:
    """A failed RMSE ratio check `severity` times its limit."""
    return Check("rmse_ratio", "dq", 2 * severity, 2.0, False, "dq RMSE ratio", severity)


def test_check_recheck_reruns_a_narrow_failure_and_reports_the_interval(tmp_path: Path) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text(yaml.safe_dump({"cases": [BASE]}))
    out, report = tmp_path / "out", tmp_path / "r.json"
    mixed = ("check", spec, "-o", out, "--standard", "mixed-tolerance", "--json", report, "--threshold", "ulp_factor=0")
    assert invoke(*mixed).exit_code == 0
    largest = max(t["max_abs_error"] for t in json.loads(report.read_text())["cases"][0]["tensors"])
    # the largest error 1.1 times its limit: a narrow failure (mixed tolerance's margin is 2)
    narrow = invoke(*mixed, "--threshold", f"max_abs_floor={largest / 1.1!r}", "--recheck", "3")
    assert narrow.exit_code == 1, narrow.output
    recheck = json.loads(report.read_text())["cases"][0]["recheck"]
    assert recheck["runs"] == 3 and len(recheck["ratios"]) == 3 and not recheck["passed"]
    assert recheck["lower"] <= recheck["median"] <= recheck["upper"]
    assert all(0.5 < r < 2 for r in recheck["ratios"])  # other seeds, errors of the same size
    assert "fewer than 200" in recheck["why"] and "recheck over 3 reseeded runs" in narrow.output
    assert sorted(p.name for p in (out / ".recheck").iterdir()) == ["c.recheck1", "c.recheck2", "c.recheck3"]
    # three times over the limit: not narrow, not rechecked
    far = invoke(*mixed, "--threshold", f"max_abs_floor={largest / 3!r}", "--recheck", "3")
    assert far.exit_code == 1 and json.loads(report.read_text())["cases"][0]["recheck"] is None
