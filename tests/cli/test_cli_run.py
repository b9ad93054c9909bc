"""`bsa run`, `bsa emulate` and `bsa check` through the CLI: reference device, fake binaries, errors."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console

from bsa_cli import devices
from bsa_cli.cli import main
from bsa_cli.cli.progress import ProgressDisplay
from tests.helpers import REPO, SPEC, fake_device, invoke, run_record, write_case_dir


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("specs") / "tiny.yaml"
    path.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def generated(generated_spec) -> Path:
    """SPEC's cases, generated once (shared: tests that write into them take `out`, a copy)."""
    return generated_spec(SPEC)


@pytest.fixture
def out(generated, tmp_path) -> Path:
    """A private copy of the generated cases (runs write into them)."""
    return Path(shutil.copytree(generated, tmp_path / "out"))


# ---- bsa run with the reference device ------------------------------------------------------------


def test_run_without_binary_uses_the_reference_device_and_says_so(out):
    result = invoke("run", out)

    assert result.exit_code == 0, result.output
    assert "device: reference (bsa emulate): reference results, not device results" in result.stderr
    assert result.stdout == "ran 4 cases on reference (bsa emulate): 4 ok\n"
    for case_dir in out.iterdir():
        rec = run_record(case_dir)
        assert rec["device"] == {
            "name": "reference (bsa emulate)",
            "kind": "reference",
            "id": 0,
            "fault": None,
            "fault_not_applied": None,
        }
        assert rec["binary"] is None and rec["timeout_s"] is None
        assert rec["command"][:2] == ["bsa", "emulate"]
    assert run_record(out / "t-neg-dtype")["status"] == 161002
    assert run_record(out / "t-neg-tnd")["status"] == 161002
    assert not (out / "t-neg-tnd" / "outputs" / "dq.bin").exists()
    dq = np.fromfile(out / "t-bnsd-tail" / "outputs" / "dq.bin", dtype=np.float16)
    assert dq.size == 2 * 40 * 16 and np.isfinite(dq).all()


def test_run_lines_show_status_time_and_device_per_case(out):
    result = invoke("run", out, "--filter", "t-neg-*")

    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("run ")]
    assert len(lines) == 2
    assert lines[0].startswith("run      ok               t-neg-dtype  status 161002, ")
    assert lines[0].endswith(" s, device 0")


def test_planted_fault_is_recorded_with_the_reference_device(out):
    result = invoke("run", out, "--fault", "stale-output", "--filter", "t-bnsd-*")

    assert result.exit_code == 0, result.output
    assert "reference (bsa emulate) with fault 'stale-output'" in result.stdout
    rec = run_record(out / "t-bnsd-tail")
    assert rec["device"]["fault"] == "stale-output"
    assert rec["command"][-4:-2] == ["--fault", "stale-output"]
    assert rec["command"][-2:] == ["--seed", str(rec["runs"][0]["order_seed"])]
    assert not np.fromfile(out / "t-bnsd-tail" / "outputs" / "dq.bin", dtype=np.float16).any()


def test_fault_needs_the_reference_device(out, tmp_path):
    result = invoke("run", out, "--fault", "stale-output", "--binary", fake_device(tmp_path))

    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --fault plants a fault in the reference device; it cannot be used with --binary or --cmd\n"
    )


def test_unknown_fault_suggests_the_closest(out):
    result = invoke("run", out, "--fault", "stale-outputs")

    assert result.exit_code == 2
    assert result.stderr.startswith("Error: unknown fault 'stale-outputs' (did you mean 'stale-output'?); known")
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "0,x"], "Error: --devices '0,x': 'x' is not a device id; write ids like 0,1,2\n"),
        (["--devices", "1,1"], "Error: --devices 1,1: a device id is repeated\n"),
        (["--cmd", "{binary} {output_dir}"], "Error: --cmd uses {binary} but no --binary was given\n"),
        (["--filter", "nope*"], "--filter 'nope*' matches none of 4 cases"),
    ],
)
def test_bad_options_are_usage_errors(out, args, message):
    result = invoke("run", out, *args)

    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_outputs_root_into_the_cases_is_a_usage_error(out):
    result = invoke("run", out, "--outputs-root", out)

    assert result.exit_code == 2
    assert "would put outputs into the case directory" in result.stderr
    assert "Traceback" not in result.output


