"""Hugging Face decoder attention classes with no spec written: most share one shape (a config in the constructor,
``q_proj/k_proj/v_proj/o_proj``, ``position_embeddings`` from the model's rotary class, an additive mask). From
the class alone, :func:`hf_build` makes a tiny instance from its own config class and :func:`hf_spec` describes it
(projections, head counts, scale, the rotary class and its base, the KV cache); inference decides the rest."""

import contextlib
import copy
import dataclasses
import importlib
import inspect
import math
import re
from collections.abc import Callable
from typing import Any, Literal

import torch
from einops import einsum, rearrange, repeat
from torch import Tensor, nn

from ..masks import window_mask
from ._core import AuditUsageError, Conventions
from ._hf_layouts import (
    PROJECTED,
    Layout,
    bypass_norms,
    config_from_configuration_module,
    constructor_arguments,
    content_layout,
    content_zero_args,
    find_layout,
    has_residual,
    init_parameters,
    nested_config,
    projected_layout,
    relative_bias,
)
from ._modules import (
    REBUILDS,
    SHIPPED_SPECS,
    DecomposedRelPos,
    Differential,
    Disentangled,
    Latent,
    ModuleSpec,
    MRope,
    OutputGate,
    PositionBias,
    RelativeKeys,
    Rotary,
    Weights,
    _norm,
    additive_mask,
    log_coordinates,
    mrope_positions,
    one_row,
    resolve,
    spec_weights,
    t5_buckets,
    window_bias,
    with_causal,
)

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


def _transformers_class(cls: type) -> type:
    """``cls``, or its first base class defined in ``transformers`` (a user's subclass of a Hugging Face class)."""
    return next((c for c in cls.__mro__ if c.__module__.startswith("transformers.")), cls)


def _modeling(cls: type) -> Any:
    return importlib.import_module(_transformers_class(cls).__module__)


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


def _rotary_class(module: nn.Module) -> type | None:
    """The rotary class of the modeling module of the class (or of the first base class that has one), of the
    class's own tower (vision, audio or text, by name): a text class takes a vision or audio one only where no module
    along its bases has a text one (Exaone 4.5's text attention: its base class's module has the text rotary; Pixtral's
    attention: its module has only PixtralVisionRotaryEmbedding)."""
    kind = _tower(type(module).__name__)
    other: type | None = None
    for base in type(module).__mro__:
        if not base.__module__.startswith("transformers.") and base is not type(module):
            continue
        found = [obj for name, obj in vars(importlib.import_module(base.__module__)).items()
                 if isinstance(obj, type) and name.endswith("RotaryEmbedding") and issubclass(obj, nn.Module)]
        # the one named after the class (EvollaSaProtSelfAttention: EvollaSaProtRotaryEmbedding, not the text
        # model's EvollaRotaryEmbedding), then the class's tower, then the shortest name
        own = re.sub(r"(Self)?Attention$", "", type(module).__name__) + "RotaryEmbedding"
        found.sort(key=lambda c: (c.__name__ != own, _tower(c.__name__) != kind, len(c.__name__)))
        mine = [c for c in found if not _tower(c.__name__) or kind]
        if mine:
            return mine[0]
        other = other or (found[0] if found else None)
    # a text class whose module has only another tower's rotary (Exaone 4.5's Exaone4_5_Attention, its language
    # model an AutoModel of its text config): the rotary class of its config's own model package (Exaone 4's)
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    if not kind and isinstance(model_type, str) and model_type:
        try:
            package = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ImportError:
            return other
        text = [obj for name, obj in vars(package).items() if isinstance(obj, type) and issubclass(obj, nn.Module)
                and name.endswith("RotaryEmbedding") and not _tower(name) and obj.__module__ == package.__name__]
        if text and package.__name__ != _modeling(type(module)).__name__:
            return min(text, key=lambda c: len(c.__name__))
    return other


def _tower(name: str) -> str:
    """The tower a class's name says it belongs to: ``"Vision"``, ``"Audio"``, or ``""`` (text)."""
    return next((kind for kind in ("Vision", "Audio") if kind in name), "")


def _rotate_source(module: nn.Module) -> str:
    """The source of the rotate function the modeling module's ``apply_rotary_pos_emb`` calls."""
    modeling = importlib.import_module(_transformers_class(type(module)).__module__)
    # the apply function the class's forward calls (a vision encoder's apply_rotary_pos_emb_vision)
    called = re.search(r"\b(apply_rotary_pos_emb\w*)\(", _source(type(module).forward))
    try:
        apply = inspect.getsource(getattr(modeling, called.group(1) if called else "apply_rotary_pos_emb"))
    except (AttributeError, OSError, TypeError):
        apply = "rotate_half("
    # gpt-oss: _apply_rotary_emb; GPT-J and CodeGen on transformers 5.0: rotate_every_two; Inkling 2's vision tower
    # and SAM 2's: rotate_pairwise
    names = re.findall(r"\b(rotate_half\w*|rotate_every_two|rotate_pairwise|_apply_rotary_emb)\(", apply) or [
        "rotate_half"]
    return _source(getattr(modeling, names[0], None))


def _rotary_style(module: nn.Module) -> Literal["half", "interleaved"]:
    """``"interleaved"`` when the class turns pairs of even and odd features: the rotate function its apply
    function calls (Cohere's ``rotate_half``, GLM's ``rotate_half_llm``), PE's 2 x 2 rotation matrices, Llama 4's
    complex turns."""
    applied = _source(getattr(_modeling(type(module)), "apply_rotary_pos_emb", None))
    if "reshape(*q.shape[:-1], -1, 1, 2)" in applied:  # PE's 2 x 2 rotation matrices on pairs (2i, 2i+1)
        return "interleaved"
    complex_turn = "view_as_complex" in _source(getattr(_modeling(type(module)), "apply_rotary_emb", None))
    if complex_turn and "apply_rotary_emb(" in _source(type(module).forward):  # Llama 4: complex pairs (2i, 2i+1)
        return "interleaved"
    if _complex_tables(module):  # Llama 4's vision_apply_rotary_emb: the same complex pairs
        return "interleaved"
    rotate = _rotate_source(module)
    # rotate_pairwise: x.view(*x.shape[:-1], -1, 2), pairs (2i, 2i+1) (Inkling 2's vision tower)
    return "interleaved" if "::2]" in rotate or "view(*x.shape[:-1], -1, 2)" in rotate else "half"


def _input_width(module: nn.Module, layout: Layout) -> int:
    """The width of the tokens the module takes: the input side of its query (or fused) projection."""
    if layout.q is None and layout.qkv is None and layout.out is not None and layout.weights is not None:
        return int(layout.weights(module).wq.shape[1])  # identity projections (DAB-DETR's DabDetrAttention)
    projection: Any = module.get_submodule(str(layout.q or layout.qkv or _LATENT.kv_a))
    if isinstance(projection, nn.Conv1d):  # a 1x1 convolution over channels, grouped: its in_channels
        return int(projection.in_channels)
    weight: Any = projection.weight
    return int(weight.shape[0] if layout.transposed else weight.shape[1])


def _decodes(core: Any) -> bool:
    """Whether token-by-token decoding describes the class: not T5's bidirectional relative bias (an encoder's:
    the bias of a key after the query differs from the one before, and decoding sees only keys before), nor an
    encoder's attention that takes a cache argument it was never built for (Dots3Note's audio attention updates the
    cache at ``self.layer_idx``, which its constructor never sets: its model never passes one), nor a class that
    never writes its cache (``.update(``)."""
    unbuilt = "self.layer_idx" in _source(type(core).forward) and not hasattr(core, "layer_idx")
    methods = (getattr(type(core), n) for n in dir(type(core)) if not n.startswith("__"))
    own = "".join(_source(f) for f in methods if inspect.isfunction(f) and f.__module__.startswith("transformers."))
    # a cache the class only reads (DiffusionGemma's decoder: its encoder fills it, append_to_cache never writes)
    writes = ".update(" in own + _source(type(core).forward) + _library_source(core)
    return writes and not unbuilt and not (isinstance(getattr(core, "relative_attention_bias", None), nn.Module)
                                           and not getattr(core, "is_decoder", False))


def _rotary_fraction(module: nn.Module) -> float:
    """The fraction of each head the rotary embedding turns (``partial_rotary_factor``; GPT-J's and CodeGen's
    ``rotary_dim`` features of ``head_dim``; 1.0 when absent)."""
    rotary_dim, head_dim = getattr(module, "rotary_dim", None), getattr(module, "head_dim", None)
    if isinstance(rotary_dim, int) and isinstance(head_dim, int) and head_dim > 0:
        return min(rotary_dim, head_dim) / head_dim
    params = _rope_params(module)
    if params.get("rope_type") == "proportional":  # every pair turns, those past the factor at frequency 0
        return 1.0
    config = getattr(module, "config", None)
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return 1.0 if factor is None else float(factor)


def _layer_type(module: nn.Module) -> str | None:
    types = getattr(getattr(module, "config", None), "layer_types", None)
    layer = getattr(module, "layer_idx", 0) or 0
    return types[layer] if isinstance(types, list | tuple) and layer < len(types) else None


def _rope_params(module: nn.Module) -> dict[str, Any]:
    """The module's rope parameters: the config's ``rope_parameters``, or its entry for this layer's type (Gemma 3
    keeps one per layer type)."""
    params = getattr(getattr(module, "config", None), "rope_parameters", None)
    if not isinstance(params, dict):
        return {}
    nested = _layer_type(module)
    if "rope_theta" not in params and nested is not None and isinstance(params.get(nested), dict):
        return dict(params[nested])
    return params


def _literal_theta(module_name: str) -> float | None:
    """The rope base a modeling module writes as a number (GPT-J's and CodeGen's ``10000 ** (...)`` in
    ``create_sinusoidal_positions``), for a class whose config has no ``rope_theta``."""
    found = re.findall(r"\b(\d+(?:\.\d+)?)\s*\*\*\s*\(", _source(importlib.import_module(module_name)))
    return float(found[0]) if len(set(found)) == 1 else None


def _rope_theta(module: nn.Module) -> float | None:
    params = _rope_params(module)
    if "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(getattr(module, "config", None), "rope_theta", None)
    return None if theta is None else float(theta)


#: the second argument that makes a class cross-attention over one memory tensor (keys and values from it)
_MEMORY_ARGS = ("encoder_hidden_states", "cross_attention_states", "key_value_states", "context", "to_tensor",
                "context_hidden_states")
#: the first three forward parameters of a class that takes queries, keys and values as separate inputs
_SEPARATE = {("query", "key", "value"), ("queries", "keys", "values"), ("q", "k", "v"),
             ("query_tensor", "key_tensor", "value_tensor")}
#: a block's residual input, required beside the attention's (MobileBERT's layer_input: the input bottleneck's output
#: added before the block's Add & Norm, the hidden states themselves in a model without bottlenecks): the input
_RESIDUAL_INPUTS = ("layer_input",)
#: the arguments the generic call provides (or leaves at their defaults)
_PROVIDED = {"hidden_states", "query", "key", "value", "attention_mask", "position_embeddings", "position_ids",
             "layer_idx", "cache", "past_key_values", "past_key_value", "kwargs", "cu_seqlens", "max_seqlen",
             "shared_kv_states", "height", "width", *_RESIDUAL_INPUTS,
             *(name for names in _SEPARATE for name in names),
             *_MEMORY_ARGS}
#: q/k norm attributes, as pairs
_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"), ("query_layernorm", "key_layernorm"))


def _norm_paths(module: nn.Module) -> tuple[str | None, str | None]:
    inputs = [n for n in inspect.signature(type(module).forward).parameters if n != "self"][:1] + list(_MEMORY_ARGS)
    applied = _source(type(module).forward)
    for q, k in _NORMS:
        # not norms of the inputs, before the projections (BLT's cross-attention: q_norm(hidden_states),
        # k_norm(cross_attention_states) over the model width): the block's Add & Norm, bypassed with its residual
        before = any(f"self.{n}({x})" in applied for n in (q, k) for x in inputs)
        if not before and all(isinstance(getattr(module, n, None), nn.Module)
                              and not isinstance(getattr(module, n), nn.Identity) for n in (q, k)):
            return q, k
    # one norm for both (Llama 4's weightless qk_norm, after the rotary turn)
    source = _source(type(module).forward)
    if (isinstance(getattr(module, "qk_norm", None), nn.Module)  # Muse's scale factor: _query_scale
            and re.search(r"query_states = self\.qk_norm\(query_states\)( \* self\.qk_scale_factor)?\n", source)
            and re.search(r"key_states = self\.qk_norm\(key_states\)\n", source)):
        return "qk_norm", "qk_norm"
    return None, None


def _v_norm(core: nn.Module, prefix: str) -> str | None:
    """The value norm the class applies (Gemma 3n's and Gemma 4's ``self.v_norm(value_states)``), as a path."""
    norm = getattr(core, "v_norm", None)
    applied = "self.v_norm(" in _source(type(core).forward)
    return prefix + "v_norm" if isinstance(norm, nn.Module) and not isinstance(norm, nn.Identity) and applied else None


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _heads_as_positions(cls: type) -> bool:
    """NeuCodec's and X-Codec2's rotary: the model passes ``position_ids = arange(num_heads)`` and the class
    broadcasts cos/sin over the sequence (``unsqueeze_dim=2``): each head is turned by its own angle, the same at
    every position, so the turn cancels in ``q . k`` and the attention carries no position at all."""
    forward: Any = getattr(cls, "forward", None)
    source = _source(forward)
    # Gemma 4 also passes unsqueeze_dim=2, to heads laid out (b, t, h, d) before their transpose: not this
    transposed_first = re.search(r"\.view\(hidden_shape\)\.transpose\(1, 2\)", source) is not None
    return ("unsqueeze_dim=2" in source and transposed_first
            and "position_ids" not in inspect.signature(forward).parameters)


