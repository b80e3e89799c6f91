"""Multi-head attention, batch-first, with the feature set of ``torch.nn.MultiheadAttention`` and more.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
                                                            ("Attention Is All You Need", section 3.2.2)

The ``h`` per-head projections ``W_i^Q`` (``d_model x d``, ``d = d_model / h``) are stored side by side
as one ``Linear(input_dim, d_model)``; splitting its output into heads is the rearrange
``"b t (h d) -> b h t d"``. When queries, keys and values have the same width (self-attention, and any
attention with ``kdim = vdim = input_dim``) the three projections are one fused ``in_proj`` of
``d_model + 2 * g * d`` outputs in q, k, v order, the layout of torch's ``in_proj_weight``. The multi-head
attention tutorial's ``qkv_layer`` has the same shape but keeps each head's q, k, v together
(``"(h three d) i -> (three h d) i"`` maps its rows to these: docs/tutorial-mistakes.md).

Beyond torch: a query width ``input_dim`` different from ``d_model`` (as in the multi-head attention tutorial),
grouped-query heads (``num_kv_heads``), a real ``is_causal`` flag, masks in one documented convention (True =
may attend), zero output for fully masked rows, and shape checks naming the argument and axis.
"""

import math
import warnings
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

import torch
import torch.nn.functional as F
from einops import rearrange, reduce, repeat
from jaxtyping import Bool, Float
from torch import Tensor, nn

from .attention import Backend, scaled_dot_product_attention, scaled_dot_product_attention_with_weights
from .masks import merge_causal, merge_masks
from .positions import RotaryEmbedding
from .shapecheck import raise_shape_error, shape_checked
from .validation import check_parameter_dtype, check_positive_int

__all__ = ["KVCache", "MultiHeadAttention"]

# MultiHeadAttention.forward's masks and weights (``{self.num_heads}`` is resolved per call, as in its signature).
_AttnMask: TypeAlias = (
    Bool[Tensor, "t s"] | Float[Tensor, "t s"] | Bool[Tensor, "b t s"] | Float[Tensor, "b t s"]
    | Bool[Tensor, "#b #{self.num_heads} #t s"] | Float[Tensor, "#b #{self.num_heads} #t s"]
)
_AttnBias: TypeAlias = Float[Tensor, "#b #{self.num_heads} #t s"] | Float[Tensor, "t s"]
#: The weights: averaged over heads ``(b, t, s')`` or per head ``(b, h, t, s')`` (``s'``: keys plus appended ones).
_Weights: TypeAlias = Float[Tensor, "b t _"] | Float[Tensor, "b {self.num_heads} t _"]