def test_run_on_a_folder_without_cases_is_a_usage_error(tmp_path):
    result = invoke("run", tmp_path)

    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path}: no case directories (*/case.json) here; write them with `bsa gen`\n"


# ---- bsa run with external binaries -----------------------------------------------------------------


def test_misbehaving_binary_cases_are_reported_and_the_run_exits_3(tmp_path):
    root = tmp_path / "out"
    for name in ("a_crash", "b_good", "c_nothing", "d_hang"):
        write_case_dir(root, name)

    result = invoke("run", root, "--binary", fake_device(tmp_path), "--timeout", "1", "--devices", "0,1")

    assert result.exit_code == 3, result.output
    assert "ran 4 cases on" in result.stdout
    assert result.stdout.rstrip().endswith(": 1 ok, 1 error, 1 crashed, 1 timeout")
    stderr = result.stderr
    assert "crashed          a_crash" in stderr and "killed by SIGSEGV (see stderr.log)" in stderr
    assert "ok               b_good" in stderr
    assert "no status.txt: the binary must write the aclnn status there" in stderr
    assert "timeout          d_hang" in stderr and "timed out after 1 s" in stderr


def test_repeat_with_a_racy_binary_exits_1(tmp_path):
    write_case_dir(tmp_path / "out", "racy_random")

    result = invoke("run", tmp_path / "out", "--binary", fake_device(tmp_path), "--repeat", "2")

    assert result.exit_code == 1, result.output
    assert "nondeterministic racy_random" in result.stderr
    assert "dq not bitwise identical: run 2 differs from run 1 in" in result.stderr


def test_outputs_root_and_cmd_template(tmp_path):
    write_case_dir(tmp_path / "out", "templ")
    binary = fake_device(tmp_path)

    template = "{binary} --tag {device_id} {manifest} {output_dir}"
    result = invoke(
        "run",
        tmp_path / "out",
        "--binary",
        binary,
        "--cmd",
        template,
        "--outputs-root",
        tmp_path / "dev",
        "--devices",
        "4",
    )

    assert result.exit_code == 0, result.output
    rec = json.loads((tmp_path / "dev" / "templ" / "run.json").read_text())
    assert rec["command"][1:3] == ["--tag", "4"]
    assert "ASCEND_DEVICE_ID 4" in (tmp_path / "dev" / "templ" / "stdout.log").read_text()


# ---- bsa emulate ------------------------------------------------------------------------------------


def test_emulate_follows_the_binary_contract(generated, tmp_path):
    result = invoke("emulate", generated / "t-tnd-gqa" / "case.json", tmp_path / "o")

    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("reference (bsa emulate): status 0; outputs in ")
    assert (tmp_path / "o" / "status.txt").read_text().splitlines()[0] == "0"
    manifest = json.loads((generated / "t-tnd-gqa" / "case.json").read_text())
    for grad, entry in manifest["outputs"].items():
        size = (tmp_path / "o" / entry["file"]).stat().st_size
        assert size == int(np.prod(entry["shape"])) * 2, grad


def test_emulate_negative_case_writes_only_the_status(generated, tmp_path):
    result = invoke("emulate", generated / "t-neg-dtype", tmp_path / "o")

    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["status.txt"]
    assert (tmp_path / "o" / "status.txt").read_text().startswith("161002\n")


def test_emulate_lists_faults_and_refuses_unknown_ones(generated, tmp_path):
    listed = invoke("emulate", "--list-faults", "x", "y")
    assert listed.exit_code == 0
    assert listed.stdout.splitlines()[0].startswith("drop-tail-block    the partial last block")
    assert len(listed.stdout.splitlines()) == len(devices.reference_faults())

    result = invoke("emulate", generated / "t-bnsd-tail", tmp_path / "o", "--fault", "nan-rows")
    assert result.exit_code == 2
    assert "Error: unknown fault 'nan-rows' (did you mean 'nan-row'?)" in result.stderr


def test_emulate_without_a_case_is_a_usage_error(tmp_path):
    result = invoke("emulate", tmp_path / "case.json", tmp_path / "o")

    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path / 'case.json'}: no manifest: not a case directory written by `bsa gen`\n"


# ---- the progress display -----------------------------------------------------------------------------


