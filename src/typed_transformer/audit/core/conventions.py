"""The conventions an attention implementation may choose where the paper is silent, and the type aliases every part
of the audit shares."""

import math
from dataclasses import dataclass, field, fields
from typing import Literal, TypeAlias

import torch
from hypothesis import Phase
from jaxtyping import Bool, Float, Shaped
from torch import Tensor

Status: TypeAlias = Literal["PASS", "FAIL", "SKIP"]
#: A function candidate's inputs (float64): ``q (b, h, t, d)``, ``k (b, g, s, d)``, ``v (b, g, s, dv)``.
FunctionInputs: TypeAlias = tuple[Float[Tensor, "b h t d"], Float[Tensor, "b g s d"], Float[Tensor, "b g s dv"]]
#: A module candidate's inputs (float64): ``x (b, t, eq)``, ``key (b, s, ek)``, ``value (b, s, ev)``.
ModuleInputs: TypeAlias = tuple[Float[Tensor, "b t eq"], Float[Tensor, "b s ek"], Float[Tensor, "b s ev"]]
Inputs: TypeAlias = FunctionInputs | ModuleInputs
#: A canonical keep-mask (True = may attend); ``b``, ``h`` and ``t`` may be 1 to broadcast.
KeepMask: TypeAlias = Bool[Tensor, "#b #h #t s"]
#: What a candidate returned: its shape and dtype are what the checks compare, so any tensor is accepted here.
CandidateOutput: TypeAlias = Shaped[Tensor, "..."]
#: The reference's output: a function's ``(b, h, t, dv)``, a module's ``(b, t, e)``.
ReferenceOutput: TypeAlias = Float[Tensor, "b h t dv"] | Float[Tensor, "b t e"]
#: The rows a check compares: a function's ``(#b, #h, #t, 1)``, a module's ``(b, t, 1)``.
Rows: TypeAlias = Bool[Tensor, "#b #h #t 1"] | Bool[Tensor, "b t 1"]

#: Version of the check lists: a passing audit keeps its meaning when checks are added.
#: 2: audit_multihead gained causality and gradients. 3: modules through specs; large_logits, mask_and_causal,
#: rope, incremental_decoding, fast_path; per-head masks in masking; masks in gradients; per-dtype rows.
#: 4: a "conventions" row (inferred conventions' findings and undeclared differences FAIL it); large_logits sinks a
#: row's only allowed logit; single queries in causality; padding drops query positions; declared length ranges hold
#: in every check; gradients not compared through rows without keys where NaN is allowed; modules' reference models
#: q/k norms, sliding windows, partial and scaled rotary, position biases, soft-capping, sinks, output gates, sub-norms.
CHECKS_VERSION = "4"

_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
               torch.bfloat16: "bfloat16"}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}


class AuditUsageError(ValueError):
    """The candidate cannot be audited as declared (wrong signature, a module that does not match its spec);
    raised before any check runs. The CLI turns it into one line on stderr and exit status 2."""