@shape_checked
class KVCache:
    """Keys and values of the positions seen so far, for one self-attention layer: ``(b, g, s, d)``.

    :meth:`MultiHeadAttention.forward` with ``kv_cache=cache`` appends the new positions' keys and values
    (after the rotary embedding, if any) and attends over everything cached. The position offset of the new
    queries is ``cache.length``.
    """

    __shape_checked__ = ("append",)

    def __init__(self, capacity: int | None = None) -> None:
        """``capacity``: the most positions it will hold; given, the first append allocates buffers of that
        length and later appends copy into them (no ``torch.cat`` of the whole cache per step). ``k`` and
        ``v`` are always the cached positions, ``(b, g, length, d)``."""
        check_positive_int("KVCache", "capacity", capacity, optional=True)
        self.capacity = capacity
        # The storage: the first `_length` positions along axis 2 are cached, the rest is room to append in
        # place. One tensor per side and an int, never a view of another attribute, so that a compiled forward
        # (torch.compile) sees no two inputs aliasing each other.
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._length = 0

    @property
    def k(self) -> Float[Tensor, "b g length d"] | None:
        """Cached keys, ``(b, g, length, d)``; ``None`` before the first append."""
        return None if self._k is None else self._k[:, :, : self._length]

    @property
    def v(self) -> Float[Tensor, "b g length dv"] | None:
        """Cached values, ``(b, g, length, dv)``; ``None`` before the first append."""
        return None if self._v is None else self._v[:, :, : self._length]

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return self._length

    def append(self, k: Float[Tensor, "b g t d"], v: Float[Tensor, "b g t dv"]
               ) -> tuple[Float[Tensor, "b g s d"], Float[Tensor, "b g s dv"]]:
        """Add ``t`` positions; return all cached keys and values (``s`` = old length + ``t``)."""
        t = k.shape[2]
        if self._k is None or self._v is None:
            if self.capacity is None or t > self.capacity:
                self._k, self._v = k, v
            else:
                b, g = k.shape[:2]
                self._k = k.new_empty(b, g, self.capacity, k.shape[3])
                self._v = v.new_empty(b, g, self.capacity, v.shape[3])
                self._k[:, :, :t] = k
                self._v[:, :, :t] = v
            self._length = t
            return k, v
        for name, new, old in (("k", k, self._k), ("v", v, self._v)):
            if new.shape[:2] != old.shape[:2] or new.shape[3] != old.shape[3]:
                held = (*old.shape[:2], self._length, old.shape[3])
                raise_shape_error(KVCache.append, name,
                                  f"is {tuple(new.shape)}, but the cache holds {held} "
                                  "(b, g and the head size must stay the same)")
        start, end = self._length, self._length + t
        if end <= self._k.shape[2]:  # room left in the buffers
            self._k[:, :, start:end] = k
            self._v[:, :, start:end] = v
        else:  # no capacity, or past it: grow by concatenation
            self._k = torch.cat([self._k[:, :, :start], k], dim=2)
            self._v = torch.cat([self._v[:, :, :start], v], dim=2)
        self._length = end
        return self._k[:, :, :end], self._v[:, :, :end]

    def crop(self, keep_last: int) -> None:
        """Keep only the last ``keep_last`` positions (a sliding window).

        Attending over a cropped cache equals recomputing the cropped window only in a first layer with
        relative (rotary) positions: in deeper layers the kept keys and values were computed while the
        dropped positions were still visible. :meth:`GPT.generate` therefore recomputes instead.
        """
        if keep_last < 0:
            raise ValueError(f"KVCache.crop: keep_last must be non-negative, got {keep_last}")
        if self._k is not None and self._v is not None:
            start = max(self._length - keep_last, 0)
            # Exactly the kept positions: the next append concatenates (the kept ones no longer start a buffer).
            self._k, self._v = self._k[:, :, start:self._length], self._v[:, :, start:self._length]
            self._length -= start

    def reset(self) -> None:
        """Forget every cached position."""
        self._k = self._v = None
        self._length = 0


def warn_empty_padding_rows(key_padding_mask: Tensor) -> None:
    """Warns when a batch row of ``key_padding_mask`` lets no key be attended (every entry False). With our
    polarity (True = real token) that is a sequence of padding only; far more often it is torch's polarity (True =
    padding) passed as it is, which turns every unpadded sequence into zeros. Not checked while compiling (it
    reads the mask's values)."""
    if torch.compiler.is_compiling() or key_padding_mask.numel() == 0:
        return
    (empty_rows,) = torch.where(~key_padding_mask.any(dim=-1))
    empty = empty_rows.tolist()
    if empty:
        rows = ", ".join(map(str, empty[:8])) + (", ..." if len(empty) > 8 else "")
        warnings.warn(f"key_padding_mask: batch row(s) {rows} let no key be attended (every entry False), so their "
                      f"outputs are zeros. Ours is True = real token; a torch-style mask (True = padding) must be "
                      f"converted with typed_transformer.key_padding_mask_from_torch", UserWarning, stacklevel=3)


