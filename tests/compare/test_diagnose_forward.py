"""The forward's diagnosis (compare/diagnose/forward_diagnosis.py) and the pair's: every forward fault
the reference device plants names its true kind first on the forward and chain folders it applies to,
faults planted in the output arrays name theirs, clean outputs get none, a chain's gradient error carried
from its forward is laid to the forward, and padding-rows-read is named only where it explains the error
(docs/compare.md, "The forward and the pair")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import compare, golden
from bsa_cli.compare.diagnose.forward_diagnosis import FORWARD_KINDS
from bsa_cli.compare.results import DIAGNOSIS_KINDS
from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.devices import faults, reference
from bsa_cli.devices import forward as device_forward
from bsa_cli.devices.config import RunOptions
from bsa_cli.devices.forward import prefilled
from bsa_cli.devices.reference import ReferenceDevice
from bsa_cli.devices.run import run_case
from bsa_cli.gen.generate import generate_case_ops
from bsa_cli.gen.settings import GenSettings
from bsa_cli.specs import load_specs
from bsa_cli.store import array_bytes, load_manifest, read_array
from tests.helpers import CASES, build_judged_op_folder, case_factory

TRUE_KIND = {
    "lse-not-written": "not-written",
    "rescale-skipped": "softmax-lse",
    "stack-off-by-one": "block-selection",
    "forward-mask-transposed": "block-selection",
    "forward-block-shift": "block-selection",
    "forward-drop-tail-block": "tail-block",
    "forward-heads-interleaved": "gqa-head-mapping",
    "forward-no-scale": "scale",
    "forward-lse-base2": "softmax-lse",
    "forward-rows-swapped": "rows-permuted",
    "forward-tile-noise": "tile-local",
}
"""The kind each forward fault of the reference device is (docs/compare.md, "The forward and the pair").
On a chain, lse-not-written is the pair's `lse-unwritten` (its causes lead), the others the forward's kind."""

CHAIN_KIND = {**TRUE_KIND, "lse-not-written": "lse-unwritten"}


def test_every_forward_fault_has_a_true_kind_the_forward_can_name():
    assert set(TRUE_KIND) == set(faults.FORWARD_FAULTS)
    assert set(TRUE_KIND.values()) <= set(FORWARD_KINDS) <= set(DIAGNOSIS_KINDS)


def _folders(tmp_path: Path, suite: str, ops: tuple[str, ...]) -> list[Path]:
    """A suite's cases as `ops` folders (as `bsa gen --ops`), the skipped ones left out."""
    folders = []
    for case in load_specs([CASES / f"{suite}.yaml"]):
        if case.expect.ok:
            folders += generate_case_ops(dataclasses.replace(case, ops=ops), tmp_path / "cases", GenSettings(ops=ops))  # type: ignore[arg-type]
    return [d for d in folders if load_manifest(d).skip is None]


def _run(case_dir: Path, root: Path, fault: str | None) -> compare.CaseResult:
    """Run the reference device on a folder (run.json records the NaN prefill) and judge it."""
    outputs = root / str(fault)
    run_case(case_dir, RunOptions(device=ReferenceDevice.create(fault), outputs_root=outputs, seed=3))
    return compare.compare_case(case_dir, outputs / case_dir.name, workers=1)


def _named(result: compare.CaseResult, kind: str) -> bool:
    """Whether the diagnosis names `kind` first, or names first a kind whose hypothesis reads the same mask here."""
    if not result.diagnosis:
        return False
    if result.diagnosis[0].kind == kind:
        return True
    told = [h for h in result.hypotheses if h.kind == kind and "not told apart from" in h.outcome]
    return any(h.outcome.split("'")[1] in result.diagnosis[0].evidence for h in told)


