"""The operator calls a case can test, one `Op` each, and their interface rules.

- `backward` (`backward.py`): aclnnBlockSparseAttentionGrad on the golden's rounded attentionOut and
  softmaxLse (what bsa always tested; a case's default, with unchanged files).
- `forward` (`forward.py`): aclnnBlockSparseAttention on query, key, value and the mask.
- `chain` (`chain.py`): the forward, then the backward on the forward's OWN out and lse (a training step).
- `autograd` (`autograd.py`): the chain through torch_npu's autograd; only a torch_npu device runs it.

Every op of a case is one case folder: the backward keeps the case's name (`NAME`), the others are
`NAME@forward`, `NAME@chain`, `NAME@autograd`, so each folder is judged on its own and reports put a
case's ops side by side. The rest of bsa asks an op (`get(name)`) what it needs, never compares its name.
The two operators are `Call`s (`interface.BACKWARD_CALL`, `forward_interface.FORWARD_CALL`: rules, undefined
behaviour, kernel constraints); an op holds those it calls (`Op.steps`) and says its status (`Op.status`,
`Op.refusal`, `Op.violation`).
Loading this package imports no NumPy: spec loading stands on it.
"""

from __future__ import annotations

from typing import Final

from .autograd import AUTOGRAD
from .backward import BACKWARD
from .base import BINDING_DEFAULTS as BINDING_DEFAULTS
from .base import INNER_PRECISE_DEFAULT as INNER_PRECISE_DEFAULT
from .base import INNER_PRECISE_VALUES as INNER_PRECISE_VALUES
from .base import PAIR_STEPS as PAIR_STEPS
from .base import SEPARATOR, Op, find, get
from .base import SOFTMAX_LSE_FLAG_DEFAULT as SOFTMAX_LSE_FLAG_DEFAULT
from .chain import CHAIN
from .forward import FORWARD
from .forward_interface import FORWARD_CALL
from .interface import BACKWARD_CALL, Call

#: Every op, in the order reports show them.
OPS: Final[tuple[Op, ...]] = (FORWARD, BACKWARD, CHAIN, AUTOGRAD)

#: What a case tests unless it says `ops:`: the backward alone, as bsa always did.
DEFAULT_OPS: Final[tuple[Op, ...]] = (BACKWARD,)

#: Every operator the ops call (`Op.steps`), in the order a spec's undefined behaviour and warnings are read.
CALLS: Final[tuple[Call, ...]] = (BACKWARD_CALL, FORWARD_CALL)

#: Ops that call the forward (so the forward's rules and parameters apply).
FORWARD_OPS: Final[tuple[Op, ...]] = tuple(op for op in OPS if op.calls_forward)


def folder_name(case_name: str, op: str) -> str:
    """Return the case folder of one op of a case: the name itself for the backward, `NAME@op` otherwise."""
    return get(op).folder(case_name)


def split_folder_name(folder: str) -> tuple[str, Op]:
    """Return (case name, op) of a case folder's name (`folder_name` inverted; a plain name is the backward)."""
    base, sep, name = folder.rpartition(SEPARATOR)
    op = find(name)
    if sep and base and op is not None and not op.is_default:
        return base, op
    return folder, BACKWARD


def parse_ops(text: str) -> tuple[Op, ...]:
    """Return the ops of a comma-separated list (`--ops forward,backward`), in `OPS` order, each once.

    Raises:
        ValueError: an empty list or a word that is not an op.
    """
    words = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in words if find(w) is None]
    if unknown or not words:
        raise ValueError(f"{', '.join(unknown) or repr(text)}: ops are {', '.join(OPS)}")
    return tuple(op for op in OPS if op in words)
