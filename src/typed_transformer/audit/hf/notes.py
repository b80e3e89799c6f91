"""What a Hugging Face class's audit leaves untested (notes) and what it reads from the class (limits)."""

import contextlib
import inspect
import re
from typing import Any

from torch import nn

from ..core.conventions import AuditUsageError
from ..modules.spec import resolve
from .build import _PACKED_THETA
from .facts import (
    _AXIAL,
    _AXIAL_BLOCKS,
    _AXIAL_WH,
    _LATENT,
    _MERGED_MEMORY,
    _RELEASED_CLIP,
    _SEPARATE,
    _STATIC_ROPE,
    _added_biases,
    _bias_as_mask,
    _block_input_norms,
    _body,
    _chunked_local,
    _clamps_always,
    _clip_path,
    _clip_qkv,
    _complex_tables,
    _core_of,
    _cosine,
    _decomposed,
    _differential,
    _disentangled,
    _distances_arg,
    _espnet_shift,
    _forward_source,
    _gated_bias,
    _head_padding_only,
    _heads_as_positions,
    _input_norms,
    _key_mask_only,
    _keys_with_input,
    _latent,
    _layout_arg,
    _local_blocks,
    _mask_none,
    _merged_memory,
    _model_window,
    _mrope,
    _needed_positions,
    _norm_paths,
    _nullable,
    _output_gate,
    _own_tables,
    _padding_ones,
    _padding_only,
    _pair_arg,
    _positions_optional,
    _query_scale,
    _relative_keys,
    _rope_params,
    _rope_type,
    _rotary_arg,
    _rotary_class,
    _same_shape,
    _separate_biases,
    _shaw_blocks,
    _sinks,
    _sliding_chunks,
    _softcap,
    _source,
    _sub_norm,
    _v_norm,
    _width_rotary,
    _window_table,
    _xl_names,
)
from .layout import content_layout, content_zero_args, find_layout, projected_layout
from .recognise import (
    _GATED_OWN,
    _GATED_READS,
    _gated_block,
    _memory_arg,
    _mixture_of_attention,
    _shipped_spec,
    hf_spec,
)


def _content_notes(module: nn.Module) -> list[str]:
    """What the audit of a DETR decoder's content and position projections (:func:`content_layout`) leaves
    untested: the positions (zeros), the per-head half they concatenate, the optional ones left None, the position
    projections the layer does not have."""
    if content_layout(module) is None:
        return []
    cls = type(module)
    zeros = content_zero_args(cls)
    source = _source(cls.forward)
    notes = [f"DETR decoder attention with content and position projections added before the dot product: audited "
             f"with zero {', '.join(zeros)} (each position projection then adds its bias only), so what the "
             f"positions add is not tested"]
    if re.search(r"torch\.cat\(\[\w+, \w+\]", source):
        notes.append("each head's query and key get a positional half concatenated (the projected sine embedding, "
                     "the keys' position projection): with zero positions it adds one constant per head to the "
                     "logits, which the softmax cancels, so that half is not tested; the scale is the class's, "
                     "1/sqrt of the doubled head")
    signature = inspect.signature(cls.forward).parameters
    left = [n for n in re.findall(r"self\.\w*pos\w*proj\((\w+)\)", source) if n in signature and n not in zeros]
    notes += [f"forward's optional {name} (its model passes them to the first decoder layer only) left None, as "
              f"for the other layers: the first layer's added positions are not tested" for name in dict.fromkeys(left)]
    notes += [f"{name} is None in this layer (is_first=False and keep_query_pos=False, as in its model's layers "
              f"after the first): the query positions the first layer adds are not tested"
              for name in re.findall(r"self\.(\w*pos\w*proj) = None", _source(cls))
              if getattr(module, name, None) is None]
    return notes