def test_display_prints_one_aligned_line_per_case_with_problems_below():
    console = Console(file=io.StringIO(), width=100, color_system=None)
    results = [
        devices.RunResult("short", Path("a"), Path("a/o"), "ok", (), 0, 0, 1, 0.25),
        devices.RunResult("a-longer-name", Path("b"), Path("b/o"), "timeout", ("timed out after 5 s",), None, 0, 0, 5),
        devices.RunResult("neg", Path("c"), Path("c/o"), "ok", (), 161001, 161002, 0, 0.01),
    ]
    with ProgressDisplay(console) as display:
        display.phase("run", 3, [r.name for r in results])
        for result in results:
            display.on_run_event(devices.RunEvent("done", result.name, result.device_id, result))

    assert console.file.getvalue() == (
        "run      ok               short          status 0, 0.25 s, device 1\n"
        "run      timeout          a-longer-name  5.00 s, device 0\n"
        "         timed out after 5 s\n"
        "run      ok               neg            status 161001 (expected 161002), 0.01 s, device 0\n"
    )


# ---- bsa check: gen, run, compare ----------------------------------------------------------------------


def test_check_generates_runs_and_compares_the_suite_with_the_reference_device(spec_file, tmp_path):
    out = tmp_path / "out"
    result = invoke("check", spec_file, "-o", out, "--json", tmp_path / "report.json")

    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith("4 cases: 4 passed, 0 failed, 0 errors")
    device = "device: reference (bsa emulate): reference results, not device results"
    assert result.stderr.count(device) == 1 and "reference device" not in result.stdout  # named once
    assert result.stderr.rstrip().endswith(f"wrote HTML report {out / 'report.html'}")  # --json named another file
    assert not (out / "report.json").exists()
    phases = [line.split()[:2] for line in result.stderr.splitlines() if line.startswith(("gen ", "run ", "compare "))]
    assert phases == [["gen", "generated"]] * 4 + [["run", "ok"]] * 4  # verdicts once: in the table only
    for name in ("t-bnsd-tail", "t-tnd-gqa", "t-neg-dtype", "t-neg-tnd"):
        assert result.stdout.count(f"| {name} ") == 1 and name not in result.stderr.split("judging")[1]
    document = json.loads((tmp_path / "report.json").read_text())
    assert len(document["cases"]) == 4
    assert run_record(out / "t-neg-tnd")["status"] == 161002

    again = invoke("check", spec_file, "-o", out)

    assert again.exit_code == 0, again.output
    gen_lines = [line for line in again.stderr.splitlines() if line.startswith("gen ")]
    assert len(gen_lines) == 4 and all(line.split()[1] == "skipped" and line.endswith("current") for line in gen_lines)


def test_check_regenerates_only_cases_whose_spec_or_inputs_changed(spec_file, tmp_path):
    out = tmp_path / "out"
    assert invoke("check", spec_file, "-o", out).exit_code == 0
    changed = yaml.safe_load(spec_file.read_text())
    changed["cases"][0]["seed"] = 99
    spec = tmp_path / "changed.yaml"
    spec.write_text(yaml.safe_dump(changed))
    (out / "t-tnd-gqa" / "inputs" / "query.bin").write_bytes(b"\0")

    result = invoke("check", spec, "-o", out)

    assert result.exit_code == 0, result.output
    outcomes = {line.split()[2]: line.split()[1] for line in result.stderr.splitlines() if line.startswith("gen ")}
    assert outcomes == {
        "t-bnsd-tail": "generated",
        "t-tnd-gqa": "generated",
        "t-neg-dtype": "skipped",
        "t-neg-tnd": "skipped",
    }


def test_check_with_a_planted_fault_fails(spec_file, tmp_path):
    result = invoke("check", spec_file, "-o", tmp_path / "out", "--fault", "dk-no-scale", "--filter", "t-bnsd-*")

    assert result.exit_code == 1, result.output
    assert ": 0 passed, 1 failed, 0 errors" in result.stdout
    assert "| t-bnsd-tail | FAIL " in result.stdout and "FAIL" not in result.stderr
    assert "with fault 'dk-no-scale': reference results, not device results" in result.stderr
    assert "likely: " in result.stdout and "worst elements" not in result.stdout  # the detail: -v, and the HTML
    verbose = invoke("check", spec_file, "-o", tmp_path / "out", "--fault", "dk-no-scale", "--filter", "t-bnsd-*", "-v")
    assert "worst elements" in verbose.stdout


