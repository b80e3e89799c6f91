"""The classic Hugging Face layouts :func:`~typed_transformer.audit.hf_spec` reads besides the common shape, by the
names transformers gives them: separate ``query/key/value`` (BERT and its descendants), ``q/k/v/o`` (T5),
``q_lin/k_lin/v_lin/out_lin`` (DistilBERT), ``out_proj`` (BART, CLIP, OPT, GPT-J), fused ``c_attn`` ``Conv1D``
weights stored ``(in, out)`` (GPT-2), ``Wqkv/Wo`` (ModernBERT), CodeGen's fused ``qkv_proj`` laid out per model-
parallel group (``[q v k]`` in each of ``mp_num`` groups), and an *attention block*: the self-attention module
(a child, e.g. BERT's ``self``) with the output projection in a sibling module (BERT's ``output.dense``).

A block's residual connection and its LayerNorm (BERT's post-norm ``LayerNorm(x + dense(attention))``, T5's
pre-norm ``x + attention(LayerNorm(x))``) are the layer's "Add & Norm", not attention: the audit calls the block's
own ``forward`` with those norms replaced by the identity and subtracts the input, so that what it compares with the
reference is the output projection of the attention, computed by the block's own code (:func:`bypass_norms`)."""

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..core.conventions import AuditUsageError
from ..modules.repro import init_parameters  # constructors read through decorators

_Q = ("q_proj", "query", "q", "q_lin", "to_q", "query_proj", "linear_q", "project_q", "Wq")
_K = ("k_proj", "key", "k", "k_lin", "to_k", "key_proj", "linear_k", "project_k", "Wk")
_V = ("v_proj", "value", "v", "v_lin", "to_v", "value_proj", "linear_v", "project_v", "Wv")
_FUSED = ("qkv_proj", "c_attn", "Wqkv", "qkv", "in_proj", "qkv_linear", "att_proj", "query_key_value")
#: fused projections laid out per head, ``(h [q k v] d)``: GPT-NeoX's name, kept by Persimmon and GPT-NeoX-Japanese
_PER_HEAD = ("query_key_value",)
_OUT = ("o_proj", "out_proj", "o", "out_lin", "c_proj", "Wo", "dense", "proj", "to_out", "projection", "output",
        "linear_out", "attention_out", "proj_out", "projection_layer")
#: a sibling module that holds the output projection (BERT's ``output``: ``BertSelfOutput.dense``)
_OUTPUT_MODULES = ("output",)
_HEADS = ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_attn_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_heads")
_HEAD_DIM = ("head_dim", "attention_head_size", "key_value_proj_dim", "head_size", "dim_per_head")
_SCALE = ("scaling", "scale", "inv_norm_factor")


@dataclass(frozen=True)
class Layout:
    """Where a class's projections and sizes are: paths relative to the audited module (``core`` is the prefix of
    the submodule that holds the query/key/value projections: ``""`` or ``"self."``)."""

    core: str
    q: str | None
    k: str | None
    v: str | None
    qkv: str | None
    out: str | None
    transposed: bool
    num_heads: str
    num_kv_heads: str | None
    head_dim: str | None
    scale: float | str | None
    #: the core has T5's relative position bias (``relative_attention_bias``): the reference adds it, scale 1
    relative_bias: bool = False
    #: the norm modules outside the core (a block's Add & Norm, bypassed when the block has a residual)
    norms: tuple[str, ...] = ()
    #: CodeGen: a fused projection laid out per model-parallel group, read by this function instead
    weights: Callable[[Any], Any] | None = None
    #: how the fused projection's outputs are ordered (:class:`~typed_transformer.audit.ModuleSpec`'s field)
    qkv_layout: str = "blocks"
    #: other children the layout reads (DETR decoders' position projections, which get zero inputs)
    extra_reads: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The :class:`~typed_transformer.audit.ModuleSpec` fields this layout gives."""
        return {"q": self.q, "k": self.k, "v": self.v, "qkv": self.qkv, "out": self.out,
                "transposed": self.transposed, "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "scale": self.scale,
                **({"weights": self.weights} if self.weights is not None else {}),
                **({"qkv_layout": self.qkv_layout} if self.qkv_layout != "blocks" else {})}

    def reads(self) -> set[str]:
        """The module's direct children the layout reads (a block's norms, which it bypasses; a norm of the
        attention module itself, such as BitNet's sub-norm, is not read)."""
        paths = [self.core, self.q, self.k, self.v, self.qkv, self.out, *(self.norms if self.core else ()),
                 *self.extra_reads]
        return {p.split(".")[0] for p in paths if p}


def _projection(module: Any, name: str) -> bool:
    """``module.name`` is a projection: a module with a 2-D weight (``nn.Linear``, Hugging Face's ``Conv1D``), or a
    1x1 ``nn.Conv1d`` over channels (SqueezeBERT's, grouped: block-diagonal)."""
    layer = getattr(module, name, None)
    weight = getattr(layer, "weight", None)
    if isinstance(layer, nn.Conv1d):
        return (tuple(layer.kernel_size) == (1,) and tuple(layer.stride) == (1,) and tuple(layer.dilation) == (1,)
                and layer.padding in ((0,), "valid"))
    return isinstance(layer, nn.Module) and isinstance(weight, Tensor) and weight.ndim == 2


