"""What the tests share: one factory for each thing many tests build, and one way to call the CLI, a module
per job; this package re-exports every name, so test files write `from tests.helpers import make_case`.

- `paths`: `REPO`, `CASES`, `TESTS` and the data folders, whatever folder a test file is in.
- `cases`: `make_case` / `case_factory`, a frozen `Case` from the house defaults (a small BNSD float16 case)
  or a file's own defaults, `scale=None` meaning 1/sqrt(head_dim); the small specs `SPEC` and `BASE`.
- `case_dirs`: `write_case_dir`, a tiny case directory with random values (for the runner: it never looks
  at values); `build_case`, a complete one (inputs, golden, benchmark) with the reference device's outputs;
  the outputs read and replaced; `draw_forward`; `digest`.
- `op_folders`: the folders of the other ops (`NAME@forward`, ...), with or without golden and outputs.
- `runs`: `fake_device`, tests/bin/fake_device.py copied as an executable device binary; run records; the
  stand-in torch_npu's environment.
- `cli`: `invoke`, `bsa ARGS` in process through click's CliRunner.
- `snapshots`: `assert_snapshot`, a text compared with tests/snapshots/NAME (conftest.py's `snapshot`
  fixture decides whether a missing or changed snapshot is written); `Page`, an HTML report's elements.
- `results`: hand-built results and suites for the reports' tests.

Test files import from here (`from tests.helpers import ...`), never from one another.
"""

from __future__ import annotations

from tests.helpers.case_dirs import (
    build_case,
    digest,
    draw_forward,
    make_inputs,
    read_grad,
    rewrite_grad,
    write_case_dir,
    write_outputs,
)
from tests.helpers.cases import BASE, CASE_DEFAULTS, SPEC, case_factory, make_case
from tests.helpers.cli import invoke
from tests.helpers.op_folders import OP_INPUT_NAMES, build_judged_op_folder, build_op_folder, op_outputs, read_output
from tests.helpers.paths import CASES, FAKE_DEVICE, REPO, SNAPSHOTS, STANDIN, STANDIN_FAULT, TESTS
from tests.helpers.results import (
    case,
    check,
    op_result,
    op_tensor,
    ops_suite,
    sample_suite,
    skipped_result,
    stats,
    tensor,
)
from tests.helpers.runs import fake_device, read_record, run_options, run_record, standin_env
from tests.helpers.snapshots import Page, assert_snapshot

__all__ = [
    "assert_snapshot",
    "BASE",
    "build_case",
    "build_judged_op_folder",
    "build_op_folder",
    "case",
    "CASE_DEFAULTS",
    "case_factory",
    "CASES",
    "check",
    "digest",
    "draw_forward",
    "FAKE_DEVICE",
    "fake_device",
    "invoke",
    "make_case",
    "make_inputs",
    "OP_INPUT_NAMES",
    "op_outputs",
    "op_result",
    "op_tensor",
    "ops_suite",
    "Page",
    "read_grad",
    "read_output",
    "read_record",
    "REPO",
    "rewrite_grad",
    "run_options",
    "run_record",
    "sample_suite",
    "skipped_result",
    "SNAPSHOTS",
    "SPEC",
    "STANDIN",
    "standin_env",
    "STANDIN_FAULT",
    "stats",
    "tensor",
    "TESTS",
    "write_case_dir",
    "write_outputs",
]
