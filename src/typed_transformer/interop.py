"""Interop with ``torch.nn``: copy torch's attention, layers and stacks into ours, and ours back into torch's.

    ours = from_torch(torch_module)        torch_module = to_torch(ours)        (same weights, same outputs)

Every copy shares no tensor with its source. What the conversions map:

* ``nn.MultiheadAttention`` <-> :class:`~typed_transformer.multihead.MultiHeadAttention`: packed
  (``in_proj_weight``) or separate q/k/v weights, bias on or off, ``bias_k``/``bias_v`` (torch ``(1, 1, e)``,
  ours ``(e,)``), ``add_zero_attn``, dropout, either ``batch_first`` (ours is always batch-first). torch
  cannot express grouped-query heads or a query width ``input_dim != d_model``: :func:`multihead_to_torch`
  refuses them.
* ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` <-> ours: torch keeps ``linear1``/``linear2``
  on the layer, ours in ``feed_forward``; the activation goes over by name (``"relu"``, ``"gelu"``,
  ``"gelu_tanh"``) or as the callable itself. torch's layers have no rotary embeddings: ``*_to_torch``
  refuses a layer that has them.
* ``nn.TransformerEncoder`` / ``nn.TransformerDecoder`` / ``nn.Transformer`` <-> ours: layer by layer, with
  the final norms.

Masks are not converted here: the copies take masks in their own library's convention (see
:mod:`typed_transformer.masks` for ``attn_mask_from_torch`` and friends). The classes' ``from_torch``
classmethods and ``to_torch`` methods are thin aliases of the functions here.
"""

import copy
import warnings
from typing import Any, TypeVar, cast

import torch
from einops import rearrange
from torch import nn

from .attention import Backend
from .layers import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    _activation_name,
    _gelu_tanh,
)
from .multihead import MultiHeadAttention

__all__ = [
    "decoder_from_torch",
    "decoder_layer_from_torch",
    "decoder_layer_to_torch",
    "decoder_to_torch",
    "encoder_from_torch",
    "encoder_layer_from_torch",
    "encoder_layer_to_torch",
    "encoder_to_torch",
    "from_torch",
    "multihead_from_torch",
    "multihead_to_torch",
    "to_torch",
    "transformer_from_torch",
    "transformer_to_torch",
]

_MHA = TypeVar("_MHA", bound=MultiHeadAttention)
_EncoderLayer = TypeVar("_EncoderLayer", bound=TransformerEncoderLayer)
_DecoderLayer = TypeVar("_DecoderLayer", bound=TransformerDecoderLayer)
_Encoder = TypeVar("_Encoder", bound=TransformerEncoder)
_Decoder = TypeVar("_Decoder", bound=TransformerDecoder)
_Transformer = TypeVar("_Transformer", bound=Transformer)


def _expect(module: nn.Module, kind: type[nn.Module]) -> None:
    if not isinstance(module, kind):
        raise TypeError(f"from_torch: expected nn.{kind.__name__}, got {type(module).__name__}")


def _factory(module: nn.Module) -> dict[str, Any]:
    reference = next(module.parameters())
    return {"device": reference.device, "dtype": reference.dtype}


# ----------------------------------------------------------------------------------------------------
# Multi-head attention
# ----------------------------------------------------------------------------------------------------


def multihead_from_torch(module: nn.MultiheadAttention, *, backend: Backend = "sdpa") -> MultiHeadAttention:
    """Copy any ``nn.MultiheadAttention`` (packed or separate q/k/v weights, bias on or off,
    ``bias_k``/``bias_v``, ``add_zero_attn``, either ``batch_first``).

    The copy is batch-first regardless of ``module.batch_first``, and takes masks in our convention:
    convert torch masks with :func:`typed_transformer.masks.attn_mask_from_torch` and
    :func:`typed_transformer.masks.key_padding_mask_from_torch`.

    Raises:
        TypeError: ``module`` is not an ``nn.MultiheadAttention``.
    """
    return _multihead_from_torch(MultiHeadAttention, module, backend)


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


