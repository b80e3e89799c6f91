"""Traits of what a class computes around the softmax: gates, experts, clamps, sinks, soft-caps, latent projections,
and the options it is built with."""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from einops import rearrange
from torch import Tensor, nn

from ...modules.spec import ModuleSpec, Weights, resolve
from ...modules.weights import _norm, spec_weights
from ..facts import (
    _LATENT,
    _MERGED_MEMORY,
    _RELEASED_CLIP,
    _clamps_always,
    _clip_path,
    _clip_qkv,
    _cosine,
    _deberta_scale,
    _differential,
    _latent,
    _memory_tokens,
    _merged_memory,
    _output_gate,
    _query_scale,
    _separate_biases,
    _sinks,
    _softcap,
    _source,
    _sub_norm,
    _v_norm,
)
from ..generic import _GATED_OWN, _GATED_READS, _gated_block, _mixture_of_attention
from ..layout import Layout
from .base import Seen, Trait, add_trait, register


@register("scale off by default", lambda seen: getattr(seen.module, "scale", None) is False and "if self.scale:" in (
    _source(seen.cls)), examples=("openai.Attention",))
def _scale_notes(seen: Seen, found: bool) -> list[str]:
    return ["built with its constructor's default scale=False (logits not divided by sqrt(d)); its model passes "
            "scale=True, so that path is not tested"]


@register("clip_qkv required", lambda seen: _clamps_always(seen.module) and getattr(getattr(getattr(
    seen.module, "config", None), "attn_config", None), "clip_qkv", 0) is None and getattr(
        seen.module, "clip_qkv", None) == _RELEASED_CLIP, examples=("dbrx.DbrxAttention",))
def _clip_required_notes(seen: Seen, found: bool) -> list[str]:
    return [f"its config's default clip_qkv=None makes forward raise (torch.clamp with neither bound; its released "
            f"checkpoints set {_RELEASED_CLIP:g}): built with clip_qkv={_RELEASED_CLIP:g}, the clamp of q, k and v "
            f"modelled"]


@register("clipped linears off", lambda seen: any(getattr(m, "use_clipped_linears", None) is False
                                                 for m in seen.module.modules()), examples=(
    "gemma4.Gemma4VisionAttention",))
def _clipped_linear_notes(seen: Seen, found: bool) -> list[str]:
    return ["its projections' optional clipping (use_clipped_linears: inputs and outputs clamped to bounds read from a "
            "checkpoint) is off in its default config: audited without it, so the clamps are not tested"]


@register("mixture of attention", lambda seen: _mixture_of_attention(seen.module), examples=(
    "jetmoe.JetMoeAttention",), reads=lambda seen, found: ("experts", "kv_proj"))
def _moa_notes(seen: Seen, found: bool) -> list[str]:
    return ["JetMoE's mixture of attention built with one expert chosen for every token (num_local_experts = "
            "num_experts_per_tok = 1: its gate is 1, its routing exact): the expert's query and output projections, "
            "the shared keys and values and the output bias are tested; the routing of its checkpoints (top-k of "
            "several experts, their softmax gates, the keys and values repeated per chosen expert) is not"]


@register("gated cross-attention block", lambda seen: _gated_block(seen.module), examples=(
    "evolla.EvollaSequenceAlignerCrossAttention",), reads=lambda seen, found: _GATED_READS,
    own=lambda seen, found: _GATED_OWN)
def _gated_notes(seen: Seen, found: bool) -> list[str]:
    heads, width = int(getattr(seen.module, "num_attention_heads")), int(getattr(seen.module, "hidden_size"))  # noqa: B009
    return ["a gated cross-attention block (x + tanh(gate_attention) * attention, then + tanh(gate_ffw) * "
            "feed-forward): audited with its residual subtracted, tanh(gate_attention) folded into the output "
            "projection, gate_ffw zeroed and attention_norm bypassed, so the feed-forward and the norm are not "
            "tested; keys and values of the protein modality only, as its model builds it; its query and key masks "
            "(rows of ones and zeros, filled with the dtype's minimum) are not tested (audited without masks)",
            f"its scale is num_attention_heads**-0.5 (self.scale, read as the class uses it), not head_dim**-0.5: the "
            f"same here ({heads} heads of {width // heads}), not in a model whose head count and head size differ"]


_RATIOS = ("sr_ratio", "sequence_reduction_ratio", "sequences_reduction_ratio", "spatial_reduction_ratio")


@register("keys not reduced", lambda seen: any(getattr(m, name, None) == 1 for m in seen.module.modules()
                                               for name in _RATIOS), examples=(
    "segformer.SegformerAttention", "pvt.PvtEfficientSelfAttention"))
def _ratio_notes(seen: Seen, found: bool) -> list[str]:
    return ["built with a key reduction ratio of 1, as its model's last stage is (every key): the earlier stages' "
            "strided convolution that pools the keys is not tested"]


@register("global attention stage", lambda seen: getattr(seen.module, "query_stride", None) == 1 and getattr(
    seen.module, "use_mask_unit_attn", None) is False, examples=("hiera.HieraMaskUnitAttention",))
