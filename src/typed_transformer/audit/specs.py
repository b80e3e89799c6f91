"""Shipped :class:`~typed_transformer.audit.ModuleSpec` s (:data:`SPECS`): ``torch_mha``
(``nn.MultiheadAttention``), ``typed_transformer`` (our ``MultiHeadAttention``, with rotary and KV cache),
``gpt2`` (Hugging Face ``GPT2Attention``), ``bert`` (``BertSelfAttention``), ``llama`` (``LlamaAttention``,
rotary embedding and KV cache), the shapes beyond plain self-attention (``gpt2_cross``, ``bart``, ``whisper``:
cross-attention with one memory tensor; ``t5``: relative position bias; ``bloom``, ``mpt``, ``falcon_alibi``:
ALiBi (BLOOM's fused qkv per head);
``gpt_neox``, ``phi``: partial rotary; ``falcon``: fused qkv per key/value group; ``mistral``, ``qwen2``:
sliding window; ``qwen3``, ``olmo2``: q/k norms),
``torchtune`` (``torchtune.modules.MultiHeadAttention``) and
``x_transformers`` (``x_transformers.Attention``). Third-party libraries are imported only when a spec's
module is called or built.

Conventions each module gets (what its forward does, as the audit found it on this project's pinned
versions): Hugging Face modules take additive masks filled with ``finfo(dtype).min`` (a fully masked row
then attends uniformly: ``fully_masked="uniform"``) and get causality as a mask; torchtune applies its own
causal mask only when no mask is given (``mask_with_causal=False``) and takes ``(b, t, s)`` masks
(``per_head_masks=False``); x-transformers groups query heads ``(r g)``, zeroes fully masked rows and
computes its softmax in float32 whatever the input dtype (a float64 audit reports it).
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from ._core import AuditUsageError, Conventions
from ._modules import (
    SHIPPED_SPECS,
    ALiBi,
    ModuleSpec,
    Options,
    OutputGate,
    Rotary,
    Weights,
    additive_mask,
    resolve,
    spec_weights,
    with_causal,
)

# ----------------------------------------------------------------------------------------------------
# nn.MultiheadAttention
# ----------------------------------------------------------------------------------------------------


def _mha_weights(m: Any) -> Weights:
    if not isinstance(m, nn.MultiheadAttention):
        raise AuditUsageError(f"{type(m).__module__}.{type(m).__qualname__} does not match spec 'torch_mha': "
                              "expected a torch.nn.MultiheadAttention")
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.detach().double().chunk(3)
    else:
        wq, wk, wv = (getattr(m, f"{n}_proj_weight").detach().double() for n in "qkv")
    bq, bk, bv = (None, None, None) if m.in_proj_bias is None else m.in_proj_bias.detach().double().chunk(3)
    bo = None if m.out_proj.bias is None else m.out_proj.bias.detach().double()
    d = m.embed_dim // m.num_heads
    # add_bias_kv appends bias_k/bias_v after the projected keys/values, add_zero_attn then one zero position;
    # torch pads attn_mask and key_padding_mask so that both are always visible
    extra_k = [] if m.bias_k is None else [m.bias_k.detach().double().reshape(1, -1)]
    extra_v = [] if m.bias_v is None else [m.bias_v.detach().double().reshape(1, -1)]
    if m.add_zero_attn:
        extra_k.append(torch.zeros(1, m.embed_dim, dtype=torch.float64))
        extra_v.append(torch.zeros(1, m.embed_dim, dtype=torch.float64))
    return Weights(wq, wk, wv, m.out_proj.weight.detach().double(), bq, bk, bv, bo, m.num_heads, m.num_heads, d, d,
                   1.0 / math.sqrt(d), torch.cat(extra_k) if extra_k else None,
                   torch.cat(extra_v) if extra_v else None)


def _mha_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                 is_causal: bool) -> Tensor:
    """torch's masks: True = masked out; a ``(b, 1, 1, s)`` mask goes in as ``key_padding_mask``; causality
    as an explicit ``attn_mask`` (torch's own ``is_causal`` is only a hint that such a mask is given)."""
    assert key is not None
    assert value is not None
    b, t, s = x.shape[0], x.shape[1], key.shape[1]
    attn_mask = padding = None
    if keep is not None and keep.shape[1] == 1 and keep.shape[2] == 1:
        padding, keep = ~keep[:, 0, 0], None
    keep = with_causal(keep, is_causal, t, s)
    if keep is not None:
        attn_mask = rearrange(~keep.expand(b, m.num_heads, t, s), "b h t s -> (b h) t s")
    if not m.batch_first:
        x, key, value = (rearrange(z, "b t e -> t b e") for z in (x, key, value))
    out, _ = m(x, key, value, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)
    result: Tensor = out if m.batch_first else rearrange(out, "t b e -> b t e")
    return result


def _mha_fast_path(m: Any, x: Tensor, real: Tensor) -> Tensor | None:
    """eval, no grad, batch-first self-attention (one tensor for query, key and value), key padding mask."""
    if not m._qkv_same_embed_dim or m.num_heads % 2:
        return None
    m.batch_first = True  # a copy: batch_first only decides the layout of the arguments
    with torch.no_grad():
        out, _ = m(x, x, x, key_padding_mask=~real, need_weights=False)
    result: Tensor = out
    return result


#: every constructor option of nn.MultiheadAttention: all modelled (dropout is off in the audit's eval mode)
TORCH_MHA_OPTIONS = Options(
    "torch.nn.modules.activation.MultiheadAttention",
    modelled=("embed_dim", "num_heads", "bias", "add_bias_kv", "add_zero_attn", "kdim", "vdim", "batch_first"),
    refused=(), inert=("dropout", "device", "dtype"))

TORCH_MHA = ModuleSpec(
    "torch_mha", _mha_forward, Conventions(fully_masked="zero"), weights=_mha_weights, fast_path=_mha_fast_path,
    build=lambda cls, config: cls(**config), module_type="torch.nn.modules.activation.MultiheadAttention")


# ----------------------------------------------------------------------------------------------------
# typed_transformer.MultiHeadAttention
# ----------------------------------------------------------------------------------------------------


def _ours_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                  is_causal: bool) -> Tensor:
    out, _ = m(x, attn_mask=keep, is_causal=is_causal)
    result: Tensor = out
    return result


