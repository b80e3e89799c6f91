"""Positional information: the paper's sinusoids, learned embeddings (nanoGPT's ``wpe``), rotary
embeddings (RoPE) and ALiBi's linear attention biases.

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
* :class:`ALiBiPositionalBias` adds no vector at all: it makes the additive attention bias

      bias[h, i, j] = -m_h * |pos(i) - pos(j)|

  ("Train Short, Test Long", Press et al., 2022), passed to the attention core as ``attn_bias``. The slopes
  ``m_h`` are the paper's geometric sequence (:func:`alibi_slopes`). Any length works.

The models name these kinds by one vocabulary (:data:`SharedPositions`, plus ``"alibi"`` for the GPT and
``"none"`` for the encoder-decoder model), checked and built by one function, :func:`position_modules`.
"""

import math
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from .shapecheck import raise_shape_error, shape_checked, typechecked
from .validation import check_parameter_dtype, check_positive_int

__all__ = [
    "ALiBiPositionalBias",
    "LearnedPositionalEmbedding",
    "PositionModules",
    "RotaryEmbedding",
    "SharedPositions",
    "SinusoidalPositionalEncoding",
    "alibi_slopes",
    "check_positional",
    "position_modules",
    "sinusoidal_table",
]

#: The position kinds both models take: a vector added to the embeddings (``learned``: a table of
#: ``max_length``; ``sinusoidal``: the paper's) or a rotation of queries and keys (``rope``). A model's own
#: kinds extend it: ``Literal[SharedPositions, "alibi"]``.
SharedPositions: TypeAlias = Literal["learned", "sinusoidal", "rope"]


