"""`bsa export --format ttk`: cases for TTK (CANN ops-test-kit, hicann/ops-test-kit), replayed on bsa's data.

Read from hicann/ops-test-kit: `docs/Test_Case_Generation.md` and `docs/Operator_Test_Guides/ACLNN_Case_Writing.md`
(3264c2b6: the ACLNN CSV, one row a case, Python literals in its cells), `docs/Manual_Data_Prepare_and_Replay.md`
(22ddfd72) and `ttk/core_modules/manual_data.py` (055fae80: `--manual-data-dirs DIR` replays `DIR/<case
directory>/` instead of drawing inputs and computing a golden), `ttk/core_modules/aclnn/op_api_info_keeper.py`
(202675b6: tensors and attributes are the aclnn header's parameters by name, in its order) and
`docs/Precision_Comparison.md` (36750932: `--compare` picks one method for a run).

The export writes, per TTK compare method its cases need, `bsa_ttk_<method>.csv`, and `manual_data/` with one
folder per case: its inputs as `input_<i>_<dtype>.bin` (a null tensor as an empty `input_<i>_none.bin`;
the outputs, which TTK allocates itself, are not inputs there) and its golden as
`golden_<j>_<dtype>__shape_<AxB...>.bin`, each a hard link to bsa's verified file (a copy across file
systems: TTK refuses symbolic links). TTK's historical `manual_tensor_binaries` column would name the
files in place, but its ACLNN reader leaves them unread (`npu/op/input_generation.py`, `_use_manual_input`:
a TODO), so the replay folder is the way TTK reads given data.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..compare import case_settings
from ..core.untrusted import entry_path
from ..store import read_array
from .export import Exported, ExportFormat, Files

#: The replay root beside the CSV files.
MANUAL_DATA = "manual_data"

#: A case folder name TTK keeps as it is (`manual_data.case_directory_name`, 055fae80).
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

#: The CSV's columns, in order (the ACLNN columns bsa fills; TTK's common ones `precision_tolerances`,
#: `absolute_precision`, `is_enabled` and `remark`).
COLUMNS = (
    "testcase_name",
    "api_name",
    "tensor_view_shapes",
    "tensor_dtypes",
    "output_tensor_indexes",
    "attributes",
    "precision_tolerances",
    "absolute_precision",
    "is_enabled",
    "remark",
)


def case_directory(name: str) -> str:
    """The folder TTK looks for a case's data in (`case_directory_name` of manual_data.py 055fae80): the name
    itself when it holds only [A-Za-z0-9_.-] (at most 120), else sanitized with 12 hex digits of its SHA-256."""
    safe = _SAFE.sub("_", name).strip("._") or "case"
    if safe == name and len(safe) <= 120:
        return safe
    return f"{safe[:96]}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:12]}"


def _shape_token(shape: Sequence[int]) -> str:
    return "x".join(str(int(n)) for n in shape) if len(shape) else "scalar"


def _cell(value: str) -> str:
    """A CSV cell: quoted, quotes doubled (TTK reads the CSV with Python's csv module)."""
    return '"' + value.replace('"', '""') + '"'


def _row(case: Exported) -> tuple[str, dict[str, str]]:
    """Return a case's TTK compare method and its CSV row (column -> cell text)."""
    manifest, call = case.manifest, case.call
    inputs = dict(manifest.entries("inputs"))
    outputs = dict(manifest.entries("outputs"))
    described = [inputs.get(name) for name, _ in call.tensors] + [outputs.get(name) for name, _ in call.outputs]
    shapes = tuple(None if entry is None else tuple(int(n) for n in entry["shape"]) for entry in described)
    dtypes = tuple(None if entry is None else str(entry["dtype"]) for entry in described)
    indexes = tuple(range(len(call.tensors), len(call.tensors) + len(call.outputs)))
    attributes = {name: value for name, _, value in call.attributes(manifest.params)}
    settings = case_settings(manifest.case)
    standard = settings.standard
    row = {
        "testcase_name": manifest.name,
        "api_name": call.aclnn,
        "tensor_view_shapes": repr(shapes),
        "tensor_dtypes": repr(dtypes),
        "output_tensor_indexes": repr(indexes),
        "attributes": repr(attributes),
        "is_enabled": "True",
    }
    remark = f"bsa {case.case_dir}: judged by {settings.label}"
    if standard.ttk_note:
        remark += f"; {standard.ttk_note}"
    if manifest.is_negative:
        # TTK has no column for an expected error status: the case is listed, off
        row["is_enabled"] = "False"
        remark = (
            f"bsa {case.case_dir}: a negative case, the call must return aclnn status {manifest.expect_status} "
            f"({manifest.expect_name}); TTK has no column for an expected error"
        )
    else:
        row.update(standard.ttk_fields(settings.thresholds, len(call.outputs)))
    row["remark"] = remark
    return standard.ttk_compare, row


def _data(case: Exported) -> Files:
    """Return a case's replay folder: its inputs and golden as TTK's file names, each a verified file of bsa's."""
    manifest, call = case.manifest, case.call
    folder = f"{MANUAL_DATA}/{case_directory(manifest.name)}"
    inputs = dict(manifest.entries("inputs"))
    golden = dict(manifest.entries("golden"))
    files: Files = {}
    for index, (name, _) in enumerate(call.tensors):
        entry = inputs.get(name)
        files[f"{folder}/input_{index}_{'none' if entry is None else entry['dtype']}.bin"] = (
            "" if entry is None else _verified(case, entry)
        )
    for index, (name, _) in enumerate(call.outputs):
        entry = golden.get(name)
        if entry is None:  # a negative case: nothing to compare
            files[f"{folder}/golden_{index}_none.bin"] = ""
        else:
            token = _shape_token(entry["shape"])
            files[f"{folder}/golden_{index}_{entry['dtype']}__shape_{token}.bin"] = _verified(case, entry)
    return files


def _verified(case: Exported, entry: Any) -> Path:
    """The file of a manifest entry after checking its size and sha256 against the manifest."""
    read_array(case.case_dir, entry)
    return entry_path(case.case_dir, entry)


class Ttk(ExportFormat):
    name = "ttk"
    help = "CANN ops-test-kit ACLNN CSV with a manual_data replay folder"

    def files(self, cases: Sequence[Exported], out_dir: Path, notes: Callable[[list[str], list[str]], None]) -> Files:
        rows: dict[str, list[dict[str, str]]] = {}
        files: Files = {}
        for case in cases:
            method, row = _row(case)
            rows.setdefault(method, []).append(row)
            files.update(_data(case))
        for method, found in sorted(rows.items()):
            lines = [",".join(COLUMNS)]
            lines += [
                ",".join(_cell(row.get(column, "")) if row.get(column) else "" for column in COLUMNS) for row in found
            ]
            files[csv_name(method)] = "\n".join(lines) + "\n"
        # an earlier export's CSV of a method this one has no case of would point at data replaced now
        for stale in sorted(out_dir.glob("bsa_ttk_*.csv")) if out_dir.is_dir() else []:
            files.setdefault(stale.name, None)
        return files

    def how_to_run(self, files: Files, out_dir: Path) -> list[str]:
        return [
            f"python3 -m ttk aclnn -i {out_dir / name} --manual-data-dirs {out_dir / MANUAL_DATA} "
            f"--compare {name[len('bsa_ttk_') : -len('.csv')]}"
            for name, content in files.items()
            if name.startswith("bsa_ttk_") and name.endswith(".csv") and content is not None
        ]


def csv_name(method: str) -> str:
    """The CSV of the cases TTK judges by `method` (one `--compare` per run)."""
    return f"bsa_ttk_{method}.csv"