@shape_checked
class MultiHeadAttention(nn.Module):
    """Batch-first multi-head attention.

    Args:
        d_model: model width; the output width and the total width of the query heads.
        num_heads: number of query heads ``h``; must divide ``d_model``.
        input_dim: width of the query input (default ``d_model``).
        kdim: width of the key input (default ``input_dim``).
        vdim: width of the value input (default ``input_dim``).
        dropout: dropout on the attention weights, in training mode only.
        bias: bias on the input and output projections.
        add_bias_kv: append one learned key and value position (torch's ``bias_k``/``bias_v``).
        add_zero_attn: append one all-zero key and value position after the projection.
        num_kv_heads: number of key/value heads ``g`` (grouped-query attention); must divide
            ``num_heads``. Default ``num_heads``.
        backend: ``"sdpa"`` (``F.scaled_dot_product_attention``) or ``"reference"``. Either way,
            ``need_weights=True`` computes through the reference path, which can return weights.
        rotary: a :class:`~typed_transformer.positions.RotaryEmbedding` applied to queries and keys
            (self-attention only), at positions ``kv_cache.length + j`` when a cache is used.

    Shapes: ``query (b, t, input_dim)``, ``key (b, s, kdim)``, ``value (b, s, vdim)`` ->
    ``output (b, t, d_model)``; weights ``(b, t, s')`` averaged over heads or ``(b, h, t, s')`` per head,
    where ``s' = s + add_bias_kv + add_zero_attn``.
    """

    __same_dtype__ = ("query", "key", "value")  # inputs that must have the parameters' dtype (shapecheck)

    in_proj: nn.Linear | None
    q_proj: nn.Linear | None
    k_proj: nn.Linear | None
    v_proj: nn.Linear | None
    bias_k: nn.Parameter | None
    bias_v: nn.Parameter | None

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        input_dim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        num_kv_heads: int | None = None,
        backend: Backend = "sdpa",
        rotary: RotaryEmbedding | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, size in (("d_model", d_model), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                           ("input_dim", input_dim), ("kdim", kdim), ("vdim", vdim)):
            if size is not None:  # None: input_dim, kdim or vdim as d_model
                check_positive_int("MultiHeadAttention", name, size)
        if d_model % num_heads != 0:
            raise ValueError(f"MultiHeadAttention: d_model={d_model} is not divisible by num_heads={num_heads}")
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"MultiHeadAttention: num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiHeadAttention: dropout must be in [0, 1), got {dropout}")
        if backend not in ("sdpa", "reference"):
            raise ValueError(f"MultiHeadAttention: backend must be 'sdpa' or 'reference', got {backend!r}")
        if rotary is not None and rotary.head_dim != d_model // num_heads:
            raise ValueError(f"MultiHeadAttention: rotary.head_dim={rotary.head_dim} does not match the head size "
                             f"d_model/num_heads={d_model // num_heads}")
        check_parameter_dtype("MultiHeadAttention", dtype)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}

        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        self.kv_dim = num_kv_heads * self.head_dim
        self.input_dim = d_model if input_dim is None else input_dim
        self.kdim = self.input_dim if kdim is None else kdim
        self.vdim = self.input_dim if vdim is None else vdim
        self.dropout = dropout
        self.add_zero_attn = add_zero_attn
        self.backend: Backend = backend
        self.rotary = rotary
        # Key positions appended after the real ones: bias_k/bias_v, then the zero position.
        self.extra_keys = int(add_bias_kv) + int(add_zero_attn)

        self.fused = self.kdim == self.vdim == self.input_dim
        if self.fused:
            self.in_proj = nn.Linear(self.input_dim, d_model + 2 * self.kv_dim, bias=bias, **factory)
            self.q_proj = self.k_proj = self.v_proj = None
        else:
            self.in_proj = None
            self.q_proj = nn.Linear(self.input_dim, d_model, bias=bias, **factory)
            self.k_proj = nn.Linear(self.kdim, self.kv_dim, bias=bias, **factory)
            self.v_proj = nn.Linear(self.vdim, self.kv_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty(self.kv_dim, **factory))
            self.bias_v = nn.Parameter(torch.empty(self.kv_dim, **factory))
        else:
            self.bias_k = self.bias_v = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's initialisation: xavier-uniform input projections, zero input/output biases,
        default ``Linear`` init for the output weight, N(0, 1/kv_dim) for ``bias_k``/``bias_v``."""
        for proj in (self.in_proj, self.q_proj, self.k_proj, self.v_proj):
            if proj is not None:
                nn.init.xavier_uniform_(proj.weight)
                if proj.bias is not None:
                    nn.init.zeros_(proj.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)
        for extra in (self.bias_k, self.bias_v):
            if extra is not None:
                nn.init.normal_(extra, std=1.0 / math.sqrt(self.kv_dim))  # = xavier_normal_ on torch's (1, 1, E)

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"num_heads={self.num_heads}"]
        if self.num_kv_heads != self.num_heads:
            parts.append(f"num_kv_heads={self.num_kv_heads}")
        if self.input_dim != self.d_model:
            parts.append(f"input_dim={self.input_dim}")
        if not self.fused:
            parts.append(f"kdim={self.kdim}, vdim={self.vdim}")
        if self.dropout:
            parts.append(f"dropout={self.dropout}")
        return ", ".join([*parts, f"backend={self.backend!r}"])

    # need_weights changes the return type: the overloads make it exact for type checkers (False or left out:
    # (output, None); True: (output, weights)).
    @overload
    def forward(
        self,
        query: Float[Tensor, "b t {self.input_dim}"],
        key: Float[Tensor, "b s {self.kdim}"] | None = None,
        value: Float[Tensor, "b s {self.vdim}"] | None = None,
        *,
        attn_mask: _AttnMask | None = None,
        key_padding_mask: Bool[Tensor, "b s"] | None = None,
        attn_bias: _AttnBias | None = None,
        is_causal: bool = False,
        need_weights: Literal[False] = False,
        average_attn_weights: bool = True,
        kv_cache: KVCache | None = None,
    ) -> tuple[Float[Tensor, "b t {self.d_model}"], None]: ...
    @overload
    def forward(
        self,
        query: Float[Tensor, "b t {self.input_dim}"],
        key: Float[Tensor, "b s {self.kdim}"] | None = None,
        value: Float[Tensor, "b s {self.vdim}"] | None = None,
        *,
        attn_mask: _AttnMask | None = None,
        key_padding_mask: Bool[Tensor, "b s"] | None = None,
        attn_bias: _AttnBias | None = None,
        is_causal: bool = False,
        need_weights: Literal[True],
        average_attn_weights: bool = True,
        kv_cache: KVCache | None = None,
    ) -> tuple[Float[Tensor, "b t {self.d_model}"], _Weights]: ...
    @overload
    def forward(
        self,
        query: Float[Tensor, "b t {self.input_dim}"],
        key: Float[Tensor, "b s {self.kdim}"] | None = None,
        value: Float[Tensor, "b s {self.vdim}"] | None = None,
        *,
        attn_mask: _AttnMask | None = None,
        key_padding_mask: Bool[Tensor, "b s"] | None = None,
        attn_bias: _AttnBias | None = None,
        is_causal: bool = False,
        need_weights: bool,
        average_attn_weights: bool = True,
        kv_cache: KVCache | None = None,
    ) -> tuple[Float[Tensor, "b t {self.d_model}"], _Weights | None]: ...
    def forward(
        self,
        query: Float[Tensor, "b t {self.input_dim}"],
        key: Float[Tensor, "b s {self.kdim}"] | None = None,
        value: Float[Tensor, "b s {self.vdim}"] | None = None,
        *,
        attn_mask: _AttnMask | None = None,
        key_padding_mask: Bool[Tensor, "b s"] | None = None,
        attn_bias: _AttnBias | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        kv_cache: KVCache | None = None,
    ) -> tuple[Float[Tensor, "b t {self.d_model}"], _Weights | None]:
        """Attend from ``query`` to ``key``/``value`` (self-attention when both are None).

        Args:
            query: ``(b, t, input_dim)``.
            key: ``(b, s, kdim)``; default ``query``.
            value: ``(b, s, vdim)``; default ``key``.
            attn_mask: keep-mask (True = may attend) or additive float mask: ``(t, s)``, ``(b, t, s)`` or
                ``(b, h, t, s)`` (``b``, ``h`` and ``t`` may be 1).
            key_padding_mask: ``(b, s)``, True = real token, False = padding (never attended to).
            attn_bias: additive float bias on each head's logits after scaling (a position bias such as
                :class:`~typed_transformer.positions.ALiBiPositionalBias`): ``(t, s)`` or ``(b, h, t, s)``
                (``b``, ``h`` and ``t`` may be 1), covering the cached positions too; the appended
                ``add_bias_kv``/``add_zero_attn`` keys get no bias.
            is_causal: bottom-right aligned causal mask, ANDed with the other masks.
            need_weights: also return the attention weights (computed on the reference path).
            average_attn_weights: average the returned weights over heads ``(b, t, s')``; otherwise
                ``(b, h, t, s')``.
            kv_cache: self-attention only: append this call's keys and values to the cache and attend
                over all cached positions (``s`` = cached + ``t``; masks must cover all of them).
                ``is_causal`` then aligns bottom-right, so each new query sees every earlier position.

        Returns:
            ``(output (b, t, d_model), weights or None)``.
        """
        if key is None and value is not None:
            raise ValueError("MultiHeadAttention.forward: value was given without key")
        if key is None and (self.kdim != self.input_dim or self.vdim != self.input_dim):
            width = "kdim" if self.kdim != self.input_dim else "vdim"
            raise_shape_error(MultiHeadAttention.forward, "key",
                              "is None (self-attention), but this module takes keys/values of width "
                              f"kdim={self.kdim}, vdim={self.vdim}, not the query width input_dim={self.input_dim}; "
                              "pass key and value", axis=width, expected=getattr(self, width))
        for name, other in (("key", key), ("value", value)):
            if other is not None and other.dtype != query.dtype:
                raise_shape_error(MultiHeadAttention.forward, name, f"dtype is {str(other.dtype)[6:]}, expected "
                                  f"{str(query.dtype)[6:]} (the dtype of query)")
        self_attention = key is None
        if key is not None and value is None:
            value = key
        if (kv_cache is not None or self.rotary is not None) and not self_attention:
            raise ValueError("MultiHeadAttention.forward: kv_cache and rotary embeddings are for self-attention "
                             "(key and value must be None)")
        offset = 0 if kv_cache is None else kv_cache.length
        b, t = query.shape[0], query.shape[1]
        s = offset + t if key is None else key.shape[1]
        if self_attention:
            # With key=None the keys are the query positions (plus any cached ones): masks must say so too.
            for name, mask in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask),
                               ("attn_bias", attn_bias)):
                if mask is not None and mask.shape[-1] != s:
                    why = f"self-attention with {offset} cached positions" if offset else "self-attention: s = t"
                    flipped = (f"; query {tuple(query.shape)} looks sequence-first (its axis 1 is the mask's batch "
                               f"size, its axis 0 the mask's length): ours is batch-first, (b, t, e); "
                               f"rearrange(x, 't b e -> b t e') converts it"
                               if not offset and mask.shape[0] == t and mask.shape[-1] == b != t else "")
                    raise_shape_error(MultiHeadAttention.forward, name,
                                      f"axis s is {mask.shape[-1]}, expected {s} ({why}, bound by query){flipped}",
                                      axis="s", actual=mask.shape[-1], expected=s, bound_by="query")

        q, k, v = self._project(query, key, value)
        q = rearrange(q, "b t (h d) -> b h t d", h=self.num_heads)
        k = rearrange(k, "b s (g d) -> b g s d", g=self.num_kv_heads)
        v = rearrange(v, "b s (g d) -> b g s d", g=self.num_kv_heads)
        if self.rotary is not None:
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)
        if self.bias_k is not None:
            assert self.bias_v is not None  # add_bias_kv creates both
            k = torch.cat([k, repeat(self.bias_k, "(g d) -> b g 1 d", b=b, g=self.num_kv_heads)], dim=2)
            v = torch.cat([v, repeat(self.bias_v, "(g d) -> b g 1 d", b=b, g=self.num_kv_heads)], dim=2)
        if self.add_zero_attn:
            k = F.pad(k, (0, 0, 0, 1))
            v = F.pad(v, (0, 0, 0, 1))

        if key_padding_mask is not None:
            warn_empty_padding_rows(key_padding_mask)
        mask = self._combined_mask(attn_mask, key_padding_mask, t, s, is_causal and self.extra_keys > 0)
        core_causal = is_causal and self.extra_keys == 0
        if attn_bias is not None and self.extra_keys:
            attn_bias = F.pad(attn_bias, (0, self.extra_keys), value=0.0)
        dropout_p = self.dropout if self.training else 0.0
        weights: Tensor | None = None
        if need_weights:
            out, weights = scaled_dot_product_attention_with_weights(q, k, v, attn_mask=mask, attn_bias=attn_bias,
                                                                     is_causal=core_causal, dropout_p=dropout_p)
            if average_attn_weights:
                weights = reduce(weights, "b h t s -> b t s", "mean")
        else:
            result = scaled_dot_product_attention(q, k, v, attn_mask=mask, attn_bias=attn_bias, is_causal=core_causal,
                                                  dropout_p=dropout_p, backend=self.backend)
            assert isinstance(result, Tensor)  # the tuple form is the deprecated return_weights=True
            out = result
        out = rearrange(out, "b h t d -> b t (h d)")
        return self.out_proj(out), weights

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward

    def _project(self, query: Tensor, key: Tensor | None, value: Tensor | None) -> tuple[Tensor, ...]:
        """Queries, keys and values; ``key=None`` (self-attention) projects ``query`` with one fused matmul."""
        sizes = [self.d_model, self.kv_dim, self.kv_dim]
        if self.in_proj is not None:
            if key is None:
                return tuple(torch.split(self.in_proj(query), sizes, dim=-1))
            # kdim == vdim == input_dim, but different tensors: three matmuls with the fused weight's slices.
            assert value is not None
            w_q, w_k, w_v = torch.split(self.in_proj.weight, sizes)
            b_q, b_k, b_v = (None, None, None) if self.in_proj.bias is None else torch.split(self.in_proj.bias, sizes)
            return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)
        # Only modules with kdim == vdim == input_dim are fused, and forward() refuses key=None for the others.
        assert self.q_proj is not None
        assert self.k_proj is not None
        assert self.v_proj is not None
        assert key is not None
        assert value is not None
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)

    def _combined_mask(self, attn_mask: Tensor | None, key_padding_mask: Tensor | None, t: int, s: int,
                       explicit_causal: bool) -> Tensor | None:
        """One mask for the core, ``(t, s')`` or ``(b|1, h|1, t, s')``, with the appended key positions
        (bias_k/bias_v, zero attention) always allowed. The causal mask is built here only when extra
        keys exist; otherwise the core applies ``is_causal`` itself (and may use a fused kernel)."""
        mask = attn_mask
        if mask is not None and mask.ndim == 3:
            mask = rearrange(mask, "b t s -> b 1 t s")
        if key_padding_mask is not None:
            if mask is not None and mask.ndim == 2:
                mask = rearrange(mask, "t s -> 1 1 t s")
            mask = merge_masks(mask, key_padding_mask)
        if explicit_causal:
            mask = merge_causal(mask, t, s, device=self.out_proj.weight.device)
        if mask is not None and self.extra_keys:
            mask = F.pad(mask, (0, self.extra_keys), value=True if mask.dtype == torch.bool else 0.0)
        return mask