def test_a_failing_check_leads_with_a_line_per_case_and_ends_with_where_the_report_is(spec_file, tmp_path):
    """At 80 columns a failing case is its row (what failed, its likely cause) and nothing more: no checks,
    worst elements or hot blocks; the summary ends stdout and the reports written into OUT end stderr."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bsa_cli", "check", spec_file, "-o", out, "--fault", "block-shift"]
    env = {**os.environ, "COLUMNS": "80"}  # the consoles take their width when bsa starts: a process of its own

    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    failed = [line for line in lines if "| FAIL " in line]
    assert failed and result.stdout.count("likely: ") == len(failed)
    assert not any(detail in result.stdout for detail in (": checks", "worst elements", "hot blocks"))
    # title, box, heading, rules, summaries; four lines at most per case: the figures and the other standards'
    # checks are -v's, the other standards' verdicts a line of the row
    assert len(lines) <= 8 + 4 * 4
    assert "matched ratio" not in result.stdout and "max abs error" not in result.stdout
    assert result.stdout.count("also mixed-tolerance: FAIL") == len(failed)
    verbose = subprocess.run([*command, "-v"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert "matched ratio" in verbose.stdout and "other standards: mixed-tolerance: FAIL (" in verbose.stdout
    assert lines[-1].endswith(f"{len(failed)} failed, 0 errors")
    assert result.stderr.rstrip().splitlines()[-2:] == [
        f"wrote JSON report {out / 'report.json'}",
        f"wrote HTML report {out / 'report.html'}",
    ]
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_check_compares_with_a_baseline_as_compare_does(spec_file, tmp_path):
    """The good night's report, then a night with a planted fault: check --baseline reports the drift."""
    out, good = tmp_path / "out", tmp_path / "good.json"
    assert invoke("check", spec_file, "-o", out, "--filter", "t-bnsd-*", "--json", good).exit_code == 0

    bad = ("check", spec_file, "-o", out, "--filter", "t-bnsd-*", "--fault", "dk-no-scale", "--baseline", good)
    result = invoke(*bad, "--fail-on-regression", "--json", tmp_path / "bad.json")

    assert result.exit_code == 1, result.output
    assert "t-bnsd-tail: PASS -> FAIL" in result.stdout
    document = json.loads((tmp_path / "bad.json").read_text())
    assert document["exit_code"] == 1 and document["drift"]["summary"]["compared"] == 1
    clean = invoke("check", spec_file, "-o", out, "--filter", "t-bnsd-*", "--baseline", good, "--fail-on-regression")
    assert clean.exit_code == 0, clean.output
    unused = invoke("check", spec_file, "-o", tmp_path / "never", "--time-threshold", "0.2", "--fail-on-regression")
    assert unused.exit_code == 2 and "--fail-on-regression needs --baseline OLD.json" in unused.stderr
    assert not (tmp_path / "never").exists()  # refused before anything was generated


def test_check_with_a_crashing_binary_cannot_judge_that_case(tmp_path):
    spec = tmp_path / "s.yaml"
    cases = [{**SPEC["cases"][0], "name": "good"}, {**SPEC["cases"][0], "name": "crash"}]
    spec.write_text(yaml.safe_dump({"defaults": SPEC["defaults"], "cases": cases}))

    result = invoke("check", spec, "-o", tmp_path / "out", "--binary", fake_device(tmp_path))

    assert result.exit_code == 3, result.output
    assert "2 cases: 1 passed, 0 failed, 1 error" in result.stdout
    assert "run      crashed          crash" in result.stderr
    assert "reference results" not in result.stdout


