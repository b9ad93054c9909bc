"""The diagnosis on nonsense (issue 35, items 8-10): outputs that carry no information about the golden
(one value everywhere, subnormal, at the dtype's largest magnitude, random of any size) are said to be so
(`no-information`) on every op, never fitted; a fitted cause is named only when it explains every failing
output's error; out's bytes in another axis order are `layout` on the forward and the chain as on the
backward. docs/compare.md, "Diagnosis"."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bsa_cli import compare
from bsa_cli.core.case import Case, numpy_dtype
from bsa_cli.store import array_bytes, load_manifest
from tests.helpers import build_case, build_judged_op_folder, make_case

CASES = {
    "bnsd-fp16": make_case(
        "nonsense-bnsd", batch=2, num_heads=2, num_kv_heads=2, head_dim=32, q_seq_len=256, kv_seq_len=256,
        block_shape=(64, 128),
    ),
    "tnd-bf16": make_case(
        "nonsense-tnd", layout="TND", dtype="bfloat16", batch=2, num_heads=4, num_kv_heads=2, head_dim=32,
        q_seq_len=200, kv_seq_len=200, actual_seq_lengths=(130, 200), actual_seq_lengths_kv=(130, 200),
        block_shape=(64, 128),
    ),
}  # fmt: skip
"""Two small cases every op accepts (the forward wants Y % 128 == 0): BNSD with B 2 (so that B and N can be
transposed), TND with GQA and two entries."""

#: The largest finite magnitude and the smallest subnormal of each case dtype (and lse's float32).
RANGE = {"float16": (65504.0, 2.0**-24), "bfloat16": (3.3895313892515355e38, 2.0**-133), "float32": (3.4e38, 2.0**-149)}


def _mask(case: Case) -> np.ndarray:
    mask = (np.random.default_rng(4).random(case.mask_shape) < 0.6).astype(np.uint8)
    mask[..., 0] = 1  # every query block row selects a block
    return mask


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Callable[[str, str], Path]:
    """(case, op) -> a judged folder with the reference device's outputs, built once per module."""
    root, built = tmp_path_factory.mktemp("nonsense"), {}

    def folder(case: str, op: str) -> Path:
        if (case, op) not in built:
            c = CASES[case]
            if op == "backward":
                built[case, op] = build_case(root / op, c, _mask(c))
            else:
                built[case, op] = build_judged_op_folder(root / op, c, op, _mask(c))
        return built[case, op]

    return folder


def _planted(clean_dir: Path, where: Path, plant: Callable[[str, np.ndarray], np.ndarray | None]) -> Path:
    """A copy of a clean folder whose every output is `plant(name, array)` (None: left as it is)."""
    case_dir = where / clean_dir.name
    shutil.copytree(clean_dir, case_dir)
    (case_dir / "outputs" / "run.json").unlink(missing_ok=True)  # its hashes are the clean outputs'
    for name, entry in load_manifest(case_dir).outputs.items():
        path = case_dir / "outputs" / entry["file"]
        array = np.fromfile(path, dtype=numpy_dtype(entry["dtype"])).reshape(entry["shape"])
        planted = plant(name, array)
        if planted is not None:
            path.write_bytes(array_bytes(np.ascontiguousarray(planted).astype(array.dtype)))
    return case_dir


def _filled(value: Callable[[np.ndarray], float]) -> Callable[[str, np.ndarray], np.ndarray]:
    return lambda name, a: np.full(a.shape, value(a), dtype=np.float32)


def _random(size: float) -> Callable[[str, np.ndarray], np.ndarray]:
    def plant(name: str, a: np.ndarray) -> np.ndarray:
        return np.random.default_rng(len(name)).standard_normal(a.shape).astype(np.float32) * np.float32(size)

    return plant


def _subnormal_random(name: str, a: np.ndarray) -> np.ndarray:
    tiny = RANGE[a.dtype.name][1]
    rng = np.random.default_rng(3)  # never zero: a row of zeros reads as never written
    return (rng.integers(1, 9, a.shape) * rng.choice([-1, 1], a.shape)).astype(np.float32) * np.float32(tiny)


