"""Scaled dot-product attention, written as the paper's equation (the reference path).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V            ("Attention Is All You Need", eq. 1)

with, beside the mask, an additive position bias ``B`` (ALiBi, T5's relative buckets):
``softmax(Q K^T * scale + B) V``.

Axis names, shared by every signature in the library:

    b  batch            t  query positions          s  key/value positions
    h  query heads      g  key/value heads (h is a multiple of g; g = h is ordinary multi-head attention)
    d  query/key size   dv value size

Behaviour that is specified (and tested against torch):

* Boolean masks are keep-masks (True = may attend); float masks are added to the logits. Masks are
  ``(t, s)`` or ``(b, h, t, s)`` with ``b``, ``h`` and ``t`` allowed to be 1 (broadcast). A 3-D mask is
  refused: torch would silently read ``(b, t, s)`` as ``(h, t, s)``.
* ``attn_bias`` is a float tensor added to the logits after scaling, beside the mask (the split of
  x-transformers: the mask says which keys may be attended, the bias how much each is favoured). Its shape
  is ``(t, s)`` or ``(b, h, t, s)`` with ``b``, ``h`` and ``t`` allowed to be 1; it is one per *query*
  head ``h``, also with grouped-query heads. ``attn_bias`` plus a float ``attn_mask`` is their sum.
* ``is_causal=True`` is a real flag, ANDed with any ``attn_mask``, aligned bottom-right when ``t != s``
  (see :func:`typed_transformer.masks.causal_mask`).
* A query row with no allowed key gives **zero output and zero weights**, with finite (zero) gradients.
  torch gives NaN or 0 for such rows depending on its code path.
* With half or bfloat16 inputs the logits and the softmax are computed in float32; the output comes
  back in the input dtype.
* Grouped-query attention: query head ``i`` uses key/value head ``i // (h // g)``, the grouping of
  ``F.scaled_dot_product_attention(..., enable_gqa=True)``.
"""

import math
from collections.abc import Callable
from typing import Literal, TypeAlias, overload

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from jaxtyping import Float
from torch import Tensor

from ._deprecation import warn_deprecated as _warn_deprecated
from .masks import AttnMask, merge_causal
from .shapecheck import raise_shape_error, typechecked

__all__ = ["AttnBias", "Backend", "scaled_dot_product_attention", "scaled_dot_product_attention_with_weights"]

Backend = Literal["reference", "sdpa"]

#: An additive attention bias: float, ``(t, s)`` or ``(b, h, t, s)`` where ``b``, ``h`` and ``t`` may be 1.
AttnBias: TypeAlias = Float[Tensor, "#b #h #t s"] | Float[Tensor, "t s"]


