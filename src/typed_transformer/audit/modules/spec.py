"""A module's description: :class:`ModuleSpec` (how to call it, which weights it has, which features it adds to the
paper's attention), its options, and the registry of shipped specs."""

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from jaxtyping import Float64
from torch import Tensor, nn

from ...shapecheck import shape_checked
from ..core.conventions import DEFAULT_CONVENTIONS, AuditUsageError, Conventions
from ..core.examples import import_line
from .positions import ALiBi, DecomposedRelPos, Disentangled, MRope, PositionBias, RelativeKeys, Rotary
from .variants import Differential, Latent, OutputGate

#: ``forward(module, x, key, value, keep, is_causal) -> (b, t, e)``: call the module on ``x (b, t, eq)`` (and
#: ``key (b, s, ek)``, ``value (b, s, ev)``; both None for a self-attention spec) with the canonical keep-mask
#: ``keep (b, 1 or h, t, s)`` (True = may attend, or None) in the module's own convention.
Forward = Callable[[Any, Tensor, Tensor | None, Tensor | None, Tensor | None, bool], Tensor]


@shape_checked
@dataclass(frozen=True)
class Weights:
    """A module's projections in float64, query heads in canonical ``(g r)`` order: ``w* (out, in)``."""

    wq: Float64[Tensor, "hd eq"]
    wk: Float64[Tensor, "gd ek"]
    wv: Float64[Tensor, "gdv ev"]
    wo: Float64[Tensor, "eo hdv"] | None
    bq: Float64[Tensor, " hd"] | None
    bk: Float64[Tensor, " gd"] | None
    bv: Float64[Tensor, " gdv"] | None
    bo: Float64[Tensor, " eo"] | None
    h: int
    g: int
    d: int
    dv: int
    scale: float
    #: key and value positions the module appends after the projection (``nn.MultiheadAttention``'s
    #: ``add_bias_kv`` then ``add_zero_attn``): ``(n, g d)`` and ``(n, g dv)``; always visible
    extra_k: Float64[Tensor, "n gd"] | None = None
    extra_v: Float64[Tensor, "n gdv"] | None = None
    #: an output gate's projection of the query input, ``(h, eq)`` (one gate per head) or ``(h dv, eq)`` (one per
    #: output feature), query heads in canonical order: the attention output is multiplied by ``sigmoid(x wg^T + bg)``
    wg: Float64[Tensor, "ng eq"] | None = None
    bg: Float64[Tensor, " ng"] | None = None
    #: attention sinks: one learned logit per query head (canonical order), in each row's softmax denominator
    sinks: Float64[Tensor, " nh"] | None = None

    __shape_checked__ = ("__init__",)

#: The specs ``audit_module(..., spec="name")`` accepts by name: :mod:`typed_transformer.audit.specs` registers
#: the shipped ones here when the package loads (this module never imports it).
SHIPPED_SPECS: dict[str, "ModuleSpec"] = {}


#: The library specs read from the module (``audit_module(module, "litgpt")``, ``"auto"``): name -> reader;
#: :mod:`typed_transformer.audit.specs.libraries` registers them when the package loads (this module never imports it).
LIBRARY_READERS: dict[str, Callable[[Any], "ModuleSpec"]] = {}


def library_setup(module: Any, name: str) -> str:
    """Lines that define ``module`` and ``spec`` in a fresh interpreter for a library spec (the repro's top): the
    module from the factory that built it when it can be imported, then ``library_spec(module, name)``."""
    line = None if isinstance(module, nn.Module) else import_line(module, "factory")
    built = (f"{line}\nmodule = factory()" if line is not None else
             f"module = ...  # the {type(module).__qualname__ if isinstance(module, nn.Module) else 'module'} you "
             f"audited: build it here (pass a factory to get this line filled in)")
    return f"{built}\nfrom typed_transformer.audit import library_spec\nspec = library_spec(module, {name!r})"


