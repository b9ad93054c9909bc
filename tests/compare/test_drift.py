"""Drift between nights: `bsa compare --baseline`, `--fail-on-regression` and `bsa trend`.

Nights are made through the real code path: case folders with outputs of the reference device (`bsa run`,
a fresh dK/dV order each time), judged by `bsa compare --json`. A slowly growing error is planted by
scaling one case's dq error against the golden (1x, 1.3x, 1.6x: every night still passes). Only the
reports' dates are rewritten afterwards, to stand for three nights.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from bsa_cli import report
from bsa_cli.cli import main
from bsa_cli.compare import drift
from bsa_cli.core.case import numpy_dtype
from tests import helpers
from tests.helpers import Page, build_case, make_case, read_grad, rewrite_grad

GROWTH = (1.0, 1.3, 1.6)
"""How many times its clean error the growing case's dq carries in nights 1, 2, 3."""

DATES = ("2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00", "2026-11-30T02:00:00+00:00")


def invoke(*args: object) -> Result:
    """Run `bsa ARGS` (an exception in bsa propagates)."""
    return helpers.invoke(*args, catch_exceptions=False)


def grow_dq(case_dir: Path, factor: float) -> None:
    """Scale the device dq's error against the golden by `factor` (rounded to the case dtype again)."""
    case = make_case(case_dir.name, **CASES[case_dir.name])
    gold = np.fromfile(case_dir / "golden" / "dq.bin", dtype=np.float32).reshape(case.q_shape)
    device = read_grad(case_dir, "dq", case).astype(np.float32)
    grown = gold + factor * (device - gold)
    rewrite_grad(case_dir, "dq", grown.astype(numpy_dtype(case.dtype)))
    # As if the device had written it: `bsa run` records each output's sha256, and compare checks it.
    record_path = case_dir / "outputs" / "run.json"
    record = json.loads(record_path.read_text())
    record["outputs"]["dq"]["sha256"] = hashlib.sha256((case_dir / "outputs" / "dq.bin").read_bytes()).hexdigest()
    record_path.write_text(json.dumps(record))


CASES = {"grow": dict(seed=3), "steady": dict(num_heads=4, num_kv_heads=2, seed=4)}


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nights") / "out"
    for name, fields in CASES.items():
        build_case(root, make_case(name, **fields), outputs=False)
    return root


def night(suite_dir: Path, work: Path, index: int, factor: float, date: str | None = None) -> Path:
    """Run the suite on the reference device, plant `factor` in the growing case, judge it into night-N.json."""
    out = work / f"out{index}"
    shutil.copytree(suite_dir, out)
    assert invoke("run", out).exit_code == 0
    grow_dq(out / "grow", factor)
    path = work / f"night-{index}.json"
    result = invoke("compare", out, "--json", path)
    assert result.exit_code == 0, result.output  # every night passes
    if date is not None:
        document = json.loads(path.read_text())
        document["date"] = date
        path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def nights(suite_dir, tmp_path_factory) -> list[Path]:
    work = tmp_path_factory.mktemp("reports")
    return [night(suite_dir, work, i + 1, factor, DATES[i]) for i, factor in enumerate(GROWTH)]


def dq_ratio(path: Path, check: str = "mere_ratio", case: str = "grow") -> float:
    document = json.loads(path.read_text())
    found = next(c for c in document["cases"] if c["name"] == case)
    tensor = next(t for t in found["tensors"] if t["name"] == "dq")
    return next(c["value"] for c in tensor["checks"] if c["name"] == check)


# ---- the margin -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "limit", "regressed"),
    [
        (1.0, 1.04, 2.0, False),  # run-to-run noise (at most 4.5% measured)
        (1.0, 1.2, 2.0, True),
        (1.8, 1.95, 2.0, False),  # +8%: under the relative margin
        (0.05, 0.09, 2.0, False),  # +80% of a ratio floored at err_thd: far from the limit
        (0.05, 0.3, 2.0, True),
        (1.0, math.inf, 2.0, True),
        (math.inf, math.inf, 2.0, False),
        (1.0, math.nan, 2.0, True),
        (1.5, 1.0, 2.0, False),
    ],
)
def test_margin_needs_relative_and_absolute_growth(old, new, limit, regressed):
    assert drift.Margin().regressed(old, new, limit) is regressed


def test_margin_option_is_parsed_and_checked():
    assert drift.parse_margin("0.2,0.1") == drift.Margin(0.2, 0.1)
    for text in ("0.2", "a,b", "-1,0.1", "nan,0.1", "0.1,0.1,0.1"):
        with pytest.raises(ValueError, match="expected REL,ABS"):
            drift.parse_margin(text)


