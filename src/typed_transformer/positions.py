"""Positional information: the paper's sinusoids, learned embeddings (nanoGPT's ``wpe``) and rotary
embeddings (RoPE).

Every encoding takes a position ``offset``: the index of the first position of the input. A KV cache
decodes position ``offset`` after ``offset`` cached ones, so the same module serves a full pass
(``offset=0``) and incremental decoding.

* :class:`SinusoidalPositionalEncoding` adds, to a ``(b, t, d_model)`` input,

      PE(pos, 2i) = sin(pos / 10000^(2i / d_model)),   PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

  ("Attention Is All You Need", section 3.5). No parameters; any length works.
* :class:`LearnedPositionalEmbedding` adds a learned vector per position, for at most ``max_length``
  positions; a longer input raises a :class:`~typed_transformer.ShapeError`.
* :class:`RotaryEmbedding` rotates queries and keys (not the residual stream) by position-dependent
  angles, in the split-half convention (GPT-NeoX, Equinox, HF Llama): the pair rotated together is
  ``(x[i], x[i + d/2])`` with angle ``pos * base^(-2i/d)``. Then ``q_m . k_n`` depends only on ``m - n``.
  Any length works.
"""

import math

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .shapecheck import raise_shape_error, shape_checked

__all__ = ["LearnedPositionalEmbedding", "RotaryEmbedding", "SinusoidalPositionalEncoding", "sinusoidal_table"]


def sinusoidal_table(positions: Tensor, d_model: int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(len(positions), d_model)`` table of the paper's encodings; computed in float64, then cast."""
    pos = positions.to(torch.float64)[:, None]
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    angles = pos / 10000.0 ** (i2 / d_model)
    table = torch.zeros(positions.numel(), d_model, dtype=torch.float64, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.to(dtype)


@shape_checked
class SinusoidalPositionalEncoding(nn.Module):
    """``x + PE[offset : offset + t]`` for ``x (b, t, d_model)``; no parameters, no length limit."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"SinusoidalPositionalEncoding: d_model must be positive, got {d_model}")
        self.d_model = d_model

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}"

    def forward(self, x: Float[Tensor, "b t {self.d_model}"], offset: int = 0) -> Float[Tensor, "b t {self.d_model}"]:
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)
        return x + sinusoidal_table(positions, self.d_model, dtype=x.dtype)


@shape_checked
class LearnedPositionalEmbedding(nn.Module):
    """``x + wpe[offset : offset + t]`` with a learned table of ``max_length`` positions."""

    def __init__(self, max_length: int, d_model: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if max_length <= 0 or d_model <= 0:
            raise ValueError(f"LearnedPositionalEmbedding: sizes must be positive, got {max_length}, {d_model}")
        self.max_length = max_length
        self.d_model = d_model
        self.weight = nn.Parameter(torch.empty(max_length, d_model, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    def extra_repr(self) -> str:
        return f"max_length={self.max_length}, d_model={self.d_model}"

    def forward(self, x: Float[Tensor, "b t {self.d_model}"], offset: int = 0) -> Float[Tensor, "b t {self.d_model}"]:
        t = x.shape[1]
        if offset < 0 or offset + t > self.max_length:
            raise_shape_error(
                LearnedPositionalEmbedding.forward, "x",
                f"positions {offset}..{offset + t - 1} are beyond the {self.max_length} learned positions "
                f"(axis t is {t}, offset {offset})", axis="t", actual=offset + t, expected=self.max_length)
        return x + self.weight[offset : offset + t].to(x.dtype)


@shape_checked
class RotaryEmbedding(nn.Module):
    """Rotary position embedding for queries and keys ``(b, h, t, d)``, split-half convention.

    ``forward(x, offset)`` rotates position ``offset + j`` of ``x`` by angles ``(offset + j) * theta_i``,
    ``theta_i = base^(-2i/d)``, pairing ``x[..., i]`` with ``x[..., i + d/2]``.
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 2 != 0:
            raise ValueError(f"RotaryEmbedding: head_dim must be a positive even number, got {head_dim}")
        if not (math.isfinite(base) and base > 1.0):
            raise ValueError(f"RotaryEmbedding: base must be a finite number > 1, got {base}")
        self.head_dim = head_dim
        self.base = base

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` of the rotation angles, ``(len(positions), head_dim)``, in float64."""
        half = self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
        theta = positions.to(torch.float64)[:, None] * inv_freq[None, :]
        theta = torch.cat([theta, theta], dim=-1)
        return theta.cos(), theta.sin()

    def forward(
        self, x: Float[Tensor, "b h t {self.head_dim}"], offset: int = 0
    ) -> Float[Tensor, "b h t {self.head_dim}"]:
        positions = torch.arange(offset, offset + x.shape[2], device=x.device)
        cos, sin = self.angles(positions)
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)
