"""Attention modules with their own weights: a declarative :class:`ModuleSpec` says where the projections,
head counts, scale and rotary embedding live and how to call ``forward``; :class:`ModuleAdapter` copies the
weights into the reference and runs every check on a deep copy of the module."""

import copy
import dataclasses
import inspect
import json
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from einops import einsum, rearrange, repeat
from jaxtyping import Bool, Float, Float64, Int
from torch import Tensor, nn

from ..masks import merge_causal, window_mask
from ..positions import alibi_slopes
from ..shapecheck import shape_checked, typechecked
from ._core import (
    DEFAULT_CONVENTIONS,
    AuditReport,
    AuditUsageError,
    Budget,
    CandidateOutput,
    Conventions,
    Example,
    Inputs,
    KeepMask,
    ModuleInputs,
    candidate_code,
    effective_keep,
    error,
    import_line,
    reference_attention,
    repro_comparison,
    rotate,
)
from ._functions import infer_function_conventions, run_audit
from ._infer import (
    Inference,
    check_known,
    contradictions,
    infer_adapter,
    with_differences,
    with_inference,
    with_known,
)

#: ``forward(module, x, key, value, keep, is_causal) -> (b, t, e)``: call the module on ``x (b, t, eq)`` (and
#: ``key (b, s, ek)``, ``value (b, s, ev)``; both None for a self-attention spec) with the canonical keep-mask
#: ``keep (b, 1 or h, t, s)`` (True = may attend, or None) in the module's own convention.
Forward = Callable[[Any, Tensor, Tensor | None, Tensor | None, Tensor | None, bool], Tensor]


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


@shape_checked
@dataclass(frozen=True)
class Weights:
    """A module's projections in float64, query heads in canonical ``(g r)`` order: ``w* (out, in)``."""

    wq: Float64[Tensor, "hd eq"]
    wk: Float64[Tensor, "gd ek"]
    wv: Float64[Tensor, "gdv ev"]
    wo: Float64[Tensor, "eo hdv"] | None
    bq: Float64[Tensor, " hd"] | None
    bk: Float64[Tensor, " gd"] | None
    bv: Float64[Tensor, " gdv"] | None
    bo: Float64[Tensor, " eo"] | None
    h: int
    g: int
    d: int
    dv: int
    scale: float
    #: key and value positions the module appends after the projection (``nn.MultiheadAttention``'s
    #: ``add_bias_kv`` then ``add_zero_attn``): ``(n, g d)`` and ``(n, g dv)``; always visible
    extra_k: Float64[Tensor, "n gd"] | None = None
    extra_v: Float64[Tensor, "n gdv"] | None = None
    #: an output gate's projection of the query input, ``(h, eq)`` (one gate per head) or ``(h dv, eq)`` (one per
    #: output feature), query heads in canonical order: the attention output is multiplied by ``sigmoid(x wg^T + bg)``
    wg: Float64[Tensor, "ng eq"] | None = None
    bg: Float64[Tensor, " ng"] | None = None
    #: attention sinks: one learned logit per query head (canonical order), in each row's softmax denominator
    sinks: Float64[Tensor, " nh"] | None = None

    __shape_checked__ = ("__init__",)


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


