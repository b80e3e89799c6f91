"""Public Hypothesis strategies for attention shapes, tensors, masks and module configurations.

Install with the ``strategies`` extra (``pip install 'typed-transformer[strategies]'``, or
``pip install -e '.[strategies]'`` in a checkout): this module imports Hypothesis, which
``import typed_transformer`` itself never does. The library's own property suite uses
these strategies (``property_tests/``), and so does :mod:`typed_transformer.audit`.

Example::

    from hypothesis import given
    from typed_transformer.strategies import attention_inputs

    @given(attention_inputs())
    def test_my_attention(inputs):
        out = my_attention(inputs.q, inputs.k, inputs.v)      # q (b, h, t, d), k/v (b, g, s, d|dv)
        assert out.shape == inputs.shape.out

Importing this module registers torch's global RNG with Hypothesis (``hypothesis.register_random``), so a
test that calls ``torch.randn`` without a generator is seeded per example and replays on failure.

Design:

* **Shapes are small shrinkable integers.** Every size is drawn with ``st.integers(1, max)``, so a failing
  example shrinks towards 1 on every axis and size-1 edges are always reachable. Query length ``t`` and
  key length ``s`` are drawn independently unless a caller asks for self-attention.
* **Values come from a drawn seed**, not element by element: ``torch.randn(shape,
  generator=torch.Generator().manual_seed(seed))``. That costs the same at any size, shrinks to
  ``seed=0`` and needs neither numpy nor hypothesis-torch.
* **Masks follow the library's convention**: boolean masks are keep-masks (True = may attend), float
  masks are added to the logits (``-inf`` removes a key), key padding masks are True for real tokens.
  Strategies either guarantee at least one allowed key per query row (``fully_masked_rows=False``, the
  default; needed to compare with torch, which gives NaN otherwise) or allow fully masked rows.

Axis names, as everywhere in typed_transformer: ``b`` batch, ``t`` query positions, ``s`` key positions,
``h`` query heads, ``g`` key/value heads (``h = g * r``), ``d`` head size, ``dv`` value size.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar

import torch
from hypothesis import register_random
from hypothesis import strategies as st
from jaxtyping import Bool, Float
from torch import Tensor, nn

from .positions import RotaryEmbedding
from .shapecheck import shape_checked, typechecked

__all__ = [
    "MASK_LAYOUTS",
    "TORCH_RANDOM",
    "AttentionInputs",
    "AttentionShape",
    "MHAConfig",
    "MaskLayout",
    "additive_masks",
    "attention_inputs",
    "attention_shapes",
    "attn_masks",
    "float_dtypes",
    "keep_masks",
    "key_padding_masks",
    "mask_shape",
    "mha_configs",
    "randn",
    "randomize_parameters",
    "seeds",
]

#: Largest seed drawn; ``torch.Generator.manual_seed`` accepts any 64-bit value.
MAX_SEED = 2**32 - 1

class _TorchRandom:
    """``random.Random``-like view of torch's global RNG, so Hypothesis seeds and restores it per example
    (any ``torch.randn`` without a generator inside a test becomes replayable)."""

    seed = staticmethod(torch.random.manual_seed)
    getstate = staticmethod(torch.random.get_rng_state)
    setstate = staticmethod(torch.random.set_rng_state)


#: torch's global RNG as Hypothesis sees it. ``register_random`` keeps only a weak reference: this
#: module-level name is the strong one that keeps the registration alive.
TORCH_RANDOM = _TorchRandom()
register_random(TORCH_RANDOM)

MaskLayout: TypeAlias = Literal["t s", "1 1 t s", "b 1 t s", "1 h t s", "b h t s"]
#: The mask layouts ``scaled_dot_product_attention`` accepts, simplest first (Hypothesis shrinks to it).
MASK_LAYOUTS: tuple[MaskLayout, ...] = ("t s", "1 1 t s", "b 1 t s", "1 h t s", "b h t s")


# ----------------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------------


def seeds() -> st.SearchStrategy[int]:
    """Seeds for ``torch.Generator().manual_seed``; shrinks towards 0.

    Example: ``@given(seed=seeds())`` then ``randn((2, 3), seed)``."""
    return st.integers(0, MAX_SEED)


def randn(shape: Sequence[int], seed: int, *, dtype: torch.dtype = torch.float64) -> Float[Tensor, "*shape"]:
    """Standard-normal tensor of ``shape``, a pure function of ``seed`` (never touches the global RNG).

    Example: ``randn((2, 3), seed=7).equal(randn((2, 3), seed=7))`` is True."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=dtype)


