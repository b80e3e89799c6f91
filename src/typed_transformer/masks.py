"""Attention masks: the library's one convention, and explicit conversions from torch's.

Convention (the ``F.scaled_dot_product_attention`` one): a boolean mask is a *keep* mask,
**True = this query may attend to this key**. A floating-point mask is added to the logits
(``-inf`` removes a key). ``key_padding_mask`` is boolean with **True = real token**.

``torch.nn.MultiheadAttention`` and ``nn.Transformer*`` use the opposite boolean polarity
(True = masked out) and lay 3-D masks out as ``((b h), t, s)``, batch-major. The ``*_from_torch`` and
``*_to_torch`` functions here are the only places where that conversion happens.

Causal masks are aligned **bottom-right**: with ``t`` queries and ``s`` keys, query ``i`` may attend to
key ``j`` when ``j <= i + (s - t)``. That is the alignment a KV cache needs (the last query is the newest
token and sees every key). With ``t > s`` the first ``t - s`` rows have no key at all; such fully masked
rows give zero output (see :func:`typed_transformer.scaled_dot_product_attention`).

Axis names: ``b`` batch, ``h`` heads, ``t`` query positions, ``s`` key positions.
"""

from typing import TypeAlias

import torch
from einops import rearrange
from jaxtyping import Bool, Float
from torch import Tensor

from .shapecheck import raise_shape_error, typechecked

__all__ = [
    "AttnMask",
    "attn_mask_from_torch",
    "attn_mask_to_torch",
    "causal_mask",
    "key_padding_mask_from_torch",
    "key_padding_mask_to_torch",
    "merge_causal",
    "merge_masks",
    "window_mask",
]

#: A mask accepted by the attention core: boolean keep-mask or additive float mask, either 2-D
#: ``(t, s)`` or 4-D ``(b, h, t, s)`` where ``b``, ``h`` and ``t`` may be 1 to broadcast (a key padding
#: mask is ``(b, 1, 1, s)``).
AttnMask: TypeAlias = (
    Bool[Tensor, "#b #h #t s"] | Float[Tensor, "#b #h #t s"] | Bool[Tensor, "t s"] | Float[Tensor, "t s"]
)


def causal_mask(t: int, s: int | None = None, *, device: torch.device | str | None = None) -> Bool[Tensor, "t s"]:
    """Boolean keep-mask of shape ``(t, s)``, aligned bottom-right: ``keep[i, j] = j <= i + (s - t)``.

    With ``s = t`` (the default) this is the usual lower triangle. With ``t < s`` (a KV cache: ``t`` new
    queries after ``s - t`` cached keys) every query also sees all cached keys.
    """
    s = t if s is None else s
    if t < 0 or s < 0:
        raise ValueError(f"causal_mask: sizes must be non-negative, got t={t}, s={s}")
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def window_mask(t: int, s: int, window: int, *, device: torch.device | str | None = None) -> Bool[Tensor, "t s"]:
    """The lower edge of a sliding window of ``window`` keys, aligned bottom-right like :func:`causal_mask`:
    ``keep[i, j] = j > i + (s - t) - window`` (query position ``p = i + s - t`` sees keys after ``p - window``).

    With :func:`causal_mask` it gives Mistral's sliding-window attention: each query sees itself and the
    ``window - 1`` keys before it.
    """
    if t < 0 or s < 0 or window < 1:
        raise ValueError(f"window_mask: sizes must be non-negative and the window positive, got t={t}, s={s}, "
                         f"window={window}")
    positions = rearrange(torch.arange(s - t, s, device=device), "t -> t 1")
    keys = rearrange(torch.arange(s, device=device), "s -> 1 s")
    return keys > positions - window


def attn_mask_from_torch(
    attn_mask: Bool[Tensor, "t s"] | Float[Tensor, "t s"] | Bool[Tensor, "bh t s"] | Float[Tensor, "bh t s"],
    num_heads: int | None = None,
) -> Bool[Tensor, "t s"] | Float[Tensor, "t s"] | Bool[Tensor, "b h t s"] | Float[Tensor, "b h t s"]:
    """Convert an ``nn.MultiheadAttention`` ``attn_mask`` to ours.

    Boolean masks are inverted (torch: True = masked out; ours: True = may attend). Float masks are
    additive in both and pass through unchanged. A 3-D torch mask ``((b h), t, s)`` (batch-major, as torch
    lays it out) becomes ``(b, h, t, s)``: ``num_heads`` splits its first axis, and only a 3-D mask needs it.

    Raises:
        TypeError: a 3-D mask without ``num_heads``.
    """
    mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask
    if mask.ndim == 3:
        if num_heads is None:
            raise TypeError("attn_mask_from_torch: a 3-D mask ((b h), t, s) needs num_heads to split its first "
                            "axis; a 2-D (t, s) mask does not")
        if mask.shape[0] % num_heads != 0:
            raise_shape_error(attn_mask_from_torch, "attn_mask",
                              f"axis 0 is {mask.shape[0]}, not a multiple of num_heads={num_heads} "
                              "(torch lays 3-D masks out as ((b h), t, s))")
        mask = rearrange(mask, "(b h) t s -> b h t s", h=num_heads)
    return mask


