"""Stress data: outliers, mixed-magnitude rows, an attention sink, chosen score spreads; their spec keys,
the golden's accuracy on them, and the manifest notes on the kernel path's overflow and underflow."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from bsa_cli import golden
from bsa_cli.core.case import Case, Distribution, Init, Outliers, RowScale, Sink, Sparsity
from bsa_cli.core.errors import SpecError
from bsa_cli.gen.generate import compute_case, generate_case
from bsa_cli.gen.settings import GenSettings
from bsa_cli.inputs import make_tensors
from bsa_cli.specs import load_specs
from tests.helpers import REPO, case_factory

STRESS = load_specs([REPO / "cases" / "stress.yaml"])


make_case = case_factory(
    name="c",
    source="t",
    batch=2,
    num_heads=4,
    q_seq_len=128,
    kv_seq_len=160,
    block_shape=(32, 32),
    scale=1 / math.sqrt(32),
    seed=5,
)


def rows_of(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64).reshape(-1, array.shape[-1])


# ---- the shapes of the values ----------------------------------------------------------------------------------


def test_outlier_tokens_scale_exactly_the_chosen_rows() -> None:
    plain = rows_of(make_tensors(make_case())["query"])
    case = make_case(init=Init(query=Distribution(outliers=Outliers(fraction=0.05, factor=16.0))))
    stressed = rows_of(make_tensors(case)["query"])
    ratio = np.abs(stressed).max(axis=1) / np.abs(plain).max(axis=1)
    scaled = np.isclose(ratio, 16.0, rtol=2e-3)
    assert scaled.sum() == round(0.05 * plain.shape[0])
    assert np.array_equal(stressed[~scaled], plain[~scaled])  # the other rows are the base draw, bit for bit


def test_noisy_values_are_the_normal_draw_with_one_in_a_thousand_scaled_by_1000() -> None:
    """The commercial standard's noisy distribution: k = max(1, n // 1000) distinct positions x1000, the rest the
    normal draw bit for bit (so specs without it keep their bytes)."""
    plain = make_tensors(make_case())
    noisy = make_tensors(make_case(init=Init(query=Distribution(kind="noisy"), dout=Distribution(kind="noisy"))))
    for name in ("query", "dout"):
        base, drawn = plain[name].astype(np.float64).ravel(), noisy[name].astype(np.float64).ravel()
        changed = np.flatnonzero(base != drawn)
        assert changed.size == base.size // 1000
        assert np.allclose(drawn[changed], 1000 * base[changed], rtol=2**-10)
    for name in ("key", "value"):
        assert np.array_equal(plain[name], noisy[name])
    assert not np.array_equal(
        np.flatnonzero(plain["query"] != noisy["query"]), np.flatnonzero(plain["dout"] != noisy["dout"])
    )


def test_outlier_channels_scale_the_same_dimensions_of_every_token() -> None:
    plain = rows_of(make_tensors(make_case())["value"])
    case = make_case(init=Init(value=Distribution(outliers=Outliers(fraction=0.1, factor=10.0, axis="channel"))))
    stressed = rows_of(make_tensors(case)["value"])
    changed = ~np.all(stressed == plain, axis=0)
    assert changed.sum() == round(0.1 * 32)
    assert np.allclose(stressed[:, changed], 10 * plain[:, changed], rtol=1e-3)


def test_row_scale_gives_rows_magnitudes_across_its_range() -> None:
    plain = rows_of(make_tensors(make_case())["dout"])
    case = make_case(init=Init(dout=Distribution(row_scale=RowScale(low=1e-3, high=1e2))))
    factors = np.abs(rows_of(make_tensors(case)["dout"])).max(axis=1) / np.abs(plain).max(axis=1)
    assert factors.min() >= 1e-3 * 0.99 and factors.max() <= 1e2 * 1.01
    assert factors.min() < 1e-2 and factors.max() > 10  # spread over the decades, not bunched


def test_sink_key_takes_most_queries_weight() -> None:
    case = make_case(batch=1, init=Init(sink=Sink(token=0, strength=8.0)))
    tensors = make_tensors(case)
    query, key = tensors["query"].astype(np.float64), tensors["key"].astype(np.float64)
    for head in range(4):
        scores = case.kernel_scale * query[0, head] @ key[0, head // 2].T  # [Sq, Skv]
        assert abs(np.median(scores[:, 0]) - 8.0) < 1.0
        assert np.mean(scores[:, 0] > scores[:, 1:].max(axis=1)) > 0.9


def test_sink_sits_at_each_tnd_sequence_start() -> None:
    case = make_case(
        layout="TND",
        batch=3,
        q_seq_len=70,
        kv_seq_len=90,
        actual_seq_lengths=(50, 0, 70),
        actual_seq_lengths_kv=(90, 3, 40),
        init=Init(sink=Sink(token=2, strength=6.0)),
    )
    key = make_tensors(case)["key"].astype(np.float64)
    norms = np.linalg.norm(key, axis=2).max(axis=1)
    assert set(np.flatnonzero(norms > 2 * np.median(norms))) == {2, 92, 95}


@pytest.mark.parametrize("logit_std", [25.0, 0.01])
def test_logit_std_sets_the_spread_of_scaled_scores(logit_std: float) -> None:
    case = make_case(batch=1, q_seq_len=256, kv_seq_len=256, init=Init(logit_std=logit_std))
    tensors = make_tensors(case)
    scores = case.kernel_scale * tensors["query"][0, 0].astype(np.float64) @ tensors["key"][0, 0].astype(np.float64).T
    assert 0.85 < scores.std() / logit_std < 1.15


def test_stress_values_stay_finite_in_float16() -> None:
    case = make_case(init=Init(query=Distribution(outliers=Outliers(fraction=0.5, factor=1e6))))  # past the spec check
    query = make_tensors(case)["query"]
    assert np.isfinite(query).all() and float(np.abs(query).max()) == 65504.0  # tails clipped


def test_stress_draws_are_deterministic_and_leave_other_tensors_alone() -> None:
    case = make_case(init=Init(key=Distribution(outliers=Outliers()), sink=Sink()))
    first, again, plain = make_tensors(case), make_tensors(case), make_tensors(make_case())
    assert all(first[n].tobytes() == again[n].tobytes() for n in first)
    assert first["value"].tobytes() == plain["value"].tobytes()
    assert first["dout"].tobytes() == plain["dout"].tobytes()


# ---- spec keys -------------------------------------------------------------------------------------------------

BASE = {"name": "c", "num_heads": 2, "q_seq_len": 128, "head_dim": 64, "block_shape": [64, 64]}


def load(tmp_path: Path, init: object) -> Case:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"cases": [{**BASE, "init": init}]}, sort_keys=False))
    return load_specs([path])[0]


def test_spec_reads_every_stress_key(tmp_path: Path) -> None:
    case = load(
        tmp_path,
        {
            "query": {"outliers": {"fraction": 0.1, "factor": 5, "axis": "channel"}},
            "dout": {"row_scale": {"low": 0.01, "high": 10}},
            "sink": {"token": 3, "strength": 6},
            "logit_std": 20,
        },
    )
    assert case.init.query.outliers == Outliers(fraction=0.1, factor=5.0, axis="channel")
    assert case.init.dout.row_scale == RowScale(low=0.01, high=10.0)
    assert case.init.sink == Sink(token=3, strength=6.0) and case.init.logit_std == 20.0
    assert load(tmp_path, {"outliers": {}}).init.value.outliers == Outliers()  # init-wide: every tensor


@pytest.mark.parametrize(
    ("init", "key", "fragment"),
    [
        ({"sinks": {}}, "init.sinks", "unknown key (did you mean 'sink'?)"),
        ({"query": {"outliers": {"fracton": 0.1}}}, "init.query.outliers.fracton", "(did you mean 'fraction'?)"),
        ({"query": {"outliers": {"fraction": 2}}}, "init.query.outliers.fraction", "allowed: a fraction in (0, 1]"),
        (
            {"query": {"outliers": {"factor": -3}}},
            "init.query.outliers.factor",
            "-3.0 is not allowed; allowed: a finite",
        ),
        (
            {"key": {"outliers": {"axis": "channels"}}},
            "init.key.outliers.axis",
            "'channels' is not allowed (did you mean 'channel'?); allowed: token, channel",
        ),
        ({"key": {"outliers": 4}}, "init.key.outliers", "4 is not a mapping of fraction, factor, axis"),
        ({"dout": {"row_scale": {"low": 10, "high": 1}}}, "init.dout.row_scale.low", "10.0 is above high 1.0"),
        ({"dout": {"row_scale": {"low": 0}}}, "init.dout.row_scale.low", "0.0 is not allowed"),
        ({"sink": {"token": -1}}, "init.sink.token", "below the minimum 0"),
        ({"sink": {"strength": "big"}}, "init.sink.strength", "'big' is not a number"),
        ({"logit_std": 0}, "init.logit_std", "0.0 is not allowed; allowed: a finite number > 0"),
        ({"logit_std": 20, "key": {"std": 2}}, "init.key.std", "logit_std sets the distribution of query and key"),
        ({"query": {"outliers": {"factor": 30000}}}, "init.query", "beyond float16's largest number"),
        ({"key": {"distribution": "noisy", "std": 20}}, "init.key", "beyond float16's largest number"),
        ({"key": {"distribution": "noise"}}, "init.key.distribution", "allowed: normal, uniform, noisy"),
    ],
)
def test_bad_stress_keys_name_the_key_and_what_is_allowed(tmp_path: Path, init: dict, key: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, init)
    message = str(info.value)
    assert "spec.yaml" in message and "case 'c'" in message and f"key '{key}'" in message, message
    assert fragment in message, message


# ---- the golden, and the kernel path's range -------------------------------------------------------------------


def relative_to_float64(case: Case) -> dict[str, float]:
    _, gold32, _ = compute_case(case, GenSettings("float32"))
    _, gold64, _ = compute_case(case, GenSettings("float64"))
    return {name: float(np.abs(gold32[name] - gold64[name]).max() / np.abs(gold64[name]).max()) for name in gold64}


@pytest.mark.parametrize("case", STRESS, ids=[c.name for c in STRESS])
def test_stress_golden_stays_within_1e5_of_the_float64_golden(case: Case) -> None:
    worst = relative_to_float64(case)
    assert max(worst.values()) < 1e-5, worst


def test_stress_suite_covers_dtypes_gqa_tnd_and_every_shape() -> None:
    assert {c.dtype for c in STRESS} == {"float16", "bfloat16"}
    assert any(c.group_size > 1 for c in STRESS) and any(c.layout == "TND" for c in STRESS)
    inits = [c.init for c in STRESS]
    tensors = [getattr(i, t) for i in inits for t in ("query", "key", "value", "dout")]
    assert any(d.outliers and d.outliers.axis == "token" for d in tensors)
    assert any(d.outliers and d.outliers.axis == "channel" for d in tensors)
    assert any(d.row_scale for d in tensors) and any(i.sink for i in inits)
    assert {i.logit_std for i in inits} >= {25.0, 0.01}


OVERFLOW = dict(
    dtype="float16",
    batch=1,
    num_heads=2,
    num_kv_heads=2,
    q_seq_len=128,
    kv_seq_len=128,
    init=Init(logit_std=3.0, dout=Distribution(std=4000.0), value=Distribution(std=10.0)),
)


def notes_of(case: Case, tmp_path: Path) -> list[str]:
    manifest = json.loads((generate_case(case, tmp_path) / "case.json").read_text())
    assert set(manifest["kernel_path"]) >= {"max_abs_dscores", "dscores_flushed_to_zero"}
    return list(manifest["notes"])


def test_manifest_notes_a_kernel_path_overflow(tmp_path: Path) -> None:
    notes = notes_of(make_case(name="over", **OVERFLOW), tmp_path)
    assert any(n.startswith("float16 overflow: max |dS| in the kernel path is ") and "65504" in n for n in notes)
    bf16 = notes_of(make_case(name="bf", **{**OVERFLOW, "dtype": "bfloat16"}), tmp_path)
    assert not any("overflow" in n for n in bf16)  # bfloat16 has float32's range


def test_manifest_notes_underflow_of_peaked_rows_and_nothing_for_normal_data(tmp_path: Path) -> None:
    assert notes_of(make_case(name="plain"), tmp_path) == []
    peaked = notes_of(make_case(name="peaked", init=Init(logit_std=25.0)), tmp_path)
    assert any(n.startswith("float16 underflow: ") and "nonzero dS values" in n for n in peaked)


def test_watching_the_kernel_path_changes_no_bit_of_the_benchmark() -> None:
    case = make_case(sparsity=Sparsity("random", density=0.5), init=Init(logit_std=25.0))
    _, gold, bench = compute_case(case)
    seen = golden.KernelRange()
    _, gold_watched, bench_watched = compute_case(case, kernel_range=seen)
    assert seen.dscores_nonzero > 0 and seen.dscores_flushed > 0
    for name in bench:
        assert bench[name].tobytes() == bench_watched[name].tobytes()
        assert gold[name].tobytes() == gold_watched[name].tobytes()


def test_a_stress_option_changes_only_the_cases_that_use_it() -> None:
    plain = make_case()
    assert dataclasses.replace(plain, init=Init()).init == plain.init  # defaults are no stress at all
    assert (
        make_tensors(plain)["query"].tobytes()
        == make_tensors(make_case(init=Init(dout=Distribution(row_scale=RowScale()))))["query"].tobytes()
    )


def test_compare_reports_carry_the_kernel_path_notes(tmp_path):
    """A stress case whose kernel path flushes values to zero says so in compare's results and HTML."""
    from bsa_cli import compare, report
    from bsa_cli.devices import reference
    from bsa_cli.gen.generate import generate_case
    from bsa_cli.specs import load_specs

    case = next(c for c in load_specs([REPO / "cases" / "stress.yaml"]) if c.name == "stress-peaked.fp16")
    case_dir = generate_case(case, tmp_path)
    reference.emulate_case_dir(case_dir, case_dir / "outputs", order_seed=1)
    result = compare.compare_case(case_dir)
    assert result.verdict == compare.PASS
    assert any("underflow" in note for note in result.kernel_notes)
    assert not any("underflow" in note for note in result.notes)  # the headline stays the verdict's
    assert "precision path: float16 underflow" in report.html_report(compare.SuiteResult((result,)))


def test_gen_and_check_print_the_kernel_path_notes(tmp_path):
    from click.testing import CliRunner

    from bsa_cli.cli import main

    spec = REPO / "cases" / "stress.yaml"
    for command in (["gen", str(spec), "-o", str(tmp_path / "g")], ["check", str(spec), "-o", str(tmp_path / "c")]):
        result = CliRunner().invoke(main, [*command, "--filter", "stress-peaked.fp16"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "stress-peaked.fp16: float16 underflow:" in result.output
