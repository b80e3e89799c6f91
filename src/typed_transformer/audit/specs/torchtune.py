"""The spec of torchtune's ``MultiHeadAttention`` and its options."""

import dataclasses
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..core.conventions import Conventions
from ..modules.positions import Rotary
from ..modules.spec import ModuleSpec, Options
from .shared import _refuse

# ----------------------------------------------------------------------------------------------------
# torchtune and x-transformers
# ----------------------------------------------------------------------------------------------------


def _torchtune_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                       is_causal: bool) -> Tensor:
    """A ``(b, t, s)`` keep-mask, or none and the module's own (top-left SDPA) causal flag."""
    if keep is not None:
        out: Tensor = m(x, x, mask=keep[:, 0].expand(x.shape[0], x.shape[1], x.shape[1]))
        return out
    m.is_causal = is_causal  # a copy
    out = m(x, x)
    return out


def _build_torchtune(cls: type, config: dict[str, Any]) -> nn.Module:
    """``config``: ``embed_dim``, ``num_heads`` and optionally ``num_kv_heads``, ``head_dim``, ``bias`` (of the
    ``nn.Linear`` projections, default False) and ``rotary_base`` (torchtune's ``RotaryPositionalEmbeddings``)."""
    config = dict(config)
    embed, heads = config["embed_dim"], config["num_heads"]
    kv_heads = config.setdefault("num_kv_heads", heads)
    head_dim = config.setdefault("head_dim", embed // heads)
    bias = config.pop("bias", False)
    base = config.pop("rotary_base", None)
    if base is not None:
        from torchtune.modules import RotaryPositionalEmbeddings

        config["pos_embeddings"] = RotaryPositionalEmbeddings(head_dim, base=base)
    module: nn.Module = cls(**config, q_proj=nn.Linear(embed, heads * head_dim, bias=bias),
                            k_proj=nn.Linear(embed, kv_heads * head_dim, bias=bias),
                            v_proj=nn.Linear(embed, kv_heads * head_dim, bias=bias),
                            output_proj=nn.Linear(heads * head_dim, embed, bias=bias))
    return module


TORCHTUNE = ModuleSpec(
    "torchtune", _torchtune_forward,
    Conventions(self_attention=True, causal_alignment="top-left", mask_with_causal=False, per_head_masks=False),
    out="output_proj", num_kv_heads="num_kv_heads", head_dim="head_dim", build=_build_torchtune,
    rotary=Rotary("pos_embeddings.base", "interleaved", when="pos_embeddings"),
    module_type="torchtune.modules.attention.MultiHeadAttention")


# ----------------------------------------------------------------------------------------------------
# torchtune
# ----------------------------------------------------------------------------------------------------


def torchtune_decode(m: Any, x: Tensor) -> Tensor:
    """Token by token through torchtune's own KV cache (``setup_cache``): each token's mask covers the cache's
    filled positions (the cache is ``t`` long and zero beyond them)."""
    b, t = x.shape[0], x.shape[1]
    m.kv_cache = None  # a copy: a fresh cache of this batch and dtype
    m.setup_cache(b, x.dtype, t)
    outs = []
    for i in range(t):
        token = x[:, i:i + 1]
        mask = (torch.arange(t) <= i)[None, None].expand(b, 1, t)
        outs.append(m(token, token, mask=mask, input_pos=torch.full((b, 1), i)))
    return torch.cat(outs, dim=1)


def _torchtune_frequencies(m: Any) -> tuple[Tensor, float]:
    theta: Tensor = m.pos_embeddings.theta
    return theta.detach().double(), 1.0


TORCHTUNE_OPTIONS = Options(
    "torchtune.modules.attention.MultiHeadAttention",
    modelled=("embed_dim", "num_heads", "num_kv_heads", "head_dim", "q_proj", "k_proj", "v_proj", "output_proj",
              "pos_embeddings", "q_norm", "k_norm", "kv_cache", "max_seq_len", "is_causal"),
    refused=("q_proj", "k_proj", "v_proj", "output_proj", "pos_embeddings"), inert=("attn_dropout",))
#: the rotary classes the torchtune spec models (``pos_embeddings``): each pairs neighbours or halves as named
TORCHTUNE_ROTARIES = {"RotaryPositionalEmbeddings": "interleaved", "Llama3ScaledRoPE": "interleaved",
                      "Phi3RotaryPositionalEmbeddings": "half", "Qwen2RotaryPositionalEmbeddings": "half"}


def _torchtune_unmodelled(module: Any) -> list[str]:
    """Projections that are not a plain ``nn.Linear`` (LoRA's adapters, quantized layers) and a rotary class other
    than the modelled ones (the 2-D vision rotary among them)."""
    unmodelled = [f"{name}={type(getattr(module, name)).__name__} (only a plain nn.Linear is read)"
                  for name in ("q_proj", "k_proj", "v_proj", "output_proj")
                  if type(getattr(module, name, None)) is not nn.Linear]
    rope = getattr(module, "pos_embeddings", None)
    if rope is not None and type(rope).__name__ not in TORCHTUNE_ROTARIES:
        unmodelled.append(f"pos_embeddings={type(rope).__name__} (modelled: {', '.join(TORCHTUNE_ROTARIES)})")
    return unmodelled


def torchtune_spec(module: Any) -> ModuleSpec:
    """torchtune's ``MultiHeadAttention`` as its builders make it: grouped key/value heads, biases, q/k norms
    (applied after the rotary embedding, torchtune's order; its ``RMSNorm`` keeps its weight as ``scale``), the
    rotary classes (``RotaryPositionalEmbeddings`` and ``Llama3ScaledRoPE`` pair neighbours, Phi-3's and Qwen2's
    halves; the frequencies read from their ``theta``; no sequence past their cache, ``max_seq_len``),
    token-by-token decoding with its KV cache. Refused: any other rotary class (the 2-D
    ``VisionRotaryPositionalEmbeddings`` among them) and projections that are not a plain ``nn.Linear`` (LoRA)."""
    from .torchtune import TORCHTUNE

    _refuse(module, "torchtune", _torchtune_unmodelled(module))
    rope = getattr(module, "pos_embeddings", None)
    fields: dict[str, Any] = {"decode": torchtune_decode}
    if rope is not None:  # its cache holds max_seq_len positions; the module raises past them
        fields["max_length"] = "pos_embeddings.max_seq_len"
        style: Literal["half", "interleaved"] = "half" if TORCHTUNE_ROTARIES[type(rope).__name__] == "half" \
            else "interleaved"
        fields["rotary"] = Rotary("pos_embeddings.base", style, frequencies=_torchtune_frequencies)
    if getattr(module, "q_norm", None) is not None:
        fields.update(q_norm="q_norm", k_norm="k_norm", norms_after_rotary=True)
    return dataclasses.replace(TORCHTUNE, **fields)