def multihead_to_torch(ours: MultiHeadAttention, *, batch_first: bool = True) -> nn.MultiheadAttention:
    """The equivalent ``nn.MultiheadAttention`` (which takes masks in torch's convention).

    Raises:
        ValueError: for what torch cannot express: grouped-query heads, or a query width ``input_dim``
            different from ``d_model``.
    """
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


def encoder_layer_from_torch(module: nn.TransformerEncoderLayer, *,
                             backend: Backend = "sdpa") -> TransformerEncoderLayer:
    """Copy an ``nn.TransformerEncoderLayer`` (post-LN or pre-LN, any activation, bias on or off, either
    ``batch_first``). The copy is batch-first and takes masks in our convention.

    Raises:
        TypeError: ``module`` is not an ``nn.TransformerEncoderLayer``.
    """
    return _encoder_layer_from_torch(TransformerEncoderLayer, module, backend)


def _encoder_layer_from_torch(cls: type[_EncoderLayer], module: nn.TransformerEncoderLayer,
                              backend: Backend) -> _EncoderLayer:
    _expect(module, nn.TransformerEncoderLayer)
    ours = cls(module.self_attn.embed_dim, module.self_attn.num_heads, module.linear1.out_features,
               module.dropout.p, activation=_activation_name(module.activation), norm_first=module.norm_first,
               bias=module.linear1.bias is not None, backend=backend, **_factory(module))
    ours.self_attn = multihead_from_torch(module.self_attn, backend=backend)
    _copy_feed_forward_and_norms(module, ours, ("norm1", "norm2"))
    return ours.train(module.training)


def encoder_layer_to_torch(ours: TransformerEncoderLayer, *, batch_first: bool = True) -> nn.TransformerEncoderLayer:
    """The equivalent ``nn.TransformerEncoderLayer`` (masks in torch's convention).

    Raises:
        ValueError: the layer has rotary embeddings, which torch's layers do not have.
    """
    _refuse_rotary(ours.self_attn)
    module = nn.TransformerEncoderLayer(**_torch_layer_kwargs(ours, batch_first))
    module.self_attn.load_state_dict(multihead_to_torch(ours.self_attn, batch_first=batch_first).state_dict())
    _copy_feed_forward_and_norms(ours, module, ("norm1", "norm2"))
    return module.train(ours.training)


def decoder_layer_from_torch(module: nn.TransformerDecoderLayer, *,
                             backend: Backend = "sdpa") -> TransformerDecoderLayer:
    """Copy an ``nn.TransformerDecoderLayer`` (post-LN or pre-LN, any activation, bias on or off, either
    ``batch_first``). The copy is batch-first and takes masks in our convention.

    Raises:
        TypeError: ``module`` is not an ``nn.TransformerDecoderLayer``.
    """
    return _decoder_layer_from_torch(TransformerDecoderLayer, module, backend)


def _decoder_layer_from_torch(cls: type[_DecoderLayer], module: nn.TransformerDecoderLayer,
                              backend: Backend) -> _DecoderLayer:
    _expect(module, nn.TransformerDecoderLayer)
    ours = cls(module.self_attn.embed_dim, module.self_attn.num_heads, module.linear1.out_features,
               module.dropout.p, activation=_activation_name(module.activation), norm_first=module.norm_first,
               bias=module.linear1.bias is not None, backend=backend, **_factory(module))
    ours.self_attn = multihead_from_torch(module.self_attn, backend=backend)
    ours.multihead_attn = multihead_from_torch(module.multihead_attn, backend=backend)
    _copy_feed_forward_and_norms(module, ours, ("norm1", "norm2", "norm3"))
    return ours.train(module.training)


