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
from ..core.errors import DataError
from ..core.untrusted import load_json, read_regular
from ..ops import OPS
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
    except ValueError:
        return date
    return date if moment.tzinfo is None else moment.astimezone(_dt.timezone.utc).isoformat(timespec="seconds")


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


def _load(tp: Any, data: Any) -> Any:
    """Build a value of type `tp` from JSON data (the inverse of `_plain`)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if data is None else _load(args[0], data)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object for {tp.__name__}, got {data!r}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = _load(hints[f.name], data[f.name])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{tp.__name__}: missing key {f.name!r}")
        return tp(**kwargs)
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"expected a list, got {type(data).__name__}")
        items = typing.get_args(tp)
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_load(items[0], v) for v in data)
        return tuple(_load(a, v) for a, v in zip(items, data, strict=True))
    if origin in (Mapping, dict, typing.Mapping) or tp in (dict, Mapping):
        if not isinstance(data, Mapping):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        pair = typing.get_args(tp)
        value_type = pair[1] if len(pair) == 2 else Any
        return {k: _load(value_type, v) for k, v in data.items()}
    if tp is np.ndarray:
        return np.array(_cells_back(data), dtype=np.float64)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float, str)):
            raise ValueError(f"expected a number, got {type(data).__name__}")
        if isinstance(data, str) and data not in ("inf", "-inf", "nan"):
            raise ValueError(f"expected a number, got {data[:40]!r}")
        return float(data)  # also "inf", "-inf", "nan"
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise ValueError(f"expected an integer, got {type(data).__name__}")
        return data
    if tp in (str, bool) and not isinstance(data, tp):
        raise ValueError(f"expected {tp.__name__}, got {type(data).__name__}")
    return data


def _cells_back(data: Any) -> Any:
    if isinstance(data, list):
        return [_cells_back(v) for v in data]
    return math.nan if data is None else float(data)


def from_document(document: Mapping[str, Any], origin: str = "report") -> SuiteResult:
    """Rebuild a `SuiteResult` from a JSON report.

    Raises:
        ValueError: not a "bsa-compare/1" document, or a malformed one.
    """
    if not isinstance(document, Mapping) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, Mapping) else None
        raise ValueError(f"{origin}: schema {found!r} is not {SCHEMA!r} (write it with `bsa compare --json`)")
    try:
        cases = tuple(_load(CaseResult, c) for c in document["cases"])
        seconds = float(document.get("summary", {}).get("seconds", 0.0))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
        raise ValueError(f"{origin}: malformed report ({type(exc).__name__}: {str(exc)[:200]})") from None
    for case in cases:
        if case.verdict not in VERDICTS:
            raise ValueError(
                f"{origin}: malformed report (case {case.name!r} has the verdict {case.verdict[:40]!r}; "
                f"a verdict is one of {', '.join(VERDICTS)})"
            )
        if not is_op(case.op):
            raise ValueError(
                f"{origin}: malformed report (case {case.name!r} has the op {str(case.op)[:40]!r}; an op is one "
                f"of {', '.join(OPS)})"
            )
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
        raise ValueError(f"{source}: {exc}") from None
    tool = document.get("tool")
    version = tool.get("version") if isinstance(tool, Mapping) else None
    devices = tuple(d["device"] for d in suite_devices(suite))
    return drift.Night(source, date, _text_or_none(document.get("host")), _text_or_none(version), devices, suite)


def _text_or_none(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None