def _confusion(tmp_path: Path, suite: str, ops: tuple[str, ...]) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Every applicable forward fault on every folder: (fault, top kind) -> count, and the misses."""
    table: dict[tuple[str, str], int] = {}
    missed = []
    for case_dir in _folders(tmp_path, suite, ops):
        manifest = load_manifest(case_dir)
        if manifest.case.expect.verdict == "FAIL":  # a pitfall case: its expected pair cause leads by design
            continue
        mask = read_array(case_dir, manifest.inputs["block_sparse_mask"])
        for fault in TRUE_KIND:
            if not faults.fault_applies(fault, manifest.case, mask, manifest.op):
                continue
            result = _run(case_dir, tmp_path / "out", fault)
            kind = CHAIN_KIND[fault] if manifest.op == "chain" else TRUE_KIND[fault]
            top = result.diagnosis[0].kind if result.diagnosis else "-"
            table[(fault, top)] = table.get((fault, top), 0) + 1
            if result.verdict != compare.FAIL or not _named(result, kind):
                missed.append(
                    f"{case_dir.name} {fault}: {result.verdict} {[(c.kind, c.score) for c in result.diagnosis]}"
                )
    return table, missed


def test_chain_suite_every_forward_fault_names_its_true_kind_on_forward_and_chain(tmp_path):
    table, missed = _confusion(tmp_path, "chain", ("forward", "chain"))
    assert missed == []
    absent = {"rescale-skipped", "stack-off-by-one", "forward-drop-tail-block"}  # rows of <= 512 columns, no kv tail
    assert {fault for fault, _ in table} == set(TRUE_KIND) - absent


def test_smoke_suite_run_as_forward_names_every_applicable_fault(tmp_path):
    table, missed = _confusion(tmp_path, "smoke", ("forward",))
    assert missed == [] and table


@pytest.mark.slow  # about 25 s: 20 cases, forward and chain, 11 faults
def test_forward_edge_suite_every_forward_fault_names_its_true_kind(tmp_path):
    table, missed = _confusion(tmp_path, "forward-edge", ("forward", "chain"))
    assert missed == []
    assert {fault for fault, _ in table} == set(TRUE_KIND)


def test_clean_forward_and_chain_outputs_get_no_diagnosis(tmp_path):
    for case_dir in _folders(tmp_path, "chain", ("forward", "chain")):
        result = _run(case_dir, tmp_path / "out", None)
        assert result.verdict == compare.PASS, result.message
        if load_manifest(case_dir).case.expect.verdict != "FAIL":
            assert result.diagnosis == () and result.hypotheses == ()


# ---- faults planted in the output arrays --------------------------------------------------------------------

make = case_factory(
    num_heads=4, num_kv_heads=2, head_dim=64, q_seq_len=384, kv_seq_len=600, block_shape=(128, 128), scale=None
)


def _mask(case: Case, seed: int = 2) -> np.ndarray:
    """A random asymmetric mask, every query block row selecting at least one kv block."""
    mask = (np.random.default_rng(seed).random(case.mask_shape) < 0.55).astype(np.uint8)
    mask[..., 0] = 1
    mask[..., -1] = 1  # the partial tail block selected everywhere
    mask[:, :, 0, 1] = 0
    return mask


def _inputs(case_dir: Path) -> dict[str, np.ndarray]:
    manifest = load_manifest(case_dir)
    return {n: read_array(case_dir, e) for n, e in manifest.entries("inputs")}


def _device_forward(case: Case, inputs: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """The kernel-faithful forward (`golden.forward_kernel`) of a misread mask, as a device writes it: rows the
    reading selects nothing for left at the NaN prefill."""
    out, lse = golden.forward_kernel(case, inputs["query"], inputs["key"], inputs["value"], mask)
    left = ~golden.written_rows(case, mask)
    out[left] = prefilled((1,), case.dtype)[0]
    lse[left] = np.float32(np.nan)
    return {"out": out, "lse": lse}


def _read(case_dir: Path) -> dict[str, np.ndarray]:
    manifest = load_manifest(case_dir)
    found = {}
    for name in ("out", "lse"):
        entry = manifest.outputs[name]
        raw = np.fromfile(case_dir / "outputs" / entry["file"], dtype=numpy_dtype(entry["dtype"]))
        found[name] = raw.reshape(entry["shape"]).copy()
    return found


def _write(case_dir: Path, arrays: dict[str, np.ndarray], case: Case) -> None:
    for name, array in arrays.items():
        shaped = array.reshape(case.lse_shape_dims) if name == "lse" else array
        (case_dir / "outputs" / f"{name}.bin").write_bytes(array_bytes(np.ascontiguousarray(shaped)))


def _transposed(case, inputs, outputs):
    mask = np.asarray(inputs["block_sparse_mask"]) != 0
    read = np.zeros_like(mask)
    n_q, n_kv = mask.shape[2:]
    rows, cols = min(n_q, n_kv), min(n_q, n_kv)
    read[:, :, :rows, :cols] = mask[:, :, :cols, :rows].transpose(0, 1, 3, 2)
    return _device_forward(case, inputs, read.astype(np.uint8))


def _kv_shifted(case, inputs, outputs):
    mask = np.asarray(inputs["block_sparse_mask"]).copy()
    mask[..., 1:] = mask[..., :-1].copy()
    return _device_forward(case, inputs, mask)


def _no_scale(case, inputs, outputs):
    return _device_forward(dataclasses.replace(case, scale=1.0), inputs, np.asarray(inputs["block_sparse_mask"]))


def _scale_twice(case, inputs, outputs):
    twice = dataclasses.replace(case, scale=case.kernel_scale**2)
    return _device_forward(twice, inputs, np.asarray(inputs["block_sparse_mask"]))


def _lse_base2(case, inputs, outputs):
    return {"lse": outputs["lse"] * np.float32(np.log2(np.e))}


def _lse_without_max(case, inputs, outputs):
    out, lse = golden.forward_kernel(
        case, inputs["query"], inputs["key"], inputs["value"], np.asarray(inputs["block_sparse_mask"])
    )
    q = inputs["query"].astype(np.float64)
    k = inputs["key"].astype(np.float64)
    mask = np.repeat(np.repeat(np.asarray(inputs["block_sparse_mask"]) != 0, 128, axis=2), 128, axis=3)
    mask = mask[:, :, : case.q_seq_len, : case.kv_seq_len]
    kv = np.repeat(k, case.group_size, axis=1)
    scores = np.where(mask, case.kernel_scale * q @ kv.transpose(0, 1, 3, 2), -np.inf)
    return {"lse": (lse - scores.max(axis=3)).astype(np.float32)}


def _rows_swapped(case, inputs, outputs):
    out = outputs["out"].copy()
    out[0, 1, [10, 300]] = out[0, 1, [300, 10]]
    out[0, 2, [5, 6]] = out[0, 2, [6, 5]]
    return {"out": out}


def _tile_noise(case, inputs, outputs):
    out = outputs["out"].copy()
    tile = out[0, 3, 144:160, 16:32].astype(np.float32)
    noise = np.random.default_rng(1).standard_normal(tile.shape) * 0.05 * float(np.abs(tile).mean())
    out[0, 3, 144:160, 16:32] = (tile + noise).astype(out.dtype)
    return {"out": out}


def _nan_elements(case, inputs, outputs):
    out = outputs["out"].copy()
    out[0, 1, 200, 3:7] = np.inf
    out[0, 2, 17, 0] = np.nan
    return {"out": out}


def _block_left_at_prefill(case, inputs, outputs):
    out, lse = outputs["out"].copy(), outputs["lse"].copy()
    out[0, 0, 128:256] = prefilled((1,), case.dtype)[0]
    lse.reshape(case.q_shape[:-1])[0, 0, 128:256] = np.float32(np.nan)
    return {"out": out, "lse": lse}


def _other_dtype_bits(case, inputs, outputs):
    return {"out": outputs["out"].astype(np.float32).astype(numpy_dtype("bfloat16")).view(outputs["out"].dtype)}


def _s_and_n_swapped(case, inputs, outputs):
    out = outputs["out"]
    return {"out": np.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(out.shape)}


PLANTED: dict[str, tuple[Callable, str]] = {
    "mask-transposed": (_transposed, "block-selection"),
    "kv-block-shifted": (_kv_shifted, "block-selection"),
    "scale-missing": (_no_scale, "scale"),
    "scale-twice": (_scale_twice, "scale"),
    "lse-base2": (_lse_base2, "softmax-lse"),
    "lse-without-max": (_lse_without_max, "softmax-lse"),
    "rows-swapped": (_rows_swapped, "rows-permuted"),
    "tile-noise": (_tile_noise, "tile-local"),
    "nan-elements": (_nan_elements, "non-finite"),
    "block-left-at-prefill": (_block_left_at_prefill, "not-written"),
    "other-dtype-bits": (_other_dtype_bits, "layout"),
    "s-and-n-swapped": (_s_and_n_swapped, "layout"),
}


@pytest.fixture(scope="module")
def planted_root(tmp_path_factory):
    return tmp_path_factory.mktemp("planted")


@pytest.mark.parametrize("planted", list(PLANTED))
def test_a_forward_fault_planted_in_the_outputs_names_its_kind_first(tmp_path, planted):
    case = make("fwd")
    case_dir = build_judged_op_folder(tmp_path, case, "forward", _mask(case), device="benchmark")
    plant, kind = PLANTED[planted]
    outputs = _read(case_dir)
    outputs.update(plant(case, _inputs(case_dir), outputs))
    _write(case_dir, outputs, case)
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.FAIL
    assert result.diagnosis and result.diagnosis[0].kind == kind, [
        (c.kind, c.score, c.evidence) for c in result.diagnosis
    ]
    assert all(c.kind in DIAGNOSIS_KINDS and 0 < c.score <= 1 for c in result.diagnosis)


def test_explain_lists_every_forward_hypothesis_tried(tmp_path):
    case = make("fwd")
    case_dir = build_judged_op_folder(tmp_path, case, "forward", _mask(case), device="benchmark")
    outputs = _read(case_dir)
    _write(case_dir, _no_scale(case, _inputs(case_dir), outputs), case)
    result = compare.compare_case(case_dir, workers=1)
    tried = {h.supposes: h for h in result.hypotheses}
    assert tried["scaleValue not applied to the scores"].outcome.startswith("explains ")
    assert tried["the block mask read transposed ([.., j, i])"].outcome.startswith("ruled out: ")
    assert "lse's error falls to" in result.diagnosis[0].evidence


@pytest.mark.parametrize("fields", [{}, {"dtype": "bfloat16"}, {"inner_precise": 1}])
def test_clean_benchmark_outputs_of_the_planted_case_get_no_diagnosis(tmp_path, fields):
    case = make("fwd", **fields)
    case_dir = build_judged_op_folder(tmp_path, case, "forward", _mask(case), device="benchmark")
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.PASS and result.diagnosis == () and result.hypotheses == ()


# ---- the pair: the forward's error carried into the gradients, and padding rows --------------------------------


def test_a_chain_whose_forward_fails_lays_the_gradients_error_to_the_forward(tmp_path):
    case = make("pair")
    case_dir = build_judged_op_folder(tmp_path, case, "chain", _mask(case), fault="forward-no-scale")
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.FAIL
    first = result.diagnosis[0]
    assert first.kind == "scale" and first.evidence.startswith("the forward's out and lse: ")
    assert "dq, dk, dv follow from it" in first.evidence and {"dq", "dk", "dv"} <= set(first.tensors)
    carried = next(h for h in result.hypotheses if h.supposes.startswith("the backward is right given the forward's"))
    assert carried.outcome.startswith("explains ") and carried.score > 0.9


def test_a_chain_whose_backward_fails_is_not_laid_to_its_clean_forward(tmp_path):
    case = make("pair")
    case_dir = build_judged_op_folder(tmp_path, case, "chain", _mask(case), fault="dq-scaled-twice")
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.FAIL and result.diagnosis[0].kind == "scale"
    assert not any(c.evidence.startswith("the forward's") for c in result.diagnosis)
    assert not any(h.supposes.startswith("the forward: ") for h in result.hypotheses)


def test_a_chain_with_both_steps_wrong_diagnoses_the_backward_on_what_it_read(tmp_path):
    """The forward with two rows swapped and the backward without Dsum: the carried hypothesis is ruled out,
    and the backward's own cause is found from the out and lse it read."""
    case = make("pair")
    mask = _mask(case)
    case_dir = build_judged_op_folder(tmp_path, case, "chain", mask, fault="forward-rows-swapped")
    inputs = _inputs(case_dir)
    produced = device_forward.run_forward(
        case, {**inputs, "block_sparse_mask": mask.astype(np.int8)}, "forward-rows-swapped"
    )
    grads = reference.emulate(case, device_forward.backward_tensors(inputs, produced), "no-dsum")
    for name, array in grads.items():
        (case_dir / "outputs" / f"{name}.bin").write_bytes(array_bytes(array))
    result = compare.compare_case(case_dir, workers=1)
    kinds = [c.kind for c in result.diagnosis]
    assert kinds[0] == "rows-permuted" and "softmax-grad" in kinds, [
        (c.kind, c.score, c.evidence) for c in result.diagnosis
    ]
    carried = next(h for h in result.hypotheses if h.supposes.startswith("the backward is right given the forward's"))
    assert carried.outcome.startswith("ruled out: ")


