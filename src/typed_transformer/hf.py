"""Interop with Hugging Face ``transformers``: load GPT-2 weights into :class:`~typed_transformer.GPT`.

GPT-2 stores its projections as ``Conv1D`` layers whose weight is ``(in, out)``, the transpose of
``nn.Linear``'s ``(out, in)``; its MLP uses the tanh GELU (``gelu_new``); positions are learned; the output
head is tied to the token embedding. The mapping (``h.{i}`` are the blocks)::

    wte -> tok_emb                 wpe -> pos                       ln_f -> ln_f
    h.{i}.ln_1 -> blocks.{i}.ln_1  h.{i}.attn.c_attn -> .attn.in_proj (transposed; q, k, v order as ours)
    h.{i}.ln_2 -> blocks.{i}.ln_2  h.{i}.attn.c_proj -> .attn.out_proj (transposed)
                                   h.{i}.mlp.c_fc / c_proj -> .mlp.linear1 / linear2 (transposed)

``transformers`` itself is not needed: a plain state dict (with ``n_head`` given) works too.

``GPT.from_hf_gpt2`` is this module's :func:`gpt_from_hf_gpt2`, attached to the class here, so that the
dependency points one way (``hf`` imports ``gpt``, never the reverse).
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .gpt import GPT, GPTConfig

__all__ = ["gpt_from_hf_gpt2"]

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _hf_settings(model: Any) -> dict[str, Any]:
    config = model.config
    activation = getattr(config, "activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        raise ValueError(f"from_hf_gpt2: activation_function {activation!r} is not supported "
                         "(gelu_new, gelu_pytorch_tanh or gelu)")
    for flag, wanted in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
        if getattr(config, flag, wanted) != wanted:
            raise ValueError(f"from_hf_gpt2: {flag}={not wanted} is not supported")
    return {"n_head": config.n_head, "layer_norm_eps": config.layer_norm_epsilon,
            "activation": "gelu" if activation == "gelu" else "gelu_tanh"}


def gpt_from_hf_gpt2(model_or_state_dict: Any, *, n_head: int | None = None) -> GPT:
    """Build a :class:`GPT` with the weights of a Hugging Face ``GPT2LMHeadModel`` / ``GPT2Model`` or of
    their state dict (then ``n_head`` is required: it cannot be read from the weights).

    Raises:
        ValueError: a state dict without ``n_head``, weights that are not GPT-2's or do not fit, or a model
            configuration this GPT cannot express (another activation, unscaled attention).
    """
    settings: dict[str, Any] = {"layer_norm_eps": 1e-5, "activation": "gelu_tanh"}
    if isinstance(model_or_state_dict, Mapping):
        state: Mapping[str, Tensor] = model_or_state_dict
    else:
        settings.update(_hf_settings(model_or_state_dict))
        state = model_or_state_dict.state_dict()
    if n_head is not None:
        settings["n_head"] = n_head
    if "n_head" not in settings:
        raise ValueError("from_hf_gpt2: a state dict does not say how many heads there are; pass n_head=")
    weights = {key.removeprefix("transformer."): value for key, value in state.items()}
    try:
        wte, wpe = weights["wte.weight"], weights["wpe.weight"]
    except KeyError:
        raise ValueError("from_hf_gpt2: not a GPT-2 state dict (no wte.weight / wpe.weight)") from None
    n_layer = len({key.split(".")[1] for key in weights if key.startswith("h.")})
    config = GPTConfig(vocab_size=wte.shape[0], block_size=wpe.shape[0], n_layer=n_layer, n_embd=wte.shape[1],
                       dropout=0.0, bias=True, positional="learned", tie_weights=True, **settings)
    ours: dict[str, Tensor] = {"tok_emb.weight": wte, "pos.weight": wpe,
                               "ln_f.weight": weights["ln_f.weight"], "ln_f.bias": weights["ln_f.bias"]}
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_attn": "attn.in_proj", "attn.c_proj": "attn.out_proj",
             "mlp.c_fc": "mlp.linear1", "mlp.c_proj": "mlp.linear2"}
    for i in range(n_layer):
        for theirs, mine in names.items():
            for kind in ("weight", "bias"):
                value = weights[f"h.{i}.{theirs}.{kind}"]
                if f"{theirs}.{kind}" in _CONV1D:
                    value = value.t()  # Conv1D (in, out) -> Linear (out, in)
                ours[f"blocks.{i}.{mine}.{kind}"] = value
    model = GPT(config)
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(ours, strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise ValueError(f"from_hf_gpt2: weights do not fit (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(wte.dtype)


# GPT.from_hf_gpt2, declared on the class, is this function (a static alias: GPT.from_hf_gpt2(model)).
GPT.from_hf_gpt2 = staticmethod(gpt_from_hf_gpt2)
