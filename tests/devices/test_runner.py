"""The binary contract as bsa_cli.devices runs it: fake device binaries that behave and misbehave."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bsa_cli import devices, store
from bsa_cli.core.errors import DataError
from bsa_cli.devices import process
from tests.helpers import fake_device, read_record, run_options, write_case_dir


def process_gone(pid: int) -> bool:
    """True if `pid` no longer runs (gone, or a zombie waiting for its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


# ---- a device that follows the contract ---------------------------------------------------------------


def test_good_binary_leaves_outputs_status_and_a_complete_record(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "good_case")
    binary = fake_device(tmp_path)

    result = devices.run_case(case_dir, run_options(binary, device_ids=(3,)))

    assert result.outcome == "ok", result.problems
    assert result.status == 0
    outputs = case_dir / "outputs"
    for grad in ("dq", "dk", "dv"):
        assert (outputs / f"{grad}.bin").read_bytes() == (case_dir / f"benchmark/{grad}.bin").read_bytes()
    assert not list(outputs.glob(".run-*")), "staging directories are cleaned up"
    record = read_record(result)
    assert record["format"] == "bsa-run/1"
    assert record["outcome"] == "ok"
    assert record["command"] == [str(binary), str(case_dir / "case.json"), str(outputs / ".run-1")]
    assert record["exit_code"] == 0 and record["signal"] is None
    assert record["status"] == 0 and record["status_message"] == "fake device"
    assert record["device"] == {
        "name": str(binary),
        "kind": "binary",
        "id": 3,
        "fault": None,
        "fault_not_applied": None,
    }
    assert record["binary"]["sha256"] == store.sha256_file(binary)
    assert record["env"] == {"ASCEND_DEVICE_ID": "3"}
    assert record["outputs"]["dq"]["sha256"] == store.sha256_file(outputs / "dq.bin")
    assert record["repeat"] == {
        "count": 1,
        "completed": 1,
        "identical": True,
        "differences": [],
        "noise": {},
        "seed": None,
    }
    assert record["started"] <= record["finished"]
    manifest = json.loads((case_dir / "case.json").read_text())
    assert record["inputs"] == {name: entry["sha256"] for name, entry in manifest["inputs"].items()}
    stdout = (outputs / record["stdout_log"]).read_text()
    assert "ASCEND_DEVICE_ID 3" in stdout


def test_negative_case_records_the_status_without_gradients(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "bad_dtype", expect=161002)

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path)))

    assert result.outcome == "ok", result.problems
    assert (result.status, result.expect_status) == (161002, 161002)
    assert not (case_dir / "outputs" / "dq.bin").exists()
    assert read_record(result)["status_message"] == "fake device: expected error"


def test_outputs_root_puts_outputs_under_the_case_name(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "rooted")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path), outputs_root=tmp_path / "device"))

    assert result.output_dir == (tmp_path / "device" / "rooted").resolve()
    assert (result.output_dir / "dq.bin").is_file()
    assert not (case_dir / "outputs" / "dq.bin").exists()


# ---- devices that break the contract: each case reported, the others still run -------------------


