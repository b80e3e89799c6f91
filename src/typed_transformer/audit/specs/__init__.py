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

from ..modules.spec import SHIPPED_SPECS, ModuleSpec
from .hf import (
    BART,
    BERT,
    BLOOM,
    FALCON,
    FALCON_ALIBI,
    GPT2,
    GPT2_CROSS,
    GPT_NEOX,
    LLAMA,
    MISTRAL,
    MPT,
    OLMO2,
    PHI,
    QWEN2,
    QWEN3,
    T5,
    WHISPER,
)
from .pytorch import TORCH_MHA
from .torchtune import TORCHTUNE
from .typed_transformer import TYPED_TRANSFORMER
from .x_transformers import X_TRANSFORMERS

#: The shipped specs by name.
SPECS: dict[str, ModuleSpec] = {spec.name: spec for spec in (
    TORCH_MHA, TYPED_TRANSFORMER, GPT2, GPT2_CROSS, BERT, BART, WHISPER, T5, BLOOM, MPT, LLAMA, GPT_NEOX, FALCON,
    FALCON_ALIBI, PHI, MISTRAL, QWEN2, QWEN3, OLMO2, TORCHTUNE, X_TRANSFORMERS)}
SHIPPED_SPECS.update(SPECS)  # audit_module(..., spec="name") finds them there (modules.spec never imports this package)

__all__ = ["BART", "BERT", "BLOOM", "FALCON", "FALCON_ALIBI", "GPT2", "GPT2_CROSS", "GPT_NEOX", "LLAMA", "MISTRAL",
           "MPT", "OLMO2", "PHI", "QWEN2", "QWEN3", "SPECS", "T5", "TORCHTUNE", "TORCH_MHA", "TYPED_TRANSFORMER",
           "WHISPER", "X_TRANSFORMERS"]
