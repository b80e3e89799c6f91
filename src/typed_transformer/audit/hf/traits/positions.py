"""Traits of positions: rotary tables passed, left out or made by the audit, relative positions and biases."""

import inspect
import re
from typing import Any

from ..build import _PACKED_THETA
from ..facts import (
    _AXIAL,
    _AXIAL_BLOCKS,
    _AXIAL_WH,
    _SEPARATE,
    _STATIC_ROPE,
    _added_biases,
    _complex_tables,
    _decomposed,
    _disentangled,
    _distances_arg,
    _espnet_shift,
    _forward_source,
    _gated_bias,
    _heads_as_positions,
    _layout_arg,
    _mrope,
    _own_tables,
    _pair_arg,
    _positions_optional,
    _relative_keys,
    _rope_params,
    _rope_type,
    _rotary_arg,
    _rotary_class,
    _shaw_blocks,
    _width_rotary,
    _window_table,
    _xl_names,
)
from ..generic import _shipped_spec
from .base import Seen, Trait, add_trait, register


def _left_out(seen: Seen) -> str | None:
    """Why forward's ``position_embeddings`` are not passed: DETR-style embeddings added to the inputs, rotary tables
    across the whole width, or ignored with this config."""
    if "position_embeddings" not in seen.signature:
        return None
    if _rotary_class(seen.module) is None and _positions_optional(seen.cls):
        return "detr"
    if _width_rotary(seen.cls):
        return "width"
    if ((_xl_names(seen.module) or ("",) * 4)[3] != "position_embeddings"
            and seen.spec is not None and seen.spec.rotary is None
            and not _heads_as_positions(seen.cls) and _distances_arg(seen.cls) != "position_embeddings"):
        return "ignored"
    return None


_LEFT_OUT = {
    "detr": "forward takes optional position_embeddings and its module has no rotary class (DETR-style embeddings "
            "added to the inputs): audited with none passed, so what they add is not tested",
    "width": "forward takes optional rotary tables that turn q and k across the whole model width before the heads "
             "are split (each head its own slice of its model's 2-D table): audited with none passed, as its model "
             "calls it for cross-attention, so its self-attention's rotary is not tested",
    "ignored": "forward takes position_embeddings and ignores them with this config (audited without positions)",
}


@register("positions left out", _left_out, examples=(
    "detr.DetrSelfAttention", "efficientloftr.EfficientLoFTRAttention", "zamba2.Zamba2Attention"))
def _left_out_notes(seen: Seen, why: str) -> list[str]:
    return [_LEFT_OUT[why]]


def _rotary_qkv(seen: Seen) -> bool:
    return tuple(list(seen.signature)[1:4]) in _SEPARATE and "position_embeddings" in seen.signature and (
        seen.signature["position_embeddings"].default is inspect.Parameter.empty)


@register("rotary (query, key, value)", _rotary_qkv, examples=("sam2_video.Sam2VideoRoPEAttention",))
def _rotary_qkv_notes(seen: Seen, found: bool) -> list[str]:
    return ["a (query, key, value) class with rotary tables: audited as its model's self-attention (query = key = "
            "value, the keys turned at the queries' positions), its 2-D axial tables made from the audit's grid "
            "positions; a cross-attention use of it (keys of another width or grid, keys left unturned) is not tested"]


def _table_arg(seen: Seen) -> str | None:
    arg = _rotary_arg(seen.cls)
    return None if arg in (None, "position_embeddings") else arg


@register("rotary table of another name", _table_arg, examples=("llama4.Llama4VisionAttention",))
def _table_arg_notes(seen: Seen, arg: str) -> list[str]:
    kind = "complex turns exp(i p theta)" if _complex_tables(seen.module) else "cos and sin"
    return [f"forward takes its rotary table as {arg} ({kind}): audited with the audit's own 1-D table (positions "
            f"0.., every token turned, shared by the batch), so its model's table (2-D patch positions, a class token "
            f"left unturned) is not tested"]


def _coordinate_tables(seen: Seen) -> Any:
    coordinates = _rotary_class(seen.module)
    rotary_forward: Any = getattr(coordinates, "forward", None)
    return coordinates if (
        _own_tables(seen.module) and coordinates is not None and _rotary_arg(seen.cls) == "position_embeddings"
        and len(params := inspect.signature(rotary_forward).parameters) >= 3
        and not {"position_ids", "seq_len"} & set(params)) else None


