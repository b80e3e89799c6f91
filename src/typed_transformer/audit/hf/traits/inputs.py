"""Traits of a class's inputs: separate or projected keys and values, memories, arguments its model fills in."""

import re
from typing import Any

from ..facts import (
    _block_input_norms,
    _input_norms,
    _keys_with_input,
    _layout_arg,
    _needed_positions,
    _nullable,
    _pair_arg,
    _same_shape,
    _source,
)
from ..generic import _memory_arg
from ..layout import content_layout, content_zero_args, projected_layout
from .base import Seen, register


@register("keys and values viewed with the queries' shape", lambda seen: _same_shape(seen.cls) or _same_shape(
    type(seen.core)), examples=("mobilebert.MobileBertSelfAttention",))
def _same_shape_notes(seen: Seen, found: bool) -> list[str]:
    residual = ", and as layer_input, its block's residual," if "layer_input" in seen.signature else ""
    return [f"a (query_tensor, key_tensor, value_tensor) class that views its keys and values with the queries' "
            f"shape: audited as self-attention, the input passed as all three{residual} as its model passes its "
            f"hidden states without bottlenecks; with them (outside the class) the model passes the shared "
            f"bottleneck's output as query and key and the hidden states as value, a use not tested"]


@register("positions required, zeros given", lambda seen: _needed_positions(seen.cls), examples=(
    "table_transformer.TableTransformerAttention", "mask2former.Mask2FormerAttention"))
def _needed_notes(seen: Seen, needed: str) -> list[str]:
    return [f"forward's {needed} defaults to None, yet without them its value projection reads a name only they set "
            f"(UnboundLocalError; its model always passes them): audited with zero {needed}, so what they add is not "
            f"tested"]


@register("content and position projections", lambda seen: content_layout(seen.module), examples=(
    "conditional_detr.ConditionalDetrDecoderSelfAttention", "dab_detr.DabDetrDecoderLayerCrossAttention"))
def _content_notes(seen: Seen, found: Any) -> list[str]:
    """What the audit of a DETR decoder's content and position projections (:func:`content_layout`) leaves
    untested: the positions (zeros), the per-head half they concatenate, the optional ones left None, the position
    projections the layer does not have."""
    cls = seen.cls
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
    left = [n for n in re.findall(r"self\.\w*pos\w*proj\((\w+)\)", source) if n in seen.signature and n not in zeros]
    notes += [f"forward's optional {name} (its model passes them to the first decoder layer only) left None, as "
              f"for the other layers: the first layer's added positions are not tested" for name in dict.fromkeys(left)]
    notes += [f"{name} is None in this layer (is_first=False and keep_query_pos=False, as in its model's layers "
              f"after the first): the query positions the first layer adds are not tested"
              for name in re.findall(r"self\.(\w*pos\w*proj) = None", _source(cls))
              if getattr(seen.module, name, None) is None]
    return notes


@register("keys and values already projected", lambda seen: projected_layout(seen.module), examples=(
    "dab_detr.DabDetrAttention",))
def _projected_notes(seen: Seen, found: Any) -> list[str]:
    return ["takes its queries, keys and values already projected (its decoder layer's content and position "
            "projections are outside the class, audited with the layer classes): audited with identity projections "
            "over separate query, key and value inputs"]


@register("a pre-norm inside the class", lambda seen: _input_norms(seen.core) + _block_input_norms(seen.module),
          examples=("perceiver.PerceiverSelfAttention", "granite_speech.GraniteSpeechConformerAttention"))
def _input_norm_notes(seen: Seen, names: list[str]) -> list[str]:
    return [f"normalises its input with {name} before its projections (a pre-norm inside the class): audited with it "
            f"bypassed, as a block's Add & Norm is, so the norm is not tested" for name in names]


def _left_none(seen: Seen) -> list[str]:
    pair_arg, layout_arg = _pair_arg(seen.core), _layout_arg(seen.core)
    return [name for name in _nullable(seen.cls) if name not in (pair_arg, layout_arg)]


@register("required arguments given None", _left_none, examples=("luke.LukeSelfAttention", "ibert.IBertSelfAttention"))
def _nullable_notes(seen: Seen, names: list[str]) -> list[str]:
    return [f"forward requires {name} and takes None for it (LUKE's model passes None without entities, I-BERT's "
            f"without quant_mode): audited with None, so what the class computes with a value is not tested"
            for name in names]


def _over_memory_and_input(seen: Seen) -> bool:
    memory_arg = _memory_arg(seen.module, seen.core, seen.signature, None)
    return seen.layout is not None and _keys_with_input(seen.core, seen.layout, memory_arg)


@register("keys over the memory and the input", _over_memory_and_input, examples=(
    "idefics2.Idefics2PerceiverAttention", "muse_glimmer_assistant.MuseGlimmerAssistantAttention"))
def _memory_and_input_notes(seen: Seen, found: bool) -> list[str]:
    notes = []
    window = getattr(seen.core, "sliding_window", None)
    if window is not None:
        notes.append(f"keys over its memory and its input: the sliding window of {window} keys (its model's "
                     f"bidirectional sliding-window mask, over absolute positions) is not applied by the audit and is "
                     f"not tested")
    if any(n in seen.signature for n in ("cache", "past_key_values", "past_key_value")):
        notes.append("keys over its memory and its input: audited in one call without a cache, so its cache path is "
                     "not tested")
    return notes
