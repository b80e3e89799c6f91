"""Audit a third-party attention implementation against the reference, with Hypothesis as the engine.

    report = audit_attention(torch.nn.functional.scaled_dot_product_attention,
                             conventions=Conventions.torch_sdpa())
    print(report.table())            # PASS / FAIL / SKIP per check and dtype, error ratio, counterexample
    assert report.passed

    report = audit_module(LlamaAttention(config, layer_idx=0), "llama")   # a module with its own weights

Requires Hypothesis (the ``audit`` extra); ``import typed_transformer`` does not import this package.

**A functional candidate** is any callable ``candidate(q, k, v, *, attn_mask=None, is_causal=False)`` written
in its own :class:`Conventions`:

* ``layout="bhtd"``: ``q (b, h, t, d)``, ``k (b, g, s, d)``, ``v (b, g, s, dv)`` -> ``(b, h, t, dv)``;
  ``layout="bthd"`` (FlashAttention's): ``q (b, t, h, d)`` ... ``g == h`` unless ``supports_gqa``; query
  heads map onto key/value heads as ``grouping`` says.
* ``attn_mask`` is a ``(b, 1, t, s)``, per-head ``(b, h, t, s)`` or key padding ``(b, 1, 1, s)`` mask:
  boolean in the candidate's ``mask_polarity`` (``"keep"``: True = may attend, SDPA's; ``"drop"``: True =
  masked out, ``nn.MultiheadAttention``'s), or additive float 0/-inf with ``mask_kind="additive"``. The keyword
  arguments are passed only when used (declare ``supports_mask=False`` / ``supports_causal=False`` for a
  candidate without them; the signature is checked before any example runs).
* ``causal_alignment`` says what ``is_causal=True`` means when ``t != s`` (``"top-left"``: query ``i`` sees
  key ``j <= i``, SDPA's; ``"bottom-right"``: ``j <= i + s - t``, ours and FlashAttention's).
* ``scale``: the logit scale (``None`` = ``1 / sqrt(d)``); ``fully_masked``: what a query row without any
  allowed key returns (``"zero"``, ``"nan"``, ``"uniform"`` = mean of the values, ``"any"`` = not checked).
* What it supports narrows what is drawn: ``self_attention``, ``equal_head_sizes``, ``even_head_size``,
  ``head_size_multiple``, ``head_sizes``, ``lengths``, ``max_length``, ``length_multiple``, ``per_head_masks``,
  ``mask_with_causal``, ``decode_sees_all``; the report lists what was not tested because of a declaration.

**A module** is audited through a :class:`ModuleSpec` (shipped: :data:`SPECS`), which says where its
projections, head counts, scale and rotary embedding live and how to call its forward; the audit copies the
weights into the reference and calls a deep copy of the module (the caller's module is never touched).

**Tolerance** (FlashAttention's rule): for the candidate's dtype, ``err = max|candidate - ref64|`` must be at
most ``k * base`` (``k = tolerance``, default 2), where ``base`` is the larger of ``max|ref_lowp - ref64|``
(the reference run in the candidate's dtype) and a rounding floor of a few units in the last place scaled
by the longest sum (``s + d``) and by the largest logit magnitude (the floor is what counts in float64,
where ``ref_lowp`` is ``ref64``). The reported ratio is ``err / base``.

**Checks** (:data:`CHECKS`; each a registered function over one adapter protocol, run once per dtype as a
Hypothesis test with shrinking): ``reference``, ``scale``, ``causality``, ``batch_independence``,
``permutation``, ``masking`` (per-head masks too), ``padding``, ``fully_masked``, ``mask_and_causal``,
``large_logits`` (logits of +-100 to +-1e5), ``gradients`` (also under masks and fully masked rows),
``dtype``; for modules also ``rope``, ``incremental_decoding`` and ``fast_path``.
"""

from collections.abc import Callable
from typing import Any, Literal

from torch import nn

from .core.checks import draw_example
from .core.conventions import CHECKS_VERSION, AuditUsageError, Conventions
from .core.examples import Example
from .core.functions import (
    AuditCase,
    FunctionAdapter,
    audit_attention,
    candidate_call,
    parametrize_audit,
    takes_enable_gqa,
)
from .core.inference import INFERRED, Evidence, Finding, Inference
from .core.reference import reference_attention, rotate
from .core.report import Adapter, AuditReport, Cause, CheckResult, Difference
from .core.running import BUDGETS, DEFAULT_CALL_TIME_LIMIT, REGISTRY, Budget, CandidateStopped, call_time_limit
from .hf.build import hf_build
from .hf.known import hf_causes
from .hf.notes import hf_limits, hf_notes
from .hf.recognise import hf_spec
from .kernels.flex import FlexVariant, audit_flex, flex_sdpa, flex_sdpa_compiled
from .modules.adapter import ModuleAdapter
from .modules.audit import audit_module, infer_conventions
from .modules.masking import additive_mask, with_causal
from .modules.positions import ALiBi, Rotary, alibi_bias
from .modules.spec import ModuleSpec, Weights
from .specs import SPECS
from .specs.libraries import library_spec
from .specs.shared import import_without_torchvision

#: Every check, in report order.
CHECKS: tuple[str, ...] = tuple(REGISTRY)
#: The checks of a functional candidate.
FUNCTION_CHECKS: tuple[str, ...] = tuple(name for name, check in REGISTRY.items() if "function" in check.kinds)
#: The checks of a module.
MODULE_CHECKS: tuple[str, ...] = tuple(name for name, check in REGISTRY.items() if "module" in check.kinds)


def audit_multihead(module: nn.Module | Callable[[], nn.Module], *,
                    fully_masked: Literal["zero", "nan", "uniform", "any"] = "zero", **options: Any) -> AuditReport:
    """``audit_module(module, "torch_mha", ...)``: ``nn.MultiheadAttention`` (or a factory of one), its slow
    path on cross-attention inputs and its inference fast path (eval, no grad, batch-first self-attention
    with key padding) as the separate ``fast_path`` check.

    Raises:
        AuditUsageError: ``module`` is not an ``nn.MultiheadAttention``.
    """
    return audit_module(module, "torch_mha", fully_masked=fully_masked, **options)


__all__ = [
    "BUDGETS",
    "CHECKS",
    "CHECKS_VERSION",
    "DEFAULT_CALL_TIME_LIMIT",
    "FUNCTION_CHECKS",
    "INFERRED",
    "MODULE_CHECKS",
    "SPECS",
    "ALiBi",
    "Adapter",
    "AuditCase",
    "AuditReport",
    "AuditUsageError",
    "Budget",
    "CandidateStopped",
    "Cause",
    "CheckResult",
    "Conventions",
    "Difference",
    "Evidence",
    "Example",
    "Finding",
    "FlexVariant",
    "FunctionAdapter",
    "Inference",
    "ModuleAdapter",
    "ModuleSpec",
    "Rotary",
    "Weights",
    "additive_mask",
    "alibi_bias",
    "audit_attention",
    "audit_flex",
    "audit_module",
    "audit_multihead",
    "call_time_limit",
    "candidate_call",
    "draw_example",
    "flex_sdpa",
    "flex_sdpa_compiled",
    "hf_build",
    "hf_causes",
    "hf_limits",
    "hf_notes",
    "hf_spec",
    "import_without_torchvision",
    "infer_conventions",
    "library_spec",
    "parametrize_audit",
    "reference_attention",
    "rotate",
    "takes_enable_gqa",
    "with_causal",
]
