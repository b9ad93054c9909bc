"""The standards as objects (bsa_cli/standards): each registered standard is complete, and a new standard is
one class that every layer judges by with no other change."""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from bsa_cli import compare, standards
from bsa_cli.compare import RunSettings
from bsa_cli.core.case import numpy_dtype
from bsa_cli.standards import GENERAL_KEYS, STANDARDS, Standard
from bsa_cli.standards.base import Check, Measured, upper
from tests.helpers import REPO, make_case

DTYPES = ("float16", "bfloat16", "float32")


def test_the_standards_in_the_order_help_lists_them() -> None:
    assert list(STANDARDS) == ["double-benchmark", "mixed-tolerance", "single", "allclose", "fa-ratio"]
    assert standards.DEFAULT_STANDARD in STANDARDS
    assert all(isinstance(s, Standard) and s == name and s.name == name for name, s in STANDARDS.items())


@pytest.mark.parametrize("standard", list(STANDARDS.values()), ids=list(STANDARDS))
def test_each_standard_has_its_keys_presets_and_defaults_per_dtype(standard: Standard) -> None:
    assert standard.summary and standard.keys and all(standard.keys.values())
    assert standard.threshold_keys == [*standard.keys, *GENERAL_KEYS]
    assert standard.labels == [standard, *(f"{standard}:{p}" for p in standard.presets)]
    for preset in [None, *standard.presets]:
        for dtype in DTYPES:
            values = standard.defaults(dtype, preset)
            assert set(GENERAL_KEYS) <= set(values) <= set(standard.threshold_keys), (preset, dtype)
            assert all(isinstance(v, float) and v >= 0 for v in values.values()), (preset, dtype, values)
            assert standard.check(values, preset) == values  # its defaults pass its own rules
            if preset:
                assert values.items() >= dict(standard.presets[preset]).items()
            resolved = compare.resolve_settings(dtype, {"standard": standard.labels[0]}, RunSettings())
            assert resolved.standard is standard and set(resolved.thresholds) <= set(standard.threshold_keys)
    assert standard.defaults("float32") == standard.defaults("int8")  # a dtype no table names: float32's
    assert (standard.bias_z == 5.0) == (standard == "double-benchmark")
    assert bool(standard.atk_keys) == (standard.atk_name is not None)


def test_defaults_follow_the_dtype() -> None:
    assert [STANDARDS["double-benchmark"].defaults(d)["err_thd"] for d in DTYPES] == [2.0**-11, 2.0**-8, 2.0**-14]
    assert [STANDARDS["single"].defaults(d)["mere"] for d in DTYPES] == [2.0**-10, 2.0**-7, 2.0**-13]
    assert [STANDARDS["allclose"].defaults(d)["rtol"] for d in DTYPES] == [1e-3, 1.6e-2, 1.3e-6]


def test_a_settings_standard_is_the_standard_and_its_name() -> None:
    settings = compare.resolve_settings("float16", {"standard": "allclose:msopst"}, RunSettings())
    assert settings.standard is STANDARDS["allclose"] and settings.standard == "allclose"
    assert settings.label == "allclose:msopst" and type(settings.label) is str
    assert pickle.loads(pickle.dumps(settings)).standard is STANDARDS["allclose"]  # worker processes
    named = compare.Settings("single", None, {}, "ignore", {})  # as a report read back holds it
    assert named.standard is STANDARDS["single"]


def test_a_run_threshold_the_case_standard_does_not_know_is_its_own_error() -> None:
    with pytest.raises(standards.ThresholdNotApplicable, match="--threshold rmse_ratio: does not apply"):
        compare.resolve_settings("float16", {"standard": "single"}, RunSettings(thresholds={"rmse_ratio": 3}))
    assert issubclass(standards.ThresholdNotApplicable, ValueError)
    with pytest.raises(ValueError) as info:  # a case's own bad settings are not that error
        compare.resolve_settings("float16", {"standard": "singel"}, RunSettings())
    assert not isinstance(info.value, standards.ThresholdNotApplicable)


