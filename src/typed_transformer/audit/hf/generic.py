"""The generic reading of a Hugging Face attention class: the shipped spec where one exists, a gated or mixture spec,
or the spec read from the class by its layout, its signature and its source (before its traits change it:
:mod:`.traits`, folded in by :mod:`.recognise`)."""

import dataclasses
import inspect
import math
import re
from typing import Any

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from ...masks import window_mask
from ..core.conventions import AuditUsageError
from ..modules.masking import additive_mask, with_causal
from ..modules.positions import Rotary, mrope_positions, window_bias
from ..modules.spec import REBUILDS, SHIPPED_SPECS, ModuleSpec, Weights, resolve
from ..modules.weights import spec_weights
from .build import _HF, _HF_CROSS, _PACKED_THETA, hf_build
from .facts import (
    _AXIAL,
    _AXIAL_BLOCKS,
    _AXIAL_WH,
    _MEMORY_ARGS,
    _MERGED_MEMORY,
    _PROVIDED,
    _RESIDUAL_INPUTS,
    _SEPARATE,
    _STATIC_ROPE,
    _XL_LENGTH,
    _added_biases,
    _bias_as_mask,
    _block_distances,
    _block_input_norms,
    _body,
    _boolean_mask,
    _chunked_local,
    _clip_qkv,
    _complex_tables,
    _continuous_bias,
    _decodes,
    _decomposed,
    _differential,
    _disentangled,
    _distances_arg,
    _flipped_axial,
    _frequencies,
    _gated_bias,
    _head_padding_only,
    _heads_as_positions,
    _ignores_rotary,
    _input_norms,
    _input_width,
    _is_projection,
    _key_mask_only,
    _keys_with_input,
    _latent,
    _latent_layout,
    _latent_style,
    _layer_type,
    _layout_arg,
    _layout_bias,
    _layout_inputs,
    _literal_theta,
    _local_blocks,
    _local_frames,
    _mask_none,
    _memory_tokens,
    _merged_memory,
    _model_window,
    _modeling,
    _mrope,
    _needed_positions,
    _norm_paths,
    _nullable,
    _output_gate,
    _output_tensor,
    _own_tables,
    _padding_ones,
    _padding_only,
    _pair_arg,
    _patch_prefix,
    _perceiver,
    _positions_optional,
    _relative_keys,
    _rope_theta,
    _rope_type,
    _rotary_arg,
    _rotary_class,
    _rotary_fraction,
    _rotary_style,
    _same_shape,
    _shared_axial,
    _shaw_blocks,
    _sinks,
    _sliding_chunks,
    _softcap,
    _source,
    _split_scale,
    _sub_norm,
    _v_norm,
    _width_rotary,
    _window_table,
    _xl_names,
    _xl_table_arg,
)
from .layout import PROJECTED, Layout, bypass_norms, content_zero_args, find_layout, has_residual, relative_bias


def generic_spec(module: nn.Module, cross: bool | None) -> tuple[ModuleSpec, Layout | None]:
    """The class's spec as the generic reading makes it, before its traits change it (:func:`.recognise.hf_spec`),
    with the layout it was read by: None where the spec is not a generic reading (a shipped spec, Evolla's gated
    block, JetMoE's mixture of attention).

    Raises:
        AuditUsageError: the class is not of a shape the reading knows (the message says what is missing).
    """
    if _gated_block(module):
        return _gated_spec(module), None
    if _mixture_of_attention(module):
        return _moa_spec(module), None
    shipped = _shipped_spec(module, bool(cross))
    if shipped is not None and (shipped.qkv_layout != "blocks" or shipped.alibi is not None or shipped.memory):
        return shipped, None
    refused = _refused_options(module) if shipped is None else ""
    if refused:  # the class's shipped spec (its ALiBi and all) does not model an option it was built with: named,
        # not left to the generic call, which would pass zeros for what the shipped spec computes (MPT's ALiBi)
        raise AuditUsageError(f"{type(module).__qualname__}: {refused}")
    try:
        return _generic_spec(module, cross)
    except AuditUsageError:
        if shipped is None:
            raise
        return shipped, None


#: the children and parameters of a gated cross-attention block (Evolla's aligner) its spec reads or bypasses
_GATED_READS = ("query", "key_protein", "value_protein", "out_proj", "attention_norm", "ff")
_GATED_OWN = ("gate_attention", "gate_ffw")


def _gated_block(module: nn.Module) -> bool:
    """Evolla's ``EvollaSequenceAlignerCrossAttention``, a Flamingo-style gated block: ``x + tanh(gate_attention) *
    cross_attention(x)``, then ``+ tanh(gate_ffw) * ff(...)``, its attention (in its ``cross_attention`` method) over
    the keys and values of the modalities its constructor was given widths for; recognised when only the protein one
    was (as its model builds it)."""
    source = _source(type(module).forward)
    return ("hidden_states = torch.tanh(self.gate_attention) * hidden_states" in source
            and "self.ff(hidden_states) * torch.tanh(self.gate_ffw)" in source
            and "self.attention_norm(query_states)" in _source(getattr(type(module), "cross_attention", None))
            and all(_is_projection(getattr(module, n, None)) for n in ("query", "key_protein", "value_protein",
                                                                         "out_proj"))
            and all(getattr(module, n, 0) is None for n in ("key_structure", "value_structure", "key_msa",
                                                             "value_msa"))
            and all(isinstance(getattr(module, n, None), nn.Parameter) for n in _GATED_OWN))


