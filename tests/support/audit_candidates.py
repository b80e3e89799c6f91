"""Small attention candidates for the audit tests and the CLI: correct ones in several conventions, and
ones with classic planted bugs. Every candidate takes ``(q, k, v, *, attn_mask=None, is_causal=False)``."""

import contextlib
import math
import time

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


# --- planted bugs for the checks added with modules (issue 10) -------------------------------------------


def no_max_subtraction(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    """Bug: the textbook softmax ``exp(x) / sum(exp(x))`` without subtracting the row maximum (overflows to
    inf/inf = NaN once a logit passes ~88 in float32). Ours otherwise (bottom-right, zero rows)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = q @ k.transpose(-1, -2) * scale
    t, s = q.shape[-2], k.shape[-2]
    keep = attn_mask
    if is_causal:
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        keep = causal if keep is None else keep & causal
    e = logits.exp()
    if keep is not None:
        e = e * keep
    weights = e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return weights @ v


def finite_fill(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
    """Bug: masked logits are set to a finite -1e4 (a masked key leaks in once real logits go below -1e4).
    Ours otherwise; a fully masked row gives zeros."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = q @ k.transpose(-1, -2) * scale
    t, s = q.shape[-2], k.shape[-2]
    keep = attn_mask
    if is_causal:
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        keep = causal if keep is None else keep & causal
    if keep is None:
        return logits.softmax(dim=-1) @ v
    weights = logits.masked_fill(~keep, -1e4).softmax(dim=-1)
    return (weights @ v).masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)


def drops_mask_when_causal(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                           is_causal: bool = False) -> Tensor:
    """Bug: with ``is_causal=True`` the ``attn_mask`` is silently dropped (ours otherwise)."""
    out = scaled_dot_product_attention(q, k, v, attn_mask=None if is_causal else attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def first_head_mask(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Bug: applies head 0's mask to every head (per-head masks read as (b, 1, t, s)); ours otherwise."""
    if attn_mask is not None:
        attn_mask = attn_mask[:, :1]
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def nan_grad_rows(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
    """Bug: fully masked rows are zeroed after a softmax of all -inf (right forward, NaN gradients); ours
    otherwise."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    logits = q @ k.transpose(-1, -2) * scale
    t, s = q.shape[-2], k.shape[-2]
    keep = attn_mask
    if is_causal:
        causal = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
        keep = causal if keep is None else keep & causal
    if keep is None:
        return logits.softmax(dim=-1) @ v
    weights = logits.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    dead = ~keep.any(dim=-1, keepdim=True)
    return torch.where(dead, torch.zeros((), dtype=q.dtype), weights @ v)


# --- correct candidates with narrower support (conventions) ----------------------------------------------


def self_attention_only(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """Correct, but refuses t != s and dv != d (declare self_attention and equal_head_sizes)."""
    if q.shape[-2] != k.shape[-2] or v.shape[-1] != q.shape[-1]:
        raise ValueError("self-attention only, equal head sizes")
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def even_heads_in_range(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """Correct for even head sizes 2..6 and lengths 2..5 only (raises otherwise)."""
    d, t, s = q.shape[-1], q.shape[-2], k.shape[-2]
    if d % 2 or not 2 <= d <= 6 or not (2 <= t <= 5 and 2 <= s <= 5):
        raise ValueError(f"unsupported d={d}, t={t}, s={s}")
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def interleaved_groups(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    """Correct with the other grouping order: query head ``i`` uses key/value head ``i % g`` (``h = (r g)``)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)  # head i -> kv head i % g
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def additive_only(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                  is_causal: bool = False) -> Tensor:
    """Correct, but takes only additive float masks (raises on boolean ones)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        raise TypeError("additive masks only")
    keep = None if attn_mask is None else attn_mask == 0
    out = scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def decode_sees_all(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                    is_causal: bool = False) -> Tensor:
    """Correct for HF's sdpa rule: top-left causal, except that a single query sees every key."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal and q.shape[-2] > 1)


# --- for convention inference: an always-causal candidate, and bugs no convention explains -------------------


def always_causal(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None) -> Tensor:
    """Correct for the original tutorial's attention: always causal (top-left), no ``is_causal`` argument."""
    return _naive(q, k, v, attn_mask, causal_diagonal=0)


def mask_ignored(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False) -> Tensor:
    """Bug: takes ``attn_mask`` and ignores it (ours otherwise)."""
    out = scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert isinstance(out, Tensor)
    return out


def causal_ignored(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                   is_causal: bool = False) -> Tensor:
    """Bug: takes ``is_causal`` and ignores it (ours otherwise)."""
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    assert isinstance(out, Tensor)
    return out


def mask_multiplies_logits(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                           is_causal: bool = False) -> Tensor:
    """Bug: multiplies the logits by the mask (a mask that masks under no polarity or kind)."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        logits = logits * attn_mask.to(logits.dtype)
    return logits.softmax(dim=-1) @ v


def scale_by_heads(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                   is_causal: bool = False) -> Tensor:
    """Bug: the logit scale is ``1/sqrt(h * d)`` (the model width instead of the head size)."""
    return _naive(q, k, v, attn_mask, scale=1.0 / math.sqrt(q.shape[1] * q.shape[-1]),
                  causal_diagonal=0 if is_causal else None)


def fully_masked_first_value(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                             is_causal: bool = False) -> Tensor:
    """Bug: a fully masked row returns the first value (neither zeros, NaN nor the mean); ours otherwise."""
    out = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    assert isinstance(out, Tensor)
    if attn_mask is None:
        return out
    dead = ~attn_mask.any(dim=-1, keepdim=True)
    return torch.where(dead, v[..., :1, :].expand_as(out) if v.shape[1] == out.shape[1] else out, out)


def sdpa_gqa_tiled(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
                   enable_gqa: bool = False) -> Tensor:
    """Bug: torch's SDPA with its own ``enable_gqa``, written with ``repeat`` (tiles the key/value heads: query
    head ``i`` uses kv head ``i % g``) where ``repeat_interleave`` (``i // r``) is meant."""
    if enable_gqa and q.shape[1] != k.shape[1]:
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def sdpa_gqa_right(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
                   enable_gqa: bool = False) -> Tensor:
    """Correct: ``enable_gqa`` as torch's SDPA documents it (``repeat_interleave``)."""
    if enable_gqa and q.shape[1] != k.shape[1]:
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


def exits_on_first_call(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                        is_causal: bool = False) -> Tensor:
    """Ends the interpreter with status 0 (a CI run that only reads the exit status would pass)."""
    raise SystemExit(0)


def modifies_query(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                   is_causal: bool = False) -> Tensor:
    """The right answer, then ``q`` doubled in place."""
    out = naive_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    q.mul_(2)
    return out


def hangs(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
    """Never returns (and swallows every ``Exception`` on the way)."""
    while True:
        with contextlib.suppress(Exception):
            time.sleep(0.01)
