"""Zero-line specs for the attention modules of the other libraries people train with: ``audit_module(module,
"litgpt")`` (or ``"auto"``: the spec is chosen from the module's class) describes the module from its own attributes
and config, as :func:`~typed_transformer.audit.hf_spec` does for transformers. Each library's spec reads the options
it models (grouped queries, q/k norms, biases, rotary variants, cross-attention, KV caches) and refuses, by name and
before any check runs, the options whose computation the reference does not have: a FAIL would then be about the
reference, not the module.

Libraries: ``litgpt`` (``CausalSelfAttention``: its rope cache and KV cache), ``diffusers`` (``Attention`` with its
processors, self- or cross-attention), ``open_clip`` (``Attention``), ``timm`` (``Attention``, the vision
transformers' blocks' attention), ``torchtune`` (``MultiHeadAttention``) and ``x_transformers`` (``Attention``).
Each library is imported only when one of its modules is audited. Each spec's ``Options`` (``LIBRARY_OPTIONS``)
lists every constructor option of its class as modelled, refused or inert."""

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import math
import sys
import types
from collections.abc import Callable
from typing import Any, Literal

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from ._core import AuditUsageError, Conventions
from ._modules import (
    LIBRARY_READERS,
    SHIPPED_SPECS,
    ModuleSpec,
    Options,
    Rotary,
    Weights,
    additive_mask,
    spec_weights,
    with_causal,
)

# ----------------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------------


def _refuse(module: Any, spec: str, unmodelled: list[str]) -> None:
    """An :class:`AuditUsageError` naming every option of ``module`` the spec does not model (none: returns)."""
    if unmodelled:
        raise AuditUsageError(f"{type(module).__qualname__} computes what spec {spec!r} does not model: "
                              f"{'; '.join(unmodelled)}. The reference has no such step, so a FAIL would be about the "
                              f"reference, not the module: not audited")


def _pair(layer: Any) -> tuple[Tensor, Tensor | None]:
    """An ``nn.Linear``'s weight and bias in float64."""
    bias = getattr(layer, "bias", None)
    return layer.weight.detach().double(), None if bias is None else bias.detach().double()


def _identity(layer: Any) -> bool:
    return layer is None or isinstance(layer, nn.Identity)


