"""Write generated cases in the ecosystem's test-case formats (msOpST, ATK, TTK), pointing at the case's files.

Each format describes one aclnn call per case: aclnnBlockSparseAttentionGrad for a backward folder,
aclnnBlockSparseAttention for a forward folder (`ExportCall`: its tensors, attributes and outputs as its header
names them), with where the data is and what to expect. An op of two calls (the chain: its backward reads the
forward's device outputs, which no file holds) or of torch's autograd is refused before anything is written.
Every field bsa fills, and how, is in docs/export.md.

* msOpST (MindStudio op system test): a JSON list holding one case, `case_name`, `op`, `input_desc`,
  `output_desc`, `attr`, `expect`, `error_threshold`, and `calc_expect_func_file`, a function of the
  Python module `bsa_msopst_expect.py` written beside the cases that returns the case's golden
  outputs, so msOpST judges the device against bsa's golden.
* ATK (the ops-transformer test kit's case JSON): `id`, `name`, `aclnn_name`, `api_type`, `standard`,
  `inputs` (tensors and attributes), `outputs`, `default_seed`; each tensor names its .bin file.
* TTK (CANN ops-test-kit): `report.ttk`.

Nothing here judges or runs anything; `export_cases` reads manifests, makes every file in memory and
publishes them whole (`staging.publish`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..compare import case_settings
from ..core.errors import DataError
from ..core.untrusted import read_regular
from ..ops import Op, forward_interface, interface
from ..store import load_manifest, read_array
from ..store.manifest import Manifest, json_number
from .staging import Content, publish

OP_TYPE = "BlockSparseAttentionGrad"
ACLNN_NAME = "aclnnBlockSparseAttentionGrad"
EXPECT_MODULE = "bsa_msopst_expect.py"


@dataclass(frozen=True)
class ExportCall:
    """One aclnn call as the export formats describe it: its names, and its parameters in its header's order.

    Names are the aclnn header's (`aclnn_block_sparse_attention_grad.h`, `aclnn_block_sparse_attention.h`,
    ops-transformer 5778144); msOpST and ATK name a tensor or attribute without the header's `Optional`
    suffix (`aclnn_name`), TTK with it (it reads the header).
    """

    op_type: str
    aclnn: str
    #: Its tensor arguments before the outputs, in the header's order: (manifest input name, header name).
    tensors: tuple[tuple[str, str], ...]
    #: Its output tensors: (manifest output name, header name).
    outputs: tuple[tuple[str, str], ...]
    #: Its non-tensor arguments of a manifest's `params`: (header name, type, value), in the header's order.
    attributes: Callable[[Mapping[str, Any]], list[tuple[str, str, Any]]]


def aclnn_name(header_name: str) -> str:
    """A parameter's name as msOpST and ATK cases give it: the header's without `Optional`."""
    return header_name.removesuffix("Optional")


def _backward_attributes(params: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """The backward's attributes, lengths as every caller passes them (`interface.call_lengths`)."""
    q_lengths, kv_lengths = interface.call_lengths(params)
    block_shape = params.get("block_shape")
    return [
        ("blockShapeOptional", "list_int", list(block_shape) if block_shape is not None else None),
        ("actualSeqLengthsOptional", "list_int", q_lengths),
        ("actualSeqLengthsKvOptional", "list_int", kv_lengths),
        ("qInputLayout", "string", params.get("layout")),
        ("kvInputLayout", "string", params.get("kv_layout", params.get("layout"))),
        ("numKeyValueHeads", "int", params.get("num_kv_heads")),
        ("maskType", "int", params.get("mask_type", 0)),
        ("scaleValue", "double", params.get("scale")),
        ("preTokens", "int", params.get("pre_tokens")),
        ("nextTokens", "int", params.get("next_tokens")),
    ]


