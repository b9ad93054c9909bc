"""Timed runs and guard zones through the C++ harness, linked with the fake ACL of tests/fake_acl.

The fake's device clock advances a known time per operator call (its build's -DFAKE_ACL_KERNEL_US, or
FAKE_ACL_KERNEL_US), so a faster and a slower "kernel" are two builds of it. Its toy operator computes nothing
real, so the device used here runs the harness (for its times and guard zones) and then `bsa emulate` on the
same output folder (for outputs that pass): `--cmd` of a two-line shell script. Skipped without a C++ compiler.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from tests.helpers import REPO, TESTS

FAKE_ACL = TESTS / "fake_acl"
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler installed")

SPEC = {"cases": [{"name": "t", "dtype": "fp16", "q_seq_len": 40, "kv_seq_len": 24, "head_dim": 16, "num_heads": 2}]}
SPEC["cases"][0].update(block_shape=[16, 16], seed=3)

#: Microseconds per call of the faster build, and of builds 20% and 3% slower.
FAST, SLOW, SLIGHT = 100, 120, 103


def _compile(*args: str) -> None:
    flags = ["-std=c++17", "-O0", f"-I{FAKE_ACL}", f"-I{FAKE_ACL / 'aclnnop'}"]
    result = subprocess.run([str(CXX), *flags, *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[int, Path]:
    """The harness linked with the fake runtime built for each kernel time (the harness compiled once)."""
    root = tmp_path_factory.mktemp("timing-builds")
    harness = root / "harness.o"
    _compile("-c", str(REPO / "harness" / "bsa_grad_harness.cpp"), "-o", str(harness))
    binaries = {}
    for micros in (FAST, SLOW, SLIGHT):
        fake = root / f"fake-{micros}.o"
        _compile("-c", f"-DFAKE_ACL_KERNEL_US={micros}", str(FAKE_ACL / "fake_acl_runtime.cpp"), "-o", str(fake))
        binaries[micros] = root / f"harness-{micros}"
        _compile(str(harness), str(fake), "-o", str(binaries[micros]))
    return binaries


def device_script(folder: Path) -> Path:
    """A --cmd device: the harness given as $1 (times, guard zones), then the reference device's outputs."""
    script = folder / "device.sh"
    script.write_text(f'#!/bin/sh\n"$1" "$2" "$3" || exit $?\n"{sys.executable}" -m bsa_cli emulate "$2" "$3"\n')
    script.chmod(0o755)
    return script


def cmd(script: Path, binary: Path) -> str:
    return f"{script} {binary} {{manifest}} {{output_dir}}"


@pytest.fixture
def cases(tmp_path) -> Path:
    spec = tmp_path / "t.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    return tmp_path / "out"


