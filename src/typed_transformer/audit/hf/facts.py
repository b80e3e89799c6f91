"""Facts read from a Hugging Face attention class: its source, signature, config and modeling module, each a small
named query."""

import copy
import importlib
import inspect
import math
import re
from collections.abc import Callable
from typing import Any, Literal

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from ..core.conventions import AuditUsageError
from ..modules.masking import additive_mask
from ..modules.positions import (
    DecomposedRelPos,
    Disentangled,
    MRope,
    PositionBias,
    RelativeKeys,
    log_coordinates,
    one_row,
    t5_buckets,
    window_bias,
)
from ..modules.spec import resolve
from ..modules.variants import Differential, Latent, OutputGate
from .layout import Layout, find_layout


def _transformers_class(cls: type) -> type:
    """``cls``, or its first base class defined in ``transformers`` (a user's subclass of a Hugging Face class)."""
    return next((c for c in cls.__mro__ if c.__module__.startswith("transformers.")), cls)


def _modeling(cls: type) -> Any:
    return importlib.import_module(_transformers_class(cls).__module__)


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
    apply = _source(getattr(modeling, called.group(1) if called else "apply_rotary_pos_emb", None)) or "rotate_half("
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
    never writes its cache (``.update(``), nor one that reads its cache layer before writing it (PI0.5's action
    expert: ``cache.layers[self.layer_idx].keys.device``, a layer its model's VLM prefix fills first; an empty
    cache raises)."""
    unbuilt = "self.layer_idx" in _source(type(core).forward) and not hasattr(core, "layer_idx")
    methods = (getattr(type(core), n) for n in dir(type(core)) if not n.startswith("__"))
    own = "".join(_source(f) for f in methods if inspect.isfunction(f) and f.__module__.startswith("transformers."))
    # a cache the class only reads (DiffusionGemma's decoder: its encoder fills it, append_to_cache never writes)
    writes = ".update(" in own + _source(type(core).forward) + _library_source(core)
    # the device of its cache layer's keys read before any write (PI0.5's expert); not a cross-attention's guarded
    # reuse of keys already cached (Whisper's, BigBird's: key_states = cache.layers[self.layer_idx].keys)
    prefilled = re.search(r"(?<![\w.])cache\.layers\[self\.layer_idx\]\.keys\.device", _source(type(core).forward))
    t5_encoder = isinstance(getattr(core, "relative_attention_bias", None), nn.Module) and not getattr(
        core, "is_decoder", False)
    return writes and not unbuilt and not prefilled and not t5_encoder


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


def _unkernelized(obj: Any) -> Any:
    """``obj``, or the function a decorator made a module of: the ``kernels`` package's
    ``use_kernel_forward_from_hub`` turns a function into an instance of a ``Func`` module whose ``forward`` calls it
    from its closure (transformers 5.25 does so to ``apply_rotary_pos_emb`` in 118 modeling modules)."""
    if inspect.isfunction(obj) or not isinstance(obj, nn.Module):
        return obj
    inner = [cell.cell_contents for cell in getattr(type(obj).forward, "__closure__", None) or ()
             if inspect.isfunction(cell.cell_contents)]
    return inner[0] if len(inner) == 1 else obj


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(_unkernelized(obj))
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


def _width_rotary(cls: Any) -> bool:
    """Optional rotary tables that turn q and k across the whole model width before the heads are split
    (EfficientLoFTR's ``view(batch_size, seq_len, -1, dim)`` then ``apply_rotary_pos_emb``: each head meets its own
    slice of a 2-D table, other frequencies per head), which the reference does not model."""
    source = _source(cls.forward)
    return _positions_optional(cls) and re.search(
        r"\.view\(batch_size, seq_len, -1, dim\)[\s\S]*apply_rotary_pos_emb", source) is not None


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
