"""Auditing a module: :func:`audit_module`, :func:`infer_conventions` for modules, and the layout hint printed when a
module's layout is not its spec's."""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from ..core.conventions import AuditUsageError, Conventions
from ..core.examples import Example, error
from ..core.functions import audit_device, infer_function_conventions, run_audit
from ..core.inference import (
    Inference,
    check_known,
    contradictions,
    infer_adapter,
    with_differences,
    with_inference,
    with_known,
)
from ..core.report import AuditReport
from ..core.running import Budget, audit_threads, collect_state_changes
from ..core.trusted import check_trusted
from .adapter import ModuleAdapter, module_setup
from .spec import LIBRARY_READERS, SHIPPED_SPECS, ModuleSpec, library_setup

#: How the hint names each fused layout.
_LAYOUTS: dict[str, str] = {"blocks": "in blocks, [q; k; v]", "heads": "per head, (h [q k v] d)",
                            "groups": "per key/value group, (g [q_1 .. q_r k v] d)"}


def layout_hint(adapter: ModuleAdapter, report: AuditReport) -> None:
    """A failing ``reference`` check of a fused-qkv spec: try the other fused layouts on its counterexample and
    say so in the message when one fits (``[q; k; v]`` blocks, GPT-NeoX's per-head ``(h [q k v] d)``, Falcon's
    per-group ``(g [q_1 .. q_r k v] d)``); when the error is huge and neither a layout nor the diagnosis of its
    root cause explains it, suspect one. Adds a line to the failing rows."""
    spec = adapter.spec
    failing = [r for r in report.results if r.name == "reference" and r.status == "FAIL"]
    if spec.qkv is None or spec.weights is not None or not failing or failing[0].counterexample is None:
        return
    fields = dict(failing[0].counterexample)
    fields["widths"] = None if fields["widths"] is None else tuple(fields["widths"])
    example = Example(**fields)
    ins, keep = example.inputs(), example.mask()
    hint = None
    out = adapter.call(ins, keep, example.is_causal, example.torch_dtype)
    own = error(out, adapter.reference(ins, keep, example.is_causal, torch.float64))
    for other in _LAYOUTS:
        if other == spec.qkv_layout:
            continue
        try:
            alternative = ModuleAdapter(adapter.original, dataclasses.replace(spec, qkv_layout=other),  # type: ignore[arg-type]
                                        conventions=adapter.conventions, device=adapter.device)
        except AuditUsageError:  # that layout cannot split these weights (head counts, unequal sizes)
            continue
        ref = alternative.reference(ins, keep, example.is_causal, torch.float64)
        if torch.equal(alternative.weights.wq, adapter.weights.wq) and torch.equal(alternative.weights.wk,
                                                                                   adapter.weights.wk):
            continue  # the same split at these head counts
        scale = max(1.0, float(ref.abs().max()))
        if error(out, ref) <= 1e-3 * scale < own:
            hint = (f"hint: the module matches the reference with its fused {spec.qkv!r} weights split "
                    f"{_LAYOUTS[other]}: declare qkv_layout={other!r} in the spec")
            break
    explained = any(cause.diagnosis for cause in report.causes if failing[0] in cause.rows)
    if hint is None and (failing[0].ratio or 0.0) > 1e3 and not explained:  # no single change explains it either
        hint = "hint: the weights may be split in another layout (per-head qkv?)"
    if hint is not None:
        for row in failing:
            row.message = f"{row.message}; {hint}"


def spec_differences(adapter: ModuleAdapter, inference: Inference, known: dict[str, Any]) -> Inference:
    """``inference``'s differences from the paper's attention, declared where the spec's conventions (or
    ``known``) give the inferred value: a module's spec describes its library's own conventions."""
    declared = {**dataclasses.asdict(adapter.conventions), **known}
    return with_differences(inference, declared, head_size=None if adapter.fixed is None else adapter.fixed["d"])


def audit_module(
    module: nn.Module | Callable[[], nn.Module],
    spec: "ModuleSpec | str",
    *,
    conventions: Conventions | Literal["infer"] | None = None,
    fully_masked: Literal["zero", "nan", "uniform", "any"] | None = None,
    checks: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    max_examples: int = 10,
    seed: int = 0,
    tolerance: float = 2.0,
    name: str | None = None,
    setup: str | None = None,
    known: Mapping[str, Any] | None = None,
    budget: Budget | str = "default",
    threads: int | None = 1,
    device: torch.device | str | None = None,
) -> AuditReport:
    """Audit an attention module with its own weights against the reference (every check that applies to
    modules, once per dtype). The module (or the one a factory builds) is deep-copied first: the caller's
    module is left exactly as it was (parameters, dtype, train/eval mode, gradients). ``checks``, ``dtypes``,
    ``max_examples``, ``seed``, ``tolerance``, ``name``, ``budget`` and ``threads`` are as in
    :func:`audit_attention`; ``device`` too, its default the device of the module's own parameters: the copies the
    checks call move there with their weights, and the reference reads the weights on the CPU.

    Args:
        module: the module, or a zero-argument factory of one.
        spec: a :class:`ModuleSpec`, the name of a shipped one (:data:`SPECS`), of a library whose spec is read from
            the module (``"litgpt"``, ``"timm"``, ...: :func:`library_spec`) or ``"auto"`` (chosen from its class).
        conventions: override the spec's conventions, or ``"infer"``: the spec says where the weights live,
            inference decides the behavioural fields (causal alignment and decode rule, always causal, fully
            masked rows, masks with ``is_causal``) and the report opens with them.
        fully_masked: override only what a query row without allowed keys gives.
        setup: Python lines that define ``module`` and ``spec`` in a fresh interpreter, at the top of every
            repro snippet (default: the shipped spec by name, or your spec and factory by their import paths).
        known: with ``conventions="infer"``, the behavioural fields you know (``{"fully_masked": "zero"}``):
            inference does the rest and checks each against the behaviour; a contradiction is a FAIL of the
            ``conventions`` row naming the field, the behaviour and the witness.

    Raises:
        AuditUsageError: the module does not match the spec (the message names the missing attribute).
        KeyError: an unknown spec name.
    """
    check_trusted()
    with audit_threads(threads), collect_state_changes():
        return _audit_module(module, spec, conventions, fully_masked, checks, dtypes, max_examples, seed, tolerance,
                             name, setup, known, budget, audit_device(device))