def _ours_decode(m: Any, x: Tensor) -> Tensor:
    from ..multihead import KVCache

    cache = KVCache()
    return torch.cat([m(x[:, i:i + 1], kv_cache=cache, is_causal=True)[0] for i in range(x.shape[1])], dim=1)


_OURS_FUSED = ModuleSpec("typed_transformer", _ours_forward, qkv="in_proj", q=None, k=None, v=None, out="out_proj",
                         num_kv_heads="num_kv_heads", head_dim="head_dim")
_OURS_SEPARATE = ModuleSpec("typed_transformer", _ours_forward, out="out_proj", num_kv_heads="num_kv_heads",
                            head_dim="head_dim")


def _ours_weights(m: Any) -> Weights:
    from ._modules import spec_weights

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
    from ..positions import RotaryEmbedding

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


# ----------------------------------------------------------------------------------------------------
# Hugging Face
# ----------------------------------------------------------------------------------------------------


def _hf_mask(x: Tensor, keep: Tensor | None, is_causal: bool) -> Tensor:
    """An explicit additive mask, always: without one, HF's sdpa kernel decides causality by itself."""
    b, t = x.shape[0], x.shape[1]
    keep = with_causal(keep, is_causal, t, t)
    if keep is None:
        keep = torch.ones(1, 1, t, t, dtype=torch.bool)
    mask = additive_mask(keep.expand(b, keep.shape[1], t, t), x.dtype)
    assert mask is not None
    return mask


def _hf_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
    out = m(x, attention_mask=_hf_mask(x, keep, is_causal))
    result: Tensor = out[0] if isinstance(out, tuple) else out
    return result


_HF = Conventions(self_attention=True, fully_masked="uniform")

GPT2 = ModuleSpec("gpt2", _hf_forward, _HF, q=None, k=None, v=None, qkv="c_attn", transposed=True, out="c_proj",
                  num_heads="num_heads", head_dim="head_dim", scale="scaling",
                  build=lambda cls, config: _hf_build(cls, "GPT2Config", config, layer_idx=0),
                  module_type="transformers.models.gpt2.modeling_gpt2.GPT2Attention")

BERT = ModuleSpec("bert", _hf_forward, _HF, q="query", k="key", v="value", out=None,
                  num_heads="num_attention_heads", head_dim="attention_head_size", scale="scaling",
                  build=lambda cls, config: _hf_build(cls, "BertConfig", config),
                  module_type="transformers.models.bert.modeling_bert.BertSelfAttention")


def _llama_rotary(m: Any, x: Tensor, offset: int) -> tuple[Tensor, Tensor]:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config=m.config)
    positions = torch.arange(offset, offset + x.shape[1])[None]
    cos, sin = rotary(x, positions)
    return cos, sin


def _llama_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                   is_causal: bool) -> Tensor:
    out = m(x, position_embeddings=_llama_rotary(m, x, 0), attention_mask=_hf_mask(x, keep, is_causal))
    result: Tensor = out[0]
    return result