def _stride_notes(seen: Seen, found: bool) -> list[str]:
    return ["built with query_stride 1 and use_mask_unit_attn False (global attention over every token, as its "
            "model's later stages): the query max-pooling of a stage's first layer and the mask-unit windows of the "
            "early stages are not tested"]


def _index_topk(seen: Seen) -> int | None:
    topk = getattr(getattr(seen.module, "config", None), "index_topk", None)
    return topk if isinstance(getattr(seen.module, "indexer", None), nn.Module) and isinstance(topk, int) else None


@register("sparse key selection", _index_topk, examples=(
    "deepseek_v32.DeepseekV32Attention", "glm_moe_dsa.GlmMoeDsaAttention"))
def _indexer_notes(seen: Seen, topk: int) -> list[str]:
    return [f"DeepSeek sparse attention: its indexer keeps the {topk} best-scored keys of each query; the audit's "
            f"sequences are shorter, so every key is kept and it is audited as the dense latent attention: the "
            f"selection itself is not tested"]


def _unmodelled_softcap(seen: Seen) -> list[str]:
    """The config's soft-capping fields that are set, where the class passes no cap the spec reads."""
    config = getattr(seen.module, "config", None)
    return [] if _softcap(seen.module) is not None else [
        name for name in ("attn_logit_softcapping", "logit_softcapping") if getattr(config, name, None)]


#: why the guards are kept: a class that computes what they name is a limit, not a false alarm
_GUARD = "a guard: every class of the installed transformers that has it is modelled"

add_trait(Trait("soft-capping not modelled", _unmodelled_softcap, examples=(), limits=lambda seen, names: names,
                unmatched=_GUARD + " (Gemma 2's, T5Gemma's, VaultGemma's softcap=self.<path>)"))
add_trait(Trait("attention sinks", lambda seen: _sinks(seen.module), examples=("gpt_oss.GptOssAttention",),
                own=lambda seen, found: ("sinks",)))
add_trait(Trait("attention sinks not modelled", lambda seen: getattr(seen.module, "sinks", None) is not None and (
    _sinks(seen.module) is None), examples=(), limits=lambda seen, found: ["attention sinks"],
    unmatched=_GUARD + " (the sinks of GPT-OSS and its kin)"))


def _unmodelled_clip(seen: Seen) -> str | None:
    clip = _clip_path(seen.module)
    return clip if clip is not None and _clip_qkv(seen.module) is None and resolve(
        seen.module, clip, seen.cls.__name__) is not None else None


add_trait(Trait("clamped normalised queries and keys", _unmodelled_clip, examples=(), limits=lambda seen, clip: [
    f"{clip} clamps the normalised queries and keys (after the q/k norms)"], unmatched=(
    "OLMoE clamps its normalised queries and keys when its config sets clip_qkv (None in the default config the "
    "sweep builds)")))


def _gate_own(seen: Seen, gate: Any) -> tuple[str, ...]:
    return () if gate.bias is None else (gate.bias,)


add_trait(Trait("output gate", lambda seen: _output_gate(seen.module), examples=("qwen3_next.Qwen3NextAttention",),
                reads=lambda seen, gate: (gate.proj,), own=_gate_own))
add_trait(Trait("sub-norm", lambda seen: _sub_norm(seen.module), examples=(
    "bitnet.BitNetAttention",), reads=lambda seen, name: (name,)))
add_trait(Trait("latent projections", lambda seen: _latent(seen.module), examples=("deepseek_v3.DeepseekV3Attention",),
                reads=lambda seen, found: [getattr(_LATENT, f) for f in ("q", "q_a", "q_norm", "q_b", "kv_a",
                                                                         "kv_norm", "kv_b")]))
add_trait(Trait("value norm", lambda seen: _v_norm(seen.module, ""), examples=(
    "gemma3n.Gemma3nTextAttention",), reads=lambda seen, name: (name,)))
add_trait(Trait("differential attention", lambda seen: _differential(seen.module), examples=(
    "diffllama.DiffLlamaAttention",), own=lambda seen, found: [n for n, _ in seen.module.named_parameters(
        recurse=False) if n.startswith("lambda")]))


# What a trait changes in the generic spec (hf/generic.py), applied in this order: the cosine norms, a learned query
# scale after the query norm, DeBERTa's scale, DeBERTa's separate biases, values scaled by a constant, a memory of the
# audit's own tokens.


def _cosine_change(seen: Seen, found: bool, spec: ModuleSpec, layout: Layout) -> ModuleSpec:
    """Swin v2: unit queries and keys, a learned scale per head (clamped at 100)."""
    cls, scale_path = seen.cls, f"{layout.core}logit_scale"

    def cosine(m: Any) -> dict[str, Callable[[Tensor], Tensor]]:
        scales = resolve(m, scale_path, cls.__name__).detach().double().clamp(max=math.log(100)).exp()

        def unit(z: Tensor) -> Tensor:
            length: Tensor = z.norm(dim=-1, keepdim=True).clamp(min=1e-12)
            return z / length

        return {"q": lambda q: unit(q) * rearrange(scales.to(q.dtype), "h 1 1 -> 1 h 1 1"), "k": unit}

    return dataclasses.replace(spec, norms=cosine, scale=1.0)


