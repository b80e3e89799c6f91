"""Interop with ``torch.nn``: copy torch's attention, layers and stacks into ours, and ours back into torch's.

    ours = from_torch(torch_module)        torch_module = to_torch(ours)        (same weights, same outputs)

Every copy shares no tensor with its source. What the conversions map:

* ``nn.MultiheadAttention`` <-> :class:`~typed_transformer.multihead.MultiHeadAttention`: packed
  (``in_proj_weight``) or separate q/k/v weights, bias on or off, ``bias_k``/``bias_v`` (torch ``(1, 1, e)``,
  ours ``(e,)``), ``add_zero_attn``, dropout, either ``batch_first`` (ours is always batch-first). torch
  cannot express grouped-query heads or a query width ``input_dim != d_model``: :func:`to_torch`
  refuses them.
* ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` <-> ours: torch keeps ``linear1``/``linear2``
  on the layer, ours in ``feed_forward``; the activation goes over by name (``"relu"``, ``"gelu"``,
  ``"gelu_tanh"``) or as the callable itself. torch's layers have no rotary embeddings: :func:`to_torch`
  refuses a layer that has them.
* ``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` / ``nn.Transformer`` <-> ours: layer by layer, with
  the final norms.

Masks are not converted here: the copies take masks in their own library's convention (see
:mod:`typed_transformer.masks` for ``attn_mask_from_torch`` and friends).

:func:`from_torch` and :func:`to_torch` are the two entry points; their overloads give each input type its
exact result type. The earlier spellings still work and warn (``DeprecationWarning``): the per-kind functions
(``multihead_from_torch``, ``encoder_layer_to_torch``, ...) and the classes' ``from_torch`` classmethods and
``to_torch`` methods, which this module attaches to the classes (the classes themselves know nothing of
interop: this module imports them, never the reverse).
"""

import copy
import warnings
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast, overload

import torch
from einops import rearrange
from torch import nn

from ._activations import activation_name, gelu_tanh
from ._deprecation import warn_deprecated
from .attention import Backend
from .layers import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .multihead import MultiHeadAttention

__all__ = ["from_torch", "to_torch"]


_MHA = TypeVar("_MHA", bound=MultiHeadAttention)
_EncoderLayer = TypeVar("_EncoderLayer", bound=TransformerEncoderLayer)
_DecoderLayer = TypeVar("_DecoderLayer", bound=TransformerDecoderLayer)
_Encoder = TypeVar("_Encoder", bound=TransformerEncoder)
_Decoder = TypeVar("_Decoder", bound=TransformerDecoder)
_Transformer = TypeVar("_Transformer", bound=Transformer)
_P = ParamSpec("_P")
_R = TypeVar("_R")


# ----------------------------------------------------------------------------------------------------
# The two entry points
# ----------------------------------------------------------------------------------------------------


@overload
def from_torch(module: nn.MultiheadAttention, *, backend: Backend = "sdpa") -> MultiHeadAttention: ...
@overload
def from_torch(module: nn.TransformerEncoderLayer, *, backend: Backend = "sdpa") -> TransformerEncoderLayer: ...
@overload
def from_torch(module: nn.TransformerDecoderLayer, *, backend: Backend = "sdpa") -> TransformerDecoderLayer: ...
@overload
def from_torch(module: nn.TransformerEncoder, *, backend: Backend = "sdpa") -> TransformerEncoder: ...
@overload
def from_torch(module: nn.TransformerDecoder, *, backend: Backend = "sdpa") -> TransformerDecoder: ...
@overload
def from_torch(module: nn.Transformer, *, backend: Backend = "sdpa") -> Transformer: ...
def from_torch(module: nn.Module, *, backend: Backend = "sdpa") -> nn.Module:
    """Our copy of a torch module this library mirrors, with the same weights and no shared tensor:
    ``nn.MultiheadAttention`` (packed or separate q/k/v weights, bias on or off, ``bias_k``/``bias_v``,
    ``add_zero_attn``, either ``batch_first``), ``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``
    (post-LN or pre-LN, any activation, bias on or off), ``nn.TransformerEncoder``, ``nn.TransformerDecoder``
    (layer by layer, with the final norm, any module, if there is one) or ``nn.Transformer``.

    The copy is batch-first whatever ``module.batch_first`` says, keeps ``module.training``, runs its
    attention with ``backend``, and takes masks in our convention: convert torch's with
    :func:`typed_transformer.masks.attn_mask_from_torch` and
    :func:`typed_transformer.masks.key_padding_mask_from_torch`.

    Raises:
        TypeError: ``module`` is none of those.
    """
    for kind, ours, build in _FROM_TORCH:
        if isinstance(module, kind):
            converted: nn.Module = build(ours, module, backend)
            return converted
    names = ", ".join(f"nn.{kind.__name__}" for kind, _, _ in _FROM_TORCH)
    raise TypeError(f"from_torch: expected one of {names}, got {type(module).__name__}")