def hf_notes(module: nn.Module) -> list[str]:
    """True behaviours of the class, as its model calls it, that pass the audit but a user should know."""
    notes = []
    signature = inspect.signature(type(module).forward).parameters
    core = _core_of(module)
    if "position_embeddings" in signature and _rotary_class(module) is None and _positions_optional(type(module)):
        notes.append("forward takes optional position_embeddings and its module has no rotary class (DETR-style "
                     "embeddings added to the inputs): audited with none passed, so what they add is not tested")
    elif "position_embeddings" in signature and _width_rotary(type(module)):
        notes.append("forward takes optional rotary tables that turn q and k across the whole model width before "
                     "the heads are split (each head its own slice of its model's 2-D table): audited with none "
                     "passed, as its model calls it for cross-attention, so its self-attention's rotary is not "
                     "tested")
    elif ("position_embeddings" in signature and (_xl_names(module) or ("",) * 4)[3] != "position_embeddings"
            and hf_spec(module).rotary is None and not _heads_as_positions(type(module))
            and _distances_arg(type(module)) != "position_embeddings"):
        notes.append("forward takes position_embeddings and ignores them with this config (audited without "
                     "positions)")
    forward_params = list(signature)[1:4]
    if tuple(forward_params) in _SEPARATE and "position_embeddings" in signature and (
            signature["position_embeddings"].default is inspect.Parameter.empty):
        notes.append("a (query, key, value) class with rotary tables: audited as its model's self-attention (query = "
                     "key = value, the keys turned at the queries' positions), its 2-D axial tables made from the "
                     "audit's grid positions; a cross-attention use of it (keys of another width or grid, keys left "
                     "unturned) is not tested")
    arg = _rotary_arg(type(module))
    if arg not in (None, "position_embeddings"):
        kind = "complex turns exp(i p theta)" if _complex_tables(module) else "cos and sin"
        notes.append(f"forward takes its rotary table as {arg} ({kind}): audited with the audit's own 1-D table "
                     f"(positions 0.., every token turned, shared by the batch), so its model's table (2-D patch "
                     f"positions, a class token left unturned) is not tested")
    if "attention_mask" in signature and _mask_none(_body(type(module).forward)) and not re.search(
            r"(?<![\w.])attention_mask\b(?!\s*=[^=])", _body(type(module).forward)):
        notes.append("forward takes attention_mask and passes None to its attention function instead (its model "
                     "passes none): audited without masks")
    if getattr(module, "scale", None) is False and "if self.scale:" in _source(type(module)):
        notes.append("built with its constructor's default scale=False (logits not divided by sqrt(d)); its model "
                     "passes scale=True, so that path is not tested")
    window = _model_window(module)
    if window is not None and hf_spec(module).decode is not None:
        notes.append(f"its model limits each query to a window of {window} keys (config.sliding_window, by its mask "
                     f"and its sliding-window cache); the layer has no window of its own and is audited under a plain "
                     f"causal mask with a full cache, so that window is not tested")
    local = _local_blocks(core)
    if local is not None:
        notes.append(f"LongT5's local attention built with local_radius {local - 1} (blocks of {local}; its config's "
                     f"default 127 would fit the audit's short sequences in one block), given its mask in its model's "
                     f"block form (each query block's row of its 3-block frame, the keys beyond the radius masked by "
                     f"the model's _mask_local_attention_mask); other radii are not tested")
    sliding = _sliding_chunks(core)
    if sliding is not None:
        notes.append(f"Longformer's sliding-chunk attention built with attention_window {2 * sliding} (each query sees "
                     f"the keys within {sliding}; its config's default 512 would cover the audit's sequences), called "
                     f"as its model calls it: the input padded to a multiple of the window (the padding keys masked "
                     f"with the dtype's minimum, their rows zeroed and dropped); its mask is a key padding mask (b, s) "
                     f"of its own values, so it is audited without the audit's masks (their padding, and the "
                     f"(b, 1, t, s) masks it cannot take, are not tested); no global tokens (is_global_attn=False), so "
                     f"the global attention and its query_global, key_global, value_global are not tested; other "
                     f"windows are not tested")
    chunked = _chunked_local(core)
    if chunked is not None:
        notes.append(f"Reformer's local attention: audited on sequences of one chunk ({chunked} tokens) at most, where "
                     f"it is plain attention, so its chunks ({core.num_chunks_before} before, {core.num_chunks_after} "
                     f"after each query chunk) and its model's padding to a multiple of the chunk are not tested; its "
                     f"mask is a key padding mask (b, s) only, so it is audited without masks (their padding is not "
                     f"tested)" + ("" if core.is_decoder else "; built as an encoder (is_decoder=False), so its causal "
                                   "mask is not tested"))
    if _same_shape(type(module)) or _same_shape(type(core)):
        residual = ", and as layer_input, its block's residual," if "layer_input" in signature else ""
        notes.append(f"a (query_tensor, key_tensor, value_tensor) class that views its keys and values with the "
                     f"queries' shape: audited as self-attention, the input passed as all three{residual} as its model "
                     f"passes its hidden states without bottlenecks; with them (outside the class) the model passes "
                     f"the shared bottleneck's output as query and key and the hidden states as value, a use not "
                     f"tested")
    if _bias_as_mask(type(module)):
        notes.append("forward takes attention_bias, which it adds to its logits as its mask (its layer's per-head pair "
                     "bias with the padding folded in): audited with the audit's masks passed as it, so a pair bias "
                     "is tested only as an additive mask is")
    coordinates = _rotary_class(module)
    rotary_forward: Any = getattr(coordinates, "forward", None)
    if (_own_tables(module) and coordinates is not None and _rotary_arg(type(module)) == "position_embeddings"
            and len(params := inspect.signature(rotary_forward).parameters) >= 3
            and not {"position_ids", "seq_len"} & set(params)):
        notes.append(f"its model's rotary class ({coordinates.__name__}) makes its cos/sin from coordinates, "
                     f"not token positions: audited with the audit's own 1-D tables (positions 0.., base "
                     f"{_PACKED_THETA:g}), so its model's tables are not tested, the class's turn of q and k is")
    if _clamps_always(module) and getattr(getattr(getattr(module, "config", None), "attn_config", None), "clip_qkv",
                                          0) is None and getattr(module, "clip_qkv", None) == _RELEASED_CLIP:
        notes.append(f"its config's default clip_qkv=None makes forward raise (torch.clamp with neither bound; its "
                     f"released checkpoints set {_RELEASED_CLIP:g}): built with clip_qkv={_RELEASED_CLIP:g}, the "
                     f"clamp of q, k and v modelled")
    if getattr(getattr(module, "config", None), "audit_default_rope", False):
        notes.append(f"its config's default holds no rotary parameters for its layer types (rope_parameters = {{}}: "
                     f"its model's rotary class raises a KeyError): built with default rotary parameters (base "
                     f"{_PACKED_THETA:g}) for each type, audited with text positions (every M-RoPE axis equal), so "
                     f"its checkpoints' own parameters (a NoPE layer type, M-RoPE image positions) are not tested")
    if any(getattr(m, "use_clipped_linears", None) is False for m in module.modules()):
        notes.append("its projections' optional clipping (use_clipped_linears: inputs and outputs clamped to bounds "
                     "read from a checkpoint) is off in its default config: audited without it, so the clamps are "
                     "not tested")
    if _mixture_of_attention(module):
        notes.append("JetMoE's mixture of attention built with one expert chosen for every token (num_local_experts = "
                     "num_experts_per_tok = 1: its gate is 1, its routing exact): the expert's query and output "
                     "projections, the shared keys and values and the output bias are tested; the routing of its "
                     "checkpoints (top-k of several experts, their softmax gates, the keys and values repeated per "
                     "chosen expert) is not")
    needed = _needed_positions(type(module))
    if needed is not None:
        notes.append(f"forward's {needed} defaults to None, yet without them its value projection reads a name only "
                     f"they set (UnboundLocalError; its model always passes them): audited with zero {needed}, so "
                     f"what they add is not tested")
    notes += _content_notes(module)
    if _gated_block(module):
        heads, width = int(getattr(module, "num_attention_heads")), int(getattr(module, "hidden_size"))  # noqa: B009
        notes.append("a gated cross-attention block (x + tanh(gate_attention) * attention, then + tanh(gate_ffw) * "
                     "feed-forward): audited with its residual subtracted, tanh(gate_attention) folded into the "
                     "output projection, gate_ffw zeroed and attention_norm bypassed, so the feed-forward and the "
                     "norm are not tested; keys and values of the protein modality only, as its model builds it; "
                     "its query and key masks (rows of ones and zeros, filled with the dtype's minimum) are not "
                     "tested (audited without masks)")
        notes.append(f"its scale is num_attention_heads**-0.5 (self.scale, read as the class uses it), not "
                     f"head_dim**-0.5: the same here ({heads} heads of {width // heads}), not in a model whose head "
                     f"count and head size differ")
    mask_arg = next((n for n in ("attention_mask", "mask", "attn_mask") if n in signature), "attention_mask")
    if _key_mask_only(type(module), mask_arg):
        notes.append(f"its {mask_arg} is a key padding mask (b, s) of ones and zeros (the masked logits filled with "
                     f"-1e4), which no mask of the audit's (b, 1, t, s) form reaches: audited without masks (ones "
                     f"passed), so its masking is not tested")
    if projected_layout(module) is not None:
        notes.append("takes its queries, keys and values already projected (its decoder layer's content and position "
                     "projections are outside the class, audited with the layer classes): audited with identity "
                     "projections over separate query, key and value inputs")
    notes += [f"normalises its input with {name} before its projections (a pre-norm inside the class): audited with "
              f"it bypassed, as a block's Add & Norm is, so the norm is not tested"
              for name in _input_norms(core) + _block_input_norms(module)]
    shipped = _shipped_spec(module, False)
    if shipped is None or shipped.alibi is None:  # (MPT's shipped spec passes its position_bias: the ALiBi it models)
        notes += [f"forward adds {name} to its logits, a bias its model computes outside the class: audited with "
                  f"zeros passed, so what it adds is not tested" for name in _added_biases(core)]
    pair_arg, layout_arg = _pair_arg(core), _layout_arg(core)
    notes += [f"forward requires {name} and takes None for it (LUKE's model passes None without entities, I-BERT's "
              f"without quant_mode): audited with None, so what the class computes with a value is not tested"
              for name in _nullable(type(module)) if name not in (pair_arg, layout_arg)]
    if layout_arg is not None:
        notes.append(f"LiLT's layout stream: its logits ql . kl / sqrt(d // r) (layout_query and layout_key of its "
                     f"model's {layout_arg}) added to the text logits are audited over the audit's "
                     f"own seeded layout inputs, the same for every sequence; the stream's own output (its context "
                     f"over layout_value, the class's second output, and its block's layout_output) is not tested")
    if pair_arg is not None:
        notes.append(f"forward adds q_i . R[i, j] to its logits before scaling them, R its model's "
                     f"{pair_arg} (t, t, b, d): audited with the audit's own seeded table, the same "
                     f"for every sequence of the batch, so its model's box embeddings are not tested")
    ratios = ("sr_ratio", "sequence_reduction_ratio", "sequences_reduction_ratio", "spatial_reduction_ratio")
    if any(getattr(m, name, None) == 1 for m in module.modules() for name in ratios):
        notes.append("built with a key reduction ratio of 1, as its model's last stage is (every key): the earlier "
                     "stages' strided convolution that pools the keys is not tested")
    if getattr(module, "query_stride", None) == 1 and getattr(module, "use_mask_unit_attn", None) is False:
        notes.append("built with query_stride 1 and use_mask_unit_attn False (global attention over every token, as "
                     "its model's later stages): the query max-pooling of a stage's first layer and the mask-unit "
                     "windows of the early stages are not tested")
    topk = getattr(getattr(module, "config", None), "index_topk", None)
    if isinstance(getattr(module, "indexer", None), nn.Module) and isinstance(topk, int):
        notes.append(f"DeepSeek sparse attention: its indexer keeps the {topk} best-scored keys of each query; the "
                     f"audit's sequences are shorter, so every key is kept and it is audited as the dense latent "
                     f"attention: the selection itself is not tested")
    if any(getattr(m, "relative_attention", None) is False and hasattr(m, "pos_att_type") for m in module.modules()):
        notes.append("DeBERTa's disentangled attention is off in its default config (relative_attention=False): "
                     "audited as plain attention, so the content-to-position and position-to-content terms of the "
                     "released checkpoints are not tested")
    if _decomposed(module) is not None:
        notes.append("decomposed relative positions on the audit's image of one row of t patches: the width table is "
                     "tested at every distance, the height table only at distance 0 (a term constant along each "
                     "query's row, which the softmax cancels)")
    if any(_padding_only(type(m), "attention_mask") for m in module.modules()):
        notes.append("forward takes only a key padding mask (b, 1, s) (0 = padding: its logits filled with the dtype's "
                     "minimum, its weights zeroed after the softmax) and refuses the audit's (b, 1, t, s) masks: "
                     "audited without masks, so its padding (and a fully padded row's zero output) is not tested")
    if any(_head_padding_only(type(m), "attention_mask") for m in module.modules()):
        notes.append("forward takes only a key padding mask per head (b, h, 1, s), added to its logits, and refuses "
                     "the audit's (b, 1, t, s) masks: audited without masks, so its padding is not tested; nor is "
                     "its cache (no causal mask can reach it; its model uses it as the encoder's self-attention, "
                     "without a cache, and the decoder's cross-attention)")
    if _relative_keys(module, "") is not None and _espnet_shift(module):
        notes.append("Transformer-XL relative terms on the audit's own table (seeded rows for distances t-1 .. 1-t, "
                     "passed as pos_emb): its encoder's sinusoidal table is not tested")
    if _shaw_blocks(module):
        notes.append(f"block-local attention built with blocks of {module.context_size} tokens (its "
                     f"models' 200 or 128), so that the audit's sequences span several blocks; Shaw's relative keys "
                     f"on the distances its encoder computes (clamp(i - j, -c, c) + the table's middle row)")
    if _padding_ones(type(module), "attention_mask"):
        notes.append("forward takes only a key padding mask (b, s) of ones and zeros (key_padding_mask = "
                     "attention_mask.ne(1)) and refuses the audit's (b, 1, t, s) masks: audited without masks, so its "
                     "padding is not tested")
    if _gated_bias(module, "") is not None:
        notes.append("its gated relative position bias as the first layer computes it (rel_attn_embed); its model's "
                     "later layers are passed the first layer's bias (position_bias), which the audit does not pass")
    if _shaw_blocks(module) and "attention_mask" in inspect.signature(type(module).forward).parameters:
        notes.append("forward takes only a key padding mask (b, s), reshaped into its blocks, and no mask of the "
                     "audit's (b, 1, t, s) form: audited without masks, so its padding is not tested (the padding "
                     "of the last block it adds itself is)")
    layout = None
    with contextlib.suppress(AuditUsageError):
        layout = find_layout(module, _norm_paths(module))
    memory_arg = _memory_arg(module, core, signature, None)
    if layout is not None and _keys_with_input(core, layout, memory_arg):
        window = getattr(core, "sliding_window", None)
        if window is not None:
            notes.append(f"keys over its memory and its input: the sliding window of {window} keys (its model's "
                         f"bidirectional sliding-window mask, over absolute positions) is not applied by the audit "
                         f"and is not tested")
        if any(n in signature for n in ("cache", "past_key_values", "past_key_value")):
            notes.append("keys over its memory and its input: audited in one call without a cache, so its cache "
                         "path is not tested")
    if _merged_memory(core) is not None:
        notes.append(f"self-attention and cross-attention merged in one softmax: audited as its decoder's "
                     f"self-attention beside the audit's own {_MERGED_MEMORY} encoder tokens (seeded, the same for "
                     f"every batch element, every one visible), so its encoder mask and varied encoder inputs are not "
                     f"tested")
    if _heads_as_positions(type(module)):
        notes.append("its model passes the head index as the rotary position (position_ids = arange(num_heads), "
                     "cos/sin unsqueezed at dim 2): each head is turned by one angle at every position, the turn "
                     "cancels in q.k, and the attention is position-free")
    return notes