class _Placeholder(type):
    """A class of the torchvision shim: any attribute is another placeholder, an instance cannot be made."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")


def _placeholder(name: str) -> type:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{name} belongs to the torchvision shim of typed_transformer.audit "
                           f"(import_without_torchvision): install a torchvision that imports to use it")

    return _Placeholder(name, (), {"__init__": init})


class _ShimModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _TorchvisionShim(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _ShimModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0+typed_transformer.shim"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_without_torchvision() -> bool:
    """Make ``import timm`` and ``import open_clip`` work where torchvision is missing or does not import (the
    registry's torchvision is a CUDA build that breaks on a CPU torch): a shim answers every ``torchvision.*``
    import with placeholder classes (an instance of one raises). Their attention modules do not use torchvision;
    image transforms and datasets do, and stay unusable. Returns True when the shim was installed (False: a working
    torchvision is there, or the shim already is)."""
    if any(isinstance(finder, _TorchvisionShim) for finder in sys.meta_path):
        return False
    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # missing, or a build that does not match this torch
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
    sys.meta_path.insert(0, _TorchvisionShim())
    return True


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


# ----------------------------------------------------------------------------------------------------
# torchtune
# ----------------------------------------------------------------------------------------------------


def torchtune_decode(m: Any, x: Tensor) -> Tensor:
    """Token by token through torchtune's own KV cache (``setup_cache``): each token's mask covers the cache's
    filled positions (the cache is ``t`` long and zero beyond them)."""
    b, t = x.shape[0], x.shape[1]
    m.kv_cache = None  # a copy: a fresh cache of this batch and dtype
    m.setup_cache(b, x.dtype, t)
    outs = []
    for i in range(t):
        token = x[:, i:i + 1]
        mask = (torch.arange(t) <= i)[None, None].expand(b, 1, t)
        outs.append(m(token, token, mask=mask, input_pos=torch.full((b, 1), i)))
    return torch.cat(outs, dim=1)


def _torchtune_frequencies(m: Any) -> tuple[Tensor, float]:
    theta: Tensor = m.pos_embeddings.theta
    return theta.detach().double(), 1.0


TORCHTUNE_OPTIONS = Options(
    "torchtune.modules.attention.MultiHeadAttention",
    modelled=("embed_dim", "num_heads", "num_kv_heads", "head_dim", "q_proj", "k_proj", "v_proj", "output_proj",
              "pos_embeddings", "q_norm", "k_norm", "kv_cache", "max_seq_len", "is_causal"),
    refused=("q_proj", "k_proj", "v_proj", "output_proj", "pos_embeddings"), inert=("attn_dropout",))
#: the rotary classes the torchtune spec models (``pos_embeddings``): each pairs neighbours or halves as named
TORCHTUNE_ROTARIES = {"RotaryPositionalEmbeddings": "interleaved", "Llama3ScaledRoPE": "interleaved",
                      "Phi3RotaryPositionalEmbeddings": "half", "Qwen2RotaryPositionalEmbeddings": "half"}


def _torchtune_unmodelled(module: Any) -> list[str]:
    """Projections that are not a plain ``nn.Linear`` (LoRA's adapters, quantized layers) and a rotary class other
    than the modelled ones (the 2-D vision rotary among them)."""
    unmodelled = [f"{name}={type(getattr(module, name)).__name__} (only a plain nn.Linear is read)"
                  for name in ("q_proj", "k_proj", "v_proj", "output_proj")
                  if type(getattr(module, name, None)) is not nn.Linear]
    rope = getattr(module, "pos_embeddings", None)
    if rope is not None and type(rope).__name__ not in TORCHTUNE_ROTARIES:
        unmodelled.append(f"pos_embeddings={type(rope).__name__} (modelled: {', '.join(TORCHTUNE_ROTARIES)})")
    return unmodelled


def torchtune_spec(module: Any) -> ModuleSpec:
    """torchtune's ``MultiHeadAttention`` as its builders make it: grouped key/value heads, biases, q/k norms
    (applied after the rotary embedding, torchtune's order; its ``RMSNorm`` keeps its weight as ``scale``), the
    rotary classes (``RotaryPositionalEmbeddings`` and ``Llama3ScaledRoPE`` pair neighbours, Phi-3's and Qwen2's
    halves; the frequencies read from their ``theta``; no sequence past their cache, ``max_seq_len``),
    token-by-token decoding with its KV cache. Refused: any other rotary class (the 2-D
    ``VisionRotaryPositionalEmbeddings`` among them) and projections that are not a plain ``nn.Linear`` (LoRA)."""
    from .specs import TORCHTUNE

    _refuse(module, "torchtune", _torchtune_unmodelled(module))
    rope = getattr(module, "pos_embeddings", None)
    fields: dict[str, Any] = {"decode": torchtune_decode}
    if rope is not None:  # its cache holds max_seq_len positions; the module raises past them
        fields["max_length"] = "pos_embeddings.max_seq_len"
        style: Literal["half", "interleaved"] = "half" if TORCHTUNE_ROTARIES[type(rope).__name__] == "half" \
            else "interleaved"
        fields["rotary"] = Rotary("pos_embeddings.base", style, frequencies=_torchtune_frequencies)
    if getattr(module, "q_norm", None) is not None:
        fields.update(q_norm="q_norm", k_norm="k_norm", norms_after_rotary=True)
    return dataclasses.replace(TORCHTUNE, **fields)


# ----------------------------------------------------------------------------------------------------
# x-transformers
# ----------------------------------------------------------------------------------------------------

def x_transformers_spec(module: Any) -> ModuleSpec:
    """x-transformers' ``Attention``: the shipped ``x_transformers`` spec (grouped key/value heads in its ``(r g)``
    order, value heads of their own size, a context of another width, memory key/values, ``add_zero_kv``, per-head
    output scales, q/k norms, the value-head gate), always causal when built with ``causal=True``. Every other
    option is refused by name before any check (the spec's ``unmodelled``)."""
    from .specs import X_TRANSFORMERS

    conventions = X_TRANSFORMERS.conventions
    if getattr(module, "causal", False):
        conventions = dataclasses.replace(conventions, always_causal=True)
    return dataclasses.replace(X_TRANSFORMERS, conventions=conventions)


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


# ----------------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------------

#: name -> the function that describes a module of that library (the spec ``audit_module(module, name)`` uses)
LIBRARY_SPECS: dict[str, Callable[[Any], ModuleSpec]] = {
    "litgpt": litgpt_spec, "timm": timm_spec, "open_clip": open_clip_spec, "diffusers": diffusers_spec,
    "torchtune": torchtune_spec, "x_transformers": x_transformers_spec}
#: each library's constructor options, as its spec treats them (x_transformers: its twin, in specs)
LIBRARY_OPTIONS: dict[str, Options] = {
    "litgpt": LITGPT_OPTIONS, "timm": TIMM_OPTIONS, "open_clip": OPEN_CLIP_OPTIONS, "diffusers": DIFFUSERS_OPTIONS,
    "torchtune": TORCHTUNE_OPTIONS}


def _register_shipped_options() -> None:
    from .specs import TORCH_MHA_OPTIONS, TYPED_TRANSFORMER_OPTIONS

    LIBRARY_OPTIONS.update(torch_mha=TORCH_MHA_OPTIONS, typed_transformer=TYPED_TRANSFORMER_OPTIONS)
#: the static spec of each library (its class and how the command line builds one), by name
LIBRARY_BASES: dict[str, ModuleSpec] = {"litgpt": LITGPT, "timm": TIMM, "open_clip": OPEN_CLIP, "diffusers": DIFFUSERS}


def _library_of(module: Any) -> str:
    """The name of the library spec (or shipped spec) whose class ``module`` is an instance of."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    for name, spec in {**SHIPPED_SPECS, **LIBRARY_BASES}.items():
        if spec.module_type in names:
            return name
    top = type(module).__module__.split(".")[0]
    if top == "transformers":
        return "hf"
    raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__}: no spec describes this class "
                          f"(libraries with zero-line specs: {', '.join(LIBRARY_SPECS)}; hf for transformers)")


def library_spec(module: Any, name: str | None = None) -> ModuleSpec:
    """The zero-line spec of ``module``: the library's own description (``name``: ``"litgpt"``, ``"timm"``, ...;
    None or ``"auto"``: chosen from the module's class; ``"hf"``: :func:`~typed_transformer.audit.hf_spec`).

    Raises:
        AuditUsageError: the module is of a class no spec describes, or has options its spec does not model (the
            message names them).
    """
    if name in (None, "auto"):
        name = _library_of(module)
    if name == "hf":
        from ._hf import hf_spec

        return hf_spec(module)
    if name in LIBRARY_SPECS:
        base = LIBRARY_BASES.get(name) or SHIPPED_SPECS.get(name)
        if base is not None and base.module_type and base.module_type not in {
                f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}:
            raise AuditUsageError(f"{type(module).__module__}.{type(module).__qualname__} does not match spec "
                                  f"{name!r}: expected a {base.module_type}")
        return LIBRARY_SPECS[name](module)
    if name in SHIPPED_SPECS:
        return SHIPPED_SPECS[name]
    raise KeyError(f"unknown spec {name!r}; shipped specs: {', '.join(SHIPPED_SPECS)}, auto")


def library_version(name: str) -> str | None:
    """The installed version of a library (by its spec name), or None when it is not installed."""
    import importlib.metadata

    distribution = {"open_clip": "open_clip_torch", "x_transformers": "x-transformers"}.get(name, name)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _register() -> None:
    from .specs import SPECS

    for name, spec in LIBRARY_BASES.items():
        SPECS.setdefault(name, spec)
        SHIPPED_SPECS.setdefault(name, spec)
    for name in (*LIBRARY_SPECS, "auto"):
        LIBRARY_READERS[name] = functools.partial(_read, name=name)


def _read(module: Any, name: str) -> ModuleSpec:
    return library_spec(module, name)


_register()
_register_shipped_options()

__all__ = ["DIFFUSERS", "LIBRARY_OPTIONS", "LIBRARY_SPECS", "OPEN_CLIP", "TIMM", "Options", "diffusers_spec",
           "import_without_torchvision", "library_spec", "open_clip_spec", "timm_spec", "torchtune_decode",
           "torchtune_spec", "x_transformers_spec"]