def test_check_fails_a_binary_whose_repeats_differ(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"defaults": SPEC["defaults"], "cases": [{**SPEC["cases"][0], "name": "random"}]}))

    result = invoke("check", spec, "-o", tmp_path / "out", "--binary", fake_device(tmp_path), "--repeat", "2")

    assert result.exit_code == 1, result.output
    assert "nondeterministic random" in result.stderr
    assert "| random | FAIL " in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--standard", "double-bench"], "Error: unknown standard"),
        (["--threshold", "rmse_ratio"], "Error: --threshold 'rmse_ratio': expected KEY=NUMBER"),
        (["--fault", "no-such"], "Error: unknown fault 'no-such'"),
    ],
)
def test_check_refuses_bad_options_before_generating(spec_file, tmp_path, args, message):
    result = invoke("check", spec_file, "-o", tmp_path / "out", *args)

    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)
    assert not (tmp_path / "out").exists()


def test_check_with_a_bad_spec_is_a_usage_error(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"cases": [{"name": "x", "layuot": "BNSD"}]}))

    result = invoke("check", spec, "-o", tmp_path / "out")

    assert result.exit_code == 2
    assert "(did you mean 'layout'?)" in result.stderr
    assert "Traceback" not in result.output


def test_ctrl_c_during_run_exits_130_and_keeps_finished_records(tmp_path, monkeypatch):
    root = tmp_path / "out"
    for name in ("a_good", "b_hang", "c_good"):
        write_case_dir(root, name)
    shown = ProgressDisplay.on_run_event

    def ctrl_c_on_hang(self, event):
        shown(self, event)
        if event.kind == "start" and event.case == "b_hang":
            raise KeyboardInterrupt

    monkeypatch.setattr(ProgressDisplay, "on_run_event", ctrl_c_on_hang)

    result = invoke("run", root, "--binary", fake_device(tmp_path))

    assert result.exit_code == 130, result.output
    assert "1 ok, 1 interrupted; 1 not run (interrupted)" in result.stdout
    assert run_record(root / "a_good")["outcome"] == "ok"
    assert run_record(root / "b_hang")["outcome"] == "interrupted"
    assert not (root / "c_good" / "outputs" / "run.json").exists()


def test_display_on_a_terminal_draws_a_bar_and_keeps_the_case_lines():
    console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system=None)
    result = devices.RunResult("only", Path("a"), Path("a/o"), "ok", (), 0, 0, 0, 0.5)
    with ProgressDisplay(console) as display:
        display.phase("run", 1, ["only"])
        display.on_run_event(devices.RunEvent("start", "only", 0))
        display.on_run_event(devices.RunEvent("done", "only", 0, result))

    text = console.file.getvalue()
    assert "run      ok               only  status 0, 0.50 s, device 0\n" in text
    assert "1/1" in text


def test_display_counts_a_gen_phase_in_flops_within_cases():
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    with ProgressDisplay(console) as display:
        display.phase("gen", 2, ["a", "b"], flops={"a": 3e9, "b": 1e9})
        display.progress("a", 0.5)
        display._progress.refresh()
        assert "1.5/4 GFLOP" in console.file.getvalue()
        display.case("generated", "a")
        display.progress("b", 0.5)
        display._progress.refresh()
        assert "3.5/4 GFLOP" in console.file.getvalue()
        display.case("generated", "b")
        display._progress.refresh()
    assert "4/4 GFLOP" in console.file.getvalue()


@pytest.mark.parametrize("command", ["run", "check"])
def test_repeat_help_says_dq_is_bitwise_and_dk_dv_noise_is_reported(command: str) -> None:
    text = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=200).output.split())
    assert (
        "Run each case N times and judge every run: a status or dq that differs between runs, or a run outside "
        "the standard, marks the case nondeterministic; dk/dv may differ in their last bits (fp32 atomic adds), "
        "which is reported as repeat-noise, not failed."
    ) in text


# ---- a run cut short, run again --------------------------------------------------------------------


def _ran(result) -> list[str]:
    return [line.split()[2] for line in result.stderr.splitlines() if line.startswith("run      ")]


