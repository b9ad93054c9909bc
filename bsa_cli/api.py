"""The Python API: load a generated case, judge the outputs a device returned, as `bsa compare` would.

For people who call the operator themselves (from PyTorch through torch_npu, or a harness of their own);
docs/api.md documents it with a runnable example:

    import bsa_cli as bsa

    case = bsa.load_case("out/smoke/smoke-bnsd-random.fp16")
    dq, dk, dv = my_backward(case.inputs, **case.op_args)
    result = bsa.judge(case, dq, dk, dv)      # the verdict `bsa compare` gives for the same outputs
    bsa.assert_passed(result)                 # AssertionError naming the deciding check

A case folder of the forward (`NAME@forward`) is judged on `bsa.judge(case, out=..., lse=...)`, one of the
pair (`NAME@chain`, `NAME@autograd`) on `bsa.judge(case, out=, lse=, dq=, dk=, dv=)`.

Gradients may be NumPy arrays or torch tensors (on any device with `.cpu()`; bfloat16 moves bit for
bit). torch is imported only once a tensor is given or asked for.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .compare import HASH_THREADS, OP_TENSORS, PASS, CaseResult, DeviceOutcome, RunSettings, judge_outcome
from .core import rounding
from .core.case import ACLNN_STATUS, Case, numpy_dtype
from .core.errors import DataError
from .ops import Op, get, interface
from .store import MANIFEST, load_manifest, read_array, select_cases
from .store.manifest import Manifest

if TYPE_CHECKING:
    import torch

__all__ = [
    "LoadedCase",
    "aclnn_status",
    "assert_passed",
    "case_dirs",
    "failure_message",
    "judge",
    "judge_status",
    "load_case",
    "to_numpy",
    "to_torch",
]


@dataclass(frozen=True, eq=False)
class LoadedCase:
    """A case directory written by `bsa gen`, with its inputs read and checked against their sha256.

    `inputs` holds NumPy arrays keyed by the manifest's input names (query, key, value, dout,
    attention_out, softmax_lse, block_sparse_mask; bfloat16 as `ml_dtypes.bfloat16`; a forward folder has
    query, key, value and the int8 mask, a chain or autograd folder also dout). A negative case may lack an
    input: the operator is then to receive a null tensor. The golden and benchmark outputs are read on
    first use.
    """

    dir: Path
    #: The whole case.json (`manifest.Manifest`: its questions, and read-only mapping access to the JSON).
    manifest: Manifest = field(repr=False)
    inputs: Mapping[str, np.ndarray] = field(repr=False)

    @property
    def name(self) -> str:
        """The case's name (its directory's name)."""
        return self.manifest.name

    @property
    def op(self) -> Op:
        """The operator call this case folder tests: backward, forward, chain or autograd (`bsa_cli.ops`)."""
        return self.manifest.op

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs `judge` takes for this folder's op: dq, dk, dv; out, lse; or all five for the pair."""
        return OP_TENSORS[self.op]

    @property
    def skip(self) -> str | None:
        """Why gen made no files for this op of the case (its operator refuses what another accepts), or None."""
        return self.manifest.skip

    @property
    def params(self) -> dict[str, Any]:
        """A copy of the manifest's `params`: the operator's parameters as the case records them."""
        return copy.deepcopy(dict(self.manifest.params))

    @property
    def expect(self) -> int:
        """The aclnn status the operator should return: 0, or an error code for a negative case."""
        return self.manifest.expect_status

    @property
    def expect_name(self) -> str:
        """The name of the expected status (ACLNN_SUCCESS, ACLNN_ERR_PARAM_INVALID, ...)."""
        return self.manifest.expect_name or ""

    @property
    def op_args(self) -> dict[str, Any]:
        """Return the operator's non-tensor arguments, named and ordered as torch_npu's binding has them.

        `block_shape`, `actual_seq_lengths`, `actual_seq_lengths_kv` (`interface.call_lengths`: a BNSD
        case without lengths passes [S] * B), `q_input_layout`, `kv_input_layout`, `num_key_value_heads`
        and `scale_value` (the scale the operator receives, a double). Pass them after the seven tensors.
        """
        params = self.manifest.params
        q_lengths, kv_lengths = interface.call_lengths(params)
        block_shape = params.get("block_shape")
        return {
            "block_shape": list(block_shape) if block_shape is not None else None,
            "actual_seq_lengths": q_lengths,
            "actual_seq_lengths_kv": kv_lengths,
            "q_input_layout": params.get("layout"),
            "kv_input_layout": params.get("kv_layout", params.get("layout")),
            "num_key_value_heads": params.get("num_kv_heads"),
            "scale_value": params.get("scale"),
        }

    @cached_property
    def geometry(self) -> Case:
        """The case's geometry (shapes, lengths, blocks), as `manifest.case_from_manifest` rebuilds it."""
        return self.manifest.case

    @cached_property
    def golden(self) -> dict[str, np.ndarray]:
        """The golden outputs of the op (dq, dk, dv; out, lse for the forward; all five for the pair; float32 or
        float64), read and sha256-checked; empty for a negative case."""
        return self._section("golden")

    @cached_property
    def benchmark(self) -> dict[str, np.ndarray]:
        """The kernel-faithful outputs in the case dtype (lse float32), read and sha256-checked; empty for a
        negative case."""
        return self._section("benchmark")

    def _section(self, section: str) -> dict[str, np.ndarray]:
        entries = self.manifest.section(section)
        return {name: _read(self.dir, section, name, entries[name]) for name in self.outputs if name in entries}


