"""Write generated cases in the ecosystem's test-case formats: msOpST and ATK, pointing at the case's .bin files.

Both formats describe one call of aclnnBlockSparseAttentionGrad: its tensors (dtype, shape, where the data
is), its attributes, and what to expect. Every field bsa fills, and how, is in docs/export.md.

* msOpST (MindStudio op system test): a JSON list holding one case, `case_name`, `op`, `input_desc`,
  `output_desc`, `attr`, `expect`, `error_threshold`, and `calc_expect_func_file`, a function of the
  Python module `bsa_msopst_expect.py` written beside the cases that returns the case's golden
  dq, dk, dv, so msOpST judges the device against bsa's golden.
* ATK (the ops-transformer test kit's case JSON): `id`, `name`, `aclnn_name`, `api_type`, `standard`,
  `inputs` (tensors and attributes), `outputs`, `default_seed`; each tensor names its .bin file.

Nothing here judges or runs anything; `export_cases` reads manifests and writes JSON (and the expect module).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..compare import case_settings
from ..core.errors import DataError
from ..core.untrusted import read_regular
from ..ops import interface
from ..store import load_manifest, read_array
from ..store.manifest import GRAD_NAMES, Manifest, json_number
from .files import write_text_atomic

FORMATS = ("msopst", "atk")
OP_TYPE = "BlockSparseAttentionGrad"
ACLNN_NAME = "aclnnBlockSparseAttentionGrad"
EXPECT_MODULE = "bsa_msopst_expect.py"

#: The operator's tensor arguments, in its order, by manifest name.
INPUT_ORDER = ("dout", "query", "key", "value", "attention_out", "softmax_lse", "block_sparse_mask", "atten_mask")
#: Manifest names -> the aclnn interface's argument names.
OP_NAMES = {name: re.sub(r"_(\w)", lambda m: m[1].upper(), name) for name in (*INPUT_ORDER, *GRAD_NAMES)}
REQUIRED = {"atten_mask": False}


def _attributes(params: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """Return the call's attributes as (aclnn name, type, value), lengths as every caller passes them."""
    q_lengths, kv_lengths = interface.call_lengths(params)
    block_shape = params.get("block_shape")
    return [
        ("blockShape", "list_int", list(block_shape) if block_shape is not None else None),
        ("actualSeqLengths", "list_int", q_lengths),
        ("actualSeqLengthsKv", "list_int", kv_lengths),
        ("qInputLayout", "string", params.get("layout")),
        ("kvInputLayout", "string", params.get("kv_layout", params.get("layout"))),
        ("numKeyValueHeads", "int", params.get("num_kv_heads")),
        ("maskType", "int", params.get("mask_type", 0)),
        ("scaleValue", "double", params.get("scale")),
        ("preTokens", "int", params.get("pre_tokens")),
        ("nextTokens", "int", params.get("next_tokens")),
    ]


def _tensors(manifest: Manifest) -> list[tuple[str, Mapping[str, Any]]]:
    """Return the input entries the call passes, in the operator's order (a null tensor is absent)."""
    inputs = dict(manifest.entries("inputs"))
    return [(name, inputs[name]) for name in INPUT_ORDER if name in inputs]


def _value_range(case_dir: Path, entry: Mapping[str, Any]) -> list[float] | None:
    """Return [min, max] of a tensor's finite values (read from its .bin), None when it holds none."""
    values = np.asarray(read_array(case_dir, entry), dtype=np.float64)
    finite = values[np.isfinite(values)]
    return [_number(float(finite.min())), _number(float(finite.max()))] if finite.size else None


def _number(value: float) -> float | int:
    """A JSON-friendly number: integers plainly, floats with 7 significant digits."""
    return int(value) if float(value).is_integer() else float(f"{value:.7g}")


def _function_name(case_name: str) -> str:
    return "expect_" + re.sub(r"\W", "_", case_name)


