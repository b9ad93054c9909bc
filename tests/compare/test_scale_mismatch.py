"""The chain's scale pitfall (cases/chain.yaml, `step_scales`): a forward and a backward called with two scales
fail naming `scale-mismatch`, both called with the same explicit scale pass, and a backward that computes at a
wrong scale by itself (a planted fault) is not laid to the steps' scales (docs/compare.md, "The forward and the
pair")."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsa_cli import compare
from bsa_cli.core.errors import SpecError
from bsa_cli.specs import load_specs
from bsa_cli.store import load_manifest
from tests.helpers import invoke

SPEC = """\
defaults: {ops: [chain], layout: BNSD, dtype: fp16, batch: 1, num_heads: 2, head_dim: 64, q_seq_len: 128,
  block_shape: [128, 128], sparsity: {pattern: dense}}
cases:
  - name: same
  - name: explicit
    step_scales: {forward: 0.125, backward: 0.125}
  - name: mismatch
    step_scales: {forward: 1.0}
    expect: {verdict: FAIL, cause: scale-mismatch}
  - name: backward-halved
    step_scales: {backward: 0.0625}
    expect: {verdict: FAIL, cause: scale-mismatch}
"""


def _run(tmp_path: Path, fault: str | None = None) -> dict[str, compare.CaseResult]:
    """gen and run the spec's cases (with a planted fault) and judge each chain folder."""
    spec = tmp_path / "scales.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert invoke("gen", spec, "-o", out).exit_code == 0
    ran = invoke("run", out, *(("--fault", fault) if fault else ()))
    assert ran.exit_code == 0, ran.output
    return {d.name.split("@")[0]: compare.compare_case(d, workers=1) for d in sorted(out.iterdir())}


def _kinds(result: compare.CaseResult) -> list[str]:
    return [c.kind for c in result.diagnosis]


def test_steps_at_two_scales_fail_naming_scale_mismatch_and_one_explicit_scale_passes(tmp_path):
    results = _run(tmp_path)
    manifest = load_manifest(tmp_path / "out" / "mismatch@chain")
    assert manifest.step_scales == {"forward": 1.0, "backward": 0.125}
    assert "forward_scale" not in load_manifest(tmp_path / "out" / "same@chain").params  # no key: bytes as before
    mismatch = results["mismatch"]
    assert mismatch.verdict == compare.PASS, mismatch.message
    assert mismatch.message.startswith(
        "fails as it must: scale-mismatch: the forward ran at scale 1, the backward at 0.125"
    )
    assert next(c for c in mismatch.diagnosis if c.kind == "scale-mismatch").score >= 0.9
    for name in ("same", "explicit"):
        assert results[name].verdict == compare.PASS and "scale-mismatch" not in _kinds(results[name])
    halved = results["backward-halved"]  # the forward at the scale meant: it passes, the gradients fail
    assert halved.verdict == compare.PASS and halved.message.startswith(
        "fails as it must: scale-mismatch: the forward ran at scale 0.125, the backward at 0.0625"
    )


def test_a_backward_at_a_wrong_scale_by_itself_is_not_scale_mismatch(tmp_path):
    """dq scaled twice (the backward's fault): where the steps were called at one scale, the pair's scales are
    not blamed; where they were not (backward-halved), the backward at its own scale recomputed from the
    device's out and lse no longer explains dq, and the case fails its expectation. (In `mismatch` the
    gradients are about 0 with or without the fault: the forward's lse at scale 1 makes every P tiny.)"""
    results = _run(tmp_path, "dq-scaled-twice")
    for name in ("same", "explicit"):
        assert results[name].verdict == compare.FAIL
        assert "scale-mismatch" not in _kinds(results[name]), results[name].message
    halved = results["backward-halved"]
    assert halved.verdict == compare.FAIL, halved.message
    check = next(c for c in halved.checks if c.name == "expected-verdict")
    assert "scale-mismatch explains only" in check.detail or "not scale-mismatch (expect.cause)" in check.detail


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("step_scales: {forward: 1.0}\n    ops: [forward, backward, autograd]", "add chain to 'ops:'"),
        ("step_scales: {forward: .nan}", "must be a finite number"),
        ("step_scales: {forward: 1.0e+39}", "overflows float32"),
        ("step_scales: {fwd: 1.0}", "unknown key"),
        ("step_scales: {}", "is empty"),
        ("step_scales: 1.0", "is not a mapping"),
    ],
)
def test_step_scales_is_checked(tmp_path, extra, words):
    spec = tmp_path / "bad.yaml"
    ops = "" if "ops:" in extra else "\n    ops: [chain]"
    spec.write_text(f"cases:\n  - name: bad\n    block_shape: [128, 128]\n    {extra}{ops}\n")
    with pytest.raises(SpecError) as raised:
        load_specs([spec])
    assert words in str(raised.value) and "step_scales" in str(raised.value)