def attn_mask_to_torch(
    attn_mask: Bool[Tensor, "t s"] | Float[Tensor, "t s"] | Bool[Tensor, "b h t s"] | Float[Tensor, "b h t s"],
) -> Bool[Tensor, "t s"] | Float[Tensor, "t s"] | Bool[Tensor, "bh t s"] | Float[Tensor, "bh t s"]:
    """Convert one of our masks to ``nn.MultiheadAttention``'s convention (the inverse of
    :func:`attn_mask_from_torch`): booleans inverted, 4-D ``(b, h, t, s)`` flattened to ``((b h), t, s)``."""
    mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask
    if mask.ndim == 4:
        mask = rearrange(mask, "b h t s -> (b h) t s")
    return mask


def key_padding_mask_from_torch(key_padding_mask: Bool[Tensor, "b s"]) -> Bool[Tensor, "b s"]:
    """torch's ``key_padding_mask`` (True = padding, ignore) -> ours (True = real token)."""
    return ~key_padding_mask


def key_padding_mask_to_torch(key_padding_mask: Bool[Tensor, "b s"]) -> Bool[Tensor, "b s"]:
    """Ours (True = real token) -> torch's ``key_padding_mask`` (True = padding, ignore)."""
    return ~key_padding_mask


def merge_masks(
    attn_mask: Bool[Tensor, "#b #h #t s"] | Float[Tensor, "#b #h #t s"] | None,
    key_padding_mask: Bool[Tensor, "b s"] | None,
) -> Bool[Tensor, "#b #h #t s"] | Float[Tensor, "#b #h #t s"] | None:
    """Fold a key padding mask ``(b, s)`` into a 4-D attention mask.

    Boolean masks are combined with AND; with a float ``attn_mask`` the padded keys get ``-inf``.
    Returns None when both are None. A padding mask alone comes back as ``(b, 1, 1, s)``.
    """
    if key_padding_mask is None:
        return attn_mask
    padding = rearrange(key_padding_mask, "b s -> b 1 1 s")
    if attn_mask is None:
        return padding
    if attn_mask.dtype == torch.bool:
        return attn_mask & padding
    return attn_mask.masked_fill(~padding, float("-inf"))


def merge_causal(
    attn_mask: Bool[Tensor, "#b #h #t s"] | Float[Tensor, "#b #h #t s"] | Bool[Tensor, "t s"] | Float[Tensor, "t s"]
    | None,
    t: int,
    s: int,
    *,
    device: torch.device | str | None = None,
) -> Bool[Tensor, "#b #h #t s"] | Float[Tensor, "#b #h #t s"] | Bool[Tensor, "t s"] | Float[Tensor, "t s"]:
    """AND the bottom-right causal mask ``causal_mask(t, s)`` into ``attn_mask``.

    Boolean masks are combined with AND; a float mask gets ``-inf`` where the causal mask forbids; with no
    ``attn_mask`` the causal mask itself comes back. ``attn_mask`` is ``(t, s)`` or ``(b, h, t, s)`` (``b``,
    ``h`` and ``t`` may be 1 to broadcast); the result has the broadcast shape.

    Raises:
        ValueError: ``t`` or ``s`` is negative.
        ShapeError: ``attn_mask`` does not cover ``s`` keys or ``t`` queries (or 1, to broadcast).
    """
    causal = causal_mask(t, s, device=device)
    if attn_mask is not None:
        for axis, size, wanted in (("s", attn_mask.shape[-1], s), ("t", attn_mask.shape[-2], t)):
            if size != wanted and not (axis == "t" and size == 1):
                raise_shape_error("typed_transformer.masks.merge_causal", "attn_mask",
                                  f"axis {axis} is {size}, expected {wanted} (the argument {axis})",
                                  axis=axis, actual=size, expected=wanted)
    if attn_mask is None:
        return causal
    if attn_mask.dtype == torch.bool:
        return attn_mask & causal
    return attn_mask.masked_fill(~causal, float("-inf"))


causal_mask = typechecked(causal_mask)
window_mask = typechecked(window_mask)
attn_mask_from_torch = typechecked(attn_mask_from_torch)
attn_mask_to_torch = typechecked(attn_mask_to_torch)
key_padding_mask_from_torch = typechecked(key_padding_mask_from_torch)
key_padding_mask_to_torch = typechecked(key_padding_mask_to_torch)
merge_masks = typechecked(merge_masks)
merge_causal = typechecked(merge_causal)
