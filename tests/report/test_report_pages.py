"""The HTML report (header, pictures, filters, folding, 500 cases), JUnit's provenance, msprobe's CSV.

Pages are parsed back (html.parser, ElementTree, csv) rather than compared as text: the tests say what a
reader must find, not how the markup spells it.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from bsa_cli import compare, report
from bsa_cli.compare import ERROR, FAIL, PASS, HotBlock, Selection, SuiteResult, UlpChart
from bsa_cli.report import svg
from tests.helpers import Page, build_case, case, make_case, sample_suite, tensor

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def pictured_tensor() -> compare.TensorResult:
    """A failing dq with everything the pictures draw: block map, hottest block's tiles, ULP chart."""
    base = tensor("dq", True)
    tiles = np.array([[1.0, 1.0], [5.0, 0.5]])
    hot = HotBlock(0, 1, 2, (64, 96), 5.0, 5e-4, 1e-4, 5e-3, (80, 0), 5.0, tiles)
    chart = UlpChart(compare.ULP_CHART_EDGES, (700, 200, 100, 24, *([0] * 9)), (710, 200, 100, 14, *([0] * 9)))
    score = np.array([[[1.0, 1.0, 1.5, 1.0], [1.0, 0.5, 5.0, 1.0]]])  # [B, N1, q blocks]
    block_map = compare.BlockMap("q", 32, score * 1e-4, np.full_like(score, 1e-4), score * 1e-3, score)
    return compare.TensorResult(**{**base.__dict__, "hot_blocks": (hot,), "ulp_chart": chart, "block_map": block_map})


def pictured_suite(device: str = "reference (bsa emulate) with fault 'tile-noise'", **fields) -> SuiteResult:
    # mask [B=1, N1=2, nQ=4, nKV=3]: head 1 selects (2, 0) and (2, 2); the last kv block of row 3 is past the length
    selection = Selection((1, 2, 4, 3), ("110", "011", "101", "11-", "100", "010", "101", "00-"))
    failing = case(
        "edge-tile",
        FAIL,
        tensors=(pictured_tensor(), tensor("dk", False), tensor("dv", False)),
        selection=selection,
        device=device,
        **fields,
    )
    passing = case(
        "edge-ok",
        PASS,
        tensors=(tensor("dq", False), tensor("dk", False), tensor("dv", False)),
        device=device,
        **fields,
    )
    return SuiteResult((failing, passing), seconds=1.0)


def header_of(page: Page) -> dict[str, str]:
    terms = [Page.text(e) for e in page.find("dt")]
    values = [Page.text(e) for e in page.find("dd")]
    return dict(zip(terms, values, strict=True))


def test_header_names_date_version_host_folder_device_standard_and_counts():
    suite = pictured_suite(device_kind="reference", fault="tile-noise")
    head = report.report_header(suite, ["out/edge"], now=NOW, host="build-7")
    page = Page(report.html_report(suite, head))
    header = header_of(page)
    assert header["date"] == "2026-11-30T12:00:00+00:00" and header["host"] == "build-7"
    assert header["bsa"] == report.report_header(suite).version and header["output folder"] == "out/edge"
    assert header["standard"] == "double-benchmark (2)"
    assert header["cases"] == "2 cases: 1 passed, 1 failed, 0 errors; exit code 1"
    warned = [Page.text(e) for e in page.find("span", **{"class": "warn"})]
    assert warned == [
        "the reference device (bsa emulate): reference results, not device results; planted fault 'tile-noise'"
    ]
    assert ".warn{color:var(--fail)" in report.html_report(suite, head)  # named in red


def test_header_names_a_binary_with_its_sha256_and_no_warning():
    suite = pictured_suite(device="/opt/bin/harness", device_kind="binary", binary_sha256="ab" * 32)
    page = Page(report.html_report(suite, report.report_header(suite, now=NOW)))
    assert header_of(page)["device"] == f"/opt/bin/harness (sha256 {'ab' * 32}) (2 of 2 cases)"
    assert page.find("span", **{"class": "warn"}) == []
    assert header_of(page)["output folder"] == "out"  # the case directories' common folder