def test_misbehaving_binaries_are_reported_per_case_and_the_run_goes_on(tmp_path):
    root = tmp_path / "out"
    names = ["a_crash", "b_hang", "c_truncated", "d_nothing", "e_exitcode", "f_badstatus", "g_good", "h_good"]
    case_dirs = [write_case_dir(root, n) for n in names]
    events: list[devices.RunEvent] = []

    started = time.monotonic()
    summary = devices.run_cases(
        case_dirs, run_options(fake_device(tmp_path), device_ids=(0, 1), timeout=3.0), on_event=events.append
    )
    elapsed = time.monotonic() - started

    by_name = {r.name: r for r in summary.results}
    assert [r.name for r in summary.results] == names, "results come back in case order"
    assert by_name["a_crash"].outcome == "crashed"
    assert "killed by SIGSEGV" in by_name["a_crash"].problems[0]
    assert by_name["b_hang"].outcome == "timeout"
    assert "timed out after 3 s" in by_name["b_hang"].problems[0]
    assert by_name["c_truncated"].outcome == "error"
    assert "dq.bin truncated: 2047 bytes, expected 2048" in by_name["c_truncated"].problems[0]
    assert by_name["d_nothing"].outcome == "error"
    assert by_name["d_nothing"].problems == ("no status.txt: the binary must write the aclnn status there",)
    assert by_name["e_exitcode"].outcome == "error"
    assert "exited with code 3 although it wrote status.txt" in by_name["e_exitcode"].problems[0]
    assert by_name["f_badstatus"].outcome == "error"
    assert "first line 'oops' is not a decimal aclnn status" in by_name["f_badstatus"].problems[0]
    assert by_name["g_good"].outcome == by_name["h_good"].outcome == "ok"
    assert summary.return_code == 3
    assert elapsed < 3.0 + process.KILL_GRACE_S + 8, "the hang did not hold up the other device"
    assert {e.device_id for e in events} == {0, 1}
    assert sorted(e.case for e in events if e.kind == "done") == names

    crash = read_record(by_name["a_crash"])
    assert crash["signal"] == "SIGSEGV" and crash["exit_code"] is None
    assert crash["outputs"] == {}, "a crashed run's half-written dq.bin is not recorded as an output"
    hang = read_record(by_name["b_hang"])
    assert hang["outcome"] == "timeout" and hang["timeout_s"] == 3.0
    child_pid = int((by_name["b_hang"].output_dir / "child.pid").read_text())
    assert process_gone(child_pid), "the binary's child was killed with its process group"


def test_timeout_kills_the_whole_process_group(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "only_hang")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path), timeout=0.5))

    assert result.outcome == "timeout"
    child_pid = int((result.output_dir / "child.pid").read_text())
    deadline = time.monotonic() + 2
    while not process_gone(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_gone(child_pid)


def test_stale_outputs_of_an_earlier_run_are_deleted_before_a_case_runs(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "now_nothing")
    outputs = case_dir / "outputs"
    for stale in ("dq.bin", "dk.bin", "dv.bin", "status.txt", "stdout.run2.log", "run.json"):
        (outputs / stale).write_text("stale")
    (outputs / ".run-7").mkdir()
    (outputs / "notes.md").write_text("mine")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path)))

    assert result.outcome == "error"
    left = sorted(p.name for p in outputs.iterdir())
    assert left == ["notes.md", "run.json", "stderr.log", "stdout.log"]
    assert read_record(result)["outcome"] == "error"


def test_stale_inputs_are_not_run(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "edited")
    (case_dir / "inputs" / "query.bin").write_bytes(b"\1" * 2048)

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path)))

    assert result.outcome == "error"
    assert "inputs not run:" in result.problems[0]
    assert "query.bin: sha256 differs from the manifest" in result.problems[0]
    record = read_record(result)
    assert record["runs"] == [] and record["command"] is None
    assert record["inputs"] is None  # nothing was run on them


def test_missing_manifest_is_an_error_record(tmp_path):
    case_dir = tmp_path / "out" / "broken"
    case_dir.mkdir(parents=True)
    (case_dir / "case.json").write_text("{not json")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path)))

    assert result.outcome == "error"
    assert "not valid JSON" in result.problems[0]


def test_binary_that_cannot_start_is_an_error(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "no_exec")
    binary = fake_device(tmp_path)
    device = devices.create(binary=binary)
    binary.unlink()

    result = devices.run_case(case_dir, devices.RunOptions(device=device))

    assert result.outcome == "error"
    assert "cannot start" in result.problems[0]


# ---- repeats and determinism ------------------------------------------------------------------------