def _path(module: Any, name: str) -> str | None:
    """``name`` when ``module.name`` is a projection; ``name.linear`` when it wraps one (Moshi's ``MoshiLinear``,
    Gemma 4's ``Gemma4ClippableLinear``: an ``nn.Linear`` in a child named ``linear``), ``name.0`` when it is a list
    whose only projection is its first item; else None."""
    if _projection(module, name):
        return name
    inner = getattr(module, name, None)
    if (isinstance(inner, nn.ModuleList) and len(inner) and _projection(inner, "0")
            and not any(_projection(inner, str(i)) for i in range(1, len(inner)))):
        return f"{name}.0"  # diffusers' to_out = [Linear, Dropout] (Qwen2.5-Omni's DiTAttention), not a list of them
    return f"{name}.linear" if isinstance(inner, nn.Module) and _projection(inner, "linear") else None


def _first(module: Any, names: tuple[str, ...], kind: type | tuple[type, ...]) -> str | None:
    return next((n for n in names if isinstance(getattr(module, n, None), kind)
                 and not isinstance(getattr(module, n), bool)), None)


def _output(module: nn.Module, core: nn.Module, prefix: str, used: set[str]) -> str | None:
    """The output projection: in the core, then in the module beside it, then in a sibling output module."""
    own = next((p for n in _OUT if n not in used and (p := _path(core, n)) is not None), None)
    if own is not None:
        return prefix + own
    if prefix:
        beside = next((n for n in _OUT if _projection(module, n)), None)
        if beside is not None:
            return beside
    for name in _OUTPUT_MODULES:
        child = getattr(module if prefix else core, name, None)
        inner = next((n for n in _OUT if child is not None and _projection(child, n)), None)
        if inner is not None:
            return f"{name}.{inner}"
    return None


def _config_heads(config: Any, core: Any, width: int | None) -> str | None:
    """The config field that holds the head count of a class whose constructor reads it under a name of its own
    (LW-DETR's ``decoder_self_attention_heads``): an integer field named ``*_heads`` whose value times the class's
    ``head_dim`` is the query projection's width (``width``); None unless exactly one value fits."""
    head_dim = getattr(core, "head_dim", None)
    if config is None or width is None or not isinstance(head_dim, int) or head_dim <= 0:
        return None
    fields = {n: v for n, v in vars(config).items() if n.endswith("_heads") and type(v) is int
              and n not in _KV_HEADS and v * head_dim == width}
    return sorted(fields)[0] if len(set(fields.values())) == 1 else None


def _nested_heads(config: Any, core: Any, width: int | None) -> str | None:
    """The path, under the config, of the ``num_attention_heads`` of a nested config (breadth first) that sizes a
    class taking its sizes from a sub-config (EsmFold2's atom attention: ``atom_config.head_dim``, its heads the
    ``-1`` of ``view(..., -1, head_dim)``): the first whose head count times the class's ``head_dim`` is the query
    projection's width (``width``), which the class's reshape then implies; None if none fits."""
    from transformers import PretrainedConfig

    head_dim = getattr(core, "head_dim", None)
    if config is None or width is None or not isinstance(head_dim, int) or head_dim <= 0:
        return None
    level: list[tuple[str, Any]] = [("", config)]
    for _ in range(4):
        level = [(f"{path}{name}.", v) for path, c in level for name, v in vars(c).items()
                 if isinstance(v, PretrainedConfig)]
        for path, c in level:
            heads = getattr(c, "num_attention_heads", None)
            if type(heads) is int and heads * head_dim == width and getattr(c, "head_dim", None) == head_dim:
                return f"{path}num_attention_heads"
    return None


def _single_head(cls: Any) -> bool:
    """One head over every channel, no head count kept (WavTokenizer's Vocos attention, a VAE-style block: 1x1
    convolutions, ``torch.bmm`` of the whole query and key, scaled by ``channels**-0.5``, no split into heads)."""
    source = _forward_source(cls)
    return (re.search(r"\btorch\.bmm\(", source) is not None and re.search(r"\bchannels\s*\*\*\s*-0\.5", source)
            is not None and re.search(r"\.(view|reshape|unflatten)\(|rearrange|num_heads|head_dim", source) is None)


def _sizes(core: Any, prefix: str, width: int | None = None) -> tuple[str, str | None, str | None, float | str | None]:
    """Head counts: the module's own attribute first (what its constructor chose: Inkling's sliding layers and Dia's
    cross-attention read prefixed config fields, GPT-BigCode's ``kv_heads`` is 1 with ``multi_query``), then the
    config's (``num_attention_heads``, or the ``*_heads`` field that fits the query's ``width``)."""
    config = getattr(core, "config", None)
    own = _first(core, _HEADS, int)
    if own is not None:
        heads = prefix + own
    elif isinstance(getattr(config, "num_attention_heads", None), int):
        heads = prefix + "config.num_attention_heads"
    elif (field := _config_heads(config, core, width) or _nested_heads(config, core, width)) is not None:
        heads = f"{prefix}config.{field}"  # (a nested config's: EsmFold2's atom_config)
    elif _single_head(type(core)):
        heads = "1"  # a literal count (resolve reads a path of digits as the number)
    else:
        raise AuditUsageError(f"{type(core).__qualname__}: no head count (none of {', '.join(_HEADS)}, no "
                              f"config.num_attention_heads)")
    own_kv = _first(core, _KV_HEADS, int)
    if own_kv is not None:
        kv: str | None = prefix + own_kv
    elif getattr(config, "num_key_value_heads", None):
        kv = prefix + "config.num_key_value_heads"
    else:
        kv = None
    head_dim = _first(core, _HEAD_DIM, int)
    scale: float | str | None = _first(core, _SCALE, (float, int))
    if scale is None and hasattr(core, "has_relative_attention_bias") and not re.search(
            r"math\.sqrt\(self\.\w+\)", _forward_source(type(core))):
        scale = 1.0  # T5 (before transformers gave it a scaling attribute): no 1/sqrt(d); not LayoutLMv2's
    if scale is None and _unscaled(type(core)):
        scale = 1.0  # GPT-Neo: unscaled logits
    flag = next((getattr(core, n) for n in _SCALE if isinstance(getattr(core, n, None), bool)), None)
    if scale is None and flag is False and re.search(r"if self\.scale:\n\s+\w+ = \w+ / math\.sqrt\(",
                                                     _source_of(type(core))):
        scale = 1.0  # GPT-1's Attention(..., scale=False), its constructor's default: the logits divided by nothing
    if isinstance(scale, str) and getattr(core, scale) == 1.0 and re.search(
            r"query\w* = query\w* \* self\.\w+\s*\*\*\s*-0\.5", _forward_source(type(core))):
        scale = None  # ESM: scaling 1.0 in the attention call, the query scaled by head_size**-0.5 before it
    return (heads, kv, None if head_dim is None else prefix + head_dim,
            prefix + scale if isinstance(scale, str) else scale)


