"""compare judges op folders: the forward's out and lse on the rows it writes, rows-written, the pair's
causes and expected verdict, SKIP (docs/compare.md, "The forward and the pair")."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import compare, golden
from bsa_cli.compare import FAIL, PASS, SKIP
from bsa_cli.compare.forward import LSE_FLOOR
from bsa_cli.core.case import numpy_dtype
from bsa_cli.store import array_bytes, load_manifest
from bsa_cli.store.manifest import GRAD_NAMES
from tests.helpers import build_judged_op_folder, case_factory, check

make = case_factory(head_dim=64, q_seq_len=96, kv_seq_len=80, block_shape=(32, 16), scale=None)


def mask_with_empty_rows(case, seed: int = 3) -> np.ndarray:
    """A random mask whose block row 1 of head 0 selects nothing (rows the forward leaves unwritten)."""
    mask = (np.random.default_rng(seed).random(case.mask_shape) < 0.6).astype(np.uint8)
    mask[:, 0, 1, :] = 0
    mask[:, 1, 0, 0] = 1
    return mask


def judge(case_dir: Path) -> compare.CaseResult:
    return compare.compare_case(case_dir, workers=1)


def read(case_dir: Path, name: str) -> np.ndarray:
    entry = load_manifest(case_dir).outputs[name]
    assert entry is not None
    raw = np.fromfile(case_dir / "outputs" / entry["file"], dtype=numpy_dtype(entry["dtype"]))
    return raw.reshape(entry["shape"])


def rewrite(case_dir: Path, name: str, array: np.ndarray) -> None:
    (case_dir / "outputs" / f"{name}.bin").write_bytes(array_bytes(array))


def written(case_dir: Path) -> np.ndarray:
    manifest = load_manifest(case_dir)
    mask = np.fromfile(case_dir / manifest.inputs["block_sparse_mask"]["file"], dtype=np.uint8)
    return golden.written_rows(manifest.case, mask.reshape(manifest.case.mask_shape))


# ---- clean outputs pass ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"dtype": "bfloat16"},
        {"inner_precise": 1},
        {"layout": "TND", "batch": 2, "actual_seq_lengths": (40, 96), "actual_seq_lengths_kv": (80, 30)},
        {"actual_seq_lengths": (70,), "actual_seq_lengths_kv": (50,)},
    ],
    ids=["fp16", "bf16", "inner-precise-1", "tnd", "bnsd-lengths"],
)
@pytest.mark.parametrize("device", ["reference", "benchmark"])
def test_a_clean_forward_passes_judged_on_out_and_lse(tmp_path: Path, fields: dict, device: str) -> None:
    case = make("fwd", **fields)
    case_dir = build_judged_op_folder(tmp_path, case, "forward", mask_with_empty_rows(case), device=device)
    result = judge(case_dir)
    assert result.verdict == PASS, result.message
    assert result.op == "forward" and result.case_name == "fwd" and result.name == "fwd@forward"
    assert [t.name for t in result.tensors] == ["out", "lse"]
    rows = check(result, "rows-written", "out")
    assert rows.passed and "rows the forward leaves alone hold the NaN prefill" in rows.detail
    lse = check(result, "lse_max_ratio", "lse")
    floor = LSE_FLOOR[fields.get("inner_precise", 0)]
    assert f"floor {compare.results._fmt(floor)}" in lse.detail
    assert ("fp16 lse (innerPrecise 1)" in lse.detail) == (fields.get("inner_precise") == 1)
    out = next(t for t in result.tensors if t.name == "out")
    assert out.device.count == int(written(case_dir).sum()) * case.head_dim  # only the written rows


def test_a_forward_without_prefill_does_not_check_rows_left_alone(tmp_path: Path) -> None:
    case = make("fwd")
    case_dir = build_judged_op_folder(
        tmp_path, case, "forward", mask_with_empty_rows(case), device="benchmark", prefilled=False
    )
    result = judge(case_dir)
    assert result.verdict == PASS, result.message
    assert "not checked (run.json records no NaN prefill)" in check(result, "rows-written", "out").detail


# ---- planted faults fail with the right check -------------------------------------------------------


@pytest.fixture
def clean_forward(tmp_path: Path) -> Path:
    case = make("fwd")
    return build_judged_op_folder(tmp_path, case, "forward", mask_with_empty_rows(case))


def test_out_perturbed_on_one_row_fails_out(clean_forward: Path) -> None:
    out = read(clean_forward, "out").copy()
    b, n, s = np.argwhere(written(clean_forward))[5]
    out[b, n, s] = (out[b, n, s].astype(np.float32) * 1.5 + 0.01).astype(out.dtype)
    rewrite(clean_forward, "out", out)
    result = judge(clean_forward)
    assert result.verdict == FAIL
    failed = {(c.name, c.tensor) for c in result.all_checks if not c.passed}
    assert ("mare_ratio", "out") in failed and not any(t == "lse" for _, t in failed)
    worst = next(t for t in result.tensors if t.name == "out").worst[0]
    assert (worst.coords["b"], worst.coords["n"], worst.coords["s"]) == (b, n, s)
    assert result.diagnosis[0].kind == "tile-local", result.diagnosis  # one row: one 128-row piece's error


def test_lse_off_by_a_constant_fails_lse(clean_forward: Path) -> None:
    lse = read(clean_forward, "lse").copy()
    lse += np.float32(0.01)  # the prefill stays NaN
    rewrite(clean_forward, "lse", lse)
    result = judge(clean_forward)
    assert result.verdict == FAIL
    failed = {(c.name, c.tensor) for c in result.all_checks if not c.passed}
    assert ("lse_max_ratio", "lse") in failed and ("lse_rmse_ratio", "lse") in failed
    assert not any(t == "out" for _, t in failed)
    assert "floor 6.104e-05: fp32 lse (innerPrecise 0)" in check(result, "lse_max_ratio", "lse").detail


def test_lse_left_unwritten_fails_rows_written(tmp_path: Path) -> None:
    case = make("fwd")
    case_dir = build_judged_op_folder(tmp_path, case, "forward", mask_with_empty_rows(case), fault="lse-not-written")
    result = judge(case_dir)
    assert result.verdict == FAIL
    rows = check(result, "rows-written", "lse")
    assert not rows.passed and "rows the forward must write hold NaN/Inf" in rows.detail
    assert not check(result, "nonfinite", "lse").passed
    assert result.deciding == rows and result.headline.startswith(
        "lse rows-written: 160 of 160 rows the forward must write"
    )
    assert check(result, "rows-written", "out").passed


def test_a_row_written_that_must_not_be_fails_rows_written(clean_forward: Path) -> None:
    out = read(clean_forward, "out").copy()
    b, n, s = np.argwhere(~written(clean_forward))[0]
    out[b, n, s] = 0
    rewrite(clean_forward, "out", out)
    result = judge(clean_forward)
    assert result.verdict == FAIL
    rows = check(result, "rows-written", "out")
    assert "1 of" in rows.detail and "must leave alone were written (not the NaN prefill)" in rows.detail
    assert f"first at b={b} n={n} s={s}" in rows.detail
    assert [c.name for c in result.all_checks if not c.passed] == ["rows-written"]  # the metrics never see it


def test_a_written_row_left_nan_fails_rows_written(clean_forward: Path) -> None:
    out = read(clean_forward, "out").copy()
    b, n, s = np.argwhere(written(clean_forward))[-1]
    out[b, n, s] = np.nan
    rewrite(clean_forward, "out", out)
    result = judge(clean_forward)
    rows = check(result, "rows-written", "out")
    assert result.verdict == FAIL and not rows.passed
    assert f"1 of {int(written(clean_forward).sum())} rows the forward must write hold NaN/Inf" in rows.detail


def test_softmax_lse_flag_0_leaves_lse_unjudged_but_checks_it_unwritten(tmp_path: Path) -> None:
    case = make("fwd", softmax_lse_flag=0)
    case_dir = build_judged_op_folder(tmp_path, case, "forward", mask_with_empty_rows(case))
    result = judge(case_dir)
    assert result.verdict == PASS, result.message
    assert [t.name for t in result.tensors] == ["out"]
    assert any("lse not judged: softmax_lse_flag 0" in note for note in result.notes)
    assert "all 192 rows hold the NaN prefill" in check(result, "rows-written", "lse").detail
    lse = read(case_dir, "lse").copy()
    lse.reshape(-1)[7] = 1.0  # a forward that wrote lse although the flag says not to
    rewrite(case_dir, "lse", lse)
    result = judge(case_dir)
    assert result.verdict == FAIL
    assert "softmax_lse_flag 0: lse must stay unwritten" in check(result, "rows-written", "lse").detail


# ---- the chain ---------------------------------------------------------------------------------------


def test_a_clean_chain_passes_on_all_five_tensors(tmp_path: Path) -> None:
    case = make("pair")
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case)))
    assert result.verdict == PASS, result.message
    assert result.op == "chain"
    assert [t.name for t in result.tensors] == ["out", "lse", *GRAD_NAMES]


def test_a_chain_with_a_wrong_dq_fails_dq(tmp_path: Path) -> None:
    case = make("pair")
    case_dir = build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case))
    dq = read(case_dir, "dq").copy()
    dq[0, 1, 3] = (dq[0, 1, 3].astype(np.float32) * 2 + 0.05).astype(dq.dtype)
    rewrite(case_dir, "dq", dq)
    result = judge(case_dir)
    assert result.verdict == FAIL
    failed = {c.tensor for c in result.all_checks if not c.passed}
    assert failed == {"dq"}
    assert not any(c.name in ("lse-unwritten", "padding-rows-read") for c in result.checks)


def test_a_chain_with_lse_flag_0_fails_naming_lse_unwritten(tmp_path: Path) -> None:
    case = make("pair", softmax_lse_flag=0)
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case)))
    assert result.verdict == FAIL
    assert result.deciding is not None and result.deciding.name == "lse-unwritten"
    assert result.message.startswith("lse-unwritten: the backward read softmaxLse that the forward never wrote")
    assert result.diagnosis[0].kind == "lse-unwritten"


def test_a_chain_whose_forward_left_lse_unwritten_names_lse_unwritten(tmp_path: Path) -> None:
    case = make("pair")
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case), fault="lse-not-written"))
    assert result.verdict == FAIL
    assert result.message.startswith(
        "lse-unwritten: the backward read softmaxLse that the forward did not write although softmax_lse_flag is 1"
    )


def test_a_chain_reading_padding_rows_fails_naming_them(tmp_path: Path) -> None:
    case = make("pair", actual_seq_lengths=(70,), actual_seq_lengths_kv=(80,), bnsd_lengths="ignored")
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case)))
    assert result.verdict == FAIL
    assert result.deciding is not None and result.deciding.name == "padding-rows-read"
    assert "read 26 query padding rows past the actual lengths [70] of S 96" in result.message


def test_a_chain_reading_kv_padding_names_padding_rows_read(tmp_path: Path) -> None:
    case = make("pair", actual_seq_lengths=(96,), actual_seq_lengths_kv=(50,), bnsd_lengths="ignored")
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case)))
    assert result.verdict == FAIL
    assert result.deciding is not None and result.deciding.name == "padding-rows-read", result.message
    assert "read 30 key/value padding positions past the actual kv lengths [50] of S 80" in result.message


def test_a_chain_that_must_fail_passes_when_it_fails_for_its_cause(tmp_path: Path) -> None:
    case = make("pair", softmax_lse_flag=0)
    expect = {"verdict": "FAIL", "cause": "lse-unwritten"}
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case), expect=expect))
    assert result.verdict == PASS
    assert result.message.startswith("fails as it must: lse-unwritten: ")
    assert result.expected_failure == result.message and result.message in result.headline


def test_the_expected_cause_leads_the_message_when_two_causes_apply(tmp_path: Path) -> None:
    case = make(
        "pair", softmax_lse_flag=0, actual_seq_lengths=(70,), actual_seq_lengths_kv=(80,), bnsd_lengths="ignored"
    )
    for cause in ("padding-rows-read", "lse-unwritten"):
        expect = {"verdict": "FAIL", "cause": cause}
        result = judge(build_judged_op_folder(tmp_path / cause, case, "chain", expect=expect))
        assert result.verdict == PASS
        assert result.message.startswith(f"fails as it must: {cause}: ")
        assert [c.kind for c in result.diagnosis[:2]] == sorted(
            ("lse-unwritten", "padding-rows-read"), key=lambda kind: kind != cause
        )


def test_a_chain_that_must_fail_fails_when_it_fails_for_another_cause(tmp_path: Path) -> None:
    case = make("pair", softmax_lse_flag=0)
    expect = {"verdict": "FAIL", "cause": "padding-rows-read"}
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case), expect=expect))
    assert result.verdict == FAIL
    assert check(result, "expected-verdict").detail.startswith("fails, but for lse-unwritten, not padding-rows-read")


def test_a_chain_that_must_fail_fails_when_it_passes(tmp_path: Path) -> None:
    case = make("pair")
    expect = {"verdict": "FAIL", "cause": "lse-unwritten"}
    result = judge(build_judged_op_folder(tmp_path, case, "chain", mask_with_empty_rows(case), expect=expect))
    assert result.verdict == FAIL
    assert result.headline == "passes, but must fail naming lse-unwritten (expect.verdict FAIL)"


# ---- SKIP --------------------------------------------------------------------------------------------


def test_a_folder_gen_skipped_is_skip_with_its_reason(tmp_path: Path) -> None:
    reason = "the A2/A3 forward refuses block_shape [32, 16]: Y % 128 != 0 (tiling, 561002); the backward accepts it"
    case_dir = build_judged_op_folder(tmp_path, make("c"), "forward", skip=reason)
    result = judge(case_dir)
    assert (result.verdict, result.op, result.errors, result.headline) == (SKIP, "forward", (reason,), reason)
    assert compare.SuiteResult((result,)).return_code == 0


def test_a_run_the_device_skipped_is_skip_with_its_reason(tmp_path: Path) -> None:
    case_dir = build_judged_op_folder(tmp_path, make("c"), "chain")
    outputs = case_dir / "outputs"
    for file in outputs.iterdir():
        file.unlink()
    reason = "the reference device cannot run autograd (only torch_npu does)"
    record = {"case": "c@chain", "outcome": "skipped", "skipped": reason, "device": {"name": "reference"}}
    (outputs / "run.json").write_text(json.dumps(record))
    result = judge(case_dir)
    assert (result.verdict, result.op, result.message) == (SKIP, "chain", reason)


# ---- the benchmark summary -----------------------------------------------------------------------------


def test_a_summary_of_the_forward_benchmark_gives_the_same_verdict_and_figures(clean_forward: Path) -> None:
    out = read(clean_forward, "out").copy()
    b, n, s = np.argwhere(written(clean_forward))[2]
    out[b, n, s] = (out[b, n, s].astype(np.float32) + 0.02).astype(out.dtype)
    rewrite(clean_forward, "out", out)
    before = judge(clean_forward)
    manifest = load_manifest(clean_forward)
    case, settings = manifest.case, compare.resolve_settings(manifest.case.dtype, None, compare.RunSettings())
    arrays = {}
    for section in ("golden", "benchmark"):
        arrays[section] = {
            name: np.fromfile(clean_forward / e["file"], dtype=numpy_dtype(e["dtype"])).reshape(e["shape"])
            for name, e in manifest.entries(section)
        }
    mask = np.fromfile(clean_forward / manifest.inputs["block_sparse_mask"]["file"], dtype=np.int8)
    summary = compare.summarize_benchmark(
        case, settings, arrays["golden"], arrays["benchmark"], mask.reshape(case.mask_shape)
    )
    assert set(summary.stats) == {"out"}
    with pytest.raises(ValueError, match="needs the block mask"):
        compare.summarize_benchmark(case, settings, arrays["golden"], arrays["benchmark"])
    out_before = next(t for t in before.tensors if t.name == "out")
    assert out_before.benchmark == summary.stats["out"]


def write_summary(case_dir: Path) -> set[str]:
    """Measure the folder's benchmark as gen would (`summarize_benchmark`) and store it in its case.json."""
    manifest = load_manifest(case_dir)
    case = manifest.case
    arrays = {}
    for section in ("golden", "benchmark"):
        arrays[section] = {
            name: np.fromfile(case_dir / e["file"], dtype=numpy_dtype(e["dtype"])).reshape(e["shape"])
            for name, e in manifest.entries(section)
        }
    entry = manifest.inputs["block_sparse_mask"]
    mask = np.fromfile(case_dir / entry["file"], dtype=numpy_dtype(entry["dtype"])).reshape(case.mask_shape)
    summary = compare.summarize_benchmark(
        case, compare.case_settings(case), arrays["golden"], arrays["benchmark"], mask
    )
    document = compare.summary_document(summary)
    document["tiles"] = {}
    for name, tiles in summary.tiles.items():
        data = array_bytes(tiles)
        (case_dir / f"benchmark/{name}.tiles.bin").write_bytes(data)
        document["tiles"][name] = {
            "file": f"benchmark/{name}.tiles.bin",
            "dtype": "float32",
            "shape": list(tiles.shape),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    raw = json.loads((case_dir / "case.json").read_text())
    raw["benchmark_summary"] = document
    (case_dir / "case.json").write_text(json.dumps(raw))
    return set(summary.stats)


@pytest.mark.parametrize("op", ["forward", "chain"])
def test_an_op_folder_judged_with_its_summary_gives_the_same_figures(tmp_path: Path, op: str) -> None:
    case = make("c")
    case_dir = build_judged_op_folder(tmp_path, case, op, mask_with_empty_rows(case))
    out = read(case_dir, "out").copy()
    b, n, s = np.argwhere(written(case_dir))[4]
    out[b, n, s] = (out[b, n, s].astype(np.float32) + 0.03).astype(out.dtype)
    rewrite(case_dir, "out", out)
    without = judge(case_dir)
    assert write_summary(case_dir) == ({"out"} if op == "forward" else {"out", *GRAD_NAMES})
    with_summary = judge(case_dir)
    assert with_summary.verdict == without.verdict == FAIL
    assert [(c.name, c.tensor, c.value, c.detail) for c in with_summary.all_checks] == [
        (c.name, c.tensor, c.value, c.detail) for c in without.all_checks
    ]
    assert [t.benchmark for t in with_summary.tensors] == [t.benchmark for t in without.tensors]


def test_a_summary_without_out_makes_a_forward_folder_an_error(tmp_path: Path) -> None:
    case_dir = build_judged_op_folder(tmp_path, make("c"), "chain")
    write_summary(case_dir)
    raw = json.loads((case_dir / "case.json").read_text())
    del raw["benchmark_summary"]["stats"]["out"], raw["benchmark_summary"]["tiles"]["out"]
    (case_dir / "case.json").write_text(json.dumps(raw))
    result = judge(case_dir)
    assert result.verdict == compare.ERROR
    assert "benchmark_summary: no stats of out" in result.errors[0]


def test_fragmented_written_rows_are_measured_exactly_on_those_rows(tmp_path: Path) -> None:
    """TND interleaves heads, so the written rows of a head whose block row selects nothing split the
    tensor's rows into many short ranges: measured gathered (`metrics._items`), with the same figures."""
    case = make(
        "tnd",
        layout="TND",
        batch=2,
        num_heads=4,
        num_kv_heads=2,
        actual_seq_lengths=(96, 64),
        actual_seq_lengths_kv=(80, 48),
        q_seq_len=96,
        kv_seq_len=80,
    )
    mask = (np.random.default_rng(7).random(case.mask_shape) < 0.15).astype(np.uint8)
    case_dir = build_judged_op_folder(tmp_path, case, "forward", mask, device="benchmark")
    out = read(case_dir, "out").copy()
    rows = written(case_dir)
    noisy = np.random.default_rng(1).standard_normal(out.shape) * 1e-3
    out[rows] = (out[rows].astype(np.float32) + noisy[rows]).astype(out.dtype)
    rewrite(case_dir, "out", out)
    geom = compare.geometry.only_rows(compare.geometry._geometry(load_manifest(case_dir).case, "out"), rows)
    assert len(geom.judged) > 10 and compare.metrics._items(geom)[0].dtype == np.intp  # gathered
    judged = next(t for t in judge(case_dir).tensors if t.name == "out")
    gold = np.fromfile(case_dir / "golden/out.bin", dtype=np.float32).reshape(out.shape)
    error = (out.astype(np.float64) - gold)[rows]
    assert judged.device.count == error.size
    assert judged.device.max_abs_err == pytest.approx(np.abs(error).max(), rel=1e-6)
    assert judged.device.rmse == pytest.approx(np.sqrt((error**2).mean()), rel=1e-5)
    worst = judged.worst[0].coords
    assert rows[worst["t"], worst["n"]]