def decoder_layer_to_torch(ours: TransformerDecoderLayer, *, batch_first: bool = True) -> nn.TransformerDecoderLayer:
    """The equivalent ``nn.TransformerDecoderLayer`` (masks in torch's convention).

    Raises:
        ValueError: the layer has rotary embeddings, which torch's layers do not have.
    """
    _refuse_rotary(ours.self_attn)
    module = nn.TransformerDecoderLayer(**_torch_layer_kwargs(ours, batch_first))
    module.self_attn.load_state_dict(multihead_to_torch(ours.self_attn, batch_first=batch_first).state_dict())
    module.multihead_attn.load_state_dict(
        multihead_to_torch(ours.multihead_attn, batch_first=batch_first).state_dict())
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


def encoder_from_torch(module: nn.TransformerEncoder, *, backend: Backend = "sdpa") -> TransformerEncoder:
    """Copy an ``nn.TransformerEncoder`` layer by layer, with its final norm (any module) if it has one.

    Raises:
        TypeError: ``module`` is not an ``nn.TransformerEncoder``.
    """
    return _encoder_from_torch(TransformerEncoder, module, backend)


def _encoder_from_torch(cls: type[_Encoder], module: nn.TransformerEncoder, backend: Backend) -> _Encoder:
    _expect(module, nn.TransformerEncoder)
    layers = [encoder_layer_from_torch(layer, backend=backend) for layer in module.layers]
    ours = cls(layers[0], len(layers), copy.deepcopy(module.norm))
    ours.layers = nn.ModuleList(layers)
    return ours.train(module.training)


def encoder_to_torch(ours: TransformerEncoder, *, batch_first: bool = True) -> nn.TransformerEncoder:
    """The equivalent ``nn.TransformerEncoder`` (with torch's nested-tensor fast path where it applies).

    Raises:
        ValueError: a layer has rotary embeddings, which torch's layers do not have.
    """
    layers = [encoder_layer_to_torch(cast(TransformerEncoderLayer, layer), batch_first=batch_first)
              for layer in ours.layers]
    with warnings.catch_warnings():
        # torch explains, at construction, why its nested-tensor path cannot run for this configuration.
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
        module = nn.TransformerEncoder(layers[0], ours.num_layers, copy.deepcopy(ours.norm))
    module.layers = nn.ModuleList(layers)
    return module.train(ours.training)


def decoder_from_torch(module: nn.TransformerDecoder, *, backend: Backend = "sdpa") -> TransformerDecoder:
    """Copy an ``nn.TransformerDecoder`` layer by layer, with its final norm (any module) if it has one.

    Raises:
        TypeError: ``module`` is not an ``nn.TransformerDecoder``.
    """
    return _decoder_from_torch(TransformerDecoder, module, backend)


def _decoder_from_torch(cls: type[_Decoder], module: nn.TransformerDecoder, backend: Backend) -> _Decoder:
    _expect(module, nn.TransformerDecoder)
    layers = [decoder_layer_from_torch(layer, backend=backend) for layer in module.layers]
    ours = cls(layers[0], len(layers), copy.deepcopy(module.norm))
    ours.layers = nn.ModuleList(layers)
    return ours.train(module.training)


def decoder_to_torch(ours: TransformerDecoder, *, batch_first: bool = True) -> nn.TransformerDecoder:
    """The equivalent ``nn.TransformerDecoder``.

    Raises:
        ValueError: a layer has rotary embeddings, which torch's layers do not have.
    """
    layers = [decoder_layer_to_torch(cast(TransformerDecoderLayer, layer), batch_first=batch_first)
              for layer in ours.layers]
    module = nn.TransformerDecoder(layers[0], ours.num_layers, copy.deepcopy(ours.norm))
    module.layers = nn.ModuleList(layers)
    return module.train(ours.training)


def transformer_from_torch(module: nn.Transformer, *, backend: Backend = "sdpa") -> Transformer:
    """Copy an ``nn.Transformer`` (both stacks, with their final norms).

    Raises:
        TypeError: ``module`` is not an ``nn.Transformer``.
    """
    return _transformer_from_torch(Transformer, module, backend)


