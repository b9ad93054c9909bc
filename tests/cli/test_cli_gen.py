"""`bsa gen`, `bsa validate`, `bsa list` through the CLI: files, manifest contract, errors, atomicity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from bsa_cli.gen import generate
from bsa_cli.store import read_array
from tests.helpers import CASES, invoke

CASE = {
    "name": "tiny",
    "num_heads": 2,
    "q_seq_len": 96,
    "kv_seq_len": 80,
    "head_dim": 32,
    "block_shape": [32, 48],
    "sparsity": {"pattern": "random", "density": 0.6},
}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def spec(tmp_path: Path, *cases: dict, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"cases": list(cases)}, sort_keys=False))
    return str(path)


def test_gen_writes_the_documented_case_directory(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(main, ["gen", spec(tmp_path, CASE), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    case_dir = tmp_path / "out" / "tiny"
    manifest = json.loads((case_dir / "case.json").read_text())
    assert manifest["format"] == "bsa-case/1" and manifest["name"] == "tiny"
    for key in (
        "layout",
        "dtype",
        "batch",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "q_seq_len",
        "kv_seq_len",
        "block_shape",
        "actual_seq_lengths",
        "actual_seq_lengths_kv",
        "seq_lengths_encoding",
        "scale",
        "mask_type",
        "pre_tokens",
        "next_tokens",
    ):
        assert key in manifest["params"], key
    assert set(manifest["inputs"]) == {
        "query",
        "key",
        "value",
        "dout",
        "attention_out",
        "softmax_lse",
        "block_sparse_mask",
    }
    assert set(manifest["golden"]) == set(manifest["benchmark"]) == set(manifest["outputs"]) == {"dq", "dk", "dv"}
    assert manifest["inputs"]["softmax_lse"]["shape"] == [1, 2, 96, 1]
    assert manifest["inputs"]["block_sparse_mask"] == {
        **manifest["inputs"]["block_sparse_mask"],
        "dtype": "uint8",
        "shape": [1, 2, 3, 2],
    }
    assert manifest["golden"]["dq"]["dtype"] == "float32" and manifest["benchmark"]["dk"]["dtype"] == "float16"
    assert manifest["outputs"]["dv"] == {"file": "dv.bin", "dtype": "float16", "shape": [1, 2, 80, 32]}
    assert manifest["expect"] == {"status": 0, "name": "ACLNN_SUCCESS"}
    for section in ("inputs", "golden", "benchmark"):
        for entry in manifest[section].values():
            read_array(case_dir, entry)  # size and sha256 agree with the manifest
    assert (case_dir / "outputs").is_dir()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_flat_params_file_lists_params_and_arrays(runner: CliRunner, tmp_path: Path) -> None:
    tnd = {k: v for k, v in CASE.items() if not k.endswith("seq_len")}
    tnd |= {"layout": "TND", "actual_seq_lengths": [40, 0, 56], "seq_lengths_encoding": "cumulative"}
    result = runner.invoke(main, ["gen", spec(tmp_path, tnd), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = dict(
        line.split(" ", 1)
        for line in (tmp_path / "out" / "tiny" / "case.txt").read_text().splitlines()
        if not line.startswith(("input ", "golden ", "output "))
    )
    assert lines["layout"] == "TND" and lines["actual_seq_lengths"] == "40 40 96"
    assert lines["block_shape"] == "32 48" and lines["expect_status"] == "0"
    text = (tmp_path / "out" / "tiny" / "case.txt").read_text()
    assert "input query inputs/query.bin float16 3 96 2 32\n" in text
    assert "output dq dq.bin float16 3 96 2 32\n" in text


def test_gen_is_reproducible_and_golden_precision_selectable(runner: CliRunner, tmp_path: Path) -> None:
    path = spec(tmp_path, CASE)
    runner.invoke(main, ["gen", path, "-o", str(tmp_path / "a")])
    runner.invoke(main, ["gen", path, "-o", str(tmp_path / "b"), "--precision", "float64"])
    a = json.loads((tmp_path / "a" / "tiny" / "case.json").read_text())
    b = json.loads((tmp_path / "b" / "tiny" / "case.json").read_text())
    assert a["inputs"] == b["inputs"]
    assert b["golden"]["dq"]["dtype"] == "float64" and b["generator"]["golden_precision"] == "float64"
    g32 = read_array(tmp_path / "a" / "tiny", a["golden"]["dq"])
    g64 = read_array(tmp_path / "b" / "tiny", b["golden"]["dq"])
    np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-5)


def test_negative_case_has_inputs_and_no_golden(runner: CliRunner, tmp_path: Path) -> None:
    neg = {**CASE, "tensors": {"block_sparse_mask": {"dtype": "int8"}}, "expect": "ACLNN_ERR_PARAM_INVALID"}
    assert runner.invoke(main, ["gen", spec(tmp_path, neg), "-o", str(tmp_path / "o")]).exit_code == 0
    manifest = json.loads((tmp_path / "o" / "tiny" / "case.json").read_text())
    assert manifest["golden"] == {} and manifest["benchmark"] == {}
    assert manifest["expect"] == {"status": 161002, "name": "ACLNN_ERR_PARAM_INVALID"}
    assert (tmp_path / "o" / "tiny" / "inputs" / "query.bin").is_file()
    assert manifest["inputs"]["block_sparse_mask"]["dtype"] == "int8"


def test_spec_error_exits_2_with_one_error_line(runner: CliRunner, tmp_path: Path) -> None:
    path = spec(tmp_path, {**CASE, "dtyp": "fp16"})
    result = runner.invoke(main, ["gen", path, "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert (
        result.stderr == f"Error: {path}: case 'tiny': key 'dtyp': unknown key (did you mean 'dtype'?); "
        f"allowed: {', '.join(__import__('bsa_cli.specs', fromlist=['CASE_KEYS']).CASE_KEYS)}\n"
    )
    assert not (tmp_path / "o").exists()


def test_interrupted_gen_leaves_no_case_that_looks_complete(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    assert runner.invoke(main, ["gen", spec(tmp_path, CASE), "-o", str(out)]).exit_code == 0
    before = (out / "tiny" / "case.json").read_bytes()

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(generate.CaseWriter, "commit", interrupted)
    result = runner.invoke(main, ["gen", spec(tmp_path, {**CASE, "seed": 9}, {**CASE, "name": "new"}), "-o", str(out)])
    assert result.exit_code != 0
    assert (out / "tiny" / "case.json").read_bytes() == before  # the old complete case is untouched
    assert sorted(p.name for p in out.iterdir()) == ["tiny"]  # no partial directories left behind


def test_validate_says_which_release_the_cases_expect(runner: CliRunner, tmp_path: Path) -> None:
    path = spec(tmp_path, {**CASE, "release": "9.0.0"}, {**CASE, "name": "b"})
    result = runner.invoke(main, ["validate", path])
    assert result.stdout.splitlines()[1] == (
        "operator release: 9.0.0 (1 case), master (1 case), from the specs' release: (default master)"
    )
    result = runner.invoke(main, ["validate", path, "--release", "9.1.0"])
    assert result.stdout.splitlines()[1] == "operator release: 9.1.0 (2 cases), from --release"
    bad = runner.invoke(main, ["validate", spec(tmp_path, {**CASE, "release": "9.1"}, name="bad.yaml")])
    assert bad.exit_code == 2
    assert "key 'release': '9.1' is not a release bsa knows (did you mean '9.1.0'?); allowed: 9.0.0, 9.1.0, master" in (
        bad.stderr
    )


def test_a_null_layout_is_161002_on_master_and_refused_on_9_1_0(runner: CliRunner, tmp_path: Path) -> None:
    case = {**CASE, "kv_layout": None, "expect": 161002}
    assert runner.invoke(main, ["validate", spec(tmp_path, case)]).exit_code == 0
    refused = runner.invoke(main, ["validate", spec(tmp_path, case), "--release", "9.1.0"])
    assert refused.exit_code == 2
    assert (
        "key 'null_layouts': kv_layout is null: 9.1.0 reads the layout string before any check (master returns "
        "161002): undefined behaviour, no status to expect"
    ) in refused.stderr
    out = tmp_path / "out"
    assert runner.invoke(main, ["gen", spec(tmp_path, case), "-o", str(out)]).exit_code == 0
    manifest = json.loads((out / "tiny" / "case.json").read_text())
    assert manifest["params"]["null_layouts"] == ["kv"] and manifest["semantics"]["release"] == "master"
    assert runner.invoke(main, ["run", str(out)]).exit_code == 0
    assert (out / "tiny" / "outputs" / "status.txt").read_text().startswith("161002\n")


def test_deterministic_mode_is_refused_for_a_release_without_it(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(main, ["gen", spec(tmp_path, CASE), "-o", str(out), "--release", "9.1.0"]).exit_code == 0
    result = runner.invoke(main, ["run", str(out), "--deterministic"])
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "Error: --deterministic: 1 case(s) target a release without the deterministic mode: tiny (9.1.0)"
    )
    assert not (out / "tiny" / "outputs" / "run.json").exists()
    checked = runner.invoke(
        main, ["check", spec(tmp_path, CASE), "-o", str(tmp_path / "o2"), "--deterministic", "--release", "9.0.0"]
    )
    assert checked.exit_code == 2 and "tiny (9.0.0)" in checked.stderr


def test_validate_and_list(runner: CliRunner, tmp_path: Path) -> None:
    path = spec(tmp_path, CASE, {**CASE, "name": "gqa", "num_kv_heads": 1})
    result = runner.invoke(main, ["validate", path])
    assert result.exit_code == 0 and result.stdout.splitlines()[:2] == [
        "2 cases OK (0 negative) in 1 spec path",
        "operator release: master (2 cases), from the specs' release: (default master)",
    ]
    assert result.stdout.splitlines()[2] == (  # D 32, a 32x48 block and Sq != Skv are A2/A3-only
        "Ascend 950 (arch35): 2 valid cases outside its tiling rules, A2/A3 only (first: tiny: D = 32, not 128; "
        "block shape [32, 48] not multiples of 64; Sq 96 != Skv 80)"
    )
    assert result.stderr == ""  # head_dim 32 and GQA: the A2/A3 kernel of master accepts both
    result = runner.invoke(main, ["list", path, "--filter", "gq*"])
    assert result.exit_code == 0 and "gqa" in result.stdout and "tiny" not in result.stdout
    assert runner.invoke(main, ["list", path, "--filter", "zzz"]).stderr == "Error: --filter 'zzz' matches no case\n"
    honored = {**CASE, "name": "short", "batch": 2, "actual_seq_lengths": [96, 1], "actual_seq_lengths_kv": [80, 80]}
    result = runner.invoke(main, ["validate", spec(tmp_path, honored)])
    assert result.exit_code == 0 and "Warning: short: actual_seq_lengths" in result.stderr


def test_no_specs_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(main, ["validate"])
    assert result.exit_code == 2 and "give at least one spec file" in result.stderr


# ---- the first hour: progress in a log, folders that hold other cases (issue 16, items 2, 9, 15) ----------


def test_piped_gen_shows_progress_lines_naming_the_case_in_human_units(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from bsa_cli.cli import progress

    monkeypatch.setattr(progress, "PLAIN_PROGRESS_S", 0.0)
    big = {**CASE, "q_seq_len": 512, "kv_seq_len": 512, "block_shape": [32, 32]}
    result = runner.invoke(main, ["gen", spec(tmp_path, big), "-o", str(tmp_path / "out"), "-j", "1"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    progress = [line for line in lines if line.startswith("gen ")]
    assert progress, result.stderr
    pattern = r"gen      tiny \d+%; gen \d+% of \d[\d.]* MFLOP, ETA \d+s"
    assert all(re.fullmatch(pattern, line) for line in progress), progress
    assert lines[-1] == f"generated {tmp_path / 'out' / 'tiny'}"


def test_gen_skips_current_cases_and_says_which(runner: CliRunner, tmp_path: Path) -> None:
    path, out = spec(tmp_path, CASE, {**CASE, "name": "two"}), tmp_path / "out"
    assert runner.invoke(main, ["gen", path, "-o", str(out)]).stdout == f"generated 2 cases in {out}\n"
    before = (out / "tiny" / "case.json").stat().st_mtime_ns
    result = runner.invoke(main, ["gen", path, "-o", str(out)])
    assert result.exit_code == 0
    assert result.stdout == f"generated 0 cases in {out}; skipped 2 already current (tiny, two)\n"
    assert result.stderr == "".join(
        f"skipped {out / name} (current: same spec, precision and bsa version, inputs intact)\n"
        for name in ("tiny", "two")
    )
    assert (out / "tiny" / "case.json").stat().st_mtime_ns == before
    result = runner.invoke(main, ["gen", spec(tmp_path, {**CASE, "seed": 5}, {**CASE, "name": "two"}), "-o", str(out)])
    assert result.stdout == f"generated 1 case in {out}; skipped 1 already current (two)\n"


def test_gen_into_a_folder_holding_other_cases_says_so(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(main, ["gen", spec(tmp_path, CASE, name="a.yaml"), "-o", str(out)]).exit_code == 0
    result = runner.invoke(main, ["gen", spec(tmp_path, {**CASE, "name": "new"}, name="b.yaml"), "-o", str(out)])
    assert result.exit_code == 0
    assert result.stderr.splitlines()[0] == (
        f"Warning: {out} already holds 1 other case that these specs do not make (tiny); `bsa run {out}` and "
        f"`bsa compare {out}` take them too: write into an empty folder (-o), or remove them"
    )
    assert sorted(p.name for p in out.iterdir()) == ["new", "tiny"]


def test_the_gen_bar_on_a_terminal_names_the_case_and_counts_flops_in_human_units(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from rich.console import Console

    from bsa_cli.cli import output

    terminal = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    monkeypatch.setattr(output, "stderr", terminal)
    big = {**CASE, "q_seq_len": 512, "kv_seq_len": 512, "block_shape": [32, 32]}
    result = runner.invoke(main, ["gen", spec(tmp_path, big), "-o", str(tmp_path / "out"), "-j", "1"])
    assert result.exit_code == 0, result.output
    text = terminal.file.getvalue()
    assert "gen: tiny" in text and "MFLOP" in text and "e+" not in text
    assert f"generated {tmp_path / 'out' / 'tiny'}" in text


def test_gen_of_a_filtered_share_does_not_warn_of_the_spec_s_other_cases(runner: CliRunner, tmp_path: Path) -> None:
    path, out = spec(tmp_path, CASE, {**CASE, "name": "two"}), tmp_path / "out"
    assert runner.invoke(main, ["gen", path, "-o", str(out), "--filter", "tiny"]).exit_code == 0
    result = runner.invoke(main, ["gen", path, "-o", str(out), "--filter", "two"])
    assert result.exit_code == 0 and "Warning" not in result.stderr


def test_a_filter_matching_nothing_names_the_cases_it_may_have_meant(tmp_path):
    smoke = CASES / "smoke.yaml"
    result = invoke("list", smoke, "--filter", "smoke-bnsd-random")
    assert result.exit_code == 2
    assert "--filter 'smoke-bnsd-random*' takes smoke-bnsd-random.fp16, smoke-bnsd-random.bf16" in result.stderr
    assert "(closest: smoke-tnd-varlen)" in invoke("gen", smoke, "-o", tmp_path, "--filter", "smoke-tnd-varln").stderr


def test_validate_warns_of_a_head_dim_beyond_torch_npu_and_the_forward(tmp_path):
    spec = tmp_path / "d.yaml"
    case = {**CASE, "block_shape": [32, 32]}
    spec.write_text(
        yaml.safe_dump(
            {"cases": [{**case, "name": "d512", "head_dim": 512}, {**case, "name": "d128", "head_dim": 128}]}
        )
    )
    result = invoke("validate", spec)
    assert result.exit_code == 0, result.output
    assert "1 valid case beyond the D torch_npu and the forward take, for a --binary alone" in result.stderr
    assert "(first: d512: D = 512: torch_npu takes D <= 128, the forward D 64 or 128)" in result.stderr
