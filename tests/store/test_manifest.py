"""`manifest.Manifest`: a case.json read and checked once, then asked (never dug into as a dict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bsa_cli.cli import main
from bsa_cli.core.errors import DataError
from bsa_cli.store import MANIFEST, load_manifest
from bsa_cli.store.manifest import Manifest

SPEC = {
    "defaults": {
        "dtype": "float16",
        "layout": "BNSD",
        "batch": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 64,
        "q_seq_len": 40,
        "kv_seq_len": 40,
        "block_shape": [16, 16],
        "seed": 7,
    },
    "cases": [
        {"name": "valid", "compare": {"standard": "allclose", "thresholds": {"diff_thd": 0.02}}},
        {"name": "negative", "dtype": "float32", "expect": 161002},
    ],
}


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    result = CliRunner().invoke(main, ["gen", str(spec), "-o", str(root / "out")])
    assert result.exit_code == 0, result.output
    return root / "out"


def test_a_valid_case_answers_from_its_case_json(out):
    manifest = load_manifest(out / "valid")
    raw = json.loads((out / "valid" / MANIFEST).read_text())
    assert isinstance(manifest, Manifest) and manifest.raw == raw
    assert manifest.name == "valid" and manifest.spec == raw["spec"]
    assert manifest.expect_status == 0 and manifest.expect_name == "ACLNN_SUCCESS" and not manifest.is_negative
    assert manifest.has_golden and manifest.seed == 7 and manifest.release == "master"
    assert manifest.params == raw["params"] and manifest.flops_backward == raw["stats"]["flops_backward"]
    assert manifest.thresholds == {"diff_thd": 0.02} and manifest.compare_settings == raw["compare"]
    assert dict(manifest.entries("golden")) == raw["golden"] and set(manifest.outputs) == {"dq", "dk", "dv"}
    assert manifest.fingerprint == raw["generator"]["fingerprint"]
    assert manifest.case is manifest.case  # built once
    assert manifest.case.q_shape == (1, 2, 40, 64) and manifest.case.name == "valid"


def test_a_negative_case_says_so_and_has_no_golden(out):
    manifest = load_manifest(out / "negative")
    assert manifest.is_negative and manifest.expect_status == 161002 and not manifest.has_golden
    assert dict(manifest.entries("golden")) == {} and manifest.thresholds == {}


def test_null_tensors_are_left_out_of_entries():
    raw = {
        "name": "n",
        "params": {},
        "expect": {"status": 161001},
        "inputs": {"query": None, "key": {"file": "inputs/key.bin", "dtype": "float16", "shape": [1]}},
    }
    manifest = Manifest(raw)
    assert [name for name, _ in manifest.entries("inputs")] == ["key"]
    assert manifest.section("golden") == {} and manifest.seed is None and manifest.expect_name is None


def test_a_manifest_breaking_a_rule_is_refused_before_anyone_asks(out, tmp_path):
    case_dir = tmp_path / "broken"
    case_dir.mkdir()
    raw = json.loads((out / "valid" / MANIFEST).read_text())
    raw["expect"] = {"status": "0"}
    (case_dir / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(DataError, match="expect.status"):
        load_manifest(case_dir)
