"""A tiny instance of a Hugging Face attention class from its own config class: the config, the layer, its rotary
class and the attention implementation it is called with."""

import contextlib
import importlib
import inspect
import math
import re
from typing import Any

from torch import nn

from ..core.conventions import AuditUsageError, Conventions
from .facts import (
    _BLOCKS,
    _LOCAL_RADIUS,
    _RELEASED_CLIP,
    _core_of,
    _heads_as_positions,
    _local_blocks,
    _modeling,
    _rotary_class,
    _rotary_fraction,
    _shaw_blocks,
    _source,
    _transformers_class,
    _unguarded_clip,
    _window_table,
)
from .layout import config_from_configuration_module, constructor_arguments, init_parameters, nested_config

#: the sizes of the tiny config (set where the config has the field): 4 query heads on 2 key/value heads of 4
#: (Zamba's attention reads ``attention_hidden_size``, twice the hidden size: its input is two states side by side);
#: 256 positions, past the default budget's deep lengths (up to 129), for the classes that keep a table or a
#: buffer of ``max_position_embeddings`` positions
TINY: dict[str, Any] = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
                        "intermediate_size": 32, "num_hidden_layers": 1, "vocab_size": 64,
                        "max_position_embeddings": 256, "attention_dropout": 0.0, "attention_bias": False,
                        "attention_hidden_size": 32, "rotary_dim": 2,
                        # T5-style configs name the head size d_kv (Pix2Struct reads it, projecting to hidden_size)
                        "d_kv": 4,
                        # T5Gemma's cross-attention reads it from a module config that does not define it
                        "cross_attention_hidden_size": 16,
                        # multi-head latent attention (DeepSeek V2/V3): heads of 4 + 4 query/key features (the
                        # last 4 turned), values of 4, latents of 8
                        "kv_lora_rank": 8, "q_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4,
                        "v_head_dim": 4,
                        # DeBERTa's disentangled attention, as its released checkpoints have it (the default configs
                        # switch it off), log-spaced distances beyond 4
                        "relative_attention": True, "pos_att_type": ("p2c", "c2p"), "position_buckets": 8,
                        # DINOv3's prefix of unturned tokens: the class token and one register token
                        "num_register_tokens": 1,
                        # Perceiver's latents (its self-attention's width) and its heads over them
                        "d_latents": 16, "num_self_attention_heads": 4, "num_cross_attention_heads": 4,
                        # MobileBERT's attention width (its config sets true_hidden_size = intra_bottleneck_size when
                        # it is made, with use_bottleneck): the tiny width, as the bottlenecks' is
                        "intra_bottleneck_size": 16, "true_hidden_size": 16,
                        # Qwen4-Exp's QSA indexer (its attention builds one whatever the config, and its default
                        # config leaves every field None): one key head, blocks of 2 tokens, a budget of 256 tokens,
                        # past the audit's lengths, so that every visible key is selected (named in hf_notes)
                        "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 4, "indexer_budget": 256,
                        "indexer_compress_ratio": 2}

#: the base of the rotary tables the audit makes itself (packed ``cu_seqlens`` encoders, image-grid rotaries)
_PACKED_THETA = 10000.0
#: prefixes of config fields that size one kind of layer (see :func:`_build`)
_SIZE_PREFIXES = ("swa", "cross", "global", "local", "full", "sliding")

_HF = Conventions(self_attention=True, fully_masked="uniform")
_HF_CROSS = Conventions(fully_masked="uniform")


def hf_config_class(cls: type) -> type:
    """The config class of ``cls``'s model: the ``config_class`` of a pretrained model in its module (the text
    config of a composite one is taken at build time), or the constructor's annotation."""
    annotation = init_parameters(cls).get("config")
    if (annotation is not None and isinstance(annotation.annotation, type)
            and annotation.annotation is not inspect.Parameter.empty
            and bool(vars(annotation.annotation).get("model_type"))):  # not the base class (DistilBERT on 5.0)
        return annotation.annotation
    from transformers import PreTrainedModel

    for obj in vars(_modeling(cls)).values():
        config_class = getattr(obj, "config_class", None)
        if (isinstance(obj, type) and issubclass(obj, PreTrainedModel)
                and obj.__module__ == _transformers_class(cls).__module__ and isinstance(config_class, type)):
            return config_class
    found = config_from_configuration_module(cls, _transformers_class(cls).__module__)
    if found is not None:
        return found
    raise AuditUsageError(f"{cls.__qualname__}: no config class found (no annotation, no pretrained model)")