def load_case(case_dir: str | Path) -> LoadedCase:
    """Load one case directory written by `bsa gen`: its manifest and its inputs, sha256-checked.

    Raises:
        DataError: no case.json (naming the case folders inside when `case_dir` is a suite), a malformed
            manifest, or an input file that is missing, of the wrong size or stale.
    """
    case_dir = Path(case_dir)
    path = case_dir / MANIFEST
    if not case_dir.exists():
        raise DataError(str(case_dir), "no such directory")
    if not path.is_file() and case_dir.is_dir():
        inside = sorted(p.parent.name for p in case_dir.glob(f"*/{MANIFEST}"))
        if inside:
            shown = ", ".join(inside[:3]) + (", ..." if len(inside) > 3 else "")
            raise DataError(str(path), f"missing: {case_dir} holds {len(inside)} cases ({shown}); load one of them")
    manifest = load_manifest(case_dir)
    try:
        case = manifest.case
        entries = manifest.inputs
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(str(path), f"malformed manifest ({type(exc).__name__}: {exc})") from None
    wanted = manifest.op.inputs
    if case.expect.ok and manifest.skip is None:
        missing = [name for name in wanted if entries.get(name) is None]
        if missing:
            every = "all seven" if manifest.op.is_default else f"{', '.join(wanted)} ({manifest.op})"
            raise DataError(str(path), f"no inputs entry for {', '.join(missing)} (a valid case has {every})")
    inputs = {str(name): _read(case_dir, "inputs", str(name), entry) for name, entry in manifest.entries("inputs")}
    return LoadedCase(case_dir, manifest, inputs)


def case_dirs(*roots: str | Path, patterns: Sequence[str] = ()) -> list[Path]:
    """Return the case directories under `roots` whose names match any glob of `patterns` (all without).

    Raises:
        DataError: a root is not a directory, holds no cases, or no case matches.
    """
    return select_cases([Path(r) for r in roots], patterns)


def _read(case_dir: Path, section: str, name: str, entry: Any) -> np.ndarray:
    """Read one manifest array entry; a malformed entry is a DataError naming it."""
    try:
        return read_array(case_dir, entry)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(
            str(case_dir / MANIFEST), f"{section}.{name}: malformed entry ({type(exc).__name__}: {exc})"
        ) from None


# ---- judging ------------------------------------------------------------------------------------


