"""The `case.json` manifest (format bsa-case/1) and the flat `case.txt` of a case, built from a `Case`.

`Manifest` is a case.json as every reader sees it: read and checked once (`store.load_manifest`), with the
questions callers ask (its name, expected status, whether it is a negative case, its entries, its release).
`case_from_manifest` rebuilds the geometry of a case from its manifest, so tools that only see a case
directory (compare, the reference device) reason about lengths, blocks and layouts the same way gen did.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .._version import __version__
from ..core.case import Case, Expect, TensorOverride
from ..core.errors import clip
from ..ops import (
    DEFAULT_OPS,
    INNER_PRECISE_DEFAULT,
    PAIR_STEPS,
    SOFTMAX_LSE_FLAG_DEFAULT,
    Op,
    find,
    folder_name,
    forward_interface,
    get,
    interface,
    split_folder_name,
)
from ..ops.base import BACKWARD_INPUTS as INPUT_NAMES
from ..ops.base import GRAD_NAMES as GRAD_NAMES
from ..ops.folders import CALL_NAMES, op_case
from ..ops.folders import SECTIONS as SECTIONS

__all__ = ["GRAD_NAMES", "INPUT_NAMES", "SECTIONS"]  # re-exported: the devices and api read them here

#: The manifest's `format`: what case.json files this bsa reads and writes.
FORMAT = "bsa-case/1"

#: One section of array entries, as `store.check_manifest` has checked them.
Entries = Mapping[str, Mapping[str, Any] | None]


@dataclass(frozen=True, eq=False)
class Manifest(Mapping[str, Any]):
    """A case's case.json as read: checked once by `store.load_manifest`, then only asked.

    `raw` is the JSON object itself (what a writer writes back); every reader asks the properties below,
    which read only what `store.check_manifest` has checked (a name, mappings for params and expect, a
    64-bit expected status, well-formed array entries). The mapping interface reads `raw`.
    """

    raw: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    @property
    def name(self) -> str:
        return str(self.raw["name"])

    @property
    def op(self) -> Op:
        """The operator call this case folder tests (`op`; absent: the backward, as before ops existed)."""
        return find(self.raw.get("op", "backward")) or DEFAULT_OPS[0]

    @property
    def case_name(self) -> str:
        """The name of the case this folder is one op of (`NAME` of `NAME@forward`)."""
        return split_folder_name(self.name)[0]

    @property
    def skip(self) -> str | None:
        """Why gen did not make this op of the case (`skip`: its operator refuses what another op accepts),
        or None. A skipped folder has no inputs, golden or outputs; no device runs it."""
        reason = self.raw.get("skip")
        return clip(reason, 500) if isinstance(reason, str) else None

    @property
    def forward_params(self) -> Mapping[str, int]:
        """The forward's own parameters (`params.inner_precise`, `params.softmax_lse_flag`), bsa's defaults
        where the manifest has none (a backward folder)."""
        found = {"inner_precise": INNER_PRECISE_DEFAULT, "softmax_lse_flag": SOFTMAX_LSE_FLAG_DEFAULT}
        for key in found:
            value = self.params.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                found[key] = value
        return found

    @property
    def step_scales(self) -> dict[str, float]:
        """The scaleValue each step of a chain is called with (`params.forward_scale`, `params.backward_scale`;
        where absent, `params.scale`: the function meant, which the golden computes)."""
        return {step: float(self.params.get(f"{step}_scale", self.params["scale"])) for step in PAIR_STEPS}

    @property
    def spec(self) -> Any:
        """The spec file the case came from, as gen recorded it (untrusted: shown, never opened)."""
        return self.raw.get("spec")

    @property
    def params(self) -> Mapping[str, Any]:
        """The operator's parameters (`params`), as passed to aclnnBlockSparseAttentionGrad."""
        params: Mapping[str, Any] = self.raw["params"]
        return params

    @property
    def expect_status(self) -> int:
        """The aclnn status the call must return: 0, or the error of a negative case."""
        return int(self.raw["expect"].get("status", 0))

    @property
    def expect_name(self) -> str | None:
        name = self.raw["expect"].get("name")
        return None if name is None else str(name)

    @property
    def is_negative(self) -> bool:
        """A negative case: the operator must refuse the call (expect != 0); it has no golden to judge."""
        return self.expect_status != 0

    def section(self, name: str) -> Entries:
        """Return one section of array entries (`SECTIONS`), empty when the manifest has none."""
        entries = self.raw.get(name)
        return entries if isinstance(entries, Mapping) else {}

    def entry(self, section: str, name: str) -> Mapping[str, Any]:
        """Return the array entry of tensor `name` in `section`.

        Raises:
            KeyError: the section has no such entry, or it is null (a null tensor).
        """
        found = self.section(section).get(name)
        if found is None:
            raise KeyError(f"{section}.{name}")
        return found

    def entries(self, name: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """Yield (tensor name, entry) of one section, null tensors left out."""
        yield from ((tensor, entry) for tensor, entry in self.section(name).items() if entry is not None)

    @property
    def inputs(self) -> Entries:
        return self.section("inputs")

    @property
    def outputs(self) -> Entries:
        return self.section("outputs")

    @property
    def benchmark_summary(self) -> Any:
        """What gen measured of the benchmark (`benchmark_summary`: key, stats, tiles), unchecked beyond its
        tiles' entries; `compare.summary_from_document` reads it."""
        return self.raw.get("benchmark_summary")

    @property
    def has_golden(self) -> bool:
        """Whether gen wrote golden gradients (a valid case; a negative case has none)."""
        return bool(self.raw.get("golden"))

    @property
    def compare_settings(self) -> Any:
        """The spec's per-case comparison settings (`compare`: standard, thresholds), unchecked."""
        return self.raw.get("compare")

    @property
    def _generator(self) -> Mapping[str, Any]:
        found = self.raw.get("generator")
        return found if isinstance(found, Mapping) else {}

    @property
    def seed(self) -> int | None:
        """The seed gen drew the inputs with (`generator.seed`), None when not recorded."""
        seed = self._generator.get("seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

    @property
    def fingerprint(self) -> Any:
        """What gen recorded of how it made the case (`generator.fingerprint`): `generate.is_current` asks it."""
        return self._generator.get("fingerprint")

    @property
    def thresholds(self) -> Mapping[str, Any]:
        """The spec's per-case thresholds (`compare.thresholds`), empty when it set none."""
        settings = self.compare_settings
        found = settings.get("thresholds") if isinstance(settings, Mapping) else None
        return found if isinstance(found, Mapping) else {}

    @property
    def flops_backward(self) -> float:
        """The backward's FLOPs as gen estimated them (`stats.flops_backward`)."""
        return float(self.raw["stats"]["flops_backward"])

    def flops(self, step: str) -> float | None:
        """The FLOPs of one operator call, `forward` or `backward`, as gen counted them from the mask
        (`stats.flops_forward`, `stats.flops_backward`: docs/operator.md section 6); None when not recorded."""
        stats = self.raw.get("stats")
        value = stats.get(f"flops_{step}") if isinstance(stats, Mapping) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def release(self) -> str:
        """The release the case targets (`semantics.release`; a manifest written before bsa knew releases
        followed master 3a280bcc, the 9.1.0 rules)."""
        semantics = self.raw.get("semantics")
        release = semantics.get("release") if isinstance(semantics, Mapping) else None
        return release if release in interface.RELEASES else "9.1.0"

    @property
    def inputs_digest(self) -> str | None:
        return inputs_digest(self.raw)

    @property
    def notes(self) -> tuple[str, ...]:
        """What `bsa gen` noted of a case's kernel precision path (fp16 overflow, values flushed to zero): at
        most `MAX_NOTES` lines, each one clipped line, since the manifest is untrusted."""
        found = self.raw.get("notes")
        if not isinstance(found, list):
            return ()
        return tuple(clip(note, 300) for note in found[:MAX_NOTES])

    def call_tensors(self) -> dict[str, dict[str, Any]]:
        return call_tensors(self.raw)

    @cached_property
    def case(self) -> Case:
        """The case's geometry (`case_from_manifest`, with the block shape its op computes with:
        `Case.as_called`), built once.

        Raises:
            ValueError: a param cannot describe a case.
        """
        return case_from_manifest(self.raw).as_called()


def decode_lengths(values: list[int] | None, encoding: str) -> tuple[int, ...] | None:
    """Invert `encode_lengths`."""
    if values is None:
        return None
    if encoding == "cumulative":
        return tuple(b - a for a, b in zip([0, *values[:-1]], values, strict=True))
    return tuple(values)


def json_number(value: float) -> str | float:
    """Return a float as strict JSON can hold it: 'inf', '-inf', 'nan' or the number itself."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


#: The op parameters of a case, as passed to aclnnBlockSparseAttentionGrad (`interface.case_params`).
params = interface.case_params


def expect_record(expect: Expect) -> dict[str, Any]:
    """Return an op's `expect`: status and name, and the pair's verdict and cause only where set."""
    record: dict[str, Any] = {"status": expect.status, "name": expect.name}
    if expect.verdict != "PASS" or expect.cause is not None:
        record.update(verdict=expect.verdict, cause=expect.cause)
    return record


def semantics(case: Case) -> dict[str, Any]:
    """Return what the golden assumes where the operator's documentation and kernel differ."""
    record: dict[str, Any] = {
        "interface": interface.RULES_BY_RELEASE[case.release],
        "release": case.release,
        "bnsd_lengths": case.bnsd_lengths,
        "empty_row_lse": json_number(case.empty_row_lse),
        "q_lengths": list(case.q_lengths()),
        "kv_lengths": list(case.kv_lengths()),
    }
    if case.copies:  # only then: a case without copies keeps its bytes
        record["copies"] = [list(pair) for pair in case.copies]
    return record


def sparsity_record(case: Case) -> dict[str, Any]:
    """Return how the block mask was drawn: the pattern, its parameters, and where its diagonal sits."""
    sparsity = case.sparsity
    record: dict[str, Any] = {"pattern": sparsity.pattern}
    if sparsity.pattern == "random":
        record.update(density=sparsity.density, per_head=sparsity.per_head)
    if sparsity.pattern in ("sliding_window", "strided"):
        record["window"] = sparsity.window
    if sparsity.pattern == "strided":
        record["stride"] = sparsity.stride
    if sparsity.pattern in ("causal", "sliding_window", "strided"):
        record["causal_alignment"] = sparsity.causal_alignment
    empty = sparsity.empty_rows
    record["empty_rows"] = empty if isinstance(empty, float) else list(empty)
    return record


def output_entries(case: Case, op: str = "backward") -> dict[str, dict[str, Any]]:
    """Return where a device writes an op's outputs (dq, dk, dv; out, lse): files relative to the output
    directory, dtype and shape as the call passes them (a null one left out)."""
    descs = case.tensor_descs()
    entries = {}
    for name in get(op).outputs:
        desc = descs.get(CALL_NAMES.get(name, name))
        if desc is not None:
            entries[name] = {"file": f"{name}.bin", "dtype": desc["dtype"], "shape": list(desc["shape"])}
    return entries


def call_tensors(manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Return the tensors a device passes for a manifest: {name: {"dtype", "shape"}}, null ones absent.

    This is what the interface rules judge (`interface.check(params, call_tensors(manifest))`): the
    inputs and outputs entries as a harness turns them into aclTensors.
    """
    table: dict[str, dict[str, Any]] = {}
    for section in ("inputs", "outputs"):
        entries = manifest.get(section)
        for name, entry in entries.items() if isinstance(entries, Mapping) else ():
            if isinstance(entry, Mapping):
                table[str(name)] = {"dtype": entry.get("dtype"), "shape": list(entry.get("shape") or ())}
    return table


#: Most `notes` lines a reader takes from a manifest (it is untrusted).
MAX_NOTES = 8


def inputs_digest(manifest: Mapping[str, Any]) -> str | None:
    """Return one sha256 over the sha256 of every input file the manifest lists (name order), or None.

    Two nights whose case has the same digest ran on the same input bytes; another digest means the
    inputs changed (another spec, seed or bsa rounding), so its figures are not drift.
    """
    inputs = manifest.get("inputs")
    if not isinstance(inputs, Mapping) or not inputs:
        return None
    lines = []
    for name in sorted(str(n) for n in inputs):
        entry = inputs[name]
        digest = entry.get("sha256") if isinstance(entry, Mapping) else None
        if not isinstance(digest, str):
            return None
        lines.append(f"{name} {digest[:64]}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def build_manifest(
    case: Case,
    inputs: Mapping[str, dict[str, Any]],
    golden: Mapping[str, dict[str, Any]],
    benchmark: Mapping[str, dict[str, Any]],
    stats: Mapping[str, Any],
    op: str = "backward",
    skip: str | None = None,
) -> dict[str, Any]:
    """Assemble the manifest of one op's folder of a generated case (the backward's: the case's own).

    An op folder other than the backward's adds `op`, and the forward's parameters where the op calls it;
    a skipped op (`skip`: why) has no outputs.
    """
    document: dict[str, Any] = {
        "format": FORMAT,
        "name": folder_name(case.name, op),
        **({"op": op} if not get(op).is_default else {}),
        "spec": case.source,
        "generator": {"tool": "bsa", "version": __version__, "seed": case.seed},
        "params": forward_interface.case_params_forward(case) if get(op).calls_forward else params(case),
        "semantics": semantics(case),
        "sparsity": sparsity_record(case),
        "inputs": dict(inputs),
        "golden": dict(golden),
        "benchmark": dict(benchmark),
        "outputs": {} if skip is not None else output_entries(op_case(case, op), op),
        "expect": expect_record(case.expect_of(op)),
        "compare": dict(case.compare),
        "warnings": list(case.warnings),
        "stats": dict(stats),
    }
    if get(op).scales_per_step and case.step_scales:  # case.txt: `forward_scale X` and `backward_scale Y`
        document["params"].update({f"{step}_scale": case.step_scale(step) for step in PAIR_STEPS})
    if skip is not None:
        document["skip"] = skip
    return document


#: Largest size a manifest's params may give (as a spec's).
MAX_PARAM = 2**31 - 1

#: Most elements a tensor of a manifest's case may have (as a spec's).
MAX_PARAM_ELEMENTS = 1 << 40

#: The params every manifest gives, integers from 0 to MAX_PARAM: a `Case`'s fields of the same names.
SIZE_PARAMS = ("batch", "num_heads", "num_kv_heads", "head_dim", "q_seq_len", "kv_seq_len")


def _check_params(p: Any, sem: Any) -> None:
    """Raise ValueError naming the first of a manifest's params that cannot describe a case."""
    if not isinstance(p, Mapping) or not isinstance(sem, Mapping):
        raise ValueError("params and semantics must be mappings")
    for key in SIZE_PARAMS:
        value = p.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_PARAM:
            raise ValueError(f"params.{key}: {value!r:.60} is not an integer from 0 to {MAX_PARAM}")
    for key in ("layout", "kv_layout", "dtype", "seq_lengths_encoding", "lse_shape"):
        if p.get(key) is not None and not isinstance(p.get(key), str):
            raise ValueError(f"params.{key}: {p.get(key)!r:.60} is not a string")
    nulls = p.get("null_layouts")
    if nulls is not None and not (isinstance(nulls, list) and all(n in ("q", "kv") for n in nulls)):
        raise ValueError(f"params.null_layouts: {nulls!r:.60} is not a list of 'q' and 'kv'")
    for key in ("actual_seq_lengths", "actual_seq_lengths_kv"):
        value = p.get(key)
        if value is not None and not (
            isinstance(value, list)
            and len(value) == p["batch"]
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_PARAM * MAX_PARAM for v in value)
        ):
            raise ValueError(f"params.{key}: not null or a list of {p['batch']} non-negative integers")
    block_shape = p.get("block_shape")
    if block_shape is not None and not (
        isinstance(block_shape, list)
        and len(block_shape) <= 8
        and all(isinstance(v, int) and abs(v) < 2**63 for v in block_shape)
    ):
        raise ValueError(f"params.block_shape: {block_shape!r:.60} is not null or a list of integers")
    if not isinstance(p.get("scale"), (int, float)) or isinstance(p.get("scale"), bool):
        raise ValueError(f"params.scale: {p.get('scale')!r:.60} is not a number")
    for key in (f"{step}_scale" for step in PAIR_STEPS if f"{step}_scale" in p):
        if not isinstance(p[key], (int, float)) or isinstance(p[key], bool) or not math.isfinite(p[key]):
            raise ValueError(f"params.{key}: {p[key]!r:.60} is not a finite number")
    empty = sem.get("empty_row_lse", "inf")
    if not (isinstance(empty, (int, float)) and not isinstance(empty, bool)) and empty not in ("inf", "-inf", "nan"):
        raise ValueError(f"semantics.empty_row_lse: {empty!r:.60} is not a number, 'inf', '-inf' or 'nan'")


def _copies(raw: Any, batch: Any) -> tuple[tuple[int, int], ...]:
    """Return `semantics.copies` checked: [copy, source] pairs of distinct batch entries."""
    if not isinstance(raw, list) or not isinstance(batch, int):
        raise ValueError("semantics.copies: not a list of [copy, source] pairs")
    pairs = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int and 0 <= v < batch for v in pair)):
            raise ValueError(f"semantics.copies: {pair!r:.60} is not a pair of batch entries below {batch}")
        pairs.append((pair[0], pair[1]))
    return tuple(pairs)


