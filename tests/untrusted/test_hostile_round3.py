"""Hostile round three (issue 35, items 1-7 and 14): reports read back whatever they hold, outputs that name
inputs, strings from case folders and reports shown escaped, the --ops warning on filtered folders, and
case.json files whose fields contradict each other. Each family is generated over its whole class (every
field of a report, every output option, every string), not a hand-picked example."""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

import bsa_cli.api as bsa
from bsa_cli import report
from bsa_cli.compare import drift
from bsa_cli.core.errors import BsaError
from bsa_cli.core.untrusted import load_json
from bsa_cli.report.trend import render_trend, write_trend_html
from tests.helpers import BASE, invoke

# ---- a judged report, generated once -------------------------------------------------------------------


@pytest.fixture(scope="module")
def judged(generated_spec: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A suite with a failing case 'f' (block maps, selection, diagnosis) and a passing 'p', run and judged:
    (the folder, its JSON report)."""
    source = generated_spec({"cases": [{**BASE, "name": "p"}, {**BASE, "name": "f"}]})
    out = tmp_path_factory.mktemp("judged") / "out"
    shutil.copytree(source, out)
    assert invoke("run", out, "--filter", "p").exit_code == 0
    assert invoke("run", out, "--filter", "f", "--fault", "dq-scaled-twice").exit_code == 0
    path = out.parent / "report.json"
    assert invoke("compare", out, "--json", path).exit_code == 1
    return out, json.loads(path.read_text())


def _fields(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every field of a JSON document, by its path; of a list only the first item (and of `cases` each case:
    a failing and a passing one hold different fields)."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _fields(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value if path == ("cases",) else value[:1]):
            yield from _fields(item, (*path, index))


def _put(document: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        document = document[step]
    document[path[-1]] = value


def _name(path: tuple[Any, ...]) -> str:
    """A field's path as the reader's messages write it: cases[0].tensors[1].device.rmse."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text.lstrip(".")


#: Values of every JSON type but the ones a field usually holds, and numbers no field holds.
WRONG = (None, True, -1, 1.5, "x", "nan", [1], {"a": 1}, 10**30)


def _every_output(document: dict, tmp: Path) -> str:
    """Read `document` as --merge, --baseline and `bsa trend` do and render it every way bsa renders a
    report (terminal, explanation, drift, JSON, HTML, JUnit, CSV, trend page): returns what the terminal got."""
    suite = report.from_document(document, "r.json")
    night = report.night_from_document(document, "r.json")
    console = Console(file=io.StringIO(), width=120)
    report.render_terminal(suite, console, verbose=True)
    for case in suite.cases:
        report.render_explanation(case, console)
    found = drift.compare_with_baseline(suite, night, drift.Margin(), ())
    report.render_drift(found, console)
    report.write_json(suite, tmp / "a.json", None, {"drift": drift.drift_document(found)})
    report.write_html(suite, tmp / "a.html", None, found)
    report.write_junit(suite, tmp / "a.xml")
    report.write_csv(suite, tmp / "a.csv")
    if night.date is not None:
        trend = drift.trend([night, night], drift.Margin())
        render_trend(trend, console)
        write_trend_html(trend, tmp / "t.html")
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return text


# ---- 1: any date JSON can hold --------------------------------------------------------------------------

DATES = [
    f"{year}-{month}-{day}T{time_}{offset}"
    for year in ("0001", "1970", "9999")
    for month, day in (("01", "01"), ("12", "31"))
    for time_ in ("00:00:00", "23:59:59.999999")
    for offset in ("", "Z", "+00:00", "+14:00", "-14:00", "+23:59", "-23:59")
] + ["", "0000-01-01T00:00:00", "2026-02-30T00:00:00", "2026-12-01T24:00:00", "9" * 40, "T", "\ud800"]


@pytest.mark.parametrize("date", [*DATES, None, 0, 1e308, True, [], {}, ["2026-12-01"]])
def test_any_date_is_read_or_refused_naming_the_file_and_field(judged: tuple[Path, dict], date: Any) -> None:
    document = copy.deepcopy(judged[1])
    document["date"] = date
    try:
        night = report.night_from_document(document, "r.json")
    except ValueError as exc:
        assert str(exc).startswith("r.json: malformed report (field 'date': "), exc
        return
    assert night.date is None or night.date.tzinfo is not None
    header = report.merged_header([("r.json", document)])
    assert header is None or header.date


def test_a_date_beyond_utc_s_years_is_one_error_line_on_the_command_line(
    judged: tuple[Path, dict], tmp_path: Path
) -> None:
    out, document = judged
    for date in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
        path = tmp_path / "old.json"
        path.write_text(json.dumps({**document, "date": date}))
        for args in (("compare", out, "--baseline", path), ("trend", path, path)):
            result = invoke(*args)
            assert result.exit_code == 2 and "Traceback" not in result.output + result.stderr, result.stderr
            assert f"{path}: malformed report (field 'date'" in result.stderr


# ---- 3: every field of the wrong type -------------------------------------------------------------------


def test_every_report_field_of_a_wrong_type_is_read_or_named(judged: tuple[Path, dict], tmp_path: Path) -> None:
    """Each field of a failing case's report (the fields of every other verdict are among its own), in turn,
    of each wrong type: the report is refused as malformed naming that field (or the object whose rule it
    breaks), or it is read and every renderer copes (the changes read are rendered one value at a time)."""
    document = {**judged[1], "cases": [c for c in judged[1]["cases"] if c["verdict"] == "FAIL"]}
    text = json.dumps(document)
    read: dict[int, list[tuple[Any, ...]]] = {}
    tried = 0
    for path in list(_fields(document))[1:]:
        for number, value in enumerate(WRONG):
            changed = json.loads(text)
            _put(changed, path, value)
            tried += 1
            try:
                report.from_document(changed, "r.json")
            except ValueError as exc:
                message = str(exc)
                if path == ("schema",):
                    assert message.startswith("r.json: schema "), message
                    continue
                assert message.startswith("r.json: malformed report ("), (path, value, message)
                named = message.removeprefix("r.json: malformed report (").split(":")[0]  # the field or its holder
                field = _name(path)
                assert field.startswith(named) or named.startswith(field), (path, value, message)
                continue
            read.setdefault(number, []).append(path)
    assert tried > 1500 and sum(map(len, read.values())) < tried / 2
    for number, paths in read.items():
        changed = json.loads(text)
        for path in paths:
            if path[0] != "date" and not any(path[: len(p)] == p for p in paths if p != path):  # dates: their test
                _put(changed, path, WRONG[number])
        _every_output(changed, tmp_path)


# ---- 5: reading costs a small multiple of parsing ------------------------------------------------------


def test_reading_a_report_costs_a_few_times_parsing_it(judged: tuple[Path, dict], monkeypatch: Any) -> None:
    document = copy.deepcopy(judged[1])
    failing = next(c for c in document["cases"] if c["verdict"] == "FAIL")
    document["cases"] = [{**failing, "name": f"c{i}"} for i in range(300)]
    text = json.dumps(document)
    report.from_document(json.loads(text), "warm")  # the readers are built once per type

    calls = []
    original = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda *a, **k: calls.append(a) or original(*a, **k))

    def best(step: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        return min(times)

    parse = best(lambda: json.loads(text))
    read = best(lambda: report.from_document(json.loads(text), "r.json"))
    assert calls == []  # no type introspection per record
    assert read < 12 * parse, (read, parse)


# ---- 2 and 6: strings shown escaped, whatever they hold ------------------------------------------------

HOSTILE_TEXT = "a\x1b[31mred\x1b]0;title\x07\r\x08\x9b\x7f\ud800\udfffz"


def _strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    for field in _fields(value):
        item = value
        for step in field:
            item = item[step]
        if isinstance(item, str):
            yield field


def _clean(text: str) -> None:
    """Nothing a terminal would act on, nothing no encoding can write."""
    assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in text), repr(text[:200])
    text.encode("utf-8")


