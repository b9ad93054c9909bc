"""The first hour at the terminal: `bsa list` at 80/100/120 columns, a folder of suites, a failing binary's
log, a fault that does not apply, progress and ETA of a long case on the reference device."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from bsa_cli.cli import main
from bsa_cli.cli.gen import LIST_COLUMNS, OPS_COLUMN, list_rows, list_table
from bsa_cli.cli.progress import ProgressDisplay
from bsa_cli.devices import reference
from bsa_cli.specs import load_specs
from tests.helpers import REPO, SPEC, fake_device, invoke, run_record

SUITES = sorted((REPO / "cases").glob("*.yaml"))


def list_output(width: int, *specs: Path) -> str:
    result = CliRunner().invoke(main, ["list", *map(str, specs)], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("width", [80, 100, 120])
def test_list_fits_the_width_and_keeps_every_name_and_number_whole(width):
    cases = load_specs(SUITES)
    text = list_output(width, *SUITES)
    lines = text.splitlines()
    assert max(len(line) for line in lines[:-1]) <= width  # the note below the table may wrap, not the table
    names = [line.split()[0] for line in lines[3 : 3 + len(cases)]]
    assert names == [c.name for c in cases]  # one line per case, the name whole
    rows = {row["case"]: row for row in list_rows(cases)}
    header = f" {lines[1]} "
    shown = [c for c in (*LIST_COLUMNS, OPS_COLUMN) if re.search(rf"\s{re.escape(c)}\s", header)]
    assert shown[0] == "case" and {"gen s", "ref s"} <= set(shown)
    for line in lines[3 : 3 + len(cases)]:
        cells = line.split()
        assert cells == [rows[cells[0]][c] for c in shown]  # every number whole, in its column


def test_list_at_80_columns_says_what_it_left_out_and_keeps_the_estimates():
    text = list_output(80, REPO / "cases" / "nightly.yaml")
    assert "gen s" in text and "ref s" in text and "nightly-causal-16k" in text
    left = "left out at 80 columns: MiB in/out, block, expect, pattern, density, GFLOP, B, D, layout"
    assert left in " ".join(text.split())
    header = text.splitlines()[1].split()
    # what a case is, and what it costs: time and memory, gen's and the reference device's (issue 32 item 6)
    assert header == ["case", "dtype", "N1/N2", "Sq/Skv", "gen", "s", "ref", "s", "GiB", "ref", "GiB"]
    (total,) = [line for line in text.splitlines() if line.startswith("total: ")]
    rows = text.splitlines()[3:10]
    gen_s, ref_s = (sum(float(row.split()[column]) for row in rows) for column in (4, 5))
    gen_gib, ref_gib = (max((row.split()[column] for row in rows), key=float) for column in (6, 7))
    match = re.fullmatch(r"total: gen (\S+) s, ref (\S+) s; largest case: gen (\S+) GiB, ref (\S+) GiB", total)
    assert match and len(total) <= 80, total  # the sums and largest of the columns above, whole
    assert float(match[1]) == pytest.approx(gen_s, rel=0.05) and float(match[2]) == pytest.approx(ref_s, rel=0.05)
    assert (match[3], match[4]) == (gen_gib, ref_gib)
    wide = list_output(200, REPO / "cases" / "nightly.yaml")
    assert "left out" not in wide and all(column in wide for column in LIST_COLUMNS)


def test_list_table_never_cuts_a_name_even_narrower_than_the_name():
    rows = list_rows(load_specs([REPO / "cases" / "edge.yaml"]))
    table, hidden = list_table(rows, 20)
    console = Console(width=20, file=io.StringIO(), color_system=None)
    console.print(table, crop=False, soft_wrap=True)
    text = console.file.getvalue()
    assert "edge-zero-length-middle.fp16" in text and "…" not in text
    assert "ref s" not in hidden and "gen s" not in hidden


def test_list_estimates_the_reference_device_from_backward_flops_and_pairs():
    (case,) = load_specs([REPO / "cases" / "nightly.yaml"])[2:3]  # causal 16k
    (row,) = list_rows([case])
    from bsa_cli.gen.schedule import estimate

    e = estimate(case)
    expected = reference.estimate_seconds(e.flops * 10 / 14, e.selected_blocks, 1)
    assert float(row["ref s"]) == pytest.approx(expected, rel=0.05)
    # README's performance table: `bsa emulate` takes about as long as `bsa gen` (gen / emulate 1.00-1.13)
    (readme_case,) = list_rows(load_specs([REPO / "cases" / "nightly.yaml"])[:1])  # B=1 N=4 S=8192 density 0.2
    assert 0.5 <= float(readme_case["ref s"]) / float(readme_case["gen s"]) <= 2


# ---- bsa compare on a folder of suites ------------------------------------------------------------------


def test_compare_finds_the_suites_below_a_folder(tmp_path, spec_file):
    for suite in ("smoke", "edge"):
        result = invoke("check", spec_file, "-o", tmp_path / "all" / suite, "--filter", "t-bnsd-*")
        assert result.exit_code == 0, result.output
    result = invoke("compare", tmp_path / "all")
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'all'} holds no case itself; comparing the 2 suites below it" in result.stderr
    assert "2 cases: 2 passed" in result.stdout


def test_cases_that_suites_side_by_side_share_are_named_with_their_suite(tmp_path, spec_file):
    for suite in ("smoke", "edge"):
        assert invoke("check", spec_file, "-o", tmp_path / "all" / suite, "--filter", "t-bnsd-*").exit_code == 0
    report = tmp_path / "r.json"
    result = invoke("compare", tmp_path / "all", "--json", report)
    assert result.exit_code == 0, result.output
    names = [case["name"] for case in json.loads(report.read_text())["cases"]]
    assert len(names) == len(set(names)) == 2 and {n.split("/")[0] for n in names} == {"smoke", "edge"}
    merged = invoke("compare", "--merge", report, "--json", tmp_path / "m.json")
    assert merged.exit_code == 0, merged.output
    assert invoke("compare", tmp_path / "all", "--baseline", report, "--fail-on-regression").exit_code == 0


def test_compare_of_a_folder_without_any_case_says_where_cases_come_from(tmp_path):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    result = invoke("compare", tmp_path / "empty")
    assert result.exit_code == 2
    assert "no case directories (*/case.json) here or up to 3 folders below" in result.stderr
    assert "bsa gen SPECS -o OUT" in result.stderr


@pytest.fixture
def spec_file(tmp_path) -> Path:
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    return path


# ---- a failing binary, a fault that does not apply -----------------------------------------------------


def test_a_failing_binary_names_its_log(tmp_path):
    import yaml

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"defaults": SPEC["defaults"], "cases": [{**SPEC["cases"][0], "name": "crash"}]}))
    result = invoke("check", spec, "-o", tmp_path / "out", "--binary", fake_device(tmp_path))
    assert result.exit_code == 3, result.output
    log = tmp_path / "out" / "crash" / "outputs" / "stdout.log"
    assert f"log: {log}" in result.stderr  # the crash left its argv on stdout, and no stderr
    assert f"log {tmp_path / 'out' / 'crash' / 'outputs' / 'stderr.log'}" in result.stdout  # in the error


def test_a_fault_that_does_not_apply_is_said_before_the_run_and_in_the_table(tmp_path, spec_file):
    result = invoke("check", spec_file, "-o", tmp_path / "out", "--fault", "no-gqa-sum", "--filter", "t-bnsd-*")
    assert result.exit_code == 0, result.output  # MHA: nothing to lose in the GQA sum
    assert "Warning: t-bnsd-tail: fault 'no-gqa-sum' does not apply to this case (applies only with N1 > N2" in (
        result.stderr.replace("\n", " ")
    )
    assert "fault 'no-gqa-sum' does not apply" in result.stdout
    assert run_record(tmp_path / "out" / "t-bnsd-tail")["device"]["fault"] == "no-gqa-sum"


# ---- progress within a case on the reference device -------------------------------------------------


def test_the_reference_device_reports_progress_within_a_case(tmp_path, spec_file, monkeypatch):
    monkeypatch.setattr(reference, "PROGRESS_INTERVAL_S", 0.0)
    result = invoke("gen", spec_file, "-o", tmp_path / "out", "--filter", "t-tnd-gqa")
    assert result.exit_code == 0, result.output
    seen: list[tuple[str, float]] = []
    with reference.reporting(lambda name, fraction: seen.append((name, fraction))):
        reference.emulate_case_dir(tmp_path / "out" / "t-tnd-gqa", tmp_path / "o", order_seed=1)
    fractions = [f for name, f in seen if name == "t-tnd-gqa"]
    assert len(fractions) >= 2 and fractions == sorted(fractions) and fractions[-1] == 1.0 and fractions[0] < 1.0
    reference.emulate_case_dir(tmp_path / "out" / "t-tnd-gqa", tmp_path / "o", order_seed=1)
    assert len(seen) == len(fractions)  # no reporting outside the block


def test_progress_lines_without_a_terminal_give_the_phase_share_and_an_eta(monkeypatch):
    from bsa_cli.cli import progress

    monkeypatch.setattr(progress, "PLAIN_PROGRESS_S", 0.0)
    console = Console(file=io.StringIO(), width=120, color_system=None)
    with ProgressDisplay(console) as display:
        display.phase("run", 2, ["big", "small"], {"big": 90e9, "small": 10e9})
        display.progress("big", 0.5)
    text = console.file.getvalue()
    assert text.startswith("run      big 50%; run 45% of 100 GFLOP, ETA ")


def test_an_op_folders_run_line_never_breaks_inside_its_detail_at_80_columns():
    """`run ok smoke-bnsd-random.fp16@forward  status 0, 0.02 s, device 0` is 82 characters: a terminal would
    break it inside a number. A line that does not fit aligned gives up the alignment, then puts the detail whole
    on a line of its own (issue 32 item 4)."""
    console = Console(file=io.StringIO(), width=80, color_system=None)
    names = ["smoke-bnsd-random.fp16@forward", "smoke-bnsd-random.fp16"]
    with ProgressDisplay(console) as display:
        display.phase("run", 2, names)
        display.case("ok", names[0], "status 0, 0.02 s, device 0")
        display.case("ok", names[1], "status 0, 0.02 s, device 0")
    lines = console.file.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines == [
        "run      ok               smoke-bnsd-random.fp16@forward",
        "                          status 0, 0.02 s, device 0",
        "run      ok               smoke-bnsd-random.fp16  status 0, 0.02 s, device 0",
    ]


def test_the_progress_bar_keeps_its_amount_and_unit_on_one_line_at_80_columns():
    console = Console(file=io.StringIO(), width=80, color_system=None, force_terminal=True)
    with ProgressDisplay(console) as display:
        display.phase("run", 2, ["a", "b"], {"a": 4.9e11, "b": 7.2e11})
        display.running("smoke-bnsd-random.fp16@forward on device 0")
        display.progress("a", 1.0)
        assert display._progress is not None
        text = Console(file=io.StringIO(), width=80, color_system=None)
        text.print(display._progress.get_renderable())
        lines = text.file.getvalue().splitlines()
    assert len(lines) == 1 and "0.49/1.21 TFLOP" in lines[0], lines


def test_run_on_the_reference_device_weighs_the_bar_by_backward_flops(tmp_path, spec_file):
    from bsa_cli.pipeline import backward_flops

    assert invoke("gen", spec_file, "-o", tmp_path / "out").exit_code == 0
    flops = backward_flops(sorted((tmp_path / "out").iterdir()))
    assert flops["t-bnsd-tail"] > 0 and flops["t-neg-dtype"] == 0


# ---- widths: warnings wrapped, piped output as wide as the terminal (issue 16, item 12) -----------------


WARNING = (
    "doc-tail-varlen-honored: actual_seq_lengths [8000, 5003] shorter than q_seq_len 8000 with "
    "bnsd_lengths: honored: the A2/A3 kernel ignores BNSD lengths (computes over all S); use bnsd_lengths: "
    "ignored"
)


def test_a_warning_wraps_at_words_to_the_width_a_person_sees(monkeypatch):
    from bsa_cli.cli import output

    monkeypatch.setattr(output, "stderr", Console(file=io.StringIO(), width=160, color_system=None))
    monkeypatch.setenv("COLUMNS", "80")
    output.warn(WARNING)
    lines = output.stderr.file.getvalue().splitlines()
    assert lines == [
        "Warning: doc-tail-varlen-honored: actual_seq_lengths [8000, 5003] shorter than",
        "  q_seq_len 8000 with bnsd_lengths: honored: the A2/A3 kernel ignores BNSD",
        "  lengths (computes over all S); use bnsd_lengths: ignored",
    ]


def test_a_warning_stays_one_line_where_no_terminal_tells_a_width(monkeypatch):
    from bsa_cli.cli import output

    monkeypatch.setattr(output, "stderr", Console(file=io.StringIO(), width=160, color_system=None))
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(output, "terminal_width", lambda: None)  # a CI log
    output.warn(WARNING)
    assert output.stderr.file.getvalue() == f"Warning: {WARNING}\n"


def test_piped_stdout_takes_the_width_of_the_terminal_on_stderr(monkeypatch):
    import fcntl
    import os
    import pty
    import struct
    import sys
    import termios

    from bsa_cli.cli import output

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    with open(follower, "w", closefd=True) as terminal:
        monkeypatch.delenv("COLUMNS", raising=False)
        monkeypatch.setattr(sys, "__stdout__", io.StringIO())  # a pipe: `bsa check ... | tee log`
        monkeypatch.setattr(sys, "__stderr__", terminal)
        monkeypatch.setattr(sys, "__stdin__", None)
        assert output.terminal_width() == 100
        assert output._width(io.StringIO()) == 100
        monkeypatch.setattr(sys, "__stderr__", io.StringIO())
        assert output.terminal_width() is None and output._width(io.StringIO()) == output.PIPE_WIDTH
    os.close(leader)


@pytest.mark.parametrize("command", ["run", "check"])
def test_help_at_80_columns_keeps_every_name_whole(command):
    """click breaks a word longer than the help column: `npu_block_sparse_attention_backward` came out split."""
    result = CliRunner().invoke(main, [command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "npu_block_sparse_attention_backward" in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