def _layout_reads(module: nn.Module) -> set[str]:
    """The direct children a classic layout reads (a block's attention and output modules, its norms)."""
    try:
        layout = find_layout(module, _norm_paths(module))
    except AuditUsageError:
        return set()
    return layout.reads() | ({"relative_attention_bias"} if layout.relative_bias else set()) | {"q_attn"}


def hf_limits(module: nn.Module) -> list[str]:
    """What this class computes that the reference does not model (the sweep reports such a class as recognised but
    not audited: its FAILs would be about the reference, not the class)."""
    config = getattr(module, "config", None)
    limits = []
    signature = inspect.signature(type(module).forward).parameters
    # a class given the audit's own 1-D tables (packed encoders, image-grid rotaries): its rope type is not read
    uses_rotary = "position_embeddings" in signature and not _own_tables(module)
    kind = _rope_type(module)
    if uses_rotary and kind not in _STATIC_ROPE and _mrope(module) not in (_AXIAL, _AXIAL_WH, _AXIAL_BLOCKS):
        limits.append(f"rope_type {kind!r} (" + ("frequencies recomputed from each call's length"
                                                 if kind in ("dynamic", "longrope") else
                                                 "frequencies of a kind the reference does not read") + ")")
    first = re.search(r"\w+\[:, :(\d+)\], \w+\[:, :\1\] = apply_rotary", _forward_source(module))
    if first is not None:  # Qwen2.5-Omni's DiTAttention: "only first head is applied with RoPE"
        limits.append(f"rotary on the first {first.group(1)} head(s) only, the others unturned")
    for name in ("attn_logit_softcapping", "logit_softcapping"):
        if getattr(config, name, None) and _softcap(module) is None:
            limits.append(name)
    if uses_rotary and "mrope_section" in _rope_params(module) and _mrope(module) is None:
        limits.append("M-RoPE sections of another layout than consecutive blocks (Qwen3-VL's interleaved): audited "
                      "with text positions only (1-D rotary)")
    if getattr(module, "sinks", None) is not None and _sinks(module) is None:
        limits.append("attention sinks")
    clip = _clip_path(module)
    if clip is not None and _clip_qkv(module) is None and resolve(module, clip, type(module).__name__) is not None:
        limits.append(f"{clip} clamps the normalised queries and keys (after the q/k norms)")
    gate = _output_gate(module)
    relative = _relative_keys(module, "")
    latent = [] if _latent(module) is None else [getattr(_LATENT, f) for f in ("q", "q_a", "q_norm", "q_b", "kv_a",
                                                                              "kv_norm", "kv_b")]
    read = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "rotary_emb", *_norm_paths(module), *latent,
            _v_norm(module, "") or "", *_input_norms(module),
            *_layout_reads(module), gate.proj if gate is not None else "", _sub_norm(module) or "",
            *(("pos_key_proj", "pos_query_proj", "pos_proj", "pos_q_proj") if _disentangled(module, "") else ()),
            *(("continuous_position_bias_mlp",) if _window_table(module) is not None else ()),
            *(("gru_rel_pos_linear", "rel_attn_embed") if _gated_bias(module, "") is not None else ()),
            *(("distance_embedding", "rel_pos_emb", relative.proj or "") if relative is not None else ()),
            *(_GATED_READS if _gated_block(module) else ()),
            *(("query_global", "key_global", "value_global") if _sliding_chunks(module) is not None else ()),
            *(("layout_query", "layout_key", "layout_value") if _layout_arg(module) is not None else ()),
            *(("experts", "kv_proj") if _mixture_of_attention(module) else ())}
    for name, child in module.named_children():
        # dropout of any class (DeBERTa's StableDropout): off in eval mode
        # (a softmax over the keys as a module of its own: CPM-Ant's nn.Softmax(dim=-1))
        inert = isinstance(child, nn.Dropout | nn.Identity) or (isinstance(child, nn.Softmax) and child.dim == -1)
        if name not in read and not inert and not type(child).__name__.endswith("Dropout"):
            limits.append(f"submodule {name!r} ({type(child).__name__}) the spec does not read")
    # parameters of the class itself (attention sinks, differential lambdas, decomposed relative position tables)
    own = {"sinks"} if _sinks(module) is not None else set()
    if _query_scale(module) is not None:
        own |= {"scaling"}
    if _cosine(module):
        own |= {"logit_scale"}
    if gate is not None and gate.bias is not None:
        own |= {gate.bias}
    if relative is not None:
        own |= {relative.query_bias or "", relative.content_bias or "", "emb_rel_k", "emb_rel_v"}
    if _separate_biases(module):
        own |= {"q_bias", "v_bias"}
    if _gated_bias(module, "") is not None:
        own |= {"gru_rel_pos_const"}
    if _decomposed(module) is not None:
        own |= {"rel_pos_h", "rel_pos_w"}
    if _differential(module) is not None:
        own |= {n for n, _ in module.named_parameters(recurse=False) if n.startswith("lambda")}
    if _gated_block(module):
        own |= set(_GATED_OWN)
    limits += [f"parameter {name!r} the spec does not read" for name, _ in module.named_parameters(recurse=False)
               if name not in own]
    return limits