@register("rotary tables from coordinates", _coordinate_tables, examples=("esmfold2.EsmFold2AtomAttention",))
def _coordinate_notes(seen: Seen, coordinates: Any) -> list[str]:
    return [f"its model's rotary class ({coordinates.__name__}) makes its cos/sin from coordinates, not token "
            f"positions: audited with the audit's own 1-D tables (positions 0.., base {_PACKED_THETA:g}), so its "
            f"model's tables are not tested, the class's turn of q and k is"]


@register("default rotary parameters", lambda seen: getattr(getattr(seen.module, "config", None),
                                                             "audit_default_rope", False), examples=(
    "cohere_compass.CohereCompassAttention",))
def _default_rope_notes(seen: Seen, found: bool) -> list[str]:
    return [f"its config's default holds no rotary parameters for its layer types (rope_parameters = {{}}: its "
            f"model's rotary class raises a KeyError): built with default rotary parameters (base {_PACKED_THETA:g}) "
            f"for each type, audited with text positions (every M-RoPE axis equal), so its checkpoints' own "
            f"parameters (a NoPE layer type, M-RoPE image positions) are not tested"]


def _uses_rotary(seen: Seen) -> bool:
    """A class given its model's rotary tables (not the audit's own: packed encoders, image-grid rotaries)."""
    return "position_embeddings" in seen.signature and not _own_tables(seen.module)


def _rope_limits(seen: Seen, kind: str) -> list[str]:
    return [f"rope_type {kind!r} (" + ("frequencies recomputed from each call's length" if kind in (
        "dynamic", "longrope") else "frequencies of a kind the reference does not read") + ")"]


add_trait(Trait("rope type not modelled", lambda seen: _rope_type(seen.module) if _uses_rotary(seen) and (
    _rope_type(seen.module) not in _STATIC_ROPE) and _mrope(seen.module) not in (_AXIAL, _AXIAL_WH, _AXIAL_BLOCKS)
    else None, examples=("mlcd.MLCDAttention",), limits=_rope_limits))


def _first_heads(seen: Seen) -> str | None:
    first = re.search(r"\w+\[:, :(\d+)\], \w+\[:, :\1\] = apply_rotary", _forward_source(seen.module))
    return None if first is None else first.group(1)


add_trait(Trait("rotary on the first heads", _first_heads, examples=("qwen2_5_omni.DiTAttention",),
                limits=lambda seen, n: [f"rotary on the first {n} head(s) only, the others unturned"]))
add_trait(Trait("M-RoPE sections of another layout", lambda seen: _uses_rotary(seen) and "mrope_section" in (
    _rope_params(seen.module)) and _mrope(seen.module) is None, examples=(
    "qwen3_vl.Qwen3VLTextAttention",), limits=lambda seen, found: [
        "M-RoPE sections of another layout than consecutive blocks (Qwen3-VL's interleaved): audited with text "
        "positions only (1-D rotary)"]))


@register("heads as positions", lambda seen: _heads_as_positions(seen.cls), examples=(
    "xcodec2.Xcodec2Attention", "neucodec.NeuCodecAttention"))
def _heads_notes(seen: Seen, found: bool) -> list[str]:
    return ["its model passes the head index as the rotary position (position_ids = arange(num_heads), cos/sin "
            "unsqueezed at dim 2): each head is turned by one angle at every position, the turn cancels in q.k, and "
            "the attention is position-free"]


@register("decomposed relative positions", lambda seen: _decomposed(seen.module), examples=("sam.SamVisionAttention",),
          own=lambda seen, found: ("rel_pos_h", "rel_pos_w"))
def _decomposed_notes(seen: Seen, found: Any) -> list[str]:
    return ["decomposed relative positions on the audit's image of one row of t patches: the width table is tested at "
            "every distance, the height table only at distance 0 (a term constant along each query's row, which the "
            "softmax cancels)"]


@register("relative keys", lambda seen: _relative_keys(seen.module, ""), examples=(
    "wav2vec2_conformer.Wav2Vec2ConformerSelfAttention", "bros.BrosSelfAttention"),
    reads=lambda seen, relative: ("distance_embedding", "rel_pos_emb", relative.proj or ""),
    own=lambda seen, relative: (relative.query_bias or "", relative.content_bias or "", "emb_rel_k", "emb_rel_v"))
def _relative_notes(seen: Seen, relative: Any) -> list[str]:
    if not _espnet_shift(seen.module):
        return []
    return ["Transformer-XL relative terms on the audit's own table (seeded rows for distances t-1 .. 1-t, passed as "
            "pos_emb): its encoder's sinusoidal table is not tested"]