def test_resume_runs_only_the_cases_without_a_complete_result_of_their_inputs(out) -> None:
    """A case whose run left no record (Ctrl-C before it ended) or ran on other inputs runs again; a case
    with a complete record is left as it is."""
    assert invoke("run", out).exit_code == 0
    (out / "t-bnsd-tail" / "outputs" / "run.json").unlink()  # cut short: no record
    record = json.loads((out / "t-tnd-gqa" / "outputs" / "run.json").read_text())
    record["inputs"]["query"] = "0" * 64  # run on inputs gen has replaced since
    (out / "t-tnd-gqa" / "outputs" / "run.json").write_text(json.dumps(record))
    kept = (out / "t-neg-dtype" / "outputs" / "run.json").read_bytes()

    result = invoke("run", out)  # resuming is the default; --resume says the same

    assert result.exit_code == 0, result.output
    assert sorted(_ran(result)) == ["t-bnsd-tail", "t-tnd-gqa"]
    assert "2 cases already complete, 2 to run (--all runs every case)" in result.stderr
    assert (out / "t-neg-dtype" / "outputs" / "run.json").read_bytes() == kept
    assert invoke("run", out, "--resume").stderr.count("run      ") == 0  # all complete now
    assert len(_ran(invoke("run", out, "--all"))) == 4


def test_a_result_of_another_run_or_with_changed_outputs_is_not_complete(out) -> None:
    """Another fault (another device name), another --repeat, an output changed since: the case runs again."""
    assert invoke("run", out).exit_code == 0
    assert _ran(invoke("run", out)) == []
    assert len(_ran(invoke("run", out, "--repeat", "2"))) == 4
    assert len(_ran(invoke("run", out, "--fault", "dk-no-scale"))) == 4
    assert _ran(invoke("run", out, "--fault", "dk-no-scale")) == []
    dq = out / "t-bnsd-tail" / "outputs" / "dq.bin"
    dq.write_bytes(bytes(len(dq.read_bytes())))  # same size, other bytes
    assert _ran(invoke("run", out, "--fault", "dk-no-scale")) == ["t-bnsd-tail"]
    assert invoke("run", out, "--resume", "--all").exit_code == 2


def test_a_run_cut_short_by_ctrl_c_goes_on_where_it_stopped(out, tmp_path) -> None:
    """A real interrupt: SIGINT to the process group (what Ctrl-C sends) while the last case's binary hangs,
    after the other three completed; the run again runs that case alone."""
    hold, started = tmp_path / "hold", tmp_path / "started"
    binary = tmp_path / "device.sh"
    binary.write_text(
        "#!/bin/sh\n"
        f'case "$1" in *t-tnd-gqa*) if [ -e {hold} ]; then touch {started}; sleep 60; fi;; esac\n'
        f'exec {sys.executable} -m bsa_cli emulate "$1" "$2" --deterministic\n'
    )
    binary.chmod(0o755)
    hold.touch()
    command = [sys.executable, "-m", "bsa_cli", "run", out, "--binary", binary]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the last case never started"
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert sorted(line.split()[2] for line in stderr.splitlines() if line.startswith("run      ok")) == [
        "t-bnsd-tail",
        "t-neg-dtype",
        "t-neg-tnd",
    ]
    hold.unlink()

    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    assert again.returncode == 0, again.stderr
    assert [line.split()[2] for line in again.stderr.splitlines() if line.startswith("run      ")] == ["t-tnd-gqa"]
    assert "3 cases already complete, 1 to run" in again.stderr


def test_failed_runs_only_the_cases_a_report_says_failed(out, tmp_path) -> None:
    report = tmp_path / "report.json"
    verdicts = {"t-bnsd-tail": "FAIL", "t-tnd-gqa": "PASS", "t-neg-dtype": "ERROR", "t-neg-tnd": "SKIP"}
    report.write_text(json.dumps({"cases": [{"name": n, "verdict": v} for n, v in verdicts.items()]}))

    result = invoke("run", out, "--failed", report)

    assert result.exit_code == 0, result.output
    assert sorted(_ran(result)) == ["t-bnsd-tail", "t-neg-dtype"]
    report.write_text("{}")
    refused = invoke("run", out, "--failed", report)
    assert refused.exit_code == 2 and f"Error: {report}: not a bsa JSON report" in refused.stderr


def test_check_and_compare_list_the_cases_in_one_order(spec_file, tmp_path) -> None:
    def names(stdout: str) -> list[str]:
        return [line.split("|")[1].strip() for line in stdout.splitlines() if line.startswith("| t-")]

    checked = invoke("check", spec_file, "-o", tmp_path / "out")
    compared = invoke("compare", tmp_path / "out")

    assert names(checked.stdout) == names(compared.stdout) == ["t-bnsd-tail", "t-neg-dtype", "t-neg-tnd", "t-tnd-gqa"]
