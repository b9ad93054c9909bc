"""Independent references for block-sparse attention, for tests only.

Written differently from `bsa_cli.golden` on purpose: dense [Sq, Skv] matrices per batch entry, an
element mask built by repeating the block mask, and batch entries located from the case's lengths by
this module's own arithmetic (not `layout.py`). Two references:

* a dense float64 NumPy formula (forward: masked softmax; backward: docs/operator.md section 1 on the GIVEN
  out and lse);
* a PyTorch float64 autograd peer (masked scores, softmax, matmul, `.backward(dout)`), whose gradients
  come from its own forward, plus `sdpa_sequence` for unmasked or causal attention.

Per-sequence functions take heads-major arrays: query/dout/out [N1, sq, D], key/value [N2, skv, D],
lse [N1, sq], element mask [N1, sq, skv]. Case-level functions take full tensors as `bsa_cli.golden` does.
Everything is only meant for small shapes.
"""

from __future__ import annotations

import numpy as np
import torch

from bsa_cli.core.case import Case


def f64(array: np.ndarray) -> np.ndarray:
    """Return `array` (float16, bfloat16, ...) as float64."""
    return np.asarray(array).astype(np.float64)


def element_mask(block_mask: np.ndarray, q_len: int, kv_len: int, block_shape: tuple[int, int]) -> np.ndarray:
    """Expand one entry's [N1, nQ, nKV] block mask to a bool [N1, q_len, kv_len] element mask.

    The block mask may be larger than the lengths need (sized from the largest entry).
    """
    x, y = block_shape
    rows = np.arange(q_len) // x
    cols = np.arange(kv_len) // y
    return (np.asarray(block_mask) != 0)[:, rows[:, None], cols[None, :]]