def test_every_report_string_is_shown_and_written_escaped(judged: tuple[Path, dict], tmp_path: Path) -> None:
    """Every string field of a report holds ESC sequences, other control characters and lone surrogates:
    read back from JSON text, it is refused with them escaped, or read and shown with them escaped on the
    terminal and in every file (all the fields read are changed at once)."""
    document = judged[1]
    changed = copy.deepcopy(document)
    for index, path in enumerate(_strings(document)):
        alone = copy.deepcopy(document)
        _put(alone, path, HOSTILE_TEXT)
        try:
            report.night_from_document(load_json(json.dumps(alone)), "r.json")  # as every report is read
        except ValueError as exc:
            _clean(str(exc))
            continue
        _put(changed, path, f"{HOSTILE_TEXT}{index}")  # names stay distinct
    shown = _every_output(load_json(json.dumps(changed)), tmp_path)
    _clean(shown)
    assert "a\\x1b[31mred" in shown
    for name in ("a.json", "a.html", "a.xml", "a.csv", "t.html"):
        _clean((tmp_path / name).read_text(encoding="utf-8"))


def test_a_lone_surrogate_in_a_merged_report_reaches_every_output(judged: tuple[Path, dict], tmp_path: Path) -> None:
    out, document = judged
    changed = copy.deepcopy(document)
    changed["cases"][0]["name"] = "x\ud800y"
    changed["cases"][0]["errors"] = ["\udcff\x1b[2J"]
    path = tmp_path / "night.json"
    path.write_text(json.dumps(changed))  # JSON escapes: \ud800
    reports = [f"--{kind}" for kind in ("json", "junit", "html", "csv")]
    result = invoke("compare", "--merge", path, *(a for r in reports for a in (r, tmp_path / r[2:])), "-v")
    assert result.exit_code in (1, 3) and result.exception is None or isinstance(result.exception, SystemExit)
    _clean(result.output + result.stderr)
    assert "x\\ud800y" in result.output
    result = invoke("trend", path, path, "--html", tmp_path / "trend.html")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    _clean(result.output + result.stderr)