def _gated_spec(module: nn.Module) -> ModuleSpec:
    """The spec of a :func:`_gated_block`: cross-attention over the protein keys and values, the block's residual
    subtracted, ``tanh(gate_attention)`` folded into the output projection, the feed-forward bypassed (``gate_ffw``
    zeroed on the audit's copy), ``attention_norm`` bypassed as a pre-norm; no masks (its masks are rows of ones and
    zeros per query and per key, which no mask of the audit's form reaches)."""
    cls = type(module)
    plain = ModuleSpec(f"hf:{cls.__name__}", _unused_forward, q="query", k="key_protein", v="value_protein",
                       out="out_proj", num_heads="num_attention_heads", scale="scale")

    def weights(m: Any) -> Weights:
        w = spec_weights(m, plain)
        gate = math.tanh(float(m.gate_attention.detach().double().reshape(-1)[0]))
        return dataclasses.replace(w, wo=None if w.wo is None else w.wo * gate,
                                   bo=None if w.bo is None else w.bo * gate)

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        assert key is not None
        bypass_norms(m, ("attention_norm",))
        with torch.no_grad():
            m.gate_ffw.zero_()  # the feed-forward bypassed, as a block's Add & Norm is
        out: Tensor = m(query_states=x, protein_kv_states=key, structure_kv_states=None, msa_kv_states=None,
                        query_attn_mask=None, protein_kv_attn_mask=torch.ones(key.shape[0], key.shape[1],
                                                                             dtype=x.dtype))
        return out - x

    spec = dataclasses.replace(plain, forward=forward, weights=weights, memory=True,
                               conventions=dataclasses.replace(_HF_CROSS, supports_mask=False, supports_causal=False),
                               module_type=f"{cls.__module__}.{cls.__qualname__}",
                               build=lambda c, overrides: hf_build(c, overrides, cross=True))
    REBUILDS[spec] = "from typed_transformer.audit import hf_spec\nspec = hf_spec(module)"  # for repros
    return spec


def _unused_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                    is_causal: bool) -> Tensor:
    raise NotImplementedError  # the weights-only spec _gated_spec reads projections through


def _mixture_of_attention(module: nn.Module) -> bool:
    """JetMoE's mixture of attention: routed experts each with a query and an output projection
    (``experts.input_linear``/``output_linear``, ``(experts, out, in)`` weights, an output ``bias``), keys and
    values from one shared fused ``kv_proj``."""
    experts = getattr(module, "experts", None)
    return (isinstance(getattr(module, "kv_proj", None), nn.Linear) and isinstance(experts, nn.Module)
            and all(hasattr(experts, n) for n in ("input_linear", "output_linear", "router", "bias")))


def _moa_unmodelled(m: Any) -> list[str]:
    """Routing the reference does not compute: more than one expert or more than one expert per token."""
    n, k = int(m.experts.num_experts), int(m.experts.top_k)
    return [] if n == k == 1 else [f"num_local_experts={n}, num_experts_per_tok={k} (routed query and output "
                                   f"projections, top-k gates)"]


def _moa_weights(m: Any) -> Weights:
    """One expert, chosen for every token with gate 1 (softmax over one logit): its query projection, the shared
    keys and values (``kv_proj``'s ``[k; v]``), its output projection and the output bias; ``g`` key/value heads,
    one query head each (``top_k * g`` query heads)."""
    experts = m.experts
    g, d = int(m.num_key_value_heads), int(m.head_dim)
    wk, wv = m.kv_proj.weight.detach().double().chunk(2)
    return Weights(wq=experts.input_linear.weight[0].detach().double(), wk=wk, wv=wv,
                   wo=experts.output_linear.weight[0].detach().double(), bq=None, bk=None, bv=None,
                   bo=experts.bias.detach().double(), h=g * int(experts.top_k), g=g, d=d, dv=d, scale=float(m.scaling))


