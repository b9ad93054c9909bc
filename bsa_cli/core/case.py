"""The validated, immutable description of one test case, and its tensor geometry.

`spec` (bsa_cli/specs/) builds `Case` objects from YAML; everything downstream (inputs, golden, store) reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from . import rounding


class _Dtypes(Mapping[str, np.dtype]):
    """Dtype names and their NumPy dtypes; bfloat16's (ml_dtypes') is loaded when it is first looked up."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names

    def __getitem__(self, name: str) -> np.dtype:
        if name not in self._names:
            raise KeyError(name)
        return rounding.bfloat16() if name == "bfloat16" else np.dtype(name)

    def __contains__(self, name: object) -> bool:  # by name: Mapping's would look the dtype up
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


#: Dtype names used in specs and manifests, and their NumPy dtypes (bfloat16 from ml_dtypes, loaded when used).
DTYPES: Mapping[str, np.dtype] = _Dtypes(
    ("float16", "bfloat16", "float32", "float64", "uint8", "int64", "int8", "int32", "bool")
)

#: A tensor layout the operator computes: BNSD ([B, N, S, D]: batch, heads, sequence, head dim) or TND ([T, N, D]:
#: the tokens of every batch entry one after another, cut by the actual lengths). A negative case may carry
#: another layout string (`spec` admits up to 16 letters, digits or '_'), which the operator refuses.
Layout = Literal["BNSD", "TND"]

#: How the operator receives actual lengths: per batch entry, or cumulative end offsets without a leading 0.
SeqLengthsEncoding = Literal["per_batch", "cumulative"]
SEQ_LENGTHS_ENCODINGS: tuple[SeqLengthsEncoding, ...] = ("per_batch", "cumulative")
#: softmax_lse's shape: [.., 1] at the end, or without it.
LseShape = Literal["trailing_one", "squeezed"]
LSE_SHAPES: tuple[LseShape, ...] = ("trailing_one", "squeezed")
#: What a golden assumes of BNSD actual lengths: honored (doc: padding skipped), ignored (A2/A3 code: full S).
BnsdLengths = Literal["honored", "ignored"]
BNSD_LENGTHS: tuple[BnsdLengths, ...] = ("honored", "ignored")
#: The precision a golden is computed in.
Precision = Literal["float32", "float64"]
PRECISIONS: tuple[Precision, ...] = ("float32", "float64")
DEFAULT_PRECISION: Precision = "float32"

#: The only preTokens/nextTokens value the operator accepts.
MAX_TOKENS = 2147483647

#: aclnn status names and codes that cases can expect.
ACLNN_STATUS = {
    "ACLNN_SUCCESS": 0,
    "ACLNN_ERR_PARAM_NULLPTR": 161001,
    "ACLNN_ERR_PARAM_INVALID": 161002,
    "ACLNN_ERR_INNER_TILING_ERROR": 561002,
    "ACLNN_ERR_INNER_NULLPTR": 561103,  # the forward's infershape failures (forward_interface)
}

#: Every tensor of the aclnn call, in its parameter order; `atten_mask` is absent (null) unless a case gives it.
TENSOR_NAMES = (
    "dout",
    "query",
    "key",
    "value",
    "attention_out",
    "softmax_lse",
    "block_sparse_mask",
    "atten_mask",
    "dq",
    "dk",
    "dv",
)


@dataclass(frozen=True)
class TensorOverride:
    """A tensor of the call made different on purpose (negative cases; a bool mask in valid ones too).

    `null` passes a null pointer; `dtype` and `shape` replace the tensor's own (None: unchanged). For
    `atten_mask`, which is null by default, any override other than `null` passes a tensor.
    """

    name: str
    null: bool = False
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


def numpy_dtype(name: str) -> np.dtype:
    """Return the NumPy dtype for a manifest dtype name."""
    return np.dtype(DTYPES[name])


