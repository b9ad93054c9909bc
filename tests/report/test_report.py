"""Tests of bsa_cli.report: terminal snapshots, JSON schema and round trip, shard merging, JUnit, HTML.

Rendering is tested on a hand-built `SuiteResult` (no numerics, so snapshots do not depend on BLAS);
the JSON round trip also runs on real results. A missing snapshot fails; `--update-snapshots` (or
BSA_UPDATE_SNAPSHOTS=1) writes them (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from rich.console import Console

from bsa_cli import compare, report
from bsa_cli.compare import FAIL, PASS, Check, SuiteResult
from tests.helpers import build_case, case, make_case, sample_suite, tensor


def render(suite: SuiteResult, verbose: bool = False) -> str:
    console = Console(file=io.StringIO(), width=100, color_system=None)
    report.render_terminal(suite, console, verbose=verbose)
    return console.file.getvalue()


# ---- terminal -----------------------------------------------------------------------------------


def test_terminal_report_snapshot(snapshot):
    snapshot("terminal.txt", render(sample_suite()))


def test_terminal_report_verbose_snapshot(snapshot):
    snapshot("terminal_verbose.txt", render(sample_suite(), verbose=True))


def test_terminal_report_leads_with_a_line_per_case_and_keeps_the_detail_for_verbose():
    """A failure's checks, worst elements and hot blocks are behind -v (and in the HTML report); an unjudged
    case's errors stay whole (their paths are copied from there); the summary is the last line."""
    text = render(sample_suite())
    assert "| edge-tile    | FAIL    | dq worst 16x16 tile RMSE ratio 5 > 3" in text
    assert "hot blocks" not in text and "worst elements" not in text and ": checks" not in text
    assert "edge-missing: could not be judged" in text
    assert "come from the reference device (bsa emulate), not from hardware" in text
    assert text.rstrip().endswith("4 cases: 2 passed, 1 failed, 1 error")
    verbose = render(sample_suite(), verbose=True)
    assert "edge-tile dq: hot blocks (query block i)" in verbose and "b=0,n=1,s=70,d=33 i=2" in verbose
    assert verbose.rstrip().endswith("4 cases: 2 passed, 1 failed, 1 error")


@pytest.mark.parametrize("width", [56, 80])
def test_no_number_is_cut_at_a_narrow_width_a_column_is_left_out_and_named(width):
    """Every detail table through a fixed-width console: a cell is whole or its column is left out, and the
    caption says which (before, rich cut `4.14e-05` to `4.14e-…` and wrapped `where` mid-cell)."""
    console = Console(file=io.StringIO(), width=width, color_system=None)
    report.render_terminal(sample_suite(), console, verbose=True)
    text = console.file.getvalue()
    assert "…" not in text
    assert all(len(line.rstrip()) <= width for line in text.splitlines() if line.startswith(("|", "+")))
    assert "| b=0,n=1,s=70,d=33 i=2 |" in text  # the worst element's place, on one line
    assert f"left out at {width} columns: " in text  # the hot blocks' table is 84 wide


def test_a_command_that_named_the_device_gets_no_note_of_it():
    console = Console(file=io.StringIO(), width=100, color_system=None)
    report.render_terminal(sample_suite(), console, device_named=True)
    assert "reference device" not in console.file.getvalue()


def test_terminal_output_is_plain_text_without_a_tty():
    text = render(sample_suite())
    assert "\x1b[" not in text and text.isascii()


# ---- JSON ---------------------------------------------------------------------------------------

CASE_KEYS = {
    "name",
    "case_dir",
    "output_dir",
    "verdict",
    "spec",
    "device",
    "standard",
    "settings",
    "dtype",
    "layout",
    "expect_status",
    "status",
    "status_message",
    "checks",
    "tensors",
    "errors",
    "output_bytes",
    "seconds",
    "device_kind",
    "fault",
    "binary_sha256",
    "notes",
    "selection",
    "kernel_notes",
    "message",
    "headline",
    "deciding",
    "inputs_sha256",
    "release",
    "device_cann",
    "diagnosis",
    "hypotheses",
    "op",
    "case",
    "expected_failure",
    "recheck",
    "side_verdicts",
}
TENSOR_KEYS = {
    "name",
    "shape",
    "dtype",
    "axes",
    "device",
    "benchmark",
    "checks",
    "worst",
    "hot_blocks",
    "block_map",
    "extra",
    "ulp_chart",
    "golden_dtype",
    "bias",
    "passed",
    "sides",
    "matched_ratio",
    "max_abs_error",
}
STATS_KEYS = {
    "count",
    "max_abs_err",
    "mean_abs_err",
    "rmse",
    "max_rel_err",
    "mean_rel_err",
    "large_count",
    "small_value_count",
    "small_value_err_count",
    "nan_count",
    "inf_count",
    "nonfinite_mismatch",
    "mare",
    "mere",
    "cosine",
    "mismatch_count",
    "mismatch_ratio",
    "side_mismatch_counts",
    "max_abs_golden",
    "error_balance",
    "ulp_max",
    "ulp_mean",
    "ulp_histogram",
    "msopst_err_count",
    "msopst_max_err",
    "bias",
    "bias_se",
    "thousandth_ratio",
    "five_thousandths_ratio",
    "value_max",
    "value_min",
    "value_mean",
    "value_l2norm",
    "golden_max",
    "golden_min",
    "golden_mean",
    "golden_l2norm",
}


