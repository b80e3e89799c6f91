"""The Transformer's layers and stacks, equal to ``torch.nn.Transformer*`` ("Attention Is All You Need").

Position-wise feed-forward network (section 3.3, eq. 2; the activation is ReLU in the paper):

    FFN(x) = act(x W_1 + b_1) W_2 + b_2                      x (b, t, d_model), W_1 (d_model, dim_feedforward)

Encoder layer, post-LN (the paper's, torch's default) and pre-LN (``norm_first=True``):

    post-LN:  x = LN_1(x + SA(x));        x = LN_2(x + FFN(x))
    pre-LN:   x = x + SA(LN_1(x));        x = x + FFN(LN_2(x))

Decoder layer: self-attention over the target (LN_1), cross-attention from the target to the encoder
output ``memory`` (LN_2), feed-forward (LN_3), in the same post-LN or pre-LN arrangement. Dropout is
applied to each sub-layer's output before the residual sum, and inside FFN after the activation, exactly
where torch applies it. LayerNorm is ``torch.nn.LayerNorm`` itself (biased variance, eps inside the sqrt).

Shapes (batch-first only): source ``(b, s, d_model)``, target ``(b, t, d_model)``, output ``(b, t,
d_model)``. Masks follow the library's convention (see :mod:`typed_transformer.masks`): boolean masks are
keep-masks (True = may attend), float masks are added to the logits, key padding masks are True for real
tokens, and every ``is_causal`` flag is real (bottom-right aligned, ANDed with the masks). torch's
``is_causal`` arguments are hints that need a matching mask; here a flag alone is enough.

Differences from torch, on purpose:

* :class:`Transformer` builds the final ``encoder.norm``/``decoder.norm`` as torch does (``final_norms=True``),
  which with post-LN puts two LayerNorms in a row (pytorch#24930); ``final_norms=False`` leaves them out.
* A stack deep-copies its layer as torch does (all layers start identical); :class:`Transformer` then
  re-initialises every matrix with xavier-uniform, as ``nn.Transformer`` does, but leaves custom encoders
  and decoders as they are (torch re-initialises those too).
* Arguments after ``dropout`` are keyword-only: torch's positional ``batch_first`` does not exist here.
* State-dict names are torch's but for two renames: the feed-forward linears sit in ``feed_forward``
  (torch: ``linear1``/``linear2`` on the layer) and the fused projection is a Linear (``in_proj.weight``,
  torch: ``in_proj_weight``). ``typed_transformer.from_torch``/``to_torch`` map them.
"""

import copy
import math
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from ._activations import Activation, activation_fn, activation_name
from ._activations import ActivationName as ActivationName  # its earlier home: `from typed_transformer.layers import`
from .attention import Backend
from .multihead import MultiHeadAttention
from .positions import RotaryEmbedding
from .shapecheck import shape_checked
from .validation import check_parameter_dtype, check_positive_int

__all__ = [
    "Activation",
    "FeedForward",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]

# Masks of the three attentions, in MultiHeadAttention's layouts: (t, s), (b, t, s) or (b|1, h|1, t, s).
SourceMask: TypeAlias = (
    Bool[Tensor, "s s"] | Float[Tensor, "s s"] | Bool[Tensor, "b s s"] | Float[Tensor, "b s s"]
    | Bool[Tensor, "#b #{self.nhead} s s"] | Float[Tensor, "#b #{self.nhead} s s"]
)
TargetMask: TypeAlias = (
    Bool[Tensor, "t t"] | Float[Tensor, "t t"] | Bool[Tensor, "b t t"] | Float[Tensor, "b t t"]
    | Bool[Tensor, "#b #{self.nhead} t t"] | Float[Tensor, "#b #{self.nhead} t t"]
)
MemoryMask: TypeAlias = (
    Bool[Tensor, "t s"] | Float[Tensor, "t s"] | Bool[Tensor, "b t s"] | Float[Tensor, "b t s"]
    | Bool[Tensor, "#b #{self.nhead} t s"] | Float[Tensor, "#b #{self.nhead} t s"]
)