def case_from_manifest(manifest: Mapping[str, Any]) -> Case:
    """Rebuild the geometry of a case (shapes, lengths, semantics) from its manifest.

    Sparsity and init are not recorded this way (the mask and inputs are in files); they keep defaults.

    Raises:
        ValueError: a param cannot describe a case (a wrong type, a size beyond bsa's limits).
    """
    p = manifest["params"]
    sem = manifest.get("semantics", {})
    _check_params(p, sem)
    encoding = p.get("seq_lengths_encoding", "per_batch")
    empty_lse = sem.get("empty_row_lse", "inf")
    forward = Manifest(manifest).forward_params  # bsa's defaults where it has none
    case = Case(
        name=manifest["name"],
        source=manifest.get("spec", ""),
        layout=p["layout"],
        dtype=p["dtype"],
        **{key: p[key] for key in SIZE_PARAMS},
        kv_layout=p.get("kv_layout"),
        lse_shape=p.get("lse_shape", "trailing_one"),
        mask_type=p.get("mask_type", 0),
        pre_tokens=p.get("pre_tokens", 2147483647),
        next_tokens=p.get("next_tokens", 2147483647),
        actual_seq_lengths=decode_lengths(p.get("actual_seq_lengths"), encoding),
        actual_seq_lengths_kv=decode_lengths(p.get("actual_seq_lengths_kv"), encoding),
        block_shape=tuple(p["block_shape"] or ()),
        scale=p["scale"],
        tensors=_overrides(manifest),
        seed=manifest.get("generator", {}).get("seed", 0),
        expect=Expect(**manifest.get("expect", {})),
        seq_lengths_encoding=encoding,
        bnsd_lengths=sem.get("bnsd_lengths", "honored"),
        release=Manifest(manifest).release,
        null_layouts=tuple(n for n in ("q", "kv") if n in (p.get("null_layouts") or [])),
        empty_row_lse=float(empty_lse),
        compare=dict(manifest.get("compare") or {}),
        ops=(Manifest(manifest).op,),
        inner_precise=forward["inner_precise"],
        softmax_lse_flag=forward["softmax_lse_flag"],
        copies=_copies(sem.get("copies", []), p["batch"]),
    )
    for lengths in (case.actual_seq_lengths, case.actual_seq_lengths_kv):
        if lengths is not None and any(n < 0 for n in lengths):
            raise ValueError("params: cumulative actual lengths that decrease")
    for what, shape in (("query", case.q_shape), ("key", case.kv_shape), ("mask", case.mask_shape)):
        if math.prod(shape) > MAX_PARAM_ELEMENTS:
            raise ValueError(f"params: {what} of shape {list(shape)} is beyond bsa's limits")
    _check_geometry(case, Manifest(manifest))
    return case