@dataclass(frozen=True)
class Differential:
    """Differential attention (Ye et al., 2024, "Differential Transformer"; DiffLlama): query heads ``p`` and
    ``p + h/2`` are the two maps of one differential head ``p``, whose value is the key/value heads ``j`` and
    ``j + g/2`` side by side (``j`` the key/value head of query head ``p``, ``2 dv`` wide):
    ``o_p = (softmax(s_p) - lambda softmax(s_{p + h/2})) [v_j; v_{j + g/2}]``, then the spec's ``sub_norm`` (the
    paper's group norm, over each differential head) and ``(1 - lambda_init)``. ``lambda = exp(lambda_q1 . lambda_k1)
    - exp(lambda_q2 . lambda_k2) + lambda_init``: the four attribute paths of the learned vectors and that of
    ``lambda_init`` (or a number)."""

    lambda_q1: str = "lambda_q1"
    lambda_k1: str = "lambda_k1"
    lambda_q2: str = "lambda_q2"
    lambda_k2: str = "lambda_k2"
    lambda_init: float | str = "lambda_init"


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2, 2024; DeepSeek V2/V3): keys and values come from one compressed
    latent ``c = RMSNorm(x W_kva^c)`` of ``rank`` features per token, ``[k_nope_h; v_h] = c W_kvb`` for each head;
    the rotary part of the keys ``k_rope = x W_kva^r`` (``rope`` features, the rows of ``kv_a`` after the latent's) is
    one for every head. Each head's query is ``[q_nope_h; q_rope_h]``, from ``q`` (a full-rank projection) or, where
    that attribute is None, from the low-rank ``q_b(RMSNorm(q_a(x)))``; its key ``[k_nope_h; k_rope]``. The rotary
    embedding turns the last ``rope`` features of each query and key. Attribute paths of the module's layers and
    sizes."""

    q: str = "q_proj"
    q_a: str = "q_a_proj"
    q_norm: str = "q_a_layernorm"
    q_b: str = "q_b_proj"
    kv_a: str = "kv_a_proj_with_mqa"
    kv_norm: str = "kv_a_layernorm"
    kv_b: str = "kv_b_proj"
    rank: str = "kv_lora_rank"
    nope: str = "qk_nope_head_dim"
    rope: str = "qk_rope_head_dim"
    value: str = "v_head_dim"


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


def local_mask(t: int, s: int, radius: int) -> Bool[Tensor, "t s"]:
    """A two-sided local window (LongT5's local attention), aligned bottom-right like :func:`window_mask`:
    ``keep[i, j] = |j - p| <= radius`` with ``p = i + s - t`` the query's position."""
    positions = rearrange(torch.arange(s - t, s), "t -> t 1")
    keys = rearrange(torch.arange(s), "s -> 1 s")
    return (keys - positions).abs() <= radius


resize_table = typechecked(resize_table)
window_bias = typechecked(window_bias)
local_mask = typechecked(local_mask)
log_coordinates = typechecked(log_coordinates)
decomposed_bias = typechecked(decomposed_bias)
log_bucket = typechecked(log_bucket)
disentangled_rows = typechecked(disentangled_rows)

#: The specs ``audit_module(..., spec="name")`` accepts by name: :mod:`typed_transformer.audit.specs` registers
#: the shipped ones here when the package loads (this module never imports it).
SHIPPED_SPECS: dict[str, "ModuleSpec"] = {}


#: The library specs read from the module (``audit_module(module, "litgpt")``, ``"auto"``): name -> reader;
#: :mod:`typed_transformer.audit._libraries` registers them when the package loads (this module never imports it).
LIBRARY_READERS: dict[str, Callable[[Any], "ModuleSpec"]] = {}


def library_setup(module: Any, name: str) -> str:
    """Lines that define ``module`` and ``spec`` in a fresh interpreter for a library spec (the repro's top): the
    module from the factory that built it when it can be imported, then ``library_spec(module, name)``."""
    line = None if isinstance(module, nn.Module) else import_line(module, "factory")
    built = (f"{line}\nmodule = factory()" if line is not None else
             f"module = ...  # the {type(module).__qualname__ if isinstance(module, nn.Module) else 'module'} you "
             f"audited: build it here (pass a factory to get this line filled in)")
    return f"{built}\nfrom typed_transformer.audit import library_spec\nspec = library_spec(module, {name!r})"


@dataclass(frozen=True)
class ModuleSpec:
    """How to audit one kind of attention module. Attribute paths are dotted (``"config.num_heads"``; a path
    may step into a dict). A projection is a module with ``weight`` and ``bias`` (``nn.Linear``), given by
    ``q``/``k``/``v`` or by ``qkv`` (one fused projection whose output is ``[q; k; v]``); ``transposed``:
    weights stored ``(in, out)`` (Hugging Face's ``Conv1D``). ``out=None``: no output projection.
    ``num_kv_heads=None``: as many as query heads; ``head_dim=None``: query width / heads; ``scale=None``:
    ``1 / sqrt(head_dim)``. ``grouping``: ``"g r"`` (query head ``i`` uses kv head ``i // r``) or ``"r g"``
    (``i % g``). ``weights`` replaces the attribute lookup for modules it cannot describe. ``decode(module,
    x)`` runs ``x (b, t, e)`` token by token with the module's KV cache; ``fast_path(module, x, real)`` calls
    its inference fast path with a key padding mask (True = real token); ``build(cls, config)`` constructs
    the module for the CLI. ``conventions`` say what the module supports (``self_attention=True``: one
    input).

    Shapes beyond plain self-attention: ``memory=True``: cross-attention with one memory tensor for keys and
    values (``forward`` gets it as both ``key`` and ``value``); ``position_bias``: an additive bias in the
    logits (T5's relative bias, ALiBi: :func:`alibi_bias`), the scale then often ``1.0``; ``window``: sliding
    window of that many keys (a number or attribute path; query position ``p`` sees keys ``j > p - window``,
    in the reference and in token-by-token decoding); ``q_norm``/``k_norm``: modules normalising each head's
    queries/keys before the rotary embedding (the reference recomputes LayerNorm, or RMSNorm when the module has
    no bias, from their weights and ``eps``/``variance_epsilon``; over each head, or over every head at once when
    the weight is ``h * d`` wide, as OLMo-2's; Gemma's ``(1 + weight)`` scaling is read from its source);
    ``qkv_layout``: how a fused projection's outputs are ordered, ``"blocks"`` (``[q; k; v]``), ``"heads"``
    (GPT-NeoX's ``(h [q k v] d)``) or ``"groups"`` (Falcon's ``(g [q_1 .. q_r k v] d)``: each key/value head after
    its ``r`` query heads; ``"heads"`` when ``g = h``, ``"blocks"`` when ``g = 1``)."""

    name: str
    forward: Forward
    conventions: Conventions = DEFAULT_CONVENTIONS
    q: str | None = "q_proj"
    k: str | None = "k_proj"
    v: str | None = "v_proj"
    qkv: str | None = None
    out: str | None = "o_proj"
    transposed: bool = False
    num_heads: str = "num_heads"
    num_kv_heads: str | None = None
    head_dim: str | None = None
    scale: float | str | None = None
    grouping: Literal["g r", "r g"] = "g r"
    rotary: Rotary | None = None
    weights: Callable[[Any], "Weights"] | None = None
    decode: Callable[[Any, Tensor], Tensor] | None = None
    fast_path: Callable[[Any, Tensor, Tensor], Tensor | None] | None = None
    build: Callable[[type, dict[str, Any]], nn.Module] | None = None
    module_type: str = ""
    memory: bool = False
    position_bias: PositionBias | None = None
    #: a gate on the position bias (WavLM's gated relative position bias): ``position_gate(module, x) -> (b, h, t)``
    #: from the query input ``x (b, t, e)`` in float64, each query row's bias of each head multiplied by its factor
    position_gate: Callable[[Any, Tensor], Tensor] | None = None
    window: int | str | None = None
    #: block-local attention (Granite Speech's conformers): the sequence cut into consecutive blocks of that many
    #: tokens (a number or attribute path) from the first, each query seeing only the keys of its own block
    #: (:func:`block_mask`; self-attention)
    blocks: int | str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    #: a norm on each value head (Gemma 3n's and Gemma 4's ``v_norm``, an RMSNorm without a weight), as the q/k norms
    v_norm: str | None = None
    qkv_layout: Literal["blocks", "heads", "groups"] = "blocks"
    #: the q/k norms apply to the turned queries and keys (HunYuan's order), not before the rotary embedding
    norms_after_rotary: bool = False
    #: logit soft-capping (Gemma 2): the cap ``c`` (a number or an attribute path; None there: no cap), the scaled
    #: logits become ``c * tanh(l / c)`` before the bias and the mask
    softcap: float | str | None = None
    #: clipping of the projections (DBRX's and OLMo's ``clip_qkv``): the bound ``c`` (a number or an attribute
    #: path; None there: no clipping), each of q, k and v becomes ``clamp(x W + b, -c, c)`` before any norm or rotary
    clip_qkv: float | str | None = None
    #: attention sinks (gpt-oss): the attribute holding one learned logit per query head
    sinks: str | None = None
    #: an output gate: ``out * sigmoid(gate(x))`` on the attention output before the output projection
    gate: "OutputGate | None" = None
    #: a norm on the attention output ``(b, t, h dv)`` before the gate and the output projection (BitNet's
    #: ``attn_sub_norm``): recomputed as the q/k norms are, over every head when its weight is ``h dv`` wide
    sub_norm: str | None = None
    #: q/k norms the spec computes itself, from the module: ``norms(module) -> {"q": f, "k": f}`` with ``f`` on
    #: ``(b, h or g, t, d)`` heads in canonical order (x-transformers' l2 ``qk_norm``); before the rotary embedding
    norms: Callable[[Any], dict[str, Callable[[Tensor], Tensor]]] | None = None
    #: ALiBi: a per-head linear bias of the key-query distance with the paper's slopes, added to the scaled logits
    #: (beside ``position_bias`` when both are given)
    alibi: ALiBi | None = None
    #: differential attention (DiffLlama): two softmax maps per head subtracted with a learned lambda
    differential: Differential | None = None
    #: multi-head latent attention (DeepSeek V2/V3): where its low-rank projections are; ``weights`` is then
    #: :func:`latent_weights` and the reference projects through the latent itself
    latent: Latent | None = None
    #: decomposed relative positions (SAM's image encoder, MViTv2): a query-dependent bias from two learned tables
    decomposed: DecomposedRelPos | None = None
    #: DeBERTa's disentangled attention: content-to-position and position-to-content terms in the logits
    disentangled: Disentangled | None = None
    #: relative position embeddings the queries meet (Shaw's on the keys, Transformer-XL's): :class:`RelativeKeys`
    relative_keys: RelativeKeys | None = None
    #: M-RoPE with 3-D positions (Qwen2-VL): each frequency section turns by its own axis of
    #: :func:`mrope_positions`; the spec's forward passes the module those positions
    mrope: MRope | None = None
    #: ``unmodelled(module)``: the constructor options this module was built with that the spec does not model,
    #: each named (``"sparse_topk=2"``); a module with any is refused before any check runs
    unmodelled: Callable[[Any], list[str]] | None = None
    #: keys and values over the memory followed by the query input's own tokens (Idefics2's perceiver resampler:
    #: ``concat(context, latents)``, its queries from the latents alone): the ``t`` appended keys are visible to
    #: every query (its model's mask ends in ones for them); with rotary positions the memory's keys are at
    #: ``0..s-1``, the input's tokens (queries and their keys) at ``s..s+t-1``
    keys_with_input: bool = False
    #: the longest sequence the module takes (a number, or an attribute path: torchtune's ``max_seq_len``, the
    #: length of a rotary cache it does not grow): no example is longer, and the report lists the lengths past it
    #: as not tested (None: any length)
    max_length: int | str | None = None
    #: a two-sided local window (LongT5's local attention): query position ``p = i + s - t`` sees the keys ``j`` with
    #: ``|p - j| <= radius``, on top of the masks (a number, or an attribute path; None there: no window)
    radius: int | str | None = None


#: Python lines that rebuild a spec in a fresh interpreter once ``module`` is defined (``hf_spec`` registers
#: ``spec = hf_spec(module)`` for the specs it makes; a spec changed afterwards is another key, not found here)
REBUILDS: "weakref.WeakKeyDictionary[ModuleSpec, str]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Options:
    """Every constructor option of a library's attention class, as its spec treats it (the tests check the list
    against the class's own signature, so an option a new release adds fails them until it is listed here):
    ``modelled`` (the spec reads it from the module), ``refused`` (the spec refuses a module built with it, by name,
    before any check runs) or ``inert`` (no effect on what the audit compares: dropout, off in the audit's eval
    mode; device and dtype; an option read only together with a refused one). An option both modelled and refused
    is modelled for some values and refused for the others (the message names the value)."""

    #: the class (``module.path.Name``) whose constructor (litgpt: whose ``Config`` fields its code reads) is listed
    cls: str
    modelled: tuple[str, ...]
    refused: tuple[str, ...]
    inert: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutputGate:
    """An output gate (Qwen3-Next, AFMoE, Step 3.7, LFM 3, Beam, Laguna): the attention output ``o (b, t, h, dv)``
    times ``sigmoid(x W_g^T + b_g)`` (or ``softplus``), one gate per head or per output feature as the gate
    projection's width says (``h`` or ``h dv`` outputs). ``proj``: the gate's linear layer; ``in_query=True``: the
    gate is the second half of each head's rows of the query projection (Qwen3-Next's ``q_proj`` of ``h * 2d``
    outputs, chunked per head)."""

    proj: str = "gate_proj"
    in_query: bool = False
    #: a bias of one value per head added to the gate's logits (Beam's ``gate_bias``), an attribute path
    bias: str | None = None
    #: the gate's function of its logits: ``sigmoid``, or ``softplus`` (Laguna's)
    activation: Literal["sigmoid", "softplus"] = "sigmoid"


def resolve(module: Any, path: str, spec: str) -> Any:
    """``module.a.b`` for ``path="a.b"`` (steps into dicts too); a path of digits that names no attribute is that
    number (a literal head count); a missing attribute is an :class:`AuditUsageError` that names it."""
    if path.isdigit() and not hasattr(module, path):  # a literal count (a single-head class keeps none)
        return int(path)
    value = module
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec!r}: it has no attribute "
                                  f"{path!r} ({part!r} is missing on {type(value).__name__})")
    return value


def _linear(module: Any, path: str, spec: ModuleSpec) -> tuple[Tensor, Tensor | None]:
    layer = resolve(module, path, spec.name)
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, Tensor):
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: {path!r} is a "
                              f"{type(layer).__name__} without a weight tensor")
    bias = getattr(layer, "bias", None)
    w = weight.detach().double()
    if isinstance(layer, nn.Conv1d) and w.ndim == 3 and w.shape[-1] == 1:
        # a 1x1 convolution over channels (SqueezeBERT's): a linear map, block-diagonal in its groups
        w = torch.block_diag(*w[:, :, 0].chunk(int(layer.groups), dim=0))  # type: ignore[no-untyped-call]
    return (w.T if spec.transposed else w), (None if bias is None else bias.detach().double())