@dataclass(frozen=True)
class Conventions:
    """What the candidate's arguments mean and what it supports (see the package docstring). Defaults are ours.

    Declarations that narrow what the audit draws (each listed in the report under "not tested"):
    ``self_attention`` (t = s; a module gets one input), ``equal_head_sizes`` (dv = d), ``even_head_size``,
    ``head_size_multiple`` (d and dv multiples of it: a half-precision kernel's 8), ``head_sizes`` and ``lengths``
    (inclusive ranges), ``max_length`` (no example longer, the deep ones included), ``length_multiple`` (query and
    key lengths multiples of it: a kernel that tiles without masking a partial tile), ``mask_kind="additive"`` (masks
    passed as float 0/-inf), ``per_head_masks=False`` (only ``(b, 1, t, s)`` masks), ``mask_with_causal=False``
    (never both ``attn_mask`` and ``is_causal``). ``grouping`` is how query heads map onto key/value heads:
    ``"g r"`` (head ``i`` uses kv head ``i // r``, torch's) or ``"r g"`` (``i % g``). ``decode_sees_all``: with
    ``is_causal`` a single query (t = 1) sees every key, whatever ``causal_alignment`` says. ``always_causal``:
    the candidate applies its causal mask whatever it is told (nanoGPT's attention): it is audited on causal
    examples only, every reference is causal. ``enable_gqa``: the candidate takes fewer key/value heads only when
    told so with ``enable_gqa=True`` (torch's ``F.scaled_dot_product_attention``); the audit passes it on every
    call with ``g < h`` (needs ``supports_gqa=True``; ``Conventions.torch_sdpa(gqa=True)`` sets both).
    ``half_precision``: the standard a function's float16 and bfloat16 outputs are held to: ``"float32"`` (a kernel
    that accumulates in float32 on the same rounded inputs) or ``"plain"`` (the error of plain PyTorch math run in
    that dtype, softmax included, when that is larger: a textbook attention written in the input dtype meets it).
    """

    # Fields with "help" are the audit command's flags (the command line generates them from this metadata).
    layout: Literal["bhtd", "bthd"] = field(default="bhtd", metadata={
        "help": "axis order of the candidate's q, k, v: (batch, heads, time, dim) (default, SDPA's) or (batch, time, "
                "heads, dim)"})
    mask_polarity: Literal["keep", "drop"] = field(default="keep", metadata={
        "help": "keep: True = may attend (SDPA); drop: True = masked out (nn.MultiheadAttention)"})
    causal_alignment: Literal["top-left", "bottom-right"] = field(default="bottom-right", metadata={
        "help": "what is_causal means when t != s (SDPA: top-left)"})
    scale: float | None = field(default=None, metadata={"help": "logit scale (default 1/sqrt(d))", "positive": True})
    fully_masked: Literal["zero", "nan", "uniform", "any"] = field(default="zero", metadata={
        "help": "declared output of query rows without keys (default zero, as in the API; a module: its spec's)"})
    supports_mask: bool = field(default=True, metadata={
        "help": "the candidate takes no attn_mask", "flag": "no_mask", "store": False})
    supports_causal: bool = field(default=True, metadata={
        "help": "the candidate takes no is_causal", "flag": "no_causal", "store": False})
    supports_gqa: bool = field(default=False, metadata={
        "help": "the candidate takes fewer key/value heads (enable_gqa=True is passed with them when it takes that "
                "keyword, as torch's scaled_dot_product_attention does)", "flag": "gqa", "store": True})
    supports_autograd: bool = field(default=True, metadata={
        "help": "skip the gradient check", "flag": "no_autograd", "store": False})
    self_attention: bool = field(default=False, metadata={"help": "the candidate needs t = s", "store": True})
    equal_head_sizes: bool = field(default=False, metadata={"help": "the candidate needs dv = d", "store": True})
    even_head_size: bool = field(default=False, metadata={
        "help": "the candidate needs an even head size", "store": True})
    head_size_multiple: int = field(default=1, metadata={
        "help": "the candidate needs head sizes (d and dv) that are a multiple of N (half-precision kernels: 8)",
        "range": (1, 256), "metavar": "N"})
    head_sizes: tuple[int, int] = (1, 8)
    lengths: tuple[int, int] = (1, 6)
    max_length: int | None = field(default=None, metadata={
        "help": "the longest query and key length the candidate takes (a position table, a kernel built for a "
                "maximum): no example, small or deep, is longer", "range": (1, 1 << 20), "metavar": "N"})
    length_multiple: int = field(default=1, metadata={
        "help": "the candidate needs query and key lengths that are a multiple of N (a kernel that tiles its "
                "sequences without masking a partial tile): every drawn length is rounded up to one",
        "range": (1, 1 << 16), "metavar": "N"})
    grouping: Literal["g r", "r g"] = field(default="g r", metadata={
        "help": "query head i uses kv head i // r ('g r', torch's) or i %% g ('r g')"})
    mask_kind: Literal["bool", "additive"] = field(default="bool", metadata={
        "help": "additive: the candidate takes float 0/-inf masks only"})
    per_head_masks: bool = True
    mask_with_causal: bool = field(default=True, metadata={
        "help": "the candidate refuses attn_mask and is_causal together", "flag": "no_mask_with_causal",
        "store": False})
    decode_sees_all: bool = field(default=False, metadata={
        "help": "with is_causal a single query sees every key (Hugging Face's sdpa rule)", "store": True})
    always_causal: bool = False
    enable_gqa: bool = False
    half_precision: Literal["float32", "plain"] = field(default="float32", metadata={
        "help": "the standard a float16 or bfloat16 output is held to: float32 (default: a kernel that accumulates "
                "in float32, as torch's SDPA, FlashAttention and Hugging Face's eager attention do) or plain (no "
                "worse than plain PyTorch math run in that dtype: FlashAttention's own tests' standard)"})

    def __repr__(self) -> str:
        """The dataclass's repr (an expression that rebuilds the conventions, as repros print it), with
        ``half_precision``, ``head_size_multiple``, ``max_length`` and ``length_multiple`` shown only when they are
        not the default: the repros on the pages predate the fields and read the same."""
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if not (f.name == "half_precision" and self.half_precision == "float32")
                 and not (f.name == "head_size_multiple" and self.head_size_multiple == 1)
                 and not (f.name == "max_length" and self.max_length is None)
                 and not (f.name == "length_multiple" and self.length_multiple == 1)]
        return f"Conventions({', '.join(shown)})"

    def __post_init__(self) -> None:
        for name, allowed in (("layout", ("bhtd", "bthd")), ("mask_polarity", ("keep", "drop")),
                              ("causal_alignment", ("top-left", "bottom-right")),
                              ("fully_masked", ("zero", "nan", "uniform", "any")), ("grouping", ("g r", "r g")),
                              ("mask_kind", ("bool", "additive")), ("half_precision", ("float32", "plain"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Conventions: {name} must be one of {', '.join(allowed)}; "
                                 f"got {getattr(self, name)!r}")
        for name in ("head_sizes", "lengths"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"Conventions: {name} must be (low, high) with 1 <= low <= high; got {(low, high)}")
        if self.enable_gqa and not self.supports_gqa:
            raise ValueError("Conventions: enable_gqa=True passes enable_gqa=True to calls with fewer key/value heads "
                             "than query heads; declare supports_gqa=True too (or Conventions.torch_sdpa(gqa=True))")
        if self.even_head_size and self.head_sizes[1] < 2:
            raise ValueError("Conventions: even_head_size needs head_sizes up to at least 2")
        if self.max_length is not None and (not isinstance(self.max_length, int) or self.max_length < 1):
            raise ValueError(f"Conventions: max_length must be a positive integer or None; got {self.max_length!r}")
        for name in ("head_size_multiple", "length_multiple"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Conventions: {name} must be a positive integer; got {getattr(self, name)!r}")
        if self.max_length is not None and self.max_length < self.length_multiple:
            raise ValueError(f"Conventions: max_length={self.max_length} is shorter than one block of "
                             f"length_multiple={self.length_multiple}: no length is left to draw")

    @property
    def head_multiple(self) -> int:
        """What every drawn head size is a multiple of: ``head_size_multiple``, doubled where ``even_head_size``
        asks for an even size it does not already give."""
        return math.lcm(self.head_size_multiple, 2 if self.even_head_size else 1)

    def head_size(self, d: int) -> int:
        """``d`` rounded up to the nearest head size the candidate takes (:attr:`head_multiple`)."""
        m = self.head_multiple
        return max(m, -(-d // m) * m)

    def blocks(self, t: int, s: int) -> tuple[int, int]:
        """Query and key lengths ``t`` and ``s`` rounded up to multiples of :attr:`length_multiple`, in the same
        order (``t < s`` stays ``t < s``: the key length gains a block where rounding made them equal) and, where
        ``max_length`` is given, no longer than its last whole block."""
        m = self.length_multiple
        if m == 1:
            return t, s
        top = math.inf if self.max_length is None else self.max_length // m * m
        rt, rs = (min(max(m, -(-n // m) * m), top) for n in (t, s))
        if rt == rs and t != s and rs + m <= top:
            rt, rs = (rt, rs + m) if t < s else (rt + m, rs)
        return int(rt), int(rs)

    @classmethod
    def typed_transformer(cls) -> "Conventions":
        """:func:`typed_transformer.scaled_dot_product_attention`'s conventions."""
        return cls(supports_gqa=True)

    @classmethod
    def torch_sdpa(cls, *, gqa: bool = False) -> "Conventions":
        """``torch.nn.functional.scaled_dot_product_attention``: top-left causal, refuses ``attn_mask`` with
        ``is_causal=True``, and fully masked rows give NaN or 0 depending on the kernel (not checked). ``gqa``:
        audit grouped-query attention too, passing ``enable_gqa=True`` when ``g < h``."""
        return cls(causal_alignment="top-left", fully_masked="any", mask_with_causal=False, supports_gqa=gqa,
                   enable_gqa=gqa)

    def untested(self) -> list[str]:
        """What the audit does not draw because of a declaration (listed in the report)."""
        notes = []
        if self.self_attention:
            notes.append("t != s and separate key/value inputs (self_attention=True)")
        if self.equal_head_sizes:
            notes.append("dv != d (equal_head_sizes=True)")
        if self.even_head_size:
            notes.append("odd head sizes (even_head_size=True)")
        if self.head_size_multiple > 1:
            notes.append(f"head sizes that are not a multiple of {self.head_size_multiple} "
                         f"(head_size_multiple={self.head_size_multiple})")
        if self.head_sizes != (1, 8):
            notes.append(f"head sizes outside {self.head_sizes[0]}..{self.head_sizes[1]} (head_sizes)")
        if self.lengths != (1, 6):
            notes.append(f"lengths outside {self.lengths[0]}..{self.lengths[1]} (lengths)")
        if self.max_length is not None:
            notes.append(f"query and key lengths past {self.max_length} (max_length={self.max_length})")
        if self.length_multiple > 1:
            notes.append(f"query and key lengths that are not a multiple of {self.length_multiple} "
                         f"(length_multiple={self.length_multiple})")
        if not self.supports_gqa:
            notes.append("grouped-query attention, g < h (supports_gqa=False)")
        if self.mask_kind == "additive":
            notes.append("boolean masks (mask_kind='additive': masks passed as 0/-inf floats)")
        if not self.supports_mask:
            notes.append("attention masks (supports_mask=False)")
        elif not self.per_head_masks:
            notes.append("per-head (b, h, t, s) masks (per_head_masks=False)")
        if not self.supports_causal:
            notes.append("is_causal (supports_causal=False)")
        elif not self.mask_with_causal:
            notes.append("attn_mask and is_causal together (mask_with_causal=False)")
        if self.always_causal:
            notes.append("non-causal attention (always_causal=True: the candidate applies its causal mask whatever "
                         "it is told, so every example is audited as causal)")
        if self.decode_sees_all:
            notes.append("causal alignment of a single query (decode_sees_all=True)")
        if self.fully_masked == "any":
            notes.append("fully masked query rows (fully_masked='any')")
        if self.fully_masked in ("nan", "any", "uniform") and self.supports_autograd:
            notes.append(f"gradients through fully masked rows (fully_masked={self.fully_masked!r}: such a row has "
                         f"no gradient to compare)")
        if not self.supports_autograd:
            notes.append("gradients (supports_autograd=False)")
        return notes

#: The default conventions (ours).
DEFAULT_CONVENTIONS = Conventions()
