"""Planted kernels: attention functions written as people write kernels and ports, each with one bug (or none) the
zero-configuration audit (``audit_attention(kernel, conventions="infer")``, ``typed-transformer audit --infer``) must
catch. Each follows this library's conventions (``(b, h, t, d)``, True = may attend, bottom-right causal, zeros
for fully masked rows) except for its bug, so that the bug is the only thing the audit can report.

The kernel gallery's (docs/audit-kernels.md, benchmarks/audit_kernel_gallery.py): loops over key blocks with an
online softmax, batch chunks, causal block skipping, half-precision logits, each with the bug that lives where a
small example never looks, and one correct tiled kernel. Then the conventions' kernels: a boolean mask added as
+1/+0, a flipped boolean path, no or another scale, a dropped key, a wrong value gradient."""

import math

import torch
from torch import Tensor

from typed_transformer import scaled_dot_product_attention


def _keep(q: Tensor, k: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor | None:
    """The keep-mask ``(#b, #h, t, s)`` with the bottom-right causal mask ANDed in (None: every key)."""
    t, s = q.shape[-2], k.shape[-2]
    keep = attn_mask
    if is_causal:
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        keep = causal if keep is None else keep & causal
    return keep


def _online_softmax(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, *, block: int, rescale: bool,
                    half_sums: bool = False, half_from: int = 0, sums_dtype: torch.dtype | None = None) -> Tensor:
    """FlashAttention's loop: for each block of ``block`` keys, update the running maximum ``m``, the running sum
    ``l`` and the accumulator (float32 for half inputs); ``rescale=False`` forgets to multiply the accumulator and
    the sum by ``exp(m_old - m_new)`` when the maximum grows; ``half_sums=True`` keeps the running sum and the
    accumulator of P @ V in the input dtype (rounded after every block), as a kernel that declares them in half
    precision (from key ``half_from`` on; ``sums_dtype``: rounded to that dtype instead)."""
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    r = q.shape[1] // k.shape[1]
    q, k, v = q.to(work), k.repeat_interleave(r, dim=1).to(work), v.repeat_interleave(r, dim=1).to(work)
    scale = 1.0 / math.sqrt(q.shape[-1])
    b, h, t, s = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    m = torch.full((b, h, t, 1), -math.inf, dtype=work)
    total = torch.zeros(b, h, t, 1, dtype=work)
    acc = torch.zeros(b, h, t, v.shape[-1], dtype=work)
    for start in range(0, s, block):
        logits = q @ k[:, :, start:start + block].transpose(-1, -2) * scale
        if keep is not None:
            logits = logits.masked_fill(~keep[..., start:start + block], -math.inf)
        m_new = torch.maximum(m, logits.amax(dim=-1, keepdim=True))
        finite = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows without a key so far
        p = torch.exp(logits - finite)
        if rescale:
            alpha = torch.exp(m - finite)
            acc, total = acc * alpha, total * alpha
        acc = acc + p @ v[:, :, start:start + block]
        total = total + p.sum(dim=-1, keepdim=True)
        if half_sums and start >= half_from:
            acc, total = acc.to(sums_dtype or dtype).to(work), total.to(sums_dtype or dtype).to(work)
        m = m_new
    return torch.where(total > 0, acc / total.clamp_min(torch.finfo(work).tiny), torch.zeros_like(acc))


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Correct: blocks of 16 keys, online softmax with rescaling, float32 accumulation for half inputs."""
    return _online_softmax(q, k, v, _keep(q, k, attn_mask, is_causal), block=16, rescale=True).to(q.dtype)


def tiled_16_no_rescale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """Bug: blocks of 16 keys; the accumulator is not rescaled when the running maximum grows (right for up to
    16 keys: one block)."""
    return _online_softmax(q, k, v, _keep(q, k, attn_mask, is_causal), block=16, rescale=False).to(q.dtype)


def tiled_64_no_rescale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """Bug: the same with blocks of 64 keys (a real kernel's tile): right for up to 64 keys."""
    return _online_softmax(q, k, v, _keep(q, k, attn_mask, is_causal), block=64, rescale=False).to(q.dtype)


def half_accumulator(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                     is_causal: bool = False) -> Tensor:
    """Bug: one key at a time (a decode-style loop), the running sum and the accumulator of P @ V kept in the
    input dtype: every addition rounds (to 11 bits in float16, 8 in bfloat16), and over a few dozen keys the
    rounding errors add up past what float32 sums give (right in float32 and float64)."""
    return _online_softmax(q, k, v, _keep(q, k, attn_mask, is_causal), block=1, rescale=True,
                           half_sums=True).to(q.dtype)


def batch_chunks(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Bug: the batch in chunks of 4, every chunk with the first chunk's rows of the mask (right for up to 4
    batch elements, or one mask for the whole batch)."""
    outs = []
    for start in range(0, q.shape[0], 4):
        end = min(start + 4, q.shape[0])
        mask = attn_mask
        if attn_mask is not None and attn_mask.shape[0] > 1:
            mask = attn_mask[:end - start]  # should be attn_mask[start:end]
        out = scaled_dot_product_attention(q[start:end], k[start:end], v[start:end], attn_mask=mask,
                                           is_causal=is_causal)
        assert isinstance(out, Tensor)
        outs.append(out)
    return torch.cat(outs)


def causal_block_skip(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    """Bug: blocks of 64 queries and 32 keys; with ``is_causal`` a key block is skipped when it starts past the
    last key the query block's *first* row sees (it should be its last row's), so later rows of a block lose keys
    they may see: from 33 queries on when ``t = s``."""
    keep = _keep(q, k, attn_mask, is_causal)
    t, s = q.shape[-2], k.shape[-2]
    outs = []
    for q_start in range(0, t, 64):
        rows = slice(q_start, q_start + 64)
        block_keep = None if keep is None else keep[..., rows, :]
        if is_causal:
            last_seen = max(q_start + s - t, 0)  # should be min(q_start + 64, t) - 1 + s - t
            skipped = torch.arange(s) >= (last_seen // 32 + 1) * 32
            block_keep = ~skipped if block_keep is None else block_keep & ~skipped
        out = _online_softmax(q[..., rows, :], k, v, block_keep, block=32, rescale=True)
        outs.append(out)
    return torch.cat(outs, dim=-2).to(q.dtype)


def fp16_overflow(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
    """Bug: logits computed and kept in the input dtype; float16 logits past 65504 become inf, the softmax gives
    NaN, and ``nan_to_num`` (meant for rows without keys) turns those rows into zeros."""
    logits = q @ k.repeat_interleave(q.shape[1] // k.shape[1], dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    keep = _keep(q, k, attn_mask, is_causal)
    if keep is not None:
        logits = logits.masked_fill(~keep, -math.inf)
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return weights @ v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)


def _attention(q: Tensor, k: Tensor, v: Tensor, logits_bias: Tensor | None, keep: Tensor | None, is_causal: bool,
               scale: float) -> Tensor:
    """Eager attention: ``softmax(q k^T * scale + logits_bias)`` over the allowed keys, zeros for a row without;
    in float32 for half inputs (as a kernel that accumulates in float32), the output in the input dtype."""
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v = q.to(work), k.to(work), v.to(work)
    t, s = q.shape[-2], k.shape[-2]
    logits = q @ k.transpose(-1, -2) * scale
    if logits_bias is not None:
        logits = logits + logits_bias.to(work)
    allowed = torch.ones(t, s, dtype=torch.bool)
    if keep is not None:
        allowed = allowed & keep
    if is_causal:
        allowed = allowed & torch.ones(t, s, dtype=torch.bool).tril(s - t)
    logits = logits.masked_fill(~allowed, -math.inf)
    weights = logits.softmax(dim=-1).nan_to_num(0.0)  # a row without keys: zeros
    return (weights @ v).to(dtype)


def bool_mask_added(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Takes float 0/-inf masks and adds them to the logits, as "eager" paths do; a boolean mask is added too,
    as +1/+0, and masks nothing (the bug)."""
    bias = None if attn_mask is None else attn_mask.to(q.dtype)  # bool -> 1.0 / 0.0: added, not masked
    return _attention(q, k, v, bias, None, is_causal, 1 / math.sqrt(q.shape[-1]))


def flipped_bool_mask(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    """Takes float 0/-inf masks (added) and boolean masks meant as True = may attend, but converts the boolean
    one with the fill on the wrong side: True = masked out (the bug)."""
    bias = attn_mask
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype).masked_fill(attn_mask, -math.inf)
    return _attention(q, k, v, bias, None, is_causal, 1 / math.sqrt(q.shape[-1]))


def no_scale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """The paper's attention without its 1/sqrt(d) (T5's scale of 1, where the paper's was meant)."""
    return _attention(q, k, v, None, attn_mask, is_causal, 1.0)


def key_length_scale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                     is_causal: bool = False) -> Tensor:
    """Scales the logits by 1/sqrt(s), the key length, where the paper has 1/sqrt(d), the head size."""
    return _attention(q, k, v, None, attn_mask, is_causal, 1 / math.sqrt(k.shape[-2]))