# ---- bsa compare --baseline -------------------------------------------------------------------------


def test_the_planted_error_grows_while_every_night_passes(nights):
    ratios = [dq_ratio(p) for p in nights]
    assert ratios[0] < ratios[1] < ratios[2] < 2, ratios
    floored = [dq_ratio(p, "rmse_ratio") for p in nights]  # this small case's RMSE is under err_thd
    assert floored[0] < floored[1] < floored[2] < 0.2, floored


def test_baseline_flags_the_third_night_against_the_second_and_the_first(nights, tmp_path):
    out = tmp_path / "out3"
    shutil.copytree(Path(str(nights[2]).replace("night-3.json", "out3")), out)
    for baseline in nights[:2]:
        result = invoke(
            "compare", out, "--baseline", baseline, "--json", tmp_path / "r.json", "--html", tmp_path / "r.html"
        )
        assert result.exit_code == 0, result.output  # regressions alone keep the exit code
        document = json.loads((tmp_path / "r.json").read_text())
        flagged = {(r["case"], r["tensor"], r["check"]) for r in document["regressions"]}
        assert ("grow", "dq", "mere_ratio") in flagged
        assert ("grow", "dq", "rmse_ratio") not in flagged  # grew by 20% or more, but far below its limit
        assert {case for case, _, _ in flagged} == {"grow"}  # the steady case's dK/dV noise does not flag
        regression = next(r for r in document["regressions"] if r["check"] == "mere_ratio")
        assert regression["old"] == pytest.approx(dq_ratio(baseline)) and regression["passed"] is True
        assert regression["delta"] == pytest.approx(regression["new"] - regression["old"])
        assert document["drift"]["baseline"]["date"] == DATES[nights.index(baseline)]
        assert document["drift"]["summary"]["regressions"] == len(document["regressions"])
        assert "grow" in result.stdout and "regressions since 2026-1" in result.stdout
        page = Page((tmp_path / "r.html").read_text())
        rows = page.find("tr", **{"class": "regressed"})
        assert rows and all(Page.text(r).startswith("grow") for r in rows)
        assert any("REGRESSION" in Page.text(r) for r in rows)


def test_fail_on_regression_exits_1(nights):
    out = Path(str(nights[2]).replace("night-3.json", "out3"))
    result = invoke("compare", out, "--baseline", nights[1], "--fail-on-regression")
    assert result.exit_code == 1, result.output
    assert " regression" in result.stdout and " 0 regressions" not in result.stdout


def test_clean_repeats_do_not_flag(suite_dir, tmp_path):
    first = night(suite_dir, tmp_path, 1, 1.0)
    for index in (2, 3):  # fresh dK/dV accumulation orders: the steady GQA case's dk, dv move a little
        again = night(suite_dir, tmp_path, index, 1.0)
        result = invoke(
            "compare",
            tmp_path / f"out{index}",
            "--baseline",
            first,
            "--fail-on-regression",
            "--json",
            tmp_path / "r.json",
        )
        assert result.exit_code == 0, result.output
        document = json.loads((tmp_path / "r.json").read_text())
        assert document["regressions"] == [] and document["drift"]["summary"]["compared"] == 2
        assert len(document["drift"]["changes"]) == 2 * 3 * 5  # cases x tensors x ratio checks
        assert again.is_file()


def seeded(suite_dir: Path, out: Path, seed: int) -> Path:
    """Copy the suite and run each case on the reference device with a fixed dK/dV order (`bsa emulate --seed`)."""
    shutil.copytree(suite_dir, out)
    for name in CASES:
        assert invoke("emulate", out / name, out / name / "outputs", "--seed", seed).exit_code == 0
    return out


def test_a_zero_margin_flags_clean_noise_that_the_default_margin_ignores(suite_dir, tmp_path):
    """The planted side of the clean-repeat test: without a margin, run-to-run dK/dV noise is flagged."""
    first = seeded(suite_dir, tmp_path / "first", 1)
    assert invoke("compare", first, "--json", tmp_path / "base.json").exit_code == 0
    moved, flagged = [], []
    for seed in (2, 3, 4, 5):
        again = seeded(suite_dir, tmp_path / f"again{seed}", seed)
        result = invoke(
            "compare",
            again,
            "--baseline",
            tmp_path / "base.json",
            "--regression-margin",
            "0,0",
            "--json",
            tmp_path / "r.json",
        )
        assert result.exit_code == 0
        document = json.loads((tmp_path / "r.json").read_text())
        moved += [c for c in document["drift"]["changes"] if c["delta"] != 0]
        flagged += document["regressions"]
        assert all(r["delta"] > 0 for r in document["regressions"])
        invoke("compare", again, "--baseline", tmp_path / "base.json", "--json", tmp_path / "r.json")
        assert json.loads((tmp_path / "r.json").read_text())["regressions"] == []
    assert moved and {c["tensor"] for c in moved} <= {"dk", "dv"}  # dq rows have one owner: dq never moves
    assert flagged