def sinusoidal_table(positions: Int[Tensor, " t"] | Float[Tensor, " t"], d_model: int, *,
                     dtype: torch.dtype = torch.float32) -> Float[Tensor, "t d_model"]:
    """``(len(positions), d_model)`` table of the paper's encodings; computed in float64, then cast."""
    pos = rearrange(positions.to(torch.float64), "t -> t 1")
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    angles = pos / 10000.0 ** (i2 / d_model)
    table = torch.zeros(positions.numel(), d_model, dtype=torch.float64, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.to(dtype)


sinusoidal_table = typechecked(sinusoidal_table)


@shape_checked
class SinusoidalPositionalEncoding(nn.Module):
    """``x + PE[offset : offset + t]`` for ``x (b, t, d_model)``; no parameters, no length limit."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        check_positive_int("SinusoidalPositionalEncoding", "d_model", d_model)
        self.d_model = d_model

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}"

    def forward(self, x: Float[Tensor, "b t {self.d_model}"], offset: int = 0) -> Float[Tensor, "b t {self.d_model}"]:
        positions = torch.arange(offset, offset + x.shape[1], device=x.device)
        return x + sinusoidal_table(positions, self.d_model, dtype=x.dtype)

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward


@shape_checked
class LearnedPositionalEmbedding(nn.Module):
    """``x + wpe[offset : offset + t]`` with a learned table of ``max_length`` positions."""

    def __init__(self, max_length: int, d_model: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        check_positive_int("LearnedPositionalEmbedding", "max_length", max_length)
        check_positive_int("LearnedPositionalEmbedding", "d_model", d_model)
        check_parameter_dtype("LearnedPositionalEmbedding", dtype)
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

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward


@shape_checked
class RotaryEmbedding(nn.Module):
    """Rotary position embedding for queries and keys ``(b, h, t, d)``, split-half convention.

    ``forward(x, offset)`` rotates position ``offset + j`` of ``x`` by angles ``(offset + j) * theta_i``,
    ``theta_i = base^(-2i/d)``, pairing ``x[..., i]`` with ``x[..., i + d/2]``.
    """

    __shape_checked__ = ("angles",)

    def __init__(self, head_dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        check_positive_int("RotaryEmbedding", "head_dim", head_dim)
        if head_dim % 2 != 0:
            raise ValueError(f"RotaryEmbedding: head_dim must be a positive even number, got {head_dim}")
        if not (math.isfinite(base) and base > 1.0):
            raise ValueError(f"RotaryEmbedding: base must be a finite number > 1, got {base}")
        self.head_dim = head_dim
        self.base = base

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"

    def angles(self, positions: Int[Tensor, " t"] | Float[Tensor, " t"]
               ) -> tuple[Float[Tensor, "t {self.head_dim}"], Float[Tensor, "t {self.head_dim}"]]:
        """``cos`` and ``sin`` of the rotation angles, ``(len(positions), head_dim)``, in float64."""
        half = self.head_dim // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
        theta = rearrange(positions.to(torch.float64), "t -> t 1") * rearrange(inv_freq, "f -> 1 f")
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

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward


def alibi_slopes(num_heads: int) -> Float[Tensor, " {num_heads}"]:
    """ALiBi's head slopes in float64, as the paper's code computes them.

    For ``n`` a power of two: the geometric sequence ``m_i = 2^(-8 i / n)``, ``i = 1..n`` (``1/2 ... 1/256``
    for 8 heads). Otherwise, with ``p`` the largest power of two below ``n``: the ``p`` slopes for ``p`` heads,
    then every other slope of the ``2p``-head sequence, ``n - p`` of them (the paper's interpolation).

    Raises:
        ValueError: ``num_heads`` is not a positive int.
    """
    check_positive_int("alibi_slopes", "num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(closest)
    if closest != num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float64)


alibi_slopes = typechecked(alibi_slopes)


@shape_checked
class ALiBiPositionalBias(nn.Module):
    """ALiBi: the additive attention bias ``-m_h * |pos(i) - pos(j)|`` for ``num_heads`` query heads.

    ``forward(t, s)`` returns the bias ``(1, num_heads, t, s)`` for ``t`` queries and ``s`` keys, aligned
    bottom-right as the library's causal mask is: query ``i`` sits at position ``i + (s - t)``, key ``j`` at
    ``j``, so a KV cache (``t`` new queries after ``s - t`` cached keys) gets the rows of a full pass. Pass
    it to :class:`~typed_transformer.MultiHeadAttention` as ``attn_bias`` (with ``is_causal=True`` for a
    decoder). The bias depends only on the distance ``i - j``; under the causal mask only ``j <= i`` is
    seen, where it is the paper's ``-m_h (i - j)``. No parameters (the slopes are a non-persistent buffer,
    so a state dict holds nothing for it).
    """

    slopes: Tensor

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        # float64, as alibi_slopes gives them (a module-wide .float() or .half() rounds them as it rounds weights).
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"

    def forward(self, t: int, s: int | None = None, *, dtype: torch.dtype | None = None
                ) -> Float[Tensor, "1 {self.num_heads} t s"]:
        """The bias ``(1, num_heads, t, s)`` (``s`` defaults to ``t``), computed in ``dtype`` (default float32).

        Raises:
            ValueError: ``t`` or ``s`` negative.
        """
        s = t if s is None else s
        if t < 0 or s < 0:
            raise ValueError(f"ALiBiPositionalBias: sizes must be non-negative, got t={t}, s={s}")
        device, dtype = self.slopes.device, torch.float32 if dtype is None else dtype
        query_pos = torch.arange(s - t, s, device=device)
        key_pos = torch.arange(s, device=device)
        distance = (rearrange(query_pos, "t -> t 1") - rearrange(key_pos, "s -> 1 s")).abs().to(dtype)
        # Computed in the dtype asked for, from the float64 slopes: a float64 bias is exact to float64.
        bias = 0.0 - rearrange(self.slopes.to(dtype), "h -> h 1 1") * distance  # 0.0 - x: +0 on the diagonal, not -0
        return rearrange(bias, "h t s -> 1 h t s")

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward


# ----------------------------------------------------------------------------------------------------
# The kinds, by name
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionModules:
    """What one kind of position information puts into a model (at most one field is set; ``"none"``: none).

    ``embedding`` adds a vector per position to the token embeddings (``learned``, ``sinusoidal``);
    ``rotary`` is applied by every self-attention to its queries and keys (``rope``); ``alibi`` makes the
    attention bias (``alibi``).
    """

    embedding: LearnedPositionalEmbedding | SinusoidalPositionalEncoding | None = None
    rotary: RotaryEmbedding | None = None
    alibi: ALiBiPositionalBias | None = None


def check_positional(owner: str, kind: object, kinds: object, *, d_model: int, num_heads: int,
                     max_length: int | None) -> None:
    """Raise ``ValueError`` unless ``kind`` is one of the ``Literal`` type ``kinds`` and the sizes suit it.

    ``learned`` needs ``max_length`` (the size of its table); ``rope`` needs an even head size
    ``d_model // num_heads``. The messages start with ``owner`` (``"GPTConfig: positional must be learned,
    sinusoidal, rope or alibi, got 'xpos'"``).
    """
    names = typing.get_args(kinds)
    if kind not in names:
        spelled = ", ".join(names[:-1]) + f" or {names[-1]}"
        raise ValueError(f"{owner}: positional must be {spelled}, got {kind!r}")
    if kind == "learned" and max_length is None:
        raise ValueError(f"{owner}: positional='learned' needs max_length (the size of the table)")
    if kind == "rope" and num_heads > 0 and d_model % num_heads == 0 and (d_model // num_heads) % 2 != 0:
        raise ValueError(f"{owner}: rope needs an even head size, got {d_model // num_heads}")


def position_modules(owner: str, kind: str, kinds: object, *, d_model: int, num_heads: int,
                     max_length: int | None = None, device: torch.device | str | None = None,
                     dtype: torch.dtype | None = None) -> PositionModules:
    """Check ``kind`` (see :func:`check_positional`) and build its modules for a model of width ``d_model``
    with ``num_heads`` query heads; ``device`` and ``dtype`` go to the learned table."""
    check_positional(owner, kind, kinds, d_model=d_model, num_heads=num_heads, max_length=max_length)
    if kind == "learned":
        assert max_length is not None
        return PositionModules(embedding=LearnedPositionalEmbedding(max_length, d_model, device=device, dtype=dtype))
    if kind == "sinusoidal":
        return PositionModules(embedding=SinusoidalPositionalEncoding(d_model))
    if kind == "rope":
        return PositionModules(rotary=RotaryEmbedding(d_model // num_heads))
    if kind == "alibi":
        return PositionModules(alibi=ALiBiPositionalBias(num_heads))
    return PositionModules()
