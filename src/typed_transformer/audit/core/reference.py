"""The reference the audit compares with, in float64: the paper's attention

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d) + mask) V

under declared conventions (mask polarity, causal alignment, fully masked rows), and rotary position embedding."""

import math
from typing import Literal

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Float64
from torch import Tensor

from ...attention import scaled_dot_product_attention
from ...masks import causal_mask
from ...shapecheck import typechecked
from .conventions import AuditUsageError, Conventions, KeepMask

# ----------------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------------


def causal_keep(t: int, s: int, conventions: Conventions) -> Bool[Tensor, "t s"]:
    """The candidate's causal keep-mask: bottom-right (ours) or top-left, all True for one query with
    ``decode_sees_all``."""
    if t == 1 and conventions.decode_sees_all:
        return torch.ones(t, s, dtype=torch.bool)
    if conventions.causal_alignment == "bottom-right":
        return causal_mask(t, s)
    return torch.ones(t, s, dtype=torch.bool).tril()


def effective_keep(keep: KeepMask | None, is_causal: bool, t: int, s: int, conventions: Conventions
                   ) -> KeepMask | None:
    """``keep`` ANDed with the candidate's causal mask, ``(#b, #h, t, s)`` (None when neither is given)."""
    if not is_causal and not conventions.always_causal:
        return keep
    causal = rearrange(causal_keep(t, s, conventions), "t s -> 1 1 t s")
    return causal if keep is None else keep & causal


def reference_attention(
    q: Float[Tensor, "b h t d"],
    k: Float[Tensor, "b g s d"],
    v: Float[Tensor, "b g s dv"],
    keep: Bool[Tensor, "#b #h #t s"] | None = None,
    *,
    is_causal: bool = False,
    conventions: Conventions = Conventions(),
    bias: Float[Tensor, "#b #h #t s"] | None = None,
    softcap: float | None = None,
    sinks: Float[Tensor, " h"] | None = None,
    softmax_dtype: torch.dtype | None = None,
    softmax_over_queries: bool = False,
) -> Float[Tensor, "b h t dv"]:
    """Our reference in the candidate's semantics (canonical ``bhtd`` layout with ``h = (g r)``, keep-mask
    ``keep``), computed in the dtype of ``q``. A query row without any allowed key gives what the conventions
    declare: zeros (``"zero"`` and ``"any"``), NaN, or the mean of the values (``"uniform"``). ``bias``: an
    additive position bias on the scaled logits (T5's relative bias, ALiBi), the attention core's ``attn_bias``.
    ``softcap``: Gemma 2's logit soft-capping, ``c * tanh(l / c)`` on the scaled logits before the bias and the
    mask; ``sinks``: gpt-oss's learned per-head logits, one more term in each row's softmax denominator that takes
    no value (``exp(l_j) / (exp(z_h) + sum_i exp(l_i))``); ``softmax_dtype``: the softmax alone in that dtype (a
    variant the diagnosis of a failure tries; ``softmax_over_queries`` another: each key's column normalised over the
    queries, the wrong axis). With any of these the reference writes the softmax out."""
    t, s = q.shape[2], k.shape[2]
    keep = effective_keep(keep, is_causal, t, s, conventions)
    dead: Tensor | None = None
    if keep is not None and conventions.fully_masked in ("nan", "uniform"):
        dead = ~keep.any(dim=-1, keepdim=True)  # (#b, #h, t, 1)
        if conventions.fully_masked == "uniform" and bool(dead.any()):
            # equal logits on every key of a dead row: zero its query, let it see every key
            dead_rows = dead.expand(q.shape[0], q.shape[1], t, 1)
            q = q.masked_fill(dead_rows, 0.0)
            keep = keep | dead
            if bias is not None:  # a fill of finfo.min swamps the bias: the row is uniform
                bias = bias.masked_fill(dead_rows, 0.0)
    if softcap is None and sinks is None and softmax_dtype is None and not softmax_over_queries:
        out = scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=conventions.scale,
                                           attn_bias=None if bias is None else bias.to(q.dtype))
        assert isinstance(out, Tensor)
    else:
        out = _written_out(q, k, v, keep, conventions.scale, bias, softcap, sinks, softmax_dtype or q.dtype,
                           -2 if softmax_over_queries else -1)
    if dead is not None and conventions.fully_masked == "nan":
        out = out.masked_fill(dead.expand(out.shape[0], out.shape[1], t, 1), math.nan)
    return out


