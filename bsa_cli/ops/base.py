"""`Op`: one operator call a case tests, with everything that differs between the calls as its attributes.

Every layer asks the op (`op.calls_forward`, `op.outputs`, `op.folder(name)`) and never compares its name.
An `Op` is the string of its name, so a case folder's name, case.json's `op` and a report's JSON hold it
as they always did, and `ops.get(name)` turns any of them back into the op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, NoReturn

if TYPE_CHECKING:
    from ..core.case import Case
    from .interface import Call, Violation

#: Between a case's name and its op in the folder of an op other than the backward.
SEPARATOR: Final = "@"

#: bsa's innerPrecise for the forward: 0 (fp32 softmax; the only value the A2/A3 forward takes for bf16).
#: torch_npu's `npu_block_sparse_attention` defaults to 1 (`BINDING_DEFAULTS`).
INNER_PRECISE_DEFAULT: Final = 0

#: bsa's softmaxLseFlag for the forward: 1 (lse written, as the backward needs it). torch_npu defaults to 0,
#: which leaves lse unwritten (`BINDING_DEFAULTS`).
SOFTMAX_LSE_FLAG_DEFAULT: Final = 1

#: torch_npu's defaults for the forward's own parameters (op-plugin op_plugin_functions.yaml, master 517f2e7d).
BINDING_DEFAULTS: Final = {"inner_precise": 1, "softmax_lse_flag": 0}

#: innerPrecise values the forward's aclnn accepts (4 only on Ascend 950).
INNER_PRECISE_VALUES: Final = (0, 1, 4)

#: The inputs of the backward's call, in its manifest's order.
BACKWARD_INPUTS: Final = ("query", "key", "value", "dout", "attention_out", "softmax_lse", "block_sparse_mask")
GRAD_NAMES: Final = ("dq", "dk", "dv")
#: What one element of each gradient sums over (dq = dS K over the keys; dk = dS^T Q and dv = P^T dO over the
#: query rows of every query head of its group): "kv" the keys, "q" the query rows times the group size.
ACCUMULATES_OVER: Final = {"dq": "kv", "dk": "q", "dv": "q"}
#: torch_npu's function of the forward.
FORWARD_BINDING: Final = "npu_block_sparse_attention"
#: torch_npu's function of the backward.
BACKWARD_BINDING: Final = "npu_block_sparse_attention_backward"
#: The backward through torch's autograd (torch_npu's derivatives.yaml link).
AUTOGRAD_STEP: Final = "out.backward(dout)"
#: A pair's steps, each a call of its own in a chain (`Case.step_scales`; a chain folder's `params.<step>_scale`).
PAIR_STEPS: Final = ("forward", "backward")
#: The forward's outputs (attentionOut, softmaxLse) in the folders of the ops that call it.
FORWARD_OUTPUTS: Final = ("out", "lse")


class Op(str):
    """An operator call a case tests: its name, and what every layer asks of it.

    Attributes:
        inputs: the inputs of its case folder, in its manifest's order (a null tensor left out).
        outputs: what a device writes in its folder (and what its golden and benchmark hold).
        calls_forward: it calls aclnnBlockSparseAttention (the forward's rules and parameters apply).
        calls_backward: it calls aclnnBlockSparseAttentionGrad.
        pair: the backward runs on the forward's own attentionOut and softmaxLse (a training step).
        summary: one line for `--help` and docs.
        torch_npu_calls: what a torch_npu device calls for it, in order (torch_npu's functions;
            `out.backward(dout)`: torch's autograd link).
        autograd_only: it runs only through torch's autograd: a device without it (the reference device,
            a C++ harness) cannot run it.
        scales_per_step: its forward and backward are two calls, each given its own scaleValue (a case's
            `step_scales`); autograd hands the forward's to the backward (op-plugin derivatives.yaml, 517f2e7d).
    """

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    calls_forward: bool
    calls_backward: bool
    pair: bool
    summary: str
    #: The operators it calls, in order (`interface.BACKWARD_CALL`, `forward_interface.FORWARD_CALL`): whose
    #: interface rules, undefined behaviour and kernel constraints apply to it.
    steps: tuple[Call, ...]
    #: The mask dtype its call passes whatever the case's (the forward's int8), or None: the case's.
    mask_dtype: str | None
    #: Whose steps its refusals name ("the chain's": "the chain's forward step refuses ..."); "" for one step.
    step_owner: str
    torch_npu_calls: tuple[str, ...]
    autograd_only: bool
    scales_per_step: bool

    def __new__(
        cls,
        name: str,
        *,
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        calls_forward: bool,
        calls_backward: bool,
        summary: str,
        steps: tuple[Call, ...] = (),
        mask_dtype: str | None = None,
        step_owner: str = "",
        torch_npu_calls: tuple[str, ...] = (),
        autograd_only: bool = False,
        scales_per_step: bool = False,
    ) -> Op:
        # each attribute (but pair) is the argument of its name; set in vars(), not through __setattr__: an op is frozen
        given = {key: value for key, value in locals().items() if key in Op.__annotations__}
        op = super().__new__(cls, name)
        vars(op).update(given, pair=calls_forward and calls_backward)
        _BY_NAME[name] = op
        return op

    def __setattr__(self, key: str, value: Any) -> NoReturn:
        raise AttributeError(f"an Op is frozen: cannot set {key}")

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return get, (str(self),)  # unpickled as the one op of that name (worker processes)

    @property
    def name(self) -> str:
        return str(self)

    @property
    def is_default(self) -> bool:
        """Whether its folder is the case's own name (the backward: bsa's case folders of old)."""
        return not self.calls_forward

    def folder(self, case_name: str) -> str:
        """Return the case folder of this op of a case: the name itself for the backward, `NAME@op` otherwise."""
        return case_name if self.is_default else f"{case_name}{SEPARATOR}{self}"

    def violation(self, case: Case) -> tuple[Call, Violation] | None:
        """Return the first rule this op of a case breaks, with the call that refuses it, or None when every
        operator it calls accepts the case."""
        for call in self.steps:
            found = call.violations(case)
            if found:
                return call, found[0]
        return None

    def status(self, case: Case) -> tuple[int, str]:
        """Return the status this op of a case returns and the first broken rule's message ("" when accepted;
        an op of two steps says which: "forward: ...")."""
        found = self.violation(case)
        if found is None:
            return 0, ""
        call, violation = found
        prefix = f"{call.name}: " if self.pair else ""
        return violation.status, f"{prefix}{violation.key}: {violation.message}"

    def refusal(self, case: Case) -> str | None:
        """Return how this op of a case is refused, for a skip reason ("the A2/A3 forward refuses block_shape
        [128, 64]: Y % 128 != 0 (tiling, 561002)"; "the chain's backward step refuses ..."), or None."""
        found = self.violation(case)
        if found is None:
            return None
        call, v = found
        who = f"{self.step_owner} {call.name} step" if self.step_owner else call.refuser
        return f"{who} refuses {v.key} {v.message} ({call.stages.get(v.status, 'aclnn')}, {v.status})"


#: Every op by its name, as each op's module defines it.
_BY_NAME: dict[str, Op] = {}


def get(name: str) -> Op:
    """Return the op of a name (an `Op` is returned as it is).

    Raises:
        ValueError: a name that is no op.
    """
    op = find(name)
    if op is None:
        raise ValueError(f"{name!r:.60}: ops are {', '.join(_BY_NAME)}")
    return op


def find(name: object) -> Op | None:
    """Return the op a value names, or None when it names none (a manifest's `op` is untrusted)."""
    return _BY_NAME.get(name) if isinstance(name, str) else None