def test_repeat_reports_outputs_that_are_not_bitwise_identical(tmp_path):
    root = tmp_path / "out"
    case_dirs = [write_case_dir(root, "steady_good"), write_case_dir(root, "racy_random")]

    summary = devices.run_cases(case_dirs, run_options(fake_device(tmp_path), repeat=3))

    steady, racy = summary.results
    assert steady.outcome == "ok"
    assert read_record(steady)["repeat"] == {
        "count": 3,
        "completed": 3,
        "identical": True,
        "differences": [],
        "noise": {},
        "seed": None,
    }
    assert racy.outcome == "nondeterministic"
    assert "dq not bitwise identical: run 2 differs from run 1 in" in racy.problems[0]
    record = read_record(racy)
    assert record["repeat"]["identical"] is False
    first_diff = record["repeat"]["differences"][0]
    assert first_diff["run"] == 2 and first_diff["output"] == "dq" and first_diff["total"] == 1024
    assert 0 < first_diff["elements"] <= 1024 and first_diff["matters"] and first_diff["max_ulp"] > 0
    assert len(record["runs"]) == 3
    assert record["runs"][1]["outputs"]["dq"]["sha256"] != record["runs"][0]["outputs"]["dq"]["sha256"]
    assert record["env"] == {"ASCEND_DEVICE_ID": "0"}
    assert "ASCEND_DEVICE_ID 0" in (racy.output_dir / "stdout.run3.log").read_text()
    assert (racy.output_dir / "dq.bin").read_bytes() != b"", "the first run's outputs are kept"
    assert record["outputs"]["dq"]["sha256"] == store.sha256_file(racy.output_dir / "dq.bin")
    assert not list(racy.output_dir.glob(".run-*"))
    assert summary.return_code == 1


def test_repeat_stops_at_a_failing_run(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "repeat_crash")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path), repeat=3))

    assert result.outcome == "crashed"
    assert result.problems[0].startswith("run 1 of 3: killed by SIGSEGV")
    assert len(read_record(result)["runs"]) == 1


# ---- Ctrl-C --------------------------------------------------------------------------------------------


def test_ctrl_c_keeps_finished_cases_and_records_the_interrupted_one(tmp_path):
    root = tmp_path / "out"
    case_dirs = [write_case_dir(root, name) for name in ("first_good", "second_hang", "third_good")]
    outputs = case_dirs[1] / "outputs"
    (outputs / "dq.bin").write_text("stale from an earlier run")

    def interrupt_when_hanging(event: devices.RunEvent) -> None:
        if event.kind == "start" and event.case == "second_hang":
            deadline = time.monotonic() + 5
            while not (outputs / ".run-1" / "child.pid").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            raise KeyboardInterrupt

    summary = devices.run_cases(case_dirs, run_options(fake_device(tmp_path)), on_event=interrupt_when_hanging)

    assert summary.interrupted
    assert [(r.name, r.outcome) for r in summary.results] == [("first_good", "ok"), ("second_hang", "interrupted")]
    assert summary.not_run == ["third_good"]
    assert summary.return_code == 3
    assert json.loads((case_dirs[0] / "outputs" / "run.json").read_text())["outcome"] == "ok"
    record = json.loads((outputs / "run.json").read_text())
    assert record["outcome"] == "interrupted"
    assert not (outputs / "dq.bin").exists(), "no stale or partial gradients next to an interrupted record"
    assert not list(outputs.glob(".run-*"))
    assert not (case_dirs[2] / "outputs" / "run.json").exists()
    assert not list(root.rglob(".run.json.*.tmp")), "no half-written record"


# ---- the --cmd template ---------------------------------------------------------------------------------


def test_cmd_template_substitutes_every_placeholder_without_a_shell(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "templated")
    binary = fake_device(tmp_path)
    cmd = "{binary} --tag 'dev={device_id} dir={case_dir};$HOME' {manifest} {output_dir}"

    result = devices.run_case(case_dir, run_options(binary, cmd=cmd, device_ids=(5,)))

    assert result.outcome == "ok", result.problems
    record = read_record(result)
    staging = str(case_dir / "outputs" / ".run-1")
    expected_tag = f"dev=5 dir={case_dir};$HOME"
    assert record["command"] == [str(binary), "--tag", expected_tag, str(case_dir / "case.json"), staging]
    stdout = (result.output_dir / "stdout.log").read_text()
    assert f"tag {expected_tag}" in stdout, "quoted text reaches the binary as one argument, unexpanded"