@dataclass(frozen=True)
class Sparsity:
    """How the block mask is drawn: a pattern, its parameters, and query-block rows forced empty."""

    pattern: str = "dense"  # dense | random | causal | sliding_window | strided | explicit
    density: float = 0.5  # random
    window: int = 1  # sliding_window, strided: blocks to the left of and including the diagonal
    stride: int = 4  # strided: every stride-th block column is also selected
    #: explicit: bool array broadcastable to [B, N1, nQ, nKV] (one [nQ, nKV] map, per head, or per batch+head).
    explicit: np.ndarray | None = field(default=None, compare=False, hash=False)
    explicit_source: str | None = None  # file path or 'inline', for the manifest
    empty_rows: float | tuple[int, ...] = ()  # fraction of query-block rows, or their indices
    per_head: bool = True  # random pattern: draw each query head's mask separately
    #: Patterns with a diagonal (causal, sliding_window, strided). top_left: query block i's diagonal is kv
    #: block i (block indices, the same for every batch entry). bottom_right: the diagonal of each batch entry's
    #: last query token is its last key token (query token t sees key tokens k <= t + Skv - Sq, per batch entry);
    #: a block is kept when any of its keys is visible to any of its queries.
    causal_alignment: str = "top_left"  # top_left | bottom_right: where the diagonal of causal-like patterns sits


@dataclass(frozen=True)
class Outliers:
    """A fraction of a tensor's rows (tokens, per head) or channels (of D) scaled by a large factor."""

    fraction: float = 0.01
    factor: float = 20.0
    axis: str = "token"  # token | channel


@dataclass(frozen=True)
class RowScale:
    """Every row (token, per head) of a tensor scaled by its own factor, log-uniform in [low, high]."""

    low: float = 1e-3
    high: float = 1e2


@dataclass(frozen=True)
class Distribution:
    """Values of one input tensor: normal(mean, std), uniform(low, high) or noisy (normal, 0.1% of the values
    x1000), with optional stress shapes."""

    #: normal | uniform | noisy (normal, then the commercial standard's outliers: `inputs.stress`) | exact
    #: (the integers and halves in [low, high])
    kind: str = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: float = -1.0
    high: float = 1.0
    outliers: Outliers | None = None
    row_scale: RowScale | None = None


@dataclass(frozen=True)
class Sink:
    """An attention sink: key `token` of every sequence, which most queries score `strength` above the rest.

    The queries of each kv-head group get a shared direction u added (twice their std); the sink key is
    set to a multiple of u so that its scaled score is about `strength` for the typical query.
    """

    token: int = 0
    strength: float = 8.0


@dataclass(frozen=True)
class Init:
    """Value distributions of query, key, value and dout, and the case-level stress shapes."""

    query: Distribution = Distribution()
    key: Distribution = Distribution()
    value: Distribution = Distribution()
    dout: Distribution = Distribution()
    sink: Sink | None = None
    #: Set: query and key are drawn normal(0, s) with s chosen so that scale * q.k has this std (peaked
    #: softmax for tens, near-uniform for hundredths); None: their own distributions.
    logit_std: float | None = None


@dataclass(frozen=True)
class Expect:
    """The aclnn status a case expects: 0 for a valid call, an error code for a negative case.

    `verdict` and `cause` are for the pair (ops chain and autograd) only: a chain that must fail for a named
    cause (a pitfall of the pair, cases/chain.yaml) says `verdict: FAIL` and the cause its report must name;
    compare then passes it when it fails for that cause, and fails it otherwise.
    """

    status: int = 0
    name: str = "ACLNN_SUCCESS"
    verdict: str = "PASS"  # PASS | FAIL: what judging the pair must conclude
    cause: str | None = None  # the cause a FAIL must name (docs/compare.md, "The pair")

    @property
    def ok(self) -> bool:
        return self.status == 0