def _llama_decode(m: Any, x: Tensor) -> Tensor:
    from transformers import DynamicCache

    cache = DynamicCache(config=m.config)
    outs = []
    for i in range(x.shape[1]):
        token = x[:, i:i + 1]
        # no mask: one query sees every cached key
        outs.append(m(token, position_embeddings=_llama_rotary(m, token, i), attention_mask=None, cache=cache)[0])
    return torch.cat(outs, dim=1)


LLAMA = ModuleSpec("llama", _llama_forward, _HF, num_heads="config.num_attention_heads",
                   num_kv_heads="config.num_key_value_heads", head_dim="head_dim", scale="scaling",
                   rotary=Rotary("config.rope_parameters.rope_theta", "half"), decode=_llama_decode,
                   build=lambda cls, config: _hf_build(cls, "LlamaConfig", config, layer_idx=0),
                   module_type="transformers.models.llama.modeling_llama.LlamaAttention")


# ----------------------------------------------------------------------------------------------------
# Hugging Face: cross-attention with one memory tensor (GPT-2, BART, Whisper)
# ----------------------------------------------------------------------------------------------------


def _cross_mask(x: Tensor, memory: Tensor, keep: Tensor | None, is_causal: bool) -> Tensor:
    b, t, s = x.shape[0], x.shape[1], memory.shape[1]
    keep = with_causal(keep, is_causal, t, s)
    if keep is None:
        keep = torch.ones(1, 1, t, s, dtype=torch.bool)
    mask = additive_mask(keep.expand(b, keep.shape[1], t, s), x.dtype)
    assert mask is not None
    return mask


def _gpt2_cross_weights(m: Any) -> Weights:
    """GPT-2's cross-attention: ``q_attn`` for queries, ``c_attn`` the fused ``[k; v]`` (``Conv1D``, stored
    ``(in, out)``)."""
    if not getattr(m, "is_cross_attention", False):
        raise AuditUsageError("spec 'gpt2_cross' needs GPT2Attention(config, is_cross_attention=True); for "
                              "self-attention use spec 'gpt2'")
    wq, bq = m.q_attn.weight.detach().double().T, m.q_attn.bias.detach().double()
    wk, wv = m.c_attn.weight.detach().double().T.chunk(2)
    bk, bv = m.c_attn.bias.detach().double().chunk(2)
    h, d = m.num_heads, m.head_dim
    return Weights(wq, wk, wv, m.c_proj.weight.detach().double().T, bq, bk, bv, m.c_proj.bias.detach().double(),
                   h, h, d, d, float(m.scaling))


def _gpt2_cross_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                        is_causal: bool) -> Tensor:
    assert key is not None
    out = m(x, encoder_hidden_states=key, encoder_attention_mask=_cross_mask(x, key, keep, is_causal))
    result: Tensor = out[0]
    return result


_CROSS = Conventions(fully_masked="uniform")

GPT2_CROSS = ModuleSpec("gpt2_cross", _gpt2_cross_forward, _CROSS, weights=_gpt2_cross_weights, memory=True,
                        build=lambda cls, config: _hf_build(cls, "GPT2Config", config, is_cross_attention=True,
                                                            layer_idx=0),
                        module_type="transformers.models.gpt2.modeling_gpt2.GPT2Attention")


def _kv_states_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                       is_causal: bool) -> Tensor:
    """BART/Whisper decoder cross-attention: ``key_value_states`` is the memory."""
    assert key is not None
    out = m(x, key_value_states=key, attention_mask=_cross_mask(x, key, keep, is_causal))
    result: Tensor = out[0]
    return result


def _build_seq2seq_attention(config_name: str) -> Callable[[type, dict[str, Any]], nn.Module]:
    """``config``: ``embed_dim``, ``num_heads`` (the decoder's cross-attention: ``is_decoder=True``)."""

    def build(cls: type, config: dict[str, Any]) -> nn.Module:
        import transformers

        hf_config = getattr(transformers, config_name)()
        hf_config._attn_implementation = "eager"
        module: nn.Module = cls(config["embed_dim"], config["num_heads"], is_decoder=True, config=hf_config,
                                layer_idx=0)
        return module

    return build


BART = ModuleSpec("bart", _kv_states_forward, _CROSS, out="out_proj", head_dim="head_dim", scale="scaling",
                  memory=True, build=_build_seq2seq_attention("BartConfig"),
                  module_type="transformers.models.bart.modeling_bart.BartAttention")
WHISPER = dataclasses.replace(BART, name="whisper", build=_build_seq2seq_attention("WhisperConfig"),
                              module_type="transformers.models.whisper.modeling_whisper.WhisperAttention")


