"""The spec of timm's vision-transformer ``Attention``."""

import dataclasses
from typing import Any, Literal

from torch import Tensor

from ..core.conventions import Conventions
from ..modules.masking import with_causal
from ..modules.spec import ModuleSpec, Options
from .shared import _identity, _refuse

# ----------------------------------------------------------------------------------------------------
# timm
# ----------------------------------------------------------------------------------------------------


def _timm_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                  is_causal: bool) -> Tensor:
    """A boolean keep-mask (SDPA's polarity) with causality folded in, or none and timm's own ``is_causal``."""
    if keep is None:
        out: Tensor = m(x, is_causal=is_causal)
        return out
    out = m(x, attn_mask=with_causal(keep, is_causal, x.shape[1], x.shape[1]))
    return out


TIMM = ModuleSpec(
    "timm", _timm_forward, Conventions(self_attention=True, fully_masked="zero"), q=None, k=None, v=None, qkv="qkv",
    out="proj", num_heads="num_heads", head_dim="head_dim", scale="scale",
    build=lambda cls, config: cls(**config), module_type="timm.layers.attention.Attention")


TIMM_OPTIONS = Options(
    "timm.layers.attention.Attention",
    modelled=("dim", "num_heads", "attn_head_dim", "dim_out", "qkv_bias", "qk_norm", "proj_bias", "norm_layer"),
    refused=("scale_norm", "gated"), inert=("attn_drop", "proj_drop", "device", "dtype"))


def timm_spec(module: Any) -> ModuleSpec:
    """timm's ``Attention`` (the attention of ``VisionTransformer``'s blocks and many others): a fused ``qkv`` in
    blocks, ``proj``, its q/k norms; both kernels (``fused_attn``: SDPA, or its own softmax). Refused: ``scale_norm``
    (a norm on the output before ``proj``) and ``gated`` (a sigmoid gate on the output)."""
    _refuse(module, "timm", [what for what, present in (
        ("scale_norm=True (a norm on the attention output before proj)", not _identity(getattr(module, "norm", None))),
        ("gated=True (a sigmoid gate on the attention output)", getattr(module, "gate", None) is not None)) if present])
    norms: dict[str, Any] = {} if _identity(getattr(module, "q_norm", None)) else {"q_norm": "q_norm",
                                                                                   "k_norm": "k_norm"}
    # SDPA gives a fully masked row zeros; timm's own softmax (fused_attn False) adds -inf everywhere: NaN
    masked: Literal["zero", "nan"] = "zero" if getattr(module, "fused_attn", True) else "nan"
    return dataclasses.replace(TIMM, conventions=dataclasses.replace(TIMM.conventions, fully_masked=masked), **norms)
