"""The spec of OpenCLIP's attention."""

import dataclasses
from typing import Any

from einops import repeat
from torch import Tensor

from ..core.conventions import Conventions
from ..modules.masking import with_causal
from ..modules.spec import ModuleSpec, Options, Weights
from .shared import _identity, _pair, _refuse

# ----------------------------------------------------------------------------------------------------
# open_clip
# ----------------------------------------------------------------------------------------------------


def _open_clip_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                       is_causal: bool) -> Tensor:
    """open_clip's boolean masks are True = masked out (it fills them with -inf)."""
    keep = with_causal(keep, is_causal, x.shape[1], x.shape[1])
    out: Tensor = m(x) if keep is None else m(x, attn_mask=~keep)
    return out


def _open_clip_weights(m: Any) -> Weights:
    """The bare ``in_proj_weight`` parameter ``[q; k; v]``, ``out_proj``, NormFormer's per-head ``head_scale``
    folded into the output projection (it multiplies each head's output before ``out_proj``)."""
    wq, wk, wv = m.in_proj_weight.detach().double().chunk(3)
    bq, bk, bv = (None, None, None) if m.in_proj_bias is None else m.in_proj_bias.detach().double().chunk(3)
    wo, bo = _pair(m.out_proj)
    h, d = int(m.num_heads), int(m.head_dim)
    if m.head_scale is not None:
        wo = wo * repeat(m.head_scale.detach().double().flatten(), "h -> (h d)", d=d)[None]
    return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, h, d, d, float(m.scale))


OPEN_CLIP = ModuleSpec(
    "open_clip", _open_clip_forward, Conventions(self_attention=True, fully_masked="zero"),
    weights=_open_clip_weights, build=lambda cls, config: cls(**config),
    module_type="open_clip.transformer.Attention")


OPEN_CLIP_OPTIONS = Options(
    "open_clip.transformer.Attention",
    modelled=("dim", "num_heads", "qkv_bias", "qk_norm", "scale_heads", "norm_layer"),
    refused=("scaled_cosine", "inner_norm"),
    inert=("logit_scale_max", "attn_drop", "proj_drop"))  # logit_scale_max: read only with scaled_cosine


def open_clip_spec(module: Any) -> ModuleSpec:
    """open_clip's ``Attention`` (``CustomResidualAttentionBlock``'s): the bare in-projection parameter, q/k
    LayerNorms (``LayerNormFp32``), per-head output scales. Refused: ``scaled_cosine`` (Swin V2's cosine attention
    with a learned per-head logit scale) and ``inner_norm`` (a norm before ``out_proj``)."""
    _refuse(module, "open_clip", [what for what, present in (
        ("scaled_cosine=True (cosine attention with a learned per-head logit scale, Swin V2's)",
         getattr(module, "logit_scale", None) is not None),
        ("inner_norm=True (a LayerNorm on the attention output before out_proj)",
         not _identity(getattr(module, "ln_inner", None)))) if present])
    norms: dict[str, Any] = {} if _identity(getattr(module, "ln_q", None)) else {"q_norm": "ln_q", "k_norm": "ln_k"}
    return dataclasses.replace(OPEN_CLIP, **norms)
