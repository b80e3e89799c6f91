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
  torch: ``in_proj_weight``). ``from_torch``/``to_torch`` map them.
"""

import copy
import math
import warnings
from collections.abc import Callable
from typing import Any, Literal, Self, TypeAlias, cast

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

from .attention import Backend
from .multihead import MultiHeadAttention
from .positions import RotaryEmbedding
from .shapecheck import shape_checked

__all__ = [
    "Activation",
    "FeedForward",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]

ActivationName = Literal["relu", "gelu", "gelu_tanh"]
#: ``"relu"``, ``"gelu"`` (exact, ``x * Phi(x)``), ``"gelu_tanh"`` (GPT-2's approximation) or any callable.
Activation: TypeAlias = ActivationName | Callable[[Tensor], Tensor]

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


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": _gelu_tanh}


def _activation_fn(owner: str, activation: Activation) -> Callable[[Tensor], Tensor]:
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"{owner}: activation must be 'relu', 'gelu', 'gelu_tanh' or a callable, "
                             f"got {activation!r}")
        return _ACTIVATIONS[activation]
    if not callable(activation):
        raise ValueError(f"{owner}: activation must be 'relu', 'gelu', 'gelu_tanh' or a callable, got {activation!r}")
    return activation


def _activation_name(fn: Callable[[Tensor], Tensor]) -> Activation:
    """The name of a known activation (torch's ``F.relu``, ``nn.GELU()``, ...), else the callable itself."""
    if fn is F.relu or isinstance(fn, nn.ReLU):
        return "relu"
    if fn is F.gelu or (isinstance(fn, nn.GELU) and fn.approximate == "none"):
        return "gelu"
    if fn is _gelu_tanh or (isinstance(fn, nn.GELU) and fn.approximate == "tanh"):
        return "gelu_tanh"
    return fn


def _check_sizes(owner: str, d_model: int, nhead: int, dim_feedforward: int, dropout: float,
                 layer_norm_eps: float) -> None:
    for name, size in (("d_model", d_model), ("nhead", nhead), ("dim_feedforward", dim_feedforward)):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"{owner}: {name} must be a positive int, got {size!r}")
    if d_model % nhead != 0:
        raise ValueError(f"{owner}: d_model={d_model} is not divisible by nhead={nhead}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"{owner}: dropout must be in [0, 1), got {dropout}")
    if not (math.isfinite(layer_norm_eps) and layer_norm_eps > 0.0):
        raise ValueError(f"{owner}: layer_norm_eps must be a finite number > 0, got {layer_norm_eps}")


def _factory(module: nn.Module) -> dict[str, Any]:
    reference = next(module.parameters())
    return {"device": reference.device, "dtype": reference.dtype}


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
        _check_sizes("FeedForward", d_model, 1, dim_feedforward, dropout, 1.0)
        self.d_model = d_model
        self.dim_feedforward = dim_feedforward
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.activation = _activation_fn("FeedForward", activation)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"activation={_activation_name(self.activation)}"  # a name, or the callable's own repr

    def forward(self, x: Float[Tensor, "b t {self.d_model}"]) -> Float[Tensor, "b t {self.d_model}"]:
        out: Tensor = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return out


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
        _check_sizes("TransformerEncoderLayer", d_model, nhead, dim_feedforward, dropout, layer_norm_eps)
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

    def _sa_block(self, x: Tensor, mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, attn_mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)
        result: Tensor = self.dropout1(out)
        return result

    @classmethod
    def from_torch(cls, module: nn.TransformerEncoderLayer, *, backend: Backend = "sdpa") -> Self:
        """Copy an ``nn.TransformerEncoderLayer`` (post-LN or pre-LN, any activation, bias on or off, either
        ``batch_first``). The copy is batch-first and takes masks in our convention."""
        if not isinstance(module, nn.TransformerEncoderLayer):
            raise TypeError(f"from_torch: expected nn.TransformerEncoderLayer, got {type(module).__name__}")
        ours = cls(module.self_attn.embed_dim, module.self_attn.num_heads, module.linear1.out_features,
                   module.dropout.p, activation=_activation_name(module.activation), norm_first=module.norm_first,
                   bias=module.linear1.bias is not None, backend=backend, **_factory(module))
        ours.self_attn = MultiHeadAttention.from_torch(module.self_attn, backend=backend)
        _copy_feed_forward_and_norms(module, ours, ("norm1", "norm2"))
        return ours.train(module.training)

    def to_torch(self, *, batch_first: bool = True) -> nn.TransformerEncoderLayer:
        """The equivalent ``nn.TransformerEncoderLayer`` (masks in torch's convention). Raises ValueError
        for a layer with rotary embeddings, which torch does not have."""
        _refuse_rotary(self.self_attn)
        module = nn.TransformerEncoderLayer(**_torch_layer_kwargs(self, batch_first))
        module.self_attn.load_state_dict(self.self_attn.to_torch(batch_first=batch_first).state_dict())
        _copy_feed_forward_and_norms(self, module, ("norm1", "norm2"))
        return module.train(self.training)


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
        _check_sizes("TransformerDecoderLayer", d_model, nhead, dim_feedforward, dropout, layer_norm_eps)
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

    @classmethod
    def from_torch(cls, module: nn.TransformerDecoderLayer, *, backend: Backend = "sdpa") -> Self:
        """Copy an ``nn.TransformerDecoderLayer`` (post-LN or pre-LN, any activation, bias on or off, either
        ``batch_first``). The copy is batch-first and takes masks in our convention."""
        if not isinstance(module, nn.TransformerDecoderLayer):
            raise TypeError(f"from_torch: expected nn.TransformerDecoderLayer, got {type(module).__name__}")
        ours = cls(module.self_attn.embed_dim, module.self_attn.num_heads, module.linear1.out_features,
                   module.dropout.p, activation=_activation_name(module.activation), norm_first=module.norm_first,
                   bias=module.linear1.bias is not None, backend=backend, **_factory(module))
        ours.self_attn = MultiHeadAttention.from_torch(module.self_attn, backend=backend)
        ours.multihead_attn = MultiHeadAttention.from_torch(module.multihead_attn, backend=backend)
        _copy_feed_forward_and_norms(module, ours, ("norm1", "norm2", "norm3"))
        return ours.train(module.training)

    def to_torch(self, *, batch_first: bool = True) -> nn.TransformerDecoderLayer:
        """The equivalent ``nn.TransformerDecoderLayer`` (masks in torch's convention). Raises ValueError
        for a layer with rotary embeddings, which torch does not have."""
        _refuse_rotary(self.self_attn)
        module = nn.TransformerDecoderLayer(**_torch_layer_kwargs(self, batch_first))
        module.self_attn.load_state_dict(self.self_attn.to_torch(batch_first=batch_first).state_dict())
        module.multihead_attn.load_state_dict(self.multihead_attn.to_torch(batch_first=batch_first).state_dict())
        _copy_feed_forward_and_norms(self, module, ("norm1", "norm2", "norm3"))
        return module.train(self.training)


def _refuse_rotary(attention: MultiHeadAttention) -> None:
    if attention.rotary is not None:
        raise ValueError("to_torch: torch's Transformer layers have no rotary embeddings (rotary is set)")


def _torch_layer_kwargs(layer: TransformerEncoderLayer | TransformerDecoderLayer, batch_first: bool) -> dict[str, Any]:
    ff = layer.feed_forward
    # torch's fast path computes exact GELU for any nn.GELU, nn.GELU("tanh") included: tanh-GELU goes over as
    # our plain function, which keeps torch off that path. Everything else as it is (torch's fast path knows
    # F.relu, F.gelu, nn.ReLU and nn.GELU() by identity or type).
    activation = _gelu_tanh if _activation_name(ff.activation) == "gelu_tanh" else ff.activation
    return {"d_model": layer.d_model, "nhead": layer.nhead, "dim_feedforward": ff.dim_feedforward,
            "dropout": ff.dropout.p, "activation": activation, "layer_norm_eps": layer.norm1.eps,
            "batch_first": batch_first, "norm_first": layer.norm_first, "bias": ff.linear1.bias is not None,
            **_factory(layer)}


def _copy_feed_forward_and_norms(source: nn.Module, target: nn.Module, norms: tuple[str, ...]) -> None:
    """Copy linear1/linear2 and the LayerNorms between a torch layer (where they sit on the layer) and
    ours (where the linears sit in ``feed_forward``), in either direction."""
    def linears(layer: nn.Module) -> nn.Module:
        return layer.feed_forward if isinstance(layer, TransformerEncoderLayer | TransformerDecoderLayer) else layer

    for name in ("linear1", "linear2"):
        getattr(linears(target), name).load_state_dict(getattr(linears(source), name).state_dict())
    for name in norms:
        getattr(target, name).load_state_dict(getattr(source, name).state_dict())
        getattr(target, name).eps = getattr(source, name).eps


# ----------------------------------------------------------------------------------------------------
# Stacks
# ----------------------------------------------------------------------------------------------------


def _check_num_layers(owner: str, num_layers: int) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
        raise ValueError(f"{owner}: num_layers must be a positive int, got {num_layers!r}")


@shape_checked
class TransformerEncoder(nn.Module):
    """``num_layers`` deep copies of ``encoder_layer`` (identical at the start, as in torch), then the
    optional final ``norm``. ``(b, s, d_model)`` in and out."""

    __same_dtype__ = ("src",)  # inputs that must have the parameters' dtype (shapecheck)

    norm: nn.Module | None

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: nn.Module | None = None) -> None:
        super().__init__()
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            raise TypeError(f"TransformerEncoder: encoder_layer must be a typed_transformer TransformerEncoderLayer, "
                            f"got {type(encoder_layer).__name__} (convert torch's with from_torch)")
        _check_num_layers("TransformerEncoder", num_layers)
        self.d_model = encoder_layer.d_model
        self.nhead = encoder_layer.nhead
        self.num_layers = num_layers
        self.layers = nn.ModuleList(copy.deepcopy(encoder_layer) for _ in range(num_layers))
        self.norm = norm

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
        return x if self.norm is None else self.norm(x)

    @classmethod
    def from_torch(cls, module: nn.TransformerEncoder, *, backend: Backend = "sdpa") -> Self:
        """Copy an ``nn.TransformerEncoder`` layer by layer, with its final norm (any module) if it has one."""
        if not isinstance(module, nn.TransformerEncoder):
            raise TypeError(f"from_torch: expected nn.TransformerEncoder, got {type(module).__name__}")
        layers = [TransformerEncoderLayer.from_torch(layer, backend=backend) for layer in module.layers]
        ours = cls(layers[0], len(layers), copy.deepcopy(module.norm))
        ours.layers = nn.ModuleList(layers)
        return ours.train(module.training)

    def to_torch(self, *, batch_first: bool = True) -> nn.TransformerEncoder:
        """The equivalent ``nn.TransformerEncoder`` (with torch's nested-tensor fast path where it applies)."""
        layers = [cast(TransformerEncoderLayer, layer).to_torch(batch_first=batch_first) for layer in self.layers]
        with warnings.catch_warnings():
            # torch explains, at construction, why its nested-tensor path cannot run for this configuration.
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            module = nn.TransformerEncoder(layers[0], self.num_layers, copy.deepcopy(self.norm))
        module.layers = nn.ModuleList(layers)
        return module.train(self.training)