@overload
def to_torch(module: MultiHeadAttention, *, batch_first: bool = True) -> nn.MultiheadAttention: ...
@overload
def to_torch(module: TransformerEncoderLayer, *, batch_first: bool = True) -> nn.TransformerEncoderLayer: ...
@overload
def to_torch(module: TransformerDecoderLayer, *, batch_first: bool = True) -> nn.TransformerDecoderLayer: ...
@overload
def to_torch(module: TransformerEncoder, *, batch_first: bool = True) -> nn.TransformerEncoder: ...
@overload
def to_torch(module: TransformerDecoder, *, batch_first: bool = True) -> nn.TransformerDecoder: ...
@overload
def to_torch(module: Transformer, *, batch_first: bool = True) -> nn.Transformer: ...
def to_torch(module: nn.Module, *, batch_first: bool = True) -> nn.Module:
    """torch's equivalent of one of our modules that mirror one (:class:`MultiHeadAttention`, the encoder
    and decoder layers and stacks, :class:`Transformer`), with the same weights and no shared tensor. It
    takes masks in torch's convention; ``batch_first`` is the torch module's setting.

    Raises:
        TypeError: ``module`` is none of those.
        ValueError: the module uses what torch cannot express: grouped-query heads or a query width
            ``input_dim != d_model`` (attention), rotary embeddings (layers and stacks).
    """
    for kind, convert in _TO_TORCH:
        if isinstance(module, kind):
            converted: nn.Module = convert(module, batch_first)
            return converted
    names = ", ".join(kind.__name__ for kind, _ in _TO_TORCH)
    raise TypeError(f"to_torch: expected one of {names}, got {type(module).__name__}")


def _expect(module: nn.Module, kind: type[nn.Module]) -> None:
    if not isinstance(module, kind):
        raise TypeError(f"from_torch: expected nn.{kind.__name__}, got {type(module).__name__}")


def _factory(module: nn.Module) -> dict[str, Any]:
    reference = next(module.parameters())
    return {"device": reference.device, "dtype": reference.dtype}


# ----------------------------------------------------------------------------------------------------
# Multi-head attention
# ----------------------------------------------------------------------------------------------------