# The deprecated return_weights flag changes the return type: the overloads make it exact for type checkers
# (False or left out: the output alone; True: (output, weights)).
@overload
def scaled_dot_product_attention(
    q: Float[Tensor, "b h t d"], k: Float[Tensor, "b g s d"], v: Float[Tensor, "b g s dv"], *,
    attn_mask: AttnMask | None = None, attn_bias: AttnBias | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0, return_weights: Literal[False] = False,
    backend: Backend = "reference",
) -> Float[Tensor, "b h t dv"]: ...
@overload
def scaled_dot_product_attention(
    q: Float[Tensor, "b h t d"], k: Float[Tensor, "b g s d"], v: Float[Tensor, "b g s dv"], *,
    attn_mask: AttnMask | None = None, attn_bias: AttnBias | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0, return_weights: Literal[True],
    backend: Backend = "reference",
) -> tuple[Float[Tensor, "b h t dv"], Float[Tensor, "b h t s"]]: ...
@overload
def scaled_dot_product_attention(
    q: Float[Tensor, "b h t d"], k: Float[Tensor, "b g s d"], v: Float[Tensor, "b g s dv"], *,
    attn_mask: AttnMask | None = None, attn_bias: AttnBias | None = None, is_causal: bool = False,
    scale: float | None = None, dropout_p: float = 0.0, return_weights: bool,
    backend: Backend = "reference",
) -> Float[Tensor, "b h t dv"] | tuple[Float[Tensor, "b h t dv"], Float[Tensor, "b h t s"]]: ...
def scaled_dot_product_attention(
    q: Float[Tensor, "b h t d"],
    k: Float[Tensor, "b g s d"],
    v: Float[Tensor, "b g s dv"],
    *,
    attn_mask: AttnMask | None = None,
    attn_bias: AttnBias | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: Backend = "reference",
) -> Float[Tensor, "b h t dv"] | tuple[Float[Tensor, "b h t dv"], Float[Tensor, "b h t s"]]:
    """Scaled dot-product attention ``softmax(q k^T * scale + mask) v`` over ``h`` query heads.

    Args:
        q: queries ``(b, h, t, d)``.
        k: keys ``(b, g, s, d)``; ``h`` must be a multiple of ``g`` (grouped-query attention).
        v: values ``(b, g, s, dv)``.
        attn_mask: boolean keep-mask (True = may attend) or additive float mask, ``(t, s)`` or
            ``(b, h, t, s)`` with broadcastable ``b``, ``h`` and ``t``.
        attn_bias: additive float bias on the logits, after scaling (a position bias such as
            :class:`~typed_transformer.positions.ALiBiPositionalBias`), ``(t, s)`` or ``(b, h, t, s)`` with
            broadcastable ``b``, ``h`` and ``t``; one per query head.
        is_causal: apply a bottom-right aligned causal mask (ANDed with ``attn_mask``).
        scale: logit scale; default ``1 / sqrt(d)``.
        dropout_p: dropout on the attention weights, always applied when > 0 (pass 0.0 in eval mode).
        return_weights: deprecated, use :func:`scaled_dot_product_attention_with_weights`; ``True`` returns
            ``(output, weights)`` as that function does and warns (``DeprecationWarning``).
        backend: ``"reference"`` (this module's einsum equation) or ``"sdpa"``
            (``torch.nn.functional.scaled_dot_product_attention``, same results, faster).

    Returns:
        The output ``(b, h, t, dv)`` in the dtype of ``q``.

    Raises:
        ShapeError: a tensor of the wrong shape or dtype (named in the message), ``g`` not dividing ``h``,
            a head size ``d`` or a head count ``g`` of 0, or ``k``/``v`` of another dtype than ``q``.
        ValueError: ``dropout_p`` outside ``[0, 1)``, an unknown backend, or ``return_weights`` with
            ``backend="sdpa"``.
    """
    scale, is_causal = _prepare(scaled_dot_product_attention, q, k, v, scale, is_causal, dropout_p)
    if return_weights:
        _warn_deprecated("scaled_dot_product_attention(..., return_weights=True) is deprecated; use "
                         "scaled_dot_product_attention_with_weights(...)")
        if backend == "sdpa":
            raise ValueError("scaled_dot_product_attention: backend='sdpa' cannot return weights; "
                             "use backend='reference'")
    if backend == "sdpa":
        return _sdpa(q, k, v, attn_mask, attn_bias, is_causal, scale, dropout_p)
    if backend != "reference":
        raise ValueError(f"scaled_dot_product_attention: backend must be 'reference' or 'sdpa', got {backend!r}")
    out, weights = _reference(q, k, v, attn_mask, attn_bias, is_causal, scale, dropout_p)
    return (out, weights) if return_weights else out


def scaled_dot_product_attention_with_weights(
    q: Float[Tensor, "b h t d"],
    k: Float[Tensor, "b g s d"],
    v: Float[Tensor, "b g s dv"],
    *,
    attn_mask: AttnMask | None = None,
    attn_bias: AttnBias | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Float[Tensor, "b h t dv"], Float[Tensor, "b h t s"]]:
    """:func:`scaled_dot_product_attention` on the reference path, also returning the attention weights.

    The arguments and the output are those of :func:`scaled_dot_product_attention`; the weights
    ``(b, h, t, s)`` are the softmax after dropout, as ``nn.MultiheadAttention`` returns them, zero for
    masked keys and for query rows with no allowed key.

    Returns:
        ``(output (b, h, t, dv), weights (b, h, t, s))``, both in the dtype of ``q``.

    Raises:
        ShapeError: as :func:`scaled_dot_product_attention`.
        ValueError: ``dropout_p`` outside ``[0, 1)``.
    """
    scale, is_causal = _prepare(scaled_dot_product_attention_with_weights, q, k, v, scale, is_causal, dropout_p)
    return _reference(q, k, v, attn_mask, attn_bias, is_causal, scale, dropout_p)


