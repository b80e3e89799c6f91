"""The shipped spec of this library's own :class:`~typed_transformer.MultiHeadAttention`, fused and separate
projections, with its KV cache."""

from typing import Any

import torch
from torch import Tensor, nn

from ..core.conventions import AuditUsageError, Conventions
from ..modules.positions import Rotary
from ..modules.spec import ModuleSpec, Options, Weights
from ..modules.weights import spec_weights

# ----------------------------------------------------------------------------------------------------
# typed_transformer.MultiHeadAttention
# ----------------------------------------------------------------------------------------------------


def _ours_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                  is_causal: bool) -> Tensor:
    out, _ = m(x, attn_mask=keep, is_causal=is_causal)
    result: Tensor = out
    return result


def _ours_decode(m: Any, x: Tensor) -> Tensor:
    from ...multihead import KVCache

    cache = KVCache()
    return torch.cat([m(x[:, i:i + 1], kv_cache=cache, is_causal=True)[0] for i in range(x.shape[1])], dim=1)


_OURS_FUSED = ModuleSpec("typed_transformer", _ours_forward, qkv="in_proj", q=None, k=None, v=None, out="out_proj",
                         num_kv_heads="num_kv_heads", head_dim="head_dim")
_OURS_SEPARATE = ModuleSpec("typed_transformer", _ours_forward, out="out_proj", num_kv_heads="num_kv_heads",
                            head_dim="head_dim")


def _ours_weights(m: Any) -> Weights:

    unmodelled = [f"{name}=True" for name, present in (("add_bias_kv", getattr(m, "bias_k", None) is not None),
                                                        ("add_zero_attn", getattr(m, "add_zero_attn", False)))
                  if present]
    widths = (getattr(m, "input_dim", None), getattr(m, "kdim", None), getattr(m, "vdim", None))
    if len(set(widths)) > 1:  # the spec calls the module on one tensor: self-attention
        unmodelled.append(f"input_dim, kdim, vdim = {widths} (keys or values of another width: cross-attention)")
    if unmodelled:
        raise AuditUsageError(f"spec 'typed_transformer' does not model {' and '.join(unmodelled)}: not audited")
    w = spec_weights(m, _OURS_FUSED if getattr(m, "in_proj", None) is not None else _OURS_SEPARATE)
    if w.wq.shape[0] != w.wk.shape[0] * w.h // w.g:  # fused: q, k, v parts are d_model, kv_dim, kv_dim
        raise AuditUsageError("spec 'typed_transformer': unexpected projection sizes")
    return w


def _build_ours(cls: type, config: dict[str, Any]) -> nn.Module:
    from ...positions import RotaryEmbedding

    config = dict(config)
    base = config.pop("rotary_base", None)
    if base is not None:
        config["rotary"] = RotaryEmbedding(config["d_model"] // config["num_heads"], base=base)
    module: nn.Module = cls(**config)
    return module


#: every constructor option of typed_transformer.MultiHeadAttention (backend: the same attention by another kernel;
#: rotary: a RotaryEmbedding, read by its base; kdim and vdim modelled as input_dim, refused otherwise: the spec
#: calls the module on one tensor)
TYPED_TRANSFORMER_OPTIONS = Options(
    "typed_transformer.multihead.MultiHeadAttention",
    modelled=("d_model", "num_heads", "input_dim", "kdim", "vdim", "bias", "num_kv_heads", "backend", "rotary"),
    refused=("add_bias_kv", "add_zero_attn", "kdim", "vdim"), inert=("dropout", "device", "dtype"))

TYPED_TRANSFORMER = ModuleSpec(
    "typed_transformer", _ours_forward, Conventions(self_attention=True), weights=_ours_weights,
    rotary=Rotary("rotary.base", "half", when="rotary"), decode=_ours_decode, build=_build_ours,
    module_type="typed_transformer.multihead.MultiHeadAttention")
