"""run.json's `device_software`: what the device side runs (bsa_cli/devices/software.py, docs/run.md).

The reference device records bsa's version; a binary the CANN version of the toolkit its environment names
(`<toolkit>/<arch>-linux/ascend_toolkit_install.info`); the torch_npu child torch, torch_npu and the CANN
version torch_npu reports, else the toolkit's. What is read is untrusted: bounded, one line, null when odd,
and never a reason for a run to fail.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest
import torch

from bsa_cli import __version__, devices
from bsa_cli.devices import software as device_software
from tests.helpers import fake_device, read_record, run_options, standin_env, write_case_dir

ARCH = platform.machine()


def toolkit(root: Path, text: str, arch: str = ARCH) -> Path:
    """Write `text` as the toolkit version file under `root`; return `root`."""
    info = root / f"{arch}-linux" / device_software.INFO_NAME
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_text(text)
    return root


INFO = "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100R001C25\narch={}\nos=linux\n"


# ---- the toolkit's version file ------------------------------------------------------------------------


def test_the_version_line_of_the_toolkit_file_is_read(tmp_path):
    root = toolkit(tmp_path / "tk", INFO.format(ARCH))

    assert device_software.toolkit_cann({"ASCEND_HOME_PATH": str(root)}) == (
        "8.5.0",
        str(root / f"{ARCH}-linux" / device_software.INFO_NAME),
    )


def test_the_variables_are_tried_in_order_and_opp_names_the_folder_below_the_toolkit(tmp_path):
    first = toolkit(tmp_path / "first", "version=9.1.0\n")
    second = toolkit(tmp_path / "second", "version=8.3.RC1\n")

    env = {
        "ASCEND_HOME_PATH": str(tmp_path / "none"),
        "ASCEND_TOOLKIT_HOME": str(first),
        "ASCEND_OPP_PATH": str(second / "opp"),
    }
    assert device_software.toolkit_cann(env)[0] == "9.1.0"
    assert device_software.toolkit_cann({"ASCEND_OPP_PATH": str(second / "opp")})[0] == "8.3.RC1"
    assert device_software.toolkit_cann({}) == (None, None)
    assert device_software.toolkit_cann({"ASCEND_HOME_PATH": ""}) == (None, None)


@pytest.mark.parametrize(
    "text",
    [
        "package_name=Ascend-cann-toolkit\n",  # no version line
        "version=\n",  # empty
        "version=8.5.0\x1b[31m\n",  # a control character
        "version=" + "9" * 65 + "\n",  # longer than a version
        "x" * device_software.INFO_MAX_BYTES + "\nversion=8.5.0\n",  # past the bytes read
        "version=8.\u00e95\n",  # not ASCII
    ],
)
def test_an_odd_toolkit_file_gives_null(tmp_path, text):
    root = toolkit(tmp_path / "tk", text)

    assert device_software.toolkit_cann({"ASCEND_HOME_PATH": str(root)}) == (None, None)


def test_a_fifo_device_or_folder_in_its_place_is_not_read(tmp_path):
    info = tmp_path / "tk" / f"{ARCH}-linux" / device_software.INFO_NAME
    info.parent.mkdir(parents=True)
    os.mkfifo(info)  # opening it for reading would block without O_NONBLOCK
    assert device_software.toolkit_cann({"ASCEND_HOME_PATH": str(tmp_path / "tk")}) == (None, None)
    info.unlink()
    info.symlink_to("/dev/zero")  # endless: never opened
    assert device_software.toolkit_cann({"ASCEND_HOME_PATH": str(tmp_path / "tk")}) == (None, None)
    info.unlink()
    info.mkdir()
    assert device_software.toolkit_cann({"ASCEND_HOME_PATH": str(tmp_path / "tk")}) == (None, None)


# ---- the torch_npu child's line ------------------------------------------------------------------------


def test_the_childs_line_is_read_back(tmp_path):
    found = {"torch": "2.1.0", "torch_npu": "2.1.0.post17", "cann": "8.5.0", "cann_source": "torch.version.cann"}
    log = tmp_path / "stdout.log"
    log.write_text("torch 2.1.0, torch_npu 2.1.0.post17, device 0\n" + device_software.torch_npu_line(found) + "\n")

    assert device_software.from_torch_npu_log(log) == {"kind": "torch_npu", **found}


@pytest.mark.parametrize(
    "line",
    [
        device_software.MARKER + "{not json",
        device_software.MARKER + '["a list"]',
        device_software.MARKER + json.dumps({"torch": "x" * device_software.LINE_MAX_CHARS}),
        device_software.MARKER + json.dumps({"torch": 2.1, "torch_npu": ["2.1"], "cann": "8.5\n0"}),
        "",
    ],
)
def test_an_odd_line_gives_nulls(tmp_path, line):
    log = tmp_path / "stdout.log"
    log.write_text("status 0\n" + line + "\n")

    assert device_software.from_torch_npu_log(log) == {
        "kind": "torch_npu",
        "torch": None,
        "torch_npu": None,
        "cann": None,
        "cann_source": None,
    }
    assert device_software.from_torch_npu_log(tmp_path / "missing.log")["torch"] is None
    assert device_software.from_torch_npu_log(None)["cann"] is None


def test_the_child_takes_the_cann_version_torch_npu_reports_before_the_toolkits(tmp_path):
    class Utils:
        @staticmethod
        def get_cann_version(module: str = "CANN") -> str:
            return "9.1.0" if module == "CANN" else ""

    class TorchNpu:
        __version__ = "2.6.0rc1"
        utils = Utils

    class Torch:
        __version__ = "2.6.0"

    env = {"ASCEND_HOME_PATH": str(toolkit(tmp_path / "tk", "version=8.5.0\n"))}
    assert device_software.torch_npu_software(Torch, TorchNpu, env) == {
        "torch": "2.6.0",
        "torch_npu": "2.6.0rc1",
        "cann": "9.1.0",
        "cann_source": "torch_npu.utils.get_cann_version",
    }
    TorchNpu.utils = None  # type: ignore[assignment]  # an older torch_npu: the toolkit's file
    assert device_software.torch_npu_software(Torch, TorchNpu, env)["cann"] == "8.5.0"
    assert device_software.torch_npu_software(Torch, TorchNpu, {})["cann"] is None


# ---- in run.json ---------------------------------------------------------------------------------------


def test_the_reference_device_records_bsa(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "ref")

    result = devices.run_case(case_dir, devices.RunOptions())

    assert read_record(result)["device_software"] == {"kind": "reference", "bsa": __version__}


def test_a_binary_records_the_toolkit_of_its_environment(tmp_path, monkeypatch):
    case_dir = write_case_dir(tmp_path / "out", "bin")
    binary = fake_device(tmp_path)
    root = toolkit(tmp_path / "tk", INFO.format(ARCH))
    for variable in device_software.TOOLKIT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)

    result = devices.run_case(case_dir, run_options(binary))
    assert result.outcome == "ok", result.problems
    assert read_record(result)["device_software"] == {"kind": "binary", "cann": None, "cann_source": None}

    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(root))
    result = devices.run_case(case_dir, run_options(binary))
    assert read_record(result)["device_software"] == {
        "kind": "binary",
        "cann": "8.5.0",
        "cann_source": str(root / f"{ARCH}-linux" / device_software.INFO_NAME),
    }

    info = root / f"{ARCH}-linux" / device_software.INFO_NAME
    info.unlink()
    os.mkfifo(info)  # a hostile file in its place: the run goes on, the value is null
    result = devices.run_case(case_dir, run_options(binary))
    assert result.outcome == "ok", result.problems
    assert read_record(result)["device_software"]["cann"] is None


def test_torch_npu_records_torch_torch_npu_and_cann(tmp_path, monkeypatch):
    standin_env(monkeypatch)
    for variable in device_software.TOOLKIT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    case_dir = write_case_dir(tmp_path / "out", "tn")
    device = devices.create(kind="torch_npu")

    monkeypatch.setenv("ASCEND_HOME_PATH", str(toolkit(tmp_path / "tk", INFO.format(ARCH))))
    result = devices.run_case(case_dir, devices.RunOptions(device=device))
    assert result.outcome == "ok", result.problems
    software = read_record(result)["device_software"]
    info = tmp_path / "tk" / f"{ARCH}-linux" / device_software.INFO_NAME
    assert software == {
        "kind": "torch_npu",
        "torch": torch.__version__,
        "torch_npu": "0.0.0+bsa.standin",
        "cann": "8.5.0",
        "cann_source": str(info),
    }

    monkeypatch.setenv("BSA_TORCH_NPU_STANDIN_CANN", "9.1.0")  # torch_npu reports it: taken first
    result = devices.run_case(case_dir, devices.RunOptions(device=device))
    software = read_record(result)["device_software"]
    assert (software["cann"], software["cann_source"]) == ("9.1.0", "torch_npu.utils.get_cann_version")

    monkeypatch.setenv("BSA_TORCH_NPU_STANDIN_FAULT", "import")  # the child cannot import torch_npu
    result = devices.run_case(case_dir, devices.RunOptions(device=device))
    assert result.outcome == "error"
    assert read_record(result)["device_software"] == {
        "kind": "torch_npu",
        "torch": None,
        "torch_npu": None,
        "cann": None,
        "cann_source": None,
    }


def test_compare_notes_a_device_whose_cann_release_is_not_the_suite_s(tmp_path: Path) -> None:
    import yaml
    from click.testing import CliRunner

    from bsa_cli.cli import main
    from bsa_cli.ops.interface import release_of_cann

    assert [release_of_cann(v) for v in ("9.0.0", "9.1.0.RC1", "8.3.RC1", None, "9.10")] == [
        "9.0.0",
        "9.1.0",
        None,
        None,
        None,
    ]
    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"cases": [{"name": "c", "num_heads": 1, "q_seq_len": 32, "head_dim": 16, "block_shape": [16, 16]}]}
        )
    )
    runner = CliRunner()
    assert runner.invoke(main, ["gen", str(spec), "-o", str(tmp_path / "out")]).exit_code == 0
    assert runner.invoke(main, ["run", str(tmp_path / "out")]).exit_code == 0
    record_path = tmp_path / "out" / "c" / "outputs" / "run.json"
    for cann, note in (("9.1.0.RC1", True), ("8.3.RC1", False)):
        record = json.loads(record_path.read_text())
        record["device_software"] = {"kind": "binary", "cann": cann, "cann_source": None}
        record_path.write_text(json.dumps(record))
        report = tmp_path / f"{cann}.json"
        result = runner.invoke(main, ["compare", str(tmp_path / "out"), "--json", str(report)])
        assert result.exit_code == 0, result.output
        case = json.loads(report.read_text())["cases"][0]
        assert case["device_cann"] == cann and case["release"] == "master"
        expected = (
            "the device ran CANN 9.1.0.RC1 (ops-transformer 9.1.0), but the case expects the statuses of "
            "release master: regenerate with --release 9.1.0"
        )
        assert (expected in case["notes"]) is note