def test_vanished_and_failing_cases_count_with_fail_on_regression(nights, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(Path(str(nights[0]).replace("night-1.json", "out1")), out)
    shutil.rmtree(out / "steady")
    result = invoke("compare", out, "--baseline", nights[0], "--json", tmp_path / "r.json")
    assert result.exit_code == 0
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["drift"]["vanished"] == ["steady"] and document["regressions"] == []
    assert "vanished since the baseline: steady" in result.stdout
    result = invoke("compare", out, "--baseline", nights[0], "--fail-on-regression", "--json", tmp_path / "r.json")
    assert result.exit_code == 1 and json.loads((tmp_path / "r.json").read_text())["exit_code"] == 1
    (out / "grow" / "outputs" / "dk.bin").unlink()  # PASS -> ERROR: the suite's exit code 3 is kept
    result = invoke("compare", out, "--baseline", nights[0], "--fail-on-regression", "--json", tmp_path / "r.json")
    assert result.exit_code == 3
    changes = json.loads((tmp_path / "r.json").read_text())["drift"]["verdict_changes"]
    assert [(c["case"], c["old"], c["new"], c["worsened"]) for c in changes] == [("grow", "PASS", "ERROR", True)]


def test_appeared_cases_do_not_fail(nights, tmp_path):
    document = json.loads(nights[0].read_text())
    document["cases"] = [c for c in document["cases"] if c["name"] != "steady"]
    (tmp_path / "old.json").write_text(json.dumps(document))
    out = Path(str(nights[0]).replace("night-1.json", "out1"))
    result = invoke("compare", out, "--baseline", tmp_path / "old.json", "--fail-on-regression")
    assert result.exit_code == 0 and "new since the baseline: steady" in result.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "--baseline {path}: not valid JSON: "),
        ('{"schema": "bsa-run/1"}', "--baseline {path}: schema 'bsa-run/1' is not 'bsa-compare/1'"),
        ('{"schema": "bsa-compare/1", "cases": [{"name": 1}]}', "--baseline {path}: malformed report"),
        (
            '{"schema": "bsa-compare/1", "cases": [], "date": "yesterday"}',
            "--baseline {path}: malformed report (field 'date': date 'yesterday' is not",
        ),
        ("[" * 100_000 + "]" * 100_000, "--baseline {path}: not valid JSON"),
        (b"\xff\xfe", "--baseline {path}: not valid JSON"),
    ],
)
def test_a_bad_baseline_is_a_usage_error(nights, tmp_path, content, message):
    path = tmp_path / "old.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = Path(str(nights[0]).replace("night-1.json", "out1"))
    result = CliRunner().invoke(main, ["compare", str(out), "--baseline", str(path)])
    assert result.exit_code == 2 and result.stderr.startswith("Error: " + message.format(path=path)), result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_huge_or_missing_baseline_is_refused_before_judging(nights, tmp_path, monkeypatch):
    out = Path(str(nights[0]).replace("night-1.json", "out1"))
    monkeypatch.setattr(report.document, "REPORT_MAX_BYTES", 1000)
    result = invoke("compare", out, "--baseline", nights[0])
    assert result.exit_code == 2 and "more than the 1000 bytes bsa reads" in result.stderr
    result = invoke("compare", out, "--baseline", tmp_path / "none.json")
    missing = tmp_path / "none.json"
    assert result.exit_code == 2 and result.stderr == f"Error: --baseline {missing}: cannot read JSON report: missing\n"


def test_drift_options_need_a_baseline(nights):
    out = Path(str(nights[0]).replace("night-1.json", "out1"))
    result = invoke("compare", out, "--fail-on-regression")
    assert result.exit_code == 2 and "--fail-on-regression needs --baseline OLD.json" in result.stderr


# ---- the report's date and device, merged shards -------------------------------------------------------