def _transformer_from_torch(cls: type[_Transformer], module: nn.Transformer, backend: Backend) -> _Transformer:
    _expect(module, nn.Transformer)
    encoder = encoder_from_torch(module.encoder, backend=backend)
    decoder = decoder_from_torch(module.decoder, backend=backend)
    ours = cls(encoder.d_model, encoder.nhead, custom_encoder=encoder, custom_decoder=decoder, backend=backend,
               **_factory(module))
    return ours.train(module.training)


def transformer_to_torch(ours: Transformer, *, batch_first: bool = True) -> nn.Transformer:
    """The equivalent ``nn.Transformer``.

    Raises:
        ValueError: a layer has rotary embeddings, which torch's layers do not have.
    """
    encoder = encoder_to_torch(ours.encoder, batch_first=batch_first)
    decoder = decoder_to_torch(ours.decoder, batch_first=batch_first)
    # nn.Transformer re-initialises custom encoders and decoders in place: build it around parameter-free
    # placeholders, then put the copies in.
    module = nn.Transformer(ours.d_model, ours.nhead, custom_encoder=nn.Identity(), custom_decoder=nn.Identity(),
                            batch_first=batch_first)
    module.encoder, module.decoder = encoder, decoder
    return module.train(ours.training)


# ----------------------------------------------------------------------------------------------------
# Any module
# ----------------------------------------------------------------------------------------------------

# The first match converts: none of these classes subclasses another, so a user's subclass finds its base.
_FROM_TORCH: tuple[tuple[type[nn.Module], Any], ...] = (
    (nn.MultiheadAttention, multihead_from_torch),
    (nn.TransformerEncoderLayer, encoder_layer_from_torch),
    (nn.TransformerDecoderLayer, decoder_layer_from_torch),
    (nn.TransformerEncoder, encoder_from_torch),
    (nn.TransformerDecoder, decoder_from_torch),
    (nn.Transformer, transformer_from_torch),
)
_TO_TORCH: tuple[tuple[type[nn.Module], Any], ...] = (
    (MultiHeadAttention, multihead_to_torch),
    (TransformerEncoderLayer, encoder_layer_to_torch),
    (TransformerDecoderLayer, decoder_layer_to_torch),
    (TransformerEncoder, encoder_to_torch),
    (TransformerDecoder, decoder_to_torch),
    (Transformer, transformer_to_torch),
)


def from_torch(module: nn.Module, *, backend: Backend = "sdpa") -> nn.Module:
    """Our copy of any torch module this library mirrors: ``nn.MultiheadAttention``,
    ``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``, ``nn.TransformerEncoder``,
    ``nn.TransformerDecoder`` or ``nn.Transformer``.

    Raises:
        TypeError: ``module`` is none of those.
    """
    for kind, convert in _FROM_TORCH:
        if isinstance(module, kind):
            converted: nn.Module = convert(module, backend=backend)
            return converted
    names = ", ".join(f"nn.{kind.__name__}" for kind, _ in _FROM_TORCH)
    raise TypeError(f"from_torch: expected one of {names}, got {type(module).__name__}")


def to_torch(module: nn.Module, *, batch_first: bool = True) -> nn.Module:
    """torch's equivalent of any of our modules that mirror one: :class:`MultiHeadAttention`, the encoder
    and decoder layers and stacks, and :class:`Transformer`.

    Raises:
        TypeError: ``module`` is none of those.
        ValueError: the module uses what torch cannot express (see the specific functions).
    """
    for kind, convert in _TO_TORCH:
        if isinstance(module, kind):
            converted: nn.Module = convert(module, batch_first=batch_first)
            return converted
    names = ", ".join(kind.__name__ for kind, _ in _TO_TORCH)
    raise TypeError(f"to_torch: expected one of {names}, got {type(module).__name__}")