def _multihead_from_torch(cls: type[_MHA], module: nn.MultiheadAttention, backend: Backend) -> _MHA:
    _expect(module, nn.MultiheadAttention)
    reference = module.out_proj.weight
    ours = cls(module.embed_dim, module.num_heads, kdim=module.kdim, vdim=module.vdim,
               dropout=float(module.dropout), bias=module.in_proj_bias is not None,
               add_bias_kv=module.bias_k is not None, add_zero_attn=module.add_zero_attn,
               backend=backend, device=reference.device, dtype=reference.dtype)
    with torch.no_grad():
        if ours.in_proj is not None:
            assert module.in_proj_weight is not None
            ours.in_proj.weight.copy_(module.in_proj_weight)
            if ours.in_proj.bias is not None:
                ours.in_proj.bias.copy_(module.in_proj_bias)
        else:
            assert ours.q_proj is not None
            assert ours.k_proj is not None
            assert ours.v_proj is not None
            ours.q_proj.weight.copy_(module.q_proj_weight)
            ours.k_proj.weight.copy_(module.k_proj_weight)
            ours.v_proj.weight.copy_(module.v_proj_weight)
            if module.in_proj_bias is not None:
                # torch keeps one packed bias even when the weights are separate.
                assert ours.q_proj.bias is not None
                assert ours.k_proj.bias is not None
                assert ours.v_proj.bias is not None
                q_bias, k_bias, v_bias = module.in_proj_bias.chunk(3)
                ours.q_proj.bias.copy_(q_bias)
                ours.k_proj.bias.copy_(k_bias)
                ours.v_proj.bias.copy_(v_bias)
        ours.out_proj.weight.copy_(module.out_proj.weight)
        if ours.out_proj.bias is not None:
            ours.out_proj.bias.copy_(module.out_proj.bias)
        if ours.bias_k is not None:
            assert ours.bias_v is not None
            assert module.bias_k is not None
            assert module.bias_v is not None
            ours.bias_k.copy_(rearrange(module.bias_k, "1 1 e -> e"))
            ours.bias_v.copy_(rearrange(module.bias_v, "1 1 e -> e"))
    return ours.train(module.training)



def _multihead_to_torch(ours: MultiHeadAttention, batch_first: bool) -> nn.MultiheadAttention:
    if ours.num_kv_heads != ours.num_heads:
        raise ValueError("to_torch: nn.MultiheadAttention has no grouped-query heads "
                         f"(num_kv_heads={ours.num_kv_heads}, num_heads={ours.num_heads})")
    if ours.input_dim != ours.d_model:
        raise ValueError(f"to_torch: nn.MultiheadAttention needs input_dim == d_model, "
                         f"got input_dim={ours.input_dim}, d_model={ours.d_model}")
    reference = ours.out_proj.weight
    module = nn.MultiheadAttention(ours.d_model, ours.num_heads, dropout=ours.dropout,
                                   bias=ours.out_proj.bias is not None, add_bias_kv=ours.bias_k is not None,
                                   add_zero_attn=ours.add_zero_attn, kdim=ours.kdim, vdim=ours.vdim,
                                   batch_first=batch_first, device=reference.device, dtype=reference.dtype)
    with torch.no_grad():
        if ours.in_proj is not None:
            assert module.in_proj_weight is not None
            module.in_proj_weight.copy_(ours.in_proj.weight)
            if ours.in_proj.bias is not None:
                module.in_proj_bias.copy_(ours.in_proj.bias)
        else:
            assert ours.q_proj is not None
            assert ours.k_proj is not None
            assert ours.v_proj is not None
            module.q_proj_weight.copy_(ours.q_proj.weight)
            module.k_proj_weight.copy_(ours.k_proj.weight)
            module.v_proj_weight.copy_(ours.v_proj.weight)
            if module.in_proj_bias is not None:
                assert ours.q_proj.bias is not None
                assert ours.k_proj.bias is not None
                assert ours.v_proj.bias is not None
                module.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        module.out_proj.weight.copy_(ours.out_proj.weight)
        if ours.out_proj.bias is not None:
            module.out_proj.bias.copy_(ours.out_proj.bias)
        if ours.bias_k is not None:
            assert ours.bias_v is not None
            assert module.bias_k is not None
            assert module.bias_v is not None
            module.bias_k.copy_(rearrange(ours.bias_k, "e -> 1 1 e"))
            module.bias_v.copy_(rearrange(ours.bias_v, "e -> 1 1 e"))
    return module.train(ours.training)


# ----------------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------------