def msopst_case(case_dir: Path, manifest: Manifest, expect_module: Path) -> list[dict[str, Any]]:
    """Return the msOpST test-case JSON (a list of one case) of a generated case."""
    case_dir = Path(case_dir).resolve()
    inputs = [_desc(name, entry) | {"value": str(case_dir / entry["file"])} for name, entry in _tensors(manifest)]
    outputs = [_desc(name, entry) for name, entry in manifest.entries("outputs")]
    attrs = [{"name": name, "type": kind, "value": value} for name, kind, value in _attributes(manifest.params)]
    ok = not manifest.is_negative
    document: dict[str, Any] = {
        "case_name": re.sub(r"\W", "_", manifest.name),
        "op": OP_TYPE,
        "input_desc": inputs,
        "output_desc": outputs,
        "attr": attrs,
        "expect": "success" if ok else "failed",
        "error_threshold": _error_threshold(manifest),
    }
    if ok and manifest.has_golden:
        document["calc_expect_func_file"] = f"{expect_module}:{_function_name(manifest.name)}"
    return [document]


def _desc(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """An msOpST tensor description: its name, format, dtype and shape."""
    return {"name": OP_NAMES[name], "format": ["ND"], "type": [entry["dtype"]], "shape": list(entry["shape"])}


def _error_threshold(manifest: Manifest) -> list[float]:
    """msOpST's [diff_thd, pct_thd]: the case's own when it is judged by allclose:msopst, else msOpST's default."""
    settings = manifest.thresholds
    return [float(settings.get("diff_thd", 0.01)), float(settings.get("pct_thd", 0.05))]


def atk_case(case_dir: Path, manifest: Manifest, index: int) -> dict[str, Any]:
    """Return the ATK-style case JSON of a generated case (`index`: its id in the export)."""
    case_dir = Path(case_dir).resolve()
    case = manifest.case
    params = manifest.params
    inputs: list[dict[str, Any]] = [
        {
            "name": OP_NAMES[name],
            "type": "tensor",
            "required": REQUIRED.get(name, True),
            "dtype": entry["dtype"],
            "shape": list(entry["shape"]),
            "range_values": _value_range(case_dir, entry),
            "bin_file": str(case_dir / entry["file"]),
        }
        for name, entry in _tensors(manifest)
    ]
    inputs += [{"name": n, "type": "attr", "required": True, "dtype": k, "value": v} for n, k, v in _attributes(params)]
    golden = dict(manifest.entries("golden"))
    outputs = [_atk_output(case_dir, name, entry, golden) for name, entry in manifest.entries("outputs")]
    return {
        "id": index,
        "name": manifest.name,
        "aclnn_name": ACLNN_NAME,
        "api_type": "aclnn",
        "standard": {} if manifest.is_negative else _atk_standard(case),
        "inputs": inputs,
        "outputs": outputs,
        "default_seed": case.seed if manifest.seed is None else manifest.seed,
        "expect": {"status": manifest.expect_status, "name": manifest.expect_name},
    }


def _atk_output(case_dir: Path, name: str, entry: Mapping[str, Any], golden: Mapping[str, Any]) -> dict[str, Any]:
    """An ATK output description: the tensor, and its golden file where the case has one."""
    found = golden.get(name)
    paths = {} if found is None else {"golden_file": str(case_dir / found["file"]), "golden_dtype": found["dtype"]}
    return {"name": OP_NAMES[name], "type": "tensor", "dtype": entry["dtype"], "shape": list(entry["shape"]), **paths}


def _atk_standard(case: Any) -> dict[str, Any]:
    """The case's own standard in ATK's words where ATK has it (cv_fused_double_benchmark), else bsa's."""
    settings = case_settings(case)
    thresholds = {key: json_number(value) for key, value in settings.thresholds.items()}  # never NaN
    standard = settings.standard
    if standard.atk_name is not None:
        return {"acc": {standard.atk_name: {atk: thresholds[bsa] for bsa, atk in standard.atk_keys.items()}}}
    return {"acc": {"bsa": {"standard": settings.label, "thresholds": thresholds}}}


def expect_module(manifests: Sequence[tuple[Path, Manifest]]) -> str:
    """Return the Python module msOpST calls for each case's expected dq, dk, dv (the golden, cast to the
    output dtype), one function per case."""
    lines = [
        '"""Expected outputs of bsa cases for msOpST: each function returns the golden dq, dk, dv of one case.',
        "",
        "Written by `bsa export --format msopst`; the golden .bin files stay where `bsa gen` wrote them.",
        '"""',
        "",
        "import numpy as np",
        "",
        "try:",
        "    from ml_dtypes import bfloat16",
        "except ImportError:  # only bfloat16 cases need it",
        "    bfloat16 = None",
        "",
        "",
        "def _load(path, dtype, shape, out_dtype):",
        "    values = np.fromfile(path, dtype=dtype).reshape(shape)",
        "    if out_dtype == 'bfloat16':",
        "        return values.astype(bfloat16)",
        "    return values.astype(out_dtype)",
    ]
    for case_dir, manifest in manifests:
        if manifest.is_negative or not manifest.has_golden:
            continue
        golden = dict(manifest.entries("golden"))
        outputs = dict(manifest.entries("outputs"))
        lines += ["", "", f"def {_function_name(manifest.name)}(*inputs, **attrs):", "    return ["]
        for name in GRAD_NAMES:
            entry = golden[name]
            path = str(Path(case_dir).resolve() / entry["file"])
            lines.append(
                f"        _load({path!r}, {entry['dtype']!r}, {list(entry['shape'])!r}, {outputs[name]['dtype']!r}),"
            )
        lines.append("    ]")
    return "\n".join(lines) + "\n"


#: Largest `<case>.msopst.json` of an earlier export read back (one case is a few KiB).
EARLIER_CASE_MAX_BYTES = 4 << 20


def earlier_msopst_cases(
    out_dir: Path, expect_path: Path, names: set[str]
) -> tuple[list[tuple[Path, Manifest]], list[str]]:
    """Return the cases of earlier msOpST exports into `out_dir` that this export (`names`) does not write
    again and whose expected outputs come from `expect_path`, with their case folders and manifests (found
    through the inputs their JSON points at); and why others cannot be kept (their case folder is gone)."""
    kept: list[tuple[Path, Manifest]] = []
    lost: list[str] = []
    for path in sorted(out_dir.glob("*.msopst.json")):
        name = path.name[: -len(".msopst.json")]
        if name in names or path.is_symlink():
            continue
        try:
            (document,) = json.loads(read_regular(path, EARLIER_CASE_MAX_BYTES))
            module, _, _ = str(document.get("calc_expect_func_file") or "").rpartition(":")
            if Path(module) != expect_path:
                continue  # a negative case, or another module's: nothing of it in this one
            case_dir = Path(document["input_desc"][0]["value"]).parent.parent
            manifest = load_manifest(case_dir)
            if manifest.name != name:
                raise ValueError(f"{case_dir} holds case {manifest.name!r}")
        except (DataError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            lost.append(
                f"{path}: its case cannot be read ({exc}); its expected outputs are left out of "
                f"{EXPECT_MODULE}: export that case again"
            )
            continue
        kept.append((case_dir, manifest))
    return kept, lost


def export_cases(
    case_dirs: Sequence[Path], fmt: str, out_dir: Path, on_earlier: Callable[[list[str], list[str]], None] | None = None
) -> list[Path]:
    """Write every case in `fmt` ("msopst" or "atk") into `out_dir`; return the files written.

    Files: `<case>.msopst.json` (and `bsa_msopst_expect.py`) or `<case>.atk.json`. The expect module keeps
    the functions of cases an earlier msOpST export wrote into `out_dir` (`earlier_msopst_cases`), so their
    case files still work; `on_earlier(kept names, problems)` is told which.

    Raises:
        ValueError: an unknown format.
        DataError: a case's manifest or input file is missing or malformed.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifests = [(Path(case_dir), load_manifest(Path(case_dir))) for case_dir in case_dirs]
    written = []
    expect_path = (out_dir / EXPECT_MODULE).resolve()
    for index, (case_dir, manifest) in enumerate(manifests, start=1):
        try:
            document: Any = (
                msopst_case(case_dir, manifest, expect_path) if fmt == "msopst" else atk_case(case_dir, manifest, index)
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(str(case_dir / "case.json"), f"cannot export: {type(exc).__name__}: {exc}") from None
        path = out_dir / f"{manifest.name}.{fmt}.json"
        write_text_atomic(path, json.dumps(document, indent=2) + "\n")
        written.append(path)
    if fmt == "msopst":
        kept, lost = earlier_msopst_cases(out_dir, expect_path, {m.name for _, m in manifests})
        if on_earlier is not None and (kept or lost):
            on_earlier([m.name for _, m in kept], lost)
        write_text_atomic(expect_path, expect_module([*manifests, *kept]))
        written.append(expect_path)
    return written