PADDING = dict(actual_seq_lengths=(300,), actual_seq_lengths_kv=(600,), bnsd_lengths="ignored")
EXPECT_PADDING = {"verdict": "FAIL", "cause": "padding-rows-read"}


def test_padding_rows_read_is_named_where_the_backward_read_the_padding(tmp_path):
    case = make("pad", **PADDING)
    case_dir = build_judged_op_folder(tmp_path, case, "chain", _mask(case), expect=EXPECT_PADDING)
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.PASS and result.message.startswith("fails as it must: padding-rows-read")
    padding = next(c for c in result.diagnosis if c.kind == "padding-rows-read")
    assert padding.score > 0.9 and "recomputed over the full S" in padding.evidence


def test_padding_rows_read_is_not_blamed_for_a_chain_failing_for_another_reason(tmp_path):
    """A pair that honours the lengths (the benchmark's) with dq doubled: the case's parameters name padding,
    the errors do not."""
    case = make("pad", **PADDING)
    case_dir = build_judged_op_folder(tmp_path, case, "chain", _mask(case), device="benchmark", expect=EXPECT_PADDING)
    manifest = load_manifest(case_dir)
    entry = manifest.outputs["dq"]
    dq = np.fromfile(case_dir / "outputs" / entry["file"], dtype=numpy_dtype(entry["dtype"])).reshape(entry["shape"])
    (case_dir / "outputs" / "dq.bin").write_bytes(array_bytes((dq.astype(np.float32) * 2).astype(dq.dtype)))
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.FAIL
    assert "padding-rows-read" not in [c.kind for c in result.diagnosis]
    assert any(n.startswith("padding-rows-read not named: it explains") for n in result.notes)
    assert "fails, but for no pair cause, not padding-rows-read" in result.message


def _out_halved(case, inputs, outputs):
    return {"out": (outputs["out"].astype(np.float32) * 0.5).astype(outputs["out"].dtype)}


def _lse_shifted(case, inputs, outputs):
    return {"lse": outputs["lse"] + np.float32(0.25)}


@pytest.mark.parametrize(
    ("plant", "kind"), [(_out_halved, "scale"), (_lse_shifted, "softmax-lse")], ids=["out-halved", "lse-shifted"]
)
def test_a_constant_factor_or_shift_is_fitted(tmp_path, plant, kind):
    case = make("fwd")
    case_dir = build_judged_op_folder(tmp_path, case, "forward", _mask(case), device="benchmark")
    outputs = _read(case_dir)
    outputs.update(plant(case, _inputs(case_dir), outputs))
    _write(case_dir, outputs, case)
    result = compare.compare_case(case_dir, workers=1)
    assert result.verdict == compare.FAIL and result.diagnosis[0].kind == kind, result.diagnosis
    assert " x golden" in result.diagnosis[0].evidence
