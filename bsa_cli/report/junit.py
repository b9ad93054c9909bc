"""The JUnit XML report: one testcase per case, named the same in every run, saying where results come from."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ..compare import ERROR, FAIL, SKIP, CaseResult, SuiteResult
from ..ops import get
from . import formatting
from .files import write_text_atomic
from .formatting import fmt, grouped, is_reference, likely_line, op_test_name, planted_fault, query_axis, where

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _XML_INVALID.sub("?", text)


def case_report_text(case: CaseResult) -> str:
    """Return the plain-text details of one case: failed checks, worst elements, hot blocks."""
    lines: list[str] = list(case.notes)
    if case.verdict in (ERROR, SKIP):
        lines.extend(case.errors)
        return "\n".join(lines)
    lines += [
        f"FAIL {check.detail}" for check in sorted(case.all_checks, key=lambda c: -c.severity) if not check.passed
    ]
    lines += [f"likely #{rank}: {c.kind} ({c.score:.2f}): {c.evidence}" for rank, c in enumerate(case.diagnosis, 1)]
    for tensor in case.tensors:
        if tensor.passed:
            continue
        for element in tensor.worst[:3]:
            lines.append(
                f"{tensor.name} worst at {where(tensor, element.coords, element.block)}: device "
                f"{fmt(element.device, 6)}, golden {fmt(element.golden, 6)}, abs err {fmt(element.abs_err)}"
            )
        for hot in tensor.hot_blocks[:3]:
            kind = "q block" if query_axis(tensor) else "kv block"
            tile = "" if hot.tile is None else f", worst tile s={hot.tile[0]} d={hot.tile[1]} x{fmt(hot.tile_ratio, 3)}"
            lines.append(
                f"{tensor.name} hot {kind}: b={hot.batch} n={hot.head} {kind}={hot.block} "
                f"rows {hot.rows[0]}-{hot.rows[1]} score {fmt(hot.score, 3)}, max abs err {fmt(hot.max_abs_err, 3)}"
                f"{tile}"
            )
    return "\n".join(lines)


def _provenance_text(case: CaseResult) -> str:
    """The first line of a testcase's system-out: who produced the outputs (a warning for reference results)."""
    if is_reference(case):
        fault = planted_fault(case)
        text = "REFERENCE RESULTS: outputs from the reference device (bsa emulate), not from hardware"
        return text + (f"; PLANTED FAULT '{fault}'" if fault else "")
    return f"device: {formatting.provenance(case)}"


def _metrics_text(case: CaseResult) -> str:
    if case.verdict == SKIP:  # nothing was measured
        return "\n".join([_provenance_text(case), *case.notes, f"op {case.op} not judged: {case.message}"])
    lines = [
        _provenance_text(case),
        *case.notes,
        *(f"precision path: {n}" for n in case.kernel_notes),
        *([] if get(case.op).is_default else [f"op {case.op}"]),
        f"standard {case.standard}; status {case.status}",
    ]
    for tensor in case.tensors:
        d, b = tensor.device, tensor.benchmark
        text = (
            f"{tensor.name}: max_abs_err {fmt(d.max_abs_err)} rmse {fmt(d.rmse)} "
            f"max_rel_err {fmt(d.max_rel_err)} mean_rel_err {fmt(d.mean_rel_err)} cosine {fmt(d.cosine, 8)} "
            f"ulp_max {fmt(d.ulp_max, 3)} matched_ratio {fmt(tensor.matched_ratio, 6)} "
            f"max_abs_error {fmt(tensor.max_abs_error)}"
        )
        if b:
            text += (
                f"; benchmark rmse {fmt(b.rmse)} max_rel_err {fmt(b.max_rel_err)} mean_rel_err {fmt(b.mean_rel_err)}"
            )
        lines.append(text)
    if side := formatting.side_line(case):
        lines.append(side)
    if not case.tensors:
        lines.append(case.message)
    return "\n".join(lines)


def _properties(parent: ET.Element, values: dict[str, str]) -> None:
    properties = ET.SubElement(parent, "properties")
    for name, value in values.items():
        ET.SubElement(properties, "property", name=name, value=_xml_text(value))


