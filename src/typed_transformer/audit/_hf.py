"""Hugging Face decoder attention classes with no spec written: most share one shape (a config in the constructor,
``q_proj/k_proj/v_proj/o_proj``, ``position_embeddings`` from the model's rotary class, an additive mask). From
the class alone, :func:`hf_build` makes a tiny instance from its own config class and :func:`hf_spec` describes it
(projections, head counts, scale, the rotary class and its base, the KV cache); inference decides the rest."""

import importlib
import inspect
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ._core import AuditUsageError, Conventions
from ._modules import ModuleSpec, Rotary, additive_mask, with_causal

#: the sizes of the tiny config (set where the config has the field): 4 query heads on 2 key/value heads of 4
TINY: dict[str, Any] = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
                        "intermediate_size": 32, "num_hidden_layers": 1, "vocab_size": 64,
                        "max_position_embeddings": 64, "attention_dropout": 0.0, "attention_bias": False}

_HF = Conventions(self_attention=True, fully_masked="uniform")


def _modeling(cls: type) -> Any:
    return importlib.import_module(cls.__module__)


def hf_config_class(cls: type) -> type:
    """The config class of ``cls``'s model: the ``config_class`` of a pretrained model in its module (the text
    config of a composite one is taken at build time), or the constructor's annotation."""
    annotation = inspect.signature(cls).parameters.get("config")
    if (annotation is not None and isinstance(annotation.annotation, type)
            and annotation.annotation is not inspect.Parameter.empty):
        return annotation.annotation
    from transformers import PreTrainedModel

    for obj in vars(_modeling(cls)).values():
        config_class = getattr(obj, "config_class", None)
        if (isinstance(obj, type) and issubclass(obj, PreTrainedModel) and obj.__module__ == cls.__module__
                and isinstance(config_class, type)):
            return config_class
    raise AuditUsageError(f"{cls.__qualname__}: no config class found (no annotation, no pretrained model)")


def hf_build(cls: type, overrides: dict[str, Any] | None = None) -> nn.Module:
    """A tiny instance of ``cls`` from its own config class (:data:`TINY` sizes where the config has them, eager
    attention, no dropout)."""
    config_class = hf_config_class(cls)
    config = config_class()
    if hasattr(config, "get_text_config"):
        text = config.get_text_config()
        if type(text).__name__ != type(config).__name__ and _accepts(cls, text):
            config = text
    for key, value in {**TINY, **(overrides or {})}.items():
        if hasattr(config, key) or key in ("head_dim",):
            setattr(config, key, value)
    config._attn_implementation = "eager"
    params = inspect.signature(cls).parameters
    kwargs = {"layer_idx": 0} if "layer_idx" in params else {}
    module: nn.Module = cls(config, **kwargs)
    return module


def _accepts(cls: type, config: Any) -> bool:
    annotation = inspect.signature(cls).parameters.get("config")
    if annotation is None or annotation.annotation is inspect.Parameter.empty:
        return True
    return not isinstance(annotation.annotation, type) or isinstance(config, annotation.annotation)


def _rotary_class(module: nn.Module) -> type | None:
    """The rotary class of the modeling module of the class (or of the first base class that has one)."""
    for base in type(module).__mro__:
        if not base.__module__.startswith("transformers.") and base is not type(module):
            continue
        found = [obj for name, obj in vars(importlib.import_module(base.__module__)).items()
                 if isinstance(obj, type) and name.endswith("RotaryEmbedding") and issubclass(obj, nn.Module)]
        # the text model's rotary class (a vision one is named for vision)
        found.sort(key=lambda c: ("Vision" in c.__name__ or "Audio" in c.__name__, len(c.__name__)))
        if found:
            return found[0]
    return None


def _rotary_style(module: nn.Module) -> Literal["half", "interleaved"]:
    """``"interleaved"`` when the modeling module's ``rotate_half`` pairs even and odd features (Cohere's)."""
    rotate_half = getattr(importlib.import_module(type(module).__module__), "rotate_half", None)
    try:
        source = inspect.getsource(rotate_half) if rotate_half is not None else ""
    except (OSError, TypeError):
        source = ""
    return "interleaved" if "::2]" in source else "half"


def _rope_theta(module: nn.Module) -> float | None:
    config = getattr(module, "config", None)
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return None if theta is None else float(theta)


def hf_limits(module: nn.Module) -> list[str]:
    """What this class computes that the reference does not model (a FAIL of the checks it touches is then a
    limit of the audit, not a finding)."""
    config = getattr(module, "config", None)
    limits = []
    for name in ("q_norm", "k_norm", "q_layernorm", "k_layernorm"):
        if getattr(module, name, None) is not None:
            limits.append(f"{name} (a norm on queries or keys)")
    factor = getattr(config, "partial_rotary_factor", None)
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        factor = params.get("partial_rotary_factor", factor)
        if params.get("rope_type", "default") not in ("default", None):
            limits.append(f"rope_type {params['rope_type']!r}")
    if factor is not None and float(factor) < 1.0:
        limits.append(f"partial rotary (factor {factor})")
    if getattr(module, "sliding_window", None) or getattr(config, "sliding_window", None):
        limits.append("sliding window")
    for name in ("attn_logit_softcapping", "logit_softcapping", "query_pre_attn_scalar"):
        if getattr(config, name, None):
            limits.append(name)
    if getattr(module, "sinks", None) is not None:
        limits.append("attention sinks")
    if isinstance(params, dict) and "rope_theta" not in params:
        limits.append("rope parameters per layer type")
    read = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "rotary_emb", "q_norm", "k_norm", "q_layernorm",
            "k_layernorm"}
    for name, child in module.named_children():
        if name not in read and not isinstance(child, nn.Dropout | nn.Identity):
            limits.append(f"submodule {name!r} ({type(child).__name__}) the spec does not read")
    return limits