def test_json_schema_is_stable():
    document = report.to_document(sample_suite())
    assert set(document) == {
        "schema",
        "schema_minor",
        "tool",
        "date",
        "host",
        "devices",
        "exit_code",
        "summary",
        "cases",
    }
    assert document["schema"] == "bsa-compare/1" and document["schema_minor"] == 5 and document["exit_code"] == 3
    reference = "reference (bsa emulate)"
    assert document["devices"] == [
        {"device": reference, "kind": None, "name": reference, "fault": None, "binary_sha256": None, "cases": 4}
    ]
    assert document["summary"] == {
        "cases": 4,
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 0,
        "output_bytes": 3000,
        "seconds": 1.5,
        "verdicts_differ": [],
    }
    for case_data in document["cases"]:
        assert set(case_data) == CASE_KEYS
    tensor_data = document["cases"][1]["tensors"][0]
    assert set(tensor_data) == TENSOR_KEYS
    assert set(tensor_data["device"]) == STATS_KEYS
    assert set(tensor_data["hot_blocks"][0]) == {
        "batch",
        "head",
        "block",
        "rows",
        "score",
        "rmse",
        "rmse_benchmark",
        "max_abs_err",
        "tile",
        "tile_ratio",
        "tiles",
    }
    assert set(tensor_data["worst"][0]) == {
        "index",
        "coords",
        "block",
        "device",
        "golden",
        "benchmark",
        "abs_err",
        "ulp",
    }
    assert set(tensor_data["block_map"]) == {"axis", "block_size", "rmse", "rmse_benchmark", "max_abs_err", "score"}
    assert tensor_data["block_map"]["score"] == [[[1.0, 1.0, 5.0, None]]]
    assert document["cases"][1]["deciding"]["name"] == "tile_ratio"
    assert document["cases"][1]["message"] == "dq worst 16x16 tile RMSE ratio 5 > 3"


def test_json_snapshot(tmp_path, snapshot):
    report.write_json(sample_suite(), tmp_path / "r.json")
    document = json.loads((tmp_path / "r.json").read_text())
    document["tool"]["version"] = "<version>"
    document["date"], document["host"] = "<date>", "<host>"
    snapshot("report.json", json.dumps(document, indent=1) + "\n")


def test_json_round_trip_keeps_everything(tmp_path):
    suite = sample_suite()
    header = report.report_header(suite)  # one date for both documents (a second may pass between them)
    document = report.to_document(suite, header)
    back = report.from_document(json.loads(json.dumps(document, allow_nan=False)))
    assert report.to_document(back, header) == document
    assert back.return_code == suite.return_code
    assert render(back) == render(suite)


def test_json_round_trip_of_real_results_is_strict_json(tmp_path):
    case_dir = build_case(
        tmp_path,
        make_case("real", batch=2, actual_seq_lengths=(96, 10), actual_seq_lengths_kv=(80, 5)),
        fault="nan-row",
    )
    suite = compare.compare_suite([case_dir], workers=1)
    header = report.report_header(suite)  # one date for both documents (a second may pass between them)
    report.write_json(suite, tmp_path / "r.json", header)
    document = json.loads((tmp_path / "r.json").read_text())  # NaN and Inf are written as strings
    assert document["cases"][0]["tensors"][0]["worst"][0]["device"] == "nan"
    back = report.from_document(document)
    assert report.to_document(back, header) == document
    assert math.isnan(back.cases[0].tensors[0].worst[0].device)
    np.testing.assert_array_equal(
        np.isnan(back.cases[0].tensors[0].block_map.score), np.isnan(suite.cases[0].tensors[0].block_map.score)
    )


def test_from_document_refuses_other_schemas():
    with pytest.raises(ValueError, match="r.json: schema 'bsa-run/1' is not 'bsa-compare/1'"):
        report.from_document({"schema": "bsa-run/1"}, "r.json")
    with pytest.raises(ValueError, match="malformed report"):
        report.from_document({"schema": "bsa-compare/1", "cases": [{"name": "x"}]}, "r.json")


