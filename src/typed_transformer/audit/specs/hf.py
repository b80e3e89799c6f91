"""Shipped specs of Hugging Face attention classes written by hand: GPT-2, BERT, Llama, GPT-2 cross-attention, BART,
Whisper, T5, BLOOM, MPT, GPT-NeoX, Phi, Falcon, Mistral, Qwen2, OLMo 2, Qwen3."""

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..core.conventions import AuditUsageError, Conventions
from ..modules.masking import additive_mask, with_causal
from ..modules.positions import ALiBi, Rotary
from ..modules.spec import ModuleSpec, Weights, resolve

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
               call: Callable[[Any], dict[str, Any]] | None = None, decode_mask: bool = False,
               **fields: Any) -> ModuleSpec:
    """A Llama-shaped spec for ``transformers.models.{model}``: ``{prefix}Attention`` called with its own
    ``{prefix}RotaryEmbedding``'s ``position_embeddings`` (and the keywords ``call(module)``) and a KV cache built from
    its config (a sliding-window cache where the config declares a window), passed as keyword ``cache``; with
    ``decode_mask`` each decoded token gets an all-visible additive mask (an eager kernel that adds it always)."""
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
        out = m(x, position_embeddings=rotary(m, x, 0), attention_mask=_hf_mask(x, keep, is_causal),
                **(call(m) if call else {}))
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
                          **{cache: kv_cache}, **(call(m) if call else {}))[0])
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
def _falcon_takes_alibi(m: Any) -> bool:
    """Whether this Falcon attention takes its ALiBi as the argument ``alibi`` (transformers up to 5.24); from 5.25
    its model folds ``alibi / sqrt(d)`` into ``attention_mask`` instead, and the attention only adds the mask."""
    return "alibi" in inspect.signature(type(m).forward).parameters


#: Falcon's three fused layouts are one: per key/value group (``g = h`` without multi-query, ``g = 1`` with it)
FALCON = _rope_spec("falcon", "falcon", "FalconConfig", "Falcon", "layer_past",
                    call=lambda m: {"alibi": None} if _falcon_takes_alibi(m) else {},
                    decode_mask=True, q=None, k=None, v=None, qkv="query_key_value", qkv_layout="groups", out="dense",
                    num_heads="num_heads", num_kv_heads="num_kv_heads", head_dim="head_dim", scale="inv_norm_factor")


def _falcon_alibi(m: Any, b: int, s: int, dtype: torch.dtype) -> Tensor:
    """Falcon's ALiBi tensor ``(b h, 1, s)``, as its model builds it (``build_alibi_tensor``: part of the code
    audited)."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    alibi: Tensor = build_alibi_tensor(torch.ones(b, s, dtype=torch.long), m.num_heads, dtype)
    return alibi


def _falcon_alibi_call(m: Any, x: Tensor, mask: Tensor, **kwargs: Any) -> Tensor:
    """One call of Falcon's attention with ALiBi over ``mask.shape[-1]`` keys, in either layout. From
    transformers 5.25 the bias reaches the attention inside the additive mask, folded as ``FalconModel.forward``
    folds it (``masked_fill(alibi / sqrt(d), mask < -1, min)``): that line is copied here, the rest is Falcon's."""
    b, s = x.shape[0], mask.shape[-1]
    alibi = _falcon_alibi(m, b, s, x.dtype)
    if _falcon_takes_alibi(m):
        out: Tensor = m(x, alibi, mask, **kwargs)[0]
        return out
    bias = rearrange(alibi, "(b h) one s -> b h one s", b=b) / math.sqrt(m.config.hidden_size // m.num_heads)
    folded = torch.masked_fill(bias, mask < -1, torch.finfo(x.dtype).min)
    out = m(x, folded, **kwargs)[0]
    return out


def _falcon_alibi_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                          is_causal: bool) -> Tensor:
    return _falcon_alibi_call(m, x, _hf_mask(x, keep, is_causal))


def _falcon_alibi_decode(m: Any, x: Tensor) -> Tensor:
    from transformers import DynamicCache

    cache, b = DynamicCache(config=m.config), x.shape[0]
    # an all-visible additive mask for each token: its eager kernel adds one always
    return torch.cat([_falcon_alibi_call(m, x[:, i:i + 1], torch.zeros(b, 1, 1, i + 1, dtype=x.dtype),
                                         layer_past=cache)
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