def drops_last_key_when_odd(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                            is_causal: bool = False) -> Tensor:
    """A kernel over pairs of keys that forgets the last key when the key length is odd (the bug)."""
    s = k.shape[-2]
    keep = torch.ones(s, dtype=torch.bool)
    if s % 2 == 1 and s > 1:
        keep[-1] = False
    mask = keep if attn_mask is None else attn_mask & keep
    return _attention(q, k, v, None, mask, is_causal, 1 / math.sqrt(q.shape[-1]))


def paper_kernel(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Correct: float 0/-inf masks added, boolean masks True = may attend, both the same attention."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        return _attention(q, k, v, None, attn_mask, is_causal, 1 / math.sqrt(q.shape[-1]))
    return _attention(q, k, v, attn_mask, None, is_causal, 1 / math.sqrt(q.shape[-1]))


class _ScaledBackward(torch.autograd.Function):
    """The identity forward; the backward halves the gradient (a hand-written backward's slip)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:
        return grad * 0.5


def half_value_gradient(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """A right forward whose backward gives half of dv (the bug): only a gradients check sees it."""
    v = _ScaledBackward.apply(v)  # type: ignore[no-untyped-call]
    return _attention(q, k, v, None, attn_mask, is_causal, 1 / math.sqrt(q.shape[-1]))


def _paper(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """The paper's attention of one call, grouped heads repeated (``i // (h/g)``)."""
    r = q.shape[1] // k.shape[1]
    return _attention(q, k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1), None, attn_mask, is_causal,
                      1 / math.sqrt(q.shape[-1]))


