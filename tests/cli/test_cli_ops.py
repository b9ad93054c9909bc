"""`--ops` on bsa gen, check, run and compare, and the ops column of bsa list."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from bsa_cli import pipeline
from bsa_cli.cli.common import select_ops
from bsa_cli.store import load_manifest
from tests.helpers import invoke

SPEC = {
    "defaults": {"head_dim": 64, "num_heads": 1, "seed": 3, "dtype": "fp16", "q_seq_len": 128, "kv_seq_len": 256},
    "cases": [
        {"name": "pair", "block_shape": [128, 128], "ops": ["forward", "backward"]},
        {"name": "narrow", "block_shape": [128, 64], "ops": ["forward", "backward"]},  # the forward refuses Y 64
        {"name": "plain", "block_shape": [128, 128]},
    ],
}
"""A case of forward and backward, one whose forward is skipped (Y % 128), and one of the backward alone."""


def spec_file(tmp_path: Path, spec: dict[str, Any] = SPEC) -> Path:
    path = tmp_path / "ops.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def generated(generated_spec: Callable[..., Path], tmp_path: Path) -> Path:
    """A private copy of SPEC's folders, generated once (commands may write into them)."""
    return Path(shutil.copytree(generated_spec(SPEC, "-j", "1"), tmp_path / "out"))


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.mark.parametrize("command", ["gen", "check", "run", "compare"])
def test_a_word_that_is_no_op_is_a_usage_error_naming_the_ops(tmp_path: Path, command: str) -> None:
    target = spec_file(tmp_path) if command in ("gen", "check") else tmp_path
    extra = ["-o", tmp_path / "out"] if command == "gen" else []
    result = invoke(command, target, *extra, "--ops", "forward,sideways")
    assert result.exit_code == 2
    assert "Invalid value for '--ops': sideways: ops are forward, backward, chain, autograd" in result.stderr


def test_gen_writes_a_folder_per_op_and_a_skipped_op_says_why(generated: Path) -> None:
    assert names(generated) == ["narrow", "narrow@forward", "pair", "pair@forward", "plain"]
    skipped = load_manifest(generated / "narrow@forward")
    assert skipped.skip is not None and "561002" in skipped.skip
    assert load_manifest(generated / "pair@forward").op == "forward"