@dataclass(frozen=True)
class ModuleSpec:
    """How to audit one kind of attention module. Attribute paths are dotted (``"config.num_heads"``; a path
    may step into a dict). A projection is a module with ``weight`` and ``bias`` (``nn.Linear``), given by
    ``q``/``k``/``v`` or by ``qkv`` (one fused projection whose output is ``[q; k; v]``); ``transposed``:
    weights stored ``(in, out)`` (Hugging Face's ``Conv1D``). ``out=None``: no output projection.
    ``num_kv_heads=None``: as many as query heads; ``head_dim=None``: query width / heads; ``scale=None``:
    ``1 / sqrt(head_dim)``. ``grouping``: ``"g r"`` (query head ``i`` uses kv head ``i // r``) or ``"r g"``
    (``i % g``). ``weights`` replaces the attribute lookup for modules it cannot describe. ``decode(module,
    x)`` runs ``x (b, t, e)`` token by token with the module's KV cache; ``fast_path(module, x, real)`` calls
    its inference fast path with a key padding mask (True = real token); ``build(cls, config)`` constructs
    the module for the CLI. ``conventions`` say what the module supports (``self_attention=True``: one
    input).

    Shapes beyond plain self-attention: ``memory=True``: cross-attention with one memory tensor for keys and
    values (``forward`` gets it as both ``key`` and ``value``); ``position_bias``: an additive bias in the
    logits (T5's relative bias, ALiBi: :func:`alibi_bias`), the scale then often ``1.0``; ``window``: sliding
    window of that many keys (a number or attribute path; query position ``p`` sees keys ``j > p - window``,
    in the reference and in token-by-token decoding); ``q_norm``/``k_norm``: modules normalising each head's
    queries/keys before the rotary embedding (the reference recomputes LayerNorm, or RMSNorm when the module has
    no bias, from their weights and ``eps``/``variance_epsilon``; over each head, or over every head at once when
    the weight is ``h * d`` wide, as OLMo-2's; Gemma's ``(1 + weight)`` scaling is read from its source);
    ``qkv_layout``: how a fused projection's outputs are ordered, ``"blocks"`` (``[q; k; v]``), ``"heads"``
    (GPT-NeoX's ``(h [q k v] d)``) or ``"groups"`` (Falcon's ``(g [q_1 .. q_r k v] d)``: each key/value head after
    its ``r`` query heads; ``"heads"`` when ``g = h``, ``"blocks"`` when ``g = 1``)."""

    name: str
    forward: Forward
    conventions: Conventions = DEFAULT_CONVENTIONS
    q: str | None = "q_proj"
    k: str | None = "k_proj"
    v: str | None = "v_proj"
    qkv: str | None = None
    out: str | None = "o_proj"
    transposed: bool = False
    num_heads: str = "num_heads"
    num_kv_heads: str | None = None
    head_dim: str | None = None
    scale: float | str | None = None
    grouping: Literal["g r", "r g"] = "g r"
    rotary: Rotary | None = None
    weights: Callable[[Any], "Weights"] | None = None
    decode: Callable[[Any, Tensor], Tensor] | None = None
    fast_path: Callable[[Any, Tensor, Tensor], Tensor | None] | None = None
    build: Callable[[type, dict[str, Any]], nn.Module] | None = None
    module_type: str = ""
    memory: bool = False
    position_bias: PositionBias | None = None
    #: a gate on the position bias (WavLM's gated relative position bias): ``position_gate(module, x) -> (b, h, t)``
    #: from the query input ``x (b, t, e)`` in float64, each query row's bias of each head multiplied by its factor
    position_gate: Callable[[Any, Tensor], Tensor] | None = None
    window: int | str | None = None
    #: block-local attention (Granite Speech's conformers): the sequence cut into consecutive blocks of that many
    #: tokens (a number or attribute path) from the first, each query seeing only the keys of its own block
    #: (:func:`block_mask`; self-attention)
    blocks: int | str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    #: a norm on each value head (Gemma 3n's and Gemma 4's ``v_norm``, an RMSNorm without a weight), as the q/k norms
    v_norm: str | None = None
    qkv_layout: Literal["blocks", "heads", "groups"] = "blocks"
    #: the q/k norms apply to the turned queries and keys (HunYuan's order), not before the rotary embedding
    norms_after_rotary: bool = False
    #: logit soft-capping (Gemma 2): the cap ``c`` (a number or an attribute path; None there: no cap), the scaled
    #: logits become ``c * tanh(l / c)`` before the bias and the mask
    softcap: float | str | None = None
    #: clipping of the projections (DBRX's and OLMo's ``clip_qkv``): the bound ``c`` (a number or an attribute
    #: path; None there: no clipping), each of q, k and v becomes ``clamp(x W + b, -c, c)`` before any norm or rotary
    clip_qkv: float | str | None = None
    #: attention sinks (gpt-oss): the attribute holding one learned logit per query head
    sinks: str | None = None
    #: an output gate: ``out * sigmoid(gate(x))`` on the attention output before the output projection
    gate: "OutputGate | None" = None
    #: a norm on the attention output ``(b, t, h dv)`` before the gate and the output projection (BitNet's
    #: ``attn_sub_norm``): recomputed as the q/k norms are, over every head when its weight is ``h dv`` wide
    sub_norm: str | None = None
    #: q/k norms the spec computes itself, from the module: ``norms(module) -> {"q": f, "k": f}`` with ``f`` on
    #: ``(b, h or g, t, d)`` heads in canonical order (x-transformers' l2 ``qk_norm``); before the rotary embedding
    norms: Callable[[Any], dict[str, Callable[[Tensor], Tensor]]] | None = None
    #: ALiBi: a per-head linear bias of the key-query distance with the paper's slopes, added to the scaled logits
    #: (beside ``position_bias`` when both are given)
    alibi: ALiBi | None = None
    #: differential attention (DiffLlama): two softmax maps per head subtracted with a learned lambda
    differential: Differential | None = None
    #: multi-head latent attention (DeepSeek V2/V3): where its low-rank projections are; ``weights`` is then
    #: :func:`latent_weights` and the reference projects through the latent itself
    latent: Latent | None = None
    #: decomposed relative positions (SAM's image encoder, MViTv2): a query-dependent bias from two learned tables
    decomposed: DecomposedRelPos | None = None
    #: DeBERTa's disentangled attention: content-to-position and position-to-content terms in the logits
    disentangled: Disentangled | None = None
    #: relative position embeddings the queries meet (Shaw's on the keys, Transformer-XL's): :class:`RelativeKeys`
    relative_keys: RelativeKeys | None = None
    #: M-RoPE with 3-D positions (Qwen2-VL): each frequency section turns by its own axis of
    #: :func:`mrope_positions`; the spec's forward passes the module those positions
    mrope: MRope | None = None
    #: ``unmodelled(module)``: the constructor options this module was built with that the spec does not model,
    #: each named (``"sparse_topk=2"``); a module with any is refused before any check runs
    unmodelled: Callable[[Any], list[str]] | None = None
    #: keys and values over the memory followed by the query input's own tokens (Idefics2's perceiver resampler:
    #: ``concat(context, latents)``, its queries from the latents alone): the ``t`` appended keys are visible to
    #: every query (its model's mask ends in ones for them); with rotary positions the memory's keys are at
    #: ``0..s-1``, the input's tokens (queries and their keys) at ``s..s+t-1``
    keys_with_input: bool = False
    #: the longest sequence the module takes (a number, or an attribute path: torchtune's ``max_seq_len``, the
    #: length of a rotary cache it does not grow): no example is longer, and the report lists the lengths past it
    #: as not tested (None: any length)
    max_length: int | str | None = None
    #: a two-sided local window (LongT5's local attention): query position ``p = i + s - t`` sees the keys ``j`` with
    #: ``|p - j| <= radius``, on top of the masks (a number, or an attribute path; None there: no window)
    radius: int | str | None = None