def heads_past_8(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Bug: a launch grid of 8 programs per batch element over the query heads, head ``i`` reading the keys and
    values at ``i % 8`` (right for up to 8 query heads)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    source = torch.arange(q.shape[1]) % 8
    return _paper(q, k[:, source], v[:, source], attn_mask, is_causal)


def batch_past_8(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Bug: batch element ``i`` reads the keys and values of ``i % 8`` (a grid of 8 programs over the batch: right
    for up to 8 batch elements)."""
    source = torch.arange(q.shape[0]) % 8
    return _paper(q, k[source], v[source], attn_mask, is_causal)


def half_sums_past_512(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    """Bug: blocks of 16 keys with an online softmax whose running sum and accumulator are rounded to bfloat16
    after every block past the first 512 keys, for half-precision inputs (a kernel that spills its sums to
    bfloat16 on long rows; right up to 512 keys, and in float32 and float64)."""
    keep = _keep(q, k, attn_mask, is_causal)
    if q.dtype not in (torch.float16, torch.bfloat16) or k.shape[-2] <= 512:
        return _online_softmax(q, k, v, keep, block=16, rescale=True).to(q.dtype)
    spilled = _online_softmax(q.bfloat16(), k.bfloat16(), v.bfloat16(), keep, block=16, rescale=True,
                              half_sums=True, half_from=512) if q.dtype == torch.bfloat16 else None
    if spilled is None:  # float16 inputs, sums spilled to bfloat16: the same loop with the rounding done here
        spilled = _online_softmax(q, k, v, keep, block=16, rescale=True, half_sums=True, half_from=512,
                                  sums_dtype=torch.bfloat16)
    return spilled.to(q.dtype)


def _half_inputs(q: Tensor) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"only float16 and bfloat16 are supported, got {q.dtype}")  # flash-attn's own refusal


def half_only(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
              is_causal: bool = False) -> Tensor:
    """Correct, in float16 and bfloat16 only (as flash-attn's and most Triton kernels): it raises in float32 and
    float64; blocks of 16 keys, online softmax, float32 accumulation."""
    _half_inputs(q)
    return tiled_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def half_only_causal_off_by_one(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                                is_causal: bool = False) -> Tensor:
    """Bug: the half-only kernel whose causal mask lets query ``i`` see key ``i + s - t + 1`` too (an off-by-one
    in the diagonal)."""
    _half_inputs(q)
    keep = attn_mask
    if is_causal:
        t, s = q.shape[-2], k.shape[-2]
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t + 1)
        keep = causal if keep is None else keep & causal
    return _online_softmax(q, k, v, keep, block=16, rescale=True).to(q.dtype)


def sdpa_flash(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
               enable_gqa: bool = False) -> Tensor:
    """torch's ``F.scaled_dot_product_attention`` under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``: on the CPU it
    needs dv = d ("No available kernel" otherwise) and aligns its causal mask top-left."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                                enable_gqa=enable_gqa)


def _multiples_of_8(q: Tensor, v: Tensor) -> None:
    if q.shape[-1] % 8 or v.shape[-1] % 8:  # flash-attn's forward: head sizes are multiples of 8
        raise RuntimeError(f"head sizes must be multiples of 8 (got d={q.shape[-1]}, dv={v.shape[-1]})")


def half_multiple_of_8(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    """Correct, in float16 and bfloat16 only and for head sizes (d and dv) that are multiples of 8, as flash-attn's
    forward: it raises for any other; blocks of 16 keys, online softmax, float32 accumulation."""
    _half_inputs(q)
    _multiples_of_8(q, v)
    return tiled_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def half_multiple_of_8_first_dims_only(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                                       is_causal: bool = False) -> Tensor:
    """Bug: the half-only kernel of multiples of 8 whose ``q . k`` loop over the head size stops after its first
    tile of 8 (right at d = 8, the least head size it takes; wrong past it)."""
    _half_inputs(q)
    _multiples_of_8(q, v)
    first = q[..., :8] * math.sqrt(8 / q.shape[-1])  # the whole head's scale, on its first tile only
    return tiled_attention(first, k[..., :8], v, attn_mask=attn_mask, is_causal=is_causal)


def only_head_size_16(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    """Correct, for d = dv = 16 only (a kernel compiled for one head size): it raises for any other."""
    if q.shape[-1] != 16 or v.shape[-1] != 16:
        raise ValueError(f"compiled for head size 16 only (got d={q.shape[-1]}, dv={v.shape[-1]})")
    return tiled_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def at_most_64_keys(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Correct, for sequences of at most 64 queries and keys (a kernel that keeps a row of logits in one tile of 64):
    it raises for longer ones."""
    if q.shape[-2] > 64 or k.shape[-2] > 64:
        raise ValueError(f"sequences of at most 64 are supported (got t={q.shape[-2]}, s={k.shape[-2]})")
    return tiled_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def _whole_blocks(q: Tensor, k: Tensor, block: int) -> None:
    if q.shape[-2] % block or k.shape[-2] % block:
        raise ValueError(f"sequence lengths must be multiples of {block} (got t={q.shape[-2]}, s={k.shape[-2]})")


def blocks_of_16(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Correct, for query and key lengths that are multiples of 16 (a kernel that tiles both sequences in blocks of
    16 and masks no partial tile): it raises for any other."""
    _whole_blocks(q, k, 16)
    return tiled_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def blocks_of_16_no_rescale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                            is_causal: bool = False) -> Tensor:
    """Bug: the kernel of whole blocks of 16 whose online softmax forgets to rescale its running sums when a later
    block of keys raises the row's maximum (right for one block of keys, wrong from the second)."""
    _whole_blocks(q, k, 16)
    return tiled_16_no_rescale(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def half_blocks_of_64(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    """Correct, in float16 and bfloat16 only, for head sizes that are multiples of 8 and lengths that are multiples
    of 64 (a Triton kernel's BLOCK_M = BLOCK_N = 64 without a bounds check): it raises for any other."""
    _half_inputs(q)
    _multiples_of_8(q, v)
    _whole_blocks(q, k, 64)
    return tiled_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