# ----------------------------------------------------------------------------------------------------
# Hugging Face: T5 (relative position bias, no 1/sqrt(d))
# ----------------------------------------------------------------------------------------------------


def _t5_bias(m: Any, t: int, s: int) -> Tensor:
    if not m.has_relative_attention_bias:
        raise AuditUsageError("spec 't5' reads the relative position bias: build T5Attention(config, "
                              "has_relative_attention_bias=True) (later T5 layers reuse the first layer's bias)")
    # written out from the embedding table (not through compute_bias, the code audited): key j - query p, bucketed
    relative = torch.arange(s)[None, :] - torch.arange(s - t, s)[:, None]
    # Pix2Struct's text attention has no is_decoder: a decoder, its compute_bias one-directional
    buckets = m._relative_position_bucket(relative, bidirectional=not getattr(m, "is_decoder", True),
                                          num_buckets=m.relative_attention_num_buckets,
                                          max_distance=m.relative_attention_max_distance)
    table: Tensor = m.relative_attention_bias.weight.detach().double()
    return rearrange(table[buckets], "t s h -> h t s")


def _t5_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
    out = m(x, mask=_hf_mask(x, keep, is_causal))
    result: Tensor = out[0]
    return result


T5 = ModuleSpec("t5", _t5_forward, _HF, q="q", k="k", v="v", out="o", num_heads="n_heads",
                head_dim="key_value_proj_dim", scale=1.0, position_bias=_t5_bias,
                build=lambda cls, config: _hf_build(cls, "T5Config", config, has_relative_attention_bias=True),
                module_type="transformers.models.t5.modeling_t5.T5Attention")


# ----------------------------------------------------------------------------------------------------
# Hugging Face: BLOOM (ALiBi, fused qkv laid out per head)
# ----------------------------------------------------------------------------------------------------


def _bloom_alibi(m: Any, b: int, s: int, dtype: torch.dtype) -> Tensor:
    """The model's ALiBi tensor ``(b h, 1, s)`` for ``s`` unpadded positions (BLOOM builds it outside the
    attention class, with ``build_alibi_tensor``: part of the code audited)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi: Tensor = build_alibi_tensor(torch.ones(b, s, dtype=torch.long), m.num_heads, dtype)
    return alibi


def _bloom_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                   is_causal: bool) -> Tensor:
    """``residual`` zero: the attention class adds it to its output."""
    b, t = x.shape[0], x.shape[1]
    out = m(x, torch.zeros_like(x), _bloom_alibi(m, b, t, x.dtype), _hf_mask(x, keep, is_causal))
    result: Tensor = out[0]
    return result


def _bloom_decode(m: Any, x: Tensor) -> Tensor:
    from transformers import DynamicCache

    cache = DynamicCache()  # BloomAttention keeps no config
    outs = []
    for i in range(x.shape[1]):
        token = x[:, i:i + 1]
        # no mask: one query sees every cached key; the ALiBi tensor covers them all
        outs.append(m(token, torch.zeros_like(token), _bloom_alibi(m, x.shape[0], i + 1, x.dtype), None,
                      layer_past=cache)[0])
    return torch.cat(outs, dim=1)


BLOOM = ModuleSpec("bloom", _bloom_forward, _HF, q=None, k=None, v=None, qkv="query_key_value", qkv_layout="heads",
                   out="dense", head_dim="head_dim", scale="inv_norm_factor",
                   alibi=ALiBi("key"), decode=_bloom_decode,
                   build=lambda cls, config: _hf_build(cls, "BloomConfig", config, layer_idx=0),
                   module_type="transformers.models.bloom.modeling_bloom.BloomAttention")



def _mpt_bias(m: Any) -> Tensor:
    """MPT's ALiBi tensor ``(h, 1, max_seq_len)``, built as its model builds it (``build_mpt_alibi_tensor``: part of
    the code audited); the class slices the last ``s`` keys of it."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    bias: Tensor = build_mpt_alibi_tensor(m.n_heads, m.max_seq_length)  # type: ignore[no-untyped-call]
    return bias


def _mpt_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                 is_causal: bool) -> Tensor:
    """MPT's mask is boolean, True where a key is masked (its model casts the additive mask to bool)."""
    b, t = x.shape[0], x.shape[1]
    keep = with_causal(keep, is_causal, t, t)
    masked = None if keep is None else ~keep.expand(b, keep.shape[1], t, t)
    result: Tensor = m(x, _mpt_bias(m).to(x.dtype), attention_mask=masked)[0]
    return result