def _written_out(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, scale: float | None, bias: Tensor | None,
                 softcap: float | None, sinks: Tensor | None, softmax_dtype: torch.dtype, axis: int = -1) -> Tensor:
    """The attention of :func:`reference_attention` with its softmax written out (the variants need it): logits
    ``s q.k``, soft-capped, plus the bias, masked to -inf, a sink column appended to each row's softmax and
    dropped after it; ``(b, h, t, dv)`` in ``q``'s dtype. A row whose keys are all masked gives zeros (or, with a
    sink, the sink takes all its weight: zeros too)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    logits = einsum(q, k, "b h t d, b h s d -> b h t s") * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    if keep is not None:
        logits = logits.masked_fill(~keep, -math.inf)
    if sinks is not None:
        column = sinks.to(logits.dtype)[None, :, None, None].expand(*logits.shape[:-1], 1)
        logits = torch.cat([logits, column], dim=-1)
    weights = logits.softmax(dim=axis, dtype=softmax_dtype).nan_to_num(0.0).to(q.dtype)  # a row all -inf: zeros
    if sinks is not None:
        weights = weights[..., :-1]
    return einsum(weights, v, "b h t s, b h s dv -> b h t dv")


reference_attention = typechecked(reference_attention)
effective_keep = typechecked(effective_keep)


def rotate(x: Float[Tensor, "b h t d"], base: float, style: Literal["half", "interleaved"], offset: int = 0, *,
           tables: torch.dtype = torch.float64, frequencies: Float[Tensor, " i"] | None = None,
           magnitude: float = 1.0, positions: Float64[Tensor, "t i"] | None = None) -> Float[Tensor, "b h t d"]:
    """The reference rotary embedding of ``x (b, h, t, d)`` at positions ``offset + j``: pairs
    ``(x[i], x[i + d/2])`` (``"half"``, GPT-NeoX / Llama) or ``(x[2i], x[2i + 1])`` (``"interleaved"``, GPT-J,
    the RoFormer paper), angle ``pos * base^(-2i/d)``; computed in float64, returned in ``x``'s dtype. Written out
    here, not with :class:`~typed_transformer.RotaryEmbedding`, so that it stays independent of the code it audits.
    ``tables``: the dtype of the angles and their cos/sin (float32: the tables most libraries build whatever the
    input dtype, computed as they compute them: ``1 / base^(2i/d)``, times the position, in that dtype).
    ``frequencies`` (``d/2`` of them) replace ``base^(-2i/d)`` and ``magnitude`` multiplies cos and sin: a rope
    type other than the default (Llama 3's, YaRN's), its frequencies read from the module's own rotary class.
    ``positions`` ``(t, d/2)``: the position each frequency of each token turns by, in place of ``offset + j``
    (M-RoPE: each frequency section reads its own axis of 3-D positions)."""
    half = x.shape[-1] // 2
    if frequencies is not None and frequencies.shape != (half,):
        raise AuditUsageError(f"rotate: {tuple(frequencies.shape)} frequencies for {x.shape[-1]} rotated features "
                              f"(expected {half})")
    if tables == torch.float64:
        steps = torch.arange(offset, offset + x.shape[2], dtype=torch.float64)
        inverse = (base ** (-torch.arange(half, dtype=torch.float64) / half) if frequencies is None
                   else frequencies.double())
        theta = (einsum(steps, inverse, "t, i -> t i") if positions is None
                 else positions * inverse[None, :])
    else:
        inverse = (1.0 / (base ** (torch.arange(0, 2 * half, 2, dtype=torch.int64).to(tables) / (2 * half)))
                   if frequencies is None else frequencies.to(tables))
        steps = torch.arange(offset, offset + x.shape[2], dtype=torch.int64).to(tables)
        theta = (steps[:, None] if positions is None else positions.to(tables)) * inverse[None, :]
    y = x.double()
    if style == "interleaved":
        first, second = y[..., 0::2], y[..., 1::2]
    else:
        first, second = y[..., :half], y[..., half:]
    cos, sin = theta.cos().double() * magnitude, theta.sin().double() * magnitude
    a, b = first * cos - second * sin, second * cos + first * sin
    if style == "interleaved":
        out = rearrange(torch.stack([a, b], dim=-1), "b h t i two -> b h t (i two)")
    else:
        out = torch.cat([a, b], dim=-1)
    return out.to(x.dtype)


rotate = typechecked(rotate)
