"""The run layer and op folders: skipped folders and ops a device cannot run, the outputs of an op folder,
and --repeat's rules for the forward's outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import devices
from bsa_cli.devices import reference, repeat
from bsa_cli.devices.base import Attempt, Execution
from bsa_cli.devices.record import check_outputs
from bsa_cli.store import load_manifest
from bsa_cli.store.manifest import Manifest
from tests.helpers import build_op_folder, case_factory, fake_device, read_record, run_options, write_case_dir

make = case_factory(head_dim=64, block_shape=(128, 128), q_seq_len=256, kv_seq_len=256, scale=None)

SKIP = "the A2/A3 forward refuses block_shape [128, 64]: Y % 128 != 0 (tiling, 561002); the backward accepts it"


@dataclass(frozen=True)
class NeverRuns(reference.ReferenceDevice):
    """A reference device that fails the test if a case reaches it."""

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        raise AssertionError(f"{execution.case_dir.name} was run")


@dataclass(frozen=True)
class SkipsAtRunTime(reference.ReferenceDevice):
    """A device that finds only when it runs that it cannot run the op (as a torch_npu child on torch < 2.6)."""

    def unsupported(self, manifest: Manifest) -> str | None:
        return None  # it cannot tell before it runs

    def execute(self, attempt: Attempt, execution: Execution) -> None:
        (execution.output_dir / attempt.stdout_log).write_text("")
        (execution.output_dir / attempt.stderr_log).write_text("")
        attempt.exit_code = 0
        attempt.skipped = "autograd needs torch 2.6 or later; this torch is 2.1.0"


# ---- folders that are not run ----------------------------------------------------------------------


def test_a_folder_gen_skipped_is_not_run_and_its_record_says_why(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "forward", skip=SKIP)
    (case_dir / "outputs").mkdir(exist_ok=True)
    (case_dir / "outputs" / "out.bin").write_bytes(b"left over")  # an earlier run's result goes

    summary = devices.run_cases([case_dir], devices.RunOptions(device=NeverRuns()))

    [result] = summary.results
    assert result.outcome == "skipped" and result.skipped == SKIP
    assert result.problems == () and summary.return_code == 0
    record = read_record(result)
    assert record["outcome"] == "skipped" and record["skipped"] == SKIP
    assert record["runs"] == [] and record["outputs"] == {} and record["inputs"] is None
    assert sorted(p.name for p in (case_dir / "outputs").iterdir()) == ["run.json"]


def test_the_reference_device_skips_autograd_with_the_reason(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "autograd")

    summary = devices.run_cases([case_dir], devices.RunOptions())

    [result] = summary.results
    assert result.outcome == "skipped", result.problems
    assert result.skipped == "the reference device has no autograd: run it with --device torch_npu"
    assert read_record(result)["skipped"] == result.skipped
    assert summary.return_code == 0


def test_a_binary_skips_autograd_without_being_started(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "autograd")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path)))

    assert result.outcome == "skipped"
    assert "run it with --device torch_npu" in (result.skipped or "")
    assert not (case_dir / "outputs" / "stdout.log").exists()


def test_a_device_may_find_at_run_time_that_it_cannot_run_the_op(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "autograd")

    summary = devices.run_cases([case_dir], devices.RunOptions(device=SkipsAtRunTime(), repeat=3))

    [result] = summary.results
    assert result.outcome == "skipped" and result.skipped == "autograd needs torch 2.6 or later; this torch is 2.1.0"
    record = read_record(result)
    assert record["skipped"] == result.skipped and len(record["runs"]) == 1  # no repeats of a skipped run
    assert record["runs"][0]["outcome"] == "skipped" and record["problems"] == []
    assert summary.return_code == 0


def test_the_summary_fails_for_others_not_for_the_skipped(tmp_path):
    skipped = build_op_folder(tmp_path, make("a"), "forward", skip=SKIP)
    broken = build_op_folder(tmp_path, make("b"), "forward")
    (broken / "inputs" / "query.bin").write_bytes(b"stale")

    summary = devices.run_cases([skipped, broken], devices.RunOptions(device=NeverRuns()))

    assert [r.outcome for r in summary.results] == ["skipped", "error"]
    assert summary.return_code == 3


def test_a_backward_record_keeps_its_keys(tmp_path):
    case_dir = write_case_dir(tmp_path / "out", "c")

    result = devices.run_case(case_dir, run_options(fake_device(tmp_path)))

    assert result.outcome == "ok" and result.skipped is None
    record = read_record(result)
    assert "skipped" not in record and "prefilled_outputs" not in record["device"]


# ---- the outputs of an op folder -----------------------------------------------------------------------


def _attempt(staging: Path, status: int = 0) -> Attempt:
    return Attempt(index=1, argv=[], staging=staging, stdout_log="stdout.log", stderr_log="stderr.log", status=status)


@pytest.mark.parametrize(("op", "names"), [("forward", ["out", "lse"]), ("chain", ["out", "lse", "dq", "dk", "dv"])])
def test_check_outputs_asks_every_output_of_the_op_folder(tmp_path, op, names):
    case = make("c")
    case_dir = build_op_folder(tmp_path, case, op)
    manifest = load_manifest(case_dir)
    staging = tmp_path / "staging"
    staging.mkdir()
    attempt = _attempt(staging)

    check_outputs(staging, manifest, attempt)

    assert len(attempt.problems) == len(names)
    assert [p.split()[0] for p in attempt.problems] == [f"{n}.bin" for n in names]
    assert all("missing" in p for p in attempt.problems)


def test_a_chain_refused_by_its_backward_may_leave_out_and_lse(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "chain")
    manifest = load_manifest(case_dir)
    staging = tmp_path / "staging"
    staging.mkdir()
    entries = dict(manifest.entries("outputs"))
    for name in ("out", "lse"):
        shape, dtype = entries[name]["shape"], entries[name]["dtype"]
        (staging / f"{name}.bin").write_bytes(np.zeros(shape, dtype=np.float16 if dtype == "float16" else np.float32))
    attempt = _attempt(staging, status=161002)

    check_outputs(staging, manifest, attempt)

    assert attempt.problems == [] and sorted(attempt.outputs) == ["lse", "out"]


# ---- --repeat ------------------------------------------------------------------------------------------


def _run_files(tmp_path: Path, index: int, files: dict[str, bytes]) -> Attempt:
    staging = tmp_path / f"run{index}"
    staging.mkdir()
    for name, data in files.items():
        (staging / f"{name}.bin").write_bytes(data)
    attempt = _attempt(staging)
    attempt.index = index
    return attempt


def _repeat_differences(tmp_path: Path, case_dir: Path, changed: str) -> list[dict]:
    manifest = load_manifest(case_dir)
    entries = dict(manifest.entries("outputs"))
    base = {
        name: bytes(int(np.prod(e["shape"])) * (4 if e["dtype"] == "float32" else 2)) for name, e in entries.items()
    }
    first = _run_files(tmp_path, 1, base)
    other = _run_files(tmp_path, 2, {**base, changed: b"\x01" + base[changed][1:]})
    check_outputs(first.staging, manifest, first)
    check_outputs(other.staging, manifest, other)
    return repeat.differences(manifest, first, other, deterministic=False)


@pytest.mark.parametrize(
    ("op", "changed", "matters"),
    [
        ("forward", "out", True),
        ("forward", "lse", True),
        ("chain", "out", True),
        ("chain", "lse", True),
        ("chain", "dq", True),
        ("chain", "dk", False),
        ("chain", "dv", False),
    ],
)
def test_repeats_must_agree_bitwise_on_out_lse_and_dq(tmp_path, op, changed, matters):
    case_dir = build_op_folder(tmp_path, make("c"), op)

    [diff] = _repeat_differences(tmp_path, case_dir, changed)

    assert diff["output"] == changed and diff["matters"] is matters
    assert ("a race" in diff["message"]) is matters


@pytest.mark.parametrize("op", ["forward", "chain"])
def test_an_lse_never_written_may_differ_between_repeats(tmp_path, op):
    case_dir = build_op_folder(tmp_path, make("c", softmax_lse_flag=0), op)

    [diff] = _repeat_differences(tmp_path, case_dir, "lse")

    assert diff["matters"] is False and diff["unwritten"] is True
    assert "softmax_lse_flag 0" in diff["message"]
    assert repeat.noise([diff]) == {}  # not atomic-add noise either


def test_a_binary_that_cannot_run_the_op_exits_5_and_the_case_is_skipped(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "chain")
    script = "echo 'cannot run: this harness has no forward' >&2; exit 5"

    result = devices.run_case(case_dir, run_options(cmd=f'sh -c "{script}" sh {{output_dir}}'))

    assert result.outcome == "skipped", result.problems
    assert result.skipped == "this harness has no forward"
    assert read_record(result)["skipped"] == "this harness has no forward"


def test_any_other_exit_5_is_an_error(tmp_path):
    case_dir = build_op_folder(tmp_path, make("c"), "chain")

    result = devices.run_case(case_dir, run_options(cmd='sh -c "echo oops >&2; exit 5" sh {output_dir}'))

    assert result.outcome == "error" and result.skipped is None
