"""The operator calls a case can test: the forward, the backward, and the pair as training runs it.

A leaf (it imports nothing of bsa): `case`, the spec reader, gen, the devices and compare all name ops
with these words.

- `backward`: aclnnBlockSparseAttentionGrad on the golden's rounded attentionOut and softmaxLse (what bsa
  always tested; a case's default, with unchanged files).
- `forward`: aclnnBlockSparseAttention on query, key, value and the mask: attentionOut and softmaxLse.
- `chain`: the forward, then the backward on the forward's OWN out and lse (what a training step does),
  each call with the dtypes it accepts.
- `autograd`: the chain through torch_npu's autograd (`npu_block_sparse_attention` with `requires_grad`
  inputs, then `out.backward(dout)`): only a torch_npu device runs it.

Every op of a case is one case folder: the backward keeps the case's name (`NAME`), the others are
`NAME@forward`, `NAME@chain`, `NAME@autograd`, so each folder is judged on its own and reports put a
case's ops side by side.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Op = Literal["forward", "backward", "chain", "autograd"]
"""An operator call a case tests."""

OPS: Final[tuple[Op, ...]] = get_args(Op)
"""Every op, in the order reports show them."""

DEFAULT_OPS: Final[tuple[Op, ...]] = ("backward",)
"""What a case tests unless it says `ops:`: the backward alone, as bsa always did."""

PAIR_OPS: Final[tuple[Op, ...]] = ("chain", "autograd")
"""Ops that run the forward and then the backward on the forward's own outputs."""

FORWARD_OPS: Final[tuple[Op, ...]] = ("forward", "chain", "autograd")
"""Ops that call the forward (so the forward's rules and parameters apply)."""

SEPARATOR: Final = "@"
"""Between a case's name and its op in the folder of an op other than the backward."""

INNER_PRECISE_DEFAULT: Final = 0
"""bsa's innerPrecise for the forward: 0 (fp32 softmax; the only value the A2/A3 forward takes for bf16).
torch_npu's `npu_block_sparse_attention` defaults to 1 (`BINDING_DEFAULTS`)."""

SOFTMAX_LSE_FLAG_DEFAULT: Final = 1
"""bsa's softmaxLseFlag for the forward: 1 (lse written, as the backward needs it). torch_npu defaults to 0,
which leaves lse unwritten (`BINDING_DEFAULTS`)."""

BINDING_DEFAULTS: Final = {"inner_precise": 1, "softmax_lse_flag": 0}
"""torch_npu's defaults for the forward's own parameters (op-plugin op_plugin_functions.yaml, master 517f2e7d)."""

INNER_PRECISE_VALUES: Final = (0, 1, 4)
"""innerPrecise values the forward's aclnn accepts (4 only on Ascend 950)."""


def folder_name(case_name: str, op: Op) -> str:
    """Return the case folder of one op of a case: the name itself for the backward, `NAME@op` otherwise."""
    return case_name if op == "backward" else f"{case_name}{SEPARATOR}{op}"


def split_folder_name(folder: str) -> tuple[str, Op]:
    """Return (case name, op) of a case folder's name (`folder_name` inverted; a plain name is the backward)."""
    base, sep, op = folder.rpartition(SEPARATOR)
    if sep and base and op in OPS and op != "backward":
        return base, op  # type: ignore[return-value]
    return folder, "backward"


def parse_ops(text: str) -> tuple[Op, ...]:
    """Return the ops of a comma-separated list (`--ops forward,backward`), in `OPS` order, each once.

    Raises:
        ValueError: an empty list or a word that is not an op.
    """
    words = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in words if w not in OPS]
    if unknown or not words:
        raise ValueError(f"{', '.join(unknown) or repr(text)}: ops are {', '.join(OPS)}")
    return tuple(op for op in OPS if op in words)