def _prepare(function: Callable[..., object], q: Tensor, k: Tensor, v: Tensor, scale: float | None,
             is_causal: bool, dropout_p: float) -> tuple[float, bool]:
    """What annotations cannot say about the arguments; the scale and causal flag to compute with."""
    h, g = q.shape[1], k.shape[1]
    if q.shape[-1] == 0:  # also the default scale 1 / sqrt(d)
        raise_shape_error(function, "q", "axis d is 0: the head size must be at least 1", axis="d", actual=0)
    if g == 0:
        raise_shape_error(function, "k", "axis g is 0: need at least one key/value head", axis="g", actual=0)
    if h % g != 0:
        raise_shape_error(function, "k", f"axis g is {g}, which does not divide h={h} (bound by q)",
                          axis="g", actual=g, bound_by="q")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        bad, dtype = ("k", k.dtype) if k.dtype != q.dtype else ("v", v.dtype)
        raise_shape_error(function, bad, f"dtype is {str(dtype)[6:]}, expected {str(q.dtype)[6:]} (the dtype of q)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{function.__name__}: dropout_p must be in [0, 1), got {dropout_p}")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"{function.__name__}: scale must be a finite number, got {scale}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    t, s = q.shape[2], k.shape[2]
    if is_causal and t == 1 and s >= 1:
        is_causal = False  # bottom-right: a single query is the newest position and sees every key
    return scale, is_causal


def _reference(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, attn_bias: Tensor | None,
               is_causal: bool, scale: float, dropout_p: float) -> tuple[Tensor, Tensor]:
    """The paper's equation with our conventions: ``(output, weights)``."""
    t, s, g = q.shape[2], k.shape[2], k.shape[1]
    mask = merge_causal(attn_mask, t, s, device=q.device) if is_causal else attn_mask
    keep = mask if mask is not None and mask.dtype == torch.bool else None
    bias = mask if mask is not None and mask.dtype != torch.bool else None

    # Half-precision inputs: logits and softmax in float32 (exp overflows and sums lose digits in fp16).
    compute = torch.promote_types(q.dtype, torch.float32)
    grouped_q = rearrange(q.to(compute), "b (g r) t d -> b g r t d", g=g)
    logits = einsum(grouped_q, k.to(compute), "b g r t d, b g s d -> b g r t s") * scale
    logits = rearrange(logits, "b g r t s -> b (g r) t s")
    if attn_bias is not None:
        logits = logits + attn_bias.to(compute)
    if bias is not None:
        logits = logits + bias.to(compute)
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    if keep is None and bias is None and attn_bias is None:
        weights = logits.softmax(dim=-1)
    else:
        # Rows where every key is masked: softmax over all -inf is NaN. Give them zero weights instead,
        # computing the softmax on a harmless row so that no NaN reaches the backward pass either.
        live = (logits > float("-inf")).any(dim=-1, keepdim=True)
        weights = logits.masked_fill(~live, 0.0).softmax(dim=-1).masked_fill(~live, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    grouped_w = rearrange(weights, "b (g r) t s -> b g r t s", g=g)
    out = einsum(grouped_w, v.to(compute), "b g r t s, b g s dv -> b g r t dv")
    out = rearrange(out, "b g r t dv -> b (g r) t dv").to(q.dtype)
    return out, weights.to(q.dtype)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, attn_bias: Tensor | None, is_causal: bool,
          scale: float, dropout_p: float) -> Tensor:
    """The same computation through ``F.scaled_dot_product_attention``, with our conventions imposed."""
    t, s = q.shape[2], k.shape[2]
    mask = attn_mask
    torch_causal = False
    if is_causal:
        if mask is None and attn_bias is None and t == s and scale > 0:
            # torch's top-left alignment equals ours when t == s, and the flag lets it pick a fast kernel.
            # (Its CPU kernel returns NaN for causal rows with a non-positive scale: build the mask then.)
            torch_causal = True
        else:
            mask = merge_causal(mask, t, s, device=q.device)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if attn_bias is not None:
        # torch takes one float mask: the bias, with -inf where a boolean mask forbids (or plus a float mask).
        bias = attn_bias.to(q.dtype)
        if mask is None:
            mask = bias
        elif mask.dtype == torch.bool:
            mask = torch.where(mask, bias, torch.tensor(float("-inf"), dtype=q.dtype, device=q.device))
        else:
            mask = mask + bias
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=torch_causal,
                                         scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if mask is not None:
        # torch's safe softmax already gives 0 for rows without keys on CPU; make it a guarantee.
        live = mask.any(dim=-1, keepdim=True) if mask.dtype == torch.bool else \
            (mask > float("-inf")).any(dim=-1, keepdim=True)
        out = out.masked_fill(~live, 0.0)
    return out


scaled_dot_product_attention = typechecked(scaled_dot_product_attention)
scaled_dot_product_attention_with_weights = typechecked(scaled_dot_product_attention_with_weights)