def test_gen_ops_overrides_the_specs_ops(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke("gen", spec_file(tmp_path), "-o", out, "--ops", "chain,backward", "--filter", "p*", "-j", "1")
    assert result.exit_code == 0, result.output
    assert names(out) == ["pair", "pair@chain", "plain", "plain@chain"]
    assert "generated 2 cases (4 case folders: one per op)" in result.stdout
    assert "one folder per op: pair, pair@chain" in result.stderr


def test_gen_of_the_backward_alone_says_what_it_always_said(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke("gen", spec_file(tmp_path), "-o", out, "--ops", "backward", "-j", "1")
    assert result.exit_code == 0, result.output
    assert names(out) == ["narrow", "pair", "plain"]
    assert f"generated 3 cases in {out}" in result.stdout
    assert "one folder per op" not in result.stderr


def test_list_shows_the_ops_column_only_where_a_case_lists_other_ops(tmp_path: Path) -> None:
    with_ops = invoke("list", spec_file(tmp_path), env={"COLUMNS": "250"})
    assert with_ops.exit_code == 0, with_ops.output
    header = with_ops.stdout.splitlines()[1].split()
    assert header[-1] == "ops"
    rows = {line.split()[0]: line.split()[-1] for line in with_ops.stdout.splitlines()[3:6]}
    assert rows == {"pair": "forward,backward", "narrow": "forward,backward", "plain": "backward"}
    alone = invoke("list", spec_file(tmp_path), "--filter", "plain", env={"COLUMNS": "250"})
    assert "ops" not in alone.stdout.splitlines()[1].split()


def test_select_ops_names_each_case_s_missing_op(tmp_path: Path) -> None:
    folders = [tmp_path / n for n in ("a", "a@forward", "b")]
    selected, notes = select_ops(folders, ("forward", "chain"))
    assert selected == [tmp_path / "a@forward"]
    assert notes == [
        "case a has no chain folder: its spec lists ops forward, backward; "
        "regenerate with `bsa gen --ops forward,backward,chain`",
        "case b has no forward folder: its spec lists ops backward; "
        "regenerate with `bsa gen --ops forward,backward,chain`",
        "case b has no chain folder: its spec lists ops backward; "
        "regenerate with `bsa gen --ops forward,backward,chain`",
    ]
    assert select_ops(folders, None) == (folders, [])


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The folders each `devices.run_cases` of a command got (the device itself does not run)."""
    runs: list[list[str]] = []

    def run_cases(case_dirs: Sequence[Path], options: Any, on_event: Any = None) -> Any:
        runs.append([Path(d).name for d in case_dirs])
        raise KeyboardInterrupt  # stops the command once the folders are known

    monkeypatch.setattr(pipeline.devices, "run_cases", run_cases)
    return runs


def test_run_ops_takes_only_those_folders_and_never_a_skipped_one(generated: Path, ran: list[list[str]]) -> None:
    result = invoke("run", generated, "--ops", "forward")
    assert ran == [["pair@forward"]]
    assert "skipped narrow@forward: the A2/A3 forward refuses" in result.stderr
    assert "case plain has no forward folder: its spec lists ops backward; regenerate with " in result.stderr


def test_run_without_ops_runs_every_folder_but_the_skipped(generated: Path, ran: list[list[str]]) -> None:
    invoke("run", generated)
    assert ran == [["narrow", "pair", "pair@forward", "plain"]]


def test_run_ops_of_no_folder_is_a_usage_error(generated: Path) -> None:
    result = invoke("run", generated, "--ops", "autograd")
    assert result.exit_code == 2
    assert "Error: --ops autograd: none of the 5 case folders is of these ops" in result.stderr
    assert "case pair has no autograd folder" in result.stderr


def test_compare_ops_judges_only_those_folders(generated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[list[str]] = []

    def compare_suite(case_dirs: Sequence[Path], *args: Any, **kwargs: Any) -> Any:
        judged.append([Path(d).name for d in case_dirs])
        raise KeyboardInterrupt

    import bsa_cli.cli.compare as compare_command

    monkeypatch.setattr(compare_command, "compare_suite", compare_suite)
    result = invoke("compare", generated, "--ops", "backward,chain")
    assert judged == [["narrow", "pair", "plain"]]
    assert "case pair has no chain folder: its spec lists ops forward, backward" in result.stderr


def test_compare_merge_takes_no_ops(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text("{}")
    result = invoke("compare", report, "--merge", "--ops", "forward")
    assert result.exit_code == 2
    assert "--merge cannot be used with --ops" in result.stderr


def test_check_ops_generates_and_runs_those_ops(tmp_path: Path, ran: list[list[str]]) -> None:
    out = tmp_path / "out"
    spec = {**SPEC, "cases": [c for c in SPEC["cases"] if c["name"] != "narrow"]}  # every case fits the forward
    result = invoke("check", spec_file(tmp_path, spec), "-o", out, "--ops", "forward", "-j", "1")
    assert result.exit_code == 130, result.output
    assert names(out) == ["pair@forward", "plain@forward"]
    assert ran == [["pair@forward", "plain@forward"]]


def test_check_ops_skips_what_no_asked_op_accepts_and_never_runs_it(tmp_path: Path, ran: list[list[str]]) -> None:
    out = tmp_path / "out"
    result = invoke("check", spec_file(tmp_path), "-o", out, "--ops", "forward", "-j", "1")
    assert result.exit_code == 130, result.output
    assert names(out) == ["narrow@forward", "pair@forward", "plain@forward"]
    skip = load_manifest(out / "narrow@forward").skip
    assert skip is not None and "Y % 128 != 0" in skip
    assert ran == [["pair@forward", "plain@forward"]]
