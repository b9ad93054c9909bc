"""Where things are: the repository, its cases/, tests/ and the data folders under it (test files name
`REPO / "scripts"`, `CASES / "edge.yaml"`, never `__file__`'s parents)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
"""tests/: helpers, oracles and data folders; the test files are one folder down, by what they test."""
REPO = TESTS.parent
"""The repository root: test files name `REPO / "scripts"`, `CASES / "edge.yaml"`, never `__file__`'s parents."""
CASES = REPO / "cases"
FAKE_DEVICE = TESTS / "bin" / "fake_device.py"
SNAPSHOTS = TESTS / "snapshots"
STANDIN = TESTS / "torch_npu_standin"
STANDIN_FAULT = "BSA_TORCH_NPU_STANDIN_FAULT"
