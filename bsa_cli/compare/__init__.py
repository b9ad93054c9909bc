"""Judge a device's outputs against the golden: metrics, standards, structural checks, verdicts.

The backward's dq, dk, dv; the forward's out and lse (on the rows it writes); all five for the pair (chain,
autograd), each case folder by its op (`manifest.op`, `OP_TENSORS`).

Nothing here prints. `compare_suite` reads case directories and device output directories and returns a
`SuiteResult`; `bsa_cli.report` renders it. The pure core is `judge_tensors` (arrays in, `TensorResult`s
out), in `judge.py`.

The package, from the pure core outwards (each module imports only those above it in this list, and
none imports `bsa_cli.report` or the CLI):

* `results.py`    the results as data: `ErrorStats`, `TensorResult`, `CaseResult`, `SuiteResult` (`Check`,
  the bias check and the standards with their settings are `bsa_cli.standards`'s, a layer below);
* `geometry.py`   how a gradient's rows map to batch entries, heads, positions and blocks; rows that must be 0;
* `buffers.py`, `ulp.py`  the metrics engine's reusable work arrays and fast upcast; ULP errors;
* `metrics.py`    the streaming metrics engine: arrays measured against the golden chunk by chunk;
* `locate.py`     where the errors are: block maps, hot blocks and tiles, worst elements, the ULP chart;
* `structural.py` the checks every standard runs: NaN/Inf, rows that must be 0, padding, all-zero outputs;
* `summary.py`    the benchmark measured once at `bsa gen` and reused by every judgement;
* `judge.py`      `judge_tensors`: the pure core; it measures, the case's standard checks (`judge_tensor`: one tensor);
* `forward.py`    the forward's out and lse judged on the rows it writes, and the `rows-written` check;
* `pair.py`       the pair's causes (`lse-unwritten`, `padding-rows-read`, `scale-mismatch`) and its expected verdict;
* `diagnose/`     a failing case's likely causes, hypotheses recomputed on its failing blocks (`diagnose`);
* `case_files.py` reading a case and an output directory: status, run record, hashes, mapped arrays, and
  outputs given in memory checked against the manifest;
* `verdict.py`    one case to its verdict: `compare_case` (files) and `judge_outcome` (in memory), each step
  asking the case folder's op (`bsa_cli.ops`) what it calls and judges;
* `suite.py`      a suite of cases, in this process or in worker processes: `compare_suite`.
"""

# ruff: noqa: F401  (the names below are the package's: imported here for its users)

from __future__ import annotations

from ..standards import (
    DEFAULT_STANDARD,
    STANDARDS,
    RunSettings,
    Settings,
    case_settings,
    resolve_settings,
    validate_settings,
)
from .geometry import structural_rows
from .judge import judge_tensors
from .results import (
    ERROR,
    FAIL,
    PASS,
    SKIP,
    ULP_CHART_EDGES,
    BlockMap,
    CaseResult,
    Check,
    ErrorStats,
    HotBlock,
    Selection,
    SuiteResult,
    TensorResult,
    UlpChart,
    Verdict,
    WorstElement,
)
from .suite import HASH_THREADS, compare_suite, missing_cases, suite_jobs
from .summary import BenchmarkSummary, summarize_benchmark, summary_document, summary_from_document, summary_key
from .ulp import ULP_BUCKETS, ulp_error
from .verdict import OP_TENSORS, DeviceOutcome, compare_case, judge_outcome