def _audit_module(module: nn.Module | Callable[[], nn.Module], spec: "ModuleSpec | str",
                  conventions: Conventions | Literal["infer"] | None,
                  fully_masked: Literal["zero", "nan", "uniform", "any"] | None, checks: Sequence[str] | None,
                  dtypes: Sequence[torch.dtype], max_examples: int, seed: int, tolerance: float, name: str | None,
                  setup: str | None, known: Mapping[str, Any] | None, budget: Budget | str,
                  device: torch.device | None = None) -> AuditReport:
    candidate = module if isinstance(module, nn.Module) else module()
    if isinstance(spec, str):
        if spec in LIBRARY_READERS:  # a library's zero-line spec, read from the module ("auto": from its class)
            setup = setup or library_setup(module, spec)
            spec = LIBRARY_READERS[spec](candidate)
        elif spec not in SHIPPED_SPECS:
            raise KeyError(f"unknown spec {spec!r}; shipped specs: {', '.join(SHIPPED_SPECS)}, auto")
        else:
            spec = SHIPPED_SPECS[spec]
    infer = conventions == "infer"
    if known is not None and not infer:
        raise ValueError("known= goes with conventions='infer' (declared conventions already say every field)")
    check_known(dict(known or {}))
    conv = spec.conventions if conventions is None or conventions == "infer" else conventions
    if fully_masked is not None:
        conv = dataclasses.replace(conv, fully_masked=fully_masked)
    adapter = ModuleAdapter(candidate, spec, conventions=conv, name=name, device=device)
    adapter.setup = setup or module_setup(module, spec)
    inference = infer_adapter(adapter, seed=seed) if infer else None
    if inference is not None and known:
        inference = with_known(inference, dict(known))
    if inference is not None:  # the spec's conventions are the module's declared ones
        inference = spec_differences(adapter, inference, dict(known or {}))
        adapter.conventions = inference.conventions
    described = {"spec": spec.name, **dataclasses.asdict(adapter.conventions)}
    report = run_audit(adapter, checks=checks, dtypes=dtypes, max_examples=max_examples, seed=seed,
                       tolerance=tolerance, conventions=described, budget=budget)
    layout_hint(adapter, report)
    if inference is not None:
        return with_inference(report, inference)
    if not report.passed:
        report.contradictions = contradictions(adapter.conventions, infer_adapter(adapter, seed=seed))
    return report


def infer_conventions(candidate: Callable[..., Any], *, seed: int = 0, name: str | None = None,
                      spec: Any = None, device: torch.device | str | None = None, budget: Budget | str = "default",
                      **options: Any) -> Inference:
    """Infer what a functional candidate ``candidate(q, k, v, [attn_mask=...], [is_causal=...])`` does: its
    layout, mask kind and polarity, causal alignment and decode rule, whether it is always causal, what a fully
    masked row gives, grouped-query support and grouping, whether a mask may come with ``is_causal``, the logit
    scale, and which arguments its signature takes.

    Args:
        candidate: the function to probe (about 25 calls on inputs of sizes <= 8, in float64 and float32), or
            an attention module with ``spec`` (a :class:`ModuleSpec` or a shipped spec's name: it says where the
            weights live; inference decides the behavioural fields, on a deep copy).
        seed: the probes' input seed.
        name: how the result names the candidate.
        device: where the candidate is called, as in :func:`audit_attention` (a module: default where its
            parameters are).
        budget: the budget the audit will run (a function): ``max_length`` is probed at the longest length it
            draws (129 by default), and decided where the candidate raises there.
        options: :class:`Conventions` fields inference does not decide (``self_attention``, ``head_sizes``,
            ``lengths``, ``max_length``, ``length_multiple``, ``equal_head_sizes``, ``even_head_size``,
            ``head_size_multiple``, ``supports_autograd``: they narrow what the probes draw), and fields you know
            among those it decides (``causal_alignment="top-left"``): inference does the rest, and each known field
            is checked against the behaviour; a contradiction is a finding that names the field, the behaviour and
            its witness. A module takes known fields only.

    Returns:
        An :class:`Inference`: ``.conventions``, ``.evidence`` (field -> value, what decided it and a repro),
        ``.findings`` (behaviours that match no documented convention).
    """
    if spec is not None:
        module_spec = SHIPPED_SPECS[spec] if isinstance(spec, str) else spec
        check_known(options)
        adapter = ModuleAdapter(candidate, module_spec, name=name,  # type: ignore[arg-type]
                                device=audit_device(device))
        inference = infer_adapter(adapter, seed=seed)
        return spec_differences(adapter, with_known(inference, options) if options else inference, options)
    return infer_function_conventions(candidate, seed=seed, name=name, device=device, budget=budget, **options)