def hf_build(cls: type, overrides: dict[str, Any] | None = None, *, cross: bool = False) -> nn.Module:
    """A tiny instance of ``cls`` from its own config class (:data:`TINY` sizes where the config has them, eager
    attention, no dropout); an ``(embed_dim, num_heads)`` constructor gets them from that config, a T5 attention its
    relative bias, and ``cross=True`` builds the cross-attention form (``is_cross_attention``/``is_decoder``)."""
    first: Exception | None = None
    for config in _configs(cls):
        try:
            module = _build(cls, config, overrides, cross)
        except Exception as err:  # the next config (a nested one) may be the class's own
            first = first or err
            continue
        forward: Any = getattr(cls, "forward", None)
        if "position_embeddings" in inspect.signature(forward).parameters and getattr(module, "config", None) is None:
            # a rotary class that keeps no config (GPT-NeoX-Japanese's): the one it was built from, for its
            # module's rotary class and rope parameters
            module.config = config
        head = _tiny_mrope(module)
        if head is not None and "head_dim" not in (overrides or {}):
            # its rotary class cannot make tables with a section of no frequency (Ernie 4.5 VL's, which splits off
            # the temporal section as inv_freq[-t:]): heads wide enough for one frequency in every section
            return hf_build(cls, {**(overrides or {}), "head_dim": head,
                                  "hidden_size": TINY["num_attention_heads"] * head}, cross=cross)
        if _unguarded_clip(module):
            # DBRX clamps with max=self.clip_qkv whatever it holds, and its config's default None makes torch.clamp
            # raise (neither bound): the bound of its released checkpoints (attn_config.clip_qkv = 8)
            setattr(module, "clip_qkv", _RELEASED_CLIP)  # noqa: B010  (not a Tensor | Module attribute)
        window = _window_table(module)
        if window is not None and window[1][0] * window[1][1] > _HF.lengths[1] and "window_size" not in (
                overrides or {}):  # Swin's 7 x 7 windows: 2 x 2 ones, as long as the audit's sequences
            module = _build(cls, config, {**(overrides or {}), "window_size": 2}, cross)
        if _shaw_blocks(module) and int(getattr(module, "context_size")) > _BLOCKS and "context_size" not in (  # noqa: B009
                overrides or {}):  # Granite Speech's blocks of 128 or 200: blocks of 3, keys as wide as queries
            module = _build(cls, config, {**(overrides or {}), "context_size": _BLOCKS,
                                          "num_key_value_heads": TINY["num_attention_heads"]}, cross)
        if _local_blocks(_core_of(module)) is not None and "local_radius" not in (overrides or {}):
            # LongT5's local attention of radius 127: radius 2 (blocks of 3), so the audit's sequences span blocks
            module = _build(cls, config, {**(overrides or {}), "local_radius": _LOCAL_RADIUS}, cross)
        return module
    assert first is not None
    raise first