def judge(
    case: LoadedCase,
    dq: Any = None,
    dk: Any = None,
    dv: Any = None,
    *,
    out: Any = None,
    lse: Any = None,
    settings: RunSettings | None = None,
    device: str | None = None,
    prefilled: bool = False,
) -> CaseResult:
    """Judge the outputs of a call that returned successfully, as `bsa compare` judges them from files.

    Which outputs depends on the case folder's op (`case.op`, `case.outputs`): the backward's dq, dk, dv
    (positional, as before); the forward's `out=` and `lse=`; the pair's (chain, autograd) `out=`, `lse=`,
    `dq=`, `dk=`, `dv=`: the forward step's outputs and the backward's gradients.

    Args:
        case: from `load_case`.
        dq, dk, dv: NumPy arrays or torch tensors (any device with `.cpu()`) of the case's dtype and of
            query's and key's shapes.
        out, lse: the forward's attentionOut (case dtype, query's shape) and softmaxLse (float32, the
            manifest's `outputs.lse` shape), as the call left them (rows the forward does not write are not
            judged; with softmax_lse_flag 0 lse is not judged).
        settings: comparison settings for this judgement, as `bsa compare --standard/--threshold/--padding`
            give them (default: the case's own).
        device: a label for who computed the outputs (reports show it).
        prefilled: the output buffers were filled with NaN before the call (fp16 0x7E00, bf16 0x7FC0, fp32
            0x7FC00000), so `rows-written` also checks that rows the forward must leave alone were left
            alone. torch_npu allocates its outputs: leave it False then.

    Returns:
        The verdict (`result.passed`, `result.verdict`, `result.checks`, `result.deciding`, `result.message`).
        A negative case fails: the operator should have refused the call. Bad golden or benchmark files
        give an ERROR verdict, naming the file; a folder gen skipped is a SKIP (no outputs needed).

    Raises:
        ValueError: an output the op needs is missing, one it does not have is given (naming both lists), or
            one is not of the case's dtype and shape (naming it, what was expected and what was given).
        TypeError: an output is neither a NumPy array nor a torch tensor.
    """
    given = {k: v for k, v in (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv)) if v is not None}
    op = _loaded(case).op
    wanted = OP_TENSORS[op]
    if _loaded(case).skip is not None:
        return _judge(case, DeviceOutcome(0, None, None, device), settings)
    extra = [name for name in given if name not in wanted]
    missing = [name for name in wanted if name not in given]
    if extra or missing:
        how = "dq, dk, dv" if get(op).is_default else ", ".join(f"{n}=..." for n in wanted)
        parts = [f"{', '.join(missing)} missing"] if missing else []
        if extra:
            parts.append(f"{', '.join(extra)} given, but the {op} has no {' or '.join(extra)}")
        raise ValueError(
            f"{case.name}: {'; '.join(parts)}: the {op}'s outputs are {', '.join(wanted)} (bsa.judge(case, {how}))"
        )
    outputs = {name: to_numpy(given[name], name) for name in wanted}
    return _judge(case, DeviceOutcome(0, None, outputs, device, prefilled=prefilled), settings)


def _loaded(case: Any) -> LoadedCase:
    """Return `case` if it is what `load_case` returns; TypeError otherwise."""
    if not (isinstance(getattr(case, "dir", None), Path) and isinstance(getattr(case, "manifest", None), Mapping)):
        raise TypeError(f"case: a {type(case).__name__}; expected what bsa.load_case returns")
    return case  # type: ignore[no-any-return]


def judge_status(
    case: LoadedCase, outcome: int | BaseException, message: str | None = None, *, device: str | None = None
) -> CaseResult:
    """Judge a call that did not return gradients: the aclnn status it returned, or the exception it raised.

    A negative case passes when the status is the one it expects. An exception is judged on the aclnn
    status its message carries (`aclnn_status`); one that carries none cannot be judged (ERROR): pass
    the status yourself if you know it. A valid case fails on any status other than 0.

    Args:
        case: from `load_case`.
        outcome: the aclnn status, or the exception the call raised (torch_npu raises RuntimeError).
        message: what the operator said (default: the exception's text).
        device: a label for who ran the call.
    """
    if isinstance(outcome, BaseException):
        text = str(outcome).strip()
        status = aclnn_status(text)
        message = message or text or type(outcome).__name__
        problems: tuple[str, ...] = ()
        if status is None:
            problems = (f"the call raised {type(outcome).__name__} without an aclnn status in its message: {text!r}",)
        return _judge(case, DeviceOutcome(status, message, None, device, problems), None)
    if not isinstance(outcome, int) or isinstance(outcome, bool):
        raise TypeError(f"outcome: a {type(outcome).__name__}; expected an aclnn status (int) or an exception")
    return _judge(case, DeviceOutcome(outcome, message, None, device), None)