def spec_weights(module: Any, spec: ModuleSpec) -> Weights:
    """Read the module's projections as the spec describes them."""
    if spec.weights is not None:
        return spec.weights(module)
    if spec.latent is not None:
        return latent_weights(module, spec)
    h = int(resolve(module, spec.num_heads, spec.name))
    g = h if spec.num_kv_heads is None else int(resolve(module, spec.num_kv_heads, spec.name))
    if spec.qkv is not None:
        w, b = _linear(module, spec.qkv, spec)
        if spec.head_dim is not None:  # [q (h d); k (g d); v (the rest)]
            d = int(resolve(module, spec.head_dim, spec.name))
            sizes = [h * d, g * d, w.shape[0] - (h + g) * d]
        elif w.shape[0] % 3 == 0:
            sizes = [w.shape[0] // 3] * 3
        else:
            sizes = []
        if len(sizes) != 3 or min(sizes) <= 0:
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: fused {spec.qkv!r} "
                                  f"has {w.shape[0]} outputs, which do not split into q, k and v")
        if spec.qkv_layout == "heads":  # GPT-NeoX: (h [q k v] d), one kv head per query head
            if g != h or sizes[0] != sizes[1] or sizes[1] != sizes[2]:
                raise AuditUsageError(f"spec {spec.name!r}: qkv_layout='heads' needs as many key/value heads as "
                                      f"query heads and equal q, k, v sizes")
            wq, wk, wv = rearrange(w, "(h three d) e -> three (h d) e", h=h, three=3)
            bq, bk, bv = (None, None, None) if b is None else rearrange(b, "(h three d) -> three (h d)", h=h, three=3)
        elif spec.qkv_layout == "groups":  # Falcon: (g [q_1 .. q_r k v] d), each kv group after its query heads
            if h % g or sizes[1] != sizes[2] or sizes[0] // h != sizes[1] // g:
                raise AuditUsageError(f"spec {spec.name!r}: qkv_layout='groups' needs a whole number of query heads "
                                      f"per key/value head and equal q, k, v head sizes")
            wq, wk, wv = _split_groups(w, g, h // g)
            bq, bk, bv = (None, None, None) if b is None else (z[:, 0] for z in _split_groups(b[:, None], g, h // g))
        else:
            wq, wk, wv = torch.split(w, sizes)
            bq, bk, bv = (None, None, None) if b is None else torch.split(b, sizes)
    else:
        for name in ("q", "k", "v"):
            if getattr(spec, name) is None:
                raise AuditUsageError(f"spec {spec.name!r}: give qkv or all of q, k and v")
        (wq, bq), (wk, bk), (wv, bv) = (_linear(module, getattr(spec, n), spec) for n in ("q", "k", "v"))
    wo, bo = (None, None) if spec.out is None else _linear(module, spec.out, spec)
    wg, bg = None, None
    if spec.gate is not None and spec.gate.in_query:  # Qwen3-Next: q_proj rows (h [query gate] d)
        wq, wg = rearrange(wq, "(h two d) e -> two (h d) e", h=h, two=2)
        bq, bg = (None, None) if bq is None else rearrange(bq, "(h two d) -> two (h d)", h=h, two=2)
    else:
        wg, bg = _gate_weights(module, spec, h)
    d = wq.shape[0] // h if spec.head_dim is None else int(resolve(module, spec.head_dim, spec.name))
    if wq.shape[0] != h * d or wk.shape[0] % g or wv.shape[0] % g or wk.shape[0] // g != d:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: projections of "
                              f"{wq.shape[0]}/{wk.shape[0]}/{wv.shape[0]} outputs do not split into {h} query heads "
                              f"and {g} key/value heads of size {d}")
    dv = wv.shape[0] // g
    sinks = None if spec.sinks is None else resolve(module, spec.sinks, spec.name).detach().double().reshape(-1)
    if sinks is not None and sinks.shape[0] != h:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: {spec.sinks!r} holds "
                              f"{sinks.shape[0]} sink logits, expected one per query head ({h})")
    if wg is not None and wg.shape[0] not in (h, h * dv):
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: the output gate has "
                              f"{wg.shape[0]} outputs, expected one per head ({h}) or per feature ({h * dv})")
    if spec.grouping == "r g" and g != h:  # to canonical (g r) order
        wq = rearrange(wq, "(r g d) e -> (g r d) e", g=g, d=d)
        bq = None if bq is None else rearrange(bq, "(r g d) -> (g r d)", g=g, d=d)
        if wo is not None:
            wo = rearrange(wo, "o (r g dv) -> o (g r dv)", g=g, dv=dv)
        sinks = None if sinks is None else rearrange(sinks, "(r g) -> (g r)", g=g)
        if wg is not None:
            wg = rearrange(wg, "(r g n) e -> (g r n) e", g=g, r=h // g)
            bg = None if bg is None else rearrange(bg, "(r g n) -> (g r n)", g=g, r=h // g)
    scale = 1.0 / math.sqrt(d) if spec.scale is None else float(
        spec.scale if isinstance(spec.scale, float | int) else resolve(module, spec.scale, spec.name))
    return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, g, d, dv, scale, wg=wg, bg=bg, sinks=sinks)


def _gate_weights(module: Any, spec: ModuleSpec, h: int) -> tuple[Tensor | None, Tensor | None]:
    """The output gate's projection ``(wg, bg)`` in the module's head order, its per-head bias (Beam's) spread over
    each head's gate outputs; ``(None, None)`` without a gate (or a gate chunked from the query projection)."""
    if spec.gate is None or spec.gate.in_query or resolve(module, spec.gate.proj, spec.name) is None:
        return None, None
    wg, bg = _linear(module, spec.gate.proj, spec)
    if spec.gate.bias is not None:
        per_head = resolve(module, spec.gate.bias, spec.name).detach().double().reshape(-1)
        spread = repeat(per_head, "h -> (h n)", n=wg.shape[0] // h)
        bg = spread if bg is None else bg + spread
    return wg, bg


def _full_rank_query(module: Any, lat: Latent) -> Any:
    """The full-rank query projection of a latent attention module, or None: low-rank (``q_a``/``q_b``), whether the
    class sets ``q_proj = None`` (DeepSeek V3 with ``q_lora_rank``) or has no such attribute (DeepSeek V3.2)."""
    try:
        return resolve(module, lat.q, "latent")
    except AuditUsageError:
        return None


def latent_weights(module: Any, spec: ModuleSpec) -> Weights:
    """A latent attention module's sizes (``h`` heads of ``nope + rope`` query/key features and ``value`` value
    features, one key/value head per query head) and output projection. Its queries, keys and values are not linear
    in ``x`` (RMSNorms inside): the reference computes them with :func:`latent_projections`; ``wq``, ``wk`` and ``wv``
    are the linear maps with those norms left out, kept only for their shapes."""
    assert spec.latent is not None
    lat, name = spec.latent, spec.name
    h = int(resolve(module, spec.num_heads, name))
    nope, rope, dv, rank = (int(resolve(module, path, name)) for path in (lat.nope, lat.rope, lat.value, lat.rank))
    q_full = _full_rank_query(module, lat)
    wq = (_linear(module, lat.q, spec)[0] if q_full is not None
          else _linear(module, lat.q_b, spec)[0] @ _linear(module, lat.q_a, spec)[0])
    wa, wb = _linear(module, lat.kv_a, spec)[0], _linear(module, lat.kv_b, spec)[0]
    kv = rearrange(wb @ wa[:rank], "(h n) e -> h n e", h=h)
    wk = rearrange(torch.cat([kv[:, :nope], wa[rank:][None].expand(h, rope, wa.shape[1])], dim=1), "h d e -> (h d) e")
    wo, bo = (None, None) if spec.out is None else _linear(module, spec.out, spec)
    scale = 1.0 / math.sqrt(nope + rope) if spec.scale is None else float(
        spec.scale if isinstance(spec.scale, float | int) else resolve(module, spec.scale, name))
    # an output gate on a latent module (Ling's BailingHybrid): its projection, as for a linear one
    wg, bg = _gate_weights(module, spec, h)
    return Weights(wq, wk, rearrange(kv[:, nope:], "h n e -> (h n) e"), wo, None, None, None, bo, h, h, nope + rope,
                   dv, scale, wg=wg, bg=bg)


def latent_projections(module: Any, spec: ModuleSpec) -> Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]:
    """``project(x (b, t, e)) -> (q (b, h, t, d), k (b, h, t, d), v (b, h, t, dv))`` of a latent attention module
    (:class:`Latent`), before the rotary embedding, in ``x``'s dtype (the norms in float64, as :func:`_norm`)."""
    assert spec.latent is not None
    lat, name = spec.latent, spec.name
    h = int(resolve(module, spec.num_heads, name))
    nope, rank = int(resolve(module, lat.nope, name)), int(resolve(module, lat.rank, name))
    full = _full_rank_query(module, lat) is not None
    layers = {path: _linear(module, path, spec) for path in ((lat.q,) if full else (lat.q_a, lat.q_b))
              + (lat.kv_a, lat.kv_b)}
    kv_norm, q_norm = _norm(module, lat.kv_norm, spec), None if full else _norm(module, lat.q_norm, spec)

    def lin(z: Tensor, path: str) -> Tensor:
        weight, bias = layers[path]
        y = einsum(z, weight.to(z.dtype), "b t e, o e -> b t o")
        return y if bias is None else y + bias.to(z.dtype)

    def norm(f: Callable[[Tensor], Tensor] | None, z: Tensor) -> Tensor:
        assert f is not None
        return f(z[:, None])[:, 0]  # the norm works on (b, h, t, d): one "head"

    def project(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q = lin(x, lat.q) if full else lin(norm(q_norm, lin(x, lat.q_a)), lat.q_b)
        compressed = lin(x, lat.kv_a)
        kv = rearrange(lin(norm(kv_norm, compressed[..., :rank]), lat.kv_b), "b s (h n) -> b h s n", h=h)
        k_rope = repeat(compressed[..., rank:], "b s r -> b h s r", h=h)
        return (rearrange(q, "b t (h d) -> b h t d", h=h), torch.cat([kv[..., :nope], k_rope], dim=-1),
                kv[..., nope:])

    return project


def _split_groups(w: Tensor, g: int, r: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rows ``(g [q_1 .. q_r k v] d)`` of a fused projection as ``[q (g r d); k (g d); v (g d)]``."""
    parts = rearrange(w, "(g n d) e -> g n d e", g=g, n=r + 2)
    return (rearrange(parts[:, :r], "g r d e -> (g r d) e"), rearrange(parts[:, r], "g d e -> (g d) e"),
            rearrange(parts[:, r + 1], "g d e -> (g d) e"))


def _norm(module: Any, path: str, spec: ModuleSpec) -> Callable[[Tensor], Tensor] | None:
    """The reference of a q/k norm module at ``path``: LayerNorm when it has a bias (or is ``nn.LayerNorm``),
    else RMSNorm, over each head's last axis, with its weight and ``eps``/``variance_epsilon``; float64 math.
    None when the attribute is None, or missing with a path ending in ``?`` (Phi without ``qk_layernorm``)."""
    optional = path.endswith("?")
    path = path.removesuffix("?")
    try:
        layer = resolve(module, path, spec.name)
    except AuditUsageError:
        if optional:
            return None
        raise
    if layer is None:
        return None
    weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    if weight is None and isinstance(getattr(layer, "scale", None), Tensor):  # torchtune's RMSNorm calls it scale
        weight = layer.scale
    eps = getattr(layer, "eps", getattr(layer, "variance_epsilon", None))
    if eps is None:
        raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: the norm {path!r} "
                              f"({type(layer).__name__}) has no eps or variance_epsilon")
    layer_norm = isinstance(layer, nn.LayerNorm) or isinstance(bias, Tensor)
    w = None if weight is None else weight.detach().double()
    b = None if bias is None else bias.detach().double()
    try:  # Gemma's RMSNorm scales by (1 + weight), its weight initialised at zero
        if w is not None and "1.0 + self.weight" in inspect.getsource(type(layer).forward):
            w = 1.0 + w
    except (OSError, TypeError):
        pass

    def norm(x: Tensor) -> Tensor:
        y = x.double()
        whole = w is not None and w.ndim == 1 and w.shape[-1] != y.shape[-1]  # OLMo-2: over every head, (h d)
        if whole:
            y = rearrange(y, "b h t d -> b t (h d)")
        if layer_norm:
            y = y - y.mean(dim=-1, keepdim=True)
        y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + float(eps))
        if w is not None:  # a (h, d) weight: one per head (Chameleon)
            y = y * (w[:, None] if w.ndim == 2 else w)
        if b is not None:
            y = y + (b[:, None] if b.ndim == 2 else b)
        if whole:
            y = rearrange(y, "b t (h d) -> b h t d", h=x.shape[1])
        return y.to(x.dtype)

    return norm


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


def t5_buckets(distance: Int[Tensor, "*shape"], buckets: int, max_distance: int) -> Int[Tensor, "*shape"]:
    """T5's bidirectional relative-position buckets (Raffel et al., 2020; WavLM's too) of ``distance = j - i``: half
    the ``buckets`` per sign (``n = buckets // 2``, positive distances from ``n``), exact below ``m = n // 2``, beyond
    it ``min(m + floor(log(|x| / m) / log(max_distance / m) * (n - m)), n - 1)``."""
    n = buckets // 2
    half = n // 2
    size = distance.abs()
    far = half + torch.floor(torch.log(size.double().clamp(min=1) / half) / math.log(max_distance / half) * (n - half))
    return (distance > 0).long() * n + torch.where(size < half, size, far.long().clamp(max=n - 1))


block_mask = typechecked(block_mask)
t5_buckets = typechecked(t5_buckets)


def with_causal(keep: KeepMask | None, is_causal: bool, t: int, s: int) -> KeepMask | None:
    """``keep`` ANDed with our bottom-right causal mask (for modules whose causality is a mask argument):
    :func:`~typed_transformer.merge_causal`, always 4-D ``(#b, #h, t, s)``."""
    if not is_causal:
        return keep
    return merge_causal(torch.ones(1, 1, t, s, dtype=torch.bool) if keep is None else keep, t, s)


with_causal = typechecked(with_causal)


def _relative_keys(module: Any, spec: ModuleSpec, rk: RelativeKeys, h: int) -> tuple[Tensor, Tensor | None]:
    """The relative embeddings ``(n, h, d)`` in float64 (projected, or one table shared by the heads) and the bias the
    queries meet them with."""
    table = rk.table(module).detach().double()
    if rk.proj is not None:
        weight, bias = _linear(module, rk.proj, spec)
        table = einsum(table, weight, "n e, o e -> n o") + (0.0 if bias is None else bias)
        table = rearrange(table, "n (h d) -> n h d", h=h)
    else:
        table = repeat(table, "n d -> n h d", h=h)
    extra = None if rk.query_bias is None else resolve(module, rk.query_bias, spec.name).detach().double()
    if rk.content_bias is not None:  # the queries carry u (folded into their bias): the positional term takes v - u
        u = resolve(module, rk.content_bias, spec.name).detach().double()
        extra = -u if extra is None else extra - u
    return table, extra


def _disentangled(module: Any, spec: ModuleSpec, dz: Disentangled, h: int
                  ) -> tuple[Tensor | None, Tensor | None, Literal["v1", "v2"], int, int]:
    """DeBERTa's position keys and queries ``(h, n, d)`` (each None where its term is off), in float64, from the
    spec's relative-embedding table; with the rows' form, buckets and largest position."""
    terms = [str(term) for term in (resolve(module, dz.terms, spec.name) or [])]
    share = bool(resolve(module, dz.share_key, spec.name)) if dz.form == "v2" else False
    table = dz.table(module).detach().double()

    def embed(path: str) -> Tensor:
        weight, bias = _linear(module, path, spec)
        out = einsum(table, weight, "n e, o e -> n o") + (0.0 if bias is None else bias)
        return rearrange(out, "n (h d) -> h n d", h=h)

    kr = embed(spec.k if share and spec.k else dz.key_proj) if "c2p" in terms else None
    qr = embed(spec.q if share and spec.q else dz.query_proj) if "p2c" in terms else None
    buckets = dz.buckets if isinstance(dz.buckets, int) else int(resolve(module, dz.buckets, spec.name))
    return kr, qr, dz.form, buckets, int(resolve(module, dz.max_position, spec.name))


@shape_checked
class ModuleAdapter:
    """The :class:`~typed_transformer.audit._core.Adapter` of a module: the checks call a deep copy of it (one
    per dtype, in eval mode); the reference uses its weights in float64."""

    kind: Literal["function", "module"] = "module"
    __shape_checked__ = ("call", "bias", "gated", "with_content", "visible", "reference", "logit_bound", "logits",
                         "rows", "decode", "fast_path")

    def __init__(self, module: nn.Module, spec: ModuleSpec, *, conventions: Conventions | None = None,
                 name: str | None = None) -> None:
        if spec.module_type and not any(spec.module_type == f"{c.__module__}.{c.__qualname__}"
                                        for c in type(module).__mro__):
            raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__} does not match spec "
                                  f"{spec.name!r}: expected a {spec.module_type} (a class of the same shape: reuse "
                                  f"the spec as dataclasses.replace(SPECS[{spec.name!r}], module_type=''))")
        unmodelled = [] if spec.unmodelled is None else spec.unmodelled(module)
        if unmodelled:
            raise AuditUsageError(f"spec {spec.name!r} does not model {type(module).__qualname__}'s option"
                                  f"{'s' if len(unmodelled) > 1 else ''} {', '.join(unmodelled)}: the audit would "
                                  f"compare it with attention it does not compute (write a spec that models it)")
        self.spec = spec
        self.original = copy.deepcopy(module).eval()
        self.weights = spec_weights(self.original, spec)
        if spec.relative_keys is not None and spec.relative_keys.content_bias is not None:
            # Transformer-XL's content logits use q + u: u joins the query bias (the positional term subtracts it)
            u = resolve(self.original, spec.relative_keys.content_bias, spec.name).detach().double().reshape(-1)
            self.weights = dataclasses.replace(self.weights, bq=u if self.weights.bq is None else self.weights.bq + u)
        w = self.weights
        self.conventions = dataclasses.replace(conventions or spec.conventions, scale=w.scale,
                                               supports_gqa=w.g != w.h, enable_gqa=False)
        self.name = name or f"{type(module).__module__}.{type(module).__qualname__} (spec {spec.name})"
        #: the longest sequence the module takes (the spec's ``max_length``), None: any
        self.longest: int | None = None
        if spec.max_length is not None:
            longest = spec.max_length if isinstance(spec.max_length, int) \
                else resolve(self.original, spec.max_length, spec.name)
            self.longest = None if longest is None else int(longest)
        tied = self.conventions.self_attention
        self.fixed: dict[str, int] | None = {
            "h": w.h, "g": w.g, "d": w.d, "dv": w.dv, "eq": w.wq.shape[1], "ek": w.wk.shape[1],
            "ev": w.wv.shape[1], "tied": int(tied), "fast_path": int(spec.fast_path is not None)}
        self.rotary: tuple[float, Literal["half", "interleaved"]] | None = None
        self.rotary_dims = w.d
        #: variants the diagnosis of a failure tries (:mod:`._causes`): the last dimensions rotated instead of the
        #: first, the rotary tables and the softmax computed in another dtype
        self.rotary_last = False
        self.rotary_tables = torch.float64
        #: the inverse frequencies and cos/sin factor of a rope type other than the default (None: ``base``'s)
        self.rotary_frequencies: tuple[Tensor, float] | None = None
        self.softmax_dtype: torch.dtype | None = None
        #: the tokens before the rotated ones (the rotary's ``prefix``)
        self.rotary_prefix = 0
        if spec.rotary is not None and (spec.rotary.when is None
                                        or resolve(self.original, spec.rotary.when, spec.name) is not None):
            prefix = spec.rotary.prefix
            self.rotary_prefix = int(prefix if isinstance(prefix, int) else resolve(self.original, prefix, spec.name))
            base = spec.rotary.base
            base = float(base if isinstance(base, float | int) else resolve(self.original, base, spec.name))
            self.rotary = (base, spec.rotary.style)
            fraction = spec.rotary.fraction
            fraction = float(fraction if isinstance(fraction, float | int)
                             else resolve(self.original, fraction, spec.name))
            self.rotary_dims = int(w.d * fraction)
            if spec.rotary.frequencies is not None:
                inverse, magnitude = spec.rotary.frequencies(self.original)
                self.rotary_frequencies = (inverse.detach().double(), float(magnitude))
        #: a latent attention module's projections (None: linear ones, from :attr:`weights`)
        self.latent = None if spec.latent is None else latent_projections(self.original, spec)
        if spec.latent is not None and self.rotary is not None:  # the last ``rope`` features of each head turn
            self.rotary_dims, self.rotary_last = int(resolve(self.original, spec.latent.rope, spec.name)), True
        #: M-RoPE: the axis (0, 1, 2) of the 3-D position each rotated frequency turns by (None: 1-D positions)
        self.mrope_axes: Tensor | None = None
        #: blocked axial rotary: the axis of each block of rotated features (None: not blocked)
        self.mrope_blocks: tuple[int, ...] | None = None
        if spec.mrope is not None and self.rotary is not None and spec.mrope.blocks:
            if spec.mrope.axes is None or self.rotary_dims % (2 * len(spec.mrope.axes)):
                raise AuditUsageError(f"spec {spec.name!r}: blocked M-RoPE needs axes that split the "
                                      f"{self.rotary_dims} rotated features into blocks of whole pairs")
            self.mrope_blocks = spec.mrope.axes
        elif spec.mrope is not None and self.rotary is not None:
            sections, axes = spec.mrope.sections, spec.mrope.axes
            sizes = [int(n) for n in (sections if isinstance(sections, tuple) else sections(self.original)
                                      if callable(sections) else resolve(self.original, sections, spec.name))]
            if sum(sizes) != self.rotary_dims // 2:
                raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: M-RoPE sections "
                                      f"{sizes} do not sum to the {self.rotary_dims // 2} rotated frequencies")
            self.mrope_axes = torch.cat([torch.full((n,), i % 3 if axes is None else axes[i])
                                         for i, n in enumerate(sizes)])
        window = spec.window
        if isinstance(window, str):
            window = resolve(self.original, window, spec.name)  # None: this module has no window
        self.window: int | None = None if window is None else int(window)
        blocks = spec.blocks
        if isinstance(blocks, str):
            blocks = resolve(self.original, blocks, spec.name)
        #: the block size of block-local attention (None: none)
        self.blocks: int | None = None if blocks is None else int(blocks)
        if self.blocks is not None and not self.conventions.self_attention:
            raise AuditUsageError(f"spec {spec.name!r}: block-local attention cuts the queries and the keys into the "
                                  f"same blocks, so it needs self-attention")
        radius = spec.radius
        if isinstance(radius, str):
            radius = resolve(self.original, radius, spec.name)  # None: this module has no local window
        #: the two-sided local window's radius (None: none)
        self.radius: int | None = None if radius is None else int(radius)
        if self.radius is not None and self.radius < 0:
            raise AuditUsageError(f"spec {spec.name!r}: a local window's radius is at least 0, got {self.radius}")
        self.norms: dict[str, Callable[[Tensor], Tensor]] = {}
        for which, path in (("q", spec.q_norm), ("k", spec.k_norm), ("v", spec.v_norm)):
            norm = None if path is None else _norm(self.original, path, spec)
            if norm is not None:
                self.norms[which] = norm
        if spec.norms is not None:
            self.norms.update(spec.norms(self.original))
        cap = spec.softcap if spec.softcap is None or isinstance(spec.softcap, float | int) else resolve(
            self.original, spec.softcap, spec.name)
        #: the logit cap (None: no soft-capping; a config's 0 or None switches it off)
        self.softcap: float | None = float(cap) if cap else None
        clip = spec.clip_qkv if spec.clip_qkv is None or isinstance(spec.clip_qkv, float | int) else resolve(
            self.original, spec.clip_qkv, spec.name)
        #: the bound of the projections' clipping (None: no clipping; a config's None switches it off)
        self.clip_qkv: float | None = None if clip is None else float(clip)
        self.sub_norm = None if spec.sub_norm is None else _norm(self.original, spec.sub_norm, spec)
        factor = None if spec.alibi is None else spec.alibi.factor
        #: ALiBi's slopes ``(h,)`` in canonical head order (None: no ALiBi)
        self.alibi_slopes: Tensor | None = None
        if spec.alibi is not None and factor is not None:
            slopes = alibi_slopes(w.h) * float(factor if isinstance(factor, float | int)
                                               else resolve(self.original, factor, spec.name))
            self.alibi_slopes = (rearrange(slopes, "(r g) -> (g r)", g=w.g) if spec.grouping == "r g" and w.g != w.h
                                 else slopes)
        #: differential attention's ``(lambda, lambda_init)`` (None: plain attention)
        self.differential = None if spec.differential is None else _lambdas(self.original, spec)
        if self.differential is not None and (w.h % 2 or w.g % 2):
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec.name!r}: differential "
                                  f"attention pairs heads, and {w.h} query heads on {w.g} key/value heads do not pair")
        #: decomposed relative positions' tables ``(rel_h, rel_w)`` in float64 (None: none)
        self.decomposed: tuple[Tensor, Tensor] | None = None
        if spec.decomposed is not None:
            if not self.conventions.self_attention:
                raise AuditUsageError(f"spec {spec.name!r}: decomposed relative positions lay the keys on the "
                                      f"queries' grid, so they need self-attention")
            self.decomposed = (resolve(self.original, spec.decomposed.h, spec.name).detach().double(),
                               resolve(self.original, spec.decomposed.w, spec.name).detach().double())
        #: DeBERTa's disentangled attention: ``(Kr or None, Qr or None)`` per head ``(h, n, d)`` in float64, the rows'
        #: form, buckets and largest position (None: none)
        self.disentangled: tuple[Tensor | None, Tensor | None, Literal["v1", "v2"], int, int] | None = None
        if spec.disentangled is not None:
            self.disentangled = _disentangled(self.original, spec, spec.disentangled, w.h)
        #: relative position embeddings the queries meet: ``(R (n, h, d), c (h, d) or None)`` in float64
        self.relative_keys: tuple[Tensor, Tensor | None] | None = None
        if spec.relative_keys is not None:
            self.relative_keys = _relative_keys(self.original, spec, spec.relative_keys, w.h)
        #: Shaw's relative values ``V (n, dv)`` in float64 (None: none)
        self.relative_values: Tensor | None = None
        if spec.relative_keys is not None and spec.relative_keys.values is not None:
            self.relative_values = spec.relative_keys.values(self.original).detach().double()
            if self.relative_values.ndim != 2 or self.relative_values.shape[1] != w.dv:
                raise AuditUsageError(f"spec {spec.name!r}: relative_keys.values gave shape "
                                      f"{tuple(self.relative_values.shape)}, expected (n, {w.dv})")
        positional = [what for what, present in (("rotary positions", self.rotary is not None),
                                                  ("a position bias", spec.position_bias is not None
                                                   or spec.alibi is not None or spec.decomposed is not None
                                                   or spec.disentangled is not None
                                                   or spec.relative_keys is not None),
                                                  ("a sliding window", self.window is not None),
                                                  ("blocks of keys", self.blocks is not None),
                                                  ("a local window", self.radius is not None)) if present]
        self.positional: str | None = ", ".join(positional) or None
        self._copies: dict[torch.dtype, nn.Module] = {}
        self._setup: str | None = None
        self._given = module

    @property
    def setup(self) -> str:
        """Lines defining ``module`` and ``spec`` for :meth:`repro` (made when first asked for)."""
        if self._setup is None:
            self._setup = module_setup(self._given, self.spec)
        return self._setup

    @setup.setter
    def setup(self, lines: str) -> None:
        self._setup = lines

    def module(self, dtype: torch.dtype) -> nn.Module:
        """The module copy in ``dtype`` (made once)."""
        if dtype not in self._copies:
            self._copies[dtype] = copy.deepcopy(self.original).to(dtype).eval()
        return self._copies[dtype]

    def call(self, ins: ModuleInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
             ) -> CandidateOutput:
        x, key, value = (z.to(dtype) for z in self._memory(ins))
        module = self.module(dtype)
        with candidate_code(x=x, key=key, value=value, mask=keep):
            if self.conventions.self_attention:
                return self.spec.forward(module, x, None, None, keep, is_causal)
            return self.spec.forward(module, x, key, value, keep, is_causal)

    def _project(self, ins: Inputs, dtype: torch.dtype, offset: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        w = self.weights
        x, key, value = (z.to(dtype) for z in self._memory(ins))
        memory = key.shape[1]
        if self.spec.keys_with_input:  # keys and values over concat(memory, x)
            key, value = torch.cat([key, x], dim=1), torch.cat([value, x], dim=1)

        def lin(z: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            y = einsum(z, weight.to(dtype), "b t e, o e -> b t o")
            y = y if bias is None else y + bias.to(dtype)
            return y if self.clip_qkv is None else y.clamp(-self.clip_qkv, self.clip_qkv)

        if self.latent is not None:  # self-attention through a compressed latent: x gives q, k and v
            q, k, v = self.latent(x)
        else:
            q = rearrange(lin(x, w.wq, w.bq), "b t (h d) -> b h t d", h=w.h)
            k = rearrange(lin(key, w.wk, w.bk), "b s (g d) -> b g s d", g=w.g)
            v = rearrange(lin(value, w.wv, w.bv), "b s (g d) -> b g s d", g=w.g)
        if "v" in self.norms:
            v = self.norms["v"](v)
        after = self.spec.norms_after_rotary
        if "q" in self.norms and not after:
            q = self.norms["q"](q)
        if "k" in self.norms and not after:
            k = self.norms["k"](k)
        if self.rotary is not None:
            q, k = self._rotate(q, offset + (memory if self.spec.keys_with_input else 0)), self._rotate(k, offset)
        if "q" in self.norms and after:
            q = self.norms["q"](q)
        if "k" in self.norms and after:
            k = self.norms["k"](k)
        if w.extra_k is not None and w.extra_v is not None:  # appended key/value positions (add_bias_kv, ...)
            n = w.extra_k.shape[0]
            extra_k = rearrange(w.extra_k.to(dtype), "n (g d) -> 1 g n d", g=w.g).expand(k.shape[0], w.g, n, w.d)
            extra_v = rearrange(w.extra_v.to(dtype), "n (g d) -> 1 g n d", g=w.g).expand(v.shape[0], w.g, n, w.dv)
            k, v = torch.cat([k, extra_k], dim=2), torch.cat([v, extra_v], dim=2)
        return q, k, v

    def _rotate(self, x: Tensor, offset: int) -> Tensor:
        """The rotary embedding of the first :attr:`rotary_dims` of each head (the last ones with
        :attr:`rotary_last`: a variant the rope diagnosis tries), tables in :attr:`rotary_tables`."""
        assert self.rotary is not None
        if self.rotary_prefix:  # the prefix tokens pass unturned; the rest count their positions from 0
            n = self.rotary_prefix
            if x.shape[2] <= n:
                return x
            return torch.cat([x[:, :, :n], self._turn(x[:, :, n:], offset)], dim=2)
        return self._turn(x, offset)

    def _turn(self, x: Tensor, offset: int) -> Tensor:
        """:meth:`_rotate` on tokens that all turn."""
        assert self.rotary is not None
        d = x.shape[-1]
        low, high = (d - self.rotary_dims, d) if self.rotary_last else (0, self.rotary_dims)
        inverse, magnitude = self.rotary_frequencies or (None, 1.0)
        positions = None
        if self.mrope_blocks is not None:  # each block of features turns on its own, by its axis
            grid = mrope_positions(offset, x.shape[2]).double()
            width = (high - low) // len(self.mrope_blocks)
            blocks = [rotate(x[..., low + i * width:low + (i + 1) * width], *self.rotary, offset=offset,
                             tables=self.rotary_tables, frequencies=inverse, magnitude=magnitude,
                             positions=grid[axis][:, None].expand(-1, width // 2))
                      for i, axis in enumerate(self.mrope_blocks)]
            return torch.cat([x[..., :low], *blocks, x[..., high:]], dim=-1)
        if self.mrope_axes is not None:  # each frequency turns by its section's axis of the 3-D positions
            grid = mrope_positions(offset, x.shape[2]).double()
            positions = grid[self.mrope_axes].T  # (t, frequencies)
        rotated = rotate(x[..., low:high], *self.rotary, offset=offset, tables=self.rotary_tables,
                         frequencies=inverse, magnitude=magnitude, positions=positions)
        return torch.cat([x[..., :low], rotated, x[..., high:]], dim=-1)

    def _memory(self, ins: Inputs) -> Inputs:
        """A cross-attention module with one memory tensor: the key input is also the value input."""
        return (ins[0], ins[1], ins[1]) if self.spec.memory else ins

    def bias(self, t: int, s: int, dtype: torch.dtype) -> Float[Tensor, "1 h_or_1 {t} {s}"] | None:
        """The additive position bias ``(1, 1 or h, t, s)`` the spec declares (its ``position_bias`` plus its ALiBi),
        or None."""
        alibi = None
        if self.spec.alibi is not None and self.alibi_slopes is not None:
            alibi = alibi_bias(self.weights.h, t, s, form=self.spec.alibi.form, slopes=self.alibi_slopes)
        if self.spec.position_bias is None:
            return None if alibi is None else alibi.to(dtype)[None]
        bias = self.spec.position_bias(self.original, t, s).detach().to(dtype)
        if bias.ndim != 3 or bias.shape[0] not in (1, self.weights.h) or tuple(bias.shape[1:]) != (t, s):
            raise AuditUsageError(f"spec {self.spec.name!r}: position_bias(module, {t}, {s}) gave shape "
                                  f"{tuple(bias.shape)}, expected (1 or {self.weights.h}, {t}, {s})")
        return (bias if alibi is None else bias + alibi.to(dtype))[None]

    def gated(self, bias: Float[Tensor, "1 #h t s"] | None, x: Float[Tensor, "b t e"]
              ) -> Float[Tensor, "#b #h t s"] | None:
        """``bias`` times the spec's position gate ``(b, h, t)`` of the query input ``x`` (none: ``bias``)."""
        if bias is None or self.spec.position_gate is None:
            return bias
        gate = self.spec.position_gate(self.original, x.double()).to(bias.dtype)
        if gate.shape != (x.shape[0], self.weights.h, x.shape[1]):
            raise AuditUsageError(f"spec {self.spec.name!r}: position_gate gave shape {tuple(gate.shape)}, expected "
                                  f"({x.shape[0]}, {self.weights.h}, {x.shape[1]})")
        return bias * gate[..., None]

    def with_content(self, bias: Float[Tensor, "#b #h t s"] | None, q: Float[Tensor, "b h t d"],
                     k: Float[Tensor, "b g s d"]) -> Float[Tensor, "#b #h t s"] | None:
        """``bias`` plus the terms that depend on the queries ``q`` and keys ``k``: decomposed relative positions,
        DeBERTa's disentangled terms (when the spec has them)."""
        t, s = q.shape[2], k.shape[2]
        if self.decomposed is not None and self.spec.decomposed is not None:
            grid = self.spec.decomposed.grid(t)
            if grid[0] * grid[1] != t:
                raise AuditUsageError(f"spec {self.spec.name!r}: decomposed.grid({t}) gave {grid}, not a grid of {t} "
                                      f"tokens")
            rel_h, rel_w = self.decomposed
            rel = decomposed_bias(q, rel_h.to(q.dtype), rel_w.to(q.dtype), grid)
            bias = rel if bias is None else bias + rel
        if self.disentangled is not None:
            kr, qr, form, buckets, largest = self.disentangled
            rows = disentangled_rows(t, s, form, buckets, largest)
            terms = q.new_zeros(q.shape[0], q.shape[1], t, s)
            if kr is not None:  # content to position: the query against the key embedding of the distance
                terms = terms + einsum(q, kr.to(q.dtype)[:, rows], "b h t d, h t s d -> b h t s")
            if qr is not None:  # position to content: the key against the query embedding of the distance
                terms = terms + einsum(k, qr.to(q.dtype)[:, rows], "b h s d, h t s d -> b h t s")
            terms = terms * self.weights.scale
            bias = terms if bias is None else bias + terms
        if self.relative_keys is not None and self.spec.relative_keys is not None:
            table, extra = self.relative_keys
            rows = self.spec.relative_keys.rows(t, s)
            met = q if extra is None else q + rearrange(extra.to(q.dtype), "h d -> 1 h 1 d")
            terms = einsum(met, table.to(q.dtype)[rows], "b h t d, t s h d -> b h t s") * self.weights.scale
            bias = terms if bias is None else bias + terms
        return bias

    def visible(self, keep: KeepMask | None, is_causal: bool, t: int, s: int
                ) -> tuple[Bool[Tensor, "#b #h #t _"] | None, bool]:
        """``(keep, is_causal)`` with the sliding window and the module's extra key positions applied (the
        returned mask covers the ``s`` keys and the appended ones)."""
        w = self.weights
        if (self.window is None and self.blocks is None and self.radius is None and w.extra_k is None
                and not self.spec.keys_with_input):
            return keep, is_causal
        keep = effective_keep(keep, is_causal, t, s, self.conventions)
        if self.window is not None:
            inside = window_mask(t, s, self.window)[None, None]
            keep = inside if keep is None else keep & inside
        if self.blocks is not None:
            inside = block_mask(t, s, self.blocks)[None, None]
            keep = inside if keep is None else keep & inside
        if self.radius is not None:
            near = local_mask(t, s, self.radius)[None, None]
            keep = near if keep is None else keep & near
        if self.spec.keys_with_input:  # the input's own t keys, after the memory's: always visible
            keep = torch.ones(1, 1, t, s, dtype=torch.bool) if keep is None else keep
            keep = torch.cat([keep, keep.new_ones(*keep.shape[:-1], t)], dim=-1)
        if w.extra_k is not None and keep is not None:
            keep = torch.cat([keep, keep.new_ones(*keep.shape[:-1], w.extra_k.shape[0])], dim=-1)
        return keep, False

    def reference(self, ins: ModuleInputs, keep: KeepMask | None, is_causal: bool, dtype: torch.dtype
                  ) -> Float[Tensor, "b t e"]:
        q, k, v = self._project(ins, dtype)
        t, s = q.shape[2], ins[1].shape[1]
        keep, is_causal = self.visible(keep, is_causal, t, s)
        bias = self.with_content(self.gated(self.bias(t, s, dtype), ins[0]), q, k[:, :, :s])
        if bias is not None and self.weights.extra_k is not None:
            bias = torch.cat([bias, bias.new_zeros(*bias.shape[:-1], self.weights.extra_k.shape[0])], dim=-1)
        if bias is not None and self.spec.keys_with_input:
            raise AuditUsageError(f"spec {self.spec.name!r}: a position bias over keys_with_input's appended keys "
                                  f"is not modelled")
        w = self.weights
        if self.differential is not None:  # key/value head j carries the value of its differential head
            half = torch.arange(w.g) % (w.g // 2)
            v = torch.cat([v[:, half], v[:, half + w.g // 2]], dim=-1)
        dv = v.shape[-1]
        if self.relative_values is not None:  # the weights p too, as the attention of one-hot values
            v = torch.cat([v, torch.eye(v.shape[2], dtype=v.dtype).expand(*v.shape[:2], -1, -1)], dim=-1)
        # softmax_dtype: a variant the diagnosis tries, the softmax in a lower precision as many libraries compute it
        out = reference_attention(q, k, v, keep, is_causal=is_causal, conventions=self.conventions, bias=bias,
                                  softcap=self.softcap, sinks=None if w.sinks is None else w.sinks.to(dtype),
                                  softmax_dtype=self.softmax_dtype)
        if self.relative_values is not None and self.spec.relative_keys is not None:  # o_i += sum_j p_ij V[row(i, j)]
            table = self.relative_values.to(dtype)[self.spec.relative_keys.rows(t, s)]
            out = out[..., :dv] + einsum(out[..., dv:dv + s], table, "b h t s, t s d -> b h t d")
        if self.differential is not None:
            lam, _ = self.differential
            out = out[:, :w.h // 2] - lam * out[:, w.h // 2:]
        if self.sub_norm is not None:
            out = self.sub_norm(out)
        if self.differential is not None:
            out = (1 - self.differential[1]) * out
        out = rearrange(out, "b h t dv -> b t (h dv)")
        if w.wg is not None:
            x = ins[0].to(dtype)
            logits = einsum(x, w.wg.to(dtype), "b t e, n e -> b t n") + (0.0 if w.bg is None else w.bg.to(dtype))
            softplus = self.spec.gate is not None and self.spec.gate.activation == "softplus"
            gate = torch.nn.functional.softplus(logits) if softplus else torch.sigmoid(logits)
            out = out * (gate.repeat_interleave(w.dv, dim=-1) if gate.shape[-1] == w.h else gate)
        if w.wo is None:
            return out
        out = einsum(out, w.wo.to(dtype), "b t i, o i -> b t o")
        return out if w.bo is None else out + w.bo.to(dtype)

    def logit_bound(self, ins: ModuleInputs) -> float:
        q, k, _ = self._project(ins, torch.float64)
        grouped = rearrange(q.abs(), "b (g r) t d -> b g r t d", g=k.shape[1])
        bound = float(einsum(grouped, k.abs(), "b g r t d, b g s d -> b g r t s").max()) * abs(self.weights.scale)
        rel = self.with_content(None, q, k)
        return bound if rel is None else bound + float(rel.abs().max())

    def logits(self, ins: ModuleInputs) -> Float64[Tensor, "b h t s"]:
        """The float64 logits ``(b, h, t, s)`` of the reference."""
        q, k, _ = self._project(ins, torch.float64)
        grouped = rearrange(q, "b (g r) t d -> b g r t d", g=k.shape[1])
        logits = einsum(grouped, k, "b g r t d, b g s d -> b g r t s") * self.weights.scale
        logits = rearrange(logits, "b g r t s -> b (g r) t s")[..., :ins[1].shape[1]]  # not the extra positions
        s = ins[1].shape[1]
        bias = self.with_content(self.gated(self.bias(q.shape[2], s, torch.float64), ins[0]), q, k[:, :, :s])
        return logits if bias is None else logits + bias

    def rows(self, keep: KeepMask, example: Example) -> Bool[Tensor, "b t 1"]:
        """The query rows with an allowed key: in the sliding window (a row whose window holds only masked keys has
        none), or among the module's extra key positions (always allowed)."""
        if self.weights.extra_k is not None or self.spec.keys_with_input:
            return torch.ones(example.b, example.t, 1, dtype=torch.bool)
        if self.window is not None:
            keep = keep & window_mask(example.t, example.s, self.window)
        if self.blocks is not None:
            keep = keep & block_mask(example.t, example.s, self.blocks)
        if self.radius is not None:
            keep = keep & local_mask(example.t, example.s, self.radius)
        return rearrange(keep.any(dim=-1).all(dim=1).expand(example.b, example.t), "b t -> b t 1")

    def decode(self, ins: ModuleInputs, dtype: torch.dtype) -> CandidateOutput | None:
        if self.spec.decode is None:
            return None
        module = copy.deepcopy(self.module(dtype))
        x = ins[0].to(dtype)
        with candidate_code(x=x):
            return self.spec.decode(module, x)

    def fast_path(self, x: Float[Tensor, "b t e"], padding: Bool[Tensor, "b t"], dtype: torch.dtype
                  ) -> CandidateOutput | None:
        if self.spec.fast_path is None:
            return None
        module = copy.deepcopy(self.module(dtype))
        x = x.to(dtype)
        with candidate_code(x=x, padding=padding):
            return self.spec.fast_path(module, x, padding)

    def repro(self, example: Example, check: str) -> str:
        """A snippet that runs as printed in a fresh interpreter: :attr:`setup` defines ``module`` and
        ``spec`` (the CLI rebuilds its module with the same seeded weights), then the failing call and the
        reference."""
        fields = ", ".join(f"{key}={value!r}" for key, value in dataclasses.asdict(example).items()
                           if key != "ramp" or value)  # ramp: only where the keys grow (a deep length)
        return (f"import torch\n"
                f"from typed_transformer.audit import Conventions, Example, ModuleAdapter\n"
                f"{self.setup}\n"
                f"example = Example({fields})\n"
                f"adapter = ModuleAdapter(module, spec, conventions={self.conventions!r})\n"
                + repro_comparison(check))


def _lambdas(module: Any, spec: ModuleSpec) -> tuple[float, float]:
    """Differential attention's ``(lambda, lambda_init)``, read from the module in float64."""
    assert spec.differential is not None
    diff = spec.differential

    def dot(q: str, k: str) -> Tensor:
        vectors: list[Tensor] = [resolve(module, path, spec.name).detach().double() for path in (q, k)]
        return (vectors[0] * vectors[1]).sum()

    init = diff.lambda_init
    init = float(init if isinstance(init, float | int) else resolve(module, init, spec.name))
    lam = torch.exp(dot(diff.lambda_q1, diff.lambda_k1)) - torch.exp(dot(diff.lambda_q2, diff.lambda_k2)) + init
    return float(lam), init


def module_setup(module: Any, spec: ModuleSpec) -> str:
    """Lines that define ``module`` and ``spec`` in a fresh interpreter. The module: by the factory that built it
    when the factory can be imported, else rebuilt from its class and constructor arguments where the library
    keeps them (a Hugging Face class from its config; ``nn.MultiheadAttention`` from its attributes) with its
    weights (:func:`weights_lines`). The spec: a shipped one by name, one that says how to rebuild itself
    (``hf_spec``) that way, a user's by the module-level name it has (where its forward is defined first). What
    cannot be rebuilt is left for the reader, with a comment that says so."""
    if SHIPPED_SPECS.get(spec.name) is spec:
        spec_line = f"from typed_transformer.audit import SPECS\nspec = SPECS[{spec.name!r}]"
    elif _rebuild(spec) is not None:
        spec_line = str(_rebuild(spec))
    else:
        search = tuple(dict.fromkeys(getattr(f, "__module__", "") for f in (spec.forward, spec.weights, spec.build)
                                     if f is not None))
        spec_line = import_line(spec, "spec", search=search) or (
            f"spec = ...  # the ModuleSpec {spec.name!r} you passed: define or import it here (it has no importable "
            f"name)")
    if not isinstance(module, nn.Module):  # a factory
        line = import_line(module, "factory")
        if line is not None:
            return f"{line}\nmodule = factory()\n{spec_line}"
        return f"module = ...  # a module: build it here (the factory you passed cannot be imported)\n{spec_line}"
    built = _constructor_lines(module)
    if built is None:
        return (f"module = ...  # the {type(module).__qualname__} you audited: build it here (its constructor "
                f"arguments are not kept by its class; pass an importable factory to get this line filled in)\n"
                f"{spec_line}")
    return f"{built}\n{weights_lines(module)}\n{spec_line}"


def _rebuild(spec: ModuleSpec) -> str | None:
    try:
        return REBUILDS.get(spec)
    except TypeError:  # a spec with an unhashable field is in no registry
        return None


def _constructor_lines(module: nn.Module) -> str | None:
    """Lines that build a module of ``module``'s class with its constructor arguments, or None where its class
    does not keep them: a Hugging Face attention class ``(config[, layer_idx])`` from its config (eager
    attention), ``nn.MultiheadAttention`` from its attributes."""
    cls_line = import_line(type(module), "Module")
    if cls_line is None:
        return None
    if type(module) is nn.MultiheadAttention:
        m = module
        return (f"{cls_line}\nmodule = Module({m.embed_dim}, {m.num_heads}, bias={m.in_proj_bias is not None}, "
                f"add_bias_kv={m.bias_k is not None}, add_zero_attn={m.add_zero_attn}, kdim={m.kdim}, "
                f"vdim={m.vdim}, batch_first={m.batch_first})")
    config = getattr(module, "config", None)
    to_json = getattr(config, "to_json_string", None)
    config_line = None if config is None else import_line(type(config), "Config")
    params = list(inspect.signature(type(module)).parameters)
    if to_json is None or config_line is None or params[:1] != ["config"] or not set(params[1:]) <= {"layer_idx"}:
        return None
    layer = f", layer_idx={getattr(module, 'layer_idx', 0) or 0}" if "layer_idx" in params else ""
    fields = json.dumps(json.loads(to_json(use_diff=True)), separators=(",", ":"))  # what differs from the defaults
    return (f"import json\n{config_line}\n{cls_line}\n"
            f"config = Config()\n"
            f"for key, value in json.loads({fields!r}).items():\n"
            f"    setattr(config, key, value)  # as built (a tiny config need not pass from_dict's validation)\n"
            f"config._attn_implementation = 'eager'\nmodule = Module(config{layer})")


#: the largest module whose weights a repro carries in its text (more: the repro draws its own and says so)
REPRO_WEIGHTS = 8192


def weights_lines(module: nn.Module) -> str:
    """The line that gives a rebuilt ``module`` the audited one's weights: ``randomize_parameters(module, seed)``
    when that is what they are (seeds 0-9), else the state dict itself, base64 in the text, for a module of at
    most :data:`REPRO_WEIGHTS` values; else random weights, with a comment that says they are not the audited ones."""
    params = list(module.parameters())
    for seed in range(10):
        generator = torch.Generator().manual_seed(seed)
        if all(torch.equal(p.detach().cpu(), (torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5
                                              ).to(p.dtype)) for p in params):
            return (f"from typed_transformer.strategies import randomize_parameters\n"
                    f"module = randomize_parameters(module, {seed})")
    state = module.state_dict()
    if sum(t.numel() for t in state.values()) <= REPRO_WEIGHTS:
        import base64
        import io

        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state.items()}, buffer)
        text = base64.b64encode(buffer.getvalue()).decode()
        return (f"import base64, io\nmodule.load_state_dict(torch.load(io.BytesIO(base64.b64decode({text!r}))))"
                f"  # the audited weights")
    return ("from typed_transformer.strategies import randomize_parameters\n"
            "module = randomize_parameters(module, 0)  # NOT the audited weights (too many to carry): a bug of the "
            "code shows with these too")


#: How the hint names each fused layout.
_LAYOUTS: dict[str, str] = {"blocks": "in blocks, [q; k; v]", "heads": "per head, (h [q k v] d)",
                            "groups": "per key/value group, (g [q_1 .. q_r k v] d)"}


def layout_hint(adapter: ModuleAdapter, report: AuditReport) -> None:
    """A failing ``reference`` check of a fused-qkv spec: try the other fused layouts on its counterexample and
    say so in the message when one fits (``[q; k; v]`` blocks, GPT-NeoX's per-head ``(h [q k v] d)``, Falcon's
    per-group ``(g [q_1 .. q_r k v] d)``); when the error is huge and neither a layout nor the diagnosis of its
    root cause explains it, suspect one. Adds a line to the failing rows."""
    spec = adapter.spec
    failing = [r for r in report.results if r.name == "reference" and r.status == "FAIL"]
    if spec.qkv is None or spec.weights is not None or not failing or failing[0].counterexample is None:
        return
    fields = dict(failing[0].counterexample)
    fields["widths"] = None if fields["widths"] is None else tuple(fields["widths"])
    example = Example(**fields)
    ins, keep = example.inputs(), example.mask()
    hint = None
    out = adapter.call(ins, keep, example.is_causal, example.torch_dtype)
    own = error(out, adapter.reference(ins, keep, example.is_causal, torch.float64))
    for other in _LAYOUTS:
        if other == spec.qkv_layout:
            continue
        try:
            alternative = ModuleAdapter(adapter.original, dataclasses.replace(spec, qkv_layout=other),  # type: ignore[arg-type]
                                        conventions=adapter.conventions)
        except AuditUsageError:  # that layout cannot split these weights (head counts, unequal sizes)
            continue
        ref = alternative.reference(ins, keep, example.is_causal, torch.float64)
        if torch.equal(alternative.weights.wq, adapter.weights.wq) and torch.equal(alternative.weights.wk,
                                                                                   adapter.weights.wk):
            continue  # the same split at these head counts
        scale = max(1.0, float(ref.abs().max()))
        if error(out, ref) <= 1e-3 * scale < own:
            hint = (f"hint: the module matches the reference with its fused {spec.qkv!r} weights split "
                    f"{_LAYOUTS[other]}: declare qkv_layout={other!r} in the spec")
            break
    explained = any(cause.diagnosis for cause in report.causes if failing[0] in cause.rows)
    if hint is None and (failing[0].ratio or 0.0) > 1e3 and not explained:  # no single change explains it either
        hint = "hint: the weights may be split in another layout (per-head qkv?)"
    if hint is not None:
        for row in failing:
            row.message = f"{row.message}; {hint}"


def spec_differences(adapter: ModuleAdapter, inference: Inference, known: dict[str, Any]) -> Inference:
    """``inference``'s differences from the paper's attention, declared where the spec's conventions (or
    ``known``) give the inferred value: a module's spec describes its library's own conventions."""
    declared = {**dataclasses.asdict(adapter.conventions), **known}
    return with_differences(inference, declared, head_size=None if adapter.fixed is None else adapter.fixed["d"])


def audit_module(
    module: nn.Module | Callable[[], nn.Module],
    spec: "ModuleSpec | str",
    *,
    conventions: Conventions | Literal["infer"] | None = None,
    fully_masked: Literal["zero", "nan", "uniform", "any"] | None = None,
    checks: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    max_examples: int = 10,
    seed: int = 0,
    tolerance: float = 2.0,
    name: str | None = None,
    setup: str | None = None,
    known: Mapping[str, Any] | None = None,
    budget: Budget | str = "default",
) -> AuditReport:
    """Audit an attention module with its own weights against the reference (every check that applies to
    modules, once per dtype). The module (or the one a factory builds) is deep-copied first: the caller's
    module is left exactly as it was (parameters, dtype, train/eval mode, gradients). ``checks``, ``dtypes``,
    ``max_examples``, ``seed``, ``tolerance``, ``name`` and ``budget`` are as in :func:`audit_attention`.

    Args:
        module: the module, or a zero-argument factory of one.
        spec: a :class:`ModuleSpec`, the name of a shipped one (:data:`SPECS`), of a library whose spec is read from
            the module (``"litgpt"``, ``"timm"``, ...: :func:`library_spec`) or ``"auto"`` (chosen from its class).
        conventions: override the spec's conventions, or ``"infer"``: the spec says where the weights live,
            inference decides the behavioural fields (causal alignment and decode rule, always causal, fully
            masked rows, masks with ``is_causal``) and the report opens with them.
        fully_masked: override only what a query row without allowed keys gives.
        setup: Python lines that define ``module`` and ``spec`` in a fresh interpreter, at the top of every
            repro snippet (default: the shipped spec by name, or your spec and factory by their import paths).
        known: with ``conventions="infer"``, the behavioural fields you know (``{"fully_masked": "zero"}``):
            inference does the rest and checks each against the behaviour; a contradiction is a FAIL of the
            ``conventions`` row naming the field, the behaviour and the witness.

    Raises:
        AuditUsageError: the module does not match the spec (the message names the missing attribute).
        KeyError: an unknown spec name.
    """
    candidate = module if isinstance(module, nn.Module) else module()
    if isinstance(spec, str):
        if spec in LIBRARY_READERS:  # a library's zero-line spec, read from the module ("auto": from its class)
            setup = setup or library_setup(module, spec)
            spec = LIBRARY_READERS[spec](candidate)
        elif spec not in SHIPPED_SPECS:
            raise KeyError(f"unknown spec {spec!r}; shipped specs: {', '.join(SHIPPED_SPECS)}, auto")
        else:
            spec = SHIPPED_SPECS[spec]
    infer = conventions == "infer"
    if known is not None and not infer:
        raise ValueError("known= goes with conventions='infer' (declared conventions already say every field)")
    check_known(dict(known or {}))
    conv = spec.conventions if conventions is None or conventions == "infer" else conventions
    if fully_masked is not None:
        conv = dataclasses.replace(conv, fully_masked=fully_masked)
    adapter = ModuleAdapter(candidate, spec, conventions=conv, name=name)
    adapter.setup = setup or module_setup(module, spec)
    inference = infer_adapter(adapter, seed=seed) if infer else None
    if inference is not None and known:
        inference = with_known(inference, dict(known))
    if inference is not None:  # the spec's conventions are the module's declared ones
        inference = spec_differences(adapter, inference, dict(known or {}))
        adapter.conventions = inference.conventions
    described = {"spec": spec.name, **dataclasses.asdict(adapter.conventions)}
    report = run_audit(adapter, checks=checks, dtypes=dtypes, max_examples=max_examples, seed=seed,
                       tolerance=tolerance, conventions=described, budget=budget)
    layout_hint(adapter, report)
    if inference is not None:
        return with_inference(report, inference)
    if not report.passed:
        report.contradictions = contradictions(adapter.conventions, infer_adapter(adapter, seed=seed))
    return report


def infer_conventions(candidate: Callable[..., Any], *, seed: int = 0, name: str | None = None,
                      spec: Any = None, **options: Any) -> Inference:
    """Infer what a functional candidate ``candidate(q, k, v, [attn_mask=...], [is_causal=...])`` does: its
    layout, mask kind and polarity, causal alignment and decode rule, whether it is always causal, what a fully
    masked row gives, grouped-query support and grouping, whether a mask may come with ``is_causal``, the logit
    scale, and which arguments its signature takes.

    Args:
        candidate: the function to probe (about 25 calls on inputs of sizes <= 8, in float64 and float32), or
            an attention module with ``spec`` (a :class:`ModuleSpec` or a shipped spec's name: it says where the
            weights live; inference decides the behavioural fields, on a deep copy).
        seed: the probes' input seed.
        name: how the result names the candidate.
        options: :class:`Conventions` fields inference does not decide (``self_attention``, ``head_sizes``,
            ``lengths``, ``equal_head_sizes``, ``even_head_size``, ``supports_autograd``: they narrow what the
            probes draw), and fields you know among those it decides (``causal_alignment="top-left"``): inference
            does the rest, and each known field is checked against the behaviour; a contradiction is a finding
            that names the field, the behaviour and its witness. A module takes known fields only.

    Returns:
        An :class:`Inference`: ``.conventions``, ``.evidence`` (field -> value, what decided it and a repro),
        ``.findings`` (behaviours that match no documented convention).
    """
    if spec is not None:
        module_spec = SHIPPED_SPECS[spec] if isinstance(spec, str) else spec
        check_known(options)
        adapter = ModuleAdapter(candidate, module_spec, name=name)  # type: ignore[arg-type]
        inference = infer_adapter(adapter, seed=seed)
        return spec_differences(adapter, with_known(inference, options) if options else inference, options)
    return infer_function_conventions(candidate, seed=seed, name=name, **options)
