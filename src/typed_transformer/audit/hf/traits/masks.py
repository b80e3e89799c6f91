"""Traits of masks: masks the class takes only in a form of its own, windows, local blocks and chunks."""

import re

from ..facts import (
    _bias_as_mask,
    _body,
    _chunked_local,
    _head_padding_only,
    _key_mask_only,
    _local_blocks,
    _mask_none,
    _model_window,
    _padding_ones,
    _padding_only,
    _sliding_chunks,
)
from .base import Seen, register


def _mask_passed_as_none(seen: Seen) -> bool:
    body = _body(seen.cls.forward)
    return "attention_mask" in seen.signature and _mask_none(body) and not re.search(
        r"(?<![\w.])attention_mask\b(?!\s*=[^=])", body)


@register("mask not passed on", _mask_passed_as_none, examples=("llama4.Llama4VisionAttention",))
def _mask_none_notes(seen: Seen, found: bool) -> list[str]:
    return ["forward takes attention_mask and passes None to its attention function instead (its model passes none): "
            "audited without masks"]


def _window_of_model(seen: Seen) -> int | None:
    """The model's sliding window, for a class that decodes with a cache and has no window of its own."""
    window = _model_window(seen.module)
    return window if window is not None and seen.spec is not None and seen.spec.decode is not None else None


@register("a window only the model applies", _window_of_model, examples=("mistral.MistralAttention",))
def _model_window_notes(seen: Seen, window: int) -> list[str]:
    return [f"its model limits each query to a window of {window} keys (config.sliding_window, by its mask and its "
            f"sliding-window cache); the layer has no window of its own and is audited under a plain causal mask with "
            f"a full cache, so that window is not tested"]


@register("local blocks", lambda seen: _local_blocks(seen.core), examples=("longt5.LongT5LocalAttention",))
def _local_notes(seen: Seen, local: int) -> list[str]:
    return [f"LongT5's local attention built with local_radius {local - 1} (blocks of {local}; its config's default "
            f"127 would fit the audit's short sequences in one block), given its mask in its model's block form (each "
            f"query block's row of its 3-block frame, the keys beyond the radius masked by the model's "
            f"_mask_local_attention_mask); other radii are not tested"]


@register("sliding chunks", lambda seen: _sliding_chunks(seen.core) or _sliding_chunks(seen.module), examples=(
    "longformer.LongformerSelfAttention",), reads=lambda seen, found: ("query_global", "key_global", "value_global")
    if _sliding_chunks(seen.module) is not None else ())
def _sliding_notes(seen: Seen, found: int) -> list[str]:
    sliding = _sliding_chunks(seen.core)  # (the notes read the core, the reads the class itself)
    if sliding is None:
        return []
    return [f"Longformer's sliding-chunk attention built with attention_window {2 * sliding} (each query sees the "
            f"keys within {sliding}; its config's default 512 would cover the audit's sequences), called as its model "
            f"calls it: the input padded to a multiple of the window (the padding keys masked with the dtype's "
            f"minimum, their rows zeroed and dropped); its mask is a key padding mask (b, s) of its own values, so it "
            f"is audited without the audit's masks (their padding, and the (b, 1, t, s) masks it cannot take, are not "
            f"tested); no global tokens (is_global_attn=False), so the global attention and its query_global, "
            f"key_global, value_global are not tested; other windows are not tested"]


@register("local chunks", lambda seen: _chunked_local(seen.core), examples=("reformer.LocalSelfAttention",))
def _chunked_notes(seen: Seen, chunked: int) -> list[str]:
    core = seen.core
    return [f"Reformer's local attention: audited on sequences of one chunk ({chunked} tokens) at most, where it is "
            f"plain attention, so its chunks ({core.num_chunks_before} before, {core.num_chunks_after} after each "
            f"query chunk) and its model's padding to a multiple of the chunk are not tested; its mask is a key "
            f"padding mask (b, s) only, so it is audited without masks (their padding is not tested)"
            + ("" if core.is_decoder else "; built as an encoder (is_decoder=False), so its causal mask is not "
               "tested")]


@register("a pair bias as its mask", lambda seen: _bias_as_mask(seen.cls), examples=(
    "esmfold2.EsmFold2DiffusionAttention",))
def _bias_mask_notes(seen: Seen, found: bool) -> list[str]:
    return ["forward takes attention_bias, which it adds to its logits as its mask (its layer's per-head pair bias "
            "with the padding folded in): audited with the audit's masks passed as it, so a pair bias is tested only "
            "as an additive mask is"]


@register("a key mask of ones and zeros", lambda seen: _key_mask_only(seen.cls, seen.mask_arg), examples=(
    "evolla.EvollaSequenceCompressorAttention",))
def _key_mask_notes(seen: Seen, found: bool) -> list[str]:
    return [f"its {seen.mask_arg} is a key padding mask (b, s) of ones and zeros (the masked logits filled with -1e4), "
            f"which no mask of the audit's (b, 1, t, s) form reaches: audited without masks (ones passed), so its "
            f"masking is not tested"]


@register("a key padding mask (b, 1, s)", lambda seen: any(_padding_only(type(m), "attention_mask")
                                                           for m in seen.module.modules()), examples=(
    "fastspeech2_conformer.FastSpeech2ConformerAttention",))
def _padding_notes(seen: Seen, found: bool) -> list[str]:
    return ["forward takes only a key padding mask (b, 1, s) (0 = padding: its logits filled with the dtype's "
            "minimum, its weights zeroed after the softmax) and refuses the audit's (b, 1, t, s) masks: audited "
            "without masks, so its padding (and a fully padded row's zero output) is not tested"]


@register("a key padding mask per head", lambda seen: any(_head_padding_only(type(m), "attention_mask")
                                                          for m in seen.module.modules()), examples=(
    "prophetnet.ProphetNetAttention",))
def _head_padding_notes(seen: Seen, found: bool) -> list[str]:
    return ["forward takes only a key padding mask per head (b, h, 1, s), added to its logits, and refuses the "
            "audit's (b, 1, t, s) masks: audited without masks, so its padding is not tested; nor is its cache (no "
            "causal mask can reach it; its model uses it as the encoder's self-attention, without a cache, and the "
            "decoder's cross-attention)"]


@register("a key padding mask (b, s) of ones", lambda seen: _padding_ones(seen.cls, "attention_mask"), examples=(
    "wavlm.WavLMAttention",))
def _padding_ones_notes(seen: Seen, found: bool) -> list[str]:
    return ["forward takes only a key padding mask (b, s) of ones and zeros (key_padding_mask = "
            "attention_mask.ne(1)) and refuses the audit's (b, 1, t, s) masks: audited without masks, so its padding "
            "is not tested"]
