"""Views of one batch entry in BNSD or TND tensors, always as heads-major [N, S, D] arrays.

The views share memory with the full tensor, so writing into a view fills the full tensor.
"""

from __future__ import annotations

import numpy as np

from .case import Case, SequenceSpan


def q_view(case: Case, tensor: np.ndarray, span: SequenceSpan) -> np.ndarray:
    """Return batch entry `span` of a query-shaped tensor (query, dout, out, dq) as [N1, q_len, D]."""
    if case.layout == "TND":
        return tensor[span.q_start : span.q_start + span.q_len].transpose(1, 0, 2)
    return tensor[span.batch, :, : span.q_len, :]


def kv_view(case: Case, tensor: np.ndarray, span: SequenceSpan) -> np.ndarray:
    """Return batch entry `span` of a key-shaped tensor (key, value, dk, dv) as [N2, kv_len, D]."""
    if case.layout == "TND":
        return tensor[span.kv_start : span.kv_start + span.kv_len].transpose(1, 0, 2)
    return tensor[span.batch, :, : span.kv_len, :]


def lse_view(case: Case, lse: np.ndarray, span: SequenceSpan) -> np.ndarray:
    """Return batch entry `span` of softmaxLse as [N1, q_len]; `lse` has the q shape without D.

    A trailing axis of size one (the manifest's `trailing_one` shape) is accepted and dropped.
    """
    if lse.ndim == len(case.q_shape):
        lse = lse[..., 0]
    if case.layout == "TND":
        return lse[span.q_start : span.q_start + span.q_len].T
    return lse[span.batch, :, : span.q_len]


def mask_view(case: Case, block_mask: np.ndarray, span: SequenceSpan) -> np.ndarray:
    """Return the [N1, nQ, nKV] block mask of batch entry `span`, cut to the blocks its lengths reach.

    Blocks past the entry's actual lengths never take part, whatever the mask says there.
    """
    x, y = case.block_shape
    n_q = -(-span.q_len // x)
    n_kv = -(-span.kv_len // y)
    return block_mask[span.batch, :, :n_q, :n_kv] != 0