def _check_sizes(owner: str, d_model: int, nhead: int, dim_feedforward: int, dropout: float,
                 layer_norm_eps: float, dtype: torch.dtype | None = None) -> None:
    check_parameter_dtype(owner, dtype)
    for name, size in (("d_model", d_model), ("nhead", nhead), ("dim_feedforward", dim_feedforward)):
        check_positive_int(owner, name, size)
    if d_model % nhead != 0:
        raise ValueError(f"{owner}: d_model={d_model} is not divisible by nhead={nhead}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{owner}: dropout must be in [0, 1), got {dropout}")
    if not (math.isfinite(layer_norm_eps) and layer_norm_eps > 0.0):
        raise ValueError(f"{owner}: layer_norm_eps must be a finite number > 0, got {layer_norm_eps}")


# ----------------------------------------------------------------------------------------------------
# Feed-forward
# ----------------------------------------------------------------------------------------------------


@shape_checked
class FeedForward(nn.Module):
    """Position-wise feed-forward network ``linear2(dropout(act(linear1(x))))``, ``(b, t, d_model)`` in
    and out. ``activation``: ``"relu"``, ``"gelu"`` (exact), ``"gelu_tanh"`` or any unary callable."""

    __same_dtype__ = ("x",)  # inputs that must have the parameters' dtype (shapecheck)

    def __init__(self, d_model: int, dim_feedforward: int, *, dropout: float = 0.0, activation: Activation = "relu",
                 bias: bool = True, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _check_sizes("FeedForward", d_model, 1, dim_feedforward, dropout, 1.0, dtype)
        self.d_model = d_model
        self.dim_feedforward = dim_feedforward
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.activation = activation_fn("FeedForward", activation)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"activation={activation_name(self.activation)}"  # a name, or the callable's own repr

    def forward(self, x: Float[Tensor, "b t {self.d_model}"]) -> Float[Tensor, "b t {self.d_model}"]:
        out: Tensor = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return out

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward


# ----------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------


@shape_checked
class TransformerEncoderLayer(nn.Module):
    """Self-attention and feed-forward, each with a residual connection and LayerNorm (post-LN, or pre-LN
    with ``norm_first=True``). Arguments as ``nn.TransformerEncoderLayer``, batch-first; ``rotary`` rotates
    the self-attention's queries and keys (RoPE) and ``backend`` picks the attention core."""

    __same_dtype__ = ("src",)  # inputs that must have the parameters' dtype (shapecheck)

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, *,
                 activation: Activation = "relu", layer_norm_eps: float = 1e-5, norm_first: bool = False,
                 bias: bool = True, rotary: RotaryEmbedding | None = None, backend: Backend = "sdpa",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _check_sizes("TransformerEncoderLayer", d_model, nhead, dim_feedforward, dropout, layer_norm_eps, dtype)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.nhead = nhead
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias, rotary=rotary,
                                            backend=backend, **factory)
        self.feed_forward = FeedForward(d_model, dim_feedforward, dropout=dropout, activation=activation,
                                        bias=bias, **factory)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, nhead={self.nhead}, norm_first={self.norm_first}"

    def forward(
        self,
        src: Float[Tensor, "b s {self.d_model}"],
        src_mask: SourceMask | None = None,
        src_key_padding_mask: Bool[Tensor, "b s"] | None = None,
        is_causal: bool = False,
    ) -> Float[Tensor, "b s {self.d_model}"]:
        """``src (b, s, d_model)``; ``src_mask`` ``(s, s)``, ``(b, s, s)`` or ``(b, h, s, s)``;
        ``src_key_padding_mask (b, s)``, True = real token; ``is_causal``: position i sees keys <= i."""
        x: Tensor = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward

    def _sa_block(self, x: Tensor, mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, attn_mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)
        result: Tensor = self.dropout1(out)
        return result