#: Largest finite float32: the operator takes scaleValue as a float.
FLOAT32_MAX = 3.4028234663852886e38


def _check_geometry(case: Case, manifest: Manifest) -> None:
    """Hold a manifest's case to the rules a spec's is held to (specs/build.py), so that what bsa judges
    is a case gen could have written: actual lengths within their sequence dimension and a finite scale
    for every case; a case meant to pass, and not skipped, breaks none of its operator calls' interface
    rules (a negative case breaks one on purpose; its status alone is judged).

    Raises:
        ValueError: naming the param and the rule, as `bsa validate` would.
    """
    for key, lengths, limit in (
        ("actual_seq_lengths", case.actual_seq_lengths, case.q_seq_len),
        ("actual_seq_lengths_kv", case.actual_seq_lengths_kv, case.kv_seq_len),
    ):
        if lengths is not None and max(lengths, default=0) > limit:
            shown = clip(list(lengths), 60)
            raise ValueError(f"params.{key}: {shown}: a length exceeds the sequence dimension {limit}")
    if not abs(case.scale) <= FLOAT32_MAX:  # NaN too
        raise ValueError(f"params.scale: {case.scale} is not a number float32 holds (the operator's scaleValue)")
    if not case.expect.ok or manifest.skip is not None:
        return
    if len(case.block_shape) < 2 or min(case.block_shape) <= 0:
        raise ValueError(f"params.block_shape: {list(case.block_shape)}: a case expecting status 0 has X, Y > 0")
    if not manifest.op.is_default:  # the other ops' folders follow `Case.op_expect`, which gen worked out
        return
    call = interface.BACKWARD_CALL
    broken = [*call.undefined_behaviour(case), *(f"{v.key} {v.message}" for v in call.violations(case))]
    if broken:  # what specs/build.py's _check_interface refuses in a backward case expecting status 0
        raise ValueError(
            f"params: {broken[0]}: the backward refuses it or leaves it undefined, yet the case expects status 0 "
            "(`bsa validate` refuses such a spec)"
        )