def _case_properties(case: CaseResult) -> dict[str, str]:
    values = {
        "device": case.device or "not recorded",
        "reference_results": str(is_reference(case)).lower(),
        "planted_fault": planted_fault(case),
        "binary_sha256": case.binary_sha256,
        "standard": case.standard,
        "release": case.release,
        "dtype": case.dtype,
        "op": None if get(case.op).is_default else case.op,
        "side_verdicts": ", ".join(f"{k} {v}" for k, v in case.side_verdicts.items()),
    }
    for time in case.kernel_time:  # a timed run: each step's median and achieved TFLOP/s
        values[f"kernel_{time.step}_median_us"] = f"{time.median_us:.3f}"
        values[f"kernel_{time.step}_spread_us"] = f"{time.spread_us:.3f}"
        values[f"kernel_{time.step}_tflops"] = None if time.tflops is None else f"{time.tflops:.4g}"
        values[f"kernel_{time.step}_peak_share"] = None if time.peak_share is None else f"{time.peak_share:.4g}"
    return {name: str(value) for name, value in values.items() if value or name == "standard"}


def testcase_id(case: CaseResult) -> tuple[str, str]:
    """Return a result's (classname, name): `bsa.<spec file stem>` and the case name, with the op in brackets
    for an op other than the backward (`NAME[forward]`; the backward keeps `NAME`), whatever the verdict,
    device, fault or shard, so CI keeps one history per case and op."""
    spec = Path(case.spec).stem if case.spec else "cases"
    return f"bsa.{spec}", op_test_name(case.case_name, case.op)


#: The element of a testcase that failed or could not be judged.
_PROBLEMS: dict[str, str] = {FAIL: "failure", ERROR: "error"}


def junit_xml(suite: SuiteResult) -> str:
    """Return a JUnit XML report: one testcase per result (a case's ops side by side), <failure> for FAIL,
    <error> for ERROR, <skipped> for SKIP (with why).

    Every testcase carries properties (device, reference_results, planted_fault, binary_sha256,
    standard, dtype) and a system-out whose first line says where the outputs come from; the testsuite
    says so too when any case holds reference results.
    """
    tests = len(suite.cases)
    counts = {"tests": str(tests), "failures": str(suite.count(FAIL)), "errors": str(suite.count(ERROR))}
    seconds = f"{sum(c.seconds for c in suite.cases):.3f}"
    root = ET.Element("testsuites", {"name": "bsa compare", **counts, "time": seconds})
    skipped = str(suite.count(SKIP))
    testsuite = ET.SubElement(root, "testsuite", {"name": "bsa compare", **counts, "skipped": skipped, "time": seconds})
    reference = sum(is_reference(c) for c in suite.cases)
    faults = sorted({f for c in suite.cases if (f := planted_fault(c))})
    _properties(testsuite, {"reference_results": str(reference), "planted_faults": ",".join(faults) or "none"})
    for case in grouped(suite.cases):
        classname, name = testcase_id(case)
        testcase = ET.SubElement(testsuite, "testcase", name=name, classname=classname, time=f"{case.seconds:.3f}")
        _properties(testcase, _case_properties(case))
        message = "; ".join([*case.notes, case.message])
        if likely := likely_line(case):  # after the failed checks, kept whole within the message's 1000 characters
            likely = likely[:500]
            message = f"{message[: 1000 - len(likely) - 2]}; {likely}"
        message = _xml_text(message[:1000])
        if case.verdict in _PROBLEMS:
            element = ET.SubElement(testcase, _PROBLEMS[case.verdict], message=message, type=case.verdict)
            element.text = _xml_text(case_report_text(case))
        elif case.verdict == SKIP:
            ET.SubElement(testcase, "skipped", message=message)
        ET.SubElement(testcase, "system-out").text = _xml_text(_metrics_text(case))
    if reference:
        ET.SubElement(testsuite, "system-out").text = _xml_text(
            f"REFERENCE RESULTS: the outputs of {reference} of {tests} cases come from the reference device "
            "(bsa emulate), not from hardware" + (f"; planted faults: {', '.join(faults)}" if faults else "")
        )
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(suite: SuiteResult, path: Path) -> None:
    """Write the JUnit XML report to `path` (atomically)."""
    write_text_atomic(Path(path), junit_xml(suite))