#: Python lines that rebuild a spec in a fresh interpreter once ``module`` is defined (``hf_spec`` registers
#: ``spec = hf_spec(module)`` for the specs it makes; a spec changed afterwards is another key, not found here)
REBUILDS: "weakref.WeakKeyDictionary[ModuleSpec, str]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Options:
    """Every constructor option of a library's attention class, as its spec treats it (the tests check the list
    against the class's own signature, so an option a new release adds fails them until it is listed here):
    ``modelled`` (the spec reads it from the module), ``refused`` (the spec refuses a module built with it, by name,
    before any check runs) or ``inert`` (no effect on what the audit compares: dropout, off in the audit's eval
    mode; device and dtype; an option read only together with a refused one). An option both modelled and refused
    is modelled for some values and refused for the others (the message names the value)."""

    #: the class (``module.path.Name``) whose constructor (litgpt: whose ``Config`` fields its code reads) is listed
    cls: str
    modelled: tuple[str, ...]
    refused: tuple[str, ...]
    inert: tuple[str, ...] = ()


def resolve(module: Any, path: str, spec: str) -> Any:
    """``module.a.b`` for ``path="a.b"`` (steps into dicts too); a path of digits that names no attribute is that
    number (a literal head count); a missing attribute is an :class:`AuditUsageError` that names it."""
    if path.isdigit() and not hasattr(module, path):  # a literal count (a single-head class keeps none)
        return int(path)
    value = module
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise AuditUsageError(f"{type(module).__name__} does not match spec {spec!r}: it has no attribute "
                                  f"{path!r} ({part!r} is missing on {type(value).__name__})")
    return value
