"""`bsa export` of op folders in every format, TTK's format, and an export that is whole or nothing:
refused ops and broken cases before any write, links in the target replaced (never written through),
case names that collide once sanitized."""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from bsa_cli.report.export import distinct_names
from bsa_cli.report.ttk import case_directory
from bsa_cli.store import load_manifest, read_array
from tests.helpers import invoke

FORMATS = ("msopst", "atk", "ttk")

#: TTK's replay file names (hicann/ops-test-kit ttk/core_modules/manual_data.py 055fae80, `_DATA_FILE_NAME`),
#: copied here as the reader the export must satisfy.
TTK_FILE = re.compile(
    r"^(input|scalar|golden)_(0|[1-9][0-9]*)_([A-Za-z0-9][A-Za-z0-9_.-]*?)"
    r"(?:__shape_(scalar|[0-9]+(?:x[0-9]+)*))?\.(bin|pt|npy)$"
)

BASE = {"layout": "BNSD", "dtype": "fp16", "batch": 1, "num_heads": 1, "q_seq_len": 128, "head_dim": 64}
#: Three names that are one identifier once sanitized, each judged by another standard; forward-sized.
SPEC = {
    "defaults": {**BASE, "block_shape": [64, 128], "sparsity": {"pattern": "dense"}},
    "cases": [
        {"name": "a-b", "seed": 1},
        {"name": "a.b", "seed": 2, "compare": {"standard": "single"}},
        {"name": "a_b", "seed": 3, "compare": {"standard": "allclose", "thresholds": {"mismatch": 0.01}}},
        {"name": "neg", "dtype": "float32", "expect": "ACLNN_ERR_PARAM_INVALID"},
    ],
}


@pytest.fixture(scope="module")
def out(generated_spec) -> Path:
    return generated_spec(SPEC, "--ops", "forward,backward,chain")


def export(out: Path, fmt: str, target: Path, *options: str):
    return invoke("export", out, "--format", fmt, "-o", target, *options)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_chain_folder_is_refused_before_anything_is_written(out, tmp_path, fmt):
    fresh = export(out, fmt, tmp_path / "new")
    assert (
        fresh.exit_code == 2 and "cannot export op chain" in fresh.stderr and "--ops forward,backward" in fresh.stderr
    )
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep.txt").write_text("earlier")
    assert export(out, fmt, tmp_path / "old").exit_code == 2
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_broken_case_leaves_no_half_export(out, tmp_path, fmt):
    copy = tmp_path / "cases"
    for name in ("a-b", "a-b@forward", "a.b", "a_b"):
        (copy / name).mkdir(parents=True)
        for path in (out / name).rglob("*"):
            if path.is_file():
                (copy / name / path.relative_to(out / name)).parent.mkdir(parents=True, exist_ok=True)
                (copy / name / path.relative_to(out / name)).write_bytes(path.read_bytes())
    (copy / "a_b" / "case.json").write_text("{")  # the last case in order: the others are made first
    result = export(copy, fmt, tmp_path / "x")
    assert result.exit_code == 2 and "a_b" in result.stderr
    assert not (tmp_path / "x").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cases"]