def _query_scale_change(seen: Seen, factor: Callable[[Any], Tensor | float], spec: ModuleSpec,
                        layout: Layout) -> ModuleSpec:
    """TimesFM, Muse: the queries' factor after their norm (TimesFM's attention: the factor is its whole scale)."""
    q_path, plain = spec.q_norm, spec

    def scaled_queries(m: Any) -> dict[str, Callable[[Tensor], Tensor]]:
        norm = None if q_path is None else _norm(m, q_path, plain)
        f = factor(m)
        return {"q": lambda q: (q if norm is None else norm(q)) * (f.to(q.dtype) if isinstance(f, Tensor) else f)}

    spec = dataclasses.replace(spec, norms=scaled_queries)
    return dataclasses.replace(spec, scale=1.0) if "scaling=1.0" in _source(seen.cls.forward) else spec


def _separate_biases_change(seen: Seen, found: bool, spec: ModuleSpec, layout: Layout) -> ModuleSpec:
    """DeBERTa's q_bias and v_bias, added to the heads of its bias-free in_proj."""
    cls, unbiased, owner = seen.cls, spec, layout.core.rstrip(".")

    def biased(m: Any) -> Weights:
        w = spec_weights(m, unbiased)
        c = resolve(m, owner, cls.__name__) if owner else m
        return dataclasses.replace(w, bq=c.q_bias.detach().double().reshape(-1),
                                   bv=c.v_bias.detach().double().reshape(-1))  # LayoutLMv2's: (1, 1, h d)

    return dataclasses.replace(spec, weights=biased)


def _value_scale(seen: Seen) -> float | None:
    v_scale = getattr(seen.module, "v_scale", None)
    return float(v_scale) if isinstance(v_scale, float | int) and v_scale != 1 else None


def _value_scale_change(seen: Seen, v_scale: float, spec: ModuleSpec, layout: Layout) -> ModuleSpec:
    plain = spec

    def scaled(m: Any) -> Weights:
        w = spec_weights(m, plain)
        return dataclasses.replace(w, wv=w.wv * v_scale, bv=None if w.bv is None else w.bv * v_scale)

    return dataclasses.replace(spec, weights=scaled)


def _merged_change(seen: Seen, merged: tuple[str, bool], spec: ModuleSpec, layout: Layout) -> ModuleSpec:
    """T5Gemma 2: the encoder's keys and values (the audit's own tokens), appended after the self keys."""
    alone, k_path = spec, (spec.k_norm if merged[1] else None)

    def with_memory(m: Any) -> Weights:
        w = spec_weights(m, alone)
        memory = _memory_tokens(w.wk.shape[1])
        k = memory @ w.wk.T + (0.0 if w.bk is None else w.bk)
        v = memory @ w.wv.T + (0.0 if w.bv is None else w.bv)
        norm = None if k_path is None else _norm(m, k_path, alone)
        if norm is not None:
            k = rearrange(norm(rearrange(k, "n (g d) -> 1 g n d", g=w.g)), "1 g n d -> n (g d)")
        return dataclasses.replace(w, extra_k=k, extra_v=v)

    return dataclasses.replace(spec, weights=with_memory)


add_trait(Trait("cosine attention", lambda seen: _cosine(seen.core), examples=("swinv2.Swinv2SelfAttention",),
                own=lambda seen, found: ("logit_scale",), changes=_cosine_change))
add_trait(Trait("learned query scale", lambda seen: _query_scale(seen.module), examples=("timesfm.TimesFmAttention",),
                own=lambda seen, found: ("scaling",), changes=_query_scale_change))
add_trait(Trait("DeBERTa's scale", lambda seen: _deberta_scale(seen.core), examples=(
    "deberta.DisentangledSelfAttention", "deberta_v2.DisentangledSelfAttention"),
    changes=lambda seen, scale, spec, layout: dataclasses.replace(spec, scale=scale)))
add_trait(Trait("separate query and value biases", lambda seen: _separate_biases(seen.core), examples=(
    "deberta.DisentangledSelfAttention", "layoutlmv2.LayoutLMv2SelfAttention"), own=lambda seen, found: (
        "q_bias", "v_bias"), changes=_separate_biases_change))
add_trait(Trait("values scaled by a constant", _value_scale, examples=("mimo_v2_flash.MiMoV2FlashAttention",),
                changes=_value_scale_change))


@register("self- and cross-attention in one softmax", lambda seen: _merged_memory(seen.core), examples=(
    "t5gemma2.T5Gemma2MergedAttention",), changes=_merged_change)
def _merged_notes(seen: Seen, found: Any) -> list[str]:
    return [f"self-attention and cross-attention merged in one softmax: audited as its decoder's self-attention "
            f"beside the audit's own {_MERGED_MEMORY} encoder tokens (seeded, the same for every batch element, every "
            f"one visible), so its encoder mask and varied encoder inputs are not tested"]