def _repeat_kv(tensor: np.ndarray, heads: int) -> np.ndarray:
    """Give every query head its own copy of its kv head: [N2, s, D] -> [N1, s, D]."""
    return np.repeat(tensor, heads // tensor.shape[0], axis=0)


def _sum_groups(tensor: np.ndarray, kv_heads: int) -> np.ndarray:
    """Sum per-query-head gradients over each GQA group: [N1, s, D] -> [N2, s, D]."""
    heads = tensor.shape[0]
    return tensor.reshape(kv_heads, heads // kv_heads, *tensor.shape[1:]).sum(axis=1)


# ---- one batch entry ----------------------------------------------------------------------------


def dense_forward_sequence(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, mask: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return out [N1, sq, D], lse [N1, sq] (nan on empty rows) and empty [N1, sq] in float64."""
    heads = query.shape[0]
    keys, values = _repeat_kv(f64(key), heads), _repeat_kv(f64(value), heads)
    scores = scale * np.einsum("nqd,nkd->nqk", f64(query), keys)
    empty = ~mask.any(axis=-1)
    masked = np.where(mask, scores, -np.inf)
    row_max = np.where(empty, 0.0, masked.max(axis=-1, initial=-np.inf))
    weights = np.where(mask, np.exp(masked - row_max[..., None]), 0.0)
    total = weights.sum(axis=-1)
    safe_total = np.where(empty, 1.0, total)
    out = np.einsum("nqk,nkd->nqd", weights / safe_total[..., None], values)
    lse = np.where(empty, np.nan, row_max + np.log(safe_total))
    return out, lse, empty


def dense_backward_sequence(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    mask: np.ndarray,
    scale: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return float64 dq, dk, dv by the section-1 formulas on dense matrices, from the given out and lse."""
    heads, kv_heads = query.shape[0], key.shape[0]
    dout, query, out = f64(dout), f64(query), f64(out)
    keys, values = _repeat_kv(f64(key), heads), _repeat_kv(f64(value), heads)
    lse = np.where(mask.any(axis=-1), f64(lse), 0.0)  # empty rows: never read
    scores = scale * np.einsum("nqd,nkd->nqk", query, keys)
    probs = np.where(mask, np.exp(np.where(mask, scores, 0.0) - lse[..., None]), 0.0)
    dsum = (dout * out).sum(axis=-1)
    dprobs = np.einsum("nqd,nkd->nqk", dout, values)
    dscores = probs * (dprobs - dsum[..., None])
    dv = np.einsum("nqk,nqd->nkd", probs, dout)
    dq = scale * np.einsum("nqk,nkd->nqd", dscores, keys)
    dk = scale * np.einsum("nqk,nqd->nkd", dscores, query)
    return dq, _sum_groups(dk, kv_heads), _sum_groups(dv, kv_heads)


def torch_sequence(
    dout: np.ndarray, query: np.ndarray, key: np.ndarray, value: np.ndarray, mask: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return out, dq, dk, dv from PyTorch float64 autograd of masked attention (empty rows give 0)."""
    heads = query.shape[0]
    q, k, v = (torch.tensor(f64(t), requires_grad=True) for t in (query, key, value))
    allowed = torch.tensor(mask)
    empty = ~allowed.any(dim=-1, keepdim=True)
    group = heads // k.shape[0]
    scores = scale * q @ k.repeat_interleave(group, dim=0).transpose(-1, -2)
    scores = scores.masked_fill(~allowed, -torch.inf).masked_fill(empty, 0.0)
    probs = torch.softmax(scores, dim=-1) * allowed
    out = probs @ v.repeat_interleave(group, dim=0)
    out.backward(torch.tensor(f64(dout)))
    return tuple(t.detach().numpy() for t in (out, q.grad, k.grad, v.grad))  # type: ignore[return-value]


def sdpa_sequence(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    scale: float,
    is_causal: bool = False,
    attn_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return out, dq, dk, dv from torch's scaled_dot_product_attention (float64, GQA) and autograd."""
    q, k, v = (torch.tensor(f64(t), requires_grad=True) for t in (query, key, value))
    out = torch.nn.functional.scaled_dot_product_attention(
        q[None],
        k[None],
        v[None],
        attn_mask=None if attn_mask is None else torch.tensor(attn_mask),
        is_causal=is_causal,
        scale=scale,
        enable_gqa=True,
    )[0]
    out.backward(torch.tensor(f64(dout)))
    return tuple(t.detach().numpy() for t in (out, q.grad, k.grad, v.grad))  # type: ignore[return-value]


# ---- whole case ---------------------------------------------------------------------------------


def entry_lengths(case: Case) -> list[tuple[int, int]]:
    """Return (q_len, kv_len) per batch entry: TND and honored BNSD lengths use the actual lengths."""
    use_q = case.actual_seq_lengths is not None and (case.layout == "TND" or case.bnsd_lengths == "honored")
    use_kv = case.actual_seq_lengths_kv is not None and (case.layout == "TND" or case.bnsd_lengths == "honored")
    q_lengths = case.actual_seq_lengths if use_q else [case.q_seq_len] * case.batch
    kv_lengths = case.actual_seq_lengths_kv if use_kv else [case.kv_seq_len] * case.batch
    return list(zip(q_lengths, kv_lengths, strict=True))  # type: ignore[arg-type]


def _entry_indexers(case: Case) -> list[tuple[int, tuple, tuple, int, int]]:
    """Return (batch, q index, kv index, q_len, kv_len) per entry; the indices cut TND or BNSD tensors."""
    result = []
    q_offset = kv_offset = 0
    for b, (q_len, kv_len) in enumerate(entry_lengths(case)):
        if case.layout == "TND":
            result.append(
                (b, (slice(q_offset, q_offset + q_len),), (slice(kv_offset, kv_offset + kv_len),), q_len, kv_len)
            )
            q_offset += q_len
            kv_offset += kv_len
        else:
            result.append((b, (b, slice(None), slice(0, q_len)), (b, slice(None), slice(0, kv_len)), q_len, kv_len))
    return result


def _heads_major(case: Case, part: np.ndarray) -> np.ndarray:
    """Return a TND part [s, N, D] (or [s, N] for lse) heads-major; BNSD parts already are."""
    return np.swapaxes(part, 0, 1) if case.layout == "TND" else part


def _squeeze_lse(case: Case, softmax_lse: np.ndarray) -> np.ndarray:
    return softmax_lse[..., 0] if softmax_lse.ndim == len(case.q_shape) else softmax_lse


def dense_forward(
    case: Case, query: np.ndarray, key: np.ndarray, value: np.ndarray, block_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 attention_out and softmax_lse (q shape without D); empty rows: 0, empty_row_lse."""
    out = np.zeros(case.q_shape)
    lse = np.full(case.q_shape[:-1], case.empty_row_lse)
    for b, q_index, kv_index, q_len, kv_len in _entry_indexers(case):
        mask = element_mask(block_mask[b], q_len, kv_len, case.block_shape)
        entry_out, entry_lse, empty = dense_forward_sequence(
            _heads_major(case, query[q_index]),
            _heads_major(case, key[kv_index]),
            _heads_major(case, value[kv_index]),
            mask,
            case.kernel_scale,
        )
        out[q_index] = _heads_major(case, entry_out)
        lse[q_index] = _heads_major(case, np.where(empty, case.empty_row_lse, entry_lse))
    return out, lse


def dense_backward(
    case: Case,
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    attention_out: np.ndarray,
    softmax_lse: np.ndarray,
    block_mask: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return float64 dq, dk, dv of a case from the dense formulas (padding 0)."""
    softmax_lse = _squeeze_lse(case, softmax_lse)
    dq, dk, dv = np.zeros(case.q_shape), np.zeros(case.kv_shape), np.zeros(case.kv_shape)
    for b, q_index, kv_index, q_len, kv_len in _entry_indexers(case):
        grads = dense_backward_sequence(
            _heads_major(case, dout[q_index]),
            _heads_major(case, query[q_index]),
            _heads_major(case, key[kv_index]),
            _heads_major(case, value[kv_index]),
            _heads_major(case, attention_out[q_index]),
            _heads_major(case, softmax_lse[q_index]),
            element_mask(block_mask[b], q_len, kv_len, case.block_shape),
            case.kernel_scale,
        )
        dq[q_index] = _heads_major(case, grads[0])
        dk[kv_index] = _heads_major(case, grads[1])
        dv[kv_index] = _heads_major(case, grads[2])
    return dq, dk, dv


def torch_backward(
    case: Case, dout: np.ndarray, query: np.ndarray, key: np.ndarray, value: np.ndarray, block_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return float64 attention_out, dq, dk, dv of a case from PyTorch autograd (padding 0)."""
    out, dq = np.zeros(case.q_shape), np.zeros(case.q_shape)
    dk, dv = np.zeros(case.kv_shape), np.zeros(case.kv_shape)
    for b, q_index, kv_index, q_len, kv_len in _entry_indexers(case):
        results = torch_sequence(
            _heads_major(case, dout[q_index]),
            _heads_major(case, query[q_index]),
            _heads_major(case, key[kv_index]),
            _heads_major(case, value[kv_index]),
            element_mask(block_mask[b], q_len, kv_len, case.block_shape),
            case.kernel_scale,
        )
        out[q_index], dq[q_index] = (_heads_major(case, t) for t in results[:2])
        dk[kv_index], dv[kv_index] = (_heads_major(case, t) for t in results[2:])
    return out, dq, dk, dv


def round_half_away(values: np.ndarray, io_dtype: np.dtype) -> np.ndarray:
    """Return float32 `values` rounded to float16/bfloat16 half away from zero (the kernel's CAST_ROUND), as
    float32: sign(x) floor(|x| / q + 1/2) q in float64, with q the format's spacing at |x| (exact steps)."""
    bits, emin, largest = (11, -14, 65504.0) if io_dtype == np.float16 else (8, -126, 3.3895313892515355e38)
    x = np.asarray(values, dtype=np.float64)
    magnitude = np.abs(x)
    _, exponent = np.frexp(magnitude)  # magnitude = m 2**exponent, m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(exponent - 1, emin) - (bits - 1))
    with np.errstate(invalid="ignore"):
        rounded = np.floor(magnitude / quantum + 0.5) * quantum
    rounded = np.where(rounded > largest, np.inf, rounded)
    rounded = np.where(np.isfinite(x), rounded, magnitude)
    return np.copysign(rounded, x).astype(np.float32)


def kernel_emulation_sequence(
    dout: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    out: np.ndarray,
    lse: np.ndarray,
    mask: np.ndarray,
    scale: float,
    io_dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return dq, dk, dv (io_dtype) by docs/operator.md section 2 on dense fp32 matrices, head by head (the
    backward's three casts round half away from zero, as the kernel's CAST_ROUND does)."""
    heads, kv_heads = query.shape[0], key.shape[0]
    group = heads // kv_heads

    def fp32(t: np.ndarray) -> np.ndarray:
        return np.asarray(t).astype(io_dtype).astype(np.float32)

    def round_io(t: np.ndarray) -> np.ndarray:
        return round_half_away(t, io_dtype)

    dout, query, key, value, out = (fp32(t) for t in (dout, query, key, value, out))
    lse = np.where(mask.any(axis=-1), np.asarray(lse, dtype=np.float32), np.float32(0))
    dq = np.zeros(query.shape, np.float32)
    dk = np.zeros(key.shape, np.float32)
    dv = np.zeros(value.shape, np.float32)
    for n in range(heads):
        g = n // group
        scores = (query[n] @ key[g].T) * np.float32(scale)
        probs = np.where(mask[n], np.exp(np.where(mask[n], scores - lse[n][:, None], -np.inf)), np.float32(0))
        dsum = (dout[n] * out[n]).sum(axis=-1)
        dscores = probs * (dout[n] @ value[g].T - dsum[:, None])
        dv[g] += round_io(probs).T @ dout[n]
        dq[n] += round_io(dscores) @ key[g]
        dk[g] += round_io(dscores).T @ query[n]
    dq *= np.float32(scale)
    dk *= np.float32(scale)
    return tuple(round_half_away(g, io_dtype).astype(io_dtype) for g in (dq, dk, dv))  # type: ignore[return-value]
