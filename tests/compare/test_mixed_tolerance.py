"""`bsa compare --standard mixed-tolerance` against an independent reading of opbase's Mixed Tolerance document.

The judge below is written from the document's text (hicann/opbase docs/zh/ops_precision_standard/
mixed_tolerance_standard.md at 29df87a6f8add42e3aa42f20eb32edc5d8fa178a and 233ee24cc3500d36bd4c2a51f8872d67857cec08;
docs/research/issue30.md quotes them), not from bsa's code: element by element in float64, the ratio in exact
fractions, the ULP from NumPy's spacing. Crafted device outputs sit at each boundary (matched ratio just above and
just below 0.99; one element just inside and just outside its tolerance; the largest error just inside and just
outside its limit), for fp16 and bf16 and every op that judges a tensor by the standard (backward, forward, chain).
"""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from bsa_cli.core.case import numpy_dtype
from tests.helpers import build_case, invoke, make_case
from tests.helpers.op_folders import build_judged_op_folder

#: The document's table at 233ee24c (kept by 29df87a6): rtol = atol, and X of "X or 32 * ULP".
TABLE = {"float16": (2.0**-10, 0.1), "bfloat16": (2.0**-7, 0.1)}
REQUIRED = Fraction(99, 100)
#: The tensors each op's folder judges by the case's standard (lse has a rule of its own).
JUDGED = {"backward": ("dq", "dk", "dv"), "forward": ("out",), "chain": ("out", "dq", "dk", "dv")}
#: What each crafted output plants: (name, what the verdict must be).
PLANTS = (
    ("ratio-above", True),  # exactly floor(1% of n) elements outside their tolerance
    ("ratio-below", False),  # one more
    ("element-inside", True),  # floor(1%) outside, one more element at the largest value inside its tolerance
    ("element-outside", False),  # ... at the smallest value outside it
    ("limit-inside", True),  # the largest error at the largest value within the limit
    ("limit-outside", False),  # ... at the smallest value beyond it
)


def spacing(value: float, dtype: str) -> float:
    """The gap from |value| (a value of the dtype) to the next larger one."""
    if dtype == "float16":
        return float(np.spacing(np.float16(abs(value))))
    return float(np.spacing(np.float32(abs(value)))) * 2.0**16  # bfloat16 keeps float32's upper 16 bits


def independent_judge(device: np.ndarray, golden: np.ndarray, dtype: str) -> tuple[bool, Fraction, float]:
    """(passes, matched ratio, max abs error) of one tensor by the document: every element judged."""
    tol, floor = TABLE[dtype]
    d, g = device.astype(np.float64).ravel(), golden.astype(np.float64).ravel()
    error = np.abs(d - g)
    matched = Fraction(int(np.sum(error <= tol + tol * np.abs(g))), g.size)
    worst = int(np.argmax(error))
    anchor = float(np.asarray(g[worst], dtype=np.float32).astype(numpy_dtype(dtype)))  # g_low: g in the dtype
    limit = max(floor, 32 * spacing(anchor, dtype))
    return bool(matched >= REQUIRED and error[worst] <= limit), matched, float(error[worst])


def step(value: np.ndarray, dtype: str, up: int) -> np.ndarray:
    """`value` (positive, of the dtype) moved `up` representable values up (down when negative)."""
    raw = np.asarray(value, dtype=numpy_dtype(dtype)).view(np.uint16).astype(np.int32) + up
    return raw.astype(np.uint16).view(numpy_dtype(dtype))