def test_a_failing_tensor_has_a_heat_map_with_axes_legend_tooltips_and_the_worst_tile():
    page_text = report.html_report(pictured_suite(), report.report_header(pictured_suite(), now=NOW))
    page = Page(page_text)
    labels = [e[1].get("aria-label", "") for e in page.find("svg")]
    assert any(label.startswith("dq: error ratio per (query head, query block i, kv block j)") for label in labels)
    assert "colour scale" in labels and any(label.startswith("dq: elements by ULP error") for label in labels)
    tips = [Page.text(e) for e in page.find("title")]
    # head 1 selects q block 2 x kv blocks 0 and 2; dq's block 2 has ratio 5 (the map's scores)
    assert any(t.startswith("b=0 n=1 q block 2 x kv block 0: selected; dq tile ratio 5") for t in tips)
    assert not any(t.startswith("b=0 n=1 q block 2 x kv block 1:") for t in tips)  # not computed: no cell
    assert any(t.startswith("b=0 n=0 q block 3 x kv block 2: no block (past the actual length)") for t in tips)
    hottest = "hottest block: b=0 n=1 q block 2 (rows 64-95); worst 16x16 tile at s=80, d=0"
    assert any(t.startswith(hottest) for t in tips)
    assert any(t.startswith("rows s=80-95, d=0-15: tile RMSE ratio 5") for t in tips)
    assert any(t.startswith("device: 24 elements with ULP error 2-4") for t in tips)
    assert any(t.startswith("benchmark: 14 elements with ULP error 2-4") for t in tips)
    legend = " ".join(Page.text(e) for e in page.find("text"))
    for words in (
        "not computed (block not selected)",
        "at the benchmark's error (ratio <= 1)",
        "limit 3",
        "no block (past the actual length)",
        "the hottest block, where the worst 16x16 tile is",
    ):
        assert words in legend
    # axes: the panel's block indices along both sides, and what rows and columns are
    assert "rows: query block i; columns: kv block j" in legend and "b=0 n=1" in legend


def test_special_cells_stay_visible_on_white():
    scale = svg.Scale.for_scores([0.5, 2.0, 5.0], 3.0)
    assert scale.colour(0.5) == svg.AT_BENCHMARK != "#fff" and scale.colour(math.nan) == svg.NONFINITE
    assert scale.colour(1.5) != scale.colour(2.9) != scale.colour(5.0)
    assert svg.NOT_COMPUTED == "url(#bsa-hatch)" and 'id="bsa-hatch"' in svg.legend(scale, "ratio")


def test_hot_blocks_table_has_the_worst_tile_and_max_abs_error():
    page = Page(report.html_report(pictured_suite()))
    headers = [Page.text(e) for e in page.find("th")]
    assert "max abs err" in headers and "worst 16x16 tile" in headers
    cells = [Page.text(e) for e in page.find("td")]
    assert "s=80 d=0 x5" in cells and "0.005" in cells


def test_passing_cases_fold_away_and_failing_ones_open():
    page = Page(report.html_report(pictured_suite()))
    sections = {e[1]["id"]: e for e in page.find("section")}
    details = [e for e in page.elements if e[0] == "details" and "more" not in e[1].get("class", "")]
    assert set(sections) == {"case-edge-tile", "case-edge-ok"}
    assert ["open" in e[1] for e in details] == [True, False]  # edge-tile open, edge-ok folded


def test_filters_by_verdict_need_no_script():
    text = report.html_report(sample_suite())
    page = Page(text)
    radios = [e[1]["id"] for e in page.find("input") if e[1].get("type") == "radio"]
    assert radios == ["show-all", "show-problems", "show-FAIL", "show-ERROR", "show-PASS"]
    assert [Page.text(e) for e in page.find("label")][:2] == ["all (4)", "failed or not judged (2)"]
    assert "#show-FAIL:checked~table.cases tr.v-PASS" in text and "#show-FAIL:checked~section.v-PASS" in text
    rows = [e[1].get("class") for e in page.find("tr") if e[1].get("class", "").startswith("v-")]
    assert rows == ["v-PASS", "v-FAIL", "v-ERROR", "v-PASS"]
    assert "<script" not in text