@shape_checked
class TransformerDecoderLayer(nn.Module):
    """Masked self-attention over the target, cross-attention to ``memory`` (the encoder output) and
    feed-forward, each with a residual connection and LayerNorm. Arguments as
    ``nn.TransformerDecoderLayer``, batch-first; ``rotary`` applies to the self-attention only."""

    __same_dtype__ = ("tgt", "memory")  # inputs that must have the parameters' dtype (shapecheck)

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, *,
                 activation: Activation = "relu", layer_norm_eps: float = 1e-5, norm_first: bool = False,
                 bias: bool = True, rotary: RotaryEmbedding | None = None, backend: Backend = "sdpa",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        _check_sizes("TransformerDecoderLayer", d_model, nhead, dim_feedforward, dropout, layer_norm_eps, dtype)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.nhead = nhead
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias, rotary=rotary,
                                            backend=backend, **factory)
        self.multihead_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias, backend=backend,
                                                 **factory)
        self.feed_forward = FeedForward(d_model, dim_feedforward, dropout=dropout, activation=activation,
                                        bias=bias, **factory)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, nhead={self.nhead}, norm_first={self.norm_first}"

    def forward(
        self,
        tgt: Float[Tensor, "b t {self.d_model}"],
        memory: Float[Tensor, "b s {self.d_model}"],
        tgt_mask: TargetMask | None = None,
        memory_mask: MemoryMask | None = None,
        tgt_key_padding_mask: Bool[Tensor, "b t"] | None = None,
        memory_key_padding_mask: Bool[Tensor, "b s"] | None = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Float[Tensor, "b t {self.d_model}"]:
        """``tgt (b, t, d_model)``, ``memory (b, s, d_model)``; ``tgt_mask`` over ``(t, t)``,
        ``memory_mask`` over ``(t, s)``; padding masks True = real token; causal flags bottom-right."""
        x: Tensor = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward

    def _sa_block(self, x: Tensor, mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, attn_mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)
        result: Tensor = self.dropout1(out)
        return result

    def _mha_block(self, x: Tensor, memory: Tensor, mask: Tensor | None, key_padding_mask: Tensor | None,
                   is_causal: bool) -> Tensor:
        out, _ = self.multihead_attn(x, memory, attn_mask=mask, key_padding_mask=key_padding_mask,
                                     is_causal=is_causal)  # value = key = memory
        result: Tensor = self.dropout2(out)
        return result



# ----------------------------------------------------------------------------------------------------
# Stacks
# ----------------------------------------------------------------------------------------------------


class _Stack(nn.Module):
    """What the encoder and decoder stacks share: ``num_layers`` deep copies of one layer (identical at the
    start, as in torch), then an optional final ``norm``. Each subclass adds its ``forward``."""

    _layer_type: type[nn.Module]
    _layer_argument: str
    norm: nn.Module | None

    def __init__(self, layer: TransformerEncoderLayer | TransformerDecoderLayer, num_layers: int,
                 norm: nn.Module | None) -> None:
        super().__init__()
        owner = type(self).__name__
        if not isinstance(layer, self._layer_type):
            raise TypeError(f"{owner}: {self._layer_argument} must be a typed_transformer {self._layer_type.__name__}, "
                            f"got {type(layer).__name__} (convert torch's with from_torch)")
        check_positive_int(owner, "num_layers", num_layers)
        self.d_model = layer.d_model
        self.nhead = layer.nhead
        self.num_layers = num_layers
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))
        self.norm = norm

    def _final_norm(self, x: Tensor) -> Tensor:
        return x if self.norm is None else self.norm(x)


@shape_checked
class TransformerEncoder(_Stack):
    """``num_layers`` deep copies of ``encoder_layer`` (identical at the start, as in torch), then the
    optional final ``norm``. ``(b, s, d_model)`` in and out."""

    __same_dtype__ = ("src",)  # inputs that must have the parameters' dtype (shapecheck)

    _layer_type = TransformerEncoderLayer
    _layer_argument = "encoder_layer"

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: nn.Module | None = None) -> None:
        super().__init__(encoder_layer, num_layers, norm)

    def forward(
        self,
        src: Float[Tensor, "b s {self.d_model}"],
        mask: SourceMask | None = None,
        src_key_padding_mask: Bool[Tensor, "b s"] | None = None,
        is_causal: bool = False,
    ) -> Float[Tensor, "b s {self.d_model}"]:
        """Every layer with the same masks; ``is_causal`` is a real flag (torch's is a hint)."""
        x = src
        for layer in self.layers:
            x = layer(x, mask, src_key_padding_mask, is_causal)
        return self._final_norm(x)

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward



@shape_checked
class TransformerDecoder(_Stack):
    """``num_layers`` deep copies of ``decoder_layer``, then the optional final ``norm``.
    ``tgt (b, t, d_model)`` and ``memory (b, s, d_model)`` in, ``(b, t, d_model)`` out."""

    __same_dtype__ = ("tgt", "memory")  # inputs that must have the parameters' dtype (shapecheck)

    _layer_type = TransformerDecoderLayer
    _layer_argument = "decoder_layer"

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: nn.Module | None = None) -> None:
        super().__init__(decoder_layer, num_layers, norm)

    def forward(
        self,
        tgt: Float[Tensor, "b t {self.d_model}"],
        memory: Float[Tensor, "b s {self.d_model}"],
        tgt_mask: TargetMask | None = None,
        memory_mask: MemoryMask | None = None,
        tgt_key_padding_mask: Bool[Tensor, "b t"] | None = None,
        memory_key_padding_mask: Bool[Tensor, "b s"] | None = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Float[Tensor, "b t {self.d_model}"]:
        """Every layer with the same memory and masks; the causal flags are real (torch's are hints)."""
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                      tgt_is_causal, memory_is_causal)
        return self._final_norm(x)

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward



