"""The reference math of position features modules add: rotary (plain and M-RoPE), ALiBi, T5 buckets, decomposed,
disentangled and relative-key positions, windowed biases."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from einops import einsum, rearrange
from jaxtyping import Float, Float64, Int
from torch import Tensor

from ...positions import alibi_slopes
from ...shapecheck import typechecked


@dataclass(frozen=True)
class Rotary:
    """Where a module's rotary embedding is described: ``base`` (a number or an attribute path such as
    ``"config.rope_theta"``) and the pairing, ``"half"`` (``x[i]`` with ``x[i + d/2]``) or ``"interleaved"``
    (``x[2i]`` with ``x[2i + 1]``)."""

    base: float | str = 10000.0
    style: Literal["half", "interleaved"] = "half"
    #: an attribute that is None when the module has no rotary embedding (e.g. ``"rotary"``)
    when: str | None = None
    #: partial rotary: the fraction of each head rotated, from its first dimension on (a number or an attribute
    #: path, e.g. GPT-NeoX's ``"config.rope_parameters.partial_rotary_factor"``); the rest passes through
    fraction: float | str = 1.0
    #: a rope type other than the default (Llama 3's, YaRN's): ``frequencies(module)`` gives the inverse
    #: frequencies (one per rotated pair) and the factor on cos and sin, read from the module's own rotary class;
    #: the reference still does the rotation itself (``base`` is then only named in messages)
    frequencies: Callable[[Any], tuple[Tensor, float]] | None = None
    #: tokens before the rotated ones (DINOv3's class and register tokens): the first ``prefix`` tokens are not
    #: turned, token ``prefix + i`` turns by position ``i`` (a number or an attribute path)
    prefix: int | str = 0


#: ``position_bias(module, t, s) -> (1 or h, t, s)``: the additive bias a module adds to its logits for ``t``
#: queries (the last ``t`` positions) and ``s`` keys, in float64.
PositionBias = Callable[[Any, int, int], Tensor]


def alibi_bias(h: int, t: int, s: int, *, form: Literal["distance", "key"] = "distance",
               slopes: Float64[Tensor, " {h}"] | None = None) -> Float64[Tensor, "{h} {t} {s}"]:
    """ALiBi's bias ``(h, t, s)`` for ``t`` queries (the last ``t`` of ``s`` positions) and ``s`` keys, float64,
    with the paper's head slopes (:func:`~typed_transformer.positions.alibi_slopes`: ``m_i = 2^(-8 i / h)`` for
    a power-of-two ``h``, the paper's interpolation otherwise). ``form="distance"``: ``-m_i * |p - j|`` for the
    query at position ``p``; under a causal mask the paper's ``-m_i (p - j)``, without one the symmetric form
    x-transformers and ours use. ``form="key"``: ``m_i * j``, BLOOM's and MPT's (softmax-equal to the paper's under
    a causal mask: the two differ by ``-m_i p``, one constant per query row). ``slopes``: other slopes than the
    paper's (a module's, scaled)."""
    slopes = alibi_slopes(h) if slopes is None else slopes
    keys = torch.arange(s, dtype=torch.float64)[None]
    if form == "key":
        return slopes[:, None, None] * keys.expand(t, s)
    distance = torch.arange(s - t, s, dtype=torch.float64)[:, None] - keys
    return -slopes[:, None, None] * distance.abs()


alibi_bias = typechecked(alibi_bias)


@dataclass(frozen=True)
class ALiBi:
    """ALiBi (Press et al., 2022): a bias on each logit linear in the key-query distance, one slope per query head,
    the paper's ``m_i = 2^(-8 i / h)`` (interpolated for a head count that is not a power of two:
    :func:`~typed_transformer.positions.alibi_slopes`). ``form``: as :func:`alibi_bias` (``"distance"``: the
    paper's ``-m_i |p - j|``; ``"key"``: ``m_i j``, BLOOM's, MPT's and Falcon's, softmax-equal to the paper's under
    a causal mask). ``factor``: a number or an attribute path multiplying every slope (Falcon adds its ALiBi before
    scaling the logits by ``1 / sqrt(d)``: ``factor="inv_norm_factor"``)."""

    form: Literal["distance", "key"] = "distance"
    factor: float | str = 1.0


def mrope_positions(offset: int, n: int) -> Tensor:
    """The 3-D positions ``(3, n)`` (temporal, height, width) the audit gives tokens ``offset .. offset + n - 1`` of an
    M-RoPE module: frames of a 2 x 2 image grid, token ``i`` at ``(f, f + (i // 2) % 2, f + i % 2)`` with
    ``f = i // 4`` (as Qwen2-VL numbers an image's patches: each axis from the grid's first position on). No two axes
    agree on every token, so a module that turns every frequency by one axis fails."""
    i = torch.arange(offset, offset + n)
    frame = i // 4
    return torch.stack([frame, frame + (i // 2) % 2, frame + i % 2])


@dataclass(frozen=True)
class MRope:
    """M-RoPE (Qwen2-VL, 2024): the rotary frequencies split into consecutive sections (``sections``: their sizes, a
    tuple, an attribute path such as ``"config.rope_parameters.mrope_section"`` or ``sections(module)``, summing to
    ``d/2``); section ``i`` turns by axis ``i mod 3`` of each token's 3-D position (temporal, height, width), or by
    axis ``axes[i]``. Axial rotary (Pixtral) is the 2-D case: two sections, turned by height and by width
    (``axes=(1, 2)``). The audit gives the tokens :func:`mrope_positions` (the spec's forward passes the module
    those positions too)."""

    sections: str | tuple[int, ...] | Callable[[Any], Sequence[int]] = "config.rope_parameters.mrope_section"
    axes: tuple[int, ...] | None = None
    #: blocked axial rotary (Gemma 4's vision rotary): the rotated features split into ``len(axes)`` consecutive
    #: blocks, block ``i`` turned on its own (``rotate_half`` within the block) by axis ``axes[i]``, every block with
    #: the same ``d / (2 len(axes))`` frequencies; ``sections`` is then not read
    blocks: bool = False


def one_row(t: int) -> tuple[int, int]:
    """The grid of ``t`` tokens given as one row of an image: ``(1, t)``."""
    return 1, t


@dataclass(frozen=True)
class DecomposedRelPos:
    """Decomposed relative positions (MViTv2, 2022; SAM's image encoder): the tokens lie on an ``H x W`` grid in
    row-major order, and the logit of query ``(y, x)`` on key ``(y', x')`` gains

        ``q . Rh[y - y' + H - 1] + q . Rw[x - x' + W - 1]``

    with ``q`` the query as projected (before the scale), and ``Rh``, ``Rw`` the learned tables ``h`` and ``w``
    (``(2 L - 1, d)``, shared by the heads) resized to ``2 H - 1`` and ``2 W - 1`` entries by linear interpolation
    with half-pixel centres (:func:`resize_table`, what ``F.interpolate(mode="linear")`` computes). ``grid(t) ->
    (H, W)``: the grid the spec's forward lays ``t`` tokens on (self-attention: keys on the same grid)."""

    h: str = "rel_pos_h"
    w: str = "rel_pos_w"
    grid: Callable[[int], tuple[int, int]] = one_row


def resize_table(table: Float[Tensor, "l d"], n: int) -> Float[Tensor, "{n} d"]:
    """``table`` resized to ``n`` rows by linear interpolation with half-pixel centres: row ``i`` samples the table
    at ``(i + 1/2) l / n - 1/2`` (clamped to ``[0, l - 1]``), between its two nearest rows."""
    length = table.shape[0]
    at = ((torch.arange(n, dtype=torch.float64) + 0.5) * (length / n) - 0.5).clamp(min=0)
    low = at.floor().long().clamp(max=length - 1)
    high = (low + 1).clamp(max=length - 1)
    frac = (at - low).to(table.dtype)[:, None]
    return table[low] * (1 - frac) + table[high] * frac


def decomposed_bias(q: Float[Tensor, "b h t d"], rel_h: Float[Tensor, "lh d"], rel_w: Float[Tensor, "lw d"],
                    grid: tuple[int, int]) -> Float[Tensor, "b h t t"]:
    """The additive logits :class:`DecomposedRelPos` describes, for queries ``q`` on ``grid`` (keys on the same
    grid)."""
    rows, cols = grid

    def along(table: Tensor, n: int) -> Tensor:  # (n queries, n keys, d): the entry of each distance
        distance = torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1
        return resize_table(table, 2 * n - 1)[distance]

    on_grid = rearrange(q, "b h (y x) d -> b h y x d", y=rows, x=cols)
    by_row = einsum(on_grid, along(rel_h, rows).to(q.dtype), "b h y x d, y k d -> b h y x k")
    by_col = einsum(on_grid, along(rel_w, cols).to(q.dtype), "b h y x d, x k d -> b h y x k")
    bias = by_row[..., :, None] + by_col[..., None, :]
    return rearrange(bias, "b h y x ky kx -> b h (y x) (ky kx)")


def window_bias(table: Float[Tensor, "n h"], window: tuple[int, int]) -> Float[Tensor, "h t t"]:
    """Swin's relative position bias: tokens ``i``, ``j`` of a ``Wh x Ww`` window (row-major) at offset
    ``(dy, dx)`` get ``table[(dy + Wh - 1) (2 Ww - 1) + dx + Ww - 1]``, one entry per head."""
    rows, cols = window
    y, x = torch.arange(rows * cols) // cols, torch.arange(rows * cols) % cols
    index = (y[:, None] - y[None, :] + rows - 1) * (2 * cols - 1) + x[:, None] - x[None, :] + cols - 1
    return rearrange(table[index], "t s h -> h t s")


@dataclass(frozen=True)
class Disentangled:
    """DeBERTa's disentangled attention (He et al., 2021): each logit gains a content-to-position and a
    position-to-content term from a table ``E (n, e)`` of relative-position embeddings (the model's, which its
    encoder passes to every layer; ``table(module)`` gives the one the spec's forward passes):

        ``A_ij = (q_i . k_j + q_i . Kr[r(i, j)] + k_j . Qr[r(i, j)]) / sqrt(d (1 + #terms))``

    ``Kr = E W_k^T + b_k`` and ``Qr = E W_q^T + b_q`` split into heads: the projections at ``key_proj`` and
    ``query_proj`` (the content ones when ``share_key`` is true); ``terms`` names the terms the module adds
    (``"c2p"``: ``q . Kr``, ``"p2c"``: ``k . Qr``), ``q`` and ``k`` as projected with their biases. The row
    ``r(i, j)`` of the distance ``i - j`` (:func:`disentangled_rows`): DeBERTa v2 (``form="v2"``) reads rows
    ``clamp(bucket(i - j) + m, 0, 2 m - 1)`` with ``m`` its ``buckets`` (or ``max_position`` without buckets) and
    :func:`log_bucket` distances; DeBERTa (``form="v1"``) reads rows ``M + clamp(i - j, -m, m - 1)`` with ``M`` its
    ``max_position`` and ``m = min(max(t, s), M)``."""

    table: Callable[[Any], Tensor]
    form: Literal["v1", "v2"] = "v2"
    terms: str = "pos_att_type"
    share_key: str = "share_att_key"
    key_proj: str = "pos_key_proj"
    query_proj: str = "pos_query_proj"
    buckets: str | int = "position_buckets"
    max_position: str = "max_relative_positions"


@dataclass(frozen=True)
class RelativeKeys:
    """Relative position embeddings the queries meet (Shaw et al., 2018, on the keys; Transformer-XL, Dai et al.,
    2019, as the conformers use it): each logit gains

        ``(q_i + c) . R[row(i, j)]`` times the logit scale,

    ``R`` the rows of ``table(module)`` (``(n, d)``, shared by the heads, or ``(n, e)`` turned into ``h`` heads by
    the linear map at ``proj``: Transformer-XL's ``linear_pos``), ``row(i, j)`` given by ``rows(t, s)``, and ``c``
    the ``(h, d)`` parameter at ``query_bias`` (Transformer-XL's ``pos_bias_v``; none for Shaw's). Transformer-XL's
    content logits use ``q + u`` (``content_bias``: ``pos_bias_u``). The module reads its table itself (Shaw's
    ``distance_embedding``) or is passed the one ``table`` gives (the conformers' sinusoids, from their encoder).

    ``values``: Shaw's relative values too (VITS): a table ``V (n, dv)`` shared by the heads, read at the same rows,
    each output gaining the rows its attention weights pick,

        ``o_i = sum_j p_ij (v_j + V[row(i, j)])``."""

    table: Callable[[Any], Tensor]
    rows: Callable[[int, int], Tensor]
    proj: str | None = None
    query_bias: str | None = None
    content_bias: str | None = None
    values: Callable[[Any], Tensor] | None = None


def log_bucket(distance: Int[Tensor, "*shape"], buckets: int, max_position: int) -> Int[Tensor, "*shape"]:
    """DeBERTa v2's log-spaced distances: exact within ``buckets // 2`` (``m``) of zero, beyond it
    ``sign * (m + ceil(log(|x| / m) / log((max_position - 1) / m) * (m - 1)))``."""
    half = buckets // 2
    size = distance.abs().double()
    far = torch.ceil(torch.log(size.clamp(min=half) / half) / math.log((max_position - 1) / half) * (half - 1)) + half
    return torch.where(size <= half, distance, (far * distance.sign()).long())


def disentangled_rows(t: int, s: int, form: Literal["v1", "v2"], buckets: int, max_position: int
                      ) -> Int[Tensor, "{t} {s}"]:
    """The row of DeBERTa's relative-embedding table that query ``i`` and key ``j`` read (:class:`Disentangled`)."""
    distance = torch.arange(t)[:, None] - torch.arange(s)[None, :]
    if form == "v1":
        span = min(max(t, s), max_position)
        return max_position + distance.clamp(-span, span - 1)
    span = buckets if buckets > 0 else max_position
    near = log_bucket(distance, buckets, max_position) if buckets > 0 else distance
    return (near + span).clamp(0, 2 * span - 1)


def log_coordinates(window: tuple[int, int], pretrained: tuple[int, int] | None = None) -> Float64[Tensor, "n 2"]:
    """Swin v2's log-spaced relative coordinates, one row per in-window offset ``(dy, dx)`` in the order of
    :func:`window_bias`'s table: each offset divided by ``W - 1`` (the pretrained window's, when given), times 8,
    then ``sign(x) log2(1 + |x|) / 3``."""
    rows, cols = window
    span = pretrained if pretrained is not None and pretrained[0] > 0 else window
    dy = torch.arange(1 - rows, rows, dtype=torch.float64)[:, None].expand(2 * rows - 1, 2 * cols - 1)
    dx = torch.arange(1 - cols, cols, dtype=torch.float64)[None, :].expand(2 * rows - 1, 2 * cols - 1)
    coords = torch.stack([dy / max(span[0] - 1, 1), dx / max(span[1] - 1, 1)], dim=-1) * 8
    return rearrange(coords.sign() * torch.log2(coords.abs() + 1) / 3, "y x two -> (y x) two")


resize_table = typechecked(resize_table)
window_bias = typechecked(window_bias)
log_coordinates = typechecked(log_coordinates)
decomposed_bias = typechecked(decomposed_bias)
log_bucket = typechecked(log_bucket)
disentangled_rows = typechecked(disentangled_rows)


def t5_buckets(distance: Int[Tensor, "*shape"], buckets: int, max_distance: int) -> Int[Tensor, "*shape"]:
    """T5's bidirectional relative-position buckets (Raffel et al., 2020; WavLM's too) of ``distance = j - i``: half
    the ``buckets`` per sign (``n = buckets // 2``, positive distances from ``n``), exact below ``m = n // 2``, beyond
    it ``min(m + floor(log(|x| / m) / log(max_distance / m) * (n - m)), n - 1)``."""
    n = buckets // 2
    half = n // 2
    size = distance.abs()
    far = half + torch.floor(torch.log(size.double().clamp(min=1) / half) / math.log(max_distance / half) * (n - half))
    return (distance > 0).long() * n + torch.where(size < half, size, far.long().clamp(max=n - 1))
t5_buckets = typechecked(t5_buckets)