@shape_checked
class TransformerDecoder(nn.Module):
    """``num_layers`` deep copies of ``decoder_layer``, then the optional final ``norm``.
    ``tgt (b, t, d_model)`` and ``memory (b, s, d_model)`` in, ``(b, t, d_model)`` out."""

    __same_dtype__ = ("tgt", "memory")  # inputs that must have the parameters' dtype (shapecheck)

    norm: nn.Module | None

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: nn.Module | None = None) -> None:
        super().__init__()
        if not isinstance(decoder_layer, TransformerDecoderLayer):
            raise TypeError(f"TransformerDecoder: decoder_layer must be a typed_transformer TransformerDecoderLayer, "
                            f"got {type(decoder_layer).__name__} (convert torch's with from_torch)")
        _check_num_layers("TransformerDecoder", num_layers)
        self.d_model = decoder_layer.d_model
        self.nhead = decoder_layer.nhead
        self.num_layers = num_layers
        self.layers = nn.ModuleList(copy.deepcopy(decoder_layer) for _ in range(num_layers))
        self.norm = norm

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
        return x if self.norm is None else self.norm(x)

    @classmethod
    def from_torch(cls, module: nn.TransformerDecoder, *, backend: Backend = "sdpa") -> Self:
        """Copy an ``nn.TransformerDecoder`` layer by layer, with its final norm (any module) if it has one."""
        if not isinstance(module, nn.TransformerDecoder):
            raise TypeError(f"from_torch: expected nn.TransformerDecoder, got {type(module).__name__}")
        layers = [TransformerDecoderLayer.from_torch(layer, backend=backend) for layer in module.layers]
        ours = cls(layers[0], len(layers), copy.deepcopy(module.norm))
        ours.layers = nn.ModuleList(layers)
        return ours.train(module.training)

    def to_torch(self, *, batch_first: bool = True) -> nn.TransformerDecoder:
        """The equivalent ``nn.TransformerDecoder``."""
        layers = [cast(TransformerDecoderLayer, layer).to_torch(batch_first=batch_first) for layer in self.layers]
        module = nn.TransformerDecoder(layers[0], self.num_layers, copy.deepcopy(self.norm))
        module.layers = nn.ModuleList(layers)
        return module.train(self.training)


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
        _check_sizes("Transformer", d_model, nhead, dim_feedforward, dropout, layer_norm_eps)
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

    @classmethod
    def from_torch(cls, module: nn.Transformer, *, backend: Backend = "sdpa") -> Self:
        """Copy an ``nn.Transformer`` (both stacks, with their final norms)."""
        if not isinstance(module, nn.Transformer):
            raise TypeError(f"from_torch: expected nn.Transformer, got {type(module).__name__}")
        encoder = TransformerEncoder.from_torch(module.encoder, backend=backend)
        decoder = TransformerDecoder.from_torch(module.decoder, backend=backend)
        ours = cls(encoder.d_model, encoder.nhead, custom_encoder=encoder, custom_decoder=decoder, backend=backend,
                   **_factory(module))
        return ours.train(module.training)

    def to_torch(self, *, batch_first: bool = True) -> nn.Transformer:
        """The equivalent ``nn.Transformer``."""
        encoder = self.encoder.to_torch(batch_first=batch_first)
        decoder = self.decoder.to_torch(batch_first=batch_first)
        # nn.Transformer re-initialises custom encoders and decoders in place: build it around parameter-free
        # placeholders, then put the copies in.
        module = nn.Transformer(self.d_model, self.nhead, custom_encoder=nn.Identity(), custom_decoder=nn.Identity(),
                                batch_first=batch_first)
        module.encoder, module.decoder = encoder, decoder
        return module.train(self.training)