def test_reports_carry_date_host_and_device_and_merging_keeps_them(nights, tmp_path):
    document = json.loads(nights[0].read_text())
    assert document["schema"] == "bsa-compare/1" and document["schema_minor"] == report.SCHEMA_MINOR
    assert document["date"] == DATES[0] and isinstance(document["host"], str)
    assert document["devices"] == [
        {
            "device": "reference (bsa emulate)",
            "kind": "reference",
            "name": "reference (bsa emulate)",
            "fault": None,
            "binary_sha256": None,
            "cases": 2,
        }
    ]
    first = {**document, "cases": document["cases"][:1], "date": "2026-11-28T02:05:00+00:00", "host": "ci-1"}
    second = {**document, "cases": document["cases"][1:], "date": "2026-11-28T03:10:00+01:00", "host": "ci-2"}
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    result = invoke("compare", "--merge", tmp_path / "a.json", tmp_path / "b.json", "--json", tmp_path / "m.json")
    assert result.exit_code == 0, result.output
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["date"] == "2026-11-28T02:10:00+00:00"  # the later shard's, in UTC
    assert merged["host"] == "ci-1, ci-2" and merged["devices"][0]["cases"] == 2


def test_the_report_date_is_utc():
    suite = report.merge([])
    assert report.to_document(suite)["date"].endswith("+00:00")


# ---- bsa trend ---------------------------------------------------------------------------------------


def test_trend_orders_nights_by_date_and_draws_one_chart_per_case(nights, tmp_path):
    html = tmp_path / "t" / "trend.html"
    result = invoke("trend", nights[2], nights[0], nights[1], "--html", html)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(" ")[2] for line in lines[:3]] == ["2026-11-28", "2026-11-29", "2026-11-30"]
    assert "rising: grow dq " in result.stdout and "rising: steady" not in result.stdout
    assert lines[-1] == "2 cases over 3 nights: 1 rising"
    text = html.read_text()
    assert "<script" not in text and "http" not in text.replace("http://www.w3.org", "")
    page = Page(text)
    figures = page.find("figure")
    assert [f[1]["id"] for f in figures] == ["trend-grow", "trend-steady"]
    svgs = page.find("svg")
    assert len(svgs) == 2
    points = [e for e in page.elements if e[0] == "circle" and "point" in e[1].get("class", "")]
    assert len(points) == 6 and all(p[1]["fill"] == "#16702a" for p in points)  # 3 per case, all PASS
    limits = page.find("line", **{"class": "limit"})
    assert len(limits) == 2 and {float(line[1]["y1"]) for line in limits} == {float(line[1]["y2"]) for line in limits}
    lines_drawn = [e for e in page.elements if e[0] == "polyline"]
    assert len(lines_drawn) == 2 and all(len(p[1]["points"].split()) == 3 for p in lines_drawn)
    # the growing case's points rise: smaller y is higher on the page
    grow_y = [float(p[1]["cy"]) for p in points[:3]]
    assert grow_y[0] > grow_y[1] > grow_y[2]
    titles = [Page.text(p) for p in points[:3]]
    assert titles[0].startswith("2026-11-28 02:00 reference (bsa emulate): PASS; dq ")
    rising_rows = page.find("tr", **{"class": "rising"})
    assert len(rising_rows) == 1 and Page.text(rising_rows[0]).startswith("grow")


def test_a_case_missing_from_a_night_leaves_a_gap(nights, tmp_path):
    document = json.loads(nights[1].read_text())
    document["cases"] = [c for c in document["cases"] if c["name"] != "steady"]
    (tmp_path / "n2.json").write_text(json.dumps(document))
    html = tmp_path / "trend.html"
    assert invoke("trend", nights[0], tmp_path / "n2.json", nights[2], "--html", html).exit_code == 0
    page = Page(html.read_text())
    steady = next(f for f in page.find("figure") if f[1]["id"] == "trend-steady")
    start = page.elements.index(steady)
    below = page.elements[start + 1 :]
    end = next((i for i, e in enumerate(below) if e[0] == "figure"), len(below))
    inside = below[:end]
    assert sum(1 for e in inside if e[0] == "circle") == 2
    assert not any(e[0] == "polyline" for e in inside)  # nights 1 and 3 are not joined across the gap


def test_trend_refuses_bad_and_undated_reports(nights, tmp_path):
    document = json.loads(nights[0].read_text())
    del document["date"]
    (tmp_path / "old.json").write_text(json.dumps(document))
    result = invoke("trend", nights[1], tmp_path / "old.json")
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {tmp_path / 'old.json'}: the report has no date")
    (tmp_path / "bad.json").write_text("nope")
    result = invoke("trend", nights[1], tmp_path / "bad.json", "--html", tmp_path / "t.html")
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {tmp_path / 'bad.json'}: not valid JSON")
    assert not (tmp_path / "t.html").exists()
    result = invoke("trend", nights[1], "--html", tmp_path)
    assert result.exit_code == 2


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_the_terminal_drift_section_keeps_names_whole_at_every_width(nights, tmp_path, columns):
    import os
    import subprocess
    import sys

    out = tmp_path / "out3"
    shutil.copytree(Path(str(nights[2]).replace("night-3.json", "out3")), out)
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, "-m", "bsa_cli", "compare", str(out), "--baseline", str(nights[0])],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("regressions since"))
    section = [line for line in lines[start:] if "mere_ratio" in line]
    assert section and all("grow" in line for line in section)  # case and check on one line
    assert all(len(line.rstrip()) <= columns for line in section)


