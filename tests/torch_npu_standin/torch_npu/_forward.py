"""The stand-in's forward: what aclnnBlockSparseAttention computes, in torch on the CPU (tests only).

Written from the operator's documentation (ops-transformer attention/block_sparse_attention,
docs/interface.md "The forward"), apart from
bsa's golden and reference device: for each query row, the kv columns of the
blocks its mask row selects (within the actual kv length), scores in fp32 times the fp32 scale, a dense
softmax in fp32, P cast to the input dtype before P V, fp32 accumulation, out cast to the input dtype;
lse = ln(l) + m in fp32. innerPrecise 1 holds the softmax in fp16 (docs/operator.md, the forward): the scale cast to
fp16, S16 = fp16(fp16(S) * scale16), P = fp16(exp(fp16(S16 - m))), the row sum held in fp16, lse =
fp16(fp16(ln l) + m); P V still accumulates in fp32. One dense pass per row: no 512-column stacks.

What the real operator leaves alone is left alone here too: rows past a BNSD actual length and rows whose
mask row selects no kv block are not written (they hold NaN, the stand-in's "garbage"); with
softmaxLseFlag 0 lse is not written at all (uninitialised memory: random bytes, different every call).
"""

from __future__ import annotations

import math

import torch


def _uninitialised(shape: list[int]) -> torch.Tensor:
    """Return float32 memory as a fresh NPU allocation holds it: whatever bytes were there."""
    bits = torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32)
    return bits.view(torch.float32)


def _fp16(values: torch.Tensor) -> torch.Tensor:
    """Return float32 values rounded to float16 (ties to even), still float32."""
    return values.to(torch.float16).float()


def lse_shape(query: torch.Tensor) -> list[int]:
    """The binding's softmax_lse shape: [d0, d1, d2, 1] for a 4-D query, [d0, d1, 1] for a 3-D one."""
    return [*query.shape[:3], 1] if query.dim() == 4 else [*query.shape[:2], 1]


def forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_sparse_mask: torch.Tensor,
    block_shape: list[int],
    layout: str,
    q_lengths: list[int],
    kv_lengths: list[int],
    scale_value: float,
    inner_precise: int,
    softmax_lse_flag: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (attention_out, softmax_lse) as the operator leaves them (see the module docstring).

    `q_lengths`/`kv_lengths` are per batch entry (TND: the tokens of each entry; BNSD: the actual lengths,
    or S). The caller has checked the call as aclnn does (shapes, mask shape, lengths).
    """
    io_dtype = query.dtype
    x, y = int(block_shape[0]), int(block_shape[1])
    scale = float(torch.tensor(scale_value, dtype=torch.float16 if inner_precise == 1 else torch.float32))
    out32 = torch.full(query.shape, math.nan, dtype=torch.float32)
    lse32 = torch.full(query.shape[:-1], math.nan, dtype=torch.float32)
    tnd = layout == "TND"
    q_start = kv_start = 0
    for b, (q_len, kv_len) in enumerate(zip(q_lengths, kv_lengths, strict=True)):
        if tnd:
            rows = slice(q_start, q_start + q_len)
            q_b, k_b, v_b = (
                query[rows].transpose(0, 1),
                key[kv_start : kv_start + kv_len].transpose(0, 1),
                value[kv_start : kv_start + kv_len].transpose(0, 1),
            )
            o_b, l_b = out32[rows].transpose(0, 1), lse32[rows].transpose(0, 1)  # views: written in place
            q_start, kv_start = q_start + q_len, kv_start + kv_len
        else:
            q_b, k_b, v_b = query[b, :, :q_len], key[b, :, :kv_len], value[b, :, :kv_len]
            o_b, l_b = out32[b, :, :q_len], lse32[b, :, :q_len]
        if q_len == 0 or kv_len == 0:
            continue
        group = q_b.shape[0] // k_b.shape[0]
        row_blocks, col_blocks = torch.arange(q_len) // x, torch.arange(kv_len) // y
        for n in range(q_b.shape[0]):
            selected = (block_sparse_mask[b, n] != 0)[row_blocks][:, col_blocks]
            written = selected.any(dim=1)
            if not bool(written.any()):
                continue
            q, k, v = q_b[n].float(), k_b[n // group].float(), v_b[n // group].float()
            products = q @ k.T
            if inner_precise == 1:  # S16 = fp16(fp16(S) * scale16): the fp16 softmax holds its scores in fp16
                products = _fp16(_fp16(products) * scale)
            else:
                products = products * scale
            scores = torch.where(selected, products, torch.tensor(-math.inf))
            row_max = scores.max(dim=1, keepdim=True).values.clamp_min(-3.0e38)  # rows with nothing: no NaN here
            if inner_precise == 1:
                p = _fp16(torch.exp(_fp16(scores - row_max)))
                row_sum = _fp16(p.sum(dim=1, keepdim=True))
            else:
                p = torch.exp(scores - row_max)
                row_sum = p.sum(dim=1, keepdim=True)
            o = (p.to(io_dtype).float() @ v) / row_sum
            lse = torch.log(row_sum[:, 0])
            lse = _fp16(_fp16(lse) + row_max[:, 0]) if inner_precise == 1 else lse + row_max[:, 0]
            o_b[n][written] = o[written]
            l_b[n][written] = lse[written]
    out = out32.to(io_dtype)
    lse_out = lse32.reshape(lse_shape(query)) if softmax_lse_flag == 1 else _uninitialised(lse_shape(query))
    return out, lse_out