@register("Shaw block-local relative keys", lambda seen: _shaw_blocks(seen.module), examples=(
    "granite_speech.GraniteSpeechConformerAttention",))
def _shaw_notes(seen: Seen, found: bool) -> list[str]:
    notes = [f"block-local attention built with blocks of {seen.module.context_size} tokens (its models' 200 or "
             f"128), so that the audit's sequences span several blocks; Shaw's relative keys on the distances its "
             f"encoder computes (clamp(i - j, -c, c) + the table's middle row)"]
    if "attention_mask" in seen.signature:
        notes.append("forward takes only a key padding mask (b, s), reshaped into its blocks, and no mask of the "
                     "audit's (b, 1, t, s) form: audited without masks, so its padding is not tested (the padding of "
                     "the last block it adds itself is)")
    return notes


@register("gated relative position bias", lambda seen: _gated_bias(seen.module, ""), examples=(
    "wavlm.WavLMAttention",), reads=lambda seen, found: ("gru_rel_pos_linear", "rel_attn_embed"),
    own=lambda seen, found: ("gru_rel_pos_const",))
def _gated_bias_notes(seen: Seen, found: Any) -> list[str]:
    return ["its gated relative position bias as the first layer computes it (rel_attn_embed); its model's later "
            "layers are passed the first layer's bias (position_bias), which the audit does not pass"]


@register("added biases", lambda seen: _added_biases(seen.core), examples=(
    "layoutlmv2.LayoutLMv2SelfAttention", "mpnet.MPNetSelfAttention"))
def _added_notes(seen: Seen, names: list[str]) -> list[str]:
    shipped = _shipped_spec(seen.module, False)
    if shipped is not None and shipped.alibi is not None:  # MPT's shipped spec passes its position_bias: its ALiBi
        return []
    return [f"forward adds {name} to its logits, a bias its model computes outside the class: audited with zeros "
            f"passed, so what it adds is not tested" for name in names]


@register("layout stream", lambda seen: _layout_arg(seen.core) or _layout_arg(seen.module), examples=(
    "lilt.LiltSelfAttention",), reads=lambda seen, found: ("layout_query", "layout_key", "layout_value") if (
        _layout_arg(seen.module) is not None) else ())
def _layout_notes(seen: Seen, found: str) -> list[str]:
    arg = _layout_arg(seen.core)  # (the notes read the core, the reads the class itself: a block reads its child)
    if arg is None:
        return []
    return [f"LiLT's layout stream: its logits ql . kl / sqrt(d // r) (layout_query and layout_key of its model's "
            f"{arg}) added to the text logits are audited over the audit's own seeded layout inputs, the same for "
            f"every sequence; the stream's own output (its context over layout_value, the class's second output, and "
            f"its block's layout_output) is not tested"]


@register("pair table", lambda seen: _pair_arg(seen.core), examples=("bros.BrosSelfAttention",))
def _pair_notes(seen: Seen, arg: str) -> list[str]:
    return [f"forward adds q_i . R[i, j] to its logits before scaling them, R its model's {arg} (t, t, b, d): "
            f"audited with the audit's own seeded table, the same for every sequence of the batch, so its model's box "
            f"embeddings are not tested"]


add_trait(Trait("disentangled attention", lambda seen: _disentangled(seen.module, ""), examples=(
    "deberta_v2.DisentangledSelfAttention",), reads=lambda seen, found: (
        "pos_key_proj", "pos_query_proj", "pos_proj", "pos_q_proj")))


@register("disentangled attention off", lambda seen: any(getattr(m, "relative_attention", None) is False and hasattr(
    m, "pos_att_type") for m in seen.module.modules()), examples=(), unmatched=(
    "the sweep builds DeBERTa with relative_attention=True (hf_build); a module a user builds from the default config "
    "has it off"))
def _disentangled_off_notes(seen: Seen, found: bool) -> list[str]:
    return ["DeBERTa's disentangled attention is off in its default config (relative_attention=False): audited as "
            "plain attention, so the content-to-position and position-to-content terms of the released checkpoints "
            "are not tested"]


add_trait(Trait("window relative bias table", lambda seen: _window_table(seen.module), examples=(
    "swin.SwinAttention", "clap.ClapAudioSelfAttention"), reads=lambda seen, found: ("continuous_position_bias_mlp",)))
