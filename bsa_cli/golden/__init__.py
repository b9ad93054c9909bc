"""Block-sparse attention forward and backward on arrays: the golden and the kernel-faithful path.

Pure computation: arrays in, arrays out. Nothing here prints or touches files.

Every function works block row by block row: for one query head and one query block row it gathers the
selected key/value blocks into one contiguous array and does one matrix product per formula, so no
Sq x Skv matrix ever exists and memory grows with the sequence length, not its square. A block row whose
selection is very wide (long causal rows) is cut into groups of query rows (`walk._TILE_ELEMENTS`), and the
dK/dV products are added a bounded number of blocks at a time, so working memory stays bounded too. Work
buffers are reused from row to row, and inputs are upcast one block row at a time.

One walker (`walk`) does that for every function here; what it computes per tile of query rows is a
precision path (`paths`), its parameter:

* `_Forward` (`forward` / `forward_sequence`): always float64, so the generated `attentionOut` and
  `softmaxLse` are stable across machines once rounded to the tensor dtypes.
* `_Golden` (`backward` / `backward_sequence`): the formulas of docs/operator.md section 1 on the GIVEN out and
  lse, computed in float32 (the CANN "golden": inputs upcast to fp32) or float64.
* `_Kernel` (`backward_kernel` / `backward_sequence_kernel`): the A2/A3 kernel's precision path (docs/operator.md
  section 2): fp32 scores and probabilities, P and dS rounded to the input dtype before the products that use
  them, fp32 accumulation, scale applied to dQ and dK at the end, outputs cast to the input dtype.
* `_ForwardGolden` (`forward_backward` / `forward_backward_sequence`): the first two in one pass: per block
  row the float64 forward, out and lse rounded to the tensor dtypes right there, then that row's golden
  backward from the ROUNDED out and lse. The scores are not computed again: the backward's
  `P = exp(S - lse)` is the forward's float64 `exp(S - rowmax)` times `exp(rowmax - lse)`, which is the same
  formula on the same given lse, only more accurate than a float32 recomputation. Out and lse are bit for bit
  those of `forward` rounded; the gradients agree with `backward`'s to its own rounding.

`golden_and_benchmark` is what `bsa gen` computes: `_ForwardGolden` and, reading the out and lse it rounds,
`_Kernel`. Each (path, batch entry, kv head) is one walk with accumulators of its own, so walks can run in
threads side by side (`jobs`, BLAS on one thread each) and give the same bits as one after the other:
the benchmark walk of a kv head follows its golden walk tile by tile.

Semantics shared by all: a query block row with no selected kv block is empty (dq = 0 there, out = 0);
a kv position that no query selects gets dk = dv = 0; in a partial last block only real rows and
columns take part. The lse of an empty row is never read.

The modules, each importing only those before it: `numerics` (buffers, gathered and padded blocks, row
chunks, scattered products), `paths` (the precision paths, `KernelRange`, `watching`), `walk` (the walker,
threads, `reporting`), `compute` (the functions this face hands on), `forward_op` (the forward operator's
kernel-faithful path and the golden and benchmark of forward and chain folders; its docstring says how).
"""

from .compute import backward as backward
from .compute import backward_kernel as backward_kernel
from .compute import backward_sequence as backward_sequence
from .compute import backward_sequence_kernel as backward_sequence_kernel
from .compute import forward as forward
from .compute import forward_backward as forward_backward
from .compute import forward_backward_sequence as forward_backward_sequence
from .compute import forward_sequence as forward_sequence
from .compute import golden_and_benchmark as golden_and_benchmark
from .forward_op import chain_golden_and_benchmark as chain_golden_and_benchmark
from .forward_op import forward_case as forward_case
from .forward_op import forward_golden_and_benchmark as forward_golden_and_benchmark
from .forward_op import forward_kernel as forward_kernel
from .forward_op import written_rows as written_rows
from .paths import KernelRange as KernelRange
from .paths import watching as watching
from .walk import reporting as reporting