def test_forward_and_backward_folders_export_as_their_own_calls(out, tmp_path):
    assert export(out, "msopst", tmp_path / "st", "--ops", "forward,backward").exit_code == 0
    ((forward,),) = [json.loads((tmp_path / "st" / "a-b@forward.msopst.json").read_text())]
    assert forward["op"] == "BlockSparseAttention"
    assert [d["name"] for d in forward["input_desc"]] == ["query", "key", "value", "blockSparseMask"]
    assert forward["input_desc"][3]["type"] == ["int8"]
    assert [d["name"] for d in forward["output_desc"]] == ["attentionOut", "softmaxLse"]
    attrs = {a["name"]: a["value"] for a in forward["attr"]}
    assert attrs["innerPrecise"] == 0 and attrs["softmaxLseFlag"] == 1 and attrs["actualSeqLengths"] is None
    module_path, function = forward["calc_expect_func_file"].rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("expect", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    manifest = load_manifest(out / "a-b@forward")
    golden = dict(manifest.entries("golden"))
    expected = [read_array(out / "a-b@forward", golden[name]) for name in ("out", "lse")]
    returned = getattr(module, function)()
    assert returned[0].dtype == np.float16 and returned[1].dtype == np.float32
    np.testing.assert_array_equal(returned[0], expected[0].astype(np.float16))
    np.testing.assert_array_equal(returned[1], expected[1])

    assert export(out, "atk", tmp_path / "atk", "--ops", "forward").exit_code == 0
    atk = json.loads((tmp_path / "atk" / "a-b@forward.atk.json").read_text())
    assert atk["aclnn_name"] == "aclnnBlockSparseAttention"
    assert [o["name"] for o in atk["outputs"]] == ["attentionOut", "softmaxLse"]
    assert Path(atk["outputs"][0]["golden_file"]) == (out / "a-b@forward" / golden["out"]["file"]).resolve()


def ttk_rows(target: Path) -> dict[str, dict[str, object]]:
    rows = {}
    for path in target.glob("bsa_ttk_*.csv"):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                cells = {
                    k: ast.literal_eval(v) if v and k not in ("testcase_name", "api_name", "remark") else v
                    for k, v in row.items()
                }
                rows[row["testcase_name"]] = {**cells, "csv": path.name}
    return rows


def test_ttk_rows_and_replay_folders_are_what_ttk_reads(out, tmp_path):
    result = export(out, "ttk", tmp_path / "ttk", "--ops", "forward,backward")
    assert result.exit_code == 0, result.output
    target = tmp_path / "ttk"
    rows = ttk_rows(target)
    assert rows["a-b"]["csv"] == "bsa_ttk_mixed.csv"  # double-benchmark: TTK has no CPU benchmark rule
    assert "cross_check" in str(rows["a-b"]["remark"])
    assert rows["a.b"]["csv"] == "bsa_ttk_stat_rel_err.csv" and rows["a_b"]["csv"] == "bsa_ttk_close.csv"
    assert rows["a_b"]["precision_tolerances"] == ((1e-3, 0.01),) * 3
    assert rows["neg"]["is_enabled"] is False
    assert "--compare close" in result.stderr and "--manual-data-dirs" in result.stderr
    for name, row in rows.items():
        manifest = load_manifest(out / name)
        backward = "@" not in name
        assert row["api_name"] == ("aclnnBlockSparseAttentionGrad" if backward else "aclnnBlockSparseAttention")
        shapes, dtypes, outputs = row["tensor_view_shapes"], row["tensor_dtypes"], row["output_tensor_indexes"]
        assert isinstance(shapes, tuple) and isinstance(dtypes, tuple) and isinstance(outputs, tuple)
        assert outputs == ((8, 9, 10) if backward else (6, 7)) and len(shapes) == len(dtypes) == outputs[-1] + 1
        folder = target / "manual_data" / case_directory(name)
        files = sorted(p.name for p in folder.iterdir())
        parsed = [TTK_FILE.fullmatch(f) for f in files]
        assert all(parsed), files
        inputs = sorted((int(m[2]), m[3], f) for m, f in zip(parsed, files, strict=True) if m and m[1] == "input")
        assert [i for i, _, _ in inputs] == list(range(outputs[0]))  # every slot but the outputs TTK allocates
        for index, dtype, file in inputs:
            assert dtype == ("none" if shapes[index] is None else dtypes[index])
            if shapes[index] is None:
                assert (folder / file).stat().st_size == 0
        entries = dict(manifest.entries("inputs"))
        first = next(f for i, _, f in inputs if i == 1)  # query (the backward's 0 is dout)
        np.testing.assert_array_equal(
            np.fromfile(folder / first, dtype=np.uint8),
            read_array(out / name, entries["query" if backward else "key"]).view(np.uint8).ravel(),
        )
        goldens = [m for m in parsed if m and m[1] == "golden"]
        assert len(goldens) == len(outputs)
        if manifest.is_negative:
            assert all(m[3] == "none" for m in goldens)
        else:
            assert [tuple(map(int, m[4].split("x"))) for m in goldens] == [shapes[i] for i in outputs]


@pytest.mark.parametrize("fmt", FORMATS)
def test_links_named_like_the_export_are_replaced_never_written_through(out, tmp_path, fmt):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("precious")
    (outside / "folder").mkdir()
    (outside / "folder" / "kept.txt").write_text("precious too")
    target = tmp_path / "target"
    target.mkdir()
    names = {
        "msopst": ["a-b.msopst.json", "bsa_msopst_expect.py"],
        "atk": ["a-b.atk.json", "a-b@forward.atk.json"],
        "ttk": ["bsa_ttk_mixed.csv", "bsa_ttk_close.csv"],
    }[fmt]
    for name in names:
        (target / name).symlink_to(victim)
    (target / "manual_data").symlink_to(outside / "folder", target_is_directory=True)
    assert export(out, fmt, target, "--ops", "forward,backward").exit_code == 0
    assert victim.read_text() == "precious" and sorted(p.name for p in outside.iterdir()) == ["folder", "victim.txt"]
    assert [p.name for p in (outside / "folder").iterdir()] == ["kept.txt"]
    for name in names:
        assert not (target / name).is_symlink() and (target / name).is_file()
    assert (target / "manual_data").is_symlink() == (fmt != "ttk")
    assert not [p for p in target.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_names_that_collide_once_sanitized_get_distinct_names(out, tmp_path):
    assert export(out, "msopst", tmp_path / "st", "--ops", "backward").exit_code == 0
    documents = {n: json.loads((tmp_path / "st" / f"{n}.msopst.json").read_text())[0] for n in ("a-b", "a.b", "a_b")}
    case_names = {n: d["case_name"] for n, d in documents.items()}
    assert case_names["a_b"] == "a_b" and len(set(case_names.values())) == 3
    spec = importlib.util.spec_from_file_location("expect", tmp_path / "st" / "bsa_msopst_expect.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, document in documents.items():
        function = document["calc_expect_func_file"].rsplit(":", 1)[1]
        dq = getattr(module, function)()[0]
        golden = dict(load_manifest(out / name).entries("golden"))["dq"]
        np.testing.assert_array_equal(dq, read_array(out / name, golden).astype(np.float16))  # its own golden
    for fmt in ("atk", "ttk"):
        assert export(out, fmt, tmp_path / fmt, "--ops", "backward").exit_code == 0
    assert {p.name for p in (tmp_path / "atk").glob("a*.atk.json")} == {"a-b.atk.json", "a.b.atk.json", "a_b.atk.json"}
    assert len([p for p in (tmp_path / "ttk" / "manual_data").iterdir() if p.name.startswith("a")]) == 3


def test_distinct_names_refuses_what_it_cannot_tell_apart():
    found = distinct_names(["a-b", "a.b", "a_b", "c"])
    assert found["a_b"] == "a_b" and found["c"] == "c" and len(set(found.values())) == 4
    with pytest.raises(ValueError, match="one name once sanitized"):
        distinct_names(["a-b", "a_b", found["a-b"]])


def test_a_folder_gen_skipped_is_left_out_and_said(generated_spec, tmp_path):
    skipped = generated_spec({"cases": [{**BASE, "name": "y64", "block_shape": [64, 64]}]}, "--ops", "forward,backward")
    assert load_manifest(skipped / "y64@forward").skip is not None  # the A2/A3 forward refuses Y = 64
    result = export(skipped, "atk", tmp_path / "atk")
    assert result.exit_code == 0, result.output
    assert "y64@forward: not exported, gen skipped it" in result.stderr
    assert [p.name for p in (tmp_path / "atk").iterdir()] == ["y64.atk.json"]
    assert result.stdout.startswith("exported 1 case as atk")