def largest_within(golden: float, bound: float, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(largest value v of the dtype with v - golden <= bound, the next one), golden > 0."""
    v = np.asarray(golden + bound, dtype=np.float64).astype(numpy_dtype(dtype))
    while float(v) - golden > bound:
        v = step(v, dtype, -1)
    while float(step(v, dtype, 1)) - golden <= bound:
        v = step(v, dtype, 1)
    return v, step(v, dtype, 1)


def craft(golden: np.ndarray, dtype: str, plant: str) -> np.ndarray:
    """Device values: the golden in the dtype, then the plant."""
    tol, floor = TABLE[dtype]
    g = golden.astype(np.float64).ravel()
    device = g.astype(numpy_dtype(dtype))
    positive = np.flatnonzero((g > 0.05) & (g < 0.9))
    allowed = g.size // 100
    # the elements four tolerances off: with the planted one, at most `allowed` mismatches unless the plant adds one
    outside = {"ratio-below": allowed + 1, "limit-inside": allowed - 1, "limit-outside": allowed - 1}.get(
        plant, allowed
    )
    chosen = positive[: outside + 1]
    for i in chosen[:outside]:  # four tolerances off: outside, far below the limit
        device[i] = np.asarray(g[i] + 4 * (tol + tol * g[i])).astype(numpy_dtype(dtype))
    last = int(chosen[-1])
    if plant.startswith("element"):
        inside, beyond = largest_within(g[last], tol + tol * g[last], dtype)
        device[last] = inside if plant == "element-inside" else beyond
    elif plant.startswith("limit"):
        anchor = float(np.asarray(g[last], dtype=np.float32).astype(numpy_dtype(dtype)))
        inside, beyond = largest_within(g[last], max(floor, 32 * spacing(anchor, dtype)), dtype)
        device[last] = inside if plant == "limit-inside" else beyond
    return device.reshape(golden.shape)


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict, dict]:
    """Crafted folders for each dtype, op and plant, judged by one `bsa compare`: (root, report, expected verdicts,
    expected error balances)."""
    root = tmp_path_factory.mktemp("mixed")
    bases = tmp_path_factory.mktemp("bases")
    expected: dict[str, dict[str, tuple[bool, Fraction, float]]] = {}
    balances: dict[tuple[str, str], float] = {}
    for dtype in TABLE:
        case = make_case(f"mt-{dtype}", dtype=dtype, head_dim=32, q_seq_len=64, kv_seq_len=64)
        for op, tensors in JUDGED.items():
            base = build_case(bases, case) if op == "backward" else build_judged_op_folder(bases, case, op)
            manifest = json.loads((base / "case.json").read_text())
            for plant, _ in PLANTS:
                folder = root / f"{base.name.replace('@', '.')}.{plant}@{op}".removesuffix("@backward")
                shutil.copytree(base, folder)
                (folder / "case.json").write_text(json.dumps({**manifest, "name": folder.name}))
                record = folder / "outputs" / "run.json"
                if record.exists():  # the op folders' run record names its case
                    record.write_text(json.dumps({**json.loads(record.read_text()), "case": folder.name}))
                for name in tensors:
                    entry = manifest["golden"][name]
                    golden = np.fromfile(folder / entry["file"], dtype=np.float32).reshape(entry["shape"])
                    device = craft(golden, dtype, plant)
                    (folder / "outputs" / f"{name}.bin").write_bytes(device.tobytes())
                    expected.setdefault(folder.name, {})[name] = independent_judge(device, golden, dtype)
                    balances[(folder.name, name)] = error_balance(device, golden)
    report = root.parent / f"{root.name}.json"
    result = invoke("compare", root, "--standard", "mixed-tolerance", "--json", report)
    assert result.exit_code in (0, 1), result.output
    return root, json.loads(report.read_text()), expected, balances


def error_balance(device: np.ndarray, golden: np.ndarray) -> float:
    """EB as CANN's test helpers compute it: mean((a - g) / max(1, |g|))."""
    d, g = device.astype(np.float64), golden.astype(np.float64)
    return float(np.mean((d - g) / np.maximum(np.abs(g), 1.0)))


def test_crafted_outputs_get_the_verdict_of_the_document(judged: tuple[Path, dict, dict, dict]) -> None:
    _, report, expected, _ = judged
    cases = {c["name"]: c for c in report["cases"]}
    assert set(cases) == set(expected)
    for name, tensors in expected.items():
        case = cases[name]
        plant = name.split("@")[0].split(".", 2)[-1]
        must_pass = dict(PLANTS)[plant]
        for data in case["tensors"]:
            if data["name"] not in tensors:
                continue
            passes, ratio, max_abs = tensors[data["name"]]
            assert passes == must_pass, (name, data["name"], "the crafted plant is not at its boundary")
            mixed = {c["name"]: c["passed"] for c in data["checks"] if c["name"] in ("matched_ratio", "max_abs_error")}
            assert all(mixed.values()) == passes, (name, data["name"], data["checks"])
            assert data["matched_ratio"] == pytest.approx(float(ratio), abs=1e-12), name
            # bsa measures |a - g| in float32: the same error but for its last bit
            assert data["max_abs_error"] == pytest.approx(max_abs, rel=2.0**-23), name
        assert case["verdict"] == ("PASS" if must_pass else "FAIL"), (name, case["message"])


def test_each_report_shows_the_other_standards_verdict(judged: tuple[Path, dict, dict, dict]) -> None:
    _, report, _, _ = judged
    differ = set(report["summary"]["verdicts_differ"])
    for case in report["cases"]:
        assert set(case["side_verdicts"]) == {"double-benchmark"}, case["name"]
        assert (case["side_verdicts"]["double-benchmark"] != case["verdict"]) == (case["name"] in differ)
    # 1% of the elements four tolerances off passes mixed tolerance but not the double benchmark's MARE ratio
    above = {c["name"]: c for c in report["cases"] if "ratio-above" in c["name"]}
    assert above and set(above) <= differ
    for case in above.values():
        assert case["side_verdicts"] == {"double-benchmark": "FAIL"} and case["verdict"] == "PASS"


def test_every_tensor_reports_its_error_balance(judged: tuple[Path, dict, dict, dict]) -> None:
    _, report, _, balances = judged
    for case in report["cases"]:
        for data in case["tensors"]:
            if (case["name"], data["name"]) in balances:
                expected = balances[(case["name"], data["name"])]
                assert data["device"]["error_balance"] == pytest.approx(expected, rel=1e-4, abs=1e-9)
    # the planted errors are all upwards: a positive balance the reference outputs do not have
    assert all(b > 0 for (name, _), b in balances.items() if "ratio-below" in name)


def test_bfloat16_limit_is_32_ulp_where_that_is_above_x() -> None:
    """At 29df87a6 a bf16 golden in [0.5, 1) has 32 ULP = 0.125 > X = 0.1: the judge takes the larger."""
    golden = np.full(200, 0.75, dtype=np.float32)
    device = golden.astype(ml_dtypes.bfloat16)
    device[0] = np.asarray(0.75 + 0.1171875, dtype=np.float32).astype(ml_dtypes.bfloat16)  # err 0.117 > X
    assert independent_judge(device, golden, "bfloat16")[0]