def _mpt_decode(m: Any, x: Tensor) -> Tensor:
    from transformers import DynamicCache

    cache = DynamicCache()  # MptAttention keeps no config
    return torch.cat([m(x[:, i:i + 1], _mpt_bias(m).to(x.dtype), cache=cache)[0] for i in range(x.shape[1])], dim=1)


def _mpt_unmodelled(m: Any) -> list[str]:
    """MPT's ``clip_qkv`` clamps the fused projection's outputs: not part of the reference."""
    return [f"clip_qkv={m.clip_qkv}"] if m.clip_qkv else []


#: MPT: ALiBi from ``build_mpt_alibi_tensor`` (``m_i (j - L + 1)``, the key form up to one constant)
MPT = ModuleSpec("mpt", _mpt_forward, _HF, q=None, k=None, v=None, qkv="Wqkv", out="out_proj", num_heads="n_heads",
                 head_dim="head_dim", scale="softmax_scale", alibi=ALiBi("key"), decode=_mpt_decode,
                 build=lambda cls, config: _hf_build(cls, "MptConfig", config, layer_idx=0),
                 unmodelled=_mpt_unmodelled, module_type="transformers.models.mpt.modeling_mpt.MptAttention")


# ----------------------------------------------------------------------------------------------------
# Hugging Face: rotary modules (partial rotary, sliding windows, q/k norms)
# ----------------------------------------------------------------------------------------------------