class MaxAbs(Standard):
    """A planted standard: max abs error <= limit, nothing else defined."""

    name = "max-abs-planted"
    summary = "max abs error <= limit"
    keys = {"limit": "largest abs error allowed"}
    presets = {"loose": {"limit": 1.0}}
    own_defaults = {"limit": 1e-3}

    def checks(self, m: Measured, t: Mapping[str, float]) -> list[Check]:
        return [upper("limit", m.tensor, m.device.max_abs_err, t["limit"], "max abs error")]


STANDARDS.pop(MaxAbs.name)  # registered by its definition; `planted` puts it back for a test


@pytest.fixture
def planted() -> Iterator[Standard]:
    STANDARDS[MaxAbs.name] = MaxAbs()
    try:
        yield STANDARDS[MaxAbs.name]
    finally:
        STANDARDS.pop(MaxAbs.name)


def test_defining_a_standard_class_registers_it() -> None:
    class Planted(MaxAbs):
        name = "planted-by-definition"

    try:
        assert isinstance(STANDARDS["planted-by-definition"], Planted)
        assert list(STANDARDS)[-1] == "planted-by-definition"  # after the ranked ones
        with pytest.raises(ValueError, match="two standards named"):

            class Again(MaxAbs):
                name = "planted-by-definition"

    finally:
        STANDARDS.pop("planted-by-definition")


def test_a_planted_standard_is_judged_by_with_no_other_change(planted: Standard) -> None:
    compare.validate_settings({"standard": "max-abs-planted:loose", "thresholds": {"limit": 0.5, "zero_atol": 0}})
    with pytest.raises(ValueError, match="threshold 'mere' does not apply to standard 'max-abs-planted'"):
        compare.validate_settings({"standard": "max-abs-planted", "thresholds": {"mere": 0.1}})
    RunSettings(standard="max-abs-planted", thresholds={"limit": 2}).validate()
    RunSettings(thresholds={"limit": 2}).validate()  # a key only it knows
    settings = compare.resolve_settings("float16", {"standard": "max-abs-planted:loose"}, RunSettings())
    assert settings.standard is planted and settings.thresholds["limit"] == 1.0
    assert settings.origin["limit"] == "preset" and math.isinf(settings.thresholds["bias_z"])

    case = make_case("m", num_heads=1, num_kv_heads=1, q_seq_len=16, kv_seq_len=16, head_dim=16, block_shape=(16, 16))
    gold = {n: np.full((1, 1, 16, 16), 0.5, dtype=np.float32) for n in ("dq", "dk", "dv")}
    device = {n: g.astype(numpy_dtype(case.dtype)) for n, g in gold.items()}
    device["dk"][0, 0, 1, 2] = 0.75
    mask = np.ones(case.mask_shape, dtype=np.uint8)
    strict = compare.resolve_settings(case.dtype, {"standard": "max-abs-planted"}, RunSettings())
    judged = {t.name: t for t in compare.judge_tensors(case, strict, device, gold, None, mask)}
    assert [c.detail for c in judged["dk"].checks if c.name == "limit"] == ["dk max abs error 0.25 > 0.001"]
    assert judged["dq"].passed and not judged["dk"].passed


def test_a_report_naming_a_standard_this_bsa_lacks_is_read_back(tmp_path) -> None:
    """A night written by a newer bsa (a standard added since) still reads: `--baseline`, `bsa trend`."""
    import json

    from bsa_cli.report.document import from_document

    document = json.loads((REPO / "tests" / "snapshots" / "report.json").read_text())
    for case in document["cases"]:
        if case.get("settings"):
            case["settings"]["standard"] = "mixed-tolerance"
    suite = from_document(document)
    assert {c.settings.label for c in suite.cases if c.settings} == {"mixed-tolerance"}