def _moa_spec(module: nn.Module) -> ModuleSpec:
    """JetMoE's attention with one expert (:func:`_moa_unmodelled` refuses routing): plain rotary attention with
    the expert's projections (:func:`_moa_weights`), its model's rotary class and mask, its cache token by token."""
    cls = type(module)
    rotary_class = _rotary_class(module)
    if rotary_class is None:
        raise AuditUsageError(f"{cls.__qualname__}: no rotary class in its module")

    def tables(m: Any, x: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        cos, sin = rotary_class(config=m.config)(x, torch.arange(offset, offset + x.shape[1])[None])
        return cos.to(x.dtype), sin.to(x.dtype)

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        keep = with_causal(keep, is_causal, x.shape[1], x.shape[1])
        mask = additive_mask(keep.expand(x.shape[0], keep.shape[1], x.shape[1], x.shape[1]), x.dtype) if (
            keep is not None) else None
        out: Tensor = m(x, attention_mask=mask, position_embeddings=tables(m, x, 0))[0]
        return out

    def decode(m: Any, x: Tensor) -> Tensor:
        from transformers import DynamicCache

        cache = DynamicCache(config=m.config)
        outs = [m(x[:, i:i + 1], attention_mask=None, position_embeddings=tables(m, x[:, i:i + 1], i),
                  cache=cache)[0] for i in range(x.shape[1])]
        return torch.cat(outs, dim=1)

    theta = _rope_theta(module)
    return ModuleSpec(f"hf:{cls.__name__}", forward, _HF, q=None, k=None, v=None, out=None,
                      weights=_moa_weights, rotary=None if theta is None else Rotary(theta, _rotary_style(module)),
                      decode=decode, module_type=f"{cls.__module__}.{cls.__qualname__}", unmodelled=_moa_unmodelled)


def _shipped_spec(module: nn.Module, cross: bool) -> ModuleSpec | None:
    """The shipped spec written for ``module``'s class (or a base class of it), for its self- or cross-attention form
    (GPT-2 has one of each: its cross-attention reads ``q_attn`` and a fused ``[k; v]``) and for the options it was
    built with (a spec that does not model one of them is passed over), if any."""
    from .. import specs  # noqa: F401  (registers the shipped specs)

    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    found = [spec for spec in SHIPPED_SPECS.values() if spec.module_type in names
             and (spec.unmodelled is None or not spec.unmodelled(module))]
    return next((spec for spec in found if spec.memory == cross), None) if cross else next(
        (spec for spec in found if not spec.memory), None)


def _refused_options(module: nn.Module) -> str:
    """What the shipped specs written for ``module``'s class do not model of it (MPT's ``clip_qkv``), or ``""``."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    refused = [f"spec {spec.name!r} does not model its option {', '.join(spec.unmodelled(module))}"
               for spec in SHIPPED_SPECS.values() if spec.module_type in names and spec.unmodelled is not None
               and spec.unmodelled(module)]
    return "; ".join(refused)


def _memory_arg(module: nn.Module, core: Any, signature: Any, cross: bool | None) -> str | None:
    """The argument that carries the memory of a cross-attention call, or None for self-attention."""
    arg = next((n for n in _MEMORY_ARGS if n in signature), None)
    if arg is None or cross is False:
        return None
    named = any("Cross" in type(m).__name__ or getattr(m, "is_cross_attention", False) is True for m in (module, core))
    return arg if cross or named or signature[arg].default is inspect.Parameter.empty else None


def _generic_spec(module: nn.Module, cross: bool | None) -> tuple[ModuleSpec, Layout]:
    cls = type(module)
    q_norm, k_norm = _norm_paths(module)
    latent = _latent(module)
    mrope = _mrope(module)
    layout = _latent_layout() if latent is not None else find_layout(module, (q_norm, k_norm))
    core: Any = module.get_submodule(layout.core.rstrip(".")) if layout.core else module
    if layout.core:
        q_norm, k_norm = (None if n is None else layout.core + n for n in _norm_paths(core))
    signature = inspect.signature(cls.forward).parameters
    params = list(signature)[1:]
    # a DETR decoder's content and position projections (Conditional DETR, DAB-DETR): its positions given as zeros
    content_zeros = content_zero_args(cls) if layout.extra_reads else {}
    separate = tuple(params[:3]) in _SEPARATE
    # keys and values already projected, taken by name (DAB-DETR's DabDetrAttention): identity projections
    projected = layout.q is None and layout.qkv is None and all(n in signature for n in PROJECTED)
    # a (query, key, value) class that requires rotary tables and builds its keys' projection from the queries'
    # width (SAM 2 video's memory self-attention: its model calls it with query = key = value): self-attention, the
    # input passed as all three
    rotary_self = (separate and "position_embeddings" in signature
                   and signature["position_embeddings"].default is inspect.Parameter.empty)
    # or one that views its keys and values with the queries' shape (MobileBERT's self.key(key_tensor).view(
    # *hidden_shape), hidden_shape from query_tensor): one sequence, as its model passes it (see _same_shape)
    rotary_self = rotary_self or (separate and (_same_shape(cls) or _same_shape(type(core))))
    separate = (separate and not rotary_self) or projected
    merged = _merged_memory(core)
    # a Perceiver resampler that takes its memory first (Evolla's compressor: forward(x, latents, mask)): keys and
    # values over [memory; latents], the queries from the latents (IDEFICS 2's, latents first, is _keys_with_input's)
    perceiver = _perceiver(cls)
    perceiver = perceiver if perceiver is not None and params[:1] == [perceiver[1]] else None
    memory_arg = (None if merged is not None else perceiver[1] if perceiver is not None
                  else _memory_arg(module, core, signature, cross))
    mask_arg = next((n for n in ("attention_mask", "mask", "attn_mask", "merged_attention_mask") if n in signature),
                    "attention_mask")
    if mask_arg not in signature and _bias_as_mask(cls):
        mask_arg = "attention_bias"  # EsmFold2's diffusion attention: its pair bias, the padding folded in
    # ViT on transformers 5.0 takes forward(hidden_states), BLIP's vision attention (hidden_states, **kwargs) and
    # never reads a mask: audited without masks, as its model calls it (a mask passed would be ignored silently)
    # the vision and audio encoders of Qwen2-VL and its kin take one packed sequence ``(total, e)`` cut by
    # ``cu_seqlens`` (each image attends within itself): a batch of b sequences of t tokens is b pieces of t
    packed = "cu_seqlens" in signature and signature["cu_seqlens"].default is inspect.Parameter.empty
    # a mask through **kwargs: the forward reads the name as a variable, not only as a keyword it passes on
    # (BLIP-2's attention_interface(..., attention_mask=None, **kwargs), SAM's attention_mask=attention_similarity)
    body = _body(cls.forward)
    read = re.search(rf"(?<![\w.]){mask_arg}\b(?!\s*=[^=])", body) is not None
    takes_mask = not packed and (mask_arg in signature or (any(p.kind is p.VAR_KEYWORD for p in signature.values())
                                                          and read))
    # a mask argument the forward never reads, calling its attention function with attention_mask=None instead
    # (PP-OCRv5's and PP-OCRv6's recognition encoders: "not used but kept for signature matching"): audited without
    # masks, as its model calls it (the mask would be ignored silently)
    # (Llama 4's vision attention: None in the mask's place of its attention function's arguments)
    if mask_arg in signature and not read and (re.search(rf"\b{mask_arg}=None\b", body) or _mask_none(body)):
        takes_mask = False
    # a packed encoder whose forward never names the mask and calls its attention function with **kwargs only: its
    # model passes attention_mask=None through them (HunYuan-VL's, HY-V4-VL's vision attention), which eager needs
    mask_free = packed and mask_arg not in _source(cls.forward) and any(
        p.kind is p.VAR_KEYWORD for p in signature.values())
    # masks taken only in a key-padding form of the class's own, which no mask of the audit's (b, 1, t, s) form
    # reaches: audited without masks, each form named in hf_notes. FastSpeech2-Conformer's (b, 1, s) and ProphetNet's
    # (b, h, 1, s), any other refused; Longformer's sliding chunks' (b, s) of its own values (< 0 padding, > 0
    # global), its lengths a multiple of its window (its model pads); Reformer's local attention's (b, s), audited on
    # sequences of one chunk at most (max_length), where it is plain attention; Evolla's compressor's (b, s) of ones
    # and zeros (mask[:, None, None, :]: ones passed) and WavLM's (attention_mask.ne(1)); Granite Speech 5's (b, s),
    # reshaped into its blocks
    sliding, chunked, key_mask = _sliding_chunks(core), _chunked_local(core), _key_mask_only(cls, mask_arg)
    distances_arg = _distances_arg(cls) if _shaw_blocks(core) else None
    if (_padding_only(cls, mask_arg) or _head_padding_only(cls, mask_arg) or sliding is not None
            or chunked is not None or key_mask or _padding_ones(cls, mask_arg)
            or (distances_arg is not None and mask_arg in signature)):
        takes_mask = False
    memory_mask = "encoder_attention_mask" if memory_arg and "encoder_attention_mask" in signature else mask_arg
    if content_zeros and memory_arg is not None and memory_mask in signature:
        takes_mask = True  # DAB-DETR's cross-attention: its mask is encoder_attention_mask, with no attention_mask
    # the first parameter is the input, passed by position whatever its name (VitDet's hidden_state)
    pair_arg = _pair_arg(core)  # Bros's bbox_pos_emb: given the audit's own table (see _relative_keys)
    layout_arg = _layout_arg(core)  # LiLT's layout_inputs: given the audit's own (see _layout_bias)
    nullable = [n for n in _nullable(cls) if n not in (pair_arg, layout_arg)]
    added = _added_biases(core)
    channels_first = isinstance(module.get_submodule(str(layout.q or layout.qkv or "")), nn.Conv1d)
    input_norms = tuple(layout.core + n for n in _input_norms(core)) + tuple(_block_input_norms(module))
    # a required mask argument is the mask the audit passes (XLM's and FlauBERT's ``mask``)
    # a required output_attentions (SqueezeBERT's): False, as its model passes it by default
    flags = [n for n in ("output_attentions",) if n in signature and signature[n].default is inspect.Parameter.empty]
    rotary_arg = _rotary_arg(cls)
    unknown = [n for n, p in signature.items() if n not in ("self", params[0] if params else "", mask_arg, rotary_arg,
                                                            distances_arg)
               and n not in _PROVIDED and n not in nullable and n not in flags and n not in added
               and n not in (pair_arg, layout_arg) and n != "hidden_kv" and n not in content_zeros
               and n not in (perceiver or ()) and not (key_mask and n == mask_arg)
               and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if unknown:
        raise AuditUsageError(f"{cls.__qualname__}: forward needs {', '.join(unknown)}, which the common shape does "
                              f"not provide")
    takes_rotary = rotary_arg is not None
    # RecurrentGemma: the class turns q and k with its own rotary_emb from position_ids; GPT-J and CodeGen on
    # transformers 5.0 with their sinusoid table (the embed_positions buffer)
    internal = "position_ids" in signature and (isinstance(getattr(module, "rotary_emb", None), nn.Module)
                                                or isinstance(getattr(core, "embed_positions", None), Tensor))
    rotary_class = _rotary_class(module) if takes_rotary and not packed else None
    if takes_rotary and _width_rotary(cls):  # EfficientLoFTR's: audited with none, as its cross-attention is called
        takes_rotary, rotary_class = False, None
    if takes_rotary and rotary_class is None and _positions_optional(cls):
        takes_rotary = False  # DETR's sine embeddings, added to the query and key inputs: audited with none
    # the audit makes the tables: a packed encoder's, and a class whose module has no rotary class or one that takes
    # no positions (an image-grid rotary: DINOv3's, SAM 2's); the model's table builder is then not tested
    own_tables = _own_tables(module)
    if own_tables:
        rotary_class, mrope = None, None
    heads = _heads_as_positions(cls)
    zero_positions = _needed_positions(cls)
    # a class that takes its tokens time first: (t, b, e) in and out (its forward permutes them itself)
    # (FSMT's: ``tgt_len, bsz, embed_dim = query.size()``)
    time_first = re.search(r"hidden_states = hidden_states\.permute\(1, 0, 2\)"
                           r"|tgt_len, bsz, embed_dim = query\.size\(\)", _source(cls.forward)) is not None
    flat_mask = "attention_mask.size() != (batch_size * self.num_heads" in _source(cls.forward)
    # a self-attention class that takes its input again as required key (and query) arguments, as its model passes
    # it: FSMT's forward(query, key, ...) gets query=x, key=x; CTRL's forward(v, k, q, ...) gets x three times (its
    # keys and values take the queries' shape: one sequence, not separate inputs)
    # (CPM-Ant's forward(hidden_q, hidden_kv, ...): its model passes the input as both)
    again = [n for n in params[1:3] if n in ("key", "k", "q", "hidden_kv")
             and signature[n].default is inspect.Parameter.empty
             ] if not separate and memory_arg is None and not rotary_self else params[1:3] if rotary_self else []
    cache_arg = next((n for n in ("cache", "past_key_values", "past_key_value") if n in signature), None)
    theta = _PACKED_THETA if own_tables and takes_rotary else _rope_theta(core)
    if theta is None and (rotary_class is not None or internal):
        theta = _literal_theta(rotary_class.__module__ if rotary_class is not None else _modeling(cls).__name__)
    source = _source(cls.forward)
    # a mask used as booleans, True = may attend (DeBERTa's masked_fill(~attention_mask, min)): given as such
    boolean_mask = _boolean_mask(core, mask_arg)
    disentangled = _disentangled(core, layout.core)
    relative_keys = _relative_keys(core, layout.core)
    xl = _xl_names(core)
    table_arg = xl[3] if xl is not None else _xl_table_arg(core)
    if xl is not None and table_arg == "position_embeddings":  # the relative table, not rotary tables
        takes_rotary, own_tables, rotary_class = False, False, None
    # Swin's windows: every sequence is one window of Wh x Ww tokens, with a mask per window shared by the heads
    window_table = _window_table(module)
    with_input = _keys_with_input(core, layout, memory_arg) or perceiver is not None
    # LongT5's local attention: queries in blocks, each against its 3-block frame (a two-sided window of its radius)
    local = _local_blocks(core)
    # a mask of ones (attend) and zeros (masked) of shape (b, t, s), which the forward turns into its own fill
    # (XLM's and FlauBERT's ``(mask == 0).view(mask_reshape)``), not an additive (b, 1, t, s) one
    ones_zeros = re.search(rf"\({mask_arg} == 0\)", source) is not None
    residual = False  # decided below, once the module can be called
    packed_rows: list[bool] = []  # a packed call's input has a leading axis of 1 (decided by the first call)
    point_axis: list[bool] = []  # the input has a second axis of 1 (decided by the first call that runs)
    if re.search(r"batch_size, point_batch_size = \w+\.shape\[:2\]", _source(cls.forward)):
        point_axis.append(True)  # SAM's (b, points, t, e) tokens, read by the forward itself

    def positions(x: Tensor, offset: int) -> dict[str, Tensor]:
        """``cache_position``, for a forward that reads it (T5 on transformers 5.0: the length of its bias)."""
        return {"cache_position": torch.arange(offset, offset + x.shape[1])} if "cache_position" in signature else {}

    def invoke(m: Any, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """The module's output (:func:`_output_tensor`); a block's residual and Add & Norm bypassed."""
        if residual:
            bypass_norms(m, layout.norms)
        bypass_norms(m, input_norms)
        kwargs.update(dict.fromkeys(nullable))
        kwargs.update(dict.fromkeys(flags, False))
        if channels_first:  # (b, e, t) in and out: a 1x1 convolution's layout (SqueezeBERT)
            channels: Tensor = _output_tensor(m(x.transpose(1, 2), *args, **kwargs)).transpose(1, 2)
            return channels - x if residual else channels
        kwargs.update({name: torch.zeros((), dtype=x.dtype) for name in added})
        if sliding is not None:  # Longformer: padded to a multiple of its window and called as its model calls it
            b, t = x.shape[0], x.shape[1]
            pad = -t % (2 * sliding)
            padding = torch.zeros(b, t + pad, dtype=torch.bool)
            padding[:, t:] = True  # its model's padding tokens: masked keys (the dtype's minimum), rows zeroed
            kwargs.update({mask_arg: padding.to(x.dtype) * torch.finfo(x.dtype).min, "is_index_masked": padding,
                           "is_index_global_attn": torch.zeros_like(padding), "is_global_attn": False})
            windowed: Tensor = _output_tensor(m(nn.functional.pad(x, (0, 0, 0, pad)), *args, **kwargs))[:, :t]
            return windowed - x if residual else windowed
        if packed:
            b, t = x.shape[0], x.shape[1]
            kwargs["cu_seqlens"] = torch.arange(0, (b + 1) * t, t, dtype=torch.int32)
            if mask_free:  # HunYuan-VL's: its layers pass attention_mask=None through **kwargs to eager attention
                kwargs["attention_mask"] = None
            if "max_seqlen" in signature:
                kwargs["max_seqlen"] = t
            flat = rearrange(x, "b t e -> (b t) e")
            if not packed_rows:  # (total, e), as Qwen2-VL's encoder takes it, or (1, total, e) (HunYuan-VL's)
                try:
                    m(flat, *args, **kwargs)
                    packed_rows.append(False)
                except Exception:
                    packed_rows.append(True)
            out = m(flat[None] if packed_rows[0] else flat, *args, **kwargs)
            rows: Tensor = _output_tensor(out)
            unpacked: Tensor = rearrange(rows, "o (b t) e -> (o b) t e" if packed_rows[0] else "(b t) e -> b t e",
                                         b=b)
            return unpacked - x if residual else unpacked
        if time_first:  # Mask2Former's and OneFormer's: (t, b, e) in and out, the mask (b h, t, s)
            if flat_mask and mask_arg in kwargs and isinstance(kwargs[mask_arg], Tensor):
                mask = kwargs[mask_arg]
                h = int(resolve(m, layout.num_heads, cls.__name__))
                kwargs[mask_arg] = mask.expand(mask.shape[0], h, *mask.shape[2:]).reshape(-1, *mask.shape[2:])
            moved = {n: a.transpose(0, 1) if isinstance(a, Tensor) and a.ndim == 3 and n != mask_arg else a
                     for n, a in kwargs.items()}
            out = m(x.transpose(0, 1), *(a.transpose(0, 1) for a in args), **moved)
            first: Tensor = (out[0] if isinstance(out, tuple) else out).transpose(0, 1)
            return first - x if residual else first
        if point_axis == [True]:  # SAM's (b, points, t, e) tokens: one point
            lifted = [a[:, None] if isinstance(a, Tensor) and a.ndim == 3 else a for a in args]
            memory = {n: a[:, None] for n, a in kwargs.items() if (n in _MEMORY_ARGS or n in again)
                      and isinstance(a, Tensor)}
            out = m(x[:, None], *lifted, **{**kwargs, **memory})
            point: Tensor = (_output_tensor(out))[:, 0]
            return point - x if residual else point
        try:
            out = m(x, *args, **kwargs)
        except ValueError as err:  # (b, t, e) unpacked as four axes: SAM's point batch, or its image (b, h, w, e)
            if point_axis or "expected 4, got 3" not in str(err):
                raise
            point_axis.append(True)
            return invoke(m, x, *args, **kwargs)
        result: Tensor = _output_tensor(out)
        if not point_axis and result.ndim == x.ndim + 1:  # Sam2's: (b, t, e) read as t point batches of 1 token
            point_axis.append(True)
            return invoke(m, x, *args, **kwargs)
        if not point_axis:
            point_axis.append(False)
        return result - x if residual else result

    own_style = _rotary_style(module) if own_tables else "half"  # the pairing of the class's rotate function
    complex_tables = own_tables and _complex_tables(module)  # Llama 4's vision freqs_ci: exp(i p theta)
    prefix = _patch_prefix(module) if own_tables else None

    def own_rotary(m: Any, x: Tensor, offset: int) -> Any:
        """The audit's own 1-D rotary tables: positions offset.. in each sequence, base :data:`_PACKED_THETA`,
        paired as the class's rotate function pairs; ``(b t, d)`` for a packed call, else ``(b, t, d)``; complex
        turns ``exp(i p theta)`` ``(t, 1, d/2)``, shared by the batch, as Llama 4's vision model passes them."""
        heads = int(resolve(m, layout.num_heads, cls.__name__))
        d = (int(resolve(m, layout.head_dim, cls.__name__)) if layout.head_dim
             else int(m.get_submodule(layout.qkv or layout.q or "").weight.shape[0]) // (3 if layout.qkv else 1)
             // heads)
        turned = x.shape[1] - (prefix or 0)  # DINOv3: tables for the patch tokens only
        angles = torch.arange(offset, offset + max(turned, 0), dtype=torch.float64)[:, None] * _PACKED_THETA ** (
            -torch.arange(0, d, 2, dtype=torch.float64) / d)
        if complex_tables:
            return torch.polar(torch.ones_like(angles), angles)[:, None].to(x.dtype.to_complex())
        emb = (torch.cat([angles, angles], dim=-1) if own_style == "half"
               else repeat(angles, "t f -> t (f two)", two=2))
        if prefix is not None:  # DINOv3's model passes (patches, d), shared by the batch
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        tables = repeat(emb, "t d -> (b t) d" if packed else "t d -> b t d", b=x.shape[0])
        return tables.cos().to(x.dtype), tables.sin().to(x.dtype)

    def rotary(m: Any, x: Tensor, offset: int) -> Any:
        assert rotary_class is not None
        config = getattr(m, "config", None) or m.get_submodule(layout.core.rstrip(".")).config  # ESM: the core's
        embedding = rotary_class(config=config)
        n = config.num_attention_heads if heads else x.shape[1]
        positions = torch.arange(0 if heads else offset, (0 if heads else offset) + n)[None].expand(x.shape[0], -1)
        if mrope in (_AXIAL, _AXIAL_WH):  # (height, width) of each patch, shared by the batch
            positions = mrope_positions(offset, n)[1:].T
        elif mrope == _AXIAL_BLOCKS:  # (b, t, 2): Gemma 4's vision rotary takes a batch of (height, width)
            positions = mrope_positions(offset, n)[1:].T[None].expand(x.shape[0], -1, -1)
        elif mrope is not None:  # 3-D positions (temporal, height, width): an image grid, not text
            positions = mrope_positions(offset, n)[:, None].expand(3, x.shape[0], n)
        extra = ({"layer_type": _layer_type(m)} if "layer_type" in inspect.signature(embedding.forward).parameters
                 else {})
        tables = embedding(x, positions, **extra)
        if isinstance(tables, Tensor):  # DeepSeek V2's complex turns exp(i p theta), as its model passes them
            return tables
        cos, sin = tables
        return cos.to(x.dtype), sin.to(x.dtype)

    def call(m: Any, x: Tensor, mask: Tensor | None, offset: int, cache: Any = None) -> Tensor:
        kwargs: dict[str, Any] = {mask_arg: mask} if takes_mask else {}
        if takes_rotary:
            kwargs[rotary_arg or ""] = own_rotary(m, x, offset) if own_tables else rotary(m, x, offset)
        elif "position_embeddings" in signature:  # required but unused by this layer (Flint's full-attention layers)
            kwargs["position_embeddings"] = None
        if zero_positions is not None:  # DETR's optional embeddings that its values need: zeros, plain attention
            kwargs[zero_positions] = torch.zeros_like(x)
        kwargs.update({name: torch.zeros_like(x) for name in content_zeros})
        kwargs.update({n: x for n in again})
        kwargs.update({n: x for n in _RESIDUAL_INPUTS if n in signature})
        if "position_ids" in signature:
            kwargs["position_ids"] = torch.arange(offset, offset + x.shape[1])[None].expand(x.shape[0], -1)
            if takes_rotary and mrope == _AXIAL_BLOCKS:  # the (b, t, 2) positions its tables were made from
                kwargs["position_ids"] = mrope_positions(offset, x.shape[1])[1:].T[None].expand(x.shape[0], -1, -1)
        if "layer_idx" in signature:
            kwargs["layer_idx"] = getattr(m, "layer_idx", 0)
        if relative_keys is not None and relative_keys.proj is not None:  # Transformer-XL: distances t-1 .. 1-t
            # (decoding: the keys the cache holds too, distances offset + t - 1 .. 1 - t)
            rows = relative_keys.table(m)[_XL_LENGTH - x.shape[1] - offset:_XL_LENGTH + x.shape[1] - 1]
            kwargs[table_arg] = rows[None].expand(x.shape[0], -1, -1).to(x.dtype)
        if layout_arg is not None:  # LiLT's layout stream: the audit's own layout inputs, the same for every sequence
            own_layout = _layout_inputs(m, layout.core, x.shape[1])
            kwargs[layout_arg] = own_layout[None].expand(x.shape[0], -1, -1).to(x.dtype)
        if pair_arg is not None and relative_keys is not None:  # Bros's (t, t, b, d), the same for every sequence
            pairs = relative_keys.table(m).view(_XL_LENGTH, _XL_LENGTH, -1)[:x.shape[1], :x.shape[1]]
            kwargs[pair_arg] = pairs[:, :, None].expand(-1, -1, x.shape[0], -1).contiguous().to(x.dtype)
        if disentangled is not None:  # DeBERTa's relative embeddings, from its encoder: the audit's own table
            kwargs["rel_embeddings"] = disentangled.table(m).to(x.dtype)
            if disentangled.form == "v1":  # its encoder's distances i - j too (v1 adds no term without them)
                kwargs["relative_pos"] = (torch.arange(x.shape[1])[:, None] - torch.arange(x.shape[1]))[None]
        if distances_arg is not None:  # Granite Speech's block distances, as its encoder computes them
            kwargs[distances_arg] = _block_distances(m)
        if "shared_kv_states" in signature:  # Gemma 4's key/value sharing: a layer that owns its keys and values
            kwargs["shared_kv_states"] = {}
        if merged is not None:  # the audit's encoder tokens, every one visible: the mask ends in zeros for them
            memory = _memory_tokens(x.shape[-1]).to(x.dtype)
            kwargs[merged[0]] = memory[None].expand(x.shape[0], -1, -1)
            merged_mask = kwargs.get(mask_arg)
            if isinstance(merged_mask, Tensor):
                kwargs[mask_arg] = torch.cat([merged_mask, merged_mask.new_zeros(
                    *merged_mask.shape[:-1], _MERGED_MEMORY)], dim=-1)
        if "height" in signature and "width" in signature:  # an image of one row of t patches (SegFormer)
            kwargs["height"], kwargs["width"] = 1, x.shape[1]
        kwargs.update(positions(x, offset))
        if cache is not None and cache_arg is not None:
            kwargs[cache_arg] = cache
        return invoke(m, x, **kwargs)

    def window_keep(m: Any, keep: Tensor, t: int, s: int) -> Tensor:
        window = getattr(m, "sliding_window", None)
        return keep if window is None else keep & window_mask(t, s, int(window))

    def mask_for(m: Any, x: Tensor, s: int, keep: Tensor | None, is_causal: bool) -> Tensor:
        b, t = x.shape[0], x.shape[1]
        keep = with_causal(keep, is_causal, t, s)
        if keep is None:  # an explicit mask always: without one, some kernels decide causality themselves
            keep = torch.ones(1, 1, t, s, dtype=torch.bool)
        if local is not None:  # LongT5's local attention: its model's block form
            return _local_frames(core, keep.expand(b, keep.shape[1], t, s), x.dtype)
        if boolean_mask:
            return window_keep(m, keep, t, s).expand(b, keep.shape[1], t, s)
        if ones_zeros:
            if keep.shape[1] != 1:
                raise AuditUsageError(f"{cls.__qualname__}: its mask is (b, t, s), one for every head")
            return window_keep(m, keep, t, s).expand(b, 1, t, s)[:, 0].to(x.dtype)
        mask = additive_mask(window_keep(m, keep, t, s).expand(b, keep.shape[1], t, s), x.dtype)
        assert mask is not None
        if window_table is not None:  # (windows, t, s): one mask per window (a sequence here), shared by the heads
            if mask.shape[1] != 1:
                raise ValueError(f"{cls.__qualname__} takes one mask per window, shared by its heads")
            return mask[:, 0]
        return mask

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        if separate:
            assert key is not None
            assert value is not None
            masks = {mask_arg: mask_for(m, x, key.shape[1], keep, is_causal)} if takes_mask else {}
            if projected:
                return invoke(m, x, **dict(zip(PROJECTED, (key, value), strict=True)), **masks, **positions(x, 0))
            return invoke(m, x, key, value, **masks, **positions(x, 0))
        if perceiver is not None:  # the memory first, the latents (queries) by name, a key mask of ones over both
            assert key is not None
            masks = {mask_arg: torch.ones(x.shape[0], key.shape[1] + x.shape[1], dtype=x.dtype)} if key_mask else {}
            return invoke(m, key, **{perceiver[0]: x}, **masks)
        if memory_arg is not None and with_input:  # its model's mask: the memory's, then ones for the input's keys
            assert key is not None
            t, s = x.shape[1], key.shape[1]
            over = with_causal(keep, is_causal, t, s)
            over = torch.ones(1, 1, t, s, dtype=torch.bool) if over is None else over
            over = torch.cat([over, over.new_ones(*over.shape[:-1], t)], dim=-1)
            masks = {memory_mask: mask_for(m, x, s + t, over, False)} if takes_mask else {}
            if takes_rotary:  # tables for the s + t keys, the queries' the last t (MuseGlimmerAssistant's)
                masks[rotary_arg or ""] = rotary(m, torch.cat([key, x], dim=1), 0)
            return invoke(m, x, **{memory_arg: key}, **masks, **positions(x, 0))
        if memory_arg is not None:
            assert key is not None
            masks = {memory_mask: mask_for(m, x, key.shape[1], keep, is_causal)} if takes_mask else {}
            zeros = {n: torch.zeros_like(key if side == "key" else x) for n, side in content_zeros.items()}
            return invoke(m, x, **{memory_arg: key}, **masks, **zeros, **positions(x, 0))
        return call(m, x, mask_for(m, x, x.shape[1], keep, is_causal), 0)

    def decode(m: Any, x: Tensor) -> Tensor:
        from transformers import DynamicCache, EncoderDecoderCache

        owner = m.get_submodule(layout.core.rstrip(".")) if layout.core else m
        cache: Any = (DynamicCache(config=owner.config) if hasattr(owner, "config") and _model_window(m) is None
                      else DynamicCache())  # a window only the model applies (Nemotron ASR's): the full cache
        layer = getattr(m, "layer_idx", 0) or 0
        if layer >= len(cache.layers) or not hasattr(cache.layers[layer], "update"):
            # a hybrid model's config puts a recurrent (mamba) layer first: the attention layer's own cache is the
            # plain one the model gives its attention layers
            cache = DynamicCache()
        if "self_attention_cache" in source:  # a decoder's self-attention in an encoder-decoder model
            cache = EncoderDecoderCache(cache, DynamicCache())
        return torch.cat([call(m, x[:, i:i + 1], decode_mask(m, x, cache, layer, i), i, cache)
                          for i in range(x.shape[1])], dim=1)

    def decode_mask(m: Any, x: Tensor, cache: Any, layer: int, i: int) -> Tensor | None:
        """The mask of decoding step ``i``: None (every key the cache holds), unless the forward's mask argument is
        required (ModernBERT's decoder adds it to the logits unconditionally: its model always builds one); then
        the one its model builds, over the keys the cache will hold (``get_mask_sizes``), the window applied."""
        required = mask_arg in signature and signature[mask_arg].default is inspect.Parameter.empty
        if not required or not hasattr(cache, "get_mask_sizes"):
            return None
        length, offset = cache.get_mask_sizes(1, layer)
        keys = torch.arange(offset, offset + length)
        window = getattr(m, "sliding_window", None)
        # window_mask's edge for the one query at position i, over keys offset.. of the cache (not 0..i)
        keep = keys <= i if window is None else (keys <= i) & (keys > i - int(window))
        if ones_zeros:
            return keep[None, None].expand(x.shape[0], 1, length).to(x.dtype)
        if boolean_mask:  # True = may attend (CPM-Ant's)
            return keep[None, None, None].expand(x.shape[0], 1, 1, length)
        return additive_mask(keep[None, None, None].expand(x.shape[0], 1, 1, length), x.dtype)

    width = _input_width(module, layout)
    residual = has_residual(module, layout, lambda m, x: forward(m, x, x, x, None, False), width)
    try:
        # (a class whose keys are over its memory and its input always turns them: its call needs the memory)
        ignored = takes_rotary and not heads and not with_input and _ignores_rotary(module, call, width,
                                                                                    rotary_arg or "")
    except Exception as err:
        raise AuditUsageError(f"{cls.__qualname__}: not of the common shape (a call on (b, t, e) tokens with 1-D "
                              f"rotary tables raised {type(err).__name__}: {str(err).splitlines()[0][:100]})") from err
    if ignored:
        takes_rotary = False  # the config switches it off (Zamba2's use_mem_rope): audited without positions
    self_attention = not separate and memory_arg is None
    window = getattr(core, "sliding_window", None)
    turn = min((i for i in (source.find("apply_rotary_pos_emb("), source.find("apply_rotary_emb(")) if i >= 0),
               default=-1)
    normed = source.find(f"self.{q_norm}(") if q_norm else -1
    # Llama 3's or YaRN's frequencies: read from the module's own rotary class (the default: from the base alone)
    frequencies = (_frequencies(rotary_class, _layer_type(module)) if takes_rotary and rotary_class is not None and (
        _rope_type(module) in _STATIC_ROPE[1:] or mrope in (_AXIAL, _AXIAL_WH, _AXIAL_BLOCKS)) else None)
    # the same d/4 frequencies for both coordinates (SAM 2's, Step 3.7's)
    if frequencies is not None and (_shared_axial(rotary_class) or _flipped_axial(rotary_class)):
        shared = frequencies

        def twice(m: Any) -> tuple[Tensor, float]:
            inverse, magnitude = shared(m)
            return torch.cat([inverse, inverse]), magnitude

        frequencies = twice
    position_bias = relative_bias(layout.core) if layout.relative_bias else None
    wavlm = _gated_bias(core, layout.core)
    if wavlm is not None:
        position_bias = wavlm[0]
    if layout_arg is not None:
        position_bias = _layout_bias(layout.core)
    lengths = _HF.lengths
    if window_table is not None:
        table_path, window_size = window_table
        lengths = (window_size[0] * window_size[1],) * 2
        table_name = f"{table_path}.relative_position_bias_table".lstrip(".")

        def position_bias(m: Any, t: int, s: int) -> Tensor:
            owner = resolve(m, table_path, cls.__name__) if table_path else m
            if isinstance(getattr(owner, "continuous_position_bias_mlp", None), nn.Sequential):
                return _continuous_bias(owner, window_size)
            return window_bias(resolve(m, table_name, cls.__name__).double(), window_size)

    spec = ModuleSpec(
        f"hf:{cls.__name__}", forward, dataclasses.replace(_HF if self_attention else _HF_CROSS,
                                                           supports_mask=takes_mask, supports_causal=takes_mask,
                                                           lengths=lengths),
        **{**layout.fields(), **({"scale": split} if (split := _split_scale(module)) is not None else {})},
        rotary=(Rotary(theta, _latent_style(module) if latent else _rotary_style(module),
                       fraction=_rotary_fraction(core), frequencies=frequencies, prefix=prefix or 0)
                if (takes_rotary or internal) and theta is not None and not heads else None),
        decode=decode if cache_arg is not None and self_attention and _decodes(core)
        and not _head_padding_only(cls, mask_arg) else None,
        build=lambda c, overrides: hf_build(c, overrides, cross=memory_arg is not None),
        position_bias=position_bias, position_gate=None if wavlm is None else wavlm[1],
        module_type=f"{cls.__module__}.{cls.__qualname__}", memory=memory_arg is not None,
        q_norm=q_norm, k_norm=k_norm, v_norm=_v_norm(core, layout.core),
        # (keys over memory and input: its model's mask holds any window, bidirectional, over absolute positions)
        window=None if window is None or with_input else int(window),
        blocks=f"{layout.core}context_size" if distances_arg is not None else None,
        norms_after_rotary=0 <= turn < normed,  # HunYuan and nanochat normalise the turned q and k
        softcap=_softcap(module), sinks=_sinks(module), gate=_output_gate(module), sub_norm=_sub_norm(module),
        clip_qkv=_clip_qkv(module) if not layout.core else None,
        differential=_differential(module), latent=latent, mrope=mrope if takes_rotary else None,
        decomposed=_decomposed(module), disentangled=disentangled, relative_keys=relative_keys,
        keys_with_input=with_input,

        max_length=None if chunked is None else f"{layout.core}chunk_length",
        radius=(f"{layout.core}local_radius" if local is not None
                else f"{layout.core}one_sided_attn_window_size" if sliding is not None else None))
    return spec, layout