def test_a_case_folder_s_strings_reach_run_and_compare_escaped(
    generated_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """The skip reason of an op folder, and every other string of its case.json, hold ESC sequences."""
    source = generated_spec({"cases": [{**BASE, "name": "p"}]})
    for field in ("skip", "spec", "notes"):
        out = tmp_path / field
        shutil.copytree(source, out)
        manifest = json.loads((out / "p" / "case.json").read_text())
        manifest[field] = [HOSTILE_TEXT] if field == "notes" else HOSTILE_TEXT
        (out / "p" / "case.json").write_text(json.dumps(manifest))
        for args in (("run", out), ("compare", out, "--html", tmp_path / "r.html", "--junit", tmp_path / "r.xml")):
            result = invoke(*args)
            assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
            _clean(result.output + result.stderr)
        if (tmp_path / "r.html").exists():
            _clean((tmp_path / "r.html").read_text())


# ---- 4: an output naming an input ----------------------------------------------------------------------


def _links(target: Path, kind: str) -> Path:
    """`target` itself, or a symbolic or hard link to it beside it."""
    if kind == "same":
        return target
    link = target.with_name(f"{kind}-{target.name}")
    if kind == "symlink":
        link.symlink_to(target.name)
    else:
        os.link(target, link)
    return link


OPTIONS = ("--json", "--junit", "--html", "--csv")


@pytest.mark.parametrize("kind", ["same", "symlink", "hardlink"])
def test_every_output_option_naming_an_input_is_refused_before_anything(
    judged: tuple[Path, dict], tmp_path: Path, kind: str
) -> None:
    """Every report option of compare (--merge and --baseline inputs) and trend, every folder option (gen -o,
    export -o, emulate's OUTPUT_DIR, run --outputs-root): naming an input, itself or through a link, is one
    Error line, and the input keeps its bytes."""
    out, document = judged
    night = tmp_path / "night.json"
    night.write_text(json.dumps(document))
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    victim = tmp_path / "copy"
    shutil.copytree(out, victim)
    manifest = victim / "p" / "case.json"
    linked = _links(night, kind)
    case_file = _links(manifest, kind)  # a file of a case folder bsa reads
    trials: list[tuple[Any, ...]] = [("trend", night, night, "--html", linked)]
    for option in OPTIONS:
        trials.append(("compare", "--merge", night, option, linked))
        trials.append(("compare", victim, "--baseline", night, option, linked))
        trials.append(("compare", victim, option, case_file))
    trials.append(("gen", spec, "-o", victim / "p"))
    trials.append(("export", victim, "--format", "msopst", "-o", victim / "p"))
    trials.append(("export", victim, "--format", "atk", "-o", victim))
    trials.append(("emulate", victim / "p", victim / "p"))
    trials.append(("emulate", victim / "p", victim / "p" / "inputs"))
    trials.append(("run", victim / "p", "--outputs-root", victim / "p" / "inputs"))
    before = {p: p.read_bytes() for p in [night, *victim.rglob("*")] if p.is_file()}
    listing = sorted(victim.rglob("*"))
    for args in trials:
        result = invoke(*args)
        everything = result.output + result.stderr
        assert result.exit_code == 2 and "Traceback" not in everything, (args, everything)
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and ("is the input" in errors[0] or "inside the case folder" in errors[0]), (
            args,
            result.stderr,
        )
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(victim.rglob("*")) == listing


def test_outputs_beside_the_inputs_are_still_written(judged: tuple[Path, dict], tmp_path: Path) -> None:
    out, document = judged
    night = tmp_path / "night.json"
    night.write_text(json.dumps(document))
    assert invoke("trend", night, night, "--html", tmp_path / "trend.html").exit_code == 0
    assert invoke("compare", "--merge", night, "--json", tmp_path / "merged.json").exit_code == 1
    victim = tmp_path / "copy"
    shutil.copytree(out, victim)
    assert invoke("emulate", victim / "p", victim / "p" / "outputs").exit_code == 0
    assert invoke("compare", victim, "--json", victim / "report.json").exit_code == 1  # beside, not in, a case


# ---- 7: the --ops warning looks at the folders on disk -------------------------------------------------


def test_ops_warning_looks_beyond_the_filter(generated_spec: Callable[..., Path]) -> None:
    out = generated_spec({"cases": [{**BASE, "name": "p", "ops": ["forward", "backward"]}, {**BASE, "name": "q"}]})
    for command in ("run", "compare"):
        filtered = invoke(command, out, "--ops", "forward", "--filter", "p")
        assert "has no forward folder" not in filtered.stderr, filtered.stderr
        whole = invoke(command, out, "--ops", "forward", "--filter", "q")
        assert "case q has no forward folder" in whole.stderr  # really missing: still said


# ---- 14: a loaded case as strict as a spec -------------------------------------------------------------

#: Values that contradict the rest of a small valid case, for each param a case.json carries.
CONTRADICTIONS: dict[str, list[Any]] = {
    "batch": [0, 2, -1],
    "num_heads": [0, 3],
    "num_kv_heads": [0, 2, 3],
    "head_dim": [0, 1, 7, 1000],
    "q_seq_len": [0, 1, 16],
    "kv_seq_len": [0, 1, 64],
    "block_shape": [[0, 0], [16], [-16, 16], [16, 0], [1, 1, 1], [], None],
    "actual_seq_lengths": [[300], [33], [-1], [0], [1, 2]],
    "actual_seq_lengths_kv": [[300], [33], [-1], [1, 2]],
    "scale": [0, -1.0, 1e308, "nan"],
    "layout": ["TND", "BSH", "XYZ", ""],
    "kv_layout": ["TND", "XYZ", None],
    "dtype": ["float32", "int8", "bfloat16"],
    "mask_type": [1, 2, -1],
    "pre_tokens": [-1, 0],
    "next_tokens": [-1, 0],
    "seq_lengths_encoding": ["cumulative", "x"],
    "lse_shape": ["x", "squeezed"],
}


def test_every_contradicting_param_of_a_case_json_is_refused_or_judged(
    generated_spec: Callable[..., Path], tmp_path: Path
) -> None:
    """Each param, in turn, set to values that contradict the others: `bsa.load_case` raises a DataError,
    or the case is judged (`bsa.judge` with the outputs the device wrote, a ValueError only for outputs of
    the wrong shape); `bsa compare` of all of them at once names no bug."""
    source = generated_spec({"cases": [{**BASE, "name": "p"}]})
    reference = tmp_path / "ref"
    shutil.copytree(source, reference)
    assert invoke("run", reference).exit_code == 0
    suite = tmp_path / "suite"
    suite.mkdir()
    loaded = refused = 0
    for key, values in CONTRADICTIONS.items():
        for index, value in enumerate(values):
            case_dir = suite / f"{key}-{index}"
            shutil.copytree(reference / "p", case_dir)
            manifest = json.loads((case_dir / "case.json").read_text())
            manifest["name"] = case_dir.name
            manifest["params"][key] = float(value) if value == "nan" else value
            (case_dir / "case.json").write_text(json.dumps(manifest))
            try:
                case = bsa.load_case(case_dir)
            except BsaError:
                refused += 1
                continue
            loaded += 1
            shapes = {n: tuple(e["shape"]) for n, e in manifest["outputs"].items()}
            outputs = {
                n: np.fromfile(case_dir / "outputs" / f"{n}.bin", dtype=np.float16).reshape(s)
                for n, s in shapes.items()
            }
            try:
                result = bsa.judge(case, **outputs)
            except ValueError as exc:
                assert "shape" in str(exc) or "dtype" in str(exc), (key, value, exc)
                continue
            assert result.verdict in ("PASS", "FAIL", "ERROR")
            assert not any("a bug in bsa" in e for e in result.errors), (key, value, result.errors)
    assert refused > 30
    result = invoke("compare", suite)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "a bug in bsa" not in result.output + result.stderr, result.output


def test_the_issue_s_contradictions_name_the_param(generated_spec: Callable[..., Path], tmp_path: Path) -> None:
    source = generated_spec({"cases": [{**BASE, "name": "p"}]})
    for key, value, words in (
        ("actual_seq_lengths", [300], "params.actual_seq_lengths: [300]: a length exceeds the sequence dimension"),
        ("block_shape", [0, 0], "a case expecting status 0 has X, Y > 0"),
    ):
        case_dir = tmp_path / key / "p"
        shutil.copytree(source / "p", case_dir)
        manifest = json.loads((case_dir / "case.json").read_text())
        manifest["params"][key] = value
        (case_dir / "case.json").write_text(json.dumps(manifest))
        with pytest.raises(BsaError, match=words.replace("[", r"\[").replace("]", r"\]")):
            bsa.load_case(case_dir)