def test_500_cases_make_one_summary_table_and_a_page_of_reasonable_size():
    cases = [
        case(
            f"c{i:03d}",
            PASS if i % 10 else FAIL,
            tensors=(tensor("dq", i % 10 == 0), tensor("dk", False), tensor("dv", False)),
        )
        for i in range(500)
    ]
    text = report.html_report(SuiteResult(tuple(cases)))
    page = Page(text)
    assert len(page.find("table", **{"class": "cases"})) == 1
    assert len([e for e in page.find("tr") if e[1].get("class", "").startswith("v-")]) == 500
    assert len(text) < 8_000_000


def test_an_error_case_lists_its_errors():
    page = Page(report.html_report(sample_suite()))
    errors = [Page.text(e) for e in page.find("li")]
    assert any("dk.bin: missing (expected 25600 bytes" in e for e in errors)


def test_a_fault_note_reaches_every_report():
    noted = case(
        "mha",
        PASS,
        tensors=(tensor("dq", False),),
        notes=("fault 'no-gqa-sum' does not apply to this case",),
        device="reference (bsa emulate) with fault 'no-gqa-sum'",
        fault="no-gqa-sum",
        device_kind="reference",
    )
    suite = SuiteResult((noted,))
    notes = [Page.text(e) for e in Page(report.html_report(suite)).find("p", **{"class": "note"})]
    assert notes == ["fault 'no-gqa-sum' does not apply to this case"]
    root = ET.fromstring(report.junit_xml(suite))
    assert "does not apply" in (root.find("testsuite/testcase/system-out").text or "")
    (row,) = report.csv_rows(suite)[1:]
    assert "does not apply" in row[report.MSPROBE_COLUMNS.index("Err_message")]


# ---- JUnit --------------------------------------------------------------------------------------


def test_junit_says_reference_results_and_planted_faults_in_properties_and_system_out():
    suite = pictured_suite(device_kind="reference", fault="tile-noise")
    root = ET.fromstring(report.junit_xml(suite))
    testsuite = root.find("testsuite")
    assert testsuite is not None
    props = {p.get("name"): p.get("value") for p in testsuite.findall("properties/property")}
    assert props == {"reference_results": "2", "planted_faults": "tile-noise"}
    assert (testsuite.find("system-out").text or "").startswith("REFERENCE RESULTS: the outputs of 2 of 2 cases")
    for testcase in testsuite.findall("testcase"):
        case_props = {p.get("name"): p.get("value") for p in testcase.findall("properties/property")}
        assert case_props["reference_results"] == "true" and case_props["planted_fault"] == "tile-noise"
        out = testcase.find("system-out").text or ""
        assert out.splitlines()[0] == (
            "REFERENCE RESULTS: outputs from the reference device (bsa emulate), not from "
            "hardware; PLANTED FAULT 'tile-noise'"
        )


def test_junit_of_a_device_run_has_no_reference_warning():
    suite = pictured_suite(device="/opt/bin/harness", device_kind="binary", binary_sha256="cd" * 32)
    root = ET.fromstring(report.junit_xml(suite))
    testcase = root.find("testsuite/testcase")
    props = {p.get("name"): p.get("value") for p in testcase.findall("properties/property")}
    assert props["reference_results"] == "false" and props["binary_sha256"] == "cd" * 32
    assert "planted_fault" not in props
    assert "REFERENCE" not in report.junit_xml(suite)


