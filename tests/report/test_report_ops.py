"""Reports of a suite with ops (issue 21): a case's forward, backward, chain and autograd results side by side,
and SKIP in every report; a backward-only suite renders as it always did.

Rendered from `tests.helpers.ops_suite` (hand-built results, in folder-name order as compare gives them).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from bsa_cli import report
from bsa_cli.cli.progress import OUTCOME_STYLE, run_detail
from bsa_cli.compare import PASS, SKIP, SuiteResult, drift
from bsa_cli.devices import RunResult
from bsa_cli.report import formatting
from tests.helpers import Page, ops_suite, sample_suite, skipped_result

GROUPED = [
    "smoke-bnsd@forward",
    "smoke-bnsd",
    "smoke-bnsd@chain",
    "smoke-bnsd@autograd",
    "smoke-y64@forward",
    "smoke-y64",
    "smoke-y64@chain",
    "neg-fwd-d96@forward",
]
"""`ops_suite`'s results with each case's ops side by side in OPS order (forward, backward, chain, autograd)."""


def render(suite: SuiteResult, width: int = 100, verbose: bool = False) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    report.render_terminal(suite, console, verbose=verbose)
    return console.file.getvalue()


# ---- words and order shared by every report -----------------------------------------------------------


def test_results_are_grouped_by_case_in_ops_order_and_a_backward_only_suite_keeps_its_order():
    assert [c.name for c in formatting.grouped(ops_suite().cases)] == GROUPED
    backward = sample_suite().cases
    assert formatting.grouped(backward) == list(backward)


def test_the_summary_line_counts_results_of_cases_and_the_skipped():
    assert report.summary_line(ops_suite()) == "8 results of 3 cases: 4 passed, 1 failed, 0 errors, 3 skipped"
    assert report.summary_line(sample_suite()) == "4 cases: 2 passed, 1 failed, 1 error"  # as before
    skipped = SuiteResult((*sample_suite().cases[:2], skipped_result("c", "backward", "why")))
    assert report.summary_line(skipped) == "3 cases: 1 passed, 1 failed, 0 errors, 1 skipped"


def test_a_skip_neither_fails_nor_errs():
    suite = ops_suite()
    assert suite.return_code == 1  # the chain's FAIL
    passing = SuiteResult(tuple(c for c in suite.cases if c.verdict in (PASS, SKIP)))
    assert passing.return_code == 0 and passing.count(SKIP) == 3


def test_each_tensor_names_the_operator_that_produced_it():
    assert formatting.operator_of("chain", "out") == "aclnnBlockSparseAttention"
    assert formatting.operator_of("chain", "dq") == "aclnnBlockSparseAttentionGrad"
    assert formatting.operator_of("forward") == "aclnnBlockSparseAttention"
    assert formatting.operator_of("backward") == "aclnnBlockSparseAttentionGrad"
    assert formatting.operator_of("autograd") == "aclnnBlockSparseAttention+aclnnBlockSparseAttentionGrad"


# ---- terminal ---------------------------------------------------------------------------------------------


def test_terminal_report_with_ops_snapshot(snapshot):
    snapshot("terminal_ops.txt", render(ops_suite()))


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_verdict_table_puts_a_case_s_ops_under_its_name_at_every_width(width):
    lines = [line.rstrip() for line in render(ops_suite(), width).splitlines()]
    assert all(len(line) <= width for line in lines)
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("Note:"))]
    rows = [line.split("|") for line in table if line.startswith("| ")]
    ops = [(row[1].strip(), row[2].strip(), row[3].strip()) for row in rows if row[3].strip()]
    assert ops[1:] == [  # the heading first; a case's name on its first row only
        ("smoke-bnsd", "forward", "PASS"),
        ("", "backward", "PASS"),
        ("", "chain", "FAIL"),
        ("", "autograd", "SKIP"),
        ("smoke-y64", "forward", "SKIP"),
        ("", "backward", "PASS"),
        ("", "chain", "SKIP"),
        ("neg-fwd-d96", "forward", "PASS"),
    ]
    text = "\n".join(lines)
    assert text.count("the A2/A3 forward refuses block_shape") == 1  # the chain says "same reason as forward"
    assert "not judged: same reason as forward" in " ".join(text.split())
    assert lines[-1] == "8 results of 3 cases: 4 passed, 1 failed, 0 errors, 3 skipped"


def test_the_details_name_each_failing_op_by_its_folder_and_skip_none():
    text = render(ops_suite())
    assert "smoke-bnsd@chain: checks" not in text  # the detail is behind -v
    assert "Note: the outputs of 5 results come from the reference device" in text  # a SKIP has no outputs
    verbose = render(ops_suite(), verbose=True)
    assert "smoke-bnsd@chain: checks" in verbose and "smoke-bnsd@chain dq: hot blocks (query block i)" in verbose
    assert "@autograd:" not in verbose and "smoke-y64@forward:" not in verbose  # a SKIP's line says why; no tables
    assert "smoke-bnsd@forward: checks" in verbose and "smoke-y64@chain: checks" not in verbose


def test_a_backward_only_suite_gets_no_op_column():
    text = render(sample_suite())
    assert "| op " not in text and "results of" not in text
    skipped = SuiteResult((sample_suite().cases[0], skipped_result("edge-y64", "backward", "the device cannot run it")))
    text = render(skipped)
    assert "| op " not in text and "| edge-y64  | SKIP    | the device cannot run it" in text


def test_skip_has_its_own_style_on_a_terminal():
    from bsa_cli.report.terminal import VERDICT_STYLE

    assert VERDICT_STYLE[SKIP] not in (VERDICT_STYLE["PASS"], VERDICT_STYLE["FAIL"], VERDICT_STYLE["ERROR"])
    console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="standard")
    report.render_terminal(ops_suite(), console)
    assert "\x1b[1;36mSKIP" in console.file.getvalue()  # bold cyan


# ---- JSON, merging, baselines and trends ------------------------------------------------------------------


def test_json_cases_carry_op_and_case_and_the_summary_counts_the_skipped():
    document = report.to_document(ops_suite())
    assert document["summary"]["skipped"] == 3 and document["summary"]["cases"] == 8
    assert [d["cases"] for d in document["devices"]] == [5]  # the SKIP results produced no outputs
    cases = {c["name"]: c for c in document["cases"]}
    assert (cases["smoke-bnsd@chain"]["op"], cases["smoke-bnsd@chain"]["case"]) == ("chain", "smoke-bnsd")
    assert (cases["smoke-bnsd"]["op"], cases["smoke-bnsd"]["case"]) == ("backward", "smoke-bnsd")
    skip = cases["smoke-y64@forward"]
    assert skip["verdict"] == "SKIP" and skip["errors"] == [skip["message"]] and "Y % 128 != 0" in skip["message"]


def test_a_report_with_ops_reads_back_merges_and_renders_the_same():
    suite = ops_suite()
    header = report.report_header(suite)
    document = json.loads(json.dumps(report.to_document(suite, header), allow_nan=False))
    back = report.from_document(document)
    assert report.to_document(back, header) == report.to_document(suite, header)
    assert render(back) == render(suite) and back.return_code == 1
    first = {**document, "cases": document["cases"][:4]}  # one case's ops split across shards
    second = {**document, "cases": document["cases"][4:]}
    merged = report.merge([("a.json", first), ("b.json", second)])
    assert render(merged) == render(suite)


def test_an_older_report_without_ops_reads_as_the_backward_and_a_bad_op_is_refused():
    document = report.to_document(sample_suite())
    for case in document["cases"]:
        del case["op"], case["case"]
    assert {c.op for c in report.from_document(document).cases} == {"backward"}
    document["cases"][0]["op"] = "sideways"
    with pytest.raises(
        ValueError,
        match=r"cases\[0\]\.op: expected an op, one of forward, " r"backward, chain, autograd, got 'sideways'",
    ):
        report.from_document(document, "r.json")


def test_baselines_and_trends_follow_each_op_of_a_case_apart():
    suite = ops_suite()
    night = report.night_from_document(report.to_document(suite), "old.json")
    worse = tuple(dataclasses.replace(c, verdict="FAIL") if c.name == "smoke-bnsd@forward" else c for c in suite.cases)
    changes = drift.compare_with_baseline(SuiteResult(worse), night)
    assert [(v.case, v.old, v.new) for v in changes.verdicts] == [("smoke-bnsd@forward", "PASS", "FAIL")]
    assert not changes.vanished and not changes.appeared
    trend = drift.trend([night, report.night_from_document(report.to_document(SuiteResult(worse)), "new.json")])
    assert {s.case for s in trend.series} >= {"smoke-bnsd", "smoke-bnsd@forward", "smoke-bnsd@chain"}
    from bsa_cli.report.trend import render_trend, trend_html

    console = Console(file=io.StringIO(), width=100, color_system=None)
    render_trend(trend, console)
    followed = f"{len(trend.series)} results of 3 cases over 2 nights"
    assert followed in console.file.getvalue() and f"bsa trend: {followed}" in trend_html(trend)


# ---- JUnit ------------------------------------------------------------------------------------------------


def test_junit_names_ops_in_brackets_and_skips_with_why():
    root = ET.fromstring(report.junit_xml(ops_suite()))
    testsuite = root.find("testsuite")
    assert testsuite is not None
    assert (testsuite.get("tests"), testsuite.get("failures"), testsuite.get("skipped")) == ("8", "1", "3")
    cases = {c.get("name"): c for c in testsuite.iter("testcase")}
    assert list(cases) == [
        "smoke-bnsd[forward]",
        "smoke-bnsd",
        "smoke-bnsd[chain]",
        "smoke-bnsd[autograd]",
        "smoke-y64[forward]",
        "smoke-y64",
        "smoke-y64[chain]",
        "neg-fwd-d96[forward]",
    ]
    skipped = cases["smoke-bnsd[autograd]"].find("skipped")
    assert skipped is not None and skipped.get("message", "").startswith("autograd: the reference device cannot run")
    assert cases["smoke-bnsd[chain]"].find("failure") is not None
    out = cases["smoke-y64[forward]"].find("system-out")
    assert out is not None and (out.text or "").splitlines()[-1].startswith("op forward not judged: the A2/A3 forward")
    properties = {p.get("name"): p.get("value") for p in cases["smoke-bnsd[chain]"].iter("property")}
    assert properties["op"] == "chain" and "op" not in {p.get("name") for p in cases["smoke-bnsd"].iter("property")}
    backward_only = ET.fromstring(report.junit_xml(sample_suite())).find("testsuite")
    assert backward_only is not None and backward_only.get("skipped") == "0"


# ---- HTML -------------------------------------------------------------------------------------------------


def test_html_summary_is_a_row_per_case_with_a_cell_per_op_linking_to_its_section():
    html = report.html_report(ops_suite())
    page = Page(html)
    (table,) = page.find("table", **{"class": "cases ops"})
    headings = [Page.text(e) for e in page.find("th") if Page.text(e) in ("forward", "backward", "chain", "autograd")]
    assert headings == ["forward", "backward", "chain", "autograd"]
    rows = page.find("tr", **{"class": "case has-PASS has-FAIL has-SKIP"})
    assert len(rows) == 1  # smoke-bnsd: every verdict it has, for the filters
    links = [e[1]["href"] for e in page.find("a") if e[1].get("href", "").startswith("#case-smoke-bnsd")]
    assert {
        "#case-smoke-bnsd@forward",
        "#case-smoke-bnsd",
        "#case-smoke-bnsd@chain",
        "#case-smoke-bnsd@autograd",
    } <= set(links)
    for name in GROUPED:
        assert f'id="case-{name}"' in html
    sections = [e[1]["id"] for e in page.find("section")]
    assert sections == [f"case-{name}" for name in GROUPED]
    assert [e[1]["id"] for e in page.find("input")][-1] == "show-SKIP"
    labels = [Page.text(e) for e in page.find("label")]
    assert labels == ["all (8)", "FAIL or ERROR (1)", "FAIL (1)", "ERROR (0)", "PASS (4)", "SKIP (3)"]
    assert ".badge.SKIP{background:var(--skip);color:#fff}" in html
    assert "#show-FAIL:checked~table.ops tr.case:not(.has-FAIL)," in html  # the FAIL filter keeps the cases with a FAIL


def test_html_sections_link_a_case_s_other_ops_and_a_skip_says_why():
    page = Page(report.html_report(ops_suite()))
    siblings = [Page.text(e) for e in page.find("p", **{"class": "siblings"})]
    assert siblings[0] == "ops of smoke-bnsd: PASS forward PASS backward FAIL chain SKIP autograd"
    skips = [Page.text(e) for e in page.find("ul", **{"class": "skips"})]
    assert skips[0].startswith("autograd: the reference device cannot run it")


def test_a_backward_only_page_is_as_before():
    html = report.html_report(sample_suite())
    assert "table.ops" not in html and "show-SKIP" not in html and "opname" not in html


# ---- msprobe CSV ------------------------------------------------------------------------------------------


def test_csv_names_the_operator_and_folder_and_adds_the_op_column_only_with_ops():
    rows = list(csv.DictReader(io.StringIO(report.msprobe_csv.csv_text(ops_suite()))))
    names = [(r["NPU Name"], r["bsa Op"]) for r in rows]
    assert names[:3] == [
        ("aclnnBlockSparseAttention/smoke-bnsd@forward/out", "forward"),
        ("aclnnBlockSparseAttention/smoke-bnsd@forward/lse", "forward"),
        ("aclnnBlockSparseAttentionGrad/smoke-bnsd/dq", "backward"),
    ]
    chain = [r["NPU Name"] for r in rows if r["bsa Op"] == "chain"]
    assert chain[0] == "aclnnBlockSparseAttention/smoke-bnsd@chain/out"
    assert chain[2] == "aclnnBlockSparseAttentionGrad/smoke-bnsd@chain/dq"
    skip = next(r for r in rows if r["NPU Name"].endswith("smoke-bnsd@autograd/status"))
    assert skip["Accuracy Reached or Not"] == "N/A" and skip["bsa Verdict"] == "SKIP"
    assert skip["Err_message"].startswith("autograd: the reference device cannot run it")
    header = report.csv_rows(sample_suite())[0]
    assert header[-1] == "bsa Other Verdicts"  # a backward-only CSV has no op column


# ---- progress ---------------------------------------------------------------------------------------------


def test_progress_colours_skip_and_says_why_a_run_was_skipped():
    assert OUTCOME_STYLE["SKIP"] not in (OUTCOME_STYLE["PASS"], OUTCOME_STYLE["FAIL"])
    why = "autograd needs torch_npu 2.6 or later"
    folder = Path("out/c@autograd")
    result = RunResult("c@autograd", folder, folder / "outputs", "skipped", skipped=why)
    assert run_detail(result) == why


# ---- real results ----------------------------------------------------------------------------------------


def test_real_op_results_render_side_by_side_and_read_back(tmp_path):
    from bsa_cli import compare, store
    from tests.helpers import build_case, build_judged_op_folder, make_case

    case = make_case("real", head_dim=64, block_shape=(128, 128), q_seq_len=128, kv_seq_len=128)
    build_case(tmp_path, case)
    build_judged_op_folder(tmp_path, case, "forward")
    build_judged_op_folder(tmp_path, case, "chain", fault="tile-noise")
    build_judged_op_folder(tmp_path, case, "autograd", skip="autograd: the reference device cannot run it")
    suite = compare.compare_suite(store.select_cases([tmp_path]), workers=1)
    assert {c.name: c.verdict for c in suite.cases} == {
        "real": "PASS",
        "real@forward": "PASS",
        "real@chain": "FAIL",
        "real@autograd": "SKIP",
    }
    text = render(suite)
    assert "| real | forward  | PASS" in text and "|      | autograd | SKIP    | autograd: the reference device" in text
    assert text.rstrip().endswith("4 results of 1 case: 2 passed, 1 failed, 0 errors, 1 skipped")
    header = report.report_header(suite)
    document = json.loads(json.dumps(report.to_document(suite, header), allow_nan=False))
    assert [c["op"] for c in document["cases"]] == [c.op for c in suite.cases]
    back = report.from_document(document)
    assert report.to_document(back, header) == document and render(back) == text
    names = [c.get("name") for c in ET.fromstring(report.junit_xml(suite)).iter("testcase")]
    assert names == ["real[forward]", "real", "real[chain]", "real[autograd]"]
    page = report.html_report(suite)
    assert 'href="#case-real@chain"' in page and "out, lse, dk, dv pass." in page


def test_the_judging_line_counts_results_of_cases_where_there_are_op_folders():
    from bsa_cli.cli.progress import judged_text

    assert judged_text([Path("out/a"), Path("out/b")]) == "2 cases"
    folders = [Path(f"out/{n}") for n in ("a", "a@forward", "a@chain", "b")]
    assert judged_text(folders) == "4 results of 2 cases"


def test_a_pair_that_fails_as_it_must_reads_by_its_cause_in_the_tables():
    from tests.helpers import op_result

    must = (
        "fails as it must: lse-unwritten: the backward read softmaxLse that the forward never wrote "
        "(softmax_lse_flag 0: torch_npu's default leaves lse unwritten): dq, dk, dv fail; dq NaN/Inf where the "
        "golden is finite: 65536 elements (65536 NaN, 0 Inf), rows b=0 n=0 s=0 (q block 0); dk NaN/Inf ..."
    )
    note = "lse not judged: softmax_lse_flag 0 (the forward leaves softmaxLse unwritten)"
    chain = op_result("chain-lse-flag-0", "chain", PASS, expected_failure=must, notes=(note,))
    assert chain.headline == f"{note}; {must}"
    assert formatting.short_headline(chain) == (
        "lse not judged: softmax_lse_flag 0; fails as it must: lse-unwritten: the backward read softmaxLse that "
        "the forward never wrote: dq, dk, dv fail"
    )
    wide = render(SuiteResult((chain,)), 320)  # the cause with its asides, the failing checks left out
    assert "| PASS    | lse not judged: softmax_lse_flag 0 (the forward leaves softmaxLse unwritten); fails" in wide
    assert "65536" not in wide  # the failing checks stay in the JSON and HTML sections
    narrow = render(SuiteResult((chain,)), 120)  # without the asides where the line would not fit
    assert "| PASS    | lse not judged: softmax_lse_flag 0; fails as it must: lse-unwritten: the" in narrow
    page = Page(report.html_report(SuiteResult((chain,))))  # the cause, then the note in smaller print
    (cell,) = page.find("td", **{"class": "op v-PASS"})
    assert Page.text(cell) == (
        "PASSfails as it must: lse-unwritten: the backward read softmaxLse that the forward never wrote: dq, dk, dv "
        "faillse not judged: softmax_lse_flag 0"
    )


def test_a_column_of_one_skip_reason_says_it_once():
    why = "the reference device has no autograd: run it with --device torch_npu"
    results = [skipped_result(name, "autograd", why) for name in ("a", "b", "c")]
    results += [skipped_result("a", "chain", "other")]
    page = Page(report.html_report(SuiteResult(tuple(results))))
    cells = [Page.text(e) for e in page.find("span", **{"class": "what"})]
    assert cells == ["other", why, "same reason as above", "same reason as above"]


def test_an_op_every_case_skips_for_one_reason_says_it_once_in_the_terminal():
    from tests.helpers import op_result, op_tensor

    why = "the reference device has no autograd: run it with --device torch_npu"
    results = []
    for name in ("a", "b", "c"):
        results += [op_result(name, "backward", PASS, tensors=(op_tensor("dq", False),))]
        results += [skipped_result(name, "autograd", why)]
    text = render(SuiteResult(tuple(results)))
    assert text.count(why) == 1 and text.count("not judged: same reason as the case above") == 2


def test_a_cell_leaves_out_nested_asides():
    from bsa_cli.compare import Check
    from tests.helpers import op_result

    detail = "lse max abs error ratio 2.68e+04 > 10 (device 1.636, floor 6.1e-05: fp32 lse (innerPrecise 0): err_thd)"
    failing = op_result(
        "c", "forward", "FAIL", checks=(Check("lse_max_ratio", "lse", 2.68e4, 10, False, detail, 2.68e3),)
    )
    assert formatting.short_headline(failing) == "lse max abs error ratio 2.68e+04 > 10"