def test_a_failing_night_says_what_failed_even_when_the_chart_follows_another_check(nights):
    """The bias check's value is a score, never charted: a night it fails shows its text on the point."""
    from bsa_cli import report
    from bsa_cli.compare.drift import trend

    documents = [json.loads(path.read_text()) for path in nights[:2]]
    case = next(c for c in documents[1]["cases"] if c["name"] == "grow")
    case["verdict"] = "FAIL"
    case["tensors"][0]["checks"].append(
        {
            "name": "bias",
            "tensor": case["tensors"][0]["name"],
            "value": 9.0,
            "limit": 5.0,
            "passed": False,
            "detail": "dq bias -3e-4 ± 1e-5 (planted)",
            "severity": 1.8,
        }
    )
    series = next(
        s
        for s in trend([report.night_from_document(d, f"n{i}") for i, d in enumerate(documents)]).series
        if s.case == "grow"
    )
    assert series.check != "bias"  # a score is never charted
    assert series.points[1].detail.startswith("dq bias -3e-4") and "; charted: " in series.points[1].detail
    assert "dq bias" not in series.points[0].detail


def with_other_inputs(path: Path, tmp_path: Path, case: str = "grow") -> Path:
    """A copy of a night's report in which `case` ran on other input bytes (as after a new seed or rounding)."""
    document = json.loads(path.read_text())
    entry = next(c for c in document["cases"] if c["name"] == case)
    assert isinstance(entry["inputs_sha256"], str) and len(entry["inputs_sha256"]) == 64
    entry["inputs_sha256"] = "0" * 64
    copy = tmp_path / f"other-inputs-{path.name}"
    copy.write_text(json.dumps(document))
    return copy


def test_a_baseline_whose_inputs_differ_says_so_instead_of_reporting_drift(nights, tmp_path):
    out = tmp_path / "out3"
    shutil.copytree(Path(str(nights[2]).replace("night-3.json", "out3")), out)
    baseline = with_other_inputs(nights[0], tmp_path)
    result = invoke("compare", out, "--baseline", baseline, "--json", tmp_path / "r.json", "--fail-on-regression")
    assert result.exit_code == 0, result.output  # the grown dq error is not a regression: other inputs
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["regressions"] == [] and document["drift"]["inputs_changed"] == ["grow"]
    assert document["drift"]["summary"]["inputs_changed"] == 1
    assert not any(c["case"] == "grow" for c in document["drift"]["changes"])
    assert "inputs changed since the baseline (another spec, seed or bsa version) for 1 case: grow" in result.stdout
    assert invoke("compare", out, "--baseline", nights[0], "--fail-on-regression").exit_code == 1  # same inputs


def test_trend_does_not_call_a_change_of_inputs_rising(nights, tmp_path):
    result = invoke("trend", nights[0], nights[1], nights[2])
    assert "rising: grow dq " in result.stdout
    changed = with_other_inputs(nights[2], tmp_path)
    result = invoke("trend", nights[0], nights[1], changed, "--html", tmp_path / "t.html")
    assert result.exit_code == 0, result.output
    assert "rising: grow" not in result.stdout
    page = Page((tmp_path / "t.html").read_text())
    points = [e for e in page.elements if e[0] == "circle" and "point" in e[1].get("class", "")]
    assert "inputs changed since the night before" in Page.text(points[2])


def test_the_inputs_digest_follows_the_input_hashes() -> None:
    from bsa_cli.store.manifest import inputs_digest

    one = {"inputs": {"query": {"sha256": "a" * 64}, "key": {"sha256": "b" * 64}}}
    same = {"inputs": {"key": {"sha256": "b" * 64}, "query": {"sha256": "a" * 64}}}
    other = {"inputs": {"query": {"sha256": "a" * 64}, "key": {"sha256": "c" * 64}}}
    assert inputs_digest(one) == inputs_digest(same) != inputs_digest(other)
    assert inputs_digest({}) is None and inputs_digest({"inputs": {"query": {"sha256": 3}}}) is None