def _encoder_layer_from_torch(cls: type[_EncoderLayer], module: nn.TransformerEncoderLayer,
                              backend: Backend) -> _EncoderLayer:
    _expect(module, nn.TransformerEncoderLayer)
    ours = cls(module.self_attn.embed_dim, module.self_attn.num_heads, module.linear1.out_features,
               module.dropout.p, activation=activation_name(module.activation), norm_first=module.norm_first,
               bias=module.linear1.bias is not None, backend=backend, **_factory(module))
    ours.self_attn = _multihead_from_torch(MultiHeadAttention, module.self_attn, backend)
    _copy_feed_forward_and_norms(module, ours, ("norm1", "norm2"))
    return ours.train(module.training)


def _encoder_layer_to_torch(ours: TransformerEncoderLayer, batch_first: bool) -> nn.TransformerEncoderLayer:
    _refuse_rotary(ours.self_attn)
    module = nn.TransformerEncoderLayer(**_torch_layer_kwargs(ours, batch_first))
    module.self_attn.load_state_dict(_multihead_to_torch(ours.self_attn, batch_first).state_dict())
    _copy_feed_forward_and_norms(ours, module, ("norm1", "norm2"))
    return module.train(ours.training)


def _decoder_layer_from_torch(cls: type[_DecoderLayer], module: nn.TransformerDecoderLayer,
                              backend: Backend) -> _DecoderLayer:
    _expect(module, nn.TransformerDecoderLayer)
    ours = cls(module.self_attn.embed_dim, module.self_attn.num_heads, module.linear1.out_features,
               module.dropout.p, activation=activation_name(module.activation), norm_first=module.norm_first,
               bias=module.linear1.bias is not None, backend=backend, **_factory(module))
    ours.self_attn = _multihead_from_torch(MultiHeadAttention, module.self_attn, backend)
    ours.multihead_attn = _multihead_from_torch(MultiHeadAttention, module.multihead_attn, backend)
    _copy_feed_forward_and_norms(module, ours, ("norm1", "norm2", "norm3"))
    return ours.train(module.training)


def _decoder_layer_to_torch(ours: TransformerDecoderLayer, batch_first: bool) -> nn.TransformerDecoderLayer:
    _refuse_rotary(ours.self_attn)
    module = nn.TransformerDecoderLayer(**_torch_layer_kwargs(ours, batch_first))
    module.self_attn.load_state_dict(_multihead_to_torch(ours.self_attn, batch_first).state_dict())
    module.multihead_attn.load_state_dict(_multihead_to_torch(ours.multihead_attn, batch_first).state_dict())
    _copy_feed_forward_and_norms(ours, module, ("norm1", "norm2", "norm3"))
    return module.train(ours.training)


def _refuse_rotary(attention: MultiHeadAttention) -> None:
    if attention.rotary is not None:
        raise ValueError("to_torch: torch's Transformer layers have no rotary embeddings (rotary is set)")


def _torch_layer_kwargs(layer: TransformerEncoderLayer | TransformerDecoderLayer, batch_first: bool) -> dict[str, Any]:
    ff = layer.feed_forward
    # torch's fast path computes exact GELU for any nn.GELU, nn.GELU("tanh") included: tanh-GELU goes over as
    # our plain function, which keeps torch off that path. Everything else as it is (torch's fast path knows
    # F.relu, F.gelu, nn.ReLU and nn.GELU() by identity or type).
    activation = gelu_tanh if activation_name(ff.activation) == "gelu_tanh" else ff.activation
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


def _encoder_from_torch(cls: type[_Encoder], module: nn.TransformerEncoder, backend: Backend) -> _Encoder:
    _expect(module, nn.TransformerEncoder)
    layers = [_encoder_layer_from_torch(TransformerEncoderLayer, layer, backend) for layer in module.layers]
    ours = cls(layers[0], len(layers), copy.deepcopy(module.norm))
    ours.layers = nn.ModuleList(layers)
    return ours.train(module.training)


def _encoder_to_torch(ours: TransformerEncoder, batch_first: bool) -> nn.TransformerEncoder:
    layers = [_encoder_layer_to_torch(cast(TransformerEncoderLayer, layer), batch_first) for layer in ours.layers]
    with warnings.catch_warnings():
        # torch explains, at construction, why its nested-tensor path cannot run for this configuration.
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        module = nn.TransformerEncoder(layers[0], ours.num_layers, copy.deepcopy(ours.norm))
    module.layers = nn.ModuleList(layers)
    return module.train(ours.training)