def _judge(case: LoadedCase, outcome: DeviceOutcome, settings: RunSettings | None) -> CaseResult:
    _loaded(case)
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        return judge_outcome(case.dir, outcome, case.manifest, settings, pool)


#: An aclnn status in a message: 161xxx (parameters), 361xxx (runtime), 561xxx (inner), ... on its own,
#: not part of a longer number, a time or a path.
_STATUS = re.compile(r"(?<![\w.:/-])([1-5]61\d{3})(?!\w|[.:-]\d)")
_PID = re.compile(r"\bPID\b\W*\d+", re.IGNORECASE)


def aclnn_status(text: str) -> int | None:
    """Return the aclnn status a message names, or None when it names none.

    The status is a six-digit code such as 161001, 161002 or 561002 standing on its own (process ids are
    skipped), or a status name bsa knows (ACLNN_ERR_PARAM_INVALID, ...); the first found counts.
    """
    found = _STATUS.search(_PID.sub(" ", text))
    if found:
        return int(found.group(1))
    named = [(text.find(name), code) for name, code in ACLNN_STATUS.items() if code and name in text]
    return min(named)[1] if named else None


def failure_message(result: CaseResult) -> str:
    """Return why a case did not pass: its deciding check (or errors) first, then the report's details."""
    from .report import case_report_text

    if result.verdict == PASS:
        return f"{result.name}: PASS"
    if result.errors:
        head = f"{result.name}: could not be judged: {result.errors[0]}"
        rest = list(result.errors[1:])
    else:
        deciding = result.deciding
        head = f"{result.name}: {result.verdict} ({result.standard}): {deciding.detail if deciding else ''}"
        first = f"FAIL {deciding.detail}" if deciding else None
        rest = [line for line in case_report_text(result).splitlines() if line != first]
    return "\n".join([head, *(f"  {line}" for line in rest)])


def assert_passed(result: CaseResult) -> None:
    """Raise AssertionError unless `result` passed; its message starts with the deciding check.

    Raises:
        AssertionError: the verdict is FAIL or ERROR (`failure_message`).
    """
    __tracebackhide__ = True  # pytest shows the test's line, not this one
    if result.verdict != PASS:
        raise AssertionError(failure_message(result))


# ---- NumPy and torch ----------------------------------------------------------------------------


def to_numpy(value: Any, name: str = "array") -> np.ndarray:
    """Return a NumPy array of `value`: an array as it is, a torch tensor moved to the CPU.

    bfloat16 becomes `ml_dtypes.bfloat16` through a 16-bit integer view, without rounding.

    Raises:
        TypeError: `value` is neither (the message names it by `name`).
    """
    if isinstance(value, np.ndarray):
        return value
    if not any(c.__name__ == "Tensor" and c.__module__.split(".")[0] == "torch" for c in type(value).__mro__):
        raise TypeError(f"{name}: a {type(value).__name__}; expected a NumPy array or a torch tensor")
    import torch  # the caller's tensor has imported it already

    tensor = value.detach().cpu().contiguous()  # .cpu() of a CPU tensor is the tensor itself
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return tensor.numpy()


def to_torch(array: np.ndarray) -> torch.Tensor:
    """Return a CPU torch tensor of a NumPy array (a copy; `ml_dtypes.bfloat16` becomes torch.bfloat16 bit for bit).

    Call `.npu()` (or `.to(device)`) on it to move it to a device.
    """
    import torch

    array = np.array(array, order="C", copy=True)  # owned and writable: torch shares its memory
    if rounding.is_bfloat16(array.dtype):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
