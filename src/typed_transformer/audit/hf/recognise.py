"""How a Hugging Face attention class is recognised: its generic reading (:mod:`.generic`), then what each of its
traits changes (:mod:`.traits`), in trait order."""

from torch import nn

from ..modules.spec import REBUILDS, ModuleSpec
from .build import hf_build
from .generic import generic_spec
from .traits import changed_spec


def hf_spec(cls_or_module: type | nn.Module, *, cross: bool | None = None) -> ModuleSpec:
    """A :class:`ModuleSpec` for a Hugging Face attention class of the common shape, read from a built instance:
    ``q_proj/k_proj/v_proj/o_proj`` (or a fused ``qkv_proj``), heads from the config, ``head_dim`` and ``scaling``
    from the module, q/k norms, the rotary class of its modeling module (its pairing, partial rotary factor and the
    config's base; M-RoPE with text positions), the sliding window (folded into the mask, as the model's mask
    builder does) and, where ``forward`` takes a cache, token-by-token decoding. A class whose forward takes
    ``(query, key, value)`` is audited as attention over separate key and value inputs; one that takes
    ``encoder_hidden_states`` / ``cross_attention_states`` / ``key_value_states`` as cross-attention over one
    memory tensor (when that argument is required, the class is a cross-attention one, or ``cross=True``: BART's
    attention is both, self-attention by default).

    The classic layouts too (:mod:`.layout`): ``query/key/value`` (BERT), ``q/k/v/o`` with T5's relative
    position bias, ``out_proj`` (BART, CLIP, OPT, GPT-J), ``Conv1D`` weights (GPT-2), ``Wqkv`` (ModernBERT),
    CodeGen's grouped fused projection, and attention blocks (BERT's ``self`` + ``output.dense``; their residual
    and Add & Norm bypassed). A class with a shipped spec the generic reading cannot replace (a fused projection
    laid out per head or per group, ALiBi: BLOOM's, MPT's, Falcon's with ``alibi=True``) gets that spec: the one
    whose options fit the module (Falcon's ``falcon`` or ``falcon_alibi`` as its config's ``alibi`` says).

    Raises:
        AuditUsageError: the class is not of that shape (the message says what is missing).
    """
    module = hf_build(cls_or_module, cross=bool(cross)) if isinstance(cls_or_module, type) else cls_or_module
    spec, layout = generic_spec(module, cross)
    if layout is None:  # a shipped, gated or mixture spec: no trait changes it
        return spec
    spec = changed_spec(module, spec, layout)
    REBUILDS[spec] = "from typed_transformer.audit import hf_spec\nspec = hf_spec(module)"  # for repros
    return spec
