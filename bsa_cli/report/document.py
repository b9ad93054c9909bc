"""The JSON report: the faithful image of the result dataclasses, read back and merged across shards.

JSON schema "bsa-compare/1" (docs/compare.md describes every key): a document is
`{schema, schema_minor, tool, date, host, devices, exit_code, summary, cases: [case...]}` (with a baseline
also `drift` and `regressions`); each case carries its verdict, message, headline,
deciding check, settings, checks and errors, and per tensor the device and benchmark metrics, checks, worst
elements, hot blocks and the per-block error map. Non-finite numbers are written as the strings
"inf", "-inf" and "nan" (JSON has no such numbers); NaN cells of block maps as null.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import json
import math
import types
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..compare import ERROR, FAIL, PASS, SKIP, CaseResult, SuiteResult, drift
from ..compare.results import SELECTION_MAX_CELLS, BlockMap, HotBlock, Selection, TensorResult, UlpChart
from ..core.errors import DataError, show
from ..core.untrusted import load_json, read_regular
from ..ops import OPS, Op
from ..standards.base import Standard
from ..store.manifest import json_number
from . import timing
from .files import write_text_atomic
from .formatting import is_op
from .header import ReportHeader, report_header

#: The verdicts a report's case may have; a report with another is malformed.
VERDICTS = (PASS, FAIL, ERROR, SKIP)

#: The JSON report format; a reader refuses any other.
SCHEMA = "bsa-compare/1"

#: Largest JSON report read as a baseline or a night of `bsa trend` (as `bsa compare --merge`).
REPORT_MAX_BYTES = 1 << 30

#: Keys added within "bsa-compare/1": 1 added `schema_minor`, `date`, `host`, `devices` (and, with a
#: baseline, `drift` and `regressions`); 2 added `inputs_sha256` per case and `drift.inputs_changed`; 3 added
#: `diagnosis` (a failing case's likely causes: `{kind, score, evidence, tensors, where}`) and `hypotheses`
#: (every hypothesis the diagnosis tried: `{kind, supposes, score, outcome}`) per case; 4 added `op` (the
#: operator call judged: forward, backward, chain, autograd; `name` is the case folder, `NAME@op` for ops other
#: than the backward), `case` (the case's name) and `expected_failure` (a pair that fails as it must: a PASS)
#: per case, the verdict SKIP (its `errors` say why) and `summary.skipped`; a document without `schema_minor`
#: is minor 0, a case without `op` judges the backward; 5 added per tensor `matched_ratio` and `max_abs_error`
#: (mixed tolerance's), `sides` (the checks of each side-by-side standard that does not decide), per case
#: `side_verdicts` ({standard label: PASS|FAIL}) and `summary.verdicts_differ` (the cases whose verdicts differ).
SCHEMA_MINOR = 5


def _map_cells(array: np.ndarray) -> Any:
    """Return a block map as nested lists, 6 significant digits, NaN as null, Inf as "inf"."""
    if array.ndim == 0:
        value = float(array)
        return None if math.isnan(value) else json_number(float(f"{value:.6g}"))
    return [_map_cells(row) for row in array]


def _plain(value: Any) -> Any:
    """Return `value` (dataclasses, tuples, mappings, arrays, numbers) as JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return _map_cells(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return json_number(float(value))
    return value


def case_document(case: CaseResult) -> dict[str, Any]:
    """Return one case as a JSON-ready dict, with its derived `message` and `deciding` check."""
    document = _plain(case)
    document.update(case=case.case_name, message=case.message, headline=case.headline, deciding=_plain(case.deciding))
    document["side_verdicts"] = case.side_verdicts
    for key in ("kernel_time", "untimed"):  # only a timed run's report holds them
        if not document[key]:
            del document[key]
    for time, data in zip(case.kernel_time, document.get("kernel_time", ()), strict=True):
        data["tflops"] = json_number(time.tflops) if time.tflops is not None else None
        data["peak_share"] = json_number(time.peak_share) if time.peak_share is not None else None
    for tensor, data in zip(case.tensors, document["tensors"], strict=True):
        data["passed"] = tensor.passed
        data.update(matched_ratio=_plain(tensor.matched_ratio), max_abs_error=_plain(tensor.max_abs_error))
    return document


def utc_date(date: str) -> str:
    """Return an ISO 8601 date with an offset as the same moment in UTC (a date without one is kept)."""
    try:
        moment = _dt.datetime.fromisoformat(date)
        return date if moment.tzinfo is None else moment.astimezone(_dt.timezone.utc).isoformat(timespec="seconds")
    except (ValueError, OverflowError):  # OverflowError: a moment beyond year 1 to 9999 in UTC
        return date


def suite_devices(suite: SuiteResult) -> list[dict[str, Any]]:
    """Return who produced the suite's outputs, one entry per distinct device, most cases first:
    `{"device": words, "kind", "name", "fault", "binary_sha256", "cases"}` (from each case's run record; a
    SKIP produced no outputs and counts for none)."""
    counts: Counter[tuple[Any, ...]] = Counter()
    for case in suite.cases:
        if case.verdict == SKIP:
            continue
        counts[(provenance_label(case), case.device_kind, case.device, case.fault, case.binary_sha256)] += 1
    return [
        {"device": label, "kind": kind, "name": name, "fault": fault, "binary_sha256": sha, "cases": count}
        for (label, kind, name, fault, sha), count in counts.most_common()
    ]


def provenance_label(case: CaseResult) -> str:
    """Return a short name of who produced a case's outputs: the reference device with its planted fault,
    a binary with the start of its sha256, torch_npu, or "not recorded"."""
    if case.device is None:
        return "not recorded"
    if case.binary_sha256:
        return f"{case.device} (sha256 {case.binary_sha256[:12]})"
    if case.device_kind == "reference" and case.fault and case.fault not in case.device:
        return f"{case.device} with fault '{case.fault}'"
    return case.device


def to_document(
    suite: SuiteResult, header: ReportHeader | None = None, additions: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Return the whole result as the "bsa-compare/1" JSON document.

    Args:
        header: when and where the result was judged (default: now, this machine); its date is written in UTC.
        additions: top-level keys to add or replace (a baseline's `drift`, `regressions`, `exit_code`).
    """
    head = header or report_header(suite)
    document = {
        "schema": SCHEMA,
        "schema_minor": SCHEMA_MINOR,
        "tool": {"name": "bsa", "version": __version__},
        "date": utc_date(head.date),
        "host": head.host,
        "devices": suite_devices(suite),
        "exit_code": suite.return_code,
        "summary": {
            "cases": len(suite.cases),
            "passed": suite.count(PASS),
            "failed": suite.count(FAIL),
            "errors": suite.count(ERROR),
            "skipped": suite.count(SKIP),
            "output_bytes": suite.output_bytes,
            "seconds": round(suite.seconds, 3),
            "verdicts_differ": [c.name for c in suite.cases if c.verdicts_differ],
        },
        "cases": [case_document(c) for c in suite.cases],
    }
    if timed := timing.timed(suite):
        document["kernel_time"] = [
            {**_plain(total), "tflops": None if total.tflops is None else json_number(total.tflops)}
            for total in timing.totals(timed)
        ]
    document.update(additions or {})
    return document


def write_json(
    suite: SuiteResult, path: Path, header: ReportHeader | None = None, additions: Mapping[str, Any] | None = None
) -> None:
    """Write the JSON report to `path` (see `to_document`)."""
    write_text_atomic(Path(path), json.dumps(to_document(suite, header, additions), indent=1, allow_nan=False) + "\n")


class _Malformed(ValueError):
    """A report's value is not what its field holds; `path` names the field (`cases[0].tensors[1].rmse`)."""

    def __init__(self, problem: str, path: str = "") -> None:
        super().__init__(problem)
        self.problem, self.path = problem, path

    def within(self, step: str) -> _Malformed:
        """Return the error one level up: `step` (".name" or "[3]") before its field's path."""
        return _Malformed(self.problem, step + self.path)


#: Reads one JSON value as a field of a result type; raises _Malformed.
_Reader = typing.Callable[[Any], Any]

#: Largest integer a report's field may hold (int64: counts, sizes, statuses, indices).
INT_LIMIT = 1 << 63


def _kind(data: Any) -> str:
    """Name a JSON value's type as JSON does, for an error message."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "a boolean"
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return next((name for kind, name in names.items() if isinstance(data, kind)), type(data).__name__)


def _read_float(data: Any) -> float:
    # isinstance, not type(): a document made in memory (`to_document`) holds str and float subclasses
    if isinstance(data, float) or (_is_int(data) and -INT_LIMIT <= data < INT_LIMIT):
        return float(data)
    if isinstance(data, str) and data in NON_FINITE:
        return float(data)
    raise _Malformed(f"expected a number, got {_kind(data) if not isinstance(data, str) else repr(data[:40])}")


#: The strings a report writes for the numbers JSON lacks (`json_number`).
NON_FINITE = ("inf", "-inf", "nan")


def _read_int(data: Any) -> int:
    if _is_int(data) and -INT_LIMIT <= data < INT_LIMIT:
        return int(data)
    raise _Malformed(f"expected an integer, got {'one beyond int64' if _is_int(data) else _kind(data)}")


def _is_int(data: Any) -> bool:
    return isinstance(data, int) and not isinstance(data, bool)


def _simple(kind: type) -> _Reader:
    def read(data: Any) -> Any:
        if not isinstance(data, kind) or (kind is not bool and isinstance(data, bool)):
            raise _Malformed(f"expected {_kind(kind())}, got {_kind(data)}")
        return data

    return read


def _read_cells(data: Any) -> np.ndarray:
    """Read a block map's cells: nested lists of numbers, null (NaN) and the non-finite strings, rectangular."""
    if not isinstance(data, list):
        raise _Malformed(f"expected a list of cells, got {_kind(data)}")
    level, depth = data, 1
    while level and all(isinstance(v, list) for v in level):  # flattened one level at a time: C loops, not calls
        level, depth = [v for row in level for v in row], depth + 1
    kinds = set(map(type, level))
    words = {v for v in level if isinstance(v, str)}
    cells = all(k is type(None) or (issubclass(k, (int, float, str)) and not issubclass(k, bool)) for k in kinds)
    if not cells or not words <= set(NON_FINITE):
        raise _Malformed("expected numbers, null, 'inf', '-inf' or 'nan' as cells, nested alike")
    try:
        array = np.array(data, dtype=np.float64)  # null becomes NaN, "inf" inf
    except (ValueError, TypeError, OverflowError):
        raise _Malformed("expected cells nested alike (every row of one length)") from None
    if array.ndim != depth:
        raise _Malformed("expected cells nested alike (every row of one length)")
    return array


def _read_op(data: Any) -> Any:
    if not is_op(data):
        raise _Malformed(f"expected an op, one of {', '.join(OPS)}, got {_show_value(data)}")
    return data


def _show_value(data: Any) -> str:
    return repr(data[:40]) if isinstance(data, str) else _kind(data)


#: Readers of the types a result's fields have that are not built from their structure.
_READERS: dict[Any, _Reader] = {
    float: _read_float,
    int: _read_int,
    str: _simple(str),
    bool: _simple(bool),
    np.ndarray: _read_cells,
    Op: _read_op,
    Standard: _simple(str),  # a report of another bsa may name a standard this one lacks
}


@functools.cache
def _reader(tp: Any) -> _Reader:
    """Return the reader of JSON values of type `tp` (a result dataclass or a field's type), built once per
    type: reading a report costs a few calls per value, not the type's introspection per record."""
    if tp in _READERS:
        return _READERS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = _reader(next(a for a in args if a is not type(None)))
        return lambda data: None if data is None else inner(data)
    if origin is typing.Literal:
        allowed = frozenset(args)

        def literal(data: Any) -> Any:
            if not isinstance(data, str) or data not in allowed:
                raise _Malformed(f"expected one of {', '.join(map(str, args))}, got {_show_value(data)}")
            return data

        return literal
    if origin is tuple:
        return _tuple_reader(args)
    if origin in (Mapping, dict) or tp in (dict, Mapping):
        value = _reader(args[1]) if len(args) == 2 else (lambda data: data)
        return lambda data: {k: _step(value, v, _key_step(k)) for k, v in _object(data).items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_reader(tp)
    raise TypeError(f"no report reader for the type {tp!r}")  # a result field of a new type: a bug in bsa


def _key_step(key: str) -> str:
    """Name a mapping's key in a field's path: `.mare_ratio`, `.mixed-tolerance` (cut to 40 characters)."""
    return f".{key[:40]}"


def _object(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise _Malformed(f"expected an object, got {_kind(data)}")
    return data


def _step(read: _Reader, data: Any, step: str) -> Any:
    try:
        return read(data)
    except _Malformed as exc:
        raise exc.within(step) from None


def _tuple_reader(args: tuple[Any, ...]) -> _Reader:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _reader(args[0])

        def many(data: Any) -> tuple[Any, ...]:
            if not isinstance(data, list):
                raise _Malformed(f"expected a list, got {_kind(data)}")
            return tuple([_step(item, v, f"[{i}]") for i, v in enumerate(data)])

        return many
    readers = [_reader(a) for a in args]

    def fixed(data: Any) -> tuple[Any, ...]:
        if not isinstance(data, list) or len(data) != len(readers):
            size = f" of {len(data)}" if isinstance(data, list) else ""
            raise _Malformed(f"expected a list of {len(readers)}, got {_kind(data)}{size}")
        return tuple([_step(r, v, f"[{i}]") for i, (r, v) in enumerate(zip(readers, data, strict=True))])

    return fixed


def _rule(holds: bool, problem: str) -> None:
    if not holds:
        raise _Malformed(problem)


def _check_tensor(tensor: TensorResult) -> None:
    axes = tensor.axes
    _rule(len(tensor.shape) == len(axes), f"shape {list(tensor.shape)} and axes {list(axes)} differ in length")
    _rule(all(c.tensor == tensor.name for c in tensor.checks), f"a check of tensor {tensor.name!r} names another")
    for i, worst in enumerate(tensor.worst):
        needs = [*axes, *(("b", "s") if "t" in worst.coords else ())]
        placed = len(worst.index) == len(axes) and all(a in worst.coords for a in needs)
        _rule(placed, f"worst[{i}] does not place its element on the axes {', '.join(needs)}")


def _check_block_map(block_map: BlockMap) -> None:
    maps = (block_map.rmse, block_map.rmse_benchmark, block_map.max_abs_err, block_map.score)
    arrays = [a for a in maps if a is not None]
    alike = all(a.ndim == 3 and a.shape == arrays[0].shape for a in arrays)
    _rule(alike, "expected maps of one shape [B, heads, blocks]")
    _rule(block_map.axis in ("q", "kv") and block_map.block_size > 0, "expected axis 'q' or 'kv', a block_size > 0")


def _check_hot_block(block: HotBlock) -> None:
    _rule(block.tiles is None or block.tiles.ndim == 2, "expected tiles of two dimensions")


def _check_selection(selection: Selection) -> None:
    shape = selection.shape
    fits = len(shape) == 4 and min(shape) >= 0 and math.prod(shape) <= SELECTION_MAX_CELLS
    _rule(fits, f"expected a mask shape [B, N1, nQ, nKV] of at most {SELECTION_MAX_CELLS} cells")
    rows = selection.rows
    alike = len(rows) == math.prod(shape[:3]) and all(len(r) == shape[3] and set(r) <= set("01-") for r in rows)
    _rule(alike, "expected one row of '0', '1' and '-' per batch entry, head and query block")


def _check_ulp_chart(chart: UlpChart) -> None:
    bins = len(chart.edges) + 1
    sides = [chart.device, *([chart.benchmark] if chart.benchmark is not None else [])]
    counted = all(len(counts) == bins and min(counts, default=0) >= 0 for counts in sides)
    _rule(counted, f"expected {bins} counts of at least 0 per side")


def _check_case(case: CaseResult) -> None:
    sizes = math.isfinite(case.seconds) and case.seconds >= 0 and case.output_bytes >= 0
    _rule(sizes, "expected seconds and output_bytes of at least 0")


#: Rules beyond the types of a result's fields, by result type: what the renderers rely on.
_CHECKS: dict[type, typing.Callable[[Any], None]] = {
    TensorResult: _check_tensor,
    BlockMap: _check_block_map,
    HotBlock: _check_hot_block,
    Selection: _check_selection,
    UlpChart: _check_ulp_chart,
    CaseResult: _check_case,
}


def _dataclass_reader(tp: type) -> _Reader:
    hints = typing.get_type_hints(tp)
    fields = [
        (f.name, _reader(hints[f.name]), f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(tp)
    ]
    check = _CHECKS.get(tp)

    def read(data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise _Malformed(f"expected an object ({tp.__name__}), got {_kind(data)}")
        values = {}
        for name, field_reader, required in fields:
            if name in data:
                values[name] = _step(field_reader, data[name], f".{name}")
            elif required:
                raise _Malformed(f"missing key {name!r} of {tp.__name__}")
        try:
            value = tp(**values)
        except (TypeError, ValueError) as exc:  # a result type's own rule (__post_init__)
            raise _Malformed(str(exc)[:200]) from None
        if check is not None:
            check(value)
        return value

    return read


def from_document(document: Mapping[str, Any], origin: str = "report") -> SuiteResult:
    """Rebuild a `SuiteResult` from a JSON report.

    Raises:
        ValueError: not a "bsa-compare/1" document, or a malformed one.
    """
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, Mapping) else None
        raise ValueError(f"{origin}: schema {show(found)} is not {SCHEMA!r} (write it with `bsa compare --json`)")
    try:
        cases = _step(_reader(tuple[CaseResult, ...]), document.get("cases"), "cases")
        summary = _step(_object, document.get("summary", {}), "summary")
        seconds = _step(_read_float, summary.get("seconds", 0.0), "summary.seconds")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise _Malformed("expected a number of at least 0", "summary.seconds")
    except _Malformed as exc:
        raise ValueError(f"{origin}: malformed report ({exc.path}: {exc.problem})") from None
    names = Counter(case.name for case in cases)
    if twice := [name for name, count in names.items() if count > 1]:
        raise ValueError(
            f"{origin}: malformed report (case {twice[0]!r} appears {names[twice[0]]} times; a report "
            "names each case once)"
        )
    return SuiteResult(cases, seconds)


def merge(documents: Sequence[tuple[str, Mapping[str, Any]]]) -> SuiteResult:
    """Merge the JSON reports of several shards into one result (cases in the order given).

    Raises:
        ValueError: a document is not a valid report, or a case appears in two of them.
    """
    cases: list[CaseResult] = []
    seen: dict[str, str] = {}
    seconds = 0.0
    for origin, document in documents:
        suite = from_document(document, origin)
        for case in suite.cases:
            if case.name in seen:
                raise ValueError(
                    f"case {case.name!r} is in both {seen[case.name]} and {origin}: shards must not overlap"
                )
            seen[case.name] = origin
            cases.append(case)
        seconds += suite.seconds
    return SuiteResult(tuple(cases), seconds)


def merged_header(documents: Sequence[tuple[str, Mapping[str, Any]]], out: Sequence[str] = ()) -> ReportHeader | None:
    """Return the header of merged shard reports: the latest of their dates (when the last shard was
    judged), their hosts and bsa versions (distinct, in order); None when no shard carries a date."""
    dates: list[_dt.datetime] = []
    hosts: dict[str, None] = {}
    versions: dict[str, None] = {}
    for _, document in documents:
        try:
            moment = drift.parse_date(document.get("date")) if isinstance(document, Mapping) else None
        except ValueError:
            continue
        if moment is None:
            continue
        dates.append(moment)
        if isinstance(document.get("host"), str):
            hosts[document["host"][:200]] = None
        tool = document.get("tool")
        if isinstance(tool, Mapping) and isinstance(tool.get("version"), str):
            versions[tool["version"][:40]] = None
    if not dates:
        return None
    latest = max(dates).isoformat(timespec="seconds")
    return ReportHeader(latest, ", ".join(versions) or __version__, ", ".join(hosts) or "-", tuple(out))


def read_report(path: Path, max_bytes: int | None = None) -> Any:
    """Read a JSON report file (a regular file of at most `max_bytes`, default REPORT_MAX_BYTES: a baseline,
    a night of `bsa trend`) and return its parsed JSON.

    Raises:
        ValueError: the file cannot be read, is too large or is not JSON; the message names the file.
    """
    try:
        data = read_regular(Path(path), REPORT_MAX_BYTES if max_bytes is None else max_bytes)
    except DataError as exc:
        raise ValueError(f"{path}: cannot read JSON report: {exc.message}") from None
    try:
        return load_json(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path}: not valid JSON: {str(exc)[:200]}") from None


def night_from_document(document: Any, source: str) -> drift.Night:
    """Read a "bsa-compare/1" document back as a `Night`.

    Raises:
        ValueError: not a report, a malformed one, or a malformed date; the message names `source`.
    """
    suite = from_document(document, source)
    try:
        date = drift.parse_date(document.get("date"))
    except ValueError as exc:
        raise ValueError(f"{source}: malformed report (field 'date': {exc})") from None
    tool = document.get("tool")
    version = tool.get("version") if isinstance(tool, Mapping) else None
    devices = tuple(d["device"] for d in suite_devices(suite))
    return drift.Night(source, date, _text_or_none(document.get("host")), _text_or_none(version), devices, suite)


def _text_or_none(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None