@pytest.mark.parametrize("verdict", [PASS, FAIL, ERROR])
def test_junit_test_names_are_the_same_whatever_happened(verdict):
    """CI keeps one history per test: the name and classname never carry a verdict, device, fault or time."""
    fields = {"errors": ("boom",), "tensors": ()} if verdict == ERROR else {}
    for device, fault in ((None, None), ("reference (bsa emulate) with fault 'nan-row'", "nan-row"), ("/bin/h", None)):
        result = case("edge-gqa.2.fp16", verdict, device=device, fault=fault, seconds=3.25, **fields)
        testcase = ET.fromstring(report.junit_xml(SuiteResult((result,)))).find("testsuite/testcase")
        assert (testcase.get("classname"), testcase.get("name")) == ("bsa.edge", "edge-gqa.2.fp16")


# ---- msprobe CSV --------------------------------------------------------------------------------


def test_csv_has_msprobe_columns_then_bsa_verdict_and_deciding_check():
    rows = list(csv.reader(io.StringIO(report.msprobe_csv.csv_text(sample_suite()))))
    header = rows[0]
    assert header[:6] == [
        "NPU Name",
        "Bench Name",
        "NPU Dtype",
        "Bench Dtype",
        "NPU Tensor Shape",
        "Bench Tensor Shape",
    ]
    assert header[6:11] == [
        "Cosine",
        "MaxAbsErr",
        "MaxRelativeErr",
        "One Thousandth Err Ratio",
        "Five Thousandths Err Ratio",
    ]
    assert header[19:21] == ["Accuracy Reached or Not", "Err_message"]
    assert header[21:26] == ["bsa Case", "bsa Verdict", "bsa Tensor Verdict", "bsa Standard", "bsa Deciding Check"]
    assert header[26:] == ["bsa Matched Ratio", "bsa Max Abs Error", "bsa Other Verdicts"]
    by_name = {row[0]: dict(zip(header, row, strict=True)) for row in rows[1:]}
    dq = by_name["aclnnBlockSparseAttentionGrad/edge-tile/dq"]
    assert dq["Bench Name"] == "golden/edge-tile/dq" and dq["NPU Dtype"] == "float16"
    assert dq["NPU Tensor Shape"] == "[1, 2, 100, 64]" and dq["Cosine"] == "0.99999" and dq["MaxAbsErr"] == "0.0008"
    assert dq["Accuracy Reached or Not"] == "No" and dq["Err_message"] == "dq worst 16x16 tile RMSE ratio 5 > 3"
    assert dq["bsa Verdict"] == "FAIL" and dq["bsa Deciding Check"] == "dq worst 16x16 tile RMSE ratio 5 > 3"
    dk = by_name["aclnnBlockSparseAttentionGrad/edge-tile/dk"]
    assert dk["Accuracy Reached or Not"] == "Yes" and dk["bsa Tensor Verdict"] == "PASS" and dk["bsa Verdict"] == "FAIL"
    missing = by_name["aclnnBlockSparseAttentionGrad/edge-missing/status"]
    assert missing["Cosine"] == "N/A" and missing["bsa Verdict"] == "ERROR"
    assert "dk.bin: missing" in missing["Err_message"]
    assert len(rows) == 1 + 3 + 3 + 1 + 1  # two cases of three tensors, an error and a negative case


def test_csv_of_real_results_fills_every_msprobe_figure(tmp_path):
    result = compare.compare_suite([build_case(tmp_path, make_case("real"), fault="tile-noise")], workers=1)
    rows = list(csv.DictReader(io.StringIO(report.msprobe_csv.csv_text(result))))
    assert [r["NPU Name"].rsplit("/", 1)[1] for r in rows] == ["dq", "dk", "dv"]
    for row in rows:
        for column in report.MSPROBE_COLUMNS[6:19]:
            assert row[column] not in ("", "N/A"), column
        assert 0 < float(row["One Thousandth Err Ratio"]) <= float(row["Five Thousandths Err Ratio"]) <= 1
        assert float(row["NPU l2norm"]) == pytest.approx(float(row["Bench l2norm"]), rel=1e-2)
    assert rows[0]["Accuracy Reached or Not"] == "No" and rows[1]["Accuracy Reached or Not"] == "Yes"