def test_merge_of_shards_gives_the_suite_and_its_verdict():
    suite = sample_suite()
    document = report.to_document(suite)
    first = {**document, "cases": document["cases"][:2]}
    second = {**document, "cases": document["cases"][2:]}
    merged = report.merge([("a.json", first), ("b.json", second)])
    assert [c.name for c in merged.cases] == [c.name for c in suite.cases]
    assert merged.return_code == 3
    assert report.merge([("a.json", first)]).return_code == 1
    with pytest.raises(ValueError, match="case 'edge-tail' is in both a.json and b.json"):
        report.merge([("a.json", first), ("b.json", first)])


# ---- JUnit and HTML -----------------------------------------------------------------------------


def test_junit_has_one_testcase_per_case_with_failure_and_error_elements():
    root = ET.fromstring(report.junit_xml(sample_suite()))
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "4",
        "1",
        "1",
        "0",
    )
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["edge-tail", "edge-tile", "edge-missing", "neg-dtype"]
    assert cases["edge-tail"].get("classname") == "bsa.edge"
    assert cases["edge-tail"].find("failure") is None and cases["edge-tail"].find("error") is None
    failure = cases["edge-tile"].find("failure")
    assert failure is not None and failure.get("message") == "dq worst 16x16 tile RMSE ratio 5 > 3"
    assert "dq hot q block: b=0 n=1 q block=2 rows 64-96" in (failure.text or "")
    error = cases["edge-missing"].find("error")
    assert error is not None and "dk.bin: missing (expected 25600 bytes" in (error.get("message") or "")
    assert float(cases["edge-tile"].get("time")) == 0.5


def test_junit_escapes_control_characters_from_device_messages():
    bad = case("odd", FAIL, status=5, checks=(Check("status", None, 5.0, 0.0, False, "status 5: \x1b[31mboom\x00"),))
    root = ET.fromstring(report.junit_xml(SuiteResult((bad,))))
    assert root.find("testsuite/testcase/failure").get("message") == "status 5: ?[31mboom?"


def test_html_is_self_contained_and_lists_every_case():
    page = report.html_report(sample_suite())
    assert page.startswith("<!DOCTYPE html>")
    for tag in ("<script", "<link", "src=", "http://", "https://", "@import", "url(http"):
        assert tag not in page
    for name in ("edge-tail", "edge-tile", "edge-missing", "neg-dtype"):
        assert f'id="case-{name}"' in page


# ---- the verdict table at 80, 100 and 120 columns (issue 16, items 12 and 14) ------------------------------


def passing_suite() -> SuiteResult:
    """Passing cases whose deciding checks carry their numbers, as `bsa check cases/smoke.yaml` prints them."""
    detail = "dk small-value error ratio 1 <= 2 (small values off by more than small_value_thd: device 1585947, benchmark 1585947)"  # noqa: E501
    cases = []
    for name in ("smoke-bnsd-random.fp16", "smoke-bnsd-causal-tail", "smoke-gqa-empty-rows"):
        checks = (Check("small_value_ratio", "dk", 1.0, 2.0, True, detail, 0.5),)
        cases.append(case(name, PASS, tensors=(dataclasses.replace(tensor("dk", False), checks=checks),)))
    return SuiteResult(tuple(cases), seconds=1.0)


def table_of(suite: SuiteResult, width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    report.render_terminal(suite, console)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def test_a_pass_headline_names_the_check_closest_to_its_limit():
    (first, *_) = passing_suite().cases
    assert first.headline == (
        "closest to its limit: dk small-value error ratio 1 <= 2 (small values off by more than "
        "small_value_thd: device 1585947, benchmark 1585947)"
    )
    negative = sample_suite().cases[3]
    assert negative.headline.startswith("status 161002")  # a status is no limit to be close to


@pytest.mark.parametrize("width", [80, 100])
def test_a_narrow_verdict_table_gives_each_passing_case_one_line(width):
    lines = table_of(passing_suite(), width)
    assert lines[0] == "bsa compare: standard double-benchmark"  # one standard: no column repeating it
    start = next(i for i, line in enumerate(lines) if line.startswith("|---")) + 1
    rows = lines[start : start + 4]
    assert rows[3].startswith("+---")  # one line per case
    assert [row.split("|")[3].strip() for row in rows[:3]] == ["dk small-value error ratio 1 <= 2"] * 3
    assert "closest to its limit" in " ".join(lines[2:4])  # said once, in the column's heading
    assert all(len(line) <= width for line in lines)


def test_a_wide_verdict_table_keeps_each_passing_case_s_numbers():
    lines = table_of(passing_suite(), 200)
    assert lines[4] == (
        "| smoke-bnsd-random.fp16 | PASS    | closest to its limit: dk small-value error ratio 1 <= 2 "
        "(small values off by more than small_value_thd: device 1585947, benchmark 1585947) |"
    )


def test_several_standards_keep_the_standard_column():
    first, second = sample_suite().cases[:2]
    suite = SuiteResult((first, dataclasses.replace(second, standard="single")), seconds=1.0)
    lines = table_of(suite, 120)
    assert lines[0] == "bsa compare" and "| standard " in lines[2]