def _decoder_from_torch(cls: type[_Decoder], module: nn.TransformerDecoder, backend: Backend) -> _Decoder:
    _expect(module, nn.TransformerDecoder)
    layers = [_decoder_layer_from_torch(TransformerDecoderLayer, layer, backend) for layer in module.layers]
    ours = cls(layers[0], len(layers), copy.deepcopy(module.norm))
    ours.layers = nn.ModuleList(layers)
    return ours.train(module.training)


def _decoder_to_torch(ours: TransformerDecoder, batch_first: bool) -> nn.TransformerDecoder:
    layers = [_decoder_layer_to_torch(cast(TransformerDecoderLayer, layer), batch_first) for layer in ours.layers]
    module = nn.TransformerDecoder(layers[0], ours.num_layers, copy.deepcopy(ours.norm))
    module.layers = nn.ModuleList(layers)
    return module.train(ours.training)


def _transformer_from_torch(cls: type[_Transformer], module: nn.Transformer, backend: Backend) -> _Transformer:
    _expect(module, nn.Transformer)
    encoder = _encoder_from_torch(TransformerEncoder, module.encoder, backend)
    decoder = _decoder_from_torch(TransformerDecoder, module.decoder, backend)
    ours = cls(encoder.d_model, encoder.nhead, custom_encoder=encoder, custom_decoder=decoder, backend=backend,
               **_factory(module))
    return ours.train(module.training)


def _transformer_to_torch(ours: Transformer, batch_first: bool) -> nn.Transformer:
    encoder = _encoder_to_torch(ours.encoder, batch_first)
    decoder = _decoder_to_torch(ours.decoder, batch_first)
    # nn.Transformer re-initialises custom encoders and decoders in place: build it around parameter-free
    # placeholders, then put the copies in.
    module = nn.Transformer(ours.d_model, ours.nhead, custom_encoder=nn.Identity(), custom_decoder=nn.Identity(),
                            batch_first=batch_first)
    module.encoder, module.decoder = encoder, decoder
    return module.train(ours.training)


# ----------------------------------------------------------------------------------------------------
# Dispatch tables: (torch's class, ours, copy in), (ours, copy out). The first match converts: none of
# these classes subclasses another, so a user's subclass finds its base.
# ----------------------------------------------------------------------------------------------------

_FROM_TORCH: tuple[tuple[type[nn.Module], type[nn.Module], Callable[[Any, Any, Backend], nn.Module]], ...] = (
    (nn.MultiheadAttention, MultiHeadAttention, _multihead_from_torch),
    (nn.TransformerEncoderLayer, TransformerEncoderLayer, _encoder_layer_from_torch),
    (nn.TransformerDecoderLayer, TransformerDecoderLayer, _decoder_layer_from_torch),
    (nn.TransformerEncoder, TransformerEncoder, _encoder_from_torch),
    (nn.TransformerDecoder, TransformerDecoder, _decoder_from_torch),
    (nn.Transformer, Transformer, _transformer_from_torch),
)
_TO_TORCH: tuple[tuple[type[nn.Module], Callable[[Any, bool], nn.Module]], ...] = (
    (MultiHeadAttention, _multihead_to_torch),
    (TransformerEncoderLayer, _encoder_layer_to_torch),
    (TransformerDecoderLayer, _decoder_layer_to_torch),
    (TransformerEncoder, _encoder_to_torch),
    (TransformerDecoder, _decoder_to_torch),
    (Transformer, _transformer_to_torch),
)


# ----------------------------------------------------------------------------------------------------
# Deprecated spellings: the per-kind functions, the classes' from_torch classmethods and to_torch methods
# ----------------------------------------------------------------------------------------------------


_M = TypeVar("_M", bound=nn.Module)