def _forward_source(cls: Any) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (AttributeError, OSError, TypeError):
        return ""


def _source_of(cls: Any) -> str:
    """The source of a class (its methods: GPT-1 scales its logits in ``_attn``, not in ``forward``)."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _unscaled(cls: Any) -> bool:
    """GPT-Neo: its ``_attn`` takes ``q k^T`` as the logits, multiplied or divided by nothing (no scale)."""
    try:
        source = inspect.getsource(cls._attn)
    except (AttributeError, OSError, TypeError):
        return False
    return ("attn_weights = torch.matmul(query, key.transpose(-1, -2))" in source
            and not re.search(r"scale|sqrt|attn_weights (/|\*)|attn_weights = attn_weights (/|\*)", source))


def _norms(module: nn.Module, prefix: str, qk_norms: tuple[str | None, str | None]) -> tuple[str, ...]:
    """Norm modules of ``module`` outside its core (a LayerNorm, or a class whose name says Norm and that holds no
    projection: RoBERTa-PreLayerNorm's ``RobertaPreLayerNormSelfOutput`` is the output block, not a norm)."""
    found: list[str] = []
    for name, child in module.named_modules():
        inside = bool(prefix) and (name + ".").startswith(prefix)
        if not name or inside or name in qk_norms or any(name.startswith(f"{f}.") for f in found):
            continue
        projects = any(_projection(c, n) for c in child.modules() for n, _ in c.named_children())
        if isinstance(child, nn.LayerNorm | nn.RMSNorm) or ("Norm" in type(child).__name__ and not projects):
            found.append(name)
    return tuple(found)


def find_layout(module: nn.Module, qk_norms: tuple[str | None, str | None] = (None, None)) -> Layout:
    """The layout of ``module``: its query/key/value projections (in itself or in a child), the output projection,
    the head count, head size and scale (attributes of the core, or its config).

    Raises:
        AuditUsageError: no query/key/value projections under the known names.
    """
    for prefix, core in [("", module)] + [(f"{n}.", c) for n, c in module.named_children()]:  # noqa: B007
        q, k, v = (next((p for n in names if (p := _path(core, n)) is not None), None) for names in (_Q, _K, _V))
        if q and k and v is None and re.search(r"if self\.v_proj is not None else key_states",
                                               _forward_source(type(core))):
            v = k  # Gemma 4's attention_k_eq_v: the values are the keys' projection (before k_norm, then v_norm)
        fused = None if q and k and v else next((n for n in _FUSED if _projection(core, n)), None)
        if q and k is None and v is None and fused is None and _projection(core, "to_kv"):
            break  # a query projection and a fused [k; v] one (Granite Speech's to_q and to_kv)
        if (q and k and v) or fused:
            break
    else:
        content = content_layout(module) or projected_layout(module) or kv_layout(module)
        if content is not None:
            return content
        raise AuditUsageError(f"{type(module).__qualname__}: no query/key/value projections (looked for "
                              f"{'/'.join(_Q)}, {'/'.join(_K)}, {'/'.join(_V)} or a fused {'/'.join(_FUSED)}, in "
                              f"the class and its children)")
    kv_fused = q is not None and k is None and v is None and fused is None
    if kv_fused and not prefix and _first(core, _HEADS, int) is None and (own := kv_layout(core)) is not None:
        return own  # its head count in ``heads`` (Evolla's compressor)
    if kv_fused:
        k = v = "to_kv"
    used = {n.split(".")[0] for n in (q, k, v, fused) if n}
    out = _output(module, core, prefix, used)
    heads, kv, head_dim, scale = _sizes(core, prefix, _width(core, q) if q else None)
    if kv_fused:
        return Layout(prefix, prefix + str(q), prefix + "to_kv", prefix + "to_kv", None, out, False, heads, kv,
                      head_dim, scale, norms=_norms(module, prefix, qk_norms),
                      weights=_kv_weights(prefix + str(q), prefix + "to_kv", out, heads, scale))
    if kv is not None and kv.endswith("config.num_key_value_heads") and q and k and _width(core, q) == _width(core, k):
        kv = None  # a config field the class never reads (Whisper-like audio encoders): keys as wide as queries
    first = core.get_submodule(fused or q or "")
    groups = _mp_num(core) if fused is not None else None
    return Layout(prefix, None if fused else prefix + str(q), None if fused else prefix + str(k),
                  None if fused else prefix + str(v), prefix + fused if fused else None, out,
                  type(first).__name__ == "Conv1D", heads, kv, head_dim, scale,
                  relative_bias=isinstance(getattr(core, "relative_attention_bias", None), nn.Embedding),
                  norms=_norms(module, prefix, qk_norms),
                  weights=_codegen_weights(prefix, str(fused), out, groups) if groups else None,
                  qkv_layout="heads" if fused in _PER_HEAD or _split_per_head(core, fused) else "blocks")


_CONTENT = re.compile(r"(\w*?)(q|query)_content_proj")


def content_zero_args(cls: Any) -> dict[str, str]:
    """The forward arguments of a DETR decoder's attention (Conditional DETR's, DAB-DETR's: content projections
    ``q_content_proj``/``k_content_proj`` beside position projections ``q_pos_proj``/``k_pos_proj``/
    ``q_pos_sine_proj``) that feed its position projections, which the audit passes as zeros, each with the side it
    belongs to (``"key"``: it feeds key position projections only, zeros like the keys' input; ``"query"``: query
    ones only; ``"both"``: a self-attention's, which feeds both); not an optional one the forward tests for None
    (Conditional DETR's cross-attention ``query_position_embeddings``, which its model passes to the first layer
    only: left None, as for the other layers)."""
    source = _forward_source(cls)
    signature = inspect.signature(cls.forward).parameters
    found: dict[str, str] = {}
    for call in re.finditer(r"self\.(\w*pos\w*proj)\((\w+)\)", source):
        name, arg = call.group(1), call.group(2)
        if arg not in signature or (signature[arg].default is None and f"if {arg} is not None:" in source):
            continue
        side = "key" if re.search(r"(^|_)(k|key)_pos\w*_proj$", name) else "query"
        found[arg] = side if found.get(arg, side) == side else "both"  # both: a self-attention's
    return found


def _branch_taken(module: Any, source: str, at: int, zeros: dict[str, str]) -> bool | None:
    """Whether the statement at ``at`` in ``source`` runs when the audit calls the class (its zero arguments given,
    the others left None): True outside any ``if``; an ``if X is not None:`` on a forward argument, or an ``if`` on
    the module's own flags (``self.is_first or self.keep_query_pos``), evaluated; None for any other condition."""
    start = source.rfind("\n", 0, at) + 1
    line = source[start:at]
    indent = len(line) - len(line.lstrip())
    for above in reversed(source[:start].splitlines()):
        stripped = above.lstrip()
        if not stripped or len(above) - len(stripped) >= indent:
            continue
        indent = len(above) - len(stripped)
        if stripped.startswith(("def ", ")")):  # the signature: the forward's own body is reached
            return True
        none = re.fullmatch(r"if (\w+) is not None:", stripped)
        flags = re.fullmatch(r"if (self\.\w+(?: (?:or|and) self\.\w+)*):", stripped)
        if none is not None:
            if none.group(1) not in zeros:
                return False
        elif flags is not None:
            # "a or b and c": or of ands, each term a flag of the module
            if not any(all(bool(getattr(module, term.strip()[5:])) for term in either.split(" and "))
                       for either in flags.group(1).split(" or ")):
                return False
        elif re.match(r"(elif|else|for|while|with|try|except|finally)\b", stripped):
            return None
        # else the opening line of a statement continued below (Conditional DETR's ``query_states = (``)
    return True


def _added_bias(module: Any, source: str, projection: str, zeros: dict[str, str]) -> bool | None:
    """Whether the forward adds ``self.<projection>(...)`` (a position projection of a zero input: its bias) to the
    content projection: ``+ self.<projection>(`` or ``+ <name>`` of the name it was assigned to, on a path the audit's
    call takes; None when a condition on that path is not one :func:`_branch_taken` reads."""
    if getattr(module, projection, None) is None:
        return False  # DAB-DETR's cross_attn_query_pos_proj, None in the layers that do not use it
    assigned = re.search(rf"(\w+) = self\.{projection}\(", source)
    forms = [rf"\+ self\.{projection}\("] + ([rf"\+ {assigned.group(1)}\b"] if assigned else [])
    taken = [_branch_taken(module, source, m.start(), zeros) for form in forms for m in re.finditer(form, source)]
    return None if None in taken else any(taken)


def content_layout(module: nn.Module) -> Layout | None:
    """A DETR decoder's attention with content and position projections (Conditional DETR's
    ``q_content_proj``/``q_pos_proj``/..., DAB-DETR's ``self_attn_query_content_proj``/... around its
    ``DabDetrAttention``, which adds them before the dot product): audited with zero positions (the arguments of
    :func:`content_zero_args`), so a position projection gives its bias only. The queries and keys are then the
    content projections, with the biases of the position projections the forward adds on the audit's path; a part
    concatenated to each head (Conditional DETR's ``q_pos_sine_proj`` of the sine embedding beside ``k_pos_proj`` of
    the keys' positions) is then one constant per head in the logits, which the softmax cancels, and the scale is the
    class's (over the doubled head). None when the class is not of that form."""
    found = next((m for n, _ in module.named_children() if (m := _CONTENT.fullmatch(n)) and _projection(module, n)),
                 None)
    if found is None:
        return None
    prefix = found.group(1)
    long = found.group(2) == "query"
    names = {s: f"{prefix}{(w if long else w[0])}_{{}}_proj" for s, w in (("q", "query"), ("k", "key"))}
    q, k = names["q"].format("content"), names["k"].format("content")
    v = f"{prefix}{'value' if long else 'v'}_proj"
    if not (_projection(module, k) and _projection(module, v)):
        return None
    source = _forward_source(type(module))
    zeros = content_zero_args(type(module))
    added = {s: _added_bias(module, source, names[s].format("pos"), zeros) for s in ("q", "k")}
    # a concatenated part must be a position projection (of zeros: a constant)
    for cat in re.finditer(r"torch\.cat\(\[(\w+), (\w+)\]", source):
        if not re.search(rf"\b{cat.group(2)} = self\.\w*pos\w*_proj\(", source):
            return None
    if None in added.values() or not zeros:
        return None
    attention = [(n, c) for n, c in module.named_children() if not _projection(module, n) and any(
        _projection(c, o) for o in ("o_proj", "output_proj", "out_proj"))]
    owner, inner = (f"{attention[0][0]}.", attention[0][1]) if len(attention) == 1 else ("", module)
    out = next((owner + o for o in ("o_proj", "output_proj", "out_proj") if _projection(inner, o)), None)
    own = _first(inner, (*_HEADS, "attention_heads"), int)
    heads = owner + own if own is not None else _sizes(module, "", _width(module, q))[0]
    scale = _first(inner, _SCALE, (float, int))
    if out is None or scale is None:
        return None
    positions = tuple(n for n, c in module.named_children() if "pos" in n and _projection(module, n))
    norms = _norms(module, owner, (None, None))
    plain = (q, k, v, out, heads, owner + scale)

    def read(m: Any) -> Any:
        from ..modules.spec import Weights, resolve

        def linear(name: str) -> tuple[Tensor, Tensor | None]:
            layer = m.get_submodule(name)
            return layer.weight.detach().double(), None if layer.bias is None else layer.bias.detach().double()

        def plus(bias: Tensor | None, side: str) -> Tensor | None:
            extra = linear(names[side].format("pos"))[1] if added[side] else None
            return extra if bias is None else bias if extra is None else bias + extra

        (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (linear(n) for n in plain[:4])
        bq, bk = plus(bq, "q"), plus(bk, "k")
        # the head size the class split its heads by (Conditional DETR's self-attention keeps no head count)
        size = getattr(m.get_submodule(owner.rstrip(".")) if owner else m, "head_dim", None)
        h = wq.shape[0] // size if isinstance(size, int) and size > 0 else int(resolve(m, plain[4], type(m).__name__))
        return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, h, wq.shape[0] // h, wv.shape[0] // h,
                       float(resolve(m, plain[5], type(m).__name__)))

    return Layout("", q, k, v, None, out, False, heads, None, None, owner + scale, norms=norms, weights=read,
                  extra_reads=positions + norms)


#: the forward arguments of a class that takes its keys and values already projected (DAB-DETR's ``DabDetrAttention``)
PROJECTED = ("key_states", "value_states")


def projected_layout(module: nn.Module) -> Layout | None:
    """A class that takes its queries (its input), keys and values already projected, its decoder layer's projections
    outside it (DAB-DETR's ``DabDetrAttention``: ``forward(hidden_states, attention_mask, key_states, value_states)``,
    only an output projection of its own): audited over separate query, key and value inputs with identity
    projections; None for any other class."""
    source = _forward_source(type(module))
    signature = inspect.signature(type(module).forward).parameters
    own = [n for n, _ in module.named_children() if _projection(module, n)]
    if (not all(n in signature for n in PROJECTED) or len(own) != 1 or own[0] not in (*_OUT, "output_proj")
            or not re.search(r"query_states = hidden_states\b", source)):
        return None
    heads = _first(module, (*_HEADS, "attention_heads"), int)
    head_dim = _first(module, ("attention_head_dim", *_HEAD_DIM), int)
    value_dim = _first(module, ("values_head_dim",), int)
    scale = _first(module, _SCALE, (float, int))
    if heads is None or head_dim is None or scale is None:
        return None
    out = own[0]

    def read(m: Any) -> Any:
        from ..modules.spec import Weights

        h, d = int(getattr(m, heads)), int(getattr(m, head_dim))
        dv = d if value_dim is None else int(getattr(m, value_dim))
        layer = m.get_submodule(out)
        eye = torch.eye(h * d, dtype=torch.float64)
        return Weights(eye, eye.clone(), torch.eye(h * dv, dtype=torch.float64), layer.weight.detach().double(),
                       None, None, None, None if layer.bias is None else layer.bias.detach().double(), h, h, d, dv,
                       float(getattr(m, scale)))

    return Layout("", None, None, None, None, out, False, heads, None, head_dim, scale, weights=read)


def kv_layout(module: nn.Module) -> Layout | None:
    """A query projection ``to_q`` beside a fused key/value one ``to_kv`` whose output the forward halves into keys
    and values (``k, v = self.to_kv(...).chunk(2, dim=-1)``: Evolla's sequence compressor, a Perceiver resampler), the
    head count in ``heads`` and the scale in ``scale``; None for any other class."""
    source = _forward_source(type(module))
    if not (_projection(module, "to_q") and _projection(module, "to_kv") and _projection(module, "to_out")
            and re.search(r"\bk, v = self\.to_kv\(\w+\)\.chunk\(\s*2, dim=-1\s*\)", source)):
        return None
    heads = _first(module, (*_HEADS, "heads"), int)
    scale = _first(module, _SCALE, (float, int))
    if heads is None or scale is None:
        return None

    def read(m: Any) -> Any:
        from ..modules.spec import Weights

        h = int(getattr(m, heads))
        wk, wv = m.to_kv.weight.detach().double().chunk(2, dim=0)
        bk, bv = (None, None) if m.to_kv.bias is None else m.to_kv.bias.detach().double().chunk(2)
        wq, wo = m.to_q.weight.detach().double(), m.to_out.weight.detach().double()
        bq = None if m.to_q.bias is None else m.to_q.bias.detach().double()
        bo = None if m.to_out.bias is None else m.to_out.bias.detach().double()
        return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, h, wq.shape[0] // h, wv.shape[0] // h,
                       float(getattr(m, scale)))

    return Layout("", "to_q", None, None, None, "to_out", False, heads, None, None, scale, weights=read,
                  extra_reads=("to_kv",))