def _overrides(manifest: Mapping[str, Any]) -> tuple[TensorOverride, ...]:
    """Return the tensor overrides a manifest's entries imply (only a bool mask matters to valid cases)."""
    mask = (manifest.get("inputs") or {}).get("block_sparse_mask") or {}
    if mask.get("dtype") not in (None, "uint8"):
        return (TensorOverride("block_sparse_mask", dtype=mask["dtype"]),)
    return ()


def flat_params(manifest: Mapping[str, Any]) -> str:
    """Return the op parameters and file table as `key value...` lines a C++ harness can parse.

    Lists are space-separated; an absent list is written as `-`; every array gets one line
    `input|golden|output NAME FILE DTYPE NDIM DIM...` (input and golden files relative to the case
    directory, output files relative to the output directory).
    """
    lines = [f"format {manifest['format']}", f"name {manifest['name']}"]
    op = find(manifest.get("op", "backward"))
    if op is None or not op.is_default:
        lines.append(f"op {manifest['op']}")
    for key, value in manifest["params"].items():
        if isinstance(value, list):
            text = " ".join(str(v) for v in value) if value else "-"
        else:
            text = "-" if value is None else str(value)  # a float as repr writes it, every digit
        lines.append(f"{key} {text}")
    lines.append(f"expect_status {manifest['expect']['status']}")
    for section, tag in (("inputs", "input"), ("golden", "golden"), ("outputs", "output")):
        for name, entry in manifest.get(section, {}).items():
            dims = " ".join(str(d) for d in entry["shape"])
            lines.append(f"{tag} {name} {entry['file']} {entry['dtype']} {len(entry['shape'])} {dims}".rstrip())
    return "\n".join(lines) + "\n"