def _old_from_torch(name: str, ours: type[_M], build: Callable[[type[_M], Any, Backend], _M]) -> Callable[..., _M]:
    """``name(module, *, backend="sdpa")``: the copy into ``ours`` (refusing any other torch class), warning."""
    def convert(module: nn.Module, *, backend: Backend = "sdpa") -> _M:
        warn_deprecated(f"typed_transformer.interop.{name} is deprecated, use typed_transformer.from_torch")
        return build(ours, module, backend)

    convert.__name__ = convert.__qualname__ = name
    convert.__doc__ = "Deprecated: use :func:`from_torch`."
    return convert


def _old_to_torch(name: str, convert: Callable[[_M, bool], nn.Module]) -> Callable[..., nn.Module]:
    """``name(ours, *, batch_first=True)``: torch's copy, warning."""
    def old(ours: _M, *, batch_first: bool = True) -> nn.Module:
        warn_deprecated(f"typed_transformer.interop.{name} is deprecated, use typed_transformer.to_torch")
        return convert(ours, batch_first)

    old.__name__ = old.__qualname__ = name
    old.__doc__ = "Deprecated: use :func:`to_torch`."
    return old


multihead_from_torch = _old_from_torch("multihead_from_torch", MultiHeadAttention, _multihead_from_torch)
encoder_layer_from_torch = _old_from_torch("encoder_layer_from_torch", TransformerEncoderLayer,
                                           _encoder_layer_from_torch)
decoder_layer_from_torch = _old_from_torch("decoder_layer_from_torch", TransformerDecoderLayer,
                                           _decoder_layer_from_torch)
encoder_from_torch = _old_from_torch("encoder_from_torch", TransformerEncoder, _encoder_from_torch)
decoder_from_torch = _old_from_torch("decoder_from_torch", TransformerDecoder, _decoder_from_torch)
transformer_from_torch = _old_from_torch("transformer_from_torch", Transformer, _transformer_from_torch)
multihead_to_torch = _old_to_torch("multihead_to_torch", _multihead_to_torch)
encoder_layer_to_torch = _old_to_torch("encoder_layer_to_torch", _encoder_layer_to_torch)
decoder_layer_to_torch = _old_to_torch("decoder_layer_to_torch", _decoder_layer_to_torch)
encoder_to_torch = _old_to_torch("encoder_to_torch", _encoder_to_torch)
decoder_to_torch = _old_to_torch("decoder_to_torch", _decoder_to_torch)
transformer_to_torch = _old_to_torch("transformer_to_torch", _transformer_to_torch)


def _attach_old_methods(ours: type[_M], build: Callable[[type[_M], Any, Backend], _M],
                        convert: Callable[[_M, bool], nn.Module]) -> None:
    """``ours.from_torch(module, *, backend=...)`` (a classmethod that builds ``cls``, so subclasses get
    themselves) and ``ours.to_torch(*, batch_first=...)``, both warning."""
    owner = ours.__name__

    def from_torch_(cls: type[_M], module: nn.Module, *, backend: Backend = "sdpa") -> _M:
        warn_deprecated(f"{owner}.from_torch is deprecated, use typed_transformer.from_torch")
        return build(cls, module, backend)

    def to_torch_(self: _M, *, batch_first: bool = True) -> nn.Module:
        warn_deprecated(f"{owner}.to_torch() is deprecated, use typed_transformer.to_torch")
        return convert(self, batch_first)

    # Attached here, not declared on the classes: the classes know nothing of interop.
    for name, method, attribute in (("from_torch", from_torch_, classmethod(from_torch_)),
                                    ("to_torch", to_torch_, to_torch_)):
        method.__name__, method.__qualname__ = name, f"{owner}.{name}"
        method.__doc__ = f"Deprecated: use :func:`typed_transformer.{name}`."
        setattr(ours, name, attribute)


for _torch_kind, _ours, _build in _FROM_TORCH:
    _attach_old_methods(_ours, _build, dict(_TO_TORCH)[_ours])
del _torch_kind, _ours, _build