def _split_per_head(core: Any, fused: str | None) -> bool:
    """The fused projection's output split into q, k, v after the split into heads (DeBERTa's
    ``transpose_for_scores(self.in_proj(x)).chunk(3, dim=-1)``): laid out per head, ``(h [q k v] d)``."""
    if fused is None:
        return False
    source = _forward_source(type(core))
    named = re.search(rf"(\w+) = self\.{fused}\(", source)
    return named is not None and re.search(rf"transpose_for_scores\({named.group(1)}\)\.chunk\(3", source) is not None


def _width(core: Any, name: str) -> int:
    """The number of outputs of the projection ``core.name`` (``nn.Linear`` and ``Conv1D`` alike)."""
    projection = core.get_submodule(name)
    weight: Tensor = projection.weight
    return int(weight.shape[1] if type(projection).__name__ == "Conv1D" else weight.shape[0])  # Conv1d: out first


def _mp_num(core: Any) -> int | None:
    """CodeGen's number of model-parallel groups: its ``mp_num`` attribute, or the literal its forward sets
    (``mp_num = 4`` on transformers 5.0)."""
    if isinstance(getattr(core, "mp_num", None), int):
        return int(core.mp_num)
    try:
        found = re.search(r"^\s*mp_num = (\d+)$", inspect.getsource(type(core).forward), re.M)
    except (OSError, TypeError):
        return None
    return int(found.group(1)) if found else None


