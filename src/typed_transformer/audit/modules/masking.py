"""Masks a module applies beyond the paper's: local windows, blocks, additive masks, a mask merged with causality."""

import torch
from einops import rearrange
from jaxtyping import Bool, Float
from torch import Tensor

from ...masks import merge_causal
from ...shapecheck import typechecked
from ..core.conventions import KeepMask


def local_mask(t: int, s: int, radius: int) -> Bool[Tensor, "t s"]:
    """A two-sided local window (LongT5's local attention), aligned bottom-right like :func:`window_mask`:
    ``keep[i, j] = |j - p| <= radius`` with ``p = i + s - t`` the query's position."""
    positions = rearrange(torch.arange(s - t, s), "t -> t 1")
    keys = rearrange(torch.arange(s), "s -> 1 s")
    return (keys - positions).abs() <= radius
local_mask = typechecked(local_mask)


def additive_mask(keep: Bool[Tensor, "*shape"] | None, dtype: torch.dtype, fill: float | None = None
                  ) -> Float[Tensor, "*shape"] | None:
    """A keep-mask as an additive float mask: 0 where allowed, ``fill`` (default ``finfo(dtype).min``, as
    Hugging Face builds them) elsewhere."""
    if keep is None:
        return None
    fill = torch.finfo(dtype).min if fill is None else fill
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


additive_mask = typechecked(additive_mask)


def block_mask(t: int, s: int, size: int) -> Bool[Tensor, "t s"]:
    """Block-local attention: query ``i`` sees key ``j`` when both lie in the same block of ``size`` consecutive
    positions, ``i // size == j // size`` (self-attention: ``t = s``)."""
    return (torch.arange(t)[:, None] // size) == (torch.arange(s)[None, :] // size)


block_mask = typechecked(block_mask)


def with_causal(keep: KeepMask | None, is_causal: bool, t: int, s: int) -> KeepMask | None:
    """``keep`` ANDed with our bottom-right causal mask (for modules whose causality is a mask argument):
    :func:`~typed_transformer.merge_causal`, always 4-D ``(#b, #h, t, s)``."""
    if not is_causal:
        return keep
    return merge_causal(torch.ones(1, 1, t, s, dtype=torch.bool) if keep is None else keep, t, s)


with_causal = typechecked(with_causal)