@dataclass(frozen=True)
class Case:
    """One fully expanded, validated case.

    Lengths are always per batch here (`actual_seq_lengths[b]` tokens of batch b); the manifest writes
    them in `seq_lengths_encoding`. For BNSD, `q_seq_len`/`kv_seq_len` are the S dimensions of the tensors
    and the actual lengths are optional; for TND they are the maxima of the actual lengths.
    """

    name: str
    source: str  # spec file the case came from
    layout: Layout  # the same for q and kv unless a negative case says otherwise
    dtype: str  # float16 | bfloat16 (other names only in negative cases)
    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_seq_len: int
    kv_seq_len: int
    actual_seq_lengths: tuple[int, ...] | None
    actual_seq_lengths_kv: tuple[int, ...] | None
    block_shape: tuple[int, ...]  # [X, Y]; other lengths or values only in negative cases, () for null
    scale: float  # scaleValue as passed to the interface (a double)
    seed: int
    sparsity: Sparsity = Sparsity()
    init: Init = Init()
    expect: Expect = Expect()
    kv_layout: Layout | None = None  # None: same as layout
    seq_lengths_encoding: SeqLengthsEncoding = "per_batch"
    lse_shape: LseShape = "trailing_one"
    bnsd_lengths: BnsdLengths = "honored"  # honored (doc: padding skipped) | ignored (A2/A3 code: full S)
    empty_row_lse: float = math.inf  # softmaxLse written for query rows with no selected block
    mask_type: int = 0
    pre_tokens: int = MAX_TOKENS
    next_tokens: int = MAX_TOKENS
    #: Tensors of the call passed null or with another dtype or shape (see `tensor_descs`).
    tensors: tuple[TensorOverride, ...] = ()
    #: Per-case comparison settings from the spec (standard name, thresholds), passed through to the manifest.
    compare: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    warnings: tuple[str, ...] = ()  # kernel constraints this case is outside of
    release: str = "master"  # the operator release whose rules decide its expected status (interface.RELEASES)
    null_layouts: tuple[str, ...] = ()  # "q", "kv": layouts the call passes as null pointers (shapes follow layout)
    ops: tuple[str, ...] = ("backward",)  # the operator calls the case tests (bsa_cli/ops/: `Op`s), in OPS order
    inner_precise: int = 0  # the forward's innerPrecise (0 fp32 softmax, 1 fp16)
    softmax_lse_flag: int = 1  # the forward's softmaxLseFlag (1: lse written)
    #: The scaleValue a chain's step ("forward", "backward") is called with where it is not `scale` (the function
    #: meant, which the golden computes): `(("forward", 1.0),)` is a forward left at cann_ops_transformer's default.
    step_scales: tuple[tuple[str, float], ...] = ()
    #: (copy, source) batch entries: entry `copy` holds exactly entry `source`'s sequence (inputs and mask), so
    #: a device must give it bit-identical gradients (the batch-consistency check, TTK's --dl 3).
    copies: tuple[tuple[int, int], ...] = ()
    #: Ops whose expected status differs from `expect` (set by specs/build from each op's rules).
    op_expect: tuple[tuple[str, Expect], ...] = ()
    #: Ops the case lists that their operator refuses while another accepts the case: (op, why), not run.
    skipped_ops: tuple[tuple[str, str], ...] = ()

    def expect_of(self, op: str) -> Expect:
        """Return what one op of the case must return (`op_expect`, else `expect`)."""
        return dict(self.op_expect).get(op, self.expect)

    def step_scale(self, step: str) -> float:
        """Return the scaleValue a chain's step ("forward", "backward") is called with (`step_scales`, else `scale`)."""
        return dict(self.step_scales).get(step, self.scale)

    def skip_reason(self, op: str) -> str | None:
        """Return why the case does not run `op` (its operator refuses what another accepts), or None."""
        return dict(self.skipped_ops).get(op)

    # ---- geometry -------------------------------------------------------------------------------

    @property
    def kernel_scale(self) -> float:
        """The scale the kernel computes with: scaleValue rounded to float32, as the op passes it on.

        (ops-transformer 3a280bc, op_host/op_api/block_sparse_attention_grad.cpp: `static_cast<float>`.)
        """
        return float(np.float32(self.scale))

    def override(self, name: str) -> TensorOverride | None:
        """Return the override of tensor `name`, or None."""
        return next((t for t in self.tensors if t.name == name), None)

    def tensor_descs(self) -> dict[str, dict[str, Any]]:
        """Return {name: {"dtype", "shape"}} of every non-null tensor of the call, overrides applied."""
        q, kv = self.q_shape, self.kv_shape
        shapes = {"dout": q, "query": q, "key": kv, "value": kv, "attention_out": q, "softmax_lse": self.lse_shape_dims}
        shapes.update({"block_sparse_mask": self.mask_shape, "dq": q, "dk": kv, "dv": kv})
        dtypes = {"softmax_lse": "float32", "block_sparse_mask": "uint8"}  # the others: the case dtype
        descs: dict[str, dict[str, Any]] = {
            name: {"dtype": dtypes.get(name, self.dtype), "shape": shape} for name, shape in shapes.items()
        }
        for item in self.tensors:
            if item.null:
                descs.pop(item.name, None)
                continue
            desc = descs.setdefault(item.name, {"dtype": "bool", "shape": (self.q_seq_len, self.kv_seq_len)})
            if item.dtype is not None:
                desc["dtype"] = item.dtype
            if item.shape is not None:
                desc["shape"] = item.shape
        return {name: {"dtype": d["dtype"], "shape": tuple(d["shape"])} for name, d in descs.items()}

    @property
    def group_size(self) -> int:
        """Query heads per kv head (N1 / N2)."""
        return self.num_heads // self.num_kv_heads

    @property
    def mask_block_shape(self) -> tuple[int, int]:
        """The block shape that sizes the mask: `block_shape`, or 128 where a negative case breaks it."""
        dims = [d if isinstance(d, int) and d > 0 else 128 for d in self.block_shape[:2]]
        dims += [128] * (2 - len(dims))
        return dims[0], dims[1]

    def as_called(self) -> Case:
        """Return this case with the block shape an op that accepts it computes with (`mask_block_shape`):
        the same case unless a negative case's blockShape is null (the forward reads 128 x 128) or holds more
        than [X, Y] (the backward reads the first two). The golden, the devices and judging compute with it;
        the manifest keeps the blockShape as passed."""
        if self.block_shape == self.mask_block_shape:
            return self
        return dataclasses.replace(self, block_shape=self.mask_block_shape)

    @property
    def num_q_blocks(self) -> int:
        return math.ceil(self.q_seq_len / self.mask_block_shape[0])

    @property
    def num_kv_blocks(self) -> int:
        return math.ceil(self.kv_seq_len / self.mask_block_shape[1])

    @property
    def mask_shape(self) -> tuple[int, int, int, int]:
        """blockSparseMask shape [B, N1, ceil(maxSq/X), ceil(maxSkv/Y)]."""
        return (self.batch, self.num_heads, self.num_q_blocks, self.num_kv_blocks)

    def q_lengths(self) -> tuple[int, ...]:
        """Query tokens per batch that take part in the computation.

        TND without lengths (a negative case) falls back to `q_seq_len` per batch, to give tensors a shape.
        """
        if self.actual_seq_lengths is not None and (self.layout == "TND" or self.bnsd_lengths == "honored"):
            return self.actual_seq_lengths
        return (self.q_seq_len,) * self.batch

    def kv_lengths(self) -> tuple[int, ...]:
        """Key/value tokens per batch that take part in the computation."""
        if self.actual_seq_lengths_kv is not None and (self.layout == "TND" or self.bnsd_lengths == "honored"):
            return self.actual_seq_lengths_kv
        return (self.kv_seq_len,) * self.batch

    @functools.cached_property
    def q_shape(self) -> tuple[int, ...]:
        """Shape of query, dout, attentionOut and dq."""
        if self.layout == "TND":
            return (sum(self.q_lengths()), self.num_heads, self.head_dim)
        return (self.batch, self.num_heads, self.q_seq_len, self.head_dim)

    @functools.cached_property
    def kv_shape(self) -> tuple[int, ...]:
        """Shape of key, value, dk and dv."""
        if self.layout == "TND":
            return (sum(self.kv_lengths()), self.num_kv_heads, self.head_dim)
        return (self.batch, self.num_kv_heads, self.kv_seq_len, self.head_dim)

    @property
    def lse_shape_dims(self) -> tuple[int, ...]:
        """Shape of softmaxLse: the q shape with D replaced by 1, or dropped when `lse_shape` is squeezed."""
        tail = (1,) if self.lse_shape == "trailing_one" else ()
        return self.q_shape[:-1] + tail

    def spans(self) -> list[SequenceSpan]:
        """Where each batch entry's tokens sit in the q and kv tensors."""
        spans = []
        q_start = kv_start = 0
        for b, (q_len, kv_len) in enumerate(zip(self.q_lengths(), self.kv_lengths(), strict=True)):
            spans.append(SequenceSpan(batch=b, q_start=q_start, q_len=q_len, kv_start=kv_start, kv_len=kv_len))
            if self.layout == "TND":
                q_start += q_len
                kv_start += kv_len
        return spans


@dataclass(frozen=True)
class SequenceSpan:
    """One batch entry: its index and where its valid tokens lie.

    For TND the starts are token offsets into the T dimension; for BNSD they are 0 (the batch index
    selects the sequence) and the lengths are the tokens that take part.
    """

    batch: int
    q_start: int
    q_len: int
    kv_start: int
    kv_len: int