randn = typechecked(randn)


def float_dtypes(*, half: bool = True) -> st.SearchStrategy[torch.dtype]:
    """float64, float32 and (with ``half``) bfloat16 and float16; shrinks towards float64.

    Example: ``@given(dtype=float_dtypes(half=False))`` draws only float64 and float32."""
    dtypes = [torch.float64, torch.float32]
    if half:
        dtypes += [torch.bfloat16, torch.float16]
    return st.sampled_from(dtypes)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def randomize_parameters(module: ModuleT, seed: int, *, std: float = 0.5) -> ModuleT:
    """Overwrite every parameter of ``module`` with ``std * N(0, 1)`` values drawn from ``seed``.

    torch's and our initialisation set biases to zero, which would hide bias-handling bugs from any
    comparison; tests call this after building a module. Returns ``module``.

    Example: ``randomize_parameters(MultiHeadAttention(8, 2), seed=0)``.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            values = torch.randn(param.shape, generator=generator, dtype=torch.float64) * std
            param.copy_(values.to(param.dtype))
    return module


# ----------------------------------------------------------------------------------------------------
# Shapes and q/k/v inputs
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    """Sizes of one ``scaled_dot_product_attention`` call; ``h = g * r`` query heads."""

    b: int
    t: int
    s: int
    g: int
    r: int
    d: int
    dv: int

    @property
    def h(self) -> int:
        return self.g * self.r

    @property
    def q(self) -> tuple[int, int, int, int]:
        return (self.b, self.h, self.t, self.d)

    @property
    def k(self) -> tuple[int, int, int, int]:
        return (self.b, self.g, self.s, self.d)

    @property
    def v(self) -> tuple[int, int, int, int]:
        return (self.b, self.g, self.s, self.dv)

    @property
    def out(self) -> tuple[int, int, int, int]:
        return (self.b, self.h, self.t, self.dv)

    @property
    def weights(self) -> tuple[int, int, int, int]:
        return (self.b, self.h, self.t, self.s)


@st.composite
def attention_shapes(
    draw: st.DrawFn,
    *,
    max_batch: int = 3,
    max_len: int = 7,
    max_kv_heads: int = 3,
    max_group: int = 3,
    max_head_dim: int = 8,
    max_value_dim: int = 8,
    same_length: bool = False,
    min_len: int = 1,
    min_head_dim: int = 1,
    head_dim_multiple: int = 1,
    same_value_dim: bool = False,
) -> AttentionShape:
    """Attention sizes: ``b`` in 1..3, ``t`` and ``s`` independently in 1..7 (``s = t`` with
    ``same_length``), ``g`` in 1..3 key/value heads, ``r`` in 1..3 query heads per group, ``d`` and
    ``dv`` in 1..8 (``dv = d`` about half of the time). Pass ``max_group=1`` for ordinary multi-head
    attention (``h = g``). ``min_head_dim`` and ``head_dim_multiple`` narrow ``d`` (``head_dim_multiple=2``:
    even head sizes, for rotary embeddings); ``same_value_dim`` makes ``dv = d``.

    Example::

        @given(shape=attention_shapes(same_length=True))
        def test_sizes(shape):
            assert shape.t == shape.s and shape.h % shape.g == 0
            q = randn(shape.q, 0)                  # (b, h, t, d)"""
    b = draw(st.integers(1, max_batch), label="b")
    t = draw(st.integers(min_len, max_len), label="t")
    s = t if same_length else draw(st.integers(min_len, max_len), label="s")
    g = draw(st.integers(1, max_kv_heads), label="g")
    r = draw(st.integers(1, max_group), label="r")
    m = head_dim_multiple
    d = m * draw(st.integers(max(1, -(-min_head_dim // m)), max(1, max_head_dim // m, -(-min_head_dim // m))),
                 label="d")
    # dv = d half of the time: the usual case, and the only one torch's fused CPU kernel takes.
    dv = d if same_value_dim else draw(st.just(d) | st.integers(1, max_value_dim), label="dv")
    return AttentionShape(b=b, t=t, s=s, g=g, r=r, d=d, dv=dv)


@shape_checked
@dataclass(frozen=True)
class AttentionInputs:
    """Queries ``(b, h, t, d)``, keys ``(b, g, s, d)`` and values ``(b, g, s, dv)`` of one shape."""

    shape: AttentionShape
    q: Float[Tensor, "b h t d"]
    k: Float[Tensor, "b g s d"]
    v: Float[Tensor, "b g s dv"]
    seed: int

    __shape_checked__ = ("__init__",)


@st.composite
def attention_inputs(
    draw: st.DrawFn,
    shapes: st.SearchStrategy[AttentionShape] | None = None,
    *,
    dtype: torch.dtype = torch.float64,
) -> AttentionInputs:
    """q, k, v of a drawn :class:`AttentionShape` (default :func:`attention_shapes`), N(0, 1) values.

    The values come from ``torch.Generator().manual_seed(seed)`` with a drawn ``seed`` (recorded in
    :attr:`AttentionInputs.seed`), so the cost does not depend on the size and failures replay.

    Example::

        @given(inputs=attention_inputs(attention_shapes(max_group=1), dtype=torch.float32))
        def test_out_shape(inputs):
            assert my_attention(inputs.q, inputs.k, inputs.v).shape == inputs.shape.out"""
    shape = draw(attention_shapes() if shapes is None else shapes)
    seed = draw(seeds(), label="seed")
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(shape.q, generator=generator, dtype=dtype)
    k = torch.randn(shape.k, generator=generator, dtype=dtype)
    v = torch.randn(shape.v, generator=generator, dtype=dtype)
    return AttentionInputs(shape=shape, q=q, k=k, v=v, seed=seed)


# ----------------------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------------------


def mask_shape(layout: MaskLayout, shape: AttentionShape) -> tuple[int, ...]:
    """The tensor shape of a mask in ``layout`` for ``shape`` (``"b 1 t s"`` -> ``(b, 1, t, s)``)."""
    sizes = {"b": shape.b, "h": shape.h, "t": shape.t, "s": shape.s, "1": 1}
    return tuple(sizes[axis] for axis in layout.split())


_DENSITIES = (1.0, 0.5, 0.0, 0.25, 0.75)


@st.composite
def keep_masks(
    draw: st.DrawFn,
    shape: Sequence[int],
    *,
    fully_masked_rows: bool = False,
    always_keep: int | None = None,
) -> Bool[Tensor, "*shape"]:
    """Boolean keep-mask (True = may attend) of ``shape``; the last axis is the key axis.

    Args:
        shape: mask shape, e.g. ``(t, s)`` or ``(b, h, t, s)``.
        fully_masked_rows: allow rows with no True at all. Otherwise every row keeps at least one key
            (one random key per row is forced to True).
        always_keep: force this key column to True in every row (a key every query can see, whatever
            else masks it, e.g. after combining with a padding mask that keeps the same key).

    The density of True is drawn from {1, 0.5, 0, 0.25, 0.75}: all-True (shrinks there), a single key per
    row, and with ``fully_masked_rows`` all-False are all reachable.

    Example::

        @given(mask=keep_masks((4, 6)))
        def test_rows(mask):
            assert mask.any(dim=-1).all()         # at least one allowed key per query row
    """
    shape = tuple(shape)
    density = draw(st.sampled_from(_DENSITIES), label="density")
    seed = draw(seeds(), label="mask_seed")
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=generator) < density
    if not fully_masked_rows and shape[-1] > 0:
        index = torch.randint(0, shape[-1], (*shape[:-1], 1), generator=generator)
        mask = mask.scatter(-1, index, True)
    if always_keep is not None:
        mask[..., always_keep] = True
    return mask


@st.composite
def additive_masks(
    draw: st.DrawFn,
    shape: Sequence[int],
    *,
    dtype: torch.dtype = torch.float64,
    neg_inf: bool = True,
    fully_masked_rows: bool = False,
    always_keep: int | None = None,
) -> Float[Tensor, "*shape"]:
    """Float mask added to the logits: ``scale * N(0, 1)`` with ``scale`` in {0, 1, 4}, and (with
    ``neg_inf``) ``-inf`` where a :func:`keep_masks` draw (same ``fully_masked_rows`` and
    ``always_keep`` meaning) is False.

    Example: ``@given(bias=additive_masks((2, 1, 4, 6), neg_inf=False))`` draws finite biases only.
    """
    shape = tuple(shape)
    scale = draw(st.sampled_from([0.0, 1.0, 4.0]), label="mask_scale")
    seed = draw(seeds(), label="mask_seed")
    values = randn(shape, seed, dtype=torch.float64) * scale
    if neg_inf:
        keep = draw(keep_masks(shape, fully_masked_rows=fully_masked_rows, always_keep=always_keep))
        values = values.masked_fill(~keep, float("-inf"))
    return values.to(dtype)


@st.composite
def attn_masks(
    draw: st.DrawFn,
    shape: AttentionShape,
    *,
    layouts: Sequence[MaskLayout] = MASK_LAYOUTS,
    kinds: Sequence[Literal["bool", "float"]] = ("bool", "float"),
    dtype: torch.dtype = torch.float64,
    fully_masked_rows: bool = False,
    always_keep: int | None = None,
) -> Bool[Tensor, "*shape"] | Float[Tensor, "*shape"]:
    """An ``attn_mask`` for ``scaled_dot_product_attention`` with ``shape``: boolean keep-mask or additive
    float mask (of ``dtype``) in one of ``layouts`` (``(t, s)`` or 4-D with broadcast ``b``/``h``).

    Example::

        @given(data=st.data(), shape=attention_shapes())
        def test_masked(data, shape):
            mask = data.draw(attn_masks(shape, kinds=["bool"], layouts=["b 1 t s"]))
            assert mask.shape == (shape.b, 1, shape.t, shape.s)
    """
    layout = draw(st.sampled_from(list(layouts)), label="layout")
    kind = draw(st.sampled_from(list(kinds)), label="kind")
    size = mask_shape(layout, shape)
    if kind == "bool":
        return draw(keep_masks(size, fully_masked_rows=fully_masked_rows, always_keep=always_keep))
    return draw(additive_masks(size, dtype=dtype, fully_masked_rows=fully_masked_rows, always_keep=always_keep))


@st.composite
def key_padding_masks(
    draw: st.DrawFn,
    b: int,
    s: int,
    *,
    fully_padded_rows: bool = False,
    always_keep: int | None = None,
    styles: Sequence[Literal["right", "random"]] = ("right", "random"),
) -> Bool[Tensor, "b s"]:
    """Key padding mask ``(b, s)``, True = real token.

    Either right padding (each row real up to a drawn length, the usual batch of sequences) or an
    arbitrary pattern (``styles`` says which may be drawn). Unless ``fully_padded_rows``, every batch row has
    at least one real token.
    ``always_keep`` forces that key to be real in every row.

    Example: ``@given(padding=key_padding_masks(2, 5))``: every row has a real token
    (``padding.any(dim=-1).all()``).
    """
    style = draw(st.sampled_from(list(styles)), label="padding_style")
    if style == "random":
        return draw(keep_masks((b, s), fully_masked_rows=fully_padded_rows, always_keep=always_keep))
    generator = torch.Generator().manual_seed(draw(seeds(), label="mask_seed"))
    low = 0 if fully_padded_rows else 1
    lengths = torch.randint(low, s + 1, (b, 1), generator=generator)
    mask = torch.arange(s) < lengths
    if always_keep is not None:
        mask[:, always_keep] = True
    return mask


# ----------------------------------------------------------------------------------------------------
# MultiHeadAttention configurations
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MHAConfig:
    """Constructor arguments of ``MultiHeadAttention`` (and, where torch can express them, of
    ``nn.MultiheadAttention``). ``kdim``/``vdim``/``input_dim`` of None mean "same as the query"."""

    num_heads: int
    head_dim: int
    num_kv_heads: int
    input_dim: int | None = None
    kdim: int | None = None
    vdim: int | None = None
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    dropout: float = 0.0
    backend: Literal["sdpa", "reference"] = "sdpa"
    rotary: bool = False

    @property
    def d_model(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def query_width(self) -> int:
        return self.d_model if self.input_dim is None else self.input_dim

    @property
    def key_width(self) -> int:
        return self.query_width if self.kdim is None else self.kdim

    @property
    def value_width(self) -> int:
        return self.query_width if self.vdim is None else self.vdim

    @property
    def extra_keys(self) -> int:
        """Key positions appended after the real ones (``bias_k``/``bias_v``, then the zero key)."""
        return int(self.add_bias_kv) + int(self.add_zero_attn)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``MultiHeadAttention(d_model, num_heads, **kwargs)``.

        ``dropout``, ``backend`` and ``rotary`` appear only when they differ from the constructor's
        defaults, so callers may still pass their own ``backend=``."""
        kwargs: dict[str, Any] = {"input_dim": self.input_dim, "kdim": self.kdim, "vdim": self.vdim,
                                  "bias": self.bias, "add_bias_kv": self.add_bias_kv,
                                  "add_zero_attn": self.add_zero_attn, "num_kv_heads": self.num_kv_heads}
        if self.dropout:
            kwargs["dropout"] = self.dropout
        if self.backend != "sdpa":
            kwargs["backend"] = self.backend
        if self.rotary:
            kwargs["rotary"] = RotaryEmbedding(self.head_dim)
        return kwargs

    def torch_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nn.MultiheadAttention(d_model, num_heads, **kwargs)``."""
        if self.num_kv_heads != self.num_heads or self.input_dim not in (None, self.d_model) or self.rotary:
            raise ValueError(f"nn.MultiheadAttention cannot express {self}")
        kwargs: dict[str, Any] = {"kdim": self.kdim, "vdim": self.vdim, "bias": self.bias,
                                  "add_bias_kv": self.add_bias_kv, "add_zero_attn": self.add_zero_attn}
        if self.dropout:
            kwargs["dropout"] = self.dropout
        return kwargs


@st.composite
def mha_configs(
    draw: st.DrawFn,
    *,
    torch_compatible: bool = False,
    self_attention: bool = False,
    even_heads: bool = False,
    extras: bool = True,
    max_heads: int = 4,
    max_head_dim: int = 4,
    max_width: int = 9,
    dropouts: Sequence[float] = (0.0,),
    backends: Sequence[Literal["sdpa", "reference"]] = ("sdpa",),
    rotary: bool = False,
) -> MHAConfig:
    """``MultiHeadAttention`` configurations.

    Args:
        torch_compatible: only what ``nn.MultiheadAttention`` can express (no grouped-query heads, query
            width = ``d_model``).
        self_attention: key and value widths equal the query width (needed for ``key=None`` calls).
        even_heads: an even number of heads (torch's MHA fast path needs it).
        extras: allow ``add_bias_kv`` and ``add_zero_attn``.
        dropouts: dropout probabilities to draw from (default: no dropout).
        backends: ``backend`` values to draw from (default ``"sdpa"``, the constructor's default).
        rotary: sometimes add a rotary embedding (forces ``self_attention`` and an even head size).

    With ``dropouts=(0.0, 0.1)``, ``backends=("sdpa", "reference")`` and ``rotary=True`` every constructor
    option of ``MultiHeadAttention`` is reachable. The defaults draw exactly what they always drew.

    Example::

        @given(config=mha_configs(self_attention=True))
        def test_module(config):
            module = MultiHeadAttention(config.d_model, config.num_heads, **config.kwargs())
            assert module.num_heads % module.num_kv_heads == 0
    """
    num_heads = draw(st.integers(1, max_heads // 2).map(lambda n: 2 * n) if even_heads else
                     st.integers(1, max_heads), label="num_heads")
    use_rotary = rotary and draw(st.booleans(), label="rotary")
    if use_rotary:
        self_attention = True
        head_dim = 2 * draw(st.integers(1, max(1, max_head_dim // 2)), label="head_dim")
    else:
        head_dim = draw(st.integers(1, max_head_dim), label="head_dim")
    if torch_compatible:
        num_kv_heads = num_heads
    else:
        divisors = [n for n in range(1, num_heads + 1) if num_heads % n == 0]
        num_kv_heads = draw(st.sampled_from(divisors[::-1]), label="num_kv_heads")
    widths = st.none() | st.integers(1, max_width)
    input_dim = None if torch_compatible else draw(widths, label="input_dim")
    kdim = vdim = None
    if not self_attention:
        kdim = draw(widths, label="kdim")
        vdim = draw(widths, label="vdim")
    no_bias = draw(st.booleans(), label="no_bias")
    add_bias_kv = extras and draw(st.booleans(), label="add_bias_kv")
    add_zero_attn = extras and draw(st.booleans(), label="add_zero_attn")
    dropout = draw(st.sampled_from(list(dropouts)), label="dropout") if len(dropouts) > 1 else dropouts[0]
    backend = draw(st.sampled_from(list(backends)), label="backend") if len(backends) > 1 else backends[0]
    return MHAConfig(num_heads=num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads, input_dim=input_dim,
                     kdim=kdim, vdim=vdim, bias=not no_bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                     dropout=dropout, backend=backend, rotary=use_rotary)