def _rope_spec(name: str, model: str, config_name: str, prefix: str, cache: str = "cache",
               call: dict[str, Any] | None = None, decode_mask: bool = False, **fields: Any) -> ModuleSpec:
    """A Llama-shaped spec for ``transformers.models.{model}``: ``{prefix}Attention`` called with its own
    ``{prefix}RotaryEmbedding``'s ``position_embeddings`` (and the keywords ``call``) and a KV cache built from
    its config (a sliding-window cache where the config declares a window), passed as keyword ``cache``; with
    ``decode_mask`` each decoded token gets an all-visible additive mask (an eager kernel that adds it always)."""
    extra = dict(call or {})
    path = f"transformers.models.{model}.modeling_{model}"

    def rotary(m: Any, x: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        import importlib

        embedding = getattr(importlib.import_module(path), f"{prefix}RotaryEmbedding")(config=m.config)
        cos, sin = embedding(x, torch.arange(offset, offset + x.shape[1])[None])
        return cos, sin

    window = fields.get("window")

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        size = None if window is None else resolve(m, window, name)
        if size is not None:  # the model builds the window into the mask; a standalone module gets it so
            t = x.shape[1]
            inside = (torch.arange(t)[None] > torch.arange(t)[:, None] - int(size))[None, None]
            keep = inside if keep is None else keep & inside
        out = m(x, position_embeddings=rotary(m, x, 0), attention_mask=_hf_mask(x, keep, is_causal), **extra)
        result: Tensor = out[0]
        return result

    def decode(m: Any, x: Tensor) -> Tensor:
        from transformers import DynamicCache

        kv_cache = DynamicCache(config=m.config)
        outs = []
        for i in range(x.shape[1]):
            token = x[:, i:i + 1]
            # no mask: one query sees every cached key (a sliding-window cache keeps only the window)
            mask = torch.zeros(x.shape[0], 1, 1, i + 1, dtype=x.dtype) if decode_mask else None
            outs.append(m(token, position_embeddings=rotary(m, token, i), attention_mask=mask,
                          **{cache: kv_cache}, **extra)[0])
        return torch.cat(outs, dim=1)

    defaults: dict[str, Any] = {
        "num_heads": "config.num_attention_heads", "num_kv_heads": "config.num_key_value_heads",
        "head_dim": "head_dim", "scale": "scaling", "rotary": Rotary("config.rope_parameters.rope_theta", "half")}
    return ModuleSpec(name, forward, _HF, decode=decode,
                      build=lambda cls, config: _hf_build(cls, config_name, config, layer_idx=0),
                      module_type=f"{path}.{prefix}Attention", **{**defaults, **fields})


_PARTIAL = Rotary("config.rope_parameters.rope_theta", "half", fraction="config.rope_parameters.partial_rotary_factor")

GPT_NEOX = _rope_spec("gpt_neox", "gpt_neox", "GPTNeoXConfig", "GPTNeoX", "layer_past", q=None, k=None, v=None,
                      qkv="query_key_value", qkv_layout="heads", out="dense", num_kv_heads=None, head_dim="head_size",
                      rotary=_PARTIAL)
PHI = _rope_spec("phi", "phi", "PhiConfig", "Phi", out="dense", rotary=_PARTIAL, q_norm="q_layernorm?",
                 k_norm="k_layernorm?")
#: Falcon's three fused layouts are one: per key/value group (``g = h`` without multi-query, ``g = 1`` with it)
FALCON = _rope_spec("falcon", "falcon", "FalconConfig", "Falcon", "layer_past", call={"alibi": None},
                    decode_mask=True, q=None, k=None, v=None, qkv="query_key_value", qkv_layout="groups", out="dense",
                    num_heads="num_heads", num_kv_heads="num_kv_heads", head_dim="head_dim", scale="inv_norm_factor")


def _falcon_alibi(m: Any, b: int, s: int, dtype: torch.dtype) -> Tensor:
    """Falcon's ALiBi tensor ``(b h, 1, s)``, as its model builds it (``build_alibi_tensor``: part of the code
    audited)."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    alibi: Tensor = build_alibi_tensor(torch.ones(b, s, dtype=torch.long), m.num_heads, dtype)
    return alibi


def _falcon_alibi_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                          is_causal: bool) -> Tensor:
    b, t = x.shape[0], x.shape[1]
    result: Tensor = m(x, _falcon_alibi(m, b, t, x.dtype), _hf_mask(x, keep, is_causal))[0]
    return result


def _falcon_alibi_decode(m: Any, x: Tensor) -> Tensor:
    from transformers import DynamicCache

    cache, b = DynamicCache(config=m.config), x.shape[0]
    # an all-visible additive mask for each token: its eager kernel adds one always
    return torch.cat([m(x[:, i:i + 1], _falcon_alibi(m, b, i + 1, x.dtype),
                        torch.zeros(b, 1, 1, i + 1, dtype=x.dtype), layer_past=cache)[0]
                      for i in range(x.shape[1])], dim=1)


#: Falcon built with ``alibi=True`` (Falcon-RW): no rotary, ALiBi added to ``q.k`` before its ``1/sqrt(d)``
FALCON_ALIBI = dataclasses.replace(
    FALCON, name="falcon_alibi", forward=_falcon_alibi_forward, decode=_falcon_alibi_decode, rotary=None,
    alibi=ALiBi("key", factor="inv_norm_factor"),
    unmodelled=lambda m: [] if m.config.alibi else ["alibi=False (the falcon spec describes it)"])
FALCON = dataclasses.replace(FALCON, unmodelled=lambda m: ["alibi=True (the falcon_alibi spec describes it)"]
                             if m.config.alibi else [])
MISTRAL = _rope_spec("mistral", "mistral", "MistralConfig", "Mistral", window="config.sliding_window")
QWEN2 = _rope_spec("qwen2", "qwen2", "Qwen2Config", "Qwen2", window="sliding_window")
#: OLMo-2: RMSNorm over every head's queries (and keys) at once, a weight ``h * d`` wide
OLMO2 = _rope_spec("olmo2", "olmo2", "Olmo2Config", "Olmo2", q_norm="q_norm", k_norm="k_norm")
QWEN3 = _rope_spec("qwen3", "qwen3", "Qwen3Config", "Qwen3", window="sliding_window", q_norm="q_norm",
                   k_norm="k_norm")


def _hf_build(cls: type, config_name: str, config: dict[str, Any], **kwargs: Any) -> nn.Module:
    import transformers

    hf_config = getattr(transformers, config_name)(**config)
    if getattr(hf_config, "_attn_implementation", None) is None:
        hf_config._attn_implementation = "eager"  # a standalone module: no model chose a kernel
    module: nn.Module = cls(hf_config, **kwargs)
    return module


# ----------------------------------------------------------------------------------------------------
# torchtune and x-transformers
# ----------------------------------------------------------------------------------------------------


def _torchtune_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                       is_causal: bool) -> Tensor:
    """A ``(b, t, s)`` keep-mask, or none and the module's own (top-left SDPA) causal flag."""
    if keep is not None:
        out: Tensor = m(x, x, mask=keep[:, 0].expand(x.shape[0], x.shape[1], x.shape[1]))
        return out
    m.is_causal = is_causal  # a copy
    out = m(x, x)
    return out


def _build_torchtune(cls: type, config: dict[str, Any]) -> nn.Module:
    """``config``: ``embed_dim``, ``num_heads`` and optionally ``num_kv_heads``, ``head_dim``, ``bias`` (of the
    ``nn.Linear`` projections, default False) and ``rotary_base`` (torchtune's ``RotaryPositionalEmbeddings``)."""
    config = dict(config)
    embed, heads = config["embed_dim"], config["num_heads"]
    kv_heads = config.setdefault("num_kv_heads", heads)
    head_dim = config.setdefault("head_dim", embed // heads)
    bias = config.pop("bias", False)
    base = config.pop("rotary_base", None)
    if base is not None:
        from torchtune.modules import RotaryPositionalEmbeddings

        config["pos_embeddings"] = RotaryPositionalEmbeddings(head_dim, base=base)
    module: nn.Module = cls(**config, q_proj=nn.Linear(embed, heads * head_dim, bias=bias),
                            k_proj=nn.Linear(embed, kv_heads * head_dim, bias=bias),
                            v_proj=nn.Linear(embed, kv_heads * head_dim, bias=bias),
                            output_proj=nn.Linear(heads * head_dim, embed, bias=bias))
    return module


TORCHTUNE = ModuleSpec(
    "torchtune", _torchtune_forward,
    Conventions(self_attention=True, causal_alignment="top-left", mask_with_causal=False, per_head_masks=False),
    out="output_proj", num_kv_heads="num_kv_heads", head_dim="head_dim", build=_build_torchtune,
    rotary=Rotary("pos_embeddings.base", "interleaved", when="pos_embeddings"),
    module_type="torchtune.modules.attention.MultiHeadAttention")


def _x_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
               is_causal: bool) -> Tensor:
    if keep is not None and keep.shape[1] > 1:  # x-transformers reads (b, h, t, s) masks in its (r g) order
        keep = rearrange(keep, "b (g r) t s -> b (r g) t s", g=m.kv_heads)
    # causal=None keeps the module's own flag (forward's causal=False would switch off a causal=True module's mask,
    # which its spec declares always_causal, as its model calls it)
    out = m(x, attn_mask=keep, causal=True if is_causal else None)
    result: Tensor = out[0] if isinstance(out, tuple) else out
    return result


def _x_l2norm(groups: int, gain: Tensor | None) -> Callable[[Tensor], Tensor]:
    """x-transformers' ``qk_norm``: each head's features in ``groups`` groups, each scaled to unit l2 norm
    (``F.normalize``: ``x / max(|x|, 1e-12)``), times the learned per-head gain when ``qk_norm_dim_scale``."""

    def norm(x: Tensor) -> Tensor:
        y: Tensor = rearrange(x.double(), "b h t (n d) -> b h t n d", n=groups)
        y = rearrange(y / y.norm(dim=-1, keepdim=True).clamp_min(1e-12), "b h t n d -> b h t (n d)")
        return (y if gain is None else y * gain).to(x.dtype)

    return norm


def _x_norms(m: Any) -> dict[str, Callable[[Tensor], Tensor]]:
    if not m.qk_norm:
        return {}
    q_gain = k_gain = None
    if m.qk_norm_dim_scale:  # (h, 1, d) in x-transformers' (r g) head order, to ours
        q_gain = rearrange(m.qk_norm_q_scale.detach().double(), "(r g) one d -> (g r) one d", g=m.kv_heads)
        k_gain = m.qk_norm_k_scale.detach().double()
    return {"q": _x_l2norm(m.qk_norm_groups, q_gain), "k": _x_l2norm(m.qk_norm_groups, k_gain)}


def _x_weights(m: Any) -> Weights:
    """The projections (queries in x-transformers' ``(r g)`` head order, turned to ours), the memory key/values
    (``num_mem_kv``) and ``add_zero_kv``'s zero position as always-visible extra positions, the per-head output
    scales (``head_scale``) folded into ``to_out``."""
    w = spec_weights(m, dataclasses.replace(X_TRANSFORMERS, weights=None))
    extra_k, extra_v = [], []
    if getattr(m, "num_mem_kv", 0):
        extra_k.append(rearrange(m.mem_k.detach().double(), "g n d -> n (g d)"))
        extra_v.append(rearrange(m.mem_v.detach().double(), "g n d -> n (g d)"))
    if getattr(m.attend, "add_zero_kv", False):
        extra_k.append(torch.zeros(1, w.g * w.d, dtype=torch.float64))
        extra_v.append(torch.zeros(1, w.g * w.dv, dtype=torch.float64))
    wo = w.wo
    if getattr(m, "head_scale", False) and wo is not None:
        scales = rearrange(m.head_scale_params.detach().double().flatten(), "(r g) -> (g r)", g=w.g)
        wo = wo * repeat(scales, "h -> (h dv)", dv=w.dv)[None]
    weights: Weights = dataclasses.replace(w, wo=wo, extra_k=torch.cat(extra_k) if extra_k else None,
                                           extra_v=torch.cat(extra_v) if extra_v else None)
    return weights


#: the x-transformers options the spec models: read back from an instance to build its twin with only them
_X_MODELLED = ("causal", "qk_norm", "qk_norm_groups", "qk_norm_dim_scale", "head_scale")
#: attributes of an instance whose option has another name
_X_OPTION_OF = {"attend.pre_softmax_talking_heads": "pre_talking_heads",
                "attend.post_softmax_talking_heads": "post_talking_heads", "to_v_gate": "gate_values",
                "to_output_gate": "output_gate", "mem_k": "num_mem_kv", "mem_v": "num_mem_kv",
                "head_scale_params": "head_scale", "attend.attn_fn": "sigmoid / hard / gumbel_softmax / ...",
                "to_latent_q": "use_latent_q", "to_latent_kv": "use_latent_kv", "q_rmsnorm": "qk_rmsnorm",
                "k_rmsnorm": "qk_rmsnorm / k_rmsnorm", "value_rmsnorm": "value_rmsnorm"}


def _x_state(m: nn.Module) -> dict[str, str]:
    """What an x-transformers ``Attention`` was built with, as it keeps it: each plain attribute (numbers, flags,
    strings, the attention function's name and options) and each parameter's shape, by dotted name."""
    import functools

    state = {f"{name}": str(tuple(p.shape)) for name, p in m.named_parameters()}
    for prefix, sub in m.named_modules():
        for key, value in vars(sub).items():
            if isinstance(value, functools.partial):
                value = (getattr(value.func, "__name__", "?"), sorted(value.keywords.items()))
            if not key.startswith("_") and key != "training" and isinstance(value, bool | int | float | str | tuple):
                state[f"{prefix}.{key}".lstrip(".")] = str(value)
    return state


def _x_unmodelled(m: Any) -> list[str]:
    """The options ``m`` was built with that the ``x_transformers`` spec does not model: its state against the
    state of a twin built with only the modelled options (sizes, heads, causal, qk norm, the value-head gate)."""
    dim_head = m.to_q.out_features // m.heads
    twin = type(m)(m.to_q.in_features, dim_head=dim_head, heads=m.heads, kv_heads=m.kv_heads,
                   dim_context=m.to_k.in_features, value_dim_head=m.to_v.out_features // m.kv_heads,
                   dim_out=m.to_out.out_features, gate_value_heads=m.to_v_head_gate is not None,
                   qk_norm_scale=m.qk_norm_scale, flash=m.attend.flash, dropout=m.attend.dropout,
                   add_zero_kv=m.attend.add_zero_kv,
                   **{name: getattr(m, name) for name in _X_MODELLED})
    ours, theirs = _x_state(m), _x_state(twin)
    options: dict[str, str] = {}
    for name in sorted(ours.keys() | theirs.keys()):
        if ours.get(name) == theirs.get(name):
            continue
        owner = next((option for attribute, option in _X_OPTION_OF.items()
                      if name == attribute or name.startswith(f"{attribute}.")), None)
        key = owner or name.removeprefix("attend.")
        options.setdefault(key, key if owner or name not in ours else f"{key}={ours[name]}")
    if len(options) > 1:  # the attention function changes with the option that chose it: name that option
        options.pop(_X_OPTION_OF["attend.attn_fn"], None)
    return list(options.values())


X_TRANSFORMERS = ModuleSpec(
    "x_transformers", _x_forward, Conventions(self_attention=True, fully_masked="zero"),
    q="to_q", k="to_k", v="to_v", out="to_out", num_heads="heads", num_kv_heads="kv_heads", scale="attend.scale",
    grouping="r g", build=lambda cls, config: cls(**config), norms=_x_norms, unmodelled=_x_unmodelled,
    weights=_x_weights,
    gate=OutputGate("to_v_head_gate"), module_type="x_transformers.x_transformers.Attention")

#: The shipped specs by name.
SPECS: dict[str, ModuleSpec] = {spec.name: spec for spec in (
    TORCH_MHA, TYPED_TRANSFORMER, GPT2, GPT2_CROSS, BERT, BART, WHISPER, T5, BLOOM, MPT, LLAMA, GPT_NEOX, FALCON,
    FALCON_ALIBI, PHI, MISTRAL, QWEN2, QWEN3, OLMO2, TORCHTUNE, X_TRANSFORMERS)}
SHIPPED_SPECS.update(SPECS)  # audit_module(..., spec="name") finds them there (_modules never imports this module)

__all__ = ["BART", "BERT", "BLOOM", "FALCON", "FALCON_ALIBI", "GPT2", "GPT2_CROSS", "GPT_NEOX", "LLAMA", "MISTRAL",
           "MPT", "OLMO2", "PHI", "QWEN2", "QWEN3", "SPECS", "T5", "TORCHTUNE", "TORCH_MHA", "TYPED_TRANSFORMER",
           "WHISPER", "X_TRANSFORMERS"]
