"""Small attention candidates for the audit tests and the CLI: correct ones in several conventions, and
ones with classic planted bugs. Every candidate takes ``(q, k, v, *, attn_mask=None, is_causal=False)``."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from typed_transformer import scaled_dot_product_attention


def _naive(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None = None, *, scale: float | None = None,
           softmax_dim: int = -1, softmax_dtype: torch.dtype | None = None,
           causal_diagonal: int | None = None) -> Tensor:
    """Textbook attention on ``(b, h, t, d)`` with a keep-mask and top-left causal diagonal ``causal_diagonal``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = q @ k.transpose(-1, -2) * scale
    t, s = q.shape[-2], k.shape[-2]
    if causal_diagonal is not None:
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=causal_diagonal)
        keep = causal if keep is None else keep & causal
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    if softmax_dtype is not None:
        weights = logits.to(softmax_dtype).softmax(dim=softmax_dim).to(q.dtype)
    else:
        weights = logits.softmax(dim=softmax_dim)
    return weights @ v


# --- correct candidates ---------------------------------------------------------------------------------


def naive_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Correct, SDPA conventions (bhtd, keep-mask, top-left causal); fully masked rows give NaN."""
    return _naive(q, k, v, attn_mask, causal_diagonal=0 if is_causal else None)


def bthd_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                   is_causal: bool = False) -> Tensor:
    """Correct, FlashAttention layout (b, t, h, d), ours otherwise (bottom-right causal, zero rows)."""
    out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out.transpose(1, 2)


def drop_mask_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """Correct, nn.MultiheadAttention's mask polarity (True = masked out)."""
    out = scaled_dot_product_attention(q, k, v, attn_mask=None if attn_mask is None else ~attn_mask,
                                       is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def unit_scale_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                         is_causal: bool = False) -> Tensor:
    """Correct for a declared ``scale=1.0`` (no 1/sqrt(d), on purpose)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=1.0)


def plain_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Correct, without any mask or causal support (declare supports_mask/supports_causal=False)."""
    return _naive(q, k, v)


# --- planted bugs -----------------------------------------------------------------------------------------


def missing_scale(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
    """Bug: forgets the 1/sqrt(d)."""
    return _naive(q, k, v, attn_mask, scale=1.0, causal_diagonal=0 if is_causal else None)


def softmax_wrong_axis(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    """Bug: normalises over the queries instead of the keys."""
    return _naive(q, k, v, attn_mask, softmax_dim=-2, causal_diagonal=0 if is_causal else None)


def causal_off_by_one(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    """Bug: the causal mask lets every query see one future key (``tril(diagonal=1)``)."""
    return _naive(q, k, v, attn_mask, causal_diagonal=1 if is_causal else None)


def heads_wrong_view(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                     is_causal: bool = False) -> Tensor:
    """Bug: flattens (b, h) to (h b) for the computation but unflattens the result as (b h)."""
    b, h, t, _ = q.shape
    flat = [x.transpose(0, 1).reshape(h * b, x.shape[2], x.shape[3]) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(flat[0], flat[1], flat[2], is_causal=is_causal)
    return out.reshape(b, h, t, v.shape[-1])


def flipped_polarity(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                     is_causal: bool = False) -> Tensor:
    """Bug: declares SDPA's keep-masks but treats True as masked out."""
    return _naive(q, k, v, None if attn_mask is None else ~attn_mask, causal_diagonal=0 if is_causal else None)


def padding_ignored(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Bug: drops masks that broadcast over the queries (key padding masks ``(b, 1, 1, s)``)."""
    if attn_mask is not None and attn_mask.shape[-2] == 1 and q.shape[-2] > 1:
        attn_mask = None
    return _naive(q, k, v, attn_mask, causal_diagonal=0 if is_causal else None)


def half_softmax(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Bug: computes the softmax in float16 whatever the input dtype."""
    return _naive(q, k, v, attn_mask, softmax_dtype=torch.float16, causal_diagonal=0 if is_causal else None)


def nan_rows(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
             is_causal: bool = False) -> Tensor:
    """Bug when zero rows are declared: fully masked rows give NaN (otherwise ours, bottom-right)."""
    keep = attn_mask
    if is_causal:
        t, s = q.shape[-2], k.shape[-2]
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        keep = causal if keep is None else keep & causal
    return _naive(q, k, v, keep)