def _forward_attributes(params: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """The forward's attributes: lengths as the case has them (`forward_interface.call_lengths`), bsa's
    innerPrecise and softmaxLseFlag, blockSize 0 (no block table)."""
    params = forward_interface.params_forward(params)
    q_lengths, kv_lengths = forward_interface.call_lengths(params)
    block_shape = params.get("block_shape")
    return [
        ("blockShapeOptional", "list_int", list(block_shape) if block_shape is not None else None),
        ("actualSeqLengthsOptional", "list_int", q_lengths),
        ("actualSeqLengthsKvOptional", "list_int", kv_lengths),
        ("qInputLayout", "string", params.get("layout")),
        ("kvInputLayout", "string", params.get("kv_layout", params.get("layout"))),
        ("numKeyValueHeads", "int", params.get("num_kv_heads")),
        ("maskType", "int", params.get("mask_type", 0)),
        ("scaleValue", "double", params.get("scale")),
        ("innerPrecise", "int", params.get("inner_precise")),
        ("blockSize", "int", 0),
        ("preTokens", "int", params.get("pre_tokens")),
        ("nextTokens", "int", params.get("next_tokens")),
        ("softmaxLseFlag", "int", params.get("softmax_lse_flag")),
    ]


#: aclnnBlockSparseAttentionGrad (`aclnn_block_sparse_attention_grad.h`, ops-transformer 5778144).
BACKWARD_EXPORT = ExportCall(
    op_type=OP_TYPE,
    aclnn=ACLNN_NAME,
    tensors=(
        ("dout", "dout"),
        ("query", "query"),
        ("key", "key"),
        ("value", "value"),
        ("attention_out", "attentionOut"),
        ("softmax_lse", "softmaxLse"),
        ("block_sparse_mask", "blockSparseMaskOptional"),
        ("atten_mask", "attenMaskOptional"),
    ),
    outputs=(("dq", "dq"), ("dk", "dk"), ("dv", "dv")),
    attributes=_backward_attributes,
)

#: aclnnBlockSparseAttention (`aclnn_block_sparse_attention.h`, ops-transformer 5778144).
FORWARD_EXPORT = ExportCall(
    op_type="BlockSparseAttention",
    aclnn="aclnnBlockSparseAttention",
    tensors=(
        ("query", "query"),
        ("key", "key"),
        ("value", "value"),
        ("block_sparse_mask", "blockSparseMaskOptional"),
        ("atten_mask", "attenMaskOptional"),
        ("block_table", "blockTableOptional"),
    ),
    outputs=(("out", "attentionOut"), ("lse", "softmaxLseOptional")),
    attributes=_forward_attributes,
)

#: The calls a case folder of one step exports as, by the step's name (`Op.steps`, `Call.name`).
EXPORT_CALLS = {"backward": BACKWARD_EXPORT, "forward": FORWARD_EXPORT}

#: A tensor the caller may pass as null.
REQUIRED = {"atten_mask": False, "block_table": False}


def export_call(op: Op) -> ExportCall | None:
    """Return the aclnn call a folder of `op` exports as, or None: an op of two calls (the chain, whose backward
    reads the forward's device outputs, which no file of the case holds) or one only torch's autograd runs."""
    if len(op.steps) != 1 or op.autograd_only:
        return None
    return EXPORT_CALLS.get(op.steps[0].name)


def _attributes(call: ExportCall, params: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """Return the call's attributes as msOpST and ATK name them."""
    return [(aclnn_name(name), kind, value) for name, kind, value in call.attributes(params)]


def _tensors(call: ExportCall, manifest: Manifest) -> list[tuple[str, str, Mapping[str, Any]]]:
    """Return (manifest name, msOpST/ATK name, entry) of the inputs the call passes, in its order (a null
    tensor is absent)."""
    inputs = dict(manifest.entries("inputs"))
    return [(name, aclnn_name(header), inputs[name]) for name, header in call.tensors if name in inputs]


def _output_names(call: ExportCall) -> dict[str, str]:
    return {name: aclnn_name(header) for name, header in call.outputs}


def _value_range(case_dir: Path, entry: Mapping[str, Any]) -> list[float] | None:
    """Return [min, max] of a tensor's finite values (read from its .bin), None when it holds none."""
    values = np.asarray(read_array(case_dir, entry), dtype=np.float64)
    finite = values[np.isfinite(values)]
    return [_number(float(finite.min())), _number(float(finite.max()))] if finite.size else None


def _number(value: float) -> float | int:
    """A JSON-friendly number: integers plainly, floats with 7 significant digits."""
    return int(value) if float(value).is_integer() else float(f"{value:.7g}")


def safe_name(name: str) -> str:
    """A case name as an identifier: characters other than letters, digits and `_` turned into `_`."""
    return re.sub(r"\W", "_", name)


def distinct_names(names: Sequence[str]) -> dict[str, str]:
    """Return each name's identifier (`safe_name`), distinct: names that become one identifier (`a-b`, `a.b`,
    `a_b`) each get theirs with 8 hex digits of their SHA-256 appended, but for the one that already was it.

    Raises:
        ValueError: two identifiers are still the same (a case name that is another's distinct identifier).
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(safe_name(name), []).append(name)
    found = {}
    for safe, members in groups.items():
        for name in members:
            digest = hashlib.sha256(name.encode()).hexdigest()[:8]
            found[name] = safe if len(members) == 1 or name == safe else f"{safe}_{digest}"
    clashes = [name for name in found if list(found.values()).count(found[name]) > 1]
    if clashes:
        raise ValueError(f"cases {', '.join(sorted(clashes))} get one name once sanitized; rename one of them")
    return found


def _function_name(identifier: str) -> str:
    return "expect_" + identifier


def msopst_case(case: Exported, expect_module: Path) -> list[dict[str, Any]]:
    """Return the msOpST test-case JSON (a list of one case) of a generated case."""
    manifest, call = case.manifest, case.call
    inputs = [
        _desc(name, entry) | {"value": str(case.case_dir / entry["file"])}
        for _, name, entry in _tensors(call, manifest)
    ]
    names = _output_names(call)
    outputs = [_desc(names[name], entry) for name, entry in manifest.entries("outputs")]
    attrs = [{"name": name, "type": kind, "value": value} for name, kind, value in _attributes(call, manifest.params)]
    ok = not manifest.is_negative
    document: dict[str, Any] = {
        "case_name": case.identifier,
        "op": call.op_type,
        "input_desc": inputs,
        "output_desc": outputs,
        "attr": attrs,
        "expect": "success" if ok else "failed",
        "error_threshold": _error_threshold(manifest),
    }
    if ok and manifest.has_golden:
        document["calc_expect_func_file"] = f"{expect_module}:{_function_name(case.identifier)}"
    return [document]


def _desc(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """An msOpST tensor description: its name, format, dtype and shape."""
    return {"name": name, "format": ["ND"], "type": [entry["dtype"]], "shape": list(entry["shape"])}


def _error_threshold(manifest: Manifest) -> list[float]:
    """msOpST's [diff_thd, pct_thd]: the case's own when it is judged by allclose:msopst, else msOpST's default."""
    settings = manifest.thresholds
    return [float(settings.get("diff_thd", 0.01)), float(settings.get("pct_thd", 0.05))]


def atk_case(case: Exported) -> dict[str, Any]:
    """Return the ATK-style case JSON of a generated case (its `index` is its id in the export)."""
    manifest, call, case_dir = case.manifest, case.call, case.case_dir
    inputs: list[dict[str, Any]] = [
        {
            "name": name,
            "type": "tensor",
            "required": REQUIRED.get(tensor, True),
            "dtype": entry["dtype"],
            "shape": list(entry["shape"]),
            "range_values": _value_range(case_dir, entry),
            "bin_file": str(case_dir / entry["file"]),
        }
        for tensor, name, entry in _tensors(call, manifest)
    ]
    attributes = _attributes(call, manifest.params)
    inputs += [{"name": n, "type": "attr", "required": True, "dtype": k, "value": v} for n, k, v in attributes]
    golden = dict(manifest.entries("golden"))
    names = _output_names(call)
    outputs = [_atk_output(case_dir, name, names[name], entry, golden) for name, entry in manifest.entries("outputs")]
    return {
        "id": case.index,
        "name": manifest.name,
        "aclnn_name": call.aclnn,
        "api_type": "aclnn",
        "standard": {} if manifest.is_negative else _atk_standard(manifest.case),
        "inputs": inputs,
        "outputs": outputs,
        "default_seed": manifest.case.seed if manifest.seed is None else manifest.seed,
        "expect": {"status": manifest.expect_status, "name": manifest.expect_name},
    }


def _atk_output(
    case_dir: Path, name: str, aclnn: str, entry: Mapping[str, Any], golden: Mapping[str, Any]
) -> dict[str, Any]:
    """An ATK output description: the tensor, and its golden file where the case has one."""
    found = golden.get(name)
    paths = {} if found is None else {"golden_file": str(case_dir / found["file"]), "golden_dtype": found["dtype"]}
    return {"name": aclnn, "type": "tensor", "dtype": entry["dtype"], "shape": list(entry["shape"]), **paths}


def _atk_standard(case: Any) -> dict[str, Any]:
    """The case's own standard in ATK's words where ATK has it (cv_fused_double_benchmark), else bsa's."""
    settings = case_settings(case)
    thresholds = {key: json_number(value) for key, value in settings.thresholds.items()}  # never NaN
    standard = settings.standard
    if standard.atk_name is not None:
        return {"acc": {standard.atk_name: {atk: thresholds[bsa] for bsa, atk in standard.atk_keys.items()}}}
    return {"acc": {"bsa": {"standard": settings.label, "thresholds": thresholds}}}


def expect_module(cases: Sequence[Exported]) -> str:
    """Return the Python module msOpST calls for each case's expected outputs (the golden, cast to the
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
    for case in cases:
        manifest = case.manifest
        if manifest.is_negative or not manifest.has_golden:
            continue
        golden = dict(manifest.entries("golden"))
        outputs = dict(manifest.entries("outputs"))
        lines += ["", "", f"def {_function_name(case.identifier)}(*inputs, **attrs):", "    return ["]
        for name, _ in case.call.outputs:
            entry = golden[name]
            path = str(case.case_dir / entry["file"])
            lines.append(
                f"        _load({path!r}, {entry['dtype']!r}, {list(entry['shape'])!r}, {outputs[name]['dtype']!r}),"
            )
        lines.append("    ]")
    return "\n".join(lines) + "\n"


#: Largest `<case>.msopst.json` of an earlier export read back (one case is a few KiB).
EARLIER_CASE_MAX_BYTES = 4 << 20


def earlier_msopst_cases(out_dir: Path, expect_path: Path, names: set[str]) -> tuple[list[Exported], list[str]]:
    """Return the cases of earlier msOpST exports into `out_dir` that this export (`names`) does not write
    again and whose expected outputs come from `expect_path`, with their case folders and manifests (found
    through the inputs their JSON points at); and why others cannot be kept (their case folder is gone)."""
    kept: list[Exported] = []
    lost: list[str] = []
    for path in sorted(out_dir.glob("*.msopst.json")):
        name = path.name[: -len(".msopst.json")]
        if name in names or path.is_symlink():
            continue
        try:
            (document,) = json.loads(read_regular(path, EARLIER_CASE_MAX_BYTES))
            module, _, function = str(document.get("calc_expect_func_file") or "").rpartition(":")
            if Path(module) != expect_path:
                continue  # a negative case, or another module's: nothing of it in this one
            case_dir = Path(document["input_desc"][0]["value"]).parent.parent
            manifest = load_manifest(case_dir)
            if manifest.name != name:
                raise ValueError(f"{case_dir} holds case {manifest.name!r}")
            call = export_call(manifest.op)
            if call is None or not function.startswith("expect_"):
                raise ValueError(f"{case_dir} is not a case msOpST holds")
        except (DataError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            lost.append(
                f"{path}: its case cannot be read ({exc}); its expected outputs are left out of "
                f"{EXPECT_MODULE}: export that case again"
            )
            continue
        kept.append(Exported(case_dir.resolve(), manifest, call, 0, function.removeprefix("expect_")))
    return kept, lost


@dataclass(frozen=True)
class Exported:
    """A case folder as an export writes it: where it is, its manifest, the call it exports as, its id in the
    export (from 1) and its identifier (`distinct_names`)."""

    case_dir: Path
    manifest: Manifest
    call: ExportCall
    index: int
    identifier: str


class ExportFormat:
    """One format `bsa export` writes: its name, a line for `--help`, and the files of a set of cases.

    `files` returns every file of the export (relative path -> text, or a verified file to link) before
    anything is written; `export_cases` then publishes them whole (`staging.publish`)."""

    name: str
    help: str

    def files(self, cases: Sequence[Exported], out_dir: Path, notes: Callable[[list[str], list[str]], None]) -> Files:
        raise NotImplementedError

    def how_to_run(self, files: Files, out_dir: Path) -> list[str]:
        """Lines that say how to run the export with its tool, where bsa's help can say it; none by default."""
        return []


#: Files of an export: path relative to its folder -> text, or a file to hard-link (`staging.Content`).
Files = dict[str, Content]


class Msopst(ExportFormat):
    name = "msopst"
    help = "MindStudio msOpST test-case JSON"

    def files(self, cases: Sequence[Exported], out_dir: Path, notes: Callable[[list[str], list[str]], None]) -> Files:
        expect_path = (out_dir / EXPECT_MODULE).resolve()
        found: Files = {f"{case.manifest.name}.msopst.json": _json(msopst_case(case, expect_path)) for case in cases}
        kept, lost = earlier_msopst_cases(out_dir, expect_path, {case.manifest.name for case in cases})
        functions = {case.identifier for case in cases}
        for earlier in [case for case in kept if case.identifier in functions]:
            kept.remove(earlier)
            lost.append(
                f"{out_dir / earlier.manifest.name}.msopst.json: its function expect_{earlier.identifier} is a "
                f"case's of this export; its expected outputs are left out of {EXPECT_MODULE}: export it again"
            )
        if kept or lost:
            notes([case.manifest.name for case in kept], lost)
        found[EXPECT_MODULE] = expect_module([*cases, *kept])
        return found


class Atk(ExportFormat):
    name = "atk"
    help = "ops-transformer ATK-style case JSON"

    def files(self, cases: Sequence[Exported], out_dir: Path, notes: Callable[[list[str], list[str]], None]) -> Files:
        return {f"{case.manifest.name}.atk.json": _json(atk_case(case)) for case in cases}


def _json(document: Any) -> str:
    return json.dumps(document, indent=2) + "\n"


from .ttk import Ttk  # noqa: E402  (it builds on the classes above)

#: The formats by name, in the order help lists them.
EXPORT_FORMATS: dict[str, ExportFormat] = {f.name: f for f in (Msopst(), Atk(), Ttk())}


def _exported(case_dirs: Sequence[Path], fmt: ExportFormat, on_skipped: Callable[[str], None]) -> list[Exported]:
    """Return the cases to export, checked: every folder's op is one call the formats hold, its name is
    unique in the export and distinct once sanitized. A folder gen skipped (its operator refuses the case:
    no files) is left out, and `on_skipped` told why.

    Raises:
        DataError: a manifest is missing or malformed, a folder is of an op no format holds, or two cases
            share a name.
    """
    loaded = []
    for case_dir in case_dirs:
        manifest = load_manifest(Path(case_dir))
        if manifest.skip is not None:
            on_skipped(f"{manifest.name}: not exported, gen skipped it ({manifest.skip})")
        else:
            loaded.append((Path(case_dir).resolve(), manifest))
    seen: dict[str, Path] = {}
    for case_dir, manifest in loaded:
        if manifest.name in seen:
            raise DataError(
                str(case_dir / "case.json"),
                f"case {manifest.name!r} is also in {seen[manifest.name]}: export the two into separate folders",
            )
        seen[manifest.name] = case_dir
        op = manifest.op
        if export_call(op) is None:
            raise DataError(
                str(case_dir / "case.json"),
                f"cannot export op {op} ({op.summary}): {fmt.name} describes one operator call whose inputs "
                "are files, and this op's backward reads its forward's device outputs; nothing was written. "
                "Export the forward and backward folders (--ops forward,backward)",
            )
    try:
        identifiers = distinct_names([manifest.name for _, manifest in loaded])
    except ValueError as exc:
        raise DataError(str(loaded[0][0].parent), f"cannot export: {exc}") from None
    return [
        Exported(case_dir, manifest, export_call(manifest.op) or BACKWARD_EXPORT, index, identifiers[manifest.name])
        for index, (case_dir, manifest) in enumerate(loaded, start=1)
    ]


def export_cases(
    case_dirs: Sequence[Path],
    fmt: str,
    out_dir: Path,
    on_earlier: Callable[[list[str], list[str]], None] | None = None,
    on_run: Callable[[list[str]], None] | None = None,
    on_skipped: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write every case in format `fmt` (`EXPORT_FORMATS`) into `out_dir`; return the files written.

    Every file is made before any is written, and they are published whole (`staging.publish`): a case that
    cannot be exported leaves `out_dir` as it was, and a link in `out_dir` named like a file of the export
    is replaced, never written through. msOpST's expect module keeps the functions of cases an earlier
    msOpST export wrote into `out_dir` (`earlier_msopst_cases`), so their case files still work;
    `on_earlier(kept names, problems)` is told which; `on_run(lines)` how to run the export (TTK's commands),
    `on_skipped(line)` each folder gen skipped (left out).

    Raises:
        ValueError: an unknown format.
        DataError: a case's manifest or input file is missing or malformed, or its op no format holds.
        OSError: the export cannot be written (nothing of it is then in `out_dir`).
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(EXPORT_FORMATS)}")
    export = EXPORT_FORMATS[fmt]
    out_dir = Path(out_dir)
    cases = _exported(case_dirs, export, on_skipped or (lambda line: None))
    try:
        files = export.files(cases, out_dir, on_earlier or (lambda kept, lost: None))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(str(out_dir), f"cannot export: {type(exc).__name__}: {exc}") from None
    written = publish(out_dir, files)
    if on_run is not None and (lines := export.how_to_run(files, out_dir)):
        on_run(lines)
    return written
