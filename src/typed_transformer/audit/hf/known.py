"""True causes already known in Hugging Face classes (an overflowing mask, a swapped rotate_half...): a table of rows,
each a cause found from the class's own source, with the classes it was written for (a test fails when a row no longer
matches one of them)."""

import dataclasses
import re
from collections.abc import Callable

from torch import nn

from .facts import _core_of, _forward_source, _local_blocks, _modeling, _rotate_source, _source


@dataclasses.dataclass(frozen=True)
class KnownCause:
    """One true behaviour of some classes that makes them compute something else than the reference: how it is
    found (``found``, from the class's source), what it is (``cause``, the sentence a FAIL of such a class gets) and
    the classes it was found in (``examples``, ``"model.ClassName"`` of ``transformers.models``)."""

    name: str
    found: Callable[[nn.Module], bool]
    cause: str
    examples: tuple[str, ...]


def _attention_source(module: nn.Module) -> str:
    """The source of the class's attention: its forward, ``_attn`` and its module's ``eager_attention_forward``,
    for each class of transformers among its submodules."""
    return "".join(_source(f) for c in {type(m) for m in module.modules()} for f in (
        getattr(_modeling(c), "eager_attention_forward", None), getattr(c, "_attn", None), c.forward)
        if c.__module__.startswith("transformers.models."))


def _unapplied_mask(module: nn.Module) -> bool:
    eager = _source(getattr(_modeling(type(module)), "eager_attention_forward", None))
    body = eager.split(")", 1)[-1].split(":", 1)[-1] if eager else ""
    return bool(eager) and "attention_mask" not in re.sub(r'""".*?"""|#[^\n]*', "", body, flags=re.S) and (
        "eager_attention_forward" in _source(type(module).forward))


#: every known cause, in the order a class's causes list them
KNOWN_CAUSES = (
    KnownCause("rotate_half the other way round", lambda m: "cat((x2,-x1)" in re.sub(r"\s", "", _rotate_source(m)),
               "its rotate_half returns (x2, -x1), not (-x2, x1): every pair is turned by -p*theta, RoPE the other way "
               "round (relative positions enter with the opposite sign); with the sine negated it matches the "
               "reference", ("nanochat.NanoChatAttention",)),
    KnownCause("causal fill, then the mask added", lambda m: re.search(
        r"mask_value = torch\.finfo[\s\S]*torch\.where\(causal_mask, attn_weights[^\n]*mask_value\)"
        r"[\s\S]{0,400}?attn_weights = attn_weights \+ \w+", _attention_source(m)) is not None,
        "its attention fills the logits its own causal mask excludes with the dtype's minimum and then adds the "
        "attention mask: a query row whose keys are all masked averages the values of the keys left finite (the "
        "masked earlier keys, the unmasked later ones; min + min overflows to -inf) instead of what a fully masked row "
        "gives; rows with an allowed key are exact", ("gpt_neo.GPTNeoSelfAttention", "imagegpt.ImageGPTAttention")),
    KnownCause("the mask added twice", lambda m: re.search(
        r"\) \+ attention_mask\.unsqueeze\(1\)\.unsqueeze\(0\)\s*\n\s*attention_scores = attention_scores \+ "
        r"attention_mask\.unsqueeze\(1\)\.unsqueeze\(0\)", _attention_source(m)) is not None,
        "it adds its attention mask twice (on the view of the scores, then again): every masked logit gets twice the "
        "mask's value; with the dtype's minimum as the mask value that overflows to -inf, and a query row whose keys "
        "are all masked gives NaN instead of what one mask gives (its model's -100 window masks become -200); rows "
        "with an allowed key are exact", ("swin2sr.Swin2SRSelfAttention",)),
    KnownCause("masked keys filled with -inf", lambda m: re.search(
        r"masked_fill_?\((~\s*\w*mask\w*|\w*mask\w*\.logical_not\(\)), float\(\"-inf\"\)\)",
        _forward_source(m)) is not None,
        "it fills the logits of masked keys with -inf (masked_fill(..., float('-inf'))): a query row whose keys are "
        "all masked gives NaN; rows with an allowed key are exact",
        ("nemotron_asr_streaming.NemotronAsrStreamingEncoderAttention",)),
    KnownCause("GPT-1's -1e4 causal fill", lambda m: re.search(
        r"(\w+) = \1 \* (\w+) \+ -1e4 \* \(1 - \2\)[\s\S]{0,200}?\1 = \1 \+ attention_mask",
        _attention_source(m)) is not None,
        "its attention sets the logits its own causal mask excludes to -1e4 (GPT-1's w * b - 1e4 (1 - b)) and then "
        "adds the attention mask: a query row whose earlier keys are all masked averages the values of the later "
        "keys, and a logit below -1e4 loses to a later key (large logits)", ("openai.Attention",)),
    KnownCause("LongT5's -1e10 over a local frame", lambda m: _local_blocks(_core_of(m)) is not None and (
        "torch.where(mask > 0, 0.0, -1e10)" in _attention_source(m)),
        "LongT5's local attention adds -1e10 to the logits of masked keys, over each query block's frame of 3 blocks "
        "of keys (the zero padding past the sequence's ends included): a query row whose keys are all masked weighs "
        "every value of its frame (in float32, where -1e10 swamps the logits, their mean, the padding's zeros and the "
        "keys beyond the radius counted) instead of what a fully masked row gives; rows with an allowed key are exact",
        ("longt5.LongT5LocalAttention", "longt5.LongT5LayerLocalSelfAttention")),
    KnownCause("the mask never applied", _unapplied_mask,
               "its modeling module's eager_attention_forward takes attention_mask and never applies it: under eager "
               "attention every mask (padding, causal) is ignored", ("vjepa2.VJEPA2PoolerSelfAttention",)),
)


def hf_causes(module: nn.Module) -> list[str]:
    """Known causes of a class computing something else than the reference (each FAIL of such a class is a true
    behaviour of it, and this names why): the :data:`KNOWN_CAUSES` it matches."""
    return [row.cause for row in KNOWN_CAUSES if row.found(module)]