def test_cmd_template_without_binary_runs_the_command(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "via_cmd")
    binary = fake_device(tmp_path)

    result = devices.run_case(case_dir, run_options(cmd=f"{binary} {{manifest}} {{output_dir}}"))

    assert result.outcome == "ok", result.problems
    assert read_record(result)["binary"] is None


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        ("{binary} {manifest} {outdir}", "unknown placeholder {outdir} (did you mean 'output_dir'?)"),
        ("{binary} {manifest}", "has no {output_dir}"),
        ("run '{manifest} {output_dir}", "cannot split it like a shell would"),
        ("{binary} {output_dir} }", "write literal braces as {{ and }}"),
        ("", "--cmd is empty"),
    ],
)
def test_bad_cmd_templates_are_refused(tmp_path, cmd, message):
    with pytest.raises(devices.RunConfigError, match=None) as excinfo:
        devices.create(binary=fake_device(tmp_path), cmd=cmd)
    assert message in str(excinfo.value)


def test_cmd_binary_placeholder_needs_binary():
    with pytest.raises(devices.RunConfigError, match=r"--cmd uses \{binary\} but no --binary was given"):
        devices.create(cmd="{binary} {manifest} {output_dir}")


def test_binary_must_exist_and_be_executable(tmp_path):
    with pytest.raises(devices.RunConfigError, match="no such file"):
        devices.create(binary=tmp_path / "missing")
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(devices.RunConfigError, match=r"not an executable file \(chmod \+x\?\)"):
        devices.create(binary=plain)


# ---- options and selection -----------------------------------------------------------------------------


def test_parse_device_ids():
    assert devices.parse_device_ids("0") == (0,)
    assert devices.parse_device_ids("0,2, 5") == (0, 2, 5)
    assert devices.parse_device_ids("0-3") == (0, 1, 2, 3)
    with pytest.raises(devices.RunConfigError, match="'x' is not a device id"):
        devices.parse_device_ids("0,x")
    with pytest.raises(devices.RunConfigError, match="a device id is repeated"):
        devices.RunOptions(device_ids=(1, 1))
    with pytest.raises(devices.RunConfigError, match="--repeat 0"):
        devices.RunOptions(repeat=0)


def test_select_cases_filters_by_name_glob(tmp_path):
    root = tmp_path / "out"
    for name in ("smoke_a", "smoke_b", "edge_a"):
        write_case_dir(root, name)

    assert [p.name for p in store.select_cases([root])] == ["edge_a", "smoke_a", "smoke_b"]
    assert [p.name for p in store.select_cases([root], ["smoke_*"])] == ["smoke_a", "smoke_b"]
    assert [p.name for p in store.select_cases([root], ["*_b", "edge*"])] == ["edge_a", "smoke_b"]
    assert [p.name for p in store.select_cases([root / "edge_a"])] == ["edge_a"]
    with pytest.raises(DataError, match=r"--filter .nightly_\*. matches none of 3 cases"):
        store.select_cases([root], ["nightly_*"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no case directories"):
        store.select_cases([tmp_path / "empty"])


def test_environment_is_not_leaked_between_runs(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "env_good")
    os.environ.pop("ASCEND_DEVICE_ID", None)

    devices.run_case(case_dir, run_options(fake_device(tmp_path), device_ids=(2,)))

    assert "ASCEND_DEVICE_ID" not in os.environ
    assert "ASCEND_DEVICE_ID 2" in (case_dir / "outputs" / "stdout.log").read_text()


def test_outputs_root_may_not_be_the_cases_folder(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "here")

    with pytest.raises(devices.RunConfigError, match="would put outputs into the case directory"):
        devices.run_cases([case_dir], run_options(fake_device(tmp_path), outputs_root=tmp_path / "out"))
