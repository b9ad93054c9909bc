"""The benchmark summary: the benchmark measured against the golden once, at `bsa gen`, and reused.

Neither the benchmark nor the golden depends on the device, so every judgement of a case can reuse the
figures instead of reading, hashing and measuring the benchmark again.
"""

from __future__ import annotations

import dataclasses
import math
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .._version import __version__
from ..core.case import Case
from ..golden import written_rows
from ..standards import Settings
from ..store.manifest import GRAD_NAMES, json_number
from .buffers import CHUNK_ELEMENTS
from .geometry import _geometry, only_rows
from .metrics import _measure, _params, noise_params
from .results import DEVICE_ONLY_FIELDS, ErrorStats

#: Version of the benchmark summary's arithmetic: a summary of another version is measured again.
SUMMARY_FORMAT = 2


@dataclass(frozen=True)
class BenchmarkSummary:
    """The benchmark (kernel-faithful) outputs measured against the golden once, at `bsa gen`.

    Neither depends on the device, so every judgement of the case can reuse the figures instead of
    reading, hashing and measuring the benchmark again. `key` holds what else they depend on.
    """

    key: Mapping[str, Any]
    stats: Mapping[str, ErrorStats]  # per gradient, as `_measure` gives for the benchmark
    tiles: Mapping[str, np.ndarray]  # per gradient, [rows, ceil(D / 16)] float32 sums of squared errors


def summary_key(case: Case, settings: Settings) -> dict[str, Any]:
    """Return what a benchmark summary depends on besides the golden and benchmark files, as strict JSON.

    The thresholds that shape the benchmark's figures, and what the float32 arithmetic could differ by
    in its last bits: the bsa and NumPy versions and the machine's architecture (a case generated on x86
    and judged on an aarch64 host measures its benchmark again).
    """
    params = _params(case, settings)
    return {
        "format": SUMMARY_FORMAT,
        "bsa": __version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "dtype": case.dtype,
        "err_thd": json_number(params.err_thd),
        "small_value_thd": json_number(params.small_thd),
        "chunk_elements": CHUNK_ELEMENTS,
    }


def summarize_benchmark(
    case: Case,
    settings: Settings,
    golden: Mapping[str, np.ndarray],
    benchmark: Mapping[str, np.ndarray],
    block_mask: np.ndarray | None = None,
) -> BenchmarkSummary:
    """Measure the benchmark against the golden as `judge_tensors` would under `settings`.

    Every tensor the case's standard judges that both mappings hold is measured: dq, dk, dv, and the
    forward's `out` over the rows the forward writes (which needs `block_mask`). lse, judged by a rule of
    its own, is measured at each judgement (its arrays are small).

    Raises:
        ValueError: `out` is given without the block mask.
    """
    params = _params(case, settings)
    stats, tiles = {}, {}
    for name in SUMMARIZED:
        if name not in golden or name not in benchmark:
            continue
        geom = _geometry(case, name)
        if name == "out":
            if block_mask is None:
                raise ValueError("out: summarizing the forward's benchmark needs the block mask (its written rows)")
            geom = only_rows(geom, written_rows(case, block_mask))
        tensor_params = noise_params(params, case, name, golden[name])
        _, _, _, bench_stats, bench_rows = _measure(None, benchmark[name], golden[name], geom, tensor_params)
        assert bench_stats is not None and bench_rows is not None
        stats[name], tiles[name] = bench_stats, bench_rows.tile_sse
    return BenchmarkSummary(summary_key(case, settings), stats, tiles)


#: The tensors a benchmark summary can hold: those the case's standard judges.
SUMMARIZED = ("out", *GRAD_NAMES)


def summary_document(summary: BenchmarkSummary) -> dict[str, Any]:
    """Return a summary's key and figures as strict JSON (the tiles are stored as arrays of their own)."""

    def plain(value: Any) -> Any:
        if isinstance(value, float):
            return json_number(value)
        return list(value) if isinstance(value, tuple) else value

    # msprobe's figures are the device's only: left out (not null), a summary stays readable by a bsa before them
    stats = {
        name: {k: plain(v) for k, v in asdict(s).items() if not (k in DEVICE_ONLY_FIELDS and v is None)}
        for name, s in summary.stats.items()
    }
    return {"key": dict(summary.key), "stats": stats}


def summary_from_document(document: Mapping[str, Any], tiles: Mapping[str, np.ndarray]) -> BenchmarkSummary:
    """Rebuild a summary from `summary_document` and its tiles; ValueError if the document is malformed."""
    try:
        names = [name for name in SUMMARIZED if name in document["stats"]]
        unknown = set(document["stats"]) - set(SUMMARIZED)
        if unknown or not names:
            raise ValueError(f"stats of {sorted(unknown) or 'no tensor'}; a summary holds {', '.join(SUMMARIZED)}")
        stats = {name: ErrorStats(**_stats_fields(document["stats"][name])) for name in names}
        for name, figures in stats.items():  # finite for any real benchmark: NaN would switch the bias check off
            if not all(v is None or math.isfinite(v) for v in (figures.bias, figures.bias_se)):
                raise ValueError(f"{name}: bias {figures.bias!r} ± {figures.bias_se!r} is not finite")
        return BenchmarkSummary(dict(document["key"]), stats, {name: tiles[name] for name in names})
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed benchmark summary ({type(exc).__name__}: {exc})") from None


_BENCHMARK_FIELDS = {f.name: f.type for f in dataclasses.fields(ErrorStats)}


def _stats_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Check and convert a benchmark's `ErrorStats` fields from JSON; ValueError names the first bad one."""
    optional = {*DEVICE_ONLY_FIELDS, "bias", "bias_se"}
    wrong = (set(_BENCHMARK_FIELDS) - optional - set(data)) | (set(data) - set(_BENCHMARK_FIELDS))
    if wrong:  # msprobe's figures may be absent (the device's only); the bias's are absent before format 2
        raise ValueError(f"fields {sorted(wrong)} missing or unknown")
    fields: dict[str, Any] = {}
    for name, value in data.items():
        kind = str(_BENCHMARK_FIELDS[name])
        if value is None and "None" in kind:
            fields[name] = None
        elif kind.startswith("int") and isinstance(value, int) and not isinstance(value, bool):
            fields[name] = value
        elif kind.startswith("float") and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            fields[name] = float(value)  # "inf", "-inf", "nan" as json_number writes them
        elif kind.startswith("tuple") and isinstance(value, list) and all(isinstance(v, int) for v in value):
            fields[name] = tuple(value)
        else:
            raise ValueError(f"{name}: {value!r} is not {kind}")
    return fields