def _ignores_rotary(module: nn.Module, call: Callable[..., Tensor], width: int,
                    arg: str = "position_embeddings") -> bool:
    """Whether the class gives the same output with its rotary tables and with the identity turn (cos 1, sin 0)
    on three random tokens: a class whose config switches rotary off (Zamba2's ``use_mem_rope=False``)."""
    m: Any = copy.deepcopy(module).double().eval()
    x = torch.randn(1, 3, width, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    keep = additive_mask(torch.ones(1, 1, 3, 3, dtype=torch.bool), torch.float64)
    with torch.no_grad():
        turned = call(m, x, keep, 5)
        original = m.forward

        def identity(*args: Any, **kwargs: Any) -> Any:
            tables = kwargs[arg]
            kwargs[arg] = (torch.ones_like(tables) if isinstance(tables, Tensor)  # complex turns
                                             else (torch.ones_like(tables[0]), torch.zeros_like(tables[1])))
            return original(*args, **kwargs)

        m.forward = identity
        plain = call(m, x, keep, 5)
    return bool(torch.allclose(turned, plain, rtol=0, atol=1e-12))


#: rope types whose frequencies the rotary class computes once, at construction (``dynamic`` and ``longrope``
#: recompute them from the length of each call: not read, a limit of the audit); ``proportional`` (Gemma 4's full
#: layers, LFM 3): the first ``factor * d / 2`` frequencies of the head, then zeros (pairs that do not turn)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", "proportional")


def _rope_type(module: nn.Module) -> str:
    return str(_rope_params(module).get("rope_type", "default") or "default")


def _frequencies(rotary_class: type, layer_type: str | None) -> Callable[[Any], tuple[Tensor, float]]:
    """``frequencies(module)`` for :class:`Rotary`: the inverse frequencies and the cos/sin factor of a rope type
    other than the default, as the module's own rotary class computes them at construction (its ``inv_freq`` and
    ``attention_scaling``, or the entry for this layer's type); the reference still turns q and k itself."""

    def read(m: Any) -> tuple[Tensor, float]:
        embedding = rotary_class(config=m.config)
        for prefix in ((f"{layer_type}_",) if layer_type else ()) + ("",):
            inverse = getattr(embedding, f"{prefix}inv_freq", None)
            if isinstance(inverse, Tensor):
                return inverse, float(getattr(embedding, f"{prefix}attention_scaling", 1.0) or 1.0)
        raise AuditUsageError(f"{rotary_class.__name__}: no inv_freq buffer to read its rope frequencies from")

    return read


def _body(function: Any) -> str:
    """The source of ``function`` after its signature (not its decorators, whose parentheses would end it early)."""
    source = _source(function)
    start = source.find("def ")
    return re.split(r"\)\s*(?:->[^\n]*)?:[ \t]*\n", source[max(start, 0):], maxsplit=1)[-1]


def _mask_none(body: str) -> bool:
    """The forward passes None in the mask's place of its attention function's arguments ``(self, query, key,
    value, attention_mask, ...)``."""
    return re.search(r"attention_interface\(\s*self,\s*\w+,\s*\w+,\s*\w+,\s*None\s*,", body) is not None


def _forward_source(module: nn.Module) -> str:
    return _source(type(module).forward)


def _library_source(module: nn.Module) -> str:
    """The source of ``forward`` of the module's class as transformers defines it (a user's subclass that wraps its
    ``forward`` keeps the variant its base class computes)."""
    return _source(getattr(_transformers_class(type(module)), "forward", None))


def _softcap(module: nn.Module) -> str | None:
    """Logit soft-capping (Gemma 2, T5Gemma, VaultGemma): the attribute the class passes to its attention function
    as ``softcap=self.<path>``, when it holds a cap."""
    found = re.search(r"\bsoftcap=self\.([\w.]+)", _forward_source(module))
    if found is None:
        return None
    try:
        value: Any = module
        for part in found.group(1).split("."):
            value = getattr(value, part)
    except AttributeError:
        return None
    return found.group(1) if value else None


def _clip_path(module: nn.Module) -> str | None:
    """The bound a class clamps its projections' outputs to (DBRX's ``clip_qkv`` on the fused projection, OLMo's
    ``config.clip_qkv`` on each of q, k and v): the path the class reads it from, as
    ``.clamp(..., max=self.<path>)``."""
    found = re.search(r"\.clamp_?\([^)]*\bmax=self\.([\w.]*clip_qkv)\b", _forward_source(module))
    return None if found is None else found.group(1)


#: DBRX's released checkpoints' ``attn_config.clip_qkv``
_RELEASED_CLIP = 8.0


def _unguarded_clip(module: nn.Module) -> bool:
    """The class clamps with ``max=self.clip_qkv`` whatever it holds (no ``if self.clip_qkv:`` statement before it)
    and holds None, which torch.clamp refuses (DBRX with its config's default)."""
    return getattr(module, "clip_qkv", 0) is None and _clamps_always(module)


def _clamps_always(module: nn.Module) -> bool:
    return (_clip_path(module) == "clip_qkv"
            and re.search(r"^\s*if self\.clip_qkv", _forward_source(module), re.MULTILINE) is None)


def _clip_qkv(module: nn.Module) -> str | None:
    """:func:`_clip_path`, where the clamp is on the projections' outputs themselves (no q/k norm before it: OLMoE
    clamps its normalised queries and keys, which the reference does not model)."""
    return _clip_path(module) if _norm_paths(module) == (None, None) else None


def _sinks(module: nn.Module) -> str | None:
    """Attention sinks (gpt-oss, Granite SWA, Flint): the per-head parameter the class passes to its attention
    function as ``s_aux=self.<name>``."""
    found = re.search(r"\bs_aux=self\.(\w+)", _forward_source(module))
    return found.group(1) if found is not None and isinstance(getattr(module, found.group(1), None), Tensor) else None


#: the output gate's forms the reference computes, each ``out * sigmoid(proj(hidden_states))`` with nothing else
#: on the gate (Dory's scaled gate and Beam's gate bias do not match: they stay set aside)
_GATE_FORMS = (
    r"(?P<var>\w+) = self\.(?P<proj>g_proj|gate_proj)\(hidden_states\)(\.view\(hidden_shape\))?\n[\s\S]*"
    r"(torch\.sigmoid\((?P=var)\)|(?P=var)\.unsqueeze\(-1\)\.sigmoid\(\))",
    r"torch\.sigmoid\(self\.(?P<proj>g_proj|gate_proj)\(hidden_states\)(\.float\(\))?\)",
    # Beam: a per-head bias on the gate's logits
    r"(?P<var>\w+) = self\.(?P<proj>gate_proj)\(hidden_states\)\.view_as\(attn_output\) \+ "
    r"self\.(?P<bias>\w+)\[None, None, :, None\]\n\s*attn_output = attn_output \* torch\.sigmoid\((?P=var)\)",
    # Laguna: softplus, one gate per head or per feature
    r"(?P<var>\w+) = F\.(?P<activation>softplus)\(self\.(?P<proj>g_proj|gate_proj)\(hidden_states\)(\.float\(\))?\)",
)


def _output_gate(module: nn.Module) -> OutputGate | None:
    """An output gate ``sigmoid(W_g x)`` on the attention output: a ``gate_proj``/``g_proj`` linear layer in one of
    :data:`_GATE_FORMS` (AFMoE, HRM, Step 3.7, LFM 3), or Qwen3-Next's gate chunked from each head's query rows."""
    source = _forward_source(module)
    if re.search(r"torch\.chunk\(\s*self\.q_proj\(hidden_states\)[^\n]*head_dim \* 2\), 2", source) and (
            "torch.sigmoid(gate)" in source):
        return OutputGate("q_proj", in_query=True)
    for form in _GATE_FORMS:
        found = re.search(form, source)
        if found is not None and isinstance(getattr(module, found.group("proj"), None), nn.Linear):
            groups = found.groupdict()
            return OutputGate(found.group("proj"), bias=groups.get("bias"),
                              activation="softplus" if groups.get("activation") else "sigmoid")
    return None


#: the names DeepSeek V2/V3 give the parts of multi-head latent attention
_LATENT = Latent()


def _latent(module: nn.Module) -> Latent | None:
    """Multi-head latent attention (DeepSeek V2/V3 and the models built like them): a compressed key/value projection
    ``kv_a_proj_with_mqa`` with its norm and ``kv_b_proj``, the query full-rank (``q_proj``) or low-rank (``q_a_proj``,
    ``q_a_layernorm``, ``q_b_proj``), the sizes as attributes; the source splits the latent from the shared rotary
    key and concatenates each head's unturned and turned features."""
    lat = _LATENT
    parts = [lat.kv_a, lat.kv_norm, lat.kv_b] + ([lat.q] if getattr(module, lat.q, None) is not None
                                                  else [lat.q_a, lat.q_norm, lat.q_b])
    sizes = (lat.rank, lat.nope, lat.rope, lat.value, "num_heads", "scaling")
    source = re.sub(r"\s+", " ", _library_source(module))
    forms = (f"self.{lat.kv_a}(hidden_states)", "self.expand_kv(", "torch.cat((q_")
    if (all(isinstance(getattr(module, p, None), nn.Module) for p in parts)
            and all(isinstance(getattr(module, n, None), int | float) for n in sizes)
            and all(form in source for form in forms)
            and "kv_b_proj(kv_nope)" in _source(getattr(type(module), "expand_kv", None))):
        return lat
    return None


def _mrope(module: nn.Module) -> MRope | None:
    """M-RoPE with its sections in consecutive blocks (Qwen2-VL, Qwen2.5-VL, GLM-4V): the model's rotary class
    recomposes its frequencies as ``cat([m[i % 3] for i, m in enumerate(freq.split(self.mrope_section))])`` and the
    config's rope parameters give ``mrope_section``. Interleaved sections (Qwen3-VL's) are another layout: not read
    (audited with text positions, as 1-D rotary)."""
    rotary = _rotary_class(module)
    source = re.sub(r"\s+", " ", _source(rotary))
    form = "torch.cat([m[i % 3] for i, m in enumerate(freq.split(self.mrope_section, dim=-1))], dim=-1)"
    axial = ("freq_h, freq_w = (m[:, i % 2] for i, m in enumerate(freq.chunk(2, dim=-1)))",
             "torch.cat([freq_h, freq_w], dim=-1)", "inv_freq_2d = torch.cat([inv_freq[0::2], inv_freq[1::2]])")
    if (all(part in source for part in axial) or _shared_axial(rotary)) and _rope_type(module) == "axial":
        return _AXIAL
    if _flipped_axial(rotary) and _rope_type(module) == "axial":
        return _AXIAL_WH
    if _blocked_axial(rotary) and _rope_type(module) == "axial":
        return _AXIAL_BLOCKS
    return MRope() if form in source and "mrope_section" in _rope_params(module) else None


def _shared_axial(rotary: type | None) -> bool:
    """SAM 2's and SAM 3's axial rotary: one set of ``d/4`` inverse frequencies (``inv_freq``), turned by the first
    coordinate of each position in the first half of the pairs and by the second in the other half
    (``cat([freq[:, 0], freq[:, 1]])``, each frequency on one pair: ``repeat_interleave(2)``)."""
    source = re.sub(r"\s+", " ", _source(rotary))
    return all(part in source for part in ("freq_h, freq_w = freq[:, 0], freq[:, 1]",
                                           "torch.cat([freq_h, freq_w], dim=-1)", "repeat_interleave(2, dim=-1)"))


def _flipped_axial(rotary: type | None) -> bool:
    """Step 3.7's vision rotary: one set of ``d/4`` inverse frequencies, the positions ``(N, 2)`` (row, column), their
    angles flipped to (column, row) and flattened (``freq.flip(1).flatten(1)``), then repeated for ``rotate_half``'s
    two halves: the first ``d/4`` pairs turned by the width, the rest by the height."""
    source = re.sub(r"\s+", " ", _source(rotary))
    return all(part in source for part in ("freq_wh = freq.flip(1).flatten(1)",
                                           "torch.cat((freq_wh, freq_wh), dim=-1)"))


def _blocked_axial(rotary: type | None) -> bool:
    """Gemma 4's vision rotary: one set of ``d/4`` inverse frequencies, positions ``(b, t, 2)``, tables
    ``cat([freq_h, freq_h, freq_w, freq_w])`` that its ``apply_multidimensional_rope`` splits in two blocks of ``d/2``
    features, each turned by ``rotate_half`` within it: the first block by the height, the second by the width."""
    source = re.sub(r"\s+", " ", _source(rotary))
    return all(part in source for part in ("freq_h, freq_w = freq[:, :, 0], freq[:, :, 1]",
                                           "torch.cat([freq_h, freq_h, freq_w, freq_w], dim=-1)"))


def _axial_sections(module: Any) -> tuple[int, int]:
    """Pixtral's axial sections: the first half of the rotated frequencies turned by the height, the rest by the
    width (its inverse frequencies ``base^(-2i/d)``, the even-indexed ones first: read from its rotary class)."""
    quarter = int(module.head_dim) // 4
    return quarter, quarter


#: axial rotary (Pixtral): the frequencies in two halves, turned by height then width (2-D M-RoPE)
_AXIAL = MRope(sections=_axial_sections, axes=(1, 2))
#: the same turned by width then height (Step 3.7's vision rotary)
_AXIAL_WH = MRope(sections=_axial_sections, axes=(2, 1))
#: blocked axial rotary (Gemma 4's vision rotary): a block of features turned by the height, then one by the width
_AXIAL_BLOCKS = MRope(sections=_axial_sections, axes=(1, 2), blocks=True)


def _latent_layout() -> Layout:
    """The layout of a latent attention class: its output projection and sizes (its projections: :class:`Latent`)."""
    return Layout("", None, None, None, None, "o_proj", False, "num_heads", None, None, "scaling")


def _latent_style(module: nn.Module) -> Literal["half", "interleaved"]:
    """The pairing of a latent attention class's rotary features: DeepSeek V2 turns complex pairs
    ``(x[2i], x[2i+1])`` (``view_as_complex``); V3 does when its config's ``rope_interleave`` is set (its output laid
    out de-interleaved, the same permutation of q and k, which leaves ``q . k`` unchanged), V3.2 always (its forward
    calls ``apply_rotary_pos_emb_interleave``), else ``rotate_half``."""
    modeling = _source(_modeling(type(module)).__dict__.get("apply_rotary_emb"))
    if "view_as_complex" in modeling and "apply_rotary_emb(" in _library_source(module):
        return "interleaved"
    forward = _source(type(module).forward)
    if "apply_rotary_pos_emb_interleave(" in forward and "rope_interleave" not in forward:  # V3.2: no switch
        return "interleaved"
    interleave = getattr(getattr(module, "config", None), "rope_interleave", False)
    return "interleaved" if interleave and "rope_interleave" in _library_source(module) else "half"


def _differential(module: nn.Module) -> Differential | None:
    """Differential attention (DiffLlama): ``attn_output1 - lambda_full * attn_output2`` over the two halves of the
    heads, ``lambda_full`` from the learned ``lambda_q1 .. lambda_k2`` and ``lambda_init``."""
    source = re.sub(r"\s+", " ", _library_source(module))
    forms = ("lambda_full = lambda_1 - lambda_2 + self.lambda_init", "attn_output1 - lambda_full * attn_output2",
             "torch.chunk(attn_output, 2, dim=2)")
    lambdas = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
    found = all(form in source for form in forms) and all(isinstance(getattr(module, n, None), Tensor) for n in lambdas)
    return Differential() if found and isinstance(getattr(module, "lambda_init", None), float | int) else None


def _sub_norm(module: nn.Module) -> str | None:
    """A norm on the attention output before the output projection (BitNet's ``attn_sub_norm``; DiffLlama's
    ``groupnorm``, before its ``(1 - lambda_init)``): an RMSNorm or LayerNorm child the class applies as
    ``attn_output = self.<name>(attn_output)``."""
    found = re.search(r"attn_output = (?:\(1 - self\.lambda_init\) \* )?self\.(\w+)\(attn_output\)",
                      _library_source(module))
    norm = None if found is None else getattr(module, found.group(1), None)
    if isinstance(norm, nn.LayerNorm) or type(norm).__name__.endswith("RMSNorm"):
        return found.group(1) if found is not None else None
    return None


def _decomposed(module: nn.Module) -> DecomposedRelPos | None:
    """SAM's image-encoder attention and its kin (SAM-HQ, GOT-OCR2, SegGPT, ...): decomposed relative positions from
    the class's own tables ``rel_pos_h`` and ``rel_pos_w`` (when its config turns ``use_rel_pos`` on). The audit's
    ``(b, t, e)`` tokens reach it as an image ``(b, 1, t, e)``: one row of ``t`` patches."""
    tables = all(isinstance(getattr(module, n, None), Tensor) for n in ("rel_pos_h", "rel_pos_w"))
    switch = getattr(module, "use_rel_pos", getattr(module, "use_relative_position_embeddings", False))
    used = switch and "decomposed_rel_pos(" in _forward_source(module)
    return DecomposedRelPos("rel_pos_h", "rel_pos_w", one_row) if tables and used else None


def _query_scale(module: nn.Module) -> Callable[[Any], Tensor | float] | None:
    """A factor on the queries after their projection, rotary and norm: TimesFM's learned one per feature
    (``softplus(scaling) * c / sqrt(d)``, its attention called with ``scaling=1.0``), Muse's ``qk_scale_factor``
    after its shared norm; as ``factor(module)``."""
    source = _source(type(module).forward) + _source(getattr(type(module), "_scale_query", None))
    learned = re.search(r"F\.softplus\(self\.scaling\)\.mul\(([\d.]+) / math\.sqrt\(self\.head_dim\)\)", source)
    if learned is not None and re.search(r"query(_states)? \* scale\[None, None, None, :\]", source):
        constant = float(learned.group(1))
        return lambda m: torch.nn.functional.softplus(m.scaling.detach().double()) * constant / math.sqrt(m.head_dim)
    if "self.qk_norm(query_states) * self.qk_scale_factor" in source:
        return lambda m: float(m.qk_scale_factor)
    return None


def _boolean_mask(core: nn.Module, mask_arg: str) -> bool:
    """The mask is used as booleans, True = may attend: DeBERTa's ``masked_fill(~attention_mask, min)``, or SEW-D's
    ``XSoftmax.apply(scores, attention_mask, -1)`` whose forward fills ``~(mask.to(torch.bool))``."""
    forward = _source(type(core).forward)
    if re.search(rf"~\s*\(?\s*{mask_arg}\b|{mask_arg}\.bool\(\)|{mask_arg}\.logical_not\(\)", forward):
        return True
    # CPM-Ant's masked_fill(score, attention_mask.view(...) == torch.tensor(False), -inf)
    if re.search(rf"\b{mask_arg}\.view\([^)]*\) == torch\.tensor\(False\)", forward):
        return True
    applied = re.findall(rf"(\w+)\.apply\([^)]*\b{mask_arg}\b", forward)
    modeling = _modeling(type(core))
    return any(re.search(r"~\s*\(?\s*\w+\.to\(torch\.bool\)", _source(getattr(getattr(modeling, name, None),
                                                                             "forward", None))) for name in applied)


def _seeded_table(rows: int, width: int) -> Callable[[Any], Tensor]:
    """The audit's own relative-embedding table of ``rows`` rows (seeded: what a model's encoder would pass)."""
    def table(m: Any) -> Tensor:
        return torch.randn(rows, width, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    return table


def _disentangled(core: nn.Module, prefix: str) -> Disentangled | None:
    """DeBERTa's disentangled attention (v2 and SEW-D: ``pos_ebd_size``; v1: ``pos_proj``), when its
    ``relative_attention`` is on; the relative-embedding table its encoder would pass is the audit's own (seeded,
    ``(2 m, e)``), passed as ``rel_embeddings``."""
    if not getattr(core, "relative_attention", False) or not hasattr(core, "pos_att_type"):
        return None
    v2 = hasattr(core, "pos_ebd_size")
    sizes: Any = core
    rows = 2 * int(sizes.pos_ebd_size if v2 else sizes.max_relative_positions)
    first = next(c for n in ("query_proj", "in_proj") if isinstance(c := getattr(core, n, None), nn.Linear))
    return Disentangled(_seeded_table(rows, int(first.in_features)), "v2" if v2 else "v1",
                        terms=f"{prefix}pos_att_type", share_key=f"{prefix}share_att_key",
                        key_proj=prefix + ("pos_key_proj" if v2 else "pos_proj"),
                        query_proj=prefix + ("pos_query_proj" if v2 else "pos_q_proj"),
                        buckets=f"{prefix}position_buckets" if v2 else 0,
                        max_position=f"{prefix}max_relative_positions")


#: the distances -(L - 1) .. L - 1 of the relative table the audit passes a Transformer-XL conformer (its encoder's
#: sinusoids in the model; the audit's are seeded random rows, the row of distance p at L - 1 - p)
_XL_LENGTH = 256


#: the block size the audit builds Granite Speech's block-local attention with (its models': 200, 128), so that the
#: audit's sequences span several blocks
_BLOCKS = 3


def _distances_arg(cls: Any) -> str | None:
    """The forward argument of Granite Speech's block attention that carries the relative distances its Shaw table
    reads (``self.rel_pos_emb(attention_dists)``; Granite Speech 5 calls it ``position_embeddings``), or None."""
    found = re.search(r"self\.rel_pos_emb\((\w+)\)", _source(getattr(cls, "forward", None)))
    return found.group(1) if found is not None and found.group(1) in inspect.signature(cls.forward).parameters else None


def _shaw_blocks(core: nn.Module) -> bool:
    """Granite Speech's conformer attention: Shaw's relative keys (``rel_pos_emb``) within blocks of
    ``context_size`` tokens."""
    return (isinstance(getattr(core, "context_size", None), int) and isinstance(getattr(core, "rel_pos_emb", None),
                                                                               nn.Embedding)
            and _distances_arg(type(core)) is not None)


def _block_distances(core: Any) -> Tensor:
    """The distances Granite Speech's encoder passes its attention: ``clamp(i - j, -c, c) + M`` within a block of
    ``c`` (``context_size``), ``M`` the middle row of the table (``max_pos_emb``, ``max_position_embeddings``)."""
    c, middle = int(core.context_size), (int(core.rel_pos_emb.num_embeddings) - 1) // 2
    return (torch.arange(c)[:, None] - torch.arange(c)[None, :]).clamp(-c, c) + middle


def _relative_keys(core: nn.Module, prefix: str) -> RelativeKeys | None:
    """The conformers' relative positions: Shaw's on the keys (``relative_key``: Wav2Vec2-BERT, SeamlessM4T v2: its
    ``distance_embedding`` of ``j - i`` clamped to ``[-left, right]``), or Transformer-XL's (``relative``:
    Wav2Vec2-Conformer, SeamlessM4T: ``linear_pos`` of the table its encoder passes, ``pos_bias_u`` and
    ``pos_bias_v``)."""
    window = getattr(core, "window_size", None)
    if isinstance(window, int) and all(isinstance(getattr(core, n, None), nn.Parameter)
                                       for n in ("emb_rel_k", "emb_rel_v")):
        # VITS's: Shaw's keys and values at distances j - i within the window, none beyond it (its tables padded
        # with zero rows): the last row, all zeros, is every distance beyond the window
        def vits_rows(t: int, s: int) -> Tensor:
            distance = torch.arange(s)[None, :] - torch.arange(t)[:, None]
            return torch.where(distance.abs() <= window, distance + window, 2 * window + 1)

        def padded(name: str) -> Callable[[Any], Tensor]:
            def table(m: Any) -> Tensor:
                rows = resolve(m, f"{prefix}{name}", "hf")[0]
                return torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
            return table

        return RelativeKeys(padded("emb_rel_k"), vits_rows, values=padded("emb_rel_v"))
    if _shaw_blocks(core):  # Granite Speech's: Shaw's keys at i - j (only pairs in one block are visible)
        c, middle = int(getattr(core, "context_size")), (int(getattr(core, "rel_pos_emb").num_embeddings) - 1) // 2  # noqa: B009

        def granite_rows(t: int, s: int) -> Tensor:
            return (torch.arange(t)[:, None] - torch.arange(s)[None, :]).clamp(-c, c) + middle

        return RelativeKeys(lambda m: resolve(m, f"{prefix}rel_pos_emb.weight", "hf"), granite_rows)
    kind = getattr(core, "position_embeddings_type", None)
    if kind is None and _espnet_shift(core):  # FastSpeech2-Conformer's: the same terms, no switch
        kind = "relative"
    if kind == "relative_key" and isinstance(getattr(core, "distance_embedding", None), nn.Embedding):
        sizes: Any = core
        left, right = int(sizes.left_max_position_embeddings), int(sizes.right_max_position_embeddings)

        def shaw_rows(t: int, s: int) -> Tensor:
            return (torch.arange(s)[None, :] - torch.arange(t)[:, None]).clamp(-left, right) + left

        return RelativeKeys(lambda m: resolve(m, f"{prefix}distance_embedding.weight", "hf"), shaw_rows)
    pair = _pair_arg(core)
    if pair is not None:  # Bros's bbox_pos_emb, R[i, j] per query-key pair: the audit's own table, L x L pairs
        def pair_rows(t: int, s: int) -> Tensor:
            return torch.arange(t)[:, None] * _XL_LENGTH + torch.arange(s)[None, :]

        return RelativeKeys(_seeded_table(_XL_LENGTH * _XL_LENGTH, int(getattr(core, "attention_head_size"))),  # noqa: B009
                            pair_rows)
    if kind == "relative" and isinstance(getattr(core, "linear_pos", None), nn.Linear) and all(
            isinstance(getattr(core, n, None), Tensor) for n in ("pos_bias_u", "pos_bias_v")):
        names: tuple[str, ...] | None = ("linear_pos", "pos_bias_v", "pos_bias_u")
    else:  # Parakeet's and Nemotron's: the same terms under names of their own
        names = _xl_names(core)
    if names is None:
        return None
    proj, query_bias, content_bias = names[:3]

    def shifted_rows(t: int, s: int) -> Tensor:  # distances i - j, the queries the last t of the s positions
        return (_XL_LENGTH - 1) - (torch.arange(s - t, s)[:, None] - torch.arange(s)[None, :])

    return RelativeKeys(_seeded_table(2 * _XL_LENGTH - 1, int(getattr(core, proj).in_features)), shifted_rows,
                        proj=prefix + proj, query_bias=prefix + query_bias, content_bias=prefix + content_bias)


def _gated_bias(core: nn.Module, prefix: str) -> tuple[PositionBias, Callable[[Any, Tensor], Tensor]] | None:
    """WavLM's gated relative position bias: T5's bidirectional buckets of ``j - i`` (:func:`t5_buckets`, its
    ``num_buckets`` and ``max_distance``) read from ``rel_attn_embed (buckets, h)``, each query row of each head
    times the gate ``a (b c_h - 1) + 2`` of its input: ``x_i`` cut into heads, ``(a, b)`` the sigmoids of the sums of
    the first and last four outputs of ``gru_rel_pos_linear`` on its head's slice, ``c_h`` the ``gru_rel_pos_const``
    of the head. The bias as the first layer computes it (its model's later layers reuse the first layer's, gated by
    their own inputs)."""
    if not (isinstance(getattr(core, "gru_rel_pos_linear", None), nn.Linear)
            and isinstance(getattr(core, "gru_rel_pos_const", None), nn.Parameter)
            and isinstance(getattr(core, "rel_attn_embed", None), nn.Embedding)):
        return None

    def bias(m: Any, t: int, s: int) -> Tensor:
        owner = resolve(m, prefix.rstrip("."), "hf") if prefix else m
        distance = torch.arange(s)[None, :] - torch.arange(s - t, s)[:, None]
        buckets = t5_buckets(distance, int(owner.num_buckets), int(owner.max_distance))
        table: Tensor = owner.rel_attn_embed.weight.detach().double()
        return rearrange(table[buckets], "t s h -> h t s")

    def gate(m: Any, x: Tensor) -> Tensor:
        owner = resolve(m, prefix.rstrip("."), "hf") if prefix else m
        h = int(owner.num_heads)
        linear = owner.gru_rel_pos_linear
        weight, offset = linear.weight.detach().double(), linear.bias.detach().double()
        out = einsum(rearrange(x, "b t (h d) -> b h t d", h=h), weight, "b h t d, o d -> b h t o") + offset
        a, b = torch.sigmoid(out[..., :4].sum(-1)), torch.sigmoid(out[..., 4:].sum(-1))
        const: Tensor = owner.gru_rel_pos_const.detach().double().reshape(1, h, 1)
        return a * (b * const - 1.0) + 2.0

    return bias, gate


def _pair_arg(core: nn.Module) -> str | None:
    """The forward argument of a relative embedding per query-key pair that the queries meet before the logits are
    scaled (Bros's ``bbox_pos_emb``: its model's projected sinusoids of the box differences, ``(t, t, b, d)``, shared
    by the heads; ``logit[i, j] = (q_i . k_j + q_i . R[i, j]) / sqrt(d)``), read from the forward's source, or None."""
    source = _source(type(core).forward)
    found = re.search(r'(\w+) = torch\.einsum\("bnid,bijd->bnij", \(query_layer, (\w+)\)\)', source)
    if found is None or found.group(2) not in inspect.signature(type(core).forward).parameters:
        return None
    view = rf"{found.group(2)} = {found.group(2)}\.view\(seq_length, seq_length, batch_size, d_head\)\s+"
    added = rf"attention_scores = attention_scores \+ {found.group(1)}\s+attention_scores = attention_scores / math"
    if re.search(view, source) is None or re.search(added, source) is None:
        return None
    return found.group(2)


def _layout_arg(core: nn.Module) -> str | None:
    """The forward argument of LiLT's layout stream: the layout inputs ``L`` that ``layout_query`` and ``layout_key``
    project (heads of ``d // r``), whose logits ``ql . kl / sqrt(d // r)`` the class adds to the text logits
    ``q . k / sqrt(d)`` before its mask and softmax (the text output's softmax, the first output), read from the
    forward's source; or None."""
    source = re.sub(r"\s+", " ", _source(type(core).forward))
    found = re.search(r"self\.layout_key\((\w+)\)", source)
    forms = ("layout_attention_scores = torch.matmul(layout_query_layer, layout_key_layer.transpose(-1, -2))",
             "tmp_layout_attention_scores = layout_attention_scores / math.sqrt( self.attention_head_size // "
             "self.channel_shrink_ratio )",
             "attention_scores = tmp_attention_scores + tmp_layout_attention_scores",
             "attention_scores = attention_scores + attention_mask",
             "attention_probs = nn.Softmax(dim=-1)(attention_scores)",
             "outputs = (context_layer, layout_context_layer)")
    if (found is None or found.group(1) not in inspect.signature(type(core).forward).parameters
            or f"self.layout_query({found.group(1)})" not in source or not all(f in source for f in forms)
            or not all(isinstance(getattr(core, n, None), nn.Linear) for n in ("layout_query", "layout_key"))):
        return None
    return found.group(1)


def _layout_inputs(m: Any, prefix: str, t: int) -> Tensor:
    """The audit's own layout inputs for LiLT (seeded, float64, ``(t, e // r)``: the same for every sequence)."""
    width = int(resolve(m, f"{prefix}layout_query", "hf").in_features)
    seeded = torch.Generator().manual_seed(0)
    return torch.randn(_XL_LENGTH, width, dtype=torch.float64, generator=seeded)[:t]


def _layout_bias(prefix: str) -> Callable[[Any, int, int], Tensor]:
    """LiLT's layout logits over the audit's layout inputs, ``(h, t, s)`` in float64: ``ql . kl / sqrt(d // r)``."""

    def bias(m: Any, t: int, s: int) -> Tensor:
        core = resolve(m, prefix.rstrip("."), "hf") if prefix else m
        heads, d = int(core.num_attention_heads), int(core.attention_head_size) // int(core.channel_shrink_ratio)
        inputs = _layout_inputs(m, prefix, max(t, s))
        ql, kl = (nn.functional.linear(inputs, layer.weight.double(), None if layer.bias is None
                                       else layer.bias.double()) for layer in (core.layout_query, core.layout_key))
        ql = rearrange(ql[:t], "t (h d) -> h t d", h=heads)
        kl = rearrange(kl[:s], "s (h d) -> h s d", h=heads)
        return torch.einsum("htd,hsd->hts", ql, kl) / math.sqrt(d)

    return bias


def _espnet_shift(core: nn.Module) -> bool:
    """ESPnet's relative attention (FastSpeech2-Conformer): Transformer-XL's ``linear_pos``, ``pos_bias_u`` and
    ``pos_bias_v`` with no ``position_embeddings_type``, the content logits' queries plus ``pos_bias_u``, the
    positional ones' plus ``pos_bias_v`` times ``linear_pos`` of a forward argument, shifted by a method of the standard
    form (a zero column on the left, fold, drop the first row, keep the first ``P // 2 + 1`` columns: distances
    ``i - j`` of a table of ``t - 1 .. 1 - t``)."""
    source = re.sub(r"\s+", " ", _source(type(core).forward))
    methods = ((n, getattr(type(core), n)) for n in dir(type(core)) if not n.startswith("__"))
    shift = next((m for n, m in methods if inspect.isfunction(m) and f"self.{n}(" in source), None)
    body = re.sub(r"\s+", " ", _source(shift))
    standard = all(part in body for part in ("torch.cat([zero_pad, ", "[:, :, 1:].view_as(", "// 2 + 1]"))
    forms = ("(query_states + self.pos_bias_u)", "(query_states + self.pos_bias_v)", "self.linear_pos(")
    return (standard and all(form in source for form in forms) and isinstance(getattr(core, "linear_pos", None),
                                                                                nn.Linear)
            and all(isinstance(getattr(core, n, None), Tensor) for n in ("pos_bias_u", "pos_bias_v")))


def _xl_table_arg(core: nn.Module) -> str:
    """The forward argument that carries a Transformer-XL relative table: the one ``linear_pos`` maps in the
    forward itself (FastSpeech2-Conformer's ``pos_emb``), else ``relative_position_embeddings`` (Wav2Vec2-Conformer's,
    mapped in a function of its module)."""
    found = re.search(r"self\.linear_pos\((\w+)\)", _source(type(core).forward))
    named = found is not None and found.group(1) in inspect.signature(type(core).forward).parameters
    return found.group(1) if named and found is not None else "relative_position_embeddings"


def _xl_names(core: nn.Module) -> tuple[str, str, str, str] | None:
    """Transformer-XL's relative terms read from the forward's source, whatever their names (Parakeet's, Nemotron
    ASR's): ``(proj, query_bias, content_bias, argument)``: a linear map of a forward argument (the relative table
    its encoder passes, distances ``t-1 .. 1-t``), the queries plus ``bias_v`` multiplied by its output and shifted
    by a ``_rel_shift`` of the standard form (pad one column on the left, fold, drop the first row), and the queries
    plus ``bias_u`` the content logits' queries (passed to the attention function as ``query=``)."""
    source = _source(type(core).forward)
    params = list(inspect.signature(type(core).forward).parameters)[2:]
    proj = next(((n, a) for n, a in re.findall(r"= self\.(\w+)\((\w+)\)\n", source)
                 if a in params and isinstance(getattr(core, n, None), nn.Linear)), None)
    biased = dict((v, b) for v, b in re.findall(r"(\w+) = query_states \+ self\.(\w+)\.view\(", source))
    product = re.search(r"= (\w+) @ (\w+)\.permute\(0, 2, 3, 1\)", source)
    content = re.search(r"query=(\w+),", source)
    shift = re.sub(r"\s+", " ", _source(getattr(type(core), "_rel_shift", None)))
    standard = ("nn.functional.pad(attention_scores, pad=(1, 0))" in shift
                and "attention_scores[:, :, 1:].view(batch_size, num_heads, query_length, position_length)" in shift)
    if (proj is None or product is None or content is None or not standard or product.group(1) not in biased
            or content.group(1) not in biased):
        return None
    if not all(isinstance(getattr(core, biased[v], None), Tensor) for v in (product.group(1), content.group(1))):
        return None
    return proj[0], biased[product.group(1)], biased[content.group(1)], proj[1]


def _same_shape(cls: Any) -> bool:
    """A ``(query_tensor, key_tensor, value_tensor)`` class that views its key and value projections with the query
    input's shape (MobileBERT's ``hidden_shape = (*query_tensor.shape[:-1], -1, d)``, its keys ``self.key(
    key_tensor).view(*hidden_shape)``): keys of another length do not fit, so the three are one sequence; its model
    passes them the hidden states (without bottlenecks) or bottlenecks of them (the shared one as query and key)."""
    params = list(inspect.signature(cls.forward).parameters)[1:4]
    if tuple(params) not in _SEPARATE:
        return False
    body = _body(cls.forward)
    return (re.search(rf"input_shape = {params[0]}\.shape\[:-1\]", body) is not None
            and all(re.search(rf"\({name}\)\.view\(\*hidden_shape\)", body) for name in params[1:]))


def _bias_as_mask(cls: Any) -> bool:
    """Whether forward takes no mask but an ``attention_bias`` that it passes in the mask's place of its attention
    function (EsmFold2's diffusion attention: "the step-invariant per-head bias doubles as the additive attention
    mask", the pair bias with the padding folded in by its layer)."""
    signature = inspect.signature(cls.forward).parameters
    return "attention_bias" in signature and re.search(
        r"attention_interface\(\s*self,\s*\w+,\s*\w+,\s*\w+,\s*attention_bias,", _source(cls.forward)) is not None


def _padding_only(cls: Any, mask_arg: str) -> bool:
    """The forward refuses any mask but a key padding mask ``(b, 1, s)`` (FastSpeech2-Conformer's ``expected_size =
    (bsz, 1, q_len)``, a ValueError otherwise)."""
    source = _source(cls.forward)
    return re.search(r"expected_size = \(\w+, 1, \w+\)", source) is not None and (
        f"{mask_arg}.size() != expected_size" in source)


def _padding_ones(cls: Any, mask_arg: str) -> bool:
    """The class reads its mask as a key padding mask ``(b, s)`` of ones (real) and zeros (WavLM's
    ``key_padding_mask = attention_mask.ne(1)`` for ``F.multi_head_attention_forward``), any other shape refused."""
    return any(f"key_padding_mask = {mask_arg}.ne(1)" in _source(f) for f in vars(cls).values()
               if inspect.isfunction(f))
def _head_padding_only(cls: Any, mask_arg: str) -> bool:
    """The forward refuses any mask but a key padding mask per head ``(b, h, 1, s)`` (ProphetNet's ``expected_shape =
    (batch_size, self.num_attn_heads, 1, src_len)``, a ValueError otherwise)."""
    source = _source(cls.forward)
    return re.search(r"expected_shape = \(\w+, self\.\w+, 1, \w+\)", source) is not None and (
        f"{mask_arg}.size() != expected_shape" in source)


def _chunked_local(core: nn.Module) -> int | None:
    """The chunk length of Reformer's local attention (chunks of keys before and after each query chunk, a key
    padding mask ``(b, s)`` of ones and zeros only; a sequence no longer than one chunk is plain attention), or None
    for another class."""
    source = _source(type(core).forward)
    chunk = getattr(core, "chunk_length", None)
    if "do_standard_self_attention = sequence_length <= self.chunk_length" not in source or not isinstance(chunk, int):
        return None
    return chunk


def _deberta_scale(core: nn.Module) -> float | None:
    """DeBERTa's logit scale ``1 / sqrt(d (1 + #terms))``, whether its disentangled terms are on or not."""
    terms = getattr(core, "pos_att_type", None)
    if terms is None or not hasattr(core, "relative_attention"):
        return None
    sizes: Any = core
    d = int(getattr(core, "attention_head_size", 0) or sizes.all_head_size // sizes.num_attention_heads)
    return float((d * (1 + sum(term in ("c2p", "p2c") for term in terms))) ** -0.5)


def _separate_biases(core: nn.Module) -> bool:
    """DeBERTa's and LayoutLMv2's ``q_bias`` and ``v_bias``: the query and value biases as parameters of their own,
    added to the heads of a bias-free fused projection."""
    # the forward's, or a method's it calls (LayoutLMv2's fast_qkv: compute_qkv adds them)
    source = "".join(_source(f) for f in vars(type(core)).values() if inspect.isfunction(f))
    return all(isinstance(getattr(core, n, None), Tensor) for n in ("q_bias", "v_bias")) and (
        "self.q_bias" in source and "self.v_bias" in source)


def _window_table(module: nn.Module) -> tuple[str, tuple[int, int]] | None:
    """Swin's relative position bias (Swin, CLAP's audio encoder: a learned table ``relative_position_bias_table
    ((2 Wh - 1) (2 Ww - 1), h)``; Swin v2, Swin2SR: a ``continuous_position_bias_mlp`` of log-spaced coordinates):
    the path of the module that holds it, and the window ``(Wh, Ww)`` its tokens lie on (row-major); None for
    another table (BEiT's has three more rows, for its class token)."""
    for path, child in module.named_modules():
        table, window = getattr(child, "relative_position_bias_table", None), getattr(child, "window_size", None)
        if not isinstance(window, int | tuple | list):
            continue
        rows, cols = (window, window) if isinstance(window, int) else (int(window[0]), int(window[1]))
        if isinstance(table, Tensor) and table.shape[0] == (2 * rows - 1) * (2 * cols - 1):
            return path, (rows, cols)
        if isinstance(getattr(child, "continuous_position_bias_mlp", None), nn.Sequential):
            return path, (rows, cols)
    return None


def _continuous_bias(owner: Any, window: tuple[int, int]) -> Tensor:
    """Swin v2's bias ``16 sigmoid(MLP(log coordinates))`` per offset, its MLP (Linear, ReLU, Linear without bias)
    computed from its weights in float64."""
    mlp = owner.continuous_position_bias_mlp
    pretrained = tuple(int(n) for n in owner.pretrained_window_size)
    coords = log_coordinates(window, (pretrained[0], pretrained[1]))
    hidden = torch.relu(coords @ mlp[0].weight.detach().double().T + mlp[0].bias.detach().double())
    return 16 * torch.sigmoid(window_bias(hidden @ mlp[2].weight.detach().double().T, window))


def _cosine(core: nn.Module) -> bool:
    """Swin v2's cosine attention: unit queries and keys, each head's logits times ``exp(min(logit_scale, log
    100))``."""
    return isinstance(getattr(core, "logit_scale", None), Tensor) and "normalize(query_layer" in _source(
        type(core).forward)


def _keys_with_input(core: nn.Module, layout: Layout, memory_arg: str | None) -> bool:
    """Keys and values over the memory followed by the input's own tokens, the queries from the input alone
    (Idefics2's perceiver resampler: ``hidden_states = torch.concat([context, latents], dim=-2)``, then
    ``keys = self.k_proj(hidden_states)`` and ``values = self.v_proj(hidden_states)``)."""
    forward: Any = type(core).forward
    first = next(iter(list(inspect.signature(forward).parameters)[1:]), None)
    if memory_arg is None or first is None or layout.k is None or layout.v is None:
        return False
    source = _source(forward)
    found = re.search(rf"(\w+) = torch\.(?:cat|concat)\(\[{memory_arg}, {first}\], dim=(?:-2|1)\)\n", source)
    k, v = (str(p).rsplit(".", 1)[-1] for p in (layout.k, layout.v))
    return found is not None and all(f"= self.{n}({found.group(1)})" in source for n in (k, v)) and (
        f"self.{k}({memory_arg})" not in source)


#: the encoder tokens the audit gives a merged attention (T5Gemma 2's decoder): seeded, shared by the batch
_MERGED_MEMORY = 3


def _merged_memory(core: nn.Module) -> tuple[str, bool] | None:
    """Self-attention and cross-attention merged in one softmax (T5Gemma 2's decoder: its keys
    ``torch.cat([key_states, cross_key_states], dim=2)``, the encoder's keys projected by the same ``k_proj`` and
    ``v_proj``, normalised by ``k_norm``, not turned): ``(memory argument, whether k_norm applies to its keys)``."""
    source = _source(type(core).forward)
    found = re.search(r"\bkey_states = torch\.cat\(\[key_states, (\w+)\], dim=2\)", source)
    projected = re.search(r"\b(\w+) = self\.k_proj\((\w+)\)", source[:found.start()] if found else "")
    arg = next((a for n, a in re.findall(r"\b(\w+) = self\.k_proj\((\w+)\)", source)
                if found is not None and n == found.group(1)), None)
    if found is None or projected is None or arg is None or arg not in _MEMORY_ARGS:
        return None
    if f"self.v_proj({arg})" not in source or "value_states = torch.cat([value_states, " not in source:
        return None
    normed = f"{found.group(1)} = self.k_norm({found.group(1)})" in source
    turned = re.search(rf"apply_rotary\w*\([^)]*\b{found.group(1)}\b", source) is not None
    return None if turned else (arg, normed)


def _memory_tokens(width: int) -> Tensor:
    """The audit's own encoder states for a merged attention: ``(n, width)`` seeded, float64."""
    return torch.randn(_MERGED_MEMORY, width, dtype=torch.float64, generator=torch.Generator().manual_seed(7))


def _split_scale(module: nn.Module) -> float | None:
    """The logit scale of a class that multiplies its queries and its keys each by ``scaling`` and calls its
    attention function with ``scaling=1.0`` (OpenAI's privacy filter: ``d^-1/4`` twice): ``scaling**2``."""
    source = _forward_source(module)
    scaling = getattr(module, "scaling", None)
    both = all(f"{z}_states = {z}_states * self.scaling" in source for z in ("query", "key"))
    return float(scaling) ** 2 if both and "scaling=1.0" in source and isinstance(scaling, float | int) else None


def hf_causes(module: nn.Module) -> list[str]:
    """Known causes of a class computing something else than the reference (each FAIL of such a class is a true
    behaviour of it, and this names why)."""
    causes = []
    compact = re.sub(r"\s", "", _rotate_source(module))
    if "cat((x2,-x1)" in compact:
        causes.append("its rotate_half returns (x2, -x1), not (-x2, x1): every pair is turned by -p*theta, RoPE "
                      "the other way round (relative positions enter with the opposite sign); with the sine "
                      "negated it matches the reference")
    attention = "".join(_source(f) for c in {type(m) for m in module.modules()} for f in (
        getattr(_modeling(c), "eager_attention_forward", None), getattr(c, "_attn", None), c.forward)
        if c.__module__.startswith("transformers.models."))
    if re.search(r"mask_value = torch\.finfo[\s\S]*torch\.where\(causal_mask, attn_weights[^\n]*mask_value\)"
                 r"[\s\S]{0,400}?attn_weights = attn_weights \+ \w+", attention):
        causes.append("its attention fills the logits its own causal mask excludes with the dtype's minimum and "
                      "then adds the attention mask: a query row whose keys are all masked averages the values of "
                      "the keys left finite (the masked earlier keys, the unmasked later ones; min + min overflows "
                      "to -inf) instead of what a fully masked row gives; rows with an allowed key are exact")
    if re.search(r"\) \+ attention_mask\.unsqueeze\(1\)\.unsqueeze\(0\)\s*\n\s*attention_scores = attention_scores \+ "
                 r"attention_mask\.unsqueeze\(1\)\.unsqueeze\(0\)", attention):
        causes.append("it adds its attention mask twice (on the view of the scores, then again): every masked logit "
                      "gets twice the mask's value; with the dtype's minimum as the mask value that overflows to "
                      "-inf, and a query row whose keys are all masked gives NaN instead of what one mask gives (its "
                      "model's -100 window masks become -200); rows with an allowed key are exact")
    if re.search(r"masked_fill_?\((~\s*\w*mask\w*|\w*mask\w*\.logical_not\(\)), float\(\"-inf\"\)\)",
                 _forward_source(module)):
        causes.append("it fills the logits of masked keys with -inf (masked_fill(..., float('-inf'))): a query row "
                      "whose keys are all masked gives NaN; rows with an allowed key are exact")
    if re.search(r"(\w+) = \1 \* (\w+) \+ -1e4 \* \(1 - \2\)[\s\S]{0,200}?\1 = \1 \+ attention_mask", attention):
        causes.append("its attention sets the logits its own causal mask excludes to -1e4 (GPT-1's w * b - "
                      "1e4 (1 - b)) and then adds the attention mask: a query row whose earlier keys are all masked "
                      "averages the values of the later keys, and a logit below -1e4 loses to a later key (large "
                      "logits)")
    if _local_blocks(_core_of(module)) is not None and "torch.where(mask > 0, 0.0, -1e10)" in attention:
        causes.append("LongT5's local attention adds -1e10 to the logits of masked keys, over each query block's frame "
                      "of 3 blocks of keys (the zero padding past the sequence's ends included): a query row whose "
                      "keys are all masked weighs every value of its frame (in float32, where -1e10 swamps the "
                      "logits, their mean, the padding's zeros and the keys beyond the radius counted) instead of "
                      "what a fully masked row gives; rows with an allowed key are exact")
    eager = _source(getattr(_modeling(type(module)), "eager_attention_forward", None))
    body = eager.split(")", 1)[-1].split(":", 1)[-1] if eager else ""
    if eager and "attention_mask" not in re.sub(r'""".*?"""|#[^\n]*', "", body, flags=re.S) and (
            "eager_attention_forward" in _source(type(module).forward)):
        causes.append("its modeling module's eager_attention_forward takes attention_mask and never applies it: "
                      "under eager attention every mask (padding, causal) is ignored")
    return causes


def _rotary_arg(cls: Any) -> str | None:
    """The forward argument that carries the rotary tables: ``position_embeddings``, or a required argument of
    another name that the forward passes to its rotary apply function (Llama 4's vision ``freqs_ci``)."""
    signature = inspect.signature(cls.forward).parameters
    if "position_embeddings" in signature and _distances_arg(cls) != "position_embeddings":
        return "position_embeddings"
    source = _source(cls.forward)
    return next((name for name, p in signature.items() if p.default is inspect.Parameter.empty
                 and re.search(rf"\b\w*apply_rotary\w*\([^)]*\b{name}\b", source)), None)


def _complex_tables(module: nn.Module) -> bool:
    """Whether the rotary apply function the forward calls multiplies complex pairs by its table (Llama 4's
    ``view_as_complex``): the table is then ``exp(i p theta)``, not ``(cos, sin)``."""
    called = re.search(r"\b(\w*apply_rotary\w*)\(", _forward_source(module))
    return called is not None and "view_as_complex" in _source(getattr(_modeling(type(module)), called.group(1), None))


def _own_tables(module: nn.Module) -> bool:
    """Whether the audit makes the class's rotary tables itself: a packed (``cu_seqlens``) encoder, or a class
    whose forward takes rotary ``position_embeddings`` that no rotary class of its module makes from 1-D positions
    (an image-grid rotary, or none at all); not DETR's optional embeddings (audited without)."""
    signature = inspect.signature(type(module).forward).parameters
    if "cu_seqlens" in signature and signature["cu_seqlens"].default is inspect.Parameter.empty:
        return True
    arg = _rotary_arg(type(module))
    if arg is None:
        return False
    if arg != "position_embeddings":  # a table under a name of its own (Llama 4's vision freqs_ci): made here
        return True
    rotary = _rotary_class(module)
    if rotary is None:
        return not _positions_optional(type(module))
    forward: Any = getattr(rotary, "forward", None)
    params = inspect.signature(forward).parameters
    # or one that makes its tables from coordinates, not positions (EsmFold2's atom rotary: x/y/z and an atom's
    # space UID), which the audit cannot give as token positions
    return len(params) < 3 or not {"position_ids", "seq_len"} & set(params)


def _model_window(module: nn.Module) -> int | None:
    """A sliding window the model applies and the layer does not know of (Nemotron ASR's ``config.sliding_window``:
    its model's chunked mask and its sliding-window cache limit the left context; the layer has no window of its
    own, no ``layer_types``): the layer is audited under a plain causal mask with a full cache, and a note says so."""
    config = getattr(module, "config", None)
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or getattr(config, "layer_types", None) or any(
            getattr(m, "sliding_window", None) is not None for m in module.modules()):
        return None
    return window


def _needed_positions(cls: Any) -> str | None:
    """The optional position argument of a DETR-style class that keeps its input for the values only when the
    positions are given (``if object_queries is not None: hidden_states_original = hidden_states``; DAB-DETR's,
    Table Transformer's, Mask2Former's and OneFormer's attention): without it the value projection reads an unbound
    name and raises; the audit passes zeros (the positions then add nothing: plain attention)."""
    found = re.search(r"if (\w+) is not None:\s+hidden_states_original = hidden_states\b", _source(cls.forward))
    return found.group(1) if found is not None and found.group(1) in inspect.signature(cls.forward).parameters \
        else None


def _patch_prefix(module: nn.Module) -> int | None:
    """DINOv3's rotary on the patch tokens only: its apply function turns the last rows of the tables' length and
    leaves the class and register tokens before them (``1 + num_register_tokens``) unturned; None otherwise."""
    if "num_prefix_tokens" not in _source(getattr(_modeling(type(module)), "apply_rotary_pos_emb", None)):
        return None
    return 1 + int(getattr(getattr(module, "config", None), "num_register_tokens", 0) or 0)


def _input_norms(core: nn.Module) -> list[str]:
    """The norms the class applies to its inputs before its projections (Perceiver's ``hidden_states =
    self.layernorm1(hidden_states)``, BLT's cross-attention ``self.q_norm(hidden_states)`` and
    ``self.k_norm(cross_attention_states)`` over the model width): a pre-norm inside the attention class, bypassed
    as a block's Add & Norm is, so the norm itself is not tested."""
    forward: Any = type(core).forward
    names = [n for n in inspect.signature(forward).parameters if n != "self"]
    source = _source(forward)
    projections = [m.start() for m in re.finditer(r"self\.(\w+)\(", source)
                   if _is_projection(getattr(core, m.group(1), None))]
    first = min(projections, default=len(source))
    found = []
    for call in re.finditer(r"self\.(\w+)\((\w+)\)", source):
        norm = getattr(core, call.group(1), None)
        inputs = names[:1] + list(_MEMORY_ARGS) + list(_perceiver(type(core)) or ())
        if (call.start() < first and call.group(2) in inputs and isinstance(norm, nn.Module)
                and (isinstance(norm, nn.LayerNorm | nn.RMSNorm) or "Norm" in type(norm).__name__)
                and not any(_is_projection(c) for c in norm.modules())):
            found.append(call.group(1))
    return list(dict.fromkeys(found))


def _block_input_norms(module: nn.Module) -> list[str]:
    """The norms a block applies to its input before it calls its attention core, the input replaced by its norm
    (Reformer's ``hidden_states = self.layer_norm(hidden_states)`` before ``self.self_attention(...)``: no residual of
    the input can follow): a pre-norm, bypassed as the core's are."""
    try:
        layout = find_layout(module, _norm_paths(module))
    except AuditUsageError:
        return []
    if not layout.core:
        return []
    source = _source(type(module).forward)
    call = source.find(f"self.{layout.core.split('.')[0]}(")
    first = next((n for n in inspect.signature(type(module).forward).parameters if n != "self"), "")
    return [n for n in _input_norms(module)
            if (found := re.search(rf"\b{first} = self\.{n}\({first}\)", source)) is not None and found.start() < call]


def _is_projection(obj: Any) -> bool:
    weight = getattr(obj, "weight", None)
    return isinstance(obj, nn.Module) and isinstance(weight, Tensor) and weight.ndim == 2


#: the local radius LongT5's local attention is built with (its config's default, 127, is longer than the audit's
#: sequences, which would then all fit in one block)
_LOCAL_RADIUS = 2


def _local_blocks(core: nn.Module) -> int | None:
    """The block length of LongT5's local attention (blocks of ``local_radius + 1`` tokens, each query block against
    its 3-block frame of keys, a mask of the model's block form ``(b, 1, blocks, block_len, 3 block_len)``), or None
    for another class (the transient-global one takes a key padding mask and builds the blocks itself)."""
    source = _source(type(core).forward)
    block = getattr(core, "block_len", None)
    if "_concatenate_3_blocks(" not in source or "_get_local_attention_mask(" in source or not isinstance(block, int):
        return None
    return block


def _sliding_chunks(core: nn.Module) -> int | None:
    """The one-sided window of Longformer's sliding-chunk attention (Longformer's, LED's encoder's): each query sees
    the keys within that many positions; None for another class."""
    window = getattr(core, "one_sided_attn_window_size", None)
    if "_sliding_chunks_query_key_matmul(" not in _source(type(core).forward) or not isinstance(window, int):
        return None
    return window


def _local_frames(core: nn.Module, keep: Tensor, dtype: torch.dtype) -> Tensor:
    """The audit's mask ``keep (b, h, t, t)`` in LongT5's block form ``(b, h, blocks, block_len, 3 block_len)``, as
    its model's ``_get_local_attention_mask`` builds it from a key padding mask: each query block's row of its 3-block
    frame (the keys of the block before, its own, the one after; past the sequence's ends: masked), then the model's
    own ``_mask_local_attention_mask`` (keys farther than the radius masked); ones attend, zeros are masked."""
    block = _local_blocks(core)
    assert block is not None
    b, h, t, s = keep.shape
    blocks = -(-t // block)
    padded = keep.new_zeros(b, h, blocks * block, (blocks + 2) * block)
    padded[:, :, :t, block:block + s] = keep
    columns = torch.arange(blocks)[:, None] * block + torch.arange(3 * block)  # block n: keys (n - 1) bl .. (n + 2) bl
    rows = rearrange(padded, "b h (n l) k -> b h n l k", l=block)
    frames = rows.gather(-1, columns[None, None, :, None, :].expand(b, h, blocks, block, 3 * block))
    local: Tensor = _modeling(type(core))._mask_local_attention_mask(frames, block)
    return local.to(dtype)


def _added_biases(core: nn.Module) -> list[str]:
    """Optional forward arguments the class adds to its attention logits as they are (LayoutLMv2's ``rel_pos`` and
    ``rel_2d_pos``: relative and spatial biases its encoder computes from the token and box positions), without
    which it raises: passed as zeros (what they add is not tested)."""
    source = _source(type(core).forward)
    signature = inspect.signature(type(core).forward).parameters
    if _local_blocks(core) is not None:  # LongT5's local attention: its own bias and the mask, given None
        return []
    found = re.findall(r"\b\w*scores\w* \+= (\w+)\n", source)
    # a required bias added as ``score = score + position_bias`` (CPM-Ant's segment-relative bias)
    required = [n for n in re.findall(r"\b(\w*score\w*) = \1 \+ (\w+)\n", source)
                if n[1] in signature and signature[n[1]].default is inspect.Parameter.empty]
    return [n for n in dict.fromkeys(found) if n in signature and signature[n].default is None
            and n not in _PROVIDED and n not in ("attention_mask", "mask")] + [
        n for _, n in required if n not in _PROVIDED and n not in ("attention_mask", "mask")]


def _nullable(cls: Any) -> list[str]:
    """Required arguments after the input passed as None: those the forward has a branch for None for (LUKE's
    ``entity_hidden_states``: its model passes None when there are no entities, and the class is then plain attention
    over the words), and those it only passes on to its own submodules (I-BERT's ``hidden_states_scaling_factor``,
    which its quantized layers read only with ``quant_mode``, off in its default config: its model then passes None);
    not a mask argument (the audit passes its own)."""
    signature = inspect.signature(cls.forward).parameters
    source = _source(cls.forward)
    body = source.split(")", 1)[-1] if source else ""
    return [n for n, p in list(signature.items())[2:] if p.default is inspect.Parameter.empty
            and n not in _PROVIDED and n not in ("attention_mask", "mask") and n != _distances_arg(cls)
            and (re.search(rf"\bif {n} is None:", source) is not None or _passed_on(body, n))]


def _passed_on(body: str, name: str) -> bool:
    """Whether every use of ``name`` in ``body`` (a forward's code) is an argument of a call to ``self.<child>(``."""
    uses = [m.start() for m in re.finditer(rf"(?<![\w.]){name}\b(?!\s*=[^=])", body)]
    if not uses:
        return False
    for at in uses:
        depth, i = 0, at - 1
        while i >= 0 and not (body[i] == "(" and depth == 0):
            depth += {")": 1, "(": -1}.get(body[i], 0)
            i -= 1
        if i < 0 or re.search(r"\bself\.\w+$", body[:i]) is None:
            return False
    return True


def _perceiver(cls: Any) -> tuple[str, str] | None:
    """A Perceiver resampler's ``(queries, memory)`` arguments: the forward concatenates the memory and the latents
    along the tokens (Evolla's ``kv_input = torch.cat((x, latents), dim=-2)``, IDEFICS 2's ``torch.concat([context,
    latents], dim=-2)``) and projects its keys and values from that, its queries from the latents alone."""
    source = _source(cls.forward)
    signature = inspect.signature(cls.forward).parameters
    found = re.search(r"(\w+) = torch\.(?:cat|concat)\([\[(](\w+), (\w+)[\])], dim=-2\)", source)
    if found is None or not all(n in signature for n in found.group(2, 3)):
        return None
    joined, memory, queries = found.group(1, 2, 3)
    if not (re.search(rf"self\.\w+\({queries}\)", source) and re.search(rf"self\.\w+\({joined}\)", source)):
        return None
    return queries, memory


def _key_mask_only(cls: Any, mask_arg: str) -> bool:
    """The forward reads its mask as one row of ones and zeros per key, ``mask[:, None, None, :]`` (Evolla's
    compressor)."""
    return re.search(rf"\b{mask_arg}\[:, None, None, :\]", _source(cls.forward)) is not None


def _positions_optional(cls: Any) -> bool:
    """``forward``'s ``position_embeddings`` defaults to None and its code tests for None (DETR: sine embeddings its
    model adds to the query and key inputs; without them the class is plain attention)."""
    signature = inspect.signature(cls.forward).parameters
    return ("position_embeddings" in signature and signature["position_embeddings"].default is None
            and re.search(r"position_embeddings is (not )?None", _source(cls.forward)) is not None)


def _content_notes(module: nn.Module) -> list[str]:
    """What the audit of a DETR decoder's content and position projections (:func:`content_layout`) leaves
    untested: the positions (zeros), the per-head half they concatenate, the optional ones left None, the position
    projections the layer does not have."""
    if content_layout(module) is None:
        return []
    cls = type(module)
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
    signature = inspect.signature(cls.forward).parameters
    left = [n for n in re.findall(r"self\.\w*pos\w*proj\((\w+)\)", source) if n in signature and n not in zeros]
    notes += [f"forward's optional {name} (its model passes them to the first decoder layer only) left None, as "
              f"for the other layers: the first layer's added positions are not tested" for name in dict.fromkeys(left)]
    notes += [f"{name} is None in this layer (is_first=False and keep_query_pos=False, as in its model's layers "
              f"after the first): the query positions the first layer adds are not tested"
              for name in re.findall(r"self\.(\w*pos\w*proj) = None", _source(cls))
              if getattr(module, name, None) is None]
    return notes


def _width_rotary(cls: Any) -> bool:
    """Optional rotary tables that turn q and k across the whole model width before the heads are split
    (EfficientLoFTR's ``view(batch_size, seq_len, -1, dim)`` then ``apply_rotary_pos_emb``: each head meets its own
    slice of a 2-D table, other frequencies per head), which the reference does not model."""
    source = _source(cls.forward)
    return _positions_optional(cls) and re.search(
        r"\.view\(batch_size, seq_len, -1, dim\)[\s\S]*apply_rotary_pos_emb", source) is not None


def hf_notes(module: nn.Module) -> list[str]:
    """True behaviours of the class, as its model calls it, that pass the audit but a user should know."""
    notes = []
    signature = inspect.signature(type(module).forward).parameters
    core = _core_of(module)
    if "position_embeddings" in signature and _rotary_class(module) is None and _positions_optional(type(module)):
        notes.append("forward takes optional position_embeddings and its module has no rotary class (DETR-style "
                     "embeddings added to the inputs): audited with none passed, so what they add is not tested")
    elif "position_embeddings" in signature and _width_rotary(type(module)):
        notes.append("forward takes optional rotary tables that turn q and k across the whole model width before "
                     "the heads are split (each head its own slice of its model's 2-D table): audited with none "
                     "passed, as its model calls it for cross-attention, so its self-attention's rotary is not "
                     "tested")
    elif ("position_embeddings" in signature and (_xl_names(module) or ("",) * 4)[3] != "position_embeddings"
            and hf_spec(module).rotary is None and not _heads_as_positions(type(module))
            and _distances_arg(type(module)) != "position_embeddings"):
        notes.append("forward takes position_embeddings and ignores them with this config (audited without "
                     "positions)")
    forward_params = list(signature)[1:4]
    if tuple(forward_params) in _SEPARATE and "position_embeddings" in signature and (
            signature["position_embeddings"].default is inspect.Parameter.empty):
        notes.append("a (query, key, value) class with rotary tables: audited as its model's self-attention (query = "
                     "key = value, the keys turned at the queries' positions), its 2-D axial tables made from the "
                     "audit's grid positions; a cross-attention use of it (keys of another width or grid, keys left "
                     "unturned) is not tested")
    arg = _rotary_arg(type(module))
    if arg not in (None, "position_embeddings"):
        kind = "complex turns exp(i p theta)" if _complex_tables(module) else "cos and sin"
        notes.append(f"forward takes its rotary table as {arg} ({kind}): audited with the audit's own 1-D table "
                     f"(positions 0.., every token turned, shared by the batch), so its model's table (2-D patch "
                     f"positions, a class token left unturned) is not tested")
    if "attention_mask" in signature and _mask_none(_body(type(module).forward)) and not re.search(
            r"(?<![\w.])attention_mask\b(?!\s*=[^=])", _body(type(module).forward)):
        notes.append("forward takes attention_mask and passes None to its attention function instead (its model "
                     "passes none): audited without masks")
    if getattr(module, "scale", None) is False and "if self.scale:" in _source(type(module)):
        notes.append("built with its constructor's default scale=False (logits not divided by sqrt(d)); its model "
                     "passes scale=True, so that path is not tested")
    window = _model_window(module)
    if window is not None and hf_spec(module).decode is not None:
        notes.append(f"its model limits each query to a window of {window} keys (config.sliding_window, by its mask "
                     f"and its sliding-window cache); the layer has no window of its own and is audited under a plain "
                     f"causal mask with a full cache, so that window is not tested")
    local = _local_blocks(core)
    if local is not None:
        notes.append(f"LongT5's local attention built with local_radius {local - 1} (blocks of {local}; its config's "
                     f"default 127 would fit the audit's short sequences in one block), given its mask in its model's "
                     f"block form (each query block's row of its 3-block frame, the keys beyond the radius masked by "
                     f"the model's _mask_local_attention_mask); other radii are not tested")
    sliding = _sliding_chunks(core)
    if sliding is not None:
        notes.append(f"Longformer's sliding-chunk attention built with attention_window {2 * sliding} (each query sees "
                     f"the keys within {sliding}; its config's default 512 would cover the audit's sequences), called "
                     f"as its model calls it: the input padded to a multiple of the window (the padding keys masked "
                     f"with the dtype's minimum, their rows zeroed and dropped); its mask is a key padding mask (b, s) "
                     f"of its own values, so it is audited without the audit's masks (their padding, and the "
                     f"(b, 1, t, s) masks it cannot take, are not tested); no global tokens (is_global_attn=False), so "
                     f"the global attention and its query_global, key_global, value_global are not tested; other "
                     f"windows are not tested")
    chunked = _chunked_local(core)
    if chunked is not None:
        notes.append(f"Reformer's local attention: audited on sequences of one chunk ({chunked} tokens) at most, where "
                     f"it is plain attention, so its chunks ({core.num_chunks_before} before, {core.num_chunks_after} "
                     f"after each query chunk) and its model's padding to a multiple of the chunk are not tested; its "
                     f"mask is a key padding mask (b, s) only, so it is audited without masks (their padding is not "
                     f"tested)" + ("" if core.is_decoder else "; built as an encoder (is_decoder=False), so its causal "
                                   "mask is not tested"))
    if _same_shape(type(module)) or _same_shape(type(core)):
        residual = ", and as layer_input, its block's residual," if "layer_input" in signature else ""
        notes.append(f"a (query_tensor, key_tensor, value_tensor) class that views its keys and values with the "
                     f"queries' shape: audited as self-attention, the input passed as all three{residual} as its model "
                     f"passes its hidden states without bottlenecks; with them (outside the class) the model passes "
                     f"the shared bottleneck's output as query and key and the hidden states as value, a use not "
                     f"tested")
    if _bias_as_mask(type(module)):
        notes.append("forward takes attention_bias, which it adds to its logits as its mask (its layer's per-head pair "
                     "bias with the padding folded in): audited with the audit's masks passed as it, so a pair bias "
                     "is tested only as an additive mask is")
    coordinates = _rotary_class(module)
    rotary_forward: Any = getattr(coordinates, "forward", None)
    if (_own_tables(module) and coordinates is not None and _rotary_arg(type(module)) == "position_embeddings"
            and len(params := inspect.signature(rotary_forward).parameters) >= 3
            and not {"position_ids", "seq_len"} & set(params)):
        notes.append(f"its model's rotary class ({coordinates.__name__}) makes its cos/sin from coordinates, "
                     f"not token positions: audited with the audit's own 1-D tables (positions 0.., base "
                     f"{_PACKED_THETA:g}), so its model's tables are not tested, the class's turn of q and k is")
    if _clamps_always(module) and getattr(getattr(getattr(module, "config", None), "attn_config", None), "clip_qkv",
                                          0) is None and getattr(module, "clip_qkv", None) == _RELEASED_CLIP:
        notes.append(f"its config's default clip_qkv=None makes forward raise (torch.clamp with neither bound; its "
                     f"released checkpoints set {_RELEASED_CLIP:g}): built with clip_qkv={_RELEASED_CLIP:g}, the "
                     f"clamp of q, k and v modelled")
    if getattr(getattr(module, "config", None), "audit_default_rope", False):
        notes.append(f"its config's default holds no rotary parameters for its layer types (rope_parameters = {{}}: "
                     f"its model's rotary class raises a KeyError): built with default rotary parameters (base "
                     f"{_PACKED_THETA:g}) for each type, audited with text positions (every M-RoPE axis equal), so "
                     f"its checkpoints' own parameters (a NoPE layer type, M-RoPE image positions) are not tested")
    if any(getattr(m, "use_clipped_linears", None) is False for m in module.modules()):
        notes.append("its projections' optional clipping (use_clipped_linears: inputs and outputs clamped to bounds "
                     "read from a checkpoint) is off in its default config: audited without it, so the clamps are "
                     "not tested")
    if _mixture_of_attention(module):
        notes.append("JetMoE's mixture of attention built with one expert chosen for every token (num_local_experts = "
                     "num_experts_per_tok = 1: its gate is 1, its routing exact): the expert's query and output "
                     "projections, the shared keys and values and the output bias are tested; the routing of its "
                     "checkpoints (top-k of several experts, their softmax gates, the keys and values repeated per "
                     "chosen expert) is not")
    needed = _needed_positions(type(module))
    if needed is not None:
        notes.append(f"forward's {needed} defaults to None, yet without them its value projection reads a name only "
                     f"they set (UnboundLocalError; its model always passes them): audited with zero {needed}, so "
                     f"what they add is not tested")
    notes += _content_notes(module)
    if _gated_block(module):
        heads, width = int(getattr(module, "num_attention_heads")), int(getattr(module, "hidden_size"))  # noqa: B009
        notes.append("a gated cross-attention block (x + tanh(gate_attention) * attention, then + tanh(gate_ffw) * "
                     "feed-forward): audited with its residual subtracted, tanh(gate_attention) folded into the "
                     "output projection, gate_ffw zeroed and attention_norm bypassed, so the feed-forward and the "
                     "norm are not tested; keys and values of the protein modality only, as its model builds it; "
                     "its query and key masks (rows of ones and zeros, filled with the dtype's minimum) are not "
                     "tested (audited without masks)")
        notes.append(f"its scale is num_attention_heads**-0.5 (self.scale, read as the class uses it), not "
                     f"head_dim**-0.5: the same here ({heads} heads of {width // heads}), not in a model whose head "
                     f"count and head size differ")
    mask_arg = next((n for n in ("attention_mask", "mask", "attn_mask") if n in signature), "attention_mask")
    if _key_mask_only(type(module), mask_arg):
        notes.append(f"its {mask_arg} is a key padding mask (b, s) of ones and zeros (the masked logits filled with "
                     f"-1e4), which no mask of the audit's (b, 1, t, s) form reaches: audited without masks (ones "
                     f"passed), so its masking is not tested")
    if projected_layout(module) is not None:
        notes.append("takes its queries, keys and values already projected (its decoder layer's content and position "
                     "projections are outside the class, audited with the layer classes): audited with identity "
                     "projections over separate query, key and value inputs")
    notes += [f"normalises its input with {name} before its projections (a pre-norm inside the class): audited with "
              f"it bypassed, as a block's Add & Norm is, so the norm is not tested"
              for name in _input_norms(core) + _block_input_norms(module)]
    shipped = _shipped_spec(module, False)
    if shipped is None or shipped.alibi is None:  # (MPT's shipped spec passes its position_bias: the ALiBi it models)
        notes += [f"forward adds {name} to its logits, a bias its model computes outside the class: audited with "
                  f"zeros passed, so what it adds is not tested" for name in _added_biases(core)]
    pair_arg, layout_arg = _pair_arg(core), _layout_arg(core)
    notes += [f"forward requires {name} and takes None for it (LUKE's model passes None without entities, I-BERT's "
              f"without quant_mode): audited with None, so what the class computes with a value is not tested"
              for name in _nullable(type(module)) if name not in (pair_arg, layout_arg)]
    if layout_arg is not None:
        notes.append(f"LiLT's layout stream: its logits ql . kl / sqrt(d // r) (layout_query and layout_key of its "
                     f"model's {layout_arg}) added to the text logits are audited over the audit's "
                     f"own seeded layout inputs, the same for every sequence; the stream's own output (its context "
                     f"over layout_value, the class's second output, and its block's layout_output) is not tested")
    if pair_arg is not None:
        notes.append(f"forward adds q_i . R[i, j] to its logits before scaling them, R its model's "
                     f"{pair_arg} (t, t, b, d): audited with the audit's own seeded table, the same "
                     f"for every sequence of the batch, so its model's box embeddings are not tested")
    ratios = ("sr_ratio", "sequence_reduction_ratio", "sequences_reduction_ratio", "spatial_reduction_ratio")
    if any(getattr(m, name, None) == 1 for m in module.modules() for name in ratios):
        notes.append("built with a key reduction ratio of 1, as its model's last stage is (every key): the earlier "
                     "stages' strided convolution that pools the keys is not tested")
    if getattr(module, "query_stride", None) == 1 and getattr(module, "use_mask_unit_attn", None) is False:
        notes.append("built with query_stride 1 and use_mask_unit_attn False (global attention over every token, as "
                     "its model's later stages): the query max-pooling of a stage's first layer and the mask-unit "
                     "windows of the early stages are not tested")
    topk = getattr(getattr(module, "config", None), "index_topk", None)
    if isinstance(getattr(module, "indexer", None), nn.Module) and isinstance(topk, int):
        notes.append(f"DeepSeek sparse attention: its indexer keeps the {topk} best-scored keys of each query; the "
                     f"audit's sequences are shorter, so every key is kept and it is audited as the dense latent "
                     f"attention: the selection itself is not tested")
    if any(getattr(m, "relative_attention", None) is False and hasattr(m, "pos_att_type") for m in module.modules()):
        notes.append("DeBERTa's disentangled attention is off in its default config (relative_attention=False): "
                     "audited as plain attention, so the content-to-position and position-to-content terms of the "
                     "released checkpoints are not tested")
    if _decomposed(module) is not None:
        notes.append("decomposed relative positions on the audit's image of one row of t patches: the width table is "
                     "tested at every distance, the height table only at distance 0 (a term constant along each "
                     "query's row, which the softmax cancels)")
    if any(_padding_only(type(m), "attention_mask") for m in module.modules()):
        notes.append("forward takes only a key padding mask (b, 1, s) (0 = padding: its logits filled with the dtype's "
                     "minimum, its weights zeroed after the softmax) and refuses the audit's (b, 1, t, s) masks: "
                     "audited without masks, so its padding (and a fully padded row's zero output) is not tested")
    if any(_head_padding_only(type(m), "attention_mask") for m in module.modules()):
        notes.append("forward takes only a key padding mask per head (b, h, 1, s), added to its logits, and refuses "
                     "the audit's (b, 1, t, s) masks: audited without masks, so its padding is not tested; nor is "
                     "its cache (no causal mask can reach it; its model uses it as the encoder's self-attention, "
                     "without a cache, and the decoder's cross-attention)")
    if _relative_keys(module, "") is not None and _espnet_shift(module):
        notes.append("Transformer-XL relative terms on the audit's own table (seeded rows for distances t-1 .. 1-t, "
                     "passed as pos_emb): its encoder's sinusoidal table is not tested")
    if _shaw_blocks(module):
        notes.append(f"block-local attention built with blocks of {module.context_size} tokens (its "
                     f"models' 200 or 128), so that the audit's sequences span several blocks; Shaw's relative keys "
                     f"on the distances its encoder computes (clamp(i - j, -c, c) + the table's middle row)")
    if _padding_ones(type(module), "attention_mask"):
        notes.append("forward takes only a key padding mask (b, s) of ones and zeros (key_padding_mask = "
                     "attention_mask.ne(1)) and refuses the audit's (b, 1, t, s) masks: audited without masks, so its "
                     "padding is not tested")
    if _gated_bias(module, "") is not None:
        notes.append("its gated relative position bias as the first layer computes it (rel_attn_embed); its model's "
                     "later layers are passed the first layer's bias (position_bias), which the audit does not pass")
    if _shaw_blocks(module) and "attention_mask" in inspect.signature(type(module).forward).parameters:
        notes.append("forward takes only a key padding mask (b, s), reshaped into its blocks, and no mask of the "
                     "audit's (b, 1, t, s) form: audited without masks, so its padding is not tested (the padding "
                     "of the last block it adds itself is)")
    layout = None
    with contextlib.suppress(AuditUsageError):
        layout = find_layout(module, _norm_paths(module))
    memory_arg = _memory_arg(module, core, signature, None)
    if layout is not None and _keys_with_input(core, layout, memory_arg):
        window = getattr(core, "sliding_window", None)
        if window is not None:
            notes.append(f"keys over its memory and its input: the sliding window of {window} keys (its model's "
                         f"bidirectional sliding-window mask, over absolute positions) is not applied by the audit "
                         f"and is not tested")
        if any(n in signature for n in ("cache", "past_key_values", "past_key_value")):
            notes.append("keys over its memory and its input: audited in one call without a cache, so its cache "
                         "path is not tested")
    if _merged_memory(core) is not None:
        notes.append(f"self-attention and cross-attention merged in one softmax: audited as its decoder's "
                     f"self-attention beside the audit's own {_MERGED_MEMORY} encoder tokens (seeded, the same for "
                     f"every batch element, every one visible), so its encoder mask and varied encoder inputs are not "
                     f"tested")
    if _heads_as_positions(type(module)):
        notes.append("its model passes the head index as the rotary position (position_ids = arange(num_heads), "
                     "cos/sin unsqueezed at dim 2): each head is turned by one angle at every position, the turn "
                     "cancels in q.k, and the attention is position-free")
    return notes


def _layout_reads(module: nn.Module) -> set[str]:
    """The direct children a classic layout reads (a block's attention and output modules, its norms)."""
    try:
        layout = find_layout(module, _norm_paths(module))
    except AuditUsageError:
        return set()
    return layout.reads() | ({"relative_attention_bias"} if layout.relative_bias else set()) | {"q_attn"}


def hf_limits(module: nn.Module) -> list[str]:
    """What this class computes that the reference does not model (the sweep reports such a class as recognised but
    not audited: its FAILs would be about the reference, not the class)."""
    config = getattr(module, "config", None)
    limits = []
    signature = inspect.signature(type(module).forward).parameters
    # a class given the audit's own 1-D tables (packed encoders, image-grid rotaries): its rope type is not read
    uses_rotary = "position_embeddings" in signature and not _own_tables(module)
    kind = _rope_type(module)
    if uses_rotary and kind not in _STATIC_ROPE and _mrope(module) not in (_AXIAL, _AXIAL_WH, _AXIAL_BLOCKS):
        limits.append(f"rope_type {kind!r} (" + ("frequencies recomputed from each call's length"
                                                 if kind in ("dynamic", "longrope") else
                                                 "frequencies of a kind the reference does not read") + ")")
    first = re.search(r"\w+\[:, :(\d+)\], \w+\[:, :\1\] = apply_rotary", _forward_source(module))
    if first is not None:  # Qwen2.5-Omni's DiTAttention: "only first head is applied with RoPE"
        limits.append(f"rotary on the first {first.group(1)} head(s) only, the others unturned")
    for name in ("attn_logit_softcapping", "logit_softcapping"):
        if getattr(config, name, None) and _softcap(module) is None:
            limits.append(name)
    if uses_rotary and "mrope_section" in _rope_params(module) and _mrope(module) is None:
        limits.append("M-RoPE sections of another layout than consecutive blocks (Qwen3-VL's interleaved): audited "
                      "with text positions only (1-D rotary)")
    if getattr(module, "sinks", None) is not None and _sinks(module) is None:
        limits.append("attention sinks")
    clip = _clip_path(module)
    if clip is not None and _clip_qkv(module) is None and resolve(module, clip, type(module).__name__) is not None:
        limits.append(f"{clip} clamps the normalised queries and keys (after the q/k norms)")
    gate = _output_gate(module)
    relative = _relative_keys(module, "")
    latent = [] if _latent(module) is None else [getattr(_LATENT, f) for f in ("q", "q_a", "q_norm", "q_b", "kv_a",
                                                                              "kv_norm", "kv_b")]
    read = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "rotary_emb", *_norm_paths(module), *latent,
            _v_norm(module, "") or "", *_input_norms(module),
            *_layout_reads(module), gate.proj if gate is not None else "", _sub_norm(module) or "",
            *(("pos_key_proj", "pos_query_proj", "pos_proj", "pos_q_proj") if _disentangled(module, "") else ()),
            *(("continuous_position_bias_mlp",) if _window_table(module) is not None else ()),
            *(("gru_rel_pos_linear", "rel_attn_embed") if _gated_bias(module, "") is not None else ()),
            *(("distance_embedding", "rel_pos_emb", relative.proj or "") if relative is not None else ()),
            *(_GATED_READS if _gated_block(module) else ()),
            *(("query_global", "key_global", "value_global") if _sliding_chunks(module) is not None else ()),
            *(("layout_query", "layout_key", "layout_value") if _layout_arg(module) is not None else ()),
            *(("experts", "kv_proj") if _mixture_of_attention(module) else ())}
    for name, child in module.named_children():
        # dropout of any class (DeBERTa's StableDropout): off in eval mode
        # (a softmax over the keys as a module of its own: CPM-Ant's nn.Softmax(dim=-1))
        inert = isinstance(child, nn.Dropout | nn.Identity) or (isinstance(child, nn.Softmax) and child.dim == -1)
        if name not in read and not inert and not type(child).__name__.endswith("Dropout"):
            limits.append(f"submodule {name!r} ({type(child).__name__}) the spec does not read")
    # parameters of the class itself (attention sinks, differential lambdas, decomposed relative position tables)
    own = {"sinks"} if _sinks(module) is not None else set()
    if _query_scale(module) is not None:
        own |= {"scaling"}
    if _cosine(module):
        own |= {"logit_scale"}
    if gate is not None and gate.bias is not None:
        own |= {gate.bias}
    if relative is not None:
        own |= {relative.query_bias or "", relative.content_bias or "", "emb_rel_k", "emb_rel_v"}
    if _separate_biases(module):
        own |= {"q_bias", "v_bias"}
    if _gated_bias(module, "") is not None:
        own |= {"gru_rel_pos_const"}
    if _decomposed(module) is not None:
        own |= {"rel_pos_h", "rel_pos_w"}
    if _differential(module) is not None:
        own |= {n for n, _ in module.named_parameters(recurse=False) if n.startswith("lambda")}
    if _gated_block(module):
        own |= set(_GATED_OWN)
    limits += [f"parameter {name!r} the spec does not read" for name, _ in module.named_parameters(recurse=False)
               if name not in own]
    return limits


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

    The classic layouts too (:mod:`._hf_layouts`): ``query/key/value`` (BERT), ``q/k/v/o`` with T5's relative
    position bias, ``out_proj`` (BART, CLIP, OPT, GPT-J), ``Conv1D`` weights (GPT-2), ``Wqkv`` (ModernBERT),
    CodeGen's grouped fused projection, and attention blocks (BERT's ``self`` + ``output.dense``; their residual
    and Add & Norm bypassed). A class with a shipped spec the generic reading cannot replace (a fused projection
    laid out per head or per group, ALiBi: BLOOM's, MPT's, Falcon's with ``alibi=True``) gets that spec: the one
    whose options fit the module (Falcon's ``falcon`` or ``falcon_alibi`` as its config's ``alibi`` says).

    Raises:
        AuditUsageError: the class is not of that shape (the message says what is missing).
    """
    module = hf_build(cls_or_module, cross=bool(cross)) if isinstance(cls_or_module, type) else cls_or_module
    if _gated_block(module):
        return _gated_spec(module)
    if _mixture_of_attention(module):
        return _moa_spec(module)
    shipped = _shipped_spec(module, bool(cross))
    if shipped is not None and (shipped.qkv_layout != "blocks" or shipped.alibi is not None or shipped.memory):
        return shipped
    refused = _refused_options(module) if shipped is None else ""
    if refused:  # the class's shipped spec (its ALiBi and all) does not model an option it was built with: named,
        # not left to the generic call, which would pass zeros for what the shipped spec computes (MPT's ALiBi)
        raise AuditUsageError(f"{type(module).__qualname__}: {refused}")
    try:
        return _generic_spec(module, cross)
    except AuditUsageError:
        if shipped is None:
            raise
        return shipped


#: the children and parameters of a gated cross-attention block (Evolla's aligner) its spec reads or bypasses
_GATED_READS = ("query", "key_protein", "value_protein", "out_proj", "attention_norm", "ff")
_GATED_OWN = ("gate_attention", "gate_ffw")


def _gated_block(module: nn.Module) -> bool:
    """Evolla's ``EvollaSequenceAlignerCrossAttention``, a Flamingo-style gated block: ``x + tanh(gate_attention) *
    cross_attention(x)``, then ``+ tanh(gate_ffw) * ff(...)``, its attention (in its ``cross_attention`` method) over
    the keys and values of the modalities its constructor was given widths for; recognised when only the protein one
    was (as its model builds it)."""
    source = _source(type(module).forward)
    return ("hidden_states = torch.tanh(self.gate_attention) * hidden_states" in source
            and "self.ff(hidden_states) * torch.tanh(self.gate_ffw)" in source
            and "self.attention_norm(query_states)" in _source(getattr(type(module), "cross_attention", None))
            and all(_is_projection(getattr(module, n, None)) for n in ("query", "key_protein", "value_protein",
                                                                         "out_proj"))
            and all(getattr(module, n, 0) is None for n in ("key_structure", "value_structure", "key_msa",
                                                             "value_msa"))
            and all(isinstance(getattr(module, n, None), nn.Parameter) for n in _GATED_OWN))


def _gated_spec(module: nn.Module) -> ModuleSpec:
    """The spec of a :func:`_gated_block`: cross-attention over the protein keys and values, the block's residual
    subtracted, ``tanh(gate_attention)`` folded into the output projection, the feed-forward bypassed (``gate_ffw``
    zeroed on the audit's copy), ``attention_norm`` bypassed as a pre-norm; no masks (its masks are rows of ones and
    zeros per query and per key, which no mask of the audit's form reaches)."""
    cls = type(module)
    plain = ModuleSpec(f"hf:{cls.__name__}", _unused_forward, q="query", k="key_protein", v="value_protein",
                       out="out_proj", num_heads="num_attention_heads", scale="scale")

    def weights(m: Any) -> Weights:
        w = spec_weights(m, plain)
        gate = math.tanh(float(m.gate_attention.detach().double().reshape(-1)[0]))
        return dataclasses.replace(w, wo=None if w.wo is None else w.wo * gate,
                                   bo=None if w.bo is None else w.bo * gate)

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        assert key is not None
        bypass_norms(m, ("attention_norm",))
        with torch.no_grad():
            m.gate_ffw.zero_()  # the feed-forward bypassed, as a block's Add & Norm is
        out: Tensor = m(query_states=x, protein_kv_states=key, structure_kv_states=None, msa_kv_states=None,
                        query_attn_mask=None, protein_kv_attn_mask=torch.ones(key.shape[0], key.shape[1],
                                                                             dtype=x.dtype))
        return out - x

    spec = dataclasses.replace(plain, forward=forward, weights=weights, memory=True,
                               conventions=dataclasses.replace(_HF_CROSS, supports_mask=False, supports_causal=False),
                               module_type=f"{cls.__module__}.{cls.__qualname__}",
                               build=lambda c, overrides: hf_build(c, overrides, cross=True))
    REBUILDS[spec] = "from typed_transformer.audit import hf_spec\nspec = hf_spec(module)"  # for repros
    return spec


def _unused_forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                    is_causal: bool) -> Tensor:
    raise NotImplementedError  # the weights-only spec _gated_spec reads projections through


def _mixture_of_attention(module: nn.Module) -> bool:
    """JetMoE's mixture of attention: routed experts each with a query and an output projection
    (``experts.input_linear``/``output_linear``, ``(experts, out, in)`` weights, an output ``bias``), keys and
    values from one shared fused ``kv_proj``."""
    experts = getattr(module, "experts", None)
    return (isinstance(getattr(module, "kv_proj", None), nn.Linear) and isinstance(experts, nn.Module)
            and all(hasattr(experts, n) for n in ("input_linear", "output_linear", "router", "bias")))


def _moa_unmodelled(m: Any) -> list[str]:
    """Routing the reference does not compute: more than one expert or more than one expert per token."""
    n, k = int(m.experts.num_experts), int(m.experts.top_k)
    return [] if n == k == 1 else [f"num_local_experts={n}, num_experts_per_tok={k} (routed query and output "
                                   f"projections, top-k gates)"]


def _moa_weights(m: Any) -> Weights:
    """One expert, chosen for every token with gate 1 (softmax over one logit): its query projection, the shared
    keys and values (``kv_proj``'s ``[k; v]``), its output projection and the output bias; ``g`` key/value heads,
    one query head each (``top_k * g`` query heads)."""
    experts = m.experts
    g, d = int(m.num_key_value_heads), int(m.head_dim)
    wk, wv = m.kv_proj.weight.detach().double().chunk(2)
    return Weights(wq=experts.input_linear.weight[0].detach().double(), wk=wk, wv=wv,
                   wo=experts.output_linear.weight[0].detach().double(), bq=None, bk=None, bv=None,
                   bo=experts.bias.detach().double(), h=g * int(experts.top_k), g=g, d=d, dv=d, scale=float(m.scaling))


def _moa_spec(module: nn.Module) -> ModuleSpec:
    """JetMoE's attention with one expert (:func:`_moa_unmodelled` refuses routing): plain rotary attention with
    the expert's projections (:func:`_moa_weights`), its model's rotary class and mask, its cache token by token."""
    cls = type(module)
    rotary_class = _rotary_class(module)
    if rotary_class is None:
        raise AuditUsageError(f"{cls.__qualname__}: no rotary class in its module")

    def tables(m: Any, x: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        cos, sin = rotary_class(config=m.config)(x, torch.arange(offset, offset + x.shape[1])[None])
        return cos.to(x.dtype), sin.to(x.dtype)

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        keep = with_causal(keep, is_causal, x.shape[1], x.shape[1])
        mask = additive_mask(keep.expand(x.shape[0], keep.shape[1], x.shape[1], x.shape[1]), x.dtype) if (
            keep is not None) else None
        out: Tensor = m(x, attention_mask=mask, position_embeddings=tables(m, x, 0))[0]
        return out

    def decode(m: Any, x: Tensor) -> Tensor:
        from transformers import DynamicCache

        cache = DynamicCache(config=m.config)
        outs = [m(x[:, i:i + 1], attention_mask=None, position_embeddings=tables(m, x[:, i:i + 1], i),
                  cache=cache)[0] for i in range(x.shape[1])]
        return torch.cat(outs, dim=1)

    theta = _rope_theta(module)
    return ModuleSpec(f"hf:{cls.__name__}", forward, _HF, q=None, k=None, v=None, out=None,
                      weights=_moa_weights, rotary=None if theta is None else Rotary(theta, _rotary_style(module)),
                      decode=decode, module_type=f"{cls.__module__}.{cls.__qualname__}", unmodelled=_moa_unmodelled)


def _shipped_spec(module: nn.Module, cross: bool) -> ModuleSpec | None:
    """The shipped spec written for ``module``'s class (or a base class of it), for its self- or cross-attention form
    (GPT-2 has one of each: its cross-attention reads ``q_attn`` and a fused ``[k; v]``) and for the options it was
    built with (a spec that does not model one of them is passed over), if any."""
    from . import specs  # noqa: F401  (registers the shipped specs)

    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    found = [spec for spec in SHIPPED_SPECS.values() if spec.module_type in names
             and (spec.unmodelled is None or not spec.unmodelled(module))]
    return next((spec for spec in found if spec.memory == cross), None) if cross else next(
        (spec for spec in found if not spec.memory), None)


def _refused_options(module: nn.Module) -> str:
    """What the shipped specs written for ``module``'s class do not model of it (MPT's ``clip_qkv``), or ``""``."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(module).__mro__}
    refused = [f"spec {spec.name!r} does not model its option {', '.join(spec.unmodelled(module))}"
               for spec in SHIPPED_SPECS.values() if spec.module_type in names and spec.unmodelled is not None
               and spec.unmodelled(module)]
    return "; ".join(refused)


def _memory_arg(module: nn.Module, core: Any, signature: Any, cross: bool | None) -> str | None:
    """The argument that carries the memory of a cross-attention call, or None for self-attention."""
    arg = next((n for n in _MEMORY_ARGS if n in signature), None)
    if arg is None or cross is False:
        return None
    named = any("Cross" in type(m).__name__ or getattr(m, "is_cross_attention", False) is True for m in (module, core))
    return arg if cross or named or signature[arg].default is inspect.Parameter.empty else None


def _generic_spec(module: nn.Module, cross: bool | None) -> ModuleSpec:
    cls = type(module)
    q_norm, k_norm = _norm_paths(module)
    latent = _latent(module)
    mrope = _mrope(module)
    layout = _latent_layout() if latent is not None else find_layout(module, (q_norm, k_norm))
    core: Any = module.get_submodule(layout.core.rstrip(".")) if layout.core else module
    if layout.core:
        q_norm, k_norm = (None if n is None else layout.core + n for n in _norm_paths(core))
    signature = inspect.signature(cls.forward).parameters
    params = list(signature)[1:]
    # a DETR decoder's content and position projections (Conditional DETR, DAB-DETR): its positions given as zeros
    content_zeros = content_zero_args(cls) if layout.extra_reads else {}
    separate = tuple(params[:3]) in _SEPARATE
    # keys and values already projected, taken by name (DAB-DETR's DabDetrAttention): identity projections
    projected = layout.q is None and layout.qkv is None and all(n in signature for n in PROJECTED)
    # a (query, key, value) class that requires rotary tables and builds its keys' projection from the queries'
    # width (SAM 2 video's memory self-attention: its model calls it with query = key = value): self-attention, the
    # input passed as all three
    rotary_self = (separate and "position_embeddings" in signature
                   and signature["position_embeddings"].default is inspect.Parameter.empty)
    # or one that views its keys and values with the queries' shape (MobileBERT's self.key(key_tensor).view(
    # *hidden_shape), hidden_shape from query_tensor): one sequence, as its model passes it (see _same_shape)
    rotary_self = rotary_self or (separate and (_same_shape(cls) or _same_shape(type(core))))
    separate = (separate and not rotary_self) or projected
    merged = _merged_memory(core)
    # a Perceiver resampler that takes its memory first (Evolla's compressor: forward(x, latents, mask)): keys and
    # values over [memory; latents], the queries from the latents (IDEFICS 2's, latents first, is _keys_with_input's)
    perceiver = _perceiver(cls)
    perceiver = perceiver if perceiver is not None and params[:1] == [perceiver[1]] else None
    memory_arg = (None if merged is not None else perceiver[1] if perceiver is not None
                  else _memory_arg(module, core, signature, cross))
    mask_arg = next((n for n in ("attention_mask", "mask", "attn_mask", "merged_attention_mask") if n in signature),
                    "attention_mask")
    if mask_arg not in signature and _bias_as_mask(cls):
        mask_arg = "attention_bias"  # EsmFold2's diffusion attention: its pair bias, the padding folded in
    # ViT on transformers 5.0 takes forward(hidden_states), BLIP's vision attention (hidden_states, **kwargs) and
    # never reads a mask: audited without masks, as its model calls it (a mask passed would be ignored silently)
    # the vision and audio encoders of Qwen2-VL and its kin take one packed sequence ``(total, e)`` cut by
    # ``cu_seqlens`` (each image attends within itself): a batch of b sequences of t tokens is b pieces of t
    packed = "cu_seqlens" in signature and signature["cu_seqlens"].default is inspect.Parameter.empty
    # a mask through **kwargs: the forward reads the name as a variable, not only as a keyword it passes on
    # (BLIP-2's attention_interface(..., attention_mask=None, **kwargs), SAM's attention_mask=attention_similarity)
    body = _body(cls.forward)
    read = re.search(rf"(?<![\w.]){mask_arg}\b(?!\s*=[^=])", body) is not None
    takes_mask = not packed and (mask_arg in signature or (any(p.kind is p.VAR_KEYWORD for p in signature.values())
                                                          and read))
    # a mask argument the forward never reads, calling its attention function with attention_mask=None instead
    # (PP-OCRv5's and PP-OCRv6's recognition encoders: "not used but kept for signature matching"): audited without
    # masks, as its model calls it (the mask would be ignored silently)
    # (Llama 4's vision attention: None in the mask's place of its attention function's arguments)
    if mask_arg in signature and not read and (re.search(rf"\b{mask_arg}=None\b", body) or _mask_none(body)):
        takes_mask = False
    # a packed encoder whose forward never names the mask and calls its attention function with **kwargs only: its
    # model passes attention_mask=None through them (HunYuan-VL's, HY-V4-VL's vision attention), which eager needs
    mask_free = packed and mask_arg not in _source(cls.forward) and any(
        p.kind is p.VAR_KEYWORD for p in signature.values())
    # masks taken only in a key-padding form of the class's own, which no mask of the audit's (b, 1, t, s) form
    # reaches: audited without masks, each form named in hf_notes. FastSpeech2-Conformer's (b, 1, s) and ProphetNet's
    # (b, h, 1, s), any other refused; Longformer's sliding chunks' (b, s) of its own values (< 0 padding, > 0
    # global), its lengths a multiple of its window (its model pads); Reformer's local attention's (b, s), audited on
    # sequences of one chunk at most (max_length), where it is plain attention; Evolla's compressor's (b, s) of ones
    # and zeros (mask[:, None, None, :]: ones passed) and WavLM's (attention_mask.ne(1)); Granite Speech 5's (b, s),
    # reshaped into its blocks
    sliding, chunked, key_mask = _sliding_chunks(core), _chunked_local(core), _key_mask_only(cls, mask_arg)
    distances_arg = _distances_arg(cls) if _shaw_blocks(core) else None
    if (_padding_only(cls, mask_arg) or _head_padding_only(cls, mask_arg) or sliding is not None
            or chunked is not None or key_mask or _padding_ones(cls, mask_arg)
            or (distances_arg is not None and mask_arg in signature)):
        takes_mask = False
    memory_mask = "encoder_attention_mask" if memory_arg and "encoder_attention_mask" in signature else mask_arg
    if content_zeros and memory_arg is not None and memory_mask in signature:
        takes_mask = True  # DAB-DETR's cross-attention: its mask is encoder_attention_mask, with no attention_mask
    # the first parameter is the input, passed by position whatever its name (VitDet's hidden_state)
    pair_arg = _pair_arg(core)  # Bros's bbox_pos_emb: given the audit's own table (see _relative_keys)
    layout_arg = _layout_arg(core)  # LiLT's layout_inputs: given the audit's own (see _layout_bias)
    nullable = [n for n in _nullable(cls) if n not in (pair_arg, layout_arg)]
    added = _added_biases(core)
    channels_first = isinstance(module.get_submodule(str(layout.q or layout.qkv or "")), nn.Conv1d)
    input_norms = tuple(layout.core + n for n in _input_norms(core)) + tuple(_block_input_norms(module))
    # a required mask argument is the mask the audit passes (XLM's and FlauBERT's ``mask``)
    # a required output_attentions (SqueezeBERT's): False, as its model passes it by default
    flags = [n for n in ("output_attentions",) if n in signature and signature[n].default is inspect.Parameter.empty]
    rotary_arg = _rotary_arg(cls)
    unknown = [n for n, p in signature.items() if n not in ("self", params[0] if params else "", mask_arg, rotary_arg,
                                                            distances_arg)
               and n not in _PROVIDED and n not in nullable and n not in flags and n not in added
               and n not in (pair_arg, layout_arg) and n != "hidden_kv" and n not in content_zeros
               and n not in (perceiver or ()) and not (key_mask and n == mask_arg)
               and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if unknown:
        raise AuditUsageError(f"{cls.__qualname__}: forward needs {', '.join(unknown)}, which the common shape does "
                              f"not provide")
    takes_rotary = rotary_arg is not None
    # RecurrentGemma: the class turns q and k with its own rotary_emb from position_ids; GPT-J and CodeGen on
    # transformers 5.0 with their sinusoid table (the embed_positions buffer)
    internal = "position_ids" in signature and (isinstance(getattr(module, "rotary_emb", None), nn.Module)
                                                or isinstance(getattr(core, "embed_positions", None), Tensor))
    rotary_class = _rotary_class(module) if takes_rotary and not packed else None
    if takes_rotary and _width_rotary(cls):  # EfficientLoFTR's: audited with none, as its cross-attention is called
        takes_rotary, rotary_class = False, None
    if takes_rotary and rotary_class is None and _positions_optional(cls):
        takes_rotary = False  # DETR's sine embeddings, added to the query and key inputs: audited with none
    # the audit makes the tables: a packed encoder's, and a class whose module has no rotary class or one that takes
    # no positions (an image-grid rotary: DINOv3's, SAM 2's); the model's table builder is then not tested
    own_tables = _own_tables(module)
    if own_tables:
        rotary_class, mrope = None, None
    heads = _heads_as_positions(cls)
    zero_positions = _needed_positions(cls)
    # a class that takes its tokens time first: (t, b, e) in and out (its forward permutes them itself)
    # (FSMT's: ``tgt_len, bsz, embed_dim = query.size()``)
    time_first = re.search(r"hidden_states = hidden_states\.permute\(1, 0, 2\)"
                           r"|tgt_len, bsz, embed_dim = query\.size\(\)", _source(cls.forward)) is not None
    flat_mask = "attention_mask.size() != (batch_size * self.num_heads" in _source(cls.forward)
    # a self-attention class that takes its input again as required key (and query) arguments, as its model passes
    # it: FSMT's forward(query, key, ...) gets query=x, key=x; CTRL's forward(v, k, q, ...) gets x three times (its
    # keys and values take the queries' shape: one sequence, not separate inputs)
    # (CPM-Ant's forward(hidden_q, hidden_kv, ...): its model passes the input as both)
    again = [n for n in params[1:3] if n in ("key", "k", "q", "hidden_kv")
             and signature[n].default is inspect.Parameter.empty
             ] if not separate and memory_arg is None and not rotary_self else params[1:3] if rotary_self else []
    cache_arg = next((n for n in ("cache", "past_key_values", "past_key_value") if n in signature), None)
    theta = _PACKED_THETA if own_tables and takes_rotary else _rope_theta(core)
    if theta is None and (rotary_class is not None or internal):
        theta = _literal_theta(rotary_class.__module__ if rotary_class is not None else _modeling(cls).__name__)
    source = _source(cls.forward)
    # a mask used as booleans, True = may attend (DeBERTa's masked_fill(~attention_mask, min)): given as such
    boolean_mask = _boolean_mask(core, mask_arg)
    disentangled = _disentangled(core, layout.core)
    relative_keys = _relative_keys(core, layout.core)
    xl = _xl_names(core)
    table_arg = xl[3] if xl is not None else _xl_table_arg(core)
    if xl is not None and table_arg == "position_embeddings":  # the relative table, not rotary tables
        takes_rotary, own_tables, rotary_class = False, False, None
    # Swin's windows: every sequence is one window of Wh x Ww tokens, with a mask per window shared by the heads
    window_table = _window_table(module)
    with_input = _keys_with_input(core, layout, memory_arg) or perceiver is not None
    # LongT5's local attention: queries in blocks, each against its 3-block frame (a two-sided window of its radius)
    local = _local_blocks(core)
    # a mask of ones (attend) and zeros (masked) of shape (b, t, s), which the forward turns into its own fill
    # (XLM's and FlauBERT's ``(mask == 0).view(mask_reshape)``), not an additive (b, 1, t, s) one
    ones_zeros = re.search(rf"\({mask_arg} == 0\)", source) is not None
    residual = False  # decided below, once the module can be called
    packed_rows: list[bool] = []  # a packed call's input has a leading axis of 1 (decided by the first call)
    point_axis: list[bool] = []  # the input has a second axis of 1 (decided by the first call that runs)
    if re.search(r"batch_size, point_batch_size = \w+\.shape\[:2\]", _source(cls.forward)):
        point_axis.append(True)  # SAM's (b, points, t, e) tokens, read by the forward itself

    def positions(x: Tensor, offset: int) -> dict[str, Tensor]:
        """``cache_position``, for a forward that reads it (T5 on transformers 5.0: the length of its bias)."""
        return {"cache_position": torch.arange(offset, offset + x.shape[1])} if "cache_position" in signature else {}

    def invoke(m: Any, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        """The module's output (:func:`_output_tensor`); a block's residual and Add & Norm bypassed."""
        if residual:
            bypass_norms(m, layout.norms)
        bypass_norms(m, input_norms)
        kwargs.update(dict.fromkeys(nullable))
        kwargs.update(dict.fromkeys(flags, False))
        if channels_first:  # (b, e, t) in and out: a 1x1 convolution's layout (SqueezeBERT)
            channels: Tensor = _output_tensor(m(x.transpose(1, 2), *args, **kwargs)).transpose(1, 2)
            return channels - x if residual else channels
        kwargs.update({name: torch.zeros((), dtype=x.dtype) for name in added})
        if sliding is not None:  # Longformer: padded to a multiple of its window and called as its model calls it
            b, t = x.shape[0], x.shape[1]
            pad = -t % (2 * sliding)
            padding = torch.zeros(b, t + pad, dtype=torch.bool)
            padding[:, t:] = True  # its model's padding tokens: masked keys (the dtype's minimum), rows zeroed
            kwargs.update({mask_arg: padding.to(x.dtype) * torch.finfo(x.dtype).min, "is_index_masked": padding,
                           "is_index_global_attn": torch.zeros_like(padding), "is_global_attn": False})
            windowed: Tensor = _output_tensor(m(nn.functional.pad(x, (0, 0, 0, pad)), *args, **kwargs))[:, :t]
            return windowed - x if residual else windowed
        if packed:
            b, t = x.shape[0], x.shape[1]
            kwargs["cu_seqlens"] = torch.arange(0, (b + 1) * t, t, dtype=torch.int32)
            if mask_free:  # HunYuan-VL's: its layers pass attention_mask=None through **kwargs to eager attention
                kwargs["attention_mask"] = None
            if "max_seqlen" in signature:
                kwargs["max_seqlen"] = t
            flat = rearrange(x, "b t e -> (b t) e")
            if not packed_rows:  # (total, e), as Qwen2-VL's encoder takes it, or (1, total, e) (HunYuan-VL's)
                try:
                    m(flat, *args, **kwargs)
                    packed_rows.append(False)
                except Exception:
                    packed_rows.append(True)
            out = m(flat[None] if packed_rows[0] else flat, *args, **kwargs)
            rows: Tensor = _output_tensor(out)
            unpacked: Tensor = rearrange(rows, "o (b t) e -> (o b) t e" if packed_rows[0] else "(b t) e -> b t e",
                                         b=b)
            return unpacked - x if residual else unpacked
        if time_first:  # Mask2Former's and OneFormer's: (t, b, e) in and out, the mask (b h, t, s)
            if flat_mask and mask_arg in kwargs and isinstance(kwargs[mask_arg], Tensor):
                mask = kwargs[mask_arg]
                h = int(resolve(m, layout.num_heads, cls.__name__))
                kwargs[mask_arg] = mask.expand(mask.shape[0], h, *mask.shape[2:]).reshape(-1, *mask.shape[2:])
            moved = {n: a.transpose(0, 1) if isinstance(a, Tensor) and a.ndim == 3 and n != mask_arg else a
                     for n, a in kwargs.items()}
            out = m(x.transpose(0, 1), *(a.transpose(0, 1) for a in args), **moved)
            first: Tensor = (out[0] if isinstance(out, tuple) else out).transpose(0, 1)
            return first - x if residual else first
        if point_axis == [True]:  # SAM's (b, points, t, e) tokens: one point
            lifted = [a[:, None] if isinstance(a, Tensor) and a.ndim == 3 else a for a in args]
            memory = {n: a[:, None] for n, a in kwargs.items() if (n in _MEMORY_ARGS or n in again)
                      and isinstance(a, Tensor)}
            out = m(x[:, None], *lifted, **{**kwargs, **memory})
            point: Tensor = (_output_tensor(out))[:, 0]
            return point - x if residual else point
        try:
            out = m(x, *args, **kwargs)
        except ValueError as err:  # (b, t, e) unpacked as four axes: SAM's point batch, or its image (b, h, w, e)
            if point_axis or "expected 4, got 3" not in str(err):
                raise
            point_axis.append(True)
            return invoke(m, x, *args, **kwargs)
        result: Tensor = _output_tensor(out)
        if not point_axis and result.ndim == x.ndim + 1:  # Sam2's: (b, t, e) read as t point batches of 1 token
            point_axis.append(True)
            return invoke(m, x, *args, **kwargs)
        if not point_axis:
            point_axis.append(False)
        return result - x if residual else result

    own_style = _rotary_style(module) if own_tables else "half"  # the pairing of the class's rotate function
    complex_tables = own_tables and _complex_tables(module)  # Llama 4's vision freqs_ci: exp(i p theta)
    prefix = _patch_prefix(module) if own_tables else None

    def own_rotary(m: Any, x: Tensor, offset: int) -> Any:
        """The audit's own 1-D rotary tables: positions offset.. in each sequence, base :data:`_PACKED_THETA`,
        paired as the class's rotate function pairs; ``(b t, d)`` for a packed call, else ``(b, t, d)``; complex
        turns ``exp(i p theta)`` ``(t, 1, d/2)``, shared by the batch, as Llama 4's vision model passes them."""
        heads = int(resolve(m, layout.num_heads, cls.__name__))
        d = (int(resolve(m, layout.head_dim, cls.__name__)) if layout.head_dim
             else int(m.get_submodule(layout.qkv or layout.q or "").weight.shape[0]) // (3 if layout.qkv else 1)
             // heads)
        turned = x.shape[1] - (prefix or 0)  # DINOv3: tables for the patch tokens only
        angles = torch.arange(offset, offset + max(turned, 0), dtype=torch.float64)[:, None] * _PACKED_THETA ** (
            -torch.arange(0, d, 2, dtype=torch.float64) / d)
        if complex_tables:
            return torch.polar(torch.ones_like(angles), angles)[:, None].to(x.dtype.to_complex())
        emb = (torch.cat([angles, angles], dim=-1) if own_style == "half"
               else repeat(angles, "t f -> t (f two)", two=2))
        if prefix is not None:  # DINOv3's model passes (patches, d), shared by the batch
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        tables = repeat(emb, "t d -> (b t) d" if packed else "t d -> b t d", b=x.shape[0])
        return tables.cos().to(x.dtype), tables.sin().to(x.dtype)

    def rotary(m: Any, x: Tensor, offset: int) -> Any:
        assert rotary_class is not None
        config = getattr(m, "config", None) or m.get_submodule(layout.core.rstrip(".")).config  # ESM: the core's
        embedding = rotary_class(config=config)
        n = config.num_attention_heads if heads else x.shape[1]
        positions = torch.arange(0 if heads else offset, (0 if heads else offset) + n)[None].expand(x.shape[0], -1)
        if mrope in (_AXIAL, _AXIAL_WH):  # (height, width) of each patch, shared by the batch
            positions = mrope_positions(offset, n)[1:].T
        elif mrope == _AXIAL_BLOCKS:  # (b, t, 2): Gemma 4's vision rotary takes a batch of (height, width)
            positions = mrope_positions(offset, n)[1:].T[None].expand(x.shape[0], -1, -1)
        elif mrope is not None:  # 3-D positions (temporal, height, width): an image grid, not text
            positions = mrope_positions(offset, n)[:, None].expand(3, x.shape[0], n)
        extra = ({"layer_type": _layer_type(m)} if "layer_type" in inspect.signature(embedding.forward).parameters
                 else {})
        tables = embedding(x, positions, **extra)
        if isinstance(tables, Tensor):  # DeepSeek V2's complex turns exp(i p theta), as its model passes them
            return tables
        cos, sin = tables
        return cos.to(x.dtype), sin.to(x.dtype)

    def call(m: Any, x: Tensor, mask: Tensor | None, offset: int, cache: Any = None) -> Tensor:
        kwargs: dict[str, Any] = {mask_arg: mask} if takes_mask else {}
        if takes_rotary:
            kwargs[rotary_arg or ""] = own_rotary(m, x, offset) if own_tables else rotary(m, x, offset)
        elif "position_embeddings" in signature:  # required but unused by this layer (Flint's full-attention layers)
            kwargs["position_embeddings"] = None
        if zero_positions is not None:  # DETR's optional embeddings that its values need: zeros, plain attention
            kwargs[zero_positions] = torch.zeros_like(x)
        kwargs.update({name: torch.zeros_like(x) for name in content_zeros})
        kwargs.update({n: x for n in again})
        kwargs.update({n: x for n in _RESIDUAL_INPUTS if n in signature})
        if "position_ids" in signature:
            kwargs["position_ids"] = torch.arange(offset, offset + x.shape[1])[None].expand(x.shape[0], -1)
            if takes_rotary and mrope == _AXIAL_BLOCKS:  # the (b, t, 2) positions its tables were made from
                kwargs["position_ids"] = mrope_positions(offset, x.shape[1])[1:].T[None].expand(x.shape[0], -1, -1)
        if "layer_idx" in signature:
            kwargs["layer_idx"] = getattr(m, "layer_idx", 0)
        if relative_keys is not None and relative_keys.proj is not None:  # Transformer-XL: distances t-1 .. 1-t
            # (decoding: the keys the cache holds too, distances offset + t - 1 .. 1 - t)
            rows = relative_keys.table(m)[_XL_LENGTH - x.shape[1] - offset:_XL_LENGTH + x.shape[1] - 1]
            kwargs[table_arg] = rows[None].expand(x.shape[0], -1, -1).to(x.dtype)
        if layout_arg is not None:  # LiLT's layout stream: the audit's own layout inputs, the same for every sequence
            own_layout = _layout_inputs(m, layout.core, x.shape[1])
            kwargs[layout_arg] = own_layout[None].expand(x.shape[0], -1, -1).to(x.dtype)
        if pair_arg is not None and relative_keys is not None:  # Bros's (t, t, b, d), the same for every sequence
            pairs = relative_keys.table(m).view(_XL_LENGTH, _XL_LENGTH, -1)[:x.shape[1], :x.shape[1]]
            kwargs[pair_arg] = pairs[:, :, None].expand(-1, -1, x.shape[0], -1).contiguous().to(x.dtype)
        if disentangled is not None:  # DeBERTa's relative embeddings, from its encoder: the audit's own table
            kwargs["rel_embeddings"] = disentangled.table(m).to(x.dtype)
            if disentangled.form == "v1":  # its encoder's distances i - j too (v1 adds no term without them)
                kwargs["relative_pos"] = (torch.arange(x.shape[1])[:, None] - torch.arange(x.shape[1]))[None]
        if distances_arg is not None:  # Granite Speech's block distances, as its encoder computes them
            kwargs[distances_arg] = _block_distances(m)
        if "shared_kv_states" in signature:  # Gemma 4's key/value sharing: a layer that owns its keys and values
            kwargs["shared_kv_states"] = {}
        if merged is not None:  # the audit's encoder tokens, every one visible: the mask ends in zeros for them
            memory = _memory_tokens(x.shape[-1]).to(x.dtype)
            kwargs[merged[0]] = memory[None].expand(x.shape[0], -1, -1)
            merged_mask = kwargs.get(mask_arg)
            if isinstance(merged_mask, Tensor):
                kwargs[mask_arg] = torch.cat([merged_mask, merged_mask.new_zeros(
                    *merged_mask.shape[:-1], _MERGED_MEMORY)], dim=-1)
        if "height" in signature and "width" in signature:  # an image of one row of t patches (SegFormer)
            kwargs["height"], kwargs["width"] = 1, x.shape[1]
        kwargs.update(positions(x, offset))
        if cache is not None and cache_arg is not None:
            kwargs[cache_arg] = cache
        return invoke(m, x, **kwargs)

    def window_keep(m: Any, keep: Tensor, t: int, s: int) -> Tensor:
        window = getattr(m, "sliding_window", None)
        return keep if window is None else keep & window_mask(t, s, int(window))

    def mask_for(m: Any, x: Tensor, s: int, keep: Tensor | None, is_causal: bool) -> Tensor:
        b, t = x.shape[0], x.shape[1]
        keep = with_causal(keep, is_causal, t, s)
        if keep is None:  # an explicit mask always: without one, some kernels decide causality themselves
            keep = torch.ones(1, 1, t, s, dtype=torch.bool)
        if local is not None:  # LongT5's local attention: its model's block form
            return _local_frames(core, keep.expand(b, keep.shape[1], t, s), x.dtype)
        if boolean_mask:
            return window_keep(m, keep, t, s).expand(b, keep.shape[1], t, s)
        if ones_zeros:
            if keep.shape[1] != 1:
                raise AuditUsageError(f"{cls.__qualname__}: its mask is (b, t, s), one for every head")
            return window_keep(m, keep, t, s).expand(b, 1, t, s)[:, 0].to(x.dtype)
        mask = additive_mask(window_keep(m, keep, t, s).expand(b, keep.shape[1], t, s), x.dtype)
        assert mask is not None
        if window_table is not None:  # (windows, t, s): one mask per window (a sequence here), shared by the heads
            if mask.shape[1] != 1:
                raise ValueError(f"{cls.__qualname__} takes one mask per window, shared by its heads")
            return mask[:, 0]
        return mask

    def forward(m: Any, x: Tensor, key: Tensor | None, value: Tensor | None, keep: Tensor | None,
                is_causal: bool) -> Tensor:
        if separate:
            assert key is not None
            assert value is not None
            masks = {mask_arg: mask_for(m, x, key.shape[1], keep, is_causal)} if takes_mask else {}
            if projected:
                return invoke(m, x, **dict(zip(PROJECTED, (key, value), strict=True)), **masks, **positions(x, 0))
            return invoke(m, x, key, value, **masks, **positions(x, 0))
        if perceiver is not None:  # the memory first, the latents (queries) by name, a key mask of ones over both
            assert key is not None
            masks = {mask_arg: torch.ones(x.shape[0], key.shape[1] + x.shape[1], dtype=x.dtype)} if key_mask else {}
            return invoke(m, key, **{perceiver[0]: x}, **masks)
        if memory_arg is not None and with_input:  # its model's mask: the memory's, then ones for the input's keys
            assert key is not None
            t, s = x.shape[1], key.shape[1]
            over = with_causal(keep, is_causal, t, s)
            over = torch.ones(1, 1, t, s, dtype=torch.bool) if over is None else over
            over = torch.cat([over, over.new_ones(*over.shape[:-1], t)], dim=-1)
            masks = {memory_mask: mask_for(m, x, s + t, over, False)} if takes_mask else {}
            if takes_rotary:  # tables for the s + t keys, the queries' the last t (MuseGlimmerAssistant's)
                masks[rotary_arg or ""] = rotary(m, torch.cat([key, x], dim=1), 0)
            return invoke(m, x, **{memory_arg: key}, **masks, **positions(x, 0))
        if memory_arg is not None:
            assert key is not None
            masks = {memory_mask: mask_for(m, x, key.shape[1], keep, is_causal)} if takes_mask else {}
            zeros = {n: torch.zeros_like(key if side == "key" else x) for n, side in content_zeros.items()}
            return invoke(m, x, **{memory_arg: key}, **masks, **zeros, **positions(x, 0))
        return call(m, x, mask_for(m, x, x.shape[1], keep, is_causal), 0)

    def decode(m: Any, x: Tensor) -> Tensor:
        from transformers import DynamicCache, EncoderDecoderCache

        owner = m.get_submodule(layout.core.rstrip(".")) if layout.core else m
        cache: Any = (DynamicCache(config=owner.config) if hasattr(owner, "config") and _model_window(m) is None
                      else DynamicCache())  # a window only the model applies (Nemotron ASR's): the full cache
        layer = getattr(m, "layer_idx", 0) or 0
        if layer >= len(cache.layers) or not hasattr(cache.layers[layer], "update"):
            # a hybrid model's config puts a recurrent (mamba) layer first: the attention layer's own cache is the
            # plain one the model gives its attention layers
            cache = DynamicCache()
        if "self_attention_cache" in source:  # a decoder's self-attention in an encoder-decoder model
            cache = EncoderDecoderCache(cache, DynamicCache())
        return torch.cat([call(m, x[:, i:i + 1], decode_mask(m, x, cache, layer, i), i, cache)
                          for i in range(x.shape[1])], dim=1)

    def decode_mask(m: Any, x: Tensor, cache: Any, layer: int, i: int) -> Tensor | None:
        """The mask of decoding step ``i``: None (every key the cache holds), unless the forward's mask argument is
        required (ModernBERT's decoder adds it to the logits unconditionally: its model always builds one); then
        the one its model builds, over the keys the cache will hold (``get_mask_sizes``), the window applied."""
        required = mask_arg in signature and signature[mask_arg].default is inspect.Parameter.empty
        if not required or not hasattr(cache, "get_mask_sizes"):
            return None
        length, offset = cache.get_mask_sizes(1, layer)
        keys = torch.arange(offset, offset + length)
        window = getattr(m, "sliding_window", None)
        # window_mask's edge for the one query at position i, over keys offset.. of the cache (not 0..i)
        keep = keys <= i if window is None else (keys <= i) & (keys > i - int(window))
        if ones_zeros:
            return keep[None, None].expand(x.shape[0], 1, length).to(x.dtype)
        if boolean_mask:  # True = may attend (CPM-Ant's)
            return keep[None, None, None].expand(x.shape[0], 1, 1, length)
        return additive_mask(keep[None, None, None].expand(x.shape[0], 1, 1, length), x.dtype)

    width = _input_width(module, layout)
    residual = has_residual(module, layout, lambda m, x: forward(m, x, x, x, None, False), width)
    try:
        # (a class whose keys are over its memory and its input always turns them: its call needs the memory)
        ignored = takes_rotary and not heads and not with_input and _ignores_rotary(module, call, width,
                                                                                    rotary_arg or "")
    except Exception as err:
        raise AuditUsageError(f"{cls.__qualname__}: not of the common shape (a call on (b, t, e) tokens with 1-D "
                              f"rotary tables raised {type(err).__name__}: {str(err).splitlines()[0][:100]})") from err
    if ignored:
        takes_rotary = False  # the config switches it off (Zamba2's use_mem_rope): audited without positions
    self_attention = not separate and memory_arg is None
    window = getattr(core, "sliding_window", None)
    turn = min((i for i in (source.find("apply_rotary_pos_emb("), source.find("apply_rotary_emb(")) if i >= 0),
               default=-1)
    normed = source.find(f"self.{q_norm}(") if q_norm else -1
    v_scale = getattr(module, "v_scale", None)
    # Llama 3's or YaRN's frequencies: read from the module's own rotary class (the default: from the base alone)
    frequencies = (_frequencies(rotary_class, _layer_type(module)) if takes_rotary and rotary_class is not None and (
        _rope_type(module) in _STATIC_ROPE[1:] or mrope in (_AXIAL, _AXIAL_WH, _AXIAL_BLOCKS)) else None)
    # the same d/4 frequencies for both coordinates (SAM 2's, Step 3.7's)
    if frequencies is not None and (_shared_axial(rotary_class) or _flipped_axial(rotary_class)):
        shared = frequencies

        def twice(m: Any) -> tuple[Tensor, float]:
            inverse, magnitude = shared(m)
            return torch.cat([inverse, inverse]), magnitude

        frequencies = twice
    position_bias = relative_bias(layout.core) if layout.relative_bias else None
    wavlm = _gated_bias(core, layout.core)
    if wavlm is not None:
        position_bias = wavlm[0]
    if layout_arg is not None:
        position_bias = _layout_bias(layout.core)
    lengths = _HF.lengths
    if window_table is not None:
        table_path, window_size = window_table
        lengths = (window_size[0] * window_size[1],) * 2
        table_name = f"{table_path}.relative_position_bias_table".lstrip(".")

        def position_bias(m: Any, t: int, s: int) -> Tensor:
            owner = resolve(m, table_path, cls.__name__) if table_path else m
            if isinstance(getattr(owner, "continuous_position_bias_mlp", None), nn.Sequential):
                return _continuous_bias(owner, window_size)
            return window_bias(resolve(m, table_name, cls.__name__).double(), window_size)

    spec = ModuleSpec(
        f"hf:{cls.__name__}", forward, dataclasses.replace(_HF if self_attention else _HF_CROSS,
                                                           supports_mask=takes_mask, supports_causal=takes_mask,
                                                           lengths=lengths),
        **{**layout.fields(), **({"scale": split} if (split := _split_scale(module)) is not None else {})},
        rotary=(Rotary(theta, _latent_style(module) if latent else _rotary_style(module),
                       fraction=_rotary_fraction(core), frequencies=frequencies, prefix=prefix or 0)
                if (takes_rotary or internal) and theta is not None and not heads else None),
        decode=decode if cache_arg is not None and self_attention and _decodes(core)
        and not _head_padding_only(cls, mask_arg) else None,
        build=lambda c, overrides: hf_build(c, overrides, cross=memory_arg is not None),
        position_bias=position_bias, position_gate=None if wavlm is None else wavlm[1],
        module_type=f"{cls.__module__}.{cls.__qualname__}", memory=memory_arg is not None,
        q_norm=q_norm, k_norm=k_norm, v_norm=_v_norm(core, layout.core),
        # (keys over memory and input: its model's mask holds any window, bidirectional, over absolute positions)
        window=None if window is None or with_input else int(window),
        blocks=f"{layout.core}context_size" if distances_arg is not None else None,
        norms_after_rotary=0 <= turn < normed,  # HunYuan and nanochat normalise the turned q and k
        softcap=_softcap(module), sinks=_sinks(module), gate=_output_gate(module), sub_norm=_sub_norm(module),
        clip_qkv=_clip_qkv(module) if not layout.core else None,
        differential=_differential(module), latent=latent, mrope=mrope if takes_rotary else None,
        decomposed=_decomposed(module), disentangled=disentangled, relative_keys=relative_keys,
        keys_with_input=with_input,

        max_length=None if chunked is None else f"{layout.core}chunk_length",
        radius=(f"{layout.core}local_radius" if local is not None
                else f"{layout.core}one_sided_attn_window_size" if sliding is not None else None))
    if _cosine(core):  # Swin v2: unit queries and keys, a learned scale per head (clamped at 100)
        scale_path = f"{layout.core}logit_scale"

        def cosine(m: Any) -> dict[str, Callable[[Tensor], Tensor]]:
            scales = resolve(m, scale_path, cls.__name__).detach().double().clamp(max=math.log(100)).exp()

            def unit(z: Tensor) -> Tensor:
                length: Tensor = z.norm(dim=-1, keepdim=True).clamp(min=1e-12)
                return z / length

            return {"q": lambda q: unit(q) * rearrange(scales.to(q.dtype), "h 1 1 -> 1 h 1 1"), "k": unit}

        spec = dataclasses.replace(spec, norms=cosine, scale=1.0)
    if (factor := _query_scale(module)) is not None:  # TimesFM, Muse: the queries' factor after their norm
        q_path, plain = q_norm, spec

        def scaled_queries(m: Any) -> dict[str, Callable[[Tensor], Tensor]]:
            norm = None if q_path is None else _norm(m, q_path, plain)
            f = factor(m)
            return {"q": lambda q: (q if norm is None else norm(q)) * (f.to(q.dtype) if isinstance(f, Tensor) else f)}

        spec = dataclasses.replace(spec, norms=scaled_queries)
        if "scaling=1.0" in source:  # TimesFM's attention: the factor is its whole scale
            spec = dataclasses.replace(spec, scale=1.0)
    if (deberta := _deberta_scale(core)) is not None:
        spec = dataclasses.replace(spec, scale=deberta)
    if _separate_biases(core):  # DeBERTa's q_bias and v_bias, added to the heads of its bias-free in_proj
        unbiased, owner = spec, layout.core.rstrip(".")

        def biased(m: Any) -> Weights:
            w = spec_weights(m, unbiased)
            c = resolve(m, owner, cls.__name__) if owner else m
            return dataclasses.replace(w, bq=c.q_bias.detach().double().reshape(-1),
                                       bv=c.v_bias.detach().double().reshape(-1))  # LayoutLMv2's: (1, 1, h d)

        spec = dataclasses.replace(spec, weights=biased)
    if isinstance(v_scale, float | int) and v_scale != 1:  # MiMo-V2-Flash scales its values by a constant
        plain = spec

        def scaled(m: Any) -> Weights:
            w = spec_weights(m, plain)
            return dataclasses.replace(w, wv=w.wv * float(v_scale), bv=None if w.bv is None else w.bv * float(v_scale))

        spec = dataclasses.replace(spec, weights=scaled)
    if merged is not None:  # T5Gemma 2: the encoder's keys and values, appended after the self keys, always visible
        alone, k_path = spec, (k_norm if merged[1] else None)

        def with_memory(m: Any) -> Weights:
            w = spec_weights(m, alone)
            memory = _memory_tokens(w.wk.shape[1])
            k = memory @ w.wk.T + (0.0 if w.bk is None else w.bk)
            v = memory @ w.wv.T + (0.0 if w.bv is None else w.bv)
            norm = None if k_path is None else _norm(m, k_path, alone)
            if norm is not None:
                k = rearrange(norm(rearrange(k, "n (g d) -> 1 g n d", g=w.g)), "1 g n d -> n (g d)")
            return dataclasses.replace(w, extra_k=k, extra_v=v)

        spec = dataclasses.replace(spec, weights=with_memory)
    REBUILDS[spec] = "from typed_transformer.audit import hf_spec\nspec = hf_spec(module)"  # for repros
    return spec


def _core_of(module: nn.Module) -> nn.Module:
    """The submodule that holds the class's projections (a block's ``self``), or the class itself."""
    try:
        layout = find_layout(module, _norm_paths(module))
    except AuditUsageError:
        return module
    return module.get_submodule(layout.core.rstrip(".")) if layout.core else module


def _output_tensor(out: Any) -> Tensor:
    """The attention output of a module's return value: the first item of a tuple (of GPT-1's list, of
    SqueezeBERT's dict), and of that again where it is one itself (I-BERT's ``((output,), (scaling_factor,))``)."""
    while isinstance(out, tuple | list | dict):
        out = next(iter(out.values())) if isinstance(out, dict) else out[0]  # SqueezeBERT: {"context_layer": ...}
    result: Tensor = out
    return result


def hf_attention_classes(model: str) -> list[type]:
    """The attention classes defined in ``transformers.models.<model>.modeling_<model>`` (by name: ``*Attention``)."""
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return [obj for name, obj in vars(module).items()
            if isinstance(obj, type) and issubclass(obj, nn.Module) and name.endswith("Attention")
            and obj.__module__ == module.__name__]