@shape_checked
class Transformer(nn.Module):
    """The encoder-decoder of "Attention Is All You Need", with ``nn.Transformer``'s arguments:

        memory = Encoder(src),   out = Decoder(tgt, memory)       src (b, s, d_model), tgt (b, t, d_model)

    ``final_norms=True`` (torch's behaviour) ends both stacks with a LayerNorm; ``rotary`` gives every
    self-attention rotary position embeddings. Like torch, inputs are already embedded: see
    :class:`typed_transformer.seq2seq.Seq2SeqTransformer` for tokens in, logits out.
    """

    __same_dtype__ = ("src", "tgt")  # inputs that must have the parameters' dtype (shapecheck)

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        *,
        activation: Activation = "relu",
        custom_encoder: TransformerEncoder | None = None,
        custom_decoder: TransformerDecoder | None = None,
        layer_norm_eps: float = 1e-5,
        norm_first: bool = False,
        bias: bool = True,
        final_norms: bool = True,
        rotary: RotaryEmbedding | None = None,
        backend: Backend = "sdpa",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _check_sizes("Transformer", d_model, nhead, dim_feedforward, dropout, layer_norm_eps, dtype)
        self.d_model = d_model
        self.nhead = nhead
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        layer_kwargs: dict[str, Any] = {"activation": activation, "layer_norm_eps": layer_norm_eps,
                                        "norm_first": norm_first, "bias": bias, "rotary": rotary,
                                        "backend": backend, **factory}
        built: list[nn.Module] = []
        if custom_encoder is None:
            encoder_layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, **layer_kwargs)
            encoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory) if final_norms else None
            custom_encoder = TransformerEncoder(encoder_layer, num_encoder_layers, encoder_norm)
            built.append(custom_encoder)
        if custom_decoder is None:
            decoder_layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, **layer_kwargs)
            decoder_norm = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory) if final_norms else None
            custom_decoder = TransformerDecoder(decoder_layer, num_decoder_layers, decoder_norm)
            built.append(custom_decoder)
        parts: tuple[tuple[str, nn.Module, type], ...] = (("custom_encoder", custom_encoder, TransformerEncoder),
                                                          ("custom_decoder", custom_decoder, TransformerDecoder))
        for name, part, kind in parts:
            if not isinstance(part, kind):
                raise TypeError(f"Transformer: {name} must be a typed_transformer {kind.__name__}, "
                                f"got {type(part).__name__}")
            if part.d_model != d_model:
                raise ValueError(f"Transformer: {name}.d_model={part.d_model} does not match d_model={d_model}")
        self.encoder = custom_encoder
        self.decoder = custom_decoder
        # nn.Transformer's initialisation, which also makes the deep-copied layers differ from each other.
        for module in built:
            for param in module.parameters():
                if param.dim() > 1:
                    nn.init.xavier_uniform_(param)

    def forward(
        self,
        src: Float[Tensor, "b s {self.d_model}"],
        tgt: Float[Tensor, "b t {self.d_model}"],
        src_mask: SourceMask | None = None,
        tgt_mask: TargetMask | None = None,
        memory_mask: MemoryMask | None = None,
        src_key_padding_mask: Bool[Tensor, "b s"] | None = None,
        tgt_key_padding_mask: Bool[Tensor, "b t"] | None = None,
        memory_key_padding_mask: Bool[Tensor, "b s"] | None = None,
        src_is_causal: bool = False,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Float[Tensor, "b t {self.d_model}"]:
        """Arguments as ``nn.Transformer.forward``, batch-first, masks in our convention. As in torch,
        ``memory_key_padding_mask`` is separate: pass ``src_key_padding_mask`` again to hide padded sources."""
        memory = self.encoder(src, src_mask, src_key_padding_mask, src_is_causal)
        out: Tensor = self.decoder(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                                   tgt_is_causal, memory_is_causal)
        return out

    if TYPE_CHECKING:  # calls type-check as forward (nn.Module.__call__ is untyped)
        __call__ = forward