NONSENSE: dict[str, Callable[[str, np.ndarray], np.ndarray]] = {
    "smallest subnormal": _filled(lambda a: RANGE[a.dtype.name][1]),
    "dtype max": _filled(lambda a: RANGE[a.dtype.name][0]),
    "minus dtype max": _filled(lambda a: -RANGE[a.dtype.name][0]),
    "a constant": _filled(lambda a: 0.375),
    "ones": _filled(lambda a: 1.0),
    "random": _random(1.0),
    "random, tiny": _random(1e-6),
    "random subnormals": _subnormal_random,
}
"""Outputs that say nothing about the golden, every output of the folder so filled."""


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op", ["backward", "forward", "chain"])
def test_outputs_without_information_are_said_to_be_so_and_not_fitted(tmp_path, clean, case, op):
    source = clean(case, op)
    wrong = []
    for what, plant in NONSENSE.items():
        result = compare.compare_case(_planted(source, tmp_path / what.replace(" ", "-"), plant), workers=1)
        causes = [(c.kind, c.score) for c in result.diagnosis]
        # not fitted: no other cause beside it (a chain names it for the forward step and for its gradients)
        if result.verdict != compare.FAIL or {k for k, _ in causes} != {"no-information"}:
            wrong.append(f"{what}: {result.verdict} {causes} {[c.evidence[:120] for c in result.diagnosis[:1]]}")
    assert wrong == []


def _bnsd_plants(a: np.ndarray) -> dict[str, np.ndarray]:
    b, n, s, d = a.shape
    return {
        "written as BSND": a.transpose(0, 2, 1, 3).reshape(a.shape),
        "S and N read transposed": a.reshape(b, s, n, d).transpose(0, 2, 1, 3),
        "written as BNDS": a.transpose(0, 1, 3, 2).reshape(a.shape),
        "written as NBSD": a.transpose(1, 0, 2, 3).reshape(a.shape),
    }


def _tnd_plants(a: np.ndarray) -> dict[str, np.ndarray]:
    t, n, d = a.shape
    return {
        "written as NTD": a.transpose(1, 0, 2).reshape(a.shape),
        "T and N read transposed": a.reshape(n, t, d).transpose(1, 0, 2),
        "written as TDN": a.transpose(0, 2, 1).reshape(a.shape),
    }


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op", ["backward", "forward", "chain"])
def test_outputs_in_another_axis_order_are_layout_on_every_op(tmp_path, clean, case, op):
    """Every output but lse (one value per row) written in another axis order: the diagnosis's first cause
    is `layout`, on the forward and the chain (out) as on the backward (dq, dk, dv)."""
    source = clean(case, op)
    plants = _tnd_plants if CASES[case].layout == "TND" else _bnsd_plants
    wrong = []
    for what in plants(np.zeros((2, 2, 2, 2) if CASES[case].layout != "TND" else (2, 2, 2))):

        def plant(name: str, a: np.ndarray, what: str = what) -> np.ndarray | None:
            return None if name == "lse" else plants(a)[what]

        planted = _planted(source, tmp_path / what.replace(" ", "-"), plant)
        result = compare.compare_case(planted, workers=1)
        top = result.diagnosis[0] if result.diagnosis else None
        if result.verdict != compare.FAIL or top is None or top.kind != "layout" or top.score < 0.9:
            wrong.append(f"{what}: {result.verdict} {[(c.kind, c.score) for c in result.diagnosis]}")
    assert wrong == []


def test_a_fitted_cause_is_named_only_when_it_explains_every_failing_output(tmp_path, clean):
    """lse off by an affine map while out holds random values: fitting lse leaves out's error as it was, so
    `softmax-lse` is not named (it was, at 0.95, when the outputs' errors were summed)."""

    def plant(name: str, a: np.ndarray) -> np.ndarray:
        if name == "lse":
            return 2.0 * a.astype(np.float32) + 1.0
        return _random(1.0)(name, a)

    for op in ("forward", "chain"):
        result = compare.compare_case(_planted(clean("bnsd-fp16", op), tmp_path / op, plant), workers=1)
        assert result.verdict == compare.FAIL
        assert not any(c.kind == "softmax-lse" for c in result.diagnosis), [
            (c.kind, c.score, c.evidence) for c in result.diagnosis
        ]
        fitted = [h for h in result.hypotheses if "affine" in h.supposes]
        assert fitted and all(h.outcome.startswith("ruled out") for h in fitted)


def test_clean_outputs_of_these_cases_pass_with_no_diagnosis(clean):
    for case in CASES:
        for op in ("backward", "forward", "chain"):
            result = compare.compare_case(clean(case, op), workers=1)
            assert result.verdict == compare.PASS and not result.diagnosis, (case, op, result.message)