def _codegen_weights(prefix: str, fused: str, out: str | None, groups: int) -> Callable[[Any], Any]:
    """CodeGen's ``qkv_proj``: ``groups`` (``mp_num``) groups of rows, each ``[q v k]`` (in that order) of
    ``h d / groups``."""

    def read(m: Any) -> Any:
        from ..modules.spec import Weights, resolve

        core = resolve(m, prefix.rstrip("."), "hf") if prefix else m
        w = getattr(core, fused).weight.detach().double()
        q, v, k = rearrange(w, "(mp three l) e -> three (mp l) e", mp=groups, three=3)
        o = None if out is None else resolve(m, out, "hf")
        h, d = int(core.num_attention_heads), int(core.head_dim)
        return Weights(q, k, v, None if o is None else o.weight.detach().double(), None, None, None,
                       None if o is None or o.bias is None else o.bias.detach().double(), h, h, d, d,
                       float(getattr(core, "scaling", d ** -0.5)))

    return read


def _kv_weights(q: str, kv: str, out: str | None, heads: str, scale: float | str | None) -> Callable[[Any], Any]:
    """A query projection and a fused key/value one whose output is ``[k; v]`` (Granite Speech's ``to_kv(x).chunk(2,
    dim=-1)``), each ``(h d)`` wide."""

    def read(m: Any) -> Any:
        from ..modules.spec import Weights, resolve

        def linear(path: str) -> tuple[Tensor, Tensor | None]:
            layer = resolve(m, path, "hf")
            return layer.weight.detach().double(), None if layer.bias is None else layer.bias.detach().double()

        (wq, bq), (wkv, bkv) = linear(q), linear(kv)
        wk, wv = wkv.chunk(2, dim=0)
        bk, bv = (None, None) if bkv is None else bkv.chunk(2, dim=0)
        wo, bo = (None, None) if out is None else linear(out)
        h = int(resolve(m, heads, "hf"))
        d = wq.shape[0] // h
        factor = d ** -0.5 if scale is None else float(scale if isinstance(scale, float) else resolve(m, scale, "hf"))
        return Weights(wq, wk, wv, wo, bq, bk, bv, bo, h, h, d, wv.shape[0] // h, factor)

    return read


def relative_bias(core: str) -> Callable[[Any, int, int], Tensor]:
    """T5's relative position bias of the core at ``core`` (``""``: the module), written out from its embedding
    table by the shipped T5 spec."""
    from ..modules.spec import resolve
    from ..specs.hf import _t5_bias

    def bias(m: Any, t: int, s: int) -> Tensor:
        owner = resolve(m, core.rstrip("."), "hf") if core else m
        if "bidirectional" in inspect.signature(owner._relative_position_bucket).parameters:
            return _t5_bias(owner, t, s)
        # UMT5: a method of its own that reads is_decoder and the bucket sizes from the module
        relative = torch.arange(s)[None, :] - torch.arange(s - t, s)[:, None]
        table: Tensor = owner.relative_attention_bias.weight.detach().double()
        return rearrange(table[owner._relative_position_bucket(relative)], "t s h -> h t s")

    return bias


class _Bypass(nn.Identity):
    """The identity, for a norm called with more than its input (I-BERT's ``IntLayerNorm(x, scaling_factor)``, which
    returns ``(x, scaling_factor)``): what it is given, as it was given."""

    def forward(self, x: Any, *rest: Any) -> Any:
        return (x, *rest) if rest else x


def bypass_norms(module: nn.Module, norms: tuple[str, ...]) -> None:
    """Replace the norm modules at ``norms`` (paths) by the identity, in place (on the audit's copy)."""
    for path in norms:
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        if not isinstance(getattr(parent, name, None), nn.Identity):
            setattr(parent, name, _Bypass())


def has_residual(module: nn.Module, layout: Layout, call: Callable[[nn.Module, Tensor], Tensor], width: int) -> bool:
    """Whether the module adds its input to its output (a block's residual): with the norms outside the core
    bypassed and the output projection zeroed, a residual block returns its input, a plain one zeros."""
    if layout.out is None:
        return False
    # in float64, else in float32 (LayoutLMv2 raises in float64: it fills float32 logits with float64's minimum)
    for dtype, atol in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
        m = _probe_copy(module, layout, dtype)
        x = torch.randn(1, 3, width, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(dtype)
        try:
            with torch.no_grad():
                out = call(m, x)
        except Exception:
            continue
        return bool(out.shape == x.shape and torch.allclose(out, x, rtol=0, atol=atol))
    return False


def _probe_copy(module: nn.Module, layout: Layout, dtype: torch.dtype = torch.float64) -> nn.Module:
    import copy

    m = copy.deepcopy(module).to(dtype).eval()
    bypass_norms(m, layout.norms)
    assert layout.out is not None
    out = m.get_submodule(layout.out)
    with torch.no_grad():
        for p in out.parameters():
            p.zero_()
    return m


# ----------------------------------------------------------------------------------------------------
# constructors: what a class's __init__ takes, read through decorators
# ----------------------------------------------------------------------------------------------------


def config_from_configuration_module(cls: type, module_name: str) -> type | None:
    """The config class of ``cls``'s model package (``configuration_<model>``): the one whose name starts with the
    class's model prefix, else the first (DistilBERT's attention keeps no annotation and its module no pretrained
    model with a ``config_class`` in some versions)."""
    package, _, modeling = module_name.rpartition(".")
    try:
        configuration = importlib.import_module(f"{package}.{modeling.replace('modeling_', 'configuration_', 1)}")
    except ImportError:
        return None
    from transformers import PretrainedConfig

    found = [obj for obj in vars(configuration).values() if isinstance(obj, type) and issubclass(obj, PretrainedConfig)
             and obj.__module__ == configuration.__name__]
    found.sort(key=lambda c: (not cls.__name__.lower().startswith(c.__name__.removesuffix("Config").lower()),
                              len(c.__name__)))
    return found[0] if found else None


#: constructor parameters filled from the tiny config: sizes, the layer index, T5's relative bias on
_SIZE_PARAMS = {"embed_dim": "hidden_size", "hidden_size": "hidden_size", "dim": "hidden_size",
                "d_model": "hidden_size", "embed_size": "hidden_size", "num_heads": "num_attention_heads",
                "num_attention_heads": "num_attention_heads", "n_heads": "num_attention_heads",
                "heads": "num_attention_heads", "num_attn_heads": "num_attention_heads",
                "num_key_value_heads": "num_key_value_heads",
                # an input or output width a constructor takes beside the model's (Sam2's dim_out, SqueezeBERT's
                # cin): the model's width, as in the layers whose sizes do not change
                "kv_in_dim": "hidden_size", "dim_out": "hidden_size", "out_size": "hidden_size",
                "cin": "hidden_size", "hidden_size_output": "hidden_size",
                # GPT-1's Attention(nx, n_positions, config): its width and the size of its causal-mask buffer
                "nx": "hidden_size", "n_positions": "max_position_embeddings"}
#: arguments a constructor requires that are not sizes: no dropout, not causal (the audit passes every mask
#: itself), the first stage
_PLAIN_PARAMS: dict[str, Any] = {"dropout": 0.0, "attention_dropout": 0.0, "is_causal": False, "stage_idx": 0,
                                 # PVT's and SegFormer's key reduction: 1, as their last stage builds it (every key;
                                 # a ratio above 1 pools the keys with a strided convolution)
                                 "sequence_reduction_ratio": 1, "sequences_reduction_ratio": 1,
                                 "spatial_reduction_ratio": 1,
                                 # Funnel's relative attention: the first block's (its position embeddings' index)
                                 "block_index": 0}


def _module_config(config: Any) -> dict[str, Any] | None:
    """The first dict the config holds as ``<part>_config`` (FastSpeech2-Conformer's ``encoder_config``, made from
    its ``encoder_*`` fields when the config was made), its entries read again from those fields (the tiny sizes set
    since: ``encoder_num_attention_heads``)."""
    for attr, value in vars(config).items():
        if attr.endswith("_config") and isinstance(value, dict) and value:
            part = attr.removesuffix("_config")
            return {key: getattr(config, f"{part}_{key}", entry) for key, entry in value.items()}
    return None


def nested_config(config: Any, annotation: Any, depth: int = 4) -> Any:
    """The first config nested in ``config`` (breadth first, ``depth`` levels) that is an instance of
    ``annotation`` (a config class), or None: EsmFold2's ``atom_config``, its model's
    ``config.structure_head.diffusion_module.atom_encoder``."""
    from transformers import PretrainedConfig

    if not (isinstance(annotation, type) and issubclass(annotation, PretrainedConfig)):
        return None
    level = [config]
    for _ in range(depth):
        level = [v for c in level for v in vars(c).values() if isinstance(v, PretrainedConfig)]
        found = next((c for c in level if isinstance(c, annotation)), None)
        if found is not None:
            return found
    return None


def _heads_field(config: Any) -> str | None:
    """The one integer config field named ``*_heads`` (not a key/value head count): the head count of a config
    that keeps it under a name of its own (PatchTSMixer's ``self_attn_heads``); None when none or several."""
    fields = [n for n, v in vars(config).items() if n.endswith("_heads") and type(v) is int and n not in _KV_HEADS]
    return fields[0] if len(fields) == 1 else None


def constructor_arguments(cls: type, config: Any, layer: int, cross: bool) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` for ``cls``: the config (by name, or as the first argument), the sizes an ``(embed_dim,
    num_heads)`` constructor takes (from the config), ``layer_idx``, ``has_relative_attention_bias=True`` (T5's first
    layer, the one that owns the bias), and ``is_cross_attention``/``is_decoder`` for cross-attention."""
    params = init_parameters(cls)
    sites = _call_sites(cls)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, (name, p) in enumerate(params.items()):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name == "config" or (i == 0 and name not in _SIZE_PARAMS and p.default is p.empty):
            (kwargs.__setitem__(name, config) if name == "config" else args.append(config))
        elif name == "hidden_size" and getattr(config, "hidden_size", None) is None and isinstance(
                getattr(config, "hidden_sizes", None), list | tuple):
            kwargs[name] = int(config.hidden_sizes[0])  # a width per stage (PVT, SegFormer): the first stage's
        elif name in _SIZE_PARAMS and getattr(config, _SIZE_PARAMS[name], None) is not None:
            size = getattr(config, _SIZE_PARAMS[name])  # per stage as a list (Swin's, PVT's): the first stage's
            kwargs[name] = int(size[0] if isinstance(size, list | tuple) else size)
        elif _SIZE_PARAMS.get(name) == "num_attention_heads" and (field := _heads_field(config)) is not None:
            kwargs[name] = int(getattr(config, field))  # a head count under a name of its own (PatchTSMixer's)
        elif (name == "num_key_value_heads" and p.default is p.empty
              and isinstance(getattr(config, "num_attention_heads", None), int)):
            # a config without the field (MoonshineStreaming's decoder config): as many as the query heads, what
            # an absent num_key_value_heads means in transformers
            kwargs[name] = int(config.num_attention_heads)
        elif name in ("layer_idx", "layer_id"):
            kwargs[name] = layer
        elif name == "has_relative_attention_bias" or (name in ("is_cross_attention", "is_decoder") and cross):
            kwargs[name] = True
        elif name in _PLAIN_PARAMS and p.default is p.empty:
            kwargs[name] = _PLAIN_PARAMS[name]
        elif name == "attention_type" and isinstance(getattr(config, "attention_layers", None), list | tuple):
            kwargs[name] = config.attention_layers[layer]  # GPT-Neo: "global" or "local", per layer
        elif name == "module_config" and p.default is p.empty and (found := _module_config(config)) is not None:
            kwargs[name] = found  # FastSpeech2-Conformer's: the encoder's dict of sizes
        elif p.default is p.empty and getattr(config, name, None) is not None:
            # a size the config holds under the parameter's name (Swin's window_size), per stage as a list
            value = getattr(config, name)
            kwargs[name] = value[0] if isinstance(value, list | tuple) and value else value
        elif getattr(config, sites.get(name, ""), None) is not None:
            kwargs[name] = getattr(config, sites[name])  # the field its model passes (Perceiver's q_dim=d_latents)
        elif name.endswith("_config") and p.default is p.empty and (
                nested := nested_config(config, p.annotation)) is not None:
            kwargs[name] = nested  # EsmFold2's atom_config: the sub-config of the annotated class its model passes
    return args, kwargs


def _call_sites(cls: type) -> dict[str, str]:
    """``{parameter: config field}`` from the calls ``Name(config, ..., parameter=config.field, ...)`` of the class's
    modeling module, its self-attention ones (not ``is_cross_attention=True``): how the model sizes the class or the
    layer that passes them on by the same names (Perceiver's ``PerceiverLayer(config, num_heads=
    config.num_self_attention_heads, q_dim=config.d_latents, kv_dim=config.d_latents)``); a parameter passed
    different fields at different sites is left out."""
    try:
        source = inspect.getsource(importlib.import_module(cls.__module__))
    except (OSError, TypeError, ImportError):
        return {}
    found: dict[str, set[str]] = {}
    for call in re.finditer(r"\b[A-Z]\w*\(\s*config(=config)?,(?P<args>[^()]*)\)", source):
        if "is_cross_attention=True" in call.group("args"):
            continue
        for name, field in re.findall(r"\b(\w+)=config\.(\w+)\b(?!\s*[.(\[])", call.group("args")):
            found.setdefault(name, set()).add(field)
    return {name: fields.pop() for name, fields in found.items() if len(fields) == 1}


__all__ = ["Layout", "bypass_norms", "config_from_configuration_module", "constructor_arguments", "find_layout",
           "has_residual", "init_parameters", "nested_config", "relative_bias"]