def _build(cls: type, config: Any, overrides: dict[str, Any] | None, cross: bool) -> nn.Module:
    tiny = {**TINY, "num_key_value_heads": TINY["num_attention_heads"]} if _heads_as_positions(cls) or _tied_kv_heads(
        config) else TINY
    if getattr(config, "is_heterogeneous", False):  # Gemma 4's per-layer overrides: one tiny size for every layer
        config.per_layer_config = None
    # a size under a prefix (Inkling's swa_num_attention_heads, Dia's cross_head_dim): the same tiny value
    prefixed = {f"{p}_{key}": value for p in _SIZE_PREFIXES for key, value in tiny.items()
                if key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")}
    # a size per layer or per stage (Sapiens2's num_key_value_heads_per_layer, PVT's num_attention_heads list)
    per_layer = {f"{key}_per_layer": value for key, value in prefixed.items() | tiny.items()}
    for key, value in {**tiny, **prefixed, **per_layer, **(overrides or {})}.items():
        if hasattr(config, key) or key in ("head_dim", "cross_attention_hidden_size"):
            current = getattr(config, key, None)
            if isinstance(current, list | tuple) and not isinstance(value, list | tuple):
                value = type(current)([value] * len(current))
            elif isinstance(value, tuple) and not isinstance(current, tuple):  # a list field (DeBERTa's pos_att_type)
                value = list(value)
            # a read-only property (Falcon's head_dim), a field the config refuses (ProphetNet's num_hidden_layers)
            with contextlib.suppress(AttributeError, NotImplementedError):
                setattr(config, key, value)
    _tiny_partial_rotary(config)
    window = getattr(config, "attention_window", None)
    if isinstance(window, int) and "attention_window" not in (overrides or {}) and (
            "config.attention_window[self.layer_id]" in inspect.getsource(_modeling(cls))):
        # Longformer's and LED's layers read one window per layer, which their models make from an int: windows of
        # 2 * _LOCAL_RADIUS keys (one-sided radius _LOCAL_RADIUS; the default 512 would cover the audit's sequences)
        config.attention_window = [2 * _LOCAL_RADIUS] * config.num_hidden_layers
    _missing_layer_rope(cls, config)
    if "JetMoeMoA(config)" in _source(cls) and not {"num_local_experts", "num_experts_per_tok"} & set(
            overrides or {}):
        # JetMoE's mixture of attention: one expert, chosen for every token (the routing then exact: gate 1), and
        # as many query heads as key/value heads (num_attention_heads = num_key_value_heads * num_experts_per_tok)
        config.num_local_experts, config.num_experts_per_tok = 1, 1
        config.num_attention_heads = config.num_key_value_heads
    config._attn_implementation = _attention_implementation(cls)
    args, kwargs = constructor_arguments(cls, config, _attention_layer(config), cross)
    from transformers import PretrainedConfig

    params = init_parameters(cls)
    for name, sub in kwargs.items():  # a nested sub-config the constructor takes (EsmFold2's atom_config): tiny too
        if (name.endswith("_config") and isinstance(sub, PretrainedConfig) and getattr(config, name, None) is not sub
                and name in params and sub is nested_config(config, params[name].annotation)):
            for key in ("hidden_size", "num_attention_heads", "head_dim"):
                if hasattr(sub, key):
                    setattr(sub, key, tiny[key])
    try:
        module: nn.Module = _construct(cls, config, args, kwargs)
    except (ValueError, IndexError):
        types = getattr(config, "layer_types", None)
        if not isinstance(types, list) or len(types) <= config.num_hidden_layers:
            raise
        # one layer of a pattern that needs each layer type once (Gemma 4's key/value sharing: a ValueError; Gemma
        # 3n's kv_sharing_modes, its last num_kv_shared_layers layers of one layer: an IndexError): all the layers
        config.num_hidden_layers = len(types)
        module = _construct(cls, config, args, kwargs)
    return module


def _tied_kv_heads(config: Any) -> bool:
    """The config sets ``num_key_value_heads = num_attention_heads`` whatever it was given (EfficientLoFTR's,
    Parakeet's ``__post_init__``: its models never group keys): the tiny config keeps them equal too."""
    try:
        source = inspect.getsource(type(config).__post_init__)
    except (OSError, TypeError, AttributeError):
        return False
    tied = r"^        self\.num_key_value_heads = self\.num_attention_heads$"
    return re.search(tied, source, re.MULTILINE) is not None


def _construct(cls: type, config: Any, args: list[Any], kwargs: dict[str, Any]) -> nn.Module:
    """``cls(*args, **kwargs)``; where the constructor reads a field of a nested config that only the outer config
    holds (DBRX's ``attn_config.rope_theta``: its checkpoints' ``attn_config`` carries it, the default
    ``DbrxAttentionConfig`` on transformers 5.x does not, the base now in ``rope_parameters``), the outer config's
    value is set on the nested one and the class built again."""
    from transformers import PretrainedConfig

    for _ in range(4):
        try:
            built: nn.Module = cls(*args, **kwargs)
            return built
        except AttributeError as err:
            found = re.fullmatch(r"'(\w+)' object has no attribute '(\w+)'", str(err))
            nested = [v for v in vars(config).values() if isinstance(v, PretrainedConfig)
                      and found is not None and type(v).__name__ == found.group(1)]
            params = getattr(config, "rope_parameters", None)
            name = found.group(2) if found is not None else ""
            value = getattr(config, name, None)
            if value is None and isinstance(params, dict):
                value = params.get(name)
            if not nested or value is None:
                raise
            for v in nested:
                setattr(v, name, value)
    last: nn.Module = cls(*args, **kwargs)
    return last


def _configs(cls: type) -> list[Any]:
    """The configs to build ``cls`` from, in order: its config class's (the text config of a composite one, where
    the constructor accepts it), then the configs nested in it and in the configs of the pretrained models of its
    module (a composite model's vision, audio, Q-Former, mask decoder configs, two levels deep), the ones whose
    class name shares the longest prefix with the class's first (BlipAttention: BlipVisionConfig)."""
    from transformers import PretrainedConfig, PreTrainedModel

    config = hf_config_class(cls)()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    chosen = text if type(text).__name__ != type(config).__name__ and _accepts(cls, text) else config
    classes: list[Any] = [getattr(obj, "config_class", None) for obj in vars(_modeling(cls)).values()
                          if isinstance(obj, type) and issubclass(obj, PreTrainedModel)
                          and obj.__module__ == _transformers_class(cls).__module__]
    roots = [config] + [c() for c in dict.fromkeys(classes) if isinstance(c, type) and c is not type(config)]
    found: dict[str, Any] = {}
    level = roots
    for _ in range(3):
        level = [c for c in level if type(c).__name__ not in found]
        found.update((type(c).__name__, c) for c in level)
        level = [v for c in level for v in vars(c).values() if isinstance(v, PretrainedConfig)]
    found.pop(type(chosen).__name__, None)

    def shared(c: Any) -> int:
        name = type(c).__name__.removesuffix("Config")
        return next((i for i, (a, b) in enumerate(zip(name, cls.__name__, strict=False)) if a != b),
                    min(len(name), len(cls.__name__)))

    return [chosen, *sorted(found.values(), key=lambda c: -shared(c))]


def _attention_layer(config: Any) -> int:
    """The index the class has in its model: the first layer whose type is attention (a hybrid model's config may
    start with recurrent or convolution layers: Jamba, LFM), else 0."""
    types = getattr(config, "layer_types", None)
    if isinstance(types, list | tuple):
        for i, kind in enumerate(types):
            if isinstance(kind, str) and kind.endswith("attention") and "linear" not in kind:
                return i
    return 0


def _tiny_partial_rotary(config: Any) -> None:
    """A partial rotary factor that turns fewer than 2 features of the tiny head (StableLM's 0.25 of 4), or an odd
    number of them (MoonshineStreaming's 0.8 of 4), gets heads wide enough to turn an even number, at least one pair
    (hidden size 4 heads of it)."""
    params = getattr(config, "rope_parameters", None)
    factors = [getattr(config, "partial_rotary_factor", None)]
    if isinstance(params, dict):  # flat, or one entry per layer type
        factors += [p.get("partial_rotary_factor") for p in (params, *params.values()) if isinstance(p, dict)]
    factor = min((float(f) for f in factors if f is not None and float(f) > 0), default=None)
    rope_dim = getattr(config, "qk_rope_head_dim", None)
    if factor is not None and isinstance(rope_dim, int) and hasattr(config, "head_dim"):
        # latent attention whose rotary class turns head_dim * factor features: qk_rope_head_dim of them (Mistral 4)
        config.head_dim = int(rope_dim / factor)
        return
    turned = None if factor is None else int(TINY["head_dim"] * factor)
    if factor is None or (turned is not None and turned >= 2 and turned % 2 == 0):
        return
    # the narrowest even head that turns an even number of features, 2 or more (Moonshine's 0.9 of 4 turns 3: its
    # rotary class makes frequencies for 3 features and its cos/sin turn 4, the reference 3)
    head = math.ceil(2 / float(factor))
    head += head % 2
    while int(head * float(factor)) % 2:
        head += 2
    config.head_dim, config.hidden_size = head, TINY["num_attention_heads"] * head


def _attention_implementation(cls: type) -> str:
    """Eager, unless the class looks its attention function up with no eager fallback (Qwen2.5-Omni's DiTAttention:
    ``ALL_ATTENTION_FUNCTIONS[...]``, where eager is not registered): then SDPA, the transformers default. A forward
    that falls back to its ``eager_attention_forward`` (transformers 5.0's GPT-2: the lookup under ``!= "eager"``)
    is eager."""
    source = _source(getattr(cls, "forward", None))
    direct = "ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]" in source
    return "sdpa" if direct and "eager_attention_forward" not in source else "eager"


def _missing_layer_rope(cls: type, config: Any) -> None:
    """A config whose rotary parameters are read per layer type (``rope_parameters[layer_type]``) and whose default
    holds none (Cohere Compass's text config: ``{}``, so its model's rotary class raises a KeyError): each layer type
    gets default rotary parameters, base :data:`_PACKED_THETA` (named in :func:`hf_notes`)."""
    types = getattr(config, "layer_types", None)
    if getattr(config, "rope_parameters", None) != {} or not isinstance(types, list) or not types:
        return
    try:
        source = inspect.getsource(_modeling(cls))
    except (OSError, TypeError):
        return
    if "rope_parameters[layer_type]" in source:
        config.rope_parameters = {kind: {"rope_type": "default", "rope_theta": _PACKED_THETA}
                                  for kind in dict.fromkeys(types)}
        config.audit_default_rope = True


def _tiny_mrope(module: nn.Module) -> int | None:
    """M-RoPE (Qwen2-VL, GLM-4V): ``mrope_section`` splits the rotary frequencies into temporal, height and width
    sections sized for the real head size; at the tiny head size they are scaled down to sum to ``head_dim / 2``
    (as evenly as they go). With text positions (the three rows equal, as the audit passes them) M-RoPE is 1-D
    rotary, whatever the sections. Returns the head size to build again with where a section is left with no
    frequency and the rotary class then cannot be built (else None)."""
    rotary = _rotary_class(module)
    config: Any = getattr(module, "config", None)
    params = getattr(config, "rope_parameters", None)
    try:
        uses_sections = rotary is not None and "mrope_section" in inspect.getsource(rotary)
    except (OSError, TypeError):
        uses_sections = False
    if not uses_sections or not isinstance(params, dict) or "rope_theta" not in params:
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    fraction = _rotary_fraction(module)
    half, n = int(head_dim * fraction) // 2, len(params.get("mrope_section", (0, 0, 0)))
    params["mrope_section"] = [half // n + (1 if i < half % n else 0) for i in range(n)]
    if half >= n or rotary is None:
        return None
    try:
        rotary(config=config)
    except Exception:
        return math.ceil(2 * n / fraction / 2) * 2
    return None


def _accepts(cls: type, config: Any) -> bool:
    annotation = init_parameters(cls).get("config")
    if annotation is None or annotation.annotation is inspect.Parameter.empty:
        return True
    return not isinstance(annotation.annotation, type) or isinstance(config, annotation.annotation)


def hf_attention_classes(model: str) -> list[type]:
    """The attention classes defined in ``transformers.models.<model>.modeling_<model>`` (by name: ``*Attention``)."""
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return [obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, nn.Module) and name.endswith("Attention")
            and obj.__module__ == module.__name__]
