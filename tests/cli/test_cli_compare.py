"""Tests of `bsa compare` through click's CliRunner: exit codes, stdout/stderr apart, report files, --merge."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bsa_cli.cli import main
from tests import helpers
from tests.helpers import build_case, make_case, make_inputs, write_outputs


def invoke(*args: object) -> Result:
    """Run `bsa compare ARGS` (an exception in bsa propagates)."""
    return helpers.invoke("compare", *args, catch_exceptions=False)


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    """Three valid cases with clean outputs and one negative case with the expected status."""
    root = tmp_path_factory.mktemp("cases")
    for name, fields in (
        ("a-bnsd", {}),
        ("b-gqa", dict(num_heads=4, num_kv_heads=1)),
        (
            "c-tnd",
            dict(
                layout="TND",
                batch=2,
                actual_seq_lengths=(50, 17),
                actual_seq_lengths_kv=(33, 60),
                q_seq_len=50,
                kv_seq_len=60,
            ),
        ),
    ):
        build_case(root, make_case(name, **fields))
    from bsa_cli.core.case import Expect

    negative = build_case(root, make_case("d-neg", expect=Expect(161002, "ACLNN_ERR_PARAM_INVALID")), outputs=False)
    (negative / "outputs" / "status.txt").write_text("161002\n")
    return root


@pytest.fixture
def out(suite_dir, tmp_path) -> Path:
    shutil.copytree(suite_dir, tmp_path / "out")
    return tmp_path / "out"


def test_all_pass_exits_0_with_the_table_on_stdout_and_timing_on_stderr(out):
    result = invoke(out)
    assert result.exit_code == 0, result.output
    assert "4 cases: 4 passed, 0 failed, 0 errors" in result.stdout
    assert result.stderr.startswith("judged 0.1 MB of device outputs in ")
    assert "judged" not in result.stdout


def test_a_failing_case_exits_1_and_shows_its_hot_blocks_with_verbose(out):
    case = make_case("b-gqa", num_heads=4, num_kv_heads=1)
    write_outputs(out / "b-gqa" / "outputs", case, make_inputs(case), fault="dk-no-scale")
    result = invoke(out, "--junit", out / "r.xml", "-v")
    assert result.exit_code == 1
    assert "b-gqa dk: hot blocks (kv block j)" in result.stdout
    assert "4 cases: 3 passed, 1 failed, 0 errors" in result.stdout
    failures = ET.parse(out / "r.xml").getroot().findall("testsuite/testcase/failure")
    assert [f.get("message", "").split(" ")[0] for f in failures] == ["dk"]


def test_an_unjudged_case_exits_3_even_with_a_failure(out):
    (out / "a-bnsd" / "outputs" / "dq.bin").unlink()
    (out / "c-tnd" / "outputs" / "status.txt").write_text("161001\n")
    result = invoke(out)
    assert result.exit_code == 3
    assert "4 cases: 2 passed, 1 failed, 1 error" in result.stdout
    assert "dq.bin: missing (expected 12288 bytes for shape [1, 2, 96, 32] float16)" in result.stdout


def test_standard_threshold_and_filter_options(out):
    result = invoke(out, "--standard", "single", "--filter", "a-*", "--json", out / "r.json")
    document = json.loads((out / "r.json").read_text())
    assert [c["name"] for c in document["cases"]] == ["a-bnsd"]
    assert document["cases"][0]["standard"] == "single"
    assert result.exit_code == document["exit_code"]
    result = invoke(out, "--threshold", "tile_ratio=0.5", "--filter", "a-*")
    assert result.exit_code == 1 and "worst 16x16 tile RMSE ratio" in result.stdout
    result = invoke(out, "--threshold", "tile_ratio=inf", "--threshold", "zero_atol=1e-3", "--filter", "a-*")
    assert result.exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--standard", "singel"], "Error: unknown standard 'singel' (did you mean 'single'?); allowed: "),
        (
            ["--threshold", "rmse_ratio"],
            "Error: --threshold 'rmse_ratio': expected KEY=NUMBER, for example --threshold rmse_ratio=1.5\n",
        ),
        (["--threshold", "rmse_ratio=x"], "Error: --threshold 'rmse_ratio=x': expected KEY=NUMBER"),
        (["--threshold", "rmse_rati=2"], "Error: unknown threshold 'rmse_rati' (did you mean 'rmse_ratio'?)"),
        (
            ["--standard", "single", "--threshold", "rmse_ratio=2"],
            "Error: threshold 'rmse_ratio' does not apply to standard 'single'",
        ),
        (["--filter", "zzz*"], "matches none of 4 cases\n"),
        (
            ["--merge", "--standard", "single"],
            "Error: --merge cannot be used with --standard: shard reports are already judged\n",
        ),
        (["--merge", "-j", "2"], "Error: --merge cannot be used with --jobs"),
        (["-j", "0"], "'0' is not a positive whole number or 'auto'"),
    ],
)
def test_usage_errors_exit_2_with_one_error_line(out, args, message):
    result = invoke(out, *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_folder_without_cases_is_a_usage_error(tmp_path):
    result = invoke(tmp_path)
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {tmp_path}: no case directories (*/case.json) here or up to 3 folders below; write them with "
        "`bsa gen SPECS -o OUT` and compare OUT\n"
    )
    result = invoke(tmp_path / "nope")
    assert result.stderr == f"Error: {tmp_path / 'nope'}: no such directory\n"


def test_run_threshold_against_a_case_standard_is_a_usage_error(tmp_path):
    build_case(tmp_path, make_case("s"), compare_settings={"standard": "single"})
    result = invoke(tmp_path, "--threshold", "rmse_ratio=3")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: case 's': --threshold rmse_ratio: does not apply to standard 'single'")


def test_outputs_root(out, tmp_path):
    root = tmp_path / "device"
    shutil.copytree(out / "a-bnsd" / "outputs", root / "a-bnsd")
    result = invoke(out, "--outputs-root", root, "--filter", "a-bnsd")
    assert result.exit_code == 0
    result = invoke(out, "--outputs-root", root, "--filter", "b-gqa", "--json", tmp_path / "r.json")
    assert result.exit_code == 3  # not run into that root yet: the error says so, and what to type
    (case,) = json.loads((tmp_path / "r.json").read_text())["cases"]
    assert case["errors"] == [
        f"not run yet: no result in {root}/b-gqa; run it first: bsa run {out} --outputs-root {root}"
    ]


def test_compare_before_run_says_each_case_is_not_run_and_what_to_type_once(out, tmp_path):
    for case in ("a-bnsd", "d-neg"):
        shutil.rmtree(out / case / "outputs")
        (out / case / "outputs").mkdir()  # as `bsa gen` leaves it
    result = invoke(out, "--json", tmp_path / "r.json")
    assert result.exit_code == 3
    errors = {c["name"]: c["errors"] for c in json.loads((tmp_path / "r.json").read_text())["cases"]}
    assert errors == {
        "a-bnsd": [f"not run yet: no result in {out}/a-bnsd/outputs; run it first: bsa run {out}"],
        "b-gqa": [],
        "c-tnd": [],
        "d-neg": [f"not run yet: no result in {out}/d-neg/outputs; run it first: bsa run {out}"],
    }
    text = " ".join(result.stdout.split())
    assert text.count("not run yet") == 2 and "could not be judged" not in text  # one line per case, in the table


def test_report_files_and_merge_of_shards(out, tmp_path):
    first = invoke(
        out, "--filter", "a-*", "--filter", "b-*", "--json", tmp_path / "1.json", "--html", tmp_path / "r.html"
    )
    second = invoke(out, "--filter", "c-*", "--filter", "d-*", "--json", tmp_path / "2.json")
    assert first.exit_code == second.exit_code == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    merged = invoke(
        "--merge",
        tmp_path / "1.json",
        tmp_path / "2.json",
        "--junit",
        tmp_path / "m.xml",
        "--json",
        tmp_path / "m.json",
    )
    assert merged.exit_code == 0
    assert "4 cases: 4 passed, 0 failed, 0 errors" in merged.stdout
    assert merged.stderr == f"wrote JSON report {tmp_path / 'm.json'}\nwrote JUnit report {tmp_path / 'm.xml'}\n"
    names = [c.get("name") for c in ET.parse(tmp_path / "m.xml").getroot().iter("testcase")]
    assert names == ["a-bnsd", "b-gqa", "c-tnd", "d-neg"]
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["cases"] == 4
    again = invoke("--merge", tmp_path / "1.json", tmp_path / "1.json")
    assert again.exit_code == 2 and "Error: case 'a-bnsd' is in both" in again.stderr
    (tmp_path / "bad.json").write_text("{")
    bad = invoke("--merge", tmp_path / "bad.json")
    assert bad.exit_code == 2 and bad.stderr.startswith(f"Error: {tmp_path / 'bad.json'}: not valid JSON")


def test_unwritable_report_is_a_usage_error_before_any_case_is_judged(out, tmp_path):
    (tmp_path / "file").write_text("")
    result = invoke(out, "--html", tmp_path / "ok.html", "--json", tmp_path / "file" / "dir" / "r.json")
    assert result.exit_code == 2 and result.stdout == ""  # nothing judged
    assert result.stderr.startswith(f"Error: --json {tmp_path}/file/dir/r.json: cannot create folder {tmp_path}/file")
    assert not (tmp_path / "ok.html").exists()
    folder = invoke(out, "--junit", tmp_path)
    assert folder.exit_code == 2 and "is a directory" in folder.stderr  # click's own check
    same = invoke(out, "--junit", tmp_path / "r.x", "--html", tmp_path / "r.x")
    assert same.exit_code == 2 and "is also the --junit report" in same.stderr


def test_report_folders_are_created(out, tmp_path):
    paths = {
        flag: tmp_path / "new" / flag.strip("-") / f"r.{flag.strip('-')}"
        for flag in ("--json", "--junit", "--html", "--csv")
    }
    result = invoke(out, *(x for flag, path in paths.items() for x in (flag, path)))
    assert result.exit_code == 0, result.output
    assert all(path.is_file() and path.stat().st_size for path in paths.values())


def test_verbose_shows_every_metric(out):
    result = invoke(out, "-v", "--filter", "a-*")
    assert result.exit_code == 0
    assert "a-bnsd: metrics (device / benchmark)" in result.stdout
    assert "cosine similarity" in result.stdout


def test_each_report_file_is_named_on_stderr_when_written(out, tmp_path):
    paths = {kind: tmp_path / "reports" / f"r.{kind}" for kind in ("json", "xml", "html", "csv")}
    result = invoke(
        out, "--json", paths["json"], "--junit", paths["xml"], "--html", paths["html"], "--csv", paths["csv"]
    )
    assert result.exit_code == 0
    assert [line for line in result.stderr.splitlines() if not line.startswith("judged ")] == [
        f"wrote JSON report {paths['json']}",
        f"wrote JUnit report {paths['xml']}",
        f"wrote HTML report {paths['html']}",
        f"wrote CSV report {paths['csv']}",
    ]
    assert all(path.is_file() for path in paths.values())


def test_every_report_says_which_release_the_cases_expect(tmp_path: Path) -> None:
    import yaml

    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "cases": [
                    {
                        "name": "c",
                        "num_heads": 1,
                        "q_seq_len": 32,
                        "head_dim": 16,
                        "block_shape": [16, 16],
                        "release": "9.1.0",
                    }
                ]
            }
        )
    )
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "check",
            str(spec),
            "-o",
            str(tmp_path / "out"),
            "--json",
            str(tmp_path / "r.json"),
            "--junit",
            str(tmp_path / "r.xml"),
            "--html",
            str(tmp_path / "r.html"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "expected statuses follow operator release 9.1.0 (1 case)" in result.stdout
    assert json.loads((tmp_path / "r.json").read_text())["cases"][0]["release"] == "9.1.0"
    assert '<property name="release" value="9.1.0"' in (tmp_path / "r.xml").read_text()
    assert (
        "<dt>release</dt><dd>expected statuses follow operator release 9.1.0 (1 case)</dd>"
        in (tmp_path / "r.html").read_text()
    )
