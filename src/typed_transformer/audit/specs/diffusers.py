"""The spec of diffusers' ``Attention`` with its processors."""

import dataclasses
from typing import Any

from einops import rearrange
from torch import Tensor

from ..core.conventions import Conventions
from ..modules.masking import additive_mask, with_causal
from ..modules.spec import ModuleSpec, Options, Weights
from .shared import _pair, _refuse

# ----------------------------------------------------------------------------------------------------
# diffusers
# ----------------------------------------------------------------------------------------------------


def _diffusers_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                       is_causal: bool) -> Tensor:
    """An additive mask ``(b, t, s)`` (the processors repeat it per head) or, per head, ``((b h), t, s)``: a mask
    whose first axis is not the batch (``(1, t, s)`` for a batch of 2) is repeated into the wrong heads."""
    b, t = x.shape[0], x.shape[1]
    s = t if key is None else key.shape[1]
    keep = with_causal(keep, is_causal, t, s)
    mask = None
    if keep is not None:
        mask = additive_mask(rearrange(keep.expand(b, keep.shape[1], t, s), "b h t s -> (b h) t s"), x.dtype)
    out: Tensor = m(x, encoder_hidden_states=key, attention_mask=mask)
    return out


def _diffusers_weights(m: Any) -> Weights:
    """``to_q``, ``to_k``, ``to_v``, ``to_out[0]``; ``kv_heads`` from the key width; ``rescale_output_factor``
    (the output is divided by it) folded into the output projection."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (_pair(layer) for layer in (m.to_q, m.to_k, m.to_v, m.to_out[0]))
    h = int(m.heads)
    d = wq.shape[0] // h
    g = wk.shape[0] // d
    factor = float(m.rescale_output_factor)
    return Weights(wq, wk, wv, wo / factor, bq, bk, bv, None if bo is None else bo / factor, h, g, d,
                   wv.shape[0] // g, float(m.scale))


#: the processors whose computation the spec describes (self- or cross-attention of the plain kind)
DIFFUSERS_PROCESSORS = ("AttnProcessor", "AttnProcessor2_0", "SlicedAttnProcessor", "FusedAttnProcessor2_0")

DIFFUSERS_OPTIONS = Options(
    "diffusers.models.attention_processor.Attention",
    modelled=("query_dim", "cross_attention_dim", "heads", "kv_heads", "dim_head", "bias", "upcast_attention",
              "upcast_softmax", "qk_norm", "out_bias", "scale_qk", "eps", "rescale_output_factor", "processor",
              "out_dim", "elementwise_affine"),
    refused=("qk_norm", "processor", "cross_attention_norm", "added_kv_proj_dim", "norm_num_groups",
             "spatial_norm_dim", "only_cross_attention", "residual_connection", "pre_only"),
    # read only with a refused option (cross_attention_norm, added_kv_proj_dim) or by a refused processor;
    # is_causal is stored, and the modelled processors never read it; _from_deprecated_attn_block: weight loading
    inert=("dropout", "cross_attention_norm_num_groups", "added_proj_bias", "out_context_dim", "context_pre_only",
           "_from_deprecated_attn_block", "is_causal"))

DIFFUSERS = ModuleSpec(
    "diffusers", _diffusers_forward, Conventions(self_attention=True, fully_masked="uniform"),
    weights=_diffusers_weights, build=lambda cls, config: cls(**config),
    module_type="diffusers.models.attention_processor.Attention")


def _across_heads(module: Any) -> bool:
    """Whether ``norm_q`` normalizes every head's features together (``qk_norm='..._across_heads'``; one head: the
    same computation as per head)."""
    norm = getattr(module, "norm_q", None)
    shape = getattr(norm, "normalized_shape", None) or getattr(getattr(norm, "weight", None), "shape", None)
    return (norm is not None and shape is not None and int(module.heads) > 1
            and int(tuple(shape)[-1]) == int(module.inner_dim))


def _diffusers_norm_kind(module: Any) -> str:
    return "rms_norm" if "RMS" in type(getattr(module, "norm_q", None)).__name__ else "layer_norm"


def diffusers_spec(module: Any) -> ModuleSpec:
    """diffusers' ``Attention`` with its processor: self-attention, or cross-attention over one memory tensor
    (``cross_attention_dim``), grouped key/value heads, biases, q/k norms (``layer_norm``, ``fp32_layer_norm``,
    ``rms_norm``, per head), ``scale_qk``, ``rescale_output_factor``. Refused: a processor of
    another kind (rotary, IP-adapter, joint attention: each computes its own variant), ``residual_connection``,
    group, spatial and cross norms, added key/value projections (and ``only_cross_attention``), ``l2`` and
    across-heads q/k norms and a module without output projection (``pre_only``)."""
    processor = type(getattr(module, "processor", None)).__name__
    _refuse(module, "diffusers", [what for what, present in (
        (f"processor {processor} (the spec describes {', '.join(DIFFUSERS_PROCESSORS)})",
         processor not in DIFFUSERS_PROCESSORS),
        ("residual_connection=True (the input added to the output)", bool(getattr(module, "residual_connection", 0))),
        ("norm_num_groups (a GroupNorm on the input)", getattr(module, "group_norm", None) is not None),
        ("spatial_norm_dim (a SpatialNorm on the input)", getattr(module, "spatial_norm", None) is not None),
        ("cross_attention_norm (a norm on the memory)", getattr(module, "norm_cross", None) is not None),
        ("added_kv_proj_dim (added key/value projections)", getattr(module, "add_k_proj", None) is not None),
        ("pre_only=True (no output projection)", getattr(module, "to_out", None) is None),
        ("only_cross_attention=True (keys and values only from the added projections)",
         bool(getattr(module, "only_cross_attention", False))),
        ("qk_norm='l2'", type(getattr(module, "norm_q", None)).__name__ == "LpNorm"),
        (f"qk_norm='{_diffusers_norm_kind(module)}_across_heads' (a norm over every head's features: the modelled "
         f"processors apply norm_q to each head)", _across_heads(module))) if present])
    fields: dict[str, Any] = {}
    if getattr(module, "norm_q", None) is not None:
        fields.update(q_norm="norm_q", k_norm="norm_k")
    if getattr(module, "is_cross_attention", False):
        fields.update(conventions=Conventions(fully_masked="uniform"), memory=True)
    return dataclasses.replace(DIFFUSERS, **fields)
