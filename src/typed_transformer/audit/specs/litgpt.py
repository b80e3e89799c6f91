"""The spec of LitGPT's ``CausalSelfAttention`` and its options."""

import dataclasses
import math
import types
from typing import Any

import torch
from torch import Tensor

from ..core.conventions import Conventions
from ..modules.masking import with_causal
from ..modules.positions import Rotary
from ..modules.spec import ModuleSpec, Options, Weights
from ..modules.weights import spec_weights
from .shared import _refuse

# ----------------------------------------------------------------------------------------------------
# litgpt
# ----------------------------------------------------------------------------------------------------


def litgpt_rope(m: Any, t: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin ``(1, t, rope_n_elem)`` for positions ``0 .. t-1`` from litgpt's own rope cache (``GPT.rope_cache``
    on the module's config: the code a litgpt model runs), in ``dtype`` as a model moved to ``dtype`` holds them."""
    from litgpt.model import GPT

    cos, sin = GPT.rope_cache(types.SimpleNamespace(config=m.config, max_seq_length=t))
    return cos[None].to(dtype), sin[None].to(dtype)


def _litgpt_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                    is_causal: bool) -> Tensor:
    """Always an explicit boolean mask: without one litgpt's kernel is causal by itself."""
    t = x.shape[1]
    keep = with_causal(keep, is_causal, t, t)
    cos, sin = litgpt_rope(m, t, x.dtype)
    out: Tensor = m(x, cos, sin, keep if keep is not None else torch.ones(1, 1, t, t, dtype=torch.bool))
    return out


def litgpt_decode(m: Any, x: Tensor) -> Tensor:
    """Token by token through litgpt's ``KVCache`` (``build_kv_cache``), each token with the rope cache's row of its
    position and the mask row a ``GPT`` takes from its mask cache (the cache's filled positions)."""
    b, t = x.shape[0], x.shape[1]
    cos, sin = litgpt_rope(m, t, x.dtype)
    m.kv_cache = m.build_kv_cache(b, t, rope_cache_length=cos.shape[-1], dtype=x.dtype)
    outs = []
    for i in range(t):
        mask = (torch.arange(t) <= i)[None, None, None]
        outs.append(m(x[:, i:i + 1], cos[:, i:i + 1], sin[:, i:i + 1], mask, input_pos=torch.tensor([i])))
    return torch.cat(outs, dim=1)


def _litgpt_weights(m: Any) -> Weights:
    """The fused ``qkv`` in blocks (``[q (h d); k (g d); v (g d)]``), ``proj``; the scale from
    ``attention_scores_scalar`` (or the head size) and YaRN's ``mscale`` squared."""
    c = m.config
    w = spec_weights(m, dataclasses.replace(LITGPT, weights=None))
    scale = float(m.mscale) ** 2 / math.sqrt(c.attention_scores_scalar or c.head_size)
    return dataclasses.replace(w, scale=scale)


def _litgpt_frequencies(m: Any) -> tuple[Tensor, float]:
    """The default frequencies ``base^(-2i/n)`` over the rotated ``n = rope_n_elem``, positions condensed by
    ``rope_condense_ratio`` (each position divided by it)."""
    c = m.config
    n = int(c.rope_n_elem)
    inverse = 1.0 / float(c.rope_base) ** (torch.arange(0, n, 2, dtype=torch.float64) / n)
    return inverse[:n // 2] / float(c.rope_condense_ratio), 1.0


LITGPT = ModuleSpec(
    "litgpt", _litgpt_forward, Conventions(self_attention=True, fully_masked="zero"), q=None, k=None, v=None,
    qkv="qkv", out="proj", num_heads="config.n_head", num_kv_heads="config.n_query_groups",
    head_dim="config.head_size", weights=_litgpt_weights, decode=litgpt_decode,
    build=lambda cls, config: cls(_litgpt_config(config), block_idx=0),
    module_type="litgpt.model.CausalSelfAttention")


def _litgpt_config(config: dict[str, Any]) -> Any:
    """A litgpt ``Config``: ``{"name": "Llama-3.2-1B", ...}`` starts from one of litgpt's named configs (the rest
    overrides it), else ``Config(**config)``."""
    from litgpt import Config

    config = dict(config)
    name = config.pop("name", None)
    return Config.from_name(name, **config) if name is not None else Config(**config)


LITGPT_OPTIONS = Options(
    "litgpt.config.Config",
    modelled=("n_embd", "n_head", "n_query_groups", "head_size", "bias", "attn_bias", "norm_qk", "norm_qk_type",
              "norm_class", "norm_eps", "rope_interleave", "rope_n_elem", "rotary_percentage", "rope_base",
              "rope_condense_ratio", "attention_scores_scalar", "sliding_window_size", "sliding_window_indices"),
    refused=("attention_logit_softcapping", "rope_adjustments", "rope_local_base_freq"))


def litgpt_spec(module: Any) -> ModuleSpec:
    """litgpt's ``CausalSelfAttention`` from its ``config``: grouped queries (``n_query_groups``), biases, q/k norms
    (``norm_qk``: per head, or OLMo-2's over every head), partial rotary (``rotary_percentage``), the rotary pairing
    (``rope_interleave``), ``rope_condense_ratio``, the scale (``attention_scores_scalar``), sliding-window layers,
    its rope cache (``GPT.rope_cache``) and KV cache (``build_kv_cache``). Refused: logit soft-capping and
    ``rope_adjustments`` (Llama 3's and YaRN's frequencies, not read) and per-layer rope bases
    (``rope_local_base_freq``)."""
    c = module.config
    _refuse(module, "litgpt", [what for what, present in (
        (f"attention_logit_softcapping={c.attention_logit_softcapping}", c.attention_logit_softcapping is not None),
        (f"rope_adjustments={c.rope_adjustments} (frequencies not read)", c.rope_adjustments is not None),
        (f"rope_local_base_freq={c.rope_local_base_freq}", getattr(c, "rope_local_base_freq", None) is not None))
        if present])
    fields: dict[str, Any] = {"rotary": Rotary("config.rope_base", "interleaved" if c.rope_interleave else "half",
                                               fraction=c.rope_n_elem / c.head_size, frequencies=_litgpt_frequencies)}
    if module.norm_q is not None:
        fields.update(q_norm="norm_q", k_norm="norm_k")
    if module.apply_sliding_window_attention:
        fields["window"] = "config.sliding_window_size"
    return dataclasses.replace(LITGPT, **fields)
