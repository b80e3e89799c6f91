"""Planted kernels: attention functions written as people write kernels and ports, each with one bug (or none) the
zero-configuration audit (``audit_attention(kernel, conventions="infer")``, ``typed-transformer audit --infer``) must
catch. Each follows this library's conventions (``(b, h, t, d)``, True = may attend, bottom-right causal, zeros
for fully masked rows) except for its bug, so that the bug is the only thing the audit can report."""

import math

import torch
from torch import Tensor


def _attention(q: Tensor, k: Tensor, v: Tensor, logits_bias: Tensor | None, keep: Tensor | None, is_causal: bool,
               scale: float) -> Tensor:
    """Eager attention: ``softmax(q k^T * scale + logits_bias)`` over the allowed keys, zeros for a row without."""
    t, s = q.shape[-2], k.shape[-2]
    logits = q @ k.transpose(-1, -2) * scale
    if logits_bias is not None:
        logits = logits + logits_bias
    allowed = torch.ones(t, s, dtype=torch.bool)
    if keep is not None:
        allowed = allowed & keep
    if is_causal:
        allowed = allowed & torch.ones(t, s, dtype=torch.bool).tril(s - t)
    logits = logits.masked_fill(~allowed, -math.inf)
    weights = logits.softmax(dim=-1).nan_to_num(0.0)  # a row without keys: zeros
    return weights @ v


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