def bsa(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def timed_report(cases: Path, script: Path, binary: Path, report: Path, *more: str) -> tuple[int, str]:
    code, output = bsa("run", str(cases), "--cmd", cmd(script, binary), "--time", "--time-runs", "5", "--warmup", "2")
    assert code == 0, output
    return bsa("compare", str(cases), "--json", str(report), *more)


def test_the_harness_reports_the_kernel_time_and_the_report_its_speed(builds, cases, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ACL_SLOW_CALL", "4")  # the judged call, 2 warm-ups, then an outlier: 10x
    code, output = timed_report(cases, device_script(tmp_path), builds[FAST], tmp_path / "r.json")

    assert code == 0, output
    record = json.loads((cases / "t" / "outputs" / "run.json").read_text())["timing"]
    backward = record["steps"]["backward"]
    assert backward["times_us"] == [1000.0, 100.0, 100.0, 100.0, 100.0]
    assert (backward["median_us"], backward["spread_us"], backward["outliers_dropped"]) == (100.0, 0.0, 1)
    assert (record["warmup"], record["runs"], record["not_timed"]) == (2, 5, None)
    case = json.loads((tmp_path / "r.json").read_text())["cases"][0]
    flops = json.loads((cases / "t" / "case.json").read_text())["stats"]["flops_backward"]
    assert case["kernel_time"][0]["median_us"] == 100.0
    assert case["kernel_time"][0]["tflops"] == pytest.approx(flops / 100e-6 / 1e12)
    assert "Kernel time" in output and "backward" in output


def test_a_20_percent_slower_build_is_a_regression_and_3_percent_is_not(builds, cases, tmp_path):
    script = device_script(tmp_path)
    code, output = timed_report(cases, script, builds[FAST], tmp_path / "fast.json")
    assert code == 0, output

    code, output = timed_report(
        cases, script, builds[SLOW], tmp_path / "slow.json", "--baseline", str(tmp_path / "fast.json")
    )
    assert code == 4, output
    assert "t backward: kernel 100.0 us -> 120.0 us (+20.0%" in output
    drift = json.loads((tmp_path / "slow.json").read_text())["drift"]["kernel_time"]
    assert drift["slower"] == 1 and drift["changes"][0]["regressed"]

    code, output = timed_report(
        cases, script, builds[SLIGHT], tmp_path / "slight.json", "--baseline", str(tmp_path / "fast.json")
    )
    assert code == 0, output
    assert json.loads((tmp_path / "slight.json").read_text())["drift"]["kernel_time"]["slower"] == 0


def test_a_write_past_an_output_fails_as_a_guard_zone_check(builds, cases, tmp_path, monkeypatch):
    script = device_script(tmp_path)
    monkeypatch.setenv("FAKE_ACL_WRITE_PAST_END", "dk:3")
    code, output = bsa("run", str(cases), "--cmd", cmd(script, builds[FAST]))
    assert code == 0, output
    code, output = bsa("compare", str(cases), "--json", str(tmp_path / "r.json"))

    assert code == 1, output
    checks = json.loads((tmp_path / "r.json").read_text())["cases"][0]["checks"]
    guard = [c for c in checks if c["name"] == "guard-zones"]
    assert len(guard) == 1 and guard[0]["tensor"] == "dk" and not guard[0]["passed"]
    assert "dk written outside the tensor, past its end: 3 element(s) from element offset 768" in guard[0]["detail"]

    monkeypatch.delenv("FAKE_ACL_WRITE_PAST_END")  # the same run without the fault (--all: the same device): clean
    assert bsa("run", str(cases), "--all", "--cmd", cmd(script, builds[FAST]))[0] == 0
    code, output = bsa("compare", str(cases))
    assert code == 0, output


def test_the_reference_device_records_no_time_and_says_why(cases, tmp_path):
    assert bsa("run", str(cases), "--time")[0] == 0
    record = json.loads((cases / "t" / "outputs" / "run.json").read_text())["timing"]
    assert record["steps"] == {} and "the reference device is not a device" in record["not_timed"]
    code, output = bsa("compare", str(cases))
    assert code == 0 and "Kernel time: the reference device is not a device" in output


def test_the_reference_devices_planted_write_past_the_end_shows_in_reports(cases, tmp_path):
    assert bsa("run", str(cases), "--fault", "dk-write-past-end")[0] == 0
    code, output = bsa("compare", str(cases), "--junit", str(tmp_path / "r.xml"))

    assert code == 1, output
    assert "dk written outside the tensor, past its end: 8 element(s) from element offset 768" in output
    assert "dk written outside the tensor" in (tmp_path / "r.xml").read_text()


def test_bisect_finds_the_commit_that_made_the_kernel_slower(builds, cases, tmp_path):
    """A kernel repository of six commits: 100 us, 100, one that does not build, 100, 120 (the culprit), 120.
    The good commit's report and every step are one `bsa check` each, on the cases `cases` generated."""
    script = device_script(tmp_path)
    timed, spec, good = (
        ("--time", "--time-runs", "3", "--warmup", "1"),
        str(tmp_path / "t.yaml"),
        tmp_path / "good.json",
    )
    code, output = bsa("check", spec, "-o", str(cases), "--cmd", cmd(script, builds[FAST]), *timed, "--json", str(good))
    assert code == 0, output
    repo = tmp_path / "kernel"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    commits = {}
    for index, micros in enumerate(("100", "100", "broken", "100", "120", "120")):
        (repo / "kernel_us").write_text(micros + "\n")
        subprocess.run([*git, "add", "kernel_us"], check=True)
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", f"kernel {index}: {micros}"], check=True)
        commits[index] = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = {
        **os.environ,
        "BSA": f"{sys.executable} -m bsa_cli",
        # The build: the fake runtime built for the commit's kernel time (no such build: the commit is broken).
        "BSA_BUILD": f'cp {builds[FAST].parent}/harness-"$(cat kernel_us)" harness',
        "BSA_DEVICE": "--cmd " + shlex.quote(cmd(script, repo / "harness")),
        "BSA_CHECK_OPTIONS": " ".join(timed),
        "BSA_SPECS": spec,
        "BSA_OUT": str(cases),
        "BSA_BASELINE": str(good),
        "PYTHONPATH": str(REPO),
    }
    subprocess.run([*git, "bisect", "start", commits[5], commits[0]], check=True, capture_output=True)
    result = subprocess.run(
        [*git, "bisect", "run", str(REPO / "scripts" / "bisect_kernel.sh")], capture_output=True, text=True, env=env
    )
    assert f"{commits[4]} is the first bad commit" in result.stdout, result.stdout + result.stderr
    assert "t backward: kernel 100.0 us -> 120.0 us (+20.0%" in result.stderr  # bsa check --baseline said why


def test_trend_follows_the_kernel_time_across_nights(builds, cases, tmp_path):
    script = device_script(tmp_path)
    reports = []
    for night, micros in enumerate((FAST, SLIGHT, SLOW)):
        reports.append(tmp_path / f"night{night}.json")
        code, output = timed_report(cases, script, builds[micros], reports[-1])
        assert code == 0, output
    code, output = bsa("trend", *map(str, reports), "--html", str(tmp_path / "trend.html"))

    assert code == 0, output
    assert "slower: t backward 100.0 us -> 120.0 us (+20.0%)" in output
    assert "Kernel time (median per night)" in (tmp_path / "trend.html").read_text()