def hf_spec(cls_or_module: type | nn.Module) -> ModuleSpec:
    """A :class:`ModuleSpec` for a Hugging Face attention class of the common shape, read from a built instance:
    ``q_proj/k_proj/v_proj/o_proj``, heads from the config, ``head_dim`` and ``scaling`` from the module, the
    rotary class of its modeling module (half pairs, the config's base) and, where ``forward`` takes a cache,
    token-by-token decoding.

    Raises:
        AuditUsageError: the class is not of that shape (the message says what is missing).
    """
    module = hf_build(cls_or_module) if isinstance(cls_or_module, type) else cls_or_module
    cls = type(module)
    fused = isinstance(getattr(module, "qkv_proj", None), nn.Linear) and getattr(module, "q_proj", None) is None
    needed = ("qkv_proj", "o_proj") if fused else ("q_proj", "k_proj", "v_proj", "o_proj")
    missing = [name for name in needed if not isinstance(getattr(module, name, None), nn.Linear)]
    if missing:
        raise AuditUsageError(f"{cls.__qualname__}: not of the common shape (no {', '.join(missing)} linear layer)")
    params = inspect.signature(cls.forward).parameters
    takes_rotary = "position_embeddings" in params
    rotary_class = _rotary_class(module) if takes_rotary else None
    if takes_rotary and rotary_class is None:
        raise AuditUsageError(f"{cls.__qualname__}: forward takes position_embeddings but its module has no rotary "
                              f"embedding class")
    cache_arg = next((n for n in ("cache", "past_key_values", "past_key_value") if n in params), None)
    theta = _rope_theta(module)

    def rotary(m: Any, x: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        assert rotary_class is not None
        embedding = rotary_class(config=m.config)
        positions = torch.arange(offset, offset + x.shape[1])[None].expand(x.shape[0], -1)
        cos, sin = embedding(x, positions)
        return cos.to(x.dtype), sin.to(x.dtype)

    def call(m: Any, x: Tensor, mask: Tensor | None, offset: int, cache: Any = None) -> Tensor:
        kwargs: dict[str, Any] = {"attention_mask": mask}
        if takes_rotary:
            kwargs["position_embeddings"] = rotary(m, x, offset)
        if "position_ids" in params:
            kwargs["position_ids"] = torch.arange(offset, offset + x.shape[1])[None].expand(x.shape[0], -1)
        if cache is not None and cache_arg is not None:
            kwargs[cache_arg] = cache
        out = m(x, **kwargs)
        result: Tensor = out[0] if isinstance(out, tuple) else out
        return result

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        b, t = x.shape[0], x.shape[1]
        keep = with_causal(keep, is_causal, t, t)
        if keep is None:  # an explicit mask always: without one, some kernels decide causality themselves
            keep = torch.ones(1, 1, t, t, dtype=torch.bool)
        mask = additive_mask(keep.expand(b, keep.shape[1], t, t), x.dtype)
        return call(m, x, mask, 0)

    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        source = ""

    def decode(m: Any, x: Tensor) -> Tensor:
        from transformers import DynamicCache, EncoderDecoderCache

        cache: Any = DynamicCache(config=m.config)
        if "self_attention_cache" in source:  # a decoder's self-attention in an encoder-decoder model
            cache = EncoderDecoderCache(cache, DynamicCache(config=m.config))
        return torch.cat([call(m, x[:, i:i + 1], None, i, cache) for i in range(x.shape[1])], dim=1)

    config = module.config
    return ModuleSpec(
        f"hf:{cls.__name__}", forward, _HF, num_heads="config.num_attention_heads",
        **({"qkv": "qkv_proj", "q": None, "k": None, "v": None} if fused else {}),  # type: ignore[arg-type]
        num_kv_heads="config.num_key_value_heads" if getattr(config, "num_key_value_heads", None) else None,
        head_dim="head_dim" if hasattr(module, "head_dim") else None,
        scale="scaling" if hasattr(module, "scaling") else None,
        rotary=Rotary(theta, _rotary_style(module)) if takes_rotary and theta is not None else None,
        decode=decode if cache_arg is not None else None,
        build=lambda c, overrides: hf_build(c, overrides),
        module_type=f"{cls.__module__}.{cls.__qualname__}")


def hf_attention_classes(model: str) -> list[type]:
    """The attention classes defined in ``transformers.models.<model>.modeling_<model>`` (by name: ``*Attention``)."""
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return [obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, nn.Module) and name.endswith("Attention")
            and obj.__module__ == module.__name__]
